"""Online robust Mahalanobis distance for entities that report many fields at once (a node's
tens of metrics), with per-field attribution of every score.

Per entity: an exponentially weighted mean ``mu`` and covariance ``C`` of its field vector.
For a sample ``x`` with residual ``r = x - mu``::

    D^2 = r' C^-1 r                     (Cholesky solve; correlations shrunk by ``ridge``)
    contribution_i = r_i * (C^-1 r)_i   (sums to D^2: field i's share of the distance)

The score is ``D / sqrt(d)`` — about 1 for a typical sample whatever the number of fields —
so thresholds carry over between node types. A field that moves with its correlated
peers costs little; one that breaks the usual relation (power up, temperature flat) gets the
largest contribution, which is what an operator needs to see.

Robust learning: a sample with ``D^2`` beyond ``d + clip * sqrt(2 d)`` (``clip`` standard
deviations of a chi-square with d degrees of freedom) is down-weighted by ``bound / D^2``, so
an anomaly does not teach the model that it is normal.

Warm-up is per field: each field counts the values it has learnt. Its first
:data:`SEED_VALUES` values seed its mean and variance robustly (the median of the three, and
their median absolute deviation scaled to a standard deviation; uncorrelated with the others),
so one wild reading among them (a sentinel) does not set a variance that blinds the field. Its
next values, up to ``warmup``, are learnt with running means (rate ``max(alpha, 1/n)``, n its
count), each residual clipped at :data:`WARMUP_CLIP` of the field's running spread, since the
robust bound needs a covariance the warm-up does not have yet. Only then is the field scored:
until then it is left out of the distance (residual 0, correlations unused), so a field that
appears late is not judged against a mean it never had. Missing fields (NaN or inf) are imputed
at the mean and left out of the distance the same way: they contribute 0 to the score and do not
pin their correlated peers to their means. A missing field learns nothing: its mean and variance
wait for it as they were (decayed as a sample at its mean, a field back at its usual level after
a long gap scored as an anomaly), and its covariances with the fields that learn fade at their
rates. A sample with no finite field scores NaN and teaches nothing.

The distance is shift-invariant (the solve's diagonal load is relative to each field's own
variance), and a residual is learnt at most :data:`MAX_LEARNT_RESIDUAL`, so the covariance stays
finite whatever the input.

>>> import numpy as np
>>> rng = np.random.default_rng(5)
>>> base = rng.normal(size=(3000, 1))
>>> x = np.hstack([base + 0.1 * rng.normal(size=(3000, 1)) for _ in range(4)])[:, None, :]
>>> x[2500, 0, 2] += 1.5                    # field 2 breaks away from its three peers
>>> det = OnlineMahalanobis(n_entities=1, n_fields=4, alpha=0.01)
>>> res = det.update(x)
>>> bool(res.score[2500, 0] > 4 * np.median(res.score[1000:2500, 0])), int(np.argmax(res.contributions[2500, 0]))
(True, 2)
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple, Sequence

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.numba_config import jit

ALPHA, RIDGE, CLIP, WARMUP, FLOOR = 0, 1, 2, 3, 4
"""Indices into the kernel's parameter vector; ``FLOOR + i`` is field i's variance floor."""

LOAD_RELATIVE = 1e-9
"""The solve's diagonal load, as a share of each field's own variance: collinear fields stay solvable."""
LOAD_ABSOLUTE = 1e-30
"""...plus this, in the field's unit squared: a field that never moved (variance 0, no floor) is a
huge but finite distance when it moves. Far below any meaningful variance of a telemetry field."""
WARMUP_CLIP = 10.0
"""In a field's warm-up, a residual is learnt at most this many of its running standard deviations
(or of its ``min_scale``, whichever is larger)."""
MAX_LEARNT_RESIDUAL = 1e150
"""The largest residual learnt: its square, and so the covariance, stays finite."""
SEED_VALUES = 3
"""A field's first values, held to seed its mean and variance: the fewest a median sees one wild one among."""
MAD_TO_STD = 1.4826
"""A normal distribution's standard deviation per median absolute deviation."""


