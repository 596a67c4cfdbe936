"""The incident engine follows GPU boards renumbered within their node (``IncidentEngine.follow_moves``).

A node rebooting with one GPU missing enumerates the later ones one index lower; their detector
state follows them (``DetectorBank.move_gpus``), and so must the incidents about them. The engine
kept its members by slot: the degrading board of node0/gpu5, read at node0/gpu4 after the reboot,
was taken into its incident a second time under its new slot —
``growing root=node0 members=(node0/gpu5, node0/gpu4)``: one board made a node-wide cause (h24)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Finding, Incident, Prediction

from thermal_synth import small_topology

GPUS = 8  # per node: node0 holds slots 0-7, node1 slots 8-15
TOPO = small_topology(nodes=2, gpus=GPUS, racks=1)


def thermal(ts: float, g: int) -> Prediction:
    return Prediction(ts, "gpu", g, "thermal_throttle", 1800.0, 0.9, "thermal", "core heading for 90 °C")


def feed(engine: IncidentEngine, gpus: list[int], start: float, end: float) -> list[Incident]:
    """A thermal prediction on each of ``gpus`` every 10 s from ``start`` to ``end``: the incidents told."""
    out: list[Finding] = []
    for t in np.arange(start, end, 10.0):
        out += engine.observe([thermal(float(t), g) for g in gpus], float(t))
    engine.check_invariants()
    return [f for f in out if isinstance(f, Incident)]


def shift(missing: int = 3) -> np.ndarray:
    """node0 rebooted without its GPU ``missing``: each later board reads one index lower."""
    moved_from = np.full(2 * GPUS, -1, dtype=np.int64)
    moved_from[missing:GPUS - 1] = np.arange(missing + 1, GPUS)
    return moved_from


def test_an_incident_follows_its_board_to_its_new_slot_and_does_not_grow_there() -> None:
    engine = IncidentEngine(TOPO)
    told = feed(engine, [5], 0.0, 300.0)
    assert told and told[-1].members == ("node0/gpu5",) and told[-1].root_entity == "node0/gpu5"
    again = engine.follow_moves(shift(), 300.0)
    engine.check_invariants()
    assert len(again) == 1
    inc = again[0]
    assert (inc.incident_id, inc.state, inc.root_kind) == (told[-1].incident_id, told[-1].state, "gpu")
    assert inc.root_entity == "node0/gpu4" and inc.members == ("node0/gpu4",)
    assert "node0/gpu4" in inc.reason and "node0/gpu5" not in inc.reason
    # the board speaks on from its new slot: its own incident, no new member, not growing
    later = feed(engine, [4], 300.0, 1500.0)
    assert later and all(i.members == ("node0/gpu4",) and i.root_entity == "node0/gpu4" for i in later)
    assert "growing" not in {i.state for i in later} and {i.incident_id for i in later} == {inc.incident_id}


def test_boards_whose_old_and_new_slots_were_both_members_keep_one_member_each() -> None:
    engine = IncidentEngine(TOPO)
    told = feed(engine, [4, 5], 0.0, 300.0)
    assert told[-1].root_entity == "node0" and set(told[-1].members) == {"node0/gpu4", "node0/gpu5"}
    (inc,) = engine.follow_moves(shift(), 300.0)
    engine.check_invariants()
    assert inc.root_entity == "node0" and set(inc.members) == {"node0/gpu3", "node0/gpu4"}
    later = feed(engine, [3, 4], 300.0, 1500.0)
    assert all(set(i.members) == {"node0/gpu3", "node0/gpu4"} for i in later)
    assert "growing" not in {i.state for i in later}


def test_two_boards_trading_slots_each_take_their_incident_along() -> None:
    engine = IncidentEngine(TOPO)
    # a board with a failing interface at node0/gpu1, and another at node1/gpu2, untouched by the move
    assert len({i.incident_id for i in feed(engine, [1, 10], 0.0, 300.0)}) == 2
    moved_from = np.full(2 * GPUS, -1, dtype=np.int64)
    moved_from[1], moved_from[2] = 2, 1
    (inc,) = engine.follow_moves(moved_from, 300.0)
    assert inc.members == ("node0/gpu2",)
    snapshot = {i.root_entity: i.members for i in engine.incidents()}
    assert snapshot == {"node0/gpu2": ("node0/gpu2",), "node1/gpu2": ("node1/gpu2",)}


def test_a_slot_a_board_left_keeps_nothing_of_its_incident() -> None:
    engine = IncidentEngine(TOPO)
    first = feed(engine, [7], 0.0, 300.0)[-1]
    (inc,) = engine.follow_moves(shift(), 300.0)
    assert inc.members == ("node0/gpu6",)
    # node0/gpu7 holds no board now: a finding there (a new board later) is a new story
    told = feed(engine, [7], 1000.0, 1300.0)
    assert told and told[-1].incident_id != first.incident_id and told[-1].members == ("node0/gpu7",)
    engine.check_invariants()


def test_an_incident_whose_only_board_is_read_nowhere_now_is_resolved_at_the_move() -> None:
    engine = IncidentEngine(TOPO)
    stream = [Anomaly(float(t), "gpu", 3, "xid", 79.0, "xid", "XID 79: GPU has fallen off the bus")
              for t in (0.0, 20.0)]
    out: list[Finding] = []
    for t in np.arange(0.0, 300.0, 10.0):
        out += engine.observe([f for f in stream if f.ts == t], float(t))
    assert [i.members for i in out if isinstance(i, Incident)][-1] == ("node0/gpu3",)
    (inc,) = engine.follow_moves(shift(3), 300.0)
    assert inc.state == "resolved" and inc.root_entity == "node0/gpu3"
    assert "no longer read" in inc.reason
    engine.check_invariants()
    assert not engine.incidents()


def test_an_incident_losing_the_board_at_its_root_is_ranked_again_from_the_others() -> None:
    engine = IncidentEngine(TOPO)
    told = feed(engine, [3, 5], 0.0, 300.0)
    assert told[-1].root_entity == "node0"
    (inc,) = engine.follow_moves(shift(3), 300.0)
    assert inc.state == told[-1].state and inc.members == ("node0/gpu4",) and inc.root_entity == "node0/gpu4"


def test_an_incident_not_told_yet_is_told_under_its_new_name() -> None:
    engine = IncidentEngine(TOPO)
    assert feed(engine, [5], 0.0, 30.0) == []  # pending: held for hold_s
    assert engine.follow_moves(shift(), 30.0) == []
    told = feed(engine, [4], 30.0, 300.0)
    assert told and told[0].state == "open" and told[0].members == ("node0/gpu4",)
    assert told[0].root_entity == "node0/gpu4" and "node0/gpu4" in told[0].reason


def test_a_slot_that_took_a_new_board_keeps_its_incident_and_nothing_moved_changes_nothing() -> None:
    engine = IncidentEngine(TOPO)
    feed(engine, [2], 0.0, 300.0)
    before = engine.incidents(300.0)
    assert engine.follow_moves(np.full(2 * GPUS, -1), 300.0) == []
    moved_from = np.full(2 * GPUS, -1, dtype=np.int64)
    moved_from[5] = 6  # a board moved from gpu6 to gpu5; gpu2 (an RMA in the same change) took none
    assert engine.follow_moves(moved_from, 300.0) == []
    assert engine.incidents(300.0) == before


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(GPUS)), st.sets(st.integers(0, GPUS - 1), max_size=3),
       st.sets(st.integers(0, GPUS - 1), min_size=2, max_size=5))
def test_each_member_follows_its_board(order: list[int], vanished: set[int], members: set[int]) -> None:
    """node0's boards read in a new order (``order``: by slot now, the slot each was read in
    before), those ``vanished`` read nowhere now and the boards after them one slot lower (a
    reboot), the last slots empty; an incident on the boards ``members`` holds each in its new slot."""
    now: list[int | None] = [b for b in order if b not in vanished]
    now += [None] * (GPUS - len(now))
    moved_from = np.full(2 * GPUS, -1, dtype=np.int64)
    for slot, board in enumerate(now):
        if board is not None and board != slot:
            moved_from[slot] = board
    engine = IncidentEngine(TOPO)
    feed(engine, sorted(members), 0.0, 300.0)
    engine.follow_moves(moved_from, 300.0)
    engine.check_invariants()
    where = {board: slot for slot, board in enumerate(now) if board is not None}
    # a vanished board's slot that no board moved to reads as a GPU gone silent: it keeps its history
    want = {where[b] if b in where else b for b in members if b in where or moved_from[b] < 0}
    held = {m for inc in engine.incidents(300.0) for m in inc.members}
    assert held == {f"node0/gpu{slot}" for slot in want}


# ---- boards the guard parks (displaced, read nowhere yet) and reads again -------------------------
def test_a_parked_board_is_a_member_again_where_it_is_read_again() -> None:
    """A renumbering read in pieces: node0/gpu4 reads gpu5's board first (gpu4's own board, read
    nowhere yet, is parked), then node0/gpu3 reads gpu4's board (taken back from the parking)."""
    engine = IncidentEngine(TOPO)
    told = feed(engine, [4, 6], 0.0, 300.0)
    assert told[-1].root_entity == "node0" and set(told[-1].members) == {"node0/gpu4", "node0/gpu6"}
    moved_from = np.full(2 * GPUS, -1, dtype=np.int64)
    moved_from[4] = 5
    (inc,) = engine.follow_moves(moved_from, 300.0, parked=[(4, (0, 1004.0))])
    assert inc.members == ("node0/gpu6",) and inc.root_entity == "node0/gpu6"
    engine.check_invariants()
    (back,) = engine.follow_moves(np.full(2 * GPUS, -1), 310.0, unparked=[(3, (0, 1004.0))])
    engine.check_invariants()
    assert back.incident_id == inc.incident_id and back.state == inc.state
    assert set(back.members) == {"node0/gpu3", "node0/gpu6"} and back.root_entity == "node0"
    later = feed(engine, [3, 6], 310.0, 1500.0)
    assert {i.incident_id for i in later} == {inc.incident_id} and "growing" not in {i.state for i in later}


