"""A GPU's learnt state follows its board when its node's GPU indices shift.

A node rebooting with one GPU missing (fallen off the bus, pulled for RMA) enumerates the others in
PCI order: every GPU after the missing one reports one index lower, and the last index goes silent.
Read as board swaps, the moved boards' detector state (thermal fit, cooling baseline, power trend)
restarted and the detectors were blind on healthy GPUs for their warm-up. A board last read in
another slot of the same node now takes its state along (``InputGuard.follow_boards``,
``DetectorBank.move_gpus``); a board new to the node still starts afresh; the slot a board left
with none coming in starts afresh, and what was predicted there is withdrawn."""

from __future__ import annotations

import logging
import math
import signal
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.bank import DetectorBank, follow_predictions
from foreshock.detectors.evaluation import _BoardSwaps
from foreshock.findings import Finding, Incident, Prediction
from foreshock.frames import Frame
from foreshock.guard import PARK_FOR_S, BoardSwap, InputGuard
from foreshock.health import PipelineHealth
from foreshock.remap import Remap
from foreshock.streams.embedded import EmbeddedPipeline
from foreshock.streams.kafka_codec import PartitionMap, encode_bundle
from foreshock.streams.kafka_worker import DetectionStage
from foreshock.streams.polling import GpuBoards
from foreshock.streams.samples import SampleBatch
from foreshock.topology import Topology

from board_ids import Seen
from thermal_synth import Fault, World, small_topology

TICKS = 240  # 40 min at 10 s
BEFORE = 120  # ticks read in place before the first shift
MISSING = 3  # node0/gpu3 falls off the bus
GPUS = 8  # per node: node0 holds slots 0-7, node1 slots 8-15


def board(physical: np.ndarray | int) -> Any:
    """The board_id of the GPU that sat at slot ``physical`` at the start."""
    return 1000.0 + np.asarray(physical, dtype=float)


def in_place(frame: Frame) -> Frame:
    """A GPU frame with each GPU's board read in its own slot."""
    if frame.kind != "gpu":
        return frame
    return Frame("gpu", frame.ts, frame.slot, {**frame.columns, "board_id": board(frame.slot)})


def shifted(frame: Frame, missing: int = MISSING) -> Frame:
    """A GPU frame as node0 reads it after a reboot without its GPU ``missing``: that GPU's rows
    gone, each later GPU's rows (its board's) under the index one lower, the last index silent."""
    if frame.kind != "gpu":
        return frame
    keep = frame.slot != missing
    physical = frame.slot[keep]
    slot = np.where((physical > missing) & (physical < GPUS), physical - 1, physical)
    columns = {name: column[keep] for name, column in frame.columns.items()}
    return Frame("gpu", frame.ts[keep], slot, {**columns, "board_id": board(physical)})


def with_boards(frame: Frame, boards: dict[int, float]) -> Frame:
    """``frame`` with the boards read in place but in the slots ``boards`` names (slot -> board)."""
    frame = in_place(frame)
    ids = frame.columns["board_id"].copy()
    for slot, value in boards.items():
        ids[frame.slot == slot] = value
    return Frame("gpu", frame.ts, frame.slot, {**frame.columns, "board_id": ids})


@pytest.fixture(scope="module")
def world() -> tuple[Topology, list[Frame]]:
    topology = small_topology(nodes=2, gpus=GPUS, racks=1)
    frames = [f for f in World(topology, seed=3).run(TICKS * 10.0)[0] if f.kind == "gpu"]
    return topology, frames


def pipeline(topology: Topology, names: list[str] | None = None, processors: Any = ()) -> EmbeddedPipeline:
    return EmbeddedPipeline(topology, DetectorBank.from_names(topology, names, processors=processors))


def gpu_rows(bank: DetectorBank) -> dict[tuple[str, str], np.ndarray]:
    """Every detector's per-GPU state arrays (slot on axis 0), copied."""
    state = bank.state_dict()["detectors"]
    return {(d.name, key): np.array(state[d.name][key], copy=True)
            for d in bank.detectors for key, kind in d.slot_kinds.items()
            if kind == "gpu" and key in state[d.name] and isinstance(state[d.name][key], np.ndarray)}


def after_each_swap(p: EmbeddedPipeline) -> list[dict[tuple[str, str], np.ndarray]]:
    """The GPU state right after each board swap the pipeline handles (before the rows after it)."""
    seen: list[dict[tuple[str, str], np.ndarray]] = []
    handle = p._board_swapped

    def noted(swap: BoardSwap) -> list[Finding]:
        out = handle(swap)
        seen.append(gpu_rows(p.bank))
        return out

    p._board_swapped = noted  # type: ignore[method-assign]
    return seen


def assert_rows(got: dict[tuple[str, str], np.ndarray], want: Callable[[tuple[str, str], int], np.ndarray],
                slots: range | list[int]) -> None:
    for key, rows in got.items():
        for slot in slots:
            np.testing.assert_array_equal(rows[slot], want(key, slot), err_msg=f"{key} slot {slot}")


# ---- the guard -----------------------------------------------------------------------------------
def hand_frame(ts: float, slots: list[int], boards: list[float]) -> Frame:
    return Frame("gpu", np.full(len(slots), ts), np.array(slots), {"board_id": np.array(boards, dtype=float)})


def swaps(guard: InputGuard, frame: Frame) -> list[BoardSwap]:
    return [swap for _, swap in guard.split_by_board(frame) if swap is not None]


def test_the_guard_says_where_each_moved_board_was_read_before() -> None:
    topology = small_topology(nodes=2, gpus=GPUS, racks=1)
    guard = InputGuard(topology, PipelineHealth())
    every = list(range(2 * GPUS))
    assert swaps(guard, hand_frame(10.0, every, board(every).tolist())) == []
    # node0 without gpu3: 4..7 read at 3..6, 7 silent
    (swap,) = swaps(guard, hand_frame(20.0, every[:7] + every[8:], board([0, 1, 2, 4, 5, 6, 7] + every[8:]).tolist()))
    assert swap.slots.tolist() == [3, 4, 5, 6] and swap.came_from.tolist() == [4, 5, 6, 7]
    assert swap.left.tolist() == [7] and not swap.replaced.any()
    assert swap.moves_by_node(topology) == {0: [(4, 3), (5, 4), (6, 5), (7, 6)]}
    assert math.isnan(guard.s_board[7])  # no board there now
    assert swap.parked.tolist() == [3] and guard.parked == {(0, board(3)): 20.0}  # gpu3's board, displaced
    # gpu3 back: 3 is a board held nowhere but parked on node0 (its state comes back), 4..6 move
    # up, and so does 7 into the slot that held none
    (swap,) = swaps(guard, hand_frame(30.0, every, board(every).tolist()))
    assert swap.slots.tolist() == [3, 4, 5, 6, 7] and swap.came_from.tolist() == [-1, 3, 4, 5, 6]
    assert swap.unparked.tolist() == [3] and swap.parked.tolist() == [] and guard.parked == {}
    assert swap.left.tolist() == [] and swap.moved.all() and not swap.replaced.any()
    np.testing.assert_array_equal(guard.s_board, board(every))
    # a cycle of three on node1, and a board of node0 read on node1 (and node1's on node0): not moves
    boards = board(every)
    boards[[8, 9, 10]] = board([10, 8, 9])
    boards[[2, 12]] = board([12, 2])
    (swap,) = swaps(guard, hand_frame(40.0, every, boards.tolist()))
    assert swap.slots.tolist() == [2, 8, 9, 10, 12] and swap.came_from.tolist() == [-1, 10, 8, 9, -1]
    assert swap.left.tolist() == [] and swap.replaced.tolist() == [True, False, False, False, True]
    assert guard.parked == {(0, board(2)): 40.0, (1, board(12)): 40.0}  # the boards displaced, by node
    # nothing changing: nothing said
    assert swaps(guard, hand_frame(50.0, every, boards.tolist())) == []


