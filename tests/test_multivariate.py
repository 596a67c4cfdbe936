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

from foreshock.detectors.multivariate import (LOAD_ABSOLUTE, LOAD_RELATIVE, MAD_TO_STD, MAX_LEARNT_RESIDUAL,
                                              SEED_VALUES, WARMUP_CLIP, OnlineMahalanobis)
from foreshock.detectors.river_adapters import MahalanobisAdapter
from foreshock.health import PipelineHealth


def reference_rows(slot: np.ndarray, x: np.ndarray, entities: int, alpha: float, ridge: float, clip: float,
                   warmup: int, floor: np.ndarray | None = None,
                   learn: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Straight NumPy, row by row (row t a sample of entity slot[t]): mean/covariance per entity,
    solve with np.linalg.solve; ``floor`` the per-field std floor, ``learn`` which rows learn.
    Each field counts its own values: the first three seed its mean and variance (their median
    and MAD), the next are learnt at its own running rate with residuals clipped at WARMUP_CLIP of
    its spread, and it is scored only once it has max(warmup, 3) values; the distance is the
    marginal one of the fields scored. A missing field learns nothing (its covariances with the
    fields that learn fade at their rates)."""
    rows, d = x.shape
    floor = np.zeros(d) if floor is None else floor
    learn = np.ones(rows, bool) if learn is None else learn
    score = np.zeros(rows)
    contrib = np.zeros((rows, d))
    resid = np.zeros((rows, d))
    bound = d + clip * math.sqrt(2 * d)
    scored_from = max(warmup, SEED_VALUES)
    mean = np.zeros((entities, d))
    cov = np.zeros((entities, d, d))
    seen = np.zeros((entities, d), int)
    for t in range(rows):
        e, v = slot[t], x[t]
        present = np.isfinite(v)
        scored = present & (seen[e] >= scored_from)
        r = np.where(present & (seen[e] >= 1), v - mean[e], 0.0)   # a field not seen yet: at its mean
        resid[t] = r
        if not present.any():
            score[t] = np.nan
            continue
        var = np.diag(cov[e]).copy()
        d2 = 0.0
        if scored.any():
            # the marginal distance of the fields scored: the others' rows and columns dropped
            use = np.flatnonzero(scored)
            sub = (1 - ridge) * cov[e][np.ix_(use, use)]
            sub[np.diag_indices(len(use))] = np.maximum(var, floor ** 2)[use] + LOAD_RELATIVE * var[use] + LOAD_ABSOLUTE
            with np.errstate(over="ignore", invalid="ignore"):   # a distance may overflow: inf
                y = np.linalg.solve(sub, r[use])
                contrib[t, use] = r[use] * y
                d2 = float(r[use] @ y)
            d2 = max(d2, 0.0) if not np.isnan(d2) else np.inf
        score[t] = math.sqrt(d2 / d)
        if not learn[t]:
            continue
        w = bound / d2 if d2 > bound else 1.0
        seeding = present & (seen[e] < SEED_VALUES)
        later = present & ~seeding
        rate = np.where(later, np.maximum(alpha, 1 / (seen[e] + 1)), 0.0)   # missing: 0, all kept
        spread = WARMUP_CLIP * np.sqrt(np.maximum(var, floor ** 2))
        warming = later & ~scored & (spread > 0)
        g = np.where(warming, np.clip(r, -spread, spread), r)
        g = np.clip(g, -MAX_LEARNT_RESIDUAL, MAX_LEARNT_RESIDUAL)
        weight = np.where(scored, w, 1.0)
        push = np.where(later, np.sqrt(rate * (1 - rate) * weight) * g, 0.0)
        keep = np.where(seeding, 0.0, np.sqrt(1 - rate))
        new_cov = np.outer(keep, keep) * cov[e] + np.outer(push, push)
        mean[e] = np.where(later, mean[e] + rate * weight * g, mean[e])
        for i in np.flatnonzero(seeding):
            mean[e, i], new_cov[i, i] = seed_reference(seen[e, i], v[i], mean[e, i], cov[e, i, i])
        cov[e] = new_cov
        seen[e] += present
    return score, contrib, resid


def seed_reference(k: int, v: float, held: float, held_var: float) -> tuple[float, float]:
    """A field's mean and variance after its value ``v``, the ``k``-th (0-based) of its first three:
    held as they come (the first as the mean; with the second, the lower of the two as the mean and
    their squared distance as the variance), then the median and the scaled MAD of the three."""
    if k == 0:
        return v, 0.0
    if k == 1:
        return min(v, held), min(abs(v - held), MAX_LEARNT_RESIDUAL) ** 2
    three = np.sort([held, held + math.sqrt(held_var), v])
    mad = min(float(np.median(np.abs(three - three[1]))), MAX_LEARNT_RESIDUAL)
    return float(three[1]), (MAD_TO_STD * mad) ** 2


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


@pytest.mark.kernel
def test_kernel_matches_reference_on_late_fields_wild_readings_and_offsets() -> None:
    rng = np.random.default_rng(8)
    base = rng.normal(size=(300, 2, 1))
    x = np.concatenate([base + 0.3 * rng.normal(size=(300, 2, 1)) for _ in range(4)], axis=2)
    x[:, :, 3] = 5.0 * x[:, :, 3] + 1e6       # a large offset
    x[:40, 0, 2] = np.nan                     # a field that appears late on entity 0 ...
    x[0, 1, 1] = np.nan                       # ... and one missing only on entity 1's first sample
    x[6, 1, 0] = 9.2e18                       # a wild reading in warm-up
    x[150, 0, 1] = 1e200                      # and one whose square overflows
    x[rng.random(x.shape) < 0.03] = np.nan
    floor = np.array([0.0, 0.0, 0.1, 0.0])
    det = OnlineMahalanobis(2, 4, alpha=0.05, ridge=0.05, clip=3.0, warmup=15, min_scale=floor)
    got = det.update_rows(np.tile([0, 1], 300), x.reshape(-1, 4))
    want = reference_rows(np.tile([0, 1], 300), x.reshape(-1, 4), 2, 0.05, 0.05, 3.0, 15, floor=floor)
    np.testing.assert_allclose(got.score, want[0], rtol=1e-7, equal_nan=True)
    np.testing.assert_allclose(got.contributions, want[1], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got.residuals, want[2], rtol=1e-9, atol=1e-9)


def coupled_pair(steps: int = 3000, seed: int = 0) -> np.ndarray:
    """(steps, 1, 2): a temperature around 50 and a power around 600 that follows it."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=steps)
    return np.stack([50 + base + 0.1 * rng.normal(size=steps),
                     600 + 10 * base + rng.normal(size=steps)], axis=1)[:, None, :]


def test_a_field_that_appears_late_is_learnt_from_its_own_values() -> None:
    x = coupled_pair()
    late = x.copy()
    late[:50, 0, 1] = np.nan                  # power absent from the first 50 samples
    det = OnlineMahalanobis(1, 2, alpha=0.01)
    res = det.update(late)
    assert np.all(res.score[20:, 0] < 4), "normal samples of the late field scored as anomalies"
    np.testing.assert_allclose(det.s_mean[0], [50, 600], rtol=0.01)
    np.testing.assert_array_equal(det.s_seen[0], [3000, 2950])
    # its first value is imputed at its mean (no residual): not judged against a mean of 0
    rows = OnlineMahalanobis(1, 2, alpha=0.01).update_rows(np.zeros(3000, np.int64), late[:, 0])
    assert rows.residuals[50, 1] == 0.0 and rows.residuals[51, 1] != 0.0
    # a field missing only from the first sample ends up where it would have been: the same
    # decorrelation (power 4 sigmas of its marginal off its temperature) scores the same
    broken = x.copy()
    broken[600, 0, 1] += 40.0
    first_missing = broken.copy()
    first_missing[0, 0, 1] = np.nan
    clean = OnlineMahalanobis(1, 2, alpha=0.01).update(broken).score[600, 0]
    gap = OnlineMahalanobis(1, 2, alpha=0.01).update(first_missing).score[600, 0]
    assert clean > 15 and gap == pytest.approx(clean, rel=0.02)


def test_a_missing_field_does_not_pin_its_correlated_peer_to_its_mean() -> None:
    x = coupled_pair()
    x[2500, 0, 0] = 50.0 + 2.0                # temperature 2 of its sigmas up ...
    x[2500, 0, 1] = np.nan                    # ... and power, which follows it closely, missing
    det = OnlineMahalanobis(1, 2, alpha=0.01)
    det.update(x[:2500])
    score = det.score(x[2500]).score[0]
    # the distance of the field present alone (about 2 sigmas); taken with power at its mean, the
    # pair read as broken apart (D^2 ~ 4 / (1 - 0.995^2) = 400)
    alone = abs(x[2500, 0, 0] - det.s_mean[0, 0]) / math.sqrt(det.s_cov[0, 0, 0])
    assert 1.5 < alone < 2.5 and score == pytest.approx(alone / math.sqrt(2), rel=1e-6)


@pytest.mark.parametrize("level", [0.0, 50.0])
@pytest.mark.parametrize("at", [0, 1, 2, 5])   # its first values too, before any spread is known
def test_a_wild_reading_in_warm_up_does_not_blind_the_field(at: int, level: float) -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2000, 1, 3)) + level
    x[1000, 0, 1] += 20.0                     # a 20-sigma jump after warm-up
    sentinel = x.copy()
    sentinel[at, 0, 1] = 9223372036854775794.0  # DCGM's "not supported", read as a value in warm-up
    want = OnlineMahalanobis(1, 3, alpha=0.005, warmup=300).update(x).score[1000, 0]
    for min_scale in (0.0, 0.5):
        got = OnlineMahalanobis(1, 3, alpha=0.005, warmup=300, min_scale=min_scale).update(sentinel).score[1000, 0]
        assert want > 8 and got == pytest.approx(want, rel=0.05)


