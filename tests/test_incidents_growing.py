"""An incident update says "growing" only when a member joined (or fired again).

The engine compared only how many members it had last told: an incident whose members only left
(split off to an incident of their own, left out by a move onto other hardware) was told as
"growing", and one that lost a member as another joined (as many as it had) was not told at all,
or told in its old state, the member that joined never announced as growth.

Cluster of ``test_incidents_review3``: one cooling loop, two racks of two nodes of 8 GPUs. A move
onto other hardware is loaded as the Kafka incident stage loads a checkpoint written for other
hardware (``remap_state`` then ``load_state_dict``): it does not tell the incidents at once
(``report_left_out`` is the embedded pipeline's), so their next update does."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Incident, finding_to_json
from foreshock.remap import Remap
from foreshock.topology import Topology

from test_incidents_review3 import TOPO, heating

END = 2000.0
"""Every GPU that heats keeps heating (and its incident open) until then."""


def loop_topology(nodes: list[int]) -> Topology:
    """``TOPO`` with only ``nodes`` listed: a node keeps its name, rack and GPUs; the slots of the
    nodes after one left out move down (state follows them by name)."""
    return Topology.from_dict({
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
        "racks": [{"name": "rack0", "row": "row0"}, {"name": "rack1", "row": "row0"}],
        "nodes": [{"name": f"n{i}", "rack": f"rack{i // 2}", "gpus": 8} for i in nodes]})


def heats(gpus: list[str], start: float = 0.0) -> list[tuple[float, str]]:
    """Each GPU (by name) heading for throttling every 10 s from ``start`` to ``END``."""
    return [(float(t), g) for g in gpus for t in range(int(start), int(END), 10)]


def play(engine: IncidentEngine, stream: list[tuple[float, str]], start: float, until: float) -> list[Incident]:
    """One ``observe`` per 10 s step after ``start`` up to ``until``, as the bank calls it, with the
    findings (by GPU name, on the engine's topology; GPUs it does not list are not read) of each
    step; the incidents told."""
    topo = engine.topology
    listed = set(topo.gpus)
    out: list[Incident] = []
    t = start + 10.0
    while t <= until:
        step = [heating(ts, topo.slot("gpu", g)) for ts, g in stream if t - 10.0 < ts <= t and g in listed]
        out += [f for f in engine.observe(step, t) if isinstance(f, Incident)]
        t += 10.0
    engine.check_invariants()
    return out


def restored(engine: IncidentEngine, onto: Topology | None = None, old_format: bool = False) -> IncidentEngine:
    """A new engine from ``engine``'s checkpoint (pickled, as the Kafka worker writes it), on
    hardware ``onto`` when given (moved by name); ``old_format``: a checkpoint from before the keys
    of the members told were saved."""
    state = pickle.loads(pickle.dumps(engine.state_dict(), protocol=5))
    if old_format:
        for d in state["incidents"]:
            del d["emitted_keys"]
    twin = IncidentEngine(onto or engine.topology)
    twin.load_state_dict(state if onto is None else twin.remap_state(state, Remap(engine.topology, onto)))
    twin.check_invariants()
    return twin


def told(out: list[Incident]) -> list[str]:
    return [finding_to_json(f) for f in out]


def hot_on(node: int) -> set[str]:
    """Two GPUs of ``node``, not the same indexes on two nodes: a key that did not follow its GPU
    to its new slot in a move is not that of another member."""
    return {f"n{node}/gpu{2 * node + i}" for i in (0, 1)}


def idle_on(node: int) -> str:
    """A GPU of ``node`` that is not hot."""
    return f"n{node}/gpu{(2 * node + 2) % 8}"


LOOP_GPUS = sorted(g for n in range(4) for g in hot_on(n))
"""Two GPUs of each node heating together from 0: one incident, rooted at the loop."""


def loop_incident_moved(forgotten: int, move_at: float) -> tuple[list[Incident], IncidentEngine, IncidentEngine]:
    """The loop incident, told until ``move_at``; then the hardware without node ``forgotten``:
    (what was told until then, the engine that stayed, the engine moved onto the new hardware)."""
    stayed = IncidentEngine(TOPO)
    before = play(stayed, heats(LOOP_GPUS), -10.0, move_at)
    assert {u.root_entity for u in before} == {"cdu0"}, [(u.root_entity, u.members) for u in before]
    moved = restored(stayed, onto=loop_topology([n for n in range(4) if n != forgotten]))
    return before, stayed, moved


# ---- members that only left: an update in the state it had ---------------------------------------
@settings(max_examples=25, deadline=None)
@given(forgotten=st.integers(0, 3), move_at=st.integers(10, 120).map(lambda n: 10.0 * n))
def test_an_incident_whose_members_only_left_is_told_without_them_in_the_state_it_had(forgotten, move_at):
    """The loop incident loses the GPUs of a node the hardware no longer lists (the incident stays:
    its root is still listed). Its next update lists the GPUs left, in the state it was last told
    (open, or stable once no member joined for ``stable_s``): it was told "growing" as it shrank.
    Its stable clock runs on: it turns stable when the engine that kept the node does, not
    ``stable_s`` after the update."""
    before, stayed, moved = loop_incident_moved(forgotten, move_at)
    last = before[-1]
    kept_out = hot_on(forgotten)
    assert kept_out <= set(last.members)
    stream = heats(LOOP_GPUS)
    after = play(moved, stream, move_at, 1500.0)
    reference = play(stayed, stream, move_at, 1500.0)
    assert after, "the incident that lost members was never told again"
    first = after[0]
    assert (first.incident_id, first.root_entity) == (last.incident_id, last.root_entity)
    assert set(first.members) == set(last.members) - kept_out
    assert first.state == last.state != "growing", (last.state, first.state)
    assert "growing" not in {u.state for u in after}
    # (the update without them comes at the first tick after the move, before that tick's stable)
    turned_stable = next(u.ts for u in before + reference if u.state == "stable")
    assert next(u.ts for u in before + after if u.state == "stable") == turned_stable


def test_a_move_nobody_reports_is_told_at_the_next_tick_re_ranked_or_resolved() -> None:
    """The Kafka incident stage loads a moved state and ticks on, without ``report_left_out``: the
    first tick tells the incident without the members left out, its reason counting the GPUs left
    (it had kept "8 GPUs" under a list of 6), and resolves one whose members all left (it had been
    told open, then stable, with no member at all)."""
    before, _, moved = loop_incident_moved(forgotten=1, move_at=300.0)
    assert before[-1].reason.startswith("cooling loop cdu0: 8 GPUs")
    first = play(moved, [], 300.0, 300.0 + moved.tick_s)
    assert len(first) == 1 and len(first[0].members) == 6, [(u.ts, u.members) for u in first]
    assert first[0].reason.startswith("cooling loop cdu0: 6 GPUs"), first[0].reason
    assert first[0].ts <= 300.0 + moved.tick_s
    rack = IncidentEngine(TOPO)
    told = play(rack, heats(sorted(hot_on(0) | hot_on(1))), -10.0, 400.0)
    assert told and told[-1].state != "resolved" and told[-1].root_entity == "rack0"
    emptied = restored(rack, onto=loop_topology([2, 3]))  # rack0 still listed, none of its GPUs
    after = play(emptied, [], 400.0, 1200.0)
    assert after and after[0].state == "resolved" and after[0].ts <= 400.0 + emptied.tick_s, \
        [(u.ts, u.state, u.members) for u in after]


# ---- a member that joined is growth, whatever the count -------------------------------------------
@settings(max_examples=25, deadline=None)
@given(n0=st.permutations(range(8)), outsider=st.integers(0, 7), join_at=st.integers(10, 50).map(lambda n: 10.0 * n))
def test_a_member_joining_as_another_is_split_off_is_told_as_growth(n0, outsider, join_at):
    """Three GPUs of n0 and one of n1 heating together rank at their rack (4 members); a fourth n0
    GPU joins at ``join_at`` and n0 explains enough to be the root: the n1 GPU is split off to an
    incident of its own. Four members again, one new: the update naming it said "open"."""
    first, joiner, other = [f"n0/gpu{i}" for i in n0[:3]], f"n0/gpu{n0[3]}", f"n1/gpu{outsider}"
    out = play(IncidentEngine(TOPO), heats([*first, other]) + heats([joiner], join_at), -10.0, 1000.0)
    rack = [u for u in out if u.root_entity == "rack0"]
    assert rack and set(rack[-1].members) == {*first, other}, [(u.root_entity, u.members) for u in out]
    ours = [u for u in out if u.incident_id == rack[0].incident_id]
    told_joiner = next(u for u in ours if joiner in u.members)
    assert told_joiner.state == "growing", (told_joiner.state, told_joiner.members)
    assert set(told_joiner.members) == {*first, joiner}  # as many as before: one left, one joined
    assert any(u.members == (other,) and u.incident_id != told_joiner.incident_id for u in out)


@settings(max_examples=25, deadline=None)
@given(forgotten=st.integers(0, 3), move_at=st.integers(10, 50).map(lambda n: 10.0 * n),
       join_after=st.integers(0, 2).map(lambda n: 10.0 * n))
def test_as_many_members_joining_as_a_move_left_out_are_told_as_growth(forgotten, move_at, join_after):
    """The loop incident loses a node's two GPUs to a move and two other GPUs of the loop start
    heating within the next update interval (the loop still spreading: within ``coherence_s`` of its
    last growth): same count, same root, two new members. They were not told until the incident
    turned stable ``stable_s`` later, as "stable" (never as growth)."""
    before, _, moved = loop_incident_moved(forgotten, move_at)
    kept = [n for n in range(4) if n != forgotten]
    joiners = [idle_on(kept[0]), idle_on(kept[-1])]
    after = play(moved, heats(LOOP_GPUS) + heats(joiners, move_at + 10.0 + join_after), move_at, 1500.0)
    told_joiners = next((u for u in after if set(joiners) & set(u.members)), None)
    assert told_joiners is not None, [(u.ts, u.state, u.members) for u in after]
    assert told_joiners.state == "growing", (told_joiners.ts, told_joiners.state)
    assert told_joiners.ts - move_at <= 10.0 + join_after + moved.update_interval_s + moved.tick_s
    assert set(told_joiners.members) == set(before[-1].members) - hot_on(forgotten) | set(joiners)


@settings(max_examples=20, deadline=None)
@given(onsets=st.lists(st.integers(1, 40).map(lambda n: 10.0 * n), min_size=2, max_size=6))
def test_members_joining_are_told_as_growing_and_only_then(onsets):
    """n0's GPUs start heating one after another (two at once at 0, then one at each onset): each
    update that lists a member more says "growing" (the first says "open"), and none says it
    without one."""
    gpus = [f"n0/gpu{i}" for i in range(len(onsets) + 2)]
    stream = heats(gpus[:2]) + [f for g, t in zip(gpus[2:], sorted(onsets)) for f in heats([g], t)]
    out = play(IncidentEngine(TOPO), stream, -10.0, 1500.0)
    assert len({u.incident_id for u in out}) == 1 and out[0].state == "open"
    for prev, u in zip(out, out[1:]):
        grew = not set(u.members) <= set(prev.members)
        assert (u.state == "growing") == grew, (prev.members, u.ts, u.state, u.members)
    assert set(out[-1].members) == set(gpus) and out[-1].state == "stable"


# ---- checkpoints ---------------------------------------------------------------------------------
SWAP = (["n0/gpu0", "n0/gpu1", "n0/gpu2", "n1/gpu3"], "n0/gpu3", 300.0)
"""A rack incident of four GPUs, told at 60; n0/gpu3 joins at 300 and n1/gpu3 is split off."""


def swap_stream() -> list[tuple[float, str]]:
    first, joiner, join_at = SWAP
    return heats(first) + heats([joiner], join_at)


@settings(max_examples=15, deadline=None)
@given(saved_at=st.integers(7, 29).map(lambda n: 10.0 * n))
def test_a_checkpoint_between_an_update_and_the_next_change_tells_what_the_engine_that_ran_on_tells(saved_at):
    """Saved after the rack incident was told and before the swap, restored: from then on it
    tells exactly what the engine that never stopped tells (the swap as growth included)."""
    stream = swap_stream()
    engine = IncidentEngine(TOPO)
    play(engine, stream, -10.0, saved_at)
    twin = restored(engine)
    ran_on, after_restart = play(engine, stream, saved_at, 1200.0), play(twin, stream, saved_at, 1200.0)
    assert told(after_restart) == told(ran_on)
    assert any(u.state == "growing" and SWAP[1] in u.members for u in ran_on)


@settings(max_examples=15, deadline=None)
@given(saved_at=st.integers(7, 29).map(lambda n: 10.0 * n))
def test_a_checkpoint_from_before_the_keys_were_saved_loads_and_tells_by_the_count_until_its_next_update(saved_at):
    """A checkpoint without the member keys told (``emitted_keys``) loads; until the incident's next
    update only the count tells what changed, as before they were kept: the swap, as many members
    as before, is told for its new root but not as growth. From that update on the keys are known
    again: a member left out by a move (n0/gpu3, which joined: n0 listed with three GPUs) is an
    update in the state it had, not growth."""
    stream = swap_stream()
    engine = IncidentEngine(TOPO)
    play(engine, stream, -10.0, saved_at)
    twin = restored(engine, old_format=True)
    out = play(twin, stream, saved_at, 600.0)
    swap = next(u for u in out if SWAP[1] in u.members)
    assert swap.state == "open" and swap.root_entity == "n0"  # the root changed: told, by the count
    moved = restored(twin, onto=Topology.from_dict({
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}], "racks": [{"name": "rack0", "row": "row0"}],
        "nodes": [{"name": "n0", "rack": "rack0", "gpus": 3}]}))
    after = play(moved, stream, 600.0, 900.0)
    assert after and after[0].incident_id == swap.incident_id
    last = [u for u in out if u.incident_id == swap.incident_id][-1]
    assert after[0].state == last.state != "growing", (last.state, after[0].state)
    assert set(after[0].members) == {"n0/gpu0", "n0/gpu1", "n0/gpu2"}
