"""Optics: Q factor, Theil-Sen, bucketing against references; trends, steps, ETAs; the real
Alibaba series end to end."""

from __future__ import annotations

import doctest
import math

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erfcinv

from foreshock import facts
from foreshock.detectors import optics, order_stats
from foreshock.detectors.optics import (F_CONF, F_LEVEL, F_SLOPE, N_SIG, O_DARK, SIG_BIAS, SIG_Q, SIG_RX, SIG_TXP,
                                        OpticsDetector, ber_of_q_db, q_db_of_ber, theil_sen)
from foreshock.frames import Frame
from foreshock.topology import Topology

from thermal_synth import run  # feeding frames one at a time, shared by the detector tests

SENSITIVITY_DBM = -6.5  # RX power at which the BER reaches the FEC limit (as the simulator has it)
Q_AT_LIMIT = math.sqrt(2.0) * float(erfcinv(2 * facts.PREFEC_BER_FEC_LIMIT))


def links(n: int = 1) -> Topology:
    return Topology.from_dict({
        "rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
        "nodes": [{"name": "n0", "rack": "k", "gpus": n}], "switches": [{"name": "leaf0"}],
        "links": [{"name": f"n0/gpu{i}~leaf0", "a": f"n0/gpu{i}", "b": "leaf0"} for i in range(n)],
    })


def ber_at(rx_dbm: np.ndarray) -> np.ndarray:
    """A receiver whose Q is proportional to received power, at the FEC limit at sensitivity."""
    q = Q_AT_LIMIT * 10 ** ((np.asarray(rx_dbm) - SENSITIVITY_DBM) / 20)
    return np.array([0.5 * math.erfc(v / math.sqrt(2)) for v in np.atleast_1d(q)])


def optic_frames(rx: np.ndarray, ts: np.ndarray, **extra: np.ndarray):
    """One frame per time step for every optic (columns: optics)."""
    n = rx.shape[1]
    for i, t in enumerate(ts):
        cols = {"rx_power": rx[i], "prefec_ber": ber_at(rx[i])}
        cols.update({k: v[i] for k, v in extra.items()})
        yield Frame("optic", np.full(n, float(t)), np.arange(n), cols)


# ---- the Q factor and Theil-Sen against references ---------------------------------------------------
@pytest.mark.kernel
@settings(max_examples=200, deadline=None)
@given(log_ber=st.floats(-300, math.log10(0.45)))
def test_q_db_matches_scipy(log_ber):
    ber = 10.0**log_ber
    expected = 20 * math.log10(math.sqrt(2) * float(erfcinv(2 * ber)))
    assert q_db_of_ber(ber) == pytest.approx(expected, abs=1e-9)
    assert ber_of_q_db(q_db_of_ber(ber)) == pytest.approx(ber, rel=1e-6)


@pytest.mark.kernel
def test_q_db_edges():
    assert math.isnan(q_db_of_ber(float("nan")))
    assert q_db_of_ber(0.5) == -math.inf
    assert q_db_of_ber(0.0) == pytest.approx(q_db_of_ber(1e-300))


def naive_theil_sen(t, y):
    m = len(t)
    h = m // 2
    slopes = [(y[j] - y[i]) / (t[j] - t[i]) for i in range(h) for j in range(h, m) if t[j] - t[i] > 1e-9]
    slope = float(np.median(slopes))
    nonzero = [s for s in slopes if s != 0]
    agree = sum(1 for s in nonzero if (s > 0) == (slope > 0)) / len(nonzero) if nonzero else 0.5
    level = float(np.median([y[k] - slope * (t[k] - t[-1]) for k in range(m)]))
    scale = float(np.median([abs(y[k] - slope * (t[k] - t[-1]) - level) for k in range(m)]))
    return slope, level, agree, scale


@pytest.mark.kernel
@settings(max_examples=100, deadline=None)
@given(data=st.data(), m=st.integers(2, 40))
def test_theil_sen_matches_reference(data, m):
    t = np.cumsum(data.draw(st.lists(st.floats(0.5, 100), min_size=m, max_size=m)))
    kind = data.draw(st.sampled_from(["random", "constant", "line+outliers"]))
    if kind == "constant":
        y = np.full(m, 3.0)
    else:
        y = np.array(data.draw(st.lists(st.floats(-50, 50), min_size=m, max_size=m)))
        if kind == "line+outliers":
            y = 0.1 * t + np.where(np.arange(m) % 7 == 3, y, 0.0)
    scratch = np.empty(m * m)
    got = theil_sen(np.asarray(t, float), y, m, scratch)
    want = naive_theil_sen(list(t), list(y))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_theil_sen_ignores_a_minority_of_outliers():
    t = np.arange(32.0)
    y = 2.0 * t + 1.0
    y[[3, 20, 29]] += [50.0, -80.0, 30.0]
    slope, level, agreement, _ = theil_sen(t, y, 32, np.empty(1024))
    assert slope == pytest.approx(2.0) and level == pytest.approx(63.0) and agreement > 0.85


@numba.njit(cache=False)
def numba_median(a):
    """np.median as compiled kernels ran it before median_of: NumPy's result for NaN-free input;
    with a NaN, whatever numba's quickselect gives (the reference for that case)."""
    return np.median(a)


