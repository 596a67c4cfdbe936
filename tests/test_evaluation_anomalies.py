"""The evaluation harness's ``cooling`` and ``straggler`` sections: how early the cooling-degradation
detector flags a failing thermal interface or fan, whether the straggler detector names the GPU
that sets a slowed job's pace, and which of their flags no fault explains."""

from __future__ import annotations

import pytest

from foreshock.detectors import evaluation
from foreshock.detectors.evaluation_anomalies import score_cooling, score_straggler
from foreshock.events import Event
from foreshock.findings import Anomaly

T0 = 1_700_000_000.0
H = 3600.0


@pytest.fixture
def recording(empty_recording):
    """An empty 12-hour recording of the small topology (rack0 on cdu0, rack1 on cdu1)."""
    return empty_recording("gpu", 10.0, T0)


def flag(topo, kind, name, ts, detector="cooling", field="thermal_resistance"):
    return Anomaly(ts=ts, entity_kind=kind, slot=topo.slot(kind, name), field=field, score=1.0,
                   detector=detector)


def test_the_cooling_section_scores_flags_against_the_faults(recording):
    topo = recording.topology
    events = [
        Event(T0 + 1 * H, "fault_onset", "gpu", "node0/gpu1", "f1", "tim_degradation"),
        Event(T0 + 3 * H, "thermal_throttle_start", "gpu", "node0/gpu1", "f1", "tim_degradation"),
        Event(T0 + 2 * H, "fault_onset", "gpu", "node2/gpu3", "f2", "tim_degradation"),  # never flagged in time
        Event(T0 + 11.5 * H, "fault_onset", "gpu", "node3/gpu0", "f3", "tim_degradation"),  # too late to judge
        Event(T0 + 4 * H, "fault_onset", "node", "node1", "f4", "fan_failure"),
        Event(T0 + 4 * H + 400, "thermal_throttle_start", "gpu", "node1/gpu2", "f4", "fan_failure"),
        Event(T0 + 6 * H, "fault_onset", "loop", "cdu0", "f5", "cooling_loss", {"racks": ["rack0"]}),
    ]
    findings = [
        flag(topo, "gpu", "node2/gpu3", T0 + 1 * H),  # before its fault began: neither a hit nor explained
        flag(topo, "gpu", "node0/gpu1", T0 + 0.5 * H),  # noise before its fault (then cleared): unexplained
        flag(topo, "gpu", "node0/gpu1", T0 + 1.5 * H),  # the TIM, half an hour in, 90 min before its throttle
        flag(topo, "gpu", "node0/gpu1", T0 + 1.6 * H),  # refreshed: the first flag counts
        flag(topo, "gpu", "node1/gpu5", T0 + 4 * H + 300),  # a GPU of the node whose fans failed
        flag(topo, "gpu", "node3/gpu7", T0 + 5 * H),  # nothing wrong near it
        flag(topo, "rack", "rack0", T0 + 6.2 * H),  # the loop losing flow
        flag(topo, "gpu", "node0/gpu4", T0 + 6.3 * H),  # a GPU on that loop
        flag(topo, "gpu", "node2/gpu3", T0 + 3.5 * H, detector="thermal"),  # another detector's: not counted
    ]
    result = evaluation.RunResult(recording, {"foreshock": findings, "threshold": []}, events, T0, T0 + 12 * H,
                                  0.0, 0)
    section = score_cooling(result)
    assert list(section["detectors"]) == ["foreshock"]  # the threshold rule has no cooling detector
    m = section["detectors"]["foreshock"]
    tim = m["by_fault"]["tim_degradation"]
    assert (tim["faults"], tim["flagged"], tim["recall"], tim["missed"]) == (2, 1, 0.5, ["node2/gpu3"])
    assert tim["delay_median_s"] == 0.5 * H
    assert tim["lead_before_throttle_median_s"] == tim["lead_before_throttle_min_s"] == 1.5 * H
    assert tim["throttled_after_flag"] == 1
    fan = m["by_fault"]["fan_failure"]
    assert (fan["faults"], fan["flagged"], fan["delay_median_s"]) == (1, 1, 300.0)
    assert fan["lead_before_throttle_median_s"] == 100.0  # the node's first throttle, 100 s after the flag
    assert m["tim_flagged"] == "1 of 2" and m["fan_flagged"] == "1 of 1"
    assert m["fan_lead_before_throttle_median_s"] == 100.0
    assert m["flagged_entities"] == 6
    assert m["unexplained"] == ["node0/gpu1", "node2/gpu3", "node3/gpu7"] and m["unexplained_flags"] == 3



