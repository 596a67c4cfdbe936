"""Baselines: the shared feature stream, the threshold rule, river's HalfSpaceTrees."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foreshock.detectors import baselines as bl
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth

from thermal_synth import Fault, World, run, small_topology


def reference_slope(ts, values, tau=60.0, gap=600.0, min_s=30.0):
    """The slope per minute after each sample, summed out: the rates between valid readings since
    the slope last (re)started (each over the time since the previous *valid* reading: rows keep
    coming while a sensor is dark), averaged with weights ``exp(-age / tau) * (1 - exp(-dt / tau))``;
    restarted after more than ``gap`` without a valid reading; NaN until it spans ``min_s``."""
    out, rates, prev, prev_t, since = [], [], math.nan, math.nan, math.nan
    for t, v in zip(ts, values):
        if not math.isnan(v):
            if math.isnan(prev) or t - prev_t > gap:
                rates, since = [], t
            else:
                rates.append((t, t - prev_t, (v - prev) / (t - prev_t) * 60))
            prev, prev_t = v, t
        if rates and prev_t - since >= min_s:
            w = [math.exp(-(prev_t - tj) / tau) * (1 - math.exp(-dt / tau)) for tj, dt, _ in rates]
            out.append(sum(wj * d for wj, (_, _, d) in zip(w, rates)) / sum(w))
        else:
            out.append(math.nan)
    return out


@pytest.mark.kernel
def test_feature_kernel_matches_reference():
    rng = np.random.default_rng(1)
    topo = small_topology(nodes=1, gpus=1, racks=1)
    stream = bl.FeatureStream(topo, PipelineHealth(), "test")
    n = 160
    temps = 50 + np.cumsum(rng.normal(0, 1, n))
    temps[7] = np.nan
    temps[30:100] = np.nan  # dark for ~700 s of rows ~10 s apart: its slope starts afresh
    temps[120:126] = np.nan  # dark for ~1 min: the change over it, over the time it took
    power = 600 + rng.normal(0, 20, n)
    power[60:64] = np.nan
    ts = np.cumsum(rng.uniform(5, 15, n))
    ts[140:] += 650.0  # no rows for 11 min: every slope starts afresh
    want_temp, want_power = reference_slope(ts, temps), reference_slope(ts, power)
    for k in range(n):
        stream.observe_rack(Frame("rack", [ts[k]], [0], {"inlet_temp": [25.0]}))
        _, x = stream.features(Frame("gpu", [ts[k]], [0], {
            "gpu_temp": [temps[k]], "power": [power[k]], "power_limit": [700.0], "sm_clock": [1.5e9],
            "sm_clock_max": [2e9], "util": [1.0], "throttle_reasons": [32.0 if k == 5 else 4.0]}))
        f = dict(zip(bl.FEATURES, x[0]))
        if not math.isnan(power[k]):
            assert f["power_frac"] == pytest.approx(power[k] / 700.0)
        assert f["clock_frac"] == pytest.approx(0.75)
        assert f["thermal_bit"] == (1.0 if k == 5 else 0.0) and f["power_cap_bit"] == (0.0 if k == 5 else 1.0)
        assert f["inlet_c"] == 25.0
        if not math.isnan(temps[k]):
            assert f["core_margin_c"] == pytest.approx(87.0 - temps[k])
            assert f["temp_over_inlet_c"] == pytest.approx(temps[k] - 25.0)
        assert f["temp_slope_c_per_min"] == pytest.approx(want_temp[k], nan_ok=True), k
        assert f["power_slope_w_per_min"] == pytest.approx(want_power[k], nan_ok=True), k
        assert f["inlet_slope_c_per_min"] == pytest.approx(reference_slope(ts, np.full(n, 25.0))[k], nan_ok=True), k


@pytest.mark.kernel
def test_a_slope_after_a_dark_sensor_is_the_rate_over_the_gap():
    """Review r55 (XID 79, a sensor dark): rows keep coming with NaN readings; the first reading
    back was compared with the last valid one minutes before but over the 1 s since the last row
    (a GPU warming 2 °C over 5 min read -25 °C/min). Now over the time the change took; over more
    than F_SLOPE_GAP_S the slope starts afresh."""
    stream = bl.FeatureStream(small_topology(nodes=1, gpus=1, racks=1), PipelineHealth(), "test")

    def feed(t, temp):
        _, x = stream.features(Frame("gpu", [float(t)], [0], {"gpu_temp": [temp]}))
        return dict(zip(bl.FEATURES, x[0]))["temp_slope_c_per_min"]

    for t in range(0, 120):
        feed(t, 50.0)
    for t in range(120, 420):  # 5 min dark
        feed(t, math.nan)
    # 2 °C over 301 s, averaged with the flat minutes before
    a = 1 - math.exp(-301 / 60)
    w = 1 - math.exp(-119 / 60)
    assert feed(420, 52.0) == pytest.approx(a / (w + a * (1 - w)) * 2.0 / 301 * 60)
    for t in range(421, 1100):  # over 10 min dark
        feed(t, math.nan)
    assert math.isnan(feed(1100, 30.0))  # off the bus and back cold: no rate
    # started afresh: no slope from the first second's whole degrees (60 °C/min), then the mean rate
    assert all(math.isnan(feed(t, 30.0 + (t - 1100) // 10)) for t in range(1101, 1130))
    assert feed(1130, 33.0) == pytest.approx(6.0, abs=0.5)  # 1 °C per 10 s


@pytest.mark.kernel
@pytest.mark.parametrize("own, core_limit, hbm_limit", [
    ({}, 87.0, 95.0),
    ({"slowdown_temp": 85.0}, 83.0, 95.0),  # its slowdown less 2
    ({"max_op_temp": 83.0, "slowdown_temp": 89.0}, 83.0, 95.0),  # its max operating, first
    ({"max_op_temp": 83.0, "hbm_max_op_temp": 90.0}, 83.0, 90.0),
    ({"max_op_temp": 0.0, "hbm_max_op_temp": -2.0, "slowdown_temp": 0.0}, 87.0, 95.0),  # T.Limit offsets: none
])
def test_the_margins_are_to_the_gpus_own_limits(own, core_limit, hbm_limit):
    """core_margin_c and hbm_margin_c are to the limits the GPU reports (its max operating
    temperatures, else its slowdown less 2 °C), else Hopper's 87 and 95 °C."""
    stream = bl.FeatureStream(small_topology(nodes=1, gpus=1, racks=1), PipelineHealth(), "test")
    _, x = stream.features(Frame("gpu", [10.0], [0], {"gpu_temp": [70.0], "hbm_temp": [60.0], "power": [600.0],
                                                      **{k: [v] for k, v in own.items()}}))
    f = dict(zip(bl.FEATURES, x[0]))
    assert (f["core_margin_c"], f["hbm_margin_c"]) == (core_limit - 70.0, hbm_limit - 60.0)


