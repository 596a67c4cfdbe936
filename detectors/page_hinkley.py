"""Page-Hinkley test for a change of the mean, statistic for statistic the same as
``river.drift.PageHinkley`` (river 0.26) so the two compare on equal terms.

With the cumulative mean ``mean_t`` (including ``x_t``) and forgetting factor ``alpha``::

    inc_t = alpha * inc_{t-1} + (x_t - mean_t) - delta      # evidence of an increase
    dec_t = alpha * dec_{t-1} + (x_t - mean_t) + delta      # evidence of a decrease
    score = max(inc_t - min(inc), max(dec) - dec_t)          # after min_instances samples

river starts ``max(dec)`` at -1 rather than -inf; that is mirrored. river resets everything
after a detection; here the score is reported and, only when ``threshold`` is given, the
state restarts after a score above it — exactly river's behaviour with the same threshold.

>>> import numpy as np
>>> rng = np.random.default_rng(12345)
>>> x = np.r_[rng.integers(0, 2, 1000), rng.integers(4, 8, 1000)].astype(float)[:, None]
>>> s = PageHinkley(n_series=1, threshold=50.0).update(x)[:, 0]
>>> int(np.argmax(s > 50.0))
1008
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.numba_config import jit

from .univariate import UnivariateDetector, check_count, check_positive, check_rate

MEAN, COUNT, INC, DEC, MIN_INC, MAX_DEC = 0, 1, 2, 3, 4, 5
INITIAL = np.array([0.0, 0.0, 0.0, 0.0, np.inf, -1.0])
"""Fresh state for one series (river's ``_reset``)."""


@jit
def _page_hinkley_kernel(x: np.ndarray, state: np.ndarray, params: np.ndarray,
                         out: np.ndarray, learn: bool) -> None:
    """state rows: mean, count, inc, dec, min(inc), max(dec).
    params: delta, alpha (forgetting factor), min_instances, threshold (inf = never reset)."""
    delta, alpha, min_instances, threshold = params[0], params[1], params[2], params[3]
    for t in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[t, j]
            if not math.isfinite(v):
                out[t, j] = np.nan
                continue
            n = state[COUNT, j] + 1.0
            mean = state[MEAN, j] + (v - state[MEAN, j]) / n
            dev = v - mean
            inc = alpha * state[INC, j] + dev - delta
            dec = alpha * state[DEC, j] + dev + delta
            min_inc = min(state[MIN_INC, j], inc)
            max_dec = max(state[MAX_DEC, j], dec)
            score = max(inc - min_inc, max_dec - dec) if n >= min_instances else 0.0
            out[t, j] = score
            if not learn:
                continue
            if score > threshold:
                for k in range(state.shape[0]):
                    state[k, j] = INITIAL[k]
            else:
                state[MEAN, j] = mean
                state[COUNT, j] = n
                state[INC, j] = inc
                state[DEC, j] = dec
                state[MIN_INC, j] = min_inc
                state[MAX_DEC, j] = max_dec


class PageHinkley(UnivariateDetector):
    """Two-sided Page-Hinkley statistic per series (see module docstring); parameters and
    defaults are river's."""

    name: ClassVar[str] = "page_hinkley"

    def __init__(self, n_series: int, min_instances: int = 30, delta: float = 0.005,
                 alpha: float = 1 - 0.0001, threshold: float | None = None,
                 health: PipelineHealth | None = None) -> None:
        super().__init__(n_series, health)
        check_count(self.name, min_instances=min_instances)
        check_rate(self.name, alpha=alpha)
        if not (np.isfinite(delta) and delta >= 0.0):
            raise ValueError(f"{self.name}: delta must be a non-negative finite number, got {delta!r}")
        if threshold is not None:
            check_positive(self.name, threshold=threshold)
        self.params = np.array([delta, alpha, min_instances,
                                np.inf if threshold is None else threshold], dtype=np.float64)
        self.s_state = np.repeat(INITIAL[:, None], self.n_series, axis=1)

    def _run(self, x: np.ndarray, out: np.ndarray, learn: bool) -> None:
        _page_hinkley_kernel(x, self.s_state, self.params, out, learn)
