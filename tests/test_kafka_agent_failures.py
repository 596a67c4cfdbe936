"""The ingest agent when the broker fails it, without a broker: failed deliveries are counted per
piece (on the agent's /metrics too), what waits for an absent broker is bounded, and a broker
away at the end of a run still ends it with its summary and every undelivered piece counted.

Futures are kafka-python's own (``kafka.future.Future``, what the producer's futures build on);
the close tests use kafka-python's real producer aimed at a closed port, its metadata filled in
as if learned while the broker was up."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Iterator

import numpy as np
import pytest
from click.testing import CliRunner
from kafka.errors import KafkaTimeoutError
from kafka.future import Future
from prometheus_client import CollectorRegistry

from foreshock.frames import Frame
from foreshock.streams import kafka_agent, kafka_config
from foreshock.streams.kafka_agent import FramePublisher
from foreshock.streams.kafka_config import KafkaSettings
from foreshock.streams.kafka_topics import Topics

CLOSED_PORT = "127.0.0.1:9"  # nothing listens there: every connection is refused at once


class FakeProducer:
    """Takes every message and leaves its future undecided: the test decides it."""

    def __init__(self, **config: Any) -> None:
        self.futures: list[Future] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None, partition: int | None = None,
             headers: list | None = None) -> Future:
        self.futures.append(Future())
        return self.futures[-1]

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's topics exist (ensure_topics talks to the broker)."""
    monkeypatch.setattr(kafka_agent, "ensure_topics", lambda settings, topics: topics)


def publisher(monkeypatch: pytest.MonkeyPatch, topology: Any, producer: type = FakeProducer, partitions: int = 2,
              **options: Any) -> FramePublisher:
    import kafka

    monkeypatch.setattr(kafka, "KafkaProducer", producer)
    options.setdefault("linger_ms", 0)
    return FramePublisher(KafkaSettings(CLOSED_PORT), topology, Topics("t.", partitions), "agent-t",
                          publish_topology=False, **options)


def gpu_frame(topology: Any, t: float = 0.0) -> Frame:
    n = topology.size("gpu")
    return Frame("gpu", np.full(n, t), np.arange(n, dtype=np.int32), {"gpu_temp": np.full(n, 50.0)})


def problems_on_metrics(pub: FramePublisher, reason: str) -> float | None:
    from foreshock.exporters.prometheus import HealthCollector

    registry = CollectorRegistry()
    registry.register(HealthCollector(pub.health, lambda: "c1"))
    return registry.get_sample_value("foreshock_input_problems_total",
                                     {"cluster": "c1", "stage": "agent", "reason": reason})


def test_a_failed_delivery_counts_its_pieces_and_reaches_metrics(no_broker: None, monkeypatch: pytest.MonkeyPatch,
                                                                  small_topology: Any) -> None:
    """kafka-python calls an errback with the exception last: one declared exception-first added
    the description to the count, a TypeError kafka-python swallowed, so nothing was counted."""
    pub = publisher(monkeypatch, small_topology)
    pub.publish(gpu_frame(small_topology))
    futures = pub.producer.futures
    assert len(futures) == 2 and pub.stats.pieces >= 2  # one bundle per partition
    for future in futures:
        future.failure(KafkaTimeoutError("Expiring 1 record(s): delivery timeout"))
    assert pub.stats.failed == pub.stats.pieces
    assert pub.health.problems[("agent", "send_failed")] == pub.stats.pieces
    assert problems_on_metrics(pub, "send_failed") == pub.stats.pieces
    assert pub.in_flight() == (0, 0)


def test_a_delivered_message_leaves_flight_uncounted(no_broker: None, monkeypatch: pytest.MonkeyPatch,
                                            small_topology: Any) -> None:
    pub = publisher(monkeypatch, small_topology)
    pub.publish(gpu_frame(small_topology))
    assert pub.in_flight()[0] == 2
    for future in pub.producer.futures:
        future.success(None)
    assert pub.stats.failed == 0 and pub.in_flight() == (0, 0) and not pub.health.problems


