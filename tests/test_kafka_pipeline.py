"""The distributed pipeline: agents -> real Kafka broker -> faust workers -> findings.

The unit tests at the top need no broker. The others run against the broker `make test`
starts (FORESHOCK_KAFKA), each in its own topic namespace and consumer group, with workers
started as real `foreshock worker` processes; the broker-restart test starts a private broker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka_support import kafka_settings, private_broker  # noqa: F401

from foreshock.detectors.bank import DetectorBank
from foreshock.findings import Anomaly, Finding, Incident, finding_to_json
from foreshock.frames import Frame
from foreshock.streams.embedded import EmbeddedPipeline
from foreshock.streams.kafka_agent import FramePublisher, run_agent
from foreshock.streams.kafka_codec import (H_REASON, FindingsMessage, PartitionMap, PieceInfo, RecordError,
                                           decode_findings, decode_piece, encode_findings, frame_to_json_lines,
                                           headers_dict, json_to_frames, piece_headers)
from foreshock.streams.kafka_config import KafkaSettings
from foreshock.streams.kafka_topics import Topics, ensure_topics
from foreshock.streams.kafka_worker import (DetectionStage, IncidentStage, apply_delta, dedupe_findings_messages,
                                            state_delta)
from foreshock.streams.sources import ReplaySource
from foreshock.topology import Topology

BATCH_ROWS = 4096  # replay frames small enough that a run has many of them


# ---- fixtures -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 GPUs (2 racks), 10 simulated minutes of a cooling loss: anomalies and throttle bits."""
    from foreshock.simulator import ClusterSimulator

    out = tmp_path_factory.mktemp("kafka") / "rec"
    ClusterSimulator(gpus=64, scenario="cooling-loss", seed=3, duration=600).record(out)
    return out


def embedded_findings(path: Path) -> list[Finding]:
    source = ReplaySource(str(path), batch_rows=BATCH_ROWS)
    pipeline = EmbeddedPipeline(source.topology, DetectorBank.from_names(source.topology))
    found: list[Finding] = []
    pipeline.run(source, on_frame=lambda frame, findings: found.extend(findings))
    return found


def canon(findings: list[Finding]) -> Counter[str]:
    return Counter(finding_to_json(f) for f in findings)


class Workers:
    """`foreshock worker` processes of one consumer group."""

    def __init__(self, bootstrap: str, topics: Topics, group: str, log_dir: Path) -> None:
        self.bootstrap, self.topics, self.group, self.log_dir = bootstrap, topics, group, log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, topology: Path) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"worker{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "foreshock.cli.main", "worker", "--kafka", self.bootstrap,
             "--namespace", self.topics.namespace, "--partitions", str(self.topics.partitions),
             "--group", self.group, "--topology", str(topology), "--port", "0",
             "--checkpoint-interval", "1", "--session-timeout", "3", "--log-level", "warning"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.log_dir.glob("worker*.log")))


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Any]:
    made: list[Workers] = []

    def make(bootstrap: str, topics: Topics, group: str) -> Workers:
        w = Workers(bootstrap, topics, group, tmp_path)
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop()


def namespace() -> str:
    return f"t{uuid.uuid4().hex[:8]}."


def read_topic(settings: KafkaSettings, topic: str, want: int | None, timeout_s: float) -> list[Any]:
    """Every record of a one-partition topic; with ``want``, until that many distinct findings
    pieces arrived (or the timeout)."""
    consumer = KafkaConsumer(**settings.kafka_python(), enable_auto_commit=False,
                             max_partition_fetch_bytes=8 << 20)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    records: list[Any] = []
    pieces: set[tuple[str, int, int]] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=500).get(tp, [])
            records.extend(batch)
            if want is not None:
                pieces.update(decode_findings(r.value).piece_id for r in batch)
                if len(pieces) >= want:
                    break
            elif not batch and records:
                break
    finally:
        consumer.close()
    return records


