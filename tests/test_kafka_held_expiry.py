"""Pieces a detection stage holds for the rest of their frame's share (``foreshock-continues``)
when the rest never comes: the agent was killed before it sent it, the broker was away at its
stop, or it restarted as a new sender. Until 2026-12-05 they were held for good: their rows never
reached the detectors, nothing counted them, every checkpoint pickled them again, and a restart on
changed hardware dropped them uncounted. Now, past the wait, they run as they are (counted
``worker/held_abandoned``), and those a checkpoint of other hardware brought are counted and
dead-lettered (``worker/held_dropped``). A continuation that comes in time still joins them.

No broker: the stages are fed directly, the worker's topics are ``test_kafka_poison_records``'
stand-ins.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from foreshock.findings import Anomaly
from foreshock.frames import Frame
from foreshock.streams.kafka_codec import decode_bundle, decode_findings, encode_bundle, headers_dict
from foreshock.streams.kafka_worker import DetectionStage
from foreshock.topology import Topology

import test_kafka_audit2 as audit2
import test_kafka_poison_records as support

WAIT_S = 60.0  # the stages' held_wait_s here (FRAME_WAIT_S in a worker)
GPUS = 32  # the small topology's GPUs: one frame's share of the single partition


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _stage(topology: Topology, clock: Clock) -> DetectionStage:
    stage = DetectionStage(topology, audit2._rows_seen, 1, clock=clock, held_wait_s=WAIT_S)
    stage.load(0, None)
    return stage


def _records(topology: Topology) -> list[tuple[int, bytes, Any]]:
    """Agent a#1's frame 1 in 7 pieces of 5 rows (the last 2), 2 to a bundle: the first two
    bundles marked as continued, the third ending the frame."""
    records = audit2._agent_records(topology, audit2._gpu_frames(topology, 1), 1, 5, 12)
    assert [headers_dict(h).get("foreshock-continues") for _, _, h in records] == [b"1", b"1", None]
    return records


def _held(topology: Topology) -> tuple[Clock, DetectionStage, list[tuple[int, bytes, Any]]]:
    """A stage that has read agent a#1's first two bundles (continued: every piece held), its clock,
    and a#1's records (the third brings the rest)."""
    clock = Clock()
    stage = _stage(topology, clock)
    records = _records(topology)
    for offset, (_, value, headers) in enumerate(records[:2]):
        assert stage.process(0, offset, value, headers).rows == 0
    return clock, stage, records


def _other_sender(topology: Topology, ts: float = 500.0) -> tuple[bytes, Any]:
    """A record of another sender (b#1): every GPU, one piece."""
    frame = Frame("gpu", np.full(GPUS, ts), np.arange(GPUS, dtype=np.int32), {"gpu_temp": np.full(GPUS, 50.0)})
    return encode_bundle("b#1", 0.0, [(1, 0, 1, frame)], topology=topology)


def _rows_seen(result: Any, agent_ts: float) -> list[int]:
    """What RowsSeen reported for frames stamped ``agent_ts``: the rows it saw together."""
    return [int(f.score) for f in result.findings if isinstance(f, Anomaly) and f.ts == agent_ts]


FRAME_TS = 100.0  # audit2._gpu_frames' first frame
# another sender's frame of the same GPUs read before frame 1's continuation: earlier, or the guard
# refuses frame 1's rows as going back in time (and RowsSeen sees none)
EARLIER_TS = 50.0


def test_pieces_whose_rest_never_comes_run_after_the_wait(small_topology: Topology) -> None:
    clock, stage, _ = _held(small_topology)  # then the agent is killed
    assert [len(g) for g in stage.parts[0].held.values()] == [4]
    clock.now += WAIT_S - 1  # not yet: its sender may still send the rest
    assert stage.release_held(0).findings_message is None and stage.parts[0].held
    clock.now += 1
    result = stage.release_held(0)
    # the 4 held pieces (20 rows) ran, together, and each piece is reported for the incident stage
    assert result.rows == 20 and _rows_seen(result, FRAME_TS) == [20]
    assert result.findings_message is not None
    assert [(r.agent, r.seq, r.part, r.parts, r.rows) for r in decode_findings(result.findings_message)] == \
        [("a#1", 1, part, 7, 5) for part in range(4)]
    assert stage.health.problems[("worker", "held_abandoned")] == 1
    assert not stage.parts[0].held
    # and no checkpoint carries them any more: one taken now loads with nothing held
    again = _stage(small_topology, clock)
    again.load(0, stage.checkpoint(0)[1])
    assert not again.parts[0].held


def test_another_senders_record_after_the_wait_runs_them_with_it(small_topology: Topology) -> None:
    """A partition other agents still write to runs them with its next record, not only at the
    worker's periodic call (``release_held``)."""
    clock, stage, _ = _held(small_topology)
    clock.now += WAIT_S
    value, headers = _other_sender(small_topology)
    result = stage.process(0, 2, value, headers)
    assert result.rows == GPUS + 20 and _rows_seen(result, FRAME_TS) == [20] and _rows_seen(result, 500.0) == [GPUS]
    reports = [(r.agent, r.seq, r.part) for r in decode_findings(result.findings_message or b"")]
    assert reports == [("b#1", 1, 0)] + [("a#1", 1, part) for part in range(4)]
    assert stage.health.problems[("worker", "held_abandoned")] == 1 and not stage.parts[0].held