def test_a_live_source_drops_what_the_broker_has_no_room_for(no_broker: None, monkeypatch: pytest.MonkeyPatch,
                                                             small_topology: Any) -> None:
    """kafka-python 3.0 has no buffer_memory: with the broker away, every message stayed in
    memory until its delivery timeout. Over the cap a live source drops its bundle, counted."""
    pub = publisher(monkeypatch, small_topology, partitions=1, live=True, max_in_flight_bytes=1)
    frames = [gpu_frame(small_topology, float(t)) for t in range(4)]
    for frame in frames[:3]:
        pub.publish(frame)
    assert len(pub.producer.futures) == 1  # the first message only: the broker has not taken it
    assert pub.stats.pieces == 3 and pub.stats.failed == pub.stats.dropped == 2
    assert pub.health.problems[("agent", "broker_backlog_full")] == 2
    assert problems_on_metrics(pub, "broker_backlog_full") == 2
    pub.producer.futures[0].success(None)  # the broker took it: room again
    pub.publish(frames[3])
    assert len(pub.producer.futures) == 2 and pub.stats.dropped == 2


def test_a_failed_delivery_frees_its_room_too(no_broker: None, monkeypatch: pytest.MonkeyPatch,
                                              small_topology: Any) -> None:
    pub = publisher(monkeypatch, small_topology, partitions=1, live=True, max_in_flight_bytes=1)
    pub.publish(gpu_frame(small_topology, 0.0))
    pub.producer.futures[0].failure(KafkaTimeoutError("delivery timeout"))
    pub.publish(gpu_frame(small_topology, 1.0))
    assert len(pub.producer.futures) == 2 and pub.stats.dropped == 0 and pub.stats.failed == 1


def test_a_replay_waits_for_room_instead_of_dropping(no_broker: None, monkeypatch: pytest.MonkeyPatch,
                                                     small_topology: Any) -> None:
    pub = publisher(monkeypatch, small_topology, partitions=1, max_in_flight_bytes=1, delivery_timeout_s=60.0)
    pub.publish(gpu_frame(small_topology, 0.0))
    taken = threading.Timer(0.4, pub.producer.futures[0].success, (None,))
    started = time.monotonic()
    taken.start()
    pub.publish(gpu_frame(small_topology, 1.0))
    assert 0.3 < time.monotonic() - started < 10
    assert len(pub.producer.futures) == 2 and pub.stats.failed == 0


def test_a_replay_waits_at_most_a_delivery_timeout_then_drops_until_the_broker_takes_again(
        no_broker: None, monkeypatch: pytest.MonkeyPatch, small_topology: Any) -> None:
    """kafka-python expires no batch while it has no producer id: a wait for room must end."""
    # (a delivery timeout long enough that no wait at all and a second wait stay far apart on a
    # loaded machine)
    pub = publisher(monkeypatch, small_topology, partitions=1, max_in_flight_bytes=1, delivery_timeout_s=2.0)
    pub.publish(gpu_frame(small_topology, 0.0))
    started = time.monotonic()
    pub.publish(gpu_frame(small_topology, 1.0))
    assert time.monotonic() - started >= 2.0 and pub.stats.dropped == 1
    started = time.monotonic()
    pub.publish(gpu_frame(small_topology, 2.0))  # no second wait in vain per bundle (that took 2 s)
    assert time.monotonic() - started < 1.0 and pub.stats.dropped == 2
    pub.producer.futures[0].success(None)
    pub.publish(gpu_frame(small_topology, 3.0))
    assert len(pub.producer.futures) == 2 and pub.stats.dropped == 2


def test_a_stop_ends_the_wait_for_room(no_broker: None, monkeypatch: pytest.MonkeyPatch, small_topology: Any) -> None:
    stop = threading.Event()
    pub = publisher(monkeypatch, small_topology, partitions=1, max_in_flight_bytes=1, delivery_timeout_s=60.0,
                    stop=stop)
    pub.publish(gpu_frame(small_topology, 0.0))
    timer = threading.Timer(0.3, stop.set)
    started = time.monotonic()
    timer.start()
    pub.publish(gpu_frame(small_topology, 1.0))
    assert time.monotonic() - started < 5
    assert len(pub.producer.futures) == 2 and pub.stats.dropped == 0  # sent: close gives it its chance


