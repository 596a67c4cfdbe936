"""Damped Holt (optionally Holt-Winters additive seasonal) trend forecaster with prediction
intervals; the anomaly score is the one-step forecast error in standard deviations.

Error-correction form of ETS(A,Ad,N) / ETS(A,Ad,A) with level ``l``, trend ``b``, seasonal
``s`` (period ``period`` samples, 0 = none)::

    forecast   f = l + phi * b + s[phase]
    error      e = x - f                  (clipped at ``clip`` sigmas for learning)
    level      l <- l + phi * b + alpha * e
    trend      b <- phi * b + alpha * beta * e
    seasonal   s[phase] <- s[phase] + gamma * e

sigma is sqrt(pi/2) times an EWMA of the unclipped |e| (rate ``max(alpha_scale, 1/n)``). :meth:`Holt.forecast` gives the h-step point
forecast and its interval with the ETS variance
``sigma^2 * (1 + sum_{j<h} c_j^2)``, ``c_j = alpha * (1 + beta * (phi + ... + phi^j)) + gamma * [j % period == 0]``
(Hyndman et al., *Forecasting with Exponential Smoothing*, 2008, table 6.1).

The seasonal phase is a step counter shared by all series (they advance together in a batch).
During the first season each series stores its raw values and scores 0; the level then starts
at their mean and the seasonal terms at the deviations from it.

>>> import numpy as np
>>> t = np.arange(400.0)
>>> x = (50.0 + 0.1 * t + np.random.default_rng(2).normal(0, 0.5, 400))[:, None]
>>> det = Holt(n_series=1, alpha=0.2, beta=0.1, phi=0.98)
>>> z = det.update(x)
>>> point, lower, upper = det.forecast(horizon=10)
>>> bool(lower[0] < 50.0 + 0.1 * 409 < upper[0]), bool(upper[0] - lower[0] < 6.0)
(True, True)
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import ClassVar

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.numba_config import jit

from .ewma_zscore import SQRT_HALF_PI, robust_scale_floor
from .univariate import UnivariateDetector, check_count, check_positive, check_rate

LEVEL, TREND, MAD, COUNT = 0, 1, 2, 3
# params
ALPHA, BETA, PHI, GAMMA, PERIOD, ALPHA_SCALE, CLIP, WARMUP = range(8)


@jit
def _holt_kernel(x: np.ndarray, state: np.ndarray, season: np.ndarray, step: np.ndarray,
                 params: np.ndarray, out: np.ndarray, learn: bool) -> None:
    """state rows: level, trend, mad of errors, samples seen; season: (max(period, 1), n);
    step: [steps taken] (shared phase counter). params: see the index constants."""
    alpha, beta, phi, gamma = params[ALPHA], params[BETA], params[PHI], params[GAMMA]
    period = int(params[PERIOD])
    alpha_scale, clip, warmup = params[ALPHA_SCALE], params[CLIP], params[WARMUP]
    n_init = max(period, 1)
    for t in range(x.shape[0]):
        k = int(step[0]) + t
        phase = k % period if period > 0 else 0
        for j in range(x.shape[1]):
            v = x[t, j]
            if not math.isfinite(v):
                out[t, j] = np.nan
                continue
            n = state[COUNT, j]
            if n < n_init:
                # First season: collect raw values (only seasonal models need more than one).
                out[t, j] = 0.0
                if learn:
                    if period > 0:
                        season[phase, j] = v
                    else:
                        state[LEVEL, j] = v
                    if n + 1.0 >= n_init:
                        _start(state, season, j, period, k)
                    state[COUNT, j] = n + 1.0
                continue
            level, trend = state[LEVEL, j], state[TREND, j]
            s = season[phase, j] if period > 0 else 0.0
            e = v - (level + phi * trend + s)
            sigma = SQRT_HALF_PI * state[MAD, j]
            if n < n_init + 1.0 or n < warmup:
                out[t, j] = 0.0
            else:
                out[t, j] = abs(e) / max(sigma, robust_scale_floor(level))
            if not learn:
                continue
            b = max(alpha_scale, 1.0 / (n - n_init + 1.0))
            state[MAD, j] += b * (abs(e) - state[MAD, j])
            if clip > 0.0 and n >= warmup and sigma > 0.0:
                c = clip * sigma
                e = min(max(e, -c), c)
            state[LEVEL, j] = level + phi * trend + alpha * e
            state[TREND, j] = phi * trend + alpha * beta * e
            if period > 0:
                season[phase, j] = s + gamma * e
            state[COUNT, j] = n + 1.0
    if learn:
        step[0] += x.shape[0]


@jit
def _start(state: np.ndarray, season: np.ndarray, j: int, period: int, k: int) -> None:
    """End of the first season for series ``j`` (``k`` = current step): level = mean of the
    season's values, seasonal terms = deviations (missing samples count as 0)."""
    if period == 0:
        return  # the level is the single collected value
    total = 0.0
    count = 0
    for p in range(period):
        if math.isfinite(season[p, j]):
            total += season[p, j]
            count += 1
    level = total / max(count, 1)
    for p in range(period):
        season[p, j] = season[p, j] - level if math.isfinite(season[p, j]) else 0.0
    state[LEVEL, j] = level
    state[TREND, j] = 0.0
    state[MAD, j] = 0.0