def test_threshold_rule_fires_at_the_level_not_before():
    topo = small_topology()
    world = World(topo, faults=[Fault("tim_degradation", 4, 1800, 0.8)], seed=2)
    frames, events = world.run(4 * 3600)
    found = run(bl.ThresholdDetector(topo), frames)
    thermal = [p for p in found if isinstance(p, Prediction) and p.event == "thermal_throttle" and p.active]
    assert {p.slot for p in thermal} == {4}
    onset = next(e.time for e in events if e.type == "thermal_throttle_start")
    assert 0 < onset - thermal[0].ts < 600  # a threshold warns late: minutes at most
    assert "85 °C" in thermal[0].reason


def silent_gpu_frames():
    """Two GPUs at work; GPU 1's core climbs 3 °C a minute from 60 °C (the threshold rule's 85 °C at
    500 s) and it sends nothing from 900 s on, while GPU 0 reports on to 2400 s."""
    frames = []
    for t in np.arange(0.0, 2400.0, 10.0):
        slots = [0, 1] if t < 900 else [0]
        n = len(slots)
        frames.append(Frame("gpu", [float(t)] * n, slots, {
            "gpu_temp": [60.0, min(60.0 + t / 20.0, 90.0)][:n], "hbm_temp": [55.0] * n, "power": [500.0] * n,
            "power_limit": [700.0] * n, "util": [1.0] * n}))
    return frames


def test_a_baselines_prediction_on_a_gpu_gone_silent_is_withdrawn_and_the_replay_agrees():
    """A baseline's prediction steps only on its GPU's rows: one on a GPU that fell off the bus held
    for ever (until 2026-12-04). It is withdrawn once the GPU has sent nothing for ``SILENT_S``
    (600 s, as the thermal detector's), saying so; and the score log's replay (the evaluation's
    threshold sweep) closes the same span at the same time, so the two still score alike."""
    from foreshock.detectors.evaluation import EVENT_KINDS, alarm_intervals

    topo = small_topology(nodes=1, gpus=2, racks=1)
    det = bl.ThresholdDetector(topo)
    log = det.log_scores()
    found = [p for p in run(det, silent_gpu_frames()) if isinstance(p, Prediction)]
    hot = [p for p in found if p.slot == 1]
    assert (hot[0].ts, hot[0].event, hot[0].active) == (500.0, "thermal_throttle", True)
    assert all(p.active and p.ts < 900.0 for p in hot[1:-1])  # (refreshed while it reports)
    # its last row at 890 s: the first frame more than 600 s later withdraws it, and says why
    assert (hot[-1].ts, hot[-1].event, hot[-1].active) == (1500.0, "thermal_throttle", False)
    assert "no report for 10 min" in hot[-1].reason and "not a recovery" in hot[-1].reason
    assert not [p for p in found if p.slot == 0]
    live = alarm_intervals(found, EVENT_KINDS["thermal_throttle"], topo, end=2400.0)
    slot, start, stop = log.spans(0, 85.0, 2400.0)
    assert live == {topo.name("gpu", 1): [(500.0, 1500.0)]}
    assert (slot.tolist(), start.tolist(), stop.tolist()) == ([1], [500.0], [1500.0])


