"""A Kafka worker's consumer lag, ``foreshock_consumer_lag_records{topic, partition}``: the records of
each partition assigned to it that it has not processed yet (the partition's high watermark, from the
consumer's last fetch, less the next offset to process). Clock-free, beside the ingest lag, which
reads the agents' send stamps and so a host's clock error as lag."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from faust.exceptions import ConsumerNotStarted
from prometheus_client import generate_latest

from foreshock.detectors.bank import DetectorBank
from foreshock.exporters.prometheus import build_registry
from foreshock.streams.kafka_agent import run_agent
from foreshock.streams.kafka_topics import Topics, ensure_topics
from foreshock.streams.sources import ReplaySource
from foreshock.topology import Topology
from kafka_support import free_ports, kafka_settings, terminate  # noqa: F401


class _Consumer:
    """A stand-in for faust's consumer: ``highwater`` per (topic, partition), or what it raises."""

    def __init__(self, highwaters: dict[tuple[str, int], Any]) -> None:
        self.highwaters = highwaters

    def highwater(self, tp: Any) -> Any:
        value = self.highwaters[(tp.topic, tp.partition)]
        if isinstance(value, BaseException):
            raise value
        return value


def _worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from foreshock.streams import faust_app
    from foreshock.streams.kafka_config import KafkaSettings

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    topology = Topology.from_gpu_hosts([("n0", g) for g in range(2)])
    config = faust_app.WorkerConfig(KafkaSettings("127.0.0.1:1"), Topics("lag.", 2), topology,
                                    lambda hardware: DetectorBank.from_names(hardware), app_id="lag")
    return faust_app.ForeshockWorker(config)


def _message(topic: str, partition: int, offset: int) -> Any:
    return types.SimpleNamespace(topic=topic, partition=partition, offset=offset)


def render(store: Any) -> str:
    return generate_latest(build_registry(store)).decode()


def _lag_series(text: str) -> dict[tuple[str, str], float]:
    """The lag series of an exposition, by (topic, partition)."""
    series = {}
    for labels, value in re.findall(r"^foreshock_consumer_lag_records\{([^}]*)\} (\S+)$", text, re.M):
        named = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        series[(named["topic"], named["partition"])] = float(value)
    return series


def test_a_handled_record_leaves_the_partitions_records_behind_it_as_its_lag(tmp_path, monkeypatch) -> None:
    worker = _worker(tmp_path, monkeypatch)
    frames = worker.config.topics.frames
    # offset 3 handled, 10 the next offset to be written: 4..9 still to process
    worker.app = types.SimpleNamespace(consumer=_Consumer({(frames, 0): 10, (frames, 1): 5}))
    worker.on_assigned([types.SimpleNamespace(topic=frames, partition=p) for p in (0, 1)])
    handled: list[int] = []

    async def handler(stream: Any, event: Any) -> None:
        handled.append(event.message.offset)

    asyncio.run(worker.handle(handler, None, types.SimpleNamespace(message=_message(frames, 0, 3))))
    asyncio.run(worker.handle(handler, None, types.SimpleNamespace(message=_message(frames, 1, 4))))
    assert handled == [3, 4]
    assert worker.store.snapshot().consumer_lag == {(frames, 0): 6, (frames, 1): 0}  # 1: caught up
    assert _lag_series(render(worker.store)) == {(frames, "0"): 6.0, (frames, "1"): 0.0}


