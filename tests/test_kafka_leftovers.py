"""Two Kafka leftovers, without a broker: the stages and the worker are driven directly.

- An incident stage without a checkpoint (the first, ``checkpoint_unusable``,
  ``checkpoint_ahead_of_topic``) reads external.events from its start: the events dated well
  before its first telemetry are history, skipped and counted once, not queued again (a backlog
  past the engine's queue pushed the new events out; an old event read late joined a new
  incident on its node).
- The telemetry forwarded to the incident stage stays within the findings topic's message size:
  a record crafted up to the decode bound, every field forwarded, made one message the topic
  refused, and the worker ended (its restart met the same record).
"""

from __future__ import annotations

import asyncio
import pickle
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from test_kafka_poison_records import TOPICS, _event, _Stream, _Topic, _worker
from test_kafka_review_r86a import _quiet, _SizedTopic

from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.incident_external import ExternalEvent
from foreshock.detectors.incidents import IncidentEngine
from foreshock.fields import field_names, get_field
from foreshock.findings import Incident, finding_to_json
from foreshock.frames import Frame
from foreshock.streams.kafka_codec import (FINDINGS_MAX_BYTES, MAX_DECODED_BYTES, PartitionMap, PieceInfo, PieceReport,
                                           decode_bundle, decode_findings, encode_bundle, encode_findings,
                                           encode_telemetry, headers_dict, is_telemetry, row_bytes)
from foreshock.streams.kafka_worker import CHECKPOINT_VERSION, DetectionStage, FindingsMessage, IncidentStage
from foreshock.topology import Topology

START = 1_800_000_000.0


# ---- external.events read by a stage without a checkpoint -----------------------------------------
def _frame(seq: int, now: float) -> FindingsMessage:
    (report,) = decode_findings(encode_findings([PieceReport(PieceInfo("a", seq, 0, 1, 0.0), now, 1, [])], 0, 0))
    return report


def _run(stage: IncidentStage, seqs: range) -> list[Incident]:
    return [f for q in seqs for f in stage.observe(_frame(q, START + 10.0 * (q - 1))) if isinstance(f, Incident)]


def _event_at(node: str, t: float, typ: str) -> ExternalEvent:
    return ExternalEvent(node, t, typ, "critical")


def test_a_fresh_stage_skips_the_external_history_and_keeps_the_news(small_topology: Topology) -> None:
    """A day of old events ahead of a new one on the topic: all were queued before the first
    findings, the queue filled with the old ones (each then refused as too old, one problem
    apiece) and the new event was dropped. Now the old ones are one counted skip, the new event
    opens its incident, and a checkpoint taken before any telemetry keeps what waits."""
    stage = IncidentStage([IncidentEngine(small_topology, max_external_queue=10)])
    for offset in range(30):  # a day ago
        assert stage.add_external([_event_at("node1", START - 86_400 + offset, "fan_failure")], offset)
    assert stage.add_external([_event_at("node3", START + 60, "psu_failure")], 30)
    # restarted before any telemetry came: the events taken wait in the checkpoint, undated
    _, blob = stage.checkpoint()
    restored = IncidentStage([IncidentEngine(small_topology, max_external_queue=10)])
    assert restored.load(blob) == -1 and restored.external_offset == 30
    for s in (stage, restored):
        found = _run(s, range(1, 40))
        assert found and {(i.root_kind, i.root_entity) for i in found} == {("node", "node3")}
        assert "psu_failure" in found[0].reason
        problems = dict(s.health.problems)
        assert problems == {("incidents", "external_history"): 30}, problems
    assert [finding_to_json(f) for f in _run(restored, range(40, 60))] == \
        [finding_to_json(f) for f in _run(stage, range(40, 60))]


def test_an_old_event_read_late_does_not_join_the_new_incident_on_its_node(small_topology: Topology) -> None:
    """The backlog is read over several polls: an event of two hours ago on a node whose new
    incident (of the same cause) was open by then joined it, as if it had just happened. Events
    dated within the engine's window before the first telemetry are news, as is anything later."""
    engine = IncidentEngine(small_topology)
    stage = IncidentStage([engine])
    stage.add_external([_event_at("node1", START + 5, "psu_failure")], 0)
    opened = _run(stage, range(1, 20))
    assert opened and {i.root_entity for i in opened} == {"node1"}
    stage.add_external([_event_at("node1", START - 7200, "psu_failure"),  # history
                        _event_at("node2", START - 0.5 * engine.quiet_s, "nic_failure")], 1)  # news
    later = _run(stage, range(20, 80))
    assert {i.root_entity for i in later} == {"node1", "node2"}
    assert [i.findings for i in opened + later if i.root_entity == "node1"] == [1, 1]
    assert dict(stage.health.problems) == {("incidents", "external_history"): 1}
    assert engine.stats["external"] == 2 and stage.external_news_s == engine.quiet_s


