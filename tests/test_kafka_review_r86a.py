"""Review r86 (first part): what could stick a partition or blow a worker's memory.

- a dead letter is cut to the dead-letter topic's message size, and one the broker refuses all
  the same is counted, not fatal (a record the broker took compressed reads back as gigabytes of
  raw bytes: the worker ended, and its restart met the same record);
- a few KB of zstd declaring millions of rows is refused before anything is decompressed;
- a JSON object pretty-printed over several lines is one record, not six bad lines;
- a findings message that would pass the findings topic's message size goes in several;
- a revoked incident stage is checkpointed before it is dropped, as a frames partition is.

Without a broker except the one test marked ``kafka``.
"""

from __future__ import annotations

import asyncio
import json
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from aiokafka.errors import MessageSizeTooLargeError
from faust.exceptions import ProducerSendError
from kafka_support import kafka_settings  # noqa: F401
from test_kafka_poison_records import TOPICS, _event, _Stream, _Topic, _worker

from foreshock.findings import Anomaly, Prediction
from foreshock.frames import Frame
from foreshock.streams.kafka_codec import (MAX_BUNDLE_BYTES, PartitionMap, PieceInfo, PieceReport, decode_bundle,
                                           decode_findings, encode_bundle, encode_findings, headers_dict,
                                           json_to_frames, row_bytes)
from foreshock.streams.kafka_config import KafkaSettings
from foreshock.streams.kafka_topics import BUNDLE_MAX_MESSAGE_BYTES, CHECKPOINT_MAX_BYTES, Topics
from foreshock.topology import Topology

TP = namedtuple("TP", "topic partition")


class _SizedTopic(_Topic):
    """A topic whose broker refuses messages over ``BUNDLE_MAX_MESSAGE_BYTES`` (key, value and
    headers), as Kafka does (MessageSizeTooLargeError on the delivery); ``refuse_all``: refuses
    every message, at the producer (faust's ProducerSendError), as aiokafka does past its
    ``max_request_size``."""

    def __init__(self, name: str, sent: list[Any], refuse_all: bool = False) -> None:
        super().__init__(name, sent)
        self.refuse_all = refuse_all

    async def send(self, key: Any = None, value: bytes = b"", partition: Any = None, headers: Any = None,
                   force: bool = False) -> asyncio.Future[None]:
        if self.refuse_all:
            try:
                raise MessageSizeTooLargeError("the producer's max_request_size")
            except MessageSizeTooLargeError as exc:
                raise ProducerSendError(f"Error while sending: {exc!r}") from exc
        self.sent.append((self.name, value, headers))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        size = len(key or b"") + len(value or b"") + sum(len(k) + len(v) for k, v in headers or [])
        if size > BUNDLE_MAX_MESSAGE_BYTES:
            future.set_exception(MessageSizeTooLargeError(f"{size} bytes"))
        else:
            future.set_result(None)
        return future


def _quiet(worker: Any) -> Any:
    """No broker: no external.events reader, no end offsets or topic IDs to check checkpoints against."""
    async def nothing(*args: Any) -> None:
        return None

    worker.poll_external = nothing
    worker.end_offset = nothing
    worker.topic_id = nothing
    return worker


