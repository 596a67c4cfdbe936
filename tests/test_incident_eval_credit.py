"""Which fault an incident's member (or a re-fire note) credits, where two faults hold it: the one
active at the time over one in its aftermath, then the one whose consequences name it, then the
narrowest physical scope (consequences do not widen it), then the latest onset."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.incident_eval import AFTERMATH_S, ONSET_SLACK_S, score_incidents
from foreshock.detectors.incidents import refire_note
from foreshock.events import Event
from foreshock.findings import Incident
from foreshock.topology import Topology

T = 1_700_000_000.0
TOPO = Topology.from_dict({
    "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
    "racks": [{"name": "rack0", "row": "row0"}, {"name": "rack1", "row": "row0"}],
    "nodes": [{"name": f"n{i}", "rack": f"rack{i // 2}", "gpus": 4} for i in range(4)],
})
HOT = ["n0/gpu0", "n1/gpu1", "n2/gpu2", "n3/gpu3"]


def onset(at: float, kind: str, target: str, fid: str, ftype: str, duration: float | None) -> Event:
    return Event(T + at, "fault_onset", kind, target, fid, ftype, {"duration_s": duration})


def by_fault(report: dict) -> dict[str, dict]:
    return {row["fault"]: row for row in report["by_fault"]}


def loop_fails_again(first_s: float, gap_s: float, join_s: float) -> dict[str, dict]:
    """cdu0 loses flow at 0 s for ``first_s`` (no consequence), is repaired, and fails again
    ``gap_s`` after the repair (inside the first one's aftermath): the second one throttles four
    GPUs, which join a loop incident ``join_s`` after its onset."""
    second = first_s + gap_s
    events = [onset(0.0, "loop", "cdu0", "f1", "cooling_loss", first_s),
              onset(second, "loop", "cdu0", "f2", "cooling_loss", 3600.0)]
    events += [Event(T + second + 30 + i, "thermal_throttle_start", "gpu", g, "f2", "cooling_loss")
               for i, g in enumerate(HOT)]
    incident = Incident(T + second + join_s, "inc-1", "open", "cooling_loop", "cdu0", "cooling loop cdu0",
                        tuple(HOT), fault_hint="cooling_loss")
    return by_fault(score_incidents([incident], events, TOPO))


def test_a_loop_failing_again_in_its_first_failure_s_aftermath_credits_the_second_failure() -> None:
    """(r106 R3) The repaired f1 (window still open, 900 s of aftermath) took the incident from
    the active f2 that caused every member: f2 scored as missed, f1 as found."""
    rows = loop_fails_again(600.0, 300.0, 200.0)
    assert rows["f2"]["incidents"] == ["inc-1"] and rows["f2"]["root_correct"]
    assert rows["f2"]["member_recall"] == 1.0
    assert rows["f2"]["onset_to_incident_s"] == 200.0
    assert rows["f1"]["incidents"] == []


@settings(max_examples=60, deadline=None)
@given(first_s=st.floats(60.0, 3600.0), gap_frac=st.floats(0.0, 1.0), join_frac=st.floats(0.0, 1.0))
def test_an_active_fault_takes_what_joins_inside_an_earlier_fault_s_aftermath(first_s: float, gap_frac: float,
                                                                               join_frac: float) -> None:
    gap = gap_frac * (AFTERMATH_S - 1.0)
    # anywhere f2 is active (its onset slack too) while f1's aftermath still holds the time
    join = -ONSET_SLACK_S + join_frac * (AFTERMATH_S - gap - 1.0 + ONSET_SLACK_S)
    rows = loop_fails_again(first_s, gap, join)
    assert rows["f2"]["incidents"] == ["inc-1"], (first_s, gap, join)
    assert rows["f1"]["incidents"] == []


def test_what_joins_while_the_first_fault_acts_still_credits_it() -> None:
    """The rule is "active then", not "latest": members that joined while f1 acted (before f2's
    onset slack) are f1's, even though f2 on the same loop began later."""
    events = [onset(0.0, "loop", "cdu0", "f1", "cooling_loss", 600.0),
              onset(900.0, "loop", "cdu0", "f2", "cooling_loss", 1800.0)]
    events += [Event(T + 300 + i, "thermal_throttle_start", "gpu", g, "f1", "cooling_loss") for i, g in enumerate(HOT)]
    incident = Incident(T + 400, "inc-1", "open", "cooling_loop", "cdu0", "cooling loop cdu0", tuple(HOT),
                        fault_hint="cooling_loss")
    rows = by_fault(score_incidents([incident], events, TOPO))
    assert rows["f1"]["incidents"] == ["inc-1"] and rows["f1"]["root_correct"]
    assert rows["f2"]["incidents"] == []


def test_consequences_do_not_widen_a_fault_s_scope_against_another_s() -> None:
    """A loop of one node: its scope (loop, rack, node, 4 GPUs) is 7 wide; the node's fan failure
    inside it reaches 5, plus the four jobs it slowed down. Ranked by the whole scope (9), the
    fault that did more lost the node's GPUs to the loop; ranked by what each physically reaches,
    the node's fans keep them (the GPUs throttled under neither: no consequence decides)."""
    topo = Topology.from_dict({
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}], "racks": [{"name": "rack0", "row": "row0"}],
        "nodes": [{"name": "n0", "rack": "rack0", "gpus": 4}],
    })
    events = [onset(0.0, "loop", "cdu0", "f1", "cooling_loss", None),
              onset(100.0, "node", "n0", "f2", "fan_failure", None)]
    events += [Event(T + 200 + j, "job_slowdown_start", "job", f"job{j}", "f2", "fan_failure") for j in range(4)]
    gpus = tuple(f"n0/gpu{i}" for i in range(4))
    incident = Incident(T + 300, "inc-1", "open", "node", "n0", "node n0", gpus, fault_hint="fan_failure")
    rows = by_fault(score_incidents([incident], events, topo))
    assert rows["f2"]["incidents"] == ["inc-1"] and rows["f2"]["root_correct"]
    assert rows["f1"]["incidents"] == []


