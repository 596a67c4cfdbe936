"""Checkpoints of a deleted and re-created topic, told by its topic ID, and an incident checkpoint
refused half-way.

- A checkpoint was taken for one of a re-created topic only while its offset was at or past the
  partition's end (``checkpoint_ahead_of_topic``). Once the new topic had grown past the old
  offset, every record up to it was skipped as "covered", silently: the new topic's first
  records never reached the detectors or the incident processors. Kafka gives a re-created topic
  a new ID: the checkpoints now carry their topic's, and one of another ID is counted
  (``checkpoint_topic_recreated``) and the stage starts fresh. Checkpoints written before, and
  stages that cannot read the ID, keep the offset checks.
- ``IncidentStage.load`` took a checkpoint's parts one by one: one refused half-way left the
  processors and senders loaded before it in a stage reporting ``checkpoint_unusable`` and going
  on as fresh. A refused checkpoint now leaves the stage as it was made.

The broker tests (marked ``kafka``) delete and re-create real topics (named ``h107.*``)."""

from __future__ import annotations

import pickle
import time
import zlib
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka_support import kafka_settings, unique_topic  # noqa: F401

from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.incident_external import ExternalEvent
from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, finding_to_json
from foreshock.frames import Frame
from foreshock.streams.kafka_codec import PieceInfo, PieceReport, decode_findings, encode_bundle, encode_findings
from foreshock.streams.kafka_config import KafkaSettings
from foreshock.streams.kafka_worker import (CHECKPOINT_VERSION, DetectionStage, FindingsMessage, IncidentStage,
                                            decode_checkpoint, encode_checkpoint)
from foreshock.topology import Topology

from kafka_frame_log import FrameLog

START = 1_800_000_000.0
OLD_ID, NEW_ID = "6b1a9f44-0d0e-4c55-9a57-8f0c51d6a001", "0f3b7c2e-51aa-4e0b-b1f4-2c9d9e7a5002"


def _gpu_record(topology: Topology, seq: int) -> tuple[bytes, Any]:
    n = topology.size("gpu")
    frame = Frame("gpu", np.full(n, 1.7e9 + seq), np.arange(n), {"gpu_temp": np.full(n, 50.0)})
    return encode_bundle("a#1", 0.0, [(seq, 0, 1, frame)], topology=topology)


def _detection(topology: Topology) -> DetectionStage:
    return DetectionStage(topology, lambda hw: DetectorBank.from_names(hw, ["robust_zscore"]), 1,
                          max_ahead_s=float("inf"))


def _detect_checkpoint(topology: Topology, offset: int, topic_id: str | None) -> bytes:
    """A partition's checkpoint at ``offset``, written by a stage that read the topic's ID as ``topic_id``."""
    stage = _detection(topology)
    stage.load(0, None, topic_id=topic_id)
    stage.parts[0].offset = offset
    return stage.checkpoint(0)[1]


def _without_topic_id(blob: bytes, kind: str, signature: str) -> bytes:
    """``blob`` as a worker of before wrote it: no topic_id key (zlib: the first format, still read)."""
    saved = decode_checkpoint(blob, kind, signature)
    return zlib.compress(pickle.dumps({"version": CHECKPOINT_VERSION, "kind": kind, "signature": signature,
                                       "offset": saved.offset, "state": saved.state, "previous": saved.previous,
                                       "hardware": saved.hardware, "layout": saved.layout}))


# ---- the detect stage ---------------------------------------------------------------------------
def test_a_detect_checkpoint_of_a_re_created_topic_grown_past_it_starts_fresh(small_topology: Topology):
    """The new topic's end (20) is past the checkpoint's offset (9): the end offset cannot tell,
    and records 0..9 of the new topic were skipped. The topic ID does."""
    topo = small_topology
    blob = _detect_checkpoint(topo, 9, OLD_ID)
    assert decode_checkpoint(blob, "detect", _detection(topo).signature).topic_id == OLD_ID

    recreated = _detection(topo)
    assert recreated.load(0, blob, end_offset=20, topic_id=NEW_ID) == -1
    assert dict(recreated.health.problems) == {("worker", "checkpoint_topic_recreated"): 1}
    results = [recreated.process(0, off, *_gpu_record(topo, off + 1)) for off in range(20)]
    assert not any(r.skipped for r in results) and all(r.findings_message for r in results)
    # its checkpoints name the new topic from now on
    assert decode_checkpoint(recreated.checkpoint(0)[1], "detect", recreated.signature).topic_id == NEW_ID

    same = _detection(topo)  # the same topic: resumed, the repeats skipped, nothing counted
    assert same.load(0, blob, end_offset=20, topic_id=OLD_ID) == 9
    assert [same.process(0, off, *_gpu_record(topo, off + 1)).skipped for off in (8, 9, 10)] == [True, True, False]
    assert not same.health.problems


