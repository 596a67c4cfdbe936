"""Frames: the columnar batch every part of foreshock passes around.

A frame holds samples of one entity kind: ``ts`` (float64 seconds since the epoch), ``slot``
(int32, the entity's slot in the topology) and one float64 column per field of that kind
(NaN = missing). Counters stay raw; detectors compute rates.

Frames travel as Arrow IPC streams (files and Kafka). The kind rides in the schema metadata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa

from .fields import field_names

ARROW_KIND_KEY = b"foreshock.kind"


def in_time_order(ts: np.ndarray, ids: np.ndarray) -> bool:
    """Whether rows are ordered by time, then by ``ids`` (NaN stamps: not in order): what a lexsort
    would leave as it is, checked in one pass instead of sorting (an import can be gigabytes)."""
    return len(ts) < 2 or bool(np.all((ts[1:] > ts[:-1]) | ((ts[1:] == ts[:-1]) & (ids[1:] >= ids[:-1]))))


def median_stamp(ts: np.ndarray) -> float | None:
    """The lower median of the finite stamps in ``ts`` (None where there is none): always a row's
    own stamp (of two rows, the older), and one a few stray rows cannot move (a clock read as epoch
    zero, milliseconds among seconds), as they move the earliest or the latest. A frame's time for
    the input guard's stream present and for a paced replay."""
    stamps = ts if np.isfinite(ts).all() else ts[np.isfinite(ts)]
    if not len(stamps):
        return None
    mid = (len(stamps) - 1) // 2
    return float(np.partition(stamps, mid)[mid])


class FrameError(ValueError):
    """A frame or its encoding is malformed; the message says what is wrong."""


def is_numeric(typ: pa.DataType) -> bool:
    """Whether an Arrow column of type ``typ`` may be a frame's column (:meth:`Frame.from_arrow`):
    integers and floats, read as float64. A timestamp, decimal, string or boolean is not: the
    recording reader checks a Parquet file's schema by this rule before reading a row."""
    return pa.types.is_floating(typ) or pa.types.is_integer(typ)


_INT32 = np.iinfo(np.int32)


def _int32_slots(slot: np.ndarray, what: str) -> np.ndarray:
    """``slot`` as int32, or :class:`FrameError` where a value is not a whole number in int32 range:
    a plain cast would wrap 2**32 + 1 to 1 and truncate 0.9 to 0, moving a bad row onto a real
    entity. Vectorised; only for slots that are not int32 already."""
    if slot.dtype.kind not in "iu":
        try:
            slot = np.asarray(slot, dtype=np.float64)
        except (TypeError, ValueError):
            raise FrameError(f"{what}: slot values that are not 32-bit integers") from None
    if slot.size and (
        (slot.dtype.kind == "f" and bool((slot != np.floor(slot)).any()))  # also true for NaN
        or slot.min() < _INT32.min or slot.max() > _INT32.max
    ):
        raise FrameError(f"{what}: slot values that are not 32-bit integers")
    return slot.astype(np.int32)


def _int32_valued(slot: np.ndarray) -> np.ndarray:
    """Per value of a float64 ``slot``: whether it is a whole number in int32 range (NaN: not)."""
    with np.errstate(invalid="ignore"):
        return (slot == np.floor(slot)) & (slot >= _INT32.min) & (slot <= _INT32.max)