@settings(max_examples=25, deadline=None)
@given(st.permutations(range(2 * GPUS)))
def test_a_nodes_gpus_stamped_apart_are_read_renumbered_at_once(order: list[int]) -> None:
    """Each GPU's rows stamped with its own sample time (milliseconds apart, in any order): the
    shift down and back are each one swap of the whole node, with the moves of the same rows
    stamped alike. One at a time, the board read first in the slot another had just left found
    its state gone (back up, gpu3's new board displaced gpu4's before gpu4's row came)."""
    topology = small_topology(nodes=2, gpus=GPUS, racks=1)
    guard = InputGuard(topology, PipelineHealth())
    every = list(range(2 * GPUS))
    apart = np.array(order) * 0.001

    def stamped(ts: float, slots: list[int], boards: list[int]) -> Frame:
        return Frame("gpu", ts + apart[slots], np.array(slots), {"board_id": board(boards)})

    guard.board_change(stamped(10.0, every, every))
    down = [0, 1, 2, 4, 5, 6, 7] + every[GPUS:]
    (swap,) = swaps(guard, stamped(20.0, every[:7] + every[GPUS:], down))
    assert swap.ts == 20.0 + apart[[3, 4, 5, 6]].min()
    assert swap.slots.tolist() == [3, 4, 5, 6] and swap.came_from.tolist() == [4, 5, 6, 7]
    assert swap.left.tolist() == [7]
    (swap,) = swaps(guard, stamped(30.0, every, every))
    assert swap.ts == 30.0 + apart[[3, 4, 5, 6, 7]].min()
    assert sorted(zip(swap.slots.tolist(), swap.came_from.tolist())) == [(3, -1), (4, 3), (5, 4), (6, 5), (7, 6)]
    np.testing.assert_array_equal(guard.s_board, board(every))


def test_a_later_change_of_a_gpu_read_in_between_is_its_own() -> None:
    """Rows of another GPU of the node read between the first change and its own (a catch-up
    frame of several ticks): its change comes at its own time, not with the first."""
    topology = small_topology(nodes=1, gpus=4, racks=1)
    guard = InputGuard(topology, PipelineHealth())
    guard.board_change(hand_frame(10.0, [0, 1, 2, 3], board([0, 1, 2, 3]).tolist()))
    frame = Frame("gpu", np.array([20.0, 20.0, 30.0, 30.0]), np.array([0, 1, 0, 1]),
                  {"board_id": board([9, 1, 9, 8])})
    assert [(swap.ts, swap.slots.tolist()) for swap in swaps(guard, frame)] == [(20.0, [0]), (30.0, [1])]


def test_a_rearranged_remap_takes_each_gpus_rows_from_the_slot_it_names() -> None:
    topology = small_topology(nodes=1, gpus=4, racks=1)
    remap = Remap.rearranged(topology, np.array([1, 0, -1, 2]))
    saved = np.array([[10.0, 11.0], [20.0, 21.0], [30.0, 31.0], [40.0, 41.0]])
    fresh = np.full((4, 2), -1.0)
    np.testing.assert_array_equal(remap.rows("gpu", saved, fresh), [[20.0, 21.0], [10.0, 11.0], [-1, -1], [30.0, 31.0]])
    assert remap.slots("gpu", np.array([0, 1, 2, 3, -1])).tolist() == [1, 0, 3, -1, -1]  # 3's state went nowhere
    assert remap.old_of_new["node"].tolist() == [0]  # every other kind stays as it is
    with pytest.raises(ValueError):
        Remap.rearranged(topology, np.array([0, 1]))


# ---- the embedded pipeline ---------------------------------------------------------------------
def test_a_gpu_missing_at_a_reboot_moves_the_later_boards_state_one_index_down(world, caplog) -> None:
    """Each moved board's detector state after the shift, in its new slot, is its state before;
    the silent last index starts afresh; node1 and node0's GPUs before the missing one keep theirs.
    No GPU is counted as replaced; one line says which boards moved."""
    topology, frames = world
    p = pipeline(topology)
    for frame in frames[:BEFORE]:
        p.process(in_place(frame))
    before, fresh = gpu_rows(p.bank), gpu_rows(pipeline(topology).bank)
    learnt = [key for key, rows in before.items() if not np.array_equal(rows[4:8], fresh[key][4:8], equal_nan=True)]
    assert {("thermal", "s_model"), ("cooling", "s_gpu_base"), ("power", "s_gpu")} <= set(learnt)
    seen = after_each_swap(p)
    with caplog.at_level(logging.WARNING, logger="foreshock.pipeline"):
        p.process(shifted(frames[BEFORE]))
    (after,) = seen
    assert_rows(after, lambda key, slot: before[key][slot + 1], [3, 4, 5, 6])
    assert_rows(after, lambda key, slot: fresh[key][slot], [7])
    assert_rows(after, lambda key, slot: before[key][slot], [0, 1, 2, *range(GPUS, 2 * GPUS)])
    assert not p.health.gpus_replaced
    assert p.health.gpus_moved == {"guard": 4}
    assert [r.getMessage() for r in caplog.records] == [
        "node0: GPU boards moved to other indices (a GPU missing, or back, at a reboot?): node0/gpu4 -> node0/gpu3, "
        "node0/gpu5 -> node0/gpu4, node0/gpu6 -> node0/gpu5, node0/gpu7 -> node0/gpu6; their detector state and "
        "predictions follow them; no board now in node0/gpu7: started afresh"]


