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
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

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
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.floats(0.5, 900), st.just(0.0)),  # 0: a second row of the tick
                          st.one_of(st.floats(0, 2e9), st.sampled_from([float("nan"), float("inf"), -1e9, 2.6e9])),
                          st.sampled_from([0.0, 0.3, 0.5, 1.0, 1.2, 1.3, -0.5, float("inf"), float("nan")]),
                          st.one_of(st.floats(20, 95), st.sampled_from([float("nan"), float("inf"), -float("inf"),
                                                                        -50.0, 200.0, 1e6])),
                          st.sampled_from([0.0, float(facts.THROTTLE_SW_THERMAL), float(facts.THROTTLE_SW_POWER_CAP)]),
                          st.one_of(st.floats(0, 1000), st.just(0.0), st.just(float("nan"))),
                          st.sampled_from([2e9, 2e9, 2e9, 0.0, float("inf"), float("nan")])),
                min_size=1, max_size=30))
def test_ew_kernel_matches_reference(samples):
    """Utilisation averaged over the samples that have one, weighted by the time since the last
    one; clock, temperature and throttled share over busy samples only (utilisation >= 0.5),
    weighted by the time since the last busy one. A value out of its range (temperature outside
    -50..200 °C, clock ratio or utilisation outside 0..1.2, or not finite) is no reading. A row at
    the same time as the one before continues its tick: each mean that took no value at the tick
    takes the row's (at the tick's weight), none takes two; the tick is busy by its first utilisation."""
    obs = []
    t = 0.0
    for dt, clock, util, temp, bits, power, clock_max in samples:
        t += dt
        obs.append([t, 0.0, clock, clock_max, util, temp, bits, power])
    s = np.full((1, sg.S_SIZE), np.nan)
    s[0, sg.S_N] = 0.0
    m = np.array(obs)
    assert sg._ew_kernel(tuple(np.ascontiguousarray(c) for c in m.T), s, 120.0, 0.5) == 0

    def ew(mean, x, w):
        return x if math.isnan(mean) else mean + w * (x - mean)

    util_mean = clock_mean = temp_mean = throttled = power_mean = math.nan
    tick = last_util = last_busy = w_busy = math.nan
    clock_ts = temp_ts = throttle_ts = power_ts = math.nan  # when each busy mean last took a value
    taken: set[str] = set()  # the means that took a value at this tick
    n_busy = 0
    for ts, _, clock, clock_max, util, temp, bits, power in obs:
        if ts != tick:
            tick, taken = ts, set()
        if 0.0 <= util <= 1.2 and "util" not in taken:
            w = 1.0 if math.isnan(last_util) else 1 - math.exp(-(ts - last_util) / 120.0)
            util_mean = ew(util_mean, util, w)
            last_util = ts
            taken.add("util")
            if util >= 0.5:
                w_busy = 1.0 if math.isnan(last_busy) else 1 - math.exp(-(ts - last_busy) / 120.0)
                last_busy = ts
                n_busy += 1
        if last_busy != ts:  # idle or not known to be busy (no util, or the tick's first was idle)
            continue
        if math.isfinite(clock_max) and clock_max > 0 and 0.0 <= clock / clock_max <= 1.2 \
                and "clock" not in taken:
            clock_mean = ew(clock_mean, clock / clock_max, w_busy)
            clock_ts = ts
            taken.add("clock")
        if -50.0 < temp < 200.0 and "temp" not in taken:
            temp_mean = ew(temp_mean, temp, w_busy)
            temp_ts = ts
            taken.add("temp")
        if "throttle" not in taken:
            throttled = ew(throttled, 1.0 if int(bits) & sg.THROTTLING else 0.0, w_busy)
            throttle_ts = ts
            taken.add("throttle")
        if 0.0 < power < 1e5 and "power" not in taken:  # 0 W: an exporter's N/A, no reading
            power_mean = ew(power_mean, power, w_busy)
            power_ts = ts
            taken.add("power")
    for col, want in ((sg.S_UTIL, util_mean), (sg.S_CLOCK, clock_mean), (sg.S_TEMP, temp_mean),
                      (sg.S_THROTTLE, throttled), (sg.S_BUSY_TS, last_busy), (sg.S_N, n_busy),
                      (sg.S_POWER, power_mean), (sg.S_UTIL_TS, last_util), (sg.S_CLOCK_TS, clock_ts),
                      (sg.S_TEMP_TS, temp_ts), (sg.S_THROTTLE_TS, throttle_ts), (sg.S_POWER_TS, power_ts)):
        assert (math.isnan(want) and math.isnan(s[0, col])) or s[0, col] == pytest.approx(want), col



def test_rows_of_unknown_gpus_or_without_a_time_are_counted_and_read_nowhere():
    """The detector reads the frame's columns in place: a row whose slot is outside the topology
    or whose time is not finite is counted as an input problem and changes no GPU's means nor when
    the next comparison is due; a row older than its GPU's last is counted as out of order."""
    topo = small_topology(nodes=1, gpus=4, racks=1)
    health = PipelineHealth()
    det = sg.StragglerDetector(topo, health)
    busy = {"sm_clock": np.full(4, 1.5e9), "sm_clock_max": np.full(4, 2e9), "util": np.ones(4),
            "gpu_temp": np.full(4, 60.0), "throttle_reasons": np.zeros(4), "power": np.full(4, 500.0)}
    det.update(Frame("gpu", np.full(4, 100.0), np.arange(4), busy))
    before = det.s_gpu.copy()
    next_ts = det.next_ts
    odd = {k: np.full(4, 99.0 if k == "gpu_temp" else v[0]) for k, v in busy.items()}
    det.update(Frame("gpu", np.array([1e12, 1e12, np.nan, 50.0]), np.array([-1, 4, 0, 1]), odd))
    np.testing.assert_array_equal(det.s_gpu, before)
    assert det.next_ts == next_ts  # (the unknown GPUs' far-off time is nobody's "now")
    problems = health.counts()[1]
    assert problems[("straggler", "gpu rows with unknown slot or non-finite ts")] == 3
    assert problems[("straggler", "gpu samples out of time order")] == 1

