"""Detector inputs at their edges (review h43): a rack's coolant-flow glitch and its baseline, node
rows outside the topology or without a time, one GPU row stamped far ahead, and GPU readings out
of any range the straggler's means can take."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foreshock import facts
from foreshock.detectors import gpu_inputs as gi
from foreshock.detectors import straggler as sg
from foreshock.detectors.cooling import CoolingDetector
from foreshock.detectors.thermal import ThermalDetector
from foreshock.findings import Anomaly, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from thermal_synth import World, small_topology

FLOW = 1.2  # L/s: a rack's loop at nominal flow
INLET = 24.0
HEAT = 20e3
RISE = 4.0  # °C: the coolant rise at baseline flow the forecasts below assume (the site's prior)


# ---- a rack's coolant flow and its baseline --------------------------------------------------
def feed(state, flows, inlets=INLET, heat=HEAT, t0=1000.0, dt=10.0, gpu_heat=math.nan, gpu_floor=math.nan):
    """One rack's rows ``[ts, slot, inlet, flow, heat, gpu_heat, gpu_floor]``, a reading every ``dt``;
    the time after the last."""
    flows = np.asarray(flows, dtype=float)
    ts = t0 + dt * np.arange(len(flows))
    rows = np.column_stack([ts, np.zeros(len(flows)), np.broadcast_to(inlets, flows.shape),
                            flows, np.broadcast_to(heat, flows.shape), np.broadcast_to(gpu_heat, flows.shape),
                            np.broadcast_to(gpu_floor, flows.shape)])
    gi.update_rack_inlet(np.ascontiguousarray(rows), state)
    return float(ts[-1]) + dt if len(ts) else t0


def forecast(state):
    """Where the rack's inlet settles by its flow now (NaN: at nominal flow)."""
    return gi.flow_asymptote(state, 0, RISE, 0.0)


