"""A recording's column types are checked when it opens, from the Parquet footers (audit cli3):
a ``ts`` of timestamp type, a later part's string column and a corrupt ``ts`` page in a part
the list does not name yet all end in :class:`RecordingError`, naming the file, before a row is
replayed; ``replay`` exits 1 with a clean ``Error:`` line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.frames import Frame
from foreshock.recording import Recording, RecordingError, RecordingWriter
from foreshock.topology import Topology

from corrupt_parquet import corrupt_page

T0 = 1.7e9
GPUS = 4
TICKS = 30  # three parts of ten ticks where written in parts


def _write(path: Path, segment_s: float | None = None) -> None:
    """GPU rows of four GPUs, one per tick for 30 s; in parts of 10 s where ``segment_s`` is given
    (the writer's clock is the tick number, so each part holds ten ticks)."""
    topology = Topology.from_gpu_hosts([("n1", 2), ("n2", 2)])
    clock = [0.0]
    with RecordingWriter(path, topology, {"interval": 1.0}, segment_s=segment_s, clock=lambda: clock[0]) as w:
        for k in range(TICKS):
            clock[0] = float(k + 1)
            w.write(Frame("gpu", np.full(GPUS, T0 + k), np.arange(GPUS),
                          {"power": np.full(GPUS, 300.0 + k), "gpu_temp": np.full(GPUS, 50.0)}))


def _set_column(part: Path, name: str, convert) -> None:  # type: ignore[no-untyped-def]
    table = pq.read_table(part)
    i = table.schema.get_field_index(name)
    pq.write_table(table.set_column(i, name, convert(table[name])), part)


def _replay(path: Path):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["replay", str(path), "--max", "--port", "0"])


def _replay_refused(path: Path, names: str):  # type: ignore[no-untyped-def]
    """Replay ``path`` and check it stopped with click's one-line error naming ``names`` and exit
    status 1; the result, for each test's own checks (which exception it must not be)."""
    result = _replay(path)
    assert result.exit_code == 1, result.output
    assert "Error: " in result.output and names in result.output, result.output
    return result


def test_a_timestamp_typed_ts_is_a_recording_error_not_a_type_error(tmp_path: Path) -> None:
    """``ts`` as ``timestamp[us]`` (natural from pandas): its statistics are datetimes, and the
    open crashed with a TypeError on them, which replay, evaluate and train do not catch."""
    rec = tmp_path / "rec"
    _write(rec)
    _set_column(rec / "gpu.parquet", "ts",
                lambda c: pc.cast(pc.multiply(c, 1e6).cast(pa.int64()), pa.timestamp("us")))
    with pytest.raises(RecordingError, match=r"gpu\.parquet: column 'ts' is timestamp\[us\], not numeric"):
        Recording.open(rec)
    result = _replay_refused(rec, "gpu.parquet: column 'ts'")
    assert not isinstance(result.exception, TypeError), result.output  # a clean error, not a traceback


def test_a_later_parts_string_column_is_refused_at_the_open(tmp_path: Path) -> None:
    """The third part's ``power`` is a string column: the footer says so, yet the open accepted
    it and the replay failed only after the first two parts were replayed."""
    rec = tmp_path / "rec"
    _write(rec, segment_s=10)
    assert (rec / "gpu.00002.parquet").exists()  # (the setup: three parts)
    _set_column(rec / "gpu.00002.parquet", "power", lambda c: pc.cast(c, pa.string()))
    with pytest.raises(RecordingError, match=r"gpu\.00002\.parquet: column 'power' is string, not numeric"):
        Recording.open(rec)
    result = _replay_refused(rec, "gpu.00002.parquet: column 'power'")
    # refused before a row was replayed: no summary of the first two parts
    assert '"samples"' not in result.output


def test_a_later_part_with_a_column_named_twice_is_refused_at_the_open(tmp_path: Path) -> None:
    """The third part holds ``power`` twice (a tool appending a column of the same name): the frames
    refuse it, but only when the replay reaches it, after the first two parts."""
    rec = tmp_path / "rec"
    _write(rec, segment_s=10)
    part = rec / "gpu.00002.parquet"
    table = pq.read_table(part)
    pq.write_table(table.append_column("power", table["power"]), part)
    assert pq.ParquetFile(part).schema_arrow.names.count("power") == 2  # (the setup)
    with pytest.raises(RecordingError, match=r"gpu\.00002\.parquet: columns named twice \['power'\]"):
        Recording.open(rec)
    result = _replay(rec)
    assert result.exit_code == 1 and '"samples"' not in result.output, result.output


def test_a_corrupt_ts_page_in_an_unlisted_part_is_a_recording_error(tmp_path: Path) -> None:
    """A recorder killed between renaming its third part and listing it: the open reads that
    part's stamps for the span; a corrupt page there escaped as a raw OSError (in a listed part
    it is a clean error)."""
    rec = tmp_path / "rec"
    _write(rec, segment_s=10)
    meta_path = rec / "recording.json"
    meta = json.loads(meta_path.read_text())
    # the list as the recorder left it before the third part: two parts, cut short
    meta.update(parts={"gpu": 2}, rows={"gpu": 2 * 10 * GPUS}, complete=False, end=T0 + 19)
    meta_path.write_text(json.dumps(meta))
    part = rec / "gpu.00002.parquet"
    corrupt_page(part, "ts", at=8, length=8)
    with pytest.raises(OSError):  # (the setup: the ts page is found corrupt, its footer is sound)
        pq.ParquetFile(part, page_checksum_verification=True).read(columns=["ts"])
    with pytest.raises(RecordingError, match=r"gpu\.00002\.parquet: unreadable Parquet"):
        Recording.open(rec)
    result = _replay_refused(rec, "gpu.00002.parquet: unreadable Parquet")
    assert not isinstance(result.exception, OSError), result.output


def test_integer_and_float_columns_of_any_width_still_open(tmp_path: Path) -> None:
    """The control: what ``Frame.from_arrow`` reads (an int64 ``ts``, an int64 ``slot``, a float32
    or int16 field) is not refused by the check of the types."""
    rec = tmp_path / "rec"
    _write(rec)
    part = rec / "gpu.parquet"
    _set_column(part, "ts", lambda c: c.cast(pa.int64()))
    _set_column(part, "slot", lambda c: c.cast(pa.int64()))
    _set_column(part, "power", lambda c: c.cast(pa.int16()))
    _set_column(part, "gpu_temp", lambda c: c.cast(pa.float32()))
    recording = Recording.open(rec)
    assert recording.stamps["gpu"] == (T0, T0 + TICKS - 1)
    frame = recording.read_kind("gpu")
    # the values written above, read back as float64
    assert np.array_equal(frame.ts, np.repeat(T0 + np.arange(TICKS), GPUS))
    assert np.array_equal(frame.slot, np.tile(np.arange(GPUS), TICKS))
    assert np.array_equal(frame.columns["power"], np.repeat(300.0 + np.arange(TICKS), GPUS))
    assert np.array_equal(frame.columns["gpu_temp"], np.full(TICKS * GPUS, 50.0))
