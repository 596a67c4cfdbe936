"""Optics: the early-warning trend over days (hourly points), a silent end's ETA leaving the gauge,
and a replaced module's alarm thresholds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import optics
from foreshock.detectors.optics import N_SIG, OpticsDetector
from foreshock.frames import Frame

from test_optics import SENSITIVITY_DBM, ber_at, links
from test_optics_temperature import naive_coefficient
from test_optics import naive_theil_sen
from thermal_synth import run

DAY = 86400.0
NOISE_DB = 0.05  # the simulator's DOM RX power noise (simulator/params.py rx_noise_db)


def days_of_frames(days: float, rx_of_t, temp_of_t=lambda t: 40.0, step_s: float = 300.0, seed: int = 3):
    """One optic row per ``step_s`` for link 0's two ends: end a healthy at -2 dBm, end b at ``rx_of_t``."""
    rng = np.random.default_rng(seed)
    for t in np.arange(0.0, days * DAY, step_s):
        rx = np.array([-2.0, rx_of_t(t)]) + NOISE_DB * rng.standard_normal(2)
        yield Frame("optic", [t, t], [0, 1], {"rx_power": rx, "prefec_ber": ber_at(rx),
                                              "module_temp": np.full(2, temp_of_t(t))})


def warnings(found):
    return [f for f in found if f.type == "anomaly" and "at this rate" in f.reason]


def test_a_slow_decline_over_days_gets_the_early_warning_with_its_eta():
    """End b loses 2 dB/day from -1 dBm: its BER reaches the FEC limit when its RX power reaches
    the sensitivity (-6.5 dBm), 2.75 days in. Before, no trend was extrapolated past 6.4 h and a
    32-minute window could not show 2 dB/day through the noise: no warning ever came."""
    rate = 2.0 / DAY
    crossing = (-1.0 - SENSITIVITY_DBM) / rate  # 2.75 days
    det = OpticsDetector(links(1))
    found = run(det, days_of_frames(1.95, lambda t: -1.0 - rate * t))  # one refresh: one warning
    warn = warnings(found)
    assert [w.slot for w in warn] == [1] and warn[0].field == "prefec_ber", warn
    assert not [f for f in found if f.type == "prediction"]
    eta_s = DAY * float(warn[0].reason.split("there in ~")[1].split(" days")[0])
    # the reason rounds to whole days; the state holds the ETA itself
    fitted_crossing = det.s_trend_fit[1, optics.SIG_Q, optics.F_T] + det.s_trend[1, optics.T_ETA_Q]
    assert fitted_crossing == pytest.approx(crossing, abs=0.15 * DAY)
    assert abs(warn[0].ts + eta_s - crossing) <= 0.5 * DAY + 1
    assert det.s_trend_fit[1, optics.SIG_Q, optics.F_SLOPE] * DAY == pytest.approx(-2.0, abs=0.2)


def test_a_flat_noisy_module_over_days_gets_no_warning():
    det = OpticsDetector(links(1))
    assert warnings(run(det, days_of_frames(4.0, lambda t: -3.0))) == []


def test_a_day_night_temperature_cycle_is_no_trend():
    """The module warms 10 C by day and its RX power reading drifts -0.15 dB/C with it."""
    def temp(t):
        return 45.0 + 5.0 * math.sin(2 * math.pi * t / DAY)
    det = OpticsDetector(links(1), min_slope_db_per_day=0.3)
    found = run(det, days_of_frames(4.0, lambda t: -5.0 - 0.15 * (temp(t) - 45.0), temp))
    assert warnings(found) == []


def test_a_silent_ends_eta_leaves_the_eta_gauge_a_window_after_its_last_point():
    """End b falls 1 dB/h toward the FEC limit and stops reporting, with its ETA exported, while end a
    goes on. Before, b's last ETA stayed in ``optic_link_down_eta_seconds`` for as long as a reported
    (frozen: not even counted down)."""
    from test_optics_review import ber_of_margin, frame, one_link
    det = OpticsDetector(one_link())
    window_s = optics.PARAMS["window"] * optics.PARAMS["bucket_s"]
    silent = None  # when b stopped: the first row after 1.5 h at which its ETA was in the gauge
    for t in np.arange(0.0, 5 * 3600, 60.0):
        margin_b = 6.0 - max(0.0, (t - 3600) / 3600)
        rows = [0, 1] if silent is None else [0]
        det.update(frame(t, rows, rx_power=[-1.0, -6.5 + margin_b][:len(rows)],
                         prefec_ber=[1e-12, ber_of_margin(margin_b)][:len(rows)]))
        gauge = det.gauges()["optic_link_down_eta_seconds"][1]
        if silent is None and t >= 1.5 * 3600 and np.isfinite(gauge[1]):
            silent = t
        elif silent is not None and t > silent + window_s + 2 * optics.PARAMS["bucket_s"]:
            assert np.isnan(gauge).all(), (t, gauge)
    assert silent is not None and silent < 2.5 * 3600  # b's trend was exported while it reported


