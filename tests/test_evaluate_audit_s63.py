"""What `foreshock evaluate` and the replay/demo summary print, as a user reads them (the s63 audit):
the ground-truth table's clocks whole at 80 columns, the matched rows' shares rounded as the main
rows', faults the cooling section did not judge counted and said, no blank lead-time plot, and a
sample count that says what it counts."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from foreshock.detectors import evaluation as ev
from foreshock.detectors.evaluation_anomalies import score_cooling
from foreshock.events import Event
from foreshock.exporters.console import FindingTally, render_summary
from foreshock.findings import Anomaly, Prediction
from foreshock.health import PipelineHealth
from foreshock.recording import Recording
from foreshock.topology import Topology

TOPO = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "rack0", "row": "r"}],
                           "nodes": [{"name": "n0", "rack": "rack0", "gpus": 4}]})


def test_the_ground_truth_table_reads_every_clock_whole() -> None:
    """Piped (80 columns), every column had been cut alike: the number's column to nothing, the
    header to "impact a", an onset at +0:01:48 to "+0:01:4" (one minute four). Wider, as before."""
    for width in (80, 120, 200):
        _check_truth_table(width)


def _check_truth_table(width: int) -> None:
    tally = FindingTally(TOPO)
    tally.observe_findings([Anomaly(850.0, "gpu", 1, "gpu_temp", 5.0, "thermal", "hot")])
    tally.observe_findings([Prediction(1300.0, "gpu", 2, "thermal_throttle", 300.0, 0.8, "thermal", "r")])
    tally.first_ts = 0.0
    events = [
        Event(108.0, "fault_onset", "gpu", "n0/gpu1", "f1", "tim_degradation"),
        Event(2100.0, "thermal_throttle_start", "gpu", "n0/gpu1", "f1", "tim_degradation"),
        Event(180.0, "fault_onset", "optic", "n0/gpu0~su0-leaf2#a", "f2", "optic_degradation"),
        Event(1260.0, "fault_onset", "gpu", "n0/gpu2", "f3", "tim_degradation"),
        Event(1700.0, "thermal_throttle_start", "gpu", "n0/gpu2", "f3", "tim_degradation"),
    ]
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), events, console=Console(file=out, width=width))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width
    top = next(k for k, line in enumerate(lines) if "Ground truth" in line)
    table = lines[top:top + next(k for k, line in enumerate(lines[top:]) if line.startswith("└"))]
    header = next(line for line in table if line.startswith("┃"))
    assert [c.strip() for c in header[1:-1].split("┃")] == ["#", "fault", "onset", "impact at", "said at",
                                                                "lead"]
    rows = [[c.strip() for c in line[1:-1].split("│")] for line in table if line.startswith("│")]
    numbered = [k for k, r in enumerate(rows) if r[0]]
    assert [rows[k][0] for k in numbered] == ["1", "2", "3"]
    assert [rows[k][2:5] for k in numbered] == [["+0:01:48", "+0:35:00", "+0:14:10"], ["+0:03:00", "-", "-"],
                                                ["+0:21:00", "+0:28:20", "+0:21:40"]]
    # the fault's name and the lead may wrap within their cells, whole
    cells = [[" ".join(r[c] for r in rows[k:(numbered + [len(rows)])[n + 1]] if r[c]) for c in (1, 5)]
             for n, k in enumerate(numbered)]
    assert [c[0].replace(" ", "") for c in cells] == ["tim_degradation", "optic_degradation", "tim_degradation"]
    assert [c[1] for c in cells] == ["detected 20.8 min before", "-", "6.7 min ahead"]
    assert not re.search(r"\+\d:\d\d:\d(?!\d)", out.getvalue()), width  # no clock cut short


def _metrics(recall: float, fa: float, **more: Any) -> dict[str, Any]:
    return {"episodes": 37, "recall": recall, "recall_at_min_lead": recall, "precision": 0.4444,
            "lead_median_s": 10.0, "lead_p10_s": 8.0, "false_alarms_per_1000_gpu_hours": fa} | more


def test_the_matched_rows_round_as_the_main_rows_do() -> None:
    """foreshock's power_cap row read 0.21 and sklearn's "matched: P >= 0.444" row 0.22 for the
    same 8 of 37 (0.2162): the matched rows rounded to the nearest, the main rows down (and a
    false-alarm rate up)."""
    matched = {"target_precision": 0.4444, "threshold": 0.9999, "recall": 0.2162, "recall_at_min_lead": 0.2162,
               "precision": 0.44449, "lead_median_s": 66.0, "false_alarms_per_1000_gpu_hours": 1.004,
               "best_precision": None,
               "at_min_lead": {"threshold": 0.5, "recall": 0.2162, "recall_at_min_lead": 0.1891,
                               "precision": 0.4449}}
    report = {"detectors": {"foreshock": {"power_cap": _metrics(0.2162, 78.35)},
                            "sklearn": {"power_cap": _metrics(0.4054, 1.004, matched=matched)}}}
    out = io.StringIO()
    Console(file=out, width=120).print(ev.render_table(report, by_fault=False))
    lines = out.getvalue().splitlines()
    main = next(line for line in lines if "foreshock power_cap" in line).split()
    assert main[3:5] == ["0.21", "0.21"]
    row = next(line for line in lines if "matched: P >=" in line)
    assert "P >= 0.444 at" in row
    # (1.004 false alarms per 1000 GPU-hours: "1.01", rounded up as the main rows' rates)
    assert row.split()[-6:] == ["0.21", "0.21", "0.444", "1.1", "min", "1.01"]
    ahead = next(line for line in lines if "most warned ahead" in line).split()
    assert ahead[-3:] == ["0.21", "0.18", "0.444"]


@pytest.fixture
def recording(empty_recording):
    return empty_recording("gpu", 10.0, 1_700_000_000.0)


def test_a_fault_too_near_the_end_to_judge_is_counted_and_said(recording) -> None:
    """A recording whose only TIM fault began in its last hour read "tim_flagged 0 of 0", as if it
    had none: the faults not judged are counted in report.json and said on the printed line."""
    from foreshock.cli.evaluate import render_sections, section_summaries

    t0, h = 1_700_000_000.0, 3600.0
    events = [Event(t0 + 11.5 * h, "fault_onset", "gpu", "node3/gpu0", "f1", "tim_degradation"),
              Event(t0 + 1 * h, "fault_onset", "node", "node1", "f2", "fan_failure")]
    result = ev.RunResult(recording, {"foreshock": []}, events, t0, t0 + 12 * h, 0.0, 0)
    section = score_cooling(result)
    m = section["detectors"]["foreshock"]
    assert (m["tim_flagged"], m["tim_not_judged"], m["fan_flagged"], m["fan_not_judged"]) == ("0 of 0", 1, "0 of 1", 0)
    assert m["by_fault"]["tim_degradation"]["not_judged"] == 1 and m["by_fault"]["fan_failure"]["not_judged"] == 0
    report = {"cooling": section}
    out = io.StringIO()
    Console(file=out, width=400).print(render_sections(section_summaries(report), report))
    text = out.getvalue()
    assert "tim_flagged 0 of 0 judged (1 not judged: onset within 1 h of the recording's end)" in text
    assert "fan_flagged 0 of 1 judged," in text and "not_judged" not in text


def test_evaluate_says_what_it_counts_what_it_did_not_judge_and_draws_no_empty_plot(tmp_path: Path) -> None:
    """A TIM fault a minute into a 20-minute simulated recording: the cooling section cannot judge
    it (and says so), nothing was predicted (no lead_times.png of blank axes, and that is said),
    and the sample count names what it counts beside what the recording holds (the job rows
    no detector reads): "samples" had read 109,200 against replay's 110,400."""
    from foreshock.cli.main import cli

    rec = tmp_path / "rec"
    sim = CliRunner().invoke(cli, ["simulate", "--scenario", "tim-degradation", "--gpus", "16", "--duration", "1200",
                                   "--out", str(rec)])
    assert sim.exit_code == 0, sim.output
    rows = json.loads((rec / "recording.json").read_text())["rows"]
    out = tmp_path / "out"
    # (wide, so that no cell of the sections' table folds a sentence asserted on)
    result = CliRunner().invoke(cli, ["evaluate", str(rec), "--detectors", "foreshock", "--report", str(out)],
                                env={"COLUMNS": "1000"})
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    report = json.loads((out / "report.json").read_text())
    fed = report["meta"]["samples"]
    assert fed == sum(rows.values()) - rows["job"]
    # (the job rows go to the incident engine alone: audit s65, "not fed" beside "telemetry fed: job")
    assert (f"{fed:,} samples fed to the detectors (of {sum(rows.values()):,} recorded; job "
            f"{rows['job']:,} to the incident engine only (step times: its jobs' slowdown))") in flat
    cooling = report["cooling"]["detectors"]["foreshock"]
    assert cooling["tim_flagged"] == "0 of 0" and cooling["tim_not_judged"] == 1
    assert "tim_flagged 0 of 0 judged (1 not judged: onset within 1 h of the recording's end)" in flat
    assert json.loads(result.output.strip().splitlines()[-1])["cooling"]["foreshock"]["tim_not_judged"] == 1
    assert not any(v.get("leads_s") for v in report["detectors"]["foreshock"].values())
    assert not (out / "lead_times.png").exists()
    assert "no lead_times.png: no thermal_throttle or power_cap episode was predicted" in flat