class RefusingProducer(FakeProducer):
    def send(self, *args: Any, **kwargs: Any) -> Future:
        raise KafkaTimeoutError("Failed to update metadata after 120.0 secs.")


def test_a_lingering_bundle_the_producer_refuses_counts_its_pieces(no_broker: None, monkeypatch: pytest.MonkeyPatch,
                                                                   small_topology: Any) -> None:
    """The linger thread takes a partition's pieces out of their builder before sending them: a
    send that raised lost them all, counted as one problem and not as failed pieces."""
    pub = publisher(monkeypatch, small_topology, producer=RefusingProducer, linger_ms=20)
    frame = gpu_frame(small_topology)
    pieces = len(pub.pmap.messages(frame))
    try:
        pub.publish(frame)
        deadline = time.monotonic() + 5
        while pub.stats.failed < pieces and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # and nothing more is counted on the thread's next turns
    finally:
        pub.close(timeout_s=0.1)
    assert pub.stats.failed == pieces == pub.stats.pieces
    assert pub.health.problems[("agent", "send_failed")] == pieces


class UnflushableProducer(FakeProducer):
    def flush(self, timeout: float | None = None) -> None:
        raise KafkaTimeoutError("Timeout waiting for future")

    def close(self, timeout: float | None = None) -> None:
        self.flush(timeout)


def test_close_counts_what_the_broker_never_took_once(no_broker: None, monkeypatch: pytest.MonkeyPatch,
                                                      small_topology: Any) -> None:
    pub = publisher(monkeypatch, small_topology, producer=UnflushableProducer)
    pub.publish(gpu_frame(small_topology))
    pub.close(timeout_s=0.1)  # raises nothing
    assert pub.stats.failed == pub.stats.pieces > 0
    for future in pub.producer.futures:  # an errback after close: already counted
        future.failure(KafkaTimeoutError("delivery timeout"))
    assert pub.stats.failed == pub.stats.pieces
    assert pub.health.problems[("agent", "send_failed")] == pub.stats.pieces


@pytest.fixture
def broker_gone(monkeypatch: pytest.MonkeyPatch, no_broker: None) -> Iterator[list]:
    """kafka-python's real producer, the broker gone since the agent learned its topics."""
    import kafka

    producers: list = []

    class Producer(kafka.KafkaProducer):  # type: ignore[misc]
        def __init__(self, **config: Any) -> None:
            super().__init__(**config, api_version=(3, 0))  # no version probe
            metadata = self._metadata
            metadata.partitions_for_topic = lambda topic: set(range(8))
            metadata.available_partitions_for_topic = lambda topic: set(range(8))
            known = metadata.topics
            metadata.topics = lambda *args, **kwargs: set(known(*args, **kwargs)) | {"t.telemetry.frames"}
            producers.append(self)

    monkeypatch.setattr(kafka, "KafkaProducer", Producer)
    yield producers
    for producer in producers:  # one the agent left open: its I/O thread would outlive the test
        if not producer._closed:
            producer._sender.force_close()
            producer._sender.join(5)


def test_close_with_the_broker_away_closes_the_producer_and_counts_every_piece(
        broker_gone: list, monkeypatch: pytest.MonkeyPatch, small_topology: Any) -> None:
    """kafka-python's close() flushes first: after close's own flush timed out it raised again,
    leaving the producer open, its I/O thread running and its batches undecided."""
    import kafka

    pub = publisher(monkeypatch, small_topology, producer=kafka.KafkaProducer, partitions=8)
    pub.publish(gpu_frame(small_topology))
    started = time.monotonic()
    pub.close(timeout_s=0.5)
    assert time.monotonic() - started < kafka_agent.FORCE_CLOSE_S + 5
    producer = broker_gone[0]
    assert producer._closed and not producer._sender.is_alive()
    assert pub.stats.failed == pub.stats.pieces > 0 and pub.in_flight() == (0, 0)
    assert pub.health.problems[("agent", "send_failed")] == pub.stats.pieces


