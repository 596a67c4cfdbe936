"""The thermal fit that thermal, power and cooling share: sharing one fit per frame must not
change what any of them finds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import thermal_fit as tf
from foreshock.detectors.bank import DetectorBank
from foreshock.frames import Frame

from thermal_synth import Fault, World, small_topology

FIT_USERS = ("thermal", "power", "cooling")


@pytest.fixture(scope="module")
def world_frames():
    topo = small_topology()
    # loaded close to the cap (leakage as they heat predicts power caps), a failing interface
    # (cooling flags it, thermal predicts its throttle) and a rack losing cooling
    world = World(topo, load_w=680.0, faults=[Fault("tim_degradation", 3, 900, 1.0),
                                              Fault("power_ramp", 12, 600, 0.1),
                                              Fault("cooling_loss", 1, 3600, 0.004)], seed=5)
    frames, _ = world.run(3 * 3600)
    return topo, frames


def bank_of(topo, names):
    return DetectorBank.from_names(topo, names, processors=())


def run(bank, frames):
    out = []
    for f in frames:
        out += bank.update(f)
    return out


def by_detector(findings, name):
    return [f for f in findings if f.detector == name]


@pytest.mark.parametrize("name", FIT_USERS)
def test_a_detector_alone_finds_what_it_finds_in_the_full_bank(world_frames, name):
    topo, frames = world_frames
    full = bank_of(topo, FIT_USERS + ("straggler",))
    fits = {id(d.fit) for d in full.detectors if isinstance(d, tf.ThermalFitDetector)}
    assert len(fits) == 1  # they share one fit, so this compares the shared path with the own one
    together = by_detector(run(full, frames), name)
    alone = run(bank_of(topo, [name]), frames)
    assert together == alone and alone


def test_differing_fit_parameters_are_not_shared(world_frames):
    topo, frames = world_frames
    bank = DetectorBank.from_names(topo, FIT_USERS, params={"thermal": {"tau_level_s": 600.0}}, processors=())
    thermal, power, cooling = bank.detectors
    assert thermal.fit is not power.fit and power.fit is cooling.fit
    found = run(bank, frames)
    assert by_detector(found, "power") == run(bank_of(topo, ["power"]), frames)


def test_a_frame_of_several_ticks_predicts_as_the_ticks_one_by_one(world_frames):
    """A replay window carries each GPU several times: every prediction must read the model as it
    stood after its own sample, not after the GPU's last sample of the window."""
    topo, frames = world_frames
    racks = [f for f in frames if f.kind == "rack"]
    gpus = [f for f in frames if f.kind == "gpu"]
    windowed, ticked = bank_of(topo, FIT_USERS), bank_of(topo, FIT_USERS)
    a, b = [], []
    for k in range(0, len(gpus), 6):
        rack = Frame.concat(racks[k:k + 6])
        a += windowed.update(rack) + windowed.update(Frame.concat(gpus[k:k + 6]))
        b += ticked.update(rack)
        for g in gpus[k:k + 6]:
            b += ticked.update(g)
    for name in ("thermal", "power"):  # cooling compares peers at the frame's end: not per tick
        assert by_detector(a, name) == by_detector(b, name) and by_detector(a, name)


def test_bank_state_round_trip_keeps_the_fit_shared(world_frames):
    topo, frames = world_frames
    half = len(frames) // 2
    a = bank_of(topo, FIT_USERS)
    run(a, frames[:half])
    b = bank_of(topo, FIT_USERS)
    b.load_state_dict(a.state_dict())
    rest_a, rest_b = run(a, frames[half:]), run(b, frames[half:])
    assert rest_a == rest_b
    assert {f.detector for f in rest_b} == set(FIT_USERS)
    assert b.state_nbytes() < sum(d.state_nbytes() for d in b.detectors)  # the shared fit counts once


def test_refeeding_a_frame_is_out_of_order_for_every_detector(world_frames):
    topo, frames = world_frames
    bank = bank_of(topo, FIT_USERS)
    run(bank, frames[:2])
    assert bank.update(frames[1]) == []
    for det in bank.detectors:
        assert det.health.problems[(det.name, "gpu samples out of time order")] == topo.size("gpu")


def naive_runs(slots):
    ends, current = [], set()
    for row, s in enumerate(slots):
        if s in current:
            ends.append(row)
            current = set()
        current.add(s)
    return ends + [len(slots)] if len(slots) else []


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 7), min_size=0, max_size=20), min_size=1, max_size=4))
def test_repeat_free_runs_matches_reference(frames):
    seen = np.full(8, -1, np.int64)
    next_id = 0
    for slots in frames:
        obs = np.zeros((len(slots), 2 + len(tf.OBS_FIELDS)), order="F")
        obs[:, tf.X_SLOT] = slots
        ends = np.empty(len(slots) + 1, np.int64)
        n = tf.repeat_free_runs(obs, seen, next_id, ends)
        next_id += n
        assert ends[:n].tolist() == naive_runs(slots)


@pytest.mark.parametrize("module", ["thermal", "power", "cooling", "straggler"])
def test_docstring_examples_run(module):
    import doctest
    import importlib
    assert doctest.testmod(importlib.import_module(f"foreshock.detectors.{module}")).failed == 0
