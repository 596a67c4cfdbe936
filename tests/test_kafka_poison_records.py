"""Poison records: a malformed record on a topic a worker reads is counted, logged once and its
bytes as they came go to the dead letters; it never ends the worker. A record that ends the
worker is read again by its restart (or by the partition's next owner), which ends too: the
partition is stuck for good. And a message that was not delivered lets no checkpoint pass it.

No broker: faust's producer, topics and streams are stand-ins.
"""

from __future__ import annotations

import asyncio
import json
import types
from collections import namedtuple
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pytest
from aiokafka.structs import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.incident_external import MALFORMED, NOT_JSON, parse_line
from foreshock.frames import Frame, frames_from_records
from foreshock.streams.kafka_codec import (COMPRESSIONS, H_CONTENT, TELEMETRY, PartitionMap, RecordError,
                                           decode_bundle, decode_findings, encode_bundle, headers_dict,
                                           json_to_frames)
from foreshock.streams.kafka_config import KafkaSettings
from foreshock.streams.kafka_topics import Topics
from foreshock.streams.kafka_worker import DetectionStage
from foreshock.topology import Topology

TOPICS = Topics("t.", 2)
FRAMES_TOPIC, JSON_TOPIC, FINDINGS_TOPIC = TOPICS.frames, TOPICS.json, TOPICS.findings


def _gpu_frame(rows: int = 8) -> Frame:
    return Frame("gpu", np.linspace(1.0, 2.0, rows), np.arange(rows),
                 {"gpu_temp": np.linspace(40.0, 80.0, rows), "power": np.linspace(100.0, 300.0, rows)})


def _mutated(stream: bytes, size: int, old: int, new: int, refusal: type[Exception]) -> bytes:
    """``stream`` with one little-endian integer of ``size`` bytes holding ``old`` set to ``new``,
    the first such place where Arrow itself (not foreshock) then raises ``refusal`` reading it:
    what a damaged message in transit can hold."""
    want, put = old.to_bytes(size, "little"), new.to_bytes(size, "little")
    for at in range(len(stream) - size + 1):
        if stream[at:at + size] != want:
            continue
        candidate = stream[:at] + put + stream[at + size:]
        try:
            pa.ipc.open_stream(pa.py_buffer(candidate)).read_all()
        except refusal:
            return candidate
        except Exception:
            continue
    raise AssertionError(f"no place in the stream where {old} -> {new} makes Arrow raise {refusal.__name__}")


# ---- frames topic: decode_bundle ------------------------------------------------------------
def test_stream_sizes_and_sequence_numbers_below_zero_are_bad_headers(small_topology: Topology) -> None:
    """Sizes that still add up to the value's length sliced the buffer outside it (Arrow's
    IndexError, not a RecordError: the worker ended, and again after every restart)."""
    pmap = PartitionMap(small_topology, 1)
    value, headers = encode_bundle("a#1", 0.0, [(1, 0, 1, _gpu_frame())], topology=small_topology)
    h = headers_dict(headers)
    negative_size = {**h, "foreshock-streams": f"gpu:{len(value) + 8};job:-8".encode()}
    negative_seq = {**h, "foreshock-pieces": b"gpu:-3:0:1:8"}
    for hd, named in ((negative_size, "-8 bytes"), (negative_seq, "sequence number -3")):
        with pytest.raises(RecordError, match=named) as caught:
            decode_bundle(value, hd, small_topology, pmap, 0)
        assert caught.value.reason == "bad_headers"