def test_a_stage_loaded_from_its_checkpoint_keeps_its_date_and_one_written_before_takes_everything(
        small_topology: Topology) -> None:
    """After a restart from the checkpoint the stage reads on from its offset and keeps its
    date; a checkpoint written before stages dated their events took every event, and still
    does (its reader was positioned past what it had taken)."""
    stage = IncidentStage([IncidentEngine(small_topology)])
    _run(stage, range(1, 3))
    assert stage.external_since == START - stage.external_news_s
    _, blob = stage.checkpoint()
    restored = IncidentStage([IncidentEngine(small_topology)])
    restored.load(blob)
    assert restored.external_since == stage.external_since
    restored.add_external([_event_at("node1", START - 7200, "fan_failure")], 0)
    assert restored.health.problems[("incidents", "external_history")] == 1

    state = stage.state()
    del state["external_since"], state["external_held"]
    old_blob = zlib.compress(pickle.dumps({"version": CHECKPOINT_VERSION, "kind": "incidents",
                                           "signature": stage.signature, "offset": 5, "state": state}))
    old = IncidentStage([IncidentEngine(small_topology)])
    assert old.load(old_blob) == 5
    old.add_external([_event_at("node1", START - 7200, "fan_failure")], 0)
    assert not old.health.problems and old.external_held == []


# ---- forwarded telemetry within the findings topic's message size ---------------------------------
class EveryField:
    """An incident processor reading frames without declaring its fields: every field of every
    kind is forwarded."""

    name = "every_field"

    def __init__(self) -> None:
        self.rows = 0

    def observe(self, findings: Any, now: float) -> list[Any]:
        return []

    def observe_frame(self, frame: Frame) -> None:
        self.rows += len(frame)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = int(state["rows"])


def _bank(hardware: Topology) -> DetectorBank:
    return DetectorBank.from_names(hardware, [], processors=[EveryField()])


