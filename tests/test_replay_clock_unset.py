"""Rows stamped by a clock not set (review r110, R9): a whole first GPU tick stamped 0 (an agent
started before NTP), or an entity's first row at 0, was accepted as the entities' first samples:
the replay's summary said telemetry_start 0.0, 1.7e9 s of telemetry, a speed-up of 5.9e8, and
nothing was counted. A replay's guard now holds rows to a stamp the recording is known to hold
(``Recording.stream_anchor`` -> ``InputGuard.stream_anchor``): decades before it, they are counted
as ``bad_timestamp`` and start nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.cli.main import cli
from foreshock.frames import Frame
from foreshock.guard import InputGuard
from foreshock.health import PipelineHealth
from foreshock.recording import Recording, RecordingWriter
from foreshock.topology import Topology

T0 = 1_700_000_000.0
TICKS = 120
YEAR = 365.25 * 86400


def write(path, topology: Topology, first_tick_at: float | None = None, first_row_at: float | None = None,
          kinds: tuple[str, ...] = ("gpu", "node")) -> None:
    """``TICKS`` ticks of GPU rows (and node rows); the whole first GPU tick stamped ``first_tick_at``,
    or GPU 3's first row ``first_row_at``."""
    n = topology.size("gpu")
    with RecordingWriter(path, topology, {"interval": 1.0}) as w:
        for k in range(TICKS):
            ts = np.full(n, T0 + k)
            if k == 0 and first_tick_at is not None:
                ts[:] = first_tick_at
            if k == 0 and first_row_at is not None:
                ts[3] = first_row_at
            w.write(Frame("gpu", ts, np.arange(n), {"gpu_temp": np.full(n, 50.0)}))
            if "node" in kinds:
                m = topology.size("node")
                w.write(Frame("node", np.full(m, T0 + k), np.arange(m), {}))


def replay(path) -> tuple[dict, str]:
    result = CliRunner().invoke(cli, ["replay", str(path), "--max", "--port", "0"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1]), result.output


@pytest.mark.parametrize("kinds", [("gpu", "node"), ("gpu",)], ids=["gpu-and-node", "gpu-only"])
def test_a_first_tick_stamped_epoch_zero_is_counted_and_starts_nothing(tmp_path, small_topology, kinds,
                                                                        caplog) -> None:
    """On HEAD: telemetry_start 0.0 and telemetry_seconds 1.7e9, nothing counted."""
    write(tmp_path / "rec", small_topology, first_tick_at=0.0, kinds=kinds)
    summary, output = replay(tmp_path / "rec")
    n = small_topology.size("gpu")
    first = T0 if "node" in kinds else T0 + 1  # (the node rows of the first tick are right)
    assert summary["telemetry_start"] == first and summary["telemetry_seconds"] == T0 + TICKS - 1 - first
    assert summary["accepted_samples"] == summary["samples"] - n
    assert f"guard/bad_timestamp {n}" in output
    assert "54 years before the stream" in caplog.text


def test_an_entitys_first_row_at_epoch_zero_is_counted(tmp_path, small_topology) -> None:
    write(tmp_path / "rec", small_topology, first_row_at=0.0)
    summary, output = replay(tmp_path / "rec")
    assert summary["telemetry_start"] == T0 and summary["accepted_samples"] == summary["samples"] - 1
    assert "guard/bad_timestamp 1" in output


def test_a_recording_with_a_late_row_an_hour_back_loses_nothing_to_the_anchor(tmp_path, small_topology) -> None:
    """Rows behind the anchor by hours (not decades) are the guard's usual business: an hour in the
    past as an entity's first row is taken, as before."""
    write(tmp_path / "rec", small_topology, first_row_at=T0 - 3600.0)
    summary, _ = replay(tmp_path / "rec")
    assert summary["accepted_samples"] == summary["samples"] and summary["telemetry_start"] == T0 - 3600.0


def test_the_anchor_lies_inside_the_recording_whatever_its_first_rows(tmp_path, small_topology) -> None:
    write(tmp_path / "rec", small_topology, first_tick_at=0.0)
    anchor = Recording.open(tmp_path / "rec").stream_anchor
    assert T0 <= anchor <= T0 + TICKS


@settings(max_examples=60, deadline=None)
@given(anchor=st.floats(min_value=1e9, max_value=4e9),
       behind=st.floats(min_value=0.0, max_value=60 * YEAR))
def test_the_guard_refuses_exactly_the_rows_decades_behind_its_anchor(anchor: float, behind: float) -> None:
    topology = Topology.from_gpu_hosts([("n1", 2)])
    guard = InputGuard(topology, PipelineHealth())
    guard.stream_anchor = anchor
    stamp = anchor - behind
    clean = guard.check(Frame("gpu", np.array([stamp]), np.array([0]), {}))
    refused = stamp < anchor - 10 * YEAR
    assert len(clean) == (0 if refused else 1)
    assert guard.health.problems.get(("guard", "bad_timestamp"), 0) == (1 if refused else 0)


def test_without_an_anchor_the_guard_takes_old_stamps_as_before(small_topology) -> None:
    """Only a source that knows its stream (a replay) sets the anchor: a live guard or a test's
    frames near epoch zero are held to nothing new."""
    guard = InputGuard(small_topology, PipelineHealth())
    clean = guard.check(Frame("gpu", np.zeros(4), np.arange(4), {}))
    assert len(clean) == 4 and not guard.health.problems


def test_a_first_part_stamped_mostly_by_a_clock_not_set_is_counted(tmp_path, small_topology) -> None:
    """A recorder's first part (parts every 60 s) mostly rows of an agent that ran 40 s before NTP set
    its clock: the anchor was the median of that part's first row group, in 1970, and the replay took
    all 40 ticks (telemetry_start 1.0, 54 years of telemetry, nothing counted). The anchor is now the
    recording's listed start, which the writer's span took without them."""
    n = small_topology.size("gpu")
    tick = [0.0]
    with RecordingWriter(tmp_path / "rec", small_topology, {"interval": 1.0}, segment_s=60,
                         clock=lambda: tick[0]) as w:
        for k in range(240):
            tick[0] = float(k)
            stamp = float(k + 1) if k < 40 else T0 + k
            w.write(Frame("gpu", np.full(n, stamp), np.arange(n), {"gpu_temp": np.full(n, 50.0)}))
    assert Recording.open(tmp_path / "rec").stream_anchor == T0 + 40
    summary, output = replay(tmp_path / "rec")
    assert summary["telemetry_start"] == T0 + 40 and summary["accepted_samples"] == summary["samples"] - 40 * n
    assert f"guard/bad_timestamp {40 * n:,}" in output
