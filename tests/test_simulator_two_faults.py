"""Two faults on one GPU at once: the simulator's ground truth and the evaluation's attribution.

A thermally shut-down GPU comes back only when no active fault would take it over the shutdown
temperature again (a degraded thermal interface still there when the cooling loss that shut it
down is repaired); and the evaluation charges a false alarm as the simulator attributes the
GPU's state: an active fault over one in its aftermath, then the latest to begin.
"""

from __future__ import annotations

from pathlib import Path

from foreshock.detectors import evaluation as ev
from foreshock.events import Event
from foreshock.findings import Prediction
from foreshock.recording import Recording
from foreshock.simulator.engine import ClusterSimulator
from foreshock.simulator.scenario import scenario_from_dict

from thermal_synth import small_topology

GPU = "node0/gpu0"


def _cooling_loss_on_a_degrading_gpu(max_factor: float) -> ClusterSimulator:
    """16 GPUs on one loop: node0/gpu0's thermal interface degrades fast from the start (up to
    ``max_factor``, never repaired); the loop loses its flow at 60 s, repaired at 960 s. The GPU
    shuts down under both, put down to the cooling loss (the later fault names the GPU)."""
    scenario = scenario_from_dict({"name": "two-faults", "params": {"job_churn": False}, "faults": [
        {"type": "tim_degradation", "target": GPU, "onset": 0,
         "params": {"r_per_hour": 20.0, "max_factor": max_factor}},
        {"type": "cooling_loss", "target": "cdu0", "onset": 60, "duration": 900,
         "params": {"flow_fraction": 0.05, "ramp_s": 120}},
    ]})
    sim = ClusterSimulator(gpus=16, scenario=scenario, duration=1200.0, interval=10.0, seed=1)
    for _ in sim.iter_ticks():
        pass
    return sim


def _shutdowns(sim: ClusterSimulator) -> list[tuple[float, str]]:
    return [(e.time - sim.start_time, e.fault_id) for e in sim.events
            if e.type == "xid" and e.entity == GPU and e.detail.get("reason") == "thermal shutdown"]


def test_a_gpu_an_active_fault_keeps_over_its_limits_stays_down_after_the_other_s_repair():
    """The TIM (x6.6 by 1000 s) alone runs the die past 92 °C even at the driver's floor: after
    the cooling repair the GPU stays down, put down to the TIM. Until 2026-12-02 it rebooted once
    cool (1004 s) and shut down again a second later, XID 79 under the TIM."""
    sim = _cooling_loss_on_a_degrading_gpu(max_factor=8.0)
    shutdowns = _shutdowns(sim)
    assert len(shutdowns) == 1 and shutdowns[0][1] == "f2"  # under both: the cooling loss names it
    g = sim.topology.gpus.index(GPU)
    assert sim.shutdown[g]
    assert sim.faults[int(sim.shutdown_cause[g])].id == "f1"  # what keeps it down now: the TIM
    assert not any(e.entity == GPU and e.time - sim.start_time > 960.0 and e.type.endswith("_start")
                   for e in sim.events)


def test_a_gpu_the_driver_can_hold_under_its_remaining_fault_comes_back():
    """A milder TIM (up to x2.6) leaves a GPU its limiters can hold under 92 °C: once the
    cooling loss is repaired and the die cool, it reboots and throttles under the TIM."""
    sim = _cooling_loss_on_a_degrading_gpu(max_factor=2.6)
    assert len(_shutdowns(sim)) == 1
    assert not sim.shutdown[sim.topology.gpus.index(GPU)]
    after = [e for e in sim.events if e.entity == GPU and e.type == "thermal_throttle_start"
             and e.time - sim.start_time > 960.0]
    assert after and all(e.fault_id == "f1" for e in after)


def _false_alarm_at(t: float) -> list[Prediction]:
    """A thermal-throttle alarm on node0/gpu0 raised at ``t`` and withdrawn 100 s later: no
    episode follows, one false statement."""
    return [Prediction(t, "gpu", 0, "thermal_throttle", 60.0, 0.9, "thermal", "", True),
            Prediction(t + 100.0, "gpu", 0, "thermal_throttle", 60.0, 0.9, "thermal", "", False)]