def test_streams_arrow_cannot_read_are_undecodable(small_topology: Topology) -> None:
    """Arrow raises more than ArrowInvalid for damaged bytes: a type it does not implement (an
    integer of 128 bits), a buffer to decompress into that it cannot allocate."""
    pmap = PartitionMap(small_topology, 1)
    frame = _gpu_frame(32)
    plain, headers = encode_bundle("a#1", 0.0, [(1, 0, 1, frame)], topology=small_topology)
    packed, packed_headers = encode_bundle("a#1", 0.0, [(1, 0, 1, frame)], "lz4", topology=small_topology)
    cases = [
        (_mutated(plain, 4, 32, 128, pa.ArrowNotImplementedError), headers),  # slot: int32 -> int128
        # an LZ4 buffer's uncompressed length (its first 8 bytes): the ts column's, 32 float64
        (_mutated(packed, 8, 32 * 8, 1 << 50, pa.ArrowMemoryError), packed_headers),
    ]
    for value, hd in cases:
        assert len(value) == len(plain if hd is headers else packed)
        pieces = decode_bundle(value, headers_dict(hd), small_topology, pmap, 0)
        assert [p.error.reason if p.error else None for p in pieces] == ["undecodable"]
        assert all(p.frame is None for p in pieces)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(compression=st.sampled_from(COMPRESSIONS),
       flips=st.lists(st.tuples(st.floats(0.0, 1.0, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=6))
def test_damaged_bundles_raise_nothing_but_record_error(small_topology: Topology, compression: str | None,
                                                        flips: list[tuple[float, int]]) -> None:
    """Whatever bytes of a valid bundle are changed (where in it: a fraction of its length),
    decoding it either works or raises RecordError: anything else ended the worker."""
    pmap = PartitionMap(small_topology, 1)
    rack = Frame("rack", np.ones(2), np.arange(2), {"inlet_temp": np.array([20.0, 21.0])})
    value, headers = encode_bundle("a#1", 0.0, [(1, 0, 2, _gpu_frame(32)), (1, 1, 2, rack)], compression,
                                   topology=small_topology)
    damaged = bytearray(value)
    for where, byte in flips:
        damaged[int(where * len(damaged))] = byte
    try:
        pieces = decode_bundle(bytes(damaged), headers_dict(headers), small_topology, pmap, 0)
    except RecordError:
        return
    assert len(pieces) == 2  # the headers, untouched, name the pieces


# ---- the detection stage's backstop -------------------------------------------------------------
def test_the_detection_stage_dead_letters_anything_decoding_raises(small_topology: Topology, monkeypatch) -> None:
    """Decoding is the one place a record's bytes are read: whatever it raises is that record's
    fault, a dead letter ``undecodable``. What the detectors raise still ends the worker."""
    stage = DetectionStage(small_topology, lambda hw: DetectorBank.from_names(hw, ["robust_zscore"]), 1)
    stage.load(0, None)
    value, headers = encode_bundle("a#1", 0.0, [(1, 0, 1, _gpu_frame())], topology=small_topology)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("a decoder's bug")

    monkeypatch.setattr("foreshock.streams.kafka_worker.decode_bundle", broken)
    result = stage.process(0, 1, value, headers)
    assert [(d.reason, d.value) for d in result.dead_letters] == [("undecodable", None)]
    assert "ZeroDivisionError" in result.dead_letters[0].detail and result.findings_message is None
    assert stage.health.problems[("worker", "undecodable")] == 1
    monkeypatch.undo()

    def failing_detectors(frame: Frame, received_wall: float | None = None) -> Any:
        raise ZeroDivisionError("a detector's bug")

    monkeypatch.setattr(stage.parts[0].pipeline, "process_rows", failing_detectors)
    with pytest.raises(ZeroDivisionError):
        stage.process(0, 2, value, headers)


# ---- JSON records -------------------------------------------------------------------------
def test_json_numbers_beyond_float_range_and_deep_nesting_are_rejected_not_raised(small_topology: Topology) -> None:
    """json.loads raises ValueError (not JSONDecodeError) for an integer of more than 4,300
    digits and RecursionError for deep nesting; float() raises OverflowError for an integer of a
    few hundred digits. Each ended the worker."""
    gpu = b'{"kind":"gpu","entity":"node0/gpu1","ts":'
    huge = b"9" * 400
    cases = {
        gpu + huge + b"}": "non-finite 'ts'",  # as 1e999 is
        gpu + b"1.0,\"gpu_temp\":" + b"9" * 5000 + b"}": "invalid JSON",
        b"[" * 100_000 + b"]" * 100_000: "invalid JSON",
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000: "invalid JSON",
    }
    for value, reason in cases.items():
        frames, bad = json_to_frames(value, small_topology)
        assert frames == [] and len(bad) == 1 and bad[0][1].startswith(reason), (value[:60], bad)
        assert bad[0][0] == value  # one record per message here: the dead letter is all of it
    # a field of a few hundred digits is an infinity, as 1e999 is: the input guard counts it and
    # sets it to NaN, the rest of the row stays
    frames, bad = json_to_frames(gpu + b"1.0,\"gpu_temp\":-" + huge + b",\"power\":300}", small_topology)
    assert bad == [] and frames[0].columns["gpu_temp"][0] == -np.inf and frames[0].columns["power"][0] == 300.0
    # the function the import command uses too
    _, rejected = frames_from_records([{"kind": "gpu", "entity": "node0/gpu1", "ts": int(huge)}],
                                      small_topology.slots_resolver())
    assert [reason for _, reason in rejected] == ["non-finite 'ts'"]


def test_json_dead_letters_are_the_records_bytes_as_they_came(small_topology: Topology) -> None:
    """The record re-serialised was not the record: duplicate keys collapsed, 1e999 became
    Infinity (not JSON), a non-object became {"raw": "..."}. And a record holding U+2028 (valid
    in a JSON string as it is) was cut in two by str.splitlines."""
    records = [
        '{"kind":"gpu","entity":"node9/gpu0","ts":1.0,"gpu_temp":70,"gpu_temp":71}',
        '{"kind":"gpu","entity":"node0/gpu0","ts":1e999}',
        '"just a string"',
        '{"kind":"gpu",  "entity":"node0/gpu0","ts":1.0,"fan":1}',
        '{"kind":"gpu","entity":"node0/gpu0\u2028","ts":1.0}',
    ]
    good = '{"kind":"gpu","entity":"node0/gpu2","ts":5.0,"gpu_temp":50}'
    as_lines = ("\r\n".join([records[0], good, *records[1:3]]) + "\n  " + "\n".join(records[3:]) + "  \n").encode()
    as_array = ("[ " + ",\n ".join([records[0], good, *records[1:]]) + " ]").encode()
    for value in (as_lines, as_array):
        frames, bad = json_to_frames(value, small_topology)
        assert [raw for raw, _ in bad] == [r.encode() for r in records]
        assert len(frames) == 1 and frames[0].slot.tolist() == [small_topology.slots_resolver()("gpu", "node0/gpu2")]


def test_external_event_lines_beyond_float_range_or_nested_deep_are_bad_lines() -> None:
    """The incident worker's external.events reader: a line that raised ended it, and its reader
    seeks back to the same record after the restart."""
    cases = {
        b'{"node":"node0","time":' + b"9" * 400 + b',"type":"fan_failure"}': MALFORMED,
        b'{"node":"node0","time":-' + b"9" * 400 + b',"type":"fan_failure"}': MALFORMED,
        b"[" * 100_000 + b"]" * 100_000: NOT_JSON,
    }
    for line, reason in cases.items():
        event, got, _ = parse_line(line)
        assert event is None and got == reason


def test_findings_messages_beyond_float_range_or_nested_deep_are_undecodable() -> None:
    valid = json.loads(b'{"sent":1.0,"pieces":[]}')
    assert decode_findings(json.dumps(valid).encode()) == []
    for value in (b'{"sent":' + b"9" * 400 + b',"pieces":[]}', b"[" * 100_000 + b"]" * 100_000):
        with pytest.raises(RecordError) as caught:
            decode_findings(value)
        assert caught.value.reason == "undecodable"


# ---- through the worker -------------------------------------------------------------------
class _Topic:
    """faust's topic: ``send`` gives a future of the delivery, settled ``delay(key)`` seconds
    later, failed where ``fail(key)`` (as aiokafka's, when a batch expires)."""

    def __init__(self, name: str, sent: list[tuple[str, Any, Any]], fail: Callable[[Any], bool] = lambda key: False,
                 delay: Callable[[Any], float] = lambda key: 0.0) -> None:
        self.name, self.sent, self.fail, self.delay = name, sent, fail, delay
        self.futures: list[asyncio.Future[None]] = []

    async def send(self, key: Any = None, value: bytes = b"", partition: Any = None, headers: Any = None,
                   force: bool = False) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        self.sent.append((self.name, value, headers))
        if self.fail(key):
            error = TimeoutError(f"{self.name} {key!r}")
            asyncio.get_running_loop().call_later(self.delay(key), future.set_exception, error)
        else:
            asyncio.get_running_loop().call_later(self.delay(key), future.set_result, None)
        return future


class _Producer:
    async def flush(self) -> None:  # aiokafka's: waits a while, never raises
        await asyncio.sleep(0)


class _Stream:
    def __init__(self) -> None:
        self.acked: list[int] = []

    async def ack(self, event: Any) -> None:
        self.acked.append(event.message.offset)


def _event(topic: str, offset: int, value: bytes, headers: Any, partition: int = 0) -> Any:
    return types.SimpleNamespace(message=types.SimpleNamespace(topic=topic, partition=partition, offset=offset,
                                                               value=value, headers=headers, key=b"k"))


def _worker(topology: Topology, partitions: int = 1, **topics: _Topic) -> tuple[Any, list[Any], list[int]]:
    from foreshock.streams.faust_app import ForeshockWorker, WorkerConfig

    worker = ForeshockWorker(WorkerConfig(KafkaSettings("127.0.0.1:9"), Topics("t.", partitions), topology,
                                          lambda hw: DetectorBank.from_names(hw, ["robust_zscore"]), app_id="t-app",
                                          checkpoint_interval_s=3600))
    sent: list[Any] = []
    exits: list[int] = []
    worker.app.producer = _Producer()  # type: ignore[assignment]
    for attr in ("findings_topic", "checkpoint_topic", "deadletter_topic", "frames_topic", "incidents_topic"):
        setattr(worker, attr, topics.get(attr) or _Topic(attr, sent))

    async def no_checkpoint(partition: int) -> None:
        return None

    async def no_topic_id(topic: str) -> None:  # no broker to ask (each try would wait its timeout)
        return None

    worker.read_checkpoint = no_checkpoint  # type: ignore[method-assign]
    worker.topic_id = no_topic_id  # type: ignore[method-assign]
    worker._exit = exits.append
    # as faust's rebalance does before the first event: the worker processes the frames
    # partitions assigned to it (ForeshockWorker.on_assigned)
    worker.on_assigned({TopicPartition(worker.config.topics.frames, p) for p in range(partitions)})
    return worker, sent, exits


def test_the_worker_dead_letters_poison_records_and_goes_on(tmp_path: Path, monkeypatch,
                                                             small_topology: Topology) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    value, headers = encode_bundle("a#1", 0.0, [(1, 0, 1, _gpu_frame())], topology=small_topology)
    negative = list({**headers_dict(headers), "foreshock-streams": f"gpu:{len(value) + 8};job:-8".encode()}.items())
    nested = b"[" * 100_000 + b"]" * 100_000
    bad_line = b'{"kind":"gpu","entity":"nope/gpu0","ts":1.0}'
    huge_field = b'{"kind":"gpu","entity":"node0/gpu0","ts":1.0,"gpu_temp":' + b"9" * 400 + b"}"
    worker, sent, exits = _worker(small_topology)
    stream = _Stream()

    async def run() -> None:
        await worker.handle(worker.on_piece, stream, _event(FRAMES_TOPIC, 5, value, negative))
        for offset, record in enumerate((nested, bad_line + b"\n" + huge_field), start=1):
            await worker.handle(lambda _s, e: worker.on_json(e), stream, _event(JSON_TOPIC, offset, record, []))

    asyncio.run(run())
    assert exits == []
    dead = [(value_, dict(hd)) for name, value_, hd in sent if name == "deadletter_topic"]
    assert [v for v, _ in dead] == [value, nested, bad_line]
    assert [hd["foreshock-reason-code"] for _, hd in dead] == [b"bad_headers", b"invalid_record", b"invalid_record"]
    # the record with a huge field value went on as a frame (its value an infinity, for the guard)
    assert [name for name, _, _ in sent].count("frames_topic") == 1
    assert worker.health.problems[("worker", "bad_headers")] == 1
    assert worker.health.problems[("route_json", "invalid_record")] == 2
    worker.remove_data_dir()


def test_the_incident_stage_dead_letters_undecodable_findings_and_telemetry(tmp_path: Path, monkeypatch,
                                                                             small_topology: Topology) -> None:
    """The findings topic carries forwarded telemetry bundles too (decode_bundle): Arrow's
    refusals there, and a findings message with a number beyond float range, ended the worker
    that owns the incident stage."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    plain, headers = encode_bundle("a#1", 0.0, [(1, 0, 1, _gpu_frame(32))], topology=small_topology)
    telemetry = _mutated(plain, 4, 32, 128, pa.ArrowNotImplementedError)
    worker, sent, exits = _worker(small_topology)
    stream = _Stream()

    async def no_external() -> None:  # (its reader needs a broker; what it reads is another test's)
        return None

    worker.poll_external = no_external  # type: ignore[method-assign]
    records = [(telemetry, headers + [(H_CONTENT, TELEMETRY)]), (b'{"sent":' + b"9" * 400 + b',"pieces":[]}', [])]

    async def run() -> None:
        for offset, (value, hd) in enumerate(records, start=1):
            await worker.handle(worker.on_findings, stream, _event(FINDINGS_TOPIC, offset, value, hd))

    asyncio.run(run())
    assert exits == []
    dead = [(v, dict(hd)["foreshock-reason-code"]) for name, v, hd in sent if name == "deadletter_topic"]
    assert dead == [(telemetry, b"undecodable"), (records[1][0], b"undecodable")]
    assert worker.health.problems[("incidents", "undecodable")] == 2
    worker.remove_data_dir()


# ---- delivery before checkpoints ------------------------------------------------------------
def test_a_send_failed_during_a_rebalance_lets_no_later_checkpoint_pass(tmp_path: Path, monkeypatch,
                                                                        small_topology: Topology) -> None:
    """_confirm_sent took the whole list of unconfirmed sends, then raised at the first failure:
    the others were no longer tracked, on_revoked went on to the next partition, whose
    checkpoint found nothing to wait for and passed findings that failed a moment later."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    from foreshock.streams.faust_app import EXIT_RECORD_FAILED

    sent: list[Any] = []
    # partition 0's findings are refused at once, partition 1's a moment later
    findings = _Topic("findings_topic", sent, fail=lambda key: True, delay=lambda key: 0.0 if key == b"0" else 0.05)
    checkpoints = _Topic("checkpoint_topic", sent)

    async def run() -> tuple[Any, list[int]]:
        worker, _, exits = _worker(small_topology, 2, findings_topic=findings, checkpoint_topic=checkpoints)
        pmap = PartitionMap(small_topology, 2)
        stream = _Stream()
        for p in (0, 1):
            slots = np.flatnonzero(pmap.by_kind["gpu"] == p)[:4]
            frame = Frame("gpu", np.ones(len(slots)), slots, {"gpu_temp": np.full(len(slots), 50.0)})
            value, headers = encode_bundle("a#1", 0.0, [(1, p, 2, frame)], topology=small_topology)
            await worker.handle(worker.on_piece, stream, _event(FRAMES_TOPIC, 7, value, headers, partition=p))
        TP = namedtuple("TP", "topic partition")
        await worker.on_revoked([TP(FRAMES_TOPIC, 0), TP(FRAMES_TOPIC, 1)])
        # sends delivered later do not make a checkpoint possible again: only the restart does
        await worker._send(worker.incidents_topic, key=b"x", value=b"")
        with pytest.raises(RuntimeError, match="not delivered"):
            await worker._write_checkpoint(1, "detect/1", b"")
        return worker, exits

    worker, exits = asyncio.run(run())
    assert checkpoints.futures == []
    assert exits == [EXIT_RECORD_FAILED]
    assert findings.futures and all(f.done() for f in findings.futures)  # every one awaited
    assert worker.health.problems[("worker", "send_failed")] == len(findings.futures)
    worker.remove_data_dir()
