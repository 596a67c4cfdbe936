"""Straggler: a job whose busy GPUs split in two halves is judged against its better half.

Between two equal halves a job's median sits midway and its MAD is half their distance, which no
deficit reaches k_mad (4) times: the slower half of a job, which in synchronous training sets the
pace of the other, went unnamed. Only the median's own neighbours split a job: one spread wide by
degrees (a loop-wide cooling loss) keeps its median and MAD (a bar capped at two gaps named the slowest
10-14 % of such jobs)."""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors import straggler as sg
from foreshock.frames import Frame

from test_straggler import naive_compare
from test_straggler_audit2 import named, run, topology


@pytest.mark.kernel  # the comparison kernel's split rule: rerun as Python too
def test_the_slower_half_of_a_job_is_named_and_only_a_split_at_the_median_moves_the_reference():
    """4 GPUs of a one-node job's 8 at 80 % of the clock (20 % slower: four gaps) are named, with a
    score of their deficit against the better half (~0.2, not the 0.11 against the midway median) and
    a reason that says so; the same for node n1 of a two-node job. The two GPUs of a two-GPU job 15 %
    apart: the slower is named. Halves 7 % apart (past one gap, short of two: within how far identical
    GPUs differ) name nobody, nor does a 128-GPU job whose clocks spread evenly from 70 to 100 % (its
    slowest 28 sit 2 gaps or more under its median, which a bar capped at 2 gaps named; its MAD is 7.5 %)."""
    half = lambda share: lambda c: np.where(np.arange(len(c)) >= len(c) // 2, c * share, c)  # noqa: E731
    found = run(sg.StragglerDetector(topology(1)), 8, clock_fn=half(0.8))
    assert named(found, "sm_clock") == {4, 5, 6, 7}
    slow = [f for f in found if f.field == "sm_clock"]
    # deficit against the better half's median (~0.9975 of the max) of a clock ~0.8 x that: ~0.2
    assert all(0.19 < f.score < 0.21 for f in slow), [f.score for f in slow]
    assert all("better half median" in f.reason and "split in two halves" in f.reason for f in slow)
    assert named(run(sg.StragglerDetector(topology(2)), 16, clock_fn=half(0.8)), "sm_clock") == set(range(8, 16))
    # a job of two busy GPUs (six of its node's eight idle): each is the other's half
    two = topology(1)
    det = sg.StragglerDetector(two)
    found = []
    for t in np.arange(0.0, 900.0, 10.0):
        found += det.update(Frame("gpu", np.full(8, t), np.arange(8), {
            "sm_clock": np.array([1.98e9, 1.98e9 * 0.85] + [3e8] * 6), "sm_clock_max": np.full(8, 1.98e9),
            "util": np.array([1.0, 1.0] + [0.0] * 6), "gpu_temp": np.full(8, 60.0), "throttle_reasons": np.zeros(8),
            "power": np.full(8, 600.0)}))
    assert named(found, "sm_clock") == {1}

    # halves 7 % apart: over the gap (5 %), short of split_gaps (2) gaps: nobody
    assert run(sg.StragglerDetector(topology(2)), 16, clock_fn=half(0.93)) == []
    # 128 GPUs spread evenly over 70-100 % of the clock: its median ~0.85, MAD ~0.075; no split at
    # its median (neighbours 0.24 % apart), nobody named (a bar capped at 2 gaps named the 28 under 0.765)
    spread = np.linspace(0.70, 1.0, 128)
    assert run(sg.StragglerDetector(topology(16)), 128, clock_fn=lambda c: c * spread) == []


def split_states() -> list[tuple[np.ndarray, np.ndarray]]:
    """Comparison states (``S_*`` columns) and GPU jobs: jobs of 2, 4 and 16 busy GPUs split in two
    halves on the clock, the temperature or the throttled share, a job 7 % apart (no split) and a
    job of 5 (an odd count: no split), with 0.3 % noise."""
    rng = np.random.default_rng(3)
    states = []
    for n, check, apart in [(2, sg.C_CLOCK, 0.3), (4, sg.C_TEMP, 30.0), (16, sg.C_THROTTLE, 0.9),
                            (16, sg.C_CLOCK, 0.5), (8, sg.C_CLOCK, 0.07), (5, sg.C_CLOCK, 0.5)]:
        s = np.column_stack([np.full(n, 1000.0), 1.0 - 0.003 * rng.random(n), 60.0 + 0.3 * rng.random(n), np.ones(n),
                             0.003 * rng.random(n), np.full(n, 50.0), np.full(n, 1000.0), np.full(n, 650.0),
                             np.full(n, 1000.0), np.ones(n), *[np.full(n, 1000.0)] * 4])
        worse = np.arange(n) >= n // 2
        if check == sg.C_CLOCK:
            s[worse, sg.S_CLOCK] -= apart
        else:
            s[worse, sg.CHECK_FIELDS[check]] += apart
        states.append((s, np.zeros(n, np.int64)))
    return states


@pytest.mark.kernel
def test_the_kernel_judges_split_jobs_as_the_reference_does():
    """The kernel against the numpy reference on jobs split in two halves on each check (the random
    states of test_straggler hold few): each split job's worse half is reported against its better
    half's median (O_HALF 1), the job 7 % apart and the job of five GPUs are not split."""
    p = dict(sg.PARAMS)
    vec = np.array([float(p[k]) for k in sg.PV_NAMES])
    reported = []
    for s, gpu_job in split_states():
        n = len(s)
        want = naive_compare(s, gpu_job, 1, np.full((n, 3), np.nan), 1000.0, p)
        flag, out, job = np.full((n, 3), np.nan), np.empty((3 * n, sg.O_SIZE)), np.empty(n, np.int64)
        got = sg._compare_kernel(s, gpu_job, 1, flag, 1000.0, vec, job, out, np.full(n, -1), np.empty((0, sg.R_SIZE)))
        assert got == len(want)
        np.testing.assert_allclose(out[:got], np.array(want).reshape(-1, sg.O_SIZE), rtol=1e-12)
        reported.append(sorted({(int(g), int(c), float(half)) for g, c, *_, half in out[:got]}))
    # the worse halves, by hand: GPU 1 of 2 (clock), GPUs 2-3 of 4 (temperature), 8-15 of 16
    # (throttled share), 8-15 of 16 (clock), all against their better half; none of the other two jobs
    assert reported == [[(1, sg.C_CLOCK, 1.0)], [(2, sg.C_TEMP, 1.0), (3, sg.C_TEMP, 1.0)],
                        [(g, sg.C_THROTTLE, 1.0) for g in range(8, 16)], [(g, sg.C_CLOCK, 1.0) for g in range(8, 16)],
                        [], []]