def test_the_reverse_shift_puts_each_board_back_and_the_returning_board_finds_its_own_state(world) -> None:
    """Back with all eight GPUs (the missing one reseated): the boards that had moved down one
    index move back up with their state; the returning board's state, set aside when another
    board took its slot, is its own again, as it was when it went missing: no board is new. (Its
    state went with the displaced board: it started afresh and was counted a replacement.)"""
    topology, frames = world
    p = pipeline(topology)
    back = BEFORE + 30
    for frame in frames[:BEFORE]:
        p.process(in_place(frame))
    when_it_went = gpu_rows(p.bank)
    for frame in frames[BEFORE:back]:
        p.process(shifted(frame))
    before = gpu_rows(p.bank)
    assert list(p.bank.parked) == [(0, board(MISSING))]
    seen = after_each_swap(p)
    p.process(in_place(frames[back]))
    (after,) = seen
    assert_rows(after, lambda key, slot: before[key][slot - 1], [4, 5, 6, 7])
    assert_rows(after, lambda key, slot: when_it_went[key][slot], [MISSING])
    assert_rows(after, lambda key, slot: before[key][slot], [0, 1, 2, *range(GPUS, 2 * GPUS)])
    np.testing.assert_array_equal(p.guard.s_board, board(np.arange(2 * GPUS)))
    assert not p.health.gpus_replaced
    assert p.health.gpus_moved == {"guard": 4 + 5}  # down, then back up, gpu3's own board with them
    assert p.bank.parked == {} and p.guard.parked == {}


def test_two_boards_trading_slots_each_take_their_own_state_and_a_new_board_starts_afresh(world) -> None:
    topology, frames = world
    p = pipeline(topology)
    for frame in frames[:BEFORE]:
        p.process(in_place(frame))
    before, fresh = gpu_rows(p.bank), gpu_rows(pipeline(topology).bank)
    seen = after_each_swap(p)
    p.process(with_boards(frames[BEFORE], {0: board(1), 1: board(0), 2: 5000.0}))
    (after,) = seen
    assert_rows(after, lambda key, slot: before[key][1 - slot], [0, 1])
    assert_rows(after, lambda key, slot: fresh[key][slot], [2])
    assert_rows(after, lambda key, slot: before[key][slot], range(3, 2 * GPUS))
    assert p.health.gpus_replaced == {"guard": 1}  # the new board only
    assert p.health.gpus_moved == {"guard": 2}


def test_boards_never_move_between_nodes(world) -> None:
    """node0/gpu4's board read at node1/gpu4 and node1/gpu4's at node0/gpu4 are new boards to their
    nodes: both start afresh (a move between nodes is not a renumbering); node1/gpu0 and gpu1
    trading places at the same time move."""
    topology, frames = world
    p = pipeline(topology)
    for frame in frames[:BEFORE]:
        p.process(in_place(frame))
    before, fresh = gpu_rows(p.bank), gpu_rows(pipeline(topology).bank)
    seen = after_each_swap(p)
    p.process(with_boards(frames[BEFORE], {4: board(12), 12: board(4), 8: board(9), 9: board(8)}))
    (after,) = seen
    assert_rows(after, lambda key, slot: fresh[key][slot], [4, 12])
    assert_rows(after, lambda key, slot: before[key][17 - slot], [8, 9])
    assert p.health.gpus_replaced == {"guard": 2}
    assert p.health.gpus_moved == {"guard": 2}


def test_what_was_predicted_where_a_board_left_is_withdrawn_and_a_moved_boards_follows_it(world) -> None:
    """Predictions about node0/gpu3 (its board gone), gpu4 (its board moved to gpu3) and gpu7 (its
    board moved to gpu6, none came): gpu3's and gpu7's are withdrawn, gpu4's and gpu7's made again
    where their boards are now, with the same time of the event; gpu1's is left alone."""
    topology, frames = world
    seen = Seen()
    p = pipeline(topology, ["thermal"], processors=[seen])
    for frame in frames[:BEFORE]:
        p.process(in_place(frame))
    ts = float(frames[BEFORE - 1].ts[0])
    when = float(frames[BEFORE].ts[0])
    raised = [Prediction(ts, "gpu", slot, "thermal_throttle", 3600.0, 0.9, "thermal", f"board {slot}")
              for slot in (1, 3, 4, 7)]
    raised.append(Prediction(ts, "gpu", 3, "hbm_overheat", 1800.0, 0.8, "thermal", "board 3's HBM"))
    p.store.observe_findings(raised)
    findings = p.process(shifted(frames[BEFORE]))
    changed = sorted((f.slot, f.event, f.active, f.reason) for f in findings if isinstance(f, Prediction))
    # gpu3's thermal_throttle is replaced by the one that moved in, not withdrawn and raised again
    assert changed == [
        (3, "hbm_overheat", False, "withdrawn: another board in the GPU's slot"),
        (3, "thermal_throttle", True, "board 4 (its board moved from node0/gpu4)"),
        (4, "thermal_throttle", False, "withdrawn: the GPU's board moved to node0/gpu3"),
        (6, "thermal_throttle", True, "board 7 (its board moved from node0/gpu7)"),
        (7, "thermal_throttle", False, "withdrawn: the GPU's board moved to node0/gpu6")]
    assert all(f.ts == when for f in findings)
    assert sorted(seen.predictions) == [(3, False), (3, True), (4, False), (6, True), (7, False)]
    now = {(f.slot, f.event): f for f in p.store.snapshot().predictions}
    assert sorted(now) == [(1, "thermal_throttle"), (3, "thermal_throttle"), (6, "thermal_throttle")]
    moved = now[3, "thermal_throttle"]
    assert moved.ts + moved.eta_s == pytest.approx(ts + 3600.0)  # the same time of the event
    assert now[1, "thermal_throttle"] == raised[0]


def test_a_moved_boards_prediction_stays_active_in_its_new_slot_without_a_warm_up() -> None:
    """A GPU whose thermal interface degrades is predicted to throttle; then its node reboots
    without an earlier GPU, and it reads one index lower. The prediction is active there from the
    move on, every tick, never withdrawn (the detector's state, moved with the board, knows it
    raised it); the slot it left holds none. Restarted, the detector was blind there for its
    warm-up, and the prediction was withdrawn."""
    topology = small_topology(nodes=2, gpus=GPUS, racks=1)
    frames, _ = World(topology, faults=[Fault("tim_degradation", 5, 1800, 0.6, "f1")], seed=1).run(3 * 3600)
    p = pipeline(topology, ["thermal"])
    shift = None
    for i, frame in enumerate(frames):
        predicted = [f for f in p.process(in_place(frame)) if isinstance(f, Prediction)]
        if predicted:
            assert {(f.slot, f.active) for f in predicted} == {(5, True)}
            shift = i + 6  # a minute after the first prediction
            break
    assert shift is not None
    for i in range(i + 1, shift):
        p.process(in_place(frames[i]))
    after: list[Prediction] = []
    for frame in frames[shift:shift + 400]:
        after += [f for f in p.process(shifted(frame)) if isinstance(f, Prediction)]
        if frame.kind == "gpu":
            active = {(f.slot, f.event) for f in p.store.snapshot().predictions}
            assert active == {(4, "thermal_throttle")}
    assert [(f.slot, f.active) for f in after if f.slot != 4] == [(5, False)]  # at the move
    assert all(f.active for f in after if f.slot == 4)