def test_a_member_goes_to_the_fault_its_consequence_names() -> None:
    """Two faults on one node, both active: the member whose throttle the simulator blamed on the
    PSU failure credits it, the one it blamed on the fans credits them (not the one that
    happened to start first or last)."""
    events = [onset(0.0, "node", "n0", "f1", "psu_failure", None),
              onset(10.0, "node", "n0", "f2", "fan_failure", None),
              Event(T + 100, "power_brake_start", "gpu", "n0/gpu0", "f1", "psu_failure"),
              Event(T + 100, "thermal_throttle_start", "gpu", "n0/gpu1", "f2", "fan_failure")]
    incidents = [Incident(T + 150, "inc-1", "open", "gpu", "n0/gpu0", "gpu n0/gpu0", ("n0/gpu0",)),
                 Incident(T + 150, "inc-2", "open", "gpu", "n0/gpu1", "gpu n0/gpu1", ("n0/gpu1",))]
    rows = by_fault(score_incidents(incidents, events, TOPO))
    assert rows["f1"]["incidents"] == ["inc-1"]
    assert rows["f2"]["incidents"] == ["inc-2"]


def test_a_re_fire_note_credits_the_fault_active_when_it_was_told() -> None:
    """(r106 R3, re-fire) n0's fans fail at 0 s (repaired at 400 s) and again at 1150 s; the
    incident still open from the first notes at 1200 s that its root fired again. The note
    credited f1 (its window still open until 1300 s): f2 scored as missed."""
    gpus = tuple(f"n0/gpu{i}" for i in range(4))
    reason = "4 of 4 GPUs of n0 heating together: node fans or airflow"
    again = reason + refire_note(T + 1200, True, "node", "n0", "", 5)
    incidents = [Incident(T + 60, "inc-1", "open", "node", "n0", reason, ("n0",) + gpus, fault_hint="fan_failure"),
                 Incident(T + 1200, "inc-1", "growing", "node", "n0", again, ("n0",) + gpus, fault_hint="fan_failure")]
    events = [onset(0.0, "node", "n0", "f1", "fan_failure", 400.0),
              onset(1150.0, "node", "n0", "f2", "fan_failure", 600.0)]
    events += [Event(T + 60, "thermal_throttle_start", "gpu", g, "f1", "fan_failure") for g in gpus]
    events += [Event(T + 1250, "thermal_throttle_start", "gpu", g, "f2", "fan_failure") for g in gpus]
    report = score_incidents(incidents, events, TOPO)
    rows = by_fault(report)
    assert rows["f2"]["incidents"] == ["inc-1"] and rows["f2"]["refire"] and rows["f2"]["root_correct"]
    assert rows["f2"]["onset_to_incident_s"] == 50.0
    assert rows["f1"]["incidents"] == ["inc-1"] and not rows["f1"]["refire"]
    assert report["refire_credited"] == 1


