"""Online robust Mahalanobis: the kernel against a NumPy reference (random input with NaN, inf,
constant fields, empty batches), attribution, robustness, state round-trip, pure scoring, and
its river adapter."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from foreshock.detectors.multivariate import OnlineMahalanobis
from foreshock.detectors.river_adapters import MahalanobisAdapter
from foreshock.health import PipelineHealth


def reference_rows(slot: np.ndarray, x: np.ndarray, entities: int, alpha: float, ridge: float, clip: float,
                   warmup: int, floor: np.ndarray | None = None,
                   learn: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Straight NumPy, row by row (row t a sample of entity slot[t]): mean/covariance per entity,
    solve with np.linalg.solve; ``floor`` the per-field std floor, ``learn`` which rows learn."""
    rows, d = x.shape
    floor = np.zeros(d) if floor is None else floor
    learn = np.ones(rows, bool) if learn is None else learn
    score = np.zeros(rows)
    contrib = np.zeros((rows, d))
    resid = np.zeros((rows, d))
    bound = d + clip * math.sqrt(2 * d)
    mean = np.zeros((entities, d))
    cov = np.zeros((entities, d, d))
    count = np.zeros(entities, int)
    for t in range(rows):
        e, v, n = slot[t], x[t], count[slot[t]]
        present = np.isfinite(v)
        r = np.where(present, v - mean[e], 0.0) if n >= 1 else np.zeros(d)
        resid[t] = r
        if not present.any():
            score[t] = np.nan
            continue
        d2 = 0.0
        if n >= 2:
            reg = (1 - ridge) * cov[e] + ridge * np.diag(np.diag(cov[e]))
            reg[np.diag_indices(d)] = np.maximum(np.diag(cov[e]), floor ** 2) + 1e-9 * (1 + mean[e] ** 2)
            y = np.linalg.solve(reg, r)
            contrib[t] = r * y
            d2 = max(float(r @ y), 0.0)
        if n < warmup:
            contrib[t] = 0.0
            score[t] = 0.0
        else:
            score[t] = math.sqrt(d2 / d)
        if not learn[t]:
            continue
        if n == 0:
            mean[e] = np.where(present, v, 0.0)
            count[e] = 1
            continue
        a = max(alpha, 1 / (n + 1))
        w = bound / d2 if (n >= warmup and d2 > bound) else 1.0
        cov[e] = (1 - a) * cov[e] + a * (1 - a) * w * np.outer(r, r)     # r = 0 where missing
        mean[e] = mean[e] + a * w * r
        count[e] += 1
    return score, contrib, resid


def reference(x: np.ndarray, alpha: float, ridge: float, clip: float, warmup: int) -> tuple[np.ndarray, np.ndarray]:
    """The (steps, entities, fields) batch: step after step, each entity's row in turn."""
    steps, ents, d = x.shape
    slot = np.tile(np.arange(ents), steps)
    score, contrib, _ = reference_rows(slot, x.reshape(-1, d), ents, alpha, ridge, clip, warmup)
    return score.reshape(steps, ents), contrib.reshape(steps, ents, d)


values = st.one_of(st.floats(-20, 20, allow_nan=False, width=32), st.sampled_from([np.nan, np.inf, 3.0]))


@pytest.mark.kernel
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=st.tuples(st.integers(0, 30), st.integers(1, 2), st.integers(1, 4)).flatmap(
    lambda shape: arrays(np.float64, shape, elements=values)))
