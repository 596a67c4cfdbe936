"""The demo summary's account of faults and incidents, as an auditor checked it against the
simulator's ground truth: a recurring fault, the incident named beside a fault, the summary's one
clock, a resolved incident's jobs, and the same story from the same seed at any start time."""

from __future__ import annotations

import io
import re
import types

import pytest
from click.testing import CliRunner
from rich.console import Console

import foreshock.cli.demo as demo
from foreshock.detectors.incidents import refire_note
from foreshock.events import Event
from foreshock.exporters import console
from foreshock.exporters.console import FindingTally, TimeOrigin, render_summary
from foreshock.findings import Anomaly, Incident, Prediction
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

TOPO = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "rack0", "row": "r"}],
                           "nodes": [{"name": "n0", "rack": "rack0", "gpus": 2},
                                     {"name": "n1", "rack": "rack0", "gpus": 2}]})


def _summary(tally: FindingTally, events: list[Event] = [], width: int = 200, t0: float = 0.0) -> list[str]:
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), events, console=Console(file=out, width=width),
                   origin=TimeOrigin(t0, "the simulation's start"))
    return out.getvalue().splitlines()


def _truth_row(lines: list[str], n: int) -> list[str]:
    row = next(line for line in lines if line.startswith(f"│ {n} ") and "│" in line)
    return [c.strip() for c in row.strip("│ ").split("│")]


def _throttle(ts: float, slot: int = 0, active: bool = True) -> Prediction:
    return Prediction(ts, "gpu", slot, "thermal_throttle", 400.0, 0.8, "thermal", "heading for its limit", active)


def test_a_fault_that_recurs_on_the_same_gpu_is_told_by_its_later_predictions() -> None:
    """The tally kept only the first sighting of each (finding, entity): the second fault's
    predictions, on the GPU the first had heated, were dropped as "said before the fault began",
    and the summary read "detected ... after" from a later anomaly."""
    tally = FindingTally(TOPO)
    tally.observe_findings([_throttle(100.0), _throttle(160.0)])
    tally.observe_findings([_throttle(500.0, active=False)])  # the first fault over: withdrawn
    tally.observe_findings([_throttle(2000.0), _throttle(2060.0)])  # the second fault: raised again
    tally.observe_findings([Anomaly(2350.0, "gpu", 0, "gpu_temp", 5.0, "zscore", "hot")])
    events = [Event(50.0, "fault_onset", "gpu", "n0/gpu0", "f1", "tim_degradation"),
              Event(400.0, "thermal_throttle_start", "gpu", "n0/gpu0", "f1", "tim_degradation"),
              Event(1800.0, "fault_onset", "gpu", "n0/gpu0", "f2", "tim_degradation"),
              Event(2300.0, "thermal_throttle_start", "gpu", "n0/gpu0", "f2", "tim_degradation")]
    lines = _summary(tally, events)
    assert _truth_row(lines, 1)[4:] == ["+0:01:40", "5.0 min ahead"]
    assert _truth_row(lines, 2)[4:] == ["+0:33:20", "5.0 min ahead"]
    flat = " ".join(lines)
    assert "2 tim_degradation on n0/gpu0: first impact thermal_throttle of n0/gpu0; " \
           "foreshock first said thermal_throttle of n0/gpu0" in flat
    # the predictions table still shows the first sighting
    row = next(line for line in lines if "thermal_throttle" in line and "rack0" in line)
    assert "+0:01:40" in row


def test_a_finding_quiet_for_a_while_is_raised_again_and_the_raises_are_bounded() -> None:
    tally = FindingTally(TOPO)
    for k in range(3 * console.MAX_RAISES):  # an anomaly that comes back every 20 minutes, refreshed once
        ts = 1200.0 * k
        tally.observe_findings([Anomaly(ts, "gpu", 1, "gpu_temp", 5.0, "zscore", "hot"),
                                Anomaly(ts + 30.0, "gpu", 1, "gpu_temp", 5.0, "zscore", "hot")])
    (entry,) = tally.entries.values()
    assert entry.count == 6 * console.MAX_RAISES and entry.first_ts == 0.0
    assert len(entry.raised) == console.MAX_RAISES and entry.raised[0] == 0.0  # the first, then the latest
    assert entry.raised[-1] == 1200.0 * (3 * console.MAX_RAISES - 1) and entry.raised == sorted(entry.raised)


