"""The end-of-run summary in words, not Python: "findings: {'anomaly': 2}" and "1 more groups"
(live audit F7) read as a repr and a misplaced plural."""

from __future__ import annotations

import io

from rich.console import Console

from foreshock.events import Event
from foreshock.exporters.console import FindingTally, render_summary
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

TOPO = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "rack0", "row": "r"}],
                           "nodes": [{"name": "n0", "rack": "rack0", "gpus": 2}]})


def _summary(health: PipelineHealth, events: list[Event] | None = None, max_rows: int = 15) -> str:
    tally = FindingTally(TOPO)
    tally.first_ts = 0.0
    out = io.StringIO()
    render_summary(tally, health, events or [], console=Console(file=out, width=200), max_rows=max_rows)
    return out.getvalue()


def _findings_line(text: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith("telemetry:"))
    return line.split("findings: ", 1)[1]


def test_the_findings_count_reads_as_the_input_problems_do() -> None:
    health = PipelineHealth()
    health.emitted("anomaly", 2)
    assert _findings_line(_summary(health)) == "2 (anomaly 2)"
    health.emitted("prediction", 1500)
    health.emitted("incident", 1)
    text = _summary(health)
    assert _findings_line(text) == "1,503 (prediction 1,500, anomaly 2, incident 1)"  # the largest first
    assert "{" not in text and "'" not in text  # no Python dict anywhere in the summary


def test_no_findings_reads_none() -> None:
    assert _findings_line(_summary(PipelineHealth())) == "none"  # was "{}"


def test_one_fault_left_out_is_one_more_fault() -> None:
    events = [Event(60.0 * i, "fault_onset", "gpu", "n0/gpu0", f"f{i}", "xid79") for i in range(3)]
    text = _summary(PipelineHealth(), events, max_rows=2)
    assert "1 more fault " in text and "1 more faults" not in text
    assert "2 more faults" in _summary(PipelineHealth(), events, max_rows=1)


def test_no_prediction_from_a_run_shorter_than_the_forecasts_warm_up_says_why() -> None:
    """A live watch of a few minutes printed "predictions: none" and nothing more (an audit): the
    thermal forecasts had not started. A run longer than the warm-up says "none" alone."""
    from rich.console import Console

    from foreshock.detectors.thermal_fit import PARAMS
    from foreshock.exporters.console import FindingTally, render_summary
    from foreshock.health import PipelineHealth
    from foreshock.topology import Topology

    def said(span_s: float) -> str:
        tally = FindingTally(Topology.from_gpu_hosts([("n0", 0)]))
        tally.first_ts, tally.last_ts = 1.7e9, 1.7e9 + span_s
        console = Console(record=True, width=200)
        render_summary(tally, PipelineHealth(), console=console)
        return next(line for line in console.export_text().splitlines() if line.startswith("predictions:"))

    assert said(240.0) == (f"predictions: none (the thermal forecasts speak once a GPU has worked "
                           f"{PARAMS['warmup_s'] / 60:g} minutes, by default: this run's telemetry covers 4.0 min)")
    assert said(PARAMS["warmup_s"] + 60) == "predictions: none"


def test_a_prediction_under_way_when_first_said_reads_so_not_as_eta_0() -> None:
    """An InfiniBand congestion standing now is predicted with ETA 0: the table read "ETA 0.0 min"
    (a live audit); it reads "under way"."""
    from rich.console import Console

    from foreshock.exporters.console import FindingTally, render_summary
    from foreshock.findings import Prediction
    from foreshock.health import PipelineHealth
    from foreshock.topology import Topology

    topo = Topology.from_gpu_hosts([("n0", 0), ("n0", 1)])
    tally = FindingTally(topo)
    tally.observe_findings([Prediction(1.7e9, "gpu", 0, "power_cap", 0.0, 0.9, "power", "at its cap"),
                            Prediction(1.7e9, "gpu", 1, "thermal_throttle", 300.0, 0.9, "thermal", "warming")])
    console = Console(record=True, width=200)
    render_summary(tally, PipelineHealth(), console=console)
    rows = console.export_text().splitlines()
    assert "under way" in next(r for r in rows if "power_cap" in r and "n0/gpu0" in r)
    assert "ETA 5.0 min" in next(r for r in rows if "thermal_throttle" in r and "n0/gpu1" in r)
    assert not any("ETA 0.0 min" in r for r in rows)
