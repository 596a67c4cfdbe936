"""Generic univariate detectors: every kernel against a naive pure-Python reference (random input
with NaN, inf, constants, empty batches), streaming == batch, state round-trip, pure scoring,
input validation, and the detectors' documented behaviour (river equivalence for Page-Hinkley,
Holt's prediction intervals)."""

from __future__ import annotations

import doctest
import importlib
import math
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from foreshock.detectors.combiner import Combiner
from foreshock.detectors.cusum import Cusum
from foreshock.detectors.ewma_zscore import EwmaZScore
from foreshock.detectors.holt import Holt
from foreshock.detectors.page_hinkley import PageHinkley
from foreshock.detectors.range_novelty import RangeNovelty
from foreshock.detectors.seasonal import SeasonalDiff
from foreshock.detectors.univariate import UnivariateDetector
from foreshock.health import PipelineHealth

NAN, INF = float("nan"), float("inf")
SQ = math.sqrt(math.pi / 2)


def floor(m: float) -> float:
    return 1e-12 * max(1.0, abs(m))


def finite(v: float) -> bool:
    return not (math.isnan(v) or math.isinf(v))


def usable(v: float) -> bool:
    """An input a detector learns: finite and within univariate.MAX_MAGNITUDE (1e150)."""
    return abs(v) <= 1e150


# --- naive references: one series at a time, plain floats ----------------------------------

def ref_ewma(col, alpha, alpha_scale, clip, warmup, with_cusum=None):
    out, m, d, n = [], 0.0, 0.0, 0
    up = down = 0.0
    for v in col:
        if not usable(v):
            out.append(NAN)
            continue
        ready = n >= 1 and n >= warmup
        if with_cusum is None:
            out.append(abs(v - m) / max(SQ * d, floor(m)) if ready else 0.0)
        else:
            drift, reset = with_cusum
            if ready:
                z = (v - m) / max(SQ * d, floor(m))
                up, down = max(0.0, up + z - drift), max(0.0, down - z - drift)
            out.append(max(up, down))
            if max(up, down) > reset:
                up = down = 0.0
        if n == 0:
            m, d = v, 0.0
        else:
            r = v - m
            if clip > 0 and n >= warmup and SQ * d > 0:
                r = min(max(r, -clip * SQ * d), clip * SQ * d)
            m = m + max(alpha, 1 / (n + 1)) * r
            d = d + max(alpha_scale, 1 / n) * (abs(v - m) - d)
        n += 1
    return out


def ref_page_hinkley(col, delta, alpha, min_instances, threshold):
    out = []
    fresh = lambda: [0.0, 0, 0.0, 0.0, INF, -1.0]  # noqa: E731
    mean, n, inc, dec, min_inc, max_dec = fresh()
    for v in col:
        if not usable(v):
            out.append(NAN)
            continue
        n += 1
        mean += (v - mean) / n
        inc = alpha * inc + (v - mean) - delta
        dec = alpha * dec + (v - mean) + delta
        min_inc, max_dec = min(min_inc, inc), max(max_dec, dec)
        score = max(inc - min_inc, max_dec - dec) if n >= min_instances else 0.0
        out.append(score)
        if score > threshold:
            mean, n, inc, dec, min_inc, max_dec = fresh()
    return out


def ref_holt(col, alpha, beta, phi, gamma, period, alpha_scale, clip, warmup):
    out = []
    level = trend = d = 0.0
    n = 0
    season = [0.0] * max(period, 1)
    first = [NAN] * max(period, 1)
    n_init = max(period, 1)
    for k, v in enumerate(col):
        phase = k % period if period else 0
        if not usable(v):
            out.append(NAN)
            continue
        if n < n_init:
            out.append(0.0)
            if period:
                first[phase] = v
            else:
                level = v
            n += 1
            if n == n_init and period:
                vals = [x for x in first if usable(x)]
                level = sum(vals) / max(len(vals), 1)
                season = [x - level if usable(x) else 0.0 for x in first]
                trend, d = 0.0, 0.0
            continue
        s = season[phase] if period else 0.0
        e = v - (level + phi * trend + s)
        sigma = SQ * d
        out.append(0.0 if (n < n_init + 1 or n < warmup) else abs(e) / max(sigma, floor(level)))
        d += max(alpha_scale, 1 / (n - n_init + 1)) * (abs(e) - d)
        if clip > 0 and n >= warmup and sigma > 0:
            e = min(max(e, -clip * sigma), clip * sigma)
        level, trend = level + phi * trend + alpha * e, phi * trend + alpha * beta * e
        if period:
            season[phase] = s + gamma * e
        n += 1
    return out


