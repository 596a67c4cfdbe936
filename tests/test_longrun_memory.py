"""What a run of weeks keeps: sinks whose state grew with every finding."""

from __future__ import annotations

import io

from rich.console import Console

from foreshock.exporters.console import FindingTally, render_summary
from foreshock.findings import Incident
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

TOPO = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "rack0", "row": "r"}],
                           "nodes": [{"name": "n0", "rack": "rack0", "gpus": 2}]})


def _incident(n: int, ts: float, state: str, members: int) -> Incident:
    return Incident(ts=ts, incident_id=f"inc-{n}", state=state, root_kind="node", root_entity=f"node{n}",
                    reason=f"node{n}: hot", members=tuple(f"node{n}/gpu{g}" for g in range(members)))


def test_the_tally_keeps_a_bounded_number_of_incidents_over_weeks() -> None:
    """Three weeks of ``foreshock watch`` at 150 incidents a day: the tally had kept every one
    (3150 here, growing for good); it keeps 1000, the open ones and the largest, and the summary
    still counts the rest."""
    tally = FindingTally(TOPO)
    day = 86400.0
    for n in range(3150):
        opened = n * day / 150
        members = 50 if n == 7 else 2 + n % 3  # incident 7 is the largest of the run
        tally.observe_findings([_incident(n, opened, "open", members)])
        if n != 3149:  # the last stays open
            tally.observe_findings([_incident(n, opened + 600, "resolved", members)])
    assert len(tally.incidents) == 1000
    assert len(tally.incident_opened) == 1000
    assert "inc-7" in tally.incidents and "inc-3149" in tally.incidents
    # the smallest (two members) went first, the latest opened of them before the earlier
    assert all(len(inc.members) >= 3 for inc in tally.incidents.values() if inc.incident_id != "inc-3149")
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), console=Console(file=out, width=200))
    assert f"{3150 - 15} more" in out.getvalue()


def test_open_incidents_are_never_forgotten() -> None:
    tally = FindingTally(TOPO, max_incidents=3)
    for n in range(5):
        tally.observe_findings([_incident(n, float(n), "open", 2)])
    assert len(tally.incidents) == 5  # nothing resolved to forget: the engine bounds the open ones
    tally.observe_findings([_incident(0, 9.0, "resolved", 2)])
    tally.observe_findings([_incident(9, 10.0, "open", 2)])
    assert sorted(tally.incidents) == ["inc-1", "inc-2", "inc-3", "inc-4", "inc-9"]


def _link_incident(n: int, ts: float, state: str, members: int) -> Incident:
    return Incident(ts=ts, incident_id=f"inc-{n}", state=state, root_kind="link", root_entity=f"link{n}",
                    reason=f"link{n}: flapping", members=tuple(f"link{n}/m{g}" for g in range(members)))


def test_a_forgotten_incident_that_reopens_is_counted_once_and_keeps_when_it_opened() -> None:
    """The incident engine reopens a resolved incident under its id (a flapping link, within
    ``reopen_s``). A full tally forgets the resolved incident it would list last (the fewest
    members: such a link's); reopened, it came back with its reopening as its opening time, and
    the summary counted it twice: listed, and in "N more"."""
    tally = FindingTally(TOPO, max_incidents=3)
    for n in range(2):
        tally.observe_findings([_link_incident(n, 1.0 + n, "resolved", 5)])
    tally.observe_findings([_link_incident(9, 10.0, "open", 1)])
    tally.observe_findings([_link_incident(9, 20.0, "resolved", 1)])
    tally.observe_findings([_link_incident(5, 25.0, "resolved", 5)])  # full: inc-9 (one member) is forgotten
    assert sorted(tally.incidents) == ["inc-0", "inc-1", "inc-5"] and tally.incidents_forgotten == 1
    tally.observe_findings([_link_incident(9, 30.0, "open", 1)])  # it flaps again: reopened
    # four incidents in all: three listed (inc-5 now forgotten: resolved, opened last), one more
    assert sorted(tally.incidents) == ["inc-0", "inc-1", "inc-9"]
    assert tally.incidents_forgotten == 1
    assert tally.incident_opened["inc-9"] == 10.0
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), console=Console(file=out, width=200), max_rows=2)
    assert "2 more" in out.getvalue()  # one listed past the two rows, one forgotten (3 before the fix)


def test_what_a_tally_remembers_of_forgotten_incidents_is_bounded() -> None:
    tally = FindingTally(TOPO, max_incidents=3)
    for n in range(50):
        tally.observe_findings([_link_incident(n, float(n), "resolved", 2)])
    assert len(tally.incidents) == 3 and tally.incidents_forgotten == 47
    assert len(tally._forgotten_opened) == 3
