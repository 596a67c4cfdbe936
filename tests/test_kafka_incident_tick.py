"""The incident stage at the worker's periodic tick (``ForeshockWorker.checkpoint_due``) when no
findings come: frames it runs or gives up on there, with no record of their own to acknowledge.

- Until 2026-12-05 the tick ran the frames overdue behind a lost piece and published their
  incidents, but wrote no incident checkpoint: the one before still held those frames while their
  findings records were acknowledged, so a restart from it ran them again (their incidents
  published twice, ``frame_incomplete`` counted twice). Now the tick that ran anything writes the
  checkpoint at once, after the incidents are confirmed sent (as the detection side, for held
  pieces: ``test_kafka_held_expiry``).
- A sender killed mid-frame (its last frame's pieces came in part, and no later frame ever comes)
  had that frame wait for the sender's retirement (hours), then dropped uncounted as run: its
  findings never reached the processors. Now it is run with the pieces it has once its sender was
  silent twice the frame wait (the detection stage holds the rest of a partition's share up to
  the wait before it sends it anyway), counted ``frame_incomplete``: silent while this stage's
  input flowed (records of other senders read that long after its last; an agent restarted is a
  new sender). Silence alone was taken at first, and a stall of the stage's own input (broker away)
  ran a live sender's frame short, then dropped the rest of it, read afterwards, as ``late_piece``.

No broker: the worker's topics and streams are ``test_kafka_poison_records``' stand-ins.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from foreshock.findings import Anomaly, Incident
from foreshock.streams.kafka_codec import PieceInfo, PieceReport, decode_findings, encode_findings
from foreshock.streams.kafka_worker import FindingsMessage, IncidentStage
from foreshock.topology import Topology

import test_kafka_poison_records as support
from kafka_frame_log import FrameLog

WAIT_S = 60.0  # the incident stage's frame_wait_s here (FRAME_WAIT_S in a worker)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now



def _message(agent: str, seq: int, part: int, parts: int, now: float) -> bytes:
    """A findings message of one piece: ``agent``'s frame ``seq``, piece ``part`` of ``parts``,
    stamped ``now``, with one anomaly."""
    return encode_findings([PieceReport(PieceInfo(agent, seq, part, parts, 0.0), now, 1,
                                        [Anomaly(now, "gpu", part, "gpu_temp", 9.0, "d")])], 0, 0)


def _piece(agent: str, seq: int, part: int, parts: int, now: float) -> FindingsMessage:
    (report,) = decode_findings(_message(agent, seq, part, parts, now))
    return report


def _worker(topology: Topology, clock: Clock, checkpoint: bytes | None = None) -> tuple[Any, list[Any], list[int]]:
    """A worker whose incident stage runs :class:`FrameLog` on ``clock``, loading ``checkpoint``."""
    worker, sent, exits = support._worker(topology)
    worker.incident_stage = IncidentStage([FrameLog(id_by_time=True)], worker.health, topology, clock=clock, frame_wait_s=WAIT_S)

    async def nothing(*args: Any) -> None:
        return None

    async def latest(partition: int) -> bytes | None:
        return checkpoint

    worker.poll_external = nothing  # no external.events to read
    worker.end_offset = nothing  # no broker to ask
    worker.read_checkpoint = latest
    return worker, sent, exits


def _feed(worker: Any, stream: Any, messages: list[tuple[int, bytes]], force: bool | None = None) -> None:
    """The findings records ``messages`` (offset, value), then (``force`` not None) the worker's
    tick, in one event loop: what they sent is confirmed by the tick's checkpoint."""
    async def run() -> None:
        for offset, value in messages:
            await worker.handle(worker.on_findings, stream, support._event(support.FINDINGS_TOPIC, offset, value, []))
        if force is not None:
            await worker.checkpoint_due(force=force)

    asyncio.run(run())