# ---- the evaluation ----------------------------------------------------------------------------
def test_the_evaluation_moves_a_boards_state_and_predictions_as_the_pipeline_does(world) -> None:
    topology, frames = world
    bank = DetectorBank.from_names(topology, processors=())
    health = PipelineHealth()
    guard = InputGuard(topology, health)
    evaluation = _BoardSwaps(bank, guard)
    for frame in frames[:BEFORE]:
        evaluation.update(guard.check(in_place(frame)))
    raised = Prediction(float(frames[BEFORE - 1].ts[0]), "gpu", 7, "thermal_throttle", 3600.0, 0.9, "thermal", "b7")
    evaluation._keep([raised])
    before, fresh = gpu_rows(bank), gpu_rows(DetectorBank.from_names(topology, processors=()))
    noted: list[dict[tuple[str, str], np.ndarray]] = []
    move = bank.move_gpus
    bank.move_gpus = lambda take, state: (move(take, state), noted.append(gpu_rows(bank)))[0]  # type: ignore[method-assign]
    found = evaluation.update(guard.check(shifted(frames[BEFORE])))
    (after,) = noted
    assert_rows(after, lambda key, slot: before[key][slot + 1], [3, 4, 5, 6])
    assert_rows(after, lambda key, slot: fresh[key][slot], [7])
    assert not health.gpus_replaced
    assert [(f.slot, f.active) for f in found if isinstance(f, Prediction)] == [(7, False), (6, True)]
    assert [key[-1] for key in evaluation.active] == [6]


# ---- the sources ------------------------------------------------------------------------------
def test_a_source_counts_boards_read_at_other_indices_of_their_host_as_moved_not_replaced(caplog) -> None:
    """The sources reading UUIDs (dcgm, nvidia-smi, NVML: ``GpuBoards``) count a board read at
    another GPU of its host as moved, logged once per host, and only a UUID new to the host as a
    replacement: the shift down and back up counted 4 and 5 replacements at the source stage while
    the pipeline moved the boards' state. Judged against the UUIDs before the poll: on the way back
    gpu4 reads the UUID gpu3 held until this same poll."""
    topology = small_topology(nodes=2)
    names = topology.gpus[:2 * GPUS]
    uuid = {name: f"GPU-{i:04d}" for i, name in enumerate(names)}
    boards = GpuBoards(PipelineHealth(), "dcgm")
    empty = SampleBatch("gpu", [], np.empty(0), np.empty(0, dtype=np.int32))

    def poll(read: dict[str, str]) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="foreshock"):
            boards.tag(empty, read, topology)
        return [r.getMessage() for r in caplog.records]

    assert poll(uuid) == []
    # node0/gpu3 missing: gpu4..7's boards read one index lower, gpu7 not read
    down = {**uuid, **{f"node0/gpu{i}": uuid[f"node0/gpu{i + 1}"] for i in range(MISSING, GPUS - 1)}}
    del down["node0/gpu7"]
    told = poll(down)
    assert boards.health.gpus_moved == {"dcgm": 4} and not boards.health.gpus_replaced
    assert told == ["node0: GPU boards read at other indices (a GPU missing, or back, at a reboot?): node0/gpu4 -> "
                    "node0/gpu3, node0/gpu5 -> node0/gpu4, node0/gpu6 -> node0/gpu5, node0/gpu7 -> node0/gpu6; "
                    "their detector state follows them where their rows are processed"]
    # back: gpu3's own board is held nowhere now (a new board to the source too), the others move up
    told = poll(uuid)
    # gpu3's own board, displaced at the shift and read nowhere since, is back on its node: moved,
    # as the pipeline's guard unparks it. (gpu7 reads the board it last read there: no change to
    # the source, which never read another at gpu7; the guard, which emptied gpu7, counts it moved.)
    assert boards.health.gpus_moved == {"dcgm": 4 + 4} and not boards.health.gpus_replaced
    assert told == ["node0: GPU boards read at other indices (a GPU missing, or back, at a reboot?): (away) -> "
                    "node0/gpu3, node0/gpu3 -> node0/gpu4, node0/gpu4 -> node0/gpu5, node0/gpu5 -> node0/gpu6; "
                    "their detector state follows them where their rows are processed"]
    # a board of node0 read on node1: new to node1, as node1's is to node0
    across = {**uuid, "node0/gpu0": uuid["node1/gpu0"], "node1/gpu0": uuid["node0/gpu0"]}
    poll(across)
    assert boards.health.gpus_moved == {"dcgm": 8} and boards.health.gpus_replaced == {"dcgm": 2}
    # an RMA: a UUID new to the host is a replacement
    poll({**across, "node0/gpu1": "GPU-new"})
    assert boards.health.gpus_replaced == {"dcgm": 3}


# ---- a board read twice, a renumbering read in pieces or with a board unread (review h24) -------
class _StillRunning(Exception):
    pass


