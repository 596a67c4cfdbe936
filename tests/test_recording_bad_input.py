"""Recordings and replays fed bad input: a stamp of minus infinity in a paced replay, a stray
stamp in milliseconds among seconds, a data page corrupted on disk (review h31)."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from foreshock.frames import Frame
from foreshock.recording import Recording, RecordingError, RecordingWriter
from foreshock.streams.sources import ReplaySource, paced
from foreshock.topology import Topology

T0 = 1.7e9


@pytest.mark.parametrize("stop", [threading.Event(), None], ids=["stop-event", "sleep"])
def test_a_paced_replay_is_clocked_by_finite_stamps_only(stop: threading.Event | None) -> None:
    """One row stamped -inf in the first frame made the pacing start -inf and the next wait
    infinite: OverflowError in the sleep, the replay dead. The pacing now reads finite stamps
    only; a frame with none is released at once; every row still reaches the guard."""
    speed = 20.0
    frames = [Frame("gpu", np.array(ts), np.arange(2), {}) for ts in
              ([T0, -math.inf], [math.nan, math.inf], [T0 + 1.0, T0 + 1.0], [-math.inf, T0 + 2.0])]
    start = time.monotonic()
    got, when = [], []
    for frame in paced(iter(frames), speed, stop):
        got.append(frame)
        when.append(time.monotonic() - start)
    assert [id(f) for f in got] == [id(f) for f in frames]
    # the finite stamps still set the pace: 1 s and 2 s of telemetry after the first at 20x
    assert when[2] >= 1.0 / speed - 0.005 and when[3] >= 2.0 / speed - 0.005
    assert when[1] < 1.0 / speed  # (no finite stamp: not held)
    assert when[3] < 2.0  # not stalled


def test_a_paced_replay_of_a_recording_with_a_minus_infinite_stamp_delivers_every_row(tmp_path) -> None:
    topology = Topology.from_gpu_hosts([("n1", 2)])
    with RecordingWriter(tmp_path / "rec", topology, {"interval": 1.0}) as w:
        for k in range(5):
            ts = np.full(2, T0 + k)
            if k == 0:
                ts[1] = -math.inf
            w.write(Frame("gpu", ts, np.arange(2), {"gpu_temp": np.full(2, 40.0 + k)}))
    frames = list(ReplaySource(str(tmp_path / "rec"), speed=100.0))
    ts = np.concatenate([f.ts for f in frames])
    assert len(ts) == 10 and np.isneginf(ts[1]) and np.array_equal(ts[2:], np.repeat(T0 + np.arange(1, 5), 2))


def _write(path, ticks: int, stray, kinds: tuple[str, ...], batch: int = 64, gap_after: int | None = None) -> None:
    """GPU rows of four GPUs on two hosts, one node row per host, per tick; ``stray(k, ts)`` edits
    tick ``k``'s GPU stamps in place. After tick ``gap_after`` the recording pauses 100 s."""
    topology = Topology.from_gpu_hosts([("n1", 2), ("n2", 2)])
    with RecordingWriter(path, topology, {"interval": 1.0}, rows_per_group=batch) as w:
        for k in range(ticks):
            t = T0 + k + (100.0 if gap_after is not None and k > gap_after else 0.0)
            ts = np.full(4, t)
            stray(k, ts)
            w.write(Frame("gpu", ts, np.arange(4), {"gpu_temp": np.full(4, 40.0)}))
            if "node" in kinds:
                w.write(Frame("node", np.full(2, t), np.arange(2), {}))


def _ms_row(k: int, ts: np.ndarray) -> None:
    if k == 10:
        ts[3] *= 1000.0  # n2/gpu1's row of tick 10 in milliseconds


def _ms_host(k: int, ts: np.ndarray) -> None:
    if k == 10:
        ts[2:] *= 1000.0  # both of n2's rows of tick 10


def _ms_first(k: int, ts: np.ndarray) -> None:
    if k == 0:
        ts[0] *= 1000.0  # the very first row: the replay's first window started there