def test_a_replaced_module_does_not_keep_the_old_ones_alarm_thresholds():
    """End b's module said its low RX alarm is -3 dBm; it is swapped (dark 5 min) for one that does not
    report thresholds. Before, the new module kept -3 dBm: at -1.5 dBm with the old one's levels."""
    from test_optics import module_swap
    frames, back = module_swap("los")
    det = OpticsDetector(links(1))
    before = [f for f in frames if f.ts[0] < 3 * 3600]
    for f in before:
        det.update(f)
    det.set_module_thresholds({"n0/gpu0~leaf0#b": {"rx_power_low_alarm": -3.0}})
    run(det, [f for f in frames if f.ts[0] >= 3 * 3600])
    assert math.isnan(det.s_module_alarm[1, optics.M_RX_LOW])  # the parameter: unknown
    # a module that reports its own in its rows after the swap keeps them
    frames, back = module_swap("los")
    det = OpticsDetector(links(1))
    for f in frames:
        if f.ts[0] >= back:
            f = Frame("optic", f.ts, f.slot, {**f.columns, "rx_power_alarm_low": np.array([-20.0, -12.0])})
        elif f.ts[0] < 3 * 3600:
            f = Frame("optic", f.ts, f.slot, {**f.columns, "rx_power_alarm_low": np.array([-20.0, -3.0])})
        det.update(f)
    assert det.s_module_alarm[1, optics.M_RX_LOW] == -12.0 and det.s_module_alarm[0, optics.M_RX_LOW] == -20.0


# ---- the trend's fit against naive references ------------------------------------------------------
@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_trend_close_point_matches_the_naive_references(data):
    """One point closed into a ring with gaps: each signal's fit is ``naive_coefficient`` (module
    temperature) then ``naive_theil_sen`` over the ring's known points, oldest first."""
    size = data.draw(st.sampled_from([8, 24]))
    move = data.draw(st.sampled_from([0.5, 1e9]))  # corrected for temperature, or never
    det = OpticsDetector(links(1), trend_window=size, trend_min_points=4, temp_move_c=move)
    prm = det.params
    point = float(data.draw(st.integers(size, 10 * size)))
    newest = point - data.draw(st.integers(1, 3))  # points skipped since: unknown
    hours = np.arange(point - size + 1, point + 1)
    k = np.arange(size, dtype=float)
    temp = 40.0 + 5.0 * np.sin(k / 3.0) + np.array(data.draw(st.lists(st.floats(-0.3, 0.3), min_size=size,
                                                                      max_size=size)))
    ys = np.empty((N_SIG, size))
    for g in range(N_SIG):
        ys[g] = (-5.0 + data.draw(st.floats(-0.1, 0.1)) * k + data.draw(st.floats(-0.2, 0.2)) * (temp - 40.0)
                 + np.array(data.draw(st.lists(st.floats(-0.05, 0.05), min_size=size, max_size=size))))
    known = np.array([data.draw(st.booleans()) or h == point for h in hours]) & ~((hours > newest) & (hours < point))
    at = (hours % size).astype(int)
    det.s_trend_ring[0, :N_SIG, at] = np.where(known, ys, np.nan).T
    det.s_trend_ring[0, N_SIG, at] = np.where(known, temp, np.nan)
    det.s_trend_ring[0, :, int(point % size)] = 12345.0  # the open point's slot: overwritten by the close
    det.s_trend[0, optics.T_OPEN], det.s_trend[0, optics.T_NEWEST] = point, newest
    for g in range(N_SIG):  # the open point: two bucket means averaged
        det.s_trend_acc[0, 2 * g:2 * g + 2] = (2.0 * ys[g, -1], 2.0)
    det.s_trend_acc[0, 2 * N_SIG:] = (2.0 * temp[-1], 2.0)
    trend_state = (det.s_trend_acc, det.s_trend, det.s_trend_ring, det.s_trend_fit)
    optics._trend_close_point(0, trend_state, det.s_optic, prm, float(det.q_limit[0]), det.s_module_alarm,
                              det._work)
    t = (hours[known] + 0.5) * prm[optics.P_TREND_BUCKET]
    tk = temp[known].astype(np.float32).astype(float)  # the ring is float32
    for g in range(N_SIG):
        y = ys[g, known].astype(np.float32).astype(float)
        got = det.s_trend_fit[0, g]
        if len(y) < 4:
            assert math.isnan(got[optics.F_SLOPE])
            continue
        coef = naive_coefficient(t, tk, y, move, prm[optics.P_TEMP_R2_MAX])
        if not math.isnan(coef):
            y = y - coef * (tk - tk[-1])
        slope, level, agree, scale = naive_theil_sen(t, y)
        assert got[optics.F_SLOPE] == pytest.approx(slope, rel=1e-6, abs=1e-12)
        assert got[optics.F_LEVEL] == pytest.approx(level, rel=1e-6, abs=1e-9)
        assert got[optics.F_CONF] == pytest.approx(max(0.0, 2 * agree - 1) * min(1.0, len(y) / (0.5 * size)))
        assert got[optics.F_T] == t[-1]
    assert det.s_trend[0, optics.T_NEWEST] == point and not det.s_trend_acc[0].any()