def test_the_straggler_section_asks_for_the_slowed_jobs_pacer(recording):
    """A job slowed by a fault on its own GPUs, a node or a cooling loop (its first slowdown under
    that fault; the later ones continue it) is found when the straggler
    detector flagged one of the job's GPUs that fault touches, from the fault's onset until ten
    minutes into the slowdown; ahead when that came before the slowdown. A fabric fault's slowdown
    and an interrupted job are not judged."""
    topo = recording.topology  # job0: node0, node1 (rack0, cdu0); job1: node2, node3 (rack1, cdu1)
    events = [
        Event(T0 + 1 * H, "fault_onset", "gpu", "node0/gpu1", "f1", "tim_degradation"),
        Event(T0 + 3 * H, "job_slowdown_start", "job", "job0", "f1", "tim_degradation"),
        Event(T0 + 3.5 * H, "job_slowdown_start", "job", "job0", "f1", "tim_degradation"),  # again: the same
        Event(T0 + 2 * H, "fault_onset", "loop", "cdu1", "f2", "cooling_loss", {"racks": ["rack1"]}),
        Event(T0 + 2.2 * H, "job_slowdown_start", "job", "job1", "f2", "cooling_loss"),
        Event(T0 + 4 * H, "fault_onset", "node", "node1", "f3", "psu_failure"),
        Event(T0 + 4 * H + 30, "job_slowdown_start", "job", "job0", "f3", "psu_failure"),  # missed
        Event(T0 + 5 * H, "fault_onset", "optic", "node2/gpu0~leaf0#a", "f4", "optic_degradation"),
        Event(T0 + 5.1 * H, "job_slowdown_start", "job", "job1", "f4", "optic_degradation"),  # the fabric's
        Event(T0 + 6 * H, "fault_onset", "gpu", "node3/gpu2", "f5", "xid79"),
        Event(T0 + 6 * H, "job_slowdown_start", "job", "job1", "f5", "xid79", {"reason": "interrupted"}),
    ]
    findings = [
        flag(topo, "gpu", "node0/gpu1", T0 + 2 * H, detector="straggler"),  # an hour before its job slowed
        flag(topo, "gpu", "node2/gpu6", T0 + 2.2 * H + 120, detector="straggler"),  # 2 min into the slowdown
        flag(topo, "gpu", "node1/gpu3", T0 + 4 * H + 30 + 900, detector="straggler"),  # too late for f3
        flag(topo, "gpu", "node1/gpu0", T0 + 0.5 * H, detector="straggler"),  # nothing wrong near it yet
        flag(topo, "gpu", "node1/gpu0", T0 + 4.5 * H, detector="straggler"),  # later, after f3: its first counts
    ]
    result = evaluation.RunResult(recording, {"foreshock": findings}, events, T0, T0 + 12 * H, 0.0, 0)
    m = score_straggler(result)["detectors"]["foreshock"]
    assert (m["slowdowns"], m["pacer_flagged"], m["flagged_ahead"], m["recall"]) == (3, 2, 1, round(2 / 3, 4))
    tim, loss, psu = (m["by_fault"][k] for k in ("tim_degradation", "cooling_loss", "psu_failure"))
    assert (tim["found_ahead"], tim["lead_median_s"]) == (1, 1 * H)
    assert (loss["found"], loss["found_ahead"], loss["delay_median_s"]) == (1, 0, 120.0)
    assert (psu["found"], psu["missed"]) == (0, ["job0 at 14430 s"])
    assert set(m["by_fault"]) == {"tim_degradation", "cooling_loss", "psu_failure"}
    assert m["flagged_gpus"] == 4 and m["unexplained"] == ["node1/gpu0"]  # first flagged before any fault near it


def test_a_slowdown_in_the_recordings_last_window_is_counted_not_judged(recording):
    """Its pacer may be flagged up to ten minutes into the slowdown: one that began less than that
    before the recording's end is not judged (it read as missed), and counted, as the cooling
    section counts its faults of the last hour; the printed figures say so."""
    from foreshock.cli.evaluate import figure_texts, section_summaries

    topo = recording.topology
    end = T0 + 6 * H
    events = [
        Event(T0 + 1 * H, "fault_onset", "gpu", "node0/gpu1", "f1", "tim_degradation"),
        Event(T0 + 3 * H, "job_slowdown_start", "job", "job0", "f1", "tim_degradation"),
        Event(T0 + 5 * H, "fault_onset", "node", "node2", "f2", "psu_failure"),
        Event(end - 300, "job_slowdown_start", "job", "job1", "f2", "psu_failure"),  # 5 min before the end
    ]
    findings = [flag(topo, "gpu", "node0/gpu1", T0 + 2 * H, detector="straggler")]
    result = evaluation.RunResult(recording, {"foreshock": findings}, events, T0, end, 0.0, 0)
    section = score_straggler(result)
    m = section["detectors"]["foreshock"]
    assert (m["slowdowns"], m["slowdowns_not_judged"], m["pacer_flagged"], m["recall"]) == (1, 1, 1, 1.0)
    assert m["by_fault"]["psu_failure"]["not_judged"] == 1 and m["by_fault"]["psu_failure"]["missed"] == []
    texts = figure_texts(section_summaries({"straggler": section})["straggler"]["foreshock"], section["window_s"])
    assert texts[:2] == ["slowdowns 1 judged (1 not judged: onset within 10 min of the recording's end)",
                         "pacer_flagged 1"]