def test_a_gpu_that_joins_its_job_late_is_not_called_slower():
    """A GPU idle at 0.17 of its max clock for 15 minutes, then running exactly like its peers.
    Averaged over every sample its clock read 0.55 against the job's 0.76 two minutes after it
    started: a "slower" straggler that was not."""
    topo = small_topology()
    frames = job_frames(n=32, minutes=30)
    for f in frames:
        if f.ts[0] < 900:
            f.columns["util"][5] = 0.0
            f.columns["sm_clock"][5] = 0.345e9
            f.columns["gpu_temp"][5] = 31.0
    assert run(sg.StragglerDetector(topo), frames) == []
    for f in frames[90:]:  # and once it does run slower, it is named
        f.columns["sm_clock"][5] *= 0.85
    assert {(f.slot, f.field) for f in run(sg.StragglerDetector(topo), frames)} == {(5, "sm_clock")}


def test_a_state_saved_before_busy_means_is_read_on():
    """A checkpoint written before the busy-sample column existed loads, and goes on finding what
    the state it came from would have."""
    topo = small_topology()
    frames = job_frames(slow=9, minutes=40)
    a = sg.StragglerDetector(topo, refresh_s=120)
    run(a, frames[:60])
    old = layout1(a.state_dict(), sg.S_BUSY_TS)  # the six columns of the old layout (no power either)
    b = sg.StragglerDetector(topo, refresh_s=120)
    b.load_state_dict(old)
    rest = run(a, frames[60:])
    assert rest and run(b, frames[60:]) == rest


def test_slow_hot_and_throttling_gpus_are_named():
    topo = small_topology()  # one job over 4 nodes
    found = run(sg.StragglerDetector(topo), job_frames(slow=5, hot=17, throttled=30))
    assert {(f.slot, f.field) for f in found} == {(5, "sm_clock"), (17, "gpu_temp"), (30, "throttle_reasons")}
    slow = next(f for f in found if f.slot == 5)
    assert "sets the job's step time" in slow.reason and slow.score == pytest.approx(0.15, abs=0.02)


@pytest.mark.parametrize("capped", [8, 16])
def test_gpus_holding_their_power_cap_more_than_their_peers_are_not_stragglers(capped):
    """Under full load GPUs sit on their SW power cap (0x4) by turns; those that hold it more only
    show it in their clock, a percent or two lower, which the "slower" check compares. Counted as
    "throttling more", the cap flagged half of a job a minute into its run (seed 21), or, held by
    half the job, hid a braking GPU behind the spread. A power brake (0x80) still counts."""
    topo = small_topology()
    frames = job_frames()
    for f in frames:
        f.columns["throttle_reasons"][:capped] = facts.THROTTLE_SW_POWER_CAP  # all the time
        f.columns["sm_clock"][:capped] *= 0.985
        f.columns["throttle_reasons"][20] = facts.THROTTLE_HW_POWER_BRAKE
    found = run(sg.StragglerDetector(topo), frames)
    assert {(f.slot, f.field) for f in found} == {(20, "throttle_reasons")}


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


