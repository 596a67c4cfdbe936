"""A live recorder's parts when the disk fills, the power goes or Ctrl-C lands mid-commit.

``RecordingWriter`` in parts (``segment_s``), as ``foreshock record`` uses it: a part that
cannot be written is lost alone, every closed part and list is fsynced before its rename, and
an interrupt between the steps of a flush or a commit leaves counts that agree with the files.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
from pathlib import Path

import numpy as np
import pytest

import foreshock.recording as recording
from foreshock.frames import Frame
from foreshock.recording import Recording, RecordingWriter
from foreshock.topology import Topology

GPUS = 32


def _gpu_tick(t: int, rng: np.random.Generator | None = None) -> Frame:
    # random readings (not compressible) where a test needs the bytes to reach the disk
    temp = rng.normal(50.0, 5.0, GPUS) if rng is not None else np.full(GPUS, 40.0 + t)
    return Frame("gpu", np.full(GPUS, 100.0 + t), np.arange(GPUS), {"gpu_temp": temp})


def _writer(path: Path, topology: Topology, clock: list[float], rows_per_group: int = 262_144) -> RecordingWriter:
    return RecordingWriter(path, topology, {"interval": 1.0}, rows_per_group=rows_per_group, segment_s=10.0,
                           clock=lambda: clock[0])


@pytest.mark.parametrize("rows_per_group", [GPUS, 262_144], ids=["while-written", "at-the-commit"])
def test_a_part_the_full_disk_cuts_short_is_lost_alone(tmp_path, small_topology: Topology, caplog,
                                                       rows_per_group) -> None:
    """The disk fills (EFBIG under a file-size limit stands in for ENOSPC) in the second part. The
    writer raised, then its close renamed the part cut short into place and listed it with rows
    that never reached the disk: the recording did not open at all, its first part unreadable too."""
    rng = np.random.default_rng(0)
    clock = [0.0]
    w = _writer(tmp_path / "rec", small_topology, clock, rows_per_group)
    for t in range(11):  # ticks 0-10: the first part, closed at clock 10
        clock[0] = float(t)
        w.write(_gpu_tick(t, rng))
    assert w.parts == {"gpu": 1}
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    failed = None
    try:
        with caplog.at_level("WARNING"):
            for t in range(11, 21):  # the commit at clock 20 closes the second part
                clock[0] = float(t)
                try:
                    w.write(_gpu_tick(t, rng))
                except OSError as exc:
                    failed = t, exc
                    break
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert failed is not None and failed[1].errno == errno.EFBIG
    w.close()  # the lost part is not tried again
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == ["gpu.parquet", "recording.json", "topology.yaml"]
    rec = Recording.open(tmp_path / "rec")
    assert not rec.interrupted and rec.meta["parts"] == {"gpu": 1} and rec.meta["rows"] == {"gpu": 11 * GPUS}
    assert len(rec.read_kind("gpu")) == 11 * GPUS and rec.meta["end"] == 110.0  # (the lost part's stamps left out)
    lost = (failed[0] - 10) * GPUS
    assert w.lost_rows == {"gpu": lost} and w.rows == {"gpu": 11 * GPUS}
    assert w.health.problems[("recording", "rows_lost")] == lost
    assert caplog.text.count("rows_lost") == 1 and "gpu.00001.parquet.partial" in caplog.text


def test_a_part_whose_close_fails_is_lost_and_the_others_still_close(tmp_path, small_topology: Topology,
                                                                      monkeypatch) -> None:
    """The footer is what a full disk refuses last. The close of one kind's part failing left the
    other kinds' parts open (unlisted) as well."""
    clock = [0.0]
    w = _writer(tmp_path / "rec", small_topology, clock)
    real_close = recording.pq.ParquetWriter.close
    closes = [0]

    def close_fails_for_gpu(self) -> None:
        closes[0] += 1
        if "gpu" in str(self.where) and closes[0] == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_close(self)

    monkeypatch.setattr(recording.pq.ParquetWriter, "close", close_fails_for_gpu)
    w.write(_gpu_tick(0))
    w.write(Frame("rack", np.array([100.0, 100.0]), np.array([0, 1]), {"inlet_temp": np.array([24.0, 25.0])}))
    with pytest.raises(OSError, match="No space left"):
        w.close()
    rec = Recording.open(tmp_path / "rec")
    assert rec.meta["parts"] == {"rack": 1} and rec.meta["rows"] == {"rack": 2} and not rec.interrupted
    assert w.lost_rows == {"gpu": GPUS} and not list((tmp_path / "rec").glob("gpu*"))


