"""Board swaps on the fault clock: a swap (``gpu_replacement``, or an XID 79 repair with
``xid79_new_board``) happens at the swapping fault's scheduled end and cures exactly the faults of
the old board that the schedule has on at that time (begun before it, own end after; one begun at
it is the new board's), at any sampling interval and physics step. Before, the swap cured what was
started and not ended at the physics step that reached it: a thermal interface that began within
that step before the swap was kept at 1-s steps and cured at 0.5-s ones, an XID 79 that ended within
it was cured, and 0.2-s steps that sum to 19.99999999999996 drew the block of 20 s before a swap due
at 20 s, so the duplicate check of the random draws, and every later draw, depended on the step.
Then (d23a8b6) a random fault drawn after the step that made the swap, with its onset before it,
acted on the new board for good though the duplicate check had it cured; an old board's XID 79 begun
within the swap's step left the new board reporting it; a fault scheduled at the swap's time was
erased; nested XID 79s took 2^n calls to schedule."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.simulator import engine
from foreshock.simulator.engine import FAULT_DRAW_BLOCK_S, ClusterSimulator
from foreshock.simulator.faults import CURED_BY_NEW_BOARD, random_fault_rate_per_s
from foreshock.simulator.scenario import scenario_from_dict

GPU = "node0/gpu0"
# (sampling interval, --physics-dt): whole-second steps, half-second ones, 5/6-s steps (2.5 s), and
# physics steps that do not divide the interval (10 s at 3 s: four of 2.5 s; 1 s at 0.3 s: four of 0.25 s)
STEPS = [(0.5, None), (1.0, None), (2.0, None), (2.5, None), (5.0, None), (10.0, None), (10.0, 3.0), (1.0, 0.3)]
# steps whose sum misses the block starts by a last bit (0.1 s, 0.2 s, 0.3 s, 0.4 s), as well
INEXACT_STEPS = [(0.1, None), (0.2, None), (0.3, None), (0.4, None), (10.0, 0.2)]
# steps that cross block starts without landing on them (15 s, 7 s, 3.75 s), and 0.3 s's by a last bit
CROSSING_STEPS = [(15.0, 15.0), (7.0, 7.0), (30.0, 4.0), (0.3, None)]
# a few of each, where every step is more than the test needs
SOME_STEPS = [(1.0, None), (10.0, None), (2.5, None), (0.2, None)] + CROSSING_STEPS
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
Planned = tuple[str, str, str, float, float | None]
"""A fault as scheduled, scripted or drawn: (id, type, target, onset, duration)."""


def _scripted(faults: list[dict[str, Any]]) -> list[Planned]:
    """A scenario's faults as the simulator schedules them: in onset order (stable), ids f1, f2 .."""
    ordered = sorted(faults, key=lambda f: f["onset"])
    return [(f"f{i + 1}", f["type"], f["target"], f["onset"], f.get("duration")) for i, f in enumerate(ordered)]


def _reference_swaps(schedule: list[Planned], xid79_new_board: bool,
                     run_s: float) -> tuple[list[tuple[float, str, list[str]]], dict[str, float | None]]:
    """The rule without the physics, on the faults as scheduled (in the simulator's order): the swaps
    in the order of their scheduled ends (``onset + duration``; a tie in the order of the faults); a
    swap whose own fault a swap before cured swaps nothing; each cures every fault of its GPU in
    ``CURED_BY_NEW_BOARD`` not cured yet whose onset is before its time (one begun at it is the new
    board's) and whose own end is after; a cured fault's duration ends at that time. Returns the
    swaps (time, id, cured ids) and the final durations."""
    duration = {fid: d for fid, _, _, _, d in schedule}
    ends = {fid: math.inf if d is None else onset + d for fid, _, _, onset, d in schedule}
    swapping = [(ends[fid], i, fid, target) for i, (fid, ftype, target, _, _) in enumerate(schedule)
                if (ftype == "gpu_replacement" or (ftype == "xid79" and xid79_new_board)) and ends[fid] <= run_s]
    cured: set[str] = set()
    swaps = []
    for when, _, fid, target in sorted(swapping):
        if fid in cured:
            continue
        now_cured = [other for other, ftype, on, onset, _ in schedule
                     if on == target and other != fid and other not in cured
                     and ftype in CURED_BY_NEW_BOARD and onset < when < ends[other]]
        for other in now_cured:
            cured.add(other)
            duration[other] = when - next(onset for o, _, _, onset, _ in schedule if o == other)
        swaps.append((when, fid, now_cured))
    return swaps, duration