# ---- unit tests (no broker) ---------------------------------------------------------------
def test_routing_keeps_each_rack_in_one_partition_and_chunks_large_pieces(small_topology: Topology):
    pmap = PartitionMap(small_topology, 3)
    topo = small_topology
    gpu_part = pmap.by_kind["gpu"]
    for rack in range(len(topo.racks)):
        assert len(set(gpu_part[topo.gpu_rack == rack])) == 1
        assert pmap.by_kind["rack"][rack] == gpu_part[topo.gpu_rack == rack][0]
    for link, gpu in enumerate(topo.link_gpu):
        if gpu >= 0:
            assert pmap.by_kind["link"][link] == gpu_part[gpu]
            assert pmap.by_kind["optic"][2 * link] == pmap.by_kind["optic"][2 * link + 1] == gpu_part[gpu]
    n = 3000
    slots = np.arange(n) % len(topo.gpus)
    frame = Frame("gpu", (np.arange(n) // 32).astype(float), slots, {"gpu_temp": slots * 1.0})
    from foreshock.fields import field_names

    messages = pmap.messages(frame, max_bytes=100 * 8 * (len(field_names("gpu")) + 2))  # 100 rows a message
    assert all(len(piece) <= 100 for _, piece in messages)
    assert sum(len(piece) for _, piece in messages) == n
    for part, piece in messages:
        assert set(pmap.partition_of("gpu", piece.slot)) == {part}
    # rows of one partition keep their order across chunks
    used = {p for p, _ in messages}
    assert used == {0, 1}  # two racks: partitions 0 and 1; partition 2 gets no GPU rows
    for part in used:
        ts = np.concatenate([piece.ts for p, piece in messages if p == part])
        assert np.all(np.diff(ts) >= 0)
    empty = pmap.messages(Frame.empty("gpu"))  # an empty frame still sends one (empty) message
    assert len(empty) == 1 and empty[0][0] == 0 and len(empty[0][1]) == 0


def test_decode_rejects_garbage_wrong_schema_unknown_entity_and_misrouted(small_topology: Topology):
    pmap = PartitionMap(small_topology, 2)
    good = Frame("gpu", [1.0, 1.0], [0, 1], {"gpu_temp": [50.0, 51.0]})
    part = int(pmap.partition_of("gpu", good.slot)[0])
    headers = headers_dict(piece_headers("gpu", "a", 1, 0, 1, 0.0))
    frame, info = decode_piece(good.to_ipc(), headers, small_topology, pmap, part)
    assert info == PieceInfo("a", 1, 0, 1, 0.0) and np.array_equal(frame.columns["gpu_temp"], [50.0, 51.0])

    def reason(value: bytes, hdrs: dict[str, bytes] = headers, partition: int = part) -> str:
        with pytest.raises(RecordError) as err:
            decode_piece(value, hdrs, small_topology, pmap, partition)
        return err.value.reason

    assert reason(b"\x00garbage bytes") == "undecodable"
    assert reason(good.to_ipc(), {**headers, "foreshock-schema": b"avro"}) == "wrong_schema"
    assert reason(good.to_ipc(), {k: v for k, v in headers.items() if k != "foreshock-seq"}) == "bad_headers"
    assert reason(Frame("link", [1.0], [0], {}).to_ipc()) == "wrong_schema"  # header says gpu
    assert reason(Frame("gpu", [1.0], [10_000], {}).to_ipc()) == "unknown_entity"
    assert reason(good.to_ipc(), partition=1 - part) == "misrouted"


def test_json_lines_round_trip_and_bad_records(small_topology: Topology):
    frame = Frame("gpu", [10.0, 11.0], [3, 4], {"gpu_temp": [60.0, 61.5], "power": [np.nan, 400.0]})
    text = frame_to_json_lines(frame, small_topology)
    bad = b'\n{"kind":"gpu","entity":"nope/gpu0","ts":1,"gpu_temp":1}\n{not json\n{"kind":"gpu","ts":1}'
    frames, rejected = json_to_frames(text + bad, small_topology)
    assert len(frames) == 1 and np.array_equal(frames[0].slot, [3, 4])
    assert np.array_equal(frames[0].columns["power"], [np.nan, 400.0], equal_nan=True)
    reasons = sorted(r for _, r in rejected)
    assert len(reasons) == 3
    assert any("invalid JSON" in r for r in reasons) and any("unknown gpu entity" in r for r in reasons)


def test_state_delta_round_trips_and_is_small():
    rng = np.random.default_rng(0)
    initial = {"a": np.zeros((1000, 4)), "b": {"c": np.full(50, np.nan), "n": 3}, "d": np.zeros(0)}
    current = {"a": initial["a"].copy(), "b": {"c": initial["b"]["c"].copy(), "n": 7}, "d": np.zeros(0)}
    current["a"][rng.integers(0, 1000, 20)] = rng.normal(size=(20, 4))
    current["b"]["c"][:3] = [1.0, np.nan, 2.0]
    delta = state_delta(initial, current)
    back = apply_delta(initial, delta)
    assert np.array_equal(back["a"], current["a"])
    assert np.array_equal(back["b"]["c"], current["b"]["c"], equal_nan=True) and back["b"]["n"] == 7
    assert len(delta["__dict__"]["a"]["__delta__"][0]) <= 80


class CountingProcessor:
    """Emits one incident per frame that had findings, naming the (now, count) it saw."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def observe(self, findings: Any, now: float) -> list[Finding]:
        self.calls += 1
        return [Incident(now, f"i{self.calls}", "open", "rack", "rack0", f"{len(findings)} findings")]

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = state["calls"]


def test_incident_stage_reassembles_frames_in_order_and_drops_repeats():
    def msg(seq: int, part: int, parts: int, now: float | None, n: int) -> FindingsMessage:
        findings = [Anomaly(now or 0.0, "gpu", i, "gpu_temp", 1.0, "d") for i in range(n)]
        return decode_findings(encode_findings(findings, PieceInfo("a", seq, part, parts, 0.0), 0, 0, now, n))

    stage = IncidentStage([CountingProcessor()])
    assert stage.observe(msg(2, 0, 1, 20.0, 1)) == []  # seq 2 waits for seq 1
    assert stage.observe(msg(1, 1, 2, 11.0, 2)) == []  # seq 1 incomplete
    out = stage.observe(msg(1, 0, 2, 10.0, 3))  # completes 1, then releases 2
    assert [(i.ts, i.reason) for i in out] == [(11.0, "5 findings"), (20.0, "1 findings")]  # type: ignore[union-attr]
    assert stage.observe(msg(1, 0, 2, 10.0, 3)) == [] and stage.duplicates == 1
    # an empty frame (no rows anywhere) advances the sequence without running the processors
    assert stage.observe(msg(3, 0, 1, None, 0)) == [] and stage.released["a"] == 3
    _, blob = stage.checkpoint()
    restored = IncidentStage([CountingProcessor()])
    restored.load(blob)
    assert restored.observe(msg(4, 0, 1, 40.0, 0))[0].incident_id == "i3"  # type: ignore[union-attr]
    assert dedupe_findings_messages([msg(1, 0, 1, 1.0, 0), msg(1, 0, 1, 1.0, 0)]) == [msg(1, 0, 1, 1.0, 0)]


def test_detection_stage_resumes_from_checkpoint_with_identical_output(recording: Path):
    source = ReplaySource(str(recording), batch_rows=BATCH_ROWS)
    topo = source.topology
    pmap = PartitionMap(topo, 2)
    next_offset = Counter[int]()
    records = []
    for seq, frame in enumerate(source, 1):
        messages = pmap.messages(frame)
        for index, (part, piece) in enumerate(messages):
            records.append((part, next_offset[part], piece.to_ipc(),
                            piece_headers(piece.kind, "a", seq, index, len(messages), 0.0)))
            next_offset[part] += 1

    def run(stage: DetectionStage, recs: list[Any]) -> list[str]:
        out = []
        for part, offset, value, headers in recs:
            if not stage.owns(part):
                stage.load(part, None)
            result = stage.process(part, offset, value, headers)
            out.extend(finding_to_json(f) for f in result.findings)
        return out

    straight = run(DetectionStage(topo, lambda: DetectorBank.from_names(topo), 2), records)
    assert Counter(straight) == canon(embedded_findings(recording))
    half = len(records) // 2
    first = DetectionStage(topo, lambda: DetectorBank.from_names(topo), 2)
    got = run(first, records[:half])
    blobs = {p: first.checkpoint(p)[1] for p in list(first.parts)}
    second = DetectionStage(topo, lambda: DetectorBank.from_names(topo), 2)
    for p in range(2):
        second.load(p, blobs.get(p))
    replayed = [second.process(*r) for r in records]  # offsets at or below the checkpoint are skipped
    assert sum(r.skipped for r in replayed) == half
    got += [finding_to_json(f) for r in replayed for f in r.findings]
    assert Counter(got) == Counter(straight)


# ---- against the real broker --------------------------------------------------------------
def wait_for_members(settings: KafkaSettings, group: str, n: int, timeout_s: float = 60.0) -> None:
    """Until the consumer group has ``n`` members in a stable state (the workers are in)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(**settings.kafka_python())
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                info = admin.describe_groups([group])[group]
            except KafkaError:  # a new broker creates its offsets topic first
                info = {"group_state": "", "members": []}
            if info["group_state"] == "Stable" and len(info["members"]) == n:
                return
            time.sleep(0.5)
    finally:
        admin.close()
    raise AssertionError(f"group {group} did not reach {n} stable members in {timeout_s} s")


def run_and_collect(settings: KafkaSettings, topics: Topics, recording: Path, speed: float | None,
                    during: Any = None, timeout_s: float = 60.0) -> tuple[list[FindingsMessage], int]:
    source = ReplaySource(str(recording), speed=speed, batch_rows=BATCH_ROWS)
    result: dict[str, Any] = {}

    def agent() -> None:
        result["stats"] = run_agent(settings, source, source.topology, topics, agent_id="agent-t")

    thread = threading.Thread(target=agent)
    thread.start()
    if during is not None:
        during()
    thread.join(timeout=timeout_s)
    stats = result["stats"]
    assert stats.failed == 0
    records = read_topic(settings, topics.findings, want=stats.pieces, timeout_s=timeout_s)
    return [decode_findings(r.value) for r in records], stats.pieces


def findings_of(messages: list[FindingsMessage]) -> list[Finding]:
    return [f for m in dedupe_findings_messages(messages) for f in m.findings]


@pytest.mark.kafka
@pytest.mark.slow
def test_two_workers_find_what_the_embedded_pipeline_finds(kafka_settings, recording, workers):
    topics = ensure_topics(kafka_settings, Topics(namespace(), 2))
    group = workers(kafka_settings.bootstrap, topics, "g-" + topics.namespace)
    group.start(recording / "topology.yaml")
    group.start(recording / "topology.yaml")
    wait_for_members(kafka_settings, group.group, 2)
    messages, pieces = run_and_collect(kafka_settings, topics, recording, speed=None)
    unique = dedupe_findings_messages(messages)
    assert len(unique) == pieces, group.logs()
    assert canon(findings_of(messages)) == canon(embedded_findings(recording))
    assert len({m.worker for m in unique}) == 2  # the partitions were shared
    incidents = read_topic(kafka_settings, topics.incidents, None, timeout_s=3)
    embedded_incidents = [f for f in embedded_findings(recording) if f.type == "incident"]
    assert Counter(r.value.decode() for r in incidents) == canon(embedded_incidents)


@pytest.mark.kafka
@pytest.mark.slow
def test_sigkilled_worker_loses_nothing_and_repeats_are_bounded(kafka_settings, recording, workers):
    topics = ensure_topics(kafka_settings, Topics(namespace(), 2))
    group = workers(kafka_settings.bootstrap, topics, "g-" + topics.namespace)
    victim = group.start(recording / "topology.yaml")
    group.start(recording / "topology.yaml")
    wait_for_members(kafka_settings, group.group, 2)

    def kill_mid_stream() -> None:
        time.sleep(6)
        victim.send_signal(signal.SIGKILL)

    messages, pieces = run_and_collect(kafka_settings, topics, recording, speed=60.0, during=kill_mid_stream,
                                       timeout_s=90)
    assert victim.poll() == -signal.SIGKILL
    assert len(dedupe_findings_messages(messages)) == pieces, group.logs()
    assert canon(findings_of(messages)) == canon(embedded_findings(recording))
    repeats = len(messages) - pieces
    # at-least-once: repeats only for what the victim did after its last checkpoint (1 s at
    # 60x = one minute of telemetry), far less than the run
    assert repeats <= pieces // 3, f"{repeats} repeated pieces of {pieces}"


@pytest.mark.kafka
@pytest.mark.slow
def test_broker_restart_mid_stream_loses_nothing(private_broker, recording, workers):
    settings = KafkaSettings(private_broker.bootstrap)
    topics = ensure_topics(settings, Topics(namespace(), 2))
    group = workers(settings.bootstrap, topics, "g-" + topics.namespace)
    group.start(recording / "topology.yaml")
    wait_for_members(settings, group.group, 1)

    def restart() -> None:
        time.sleep(3)
        private_broker.stop()
        time.sleep(1)
        private_broker.start()

    messages, pieces = run_and_collect(settings, topics, recording, speed=100.0, during=restart, timeout_s=120)
    assert len(dedupe_findings_messages(messages)) == pieces, group.logs()
    assert canon(findings_of(messages)) == canon(embedded_findings(recording))


@pytest.mark.kafka
def test_bad_records_land_in_the_dead_letter_topic_with_the_reason(kafka_settings, recording, workers):
    topics = ensure_topics(kafka_settings, Topics(namespace(), 2))
    source = ReplaySource(str(recording), batch_rows=BATCH_ROWS)
    topo = source.topology
    publisher = FramePublisher(kafka_settings, topo, topics, agent_id="bad-t")
    producer = KafkaProducer(**kafka_settings.kafka_python())
    good = Frame("gpu", [1.0], [0], {"gpu_temp": [40.0]})
    part = int(PartitionMap(topo, 2).partition_of("gpu", good.slot)[0])
    hdr = piece_headers("gpu", "bad-t", 99, 0, 1, 0.0)
    producer.send(topics.frames, value=b"\x13garbage", partition=part, headers=hdr)
    producer.send(topics.frames, value=good.to_ipc(), partition=part,
                  headers=[(k, b"csv" if k == "foreshock-schema" else v) for k, v in hdr])
    producer.send(topics.frames, value=Frame("gpu", [1.0], [999_999], {}).to_ipc(), partition=part, headers=hdr)
    producer.send(topics.json, partition=0, value=b'{"kind":"gpu","entity":"ghost/gpu9","ts":1,"gpu_temp":50}\n'
                                                   b'{"kind":"gpu","entity":"%s","ts":2,"gpu_temp":50}\n[oops'
                  % topo.gpus[0].encode())
    producer.flush()
    producer.close()
    publisher.publish(good)  # a good piece after the bad ones still gets through
    publisher.close()
    group = workers(kafka_settings.bootstrap, topics, "g-" + topics.namespace)
    group.start(recording / "topology.yaml")
    dead = read_topic(kafka_settings, topics.deadletter, None, timeout_s=40)
    deadline = time.monotonic() + 30
    while len(dead) < 5 and time.monotonic() < deadline:
        time.sleep(1)
        dead = read_topic(kafka_settings, topics.deadletter, None, timeout_s=5)
    codes = Counter(headers_dict(r.headers).get("foreshock-reason-code", b"").decode() for r in dead)
    assert codes == {"undecodable": 1, "wrong_schema": 1, "unknown_entity": 1, "invalid_record": 2}, group.logs()
    reasons = " | ".join(headers_dict(r.headers)[H_REASON].decode() for r in dead)
    assert "not an Arrow IPC stream" in reasons and "ghost/gpu9" in reasons and "invalid JSON" in reasons
    sources = {headers_dict(r.headers)["foreshock-source"].decode().rsplit("/", 2)[0] for r in dead}
    assert sources == {topics.frames, topics.json}
    assert any(r.value == b"\x13garbage" for r in dead)  # the original bytes are kept
    # the good pieces (the agent's frame and the valid JSON record) were processed
    # each dead-lettered piece still reports (empty), so its frame's sequence stays complete;
    # the good pieces (the agent's frame, the valid JSON record) were processed
    found = [decode_findings(r.value) for r in read_topic(kafka_settings, topics.findings, want=5, timeout_s=30)]
    assert sorted((m.agent.split("@")[0], m.rows) for m in found) == [
        ("bad-t", 0), ("bad-t", 0), ("bad-t", 0), ("bad-t", 1), ("json", 1)]
