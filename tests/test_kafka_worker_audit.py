"""Findings of an audit of the Kafka mode: a revoked frames partition taken back by an event
still on its way to the worker, the data folder left behind by a worker that ends through
``fatal``, JSON messages with no record in them that were neither counted nor dead-lettered,
checkpoint deltas lost on arrays not in C order, and JSON booleans read as numbers.

No broker: faust's producer, topics and streams are stand-ins (``test_kafka_poison_records``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from aiokafka.structs import TopicPartition
from test_kafka_poison_records import FRAMES_TOPIC, JSON_TOPIC, _event, _Stream, _worker

from foreshock.exporters.prometheus import build_registry
from foreshock.frames import Frame, frames_from_records
from foreshock.streams.kafka_codec import PartitionMap, encode_bundle, json_to_frames
from foreshock.streams.kafka_worker import apply_delta, state_delta
from foreshock.topology import Topology


def _piece(topology: Topology, partition: int, seq: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A bundle with one piece of GPU rows of ``partition``'s entities."""
    slots = np.flatnonzero(PartitionMap(topology, 2).by_kind["gpu"] == partition)[:4]
    frame = Frame("gpu", np.full(len(slots), float(seq)), slots, {"gpu_temp": np.full(len(slots), 50.0)})
    return encode_bundle("a#1", 0.0, [(seq, 0, 1, frame)], topology=topology)


# ---- 1. a revoked frames partition ----------------------------------------------------------
def test_an_event_of_a_revoked_partition_is_left_to_its_new_owner(tmp_path: Path, monkeypatch,
                                                                  small_topology: Topology) -> None:
    """After on_revoked checkpointed and dropped partition 0, an event of it that still reached
    on_piece (faust's buffers prefetch; stream_wait_empty=False) loaded the partition again from
    its checkpoint: this worker wrote findings, checkpoints and acks for it beside its new owner."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    worker, sent, exits = _worker(small_topology, 2)
    stream = _Stream()

    async def run() -> None:
        await worker.handle(worker.on_piece, stream, _event(FRAMES_TOPIC, 7, *_piece(small_topology, 0, 1)))
        await worker.handle(worker.on_piece, stream, _event(FRAMES_TOPIC, 3, *_piece(small_topology, 1, 1),
                                                            partition=1))
        assert worker.detection.owns(0) and worker.detection.owns(1)
        await worker.on_revoked([TopicPartition(FRAMES_TOPIC, 0)])
        assert not worker.detection.owns(0)
        sent.clear()
        await worker.handle(worker.on_piece, stream, _event(FRAMES_TOPIC, 8, *_piece(small_topology, 0, 2)))
        assert not worker.detection.owns(0) and 0 not in worker.held
        assert sent == [] and 8 not in stream.acked  # no findings, no dead letter, no commit past it
        assert worker.counts["not_assigned"] == 1 and not worker.health.problems
        # and in the worker's /metrics: a rebalance's leftovers are seen, not only logged at its stop
        assert build_registry(worker.store).get_sample_value(
            "foreshock_records_not_assigned_total", {"cluster": small_topology.cluster, "stage": "worker"}) == 1.0
        # the partition this worker keeps goes on as before
        await worker.handle(worker.on_piece, stream, _event(FRAMES_TOPIC, 4, *_piece(small_topology, 1, 2),
                                                            partition=1))
        assert [len(events) for events in worker.held.values()] == [2]
        assert sent and {name for name, _, _ in sent} == {"findings_topic"}
        # assigned again (the next rebalance's whole assignment), it is processed again
        worker.on_assigned({TopicPartition(FRAMES_TOPIC, 0), TopicPartition(FRAMES_TOPIC, 1)})
        await worker.handle(worker.on_piece, stream, _event(FRAMES_TOPIC, 9, *_piece(small_topology, 0, 3)))
        assert worker.detection.owns(0) and len(worker.held[0]) == 1

    asyncio.run(run())
    assert exits == []
    worker.remove_data_dir()


def test_an_event_waiting_for_the_lock_during_a_revocation_is_not_processed(tmp_path: Path, monkeypatch,
                                                                            small_topology: Topology) -> None:
    """An agent that took an event of the partition just before the rebalance waits for the lock
    that on_revoked (or a checkpoint) holds; it gets the lock once on_revoked let it go."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    worker, sent, exits = _worker(small_topology, 2)
    stream = _Stream()

    async def run() -> None:
        await worker.handle(worker.on_piece, stream, _event(FRAMES_TOPIC, 7, *_piece(small_topology, 0, 1)))
        await worker.lock.acquire()  # a checkpoint in progress
        waiting = asyncio.ensure_future(
            worker.handle(worker.on_piece, stream, _event(FRAMES_TOPIC, 8, *_piece(small_topology, 0, 2))))
        await asyncio.sleep(0)
        revoking = asyncio.ensure_future(worker.on_revoked([TopicPartition(FRAMES_TOPIC, 0)]))
        await asyncio.sleep(0)
        sent.clear()
        worker.lock.release()
        await asyncio.gather(waiting, revoking)
        # no findings of offset 8: only the revocation's checkpoint, of the offset before it
        assert [name for name, _, _ in sent] == ["checkpoint_topic"]
        assert not worker.detection.owns(0) and 0 not in worker.held and 8 not in stream.acked
        assert worker.counts["not_assigned"] == 1

    asyncio.run(run())
    assert exits == []
    worker.remove_data_dir()