def _noise_pieces(topology: Topology, rows: int, pieces: int, after: float = 0.0) -> list[tuple[int, int, int, Frame]]:
    """``pieces`` frames of ``rows`` GPU rows between them, every field random (lz4 keeps them
    as large), each GPU's stamps rising by 100 ms (the fastest a source samples: rows closer than
    ``MIN_SPACING_S`` the guard refuses); stamped a day ago (no clock is ahead of them), plus
    ``after`` seconds."""
    rng = np.random.default_rng(1)
    n = topology.size("gpu")
    per = rows // pieces
    out = []
    for seq in range(pieces):
        ticks = np.arange(seq * per, (seq + 1) * per)
        columns = {name: rng.uniform(0.0, 1.0, per) for name in field_names("gpu")}
        for name in field_names("gpu"):
            if get_field(name).whole:  # a code or bitmask: a fraction of one the guard sets to NaN
                top = min(get_field(name).valid[1], 2.0 ** 40 - 1)  # (random bits: lz4 keeps them as large)
                columns[name] = rng.integers(0, int(top) + 1, per).astype(np.float64)
        columns["board_id"] = np.full(per, np.nan)
        frame = Frame("gpu", START - 86_400 + after + ticks // n * 0.1, (ticks % n).astype(np.int32), columns)
        out.append((seq + 1, 0, 1, frame))
    return out


def _crafted(topology: Topology, pieces: int) -> tuple[bytes, Any, list[tuple[int, int, int, Frame]]]:
    """A record just under the decode bound (``MAX_DECODED_BYTES``), with everything random."""
    entries = _noise_pieces(topology, int(0.95 * MAX_DECODED_BYTES) // row_bytes("gpu"), pieces)
    value, headers = encode_bundle("crafted#1", 0.0, entries, "lz4", topology=topology)
    return value, headers, entries


def test_forwarded_telemetry_of_a_crafted_record_goes_in_messages_the_topic_takes(
        tmp_path: Path, monkeypatch, small_topology: Topology) -> None:
    """23 MB of random rows in 24 pieces, every field forwarded: one 23 MB message, refused by the
    findings topic; the checkpoint after it failed and the worker ended. Now several, each
    within the limit, every piece's rows forwarded once, in order, before the findings."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    from foreshock.streams.faust_app import ForeshockWorker, WorkerConfig
    from foreshock.streams.kafka_config import KafkaSettings
    from foreshock.streams.kafka_topics import Topics

    sent: list[Any] = []
    worker, _, exits = _worker(small_topology, 1, findings_topic=_SizedTopic("findings_topic", sent),
                               checkpoint_topic=_Topic("checkpoint_topic", sent))
    assert isinstance(worker, ForeshockWorker)
    worker.config = WorkerConfig(KafkaSettings("127.0.0.1:9"), Topics("t.", 1), small_topology, _bank)
    worker.detection = DetectionStage(small_topology, _bank, 1, worker.store, worker.health)
    _quiet(worker)
    value, headers, entries = _crafted(small_topology, 24)
    stream = _Stream()

    async def run() -> None:
        await worker.handle(worker.on_piece, stream, _event(TOPICS.frames, 0, value, headers))
        await worker.handle(lambda _s, _e: worker.checkpoint_partition(stream, 0), stream,
                            _event(TOPICS.frames, 0, b"", []))

    asyncio.run(run())
    assert exits == [] and worker.counts["checkpoints"] == 1 and stream.acked == [0]
    findings = [(v, h) for name, v, h in sent if name == "findings_topic"]
    telemetry = [(v, h) for v, h in findings if h and is_telemetry(h)]
    assert len(telemetry) >= 2 and findings[:len(telemetry)] == telemetry  # the rows first
    assert all(len(v) + sum(len(k) + len(x) for k, x in h) <= FINDINGS_MAX_BYTES for v, h in telemetry)
    pmap = PartitionMap(small_topology, 1)
    forwarded = [p for v, h in telemetry for p in decode_bundle(v, headers_dict(h), small_topology, pmap, None)]
    assert [p.info.seq for p in forwarded] == [seq for seq, *_ in entries]
    for piece, (_, _, _, frame) in zip(forwarded, entries):
        assert piece.frame is not None
        np.testing.assert_array_equal(piece.frame.columns["gpu_temp"], frame.columns["gpu_temp"])
    # nothing counted: random values, but codes and bitmasks whole numbers
    assert not worker.health.problems
    worker.remove_data_dir()


def test_a_piece_too_large_to_forward_alone_is_counted_and_its_frame_still_runs(small_topology: Topology) -> None:
    """One crafted piece whose rows alone pass the limit is not forwarded (counted); the others
    are, and the incident stage runs every frame, that one without its rows."""
    stage = DetectionStage(small_topology, _bank, 1)
    stage.load(0, None)
    big = _noise_pieces(small_topology, int(0.8 * MAX_DECODED_BYTES) // row_bytes("gpu"), 1)[0]
    small = [(seq + 1, 0, 1, f) for seq, (_, _, _, f) in enumerate(_noise_pieces(small_topology, 4000, 2, 3600.0), 1)]
    value, headers = encode_bundle("crafted#1", 0.0, [(1, 0, 1, big[3])] + small, "lz4", topology=small_topology)
    result = stage.process(0, 0, value, headers)
    assert stage.health.problems[("worker", "telemetry_too_large")] == 1
    (message,) = result.telemetry_messages

    incidents = IncidentStage([EveryField()])
    pmap = PartitionMap(small_topology, 1)
    for piece in decode_bundle(message[0], headers_dict(message[1]), small_topology, pmap, None):
        assert piece.frame is not None
        incidents.observe_telemetry(piece.info, piece.frame)
    assert result.findings_message is not None
    for report in decode_findings(result.findings_message):
        incidents.observe(report)
    (proc,) = incidents.processors
    assert isinstance(proc, EveryField) and proc.rows == sum(len(f) for _, _, _, f in small)
    assert incidents.released == {"crafted#1": 3}


def test_encode_telemetry_splits_between_pieces_in_order(small_topology: Topology) -> None:
    frames = [(seq, 0, 1, Frame("gpu", np.arange(500, dtype=float) + seq, np.zeros(500, np.int32),
                                {"gpu_temp": np.random.default_rng(seq).uniform(0, 99, 500)}))
              for seq in range(1, 9)]
    fields = {"gpu": ("gpu_temp",)}

    def size(message: tuple[bytes, Any]) -> int:
        return len(message[0]) + sum(len(k) + len(v) for k, v in message[1])

    (whole,), left = encode_telemetry("a#1", 0.0, frames, fields)
    assert left == [] and is_telemetry(whole[1])
    (three,), _ = encode_telemetry("a#1", 0.0, frames[:3], fields)
    parts, left = encode_telemetry("a#1", 0.0, frames, fields, max_bytes=size(three))
    assert left == [] and len(parts) >= 3 and all(size(m) <= size(three) and is_telemetry(m[1]) for m in parts)
    pmap = PartitionMap(small_topology, 1)
    assert [p.info.seq for v, h in parts for p in decode_bundle(v, headers_dict(h), small_topology, pmap, None)] == \
        list(range(1, 9))
    # a piece alone past the bound is left out, the others still go
    parts, left = encode_telemetry("a#1", 0.0, frames[:1] + [(9, 0, 1, Frame.concat([f for *_, f in frames]))],
                                   fields, max_bytes=size(three))
    assert [seq for seq, *_ in left] == [9] and len(parts) == 1
