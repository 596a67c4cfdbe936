"""Review r86, second part (R4, R5, R7.1): the incident stage's take-up of running senders, the
checkpoints of a deleted and re-created topic, and the count of a wholly unreadable record. No
broker needed: the stages are driven directly, as the faust worker drives them."""

from __future__ import annotations

from typing import Any

import numpy as np

from foreshock.detectors.bank import DetectorBank
from foreshock.findings import Anomaly
from foreshock.frames import Frame
from foreshock.streams.kafka_codec import PieceInfo, PieceReport, decode_findings, encode_bundle, encode_findings, \
    headers_dict
from foreshock.streams.kafka_worker import DetectionStage, FindingsMessage, IncidentStage
from foreshock.topology import Topology

from kafka_frame_log import FrameLog

START = 1_800_000_000.0



def piece(agent: str, seq: int, part: int, parts: int = 2) -> FindingsMessage:
    """Piece ``part`` of ``agent``'s frame ``seq``: its time is ``seq``, with one anomaly."""
    (report,) = decode_findings(encode_findings([PieceReport(PieceInfo(agent, seq, part, parts, 0.0), float(seq), 1,
                                                             [Anomaly(float(seq), "gpu", part, "gpu_temp", 9.0, "d")])],
                                                part, 0))
    return report


def running_sender(name: str, now: float) -> str:
    """A sender that started a minute before ``now`` (before a stage made then: taken up, not new)."""
    return f"{name}#{int((now - 60) * 1000)}"


def test_a_fresh_stage_takes_a_running_sender_up_at_its_lowest_frame_not_its_first_piece():
    """R4: one frame's pieces come from several detect partitions, interleaved. A stage without a
    checkpoint took a running sender up at the first piece it saw: partition 1's report of frame 5
    came before frame 4's, and frame 4 (complete) was dropped as a repeat, silently. Now a piece of
    an earlier frame, while none has run, moves the take-up point down; one that comes after frames
    ran is counted (late_piece), never a silent repeat."""
    now = [START]
    log = FrameLog()
    stage = IncidentStage([log], clock=lambda: now[0], frame_wait_s=180.0)
    agent = running_sender("node1", now[0])
    for seq, part in [(5, 1), (4, 1), (4, 0), (5, 0), (6, 1), (6, 0)]:
        stage.observe(piece(agent, seq, part))
    now[0] += 1000
    stage.release_overdue()
    assert log.seen == [(4.0, 2), (5.0, 2), (6.0, 2)]
    assert stage.duplicates == 0 and not stage.health.problems
    # an earlier frame's piece after frames ran: counted, its findings left out
    stage.observe(piece(agent, 3, 0))
    assert stage.health.problems[("incidents", "late_piece")] == 1 and stage.duplicates == 0
    # a real repeat of a frame run is still a repeat
    stage.observe(piece(agent, 5, 0))
    assert stage.duplicates == 1 and stage.health.problems[("incidents", "late_piece")] == 1

    # a sender whose first frame seen ran at once (one piece): an earlier one is counted, across
    # a restart from the checkpoint too
    other = running_sender("node2", START)
    assert len(stage.observe(piece(other, 10, 0, 1))) == 1
    _, blob = stage.checkpoint()
    restored = IncidentStage([FrameLog()], clock=lambda: now[0], frame_wait_s=180.0)
    restored.load(blob)
    restored.observe(piece(other, 9, 0, 1))
    assert restored.health.problems[("incidents", "late_piece")] == 1 and restored.duplicates == 0

    # past the grace window the take-up point no longer moves: the earlier piece is counted
    late = running_sender("node3", START)
    assert stage.observe(piece(late, 20, 1)) == []
    now[0] += 181
    stage.observe(piece(late, 19, 1))
    assert stage.health.problems[("incidents", "late_piece")] == 2


def _gpu_record(topology: Topology, seq: int) -> tuple[bytes, Any]:
    n = topology.size("gpu")
    frame = Frame("gpu", np.full(n, 1.7e9 + seq), np.arange(n), {"gpu_temp": np.full(n, 50.0)})
    return encode_bundle("a#1", 0.0, [(seq, 0, 1, frame)], topology=topology)


def _detection(topology: Topology) -> DetectionStage:
    return DetectionStage(topology, lambda hw: DetectorBank.from_names(hw, ["robust_zscore"]), 1,
                          max_ahead_s=float("inf"))


