"""The river adapters of the univariate detectors: same scores as the detectors, river's
contract (score_one learns nothing, clone gives a fresh model), and river's own tooling."""

from __future__ import annotations

import numpy as np
import pytest
from river import anomaly

from foreshock.detectors.river_adapters import UNIVARIATE, UnivariateAdapter


@pytest.mark.parametrize("name", sorted(UNIVARIATE))
def test_adapter_scores_equal_the_detectors(name: str) -> None:
    params = {"period": 7} if name == "seasonal_diff" else {}
    x = np.random.default_rng(1).normal(10, 1, 300) + np.sin(np.arange(300))
    model = UnivariateAdapter(name, feature="v", params=params)
    direct = UNIVARIATE[name](1, **params)
    for v in x:
        row = {"v": float(v), "other": 0.0}
        s = model.score_one(row)
        assert model.score_one(row) == s                      # scoring learns nothing
        model.learn_one(row)
        want = float(direct.update(np.array([v]))[0])
        assert s == pytest.approx(want if np.isfinite(want) else 0.0, rel=1e-12)


def test_adapter_is_a_river_estimator() -> None:
    model = UnivariateAdapter("holt", params={"alpha": 0.2, "phi": 0.95})
    for v in range(50):
        model.learn_one({"x": float(v)})
    fresh = model.clone()
    assert fresh.detector == "holt" and fresh.params == {"alpha": 0.2, "phi": 0.95}
    assert fresh.state_dict()["s_state"][3, 0] == 0.0        # nothing learned
    restored = UnivariateAdapter("holt", params={"alpha": 0.2, "phi": 0.95})
    restored.load_state_dict(model.state_dict())
    assert restored.score_one({"x": 80.0}) == model.score_one({"x": 80.0})


def test_adapter_validation() -> None:
    with pytest.raises(ValueError, match="unknown detector"):
        UnivariateAdapter("nope")
    model = UnivariateAdapter("ewma_zscore")
    with pytest.raises(ValueError, match="name the one"):
        model.learn_one({"a": 1.0, "b": 2.0})
    with pytest.raises(ValueError, match="missing"):
        UnivariateAdapter("ewma_zscore", feature="c").learn_one({"a": 1.0})
    assert model.score_one({"a": float("nan")}) == 0.0


def test_works_inside_river_filters_and_beats_chance_like_river_hst() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, 3000)
    spikes = rng.choice(np.arange(500, 3000), 15, replace=False)
    x[spikes] += 9.0
    ours = anomaly.QuantileFilter(UnivariateAdapter("ewma_zscore", params={"alpha": 0.02}), q=0.995)
    hst = anomaly.QuantileFilter(anomaly.HalfSpaceTrees(seed=1, limits={"x": (-5.0, 15.0)}), q=0.995)
    hits = {"ours": [], "hst": []}
    for i, v in enumerate(x):
        for key, model in (("ours", ours), ("hst", hst)):
            row = {"x": float(v)}
            flagged = model.classify(model.score_one(row))
            model.learn_one(row)
            if flagged and i >= 500:
                hits[key].append(i)
    precision = len(set(hits["ours"]) & set(spikes)) / max(len(hits["ours"]), 1)
    assert precision > 0.5 and len(set(hits["ours"]) & set(spikes)) >= 10
