"""Thermal model detector: kernels vs naive references, physics on synthetic GPUs, real captures."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock import facts
from foreshock.detectors import gpu_inputs as gi
from foreshock.detectors import thermal as th
from foreshock.detectors import thermal_fit as tf
from foreshock.detectors.gpu_inputs import RACK_DAMP, RACK_DAMP_N, new_rack_state, update_rack_inlet
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from naive_refs import branches_seen, run_both
from naive_thermal import NaiveThermal
from test_state_budget_thermal import L1_F_BITS_TS, L1_G_USRC, as_layout1
from thermal_synth import Fault, World, run, small_topology


def preds(findings, event="thermal_throttle", active=True):
    return [f for f in findings if isinstance(f, Prediction) and f.event == event and f.active == active]


# ---- kernels vs naive references ------------------------------------------------------------
def naive_rises(h, lag, b, bdamp, du, damp):
    """The target's settling rises (R drift, inlet) as a first-order lag ``lag`` shows them: delayed by it."""
    lagged = max(h - lag, 0.0)
    return b * bdamp * (1 - math.exp(-lagged / bdamp)) + du * damp * (1 - math.exp(-lagged / damp))


def naive_temp_at(h, temp0, a0, b, bdamp, tau, du, damp, amp, cap):
    """dT/dt = (a0 + rises + min(R·k·(T - temp0), cap) - T) / tau, R·k = 1 - 1/amp, solved piecewise: below the power
    limit the rise is amp times the plain one with time constant amp·tau (rises amplified, delayed by amp·tau); power
    reaches its limit where R·k·(T - temp0) = cap (found from the steady part); from there the plain path toward
    a0 + cap (rises delayed by tau, relaxing from what they had reached); never above the path with power at its limit
    from now (the rises may reach the limit sooner than the steady part)."""
    rk = 1 - 1 / amp
    settle = amp * (a0 - temp0)  # the amplified path's total rise
    at_limit = cap / rk if rk > 0 else math.inf  # the rise that takes power to its limit
    t_lim = amp * tau * math.log(settle / (settle - at_limit)) if settle > at_limit else math.inf
    if h <= t_lim:
        temp = temp0 + settle * (1 - math.exp(-h / (amp * tau))) + amp * naive_rises(h, amp * tau, b, bdamp, du, damp)
    else:
        fade = math.exp(-(h - t_lim) / tau)
        reached = amp * naive_rises(t_lim, amp * tau, b, bdamp, du, damp)
        start = temp0 + at_limit + reached  # where the path is when power reaches its limit
        target = a0 + cap + naive_rises(h, tau, b, bdamp, du, damp)
        temp = target + (start - (a0 + cap + naive_rises(t_lim, tau, b, bdamp, du, damp))) * fade
    if math.isinf(cap):
        return temp
    limited = a0 + cap + (temp0 - a0 - cap) * math.exp(-h / tau) + naive_rises(h, tau, b, bdamp, du, damp)
    return min(temp, limited)


def naive_time_to_limit(temp0, a0, b, bdamp, tau, du, damp, amp, cap, limit, horizon, steps=20000):
    if temp0 >= limit:
        return 0.0
    for k in range(1, steps + 1):
        h = horizon * k / steps
        if naive_temp_at(h, temp0, a0, b, bdamp, tau, du, damp, amp, cap) >= limit:
            return h
    return math.inf


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(temp0=st.floats(20, 95), a0=st.floats(20, 120), b=st.floats(-0.01, 0.01), bdamp=st.floats(60, 1e5),
       tau=st.floats(2, 200), du=st.floats(-0.2, 0.3), damp=st.floats(30, 900), amp=st.floats(1, 1.5),
       cap=st.floats(0, 40))
def test_time_to_limit_matches_dense_search(temp0, a0, b, bdamp, tau, du, damp, amp, cap):
    horizon, limit = 1800.0, 87.0
    args = (temp0, a0, b, bdamp, tau, du, damp, amp, cap)
    got = th.time_to_limit(*args, limit, horizon)
    want = naive_time_to_limit(*args, limit, horizon)
    assert th.temp_at(700.0, *args) == pytest.approx(naive_temp_at(700.0, *args), abs=1e-9)
    if math.isinf(want):
        # the kernel may find a crossing the dense grid steps over only if it is real
        assert math.isinf(got) or naive_temp_at(got, *args) >= limit - 1e-6
    else:
        assert got <= want + horizon / 20000 + 1e-6
        assert naive_temp_at(got, *args) >= limit - 1e-6


@pytest.mark.kernel
def test_time_to_limit_edge_cases():
    assert th.time_to_limit(90.0, 50, 0, 1800, 10, 0, 100, 1, 10, 87, 1800) == 0.0  # already there
    assert math.isinf(th.time_to_limit(50.0, 60, 0, 1800, 10, 0, 100, 1, 10, 87, 1800))  # never
    assert math.isinf(th.time_to_limit(np.nan, 60, 0, 1800, 10, 0, 100, 1, 10, 87, 1800))
    # a steady target above the limit: first-order approach, closed form
    eta = th.time_to_limit(50.0, 100.0, 0.0, 1800.0, 20.0, 0.0, 100.0, 1.0, 100.0, 87.0, 1800.0)
    assert eta == pytest.approx(20.0 * math.log(50 / 13), rel=1e-4)


def naive_holt(xs, dts, tl, ts_):
    level, slope = xs[0], 0.0
    for x, dt in zip(xs[1:], dts):
        pred = level + slope * dt
        new = pred + (1 - math.exp(-dt / tl)) * (x - pred)
        slope = slope + (1 - math.exp(-dt / ts_)) * ((new - level) / dt - slope)
        level = new
    return level, slope


@pytest.mark.kernel
@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=40), st.floats(0.5, 60))
def test_holt_matches_reference(xs, dt):
    cache = tf.new_decay_cache(1)
    assert tf.cached_decay(cache, 0, dt, 30.0) == pytest.approx(math.exp(-dt / 30.0))
    assert tf.cached_decay(cache, 0, dt, 30.0) == pytest.approx(math.exp(-dt / 30.0))  # memoised
    assert tf.cached_decay(cache, 0, 2 * dt, 30.0) == pytest.approx(math.exp(-2 * dt / 30.0))
    level, slope = xs[0], 0.0
    for x in xs[1:]:
        level, slope = tf.holt(level, slope, x, dt, 1 - math.exp(-dt / 30.0), 1 - math.exp(-dt / 90.0))
    want = naive_holt(xs, [dt] * (len(xs) - 1), 30.0, 90.0)
    assert level == pytest.approx(want[0], abs=1e-9)
    assert slope == pytest.approx(want[1], abs=1e-9)


@pytest.mark.kernel
def test_rack_inlet_keeps_latest_and_learns_the_loop_time_constant():
    # a loop settling exponentially (tau 200 s) from 24 to 64 °C, sampled every 10 s
    tau, ts = 200.0, np.arange(0, 1800, 10.0)
    inlet = 64 - 40 * np.exp(-ts / tau)
    obs = np.column_stack([ts, np.zeros_like(ts), inlet, np.full_like(ts, np.nan)])  # [ts, slot, inlet, flow]
    obs[5, 2] = np.nan  # a missing sample is skipped
    state = new_rack_state(1)
    update_rack_inlet(np.ascontiguousarray(obs), state)
    assert state[0, 1] == pytest.approx(inlet[-1])
    assert state[0, RACK_DAMP_N] >= 4
    assert state[0, RACK_DAMP] == pytest.approx(tau, rel=0.05)
    # a flat inlet teaches nothing
    flat = new_rack_state(1)
    update_rack_inlet(np.ascontiguousarray(np.column_stack([ts, np.zeros_like(ts), np.full_like(ts, 24.0),
                                                            np.full_like(ts, 1.2)])), flat)
    assert flat[0, RACK_DAMP_N] == 0 and np.isnan(flat[0, RACK_DAMP])


@pytest.mark.kernel
def test_fit_recovers_resistance_and_time_constant():
    """Against the model itself: a GPU stepping between powers converges to its R and tau."""
    topo = small_topology(nodes=1, gpus=1, racks=1)
    det = th.ThermalDetector(topo)
    r_true, tau_true, inlet, temp = 0.05, 25.0, 24.0, 40.0
    for k, t in enumerate(np.arange(0, 3600, 5.0)):
        power = 650.0 if (k // 60) % 2 == 0 else 350.0  # steps every 5 minutes
        temp = inlet + r_true * power + (temp - inlet - r_true * power) * math.exp(-5 / tau_true)
        det.update(Frame("rack", [t], [0], {"inlet_temp": [inlet]}))
        det.update(Frame("gpu", [t], [0], {"gpu_temp": [temp], "power": [power]}))
    core = tf.G_SIZE + tf.CORE * tf.M_SIZE
    assert det.s_model[0, core + tf.M_RL] == pytest.approx(r_true, rel=0.02)
    assert det.s_model[0, core + tf.M_TAU] == pytest.approx(tau_true, rel=0.25)


@pytest.mark.kernel
def test_streaming_equals_batch_replay():
    """One frame per tick or the whole run as one frame: the same predictions."""
    topo = small_topology(nodes=2, gpus=4, racks=1)
    world = World(topo, faults=[Fault("tim_degradation", 1, 1800, 1.0)], seed=3)
    frames, _ = world.run(3 * 3600)
    per_tick = run(th.ThermalDetector(topo), frames)
    rack = Frame.concat([f for f in frames if f.kind == "rack"])
    gpu = Frame.concat([f for f in frames if f.kind == "gpu"])
    # batch: racks first would leak the future inlet; interleave per tick as the harness does
    det = th.ThermalDetector(topo)
    batch = []
    for t in np.unique(gpu.ts):
        det.update(rack.take(rack.ts == t))
        batch += det.update(gpu.take(gpu.ts == t))
    assert per_tick == batch
    assert preds(per_tick)


def naive_trend(samples, window_s, smooth_s):
    """Reference for ``observe_trend``: per sample ``(ts, dt, r, tau)`` the smoothed R and its rate
    from the checkpoint taken W/2..W ago (W = max(window_s, 3 tau)); NaN r or dt restarts."""
    out, rs, points = [], None, []  # points: checkpoints (ts, rs), newest last
    for ts, dt, r, tau in samples:
        if math.isnan(r) or math.isnan(dt):
            rs, points = None, []
            out.append((math.nan, math.nan))
            continue
        rs = r if rs is None else rs + (1 - math.exp(-dt / smooth_s)) * (r - rs)
        half = max(window_s, 3 * tau) / 2
        if not points or ts - points[-1][0] >= half:
            points.append((ts, rs))
        older = points[:-1]
        out.append((rs, (rs - older[-1][1]) / (ts - older[-1][0]) if older else math.nan))
    return out


@pytest.mark.kernel
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 120), st.one_of(st.floats(0.03, 0.2), st.just(math.nan), st.just(0.05)),
                          st.floats(5, 400), st.booleans()), max_size=120),
       st.floats(60, 900), st.floats(5, 300))
def test_observe_trend_matches_reference(steps, window_s, smooth_s):
    params = tf.params_vector({"trend_window_s": window_s, "trend_smooth_s": smooth_s})
    fc = th.new_forecast_state(2)
    f = th.F_MODEL0 + th.HBM * th.F_MODEL_SIZE
    ts, samples = 1e9, []
    for dt, r, tau, gap in steps:
        ts += dt
        samples.append((ts, math.nan if gap else dt, r, tau))
    want = naive_trend(samples, window_s, smooth_s)
    for (t, dt, r, tau), (w_rs, w_rate) in zip(samples, want):
        rs, rate = th.observe_trend(fc, 1, f, t, 1 - math.exp(-dt / smooth_s), r, tau, params)
        assert rs == pytest.approx(w_rs, rel=1e-9, nan_ok=True)
        assert rate == pytest.approx(w_rate, rel=1e-6, abs=1e-15, nan_ok=True)
    assert np.isnan(fc[0, th.F_MODEL0:th.F_HELD_SINCE]).all()  # GPU 0 untouched