class MultivariateScores(NamedTuple):
    score: np.ndarray          # (T, entities): D / sqrt(fields), NaN with no finite field
    contributions: np.ndarray  # (T, entities, fields): r_i (C^-1 r)_i, summing to D^2


class RowScores(NamedTuple):
    """Scores of rows that each name their entity (:meth:`OnlineMahalanobis.update_rows`)."""

    score: np.ndarray          # (rows,): D / sqrt(fields), NaN with no finite field
    contributions: np.ndarray  # (rows, fields): r_i (C^-1 r)_i, summing to D^2
    residuals: np.ndarray      # (rows, fields): x_i - mean_i before learning (0 where missing)


@jit
def _cholesky_solve(a: np.ndarray, r: np.ndarray, low: np.ndarray, inv: np.ndarray, y: np.ndarray) -> None:
    """y = a^-1 r via a Cholesky factor ``low`` of the symmetric positive (after loading) ``a``.
    A pivot that is not positive is replaced by a tiny fraction of the diagonal, so an
    ill-conditioned covariance gives a large distance instead of a failure. ``inv`` (scratch)
    holds the reciprocal pivots: one division per field instead of one per entry."""
    d = a.shape[0]
    for i in range(d):
        for j in range(i + 1):
            s = a[i, j]
            for k in range(j):
                s -= low[i, k] * low[j, k]
            if i == j:
                floor = 1e-12 * max(abs(a[i, i]), 1e-300)
                low[i, i] = math.sqrt(s if s > floor else floor)
                inv[i] = 1.0 / low[i, i]
            else:
                low[i, j] = s * inv[j]
    # Zero entries (a field left out of the solve) are skipped: times an overflowed, infinite
    # value they would make every later entry NaN.
    for i in range(d):  # forward: low z = r
        s = r[i]
        for k in range(i):
            if low[i, k] != 0.0:
                s -= low[i, k] * y[k]
        y[i] = s * inv[i]
    for i in range(d - 1, -1, -1):  # back: low' y = z
        s = y[i]
        for k in range(i + 1, d):
            if low[k, i] != 0.0:
                s -= low[k, i] * y[k]
        y[i] = s * inv[i]


@jit
def _seed(k: float, v: float, e: int, i: int, mean: np.ndarray, cov: np.ndarray) -> tuple[float, int]:
    """Field i's value ``v``, its ``k``-th (0-based) of the :data:`SEED_VALUES` that seed it; sets its
    mean and returns its variance and whether a value was clamped.

    Without a spread yet, any one of the first values may be the wild one, so they are held until
    the third decides: the first as the mean (variance 0); with the second, the lower of the two as
    the mean and the distance between them (at most :data:`MAX_LEARNT_RESIDUAL`) squared as the
    variance; with the third, the median of the three as the mean and their median absolute
    deviation as the standard deviation. The lower value is held exactly: a normal value beside a
    wild high one (a sentinel such as 2^63) keeps its digits. (A wild value far below the others
    loses the digits of the one above it: the seed is then off by up to that value's rounding.)"""
    held = mean[e, i]
    if k < 1.0:
        mean[e, i] = v
        return 0.0, 0
    if k < 2.0:
        apart = abs(v - held)
        mean[e, i] = min(v, held)
        if not apart <= MAX_LEARNT_RESIDUAL:
            return MAX_LEARNT_RESIDUAL ** 2, 1
        return apart * apart, 0
    gap = math.sqrt(cov[e, i, i])
    low, high = held, held + gap  # the first two
    median = max(low, min(high, v))
    lowest, highest = min(low, v), max(high, v)
    # of three sorted values, the deviations from the middle one are 0 and the two gaps
    spread = min(min(median - lowest, highest - median), MAX_LEARNT_RESIDUAL)
    mean[e, i] = median
    return (MAD_TO_STD * spread) ** 2, 0