def ref_range(col, warmup, forget):
    out, lo, hi, n = [], 0.0, 0.0, 0
    for v in col:
        if not usable(v):
            out.append(NAN)
            continue
        if n == 0:
            lo = hi = v
            out.append(0.0)
        else:
            span = max(hi - lo, floor(0.5 * (hi + lo)))
            out.append(max(v - hi, lo - v, 0.0) / span if n >= warmup else 0.0)
        shrink = forget * (hi - lo)
        lo, hi = min(lo + shrink, v), max(hi - shrink, v)
        n += 1
    return out


def ref_seasonal(col, period, smooth, alpha_scale, warmup, min_gain, level_alpha):
    out = []
    ring = [NAN] * period
    d = m = 0.0
    n = 0
    lm, ld, ln = 0.0, 0.0, 0
    for k, v in enumerate(col):
        past = ring[k % period]
        ring[k % period] = v
        if not usable(v):
            out.append(NAN)
            continue
        # the level baseline: the EWMA z-score's update with warmup 30, clip 4
        if ln == 0:
            lm, ld = v, 0.0
        else:
            r = v - lm
            if ln >= 30 and SQ * ld > 0:
                r = min(max(r, -4 * SQ * ld), 4 * SQ * ld)
            lm = lm + max(level_alpha, 1 / (ln + 1)) * r
            ld = ld + max(level_alpha, 1 / ln) * (abs(v - lm) - ld)
        ln += 1
        if k < period or not usable(past):
            out.append(0.0)
            continue
        r = v - past
        if n >= 1 and n >= warmup:
            z = r / max(SQ * d, floor(past))
            m = m + (z - m) / smooth
            out.append(abs(m) * math.sqrt(2 * smooth - 1) if ld >= min_gain * d else 0.0)
        else:
            out.append(0.0)
        d += max(alpha_scale, 1 / (n + 1)) * (abs(r) - d)
        n += 1
    return out


# factory(n_series) and the reference for one column, per detector
CASES: dict[str, tuple[Callable[[int], UnivariateDetector], Callable[[list[float]], list[float]]]] = {
    "ewma_zscore": (lambda n: EwmaZScore(n, alpha=0.1, alpha_scale=0.2, clip=3.0, warmup=3),
                    lambda c: ref_ewma(c, 0.1, 0.2, 3.0, 3)),
    "cusum": (lambda n: Cusum(n, alpha=0.1, clip=3.0, warmup=3, drift=0.5, reset=6.0),
              lambda c: ref_ewma(c, 0.1, 0.1, 3.0, 3, with_cusum=(0.5, 6.0))),
    "page_hinkley": (lambda n: PageHinkley(n, min_instances=3, delta=0.01, alpha=0.99, threshold=20.0),
                     lambda c: ref_page_hinkley(c, 0.01, 0.99, 3, 20.0)),
    "holt": (lambda n: Holt(n, alpha=0.3, beta=0.2, phi=0.9, warmup=3, alpha_scale=0.1, clip=3.0),
             lambda c: ref_holt(c, 0.3, 0.2, 0.9, 0.1, 0, 0.1, 3.0, 3)),
    "holt_seasonal": (lambda n: Holt(n, alpha=0.3, beta=0.2, phi=0.9, period=4, gamma=0.3, warmup=6,
                                     alpha_scale=0.1, clip=3.0),
                      lambda c: ref_holt(c, 0.3, 0.2, 0.9, 0.3, 4, 0.1, 3.0, 6)),
    "range_novelty": (lambda n: RangeNovelty(n, warmup=3, forget=0.01), lambda c: ref_range(c, 3, 0.01)),
    "seasonal_diff": (lambda n: SeasonalDiff(n, period=3, smooth=2.0, alpha_scale=0.2, warmup=2,
                                             min_gain=0.5, level_alpha=0.1),
                      lambda c: ref_seasonal(c, 3, 2.0, 0.2, 2, 0.5, 0.1)),
}

