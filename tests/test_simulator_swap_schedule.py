"""Board swaps on the fault clock: a swap (``gpu_replacement``, or an XID 79 repair with
``xid79_new_board``) happens at the swapping fault's scheduled end and cures exactly the faults of
the old board that the schedule has on at that time (onset at or before it, own end after), at any
sampling interval and physics step. Before, the swap cured what was started and not ended at the
physics step that reached it: a thermal interface that began within that step before the swap was
kept at 1-s steps and cured at 0.5-s ones, an XID 79 that ended within it was cured, and 0.2-s steps
that sum to 19.99999999999996 drew the block of 20 s before a swap due at 20 s, so the duplicate
check of the random draws, and every later draw, depended on the step."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.simulator.engine import FAULT_DRAW_BLOCK_S, ClusterSimulator
from foreshock.simulator.faults import CURED_BY_NEW_BOARD, random_fault_rate_per_s
from foreshock.simulator.scenario import scenario_from_dict

GPU = "node0/gpu0"
# (sampling interval, --physics-dt): whole-second steps, half-second ones, 5/6-s steps (2.5 s), and
# physics steps that do not divide the interval (10 s at 3 s: four of 2.5 s; 1 s at 0.3 s: four of 0.25 s)
STEPS = [(0.5, None), (1.0, None), (2.0, None), (2.5, None), (5.0, None), (10.0, None), (10.0, 3.0), (1.0, 0.3)]
# steps whose sum misses the block starts by a last bit (0.1 s, 0.2 s, 0.3 s, 0.4 s), as well
INEXACT_STEPS = [(0.1, None), (0.2, None), (0.3, None), (0.4, None), (10.0, 0.2)]
# random thermal interfaces only, ~12 a block on each of the node's 8 GPUs: each block after a cure
# of node0/gpu0's draws one there (all but surely), each block before drops them as duplicates
TIM_ONLY = {"tim_degradation": 1.0}
ACCELERATION = 10.0 / random_fault_rate_per_s(1, 1.0)


def _run(faults: list[dict[str, Any]], interval: float, physics_dt: float | None, *, duration: float = 60.0,
         random_faults: bool = False, params: dict[str, Any] | None = None, seed: int = 3) -> ClusterSimulator:
    scenario = scenario_from_dict({"name": "swap-clock", "faults": faults, "params": params or {}})
    sim = ClusterSimulator(gpus=8, scenario=scenario, seed=seed, interval=interval, duration=duration,
                           random_faults=random_faults, fault_acceleration=ACCELERATION, warmup_s=0,
                           physics_dt=physics_dt)
    for _ in sim.iter_ticks():
        pass
    return sim


def _ground_truth(sim: ClusterSimulator) -> dict[str, Any]:
    """What a recording writes of the faults: ``events.jsonl``'s swaps and onsets (sorted by time
    there) and ``recording.json``'s fault list (a cured fault's duration ends at its swap)."""
    return {
        "swaps": [e.to_json() for e in sim.events if e.type == "gpu_replaced"],
        "onsets": sorted((e.time, e.to_json()) for e in sim.events if e.type == "fault_onset"),
        "faults": [f.describe() for f in sim.faults if f.started],
    }


def _first_random_tim(sim: ClusterSimulator, scripted: int) -> float:
    return min(f.onset for f in sim.faults[scripted:] if f.target_name == GPU)


# a swap due at 25.7 s; a thermal interface of the old board began at 25.1 s, within the swap's step
# at 1-s steps (25-26 s) and 2.5-s ones, a step before it at 0.5-s ones; an HBM fault at 25.9 s, within
# the swap's step too but after it, is the new board's; an XID 79 that ended at 25.5 s is not cured
WITHIN_THE_STEP = [
    {"type": "gpu_replacement", "target": GPU, "onset": 3.0, "duration": 22.7},
    {"type": "xid79", "target": GPU, "onset": 10.0, "duration": 15.5},
    {"type": "tim_degradation", "target": GPU, "onset": 25.1},
    {"type": "hbm_overheat", "target": GPU, "onset": 25.9},
]


def test_a_swap_cures_the_old_boards_faults_on_at_its_time_at_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("foreshock.simulator.engine.RANDOM_FAULT_MIX", TIM_ONLY)
    swap, xid, tim, hbm = WITHIN_THE_STEP
    swap_time = swap["onset"] + swap["duration"]
    truths = []
    for interval, physics_dt in STEPS:
        sim = _run(WITHIN_THE_STEP, interval, physics_dt, random_faults=True)
        at = f"interval {interval}, physics_dt {physics_dt}"
        (event,) = [e for e in sim.events if e.type == "gpu_replaced"]
        assert (event.time, event.fault_id, event.detail["faults_cured"]) == (
            sim.start_time + swap_time, "f1", ["f3"]), at
        by_id = {f.id: f for f in sim.faults}
        assert by_id["f3"].type == tim["type"] and by_id["f3"].duration == swap_time - tim["onset"], at
        assert by_id["f2"].type == xid["type"] and by_id["f2"].duration == xid["duration"], at  # ended on its own
        assert by_id["f4"].type == hbm["type"] and by_id["f4"].duration is None and by_id["f4"].started, at
        # the duplicate check reads the cure: the block of 20 s drops node0/gpu0's random thermal
        # interfaces (the old board's still to come), the block of 30 s, after the cure, keeps one
        assert 30.0 <= _first_random_tim(sim, len(WITHIN_THE_STEP)) < 30.0 + FAULT_DRAW_BLOCK_S, at
        truths.append((_ground_truth(sim), [(f.id, f.type, f.target_name, f.onset, f.duration)
                                            for f in sim.faults if f.onset < sim.duration]))
    assert all(t == truths[0] for t in truths[1:])


def test_the_old_boards_fault_leaves_its_aftermath_from_the_swap_at_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cured fault's consequences are its own for ``AFTERMATH_S`` after the swap (20 s here), then
    no one's: at 1-s steps the thermal interface that began within the swap's step was kept on, for good."""
    monkeypatch.setattr("foreshock.simulator.engine.AFTERMATH_S", 20.0)
    swap, tim = WITHIN_THE_STEP[0], WITHIN_THE_STEP[2]
    swap_time = swap["onset"] + swap["duration"]
    for interval, physics_dt in STEPS:
        scenario = scenario_from_dict({"name": "aftermath", "faults": [swap, tim]})
        sim = ClusterSimulator(gpus=8, scenario=scenario, seed=3, interval=interval, duration=60.0, warmup_s=0,
                               physics_dt=physics_dt)
        g, tim_index = sim.topology.slot("gpu", GPU), 1
        causes: list[tuple[float, int]] = []
        sim.probes.append(lambda s: causes.append((s.elapsed, int(s.gpu_cause[g]))))
        for _ in sim.iter_ticks():
            pass
        after_swap = [(t, cause) for t, cause in causes if t >= swap_time]
        assert after_swap and after_swap[-1][0] > swap_time + 20.0
        expected = [(t, tim_index if t < swap_time + 20.0 else -1) for t, _ in after_swap]
        assert after_swap == expected, (interval, physics_dt)


