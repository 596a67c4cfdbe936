"""A Kafka worker whose broker goes away (stop 66's audit): aiokafka's clients logged every retry
(14,606 lines in a 2-minute outage) and nothing was counted in ``foreshock_input_problems_total``.
``BrokerOutageLog`` counts each second of connection errors as ``worker/broker_unreachable``, logs
an outage's first error and holds the rest back, and says when records flow again."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from foreshock.health import PipelineHealth
from foreshock.streams.faust_app import BrokerOutageLog
from kafka_support import free_ports, private_broker, terminate  # noqa: F401


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(name: str, message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, (), None)


REFUSED = "Unable connect to node with id 1: [Errno 111] Connect call failed ('127.0.0.1', 9092)"


def test_an_outage_logs_its_first_error_and_counts_each_second_of_them() -> None:
    health, clock = PipelineHealth(), Clock()
    outage = BrokerOutageLog(health, clock=clock)
    passed = []
    for step in range(50):  # 5 s of errors, ten a second, from three clients
        clock.now = 1000.0 + step / 10
        for name, text in (("aiokafka", REFUSED), ("aiokafka.consumer.fetcher", "Failed fetch messages from 1: "
                           "NodeNotReadyError: Attempt to send a request to node which is not ready (node id 1)."),
                           ("aiokafka.producer.sender", "Got error produce response: NodeNotReadyError: x"),
                           ("kafka.cluster", "No node available for metadata refresh - backoff/retry")):
            passed.append(outage.filter(record(name, text, logging.WARNING if "produce" in text else logging.ERROR)))
    assert passed.count(True) == 1 and passed[0]  # the outage's first error, as aiokafka wrote it
    assert health.problems[("worker", "broker_unreachable")] == 5  # one per second with errors
    assert outage.held_back == 199


def test_other_records_pass_and_count_nothing() -> None:
    health = PipelineHealth()
    outage = BrokerOutageLog(health, clock=Clock())
    assert outage.filter(record("foreshock.worker", REFUSED))  # not a client library's
    assert outage.filter(record("aiokafka", REFUSED, logging.INFO))  # under warning: the handler's level decides
    assert outage.filter(record("aiokafka.consumer.group_coordinator", "Heartbeat session expired", logging.WARNING))
    assert outage.filter(record("faust.transport.drivers.aiokafka", "Timer overlapping", logging.WARNING))
    # a group's coordinator moving to another live broker is no outage
    assert outage.filter(record("aiokafka.consumer.group_coordinator", "Marking the coordinator dead (node 1)for "
                                "group foreshock.", logging.WARNING))
    assert not health.problems


def test_records_flowing_again_end_the_outage_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    health, clock = PipelineHealth(), Clock()
    outage = BrokerOutageLog(health, clock=clock)
    for step in range(31):
        clock.now = 1000.0 + step
        outage.filter(record("aiokafka", REFUSED))
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        outage.answered()
        outage.answered()  # once: nothing going on now
    said = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
    assert len(said) == 1 and "after 30 s" in said[0] and "30 more of them not logged" in said[0]
    assert outage.since is None
    clock.now += 5  # a new outage, even within quiet_s of the last error: records flowed between
    assert outage.filter(record("aiokafka", REFUSED))


def test_an_outage_quiet_for_long_ends_without_records_and_the_next_is_logged_again() -> None:
    health, clock = PipelineHealth(), Clock()
    outage = BrokerOutageLog(health, quiet_s=30.0, clock=clock)
    assert outage.filter(record("aiokafka", REFUSED))
    clock.now += 10
    assert not outage.filter(record("aiokafka", REFUSED))  # the same outage
    clock.now += 31  # no error for longer than quiet_s: an idle worker's broker came back, and went again
    assert outage.filter(record("aiokafka", REFUSED))
    assert health.problems[("worker", "broker_unreachable")] == 3


@pytest.mark.kafka
@pytest.mark.slow
def test_a_worker_through_a_broker_outage_logs_it_once_counts_it_and_says_when_it_answers(
        private_broker: Any, tmp_path: Path) -> None:
    """The filter on the worker's real log handlers (faust sets them up): a 10-s outage writes a
    handful of lines, not the ~100 a second aiokafka's clients write, counts its seconds in
    /metrics, and the first record handled after it says the broker answers again."""
    from foreshock.simulator import ClusterSimulator
    from foreshock.streams.kafka_agent import run_agent
    from foreshock.streams.kafka_config import KafkaSettings
    from foreshock.streams.kafka_topics import Topics, ensure_topics
    from foreshock.streams.sources import ReplaySource

    recording = tmp_path / "rec"
    ClusterSimulator(gpus=16, scenario="mixed", seed=6, duration=120).record(recording)
    settings = KafkaSettings(private_broker.bootstrap)
    topics = ensure_topics(settings, Topics("outage.", 1))
    (port,) = free_ports(1)
    log_path = tmp_path / "worker.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "foreshock.cli.main", "worker", "--kafka", settings.bootstrap, "--namespace",
         topics.namespace, "--partitions", "1", "--topology", str(recording / "topology.yaml"), "--port", str(port),
         "--checkpoint-interval", "1", "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "TMPDIR": str(tmp_path)})

    def publish(agent: str) -> None:
        source = ReplaySource(str(recording))
        assert run_agent(settings, source, source.topology, topics, agent_id=agent).failed == 0

    def scrape() -> str:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            return ""

    def wait_for(what: Any, timeout_s: float, why: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not what():
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, f"{why}:\n{log_path.read_text(errors='replace')[-3000:]}"
            time.sleep(0.5)

    try:
        publish("before")
        # (a fresh Numba cache: the worker compiles its kernels first)
        wait_for(lambda: re.search(r'foreshock_samples_processed_total\{[^}]*kind="gpu"[^}]*\} [1-9]', scrape()),
                 300, "no sample processed")
        private_broker.stop()
        time.sleep(10)
        private_broker.start()
        publish("after")
        wait_for(lambda: "answers again" in log_path.read_text(errors="replace"), 60, "no word of the broker back")
        counted = re.search(r'foreshock_input_problems_total\{[^}]*reason="broker_unreachable"[^}]*\} (\S+)', scrape())
        text = log_path.read_text(errors="replace")
    finally:
        terminate(proc)
        log.close()
    assert counted is not None and float(counted.group(1)) >= 5, text[-3000:]  # seconds of the outage
    errors = [line for line in text.splitlines() if any(m in line for m in BrokerOutageLog.MARKERS)]
    assert len(errors) <= 10, "\n".join(errors[:40])  # unfiltered: ~100 a second
    assert text.count("answers again") == 1