def _assert_swaps(sim: ClusterSimulator, swaps: list[tuple[float, str, list[str]]]) -> None:
    """The run's ``gpu_replaced`` events are ``swaps`` (elapsed time, swapping fault, faults cured)."""
    got = [(e.time, e.fault_id, e.detail["faults_cured"]) for e in sim.events if e.type == "gpu_replaced"]
    assert got == [(sim.start_time + when, fid, cured) for when, fid, cured in swaps]


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
@given(faults=_board_faults(), xid79_new_board=st.booleans(),
       steps=st.sampled_from(STEPS + INEXACT_STEPS + CROSSING_STEPS))
@pytest.mark.slow
def test_any_schedule_of_swaps_cures_what_the_rule_says_at_any_step(
        faults: list[dict[str, Any]], xid79_new_board: bool, steps: tuple[float, float | None]) -> None:
    run_s = 55.0  # past every swap
    sim = _run(faults, *steps, duration=run_s, params={"xid79_new_board": xid79_new_board})
    swaps, durations = _reference_swaps(_scripted(faults), xid79_new_board, run_s)
    _assert_swaps(sim, swaps)
    assert {f.id: f.duration for f in sim.faults} == durations
    assert [e.detail["board_number"] for e in sim.events if e.type == "gpu_replaced"] == list(range(1, len(swaps) + 1))
    # and the whole ground truth as the 10-s sampling writes it
    assert _ground_truth(sim) == _ground_truth(_run(faults, 10.0, None, duration=run_s,
                                                    params={"xid79_new_board": xid79_new_board}))


# ---- random faults drawn in the step that makes a swap ------------------------------------------------
def _run_drawing(faults: list[dict[str, Any]], interval: float, physics_dt: float | None, *, duration: float,
                 params: dict[str, Any] | None = None, seed: int = 3,
                 acceleration: float = ACCELERATION) -> tuple[ClusterSimulator, list[Planned]]:
    """A run with random faults, and its faults as scheduled (scripted, then drawn), their durations
    as drawn, before any swap cut them."""
    scheduled: list[Planned] = []
    add_fault = ClusterSimulator._add_fault

    def add_and_note(sim: ClusterSimulator, *args: Any) -> Any:
        fault = add_fault(sim, *args)
        scheduled.append((fault.id, fault.type, fault.target_name, fault.onset, fault.duration))
        return fault

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ClusterSimulator, "_add_fault", add_and_note)
        scenario = scenario_from_dict({"name": "swap-clock", "faults": faults, "params": params or {}})
        sim = ClusterSimulator(gpus=8, scenario=scenario, seed=seed, interval=interval, duration=duration,
                               random_faults=True, fault_acceleration=acceleration, warmup_s=0, physics_dt=physics_dt)
        for _ in sim.iter_ticks():
            pass
    return sim, scheduled


def _assert_no_fault_doubled(sim: ClusterSimulator) -> None:
    """The draw's rule, read from the ground truth: no two faults of one type on one entity at once
    (a random fault drawn while one of its type is on there, or still to come, is dropped)."""
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for f in sim.faults:
        end = math.inf if f.duration is None else f.onset + f.duration
        spans.setdefault((f.type, f.target_name), []).append((f.onset, end))
    for key, on in spans.items():
        on.sort()
        assert all(end <= next_onset for (_, end), (next_onset, _) in zip(on, on[1:])), key


# each (interval, --physics-dt) with a swap due within the step that crosses a block's start, after
# that start: (interval, physics_dt, block start, swap time, run's length: a multiple of the interval
# and of 10 s, so that both runs end together, seed). A thermal interface of each GPU of node0 is on
# at the block before and over by this one, so its first random one there is kept; 0.3-s steps cross
# 20 s from 19.8 s to 20.1 s, where seed 12 draws two before the swap at 20.09 s
CROSSING_A_BLOCK = [(15.0, 15.0, 20.0, 29.9, 60.0, 3), (7.0, 7.0, 30.0, 34.9, 70.0, 3),
                    (30.0, 4.0, 20.0, 22.4, 60.0, 3), (0.3, None, 20.0, 20.09, 30.0, 12)]