# a swap due exactly at a block's start (20 s) cures a thermal interface of the old board: the block
# of 20 s keeps node0/gpu0's random ones at every step, also where the steps reach 20 s a last bit short
ON_A_BLOCK_START = [
    {"type": "tim_degradation", "target": GPU, "onset": 1.5},
    {"type": "gpu_replacement", "target": GPU, "onset": 5.0, "duration": 15.0},
]


def test_a_swap_due_on_a_block_start_cures_before_that_block_is_drawn_at_every_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("foreshock.simulator.engine.RANDOM_FAULT_MIX", TIM_ONLY)
    tim, swap = ON_A_BLOCK_START
    swap_time = swap["onset"] + swap["duration"]
    assert swap_time % FAULT_DRAW_BLOCK_S == 0.0
    truths = []
    for interval, physics_dt in STEPS + INEXACT_STEPS:
        sim = _run(ON_A_BLOCK_START, interval, physics_dt, duration=40.0, random_faults=True)
        at = f"interval {interval}, physics_dt {physics_dt}"
        (event,) = [e for e in sim.events if e.type == "gpu_replaced"]
        assert (event.time, event.detail["faults_cured"]) == (sim.start_time + swap_time, ["f1"]), at
        assert sim.faults[0].duration == swap_time - tim["onset"], at
        assert swap_time <= _first_random_tim(sim, len(ON_A_BLOCK_START)) < swap_time + FAULT_DRAW_BLOCK_S, at
        truths.append(_ground_truth(sim))
    assert all(t == truths[0] for t in truths[1:])


