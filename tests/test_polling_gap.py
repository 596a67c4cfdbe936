"""A live source's polls never come closer than the input guard's spacing (CI of ed1da4a).

`watch --interval 0.01` polled on a 10-ms grid while the guard refuses a row less than 10 ms
after its entity's previous one (``MIN_SPACING_S``). A poll the scheduler woke 0.37 ms late and
the next one on time stamped their rows 9.63 ms apart: the second was refused as the same sample
sent again. A source is now polled every ``MIN_INTERVAL_S`` (20 ms) at the fastest, and a poll
starts ``POLL_GAP_S`` at least after the previous one ended, so no lateness brings two polls'
stamps within the guard's spacing."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.cli.main import cli
from foreshock.frames import Frame
from foreshock.guard import MIN_INTERVAL_S, MIN_SPACING_S, POLL_GAP_S, InputGuard
from foreshock.health import PipelineHealth
from foreshock.simulator import ClusterSimulator
from foreshock.streams.polling import PollingSource
from foreshock.topology import Topology

from test_streams_polling import Slow  # the fake-clock source of the grid's tests

TOPO = Topology.from_gpu_hosts([("n0", 0)])


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 12).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0.0, 0.99), min_size=n, max_size=n),
    st.lists(st.floats(0.0, 0.9 * MIN_INTERVAL_S), min_size=n, max_size=n),
    st.none() | st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))),
    st.sampled_from([MIN_INTERVAL_S, 0.05, 1.0]))
def test_no_lateness_brings_two_polls_within_the_guard_spacing(polls, interval: float) -> None:
    """Whatever each poll takes (under an interval), however late the scheduler wakes it and
    wherever in the poll its stamp is read: the next poll starts ``POLL_GAP_S`` after this one's
    stamps (its start, or its end for a source stamping as it goes), and the guard takes every row."""
    took, late, at = polls
    health = PipelineHealth()
    source = Slow(took, late, at, interval=interval, health=health, max_polls=len(took))
    frames = list(source)
    assert len(frames) == len(took)
    stamped_by = np.array(source.began[:-1] if at is None else source.ended[:-1])
    assert (np.array(source.began[1:]) - stamped_by >= POLL_GAP_S - 1e-12).all()
    guard = InputGuard(TOPO, PipelineHealth())
    kept = sum(len(guard.check(frame)) for frame in frames)
    assert kept == len(frames) and not guard.health.problems
    assert np.diff([f.ts[0] for f in frames]).min() > MIN_SPACING_S


def test_a_quick_poll_stays_on_its_grid() -> None:
    """The gap is a floor, not a new cadence: polls quicker than the interval less the gap start
    on the grid, as before, and skip nothing."""
    health = PipelineHealth()
    source = Slow([0.1] * 5, [0.0] * 5, [1.0] * 5, interval=MIN_INTERVAL_S, health=health, max_polls=5)
    list(source)
    assert [b / MIN_INTERVAL_S for b in source.began] == pytest.approx([0, 1, 2, 3, 4])
    assert not health.polls_skipped


@pytest.mark.parametrize("interval", [MIN_INTERVAL_S, 0.1, 10.0])
def test_a_source_stamping_at_its_start_keeps_its_grid_whatever_a_poll_takes(interval: float) -> None:
    """Review r1 of e9ff698: with the gap counted from a poll's end, polls taking more than the
    interval less 15 ms missed a slot every few polls (at 0.1 s, polls of 90 ms: 29 of 128 skipped,
    logged as frames taken late). Stamped at its start, a poll's rows are clear of the next one's
    on the grid: every slot polled, none skipped."""
    health = PipelineHealth()
    source = Slow([0.99] * 100, [0.0] * 100, interval=interval, health=health, max_polls=100)
    list(source)
    assert [b / interval for b in source.began] == pytest.approx(list(range(100)))
    assert not health.polls_skipped


def test_a_source_stamping_at_its_end_skips_the_slots_its_gap_overruns_and_says_so(caplog) -> None:
    """A CDU poll stamps its rows at its end: polls of 90 ms at 0.1 s cannot keep 15 ms after
    each one's end and the grid both. The slots overrun are counted, and the log says the gap did it
    (not "frames taken late", which sends the operator to the pipeline)."""
    health = PipelineHealth()
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        list(Slow([0.9] * 50, [0.0] * 50, [1.0] * 50, interval=0.1, health=health, max_polls=50))
    assert health.polls_skipped["slow"] > 0
    assert "POLL_GAP_S" in caplog.text and "frames of a poll were taken" not in caplog.text


def test_a_poll_ending_late_in_its_slot_moves_the_next_one_past_its_slot() -> None:
    """A poll stamping at its end and ending 5 ms before the next slot: the next one starts the gap
    after it, not on the slot (the old schedule), without counting a skipped poll, and the one
    after is back on the grid."""
    health = PipelineHealth()
    source = Slow([0.1, 0.9, 0.1, 0.1], [0.0] * 4, [1.0] * 4, interval=0.05, health=health, max_polls=4)
    list(source)
    assert source.began[2] == pytest.approx(source.ended[1] + POLL_GAP_S) and source.began[2] > 2 * 0.05
    assert source.began[3] == pytest.approx(3 * 0.05)
    assert not health.polls_skipped


@pytest.mark.parametrize("interval", [0.0, 0.01, MIN_INTERVAL_S * 0.999, math.nan])
def test_a_source_or_a_simulator_faster_than_the_floor_is_refused(interval: float) -> None:
    class Quiet(PollingSource):
        def poll(self) -> list[Frame]:
            return []

    with pytest.raises(ValueError, match="at least 0.02"):
        Quiet(interval=interval)
    with pytest.raises(ValueError, match="at least 0.02"):
        ClusterSimulator(gpus=8, interval=interval, duration=60.0)
    Quiet(interval=MIN_INTERVAL_S)  # the floor itself is taken


@pytest.mark.parametrize("command", [
    ["watch", "--source", "dcgm", "--url", "http://127.0.0.1:1/metrics", "--polls", "1", "--port", "0"],
    ["record", "--source", "dcgm", "--url", "http://127.0.0.1:1/metrics", "--polls", "1"],
    ["agent", "--kafka", "127.0.0.1:1", "--source", "dcgm", "--url", "http://127.0.0.1:1/metrics", "--polls", "1"],
    ["simulate", "--gpus", "8", "--duration", "60"],
    ["demo", "--gpus", "8", "--duration", "60", "--port", "0"],
])
def test_the_commands_refuse_an_interval_under_the_floor_before_doing_anything(command: list[str],
                                                                               tmp_path: Path) -> None:
    out = ["--out", str(tmp_path / "out")] if command[0] in ("record", "simulate") else []
    result = CliRunner(env={"COLUMNS": "300"}).invoke(cli, [*command, *out, "--interval", "0.01"])
    assert result.exit_code == 2, result.output
    assert "0.01" in result.output and "0.02" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option", ["--bmc-interval", "--cdu-interval"])
def test_watch_refuses_a_bmc_or_cdu_interval_under_the_floor(option: str) -> None:
    result = CliRunner(env={"COLUMNS": "300"}).invoke(
        cli, ["watch", "--source", "dcgm", "--url", "http://127.0.0.1:1/metrics", "--polls", "1", "--port", "0",
              option, "0.001"])
    assert result.exit_code == 2 and "0.02" in result.output, result.output


@pytest.mark.parametrize("option", ["--bmc-interval", "--cdu-interval"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_watch_refuses_a_bmc_or_cdu_interval_that_is_no_number(option: str, value: str) -> None:
    """``inf`` passed ``FloatRange``: the BMC poller's thread died of OverflowError after its first
    poll while the watch went on without its fans; ``nan`` was a traceback."""
    result = CliRunner(env={"COLUMNS": "300"}).invoke(
        cli, ["watch", "--source", "dcgm", "--url", "http://127.0.0.1:1/metrics", "--polls", "1", "--port", "0",
              option, value])
    # nan fails the finite check; inf the range's bound already (LONGEST_WAIT_S)
    assert result.exit_code == 2 and ("finite" in result.output or "<=1000000000.0" in result.output), result.output


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_agent_refuses_an_interval_that_is_no_number_before_reaching_the_broker(value: str) -> None:
    """Review r1: ``FloatRange`` lets NaN and infinity through; the source's constructor then raised
    a traceback."""
    result = CliRunner(env={"COLUMNS": "300"}).invoke(
        cli, ["agent", "--kafka", "127.0.0.1:1", "--source", "dcgm", "--url", "http://127.0.0.1:1/metrics",
              "--polls", "1", "--interval", value])
    assert result.exit_code == 2 and ("finite" in result.output or "<=1000000000.0" in result.output), result.output


def test_a_dmon_import_refuses_rows_closer_than_the_floor(tmp_path: Path) -> None:
    """dmon's rows carry no date and are stamped ``--interval`` apart: at 5 ms, half of them were
    refused as repeats at replay, the import reporting no problem."""
    capture = tmp_path / "dmon.txt"
    capture.write_text("# gpu   pwr gtemp\n# Idx     W     C\n    0    60    40\n")
    result = CliRunner(env={"COLUMNS": "300"}).invoke(
        cli, ["import", "--format", "dmon", str(capture), "--out", str(tmp_path / "rec"), "--interval", "0.005"])
    assert result.exit_code == 2 and "0.02" in result.output, result.output
    assert not (tmp_path / "rec").exists()
