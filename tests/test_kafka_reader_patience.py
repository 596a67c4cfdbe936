"""A worker's readers outside its consumer group (checkpoints, ``external.events``) ride out a
broker that is away for a moment: the bootstrap is tried again, counted, for up to
``BROKER_PATIENCE_S``, and only then does the error reach the handler (which ends the worker).

The broker "comes back" as a forwarder to the real shared broker that starts listening on its
port only after a while: the bootstrap goes through it, later connections go to the address
the broker advertises."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError

from foreshock.detectors.bank import DetectorBank
from foreshock.streams import faust_app
from foreshock.streams.faust_app import ForeshockWorker, WorkerConfig
from foreshock.streams.kafka_config import KafkaSettings
from foreshock.streams.kafka_topics import Topics, ensure_topics
from foreshock.topology import Topology
from kafka_support import free_ports, kafka_settings, unique_topic  # noqa: F401  (a fixture)

pytestmark = pytest.mark.kafka


def worker_at(address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ForeshockWorker:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    topology = Topology.from_gpu_hosts([("n0", g) for g in range(2)])
    return ForeshockWorker(WorkerConfig(KafkaSettings(address), Topics("patience.", 1), topology,
                                        lambda hardware: DetectorBank.from_names(hardware), app_id="patience"))


async def forward(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, host: str, port: int) -> None:
    upstream_reader, upstream_writer = await asyncio.open_connection(host, port)

    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    await asyncio.gather(pump(client_reader, upstream_writer), pump(upstream_reader, client_writer))


def test_a_reader_waits_for_a_broker_that_comes_back(kafka_settings, tmp_path: Path,  # noqa: F811
                                                     monkeypatch: pytest.MonkeyPatch):
    host, port = kafka_settings.bootstrap.split(",")[0].rsplit(":", 1)
    topics = ensure_topics(kafka_settings, Topics(unique_topic("patience") + ".", 1))
    (late,) = free_ports(1)
    worker = worker_at(f"127.0.0.1:{late}", tmp_path, monkeypatch)
    away_s = 2.0

    async def scenario() -> tuple[float, set[str]]:
        async def broker_comes_back() -> asyncio.AbstractServer:
            await asyncio.sleep(away_s)
            return await asyncio.start_server(lambda r, w: forward(r, w, host, int(port)), "127.0.0.1", late)

        back = asyncio.create_task(broker_comes_back())
        began = time.monotonic()
        reader = await worker._consumer("external")
        took = time.monotonic() - began
        try:
            seen = set(await reader.topics())  # it talks to the broker now
        finally:
            await reader.stop()
            (await back).close()
        return took, seen

    try:
        took, seen = asyncio.run(scenario())
    finally:
        worker.remove_data_dir()
    assert away_s <= took < away_s + 10, took
    assert topics.frames in seen
    tries = worker.health.problems[("worker", "broker_unreachable")]
    assert 2 <= tries <= 6, tries  # tried again at 0.5, 1, 2 s... pauses, each failure counted


def test_a_reader_gives_up_on_a_broker_away_past_its_patience(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(faust_app, "BROKER_PATIENCE_S", 1.5)
    (nobody,) = free_ports(1)
    worker = worker_at(f"127.0.0.1:{nobody}", tmp_path, monkeypatch)
    began = time.monotonic()
    try:
        with pytest.raises(KafkaConnectionError):
            asyncio.run(worker._consumer("ckpt"))
    finally:
        worker.remove_data_dir()
    assert 1.0 <= time.monotonic() - began < 6.0
    assert worker.health.problems[("worker", "broker_unreachable")] >= 1
