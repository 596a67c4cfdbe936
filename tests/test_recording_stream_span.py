"""A recording's start and end describe its stream (review, task h2): ``RecordingWriter`` took
``recording.json``'s start from every finite stamp, so a capture whose first GPU tick was stamped
0 or 1.0 (an agent started before NTP; ``record`` and ``import`` write what the sources read,
before any guard) stored start 1.0: ``replay`` counted its summary's times from 1970 (a fault's
onset at +472224:01:29), and ``evaluate`` scored the episodes of its warm-up. The rows stay in the
files; start and end leave out stamps over ``MAX_BEHIND_S`` (ten years) from the stream
(``StreamSpan``), the rule the replay's guard refuses them by. And the replay's guard no longer
takes such a row for the stream's present: of a first frame holding it and one real row, the
lower median was 1.0, and the real row was refused as 57 years ahead."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.cli.common import recording_origin
from foreshock.cli.main import cli
from foreshock.frames import Frame
from foreshock.guard import MAX_BEHIND_S
from foreshock.recording import Recording, RecordingWriter, StreamSpan
from foreshock.topology import Topology

from test_replay_clock_unset import T0, TICKS, write

H200_CSV = Path(__file__).parent / "data" / "h200_step" / "run2_100ms" / "nvidia-smi.csv"


def topology() -> Topology:
    return Topology.from_gpu_hosts([("n1", 0), ("n1", 1), ("n1", 2), ("n1", 3)])


def meta(path: Path) -> dict:
    return json.loads((path / "recording.json").read_text())


@pytest.mark.parametrize("kinds", [("gpu", "node"), ("gpu",)], ids=["gpu-and-node", "gpu-only"])
@pytest.mark.parametrize("stamp", [0.0, 1.0])
def test_a_first_tick_stamped_by_a_clock_not_set_leaves_the_start_at_the_stream(tmp_path, stamp, kinds,
                                                                                caplog) -> None:
    """On HEAD: "start": 0.0 (or 1.0), and nothing said."""
    with caplog.at_level(logging.WARNING, logger="foreshock.recording"):
        write(tmp_path / "rec", topology(), first_tick_at=stamp, kinds=kinds)
    first = T0 if "node" in kinds else T0 + 1  # (the node rows of the first tick are stamped right)
    assert (meta(tmp_path / "rec")["start"], meta(tmp_path / "rec")["end"]) == (first, T0 + TICKS - 1)
    rec = Recording.open(tmp_path / "rec")
    gpu = rec.read_kind("gpu")
    assert len(gpu) == 4 * TICKS and (gpu.ts == stamp).sum() == 4  # every row kept
    origin = recording_origin(rec.meta)
    assert origin is not None and origin.ts == first
    assert "4 rows stamped over 10 years away from the stream's other rows" in caplog.text


@pytest.mark.parametrize("stray", [T0 * 1000.0, 2100 * 365.25 * 86400], ids=["milliseconds", "year-2100"])
def test_a_row_far_ahead_leaves_the_end_at_the_stream(tmp_path, stray) -> None:
    write(tmp_path / "rec", topology(), first_row_at=stray)
    assert (meta(tmp_path / "rec")["start"], meta(tmp_path / "rec")["end"]) == (T0, T0 + TICKS - 1)


def test_stamps_years_apart_but_under_ten_are_one_stream(tmp_path) -> None:
    """A row a year early (a clock a year off) is the guard's business as before: it is in the span."""
    write(tmp_path / "rec", topology(), first_row_at=T0 - 365 * 86400.0)
    assert meta(tmp_path / "rec")["start"] == T0 - 365 * 86400.0


def test_a_recorder_killed_after_closing_a_part_keeps_the_streams_start(tmp_path) -> None:
    """The recorder's list lags the disk (killed between closing a part and listing it): the
    parts read at opening, one of them holding a row stamped 1.0, leave the start where it was."""
    topo = topology()
    clock = [0.0]
    w = RecordingWriter(tmp_path / "rec", topo, {"interval": 1.0}, segment_s=10.0, clock=lambda: clock[0])
    for k in range(15):  # the first part closes at tick 10
        clock[0] = float(k)
        ts = np.full(4, T0 + k)
        if k == 12:
            ts[1] = 1.0
        w.write(Frame("gpu", ts, np.arange(4), {}))
    listed = (tmp_path / "rec" / "recording.json").read_text()
    w.commit()  # ticks 11-14 into gpu.00001.parquet, listed ...
    assert meta(tmp_path / "rec")["start"] == T0  # (the writer's own list)
    (tmp_path / "rec" / "recording.json").write_text(listed)  # ... by a rewrite the kill never let happen
    rec = Recording.open(tmp_path / "rec")
    assert rec.meta["parts"] == {"gpu": 2} and (rec.meta["start"], rec.meta["end"]) == (T0, T0 + 14)


