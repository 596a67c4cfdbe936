"""Ingest agents: kafka-python producers that publish a source's frames to ``telemetry.frames``.

An agent owns one source (simulator, replay, dcgm scrape, nvidia-smi, NVML, InfiniBand sysfs,
DOM). It splits every frame into one piece per partition (``kafka_codec``) and, once, before
the first frame, publishes the topology the frames' slots refer to. Pieces wait per partition
for at most ``linger_ms`` (or until ``MAX_BUNDLE_BYTES`` of rows are waiting) and then travel
together as one message (a bundle): a live source's kinds of one tick share a message, a
replay at full speed fills them. Delivery: acks from all in-sync replicas, idempotent producer
(no duplicates or reordering from retries), retries until ``delivery_timeout_s`` — long enough
to ride out a broker restart; a message that still fails is counted (``send_failed``, per
piece) and logged, never dropped silently. While the broker is away, what waits for it is
bounded (``MAX_IN_FLIGHT_BYTES``): a replay or the simulator then waits for room, a live source
drops the bundle (``broker_backlog_full``, counted per piece). At the end of a run the broker
gets ``close``'s timeout to take what waits; what it has not taken by then is counted as failed.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import yaml

from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .kafka_codec import (BundleBuilder, BundleEntry, PartitionMap, bundle_key, continues_after, encode_bundle,
                          sender_id)
from .kafka_config import KafkaSettings, check_broker
from .kafka_topics import CHECKPOINT_MAX_BYTES, Topics, ensure_topics

log = logging.getLogger("foreshock.agent")

# kafka-python 3.0.x has no ``buffer_memory``: send() never blocks or refuses, and a message the
# broker cannot take stays in memory until its delivery timeout (120 s) expires it; with the
# broker away an agent grew by everything it read in that time (~1.2 MB of memory per MB sent).
# 256 MB is over 100 times what a node's live sources send in 120 s (kB/s) and more than a
# 4096-GPU simulator at real time sends in that time (~3 MB/s of rows, ~0.8 MB/s with LZ4), so
# only an outage (or a replay outrunning the broker, which then waits) reaches it, and it is
# still small beside a host that runs jobs.
MAX_IN_FLIGHT_BYTES = 256 * 1024 * 1024
# kafka-python's close() flushes first and raises if that times out: after close's own flush
# timed out, the producer gets this long to abort what it holds
FORCE_CLOSE_S = 5.0


def default_agent_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def topology_to_bytes(topology: Topology) -> bytes:
    """The topology file's mapping as JSON (a subset of YAML, so any YAML reader takes it):
    YAML's Python emitter needs seconds for a large cluster, JSON milliseconds."""
    return json.dumps(topology.to_dict(), separators=(",", ":"), default=str).encode()


def topology_from_bytes(data: bytes) -> Topology:
    try:
        mapping = json.loads(data)
    except ValueError:  # published as YAML by the first version
        mapping = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return Topology.from_dict(mapping, source="foreshock.topology topic")


@dataclass
class AgentStats:
    frames: int = 0
    samples: int = 0
    pieces: int = 0
    messages: int = 0
    bytes: int = 0
    failed: int = 0
    wall_s: float = 0.0
    # of ``failed``: pieces a live source dropped while the broker's backlog was full
    dropped: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0