def test_a_continuation_in_time_still_joins_them(small_topology: Topology) -> None:
    clock, stage, records = _held(small_topology)
    clock.now += WAIT_S - 1
    value, headers = _other_sender(small_topology, EARLIER_TS)
    assert stage.process(0, 2, value, headers).rows == GPUS  # another sender's record: the held wait on
    clock.now += WAIT_S - 1  # long since the first piece, but its sender goes on: it is not given up on
    result = stage.process(0, 3, records[2][1], records[2][2])
    assert result.rows == GPUS and _rows_seen(result, FRAME_TS) == [GPUS]  # the whole share, run as one frame
    assert ("worker", "held_abandoned") not in stage.health.problems and not stage.parts[0].held


def test_a_worker_restarted_after_the_wait_still_joins_the_continuation(small_topology: Topology) -> None:
    """The continuation is in the records after the checkpoint: a worker down longer than the wait
    reads it after loading, and the held pieces wait afresh from the load (the checkpoint is as
    before: it holds no arrival time)."""
    clock, stage, records = _held(small_topology)
    blob = stage.checkpoint(0)[1]
    clock.now += 10 * WAIT_S  # down for a while
    restarted = _stage(small_topology, clock)
    assert restarted.load(0, blob) == 1 and [len(g) for g in restarted.parts[0].held.values()] == [4]
    value, headers = _other_sender(small_topology, EARLIER_TS)
    assert restarted.process(0, 2, value, headers).rows == GPUS  # another sender first: not given up on
    result = restarted.process(0, 3, records[2][1], records[2][2])
    assert _rows_seen(result, FRAME_TS) == [GPUS]
    assert ("worker", "held_abandoned") not in restarted.health.problems


def test_held_pieces_of_other_hardware_are_counted_and_dead_lettered(small_topology: Topology) -> None:
    clock, stage, _ = _held(small_topology)
    held = [frame for _, frame in stage.parts[0].held["a#1"]]
    blob = stage.checkpoint(0)[1]
    layout = small_topology.to_dict()
    layout["nodes"].append({"name": "node9", "rack": "rack1", "gpus": 8})  # a node added
    moved_hw = Topology.from_dict(layout)
    moved = _stage(moved_hw, clock)
    assert moved.load(0, blob) == 1
    assert not moved.parts[0].held
    assert moved.health.problems[("worker", "held_dropped")] == 4
    value, headers = _other_sender(moved_hw)
    result = moved.process(0, 2, value, headers)  # the first record names where they came from
    assert [d.reason for d in result.dead_letters] == ["held_dropped"] * 4
    # each its own single-piece message of the rows held, as the old hardware numbered them: the
    # first 4 pieces of 5 of the frame's 32 GPUs, in order
    slots = []
    for letter, frame in zip(result.dead_letters, held):
        (piece,) = decode_bundle(letter.value, headers_dict(letter.headers), small_topology, stage.pmap, None)
        assert piece.frame is not None and piece.frame.slot.tolist() == frame.slot.tolist()
        assert (piece.info.agent, piece.info.seq, piece.info.parts) == ("a#1", 1, 7)
        slots += piece.frame.slot.tolist()
    assert slots == list(range(20))
    # once: not again with the next record (a later frame: the guard refuses a repeated timestamp)
    assert not moved.process(0, 3, *_other_sender(moved_hw, 600.0)).dead_letters


