"""Robust EWMA z-score with a two-sided CUSUM, per (GPU, field).

For each series the detector tracks a robust level (an EWMA whose updates are clipped at
``clip`` scale units, so one spike does not drag it) and a robust scale (an EWMA of absolute
deviations; for Gaussian noise sigma ~ 1.2533 x mean absolute deviation). The z-score feeds
a two-sided CUSUM; when either side passes ``threshold`` the detector emits an
:class:`~foreshock.findings.Anomaly` (score = the CUSUM value), restarts both sides and
re-learns the level and scale from the samples after the alarming one (the running mean and
mean absolute deviation over ``warmup`` samples, during which the series cannot alarm): one
level shift is one anomaly, not one per sample, and an alarm on a one-off glitch leaves no trace
of the glitch in the new regime. A warm-up's deviations are winsorised at ``WARMUP_CLIP`` scale
units once ``WARMUP_FREE`` samples are in, so a glitch *inside* a warm-up (which cannot alarm)
does not widen the scale either. Non-finite values (NaN, ±inf) are skipped.

>>> import numpy as np
>>> from foreshock.topology import Topology
>>> from foreshock.frames import Frame
>>> topo = Topology.from_gpu_hosts([("n0", 0)])
>>> det = RobustZScoreDetector(topo, fields=("gpu_temp",), warmup=20)
>>> rng = np.random.default_rng(0)
>>> temps = np.r_[50 + rng.normal(0, 0.5, 200), 50 + np.linspace(0, 15, 50)]
>>> found = []
>>> for t, x in enumerate(temps):
...     found += det.update(Frame("gpu", [float(t)], [0], {"gpu_temp": [x]}))
>>> found[0].field, found[0].ts >= 200
('gpu_temp', True)
"""

from __future__ import annotations

import math
from typing import ClassVar, Mapping, Sequence

import numpy as np

from foreshock.fields import field_names
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.numba_config import jit
from foreshock.topology import Topology

from .base import Detector

# state columns per (slot, field), float32 (STATE_DTYPE): every column a value, none a time or a
# counter that must stay exact. COUNT counts a regime's samples; float32 holds it exactly up to 2**24
# (194 days at 1 s), where ``+= 1`` stops growing it: harmless, it only has to pass ``warmup``.
# Each sample's update is computed in float64 from the stored values and stored rounded, once.
LEVEL, SCALE, POS, NEG, COUNT = range(5)
N_STATE = 5
STATE_DTYPE = np.float32
SIGMA_PER_MAD = 1.2533
# A warm-up's first samples (the seed and the next two) are taken whole: the scale is not known
# yet, and a series seeded on a glitch must be able to leave it at once.
WARMUP_FREE = 3
# Later warm-up deviations are winsorised at this many sigmas (of the scale learnt so far). Unclipped,
# one 0 W read on a 690 W GPU (~360 sigma) inside a warm-up, which cannot alarm, widened the scale
# ~7x and a real 40 W drop after it went unreported. Not ``clip`` (4): a loaded GPU's power dips
# ~30 sigma for 3 samples in 30 with its job's step rhythm, and the scale must learn those dips or
# every loaded GPU alarms as its warm-up ends (of 4, 8, 12, 16, 24 and 32 tried, 8 and less did not
# learn them; on a series with a one-sample 600 W dip every 20 samples, 16 tripled the unclipped
# warm-up's alarms over 2160 samples, 24 added half).
WARMUP_CLIP = 24.0


