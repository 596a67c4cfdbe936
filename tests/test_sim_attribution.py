"""Ground truth's attribution where faults overlap (the sim3 audit of events.jsonl): a PSU's power
brake is the PSU's whatever else weighs on its node; of two repaired faults the one that left
something behind names what follows (a repaired PSU leaves nothing); a GPU whose thermal shutdown
another fault kept over its limits at the repair comes back once the coolant has settled."""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.simulator import ClusterSimulator, build_topology
from foreshock.simulator.scenario import scenario_from_dict


def small_sim(faults: list[dict], duration: float) -> ClusterSimulator:
    """16 GPUs (node0, node1) on one loop, all in one job, 1-s physics sampled every 10 s."""
    topo = build_topology(16, job_nodes=2, idle_fraction=0.0)
    scenario = scenario_from_dict({"name": "t", "params": {"job_churn": False}, "faults": faults})
    return ClusterSimulator(topo, scenario=scenario, seed=7, params={"missing_prob": 0.0}, warmup_s=60,
                            interval=10.0, duration=duration)


def run(sim: ClusterSimulator) -> ClusterSimulator:
    for _ in sim.iter_ticks():
        pass
    return sim


def since_start(sim: ClusterSimulator, e) -> float:  # type: ignore[no-untyped-def]
    return e.time - sim.start_time


# ---- 1: the brake is the PSU's -----------------------------------------------------------------------
def test_power_brake_episodes_name_the_psu_even_when_a_fan_failure_weighs_more() -> None:
    """node0's fans fail at 10 s (×2.2 resistance from 70 s), its PSU at 100 s (brake to 190 s).
    Only the PSU sets the brake bit (0x80), yet the fan's weight (ΔR·P, r_increase 1.2 of the
    resistance at the limit) beats the brake's (the 70 % of the limit it takes away): every brake
    episode was the fan failure's (the audit's fanpsu: 8 of 8)."""
    sim = small_sim([
        {"type": "fan_failure", "target": "node0", "onset": 10, "duration": 1000},
        {"type": "psu_failure", "target": "node0", "onset": 100, "duration": 1000},
    ], duration=250)
    p = sim.params
    assert 1.2 > 1.0 - p.power_brake_factor  # (the fan outweighs the brake: the case the audit found)
    run(sim)
    brakes = [e for e in sim.events if e.type in ("power_brake_start", "power_brake_end")]
    node0 = {f"node0/gpu{k}" for k in range(8)}
    assert {e.entity for e in brakes if e.type == "power_brake_start"} == node0  # all 8 braked, only node0's
    assert {(e.fault_id, e.fault_type) for e in brakes} == {("f2", "psu_failure")}
    # the brake leaves the other consequences to the weighing: the fan still names the throttles
    throttles = [e for e in sim.events if e.type == "thermal_throttle_start" and e.entity in node0]
    assert throttles and {e.fault_id for e in throttles} == {"f1"}


# ---- 2: aftermaths are weighed ------------------------------------------------------------------------
@pytest.mark.parametrize("second", [
    {"type": "psu_failure", "target": "node0", "onset": 300, "duration": 550},
    {"type": "tim_degradation", "target": "node0/gpu0", "onset": 300, "duration": 550,
     "params": {"r_per_hour": 0.01}},
], ids=["psu", "tim"])
def test_power_caps_driven_by_still_hot_coolant_name_the_cooling_loss_over_a_repaired_psu_or_tim(
        second: dict) -> None:
    """The loop loses its flow from 10 s, repaired at 910 s; a second fault on node0 (a PSU, or a
    barely degrading TIM on node0/gpu0), later in the fault list, is repaired at 850 s. From
    ~940 s the coolant, still hot, drives power caps on every GPU of the loop: they are the
    cooling loss's on node0 as on node1. In the fault list's order the later aftermath had taken
    node0's (the audit's brake_attr: a PSU repaired 331 s before took them)."""
    sim = run(small_sim([
        {"type": "cooling_loss", "target": "cdu0", "onset": 10, "duration": 900, "params": {"ramp_s": 120}},
        second,
    ], duration=1100))
    after = [e for e in sim.events if e.type == "power_cap_start" and since_start(sim, e) > 910.0]
    hit = {e.entity for e in after if e.entity.startswith(second["target"])}
    assert hit and {e.entity.split("/")[0] for e in after} == {"node0", "node1"}  # the whole loop caps
    assert {(e.fault_id, e.fault_type) for e in after} == {("f1", "cooling_loss")}


