"""Recorded telemetry: a folder that ``foreshock replay`` reads and the simulator writes.

Layout::

    recording/
      recording.json     # metadata: format version, interval, start/end, source, seed, ...
      topology.yaml      # the cluster (see topology.py)
      gpu.parquet        # one Parquet file per entity kind present: ts, slot, one column per field
      link.parquet ...
      events.jsonl       # ground truth (optional; see events.py)

Parquet files are written in row groups of whole time ticks, so a reader can stream a
recording far larger than memory, and a replay interleaves kinds by time.

A live recorder writes in parts (``segment_s``): every few minutes it closes each kind's
file and starts the next (``gpu.parquet``, ``gpu.00001.parquet``, ...; the one being written
is ``*.partial``), and rewrites ``recording.json`` to list the closed ones with
``"complete": false``. A Parquet file is readable only once closed (its footer is written
last), so a recorder killed outright (SIGKILL, the OOM killer, a power cut) loses only the
part it was writing; the recording opens up to the last closed part, with a warning. A part
is renamed into place before the list is rewritten: one closed but not yet listed (killed in
between), or every part of a folder without ``recording.json``, is read from what is on disk,
with a warning naming it. Each closed part and each list is fsynced before its rename, and the
folder after: without it a power cut could leave a renamed part, or the list, empty.

A part whose write or close fails (a full disk) is lost alone: its file is removed, its rows
are taken out of the counts (and counted as a problem, ``rows_lost``), and the error is raised
for the caller to stop on; closing the writer then keeps the parts closed before it.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import signal
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .events import Event, read_events, write_events
from .fields import ENTITY_KINDS, field_names
from .frames import Frame, FrameError, is_numeric, median_stamp
from .guard import MAX_BEHIND_S
from .health import PipelineHealth
from .numba_config import jit
from .topology import Topology

# 2: a kind may be stored in several parts ("parts" in recording.json), written by a live
# recorder; a reader of format 1 would read only the first part, so it is told to refuse them.
# Recordings written whole (simulator, import) stay format 1.
FORMAT_VERSION = 2
PARTIAL = ".partial"
META_FILE = "recording.json"
TOPOLOGY_FILE = "topology.yaml"
EVENTS_FILE = "events.jsonl"


log = logging.getLogger("foreshock.recording")


class RecordingError(ValueError):
    """A recording is missing a part or a part is malformed; the message names the file."""


class StreamSpan:
    """The span of a recording's stream from the stamps it holds: ``recording.json``'s start and end.

    The stamps fall into runs, no two neighbours of a run more than :data:`~foreshock.guard.MAX_BEHIND_S`
    apart (ten years); the stream is the run that holds the most kinds, and of those the most rows.
    A row stamped by a clock not set (epoch zero, an agent started before NTP) lies decades before
    it, one in milliseconds millennia after: a replay's guard refuses such rows (``bad_timestamp``
    against :attr:`Recording.stream_anchor`, by the same ten years; ``future_timestamp``), and the
    span leaves them out. Taken from every finite stamp, a capture whose first GPU tick was stamped
    1.0 started in 1970: its summaries counted times from there, and ``evaluate`` scored the
    episodes of its warm-up. The rows themselves stay in the files (:attr:`strays` counts them).
    Kinds first: a whole kind in another unit, if its rows are the most, is not the stream
    (``Recording.open`` refuses such a recording, naming the kind apart from the others and from
    this span). At most :data:`MOST_RUNS` runs are kept, those of the fewest rows dropped: bounded
    whatever the stamps."""

    MOST_RUNS = 16

    def __init__(self) -> None:
        self._runs: list[tuple[float, float, int, frozenset[str]]] = []  # (earliest, latest, rows, kinds), by earliest

    def add(self, kind: str, ts: np.ndarray) -> None:
        """Take in a kind's stamps ``ts`` (NaN and infinite ones left out: no time at all)."""
        stamps = np.sort(ts[np.isfinite(ts)])
        cuts = np.flatnonzero(np.diff(stamps) > MAX_BEHIND_S) + 1
        for first, end in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(stamps)].tolist()):
            if end > first:
                self.add_run(float(stamps[first]), float(stamps[end - 1]), end - first, frozenset([kind]))

    def add_run(self, earliest: float, latest: float, rows: int, kinds: frozenset[str]) -> None:
        """Take in ``rows`` stamps of ``kinds`` from ``earliest`` to ``latest``, joining the runs they reach."""
        kept = []
        for run in self._runs:
            if run[0] - latest > MAX_BEHIND_S or earliest - run[1] > MAX_BEHIND_S:
                kept.append(run)
            else:
                earliest, latest, rows, kinds = min(earliest, run[0]), max(latest, run[1]), rows + run[2], kinds | run[3]
        kept.append((earliest, latest, rows, kinds))
        kept.sort(key=lambda run: run[0])
        while len(kept) > self.MOST_RUNS:
            kept.remove(min(kept, key=lambda run: run[2]))
        self._runs = kept

    def take_in(self, other: "StreamSpan") -> None:
        """Take in every run of ``other`` (a part's stamps, once the part is closed)."""
        for run in other._runs:
            self.add_run(*run)

    def _stream(self) -> tuple[float, float, int, frozenset[str]] | None:
        # (a tie: the earlier)
        return max(self._runs, key=lambda run: (len(run[3]), run[2])) if self._runs else None

    @property
    def span(self) -> tuple[float, float] | None:
        """The stream's earliest and latest stamps; None where no finite stamp was taken in."""
        stream = self._stream()
        return None if stream is None else (stream[0], stream[1])

    @property
    def strays(self) -> int:
        """How many stamps lie outside the stream (those of runs dropped, if any, not counted)."""
        stream = self._stream()
        return 0 if stream is None else sum(run[2] for run in self._runs) - stream[2]