values = st.one_of(st.floats(-50, 50, allow_nan=False, width=32),
                   st.sampled_from([NAN, INF, -INF, 1.7e308, -1e151, 7.0, 7.0, 0.0]))
batches = st.integers(1, 3).flatmap(lambda n: arrays(np.float64, st.tuples(st.integers(0, 40), st.just(n)),
                                                     elements=values))


def check_against_reference(name: str, x: np.ndarray) -> None:
    make, ref = CASES[name]
    got = make(x.shape[1]).update(x)
    want = np.array([ref(list(x[:, j])) for j in range(x.shape[1])]).T.reshape(x.shape)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9, equal_nan=True)


@pytest.mark.kernel
@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=batches)
def test_kernel_matches_reference_on_random_input(name: str, x: np.ndarray) -> None:
    check_against_reference(name, x)


@pytest.mark.kernel
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_matches_reference_on_long_noisy_series(name: str) -> None:
    rng = np.random.default_rng(hash(name) % 2**32)
    x = rng.normal(10, 2, size=(300, 2)) + np.sin(np.arange(300) / 3)[:, None]
    x[rng.random(x.shape) < 0.03] = np.nan
    x[150:160, 1] += 25                      # a shift
    x[200, 0] = np.inf
    check_against_reference(name, x)


@pytest.mark.kernel
@pytest.mark.parametrize("name", sorted(CASES))
def test_constant_then_moving_series_scores_finite_and_empty_batches_work(name: str) -> None:
    make, ref = CASES[name]
    x = np.r_[np.full(30, 3.0), [3.5]][:, None]
    got = make(1).update(x)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got[:, 0], ref(list(x[:, 0])), rtol=1e-7)
    det = make(2)
    assert det.update(np.empty((0, 2))).shape == (0, 2)
    assert det.score(np.empty((0, 2))).shape == (0, 2)


@pytest.mark.kernel
@pytest.mark.parametrize("name", sorted(CASES))
def test_streaming_point_by_point_equals_batch(name: str) -> None:
    make, _ = CASES[name]
    x = np.random.default_rng(3).normal(size=(120, 3))
    x[::17, 1] = np.nan
    batch = make(3).update(x)
    det = make(3)
    stream = np.array([det.update(row) for row in x])
    chunked_det = make(3)
    chunked = np.vstack([chunked_det.update(x[i:i + 25]) for i in range(0, 120, 25)])
    np.testing.assert_array_equal(stream, batch)
    np.testing.assert_array_equal(chunked, batch)


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_round_trip_gives_identical_future_scores(name: str) -> None:
    make, _ = CASES[name]
    x = np.random.default_rng(4).normal(size=(200, 2))
    a = make(2)
    a.update(x[:90])
    b = make(2)
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a.update(x[90:]), b.update(x[90:]))
    with pytest.raises(ValueError):
        b.load_state_dict({})
    bad = {k: np.zeros(v.shape + (1,)) for k, v in a.state_dict().items()}
    with pytest.raises(ValueError, match="shape"):
        b.load_state_dict(bad)


@pytest.mark.parametrize("name", sorted(CASES))
def test_scoring_is_pure_and_equals_the_next_update(name: str) -> None:
    make, _ = CASES[name]
    x = np.random.default_rng(5).normal(size=(100, 2))
    det = make(2)
    det.update(x[:80])
    before = det.state_dict()
    scored = det.score(x[80:])
    for k, v in det.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    # update scores a row before learning it: the first row's score is the pure score
    np.testing.assert_array_equal(det.update(x[80]), scored[0])


