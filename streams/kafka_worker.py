"""The work a faust worker does, without faust: detection per partition, the incident stage,
and their checkpoints. ``faust_app`` moves records in and out; this module decides.

**Detection.** Each owned partition of ``telemetry.frames`` has its own
:class:`~foreshock.streams.embedded.EmbeddedPipeline` (input guard + detector bank without
the incident processors), fed the partition's records in offset order and each record's
pieces in their order. Because routing keeps a rack's entities together (``kafka_codec``),
each entity sees the same rows, in the same frames, as in the embedded pipeline, so it
produces the same findings (but for comparisons across a job that spans partitions: the
straggler detector compares a job's GPUs within each partition's share of the job,
``DetectionStage._warn_split_jobs``): a partition's share of a frame that the agent cut into
several pieces (``MAX_PIECE_BYTES``) runs as one frame, its pieces joined, and one that goes on in the
sender's next bundle (``H_CONTINUES``) is held, in the checkpoint too, until its last piece
came, or run as it is after ``FRAME_WAIT_S`` without it (counted ``held_abandoned``). A record
(a bundle of pieces) gets one findings message (none when all its pieces are held: their reports
go with the frame's last piece).

**Incidents.** The findings of all partitions meet in one place (``foreshock.findings`` has
one partition). :class:`IncidentStage` puts the pieces of each source frame back together —
frame (agent, seq) is complete when all its ``parts`` pieces reported — and runs the incident
processors on them in sequence order, as the embedded bank does after each frame. Outside
fault/alert events (``external.events``) are queued in the processors before the findings
message read after them, and grouped once telemetry time reaches their ``time``; the incident
checkpoint holds the queue and the last external offset taken, so a crash neither loses a queued
event nor takes one twice. A stage without a checkpoint reads the topic from its start and skips,
counted, the events dated well before its first telemetry (``IncidentStage.add_external``).

**Checkpoints and delivery (at-least-once).** A checkpoint holds the stage's state and the
last source offset it covers. A worker writes one per partition every ``interval`` seconds,
*after* flushing the findings produced so far, and only then lets faust commit the offsets
(events are acked at checkpoint time, never earlier). So the committed offset never passes the
checkpoint, and a worker that takes over a partition (after a SIGKILL or a rebalance) loads
the checkpoint, skips records at or below its offset, and re-processes the rest. Findings are
never lost; those of the re-processed records are published again — at most one checkpoint
interval of records per failure. Each piece report in a findings message carries its piece
identity (agent, seq, part), so a consumer can drop the repeats; the incident stage does.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from foreshock.detectors.bank import DetectorBank, FindingProcessor, report_problems_to, run_processors
from foreshock.detectors.incident_external import ExternalEvent
from foreshock.exporters.store import FindingStore
from foreshock.fields import ENTITY_KINDS, field_names
from foreshock.findings import Finding, Incident
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.remap import Remap
from foreshock.topology import Topology, TopologyError

from .embedded import EmbeddedPipeline
from .external_feed import ExternalTarget, external_targets
from .kafka_config import KafkaSettings
from .kafka_topics import CHECKPOINT_MAX_BYTES
from .kafka_codec import (H_AGENT, H_CONTINUES, BundleEntry, FindingsMessage, Headers, PartitionMap, PieceInfo,
                          PieceReport, RecordError, as_record_error, concat_rows, decode_bundle, encode_findings,
                          encode_telemetry, headers_dict, piece_headers, sender_started)

log = logging.getLogger("foreshock.worker")

CHECKPOINT_VERSION = 1

EARLIEST_SEND_STAMP = 1e9
"""A bundle's send stamp (``foreshock-sent``) before this (2001-09-09) is no time to count an ingest lag
from, but a clock never set or a tool's 0.0 (NaN fails the test too): the lag then counts from the
record's arrival. It had read 1.8e9 s."""


# ---- checkpoint encoding ------------------------------------------------------------------
def uniform_fills(state: Any) -> Any:
    """``state``'s shape with, for each array of one value throughout (NaN counts as one), that
    value, else None: a delta from such an array can be rebuilt at any other shape
    (:func:`apply_delta`). Computed once per initial state, not per checkpoint."""
    if isinstance(state, dict):
        return {k: uniform_fills(v) for k, v in state.items()}
    if isinstance(state, np.ndarray) and state.size:
        flat = state.reshape(-1)
        if (flat == flat[0]).all() or (flat.dtype.kind == "f" and np.isnan(flat).all()):
            return flat[0]
    return None


class _UnloggedHealth(PipelineHealth):
    """A throw-away pipeline's health (:meth:`DetectionStage.warm_up`): problems counted, none logged."""

    def problem(self, stage: str, reason: str, count: int = 1, detail: str = "") -> None:
        if count > 0:
            self._count(self.problems, (stage, reason), count)


class _Whole:
    """The mark (:data:`WHOLE`) of an array that :func:`state_delta` writes whole."""

    def __repr__(self) -> str:
        return "WHOLE"


# In a ``fills`` tree, in place of a fill: an array whose initial state depends on the job list,
# written whole rather than as a delta. The job list is not part of the hardware layout a
# checkpoint keeps (``hardware_layout``), so a loader rebuilds its delta base with other jobs
# (a worker restarted on changed hardware: none at all; on the same hardware: the jobs listed
# now), and a delta read against that base got the loader's jobs back, not the saver's.
WHOLE = _Whole()


def whole_where_jobs_differ(fills: Any, initial: Any, without_jobs: Any) -> Any:
    """``fills`` (:func:`uniform_fills` of ``initial``) with :data:`WHOLE` for each array of
    ``initial`` that ``without_jobs`` (the initial state of the same hardware with no jobs
    listed) does not equal, save the uniform arrays whose shape the jobs set: their fill
    rebuilds them at any shape (the guard's per-job arrays). The straggler detector's
    ``gpu_job_saved`` (each GPU's job slot at the save) was such an array: delta-written, it was
    read back as the loader's jobs, on changed hardware as no job for every GPU, and every GPU's
    busy means were thrown away as if it had moved to another job (until 2026-12-05)."""
    if isinstance(initial, dict):
        sub = fills if isinstance(fills, dict) else {}
        other = without_jobs if isinstance(without_jobs, dict) else {}
        return {k: whole_where_jobs_differ(sub.get(k), v, other.get(k)) for k, v in initial.items()}
    if not isinstance(initial, np.ndarray) or not isinstance(without_jobs, np.ndarray):
        return fills
    if initial.shape != without_jobs.shape:
        return fills if fills is not None else WHOLE
    same = np.array_equal(initial, without_jobs, equal_nan=initial.dtype.kind in "fc")
    return fills if same else WHOLE


def state_delta(initial: Any, current: Any, fills: Any = None) -> Any:
    """``current`` as a difference from ``initial``: a partition's bank holds full-size arrays,
    but only its own entities' rows ever change, so the delta is small. ``fills``
    (:func:`uniform_fills` of ``initial``) is written with the deltas of uniform arrays; an array
    whose fill is :data:`WHOLE` is written whole."""
    if fills is WHOLE and not isinstance(current, dict):
        return {"__value__": current}
    if isinstance(current, dict) and isinstance(initial, dict):
        sub = fills if isinstance(fills, dict) else {}
        return {"__dict__": {k: state_delta(initial.get(k), v, sub.get(k)) for k, v in current.items()}}
    if (isinstance(current, np.ndarray) and isinstance(initial, np.ndarray)
            and current.shape == initial.shape and current.dtype == initial.dtype and current.size):
        # flat indices in C order, whatever either array's layout (apply_delta writes them so)
        a, b = np.ascontiguousarray(current).reshape(-1), np.ascontiguousarray(initial).reshape(-1)
        same = a == b
        if a.dtype.kind in "fc":
            same |= np.isnan(a) & np.isnan(b)
        idx = np.flatnonzero(~same)
        if len(idx) * 2 < a.size:
            delta = {"__delta__": (idx.astype(np.int64), a[idx].copy()), "__shape__": current.shape}
            if fills is not None and not isinstance(fills, dict):
                delta["__fill__"] = fills
            return delta
    return {"__value__": current}


def saved_as_previous(initial: dict[str, Any], previous: dict[str, Any], saved_keys: Iterable[str]) -> bool:
    """Whether a state saved with ``saved_keys`` is of the previous layout (``previous``, a fresh
    detector's state as the version before its last layout change kept it) rather than of this one
    (``initial``): where the two layouts' keys differ (a layout marker such as ``state_layout`` added,
    an array added or dropped), a state without any key this layout added, and with every key it
    dropped, is the previous one's. A width alone is no sign: a column removed may leave an array as
    wide as an older version's of other columns."""
    added, dropped = set(initial) - set(previous), set(previous) - set(initial)
    if not added and not dropped:
        return False
    keys = set(saved_keys)
    return not (added & keys) and dropped <= keys