_DEFERRED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
_deferring = threading.local()


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold back the Python handlers of Ctrl-C, SIGTERM and SIGHUP until the block is done, then
    run them (a signal that came meanwhile is raised again). For steps that must happen together:
    a Parquet write and the writer's count of it, one tick's frames. Python raises a Ctrl-C at the
    first bytecode after a C call such as a row group's write, i.e. after the rows were on disk and
    before the writer knew: the close wrote them again. Masking the signal in the main thread would
    not do: the kernel hands it to another thread (pyarrow's pool), which still trips Python's flag.
    Off the main thread (where Python runs no handler), or nested, it does nothing. A signal left to
    its default action (SIGTERM without a handler) still ends the process at once: none can hold it."""
    if threading.current_thread() is not threading.main_thread() or getattr(_deferring, "on", False):
        yield
        return
    caught: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        caught.append(signum)

    previous: dict[int, Any] = {}
    _deferring.on = True
    try:
        for sig in _DEFERRED_SIGNALS:
            handler = signal.getsignal(sig)
            if callable(handler):  # (SIG_DFL, SIG_IGN and a handler set outside Python are left alone)
                previous[sig] = handler
                signal.signal(sig, hold)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _deferring.on = False
        for signum in dict.fromkeys(caught):  # (each once, in the order they came)
            signal.raise_signal(signum)


def part_name(kind: str, index: int) -> str:
    """File name of a kind's ``index``-th part: the first keeps the one-part name."""
    return f"{kind}.parquet" if index == 0 else f"{kind}.{index:05d}.parquet"


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Make the renames in the folder ``path`` durable; a filesystem that refuses to fsync a
    folder (some network and FUSE ones) keeps them as well as it can."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF):
            raise
    finally:
        os.close(fd)


class RecordingWriter:
    """Streams frames into a recording folder. Use as a context manager.

    The folder becomes the new recording: parts a previous recording left there are removed
    first, so a kind this one does not write cannot replay stale rows under the new topology.
    Rows lost with a part that could not be written are counted in ``health`` (``rows_lost``)
    and in :attr:`lost_rows`.
    """

    def __init__(self, path: str | Path, topology: Topology, meta: dict[str, Any] | None = None,
                 rows_per_group: int = 262_144, segment_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, health: PipelineHealth | None = None) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        for part in [META_FILE, EVENTS_FILE]:
            (self.path / part).unlink(missing_ok=True)
        for kind in ENTITY_KINDS:
            for old in [*self.path.glob(f"{kind}.parquet"), *self.path.glob(f"{kind}.*.parquet"),
                        *self.path.glob(f"{kind}.*parquet{PARTIAL}")]:
                old.unlink()
        self.topology = topology
        self.meta = dict(meta or {})
        self.rows_per_group = rows_per_group
        self.segment_s = segment_s
        self._clock = clock
        self._segment_start = clock()
        self._writers: dict[str, pq.ParquetWriter] = {}
        self._pending: dict[str, list[Frame]] = {}
        self._pending_rows: dict[str, int] = {}
        self._part_rows: dict[str, int] = {}  # rows of the part being written, pending ones too
        self._part_spans: dict[str, StreamSpan] = {}  # its stamps, taken into stream_span once it is closed
        self.health = health if health is not None else PipelineHealth()
        self.lost_rows: dict[str, int] = {}  # rows of parts that could not be written
        self.events: list[Event] = []
        # whether the recording has a ground truth (add_events was called, if with nothing: a
        # simulator's healthy run says nothing happened); without one no events file is written
        self.ground_truth = False
        self.rows: dict[str, int] = {}
        self.parts: dict[str, int] = {}  # closed parts per kind (segmented writing)
        # the stream's start and end (closed parts only), rows stamped by a clock not set left
        # out (kept in the files)
        self.stream_span = StreamSpan()
        topology.dump(self.path / TOPOLOGY_FILE)
        _fsync_file(self.path / TOPOLOGY_FILE)  # (the folder with the first list: no recording opens without it)
        if segment_s is not None:
            self._write_meta(complete=False)  # a recorder killed before its first part: an empty recording

    def write(self, frame: Frame) -> None:
        if len(frame) == 0:
            return
        self._pending.setdefault(frame.kind, []).append(frame)
        self._pending_rows[frame.kind] = self._pending_rows.get(frame.kind, 0) + len(frame)
        self._part_rows[frame.kind] = self._part_rows.get(frame.kind, 0) + len(frame)
        self.rows[frame.kind] = self.rows.get(frame.kind, 0) + len(frame)
        if self._pending_rows[frame.kind] >= self.rows_per_group:
            self._flush(frame.kind)
        if self.segment_s is not None and self._clock() - self._segment_start >= self.segment_s:
            self.commit()

    def add_events(self, events: Iterable[Event]) -> None:
        """Ground-truth events (the simulator's): a recording given them, even none, has a ground
        truth, and its events file is written; one never given any (a capture: `record`, `import`)
        has none, and ``evaluate`` says so instead of scoring it as a run where nothing happened."""
        self.ground_truth = True
        self.events.extend(events)

    def _flush(self, kind: str) -> None:
        frames = self._pending.get(kind)
        if not frames:
            return
        frame = Frame.concat(frames)
        batch = frame.to_arrow()
        # the write and the dropping of its rows from the buffer, as one: a Ctrl-C raised between
        # them (it lands in the C++ write, and Python raises it right after) had the close write the
        # rows again, twice in the file and out of order, and the recording no longer opened
        with deferred_signals():
            try:
                writer = self._writers.get(kind)
                if writer is None:
                    # page checksums: a data page corrupted on disk or in a copy (footer intact) read back
                    # without error, wrong values passing the guard; now reading it fails, naming the file
                    writer = pq.ParquetWriter(self._open_file(kind), batch.schema, compression="zstd",
                                              write_page_checksum=True)
                    self._writers[kind] = writer
                writer.write_table(pa.Table.from_batches([batch]), row_group_size=len(batch))
            except OSError as exc:
                self._lose_part(kind, exc)
                raise
            # dropped only once written: interrupted before (Ctrl-C), the rows are written at the close
            del self._pending[kind]
            self._pending_rows[kind] = 0
            self._part_spans.setdefault(kind, StreamSpan()).add(kind, frame.ts)

    def _open_file(self, kind: str) -> Path:
        final = self.path / part_name(kind, self.parts.get(kind, 0))
        return final if self.segment_s is None else final.with_name(final.name + PARTIAL)

    def commit(self) -> None:
        """Close every open part and list it in ``recording.json``: what was written so far
        survives the recorder being killed. A no-op when nothing new was written.

        A part that cannot be written or closed (a full disk) is lost, its rows counted, and
        the others are closed and listed all the same; then the first such error is raised."""
        failed: list[OSError] = []
        for kind in list(self._pending):
            try:
                self._flush(kind)
            except OSError as exc:
                failed.append(exc)
        committed = bool(self._writers)
        for kind in list(self._writers):
            try:
                self._close_part(kind)
            except OSError as exc:
                failed.append(exc)
        self._segment_start = self._clock()
        if committed:
            _fsync_dir(self.path)  # the renames, before a list that names them
            if self.segment_s is not None:
                self._write_meta(complete=False)
        if failed:
            raise failed[0]

    def _close_part(self, kind: str) -> None:
        partial = self._open_file(kind)
        try:
            self._writers[kind].close()  # (the footer: a full disk fails here)
            _fsync_file(partial)
            if self.segment_s is None:
                self._part_closed(kind)
                return
            try:
                os.replace(partial, partial.with_name(partial.name[:-len(PARTIAL)]))
            finally:
                # counted with the rename, whatever ends it (a second Ctrl-C): a part renamed but
                # still open was renamed again at the close (FileNotFoundError), the list short of it
                if not partial.exists():
                    self._part_closed(kind)
        except OSError as exc:
            if kind in self._writers:  # (not a failure after the part was in place)
                self._lose_part(kind, exc)
            raise

    def _part_closed(self, kind: str) -> None:
        del self._writers[kind]
        self.parts[kind] = self.parts.get(kind, 0) + 1
        self._part_rows[kind] = 0
        if (span := self._part_spans.pop(kind, None)) is not None:
            self.stream_span.take_in(span)

    def _lose_part(self, kind: str, exc: OSError) -> None:
        """Give up the part being written of ``kind`` (its write or close failed): its file goes,
        so that neither this writer nor a reader takes a part cut short for a whole one, and its
        rows, pending ones too, come out of the counts."""
        file = self._open_file(kind)
        writer = self._writers.pop(kind, None)
        if writer is not None:
            with suppress(OSError):  # (its file handle; what it writes goes with the file)
                writer.close()
        with suppress(FileNotFoundError):
            file.unlink()
        self._pending.pop(kind, None)
        self._pending_rows[kind] = 0
        self._part_spans.pop(kind, None)
        lost = self._part_rows.pop(kind, 0)
        self.rows[kind] = self.rows.get(kind, 0) - lost
        self.lost_rows[kind] = self.lost_rows.get(kind, 0) + lost
        self.health.problem("recording", "rows_lost", lost,
                            detail=f"{file}: {exc}; the part is removed, the recording keeps the "
                                   "parts closed before it")

    def close(self) -> None:
        """Close the last parts and write the list marked complete; the error of a part lost on the
        way is raised after that (the list names only whole parts)."""
        lost: OSError | None = None
        try:
            self.commit()
        except OSError as exc:
            lost = exc
        if self.ground_truth:
            write_events(self.path / EVENTS_FILE, self.events)
            _fsync_file(self.path / EVENTS_FILE)  # (on disk before the list says the recording is complete)
        # a recording written whole (simulator, import) that lost a kind's rows is not whole: read
        # as complete, a replay or evaluate ran without that kind and said nothing. A live
        # recorder's lost part leaves the parts before it, whole (its list says what was lost).
        whole = self.meta.get("complete") is not False and not (self.segment_s is None and any(self.lost_rows.values()))
        if not whole:
            self.meta["complete"] = False
        self._write_meta(complete=whole)
        if self.stream_span.strays and (span := self.stream_span.span) is not None:
            log.warning("%s: %d row%s stamped over %g years away from the stream's other rows, which span %s .. %s%s: "
                        "by a clock not set (epoch zero, an agent started before NTP) or in another unit; kept in the "
                        "files, left out of %s's start and end, and refused when replayed (bad_timestamp, "
                        "future_timestamp)", self.path,
                        self.stream_span.strays, "" if self.stream_span.strays == 1 else "s",
                        MAX_BEHIND_S / _YEAR_S, _stamp(span[0]), _stamp(span[1]), _utc_span(*span), META_FILE)
        if lost is not None:
            raise lost

    def _write_meta(self, complete: bool) -> None:
        span = self.stream_span.span  # (None: no finite stamp; a NaN one had made start and end null)
        meta: dict[str, Any] = {
            "format": 1,
            "rows": {kind: n for kind, n in self.rows.items() if self.parts.get(kind)},
            "start": span[0] if span is not None else None,
            "end": span[1] if span is not None else None,
            **self.meta,
        }
        if any(self.lost_rows.values()):  # the kinds whose rows a write error lost (a full disk), and how many
            meta["lost_rows"] = {kind: n for kind, n in self.lost_rows.items() if n}
        if self.segment_s is not None:
            meta.update(format=FORMAT_VERSION, parts=dict(self.parts), complete=complete)
        # written whole, then renamed over the old one: a kill mid-write leaves the previous list
        tmp = self.path / (META_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(json.dumps(meta, indent=2, sort_keys=True))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path / META_FILE)
        _fsync_dir(self.path)

    def __enter__(self) -> "RecordingWriter":
        return self

    def mark_interrupted(self) -> None:
        """The recording is cut short (Ctrl-C, an error): its close lists it ``"complete": false``
        (:attr:`Recording.interrupted`; readers warn) instead of as whole."""
        self.meta["complete"] = False

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            # an import stopped by a full disk (the kind's file removed) or a Ctrl-C was closed as
            # complete: replay and evaluate then ran without the rows never written, and said nothing
            self.mark_interrupted()
        self.close()


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_meta(meta_path: Path, meta: object) -> dict[str, Any]:
    """The metadata keys readers compute with have usable types (a hand-edited or foreign file
    fails here, naming the file and the key, not later in the middle of a replay)."""
    if not isinstance(meta, dict):
        raise RecordingError(f"{meta_path}: expected a JSON object")
    fmt = meta.get("format", FORMAT_VERSION)
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        raise RecordingError(f"{meta_path}: 'format' must be an integer, not {fmt!r}")
    if fmt > FORMAT_VERSION:
        raise RecordingError(f"{meta_path}: format {fmt} is newer than this foreshock reads")
    interval = meta.get("interval")
    if interval is not None and not (_is_number(interval) and 0 < interval < np.inf):
        raise RecordingError(f"{meta_path}: 'interval' must be a positive number of seconds, not {interval!r}")
    for key in ("start", "end"):
        if meta.get(key) is not None and not _is_number(meta[key]):
            raise RecordingError(f"{meta_path}: {key!r} must be a time in seconds, not {meta[key]!r}")
    rows = meta.get("rows")
    if rows is not None and not (isinstance(rows, dict) and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in rows.values())):
        raise RecordingError(f"{meta_path}: 'rows' must map entity kinds to row counts, not {rows!r}")
    parts = meta.get("parts")
    if parts is not None and not (isinstance(parts, dict) and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in parts.values())):
        raise RecordingError(f"{meta_path}: 'parts' must map entity kinds to part counts, not {parts!r}")
    if not isinstance(meta.get("complete", True), bool):
        raise RecordingError(f"{meta_path}: 'complete' must be true or false, not {meta['complete']!r}")
    return meta


