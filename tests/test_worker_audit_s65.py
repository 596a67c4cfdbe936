"""Audit s64's broker-mode leftovers: the worker's checkpoint reader, asked for by the start-up task
and by the first partition's load at once, was built twice, the first left unclosed (aiokafka
logged ``Unclosed AIOKafkaConsumer`` at every rejoin of a live group)."""

from __future__ import annotations

import asyncio
from typing import Any

from foreshock.detectors.bank import DetectorBank
from foreshock.topology import Topology


class _FakeReader:
    def __init__(self) -> None:
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True


def _worker(tmp_path: Any, monkeypatch: Any) -> Any:
    from foreshock.streams import faust_app
    from foreshock.streams.kafka_config import KafkaSettings
    from foreshock.streams.kafka_topics import Topics

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    topology = Topology.from_gpu_hosts([("n0", g) for g in range(2)])
    config = faust_app.WorkerConfig(KafkaSettings("127.0.0.1:1"), Topics("s65.", 1), topology,
                                    lambda hardware: DetectorBank.from_names(hardware), app_id="s65")
    return faust_app.ForeshockWorker(config)


def test_callers_meeting_in_the_readers_start_share_one_reader(tmp_path, monkeypatch) -> None:
    worker = _worker(tmp_path, monkeypatch)
    built: list[_FakeReader] = []

    async def slow_consumer(name: str, patience_s: float | None = None) -> _FakeReader:
        await asyncio.sleep(0.05)  # a bootstrap: the other caller comes meanwhile
        built.append(_FakeReader())
        return built[-1]

    monkeypatch.setattr(worker, "_consumer", slow_consumer)

    async def run() -> tuple[Any, Any]:
        first, second = await asyncio.gather(worker._reader(), worker._reader(patience_s=0.0))
        await worker.close_readers()
        return first, second

    first, second = asyncio.run(run())
    assert len(built) == 1 and first is second is built[0]
    assert built[0].stopped  # and closed at the end: none left behind