def apply_delta(initial: Any, delta: Any, previous: Any = None) -> Any:
    """``delta`` (:func:`state_delta`) applied to ``initial``, the fresh state it was taken from.
    ``previous``: the fresh state as the version before a detector's last layout change kept it
    (``DetectorBank.previous_layout_state``; None: no other): a detector's state saved in that layout
    (:func:`saved_as_previous`), and an array saved at the previous layout's shape, are read against
    it — such a checkpoint's delta is from that version's fresh state."""
    if "__dict__" in delta:
        base = initial if isinstance(initial, dict) else {}
        before = previous if isinstance(previous, dict) else {}
        if before and saved_as_previous(base, before, delta["__dict__"]):
            base, before = before, {}
        return {k: apply_delta(base.get(k), v, before.get(k)) for k, v in delta["__dict__"].items()}
    if "__delta__" in delta:
        idx, values = delta["__delta__"]
        shape = tuple(delta.get("__shape__", np.shape(initial)))
        # C order: reshape(-1) below must be a view to write through (of a Fortran-ordered or
        # sliced array it is a copy, and the delta was lost)
        out = np.array(initial, copy=True, order="C")
        if out.shape != shape:
            # Saved under another job list, so another number of jobs: the delta is from the
            # initial state at the saved shape, which a uniform initial array (the guard's per-job
            # arrays) records. The state's owner then finds each job again by name and nodes.
            if "__fill__" in delta:
                out = np.full(shape, delta["__fill__"], dtype=out.dtype)
            elif isinstance(previous, np.ndarray) and previous.shape == shape:
                # Saved by the version before a layout change that removed columns: the delta is
                # from that version's fresh state (``Detector.previous_layout_state``), which the
                # detector's ``upgrade_state`` reads on. Until 2026-12-06 such a checkpoint was
                # refused and every partition started fresh (hours of R baselines lost)
                out = np.array(previous, copy=True, order="C")
            elif out.ndim == 2 and len(shape) == 2 and shape[0] == out.shape[0] and shape[1] < out.shape[1]:
                # Saved by a version before columns were appended (``Detector.upgrade_state``,
                # ``add_columns``): the old initial state is the new one's first columns; the
                # detector widens what it reads. Until 2026-12-01 such a checkpoint was refused and
                # every partition started fresh at each upgrade that added a column (hours of R
                # baselines, τ, idle histories lost), whatever ``upgrade_state`` could read.
                out = np.ascontiguousarray(out[:, :shape[1]])
            else:
                raise ValueError(f"a checkpoint array of shape {shape} cannot be rebuilt at {out.shape}")
        out.reshape(-1)[idx] = values
        return out
    return delta["__value__"]


# zstd (Arrow's) over the pickled state: as small as zlib level 1 at a third of its CPU time,
# which matters because every owned partition is checkpointed every few seconds.
_ZSTD_MAGIC = b"FSZ1"


def _zstd(raw: bytes) -> bytes:
    """``raw`` zstd-compressed, after its size (Arrow's decompression needs it)."""
    return struct.pack(">Q", len(raw)) + pa.compress(raw, codec="zstd", asbytes=True)


def _unzstd(data: bytes) -> bytes:
    (size,) = struct.unpack(">Q", data[:8])
    return pa.decompress(data[8:], decompressed_size=size, codec="zstd", asbytes=True)  # type: ignore[no-any-return]


_LAYOUTS: dict[str, bytes] = {}


def hardware_layout(topology: Topology) -> bytes:
    """The topology's hardware (``Topology.hardware_dict``) as zstd-compressed JSON: written with
    every detection checkpoint, so that a worker restarted on changed hardware can move the state
    onto its entities (``core/remap.py``). Made once per topology: every owned partition is
    checkpointed every few seconds."""
    fingerprint = topology.fingerprint()
    if fingerprint not in _LAYOUTS:
        raw = json.dumps(topology.hardware_dict(), separators=(",", ":"), default=str).encode()
        _LAYOUTS[fingerprint] = _zstd(raw)
    return _LAYOUTS[fingerprint]


@dataclass
class SavedCheckpoint:
    offset: int
    state: Any
    hardware: str | None  # the fingerprint of the hardware it was written for (None: before they were written)
    layout: bytes | None  # that hardware itself (``hardware_layout``; None: not written with it)
    previous: int = -1  # the offset of the checkpoint before it (-1: none, or written before they said)
    topic_id: str | None = None  # the ID of the source topic it covers (None: not known, or written before)

    def written_for(self, topology: Topology) -> Topology | None:
        """None when written for ``topology``'s hardware (or before checkpoints named theirs);
        otherwise the topology it was written for, to move its state from. A ValueError when it
        cannot be rebuilt: the state is by slot, and a topology with the same counts in another
        order would load without an error into the wrong entities."""
        if self.hardware is None or self.hardware == topology.fingerprint():
            return None
        if self.layout is None:
            raise ValueError(f"checkpoint written for another topology (hardware {self.hardware}, this worker's "
                             f"{topology.fingerprint()}) without its layout: this partition starts fresh")
        return Topology.from_dict(json.loads(_unzstd(self.layout)), source=f"checkpoint's topology {self.hardware}")


def encode_checkpoint(offset: int, state: Any, kind: str, signature: str,
                      topology: Topology | None = None, layout: bool = False, previous: int = -1,
                      topic_id: str | None = None) -> bytes:
    """``topology``: the hardware to name with the state, which is kept by slot; ``layout``: write
    that hardware itself too (``hardware_layout``), so the state can follow its entities onto
    changed hardware. ``previous``: the offset of the checkpoint before this one (the records
    redelivered after it lie above that: :class:`CheckpointCover`). ``topic_id``: the ID of the
    source topic whose offsets it counts (:func:`recreated_topic`; None: not known)."""
    # an optional key, so the version stays: a worker of before reads these checkpoints, and
    # this one reads theirs (no ID: ``recreated_topic`` cannot tell, the offset checks remain)
    blob = {"version": CHECKPOINT_VERSION, "kind": kind, "signature": signature, "offset": offset, "state": state,
            "previous": previous, "topic_id": topic_id,
            "hardware": topology.fingerprint() if topology is not None else None,
            "layout": hardware_layout(topology) if topology is not None and layout else None}
    return _ZSTD_MAGIC + _zstd(pickle.dumps(blob, protocol=5))


def decode_checkpoint(data: bytes, kind: str, signature: str) -> SavedCheckpoint:
    """Checkpoints come only from this pipeline's own internal topic (pickle is trusted here).
    Those of the first version (zlib) still load. Which hardware it was written for is the
    caller's to check (``SavedCheckpoint.written_for``); a changed job list is not refused: the
    guard and the incident engine find each job again by name and nodes."""
    raw = _unzstd(data[4:]) if data[:4] == _ZSTD_MAGIC else zlib.decompress(data)
    blob = pickle.loads(raw)
    if blob.get("version") != CHECKPOINT_VERSION or blob.get("kind") != kind:
        raise ValueError(f"checkpoint version/kind {blob.get('version')}/{blob.get('kind')} not {CHECKPOINT_VERSION}/{kind}")
    if blob.get("signature") != signature:
        raise ValueError(f"checkpoint written by a different bank ({blob.get('signature')!r}, this is {signature!r})")
    saved_id = blob.get("topic_id")
    return SavedCheckpoint(int(blob["offset"]), blob["state"], blob.get("hardware"), blob.get("layout"),
                           int(blob.get("previous", -1)), str(saved_id) if saved_id else None)


def ahead_of_topic(offset: int, end_offset: int | None) -> bool:
    """Whether a checkpoint covering source records up to ``offset`` is ahead of its partition,
    whose next record will be at ``end_offset`` (its high-water mark; None: not known): the topic
    was deleted and re-created since (a purge; the compacted checkpoints topic keeps the old
    offset). Its records start again from 0, and until 2026-12-02 every one up to the old offset
    was skipped as already processed, silently."""
    return end_offset is not None and offset >= 0 and offset >= end_offset


def recreated_topic(saved_id: str | None, topic_id: str | None) -> bool:
    """Whether a checkpoint written for the topic of ID ``saved_id`` is of a topic since deleted
    and re-created, the one of ID ``topic_id`` now (Kafka gives a re-created topic a new ID). Its
    offsets count another topic's records: the new topic's first ones, up to the old offset, would
    be skipped as already processed. ``ahead_of_topic`` notices only a re-created topic that has
    not yet grown past the old offset; until 2026-12-02 one that had (the checkpoints topic is
    compacted: its last checkpoints stay) lost those records silently. False when either ID is
    not known (a checkpoint written before they were, a broker before Kafka 2.8, a failed
    lookup): the offset checks are all there is then."""
    return saved_id is not None and topic_id is not None and saved_id != topic_id


@dataclass
class CheckpointCover:
    """What a partition's checkpoints cover, to tell the records redelivered after the loaded one
    (skipped: already processed) from those of a re-created topic. Without the partition's end
    offset (:func:`ahead_of_topic`) only a guess: a record is redelivered from the last offset
    committed, which the checkpoint before the loaded one passed (the commit follows each
    checkpoint); a record skipped at or below that one's offset (``floor``) is counted, once per
    record, as ``skipped_below_checkpoint``."""

    checkpointed: int = -1  # the offset of the last checkpoint written (or loaded)
    before: int = -1  # the offset of the last checkpoint written below ``checkpointed``
    floor: int = -1  # skips at or below it are counted (-1: none are, as when the end offset was checked)

    @classmethod
    def loaded(cls, saved: SavedCheckpoint, end_offset: int | None, same_topic: bool = False) -> CheckpointCover:
        """``same_topic``: the checkpoint's topic ID is the topic's now (not re-created: no guess)."""
        guess = end_offset is None and not same_topic
        return cls(saved.offset, saved.previous, saved.previous if guess else -1)

    def skipped(self, offset: int, health: PipelineHealth, stage: str, where: str) -> None:
        """Note the record at ``offset`` skipped as covered by the loaded checkpoint."""
        if offset <= self.floor:
            health.problem(stage, "skipped_below_checkpoint", detail=(
                f"{where}: record {offset} skipped as covered by the checkpoint at {self.checkpointed}, though at or "
                f"below the one before it ({self.floor}): the topic was probably deleted and re-created"))

    def previous_for(self, offset: int) -> int:
        """The offset of the checkpoint before one written now at ``offset`` (one written again at
        the same offset keeps the earlier one's)."""
        return self.checkpointed if offset > self.checkpointed else self.before

    def written(self, offset: int) -> None:
        if offset > self.checkpointed:
            self.before, self.checkpointed = self.checkpointed, offset


