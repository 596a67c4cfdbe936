"""Recordings stopped part-way (Ctrl-C, SIGTERM, a full disk) say so and stay readable.

Each interrupt is injected at a chosen point: a real signal raised from a patched hook (Python
runs its handler at the next bytecode, as after a C call that a real Ctrl-C landed in), or an
error from a patched write.
"""

from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from click.testing import CliRunner

import foreshock.recording as recording
from foreshock.frames import Frame
from foreshock.recording import Recording, RecordingWriter
from foreshock.simulator import ClusterSimulator, build_topology
from foreshock.simulator.scenario import scenario_from_dict
from foreshock.topology import Topology

GPUS = 32


def _gpu_tick(t: int) -> Frame:
    return Frame("gpu", np.full(GPUS, 100.0 + t), np.arange(GPUS), {"gpu_temp": np.full(GPUS, 40.0 + t)})


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt, whatever the test runner set."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _small_sim(faults: list[dict[str, Any]] | None = None, **kw: Any) -> ClusterSimulator:
    topo = build_topology(16, job_nodes=2, idle_fraction=0.0)
    return ClusterSimulator(topo, scenario=scenario_from_dict({"name": "t", "faults": faults or []}), seed=7,
                            params={"missing_prob": 0.0, "job_churn": False}, warmup_s=60, **kw)


# ---- 1: a Ctrl-C landing in a row group's write ---------------------------------------------------
def test_a_ctrl_c_during_a_row_group_write_does_not_write_its_rows_twice(tmp_path: Path, small_topology: Topology,
                                                                         monkeypatch, ctrl_c) -> None:
    """The SIGINT arrives while pyarrow writes (C++); Python raised it right after, with the rows on
    disk but still in the writer's buffer: the close wrote them again, twice and out of order, and
    Recording.open refused the folder."""
    real = recording.pq.ParquetWriter.write_table
    calls = [0]

    def write_table(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        real(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] == 2:
            signal.raise_signal(signal.SIGINT)  # (taken at the next bytecode: after the C call, as a real one)

    monkeypatch.setattr(recording.pq.ParquetWriter, "write_table", write_table)
    w = RecordingWriter(tmp_path / "rec", small_topology, {"interval": 1.0}, rows_per_group=GPUS)
    with pytest.raises(KeyboardInterrupt):  # (from the second tick's write, once its rows are counted)
        for t in range(10):
            w.write(_gpu_tick(t))
    w.close()
    rec = Recording.open(tmp_path / "rec")
    gpu = rec.read_kind("gpu")
    assert rec.meta["rows"] == {"gpu": 2 * GPUS} and len(gpu) == 2 * GPUS
    assert np.array_equal(np.unique(gpu.ts), [100.0, 101.0]) and np.all(np.diff(gpu.ts) >= 0)


def test_signals_held_back_are_raised_once_the_block_is_done(ctrl_c) -> None:
    caught: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: caught.append(signum))
    try:
        with pytest.raises(KeyboardInterrupt):
            with recording.deferred_signals():
                signal.raise_signal(signal.SIGTERM)
                signal.raise_signal(signal.SIGINT)
                assert caught == []  # (held)
        assert caught == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---- 2: `foreshock simulate` stopped by SIGTERM --------------------------------------------------
def test_simulate_stopped_by_sigterm_closes_its_recording_marked_cut_short(tmp_path: Path, monkeypatch) -> None:
    """simulate installed no handler: SIGTERM (timeout, systemd, Slurm) killed it with every Parquet
    file open (no footer) and no recording.json. (Killing the test process is stood in for by a
    handler that raises: the one simulate must replace.)"""
    from foreshock.cli.main import cli
    from foreshock.simulator import engine

    class Killed(Exception):
        pass

    def killed(_signum: int, _frame: object) -> None:
        raise Killed

    real_step = engine.ClusterSimulator.step

    def step(self: ClusterSimulator) -> list[Frame]:
        frames = real_step(self)
        if self.ticks == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return frames

    monkeypatch.setattr(engine.ClusterSimulator, "step", step)
    previous = signal.signal(signal.SIGTERM, killed)
    try:
        result = CliRunner().invoke(cli, ["simulate", "--gpus", "8", "--duration", "600", "--interval", "10",
                                          "--out", str(tmp_path / "rec"), "--no-progress"])
        assert signal.getsignal(signal.SIGTERM) is killed  # (put back)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not isinstance(result.exception, Killed), "SIGTERM was not handled by simulate"
    assert result.exit_code == 0, result.output
    assert "stopped by SIGTERM" in result.output
    line = json.loads(result.output.strip().splitlines()[-1])
    assert line["interrupted"] is True and line["simulated_seconds"] == 30.0
    rec = Recording.open(tmp_path / "rec")
    assert rec.interrupted and rec.meta["duration"] == 600
    assert np.array_equal(np.unique(rec.read_kind("gpu").ts) - rec.meta["start_time"], [10.0, 20.0, 30.0])


