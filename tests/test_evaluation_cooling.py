"""The evaluation harness's ``cooling`` section: how early the cooling-degradation detector flags
a failing thermal interface or fan, and which of its flags no fault explains."""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors import evaluation
from foreshock.detectors.evaluation_cooling import score_cooling
from foreshock.events import Event
from foreshock.findings import Anomaly
from foreshock.frames import Frame
from foreshock.recording import Recording, RecordingWriter

T0 = 1_700_000_000.0
H = 3600.0


@pytest.fixture
def recording(tmp_path, small_topology):
    """An empty 12-hour recording of the small topology (rack0 on cdu0, rack1 on cdu1)."""
    with RecordingWriter(tmp_path / "rec", small_topology, {"interval": 10.0}) as w:
        n = small_topology.size("gpu")
        for t in (T0, T0 + 12 * H):
            w.write(Frame("gpu", np.full(n, t), np.arange(n), {}))
    return Recording.open(tmp_path / "rec")


def flag(topo, kind, name, ts, detector="cooling"):
    return Anomaly(ts=ts, entity_kind=kind, slot=topo.slot(kind, name), field="thermal_resistance", score=1.0,
                   detector=detector)


def test_the_cooling_section_scores_flags_against_the_faults(recording):
    topo = recording.topology
    events = [
        Event(T0 + 1 * H, "fault_onset", "gpu", "node0/gpu1", "f1", "tim_degradation"),
        Event(T0 + 3 * H, "thermal_throttle_start", "gpu", "node0/gpu1", "f1", "tim_degradation"),
        Event(T0 + 2 * H, "fault_onset", "gpu", "node2/gpu3", "f2", "tim_degradation"),  # never flagged in time
        Event(T0 + 11.5 * H, "fault_onset", "gpu", "node3/gpu0", "f3", "tim_degradation"),  # too late to judge
        Event(T0 + 4 * H, "fault_onset", "node", "node1", "f4", "fan_failure"),
        Event(T0 + 6 * H, "fault_onset", "loop", "cdu0", "f5", "cooling_loss", {"racks": ["rack0"]}),
    ]
    findings = [
        flag(topo, "gpu", "node2/gpu3", T0 + 1 * H),  # before its fault began: neither a hit nor explained
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
    assert fan["lead_before_throttle_median_s"] is None
    assert m["tim_flagged"] == "1 of 2" and m["fan_flagged"] == "1 of 1"
    assert m["flagged_entities"] == 6
    assert m["unexplained"] == ["node2/gpu3", "node3/gpu7"] and m["unexplained_flags"] == 2