@pytest.mark.kernel
def test_observe_trend_sees_a_ramp_and_forgets_a_step():
    params = tf.params_vector({})
    ramp, step = th.new_forecast_state(1), th.new_forecast_state(1)
    f = th.F_MODEL0
    for k in range(1, 200):
        t = 10.0 * k
        w = 1 - math.exp(-10.0 / params[tf.P_TREND_SMOOTH])
        _, ramp_rate = th.observe_trend(ramp, 0, f, t, w, 0.046 + 1e-6 * t, 30.0, params)
        _, step_rate = th.observe_trend(step, 0, f, t, w, 0.046 if t < 600 else 0.1, 30.0, params)
        if t == 700.0:
            assert step_rate > 1e-5  # while the step is in the window, it shows
    assert ramp_rate == pytest.approx(1e-6, rel=0.02)
    assert abs(step_rate) < 1e-9  # a window after the step (and its smoothing): flat
    rs, rate = th.observe_trend(step, 0, f, 2000.0, 0.1, math.nan, 30.0, params)  # idle: restart
    assert math.isnan(rs) and math.isnan(rate)


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(st.floats(0.02, 0.2), st.floats(-1e-4, 1e-4), st.one_of(st.floats(0.02, 0.2), st.just(math.nan)),
       st.one_of(st.floats(-1e-4, 1e-4), st.just(math.nan)), st.floats(0, 1e-4), st.floats(50, 800),
       st.floats(0, 300), st.floats(0, 5))
def test_confirmed_resistance_matches_reference(rl, rb, r_seen, rate, noise, pref, lag_s, slack_c):
    params = tf.params_vector({})
    confirm = params[tf.P_TREND_CONFIRM]
    got_rl, got_rb = th.confirmed_resistance(rl, rb, (r_seen, rate), noise, pref, lag_s, slack_c, params)
    rising = max(rate - noise, 0.0) if not math.isnan(rate) else 0.0
    want_rb = min(rb, confirm * rising) if rb > 0 else rb
    want_rl = rl if math.isnan(r_seen) else min(rl, r_seen + rising * lag_s + slack_c / pref)
    assert got_rb == pytest.approx(want_rb, abs=1e-15)
    assert got_rl == pytest.approx(want_rl, rel=1e-12)
    assert got_rl <= rl and got_rb <= max(rb, 0.0) + 1e-18  # it only ever holds the forecast back


# ---- behaviour on synthetic GPUs --------------------------------------------------------------
def test_tim_degradation_predicted_well_ahead_and_only_on_that_gpu():
    topo = small_topology()
    world = World(topo, faults=[Fault("tim_degradation", 5, 1800, 0.6, "f1")], seed=1)
    frames, events = world.run(5 * 3600)
    found = run(th.ThermalDetector(topo), frames)
    onset = next(e.time for e in events if e.type == "thermal_throttle_start")
    first = preds(found)
    assert {p.slot for p in first} == {5}
    assert onset - first[0].ts >= 300  # at least five minutes of warning
    assert first[0].eta_s > 0 and 0 < first[0].confidence <= 1
    assert "R 0.0" in first[0].reason and "inlet" in first[0].reason


def test_a_low_power_board_is_fitted_and_its_tim_degradation_predicted():
    """A 70-W board (a T4, an L4) working at 60 W: the fit's least power under load scales with the
    enforced limit (until 2026-12-06 it was 200 W on any board: never loaded, its R never fitted, its
    throttle never predicted — the one real dcgm-exporter scrape shipped is a T4's)."""
    topo = small_topology()
    world = World(topo, faults=[Fault("tim_degradation", 5, 1800, 0.6, "f1")], seed=1, load_w=60.0,
                  power_limit_w=70.0, r_core=0.75, r_hbm=0.3, power_noise_w=1.0)
    frames, events = world.run(5 * 3600)
    onset = next(e.time for e in events if e.type == "thermal_throttle_start")
    first = preds(run(th.ThermalDetector(topo), frames))
    assert {p.slot for p in first} == {5}
    assert onset - first[0].ts >= 300  # at least five minutes of warning, as on a 700-W board


def test_an_hbm_heading_for_its_limit_is_a_thermal_throttle_on_its_way():
    """NVML's SW thermal slowdown holds the memory under its max operating temperature (95 °C) as
    well as the die under its own, so a GPU whose HBM cooling path degrades throttles with its core
    far from 87 °C (seeds 811-818: 16 of 17 such throttles were missed as thermal throttles while
    the same GPUs' hbm_overheat was called ~22 min ahead). The thermal_throttle prediction follows the
    HBM's forecast there, minutes ahead, and says why; hbm_overheat comes from the same forecast."""
    topo = small_topology()
    world = World(topo, faults=[Fault("hbm_degradation", 5, 1800, 2.0, "f1")], seed=1)
    frames, events = world.run(3 * 3600)
    onset = next(e.time for e in events if e.type == "thermal_throttle_start")
    core_at_onset = next(f.columns["gpu_temp"][5] for f in frames if f.kind == "gpu" and f.ts[5] >= onset)
    assert core_at_onset < 80.0  # the core is nowhere near its own limit
    found = run(th.ThermalDetector(topo), frames)
    first = preds(found)
    assert {p.slot for p in first} == {5}
    assert onset - first[0].ts >= 300  # at least five minutes of warning
    assert first[0].reason.startswith("HBM heading for its limit 95 °C"), first[0].reason
    assert "SW thermal limiter cuts clocks to hold the memory" in first[0].reason
    # its R against the HBM's own nominal (0.027 °C/W), not the die's
    r, pct = re.search(r"R ([\d.]+) °C/W \(([+-]\d+)% vs nominal\)", first[0].reason).groups()
    assert int(pct) == pytest.approx(100 * (float(r) / facts.HBM_THERMAL_RESISTANCE_C_PER_W - 1), abs=1)
    assert abs(first[0].ts + first[0].eta_s - onset) <= 600  # the ETA points at the onset
    hbm = preds(found, "hbm_overheat")
    assert hbm and hbm[0].slot == 5 and hbm[0].ts == first[0].ts and hbm[0].eta_s == first[0].eta_s


HW_SLOWDOWN_ETA = re.compile(r"reaches HW slowdown (\d+) °C \(clocks cut >= 2x\) in ([\d.]+) min")


def test_a_core_prediction_says_when_the_hw_slowdown_temperature_comes(monkeypatch):
    """The issue asks for the time until max operating (the prediction's ETA) *and* until HW
    slowdown. In a world whose GPUs have no SW thermal limiter, a failing interface takes the die
    through 87 °C and, 400 s later, 89 °C: the last predictions before the 87 °C crossing put the
    89 °C one where it happened, minutes after their own ETA."""
    topo = small_topology()
    monkeypatch.setattr(facts, "MAX_OPERATING_TEMP_C", 200.0)  # the world's limiter never engages
    world = World(topo, faults=[Fault("tim_degradation", 5, 1800, 0.6, "f1")], seed=1)
    frames, _ = world.run(5 * 3600)
    monkeypatch.undo()
    temps = [(float(f.ts[5]), float(f.columns["gpu_temp"][5])) for f in frames if f.kind == "gpu"]
    t87 = next(t for t, temp in temps if temp >= 87.0)
    t89 = next(t for t, temp in temps if temp >= 89.0)
    assert t89 - t87 >= 300.0
    last = [p for p in preds(run(th.ThermalDetector(topo), frames)) if p.slot == 5 and p.ts < t87][-3:]
    assert len(last) == 3
    for p in last:
        m = HW_SLOWDOWN_ETA.search(p.reason)
        assert m and m.group(1) == "89", p.reason
        eta_hw = float(m.group(2)) * 60.0
        assert eta_hw - p.eta_s >= 240.0
        assert abs(p.ts + eta_hw - t89) <= 60.0
    assert th.hw_slowdown_text(np.inf, 89.0) == "; at today's power it stays under HW slowdown 89 °C within the horizon"


def cooling_loss_frames(idle_from: float | None, reasons: bool = True):
    """Rack 1's loop settles +30 °C with a 180 s time constant from t = 1 h (its GPUs heading for
    the limit; the synthetic inlet settles instead of ramping forever); from
    ``idle_from`` s on, rack 1's GPUs report the idle bit (their job stopped) and no utilisation.
    Without ``reasons`` no throttle reasons are reported (dcgm-exporter's default counters)."""
    topo = small_topology()
    world = World(topo, faults=[Fault("cooling_loss", 1, 3600, 30 / 180, "f2")], seed=2)
    frames, _ = world.run(2 * 3600)
    rack1 = np.flatnonzero(topo.gpu_rack == 1)
    for f in frames:
        t = f.ts[0] - world.t0
        if f.kind == "rack":
            f.columns["inlet_temp"][1] = 24.0 + (30 * (1 - math.exp(-(t - 3600) / 180)) if t >= 3600 else 0.0)
        else:
            if idle_from is not None and t >= idle_from:
                bits = f.columns["throttle_reasons"]
                bits[rack1] = bits[rack1].astype(np.int64) | facts.THROTTLE_IDLE
                f.columns["util"][rack1] = 0.0
            if not reasons:
                f.columns["throttle_reasons"][:] = np.nan
    return topo, world, frames


def test_cooling_loss_predicted_for_the_rack_and_not_elsewhere():
    topo, _, frames = cooling_loss_frames(idle_from=None)
    slots = {p.slot for p in preds(run(th.ThermalDetector(topo), frames))}
    assert slots and all(topo.gpu_rack[s] == 1 for s in slots)


@pytest.mark.parametrize("reasons", [True, False])
def test_an_idle_gpu_is_not_predicted_to_throttle(reasons):
    """No work scheduled (bit 0x1; without throttle reasons, as dcgm-exporter's default counters,
    no utilisation): the SW thermal slowdown has nothing to slow, so a GPU whose job stopped is
    not predicted however hot its coolant gets (seed 779: GPUs idled by a crashed job member, on
    a loop losing its flow, were called and peaked at 79 °C)."""
    topo, _, frames = cooling_loss_frames(idle_from=None, reasons=reasons)
    assert {p.slot for p in preds(run(th.ThermalDetector(topo), frames))}  # the case is real
    topo, _, frames = cooling_loss_frames(idle_from=3000, reasons=reasons)
    assert not preds(run(th.ThermalDetector(topo), frames))


def test_a_prediction_is_withdrawn_once_its_gpu_has_idled_for_off_hold():
    topo, world, frames = cooling_loss_frames(idle_from=None)
    first = min(p.ts for p in preds(run(th.ThermalDetector(topo), frames))) - world.t0
    idle_from = first + 30  # the job stops right after the first prediction
    topo, world, frames = cooling_loss_frames(idle_from=idle_from)
    found = run(th.ThermalDetector(topo), frames)
    started = {p.slot for p in preds(found)}
    withdrawn = {p.slot: p.ts - world.t0 for p in preds(found, active=False)}
    assert started and started <= set(withdrawn)
    hold = th.PARAMS["off_hold_s"]
    assert all(hold <= w - idle_from <= hold + 2 * world.interval for w in withdrawn.values())


def fan_failure_frames(factor: float, hours: float = 2.0, seed: int = 0):
    """A node whose fans stop at t = 1 h (R of all 8 GPUs x ``factor`` within a minute), then
    sits on a plateau; power has a training rhythm and leakage, readings are integers."""
    topo = small_topology(nodes=1, gpus=8, racks=1)
    rng = np.random.default_rng(seed)
    r0 = 0.046 * (1 + 0.03 * rng.standard_normal(8))
    base = 500.0 * (1 + 0.02 * rng.standard_normal(8))
    temp, energy, frames = 22.0 + r0 * base, np.zeros(8), []
    for t in np.arange(0.0, hours * 3600, 10.0):
        r = r0 * (1 + (factor - 1) * min(max(t - 3600, 0.0) / 60.0, 1.0))
        power = base * (1 + 0.03 * math.sin(2 * math.pi * t / 150)) + 2.5 * (temp - 45.0)
        target = 22.0 + r * power
        temp = target + (temp - target) * math.exp(-10 / 30)
        energy += power * 10
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [22.0]}))
        frames.append(Frame("gpu", np.full(8, t), np.arange(8), {
            "gpu_temp": np.round(temp), "power": power + 3 * rng.standard_normal(8), "energy": energy.copy()}))
    return topo, frames, temp


def test_a_fan_failure_step_that_plateaus_below_the_limit_predicts_nothing():
    """R doubles in a minute (44 -> ~74 °C) and stays: the temperature goes flat, 12 °C under
    the limit. The fit's R trend lags the step and would extrapolate it for half an hour; the
    forecast extrapolates only what the temperature confirms."""
    topo, frames, temp = fan_failure_frames(2.0)
    assert 68 < temp.min() and temp.max() < 80
    det = th.ThermalDetector(topo)
    assert not preds(run(det, frames))
    core = tf.G_SIZE + tf.CORE * tf.M_SIZE
    assert np.all(det.s_model[:, core + tf.M_RL] > 0.085)  # the fit did see R double