def test_half_space_trees_flags_a_fault_and_round_trips():
    topo = small_topology(nodes=2, gpus=8, racks=1)
    world = World(topo, faults=[Fault("cooling_loss", 0, 3000, 0.03)], seed=3)
    frames, _ = world.run(5400)
    det = bl.HalfSpaceTreesDetector(topo, calibration_s=1200, calibration_skip_s=300, quantile=0.99)
    half = len(frames) * 2 // 3
    first = run(det, frames[:half])
    twin = bl.HalfSpaceTreesDetector(topo, calibration_s=1200, calibration_skip_s=300, quantile=0.99)
    twin.load_state_dict(det.state_dict())
    rest = run(det, frames[half:])
    assert rest == run(twin, frames[half:])
    alarms = [p for p in first + rest if isinstance(p, Prediction) and p.active]
    assert np.isfinite(det.threshold)
    assert alarms and {p.event for p in alarms} == {"thermal_throttle", "hbm_overheat", "power_cap"}
    assert min(p.ts for p in alarms) >= world.t0 + 1500  # nothing while calibrating


def test_sklearn_detector_needs_a_model():
    with pytest.raises(bl.ModelFileError, match="needs a model file"):
        bl.SklearnDetector(small_topology())


def test_half_space_trees_skips_a_gpu_that_reports_nothing():
    """Review r55: a GPU off the bus (every reading NaN) was scored and learnt as "every feature at
    its lower limit" — an anomaly: river alarmed on a dead GPU. Its rows are skipped now, as the
    classifier skips them: no score, nothing learnt, no alarm."""
    topo = small_topology(nodes=1, gpus=2, racks=1)
    rng = np.random.default_rng(4)
    frames = []
    for t in range(0, 900, 5):
        temp = 60.0 + rng.normal(0, 0.5)
        frames.append(Frame("gpu", [float(t), float(t)], [0, 1], {
            "gpu_temp": [temp, np.nan], "hbm_temp": [temp + 5, np.nan], "power": [500.0, np.nan],
            "sm_clock": [1.5e9, np.nan], "sm_clock_max": [2e9, np.nan], "util": [1.0, np.nan]}))

    def detector():
        det = bl.HalfSpaceTreesDetector(topo, n_trees=3, height=4, window_size=20, calibration_s=200,
                                        calibration_skip_s=50, quantile=0.5)
        return det, det.log_scores()

    det, log = detector()
    found = run(det, frames)
    obs, scores = log.arrays()
    dead = obs[:, 1] == 1
    assert dead.any() and np.isnan(scores[dead, 0]).all()  # not scored
    assert not [p for p in found if isinstance(p, Prediction) and p.slot == 1]
    alone, alone_log = detector()  # nothing learnt from them: GPU 0 scored as if it were alone
    run(alone, [f.take(np.array([0])) for f in frames])
    assert np.array_equal(alone_log.arrays()[1][:, 0], scores[~dead, 0])


def test_a_feature_state_saved_before_the_reading_times_loads_and_goes_on():
    """A checkpoint of a baseline written before each value kept its last valid reading's time and
    its slope's filled weight (10 columns per GPU) loads: the times read as the GPU's last row, a
    slope as a full average; the features go on as the unbroken detector's."""
    topo = small_topology(nodes=1, gpus=2, racks=1)
    rng = np.random.default_rng(7)
    frames = [Frame("gpu", [float(t)] * 2, [0, 1], {"gpu_temp": [60 + t / 100 + rng.normal(0, 0.3), np.nan],
                                                    "power": [500.0 + rng.normal(0, 5), np.nan]})
              for t in range(0, 1200, 10)]
    whole = bl.ThresholdDetector(topo)
    run(whole, frames[:100])
    state = whole.state_dict()
    old = {**state, "s_feat": state["s_feat"][:, :10].copy()}  # the layout before (F_TS .. F_USLOPE)
    restored = bl.ThresholdDetector(topo)
    restored.load_state_dict(old)
    for frame in frames[100:]:
        a = whole.stream.features(frame)[1]
        b = restored.stream.features(frame)[1]
        np.testing.assert_allclose(b, a, rtol=1e-6, equal_nan=True)