def test_a_false_alarm_is_charged_to_the_active_fault_over_an_aftermath():
    """node0's PSU fails at 1000 s (never repaired); node0/gpu0's TIM degrades from 2000 s, repaired
    at 3000 s (aftermath to 3900 s). A false alarm at 2500 s (both active) goes to the TIM (the
    latest to begin), one at 3300 s to the PSU (active, over the TIM's aftermath), as the
    simulator names the GPU's state. Until 2026-12-02 the one at 3300 s went to the TIM."""
    rec = Recording(Path("."), small_topology(nodes=1, gpus=2, racks=1),
                    {"faults": [{"id": "f1", "duration_s": None}, {"id": "f2", "duration_s": 1000.0}]})
    events = [Event(1000.0, "fault_onset", "node", "node0", "f1", "psu_failure"),
              Event(2000.0, "fault_onset", "gpu", GPU, "f2", "tim_degradation")]
    kind = ev.EVENT_KINDS["thermal_throttle"]
    for t, charged in ((2500.0, "tim_degradation"), (3300.0, "psu_failure"), (5000.0, "psu_failure")):
        m = ev.score_kind(_false_alarm_at(t), events, kind, rec, 0.0, 10000.0)
        assert {f: r["false_alarms_per_1000_gpu_hours"] for f, r in m["by_fault"].items()
                if r["false_alarms_per_1000_gpu_hours"]} == {charged: m["false_alarms_per_1000_gpu_hours"]}, t


def test_fault_scopes_know_when_a_fault_was_repaired():
    rec = Recording(Path("."), small_topology(nodes=1, gpus=2, racks=1),
                    {"faults": [{"id": "f1", "duration_s": None}, {"id": "f2", "duration_s": 1000.0}]})
    events = [Event(1000.0, "fault_onset", "node", "node0", "f1", "psu_failure"),
              Event(2000.0, "fault_onset", "gpu", GPU, "f2", "tim_degradation")]
    psu, tim = ev.fault_scopes(rec, events, "gpu")
    assert (psu.onset, psu.repaired, psu.end) == (1000.0, float("inf"), float("inf"))
    assert (tim.onset, tim.repaired, tim.end) == (2000.0, 3000.0, 3000.0 + ev.AFTERMATH_S)


def test_a_node_fault_leaves_no_aftermath_to_charge():
    """The simulator puts nothing after a PSU's or fans' repair down to them (the brake, the derated
    limit or the lost cooling lift at once: ClusterSimulator._attribute), so a false alarm 300 s after a
    PSU's repair is ``none``'s; 300 s after a TIM's repair it is still the TIM's (its aftermath).
    Until 2026-12-05 the scorer charged the PSU for ``AFTERMATH_S`` after its repair."""
    kind = ev.EVENT_KINDS["thermal_throttle"]
    for entity_kind, entity, fault_type in (("node", "node0", "psu_failure"), ("node", "node0", "fan_failure"),
                                            ("gpu", GPU, "tim_degradation")):
        rec = Recording(Path("."), small_topology(nodes=1, gpus=2, racks=1),
                        {"faults": [{"id": "f1", "duration_s": 1000.0}]})
        events = [Event(1000.0, "fault_onset", entity_kind, entity, "f1", fault_type)]
        (scope,) = ev.fault_scopes(rec, events, "gpu")
        assert scope.repaired == 2000.0
        m = ev.score_kind(_false_alarm_at(2300.0), events, kind, rec, 0.0, 10000.0)
        charged = {f for f, r in m["by_fault"].items() if r["false_alarms_per_1000_gpu_hours"]}
        assert charged == ({"none"} if entity_kind == "node" else {fault_type}), fault_type
        # while active, the node fault is charged as before
        m = ev.score_kind(_false_alarm_at(1500.0), events, kind, rec, 0.0, 10000.0)
        assert {f for f, r in m["by_fault"].items() if r["false_alarms_per_1000_gpu_hours"]} == {fault_type}