_YEAR_S = 365.25 * 86400
_UNITS = {3: "milliseconds", 6: "microseconds", 9: "nanoseconds"}


def _stamp_span(metadata: pq.FileMetaData) -> tuple[float, float] | None:
    """The earliest and latest ``ts`` of a Parquet file, from its row groups' statistics (NaN
    left out by the writer; None where it wrote none): read from the footer, no data page."""
    names = [metadata.schema.column(i).name for i in range(metadata.num_columns)]
    if "ts" not in names:
        return None
    column = names.index("ts")
    lo, hi = np.inf, -np.inf
    for group in range(metadata.num_row_groups):
        if metadata.row_group(group).num_rows == 0:
            continue
        stats = metadata.row_group(group).column(column).statistics
        if stats is None or not stats.has_min_max:
            return None  # (every stamp NaN, or a writer without statistics): not known
        lo, hi = min(lo, float(stats.min)), max(hi, float(stats.max))
    return (lo, hi) if lo <= hi else None


def _check_stamps_agree(path: Path, spans: dict[str, tuple[float, float]], meta: dict[str, Any],
                        files: dict[str, int]) -> None:
    """Refuse a recording whose kinds' stamps lie more than :data:`MAX_BEHIND_S` apart (every
    row of one kind after, or before, every row of another): one kind stamped in milliseconds (or
    µs, ns) among kinds in seconds, or by a clock not set. Read as seconds, such a kind had moved
    the incident engine's clock 53,000 years on (every incident resolved there) and the summary
    had counted as many years of telemetry, with nothing counted or logged: the guard holds each
    kind to its own stream's present, and the whole kind is that stream. ``recording.json``'s
    start and end vote too (a file from another recording copied in). The kinds apart from most
    others are named, with the unit their stamps look like; ``files``: parts per kind."""
    # (short name, file name, earliest, latest)
    voters = [(kind, part_name(kind, 0) + (f" (and its {files[kind] - 1} other parts)" if files.get(kind, 1) > 1
                                          else ""), lo, hi) for kind, (lo, hi) in spans.items()]
    kinds = len(voters)
    start, end = meta.get("start"), meta.get("end")
    if isinstance(start, (int, float)) and isinstance(end, (int, float)) and start <= end:  # (_check_meta's numbers)
        voters.append((f"{META_FILE}'s start and end", META_FILE, float(start), float(end)))

    def apart(a: int, b: int) -> bool:
        return bool(voters[a][2] - voters[b][3] > MAX_BEHIND_S or voters[b][2] - voters[a][3] > MAX_BEHIND_S)

    against = [[b for b in range(len(voters)) if b != a and apart(a, b)] for a in range(len(voters))]
    if not any(against):
        return
    # the kinds apart from most of the others; where none is (two kinds, or two camps), every
    # kind apart from another
    named = ([a for a in range(kinds) if 2 * len(against[a]) > len(voters) - 1]
             or [a for a in range(kinds) if against[a]])
    says = []
    for a in named:
        _, file, lo, hi = voters[a]
        refs = [b for b in against[a] if b not in named] or against[a]
        ref_lo, ref_hi = min(voters[b][2] for b in refs), max(voters[b][3] for b in refs)
        others = ", ".join(voters[b][0] for b in refs[:-1]) + (" and " if len(refs) > 1 else "") + voters[refs[-1]][0]
        their = f"{_stamp(ref_lo)} .. {_stamp(ref_hi)}{_utc_span(ref_lo, ref_hi)}"
        if lo > ref_hi:
            factor = lo / ref_hi if ref_hi > 0 else np.inf
            power = round(float(np.log10(factor))) if np.isfinite(factor) else 0
            unit = _UNITS.get(power) if abs(np.log10(factor) - power) < 0.5 else None
            times = f"{10 ** power:,}" if unit else f"{factor:,.0f}" if factor >= 100 else f"{factor:.3g}"
            says.append(f"{file} is stamped {_stamp(lo)} .. {_stamp(hi)}, about {times} times the stamps of {others} "
                        f"({their}): {f'in {unit}, not seconds' if unit else 'in another unit, or by a clock far off'}")
        else:
            says.append(f"{file} is stamped {_stamp(lo)} .. {_stamp(hi)}, {(ref_lo - hi) / _YEAR_S:,.0f} years "
                        f"before {others} ({their}): by a clock not set (epoch zero), or those are in another unit")
    raise RecordingError(
        f"{path}: a broken recording: {'; '.join(says)}. foreshock reads stamps as seconds since the epoch; "
        "read so, such a file moves the detectors' and the incidents' clocks by decades or more. Fix its ts "
        f"column, or remove it (and its entries in {META_FILE}) to replay the rest")


