"""The work a faust worker does, without faust: detection per partition, the incident stage,
and their checkpoints. ``faust_app`` moves records in and out; this module decides.

**Detection.** Each owned partition of ``telemetry.frames`` has its own
:class:`~foreshock.streams.embedded.EmbeddedPipeline` (input guard + detector bank without
the incident processors), fed the partition's pieces in offset order. Because routing keeps a
rack's entities together (``kafka_codec``), each entity sees the same rows as in the embedded
pipeline, so it produces the same findings.

**Incidents.** The findings of all partitions meet in one place (``foreshock.findings`` has
one partition). :class:`IncidentStage` puts the pieces of each source frame back together —
frame (agent, seq) is complete when all its ``parts`` pieces reported — and runs the incident
processors on them in sequence order, as the embedded bank does after each frame.

**Checkpoints and delivery (at-least-once).** A checkpoint holds the stage's state and the
last source offset it covers. A worker writes one per partition every ``interval`` seconds,
*after* flushing the findings produced so far, and only then lets faust commit the offsets
(events are acked at checkpoint time, never earlier). So the committed offset never passes the
checkpoint, and a worker that takes over a partition (after a SIGKILL or a rebalance) loads
the checkpoint, skips records at or below its offset, and re-processes the rest. Findings are
never lost; those of the re-processed records are published again — at most one checkpoint
interval of pieces per failure. Each findings message carries its piece identity
(agent, seq, part), so a consumer can drop the repeats; the incident stage does.
"""

from __future__ import annotations

import logging
import pickle
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from foreshock.detectors.bank import DetectorBank, FindingProcessor
from foreshock.exporters.store import FindingStore
from foreshock.findings import Finding
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .embedded import EmbeddedPipeline
from .kafka_codec import (FindingsMessage, PartitionMap, RecordError, decode_piece_frame, encode_findings,
                          headers_dict, piece_info)

log = logging.getLogger("foreshock.worker")

CHECKPOINT_VERSION = 1


# ---- checkpoint encoding ------------------------------------------------------------------
def state_delta(initial: Any, current: Any) -> Any:
    """``current`` as a difference from ``initial``: a partition's bank holds full-size arrays,
    but only its own entities' rows ever change, so the delta is small."""
    if isinstance(current, dict) and isinstance(initial, dict):
        return {"__dict__": {k: state_delta(initial.get(k), v) for k, v in current.items()}}
    if (isinstance(current, np.ndarray) and isinstance(initial, np.ndarray)
            and current.shape == initial.shape and current.dtype == initial.dtype and current.size):
        a, b = current.reshape(-1), initial.reshape(-1)
        same = a == b
        if a.dtype.kind in "fc":
            same |= np.isnan(a) & np.isnan(b)
        idx = np.flatnonzero(~same)
        if len(idx) * 2 < a.size:
            return {"__delta__": (idx.astype(np.int64), a[idx].copy())}
    return {"__value__": current}


def apply_delta(initial: Any, delta: Any) -> Any:
    if "__dict__" in delta:
        base = initial if isinstance(initial, dict) else {}
        return {k: apply_delta(base.get(k), v) for k, v in delta["__dict__"].items()}
    if "__delta__" in delta:
        idx, values = delta["__delta__"]
        out = np.array(initial, copy=True)
        out.reshape(-1)[idx] = values
        return out
    return delta["__value__"]


def encode_checkpoint(offset: int, state: Any, kind: str, signature: str) -> bytes:
    blob = {"version": CHECKPOINT_VERSION, "kind": kind, "signature": signature, "offset": offset, "state": state}
    return zlib.compress(pickle.dumps(blob, protocol=5), 1)


def decode_checkpoint(data: bytes, kind: str, signature: str) -> tuple[int, Any]:
    """Checkpoints come only from this pipeline's own internal topic (pickle is trusted here)."""
    blob = pickle.loads(zlib.decompress(data))
    if blob.get("version") != CHECKPOINT_VERSION or blob.get("kind") != kind:
        raise ValueError(f"checkpoint version/kind {blob.get('version')}/{blob.get('kind')} not {CHECKPOINT_VERSION}/{kind}")
    if blob.get("signature") != signature:
        raise ValueError(f"checkpoint written by a different bank ({blob.get('signature')!r}, this is {signature!r})")
    return int(blob["offset"]), blob["state"]


