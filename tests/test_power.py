"""Power detector: power-cap prediction (leakage as the GPU heats), power brake per GPU and node."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock import facts
from foreshock.detectors import power as pw
from foreshock.findings import Anomaly, Prediction
from foreshock.frames import Frame

from thermal_synth import run, small_topology


def heating_gpu(onset=1800.0, rise=36.0, duration=3600.0, dt=10.0, leak=3.0, base=610.0, seed=0):
    """One GPU whose rack inlet settles +rise °C (tau 180 s) from ``onset``; its power demand
    grows with temperature (leakage) until the 700 W cap holds it (bit 0x4)."""
    rng = np.random.default_rng(seed)
    temp, frames, first_cap = 50.0, [], None
    for t in np.arange(0.0, duration, dt):
        inlet = 24.0 + (rise * (1 - math.exp(-(t - onset) / 180.0)) if t >= onset else 0.0)
        demand = base + leak * (temp - 50.0)
        power = min(demand, facts.POWER_LIMIT_W)
        capped = demand >= facts.POWER_LIMIT_W
        if capped and first_cap is None:
            first_cap = t
        target = inlet + 0.046 * power
        temp = target + (temp - target) * math.exp(-dt / 10.0)
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [round(inlet, 1)]}))
        frames.append(Frame("gpu", [t], [0], {
            "gpu_temp": [round(temp)], "power": [power + rng.uniform(-5, 5)], "power_limit": [700.0],
            "throttle_reasons": [float(facts.THROTTLE_SW_POWER_CAP if capped else 0)]}))
    return frames, first_cap


@pytest.mark.kernel
@settings(max_examples=50, deadline=None)
@given(st.floats(0, 800), st.floats(-5, 5), st.floats(300, 800), st.floats(0, 20))
def test_cap_eta_matches_closed_form(level, slope, limit, margin):
    got = pw.cap_eta(level, slope, limit, margin)
    gap = limit - margin - level
    if gap <= 0:
        assert got == 0.0
    elif slope <= 0:
        assert math.isinf(got)
    else:
        assert got == pytest.approx(gap / slope)


def test_power_cap_predicted_as_leakage_rises_with_temperature():
    topo = small_topology(nodes=1, gpus=1, racks=1)
    frames, first_cap = heating_gpu()
    assert first_cap is not None and first_cap > 1800
    found = [f for f in run(pw.PowerDetector(topo), frames) if isinstance(f, Prediction) and f.active]
    assert found, "no power-cap prediction"
    assert found[0].event == "power_cap"
    assert 30.0 <= first_cap - found[0].ts <= 300.0  # at least 30 s ahead, within the horizon
    assert "700 W limit" in found[0].reason


def test_steady_gpu_below_the_cap_predicts_nothing():
    topo = small_topology(nodes=1, gpus=1, racks=1)
    frames, first_cap = heating_gpu(rise=0.0, base=640.0)
    assert first_cap is None
    assert not [f for f in run(pw.PowerDetector(topo), frames) if isinstance(f, Prediction)]


def job_start_frames(compute_w=685.0, comm_w=265.0, step_s=57.0, compute_share=0.75, start=300.0,
                     duration=1800.0, seed=1):
    """One GPU idle at 80 W until ``start``, then running training steps below its 700 W limit:
    1-s samples every 10 s land in compute (``compute_w``) or communication phases."""
    rng = np.random.default_rng(seed)
    frames = []
    for t in np.arange(0.0, duration, 10.0):
        if t < start:
            power = 80.0
        else:
            phase = ((t - start) / step_s) % 1.0
            power = compute_w if phase < compute_share else comm_w
            power = min(power, 300.0 + 14.0 * (t - start))  # the first second(s) ramp up from idle
        power += rng.uniform(-5, 5)
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
        frames.append(Frame("gpu", [t], [0], {
            "gpu_temp": [round(24.0 + 0.046 * (80.0 if t < start else 580.0))], "power": [power],
            "power_limit": [700.0], "throttle_reasons": [float(facts.THROTTLE_IDLE if t < start else 0)]}))
    return frames


def test_job_start_below_the_limit_predicts_nothing():
    # Holt's level overshoots the step from idle to load (and the envelope's jumps after a
    # communication phase) by tens of watts for a minute or two; the forecast must not take
    # that for power above the limit (1024-GPU evaluation, seed 34: 153 false power-cap alarms
    # on fault-free GPUs, precision 0.66).
    topo = small_topology(nodes=1, gpus=1, racks=1)
    for start in (300.0, 320.0, 350.0):
        det = pw.PowerDetector(topo)
        found = [f for f in run(det, job_start_frames(start=start)) if isinstance(f, Prediction)]
        assert not found, (start, found[0].reason)


def test_flat_gpu_a_few_watts_under_the_limit_predicts_nothing():
    # Compute phases 10 W under the 700 W limit, temperature flat: the 2-min envelope of such
    # GPUs is followed by a cap within 5 min only 3-5 % of the time on the 1,024-GPU mixed
    # recordings (see the module docstring) -- claiming it would wreck precision.
    topo = small_topology(nodes=1, gpus=1, racks=1)
    for seed in (1, 2, 3):
        frames = job_start_frames(compute_w=690.0, start=0.0, duration=3600.0, seed=seed)
        found = [f for f in run(pw.PowerDetector(topo), frames) if isinstance(f, Prediction)]
        assert not found, (seed, found[0].reason)


def test_envelope_at_the_limit_is_predicted_as_such():
    # compute phases at 700 W: samples up to 705 W, the envelope is at the limit already; the
    # prediction says so (ETA ~0), not that a trend is carrying it there
    topo = small_topology(nodes=1, gpus=1, racks=1)
    frames = job_start_frames(compute_w=700.0, start=0.0, duration=1200.0)
    found = [f for f in run(pw.PowerDetector(topo), frames) if isinstance(f, Prediction) and f.active]
    assert found, "no power-cap prediction"
    assert found[0].eta_s <= 10.0
    assert "already at the 700 W limit within the" in found[0].reason
    assert "W/min" not in found[0].reason


def brake_frames(braking: dict[int, tuple[float, float]], n=16, duration=600.0):
    frames = []
    for t in np.arange(0.0, duration, 10.0):
        bits = np.zeros(n)
        power = np.full(n, 620.0)
        for g, (start, end) in braking.items():
            if start <= t < end:
                bits[g] = facts.THROTTLE_HW_POWER_BRAKE | facts.THROTTLE_HW_SLOWDOWN
                power[g] = 110.0
        frames.append(Frame("gpu", np.full(n, t), np.arange(n), {
            "power": power, "power_limit": np.full(n, 700.0), "throttle_reasons": bits, "gpu_temp": np.full(n, 50.0)}))
    return frames


def test_power_brake_per_gpu_and_node_wide_event():
    topo = small_topology(nodes=2, gpus=8, racks=1)
    # node0: three GPUs brake together (a power supply); node1: one GPU alone
    found = run(pw.PowerDetector(topo), brake_frames({0: (200, 400), 1: (200, 400), 2: (210, 400), 9: (300, 350)}))
    gpu_brakes = sorted(f.slot for f in found if isinstance(f, Anomaly) and f.entity_kind == "gpu")
    node_events = [f for f in found if isinstance(f, Anomaly) and f.entity_kind == "node"]
    assert gpu_brakes == [0, 1, 2, 9]
    assert [(f.slot, f.ts) for f in node_events] == [(0, 200.0)]
    assert "node-wide power brake" in node_events[0].reason
    first = next(f for f in found if isinstance(f, Anomaly) and f.slot == 0)
    assert first.ts == 200.0  # immediate: the sample that shows the bit


def test_node_power_event_predicts_the_cap_after_the_brake():
    topo = small_topology(nodes=2, gpus=8, racks=1)
    found = run(pw.PowerDetector(topo), brake_frames({g: (300, 400) for g in range(8)}))
    caps = [f for f in found if isinstance(f, Prediction) and f.event == "power_cap" and f.active]
    first = {}
    for f in caps:
        first.setdefault(f.slot, f.ts)
    assert set(first) == set(range(8))
    assert all(300 <= t <= 330 for t in first.values())  # while the brake holds (until 400 s)
    assert "failed power supply" in caps[0].reason


def test_state_round_trip_gives_identical_future_output():
    topo = small_topology(nodes=1, gpus=1, racks=1)
    frames, _ = heating_gpu()
    half = len(frames) // 2
    a = pw.PowerDetector(topo)
    run(a, frames[:half])
    b = pw.PowerDetector(topo)
    b.load_state_dict(a.state_dict())
    rest_a, rest_b = run(a, frames[half:]), run(b, frames[half:])
    assert rest_a == rest_b and rest_a
    assert a.state_nbytes() <= 1024


def test_bad_input_is_counted():
    topo = small_topology(nodes=1, gpus=1, racks=1)
    det = pw.PowerDetector(topo)
    det.update(Frame("gpu", [10.0, 5.0, 11.0], [0, 0, 4], {"power": [600.0, 600.0, 1.0],
                                                          "throttle_reasons": [np.nan, 9.3e18, 0.0]}))
    reasons = {r for (_, r) in det.health.problems}
    assert any("out of time order" in r for r in reasons) and any("unknown slot" in r for r in reasons)


@pytest.mark.parametrize("temp_slope, wording", [(0.01, "leakage rising with it"),
                                                 (-0.0057, "its thermal model settles it warmer")])
def test_the_cap_reason_does_not_call_a_cooling_gpus_leakage_rising(temp_slope, wording):
    """The leakage in the forecast comes from the thermal model's steady state, not from the
    measured slope: a GPU cooling for a moment (the demo showed -0.34 °C/min) may still be
    heading warmer, and its reason must not say its leakage is rising with a falling temperature."""
    from foreshock.detectors.alarm import CODE_START, O_CODE, O_CONF, O_ETA, O_ROW, O_V0, O_WHICH, OUT_SIZE
    det = pw.PowerDetector(small_topology(nodes=1, gpus=1, racks=1))
    out = np.zeros((1, OUT_SIZE))
    out[0, [O_ROW, O_WHICH, O_CODE, O_ETA, O_CONF]] = (0, pw.WHICH_CAP, CODE_START, 234.0, 0.9)
    out[0, O_V0:O_V0 + 6] = (683.0, 0.01, 700.0, temp_slope, 0.0, 0.0)
    (found,) = det._findings(np.array([[1000.0, 0.0]]), out)
    assert found.event == "power_cap" and wording in found.reason
    assert f"temperature {temp_slope * 60:+.2f} °C/min" in found.reason
