"""The end-of-run summary as audit s65 read it on a 256-GPU, 2-hour replay: the incidents table's jobs
named x1.00 ones and hid the slowed one, the predictions table folded names at 80 columns, and an
incident's "predicted next" showed ETAs from its last update, long before the run's end, as if current."""

from __future__ import annotations

import io

from rich.console import Console

from foreshock.exporters.console import FindingTally, TimeOrigin, render_summary
from foreshock.findings import Anomaly, Incident, Prediction
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

TOPO = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "rack0", "row": "r"}],
                           "nodes": [{"name": "n0", "rack": "rack0", "gpus": 2}]})


def _summary(tally: FindingTally, width: int, max_rows: int = 15) -> list[str]:
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), console=Console(file=out, width=width), max_rows=max_rows,
                   origin=TimeOrigin(0.0, "the simulation's start"))
    return out.getvalue().splitlines()


def _row_cells(lines: list[str], needle: str) -> list[str]:
    row = next(line for line in lines if needle in line and "│" in line)
    return [c.strip() for c in row.strip("│ ").split("│")]


def _loop_incident(ts: float, jobs: tuple[tuple[str, float], ...], **kw: object) -> Incident:
    return Incident(ts, "i1", "stable", "cooling_loop", "cdu1", "cooling loop cdu1: losing capacity",
                    members=("n0/gpu0", "n0/gpu1"), jobs=jobs, findings=3, **kw)  # type: ignore[arg-type]


def test_an_incidents_jobs_show_the_slowed_one_first_and_count_the_jobs_it_does_not_slow() -> None:
    """cdu1's row read "job5 x1.00, job6 x1.00, job7 x1.00 +2" (the first three in name order) while
    job9 was slowed x1.15: the slowed jobs come first, the most slowed first; one slowed under 1 %
    is counted, not named."""
    jobs = (("job5", 1.004), ("job6", 1.0), ("job7", 1.0), ("job8", 1.04), ("job9", 1.15))
    tally = FindingTally(TOPO)
    tally.observe_findings([_loop_incident(600.0, jobs)])
    wide = _summary(tally, width=200)
    assert _row_cells(wide, "cooling_loop cdu1")[5] == "job9 x1.15, job8 x1.04; 3 other jobs not slowed"
    # at 80 columns, on its own line under the reason, whole
    narrow = _summary(tally, width=80)
    assert max(len(line) for line in narrow) <= 80
    assert "    jobs (step slowdown): job9 x1.15, job8 x1.04; 3 other jobs not slowed" in narrow


def test_the_summary_and_foreshock_incidents_share_one_threshold_for_a_slowed_job() -> None:
    """``foreshock incidents`` named a job slowed from 1.01 (its own literal); the summary named them all."""
    from foreshock.cli.incidents import _jobs
    from foreshock.exporters.console import JOB_SLOWED

    calm = JOB_SLOWED - 0.005
    jobs = (("job1", JOB_SLOWED), ("job2", calm))
    tally = FindingTally(TOPO)
    tally.observe_findings([_loop_incident(600.0, jobs)])
    assert _row_cells(_summary(tally, width=200), "cooling_loop cdu1")[5] == \
        f"job1 x{JOB_SLOWED:.2f}; 1 other job not slowed"
    assert _jobs(_loop_incident(600.0, jobs)).startswith(f"job1 ×{JOB_SLOWED:.2f}, ")
    assert _jobs(_loop_incident(600.0, (("job2", calm),))) == ""


def test_an_incident_that_slows_no_job_says_how_many_it_touches() -> None:
    """None slowed now, none before: the cell counts them rather than naming x1.00 ones."""
    tally = FindingTally(TOPO)
    tally.observe_findings([_loop_incident(600.0, (("job1", 1.0), ("job2", 1.0)))])
    assert _row_cells(_summary(tally, width=200), "cooling_loop cdu1")[5] == "2 jobs not slowed"


def test_an_80_column_predictions_table_keeps_names_and_etas_whole() -> None:
    """At 80 columns the "... N more groups" row widened the rack column, and the first entity with
    its ETA folded where the edge fell ("node13/gpu1~su0-lea" then "f1 (ETA 166.1 min)")."""
    names = [f"compute-node-00{k}" for k in range(3)]
    topo = Topology.from_dict({"rows": [{"name": "r"}],
                               "racks": [{"name": f"rack{k}", "row": "r"} for k in range(3)],
                               "nodes": [{"name": n, "rack": f"rack{k}", "gpus": 8} for k, n in enumerate(names)]})
    tally = FindingTally(topo)
    etas = [9966.0, 150.0, 372.0]
    for k, eta in enumerate(etas):
        tally.observe_findings([Prediction(100.0 + k, "gpu", 8 * k + 7, "thermal_throttle", eta, 0.8, "thermal", "r")])
    tally.first_ts = 0.0
    lines = _summary(tally, width=80, max_rows=2)
    assert max(len(line) for line in lines) <= 80
    cells = [[c.strip() for c in line[1:-1].split("│")] for line in lines if line.startswith("│")]
    last = [row[4] for row in cells]
    for k in range(2):  # each name, and each ETA, on a line of the cell, whole
        assert f"{names[k]}/gpu7" in last and f"ETA {etas[k] / 60:.1f} min" in last
    assert "1 more group" in last  # (not "1 more groups")
    assert all(row[1] in ("", "rack0", "rack1") for row in cells)  # (the rack column holds racks)
    # a console with room for both on one line keeps them on one
    wide = _summary(tally, width=120, max_rows=2)
    assert f"{names[0]}/gpu7 (ETA {etas[0] / 60:.1f} min)" in _row_cells(wide, "rack0")


