"""The distributed pipeline: agents -> real Kafka broker -> faust workers -> findings.

The unit tests at the top need no broker. The others run against the broker `make test`
starts (FORESHOCK_KAFKA), each in its own topic namespace and consumer group, with workers
started as real `foreshock worker` processes; the broker-restart test starts a private broker.
"""

from __future__ import annotations

import json
import logging
import re
import os
import signal
import subprocess
import sys
import threading
import time
import types
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka_support import kafka_settings, private_broker  # noqa: F401

from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.registry import DETECTORS
from foreshock.findings import Anomaly, Finding, Incident, finding_to_json
from foreshock.frames import Frame
from foreshock.streams.embedded import EmbeddedPipeline
from foreshock.streams.kafka_agent import FramePublisher, run_agent
from foreshock.streams.kafka_codec import (H_AGENT, H_REASON, BundleBuilder, FindingsMessage, PartitionMap,
                                           PieceInfo, PieceReport, RecordError, decode_bundle, decode_findings,
                                           encode_bundle, encode_findings, frame_to_json_lines, headers_dict,
                                           is_telemetry, json_to_frames, piece_headers, sender_id)
from foreshock.streams.kafka_config import KafkaSettings
from foreshock.streams.kafka_topics import Topics, ensure_topics
from foreshock.streams.kafka_worker import (RETIRE_SENDER_S, DetectionStage, IncidentStage, apply_delta,
                                            bank_signature, decode_checkpoint, dedupe_findings_messages,
                                            encode_checkpoint, state_delta, uniform_fills)
from foreshock.streams.sources import ReplaySource
from foreshock.topology import Topology

BATCH_ROWS = 4096  # replay frames small enough that a run has many of them


# ---- fixtures -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 GPUs (2 racks), 10 simulated minutes of the mixed scenario: anomalies, predictions and
    incidents (the incident engine's input spans partitions)."""
    from foreshock.simulator import ClusterSimulator

    out = tmp_path_factory.mktemp("kafka") / "rec"
    ClusterSimulator(gpus=64, scenario="mixed", seed=3, duration=600).record(out)
    return out


def embedded_findings(path: Path) -> list[Finding]:
    source = ReplaySource(str(path), batch_rows=BATCH_ROWS)
    pipeline = EmbeddedPipeline(source.topology, DetectorBank.from_names(source.topology))
    found: list[Finding] = []
    pipeline.run(source, on_frame=lambda frame, findings: found.extend(findings))
    return found


def detector_findings(path: Path) -> list[Finding]:
    """The embedded pipeline's findings without its incidents: what the workers' detection stage
    publishes on the findings topic (incidents go to their own topic)."""
    return [f for f in embedded_findings(path) if f.type != "incident"]


def canon(findings: list[Finding]) -> Counter[str]:
    return Counter(finding_to_json(f) for f in findings)


class Workers:
    """`foreshock worker` processes of one consumer group."""

    def __init__(self, bootstrap: str, topics: Topics, group: str, log_dir: Path) -> None:
        self.bootstrap, self.topics, self.group, self.log_dir = bootstrap, topics, group, log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, topology: Path, role: str = "all") -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"worker{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "foreshock.cli.main", "worker", "--kafka", self.bootstrap,
             "--namespace", self.topics.namespace, "--partitions", str(self.topics.partitions),
             "--group", self.group, "--topology", str(topology), "--port", "0", "--role", role,
             "--checkpoint-interval", "1", "--session-timeout", "3", "--log-level", "warning"],
            stdout=log, stderr=subprocess.STDOUT,
            # a SIGKILLed worker cannot remove its temporary data folder: keep those in the test's
            env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(self.log_dir)})
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
                pieces.update(m.piece_id for r in batch if not is_telemetry(r.headers)
                              for m in decode_findings(r.value, with_findings=False))
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


def test_split_pieces_are_the_frames_rows_by_partition_without_revalidation(small_topology: Topology):
    """``row_range`` builds pieces without Frame's checks: they must equal what ``take`` gives,
    and Frame must not have grown a field that ``row_range`` does not copy."""
    import dataclasses

    from foreshock.streams.kafka_codec import row_range

    assert {f.name for f in dataclasses.fields(Frame)} == {"kind", "ts", "slot", "columns"}
    rng = np.random.default_rng(5)
    n = 500
    slots = rng.integers(0, len(small_topology.gpus), n)
    frame = Frame("gpu", np.sort(rng.random(n)), slots, {"gpu_temp": rng.normal(60, 5, n), "power": rng.random(n)})
    pmap = PartitionMap(small_topology, 3)
    pieces = pmap.split(frame)
    part = pmap.partition_of("gpu", frame.slot)
    for p, piece in enumerate(pieces):
        want = frame.take(np.flatnonzero(part == p))  # stable: each partition's rows in frame order
        assert piece.kind == want.kind
        np.testing.assert_array_equal(piece.ts, want.ts)
        np.testing.assert_array_equal(piece.slot, want.slot)
        assert piece.columns.keys() == want.columns.keys()
        for name in want.columns:
            np.testing.assert_array_equal(piece.columns[name], want.columns[name])
    sub = row_range(frame, 10, 20)
    assert len(sub) == 10 and np.shares_memory(sub.ts, frame.ts)
    np.testing.assert_array_equal(sub.columns["power"], frame.columns["power"][10:20])


def test_frame_from_arrow_against_the_arrow_values_one_by_one():
    """``Frame.from_arrow`` (one block for every field, chunk by chunk) against the Arrow values
    read one at a time: absent fields, integer and float32 columns, nulls, several batches, and
    its errors."""
    import pyarrow as pa

    from foreshock.fields import field_names
    from foreshock.frames import FrameError

    rng = np.random.default_rng(11)
    n = 40
    temp = rng.normal(60, 5, n)
    temp[[3, 17]] = np.nan
    arrays = {"ts": pa.array(np.sort(rng.random(n))), "slot": pa.array(rng.integers(0, 8, n), pa.int64()),
              "gpu_temp": pa.array(temp), "util": pa.array([None if i % 5 == 0 else i for i in range(n)], pa.int32()),
              "power": pa.array(rng.random(n), pa.float32())}
    batch = pa.RecordBatch.from_pydict(arrays)
    table = pa.Table.from_batches([batch.slice(0, 15), batch.slice(15, 0), batch.slice(15)])

    def expected(name: str) -> list[float]:
        if name not in arrays:
            return [float("nan")] * n
        return [float("nan") if v is None else float(v) for v in arrays[name].to_pylist()]

    for data in (batch, table):
        got = Frame.from_arrow(data, kind="gpu")
        assert got.kind == "gpu" and list(got.columns) == list(field_names("gpu"))
        assert got.ts.dtype == np.float64 and got.slot.dtype == np.int32
        np.testing.assert_array_equal(got.ts, expected("ts"))
        np.testing.assert_array_equal(got.slot, arrays["slot"].to_pylist())
        for name, column in got.columns.items():
            assert column.dtype == np.float64 and column.flags.writeable and column.flags.c_contiguous
            np.testing.assert_array_equal(column, expected(name), err_msg=name)
    bad = {"no ts": (pa.RecordBatch.from_pydict({"slot": [1]}), "missing column 'ts'"),
           "unknown field": (pa.RecordBatch.from_pydict({"ts": [1.0], "slot": [1], "colour": [2.0]}),
                             "unknown fields ['colour']"),
           "not numeric": (pa.RecordBatch.from_pydict({"ts": [1.0], "slot": [1], "gpu_temp": ["hot"]}),
                           "column 'gpu_temp' is string, not numeric")}
    for what, (data, message) in bad.items():
        with pytest.raises(FrameError, match=re.escape(message)):
            Frame.from_arrow(data, kind="gpu")
    # a null slot is a row of no known entity (-1, the guard's unknown_entity), not a bad batch
    nulls = Frame.from_arrow(pa.RecordBatch.from_pydict({"ts": [1.0, 2.0], "slot": pa.array([1, None], pa.int32())}),
                             kind="gpu")
    assert nulls.slot.tolist() == [1, -1]


def test_a_bundle_of_several_pieces_per_kind_decodes_to_their_rows():
    """``encode_bundle`` writes a kind's pieces as one record batch each: the decoder joins them
    back, each piece gets exactly its own rows, and a field NaN in every piece stays out of the
    stream but comes back NaN."""
    from foreshock.fields import field_names
    from foreshock.streams.kafka_codec import PartitionMap, decode_bundle, encode_bundle, headers_dict

    topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": f"n{i}", "rack": "k", "gpus": 2} for i in range(2)]})
    rng = np.random.default_rng(5)
    pieces = []
    for seq, rows in enumerate((3, 0, 4), start=1):
        cols = {name: rng.random(rows) for name in field_names("gpu")}
        cols["xid_last"] = np.full(rows, np.nan)
        pieces.append((seq, 0, 1, Frame("gpu", np.full(rows, float(seq)), rng.integers(0, 4, rows), cols)))
    node = Frame("node", [1.0], [1], {})
    entries = pieces[:2] + [(9, 0, 1, node)] + pieces[2:]
    for compression in (None, "lz4"):
        value, headers = encode_bundle("a", 1.0, entries, compression)
        decoded = decode_bundle(value, headers_dict(headers), topo, PartitionMap(topo, 1), 0)
        assert [(p.info.seq, p.kind) for p in decoded] == [(1, "gpu"), (2, "gpu"), (9, "node"), (3, "gpu")]
        for got, (_, _, _, sent) in zip(decoded, entries):
            assert got.error is None and len(got.frame) == len(sent)
            np.testing.assert_array_equal(got.frame.ts, sent.ts)
            np.testing.assert_array_equal(got.frame.slot, sent.slot)
            for name in field_names(sent.kind):
                np.testing.assert_array_equal(got.frame.columns[name], sent.columns[name], err_msg=name)