def _stamp(t: float) -> str:
    """A stamp in full (1,700,000,000.5), or in the exponent form where it is huge."""
    return f"{t + 0.0:,.{0 if t == int(t) else 3}f}" if abs(t) < 1e21 else f"{t:.6g}"  # (+ 0.0: no "-0")


def _utc_span(lo: float, hi: float) -> str:
    """``lo`` .. ``hi`` as UTC dates (", 2023-11-14 22:13:21 .. 22:33:20 UTC"), where they are ones."""
    if not (0 <= lo <= hi < 253402300800):  # (year 10000)
        return ""
    first, last = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(lo)), time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(hi))
    return f", {first} .. {last[11:] if last[:10] == first[:10] else last} UTC"


@dataclass
class Recording:
    """An opened recording folder. Reading is lazy; problems raise :class:`RecordingError`."""

    path: Path
    topology: Topology
    meta: dict[str, Any] = field(default_factory=dict)
    # per kind, its earliest and latest stamp (Parquet statistics; kinds without them left out)
    stamps: dict[str, tuple[float, float]] = field(default_factory=dict)
    _anchor: float | None = field(default=None, repr=False, compare=False)  # (:attr:`stream_anchor`)

    @classmethod
    def open(cls, path: str | Path) -> "Recording":
        path = Path(path)
        if not path.is_dir():
            raise RecordingError(f"{path}: not a recording folder")
        meta_path = path / META_FILE
        meta: dict[str, Any] = {}
        if meta_path.exists():
            try:
                meta = _check_meta(meta_path, json.loads(meta_path.read_text(encoding="utf-8")))
            except json.JSONDecodeError as exc:
                raise RecordingError(f"{meta_path}: not valid JSON ({exc.msg})") from None
            except UnicodeDecodeError:
                raise RecordingError(f"{meta_path}: not UTF-8 text") from None
        topo_path = path / TOPOLOGY_FILE
        if not topo_path.exists():
            raise RecordingError(f"{topo_path}: missing (every recording needs its topology)")
        try:
            topology = Topology.load(topo_path)
        except ValueError as exc:
            raise RecordingError(str(exc)) from None
        rec = cls(path, topology, meta)
        rec._take_in_unlisted_parts(listed=meta_path.exists())
        rows = meta.get("rows", {})
        for kind in ENTITY_KINDS:
            want = int(rows.get(kind, 0))
            if want and kind not in rec.kinds():
                # an interrupted copy: replayed without it, the run would look whole and be silent
                raise RecordingError(f"{path / part_name(kind, 0)}: missing ({META_FILE} lists {want} rows)")
        for kind in rec.kinds():
            have = 0
            spans: list[tuple[float, float] | None] = []
            for file in rec.part_files(kind):
                if not file.exists():
                    raise RecordingError(f"{file}: missing ({META_FILE} lists {len(rec.part_files(kind))} parts "
                                         f"of {kind})")
                metadata = rec._parquet(file, kind).metadata  # a truncated file fails here, by name
                have += metadata.num_rows
                if metadata.num_rows:
                    spans.append(_stamp_span(metadata))
            if kind in rows and have != int(rows[kind]):
                raise RecordingError(f"{path / part_name(kind, 0)}: {have} rows, {META_FILE} lists {int(rows[kind])} "
                                     "(a part from another recording, or a copy cut short)")
            if spans and all(span is not None for span in spans):
                rec.stamps[kind] = (min(span[0] for span in spans if span is not None),
                                    max(span[1] for span in spans if span is not None))
        _check_stamps_agree(path, rec.stamps, rec.meta, {kind: len(rec.part_files(kind)) for kind in rec.kinds()})
        lost_rows = meta.get("lost_rows")
        if isinstance(lost_rows, dict) and lost_rows:  # (a write error: a full disk)
            log.warning("%s: rows lost to a write error, not in the recording: %s", path,
                        ", ".join(f"{kind} {n:,}" if isinstance(n, int) else f"{kind} {n!r}"
                                  for kind, n in sorted(lost_rows.items())))
        if rec.interrupted:
            end = meta.get("end")
            ends = (f", which ends at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(end))} UTC"
                    if isinstance(end, (int, float)) else "")
            if "parts" in meta:  # a live recorder's, closed part by part
                lost = sorted(p.name for p in path.glob(f"*{PARTIAL}"))
                log.warning("%s: its recorder was stopped without closing it (killed, or the machine went down); "
                            "reading it up to its last closed part%s%s", path,
                            ends or " (none was closed: it is empty)",
                            f"; what it was writing is lost ({', '.join(lost)})" if lost else "")
            else:  # written whole (the simulator), closed when its run was stopped (Ctrl-C, an error)
                asked, start = meta.get("duration"), meta.get("start")
                held = (f": {end - start + rec.interval:,.0f} s of the {asked:,.0f} s asked"
                        if isinstance(asked, (int, float)) and isinstance(start, (int, float))
                        and isinstance(end, (int, float)) else "")
                log.warning("%s: its run was stopped before its end (interrupted); reading what it holds%s%s",
                            path, ends or " (nothing: it is empty)", held)
        return rec

    def _part_indices(self, kind: str) -> list[int]:
        """Indices of the kind's closed parts in the folder (:func:`part_name`), sorted."""
        found = []
        for file in self.path.glob(f"{kind}*.parquet"):
            middle = file.name[len(kind):-len(".parquet")]
            index = 0 if middle == "" else int(middle[1:]) if middle[1:].isdigit() else -1
            if index >= 0 and part_name(kind, index) == file.name:
                found.append(index)
        return sorted(found)

    def _take_in_unlisted_parts(self, listed: bool) -> None:
        """Closed parts on disk past those ``recording.json`` lists (``listed``: whether there is
        one): read where the list may lag the disk, else left unread; a warning names them.

        A live recorder renames a part into place once closed, then rewrites the list: killed in
        between, the part is whole but unlisted. With no ``recording.json`` at all, the closed
        parts on disk are all there is to go by. In a recording closed properly (or written
        whole) a part it does not list belongs to something else: not read, but not silent."""
        parts = self.meta.get("parts")
        lags = not listed or (isinstance(parts, dict) and self.interrupted)
        counts: dict[str, int] = {}
        taken: dict[str, list[Path]] = {}
        unread: list[Path] = []
        for kind in ENTITY_KINDS:
            on_disk = self._part_indices(kind)
            count = int(parts.get(kind, 0)) if isinstance(parts, dict) else 1 if listed else 0
            while lags and count in on_disk:
                taken.setdefault(kind, []).append(self.path / part_name(kind, count))
                count += 1
            counts[kind] = count
            unread += [self.path / part_name(kind, i) for i in on_disk if i >= count]
        if unread:
            log.warning("%s: %s on disk but not listed in %s: not read (a part of another recording, "
                        "or a copy merged into this folder)", self.path, ", ".join(p.name for p in unread), META_FILE)
        if not taken:
            return
        names = ", ".join(p.name for files in taken.values() for p in files)
        self.meta["parts"] = {kind: n for kind, n in counts.items() if n}
        if not listed:
            lost = sorted(p.name for p in self.path.glob(f"*{PARTIAL}"))
            log.warning("%s: no %s (a copy without it, or removed): reading the closed parts on disk (%s), "
                        "%s s between samples assumed%s", self.path, META_FILE, names, f"{self.interval:g}",
                        f"; what was being written is lost ({', '.join(lost)})" if lost else "")
            return
        # the list lags: its rows and time span grow by what the parts it missed hold
        listed_rows = self.meta.get("rows")
        rows: dict[str, int] = listed_rows if isinstance(listed_rows, dict) else {}
        span = StreamSpan()  # (the listed span weighs as the kinds and rows listed)
        start, end = self.meta.get("start"), self.meta.get("end")
        if isinstance(start, (int, float)) and isinstance(end, (int, float)):  # (_check_meta's numbers)
            span.add_run(float(start), float(end), max(1, sum(rows.values())), frozenset(rows))
        for kind, files in taken.items():
            # (a list without row counts is checked against none: none is made up for it)
            counted = rows is listed_rows and (kind in rows or files[0].name == part_name(kind, 0))
            for file in files:
                pf = self._parquet(file, kind)
                if counted:
                    rows[kind] = int(rows.get(kind, 0)) + pf.metadata.num_rows
                try:
                    ts = pf.read(columns=["ts"]).column("ts").to_numpy()
                except (pa.ArrowException, OSError) as exc:  # (a corrupt page: as a listed part's)
                    raise RecordingError(f"{file}: unreadable Parquet ({exc})") from None
                span.add(kind, np.asarray(ts, dtype=np.float64))
        if span.span is not None:
            self.meta["start"], self.meta["end"] = span.span
        log.warning("%s: %s closed after %s was last written (its recorder killed in between): read too",
                    self.path, names, META_FILE)

    @property
    def stream_anchor(self) -> float:
        """A stamp inside the recording, known before a replay's first frame (-inf where none
        is): the lower median, over the kinds, of the lower median of each kind's first row
        group. A row stamped :data:`~foreshock.guard.MAX_BEHIND_S` before it was stamped by a
        clock not set: a whole first tick of an agent started before NTP comes first in a replay,
        and had started the run in 1970; a replay's guard refuses such rows
        (``InputGuard.stream_anchor``). Not the earliest stamp, which is such a row: a few of them
        do not move a median. A kind in another unit (most of its rows in milliseconds) does not
        move the kinds' median, and where two kinds disagree, the earlier one refuses fewer rows.
        Read once: one column of one row group per kind.

        Where the recording's list gives its span (``start``, from the writer's
        :class:`StreamSpan`, which leaves such rows out), the anchor is its start: a first row group
        mostly stamped by a clock not set (an agent running minutes before NTP, in a recorder's first
        part) had given an anchor in 1970, and those rows were all taken."""
        if self._anchor is None:
            start, end = self.meta.get("start"), self.meta.get("end")
            if isinstance(start, (int, float)) and isinstance(end, (int, float)) and math.isfinite(start) \
                    and math.isfinite(end) and start <= end:
                self._anchor = float(start)
                return self._anchor
            anchors = []
            for kind in self.kinds():
                file = self.part_files(kind)[0]
                pf = self._parquet(file, kind)
                if not pf.metadata.num_row_groups:
                    continue
                try:
                    first = pf.read_row_group(0, columns=["ts"]).column("ts").to_numpy(zero_copy_only=False)
                except (pa.ArrowException, OSError) as exc:
                    raise RecordingError(f"{file}: unreadable Parquet ({exc})") from None
                median = median_stamp(np.asarray(first, dtype=np.float64))
                if median is not None:
                    anchors.append(median)
            anchor = median_stamp(np.array(anchors, dtype=np.float64))
            self._anchor = -np.inf if anchor is None else anchor
        return self._anchor

    @property
    def interrupted(self) -> bool:
        """The recording was cut short: a live recorder killed (only the parts it had closed are
        read), or a simulator run stopped before its end (``"duration"`` holds what was asked)."""
        return self.meta.get("complete") is False

    def kinds(self) -> list[str]:
        parts = self.meta.get("parts")
        if isinstance(parts, dict):
            return [k for k in ENTITY_KINDS if parts.get(k, 0) > 0]
        return [k for k in ENTITY_KINDS if (self.path / part_name(k, 0)).exists()]

    def part_files(self, kind: str) -> list[Path]:
        """The kind's files in time order (one, unless a live recorder wrote it in parts)."""
        parts = self.meta.get("parts")
        count = int(parts.get(kind, 0)) if isinstance(parts, dict) else 1
        return [self.path / part_name(kind, i) for i in range(count)]

    def _parquet(self, file: Path, kind: str) -> pq.ParquetFile:
        try:
            # pages with a checksum are verified as read (iter_kind); those of recordings written
            # before there were any are read as before
            pf = pq.ParquetFile(file, page_checksum_verification=True)
        except (pa.ArrowException, UnicodeDecodeError, OSError) as exc:  # (a corrupt footer's text, too)
            raise RecordingError(f"{file}: unreadable Parquet ({exc})") from None
        names = set(pf.schema_arrow.names)
        if len(names) < len(pf.schema_arrow.names):  # (the frames refuse it at replay, after the earlier parts)
            twice = sorted({n for n in pf.schema_arrow.names if pf.schema_arrow.names.count(n) > 1})
            raise RecordingError(f"{file}: columns named twice {twice}")
        missing = {"ts", "slot"} - names
        if missing:
            raise RecordingError(f"{file}: missing columns {sorted(missing)}")
        unknown = names - {"ts", "slot"} - set(field_names(kind))
        if unknown:
            raise RecordingError(f"{file}: unknown fields {sorted(unknown)}")
        # the types too, from the footer, by the rule the frames are read by: a later part's string
        # column had failed the replay only once every earlier part was replayed, and a ts of
        # timestamp type (from pandas) had crashed the open on its statistics (datetimes)
        for name, typ in zip(pf.schema_arrow.names, pf.schema_arrow.types):
            if not is_numeric(typ):
                raise RecordingError(f"{file}: column {name!r} is {typ}, not numeric")
        return pf

    def reported_slots(self, kind: str) -> np.ndarray:
        """Per slot of ``kind``: whether the recording holds a row of it (slots outside the
        topology left out, as the input guard sets them aside), read from the slot column alone."""
        seen = np.zeros(self.topology.size(kind), dtype=bool)
        if kind not in self.kinds():
            return seen
        for file in self.part_files(kind):
            pf = self._parquet(file, kind)
            try:
                for batch in pf.iter_batches(columns=["slot"]):
                    slot = batch.column(0).to_numpy(zero_copy_only=False)
                    # (3.5 is no slot 3: the frames read a slot that is no whole number as none)
                    whole = (slot >= 0) & (slot < len(seen)) & (slot == np.floor(slot))
                    seen[slot[whole].astype(np.int64)] = True
            except (pa.ArrowException, OSError) as exc:
                raise RecordingError(f"{file}: unreadable Parquet ({exc})") from None
        return seen

    def events(self) -> list[Event]:
        path = self.path / EVENTS_FILE
        if not path.exists():
            return []
        try:
            return read_events(path)
        except ValueError as exc:
            raise RecordingError(str(exc)) from None

    @property
    def interval(self) -> float:
        return float(self.meta.get("interval", 1.0))

    def iter_kind(self, kind: str, batch_rows: int = 262_144) -> Iterator[Frame]:
        """Frames of one kind in file order (time order for recordings foreshock wrote)."""
        for file in self.part_files(kind):
            pf = self._parquet(file, kind)
            try:
                for batch in pf.iter_batches(batch_size=batch_rows):
                    yield Frame.from_arrow(batch, kind=kind)
            except (pa.ArrowException, UnicodeDecodeError, OSError) as exc:
                raise RecordingError(f"{file}: unreadable Parquet ({exc})") from None
            except FrameError as exc:
                raise RecordingError(f"{file}: {exc}") from None

    def iter_frames(self, window_s: float | None = None, batch_rows: int = 262_144,
                    kinds: Iterable[str] | None = None, order: Sequence[str] = ENTITY_KINDS) -> Iterator[Frame]:
        """Frames of every kind, cut into time windows (default: one sampling interval).

        Within a window the kinds come in ``order`` (default :data:`~foreshock.fields.ENTITY_KINDS`,
        the order the live simulator emits each tick), and no frame carries a sample from after its window's
        end: a detector that joins kinds (GPU temperature with rack inlet) never reads the future,
        and a replay feeds the detectors exactly as the live source did. Rows are cut as prefixes
        in file order, so a row whose timestamp is out of order or missing is delivered (and
        counted by the input guard), never lost. So is a stray stamped beyond the next window
        among rows of this one (milliseconds among seconds, a clock run ahead): it rides along
        with them (ending the prefix, it held back every later row of its kind until the windows
        reached it, hours or years on).
        """
        window = float(window_s or self.interval)
        if not window > 0:
            raise ValueError("window_s must be positive")
        wanted = set(self.kinds() if kinds is None else kinds)
        present = [k for k in order if k in wanted and k in self.kinds()]
        iters = {k: self.iter_kind(k, batch_rows) for k in present}
        pending: dict[str, Frame | None] = {k: next(iters[k], None) for k in present}
        firsts = [_first_stamp(f.ts, window) for f in pending.values() if f is not None and len(f)]
        t_end = (min(firsts) if firsts and np.isfinite(min(firsts)) else 0.0) + window
        # A row stamped beyond the next window starts a gap in the recording, or is a stray
        # (milliseconds among seconds): then the rows after it fall back into this window, or,
        # its kind held back, to its rows not delivered yet (from ``since[kind]``). How far past
        # it to look, ``ahead[kind]``: 512 rows or the most the kind gave a window, doubled each
        # window it gives none (a longer run of strays), up to twice the most any kind gave. A
        # look that finds none costs O(window); rows in time order need none.
        most = 512
        ahead = dict.fromkeys(present, most)
        since = dict.fromkeys(present, t_end - window)
        peeked: dict[str, list[Frame]] = {k: [] for k in present}  # batches read early: a look ran off a batch

        def stamps(kind: str, ts: np.ndarray, more_rows: int) -> np.ndarray | None:
            """``ts`` and up to ``more_rows`` stamps of the kind's next batches (None where none)."""
            queue = peeked[kind]
            while sum(len(f) for f in queue) < more_rows and (batch := next(iters[kind], None)) is not None:
                queue.append(batch)
            if not queue:
                return None
            pieces, left = [ts], more_rows
            for batch in queue:
                pieces.append(batch.ts[:left])
                left -= len(pieces[-1])
            return np.concatenate(pieces)

        def next_start(t_end: float) -> float:
            """Where the rows left after this window start (NaN where none are left)."""
            starts: list[float] = []
            for kind, frame in pending.items():
                if frame is not None and len(frame):
                    start, open_end = _next_stamp(frame.ts, t_end, window, since[kind], ahead[kind])
                    if open_end and (ts := stamps(kind, frame.ts, ahead[kind] + 1)) is not None:
                        start, _ = _next_stamp(ts, t_end, window, since[kind], ahead[kind])
                    starts.append(start)
            return min(starts, default=np.nan)

        while any(f is not None and len(f) for f in pending.values()):
            for kind in present:
                frame = pending[kind]
                parts = []
                while frame is not None:
                    cut, open_end = _first_at_or_after(frame.ts, t_end, window, since[kind], ahead[kind])
                    if open_end:  # the rows that tell whether the row at the cut is a stray are in the next batch
                        look = max(ahead[kind], cut)
                        if (ts := stamps(kind, frame.ts[cut:], look + 1)) is not None:
                            rest, _ = _first_at_or_after(ts, t_end, window, since[kind], look)
                            cut = min(cut + int(rest), len(frame))
                    if cut == len(frame):
                        parts.append(frame)
                        frame = peeked[kind].pop(0) if peeked[kind] else next(iters[kind], None)
                        continue
                    if cut:
                        parts.append(frame.take(slice(0, cut)))  # views, not copies
                        frame = frame.take(slice(cut, None))
                    break
                pending[kind] = frame
                if parts:
                    out = parts[0] if len(parts) == 1 else Frame.concat(parts)
                    ahead[kind] = max(ahead[kind], len(out))
                    most = max(most, len(out))
                    since[kind] = t_end
                    yield out
                elif frame is not None:
                    ahead[kind] = min(2 * ahead[kind], 2 * most)
            nxt = next_start(t_end)
            if nxt != nxt:  # (NaN: nothing left)
                break
            # jump over gaps in the recording instead of yielding empty windows; past a stamp so
            # large that adding the window leaves it unchanged (nanoseconds among seconds), by
            # one representable step at least, so that the row at it is delivered
            t_end = max(t_end, nxt) + window
            if not t_end > nxt:
                t_end = float(np.nextafter(nxt, np.inf))

    def read_kind(self, kind: str) -> Frame:
        frames = list(self.iter_kind(kind))
        return Frame.concat(frames) if frames else Frame.empty(kind)