def test_a_short_name_and_its_eta_stay_on_one_line_at_80_columns() -> None:
    tally = FindingTally(TOPO)
    tally.observe_findings([Prediction(100.0, "gpu", 1, "power_cap", 240.0, 0.9, "power", "r")])
    tally.first_ts = 0.0
    assert _row_cells(_summary(tally, width=80), "power_cap")[4] == "n0/gpu1 (ETA 4.0 min)"


def test_predicted_next_says_when_its_etas_were_said() -> None:
    """An optic's incident last updated at +0:38:00 showed "235 min" at the end of a 2-hour replay,
    beside a live prediction of 142 min: its ETAs count from its last update, which the cell names."""
    members = (("n0/gpu0~leaf1", 14100.0), ("n0/gpu1~leaf1", 14100.0))
    tally = FindingTally(TOPO)
    tally.observe_findings([Incident(1740.0, "i1", "open", "optic", "n0/gpu0~leaf1#b", "optic degrading",
                                     members=("n0/gpu0~leaf1#b",), predicted_members=members, findings=1)])
    tally.observe_findings([Incident(2280.0, "i1", "stable", "optic", "n0/gpu0~leaf1#b", "optic degrading",
                                     members=("n0/gpu0~leaf1#b",), predicted_members=members, findings=2)])
    tally.first_ts, tally.last_ts = 0.0, 7190.0
    cell = _row_cells(_summary(tally, width=200), "optic n0/gpu0~leaf1#b")[4]
    assert cell == "n0/gpu0~leaf1 (235 min), n0/gpu1~leaf1 (235 min); ETAs as of +0:38:00"
    narrow = _summary(tally, width=80)
    assert max(len(line) for line in narrow) <= 80
    flat = " ".join(line.strip() for line in narrow)  # (the line is wrapped at the console's edge)
    assert "predicted next: n0/gpu0~leaf1 (235 min), n0/gpu1~leaf1 (235 min); ETAs as of +0:38:00" in flat
    # an incident updated at the run's end: its ETAs are current, said as before
    tally.last_ts = 2280.0
    assert _row_cells(_summary(tally, width=200), "optic n0/gpu0~leaf1#b")[4] == \
        "n0/gpu0~leaf1 (235 min), n0/gpu1~leaf1 (235 min)"


def _truth_cells(tally: FindingTally, events: list) -> list[str]:  # type: ignore[type-arg]
    out = io.StringIO()
    tally.first_ts = 0.0
    render_summary(tally, PipelineHealth(), events, console=Console(file=out, width=120))
    lines = out.getvalue().splitlines()
    rows = ([c.strip() for c in line.strip("│ ").split("│")] for line in lines if "│" in line)
    return next(cells for cells in rows if cells[:2] == ["1", events[0].fault_type])


def test_a_job_slowdown_is_led_by_any_prediction_of_its_gpus() -> None:
    """No detector predicts a job's slowdown as such: a throttle predicted of its GPU leads it."""
    from foreshock.events import Event

    tally = FindingTally(TOPO)
    tally.observe_findings([Prediction(300.0, "gpu", 0, "thermal_throttle", 300.0, 0.8, "thermal", "r")])
    events = [Event(100.0, "fault_onset", "gpu", "n0/gpu0", "f1", "tim_degradation"),
              Event(600.0, "job_slowdown_start", "job", "job0", "f1", "tim_degradation")]
    assert _truth_cells(tally, events)[-1] == "5.0 min ahead"


def test_a_prediction_of_another_event_gives_no_lead_on_the_impact() -> None:
    """demo --scenario psu-failure: a power-cap prediction beside the PSU's power-brake impact read
    "0.2 min late", as if the brake had been predicted late."""
    from foreshock.events import Event

    tally = FindingTally(TOPO)
    tally.observe_findings([Prediction(410.0, "gpu", 0, "power_cap", 60.0, 0.8, "power", "r")])
    events = [Event(100.0, "fault_onset", "node", "n0", "f1", "psu_failure"),
              Event(400.0, "power_brake_start", "gpu", "n0/gpu0", "f1", "psu_failure")]
    assert _truth_cells(tally, events)[-1] == "not predicted"
    # an anomaly that saw it coming tells more than the other event's prediction (review s65)
    tally.observe_findings([Anomaly(200.0, "gpu", 0, "power", 5.0, "robust_zscore", "power fell")])
    assert _truth_cells(tally, events)[-1] == "detected 3.3 min before"
    # a prediction of the brake itself keeps its lead
    tally.observe_findings([Prediction(340.0, "gpu", 1, "power_brake", 60.0, 0.8, "power", "r")])
    assert _truth_cells(tally, events)[-1] == "1.0 min ahead"