@contextmanager
def ends_within(seconds: int) -> Iterator[None]:
    """Fail where the block runs longer than ``seconds`` (``split_by_board`` looping for ever)."""
    def alarm(*_: Any) -> None:
        raise _StillRunning()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    except _StillRunning:
        pytest.fail(f"still running after {seconds} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_board_read_in_two_slots_of_its_node_at_once_is_a_new_board_in_the_other() -> None:
    """node0/gpu3 reads gpu4's board while gpu4 still reads it (one bad row from a source): gpu3
    reads a new board, its own parked; gpu4 keeps its board. Read right again, gpu3's board takes
    its state back. (The state moved from gpu4 to gpu3 and back for ever: the pipeline hung, and
    a Kafka worker would replay the record after every restart.)"""
    topology = small_topology(nodes=1, gpus=GPUS, racks=1)
    health = PipelineHealth()
    guard = InputGuard(topology, health)
    every = list(range(GPUS))
    swaps(guard, hand_frame(10.0, every, board(every).tolist()))
    boards = board(every)
    boards[3] = board(4)
    with ends_within(5):
        found = swaps(guard, hand_frame(20.0, every, boards.tolist()))
    (swap,) = found
    assert swap.slots.tolist() == [3] and swap.came_from.tolist() == [-1] and swap.left.tolist() == []
    assert swap.replaced.tolist() == [True] and swap.parked.tolist() == [3]
    assert guard.s_board[[3, 4]].tolist() == [board(4), board(4)]
    (swap,) = swaps(guard, hand_frame(30.0, every, board(every).tolist()))
    assert swap.slots.tolist() == [3] and swap.unparked.tolist() == [3] and swap.moved.tolist() == [True]
    assert swap.parked.tolist() == []  # the second read of gpu4's board: gpu4 holds the board's state
    np.testing.assert_array_equal(guard.s_board, board(every))
    # a slot holding no board (gpu7, after the shift down) reading the board gpu6 still reads: a
    # first board there, not a move (the same loop, through the first boards)
    swaps(guard, hand_frame(40.0, every[:7], board([0, 1, 2, 4, 5, 6, 7]).tolist()))
    boards = board([0, 1, 2, 4, 5, 6, 7, 7])
    with ends_within(5):
        assert swaps(guard, hand_frame(50.0, every, boards.tolist())) == []
    np.testing.assert_array_equal(guard.s_board, boards)
    assert not health.problems


def test_boards_moving_back_and_forth_end_the_split_and_are_counted(monkeypatch) -> None:
    """Should the guard's logic ever move a board back and forth within one frame (here: the
    duplicate read above, with the check that its holder still reads it defeated), the split
    still ends: a change no later than the one before is the last, counted, and the rest of the
    frame is processed as it is, each row once."""
    never = classmethod(lambda cls, frame, holders, boards, readers, since: np.zeros(len(holders), dtype=bool))
    monkeypatch.setattr(InputGuard, "_still_holds", never)
    topology = small_topology(nodes=1, gpus=GPUS, racks=1)
    health = PipelineHealth()
    guard = InputGuard(topology, health)
    every = list(range(GPUS))
    swaps(guard, hand_frame(10.0, every, board(every).tolist()))
    boards = board(every)
    boards[3] = board(4)
    with ends_within(5):
        parts = list(guard.split_by_board(hand_frame(20.0, every, boards.tolist())))
    assert [swap is None for _, swap in parts] == [False, False, True]
    assert sum(len(rows) for rows, _ in parts) == GPUS
    assert health.problems == {("guard", "board_changes_unsettled"): 1}


def test_the_pipeline_handed_a_board_read_twice_goes_on_and_keeps_both_boards_state(world) -> None:
    topology, frames = world
    p = pipeline(topology)
    for frame in frames[:BEFORE]:
        p.process(in_place(frame))
    before = gpu_rows(p.bank)
    seen = after_each_swap(p)
    with ends_within(30):
        p.process(with_boards(frames[BEFORE], {3: board(4)}))
    p.process(in_place(frames[BEFORE + 1]))
    first, second = seen
    assert_rows(first, lambda key, slot: before[key][slot], [4])  # gpu4's board's state stays with gpu4
    assert_rows(second, lambda key, slot: before[key][slot], [3])  # gpu3's board back: its state from before
    assert p.health.gpus_replaced == {"guard": 1} and p.health.gpus_moved == {"guard": 1}
    assert p.bank.parked == {} and p.guard.parked == {}


def test_a_shift_read_in_two_pieces_high_slots_first_keeps_every_boards_state(world) -> None:
    """The shift poll cut into two pieces by row order with the same stamps (Kafka agents cut a
    partition's frame into pieces), gpu5..6's rows first: board 1005 (gpu5 before, gpu4 now) still
    takes its state to gpu4, from the parking: the first piece moved 1006 into gpu5 before gpu4's
    row said where 1005 went. (1005's state was discarded; gpu4 then read a board held nowhere:
    an "RMA", afresh.)"""
    topology, frames = world
    p = pipeline(topology)
    for frame in frames[:BEFORE]:
        p.process(in_place(frame))
    before = gpu_rows(p.bank)
    seen = after_each_swap(p)
    f = shifted(frames[BEFORE])
    high = np.isin(f.slot, [5, 6])
    p.process(f.take(high))
    p.process(f.take(~high))
    assert len(seen) == 2
    assert_rows(seen[-1], lambda key, slot: before[key][5], [4])  # as it was parked, before the first piece
    for key in (("thermal", "s_model"), ("cooling", "s_gpu_base"), ("power", "s_gpu")):  # learnt, per board
        np.testing.assert_array_equal(seen[-1][key][3], before[key][4], err_msg=str(key))
    assert not p.health.gpus_replaced and p.health.gpus_moved == {"guard": 4}
    assert list(p.bank.parked) == list(p.guard.parked) == [(0, board(MISSING))]  # the missing GPU's


def test_the_shift_back_read_in_two_pieces_moves_every_board() -> None:
    """Back up (gpu3 reseated) in two pieces, gpu0..4 then gpu5..7: gpu4's board before (1005) was
    displaced by 1004 before gpu5's row read it: parked, it moves on. (It was counted new.)"""
    topology = small_topology(nodes=1, gpus=GPUS, racks=1)
    guard = InputGuard(topology, PipelineHealth())
    every = list(range(GPUS))
    swaps(guard, hand_frame(10.0, every, board(every).tolist()))
    swaps(guard, hand_frame(20.0, every[:7], board([0, 1, 2, 4, 5, 6, 7]).tolist()))
    low, high = (swaps(guard, hand_frame(30.0, part, board(part).tolist())) for part in (every[:5], every[5:]))
    (low,), (high,) = low, high
    assert (low.slots.tolist(), low.came_from.tolist(), low.unparked.tolist()) == ([3, 4], [-1, 3], [3])
    assert (high.slots.tolist(), high.came_from.tolist(), high.unparked.tolist()) == ([5, 6, 7], [-1, 5, 6], [5])
    assert low.moved.all() and high.moved.all() and guard.parked == {}
    np.testing.assert_array_equal(guard.s_board, board(every))


def test_a_board_not_read_in_the_shift_poll_keeps_its_state(world) -> None:
    """gpu4's UUID not read in the shift poll (board_id NaN), read at the next: board 1005 still
    finds its state there. (gpu5's state, 1005's, was overwritten by 1006's at the shift, gpu4
    started afresh, and at the next poll 1005 was a first board there: lost, neither moved nor
    replaced.)"""
    topology, frames = world
    p = pipeline(topology)
    for frame in frames[:BEFORE]:
        p.process(in_place(frame))
    before = gpu_rows(p.bank)
    seen = after_each_swap(p)
    f = shifted(frames[BEFORE])
    ids = f.columns["board_id"].copy()
    ids[f.slot == 4] = np.nan
    p.process(Frame("gpu", f.ts, f.slot, {**f.columns, "board_id": ids}))
    p.process(shifted(frames[BEFORE + 1]))
    assert len(seen) == 2
    assert_rows(seen[-1], lambda key, slot: before[key][5], [4])
    assert p.health.gpus_moved == {"guard": 4} and not p.health.gpus_replaced


def test_a_node_parks_at_most_as_many_boards_as_it_has_gpus_and_for_a_day(world) -> None:
    """Ten boards in turn in node0/gpu0 (RMAs): each displaced one is parked, node0 keeps its
    last eight (its GPU count), the bank the same boards' rows; a day of telemetry later the next
    change anywhere gives them up."""
    topology, frames = world
    p = pipeline(topology)
    for frame in frames[:10]:
        p.process(in_place(frame))
    dropped: list[tuple[int, float]] = []
    handle = p._board_swapped
    p._board_swapped = lambda swap: (dropped.extend(swap.dropped), handle(swap))[1]  # type: ignore[method-assign]
    for i, frame in enumerate(frames[10:20]):
        p.process(with_boards(frame, {0: 5000.0 + i}))
    assert dropped == [(0, board(0)), (0, 5000.0)]
    assert list(p.guard.parked) == [(0, 5000.0 + i) for i in range(1, 9)]
    assert list(p.bank.parked) == list(p.guard.parked)
    last = frames[20]
    later = Frame("gpu", last.ts + PARK_FOR_S + 100.0, last.slot, last.columns)
    p.process(with_boards(later, {0: 5009.0, 8: 6000.0}))  # node1/gpu0 swapped too, a day on
    assert dropped[2:] == [(0, 5000.0 + i) for i in range(1, 9)]
    assert list(p.guard.parked) == list(p.bank.parked) == [(1, board(8))]


def test_a_carried_prediction_keeps_an_unknown_eta_and_says_once_where_its_board_moved_from() -> None:
    """A moved board's prediction with no finite forecast (``eta_s`` -1) stays unknown, not due
    now (0); a known ETA is shortened by the time since; moved again, its reason names the last
    slot only (the suffix grew with each move)."""
    swap = BoardSwap(100.0, np.array([3]), np.array([board(3)]), np.array([board(4)]), np.array([4]), np.array([4]))
    unknown = Prediction(90.0, "gpu", 4, "power_cap", -1.0, 0.7, "power", "heading for the limit")
    known = Prediction(90.0, "gpu", 4, "thermal_throttle", 600.0, 0.9, "thermal", "hot")

    def name(slot: int) -> str:
        return f"node0/gpu{slot}"

    carried = {f.event: f for f in follow_predictions(swap, [unknown, known], name) if f.active}
    assert carried["power_cap"].eta_s == -1.0
    assert carried["thermal_throttle"].eta_s == 590.0
    assert carried["thermal_throttle"].reason == "hot (its board moved from node0/gpu4)"
    again = BoardSwap(200.0, np.array([2]), np.array([board(2)]), np.array([board(4)]), np.array([3]), np.array([3]))
    (moved,) = [f for f in follow_predictions(again, [carried["thermal_throttle"]], name) if f.active]
    assert moved.reason == "hot (its board moved from node0/gpu3)"
    assert moved.eta_s == 490.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-2, 11), min_size=GPUS, max_size=GPUS), min_size=1, max_size=5),
       st.lists(st.integers(1, 3), min_size=5, max_size=5), st.lists(st.integers(0, 3), min_size=GPUS, max_size=GPUS))
