"""One anomaly score in [0, 1] from several univariate detectors, with alert de-duplication.

Each member's score is divided by its ``scale`` — the member's own "clearly anomalous" level
in its natural unit (a z of 8, a 1.5 % break-out of the range...) — and the largest ratio ``S``
wins: ``combined = S / (1 + S)``. The max keeps every member's meaning (0.5 is "one member at
its scale", 0.9 nine times it) and names the member that drove it (:attr:`Combiner.last_member`);
the squash keeps float resolution for huge ratios, where ``1 - exp(-S)`` would read 1.0 for all.

``hold`` de-duplicates alerts: a score at alert level (ratio ``S`` at least :data:`ALERT_RATIO`,
one member at its scale: combined 0.5) within ``hold`` seconds (or samples, without timestamps) of
the last alert that got through passes only if its ratio is more than ``escalate`` times that
one's; the others read 0. One episode then raises one alert (that can still escalate when it
gets much worse), instead of a burst of near-equal ones. A score below alert level passes as it
is and leaves the hold alone: it is no alert to de-duplicate. State is two numbers per series
(the alert that got through and when).

>>> import numpy as np
>>> from foreshock.detectors.ewma_zscore import EwmaZScore
>>> from foreshock.detectors.range_novelty import RangeNovelty
>>> rng = np.random.default_rng(4)
>>> x = rng.normal(0, 1, size=(1000, 1)); x[700:705] += 12.0      # a 5-sample burst
>>> comb = Combiner([(EwmaZScore(1, alpha=0.01), 8.0), (RangeNovelty(1), 0.05)], hold=100)
>>> s = comb.update(x)[:, 0]
>>> bool(s[700] > 0.5), bool(s[701:705].max() < 0.5), bool(s[:700].max() < s[700])  # one alert
(True, True, True)
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.numba_config import jit

from .univariate import UnivariateDetector, as_batch, unusable

PEAK, PEAK_TIME = 0, 1
ALERT_RATIO = 1.0
"""The ratio ``S`` from which a score is an alert, and opens or renews a hold: one member at its
scale, each member's own "clearly anomalous" level (combined 0.5). Below it a score is the noise
the scales are set above: when every score opened a hold, quiet ones held the bar up, so the real
episode read 0 unless it beat ``escalate`` times a noise peak (with ``escalate=inf``, every
anomaly after the first sample read 0; until 2026-12-04)."""


@jit
def _max_ratio_kernel(scores: np.ndarray, inv_scale: np.ndarray, out: np.ndarray,
                      member: np.ndarray) -> None:
    """out[t, j] = max_i scores[i, t, j] * inv_scale[i] over the finite member scores (+inf
    wins; NaN when none is finite); member[t, j] = the winning member (-1 when none)."""
    for t in range(scores.shape[1]):
        for j in range(scores.shape[2]):
            best = -1.0
            who = -1
            for i in range(scores.shape[0]):
                v = scores[i, t, j]
                if math.isfinite(v):
                    r = max(v, 0.0) * inv_scale[i]
                    if r > best:
                        best, who = r, i
                elif v == np.inf:
                    best, who = np.inf, i
                    break
            out[t, j] = np.nan if who < 0 else best
            member[t, j] = who


@jit
def _squash_kernel(s: np.ndarray) -> None:
    """S -> S / (1 + S) in place (+inf -> 1, NaN stays)."""
    for t in range(s.shape[0]):
        for j in range(s.shape[1]):
            v = s[t, j]
            s[t, j] = 1.0 if v == np.inf else v / (1.0 + v)


@jit
def _hold_kernel(s: np.ndarray, ts: np.ndarray, state: np.ndarray, params: np.ndarray,
                 out: np.ndarray, learn: bool) -> None:
    """state rows: last alert (ratio at least ``ALERT_RATIO``) that got through, its time (-inf
    before any). params: hold, escalate. A score below alert level, or at a non-finite time,
    passes and touches no state; an alert passes if the last one is older than ``hold`` or it
    exceeds ``escalate`` times it; otherwise it reads 0."""
    hold, escalate = params[0], params[1]
    for t in range(s.shape[0]):
        now = ts[t]
        for j in range(s.shape[1]):
            v = s[t, j]
            if not math.isfinite(v):
                out[t, j] = np.nan
                continue
            if v < ALERT_RATIO or not math.isfinite(now):
                # no alert: nothing to de-duplicate, and no bar raised by noise. An alert at a
                # non-finite time passes as without a hold and opens none: stored, a NaN time
                # failed every later ``now - time > hold`` and held the series for good
                out[t, j] = v
            elif now - state[PEAK_TIME, j] > hold or v > escalate * state[PEAK, j]:
                out[t, j] = v
                if learn:
                    state[PEAK, j] = v
                    state[PEAK_TIME, j] = now
            else:
                out[t, j] = 0.0


class Combiner:
    """Max of scaled member scores, squashed to [0, 1], then de-duplicated (module docstring).

    ``members``: (detector, scale) pairs over the same ``n_series``. ``hold``: de-duplication
    span in seconds when ``update`` gets timestamps, in samples otherwise (0 = off);
    ``escalate``: how many times worse a held episode must get to alert again (inf = never).
    Scores below alert level (:data:`ALERT_RATIO`) pass the hold as they are, and so do scores
    at a non-finite timestamp (no time to hold from; counted as ``combiner``/``bad_timestamp``
    with a ``health`` object).
    """

    name = "combiner"

    def __init__(self, members: Sequence[tuple[UnivariateDetector, float]], hold: float = 0.0,
                 escalate: float = 1.0, health: PipelineHealth | None = None) -> None:
        if not members:
            raise ValueError("combiner: needs at least one member detector")
        sizes = {det.n_series for det, _ in members}
        if len(sizes) != 1:
            raise ValueError(f"combiner: members watch different numbers of series {sorted(sizes)}")
        for det, scale in members:
            if not (np.isfinite(scale) and scale > 0):
                raise ValueError(f"combiner: scale of {det.name} must be positive and finite, got {scale!r}")
        if not (np.isfinite(hold) and hold >= 0):
            raise ValueError(f"combiner: hold must be >= 0, got {hold!r}")
        if not escalate >= 1.0:
            raise ValueError(f"combiner: escalate must be >= 1 (inf = never), got {escalate!r}")
        self.members = [det for det, _ in members]
        self.inv_scale = np.array([1.0 / scale for _, scale in members], dtype=np.float64)
        self.n_series = sizes.pop()
        self.hold = float(hold)
        self.hold_params = np.array([hold, escalate], dtype=np.float64)
        self.health = health
        self.s_hold = np.zeros((2, self.n_series), dtype=np.float64)
        self.s_hold[PEAK_TIME] = -np.inf
        self.s_step = np.zeros(1, dtype=np.float64)
        self.last_member = np.full(self.n_series, -1, dtype=np.int64)

    @property
    def member_names(self) -> list[str]:
        return [m.name for m in self.members]

    def _apply(self, x: Any, ts: Any, learn: bool) -> np.ndarray:
        batch, single = as_batch(x, self.n_series, self.name)
        steps = batch.shape[0]
        if ts is None:
            times = self.s_step[0] + np.arange(steps, dtype=np.float64)
        else:
            times = np.ascontiguousarray(np.atleast_1d(np.asarray(ts, dtype=np.float64)))
            if times.shape != (steps,):
                raise ValueError(f"combiner: expected {steps} timestamps, got shape {times.shape}")
        if self.health is not None and steps:
            self.health.problem(self.name, "non_finite_input", int(np.count_nonzero(unusable(batch))))
            if ts is not None:
                self.health.problem(self.name, "bad_timestamp", int(np.count_nonzero(~np.isfinite(times))))
        member_scores = np.empty((len(self.members), steps, self.n_series))
        for i, det in enumerate(self.members):
            member_scores[i] = det.update(batch) if learn else det.score(batch)
        combined = np.empty((steps, self.n_series))
        who = np.empty((steps, self.n_series), dtype=np.int64)
        out = np.empty_like(combined)
        if steps:
            _max_ratio_kernel(member_scores, self.inv_scale, combined, who)
            if self.hold > 0:
                _hold_kernel(combined, times, self.s_hold, self.hold_params, out, learn)
            else:
                out[:] = combined
            _squash_kernel(out)
            self.last_member = who[-1].copy()
        if learn:
            self.s_step[0] += steps
        return out[0] if single else out

    def update(self, x: Any, ts: Any = None) -> np.ndarray:
        """Score-then-learn every member on each row; combined scores in [0, 1]."""
        return self._apply(x, ts, learn=True)

    def score(self, x: Any, ts: Any = None) -> np.ndarray:
        """Combined scores of each row against the current state; learns nothing."""
        return self._apply(x, ts, learn=False)

    def state_dict(self) -> dict[str, Any]:
        return {"members": [m.state_dict() for m in self.members],
                "s_hold": self.s_hold.copy(), "s_step": self.s_step.copy(),
                "last_member": self.last_member.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state.get("members", ())) != len(self.members):
            raise ValueError("combiner: state has a different number of members")
        for m, sub in zip(self.members, state["members"]):
            m.load_state_dict(sub)
        for key in ("s_hold", "s_step"):
            arr = np.asarray(state[key], dtype=np.float64)
            if arr.shape != getattr(self, key).shape:
                raise ValueError(f"combiner: state {key!r} has shape {arr.shape}")
            setattr(self, key, arr.copy())
        # a state saved before last_member was kept names no member (-1) until the next score
        member = np.asarray(state.get("last_member", np.full(self.n_series, -1)), dtype=np.int64)
        if member.shape != self.last_member.shape:
            raise ValueError(f"combiner: state 'last_member' has shape {member.shape}")
        self.last_member = member.copy()