def test_worker_data_dir_is_a_temporary_folder_not_the_current_directory(tmp_path: Path, monkeypatch):
    """faust's default data directory is ``<app id>-data`` in the current directory: every worker
    run left one there. The worker makes its own temporary folder (removed when it stops) or
    uses the one configured."""
    from foreshock.streams.faust_app import ForeshockWorker, WorkerConfig

    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    topology = Topology.from_gpu_hosts([("n0", g) for g in range(2)])

    def config(**kw: Any) -> WorkerConfig:
        return WorkerConfig(KafkaSettings("127.0.0.1:9"), Topics("dd.", 1), topology,
                            lambda hardware: DetectorBank.from_names(hardware), app_id="dd-app", **kw)

    worker = ForeshockWorker(config())
    assert worker.app.conf.datadir.parent == tmp and worker.data_dir.is_dir()
    worker.remove_data_dir()
    assert not any(tmp.iterdir()) and not any(cwd.iterdir())
    mine = tmp_path / "mine"
    worker = ForeshockWorker(config(data_dir=str(mine)))
    assert worker.app.conf.datadir == mine
    worker.remove_data_dir()  # not the worker's to remove
    assert worker.app.conf.datadir == mine and not any(cwd.iterdir())


def test_worker_command_passes_data_dir_and_top_k_to_the_worker(tmp_path: Path, monkeypatch):
    """``foreshock worker --data-dir DIR`` and ``--top-k K`` reach the worker's config (the broker calls are
    stood in for: this checks the command's wiring, the worker itself is tested above)."""
    from click.testing import CliRunner

    import foreshock.streams.faust_app as faust_app
    import foreshock.streams.kafka_topics as kafka_topics
    from foreshock.cli.main import cli

    seen: list[Any] = []
    monkeypatch.setattr(kafka_topics, "ensure_topics", lambda settings, topics: topics)
    monkeypatch.setattr(faust_app, "run_worker", lambda config, loglevel: seen.append(config))
    topology = tmp_path / "topology.yaml"
    Topology.from_gpu_hosts([("n0", 0)]).dump(topology)
    args = ["worker", "--kafka", "127.0.0.1:9", "--topology", str(topology), "--port", "0"]
    for extra, expected in (([], None), (["--data-dir", str(tmp_path / "dd")], str(tmp_path / "dd"))):
        res = CliRunner().invoke(cli, args + extra)
        assert res.exit_code == 0, res.output
        assert seen[-1].data_dir == expected
    assert seen[-1].metrics_top_k == 16
    assert CliRunner().invoke(cli, args + ["--top-k", "3"]).exit_code == 0 and seen[-1].metrics_top_k == 3
    assert seen[-1].max_clock_ahead_s == 900.0
    assert CliRunner().invoke(cli, args + ["--max-clock-ahead", "inf"]).exit_code == 0
    assert seen[-1].max_clock_ahead_s == float("inf")
    # and the worker's detection stage hands it to every partition's input guard
    worker = faust_app.ForeshockWorker(seen[-2])
    worker.detection.load(0, None)
    assert worker.detection.parts[0].pipeline.guard.max_ahead_s == 900.0
    worker.remove_data_dir()


def test_worker_command_takes_detector_params_for_its_bank_and_its_store(tmp_path: Path, monkeypatch):
    """``foreshock worker --param DET.NAME=VALUE``, as watch, replay and demo take it: a worker had
    no such option, so parameters tuned with ``evaluate`` could not be run in Kafka mode. The value
    reaches the banks the worker makes (for its partitions and for other hardware) and, for a held
    flag's ``refresh_s``, its store (kept 1.5 refreshes); a parameter no detector of the bank has is
    a usage error before the worker starts."""
    from click.testing import CliRunner

    import foreshock.streams.faust_app as faust_app
    import foreshock.streams.kafka_topics as kafka_topics
    from foreshock.cli.main import cli

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    seen: list[Any] = []
    monkeypatch.setattr(kafka_topics, "ensure_topics", lambda settings, topics: topics)
    monkeypatch.setattr(faust_app, "run_worker", lambda config, loglevel: seen.append(config))
    topology = tmp_path / "topology.yaml"
    Topology.from_gpu_hosts([("n0", 0), ("n0", 1)]).dump(topology)
    args = ["worker", "--kafka", "127.0.0.1:9", "--topology", str(topology), "--port", "0"]
    res = CliRunner().invoke(cli, args + ["--param", "cooling.refresh_s=1200", "--param", "thermal.horizon_s=900"])
    assert res.exit_code == 0, res.output
    bank = seen[-1].make_bank(Topology.from_gpu_hosts([("n1", 0)]))
    by_name = {d.name: d for d in bank.detectors}
    assert by_name["cooling"].p["refresh_s"] == 1200.0 and by_name["thermal"].horizon_s == 900.0
    worker = faust_app.ForeshockWorker(seen[-1])
    try:
        assert worker.store._anomaly_ttl("cooling") == 1800.0
        assert worker.store._anomaly_ttl("straggler") == 1.5 * by_name["straggler"].p["refresh_s"]
    finally:
        worker.remove_data_dir()
    for bad, says in ((["--param", "cooling.no_such=1"], "no_such"), (["--param", "nosuch.x=1"], "nosuch"),
                      (["--param", "loop_warming.util_on=0.4"], "not in the bank"),
                      (["--param", "cooling"], "DETECTOR.NAME")):
        res = CliRunner().invoke(cli, args + bad)
        assert res.exit_code == 2 and says in res.output, (bad, res.output)
    assert len(seen) == 1  # no worker started for any of them


def test_worker_roles_run_their_own_agents_in_their_own_group(tmp_path: Path, monkeypatch):
    """A detect worker runs detection (and the JSON router) only, an incidents worker the
    incident stage only, each in a group of its own; ``all`` keeps the group it was given."""
    from foreshock.streams.faust_app import ForeshockWorker, WorkerConfig

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    topology = Topology.from_gpu_hosts([("n0", g) for g in range(2)])

    def config(role: str) -> WorkerConfig:
        return WorkerConfig(KafkaSettings("127.0.0.1:9"), Topics("rr.", 1), topology,
                            lambda hardware: DetectorBank.from_names(hardware), app_id="rr-app", role=role)

    expected = {"all": ("rr-app", {"detect", "route_json", "incidents"}),
                "detect": ("rr-app.detect", {"detect", "route_json"}),
                "incidents": ("rr-app.incidents", {"incidents"})}
    for role, (group, agents) in expected.items():
        worker = ForeshockWorker(config(role))
        try:
            assert worker.app.conf.id == group
            assert {a.split(".")[-1] for a in worker.app.agents} == agents, role
        finally:
            worker.remove_data_dir()
    with pytest.raises(ValueError, match="role 'both'"):
        config("both")


class _Delivery:
    """A stand-in for faust's producer and topics: ``send`` returns a future the 'broker' settles
    a moment later (refused where ``refuse(value)``), and ``flush`` waits for them without raising
    — aiokafka's semantics (``asyncio.wait``)."""

    def __init__(self, refuse: Callable[[bytes], bool] = lambda value: False) -> None:
        self.refuse = refuse
        self.futures: list[Any] = []
        self.sent: list[tuple[str, bytes]] = []

    def topic(self, name: str) -> Any:
        delivery = self

        class Topic:
            async def send(self, key: Any = None, value: bytes = b"", partition: Any = None, headers: Any = None,
                           force: bool = False) -> Any:
                import asyncio

                from aiokafka.errors import KafkaTimeoutError
                future = asyncio.get_running_loop().create_future()
                delivery.futures.append(future)
                delivery.sent.append((name, value))
                refused = delivery.refuse(value) and name != "checkpoints"
                asyncio.get_running_loop().call_later(
                    0.01, lambda: future.set_exception(KafkaTimeoutError("batch expired")) if refused
                    else future.set_result(None))
                return future

        return Topic()

    async def flush(self) -> None:
        import asyncio
        if self.futures:
            await asyncio.wait(self.futures)


def test_a_checkpoint_is_never_written_past_findings_that_were_not_delivered(tmp_path: Path, monkeypatch,
                                                                              small_topology: Topology):
    """aiokafka's flush waits for the outstanding sends but does not raise when one failed (the
    batch expired while the partition had no leader, or the broker refused it). The worker wrote
    the checkpoint, and acked the records, regardless: the findings were lost for good, nothing
    counted. Now the sends are confirmed first; a failure is counted and raised, and a record whose
    handling raises ends the worker (exit status 70) rather than faust restarting the agent and
    committing past it."""
    import asyncio

    from foreshock.streams.faust_app import EXIT_RECORD_FAILED, ForeshockWorker, WorkerConfig

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))

    class Event:
        def __init__(self, offset: int, value: bytes, headers: Any) -> None:
            self.message = types.SimpleNamespace(topic="t.frames", partition=0, offset=offset, value=value,
                                                 headers=headers, key=b"")

    class Stream:
        def __init__(self) -> None:
            self.acked: list[int] = []

        async def ack(self, event: Any) -> None:
            self.acked.append(event.message.offset)

    def run(refuse: Callable[[bytes], bool]) -> tuple[Any, Stream, list[int], list[bytes]]:
        worker = ForeshockWorker(WorkerConfig(KafkaSettings("127.0.0.1:9"), Topics("t.", 1), small_topology,
                                              lambda hardware: DetectorBank.from_names(hardware, ["robust_zscore"]),
                                              app_id="t-app", checkpoint_interval_s=0.0))
        delivery, written, exits, stream = _Delivery(refuse), [], [], Stream()
        worker.app.producer = delivery  # type: ignore[assignment]
        worker.findings_topic, worker.checkpoint_topic = delivery.topic("findings"), delivery.topic("checkpoints")

        async def no_checkpoint(partition: int) -> None:
            return None

        async def write(partition: int, key: str, blob: bytes, original: Any = worker._write_checkpoint) -> bool:
            done = bool(await original(partition, key, blob))  # False: refused as too large (counted)
            written.append(blob)
            return done

        worker.read_checkpoint, worker._write_checkpoint = no_checkpoint, write  # type: ignore[method-assign]
        worker._exit = exits.append
        worker.on_assigned([types.SimpleNamespace(topic=worker.config.topics.frames, partition=0)])
        frame = Frame("gpu", [1.0] * 8, np.arange(8), {"gpu_temp": np.full(8, 50.0)})
        value, headers = encode_bundle("a#1", 0.0, [(1, 0, 1, frame)], topology=small_topology)
        asyncio.run(worker.handle(worker.on_piece, stream, Event(0, value, headers)))
        worker.remove_data_dir()
        return worker, stream, exits, written

    worker, stream, exits, written = run(lambda value: False)
    assert stream.acked == [0] and len(written) == 1 and exits == [] and not worker.health.problems
    worker, stream, exits, written = run(lambda value: True)  # every findings message refused
    assert stream.acked == [] and written == [] and exits == [EXIT_RECORD_FAILED]
    refused = [value for topic, value in worker.app.producer.sent if topic != "checkpoints"]  # type: ignore[attr-defined]
    assert len(refused) >= 2  # each refused send is counted, not only the first awaited
    assert worker.health.problems[("worker", "send_failed")] == len(refused)
    assert worker.health.problems[("worker", "record_failed")] == 1