def test_without_a_topic_id_on_either_side_the_offsets_decide_as_before(small_topology: Topology):
    """A checkpoint written before topic IDs, or a worker that could not read the ID: loaded as
    before (and the ID read now, or the checkpoint's, goes on in the next checkpoints)."""
    topo = small_topology
    signature = _detection(topo).signature
    old_format = _without_topic_id(_detect_checkpoint(topo, 9, OLD_ID), "detect", signature)
    assert decode_checkpoint(old_format, "detect", signature).topic_id is None
    for blob, topic_id, carried in [(old_format, NEW_ID, NEW_ID), (_detect_checkpoint(topo, 9, OLD_ID), None, OLD_ID),
                                    (_detect_checkpoint(topo, 9, None), None, None)]:
        stage = _detection(topo)
        assert stage.load(0, blob, end_offset=20, topic_id=topic_id) == 9 and not stage.health.problems
        assert stage.process(0, 9, *_gpu_record(topo, 1)).skipped
        assert decode_checkpoint(stage.checkpoint(0)[1], "detect", signature).topic_id == carried
        ahead = _detection(topo)  # the offset check is still there
        assert ahead.load(0, blob, end_offset=3, topic_id=topic_id) == -1
        assert dict(ahead.health.problems) == {("worker", "checkpoint_ahead_of_topic"): 1}


def test_with_the_same_topic_id_a_skip_below_the_checkpoint_before_is_not_taken_for_a_re_created_topic(
        small_topology: Topology):
    """Without the end offset, a skip at or below the checkpoint before the loaded one is counted
    as a probable re-creation (``skipped_below_checkpoint``); the same topic ID rules that out."""
    topo = small_topology
    stage = _detection(topo)
    stage.load(0, None, topic_id=OLD_ID)
    for off in range(10):
        stage.process(0, off, *_gpu_record(topo, off + 1))
        if off in (4, 9):
            offset, blob = stage.checkpoint(0)
            stage.mark_checkpointed(0, offset)
    same = _detection(topo)
    assert same.load(0, blob, topic_id=OLD_ID) == 9
    assert same.process(0, 2, *_gpu_record(topo, 3)).skipped and not same.health.problems
    unknown = _detection(topo)
    assert unknown.load(0, blob) == 9 and unknown.process(0, 2, *_gpu_record(topo, 3)).skipped
    assert dict(unknown.health.problems) == {("worker", "skipped_below_checkpoint"): 1}


# ---- the incident stage ---------------------------------------------------------------------------

def _piece(agent: str, seq: int, part: int = 0, parts: int = 1) -> FindingsMessage:
    (report,) = decode_findings(encode_findings([PieceReport(PieceInfo(agent, seq, part, parts, 0.0), float(seq), 1,
                                                             [Anomaly(float(seq), "gpu", part, "gpu_temp", 9.0, "d")])],
                                                part, 0))
    return report


def _incident_checkpoint(offset: int, topic_id: str | None) -> bytes:
    stage = IncidentStage([FrameLog()], clock=lambda: START)
    stage.load(None, topic_id=topic_id)
    stage.offset = offset
    return stage.checkpoint()[1]


ids = st.sampled_from([None, OLD_ID, NEW_ID])