def test_the_agent_command_with_the_broker_away_at_the_end_prints_its_summary_and_fails(
        broker_gone: list, monkeypatch: pytest.MonkeyPatch) -> None:
    from foreshock.cli import agent

    monkeypatch.setattr(kafka_agent, "check_broker", lambda settings: None)
    monkeypatch.setattr(kafka_config, "check_broker", lambda settings: None)
    init, close = FramePublisher.__init__, FramePublisher.close

    def without_topology(self: FramePublisher, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **{**kwargs, "publish_topology": False})  # the broker took it before it left

    monkeypatch.setattr(FramePublisher, "__init__", without_topology)
    monkeypatch.setattr(FramePublisher, "close", lambda self, timeout_s=30.0: close(self, 0.5))
    result = CliRunner().invoke(agent.command, ["--source", "simulator", "--kafka", CLOSED_PORT, "--namespace", "t.",
                                                "--gpus", "64", "--duration", "5", "--speed", "1000",
                                                "--linger-ms", "0"])
    assert result.exit_code == 1, result.output
    assert "could not be delivered" in result.output
    summary = json.loads(next(line for line in result.output.splitlines() if line.startswith("{")))
    assert summary["send_failed"] == summary["pieces"] > 0 and summary["backlog_dropped"] == 0
    assert broker_gone and all(p._closed for p in broker_gone)


def test_a_publisher_whose_topology_send_fails_closes_its_producer(broker_gone: list, monkeypatch: pytest.MonkeyPatch,
                                                                   small_topology: Any) -> None:
    """The broker went away between ensure_topics and the topology's send: the send raised out of
    FramePublisher's constructor, run_agent had no publisher to close, and the producer's I/O
    thread and connections stayed behind."""
    import kafka

    real_send = kafka.KafkaProducer.send

    class TimedOut:
        def get(self, timeout: float | None = None) -> None:
            raise KafkaTimeoutError(f"Timeout after waiting for {timeout} secs.")

    def send_that_times_out(self: Any, topic: str, **kwargs: Any) -> TimedOut:
        # a message waits in the producer, undelivered (on the topic its metadata was given)
        real_send(self, "t.telemetry.frames", partition=0, **kwargs)
        return TimedOut()

    monkeypatch.setattr(kafka.KafkaProducer, "send", send_that_times_out)
    monkeypatch.setattr(kafka_agent, "check_broker", lambda settings: None)
    with pytest.raises(KafkaTimeoutError):
        kafka_agent.run_agent(KafkaSettings(CLOSED_PORT), [gpu_frame(small_topology)], small_topology,
                              Topics("t.", 8), "agent-t", linger_ms=0)
    (producer,) = broker_gone
    assert producer._closed and not producer._sender.is_alive()


class FirstSendRefusingProducer(FakeProducer):
    def send(self, *args: Any, **kwargs: Any) -> Future:
        if not self.futures and not getattr(self, "refused", False):
            self.refused = True
            raise KafkaTimeoutError("Failed to update metadata after 120.0 secs.")
        return super().send(*args, **kwargs)


def test_a_send_failing_mid_frame_still_queues_and_counts_the_frame_s_other_pieces(
        no_broker: None, monkeypatch: pytest.MonkeyPatch, small_topology: Any) -> None:
    """A frame with more than a bundle of rows for one partition sends bundles while it is queued:
    when one of those sends raised, the frame's later pieces were neither queued nor counted as
    failed, and the summary did not show them. Now each failed send counts its own pieces, the
    rest of the frame is queued (sent at close), and the error is raised after."""
    from functools import partial

    from foreshock.streams.kafka_codec import BundleBuilder

    monkeypatch.setattr(kafka_agent, "BundleBuilder", partial(BundleBuilder, max_bytes=1))  # a bundle a piece
    pub = publisher(monkeypatch, small_topology, producer=FirstSendRefusingProducer, linger_ms=1000)
    frame = gpu_frame(small_topology)
    pieces = len(pub.pmap.messages(frame))
    assert pieces >= 2
    with pytest.raises(KafkaTimeoutError):
        pub.publish(frame)
    pub.close(timeout_s=0.1)
    assert pub.stats.pieces == pieces and pub.stats.failed == 1 and pub.stats.frames == 1
    assert len(pub.producer.futures) == pieces - 1
