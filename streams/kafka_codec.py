"""What travels on the Kafka topics, and how entities are routed to partitions.

**Routing.** Detector state is per entity, but some detectors read an entity's parents too
(the thermal detector combines a GPU's samples with its rack's inlet temperature and its
node's power). So a node's data goes to the partition of its *rack*, and all of a rack's
nodes, GPUs, links and optics and the rack's own samples meet in one partition, in the order
produced: a worker sees exactly the rows the embedded pipeline would give those entities.
Switch-to-switch links (and their optics) are routed by their first switch, jobs by job.
Detectors that compare entities across racks belong in the incident stage, which sees every
finding.

**Pieces.** An agent splits each source frame by partition, and large pieces into chunks
(``MAX_PIECE_BYTES``); each piece is identified by the frame's (agent, seq) and its index
``part`` among the frame's ``parts`` pieces, so the incident stage knows when a frame is
complete.

**Bundles (frames topic).** One message carries the pieces of one or more consecutive source
frames for one partition, from one agent (the agent lingers a few milliseconds and fills
messages up to ``MAX_BUNDLE_BYTES``). Per-message costs — the producer, the broker, faust's
event machinery, the findings message — are paid once per bundle instead of once per piece,
which is what lets a worker keep up with many small per-tick frames. The value is one Arrow
IPC stream per kind (``Frame.to_ipc`` layout: ``ts``, ``slot`` and the kind's fields; fields
that are NaN in every row are left out, the decoder puts them back as NaN; buffers optionally
LZ4/ZSTD-compressed by Arrow), concatenated; the headers say where each stream ends and which
rows belong to which piece, in the order the worker must process them:

- ``foreshock-streams``: ``kind:bytes;...`` — the streams in value order;
- ``foreshock-pieces``: ``kind:seq:part:parts:rows;...`` — the pieces in processing order;
  each takes its rows from the front of its kind's stream (``seq`` counts from 1);
- ``foreshock-continues`` (optional, ``1``): the last piece's frame has more pieces for this
  partition in the sender's next bundle; the worker runs the share whole once it has them.

A message with the single-piece headers of the first version (``foreshock-kind``,
``-seq``, ``-part``, ``-parts`` and one IPC stream as the value) is still read as a bundle of
one piece. Key: ``"frames/<partition>"``. Both forms carry ``foreshock-schema``,
``foreshock-agent`` and ``foreshock-sent``.

**JSON lines** (``telemetry.json``): one or more objects one after the other (JSON lines, or
objects pretty-printed over several lines), or an array of objects, each
``{"kind": "gpu", "entity": "node0/gpu3", "ts": 1.7e9, "<field>": value, ...}`` (field names
from the field table, base units).

**Findings** (``foreshock.findings``): one JSON message per bundle with one report per piece
(see :func:`encode_findings`), even for pieces without findings; several, each with some of the
reports, when one would pass the topic's message size (:func:`split_findings`). When an
incident processor reads telemetry (``observe_frame``), the worker sends the bundle's guarded
rows of the fields it reads just before, as a bundle with the header ``foreshock-content:
telemetry`` (several, split between pieces, past the topic's message size:
:func:`encode_telemetry`); readers of findings skip those (:func:`is_telemetry`).

**Dead letters** keep the original key, value and headers, plus ``foreshock-reason``,
``foreshock-stage`` and ``foreshock-source`` (``topic/partition/offset``); a value that would
pass the topic's message size keeps only its head, with ``foreshock-original-bytes``
(:func:`capped_deadletter`). A bad piece inside a good bundle is dead-lettered alone, as a
single-piece message of its own rows; a bad JSON record alone too, its bytes as they came (its
line or lines, or its element of an array).
"""

from __future__ import annotations

import json
import math
import operator
import re
import struct
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from foreshock.fields import field_names
from foreshock.findings import Anomaly, Finding, Incident, Prediction, finding_from_dict
from foreshock.frames import ARROW_KIND_KEY, Frame, FrameError, records_to_frames
from foreshock.topology import Topology

from .kafka_topics import BUNDLE_MAX_MESSAGE_BYTES

SCHEMA = b"arrow-ipc/1"
H_SCHEMA = "foreshock-schema"
H_KIND = "foreshock-kind"
H_AGENT = "foreshock-agent"
H_SEQ = "foreshock-seq"
H_PART = "foreshock-part"
H_PARTS = "foreshock-parts"
H_SENT = "foreshock-sent"  # wall time the agent sent the message (latency accounting)
H_STREAMS = "foreshock-streams"
H_PIECES = "foreshock-pieces"
H_CONTENT = "foreshock-content"  # on the findings topic: TELEMETRY marks forwarded rows, else findings
TELEMETRY = b"telemetry"
H_REASON = "foreshock-reason"
H_STAGE = "foreshock-stage"
H_SOURCE = "foreshock-source"
H_TOPOLOGY = "foreshock-topology"  # fingerprints of the topology whose slots the frames use: "HARDWARE/JOBS"
# b"1": the bundle's last piece's frame has more pieces for this partition in the sender's next
# bundle (a partition's share of a frame past MAX_BUNDLE_BYTES); the worker holds them until it
# has them all, so the detectors see the share whole (a separate header: older workers skip it)
H_CONTINUES = "foreshock-continues"

Headers = list[tuple[str, bytes]]

# Raw column bytes per piece and per bundle. Bundles of several MB: every message costs the
# producer, the broker, faust and the findings message a fixed amount, and LZ4 packs larger
# buffers tighter (measured: 3 MB bundles cut a worker's CPU per sample by ~10 % against 768 KB;
# 12 MB against 3 MB, `make bench-kafka` on 8,192 GPUs, A/B twice: 1.8 against 2.0-2.2 CPU s
# per million samples for agent, broker and worker together, ~1.3 MB a message after LZ4). The
# frames and findings topics allow kafka_topics.BUNDLE_MAX_MESSAGE_BYTES (16 MB) per message.
MAX_PIECE_BYTES = 768 * 1024
MAX_BUNDLE_BYTES = 12 * 1024 * 1024
# What one record may decode to (row_bytes of every row of its streams, and the bytes its
# compressed Arrow buffers declare before they are decompressed): a bundle holds at most
# MAX_BUNDLE_BYTES of rows and one piece more; twice that is left for slack. A few KB of zstd
# could otherwise declare millions of rows, and decoding allocated every field of each.
MAX_DECODED_BYTES = 2 * MAX_BUNDLE_BYTES
# Room left under a topic's message size limit (kafka_topics.BUNDLE_MAX_MESSAGE_BYTES), which
# bounds the record batch: its framing, the key and the headers besides the value.
MESSAGE_FRAMING_BYTES = 64 * 1024

COMPRESSIONS = (None, "lz4", "zstd")