@jit
def _first_stamp(ts: np.ndarray, window: float) -> float:
    """The first finite stamp (inf where none), unless none of the next four finite ones lies
    within ten windows of it while two of those do of each other: then it is a stray (in
    milliseconds, from epoch zero: far off), and the first of those two is the start."""
    near = np.empty(5)
    k = 0
    for t in ts:
        if np.isfinite(t):
            near[k] = t
            k += 1
            if k == 5:
                break
    if k == 0:
        return np.inf
    span = 10 * window
    for j in range(1, k):
        if abs(near[j] - near[0]) <= span:
            return near[0]
    for i in range(1, k):
        for j in range(i + 1, k):
            if abs(near[j] - near[i]) <= span:
                return near[i]
    return near[0]


@jit
def _next_stamp(ts: np.ndarray, t_end: float, window: float, since: float, ahead: int) -> tuple[float, bool]:
    """Where the rows left after a window ending at ``t_end`` start, and whether the rows that
    tell lie past the end of ``ts``: the first finite stamp at or after ``t_end``, or where that
    is a stray (see :func:`_first_at_or_after`), where the stamps after it fall back to.
    -inf where there is none.
    """
    far = t_end + window
    n = len(ts)
    for i in range(n):
        t = ts[i]
        if not t >= t_end or t == np.inf:  # (NaN too)
            continue
        if t < far:
            return t, False
        stop = i + 1 + ahead
        for j in range(i + 1, min(stop, n)):
            if since <= ts[j] < t - window:
                return ts[j], False
        return t, stop > n
    return -np.inf, False