def naive_compare(s, gpu_job, n_jobs, flag, now, p, gpu_rack=None, racks=None):
    """The job comparison restated with numpy, job by job (np.nanmedian): the outliers due a
    report, check by check and GPUs in order, as (gpu, check, excess, value, job median, inlet
    taken: the usual one of its rack, else its job's median, else none, 1 where the job was split in
    two halves and judged against its better half)."""
    window = 3 * p["interval_s"]
    busy = ((now - s[:, sg.S_UTIL_TS]) <= window) & (s[:, sg.S_UTIL] >= p["busy_util"]) \
        & (s[:, sg.S_N] >= p["min_samples"]) & (gpu_job >= 0)
    taken_at = {sg.S_CLOCK: sg.S_CLOCK_TS, sg.S_TEMP: sg.S_TEMP_TS, sg.S_THROTTLE: sg.S_THROTTLE_TS,
                sg.S_POWER: sg.S_POWER_TS}
    # each busy mean where it took a value within the window, else no value
    mean = {f: np.where(now - s[:, t] <= window, s[:, f], np.nan) for f, t in taken_at.items()}
    found = []
    gaps = (p["clock_gap"], p["temp_gap_c"], p["throttle_gap"])
    power_med = np.full(len(s), np.nan)  # each GPU's job's median busy power
    for j in range(n_jobs):
        members = busy & (gpu_job == j) & np.isfinite(mean[sg.S_POWER])
        if members.any():
            power_med[gpu_job == j] = np.median(mean[sg.S_POWER][members])
    inlet = np.full(len(s), np.nan)
    if racks is not None:
        inlet = np.array([racks[r, sg.R_USUAL] if 0 <= r < len(racks) else np.nan for r in gpu_rack])
    for j in range(n_jobs):  # a GPU whose rack knows no inlet: its job's median (over busy GPUs)
        known = busy & (gpu_job == j) & np.isfinite(inlet)
        if known.any():
            inlet[(gpu_job == j) & ~np.isfinite(inlet)] = np.median(inlet[known])
    for col, field in enumerate(sg.CHECK_FIELDS):
        x = np.where(busy, mean[field], np.nan)
        if col == sg.C_TEMP:  # read down: temp_per_w per watt above (1 + power_band) x the job's median
            with np.errstate(invalid="ignore"):
                above = mean[sg.S_POWER] - power_med * (1 + p["power_band"])
            x = x - p["temp_per_w"] * np.where(above > 0, above, 0.0) - np.where(np.isfinite(inlet), inlet, 0.0)
        d, spread = np.full(len(x), np.nan), np.full(len(x), np.nan)
        split = np.zeros(len(x))
        for j in range(n_jobs):
            members = busy & (gpu_job == j) & np.isfinite(x)
            if members.any():
                v = np.sort(x[members])
                d[gpu_job == j] = np.median(v)
                spread[gpu_job == j] = np.median(np.abs(v - np.median(v)))
                # an even count whose two middle values lie split_gaps gaps apart (a clock's relative to
                # the faster): judged against the better half (the higher clocks, the lower others)
                k = len(v)
                lo, hi = (v[k // 2 - 1], v[k // 2]) if k % 2 == 0 else (0.0, 0.0)
                least = p["split_gaps"] * gaps[col] * (hi if col == sg.C_CLOCK else 1.0)
                if hi - lo > 0 and hi - lo >= least:
                    better = v[k // 2:] if col == sg.C_CLOCK else v[:k // 2]
                    d[gpu_job == j] = np.median(better)
                    spread[gpu_job == j] = np.median(np.abs(better - np.median(better)))
                    split[gpu_job == j] = 1.0
        # a GPU already reported (flag set) stays an outlier down to clear_fraction of both bars
        bar = np.where(np.isnan(flag[:, col]), 1.0, p["clear_fraction"])
        with np.errstate(invalid="ignore", divide="ignore"):
            if col == sg.C_CLOCK:  # not a GPU whose heavier work (power) holds its clock down
                excess = (d - x) / np.where(d > 0, d, np.nan)
                heavier = (mean[sg.S_POWER] > power_med * (1 + p["clock_power_band"])) \
                    & (mean[sg.S_THROTTLE] < p["throttle_gap"])
                out = busy & (excess >= bar * gaps[col]) & ((d - x) >= bar * p["k_mad"] * spread) & ~heavier
            else:
                excess = sg.CHECK_SIGNS[col] * (x - d)
                out = busy & (excess >= bar * gaps[col]) & (excess >= bar * p["k_mad"] * spread)
        for g in range(len(x)):
            if not out[g]:
                flag[g, col] = np.nan
            elif np.isnan(flag[g, col]) or now - flag[g, col] >= p["refresh_s"]:
                flag[g, col] = now
                found.append((g, col, excess[g], s[g, field], d[g], inlet[g] if col == sg.C_TEMP else np.nan,
                              split[g]))
    return found


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_compare_kernel_matches_a_numpy_reference(seed):
    rng = np.random.default_rng(seed)
    n, n_jobs = int(rng.integers(1, 80)), int(rng.integers(1, 5))
    p = dict(sg.PARAMS)
    s = np.column_stack([
        1000.0 - rng.choice([0.0, 10.0, 500.0], n, p=[0.6, 0.3, 0.1]),  # last sample: some stale
        1.0 - rng.exponential(0.03, n) * (rng.random(n) < 0.3) - 0.2 * (rng.random(n) < 0.1),  # clock share
        np.round(60 + rng.normal(0, 2, n) + 15 * (rng.random(n) < 0.1)),  # temperature
        rng.choice([1.0, 0.9, 0.2], n, p=[0.7, 0.2, 0.1]),  # utilisation
        rng.choice([0.0, 0.1, 0.6], n, p=[0.8, 0.1, 0.1]),  # throttled share
        rng.choice([0.0, 3.0, 50.0], n, p=[0.1, 0.1, 0.8]),  # busy samples
        1000.0 - rng.choice([0.0, 10.0, 500.0], n, p=[0.6, 0.3, 0.1]),  # last busy sample
        rng.choice([650.0, 700.0, 450.0, 800.0], n, p=[0.6, 0.2, 0.1, 0.1]) + rng.normal(0, 10, n),  # busy power
        1000.0 - rng.choice([0.0, 10.0, 500.0], n, p=[0.6, 0.3, 0.1]),  # last utilisation: some stale
        rng.random(n),  # the last busy tick's weight
        *[1000.0 - rng.choice([0.0, 10.0, 500.0], n, p=[0.7, 0.2, 0.1]) for _ in range(4)]])  # when each
    # busy mean (clock, temperature, throttled share, power) last took a value: some stale
    s[rng.random((n, sg.S_SIZE)) < 0.03] = np.nan
    gpu_job = rng.integers(-1, n_jobs, n)
    flag = np.where(rng.random((n, 3)) < 0.3, rng.choice([400.0, 900.0], (n, 3)), np.nan)
    # racks: some report no inlet (NaN), some sit 6-8 °C warmer; a GPU or two outside any rack
    n_racks = int(rng.integers(1, 5))
    racks = np.full((n_racks, sg.R_SIZE), np.nan)
    racks[:, sg.R_USUAL] = np.where(rng.random(n_racks) < 0.3, np.nan, 25.0 + rng.choice([0.0, 6.0, 8.0], n_racks))
    gpu_rack = np.where(rng.random(n) < 0.05, -1, rng.integers(0, n_racks, n))
    want_flag = flag.copy()
    want = naive_compare(s, gpu_job, n_jobs, want_flag, 1000.0, p, gpu_rack, racks)
    vec = np.array([float(p[k]) for k in sg.PV_NAMES])
    out, job = np.empty((3 * n, sg.O_SIZE)), np.empty(n, np.int64)
    got = sg._compare_kernel(s, gpu_job, n_jobs, flag, 1000.0, vec, job, out, gpu_rack, racks)
    np.testing.assert_array_equal(flag, want_flag)
    assert got == len(want)
    np.testing.assert_allclose(out[:got], np.array(want).reshape(-1, sg.O_SIZE), rtol=1e-12)


def test_the_compare_reference_finds_outliers_of_every_check():
    """The random states above do have outliers of each kind (a comparison of empty lists proves
    nothing)."""
    kinds = set()
    for seed in range(30):
        rng = np.random.default_rng(seed)
        n = 40
        s = np.column_stack([np.full(n, 1000.0), 1.0 - 0.2 * (rng.random(n) < 0.1),
                             60 + 15 * (rng.random(n) < 0.1), np.ones(n), 0.6 * (rng.random(n) < 0.1), np.full(n, 50.0),
                             np.full(n, 1000.0), np.full(n, 650.0), np.full(n, 1000.0), np.ones(n),
                             *[np.full(n, 1000.0)] * 4])
        kinds |= {col for _, col, *_ in naive_compare(s, np.zeros(n, np.int64), 1, np.full((n, 3), np.nan), 1000.0,
                                                      dict(sg.PARAMS))}
    assert kinds == {sg.C_CLOCK, sg.C_TEMP, sg.C_THROTTLE}


def test_the_compare_reference_takes_temperatures_over_the_racks_inlets():
    """... and it does take them over the inlets: two racks 8 °C apart, each GPU 8 °C over the
    other rack's inlet, the warm rack's and the cool rack's rack-less GPU named by none; a GPU
    on the warm rack 10 °C hotter than its rack-mates is."""
    n = 40
    gpu_rack = np.where(np.arange(n) < 30, 0, 1)
    gpu_rack[5] = -1  # a GPU outside any rack: the job's median inlet
    temp = np.where(gpu_rack == 1, 68.0, 60.0)
    temp[35] += 10.0
    s = np.column_stack([np.full(n, 1000.0), np.ones(n), temp, np.ones(n), np.zeros(n), np.full(n, 50.0),
                         np.full(n, 1000.0), np.full(n, 650.0), np.full(n, 1000.0), np.ones(n), np.zeros(n),
                         *[np.full(n, 1000.0)] * 4])
    racks = np.full((2, sg.R_SIZE), np.nan)
    racks[:, sg.R_USUAL] = [25.0, 33.0]
    job = np.zeros(n, np.int64)
    was = naive_compare(s, job, 1, np.full((n, 3), np.nan), 1000.0, dict(sg.PARAMS))
    assert [g for g, *_ in was] == list(range(30, 40))  # the warm rack, as it was
    found = naive_compare(s, job, 1, np.full((n, 3), np.nan), 1000.0, dict(sg.PARAMS), gpu_rack, racks)
    assert [(g, inlet) for g, _, _, _, _, inlet, _ in found] == [(35, 33.0)]


@pytest.mark.parametrize("racks_report", [False, True])
def test_a_pipeline_stage_given_more_work_is_not_hotter_at_the_same_load(racks_report):
    """A 4-stage pipeline whose last stage (node3) draws 700 W against the others' 480 W runs
    ~10 °C hotter: all eight of its GPUs were named "hotter ... at the same load" (signal
    hot_outlier: their own cooling). Read at the job's median power they are not; a GPU whose
    cooling fails still is, whether in the heavy stage or not. The same taken over the racks'
    inlet where they report it."""
    topo = small_topology()
    rng = np.random.default_rng(1)
    power = np.full(32, 480.0)
    power[24:] = 700.0

    def frames(bad=()):
        out = []
        for t in np.arange(0.0, 1200.0, 10.0):
            if racks_report:
                out.append(Frame("rack", np.full(2, t), np.arange(2), {"inlet_temp": np.full(2, 25.0)}))
            p = power * (1 + 0.01 * rng.standard_normal(32))
            temp = 25 + 0.046 * p + rng.normal(0, 0.5, 32)
            temp[list(bad)] += 15
            out.append(Frame("gpu", np.full(32, t), np.arange(32), {
                "sm_clock": np.full(32, facts.SM_CLOCK_MAX_HZ), "sm_clock_max": np.full(32, facts.SM_CLOCK_MAX_HZ),
                "util": np.ones(32), "gpu_temp": np.round(temp), "throttle_reasons": np.zeros(32), "power": p}))
        return out
    assert run(sg.StragglerDetector(topo), frames()) == []
    found = run(sg.StragglerDetector(topo), frames(bad=(3, 27)))
    assert {(f.slot, f.field) for f in found} == {(3, "gpu_temp"), (27, "gpu_temp")}
    heavy = next(f for f in found if f.slot == 27)
    assert "read at the job's load" in heavy.reason and 12 < heavy.score < 19
    assert ("over its rack's usual inlet 25 °C at 7" in heavy.reason) == racks_report


def test_a_state_saved_before_power_means_loads():
    topo = small_topology()
    frames = job_frames(slow=9, minutes=40)
    a = sg.StragglerDetector(topo, refresh_s=120)
    run(a, frames[:60])
    old = layout1(a.state_dict(), sg.S_POWER)  # the seven columns before the power mean
    b = sg.StragglerDetector(topo, refresh_s=120)
    b.load_state_dict(old)
    assert np.isnan(b.s_gpu[:, sg.S_POWER]).all()
    rest = run(a, frames[60:])
    assert rest and run(b, frames[60:]) == rest


def test_a_stage_whose_heavier_work_holds_its_clock_down_is_not_slower():
    """The real H200 (tests/data/h200_step) under a bf16 matmul: 691 W on its power cap (0x4) at
    1,483 MHz, 58 °C; under a memory-bound copy: 407 W at 1,980 MHz, 43 °C, both busy. A job whose
    last stage (node3) does the matmul while the others copy: its eight GPUs were "slower ... this
    GPU sets the job's step time" (0.75 vs 1). At the same load they are not; one of them slower
    than its stage-mates at the same power is still not named (a design limit: the job is the peer
    group), but a light-stage GPU clocked 15 % down is."""
    topo = small_topology()
    rng = np.random.default_rng(0)
    heavy = np.arange(32) >= 24

    def frames(slow=()):
        out = []
        for t in np.arange(0.0, 1200.0, 10.0):
            clock = np.where(heavy, 1.485e9, 1.98e9)
            clock[list(slow)] *= 0.85
            out.append(Frame("gpu", np.full(32, t), np.arange(32), {
                "sm_clock": clock, "sm_clock_max": np.full(32, 1.98e9), "util": np.full(32, 0.99),
                "gpu_temp": np.where(heavy, 58.0, 43.0) + np.round(rng.normal(0, 0.5, 32)),
                "throttle_reasons": np.where(heavy, float(facts.THROTTLE_SW_POWER_CAP), 0.0),
                "power": np.where(heavy, 691.0, 407.0) + rng.normal(0, 5, 32)}))
        return out
    assert run(sg.StragglerDetector(topo), frames()) == []
    assert {(f.slot, f.field) for f in run(sg.StragglerDetector(topo), frames(slow=(4,)))} == {(4, "sm_clock")}


def test_gpus_whose_exporter_prints_0_w_do_not_hide_a_hot_gpu():
    """0 W is no reading (as the thermal fit reads it): averaged in, a job where most exporters
    printed 0 for N/A had a median busy power of 0, every GPU that reported power was read down by
    0.046 °C/W times all of it, and the hot one was hidden (the final review of 2026-12-01)."""
    topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": f"n{i}", "rack": "k", "gpus": 8} for i in range(4)],
                               "jobs": [{"name": "j", "nodes": [f"n{i}" for i in range(4)]}]})
    found = {}
    for label, power in (("all read", np.full(32, 650.0)), ("most print 0", np.r_[np.full(4, 650.0), np.zeros(28)])):
        det = sg.StragglerDetector(topo)
        out = []
        for k in range(40):
            temp = np.full(32, 60.0)
            temp[3] = 75.0
            out += det.update(Frame("gpu", np.full(32, 30.0 * k), np.arange(32), {
                "sm_clock": np.full(32, 1.98e9), "sm_clock_max": np.full(32, 1.98e9), "util": np.ones(32),
                "gpu_temp": temp, "throttle_reasons": np.zeros(32), "power": power}))
        found[label] = sorted({(f.slot, f.field) for f in out})
    assert found["all read"] == [(3, "gpu_temp")] and found["most print 0"] == found["all read"]


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([-10.0, 0.0, 1.0, 10.0, 30.0, 600.0]), st.integers(0, 2),
                          st.one_of(st.floats(15, 45), st.sampled_from([0.0, -3.0, float("nan"), 1.0, 90.0]))),
                min_size=1, max_size=40))