class RecordError(ValueError):
    """A record cannot be used; ``reason`` is a short stable label, the message the detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail  # (what a log line beside the reason says: "bad_headers: bad_headers: ..." otherwise)


def as_record_error(exc: Exception) -> RecordError:
    """``exc`` if it is a :class:`RecordError`, else an ``undecodable`` one naming it: what a
    caller of a decoder makes of anything it raises. A record that ends the worker is read again
    by its restart, and ends that one too: its partition would be stuck for good."""
    return exc if isinstance(exc, RecordError) else RecordError("undecodable", f"{type(exc).__name__}: {exc}")


class PartitionMap:
    """Which partition each entity's samples go to (see the module docstring)."""

    def __init__(self, topology: Topology, partitions: int) -> None:
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.topology = topology
        self.partitions = partitions
        n_racks = len(topology.racks)
        rack_part = np.arange(n_racks, dtype=np.int64) % partitions
        node_part = rack_part[topology.node_rack] if len(topology.nodes) else np.empty(0, np.int64)
        gpu_part = node_part[topology.gpu_node] if len(topology.gpus) else np.empty(0, np.int64)
        link_part = np.empty(len(topology.links), dtype=np.int64)
        for i in range(len(topology.links)):
            gpu = int(topology.link_gpu[i])
            if gpu >= 0:
                link_part[i] = gpu_part[gpu]
            else:
                # by the switch alone, not after the racks: a rack added to the file would
                # otherwise move every fabric link to another partition, and with it the link's
                # hours of error-rate and optics trends (a restarted partition starts fresh
                # on the entities that are new to it)
                sw = int(topology.link_a_switch[i])
                link_part[i] = max(sw, 0) % partitions
        self.by_kind: dict[str, np.ndarray] = {
            "rack": rack_part, "node": node_part, "gpu": gpu_part, "link": link_part,
            "optic": np.repeat(link_part, 2),
            "job": np.arange(len(topology.jobs), dtype=np.int64) % partitions,
        }

    def split_jobs(self) -> list[tuple[int, int]]:
        """The jobs whose GPUs are routed to more than one partition, each with how many: a
        partition's worker sees its share of such a job only (routing keeps racks together, and
        jobs span racks), so its peer comparison (the straggler detector's job median) is of that
        share."""
        gpu_part = self.by_kind["gpu"]
        out = []
        for job in range(len(self.topology.jobs)):
            spread = len(np.unique(gpu_part[self.topology.gpus_of_job(job)]))
            if spread > 1:
                out.append((job, spread))
        return out

    def owned_by(self, partition: int) -> dict[str, np.ndarray]:
        """Per kind, a mask by slot of the entities routed to ``partition``."""
        return {kind: table == partition for kind, table in self.by_kind.items()}

    def partition_of(self, kind: str, slots: np.ndarray) -> np.ndarray:
        """Partition per row; -1 for slots outside the topology."""
        table = self.by_kind[kind]
        out = np.full(len(slots), -1, dtype=np.int64)
        ok = (slots >= 0) & (slots < len(table))
        out[ok] = table[slots[ok]]
        return out

    def split(self, frame: Frame) -> list[Frame]:
        """One piece per partition (index = partition), empty where no rows go there.

        Rows with unknown slots go to partition 0, whose worker counts and dead-letters those
        rows alone (``DecodedPiece.unknown``) and processes the piece's other rows.
        """
        if self.partitions == 1:
            return [frame]
        part = self.partition_of(frame.kind, frame.slot)
        part[part < 0] = 0
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.partitions + 1))
        grouped = take_rows(frame, order)  # one gather of every column; the pieces are slices of it
        return [row_range(grouped, bounds[p], bounds[p + 1]) for p in range(self.partitions)]

    def messages(self, frame: Frame, max_bytes: int = MAX_PIECE_BYTES) -> list[tuple[int, Frame]]:
        """The (partition, piece) pieces of one frame: each partition's rows in chunks of at
        most ``max_bytes`` of columns, in row order; one empty piece when the frame is empty (the
        incident stage must still see every frame's sequence number)."""
        max_rows = max(1, max_bytes // row_bytes(frame.kind))
        out = []
        for part, piece in enumerate(self.split(frame)):
            if len(piece) <= max_rows:
                if len(piece):
                    out.append((part, piece))
                continue
            for start in range(0, len(piece), max_rows):
                out.append((part, row_range(piece, start, min(start + max_rows, len(piece)))))
        return out or [(0, frame)]


def take_rows(frame: Frame, index: np.ndarray | slice) -> Frame:
    """Rows ``index`` of a valid frame, unvalidated (:meth:`Frame.trusted`): copies for an index
    array, views of its memory for a slice."""
    return Frame.trusted(frame.kind, frame.ts[index], frame.slot[index],
                         {name: column[index] for name, column in frame.columns.items()})


def row_range(frame: Frame, start: int, stop: int) -> Frame:
    """Rows ``start:stop`` of a frame, sharing its memory."""
    return take_rows(frame, slice(start, stop))


def concat_rows(frames: Sequence[Frame], names: Sequence[str]) -> Frame:
    """The rows of same-kind frames one after the other, only columns ``names``: what a bundle
    encodes (``Frame.concat`` copies and validates every field, sent or not)."""
    return Frame.trusted(frames[0].kind, np.concatenate([f.ts for f in frames]),
                         np.concatenate([f.slot for f in frames]),
                         {name: np.concatenate([f.columns[name] for f in frames]) for name in names})


def row_bytes(kind: str) -> int:
    """Raw column bytes of one row (ts, slot as float64, every field)."""
    return 8 * (len(field_names(kind)) + 2)


# ---- Arrow IPC streams -------------------------------------------------------------------
_SCHEMAS: dict[tuple[str, tuple[str, ...]], pa.Schema] = {}
# No Arrow thread pool: a piece's column buffers are a few KB each, and handing them to threads
# for (de)compression costs more CPU than the work itself.
_WRITE_OPTIONS = {c: pa.ipc.IpcWriteOptions(compression=c, use_threads=False) for c in COMPRESSIONS}
_READ_OPTIONS = pa.ipc.IpcReadOptions(use_threads=False)


def frame_to_ipc(frame: Frame, compression: str | None = None, only: Sequence[str] | None = None) -> bytes:
    """``Frame.to_ipc`` without the fields that are NaN in every row (a source that does not
    report them), optionally with Arrow's buffer compression, optionally ``only`` some fields.
    Decodes with ``Frame.from_ipc``."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression {compression!r} not one of {COMPRESSIONS}")
    names = ["ts", "slot"]
    arrays = [pa.array(frame.ts, pa.float64()), pa.array(frame.slot, pa.int32())]
    for name in field_names(frame.kind) if only is None else only:
        column = frame.columns[name]
        if len(frame) and np.isnan(column).all():
            continue
        names.append(name)
        arrays.append(pa.array(column, pa.float64()))
    key = (frame.kind, tuple(names))
    schema = _SCHEMAS.get(key)
    if schema is None:
        schema = _SCHEMAS[key] = pa.schema([pa.field(n, a.type) for n, a in zip(names, arrays)],
                                           metadata={ARROW_KIND_KEY: frame.kind.encode()})
    sink = pa.BufferOutputStream()
    options = _WRITE_OPTIONS[compression]
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


# ---- frames topic: bundles --------------------------------------------------------------
@dataclass(frozen=True)
class PieceInfo:
    agent: str
    seq: int
    part: int
    parts: int
    sent: float


@dataclass(frozen=True)
class PieceRef:
    """One piece's entry in a bundle's piece table; ``rows`` None = all rows of its stream."""

    kind: str
    seq: int
    part: int
    parts: int
    rows: int | None


@dataclass
class DecodedPiece:
    info: PieceInfo
    kind: str
    frame: Frame | None = None  # None when the piece is unusable (``error`` says why)
    error: RecordError | None = None
    # fields of its kind this version does not know (a newer agent's): left out of ``frame``
    ignored_fields: tuple[str, ...] = ()
    # its rows of entities outside the topology (a null slot read as -1, or past the end): left
    # out of ``frame``, for the caller to count and dead-letter, as the embedded guard drops
    # only those rows and the batch's other rows go on (``split_unknown``; None: none)
    unknown: Frame | None = None


def sender_id(name: str) -> str:
    """``name`` and the millisecond this sender started: the identity its messages carry.

    The incident stage releases each sender's frames in sequence order and takes a sequence
    number at or below the last one released for a repeat. A sender restarted under the same
    name (a fixed ``--agent-id``, or a pid that comes back after a reboot) counts from 1 again,
    and under its bare name every frame until it passed its old count was dropped as a repeat."""
    started = time.time_ns() // 1_000_000
    while (name, started) in _SENDERS:  # two senders of one name in one process and millisecond
        started += 1
    _SENDERS.add((name, started))
    return f"{name}#{started}"


_SENDERS: set[tuple[str, int]] = set()


def sender_started(sender: str) -> float | None:
    """When a ``sender_id`` sender started (epoch seconds); None for a bare name."""
    _, sep, started = sender.rpartition("#")
    return int(started) / 1000.0 if sep and started.isdigit() else None


def piece_headers(kind: str, agent: str, seq: int, part: int, parts: int, sent: float) -> Headers:
    """Headers of a single-piece message (the first version's form; still read)."""
    return [(H_SCHEMA, SCHEMA), (H_KIND, kind.encode()), (H_AGENT, agent.encode()),
            (H_SEQ, str(seq).encode()), (H_PART, str(part).encode()), (H_PARTS, str(parts).encode()),
            (H_SENT, repr(sent).encode())]


def piece_key(kind: str, part: int) -> bytes:
    return f"{kind}/{part}".encode()


def bundle_key(partition: int) -> bytes:
    return f"frames/{partition}".encode()


def encode_bundle(agent: str, sent: float, pieces: Sequence[BundleEntry], compression: str | None = None,
                  fields: Mapping[str, Sequence[str]] | None = None,
                  topology: Topology | None = None, continues: bool = False) -> tuple[bytes, Headers]:
    """(value, headers) of one message holding ``pieces`` = [(seq, part, parts, frame), ...]
    in processing order (all for one partition); ``fields``: per kind, the only fields to send;
    ``topology``: the one the slots refer to, named by its fingerprint so a worker holding
    another can refuse them; ``continues``: the last piece's frame has more pieces for this
    partition in the next bundle (``H_CONTINUES``, :func:`continues_after`)."""
    if not pieces:
        raise ValueError("a bundle needs at least one piece")
    by_kind: dict[str, list[Frame]] = {}
    table = []
    for seq, part, parts, frame in pieces:
        by_kind.setdefault(frame.kind, []).append(frame)
        table.append(f"{frame.kind}:{seq}:{part}:{parts}:{len(frame)}")
    streams = []
    sizes = []
    for kind, frames in by_kind.items():
        names = field_names(kind) if fields is None else fields[kind]
        data = frame_to_ipc(frames[0] if len(frames) == 1 else concat_rows(frames, names), compression, names)
        streams.append(data)
        sizes.append(f"{kind}:{len(data)}")
    headers = [(H_SCHEMA, SCHEMA), (H_AGENT, agent.encode()), (H_SENT, repr(sent).encode()),
               (H_STREAMS, ";".join(sizes).encode()), (H_PIECES, ";".join(table).encode())]
    if topology is not None:
        headers.append((H_TOPOLOGY, f"{topology.fingerprint()}/{topology.fingerprint(jobs=True)}".encode()))
    if continues:
        headers.append((H_CONTINUES, b"1"))
    return b"".join(streams), headers


BundleEntry = tuple[int, int, int, Frame]  # (seq, part, parts, piece)


def continues_after(entries: Sequence[BundleEntry], pieces: Sequence[tuple[int, Frame]], partition: int,
                    seq: int) -> bool:
    """Whether a bundle of ``entries`` for ``partition``, completed while frame ``seq``'s
    ``pieces`` (``PartitionMap.messages``) were being added, ends before that frame's last piece
    for the partition: its next bundle then holds the rest (``encode_bundle(continues=True)``)."""
    if not entries or entries[-1][0] != seq:
        return False
    return any(p == partition for p, _ in pieces[entries[-1][1] + 1:])


class BundleBuilder:
    """Collects one partition's pieces, in order, into bundles of at most ``max_bytes`` of rows."""

    def __init__(self, max_bytes: int = MAX_BUNDLE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.entries: list[BundleEntry] = []
        self.bytes = 0
        self.since = 0.0  # when the oldest waiting piece was added (caller's clock)

    def add(self, entry: BundleEntry, now: float = 0.0) -> list[list[BundleEntry]]:
        """Add a piece; returns the bundles that are complete now (usually none)."""
        size = len(entry[3]) * row_bytes(entry[3].kind)
        done = [self.take()] if self.entries and self.bytes + size > self.max_bytes else []
        if not self.entries:
            self.since = now
        self.entries.append(entry)
        self.bytes += size
        if self.bytes >= self.max_bytes:
            done.append(self.take())
        return done

    def take(self) -> list[BundleEntry]:
        entries, self.entries, self.bytes = self.entries, [], 0
        return entries


def headers_dict(headers: Any) -> dict[str, bytes]:
    """kafka-python and aiokafka give headers as (name, value) pairs; faust may give a dict."""
    if not headers:
        return {}
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {str(k): bytes(v) if v is not None else b"" for k, v in items}


def bundle_table(value: bytes | None, headers: Mapping[str, bytes]) -> tuple[str, float, list[tuple[str, int]],
                                                                           list[PieceRef]]:
    """(agent, sent, streams [(kind, bytes)], pieces) from a frames-topic record's headers;
    raises :class:`RecordError` ``bad_headers``."""
    reading = ""  # the header being read, for the problem's words (a decode error names none)

    def text(name: str) -> str:
        nonlocal reading
        reading = name
        return headers[name].decode()

    try:
        agent = text(H_AGENT)
        sent = float(text(H_SENT))
        if H_PIECES in headers:
            streams = [(k, int(n)) for k, n in (s.split(":") for s in text(H_STREAMS).split(";"))]
            pieces = []
            for entry in text(H_PIECES).split(";"):
                kind, seq, part, parts, rows = entry.split(":")
                pieces.append(PieceRef(kind, int(seq), int(part), int(parts), int(rows)))
        else:
            kind = text(H_KIND)
            streams = [(kind, len(value or b""))]
            pieces = [PieceRef(kind, int(text(H_SEQ)), int(text(H_PART)), int(text(H_PARTS)), None)]
    except KeyError as exc:
        raise RecordError("bad_headers", f"missing or malformed header {exc}: missing") from None
    except (ValueError, UnicodeDecodeError) as exc:
        # (until 2026-12-06 the decode error stood where the header's name belongs)
        raise RecordError("bad_headers", f"missing or malformed header {reading!r}: {exc}") from None
    for kind, size in streams:
        if size < 0:  # sizes that still add up to the value's would slice outside it
            raise RecordError("bad_headers", f"{kind} stream of {size} bytes")
    for p in pieces:
        if not 0 <= p.part < p.parts:
            raise RecordError("bad_headers", f"part {p.part} of {p.parts}")
        if p.seq < 1:
            # agents (and the JSON router) number frames from 1, and the incident stage takes a
            # seq at or below the last released (0 for a new sender) for a repeat: a seq-0 piece
            # was processed, then its findings dropped, counted by no metric
            raise RecordError("bad_headers", f"piece with sequence number {p.seq} (frames count from 1)")
        if p.rows is not None and p.rows < 0:
            raise RecordError("bad_headers", f"piece with {p.rows} rows")
    return agent, sent, streams, pieces


def _read_stream(data: pa.Buffer, max_bytes: int = MAX_DECODED_BYTES) -> tuple[Frame, tuple[str, ...]]:
    """One Arrow IPC stream as a frame (its batches joined), and the fields it carried that this
    version does not know, left out: an agent upgraded before its workers sends fields added
    since (``max_op_temp``, 2026-12-01), and refusing them dead-lettered all its frames until the
    workers were upgraded too. Raises FrameError/ValueError; RecordError ``undecodable`` when its
    buffers would take more than ``max_bytes`` decompressed, or its frame (``row_bytes`` a row)."""
    try:
        declared = _declared_bytes(data)
        if declared > max_bytes:
            raise RecordError("undecodable", f"Arrow stream declares {declared} bytes of buffers, "
                                             f"more than a record may decode to ({max_bytes})")
        batches = list(pa.ipc.open_stream(data, options=_READ_OPTIONS))
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise FrameError(f"not an Arrow IPC stream: {exc}") from None
    if not batches:
        raise FrameError("Arrow IPC stream without a record batch")
    # one batch (what encode_bundle writes): its columns convert without joining chunks first
    data_ = batches[0] if len(batches) == 1 else pa.Table.from_batches(batches)
    kind = (data_.schema.metadata or {}).get(ARROW_KIND_KEY, b"").decode()
    if not kind:
        raise FrameError("Arrow batch has no foreshock.kind metadata")
    known = field_names(kind)  # raises ValueError for an unknown kind
    if data_.num_rows * row_bytes(kind) > max_bytes:  # the frame holds every field of each row
        raise RecordError("undecodable", f"{data_.num_rows} {kind} rows of {row_bytes(kind)} bytes, more than a "
                                         f"record may decode to ({max_bytes})")
    names = data_.schema.names
    ignored = tuple(n for n in names if n not in known and n not in ("ts", "slot"))
    if ignored:
        data_ = data_.select([n for n in names if n not in ignored])
    return Frame.from_arrow(data_, kind=kind), ignored


# Arrow IPC message headers are FlatBuffers (format/Message.fbs); pyarrow reads a record
# batch's buffers only by decompressing them, so the sizes they declare are read here first.
_HEADER_DICTIONARY_BATCH, _HEADER_RECORD_BATCH = 2, 3


def _declared_bytes(data: pa.Buffer) -> int:
    """The bytes the record batches (and dictionaries) of an Arrow IPC stream take once read,
    from their headers, before Arrow decompresses anything: a compressed buffer starts with its
    uncompressed length (-1: stored as it is), which Arrow allocates as it stands. Raises
    OSError for a header it cannot read."""
    total = 0
    reader = pa.ipc.MessageReader.open_stream(data)
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return total
        body = memoryview(message.body if message.body is not None else b"")
        try:
            total += _message_declared_bytes(message.metadata.to_pybytes(), body)
        except (struct.error, IndexError) as exc:
            raise OSError(f"Arrow IPC message header: {exc}") from None


def _message_declared_bytes(meta: bytes, body: memoryview) -> int:
    """:func:`_declared_bytes` of one message: ``meta`` its header, ``body`` its buffers."""
    root = _fb_ref(meta, 0)
    header_type = _fb_scalar(meta, root, 1, "<B")
    header = _fb_table(meta, root, 2)
    if header is not None and header_type == _HEADER_DICTIONARY_BATCH:
        header = _fb_table(meta, header, 1)  # DictionaryBatch.data: a RecordBatch
    elif header_type != _HEADER_RECORD_BATCH:
        return 0  # a schema (no buffers); anything else Arrow refuses
    if header is None:
        return 0
    compressed = _fb_field(meta, header, 3) is not None  # RecordBatch.compression
    buffers = _fb_table(meta, header, 2)  # RecordBatch.buffers: [Buffer {offset: long, length: long}]
    if buffers is None:
        return 0
    total = 0
    for i in range(_fb_uint(meta, buffers)):
        offset, length = struct.unpack_from("<qq", meta, buffers + 4 + 16 * i)
        if compressed and length >= 8:
            if not 0 <= offset <= len(body) - 8:
                raise IndexError(f"buffer at {offset} outside a body of {len(body)} bytes")
            (size,) = struct.unpack_from("<q", body, offset)
            total += length - 8 if size < 0 else size
        else:
            total += max(length, 0)
    return total


def _fb_uint(buf: bytes, at: int) -> int:
    if at < 0:  # (struct reads a negative position from the end)
        raise IndexError(f"position {at}")
    return int(struct.unpack_from("<I", buf, at)[0])


def _fb_ref(buf: bytes, at: int) -> int:
    """The position an unsigned offset at ``at`` points to (a table or a vector)."""
    return at + _fb_uint(buf, at)


def _fb_field(buf: bytes, table: int, index: int) -> int | None:
    """The position of field ``index`` of the table at ``table``; None when absent."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    if vtable < 0:
        raise IndexError(f"vtable at {vtable}")
    vtable_size = struct.unpack_from("<H", buf, vtable)[0]
    if 4 + 2 * index + 2 > vtable_size:
        return None
    offset = struct.unpack_from("<H", buf, vtable + 4 + 2 * index)[0]
    return table + offset if offset else None


def _fb_scalar(buf: bytes, table: int, index: int, fmt: str) -> int:
    at = _fb_field(buf, table, index)
    return 0 if at is None else int(struct.unpack_from(fmt, buf, at)[0])


def _fb_table(buf: bytes, table: int, index: int) -> int | None:
    at = _fb_field(buf, table, index)
    return None if at is None else _fb_ref(buf, at)


def decode_bundle(value: bytes | None, headers: Mapping[str, bytes], topology: Topology,
                  pmap: PartitionMap, partition: int | None, split_unknown: bool = False) -> list[DecodedPiece]:
    """Decode and validate one frames-topic record into its pieces, in processing order.

    Raises :class:`RecordError` when the record cannot be attributed to pieces at all
    (``bad_headers``). When its data cannot be read (``wrong_schema``, ``undecodable``), or its
    slots refer to another topology than ``topology`` (``topology_mismatch``: the header names
    the agent's; records without it are taken as they are), every piece carries that error;
    otherwise each piece is checked on its own (``unknown_entity``,
    ``misrouted``; ``partition`` None skips the routing check), so one bad piece does not take
    its bundle with it. ``split_unknown``: a piece's rows of unknown entities are taken out into
    ``DecodedPiece.unknown`` instead of making the whole piece ``unknown_entity`` (its other rows
    are then checked on their own).
    """
    agent, sent, streams, refs = bundle_table(value, headers)
    pieces = [DecodedPiece(PieceInfo(agent, r.seq, r.part, r.parts, sent), r.kind) for r in refs]
    try:
        _check_topology(headers, topology, agent, any(r.kind == "job" for r in refs))
        frames, ignored = _decode_streams(value, headers, streams, refs)
    except RecordError as exc:
        for p in pieces:
            p.error = exc
        return pieces
    clean = set()
    for kind, whole in frames.items():  # the usual case, checked once per kind: every row is fine
        try:
            _check_rows(whole, topology, pmap, partition)
            clean.add(kind)
        except RecordError:
            pass
    cursor = {kind: 0 for kind in frames}
    for ref, piece in zip(refs, pieces):
        whole = frames[ref.kind]
        start = cursor[ref.kind]
        stop = len(whole) if ref.rows is None else start + ref.rows
        cursor[ref.kind] = stop
        piece.frame = whole if (start == 0 and stop == len(whole)) else row_range(whole, start, stop)
        piece.ignored_fields = ignored.get(ref.kind, ())
        if ref.kind not in clean:
            if split_unknown:
                known = ~_unknown_slots(piece.frame, topology)
                if not known.all():
                    piece.unknown = take_rows(piece.frame, ~known)
                    piece.frame = take_rows(piece.frame, known)
            try:
                _check_rows(piece.frame, topology, pmap, partition)
            except RecordError as exc:
                piece.error = exc  # the frame stays, for the dead letter
    return pieces


def _check_topology(headers: Mapping[str, bytes], topology: Topology, agent: str, has_jobs: bool) -> None:
    """The record's slots must number entities as ``topology`` does: its hardware always, its
    jobs only where the record carries job rows (a GPU agent need not restart when jobs change)."""
    theirs = headers.get(H_TOPOLOGY)
    if theirs is None:
        return
    hardware, _, jobs = theirs.decode(errors="replace").partition("/")
    ours = topology.fingerprint()
    if hardware != ours:
        raise RecordError("topology_mismatch", f"agent {agent} numbers entities by topology {hardware}, this worker "
                                               f"by {ours}: give the agents and the workers the same --topology file")
    if has_jobs and jobs != topology.fingerprint(jobs=True):
        raise RecordError("topology_mismatch", f"agent {agent} numbers jobs by another list than this worker's: "
                                               "give them the same --topology file")


def _decode_streams(value: bytes | None, headers: Mapping[str, bytes], streams: list[tuple[str, int]],
                    refs: list[PieceRef]) -> tuple[dict[str, Frame], dict[str, tuple[str, ...]]]:
    """The record's frames by kind, and per kind the fields left out as unknown (``_read_stream``)."""
    if headers.get(H_SCHEMA) != SCHEMA:
        raise RecordError("wrong_schema", f"header {H_SCHEMA} is {headers.get(H_SCHEMA)!r}, expected {SCHEMA!r}")
    if not value:
        raise RecordError("undecodable", "empty value")
    if sum(n for _, n in streams) != len(value):
        raise RecordError("undecodable", f"stream sizes add up to {sum(n for _, n in streams)} bytes, "
                                         f"the value has {len(value)}")
    buffer = pa.py_buffer(value)
    frames: dict[str, Frame] = {}
    ignored: dict[str, tuple[str, ...]] = {}
    offset = 0
    budget = MAX_DECODED_BYTES  # for the whole record, whatever its streams
    for kind, size in streams:
        try:
            frame, unknown = _read_stream(buffer.slice(offset, size), budget)
        except RecordError:
            raise
        except (FrameError, ValueError) as exc:
            raise RecordError("undecodable" if "Arrow IPC" in str(exc) else "wrong_schema", str(exc)) from None
        except (pa.ArrowException, MemoryError, IndexError) as exc:
            # damaged bytes Arrow reads as something else: an integer type wider than 64 bits
            # (ArrowNotImplementedError), a buffer length of petabytes to decompress into
            # (ArrowMemoryError), an offset past the buffer (ArrowIndexError)
            raise RecordError("undecodable", f"{kind} stream: {type(exc).__name__}: {exc}") from None
        offset += size
        budget -= len(frame) * row_bytes(frame.kind)
        if frame.kind != kind or kind in frames:
            raise RecordError("wrong_schema", f"header says kind {kind!r}, the stream holds {frame.kind!r}")
        frames[kind] = frame
        if unknown:
            ignored[kind] = unknown
    for ref in refs:
        if ref.kind not in frames:
            raise RecordError("wrong_schema", f"no {ref.kind!r} stream for piece {ref.seq}/{ref.part}")
    for kind, frame in frames.items():
        listed = [r.rows for r in refs if r.kind == kind]
        if None not in listed and sum(listed) != len(frame):  # type: ignore[arg-type]
            raise RecordError("wrong_schema", f"pieces list {sum(listed)} {kind} rows, "  # type: ignore[arg-type]
                                              f"the stream holds {len(frame)}")
    return frames, ignored


def _unknown_slots(frame: Frame, topology: Topology) -> np.ndarray:
    """Mask of the rows whose slot names no entity of the topology (a null slot reads -1)."""
    return (frame.slot < 0) | (frame.slot >= topology.size(frame.kind))


def _check_rows(frame: Frame, topology: Topology, pmap: PartitionMap, partition: int | None) -> None:
    size = topology.size(frame.kind)
    unknown = _unknown_slots(frame, topology)
    if unknown.any():
        raise RecordError("unknown_entity", f"{int(unknown.sum())} {frame.kind} rows with slots outside "
                                            f"the topology (0..{size - 1})")
    if len(frame) and partition is not None:
        wrong = pmap.by_kind[frame.kind][frame.slot] != partition
        if wrong.any():
            raise RecordError("misrouted", f"{int(wrong.sum())} rows belong to other partitions")


# ---- JSON lines topic ---------------------------------------------------------------------
# What json.loads raises for a value it cannot take: a JSONDecodeError (a ValueError) for bad
# syntax, a plain ValueError for an integer of more than sys.get_int_max_str_digits() digits, a
# RecursionError for arrays or objects nested a few thousand deep.
_JSON_ERRORS = (ValueError, RecursionError)
_JSON_DECODER = json.JSONDecoder()
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
# Lines end at CR or LF only: str.splitlines also splits at U+2028, U+2029 and U+0085, which a
# JSON string may hold as they are, cutting a valid record in two.
_LINE_END = re.compile(r"\r\n?|\n")


def _json_error(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "invalid JSON: nested too deep"
    return f"invalid JSON: {exc}"


def _skip_space(text: str, at: int) -> int:
    match = _JSON_SPACE.match(text, at)
    return match.end() if match else at


def _json_array(text: str) -> list[tuple[str, Any]]:
    """The elements of the JSON array ``text`` (no space before its ``[``), each with its own
    text; raises what ``json.loads`` raises for the same text (which has read it already)."""
    out: list[tuple[str, Any]] = []
    at = _skip_space(text, 1)
    if text.startswith("]", at):
        at += 1
    else:
        while True:
            value, end = _JSON_DECODER.raw_decode(text, at)
            out.append((text[at:end], value))
            at = _skip_space(text, end)
            if text.startswith(",", at):
                at = _skip_space(text, at + 1)
            elif text.startswith("]", at):
                at += 1
                break
            else:
                raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
    if _skip_space(text, at) != len(text):
        raise json.JSONDecodeError("Extra data", text, at)
    return out


def _json_values(text: str) -> tuple[list[Any], list[tuple[int, int]]]:
    """The JSON values of ``text`` (no space at either end) one after the other, separated by
    whitespace or not, and where each lies; raises what ``raw_decode`` raises for the first that
    is not one."""
    values: list[Any] = []
    spans: list[tuple[int, int]] = []
    at = 0
    while at < len(text):
        value, end = _JSON_DECODER.raw_decode(text, at)
        values.append(value)
        spans.append((at, end))
        at = _skip_space(text, end)
    return values, spans


def parse_json_records(value: bytes | None) -> tuple[list[Any], list[tuple[bytes, str]]]:
    """Records from one JSON-lines message, and the undecodable lines with their reasons."""
    records, _, bad = _parse_json(value)
    return records, bad


def _parse_json(value: bytes | None) -> tuple[list[Any], Callable[[], list[str]], list[tuple[bytes, str]]]:
    """:func:`parse_json_records`, and a function giving each record's text as it came (a line
    without the space around it, an array's element): an array's are found only when asked for
    (reading each element on its own takes several times ``json.loads`` of the whole)."""
    if not value:
        return [], list, [(b"", "empty message")]
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], list, [(value, f"not UTF-8: {exc}")]
    stripped = text.strip()
    if not stripped:  # as the empty message: no record in it, and none to count a problem with
        return [], list, [(value, "empty message (whitespace only)")]
    if stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except _JSON_ERRORS as exc:
            return [], list, [(value, _json_error(exc))]
        if not data:  # (an array: what starts with "[" and is valid JSON)
            return [], list, [(value, "empty message (an empty array)")]
        return list(data), lambda: [element for element, _ in _json_array(stripped)], []
    # objects one after the other, whatever the whitespace between and inside them: one
    # pretty-printed over several lines was cut into lines, each rejected as a fragment
    try:
        values, spans = _json_values(stripped)
    except _JSON_ERRORS:
        pass  # then line by line: a bad line in JSON lines costs only that line
    else:
        return values, lambda: [stripped[start:end] for start, end in spans], []
    records: list[Any] = []
    texts: list[str] = []
    bad: list[tuple[bytes, str]] = []
    for line in _LINE_END.split(stripped):
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except _JSON_ERRORS as exc:
            bad.append((line.encode(), _json_error(exc)))
            continue
        texts.append(line)
    return records, lambda: texts, bad


def json_to_frames(value: bytes | None, topology: Topology) -> tuple[list[Frame], list[tuple[bytes, str]]]:
    """Frames (one per kind, time-ordered) and rejected records as (their bytes as they came,
    reason): what goes to the dead letters is the record its producer sent."""
    records, texts, bad = _parse_json(value)
    frames, rejected = records_to_frames(records, topology.slots_resolver())
    if rejected:
        text: list[str] | None
        try:
            text = texts()
        except _JSON_ERRORS:  # an array nested just deep enough for json.loads, read here a call deeper
            text = None  # then each bad record's dead letter is the whole message
        bad += [(text[index].encode() if text is not None else value or b"", reason) for index, reason in rejected]
    return [f.sorted_by_time() for f in frames.values()], bad


def frame_to_json_lines(frame: Frame, topology: Topology) -> bytes:
    """The JSON-lines form of a frame (what an outside producer sends); NaN fields are left out."""
    lines = []
    names = field_names(frame.kind)
    for i in range(len(frame)):
        rec: dict[str, Any] = {"kind": frame.kind, "entity": topology.name(frame.kind, int(frame.slot[i])),
                               "ts": float(frame.ts[i])}
        for name in names:
            v = frame.columns[name][i]
            if not np.isnan(v):
                rec[name] = float(v)
        lines.append(json.dumps(rec))
    return "\n".join(lines).encode()


# ---- findings topic -----------------------------------------------------------------------
_FINDING_FIELDS: dict[type, tuple[tuple[str, ...], Any]] = {}


def finding_fields(finding: Finding) -> dict[str, Any]:
    """``finding_to_dict`` without ``dataclasses.asdict``'s deep copy (the hot path of a worker:
    findings are frozen, their tuples immutable); the same JSON. One ``attrgetter`` per type
    reads every field in one call."""
    cached = _FINDING_FIELDS.get(type(finding))
    if cached is None:
        names = tuple(f.name for f in fields(finding))
        cached = _FINDING_FIELDS[type(finding)] = (names, operator.attrgetter(*names))
    names, getter = cached
    values = getter(finding)
    return dict(zip(names, values if len(names) > 1 else (values,)))


@dataclass
class PieceReport:
    """What the detectors made of one piece (``now``: its newest timestamp, None when empty)."""

    info: PieceInfo
    now: float | None
    rows: int
    findings: Sequence[Finding]


def encode_findings(reports: Sequence[PieceReport], partition: int, offset: int, worker: str = "") -> bytes:
    """One message per processed bundle, even without findings: each report carries its
    piece's identity (agent, seq, part) so consumers drop redelivered duplicates, and ``now``
    for the incident stage's clock. ``agent`` and ``sent`` are the bundle's (its first report's)."""
    if not reports:
        raise ValueError("a findings message needs at least one report")
    first = reports[0].info
    return _findings_json({
        "agent": first.agent, "sent": first.sent, "partition": partition, "offset": offset, "worker": worker,
        "pieces": [{"agent": r.info.agent, "seq": r.info.seq, "part": r.info.part, "parts": r.info.parts,
                    "now": r.now, "rows": r.rows, "findings": [finding_fields(f) for f in r.findings]}
                   for r in reports],
    })


def _findings_json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), default=float).encode()


FINDINGS_MAX_BYTES = BUNDLE_MAX_MESSAGE_BYTES - MESSAGE_FRAMING_BYTES


def split_findings(value: bytes, max_bytes: int = FINDINGS_MAX_BYTES) -> tuple[list[bytes], list[str]]:
    """An :func:`encode_findings` message as messages of at most ``max_bytes`` each (the findings
    topic refuses larger ones; a bundle where every row yields a finding makes ~27 MB): each
    holds some of its piece reports, in order, under the same envelope; a consumer reads them
    as it reads any findings message. One report is never split (its piece's identity is what
    consumers drop repeats by): a report alone larger than ``max_bytes`` keeps the findings that
    fit and loses the others (thousands of GPUs of one piece all predicted at once, or a finding
    with a reason of megabytes). Sent whole, the topic refused it, the worker ended, and its
    restart met the same record, for good. Returns the messages and, for each report cut short,
    what it lost (for the caller to count and dead-letter its record)."""
    if len(value) <= max_bytes:
        return [value], []
    data = json.loads(value)
    reports = data.pop("pieces")
    head = _findings_json({**data, "pieces": []})[:-2]  # up to the reports' "[" (the last key)
    envelope = len(head) + 2
    out: list[bytes] = []
    cut: list[str] = []
    group: list[bytes] = []
    size = envelope
    for report in reports:
        piece = _findings_json(report)
        if envelope + len(piece) > max_bytes:
            piece, lost = _trimmed_report(report, max_bytes - envelope)
            cut.append(f"{report['agent']} frame {report['seq']} part {report['part']}: {lost} of "
                       f"{len(report['findings'])} findings left out, past the findings topic's message size")
        if group and size + len(piece) + 1 > max_bytes:  # (and its comma)
            out.append(head + b",".join(group) + b"]}")
            group, size = [], envelope
        group.append(piece)
        size += len(piece) + 1
    out.append(head + b",".join(group) + b"]}")
    return out, cut


def _trimmed_report(report: dict[str, Any], max_bytes: int) -> tuple[bytes, int]:
    """A piece report with only the findings that fit in ``max_bytes``, in order (one too large
    alone is skipped, not those after it); and how many it lost."""
    findings = report["findings"]
    size = len(_findings_json({**report, "findings": []}))
    kept = []
    for finding in findings:
        length = len(_findings_json(finding)) + 1  # (and its comma)
        if size + length <= max_bytes:
            kept.append(finding)
            size += length
    return _findings_json({**report, "findings": kept}), len(findings) - len(kept)


def encode_telemetry(agent: str, sent: float, pieces: Sequence[BundleEntry],
                     fields: Mapping[str, Sequence[str]] | None,
                     max_bytes: int = FINDINGS_MAX_BYTES) -> tuple[list[tuple[bytes, Headers]], list[BundleEntry]]:
    """Forwarded telemetry (``pieces``' rows of ``fields``, for the incident stage) as findings-
    topic messages of at most ``max_bytes`` each, value and headers, in processing order; and
    the pieces left out, each alone past the bound.

    What an agent bundles (``MAX_BUNDLE_BYTES`` of rows) fits one message; a record crafted up to
    the decode bound (``MAX_DECODED_BYTES``) with every field forwarded did not, the findings
    topic refused it, the worker ended, and its restart met the same record. Split between
    pieces, each message reads as any forwarded telemetry; a piece is never split (the incident
    stage keeps one frame per piece, and a redelivered one replaces it)."""
    value, headers = encode_bundle(agent, sent, pieces, "lz4", fields)
    headers.append((H_CONTENT, TELEMETRY))
    if len(value) + sum(len(k.encode()) + len(v) for k, v in headers) <= max_bytes:
        return [(value, headers)], []
    if len(pieces) == 1:
        return [], list(pieces)
    half = len(pieces) // 2
    head, head_left = encode_telemetry(agent, sent, pieces[:half], fields, max_bytes)
    tail, tail_left = encode_telemetry(agent, sent, pieces[half:], fields, max_bytes)
    return head + tail, head_left + tail_left


@dataclass
class FindingsMessage:
    """One piece's report, as read back from the findings topic."""

    agent: str
    seq: int
    part: int
    parts: int
    now: float | None
    rows: int
    sent: float
    findings: list[Finding]
    worker: str = ""

    @property
    def piece_id(self) -> tuple[str, int, int]:
        return (self.agent, self.seq, self.part)


def is_telemetry(headers: Any) -> bool:
    """A findings-topic record holding forwarded telemetry rather than findings."""
    return headers_dict(headers).get(H_CONTENT) == TELEMETRY


def decode_findings(value: bytes, with_findings: bool = True) -> list[FindingsMessage]:
    """The piece reports of one findings message (``with_findings=False`` skips building the
    Finding objects: enough for counting pieces and latency).

    Each report's identity and each finding's fields are checked, not only read: what passes here
    runs in the incident stage, where an error ends the worker, and its restart met the same
    record, for good (until 2026-12-05: a report of frame -1 raised KeyError in ``observe``, a
    finding with ``"ts": null`` TypeError in the processors). A report numbered as no agent
    numbers its frames (seq below 1, as the frames topic's ``bad_headers``), or a part outside
    its frame's parts, was taken: seq 0 as a repeat, counted nowhere; part 5 of 2 waited as a
    frame never complete. Such a message raises ``undecodable``, the record is counted and
    dead-lettered (``faust_app.on_findings``)."""
    try:
        data = json.loads(value)
        sent = _number(data["sent"], "sent")
        worker = str(data.get("worker", ""))
        return [_report(p, sent, worker, with_findings) for p in data["pieces"]]
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        raise RecordError("undecodable", f"findings message: {type(exc).__name__}: {exc}") from None


def _report(data: dict[str, Any], sent: float, worker: str, with_findings: bool) -> FindingsMessage:
    """One piece report of a findings message, checked (:func:`decode_findings`)."""
    agent, seq, part, parts, rows = (data["agent"], _integer(data["seq"], "seq"), _integer(data["part"], "part"),
                                     _integer(data["parts"], "parts"), _integer(data["rows"], "rows"))
    if not isinstance(agent, str):
        raise TypeError(f"agent {agent!r} is not a string")
    if seq < 1:  # agents number frames from 1 (``bundle_table``)
        raise ValueError(f"{agent} piece with sequence number {seq} (frames count from 1)")
    if not 0 <= part < parts:
        raise ValueError(f"{agent} frame {seq}: part {part} of {parts}")
    if rows < 0:
        raise ValueError(f"{agent} frame {seq} part {part}: {rows} rows")
    now = None if data["now"] is None else _finite(data["now"], "now")
    findings = data["findings"]
    if not isinstance(findings, list):
        raise TypeError(f"findings {type(findings).__name__}, not a list")
    built = [finding_from_dict(_finding_fields(f)) for f in findings] if with_findings else []
    return FindingsMessage(agent, seq, part, parts, now, rows, sent, built, worker)


def _number(value: Any, name: str) -> float:
    """``value`` as a float where JSON gave a number (not a string, null or boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} {value!r} is not a number")
    return float(value)


def _finite(value: Any, name: str) -> float:
    number = _number(value, name)
    if not math.isfinite(number):
        raise ValueError(f"{name} {value!r} is not finite")
    return number


def _integer(value: Any, name: str) -> int:
    """``value`` as an int where JSON gave a whole number: 3.0 too (a NumPy integer the encoder
    wrote through ``default=float``), not 2.5 or "3"."""
    number = _number(value, name)
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} {value!r} is not a whole number")
    return int(value)


def _flag(value: Any, name: str) -> bool:
    """A boolean, or 0/1 (a NumPy boolean written through ``default=float``)."""
    if isinstance(value, bool):
        return value
    if _number(value, name) not in (0.0, 1.0):
        raise ValueError(f"{name} {value!r} is not a boolean")
    return bool(value)


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} {value!r} is not a string")
    return value


def _pairs(value: Any, name: str) -> tuple[tuple[str, float], ...]:
    """(name, number) pairs: an incident's predicted members or jobs."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} {value!r} is not a list")
    out = []
    for pair in value:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(f"{name} entry {pair!r} is not a (name, number) pair")
        out.append((_text(pair[0], name), _number(pair[1], name)))
    return tuple(out)


def _names(value: Any, name: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} {value!r} is not a list")
    return tuple(_text(v, name) for v in value)


# How a finding's field of each declared type is checked and read (``Anomaly``, ``Prediction``,
# ``Incident``): by the dataclass's own annotations, so a field added there is checked here. A
# finding's timestamp is the incident processors' clock: a finite one only (the guard lets no other
# through to the detectors). A type not listed is taken as it is.
_FIELD_READERS: dict[str, Callable[[Any, str], Any]] = {
    "float": _number, "int": _integer, "bool": _flag, "str": _text,
    "tuple[str, ...]": _names, "tuple[tuple[str, float], ...]": _pairs,
}
# A value of the type itself (str for "str", float for "float") is taken without a call: every
# finding is read here, on the incident worker's one thread (checked, 5.2 µs a finding, was 3.6).
_PLAIN_TYPES: dict[str, type] = {"float": float, "int": int, "str": str, "bool": bool}
_FINDING_TYPES = {cls.__name__.lower(): cls for cls in (Anomaly, Prediction, Incident)}
_FINDING_READERS: dict[str, dict[str, tuple[type | None, Callable[[Any, str], Any]]]] = {
    kind: {f.name: (None, _finite) if f.name == "ts" else
           (_PLAIN_TYPES.get(str(f.type)), _FIELD_READERS.get(str(f.type), lambda v, _: v))
           for f in fields(cls) if f.init}
    for kind, cls in _FINDING_TYPES.items()}


def _finding_fields(data: Any) -> dict[str, Any]:
    """A finding's dict from the findings topic with each field checked against its type and read
    as it (:data:`_FIELD_READERS`); raises TypeError/ValueError. Missing or unknown fields are left
    to ``finding_from_dict`` (which raises TypeError)."""
    if not isinstance(data, dict):
        raise TypeError(f"finding {data!r} is not an object")
    readers = _FINDING_READERS.get(data.get("type"))  # type: ignore[arg-type]
    if readers is None:
        raise ValueError(f"unknown finding type {data.get('type')!r}")
    out = {}
    for key, value in data.items():
        plain, read = readers.get(key, (None, None))
        out[key] = value if read is None or type(value) is plain else read(value, key)
    return out


H_ORIGINAL_BYTES = "foreshock-original-bytes"  # on a dead letter cut short: its record's value size
DEADLETTER_MAX_BYTES = BUNDLE_MAX_MESSAGE_BYTES - MESSAGE_FRAMING_BYTES


def capped_deadletter(key: bytes | None, value: bytes | None, headers: Headers,
                      max_bytes: int = DEADLETTER_MAX_BYTES) -> tuple[bytes | None, Headers]:
    """A dead letter's value and headers within ``max_bytes`` (key and headers counted): a value
    that would pass it keeps only its head, and the header ``foreshock-original-bytes`` gives its
    size (``foreshock-source`` says where the whole record is). A record the broker took
    compressed reads back as its raw bytes, which the dead-letter topic refused: the worker ended,
    and its restart met the same record."""
    if value is None:
        return value, headers
    room = max_bytes - len(key or b"") - sum(len(k.encode()) + len(v) for k, v in headers) \
        - len(H_ORIGINAL_BYTES) - 20
    if len(value) <= room:
        return value, headers
    return value[:max(room, 0)], headers + [(H_ORIGINAL_BYTES, str(len(value)).encode())]


def deadletter_headers(headers: Iterable[tuple[str, bytes]], reason: str, stage: str, topic: str,
                       partition: int, offset: int) -> Headers:
    keep = [(k, v) for k, v in headers if k not in (H_REASON, H_STAGE, H_SOURCE)]
    return keep + [(H_REASON, reason.encode()), (H_STAGE, stage.encode()),
                   (H_SOURCE, f"{topic}/{partition}/{offset}".encode())]
