"""Two-sided CUSUM on standardised residuals: accumulates evidence of a sustained shift of the
mean that a per-sample z-score would miss.

Each sample is standardised against the robust EWMA baseline of :mod:`.ewma_zscore`
(``z = (x - mean) / sigma``); the upper and lower sums are ``S+ = max(0, S+ + z - k)`` and
``S- = max(0, S- - z - k)`` with allowance ``k`` (half the shift, in sigmas, worth detecting
fastest). The score is ``max(S+, S-)`` including the current sample. ``reset`` (optional)
restarts both sums after a score above it, the textbook alarm-and-restart chart; by default
the sums run on and the slowly adapting baseline brings them back once a shift is absorbed.

>>> import numpy as np
>>> rng = np.random.default_rng(1)
>>> x = rng.normal(0.0, 1.0, size=(600, 1)); x[400:] += 1.0       # a one-sigma step at 400
>>> s = Cusum(n_series=1, alpha=0.005, drift=0.5).update(x)[:, 0]
>>> bool(s[:400].max() < 8.0), bool(s[460:].max() > 10.0)
(True, True)
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.numba_config import jit

from .ewma_zscore import SQRT_HALF_PI, robust_ewma_step, robust_scale_floor
from .univariate import UnivariateDetector, check_count, check_positive, check_rate

MEAN, MAD, COUNT, UP, DOWN = 0, 1, 2, 3, 4


@jit
def _cusum_kernel(x: np.ndarray, state: np.ndarray, params: np.ndarray,
                  out: np.ndarray, learn: bool) -> None:
    """state rows: mean, mad, samples seen, S+, S-.
    params: alpha, alpha_scale, clip, warmup (the baseline's), drift k, reset (inf = never)."""
    warmup, drift, reset = params[3], params[4], params[5]
    for t in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[t, j]
            if not math.isfinite(v):
                out[t, j] = np.nan
                continue
            n = state[COUNT, j]
            m = state[MEAN, j]
            up = state[UP, j]
            down = state[DOWN, j]
            if n >= 1.0 and n >= warmup:
                sigma = max(SQRT_HALF_PI * state[MAD, j], robust_scale_floor(m))
                z = (v - m) / sigma
                up = max(0.0, up + z - drift)
                down = max(0.0, down - z - drift)
            score = max(up, down)
            out[t, j] = score
            if learn:
                if score > reset:
                    up = 0.0
                    down = 0.0
                state[UP, j] = up
                state[DOWN, j] = down
                state[MEAN, j], state[MAD, j] = robust_ewma_step(m, state[MAD, j], n, v, params)
                state[COUNT, j] = n + 1.0


class Cusum(UnivariateDetector):
    """Two-sided CUSUM of robust z-scores (see module docstring).

    Parameters: ``alpha``/``alpha_scale``/``clip``/``warmup`` as :class:`EwmaZScore`'s
    baseline; ``drift`` the allowance k in sigmas; ``reset`` restart level (None = never).
    """

    name: ClassVar[str] = "cusum"

    def __init__(self, n_series: int, alpha: float = 0.005, alpha_scale: float | None = None,
                 clip: float = 4.0, warmup: int = 30, drift: float = 0.5, reset: float | None = None,
                 health: PipelineHealth | None = None) -> None:
        super().__init__(n_series, health)
        alpha_scale = alpha if alpha_scale is None else alpha_scale
        check_rate(self.name, alpha=alpha, alpha_scale=alpha_scale)
        check_count(self.name, warmup=warmup)
        if clip != 0.0:
            check_positive(self.name, clip=clip)
        if not (np.isfinite(drift) and drift >= 0.0):
            raise ValueError(f"{self.name}: drift must be a non-negative finite number, got {drift!r}")
        if reset is not None:
            check_positive(self.name, reset=reset)
        self.params = np.array([alpha, alpha_scale, clip, warmup, drift,
                                np.inf if reset is None else reset], dtype=np.float64)
        self.s_state = np.zeros((5, self.n_series), dtype=np.float64)

    def _run(self, x: np.ndarray, out: np.ndarray, learn: bool) -> None:
        _cusum_kernel(x, self.s_state, self.params, out, learn)