@pytest.mark.parametrize("interval, physics_dt, block, swap_time, run_s, seed", CROSSING_A_BLOCK)
def test_a_random_fault_drawn_in_the_swaps_step_before_the_swap_is_the_old_boards_and_cured(
        monkeypatch: pytest.MonkeyPatch, interval: float, physics_dt: float | None, block: float, swap_time: float,
        run_s: float, seed: int) -> None:
    """Drawn after the step that made the swap, such a fault was never cured though the duplicate
    check had it end at the swap: it acted on the new board for good, next to the next one drawn."""
    monkeypatch.setattr("foreshock.simulator.engine.RANDOM_FAULT_MIX", TIM_ONLY)
    faults: list[dict[str, Any]] = []
    for k in range(8):
        gpu = f"node0/gpu{k}"
        faults += [{"type": "tim_degradation", "target": gpu, "onset": 1.0, "duration": block - 9.0},
                   {"type": "gpu_replacement", "target": gpu, "onset": 5.0, "duration": swap_time - 5.0}]
    sim, scheduled = _run_drawing(faults, interval, physics_dt, duration=run_s, seed=seed)
    drawn_before_the_swap = [fid for fid, _, _, onset, _ in scheduled[len(faults):] if block <= onset < swap_time]
    assert drawn_before_the_swap  # the case at hand (one of eight GPUs at least)
    swaps, durations = _reference_swaps(scheduled, False, sim.elapsed)
    assert set(drawn_before_the_swap) <= {fid for _, _, cured in swaps for fid in cured}
    _assert_swaps(sim, swaps)
    assert {f.id: f.duration for f in sim.faults} == durations
    _assert_no_fault_doubled(sim)
    ten_second, _ = _run_drawing(faults, 10.0, None, duration=run_s, seed=seed)
    assert _ground_truth(sim) == _ground_truth(ten_second)


def _shorter_repairs(draw: Any) -> Any:
    """Random faults' repairs a 60th as long (20-60 s for an XID 79): many swaps within a short run."""
    def draw_shorter(fault_type: str, rng: Any) -> tuple[dict[str, float], float | None]:
        params, duration = draw(fault_type, rng)
        return params, None if duration is None else duration / 60.0
    return draw_shorter


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), steps=st.sampled_from(CROSSING_STEPS))
def test_random_board_faults_cure_what_the_rule_says_on_steps_crossing_the_blocks(
        seed: int, steps: tuple[float, float | None]) -> None:
    """Random thermal interfaces, HBM faults and XID 79s that swap boards (repairs of 20-60 s), and a
    swap scripted on each GPU, on steps that cross the blocks' starts: the swaps cure what the rule
    says of the faults as scheduled, as at 10 s, and the physics acts on exactly the faults the ground
    truth has on at the end."""
    faults = [{"type": "gpu_replacement", "target": f"node0/gpu{k}", "onset": 7.3 * (k + 1), "duration": 23.45 + k}
              for k in range(8)]
    run_s, params = 210.0, {"xid79_new_board": True}  # (a multiple of every interval: the runs end together)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "RANDOM_FAULT_MIX", {"tim_degradation": 1.0, "hbm_overheat": 1.0, "xid79": 1.0})
        mp.setattr(engine, "draw_random_params", _shorter_repairs(engine.draw_random_params))
        acceleration = 2.0 / random_fault_rate_per_s(1, 1.0)
        sim, scheduled = _run_drawing(faults, *steps, duration=run_s, params=params, seed=seed,
                                      acceleration=acceleration)
        ten_second, _ = _run_drawing(faults, 10.0, None, duration=run_s, params=params, seed=seed,
                                     acceleration=acceleration)
    swaps, durations = _reference_swaps(scheduled, True, sim.elapsed)
    _assert_swaps(sim, swaps)
    assert {f.id: f.duration for f in sim.faults} == durations
    _assert_no_fault_doubled(sim)
    assert _ground_truth(sim) == _ground_truth(ten_second)
    on = [f for f in sim.faults if f.onset < sim.elapsed and (f.duration is None or f.onset + f.duration > sim.elapsed)]
    for g, name in enumerate(sim.topology.gpus):
        assert (sim.r_factor[g] > 1.0) == any(f.target_name == name and f.type == "tim_degradation" for f in on)
        assert (sim.hbm_r_factor[g] > 1.0) == any(f.target_name == name and f.type == "hbm_overheat" for f in on)
        assert sim.fault_dead[g] == any(f.target_name == name and f.type in ("xid79", "gpu_replacement") for f in on)