@settings(max_examples=150, deadline=None)
@given(saved_id=ids, topic_id=ids, offset=st.integers(0, 2000), end=st.one_of(st.none(), st.integers(0, 4000)))
def test_the_incident_stage_starts_fresh_exactly_for_another_topic_id_or_an_offset_not_reached(
        saved_id: str | None, topic_id: str | None, offset: int, end: int | None):
    """A checkpoint of foreshock.findings is of another topic when both IDs are known and differ,
    whatever the offsets; otherwise when its offset is not reached (as before)."""
    blob = _incident_checkpoint(offset, saved_id)
    stage = IncidentStage([FrameLog()], clock=lambda: START)
    other_id = saved_id is not None and topic_id is not None and saved_id != topic_id
    not_reached = end is not None and offset >= end
    loaded = stage.load(blob, end_offset=end, topic_id=topic_id)
    if other_id:
        assert loaded == -1 and dict(stage.health.problems) == {("worker", "checkpoint_topic_recreated"): 1}
        assert not stage.covered(0) and not stage.covered(offset)
    elif not_reached:
        assert loaded == -1 and dict(stage.health.problems) == {("worker", "checkpoint_ahead_of_topic"): 1}
    else:
        assert loaded == offset and stage.covered(offset) and not stage.covered(offset + 1)
        assert not stage.health.problems
    # the ID its checkpoints carry from now on: the one read, else the loaded checkpoint's
    expected = topic_id if topic_id is not None or loaded == -1 else saved_id
    assert decode_checkpoint(stage.checkpoint()[1], "incidents", stage.signature).topic_id == expected


def test_an_incident_checkpoint_of_before_topic_ids_still_loads():
    stage = IncidentStage([FrameLog()], clock=lambda: START)
    old = _without_topic_id(_incident_checkpoint(1000, OLD_ID), "incidents", stage.signature)
    assert stage.load(old, end_offset=1001, topic_id=NEW_ID) == 1000 and not stage.health.problems


# ---- a refused incident checkpoint leaves the stage fresh -------------------------------------------
def _event(node: str, t: float, typ: str) -> ExternalEvent:
    return ExternalEvent(node, t, typ, "critical")


def _frame(seq: int) -> FindingsMessage:
    (report,) = decode_findings(encode_findings([PieceReport(PieceInfo("a", seq, 0, 1, 0.0), START + 10.0 * seq, 1,
                                                             [])], 0, 0))
    return report


def _stage(topology: Topology) -> IncidentStage:
    return IncidentStage([IncidentEngine(topology), FrameLog()], clock=lambda: START)


def _same(a: Any, b: Any, where: str = "state") -> None:
    """Deep equality, arrays included (NaN equal to NaN)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), where
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"


def _whole(stage: IncidentStage) -> dict[str, Any]:
    """Everything a stage holds: its checkpointed state and what is not in it."""
    return {"state": stage.state(), "offset": stage.offset, "fresh_since": stage.fresh_since,
            "waiting": {a: sorted(s) for a, s in stage.waiting.items()}, "topic_id": getattr(stage, "topic_id", None),
            "cover": vars(stage.cover), "engine_members": {level: arr for level, arr in
                                                          stage.processors[0].s_member_of.items()}}  # type: ignore[attr-defined]


def _break_pending(state: dict[str, Any]) -> None:
    state["pending"] = {("a", 90, "not a frame"): {}}


def _break_taken_up(state: dict[str, Any]) -> None:
    state["taken_up"] = {"a": (1,)}


def _break_external_offset(state: dict[str, Any]) -> None:
    state["external_offset"] = "twelve"


def _break_second_processor(state: dict[str, Any]) -> None:
    state["processors"]["frame_log"] = {}  # no "seen": after the engine took its state


def _break_engine_half_way(state: dict[str, Any]) -> None:
    # an incident without its fields after a good one: the engine has reset its indexes by then
    state["processors"]["incidents"]["incidents"].append({"serial": 99})


@pytest.mark.parametrize("corrupt", [_break_pending, _break_taken_up, _break_external_offset,
                                     _break_second_processor, _break_engine_half_way])
def test_an_incident_checkpoint_refused_half_way_leaves_the_stage_as_made(
        small_topology: Topology, corrupt: Callable[[dict[str, Any]], None]):
    """Before, ``pending``, ``taken_up`` or ``external_offset`` malformed, or a processor's state
    unreadable, left the processors, released senders and pending frames loaded before it: the
    stage reported checkpoint_unusable and went on with another stage's half."""
    topo = small_topology
    source = _stage(topo)
    source.add_external([_event("node3", START + 60, "psu_failure")], 0)
    for q in range(1, 40):
        source.observe(_frame(q))
    source.observe(_piece("b", 1, 0, 2))  # a frame waiting for its second piece
    source.offset = 50
    _, blob = source.checkpoint()
    saved = decode_checkpoint(blob, "incidents", source.signature)
    assert saved.state["pending"] and saved.state["processors"]["incidents"]["incidents"]
    corrupt(saved.state)
    broken = encode_checkpoint(saved.offset, saved.state, "incidents", source.signature, topo, layout=True)

    stage, fresh = _stage(topo), _stage(topo)
    assert stage.load(broken) == -1
    assert dict(stage.health.problems) == {("worker", "checkpoint_unusable"): 1}
    _same(_whole(stage), _whole(fresh))
    stage.processors[0].check_invariants()  # type: ignore[attr-defined]
    # and it behaves as one: the same findings, frame by frame, of a sender the checkpoint had released
    for q in range(1, 45):
        assert [finding_to_json(f) for f in stage.observe(_frame(q))] == \
            [finding_to_json(f) for f in fresh.observe(_frame(q))]
    # a good checkpoint still loads whole
    good = _stage(topo)
    assert good.load(blob) == 50 and not good.health.problems
    _same(good.state(), source.state())