def median_inputs(data, max_size=300):
    """Arrays median_of meets and the ones it must survive: noise, heavy tails, quantised
    readings (ties), a few values, constant, empty, with inf, huge values and NaN."""
    n = data.draw(st.integers(0, max_size))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    kind = data.draw(st.sampled_from(["normal", "cauchy", "quantised", "three values", "constant", "inf", "nan"]))
    a = {"normal": lambda: rng.normal(0, 1, n), "cauchy": lambda: rng.standard_cauchy(n),
         "quantised": lambda: np.round(rng.normal(-2.0, 0.3, n), 1),
         "three values": lambda: rng.integers(-1, 2, n) * 0.5, "constant": lambda: np.full(n, -3.25),
         "inf": lambda: rng.normal(0, 1, n), "nan": lambda: rng.normal(0, 1, n)}[kind]()
    if kind == "inf" and n:
        a[rng.random(n) < 0.2] = rng.choice([np.inf, -np.inf, 1e300, -1e300, 5e-324])
    if kind == "nan" and n:
        a[rng.integers(0, n)] = np.nan
    return a


@pytest.mark.kernel
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_median_of_is_np_median_exactly(data):
    a = median_inputs(data)
    n = len(a)
    work = np.empty(data.draw(st.sampled_from([0, 1, order_stats.MEDIAN_BRACKET + 1, n + 1])))  # short: falls back
    before = a.copy()
    got = order_stats.median_of(a, n, work)
    np.testing.assert_array_equal(a, before)  # read only
    if n == 0:
        assert math.isnan(got)
    elif np.isnan(a).any():
        want = numba_median(a.copy())
        assert got == want or (math.isnan(got) and math.isnan(want))
    else:
        assert got == np.median(a)  # the same number, not a close one
    # a prefix of a longer array: the values beyond n are not read
    longer = np.concatenate([a, np.full(5, -1e308)])
    again = order_stats.median_of(longer, n, np.empty(n + 1))
    assert again == got or (math.isnan(again) and math.isnan(got))


@pytest.mark.kernel
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_select_kth_matches_sorting(data):
    a = median_inputs(data, max_size=60)
    a = a[~np.isnan(a)]
    if len(a) == 0:
        return
    lo = data.draw(st.integers(0, len(a) - 1))
    hi = data.draw(st.integers(lo, len(a) - 1))
    k = data.draw(st.integers(lo, hi))
    before = a.copy()
    got = order_stats.select_kth(a, lo, hi, k)
    assert got == np.sort(before[lo:hi + 1])[k - lo] == a[k]
    np.testing.assert_array_equal(np.sort(a[lo:hi + 1]), np.sort(before[lo:hi + 1]))  # reordered, not changed
    np.testing.assert_array_equal(a[:lo], before[:lo])
    np.testing.assert_array_equal(a[hi + 1:], before[hi + 1:])