@dataclass
class Frame:
    kind: str
    ts: np.ndarray
    slot: np.ndarray
    columns: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        self.ts = np.ascontiguousarray(self.ts, dtype=np.float64).reshape(-1)
        slot = np.asarray(self.slot)
        if slot.dtype != np.int32:  # int32 (every hot path) passes as it is; anything else is checked
            slot = _int32_slots(slot, f"{self.kind} frame")
        self.slot = np.ascontiguousarray(slot).reshape(-1)
        n = len(self.ts)
        if len(self.slot) != n:
            raise FrameError(f"{self.kind} frame: ts has {n} rows, slot has {len(self.slot)}")
        known = field_names(self.kind)  # raises for an unknown kind
        unknown = sorted(set(self.columns) - set(known))
        if unknown:
            raise FrameError(f"{self.kind} frame: unknown fields {unknown}")
        cols = {}
        for name in known:
            col = self.columns.get(name)
            if col is None:
                cols[name] = np.full(n, np.nan)
                continue
            col = np.ascontiguousarray(col, dtype=np.float64).reshape(-1)
            if len(col) != n:
                raise FrameError(f"{self.kind} frame: column {name} has {len(col)} rows, expected {n}")
            cols[name] = col
        self.columns = cols

    def __len__(self) -> int:
        return len(self.ts)

    @classmethod
    def empty(cls, kind: str) -> "Frame":
        return cls(kind, np.empty(0), np.empty(0, np.int32), {})

    @classmethod
    def from_matrix(cls, kind: str, ts: np.ndarray, slot: np.ndarray, values: np.ndarray) -> "Frame":
        """Build from a (rows, fields) matrix in field-table order."""
        names = field_names(kind)
        if values.ndim != 2 or values.shape[1] != len(names):
            raise FrameError(f"{kind} frame: expected a (rows, {len(names)}) matrix, got {values.shape}")
        return cls(kind, ts, slot, {name: values[:, i] for i, name in enumerate(names)})

    def matrix(self) -> np.ndarray:
        """The field columns as one C-contiguous (rows, fields) float64 matrix for kernels."""
        names = field_names(self.kind)
        out = np.empty((len(self), len(names)), dtype=np.float64)
        for i, name in enumerate(names):
            out[:, i] = self.columns[name]
        return out

    def take(self, index: np.ndarray | slice) -> "Frame":
        """Rows selected by a boolean mask, an index array, or a slice (a slice shares memory)."""
        return Frame(self.kind, self.ts[index], self.slot[index], {k: v[index] for k, v in self.columns.items()})

    def sorted_by_time(self) -> "Frame":
        """Rows by time, then slot; a frame already in that order is returned as it is."""
        if in_time_order(self.ts, self.slot):
            return self
        order = np.lexsort((self.slot, self.ts))
        return self.take(order)

    @staticmethod
    def concat(frames: Iterable["Frame"]) -> "Frame":
        frames = [f for f in frames]
        if not frames:
            raise FrameError("concat needs at least one frame")
        kind = frames[0].kind
        if any(f.kind != kind for f in frames):
            raise FrameError("concat: frames of different kinds")
        return Frame(
            kind,
            np.concatenate([f.ts for f in frames]),
            np.concatenate([f.slot for f in frames]),
            {name: np.concatenate([f.columns[name] for f in frames]) for name in field_names(kind)},
        )

    # ---- Arrow ---------------------------------------------------------------------------
    def to_arrow(self) -> pa.RecordBatch:
        arrays = [pa.array(self.ts, pa.float64()), pa.array(self.slot, pa.int32())]
        names = ["ts", "slot"]
        for name in field_names(self.kind):
            arrays.append(pa.array(self.columns[name], pa.float64()))
            names.append(name)
        schema = pa.schema(
            [pa.field(n, a.type) for n, a in zip(names, arrays)],
            metadata={ARROW_KIND_KEY: self.kind.encode()},
        )
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    @classmethod
    def trusted(cls, kind: str, ts: np.ndarray, slot: np.ndarray, columns: dict[str, np.ndarray]) -> "Frame":
        """A frame built without the validation of every column ``__init__`` makes: for the rows
        of frames already valid, or columns the caller has checked (float64 ``ts`` and columns,
        int32 ``slot``, every field of the kind present, equal lengths). On hot paths — a
        worker's per-partition pieces, a replay's per-tick frames — that check cost more than
        the rows themselves."""
        frame = object.__new__(cls)
        frame.kind = kind
        frame.ts = ts
        frame.slot = slot
        frame.columns = columns
        return frame

    @classmethod
    def from_arrow(cls, batch: pa.RecordBatch | pa.Table, kind: str | None = None) -> "Frame":
        """The frame of an Arrow batch or table (several batches are joined): numeric columns
        become float64 (nulls NaN), absent fields NaN; an unknown field, a non-numeric column, a
        column named twice or a missing ``ts``/``slot`` raises :class:`FrameError`. A row whose slot
        is null or no int32 value (3.5, 2**40) gets slot -1: an unknown entity, the input guard's
        ``unknown_entity``, while the other rows go on.

        All field columns are rows of one (fields, rows) block, each chunk converted once
        straight into it: per column, converting, joining chunks, copying again to float64 and
        validating the frame cost a Kafka worker a quarter of its decoding (cProfile on its
        bundles). A replay's reading is Parquet's own decoding, whichever way the columns come."""
        meta = batch.schema.metadata or {}
        kind = kind or (meta.get(ARROW_KIND_KEY, b"").decode() or None)
        if kind is None:
            raise FrameError("Arrow batch has no foreshock.kind metadata and no kind was given")
        names = batch.schema.names
        for required in ("ts", "slot"):
            if required not in names:
                raise FrameError(f"{kind} batch: missing column {required!r}")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # (the second's values had replaced the first's without a word)
            raise FrameError(f"{kind} batch: columns named twice {twice}")
        known = field_names(kind)  # raises ValueError for an unknown kind
        unknown = [n for n in names if n not in known and n not in ("ts", "slot")]
        if unknown:
            raise FrameError(f"{kind} batch: unknown fields {unknown}")
        for name, typ in zip(names, batch.schema.types):
            if not is_numeric(typ):
                raise FrameError(f"{kind} batch: column {name!r} is {typ}, not numeric")
        index = {name: i for i, name in enumerate(names)}
        rows = batch.num_rows

        def fill(out: np.ndarray, name: str) -> None:
            column = batch.column(index[name])
            at = 0
            for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else (column,):
                n = len(chunk)
                out[at:at + n] = chunk.to_numpy(zero_copy_only=False)  # nulls become NaN
                at += n

        ts = np.empty(rows, dtype=np.float64)
        fill(ts, "ts")
        slot = np.empty(rows, dtype=np.float64)  # float first: a null slot must show as NaN
        fill(slot, "slot")
        # a row naming no entity is a row of an unknown one (-1): the guard counts it
        # (unknown_entity) as it counts a slot past the topology, and the batch's other rows go on
        # (one null cell had stopped a replay there, counted nowhere)
        if batch.schema.types[index["slot"]] == pa.int32():
            slot[np.isnan(slot)] = -1.0
        else:
            # foreshock writes int32; another writer's float or int64 column may hold values that
            # are no int32 (3.5, 2**40, 2**64-1): a cast would move their rows onto real entities
            # (2**32+1 to 1, 0.9 to 0), and refusing the batch had stopped the replay there. They
            # name no entity, as a null does: -1 too, counted by the guard, the other rows go on
            slot[~_int32_valued(slot)] = -1.0
        block = np.empty((len(known), rows), dtype=np.float64)
        for j, name in enumerate(known):
            if name in index:
                fill(block[j], name)
            else:
                block[j] = np.nan
        return cls.trusted(kind, ts, slot.astype(np.int32), dict(zip(known, block)))

    def to_ipc(self) -> bytes:
        sink = pa.BufferOutputStream()
        batch = self.to_arrow()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return sink.getvalue().to_pybytes()

    @classmethod
    def from_ipc(cls, data: bytes) -> "Frame":
        try:
            reader = pa.ipc.open_stream(pa.py_buffer(data))
            table = reader.read_all()
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
            raise FrameError(f"not an Arrow IPC stream: {exc}") from None
        return cls.from_arrow(table, kind=(table.schema.metadata or {}).get(ARROW_KIND_KEY, b"").decode() or None)