def test_any_reads_of_a_nodes_boards_settle(polls: list[list[int]], pieces: list[int], apart: list[int]) -> None:
    """Any boards read in a node's slots (-2: no row, -1: not read, else one of twelve boards:
    the node's own, new ones, and the same board in two slots), each poll's GPUs stamped up to
    3 ms apart and cut into up to three pieces by row order: every split ends with at most one
    cut per time stamp, never counted unsettled; no board is both held and parked on the node,
    which parks no more boards than it has GPUs; a swap's moves come each from another slot of
    the node, each slot's board from one slot at most."""
    topology = small_topology(nodes=1, gpus=GPUS, racks=1)
    health = PipelineHealth()
    guard = InputGuard(topology, health)
    every = np.arange(GPUS)
    guard.board_change(hand_frame(0.0, every.tolist(), board(every).tolist()))
    for i, poll in enumerate(polls):
        reads = np.array(poll)
        rows = every[reads > -2]
        ids = np.where(reads[rows] >= 0, board(reads[rows]), np.nan)
        frame = Frame("gpu", 10.0 * (i + 1) + 0.001 * np.array(apart)[rows], rows, {"board_id": ids})
        for piece in np.array_split(np.arange(len(rows)), pieces[i]):
            part = guard.check(frame.take(piece))
            with ends_within(5):
                parts = list(guard.split_by_board(part))
            assert len(parts) <= len(np.unique(part.ts)) + 1
            for _, swap in parts[:-1]:
                assert swap is not None
                came = swap.came_from >= 0
                sources = swap.came_from[came]
                assert len(np.unique(sources)) == len(sources) and not (sources == swap.slots[came]).any()
                assert not np.isin(swap.unparked, swap.slots[came]).any()
            held = {(0, b) for b in guard.s_board[np.isfinite(guard.s_board)].tolist()}
            assert not held & set(guard.parked) and len(guard.parked) <= GPUS
    assert not health.problems


def test_a_kafka_worker_restarted_while_a_board_is_parked_finds_its_state_from_the_checkpoint(world) -> None:
    """node0/gpu3 missing, its board parked, a detection stage checkpoints and is replaced by one
    loading that checkpoint (the agents' pieces, by partition, as they travel); gpu3 comes back:
    its board takes its state from the checkpoint's parked rows, as in a stage that never stopped.
    (Parked in memory only, it started afresh there and counted as a replacement.)"""
    topology, frames = world
    back = BEFORE + 30
    pmap = PartitionMap(topology, 2)
    offsets = {0: 0, 1: 0}
    records: list[tuple[int, int, bytes, Any]] = []
    for seq, frame in enumerate(frames[:back + 10], 1):
        frame = shifted(frame) if BEFORE <= seq - 1 < back else in_place(frame)
        messages = pmap.messages(frame)
        for index, (part, piece) in enumerate(messages):
            value, headers = encode_bundle("agent", 0.0, [(seq, index, len(messages), piece)])
            records.append((part, offsets[part], value, headers))
            offsets[part] += 1
        if seq == back:
            restart = len(records)

    def stage() -> DetectionStage:
        made = DetectionStage(topology, lambda hardware: DetectorBank.from_names(hardware, processors=()), 2)
        for part in range(2):
            made.load(part, None)
        return made

    node0 = int(pmap.partition_of("gpu", np.array([0]))[0])
    never_stopped, first = stage(), stage()
    for record in records:
        never_stopped.process(*record)
    for record in records[:restart]:
        first.process(*record)
    assert list(first.parts[node0].pipeline.bank.parked) == [(0, board(MISSING))]
    blobs = {part: first.checkpoint(part)[1] for part in range(2)}
    second = DetectionStage(topology, lambda hardware: DetectorBank.from_names(hardware, processors=()), 2)
    for part in range(2):
        second.load(part, blobs[part])
    assert second.parts[node0].pipeline.guard.parked == first.parts[node0].pipeline.guard.parked
    for record in records[restart:]:
        second.process(*record)
    assert not second.health.gpus_replaced and second.health.gpus_moved == {"guard": 5}
    assert never_stopped.health.gpus_moved == {"guard": 4 + 5}
    want = gpu_rows(never_stopped.parts[node0].pipeline.bank)
    assert_rows(gpu_rows(second.parts[node0].pipeline.bank), lambda key, slot: want[key][slot], range(GPUS))


