"""A node frame holding several polls (a batched source, a window wider than the sampling) is read
poll by poll by the cooling detector's fan check, as if each poll came alone: until 2026-12-05 each
node's last reading stood for the whole frame — a fan stopped at the frame's first poll was flagged
at its end, and one stopped and back within the frame was never flagged (audit /tmp/s62/audit_batch/)."""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors.bank import DetectorBank
from foreshock.frames import Frame
from foreshock.topology import Topology

TOPO = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                           "nodes": [{"name": "n0", "rack": "k", "gpus": 8}, {"name": "n1", "rack": "k", "gpus": 8}]})
POLLS = np.arange(0.0, 400.0, 10.0)
STOPPED = (100.0, 110.0)  # n0's fan reads 0 % at these two polls, full speed at every other


def node_frame(stamps: np.ndarray) -> Frame:
    rows = [(t, n) for t in stamps for n in (0, 1)]
    return Frame("node", [t for t, _ in rows], [n for _, n in rows],
                 {"fan_speed": [0.0 if n == 0 and t in STOPPED else 1.0 for t, n in rows]})


def fan_findings(groups: list[np.ndarray]) -> list[tuple[float, str, str]]:
    bank = DetectorBank.from_names(TOPO, ["cooling"], processors=())
    out = [f for g in groups for f in bank.update(node_frame(g))]
    return [(f.ts, TOPO.nodes[f.slot], f.reason) for f in out if f.field == "fan_speed"]


@pytest.mark.parametrize("first", [0, 4, 10])  # frames of 6 polls, cut at different places
def test_a_frame_of_several_polls_flags_a_stopped_fan_as_one_poll_at_a_time_does(first: int) -> None:
    alone = fan_findings([POLLS[i:i + 1] for i in range(len(POLLS))])
    assert [(ts, node) for ts, node, _ in alone] == [(100.0, "n0")]  # at its first stopped reading
    groups = ([POLLS[:first]] if first else []) + [POLLS[i:i + 6] for i in range(first, len(POLLS), 6)]
    assert fan_findings(groups) == alone


def test_a_node_polled_once_and_another_twice_in_one_frame_are_each_read_in_time_order() -> None:
    # n0 read at 100 (stopped) and 110 (stopped), n1 once at 105: rows listed newest first
    frame = Frame("node", [110.0, 105.0, 100.0], [0, 1, 0], {"fan_speed": [0.0, 1.0, 0.0]})
    bank = DetectorBank.from_names(TOPO, ["cooling"], processors=())
    found = [f for f in bank.update(frame) if f.field == "fan_speed"]
    # the first poll (n0 at 100, n1 at 105) is stamped by its latest reading, as a live poll whose
    # nodes answer at different times is; the frame's end (110) is the second poll's
    assert [(f.ts, f.slot) for f in found] == [(105.0, 0)]