def test_a_plateau_just_under_the_limit_is_not_called_on_reading_noise():
    """Fans fail and the node's GPUs settle 2-6 °C under the limit. Their readings scatter (a
    training rhythm, integer degrees), so the R rate seen over a few minutes wobbles up and down
    by about as much as a failing interface drifts; confirmed as a trend and extrapolated for half
    an hour it called several of them. Only a rise above what the scatter can show counts."""
    topo, frames, temp = fan_failure_frames(2.25, hours=3.0, seed=0)
    assert 78 < temp.min() and temp.max() < 85  # on the plateau, the rhythm's swing is ~±1.5 °C
    assert preds(run(th.ThermalDetector(topo, trend_noise=0.0), frames))  # the case is real
    assert not preds(run(th.ThermalDetector(topo), frames))


def test_healthy_and_idle_gpus_predict_nothing():
    topo = small_topology()
    world = World(topo, idle_gpus=(0, 1, 2), seed=4)
    frames, events = world.run(4 * 3600)
    assert not [e for e in events if e.type.startswith("thermal")]
    assert not preds(run(th.ThermalDetector(topo), frames))


def test_the_gpus_own_slowdown_temperature_sets_the_limit():
    """A GPU reporting slowdown_temp 80 °C has max operating 78 °C: a GPU settling at 82 °C
    is predicted to throttle, while with the 87 °C default it is not."""
    topo = small_topology(nodes=1, gpus=2, racks=1)
    world = World(topo, load_w=650.0, inlet_c=52.0, seed=5)
    frames, _ = world.run(3600, slowdown_temp=80.0)
    found = run(th.ThermalDetector(topo), frames)
    assert preds(found)
    assert "limit 78" in preds(found)[0].reason
    assert "HW slowdown 80 °C" in preds(found)[0].reason  # its own slowdown temperature, not 89
    for f in frames:
        if f.kind == "gpu":
            f.columns["slowdown_temp"][:] = np.nan
    assert not preds(run(th.ThermalDetector(topo), frames))


def test_prediction_refreshes_at_most_every_minute_and_withdraws():
    topo = small_topology(nodes=1, gpus=1, racks=1)
    world = World(topo, load_w=650.0, seed=6, faults=[Fault("tim_degradation", 0, 600, 1.0)])
    frames, _ = world.run(3 * 3600)
    det = th.ThermalDetector(topo)
    found = run(det, frames[:720])  # the first hour: the prediction starts and is refreshed
    idle = []  # then the job stops: the GPU idles and the prediction is withdrawn
    for f in frames[720:1080]:
        if f.kind == "gpu":
            f = Frame("gpu", f.ts, f.slot, {**f.columns, "power": np.full(len(f), 80.0),
                                           "energy": np.full(len(f), np.nan), "gpu_temp": np.full(len(f), 30.0)})
        idle.append(f)
    later = run(det, idle)
    active = preds(found)
    assert active and active[0].active
    assert (np.diff([p.ts for p in active]) >= 60).all()
    withdrawn = preds(later, active=False)
    assert len(withdrawn) == 1 and withdrawn[0].ts > active[-1].ts
    assert not preds(later)


def test_state_round_trip_gives_identical_future_output():
    topo = small_topology()
    world = World(topo, faults=[Fault("tim_degradation", 2, 900, 1.0)], seed=7)
    frames, _ = world.run(3 * 3600)
    half = len(frames) // 2
    a = th.ThermalDetector(topo)
    run(a, frames[:half])
    b = th.ThermalDetector(topo)
    b.load_state_dict(a.state_dict())
    rest_a, rest_b = run(a, frames[half:]), run(b, frames[half:])
    assert rest_a == rest_b and preds(rest_a)
    assert a.state_nbytes() / topo.size("gpu") <= 1024


def test_bad_input_is_counted_not_fatal():
    topo = small_topology(nodes=1, gpus=2, racks=1)
    health = PipelineHealth()
    det = th.ThermalDetector(topo, health=health)
    det.update(Frame("gpu", [10.0, 10.0], [0, 7], {"gpu_temp": [50.0, 50.0], "power": [600.0, 600.0]}))
    det.update(Frame("gpu", [5.0], [0], {"gpu_temp": [50.0], "power": [600.0]}))  # out of order
    det.update(Frame("gpu", [20.0], [1], {"gpu_temp": [np.nan], "power": [np.inf]}))
    det.update(Frame("rack", [20.0], [3], {"inlet_temp": [24.0]}))
    reasons = {r for (_, r) in health.problems}
    assert any("unknown slot" in r for r in reasons) and any("out of time order" in r for r in reasons)
    with pytest.raises(ValueError, match="unknown parameters"):
        th.ThermalDetector(topo, horizon=5)


# ---- real captures: steady load predicts nothing -------------------------------------------------
def dmon_rows(text: str, section: str) -> list[dict[str, float]]:
    """Minimal reader of the ``dmon`` block under ``# <section> :: dmon`` (gpu pwr gtemp mtemp ...)."""
    block = text.split(f"# {section} :: dmon", 1)[1].split("\n\n", 1)[0]
    header = next(line for line in block.splitlines() if line.startswith("# gpu")).lstrip("# ").split()
    rows = []
    for line in block.splitlines():
        if re.match(r"^\s+\d", line):
            rows.append({k: float(v) for k, v in zip(header, line.split()) if v != "-"})
    return rows


@pytest.mark.parametrize("capture", ["linux-x86_64__nvidia-h200__590.48.01.txt",
                                     "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"])
def test_real_nvidia_smi_capture_under_load_predicts_nothing(shared_data, capture):
    text = (shared_data / "nvidia-smi" / capture).read_text()
    rows = dmon_rows(text, "load")
    assert len(rows) == 5 and rows[0]["pwr"] > 600  # gpu-burn at ~630 W
    topo = Topology.from_gpu_hosts([("host", 0)])
    det = th.ThermalDetector(topo)
    found = []
    for k, r in enumerate(rows):
        found += det.update(Frame("gpu", [1.7e9 + k], [0], {
            "gpu_temp": [r["gtemp"]], "hbm_temp": [r["mtemp"]], "power": [r["pwr"]],
            "sm_clock": [r["pclk"] * 1e6]}))
    assert found == []


def test_gauges_export_the_fitted_resistance():
    topo = small_topology(nodes=1, gpus=2, racks=1)
    det = th.ThermalDetector(topo)
    frames, _ = World(topo, seed=9).run(1800)
    run(det, frames)
    kind, r, _ = det.gauges()["thermal_resistance_celsius_per_watt"]
    assert kind == "gpu" and r.shape == (2,)
    assert np.all(np.abs(r / 0.046 - 1) < 0.12)  # the synthetic GPUs' R, within their spread


def failing_loop(with_flow: bool, floor: float = 0.06, hours: float = 2.0, ramp_s: float = 900.0):
    """A CDU losing flow from t = 1 h (1.2 -> floor over ``ramp_s``); the inlet follows the heat
    balance (20 + 4 * 1.2 / flow) with the loop's 180 s lag; one GPU at 650 W, R 0.046."""
    topo = small_topology(nodes=1, gpus=1, racks=1)
    frames, inlet, temp, first = [], 24.0, 54.0, None
    for t in np.arange(0.0, hours * 3600, 10.0):
        flow = 1.2 - (1.2 - floor * 1.2) * min(max(t - 3600, 0) / ramp_s, 1.0)
        inlet += (20 + 4 * 1.2 / flow - inlet) * (1 - math.exp(-10 / 180))
        target = inlet + 0.046 * 650
        temp = target + (temp - target) * math.exp(-10 / 10)
        if temp >= 87 and first is None:
            first = t
        cols = {"inlet_temp": [round(inlet, 1)]}
        if with_flow:
            cols["coolant_flow"] = [round(flow, 3)]
        frames.append(Frame("rack", [t], [0], cols))
        frames.append(Frame("gpu", [t], [0], {"gpu_temp": [round(min(temp, 87.5))], "power": [650.0]}))
    return topo, frames, first


def test_coolant_flow_loss_is_predicted_before_the_inlet_moves():
    topo, frames, throttle = failing_loop(with_flow=True)
    assert throttle is not None
    lead_flow = throttle - preds(run(th.ThermalDetector(topo), frames))[0].ts
    _, frames, _ = failing_loop(with_flow=False)
    lead_inlet = throttle - preds(run(th.ThermalDetector(topo), frames))[0].ts
    assert lead_flow >= 300 and lead_flow > lead_inlet + 60


@pytest.mark.parametrize("ramp_s", [900.0, 2700.0])
def test_a_slow_severe_flow_loss_is_predicted_five_minutes_ahead(ramp_s):
    """A filter clogging over 45 minutes falls under 1 % of its flow a sample: the inlet, lagging
    it, looks settled a sample after each window starts. The rise must not be learnt there (it
    would be the lagging inlet's, far under the loop's, and forecast the loop cool)."""
    topo, frames, throttle = failing_loop(with_flow=True, hours=2.5, ramp_s=ramp_s)
    assert throttle is not None
    det = th.ThermalDetector(topo)
    first = preds(run(det, frames))[0]
    assert throttle - first.ts >= 300


def two_failing_loops(first_rise: float):
    """Rack 1's CDU loses flow at t = 3 h as in :func:`failing_loop` (its GPU throttles). Rack 0's
    lost flow at t = 1 h and settled at a coolant rise of ``first_rise`` °C per unit of baseline
    flow (4: as rack 1's; less: the rise it shows with its GPUs throttled, their heat cut)."""
    topo = small_topology(nodes=2, gpus=1, racks=2)
    frames, inlet, temp, first = [], np.array([24.0, 24.0]), 54.0, None
    for t in np.arange(0.0, 4 * 3600, 10.0):
        flow = 1.2 - 1.2 * 0.94 * np.clip((t - np.array([3600.0, 3 * 3600.0])) / 900, 0.0, 1.0)
        rise = np.array([first_rise, 4.0])
        inlet += (20 + rise * 1.2 / flow - inlet) * (1 - math.exp(-10 / 180))
        target = inlet[1] + 0.046 * 650
        temp = target + (temp - target) * math.exp(-10 / 10)
        if temp >= 87 and first is None:
            first = t
        frames.append(Frame("rack", [t, t], [0, 1], {"inlet_temp": np.round(inlet, 1),
                                                    "coolant_flow": np.round(flow, 3)}))
        frames.append(Frame("gpu", [t, t], [0, 1], {"gpu_temp": [45.0, round(min(temp, 87.5))],
                                                    "power": [100.0, 650.0]}))
    return topo, frames, first


def test_a_rise_learnt_on_a_throttled_loop_does_not_delay_the_next_loss():
    """Where a loss settled with its GPUs throttled, the loop carried less heat: the coolant rise
    learnt there is below the rise at full heat. Taken as the site's rise, it would forecast the
    next loop's inlet too low and warn later."""
    leads, learnt = {}, {}
    for first_rise in (4.0, 1.5):  # rack 0 settled at full heat / with its heat cut
        topo, frames, throttle = two_failing_loops(first_rise)
        det = th.ThermalDetector(topo)
        for frame in frames:
            if frame.ts[0] == 3 * 3600:
                learnt[first_rise] = det.params[tf.P_SITE_RISE]
            found = [p for p in preds(det.update(frame)) if p.slot == 1]
            if found:
                leads[first_rise] = throttle - found[0].ts
                break
    assert learnt[4.0] == pytest.approx(4.0, abs=0.2) and learnt[1.5] == pytest.approx(1.5, abs=0.2)
    assert leads[4.0] >= 240 and leads[1.5] >= leads[4.0] - 10


def test_a_loop_time_constant_learnt_on_the_first_loss_does_not_delay_the_second():
    """Rack 0's loss teaches the site its loop time constant (180 s here, against the 240 s
    prior). It sets how fast the inlet approaches where the flow settles it; the falling flow is
    carried as far ahead as before. Tied together, the second loss was called a minute later
    (the simulated seeds 784/786: median lead 300 s, 4.7 min on every second loss)."""
    topo, frames, throttle = failing_loop(with_flow=True)  # the same loss, on a loop not yet learnt
    lead_first = throttle - preds(run(th.ThermalDetector(topo), frames))[0].ts
    topo, frames, throttle = two_failing_loops(4.0)
    det = th.ThermalDetector(topo)
    lead_second = throttle - [p for p in preds(run(det, frames)) if p.slot == 1][0].ts
    assert det.params[tf.P_SITE_DAMP] == pytest.approx(180.0, rel=0.15)  # learnt, under the prior
    assert lead_second >= 300 and lead_second >= lead_first - 20