def test_an_incident_claiming_no_fault_has_no_primary_one() -> None:
    """An incident of twenty members, one of them credited to a fault (under the 10 % it takes to
    claim it): that fault had been its primary, and its precision 1/20 pulled member precision down,
    while the same incident without that member was unattributed and left out. Both are unattributed."""
    truth = [onset(100.0, "gpu", "n2/gpu3", "f1", "tim_degradation", 1000.0),
             Event(T + 200, "thermal_throttle_start", "gpu", "n2/gpu3", "f1", "tim_degradation")]
    good = Incident(T + 150, "inc-1", "open", "gpu", "n2/gpu3", "r", ("n2/gpu3",), fault_hint="tim_degradation")
    noise = tuple(g for g in TOPO.gpus if g != "n2/gpu3")[:14]
    for members in (noise + ("n2/gpu3",), noise):
        crowd = Incident(T + 300, "inc-2", "open", "node", "n0", "r", members)
        report = score_incidents([good, crowd], truth, TOPO)
        assert report["member_precision"] == 1.0 and report["unattributed_incidents"] == 1, members


def test_a_fault_split_off_an_incident_is_the_incident_it_was_left_in_s() -> None:
    """A GPU's failing thermal interface told inside its node's fan incident (both faults acting),
    then split off to an incident of its own once the fans were repaired (the engine's
    ``_split_off_outliving``): both incidents claim the TIM fault with the one GPU, and the tie
    went to the earlier, the fan incident, whose root (the node) scored the TIM's root wrong.
    Of two claiming as many, the one still holding them at its last emission is the fault's."""
    gpus = [f"n1/gpu{g}" for g in range(4)]
    events = [onset(300.0, "gpu", "n1/gpu3", "f1", "tim_degradation", None),
              onset(900.0, "node", "n1", "f2", "fan_failure", 1200.0),
              Event(T + 1000.0, "thermal_throttle_start", "gpu", "n1/gpu0", "f2", "fan_failure"),
              Event(T + 3000.0, "thermal_throttle_start", "gpu", "n1/gpu3", "f1", "tim_degradation")]
    fans = [Incident(T + 960.0, "inc-1", "open", "node", "n1", "4 of 4 GPUs of n1 heating together",
                     tuple(gpus), fault_hint="fan_failure"),
            Incident(T + 3360.0, "inc-1", "resolved", "node", "n1", "3 of 4 GPUs of n1 heating together",
                     tuple(gpus[:3]), fault_hint="fan_failure")]
    tim = [Incident(T + 3360.0, "inc-2", "open", "gpu", "n1/gpu3", "n1/gpu3 heating alone",
                    ("n1/gpu3",), fault_hint="tim_degradation")]
    rows = by_fault(score_incidents(fans + tim, events, TOPO))
    assert rows["f1"]["root"] == "gpu:n1/gpu3" and rows["f1"]["root_correct"], rows["f1"]
    assert rows["f2"]["root"] == "node:n1" and rows["f2"]["root_correct"], rows["f2"]


def test_a_fault_told_on_its_own_after_its_node_incident_resolved_is_that_incident_s() -> None:
    """(review of 4591cb3) A TIM on one GPU, then its node's PSU fails: the PSU incident holds the
    GPU, resolves (its last emission still listing its members), and the GPU, still heating, is
    told in an incident of its own, rooted at it. Both hold the GPU at their last emission; the
    one that held it last is the fault's (it had been the earlier, the node's)."""
    gpus = [f"n1/gpu{g}" for g in range(4)]
    events = [onset(300.0, "gpu", "n1/gpu3", "f1", "tim_degradation", None),
              onset(900.0, "node", "n1", "f2", "psu_failure", 600.0),
              Event(T + 960.0, "power_brake_start", "gpu", "n1/gpu0", "f2", "psu_failure"),
              Event(T + 3000.0, "thermal_throttle_start", "gpu", "n1/gpu3", "f1", "tim_degradation")]
    psu = [Incident(T + 960.0, "inc-1", "open", "node", "n1", "power brake on 4 GPUs of n1", tuple(gpus),
                    fault_hint="psu_failure"),
           Incident(T + 1800.0, "inc-1", "resolved", "node", "n1", "power brake on 4 GPUs of n1", tuple(gpus),
                    fault_hint="psu_failure")]
    tim = [Incident(T + 2170.0, "inc-2", "open", "gpu", "n1/gpu3", "n1/gpu3 heating alone", ("n1/gpu3",),
                    fault_hint="tim_degradation"),
           Incident(T + 3600.0, "inc-2", "stable", "gpu", "n1/gpu3", "n1/gpu3 heating alone", ("n1/gpu3",),
                    fault_hint="tim_degradation")]
    rows = by_fault(score_incidents(psu + tim, events, TOPO))
    assert rows["f1"]["root"] == "gpu:n1/gpu3" and rows["f1"]["root_correct"], rows["f1"]
    assert rows["f2"]["root"] == "node:n1" and rows["f2"]["root_correct"], rows["f2"]