def test_the_worker_runs_them_at_its_periodic_checkpoint_tick(tmp_path: Path, monkeypatch,
                                                              small_topology: Topology) -> None:
    """A partition no agent writes to any more has no next record: the worker's timer
    (``checkpoint_due``) runs them, and their findings go to the findings topic."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    worker, sent, exits = support._worker(small_topology)
    clock = Clock()
    worker.detection.clock = clock
    stream = support._Stream()
    records = _records(small_topology)[:2]

    async def feed() -> None:
        for offset, (_, value, headers) in enumerate(records):
            await worker.handle(worker.on_piece, stream, support._event(support.FRAMES_TOPIC, offset, value, headers))

    asyncio.run(feed())
    assert [name for name, _, _ in sent if name == "findings_topic"] == []  # all held
    clock.now += worker.detection.held_wait_s
    asyncio.run(worker.checkpoint_due())
    assert exits == []
    findings = [v for name, v, h in sent if name == "findings_topic" and not h]
    assert [(r.agent, r.seq, r.part) for v in findings for r in decode_findings(v)] == \
        [("a#1", 1, part) for part in range(4)]
    assert worker.health.problems[("worker", "held_abandoned")] == 1 and not worker.detection.parts[0].held
    worker.remove_data_dir()


def _feed_then_release(worker: Any, clock: Clock, stream: Any, topology: Topology) -> None:
    """Agent a#1's first two bundles (then it is killed), the periodic checkpoint that holds their
    pieces and acknowledges their records, then the tick past the wait that runs them."""
    async def feed() -> None:
        for offset, (_, value, headers) in enumerate(_records(topology)[:2]):
            await worker.handle(worker.on_piece, stream, support._event(support.FRAMES_TOPIC, offset, value, headers))
        await worker.checkpoint_due(force=True)

    asyncio.run(feed())
    assert stream.acked == [0, 1] and worker.detection.parts[0].held  # acknowledged: only the checkpoint has them
    clock.now += worker.detection.held_wait_s
    asyncio.run(worker.checkpoint_due())  # not forced: the interval (an hour here) has not passed


def test_the_tick_that_runs_them_writes_the_checkpoint_without_them(tmp_path: Path, monkeypatch,
                                                                    small_topology: Topology) -> None:
    """Their records were acknowledged at the checkpoint that held them; the partition (its agents
    killed) has no record after them, so nothing else writes a checkpoint. Until 2026-12-05 the
    tick that ran them wrote none: a restart loaded the one still holding the group and, after the
    wait, ran it again (the same reports sent twice, held_abandoned counted twice, and the rows
    refused by the guard as a clock stepped back)."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    worker, sent, exits = support._worker(small_topology)
    clock = Clock()
    worker.detection.clock = clock
    _feed_then_release(worker, clock, support._Stream(), small_topology)
    assert exits == []
    names = [name for name, _, _ in sent]
    assert names.count("checkpoint_topic") == 2  # the one that held them, and one at the release
    # written after the released findings: their delivery is confirmed before it (_confirm_sent)
    assert names.index("findings_topic") < len(names) - 1 - names[::-1].index("checkpoint_topic")
    blob = [value for name, value, _ in sent if name == "checkpoint_topic"][-1]
    worker.remove_data_dir()

    # a restart (its clock past the wait again) resumes from the latest checkpoint when the
    # partition gets a record again: the agent back as a new sender, b#1
    restarted, sent2, exits2 = support._worker(small_topology)
    restarted.detection.clock = clock

    async def latest_checkpoint(partition: int) -> bytes:
        return blob

    restarted.read_checkpoint = latest_checkpoint  # type: ignore[method-assign]
    stream = support._Stream()

    async def resume() -> None:
        value, headers = _other_sender(small_topology, 500.0)
        await restarted.handle(restarted.on_piece, stream, support._event(support.FRAMES_TOPIC, 2, value, headers))
        assert not restarted.detection.parts[0].held  # the checkpoint holds nothing
        clock.now += restarted.detection.held_wait_s
        value, headers = _other_sender(small_topology, 510.0)
        await restarted.handle(restarted.on_piece, stream, support._event(support.FRAMES_TOPIC, 3, value, headers))
        await restarted.checkpoint_due(force=True)

    asyncio.run(resume())
    assert exits2 == []
    reports = [(r.agent, r.seq, r.part) for name, v, h in sent2 if name == "findings_topic" and not h
               for r in decode_findings(v)]
    assert reports == [("b#1", 1, 0), ("b#1", 1, 0)]  # b#1's two records only: no a#1 report again
    assert ("worker", "held_abandoned") not in restarted.health.problems
    assert not [key for key in restarted.health.problems if key[0] == "guard"]  # no rows run twice
    restarted.remove_data_dir()


def test_reports_cut_at_the_tick_are_dead_lettered(tmp_path: Path, monkeypatch, small_topology: Topology) -> None:
    """A report of pieces run at the tick cut to the findings topic's message size is dead-lettered,
    as one of a record's (``on_piece``): there is no record of its own, the findings message goes,
    named after the partition's last record; the checkpoint is written after it."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    from foreshock.streams import faust_app

    split = faust_app.split_findings
    lost = "a#1 frame 1 part 0: 2 of 3 findings left out, past the findings topic's message size"
    monkeypatch.setattr(faust_app, "split_findings", lambda value: (split(value)[0], [lost]))
    worker, sent, exits = support._worker(small_topology)
    clock = Clock()
    worker.detection.clock = clock
    _feed_then_release(worker, clock, support._Stream(), small_topology)
    assert exits == []
    dead = [(i, v, dict(h)) for i, (name, v, h) in enumerate(sent) if name == "deadletter_topic"]
    ((index, value, headers),) = dead
    assert headers["foreshock-reason-code"] == b"findings_too_large" and lost.encode() in headers["foreshock-reason"]
    assert headers["foreshock-source"] == f"{support.FRAMES_TOPIC}/0/1".encode()
    assert [(r.agent, r.seq, r.part) for r in decode_findings(value)] == [("a#1", 1, part) for part in range(4)]
    assert worker.health.problems[("worker", "findings_too_large")] == 1
    assert [name for name, _, _ in sent[index:]].count("checkpoint_topic") == 1
    worker.remove_data_dir()