def held(topo, kind, name, start, end, detector="cooling", field="thermal_resistance"):
    """A flag raised at ``start`` and refreshed every ``refresh_s`` (600 s) while it holds."""
    return [flag(topo, kind, name, ts, detector, field) for ts in range(int(start), int(end), 600)]


def test_a_refreshed_flag_raised_before_the_fault_is_not_its_detection(recording):
    """A held flag is said again every 600 s: a GPU flagged (falsely) long before a TIM fault and
    held through its onset did not detect the fault — only a flag that starts after the onset does,
    on the GPU or, for a fan failure, on the node or one of its GPUs."""
    topo = recording.topology
    events = [
        Event(T0 + 3 * H, "fault_onset", "gpu", "node0/gpu1", "f1", "tim_degradation"),
        Event(T0 + 3 * H, "fault_onset", "gpu", "node2/gpu3", "f2", "tim_degradation"),
        Event(T0 + 5 * H, "fault_onset", "node", "node1", "f3", "fan_failure"),
    ]
    findings = [
        *held(topo, "gpu", "node0/gpu1", T0 + 0.5 * H, T0 + 6 * H),  # held through its fault's onset
        *held(topo, "gpu", "node2/gpu3", T0 + 1 * H, T0 + 2 * H),  # lapsed an hour before its fault ...
        *held(topo, "gpu", "node2/gpu3", T0 + 3 * H + 1200, T0 + 5 * H),  # ... and started anew 20 min in
        *held(topo, "node", "node1", T0 + 0.5 * H, T0 + 8 * H),  # the node held through its fans' failure
        *held(topo, "gpu", "node1/gpu2", T0 + 5 * H + 900, T0 + 8 * H),  # one of its GPUs starts 15 min in
    ]
    result = evaluation.RunResult(recording, {"foreshock": findings}, events, T0, T0 + 12 * H, 0.0, 0)
    m = score_cooling(result)["detectors"]["foreshock"]
    tim, fan = m["by_fault"]["tim_degradation"], m["by_fault"]["fan_failure"]
    assert (tim["flagged"], tim["missed"], tim["delay_median_s"]) == (1, ["node0/gpu1"], 1200.0)
    assert (fan["flagged"], fan["delay_median_s"]) == (1, 900.0)
    assert m["unexplained"] == ["node0/gpu1", "node1", "node2/gpu3"]

    # the straggler detector's flags, held on the pacer from before the fault: not found ahead. Its
    # checks are flagged and refreshed apart: "hotter" starting under a held "slower" is a new flag.
    events = [Event(T0 + 3 * H, "fault_onset", "gpu", "node0/gpu1", "f1", "tim_degradation"),
              Event(T0 + 3 * H + 900, "job_slowdown_start", "job", "job0", "f1", "tim_degradation"),
              Event(T0 + 5 * H, "fault_onset", "gpu", "node2/gpu3", "f2", "tim_degradation"),
              Event(T0 + 6 * H, "job_slowdown_start", "job", "job1", "f2", "tim_degradation"),
              Event(T0 + 7 * H, "fault_onset", "node", "node3", "f3", "psu_failure"),
              Event(T0 + 8 * H, "job_slowdown_start", "job", "job1", "f3", "psu_failure")]
    findings = [*held(topo, "gpu", "node0/gpu1", T0 + 0.5 * H, T0 + 6 * H, "straggler"),
                *held(topo, "gpu", "node2/gpu3", T0 + 4 * H, T0 + 4.5 * H, "straggler"),
                *held(topo, "gpu", "node2/gpu3", T0 + 5.5 * H, T0 + 7 * H, "straggler"),  # anew, 30 min ahead
                *held(topo, "gpu", "node3/gpu0", T0 + 6 * H, T0 + 9 * H, "straggler", "sm_clock"),
                *held(topo, "gpu", "node3/gpu0", T0 + 7.5 * H, T0 + 9 * H, "straggler", "gpu_temp")]
    result = evaluation.RunResult(recording, {"foreshock": findings}, events, T0, T0 + 12 * H, 0.0, 0)
    m = score_straggler(result)["detectors"]["foreshock"]
    assert (m["slowdowns"], m["pacer_flagged"], m["flagged_ahead"]) == (3, 2, 2)
    tim, psu = m["by_fault"]["tim_degradation"], m["by_fault"]["psu_failure"]
    assert (tim["lead_median_s"], tim["missed"]) == (0.5 * H, [f"job0 at {3 * H + 900:.0f} s"])
    assert (psu["found_ahead"], psu["lead_median_s"]) == (1, 0.5 * H)


def test_a_recording_without_faults_is_not_scored(recording):
    """A real recording has no ground truth: every flag would read as unexplained."""
    topo = recording.topology
    findings = [flag(topo, "gpu", "node0/gpu1", T0 + H), flag(topo, "gpu", "node0/gpu2", T0 + H, detector="straggler")]
    result = evaluation.RunResult(recording, {"foreshock": findings}, [], T0, T0 + 12 * H, 0.0, 0)
    assert "skipped" in score_cooling(result) and "skipped" in score_straggler(result)