def test_a_repaired_psu_alone_names_nothing_after_its_repair() -> None:
    """A PSU leaves nothing behind once repaired: the derated limit is lifted at once, so within
    what was its 900-s aftermath its node's GPUs are no fault's doing and a consequence starting
    there (a workload's own power cap) names none: no consequence starts under the PSU after it."""
    sim = run(small_sim([{"type": "psu_failure", "target": "node0", "onset": 20, "duration": 200}], duration=600))
    assert any(e.type == "power_cap_start" and e.fault_id == "f1" for e in sim.events)  # it capped while on
    late = [e for e in sim.events if e.type.endswith("_start") and e.entity_kind == "gpu"
            and since_start(sim, e) > 220.0]
    assert all(e.fault_id != "f1" for e in late)
    assert (sim.gpu_cause == -1).all()  # (at 600 s, inside its old 900-s aftermath: no one's)


# ---- 3: a shutdown kept over its limits after its cause's repair comes back -------------------------
def test_a_gpu_kept_down_by_hot_coolant_at_the_repair_reboots_once_the_coolant_settles() -> None:
    """node0/gpu0's thermal interface degrades to ×2.6 for good (the driver holds it under 92 °C
    at a normal inlet); the loop loses 97 % of its flow from 60 s to 960 s and shuts the GPU down.
    At the repair the coolant is still ~67 °C: powered on then it would run away again, so it
    stays down, named by the TIM. Once the coolant has settled (~23 °C) it comes back and throttles
    under the TIM, without shutting down again. Handed to the never-repaired TIM at the repair,
    it stayed down to the end (the audit's severe: heading for 55 °C, down for good)."""
    sim = small_sim([
        {"type": "tim_degradation", "target": "node0/gpu0", "onset": 0,
         "params": {"r_per_hour": 20.0, "max_factor": 2.6}},
        {"type": "cooling_loss", "target": "cdu0", "onset": 60, "duration": 900,
         "params": {"flow_fraction": 0.03, "ramp_s": 120}},
    ], duration=1800)
    g = sim.topology.gpus.index("node0/gpu0")
    seen: list[tuple[float, bool, float]] = []  # (elapsed, down, rack inlet) each step
    sim.probes.append(lambda s: seen.append((s.elapsed, bool(s.shutdown[g]),
                                             float(s.cooling.rack_inlet[s.gpu_rack[g]]))))
    run(sim)
    xids = [e for e in sim.events if e.entity == "node0/gpu0" and e.type == "xid"]
    assert [(e.detail.get("reason"), e.fault_id) for e in xids] == [("thermal shutdown", "f2")]  # one, the loss's
    down_at = since_start(sim, xids[0])
    at_repair = [(d, inlet) for t, d, inlet in seen if 960.0 <= t < 961.0]
    assert at_repair[0][0] and at_repair[0][1] > 60.0  # down, coolant hot, when the loss is repaired
    back = [(t, inlet) for t, d, inlet in seen if t > down_at and not d]
    assert back, "the GPU never came back"
    back_at, inlet_then = back[0]
    assert all(not d for t, d, _ in seen if t >= back_at)  # up for good: no second shutdown
    assert back_at >= down_at + 600.0 and inlet_then < 25.0  # after the reboot time, into settled coolant
    after = [e for e in sim.events if e.entity == "node0/gpu0" and e.type == "thermal_throttle_start"
             and since_start(sim, e) >= back_at]
    assert after and {e.fault_id for e in after} == {"f1"}  # running again, throttled by its TIM
    # telemetry shows it: a temperature sample again after the reboot
    assert np.isfinite(sim.gpu.temp[g]) and sim.gpu.alive[g]