def _incidents(sent: list[Any]) -> list[float]:
    """The times of the incidents published (one per frame run: its frame's time)."""
    return [json.loads(value)["ts"] for name, value, _ in sent if name == "incidents_topic"]


def _checkpoints(sent: list[Any]) -> list[bytes]:
    return [value for name, value, _ in sent if name == "checkpoint_topic"]


def _written_after_the_incidents(sent: list[Any]) -> bool:
    """The last checkpoint was written after the last incident (its delivery confirmed first)."""
    names = [name for name, _, _ in sent][::-1]
    return names.index("checkpoint_topic") < names.index("incidents_topic")


def _restart_from(blob: bytes, topology: Topology, clock: Clock) -> tuple[Any, list[Any], list[int]]:
    """A worker restarted from ``blob`` that reads a new sender's record (b#1 frame 1, time 200,
    complete) and, past the wait, checkpoints."""
    restarted, sent, exits = _worker(topology, clock, blob)
    stream = support._Stream()
    clock.now += 2 * WAIT_S  # its records at once after the checkpoint: the wait passes, then the tick
    _feed(restarted, stream, [(9, _message("b#1", 1, 0, 1, 200.0))], force=True)
    assert exits == [] and stream.acked == [9]
    return restarted, sent, exits


def test_the_tick_that_runs_overdue_frames_writes_the_incident_checkpoint(tmp_path: Path, monkeypatch,
                                                                          small_topology: Topology) -> None:
    """Sender a#1's frame 1 lost a piece; its frame 2 waits behind it. A checkpoint holds both and
    acknowledges their records; then a#1 is killed, and the tick past the wait runs them."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    clock = Clock()
    worker, sent, exits = _worker(small_topology, clock)
    stream = support._Stream()
    _feed(worker, stream, [(0, _message("a#1", 1, 0, 2, 100.0)), (1, _message("a#1", 2, 0, 1, 101.0))], force=True)
    assert stream.acked == [0, 1] and len(_checkpoints(sent)) == 1 and _incidents(sent) == []
    assert set(worker.incident_stage.pending) == {("a#1", 1), ("a#1", 2)}

    clock.now += WAIT_S
    asyncio.run(worker.checkpoint_due())  # not forced: the interval (an hour here) has not passed
    assert exits == []
    assert _incidents(sent) == [100.0, 101.0]  # frame 1 run with the piece it has, then frame 2
    assert worker.health.problems[("incidents", "frame_incomplete")] == 1

    # a restart from the latest checkpoint written does not run a#1's frames again (until
    # 2026-12-05 the latest was the one that held them: [200.0, 100.0, 101.0], counted again)
    restarted, sent2, _ = _restart_from(_checkpoints(sent)[-1], small_topology, clock)
    assert _incidents(sent2) == [200.0]  # b#1's frame only
    assert ("incidents", "frame_incomplete") not in restarted.health.problems
    assert restarted.incident_stage.released["a#1"] == 2
    restarted.remove_data_dir()

    # the tick wrote it without them, after their incidents (_confirm_sent)
    assert len(_checkpoints(sent)) == 2 and _written_after_the_incidents(sent)
    assert not worker.incidents_unwritten
    asyncio.run(worker.checkpoint_due())  # a tick that runs nothing writes nothing
    assert len(_checkpoints(sent)) == 2
    worker.remove_data_dir()


def test_a_refused_tick_checkpoint_is_tried_again_at_the_interval(tmp_path: Path, monkeypatch,
                                                                   small_topology: Topology) -> None:
    """The checkpoint the tick writes refused as too large (counted, not fatal: as any incident
    checkpoint) is tried again at the next interval, though no record comes."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    from aiokafka.errors import MessageSizeTooLargeError

    refuse = [False]

    class Refusing(support._Topic):
        async def send(self, key: Any = None, value: bytes = b"", partition: Any = None, headers: Any = None,
                       force: bool = False) -> Any:
            if refuse[0]:
                raise MessageSizeTooLargeError(f"{len(value)} bytes")
            return await super().send(key, value, partition, headers, force)

    clock = Clock()
    worker, sent, exits = _worker(small_topology, clock)
    worker.checkpoint_topic = Refusing("checkpoint_topic", sent)
    _feed(worker, support._Stream(), [(0, _message("a#1", 1, 0, 2, 100.0)), (1, _message("a#1", 2, 0, 1, 101.0))],
          force=True)
    refuse[0] = True
    clock.now += WAIT_S
    asyncio.run(worker.checkpoint_due())
    assert exits == [] and _incidents(sent) == [100.0, 101.0] and len(_checkpoints(sent)) == 1
    assert worker.health.problems[("worker", "checkpoint_too_large")] == 1 and worker.incidents_unwritten
    refuse[0] = False
    asyncio.run(worker.checkpoint_due())  # within the interval: not yet
    assert len(_checkpoints(sent)) == 1
    worker.last_incident_checkpoint -= worker.config.checkpoint_interval_s
    asyncio.run(worker.checkpoint_due())
    assert len(_checkpoints(sent)) == 2 and not worker.incidents_unwritten
    worker.remove_data_dir()