UNKNOWN_FIELDS = "unknown fields"
NON_NUMERIC_VALUE = "non-numeric field value"
REASONS_AFTER_ENTITY = (UNKNOWN_FIELDS + " ", NON_NUMERIC_VALUE)
"""How the reasons begin that :func:`frames_from_records` gives a record only once its entity
resolved (an unknown entity is the reason given first): a caller still learning its topology
(``foreshock import`` without ``--topology``) holds these back until it knows the entity."""


def unknown_entity_reason(kind: object, entity: object) -> str:
    """The reason :func:`frames_from_records` gives a record whose entity ``resolve_slot`` does
    not know (a caller that counts those apart tells them by it)."""
    return f"unknown {kind} entity {entity!r}"


def frames_from_records(
    records: Iterable[Mapping[str, object]], resolve_slot: Callable[[str, str], int]
) -> tuple[dict[str, Frame], list[tuple[Mapping[str, object], str]]]:
    """Turn JSON-like records from outside producers into frames, one per kind.

    A record looks like ``{"kind": "gpu", "entity": "node0/gpu3", "ts": 1.7e9, "gpu_temp": 61}``.
    Returns the frames and the rejected records, each with the reason; nothing is dropped
    silently. A rejected value that is not an object comes back as ``{"raw": repr(value)}``;
    :func:`records_to_frames` says where in ``records`` each rejected one was instead.
    """
    records = list(records)
    frames, rejected = records_to_frames(records, resolve_slot)
    return frames, [(rec if isinstance(rec := records[i], Mapping) else {"raw": repr(rec)}, reason)
                    for i, reason in rejected]


