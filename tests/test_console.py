"""The console summary: what `foreshock demo` and `foreshock replay` print at the end."""

from __future__ import annotations

import io

from rich.console import Console

from foreshock.exporters.console import FindingTally, render_summary
from foreshock.findings import Prediction
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
    assert "+0:01:00" in row and "ETA 4.0 min" in row and "first reason: trend" in row
    assert "later reason" not in text
    (entry,) = tally.entries.values()
    assert entry.count == 2 and entry.last_ts == 900.0