@jit
def _ewma_cusum_kernel(slot: np.ndarray, values: np.ndarray, state: np.ndarray, params: np.ndarray,
                       out_row: np.ndarray, out_col: np.ndarray, out_score: np.ndarray) -> int:
    """Update state row by row; write alarms into the out_* arrays; return how many."""
    alpha, clip, drift, threshold, warmup, min_scale = params[0], params[1], params[2], params[3], params[4], params[5]
    n = 0
    for i in range(values.shape[0]):
        s = slot[i]
        for j in range(values.shape[1]):
            x = values[i, j]
            if not math.isfinite(x):
                continue  # missing (NaN) or overflowed (inf): state unchanged (an inf made it NaN for good)
            st = state[s, j]  # float32: read into float64 locals, computed in float64, stored once
            count = float(st[COUNT])
            if count == 0:
                st[LEVEL] = x
                st[SCALE] = 0.0
                st[COUNT] = 1.0
                continue
            level, scale, pos, neg = float(st[LEVEL]), float(st[SCALE]), float(st[POS]), float(st[NEG])
            dev = x - level
            sigma = max(SIGMA_PER_MAD * scale, min_scale)
            z = dev / sigma
            count += 1.0
            if count > warmup:
                pos = max(0.0, pos + z - drift)
                neg = max(0.0, neg - z - drift)
                if pos > threshold or neg > threshold:
                    out_row[n] = i
                    out_col[n] = j
                    out_score[n] = max(pos, neg)
                    n += 1
                    # a change is reported once: the level restarts from the new regime and is
                    # re-learnt over ``warmup`` samples (on a real load step the clipped level
                    # would otherwise take minutes to follow and re-alarm on every sample). The
                    # regime starts at the *next* sample, not this one: an alarm on a one-off
                    # glitch (a 0 W read on a 690 W GPU) seeded the level there and the scale
                    # learnt its distance unclipped, ~7x too wide to see a real shift after it
                    st[POS] = 0.0
                    st[NEG] = 0.0
                    st[COUNT] = 0.0
                    continue
            if count <= warmup:
                # learning a regime: the running mean and mean absolute deviation, winsorised only
                # far out (WARMUP_CLIP). A clipped EWMA of the scale started from zero could grow
                # only a few percent a sample (its clip is a multiple of itself): a series noisier
                # than ``min_scale`` ended its warm-up with a sigma far too small and alarmed at
                # once (every loaded GPU's power, whose step rhythm swings it by 100-300 W, at +5 min).
                if count > WARMUP_FREE:
                    lim = WARMUP_CLIP * sigma
                    dev = min(max(dev, -lim), lim)
                level += dev / count
                scale += (abs(dev) - scale) / (count - 1.0)
            else:
                lim = clip * sigma
                level += alpha * min(max(dev, -lim), lim)
                scale += alpha * (min(abs(dev), lim) - scale)
            st[LEVEL] = level
            st[SCALE] = scale
            st[POS] = pos
            st[NEG] = neg
            st[COUNT] = count
    return n


class RobustZScoreDetector(Detector):
    """Per-series robust z-score + CUSUM over GPU fields; emits anomalies, predicts nothing."""

    slot_kinds: ClassVar[Mapping[str, str]] = {"s_state": "gpu"}
    name: ClassVar[str] = "robust_zscore"
    kinds: ClassVar[tuple[str, ...]] = ("gpu",)

    def __init__(self, topology: Topology, fields: Sequence[str] = ("gpu_temp", "hbm_temp", "power"),
                 alpha: float = 0.01, clip: float = 4.0, drift: float = 0.5, threshold: float = 40.0,
                 warmup: int = 60, min_scale: float = 0.5) -> None:
        super().__init__(topology)
        known = field_names("gpu")
        unknown = [f for f in fields if f not in known]
        if unknown:
            raise ValueError(f"unknown gpu fields {unknown}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        if threshold <= 0 or drift < 0 or clip <= 0 or min_scale <= 0:
            raise ValueError("threshold, clip and min_scale must be > 0 and drift >= 0")
        self.fields = tuple(fields)
        self._cols = np.array([known.index(f) for f in self.fields])
        self.params = np.array([alpha, clip, drift, threshold, warmup, min_scale], dtype=np.float64)
        self.s_state = np.zeros((topology.size("gpu"), len(self.fields), N_STATE), dtype=STATE_DTYPE)

    def update(self, frame: Frame) -> list[Finding]:
        if len(frame) == 0:
            return []
        values = np.ascontiguousarray(np.stack([frame.columns[f] for f in self.fields], axis=1))
        cap = values.size
        rows = np.empty(cap, np.int64)
        cols = np.empty(cap, np.int64)
        scores = np.empty(cap)
        n = _ewma_cusum_kernel(frame.slot, values, self.s_state, self.params, rows, cols, scores)
        return [
            Anomaly(ts=float(frame.ts[r]), entity_kind="gpu", slot=int(frame.slot[r]), field=self.fields[c],
                    score=float(sc), detector=self.name, reason="CUSUM of robust z-score over threshold")
            for r, c, sc in zip(rows[:n], cols[:n], scores[:n])
        ]