def test_a_parked_board_whose_incident_resolved_reopens_it_where_it_is_read_again() -> None:
    engine = IncidentEngine(TOPO)
    first = feed(engine, [4], 0.0, 300.0)[-1]
    moved_from = np.full(2 * GPUS, -1, dtype=np.int64)
    moved_from[4] = 5
    (gone,) = engine.follow_moves(moved_from, 300.0, parked=[(4, (0, 1004.0))])
    assert gone.state == "resolved" and gone.incident_id == first.incident_id
    assert engine.follow_moves(np.full(2 * GPUS, -1), 310.0, unparked=[(3, (0, 1004.0))]) == []
    again = feed(engine, [3], 320.0, 600.0)
    assert again and {i.incident_id for i in again} == {first.incident_id}
    assert again[-1].members == ("node0/gpu3",)
    engine.check_invariants()


def test_a_parked_board_given_up_comes_back_as_a_new_one() -> None:
    engine = IncidentEngine(TOPO)
    first = feed(engine, [4], 0.0, 300.0)[-1]
    moved_from = np.full(2 * GPUS, -1, dtype=np.int64)
    moved_from[4] = 5
    engine.follow_moves(moved_from, 300.0, parked=[(4, (0, 1004.0))])
    engine.follow_moves(np.full(2 * GPUS, -1), 400.0, dropped=[(0, 1004.0)])
    assert engine.follow_moves(np.full(2 * GPUS, -1), 410.0, unparked=[(3, (0, 1004.0))]) == []
    again = feed(engine, [3], 420.0, 800.0)
    assert again and first.incident_id not in {i.incident_id for i in again}
    engine.check_invariants()


