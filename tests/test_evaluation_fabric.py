"""The fabric event kinds of the evaluation harness: link_down (predicted, censored at the end of
the recording) and congestion (detected within two samples, cause named)."""

from __future__ import annotations

import pytest

from foreshock.detectors import evaluation
from foreshock.detectors.evaluation_fabric import LINK_DOWN_HORIZON_S, names_link, score_congestion
from foreshock.events import Event
from foreshock.findings import Prediction

T0 = 1_700_000_000.0
H = 3600.0


@pytest.fixture
def recording(empty_recording):
    """An empty 12-hour recording of the small topology, sampled every second."""
    return empty_recording("link", 1.0, T0)


def link(topo, name):
    return topo.slot("link", name)


def pred(topo, name, ts, event="link_down", active=True, reason=""):
    return Prediction(ts=ts, entity_kind="link", slot=link(topo, name), event=event, eta_s=0.0,
                      confidence=1.0, detector="x", reason=reason, active=active)


def test_fabric_kinds_are_registered():
    kind = evaluation.EVENT_KINDS["link_down"]
    assert (kind.start_type, kind.end_type, kind.prediction, kind.entity_kind) == (
        "link_down", "link_up", "link_down", "link")
    assert kind.horizon_s == LINK_DOWN_HORIZON_S and kind.censor_at_end
    assert evaluation.SECTION_SCORERS["congestion"] is score_congestion
    # the thermal kinds' 30-minute claims made in a recording's last 30 minutes are not judged
    assert evaluation.EVENT_KINDS["thermal_throttle"].censor_at_end


def test_link_down_recall_lead_and_censoring(recording):
    topo = recording.topology
    a, b, c = "node0/gpu0~leaf0", "node1/gpu1~leaf1", "node2/gpu2~leaf2"
    events = [
        Event(T0 + 4 * H, "link_down", "link", a, "f1", "optic_degradation"),
        Event(T0 + 4 * H + 10, "link_up", "link", a, "f1", "optic_degradation"),
        Event(T0 + 4 * H + 600, "link_down", "link", a, "f1", "optic_degradation"),  # a flap: same episode
    ]
    findings = [
        pred(topo, a, T0 + 2 * H),  # 2 h ahead: a hit
        pred(topo, b, T0 + 1 * H),  # never followed by a down, 11 h left in the recording: false
        pred(topo, c, T0 + 11 * H),  # 1 h before the end: censored, neither true nor false
    ]
    m = evaluation.score_kind(findings, events, evaluation.EVENT_KINDS["link_down"], recording, T0, T0 + 12 * H)
    assert m["episodes"] == 1 and m["recall"] == 1.0
    assert m["lead_median_s"] == 2 * H
    assert m["precision"] == 0.5  # a's hit against b's false alarm; c not judged
    assert m["by_fault"]["optic_degradation"]["episodes"] == 1


def congestion_result(recording, findings, extra_events=()):
    topo = recording.topology
    dead, victim = "node1/gpu0~leaf0", "node1/gpu1~leaf1"
    events = [
        Event(T0 + 100, "link_down", "link", dead, "f1", "optic_degradation"),
        Event(T0 + 101, "congestion_start", "link", victim, "f1", "optic_degradation"),
        Event(T0 + 150, "congestion_end", "link", victim, "f1", "optic_degradation"),
        *extra_events,
    ]
    result = evaluation.RunResult(recording, {"fabric": findings}, events, T0, T0 + 12 * H, 0.0, 0)
    return score_congestion(result)["detectors"]["fabric"], topo, dead, victim


@pytest.mark.parametrize("delay,found", [(0, True), (2, True), (3, False)])
def test_congestion_found_within_two_samples(recording, delay, found):
    topo = recording.topology
    reason = "congestion; likely cause: traffic rerouted from node1/gpu0~leaf0"
    findings = [Prediction(ts=T0 + 101 + delay, entity_kind="link", slot=link(topo, "node1/gpu1~leaf1"),
                           event="congestion", eta_s=0.0, confidence=1.0, detector="congestion", reason=reason)]
    m, *_ = congestion_result(recording, findings)
    assert m["rerouted_episodes"] == 1
    assert m["found"] == int(found) and m["cause_named"] == int(found)
    if found:
        assert m["delay_samples_median"] == delay
        assert m["false_alarms"] == 0


def test_congestion_cause_must_name_the_failed_link(recording):
    topo = recording.topology
    findings = [Prediction(ts=T0 + 101, entity_kind="link", slot=link(topo, "node1/gpu1~leaf1"),
                           event="congestion", eta_s=0.0, confidence=1.0, detector="congestion",
                           reason="congestion; one hot port")]
    m, *_ = congestion_result(recording, findings)
    assert m["found"] == 1 and m["cause_named"] == 0 and m["cause_named_ratio"] == 0.0


@pytest.mark.parametrize("reason,named", [
    ("congestion on spine10 (xmit_wait 40.00% of time); one hot port", False),  # its own name only
    ("congestion on X; likely cause: traffic rerouted from spine12, which went down", False),  # a sibling
    ("congestion on X; likely cause: traffic rerouted from spine1, which went down", True),
    ("congestion on spine10; likely cause: traffic rerouted from spine1", True),
])
def test_a_cause_is_named_by_its_whole_name_only(reason, named):
    """Uplinks of a leaf are named ...spine1, ...spine10 .. spine15: the congestion on spine10
    after spine1 failed names spine10 in its own reason, and a substring test counted that (or a
    sibling blamed) as naming spine1."""
    assert names_link(reason.replace("spine", "su0-leaf1~rail1-spine"), "su0-leaf1~rail1-spine1") is named


def test_an_alarm_already_active_at_onset_counts_and_strays_are_false_alarms(recording):
    topo = recording.topology
    reason = "traffic rerouted from node1/gpu0~leaf0"
    victim = link(topo, "node1/gpu1~leaf1")
    findings = [
        Prediction(ts=T0 + 90, entity_kind="link", slot=victim, event="congestion", eta_s=0.0, confidence=1.0,
                   detector="congestion", reason=reason),
        Prediction(ts=T0 + 5000, entity_kind="link", slot=link(topo, "node3/gpu3~leaf3"), event="congestion",
                   eta_s=0.0, confidence=1.0, detector="congestion", reason="one hot port"),
    ]
    m, *_ = congestion_result(recording, findings)
    assert m["found"] == 1 and m["delay_samples_median"] == 0.0
    assert m["alarms"] == 2 and m["false_alarms"] == 1


def test_an_alarm_raised_long_before_the_onset_is_not_credited_with_it(recording):
    """An alarm raised an hour before the episode and never withdrawn (a port that went down while
    congested once held its alarm so) was scored as finding the episode at delay 0, with its old
    reason counted as naming the cause."""
    topo = recording.topology
    findings = [Prediction(ts=T0 - 3600, entity_kind="link", slot=link(topo, "node1/gpu1~leaf1"), event="congestion",
                           eta_s=0.0, confidence=1.0, detector="congestion",
                           reason="traffic rerouted from node1/gpu0~leaf0")]
    m, *_ = congestion_result(recording, findings)
    assert m["rerouted_episodes"] == 1 and m["found"] == 0 and m["cause_named"] == 0
