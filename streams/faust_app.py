"""The faust-streaming app behind ``foreshock worker``.

Agents (one consumer group, ``app_id``; start as many workers as you like):

- ``detect`` — consumes ``telemetry.frames``; for each partition this worker owns, runs the
  input guard and the detector bank (``kafka_worker.DetectionStage``) over each record's
  pieces and publishes one findings message per record to ``foreshock.findings``;
- ``route_json`` — consumes ``telemetry.json`` (outside producers), turns the records into
  frames and publishes them to ``telemetry.frames`` like an ingest agent;
- ``incidents`` — consumes ``foreshock.findings`` (one partition: one worker at a time owns the
  incident stage), runs the incident processors, publishes to ``foreshock.incidents``. The
  worker that owns the stage also reads ``external.events`` (outside fault/alert events, JSON
  lines from any producer) with a consumer of its own, positioned from the incident checkpoint,
  and hands each record's events to the stage before the next findings message.

**Roles.** A worker runs all three (``role="all"``, the default), or only ``detect`` (with
``route_json``) or only ``incidents``. The incident stage sees every finding of the cluster,
so in a group of all-role workers the one that owns it carries that on top of its share of
detection and sets the pace; a dedicated ``incidents`` worker takes it off the detection path
(measured in ``bench/bench_kafka.py``). Each role other than ``all`` joins its own consumer
group, ``<app id>.<role>``, so every member of a group subscribes to the same topics and each
role is assigned, rebalanced and scaled on its own. Run either all-role workers, or detect
workers plus one or more incidents workers (one at a time owns the stage) — not both kinds on
one cluster's topics: an all-role group and a detect group would each process every frame.

Bad records go to ``foreshock.deadletter`` with the reason in a header, and are counted (a
value past the topic's message size cut short; a dead letter the broker refuses all the same is
counted, not fatal). Each worker serves its own ``/metrics`` (``exporters.prometheus``).
Checkpoints and the at-least-once contract: see ``kafka_worker``. Three things keep that contract
here:

- every message the worker sends is confirmed delivered before a checkpoint is written (a send
  fails for good when the broker is away past the producer's timeout, or refuses the message):
  aiokafka's flush does not raise, so until 2026-12-01 a checkpoint, and the offset commit after
  it, could pass findings that were never delivered. After a failed send the worker writes no
  checkpoint again and ends (``fatal``), a partition revoked meanwhile included;
- a record whose handling raises ends the worker (``fatal``; exit status 70) instead of faust's
  default of restarting the agent: the restarted agent read on, later records were committed,
  and faust's commit passes a single unacknowledged offset, so that record's findings were lost
  with nothing counted. Restarted (by systemd, Kubernetes or compose), the worker, or the
  partition's next owner, reads on from the last checkpoint. A checkpoint the broker refuses as
  too large is counted (``checkpoint_too_large``) and tried again at the next interval, its
  records left unacknowledged; only ``CHECKPOINT_REFUSALS_MAX`` refusals in a row end the worker;
- an event of a frames partition revoked from this worker that still reaches it (one taken
  before the rebalance, or prefetched) is left to the partition's new owner: not processed, not
  acknowledged, counted (``foreshock_records_not_assigned_total``, and ``not_assigned`` in the
  worker's status). Processed, it had loaded the
  partition again from its checkpoint, and this worker wrote findings and checkpoints for it
  beside the new owner.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shutil
import socket
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import faust
from faust.exceptions import ConsumerNotStarted
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import (CorruptRecordException, KafkaConnectionError, MessageSizeTooLargeError,
                             RecordListTooLargeError)
from aiokafka.structs import TopicPartition

from foreshock.detectors.bank import DetectorBank
from foreshock.exporters.store import FindingStore
from foreshock.findings import finding_to_json
from foreshock.guard import MAX_AHEAD_S
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .kafka_codec import (BundleBuilder, Headers, PartitionMap, RecordError, as_record_error, bundle_key,
                          capped_deadletter, continues_after, decode_bundle, decode_findings, deadletter_headers,
                          encode_bundle, headers_dict, is_telemetry, json_to_frames, sender_id, split_findings)
from .kafka_config import KafkaSettings
from .kafka_topics import CHECKPOINT_MAX_BYTES, Topics
from .external_feed import STAGE as EXTERNAL_STAGE
from .external_feed import parse_lines
from .kafka_worker import BundleResult, DetectionStage, IncidentStage, TopicIds

log = logging.getLogger("foreshock.worker")


@dataclass
class WorkerConfig:
    settings: KafkaSettings
    topics: Topics
    topology: Topology
    make_bank: Callable[[Topology], DetectorBank]  # the bank for a topology (see DetectionStage)
    app_id: str = "foreshock"
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    checkpoint_interval_s: float = 5.0
    session_timeout_s: float = 6.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # 0 = no /metrics server
    metrics_top_k: int = 16  # per-GPU series for the K hottest GPUs besides flagged ones
    # faust's data directory (its table stores; this app's tables live in memory). None: a
    # fresh temporary folder, removed when the worker stops. faust's own default is
    # ``<app id>-data`` in the current directory: every run left a folder behind.
    data_dir: str | None = None
    role: str = "all"  # "all", "detect" (and route_json) or "incidents": see the module docstring
    # rows stamped further ahead of this host's clock are refused (the sending host's clock is
    # wrong); inf: no limit, for a simulation published faster than real time
    max_clock_ahead_s: float = MAX_AHEAD_S
    # the FindingStore's keywords the detectors' parameters set (cli.common.store_params: the
    # congestion gauges' parameters, how long a held flag is kept past its refresh)
    store_params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"worker role {self.role!r} not one of {ROLES}")

    @property
    def group(self) -> str:
        """The consumer group (faust app id): roles other than ``all`` get one of their own."""
        return self.app_id if self.role == "all" else f"{self.app_id}.{self.role}"

    @property
    def detects(self) -> bool:
        return self.role in ("all", "detect")

    @property
    def builds_incidents(self) -> bool:
        return self.role in ("all", "incidents")


ROLES = ("all", "detect", "incidents")
EXIT_RECORD_FAILED = 70  # EX_SOFTWARE
EXTERNAL_FIRST_FETCH_MS = 500
"""How long the incident stage's first read of ``external.events`` (after it is loaded or
reassigned) waits for the topic's first fetch; later reads take only what has arrived."""
BROKER_PATIENCE_S = 60.0
"""How long a reader outside the group (checkpoints, ``external.events``) keeps trying to reach
a broker that is away before the worker ends (``fatal``): a broker restart takes seconds, and
a reader's first connection had ended the worker at once (a restart caught the incident stage
opening its ``external.events`` reader: its findings were read again only by the next worker)."""
# What the broker (or the producer, before sending) answers for a message it will never take,
# however often it is sent: unlike a broker that is away, no restart delivers it either.
_REFUSALS = (MessageSizeTooLargeError, RecordListTooLargeError, CorruptRecordException)


