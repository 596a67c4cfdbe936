"""The Kafka topics of the distributed pipeline, and creating them.

==========================  ==========  ============================================================
topic                       partitions  holds
==========================  ==========  ============================================================
``telemetry.frames``        P           Arrow IPC frame pieces from ingest agents (one piece per
                                        source frame and partition, several pieces per message;
                                        see ``kafka_codec``)
``telemetry.json``          P           JSON lines from outside producers; workers route them into
                                        ``telemetry.frames``
``foreshock.findings``      1           what the detectors found, one JSON message per frames
                                        message (and the telemetry incident processors read)
``foreshock.incidents``     1           incidents built from all findings
``foreshock.deadletter``    1           undecodable or invalid records, reason in a header
``foreshock.checkpoints``   P + 1       detector state per frames partition (partition P: the
                                        incident stage); compacted, last record = latest
``foreshock.topology``      1           the cluster topology (JSON, read as YAML too) agents publish;
                                        compacted
``external.events``         1           outside fault/alert events as JSON lines (``{"node", "time",
                                        "type", "severity"}``, one or more per record) from any
                                        producer; the worker with the incident stage groups them
==========================  ==========  ============================================================

A ``namespace`` prefixes every name so that several pipelines (or tests) share one broker.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from .kafka_config import KafkaConnectError, KafkaSettings, check_broker

log = logging.getLogger("foreshock.kafka")

DEFAULT_PARTITIONS = 8
# Checkpoints of large topologies are bigger than Kafka's 1 MB default message size.
CHECKPOINT_MAX_BYTES = 64 * 1024 * 1024
# Frames bundles (up to 12 MB of rows, kafka_codec.MAX_BUNDLE_BYTES), the findings and forwarded
# telemetry made from them, and dead-lettered bundles exceed the 1 MB default too: fewer, larger
# messages cost the agent, the broker and the workers less per sample.
BUNDLE_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Topics:
    namespace: str = ""
    partitions: int = DEFAULT_PARTITIONS

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {self.partitions}")

    @property
    def frames(self) -> str:
        return f"{self.namespace}telemetry.frames"

    @property
    def json(self) -> str:
        return f"{self.namespace}telemetry.json"

    @property
    def findings(self) -> str:
        return f"{self.namespace}foreshock.findings"

    @property
    def incidents(self) -> str:
        return f"{self.namespace}foreshock.incidents"

    @property
    def deadletter(self) -> str:
        return f"{self.namespace}foreshock.deadletter"

    @property
    def checkpoints(self) -> str:
        return f"{self.namespace}foreshock.checkpoints"

    @property
    def topology(self) -> str:
        return f"{self.namespace}foreshock.topology"

    @property
    def external(self) -> str:
        return f"{self.namespace}external.events"

    @property
    def incident_checkpoint_partition(self) -> int:
        return self.partitions

    def specs(self) -> dict[str, dict[str, Any]]:
        """Create-topic arguments for kafka-python's admin client, by topic name."""
        compacted = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1",
                     "segment.ms": "600000"}
        bundles = {"max.message.bytes": str(BUNDLE_MAX_MESSAGE_BYTES)}
        return {
            self.frames: {"num_partitions": self.partitions, "configs": dict(bundles)},
            self.json: {"num_partitions": self.partitions},
            self.findings: {"num_partitions": 1, "configs": dict(bundles)},
            self.incidents: {"num_partitions": 1},
            self.deadletter: {"num_partitions": 1, "configs": dict(bundles)},  # whole bundles, when unreadable
            self.checkpoints: {"num_partitions": self.partitions + 1,
                               "configs": {**compacted, "max.message.bytes": str(CHECKPOINT_MAX_BYTES)}},
            self.topology: {"num_partitions": 1, "configs": {**compacted, "max.message.bytes": str(CHECKPOINT_MAX_BYTES)}},
            self.external: {"num_partitions": 1},  # one partition: read in order by the incident stage
        }


def ensure_topics(settings: KafkaSettings, topics: Topics, timeout_s: float = 30.0) -> Topics:
    """Create the missing topics; return ``topics`` with the frames topic's real partition count.

    An existing frames topic keeps its partition count (repartitioning would move entities
    between workers' state); the checkpoints topic must then have one more partition.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError

    check_broker(settings)
    admin = KafkaAdminClient(**settings.with_client_id(f"{settings.client_id}-admin").kafka_python(),
                             request_timeout_ms=int(timeout_s * 1000))
    try:
        existing = {t["name"]: len(t["partitions"]) for t in admin.describe_topics()
                    if not t.get("error_code")}
        if topics.frames in existing and existing[topics.frames] != topics.partitions:
            topics = Topics(topics.namespace, existing[topics.frames])
        missing = {name: {"replication_factor": -1, **spec} for name, spec in topics.specs().items()
                   if name not in existing}
        if missing:
            try:
                admin.create_topics(missing, timeout_ms=int(timeout_s * 1000), wait_for_metadata=True)
            except TopicAlreadyExistsError:
                pass  # another agent or worker created them at the same moment
        deadline = time.monotonic() + timeout_s
        while True:
            counts = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(list(topics.specs()))
                      if not t.get("error_code")}
            if all(counts.get(n) for n in topics.specs()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        want = topics.specs()
        for name, spec in want.items():
            if counts.get(name) != spec["num_partitions"]:
                raise KafkaConnectError(f"topic {name} has {counts.get(name)} partitions, expected "
                                        f"{spec['num_partitions']} (frames topic has {topics.partitions})")
        _raise_message_limits(admin, [n for n in (topics.frames, topics.findings, topics.deadletter) if n in existing])
    finally:
        admin.close()
    return topics


def _raise_message_limits(admin: Any, names: list[str]) -> None:
    """Topics made by an earlier version keep the broker's 1 MB message limit, too small for
    today's bundles: raise it (an incremental change of that one setting). Without the right
    to, say so: the agent's oversized messages would fail (counted as ``send_failed``)."""
    from kafka.admin import ConfigResource, ConfigResourceType

    if not names:
        return
    key = "max.message.bytes"
    try:
        found = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n, configs={key: None})
                                        for n in names], config_filter="all").get("topic", {})
        low = [n for n in names if int(found.get(n, {}).get(key, {}).get("value", 0)) < BUNDLE_MAX_MESSAGE_BYTES]
        if low:
            admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, n, configs={key: str(BUNDLE_MAX_MESSAGE_BYTES)})
                                 for n in low])
            log.info("raised %s of %s to %d", key, ", ".join(low), BUNDLE_MAX_MESSAGE_BYTES)
    except Exception as exc:  # e.g. no ALTER_CONFIGS right: the topics still work for smaller messages
        log.warning("could not raise %s of %s to %d (%s: %s); ask an operator to, or frames messages over the "
                    "limit fail", key, ", ".join(names), BUNDLE_MAX_MESSAGE_BYTES, type(exc).__name__, exc)