def test_a_parked_slot_that_took_no_moved_board_keeps_its_history() -> None:
    """An RMA: the guard parks the old board (it may be read again), the slot keeps the incident."""
    engine = IncidentEngine(TOPO)
    feed(engine, [2], 0.0, 300.0)
    before = engine.incidents(300.0)
    assert engine.follow_moves(np.full(2 * GPUS, -1), 300.0, parked=[(2, (0, 1002.0))]) == []
    assert engine.incidents(300.0) == before
    assert engine.follow_moves(np.full(2 * GPUS, -1), 310.0, unparked=[(5, (0, 1002.0))]) == []


def test_an_engine_restored_after_a_move_goes_on_as_the_one_that_moved() -> None:
    engine = IncidentEngine(TOPO)
    feed(engine, [4, 5, 12], 0.0, 300.0)
    engine.follow_moves(shift(), 300.0)
    restored = IncidentEngine(TOPO)
    restored.load_state_dict(engine.state_dict())
    restored.check_invariants()
    assert feed(restored, [3, 4, 7, 12], 300.0, 2000.0) == feed(engine, [3, 4, 7, 12], 300.0, 2000.0)


def test_a_resolved_incident_of_a_parked_board_can_reopen_where_it_is_read_again() -> None:
    engine = IncidentEngine(TOPO)

    def hot(t: float, g: int) -> Anomaly:
        return Anomaly(t, "gpu", g, "gpu_temp", 0.3, "cooling", "R +30 % vs rack")

    out: list[Finding] = []
    for t in np.arange(0.0, 1500.0, 10.0):
        out += engine.observe([hot(float(t), 4)] if t < 300 else [], float(t))
    told = [f for f in out if isinstance(f, Incident)]
    assert told[-1].state == "resolved" and told[-1].members == ("node0/gpu4",)
    moved_from = np.full(2 * GPUS, -1, dtype=np.int64)
    moved_from[4] = 5
    assert engine.follow_moves(moved_from, 1500.0, parked=[(4, (0, 1004.0))]) == []
    assert engine.follow_moves(np.full(2 * GPUS, -1), 1510.0, unparked=[(3, (0, 1004.0))]) == []
    engine.check_invariants()
    again = [f for t in np.arange(1520.0, 1700.0, 10.0) for f in engine.observe([hot(float(t), 3)], float(t))
             if isinstance(f, Incident)]
    assert again and {i.incident_id for i in again} == {told[-1].incident_id}
    assert again[-1].members == ("node0/gpu3",) and again[-1].root_entity == "node0/gpu3"
