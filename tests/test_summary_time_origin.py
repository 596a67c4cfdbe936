"""The summaries' clocks count from the simulation's start, as `simulate` and `demo` say a fault's
onset: counted from the first sample (one sampling interval later), a fault `simulate` put at
"+30 s" read "+0:00:25" in every table (review r91 R4)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from foreshock.cli.main import cli
from foreshock.exporters.console import FindingTally, TimeOrigin, render_summary
from foreshock.health import PipelineHealth
from foreshock.simulator import ClusterSimulator

# cooling-loss puts its fault at 10 % of the run: +30 s, six 5 s intervals after the start (and its
# first sample)
SIM = ["--gpus", "8", "--duration", "300", "--interval", "5", "--scenario", "cooling-loss"]


def _onset_cells(output: str, fault_type: str) -> list[str]:
    """The +h:mm:ss clock of each table row naming ``fault_type`` (the onset: its row's first clock)."""
    return [m.group(1) for line in output.splitlines() if fault_type in line and "│" in line
            if (m := re.search(r"([+-]\d+:\d\d:\d\d)", line))]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A recording written by `simulate`, and its fault's onset as `simulate` said it (+h:mm:ss)."""
    out = tmp_path_factory.mktemp("origin") / "rec"
    sim = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["simulate", *SIM, "--out", str(out), "--no-progress"])
    assert sim.exit_code == 0, sim.output
    said = re.search(r"cooling_loss on \S+ at \+(\d+) s", sim.output)
    assert said and said.group(1) == "30", sim.output
    return out, "+0:00:30"


@pytest.mark.parametrize("command", [["incidents", "--no-progress"], ["replay", "--port", "0"]])
def test_the_recording_summaries_give_the_onset_simulate_said(simulated: tuple[Path, str], command: list[str]) -> None:
    out, expected = simulated
    result = CliRunner(env={"COLUMNS": "200"}).invoke(cli, [command[0], str(out), *command[1:]])
    assert result.exit_code == 0, result.output
    assert _onset_cells(result.output, "cooling_loss") == [expected], result.output
    assert "count from the simulation's start" in result.output


@pytest.mark.parametrize("duration, header, cell", [("600", "+1 min", "+0:01:00"), ("1000", "+100 s", "+0:01:40")])
def test_demo_header_and_summary_give_one_onset(duration: str, header: str, cell: str) -> None:
    # the fault at 10 % of the run: a whole minute is said in minutes, else in seconds (not rounded)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["demo", "--gpus", "8", "--duration", duration, "--interval", "5", "--port", "0"])
    assert result.exit_code == 0, result.output
    said = re.search(r"cooling_loss on \S+ at (\+\d+ (?:min|s)) ", result.output)
    assert said and said.group(1) == header, result.output
    assert _onset_cells(result.output, "cooling_loss") == [cell], result.output


def test_a_source_without_a_start_counts_from_its_first_sample_and_says_so() -> None:
    sim = ClusterSimulator(gpus=8, scenario="healthy", seed=0, interval=5, duration=20)
    tally = FindingTally(sim.topology)
    tally.first_ts, tally.last_ts = 105.0, 200.0
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), console=Console(file=out, width=200))
    assert "+0:01:35 of telemetry time" in out.getvalue()
    assert "count from the first sample" in out.getvalue()
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), console=Console(file=out, width=200),
                   origin=TimeOrigin(100.0, "the simulation's start"))
    # the span is still the telemetry's own (the JSON line's telemetry_seconds); the origin is named
    assert "+0:01:35 of telemetry time" in out.getvalue()
    assert "count from the simulation's start" in out.getvalue()


def test_a_time_before_the_origin_reads_as_negative() -> None:
    from foreshock.exporters.console import _clock

    assert _clock(95.0, 100.0) == "-0:00:05"  # floor division had printed "+-1:59:55"
    assert _clock(3725.0, 0.0) == "+1:02:05"