@pytest.mark.parametrize("name", sorted(CASES))
def test_determinism_and_bounded_state(name: str) -> None:
    make, _ = CASES[name]
    x = np.random.default_rng(6).normal(size=(500, 4))
    a, b = make(4), make(4)
    np.testing.assert_array_equal(a.update(x), b.update(x))
    size = a.state_nbytes()
    a.update(x)
    assert a.state_nbytes() == size          # memory does not grow with the stream


@pytest.mark.parametrize("name", ["ewma_zscore", "holt", "range_novelty", "cusum"])
def test_better_than_chance_on_a_labelled_stream(name: str) -> None:
    make, _ = CASES[name]
    rng = np.random.default_rng(7)
    x = rng.normal(0, 1, size=(3000, 1))
    anomalies = rng.choice(np.arange(500, 3000), size=20, replace=False)
    x[anomalies, 0] += rng.choice([-1, 1], size=20) * 8
    s = make(1).update(x)[:, 0]
    labels = np.zeros(3000, bool)
    labels[anomalies] = True
    top = np.argsort(-np.nan_to_num(s[500:]))[:20] + 500
    assert labels[top].mean() > 0.5          # chance is 20/2500


def test_non_finite_input_is_counted_and_scores_nan() -> None:
    health = PipelineHealth()
    det = EwmaZScore(2, health=health)
    out = det.update(np.array([[1.0, np.nan], [np.inf, 2.0]]))
    assert np.isnan(out[0, 1]) and np.isnan(out[1, 0])
    assert health.problems[("ewma_zscore", "non_finite_input")] == 2


@pytest.mark.kernel
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_beyond_the_magnitude_bound_are_skipped_like_non_finite_ones(name: str) -> None:
    """A finite value near the float64 limit (a corrupted double, a DBL_MAX sentinel) overflowed
    the differences and left the state inf or NaN for good (every later score NaN, or stuck at
    1.7e308). It is now skipped, scored NaN and counted exactly as a NaN would be."""
    make, _ = CASES[name]
    rng = np.random.default_rng(0)
    x = rng.normal(10, 1, size=(400, 1))
    x[100:103, 0] = [-1.7e308, 1.7e308, -1e151]
    x[-1, 0] = 40.0                         # a 30 sigma spike at the end
    with_nan = x.copy()
    with_nan[100:103, 0] = np.nan
    det = make(1)
    det.health = PipelineHealth()
    got = det.update(x)
    np.testing.assert_array_equal(got, make(1).update(with_nan))
    assert np.all(np.isnan(got[100:103])) and not np.isnan(got[103:]).any()
    assert det.health.problems[(det.name, "non_finite_input")] == 3
    for arr in det.state_dict().values():
        assert np.all(np.abs(arr[np.isfinite(arr)]) < 1e100)


def test_values_just_inside_the_magnitude_bound_are_learnt() -> None:
    det = EwmaZScore(1, warmup=0)
    det.update(np.array([1e150]))
    assert det.mean[0] == 1e150


