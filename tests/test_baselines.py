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


@pytest.mark.kernel
def test_feature_kernel_matches_reference():
    rng = np.random.default_rng(1)
    topo = small_topology(nodes=1, gpus=1, racks=1)
    stream = bl.FeatureStream(topo, PipelineHealth(), "test")
    temps = 50 + np.cumsum(rng.normal(0, 1, 40))
    temps[7] = np.nan
    power = 600 + rng.normal(0, 20, 40)
    ts = np.cumsum(rng.uniform(5, 15, 40))
    prev_t = prev_temp = slope = math.nan
    for k in range(40):
        stream.observe_rack(Frame("rack", [ts[k]], [0], {"inlet_temp": [25.0]}))
        _, x = stream.features(Frame("gpu", [ts[k]], [0], {
            "gpu_temp": [temps[k]], "power": [power[k]], "power_limit": [700.0], "sm_clock": [1.5e9],
            "sm_clock_max": [2e9], "util": [1.0], "throttle_reasons": [32.0 if k == 5 else 4.0]}))
        f = dict(zip(bl.FEATURES, x[0]))
        # reference: EW slope of temperature per minute over valid consecutive samples
        if not math.isnan(prev_t) and not math.isnan(temps[k]) and not math.isnan(prev_temp):
            d = (temps[k] - prev_temp) / (ts[k] - prev_t) * 60
            slope = d if math.isnan(slope) else slope + (1 - math.exp(-(ts[k] - prev_t) / 60)) * (d - slope)
        prev_t = ts[k]
        if not math.isnan(temps[k]):
            prev_temp = temps[k]
        assert f["power_frac"] == pytest.approx(power[k] / 700.0)
        assert f["clock_frac"] == pytest.approx(0.75)
        assert f["thermal_bit"] == (1.0 if k == 5 else 0.0) and f["power_cap_bit"] == (0.0 if k == 5 else 1.0)
        assert f["inlet_c"] == 25.0
        if not math.isnan(temps[k]):
            assert f["core_margin_c"] == pytest.approx(87.0 - temps[k])
            assert f["temp_over_inlet_c"] == pytest.approx(temps[k] - 25.0)
        if not math.isnan(slope):
            assert f["temp_slope_c_per_min"] == pytest.approx(slope)


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
