"""The console summary: what `foreshock demo` and `foreshock replay` print at the end."""

from __future__ import annotations

import io

from rich.console import Console

from foreshock.exporters.console import FindingTally, render_summary
from foreshock.findings import Incident, Prediction
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

TOPO = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "rack0", "row": "r"}],
                           "nodes": [{"name": "n0", "rack": "rack0", "gpus": 2}]})


def test_a_group_shows_its_first_prediction_with_the_first_reason_and_eta() -> None:
    tally = FindingTally(TOPO)
    tally.observe_findings([Prediction(100.0, "gpu", 0, "power_cap", 240.0, 0.9, "power", "first reason: trend")])
    tally.observe_findings([Prediction(900.0, "gpu", 0, "power_cap", 0.0, 0.9, "power", "later reason: release")])
    out = io.StringIO()
    tally.first_ts = 40.0  # telemetry started 60 s before the first prediction
    render_summary(tally, PipelineHealth(), console=Console(file=out, width=200))
    text = out.getvalue()
    row = next(line for line in text.splitlines() if "power_cap" in line)
    assert "+0:01:00" in row and "ETA 4.0 min" in row
    # the reason below the table, at full width: the group's first
    why = next(line for line in text.splitlines() if "first said of" in line)
    assert "power_cap" in why and "n0/gpu0 at +0:01:00" in why and "first reason: trend" in why
    assert "later reason" not in text
    (entry,) = tally.entries.values()
    assert entry.count == 2 and entry.last_ts == 900.0


def test_an_80_column_terminal_reads_each_reason_on_full_lines() -> None:
    """The demo's summary at 80 columns: a reason is no longer folded into a narrow column (the
    incidents table's "why" was nine characters wide, the predictions' example 29)."""
    from foreshock.findings import Incident

    tally = FindingTally(TOPO)
    reason = "core heading for its limit 87 °C: " + "steady state rising, " * 12 + "inlet 26 °C"
    tally.observe_findings([Prediction(100.0, "gpu", 0, "thermal_throttle", 420.0, 0.8, "thermal", reason)])
    tally.observe_findings([Incident(160.0, "i1", "open", "cooling_loop", "cdu0",
                                     "cooling loop cdu0: 2 GPUs across 1 rack heating, inlet rising",
                                     members=("n0/gpu0",), findings=1)])
    tally.first_ts = 40.0
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), console=Console(file=out, width=80))
    text = out.getvalue()
    flat = " ".join(line.strip() for line in text.splitlines())
    assert reason in flat  # whole, only wrapped at the console's edge
    assert "cooling loop cdu0: 2 GPUs across 1 rack heating, inlet rising" in flat
    assert max(len(line) for line in text.splitlines()) <= 80


def test_the_ground_truth_table_keeps_each_fault_on_one_row_at_80_columns() -> None:
    """The truth table's cells are clocks and the lead; the entities go on a numbered line below
    it. With them in its cells an 80-column terminal folded "thermal_throttle node0/gpu1" and a
    link's long name over several lines."""
    from foreshock.events import Event

    tally = FindingTally(TOPO)
    tally.observe_findings([Prediction(400.0, "gpu", 1, "thermal_throttle", 300.0, 0.8, "thermal", "r")])
    tally.first_ts = 0.0
    events = [
        Event(100.0, "fault_onset", "gpu", "n0/gpu1", "f1", "tim_degradation"),
        Event(700.0, "thermal_throttle_start", "gpu", "n0/gpu1", "f1", "tim_degradation"),
        Event(200.0, "fault_onset", "optic", "n0/gpu0~su0-leaf2#a", "f2", "optic_degradation"),
    ]
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), events, console=Console(file=out, width=80))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if "tim_degradation" in line and "│" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells == ["1", "tim_degradation", "+0:01:40", "+0:11:40", "+0:06:40", "5.0 min ahead"]
    flat = " ".join(line.strip() for line in lines)
    assert ("1 tim_degradation on n0/gpu1: first impact thermal_throttle of n0/gpu1; "
            "foreshock first said thermal_throttle of n0/gpu1; no incident") in flat
    assert "2 optic_degradation on n0/gpu0~su0-leaf2#a: no impact yet; foreshock first said nothing" in flat