def test_a_worker_that_loses_the_incident_stage_stops_exporting_its_incidents(tmp_path: Path, monkeypatch,
                                                                             small_topology: Topology):
    """The stage's next owner publishes the incidents, and resolves them: this worker would never
    hear of it, and its open incidents (and ForeshockCascadeIncident) stayed on its /metrics."""
    import asyncio
    from collections import namedtuple

    from foreshock.exporters.prometheus import build_registry
    from foreshock.streams.faust_app import ForeshockWorker, WorkerConfig

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    worker = ForeshockWorker(WorkerConfig(KafkaSettings("127.0.0.1:9"), Topics("t.", 1), small_topology,
                                          lambda hardware: DetectorBank.from_names(hardware), app_id="t-app"))
    worker.incidents_loaded = True
    worker.store.observe_findings([Incident(100.0, "inc-7", "growing", "cooling_loop", "cdu1", "inlet rising",
                                            members=("rack1", "node2"))])
    registry = build_registry(worker.store)
    open_loop = {"cluster": "test", "root_kind": "cooling_loop"}
    assert registry.get_sample_value("foreshock_incidents_open", open_loop) == 1
    asyncio.run(worker.on_revoked([namedtuple("TP", "topic partition")(worker.config.topics.findings, 0)]))
    assert not worker.incidents_loaded
    assert not registry.get_sample_value("foreshock_incidents_open", open_loop)
    worker.remove_data_dir()


def test_decode_rejects_garbage_wrong_schema_unknown_entity_and_misrouted(small_topology: Topology):
    pmap = PartitionMap(small_topology, 2)
    good = Frame("gpu", [1.0, 1.0], [0, 1], {"gpu_temp": [50.0, 51.0]})
    part = int(pmap.partition_of("gpu", good.slot)[0])
    headers = headers_dict(piece_headers("gpu", "a", 1, 0, 1, 0.0))  # a single-piece record (first version)
    (piece,) = decode_bundle(good.to_ipc(), headers, small_topology, pmap, part)
    assert piece.error is None and piece.info == PieceInfo("a", 1, 0, 1, 0.0)
    assert piece.frame is not None and np.array_equal(piece.frame.columns["gpu_temp"], [50.0, 51.0])

    def reason(value: bytes, hdrs: dict[str, bytes] = headers, partition: int = part) -> str:
        (bad,) = decode_bundle(value, hdrs, small_topology, pmap, partition)
        assert bad.error is not None
        return bad.error.reason

    assert reason(b"\x00garbage bytes") == "undecodable"
    assert reason(good.to_ipc(), {**headers, "foreshock-schema": b"avro"}) == "wrong_schema"
    with pytest.raises(RecordError) as err:  # no piece identity at all: the record has no report
        decode_bundle(good.to_ipc(), {k: v for k, v in headers.items() if k != "foreshock-seq"},
                      small_topology, pmap, part)
    assert err.value.reason == "bad_headers"
    assert reason(Frame("link", [1.0], [0], {}).to_ipc()) == "wrong_schema"  # header says gpu
    assert reason(Frame("gpu", [1.0], [10_000], {}).to_ipc()) == "unknown_entity"
    assert reason(good.to_ipc(), partition=1 - part) == "misrouted"


def test_fields_a_newer_agent_sends_are_left_out_and_counted_not_dead_lettered(small_topology: Topology,
                                                                              monkeypatch):
    """An agent upgraded before its workers sends fields added since (``max_op_temp`` on
    2026-12-01): the worker refused the whole stream as ``wrong_schema`` and dead-lettered every
    frame of that agent until the workers were upgraded too. Now it reads the fields it knows,
    and counts the others (``worker/unknown_fields``)."""
    from foreshock import frames
    from foreshock.streams import kafka_codec

    pmap = PartitionMap(small_topology, 1)
    gpus = np.arange(small_topology.size("gpu"))
    known = kafka_codec.field_names
    with monkeypatch.context() as newer:  # the newer agent's field list
        def newer_fields(kind: str) -> tuple[str, ...]:
            return known(kind) + (("future_temp",) if kind == "gpu" else ())
        newer.setattr(kafka_codec, "field_names", newer_fields)
        newer.setattr(frames, "field_names", newer_fields)
        sent = Frame("gpu", np.full(len(gpus), 5.0), gpus,
                     {"gpu_temp": np.full(len(gpus), 50.0), "future_temp": np.full(len(gpus), 87.0)})
        value, headers = encode_bundle("agent-new", 5.0, [(1, 0, 1, sent)])
    (piece,) = decode_bundle(value, headers_dict(headers), small_topology, pmap, 0)
    assert piece.error is None and piece.frame is not None and piece.ignored_fields == ("future_temp",)
    assert "future_temp" not in piece.frame.columns and np.all(piece.frame.columns["gpu_temp"] == 50.0)
    stage = DetectionStage(small_topology, lambda hardware: DetectorBank.from_names(hardware, ["thermal"]), 1)
    stage.load(0, None)
    result = stage.process(0, 0, value, headers)
    assert not result.dead_letters and result.rows == len(gpus)
    assert stage.health.problems[("worker", "unknown_fields")] == 1


def test_bundles_round_trip_pieces_in_order_and_isolate_a_bad_piece(small_topology: Topology):
    """A bundle (one message, several pieces of several kinds) decodes to the same pieces in the
    same order; NaN-only fields travel as absent columns and come back as NaN; compression is
    transparent; a bad piece is reported alone; a damaged value fails every piece."""
    pmap = PartitionMap(small_topology, 2)
    rng = np.random.default_rng(7)
    gpus = np.flatnonzero(pmap.by_kind["gpu"] == 1)
    links = np.flatnonzero(pmap.by_kind["link"] == 1)
    pieces = []
    for seq in range(1, 4):
        pieces.append((seq, 0, 2, Frame("gpu", np.full(len(gpus), float(seq)), gpus,
                                        {"gpu_temp": rng.normal(50, 3, len(gpus)), "power": [np.nan] * len(gpus)})))
        pieces.append((seq, 1, 2, Frame("link", np.full(len(links), float(seq)), links,
                                        {"xmit_wait": rng.integers(0, 1000, len(links)).astype(float)})))
    for compression in (None, "lz4", "zstd"):
        value, headers = encode_bundle("agent-x", 12.5, pieces, compression)
        decoded = decode_bundle(value, headers_dict(headers), small_topology, pmap, 1)
        assert [(d.info.seq, d.info.part, d.info.parts, d.kind) for d in decoded] == \
            [(seq, part, parts, f.kind) for seq, part, parts, f in pieces]
        for d, (_, _, _, sent_frame) in zip(decoded, pieces):
            assert d.error is None and d.frame is not None and d.info.agent == "agent-x" and d.info.sent == 12.5
            assert np.array_equal(d.frame.slot, sent_frame.slot) and np.array_equal(d.frame.ts, sent_frame.ts)
            for name, column in sent_frame.columns.items():
                assert np.array_equal(d.frame.columns[name], column, equal_nan=True), name
    plain, _ = encode_bundle("agent-x", 0.0, pieces[:1])
    assert b"power" not in plain and b"gpu_temp" in plain  # the all-NaN field is not sent

    ghost = Frame("gpu", [4.0], [10_000], {"gpu_temp": [1.0]})
    value, headers = encode_bundle("agent-x", 0.0, [pieces[0], (4, 0, 1, ghost), pieces[1]])
    decoded = decode_bundle(value, headers_dict(headers), small_topology, pmap, 1)
    assert [d.error.reason if d.error else None for d in decoded] == [None, "unknown_entity", None]
    assert decoded[1].frame is not None and decoded[1].frame.slot.tolist() == [10_000]  # kept for the dead letter
    broken = decode_bundle(value[:-7], headers_dict(headers), small_topology, pmap, 1)
    assert [d.error.reason if d.error else None for d in broken] == ["undecodable"] * 3


def test_frames_numbered_by_another_topology_are_refused_whole(small_topology: Topology):
    """An agent that derived its own topology (a per-host source) numbers entities from 0: read
    against the cluster's, its node0/gpu3 would land on whatever the cluster's slot 3 is. The
    fingerprint header makes the worker refuse such a record instead; records without the
    header (older agents, hand-made ones) are read as before."""
    pmap = PartitionMap(small_topology, 2)
    good = Frame("gpu", [1.0], [0], {"gpu_temp": [40.0]})
    part = int(pmap.partition_of("gpu", good.slot)[0])
    own = Topology.from_gpu_hosts([("node0", g) for g in range(8)])
    value, headers = encode_bundle("a", 0.0, [(1, 0, 1, good), (2, 0, 1, good)], topology=own)
    refused = decode_bundle(value, headers_dict(headers), small_topology, pmap, part)
    assert [(d.error.reason if d.error else None, d.frame) for d in refused] == [("topology_mismatch", None)] * 2
    assert "same --topology file" in str(refused[0].error)
    for topology in (small_topology, None):
        value, headers = encode_bundle("a", 0.0, [(1, 0, 1, good)], topology=topology)
        (taken,) = decode_bundle(value, headers_dict(headers), small_topology, pmap, part)
        assert taken.error is None and taken.frame is not None