@pytest.mark.parametrize("spike", [65535.0, 1e300, math.inf, 12.0])
def test_one_flow_reading_far_above_the_baseline_does_not_move_it(spike):
    """65535 (a BMC's 'unreadable', inside the guard's range) lifted the baseline 1.2 -> 364 L/s, which
    follows only nominal readings: the loop read as a loss at 0.3 % for good. A glitch is dropped (the
    next reading disagrees), a non-finite flow is no reading; a loss after it is still seen at once,
    against the loop's own baseline."""
    state = gi.new_rack_state(1)
    t = feed(state, [FLOW] * 60)
    t = feed(state, [spike], t0=t)
    assert state[0, gi.RACK_FLOW_TS] == t - 20.0  # the glitch is not a flow reading
    t = feed(state, [FLOW] * 60, t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(FLOW)
    assert state[0, gi.RACK_LOSS] == 0.0 and math.isnan(forecast(state))
    feed(state, [FLOW / 2], t0=t)  # half the flow: the inlet heads one rise over its baseline's
    assert state[0, gi.RACK_LOSS] == 1.0
    assert forecast(state) == pytest.approx(INLET + RISE)


def test_glitches_that_never_repeat_never_move_the_baseline():
    state = gi.new_rack_state(1)
    flows = [FLOW] * 10 + [65535.0, FLOW, 30.0, FLOW, 1e5, FLOW, FLOW] * 30
    feed(state, flows)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(FLOW) and state[0, gi.RACK_LOSS] == 0.0


def test_the_baseline_starts_from_a_reading_the_next_one_confirms():
    """A glitched first reading (12 L/s where the loop runs 1.2) was the baseline for good: every later
    nominal reading a loss at a tenth of it, every loaded GPU of the rack predicted to throttle."""
    state = gi.new_rack_state(1)
    feed(state, [12.0] + [FLOW] * 120)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(FLOW)
    assert state[0, gi.RACK_LOSS] == 0.0 and math.isnan(forecast(state))


def test_a_baseline_that_moves_up_is_taken_once_a_second_reading_confirms_it():
    """A pump upgraded: the flow doubles and stays. Taken after a reading, and a loss from there is a
    loss (at the old baseline, 70 % of the new flow read as nominal)."""
    state = gi.new_rack_state(1)
    t = feed(state, [FLOW] * 60)
    t = feed(state, [2.5 * FLOW], t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(FLOW)  # held back
    t = feed(state, [2.5 * FLOW] * 5, t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(2.5 * FLOW, rel=1e-3)
    assert state[0, gi.RACK_LOSS] == 0.0 and math.isnan(forecast(state))
    feed(state, [0.7 * 2.5 * FLOW], t0=t)
    assert state[0, gi.RACK_LOSS] == 1.0 and forecast(state) > INLET


def settle(state, flow, inlet, heat, t, minutes=10):
    return feed(state, [flow] * (6 * minutes), inlets=inlet, heat=heat, t0=t)


def test_a_baseline_the_loop_does_not_feel_starts_over_and_a_real_loss_keeps_its_own():
    """A checkpoint whose baseline a glitch lifted (364 L/s): the loop at 1.2 L/s reads a loss at 0.3 %
    that leaves its inlet where it was, on a rack carrying heat: no loss this deep does. The baseline
    starts over, and the loop's GPUs are no longer forecast to meet the loop's inlet 70 °C up. A loop
    at a tenth of its flow whose inlet warmed and settled (a real loss), or one whose rack reports no
    heat (an idle loop losing its flow does not warm either), keeps its baseline."""
    state = gi.new_rack_state(1)
    t = settle(state, FLOW, INLET, HEAT, 1000.0)
    state[0, gi.RACK_FLOW0] = 364.0
    t = settle(state, FLOW, INLET, HEAT, t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(FLOW)
    assert state[0, gi.RACK_LOSS] == 0.0 and math.isnan(forecast(state))
    for heat, warm in ((HEAT, INLET + RISE * 9), (math.nan, INLET)):
        state = gi.new_rack_state(1)
        t = settle(state, FLOW, INLET, heat, 1000.0)
        t = settle(state, FLOW / 10, np.linspace(INLET, warm, 60), heat, t)
        settle(state, FLOW / 10, warm, heat, t)
        assert state[0, gi.RACK_FLOW0] == pytest.approx(FLOW), heat
        assert state[0, gi.RACK_LOSS] == 1.0 and forecast(state) >= warm - 1.0, heat


@pytest.mark.parametrize("glitch", [{1200.0: 65535.0}, {1200.0: 3.0 * FLOW, 1210.0: 3.0 * FLOW}],
                         ids=["one spike", "a confirmed pair at 3x"])
def test_a_flow_glitch_on_a_healthy_loop_predicts_nothing(glitch):
    """End to end: one 65535 L/s reading on a healthy loop, or two agreeing 3x readings; before,
    every loaded GPU of the rack was predicted to throttle (or meet its power cap) within a poll,
    for hours: the loop's own flow read as a loss against the baseline the glitch set (33 % of it
    after the pair, until FLOW_TRIAL_S)."""
    topo = small_topology()
    frames, _ = World(topo, seed=0).run(2400.0)
    det = ThermalDetector(topo)
    found = []
    for f in frames:
        if f.kind == "rack":
            n = len(f)
            flow = np.full(n, FLOW)
            flow[1] = glitch.get(float(f.ts[0] - frames[0].ts[0]), FLOW)
            f = Frame("rack", f.ts, f.slot, {**f.columns, "coolant_flow": flow, "pdu_power": np.full(n, HEAT)})
        found += [p for p in det.update(f) if isinstance(p, Prediction) and p.active]
    assert found == []
    assert det.s_rack[1, gi.RACK_FLOW0] == pytest.approx(FLOW)


def run_rack_flow(world, flow_at, until, on_state=None):
    """``world``'s frames to ``until`` s through a thermal detector, rack 1's coolant flow
    ``flow_at(t)`` (t: seconds into the run), no rack reporting PDU power; ``on_state(t, s_rack)``
    before each rack frame. The detector, and its active predictions on rack 1's GPUs with their time."""
    topo = world.topology
    frames, _ = world.run(until)
    det = ThermalDetector(topo)
    rack1 = set(topo.gpus_of_rack(1).tolist())
    found = []
    for f in frames:
        t = float(f.ts[0] - frames[0].ts[0])
        if f.kind == "rack":
            if on_state is not None:
                on_state(t, det.s_rack)
            flow = np.full(len(f), FLOW)
            flow[1] = flow_at(t)
            f = Frame("rack", f.ts, f.slot, {**f.columns, "coolant_flow": flow})
        found += [(t, p) for p in det.update(f) if isinstance(p, Prediction) and p.active and p.slot in rack1]
    return det, found


@pytest.mark.parametrize("how", ["a 6x episode past the trial", "a checkpoint's"])
def test_a_baseline_far_too_high_on_a_rack_without_pdu_power_starts_over_by_its_gpus_power(how):
    """A rack reporting no PDU power whose flow baseline is one the loop does not have: a meter reading
    6x for longer than FLOW_TRIAL_S (the baseline holds it), or a checkpoint's 364 L/s. Its loop's own
    1.2 L/s then reads as a loss at a sixth or less, the inlet unmoved. Until 2026-12-02 FLOW_UNFELT
    needed the PDU's heat, so the loss stood for good (a checkpoint's 364 L/s: every loaded GPU of the
    rack predicted to throttle); its 16 GPUs at 640 W (over load_min_w each) are the heat now."""
    world = World(small_topology(), seed=0)
    if how == "a checkpoint's":
        def set_baseline(t, s_rack):
            if t == 600.0:
                s_rack[1, gi.RACK_FLOW0] = 364.0
        det, found = run_rack_flow(world, lambda t: FLOW, 1800.0, set_baseline)
        quiet_from = 1200.0
    else:
        det, found = run_rack_flow(world, lambda t: 6.0 * FLOW if 600.0 <= t < 2600.0 else FLOW, 3600.0)
        quiet_from = 3000.0
    assert det.s_rack[1, gi.RACK_FLOW0] == pytest.approx(FLOW, rel=0.01)
    assert det.s_rack[1, gi.RACK_LOSS] == 0.0 and math.isnan(gi.flow_asymptote(det.s_rack, 1, RISE, 0.0))
    assert [t for t, _ in found if t >= quiet_from] == []
    assert det.s_rack[1, gi.RACK_HEAT_SRC] == gi.HEAT_GPUS
    assert det.s_rack[1, gi.RACK_HEAT_SLOW] == pytest.approx(16 * 640.0, rel=0.05)


def test_a_pump_failed_under_idle_gpus_on_a_rack_without_pdu_power_keeps_its_baseline():
    """The same unmoved inlet at a tenth of the flow where the rack's GPUs idle (78 W each, under
    load_min_w): their heat is too little to warm the loop measurably, so the inlet says nothing of the
    baseline: the loss is kept (starting over would read the failed pump as nominal for good)."""
    topo = small_topology()
    world = World(topo, seed=0, idle_gpus=tuple(topo.gpus_of_rack(1).tolist()))
    det, _ = run_rack_flow(world, lambda t: FLOW / 10 if t >= 600.0 else FLOW, 3000.0)
    assert det.s_rack[1, gi.RACK_HEAT_SRC] == gi.HEAT_GPUS
    assert det.s_rack[1, gi.RACK_HEAT_SLOW] < det.s_rack[1, gi.RACK_HEAT_FLOOR] == 16 * 200.0
    assert det.s_rack[1, gi.RACK_FLOW0] == pytest.approx(FLOW)
    assert det.s_rack[1, gi.RACK_LOSS] == 1.0


# ---- node rows: slots and times --------------------------------------------------------------
def test_node_rows_outside_the_topology_or_without_a_time_are_counted_and_read_nowhere():
    """A slot past the last node raised IndexError out of the bank; -1 set the last node's fan."""
    topo = small_topology()  # 4 nodes
    health = PipelineHealth()
    det = CoolingDetector(topo, health)
    found = det.update(Frame("node", np.array([100.0, 100.0, 100.0, np.nan]), np.array([0, 4, -1, 2]),
                             {"fan_speed": np.array([0.6, 0.0, 0.0, 0.0])}))
    assert found == []
    assert det.s_fan_speed[0] == 0.6 and np.isnan(det.s_fan_speed[1:]).all()
    assert health.counts()[1][("cooling", "node rows with unknown slot or non-finite ts")] == 3


def test_a_stopped_fan_is_reported_once_per_refresh_when_a_row_of_its_frame_has_no_time():
    """A NaN stamp made the frame's time NaN: the fan's flag was stamped NaN (not flagged) and the
    stopped fan reported again at every frame."""
    topo = small_topology()
    det = CoolingDetector(topo, PipelineHealth())
    found = []
    for k in range(6):
        found += det.update(Frame("node", np.array([100.0 + 10 * k, np.nan]), np.array([1, 2]),
                                  {"fan_speed": np.array([0.0, 0.6])}))
    assert [(f.slot, f.field) for f in found] == [(1, "fan_speed")]
    assert math.isfinite(found[0].ts)


# ---- one GPU row stamped far ahead -----------------------------------------------------------
def job_topology():
    return Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": "a", "rack": "k"}, {"name": "b", "rack": "k"}],
                               "jobs": [{"name": "j", "nodes": ["a", "b"]}]})


def job_frame(t, n=16, slow=5, temp=None, clock=None):
    clocks = np.full(n, facts.SM_CLOCK_MAX_HZ)
    clocks[slow] *= 0.85
    if clock is not None:
        clocks[:] = clock
    temps = np.full(n, 60.0) if temp is None else temp
    return Frame("gpu", np.full(n, t), np.arange(n), {
        "sm_clock": clocks, "sm_clock_max": np.full(n, facts.SM_CLOCK_MAX_HZ), "util": np.ones(n),
        "gpu_temp": temps, "throttle_reasons": np.zeros(n), "power": np.full(n, 600.0)})


def test_one_gpu_row_a_day_ahead_does_not_stop_the_straggler_comparing():
    """A host's clock a day off for one poll set the next comparison a day ahead, for every GPU."""
    det = sg.StragglerDetector(job_topology())
    found = []
    for t in np.arange(0.0, 1800.0, 10.0):
        frame = job_frame(t)
        if t == 600.0:
            frame.ts[7] += 86400.0
        found += [(f.ts, f.slot, f.field) for f in det.update(frame)]
    assert det.next_ts <= 1800.0 + det.p["interval_s"]
    assert any(ts > 600.0 and slot == 5 and field == "sm_clock" for ts, slot, field in found)


def test_one_gpu_row_a_day_ahead_does_not_stop_the_cooling_comparisons():
    topo = small_topology()
    frames, _ = World(topo, seed=1).run(1200.0)
    det = CoolingDetector(topo, PipelineHealth())
    gpu = [f for f in frames if f.kind == "gpu"]
    for k, f in enumerate(gpu):
        if k == 40:
            f.ts[3] += 86400.0
        det.update(f)
    assert det.next_peer_ts <= gpu[-1].ts[0] + det.p["peer_interval_s"]


def test_the_frame_time_is_its_latest_stamp_unless_one_stray_lies_far_past_the_rest():
    t = 1.7e9
    assert gi.frame_now(np.array([t, t + 5.0, t + 2.0]), 60.0) == t + 5.0
    assert gi.frame_now(np.array([t, t, t + 86400.0, t]), 60.0) == t
    assert gi.frame_now(np.array([0.0, t, t + 3.0]), 60.0) == t + 3.0  # one far behind: the latest still
    assert gi.frame_now(np.array([t, t + 30.0, t + 50.0, t + 86400.0]), 60.0) == t + 50.0


# ---- GPU readings out of range in the straggler's means --------------------------------------
@pytest.mark.parametrize("bad", [math.inf, 1e6])
def test_a_temperature_no_sensor_reads_is_no_reading(bad):
    """An infinite temperature made an Anomaly with score inf; 1e6 °C sat in the GPU's mean and named it
    "hotter" at every refresh."""
    det = sg.StragglerDetector(job_topology())
    found = []
    for k, t in enumerate(np.arange(0.0, 1800.0, 10.0)):
        temp = np.full(16, 60.0)
        if k == 30:
            temp[3] = bad
        found += det.update(job_frame(t, temp=temp))
    assert all(isinstance(f, Anomaly) and math.isfinite(f.score) for f in found)
    assert not [f for f in found if f.field == "gpu_temp"]
    assert det.s_gpu[3, sg.S_TEMP] == pytest.approx(60.0)


def test_a_clock_no_gpu_runs_is_no_reading():
    """A negative clock (or one over 1.2 of its maximum) dragged a healthy GPU's clock mean: "slower"."""
    det = sg.StragglerDetector(job_topology())
    found = []
    for k, t in enumerate(np.arange(0.0, 1800.0, 10.0)):
        frame = job_frame(t)
        if k % 20 == 10:
            frame.columns["sm_clock"][9] = -facts.SM_CLOCK_MAX_HZ
        found += det.update(frame)
    assert {f.slot for f in found if f.field == "sm_clock"} == {5}


def test_one_row_a_day_ahead_does_not_move_the_incident_engine_s_clock() -> None:
    """The bank hands its processors the time a frame speaks for: with the frame's latest stamp,
    one GPU row a day ahead (replay and evaluate have no wall clock to refuse it by) moved the
    incident engine a day on, where it then refused every external event as dated in the past."""
    from foreshock.detectors.bank import DetectorBank

    topo = small_topology()
    bank = DetectorBank.from_names(topo, ("thermal",))
    engine = bank.processors[0]
    n = topo.size("gpu")
    t0 = 1.7e9
    for k in range(3):
        ts = np.full(n, t0 + 10.0 * k)
        if k == 2:
            ts[0] += 86400.0  # one host's clock a day ahead, for one poll
        bank.update(Frame("gpu", ts, np.arange(n), {"gpu_temp": np.full(n, 60.0), "power": np.full(n, 500.0)}))
    assert engine.latest_now == t0 + 20.0