def test_the_lead_plot_labels_its_counts_and_says_which_set_predicted_nothing(tmp_path: Path,
                                                                              monkeypatch) -> None:
    """The histograms had no y label, and a set (or a kind) with no lead drew nothing: blank 0-1
    axes, or a set missing from the legend as if not run."""
    import matplotlib.figure

    seen: list[Any] = []
    save = matplotlib.figure.Figure.savefig

    def keep(fig: Any, *args: Any, **kw: Any) -> None:  # the figure as written, to read what it shows
        seen.append(fig)
        save(fig, *args, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "rack0", "row": "r"}],
                               "nodes": [{"name": "n0", "rack": "rack0", "gpus": 2}]})
    result = ev.RunResult(Recording(Path("."), topo, {"faults": []}), {"foreshock": [], "threshold": []}, [],
                          0.0, 3000.0, 0.0, 0)
    empty: dict[str, Any] = {"detectors": {s: {"thermal_throttle": {"leads_s": []}, "power_cap": {"leads_s": []}}
                           for s in ("foreshock", "threshold")}}
    assert ev.write_plots(result, empty, tmp_path / "none") == []
    assert not (tmp_path / "none" / "lead_times.png").exists()
    report = {"detectors": {"foreshock": {"thermal_throttle": {"leads_s": [60.0, 600.0]}, "power_cap": {"leads_s": []}},
                            "threshold": {"thermal_throttle": {"leads_s": []}, "power_cap": {"leads_s": []}}}}
    written = ev.write_plots(result, report, tmp_path / "some")
    assert [p.name for p in written] == ["lead_times.png"]
    (fig,) = seen
    throttle, cap = fig.axes
    assert throttle.get_ylabel() == cap.get_ylabel() == "episodes"
    legend = [t.get_text() for t in throttle.get_legend().get_texts()]
    assert legend == ["foreshock", "threshold: no predicted episodes"]
    assert [t.get_text() for t in cap.texts] == ["no predicted episodes"]