def test_a_topologys_fingerprint_survives_the_topic_and_the_file_and_tells_slots_apart(small_topology: Topology,
                                                                                       tmp_path: Path):
    from foreshock.streams.kafka_agent import topology_from_bytes, topology_to_bytes

    print_ = small_topology.fingerprint()
    assert topology_from_bytes(topology_to_bytes(small_topology)).fingerprint() == print_
    small_topology.dump(tmp_path / "t.yaml")
    assert Topology.load(tmp_path / "t.yaml").fingerprint() == print_
    data = small_topology.to_dict()
    data["nodes"] = data["nodes"][1:] + data["nodes"][:1]  # same entities, other slots
    assert Topology.from_dict(data).fingerprint() != print_
    data = small_topology.to_dict()
    data["jobs"] = data["jobs"][::-1]  # the scheduler's work moved on, the hardware did not
    moved = Topology.from_dict(data)
    assert moved.fingerprint() == print_ and moved.fingerprint(jobs=True) != small_topology.fingerprint(jobs=True)


def test_an_agent_need_not_restart_when_only_the_jobs_changed(small_topology: Topology):
    """Job frames depend on the job list's numbering, every other kind does not: a worker whose
    topology lists other jobs still reads an agent's GPU rows, and refuses a record holding job rows."""
    pmap = PartitionMap(small_topology, 1)
    data = small_topology.to_dict()
    assert len(data["jobs"]) >= 2
    data["jobs"] = data["jobs"][::-1]
    agents = Topology.from_dict(data)
    gpu = Frame("gpu", [1.0], [0], {"gpu_temp": [40.0]})
    job = Frame("job", [1.0], [0], {"step_time": [2.5]})
    value, headers = encode_bundle("a", 0.0, [(1, 0, 1, gpu)], topology=agents)
    (taken,) = decode_bundle(value, headers_dict(headers), small_topology, pmap, 0)
    assert taken.error is None
    value, headers = encode_bundle("a", 0.0, [(1, 0, 1, gpu), (2, 0, 1, job)], topology=agents)
    refused = decode_bundle(value, headers_dict(headers), small_topology, pmap, 0)
    assert [d.error.reason if d.error else None for d in refused] == ["topology_mismatch"] * 2
    assert "jobs" in str(refused[0].error)


def test_bundle_builder_fills_messages_up_to_the_limit(small_topology: Topology):
    from foreshock.streams.kafka_codec import row_bytes

    frame = Frame("gpu", np.zeros(10), np.arange(10), {})
    limit = 25 * row_bytes("gpu")  # two frames of 10 rows fit, a third does not
    builder = BundleBuilder(limit)
    done = [b for seq in range(1, 6) for b in builder.add((seq, 0, 1, frame), now=float(seq))]
    assert [[e[0] for e in b] for b in done] == [[1, 2], [3, 4]]
    assert [e[0] for e in builder.entries] == [5] and builder.since == 5.0
    assert [e[0] for e in builder.take()] == [5] and builder.entries == []
    big = Frame("gpu", np.zeros(30), np.arange(30) % 32, {})  # larger than the limit: alone, at once
    assert [[e[0] for e in b] for b in builder.add((9, 0, 1, big))] == [[9]]


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
    # applied to the initial state of another shape (a worker restarted with another job count):
    # an array that was uniform when saved is rebuilt at the saved shape, whatever the new initial
    # holds (or if it is empty); any other cannot be
    fills = uniform_fills(initial)
    assert fills["a"] == 0.0 and np.isnan(fills["b"]["c"]) and fills["b"]["n"] is None
    delta = state_delta(initial, current, fills)
    assert apply_delta(initial, delta)["a"].tolist() == current["a"].tolist()
    other = {"a": np.arange(4800.0).reshape(1200, 4), "b": {"c": np.zeros(0), "n": 3}, "d": np.zeros(0)}
    rebuilt = apply_delta(other, delta)
    assert np.array_equal(rebuilt["a"], current["a"]) and rebuilt["a"].shape == (1000, 4)
    assert np.array_equal(rebuilt["b"]["c"], current["b"]["c"], equal_nan=True)
    mixed = {**initial, "a": np.arange(4000.0).reshape(1000, 4)}
    with pytest.raises(ValueError, match="cannot be rebuilt"):
        apply_delta(other, state_delta(mixed, {**current, "a": mixed["a"] + (np.arange(4000) == 5).reshape(1000, 4)},
                                       uniform_fills(mixed)))


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
        (report,) = decode_findings(encode_findings([PieceReport(PieceInfo("a", seq, part, parts, 0.0), now, n,
                                                                 findings)], 0, 0))
        return report

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


def test_a_restarted_sender_is_a_new_sequence_not_a_repeat():
    """The incident stage takes a sequence number at or below the last one released for a repeat:
    a sender that restarts under its bare name (a fixed --agent-id) and counts from 1 again would
    have every frame dropped until it passed its old count. Its messages carry its start
    (``sender_id``), so the restart is a new sequence."""
    def msg(agent: str, seq: int) -> FindingsMessage:
        (report,) = decode_findings(encode_findings([PieceReport(PieceInfo(agent, seq, 0, 1, 0.0), float(seq), 1,
                                                                 [Anomaly(0.0, "gpu", 0, "gpu_temp", 1.0, "d")])], 0, 0))
        return report

    stage = IncidentStage([CountingProcessor()])
    assert [len(stage.observe(msg("node7", q))) for q in (1, 2, 3)] == [1, 1, 1]
    assert stage.observe(msg("node7", 1)) == [] and stage.duplicates == 1  # the bare name, restarted
    first, second = sender_id("node7"), sender_id("node7")  # two starts (the same millisecond, even)
    assert first != second and first.startswith("node7#") and second.startswith("node7#")
    assert [len(stage.observe(msg(s, q))) for s in (first, second) for q in (1, 2)] == [1, 1, 1, 1]
    assert stage.duplicates == 1


def findings_piece(seq: int, part: int = 0, parts: int = 1, agent: str = "a#1") -> FindingsMessage:
    """One piece of ``agent``'s frame ``seq`` as the incident stage reads it: its time is ``seq``,
    with one anomaly."""
    (report,) = decode_findings(encode_findings([PieceReport(PieceInfo(agent, seq, part, parts, 0.0), float(seq), 1,
                                                             [Anomaly(float(seq), "gpu", 0, "gpu_temp", 1.0, "d")])],
                                                0, 0))
    return report


def test_a_piece_lost_for_good_holds_its_sender_back_only_for_a_while():
    """An agent's send that fails after the broker was away past its delivery timeout loses its
    pieces for good; the agent goes on with later frames. The incident stage runs each sender's
    frames in order, and until 2026-12-01 waited for the lost piece forever: every later frame of
    that sender piled up in memory and in every checkpoint, and none reached the incident engine.
    Now it waits FRAME_WAIT_S from the frame's first piece (or, for a frame of which nothing came,
    from when a later one came), runs it with what it has, counts it, and goes on — across a
    restart from a checkpoint too. A piece that comes after all is counted, not run."""
    now = [1_800_000_000.0]
    msg = findings_piece

    def ts(found: list[Finding]) -> list[float]:
        return [f.ts for f in found]

    stage = IncidentStage([CountingProcessor()], clock=lambda: now[0], frame_wait_s=180.0)
    assert stage.observe(msg(1, 0, 2)) == []  # its part 1 is lost
    assert [stage.observe(msg(q)) for q in (2, 3)] == [[], []]
    now[0] += 100
    assert stage.observe(msg(4)) == []  # still within the wait
    now[0] += 81
    assert ts(stage.observe(msg(5))) == [1.0, 2.0, 3.0, 4.0, 5.0]  # frame 1 with its one piece, then the rest
    assert stage.health.problems[("incidents", "frame_incomplete")] == 1 and not stage.pending
    assert stage.observe(msg(1, 1, 2)) == [] and stage.health.problems[("incidents", "late_piece")] == 1
    assert stage.duplicates == 0
    # nothing of frames 6 and 7 ever comes (all their sends failed); 8 waits behind them, through
    # a restart, and both are given up on after one wait
    assert stage.observe(msg(8)) == []
    _, blob = stage.checkpoint()
    restored = IncidentStage([CountingProcessor()], clock=lambda: now[0], frame_wait_s=180.0)
    restored.load(blob)
    now[0] += 179
    assert restored.observe(msg(9)) == []
    now[0] += 2
    assert ts(restored.observe(msg(10))) == [8.0, 9.0, 10.0]
    assert restored.health.problems[("incidents", "frame_missing")] == 2
    # a sender that is merely mid-frame (nothing later yet) is waited for however long it takes
    assert restored.observe(msg(11, 0, 2)) == []
    now[0] += 3600
    assert restored.observe(msg(11, 1, 2)) != [] and not restored.pending
    # and a frame merely late after all that is waited for afresh, not given up on at once
    assert restored.observe(msg(13)) == []
    now[0] += 60
    assert ts(restored.observe(msg(12))) == [12.0, 13.0]
    assert restored.health.problems[("incidents", "frame_missing")] == 2


