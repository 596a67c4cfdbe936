"""The river adapters of the univariate detectors and the combiner: same scores as the detectors,
river's contract (score_one learns nothing, clone gives a fresh model), river's own check suite
and tooling."""

from __future__ import annotations

import numpy as np
import pytest
from river import anomaly

from foreshock.detectors.combiner import Combiner
from foreshock.detectors.ewma_zscore import EwmaZScore
from foreshock.detectors.holt import Holt
from foreshock.detectors.range_novelty import RangeNovelty
from foreshock.detectors.river_adapters import UNIVARIATE, CombinerAdapter, MahalanobisAdapter, UnivariateAdapter
from foreshock.health import PipelineHealth


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
    assert model.score_one({"a": float("nan")}) == 0.0


def test_an_absent_feature_is_a_missing_sample_counted_not_an_error() -> None:
    health = PipelineHealth()
    model = UnivariateAdapter("ewma_zscore", feature="c", params={"health": health})
    for v in range(40):
        model.learn_one({"c": float(v % 3), "other": 1.0})
    before = model.state_dict()
    assert model.score_one({"a": 1.0}) == 0.0
    model.learn_one({"a": 1.0})
    model.learn_one({})
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[key])      # nothing learned from the gaps
    assert health.problems[("ewma_zscore", "non_finite_input")] == 3
    assert UnivariateAdapter("ewma_zscore").score_one({}) == 0.0


def test_mahalanobis_adapter_learns_nothing_from_an_empty_first_dict() -> None:
    """River streams drop features event to event: an empty first dict crashed learn_one (no
    fields to build the detector from). It is learnt as nothing, and the fields come from the
    first dict that has some."""
    model = MahalanobisAdapter()
    model.learn_one({})
    assert model.score_one({}) == 0.0 and model.explain_one({"a": 1.0}) == {}
    for i in range(100):
        model.learn_one({"a": 1.0 + 0.01 * (i % 7), "b": 5.0 + 0.01 * (i % 5)})
    assert model._det is not None and model._det.field_names == ["a", "b"]
    assert model.score_one({"a": 1.03, "b": 50.0}) > model.score_one({"a": 1.03, "b": 5.02})


def labelled_stream(n: int) -> list[tuple[dict[str, float], bool]]:
    """Five correlated features; ~5 % of events push 'a' up and 'c' down by 8 (label True)."""
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        z = rng.normal()
        x = {f: float(z + 0.3 * rng.normal()) for f in "abcde"}
        y = bool(i > 50 and rng.random() < 0.05)
        if y:
            x["a"] += 8.0
            x["c"] -= 8.0
        out.append((x, y))
    return out


ADAPTERS = [UnivariateAdapter(name, feature="a", params={"period": 7} if name == "seasonal_diff" else None)
            for name in sorted(UNIVARIATE)] + [MahalanobisAdapter(), MahalanobisAdapter(fields=list("abcde")),
                                               CombinerAdapter(feature="a", hold=5.0)]


@pytest.mark.parametrize("model", ADAPTERS, ids=lambda m: m.detector if isinstance(m, UnivariateAdapter) else
                         "combiner" if isinstance(m, CombinerAdapter) else f"mahalanobis-fields-{m.fields}")
def test_adapters_pass_rivers_own_estimator_checks(model, monkeypatch) -> None:
    """river's check suite (river.checks.yield_checks: clone, pickling, purity, emerging and
    disappearing features, ROC AUC >= 0.5, bounded memory...) on a local labelled stream: the
    suite's own anomaly data set (CreditCard) is a download, which tests here cannot make."""
    import river.checks

    monkeypatch.setattr(river.checks, "_yield_datasets", lambda model, scale=1: iter([labelled_stream(100 * scale)]))
    ran = []
    for check in river.checks.yield_checks(model):
        check(model.clone())
        ran.append(check.__name__)
    assert {"check_disappearing_features", "check_emerging_features", "check_roc_auc",
            "check_predict_one_pure", "check_bounded_memory_growth"} <= set(ran)


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


def test_combiner_adapter_scores_equal_the_combiner_event_by_event() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(0, 1, 600)
    x[[300, 302, 450]] += 10.0                                  # 302 falls inside the 20-event hold
    members = [("range_novelty", 0.05, {"warmup": 20}), ("ewma_zscore", 8.0), ("holt", 6.0, {"alpha": 0.2})]
    model = CombinerAdapter(members, feature="v", hold=20.0, escalate=2.0)
    scores = []
    for v in x:
        row = {"v": float(v)}
        s = model.score_one(row)
        assert model.score_one(row) == s                      # scoring learns nothing, holds nothing
        model.learn_one(row)
        scores.append(s)
    direct = Combiner([(RangeNovelty(1, warmup=20), 0.05), (EwmaZScore(1), 8.0), (Holt(1, alpha=0.2), 6.0)],
                      hold=20.0, escalate=2.0).update(x[:, None])[:, 0]
    np.testing.assert_allclose(scores, direct, rtol=1e-12)
    assert scores[300] > 0.5 and scores[302] == 0.0 and scores[450] > 0.5
    with pytest.raises(ValueError, match="combiner member"):
        CombinerAdapter([("nope", 1.0)])
    restored = CombinerAdapter(members, feature="v", hold=20.0, escalate=2.0)
    restored.load_state_dict(model.state_dict())
    assert restored.score_one({"v": 9.0}) == model.score_one({"v": 9.0})