class FramePublisher:
    """Publishes frames of one topology. ``publish`` from one thread; a background thread sends
    pieces that waited ``linger_ms`` (0 = send each frame's pieces at once, no thread).

    ``compression``: Arrow buffer compression of the messages (None, ``"lz4"``, ``"zstd"``).
    Measured on simulated telemetry: LZ4 cuts messages to ~28 % (zstd ~20 %) for ~0.15 CPU s
    per million samples at each end (zstd ~0.3), and saves the broker about a third of its CPU:
    LZ4 needs the least CPU in total.

    ``live``: whether the source reads the present (a poll's readings go stale while it waits).
    With ``max_in_flight_bytes`` of messages the broker has not yet taken, a live source's next
    bundle is dropped and counted (``broker_backlog_full``); any other source (a replay, the
    simulator) waits for room instead, at most ``delivery_timeout_s`` (by then every message
    waiting should be delivered or have failed) or until ``stop`` is set; after a wait that
    long in vain, its bundles too are dropped until the broker takes messages again.
    """

    def __init__(self, settings: KafkaSettings, topology: Topology, topics: Topics | None = None,
                 agent_id: str | None = None, health: PipelineHealth | None = None,
                 linger_ms: float = 50.0, delivery_timeout_s: float = 120.0, publish_topology: bool = True,
                 compression: str | None = "lz4", live: bool = False,
                 max_in_flight_bytes: int = MAX_IN_FLIGHT_BYTES, stop: threading.Event | None = None) -> None:
        from kafka import KafkaProducer

        self.settings = settings
        self.topology = topology
        self.health = health or PipelineHealth()
        self.agent_id = agent_id or default_agent_id()
        self.sender = sender_id(self.agent_id)  # what its messages carry: a restart starts a new sequence
        self.topics = ensure_topics(settings, topics or Topics())
        self.pmap = PartitionMap(topology, self.topics.partitions)
        self.compression = compression
        self.linger_s = max(0.0, linger_ms) / 1000.0
        self.live = live
        self.max_in_flight_bytes = max_in_flight_bytes
        self.delivery_timeout_s = delivery_timeout_s
        self.stats = AgentStats()
        self._seq = 0
        self._lock = threading.RLock()  # pending bundles and sending them, in order per partition
        self._pending: dict[int, BundleBuilder] = {}
        # messages sent and not yet delivered or failed: id -> (bytes, pieces). Not under _lock:
        # the producer's I/O thread settles them, and a send waiting for room holds _lock
        self._delivery = threading.Condition(threading.Lock())
        self._in_flight: dict[int, tuple[int, int]] = {}
        self._in_flight_bytes = 0
        self._message_ids = 0
        self._waited_logged = False
        self._backlog_stuck = False  # a source that can wait waited a whole delivery timeout in vain
        self._send_error: BaseException | None = None  # the last one _send_waiting raised (counted)
        self._stop = stop
        self._closed = threading.Event()
        self.producer = KafkaProducer(
            **settings.with_client_id(f"foreshock-agent-{self.agent_id}").kafka_python(),
            acks="all", enable_idempotence=True, linger_ms=5, batch_size=1 << 20,
            max_request_size=CHECKPOINT_MAX_BYTES,
            delivery_timeout_ms=int(delivery_timeout_s * 1000), request_timeout_ms=30_000,
            max_block_ms=int(delivery_timeout_s * 1000), retry_backoff_ms=200)
        if publish_topology:
            try:
                self.producer.send(self.topics.topology, key=b"topology",
                                   value=topology_to_bytes(topology)).get(timeout=30)
            except BaseException:
                # no publisher is returned for run_agent to close: the producer (its I/O thread
                # and connections) is closed here, without waiting for a broker that failed it
                self._force_close_producer()
                raise
        self._lingerer: threading.Thread | None = None
        if self.linger_s > 0:
            self._lingerer = threading.Thread(target=self._linger_loop, name="foreshock-agent-linger", daemon=True)
            self._lingerer.start()

    def publish(self, frame: Frame) -> int:
        """Queue one frame's pieces; returns the frame's sequence number. A bundle whose send
        fails (its pieces counted) does not keep the frame's other pieces from being queued and
        sent: the first error is raised once the whole frame was."""
        now = time.monotonic()
        error: Exception | None = None
        with self._lock:
            self._seq += 1
            seq = self._seq
            pieces = self.pmap.messages(frame)
            for index, (partition, piece) in enumerate(pieces):
                builder = self._pending.setdefault(partition, BundleBuilder())
                for entries in builder.add((seq, index, len(pieces), piece), now):
                    try:
                        self._send(partition, entries, continues_after(entries, pieces, partition, seq))
                    except Exception as exc:
                        error = error or exc
            self.stats.frames += 1
            self.stats.samples += len(frame)
            self.stats.by_kind[frame.kind] = self.stats.by_kind.get(frame.kind, 0) + len(frame)
            if error is not None:
                raise error
            if self.linger_s == 0:
                self._send_waiting()
        return seq

    def _send(self, partition: int, entries: list[BundleEntry], continues: bool = False) -> None:
        """Send one bundle. Its pieces have left their builder: if it cannot be sent they are
        counted as failed here (and the error raised), as a failed delivery counts them.
        ``continues``: its last frame has more pieces for the partition in the next bundle."""
        pieces = len(entries)
        what = f"partition {partition} seq {entries[0][0]}..{entries[-1][0]}"
        self.stats.pieces += pieces
        try:
            value, headers = encode_bundle(self.sender, time.time(), entries, self.compression,
                                           topology=self.topology, continues=continues)
            if not self._room_for(len(value)):
                self._count_failed(pieces, f"{what}: dropped unsent, the broker has not taken the "
                                   f"{self._in_flight_bytes:,} bytes sent before it", reason="broker_backlog_full")
                return
            future = self.producer.send(self.topics.frames, key=bundle_key(partition), value=value,
                                        partition=partition, headers=headers)
        except Exception as exc:
            self._count_failed(pieces, f"{what}: {type(exc).__name__}: {exc}")
            raise
        with self._delivery:
            self._message_ids += 1
            message = self._message_ids
            self._in_flight[message] = (len(value), pieces)
            self._in_flight_bytes += len(value)
        # registered after the message is counted in flight: a future already done runs them at once
        future.add_callback(self._delivered, message)
        future.add_errback(self._failed, message, what)
        self.stats.messages += 1
        self.stats.bytes += len(value)

    def _room_for(self, size: int) -> bool:
        """Whether a message of ``size`` bytes may be sent now: below the in-flight cap (or
        nothing in flight), else, for a source that can wait, once the broker has taken enough."""
        def room() -> bool:
            return not self._in_flight_bytes or self._in_flight_bytes + size <= self.max_in_flight_bytes

        def stopping() -> bool:
            return self._closed.is_set() or (self._stop is not None and self._stop.is_set())

        with self._delivery:
            if room():
                self._backlog_stuck = False
                return True
            if self.live or self._backlog_stuck:
                return False
            if not self._waited_logged:
                self._waited_logged = True
                log.warning("agent: the broker has not taken %s bytes: publishing waits for it (up to %.0f s; "
                            "logged once)", f"{self._in_flight_bytes:,}", self.delivery_timeout_s)
            deadline = time.monotonic() + self.delivery_timeout_s
            # in slices: a stop (SIGTERM) or close must not wait for a delivery
            while not room() and not stopping() and time.monotonic() < deadline:
                self._delivery.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            # a whole delivery timeout with nothing taken (kafka-python does not expire batches
            # while it has no producer id): the broker is away; bundles are dropped, without a
            # wait each, until it takes messages again
            self._backlog_stuck = not room() and not stopping()
            # stopping: send it anyway, close gives the broker its last chance and counts what it missed
            return not self._backlog_stuck

    def _send_waiting(self, older_than: float | None = None) -> None:
        """Send the waiting pieces of every partition (only those waiting since before ``older_than``).
        A partition whose send fails does not keep the others' pieces waiting: the first error is
        raised once all were tried (each failed send counted its pieces)."""
        error: Exception | None = None
        with self._lock:
            for partition, builder in self._pending.items():
                if builder.entries and (older_than is None or builder.since <= older_than):
                    try:
                        self._send(partition, builder.take())
                    except Exception as exc:
                        error = error or exc
        if error is not None:
            self._send_error = error
            raise error

    def _linger_loop(self) -> None:
        while not self._closed.wait(self.linger_s / 2):
            try:
                self._send_waiting(older_than=time.monotonic() - self.linger_s)
            except Exception as exc:  # never let the thread die silently: count, keep going
                if exc is not self._send_error:  # _send counted the pieces it could not send
                    self.health.problem("agent", "send_failed", detail=f"linger flush: {exc}")

    def _settle(self, message: int) -> int:
        """Take a message out of flight; its pieces (0 if close has already counted it)."""
        with self._delivery:
            size, pieces = self._in_flight.pop(message, (0, 0))
            self._in_flight_bytes -= size
            self._delivery.notify_all()
        return pieces

    def _delivered(self, message: int, _metadata: Any) -> None:
        self._settle(message)

    def _failed(self, message: int, what: str, exc: BaseException) -> None:
        # kafka-python calls an errback as f(*args, exception): the exception comes last
        self._count_failed(self._settle(message), f"{what}: {type(exc).__name__}: {exc}")

    def _count_failed(self, pieces: int, detail: str, reason: str = "send_failed") -> None:
        """Count pieces that will not reach the broker (``broker_backlog_full``: dropped unsent)."""
        if pieces:
            with self._delivery:  # the I/O thread's errbacks and the publishing thread both count
                self.stats.failed += pieces
                if reason == "broker_backlog_full":
                    self.stats.dropped += pieces
            self.health.problem("agent", reason, pieces, detail=detail)

    def in_flight(self) -> tuple[int, int]:
        """(messages, pieces) sent and neither delivered nor failed yet."""
        with self._delivery:
            return len(self._in_flight), sum(pieces for _, pieces in self._in_flight.values())

    def flush(self, timeout_s: float | None = None) -> None:
        self._send_waiting()
        self.producer.flush(timeout=timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Send what waits, give the broker ``timeout_s`` to take it, close the producer. Raises
        nothing for a broker that is away: what it has not taken is counted as failed
        (``send_failed``), so the run still ends with its summary."""
        self._closed.set()
        if self._lingerer is not None:
            self._lingerer.join(timeout=5)
        try:
            self._send_waiting()
        except Exception as exc:  # its pieces are counted; what was sent before may still get through
            log.warning("agent: a last send failed: %s: %s", type(exc).__name__, exc)
        try:
            self.producer.flush(timeout=timeout_s)
            self.producer.close(timeout=timeout_s)
            return
        except Exception as exc:  # KafkaTimeoutError: the broker is away
            messages, pieces = self.in_flight()
            log.warning("agent: closing with %d message(s), %d piece(s) the broker has not taken (%s: %s): "
                        "counted as send_failed", messages, pieces, type(exc).__name__, exc)
        self._force_close_producer()
        with self._delivery:  # what no errback settled: counted here, and a late errback counts nothing
            left, self._in_flight, self._in_flight_bytes = list(self._in_flight.values()), {}, 0
        self._count_failed(sum(pieces for _, pieces in left),
                           f"{len(left)} message(s) not delivered within {timeout_s:.0f} s of closing")

    def _force_close_producer(self) -> None:
        """Close the producer without waiting for the broker. kafka-python's close() flushes before
        anything else, and a flush that times out raises: its I/O thread would go on running and
        its batches never fail. Its own force close (what close() does once a graceful close timed
        out) fails them, their errbacks count them."""
        sender = getattr(self.producer, "_sender", None)
        if sender is not None and hasattr(sender, "force_close"):
            sender.force_close()
            sender.join(FORCE_CLOSE_S)
        try:
            self.producer.close(timeout=0)
        except Exception as exc:
            log.warning("agent: the Kafka producer did not close: %s: %s", type(exc).__name__, exc)


def run_agent(settings: KafkaSettings, frames: Iterable[Frame], topology: Topology | Callable[[], Topology | None],
              topics: Topics | None = None, agent_id: str | None = None, health: PipelineHealth | None = None,
              on_frame: Callable[[Frame], Any] | None = None, stop: threading.Event | None = None,
              **publisher_args: Any) -> AgentStats:
    """Publish every frame of a source until it ends (or ``stop`` is set), then flush.

    ``topology`` may be a callable for sources that learn it from their first poll (a dcgm
    scrape derives it from labels); the publisher is built when the first frame arrives. A
    broker away at the end raises nothing: what it did not take is in the stats' ``failed``.
    """
    check_broker(settings)  # clear errors (address, credentials) before any client retries
    publisher: FramePublisher | None = None
    start = time.perf_counter()
    try:
        for frame in frames:
            if stop is not None and stop.is_set():
                break
            if publisher is None:
                topo = topology() if callable(topology) else topology
                if topo is None:
                    raise RuntimeError("the source produced a frame before its topology was known")
                publisher = FramePublisher(settings, topo, topics, agent_id, health, stop=stop, **publisher_args)
            publisher.publish(frame)
            if on_frame is not None:
                on_frame(frame)
    finally:
        if publisher is not None:
            publisher.close()
    stats = publisher.stats if publisher is not None else AgentStats()
    stats.wall_s = time.perf_counter() - start
    return stats


def fetch_topology(settings: KafkaSettings, topics: Topics, timeout_s: float = 60.0,
                   waiting: Callable[[str], None] | None = None) -> Topology:
    """The latest topology an agent published (waits up to ``timeout_s`` for the first one; ``waiting``
    is told so once, when none is there yet: a worker started before its agents sat silent a minute)."""
    from kafka import KafkaConsumer, TopicPartition

    check_broker(settings)
    tp = TopicPartition(topics.topology, 0)
    consumer = KafkaConsumer(**settings.with_client_id(f"{settings.client_id}-topology").kafka_python(),
                             enable_auto_commit=False, max_partition_fetch_bytes=CHECKPOINT_MAX_BYTES,
                             fetch_max_bytes=CHECKPOINT_MAX_BYTES)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if topics.topology in consumer.topics():
                consumer.assign([tp])
                end = consumer.end_offsets([tp])[tp]
                if end > 0:
                    consumer.seek(tp, end - 1)
                    records = consumer.poll(timeout_ms=10_000).get(tp, [])
                    if records:
                        return topology_from_bytes(records[-1].value)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no topology on {topics.topology} after {timeout_s:.0f} s: start an agent "
                                   "first, or pass --topology")
            if waiting is not None:
                waiting(f"waiting up to {timeout_s:.0f} s for an agent's topology on {topics.topology} "
                        "(agents publish it when they start; or pass --topology)")
                waiting = None
            time.sleep(0.5)
    finally:
        consumer.close()
