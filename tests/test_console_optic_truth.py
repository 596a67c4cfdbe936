"""The ground-truth table's account of a degrading optic: the optics detector says ``link_down``
of the optic's link (``<link>``, no rack), the fault names the optic (``<link>#b``). The summary
matched a fault to findings on its target, its racks and its consequences' entities only, so it
read "foreshock first said nothing" beside the very prediction about the fault until the link
went down; the incident rooted at that link was not the fault's either."""

from __future__ import annotations

import io
import types
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

import foreshock.cli.demo as demo
from foreshock.events import Event
from foreshock.exporters.console import FindingTally, TimeOrigin, render_summary
from foreshock.findings import Anomaly, Incident, Prediction
from foreshock.health import PipelineHealth
from foreshock.simulator.topology_gen import build_topology

TOPO = build_topology(16)
LINK = "node0/gpu4~su0-leaf4"  # a GPU's NIC link: links carry no rack label
OPTIC = LINK + "#b"  # its leaf end, as the simulator names the optic that degrades


def _summary(tally: FindingTally, events: list[Event]) -> str:
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), events, console=Console(file=out, width=200),
                   origin=TimeOrigin(0.0, "the simulation's start"))
    return out.getvalue()


def _truth(text: str, n: int) -> tuple[list[str], str]:
    """Fault ``n``'s row of the ground-truth table (its cells) and its numbered line below it."""
    lines = text[text.index("Ground truth"):].splitlines()
    row = next(line for line in lines if line.startswith(f"│ {n} ") and "│" in line)
    line = next(line.strip() for line in lines if line.startswith(f"  {n} "))
    return [c.strip() for c in row.strip("│ ").split("│")], line


def _tally() -> FindingTally:
    tally = FindingTally(TOPO)
    tally.first_ts, tally.last_ts = 10.0, 1200.0
    return tally


def _onset(entity_kind: str = "optic", entity: str = OPTIC, detail: dict | None = None) -> Event:
    # as the simulator's onset of an optic_degradation says it: the optic, and its link in detail
    return Event(60.0, "fault_onset", entity_kind, entity, "f1", "optic_degradation",
                 {"link": LINK} if detail is None else detail)


@pytest.mark.parametrize("detail", [{"link": LINK}, {}], ids=["detail-link", "optic-name-alone"])
def test_a_degrading_optic_is_told_by_the_link_down_predicted_of_its_link(detail: dict) -> None:
    """The optics detector's prediction names the link 16 min after the onset; nothing names the
    optic itself. Its link is found from the onset's ``detail["link"]`` or, without it (a recording
    from elsewhere), from the optic's own name."""
    # the premise: the link of slot 4 and its optic 2·4+1, as the optics detector and the simulator
    # number them, and the link without a rack (the place the summary had matched it by)
    assert TOPO.name("link", 4) == LINK and TOPO.name("optic", 2 * 4 + 1) == OPTIC
    assert TOPO.labels("link", 4).get("rack", "") == ""
    tally = _tally()
    tally.observe_findings([Prediction(1020.0, "link", 4, "link_down", 14760.0, 0.8, "optics",
                                       reason=f"{OPTIC}: pre-FEC BER rising")])
    cells, line = _truth(_summary(tally, [_onset(detail=detail)]), 1)
    assert cells[4] == "+0:17:00"  # said at: the prediction at 1020 s
    assert f"foreshock first said link_down of {LINK};" in line


def test_the_prediction_of_its_link_comes_before_a_later_incident_on_the_optic() -> None:
    """The real run's order (rep1): the link_down prediction at +17 min, the incident rooted at the
    optic a minute later. The prediction is what foreshock first said, and at its time."""
    tally = _tally()
    tally.observe_findings([Prediction(1020.0, "link", 4, "link_down", 700.0, 0.8, "optics", "BER rising")])
    tally.observe_findings([Incident(1080.0, "i1", "open", "optic", OPTIC, "optic degrading",
                                     members=(OPTIC,), findings=2)])
    cells, line = _truth(_summary(tally, [_onset()]), 1)
    assert cells[4] == "+0:17:00"
    assert f"foreshock first said link_down of {LINK}; incident optic {OPTIC}" in line