# ---- R1: dead letters within the topic's message size, refusals not fatal ---------------------------
def test_an_oversized_dead_letter_keeps_its_head_and_says_its_size(tmp_path: Path, monkeypatch,
                                                                   small_topology: Topology) -> None:
    """A record the frames topic took gzip-compressed (20 MB as a few KB) and dead-lettered raw:
    the dead-letter topic refused it, every checkpoint after it failed, the worker ended, and its
    restart read the same record: the partition was stuck for good."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    sent: list[Any] = []
    deadletters = _SizedTopic("deadletter_topic", sent)
    worker, _, exits = _worker(small_topology, 1, deadletter_topic=deadletters,
                               checkpoint_topic=_Topic("checkpoint_topic", sent))
    value = b"x" * (20 * 1024 * 1024)
    stream = _Stream()

    async def run() -> None:
        await worker.handle(worker.on_piece, stream, _event(TOPICS.frames, 4, value, [("foo", b"bar")]))
        await worker.checkpoint_partition(stream, 0)  # raised: a message since was not delivered

    asyncio.run(run())
    assert exits == []
    ((_, dead, headers),) = [s for s in sent if s[0] == "deadletter_topic"]
    hd = dict(headers)
    assert len(dead) + sum(len(k) + len(v) for k, v in headers) <= BUNDLE_MAX_MESSAGE_BYTES
    assert value.startswith(dead) and len(dead) > BUNDLE_MAX_MESSAGE_BYTES // 2
    assert hd["foreshock-original-bytes"] == str(len(value)).encode()
    assert hd["foreshock-source"] == f"{TOPICS.frames}/0/4".encode() and hd["foo"] == b"bar"
    assert stream.acked == [4] and worker.health.dead_letters == 1
    worker.remove_data_dir()


def test_a_dead_letter_the_broker_refuses_is_counted_not_fatal(tmp_path: Path, monkeypatch,
                                                               small_topology: Topology) -> None:
    """Refused all the same (headers past the limit: a dead letter is never sent again), it is a
    problem counted and logged once; a dead letter lost with the broker away still lets no
    checkpoint pass it (a restart sends it again)."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    from foreshock.streams.faust_app import EXIT_RECORD_FAILED

    sent: list[Any] = []
    huge_headers = [("foo", b"h" * BUNDLE_MAX_MESSAGE_BYTES)]
    refusing = _SizedTopic("deadletter_topic", sent)
    worker, _, exits = _worker(small_topology, 1, deadletter_topic=refusing,
                               checkpoint_topic=_Topic("checkpoint_topic", sent))
    at_producer, _, exits_2 = _worker(small_topology, 1, deadletter_topic=_SizedTopic("deadletter_topic", sent, True),
                                      checkpoint_topic=_Topic("checkpoint_topic", sent))
    away, _, exits_3 = _worker(small_topology, 1, deadletter_topic=_Topic("deadletter_topic", sent, lambda key: True),
                               checkpoint_topic=_Topic("checkpoint_topic", sent))
    stream = _Stream()

    async def run() -> None:
        for w in (worker, at_producer, away):
            for offset in (1, 2):
                await w.handle(w.on_piece, stream, _event(TOPICS.frames, offset, b"bad", huge_headers))
            await w.handle(lambda _s, _e: w.checkpoint_partition(stream, 0), stream,
                           _event(TOPICS.frames, 2, b"", []))

    asyncio.run(run())
    assert exits == [] and exits_2 == [] and exits_3 == [EXIT_RECORD_FAILED]
    for w in (worker, at_producer):
        assert w.health.problems[("worker", "deadletter_refused")] == 2
        assert w.counts["checkpoints"] == 1 and w.health.dead_letters == 2
    assert ("worker", "deadletter_refused") not in away.health.problems and away.counts["checkpoints"] == 0
    assert stream.acked == [1, 2, 1, 2]
    for w in (worker, at_producer, away):
        w.remove_data_dir()


@pytest.mark.kafka
def test_the_broker_takes_a_capped_dead_letter(kafka_settings: KafkaSettings) -> None:  # noqa: F811
    """The margin left under the dead-letter topic's limit covers what the broker counts."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition
    import uuid

    from foreshock.streams.kafka_codec import capped_deadletter
    from foreshock.streams.kafka_topics import ensure_topics

    topics = ensure_topics(kafka_settings, Topics(f"r86a{uuid.uuid4().hex[:8]}.", 1))
    value = bytes(range(256)) * (20 * 1024 * 1024 // 256)
    headers = [("foreshock-pieces", b"gpu:1:0:1:8;" * 5000), ("foreshock-source", b"t/0/1")]
    capped, capped_headers = capped_deadletter(b"frames/0", value, headers)

    async def run() -> Any:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap, acks=-1,
                                    max_request_size=CHECKPOINT_MAX_BYTES)
        await producer.start()
        try:
            await (await producer.send(topics.deadletter, key=b"frames/0", value=capped, headers=capped_headers,
                                       partition=0))
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_settings.bootstrap, enable_auto_commit=False,
                                    fetch_max_bytes=CHECKPOINT_MAX_BYTES,
                                    max_partition_fetch_bytes=CHECKPOINT_MAX_BYTES)
        await consumer.start()
        try:
            tp = TopicPartition(topics.deadletter, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            return (await consumer.getmany(tp, timeout_ms=20_000))[tp][0]
        finally:
            await consumer.stop()

    record = asyncio.run(run())
    assert capped is not None and record.value == capped and value.startswith(capped)
    assert dict(record.headers)["foreshock-original-bytes"] == str(len(value)).encode()


# ---- R2: what a record may decode to ----------------------------------------------------------------
def _gpu_rows(rows: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A bundle of ``rows`` rows of one GPU (slot 0), zstd: every column constant, a few KB."""
    frame = Frame.trusted("gpu", np.full(rows, 1.7e9), np.zeros(rows, np.int32), {"gpu_temp": np.full(rows, 50.0)})
    return encode_bundle("a#1", 0.0, [(1, 0, 1, frame)], "zstd", fields={"gpu": ["gpu_temp"]})