def test_a_field_back_after_a_long_gap_is_judged_by_its_old_spread() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6000, 1, 3)) + np.array([50.0, 300.0, 1.0])
    x[2000:4000, 0, 2] = np.nan               # missing for 2000 samples, then back as it was
    det = OnlineMahalanobis(1, 3, alpha=0.01)
    scores = det.update(x).score[:, 0]
    # learnt as samples at its mean, its variance had shrunk to 2e-9 of itself: ~5000 on return
    assert scores[4000:].max() < 4.5 and np.count_nonzero(scores[4000:] > 3) <= 10
    assert det.s_cov[0, 2, 2] == pytest.approx(1.0, rel=0.2)
    # its covariances with the fields that learnt faded: the matrix stays positive semi-definite
    gappy = rng.normal(size=(3000, 2, 1)) * [1.0, 5.0, 0.2, 3.0] + rng.normal(size=(3000, 2, 4))
    for _ in range(30):
        start = rng.integers(0, 3000)
        gappy[start:start + rng.integers(1, 400), rng.integers(0, 2), rng.integers(0, 4)] = np.nan
    det = OnlineMahalanobis(2, 4, alpha=0.05)
    for chunk in np.array_split(gappy, 30):
        det.update(chunk)
        for cov in det.s_cov:
            scale = np.sqrt(np.diag(cov))
            assert np.linalg.eigvalsh(cov / np.outer(scale, scale)).min() > -1e-9