def test_a_checkpoint_ahead_of_its_re_created_topic_is_counted_and_the_partition_starts_fresh(
        small_topology: Topology):
    """R5: telemetry.frames deleted and re-created; the compacted checkpoints topic keeps offset
    1000. Every record of the new topic (offsets 0, 1, ...) was skipped as already processed, with
    nothing counted or logged: detection off until offset 1001. The end offset the worker reads at
    assignment now tells: counted, and the partition starts fresh."""
    topo = small_topology
    old = _detection(topo)
    old.load(0, None)
    old.parts[0].offset = 1000
    _, blob = old.checkpoint(0)

    recreated = _detection(topo)
    assert recreated.load(0, blob, end_offset=0) == -1
    assert recreated.health.problems[("worker", "checkpoint_ahead_of_topic")] == 1
    results = [recreated.process(0, off, *_gpu_record(topo, off + 1)) for off in range(5)]
    assert not any(r.skipped for r in results) and all(r.findings_message for r in results)

    same = _detection(topo)  # the same topic, its end past the checkpoint: resumed, the repeat skipped
    assert same.load(0, blob, end_offset=1001) == 1000
    assert same.process(0, 1000, *_gpu_record(topo, 1)).skipped
    assert not same.process(0, 1001, *_gpu_record(topo, 2)).skipped
    assert not same.health.problems


def test_without_the_end_offset_skips_below_the_checkpoint_s_own_range_are_counted(small_topology: Topology):
    """R5, where the end offset is not known: a record is redelivered from the offset committed
    after the checkpoint before the loaded one, so one skipped at or below that checkpoint's offset
    is counted (the topic was probably re-created); the usual repeats are not."""
    topo = small_topology
    stage = _detection(topo)
    stage.load(0, None)
    for off in range(10):
        stage.process(0, off, *_gpu_record(topo, off + 1))
        if off in (4, 9):
            offset, _ = stage.checkpoint(0)
            stage.mark_checkpointed(0, offset)
    _, blob = stage.checkpoint(0)  # written again at 9 (a revocation): still after the one at 4

    restarted = _detection(topo)
    assert restarted.load(0, blob) == 9
    assert all(restarted.process(0, off, *_gpu_record(topo, off + 1)).skipped for off in (5, 9))
    assert not restarted.health.problems  # redelivered since the commit after checkpoint 4
    assert restarted.process(0, 2, *_gpu_record(topo, 3)).skipped
    assert restarted.health.problems[("worker", "skipped_below_checkpoint")] == 1


def test_the_incident_stage_notices_a_re_created_findings_topic():
    """R5 for the incident stage (foreshock.findings re-created): counted and started fresh with
    the end offset; without it, a skip below the checkpoint's own range is counted."""
    now = [START]
    stage = IncidentStage([FrameLog()], clock=lambda: now[0])
    stage.offset = 1000
    _, blob = stage.checkpoint()

    recreated = IncidentStage([FrameLog()], clock=lambda: now[0])
    assert recreated.load(blob, end_offset=3) == -1 and recreated.offset == -1
    assert recreated.health.problems[("worker", "checkpoint_ahead_of_topic")] == 1
    assert not recreated.covered(0)

    resumed = IncidentStage([FrameLog()], clock=lambda: now[0])
    assert resumed.load(blob, end_offset=1001) == 1000 and resumed.covered(1000) and not resumed.covered(1001)
    assert not resumed.health.problems

    resumed.offset = 1200
    _, second = resumed.checkpoint()
    guessed = IncidentStage([FrameLog()], clock=lambda: now[0])
    assert guessed.load(second) == 1200
    assert guessed.covered(1100) and not guessed.health.problems  # a repeat since checkpoint 1000
    assert guessed.covered(7)
    assert guessed.health.problems[("worker", "skipped_below_checkpoint")] == 1


def test_a_wholly_unreadable_record_is_one_problem_not_one_per_piece(small_topology: Topology):
    """R7.1: a 200-piece record of another schema gave one dead letter but 200 counted problems."""
    topo = small_topology
    stage = DetectionStage(topo, lambda hw: DetectorBank.from_names(hw, ["robust_zscore"]), 1)
    stage.load(0, None)
    n = topo.size("gpu")
    entries = [(s, 0, 1, Frame("gpu", np.full(n, 1.7e9 + s), np.arange(n), {"gpu_temp": np.full(n, 50.0)}))
               for s in range(1, 201)]
    value, headers = encode_bundle("a#1", 0.0, entries, topology=topo)
    wrong = headers_dict(headers)
    wrong["foreshock-schema"] = b"arrow-ipc/2"
    result = stage.process(0, 1, value, list(wrong.items()))
    assert len(result.dead_letters) == 1
    assert dict(stage.health.problems) == {("worker", "wrong_schema"): 1}
    assert result.findings_message is not None
    assert len(decode_findings(result.findings_message)) == 200  # every piece still reported (empty)
