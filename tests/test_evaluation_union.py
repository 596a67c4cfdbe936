"""Alarms of one detector set for one GPU are scored as their union (``alarm_intervals``): a claim
handed from one detector to another at the same instant is one alarm, as it is when they overlap."""

from __future__ import annotations

from pathlib import Path

import pytest

from foreshock.detectors import evaluation as ev
from foreshock.findings import Prediction
from foreshock.recording import Recording
from thermal_synth import small_topology

KIND = ev.EVENT_KINDS["thermal_throttle"]
END = 20_000.0


def pred(t: float, detector: str, active: bool = True) -> Prediction:
    return Prediction(t, "gpu", 0, "thermal_throttle", 600.0, 0.9, detector, "", active)


@pytest.mark.parametrize("thermal_off", [4100.0, 4101.0], ids=["handed over at the same instant", "overlapping 1 s"])
def test_a_claim_handed_between_detectors_is_one_alarm(thermal_off: float) -> None:
    topo = small_topology(nodes=1, gpus=4, racks=1)
    findings = [pred(4000.0, "thermal"), pred(thermal_off, "thermal", False),
                pred(4100.0, "loop_warming"), pred(5700.0, "loop_warming", False)]
    assert ev.alarm_intervals(findings, KIND, topo, END)["node0/gpu0"] == [(4000.0, 5700.0)]
    # no episode follows: one false statement (raised at 4,000 s, up less than a horizon), as for one
    # detector up 4,000-5,700 s
    scored = ev.score_kind(findings, [], KIND, Recording(Path("."), topo, {}), 0.0, END)
    alone = ev.score_kind([pred(4000.0, "thermal"), pred(5700.0, "thermal", False)], [], KIND,
                          Recording(Path("."), topo, {}), 0.0, END)
    assert scored["false_alarms_per_1000_gpu_hours"] == alone["false_alarms_per_1000_gpu_hours"] > 0
