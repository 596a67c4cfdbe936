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
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .events import Event, read_events, write_events
from .fields import ENTITY_KINDS, field_names
from .frames import Frame, FrameError
from .numba_config import jit
from .topology import Topology

FORMAT_VERSION = 1
META_FILE = "recording.json"
TOPOLOGY_FILE = "topology.yaml"
EVENTS_FILE = "events.jsonl"


class RecordingError(ValueError):
    """A recording is missing a part or a part is malformed; the message names the file."""


class RecordingWriter:
    """Streams frames into a recording folder. Use as a context manager.

    The folder becomes the new recording: parts a previous recording left there are removed
    first, so a kind this one does not write cannot replay stale rows under the new topology.
    """

    def __init__(self, path: str | Path, topology: Topology, meta: dict[str, Any] | None = None,
                 rows_per_group: int = 262_144) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        for part in [META_FILE, EVENTS_FILE, *(f"{kind}.parquet" for kind in ENTITY_KINDS)]:
            (self.path / part).unlink(missing_ok=True)
        self.topology = topology
        self.meta = dict(meta or {})
        self.rows_per_group = rows_per_group
        self._writers: dict[str, pq.ParquetWriter] = {}
        self._pending: dict[str, list[Frame]] = {}
        self._pending_rows: dict[str, int] = {}
        self.events: list[Event] = []
        self.rows: dict[str, int] = {}
        self.t_min = np.inf
        self.t_max = -np.inf
        topology.dump(self.path / TOPOLOGY_FILE)

    def write(self, frame: Frame) -> None:
        if len(frame) == 0:
            return
        self._pending.setdefault(frame.kind, []).append(frame)
        self._pending_rows[frame.kind] = self._pending_rows.get(frame.kind, 0) + len(frame)
        self.rows[frame.kind] = self.rows.get(frame.kind, 0) + len(frame)
        stamps = frame.ts[np.isfinite(frame.ts)]  # one NaN stamp made the recording's start and end null
        if len(stamps):
            self.t_min = min(self.t_min, float(stamps.min()))
            self.t_max = max(self.t_max, float(stamps.max()))
        if self._pending_rows[frame.kind] >= self.rows_per_group:
            self._flush(frame.kind)

    def add_events(self, events: Iterable[Event]) -> None:
        self.events.extend(events)

    def _flush(self, kind: str) -> None:
        frames = self._pending.pop(kind, [])
        self._pending_rows[kind] = 0
        if not frames:
            return
        batch = Frame.concat(frames).to_arrow()
        writer = self._writers.get(kind)
        if writer is None:
            writer = pq.ParquetWriter(self.path / f"{kind}.parquet", batch.schema, compression="zstd")
            self._writers[kind] = writer
        writer.write_table(pa.Table.from_batches([batch]), row_group_size=len(batch))

    def close(self) -> None:
        for kind in list(self._pending):
            self._flush(kind)
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        write_events(self.path / EVENTS_FILE, self.events)
        meta = {
            "format": FORMAT_VERSION,
            "rows": self.rows,
            "start": self.t_min if np.isfinite(self.t_min) else None,
            "end": self.t_max if np.isfinite(self.t_max) else None,
            **self.meta,
        }
        (self.path / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")

    def __enter__(self) -> "RecordingWriter":
        return self

    def __exit__(self, *exc: object) -> None:
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
    return meta


@dataclass
class Recording:
    """An opened recording folder. Reading is lazy; problems raise :class:`RecordingError`."""

    path: Path
    topology: Topology
    meta: dict[str, Any] = field(default_factory=dict)

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
        rows = meta.get("rows", {})
        for kind in ENTITY_KINDS:
            want = int(rows.get(kind, 0))
            if want and kind not in rec.kinds():
                # an interrupted copy: replayed without it, the run would look whole and be silent
                raise RecordingError(f"{path / f'{kind}.parquet'}: missing ({META_FILE} lists {want} rows)")
        for kind in rec.kinds():
            pf = rec._parquet(kind)  # validate schema up front: a truncated file fails here, by name
            have = pf.metadata.num_rows
            if kind in rows and have != int(rows[kind]):
                raise RecordingError(f"{path / f'{kind}.parquet'}: {have} rows, {META_FILE} lists {int(rows[kind])} "
                                     "(a part from another recording, or a copy cut short)")
        return rec

    def kinds(self) -> list[str]:
        return [k for k in ENTITY_KINDS if (self.path / f"{k}.parquet").exists()]

    def _parquet(self, kind: str) -> pq.ParquetFile:
        file = self.path / f"{kind}.parquet"
        try:
            pf = pq.ParquetFile(file)
        except (pa.ArrowException, UnicodeDecodeError, OSError) as exc:  # (a corrupt footer's text, too)
            raise RecordingError(f"{file}: unreadable Parquet ({exc})") from None
        names = set(pf.schema_arrow.names)
        missing = {"ts", "slot"} - names
        if missing:
            raise RecordingError(f"{file}: missing columns {sorted(missing)}")
        unknown = names - {"ts", "slot"} - set(field_names(kind))
        if unknown:
            raise RecordingError(f"{file}: unknown fields {sorted(unknown)}")
        return pf

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
        pf = self._parquet(kind)
        file = self.path / f"{kind}.parquet"
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
        counted by the input guard), never lost.
        """
        window = float(window_s or self.interval)
        if not window > 0:
            raise ValueError("window_s must be positive")
        wanted = set(self.kinds() if kinds is None else kinds)
        present = [k for k in order if k in wanted and k in self.kinds()]
        iters = {k: self.iter_kind(k, batch_rows) for k in present}
        pending: dict[str, Frame | None] = {k: next(iters[k], None) for k in present}
        starts = [_first_ts(f) for f in pending.values() if f is not None and len(f)]
        if not starts or not np.isfinite(min(starts)):
            starts = [0.0]
        t_end = min(starts) + window
        while any(f is not None and len(f) for f in pending.values()):
            for kind in present:
                frame = pending[kind]
                parts = []
                while frame is not None:
                    cut = _prefix_before(frame.ts, t_end)
                    if cut == len(frame):
                        parts.append(frame)
                        frame = next(iters[kind], None)
                        continue
                    if cut:
                        parts.append(frame.take(slice(0, cut)))  # views, not copies
                        frame = frame.take(slice(cut, None))
                    break
                pending[kind] = frame
                if parts:
                    yield parts[0] if len(parts) == 1 else Frame.concat(parts)
            nxt = [_first_ts(f) for f in pending.values() if f is not None and len(f)]
            if not nxt:
                break
            # jump over gaps in the recording instead of yielding empty windows; past a stamp so
            # large that adding the window leaves it unchanged (nanoseconds among seconds), by
            # one representable step at least, so that the row at it is delivered
            t_end = max(t_end, min(nxt)) + window
            if not t_end > min(nxt):
                t_end = float(np.nextafter(min(nxt), np.inf))

    def read_kind(self, kind: str) -> Frame:
        frames = list(self.iter_kind(kind))
        return Frame.concat(frames) if frames else Frame.empty(kind)


def _first_ts(frame: Frame) -> float:
    return float(_first_finite(frame.ts))


def _prefix_before(ts: np.ndarray, t_end: float) -> int:
    """Length of the longest prefix whose rows belong before ``t_end``.

    Rows with a missing or infinite timestamp ride along with their neighbours (the guard
    counts them); a row from the past stays in the prefix, a row at or after ``t_end`` ends it.
    (An infinite stamp that ended it would end every prefix: the replay would spin for good.)
    """
    return int(_first_at_or_after(ts, t_end))


@jit
def _first_finite(ts: np.ndarray) -> float:
    for t in ts:
        if np.isfinite(t):
            return t
    return np.inf


@jit
def _first_at_or_after(ts: np.ndarray, t_end: float) -> int:
    # a scan that stops at the cut: O(window) per window, not O(batch)
    for i in range(len(ts)):
        if ts[i] >= t_end and ts[i] != np.inf:
            return i
    return len(ts)