class _OtherTopic(ValueError):
    """A checkpoint of a topic since deleted and re-created: ``reason`` is the problem to count
    (``checkpoint_topic_recreated``: its topic ID changed, :func:`recreated_topic`;
    ``checkpoint_ahead_of_topic``: its offset not reached, :func:`ahead_of_topic`)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def check_source_topic(saved: SavedCheckpoint, end_offset: int | None, topic_id: str | None, where: str,
                       topic: str) -> None:
    """Raise :class:`_OtherTopic` when ``saved`` (loaded for ``where``, reading ``topic``) is of a
    topic since deleted and re-created: by its topic ID where both are known, else by its offset."""
    if recreated_topic(saved.topic_id, topic_id):
        raise _OtherTopic("checkpoint_topic_recreated", (
            f"{where}: checkpoint at offset {saved.offset} written for {topic} of topic ID {saved.topic_id}, the "
            f"topic's ID now {topic_id}: the topic was deleted and re-created; starting fresh"))
    if ahead_of_topic(saved.offset, end_offset):
        why = ("the topic's ID is unchanged: its log was cut short (an unclean leader election?)"
               if saved.topic_id is not None and saved.topic_id == topic_id
               else "the topic was deleted and re-created")
        raise _OtherTopic("checkpoint_ahead_of_topic", (
            f"{where}: checkpoint at offset {saved.offset}, {topic}'s end at {end_offset}: {why}; starting fresh"))


ZERO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"  # what a broker before topic IDs answers


class TopicIds:
    """Reads topics' IDs (KIP-516, Kafka 2.8 on) for the stages' checkpoints (:func:`recreated_topic`):
    kafka-python's admin client, as aiokafka's metadata requests (v5 at most) carry no topic IDs.
    One client, made at the first read and kept (a read that fails drops it: the next makes a new
    one). Blocking: a faust worker calls :meth:`read` in a thread (``asyncio.to_thread``)."""

    def __init__(self, settings: KafkaSettings, timeout_s: float = 10.0) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self._admin: Any = None
        self._lock = threading.Lock()

    def read(self, topic: str) -> str | None:
        """``topic``'s ID; None when not known (no such topic, a broker before topic IDs, or no answer
        within about ``timeout_s``: logged, the stages then check the offsets alone)."""
        try:
            with self._lock:
                if self._admin is None:
                    self._admin = self._connect()
                (described,) = self._admin.describe_topics([topic])
        except Exception as exc:  # only a check: the partition is taken up without it
            log.warning("the ID of topic %s not read (%s: %s): a checkpoint of a re-created topic is only told by "
                        "its offsets", topic, type(exc).__name__, exc)
            self.close()
            return None
        topic_id = described.get("topic_id")
        if described.get("error_code") or topic_id is None or str(topic_id) == ZERO_TOPIC_ID:
            return None
        return str(topic_id)

    def _connect(self) -> Any:
        from kafka import KafkaAdminClient  # only the faust workers read topic IDs

        timeout_ms = int(self.timeout_s * 1000)
        limits = {"request_timeout_ms": timeout_ms}
        if "bootstrap_timeout_ms" in KafkaAdminClient.DEFAULT_CONFIG:  # kafka-python 3 (else 30 s, unbounded)
            limits["bootstrap_timeout_ms"] = timeout_ms
        client_id = f"{self.settings.client_id}-topic-ids"
        return KafkaAdminClient(**self.settings.with_client_id(client_id).kafka_python(), **limits)

    def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            try:
                admin.close()
            except Exception as exc:  # a client that failed: nothing of ours to hand over
                log.debug("closing the topic-ID client: %s: %s", type(exc).__name__, exc)


def bank_signature(bank: DetectorBank) -> str:
    return ",".join([d.name for d in bank.detectors] + [p.name for p in bank.processors])


# ---- detection ----------------------------------------------------------------------------
@dataclass
class DeadLetter:
    """A record (or one piece of it) for the dead-letter topic. ``value``/``headers`` None: the
    original record; otherwise the piece's own single-piece message."""

    reason: str
    detail: str
    value: bytes | None = None
    headers: Headers | None = None


@dataclass
class BundleResult:
    """What processing one frames-topic record produced: one findings message (a report per
    piece, dead-lettered pieces included, empty) and the dead letters."""

    skipped: bool = False
    findings_message: bytes | None = None
    findings: list[Finding] = field(default_factory=list)
    rows: int = 0
    pieces: int = 0
    dead_letters: list[DeadLetter] = field(default_factory=list)
    # for the incident stage, before the findings: one message, or several past the findings
    # topic's message size (``encode_telemetry``)
    telemetry_messages: list[tuple[bytes, Headers]] = field(default_factory=list)


def processor_frame_fields(processors: Sequence[FindingProcessor]) -> dict[str, tuple[str, ...]] | None:
    """Which fields of which kinds the processors read in ``observe_frame`` (their optional
    telemetry): what the detection stage forwards to the incident stage. A processor declares
    it as ``frame_fields = {"gpu": ("gpu_temp", ...), ...}``; one that reads frames without
    declaring gets every field of every kind (exact, but the whole telemetry volume then
    travels to the one incident worker). None: no processor reads frames."""
    wanted: dict[str, set[str]] = {}
    for proc in processors:
        if not callable(getattr(proc, "observe_frame", None)):
            continue
        declared = getattr(proc, "frame_fields", None)
        if declared is None:
            log.warning("processor %s reads frames (observe_frame) without declaring frame_fields: the "
                        "workers forward all telemetry to the incident stage", getattr(proc, "name", proc))
            declared = {kind: field_names(kind) for kind in ENTITY_KINDS}
        for kind, names in declared.items():
            wanted.setdefault(kind, set()).update(names)
    if not wanted:
        return None
    return {kind: tuple(n for n in field_names(kind) if n in names) for kind, names in wanted.items()}


class _Partition:
    def __init__(self, pipeline: EmbeddedPipeline, offset: int, cover: CheckpointCover,
                 topic_id: str | None = None) -> None:
        self.pipeline = pipeline
        self.offset = offset  # last processed (or checkpointed) offset
        self.cover = cover
        self.topic_id = topic_id  # the frames topic's ID, written with its checkpoints (None: not known)
        # per sender, the pieces of a frame whose share of this partition continues in its next
        # bundle (``H_CONTINUES``): not run yet, so written with the checkpoints
        self.held: dict[str, list[tuple[PieceInfo, Frame]]] = {}
        # per sender held, when (the stage's clock) its last piece came or its checkpoint was
        # loaded: past ``held_wait_s`` the rest is given up on (``DetectionStage._expire_held``)
        self.held_since: dict[str, float] = {}
        # held pieces a checkpoint of other hardware brought (counted in ``load``): dead-lettered
        # with the partition's next record, the first place a dead letter has a record to name
        self.dead_letters: list[DeadLetter] = []