def bank_signature(bank: DetectorBank) -> str:
    return ",".join([d.name for d in bank.detectors] + [p.name for p in bank.processors])


# ---- detection ----------------------------------------------------------------------------
@dataclass
class PieceResult:
    """What processing one frames-topic record produced. A dead-lettered piece whose headers
    were readable also has an (empty) findings message."""

    skipped: bool = False
    findings_message: bytes | None = None
    findings: list[Finding] = field(default_factory=list)
    rows: int = 0
    dead_reason: str | None = None
    dead_detail: str = ""


class _Partition:
    def __init__(self, pipeline: EmbeddedPipeline, offset: int) -> None:
        self.pipeline = pipeline
        self.offset = offset  # last processed (or checkpointed) offset
        self.checkpointed = offset


class DetectionStage:
    """Per-partition pipelines of one worker."""

    def __init__(self, topology: Topology, make_bank: Callable[[], DetectorBank], partitions: int,
                 store: FindingStore | None = None, health: PipelineHealth | None = None,
                 worker_id: str = "") -> None:
        self.topology = topology
        self.worker_id = worker_id
        self.health = health or PipelineHealth()
        self.store = store or FindingStore(topology, self.health)
        self.pmap = PartitionMap(topology, partitions)
        self._make_bank = make_bank
        self.parts: dict[int, _Partition] = {}
        fresh = self._new_pipeline()
        self.signature = bank_signature(fresh.bank)
        self._initial = self._state(fresh)

    def _new_pipeline(self) -> EmbeddedPipeline:
        full = self._make_bank()
        bank = DetectorBank(self.topology, full.detectors, processors=())  # incidents run in IncidentStage
        return EmbeddedPipeline(self.topology, bank, self.store, (), self.health)

    @staticmethod
    def _state(pipeline: EmbeddedPipeline) -> dict[str, Any]:
        return {"guard": pipeline.guard.state_dict(), "bank": pipeline.bank.state_dict()}

    # partition ownership
    def owns(self, partition: int) -> bool:
        return partition in self.parts

    def load(self, partition: int, checkpoint: bytes | None) -> int:
        """Take a partition, from its checkpoint (or fresh); returns the offset covered (-1 none)."""
        pipeline = self._new_pipeline()
        offset = -1
        if checkpoint is not None:
            try:
                offset, delta = decode_checkpoint(checkpoint, "detect", self.signature)
                state = apply_delta(self._initial, delta)
                pipeline.guard.load_state_dict(state["guard"])
                pipeline.bank.load_state_dict(state["bank"])
            except Exception as exc:  # a checkpoint we cannot use must not stop the worker
                self.health.problem("worker", "checkpoint_unusable", detail=f"partition {partition}: {exc}")
                pipeline, offset = self._new_pipeline(), -1
        self.parts[partition] = _Partition(pipeline, offset)
        log.info("partition %d: resumed after offset %d", partition, offset)
        return offset

    def drop(self, partition: int) -> None:
        self.parts.pop(partition, None)

    def offset(self, partition: int) -> int:
        return self.parts[partition].offset

    def process(self, partition: int, offset: int, value: bytes | None, headers: Any) -> PieceResult:
        part = self.parts[partition]
        if offset <= part.offset:
            return PieceResult(skipped=True)  # covered by the checkpoint: already processed
        if offset > part.offset + 1 and part.offset >= 0:
            self.health.problem("worker", "offset_gap",
                                detail=f"partition {partition}: offset {offset} after {part.offset}")
        part.offset = offset
        hdrs = headers_dict(headers)
        try:
            info = piece_info(hdrs)
        except RecordError as exc:
            self.health.problem("worker", exc.reason, detail=str(exc))
            return PieceResult(dead_reason=exc.reason, dead_detail=str(exc))
        try:
            frame = decode_piece_frame(value, hdrs, self.topology, self.pmap, partition)
        except RecordError as exc:
            self.health.problem("worker", exc.reason, detail=str(exc))
            # an empty report keeps the frame's sequence complete for the incident stage
            return PieceResult(findings_message=encode_findings([], info, partition, offset, None, 0, self.worker_id),
                               dead_reason=exc.reason, dead_detail=str(exc))
        findings = part.pipeline.process(frame) if len(frame) else []
        clean_rows = len(frame)
        now = float(frame.ts.max()) if len(frame) else None
        self.health.processed(frame.kind, clean_rows)
        message = encode_findings(findings, info, partition, offset, now, clean_rows, self.worker_id)
        return PieceResult(findings_message=message, findings=findings, rows=clean_rows)

    def checkpoint(self, partition: int) -> tuple[int, bytes]:
        part = self.parts[partition]
        blob = encode_checkpoint(part.offset, state_delta(self._initial, self._state(part.pipeline)),
                                 "detect", self.signature)
        return part.offset, blob

    def mark_checkpointed(self, partition: int, offset: int) -> None:
        if partition in self.parts:
            self.parts[partition].checkpointed = offset