def test_frames_behind_a_lost_piece_run_even_if_their_sender_falls_silent():
    """The wait for a lost piece was measured when the sender's next message came: an agent that
    stopped, or restarted (a new sender), left every frame behind the lost piece waiting — complete
    ones too — until it was retired 6 hours later. The worker now calls ``release_overdue`` with
    its checkpoints."""
    now = [1_800_000_000.0]
    msg = findings_piece

    stage = IncidentStage([CountingProcessor()], clock=lambda: now[0], frame_wait_s=180.0)
    assert [len(stage.observe(m)) for m in (msg(1), msg(2, 0, 2), msg(3), msg(4))] == [1, 0, 0, 0]
    now[0] += 100
    assert stage.release_overdue() == []
    now[0] += 81
    assert [f.ts for f in stage.release_overdue()] == [2.0, 3.0, 4.0]
    assert stage.health.problems[("incidents", "frame_incomplete")] == 1 and not stage.pending


def test_a_stage_without_a_checkpoint_takes_running_senders_up_where_they_are():
    """A fresh incident stage (the first, or after checkpoint_unusable) met every agent younger
    than 6 hours mid-sequence and waited for its frame 1: for 3 minutes, and then it gave the
    frames up one by one (2 million entries for 200 agents 3 hours old). It now takes a sender
    that started before it up where its messages are; one that starts after it counts from 1, and
    a run of frames of which nothing came is one record however long."""
    now = [1_800_000_000.0]

    def msg(agent: str, seq: int) -> FindingsMessage:
        return findings_piece(seq, agent=agent)

    running = f"node1#{int((now[0] - 3 * 3600) * 1000)}"
    stage = IncidentStage([CountingProcessor()], clock=lambda: now[0], frame_wait_s=180.0)
    assert len(stage.observe(msg(running, 10_800))) == 1 and not stage.health.problems
    now[0] += 10
    later = f"node2#{int(now[0] * 1000)}"
    assert stage.observe(msg(later, 2)) == []  # a new sender: waits for its frame 1
    assert len(stage.observe(msg(later, 1))) == 2
    # nothing of frames 10,801..20,000 ever comes: one wait, one record
    assert stage.observe(msg(running, 20_001)) == []
    now[0] += 181
    assert len(stage.observe(msg(running, 20_002))) == 2
    assert stage.health.problems[("incidents", "frame_missing")] == 9_200
    assert stage.given_up[running] == [(10_801, 20_000, now[0])]
    # restored from its checkpoint, the stage waits on a sender it does not know from frame 1
    _, blob = stage.checkpoint()
    restored = IncidentStage([CountingProcessor()], clock=lambda: now[0], frame_wait_s=180.0)
    restored.load(blob)
    other = f"node3#{int((now[0] - 3600) * 1000)}"
    assert restored.observe(msg(other, 5)) == []


def test_senders_silent_for_hours_are_forgotten_and_taken_up_again_if_they_speak():
    """Every agent start is a sender of its own, so the last sequence numbers of dead ones would
    pile up in every checkpoint for the life of the deployment: one silent for RETIRE_SENDER_S is
    forgotten, and a frame it left incomplete (it stopped mid-frame) is dropped and counted — before
    2026-12-01 that frame kept it, and itself, in every checkpoint forever. Should it speak again, it started before that horizon, so its
    sequence is taken up where it is rather than waited on from 1 (forever); a sender started
    since is new and counts from 1."""
    now = [1_800_000_000.0]

    def msg(agent: str, seq: int, part: int = 0, parts: int = 1) -> FindingsMessage:
        (report,) = decode_findings(encode_findings([PieceReport(PieceInfo(agent, seq, part, parts, 0.0), float(seq), 1,
                                                                 [Anomaly(0.0, "gpu", 0, "gpu_temp", 1.0, "d")])], 0, 0))
        return report

    def sender(name: str, started: float) -> str:
        return f"{name}#{int(started * 1000)}"

    stage = IncidentStage([CountingProcessor()], clock=lambda: now[0])
    dead, waiting, alive = (sender(n, now[0] - 60) for n in ("dead", "waiting", "alive"))
    assert [len(stage.observe(msg(dead, q))) for q in (1, 2, 3)] == [1, 1, 1]
    assert stage.observe(msg(waiting, 1, 1, 2)) == []  # half a frame, waiting for its other piece
    now[0] += RETIRE_SENDER_S + 1
    assert len(stage.observe(msg(alive, 1))) == 1
    _, blob = stage.checkpoint()
    assert set(stage.released) == {alive} and set(stage.last_heard) == {alive} and not stage.pending
    assert stage.health.problems[("incidents", "frame_incomplete")] == 1
    restored = IncidentStage([CountingProcessor()], clock=lambda: now[0])
    restored.load(blob)
    assert set(restored.released) == {alive}
    assert len(restored.observe(msg(dead, 4))) == 1  # the dead one was only silent: taken up at 4
    fresh = sender("fresh", now[0] - 5)
    assert restored.observe(msg(fresh, 2)) == []  # new: waits for its frame 1
    assert [i.ts for i in restored.observe(msg(fresh, 1))] == [1.0, 2.0]  # type: ignore[union-attr]
    # a checkpoint from before senders were retired: every sender is taken as heard from now
    state = restored.state()
    del state["last_heard"]
    old = IncidentStage([CountingProcessor()], clock=lambda: now[0])
    old.load(encode_checkpoint(7, state, "incidents", old.signature))
    assert old.retire_senders() == 0 and set(old.released) == {alive, dead, fresh}


class TelemetryProcessor(CountingProcessor):
    """Reads gpu_temp from frames (declared), like the incident engine's headroom tracking."""

    name = "telemetry"
    frame_fields = {"gpu": ("gpu_temp",)}

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[list[int], list[float], bool, int]] = []

    def observe_frame(self, frame: Frame) -> None:
        others_empty = all(np.isnan(v).all() for k, v in frame.columns.items() if k != "gpu_temp")
        self.seen.append((frame.slot.tolist(), frame.columns["gpu_temp"].tolist(), others_empty, self.calls))


def test_processors_that_read_frames_get_the_guarded_rows_they_declared(small_topology: Topology):
    """The detection stage forwards each piece's rows that passed the input guard, only the
    declared fields, and the incident stage hands them to the processor before the findings of
    their frame — what the embedded bank does with the whole frame."""
    topo = small_topology
    bank = lambda hardware: DetectorBank.from_names(hardware, ["robust_zscore"], processors=[TelemetryProcessor()])  # noqa: E731
    detection = DetectionStage(topo, bank, 2)
    assert detection.frame_fields == {"gpu": ("gpu_temp",)}
    incidents = IncidentStage([TelemetryProcessor()])
    pmap = PartitionMap(topo, 2)
    offsets = Counter[int]()
    n = len(topo.gpus)
    times = [np.full(n, 10.0), np.full(n, 20.0), np.where(np.arange(n) % 2 == 0, 20.0, 30.0)]
    for seq, ts in enumerate(times, 1):  # the third frame repeats the second's time for even GPUs
        frame = Frame("gpu", ts, np.arange(len(topo.gpus)),
                      {"gpu_temp": 40.0 + np.arange(len(topo.gpus)) + seq, "power": np.full(len(topo.gpus), 500.0)})
        pieces = pmap.messages(frame)
        for index, (part, piece) in enumerate(pieces):
            if not detection.owns(part):
                detection.load(part, None)
            value, headers = encode_bundle("a", 0.0, [(seq, index, len(pieces), piece)])
            result = detection.process(part, offsets[part], value, headers)
            offsets[part] += 1
            for tvalue, theaders in result.telemetry_messages:
                assert is_telemetry(theaders)
                for decoded in decode_bundle(tvalue, headers_dict(theaders), topo, pmap, None):
                    assert decoded.frame is not None
                    incidents.observe_telemetry(decoded.info, decoded.frame)
            assert result.findings_message is not None
            for report in decode_findings(result.findings_message):
                incidents.observe(report)
    (proc,) = incidents.processors
    assert isinstance(proc, TelemetryProcessor) and proc.calls == 3
    # per frame, both partitions' rows (only gpu_temp), then the findings; of the third frame only
    # the rows the guard kept (the repeated timestamps are dropped, as in the embedded pipeline)
    by_call = [sorted(s for slots, _, _, c in proc.seen if c == call for s in slots) for call in (0, 1, 2)]
    assert by_call == [list(range(n)), list(range(n)), list(range(1, n, 2))]
    assert all(others_empty for _, _, others_empty, _ in proc.seen)
    temps = {(c, s): t for slots, ts, _, c in proc.seen for s, t in zip(slots, ts)}
    assert temps[(0, 5)] == 46.0 and temps[(1, 5)] == 47.0


def test_a_dropped_partition_leaves_the_workers_exported_view(small_topology: Topology):
    """After a rebalance the partition's new owner exports its GPUs; the old owner must stop, or
    the cluster-wide sums (GPUs reporting — the GPU-missing alert's input) count them twice."""
    from foreshock.findings import Prediction

    topo = small_topology
    detection = DetectionStage(topo, lambda hardware: DetectorBank.from_names(hardware, ["robust_zscore"]), 2)
    pmap = PartitionMap(topo, 2)
    n = len(topo.gpus)
    frame = Frame("gpu", np.full(n, 10.0), np.arange(n), {"gpu_temp": np.full(n, 50.0), "power": np.full(n, 500.0)})
    for offset, (part, piece) in enumerate(pmap.messages(frame)):
        detection.load(part, None)
        value, headers = encode_bundle("a", 0.0, [(1, offset, 2, piece)])
        detection.process(part, 0, value, headers)
    gone = np.flatnonzero(pmap.by_kind["gpu"] == 1)
    kept = np.flatnonzero(pmap.by_kind["gpu"] == 0)
    assert len(gone) and len(kept)
    detection.store.observe_findings([Prediction(10.0, "gpu", int(s), "thermal_throttle", 300.0, 0.9, "thermal", "test")
                                      for s in (gone[0], kept[0])])
    before = detection.store.snapshot()
    assert before.seen["gpu"].all() and len(before.predictions) == 2

    detection.drop(1)

    after = detection.store.snapshot()
    assert after.seen["gpu"][kept].all() and not after.seen["gpu"][gone].any()
    assert np.isnan(after.latest["gpu"]["gpu_temp"][gone]).all() and np.isneginf(after.last_seen["gpu"][gone]).all()
    assert (after.latest["gpu"]["gpu_temp"][kept] == 50.0).all()
    assert [p.slot for p in after.predictions] == [kept[0]]