# ---- state -----------------------------------------------------------------------------------------
def declining(days: float = 2.6):
    return list(days_of_frames(days, lambda t: -1.0 - 2.0 * t / DAY))


def test_a_state_round_trip_mid_trend_gives_identical_future_output():
    """Saved mid-hour, 1.3 days in: the open point, the hourly ring and the fits all carry on."""
    frames = declining()
    cut = int(1.3 * DAY / 300) + 1  # not on an hour
    a = OpticsDetector(links(1))
    run(a, frames[:cut])
    assert a.s_trend_acc[1, 1] > 0  # an open point half-averaged
    b = OpticsDetector(links(1))
    b.load_state_dict(a.state_dict())
    out_a, out_b = run(a, frames[cut:]), run(b, frames[cut:])
    assert out_a == out_b and warnings(out_a)


def test_a_checkpoint_from_before_the_trend_loads_with_it_empty():
    frames = declining()
    cut = int(1.3 * DAY / 300)
    a = OpticsDetector(links(1))
    run(a, frames[:cut])
    old = {k: v for k, v in a.state_dict().items() if not k.startswith("s_trend")}
    b = OpticsDetector(links(1))
    b.load_state_dict(old)
    assert np.isnan(b.s_trend_ring).all() and np.isinf(b.s_trend[:, optics.T_ETA_Q]).all()
    assert not b.s_trend_acc.any() and np.isnan(b.s_trend[:, optics.T_OPEN]).all()
    # the short window came through; the trend is learnt again from its first day back
    np.testing.assert_array_equal(b.s_ring, a.s_ring)
    later = warnings(run(b, frames[cut:] + list(days_of_frames(1.5, lambda t: -3.6 - 2.0 * t / DAY))))
    assert later and later[0].ts >= frames[cut].ts[0] + (optics.PARAMS["trend_min_points"] - 1) * 3600


def test_a_replaced_module_starts_its_trend_over():
    """End b is swapped at 6 h: its hourly points from before are dropped, end a keeps its own."""
    from test_optics import module_swap
    frames, back = module_swap("los")
    det = OpticsDetector(links(1))
    run(det, frames)
    points_a, points_b = np.isfinite(det.s_trend_ring[:, optics.SIG_RX]).sum(axis=1)
    assert points_a == 7  # hours 0-6 closed; hour 7 open
    assert points_b == 1  # hour 6 had the new module's buckets only from 6:05 on
    assert det.s_trend_ring[1, optics.SIG_RX, 6] == pytest.approx(-1.5, abs=0.05)


# ---- the real Alibaba series -----------------------------------------------------------------------
def test_an_hourly_week_long_window_warns_only_on_its_own_trend(shared_data):
    """With hourly buckets and a 7-day window (as bench/alibaba_optics.py runs the real DWDM series)
    the 3-day early-warning trend is the shorter one: it read a day's wander of ±0.2 dB as weeks to
    the FEC limit, and called ends worsening whose whole series (least squares) is flat or rising."""
    from scipy.special import erfcinv

    from foreshock.streams.alibaba import read_alibaba

    imp = read_alibaba(shared_data / "optics" / "alibaba_prefec_ber.csv")
    frame = imp.batch.to_frame(imp.topology)
    det = OpticsDetector(imp.topology, bucket_s=3600, window=168, min_points=72, horizon_s=7 * DAY,
                         min_slope_db_per_day=0.02, step_min_db=0.5)
    warned = {f.slot for f in warnings(det.update(frame))}
    not_falling = set()
    for o in np.unique(frame.slot):
        mine = frame.slot == o
        q = 20 * np.log10(np.sqrt(2) * erfcinv(2 * frame.columns["prefec_ber"][mine]))
        ok = np.isfinite(q)
        if np.polyfit(frame.ts[mine][ok] / DAY, q[ok], 1)[0] >= 0.0:
            not_falling.add(int(o))
    assert len(not_falling) >= 10
    assert not warned & not_falling, [imp.topology.names("optic")[o] for o in warned & not_falling]