# ---- incidents ----------------------------------------------------------------------------
class IncidentStage:
    """Reassembles each source frame's findings from its pieces and runs the processors on them
    in (agent, seq) order; drops redelivered pieces."""

    def __init__(self, processors: Sequence[FindingProcessor], health: PipelineHealth | None = None) -> None:
        self.processors = list(processors)
        self.health = health or PipelineHealth()
        self.signature = ",".join(p.name for p in self.processors)
        self.released: dict[str, int] = {}  # agent -> last released seq
        self.pending: dict[tuple[str, int], dict[int, FindingsMessage]] = {}
        self.offset = -1
        self.duplicates = 0

    def observe(self, message: FindingsMessage) -> list[Finding]:
        if message.seq <= self.released.get(message.agent, 0):
            self.duplicates += 1
            return []
        pieces = self.pending.setdefault((message.agent, message.seq), {})
        if message.part in pieces:
            self.duplicates += 1
            return []
        pieces[message.part] = message
        out: list[Finding] = []
        while True:
            nxt = (message.agent, self.released.get(message.agent, 0) + 1)
            ready = self.pending.get(nxt)
            if not ready or len(ready) < next(iter(ready.values())).parts:
                break
            del self.pending[nxt]
            self.released[message.agent] = nxt[1]
            out.extend(self._run([ready[p] for p in sorted(ready)]))
        return out

    def _run(self, pieces: list[FindingsMessage]) -> list[Finding]:
        findings: list[Finding] = [f for p in pieces for f in p.findings]
        nows = [p.now for p in pieces if p.now is not None]
        if not self.processors or not nows:
            return []
        base = len(findings)
        now = max(nows)
        for proc in self.processors:
            findings.extend(proc.observe(findings, now))
        return findings[base:]

    def state(self) -> dict[str, Any]:
        return {"processors": {p.name: p.state_dict() for p in self.processors},
                "released": dict(self.released), "pending": self.pending}

    def checkpoint(self) -> tuple[int, bytes]:
        return self.offset, encode_checkpoint(self.offset, self.state(), "incidents", self.signature)

    def load(self, checkpoint: bytes | None) -> int:
        if checkpoint is None:
            return -1
        try:
            offset, state = decode_checkpoint(checkpoint, "incidents", self.signature)
            for p in self.processors:
                p.load_state_dict(state["processors"][p.name])
            self.released = dict(state["released"])
            self.pending = state["pending"]
            self.offset = offset
        except Exception as exc:
            self.health.problem("worker", "checkpoint_unusable", detail=f"incident stage: {exc}")
            return -1
        return self.offset


def dedupe_findings_messages(messages: Sequence[FindingsMessage]) -> list[FindingsMessage]:
    """First copy of each piece (what a consumer of ``foreshock.findings`` does with repeats)."""
    seen: set[tuple[str, int, int]] = set()
    out = []
    for m in messages:
        if m.piece_id not in seen:
            seen.add(m.piece_id)
            out.append(m)
    return out