def test_inlet_kernel_matches_reference(readings):
    """Per rack: the inlet averaged over tau_s; its usual inlet follows that average down at once
    and up over inlet_usual_tau_s. A reading without an inlet (NaN, 0 °C or below) or not after the
    rack's last is skipped; so is one more than max(5 °C, 1 °C/s since the last read) from the last
    reading read, until the next reading confirms it (near it, nearer than the last: read) or drops it."""
    tau, usual_tau = 120.0, 3600.0
    obs, t = [], 1000.0
    for dt, rack, v in readings:
        t += dt
        obs.append([t, float(rack), v, np.nan, np.nan])
    s = np.full((3, sg.R_SIZE), np.nan)
    sg._inlet_kernel(np.array(obs), s, tau, usual_tau)
    nan = math.nan
    want = {r: [nan] * 6 for r in range(3)}  # last ts, mean, usual, last reading, held, held at
    for ts, rack, v, _, _ in obs:
        last, mean, usual, last_v, held, held_ts = want[int(rack)]
        if not v > 0 or (not math.isnan(last) and ts <= last):
            continue
        confirms = abs(v - held) <= max(5.0, ts - held_ts) and abs(v - held) < abs(v - last_v)  # (NaN: False)
        if not confirms and abs(v - last_v) > max(5.0, ts - last):
            want[int(rack)][4:] = [v, ts]  # held back
            continue
        held = nan
        if math.isnan(last):
            want[int(rack)] = [ts, v, v, v, held, held_ts]
            continue
        mean += (1 - math.exp(-(ts - last) / tau)) * (v - mean)
        usual = mean if mean < usual else usual + (1 - math.exp(-(ts - last) / usual_tau)) * (mean - usual)
        want[int(rack)] = [ts, mean, usual, v, held, held_ts]
    for r in range(3):
        for col in (sg.R_TS, sg.R_INLET, sg.R_USUAL, sg.R_LAST, sg.R_HELD):
            w = want[r][col]
            assert (math.isnan(w) and math.isnan(s[r, col])) or s[r, col] == pytest.approx(w, rel=1e-12), (r, col)


