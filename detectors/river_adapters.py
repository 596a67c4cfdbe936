"""river adapters: foreshock's generic detectors behind river's ``AnomalyDetector`` interface
(``learn_one(x: dict)`` / ``score_one(x: dict) -> float``), so they run wherever a river
detector runs — ``river.anomaly.QuantileFilter``, ``river.compose`` pipelines, evaluation
loops — and compare with river's own detectors on equal terms, one event at a time.

``score_one`` never learns (river's contract, and ours). The adapters are river estimators:
their constructor arguments are their parameters, so ``clone()`` gives a fresh copy.

>>> import random
>>> from river import anomaly
>>> rng = random.Random(7)
>>> model = UnivariateAdapter("ewma_zscore", params={"alpha": 0.05})
>>> for _ in range(300):
...     model.learn_one({"temp": rng.gauss(50.0, 1.0)})
>>> model.score_one({"temp": 50.5}) < 2.0 < model.score_one({"temp": 58.0})
True
>>> guarded = anomaly.QuantileFilter(UnivariateAdapter("range_novelty"), q=0.99)
>>> for v in range(100):
...     guarded.learn_one({"x": float(v % 10)})
>>> guarded.score_one({"x": 25.0}) > 0.5
True
>>> combined = CombinerAdapter([("range_novelty", 0.05), ("ewma_zscore", 8.0)])
>>> for _ in range(300):
...     combined.learn_one({"temp": rng.gauss(50.0, 1.0)})
>>> combined.score_one({"temp": 50.5}) < 0.5 < combined.score_one({"temp": 65.0}) <= 1.0
True
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from river import base

from .combiner import Combiner
from .cusum import Cusum
from .ewma_zscore import EwmaZScore
from .holt import Holt
from .multivariate import OnlineMahalanobis
from .page_hinkley import PageHinkley
from .range_novelty import RangeNovelty
from .seasonal import SeasonalDiff
from .univariate import UnivariateDetector

UNIVARIATE: dict[str, type[UnivariateDetector]] = {
    cls.name: cls for cls in (EwmaZScore, Cusum, PageHinkley, Holt, RangeNovelty, SeasonalDiff)
}
"""The generic univariate detectors by name."""


def _value(x: dict[Any, Any], feature: Any, who: str) -> float:
    """The watched value; NaN (a missing sample) when the dict lacks it. river streams drop and
    add features from one event to the next, and river's check suite feeds such streams."""
    if feature is not None:
        return float(x.get(feature, np.nan))
    if len(x) > 1:
        raise ValueError(f"{who}: got {len(x)} features; name the one to watch with feature=...")
    return float(next(iter(x.values()))) if x else np.nan


class UnivariateAdapter(base.AnomalyDetector):
    """One foreshock univariate detector (``detector``: a name from :data:`UNIVARIATE`) on one
    feature of the incoming dicts (``feature``; may be omitted when dicts have one key).
    ``params`` are the detector's keyword arguments (``health`` included: missing values are
    counted there). Scores are the detector's own (a z, a CUSUM statistic...). A missing value
    (NaN, or the feature absent from the dict) scores 0 and teaches nothing."""

    def __init__(self, detector: str = "ewma_zscore", feature: Any = None,
                 params: dict[str, Any] | None = None) -> None:
        if detector not in UNIVARIATE:
            raise ValueError(f"unknown detector {detector!r}; known: {sorted(UNIVARIATE)}")
        self.detector = detector
        self.feature = feature
        self.params = dict(params or {})
        self._det = UNIVARIATE[detector](1, **self.params)
        self._buf = np.empty(1)

    def learn_one(self, x: dict[Any, Any]) -> None:
        self._buf[0] = _value(x, self.feature, self.detector)
        self._det.update(self._buf)

    def score_one(self, x: dict[Any, Any]) -> float:
        self._buf[0] = _value(x, self.feature, self.detector)
        s = float(self._det.score(self._buf)[0])
        return s if np.isfinite(s) else 0.0

    def state_dict(self) -> dict[str, np.ndarray]:
        return self._det.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._det.load_state_dict(state)

    @classmethod
    def _unit_test_params(cls) -> Any:
        yield {"detector": "ewma_zscore"}