def _number(value: Any) -> float:
    """``float(value)``, where an integer beyond float64's range is the infinity of its sign, as
    ``1e999`` is (``float`` raises OverflowError for it): rejected as a ``ts``, set to NaN and
    counted by the input guard as a field value, as any infinity. A boolean is refused (a
    TypeError): Python's bool is an int, and JSON ``true`` was read as 1.0."""
    if isinstance(value, bool):
        raise TypeError("a boolean is not a number")
    try:
        return float(value)
    except OverflowError:
        if isinstance(value, int):
            return math.inf if value > 0 else -math.inf
        raise ValueError(f"{type(value).__name__} out of float range") from None


def records_to_frames(
    records: Iterable[object], resolve_slot: Callable[[str, str], int]
) -> tuple[dict[str, Frame], list[tuple[int, str]]]:
    """:func:`frames_from_records`, the rejected records given by their index in ``records``
    with the reason: a caller that holds each record's bytes as they came (a Kafka worker's
    dead letters) passes those on, not the record written out again."""
    rows: dict[str, list[tuple[float, int, Mapping[str, object]]]] = {}
    rejected: list[tuple[int, str]] = []
    for index, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            rejected.append((index, "record is not an object"))
            continue
        kind = rec.get("kind")
        try:
            names = field_names(str(kind))
        except ValueError:
            rejected.append((index, f"unknown entity kind {kind!r}"))
            continue
        try:
            ts = _number(rec["ts"])
        except (KeyError, TypeError, ValueError):
            rejected.append((index, "missing or non-numeric 'ts'"))
            continue
        if not np.isfinite(ts):
            rejected.append((index, "non-finite 'ts'"))
            continue
        slot = resolve_slot(str(kind), str(rec.get("entity")))
        if slot < 0:
            rejected.append((index, unknown_entity_reason(kind, rec.get("entity"))))
            continue
        bad = [k for k in rec if k not in names and k not in ("kind", "entity", "ts")]
        if bad:
            rejected.append((index, f"{UNKNOWN_FIELDS} {bad}"))
            continue
        try:
            values = {k: _number(rec[k]) if rec[k] is not None else np.nan for k in names if k in rec}
        except (TypeError, ValueError):
            rejected.append((index, NON_NUMERIC_VALUE))
            continue
        rows.setdefault(str(kind), []).append((ts, slot, values))
    frames = {}
    for kind, items in rows.items():
        names = field_names(kind)
        frames[kind] = Frame(
            kind,
            np.array([t for t, _, _ in items]),
            np.array([s for _, s, _ in items], dtype=np.int32),
            {n: np.array([v.get(n, np.nan) for _, _, v in items]) for n in names},
        )
    return frames, rejected