def test_a_huge_reading_never_makes_the_covariance_non_finite() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1000, 1, 3))
    x[5, 0, 1] = 1e160                        # in warm-up: its square overflows
    det = OnlineMahalanobis(1, 3)
    assert not np.isnan(det.update(x).score).any()
    assert np.isfinite(det.s_cov).all() and np.isfinite(det.s_mean).all()
    assert det.score(np.array([[0.0, 10.0, 0.0]])).score[0] > 4   # the field is not blind
    # at its second value no spread is known to clip it at: learnt clamped, and counted
    health = PipelineHealth()
    x[5, 0, 1] = 0.0
    x[1, 0, 2] = 1e200
    det = OnlineMahalanobis(1, 3, health=health)
    assert not np.isnan(det.update(x).score).any()
    assert np.isfinite(det.s_cov).all() and np.isfinite(det.s_mean).all()
    assert health.problems[("mahalanobis", "residual_too_large_to_learn")] == 1
    # after warm-up, two huge readings of correlated fields: an infinite distance, not NaN (NaN
    # reads as a row with nothing to score)
    pair = coupled_pair(500)
    pair[400, 0] = [1e200, 2e200]
    pair_scores = OnlineMahalanobis(1, 2).update(pair).score[:, 0]
    assert pair_scores[400] == np.inf and np.isfinite(pair_scores[401:]).all()
    # one overflowing beside one missing: the missing one contributes 0 (0 times the overflowed
    # entry of the solve was NaN, and the distance blamed whichever field came first)
    pair = coupled_pair(500) / 10.0
    pair[400] = [1e308, np.nan]               # (1e308 over a variance below 1 overflows)
    contrib = OnlineMahalanobis(1, 2).update(pair).contributions[400, 0]
    np.testing.assert_array_equal(contrib, [np.inf, 0.0])


def test_the_distance_does_not_depend_on_a_fields_offset() -> None:
    x = np.random.default_rng(3).normal(size=(3000, 1, 2))
    x[2500, 0, 1] += 50.0                     # a 50-sigma jump
    scores = []
    for offset in (0.0, 1e6, 1e9):
        shifted = x.copy()
        shifted[:, 0, 1] += offset
        scores.append(OnlineMahalanobis(1, 2).update(shifted).score[:, 0])
    assert scores[0][2500] > 30
    for s in scores[1:]:
        np.testing.assert_allclose(s[30:], scores[0][30:], rtol=1e-4)


def test_a_checkpoint_without_field_counts_loads_and_warms_every_field_afresh() -> None:
    x = np.random.default_rng(9).normal(size=(400, 2, 3)) + 50.0
    x[:150, 1, 2] = np.nan                    # entity 1's field 2 not seen before the checkpoint
    a = OnlineMahalanobis(2, 3)
    a.update(x[:100])
    old = {k: v for k, v in a.state_dict().items() if k != "s_seen"}
    # saved before fields were counted, a field that appeared late had its mean started at 0:
    # still far from its values at the checkpoint (it cannot be told from one that is there)
    old["s_mean"][0, 1] = 0.5
    b = OnlineMahalanobis(2, 3)
    b.load_state_dict(old)
    np.testing.assert_array_equal(b.s_seen, np.zeros((2, 3)))
    scores = b.update(x[100:]).score
    np.testing.assert_array_equal(scores, OnlineMahalanobis(2, 3).update(x[100:]).score)
    assert np.nanmax(scores) < 4
    with pytest.raises(ValueError, match="keys"):
        b.load_state_dict({k: v for k, v in old.items() if k != "s_count"})


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
    assert a.state_nbytes() == (3 * 5 + 3 * 25 + 3 + 3 * 5) * 8
    with pytest.raises(ValueError, match="shape"):
        b.load_state_dict({"s_mean": np.zeros((2, 5)), "s_cov": np.zeros((3, 5, 5)), "s_count": np.zeros(3),
                           "s_seen": np.zeros((3, 5))})


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
