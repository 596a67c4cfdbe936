"""Robust EWMA z-score: how far a sample sits from the series' exponentially weighted mean, in
units of its exponentially weighted mean absolute deviation.

Per sample ``v`` with mean ``m`` and mean absolute deviation ``d``::

    score = |v - m| / (sqrt(pi/2) * d)           (sqrt(pi/2) d = sigma for Gaussian noise)
    m    <- m + a * clip(v - m, +-clip * sigma)   (Huber: a spike cannot drag the mean)
    d    <- d + b * (|v - m_new| - d)

with rates ``a = max(alpha, 1/(n+1))``, ``b = max(alpha_scale, 1/n)``: the first samples use
running means, so the estimates are unbiased from the start. The scale takes the unclipped
deviation: a series whose noise really grew is believed soon, a lone spike moves it by
``alpha_scale`` of its size.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> x = rng.normal(10.0, 1.0, size=(500, 2)); x[400, 1] += 8.0     # one spike on series 1
>>> det = EwmaZScore(n_series=2, alpha=0.02)
>>> z = det.update(x)
>>> bool(z[400, 1] > 6.0), bool(z[400, 0] < 4.0)
(True, True)
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.numba_config import jit

from .univariate import UnivariateDetector, check_count, check_positive, check_rate

SQRT_HALF_PI = math.sqrt(math.pi / 2.0)
"""sigma / E|x - mu| for Gaussian noise."""

TINY_SCALE = 1e-12
"""Relative floor on the scale: a constant series that moves scores huge, not infinite."""

# Rows of the state array.
MEAN, MAD, COUNT = 0, 1, 2


@jit
def robust_scale_floor(m: float) -> float:
    return TINY_SCALE * max(1.0, abs(m))


@jit
def robust_ewma_step(m: float, mad: float, n: float, v: float, params: np.ndarray) -> tuple[float, float]:
    """One learning step of the robust EWMA baseline shared by the z-score and CUSUM detectors.

    ``params``: alpha, alpha_scale, clip (sigmas, 0 = off), warmup. Returns (mean, mad)."""
    alpha, alpha_scale, clip, warmup = params[0], params[1], params[2], params[3]
    if n < 1.0:
        return v, 0.0
    r = v - m
    sigma = SQRT_HALF_PI * mad
    if clip > 0.0 and n >= warmup and sigma > 0.0:
        c = clip * sigma
        r = min(max(r, -c), c)
    a = max(alpha, 1.0 / (n + 1.0))
    b = max(alpha_scale, 1.0 / n)
    m_new = m + a * r
    return m_new, mad + b * (abs(v - m_new) - mad)


@jit
def _ewma_zscore_kernel(x: np.ndarray, state: np.ndarray, params: np.ndarray,
                        out: np.ndarray, learn: bool) -> None:
    """state rows: mean, mean absolute deviation, samples seen.
    params: alpha, alpha_scale, clip (in sigmas, 0 = off), warmup."""
    warmup = params[3]
    for t in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[t, j]
            if not math.isfinite(v):
                out[t, j] = np.nan
                continue
            n = state[COUNT, j]
            m = state[MEAN, j]
            if n < 1.0 or n < warmup:
                out[t, j] = 0.0
            else:
                sigma = SQRT_HALF_PI * state[MAD, j]
                out[t, j] = abs(v - m) / max(sigma, robust_scale_floor(m))
            if learn:
                state[MEAN, j], state[MAD, j] = robust_ewma_step(m, state[MAD, j], n, v, params)
                state[COUNT, j] = n + 1.0


class EwmaZScore(UnivariateDetector):
    """Robust EWMA z-score per series (see module docstring).

    Parameters: ``alpha`` mean smoothing rate; ``alpha_scale`` scale smoothing rate (default
    ``alpha``); ``clip`` Huber clip in standard deviations (0 disables); ``warmup`` samples
    before the first non-zero score.
    """

    name: ClassVar[str] = "ewma_zscore"

    def __init__(self, n_series: int, alpha: float = 0.01, alpha_scale: float | None = None,
                 clip: float = 4.0, warmup: int = 30, health: PipelineHealth | None = None) -> None:
        super().__init__(n_series, health)
        alpha_scale = alpha if alpha_scale is None else alpha_scale
        check_rate(self.name, alpha=alpha, alpha_scale=alpha_scale)
        check_count(self.name, warmup=warmup)
        if clip != 0.0:
            check_positive(self.name, clip=clip)
        self.params = np.array([alpha, alpha_scale, clip, warmup], dtype=np.float64)
        self.s_state = np.zeros((3, self.n_series), dtype=np.float64)

    def _run(self, x: np.ndarray, out: np.ndarray, learn: bool) -> None:
        _ewma_zscore_kernel(x, self.s_state, self.params, out, learn)

    @property
    def mean(self) -> np.ndarray:
        return self.s_state[MEAN].copy()

    @property
    def sigma(self) -> np.ndarray:
        return SQRT_HALF_PI * self.s_state[MAD]