@jit
def _first_at_or_after(ts: np.ndarray, t_end: float, window: float, since: float, ahead: int) -> tuple[int, bool]:
    """Length of the longest prefix whose rows belong before ``t_end``, and whether the rows that
    tell where it ends lie past the end of ``ts`` (the caller looks into the next batch).

    Rows with a missing or infinite timestamp ride along with their neighbours (the guard
    counts them); a row from the past stays in the prefix, a row at or after ``t_end`` ends it.
    (An infinite stamp that ended it would end every prefix: the replay would spin for good.)
    A row beyond the next window ends it only where the stamps of the ``ahead`` rows after it
    (at least as many as before it) do not fall back into ``[since, t_end)``: where they do, it
    is a stray, and it rides along, with the rows up to there.
    """
    # a scan that stops at the cut, looking at most a window's rows past it: O(window) per window, not O(batch)
    far = t_end + window
    n = len(ts)
    back = 0  # rows before it ride along: a stray's run
    for i in range(n):
        t = ts[i]
        if not t >= t_end or t == np.inf or i < back:  # (NaN too)
            continue
        if t < far:
            return i, False
        stop = i + 1 + max(ahead, i)
        for j in range(i + 1, min(stop, n)):
            if since <= ts[j] < t_end:
                back = j
                break
        if back <= i:
            return i, stop > n
    return n, False