class Holt(UnivariateDetector):
    """Damped Holt(-Winters) forecaster per series (see module docstring).

    Parameters: ``alpha`` level, ``beta`` trend (as a fraction of ``alpha``'s correction),
    ``phi`` damping in (0, 1], ``period`` seasonal period in samples (0 = none), ``gamma``
    seasonal rate, ``alpha_scale`` rate of the error-scale EWMA, ``clip`` Huber clip in sigmas,
    ``warmup`` samples before scoring.
    """

    name: ClassVar[str] = "holt"

    def __init__(self, n_series: int, alpha: float = 0.1, beta: float = 0.1, phi: float = 0.98,
                 period: int = 0, gamma: float = 0.1, alpha_scale: float = 0.01, clip: float = 4.0,
                 warmup: int = 30, health: PipelineHealth | None = None) -> None:
        super().__init__(n_series, health)
        check_rate(self.name, alpha=alpha, phi=phi, alpha_scale=alpha_scale)
        check_count(self.name, period=period, warmup=warmup)
        for key, v in (("beta", beta), ("gamma", gamma)):
            if not (np.isfinite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"{self.name}: {key} must be in [0, 1], got {v!r}")
        if clip != 0.0:
            check_positive(self.name, clip=clip)
        self.params = np.array([alpha, beta, phi, gamma, period, alpha_scale, clip, warmup], dtype=np.float64)
        self.period = int(period)
        self.s_state = np.zeros((4, self.n_series), dtype=np.float64)
        # NaN marks a phase not seen yet during the first season (a missing sample stays missing).
        self.s_season = np.full((max(self.period, 1), self.n_series), np.nan if self.period else 0.0)
        self.s_step = np.zeros(1, dtype=np.float64)

    def _run(self, x: np.ndarray, out: np.ndarray, learn: bool) -> None:
        _holt_kernel(x, self.s_state, self.s_season, self.s_step, self.params, out, learn)

    def forecast(self, horizon: int = 1, coverage: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Point forecast ``horizon`` steps ahead and its ``coverage`` prediction interval, per
        series (NaN for series still in their first season)."""
        if int(horizon) != horizon or horizon < 1:
            raise ValueError(f"{self.name}: horizon must be a positive integer, got {horizon!r}")
        if not 0.0 < coverage < 1.0:
            raise ValueError(f"{self.name}: coverage must be in (0, 1), got {coverage!r}")
        alpha, beta, phi, gamma = (float(self.params[i]) for i in (ALPHA, BETA, PHI, GAMMA))
        level, trend = self.s_state[LEVEL], self.s_state[TREND]
        damp = sum(phi ** i for i in range(1, horizon + 1))
        point = level + damp * trend
        if self.period:
            phase = (int(self.s_step[0]) + horizon - 1) % self.period
            point = point + self.s_season[phase]
        var_factor = 1.0
        for j in range(1, horizon):
            c = alpha * (1.0 + beta * sum(phi ** i for i in range(1, j + 1)))
            if self.period and j % self.period == 0:
                c += gamma
            var_factor += c * c
        sigma = SQRT_HALF_PI * self.s_state[MAD] * math.sqrt(var_factor)
        half = NormalDist().inv_cdf(0.5 + coverage / 2.0) * sigma
        ready = self.s_state[COUNT] >= max(self.period, 1) + 1
        point = np.where(ready, point, np.nan)
        return point, point - half, point + half