# ---- 3: an error passing through the writer's `with` (import) -------------------------------------
@pytest.mark.parametrize("rows_per_group", [GPUS, 262_144], ids=["while-written", "at-the-close"])
def test_a_recording_whose_with_block_fails_is_closed_marked_cut_short(tmp_path: Path, small_topology: Topology,
                                                                       monkeypatch, caplog, rows_per_group) -> None:
    """import writes `with RecordingWriter(...)`: a full disk removed the gpu file and raised, and
    the recording was closed as complete, so replay and evaluate ran without the gpu rows, silent."""
    real = recording.pq.ParquetWriter.write_table

    def write_table(self, table, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        if "gpu_temp" in table.column_names:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, table, *args, **kwargs)

    monkeypatch.setattr(recording.pq.ParquetWriter, "write_table", write_table)
    rack = Frame("rack", np.array([100.0, 100.0]), np.array([0, 1]), {"inlet_temp": np.array([24.0, 25.0])})
    with pytest.raises(OSError, match="No space left"):
        with RecordingWriter(tmp_path / "rec", small_topology, {"source": "import:jsonl"},
                             rows_per_group=rows_per_group) as w:
            w.write(rack)
            w.write(_gpu_tick(0))
    meta = json.loads((tmp_path / "rec" / "recording.json").read_text())
    assert meta["complete"] is False and meta["lost_rows"] == {"gpu": GPUS}
    with caplog.at_level("WARNING", logger="foreshock.recording"):
        rec = Recording.open(tmp_path / "rec")
    assert rec.interrupted and rec.kinds() == ["rack"]
    assert "rows lost to a write error" in caplog.text and "gpu 32" in caplog.text


def test_a_recording_whose_with_block_is_interrupted_is_closed_marked_cut_short(tmp_path: Path,
                                                                                small_topology: Topology) -> None:
    with pytest.raises(KeyboardInterrupt):
        with RecordingWriter(tmp_path / "rec", small_topology, {"source": "import:jsonl"}) as w:
            w.write(_gpu_tick(0))
            raise KeyboardInterrupt
    rec = Recording.open(tmp_path / "rec")
    assert rec.interrupted and len(rec.read_kind("gpu")) == GPUS and "lost_rows" not in rec.meta
    with RecordingWriter(tmp_path / "whole", small_topology, {"source": "import:jsonl"}) as w:
        w.write(_gpu_tick(0))
    assert "complete" not in json.loads((tmp_path / "whole" / "recording.json").read_text())  # (as it was)


# ---- 4: a simulation stopped mid-interval, or between two kinds' writes ---------------------------
def test_an_interrupted_simulation_keeps_no_event_after_its_last_tick(tmp_path: Path) -> None:
    """Stopped (Ctrl-C) mid-interval, after the physics steps had started a fault (+25 s) past the
    last tick written (+20 s): events.jsonl held its onset, recording.json its fault."""
    sim = _small_sim([{"type": "psu_failure", "target": "node0", "onset": 25, "duration": 100}],
                     interval=10.0, duration=600)

    def probe(s: ClusterSimulator) -> None:
        if s.elapsed >= 27:
            raise KeyboardInterrupt

    sim.probes.append(probe)
    with pytest.raises(KeyboardInterrupt):
        sim.record(tmp_path / "rec")
    assert any(e.type == "fault_onset" for e in sim.events)  # (the simulator saw it)
    rec = Recording.open(tmp_path / "rec")
    end = rec.meta["end"]
    assert rec.interrupted and end - rec.meta["start_time"] == 20.0
    late = [(e.type, e.time - end) for e in rec.events() if e.time > end]
    assert late == [] and rec.meta["faults"] == []


def test_a_stop_between_two_kinds_writes_does_not_split_the_tick(tmp_path: Path, monkeypatch, ctrl_c) -> None:
    """A Ctrl-C taken between a tick's gpu and link frames left that tick with gpu rows only."""
    real_write = RecordingWriter.write
    gpu_frames = [0]

    def write(self: RecordingWriter, frame: Frame) -> None:
        real_write(self, frame)
        if frame.kind == "gpu":
            gpu_frames[0] += 1
            if gpu_frames[0] == 3:
                signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(RecordingWriter, "write", write)
    sim = _small_sim(interval=10.0, duration=600)
    with pytest.raises(KeyboardInterrupt):
        sim.record(tmp_path / "rec")
    rec = Recording.open(tmp_path / "rec")
    stamps = {kind: np.unique(rec.read_kind(kind).ts) - rec.meta["start_time"] for kind in rec.kinds()}
    assert {"gpu", "link", "optic"} <= set(stamps)
    assert all(np.array_equal(ts, [10.0, 20.0, 30.0]) for ts in stamps.values()), stamps
    assert rec.interrupted and rec.meta["end"] - rec.meta["start_time"] == 30.0