def test_a_run_without_faults_says_so_instead_of_an_empty_truth_table() -> None:
    from foreshock.events import Event

    tally = FindingTally(TOPO)
    tally.first_ts = 0.0
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), [Event(10.0, "job_start", "job", "job0", "", "")],
                   console=Console(file=out, width=80))
    text = out.getvalue()
    assert "ground truth: no fault was injected" in text and "Ground truth (simulator)" not in text


def test_names_with_brackets_print_as_they_are_named() -> None:
    """Entity names come from the user's topology and recordings: rich would read "[b]" in one
    as markup and "[/x]" as an error. Every name in the summary prints literally."""
    from foreshock.events import Event
    from foreshock.findings import Incident

    topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "rack[b]", "row": "r"}],
                               "nodes": [{"name": "n[/x]", "rack": "rack[b]", "gpus": 1}]})
    tally = FindingTally(topo)
    tally.observe_findings([Prediction(400.0, "gpu", 0, "thermal_throttle", 300.0, 0.8, "thermal", "r")])
    tally.observe_findings([Incident(450.0, "i1", "open", "rack", "rack[b]", "hot rack",
                                     members=("n[/x]/gpu0",), findings=1,
                                     predicted_members=(("n[/x]/gpu0", 300.0),))])
    tally.first_ts = 0.0
    health = PipelineHealth()
    health.problem("import", "bad [i]unit[/i]")
    events = [Event(100.0, "fault_onset", "gpu", "n[/x]/gpu0", "f1", "tim_degradation"),
              Event(700.0, "thermal_throttle_start", "gpu", "n[/x]/gpu0", "f1", "tim_degradation")]
    out = io.StringIO()
    render_summary(tally, health, events, console=Console(file=out, width=200))
    text = out.getvalue()
    assert "first said of n[/x]/gpu0 at" in text  # the predictions' reason line
    row = next(line for line in text.splitlines() if "thermal_throttle" in line and "│" in line)
    assert "rack[b]" in row and "n[/x]/gpu0 (ETA 5.0 min)" in row
    assert "rack rack[b]" in text and "n[/x]/gpu0 (5 min)" in text  # the incident's root and next
    assert "1 tim_degradation on n[/x]/gpu0: first impact thermal_throttle of n[/x]/gpu0" in text
    assert "import/bad [i]unit[/i] 1" in text


def test_the_incidents_timeline_prints_bracketed_names_literally() -> None:
    """`foreshock incidents` prints each incident's root, members and reason as they come."""
    from foreshock.cli.incidents import render_summary as incidents_summary, render_timeline
    from foreshock.findings import Incident

    opened = Incident(100.0, "i1", "open", "rack", "rack[b]", "rack rack[b]: 1 GPU [/x] hot",
                      members=("n[/x]/gpu0",), predicted_members=(("n[/x]/gpu1", 120.0),), fault_hint="rack [i]")
    moved = Incident(200.0, "i1", "growing", "node", "n[/x]", "node n[/x] hot", members=("n[/x]/gpu0",))
    out = io.StringIO()
    console = Console(file=out, width=200)
    render_timeline(console, [opened, moved], 0.0)
    incidents_summary(console, [opened, moved], 0.0)
    text = out.getvalue()
    assert "root rack rack[b] (rack [i]) — rack rack[b]: 1 GPU [/x] hot" in text
    assert "1 member(s): n[/x]/gpu0" in text and "next: n[/x]/gpu1 in 2 min" in text
    assert "rack rack[b] -> node n[/x] — node n[/x] hot" in text
    assert "node n[/x]" in next(line for line in text.splitlines() if "│" in line and "i1" in line)


