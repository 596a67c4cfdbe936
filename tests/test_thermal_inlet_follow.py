"""The thermal forecast checks an inlet change against the dies, and bridges a missing reading.

- An inlet reading that steps (a sensor, under the 10 °C a poll that ``gpu_inputs`` holds back as
  a jump) moves no die; a coolant warming moves every die of the loop with its time constant. The
  forecast took the inlet's own trend as it read: +8 °C on a rack of warm GPUs predicted each of
  them to throttle (``thermal.follow_inlet``).
- A row without a temperature left the next with no previous one (review r72 R3: the fit must
  not judge it as one poll's step), and the forecast's trend track started over with it: on a GPU
  whose reads fail now and then, a drift waited minutes to be confirmed again.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import thermal as th
from foreshock.detectors import thermal_fit as tf
from foreshock.detectors.bank import DetectorBank
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology
from naive_refs import run_both
from naive_thermal import NaiveThermal
from test_thermal import random_heating_frames
from thermal_synth import small_topology

NO_CHECK = {"inlet_follow_slack_c": math.inf}  # the follow check off: the inlet's trend as it reads


def one(v: float) -> np.ndarray:
    """A one-row frame's column."""
    return np.array([v], dtype=float)


def one_rack(gpus: int) -> Topology:
    return Topology.from_dict({"rows": [{"name": "row0"}], "racks": [{"name": "rack0", "row": "row0"}],
                               "nodes": [{"name": f"n{k}", "rack": "rack0", "gpus": 8} for k in range(gpus // 8)]})


def rack_frames(inlet_at, dies_follow: bool, r0: float, n: int = 16, end: float = 2700.0) -> list:
    """Frames of ``n`` GPUs at 640 W (R ``r0`` +-3 %, tau 30 s) under a rack inlet ``inlet_at(t)``;
    the dies see it where ``dies_follow``, else 24 °C (the sensor moved, not the coolant)."""
    rng = np.random.default_rng(0)
    r = r0 * (1 + 0.03 * rng.standard_normal(n))
    temp = 24.0 + r * 640.0
    frames = []
    for t in np.arange(0.0, end, 10.0):
        inlet = inlet_at(t)
        temp = temp + ((inlet if dies_follow else 24.0) + r * 640.0 - temp) * (1 - math.exp(-10 / 30.0))
        frames.append(Frame("rack", one(t), one(0), {"inlet_temp": one(inlet)}))
        frames.append(Frame("gpu", np.full(n, t), np.arange(n), {
            "gpu_temp": np.round(temp + rng.normal(0, 0.3, n)), "power": 640.0 + rng.normal(0, 3, n),
            "power_limit": np.full(n, 700.0), "util": np.ones(n), "throttle_reasons": np.zeros(n)}))
    return frames


def rack_run(inlet_at, dies_follow: bool, r0: float, params: dict | None = None) -> list:
    """:func:`rack_frames` of 16 GPUs through the thermal detector: its findings."""
    bank = DetectorBank.from_names(one_rack(16), ["thermal"], processors=(), params={"thermal": params or {}})
    return [f for frame in rack_frames(inlet_at, dies_follow, r0) for f in bank.update(frame)]


def step_8(t: float) -> float:
    return 24.0 + (8.0 if t >= 1800.0 else 0.0)


def test_an_inlet_sensor_stepping_8_degrees_predicts_no_throttle_on_dies_that_did_not_move():
    """Dies at 62 °C (R 0.060), limit 87: the reading +8 °C in one poll (under the 10 °C a 10-s poll
    holds back), its trend carried ahead as a loop settling (+5 °C/min): all 16 predicted to
    throttle within 5 minutes, the dies unmoved."""
    found = rack_run(step_8, dies_follow=False, r0=0.060)
    assert [f for f in found if f.ts >= 1800.0 and f.active] == []


def first_prediction(found: list) -> float:
    return min((f.ts for f in found if f.event == "thermal_throttle" and f.active), default=math.inf)


@pytest.mark.parametrize("inlet_at", [
    step_8,  # the coolant itself stepping (the dies follow)
    lambda t: 24.0 + 30.0 * (1.0 - math.exp(-max(t - 1800.0, 0.0) / 240.0)),  # a loop warming 30 °C
], ids=["coolant step", "loop warming"])
def test_a_coolant_warming_that_the_dies_follow_is_forecast_as_early_as_without_the_check(inlet_at):
    checked = rack_run(inlet_at, dies_follow=True, r0=0.060)
    unchecked = rack_run(inlet_at, dies_follow=True, r0=0.060, params=NO_CHECK)
    assert 1800.0 <= first_prediction(checked) == first_prediction(unchecked) < math.inf
    assert len({f.slot for f in checked if f.active}) == len({f.slot for f in unchecked if f.active}) == 16
    assert not any("dies followed" in f.reason for f in checked)


def test_a_prediction_made_while_an_inlet_rise_is_discounted_says_so():
    """Dies at 72 °C: one poll after the step the check has seen 2 °C of the rise due and none
    shown, and takes the trend at 70-90 % of its pace — predictions then (as a coolant step makes)
    say how much of the inlet's rise the dies followed."""
    found = [f for f in rack_run(step_8, dies_follow=False, r0=0.075) if f.ts >= 1800.0 and f.active]
    said = [f for f in found if re.search(r"its inlet rose \d\.\d °C .* the dies followed \d\.\d °C of it: the "
                                          r"inlet's own trend is taken at \d+%", f.reason)]
    assert len(said) >= 0.75 * len(found) > 0  # (the rest: a die's scatter read as following, one poll on)


def drifting_gpu(missing_every: int, seed: int = 0) -> list:
    """One GPU whose interface fails (R +50 %/h, as the module's example), its temperature read
    failing every ``missing_every``-th poll (0: never). Thermal findings."""
    topo = one_rack(8)
    bank = DetectorBank.from_names(topo, ["thermal", "power"], processors=())
    rng = np.random.default_rng(seed)
    temp, found = 24.0 + 0.046 * 650, []
    for k, t in enumerate(np.arange(0.0, 4 * 3600, 10.0)):
        r = 0.046 * (1 + 0.5 * t / 3600)
        temp += (24.0 + r * 650 - temp) * (1 - math.exp(-10 / 30))
        reading = round(temp + rng.normal(0, 0.3)) if not (missing_every and k % missing_every == 3) else math.nan
        bank.update(Frame("rack", one(t), one(0), {"inlet_temp": one(24.0)}))
        found += bank.update(Frame("gpu", one(t), one(0), {"gpu_temp": one(reading), "power": one(650.0),
                                                           "power_limit": one(700.0)}))
    return [f for f in found if isinstance(f, Prediction) and f.detector == "thermal"]


def test_a_gpu_whose_reads_fail_now_and_then_is_forecast_as_early_as_one_that_reads_every_poll():
    """One read in 9 failing: each restarted the trend track, whose rate needs W/2..W (150-300 s)
    of samples, so the drift was never confirmed between two failures and the GPU was called only
    once its level alone reached the limit."""
    clean, flaky = first_prediction(drifting_gpu(0)), first_prediction(drifting_gpu(9))
    assert clean < math.inf and abs(flaky - clean) <= 60.0


def test_a_missing_reading_is_bridged_over_the_true_time_and_a_gap_still_restarts_the_track():
    topo = one_rack(8)
    det = th.ThermalDetector(topo)
    f_core = th.F_MODEL0 + tf.CORE * th.F_MODEL_SIZE
    temp = 24.0 + 0.046 * 650

    def poll(t: float, reading: float) -> None:
        det.update(Frame("rack", one(t), one(0), {"inlet_temp": one(24.0)}))
        det.update(Frame("gpu", one(t), one(0), {"gpu_temp": one(reading), "power": one(650.0)}))

    for t in np.arange(0.0, 600.0, 10.0):
        poll(t, temp)
    rs = det.s_forecast[0, f_core + th.F_RS]
    poll(600.0, math.nan)
    poll(610.0, temp + 6.5)  # R seen 0.01 °C/W higher, 20 s after the last reading
    w = 1 - math.exp(-20.0 / det.params[tf.P_TREND_SMOOTH])
    assert det.s_forecast[0, f_core + th.F_RS] == pytest.approx(rs + w * (0.01 + 0.046 - rs))
    assert det.s_forecast[0, f_core + th.F_C0_TS] == det.s_forecast[0, f_core + th.F_C0_TS]  # kept
    poll(610.0 + det.params[tf.P_GAP] + 10.0, temp)  # no reading for longer than gap_s: it starts over
    assert math.isnan(det.s_forecast[0, f_core + th.F_C0_TS])


# ---- the kernel against the naive reference (tests/naive_thermal.py: the follow check, the bridged track) ----
def follow_frames(topo, seed):
    """random_heating_frames with what the new rules meet: temperature reads failing (single and
    in runs, and one longer than gap_s) and a rack inlet sensor stepping 7-9 °C for a while."""
    rng = np.random.default_rng(seed)
    frames = random_heating_frames(topo, seed, ticks=250)
    dark = set(rng.choice(topo.size("gpu"), 1).tolist())
    for k, frame in enumerate(frames):
        if frame.kind == "rack":
            inlet = frame.columns["inlet_temp"].copy()
            if 150 <= k < 300:
                inlet[0] += 7.0 + 2.0 * (k % 2 == 0 and k < 154)  # a step (and a wobble as it lands)
            frames[k] = Frame("rack", frame.ts, frame.slot, {"inlet_temp": inlet})
            continue
        cols = {name: col.copy() for name, col in frame.columns.items()}
        cols["gpu_temp"][rng.random(len(frame)) < 0.08] = np.nan
        if 400 <= k < 560:  # one GPU's reads fail for longer than gap_s (its other fields arrive)
            cols["gpu_temp"][np.isin(frame.slot, list(dark))] = np.nan
        frames[k] = Frame("gpu", frame.ts, frame.slot, cols)
    return frames


def assert_matches(det, naive, found):
    """Every forecast column (the follow check's and the trend tracks' included), every finding."""
    np.testing.assert_allclose(det.s_forecast, naive.fc, rtol=1e-9, atol=1e-12, equal_nan=True)
    assert [(f.ts, f.slot, f.event, f.active, f.eta_s, f.confidence) for f in found] == naive.found


@pytest.mark.kernel
@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_the_thermal_kernel_with_the_follow_check_matches_a_naive_reference(seed):
    topo = small_topology(nodes=2, gpus=4, racks=2)
    det, naive = th.ThermalDetector(topo), NaiveThermal(topo)
    assert_matches(det, naive, run_both(det, naive, follow_frames(topo, seed)))
    assert all(naive.seen_follow[k] > 0 for k in ("bridged", "source restart", "follow restart")), naive.seen_follow


@pytest.mark.kernel
@pytest.mark.parametrize("dies_follow", [False, True])
def test_the_kernel_matches_the_reference_where_an_inlet_rise_is_discounted(dies_follow):
    topo = one_rack(8)
    det, naive = th.ThermalDetector(topo), NaiveThermal(topo)
    found = run_both(det, naive, rack_frames(step_8, dies_follow, r0=0.075, n=8, end=2200.0))
    assert_matches(det, naive, found)
    assert found and (dies_follow or naive.seen_follow["discounted"] > 0)
