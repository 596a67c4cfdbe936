"""Range novelty: how far a sample falls outside every value the series has shown so far, as
a fraction of that range — the "spatial anomaly" rule of Numenta's NAB detector, made a score.

    score = max(x - hi, lo - x, 0) / (hi - lo)

with ``lo``/``hi`` the running minimum and maximum. A series that breaks out of its whole
history is the plainest anomaly there is (a temperature never seen, a latency beyond any
before), and this costs two numbers per series. ``forget`` (per sample, default 0 = never)
lets old extremes fade: both ends move towards each other by ``forget * (hi - lo)`` each
sample, so a series that settled into a narrower band gets flagged again when it leaves it.

>>> import numpy as np
>>> x = np.r_[np.sin(np.arange(300) / 5.0), 1.5][:, None]            # ends above its range
>>> s = RangeNovelty(n_series=1, warmup=40).update(x)[:, 0]
>>> bool(s[:300].max() < 0.01), round(float(s[300]), 2)
(True, 0.25)
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.numba_config import jit

from .ewma_zscore import robust_scale_floor
from .univariate import UnivariateDetector, check_count

LO, HI, COUNT = 0, 1, 2


@jit
def _range_novelty_kernel(x: np.ndarray, state: np.ndarray, params: np.ndarray,
                          out: np.ndarray, learn: bool) -> None:
    """state rows: running min, running max, samples seen. params: warmup, forget."""
    warmup, forget = params[0], params[1]
    for t in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[t, j]
            if not math.isfinite(v):
                out[t, j] = np.nan
                continue
            n = state[COUNT, j]
            lo, hi = state[LO, j], state[HI, j]
            if n < 1.0:
                lo, hi = v, v
                out[t, j] = 0.0
            else:
                excess = max(v - hi, lo - v, 0.0)
                span = max(hi - lo, robust_scale_floor(0.5 * (hi + lo)))
                out[t, j] = excess / span if n >= warmup else 0.0
            if learn:
                if forget > 0.0:
                    shrink = forget * (hi - lo)
                    lo, hi = lo + shrink, hi - shrink
                state[LO, j] = min(lo, v)
                state[HI, j] = max(hi, v)
                state[COUNT, j] = n + 1.0


class RangeNovelty(UnivariateDetector):
    """Excess beyond the running range, as a fraction of the range (see module docstring)."""

    name: ClassVar[str] = "range_novelty"

    def __init__(self, n_series: int, warmup: int = 30, forget: float = 0.0,
                 health: PipelineHealth | None = None) -> None:
        super().__init__(n_series, health)
        check_count(self.name, warmup=warmup)
        if not (np.isfinite(forget) and 0.0 <= forget < 0.5):
            raise ValueError(f"{self.name}: forget must be in [0, 0.5), got {forget!r}")
        self.params = np.array([warmup, forget], dtype=np.float64)
        self.s_state = np.zeros((3, self.n_series), dtype=np.float64)

    def _run(self, x: np.ndarray, out: np.ndarray, learn: bool) -> None:
        _range_novelty_kernel(x, self.s_state, self.params, out, learn)