WARM_UP_PROBE = """
import gc, sys
from numba.core.registry import CPUDispatcher
from foreshock.detectors.bank import DetectorBank
from foreshock.streams.kafka_codec import PartitionMap, encode_bundle
from foreshock.streams.kafka_worker import DetectionStage
from foreshock.streams.sources import ReplaySource

def loaded():
    return {d.py_func.__qualname__: len(d.overloads) for d in gc.get_objects()
            if isinstance(d, CPUDispatcher) and d.py_func.__module__.startswith("foreshock.")}

source = ReplaySource(sys.argv[1])
topo = source.topology
stage = DetectionStage(topo, lambda hardware: DetectorBank.from_names(hardware), 2)
stage.warm_up()
warm = loaded()
pmap = PartitionMap(topo, 2)
offsets = [0, 0]
for seq, frame in enumerate(source, 1):
    messages = pmap.messages(frame)
    for index, (part, piece) in enumerate(messages):
        if not stage.owns(part):
            stage.load(part, None)
        value, headers = encode_bundle("a", 0.0, [(seq, index, len(messages), piece)])
        stage.process(part, offsets[part], value, headers)
        offsets[part] += 1
print(sorted(name for name, n in loaded().items() if warm.get(name, 0) and n > warm[name]))
"""


def test_warm_up_loads_the_kernel_versions_real_frames_use(recording: Path):
    """A worker warms its kernels up before it joins the group; a kernel the warm-up loaded
    must not need another version (another array layout) for real frames mid-stream. In a
    fresh interpreter: kernels loaded by other tests would hide it."""
    proc = subprocess.run([sys.executable, "-c", WARM_UP_PROBE, str(recording)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


def test_the_warm_up_reads_no_board_swap(small_topology: Topology, caplog):
    """Its throw-away frames carry no board: with every field 0, then 1, board_id too, each
    worker's start logged "GPU ...: another board in its slot (board_id 0 -> 1)"."""
    stage = DetectionStage(small_topology, lambda hardware: DetectorBank.from_names(hardware), 2)
    with caplog.at_level(logging.WARNING):
        stage.warm_up()
    assert not [r.getMessage() for r in caplog.records if "board" in r.getMessage()]


def test_detection_stage_resumes_from_checkpoint_with_identical_output(recording: Path):
    source = ReplaySource(str(recording), batch_rows=BATCH_ROWS)
    topo = source.topology
    pmap = PartitionMap(topo, 2)
    next_offset = Counter[int]()
    records = []
    builders = {p: BundleBuilder(max_bytes=64 * 1024) for p in range(2)}  # records of a few frames each

    def record(part: int, entries: list[Any]) -> None:
        value, headers = encode_bundle("a", 0.0, entries)
        records.append((part, next_offset[part], value, headers))
        next_offset[part] += 1

    for seq, frame in enumerate(source, 1):
        messages = pmap.messages(frame)
        for index, (part, piece) in enumerate(messages):
            for entries in builders[part].add((seq, index, len(messages), piece)):
                record(part, entries)
    for part, builder in builders.items():
        if builder.entries:
            record(part, builder.take())
    assert len(records) > 20

    def run(stage: DetectionStage, recs: list[Any]) -> list[str]:
        out = []
        for part, offset, value, headers in recs:
            if not stage.owns(part):
                stage.load(part, None)
            result = stage.process(part, offset, value, headers)
            out.extend(finding_to_json(f) for f in result.findings)
        return out

    straight = run(DetectionStage(topo, lambda hardware: DetectorBank.from_names(hardware), 2), records)
    assert Counter(straight) == canon(detector_findings(recording))
    half = len(records) // 2
    first = DetectionStage(topo, lambda hardware: DetectorBank.from_names(hardware), 2)
    got = run(first, records[:half])
    blobs = {p: first.checkpoint(p)[1] for p in list(first.parts)}
    second = DetectionStage(topo, lambda hardware: DetectorBank.from_names(hardware), 2)
    for p in range(2):
        second.load(p, blobs.get(p))
    replayed = [second.process(*r) for r in records]  # offsets at or below the checkpoint are skipped
    assert sum(r.skipped for r in replayed) == half
    got += [finding_to_json(f) for r in replayed for f in r.findings]
    assert Counter(got) == Counter(straight)


def _checkpoint_after_job_rows(topo: Topology) -> bytes:
    """A one-partition detection stage that read both jobs' step times at t = 1..5, checkpointed."""
    stage = DetectionStage(topo, lambda hardware: DetectorBank.from_names(hardware), 1)
    stage.load(0, None)
    for t in range(1, 6):
        frame = Frame("job", [float(t)] * 2, [0, 1], {"step_time": [1.0, 2.0]})
        value, headers = encode_bundle("a", 0.0, [(t, 0, 1, frame)], topology=topo)
        stage.process(0, t - 1, value, headers)
    return stage.checkpoint(0)[1]


def test_a_worker_restarted_with_a_new_job_list_reads_every_listed_job(small_topology: Topology):
    """The README's way to change jobs is to restart the workers with the new file. Their
    checkpoints then carry per-job state under the old list: before, a restored partition kept the
    old number of job slots, and the rows of a job beyond them were refused as unknown entities
    for as long as the checkpoints lasted. Now each job is found again by name and nodes: job1
    (same nodes, now listed first) keeps its last timestamp, so its repeated row is a duplicate;
    the two new jobs on job0's nodes start fresh."""
    checkpoint = _checkpoint_after_job_rows(small_topology)
    data = small_topology.to_dict()
    job0, job1 = data["jobs"]
    data["jobs"] = [job1, {"name": "job2", "nodes": job0["nodes"][:1]}, {"name": "job3", "nodes": job0["nodes"][1:]}]
    new = Topology.from_dict(data)
    stage = DetectionStage(new, lambda hardware: DetectorBank.from_names(hardware), 1)
    assert stage.load(0, checkpoint) == 4  # resumed, not started fresh
    frame = Frame("job", [5.0] * 3, [0, 1, 2], {"step_time": [2.0, 1.0, 1.0]})
    value, headers = encode_bundle("a", 0.0, [(6, 0, 1, frame)], topology=new)
    result = stage.process(0, 5, value, headers)
    assert result.rows == 3
    problems = {reason: n for (_, reason), n in stage.health.problems.items()}
    assert problems == {"duplicate_timestamp": 1}  # job1's t = 5 again; job2 and job3 read


def test_no_detector_keeps_state_by_job_slot(small_topology: Topology):
    """A restored partition finds jobs again only in the guard (and the incident engine in its own
    stage): a detector that kept per-job arrays would need the same, so this fails first."""
    data = small_topology.to_dict()
    data["jobs"] = [{"name": f"solo{i}", "nodes": [node]} for i, node in enumerate(small_topology.nodes)]
    more = Topology.from_dict(data)
    assert len(more.jobs) != len(small_topology.jobs)

    def shapes(state: Any, path: str = "") -> dict[str, tuple[int, ...]]:
        if isinstance(state, dict):
            return {k: v for key, sub in state.items() for k, v in shapes(sub, f"{path}/{key}").items()}
        return {path: state.shape} if isinstance(state, np.ndarray) else {}

    names = sorted(set(DETECTORS) - {"sklearn"})  # every detector but the one that needs a model file
    assert shapes(DetectorBank.from_names(more, names, processors=()).state_dict()) == \
        shapes(DetectorBank.from_names(small_topology, names, processors=()).state_dict())


def test_a_checkpoint_for_other_hardware_is_refused_where_its_state_cannot_follow_the_entities(
        small_topology: Topology):
    """The same counts in another order (two nodes' names swapped) would pass every shape check
    and load one node's state into the other. A checkpoint written with its hardware's layout is
    moved entity by entity (tests/test_hardware_change.py); one written without it (before layouts
    were kept), and an incident stage whose processors cannot move their state, are refused: the
    partition (or the stage) starts fresh and says why."""
    checkpoint = _checkpoint_after_job_rows(small_topology)
    saved = decode_checkpoint(checkpoint, "detect", bank_signature(DetectorBank.from_names(small_topology, processors=())))
    without_layout = encode_checkpoint(saved.offset, saved.state, "detect",
                                       bank_signature(DetectorBank.from_names(small_topology, processors=())),
                                       small_topology)
    data = small_topology.to_dict()
    names = {"node0": "node1", "node1": "node0"}
    text = json.dumps(data)
    for old, new in (("node0", "nodeX"), ("node1", "node0"), ("nodeX", "node1")):
        text = text.replace(f'"{old}', f'"{new}')
    moved = Topology.from_dict(json.loads(text))
    assert moved.size("gpu") == small_topology.size("gpu") and moved.nodes[:2] == [names["node0"], names["node1"]]
    stage = DetectionStage(moved, lambda hardware: DetectorBank.from_names(hardware), 1)
    assert stage.load(0, without_layout) == -1
    assert stage.health.problems[("worker", "checkpoint_unusable")] == 1
    assert stage.load(0, checkpoint) == 4 and stage.health.problems[("worker", "checkpoint_unusable")] == 1
    _, blob = IncidentStage(DetectorBank.from_names(small_topology).processors, topology=small_topology).checkpoint()
    engine = IncidentStage(DetectorBank.from_names(moved).processors, topology=moved)
    assert engine.load(blob) == -1 and not engine.health.problems  # the incident engine moves its state
    _, blob = IncidentStage([CountingProcessor()], topology=small_topology).checkpoint()
    refused = IncidentStage([CountingProcessor()], topology=moved)
    refused.load(blob)
    assert refused.health.problems[("worker", "checkpoint_unusable")] == 1
    same = IncidentStage([CountingProcessor()], topology=small_topology)
    same.load(blob)
    assert not same.health.problems


# ---- against the real broker --------------------------------------------------------------
def read_incidents(settings: KafkaSettings, topic: str, want: int, timeout_s: float = 30.0) -> list[Any]:
    """The incidents topic once it holds ``want`` records (or at the timeout): the incident stage
    may still be reading the last findings when the detect side is done — on a loaded machine
    it trails by seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        incidents = read_topic(settings, topic, None, timeout_s=3)
        if len(incidents) >= want or time.monotonic() > deadline:
            return incidents


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
    return [m for r in records if not is_telemetry(r.headers) for m in decode_findings(r.value)], stats.pieces


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
    assert canon(findings_of(messages)) == canon(detector_findings(recording))
    assert len({m.worker for m in unique}) == 2  # the partitions were shared
    embedded_incidents = [f for f in embedded_findings(recording) if f.type == "incident"]
    assert embedded_incidents  # the comparison below must not be between two empty lists
    incidents = read_incidents(kafka_settings, topics.incidents, len(embedded_incidents))
    assert Counter(r.value.decode() for r in incidents) == canon(embedded_incidents)


@pytest.mark.kafka
@pytest.mark.slow
def test_detect_workers_and_an_incidents_worker_find_what_the_embedded_pipeline_finds(
        kafka_settings, recording, workers):
    """The incident stage on a worker of its own: the same findings and incidents as the
    embedded pipeline, the detection shared by the two detect workers."""
    topics = ensure_topics(kafka_settings, Topics(namespace(), 2))
    group = workers(kafka_settings.bootstrap, topics, "g-" + topics.namespace)
    group.start(recording / "topology.yaml", role="detect")
    group.start(recording / "topology.yaml", role="detect")
    group.start(recording / "topology.yaml", role="incidents")
    wait_for_members(kafka_settings, group.group + ".detect", 2)
    wait_for_members(kafka_settings, group.group + ".incidents", 1)
    messages, pieces = run_and_collect(kafka_settings, topics, recording, speed=None)
    unique = dedupe_findings_messages(messages)
    assert len(unique) == pieces, group.logs()
    assert canon(findings_of(messages)) == canon(detector_findings(recording))
    assert len({m.worker for m in unique}) == 2  # both detect workers took a partition
    embedded_incidents = [f for f in embedded_findings(recording) if f.type == "incident"]
    assert embedded_incidents
    incidents = read_incidents(kafka_settings, topics.incidents, len(embedded_incidents))
    assert Counter(r.value.decode() for r in incidents) == canon(embedded_incidents), group.logs()


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
    assert canon(findings_of(messages)) == canon(detector_findings(recording))
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
    assert canon(findings_of(messages)) == canon(detector_findings(recording))


def restart_on_new_file(kafka_settings: KafkaSettings, topics: Topics, workers: Any, files: tuple[Path, Path],
                        topologies: tuple[Topology, Topology], frame: Any, before: list[tuple[float, list[int]]],
                        after: list[tuple[float, list[int]]]) -> str:
    """A worker reads ``frame(t, slots)`` of each of ``before`` under the first file (an agent
    with the first topology sends them), checkpoints and stops; another starts under the second
    file and reads ``after``. Returns the second worker's log."""

    def publish(topology: Topology, rows: list[tuple[float, list[int]]]) -> None:
        publisher = FramePublisher(kafka_settings, topology, topics, agent_id="rows", linger_ms=0)
        for t, slots in rows:
            publisher.publish(frame(t, slots))
        publisher.close()

    first = workers(kafka_settings.bootstrap, topics, "g-" + topics.namespace)
    first.start(files[0])
    publish(topologies[0], before)
    assert len(read_topic(kafka_settings, topics.findings, want=len(before), timeout_s=60)) >= len(before), \
        first.logs()
    time.sleep(2)  # a checkpoint (every second) covers them
    first.stop()
    second = workers(kafka_settings.bootstrap, topics, "g-" + topics.namespace)
    second.start(files[1])
    publish(topologies[1], after)
    read_topic(kafka_settings, topics.findings, want=len(before) + len(after), timeout_s=60)
    return second.logs()  # type: ignore[no-any-return]


@pytest.mark.kafka
@pytest.mark.slow
def test_workers_restarted_with_a_new_job_list_resume_and_read_every_job(kafka_settings, small_topology: Topology,
                                                                          tmp_path: Path, workers):
    """What the README says to do when the jobs change, on the real broker: a worker reads both
    jobs' step times, stops, and starts again with a file listing job1 first and two new jobs on
    job0's nodes (the agent too, as it publishes job rows). It resumes from its checkpoint — job1's
    repeated time is a duplicate — and reads the new jobs' rows."""
    topics = ensure_topics(kafka_settings, Topics(namespace(), 1))
    old_path, new_path = tmp_path / "old.yaml", tmp_path / "new.yaml"
    small_topology.dump(old_path)
    data = small_topology.to_dict()
    job0, job1 = data["jobs"]
    data["jobs"] = [job1, {"name": "job2", "nodes": job0["nodes"][:1]}, {"name": "job3", "nodes": job0["nodes"][1:]}]
    new = Topology.from_dict(data)
    new.dump(new_path)

    logs = restart_on_new_file(kafka_settings, topics, workers, (old_path, new_path), (small_topology, new),
                               lambda t, slots: Frame("job", [t] * len(slots), slots, {"step_time": [2.0] * len(slots)}),
                               [(float(t), [0, 1]) for t in range(1, 6)], [(5.0, [0, 1, 2]), (6.0, [0, 1, 2])])
    assert "duplicate_timestamp" in logs, logs  # job1, now slot 0, remembered t = 5
    assert "unknown_entity" not in logs and "checkpoint_unusable" not in logs, logs


@pytest.mark.kafka
@pytest.mark.slow
def test_workers_restarted_on_changed_hardware_resume_with_each_entity_s_state(kafka_settings,
                                                                               small_topology: Topology,
                                                                               tmp_path: Path, workers):
    """What the README says to do when racks are added, on the real broker: a worker reads
    node0/gpu0 at t = 1..5, stops, and starts again with a file whose new rack's node is listed
    first (node0/gpu0 moves from slot 0 to slot 8). It resumes from its checkpoint and the GPU
    keeps its state under its name — its repeated time is a duplicate — while the new node's GPU
    reads fresh. Before, the checkpoint was refused (`checkpoint_unusable`)."""
    topics = ensure_topics(kafka_settings, Topics(namespace(), 1))
    old_path, new_path = tmp_path / "old.yaml", tmp_path / "new.yaml"
    small_topology.dump(old_path)
    data = small_topology.to_dict()
    data["racks"].append({"name": "rack9", "row": "row0"})
    data["nodes"].insert(0, {"name": "node9", "rack": "rack9", "gpus": 8})
    new = Topology.from_dict(data)
    new.dump(new_path)
    moved, added = new.slot("gpu", "node0/gpu0"), new.slot("gpu", "node9/gpu0")
    assert (small_topology.slot("gpu", "node0/gpu0"), moved, added) == (0, 8, 0)

    logs = restart_on_new_file(kafka_settings, topics, workers, (old_path, new_path), (small_topology, new),
                               lambda t, slots: Frame("gpu", [t] * len(slots), slots, {"gpu_temp": [40.0] * len(slots)}),
                               [(float(t), [0]) for t in range(1, 6)], [(5.0, [moved, added]), (6.0, [moved, added])])
    assert "duplicate_timestamp" in logs, logs  # node0/gpu0, now slot 8, remembered t = 5
    assert "checkpoint_unusable" not in logs and "unknown_entity" not in logs, logs


@pytest.mark.kafka
@pytest.mark.slow
def test_a_worker_that_cannot_write_its_checkpoint_exits_rather_than_read_on(kafka_settings, small_topology: Topology,
                                                                             tmp_path: Path, workers):
    """On the real broker: a checkpoints topic that refuses every checkpoint (its message limit
    set far too low). Before, the failing handler had faust restart the agent and the worker read
    on, its records never covered; now it exits with status 70, naming the record, so that its
    supervisor restarts it (or its partitions move) and nothing is committed past the failure."""
    from kafka.admin import KafkaAdminClient, NewTopic

    from foreshock.streams.faust_app import EXIT_RECORD_FAILED

    topics = Topics(namespace(), 1)
    admin = KafkaAdminClient(**kafka_settings.kafka_python())
    try:
        admin.create_topics([NewTopic(topics.checkpoints, topics.partitions + 1, 1,
                                      topic_configs={"max.message.bytes": "256", "cleanup.policy": "compact"})])
    finally:
        admin.close()
    topics = ensure_topics(kafka_settings, topics)
    path = tmp_path / "topology.yaml"
    small_topology.dump(path)
    group = workers(kafka_settings.bootstrap, topics, "g-" + topics.namespace)
    proc = group.start(path)
    publisher = FramePublisher(kafka_settings, small_topology, topics, agent_id="rows", linger_ms=0)
    n = small_topology.size("gpu")
    for t in range(1, 4):
        publisher.publish(Frame("gpu", [float(t)] * n, np.arange(n), {"gpu_temp": np.full(n, 50.0)}))
    publisher.close()
    assert proc.wait(timeout=120) == EXIT_RECORD_FAILED, group.logs()
    logs = group.logs()
    assert "could not be handled" in logs and "the worker exits" in logs, logs


@pytest.mark.kafka
def test_an_agent_restarted_under_its_name_sends_as_a_new_sender(kafka_settings, small_topology: Topology):
    """Two runs of ``foreshock agent --agent-id node7``, one after the other, on the real broker:
    their records carry the name and each run's own start, so the incident stage does not take
    the second run's frames 1, 2, ... for repeats of the first's."""
    topics = ensure_topics(kafka_settings, Topics(namespace(), 1))
    frame = Frame("gpu", [1.0], [0], {"gpu_temp": [40.0]})
    for _ in range(2):
        publisher = FramePublisher(kafka_settings, small_topology, topics, agent_id="node7", linger_ms=0)
        publisher.publish(frame)
        publisher.close()
    records = read_topic(kafka_settings, topics.frames, None, timeout_s=10)
    senders = [headers_dict(r.headers)[H_AGENT].decode() for r in records]
    assert len(senders) == 2 and senders[0] != senders[1]
    assert all(s.startswith("node7#") for s in senders)


@pytest.mark.kafka
def test_bad_records_land_in_the_dead_letter_topic_with_the_reason(kafka_settings, recording, workers):
    topics = ensure_topics(kafka_settings, Topics(namespace(), 2))
    source = ReplaySource(str(recording), batch_rows=BATCH_ROWS)
    topo = source.topology
    publisher = FramePublisher(kafka_settings, topo, topics, agent_id="bad-t")
    producer = KafkaProducer(**kafka_settings.kafka_python())
    good = Frame("gpu", [1.0], [0], {"gpu_temp": [40.0]})
    part = int(PartitionMap(topo, 2).partition_of("gpu", good.slot)[0])

    def hdr(seq: int) -> list[tuple[str, bytes]]:
        return piece_headers("gpu", "bad-t", seq, 0, 1, 0.0)

    producer.send(topics.frames, value=b"\x13garbage", partition=part, headers=hdr(97))
    producer.send(topics.frames, value=good.to_ipc(), partition=part,
                  headers=[(k, b"csv" if k == "foreshock-schema" else v) for k, v in hdr(98)])
    producer.send(topics.frames, value=Frame("gpu", [1.0], [999_999], {}).to_ipc(), partition=part, headers=hdr(99))
    # a bundle with one bad piece between two good ones: only that piece is dead-lettered
    later = [Frame("gpu", [t], [0], {"gpu_temp": [41.0]}) for t in (5.0, 7.0)]
    value, headers = encode_bundle("mixed-t", 0.0, [(1, 0, 1, later[0]), (2, 0, 1, Frame("gpu", [6.0], [999_998], {})),
                                                   (3, 0, 1, later[1])])
    producer.send(topics.frames, value=value, partition=part, headers=headers)
    # an agent that numbers its entities by a topology of its own (one it derived, say)
    own = Topology.from_gpu_hosts([(topo.nodes[0], g) for g in range(8)])
    value, headers = encode_bundle("own-t", 0.0, [(1, 0, 1, good)], topology=own)
    producer.send(topics.frames, value=value, partition=part, headers=headers)
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
    while len(dead) < 7 and time.monotonic() < deadline:
        time.sleep(1)
        dead = read_topic(kafka_settings, topics.deadletter, None, timeout_s=5)
    codes = Counter(headers_dict(r.headers).get("foreshock-reason-code", b"").decode() for r in dead)
    assert codes == {"undecodable": 1, "wrong_schema": 1, "unknown_entity": 2, "invalid_record": 2,
                     "topology_mismatch": 1}, group.logs()
    reasons = " | ".join(headers_dict(r.headers)[H_REASON].decode() for r in dead)
    assert "not an Arrow IPC stream" in reasons and "ghost/gpu9" in reasons and "invalid JSON" in reasons
    sources = {headers_dict(r.headers)["foreshock-source"].decode().rsplit("/", 2)[0] for r in dead}
    assert sources == {topics.frames, topics.json}
    assert any(r.value == b"\x13garbage" for r in dead)  # the original bytes are kept
    (piece,) = [r for r in dead if headers_dict(r.headers).get("foreshock-agent") == b"mixed-t"]
    assert headers_dict(piece.headers)["foreshock-seq"] == b"2"  # the bad piece alone, as its own message
    assert Frame.from_ipc(piece.value).slot.tolist() == [999_998]
    # each dead-lettered piece still reports (empty), so its frame's sequence stays complete;
    # the good pieces (the agent's frame, the bundle's two, the valid JSON record) were processed
    found = [m for r in read_topic(kafka_settings, topics.findings, want=9, timeout_s=30)
             if not is_telemetry(r.headers) for m in decode_findings(r.value)]
    assert sorted((re.split("[@#]", m.agent)[0], m.seq, m.rows) for m in found) == [  # less the senders' starts
        ("bad-t", 1, 1), ("bad-t", 97, 0), ("bad-t", 98, 0), ("bad-t", 99, 0), ("json", 1, 1),
        ("mixed-t", 1, 1), ("mixed-t", 2, 0), ("mixed-t", 3, 1), ("own-t", 1, 0)]


@pytest.mark.kafka
def test_running_worker_leaves_nothing_in_the_current_directory(kafka_settings, recording, tmp_path):
    """A real worker run (joined, then stopped): its faust data directory was in the temporary
    folder, not in the current directory, and is gone afterwards."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    topics = ensure_topics(kafka_settings, Topics(namespace(), 1))
    group = "g-" + topics.namespace
    with open(tmp_path / "worker.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "foreshock.cli.main", "worker", "--kafka", kafka_settings.bootstrap,
             "--namespace", topics.namespace, "--partitions", "1", "--group", group,
             "--topology", str(recording / "topology.yaml"), "--port", "0", "--session-timeout", "3"],
            cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp)})
        try:
            wait_for_members(kafka_settings, group, 1)
            assert any(p.name.startswith("foreshock-worker-") for p in tmp.iterdir())  # the data dir is here
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert list(cwd.iterdir()) == [], (tmp_path / "worker.log").read_text()
    assert not any(p.name.startswith("foreshock-worker-") for p in tmp.iterdir())


# ---- external events (external.events) ----------------------------------------------------
def external_line(node: str, t: float, typ: str = "fan_failure") -> bytes:
    return json.dumps({"node": node, "time": t, "type": typ, "severity": "critical"}).encode() + b"\n"


def test_incident_stage_checkpoint_keeps_queued_external_events_and_their_offset(small_topology: Topology):
    """Events taken from external.events wait in the incident engine until telemetry time
    reaches them; a checkpoint taken meanwhile holds them and the offset, so a restored stage
    groups them exactly like the original and skips the redelivered record."""
    from foreshock.detectors.incident_external import ExternalEvent

    def stage() -> IncidentStage:
        return IncidentStage(DetectorBank.from_names(small_topology, []).processors)

    def frame(seq: int, now: float) -> FindingsMessage:
        (report,) = decode_findings(encode_findings([PieceReport(PieceInfo("a", seq, 0, 1, 0.0), now, 1, [])], 0, 0))
        return report

    def run(s: IncidentStage, seqs: range) -> list[str]:
        return [finding_to_json(f) for q in seqs for f in s.observe(frame(q, 10.0 * q))]

    event = ExternalEvent("node1", 100.0, "fan_failure", "critical")
    original = stage()
    assert original.add_external([event], offset=0)
    assert not original.add_external([event], offset=0)  # the same record again: not taken twice
    assert run(original, range(1, 6)) == []  # telemetry time (50 s) has not reached the event yet
    offset, blob = original.checkpoint()
    restored = stage()
    restored.load(blob)
    assert restored.external_offset == 0
    assert not restored.add_external([event], offset=0)  # redelivered after the restart: skipped
    out = run(original, range(6, 40))
    assert out and {(json.loads(f)["root_kind"], json.loads(f)["root_entity"]) for f in out} == {("node", "node1")}
    assert run(restored, range(6, 40)) == out
    control = stage()  # without the event nothing is grouped: the incidents above are its
    assert run(control, range(1, 40)) == []


@pytest.mark.kafka
@pytest.mark.slow
def test_external_events_topic_is_grouped_into_incidents(kafka_settings, tmp_path, workers):
    """An outside producer writes to external.events while a worker is up, then a replay runs:
    the incidents topic shows an incident grouping the event; a bad line is dead-lettered.
    (The stage reads external.events as findings messages arrive. Written while the replay ran,
    the record could land after a 600-s replay's last findings message, and nothing read it; the
    first fresh-clone `make test` of one stop failed so. A live pipeline's findings never stop.)"""
    from foreshock.recording import Recording
    from foreshock.simulator import ClusterSimulator

    rec = tmp_path / "healthy"
    ClusterSimulator(gpus=16, scenario="healthy", seed=1, duration=600).record(rec)
    start = min(float(f.ts.min()) for f in Recording.open(rec).iter_frames() if len(f))
    topics = ensure_topics(kafka_settings, Topics(namespace(), 1))
    assert topics.external == topics.namespace + "external.events"
    group = workers(kafka_settings.bootstrap, topics, "g-" + topics.namespace)
    group.start(rec / "topology.yaml")
    wait_for_members(kafka_settings, group.group, 1)

    def produce_external() -> None:
        producer = KafkaProducer(**kafka_settings.kafka_python())
        producer.send(topics.external, partition=0, value=external_line("node1", start + 120.0) + b"{garbage\n")
        producer.flush()
        producer.close()

    produce_external()
    run_and_collect(kafka_settings, topics, rec, speed=None)
    found = [json.loads(r.value) for r in read_incidents(kafka_settings, topics.incidents, 1)]
    assert found, group.logs()
    assert {(i["root_kind"], i["root_entity"]) for i in found} == {("node", "node1")}
    assert "fan_failure" in found[0]["reason"] and found[0]["ts"] >= start + 120.0
    dead = read_topic(kafka_settings, topics.deadletter, None, timeout_s=5)
    assert [(r.value, headers_dict(r.headers)["foreshock-stage"]) for r in dead] == [(b"{garbage", b"external")]
    assert headers_dict(dead[0].headers)["foreshock-source"].decode() == f"{topics.external}/0/0"