def glitching(frames, rack, every, value):
    """``frames`` with ``rack``'s inlet reading ``value`` at every ``every``-th rack frame (a flaky
    BMC sensor)."""
    out, k = [], 0
    for f in frames:
        if f.kind == "rack":
            k += 1
            if k % every == 0:
                inlet = f.columns["inlet_temp"].copy()
                inlet[rack] = value
                f = Frame("rack", f.ts, f.slot, {"inlet_temp": inlet})
        out.append(f)
    return out


def test_a_rack_sensor_glitching_low_is_no_rack_of_hot_gpus():
    """The warm rack's inlet sensor reads 1 °C one poll in three (a flaky BMC sensor; 32 °C
    otherwise). Averaged in, the glitches dragged the rack's usual inlet ~11 °C low, and all 16 GPUs
    of the rack were named "hotter" than their job. Held back as jumps no loop makes, and dropped
    when the next reading is back, they move nothing; the hot GPU of the rack is still named alone,
    and a rack whose reading moves for good (recalibrated +8 °C) is read at its new level."""
    topo, frames = two_rack_job(minutes=60)
    det = sg.StragglerDetector(topo)
    assert fed(det, glitching(frames, 1, 3, 1.0)) == []
    assert det.s_rack[1, sg.R_USUAL] == pytest.approx(32.0, abs=0.3)
    _, frames = two_rack_job(minutes=60, hot=(53,))
    found = fed(sg.StragglerDetector(topo), glitching(frames, 1, 3, 1.0))
    assert {(f.slot, f.field) for f in found} == {(53, "gpu_temp")}
    moved = [Frame("rack", f.ts, f.slot, {"inlet_temp": f.columns["inlet_temp"] + [0.0, 8.0 * (f.ts[0] >= 1200)]})
             if f.kind == "rack" else f for f in two_rack_job(minutes=60)[1]]
    det = sg.StragglerDetector(topo)
    fed(det, moved)
    assert det.s_rack[1, sg.R_LAST] == pytest.approx(40.0, abs=0.5)