@pytest.mark.parametrize("floor", [0.06, 0.08, 0.1])
def test_a_severe_flow_loss_is_predicted_five_minutes_ahead(floor):
    topo, frames, throttle = failing_loop(with_flow=True, floor=floor)
    assert throttle is not None
    found = preds(run(th.ThermalDetector(topo), frames))
    assert found and throttle - found[0].ts >= 300


# Flow falling at the same pace reads the same at 0.3 of baseline whether it stops at 0.2 or at
# 0.06; the five minutes' lead on the severe loss above needs the fall carried ahead (flow_carry_s:
# the forecast reaches the limit when the carried flow is ~0.11 of baseline), and with it
# a loss that stops at 0.12-0.25 is called too (seed 791's random loss stopped at 0.099, 38 of its
# loop's 128 GPUs settling 2-3 °C under the limit): shortening the carry enough to spare them costs
# the severe loss ~2 min of lead (and the simulated seeds their 5-min median lead). An operator
# who prefers the other side sets flow_plan_floor (the test below); predictions say which claims
# hinge on the flow falling further (the test after it).
TRADE_OFF = pytest.mark.xfail(strict=True, reason="falling flow carried ahead: lead vs mild floors")


@pytest.mark.parametrize("floor", [pytest.param(0.12, marks=TRADE_OFF), pytest.param(0.15, marks=TRADE_OFF),
                                   pytest.param(0.2, marks=TRADE_OFF), pytest.param(0.25, marks=TRADE_OFF),
                                   0.3, 0.4])
def test_a_mild_flow_loss_predicts_nothing(floor):
    topo, frames, throttle = failing_loop(with_flow=True, floor=floor)  # settles >= 17 °C under the limit
    assert throttle is None
    assert not preds(run(th.ThermalDetector(topo), frames))


def test_a_planning_floor_spares_losses_that_stop_above_it_and_warns_later():
    """``flow_plan_floor``: the falling flow is carried no lower than this share of baseline —
    the operator's side of the trade-off above (no false statement on losses that stop above the
    floor, a later warning on those that go below it)."""
    for floor in (0.12, 0.15, 0.2, 0.25):
        topo, frames, throttle = failing_loop(with_flow=True, floor=floor)
        assert throttle is None and not preds(run(th.ThermalDetector(topo, flow_plan_floor=0.12), frames))
    topo, frames, throttle = failing_loop(with_flow=True, floor=0.06)
    lead = {plan: throttle - preds(run(th.ThermalDetector(topo, flow_plan_floor=plan), frames))[0].ts
            for plan in (0.0, 0.12)}
    assert lead[0.0] >= 300 and 0 < lead[0.12] < lead[0.0] - 120


def test_a_flow_loss_prediction_says_whether_it_hinges_on_the_flow_falling_further():
    """A falling flow is carried ahead, and mid-fall no reading tells where it stops: the reason
    says so, with the flow now and its pace, and says when the die crosses even at today's flow."""
    def flow_share(t):  # failing_loop's flow, as a share of its 1.2 L/s baseline
        return round(1.2 - 1.2 * 0.94 * min(max(t - 3600, 0) / 900, 1.0), 3) / 1.2

    topo, frames, throttle = failing_loop(with_flow=True, floor=0.06)
    found = [p for p in preds(run(th.ThermalDetector(topo), frames)) if p.ts < throttle]
    first, last = found[0], found[-1]
    assert f"coolant flow is at {flow_share(first.ts):.0%} of baseline, falling 6.3%/min" in first.reason
    assert "the ETA assumes it keeps falling: at today's flow the die stays under 87 °C" in first.reason
    assert flow_share(last.ts) < 0.12  # past where the loop's floor decides: it crosses regardless
    assert f"coolant flow is at {flow_share(last.ts):.0%} of baseline" in last.reason
    assert "even at today's flow the die reaches 87 °C in" in last.reason

    topo, frames, throttle = failing_loop(with_flow=True, floor=0.2)  # stops at 0.2: no throttle
    mild = preds(run(th.ThermalDetector(topo), frames))
    assert throttle is None and mild  # still predicted (the trade-off above) ...
    assert all("the ETA assumes it keeps falling" in p.reason for p in mild)  # ... and says on what

    topo, frames, _ = failing_loop(with_flow=False)
    assert all("coolant flow" not in p.reason for p in preds(run(th.ThermalDetector(topo), frames)))


def test_a_job_starting_on_a_loop_that_settled_idle_is_predicted():
    """A loop's jobs stopped before its flow fell: it settles with little heat, and the rise it
    teaches is small. When work lands there, the full heat on the low flow drives the inlet up and
    the GPU throttles within two minutes; the learnt rise must not hide that (seed 805's cdu46 at
    8,192 GPUs). The rack's PDU power says the work came: the learnt rise is scaled by the heat
    now over the heat it was learnt at. (Taking the learnt rise as a floor under the design rise
    caught this too, but over-forecast loops that settled with their GPUs throttled: seed 777,
    1.14 false alarms per 1000 GPU-h.)"""
    from foreshock.detectors import gpu_inputs as gi

    topo = small_topology(nodes=1, gpus=1, racks=1)
    det = th.ThermalDetector(topo)
    inlet, temp, job_start, throttle, found, learnt = 24.0, 54.0, 5700.0, None, [], None
    for t in np.arange(0.0, 3 * 3600, 10.0):
        busy = not 3000.0 <= t < job_start
        flow = 1.2 - (1.2 - 0.072) * min(max(t - 3600, 0) / 900, 1.0)
        heat = 1.0 if busy else 0.15  # an idle loop carries a sixth of its heat
        inlet += (24 + 4 * heat * (1.2 / flow - 1) - inlet) * (1 - math.exp(-10 / 180))
        power = 650.0 if busy else 80.0
        target = inlet + 0.046 * power
        temp = target + (temp - target) * math.exp(-1)
        if t >= job_start and temp >= 87 and throttle is None:
            throttle = t
        if t == job_start:
            learnt = (det.s_rack[0, gi.RACK_RISE], det.s_rack[0, gi.RACK_RISE_N])
        det.update(Frame("rack", [t], [0], {"inlet_temp": [round(inlet, 1)], "coolant_flow": [round(flow, 3)],
                                            "pdu_power": [round(20000 * heat)]}))
        found += preds(det.update(Frame("gpu", [t], [0], {
            "gpu_temp": [round(min(temp, 87.5))], "power": [power], "util": [1.0 if busy else 0.0],
            "throttle_reasons": [0 if busy else 1]})))
    assert learnt[1] >= 3 and learnt[0] < 1.0  # settled idle: a rise of ~0.6 °C learnt, not 4
    assert throttle is not None and job_start < throttle <= job_start + 150
    assert not [p for p in found if p.ts < job_start]  # idle: nothing to slow, nothing predicted
    first = [p for p in found if p.ts >= job_start][0]
    assert first.ts <= job_start + 20 and throttle - first.ts >= 60  # at once, a minute or more ahead


def restored_loop(restore_s: float):
    """A loop loses flow at t = 1 h (1.2 -> 0.072 over 900 s) just as its GPU's job ends, and
    settles with the GPU idle; at t = 2 h the job starts again — the loop's heat with it, so the
    inlet climbs — and ``restore_s`` later the flow comes back: the inlet turns and falls (the
    GPU, close to its limit by then, never reaches it). Returns the topology, frames, the time
    of the restore and the hottest the GPU gets after it."""
    topo = small_topology(nodes=1, gpus=1, racks=1)
    frames, inlet, temp, hottest = [], 24.0, 54.0, 0.0
    t_job, t_back = 2 * 3600.0, 2 * 3600.0 + restore_s
    for t in np.arange(0.0, 2.6 * 3600, 10.0):
        flow = 1.2 if t >= t_back else 1.2 - 1.2 * 0.94 * min(max(t - 3600, 0) / 900, 1.0)
        power = 650.0 if t < 3600 or t >= t_job else 120.0
        heat = (200.0 + power) / 850.0  # the loop's heat: its GPUs and the rest of the rack
        inlet += (20 + 4 * heat * 1.2 / flow - inlet) * (1 - math.exp(-10 / 180))
        target = inlet + 0.046 * power
        temp = target + (temp - target) * math.exp(-10 / 10)
        if t >= t_back:
            hottest = max(hottest, temp)
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [round(inlet, 1)], "coolant_flow": [round(flow, 3)],
                                               "pdu_power": [round(20000 * heat)]}))
        frames.append(Frame("gpu", [t], [0], {"gpu_temp": [round(temp)], "power": [power]}))
    return topo, frames, t_back, hottest


@pytest.mark.parametrize("restore_s", [50.0, 60.0])
def test_a_restored_flow_is_not_read_as_a_rising_inlet(restore_s):
    """Once the flow is back the inlet heads back to where it was before the loss, though its
    own trend still says it is rising (it trails the flow by the loop's lag): a GPU just under
    its limit at that moment is not called on that trend (seed 777: seven such GPUs)."""
    topo, frames, back, hottest = restored_loop(restore_s)
    assert 83.0 < hottest < 87.0  # close to the limit, never at it
    late = [p for p in preds(run(th.ThermalDetector(topo), frames)) if p.ts >= back]
    assert not late


def nominal_rack_state():
    """One rack's inlet state after 10 minutes at 24 °C and a 1.2 L/s coolant flow."""
    from foreshock.detectors import gpu_inputs as gi

    state = gi.new_rack_state(1)
    ts = np.arange(0.0, 600.0, 10.0)
    obs = np.column_stack([ts, np.zeros_like(ts), np.full_like(ts, 24.0), np.full_like(ts, 1.2)])
    gi.update_rack_inlet(np.ascontiguousarray(obs), state)
    return state


@pytest.mark.kernel
def test_a_flow_reading_that_went_dark_stops_driving_the_forecast():
    """A loop loses its flow from 1 h (down to 8 % in 15 min); its flow sensor goes dark at 1 h 20
    (the rack still reports its inlet), and the pump is repaired at 2 h: the inlet is back at
    24 °C within minutes. Until 2026-12-01 the last flow reading, 8 %, held at any age, and the
    GPU was forecast to throttle for as long as the sensor stayed dark (a review found 3,228
    such predictions over 50 GPUs in 1.5 hours of a simulated cooling loss)."""
    topo = small_topology(nodes=1, gpus=1, racks=1)
    frames, inlet, temp = [], 24.0, 54.0
    for t in np.arange(0.0, 4 * 3600, 10.0):
        flow = 1.2 if t >= 7200 else 1.2 - 1.2 * 0.92 * min(max(t - 3600, 0) / 900, 1.0)
        inlet += (20 + 4 * 1.2 / flow - inlet) * (1 - math.exp(-10 / 180))
        target = inlet + 0.046 * 650
        temp = target + (temp - target) * math.exp(-10 / 10)
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [round(inlet, 1)],
                                                "coolant_flow": [round(flow, 3) if t < 4800 else np.nan]}))
        frames.append(Frame("gpu", [t], [0], {"gpu_temp": [round(min(temp, 87.5))], "power": [650.0]}))
    found = preds(run(th.ThermalDetector(topo), frames))
    assert any(p.ts < 7200 for p in found)  # the loss itself is predicted
    assert not [p for p in found if p.ts > 7200 + 1800]