def test_kernel_matches_numpy_reference_on_random_input(x: np.ndarray) -> None:
    det = OnlineMahalanobis(x.shape[1], x.shape[2], alpha=0.2, ridge=0.1, clip=2.0, warmup=3)
    got = det.update(x)
    want_score, want_contrib = reference(x, 0.2, 0.1, 2.0, 3)
    # tolerance: Cholesky (kernel) vs LU (reference) on sometimes ill-conditioned covariances
    np.testing.assert_allclose(got.score, want_score, rtol=1e-5, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(got.contributions, want_contrib, rtol=1e-5, atol=1e-6)


@pytest.mark.kernel
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_rows_with_floors_and_learn_mask_match_numpy_reference(data: st.DataObject) -> None:
    rows, ents, d = data.draw(st.integers(0, 40)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4))
    x = data.draw(arrays(np.float64, (rows, d), elements=values))
    slot = data.draw(arrays(np.int64, rows, elements=st.integers(0, ents - 1)))
    learn = data.draw(arrays(np.bool_, rows, elements=st.booleans()))
    floor = data.draw(arrays(np.float64, d, elements=st.sampled_from([0.0, 0.5, 3.0])))
    det = OnlineMahalanobis(ents, d, alpha=0.2, ridge=0.1, clip=2.0, warmup=3, min_scale=floor)
    got = det.update_rows(slot, x, learn=learn)
    want = reference_rows(slot, x, ents, 0.2, 0.1, 2.0, 3, floor=floor, learn=learn)
    np.testing.assert_allclose(got.score, want[0], rtol=1e-5, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(got.contributions, want[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.residuals, want[2], rtol=1e-9, atol=1e-9)


def test_rows_api_equals_the_batch_and_checks_entities() -> None:
    x = np.random.default_rng(6).normal(size=(60, 3, 4))
    batch = OnlineMahalanobis(3, 4).update(x)
    rows = OnlineMahalanobis(3, 4).update_rows(np.tile(np.arange(3), 60), x.reshape(-1, 4))
    np.testing.assert_array_equal(rows.score.reshape(60, 3), batch.score)
    np.testing.assert_array_equal(rows.contributions.reshape(60, 3, 4), batch.contributions)
    det = OnlineMahalanobis(3, 4)
    with pytest.raises(ValueError, match="entity index"):
        det.update_rows([0, 3], np.zeros((2, 4)))
    with pytest.raises(ValueError, match="expected"):
        det.update_rows([0], np.zeros((2, 4)))
    with pytest.raises(ValueError, match="min_scale"):
        OnlineMahalanobis(3, 4, min_scale=[0.0, -1.0, 0.0, 0.0])
    # a floor keeps a field that sat still from making its first small move an unbounded distance
    still = np.ones((200, 1, 2))
    still[:, 0, 0] = np.random.default_rng(7).normal(size=200)
    still[199, 0, 1] = 1.01
    bare = OnlineMahalanobis(1, 2).update(still).score[199, 0]
    floored = OnlineMahalanobis(1, 2, min_scale=[0.0, 0.05]).update(still).score[199, 0]
    assert bare > 100 and floored < 3  # field 0 is plain noise; field 1 moved 0.2 of its floor


@pytest.mark.kernel
def test_kernel_matches_reference_on_correlated_data_with_gaps() -> None:
    rng = np.random.default_rng(1)
    base = rng.normal(size=(400, 3, 1))
    x = np.concatenate([base + 0.2 * rng.normal(size=(400, 3, 1)) for _ in range(5)], axis=2)
    x[:, 2, 4] = 7.0                          # a constant field on entity 2
    x[rng.random(x.shape) < 0.02] = np.nan
    x[300, 1, :] = np.nan                     # a step with nothing
    det = OnlineMahalanobis(3, 5, alpha=0.02, ridge=0.05, clip=3.0, warmup=20)
    got = det.update(x)
    want_score, want_contrib = reference(x, 0.02, 0.05, 3.0, 20)
    np.testing.assert_allclose(got.score, want_score, rtol=1e-7, equal_nan=True)
    np.testing.assert_allclose(got.contributions, want_contrib, rtol=1e-6, atol=1e-8)
    assert np.isnan(got.score[300, 1])


def test_contributions_sum_to_d2_and_name_the_field_that_broke_away() -> None:
    rng = np.random.default_rng(2)
    base = rng.normal(size=(2000, 1, 1))
    x = np.concatenate([base + 0.1 * rng.normal(size=(2000, 1, 1)) for _ in range(6)], axis=2)
    x[1900, 0, 4] -= 1.0                      # 10 sigmas of its own noise, ~1 of its marginal
    det = OnlineMahalanobis(1, 6, field_names=[f"m{i}" for i in range(6)])
    res = det.update(x)
    c = res.contributions[1900, 0]
    assert c.sum() == pytest.approx(res.score[1900, 0] ** 2 * 6)
    assert np.argmax(c) == 4 and c[4] / c.sum() > 0.5
    assert det.top_fields(res.contributions[1900], k=1)[0][0][0] == "m4"
    # the per-field marginal view would not see it: field 4 stays within its usual range
    assert abs(x[1900, 0, 4] - x[:1900, 0, 4].mean()) < 3 * x[:1900, 0, 4].std()
    assert res.score[1900, 0] > 4 * np.median(res.score[500:1900, 0])


def test_an_anomaly_does_not_teach_the_model() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1500, 1, 4))
    x[1000:1010, 0, :] += 30.0                # a burst
    robust = OnlineMahalanobis(1, 4, alpha=0.02, clip=3.0).update(x).score[1010:1100, 0]
    naive = OnlineMahalanobis(1, 4, alpha=0.02, clip=1e9).update(x).score[1010:1100, 0]
    # after the burst, the robust model still reads normal data as normal (score ~1)
    assert np.median(robust) < 1.5 and np.median(naive) < np.median(robust)