class DetectionStage:
    """Per-partition pipelines of one worker."""

    def __init__(self, topology: Topology, make_bank: Callable[[Topology], DetectorBank], partitions: int,
                 store: FindingStore | None = None, health: PipelineHealth | None = None,
                 worker_id: str = "", max_ahead_s: float | None = None, clock: Callable[[], float] = time.time,
                 held_wait_s: float | None = None) -> None:
        """``make_bank``: the detector bank for a topology (this one's; a checkpoint written for
        other hardware needs a bank of that hardware to be read). ``max_ahead_s``: rows stamped
        further ahead of this host's clock are refused (``InputGuard``; None: no limit); with a
        limit, the store measures staleness and ETAs on the wall clock (live). ``held_wait_s``
        (None: ``FRAME_WAIT_S``, wall time by ``clock``): how long pieces held for the rest of
        their frame's share wait for it (``_expire_held``)."""
        self.max_ahead_s = max_ahead_s
        self.clock = clock
        self.held_wait_s = FRAME_WAIT_S if held_wait_s is None else held_wait_s
        self.topology = topology
        self.worker_id = worker_id
        self.health = health or PipelineHealth()
        self.store = store or FindingStore(topology, self.health)
        if max_ahead_s is not None and math.isfinite(max_ahead_s):
            # rows held to this host's clock are a live stream, from agents whose clocks differ:
            # /metrics ages by arrival (``FindingStore.use_wall_clock``). Without a limit (a
            # simulation published faster than real time) telemetry time stays the clock
            self.store.use_wall_clock()
        self.pmap = PartitionMap(topology, partitions)
        self._make_bank = make_bank
        self.parts: dict[int, _Partition] = {}
        full = make_bank(topology)
        self._warn_split_jobs(full)
        self.frame_fields = processor_frame_fields(full.processors)
        fresh = self._new_pipeline()
        self.signature = bank_signature(fresh.bank)
        self._initial = self._state(fresh)
        # ... and as the version before each detector's last layout change kept it: what the deltas
        # of that version's checkpoints are from (``apply_delta``)
        self._previous = self._previous_layout(fresh, self._initial)
        # the same hardware with no jobs: what a checkpoint's layout rebuilds (``_load_moved``)
        try:
            without_jobs = self._state(self._new_pipeline(Topology.from_dict(topology.hardware_dict())))
        except TopologyError as exc:  # no checkpoint of this stage could move hardware either
            log.warning("the topology's hardware does not rebuild without its jobs (%s): checkpoints "
                        "write every array as a delta", exc)
            without_jobs = self._initial
        self._fills = whole_where_jobs_differ(uniform_fills(self._initial), self._initial, without_jobs)

    def _warn_split_jobs(self, bank: DetectorBank) -> None:
        """Say once where a job's GPUs are routed to several partitions while a detector compares a
        job's GPUs with each other (the straggler detector): each partition's pipeline compares its
        share only, so a node alone with its share of a job in a partition is compared with itself
        (a whole node running 15 % slow went unflagged, where the embedded pipeline flags it). Not
        mended: the routing keeps a rack's entities together for the thermal and cooling
        detectors, and a training job spans racks."""
        if not any(getattr(d, "name", "") == "straggler" for d in bank.detectors):
            return
        split = self.pmap.split_jobs()
        if split:
            job, spread = max(split, key=lambda js: js[1])
            log.warning("%d of %d jobs span several of the %d partitions (%s over %d): the straggler detector "
                        "compares each job's GPUs within one partition's share of it, not across the job",
                        len(split), len(self.topology.jobs), self.pmap.partitions, self.topology.jobs[job], spread)

    def _new_pipeline(self, topology: Topology | None = None) -> EmbeddedPipeline:
        topology = topology or self.topology
        full = self._make_bank(topology)
        bank = DetectorBank(topology, full.detectors, processors=())  # incidents run in IncidentStage
        # a GPU started afresh (its board swapped) takes its rows from the fresh state kept for the
        # checkpoints, not from a copy per partition (``_initial``: made from the first pipeline).
        # A pipeline of other hardware only reads a checkpoint (``_load_moved``): a copy of its own
        fresh = (lambda: self._initial["bank"]["detectors"]) if topology is self.topology else None
        return EmbeddedPipeline(topology, bank, self.store, (), self.health, max_ahead_s=self.max_ahead_s,
                                fresh_state=fresh)

    @staticmethod
    def _state(pipeline: EmbeddedPipeline) -> dict[str, Any]:
        return {"guard": pipeline.guard.state_dict(), "bank": pipeline.bank.state_dict()}

    @staticmethod
    def _previous_layout(pipeline: EmbeddedPipeline, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (:meth:`_state` of ``pipeline``) with each detector's as the version before its last
        layout change kept it (``DetectorBank.previous_layout_state``): the base of that version's deltas."""
        return {**state, "bank": pipeline.bank.previous_layout_state(state["bank"])}

    def warm_up(self) -> None:
        """Run every detector on a throw-away pipeline (own store and health), so Numba loads or
        compiles its kernels now rather than on the first records after an assignment.

        Frames of one row and of two entities (where the topology has two): with one row, the
        2-D arrays detectors build from columns are both C- and F-contiguous and Numba types
        them as C; frames of several rows give F, which a one-row warm-up left to be loaded —
        or, after any source change, compiled, seconds of CPU — mid-stream (five kernels of the
        thermal, power and straggler detectors when this was measured). Its health counts the problems
        its made-up frames make, and logs none: they are no one's input (until 2026-12-06 every worker
        start warned of energy counters going back and counter glitches, "counted in
        foreshock_input_problems_total", which the worker's metrics did not count)."""
        health = _UnloggedHealth()
        bank = DetectorBank(self.topology, self._make_bank(self.topology).detectors, processors=())
        pipeline = EmbeddedPipeline(self.topology, bank, FindingStore(self.topology, health), (), health)
        try:
            for kind in ENTITY_KINDS:
                size = self.topology.size(kind)
                steps = [(rows, value) for rows in sorted({1, min(2, size)}) for value in (0.0, 1.0)] if size else []
                for i, (rows, value) in enumerate(steps):
                    # (no board read: 0 then 1 read as a swapped board, logged at every start)
                    columns = {name: np.full(rows, np.nan if name == "board_id" else value) for name in field_names(kind)}
                    slots = np.arange(rows, dtype=np.int32)
                    pipeline.process(Frame(kind, np.full(rows, float(i + 1)), slots, columns))
        except Exception as exc:  # only a head start: the real records will compile what is missing
            log.warning("warm-up stopped early: %s: %s", type(exc).__name__, exc)

    # partition ownership
    def owns(self, partition: int) -> bool:
        return partition in self.parts

    def load(self, partition: int, checkpoint: bytes | None, end_offset: int | None = None,
             topic_id: str | None = None) -> int:
        """Take a partition, from its checkpoint (or fresh); returns the offset covered (-1 none).
        A checkpoint of a topic since deleted and re-created is counted and the partition starts
        fresh (:func:`check_source_topic`), told by ``topic_id``, the frames topic's ID now (written
        with the partition's checkpoints from here on: :class:`TopicIds`), or else by ``end_offset``,
        the partition's end (high-water) offset (``ahead_of_topic``). None: not known; with
        neither, ``CheckpointCover`` guesses."""
        pipeline = self._new_pipeline()
        offset = -1
        cover = CheckpointCover()
        written_for = topic_id
        held: dict[str, list[tuple[PieceInfo, Frame]]] = {}
        dropped: dict[str, list[tuple[PieceInfo, Frame]]] = {}
        if checkpoint is not None:
            try:
                saved = decode_checkpoint(checkpoint, "detect", self.signature)
                check_source_topic(saved, end_offset, topic_id, f"partition {partition}", "the frames topic")
                old = saved.written_for(self.topology)
                if old is None:
                    state = apply_delta(self._initial, saved.state, self._previous)
                    pipeline.guard.load_state_dict(state["guard"])
                    pipeline.bank.load_state_dict(state["bank"])
                    # (absent from checkpoints written before pieces were held)
                    held = {str(agent): list(group) for agent, group in state.get("held", {}).items()}
                else:  # pieces held are numbered by the old hardware: counted and dead-lettered
                    # (until 2026-12-05 dropped uncounted)
                    dropped = self._load_moved(partition, pipeline, old, saved.state)
                offset = saved.offset
                cover = CheckpointCover.loaded(saved, end_offset, same_topic=topic_id is not None
                                               and saved.topic_id == topic_id)
                # the ID not read now: the checkpoint's goes on (the topic is taken to be the same,
                # as it is loaded), so a later start that reads the ID can still compare
                written_for = topic_id if topic_id is not None else saved.topic_id
            except _OtherTopic as exc:
                self.health.problem("worker", exc.reason, detail=str(exc))
                pipeline, held, dropped = self._new_pipeline(), {}, {}
            except Exception as exc:  # a checkpoint we cannot use must not stop the worker
                self.health.problem("worker", "checkpoint_unusable", detail=f"partition {partition}: {exc}")
                pipeline, offset, held, dropped = self._new_pipeline(), -1, {}, {}
        self.parts[partition] = _Partition(pipeline, offset, cover, written_for)
        self.parts[partition].held = held
        # each held group waits afresh from the load, not from its stamp (not kept in checkpoints):
        # the records after the checkpoint hold its continuation, read in order from now; dated by
        # its arrival, a worker down longer than the wait gave up on it before reading them
        self.parts[partition].held_since = dict.fromkeys(held, self.clock())
        self.parts[partition].dead_letters = self._dropped_held(partition, dropped)
        log.info("partition %d: resumed after offset %d", partition, offset)
        return offset

    def _load_moved(self, partition: int, pipeline: EmbeddedPipeline, old: Topology,
                    delta: Any) -> dict[str, list[tuple[PieceInfo, Frame]]]:
        """Load a checkpoint written for other hardware (a rack added, a node retired, the file
        reordered): its delta is read against a fresh pipeline of that hardware, and each entity
        this partition owns now keeps its state where its name is still listed (``core/remap.py``).
        Entities new to the file, or new to this partition, start fresh. Returns the pieces it held
        (numbered by the old hardware: not run, ``_dropped_held``)."""
        saved_pipeline = self._new_pipeline(old)
        initial = self._state(saved_pipeline)
        state = apply_delta(initial, delta, self._previous_layout(saved_pipeline, initial))
        held = {str(agent): list(group) for agent, group in state.get("held", {}).items()}
        remap = Remap(old, self.topology, keep=self.pmap.owned_by(partition))
        pipeline.guard.load_state_dict(state["guard"], remap)
        pipeline.bank.load_state_dict(pipeline.bank.remap_state(state["bank"], remap))
        kept = {kind: remap.kept(kind) for kind in ("gpu", "link", "node", "rack")}
        log.info("partition %d: checkpoint of hardware %s moved onto %s: state kept for %s", partition,
                 old.fingerprint(), self.topology.fingerprint(), ", ".join(f"{n} {k}s" for k, n in kept.items()))
        return held

    def _dropped_held(self, partition: int, dropped: dict[str, list[tuple[PieceInfo, Frame]]]) -> list[DeadLetter]:
        """Pieces a checkpoint of other hardware held for their frame's rest: their slots are the
        old file's, so they are not run; each piece is counted (``held_dropped``) and dead-lettered
        as its own single-piece message. The incident stage runs their frame without them, or
        drops it with the checkpoint's other waiting frames (``IncidentStage.load``)."""
        out = []
        for agent, group in dropped.items():
            for info, frame in group:
                detail = (f"partition {partition}: {agent} frame {info.seq} part {info.part}: {len(frame)} "
                          f"{frame.kind} rows held for the rest of the frame's share, in a checkpoint of other "
                          "hardware: not run")
                self.health.problem("worker", "held_dropped", detail=detail)
                out.append(DeadLetter("held_dropped", detail, frame.to_ipc(),
                                      piece_headers(frame.kind, info.agent, info.seq, info.part, info.parts,
                                                    info.sent)))
        return out

    def drop(self, partition: int) -> None:
        """Give a partition up: its pipeline goes, and the shared store forgets its entities (their
        next owner exports them now)."""
        if self.parts.pop(partition, None) is not None:
            self.store.forget(self.pmap.owned_by(partition))

    def offset(self, partition: int) -> int:
        return self.parts[partition].offset

    def process(self, partition: int, offset: int, value: bytes | None, headers: Any) -> BundleResult:
        """Run one frames-topic record's pieces through the partition's pipeline, in order."""
        part = self.parts[partition]
        if offset <= part.offset:
            part.cover.skipped(offset, self.health, "worker", f"partition {partition}")
            return BundleResult(skipped=True)  # covered by the checkpoint: already processed
        if offset > part.offset + 1 and part.offset >= 0:
            self.health.problem("worker", "offset_gap",
                                detail=f"partition {partition}: offset {offset} after {part.offset}")
        part.offset = offset
        header_map = headers_dict(headers)
        # other senders' pieces held past the wait run with this record (its own sender's may be
        # continued by it); their reports and rows after this record's
        sender = header_map.get(H_AGENT, b"").decode(errors="replace")
        late_reports: list[PieceReport] = []
        try:
            pieces = decode_bundle(value, header_map, self.topology, self.pmap, partition, split_unknown=True)
        except Exception as exc:  # no piece identity: nothing to report, only the dead letter
            # anything decoding raises, not only RecordError (as_record_error); the detectors'
            # exceptions below still end the worker
            error = as_record_error(exc)
            self.health.problem("worker", error.reason, detail=error.detail)
            result = BundleResult(dead_letters=part.dead_letters + [DeadLetter(error.reason, str(error))])
            part.dead_letters = []
            self._expire_held(partition, sender, late_reports, result)
            result.findings_message = self._findings(late_reports, partition, offset)
            return result
        result = BundleResult(pieces=len(pieces), dead_letters=part.dead_letters)
        part.dead_letters = []
        self._expire_held(partition, sender, late_reports, result)
        reports: list[PieceReport] = []
        telemetry: list[BundleEntry] = []
        whole_record_failed = False
        agent = pieces[0].info.agent
        # consecutive pieces of one frame (a partition's share chunked at MAX_PIECE_BYTES) run as
        # one frame, as in the embedded pipeline: peer-comparing detectors (a job's median, the
        # GPUs a rack holds) saw each chunk alone, and their findings differed. A share the agent
        # split across bundles (H_CONTINUES) starts with the pieces held from its previous one.
        group: list[tuple[PieceInfo, Frame]] = part.held.pop(agent, [])
        part.held_since.pop(agent, None)
        for piece in pieces:
            if piece.error is not None or piece.frame is None:
                # an empty report keeps the frame's sequence complete for the incident stage
                reports.append(PieceReport(piece.info, None, 0, ()))
                error = piece.error or RecordError("undecodable", "no frame")
                if piece.frame is None:  # the record's data is unreadable: count and dead-letter it once
                    if not whole_record_failed:
                        self.health.problem("worker", error.reason, detail=error.detail)
                        result.dead_letters.append(DeadLetter(error.reason, str(error)))
                        whole_record_failed = True
                    continue
                self.health.problem("worker", error.reason, detail=error.detail)
                if len(pieces) == 1:
                    result.dead_letters.append(DeadLetter(error.reason, str(error)))
                else:  # one bad piece of a good bundle: dead-letter its own rows
                    info = piece.info
                    result.dead_letters.append(DeadLetter(
                        error.reason, str(error), piece.frame.to_ipc(),
                        piece_headers(piece.kind, info.agent, info.seq, info.part, info.parts, info.sent)))
                continue
            if piece.unknown is not None:
                # rows of entities outside the topology: only they are counted (one per row, as the
                # embedded guard counts) and dead-lettered; the piece's other rows go on. Until
                # 2026-12-05 the whole piece was dead-lettered, a rack's good rows with the one bad row
                info, rows = piece.info, piece.unknown
                detail = (f"partition {partition}: {agent} frame {info.seq} part {info.part}: {len(rows)} {rows.kind} "
                          f"rows with slots outside the topology (0..{self.topology.size(rows.kind) - 1}); "
                          "the piece's other rows processed")
                self.health.problem("worker", "unknown_entity", len(rows), detail=detail)
                result.dead_letters.append(DeadLetter(
                    "unknown_entity", detail, rows.to_ipc(),
                    piece_headers(rows.kind, info.agent, info.seq, info.part, info.parts, info.sent)))
            if piece.ignored_fields:
                # a newer agent's fields: its rows are read without them (counted per piece; the
                # log line, once, says to upgrade the workers)
                self.health.problem("worker", "unknown_fields", detail=(
                    f"{piece.kind} fields {', '.join(piece.ignored_fields)} from agent {piece.info.agent} are not "
                    "known to this worker (an agent newer than its workers): ignored; upgrade the workers"))
            if group and (group[0][0].seq != piece.info.seq or group[0][1].kind != piece.kind):
                self._run_group(part, group, reports, telemetry, result)
                group = []
            group.append((piece.info, piece.frame))
        if group:
            if header_map.get(H_CONTINUES) == b"1" and group[-1][0] is pieces[-1].info:
                # the rest of this frame's share comes in the sender's next bundle: run it whole then
                # (held in the partition's checkpoint, so a restart from it still has these pieces),
                # or after ``held_wait_s`` without it (``_expire_held``)
                part.held[agent] = group
                part.held_since[agent] = self.clock()
            else:
                self._run_group(part, group, reports, telemetry, result)
        # pieces all held for the next record: their reports go with the frame's last piece
        if telemetry:
            self._forward(partition, agent, pieces[0].info.sent, telemetry, result)
        result.findings_message = self._findings(reports + late_reports, partition, offset)
        return result

    def _forward(self, partition: int, agent: str, sent: float, telemetry: list[BundleEntry],
                 result: BundleResult) -> None:
        """Add ``agent``'s forwarded rows to ``result``'s telemetry messages (one sender's each:
        the incident stage reads the sender from a message's headers)."""
        messages, left_out = encode_telemetry(agent, sent, telemetry, self.frame_fields)
        result.telemetry_messages.extend(messages)
        for seq, index, _, rows in left_out:
            # only a crafted record (an agent's pieces are MAX_PIECE_BYTES): its frame runs
            # without these rows, as one whose piece was dead-lettered
            self.health.problem("worker", "telemetry_too_large", detail=(
                f"partition {partition}: {agent} frame {seq} part {index}: its {len(rows)} {rows.kind} rows "
                "would pass the findings topic's message size: not forwarded to the incident stage"))

    def _findings(self, reports: list[PieceReport], partition: int, offset: int) -> bytes | None:
        return encode_findings(reports, partition, offset, self.worker_id) if reports else None

    def release_held(self, partition: int) -> BundleResult:
        """Run the partition's pieces held past ``held_wait_s`` for the rest of their frame's share
        (``_expire_held``), between records: a partition no sender writes to any more (its agents
        killed) has no next record to run them with. Its findings message and forwarded rows go to
        the findings topic as a record's; empty (no message) when nothing waited that long."""
        part = self.parts.get(partition)
        result = BundleResult()
        if part is None or not part.held:
            return result
        reports: list[PieceReport] = []
        self._expire_held(partition, None, reports, result)
        result.findings_message = self._findings(reports, partition, part.offset)
        return result

    def _expire_held(self, partition: int, keep: str | None, reports: list[PieceReport],
                     result: BundleResult) -> None:
        """Run each group of pieces held (``H_CONTINUES``) longer than ``held_wait_s`` for the rest
        of its frame's share, but ``keep``'s (the sender of the record at hand: it may bring the
        rest), as it is: its sender was killed before it sent the rest, or its broker went away at
        its stop, or it restarted (a new sender). Until 2026-12-05 such pieces were held for good:
        their rows never reached the detectors, nothing counted them, and every checkpoint pickled
        them again. Counted ``held_abandoned``; each piece keeps its report, so the incident stage
        sees the frame's pieces that came (and counts the frame as incomplete)."""
        part = self.parts[partition]
        now = self.clock()
        for agent in [a for a in part.held if a != keep and now - part.held_since.get(a, now) >= self.held_wait_s]:
            group = part.held.pop(agent)
            since = part.held_since.pop(agent)
            first = group[0][0]
            self.health.problem("worker", "held_abandoned", detail=(
                f"partition {partition}: {agent} frame {first.seq}: {len(group)} pieces held {now - since:.0f} s for "
                "the rest of the frame's share (foreshock-continues), which never came: run without it"))
            telemetry: list[BundleEntry] = []
            self._run_group(part, group, reports, telemetry, result)
            if telemetry:  # (a message of its own: the incident stage reads its sender from the headers)
                self._forward(partition, agent, first.sent, telemetry, result)

    def _run_group(self, part: _Partition, group: list[tuple[PieceInfo, Frame]], reports: list[PieceReport],
                   telemetry: list[BundleEntry], result: BundleResult) -> None:
        """Run the consecutive pieces of one frame (``group``) through the pipeline as one frame.
        Each piece keeps its own report (the incident stage counts a frame's pieces); the findings
        go with the first, the forwarded rows under the first piece's part."""
        frames = [frame for _, frame in group]
        frame = frames[0] if len(frames) == 1 else concat_rows(frames, list(frames[0].columns))
        findings: list[Finding] = []
        clean = frame
        if len(frame):
            # the ingest lag (foreshock_ingest_lag_seconds) counts from the agent's sending of the
            # frame's first piece: the time in the topic and in this worker's backlog with the
            # detection's. Until 2026-12-06 it counted from the record's arrival here, the detection's
            # time alone: a worker 24 s behind its input read 0.0012 s (stop 64's audit)
            sent = min(info.sent for info, _ in group)
            clean, findings = part.pipeline.process_rows(frame, sent if sent >= EARLIEST_SEND_STAMP else None)
        # the embedded bank's clock: the newest timestamp the guard let through
        now = float(clean.ts.max()) if len(clean) else None
        for i, (info, rows) in enumerate(group):
            reports.append(PieceReport(info, now, len(rows), findings if i == 0 else []))
            result.rows += len(rows)
        result.findings.extend(findings)
        first = group[0][0]
        if self.frame_fields is not None and len(clean) and clean.kind in self.frame_fields:
            telemetry.append((first.seq, first.part, first.parts, clean))

    def checkpoint(self, partition: int) -> tuple[int, bytes]:
        part = self.parts[partition]
        state = state_delta(self._initial, self._state(part.pipeline), self._fills)
        if part.held:  # a key of its own: a worker of before reads only "guard" and "bank"
            state["__dict__"]["held"] = {"__value__": part.held}
        blob = encode_checkpoint(part.offset, state, "detect", self.signature, self.topology, layout=True,
                                 previous=part.cover.previous_for(part.offset), topic_id=part.topic_id)
        return part.offset, blob

    def mark_checkpointed(self, partition: int, offset: int) -> None:
        if partition in self.parts:
            self.parts[partition].cover.written(offset)


# ---- incidents ----------------------------------------------------------------------------
RETIRE_SENDER_S = 6 * 3600.0
"""A sender silent this long (wall time) is forgotten by the incident stage, with any frame it left
incomplete. Far longer than any poll interval, and than clock differences between hosts."""

FRAME_WAIT_S = 180.0
"""How long (wall time) the incident stage waits for a frame's missing pieces once later frames of
its sender have arrived: then it runs the frame with the pieces it has and goes on. Longer than an
agent's delivery timeout (120 s: the longest its retries hold a piece) and a detect worker's
failover. A piece can be lost for good — the agent's send failed after the broker was away for
longer — and until 2026-12-01 every later frame of that sender then waited behind it forever."""

TELEMETRY_HELD_MAX_BYTES = CHECKPOINT_MAX_BYTES // 4
"""Bytes of forwarded rows (raw columns) the incident stage holds for frames waiting their turn;
past it, the oldest waiting frame is given up on before ``FRAME_WAIT_S`` (``_trim_telemetry``).
Behind a piece lost for good, every later frame waits with its rows, and each checkpoint pickles
them: 180 s of 16,384 GPUs' rows at 1 s made a 75 MiB checkpoint, refused by the checkpoints
topic (``CHECKPOINT_MAX_BYTES``), and the worker ended. A quarter of it leaves room for the
processors' state; zstd only makes it smaller."""

EXTERNAL_NEWS_S = 900.0
"""How long before a stage's first telemetry time an external event is still news to a stage
without a checkpoint, when no processor says (the incident engine's ``quiet_s``: evidence older
than that opens no incident, ``IncidentEngine._too_old``)."""

EXTERNAL_HELD_MAX = 100_000
"""External events a stage without a checkpoint holds until its first telemetry time dates them
(the incident engine's queue holds as many); past it, the oldest-dated go, counted."""


class IncidentStage:
    """Reassembles each source frame's findings from its pieces and runs the processors on them
    in (agent, seq) order, as the embedded bank does after each frame; drops redelivered pieces.

    Processors that read telemetry (``observe_frame``) get the pieces' guarded rows that the
    detection stage forwards (:meth:`observe_telemetry`, before the findings of the same
    pieces): each processor sees every piece of a frame, then the frame's findings."""

    def __init__(self, processors: Sequence[FindingProcessor], health: PipelineHealth | None = None,
                 topology: Topology | None = None, clock: Callable[[], float] = time.time,
                 frame_wait_s: float = FRAME_WAIT_S, telemetry_max_bytes: int = TELEMETRY_HELD_MAX_BYTES) -> None:
        self.processors = list(processors)
        self.frame_wait_s = frame_wait_s
        self.topology = topology  # checked against a checkpoint's hardware when given
        self.clock = clock
        # wall time each sender was last heard from: every agent start is a sender of its own
        # (sender_id), so senders silent for RETIRE_SENDER_S are forgotten (retire_senders)
        self.last_heard: dict[str, float] = {}
        # when this stage was made or loaded: a sender's silence (``_give_up``) counts from no
        # earlier, as the records after its checkpoint, read again, may bring the rest of a frame
        self.loaded_at = self.clock()
        self.health = health or PipelineHealth()
        report_problems_to(self.processors, self.health)  # findings for unknown entities, ... count here
        self.signature = ",".join(p.name for p in self.processors)
        self.released: dict[str, int] = {}  # agent -> last released seq
        self.pending: dict[tuple[str, int], dict[int, FindingsMessage]] = {}
        # a frame's waiting: when its first piece came (wall time); per sender, the frames waiting
        # (its index into ``pending``), its highest seq seen, since when its next frame has been
        # missing while later ones came, and the runs of frames given up on (lo, hi, wall time),
        # to count a piece that comes after all
        self.arrived: dict[tuple[str, int], float] = {}
        self.waiting: dict[str, set[int]] = {}
        self.newest: dict[str, int] = {}
        self.missing_since: dict[str, float] = {}
        self.given_up: dict[str, list[tuple[int, int, float]]] = {}
        # a stage without a checkpoint (the first, or after checkpoint_unusable): a sender that
        # started before it is taken up where its messages are, not waited on from frame 1
        self.fresh_since: float | None = self.clock()
        # per sender taken up so (``_resume``): the seq it was taken up at and when; earlier
        # frames are not this stage's, and a piece of one is counted, not taken for a repeat
        self.taken_up: dict[str, tuple[int, float]] = {}
        self.telemetry: dict[tuple[str, int], dict[int, Frame]] = {}  # forwarded rows awaiting their frame
        # their bytes held at most (``_trim_telemetry``), so the checkpoint that pickles them stays
        # under the topic's message size; the latest size of each frame's rows, kept as they come
        self.telemetry_max_bytes = telemetry_max_bytes
        self._telemetry_bytes: dict[tuple[str, int], int] = {}
        self._trim_logged = False
        self._cover_before: tuple[int, int] | None = None
        self.offset = -1  # the last foreshock.findings offset taken (the worker sets it)
        self.cover = CheckpointCover()
        self.topic_id: str | None = None  # foreshock.findings' ID, written with the checkpoints (``load``)
        self.duplicates = 0
        # external.events: the processors that take them, and the last record offset taken. Taken
        # events wait in the processors' state (grouped once telemetry time reaches them), so the
        # checkpoint holds both: after a crash nothing queued is lost and nothing is taken twice.
        # none: the worker says so once (faust_app)
        self.external_targets: list[ExternalTarget] = external_targets(self.processors, required=False)
        self.external_offset = -1
        # A stage without a checkpoint reads external.events from its start (faust_app): every
        # event the topic still holds, days of them. Those dated before its first telemetry time,
        # less ``external_news_s``, are history, not news: skipped and counted (they had been
        # queued, each refused as too old or joined to a new incident on its node, and a backlog
        # past the engine's queue pushed the new events out). None: no telemetry time yet, the
        # events taken wait in ``external_held``; -inf: a stage loaded from a checkpoint
        # written before this was (it took every event).
        self.external_since: float | None = None
        self.external_held: list[ExternalEvent] = []
        self.external_news_s = max((float(getattr(t, "quiet_s", EXTERNAL_NEWS_S)) for t in self.external_targets),
                                   default=EXTERNAL_NEWS_S)

    def add_external(self, events: Iterable[ExternalEvent], offset: int) -> bool:
        """Queue the events of the external.events record at ``offset``; False (and nothing
        queued) for a record at or below the last one taken: redelivered after a checkpoint. A
        stage without a checkpoint holds them until its first telemetry time, then skips (counted,
        ``external_history``) those dated more than ``external_news_s`` before it."""
        if offset <= self.external_offset:
            return False
        self.external_offset = offset
        batch = list(events)
        if not batch or not self.external_targets:
            return True
        if self.external_since is None:  # not dated yet: held until the first telemetry time
            self.external_held.extend(batch)
            if len(self.external_held) > EXTERNAL_HELD_MAX:
                self.external_held.sort(key=lambda e: e.time)
                dropped = len(self.external_held) - EXTERNAL_HELD_MAX
                del self.external_held[:dropped]
                self._skipped_external(dropped, f"the oldest-dated past {EXTERNAL_HELD_MAX} held before any "
                                                "telemetry came")
            return True
        self._queue_external(batch)
        return True

    def _date_external(self, now: float) -> None:
        """The first telemetry time of a stage without a checkpoint: the events held (and those
        taken from now on) dated more than ``external_news_s`` before it are history."""
        self.external_since = now - self.external_news_s
        held, self.external_held = self.external_held, []
        self._queue_external(held)

    def _queue_external(self, events: list[ExternalEvent]) -> None:
        since = self.external_since if self.external_since is not None else -math.inf
        news = [e for e in events if e.time >= since]
        if len(news) < len(events):
            self._skipped_external(len(events) - len(news), f"dated before {since:.0f} ({self.external_news_s:g} s "
                                                             "before the first telemetry time of this stage, started "
                                                             "without a checkpoint)")
        if news:
            for target in self.external_targets:
                target.add_external(news)

    def _skipped_external(self, count: int, why: str) -> None:
        self.health.problem("incidents", "external_history", count, detail=(
            f"{count} external events {why}: history, not news; skipped"))

    def observe_telemetry(self, info: PieceInfo, frame: Frame) -> None:
        """Hold a piece's forwarded rows for its frame's run. Past ``telemetry_max_bytes`` held,
        the next :meth:`observe` or :meth:`release_overdue` gives up on the oldest waiting frame."""
        self._resume(info.agent, info.seq)
        if info.seq <= self.released.get(info.agent, 0):
            return  # redelivered after its frame ran
        key = (info.agent, info.seq)
        held = self.telemetry.setdefault(key, {})
        held[info.part] = frame
        self._telemetry_bytes[key] = sum(_frame_bytes(f) for f in held.values())

    def telemetry_bytes(self) -> int:
        """Bytes of the forwarded rows held now: sizes kept as rows come, those of frames that ran
        or were dropped forgotten, those of frames a checkpoint brought measured, as they are met."""
        for key in [k for k in self._telemetry_bytes if k not in self.telemetry]:
            del self._telemetry_bytes[key]
        for key in [k for k in self.telemetry if k not in self._telemetry_bytes]:
            self._telemetry_bytes[key] = sum(_frame_bytes(f) for f in self.telemetry[key].values())
        return sum(self._telemetry_bytes.values())

    def _trim_telemetry(self, now: float) -> list[Finding]:
        """While the rows held pass ``telemetry_max_bytes``, give up on the frame that has waited
        longest (counted as ``frame_incomplete`` or ``frame_missing``, as after ``frame_wait_s``;
        logged once) and run what then can. Rows of frames nothing holds up (a frame still being
        put together) stay: only a frame of that size alone passes the budget, and a checkpoint
        refused as too large is counted, not fatal (``faust_app``)."""
        out: list[Finding] = []
        while self.telemetry and self.telemetry_bytes() > self.telemetry_max_bytes:
            if not self._trim_logged:
                self._trim_logged = True
                log.warning("incident stage: the telemetry held for frames waiting for their pieces passed %s bytes: "
                            "the frame waiting longest is run now, before %.0f s (counted as frame_incomplete or "
                            "frame_missing; logged once)", f"{self.telemetry_max_bytes:,}", self.frame_wait_s)
            blocked = []
            for agent in {k[0] for k in self.telemetry}:
                nxt = (agent, self.released.get(agent, 0) + 1)
                if self.newest.get(agent, 0) > nxt[1]:  # a later frame came: this one holds it up
                    since = self.arrived.get(nxt, self.missing_since.get(agent, now))
                    blocked.append((since, agent))
            if not blocked:
                break
            _, agent = min(blocked)
            before = self.released.get(agent, 0)
            out.extend(self._release(agent, now, force=True))
            if self.released.get(agent, 0) <= before:
                break
        return out

    def observe(self, message: FindingsMessage) -> list[Finding]:
        if self.external_since is None and message.now is not None:
            self._date_external(message.now)  # before any frame runs: news is queued before its time
        agent = message.agent
        self._resume(agent, message.seq)
        now = self.last_heard[agent] = self.clock()
        if message.seq <= self.released.get(agent, 0):
            if self._given_up(agent, message.seq):
                self.health.problem("incidents", "late_piece", detail=f"{agent} frame {message.seq} part "
                                    f"{message.part}: came after its frame was run without it; its findings are left out")
            elif (taken := self.taken_up.get(agent)) is not None and message.seq < taken[0]:
                # (a sender never taken up has no entry: read it so, never indexed, for a report
                # below frame 1 that got here all the same ended the worker on every restart)
                self.health.problem("incidents", "late_piece", detail=(
                    f"{agent} frame {message.seq} part {message.part}: came after this stage (without a checkpoint) "
                    f"had taken its sender up at frame {taken[0]} and run frames from there; its "
                    "findings are left out"))
            else:
                self.duplicates += 1
            return []
        pieces = self.pending.setdefault((agent, message.seq), {})
        if message.part in pieces:
            self.duplicates += 1
            return []
        pieces[message.part] = message
        self.arrived.setdefault((agent, message.seq), now)
        self.waiting.setdefault(agent, set()).add(message.seq)
        self.newest[agent] = max(self.newest.get(agent, 0), message.seq)
        return self._release(agent, now) + self._trim_telemetry(now)

    def release_overdue(self) -> list[Finding]:
        """Run what every sender has waiting past ``frame_wait_s`` (``_release``): without it, the
        frames behind a lost piece would wait for their sender's next message — forever, if it
        stopped or restarted (a new sender). Call it with the checkpoints."""
        now = self.clock()
        out = [f for agent in [a for a, seqs in self.waiting.items() if seqs] for f in self._release(agent, now)]
        return out + self._trim_telemetry(now)

    def _release(self, agent: str, now: float, force: bool = False) -> list[Finding]:
        """Run ``agent``'s frames in order while the next is complete, or overdue (``_give_up``);
        ``force``: its next frame is given up on now, however short its wait (``_trim_telemetry``)."""
        out: list[Finding] = []
        while True:
            nxt = (agent, self.released.get(agent, 0) + 1)
            ready = self.pending.get(nxt)
            if ready and len(ready) >= next(iter(ready.values())).parts:
                self.missing_since.pop(agent, None)
            else:
                last = self._give_up(nxt, ready, now, force)
                force = False  # the frames after it wait as usual
                if last is None:
                    break
                if not ready:  # a run of frames of which nothing came: skip it whole
                    self.released[agent] = last
                    for key in [k for k in self.telemetry if k[0] == agent and k[1] <= last]:
                        del self.telemetry[key]  # rows forwarded for frames whose findings never came
                    continue
            self.pending.pop(nxt, None)
            self.arrived.pop(nxt, None)
            self.waiting[agent].discard(nxt[1])
            self.released[agent] = nxt[1]
            frames = self.telemetry.pop(nxt, {})
            if ready:
                out.extend(self._run([ready[p] for p in sorted(ready)], [frames[p] for p in sorted(frames)]))
        return out

    def _give_up(self, frame: tuple[str, int], pieces: dict[int, FindingsMessage] | None, now: float,
                 force: bool = False) -> int | None:
        """Whether to stop waiting for ``frame`` (its sender's next, incomplete or not seen): only
        once a later frame of its sender has come, and its own first piece (or, not seen at all, the
        first later frame since it was missed) came ``frame_wait_s`` ago; or, incomplete with no
        later frame, once its sender was silent twice ``frame_wait_s`` while this stage's input
        flowed: a record of another sender read twice ``frame_wait_s`` after its last. A killed
        sender with no other sender anywhere (a restarted agent is a new one) waits for
        ``retire_senders``. Returns the last seq given up on (a frame not seen is given up on with
        the run of unseen frames after it), or None to wait. Counted; the caller runs an
        incomplete frame with the pieces it has."""
        agent, seq = frame
        silent = ""
        if self.newest.get(agent, 0) <= seq:
            self.missing_since.pop(agent, None)
            # nothing later: the sender is mid-frame, or it was killed mid-frame (its last frame's
            # other pieces never come). Until 2026-12-05 such a frame waited for retire_senders
            # (hours) and was then dropped, its findings never run. Given up once the sender is
            # silent for twice the wait: the detection stage holds the rest of a partition's share
            # up to FRAME_WAIT_S before it sends it anyway (held_abandoned), and a wait of one
            # would give up just before those pieces come.
            # Silence alone is no proof: while this stage's own input stalls (broker away, consumer
            # blocked) a live sender's rest of the frame sits unread in the topic, and giving up
            # would run the frame short and drop that rest as late_piece when fetches resume. So the
            # silence counts only once a record of another sender was read as long after this one's
            # last: the input flowed past when the rest, held by the detection stage or not, would
            # have been read. (An empty input proves nothing either way.) An agent restarted is a new
            # sender (sender_id per start) whose records count; a killed agent with no other sender
            # anywhere waits for retire_senders, as before 2026-12-05
            heard = max(self.last_heard.get(agent, now), self.loaded_at)
            if not pieces or now - heard < 2 * self.frame_wait_s:
                return None
            # (computed only past the silence above: a scan of every sender)
            flowing = max((t for a, t in self.last_heard.items() if a != agent), default=-math.inf)
            if flowing - heard < 2 * self.frame_wait_s:
                return None
            silent = (f"; no later frame, its sender silent {now - heard:.0f} s while other senders' records "
                      f"were read up to {flowing - heard:.0f} s after its last")
        # a run of frames of which nothing came (every send failed while the broker was away) is
        # given up on at once, after one wait; each incomplete frame after its own
        since = self.arrived[frame] if pieces else self.missing_since.setdefault(agent, now)
        if now - since < self.frame_wait_s and not force:
            return None
        early = "; given up early: the telemetry held for the frames behind it passed its budget" if force else ""
        if pieces:
            last = seq
            parts = next(iter(pieces.values())).parts
            self.missing_since.pop(agent, None)  # a frame missing after this one waits afresh
            self.health.problem("incidents", "frame_incomplete", detail=f"{agent} frame {seq}: {len(pieces)} of "
                                f"{parts} pieces after {now - since:.0f} s{silent}; run with them{early}")
        else:
            later = [s for s in self.waiting.get(agent, ()) if s > seq]
            if not later:
                return None
            last = min(later) - 1
            self.health.problem("incidents", "frame_missing", last - seq + 1,
                                detail=f"{agent} frames {seq}..{last}: no piece after {now - since:.0f} s while "
                                       f"later frames came; skipped{early}")
        self.given_up.setdefault(agent, []).append((seq, last, now))
        return last

    def _given_up(self, agent: str, seq: int) -> bool:
        return any(lo <= seq <= hi for lo, hi, _ in self.given_up.get(agent, ()))

    def _run(self, pieces: list[FindingsMessage], frames: list[Frame]) -> list[Finding]:
        findings: list[Finding] = [f for p in pieces for f in p.findings]
        nows = [p.now for p in pieces if p.now is not None]
        if not self.processors or not nows:
            return []
        return run_processors(self.processors, findings, max(nows), frames)

    def _resume(self, sender: str, seq: int) -> None:
        """A sender not known here that started before the retirement horizon was retired while
        silent and speaks again: take up its sequence where this message is (its frames before it
        were released before it was retired). So is one that started before a stage that has no
        checkpoint (the first, or one whose checkpoint was unusable): waited on from frame 1, it
        would be held FRAME_WAIT_S and then given up on frame by frame. A sender that started
        since is new and counts from 1.

        A frame's pieces come from several detect partitions, interleaved: the first piece seen
        can be of a later frame than another partition's next one. So within ``frame_wait_s`` of
        the take-up, and while none of its frames has run, a piece of an earlier frame moves the
        take-up point down to it; until 2026-12-02 that frame (complete, with findings) was
        dropped as a repeat. Once a frame has run, an earlier piece is counted (``observe``)."""
        now = self.clock()
        if sender not in self.released and sender not in self.last_heard:
            started = sender_started(sender)
            if started is not None and (started < now - RETIRE_SENDER_S
                                        or (self.fresh_since is not None and started < self.fresh_since)):
                self.released[sender] = seq - 1
                self.taken_up[sender] = (seq, now)
            return
        taken = self.taken_up.get(sender)
        if (taken is not None and seq < taken[0] and self.released.get(sender) == taken[0] - 1
                and now - taken[1] < self.frame_wait_s):
            self.released[sender] = seq - 1
            self.taken_up[sender] = (seq, taken[1])

    def retire_senders(self) -> int:
        """Forget the senders not heard from for RETIRE_SENDER_S: each agent start is a sender of
        its own, and their last sequence numbers would otherwise pile up in every checkpoint for the
        life of the deployment. A frame such a sender left incomplete (``release_overdue`` runs
        those of a sender that stopped mid-frame while other senders' records came, and what
        waited behind a lost piece: only a stage that was not ticked, or that heard from no other
        sender, keeps one) is dropped and counted: its findings are hours old.
        Returns how many were retired."""
        horizon = self.clock() - RETIRE_SENDER_S
        old = {a for a, t in self.last_heard.items() if t < horizon}
        for frame in [f for f in self.pending if f[0] in old]:
            pieces = self.pending.pop(frame)
            self.arrived.pop(frame, None)
            self.health.problem("incidents", "frame_incomplete", detail=f"{frame[0]} frame {frame[1]}: "
                                f"{len(pieces)} pieces, then nothing for {RETIRE_SENDER_S / 3600:g} h; dropped")
        for frame in [f for f in self.telemetry if f[0] in old]:
            del self.telemetry[frame]
        for agent in old:
            del self.last_heard[agent]
            self.released.pop(agent, None)
            self.newest.pop(agent, None)
            self.missing_since.pop(agent, None)
            self.waiting.pop(agent, None)
            self.given_up.pop(agent, None)
            self.taken_up.pop(agent, None)
        for agent, runs in list(self.given_up.items()):
            self.given_up[agent] = [run for run in runs if run[2] >= horizon]
        return len(old)

    def _moved(self, state: dict[str, Any], remap: Remap) -> dict[str, Any]:
        """A state saved under other hardware: the processors' renumbered by entity name (open
        incidents keep their members and roots), the frames that waited for pieces dropped —
        their findings are numbered by the old file, and their agents restart with the new one
        (counted by ``load`` once the state is taken)."""
        unmovable = [p.name for p in self.processors if not callable(getattr(p, "remap_state", None))]
        if unmovable:
            raise ValueError(f"checkpoint written for another topology, and {', '.join(unmovable)} cannot move "
                             "its state onto this one: the incident stage starts fresh")
        processors = {p.name: p.remap_state(state["processors"][p.name], remap)  # type: ignore[attr-defined]
                      for p in self.processors}
        return {**state, "processors": processors, "pending": {}, "telemetry": {}, "arrived": {},
                "missing_since": {}, "newest": dict(state["released"])}

    def state(self) -> dict[str, Any]:
        return {"processors": {p.name: p.state_dict() for p in self.processors},
                "released": dict(self.released), "pending": self.pending, "telemetry": self.telemetry,
                "external_offset": self.external_offset, "external_since": self.external_since,
                "external_held": list(self.external_held), "last_heard": dict(self.last_heard),
                "arrived": dict(self.arrived), "newest": dict(self.newest), "missing_since": dict(self.missing_since),
                "given_up": {agent: list(runs) for agent, runs in self.given_up.items() if runs},
                "taken_up": dict(self.taken_up)}

    def checkpoint(self) -> tuple[int, bytes]:
        """The offset covered and the checkpoint; taken as written (a write that fails ends the
        worker, one refused as too large is undone by :meth:`checkpoint_refused`)."""
        self.retire_senders()
        blob = encode_checkpoint(self.offset, self.state(), "incidents", self.signature, self.topology, layout=True,
                                 previous=self.cover.previous_for(self.offset), topic_id=self.topic_id)
        self._cover_before = (self.cover.checkpointed, self.cover.before)
        self.cover.written(self.offset)
        return self.offset, blob

    def checkpoint_refused(self) -> None:
        """The checkpoint last made was not written (refused as too large): the next one's
        ``previous`` is the last one written."""
        if self._cover_before is not None:
            self.cover.checkpointed, self.cover.before = self._cover_before
            self._cover_before = None

    def open_incidents(self) -> list[Incident]:
        """The incidents open in this stage's processors (those that keep incidents), as each was
        last reported: for a worker's /metrics after :meth:`load` (``FindingStore.hold_incidents``)."""
        found: list[Incident] = []
        for proc in self.processors:
            current = getattr(proc, "incidents", None)
            if callable(current):
                found.extend(i for i in current() if isinstance(i, Incident))
        return found

    def covered(self, offset: int) -> bool:
        """Whether the foreshock.findings record at ``offset`` was taken before the checkpoint this
        stage was loaded from (skip it: redelivered)."""
        if offset > self.offset:
            return False
        self.cover.skipped(offset, self.health, "worker", "incident stage")
        return True

    def load(self, checkpoint: bytes | None, end_offset: int | None = None, topic_id: str | None = None) -> int:
        """Take up from ``checkpoint`` (None: start fresh); returns the findings offset covered (-1
        none). A checkpoint of a foreshock.findings since deleted and re-created is counted and the
        stage starts fresh (:func:`check_source_topic`), told by ``topic_id``, the topic's ID now
        (written with the stage's checkpoints from here on: :class:`TopicIds`), or else by
        ``end_offset``, its end (high-water) offset (``ahead_of_topic``). None: not known; with
        neither, ``CheckpointCover`` guesses.

        All or nothing: a checkpoint refused, at any point, leaves the stage as it was made
        (fresh). Until 2026-12-02 the stage took the checkpoint's parts one by one, and one that
        failed half-way (a malformed ``pending``, a processor's state it could not read) left the
        processors and senders loaded before it, in a stage that reported ``checkpoint_unusable``
        and went on as fresh: frames of senders it had "released" were dropped as repeats."""
        self.topic_id = topic_id
        if checkpoint is None:
            return -1
        try:
            saved = decode_checkpoint(checkpoint, "incidents", self.signature)
            check_source_topic(saved, end_offset, topic_id, "incident stage", "foreshock.findings")
            taken, processors, dropped = self._read_checkpoint(saved, end_offset, topic_id)
            self._load_processors(processors)  # the last step that may fail: it undoes itself
        except _OtherTopic as exc:
            self.health.problem("worker", exc.reason, detail=str(exc))
            return -1
        except Exception as exc:
            self.health.problem("worker", "checkpoint_unusable", detail=f"incident stage: {exc}")
            return -1
        for name, value in taken.items():  # nothing can fail here: the stage takes all or none of it
            setattr(self, name, value)
        if dropped:
            self.health.problem("incidents", "frame_incomplete", dropped,
                                detail="frames waiting for pieces when the hardware changed: numbered by the old "
                                       "topology file, dropped")
        return self.offset

    def _read_checkpoint(self, saved: SavedCheckpoint, end_offset: int | None,
                         topic_id: str | None) -> tuple[dict[str, Any], dict[str, Any], int]:
        """The stage's attributes from ``saved`` (by name), its processors' states, and how many
        waiting frames a change of hardware dropped. Changes nothing: raises on anything malformed."""
        state = saved.state
        dropped = 0
        old = saved.written_for(self.topology) if self.topology is not None else None
        if old is not None and self.topology is not None:
            dropped = len(state["pending"])
            state = self._moved(state, Remap(old, self.topology))
        now = self.clock()
        released = {str(agent): int(seq) for agent, seq in state["released"].items()}
        pending: dict[tuple[str, int], dict[int, FindingsMessage]] = {
            (str(agent), int(seq)): dict(pieces) for (agent, seq), pieces in state["pending"].items()}
        newest = {str(agent): int(seq) for agent, seq in state.get("newest", {}).items()}
        waiting: dict[str, set[int]] = {}
        for agent, seq in pending:
            newest[agent] = max(newest.get(agent, 0), seq)
            waiting.setdefault(agent, set()).add(seq)
        since = state.get("external_since", -math.inf)  # absent: written when every event was taken
        taken: dict[str, Any] = {
            "released": released,
            # before senders were retired: each heard from now, so none is forgotten at once
            "last_heard": {str(a): float(t) for a, t in state.get("last_heard", dict.fromkeys(released, now)).items()},
            "pending": pending,
            "telemetry": dict(state.get("telemetry", {})),
            # before frames were given up on: what waits is taken as arrived now
            "arrived": dict(state.get("arrived", dict.fromkeys(pending, now))),
            "newest": newest,
            "waiting": waiting,
            "missing_since": dict(state.get("missing_since", {})),
            "given_up": {agent: [tuple(run) for run in runs] for agent, runs in state.get("given_up", {}).items()},
            "taken_up": {agent: (int(seq), float(at)) for agent, (seq, at) in state.get("taken_up", {}).items()},
            "fresh_since": None,
            "loaded_at": now,
            "external_offset": int(state.get("external_offset", -1)),  # absent before external.events
            "external_since": None if since is None else float(since),
            "external_held": list(state.get("external_held", [])),
            "offset": saved.offset,
            "cover": CheckpointCover.loaded(saved, end_offset, same_topic=topic_id is not None
                                            and saved.topic_id == topic_id),
            # the ID not read now: the checkpoint's goes on (the topic is taken to be the same, as
            # it is loaded), so a later start that reads the ID can still compare
            "topic_id": topic_id if topic_id is not None else saved.topic_id,
        }
        processors = {p.name: state["processors"][p.name] for p in self.processors}
        return taken, processors, dropped

    def _load_processors(self, states: dict[str, Any]) -> None:
        """Load each processor's state; if one raises, those loaded before it (and it) get their own
        states back, so a refused checkpoint leaves them all as they were."""
        # as a checkpoint holds them: a processor may hand out its live arrays, that loading overwrites
        before = [pickle.loads(pickle.dumps(p.state_dict(), protocol=5)) for p in self.processors]
        try:
            for p in self.processors:
                p.load_state_dict(states[p.name])
        except BaseException:
            for p, state in zip(self.processors, before):
                p.load_state_dict(state)
            raise


def _frame_bytes(frame: Frame) -> int:
    """Bytes of a frame's columns (what pickling it writes, about)."""
    return int(frame.ts.nbytes + frame.slot.nbytes + sum(c.nbytes for c in frame.columns.values()))


def dedupe_findings_messages(messages: Sequence[FindingsMessage]) -> list[FindingsMessage]:
    """First copy of each piece (what a consumer of ``foreshock.findings`` does with repeats)."""
    seen: set[tuple[str, int, int]] = set()
    out = []
    for m in messages:
        if m.piece_id not in seen:
            seen.add(m.piece_id)
            out.append(m)
    return out