def test_a_state_saved_before_racks_kept_their_flow_time_is_read_on():
    """A checkpoint from before ``RACK_FLOW_TS`` (22 columns per rack) was refused, and every GPU's
    learnt thermal model with it. It loads now, its flow read when its rack last reported, and
    goes on finding what the detector it was saved from finds."""
    from foreshock.detectors import gpu_inputs as gi

    topo = small_topology(nodes=1, gpus=1, racks=1)
    frames, inlet, temp = [], 24.0, 54.0
    for t in np.arange(0.0, 2 * 3600, 10.0):
        flow = 1.2 - 1.2 * 0.92 * min(max(t - 3600, 0) / 900, 1.0)
        inlet += (20 + 4 * 1.2 / flow - inlet) * (1 - math.exp(-10 / 180))
        target = inlet + 0.046 * 650
        temp = target + (temp - target) * math.exp(-10 / 10)
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [round(inlet, 1)], "coolant_flow": [round(flow, 3)]}))
        frames.append(Frame("gpu", [t], [0], {"gpu_temp": [round(min(temp, 87.5))], "power": [650.0]}))
    a = th.ThermalDetector(topo)
    run(a, frames[:700])
    old = a.state_dict()
    old["s_rack"] = old["s_rack"][:, :gi.RACK_FLOW_TS]
    b = th.ThermalDetector(topo)
    b.load_state_dict(old)
    out = run(a, frames[700:])
    assert preds(out) and run(b, frames[700:]) == out


def test_flow_asymptote_after_a_loss_is_the_baseline_until_the_inlet_is_back():
    from foreshock.detectors import gpu_inputs as gi

    state = nominal_rack_state()  # (last read at 590 s: 16 °C in 10 s would be a jump no loop makes)
    gi.update_rack_inlet(np.array([[620.0, 0, 40.0, 0.1]]), state)  # a loss; the inlet 16 °C up
    gi.update_rack_inlet(np.array([[630.0, 0, 41.0, 1.2]]), state)  # flow back, inlet still up
    assert gi.flow_asymptote(state, 0, 4.0, 0.0) == pytest.approx(24.0)  # heading back down
    for t, inlet in ((640.0, 35.0), (650.0, 30.0)):
        gi.update_rack_inlet(np.array([[t, 0, inlet, 1.2]]), state)
    assert state[0, gi.RACK_U0] == pytest.approx(24.0)  # the warm inlet is not the baseline
    gi.update_rack_inlet(np.array([[660.0, 0, 24.5, 1.2]]), state)  # back
    assert np.isnan(gi.flow_asymptote(state, 0, 4.0, 0.0))


@pytest.mark.kernel
def test_flow_asymptote_follows_the_heat_balance():
    from foreshock.detectors import gpu_inputs as gi

    state = nominal_rack_state()
    assert np.isnan(gi.flow_asymptote(state, 0, 4.0, 0.0))  # nominal flow: no asymptote
    assert np.isnan(gi.flow_asymptote(state, -1, 4.0, 0.0))
    later = np.array([[600.0, 0, 24.0, 0.3]])
    gi.update_rack_inlet(later, state)
    assert gi.flow_asymptote(state, 0, 4.0, 0.0) == pytest.approx(24.0 + 4.0 * (1.2 / 0.3 - 1.0))
    # a falling flow is carried over the lag, to at most a fourfold drop
    assert gi.flow_asymptote(state, 0, 4.0, 1e6) == pytest.approx(24.0 + 4.0 * (1.2 / (0.25 * 0.3) - 1.0))
    # ... and no lower than a planning floor (a share of baseline), unless the flow is already lower
    assert gi.flow_asymptote(state, 0, 4.0, 1e6, 0.12) == pytest.approx(24.0 + 4.0 * (1.0 / 0.12 - 1.0))
    assert gi.flow_asymptote(state, 0, 4.0, 1e6, 0.3) == pytest.approx(24.0 + 4.0 * (1.2 / 0.3 - 1.0))
    assert gi.flow_asymptote(state, 0, 4.0, 1e6, 0.5) == pytest.approx(24.0 + 4.0 * (1.2 / 0.3 - 1.0))
    assert gi.site_loop_rise(state) != gi.site_loop_rise(state)  # nothing learnt yet: NaN


@pytest.mark.kernel
def test_a_learnt_rise_is_scaled_by_the_heat_only_when_work_lands_on_the_loop():
    """The coolant rise scales as heat / flow. A rack learns its rise where its loss settles, with
    its heat (PDU power) then; the forecast scales the rise by the heat now only once the heat has
    jumped (new work), not for the tenth or two that leakage adds as a loop warms."""
    from foreshock.detectors import gpu_inputs as gi

    state = gi.new_rack_state(1)

    def feed(t0, t1, inlet, flow, heat):
        ts = np.arange(t0, t1, 10.0)
        gi.update_rack_inlet(np.ascontiguousarray(np.column_stack(
            [ts, np.zeros_like(ts), np.broadcast_to(inlet, ts.shape), np.full_like(ts, flow),
             np.full_like(ts, heat)])), state)
        return t1

    def unscaled():  # the heat balance at the learnt rise, the heat as it was learnt
        return 24.0 + state[0, gi.RACK_RISE] * (1.2 / 0.3 - 1.0)

    t = feed(0.0, 600.0, 24.0, 1.2, 20000.0)
    # the loss settles with the loop idle (a fifth of its heat): 24 + 0.8 * (1.2 / 0.3 - 1) = 26.4 °C;
    # nothing is learnt until the heat has been steady for the loop's lag (the inlet lags it)
    t = feed(t, t + 300.0, 26.4, 0.3, 4000.0)
    assert state[0, gi.RACK_RISE_N] == 0
    t = feed(t, t + 900.0, 26.4, 0.3, 4000.0)
    assert state[0, gi.RACK_RISE_N] >= 3 and state[0, gi.RACK_RISE] == pytest.approx(0.8, rel=0.02)
    assert state[0, gi.RACK_RISE_HEAT] == pytest.approx(4000.0, rel=0.1)
    assert gi.flow_asymptote(state, 0, 4.0, 0.0) == pytest.approx(26.4, abs=0.05)
    t = feed(t, t + 300.0, 26.6, 0.3, 4000.0 * 1.3)  # leakage: 30 % more heat, the rise as learnt
    assert gi.flow_asymptote(state, 0, 4.0, 0.0) == pytest.approx(unscaled())
    # a job starts: five times the heat, and the inlet climbs toward 24 + 0.8 * (5 * 4 - 1) = 39.2
    t = feed(t, t + 60.0, 26.6 + np.arange(6.0), 0.3, 20000.0)
    ratio = state[0, gi.RACK_HEAT] / state[0, gi.RACK_RISE_HEAT]
    assert 3.5 < ratio < 5.0  # the heat is smoothed over tens of seconds, the learnt heat over losses
    hot = 24.0 + state[0, gi.RACK_RISE] * (ratio * 1.2 / 0.3 - 1.0)
    assert hot > 35.0 and gi.flow_asymptote(state, 0, 4.0, 0.0) == pytest.approx(hot)
    gi.update_rack_inlet(np.array([[t, 0, 32.0, 0.3, np.nan]]), state)  # no power reading: the last holds
    assert gi.flow_asymptote(state, 0, 4.0, 0.0) == pytest.approx(hot)
    t = feed(t + 10.0, t + 70.0, 33.0 + np.arange(6.0), 0.3, 400000.0)  # more than any loop's work
    assert gi.flow_asymptote(state, 0, 4.0, 0.0) == pytest.approx(
        24.0 + state[0, gi.RACK_RISE] * (gi.HEAT_RATIO_MAX * 1.2 / 0.3 - 1.0))


@pytest.mark.kernel
def test_a_rise_is_not_learnt_while_the_flow_still_falls():
    """A mild loss's ramp moves the flow under 1 % of its baseline a sample, and the inlet lags
    it by the loop's time constant. A sample after a window starts, both sit within the settled
    bands of that window's start; a rise learnt there is the lagging inlet's (seed 804 at 8,192
    GPUs learnt 1.7 °C, 13 min into the ramp, for a loop whose rise was 3.8 °C)."""
    from foreshock.detectors import gpu_inputs as gi

    state = nominal_rack_state()
    inlet = 24.0

    def step(t, flow):
        nonlocal inlet
        inlet += (24.0 + 4.0 * (1.2 / flow - 1.0) - inlet) * (1.0 - math.exp(-10.0 / 180.0))
        gi.update_rack_inlet(np.array([[t, 0, round(inlet, 1), round(flow, 4)]]), state)

    for t in np.arange(600.0, 1500.0, 10.0):  # 1.2 -> 0.24 over 900 s: 5.3 % of baseline a minute
        step(t, 1.2 * (1.0 - 0.8 * (t - 600.0) / 900.0))
        assert state[0, gi.RACK_RISE_N] == 0, t
    for t in np.arange(1500.0, 3300.0, 10.0):  # the flow holds; the inlet settles at 24 + 4 * 4
        step(t, 0.24)
    assert state[0, gi.RACK_RISE_N] >= 3 and state[0, gi.RACK_RISE] == pytest.approx(4.0, rel=0.05)


def idle_stretch_frames(r_after: float, idle_s: float = 1200.0):
    """One GPU at 650 W (R 0.046) for an hour, idle at 80 W for ``idle_s`` while its interface
    moves to ``r_after`` (a degradation goes on whether the GPU works or not), then at 650 W again
    for 15 minutes; 10 s samples, whole-degree readings. Returns the frames and the resume time."""
    topo = small_topology(nodes=1, gpus=1, racks=1)
    frames, inlet, temp, resume = [], 24.0, 54.0, 3600.0 + idle_s
    for t in np.arange(0.0, resume + 900.0, 10.0):
        busy = not 3600.0 <= t < resume
        power, r = (650.0 if busy else 80.0), (0.046 if t < 3600.0 else r_after)
        target = inlet + r * power
        temp = target + (temp - target) * math.exp(-10 / 10)
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [inlet]}))
        frames.append(Frame("gpu", [t], [0], {"gpu_temp": [round(temp)], "power": [power],
                                              "util": [1.0 if busy else 0.0]}))
    return topo, frames, resume


@pytest.mark.kernel
def test_a_resistance_that_moved_while_the_gpu_idled_is_caught_up_within_minutes():
    """R is fitted only under load. After a long idle it may have moved (seed 805 at 8,192 GPUs,
    node739/gpu0: 0.105 °C/W against a stale 0.046 after 14 idle minutes): the fit catches its
    level up within two minutes of the load coming back, not at the Holt level's pace, and neither
    counts the stale R's misses as its own error (the confidence) nor reads the jump as a drift."""
    core = tf.G_SIZE + tf.CORE * tf.M_SIZE
    topo, frames, resume = idle_stretch_frames(0.075)
    det = th.ThermalDetector(topo)
    seen = {}
    for f in frames:
        det.update(f)
        if f.kind == "gpu" and f.ts[0] in (resume - 10.0, resume + 180.0):
            seen[f.ts[0]] = (det.s_model[0, core + tf.M_RL], det.s_model[0, core + tf.M_RB],
                             th.confidence_of(det.s_model, 0, core, det.params))
    (r0, b0, c0), (r1, b1, c1) = seen[resume - 10.0], seen[resume + 180.0]
    assert r0 == pytest.approx(0.046, rel=0.1)  # (whole-degree readings)
    # caught up: the Holt level alone would have moved 45 % of the way (1 - exp(-180 / 300))
    assert r1 == pytest.approx(0.075, rel=0.06)
    assert c1 >= c0 - 0.05  # the confidence is not lost to the stale R
    # a level caught up, not a trend: the Holt step alone would read the catching up as a drift
    # of ~1.5e-5 °C/W a second (a doubling of R in an hour)
    assert abs(b1 - b0) < 3e-6


def test_a_gpu_back_from_idle_with_its_resistance_unchanged_predicts_nothing():
    topo, frames, resume = idle_stretch_frames(0.046, idle_s=2400.0)
    assert not preds(run(th.ThermalDetector(topo), frames))