def test_an_incident_rooted_at_the_optics_link_is_the_faults() -> None:
    """The link is a place the fault names: an incident rooted at it (and holding nothing else of the
    fault's) had read "no incident". One opened earlier at the link's other end, the healthy optic,
    is not the fault's: it would come first were it taken for one."""
    tally = _tally()
    tally.observe_findings([Incident(1000.0, "i0", "open", "optic", LINK + "#a", "optic noisy",
                                     members=(LINK + "#a",), findings=1)])
    tally.observe_findings([Incident(1080.0, "i1", "open", "link", LINK, "link going down",
                                     members=(LINK,), findings=1)])
    _cells, line = _truth(_summary(tally, [_onset()]), 1)
    assert line.endswith(f"; incident link {LINK}")


def test_a_fault_on_a_link_is_told_by_its_optics_findings() -> None:
    """Optic findings (their power, their BER) name an end of the link, ``<link>#a``; a fault whose
    target or consequence is the link is told by them as a GPU fault is by its node's GPUs."""
    tally = _tally()
    tally.observe_findings([Anomaly(900.0, "optic", 2 * 4, "rx_power", 5.0, "robust_zscore", "rx power falling")])
    events = [_onset("link", LINK, {})]
    cells, line = _truth(_summary(tally, events), 1)
    assert cells[4] == "+0:15:00"
    assert f"foreshock first said anomaly rx_power of {LINK}#a;" in line


def test_the_other_end_of_a_degrading_optics_link_is_not_its_finding() -> None:
    """The link is named as the place of the optic's prediction, not as a thing gone wrong: a
    finding about the healthy optic at the link's other end is not the fault's (until a consequence
    names the link itself). Alongside a finding that is the fault's, so that this fails should the
    link stop being a place at all."""
    tally = _tally()
    tally.observe_findings([Anomaly(900.0, "optic", 2 * 4, "rx_power", 5.0, "robust_zscore", "noise")])
    tally.observe_findings([Anomaly(1000.0, "link", 4, "symbol_errors", 5.0, "robust_zscore", "errors")])
    cells, line = _truth(_summary(tally, [_onset()]), 1)
    assert cells[4] == "+0:16:40"  # the link's anomaly at 1000 s, not the other end's at 900 s
    assert f"foreshock first said anomaly symbol_errors of {LINK};" in line


SCENARIO = f"""name: one-optic
description: one degrading optic on a GPU's NIC link, fast enough to be predicted within 20 min
params: {{job_churn: false}}
faults:
  - type: optic_degradation
    target: {OPTIC}
    onset: 60
    params: {{initial_db: 3.0, db_per_hour: 6.0}}
"""


@pytest.mark.slow
def test_a_demo_of_a_degrading_optic_names_the_link_down_prediction(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end through the embedded pipeline the demo runs: a 16-GPU cluster, one optic losing
    6 dB/h from +1 min, 20 min sampled every 10 s. The optics detector predicts its link down
    within the run and the link never goes down in it: the fault's row names that prediction."""
    scenario = tmp_path / "one-optic.yaml"
    scenario.write_text(SCENARIO)
    # the clock at a whole hour (the demo's own choice), fixed: the same run whenever it is run
    monkeypatch.setattr(demo, "time", types.SimpleNamespace(time=lambda: 1700006400.0 + 5.0))
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(demo.command, ["--gpus", "16", "--duration", "1200", "--interval", "10",
                                               "--scenario", str(scenario), "--seed", "0", "--port", "0",
                                               "--detectors", "optics"])
    assert result.exit_code == 0, result.output
    text = result.output
    said = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("link_down "))
    first_at = [c.strip() for c in said.strip("│ ").split("│")][3]  # the prediction's own first time
    cells, line = _truth(text, 1)
    assert cells[1] == "optic_degradation" and cells[3] == "-"  # no impact: the link is still up
    assert first_at.startswith("+0:") and cells[4] == first_at
    assert f"optic_degradation on {OPTIC}: no impact yet; foreshock first said link_down of {LINK};" in line