@pytest.mark.parametrize("stray", [_ms_row, _ms_host, _ms_first], ids=["one-row", "a-host's-tick", "first-row"])
@pytest.mark.parametrize("kinds", [("gpu", "node"), ("gpu",)], ids=["gpu+node", "gpu-only"])
@pytest.mark.parametrize("batch_rows", [262_144, 3])
def test_a_stray_stamp_in_milliseconds_rides_along_and_holds_back_nothing(tmp_path, stray, kinds, batch_rows) -> None:
    """One GPU row stamped in milliseconds at tick 10 ended its kind's prefix there, and the GPU
    stream waited until the windows reached 1.7e12: with node rows, the GPU rows of ticks 11 on
    came as one frame after the last node frame; a GPU-only replay jumped its windows to the
    stray and gave the rest as one frame. The stray now rides along with the rows around it
    (for the guard to count) and every tick keeps its own window, kinds interleaved."""
    ticks = 40
    _write(tmp_path / "rec", ticks, stray, kinds, gap_after=30)
    rec = Recording.open(tmp_path / "rec")
    frames = list(rec.iter_frames(batch_rows=batch_rows))
    for kind in kinds:  # every row once, in file order
        assert np.array_equal(np.concatenate([f.ts for f in frames if f.kind == kind]), rec.read_kind(kind).ts)
    assert [f.kind for f in frames] == list(kinds) * ticks
    seconds = [f.ts[f.ts < 1e11] for f in frames]  # the rows stamped in seconds
    tick = [float(s[0]) for s in seconds]
    assert all((s == t).all() for s, t in zip(seconds, tick)), "a frame spans two windows"
    assert tick == sorted(tick) and len(set(tick)) == ticks  # ... and past the gap, no row came early
    strays = [i for i, f in enumerate(frames) if (f.ts > 1e11).any()]
    assert strays and all(0 <= tick[i] - (T0 + (0 if stray is _ms_first else 10)) <= 1.0 for i in strays)


@pytest.mark.parametrize("batch_rows", [262_144, 5])
def test_a_whole_tick_in_milliseconds_in_a_gpu_only_recording_keeps_the_ticks_apart(tmp_path, batch_rows) -> None:
    """All four GPU rows of tick 10 in milliseconds, and nothing else in the recording to set the
    windows by: the rows after them fall back, so they are strays, not a gap."""
    def tick_in_ms(k: int, ts: np.ndarray) -> None:
        if k == 10:
            ts *= 1000.0

    _write(tmp_path / "rec", 30, tick_in_ms, ("gpu",))
    frames = list(Recording.open(tmp_path / "rec").iter_frames(batch_rows=batch_rows))
    assert sum(len(f) for f in frames) == 30 * 4
    ticks = [np.unique(f.ts[f.ts < 1e11]) for f in frames]
    assert all(len(t) == 1 for t in ticks) and len(frames) == 29  # tick 10's window has no row in seconds


def _corrupt_middle_of(path, column: str) -> None:
    """Flip 64 bytes in the middle of the first row group's ``column`` chunk (inside its pages,
    the footer intact)."""
    meta = pq.ParquetFile(path).metadata
    chunk = meta.row_group(0).column(meta.schema.to_arrow_schema().get_field_index(column))
    first = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    middle = first + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    path.write_bytes(bytes(data))


def _random_recording(path, rows_per_group: int = 1000) -> np.ndarray:
    rng = np.random.default_rng(0)
    power = rng.random(4000) * 600  # incompressible: the page holds the values as they are
    with RecordingWriter(path, Topology.from_gpu_hosts([("n1", 2)]), {"interval": 1.0},
                         rows_per_group=rows_per_group) as w:
        for k in range(2000):
            w.write(Frame("gpu", np.full(2, T0 + k), np.arange(2), {"power": power[2 * k:2 * k + 2]}))
    return power


def test_a_corrupted_data_page_is_refused_naming_the_file(tmp_path) -> None:
    """Bytes flipped inside a data page, the footer intact: the recording read back without an
    error and with values never written (those in a field's range pass the guard). Written with
    page checksums and read verifying them, the replay now stops naming the file."""
    power = _random_recording(tmp_path / "rec")
    gpu = tmp_path / "rec" / "gpu.parquet"
    _corrupt_middle_of(gpu, "power")
    # the corruption is of the silent kind: read without verification, no error, other values
    unchecked = pq.read_table(gpu, page_checksum_verification=False).column("power").to_numpy()
    assert len(unchecked) == len(power) and not np.array_equal(unchecked, power)
    rec = Recording.open(tmp_path / "rec")  # (the footer is intact: opening reads only it)
    with pytest.raises(RecordingError, match=r"gpu\.parquet: unreadable Parquet \(.*checksum"):
        rec.read_kind("gpu")
    with pytest.raises(RecordingError, match=r"gpu\.parquet: unreadable Parquet \(.*checksum"):
        list(rec.iter_frames())


def test_a_recording_written_without_page_checksums_still_reads(tmp_path) -> None:
    """Recordings from before the checksums have pages without one: read as before."""
    power = _random_recording(tmp_path / "rec")
    gpu = tmp_path / "rec" / "gpu.parquet"
    table = pq.read_table(gpu)
    pq.write_table(table, gpu, compression="zstd", row_group_size=1000, write_page_checksum=False)
    rec = Recording.open(tmp_path / "rec")
    assert np.array_equal(rec.read_kind("gpu").columns["power"], power)
    assert sum(len(f) for f in rec.iter_frames()) == len(power)