def two_rack_job(warm_inlet=32.0, hot=(), minutes=30, racks_report=True, seed=0, inlets=None):
    """One job on 8 nodes: rack k0 (nodes 0-5, GPUs 0-47) at a 25 °C inlet, rack k1 (nodes 6-7, GPUs
    48-63) at ``warm_inlet`` (two loops, or the end of one). Every GPU does the same work at the same
    thermal resistance, but those in ``hot`` (a worn interface: R x 1.35); power draws 3 W/°C more
    through leakage. ``inlets(t)``: the racks' inlets at time t instead (a loop warming). Rack frames
    (``inlet_temp``) before each tick's GPU frame, unless ``racks_report`` is False (dcgm-exporter
    alone)."""
    nodes = [f"n{i}" for i in range(8)]
    topo = Topology.from_dict({
        "rows": [{"name": "r0", "cooling_loop": "cdu0"}, {"name": "r1", "cooling_loop": "cdu1"}],
        "racks": [{"name": "k0", "row": "r0"}, {"name": "k1", "row": "r1"}],
        "nodes": [{"name": n, "rack": "k0" if i < 6 else "k1", "gpus": 8} for i, n in enumerate(nodes)],
        "jobs": [{"name": "j", "nodes": nodes}]})
    rng, rack_rng = np.random.default_rng(seed), np.random.default_rng(seed + 1)  # the same GPUs either way
    n = 64
    r = np.full(n, facts.THERMAL_RESISTANCE_C_PER_W)
    r[list(hot)] *= 1.35
    inlets = inlets or (lambda t: np.array([25.0, warm_inlet]))
    frames = []
    temp = inlets(0.0)[topo.gpu_rack] + r * 650.0
    for t in np.arange(0.0, minutes * 60.0, 10.0):
        rack_inlet = inlets(t)
        if racks_report:
            frames.append(Frame("rack", np.full(2, t), np.arange(2),
                                {"inlet_temp": np.round(rack_inlet + rack_rng.normal(0, 0.1, 2), 1)}))
        power = 650.0 + 3.0 * (temp - 60.0) + rng.normal(0, 5, n)
        temp = rack_inlet[topo.gpu_rack] + r * power + rng.normal(0, 0.5, n)
        frames.append(Frame("gpu", np.full(n, t), np.arange(n), {
            "sm_clock": np.full(n, facts.SM_CLOCK_MAX_HZ), "sm_clock_max": np.full(n, facts.SM_CLOCK_MAX_HZ),
            "util": np.ones(n), "gpu_temp": np.round(temp), "throttle_reasons": np.zeros(n), "power": power}))
    return topo, frames


def fed(det, frames):
    """``frames`` of the kinds ``det`` reads, as the bank routes them."""
    return run(det, [f for f in frames if f.kind in det.kinds])


def test_a_job_over_racks_with_different_inlets_is_compared_over_each_racks_inlet():
    """A job over two racks whose inlets are 25 and 32 °C (7 °C apart, the warm rack's GPUs ~8 °C
    hotter with their leakage), every GPU healthy and equal: all 16 GPUs of the warm rack were
    "hotter ... at the same load" (README: left as it was). Taken over their rack's inlet, none is;
    one with a worn interface (R x 1.35: +13 °C with its leakage) on the warm rack still is, and alone."""
    topo, frames = two_rack_job()
    assert sg.StragglerDetector(topo).kinds == ("gpu", "rack")
    assert fed(sg.StragglerDetector(topo), frames) == []
    _, frames = two_rack_job(hot=(53,))
    found = fed(sg.StragglerDetector(topo), frames)
    assert {(f.slot, f.field) for f in found} == {(53, "gpu_temp")}
    assert "over its rack's usual inlet 32" in found[0].reason and "median" in found[0].reason
    assert 11 < found[0].score < 16


def test_without_rack_inlets_a_job_is_compared_as_before():
    """dcgm-exporter alone: no rack frames, or rack frames without an inlet. Temperatures are
    compared as they are, as before: the warm rack's 16 GPUs are named, with the reason they had."""
    topo, frames = two_rack_job(racks_report=False)
    found = fed(sg.StragglerDetector(topo), frames)
    assert {f.slot for f in found} == set(range(48, 64)) and {f.field for f in found} == {"gpu_temp"}
    assert all("inlet" not in f.reason and "vs job j median" in f.reason for f in found)
    no_inlet = [Frame("rack", f.ts, f.slot, {"coolant_flow": np.full(len(f), 30.0)}) if f.kind == "rack" else f
                for f in two_rack_job()[1]]
    assert fed(sg.StragglerDetector(topo), no_inlet) == found


def test_a_gpu_whose_rack_reports_no_inlet_is_taken_over_its_jobs():
    """Only the cool rack reports its inlet: the warm rack's GPUs are taken over the job's median
    usual inlet (25 °C): named hotter, as without any inlet, and the reason says whose inlet."""
    topo, frames = two_rack_job()
    cool_only = [Frame("rack", f.ts[:1], f.slot[:1], {"inlet_temp": f.columns["inlet_temp"][:1]})
                 if f.kind == "rack" else f for f in frames]
    found = fed(sg.StragglerDetector(topo), cool_only)
    assert {f.slot for f in found} == set(range(48, 64))
    assert all("over the job's usual inlet 25" in f.reason for f in found)


def test_a_loop_warming_above_its_usual_still_reads_hotter():
    """The warm rack's loop loses flow: its inlet climbs 12 °C over ten minutes, holds twenty, and
    comes back. Its GPUs run hotter than the job minutes before they would throttle (the early sign
    of a cooling loss the evaluation scores): taken over the inlet *now* they were never named.
    Over the rack's usual inlet they are, while it lasts; not before, and not once it is back."""
    def inlets(t):
        up = np.interp(t, [1800, 2400, 3600, 4200], [0.0, 12.0, 12.0, 0.0])
        return np.array([25.0, 31.0 + up])

    topo, frames = two_rack_job(minutes=120, inlets=inlets)
    found = fed(sg.StragglerDetector(topo), frames)
    assert {f.slot for f in found} == set(range(48, 64)) and {f.field for f in found} == {"gpu_temp"}
    assert 1800 < min(f.ts for f in found) < 2400 and max(f.ts for f in found) < 4500
    assert fed(sg.StragglerDetector(topo, inlet_usual_tau_s=1e-6), frames) == []  # over the inlet now


def test_a_state_saved_before_rack_inlets_loads_and_learns_them():
    """A checkpoint written before ``s_rack`` existed loads (here and, moved, onto other hardware)
    and knows no inlet; the rack frames after it teach it the inlets, and the warm rack, named
    before, is not any more."""
    from foreshock.remap import Remap

    topo, frames = two_rack_job(minutes=60)
    a = sg.StragglerDetector(topo)
    before = fed(a, [f for f in frames[:120] if f.kind == "gpu"])  # 10 min of GPU frames only
    assert {f.slot for f in before} == set(range(48, 64))  # no inlet known: the warm rack, as before
    old = a.state_dict()
    del old["s_rack"]
    b = sg.StragglerDetector(topo)
    b.load_state_dict(old)
    assert np.isnan(b.s_rack).all()
    moved = b.remap_state(old, Remap(topo, topo))
    assert moved["s_rack"].shape == b.s_rack.shape and np.isnan(moved["s_rack"]).all()
    assert fed(b, frames[120:]) == [] and np.isfinite(b.s_rack[:, sg.R_USUAL]).all()


