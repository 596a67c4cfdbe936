"""Audit s64's broker-mode leftovers: the worker's checkpoint reader, asked for by the start-up task
and by the first partition's load at once, was built twice, the first left unclosed (aiokafka
logged ``Unclosed AIOKafkaConsumer`` at every rejoin of a live group)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

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


def test_a_shutdown_does_not_wait_for_a_reader_still_starting(tmp_path, monkeypatch) -> None:
    """The start-up task tries an absent broker for up to a minute, holding the reader's start: the
    shutdown (close_readers) waited that out. It returns at once; the reader started after it is
    stopped by its starter, not left open."""
    worker = _worker(tmp_path, monkeypatch)
    built: list[_FakeReader] = []
    started = asyncio.Event()

    async def slow_consumer(name: str, patience_s: float | None = None) -> _FakeReader:
        started.set()
        await asyncio.sleep(0.5)  # a broker answering late
        built.append(_FakeReader())
        return built[-1]

    monkeypatch.setattr(worker, "_consumer", slow_consumer)

    async def run() -> tuple[float, BaseException | None]:
        loop = asyncio.get_running_loop()
        starting = asyncio.ensure_future(worker._reader())
        await started.wait()
        t0 = loop.time()
        await worker.close_readers()
        took = loop.time() - t0
        try:
            await starting
        except RuntimeError as exc:
            return took, exc
        return took, None

    took, error = asyncio.run(run())
    assert took < 0.25  # not the starter's half second
    assert error is not None and "stopping" in str(error)
    assert len(built) == 1 and built[0].stopped


# ---- the ingest lag ---------------------------------------------------------------------------
# foreshock_ingest_lag_seconds (and ForeshockIngestLag, "lags ... behind its input") counted from a
# record's arrival at the worker: the detection's time alone. A worker working through a 24-s backlog
# read 0.00004-0.0012 s. It counts from the agent's sending of the frame now (the bundle's header).
T_WALL = 1_800_000_000.0  # the store's wall clock, fixed: no sleeps, no real clock


def _stage(topology: Topology, wall: Any = lambda: T_WALL) -> Any:
    from foreshock.exporters.store import FindingStore
    from foreshock.health import PipelineHealth
    from foreshock.streams.kafka_worker import DetectionStage

    health = PipelineHealth()
    store = FindingStore(topology, health, wall_clock=wall)
    stage = DetectionStage(topology, lambda hw: DetectorBank.from_names(hw, ["robust_zscore"], processors=()), 1,
                           store=store, health=health)
    stage.load(0, None)
    return stage


def _gpu_frame(topology: Topology, ts: float) -> Any:
    import numpy as np

    from foreshock.frames import Frame

    slots = np.arange(topology.size("gpu"))
    return Frame("gpu", np.full(len(slots), ts), slots, {"gpu_temp": np.full(len(slots), 50.0)})


def test_the_ingest_lag_counts_from_the_agents_sending(small_topology: Topology) -> None:
    from foreshock.streams.kafka_codec import encode_bundle

    stage = _stage(small_topology)
    value, headers = encode_bundle("a#1", T_WALL - 24.0, [(1, 0, 1, _gpu_frame(small_topology, 100.0))],
                                   topology=small_topology)
    stage.process(0, 0, value, headers)
    assert stage.store.snapshot().ingest_lag_s == 24.0


def test_a_frame_held_for_its_rest_lags_from_its_first_piece(small_topology: Topology) -> None:
    """A share split across two bundles runs when the second comes: its lag counts from the first's
    sending (the wait for the rest is lag too)."""
    from foreshock.streams.kafka_codec import encode_bundle

    stage = _stage(small_topology)
    frame = _gpu_frame(small_topology, 100.0)
    first, second = frame.take(slice(0, 2)), frame.take(slice(2, None))
    value, headers = encode_bundle("a#1", T_WALL - 30.0, [(1, 0, 2, first)], topology=small_topology, continues=True)
    stage.process(0, 0, value, headers)
    value, headers = encode_bundle("a#1", T_WALL - 5.0, [(1, 1, 2, second)], topology=small_topology)
    stage.process(0, 1, value, headers)
    assert stage.store.snapshot().ingest_lag_s == 30.0


@pytest.mark.parametrize("stamp", [0.0, -5.0, 1e8])
def test_a_send_stamp_that_is_no_time_counts_from_the_arrival(small_topology: Topology, stamp: float) -> None:
    """A stamp before 2001 (a tool's 0.0, a host whose clock was never set) is no backlog: it read
    1.8e9 s of lag. (A NaN stamp is no time either: the store reads max(0, wall - NaN) as 0.)"""
    import time

    from foreshock.streams.kafka_codec import encode_bundle

    stage = _stage(small_topology, time.time)  # (the arrival is read on the real clock)
    value, headers = encode_bundle("a#1", stamp, [(1, 0, 1, _gpu_frame(small_topology, 100.0))],
                                   topology=small_topology)
    stage.process(0, 0, value, headers)
    assert 0.0 <= stage.store.snapshot().ingest_lag_s < 5.0  # the detection's time alone
