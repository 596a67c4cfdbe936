"""A GPU board swapped in its slot (an RMA), seen by the pipeline itself: every GPU source carries
the board's UUID in each row as ``board_id``, and the input guard finds the change wherever the
rows are processed (``watch``, ``replay`` of a recording, a Kafka worker after a restart), so the
new board's detector state starts afresh from its first row, not before it, not after it.

The ``watch`` end-to-end tests are ``test_watch_swap.py`` (dcgm) and ``test_watch_swap_local.py``
(NVML, nvidia-smi); the sources' own columns are tested with each source."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.registry import DEFAULT_BANK
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.guard import InputGuard
from foreshock.health import PipelineHealth
from foreshock.recording import RecordingWriter
from foreshock.remap import Remap
from foreshock.streams.embedded import EmbeddedPipeline
from foreshock.streams.kafka_codec import PartitionMap, decode_bundle, encode_bundle, headers_dict
from foreshock.streams.kafka_worker import DetectionStage
from foreshock.streams.polling import GpuBoards, board_id
from foreshock.streams.samples import SampleBatch
from foreshock.streams.sources import ReplaySource
from foreshock.topology import Topology

from board_ids import Seen, uuid_number
from thermal_synth import World, small_topology

TICKS = 240  # 40 min at 10 s
SLOT = 5
OLD, NEW = float(uuid_number("GPU-old")), float(uuid_number("GPU-new"))
# cooling's and straggler's peer comparisons run at frame boundaries, so batching ticks moves them
# (by design): the rest of the bank gives the same state however the ticks are batched
BATCHABLE = [name for name in DEFAULT_BANK if name not in ("cooling", "straggler")]


@settings(deadline=None)
@given(st.text(min_size=1, max_size=60))
def test_a_board_id_is_the_uuids_number_exactly(uuid: str) -> None:
    value = board_id(uuid)
    assert value == uuid_number(uuid) and float(int(value)) == value  # exact in a float64
    assert 0 <= value < 2**52


def test_no_uuid_is_no_board() -> None:
    assert math.isnan(board_id(""))


def gpu_frame(ts: float, slots: list[int], boards: list[float]) -> Frame:
    return Frame("gpu", np.full(len(slots), ts), np.array(slots), {"board_id": np.array(boards, dtype=float)})


def test_the_guard_finds_where_a_slots_board_changes() -> None:
    topology = small_topology(nodes=1, gpus=4, racks=1)
    guard = InputGuard(topology, PipelineHealth())
    nan = math.nan
    # first boards, and none read: no change
    assert guard.board_change(gpu_frame(10.0, [0, 1, 2], [1.0, 2.0, nan])) is None
    assert guard.board_change(gpu_frame(20.0, [0, 1, 2], [nan, 2.0, nan])) is None
    # slot 1 swapped, and slot 2's first board: the change is at 30 s, slot 1, 2 -> 7
    found = guard.board_change(gpu_frame(30.0, [0, 1, 2], [1.0, 7.0, 3.0]))
    assert found is not None
    when, slots, old, new = found
    assert (when, slots.tolist(), old.tolist(), new.tolist()) == (30.0, [1], [2.0], [7.0])
    assert guard.board_change(gpu_frame(40.0, [0, 1, 2], [1.0, 7.0, 3.0])) is None  # noted
    # two ticks in one frame: both slots changing at the second tick, none at the first
    two = Frame("gpu", np.array([50.0, 50.0, 60.0, 60.0]), np.array([0, 1, 0, 1]),
                {"board_id": np.array([1.0, 7.0, 4.0, 8.0])})
    found = guard.board_change(two)
    assert found is not None
    when, slots, old, new = found
    assert (when, slots.tolist(), old.tolist(), new.tolist()) == (60.0, [0, 1], [1.0, 7.0], [4.0, 8.0])
    # a slot's first rows that disagree: the first is its board, the second a change
    found = guard.board_change(Frame("gpu", np.array([70.0, 80.0]), np.array([3, 3]),
                                     {"board_id": np.array([5.0, 6.0])}))
    assert found is not None and (found[0], found[1].tolist(), found[2].tolist()) == (80.0, [3], [5.0])


def test_the_guards_boards_are_kept_with_its_state_and_follow_each_gpu_by_name() -> None:
    topology = small_topology(nodes=2, gpus=4, racks=1)
    guard = InputGuard(topology, PipelineHealth())
    guard.board_change(gpu_frame(10.0, [0, 4], [1.0, 2.0]))
    state = guard.state_dict()

    restored = InputGuard(topology, PipelineHealth())
    restored.load_state_dict(state)
    found = restored.board_change(gpu_frame(20.0, [0, 4], [1.0, 9.0]))
    assert found is not None and found[1].tolist() == [4] and found[2].tolist() == [2.0]

    # the nodes listed the other way round: node1's GPUs take slots 0-3, their boards follow them
    data = topology.to_dict()
    data["nodes"] = data["nodes"][::-1]
    moved = Topology.from_dict(data)
    remapped = InputGuard(moved, PipelineHealth())
    remapped.load_state_dict(state, Remap(topology, moved))
    np.testing.assert_array_equal(remapped.s_board, [2.0, np.nan, np.nan, np.nan, 1.0, np.nan, np.nan, np.nan])

    # a checkpoint from before boards were kept knows none: the next board read is a first one
    del state["gpu:board"]
    old = InputGuard(topology, PipelineHealth())
    old.load_state_dict(state)
    assert old.board_change(gpu_frame(20.0, [0, 4], [3.0, 9.0])) is None


# ---- the pipeline ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world() -> tuple[Topology, list[Frame]]:
    topology = small_topology(nodes=2, gpus=8, racks=1)
    frames = [f for f in World(topology, seed=3).run(TICKS * 10.0)[0] if f.kind == "gpu"]
    return topology, frames


def with_boards(frames: list[Frame], swap: int | None) -> list[Frame]:
    """``frames`` with every GPU's board read (its slot + 1), ``SLOT``'s being ``OLD`` before tick
    ``swap`` and ``NEW`` from it on (None: never swapped)."""
    out = []
    for i, frame in enumerate(frames):
        boards = frame.slot.astype(float) + 1.0
        boards[frame.slot == SLOT] = OLD if swap is None or i < swap else NEW
        out.append(Frame("gpu", frame.ts, frame.slot, {**frame.columns, "board_id": boards}))
    return out


def pipeline(topology: Topology, names: list[str] | None = None) -> EmbeddedPipeline:
    return EmbeddedPipeline(topology, DetectorBank.from_names(topology, names, processors=()))


def detector_state(p: EmbeddedPipeline) -> dict[str, Any]:
    return p.bank.state_dict()["detectors"]


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        for key, value in a[name].items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(value, b[name][key], err_msg=f"{name}.{key}")
            else:
                assert value == b[name][key], f"{name}.{key}"


def test_a_restarted_gpu_takes_a_fresh_banks_rows_and_the_others_keep_theirs(world) -> None:
    topology, frames = world
    p = pipeline(topology)
    for frame in frames[:120]:
        p.process(frame)
    before = detector_state(p)
    p.restart_gpus(np.array([SLOT]))
    after, fresh = detector_state(p), detector_state(pipeline(topology))
    restarted = 0
    for detector in p.bank.detectors:
        for key, kind in detector.slot_kinds.items():
            if kind != "gpu" or key not in after[detector.name]:
                continue
            mine, was, new = after[detector.name][key], before[detector.name][key], fresh[detector.name][key]
            np.testing.assert_array_equal(mine[SLOT], new[SLOT], err_msg=f"{detector.name}.{key}")
            others = np.arange(len(mine)) != SLOT
            np.testing.assert_array_equal(mine[others], was[others], err_msg=f"{detector.name}.{key}")
            restarted += not np.array_equal(was[SLOT], new[SLOT], equal_nan=True)
    assert restarted >= 5  # the GPU had learnt something in several detectors, now forgotten


def test_a_swap_restarts_the_gpu_at_the_new_boards_first_row(world, caplog) -> None:
    """The same as restarting the GPU by hand between the old board's last row and the new one's
    first; the swap is counted and logged once."""
    topology, frames = world
    swap = 150
    found = pipeline(topology)
    with caplog.at_level(logging.WARNING, logger="foreshock.pipeline"):
        for frame in with_boards(frames, swap):
            found.process(frame)
    by_hand = pipeline(topology)
    for i, frame in enumerate(with_boards(frames, None)):
        if i == swap:
            by_hand.restart_gpus(np.array([SLOT]))
        by_hand.process(frame)
    never = pipeline(topology)
    for frame in with_boards(frames, None):
        never.process(frame)
    assert_same_state(detector_state(found), detector_state(by_hand))
    with pytest.raises(AssertionError):
        assert_same_state(detector_state(found), detector_state(never))
    assert found.health.gpus_replaced == {"guard": 1} and not never.health.gpus_replaced
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        f"GPU {topology.name('gpu', SLOT)}: another board in its slot (board_id {int(OLD)} -> {int(NEW)})"]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(swap=st.integers(1, TICKS - 1), size=st.integers(2, 40))
def test_a_swap_inside_a_batch_of_ticks_restarts_the_gpu_where_the_tick_by_tick_run_does(world, swap, size) -> None:
    """A worker catching up reads many ticks in one frame: the frame is split where the board
    changes, and the state is that of the run fed tick by tick."""
    topology, frames = world
    ticks = with_boards(frames, swap)
    by_tick = pipeline(topology, BATCHABLE)
    for frame in ticks:
        by_tick.process(frame)
    batched = pipeline(topology, BATCHABLE)
    for start in range(0, len(ticks), size):
        batched.process(Frame.concat(ticks[start:start + size]))
    assert_same_state(detector_state(batched), detector_state(by_tick))
    assert batched.health.gpus_replaced == {"guard": 1}


def test_a_pipeline_restored_from_a_checkpoint_still_finds_the_swap(world) -> None:
    """A Kafka worker restarts between the old board's last row and the new one's first (the node
    was down for the swap, and so maybe the worker): its checkpoint keeps the old board, so the
    new one is found as another, as by a worker that never stopped."""
    topology, frames = world
    swap = 150
    ticks = with_boards(frames, swap)
    never_stopped = pipeline(topology)
    for frame in ticks:
        never_stopped.process(frame)
    first = pipeline(topology)
    for frame in ticks[:swap]:
        first.process(frame)
    restarted = pipeline(topology)
    restarted.guard.load_state_dict(first.guard.state_dict())
    restarted.bank.load_state_dict(first.bank.state_dict())
    for frame in ticks[swap:]:
        restarted.process(frame)
    assert_same_state(detector_state(restarted), detector_state(never_stopped))
    assert restarted.health.gpus_replaced == {"guard": 1}


def test_the_old_boards_limits_are_forgotten_at_the_swap(world) -> None:
    """/metrics and the HBM alert judge the new board by its own limits, or the defaults: not by
    those the old board reported."""
    topology, frames = world
    swap = 20
    p = pipeline(topology, ["thermal"])
    for i, frame in enumerate(with_boards(frames[:swap + 2], swap)):
        limits = np.where(frame.slot == SLOT, 85.0 if i < swap else np.nan, 90.0)
        p.process(Frame("gpu", frame.ts, frame.slot, {**frame.columns, "max_op_temp": limits,
                                                      "hbm_max_op_temp": limits}))
        latest = p.store.snapshot().latest["gpu"]
        for name in ("max_op_temp", "hbm_max_op_temp"):
            if i < swap:
                assert latest[name][SLOT] == 85.0
            else:  # the new board reports none: the old one's is not kept for it
                assert np.isnan(latest[name][SLOT])
            assert latest[name][SLOT + 1] == 90.0


def test_a_kafka_worker_restarted_across_the_swap_finds_it_from_its_checkpoint(world) -> None:
    """The frames an agent sends (its pieces, by partition, in bundles: the codec carries
    ``board_id``) run through a detection stage that checkpoints before the swap and is replaced
    by a new one loading that checkpoint: the new stage finds the swap, and ends with the state
    of a stage that never stopped."""
    topology, frames = world
    swap = 150
    pmap = PartitionMap(topology, 2)
    offsets: dict[int, int] = {0: 0, 1: 0}
    records: list[tuple[int, int, bytes, Any]] = []
    before = 0  # the records of the ticks before the swap
    for seq, frame in enumerate(with_boards(frames, swap), 1):
        messages = pmap.messages(frame)
        for index, (part, piece) in enumerate(messages):
            value, headers = encode_bundle("agent", 0.0, [(seq, index, len(messages), piece)])
            records.append((part, offsets[part], value, headers))
            offsets[part] += 1
        if seq == swap:
            before = len(records)

    def stage() -> DetectionStage:
        made = DetectionStage(topology, lambda hardware: DetectorBank.from_names(hardware, processors=()), 2)
        for part in range(2):
            made.load(part, None)
        return made

    def owner(made: DetectionStage) -> EmbeddedPipeline:
        return made.parts[int(pmap.partition_of("gpu", np.array([SLOT]))[0])].pipeline

    never_stopped = stage()
    for record in records:
        never_stopped.process(*record)
    first = stage()
    for record in records[:before]:
        first.process(*record)
    blobs = {part: first.checkpoint(part)[1] for part in range(2)}
    second = DetectionStage(topology, lambda hardware: DetectorBank.from_names(hardware, processors=()), 2)
    for part in range(2):
        second.load(part, blobs[part])
    for record in records[before:]:
        second.process(*record)
    assert second.health.gpus_replaced == {"guard": 1} and not first.health.gpus_replaced
    assert_same_state(detector_state(owner(second)), detector_state(owner(never_stopped)))


def test_a_recording_carries_the_boards_and_its_replay_finds_the_swap(world, tmp_path) -> None:
    """``foreshock record`` writes board_id like any field: the replay, in batches of many ticks,
    restarts the GPU where the run fed tick by tick did."""
    topology, frames = world
    swap = 150
    ticks = with_boards(frames, swap)
    with RecordingWriter(tmp_path / "rec", topology) as writer:
        for frame in ticks:
            writer.write(frame)
    replayed = pipeline(topology, BATCHABLE)
    for frame in ReplaySource(str(tmp_path / "rec"), batch_rows=16 * 25):
        replayed.process(frame)
    by_tick = pipeline(topology, BATCHABLE)
    for frame in ticks:
        by_tick.process(frame)
    assert replayed.health.gpus_replaced == {"guard": 1}
    assert_same_state(detector_state(replayed), detector_state(by_tick))


def test_a_kafka_worker_forwards_every_guarded_row_of_a_piece_split_at_a_swap(world) -> None:
    """The rows the incident stage reads (processors' declared fields) are the piece's guarded
    rows, both sides of the swap: the worker kept only the part after it, once a piece was split."""
    topology, frames = world
    swap = 150
    stage = DetectionStage(topology, lambda hardware: DetectorBank.from_names(hardware), 1)
    assert stage.frame_fields is not None and "gpu" in stage.frame_fields
    stage.load(0, None)
    piece = Frame.concat(with_boards(frames, swap)[swap - 3:swap + 3])  # three ticks each side, one piece
    value, headers = encode_bundle("agent", 0.0, [(1, 0, 1, piece)])
    result = stage.process(0, 0, value, headers)
    assert stage.health.gpus_replaced == {"guard": 1}
    ((forwarded_value, forwarded_headers),) = result.telemetry_messages  # one bundle: one message
    (forwarded,) = decode_bundle(forwarded_value, headers_dict(forwarded_headers), topology, PartitionMap(topology, 1),
                                 None)
    assert forwarded.frame is not None
    np.testing.assert_array_equal(forwarded.frame.ts, piece.ts)
    np.testing.assert_array_equal(forwarded.frame.slot, piece.slot)


def test_a_frame_listing_each_gpus_ticks_together_is_split_by_time(caplog) -> None:
    """A frame of two ticks ordered by slot (the guard only keeps each slot's own rows in time
    order), two GPUs swapped at the second: split at that tick, whole, each GPU restarted once
    (split where the first changed row sat, GPU 1's old row after it read as a change back, and
    GPU 1 was restarted three times)."""
    topology = small_topology(nodes=1, gpus=4, racks=1)
    p = pipeline(topology)
    restarts: list[list[int]] = []
    parts: list[list[float]] = []
    restart, detect = p.bank.restart_gpus, p._detect
    p.bank.restart_gpus = lambda slots, fresh: (  # type: ignore[method-assign]
        restarts.append(np.asarray(slots).tolist()), restart(slots, fresh))[1]
    p._detect = lambda frame, wall: (parts.append(sorted(frame.ts.tolist())), detect(frame, wall))[1]  # type: ignore[method-assign]
    p.process(Frame("gpu", np.array([10.0, 10.0]), np.array([0, 1]), {"board_id": np.array([1.0, 2.0])}))
    parts.clear()
    p.process(Frame("gpu", np.array([15.0, 20.0, 15.0, 20.0]), np.array([0, 0, 1, 1]),
                    {"board_id": np.array([1.0, 7.0, 2.0, 8.0])}))
    assert restarts == [[0, 1]]
    assert parts == [[15.0, 15.0], [20.0, 20.0]]
    assert p.health.gpus_replaced == {"guard": 2}


def test_what_was_predicted_of_the_old_board_is_withdrawn_at_the_swap(world) -> None:
    """The restarted detectors no longer know they raised it, and would never withdraw it: the
    store kept the old board's prediction (on /metrics, in the alerts) until its ETA passed. The
    bank's processors (the incident engine) are handed the withdrawal too."""
    topology, frames = world
    swap = 20
    ticks = with_boards(frames, swap)
    seen = Seen()
    p = EmbeddedPipeline(topology, DetectorBank.from_names(topology, ["thermal"], processors=[seen]))
    for frame in ticks[:swap]:
        p.process(frame)
    raised = Prediction(float(ticks[swap - 1].ts[0]), "gpu", SLOT, "thermal_throttle", 6 * 3600.0, 0.9, "thermal",
                        "old board")
    other = Prediction(raised.ts, "gpu", SLOT + 1, "thermal_throttle", 6 * 3600.0, 0.9, "thermal", "stays")
    p.store.observe_findings([raised, other])
    findings = p.process(ticks[swap])
    withdrawn = [f for f in findings if isinstance(f, Prediction) and not f.active]
    assert [(f.slot, f.event, f.ts) for f in withdrawn] == [(SLOT, "thermal_throttle", float(ticks[swap].ts[0]))]
    assert [(f.slot, f.reason) for f in p.store.snapshot().predictions] == [(SLOT + 1, "stays")]
    assert seen.predictions == [(SLOT, False)]


def test_a_uuid_not_read_is_no_sensor_going_dark() -> None:
    """Its source counts a UUID it could not read; the guard does not count the NaN board_id again
    as a missing value, as it would a temperature once reported."""
    topology = small_topology(nodes=1, gpus=2, racks=1)
    health = PipelineHealth()
    guard = InputGuard(topology, health)
    for ts, board in ((10.0, 1.0), (20.0, math.nan), (30.0, math.nan)):
        guard.check(Frame("gpu", np.full(2, ts), np.arange(2),
                          {"board_id": np.full(2, board), "gpu_temp": np.full(2, 50.0 if ts < 30 else math.nan)}))
    assert health.problems == {("guard", "missing_values"): 2}  # the temperatures of the last tick only


def test_a_source_hashes_each_uuid_once_and_keeps_no_more_numbers_than_its_page_needs() -> None:
    """Boards swapped again and again (1,200 UUIDs through two slots): each row's number is its
    UUID's, and the numbers kept stay bounded by the page, not by every board ever seen."""
    topology = small_topology(nodes=1, gpus=2, racks=1)
    boards = GpuBoards(PipelineHealth(), "nvml")
    names = topology.names("gpu")
    for poll in range(600):
        uuids = {name: f"GPU-{poll:04d}-{i}" for i, name in enumerate(names)}
        batch = boards.tag(SampleBatch("gpu", names, np.full(2, float(poll)), np.arange(2)), uuids, topology)
        assert batch.columns["board_id"].tolist() == [uuid_number(uuids[name]) for name in names]
        assert len(boards._ids) <= 2 * len(names) + 1024 + len(names)
    assert boards.health.gpus_replaced == {"nvml": 2 * 599}