@pytest.mark.parametrize("make, match", [
    (lambda: EwmaZScore(0), "n_series"),
    (lambda: EwmaZScore(2, alpha=0.0), "alpha"),
    (lambda: EwmaZScore(2, alpha=1.5), "alpha"),
    (lambda: EwmaZScore(2, warmup=-1), "warmup"),
    (lambda: Cusum(2, drift=-1.0), "drift"),
    (lambda: Cusum(2, reset=0.0), "reset"),
    (lambda: PageHinkley(2, delta=-1.0), "delta"),
    (lambda: Holt(2, phi=0.0), "phi"),
    (lambda: Holt(2, beta=2.0), "beta"),
    (lambda: Holt(2, period=-3), "period"),
    (lambda: RangeNovelty(2, forget=0.7), "forget"),
    (lambda: SeasonalDiff(2, period=0), "period"),
    (lambda: SeasonalDiff(2, period=5, smooth=0.5), "smooth"),
])
def test_bad_parameters_are_clear_value_errors(make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_shapes_are_clear_value_errors() -> None:
    det = EwmaZScore(3)
    with pytest.raises(ValueError, match="expected 3 values"):
        det.update(np.zeros(2))
    with pytest.raises(ValueError, match=r"expected shape \(T, 3\)"):
        det.update(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="expected shape"):
        det.score(np.zeros((2, 3, 1)))


# --- documented behaviour -----------------------------------------------------------------

def test_page_hinkley_detects_exactly_where_river_does() -> None:
    from river import drift

    rng = np.random.default_rng(8)
    x = np.r_[rng.normal(0, 1, 800), rng.normal(3, 1, 800), rng.normal(-1, 2, 800)]
    river_ph = drift.PageHinkley(min_instances=30, delta=0.005, threshold=50.0, alpha=1 - 0.0001)
    river_hits = []
    for i, v in enumerate(x):
        river_ph.update(v)
        if river_ph.drift_detected:
            river_hits.append(i)
    ours = PageHinkley(1, threshold=50.0).update(x[:, None])[:, 0]
    assert river_hits and list(np.flatnonzero(ours > 50.0)) == river_hits


def test_holt_interval_variance_by_hand() -> None:
    alpha, beta, phi = 0.3, 0.2, 0.9
    det = Holt(1, alpha=alpha, beta=beta, phi=phi, warmup=0)
    det.update(np.linspace(0, 10, 50)[:, None] + np.random.default_rng(9).normal(0, 1, (50, 1)))
    sigma = SQ * det.s_state[2, 0]
    level, trend = det.s_state[0, 0], det.s_state[1, 0]
    point, lower, upper = det.forecast(horizon=3, coverage=0.95)
    # h = 3: point l + (phi + phi^2) b; variance sigma^2 (1 + c1^2 + c2^2), c_j = alpha (1 + beta phi_j)
    c1 = alpha * (1 + beta * phi)
    c2 = alpha * (1 + beta * (phi + phi ** 2))
    half = 1.959963984540054 * sigma * math.sqrt(1 + c1 ** 2 + c2 ** 2)
    assert point[0] == pytest.approx(level + (phi + phi ** 2 + phi ** 3) * trend)
    assert upper[0] - point[0] == pytest.approx(half)
    assert point[0] - lower[0] == pytest.approx(half)


def test_holt_intervals_cover_about_their_nominal_share() -> None:
    rng = np.random.default_rng(10)
    n = 4000
    x = np.cumsum(rng.normal(0.05, 0.3, n)) + rng.normal(0, 1.0, n)
    det = Holt(1, alpha=0.2, beta=0.1, phi=0.98)
    inside = []
    for t in range(n - 5):
        det.update(x[t:t + 1, None])
        if t > 500:
            _, lo, hi = det.forecast(horizon=5, coverage=0.9)
            inside.append(lo[0] <= x[t + 5] <= hi[0])
    assert 0.8 < np.mean(inside) < 0.97


def test_seasonal_diff_is_silent_on_a_series_that_does_not_repeat() -> None:
    rng = np.random.default_rng(11)
    x = rng.normal(0, 1, (3000, 1))          # white noise: "same as last period" is worse than the level
    s = SeasonalDiff(1, period=50, smooth=4, warmup=100).update(x)[:, 0]
    assert np.nanmax(s[500:]) == 0.0
    y = (np.sin(np.arange(3000) * 2 * np.pi / 50) * 10 + rng.normal(0, 1, 3000))[:, None]
    y[2500:2520] -= 5
    sy = SeasonalDiff(1, period=50, smooth=4, warmup=100).update(y)[:, 0]
    assert sy[2500:2530].max() > 2 * sy[500:2500].max()


# --- the combiner ---------------------------------------------------------------------------

def ref_combiner(member_scores, inv_scale, ts, hold, escalate):
    """Max of the scaled member scores; with ``hold``, a ratio of at least 1 (one member at its
    scale: an alert) passes if the last alert that passed is older than ``hold`` or it beats
    ``escalate`` times that one, else reads 0; a ratio under 1, or one at a non-finite time,
    passes and holds nothing."""
    out = []
    peak, peak_t = 0.0, -INF
    for t in range(len(ts)):
        ratios = [s[t] * k for s, k in zip(member_scores, inv_scale) if finite(s[t]) or s[t] == INF]
        if not ratios:
            out.append(NAN)
            continue
        big = max(max(r, 0.0) for r in ratios)
        if hold > 0 and big >= 1.0 and finite(ts[t]):  # no time, no hold: passes as it is
            if ts[t] - peak_t > hold or big > escalate * peak:
                peak, peak_t = big, ts[t]
            else:
                big = 0.0
        out.append(1.0 if big == INF else big / (1 + big))
    return out


@pytest.mark.kernel
@settings(max_examples=40, deadline=None)
@given(x=arrays(np.float64, st.tuples(st.integers(0, 60), st.just(1)), elements=values),
       hold=st.sampled_from([0.0, 3.0, 10.0]), escalate=st.sampled_from([1.0, 2.0, INF]))
def test_combiner_matches_reference(x: np.ndarray, hold: float, escalate: float) -> None:
    a = EwmaZScore(1, alpha=0.2, warmup=2)
    b = RangeNovelty(1, warmup=2)
    ts = np.arange(x.shape[0], dtype=float) * 2.0
    ts[7::11] = NAN  # a row now and then without a usable stamp
    got = Combiner([(a, 4.0), (b, 0.1)], hold=hold, escalate=escalate).update(x, ts=ts)
    sa = EwmaZScore(1, alpha=0.2, warmup=2).update(x)[:, 0]
    sb = RangeNovelty(1, warmup=2).update(x)[:, 0]
    want = ref_combiner([list(sa), list(sb)], [0.25, 10.0], list(ts), hold, escalate)
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-12, equal_nan=True)