# ---- the thermal kernel vs a naive per-sample reference (NaiveThermal: tests/naive_thermal.py) --------
def random_heating_frames(topo, seed, ticks=400):
    """GPUs whose interfaces degrade at different paces (some repaired later), racks whose inlet
    warms, HBM running hot on some, idle stretches (by the idle bit, or by utilisation where no
    reasons are reported), slowdown and max operating temperatures reported or not, late rows and a gap."""
    rng = np.random.default_rng(seed)
    n, n_racks = topo.size("gpu"), topo.size("rack")
    r0 = 0.046 * rng.uniform(0.9, 1.3, n)
    drift = rng.choice([0.0, 0.5, 2.0, 4.0], n) / 3600.0  # R per hour, as a share of nominal
    repair = rng.uniform(1500, 4000, n)
    r_hbm = rng.choice([0.028, 0.1], n, p=[0.7, 0.3])
    warming = rng.uniform(0.0, 0.01, n_racks)
    temp, hbm, t, frames = np.full(n, 40.0), np.full(n, 40.0), 0.0, []
    idle_until = np.zeros(n)
    dark = np.random.default_rng([seed, 7])
    for _ in range(ticks):
        dt = rng.choice([10.0, 5.0, 700.0], p=[0.85, 0.14, 0.01])
        t += dt
        inlet = 24.0 + warming * min(t, 3000.0)
        frames.append(Frame("rack", np.full(n_racks, t), np.arange(n_racks), {"inlet_temp": np.round(inlet, 1)}))
        start_idle = rng.random(n) < 0.004
        idle_until[start_idle] = t + rng.uniform(200, 900, start_idle.sum())
        idle = t < idle_until
        r = np.where(t < repair, r0 + 0.046 * drift * t, r0)
        power = np.where(idle, 80.0, np.where(rng.random(n) < 0.25, 350.0, 680.0) + rng.uniform(-5, 5, n))
        gpu_inlet = inlet[topo.gpu_rack]
        temp = gpu_inlet + r * power + (temp - gpu_inlet - r * power) * math.exp(-dt / 20.0)
        hbm = gpu_inlet + r_hbm * power + (hbm - gpu_inlet - r_hbm * power) * math.exp(-dt / 60.0)
        reasons = np.where(idle, float(facts.THROTTLE_IDLE), np.where(temp >= 85, float(facts.THROTTLE_SW_THERMAL), 0.0))
        # HW slowdown: thermal (0x48), or raised by a power brake (0x88: not a thermal hold)
        reasons[rng.random(n) < 0.02] = rng.choice([0x48, 0x88, 0x8])
        reasons[rng.random(n) < 0.2] = np.nan  # no reasons: utilisation says whether it works
        if int(t / 1000) % 3 == 2:
            reasons[topo.gpu_node == 0] = np.nan  # an exporter without its custom counters for a while
        rows = rng.permutation(n)
        # readings gone dark, the rest of the row there: now and then, and for minutes at a time on
        # some GPUs (a sensor failing, an exporter dropping the field)
        read_core, read_hbm = np.round(temp), np.round(hbm)
        read_core[dark.random(n) < 0.03] = np.nan
        read_hbm[dark.random(n) < 0.03] = np.nan
        if int(t / 900) % 3 == 1:
            read_core[::3] = np.nan
            read_hbm[1::3] = np.nan
        frames.append(Frame("gpu", t - np.where(rng.random(n) < 0.02, 7.0, 0.0)[rows], rows, {
            "gpu_temp": read_core[rows], "hbm_temp": read_hbm[rows], "power": power[rows],
            "power_limit": np.full(n, 700.0), "util": np.where(idle, 0.0, 1.0)[rows],
            "throttle_reasons": reasons[rows], "slowdown_temp": rng.choice([89.0, np.nan, 400.0], n)[rows],
            # its own max operating temperatures: reported by some GPUs (not at every poll), a
            # T.Limit offset (0) or garbage by others
            "max_op_temp": rng.choice([87.0, 84.0, np.nan, 0.0], n)[rows],
            "hbm_max_op_temp": rng.choice([95.0, 80.0, np.nan, -1.0], n)[rows]}))
    return frames


def thermal_both(seed):
    topo = small_topology(nodes=2, gpus=4, racks=2)
    det, naive = th.ThermalDetector(topo), NaiveThermal(topo)
    return det, naive, run_both(det, naive, random_heating_frames(topo, seed))


@pytest.mark.kernel
@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_the_thermal_kernel_matches_a_naive_per_sample_reference(seed):
    det, naive, found = thermal_both(seed)
    np.testing.assert_allclose(det.s_forecast, naive.fc, rtol=1e-9, atol=1e-12, equal_nan=True)
    assert [(f.ts, f.slot, f.event, f.active, f.eta_s, f.confidence) for f in found] == naive.found


def test_the_thermal_reference_comparison_reaches_every_branch():
    seen = branches_seen(thermal_both(seed)[1] for seed in range(3))
    assert all(count >= 3 for count in seen.values()), seen


@pytest.mark.kernel
@settings(max_examples=300, deadline=None)
@given(rl=st.floats(-0.01, 0.2), ul=st.floats(10, 70), pref=st.just(0.0) | st.floats(1, 800), rb=st.floats(-1e-5, 1e-5),
       tau=st.floats(2, 200), res=st.floats(0, 10), plim=st.sampled_from([700.0, 400.0, np.nan]),
       temp=st.floats(20, 100), limit=st.sampled_from([87.0, 95.0]), du=st.floats(-0.05, 0.1),
       damp=st.floats(30, 900), r_seen=st.floats(0.0, 0.2) | st.just(np.nan), rate=st.floats(-1e-5, 1e-5))
def test_a_gpu_out_of_reach_has_no_crossing_in_its_forecast(rl, ul, pref, rb, tau, res, plim, temp, limit, du, damp,
                                                            r_seen, rate):
    """out_of_reach skips model_eta: it may do so only where model_eta finds no crossing."""
    p = tf.params_vector({})
    s = tf.new_model_state(1, p)
    off = tf.G_SIZE + tf.CORE * tf.M_SIZE
    s[0, [tf.G_UL, tf.G_PREF, tf.G_PLIM]] = ul, pref, plim
    s[0, off + np.array([tf.M_RL, tf.M_RB, tf.M_TAU, tf.M_RES])] = rl, rb, tau, res
    if th.out_of_reach(s, 0, off, temp, limit, damp, du, p):
        assert math.isinf(th.model_eta(s, 0, off, temp, limit, (damp, du), (r_seen, rate), p)[0])


@pytest.mark.kernel
def test_out_of_reach_skips_a_healthy_gpu_and_not_one_heading_for_its_limit():
    p = tf.params_vector({})
    s = tf.new_model_state(1, p)
    off = tf.G_SIZE + tf.CORE * tf.M_SIZE
    s[0, [tf.G_UL, tf.G_PREF, tf.G_PLIM]] = 25.0, 600.0, 700.0
    s[0, off + np.array([tf.M_RL, tf.M_RB, tf.M_TAU])] = 0.046, 0.0, 20.0
    assert th.out_of_reach(s, 0, off, 52.0, 87.0, 240.0, 0.0, p)  # 53 °C steady, no drift, inlet flat
    assert not th.out_of_reach(s, 0, off, 52.0, 87.0, 240.0, 0.2, p)  # its inlet rising 12 °C/min
    s[0, off + tf.M_RB] = 0.046 / 900  # R doubling every quarter of an hour
    assert not th.out_of_reach(s, 0, off, 52.0, 87.0, 240.0, 0.0, p)


def gpu_only_frames(topo, seed: int, seconds: int, busy_at, r_factor_at=lambda t, n: 1.0,
                    inlet_at=lambda t: 26.0):
    """GPU frames only (dcgm-exporter alone: no rack reports an inlet) of ``topo``'s GPUs on an
    inlet of ``inlet_at(t)`` (26 °C): ~640 W where ``busy_at(t)`` (a bool per GPU) says so, idle
    power elsewhere, each GPU's R times ``r_factor_at(t, n)``. Physics in 1-s steps with the
    simulator's 10-s die lag (the fit starts from 30 s and learns more than that), sampled every
    10 s: whole °C, ±5 W, an energy counter. Returns the frames and the inlet at the start."""
    rng = np.random.default_rng(seed)
    n, inlet = topo.size("gpu"), inlet_at(0)
    start_inlet = inlet
    r0 = facts.THERMAL_RESISTANCE_C_PER_W * (1 + 0.03 * rng.standard_normal(n))
    load = 640.0 * (1 + 0.02 * rng.standard_normal(n))
    power = np.where(busy_at(0), load, facts.IDLE_POWER_W)
    temp = inlet + r0 * power
    energy = rng.uniform(0, 1e9, n)
    frames = []
    for t in range(1, seconds + 1):
        busy = busy_at(t)
        power = np.where(busy, load, facts.IDLE_POWER_W)
        r = r0 * r_factor_at(t, n)
        inlet = inlet_at(t)
        temp = inlet + r * power + (temp - inlet - r * power) * math.exp(-1.0 / 10.0)
        energy = energy + power
        if t % 10 == 0:
            frames.append(Frame("gpu", np.full(n, float(t)), np.arange(n), {
                "gpu_temp": np.round(temp), "hbm_temp": np.round(inlet + 0.028 * power),
                "power": power + np.clip(2.5 * rng.standard_normal(n), -5, 5), "energy": energy.copy(),
                "power_limit": np.full(n, facts.POWER_LIMIT_W), "util": np.where(busy, 1.0, 0.0),
                "throttle_reasons": np.where(busy, 0.0, 1.0)}))
    return frames, start_inlet


def job_stop_and_start_without_inlet(seed: int):
    """One node of 8 GPUs works, its job stops at 20 min and starts again 3.4 min later,
    mid-interval, and runs on: the dies cool and warm by ~26 °C. Nothing is wrong: steady state
    ~56 °C, 31 °C under the limit."""
    topo = small_topology(nodes=1, gpus=8, racks=1)
    frames, _ = gpu_only_frames(topo, seed, 2400, lambda t: np.full(8, not 1200 <= t < 1403.7))
    return topo, frames


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_without_an_inlet_a_job_starting_is_not_a_failing_loop(seed):
    """Without rack frames, on a rack of one node, the inlet is the node's coolest GPU,
    ``T - R_nominal * P``, with P passed through the die's lag. That filter must include this
    sample: one sample behind, a job restarting read as the inlet jumping (~13 °C in 10 s on seed
    831's node41), which the forecast carried ahead as a failing loop, and every GPU of the node was
    predicted to throttle (here 2-5 predictions on each of 12 seeds; on 1,024-GPU recordings with
    their rack frames left out, 15-66 false alarms per 1000 GPU-hours, against 0-0.16 after, fan
    failures aside)."""
    topo, frames = job_stop_and_start_without_inlet(seed)
    det = th.ThermalDetector(topo)
    found = []
    for frame in frames:
        found += preds(det.update(frame))
    assert det.s_node[0, gi.NODE_PROXY] == det.s_node[0, gi.NODE_PROXY]  # the proxy was in use
    assert not found, found[0].reason


def fans_fail_without_inlet(seed: int, r_factor: float = 1.8):
    """One rack of 4 nodes x 8 GPUs at work; at 1 h node3's fans fail: its GPUs' R rises to
    ``r_factor`` times over 60 s and stays (steady state ~79 °C, under the 87 °C limit)."""
    topo = small_topology(nodes=4, gpus=8, racks=1)
    failing = topo.gpu_node == 3
    frames, _ = gpu_only_frames(
        topo, seed, 2 * 3600, lambda t: np.ones(32, bool),
        lambda t, n: np.where(failing, 1 + (r_factor - 1) * min(max(t - 3600, 0) / 60, 1.0), 1.0))
    return topo, frames


@pytest.mark.parametrize("seed", [0, 1])
def test_without_an_inlet_failed_fans_are_a_hot_node_not_a_warm_inlet(seed):
    """Without rack frames each GPU reads its rack's inlet as the median of the rack's nodes'
    proxies. A node's own proxy rises with whatever heats that node alone: its fans failing raise
    all its GPUs at the same power, exactly as a warmer inlet would. Read from the node alone, the
    inlet 'rose' ~20 °C, the forecast carried it on and predicted every GPU of the node to
    throttle, and the cooling detector, comparing R with the rack's peers, saw nothing (GPU-only
    views of twelve 1,024-GPU recordings: fan failures cost 0.65-2.93 false alarms per 1000
    GPU-h). From the rack, the inlet stays put and the node's R is what rises."""
    from foreshock.detectors.cooling import CoolingDetector
    from foreshock.findings import Anomaly

    topo, frames = fans_fail_without_inlet(seed)
    thermal, cooling = th.ThermalDetector(topo), CoolingDetector(topo)
    found, flags = [], []
    for frame in frames:
        found += preds(thermal.update(frame))
        flags += [f for f in cooling.update(frame) if isinstance(f, Anomaly) and f.entity_kind == "node"]
    assert not found, found[0].reason
    assert {f.slot for f in flags} == {3} and 3600 < min(f.ts for f in flags) <= 3600 + 900
    assert abs(thermal.s_rack[0, gi.RACK_PROXY] - 26.0) < 3.0  # the rack's inlet did not move