def test_an_incident_on_a_moved_board_follows_it_to_its_new_index() -> None:
    """A board with a degrading interface (node0/gpu5) opens an incident; its node reboots without
    gpu3 and the board reads at gpu4. The incident is told again at once under gpu4, in its state;
    it never names gpu5 again nor calls itself growing. Before the engine followed the boards
    (``IncidentEngine.follow_moves``, wired in ``DetectorBank.take_swap``) it held the board's old
    index and took the new one as a second member: "growing, root node0, members gpu5 and gpu4"."""
    topology = small_topology(nodes=2, gpus=GPUS, racks=1)
    frames, _ = World(topology, faults=[Fault("tim_degradation", 5, 1800, 0.6, "f1")], seed=1).run(3 * 3600)
    p = EmbeddedPipeline(topology, DetectorBank.from_names(topology))
    opened = None
    for i, frame in enumerate(frames):
        incidents = [f for f in p.process(in_place(frame)) if isinstance(f, Incident)]
        if incidents:
            assert [(f.root_entity, f.members) for f in incidents] == [("node0/gpu5", ("node0/gpu5",))]
            opened = i
            break
    assert opened is not None, "the degrading interface opened no incident before the shift"
    after = [f for frame in frames[opened + 1:opened + 400] for f in p.process(shifted(frame))
             if isinstance(f, Incident)]
    assert after, "the move told the incident nothing"
    assert {(f.incident_id, f.root_entity, f.members) for f in after} == {("inc-1", "node0/gpu4", ("node0/gpu4",))}
    assert after[0].state == "open" and "growing" not in {f.state for f in after}


def test_a_worker_catching_up_a_gpu_missing_for_two_polls_moves_its_boards_as_poll_by_poll(world) -> None:
    """One frame holding a poll in place, two with gpu3 missing and two back (a worker catching up
    its backlog): the same moves, state and counts as the polls one by one. gpu7 reading its board
    again two polls later is no duplicate read: it had been read at gpu6 in between (review h27:
    the board was taken for one still read by gpu7, gpu6 counted "another board in its slot", and
    the board's rows of those polls went into a fresh state that was then thrown away)."""
    topology, frames = world
    ticks = [in_place(frames[BEFORE]), shifted(frames[BEFORE + 1]), shifted(frames[BEFORE + 2]),
             in_place(frames[BEFORE + 3]), in_place(frames[BEFORE + 4])]
    runs = []
    for joined in (False, True):
        p = pipeline(topology)
        for frame in frames[:BEFORE]:
            p.process(in_place(frame))
        for frame in ([Frame("gpu", np.concatenate([t.ts for t in ticks]), np.concatenate([t.slot for t in ticks]),
                             {k: np.concatenate([t.columns[k] for t in ticks]) for k in ticks[0].columns})]
                      if joined else ticks):
            p.process(frame)
        runs.append(p)
    poll_by_poll, caught_up = runs
    assert caught_up.health.gpus_moved == poll_by_poll.health.gpus_moved == {"guard": 4 + 5}
    assert not caught_up.health.gpus_replaced and not poll_by_poll.health.gpus_replaced
    one, other = gpu_rows(poll_by_poll.bank), gpu_rows(caught_up.bank)
    assert [key for key in one if not np.array_equal(one[key], other[key], equal_nan=True)] == []


def test_a_guards_checkpoint_names_parked_boards_only_when_there_are_some() -> None:
    """Code from before parking reads every key of the guard's state it does not know as an entity
    kind and refuses the checkpoint: with nothing parked the key is left out, so rolling a worker
    back costs only the partitions where a board is parked (review h27: every partition started
    fresh). With a board parked it is written and read back."""
    topology = small_topology(nodes=1, gpus=GPUS, racks=1)
    guard = InputGuard(topology, PipelineHealth())
    every = list(range(GPUS))
    swaps(guard, hand_frame(10.0, every, board(every).tolist()))
    assert "gpu:parked" not in guard.state_dict()
    swaps(guard, hand_frame(20.0, every, [*board(every[:3]).tolist(), 5000.0, *board(every[4:]).tolist()]))
    assert guard.parked == {(0, board(3)): 20.0}
    restored = InputGuard(topology, PipelineHealth())
    restored.load_state_dict(guard.state_dict())
    assert restored.parked == {(0, board(3)): 20.0}


def test_a_source_keeps_displaced_boards_as_the_guard_parks_their_state() -> None:
    """A UUID displaced on its host is moved when read there again only while the pipeline's guard
    would still hold its parked state: per host at most its GPU count (the oldest out) and for
    ``PARK_FOR_S``. Kept for good and for as many as the cluster's GPUs, the source counted boards
    moved that the pipeline counted replaced (review h27)."""
    from foreshock.guard import PARK_FOR_S
    topology = small_topology(nodes=2)
    boards = GpuBoards(PipelineHealth(), "dcgm")
    names = topology.gpus[:GPUS]  # node0's

    def poll(ts: float, read: dict[str, str]) -> None:
        batch = SampleBatch("gpu", list(read), np.full(len(read), ts), np.arange(len(read), dtype=np.int32))
        boards.tag(batch, read, topology)

    own = {name: f"GPU-own-{i}" for i, name in enumerate(names)}
    poll(0.0, own)
    for k in range(GPUS + 2):  # gpu0 swapped ten times (RMAs): ten displaced boards on an 8-GPU node
        poll(10.0 * (k + 1), {**own, names[0]: f"GPU-rma-{k}"})
    replaced = boards.health.gpus_replaced["dcgm"]
    assert replaced == GPUS + 2
    poll(200.0, {**own, names[0]: "GPU-own-0"})  # the first displaced, two past the node's count: gone
    assert boards.health.gpus_replaced["dcgm"] == replaced + 1 and not boards.health.gpus_moved
    poll(210.0, {**own, names[0]: f"GPU-rma-{GPUS + 1}"})  # among the last eight: back
    assert boards.health.gpus_moved == {"dcgm": 1}
    poll(220.0, {**own, names[0]: "GPU-later"})  # GPU-rma-9 displaced at 220 s
    poll(220.0 + PARK_FOR_S + 10.0, {**own, names[0]: f"GPU-rma-{GPUS + 1}"})  # a day and more after
    assert boards.health.gpus_moved == {"dcgm": 1} and boards.health.gpus_replaced["dcgm"] == replaced + 3


# ---- a parked board's predictions ----------------------------------------------------------------
AWAY = 2  # frames node0 reads without gpu3 (a reboot without it, then reseated)


@pytest.fixture(scope="module")
def throttling() -> tuple[Topology, list[Frame], int]:
    """node0/gpu3's interface degrading (the thermal detector predicts a throttle), its frames,
    and the index of the first frame after which the thermal detector holds that prediction."""
    topology = small_topology(nodes=2, gpus=GPUS, racks=1)
    frames = [f for f in World(topology, faults=[Fault("tim_degradation", MISSING, 1800, 0.6, "f1")],
                               seed=1).run(4 * 3600)[0] if f.kind == "gpu"]
    p = pipeline(topology, ["thermal"])
    for i, frame in enumerate(frames):
        if any(isinstance(f, Prediction) and f.active and f.slot == MISSING for f in p.process(in_place(frame))):
            return topology, frames, i
    raise AssertionError("no throttle predicted on the degrading GPU")


