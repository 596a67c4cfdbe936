"""Straggler detector: the GPU slower, hotter or throttling more than its job peers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock import facts
from foreshock.detectors import straggler as sg
from foreshock.frames import Frame

from thermal_synth import run, small_topology


def job_frames(n=32, minutes=20, slow=None, hot=None, throttled=None, idle=()):
    rng = np.random.default_rng(0)
    frames = []
    for t in np.arange(0.0, minutes * 60, 10.0):
        clock = np.full(n, facts.SM_CLOCK_MAX_HZ) * (1 - 0.005 * rng.random(n))
        temp = 60 + rng.normal(0, 1, n)
        bits = np.zeros(n)
        util = np.ones(n)
        util[list(idle)] = 0.0
        if slow is not None:
            clock[slow] *= 0.85
        if hot is not None:
            temp[hot] += 15
        if throttled is not None and int(t / 10) % 2 == 0:
            bits[throttled] = facts.THROTTLE_SW_THERMAL
        frames.append(Frame("gpu", np.full(n, t), np.arange(n), {
            "sm_clock": clock, "sm_clock_max": np.full(n, facts.SM_CLOCK_MAX_HZ), "util": util,
            "gpu_temp": np.round(temp), "throttle_reasons": bits}))
    return frames


@pytest.mark.kernel
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 30), st.one_of(st.floats(0, 2e9), st.just(float("nan")))),
                min_size=1, max_size=30))
def test_ew_kernel_matches_reference(samples):
    obs = []
    t = 0.0
    for dt, clock in samples:
        t += dt
        obs.append([t, 0.0, clock, 2e9, 1.0, 50.0, 0.0])
    s = np.full((1, sg.S_SIZE), np.nan)
    s[0, sg.S_N] = 0.0
    assert sg._ew_kernel(np.ascontiguousarray(np.array(obs)), s, 120.0) == 0
    mean, last = math.nan, math.nan
    for row in obs:
        w = 1.0 if math.isnan(last) else 1 - math.exp(-(row[0] - last) / 120.0)
        last = row[0]
        x = row[2] / row[3]
        if not math.isnan(x):
            mean = x if math.isnan(mean) else mean + w * (x - mean)
    assert (math.isnan(mean) and math.isnan(s[0, sg.S_CLOCK])) or s[0, sg.S_CLOCK] == pytest.approx(mean)


def test_slow_hot_and_throttling_gpus_are_named():
    topo = small_topology()  # one job over 4 nodes
    found = run(sg.StragglerDetector(topo), job_frames(slow=5, hot=17, throttled=30))
    assert {(f.slot, f.field) for f in found} == {(5, "sm_clock"), (17, "gpu_temp"), (30, "throttle_reasons")}
    slow = next(f for f in found if f.slot == 5)
    assert "sets the job's step time" in slow.reason and slow.score == pytest.approx(0.15, abs=0.02)


def test_uniform_job_and_idle_gpus_are_quiet():
    topo = small_topology()
    assert run(sg.StragglerDetector(topo), job_frames(idle=(3, 4))) == []


def test_state_round_trip_gives_identical_future_output():
    topo = small_topology()
    frames = job_frames(slow=9, minutes=40)
    a = sg.StragglerDetector(topo, refresh_s=120)
    run(a, frames[:60])
    b = sg.StragglerDetector(topo, refresh_s=120)
    b.load_state_dict(a.state_dict())
    rest = run(a, frames[60:])
    assert rest == run(b, frames[60:]) and rest
    assert a.state_nbytes() / topo.size("gpu") <= 1024


def test_a_topology_without_jobs_has_no_stragglers_and_does_not_fail() -> None:
    from foreshock.detectors.straggler import StragglerDetector
    from foreshock.frames import Frame
    from foreshock.topology import Topology

    topo = Topology.from_gpu_hosts([("host", g) for g in range(8)])  # what an importer derives
    det = StragglerDetector(topo)
    found = []
    for t in range(0, 1200, 10):
        temp = np.full(8, 60.0)
        temp[3] = 85.0
        found += det.update(Frame("gpu", np.full(8, float(t)), np.arange(8),
                                  {"gpu_temp": temp, "util": np.ones(8), "sm_clock": np.full(8, 1.98e9),
                                   "throttle_reasons": np.zeros(8), "power": np.full(8, 650.0)}))
    assert found == []