# ---- the old board's XID 79 within the swap's step -----------------------------------------------------
def test_an_old_boards_xid79_within_the_swaps_step_is_not_reported_by_the_new_board() -> None:
    """A swap at 25.7 s and an XID 79 of the old board at 25.3 s, which the swap cures: the new board
    reports no XID (``xid_last`` 0) from the swap on, at every step. Started after the new board was in
    (1-s steps, 10-s ones), it had set the new board's ``xid_last`` to 79 for good."""
    faults = [{"type": "gpu_replacement", "target": GPU, "onset": 3.0, "duration": 22.7},
              {"type": "xid79", "target": GPU, "onset": 25.3, "duration": 100.0}]
    swap_time = 25.7
    for interval, physics_dt in SOME_STEPS:
        at = f"interval {interval}, physics_dt {physics_dt}"
        scenario = scenario_from_dict({"name": "xid-last", "faults": faults})
        sim = ClusterSimulator(gpus=8, scenario=scenario, seed=3, interval=interval, duration=30.0, warmup_s=0,
                               physics_dt=physics_dt)
        g = sim.topology.slot("gpu", GPU)
        after_swap = []
        for frames in sim.iter_ticks():
            (gpu_frame,) = [frame for frame in frames if frame.kind == "gpu"]
            row = gpu_frame.slot == g
            if sim.elapsed >= swap_time and row.any():
                after_swap.append(float(gpu_frame.columns["xid_last"][row][0]))
        read = [x for x in after_swap if not math.isnan(x)]  # (a sample may miss a field)
        assert read and set(read) == {0.0}, at
        xids = [(e.time, e.fault_id) for e in sim.events if e.type == "xid" and e.entity == GPU]
        assert xids == [(sim.start_time + 25.3, "f2")], at
        _assert_swaps(sim, [(swap_time, "f1", ["f2"])])


# ---- a fault scheduled at the swap's time is the new board's --------------------------------------------
AT_THE_RETURN = [
    {"type": "gpu_replacement", "target": GPU, "onset": 5.0, "duration": 15.0},
    {"type": "tim_degradation", "target": GPU, "onset": 20.0, "params": {"r_per_hour": 6.0}},  # arrives bad
    {"type": "xid79", "target": "node0/gpu1", "onset": 5.0, "duration": 15.0},
    {"type": "xid79", "target": "node0/gpu1", "onset": 20.0, "duration": 10.0},  # the new board falls off too
]


def test_a_fault_scheduled_at_the_swaps_time_is_the_new_boards_at_every_step() -> None:
    """A thermal interface scripted at a return is the replacement arriving bad: it acts on the new
    board; an XID 79 at the return of an XID 79's swap falls the new board off the bus and swaps it in
    turn. They had been cured at the swap with a duration of 0.0 (the XID's events still told)."""
    run_s = 40.0
    swaps, durations = _reference_swaps(_scripted(AT_THE_RETURN), True, run_s)
    assert swaps == [(20.0, "f1", []), (20.0, "f2", []), (30.0, "f4", [])]  # the rule, on its own
    for interval, physics_dt in SOME_STEPS:
        at = f"interval {interval}, physics_dt {physics_dt}"
        sim = _run(AT_THE_RETURN, interval, physics_dt, duration=run_s, params={"xid79_new_board": True}, seed=0)
        _assert_swaps(sim, swaps)  # f3 and f4 cured by none
        assert {f.id: f.duration for f in sim.faults} == durations, at
        g = sim.topology.slot("gpu", GPU)
        assert sim.r_factor[g] > 1.0 and sim.gpu_cause[g] == 2, at  # f3 acts on the new board
        assert [e.time for e in sim.events if e.type == "xid" and e.entity == "node0/gpu1"] == [
            sim.start_time + 5.0, sim.start_time + 20.0], at


# ---- many board faults on one GPU ---------------------------------------------------------------------
def test_nested_xid79s_are_scheduled_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """20 XID 79s that swap boards on one GPU, each ending before the one begun before it: the last
    begun swaps first and cures the other 19, as the rule says. Following each swap back through the
    swaps that might cure it took 2^n look-ups (12.5 s for this run); a pass over the slot's faults per
    question takes a few thousand."""
    n = 20
    faults = [{"type": "xid79", "target": GPU, "onset": float(k), "duration": 100.0 - 2 * k} for k in range(n)]
    budget = 50 * n * n
    calls = 0
    swaps_board = ClusterSimulator._swaps_board

    def counted(sim: ClusterSimulator, f: Any) -> bool:
        nonlocal calls
        calls += 1
        if calls > budget:
            raise AssertionError(f"over {budget} look-ups of which faults swap boards")
        return swaps_board(sim, f)

    monkeypatch.setattr(ClusterSimulator, "_swaps_board", counted)
    run_s = 120.0
    sim = _run(faults, 10.0, None, duration=run_s, params={"xid79_new_board": True})
    swaps, durations = _reference_swaps(_scripted(faults), True, run_s)
    assert swaps == [(100.0 - (n - 1), f"f{n}", [f"f{k + 1}" for k in range(n - 1)])]
    _assert_swaps(sim, swaps)
    assert {f.id: f.duration for f in sim.faults} == durations
