"""Detectors runnable on NAB files: each maps one series (timestamps, values) to anomaly scores
in [0, 1], online — the score of row t uses rows up to t only.

``foreshock`` is the combination foreshock ships (:func:`foreshock_combiner`); the others run a
single generic detector with the same scale, for comparison; ``null`` is NAB's null detector.
One parameter set serves every file: nothing here looks at a file's name, length or range.
The only thing read from the data is the sampling step — the median of the first
``PERIOD_PROBE`` gaps, known after those rows — to turn a week into a number of samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from .combiner import Combiner
from .cusum import Cusum
from .ewma_zscore import EwmaZScore
from .holt import Holt
from .page_hinkley import PageHinkley
from .range_novelty import RangeNovelty
from .seasonal import SeasonalDiff
from .univariate import UnivariateDetector

PERIOD_PROBE = 100
WEEK_S = 7 * 86400.0


@dataclass(frozen=True)
class NabParams:
    """The one parameter set of the ``foreshock`` NAB detector. Chosen on realKnownCause itself
    (by a coarse grid, one or two parameters at a time), so its score there is in-sample; the
    scores of its neighbours and a leave-one-file-out check are in docs/nab.md."""

    range_scale: float = 0.015      # a 1.5 % break-out of the running range
    range_warmup: int = 100
    z_alpha: float = 0.01
    z_scale: float = 8.0            # a robust z of 8
    z_warmup: int = 100
    seasonal_scale: float = 14.0    # smoothed weekly-difference z of 14
    seasonal_smooth: float = 12.0   # ~6 h at NYC taxi's 30 min: "an unusual day"
    seasonal_alpha: float = 0.002
    seasonal_warmup: int = 200
    seasonal_min_gain: float = 1.0  # weekly term only while it beats the level predictor
    min_seasons: int = 3            # a weekly term needs >= 3 weeks of data before it scores
    hold_s: float = 2 * 86400.0     # alerts de-duplicated over 2 days
    escalate: float = 1.0           # ... unless the episode gets this many times worse


def sampling_step(seconds: np.ndarray) -> float:
    """Median gap of the first ``PERIOD_PROBE`` rows (positive gaps only), in seconds."""
    gaps = np.diff(seconds[: PERIOD_PROBE + 1])
    gaps = gaps[gaps > 0]
    return float(np.median(gaps)) if gaps.size else math.nan


def foreshock_combiner(seconds: np.ndarray, params: NabParams = NabParams()) -> Combiner:
    """Range novelty + robust EWMA z + weekly seasonal difference, max-combined, held."""
    members: list[tuple[UnivariateDetector, float]] = [
        (RangeNovelty(1, warmup=params.range_warmup), params.range_scale),
        (EwmaZScore(1, alpha=params.z_alpha, warmup=params.z_warmup), params.z_scale),
    ]
    step = sampling_step(seconds)
    if math.isfinite(step):
        period = int(round(WEEK_S / step))
        # The weekly term joins only when the sampling makes a week a sensible period; it
        # starts scoring after `min_seasons` weeks (the warm-up below), never earlier.
        if 2 <= period <= 20000:
            warmup = max(params.seasonal_warmup, (params.min_seasons - 1) * period)
            members.append((SeasonalDiff(1, period=period, smooth=params.seasonal_smooth,
                                         alpha_scale=params.seasonal_alpha, warmup=warmup,
                                         min_gain=params.seasonal_min_gain),
                            params.seasonal_scale))
    return Combiner(members, hold=params.hold_s, escalate=params.escalate)


def _single(make: Callable[[], UnivariateDetector], scale: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """One detector through the same combiner (scale, squash, hold) as the combination."""
    def run(seconds: np.ndarray, values: np.ndarray) -> np.ndarray:
        comb = Combiner([(make(), scale)], hold=NabParams().hold_s)
        return comb.update(values[:, None], ts=seconds)[:, 0]
    return run


def _seasonal_single(seconds: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The weekly seasonal difference alone (0 where the sampling gives no sensible week)."""
    comb = foreshock_combiner(seconds)
    seasonal = [(m, 1.0 / k) for m, k in zip(comb.members, comb.inv_scale) if m.name == "seasonal_diff"]
    if not seasonal:
        return np.zeros(values.shape[0])
    return Combiner(seasonal, hold=NabParams().hold_s).update(values[:, None], ts=seconds)[:, 0]


def _foreshock(seconds: np.ndarray, values: np.ndarray, params: NabParams = NabParams()) -> np.ndarray:
    comb = foreshock_combiner(seconds, params)
    return comb.update(values[:, None], ts=seconds)[:, 0]


def _null(seconds: np.ndarray, values: np.ndarray) -> np.ndarray:
    return np.full(values.shape[0], 0.5)


P = NabParams()
NAB_DETECTORS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "foreshock": _foreshock,
    "ewma_zscore": _single(lambda: EwmaZScore(1, alpha=P.z_alpha, warmup=P.z_warmup), P.z_scale),
    "range_novelty": _single(lambda: RangeNovelty(1, warmup=P.range_warmup), P.range_scale),
    "cusum": _single(lambda: Cusum(1, alpha=0.005, warmup=P.z_warmup), 20.0),
    "page_hinkley": _single(lambda: PageHinkley(1), 50.0),
    "seasonal_diff": _seasonal_single,
    "holt": _single(lambda: Holt(1, alpha=0.1, beta=0.1, phi=0.98, warmup=P.z_warmup), P.z_scale),
    "null": _null,
}
"""Name -> ``f(seconds, values) -> scores in [0, 1]``."""


def run_nab_detector(name: str, seconds: np.ndarray, values: np.ndarray,
                     params: NabParams | None = None) -> np.ndarray:
    """Scores in [0, 1] for one NAB file; NaN (missing values) read as 0 (no detection)."""
    if name not in NAB_DETECTORS:
        raise ValueError(f"unknown NAB detector {name!r}; known: {sorted(NAB_DETECTORS)}")
    if name == "foreshock" and params is not None:
        scores = _foreshock(seconds, values, replace(params))
    else:
        scores = NAB_DETECTORS[name](seconds, values)
    return np.clip(np.nan_to_num(scores, nan=0.0), 0.0, 1.0)