def test_the_assignment_comes_from_fausts_signal(tmp_path: Path, monkeypatch, small_topology: Topology) -> None:
    """faust sends on_partitions_assigned with the whole assignment of each rebalance, every topic
    of the group: the frames partitions among it are the ones the worker processes."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    worker, _, _ = _worker(small_topology, 2)
    worker.assigned_frames = set()
    assigned = {TopicPartition(FRAMES_TOPIC, 1), TopicPartition(JSON_TOPIC, 0), TopicPartition(JSON_TOPIC, 1)}
    asyncio.run(worker.app.on_partitions_assigned.send(assigned))
    assert worker.assigned_frames == {1}
    worker.remove_data_dir()


# ---- 2. the data folder of a worker that ends through fatal ----------------------------------
def test_a_worker_ending_through_fatal_removes_its_temporary_data_folder(tmp_path: Path, monkeypatch,
                                                                         small_topology: Topology) -> None:
    """fatal ends the process with os._exit: run_worker's finally, which removed the folder, never
    ran, and every such exit left a foreshock-worker-* folder behind. A folder the configuration
    named is the operator's: it stays."""
    from foreshock.streams.faust_app import EXIT_RECORD_FAILED

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    worker, _, exits = _worker(small_topology)
    assert worker.owns_data_dir and worker.data_dir.parent == tmp_path and worker.data_dir.is_dir()
    worker.fatal("record t/0@5", RuntimeError("a detector's bug"))
    assert exits == [EXIT_RECORD_FAILED] and not worker.data_dir.exists()

    given = tmp_path / "given"
    given.mkdir()
    worker, _, exits = _worker(small_topology)
    worker.remove_data_dir()
    worker.owns_data_dir, worker.data_dir = False, given
    worker.fatal("record t/0@6", RuntimeError("a detector's bug"))
    assert exits == [EXIT_RECORD_FAILED] and given.is_dir()


# ---- 3. JSON messages with no record in them -------------------------------------------------
@pytest.mark.parametrize("raw", [b" \n\t\r\n ", b"[]", b" [ \n ] \n"])
def test_json_messages_of_whitespace_or_an_empty_array_are_counted_and_dead_lettered(
        tmp_path: Path, monkeypatch, small_topology: Topology, raw: bytes) -> None:
    """As the empty message: they gave no record and no bad entry, so nothing was counted and
    nothing went to the dead letters."""
    frames, bad = json_to_frames(raw, small_topology)
    assert frames == [] and [value for value, _ in bad] == [raw]
    assert bad[0][1].startswith("empty message")

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    worker, sent, exits = _worker(small_topology)
    asyncio.run(worker.handle(lambda _s, e: worker.on_json(e), _Stream(), _event(JSON_TOPIC, 0, raw, [])))
    assert exits == []
    assert worker.health.problems[("route_json", "invalid_record")] == 1
    assert [(name, value) for name, value, _ in sent] == [("deadletter_topic", raw)]
    worker.remove_data_dir()


# ---- 4. checkpoint deltas of arrays not in C order -------------------------------------------
def test_checkpoint_deltas_round_trip_arrays_in_any_memory_layout() -> None:
    """apply_delta wrote the changed values through reshape(-1), a copy (not a view) of a
    Fortran-ordered or sliced array: the delta was lost and the initial state came back."""
    wide = np.arange(40.0).reshape(4, 10)
    initials = {"fortran": np.asfortranarray(np.zeros((4, 3))), "sliced": wide[:, ::2], "c": np.zeros((4, 3))}
    for name, initial in initials.items():
        current = np.array(initial, order="F" if name != "c" else "C")
        current[1, 2] = 5.0
        current[3, 0] = -1.0
        for before, after in ((initial, current), (np.ascontiguousarray(initial), current),
                              (initial, np.ascontiguousarray(current))):
            delta = state_delta({"x": before}, {"x": after})
            assert "__delta__" in delta["__dict__"]["x"], name  # (a delta, not the whole array)
            back = apply_delta({"x": before}, delta)["x"]
            assert back.shape == after.shape and np.array_equal(back, after), name
            assert back[1, 2] == 5.0 and back[3, 0] == -1.0
    assert wide[1, 4] == 14.0  # the sliced initial state itself is untouched


# ---- 5. JSON booleans for numbers ------------------------------------------------------------
def test_a_json_boolean_is_not_a_number(small_topology: Topology) -> None:
    """bool is an int in Python: ``"gpu_temp": true`` was read as 1.0 °C, ``"ts": false`` as the
    epoch. Each is a malformed record, rejected with its reason as any non-numeric value."""
    raw = (b'{"kind":"gpu","entity":"node0/gpu0","ts":1.0,"gpu_temp":true}\n'
           b'{"kind":"gpu","entity":"node0/gpu1","ts":false,"gpu_temp":50}\n'
           b'{"kind":"gpu","entity":"node0/gpu2","ts":2.0,"gpu_temp":50}')
    frames, bad = json_to_frames(raw, small_topology)
    assert [reason for _, reason in bad] == ["non-numeric field value", "missing or non-numeric 'ts'"]
    assert [value for value, _ in bad] == raw.split(b"\n")[:2]
    assert len(frames) == 1 and frames[0].columns["gpu_temp"].tolist() == [50.0]
    # the function the import command uses
    _, rejected = frames_from_records([{"kind": "gpu", "entity": "node0/gpu0", "ts": 1.0, "power": False}],
                                      small_topology.slots_resolver())
    assert [reason for _, reason in rejected] == ["non-numeric field value"]
