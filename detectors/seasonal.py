"""Seasonal difference z-score: compares each sample with the one a full period earlier
(yesterday or last week at the same time) and scores the smoothed difference in standard
deviations. Catches "lower than a normal Thursday" days that no level-based score sees.

    r_t = x_t - x_{t-period}
    z_t = r_t / sigma_r                  (sigma_r: sqrt(pi/2) * EWMA |r|)
    m_t = m_{t-1} + (z_t - m_{t-1}) / k  (EWMA over ~k samples)
    score = |m_t| * sqrt(2k - 1)         (unit variance for independent z)

A weekly term only means something for a series that repeats weekly: the score is 0 while the
seasonal difference is not steadier than the deviation from the recent level (an EWMA
baseline), i.e. while "same as last week" predicts worse than "same as lately".

The last ``period`` samples of each series live in a ring buffer; the ring position is a step
counter shared by all series. A missing sample (or a missing one a period ago) leaves the
state alone and, for the current one, scores NaN (the ring still stores it, as missing).

>>> import numpy as np
>>> t = np.arange(24 * 60)
>>> x = (10 + 3 * np.sin(2 * np.pi * t / 24) + np.random.default_rng(3).normal(0, 0.2, t.size))[:, None]
>>> x[24 * 50: 24 * 51] -= 1.5                                     # one low "day"
>>> s = SeasonalDiff(n_series=1, period=24, smooth=6).update(x)[:, 0]
>>> bool(s[24 * 50: 24 * 51].max() > 2 * s[24 * 10: 24 * 50].max())
True
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.numba_config import jit

from .ewma_zscore import SQRT_HALF_PI, TINY_SCALE, robust_ewma_step
from .univariate import UnivariateDetector, check_count, check_rate

MAD, SMOOTH, COUNT, LEVEL, LEVEL_MAD, LEVEL_N = 0, 1, 2, 3, 4, 5


@jit
def _seasonal_diff_kernel(x: np.ndarray, state: np.ndarray, ring: np.ndarray, step: np.ndarray,
                          params: np.ndarray, out: np.ndarray, learn: bool) -> None:
    """state rows: mad of differences, smoothed z, differences seen, then the level baseline
    (mean, mad, samples); ring: (period, n) past samples; step: [samples taken].
    params: alpha_scale, smooth k, warmup, min_gain, then the baseline's alpha, alpha_scale,
    clip, warmup (see :func:`robust_ewma_step`)."""
    alpha_scale, k, warmup, min_gain = params[0], params[1], params[2], params[3]
    baseline = params[4:8]
    period = ring.shape[0]
    gain = math.sqrt(2.0 * k - 1.0)
    for t in range(x.shape[0]):
        s = int(step[0]) + t
        pos = s % period
        full = s >= period
        for j in range(x.shape[1]):
            v = x[t, j]
            past = ring[pos, j]
            if learn:
                ring[pos, j] = v
            if not math.isfinite(v):
                out[t, j] = np.nan
                continue
            if learn:
                state[LEVEL, j], state[LEVEL_MAD, j] = robust_ewma_step(
                    state[LEVEL, j], state[LEVEL_MAD, j], state[LEVEL_N, j], v, baseline)
                state[LEVEL_N, j] += 1.0
            if not full or not math.isfinite(past):
                out[t, j] = 0.0
                continue
            r = v - past
            n = state[COUNT, j]
            sigma = SQRT_HALF_PI * state[MAD, j]
            m = state[SMOOTH, j]
            if n >= 1.0 and n >= warmup:
                z = r / max(sigma, TINY_SCALE * max(1.0, abs(past)))
                m = m + (z - m) / k
                # Gate: the weekly predictor must beat "same as the recent level".
                useful = state[LEVEL_MAD, j] >= min_gain * state[MAD, j]
                out[t, j] = abs(m) * gain if useful else 0.0
            else:
                out[t, j] = 0.0
            if not learn:
                continue
            state[SMOOTH, j] = m
            b = max(alpha_scale, 1.0 / (n + 1.0))
            state[MAD, j] += b * (abs(r) - state[MAD, j])
            state[COUNT, j] = n + 1.0
    if learn:
        step[0] += x.shape[0]


class SeasonalDiff(UnivariateDetector):
    """Smoothed z-score of the difference from one period earlier (see module docstring).

    Parameters: ``period`` in samples; ``smooth`` k (1 = no smoothing); ``alpha_scale`` rate of
    the difference-scale EWMA; ``warmup`` differences before scoring; ``min_gain``: score only
    while the seasonal difference is this much steadier than the deviation from the recent
    level (0 = always); ``level_alpha`` rate of that level baseline.
    """

    name: ClassVar[str] = "seasonal_diff"

    def __init__(self, n_series: int, period: int, smooth: float = 6.0, alpha_scale: float = 0.002,
                 warmup: int = 200, min_gain: float = 1.0, level_alpha: float = 0.01,
                 health: PipelineHealth | None = None) -> None:
        super().__init__(n_series, health)
        check_count(self.name, warmup=warmup)
        if int(period) != period or period < 1:
            raise ValueError(f"{self.name}: period must be a positive integer, got {period!r}")
        check_rate(self.name, alpha_scale=alpha_scale)
        if not (np.isfinite(smooth) and smooth >= 1.0):
            raise ValueError(f"{self.name}: smooth must be >= 1, got {smooth!r}")
        check_rate(self.name, level_alpha=level_alpha)
        if not (np.isfinite(min_gain) and min_gain >= 0.0):
            raise ValueError(f"{self.name}: min_gain must be >= 0, got {min_gain!r}")
        self.params = np.array([alpha_scale, smooth, warmup, min_gain,
                                level_alpha, level_alpha, 4.0, 30.0], dtype=np.float64)
        self.s_state = np.zeros((6, self.n_series), dtype=np.float64)
        self.s_ring = np.full((int(period), self.n_series), np.nan)
        self.s_step = np.zeros(1, dtype=np.float64)

    def _run(self, x: np.ndarray, out: np.ndarray, learn: bool) -> None:
        _seasonal_diff_kernel(x, self.s_state, self.s_ring, self.s_step, self.params, out, learn)