def test_without_an_inlet_work_starting_on_its_neighbours_leaves_a_nodes_inlet_alone():
    """Three of a rack's four nodes start work at once while the fourth runs on. Their proxies
    swing by up to R times the step for a minute or two (the fitted lag of ``P_f`` trails the
    die's), so nodes whose GPUs are far from steady (R_nominal * |P - P_f| over 2 °C) are left out
    of the rack's median, and it is held while fewer than three count. Taken over every node,
    the fourth node read its inlet jumping 9 °C (seed 21, rack13: 21.4 -> 30.6 °C)."""
    topo = small_topology(nodes=4, gpus=8, racks=1)
    steady = topo.gpu_node == 3
    frames, _ = gpu_only_frames(topo, 5, 2400, lambda t: steady | (t >= 1403.7))
    det = th.ThermalDetector(topo)
    seen, found = [], []
    for frame in frames:
        found += preds(det.update(frame))
        if frame.ts[0] >= 600:
            seen.append(det.s_rack[0, gi.RACK_PROXY])
    seen = np.array(seen)
    assert np.all(np.abs(seen - np.median(seen)) <= 1.5), (seen.min(), seen.max())
    assert not found


def test_an_imported_topologys_unknown_rack_gives_no_rack_inlet():
    """An importer that cannot tell racks puts every node into one rack, ``unknown``: across loops
    whose inlets differ, so its median is no inlet. Its GPUs read their nodes' proxies."""
    topo = Topology.from_gpu_hosts([(f"host{k}", g) for k in range(4) for g in range(8)])
    frames, inlet = gpu_only_frames(topo, 0, 1200, lambda t: np.ones(32, bool))
    det = th.ThermalDetector(topo)
    for frame in frames:
        det.update(frame)
    assert np.isnan(det.s_rack[0, gi.RACK_NODE0]) and np.isnan(det.s_rack[0, gi.RACK_PROXY])
    proxies = det.s_node[:, gi.NODE_PROXY]
    assert np.all(np.abs(proxies - inlet) < 3.0), proxies
    # the simulator's racks are real ones: linked
    linked = th.ThermalDetector(small_topology(nodes=4, gpus=8, racks=1))
    assert linked.s_rack[0, gi.RACK_NODE0] == 0.0


def test_without_an_inlet_a_failing_loop_throttles_cores_not_hbm():
    """A loop loses coolant: every node's proxy rises 10 °C/min, from 26 to 60 °C. The cores will
    throttle (60 + R·P ~ 90 °C); the HBM settles at 78 °C. Without rack frames the inlet's own trend
    is carried ahead, and 4 minutes of +10 °C/min read as coolant at 96 °C, so every HBM of the loop
    was predicted to overheat (GPU-only views of twelve recordings: HBM-overheat precision
    0.004-0.16, 3-43 false alarms per 1000 GPU-h). The coolant is heated by the dies the limiter
    holds at 87 °C, and is not forecast hotter than that."""
    topo = small_topology(nodes=4, gpus=8, racks=1)
    frames, _ = gpu_only_frames(topo, 3, 3600, lambda t: np.ones(32, bool),
                                inlet_at=lambda t: 26.0 + min(max(t - 1200, 0) / 6.0, 34.0))
    det = th.ThermalDetector(topo)
    found = []
    for frame in frames:
        found += det.update(frame)
    assert len({p.slot for p in preds(found)}) == 32  # every core predicted to throttle
    assert not preds(found, "hbm_overheat"), preds(found, "hbm_overheat")[0].reason


@pytest.mark.parametrize("hbm_fault", [True, False])
def test_a_prediction_names_the_job_member_a_thermal_limiter_already_holds(hbm_fault):
    """In a synchronous job the GPU a thermal limiter holds sets everyone's pace; as its hold
    deepens, the others draw less than their forecast assumes (seed 832: a failing loop's GPUs
    settled at 85 °C, paced by a member an HBM fault had held for hours). A thermal_throttle
    prediction names the member held longest, and for how long; while none is held it says nothing
    of the kind."""
    topo = small_topology()  # one job over every node; rack 0 holds node0 and node1
    faults = [Fault("cooling_loss", 0, 3000, 0.02, "f2")]
    if hbm_fault:  # node0/gpu3's HBM path degrades: held at 95 °C from about 20 minutes in
        faults.append(Fault("hbm_degradation", 3, 0, 8.0, "f1"))
    world = World(topo, faults=faults, seed=4)
    frames, events = world.run(6000)
    found = [p for p in preds(run(th.ThermalDetector(topo), frames)) if p.event == "thermal_throttle" and p.active]
    assert {topo.gpu_rack[p.slot] for p in found} == {0}  # the failing loop's GPUs
    held_since: dict[str, float] = {}  # the limiter's holds, replayed from the ground truth
    by_time = sorted(events, key=lambda e: e.time)
    k, named = 0, 0
    for p in sorted(found, key=lambda p: p.ts):
        while k < len(by_time) and by_time[k].time <= p.ts:
            e = by_time[k]
            if e.type == "thermal_throttle_start":
                held_since[e.entity] = e.time
            elif e.type == "thermal_throttle_end":
                held_since.pop(e.entity, None)
            k += 1
        others = {g: t for g, t in held_since.items() if g != topo.name("gpu", p.slot)}
        m = re.search(r"job job0 is paced by (\S+), held by the thermal limiter for (\d+) min", p.reason)
        if not others:
            assert m is None, p.reason
            continue
        first = min(others, key=others.get)
        assert m and m.group(1) == first and int(m.group(2)) == round((p.ts - others[first]) / 60), p.reason
        assert ("more held" in p.reason) == (len(others) > 1)
        named += 1
    if hbm_fault:  # every prediction names the member the HBM fault held long before the loss
        others = [p for p in found if p.slot != 3]
        assert others and all("paced by node0/gpu3, held" in p.reason for p in others)
        assert min(p.ts for p in others) - world.t0 > 3000 and held_since["node0/gpu3"] - world.t0 < 1800
    else:  # the first predictions come before any GPU of the loop is held, later ones after
        assert 0 < named < len(found)


def test_a_held_member_that_stops_reporting_no_longer_paces_the_job():
    """A GPU that fell off the bus keeps its last hold in the detector's state; five minutes after
    its last sample (inlet_stale_s) its peers' predictions no longer name it."""
    topo = small_topology()
    faults = [Fault("cooling_loss", 0, 3000, 0.02, "f2"), Fault("hbm_degradation", 3, 0, 8.0, "f1")]
    world = World(topo, faults=faults, seed=4)
    frames, _ = world.run(6000)
    gone = world.t0 + 5000.0  # node0/gpu3 (held since ~20 min in) reports nothing from here on
    for f in frames:
        if f.kind == "gpu" and f.ts[0] >= gone:
            keep = f.slot != 3
            f.slot, f.ts = f.slot[keep], f.ts[keep]
            f.columns = {k: v[keep] for k, v in f.columns.items()}
    found = [p for p in preds(run(th.ThermalDetector(topo), frames)) if p.event == "thermal_throttle" and p.active]
    named = [p for p in found if "paced by node0/gpu3," in p.reason]
    assert named and max(p.ts for p in named) <= gone + 300.0
    assert any(p.ts > gone + 300.0 for p in found)  # predictions went on without it


@pytest.mark.parametrize("name", ["thermal", "power", "cooling", "threshold", "river_hst"])
def test_every_detector_holding_rack_state_reads_one_saved_before_the_flow_time(name):
    """The thermal fit's detectors and the baselines keep the same rack state; at first only the
    former read a checkpoint from before ``RACK_FLOW_TS``, and the threshold rule refused it."""
    from foreshock.detectors import gpu_inputs as gi
    from foreshock.detectors.registry import create

    topo = small_topology(nodes=2, gpus=8, racks=2)
    det = create(name, topo)
    saved = det.state_dict()
    saved["s_rack"][:, gi.RACK_TS] = 1234.0
    saved["s_rack"] = saved["s_rack"][:, :gi.RACK_FLOW_TS]
    det.load_state_dict(saved)
    assert det.s_rack.shape[1] == gi.RACK_SIZE and (det.s_rack[:, gi.RACK_FLOW_TS] == 1234.0).all()


# ---- a real deployment's inputs ---------------------------------------------------------------
def rack_sensor_outage_frames(r_core: float, dark=(3600.0, 4200.0), seconds: int = 7200, seed: int = 0):
    """4 nodes of 8 GPUs on one rack, loaded at ~640 W on a 28 °C inlet, each GPU's R around
    ``r_core``; the rack's inlet reading goes dark over ``dark`` (a BMC or Redfish outage longer
    than inlet_stale_s) and comes back. Nothing else happens."""
    topo = small_topology(nodes=4, gpus=8, racks=1)
    rng = np.random.default_rng(seed)
    n = topo.size("gpu")
    r = r_core * (1 + 0.03 * rng.standard_normal(n))
    power = 640.0 * (1 + 0.02 * rng.standard_normal(n))
    temp = 28.0 + r * power
    energy = rng.uniform(0, 1e9, n)
    frames = []
    for t in range(1, seconds + 1):
        temp = 28.0 + r * power + (temp - 28.0 - r * power) * math.exp(-1.0 / 10.0)
        energy = energy + power
        if t % 10 == 0:
            if not dark[0] <= t < dark[1]:
                frames.append(Frame("rack", [float(t)], [0], {"inlet_temp": [28.0]}))
            frames.append(Frame("gpu", np.full(n, float(t)), np.arange(n), {
                "gpu_temp": np.round(temp), "hbm_temp": np.round(28.0 + 0.028 * power),
                "power": power + np.clip(2.5 * rng.standard_normal(n), -5, 5), "energy": energy.copy(),
                "power_limit": np.full(n, 700.0), "throttle_reasons": np.zeros(n)}))
    return topo, frames


@pytest.mark.parametrize("r_core", [0.046, 0.06, 0.07])
def test_a_rack_inlet_sensor_going_dark_is_not_a_warming_loop(r_core):
    """Its GPUs fall back on the node proxy, ``T - R_nominal * P``, which sits (R - R_nominal) * P
    above the rack's reading: 8.6 °C at 0.06 °C/W (air cooling, another SKU, a sensor on the
    facility side). The inlet's trend took that step for the loop warming +5 °C/min and every GPU
    of the rack was predicted to throttle within 4 minutes (32 of 32 at 0.06 °C/W, steady at 67 °C,
    20 °C under the limit); switching back to the rack's reading must not teach R a drift either."""
    topo, frames = rack_sensor_outage_frames(r_core)
    det = th.ThermalDetector(topo)
    found = run(det, frames)
    assert not preds(found), preds(found)[0].reason
    core = tf.G_SIZE + tf.CORE * tf.M_SIZE
    assert (det.s_model[:, tf.G_USRC] == gi.INLET_RACK).all()
    # back on the rack's reading, R is back where it was, with no drift learnt from the switches
    np.testing.assert_allclose(det.s_model[:, core + tf.M_RL], r_core, rtol=0.1)
    assert np.abs(det.s_model[:, core + tf.M_RB] * 3600 / r_core).max() < 0.05


def test_a_state_saved_before_gpus_kept_their_inlet_source_is_read_on():
    """A checkpoint whose ``s_model`` has no ``G_USRC`` column (nor ``s_forecast`` its
    ``F_BITS_TS``) loads (the source unknown, taken from the next reading) and goes on finding
    what the detector it was saved from finds."""
    topo = small_topology(nodes=1, gpus=1, racks=1)
    world = World(topo, load_w=650.0, seed=6, faults=[Fault("tim_degradation", 0, 600, 1.0)])
    frames, _ = world.run(2 * 3600)
    a = th.ThermalDetector(topo)
    run(a, frames[:400])
    old = as_layout1("thermal", a.state_dict())  # (as the code before 2026-12-06 kept it)
    old["s_model"] = old["s_model"][:, :L1_G_USRC]
    old["s_forecast"] = old["s_forecast"][:, :L1_F_BITS_TS]  # ... nor when reasons were last read
    b = th.ThermalDetector(topo)
    b.load_state_dict(old)
    assert b.s_model.shape[1] == tf.MODEL_WIDTH and b.s_forecast.shape[1] == th.F_SIZE
    out = run(a, frames[400:])
    assert preds(out) and run(b, frames[400:]) == out