# ---- any schedule of one board's faults, against the rule replayed naively ----------------------------
def _reference_swaps(faults: list[dict[str, Any]], xid79_new_board: bool,
                     run_s: float) -> tuple[list[tuple[float, str, list[str]]], dict[str, float | None]]:
    """The rule without the physics, on one GPU's faults (ids in onset order): the swaps in the order
    of their scheduled ends (``onset + duration``; a tie in the order of the ids); a swap whose own
    fault a swap before cured swaps nothing; each cures every fault of ``CURED_BY_NEW_BOARD`` not
    cured yet whose onset is at or before its time and whose own end is after; a cured fault's
    duration ends at that time. Returns the swaps (time, id, cured ids) and the final durations."""
    ordered = sorted(faults, key=lambda f: f["onset"])  # (stable: as the scenario orders its faults)
    ids = [f"f{i + 1}" for i in range(len(ordered))]
    duration: dict[str, float | None] = {fid: f.get("duration") for fid, f in zip(ids, ordered)}
    ends = {fid: math.inf if f.get("duration") is None else f["onset"] + f["duration"] for fid, f in zip(ids, ordered)}
    swapping = [(ends[fid], i, fid) for i, (fid, f) in enumerate(zip(ids, ordered))
                if (f["type"] == "gpu_replacement" or (f["type"] == "xid79" and xid79_new_board))
                and ends[fid] <= run_s]
    cured: set[str] = set()
    swaps = []
    for when, _, fid in sorted(swapping):
        if fid in cured:
            continue
        now_cured = [other for other, f in zip(ids, ordered) if other != fid and other not in cured
                     and f["type"] in CURED_BY_NEW_BOARD and f["onset"] <= when < ends[other]]
        for other in now_cured:
            cured.add(other)
            duration[other] = when - ordered[ids.index(other)]["onset"]
        swaps.append((when, fid, now_cured))
    return swaps, duration


@st.composite
def _board_faults(draw: st.DrawFn) -> list[dict[str, Any]]:
    """1-6 faults on one GPU, at tenths of a second (on and between every step here), some starting
    where another ends (onsets up to 20 s, durations up to 15 s: all over by 50 s)."""
    times = st.integers(0, 200).map(lambda tenths: tenths / 10.0)
    faults: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 6))):
        ftype = draw(st.sampled_from(["gpu_replacement", "gpu_replacement", "xid79", "tim_degradation", "hbm_overheat"]))
        onset = draw(times)
        ending = [f for f in faults if f["duration"] is not None and f["onset"] <= 20.0]
        if ending and draw(st.booleans()):  # on another fault's end: the boundaries of the rule
            other = draw(st.sampled_from(ending))
            onset = other["onset"] + other["duration"]
        duration = draw(st.one_of(st.none(), st.integers(1, 150).map(lambda tenths: tenths / 10.0)))
        if ftype == "gpu_replacement" and duration is None:
            duration = 5.0
        faults.append({"type": ftype, "target": GPU, "onset": onset, "duration": duration})
    return faults


@settings(max_examples=30, deadline=None)
@given(faults=_board_faults(), xid79_new_board=st.booleans(), steps=st.sampled_from(STEPS + INEXACT_STEPS))
def test_any_schedule_of_swaps_cures_what_the_rule_says_at_any_step(
        faults: list[dict[str, Any]], xid79_new_board: bool, steps: tuple[float, float | None]) -> None:
    run_s = 55.0  # past every swap
    sim = _run(faults, *steps, duration=run_s, params={"xid79_new_board": xid79_new_board})
    swaps, durations = _reference_swaps(faults, xid79_new_board, run_s)
    got = [(e.time, e.fault_id, e.detail["faults_cured"]) for e in sim.events if e.type == "gpu_replaced"]
    assert got == [(sim.start_time + when, fid, cured) for when, fid, cured in swaps]
    assert {f.id: f.duration for f in sim.faults} == durations
    assert [e.detail["board_number"] for e in sim.events if e.type == "gpu_replaced"] == list(range(1, len(swaps) + 1))
    # and the whole ground truth as the 10-s sampling writes it
    assert _ground_truth(sim) == _ground_truth(_run(faults, 10.0, None, duration=run_s,
                                                    params={"xid79_new_board": xid79_new_board}))