@jit
def _mahalanobis_rows(slot: np.ndarray, x: np.ndarray, mean: np.ndarray, cov: np.ndarray, count: np.ndarray,
                      seen: np.ndarray, params: np.ndarray, out: np.ndarray, learn: np.ndarray) -> int:
    """Row t is a sample of entity ``slot[t]``, rows in time order per entity.

    x (rows, d); mean (E, d); cov (E, d, d); count (E,); seen (E, d); out (rows, 1 + 2d) =
    [score, d contributions, d residuals]; learn (rows,) bool: whether row t is learnt after
    it is scored. The batch API feeds (T, E, d) as T*E rows. Returns how many residuals were
    learnt clamped at ``MAX_LEARNT_RESIDUAL``.
    """
    alpha, ridge, clip, warmup = params[ALPHA], params[RIDGE], params[CLIP], params[WARMUP]
    scored_from = max(warmup, float(SEED_VALUES))  # a field's own values learnt before its residual is scored
    d = x.shape[1]
    reg = np.empty((d, d))
    low = np.empty((d, d))
    inv = np.empty(d)
    r = np.empty(d)
    y = np.empty(d)
    keep = np.empty(d)
    push = np.empty(d)
    seeded = np.empty(d)  # a seeding field's variance, set after the update (-1: none)
    present = np.empty(d, dtype=np.bool_)
    scored = np.empty(d, dtype=np.bool_)
    bound = d + clip * math.sqrt(2.0 * d)
    clamped = 0
    for t in range(x.shape[0]):
        e = slot[t]
        any_present = False
        any_scored = False
        for i in range(d):
            v = x[t, i]
            present[i] = math.isfinite(v)
            scored[i] = present[i] and seen[e, i] >= scored_from
            # a field not seen yet is imputed at its mean: no residual
            resid = v - mean[e, i] if present[i] and seen[e, i] >= 1.0 else 0.0
            r[i] = resid if scored[i] else 0.0
            out[t, 1 + i] = 0.0
            out[t, 1 + d + i] = resid
            any_present = any_present or present[i]
            any_scored = any_scored or scored[i]
        if not any_present:
            out[t, 0] = np.nan
            continue
        d2 = 0.0
        if any_scored:
            # Shrink the correlations towards 0 (diagonal kept) and load the diagonal a hair of
            # the field's own variance, so collinear fields stay solvable and the distance does
            # not depend on where a field sits (a load from its mean blinded large offsets). The
            # floor (a field's smallest meaningful variance, e.g. one step of an integer reading)
            # keeps a field that sat still from turning its first tiny move into an alarm. A
            # field missing or still in its own warm-up is left out of the solve (residual 0, no
            # correlations): the distance is that of the fields scored alone. Taken as sitting at
            # its mean, a missing field pinned its correlated peers to their means.
            for i in range(d):
                for j in range(i):
                    reg[i, j] = (1.0 - ridge) * cov[e, i, j] if scored[i] and scored[j] else 0.0
                c = cov[e, i, i]
                reg[i, i] = max(c, params[FLOOR + i]) + LOAD_RELATIVE * c + LOAD_ABSOLUTE
            _cholesky_solve(reg, r, low, inv, y)
            for i in range(d):
                d2 += r[i] * y[i]
                out[t, 1 + i] = r[i] * y[i]
            # a distance that overflowed is infinite: NaN would read as a row with no finite field
            d2 = max(d2, 0.0) if d2 == d2 else math.inf
        out[t, 0] = math.sqrt(d2 / d)
        if not learn[t]:
            continue
        w = bound / d2 if d2 > bound else 1.0
        for i in range(d):
            k = seen[e, i]
            # A missing field keeps everything (K C K + p p' stays positive semi-definite
            # whatever K is): its covariances with the fields that learn fade at their rates.
            keep[i] = 1.0
            push[i] = 0.0
            seeded[i] = -1.0
            if not present[i]:
                continue
            if k < SEED_VALUES:
                keep[i] = 0.0  # uncorrelated with the others until it has learnt past its seed
                seeded[i], clamped_now = _seed(k, x[t, i], e, i, mean, cov)
                clamped += clamped_now
                continue
            a = max(alpha, 1.0 / (k + 1.0))
            g = out[t, 1 + d + i]
            weight = w
            if not scored[i]:
                # In its warm-up a field is not scored, so the robust bound cannot judge it: a
                # residual is learnt at most WARMUP_CLIP of its running spread (one wild reading
                # would otherwise be learnt at full weight and blind the field for long).
                weight = 1.0
                spread = WARMUP_CLIP * math.sqrt(max(cov[e, i, i], params[FLOOR + i]))
                if spread > 0.0:
                    g = min(max(g, -spread), spread)
            if not abs(g) <= MAX_LEARNT_RESIDUAL:  # its square would overflow the covariance
                g = MAX_LEARNT_RESIDUAL if g > 0.0 else -MAX_LEARNT_RESIDUAL
                clamped += 1
            mean[e, i] += a * weight * g
            keep[i] = math.sqrt(1.0 - a)
            push[i] = math.sqrt(a * (1.0 - a) * weight) * g
        # C <- K C K + p p' (K = diag(keep)): each field at its own rate, positive semi-definite
        # whatever the rates; with one rate a for all, (1 - a) C + a (1 - a) w r r'.
        for i in range(d):
            for j in range(d):
                cov[e, i, j] = keep[i] * keep[j] * cov[e, i, j] + push[i] * push[j]
        for i in range(d):
            if seeded[i] >= 0.0:
                cov[e, i, i] = seeded[i]  # its row and column are 0: any variance keeps C semi-definite
            if present[i]:
                seen[e, i] += 1.0
        count[e] += 1.0
    return clamped