@pytest.fixture
def synced(monkeypatch) -> list[tuple[str, str]]:
    """The writer's fsyncs and renames, in order: ("fsync", path) and ("replace", source path)."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("replace", str(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_each_part_and_list_is_fsynced_before_its_rename_and_the_folder_after(tmp_path, small_topology: Topology,
                                                                               synced) -> None:
    """Nothing was fsynced: a power cut could leave a renamed part, or recording.json, empty."""
    events = synced
    folder = tmp_path / "rec"
    clock = [0.0]
    with _writer(folder, small_topology, clock) as w:
        for t in range(15):  # a part closed at clock 10, the next at the close
            clock[0] = float(t)
            w.write(_gpu_tick(t))
    renamed = [src for what, src in events if what == "replace"]
    assert [Path(src).name for src in renamed if "parquet" in src] == ["gpu.parquet.partial",
                                                                        "gpu.00001.parquet.partial"]
    assert ("fsync", str(folder / "topology.yaml")) in events
    for src in renamed:
        at = events.index(("replace", src))
        assert ("fsync", src) in events[:at], f"{src} renamed before it was fsynced"
        assert ("fsync", str(folder)) in events[at:], f"the folder not fsynced after {src} was renamed"
    for at, (what, src) in enumerate(events):
        if what == "replace" and src.endswith(".partial"):  # the folder before the list naming the part
            next_list = events.index(("replace", str(folder / "recording.json.tmp")), at)
            assert ("fsync", str(folder)) in events[at:next_list]


def test_the_ground_truth_is_fsynced_before_the_list_says_the_recording_is_complete(
        tmp_path, small_topology: Topology, synced) -> None:
    """events.jsonl was written in place and never fsynced: a power cut after the list marked the
    recording complete could leave its ground truth empty."""
    events = synced
    folder = tmp_path / "rec"
    with _writer(folder, small_topology, [0.0]) as w:
        w.write(_gpu_tick(0))
        w.add_events([])  # a ground truth: nothing happened
    last_list = max(i for i, e in enumerate(events) if e == ("replace", str(folder / "recording.json.tmp")))
    assert ("fsync", str(folder / "events.jsonl")) in events[:last_list]


def test_a_folder_that_cannot_be_fsynced_is_no_error(tmp_path, small_topology: Topology, monkeypatch) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    clock = [0.0]
    with _writer(tmp_path / "rec", small_topology, clock) as w:
        w.write(_gpu_tick(0))
    assert len(Recording.open(tmp_path / "rec").read_kind("gpu")) == GPUS


def test_an_interrupt_during_a_flush_loses_no_row(tmp_path, small_topology: Topology, monkeypatch) -> None:
    """A second Ctrl-C while a flush turned the rows into Arrow: they had already left the buffer,
    so the close never wrote them, and recording.json listed rows the parts did not hold."""
    real_to_arrow = Frame.to_arrow
    calls = [0]

    def to_arrow(self: Frame):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt
        return real_to_arrow(self)

    monkeypatch.setattr(Frame, "to_arrow", to_arrow)
    clock = [0.0]
    w = _writer(tmp_path / "rec", small_topology, clock, rows_per_group=GPUS)
    with pytest.raises(KeyboardInterrupt):
        for t in range(5):
            clock[0] = float(t)
            w.write(_gpu_tick(t))
    w.close()
    rec = Recording.open(tmp_path / "rec")
    assert rec.meta["rows"] == {"gpu": 2 * GPUS} and len(rec.read_kind("gpu")) == 2 * GPUS


def test_an_interrupt_right_after_a_part_is_renamed_leaves_it_listed_once(tmp_path, small_topology: Topology,
                                                                          monkeypatch) -> None:
    """A second Ctrl-C after a part's rename, before the writer counted it: the close renamed it
    again (FileNotFoundError) and the recording.json it left lacked the part."""
    real_replace = os.replace
    interrupted = [False]

    def replace(src, dst) -> None:
        real_replace(src, dst)
        if str(src).endswith(".partial") and not interrupted[0]:
            interrupted[0] = True
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", replace)
    clock = [0.0]
    w = _writer(tmp_path / "rec", small_topology, clock)
    with pytest.raises(KeyboardInterrupt):
        for t in range(15):
            clock[0] = float(t)
            w.write(_gpu_tick(t))
    w.write(_gpu_tick(11))
    w.close()
    rec = Recording.open(tmp_path / "rec")
    assert rec.meta["parts"] == {"gpu": 2} and rec.meta["rows"] == {"gpu": 12 * GPUS}
    assert len(rec.read_kind("gpu")) == 12 * GPUS
    assert json.loads((tmp_path / "rec" / "recording.json").read_text())["complete"] is True