def _incident(ts: float, iid: str, state: str, kind: str, root: str, members: tuple[str, ...],
              **kw: object) -> Incident:
    return Incident(ts, iid, state, kind, root, f"{kind} {root}: trouble", members=members, findings=1,
                    **kw)  # type: ignore[arg-type]


def test_a_fault_is_named_after_the_incident_rooted_at_its_target_not_an_older_one_holding_it() -> None:
    """A node's power failure during a cooling loss on its loop was named after the loop's
    incident (opened half an hour before, alive at the onset and holding the node's GPUs)
    instead of the node's own incident opened after the onset."""
    gpus = ("n0/gpu0", "n0/gpu1", "n1/gpu0", "n1/gpu1")
    tally = FindingTally(TOPO)
    # the loop's incident opens before the loop's fault's impact, 5 min after its onset
    tally.observe_findings([_incident(700.0, "i-loop", "open", "cooling_loop", "cdu0", gpus)])
    tally.observe_findings([_incident(4000.0, "i-node", "open", "node", "n0", gpus[:2])])
    tally.observe_findings([_incident(4100.0, "i-loop", "resolved", "cooling_loop", "cdu0", gpus)])
    tally.observe_findings([_incident(7000.0, "i-gpu", "open", "gpu", "n1/gpu1", ("n1/gpu1",))])
    tally.observe_findings([_incident(7100.0, "i-node", "resolved", "node", "n0", gpus[:2])])
    tally.observe_findings([_incident(7200.0, "i-gpu", "resolved", "gpu", "n1/gpu1", ("n1/gpu1",))])
    events = [Event(400.0, "fault_onset", "cooling_loop", "cdu0", "f1", "cooling_loss", {"racks": ["rack0"]}),
              Event(2000.0, "fault_onset", "gpu", "n1/gpu1", "f2", "hbm_overheat", {"node": "n1"}),
              Event(3900.0, "fault_onset", "node", "n0", "f3", "psu_failure", {"rack": "rack0"})]
    flat = " ".join(_summary(tally, events))
    assert _named(flat, "1 cooling_loss on cdu0") == "cooling_loop cdu0"
    assert _named(flat, "2 hbm_overheat on n1/gpu1") == "gpu n1/gpu1"
    assert _named(flat, "3 psu_failure on n0") == "node n0"


def _named(flat: str, fault: str) -> str:
    """The incident the summary's numbered line for ``fault`` names."""
    m = re.search(re.escape(fault) + r": [^;]*; [^;]*; (no incident|incident (\S+ \S+))", flat)
    assert m, flat
    return m.group(2) or m.group(1)


def test_a_fault_on_a_target_whose_own_incident_opened_on_a_prediction_before_its_onset() -> None:
    """An incident rooted at the target may open a little before the onset (the lead of a
    prediction); one alive and merely holding the target comes only after it."""
    tally = FindingTally(TOPO)
    tally.observe_findings([_incident(100.0, "i-rack", "open", "rack", "rack0", ("n0/gpu0", "n0/gpu1"))])
    tally.observe_findings([_incident(900.0, "i-gpu", "open", "gpu", "n0/gpu0", ("n0/gpu0",))])
    tally.observe_findings([_incident(1100.0, "i-rack", "growing", "rack", "rack0", ("n0/gpu0", "n0/gpu1")),
                            _incident(1100.0, "i-gpu", "growing", "gpu", "n0/gpu0", ("n0/gpu0",))])
    events = [Event(1000.0, "fault_onset", "gpu", "n0/gpu0", "f1", "tim_degradation", {"node": "n0"})]
    assert _named(" ".join(_summary(tally, events)), "1 tim_degradation on n0/gpu0") == "gpu n0/gpu0"


def test_an_incident_reason_tells_its_refires_on_the_summary_clock() -> None:
    """A re-fire note carries a UTC date ("fired again at 2026-12-05 05:10:02 UTC"); every other
    time in the summary is +h:mm:ss from the simulation's start."""
    t0 = 1796436000.0
    reason = ("cooling loop cdu0: 64 GPUs heating" + refire_note(t0 + 7384.0, True, "cooling_loop", "cdu0", "", 12)
              + refire_note(t0 + 8000.0, False, "node", "n0", "fan_failure", 1))
    tally = FindingTally(TOPO)
    tally.observe_findings([Incident(t0 + 600.0, "i1", "open", "cooling_loop", "cdu0", reason,
                                     members=("n0/gpu0",), findings=1)])
    flat = " ".join(line.strip() for line in _summary(tally, t0=t0, width=80))
    assert "UTC" not in flat
    assert ("cooling loop cdu0: 64 GPUs heating; fired again at +2:03:04: cooling_loop cdu0, 12 members; "
            "new cause at +2:13:20: node n0 (fan_failure), 1 member") in flat