# ---- the real broker -----------------------------------------------------------------------------
def _admin(settings: KafkaSettings) -> Any:
    from kafka import KafkaAdminClient

    return KafkaAdminClient(**settings.kafka_python(), request_timeout_ms=20_000)


def _create(admin: Any, topic: str, timeout_s: float = 60.0) -> None:
    """Create ``topic`` (one partition), retrying while its deleted namesake is still going."""
    from kafka.errors import TopicAlreadyExistsError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1}}, timeout_ms=20_000,
                                wait_for_metadata=True)
            return
        except TopicAlreadyExistsError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _delete(admin: Any, topic: str, timeout_s: float = 60.0) -> None:
    admin.delete_topics([topic], timeout_ms=20_000)
    deadline = time.monotonic() + timeout_s
    while topic in admin.list_topics():
        assert time.monotonic() < deadline, f"{topic} still listed {timeout_s:g} s after its deletion"
        time.sleep(0.3)


def _produce(settings: KafkaSettings, topic: str, records: list[tuple[bytes, Any]]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(**settings.kafka_python(), acks="all", max_request_size=16 * 1024 * 1024)
    try:
        for value, headers in records:
            producer.send(topic, value=value, headers=list(headers or []), partition=0)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


def _read_all(settings: KafkaSettings, topic: str) -> tuple[list[Any], int]:
    """Every record of the topic's partition 0, and its end offset (read first, as the worker does)."""
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(**settings.kafka_python(), enable_auto_commit=False, consumer_timeout_ms=10_000,
                             fetch_max_bytes=64 * 1024 * 1024, max_partition_fetch_bytes=16 * 1024 * 1024)
    try:
        consumer.assign([tp])
        end: int = consumer.end_offsets([tp])[tp]
        consumer.seek_to_beginning(tp)
        records = []
        for record in consumer:
            records.append(record)
            if record.offset + 1 >= end:
                break
    finally:
        consumer.close()
    assert [r.offset for r in records] == list(range(end)), "records missing from the topic"
    return records, end


@pytest.mark.kafka
def test_a_worker_restarted_on_a_re_created_frames_topic_grown_past_its_checkpoint_reads_every_record(
        kafka_settings: KafkaSettings, small_topology: Topology):
    """telemetry.frames deleted and re-created, then 15 records written (past the old checkpoint's
    offset 9) before a detect worker restarts from the old checkpoint: each of the 15 is processed.
    (HEAD read the end offset alone, 15 > 9: records 0..9 were skipped as covered, uncounted.)"""
    from foreshock.streams.kafka_worker import TopicIds

    topo = small_topology
    topic = unique_topic("h107.frames")
    admin = _admin(kafka_settings)
    ids = TopicIds(kafka_settings)
    try:
        _create(admin, topic)
        first_id = ids.read(topic)
        assert first_id is not None
        _produce(kafka_settings, topic, [_gpu_record(topo, seq) for seq in range(1, 11)])
        worker = _detection(topo)
        records, end = _read_all(kafka_settings, topic)
        assert worker.load(0, None, end, topic_id=ids.read(topic)) == -1
        assert not any(worker.process(0, r.offset, r.value, r.headers).skipped for r in records)
        offset, blob = worker.checkpoint(0)
        assert offset == 9 and decode_checkpoint(blob, "detect", worker.signature).topic_id == first_id

        _delete(admin, topic)
        _create(admin, topic)
        _produce(kafka_settings, topic, [_gpu_record(topo, seq) for seq in range(1, 16)])
        records, end = _read_all(kafka_settings, topic)
        new_id = ids.read(topic)
        assert end == 15 and new_id not in (None, first_id)

        restarted = _detection(topo)
        assert restarted.load(0, blob, end, topic_id=new_id) == -1
        assert dict(restarted.health.problems) == {("worker", "checkpoint_topic_recreated"): 1}
        results = [restarted.process(0, r.offset, r.value, r.headers) for r in records]
        assert [r.skipped for r in results] == [False] * 15
        assert sum(len(decode_findings(r.findings_message or b"")) for r in results) == 15

        same = _detection(topo)  # the topic as it is now: a restart resumes from its own checkpoint
        _, blob = restarted.checkpoint(0)
        assert same.load(0, blob, end, topic_id=ids.read(topic)) == 14 and not same.health.problems
    finally:
        ids.close()
        try:
            admin.delete_topics([topic], timeout_ms=20_000)
        finally:
            admin.close()


@pytest.mark.kafka
def test_an_incident_stage_restarted_on_a_re_created_findings_topic_grown_past_its_checkpoint_runs_every_frame(
        kafka_settings: KafkaSettings):
    """foreshock.findings deleted and re-created, 12 findings messages written (past the old
    checkpoint's offset 5): the incident stage restarted from the old checkpoint runs all 12
    frames (HEAD: frames 1..6 were skipped as covered)."""
    from foreshock.streams.kafka_worker import TopicIds

    topic = unique_topic("h107.findings")
    admin = _admin(kafka_settings)
    ids = TopicIds(kafka_settings)

    def message(agent: str, seq: int) -> tuple[bytes, Any]:
        return encode_findings([PieceReport(PieceInfo(agent, seq, 0, 1, 0.0), START + seq, 1,
                                            [Anomaly(START + seq, "gpu", 0, "gpu_temp", 9.0, "d")])], 0, 0), None

    def run(stage: IncidentStage, records: list[Any]) -> int:
        frames = 0
        for record in records:
            if stage.covered(record.offset):
                continue
            stage.offset = record.offset
            for report in decode_findings(record.value):
                frames += len(stage.observe(report))
        return frames

    try:
        _create(admin, topic)
        # senders that start now, after the stage: each is followed from its frame 1
        first = f"node1#{int(time.time() * 1000) + 60_000}"
        _produce(kafka_settings, topic, [message(first, seq) for seq in range(1, 7)])
        records, end = _read_all(kafka_settings, topic)
        stage = IncidentStage([FrameLog()])
        assert stage.load(None, end, topic_id=ids.read(topic)) == -1
        assert run(stage, records) == 6
        offset, blob = stage.checkpoint()
        assert offset == 5

        _delete(admin, topic)
        _create(admin, topic)
        second = f"node1#{int(time.time() * 1000) + 120_000}"
        _produce(kafka_settings, topic, [message(second, seq) for seq in range(1, 13)])
        records, end = _read_all(kafka_settings, topic)
        assert end == 12

        restarted = IncidentStage([FrameLog()])
        assert restarted.load(blob, end, topic_id=ids.read(topic)) == -1
        assert dict(restarted.health.problems) == {("worker", "checkpoint_topic_recreated"): 1}
        assert run(restarted, records) == 12
        log = restarted.processors[0]
        assert isinstance(log, FrameLog) and [now for now, _ in log.seen] == [START + seq for seq in range(1, 13)]
    finally:
        ids.close()
        try:
            admin.delete_topics([topic], timeout_ms=20_000)
        finally:
            admin.close()


@pytest.mark.kafka
def test_a_topic_id_that_cannot_be_read_is_none(kafka_settings: KafkaSettings):
    """No such topic, or no broker answering: None (the offset checks decide), soon."""
    from foreshock.streams.kafka_worker import TopicIds

    ids = TopicIds(kafka_settings)
    try:
        assert ids.read(unique_topic("h107.absent")) is None
    finally:
        ids.close()
    nobody = TopicIds(KafkaSettings("127.0.0.1:1"), timeout_s=2.0)
    t0 = time.monotonic()
    assert nobody.read("anything") is None
    assert time.monotonic() - t0 < 15.0