def fed_frames(n=16, minutes=60, slow_from=None, slow_until=None, util_gone_from=None, ahead_at=None):
    """Frames every 10 s of a 16-GPU job; GPU 5 runs 15 % slower from ``slow_from`` until
    ``slow_until`` (s), stops reporting util from ``util_gone_from``, and has one row stamped a day
    ahead at ``ahead_at``."""
    frames = []
    for t in np.arange(0.0, minutes * 60.0, 10.0):
        clock, util, ts = np.full(n, 1.98e9), np.ones(n), np.full(n, t)
        if slow_from is not None and slow_from <= t < (slow_until if slow_until is not None else np.inf):
            clock[5] *= 0.85
        if util_gone_from is not None and t >= util_gone_from:
            util[5] = np.nan
        if ahead_at is not None and t == ahead_at:
            ts[5] = t + 86400.0
        frames.append(Frame("gpu", ts, np.arange(n), {
            "sm_clock": clock, "sm_clock_max": np.full(n, 1.98e9), "util": util,
            "gpu_temp": np.full(n, 60.0), "throttle_reasons": np.zeros(n)}))
    return frames


def test_a_gpu_whose_util_stops_coming_is_not_compared_on_its_frozen_means():
    """GPU 5 slow for 10 minutes, then healthy, its exporter no longer sending util. Its busy means
    stand still without util (not known to be busy): kept "fresh" and "busy" on its last util, it was
    named "sets the job's step time" every refresh_s for the rest of the hour on its frozen clock."""
    topo = small_topology()
    found = run(sg.StragglerDetector(topo), fed_frames(slow_from=0.0, slow_until=600.0, util_gone_from=600.0))
    assert {(f.slot, f.field) for f in found} == {(5, "sm_clock")}
    assert all(f.ts < 600.0 + 3 * sg.PARAMS["interval_s"] for f in found), [f.ts for f in found]
    # ... while with util it is compared on as long as it lasts (the check above is not vacuous)
    slow = run(sg.StragglerDetector(topo), fed_frames(slow_from=0.0, util_gone_from=None))
    assert max(f.ts for f in slow) >= 3000.0


@pytest.mark.parametrize("field, check", [("sm_clock", "sm_clock"), ("gpu_temp", "gpu_temp")])
def test_a_busy_gpu_whose_clock_or_temperature_stops_coming_is_not_compared_on_that_frozen_mean(field, check):
    """GPU 5 slow (or hot) for 10 minutes, then healthy, still busy on its utilisation, its
    exporter no longer sending that one field. Its mean of the field stands still; compared on
    it, it was named every refresh_s for the rest of the hour. Now its report ends within three
    comparison intervals, and the same GPU with the field kept coming is named for the hour (the
    check is not vacuous)."""
    topo = small_topology()

    def frames(gone_from):
        out = fed_frames(slow_from=0.0 if field == "sm_clock" else None)
        for f in out:
            t = float(f.ts[0])
            if field == "gpu_temp" and t < 600.0:
                f.columns["gpu_temp"][5] = 75.0  # 15 °C hotter than its job
            if gone_from is not None and t >= gone_from:
                f.columns[field][5] = np.nan
        return out

    found = run(sg.StragglerDetector(topo), frames(gone_from=600.0))
    assert {(f.slot, f.field) for f in found} == {(5, check)}
    assert all(f.ts < 600.0 + 3 * sg.PARAMS["interval_s"] for f in found), [f.ts for f in found]
    kept = run(sg.StragglerDetector(topo), frames(gone_from=None))
    if field == "sm_clock":  # the slow clock goes on: named for the hour
        assert max(f.ts for f in kept) >= 3000.0


def test_a_gpu_whose_util_comes_back_is_compared_again():
    """Util gone for ten minutes, back: the GPU, slow meanwhile, is named again once its util is read."""
    topo = small_topology()
    frames = fed_frames(slow_from=0.0, util_gone_from=600.0)
    for f in frames[120:]:  # util back at 1200 s
        f.columns["util"][5] = 1.0
    found = [f.ts for f in run(sg.StragglerDetector(topo), frames)]
    assert found[0] < 600.0 and any(1200.0 <= t < 1400.0 for t in found), found
    assert not any(800.0 <= t < 1200.0 for t in found), found


def split_by_field(frame, *groups):
    return [Frame("gpu", frame.ts, frame.slot, {k: frame.columns[k] for k in group}) for group in groups]


def test_frames_split_by_field_at_one_tick_are_read_as_one():
    """Two sources scraping one tick (util and temperature from one, the clocks from the other):
    the second frame's rows continue the tick, not "out of order". Dropped whole, they lost every
    clock, and the slow GPU went unnamed."""
    topo = small_topology()
    frames = fed_frames(minutes=10, slow_from=0.0)
    whole_health, split_health = PipelineHealth(), PipelineHealth()
    whole, split = sg.StragglerDetector(topo, whole_health), sg.StragglerDetector(topo, split_health)
    found_whole = run(whole, frames)
    found_split = run(split, [part for f in frames for part in split_by_field(
        f, ("util", "gpu_temp"), ("sm_clock", "sm_clock_max", "throttle_reasons"))])
    assert {(f.slot, f.field) for f in found_whole} == {(5, "sm_clock")}
    assert [(f.ts, f.slot, f.field, f.score) for f in found_split] == \
        [(f.ts, f.slot, f.field, f.score) for f in found_whole]
    np.testing.assert_array_equal(split.s_gpu, whole.s_gpu)
    assert split.s_gpu[5, sg.S_CLOCK] == pytest.approx(0.85)
    assert whole_health.counts()[1] == {} and split_health.counts()[1] == {}