def test_a_resolved_incident_still_shows_the_jobs_it_slowed_and_that_it_predicted() -> None:
    """The row's jobs and predicted cells came from the incident's last update: once resolved they
    read "-", though the cooling loss had slowed five jobs."""
    gpus = ("n0/gpu0", "n0/gpu1")
    tally = FindingTally(TOPO)
    tally.observe_findings([_incident(600.0, "i1", "open", "cooling_loop", "cdu0", gpus,
                                      predicted_members=(("n1/gpu0", 300.0), ("n1/gpu1", 420.0)),
                                      jobs=(("job1", 1.10), ("job2", 1.21)))])
    tally.observe_findings([_incident(900.0, "i1", "growing", "cooling_loop", "cdu0", gpus,
                                      predicted_members=(("n1/gpu1", 200.0),),
                                      jobs=(("job1", 1.15), ("job3", 1.05), ("job4", 1.02)))])
    # an open one beside it: its jobs now, as before
    tally.observe_findings([_incident(950.0, "i2", "open", "node", "n1", ("n1/gpu0",), jobs=(("job9", 1.3),))])
    tally.observe_findings([_incident(1500.0, "i1", "resolved", "cooling_loop", "cdu0", gpus)])
    lines = _summary(tally, width=200)
    row = next(line for line in lines if "cooling_loop cdu0" in line and "│" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[1] == "resolved"
    assert cells[4] == "2 earlier"
    assert cells[5] == "was job2 x1.21, job1 x1.15, job3 x1.05 +1"
    row = next(line for line in lines if "node n1" in line and "│" in line)
    assert row.split("│")[6].strip() == "job9 x1.30"
    # within the 80-column budget of the table
    narrow = _summary(tally, width=80)
    assert max(len(line) for line in narrow) <= 80 and "x1.21" in "".join(narrow)


class _Started(Exception):
    pass


@pytest.mark.parametrize("now", [1796438985.0, 1796438985.0 + 3 * 3600 + 1234.5])
def test_the_demo_starts_its_simulated_clock_at_a_whole_hour(monkeypatch: pytest.MonkeyPatch, now: float) -> None:
    """The optics detector buckets by the epoch's minutes: a demo started at any second told the
    same seed's story differently. Its clock starts at the hour: the same story every time."""
    seen: list[float] = []

    def simulator(**kw: object) -> None:
        seen.append(float(kw["start_time"]))  # type: ignore[arg-type]
        raise _Started

    monkeypatch.setattr(demo, "time", types.SimpleNamespace(time=lambda: now))
    monkeypatch.setattr(demo, "ClusterSimulator", simulator)
    result = CliRunner().invoke(demo.command, ["--port", "0"])
    assert isinstance(result.exception, _Started)
    assert seen == [now // 3600 * 3600] and seen[0] % 3600 == 0 and 0 <= now - seen[0] < 3600


def test_an_80_column_summary_keeps_long_entity_names_whole() -> None:
    """In an 80-column terminal the incidents table's "predicted next" and "jobs" columns folded names
    mid-word ("node1023/gpu6~" then "leaf127#b"), and the root cause's too: narrower than
    ``INCIDENTS_WIDE`` they are printed under the incident's reason, each name whole; wider, they
    stay columns of the table."""
    tally = FindingTally(TOPO)
    tally.observe_findings([_incident(600.0, "i1", "open", "link", "node1023/gpu7~leaf127#a", ("n0/gpu0",),
                                      predicted_members=(("node1023/gpu6~leaf127#b", 300.0),),
                                      jobs=(("training-job-0042", 1.10),))])
    narrow = _summary(tally, width=80)
    assert max(len(line) for line in narrow) <= 80
    text = "\n".join(narrow)
    for name in ("node1023/gpu7~leaf127#a", "node1023/gpu6~leaf127#b (5 min)", "training-job-0042 x1.10"):
        assert name in text
    assert "    predicted next: node1023/gpu6~leaf127#b (5 min)" in narrow
    wide = _summary(tally, width=160)
    header = next(line for line in wide if "root cause" in line)
    assert "predicted next" in header and "jobs (step slowdown)" in header
    assert not any(line.lstrip().startswith("predicted next:") for line in wide)