@pytest.mark.parametrize("escalate", [1.0, INF])
def test_an_alert_at_a_nan_timestamp_opens_no_hold(escalate: float) -> None:
    """An alert stamped NaN stored its time as NaN: ``now - NaN > hold`` never held again, and
    every later alert of the series read 0 (escalate 1: all but those beating the stored peak),
    for good. Now it passes as without a hold, opens none, and the stamp is counted."""
    health = PipelineHealth()
    comb = Combiner([(Echo(1), 1.0)], hold=60.0, escalate=escalate, health=health)
    scores = np.array([[0.2], [3.0], [0.2], [1.5], [1.4], [1.3]])
    ts = np.array([0.0, NAN, 10.0, 100.0, 200.0, 230.0])
    out = comb.update(scores, ts=ts)[:, 0]
    np.testing.assert_allclose(out, [0.2 / 1.2, 0.75, 0.2 / 1.2, 0.6, 1.4 / 2.4, 0.0])
    assert not np.isnan(comb.s_hold).any()
    assert health.problems[("combiner", "bad_timestamp")] == 1


class Echo(UnivariateDetector):
    """A member whose score is its input: the combiner's hold seen on scores chosen by hand."""

    name = "echo"

    def _run(self, x: np.ndarray, out: np.ndarray, learn: bool) -> None:
        out[:] = x

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def held(scores: list[float], escalate: float, hold: float = 100.0) -> np.ndarray:
    """Combined scores of an Echo member at scale 1 (ratio = score), one per second."""
    x = np.array(scores, dtype=float)[:, None]
    return Combiner([(Echo(1), 1.0)], hold=hold, escalate=escalate).update(x, ts=np.arange(len(x), dtype=float))[:, 0]