def test_a_duplicate_row_of_a_tick_weighs_nothing_twice():
    """A tick's rows sent again (a source's retry, an overlapping scrape) with other values: each
    mean keeps the tick's first value, taken once: the state is that of the first rows alone."""
    topo = small_topology()
    frames = fed_frames(minutes=5, slow_from=0.0)
    health = PipelineHealth()
    once, twice = sg.StragglerDetector(topo), sg.StragglerDetector(topo, health)
    run(once, frames)
    doubled = []
    for f in frames:
        other = {k: v.copy() for k, v in f.columns.items()}
        other["sm_clock"] *= 0.5
        other["gpu_temp"] += 20.0
        other["util"][:] = 0.1  # a second util of the tick does not make it idle either
        other["throttle_reasons"][:] = facts.THROTTLE_SW_THERMAL
        doubled += [f, Frame("gpu", f.ts, f.slot, other)]
    run(twice, doubled)
    np.testing.assert_array_equal(twice.s_gpu, once.s_gpu)
    assert health.counts()[1] == {}


def test_fields_of_a_tick_before_its_util_are_not_known_busy():
    """The clocks arriving before the tick's util are not known to be busy and not averaged (the
    util that follows makes the tick busy for the fields that come after it only)."""
    topo = small_topology()
    det = sg.StragglerDetector(topo)
    f = fed_frames(minutes=1)[0]
    for part in split_by_field(f, ("sm_clock", "sm_clock_max"), ("util",), ("gpu_temp",)):
        det.update(part)
    assert np.isnan(det.s_gpu[:, sg.S_CLOCK]).all()
    assert (det.s_gpu[:16, sg.S_TEMP] == 60.0).all() and (det.s_gpu[:16, sg.S_N] == 1.0).all()


def test_a_row_stamped_a_day_ahead_of_its_frame_is_refused_and_counted():
    """One poll of GPU 5 stamped a day ahead (its host's clock wrong): refused before it reaches the
    state, and counted. Taken, it set the GPU's last tick a day on: every true row after it was "out
    of order", its means froze, and its real slowdown 5 minutes later went unnamed for good."""
    topo = small_topology()
    clean_health, bad_health = PipelineHealth(), PipelineHealth()
    clean = run(sg.StragglerDetector(topo, clean_health), fed_frames(slow_from=900.0))
    det = sg.StragglerDetector(topo, bad_health)
    bad = run(det, fed_frames(slow_from=900.0, ahead_at=600.0))
    assert {(f.slot, f.field) for f in clean} == {(5, "sm_clock")}
    assert [(f.ts, f.slot, f.score) for f in bad] == [(f.ts, f.slot, f.score) for f in clean]
    assert det.s_gpu[5, sg.S_TS] < 3600.0
    assert bad_health.counts()[1] == {("straggler", "gpu rows stamped too far ahead of their frame"): 1}
    assert clean_health.counts()[1] == {}


def test_rows_within_the_guards_bound_of_their_frame_are_taken():
    """A frame spanning minutes (a bundle's linger, a slow scrape) is not cut: only a row further than
    the input guard's bound (MAX_AHEAD_S) past the frame's median stamp is refused."""
    from foreshock.guard import MAX_AHEAD_S
    topo = small_topology()
    health = PipelineHealth()
    det = sg.StragglerDetector(topo, health)
    f = fed_frames(minutes=1)[0]
    f.ts[5] = MAX_AHEAD_S - 1.0
    det.update(f)
    assert det.s_gpu[5, sg.S_TS] == MAX_AHEAD_S - 1.0 and health.counts()[1] == {}


def layout1(state, width=sg.LAYOUT1_S_SIZE):
    """``state`` as layout 1 wrote it (no ``state_layout``; ``s_gpu`` with ``S_TAKEN`` at
    ``sg.LAYOUT1_S_TAKEN``, the bits of the means whose time is the last tick), cut to its first
    ``width`` columns (a checkpoint saved before the rest existed)."""
    g = state["s_gpu"]
    taken = sum(bit * (g[:, col] == g[:, sg.S_TS]) for bit, col in (
        (sg.T_UTIL, sg.S_UTIL_TS), (sg.T_CLOCK, sg.S_CLOCK_TS), (sg.T_TEMP, sg.S_TEMP_TS),
        (sg.T_POWER, sg.S_POWER_TS), (sg.T_THROTTLE, sg.S_THROTTLE_TS)))
    wide = np.insert(g, sg.LAYOUT1_S_TAKEN, taken, axis=1)
    return {**{k: v for k, v in state.items() if k != "state_layout"}, "s_gpu": wide[:, :width]}


def loaded_from_a_narrower_state(width):
    """A detector fed 10 minutes of a job with a slow GPU, and another loaded from its state with
    ``s_gpu`` cut to its first ``width`` columns of layout 1 (a checkpoint saved before the rest existed)."""
    topo = small_topology()
    frames = fed_frames(minutes=40, slow_from=0.0)
    a = sg.StragglerDetector(topo, refresh_s=120)
    run(a, frames[:60])
    old = layout1(a.state_dict(), width)
    b = sg.StragglerDetector(topo, refresh_s=120)
    b.load_state_dict(old)
    return a, b, frames


def test_a_state_saved_before_the_means_own_times_loads():
    """A checkpoint of eleven columns (no time per busy mean) loads with each mean taken at its last
    busy sample, and finds what the state it came from finds."""
    a, b, frames = loaded_from_a_narrower_state(sg.LAYOUT1_S_TAKEN + 1)
    for col in (sg.S_CLOCK_TS, sg.S_TEMP_TS, sg.S_THROTTLE_TS, sg.S_POWER_TS):
        np.testing.assert_array_equal(b.s_gpu[:, col], a.s_gpu[:, sg.S_BUSY_TS])
    rest = run(a, frames[60:])
    assert rest and run(b, frames[60:]) == rest


def test_a_state_saved_before_util_times_loads():
    """A checkpoint of eight columns (no util time, no per-tick marks) loads and finds what the
    state it came from would have; a repeated row of its last tick adds nothing, as it did then."""
    a, b, frames = loaded_from_a_narrower_state(sg.S_UTIL_TS)
    before = b.s_gpu.copy()
    again = Frame("gpu", frames[59].ts, frames[59].slot, {**frames[59].columns, "gpu_temp": np.full(16, 90.0)})
    b.update(again)
    np.testing.assert_array_equal(b.s_gpu, before)
    rest = run(a, frames[60:])
    assert rest and run(b, frames[60:]) == rest