class CombinerAdapter(base.AnomalyDetector):
    """A :class:`~foreshock.detectors.combiner.Combiner` of univariate detectors on one feature:
    one score in [0, 1], the combination itself compared with river's detectors event by event.

    ``members``: ``(detector name, scale)`` or ``(detector name, scale, params)`` entries (names
    from :data:`UNIVARIATE`, scales and params as the combiner's members take them); ``hold``
    and ``escalate`` as the combiner's, ``hold`` counted in learned events (river passes no
    timestamps); ``feature`` as :class:`UnivariateAdapter`'s."""

    def __init__(self, members: Sequence[Sequence[Any]] = (("range_novelty", 0.015), ("ewma_zscore", 8.0)),
                 feature: Any = None, hold: float = 0.0, escalate: float = 1.0) -> None:
        self.members = tuple(tuple(m) for m in members)
        self.feature = feature
        self.hold = hold
        self.escalate = escalate
        built: list[tuple[UnivariateDetector, float]] = []
        for spec in self.members:
            if len(spec) not in (2, 3) or spec[0] not in UNIVARIATE:
                raise ValueError(f"combiner member {spec!r}: expected (detector name, scale[, params]) "
                                 f"with a name from {sorted(UNIVARIATE)}")
            params = dict(spec[2] or {}) if len(spec) == 3 else {}
            built.append((UNIVARIATE[spec[0]](1, **params), float(spec[1])))
        self._comb = Combiner(built, hold=hold, escalate=escalate)
        self._buf = np.empty(1)

    def learn_one(self, x: dict[Any, Any]) -> None:
        self._buf[0] = _value(x, self.feature, "combiner")
        self._comb.update(self._buf)

    def score_one(self, x: dict[Any, Any]) -> float:
        self._buf[0] = _value(x, self.feature, "combiner")
        s = float(self._comb.score(self._buf)[0])
        return s if np.isfinite(s) else 0.0

    def state_dict(self) -> dict[str, Any]:
        return self._comb.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._comb.load_state_dict(state)

    @classmethod
    def _unit_test_params(cls) -> Any:
        yield {"hold": 5.0}


class MahalanobisAdapter(base.AnomalyDetector):
    """:class:`OnlineMahalanobis` on dicts of many fields. ``fields`` fixes the vector's order;
    when omitted, the keys of the first non-empty dict learned (sorted) are used. A field missing
    from a dict counts as missing (NaN). :meth:`explain_one` gives each field's share of the score."""

    def __init__(self, fields: list[str] | None = None, params: dict[str, Any] | None = None) -> None:
        self.fields = list(fields) if fields is not None else None
        self.params = dict(params or {})
        self._det: OnlineMahalanobis | None = None
        if self.fields is not None:
            self._build(self.fields)

    def _build(self, fields: list[str]) -> OnlineMahalanobis:
        self._det = OnlineMahalanobis(1, len(fields), field_names=fields, **self.params)
        return self._det

    def _vector(self, x: dict[Any, Any], learn: bool) -> tuple[OnlineMahalanobis, np.ndarray] | None:
        det = self._det
        if det is None:
            if not learn or not x:
                # an empty first dict has no fields to fix the vector's order with (and every
                # field would be missing anyway): learn nothing, as UnivariateAdapter does
                return None
            det = self._build(sorted(x))
        vec = np.array([[float(x.get(f, np.nan)) for f in det.field_names]])
        return det, vec

    def learn_one(self, x: dict[Any, Any]) -> None:
        got = self._vector(x, learn=True)
        if got is not None:
            got[0].update(got[1])

    def score_one(self, x: dict[Any, Any]) -> float:
        got = self._vector(x, learn=False)
        if got is None:
            return 0.0
        s = float(got[0].score(got[1]).score[0])
        return s if np.isfinite(s) else 0.0

    def explain_one(self, x: dict[Any, Any]) -> dict[str, float]:
        """Each field's contribution to D^2 for ``x`` (without learning it)."""
        got = self._vector(x, learn=False)
        if got is None:
            return {}
        det, vec = got
        contrib = det.score(vec).contributions[0]
        return {f: float(c) for f, c in zip(det.field_names, contrib)}

    @classmethod
    def _unit_test_params(cls) -> Any:
        yield {"fields": ["a", "b"]}