@pytest.mark.kernel
@settings(max_examples=100, deadline=None)
@given(data=st.data(), m=st.integers(2, 70))
def test_theil_sen_medians_are_exact(data, m):
    """The slope, level and scale are order statistics of the same numbers np.median would see:
    equal to the reference's, not close (quantised readings: many ties among the slopes)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    t = (np.arange(m) + 0.5) * 60.0
    y = np.round(-2.0 - 1e-4 * t + rng.normal(0, data.draw(st.sampled_from([0.0, 0.02, 0.3])), m), 2)
    got = theil_sen(t, y, m, np.empty(m * m // 4 + m + order_stats.MEDIAN_BRACKET + 1))
    h = m // 2
    slopes = np.array([(y[j] - y[i]) / (t[j] - t[i]) for i in range(h) for j in range(h, m)])
    assert got[0] == np.median(slopes)
    np.testing.assert_allclose(got, naive_theil_sen(list(t), list(y)), rtol=1e-12, atol=1e-12)


# ---- bucketing: a streaming kernel against a batch reference ------------------------------------------
@pytest.mark.kernel
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_bucket_means_match_a_batch_grouping(data):
    n_rows = data.draw(st.integers(0, 120))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    ts = np.sort(rng.uniform(0, 1200, n_rows))
    slot = rng.integers(0, 4, n_rows).astype(np.int32)
    rx = rng.normal(-2, 1, n_rows)
    rx[rng.random(n_rows) < 0.1] = np.nan
    rx[rng.random(n_rows) < 0.05] = np.inf
    los = (rng.random(n_rows) < 0.05).astype(float)
    det = OpticsDetector(links(2), bucket_s=60.0, window=64, min_points=2, step_min_db=1e9, step_k=1e9)
    chunks = sorted(set(rng.integers(0, n_rows + 1, 3).tolist() + [0, n_rows]))
    for a, b in zip(chunks, chunks[1:]):  # fed in pieces: streaming must not matter
        det.update(Frame("optic", ts[a:b], slot[a:b], {"rx_power": rx[a:b], "los": los[a:b]}))
    for o in range(4):
        mine = (slot == o) & (los < 0.5) & np.isfinite(rx)
        buckets = np.floor(ts[slot == o] / 60.0)
        closed = np.unique(buckets)[:-1]  # the newest bucket is still open
        want = [rx[mine & (np.floor(ts / 60.0) == b)].mean() if (mine & (np.floor(ts / 60.0) == b)).any()
                else np.nan for b in closed]
        count = int(det.s_optic[o, optics.O_COUNT])
        pos = int(det.s_optic[o, optics.O_POS])
        order = [(pos - count + k) % det.s_ring.shape[2] for k in range(count)]
        got = det.s_ring[o, SIG_RX, order]
        np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)
        np.testing.assert_allclose(det.s_ring_t[o, order], (closed + 0.5) * 60.0)



# ---- ETAs: the kernel against the docstring's rules written out ---------------------------------------
def naive_etas(fit, bias_ref, prm, q_limit, rx_alarm, bias_alarm):
    """(eta_q, eta_rx, eta_bias, bias_ref) of one optic, in plain Python."""
    inf = math.inf
    min_slope = prm["min_slope_db_per_day"] / 86400.0
    reach = prm["max_extrapolation"] * prm["window"] * prm["bucket_s"]

    def eta_down(level, slope, threshold):
        if math.isnan(level) or math.isnan(threshold):
            return inf
        if level <= threshold:
            return 0.0
        if not slope < -min_slope:
            return inf
        return (level - threshold) / -slope

    q_slope, q_level = fit[SIG_Q][F_SLOPE], fit[SIG_Q][F_LEVEL]
    rx_slope, rx_level = fit[SIG_RX][F_SLOPE], fit[SIG_RX][F_LEVEL]
    eta_q = inf if math.isnan(q_slope) else eta_down(q_level, q_slope, q_limit)
    eta_rx = inf if math.isnan(rx_slope) else eta_down(rx_level, rx_slope, rx_alarm)
    eta_bias = inf
    b_slope, bias = fit[SIG_BIAS][F_SLOPE], fit[SIG_BIAS][F_LEVEL]
    if not math.isnan(b_slope) and bias > 0:
        if math.isnan(bias_ref):
            bias_ref = bias
        tx_rising = fit[SIG_TXP][F_SLOPE] * 86400.0 > prm["tx_flat_db_per_day"]  # NaN: not rising
        limit = bias_alarm if not math.isnan(bias_alarm) else prm["bias_eol_ratio"] * bias_ref
        if not tx_rising and b_slope * 86400.0 > prm["min_bias_slope_per_day"] * bias:
            eta_bias = 0.0 if bias >= limit else (limit - bias) / b_slope
    etas = [inf if e > reach else e for e in (eta_q, eta_rx, eta_bias)]
    return (*etas, bias_ref)


@pytest.mark.kernel
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_eta_kernel_matches_reference(data):
    value = st.one_of(st.floats(-60, 60), st.sampled_from([math.nan, math.inf, -math.inf, 0.0]))
    slope = st.one_of(st.floats(-1e-2, 1e-2), st.floats(-1e-6, 1e-6),
                      st.sampled_from([math.nan, 0.0, -math.inf, math.inf]))
    fit = np.full((1, N_SIG, optics.F_SIZE), math.nan)
    for g in range(N_SIG):
        fit[0, g, F_SLOPE] = data.draw(slope)
        fit[0, g, F_LEVEL] = data.draw(value)
    fit[0, SIG_BIAS, F_LEVEL] = data.draw(st.one_of(st.floats(-1e-3, 0.2), st.just(math.nan)))
    fit[0, SIG_BIAS, F_SLOPE] = data.draw(st.one_of(st.floats(-1e-6, 1e-6), st.just(math.nan)))
    overrides = {"min_slope_db_per_day": data.draw(st.sampled_from([0.0, 0.02, 1.0])),
                 "bucket_s": data.draw(st.sampled_from([60.0, 3600.0]))}
    det = OpticsDetector(links(1), **overrides)
    prm = {**optics.PARAMS, **overrides}
    q_limit = data.draw(st.floats(-5, 25))
    alarms = np.array([[data.draw(st.one_of(st.floats(-40, 5), st.just(math.nan))),
                        data.draw(st.one_of(st.floats(1e-3, 0.2), st.just(math.nan)))]] * 2)
    optic = np.full((2, optics.O_SIZE), math.nan)
    optic[0, optics.O_BIAS_REF] = data.draw(st.one_of(st.floats(1e-3, 0.1), st.just(math.nan)))
    ref_in = float(optic[0, optics.O_BIAS_REF])
    fit2 = np.concatenate([fit, fit])
    optics._update_etas(0, optic, fit2, det.params, q_limit, alarms)
    with np.errstate(all="ignore"):  # a subnormal slope overflows to inf, as in the kernel
        want = naive_etas(fit[0].tolist(), ref_in, prm, q_limit, float(alarms[0, 0]), float(alarms[0, 1]))
    got = (optic[0, optics.O_ETA_Q], optic[0, optics.O_ETA_RX], optic[0, optics.O_ETA_BIAS],
           optic[0, optics.O_BIAS_REF])
    np.testing.assert_array_equal(np.array(got), np.array(want))
    assert np.isnan(optic[1]).all()  # only optic 0 was touched


# ---- behaviour ----------------------------------------------------------------------------------------
def healthy(n_opt: int, hours: float, step_s: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ts = np.arange(0.0, hours * 3600, step_s)
    walk = np.cumsum(0.03 * np.sqrt(step_s / 3600) * rng.standard_normal((len(ts), n_opt)), axis=0)
    return ts, -0.7 + rng.uniform(-0.5, 0.5, n_opt) + walk + 0.05 * rng.standard_normal((len(ts), n_opt))


def test_healthy_optics_predict_nothing():
    ts, rx = healthy(16, 6, 10.0, seed=1)
    det = OpticsDetector(links(8))
    found = run(det, optic_frames(rx, ts))
    assert found == []


def test_a_step_is_reported_and_not_read_as_a_trend():
    ts, rx = healthy(2, 4, 10.0, seed=2)
    rx[ts >= 2 * 3600, 1] -= 2.5  # a reseated connector: -2.5 dB at once, then stable
    det = OpticsDetector(links(1))
    found = run(det, optic_frames(rx, ts))
    assert [f.type for f in found if f.type == "prediction"] == []
    steps = [f for f in found if f.type == "anomaly" and f.field == "rx_power"]
    assert len(steps) == 1 and steps[0].slot == 1
    assert 2 * 3600 <= steps[0].ts <= 2 * 3600 + 3 * 60 and "stepped -2.5 dB" in steps[0].reason
    # the BER stepped with it, and says so
    assert any(f.field == "prefec_ber" and "jumped" in f.reason for f in found)
    # and the line is flat again: no slope from the step
    assert abs(det.s_fit[1, SIG_RX, F_SLOPE] * 3600) < 0.1


@pytest.mark.parametrize("use_counters", [False, True])
def test_a_degrading_optic_predicts_its_link_down_with_an_eta(use_counters):
    onset, rate_db_h, initial_db = 3600.0, 1.5, 2.0
    ts, rx = healthy(4, 5, 10.0, seed=3)
    loss = np.where(ts >= onset, initial_db + rate_db_h * (ts - onset) / 3600, 0.0)
    rx[:, 3] -= loss  # link 1, end b
    # when the BER reaches the FEC limit, ground truth for the ETA
    limit_t = ts[np.argmax(rx[:, 3] <= SENSITIVITY_DBM)]
    extra = {}
    if use_counters:
        line = 425e9 * 10.0  # bits per 10-s sample
        ber = np.stack([ber_at(r) for r in rx])
        extra = {"rx_bits": np.cumsum(np.full(rx.shape, line), axis=0) + 1e15,
                 "rx_corrected_bits": np.floor(np.cumsum(ber * line, axis=0))}
    det = OpticsDetector(links(2))
    frames = optic_frames(rx, ts, **extra)
    if use_counters:  # the gauge gone: the counters alone carry the BER
        frames = (Frame(f.kind, f.ts, f.slot, {k: v for k, v in f.columns.items() if k != "prefec_ber"})
                  for f in frames)
    found = run(det, frames)
    preds = [f for f in found if f.type == "prediction" and f.active]
    assert preds and {p.slot for p in preds} == {1} and {p.event for p in preds} == {"link_down"}
    first = preds[0]
    assert onset < first.ts < onset + 1800  # found within half an hour of the onset ...
    assert limit_t - first.ts > 1800  # ... more than 30 min before the FEC limit
    late = [p for p in preds if p.ts >= onset + 3600 and p.ts < limit_t]
    assert late and all(abs(p.ts + p.eta_s - limit_t) < 900 for p in late)  # ETA within 15 min
    assert "#b" in first.reason and "FEC limit" in first.reason


def test_the_fec_limit_is_a_parameter():
    ts, rx = healthy(2, 3, 30.0, seed=4)
    rx[:, 1] -= np.where(ts >= 3600, 1.0 + (ts - 3600) / 3600, 0.0)
    etas = {}
    for limit in (2.4e-4, 1e-3):
        det = OpticsDetector(links(1), fec_limit_ber=limit)
        run(det, optic_frames(rx, ts))
        etas[limit] = det.s_optic[1, optics.O_ETA_Q]
    assert etas[1e-3] > etas[2.4e-4]  # a stronger FEC (higher limit) leaves more time


def test_laser_ageing_at_constant_tx_power():
    ts = np.arange(0.0, 3 * 3600, 30.0)
    n = len(ts)
    rng = np.random.default_rng(5)
    bias = 7e-3 * (1 + 0.3 * ts / 3600)[:, None] * (1 + 0.002 * rng.standard_normal((n, 2)))
    rx = -0.7 + 0.03 * rng.standard_normal((n, 2))
    flat_tx = 1.0 + 0.02 * rng.standard_normal((n, 2))
    det = OpticsDetector(links(1), tx_bias_high_alarm_a=20e-3)
    found = run(det, optic_frames(rx, ts, tx_bias=bias, tx_power=flat_tx))
    preds = [f for f in found if f.type == "prediction"]
    assert preds and "laser ageing" in preds[0].reason
    # the same bias rise with TX power rising too was commanded, not ageing
    rising_tx = flat_tx + (ts / 3600)[:, None]
    det = OpticsDetector(links(1), tx_bias_high_alarm_a=20e-3)
    found = run(det, optic_frames(rx, ts, tx_bias=bias, tx_power=rising_tx))
    assert not [f for f in found if f.type == "prediction"]



# ---- a replaced module is a new module ----------------------------------------------------------------
def module_swap(dark: str, hours: float = 8.0, swap_h: float = 6.0, dark_s: float = 300.0):
    """Link 0, end b: loses 1 dB/h from 2 h on, goes dark at ``swap_h`` for ``dark_s`` (``"los"``:
    LOS rows; ``"gap"``: no rows at all) and comes back as a healthy module, flat at -1.5 dBm."""
    rng = np.random.default_rng(21)
    ts = np.arange(0.0, hours * 3600, 30.0)
    rx = -1.0 - np.where(ts >= 7200, (ts - 7200) / 3600, 0.0)[:, None] * [0.0, 1.0]
    out = (ts >= swap_h * 3600) & (ts < swap_h * 3600 + dark_s)
    back = ts >= swap_h * 3600 + dark_s
    rx[back, 1] = -1.5
    rx += 0.05 * rng.standard_normal(rx.shape)
    los = np.zeros_like(rx)
    rx[out, 1], los[out, 1] = -40.0, 1.0
    keep = ~out if dark == "gap" else np.ones(len(ts), bool)
    frames = list(optic_frames(rx, ts, los=los))
    if dark == "gap":  # the unplugged module's DOM says nothing: only end a reports
        frames = [f if k else Frame("optic", f.ts[:1], f.slot[:1], {c: v[:1] for c, v in f.columns.items()})
                  for f, k in zip(frames, keep)]
    return frames, swap_h * 3600 + dark_s


@pytest.mark.parametrize("dark", ["los", "gap"])
def test_a_failing_module_swapped_for_a_healthy_one_does_not_hand_it_its_trend(dark):
    """A degrading optic goes dark and comes back a healthy, flat module. Before, the confirmed
    step shifted the old module's declining buckets up to the new level ("keeping the trend"),
    so the healthy module inherited -1.15 dB/h and a ``link_down`` prediction ("reaches the FEC
    limit in 4.3 h") was refreshed for most of a window after the swap."""
    frames, swapped = module_swap(dark)
    det = OpticsDetector(links(1))
    found = run(det, frames)
    before = [f for f in found if f.type == "prediction" and f.ts < swapped]
    assert before and before[-1].active  # the failing module was predicted, and still was at the swap
    step = [f for f in found if f.type == "anomaly" and f.ts >= swapped and f.slot == 1]
    assert step and step[0].ts - swapped <= 180  # confirmed two buckets on
    after = [f for f in found[found.index(step[0]):] if f.type == "prediction"]
    # withdrawn as a cleared trend is, off_hold_s after the module's trends started over ...
    assert [p.active for p in after] == [False]
    assert after[0].ts - step[0].ts <= optics.PARAMS["off_hold_s"] + 120
    # ... and the new module is trended as it is: flat
    assert abs(det.s_fit[1, SIG_RX, F_SLOPE] * 3600) < 0.25 and abs(det.s_fit[1, SIG_Q, F_SLOPE] * 3600) < 0.25
    assert det.s_fit[1, SIG_RX, F_LEVEL] == pytest.approx(-1.5, abs=0.1)
    assert all("replaced module" in f.reason for f in step)


def test_a_worse_level_after_the_link_was_dark_keeps_the_trend():
    """A failing optic that flaps (a dark stretch) and comes back lower is still the failing
    module: the step keeps its trend and the prediction holds."""
    frames, swapped = module_swap("los")
    for f in frames:
        if f.ts[0] >= swapped:
            f.columns["rx_power"][1] = -1.0 - (f.ts[0] - 7200) / 3600 - 1.0  # the decline, 1 dB lower
            f.columns["prefec_ber"] = ber_at(f.columns["rx_power"])
    found = run(OpticsDetector(links(1)), frames)
    step = [f for f in found if f.type == "anomaly" and f.ts >= swapped and f.field == "rx_power"]
    assert step and "replaced module" not in step[0].reason
    after = [f for f in found if f.type == "prediction" and f.ts >= swapped]
    assert after and all(p.active for p in after)


def bias_frames(t0: float, t1: float, bias0: float, drift_per_day: float, seed: int):
    """End a's laser at ``bias0`` drifting ``drift_per_day`` (relative) at constant TX power;
    end b steady at 7 mA."""
    rng = np.random.default_rng(seed)
    for t in np.arange(t0, t1, 30.0):
        bias = bias0 * (1 + drift_per_day * (t - t0) / 86400) + 0.02e-3 * rng.standard_normal()
        yield Frame("optic", [t, t], [0, 1], {"rx_power": -2.0 + 0.05 * rng.standard_normal(2),
                                              "tx_power": 1.0 + 0.02 * rng.standard_normal(2),
                                              "tx_bias": [bias, 7e-3]})


def test_a_new_modules_laser_is_not_judged_by_the_old_ones_first_bias():
    """A 6 mA module, unplugged for 10 minutes (no rows), replaced by one that runs at 10 mA and
    drifts +3 %/day, as new lasers do. Before, the end-of-life reference (1.5 x the bias first
    seen) stayed the old laser's 9 mA: ``link_down`` "reaches end of life ... now" at confidence
    1.0, for as long as the new module lived. The same data on a fresh detector predicts nothing."""
    swap = 4 * 3600.0
    det = OpticsDetector(links(1))
    assert run(det, bias_frames(0.0, swap, 6e-3, 0.0, seed=0)) == []
    assert det.s_optic[0, optics.O_BIAS_REF] == pytest.approx(6e-3, rel=0.01)
    found = run(det, bias_frames(swap + 600, swap + 4 * 3600, 10e-3, 0.03, seed=1))
    assert [f.type for f in found] == ["anomaly"]
    assert "laser bias stepped +4.0" in found[0].reason and "replaced module" in found[0].reason
    assert det.s_optic[0, optics.O_BIAS_REF] == pytest.approx(10e-3, rel=0.01)  # the new laser's
    assert run(OpticsDetector(links(1)), bias_frames(swap + 600, swap + 4 * 3600, 10e-3, 0.03, seed=1)) == []


def test_a_bias_jump_on_a_module_that_kept_reporting_is_judged_by_its_first_bias():
    """No dark stretch, so the same laser: a bias 67 % up at constant TX power and still rising
    is past end of life, and says so."""
    swap = 4 * 3600.0
    det = OpticsDetector(links(1))
    run(det, bias_frames(0.0, swap, 6e-3, 0.0, seed=0))
    found = run(det, bias_frames(swap, swap + 2 * 3600, 10e-3, 0.03, seed=1))
    assert "replaced module" not in found[0].reason
    preds = [f for f in found if f.type == "prediction" and f.active]
    assert preds and "end of life (1.5 x the bias first seen) now" in preds[0].reason
    assert det.s_optic[0, optics.O_BIAS_REF] == pytest.approx(6e-3, rel=0.01)


# ---- each module's own alarm thresholds (from ethtool -m) -------------------------------------------
def falling_rx(hours: float = 4.0, db_per_h: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Two links; link 0 end b loses ``db_per_h`` from -3 dBm after 1 h, the rest stay at -1 dBm."""
    ts = np.arange(0.0, hours * 3600, 30.0)
    rng = np.random.default_rng(11)
    rx = -1.0 + 0.03 * rng.standard_normal((len(ts), 4))
    rx[:, 1] = -3.0 - db_per_h * np.maximum(ts - 3600, 0.0) / 3600 + 0.03 * rng.standard_normal(len(ts))
    return ts, rx


def rx_only_frames(rx: np.ndarray, ts: np.ndarray):
    """RX power alone (no BER): only the RX-power predictor can see the decline."""
    for i, t in enumerate(ts):
        yield Frame("optic", np.full(rx.shape[1], float(t)), np.arange(rx.shape[1]), {"rx_power": rx[i]})


def test_rx_power_is_judged_against_the_modules_own_alarm_from_ethtool_m():
    from pathlib import Path

    from foreshock.streams.dom import parse_ethtool_m

    data = Path(__file__).parent / "data"
    cmis = parse_ethtool_m((data / "ethtool_m_osfp_cmis_8lane.txt").read_text())  # RX low alarm -10.50 dBm
    ts, rx = falling_rx()
    # no alarm known: the falling RX power alone predicts nothing (the parameter default is NaN)
    assert [f for f in run(OpticsDetector(links(2)), rx_only_frames(rx, ts)) if f.type == "prediction"] == []
    det = OpticsDetector(links(2))
    assert det.set_module_thresholds({"n0/gpu0~leaf0#b": cmis.thresholds}) == 2  # RX low and bias high
    preds = [f for f in run(det, rx_only_frames(rx, ts)) if f.type == "prediction" and f.active]
    assert preds and {(p.event, p.slot) for p in preds} == {("link_down", 0)}
    assert "module's low alarm -10.5 dBm" in preds[0].reason
    alarm_t = 3600 + (-3.0 - -10.5) / 2.0 * 3600  # when the trend crosses -10.5 dBm
    late = [p for p in preds if p.ts >= 2 * 3600]
    assert late and all(abs(p.ts + p.eta_s - alarm_t) < 900 for p in late)


def test_the_modules_own_alarm_carried_in_its_rows_reaches_the_detector_through_the_pipeline():
    """The DOM source puts each module's alarm levels in its optic rows (``rx_power_alarm_low``):
    a replay or a Kafka worker, which never sees ``ethtool -m``, judges the module by them too."""
    from pathlib import Path

    from foreshock.detectors.bank import DetectorBank
    from foreshock.streams.dom import parse_ethtool_m
    from foreshock.streams.embedded import EmbeddedPipeline

    row = parse_ethtool_m((Path(__file__).parent / "data" / "ethtool_m_osfp_cmis_8lane.txt").read_text()).optic_values()
    assert row["rx_power_alarm_low"] == -10.50
    topo = links(2)
    pipeline = EmbeddedPipeline(topo, DetectorBank.from_names(topo, ["optics"], processors=()))
    ts, rx = falling_rx()
    preds = []
    for frame in rx_only_frames(rx, ts):
        alarm = np.full(len(frame), np.nan)
        alarm[1] = row["rx_power_alarm_low"]  # optic n0/gpu0~leaf0#b reports its module's level
        frame.columns["rx_power_alarm_low"] = alarm
        preds += [f for f in pipeline.process(frame) if f.type == "prediction" and f.active]
    assert preds and {(p.event, p.slot) for p in preds} == {("link_down", 0)}
    assert "module's low alarm -10.5 dBm" in preds[0].reason


def test_zero_alarm_levels_of_a_module_without_thresholds_are_ignored():
    """``ethtool -m`` prints 0 mA / 0 mW (-40 dBm floored) for a module that does not implement
    its thresholds page. Taken as levels, the 0 mA bias alarm had every bias past it: a bias
    creeping up 1 %/h with the module warming gave ``link_down`` "reaches the module's high bias
    alarm 0.0 mA now" at every bucket. Ignored, the optic keeps the parameters (unknown)."""
    def frames(zero_levels: bool):
        rng = np.random.default_rng(0)
        for t in np.arange(0.0, 4 * 3600, 60.0):
            cols = {"tx_bias": [7e-3 * (1 + 0.01 * t / 3600) + 2e-6 * rng.standard_normal()],
                    "rx_power": [-4.0], "tx_power": [-3.3]}
            if zero_levels:
                cols.update(tx_bias_alarm_high=[0.0], rx_power_alarm_low=[-40.0])
            yield Frame("optic", [t], [0], cols)

    det = OpticsDetector(links(1))
    assert run(det, frames(zero_levels=True)) == run(OpticsDetector(links(1)), frames(zero_levels=False)) == []
    assert np.isnan(det.s_module_alarm[0]).all()
    det = OpticsDetector(links(1), tx_bias_high_alarm_a=0.02)
    assert det.set_module_thresholds({"n0/gpu0~leaf0#a": {"tx_bias_high_alarm": 0.0,
                                                           "rx_power_low_alarm": -40.0}}) == 0
    assert det.s_module_alarm[0].tolist()[1] == 0.02


def test_alarm_levels_in_rows_outside_the_topology_are_left_alone():
    """Rows with a slot outside the topology are counted by the kernel; their alarm levels were
    written first: slot -1 set the last optic's, a slot past the end raised IndexError."""
    det = OpticsDetector(links(2))
    for slot in (-1, 7):
        assert det.update(Frame("optic", [0.0], [slot], {"rx_power": [-3.0], "rx_power_alarm_low": [-5.0]})) == []
    assert np.isnan(det.s_module_alarm).all()
    assert det.health.problems[("optics", "row with a slot outside the topology or a NaN timestamp")] == 2


def test_module_thresholds_are_per_optic_and_survive_a_state_round_trip():
    ts, rx = falling_rx()
    rx[:, 3] = rx[:, 1]  # link 1 end b falls the same way
    det = OpticsDetector(links(2), rx_power_low_alarm_dbm=-25.0)  # the fallback for modules that said nothing
    health = det.health
    assert det.set_module_thresholds({
        "n0/gpu0~leaf0#b": {"rx_power_low_alarm": -8.0, "tx_bias_high_alarm": float("nan")},
        "n0/gpu1~leaf0#b": {"module_temp_high_alarm": 75.0},  # nothing the detector uses
        "nowhere#a": {"rx_power_low_alarm": -9.0},
    }) == 1
    assert health.problems[("optics", "module thresholds for an optic not in the topology")] == 1
    frames = list(rx_only_frames(rx, ts))
    run(det, frames[:240])
    twin = OpticsDetector(links(2), rx_power_low_alarm_dbm=-25.0)
    twin.load_state_dict(det.state_dict())
    out = run(det, frames[240:])
    assert out == run(twin, frames[240:])
    # the same decline reaches -8 dBm (its module's alarm) hours before -25 dBm (the fallback, past the horizon)
    assert det.s_optic[1, optics.O_ETA_RX] + 5 * 3600 < det.s_optic[3, optics.O_ETA_RX] or \
        not np.isfinite(det.s_optic[3, optics.O_ETA_RX])
    preds = {p.slot for p in out if p.type == "prediction" and p.active}
    assert preds == {0}


def test_loss_of_signal_is_not_a_trend_or_a_step():
    ts, rx = healthy(2, 3, 10.0, seed=6)
    los = np.zeros_like(rx)
    dark = (ts > 3600) & (ts < 3900)
    rx[dark, 0] = -40.0
    los[dark, 0] = 1.0
    det = OpticsDetector(links(1))
    assert run(det, optic_frames(rx, ts, los=los)) == []


def test_nan_inf_and_empty_input():
    det = OpticsDetector(links(1))
    assert det.update(Frame.empty("optic")) == []
    ts = np.arange(0.0, 3600, 10.0)
    rx = np.where(np.arange(len(ts))[:, None] % 5 == 0, np.nan, -1.0 + 0.0 * ts[:, None]) * np.ones((1, 2))
    rx[7] = np.inf
    assert run(det, optic_frames(rx, ts)) == []
    assert np.isfinite(det.s_fit[:, SIG_RX, F_LEVEL]).all()


def test_trend_warning_beyond_the_horizon():
    """A slow, steady decline that reaches the FEC limit in weeks: an early warning, no prediction."""
    ts = np.arange(0.0, 4 * 86400, 3600.0)
    rng = np.random.default_rng(8)
    rx = -3.0 - 0.3 * ts[:, None] / 86400 + 0.02 * rng.standard_normal((len(ts), 2))
    det = OpticsDetector(links(1), bucket_s=3600, window=48, min_points=12, min_slope_db_per_day=0.1)
    found = run(det, optic_frames(rx, ts))
    assert not [f for f in found if f.type == "prediction"]
    warn = [f for f in found if f.type == "anomaly" and f.field == "prefec_ber"]
    assert warn and "days at this rate" in warn[0].reason
    # either end may warn first: its fitted rate, not the text of one end's, is what must be right
    assert "worsening " in warn[0].reason and " dB/day" in warn[0].reason, warn[0].reason
    rate = float(warn[0].reason.split("worsening ")[1].split(" dB/day")[0])
    assert rate == pytest.approx(-0.3, abs=0.03), warn[0].reason


def test_state_round_trip_gives_identical_future_output():
    ts, rx = healthy(4, 3, 10.0, seed=9)
    rx[:, 2] -= np.where(ts > 1800, 2.0 + 2.0 * (ts - 1800) / 3600, 0.0)
    frames = list(optic_frames(rx, ts))
    a = OpticsDetector(links(2))
    run(a, frames[:400])
    b = OpticsDetector(links(2))
    b.load_state_dict(a.state_dict())
    out_a, out_b = run(a, frames[400:]), run(b, frames[400:])
    assert out_a == out_b and any(f.type == "prediction" for f in out_a)


def test_a_state_saved_before_optics_kept_their_dark_buckets_is_read_on():
    """A checkpoint from before ``O_DARK`` (eight columns per optic) loads, never dark, and goes on
    finding what the detector it came from finds: the hours of trends it holds are not thrown away."""
    ts, rx = healthy(4, 3, 10.0, seed=9)
    rx[:, 2] -= np.where(ts > 1800, 2.0 + 2.0 * (ts - 1800) / 3600, 0.0)
    frames = list(optic_frames(rx, ts))
    a = OpticsDetector(links(2))
    run(a, frames[:400])
    old = a.state_dict()
    assert np.isnan(old["s_optic"][:, O_DARK]).all()  # no optic went dark: the old layout lost nothing
    old["s_optic"] = old["s_optic"][:, :O_DARK]
    b = OpticsDetector(links(2))
    b.load_state_dict(old)
    out_a = run(a, frames[400:])
    assert run(b, frames[400:]) == out_a and any(f.type == "prediction" for f in out_a)


def test_a_missing_corrected_bits_reading_does_not_double_the_ber():
    """A row with ``rx_corrected_bits`` missing but ``rx_bits`` present: the bits of that interval
    were counted, the corrected bits of it landed with the next one, and the BER of the bucket
    read up to 2x too high. The pair is now read together or not at all."""
    det = OpticsDetector(links(1), bucket_s=3600.0)
    bits = corrected = 0.0
    for k, t in enumerate(np.arange(0.0, 600.0, 10.0)):
        bits += 1e11
        corrected += 1e5  # a BER of 1e-6
        missing = k in (20, 21, 40)
        det.update(Frame("optic", [t], [0], {"rx_power": [-2.0], "rx_bits": [bits],
                                             "rx_corrected_bits": [np.nan if missing else corrected]}))
    acc = det.s_acc[0]
    assert acc[2 * SIG_Q] / acc[2 * SIG_Q + 1] == pytest.approx(1e-6, rel=1e-9)


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="unknown parameters"):
        OpticsDetector(links(1), fec_limit=1e-3)
    with pytest.raises(ValueError, match="fec_limit_ber"):
        OpticsDetector(links(1), fec_limit_ber=0.6)
    with pytest.raises(ValueError, match="window"):
        OpticsDetector(links(1), window=2)


def test_state_is_bounded_per_optic():
    det = OpticsDetector(links(64))
    per_optic = det.state_nbytes() / det.topology.size("optic")
    assert per_optic < 4096, per_optic  # 3852 B: 2 KB the short window, 1.8 KB the early-warning trend
    assert det.s_ring.shape[1] == N_SIG and det.s_fit.shape[1] == N_SIG
    assert {SIG_RX, SIG_BIAS, SIG_TXP, SIG_Q} == set(range(N_SIG))
    assert F_CONF >= 0


# ---- the real Alibaba series ----------------------------------------------------------------------
def test_alibaba_series_end_to_end(shared_data):
    from foreshock.streams.alibaba import read_alibaba

    imp = read_alibaba(shared_data / "optics" / "alibaba_prefec_ber.csv")
    frame = imp.batch.to_frame(imp.topology)
    assert len(frame) > 10_000
    det = OpticsDetector(imp.topology, bucket_s=3600, window=168, min_points=72, fec_limit_ber=3.7e-2,
                         horizon_s=7 * 86400, min_slope_db_per_day=0.02)
    found = det.update(frame)
    assert all(np.isfinite(f.ts) for f in found)
    # the ot1 plane's BER fell ~30x on several channel ends at once on day 7.6 (a network change)
    t0 = float(frame.ts.min())
    steps = [f for f in found if f.type == "anomaly" and "jumped" in f.reason and f.reason.startswith("ot1/")]
    assert len(steps) >= 4
    assert all(7.0 < (f.ts - t0) / 86400 < 8.0 for f in steps)
    # the detector's state holds a finite trend for every end that has data
    has_data = np.unique(frame.slot)
    assert np.isfinite(det.s_fit[has_data, SIG_Q, F_SLOPE]).all()


def test_doctests():
    assert doctest.testmod(optics).failed == 0


def test_alibaba_script_writes_the_figure(shared_data, tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "alibaba.png"
    proc = subprocess.run([sys.executable, str(root / "bench" / "alibaba_optics.py"), "--data",
                           str(shared_data / "optics" / "alibaba_prefec_ber.csv"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["name"] == "alibaba_optics" and result["channel_ends"] == 50
    assert result["step"] >= 4
    assert out.stat().st_size > 10_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fabric_bench_times_optics_with_their_trends_running(tmp_path):
    """bench_fabric's optics detectors are warmed first: timed from empty, two minutes of ticks
    never fit a trend and the figure is several times what a running pipeline gets."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "bench" / "bench_fabric.py"), "--gpus", "64", "--ticks", "61",
                           "--runs", "1"], capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["name"] == "fabric_detectors" and result["warm_buckets"] >= 32
    assert result["optics_trended"] == result["optics"] > 0
    assert result["port_obs_per_s"] > 0