def test_a_parked_boards_prediction_is_made_again_the_moment_its_board_is_read_again(throttling) -> None:
    """gpu3 predicted to throttle, its node reboots without it (its board parked, the prediction
    withdrawn) and it is back two polls later: the prediction is active again at the very frame the
    board is read again, at its slot, saying so, its ETA shortened by the time away. (Its detector
    rows came back with their latch "raised", so the thermal detector made it again only at its
    next refresh: 10 s later, h27; and had the throttle cleared first, it would have withdrawn a
    prediction already withdrawn.) Every withdrawal after the return is of a prediction active."""
    topology, frames, at = throttling
    p = pipeline(topology, ["thermal"])
    for frame in frames[:at + 1]:
        p.process(in_place(frame))
    (raised,) = p.store.snapshot().predictions
    for frame in frames[at + 1:at + 1 + AWAY]:
        p.process(shifted(frame))
    assert not p.store.snapshot().predictions
    back = frames[at + 1 + AWAY]
    told = [f for f in p.process(in_place(back)) if isinstance(f, Prediction) and f.slot == MISSING]
    (made,) = [f for f in told if f.active]
    when = float(back.ts.min())
    assert (made.ts, made.detector, made.event, made.confidence) == (when, "thermal", raised.event, raised.confidence)
    assert made.eta_s == max(raised.eta_s - (when - raised.ts), 0.0)
    assert made.reason == f"{raised.reason} (its board back at node0/gpu{MISSING})"
    assert [(f.slot, f.event) for f in p.store.snapshot().predictions] == [(MISSING, raised.event)]
    assert p.bank.parked_predictions == {}
    active = {(f.detector, f.event, f.slot) for f in p.store.snapshot().predictions}
    for frame in frames[at + 2 + AWAY:at + 2 + AWAY + 60]:
        for f in p.process(in_place(frame)):
            if isinstance(f, Prediction):
                key = (f.detector, f.event, f.slot)
                assert f.active or key in active, f"{f} withdraws a prediction not active"
                active = active | {key} if f.active else active - {key}


def test_the_evaluation_makes_a_parked_boards_prediction_again_as_the_pipeline_does(throttling) -> None:
    topology, frames, at = throttling
    bank = DetectorBank.from_names(topology, ["thermal"], processors=())
    health = PipelineHealth()
    guard = InputGuard(topology, health)
    evaluation = _BoardSwaps(bank, guard)
    for frame in frames[:at + 1]:
        evaluation.update(guard.check(in_place(frame)))
    (raised,) = evaluation.active.values()
    for frame in frames[at + 1:at + 1 + AWAY]:
        evaluation.update(guard.check(shifted(frame)))
    assert evaluation.active == {}
    back = frames[at + 1 + AWAY]
    found = evaluation.update(guard.check(in_place(back)))
    (made,) = [f for f in found if isinstance(f, Prediction) and f.active and f.slot == MISSING]
    assert (made.ts, made.event, made.reason) == (float(back.ts.min()), raised.event,
                                                  f"{raised.reason} (its board back at node0/gpu{MISSING})")
    assert list(evaluation.active.values()) == [made]


def test_a_parked_boards_predictions_come_back_but_one_whose_event_passed_and_go_with_its_rows() -> None:
    """Predictions about gpu3's board, parked at 100 s (withdrawn), are made again when it is read
    again at 1000 s, in its slot: a known ETA shortened by the time since it was made, an unknown
    one (-1) kept, one whose event time passed while away (made at 90 s, 600 s ahead) not made
    again; a moved-from suffix replaced by where it is back; the withdrawal of the same prediction
    about the board that leaves the slot then left out (replaced). They are kept in the bank's
    checkpoint, and given up with the board's rows (``swap.dropped``)."""
    topology = small_topology(nodes=2, gpus=GPUS, racks=1)
    bank = DetectorBank.from_names(topology, ["thermal", "power"], processors=())
    fresh = bank.state_dict()["detectors"]

    def name(slot: int) -> str:
        return topology.name("gpu", slot)

    def took(swap: BoardSwap, active: list[Prediction]) -> list[Prediction]:
        bank.take_swap(swap, fresh)
        return bank.follow_predictions(swap, active, name)

    def away(ts: float) -> BoardSwap:  # gpu4's board reads in gpu3; gpu3's, read nowhere, parked
        return BoardSwap(ts, np.array([3]), np.array([board(3)]), np.array([board(4)]), np.array([4]),
                         np.array([4]), parked=np.array([3]))

    def back(ts: float) -> BoardSwap:  # gpu3's board back in gpu3, gpu4's back in gpu4
        return BoardSwap(ts, np.array([3, 4]), np.array([board(4), np.nan]), np.array([board(3), board(4)]),
                         np.array([-1, 3]), np.empty(0, dtype=np.int64), unparked=np.array([3]))

    due = Prediction(90.0, "gpu", 3, "thermal_throttle", 3600.0, 0.9, "thermal",
                     "hot (its board moved from node0/gpu5)")
    unknown = Prediction(95.0, "gpu", 3, "power_cap", -1.0, 0.7, "power", "heading for the limit")
    passed = Prediction(90.0, "gpu", 3, "thermal_runaway", 600.0, 0.8, "thermal", "runaway")
    withdrawn = took(away(100.0), [due, unknown, passed])
    assert [(f.slot, f.event, f.active) for f in withdrawn] == [(3, e, False) for e in
                                                                 ("thermal_throttle", "power_cap", "thermal_runaway")]
    assert bank.parked_predictions == {(0, board(3)): [due, unknown, passed]}

    restored = DetectorBank.from_names(topology, ["thermal", "power"], processors=())
    restored.load_state_dict(bank.state_dict())
    assert restored.parked_predictions == bank.parked_predictions

    other = Prediction(500.0, "gpu", 3, "thermal_throttle", 100.0, 0.6, "thermal", "gpu4's board, hot")
    told = took(back(1000.0), [other])
    assert [(f.slot, f.event, f.active) for f in told] == [(4, "thermal_throttle", True),  # gpu4's board's, carried
                                                           (3, "thermal_throttle", True), (3, "power_cap", True)]
    _, again, cap = told
    assert (again.ts, again.eta_s, again.confidence, again.detector) == (1000.0, 3600.0 - 910.0, 0.9, "thermal")
    assert again.reason == "hot (its board back at node0/gpu3)"
    assert (cap.ts, cap.eta_s, cap.reason) == (1000.0, -1.0, "heading for the limit (its board back at node0/gpu3)")
    assert bank.parked_predictions == {}

    took(away(2000.0), [again])
    assert bank.parked_predictions == {(0, board(3)): [again]}
    gone = BoardSwap(3000.0, np.array([8]), np.array([board(8)]), np.array([7000.0]), np.array([-1]),
                     np.empty(0, dtype=np.int64), dropped=((0, board(3)),))
    assert took(gone, []) == []
    assert bank.parked_predictions == {} and bank.parked == {}
    assert took(back(4000.0), []) == []  # read again after it was given up: nothing to make again
