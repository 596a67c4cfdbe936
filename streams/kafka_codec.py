"""What travels on the Kafka topics, and how entities are routed to partitions.

**Routing.** Detector state is per entity, but some detectors read an entity's parents too
(the thermal detector combines a GPU's samples with its rack's inlet temperature and its
node's power). So a node's data goes to the partition of its *rack*, and all of a rack's
nodes, GPUs, links and optics and the rack's own samples meet in one partition, in the order
produced: a worker sees exactly the rows the embedded pipeline would give those entities.
Switch-to-switch links (and their optics) are routed by their first switch, jobs by job.
Detectors that compare entities across racks belong in the incident stage, which sees every
finding.

**Frames topic.** An agent splits each source frame by partition, and large pieces into
chunks (``MAX_PIECE_BYTES``); each message carries the frame's (agent, seq) and its index
``part`` among the frame's ``parts`` messages, so the incident stage knows when a frame is
complete. Value: Arrow IPC (``Frame.to_ipc``); key: ``"<kind>/<partition>"``; headers below.

**JSON lines** (``telemetry.json``): one object, an array of objects, or objects separated by
newlines, each ``{"kind": "gpu", "entity": "node0/gpu3", "ts": 1.7e9, "<field>": value, ...}``
(field names from the field table, base units).

**Dead letters** keep the original key, value and headers, plus ``foreshock-reason``,
``foreshock-stage`` and ``foreshock-source`` (``topic/partition/offset``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from foreshock.fields import field_names
from foreshock.findings import Finding, finding_from_dict, finding_to_dict
from foreshock.frames import Frame, FrameError, frames_from_records
from foreshock.topology import Topology

SCHEMA = b"arrow-ipc/1"
H_SCHEMA = "foreshock-schema"
H_KIND = "foreshock-kind"
H_AGENT = "foreshock-agent"
H_SEQ = "foreshock-seq"
H_PART = "foreshock-part"
H_PARTS = "foreshock-parts"
H_SENT = "foreshock-sent"  # wall time the agent sent the piece (latency accounting)
H_REASON = "foreshock-reason"
H_STAGE = "foreshock-stage"
H_SOURCE = "foreshock-source"

Headers = list[tuple[str, bytes]]

# Arrow columns per message: well under the broker's default 1 MB message.max.bytes.
MAX_PIECE_BYTES = 768 * 1024


class RecordError(ValueError):
    """A record cannot be used; ``reason`` is a short stable label, the message the detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


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
                sw = int(topology.link_a_switch[i])
                link_part[i] = (n_racks + max(sw, 0)) % partitions
        self.by_kind: dict[str, np.ndarray] = {
            "rack": rack_part, "node": node_part, "gpu": gpu_part, "link": link_part,
            "optic": np.repeat(link_part, 2),
            "job": np.arange(len(topology.jobs), dtype=np.int64) % partitions,
        }

    def partition_of(self, kind: str, slots: np.ndarray) -> np.ndarray:
        """Partition per row; -1 for slots outside the topology."""
        table = self.by_kind[kind]
        out = np.full(len(slots), -1, dtype=np.int64)
        ok = (slots >= 0) & (slots < len(table))
        out[ok] = table[slots[ok]]
        return out

    def split(self, frame: Frame) -> list[Frame]:
        """One piece per partition (index = partition), empty where no rows go there.

        Rows with unknown slots go to partition 0, whose worker dead-letters the piece.
        """
        part = self.partition_of(frame.kind, frame.slot)
        part[part < 0] = 0
        if self.partitions == 1:
            return [frame]
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.partitions + 1))
        return [frame.take(order[bounds[p]:bounds[p + 1]]) for p in range(self.partitions)]

    def messages(self, frame: Frame, max_bytes: int = MAX_PIECE_BYTES) -> list[tuple[int, Frame]]:
        """The (partition, piece) messages for one frame: each partition's rows in chunks of at
        most ``max_bytes`` of columns, in row order; one empty piece when the frame is empty (the
        incident stage must still see every frame's sequence number)."""
        per_row = 8 * (len(field_names(frame.kind)) + 2)
        max_rows = max(1, max_bytes // per_row)
        out = []
        for part, piece in enumerate(self.split(frame)):
            for start in range(0, len(piece), max_rows):
                out.append((part, piece.take(np.arange(start, min(start + max_rows, len(piece))))))
        return out or [(0, frame)]


# ---- frames topic -------------------------------------------------------------------------
def piece_headers(kind: str, agent: str, seq: int, part: int, parts: int, sent: float) -> Headers:
    return [(H_SCHEMA, SCHEMA), (H_KIND, kind.encode()), (H_AGENT, agent.encode()),
            (H_SEQ, str(seq).encode()), (H_PART, str(part).encode()), (H_PARTS, str(parts).encode()),
            (H_SENT, repr(sent).encode())]


def piece_key(kind: str, part: int) -> bytes:
    return f"{kind}/{part}".encode()


def headers_dict(headers: Any) -> dict[str, bytes]:
    """kafka-python and aiokafka give headers as (name, value) pairs; faust may give a dict."""
    if not headers:
        return {}
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {str(k): bytes(v) if v is not None else b"" for k, v in items}


@dataclass(frozen=True)
class PieceInfo:
    agent: str
    seq: int
    part: int
    parts: int
    sent: float


def decode_piece(value: bytes | None, headers: Mapping[str, bytes], topology: Topology,
                 pmap: PartitionMap, partition: int) -> tuple[Frame, PieceInfo]:
    """Validate and decode one frames-topic record; raises :class:`RecordError`."""
    piece_info(headers)
    return decode_piece_frame(value, headers, topology, pmap, partition), piece_info(headers)


def piece_info(headers: Mapping[str, bytes]) -> PieceInfo:
    """The piece's identity from its headers; raises :class:`RecordError`."""
    try:
        info = PieceInfo(headers[H_AGENT].decode(), int(headers[H_SEQ]), int(headers[H_PART]),
                         int(headers[H_PARTS]), float(headers[H_SENT]))
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raise RecordError("bad_headers", f"missing or malformed header {exc}") from None
    if not 0 <= info.part < info.parts:
        raise RecordError("bad_headers", f"part {info.part} of {info.parts}")
    return info


def decode_piece_frame(value: bytes | None, headers: Mapping[str, bytes], topology: Topology,
                       pmap: PartitionMap, partition: int) -> Frame:
    """The piece's frame, validated against the topology and the routing; raises :class:`RecordError`."""
    if headers.get(H_SCHEMA) != SCHEMA:
        raise RecordError("wrong_schema", f"header {H_SCHEMA} is {headers.get(H_SCHEMA)!r}, expected {SCHEMA!r}")
    if not value:
        raise RecordError("undecodable", "empty value")
    try:
        frame = Frame.from_ipc(value)
    except (FrameError, ValueError) as exc:
        raise RecordError("undecodable" if "Arrow IPC" in str(exc) else "wrong_schema", str(exc)) from None
    kind = headers.get(H_KIND, b"").decode(errors="replace")
    if frame.kind != kind:
        raise RecordError("wrong_schema", f"header says kind {kind!r}, the frame holds {frame.kind!r}")
    size = topology.size(frame.kind)
    unknown = (frame.slot < 0) | (frame.slot >= size)
    if unknown.any():
        raise RecordError("unknown_entity", f"{int(unknown.sum())} {frame.kind} rows with slots outside "
                                            f"the topology (0..{size - 1})")
    if len(frame):
        wrong = pmap.partition_of(frame.kind, frame.slot) != partition
        if wrong.any():
            raise RecordError("misrouted", f"{int(wrong.sum())} rows belong to other partitions")
    return frame


# ---- JSON lines topic ---------------------------------------------------------------------
def parse_json_records(value: bytes | None) -> tuple[list[Any], list[tuple[bytes, str]]]:
    """Records from one JSON-lines message, and the undecodable lines with their reasons."""
    if not value:
        return [], [(b"", "empty message")]
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [(value, f"not UTF-8: {exc}")]
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            return [], [(value, f"invalid JSON: {exc}")]
        return list(data), []
    records: list[Any] = []
    bad: list[tuple[bytes, str]] = []
    for line in stripped.splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            bad.append((line.encode(), f"invalid JSON: {exc}"))
    return records, bad


def json_to_frames(value: bytes | None, topology: Topology) -> tuple[list[Frame], list[tuple[bytes, str]]]:
    """Frames (one per kind, time-ordered) and rejected records as (bytes, reason)."""
    records, bad = parse_json_records(value)
    frames, rejected = frames_from_records(records, topology.slots_resolver())
    for rec, reason in rejected:
        bad.append((json.dumps(rec, default=str).encode(), reason))
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
def encode_findings(findings: Sequence[Finding], info: PieceInfo, partition: int, offset: int,
                    now: float | None, rows: int, worker: str = "") -> bytes:
    """One message per processed piece, even without findings: it carries the piece's identity
    (agent, seq, part) so consumers drop redelivered duplicates, and ``now`` for the incident
    stage's clock."""
    return json.dumps({
        "agent": info.agent, "seq": info.seq, "part": info.part, "parts": info.parts,
        "partition": partition, "offset": offset, "now": now, "rows": rows, "sent": info.sent, "worker": worker,
        "findings": [finding_to_dict(f) for f in findings],
    }, separators=(",", ":"), default=float).encode()


@dataclass
class FindingsMessage:
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


def decode_findings(value: bytes) -> FindingsMessage:
    try:
        data = json.loads(value)
        return FindingsMessage(str(data["agent"]), int(data["seq"]), int(data["part"]), int(data["parts"]),
                               None if data["now"] is None else float(data["now"]), int(data["rows"]),
                               float(data["sent"]), [finding_from_dict(f) for f in data["findings"]],
                               str(data.get("worker", "")))
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError("undecodable", f"findings message: {exc}") from None


def deadletter_headers(headers: Iterable[tuple[str, bytes]], reason: str, stage: str, topic: str,
                       partition: int, offset: int) -> Headers:
    keep = [(k, v) for k, v in headers if k not in (H_REASON, H_STAGE, H_SOURCE)]
    return keep + [(H_REASON, reason.encode()), (H_STAGE, stage.encode()),
                   (H_SOURCE, f"{topic}/{partition}/{offset}".encode())]