def test_state_round_trip_purity_and_determinism() -> None:
    x = np.random.default_rng(4).normal(size=(200, 3, 5))
    a = OnlineMahalanobis(3, 5)
    a.update(x[:120])
    b = OnlineMahalanobis(3, 5)
    b.load_state_dict(a.state_dict())
    before = a.state_dict()
    pure = a.score(x[120:])
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    ra, rb = a.update(x[120:]), b.update(x[120:])
    np.testing.assert_array_equal(ra.score, rb.score)
    np.testing.assert_array_equal(ra.contributions, rb.contributions)
    np.testing.assert_array_equal(pure.score[0], ra.score[0])
    # streaming one step at a time equals the batch
    c = OnlineMahalanobis(3, 5)
    stream = np.array([c.update(row).score for row in x])
    np.testing.assert_array_equal(stream, OnlineMahalanobis(3, 5).update(x).score)
    assert a.state_nbytes() == (3 * 5 + 3 * 25 + 3) * 8
    with pytest.raises(ValueError, match="shape"):
        b.load_state_dict({"s_mean": np.zeros((2, 5)), "s_cov": np.zeros((3, 5, 5)), "s_count": np.zeros(3)})


def test_empty_batches_bad_shapes_bad_params_and_health() -> None:
    health = PipelineHealth()
    det = OnlineMahalanobis(2, 3, health=health)
    res = det.update(np.empty((0, 2, 3)))
    assert res.score.shape == (0, 2) and res.contributions.shape == (0, 2, 3)
    det.update(np.array([[1.0, np.nan, 2.0], [np.inf, 1.0, 1.0]]))
    assert health.problems[("mahalanobis", "non_finite_input")] == 2
    with pytest.raises(ValueError, match="expected shape"):
        det.update(np.zeros((2, 4)))
    for kwargs, match in (({"alpha": 0.0}, "alpha"), ({"ridge": 1.0}, "ridge"), ({"clip": -1.0}, "clip"),
                          ({"warmup": -2}, "warmup"), ({"field_names": ["a"]}, "names")):
        with pytest.raises(ValueError, match=match):
            OnlineMahalanobis(2, 3, **kwargs)


def test_river_adapter_learns_dicts_and_explains() -> None:
    rng = np.random.default_rng(5)
    model = MahalanobisAdapter()
    assert model.score_one({"a": 1.0}) == 0.0 and model.explain_one({"a": 1.0}) == {}
    direct = OnlineMahalanobis(1, 3, field_names=["cpu", "power", "temp"])
    for _ in range(500):
        z = rng.normal()
        row = {"temp": z + 0.1 * rng.normal(), "power": z + 0.1 * rng.normal(), "cpu": rng.normal()}
        model.learn_one(row)
        direct.update(np.array([[row["cpu"], row["power"], row["temp"]]]))
    odd = {"temp": 1.0, "power": -1.0, "cpu": 0.0}
    want = direct.score(np.array([[0.0, -1.0, 1.0]]))
    assert model.score_one(odd) == pytest.approx(float(want.score[0]))
    explained = model.explain_one(odd)
    assert set(explained) == {"cpu", "power", "temp"} and explained["cpu"] < explained["temp"]
    assert model.score_one({"temp": 1.0, "power": 1.0}) < model.score_one(odd)   # cpu missing: imputed
    fresh = model.clone()
    assert fresh.score_one(odd) == 0.0
