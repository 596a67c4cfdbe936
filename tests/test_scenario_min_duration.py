"""A fault's duration given as a share of the run shrank with a short run: ``mixed``'s cooling
losses (12 % and 10 % of the run) lasted 14 and 12 minutes in 2 hours, less than the 15 minutes
their flow takes to fall, so the loops recovered before the throttles foreshock predicted, and
every one scored a false alarm (audit s65: thermal precision 0, 454 false alarms per 1000 GPU-h on a
2-hour run). ``min_duration`` keeps such a fault long enough to act; a 6-hour run is unchanged."""

from __future__ import annotations

import pytest

from foreshock.simulator import ClusterSimulator, ScenarioError, load_scenario
from foreshock.simulator.scenario import scenario_from_dict


def test_mixeds_cooling_losses_last_at_least_half_an_hour_and_scale_above_it() -> None:
    losses = [f for f in load_scenario("mixed").faults if f.type == "cooling_loss"]
    assert len(losses) == 2
    assert [f.duration_s(7200.0) for f in losses] == [1800.0, 1800.0]  # 864 s and 720 s as shares
    assert [f.duration_s(21600.0) for f in losses] == pytest.approx([2592.0, 2160.0])  # 12 %, 10 % of 6 h


def test_the_simulator_repairs_a_short_runs_loss_after_its_least_duration() -> None:
    scenario = scenario_from_dict({"name": "t", "faults": [
        {"type": "cooling_loss", "target": "auto", "onset": 600, "duration": "10%", "min_duration": 1800}]})
    sim = ClusterSimulator(gpus=16, duration=3600.0, scenario=scenario, seed=1)
    assert [(f.onset, f.duration) for f in sim.faults] == [(600.0, 1800.0)]  # not 360 s
    longer = ClusterSimulator(gpus=16, duration=36000.0, scenario=scenario, seed=1)
    assert [f.duration for f in longer.faults] == [3600.0]  # the share where it is the longer


@pytest.mark.parametrize(("fault", "message"), [
    ({"duration": 600, "min_duration": 1800}, "min_duration is for a duration given as a share"),
    ({"duration": None, "min_duration": 1800}, "min_duration is for a duration given as a share"),
    ({"duration": "10%", "min_duration": "5%"}, "min_duration must be seconds"),
    ({"duration": "10%", "min_duration": -5}, "min_duration must be more than 0 seconds"),
    ({"duration": "10%", "min_duration": float("nan")}, "min_duration must be a finite number"),
])
def test_a_least_duration_that_cannot_apply_is_refused(fault: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ScenarioError, match=message):
        scenario_from_dict({"name": "t", "faults": [{"type": "cooling_loss", "onset": 60, **fault}]})


def test_a_lengthened_fault_gives_way_to_the_next_of_its_type_on_its_target() -> None:
    """A 30-minute run of 16 GPUs (one loop): mixed's two losses fall on cdu0, the first (216 s as a
    share) held to 1,800 s would still be on at the second's onset (1,170 s): it ends there."""
    sim = ClusterSimulator(gpus=16, duration=1800.0, scenario="mixed", seed=1)
    losses = [f for f in sim.faults if f.type == "cooling_loss"]
    assert [(f.target_name, f.onset, f.duration) for f in losses] == [("cdu0", 216.0, 1170.0 - 216.0),
                                                                     ("cdu0", 1170.0, 1800.0)]