def test_forgotten_incidents_are_counted_when_fewer_than_the_rows_are_kept() -> None:
    """Six resolved incidents, three kept (``max_incidents``) and three forgotten, in a table of 15
    rows: the "... 3 more" row says so. The rows left out (none: -12) were added to the forgotten
    ones, and the forgotten vanished from the summary."""
    tally = FindingTally(TOPO, max_incidents=3)
    for i in range(6):
        tally.observe_findings([Incident(100.0 + i, f"inc-{i}", "resolved", "rack", "rack0", "hot aisle",
                                         members=("n0",))])
    assert (len(tally.incidents), tally.incidents_forgotten) == (3, 3)
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), console=Console(file=out, width=200), max_rows=15)
    assert "3 more" in out.getvalue()
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), console=Console(file=out, width=200), max_rows=2)
    assert "4 more" in out.getvalue()  # one kept row left out, and the three forgotten


def test_names_ending_in_a_backslash_print_one_backslash() -> None:
    """rich's ``escape`` doubles a trailing backslash, for a tag that might follow it: a table cell
    or plain text after it then showed two (an audit's rack ``ra"ck0\\`` read ``ra"ck0\\\\``)."""
    from foreshock.findings import Incident

    topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "rack0\\", "row": "r"}],
                               "nodes": [{"name": "n0", "rack": "rack0\\", "gpus": 1}]})
    tally = FindingTally(topo)
    tally.observe_findings([Prediction(400.0, "gpu", 0, "thermal_throttle", 300.0, 0.8, "thermal", "hot\\")])
    tally.observe_findings([Incident(450.0, "i1", "open", "rack", "rack0\\", "hot rack\\", members=("n0/gpu0",),
                                     findings=1, jobs=(("job\\", 1.5),))])
    tally.first_ts = 0.0
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), console=Console(file=out, width=200))
    text = out.getvalue()
    assert "\\\\" not in text, text
    row = next(line for line in text.splitlines() if "thermal_throttle" in line and "│" in line)
    assert "│ rack0\\ " in row
    incident = next(line for line in text.splitlines() if "│" in line and "i1" not in line and "open" in line)
    assert "rack rack0\\ " in incident and "job\\ x1.50" in incident
    assert text.count("hot rack\\\n") == 1 and "thermal_throttle, first said of n0/gpu0 at +0:06:40: hot\\\n" in text


def test_a_member_due_within_half_a_minute_is_not_said_to_be_zero_minutes_off() -> None:
    """The incident timeline and the summary's "predicted next" rounded an ETA of 20 s to "0 min",
    read as due (audit /tmp/s63/audit_inc/): under half a minute is "<1 min", due is "now"."""
    from foreshock.cli.incidents import render_timeline
    from foreshock.findings import Incident

    inc = Incident(100.0, "i1", "open", "node", "n0", "node n0 hot", members=("n0/gpu0",),
                   predicted_members=(("n0/gpu1", 20.0), ("n0/gpu2", 0.0), ("n0/gpu3", 150.0)))
    out = io.StringIO()
    render_timeline(Console(file=out, width=200), [inc], 0.0)
    assert "next: n0/gpu1 in <1 min, n0/gpu2 now, n0/gpu3 in 3 min" in out.getvalue()  # (150 s: 2.5 min, half up)
    tally = FindingTally(TOPO)
    tally.observe_findings([inc])
    tally.first_ts = 0.0
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), [], console=Console(file=out, width=200))
    assert "n0/gpu1 (<1 min), n0/gpu2 (now), n0/gpu3 (3 min)" in out.getvalue()


def test_minutes_away_rounds_half_minutes_up() -> None:
    """(review of 2d8b8e6) Formatting rounds half to even: 30 s read "0 min" — the text the helper
    was made to remove — and 150 s "2 min" beside 90 s's "2 min"."""
    from foreshock.exporters.console import minutes_away

    assert [minutes_away(s) for s in (0.0, 29.9, 30.0, 89.9, 90.0, 150.0, 3600.0)] == [
        "now", "<1 min", "1 min", "1 min", "2 min", "3 min", "60 min"]