@pytest.mark.parametrize("escalate", [1.0, 2.0, INF])
def test_quiet_scores_neither_open_a_hold_nor_raise_its_bar(escalate: float) -> None:
    """Noise at 0.6 of a member's scale, then an episode at 1.1: the episode alerts. Every score
    opened a hold, so the noise set the bar: with escalate 2 the episode (under 2 x 0.6) read 0,
    with escalate inf every anomaly after the first noisy sample read 0. The noise itself passes as
    it is (0.6 / 1.6), and the episode's later samples are still held (one alert per episode)."""
    s = held([0.0, 0.6, 0.3, 0.6, 1.1, 1.1, 1.05, 0.4], escalate)
    assert s[4] == pytest.approx(1.1 / 2.1)
    assert s[1] == pytest.approx(0.6 / 1.6) and s[7] == pytest.approx(0.4 / 1.4)
    assert s[5] == 0.0 and s[6] == 0.0
    assert held([1.0, 1.5, 2.5], escalate)[1:].tolist() == ([0.0, 0.0] if escalate == INF else
                                                              [0.6, 2.5 / 3.5] if escalate == 1.0 else [0.0, 2.5 / 3.5])


def test_escalate_inf_still_alerts_on_a_burst_after_noise() -> None:
    """The docstring's burst, escalate inf (never re-alert within a hold): the burst's first sample
    gets through, its four others read under alert level (held, or quiet enough to pass as they are)."""
    rng = np.random.default_rng(4)
    x = rng.normal(0, 1, size=(1000, 1))
    x[700:705] += 12.0
    s = Combiner([(EwmaZScore(1, alpha=0.01), 8.0)], hold=100, escalate=INF).update(x, ts=np.arange(1000.0))[:, 0]
    assert s[700] > 0.5 and np.nanmax(s[701:705]) < 0.5
    assert np.nanmax(s[:700]) < 0.5  # nothing before it was an alert


def test_combiner_state_keeps_the_member_that_drove_the_last_score() -> None:
    """last_member is state: a restored combiner names the member its source named. A checkpoint
    saved before it was kept loads, naming none (-1) until the next score."""
    make = lambda: Combiner([(EwmaZScore(1, alpha=0.01), 8.0), (RangeNovelty(1), 0.05)], hold=100)  # noqa: E731
    x = np.random.default_rng(4).normal(0, 1, size=(300, 1))
    x[299] += 12
    a = make()
    a.update(x)
    assert a.last_member.tolist() == [1]
    b = make()
    b.load_state_dict(a.state_dict())
    assert b.last_member.tolist() == [1]
    old = {k: v for k, v in a.state_dict().items() if k != "last_member"}
    c = make()
    c.last_member[:] = 0
    c.load_state_dict(old)
    assert c.last_member.tolist() == [-1]
    np.testing.assert_array_equal(c.update(x[:50]), b.update(x[:50]))
    with pytest.raises(ValueError, match="last_member"):
        make().load_state_dict({**a.state_dict(), "last_member": np.zeros(3, np.int64)})


def test_combiner_round_trip_purity_and_validation() -> None:
    x = np.random.default_rng(12).normal(size=(300, 2))
    make = lambda: Combiner([(EwmaZScore(2), 8.0), (RangeNovelty(2), 0.05)], hold=20)  # noqa: E731
    a = make()
    a.update(x[:150])
    b = make()
    b.load_state_dict(a.state_dict())
    before = a.state_dict()
    a.score(x[150:])
    np.testing.assert_array_equal(a.state_dict()["s_hold"], before["s_hold"])
    np.testing.assert_array_equal(a.update(x[150:]), b.update(x[150:]))
    assert a.member_names == ["ewma_zscore", "range_novelty"] and a.last_member.shape == (2,)
    with pytest.raises(ValueError, match="at least one"):
        Combiner([])
    with pytest.raises(ValueError, match="different numbers"):
        Combiner([(EwmaZScore(2), 1.0), (RangeNovelty(3), 1.0)])
    with pytest.raises(ValueError, match="scale"):
        Combiner([(EwmaZScore(2), 0.0)])
    with pytest.raises(ValueError, match="timestamps"):
        make().update(x[:5], ts=np.arange(4.0))


MODULES = ["univariate", "ewma_zscore", "cusum", "page_hinkley", "holt", "range_novelty", "seasonal",
           "combiner", "nab", "multivariate", "river_adapters"]


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str) -> None:
    mod = importlib.import_module(f"foreshock.detectors.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