CHECKPOINT_REFUSALS_MAX = 6
"""Refusals in a row of one checkpoint (as too large) after which the worker ends (``fatal``):
until then each is counted and the next checkpoint tries again, as a backlog behind a lost piece
shrinks (``IncidentStage._trim_telemetry``). Past it (30 s at the default interval) the topic
takes too little for this state: reading on, the worker would hold every record's event
unacknowledged, without end, and commit nothing."""


def _refused(exc: BaseException) -> bool:
    """``exc`` is a refusal of the message (faust's ProducerSendError wraps the producer's)."""
    return isinstance(exc, _REFUSALS) or isinstance(exc.__cause__, _REFUSALS)


def _raw_topic(app: faust.App, name: str, partitions: int | None = None) -> Any:
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw",
                     partitions=partitions)


class BrokerOutageLog(logging.Filter):
    """aiokafka's errors while no broker answers, counted and logged once per outage.

    While the broker is away the group's consumer, its coordinator and the producer each retry
    every ~100 ms and log every failure: a 2-minute outage wrote 14,606 lines to a worker's log
    (stop 66's audit), and counted nothing in ``foreshock_input_problems_total``. A handler filter
    (installed on the root logger's handlers, where every library's records end): the first error
    of an outage passes as aiokafka wrote it, the rest are held back; each second with such errors
    counts one ``worker/broker_unreachable`` (the count reads as seconds of outage, whichever of
    the clients failed); :meth:`answered` says when records flow again. An outage is over after
    ``quiet_s`` without such an error: the next one is logged again. Called from faust's consumer
    thread too: PipelineHealth counts under its lock."""

    MARKERS = ("Unable connect to node", "Unable to update metadata", "NodeNotReadyError", "KafkaConnectionError",
               "No node available", "Connection lost", "Connect call failed", "socket disconnected")
    """Words of the client libraries' connection errors (aiokafka's, and kafka-python's in the topic-ID reader;
    the log the audit saw). Not a coordinator marked dead: a group's coordinator moves between live brokers."""
    LIBRARIES = ("aiokafka", "kafka", "faust")

    def __init__(self, health: PipelineHealth, quiet_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.health, self.quiet_s, self.clock = health, quiet_s, clock
        self.since: float | None = None  # the outage's first error (None: none going on)
        self.last = -math.inf  # the last error
        self.counted_second: int | None = None
        self.held_back = 0  # errors of this outage not logged

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(self.LIBRARIES):
            return True
        text = record.getMessage()
        if not any(marker in text for marker in self.MARKERS):
            return True
        now = self.clock()
        first = self.since is None or now - self.last > self.quiet_s
        if first:
            self.since, self.held_back = now, 0
        self.last = now
        if int(now) != self.counted_second:
            self.counted_second = int(now)
            self.health.problem("worker", "broker_unreachable", detail=f"{record.name}: {text}")
        if first:
            return True
        self.held_back += 1
        return False

    def answered(self) -> None:
        """Records flow again (one was handled): an outage going on is over, and said so."""
        if self.since is not None:
            took, held_back = self.last - self.since, self.held_back
            self.since, self.held_back = None, 0
            log.warning("the Kafka broker answers again after %.0f s of connection errors (%d more of them not "
                        "logged; counted by the second as worker/broker_unreachable)", took, held_back)


async def _stop_reader(reader: AIOKafkaConsumer | None, what: str) -> None:
    """Stop a consumer outside the group (``what`` names it in a warning if it fails)."""
    if reader is not None:
        try:
            await reader.stop()
        except Exception as exc:  # only a consumer outside the group: nothing to hand over
            log.warning("stopping the %s reader: %s: %s", what, type(exc).__name__, exc)


class ForeshockWorker:
    """Holds the stages and the plumbing; the faust agents call into it."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.owns_data_dir = config.data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="foreshock-worker-")) if config.data_dir is None \
            else Path(config.data_dir)
        self.health = PipelineHealth()
        self.outage = BrokerOutageLog(self.health)  # on the log's handlers once faust has set them up
        self.store = FindingStore(config.topology, self.health, **config.store_params)
        self.detection = DetectionStage(config.topology, config.make_bank, config.topics.partitions,
                                        self.store, self.health, config.worker_id, config.max_clock_ahead_s)
        self.incident_stage = self._new_incident_stage()
        self.incidents_loaded = False
        self.pmap = PartitionMap(config.topology, config.topics.partitions)
        self.lock = asyncio.Lock()
        self.held: dict[int, list[Any]] = {}  # partition -> unacked events since its checkpoint
        # partitions whose state changed with no record to acknowledge since their checkpoint
        # (pieces held for a frame's rest, run at the tick: ``checkpoint_due``)
        self.unwritten: set[int] = set()
        # The frames partitions the group assigned to this worker (on_assigned; on_revoked
        # removes them). An event of another partition still reaches on_piece after its
        # revocation (one an agent had taken waits for the lock on_revoked holds; faust's
        # buffers prefetch, and stream_wait_empty=False does not wait for them): processing it
        # would take the partition back from its checkpoint, beside its new owner.
        self.assigned_frames: set[int] = set()
        self._unassigned_logged = False
        self.held_incidents: list[Any] = []
        # the incident stage ran or skipped frames with no record to acknowledge since its
        # checkpoint (frames overdue, run at the tick: ``checkpoint_due``)
        self.incidents_unwritten = False
        self.last_checkpoint: dict[int, float] = {}
        self.last_incident_checkpoint = 0.0
        self.json_seq = 0
        self.json_sender = sender_id(f"json@{config.worker_id}")  # JSON lines it routes, as one sender
        # "not_assigned": events of a frames partition no longer (or not yet) assigned to this worker
        self.counts = {"records": 0, "pieces": 0, "deadletters": 0, "checkpoints": 0, "skipped": 0, "incidents": 0,
                       "external": 0, "not_assigned": 0}
        self._ckpt_reader: AIOKafkaConsumer | None = None
        # one checkpoint reader: the start-up task and the first partition's load both ask for it,
        # and two callers in its start each built one, the first left unclosed (aiokafka's
        # "Unclosed AIOKafkaConsumer" at every rejoin of a live group, stop 64's audit)
        self._ckpt_reader_lock = asyncio.Lock()
        self._readers_closed = False  # close_readers ran: a reader started since is stopped at once
        self.topic_ids = TopicIds(config.settings)  # to tell a checkpoint of a re-created topic
        self._external_reader: AIOKafkaConsumer | None = None
        self.external_positioned = False  # the external reader is at the incident stage's offset
        if config.builds_incidents and not self.incident_stage.external_targets:
            log.warning("the detector bank has no incident processor: %s is not read", config.topics.external)
        self._frames_stream: Any = None
        self._findings_stream: Any = None
        self._unconfirmed: list[Any] = []  # futures of messages sent since the last checkpoint
        self._undelivered: str | None = None  # the first send that failed, once one has: no checkpoint after it
        self._exit: Callable[[int], Any] = os._exit  # fatal's way out (a test's stand-in)
        self._refusals: dict[str, int] = {}  # per checkpoint key, its refusals in a row (_write_checkpoint)
        self.app = self._build_app()

    def _new_incident_stage(self) -> IncidentStage:
        return IncidentStage(self.config.make_bank(self.config.topology).processors, self.health, self.config.topology)

    # ---- the faust app -----------------------------------------------------------------
    def _build_app(self) -> faust.App:
        cfg = self.config
        app = faust.App(
            cfg.group,
            datadir=str(self.data_dir),
            broker=cfg.settings.faust_broker(),
            broker_credentials=cfg.settings.faust_credentials(),
            store="memory://",
            autodiscover=False,
            web_enabled=False,
            topic_allow_declare=False,  # ensure_topics creates ours, with their own partition counts
            topic_disable_leader=True,
            topic_partitions=cfg.topics.partitions,
            stream_wait_empty=False,  # events stay unacked until their checkpoint (kafka_worker)
            broker_session_timeout=cfg.session_timeout_s,
            broker_heartbeat_interval=max(0.3, cfg.session_timeout_s / 6),
            broker_commit_interval=1.0,
            consumer_auto_offset_reset="earliest",
            producer_acks=-1,
            producer_max_request_size=CHECKPOINT_MAX_BYTES,
            producer_linger_ms=2,
            # Records are bundles of up to 12 MB of rows (kafka_codec; ~1.3 MB after LZ4): fetch
            # several per partition per request, but keep the prefetched backlog bounded (faust's
            # default is 4096 events per stream buffer: gigabytes of bundles when a worker falls
            # behind; 64 held bundles are ~85 MB).
            consumer_max_fetch_size=8 * 1024 * 1024,
            stream_buffer_maxsize=64,
        )
        t = cfg.topics
        self.frames_topic = _raw_topic(app, t.frames, t.partitions)
        self.json_topic = _raw_topic(app, t.json, t.partitions)
        self.findings_topic = _raw_topic(app, t.findings, 1)
        self.incidents_topic = _raw_topic(app, t.incidents, 1)
        self.deadletter_topic = _raw_topic(app, t.deadletter, 1)
        self.checkpoint_topic = _raw_topic(app, t.checkpoints, t.partitions + 1)

        def held_until_checkpoint(handler: Callable[[Any, Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
            """An agent whose events stay unacked until the handler's checkpoint acks them."""
            async def agent(stream: Any) -> None:
                manual = stream.noack()
                async for event in manual.events():
                    await self.handle(handler, manual, event)
            return agent

        if cfg.detects:
            app.agent(self.frames_topic, name="detect")(held_until_checkpoint(self.on_piece))

            @app.agent(self.json_topic, name="route_json")
            async def route_json(stream: Any) -> None:
                async for event in stream.events():  # acked when handled: handle ends the worker first
                    await self.handle(lambda _, ev: self.on_json(ev), stream, event)

        if cfg.builds_incidents:
            app.agent(self.findings_topic, name="incidents")(held_until_checkpoint(self.on_findings))

        @app.timer(max(0.5, cfg.checkpoint_interval_s / 2))
        async def checkpoint_idle_partitions() -> None:
            try:
                await self.checkpoint_due()
            except Exception as exc:
                self.fatal("a checkpoint", exc)

        async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
            await self.on_revoked(revoked)

        app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]

        async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
            self.on_assigned(assigned)

        # faust sends this signal at the end of its _on_partitions_assigned, with the partitions
        # still paused: they are resumed by its recovery task, which that method only signals
        # (TableManager.on_rebalance) and which runs once it yields. Nothing awaits between that
        # signal and this receiver, and on_assigned does not await: the set is filled before the
        # first event of the assignment reaches on_piece.
        app.on_partitions_assigned.connect(on_assigned)  # type: ignore[arg-type]

        @app.task
        async def open_checkpoint_reader() -> None:
            await self._reader()

        async def on_shutdown(sender: Any, **kwargs: Any) -> None:
            await self.close_readers()

        # sent by the app's on_stop once its consumer has stopped: faust knows nothing of the
        # clients outside the group, which were left open (connections, fetch tasks, warnings)
        app.on_before_shutdown.connect(on_shutdown)  # type: ignore[arg-type]

        return app

    async def close_readers(self) -> None:
        """Stop the consumers outside the group (checkpoints, ``external.events``) and close the
        topic-ID admin client: at a worker's shutdown, after the handlers that use them."""
        async with self.lock:
            await self._stop_external_reader()
            # not under the reader's lock: a start-up task still trying an absent broker holds it for
            # up to BROKER_PATIENCE_S, and the shutdown waited that out; the reader it starts after
            # this is stopped by it (_reader)
            self._readers_closed = True
            reader, self._ckpt_reader = self._ckpt_reader, None
            await _stop_reader(reader, "checkpoint")
            await asyncio.to_thread(self.topic_ids.close)

    # ---- checkpoints -------------------------------------------------------------------
    async def _consumer(self, name: str, patience_s: float | None = None) -> AIOKafkaConsumer:
        """A started consumer outside the group (partitions assigned by hand, no commits); its
        bootstrap tried again for ``patience_s`` (:data:`BROKER_PATIENCE_S` by default) while no
        broker answers."""
        patience_s = BROKER_PATIENCE_S if patience_s is None else patience_s
        s = self.config.settings
        extra: dict[str, Any] = {}
        if s.sasl:
            extra = {"sasl_mechanism": s.sasl_mechanism, "sasl_plain_username": s.username,
                     "sasl_plain_password": s.password}
        give_up = time.monotonic() + patience_s
        pause = 0.5
        while True:
            reader = AIOKafkaConsumer(bootstrap_servers=s.bootstrap, security_protocol=s.security_protocol,
                                      enable_auto_commit=False, client_id=f"foreshock-{name}-{self.config.worker_id}",
                                      max_partition_fetch_bytes=CHECKPOINT_MAX_BYTES,
                                      fetch_max_bytes=CHECKPOINT_MAX_BYTES, **extra)
            try:
                await reader.start()
                return reader
            except KafkaConnectionError as exc:  # no broker answered the bootstrap: away, or restarting
                try:
                    await reader.stop()
                except Exception:  # (what start opened is closed as far as it goes; nothing to hand over)
                    pass
                left = give_up - time.monotonic()
                if left <= 0:
                    raise
                self.health.problem("worker", "broker_unreachable", detail=(
                    f"the {name} reader: {exc}; trying again for up to {patience_s:.0f} s"))
                await asyncio.sleep(min(pause, left))
                pause = min(2 * pause, 5.0)

    async def _reader(self, patience_s: float | None = None) -> AIOKafkaConsumer:
        """The checkpoint reader, started by its first caller; callers meanwhile wait for it."""
        async with self._ckpt_reader_lock:
            if self._ckpt_reader is None:
                reader = await self._consumer("ckpt", patience_s)
                if self._readers_closed:  # the worker stopped meanwhile: nothing left to close it
                    await _stop_reader(reader, "checkpoint")
                    raise RuntimeError("the worker is stopping: no checkpoint reader")
                self._ckpt_reader = reader
            return self._ckpt_reader

    async def read_checkpoint(self, partition: int) -> bytes | None:
        """The last record of the checkpoint partition (one key per partition: the latest)."""
        reader = await self._reader()
        tp = TopicPartition(self.config.topics.checkpoints, partition)
        reader.assign([tp])
        end = (await reader.end_offsets([tp]))[tp]
        if end == 0:
            return None
        reader.seek(tp, end - 1)
        records = await reader.getmany(tp, timeout_ms=10_000)
        batch = records.get(tp, [])
        if not batch:
            raise RuntimeError(f"could not read checkpoint partition {partition} (end offset {end})")
        value: bytes = batch[-1].value
        return value

    async def end_offset(self, topic: str, partition: int) -> int | None:
        """The partition's end (high-water) offset, checked against the checkpoint loaded for it
        (a topic deleted and re-created since: ``ahead_of_topic``); None when the broker does not
        say within 10 s (the stages then guess: ``CheckpointCover``)."""
        tp = TopicPartition(topic, partition)
        try:
            reader = await self._reader(patience_s=0.0)  # (no wait for a broker that is away: only a check)
            end: int = (await asyncio.wait_for(reader.end_offsets([tp]), 10.0))[tp]
        except Exception as exc:  # only a check: the partition is taken up without it
            log.warning("end offset of %s/%d not read (%s: %s): a checkpoint of a re-created topic is only guessed "
                        "at", topic, partition, type(exc).__name__, exc)
            return None
        return end

    async def topic_id(self, topic: str) -> str | None:
        """The topic's ID, written with the checkpoints of the partitions read from it: a topic
        deleted and re-created has a new one (``kafka_worker.recreated_topic``). None when not read
        (logged by ``TopicIds``; the stages then check the end offset alone)."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.topic_ids.read, topic), 30.0)
        except Exception as exc:  # only a check, as the end offset
            log.warning("the ID of topic %s not read (%s: %s)", topic, type(exc).__name__, exc)
            return None

    async def handle(self, handler: Callable[[Any, Any], Awaitable[None]], stream: Any, event: Any) -> None:
        """``handler(stream, event)``, ending the worker (``fatal``) if it raises."""
        try:
            await handler(stream, event)
        except Exception as exc:
            message = event.message
            self.fatal(f"record {message.topic}/{message.partition}@{message.offset}", exc)
        else:
            self.note_consumer_lag(event.message)
            if self.outage.since is not None:
                self.outage.answered()

    def note_consumer_lag(self, message: Any) -> None:
        """After ``message`` was handled: its partition's records still to process, from the high
        watermark of the consumer's last fetch (``foreshock_consumer_lag_records``). Clock-free, beside
        the ingest lag, which reads the agents' send stamps. Not known (the partition not, or no
        longer, assigned: a record left to its new owner; no fetch answered yet): left as it was."""
        if message.topic == self.config.topics.frames and message.partition not in self.assigned_frames:
            return  # revoked (_skip_unassigned left it to its owner), which may still be fetching it
        try:
            high = self.app.consumer.highwater(TopicPartition(message.topic, message.partition))
        except (AssertionError, ConsumerNotStarted):  # (aiokafka asserts the partition is assigned)
            return
        if isinstance(high, int):
            self.store.set_consumer_lag(message.topic, message.partition, max(high - message.offset - 1, 0))

    def fatal(self, what: str, exc: BaseException) -> None:
        """End the worker: ``what`` could not be handled. Nothing after it may be acknowledged,
        or the offset commit would pass it (see the module docstring)."""
        self.health.problem("worker", "record_failed", detail=f"{what}: {type(exc).__name__}: {exc}")
        log.critical("%s could not be handled (%s: %s): the worker exits so that it is read again from "
                     "the last checkpoint", what, type(exc).__name__, exc, exc_info=exc)
        # os._exit runs no finally: run_worker's removal of the temporary data folder is done here
        # (the /metrics server's socket and thread end with the process)
        self.remove_data_dir()
        logging.shutdown()
        self._exit(EXIT_RECORD_FAILED)

    async def _send(self, topic: Any, **message: Any) -> None:
        """Send ``message`` on ``topic``; its delivery is confirmed before the next checkpoint."""
        self._unconfirmed.append(await topic.send(force=True, **message))

    async def _confirm_sent(self) -> None:
        """Wait for every message sent since the last checkpoint; raise if one was not delivered
        (aiokafka's flush does not: it only waits). Each failure is counted, and once one was,
        this raises every time: no checkpoint may be written after a message that was lost (its
        record lies before the checkpoint's offset, and would never be read again); only a
        restart, reading from the last checkpoint, sends it again (``fatal``)."""
        if self._undelivered is not None:
            raise RuntimeError(f"a message sent since an earlier checkpoint was not delivered "
                               f"({self._undelivered}): no checkpoint may be written until the worker restarts")
        await self.app.producer.flush()
        sent, self._unconfirmed = self._unconfirmed, []
        # every one awaited, not up to the first failure: those after it were no longer tracked,
        # and the next partition's checkpoint passed them unconfirmed
        outcomes = await asyncio.gather(*sent, return_exceptions=True)
        failed = [exc for exc in outcomes if isinstance(exc, BaseException)]
        if failed:
            first = failed[0]
            self._undelivered = f"{type(first).__name__}: {first}"
            self.health.problem("worker", "send_failed", count=len(failed), detail=self._undelivered)
            raise first

    async def _write_checkpoint(self, partition: int, key: str, blob: bytes) -> bool:
        """Write one checkpoint; False when it is refused as too large (counted,
        ``checkpoint_too_large``): nothing it covers may be acknowledged then, and the next
        checkpoint tries again. Until 2026-12-05 the first refusal ended the worker (exit 70),
        and its restart, reading the same records into the same state (a backlog of frames
        waiting behind a lost piece), was refused again. Refused ``CHECKPOINT_REFUSALS_MAX``
        times in a row, it raises all the same (``fatal``): see there."""
        await self._confirm_sent()  # the findings these offsets produced are delivered first
        try:
            future = await self.checkpoint_topic.send(key=key.encode(), value=blob, partition=partition, force=True)
            await future
        except Exception as exc:
            if not _refused(exc):
                raise
            refusals = self._refusals[key] = self._refusals.get(key, 0) + 1
            self.health.problem("worker", "checkpoint_too_large", detail=(
                f"checkpoint {key} of {len(blob):,} bytes refused ({type(exc).__name__}: {exc}; the checkpoints "
                f"topic takes {CHECKPOINT_MAX_BYTES:,}): not written, its records not acknowledged; a restart "
                f"reads them again from the last checkpoint written (refusal {refusals} in a row)"))
            if refusals >= CHECKPOINT_REFUSALS_MAX:
                raise
            return False
        self._refusals.pop(key, None)
        self.counts["checkpoints"] += 1
        return True

    async def checkpoint_partition(self, stream: Any, partition: int, ack: bool = True) -> None:
        if not self.detection.owns(partition):
            return
        offset, blob = self.detection.checkpoint(partition)
        if not await self._write_checkpoint(partition, f"detect/{partition}", blob):
            self.last_checkpoint[partition] = time.monotonic()  # tried again at the next interval, not each record
            return
        self.detection.mark_checkpointed(partition, offset)
        self.last_checkpoint[partition] = time.monotonic()
        self.unwritten.discard(partition)
        events, self.held[partition] = self.held.get(partition, []), []
        if ack and stream is not None:
            for ev in events:  # now faust may commit them
                await stream.ack(ev)

    async def _publish_incidents(self, found: list[Any]) -> None:
        for finding in found:
            await self._send(self.incidents_topic, key=b"incident", value=finding_to_json(finding).encode(), partition=0)
        if found:
            self.store.observe_findings(found)
            self.counts["incidents"] += len(found)

    async def _release_overdue_incidents(self) -> bool:
        """Run the incident stage's overdue frames (``IncidentStage.release_overdue``) and publish
        the incidents they made; True when any frame ran or was skipped (the stage is then
        ``incidents_unwritten``: its last checkpoint still holds those frames, though their records
        may be acknowledged)."""
        stage = self.incident_stage
        before = dict(stage.released)
        found = stage.release_overdue()
        await self._publish_incidents(found)
        if found or stage.released != before:
            self.incidents_unwritten = True
            return True
        return False

    async def checkpoint_incidents(self, stream: Any, ack: bool = True) -> None:
        # frames behind a piece lost for good, of a sender that fell silent: run them now
        await self._release_overdue_incidents()
        await self._write_incident_checkpoint(stream, ack)

    async def _write_incident_checkpoint(self, stream: Any, ack: bool = True) -> None:
        """Write the incident stage's checkpoint (after the incidents published so far are confirmed
        sent: ``_write_checkpoint``), then acknowledge the findings records it covers."""
        offset, blob = self.incident_stage.checkpoint()
        written = await self._write_checkpoint(self.config.topics.incident_checkpoint_partition, "incidents", blob)
        self.last_incident_checkpoint = time.monotonic()  # refused: tried again at the next interval
        if not written:
            self.incident_stage.checkpoint_refused()
            return
        self.incidents_unwritten = False
        events, self.held_incidents = self.held_incidents, []
        if ack and stream is not None:
            for ev in events:
                await stream.ack(ev)

    async def checkpoint_due(self, force: bool = False) -> None:
        async with self.lock:
            released: set[int] = set()
            for partition in sorted(self.detection.parts):
                # pieces held past the wait for the rest of their frame's share: a partition no
                # sender writes to any more (its agents killed) has no next record to run them with
                if await self._release_held(partition):
                    released.add(partition)
            now = time.monotonic()
            for partition in sorted(set(self.held) | self.unwritten):
                # a partition that ran held pieces is written at once, with no record to acknowledge:
                # until 2026-12-05 it was not (no events), the last checkpoint still held the group
                # while its records were acknowledged, and a restart from it ran the group again
                # (its reports sent twice, counted held_abandoned twice, its rows refused by the guard
                # as 'clock stepped back'); one refused is tried again at the interval, as any
                due = force or partition in released or \
                    now - self.last_checkpoint.get(partition, 0) >= self.config.checkpoint_interval_s
                if (self.held.get(partition) or partition in self.unwritten) and self._frames_stream is not None \
                        and due:
                    await self.checkpoint_partition(self._frames_stream, partition)
            if self.incidents_loaded:
                # no findings coming: what waits behind a lost piece (or a sender killed mid-frame)
                # still runs. A tick that ran or skipped frames writes the checkpoint at once, with
                # no record to acknowledge, as a partition that ran held pieces: until 2026-12-05 it
                # did not, the last checkpoint still held those frames while their records were
                # acknowledged, and a restart from it ran them again (their incidents published
                # twice, frame_incomplete / frame_missing counted twice); one refused is tried again
                # at the interval, as any
                ran = await self._release_overdue_incidents()
                due = force or ran or \
                    now - self.last_incident_checkpoint >= self.config.checkpoint_interval_s
                if (self.held_incidents or self.incidents_unwritten) and due:
                    await self._write_incident_checkpoint(self._findings_stream)

    def on_assigned(self, assigned: Any) -> None:
        """The group's assignment of this worker (all of it, each rebalance): the frames
        partitions among it are the ones on_piece processes. Does not await (see the receiver)."""
        self.assigned_frames = {tp.partition for tp in assigned if tp.topic == self.config.topics.frames}

    async def on_revoked(self, revoked: Any) -> None:
        """A partition leaves this worker: checkpoint it (fewer repeats for its next owner), drop it."""
        # before the lock: an event of the partition waiting for it (on_piece) is not processed
        self.assigned_frames -= {tp.partition for tp in revoked if tp.topic == self.config.topics.frames}
        for tp in revoked:  # its new owner reports the partition's lag
            self.store.set_consumer_lag(tp.topic, tp.partition, None)
        async with self.lock:
            for tp in revoked:
                if tp.topic == self.config.topics.frames and self.detection.owns(tp.partition):
                    try:  # no acks: the partition is gone; its next owner skips by offset
                        await self.checkpoint_partition(self._frames_stream, tp.partition, ack=False)
                    except Exception as exc:  # the next owner resumes from the previous checkpoint
                        self.health.problem("worker", "checkpoint_failed", detail=f"partition {tp.partition}: {exc}")
                        if self._undelivered is not None:
                            # a lost message may be of a partition this worker keeps: as on any failed
                            # send, only a restart from the last checkpoints sends it again
                            self.fatal(f"the checkpoint of revoked partition {tp.partition}", exc)
                            return
                    self.detection.drop(tp.partition)
                    self.held.pop(tp.partition, None)
                    self.unwritten.discard(tp.partition)
                elif tp.topic == self.config.topics.findings and self.incidents_loaded:
                    try:  # as a frames partition: its next owner runs fewer findings messages again
                        await self.checkpoint_incidents(self._findings_stream, ack=False)
                    except Exception as exc:  # the next owner resumes from the previous checkpoint
                        self.health.problem("worker", "checkpoint_failed", detail=f"incident stage: {exc}")
                        if self._undelivered is not None:
                            self.fatal("the checkpoint of the revoked incident stage", exc)
                            return
                    self.incident_stage = self._new_incident_stage()
                    self.incidents_loaded = False
                    self.incidents_unwritten = False  # its next owner loads the checkpoint written (or the one before)
                    self.external_positioned = False
                    await self._stop_external_reader()  # the stage's next owner reads the topic now
                    self.held_incidents = []
                    # its next owner publishes (and resolves) the incidents: they left this store's care
                    self.store.forget_incidents()

    # ---- agents' work ------------------------------------------------------------------
    async def dead_letter(self, message: Any, reason: str, detail: str, stage: str,
                          value: bytes | None = None, original_headers: Headers | None = None) -> None:
        """Send a record (or, with ``value``/``original_headers``, a part of it) to the dead letters,
        its value cut to the topic's message size (``capped_deadletter``). One the broker refuses
        all the same is counted, not fatal: the restarted worker would meet the same record, and
        be refused again, for good."""
        kept = list(headers_dict(message.headers).items()) if original_headers is None else original_headers
        headers = deadletter_headers(kept, detail or reason, stage, message.topic, message.partition, message.offset)
        headers.append(("foreshock-reason-code", reason.encode()))
        capped, headers = capped_deadletter(message.key, message.value if value is None else value, headers)
        where = f"{message.topic}/{message.partition}/{message.offset}"
        try:
            future = await self.deadletter_topic.send(key=message.key, value=capped, headers=headers, partition=0,
                                                      force=True)
        except Exception as exc:
            if not _refused(exc):
                raise
            self._dead_letter_refused(where, exc)
        else:  # confirmed before the next checkpoint, as every send (_confirm_sent)
            self._unconfirmed.append(asyncio.ensure_future(self._dead_letter_delivered(future, where)))
        self.health.dead_letters += 1
        self.counts["deadletters"] += 1

    async def _dead_letter_delivered(self, future: Awaitable[Any], where: str) -> None:
        """Wait for a dead letter's delivery; raise as any send when it failed, unless refused."""
        try:
            await future
        except Exception as exc:
            if not _refused(exc):
                raise
            self._dead_letter_refused(where, exc)

    def _dead_letter_refused(self, where: str, exc: BaseException) -> None:
        self.health.problem("worker", "deadletter_refused", detail=f"the dead letter of {where}: "
                                                                   f"{type(exc).__name__}: {exc}")

    async def on_piece(self, stream: Any, event: Any) -> None:
        self._frames_stream = stream
        message = event.message
        partition = message.partition
        async with self.lock:
            if partition not in self.assigned_frames:
                self._skip_unassigned(message)
                return
            if not self.detection.owns(partition):
                self.detection.load(partition, await self.read_checkpoint(partition),
                                    await self.end_offset(self.config.topics.frames, partition),
                                    await self.topic_id(self.config.topics.frames))
                self.last_checkpoint[partition] = time.monotonic()
            result = self.detection.process(partition, message.offset, message.value, message.headers)
            if result.skipped:
                self.counts["skipped"] += 1
                await stream.ack(event)
                return
            for dead in result.dead_letters:
                await self.dead_letter(message, dead.reason, dead.detail, "detect", dead.value, dead.headers)
            cut_reports = await self._send_findings(partition, result)
            if cut_reports:  # findings lost to the message size: counted per report, the record kept
                await self.dead_letter(message, "findings_too_large", "; ".join(cut_reports), "detect")
            if result.findings_message is not None:
                self.counts["pieces"] += result.pieces
                self.counts["records"] += 1
            self.held.setdefault(partition, []).append(event)
            if time.monotonic() - self.last_checkpoint.get(partition, 0) >= self.config.checkpoint_interval_s:
                await self.checkpoint_partition(stream, partition)

    async def _release_held(self, partition: int) -> bool:
        """Run the partition's pieces held past the wait (``DetectionStage.release_held``) and send
        what they produced, as ``on_piece`` a record's; True when any ran (the partition is then
        ``unwritten``: its checkpoint still holds them, though their records are acknowledged)."""
        result = self.detection.release_held(partition)
        if result.findings_message is None and not result.telemetry_messages:
            return False
        self.unwritten.add(partition)
        cut_reports = await self._send_findings(partition, result)
        if cut_reports:  # as on_piece's; no record of its own (its pieces' came before): the findings message
            offset = self.detection.parts[partition].offset
            message = types.SimpleNamespace(topic=self.config.topics.frames, partition=partition, offset=offset,
                                            key=str(partition).encode(), value=result.findings_message, headers=[])
            await self.dead_letter(message, "findings_too_large", "; ".join(cut_reports), "detect")
        return True

    async def _send_findings(self, partition: int, result: BundleResult) -> list[str]:
        """Send a detection result's forwarded rows, then its findings message, in parts where it
        would pass the topic's message size; returns the reports cut short (each counted)."""
        # same partition, before the findings: read first (several past the topic's message size)
        for value, headers in result.telemetry_messages:
            await self._send(self.findings_topic, key=str(partition).encode(), value=value, headers=headers,
                             partition=0)
        if result.findings_message is None:
            return []
        messages, cut_reports = split_findings(result.findings_message)
        for findings in messages:
            await self._send(self.findings_topic, key=str(partition).encode(), value=findings, partition=0)
        for detail in cut_reports:
            self.health.problem("worker", "findings_too_large", detail=f"partition {partition}: {detail}")
        return cut_reports

    def _skip_unassigned(self, message: Any) -> None:
        """Leave an event of a frames partition not assigned to this worker to its owner, which
        reads it from its checkpoint: not processed, not acknowledged (no commit may pass it),
        not a dead letter (nothing is wrong with it). Counted; logged once."""
        self.counts["not_assigned"] += 1
        self.health.not_assigned("worker")
        if not self._unassigned_logged:
            self._unassigned_logged = True
            log.info("%s/%d@%d: the partition is not assigned to this worker (revoked in a rebalance): left to "
                     "its owner (such events counted in foreshock_records_not_assigned_total and the worker's "
                     "status, 'not_assigned'; logged once)", message.topic, message.partition, message.offset)

    async def on_json(self, event: Any) -> None:
        message = event.message
        try:
            frames, bad = json_to_frames(message.value, self.config.topology)
        except Exception as exc:  # a record this worker cannot read must not end it (as_record_error)
            frames, bad = [], [(message.value or b"", str(as_record_error(exc)))]
        for raw, reason in bad:
            self.health.problem("route_json", "invalid_record", detail=reason)
            await self.dead_letter(message, "invalid_record", reason, "route_json", value=raw)
        agent = self.json_sender
        sent = time.time()
        builders: dict[int, BundleBuilder] = {}
        ready: list[tuple[int, list[Any], bool]] = []
        for frame in frames:
            self.json_seq += 1
            pieces = self.pmap.messages(frame)
            for index, (partition, piece) in enumerate(pieces):
                builder = builders.setdefault(partition, BundleBuilder())
                ready += [(partition, b, continues_after(b, pieces, partition, self.json_seq))
                          for b in builder.add((self.json_seq, index, len(pieces), piece))]
        ready += [(partition, b.take(), False) for partition, b in builders.items() if b.entries]
        for partition, entries, continues in ready:
            value, headers = encode_bundle(agent, sent, entries, topology=self.config.topology, continues=continues)
            await self._send(self.frames_topic, key=bundle_key(partition), value=value, partition=partition,
                             headers=headers)
        async with self.lock:
            await self._confirm_sent()  # faust acks this record when the handler returns

    async def _stop_external_reader(self) -> None:
        reader, self._external_reader = self._external_reader, None
        await _stop_reader(reader, "external.events")

    async def poll_external(self) -> None:
        """Hand the incident stage the external events published since the last call (without
        waiting: what the reader has fetched). Its first call after the stage was loaded seeks
        to the offset after the checkpoint's (the topic's start without one: the stage skips
        the events older than its first telemetry time allows, ``IncidentStage.add_external``)."""
        stage = self.incident_stage
        if not stage.external_targets:
            return
        if self._external_reader is None:
            self._external_reader = await self._consumer("external")
        reader = self._external_reader
        tp = TopicPartition(self.config.topics.external, 0)
        wait_ms = 0
        if not self.external_positioned:
            reader.assign([tp])
            if stage.external_offset >= 0:
                reader.seek(tp, stage.external_offset + 1)
            else:
                await reader.seek_to_beginning(tp)
            self.external_positioned = True
            # a reader just positioned has fetched nothing yet: without a wait, events already
            # on the topic reach the stage only with a later findings message, and a short
            # replay's last one can come first (a fresh-clone `make test` under load saw it)
            wait_ms = EXTERNAL_FIRST_FETCH_MS
        batch = (await reader.getmany(tp, timeout_ms=wait_ms)).get(tp, [])
        for record in batch:
            now = time.time()
            events, bad = parse_lines((record.value or b"").split(b"\n"), now + self.config.max_clock_ahead_s, now)
            if not stage.add_external(events, record.offset):
                continue  # already taken before the checkpoint this stage was loaded from
            for line in bad:
                where = f"{record.topic}/{record.partition}/{record.offset} line {line.position + 1}"
                self.health.problem(EXTERNAL_STAGE, line.reason, detail=f"{where}: {line.detail}")
                await self.dead_letter(record, "invalid_record", f"{line.reason}: {line.detail}", "external",
                                       value=line.raw)
            self.counts["external"] += len(events)

    async def on_findings(self, stream: Any, event: Any) -> None:
        self._findings_stream = stream
        message = event.message
        async with self.lock:
            if not self.incidents_loaded:
                self.incident_stage.load(await self.read_checkpoint(self.config.topics.incident_checkpoint_partition),
                                         await self.end_offset(self.config.topics.findings, 0),
                                         await self.topic_id(self.config.topics.findings))
                # the open incidents it took up are on this worker's /metrics from now: an engine
                # reports an incident only as it changes
                self.store.hold_incidents(self.incident_stage.open_incidents())
                self.incidents_loaded = True
                self.external_positioned = False
                self.last_incident_checkpoint = time.monotonic()
            await self.poll_external()  # before this message's findings, as the embedded feed before a frame
            if self.incident_stage.covered(message.offset):
                await stream.ack(event)
                return
            self.incident_stage.offset = message.offset
            telemetry = []
            reports = []
            try:
                if is_telemetry(message.headers):
                    for piece in decode_bundle(message.value, headers_dict(message.headers), self.config.topology,
                                               self.pmap, None):
                        if piece.error is not None or piece.frame is None:
                            raise piece.error or RecordError("undecodable", "forwarded telemetry")
                        telemetry.append((piece.info, piece.frame))
                else:
                    # without incident processors nothing reads the findings themselves
                    reports = decode_findings(message.value, with_findings=bool(self.incident_stage.processors))
            except Exception as exc:  # anything decoding raises; the processors' exceptions below end the worker
                error = as_record_error(exc)
                self.health.problem("incidents", error.reason, detail=error.detail)
                await self.dead_letter(message, error.reason, str(error), "incidents")
            else:
                for info, frame in telemetry:
                    self.incident_stage.observe_telemetry(info, frame)
                await self._publish_incidents([f for report in reports for f in self.incident_stage.observe(report)])
            self.held_incidents.append(event)
            if time.monotonic() - self.last_incident_checkpoint >= self.config.checkpoint_interval_s:
                await self.checkpoint_incidents(stream)

    def remove_data_dir(self) -> None:
        """Remove the data directory when this worker made it (a temporary folder)."""
        if self.owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def status(self) -> dict[str, Any]:
        return {"worker": self.config.worker_id, "role": self.config.role, "group": self.config.group,
                "partitions": sorted(self.detection.parts), **self.counts,
                "problems": self.health.total_problems()}


class _QuietWorker(faust.Worker):
    """faust's terminal spinner sets the root logger to DEBUG (its handler filters): every
    aiokafka/faust debug call then builds a log record, a measurable cost per message."""

    def __init__(self, *args: Any, outage: BrokerOutageLog | None = None, **kwargs: Any) -> None:
        self.outage = outage
        super().__init__(*args, **kwargs)

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        self.spinner = None
        super().on_setup_root_logger(logger, level)
        if self.outage is not None:  # (a handler's filter sees every logger's records; a logger's, its own)
            for handler in logger.handlers:
                handler.addFilter(self.outage)


def run_worker(config: WorkerConfig, loglevel: str = "warning") -> None:
    """Run until SIGTERM/SIGINT; serves /metrics when ``metrics_port`` is set."""
    worker = ForeshockWorker(config)
    server = None
    try:
        if config.metrics_port:  # (a taken port raises MetricsPortError, after which the data dir goes too)
            from foreshock.exporters.prometheus import serve

            server = serve(worker.store, host=config.metrics_host, port=config.metrics_port,
                           top_k=config.metrics_top_k)
        if config.detects:
            # before joining the group: no kernel loading on the first record. After /metrics is up: on
            # a fresh Numba cache this compiles for minutes, and the endpoint the start line names
            # refused connections meanwhile (until 2026-12-06)
            worker.detection.warm_up()
        _QuietWorker(worker.app, loglevel=loglevel, quiet=True, outage=worker.outage).execute_from_commandline()
    finally:
        if server is not None and isinstance(server, tuple):
            server[0].shutdown()
        worker.remove_data_dir()
        # the run's counts, whatever the log level (the agent prints its summary so): at the default
        # level (warning) a stopped worker said nothing, while the README sends readers to it
        print(f"worker stopped: {json.dumps(worker.status())}", file=sys.stderr, flush=True)
