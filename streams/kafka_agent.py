"""Ingest agents: kafka-python producers that publish a source's frames to ``telemetry.frames``.

An agent owns one source (simulator, replay, dcgm scrape, nvidia-smi, NVML, InfiniBand sysfs,
DOM). For every frame it publishes one Arrow IPC piece per partition (``kafka_codec``), and
once, before the first frame, the topology the frames' slots refer to. Delivery: acks from all
in-sync replicas, idempotent producer (no duplicates or reordering from retries), retries
until ``delivery_timeout_s`` — long enough to ride out a broker restart; a piece that still
fails is counted (``send_failed``) and logged, never dropped silently.
"""

from __future__ import annotations

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

from .kafka_codec import PartitionMap, piece_headers, piece_key
from .kafka_config import KafkaSettings, check_broker
from .kafka_topics import CHECKPOINT_MAX_BYTES, Topics, ensure_topics

log = logging.getLogger("foreshock.agent")


def default_agent_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def topology_to_bytes(topology: Topology) -> bytes:
    return yaml.safe_dump(topology.to_dict(), sort_keys=False).encode()


def topology_from_bytes(data: bytes) -> Topology:
    return Topology.from_dict(yaml.safe_load(data), source="foreshock.topology topic")


@dataclass
class AgentStats:
    frames: int = 0
    samples: int = 0
    pieces: int = 0
    bytes: int = 0
    failed: int = 0
    wall_s: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0


class FramePublisher:
    """Publishes frames of one topology. Thread-compatible: call from one thread."""

    def __init__(self, settings: KafkaSettings, topology: Topology, topics: Topics | None = None,
                 agent_id: str | None = None, health: PipelineHealth | None = None,
                 linger_ms: int = 5, delivery_timeout_s: float = 120.0, publish_topology: bool = True) -> None:
        from kafka import KafkaProducer

        self.settings = settings
        self.topology = topology
        self.health = health or PipelineHealth()
        self.agent_id = agent_id or default_agent_id()
        self.topics = ensure_topics(settings, topics or Topics())
        self.pmap = PartitionMap(topology, self.topics.partitions)
        self.stats = AgentStats()
        self._seq = 0
        self._lock = threading.Lock()
        self.producer = KafkaProducer(
            **settings.with_client_id(f"foreshock-agent-{self.agent_id}").kafka_python(),
            acks="all", enable_idempotence=True, linger_ms=linger_ms, batch_size=1 << 20,
            max_request_size=CHECKPOINT_MAX_BYTES,
            delivery_timeout_ms=int(delivery_timeout_s * 1000), request_timeout_ms=30_000,
            max_block_ms=int(delivery_timeout_s * 1000), retry_backoff_ms=200)
        if publish_topology:
            self.producer.send(self.topics.topology, key=b"topology", value=topology_to_bytes(topology)).get(timeout=30)

    def publish(self, frame: Frame, sent: float | None = None) -> int:
        """Send one frame as one piece per partition; returns the frame's sequence number."""
        self._seq += 1
        seq = self._seq
        sent = time.time() if sent is None else sent
        messages = self.pmap.messages(frame)
        for index, (partition, piece) in enumerate(messages):
            value = piece.to_ipc()
            future = self.producer.send(self.topics.frames, key=piece_key(frame.kind, partition), value=value,
                                        partition=partition,
                                        headers=piece_headers(frame.kind, self.agent_id, seq, index, len(messages), sent))
            future.add_errback(self._failed, frame.kind, seq, index)
            self.stats.pieces += 1
            self.stats.bytes += len(value)
        self.stats.frames += 1
        self.stats.samples += len(frame)
        self.stats.by_kind[frame.kind] = self.stats.by_kind.get(frame.kind, 0) + len(frame)
        return seq

    def _failed(self, exc: BaseException, kind: str, seq: int, part: int) -> None:
        with self._lock:
            self.stats.failed += 1
        self.health.problem("agent", "send_failed", detail=f"{kind} piece seq={seq} part={part}: {exc}")

    def flush(self, timeout_s: float | None = None) -> None:
        self.producer.flush(timeout=timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        try:
            self.producer.flush(timeout=timeout_s)
        finally:
            self.producer.close(timeout=timeout_s)


def run_agent(settings: KafkaSettings, frames: Iterable[Frame], topology: Topology | Callable[[], Topology | None],
              topics: Topics | None = None, agent_id: str | None = None, health: PipelineHealth | None = None,
              on_frame: Callable[[Frame], Any] | None = None, stop: threading.Event | None = None,
              **publisher_args: Any) -> AgentStats:
    """Publish every frame of a source until it ends (or ``stop`` is set), then flush.

    ``topology`` may be a callable for sources that learn it from their first poll (a dcgm
    scrape derives it from labels); the publisher is built when the first frame arrives.
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
                publisher = FramePublisher(settings, topo, topics, agent_id, health, **publisher_args)
            publisher.publish(frame)
            if on_frame is not None:
                on_frame(frame)
    finally:
        if publisher is not None:
            publisher.close()
    stats = publisher.stats if publisher is not None else AgentStats()
    stats.wall_s = time.perf_counter() - start
    return stats


def fetch_topology(settings: KafkaSettings, topics: Topics, timeout_s: float = 60.0) -> Topology:
    """The latest topology an agent published (waits up to ``timeout_s`` for the first one)."""
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
            time.sleep(0.5)
    finally:
        consumer.close()
