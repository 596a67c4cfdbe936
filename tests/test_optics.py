"""Optics: Q factor, Theil-Sen, bucketing against references; trends, steps, ETAs; the real
Alibaba series end to end."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erfcinv

from foreshock import facts
from foreshock.detectors import optics
from foreshock.detectors.optics import (F_CONF, F_LEVEL, F_SLOPE, N_SIG, SIG_BIAS, SIG_Q, SIG_RX, SIG_TXP,
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
    assert warn and "worsening -0.3" in warn[0].reason and "days at this rate" in warn[0].reason


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
    assert per_optic < 2048, per_optic
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
