"""Congestion findings (audit /tmp/s63/audit_lw/): a link that flaps within one sample is back up,
and a reason names only the signals its port reports.

- A port whose ``link_downed`` counter rose while ``link_state`` read ACTIVE before and after (down
  and back within the sample: what the counter is read for) had no "came back" stamp: it read
  "still down" for good, and was blamed for its node's congestion hours later, outside
  ``cause_window_s``, merging that episode into the flap's incident.
- InfiniBand through sysfs has no PFC counter, RoCE through ethtool alone no xmit_wait, a NIC
  without ECN no CNP count: the reason printed "PFC pause nan%" and "ECN/CNP nan/s".
"""

from __future__ import annotations

from foreshock.detectors.congestion import PARAMS
from foreshock.frames import Frame

from test_congestion import _warmed, run, slot


def _starts(findings: list) -> list:
    return [p for p in findings if p.active and "cleared" not in p.reason]


def test_a_flap_within_one_sample_is_back_up_and_explains_no_later_congestion() -> None:
    topo, fab, det, hot = _warmed(30)
    flapped, sibling = slot(topo, "n1/gpu1~leaf1"), slot(topo, "n1/gpu0~leaf0")
    hot[sibling] = 0.05
    fab.c["link_downed"][flapped] += 1  # down and back within the sample: the state reads ACTIVE throughout
    first = _starts(run(det, fab, 60, wait=hot))
    assert first and "n1/gpu1~leaf1" in first[0].reason, first  # a flap this recent is a likely cause
    assert "still down" not in first[0].reason
    run(det, fab, int(PARAMS["cause_window_s"]) + 300)  # quiet, the flap long past
    later = _starts(run(det, fab, 60, wait=hot))
    assert later and all("likely cause" not in p.reason for p in later), [p.reason for p in later]


def test_a_port_that_reports_xmit_wait_alone_is_told_in_xmit_wait_alone() -> None:
    topo, fab, det, hot = _warmed(0)
    hot[slot(topo, "n0/gpu0~leaf0")] = 0.05
    infiniband = ("xmit_wait", "link_downed", "link_state", "link_rate")  # what sysfs gives an IB port
    findings = []
    for k in range(60):
        frame = fab.tick(wait=hot if k >= 10 else None)
        findings += det.update(Frame("link", frame.ts, frame.slot, {f: frame.columns[f] for f in infiniband}))
    (start,) = _starts(findings)
    assert "xmit_wait 5.00% of time" in start.reason
    assert "nan" not in start.reason and "PFC" not in start.reason and "ECN" not in start.reason, start.reason