class OnlineMahalanobis:
    """Per-entity online robust Mahalanobis distance with per-field contributions (module
    docstring). ``update``/``score`` take ``(T, n_entities, n_fields)`` or one step
    ``(n_entities, n_fields)`` and return :class:`MultivariateScores`; ``update_rows`` /
    ``score_rows`` take rows that each name their entity (a frame's ``slot`` column) and return
    :class:`RowScores`.

    Parameters: ``alpha`` EWMA rate of mean and covariance; ``ridge`` shrinkage of the
    correlations towards 0 (0..1); ``clip`` robust bound in chi-square standard deviations;
    ``warmup`` values of a field before it is scored (at least :data:`SEED_VALUES`; default
    ``2 * n_fields + 10``);
    ``min_scale`` each field's smallest meaningful standard deviation in its own unit (one value
    or one per field; default 0): the variance the solve uses is at least its square.
    The Cholesky solve reads only the lower triangle of the shrunk covariance. With ``health``, a
    residual learnt clamped (:data:`MAX_LEARNT_RESIDUAL`) is counted as
    ``residual_too_large_to_learn``, and every non-finite input value as ``non_finite_input``.
    """

    name: ClassVar[str] = "mahalanobis"

    def __init__(self, n_entities: int, n_fields: int, alpha: float = 0.01, ridge: float = 0.001,
                 clip: float = 3.0, warmup: int | None = None, field_names: Sequence[str] | None = None,
                 health: PipelineHealth | None = None,
                 min_scale: float | Sequence[float] | np.ndarray = 0.0) -> None:
        for key, v in (("n_entities", n_entities), ("n_fields", n_fields)):
            if int(v) != v or v < 1:
                raise ValueError(f"{self.name}: {key} must be a positive integer, got {v!r}")
        if not (np.isfinite(alpha) and 0.0 < alpha <= 1.0):
            raise ValueError(f"{self.name}: alpha must be in (0, 1], got {alpha!r}")
        if not (np.isfinite(ridge) and 0.0 <= ridge < 1.0):
            raise ValueError(f"{self.name}: ridge must be in [0, 1), got {ridge!r}")
        if not (np.isfinite(clip) and clip > 0.0):
            raise ValueError(f"{self.name}: clip must be positive, got {clip!r}")
        warmup = 2 * int(n_fields) + 10 if warmup is None else warmup
        if int(warmup) != warmup or warmup < 0:
            raise ValueError(f"{self.name}: warmup must be a non-negative integer, got {warmup!r}")
        if field_names is not None and len(field_names) != n_fields:
            raise ValueError(f"{self.name}: {len(field_names)} field names for {n_fields} fields")
        floor = np.broadcast_to(np.asarray(min_scale, dtype=np.float64), (int(n_fields),))
        if not np.all(np.isfinite(floor) & (floor >= 0.0)):
            raise ValueError(f"{self.name}: min_scale must be finite and >= 0, got {min_scale!r}")
        self.n_entities, self.n_fields = int(n_entities), int(n_fields)
        self.field_names = list(field_names) if field_names is not None else [f"f{i}" for i in range(n_fields)]
        self.health = health
        self.params = np.concatenate([[alpha, ridge, clip, warmup], floor ** 2]).astype(np.float64)
        self.s_mean = np.zeros((self.n_entities, self.n_fields))
        self.s_cov = np.zeros((self.n_entities, self.n_fields, self.n_fields))
        self.s_count = np.zeros(self.n_entities)
        self.s_seen = np.zeros((self.n_entities, self.n_fields))  # finite values learnt, per field

    def _apply(self, x: Any, learn: bool) -> MultivariateScores:
        arr = np.asarray(x, dtype=np.float64)
        single = arr.ndim == 2
        if single:
            arr = arr[None]
        if arr.ndim != 3 or arr.shape[1:] != (self.n_entities, self.n_fields):
            raise ValueError(f"{self.name}: expected shape (T, {self.n_entities}, {self.n_fields}) "
                             f"or ({self.n_entities}, {self.n_fields}), got {np.shape(x)}")
        steps, d = arr.shape[0], self.n_fields
        # step-major rows, entity after entity: each entity's samples stay in time order
        slot = np.tile(np.arange(self.n_entities, dtype=np.int64), steps)
        out = self._run(slot, arr.reshape(-1, d), np.full(len(slot), learn))
        score = out[:, 0].reshape(steps, self.n_entities)
        contrib = out[:, 1:1 + d].reshape(steps, self.n_entities, d)
        if single:
            return MultivariateScores(score[0], contrib[0])
        return MultivariateScores(score, contrib)

    def _run(self, slot: np.ndarray, x: np.ndarray, learn: np.ndarray) -> np.ndarray:
        """The kernel over validated rows; returns its (rows, 1 + 2 fields) output."""
        x = np.ascontiguousarray(x, dtype=np.float64)
        if self.health is not None and x.size:
            self.health.problem(self.name, "non_finite_input", int(np.count_nonzero(~np.isfinite(x))))
        out = np.empty((x.shape[0], 1 + 2 * self.n_fields))
        if x.shape[0]:
            clamped = _mahalanobis_rows(slot, x, self.s_mean, self.s_cov, self.s_count, self.s_seen, self.params,
                                        out, learn)
            if self.health is not None:
                self.health.problem(self.name, "residual_too_large_to_learn", int(clamped),
                                    f"a reading more than {MAX_LEARNT_RESIDUAL:g} from its mean, learnt as that")
        return out

    def _apply_rows(self, slot: Any, x: Any, learn: bool | np.ndarray) -> RowScores:
        arr = np.asarray(x, dtype=np.float64)
        idx = np.ascontiguousarray(slot, dtype=np.int64).reshape(-1)
        if arr.ndim != 2 or arr.shape[1] != self.n_fields or len(idx) != arr.shape[0]:
            raise ValueError(f"{self.name}: expected (rows, {self.n_fields}) values and (rows,) entities, "
                             f"got {np.shape(x)} and {np.shape(slot)}")
        if len(idx) and (idx.min() < 0 or idx.max() >= self.n_entities):
            raise ValueError(f"{self.name}: entity index outside 0..{self.n_entities - 1}")
        mask = np.ascontiguousarray(np.broadcast_to(np.asarray(learn, dtype=np.bool_), idx.shape))
        out = self._run(idx, arr, mask)
        d = self.n_fields
        return RowScores(out[:, 0], out[:, 1:1 + d], out[:, 1 + d:])

    def update(self, x: Any) -> MultivariateScores:
        """Score each step against the state so far, then learn it."""
        return self._apply(x, learn=True)

    def score(self, x: Any) -> MultivariateScores:
        """Score each step against the current state; learn nothing."""
        return self._apply(x, learn=False)

    def update_rows(self, slot: Any, x: Any, learn: Any = True) -> RowScores:
        """Rows ``x`` (rows, fields), row i a sample of entity ``slot[i]`` (rows in time order per
        entity, e.g. a frame): score each against its entity's state so far, then learn it —
        only the rows where ``learn`` (one flag, or one per row) is true."""
        return self._apply_rows(slot, x, learn=learn)

    def score_rows(self, slot: Any, x: Any) -> RowScores:
        """As :meth:`update_rows`, learning nothing (each row against the current state)."""
        return self._apply_rows(slot, x, learn=False)

    def top_fields(self, contributions: np.ndarray, k: int = 3) -> list[list[tuple[str, float]]]:
        """For one step's ``(n_entities, n_fields)`` contributions: each entity's ``k`` largest,
        as (field name, share of D^2)."""
        c = np.asarray(contributions, dtype=np.float64)
        total = np.maximum(c.sum(axis=-1, keepdims=True), 1e-300)
        order = np.argsort(-c, axis=-1)[:, :k]
        return [[(self.field_names[i], float(c[e, i] / total[e, 0])) for i in order[e]] for e in range(c.shape[0])]

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"s_mean": self.s_mean.copy(), "s_cov": self.s_cov.copy(), "s_count": self.s_count.copy(),
                "s_seen": self.s_seen.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a :meth:`state_dict`; one saved before fields were counted is upgraded
        (:func:`with_field_counts`)."""
        state = with_field_counts(state, "s_mean", "s_cov", "s_count", "s_seen")
        own = self.state_dict()
        if set(state) != set(own):
            raise ValueError(f"{self.name}: state keys {sorted(state)} != expected {sorted(own)}")
        for key, ref in own.items():
            arr = np.asarray(state[key], dtype=np.float64)
            if arr.shape != ref.shape:
                raise ValueError(f"{self.name}: state {key!r} has shape {arr.shape}, expected {ref.shape}")
            getattr(self, key)[...] = arr  # in place: a detector holding these arrays keeps them

    def state_nbytes(self) -> int:
        return self.s_mean.nbytes + self.s_cov.nbytes + self.s_count.nbytes + self.s_seen.nbytes


def with_field_counts(state: dict[str, Any], mean_key: str, cov_key: str, count_key: str,
                      seen_key: str) -> dict[str, Any]:
    """``state`` with its per-field counts (``seen_key``) where it was saved without them (before
    they were kept): every field counts none, so each warms up afresh from its next value. Saved
    then, a field that appeared after the entity's first sample had its mean started at 0 and
    learnt towards its values from there: its mean may still be far from them, and which fields
    did so cannot be told from the state. The cost: after the upgrade, each field goes
    ``max(warmup, SEED_VALUES)`` values without a score, and what the old state learnt is not used.
    A state without the other three arrays, or with any misshapen (``load_state_dict`` judges it),
    is returned as it came. For ``load_state_dict`` and ``Detector.upgrade_state``."""
    if seen_key in state or not all(k in state for k in (mean_key, cov_key, count_key)):
        return state
    mean, cov, count = (np.asarray(state[k], dtype=np.float64) for k in (mean_key, cov_key, count_key))
    if mean.ndim != 2 or cov.shape != mean.shape + mean.shape[1:] or count.shape != mean.shape[:1]:
        return state
    return {**state, seen_key: np.zeros_like(mean)}