def test_import_of_a_capture_whose_first_row_reads_1970_starts_at_its_second(tmp_path) -> None:
    lines = H200_CSV.read_text().splitlines()[:21]
    stamp = lines[1].split(",")[0]
    lines[1] = lines[1].replace(stamp, "1970/01/01 00:00:01.000")
    (tmp_path / "ntp.csv").write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(cli, ["import", "--format", "nvidia-smi", "--host", "h200", "--out",
                                      str(tmp_path / "rec"), str(tmp_path / "ntp.csv")])
    assert result.exit_code == 0, result.output
    rec = Recording.open(tmp_path / "rec")
    gpu = rec.read_kind("gpu")
    assert rec.meta["rows"] == {"gpu": 20} and len(gpu) == 20 and gpu.ts.min() == 1.0
    assert (rec.meta["start"], rec.meta["end"]) == (float(np.sort(gpu.ts)[1]), float(gpu.ts.max()))
    assert rec.meta["start"] > 1.7e9


def test_replay_refuses_the_1970_row_alone(tmp_path) -> None:
    """One GPU: its first row stamped 1.0, then a row every 0.5 s. The replay's first frame holds
    the 1.0 row and the next; on HEAD their lower median (1.0) was the stream's present and the
    next row was refused as ``future_timestamp``."""
    topo = Topology.from_gpu_hosts([("h200", 0)])
    with RecordingWriter(tmp_path / "rec", topo, {"interval": 0.5}) as w:
        w.write(Frame("gpu", [1.0], [0], {"gpu_temp": [30.0]}))
        for k in range(40):
            w.write(Frame("gpu", [T0 + 0.5 * k], [0], {"gpu_temp": [30.0 + (k % 3)]}))
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "rec"), "--max", "--port", "0"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["accepted_samples"] == 40 and summary["telemetry_start"] == T0
    assert "input problems counted: 1 (guard/bad_timestamp 1)" in result.output


# ---- StreamSpan against a naive reference -----------------------------------------------------
def reference_span(rows: list[tuple[str, float]]) -> tuple[tuple[float, float] | None, int]:
    """Every finite stamp sorted, cut where neighbours lie over MAX_BEHIND_S apart; the run of the
    most kinds, then rows (the earlier of equals): its (earliest, latest), and the rows outside it."""
    stamps = sorted((t, kind) for kind, t in rows if np.isfinite(t))
    if not stamps:
        return None, 0
    runs: list[list[tuple[float, str]]] = [[stamps[0]]]
    for before, now in zip(stamps, stamps[1:]):
        if now[0] - before[0] > MAX_BEHIND_S:
            runs.append([])
        runs[-1].append(now)
    best = max(runs, key=lambda run: (len({kind for _, kind in run}), len(run)))
    return (best[0][0], best[-1][0]), len(stamps) - len(best)


YEAR = 365.25 * 86400
stamp = st.one_of(st.floats(T0, T0 + 7 * 86400),  # the stream: a week
                  st.floats(0.0, 1e6),  # a clock not set
                  st.floats(T0 + 8 * YEAR, T0 + 12 * YEAR),  # a clock years ahead: near the limit, some joined
                  st.floats(T0 * 1000, T0 * 1000 + 7 * 86400_000),  # milliseconds (one run: the cap is apart)
                  st.sampled_from([float("nan"), float("inf"), -float("inf")]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["gpu", "node", "rack"]), stamp), max_size=60),
       st.lists(st.integers(1, 20), min_size=1, max_size=8))
def test_stream_span_matches_the_reference_however_the_rows_come(rows, batch_sizes) -> None:
    """Taken in batches of any sizes, per kind (as the writer's flushes), the span and the strays
    are those of every stamp taken at once."""
    span = StreamSpan()
    i, b = 0, 0
    while i < len(rows):
        batch = rows[i:i + batch_sizes[b % len(batch_sizes)]]
        for kind in {kind for kind, _ in batch}:
            span.add(kind, np.array([t for k, t in batch if k == kind], dtype=np.float64))
        i, b = i + len(batch), b + 1
    expected, strays = reference_span(rows)
    assert span.span == expected and span.strays == strays


def test_stream_span_keeps_few_runs_whatever_the_stamps() -> None:
    """Garbage stamps decades apart each make a run: at most ``MOST_RUNS`` are kept, the stream
    among them."""
    span = StreamSpan()
    span.add("gpu", np.arange(T0, T0 + 600.0))
    for k in range(200):
        span.add("gpu", np.array([T0 * 1000 + k * 20 * YEAR]))
    assert span.span == (T0, T0 + 599.0) and len(span._runs) == StreamSpan.MOST_RUNS
