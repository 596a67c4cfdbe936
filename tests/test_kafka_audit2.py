"""Kafka mode against embedded mode, second audit: a checkpoint grown past the topic's message
size behind a lost piece (and its refusal ending the worker), rows of unknown entities taking
their piece's good rows with them, a sequence number 0 processed and then dropped uncounted, and
a partition's share of a frame split into pieces run piece by piece (peer-comparing detectors
saw part of the frame).

No broker: faust's producer, topics and streams are stand-ins (``test_kafka_poison_records``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from aiokafka.errors import MessageSizeTooLargeError

from foreshock.detectors.base import Detector
from foreshock.detectors.bank import DetectorBank
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.streams import kafka_agent
from foreshock.streams.embedded import EmbeddedPipeline
from foreshock.streams.kafka_codec import (BundleBuilder, FindingsMessage, PartitionMap, PieceInfo, PieceReport,
                                           RecordError, decode_bundle, decode_findings, encode_bundle, encode_findings,
                                           headers_dict, row_bytes)
from foreshock.streams.kafka_worker import DetectionStage, IncidentStage
from foreshock.topology import Topology

import test_kafka_agent_failures as agent_support
import test_kafka_poison_records as support

H_CONTINUES = "foreshock-continues"  # spelled out: the header is what travels


def _no_processors(hw: Topology) -> DetectorBank:
    return DetectorBank.from_names(hw, processors=())


# ---- a checkpoint past the topic's message size -----------------------------------------------
def test_telemetry_held_behind_a_lost_piece_stays_within_its_budget() -> None:
    """A frame that lost a piece for good holds every later frame of its sender (FRAME_WAIT_S), and
    with it their forwarded rows, pickled into each checkpoint: at 16,384 GPUs a second, 75 MiB,
    refused by the checkpoints topic. Past the budget the frame waiting longest is given up early."""
    gpus, budget = 512, 200_000
    stage = IncidentStage([], clock=lambda: 1000.0)
    stage.telemetry_max_bytes = budget
    rng = np.random.default_rng(0)
    stage.observe(FindingsMessage("agent#2000000", 1, 0, 2, 1.0, gpus, 0.0, []))  # frame 1: one of its 2 pieces
    most = 0
    for seq in range(2, 62):
        frame = Frame("gpu", np.full(gpus, float(seq)), np.arange(gpus, dtype=np.int32),
                      {"gpu_temp": rng.normal(60, 5, gpus), "power": rng.normal(500, 50, gpus)})
        for part in (0, 1):
            stage.observe_telemetry(PieceInfo("agent#2000000", seq, part, 2, 0.0), frame)
            most = max(most, sum(f.ts.nbytes + f.slot.nbytes + sum(c.nbytes for c in f.columns.values())
                                 for held in stage.telemetry.values() for f in held.values()))
        for part in (0, 1):
            stage.observe(FindingsMessage("agent#2000000", seq, part, 2, float(seq), gpus, 0.0, []))
    one_frame = 2 * gpus * 8 * (2 + len(frame.columns))
    # (without the budget: all 60 frames, 60 x 2 pieces, waited with their rows)
    assert most <= budget + one_frame
    assert stage.health.problems[("incidents", "frame_incomplete")] == 1
    assert stage.released["agent#2000000"] == 61 and not stage.pending and not stage.telemetry
    assert len(stage.checkpoint()[1]) < budget


def test_a_checkpoint_refused_as_too_large_is_counted_not_fatal(tmp_path: Path, monkeypatch,
                                                                 small_topology: Topology) -> None:
    """The broker refusing a checkpoint (aiokafka's MessageSizeTooLargeError) ended the worker
    (exit 70), and its restart, rebuilding the same state, was refused again."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))

    class Refusing(support._Topic):
        async def send(self, key: Any = None, value: bytes = b"", partition: Any = None, headers: Any = None,
                       force: bool = False) -> Any:
            if len(value) > 64:
                raise MessageSizeTooLargeError(f"{len(value)} bytes")
            return await super().send(key, value, partition, headers, force)

    sent: list[Any] = []
    worker, _, exits = support._worker(small_topology, 1, checkpoint_topic=Refusing("checkpoint_topic", sent))

    async def nothing(*args: Any) -> None:
        return None

    worker.poll_external = nothing
    worker.end_offset = nothing  # no broker to ask
    worker.config.checkpoint_interval_s = 0.0
    stream = support._Stream()
    message = encode_findings([PieceReport(PieceInfo("a#1", 1, 0, 1, 0.0), 100.0, 1, [])], 0, 0)
    value, headers = encode_bundle("a#1", 0.0, [(1, 0, 1, support._gpu_frame())], topology=small_topology)

    async def run() -> None:
        await worker.handle(worker.on_findings, stream, support._event(support.FINDINGS_TOPIC, 0, message, []))
        await worker.handle(worker.on_piece, stream, support._event(support.FRAMES_TOPIC, 0, value, headers))

    asyncio.run(run())
    assert exits == []
    assert worker.health.problems[("worker", "checkpoint_too_large")] == 2
    assert stream.acked == []  # nothing a checkpoint does not cover is acknowledged
    assert not [s for s in sent if s[0] == "checkpoint_topic"]
    from foreshock.streams.faust_app import CHECKPOINT_REFUSALS_MAX, EXIT_RECORD_FAILED

    async def refused_on() -> None:  # refused each time: a topic that takes too little ends the worker
        for offset in range(1, CHECKPOINT_REFUSALS_MAX):
            await worker.handle(worker.on_findings, stream, support._event(support.FINDINGS_TOPIC, offset, message, []))

    asyncio.run(refused_on())
    assert exits == [EXIT_RECORD_FAILED]
    assert worker.health.problems[("worker", "checkpoint_too_large")] == CHECKPOINT_REFUSALS_MAX + 1
    worker.remove_data_dir()


# ---- rows of unknown entities -------------------------------------------------------------------
def _frame_with_null_slots(topology: Topology, nulls: int) -> Frame:
    n = topology.size("gpu")
    slots = pa.array(list(range(n - nulls)) + [None] * nulls, pa.int32())
    batch = pa.RecordBatch.from_arrays(
        [pa.array(np.full(n, 1_700_000_000.0)), slots, pa.array(np.full(n, 55.0))],
        schema=pa.schema([("ts", pa.float64()), ("slot", pa.int32()), ("gpu_temp", pa.float64())],
                         metadata={b"foreshock.kind": b"gpu"}))
    return Frame.from_arrow(batch)


@pytest.mark.parametrize("partitions", [1, 2])
@pytest.mark.parametrize("nulls", [1, 2])
def test_only_the_rows_of_unknown_entities_are_dead_lettered(small_topology: Topology, partitions: int,
                                                            nulls: int) -> None:
    """As the embedded guard: those rows are counted (one a row) and dropped, the batch's other
    rows go on. The worker dead-lettered the whole piece: a rack's good rows with the bad one."""
    frame = _frame_with_null_slots(small_topology, nulls)
    n = len(frame)
    embedded = EmbeddedPipeline(small_topology, _no_processors(small_topology))
    clean, _ = embedded.process_rows(frame)
    assert len(clean) == n - nulls
    assert embedded.health.problems[("guard", "unknown_entity")] == nulls

    stage = DetectionStage(small_topology, _no_processors, partitions)
    messages = PartitionMap(small_topology, partitions).messages(frame)
    reached, dead = 0, []
    for index, (partition, piece) in enumerate(messages):
        if not stage.owns(partition):
            stage.load(partition, None)
        value, headers = encode_bundle("a#1", 0.0, [(1, index, len(messages), piece)], topology=small_topology)
        result = stage.process(partition, 0, value, headers)
        reached += result.rows
        dead += result.dead_letters
    assert reached == n - nulls
    assert stage.health.problems[("worker", "unknown_entity")] == nulls
    (letter,) = dead
    assert letter.reason == "unknown_entity"
    # the existing dead-letter form of a piece's rows: a single-piece message of just those rows
    rows = decode_bundle(letter.value, headers_dict(letter.headers), small_topology, stage.pmap, None)[0]
    assert rows.error is not None and rows.error.reason == "unknown_entity"
    assert rows.frame is not None and rows.frame.slot.tolist() == [-1] * nulls


# ---- sequence number 0 --------------------------------------------------------------------------
def test_a_piece_of_sequence_number_zero_is_bad_headers(small_topology: Topology) -> None:
    """Frames count from 1: a seq-0 piece was processed, then the incident stage dropped its
    findings as a repeat (seq <= the last released, 0), counted by no metric."""
    value, headers = encode_bundle("agentX", 0.0, [(0, 0, 1, support._gpu_frame())], topology=small_topology)
    with pytest.raises(RecordError) as refused:
        decode_bundle(value, headers_dict(headers), small_topology, PartitionMap(small_topology, 1), 0)
    assert refused.value.reason == "bad_headers"
    stage = DetectionStage(small_topology, _no_processors, 1)
    stage.load(0, None)
    result = stage.process(0, 0, value, headers)
    assert [d.reason for d in result.dead_letters] == ["bad_headers"] and result.rows == 0
    assert stage.health.problems[("worker", "bad_headers")] == 1


# ---- a partition's share of a frame in several pieces ---------------------------------------------
class RowsSeen(Detector):
    """Reports, for each GPU frame, how many rows it saw together: what a detector comparing
    GPUs with their peers (a job's median, the GPUs a rack holds) reads of the frame."""

    name = "rows_seen"
    kinds = ("gpu",)

    def update(self, frame: Frame) -> list[Finding]:
        return [Anomaly(float(frame.ts.max()), "gpu", int(frame.slot[0]), "gpu_temp", float(len(frame)),
                        self.name, "rows seen")]


def _rows_seen(hw: Topology) -> DetectorBank:
    return DetectorBank(hw, [RowsSeen(hw)], processors=())


def _gpu_frames(topology: Topology, count: int) -> list[Frame]:
    n = topology.size("gpu")
    return [Frame("gpu", np.full(n, 100.0 + 10 * t), np.arange(n, dtype=np.int32),
                  {"gpu_temp": np.full(n, 50.0 + t)}) for t in range(count)]


def _agent_records(topology: Topology, frames: list[Frame], partitions: int, piece_rows: int,
                   bundle_rows: int) -> list[tuple[int, bytes, Any]]:
    """What an agent sends: each partition's share in pieces of ``piece_rows``, bundled up to
    ``bundle_rows`` rows, a bundle that ends inside a frame's share marked ``H_CONTINUES``."""
    pmap = PartitionMap(topology, partitions)
    builders: dict[int, BundleBuilder] = {}
    out: list[tuple[int, bytes, Any]] = []

    def send(partition: int, entries: list[Any], pieces: list[tuple[int, Frame]], seq: int) -> None:
        value, headers = encode_bundle("a#1", 0.0, entries, topology=topology)
        last = entries[-1]
        if last[0] == seq and any(p == partition for p, _ in pieces[last[1] + 1:]):
            headers.append((H_CONTINUES, b"1"))
        out.append((partition, value, headers))

    for seq, frame in enumerate(frames, 1):
        pieces = pmap.messages(frame, max_bytes=piece_rows * row_bytes("gpu"))
        for index, (partition, piece) in enumerate(pieces):
            builder = builders.setdefault(partition, BundleBuilder(max_bytes=bundle_rows * row_bytes("gpu")))
            for entries in builder.add((seq, index, len(pieces), piece)):
                send(partition, entries, pieces, seq)
    for partition, builder in builders.items():
        if builder.entries:
            send(partition, builder.take(), [], 0)
    return out


def _detect(topology: Topology, records: list[tuple[int, bytes, Any]], partitions: int,
            restart_after: int | None = None) -> tuple[list[tuple[float, int]], list[Any]]:
    stage = DetectionStage(topology, _rows_seen, partitions)
    offsets: dict[int, int] = {}
    findings, reports = [], []
    for i, (partition, value, headers) in enumerate(records):
        if not stage.owns(partition):
            stage.load(partition, None)
        offsets[partition] = offsets.get(partition, -1) + 1
        result = stage.process(partition, offsets[partition], value, headers)
        assert not result.dead_letters
        findings += [(f.ts, int(f.score)) for f in result.findings if isinstance(f, Anomaly)]
        if result.findings_message is not None:
            reports += [(r.seq, r.part, r.rows) for r in decode_findings(result.findings_message)]
        if restart_after == i:  # a worker taking over from the checkpoint, pieces held included
            blobs = {p: stage.checkpoint(p)[1] for p in list(stage.parts)}
            stage = DetectionStage(topology, _rows_seen, partitions)
            for p, blob in blobs.items():
                stage.load(p, blob)
    return sorted(findings), sorted(reports)


@pytest.mark.parametrize("partitions", [1, 2])
def test_the_pieces_of_one_frame_in_one_record_run_as_one_frame(small_topology: Topology, partitions: int) -> None:
    frames = _gpu_frames(small_topology, 3)
    whole, _ = _detect(small_topology, _agent_records(small_topology, frames, partitions, 10_000, 100_000),
                       partitions)
    chunked, reports = _detect(small_topology, _agent_records(small_topology, frames, partitions, 5, 100_000),
                               partitions)
    share = small_topology.size("gpu") // partitions
    assert sorted(score for _, score in whole) == [share] * (3 * partitions)
    assert chunked == whole  # (piece by piece: each detector call saw 5 rows or fewer)
    # every piece still reported, with its own rows: the incident stage counts a frame's pieces
    assert sum(rows for _, _, rows in reports) == 3 * small_topology.size("gpu")
    assert len(reports) == 3 * partitions * -(-share // 5)


@pytest.mark.parametrize("restart_after", [None, 0, 2])
def test_a_share_split_across_bundles_is_held_until_its_last_piece(small_topology: Topology,
                                                                    restart_after: int | None) -> None:
    """Past MAX_BUNDLE_BYTES a partition's share goes on in the sender's next bundle: the worker
    holds its pieces (in its checkpoint too) until the last one came."""
    frames = _gpu_frames(small_topology, 3)
    records = _agent_records(small_topology, frames, 1, 5, 12)
    assert any(h == H_CONTINUES for _, _, headers in records for h, _ in headers)
    whole, _ = _detect(small_topology, _agent_records(small_topology, frames, 1, 10_000, 100_000), 1)
    held, reports = _detect(small_topology, records, 1, restart_after)
    assert held == whole
    assert sum(rows for _, _, rows in reports) == 3 * small_topology.size("gpu")


def test_the_agent_marks_a_bundle_that_ends_inside_a_frames_share(monkeypatch, no_broker,
                                                                   small_topology: Topology) -> None:
    sent: list[tuple[int, bytes, Any]] = []

    class Recording(agent_support.FakeProducer):
        def send(self, topic: str, key: bytes | None = None, value: bytes | None = None,
                 partition: int | None = None, headers: list | None = None) -> Any:
            sent.append((int(partition or 0), value or b"", headers))
            future = super().send(topic, key, value, partition, headers)
            future.success(None)
            return future

    monkeypatch.setattr(kafka_agent, "BundleBuilder", lambda: BundleBuilder(max_bytes=12 * row_bytes("gpu")))
    pub = agent_support.publisher(monkeypatch, small_topology, Recording, partitions=2)
    messages = pub.pmap.messages
    monkeypatch.setattr(pub.pmap, "messages", lambda frame: messages(frame, max_bytes=5 * row_bytes("gpu")))
    frames = _gpu_frames(small_topology, 3)
    for frame in frames:
        pub.publish(frame)
    pub.close()
    whole, _ = _detect(small_topology, _agent_records(small_topology, frames, 2, 10_000, 100_000), 2)
    assert any(h == H_CONTINUES for _, _, headers in sent for h, _ in headers)
    assert _detect(small_topology, sent, 2)[0] == whole


no_broker = agent_support.no_broker  # the agent's topics exist (a fixture of that module)
