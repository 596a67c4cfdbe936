"""Simulator ground truth, audit of 2026-12-04: which of several faults names a GPU's throttling,
and the SW power cap bit against the sampled clock.

1. Several active faults on one GPU: the one acting most on it names its episodes, not the last
   one in the fault list (a 1 % flow loss took a failed fan's throttles; a random fault, listed
   after the scenario's, took a later scenario fault's).
2. Bit 0x4 (SW power cap: clocks held under the requested clock by the power limiter) came from
   any capped phase of the step while the clock was the other phase's: 38 % of its samples read
   the max clock.
"""

from __future__ import annotations

import numpy as np

from foreshock import facts
from foreshock.simulator.engine import ClusterSimulator
from foreshock.simulator.scenario import scenario_from_dict


def _fan_failure_on_node1(mild_cooling_loss: bool) -> ClusterSimulator:
    faults = [{"type": "fan_failure", "target": "node1", "onset": 60}]
    if mild_cooling_loss:  # 1 % of the loop's flow lost: the coolant rises by hundredths of a degree
        faults.append({"type": "cooling_loss", "target": "cdu0", "onset": 90, "duration": 1200,
                       "params": {"flow_fraction": 0.99, "ramp_s": 60}})
    scenario = scenario_from_dict({"name": "fan", "params": {"job_churn": False}, "faults": faults})
    return ClusterSimulator(gpus=32, scenario=scenario, seed=2, interval=10, duration=400)


def _throttle_faults(sim: ClusterSimulator) -> set[str]:
    for _ in sim.iter_ticks():
        pass
    return {e.fault_type for e in sim.events if e.type == "thermal_throttle_start" and e.entity.startswith("node1/")}


def test_a_negligible_later_fault_does_not_take_a_failed_fan_s_throttles() -> None:
    assert _throttle_faults(_fan_failure_on_node1(False)) == {"fan_failure"}
    assert _throttle_faults(_fan_failure_on_node1(True)) == {"fan_failure"}


def test_a_fault_listed_after_another_does_not_name_its_gpus_for_its_place_in_the_list() -> None:
    """A random fault is appended after the scenario's: listed last, the mild cooling loss named
    every GPU of the loop, the fan's throttling ones included."""
    sim = _fan_failure_on_node1(False)
    sim._add_fault("cooling_loss", 0, "cdu0", 30.0, None, {"flow_fraction": 0.99, "ramp_s": 60.0})
    assert _throttle_faults(sim) == {"fan_failure"}


def test_the_power_cap_bit_comes_with_the_clock_it_is_sampled_with() -> None:
    """No sample shows 0x4 at the max clock, and every one showing it lies in a power-cap
    episode of the ground truth (derived from the same bit)."""
    sim = ClusterSimulator(gpus=64, scenario="healthy", seed=1, interval=10, duration=600)
    capped_samples = 0
    for tick in sim.iter_ticks():
        g = tick[0].columns
        bits = np.nan_to_num(g["throttle_reasons"]).astype(np.int64)
        capped = (g["util"] > 0) & ((bits & facts.THROTTLE_SW_POWER_CAP) != 0)
        capped_samples += int(capped.sum())
        assert not (capped & (g["sm_clock"] >= g["sm_clock_max"])).any(), sim.elapsed
        assert sim.trackers["power_cap"].active[capped].all(), sim.elapsed
    assert capped_samples > 20