def test_a_lag_not_known_leaves_the_last_and_a_revoked_partition_loses_its_series(tmp_path, monkeypatch) -> None:
    worker = _worker(tmp_path, monkeypatch)
    frames = worker.config.topics.frames
    consumer = _Consumer({(frames, 0): 10, (frames, 1): 7})
    worker.app = types.SimpleNamespace(consumer=consumer)
    worker.on_assigned([types.SimpleNamespace(topic=frames, partition=p) for p in (0, 1)])
    worker.note_consumer_lag(_message(frames, 0, 3))
    worker.note_consumer_lag(_message(frames, 1, 2))
    # no fetch answered yet (None), the partition no longer assigned (aiokafka asserts), no consumer yet
    for unknown in (None, AssertionError("Partition is not assigned"), ConsumerNotStarted("not yet")):
        consumer.highwaters[(frames, 0)] = unknown
        worker.note_consumer_lag(_message(frames, 0, 8))
        assert worker.store.snapshot().consumer_lag[(frames, 0)] == 6
    asyncio.run(worker.on_revoked([types.SimpleNamespace(topic=frames, partition=0)]))
    assert worker.store.snapshot().consumer_lag == {(frames, 1): 4}
    assert set(_lag_series(render(worker.store))) == {(frames, "1")}
    # a record of it still reaching the worker (prefetched; left to its new owner) brings no series
    # back, though the consumer may still answer for the partition mid-rebalance
    consumer.highwaters[(frames, 0)] = 12
    worker.note_consumer_lag(_message(frames, 0, 9))
    assert worker.store.snapshot().consumer_lag == {(frames, 1): 4}


def test_a_record_whose_handling_failed_does_not_move_the_lag(tmp_path, monkeypatch) -> None:
    worker = _worker(tmp_path, monkeypatch)
    frames = worker.config.topics.frames
    worker.app = types.SimpleNamespace(consumer=_Consumer({(frames, 0): 10}))
    worker.on_assigned([types.SimpleNamespace(topic=frames, partition=0)])
    worker._exit = lambda code: None  # fatal's way out, stubbed

    async def failing(stream: Any, event: Any) -> None:
        raise RuntimeError("boom")

    asyncio.run(worker.handle(failing, None, types.SimpleNamespace(message=_message(frames, 0, 3))))
    assert worker.store.snapshot().consumer_lag == {}


def test_an_embedded_pipelines_metrics_carry_no_consumer_lag() -> None:
    from foreshock.exporters.store import FindingStore

    store = FindingStore(Topology.from_gpu_hosts([("n0", 0)]))
    assert "# TYPE foreshock_consumer_lag_records gauge" in render(store)  # declared, no series
    assert _lag_series(render(store)) == {}


@pytest.mark.kafka
def test_a_worker_started_behind_a_backlog_reports_each_partitions_lag_down_to_zero(kafka_settings,  # noqa: F811
                                                                                    tmp_path: Path) -> None:
    """A replay published before the worker starts: the worker's /metrics reports the lag of each
    frames partition and of the findings topic it reads, and each settles at 0 once the worker has
    processed every record."""
    from foreshock.simulator import ClusterSimulator

    recording = tmp_path / "rec"
    ClusterSimulator(gpus=32, scenario="mixed", seed=5, duration=240).record(recording)
    topics = ensure_topics(kafka_settings, Topics(f"lag{time.monotonic_ns() % 10**8}.", 2))
    source = ReplaySource(str(recording), batch_rows=1024)
    stats = run_agent(kafka_settings, source, source.topology, topics, agent_id="lag-agent")
    assert stats.failed == 0 and stats.pieces > 0
    (port,) = free_ports(1)
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "foreshock.cli.main", "worker", "--kafka", kafka_settings.bootstrap,
         "--namespace", topics.namespace, "--partitions", "2", "--group", f"g-{topics.namespace}",
         "--topology", str(recording / "topology.yaml"), "--port", str(port), "--checkpoint-interval", "1",
         "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp_path)})
    seen: list[dict[tuple[str, str], float]] = []
    try:
        deadline = time.monotonic() + 300  # (a fresh Numba cache: the worker compiles its kernels first)
        want = {(topics.frames, "0"), (topics.frames, "1"), (topics.findings, "0")}
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                time.sleep(0.5)
                continue
            seen.append(_lag_series(text))
            if set(seen[-1]) == want and not any(seen[-1].values()):
                break
            time.sleep(0.5)
        assert seen and set(seen[-1]) == want, seen[-3:]
        assert not any(seen[-1].values()), seen[-3:]  # every record processed: nothing left behind
    finally:
        terminate(proc)
        log.close()