def test_a_sender_killed_mid_frame_has_its_last_frame_run_at_the_tick(tmp_path: Path, monkeypatch,
                                                                      small_topology: Topology) -> None:
    """a#1's frame 2 came in part (1 of 2 pieces) and no later frame of a#1 ever comes; the agent
    restarts as a new sender, a#2. Until 2026-12-05 the frame waited for a#1's retirement (hours),
    then was dropped: its findings never ran. Now the tick runs it once a#1 was silent twice the
    wait while other senders' records were read (a#2's), and writes the checkpoint."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    clock = Clock()
    worker, sent, exits = _worker(small_topology, clock)
    stream = support._Stream()
    _feed(worker, stream, [(0, _message("a#1", 1, 0, 1, 100.0)), (1, _message("a#1", 2, 0, 2, 101.0))], force=True)
    assert _incidents(sent) == [100.0] and stream.acked == [0, 1] and len(_checkpoints(sent)) == 1

    # after one wait: not yet (the detection stage may still send the rest it held for a#1's share)
    clock.now += WAIT_S + 10
    asyncio.run(worker.checkpoint_due())
    assert _incidents(sent) == [100.0] and len(_checkpoints(sent)) == 1
    clock.now += WAIT_S
    asyncio.run(worker.checkpoint_due())  # silent long enough, but nothing else was read since
    assert _incidents(sent) == [100.0] and len(_checkpoints(sent)) == 1
    _feed(worker, stream, [(2, _message("a#2", 1, 0, 1, 150.0))], force=False)  # a#1 restarted; the tick
    assert exits == []
    assert _incidents(sent) == [100.0, 150.0, 101.0]  # a#1's frame 2 run with the piece it has
    assert worker.health.problems[("incidents", "frame_incomplete")] == 1
    assert not worker.incident_stage.pending
    assert len(_checkpoints(sent)) == 2 and _written_after_the_incidents(sent)
    worker.remove_data_dir()

    restarted, sent2, _ = _restart_from(_checkpoints(sent)[-1], small_topology, clock)
    assert _incidents(sent2) == [200.0]
    assert ("incidents", "frame_incomplete") not in restarted.health.problems
    restarted.remove_data_dir()


def test_a_silent_senders_frame_waits_for_the_rest_the_detection_stage_held() -> None:
    """The rest of a partition's share the detection stage held (foreshock-continues) comes a
    wait after the sender's last record (held_abandoned): still joined, not given up on. A stage
    loaded from a checkpoint counts the silence from its load (the records after the checkpoint,
    read again, may bring the rest), then runs the frame once another sender's records are read
    that long after; a piece after that is counted late."""
    clock = Clock()
    log = FrameLog(id_by_time=True)
    stage = IncidentStage([log], clock=clock, frame_wait_s=WAIT_S)
    stage.observe(_piece("a#1", 1, 0, 2, 100.0))
    clock.now += WAIT_S + 5  # the detection stage's held wait and its tick
    assert stage.release_overdue() == []
    assert len(stage.observe(_piece("a#1", 1, 1, 2, 100.0))) == 1  # the held rest: the frame whole
    assert not stage.health.problems

    stage.observe(_piece("a#1", 2, 0, 2, 101.0))  # then a#1 is killed
    blob = stage.checkpoint()[1]
    clock.now += 10 * WAIT_S  # a worker down a while
    loaded = IncidentStage([FrameLog(id_by_time=True)], clock=clock, frame_wait_s=WAIT_S)
    loaded.load(blob)
    assert loaded.release_overdue() == [] and ("a#1", 2) in loaded.pending
    clock.now += 2 * WAIT_S
    assert loaded.release_overdue() == []  # nothing read since the load: the input may be stalled
    assert len(loaded.observe(_piece("b#1", 1, 0, 1, 200.0))) == 1
    (incident,) = loaded.release_overdue()
    assert isinstance(incident, Incident) and incident.ts == 101.0
    assert loaded.health.problems[("incidents", "frame_incomplete")] == 1 and not loaded.pending
    assert loaded.observe(_piece("a#1", 2, 1, 2, 101.0)) == []
    assert loaded.health.problems[("incidents", "late_piece")] == 1


def test_a_stalled_input_gives_no_live_senders_frame_up() -> None:
    """The stage's own findings input stalls (broker away, consumer blocked) for over twice the
    wait after piece 0 of a#1's frame 5 and of b#1's frame 3 were read; both senders are alive and
    the rest of their frames is in the topic all along. The tick runs nothing during the stall
    (until 2026-12-05's fix of it each frame ran with 1 of its 2 pieces, and the rest, read when
    fetches resumed, was dropped as ``late_piece``); afterwards each runs whole, nothing counted.
    A sender that is truly gone with no other sender anywhere waits so too (for its retirement)."""
    clock = Clock()
    log = FrameLog(id_by_time=True)
    stage = IncidentStage([log], clock=clock, frame_wait_s=WAIT_S)
    for seq in range(1, 5):  # a#1 polls every 10 s; b#1 started later
        stage.observe(_piece("a#1", seq, 0, 2, 100.0 + 10 * seq))
        stage.observe(_piece("a#1", seq, 1, 2, 100.0 + 10 * seq))
        if seq > 2:
            stage.observe(_piece("b#1", seq - 2, 0, 2, 300.0 + seq))
            stage.observe(_piece("b#1", seq - 2, 1, 2, 300.0 + seq))
        clock.now += 10
    stage.observe(_piece("a#1", 5, 0, 2, 150.0))
    stage.observe(_piece("b#1", 3, 0, 2, 305.0))
    assert len(log.seen) == 6
    for _ in range(42):  # seven waits of ticks every 10 s, no record read
        clock.now += 10
        assert stage.release_overdue() == []
    assert set(stage.pending) == {("a#1", 5), ("b#1", 3)} and not stage.health.problems

    # fetches resume: the rest of each frame, then the next ones
    (a5,) = stage.observe(_piece("a#1", 5, 1, 2, 150.0))
    (b3,) = stage.observe(_piece("b#1", 3, 1, 2, 305.0))
    assert isinstance(a5, Incident) and a5.ts == 150.0 and isinstance(b3, Incident) and b3.ts == 305.0
    stage.observe(_piece("a#1", 6, 0, 2, 160.0))
    assert len(stage.observe(_piece("a#1", 6, 1, 2, 160.0))) == 1
    assert log.seen[6:] == [(150.0, 2), (305.0, 2), (160.0, 2)]  # whole: both pieces' findings
    assert not stage.health.problems and not stage.pending