def test_a_record_declaring_more_rows_than_a_bundle_holds_is_undecodable(small_topology: Topology,
                                                                          monkeypatch) -> None:
    """8.6 KB of zstd decoded to 0.87 GB of columns (every field of 5 million rows); refused
    from the sizes the stream declares, before Arrow decompresses anything."""
    pmap = PartitionMap(small_topology, 1)
    bound = 2 * MAX_BUNDLE_BYTES // row_bytes("gpu")
    fits, fits_headers = _gpu_rows(bound // 2)
    bomb, bomb_headers = _gpu_rows(5_000_000)
    assert len(bomb) < 64 * 1024
    (piece,) = decode_bundle(fits, headers_dict(fits_headers), small_topology, pmap, 0)
    assert piece.error is None and piece.frame is not None and len(piece.frame) == bound // 2

    def no_decompression(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the stream was read")

    monkeypatch.setattr(pa.ipc, "open_stream", no_decompression)
    (piece,) = decode_bundle(bomb, headers_dict(bomb_headers), small_topology, pmap, 0)
    assert piece.error is not None and piece.error.reason == "undecodable" and piece.frame is None
    assert "declares" in str(piece.error)


def test_the_rows_count_besides_their_buffers_and_the_bound_is_the_whole_record_s(small_topology: Topology) -> None:
    """A stream sending 3 of a GPU's 21 columns declares a few MB of buffers, yet its frame holds
    every field of each row; and several streams share one record's bound."""
    pmap = PartitionMap(small_topology, 1)
    value, headers = _gpu_rows(1_000_000)  # 20 MB of buffers declared, 168 MB of frame
    (piece,) = decode_bundle(value, headers_dict(headers), small_topology, pmap, 0)
    assert piece.error is not None and piece.error.reason == "undecodable" and "rows" in str(piece.error)

    # a gpu stream of 60 % of the bound, then a link stream of 60 % more
    gpu_rows = int(0.6 * 2 * MAX_BUNDLE_BYTES) // row_bytes("gpu")
    link_rows = int(0.6 * 2 * MAX_BUNDLE_BYTES) // row_bytes("link")
    gpu = Frame.trusted("gpu", np.full(gpu_rows, 1.7e9), np.zeros(gpu_rows, np.int32),
                        {"gpu_temp": np.full(gpu_rows, 50.0)})
    link = Frame.trusted("link", np.full(link_rows, 1.7e9), np.zeros(link_rows, np.int32),
                         {"symbol_errors": np.full(link_rows, 0.0)})
    value, hd = encode_bundle("a#1", 0.0, [(1, 0, 2, gpu), (1, 1, 2, link)], "zstd",
                              fields={"gpu": ["gpu_temp"], "link": ["symbol_errors"]})
    pieces = decode_bundle(value, headers_dict(hd), small_topology, pmap, None)
    assert [p.error.reason if p.error else None for p in pieces] == ["undecodable", "undecodable"]


def test_the_detection_stage_dead_letters_a_decompression_bomb(small_topology: Topology) -> None:
    from foreshock.detectors.bank import DetectorBank
    from foreshock.streams.kafka_worker import DetectionStage

    stage = DetectionStage(small_topology, lambda hw: DetectorBank.from_names(hw, ["robust_zscore"]), 1)
    stage.load(0, None)
    bomb, headers = _gpu_rows(1_000_000)
    result = stage.process(0, 0, bomb, headers)
    assert [d.reason for d in result.dead_letters] == ["undecodable"] and result.rows == 0
    assert stage.health.problems[("worker", "undecodable")] == 1


# ---- R3: JSON values over several lines -------------------------------------------------------------
def test_a_pretty_printed_json_object_is_one_record(small_topology: Topology) -> None:
    rec = {"kind": "gpu", "entity": "node0/gpu0", "ts": 1.7e9, "gpu_temp": 55.0}
    other = {**rec, "entity": "node1/gpu2", "ts": 1.7e9 + 1}
    unknown = {**rec, "entity": "nope/gpu0"}
    for value in (json.dumps(rec, indent=2).encode(),
                  (json.dumps(rec, indent=2) + json.dumps(other, indent=4)).encode(),  # one after the other
                  (json.dumps(rec) + "\n" + json.dumps(other) + "\n").encode(),  # JSON lines
                  json.dumps([rec, other], indent=2).encode()):
        frames, bad = json_to_frames(value, small_topology)
        assert bad == [] and sum(len(f) for f in frames) == value.count(b'"gpu_temp"'), value
    # a rejected record of several lines goes to the dead letters as it came
    pretty = json.dumps(unknown, indent=2)
    frames, bad = json_to_frames((json.dumps(rec, indent=2) + "\n" + pretty).encode(), small_topology)
    assert sum(len(f) for f in frames) == 1 and [raw for raw, _ in bad] == [pretty.encode()]
    # JSON lines with a bad line: only that line is rejected
    lines = json.dumps(rec) + "\n{not json\n" + json.dumps(other)
    frames, bad = json_to_frames(lines.encode(), small_topology)
    assert sum(len(f) for f in frames) == 2 and [raw for raw, _ in bad] == [b"{not json"]


# ---- R6: findings messages within the topic's message size ------------------------------------------
def _reports(n: int, detail_bytes: int) -> list[PieceReport]:
    return [PieceReport(PieceInfo("a#1", seq, 0, 1, 5.0), 1.7e9 + seq, 8,
                        [Anomaly(1.7e9 + seq, "gpu", seq % 32, "gpu_temp", 9.0, "robust_zscore", "r" * detail_bytes)])
            for seq in range(1, n + 1)]


def test_a_findings_message_past_the_topic_s_limit_goes_in_several(tmp_path: Path, monkeypatch,
                                                                   small_topology: Topology) -> None:
    """A storm (every row a finding) made a 27 MB findings message: refused, the worker ended,
    and its restart made the same one. Every report is still read, once, in order."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    from foreshock.streams.kafka_worker import BundleResult

    reports = _reports(170, 100_000)
    message = encode_findings(reports, 0, 9, "w")
    assert len(message) > BUNDLE_MAX_MESSAGE_BYTES
    worker, sent, exits = _worker(small_topology)
    worker.detection.load(0, None)
    worker.detection.process = lambda *args: BundleResult(findings_message=message, pieces=170, rows=170 * 8)

    asyncio.run(worker.handle(worker.on_piece, _Stream(), _event(TOPICS.frames, 9, b"", [])))
    assert exits == []
    values = [v for name, v, _ in sent if name == "findings_topic"]
    assert len(values) >= 2 and all(len(v) < BUNDLE_MAX_MESSAGE_BYTES - 32 * 1024 for v in values)
    read = [m for v in values for m in decode_findings(v)]
    assert [m.seq for m in read] == list(range(1, 171))
    assert all(m.findings[0].reason == "r" * 100_000 for m in read)
    assert {json.loads(v)["offset"] for v in values} == {9}
    worker.remove_data_dir()


def test_split_findings_keeps_small_messages_and_each_report_whole() -> None:
    from foreshock.streams.kafka_codec import split_findings

    small = encode_findings(_reports(3, 10), 0, 1)
    assert split_findings(small) == ([small], [])
    message = encode_findings(_reports(40, 1000), 2, 7, "w")
    parts, cut = split_findings(message, max_bytes=5000)
    assert len(parts) > 5 and all(len(p) <= 5000 for p in parts) and cut == []
    assert [m for p in parts for m in decode_findings(p)] == decode_findings(message)
    # a report alone past the bound is not split (its piece's identity): it keeps what fits
    ((alone,), cut) = split_findings(encode_findings(_reports(1, 9000), 0, 1), max_bytes=5000)
    assert len(alone) <= 5000 and len(decode_findings(alone)) == 1 and len(cut) == 1


def _storm_report(seq: int, findings: int, reason_bytes: int = 60) -> PieceReport:
    """One piece's report where every GPU of the piece is predicted at once."""
    return PieceReport(PieceInfo("a#1", seq, 0, 1, 5.0), 1.7e9, findings,
                       [Prediction(1.7e9, "gpu", slot, "thermal_throttle", 40.0, 0.9, "thermal_forecast",
                                   "r" * reason_bytes) for slot in range(findings)])


def test_a_piece_report_alone_past_the_topic_s_limit_keeps_what_fits_and_the_worker_goes_on(
        tmp_path: Path, monkeypatch, small_topology: Topology) -> None:
    """A piece whose own report passed the findings topic's message size (4,681 GPU rows, a piece's
    most, each with a few findings of long reasons; or one finding with a reason of megabytes)
    was sent whole: refused, the next checkpoint raised, the worker ended, and its restart met
    the same record, for good. Now the report keeps the findings that fit, the rest are counted
    and the record goes to the dead letters; the worker checkpoints past it."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    from foreshock.streams.kafka_worker import BundleResult

    storm, small = _storm_report(1, 60_000, 200), _storm_report(2, 3)
    huge_reason = _storm_report(3, 1, BUNDLE_MAX_MESSAGE_BYTES)
    message = encode_findings([storm, small, huge_reason], 0, 9, "w")
    sent: list[Any] = []
    worker, _, exits = _worker(small_topology, findings_topic=_SizedTopic("findings_topic", sent),
                               deadletter_topic=_SizedTopic("deadletter_topic", sent),
                               checkpoint_topic=_Topic("checkpoint_topic", sent))
    _quiet(worker)
    worker.detection.load(0, None)
    worker.detection.process = lambda *args: BundleResult(findings_message=message, pieces=3, rows=60_004)
    stream = _Stream()

    async def run() -> None:
        await worker.handle(worker.on_piece, stream, _event(TOPICS.frames, 9, b"frames record", []))
        await worker.checkpoint_partition(stream, 0)  # raised: the findings message was refused

    asyncio.run(run())
    assert exits == [] and worker.counts["checkpoints"] >= 1
    values = [v for name, v, _ in sent if name == "findings_topic"]
    assert all(len(v) <= BUNDLE_MAX_MESSAGE_BYTES - 32 * 1024 for v in values)
    read = [m for v in values for m in decode_findings(v)]
    assert [m.seq for m in read] == [1, 2, 3]  # every piece still reported, once, in order
    assert 0 < len(read[0].findings) < 60_000 and read[0].findings == storm.findings[:len(read[0].findings)]
    assert read[1].findings == small.findings and read[2].findings == []
    assert worker.health.problems[("worker", "findings_too_large")] == 2
    ((value, headers),) = [(v, h) for name, v, h in sent if name == "deadletter_topic"]
    assert value == b"frames record" and dict(headers)["foreshock-reason-code"] == b"findings_too_large"
    worker.remove_data_dir()


# ---- R7.2: a revoked incident stage is checkpointed -------------------------------------------------
def test_a_revoked_incident_stage_is_checkpointed_without_acks(tmp_path: Path, monkeypatch,
                                                               small_topology: Topology) -> None:
    """Dropped without a checkpoint, its next owner ran every findings message since the last
    one again (up to --checkpoint-interval of them), publishing their incidents twice."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    worker, sent, exits = _worker(small_topology)
    _quiet(worker)
    stream = _Stream()

    async def run() -> None:
        for offset in (1, 2, 3):
            value = encode_findings(_reports(offset, 5)[-1:], 0, offset)
            await worker.handle(worker.on_findings, stream, _event(TOPICS.findings, offset, value, []))
        await worker.on_revoked([TP(TOPICS.findings, 0)])

    asyncio.run(run())
    assert exits == [] and stream.acked == []  # the partition is gone: its next owner skips by offset
    (blob,) = [v for name, v, _ in sent if name == "checkpoint_topic"]
    assert worker._new_incident_stage().load(blob) == 3
    assert not worker.incidents_loaded and worker.held_incidents == []
    worker.remove_data_dir()



# ---- clients outside the group closed at a worker's shutdown -----------------------------------------
class _Reader:
    def __init__(self) -> None:
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True


class _Admin:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_worker_s_shutdown_closes_its_readers_and_topic_id_client(tmp_path: Path, monkeypatch,
                                                                    small_topology: Topology) -> None:
    """faust stops what it made (its consumer, producer, agents); the checkpoint reader, the
    external.events reader and the topic-ID admin client were left open at every normal stop:
    their connections and fetch tasks ("Unclosed AIOKafkaConsumer")."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    worker, _, exits = _worker(small_topology)
    checkpoints, external, admin = _Reader(), _Reader(), _Admin()
    worker._ckpt_reader, worker._external_reader, worker.topic_ids._admin = checkpoints, external, admin

    asyncio.run(worker.app.on_stop())  # what the faust worker runs at SIGTERM, once its consumer stopped
    assert checkpoints.stopped and external.stopped and admin.closed and exits == []
    assert worker._ckpt_reader is None and worker._external_reader is None and worker.topic_ids._admin is None
    worker.remove_data_dir()