def paced_job_frames(case: str):
    """node0/gpu0's interface fails (predicted from ~50 min in); its job peer node1/gpu3 is, by
    ``case``: braking on its node's failed supply (0x88, from 10 min to the end), or thermally held
    from 10 to 15 min (0x20), after which nobody's throttle reasons are read any more."""
    topo = small_topology(nodes=2, gpus=4, racks=1)
    world = World(topo, load_w=650.0, seed=6, faults=[Fault("tim_degradation", 0, 600, 1.0)])
    frames, _ = world.run(3 * 3600)
    for f in frames:
        t = f.ts[0] - world.t0
        if f.kind != "gpu" or t < 600:
            continue
        if case == "brake":
            f.columns["throttle_reasons"][7] = 0x88
        elif t < 900:
            f.columns["throttle_reasons"][7] = 0x20
        else:
            f.columns["throttle_reasons"][:] = np.nan
    return topo, frames


@pytest.mark.parametrize("case", ["brake", "unread"])
def test_a_peer_is_named_held_by_the_thermal_limiter_only_while_it_is(case):
    """A power brake raises the HW slowdown bit with its own (0x88): the braking peer was named
    "held by the thermal limiter for 40 min". And a peer held for 5 min before the reasons went
    unread was still named held for 169 min, 2 1/2 hours later."""
    topo, frames = paced_job_frames(case)
    found = [p for p in preds(run(th.ThermalDetector(topo), frames)) if p.slot == 0]
    assert found  # node0/gpu0's failing interface
    assert not [p for p in found if "paced by" in p.reason], found[0].reason


def test_a_poll_that_misses_the_slowdown_temperature_keeps_the_gpus_own_limit():
    """A GPU whose own slowdown temperature is 95 °C (max operating 93 °C) runs at 88-89 °C, as it
    always does. One poll's read of its threshold fails (NVML gives NaN for that poll): the 87 °C
    default applied for that sample, the GPU was already past it, and every such GPU was predicted
    to throttle with ETA 0 — withdrawn minutes later. The threshold is kept as last reported."""
    topo = small_topology(nodes=1, gpus=2, racks=1)
    world = World(topo, load_w=650.0, inlet_c=34.0, seed=5)
    world_frames, _ = world.run(2 * 3600, slowdown_temp=95.0)
    gpu = [f for f in world_frames if f.kind == "gpu"]
    for f in gpu:
        f.columns["gpu_temp"] = f.columns["gpu_temp"] + 24.0  # an R of ~0.083 °C/W: 88-89 °C
    gpu[len(gpu) // 2].columns["slowdown_temp"][:] = np.nan
    assert max(f.columns["gpu_temp"].max() for f in gpu) >= 88.0
    found = run(th.ThermalDetector(topo), world_frames)
    assert not preds(found) + preds(found, active=False), preds(found)[0].reason


@pytest.mark.parametrize("nodes", [1, 4])
def test_a_reason_says_when_its_inlet_is_an_estimate(nodes):
    """Without rack frames (dcgm-exporter alone) the inlet is the node's coolest GPU at the nominal
    resistance (or the median of its rack's nodes'): on the real H100 capture (0.032 °C/W) that is
    9 °C under the air it breathes. The reason quoted it as the GPU's inlet; it says it is an estimate."""
    topo = small_topology(nodes=nodes, gpus=8, racks=1)
    frames, _ = gpu_only_frames(topo, 3, 3600, lambda t: np.ones(8 * nodes, bool),
                                inlet_at=lambda t: 26.0 + min(max(t - 1200, 0) / 6.0, 34.0))
    found = preds(run(th.ThermalDetector(topo), frames))
    words = "its rack's nodes' coolest GPUs" if nodes == 4 else "its node's coolest GPU"
    assert found and all(f"(no rack reading: estimated from {words}, R nominal)" in p.reason for p in found)
    topo, _, frames = cooling_loss_frames(idle_from=None)  # a rack's own reading is quoted as it is
    found = preds(run(th.ThermalDetector(topo), frames))
    assert found and not [p for p in found if "estimated" in p.reason]


def test_a_node_whose_power_reads_0_w_is_not_a_warming_inlet():
    """An exporter that prints 0 for N/A: a loaded node's 8 GPUs read 0 W for ten minutes (no rack
    frames). Their proxy inlet, T - R_nominal * P, read that as the inlet jumping ~26 °C, and all 8
    were predicted to throttle (11 predictions). No powered board draws 0 W: it is no reading."""
    topo = small_topology(nodes=1, gpus=8, racks=1)
    frames, _ = gpu_only_frames(topo, 0, 7200, lambda t: np.ones(8, bool))
    for f in frames:
        if 3600 <= f.ts[0] < 4200:
            f.columns["power"][:] = 0.0
            f.columns["energy"][:] = np.nan
    assert not preds(run(th.ThermalDetector(topo), frames))


@pytest.mark.parametrize("span_s", [10.0, 60.0])
def test_a_rack_inlet_reading_that_jumps_is_not_a_warming_loop(span_s):
    """The rack's inlet reads 58 °C among 28s: for one poll (a BMC glitch), or for a minute (the
    BMC reading another probe, then back). The dies do not move. One poll was taken for the loop
    warming 30 °C: 5 of the rack's 32 GPUs predicted to throttle and all 32 to meet their power cap;
    a minute of it, all 32 to meet their cap. A jump no loop makes is held for a reading: dropped
    unless the next confirms it, and then read as another level (the fit re-bases on it)."""
    from foreshock.detectors import power as pw

    topo, frames = rack_sensor_outage_frames(0.046, dark=(0.0, 0.0))
    for f in frames:
        if f.kind == "rack" and 3600.0 <= f.ts[0] < 3600.0 + span_s:
            f.columns["inlet_temp"][:] = 58.0
    for det in (th.ThermalDetector(topo), pw.PowerDetector(topo)):
        found = [p for p in run(det, frames) if isinstance(p, Prediction)]
        assert not found, (det.name, found[0].reason)
    shifts = det.s_rack[0, gi.RACK_SHIFTS]
    assert (shifts != shifts) if span_s == 10.0 else shifts == 2.0  # up, and back


# ---- the GPU's own max operating temperatures (max_op_temp, hbm_max_op_temp) ---------------------
def own_limit_frames(inlet_c: float, hours: float = 1.0, **own: float):
    """One node of two loaded GPUs (650 W; core at inlet + ~30 °C, HBM at inlet + ~18 °C) reporting
    the given thresholds (``max_op_temp=83.0``, ...) at every poll."""
    topo = small_topology(nodes=1, gpus=2, racks=1)
    frames, _ = World(topo, load_w=650.0, inlet_c=inlet_c, seed=5).run(hours * 3600)
    for f in frames:
        if f.kind == "gpu":
            for name, value in own.items():
                f.columns[name][:] = value
    return topo, frames


@pytest.mark.parametrize("own, predicted", [({"max_op_temp": 83.0}, True), ({"max_op_temp": 87.0}, False),
                                            ({"max_op_temp": 83.0, "slowdown_temp": 89.0}, True), ({}, False)])
def test_the_gpus_own_max_operating_temperature_is_its_core_limit(own, predicted):
    """A GPU settling at ~85 °C: reporting a max operating temperature of 83 °C (DCGM field 152,
    NVML's GPU_MAX) it is predicted to throttle, against 83 °C — not against the 87 °C default, nor
    its slowdown temperature less 2 (87 °C) — and its HW slowdown stays its own 89 °C; one reporting
    87 °C is judged as before. Until 2026-12-01 the reported temperature was not read."""
    topo, frames = own_limit_frames(55.0, **own)
    assert 84.0 <= max(f.columns["gpu_temp"].max() for f in frames if f.kind == "gpu") <= 86.0
    found = preds(run(th.ThermalDetector(topo), frames))
    assert bool(found) == predicted, found[0].reason if found else ""
    if predicted:
        assert "core heading for its limit 83 °C" in found[0].reason
        # its own HW slowdown where reported (not 83 + 2), else 2 °C over its max operating
        assert f"HW slowdown {89 if 'slowdown_temp' in own else 85} °C" in found[0].reason


@pytest.mark.parametrize("hbm_max_op, predicted", [(68.0, True), (95.0, False), (None, False)])
def test_the_gpus_own_memory_max_operating_temperature_is_its_hbm_limit(hbm_max_op, predicted):
    """HBM settling at ~70 °C (the core at 82 °C, under its 87): a GPU whose memory max operating
    temperature is 68 °C (DCGM field 151, NVML's MEM_MAX) is predicted to overheat its HBM against
    68 °C; at 95 °C, or none reported, nothing is predicted (until 2026-12-01 the HBM limit was a
    fixed 95 °C whatever the GPU reported)."""
    topo, frames = own_limit_frames(52.0, **({} if hbm_max_op is None else {"hbm_max_op_temp": hbm_max_op}))
    assert 69.0 <= max(f.columns["hbm_temp"].max() for f in frames if f.kind == "gpu") <= 72.0
    found = run(th.ThermalDetector(topo), frames)
    hbm, throttle = preds(found, "hbm_overheat"), preds(found)
    assert bool(hbm) == predicted, (hbm or throttle)[0].reason if hbm or throttle else ""
    if predicted:
        assert "HBM heading for its limit 68 °C" in hbm[0].reason
        # ... and the SW thermal slowdown holds the memory there: a throttle, via the HBM
        assert throttle and "HBM heading for its limit 68 °C" in throttle[0].reason
    else:
        assert not throttle, throttle[0].reason


def test_a_poll_that_misses_the_max_operating_temperatures_keeps_the_gpus_own_limits():
    """A part whose own limits sit above Hopper's (max operating 95 °C, memory 110 °C) runs at
    88-89 °C with its HBM at ~97 °C, as it always does. One poll misses both readings: the 87 °C
    and 95 °C defaults for that one sample would have the die and the memory already past their
    limits (ETA 0). The limits are kept as last reported, so nothing is predicted."""
    topo, frames = own_limit_frames(34.0, hours=2.0, max_op_temp=95.0, hbm_max_op_temp=110.0)
    gpu = [f for f in frames if f.kind == "gpu"]
    for f in gpu:
        f.columns["gpu_temp"] = f.columns["gpu_temp"] + 24.0  # an R of ~0.083 °C/W: 88-89 °C
        f.columns["hbm_temp"] = f.columns["hbm_temp"] + 45.0  # ~97 °C
    gpu[len(gpu) // 2].columns["max_op_temp"][:] = np.nan
    gpu[len(gpu) // 2].columns["hbm_max_op_temp"][:] = np.nan
    assert max(f.columns["gpu_temp"].max() for f in gpu) >= 88.0
    assert max(f.columns["hbm_temp"].max() for f in gpu) >= 96.0
    found = run(th.ThermalDetector(topo), frames)
    assert not preds(found) + preds(found, active=False), preds(found)[0].reason


def test_a_state_saved_before_the_max_operating_temperatures_were_kept_is_read_on():
    """A checkpoint whose ``s_model`` ends at ``G_SLOWDOWN`` (saved before ``G_MAX_OP`` and
    ``G_HBM_MAX_OP``) loads — the limits unknown, taken from the next report — and goes on finding
    what the detector it was saved from finds."""
    topo, frames = own_limit_frames(55.0, max_op_temp=83.0)
    a = th.ThermalDetector(topo)
    run(a, frames[:200])
    old = as_layout1("thermal", a.state_dict())  # (as the code before 2026-12-06 kept it)
    old["s_model"] = old["s_model"][:, :L1_G_USRC + 3]  # (layout 1's G_MAX_OP)
    b = th.ThermalDetector(topo)
    b.load_state_dict(old)
    assert b.s_model.shape[1] == tf.MODEL_WIDTH and np.isnan(b.s_model[:, tf.G_MAX_OP:]).all()
    out = run(a, frames[200:])
    assert preds(out) and run(b, frames[200:]) == out


def test_the_thermal_hold_ages_by_its_own_reasons_stale_s():
    """A thermal hold is let go once the throttle reasons go unread for ``reasons_stale_s`` (its own
    parameter, 300 s as before; it was ``inlet_stale_s``, the rack inlet's): set apart, a peer held
    for 5 min and then unread is named "paced by" with a long reasons_stale_s only."""
    topo, frames = paced_job_frames("unread")
    assert th.ThermalDetector(topo).params[tf.P_REASONS_STALE] == 300.0
    named = [p for p in preds(run(th.ThermalDetector(topo, reasons_stale_s=1e6), frames)) if "paced by" in p.reason]
    assert named
    assert not [p for p in preds(run(th.ThermalDetector(topo, inlet_stale_s=1e6), frames)) if "paced by" in p.reason]
