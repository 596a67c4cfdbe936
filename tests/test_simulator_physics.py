"""Physics of the simulator against FACTS: steady state, the driver's limiters, PSU brake,
rerouting after a link goes down, counters."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from foreshock import facts
from foreshock.fields import fields_of
from foreshock.recording import Recording
from foreshock.simulator import ClusterSimulator, SimParams, build_topology
from foreshock.simulator.gpu_model import GpuModel
from foreshock.simulator.optics import erfc, q_function
from foreshock.simulator.scenario import scenario_from_dict

EXACT = SimParams(gpu_spread=0.0, leak_spread=0.0, dyn_spread=0.0, missing_prob=0.0)


def run_gpu(model: GpuModel, seconds: float, inlet: float | np.ndarray, activity: float, dt: float = 1.0,
            running: bool = True, brake: bool = False) -> list[tuple[float, int, float, float]]:
    """Step a GpuModel; return (temp_before, reasons, clock, temp_after) of GPU 0 per step."""
    n = model.n
    trace = []
    for k in range(int(seconds / dt)):
        before = float(model.temp[0])
        inl = np.full(n, inlet(k * dt) if callable(inlet) else inlet)
        model.step(dt, inl, np.ones(n), np.full(n, activity), np.zeros(n), np.full(n, running), np.full(n, brake),
                   np.ones(n), np.ones(n))
        trace.append((before, int(model.reasons[0]), float(model.clock[0]), float(model.temp[0])))
    return trace


def test_gpu_burn_steady_state_matches_the_h200_capture() -> None:
    gpu = GpuModel(4, EXACT, np.random.default_rng(0))
    run_gpu(gpu, 600, inlet=24.0, activity=1.0)
    # FACTS: H200 under gpu-burn ~627 W, 52 °C core, 40-41 °C HBM, 1980 MHz, no throttle bits
    assert gpu.power[0] == pytest.approx(627.0, abs=5.0)
    assert gpu.temp[0] == pytest.approx(52.5, abs=1.0)
    assert gpu.hbm_temp[0] == pytest.approx(41.0, abs=1.0)
    assert gpu.clock[0] == facts.SM_CLOCK_MAX_HZ
    assert gpu.reasons[0] == 0
    # steady state is inlet + R·P, with R from FACTS
    assert gpu.temp[0] == pytest.approx(24.0 + 0.046 * gpu.power[0], abs=0.3)


def test_idle_steady_state_matches_the_capture() -> None:
    gpu = GpuModel(2, EXACT, np.random.default_rng(0))
    run_gpu(gpu, 600, inlet=24.0, activity=0.0, running=False)
    assert gpu.power[0] == pytest.approx(78.0, abs=3.0)  # FACTS idle ~78 W, 28 °C, mask 0x1
    assert gpu.temp[0] == pytest.approx(28.0, abs=1.0)
    assert gpu.reasons[0] == facts.THROTTLE_IDLE
    assert gpu.clock[0] < 0.3 * facts.SM_CLOCK_MAX_HZ


def test_steady_state_follows_inlet_plus_r_times_p_with_spread() -> None:
    params = SimParams(missing_prob=0.0)  # default per-GPU spread
    gpu = GpuModel(64, params, np.random.default_rng(3))
    run_gpu(gpu, 600, inlet=30.0, activity=0.8)
    expected = 30.0 + gpu.r_core * gpu.power
    np.testing.assert_allclose(gpu.temp, expected, atol=0.3)
    assert np.ptp(gpu.power) > 5.0  # the spread is visible


def test_leakage_rises_with_temperature() -> None:
    cool = GpuModel(1, EXACT, np.random.default_rng(0))
    hot = GpuModel(1, EXACT, np.random.default_rng(0))
    run_gpu(cool, 400, inlet=20.0, activity=0.7)
    run_gpu(hot, 400, inlet=40.0, activity=0.7)
    assert hot.power[0] > cool.power[0] + 15.0  # same work, same clock, hotter die -> more watts
    assert hot.clock[0] == cool.clock[0] == facts.SM_CLOCK_MAX_HZ


def test_power_cap_sets_bit_0x4_and_holds_the_limit() -> None:
    gpu = GpuModel(1, EXACT, np.random.default_rng(0))
    trace = run_gpu(gpu, 300, inlet=24.0, activity=1.3)
    assert trace[-1][1] & facts.THROTTLE_SW_POWER_CAP
    assert gpu.power[0] <= facts.POWER_LIMIT_W + 1e-6
    assert gpu.power[0] > facts.POWER_LIMIT_W - 10.0
    assert gpu.clock[0] < facts.SM_CLOCK_MAX_HZ
    assert not trace[-1][1] & (facts.THROTTLE_SW_THERMAL | facts.THROTTLE_HW_SLOWDOWN)


def test_sw_thermal_starts_above_max_operating_with_bit_0x20() -> None:
    gpu = GpuModel(1, EXACT, np.random.default_rng(0))
    # inlet ramps slowly from 24 to 70 °C: the die crosses 87 °C under load
    trace = run_gpu(gpu, 1500, inlet=lambda t: min(24.0 + t * 0.04, 70.0), activity=0.9)
    first = next(i for i, s in enumerate(trace) if s[1] & facts.THROTTLE_SW_THERMAL)
    # never before the die went over 87 °C; at once after
    assert all(s[0] <= facts.MAX_OPERATING_TEMP_C for s in trace[:first])
    assert trace[first][0] > facts.MAX_OPERATING_TEMP_C
    assert trace[first][0] < facts.MAX_OPERATING_TEMP_C + 1.0
    # the limiter then holds the die near max operating, below HW slowdown
    temps = [s[3] for s in trace[first + 120:]]
    assert max(temps) < facts.HW_SLOWDOWN_TEMP_C
    assert np.mean(temps) == pytest.approx(facts.MAX_OPERATING_TEMP_C, abs=1.5)
    assert not any(s[1] & facts.THROTTLE_HW_SLOWDOWN for s in trace)


def test_hw_slowdown_at_89_cuts_clock_at_least_2x_with_bits_0x8_0x40() -> None:
    gpu = GpuModel(1, EXACT, np.random.default_rng(0))
    run_gpu(gpu, 300, inlet=24.0, activity=0.9)
    # a sudden inlet jump (cooling lost) outruns the SW limiter
    trace = run_gpu(gpu, 120, inlet=75.0, activity=0.9)
    first = next(i for i, s in enumerate(trace) if s[1] & facts.THROTTLE_HW_SLOWDOWN)
    assert trace[first][0] >= facts.HW_SLOWDOWN_TEMP_C
    assert all(s[0] < facts.HW_SLOWDOWN_TEMP_C for s in trace[:first])
    assert trace[first][1] & facts.THROTTLE_HW_THERMAL
    assert trace[first][2] <= 0.5 * trace[first - 1][2]
    assert not trace[first][1] & facts.THROTTLE_HW_POWER_BRAKE


def test_throttle_time_counters_count_seconds_and_only_grow() -> None:
    gpu = GpuModel(1, EXACT, np.random.default_rng(0))
    run_gpu(gpu, 100, inlet=24.0, activity=1.3)  # capped the whole time after the first step
    assert gpu.power_throttle_time[0] == pytest.approx(100.0, abs=2.0)
    assert gpu.thermal_throttle_time[0] == 0.0


def small_sim(scenario: dict | str | None = None, gpus: int = 32, **kw) -> ClusterSimulator:
    scen = scenario_from_dict(scenario) if isinstance(scenario, dict) else scenario
    params = {"missing_prob": 0.0, "job_churn": False, **kw.pop("params", {})}
    topo = kw.pop("topology", None) or build_topology(gpus, job_nodes=kw.pop("job_nodes", None), idle_fraction=0.0)
    return ClusterSimulator(topo, scenario=scen, seed=kw.pop("seed", 7), params=params, warmup_s=kw.pop("warmup_s", 120), **kw)


def test_psu_failure_sets_power_brake_on_that_node_only() -> None:
    sim = small_sim({"name": "t", "faults": [{"type": "psu_failure", "target": "node1", "onset": 30,
                                               "params": {"brake_s": 60}}]}, duration=120)
    frames = [f for tick in sim.iter_ticks(60) for f in tick if f.kind == "gpu"]
    node_of = sim.topology.gpu_node
    for f in frames:
        bits = f.columns["throttle_reasons"].astype(np.int64)
        braked = (bits & facts.THROTTLE_HW_POWER_BRAKE) != 0
        if f.ts[0] - sim.start_time < 30:
            assert not braked.any()
        elif f.ts[0] - sim.start_time >= 30:
            assert braked[node_of == 1].all()
            assert not braked[node_of != 1].any()
            assert (bits[node_of == 1] & facts.THROTTLE_HW_SLOWDOWN).all()
    clocks = frames[-1].columns["sm_clock"]
    assert clocks[node_of == 1].max() <= 0.5 * clocks[node_of != 1].min()
    starts = [e for e in sim.events if e.type == "power_brake_start"]
    assert sorted(e.entity for e in starts) == sorted(f"node1/gpu{i}" for i in range(8))
    assert {e.fault_id for e in starts} == {"f1"}
    assert all(e.detail["reasons"] & facts.THROTTLE_HW_POWER_BRAKE for e in starts)


def test_link_down_raises_xmit_wait_on_the_links_its_traffic_moves_to() -> None:
    # one 4-node job; a 20 dB loss is a pulled fibre: loss of signal, link down at once
    sim = small_sim({"name": "t", "faults": [{"type": "optic_degradation", "target": "node2/gpu3~su0-leaf3#a",
                                               "onset": 60, "params": {"initial_db": 20.0, "db_per_hour": 0.0}}]},
                    gpus=32, job_nodes=4, duration=200)
    topo = sim.topology
    waits, times = [], []
    first: dict[int, dict[str, np.ndarray]] = {}
    last: dict[int, dict[str, np.ndarray]] = {}
    for tick in sim.iter_ticks(180):
        link = next(f for f in tick if f.kind == "link")
        waits.append(link.columns["xmit_wait"].copy())
        times.append(float(link.ts[0]))
        if len(times) in (5, 55, 125, 175):
            (first if len(times) in (5, 125) else last)[len(times) // 100] = dict(link.columns)
    waits_arr = np.array(waits)
    rate_before = (waits_arr[55] - waits_arr[5]) / 50.0
    rate_after = (waits_arr[175] - waits_arr[125]) / 50.0
    down = topo.slot("link", "node2/gpu3~su0-leaf3")
    # PXN: rail 3's traffic leaves through rail 4's NIC, on node2 and on its ring neighbours 1 and 3
    carriers = [topo.slot("link", f"node{n}/gpu4~su0-leaf4") for n in (1, 2, 3)]
    others = [i for i in range(len(topo.links)) if i not in carriers and i != down]
    tick_rate = facts.LINK_RATE_GPU_BPS / 8 / facts.XMIT_WAIT_TICK_BYTES
    assert (rate_after[carriers] > 0.02 * tick_rate).all()  # waiting a good share of the time
    assert (rate_after[carriers] > 50 * rate_before[carriers]).all()
    assert (rate_after[others] < 3 * rate_before[others] + 1.0).all()
    assert rate_after[down] == 0.0
    # PFC pauses and the ECN -> CNP chain grow on the carriers too, not elsewhere
    for name in ("pfc_pause_duration", "ecn_marked", "cnp_sent", "cnp_handled"):
        before = last[0][name] - first[0][name]
        after = last[1][name] - first[1][name]
        assert (after[carriers] > 10 * before[carriers] + 1e-3).all(), name
        assert (after[others] <= 3 * before[others] + 1e-3).all(), name
    ev = sim.events
    assert any(e.type == "link_down" and e.entity == topo.links[down] and e.fault_id == "f1" for e in ev)
    congested = {e.entity for e in ev if e.type == "congestion_start"}
    assert congested == {topo.links[s] for s in carriers}
    assert all(e.fault_id == "f1" for e in ev if e.type == "congestion_start")
    # a labelled onset shows in the counters at the first sample after it: the label marks a
    # port stalled a measurable share of the time, not a float residue of a communication share
    for e in (e for e in ev if e.type == "congestion_start"):
        k = int(np.searchsorted(times, e.time))
        moved = waits_arr[k, topo.slot("link", e.entity)] - waits_arr[k - 1, topo.slot("link", e.entity)]
        assert moved >= 0.5 * sim.params.congestion_min_stall * tick_rate * sim.interval, (e, moved)
    slow = [e for e in ev if e.type == "job_slowdown_start"]
    assert [e.entity for e in slow] == ["job0"] and slow[0].fault_id == "f1"


@pytest.mark.parametrize("bits", [64, 32])
def test_counters_only_grow_or_wrap_when_configured(bits: int) -> None:
    sim = small_sim(None, gpus=16, params={"counter_bits": bits}, duration=60)
    frames: dict[str, list] = {}
    for tick in sim.iter_ticks(40):
        for f in tick:
            frames.setdefault(f.kind, []).append(f)
    wrapped = 0
    for kind in ("gpu", "link", "optic"):
        for field in fields_of(kind):
            if not field.is_counter:
                continue
            series = np.array([f.columns[field.name] for f in frames[kind]])
            diffs = np.diff(series, axis=0)
            if bits == 64 or kind != "link":
                assert (diffs >= 0).all(), f"{kind}.{field.name} decreased"
            else:
                limit = 2.0 ** 32 * (4 if field.name in ("tx_data", "rx_data") else 1)
                if field.name != "pfc_pause_duration":
                    assert (series < limit).all()
                wrapped += int((diffs < 0).sum())
    if bits == 32:
        assert wrapped > 0  # 400G links wrap a 32-bit word counter within seconds


def test_erfc_matches_the_reference_in_the_far_tail() -> None:
    xs = np.concatenate([np.linspace(-3, 3, 61), np.linspace(3, 8, 51)])
    ref = np.array([math.erfc(x) for x in xs])
    np.testing.assert_allclose(erfc(xs), ref, rtol=1e-5)
    # Q factor 7 ~ 1.3e-12 (a healthy link), 3.49 ~ the FEC limit
    assert q_function(np.array([7.0]))[0] == pytest.approx(1.28e-12, rel=0.01)


def test_fan_failure_slows_the_fans_reading_and_throttles_that_node() -> None:
    sim = small_sim({"name": "t", "faults": [{"type": "fan_failure", "target": "node2", "onset": 60,
                                               "params": {"r_increase": 1.5}}]},
                    gpus=32, params={"job_intensity_range": [1.1, 1.1]}, duration=600, physics_dt=2.0)
    frames = [{f.kind: f for f in tick} for tick in sim.iter_ticks(600)]
    fan = np.array([t["node"].columns["fan_speed"] for t in frames])
    assert fan[30, 2] > 0.3 and fan[-1, 2] == 0.0  # its slowest fan is a dead one
    assert np.all((fan[-1, [0, 1, 3]] > 0.3) & (fan[-1, [0, 1, 3]] < 0.8))
    throttled = {e.entity for e in sim.events if e.type == "thermal_throttle_start"}
    assert throttled and all(name.startswith("node2/") for name in throttled)
    assert {e.fault_id for e in sim.events if e.type == "thermal_throttle_start"} == {"f1"}


def test_hbm_overheat_throttles_then_double_bit_ecc_with_xid_48() -> None:
    sim = small_sim({"name": "t", "faults": [{"type": "hbm_overheat", "target": "node0/gpu5", "onset": 30,
                                               "params": {"r_per_hour": 40.0, "dbe_after_s": 120}}]},
                    gpus=16, params={"job_intensity_range": [1.0, 1.0]}, duration=900)
    last = None
    for tick in sim.iter_ticks(900):
        last = tick[0]
    g = sim.topology.slot("gpu", "node0/gpu5")
    ev = sim.events
    hot = [e for e in ev if e.type == "hbm_overheat_start"]
    assert [e.entity for e in hot] == ["node0/gpu5"] and hot[0].fault_id == "f1"
    # the driver holds HBM at its max operating temperature with SW thermal slowdown (0x20)
    assert last.columns["hbm_temp"][g] == pytest.approx(facts.HBM_MAX_OPERATING_TEMP_C, abs=1.5)
    assert int(last.columns["throttle_reasons"][g]) & facts.THROTTLE_SW_THERMAL
    assert last.columns["gpu_temp"][g] < facts.MAX_OPERATING_TEMP_C  # the die itself is fine
    xids = [e for e in ev if e.type == "xid"]
    assert xids and xids[0].detail["code"] == 48 and xids[0].time - hot[0].time >= 120
    assert last.columns["xid_last"][g] == 48 and last.columns["ecc_dbe"][g] >= 1
    others = np.delete(last.columns["ecc_dbe"], g)
    assert (others == 0).all()


def test_diurnal_swing_warms_the_inlets_in_the_afternoon() -> None:
    topo = build_topology(16, idle_fraction=0.0)
    night = ClusterSimulator(topo, seed=1, start_time=1_700_006_400.0 + 3 * 3600, params={"missing_prob": 0.0})
    day = ClusterSimulator(topo, seed=1, start_time=1_700_006_400.0 + 15 * 3600, params={"missing_prob": 0.0})
    inlet_night = night.step()[4].columns["inlet_temp"]
    inlet_day = day.step()[4].columns["inlet_temp"]
    # facility water swings +-1.5 °C, peaking at 15:00 UTC
    assert np.mean(inlet_day - inlet_night) == pytest.approx(3.0, abs=0.5)


def test_a_run_given_its_start_hour_is_the_same_whatever_its_timestamps(tmp_path: Path) -> None:
    # a live run stamps frames with the wall clock; its day starts at start_hour instead
    topo = build_topology(16, idle_fraction=0.0)
    midnight = 1_700_006_400.0

    def run(start_time: float, start_hour: float | None) -> list:
        sim = ClusterSimulator(topo, seed=1, start_time=start_time, start_hour=start_hour, duration=60.0, interval=10.0)
        return [sim.step() for _ in range(6)]

    base = run(midnight + 3 * 3600, None)
    shifted = run(midnight + 15 * 3600 + 1234.5, 3.0)  # stamped at 15:20, its day at 03:00
    for a, b in zip(base, shifted):
        for fa, fb in zip(a, b):
            assert np.array_equal(fb.ts - fa.ts, np.full(len(fa), 12 * 3600 + 1234.5))
            for name, col in fa.columns.items():
                assert np.array_equal(col, fb.columns[name], equal_nan=True), (fa.kind, name)
    afternoon = run(midnight + 3 * 3600, 15.0)  # the same stamps, its day at 15:00: warmer water
    assert np.mean(afternoon[0][4].columns["inlet_temp"] - base[0][4].columns["inlet_temp"]) == pytest.approx(3.0, abs=0.5)
    ClusterSimulator(topo, seed=1, start_hour=3.0).record(tmp_path, 10.0)
    assert Recording.open(tmp_path).meta["start_hour"] == 3.0  # a recording says where its day began


def test_a_runaway_die_shuts_down_at_92_and_stops_its_job() -> None:
    # a thermal interface gone completely: even clocks cut by HW slowdown cannot hold it. (It goes
    # over a minute: at 3600/h the die ran away within a 1-s step, and only the limiter bits left
    # at the shutdown step, a 1-s episode of a GPU already dark, showed a throttle at all.)
    sim = small_sim({"name": "t", "faults": [{"type": "tim_degradation", "target": "node1/gpu1", "onset": 20,
                                               "params": {"r_per_hour": 300.0, "max_factor": 8.0}}]},
                    gpus=16, job_nodes=2, duration=300)
    temps = []
    for tick in sim.iter_ticks(200):
        temps.append(tick[0].columns["gpu_temp"][9])
    topo = sim.topology
    xids = [e for e in sim.events if e.type == "xid"]
    assert [(e.entity, e.detail["code"], e.fault_id) for e in xids] == [("node1/gpu1", 79, "f1")]
    assert xids[0].detail["reason"] == "thermal shutdown"
    seen = [t for t in temps if t == t]
    assert max(seen) >= facts.HW_SLOWDOWN_TEMP_C and max(seen) <= facts.SHUTDOWN_TEMP_C + 3
    assert np.isnan(temps[-1])  # it reports nothing any more
    bits = [e.detail["reasons"] for e in sim.events if e.type == "thermal_throttle_start" and e.entity == "node1/gpu1"]
    assert bits and bits[0] & facts.THROTTLE_SW_THERMAL
    ends = [e for e in sim.events if e.type == "thermal_throttle_end" and e.entity == "node1/gpu1"]
    assert [e.time for e in ends] == [xids[0].time] and ends[0].detail["reasons"] & facts.THROTTLE_HW_SLOWDOWN
    assert any(e.type == "job_slowdown_start" and e.entity == topo.jobs[0] and e.detail.get("reason") == "interrupted"
               and e.fault_id == "f1" for e in sim.events)


def test_a_replaced_optic_brings_its_link_back() -> None:
    sim = small_sim({"name": "t", "faults": [{"type": "optic_degradation", "target": "node0/gpu0~su0-leaf0#b",
                                               "onset": 10, "duration": 60, "params": {"initial_db": 20.0}}]},
                    gpus=16, duration=200)
    states = [next(f for f in tick if f.kind == "link").columns["link_state"][0] for tick in sim.iter_ticks(120)]
    assert states[5] == facts.IB_PORT_STATE_ACTIVE
    assert states[30] == facts.IB_PORT_STATE_DOWN
    assert states[-1] == facts.IB_PORT_STATE_ACTIVE
    kinds = [e.type for e in sim.events if e.entity == sim.topology.links[0]]
    assert kinds == ["link_down", "link_up"]


def test_an_oversubscribed_link_that_barely_communicates_is_not_labelled_congested() -> None:
    """Ground truth marks a port congested only when it stalls a measurable share of the time:
    a communication share that is a float residue (1e-12) of an over-subscribed link is not."""
    fabric = small_sim(gpus=16, duration=10).fabric
    n = len(fabric.rho)
    fabric.rho[:] = 0.5
    fabric.rho[:3] = 1.5  # over-subscribed: stalled 1/3 of its communication time
    comm = np.zeros(n)
    comm[:3] = (0.5, 1e-12, 1e-3)  # stalled 17 %, 3e-13 and 0.03 % of the time
    fabric._count(1.0, np.ones(n, dtype=bool), comm)
    assert fabric.congested[0] and not fabric.congested[1:].any()


# ---- audit additions (issue 3): thresholds, counters, time constants, spread -------------------
def test_power_cap_bit_is_set_exactly_when_the_gpu_is_held_at_its_enforced_limit() -> None:
    # a sweep of work intensities straddling the 700 W limit (gpu-burn = 1.0 draws ~627 W)
    activity = np.linspace(0.9, 1.4, 26)
    gpu = GpuModel(len(activity), EXACT, np.random.default_rng(0))
    n = gpu.n
    for _ in range(300):
        gpu.step(1.0, np.full(n, 24.0), np.ones(n), activity, np.zeros(n), np.ones(n, bool), np.zeros(n, bool),
                 np.ones(n), np.ones(n))
    capped = (gpu.reasons & facts.THROTTLE_SW_POWER_CAP) != 0
    assert capped.any() and (~capped).any()
    # held at the limit, within one 15 MHz clock bin under it: the limiter takes the highest bin
    # under the limit (2.5 · ~550 W of dynamic power · 15/1980 ≈ 11 W; to the nearest bin, as until
    # 2026-12-05, it was half a bin, and a clock within half a bin of the max read max with 0x4 set)
    assert ((gpu.power[capped] <= facts.POWER_LIMIT_W) & (gpu.power[capped] > facts.POWER_LIMIT_W - 14.0)).all()
    assert (gpu.power[~capped] < facts.POWER_LIMIT_W).all()
    assert (gpu.clock[~capped] == facts.SM_CLOCK_MAX_HZ).all()
    assert (gpu.clock[capped] < facts.SM_CLOCK_MAX_HZ).all()
    assert np.array_equal(capped, activity > activity[np.argmax(capped)] - 1e-9)  # one threshold
    # the cap follows the *enforced* limit: derated to 500 W, gpu-burn itself is capped there
    gpu.power_limit[:] = 500.0
    for _ in range(60):
        gpu.step(1.0, np.full(n, 24.0), np.ones(n), activity, np.zeros(n), np.ones(n, bool), np.zeros(n, bool),
                 np.ones(n), np.ones(n))
    assert ((gpu.reasons & facts.THROTTLE_SW_POWER_CAP) != 0).all()
    assert ((gpu.power <= 500.0) & (gpu.power > 490.0)).all()  # a bin under it: ~9 W at that clock


def test_the_hidden_power_cap_margin_is_negative_exactly_where_the_cap_binds() -> None:
    # intensities straddling the limit, and a die warming with the inlet so that leakage moves
    # GPUs across it: the margin taken before each step says which of them the step caps
    activity = np.linspace(1.05, 1.25, 41)
    gpu = GpuModel(len(activity), EXACT, np.random.default_rng(0))
    n = gpu.n
    seen_both = 0
    for k in range(240):
        margin = gpu.power_cap_margin(activity)
        inlet = np.full(n, 20.0 + k * 0.05)
        gpu.step(1.0, inlet, np.ones(n), activity, np.zeros(n), np.ones(n, bool), np.zeros(n, bool),
                 np.ones(n), np.ones(n))
        capped = (gpu.reasons & facts.THROTTLE_SW_POWER_CAP) != 0
        assert np.array_equal(capped, margin < 0), k
        seen_both += bool(capped.any() and (~capped).any())
        # uncapped, the phase draws the limit minus its margin
        assert np.allclose(gpu.power[~capped], (gpu.power_limit - margin)[~capped])
    assert seen_both > 200


def test_hbm_sw_thermal_slowdown_starts_above_95_with_a_cool_die() -> None:
    gpu = GpuModel(1, EXACT, np.random.default_rng(0))
    one = np.ones(1)
    trace = []
    for k in range(3000):
        hbm_factor = np.full(1, min(1.0 + k / 600.0, 6.0))  # the HBM cooling path degrades
        before_core, before_hbm = float(gpu.temp[0]), float(gpu.hbm_temp[0])
        gpu.step(1.0, np.full(1, 24.0), one, np.full(1, 0.9), np.zeros(1), np.ones(1, bool), np.zeros(1, bool),
                 one, hbm_factor)
        trace.append((before_core, before_hbm, int(gpu.reasons[0])))
    first = next(i for i, s in enumerate(trace) if s[2] & facts.THROTTLE_SW_THERMAL)
    assert all(s[1] <= facts.HBM_MAX_OPERATING_TEMP_C for s in trace[:first])
    assert facts.HBM_MAX_OPERATING_TEMP_C < trace[first][1] < facts.HBM_MAX_OPERATING_TEMP_C + 1.0
    assert trace[first][0] < facts.MAX_OPERATING_TEMP_C - 20  # the die is far from its own limit
    assert not any(s[2] & facts.THROTTLE_HW_SLOWDOWN for s in trace)
    assert max(s[1] for s in trace[first + 300:]) < facts.HBM_MAX_OPERATING_TEMP_C + 1.5  # held there


def test_throttle_time_counters_grow_by_the_time_their_bits_are_set() -> None:
    """NVML's violation counters: each grows by exactly the time its limiter held the clock."""
    gpu = GpuModel(1, EXACT, np.random.default_rng(0))
    run_gpu(gpu, 300, inlet=24.0, activity=0.9)
    power0, thermal0 = float(gpu.power_throttle_time[0]), float(gpu.thermal_throttle_time[0])
    power_t, thermal_t, thermal_steps = [power0], [thermal0], 0
    # hot inlet: SW thermal, then HW slowdown, then back to normal cooling
    for inlet, seconds in ((60.0, 400), (80.0, 60), (24.0, 300)):
        for _ in range(seconds):
            ((_, bits, _, _),) = run_gpu(gpu, 1, inlet=inlet, activity=1.25)
            thermal_steps += bool(bits & (facts.THROTTLE_SW_THERMAL | facts.THROTTLE_HW_THERMAL))
            power_t.append(float(gpu.power_throttle_time[0]))
            thermal_t.append(float(gpu.thermal_throttle_time[0]))
    assert thermal_steps > 100
    assert thermal_t[-1] - thermal0 == pytest.approx(thermal_steps, abs=1e-6)
    assert (np.diff(thermal_t) >= 0).all() and (np.diff(power_t) >= 0).all()
    assert (np.diff(power_t) <= 1.0 + 1e-9).all()  # never more than the elapsed time
    assert power_t[-1] - power0 > 200  # capped while cool enough to draw 700 W


def test_core_and_hbm_follow_their_own_time_constants() -> None:
    gpu = GpuModel(1, EXACT, np.random.default_rng(0))
    run_gpu(gpu, 600, inlet=24.0, activity=0.0, running=False)
    core0, hbm0 = float(gpu.temp[0]), float(gpu.hbm_temp[0])
    trace = run_gpu(gpu, 400, inlet=24.0, activity=1.0, dt=0.5)
    core_final, hbm_final = float(gpu.temp[0]), float(gpu.hbm_temp[0])
    # time to 63 % of the rise ~ the time constant (10 s core, 40 s HBM; leakage adds a little)
    core = np.array([s[3] for s in trace])
    t63_core = 0.5 * (1 + np.argmax(core >= core0 + 0.632 * (core_final - core0)))
    gpu2 = GpuModel(1, EXACT, np.random.default_rng(0))
    run_gpu(gpu2, 600, inlet=24.0, activity=0.0, running=False)
    hbm = []
    for _ in range(800):
        run_gpu(gpu2, 0.5, inlet=24.0, activity=1.0, dt=0.5)
        hbm.append(float(gpu2.hbm_temp[0]))
    t63_hbm = 0.5 * (1 + np.argmax(np.array(hbm) >= hbm0 + 0.632 * (hbm_final - hbm0)))
    assert t63_core == pytest.approx(EXACT.tau_core_s, rel=0.3)
    assert t63_hbm == pytest.approx(EXACT.tau_hbm_s, rel=0.3)


def test_dynamic_power_falls_steeply_with_the_clock() -> None:
    """Same die temperature (frozen: huge time constants), same work: the 0.3x clock of the
    power brake keeps far less than 0.3^2 of the dynamic power (voltage falls with clock)."""
    frozen = replace(EXACT, tau_core_s=1e12, tau_hbm_s=1e12)
    watts = {}
    for key, activity, brake in (("full", 1.0, False), ("braked", 1.0, True), ("none", 0.0, False)):
        gpu = GpuModel(1, frozen, np.random.default_rng(0))
        trace = run_gpu(gpu, 5, inlet=24.0, activity=activity, brake=brake)
        watts[key] = (float(gpu.power[0]), trace[-1][2])
    dyn_full = watts["full"][0] - watts["none"][0]
    dyn_braked = watts["braked"][0] - watts["none"][0]
    ratio = watts["braked"][1] / watts["full"][1]
    assert 0.25 < ratio <= 0.5  # the brake cuts clocks >= 2x
    assert dyn_full > 400.0
    assert ratio ** 3 < dyn_braked / dyn_full < ratio ** 2


def test_per_gpu_manufacturing_spread_of_several_percent() -> None:
    gpu = GpuModel(4096, SimParams(), np.random.default_rng(5))
    run_gpu(gpu, 600, inlet=24.0, activity=1.0)
    rise = gpu.temp - 24.0
    # identical GPUs, identical work and inlet: temperature rise and power differ by a few percent
    assert 0.02 < np.std(rise) / np.mean(rise) < 0.10
    assert 0.01 < np.std(gpu.power) / np.mean(gpu.power) < 0.06
    assert 0.02 < np.std(gpu.r_core) / np.mean(gpu.r_core) < 0.06
    assert 0.04 < np.std(gpu.leak_scale) / np.mean(gpu.leak_scale) < 0.12


@pytest.mark.parametrize("dt", [2.0, 5.0, 10.0])
def test_the_thermal_limiter_holds_the_die_whatever_the_physics_step(dt: float) -> None:
    """A 2.45x thermal interface at full load: the SW limiter holds the die just under 87 °C.
    A coarse physics step (``--physics-dt``) must not change that: stepped at 5 s with a 10 s
    time constant, the die used to swing 75-91 °C (63-94 °C in a job) and trip the 92 °C
    shutdown (XID 79) in the tim-degradation scenario, which the real driver (and the 1 s step)
    prevents."""
    def run(step: float) -> np.ndarray:
        gpu = GpuModel(1, EXACT, np.random.default_rng(0))
        one, temps = np.ones(1), []
        for i in range(int(1200 / step)):
            r = np.full(1, 2.45 if i * step >= 300 else 1.0)
            gpu.step(step, np.full(1, 24.0), np.full(1, 0.8), np.full(1, 1.1), np.full(1, 0.3),
                     np.ones(1, bool), np.zeros(1, bool), r, one)
            temps.append(float(gpu.temp[0]))
        return np.array(temps)

    fine, coarse = run(1.0), run(dt)
    settled = coarse[int(700 / dt):]
    assert fine[700:].max() < facts.MAX_OPERATING_TEMP_C + 1.0
    assert settled.max() < facts.MAX_OPERATING_TEMP_C + 1.0
    assert settled.min() > facts.MAX_OPERATING_TEMP_C - 2.0
    assert settled.max() < facts.HW_SLOWDOWN_TEMP_C


def test_a_synchronous_step_waits_for_the_slowest_gpu_and_the_slowest_link() -> None:
    from foreshock.simulator.workload import Workload

    topo = build_topology(32, job_nodes=2, idle_fraction=0.0)  # two jobs of 16 GPUs
    wl = Workload(topo, SimParams(step_jitter=0.0, job_churn=False), np.random.default_rng(1))
    speed = np.ones(len(topo.gpus))
    slow_gpu = int(topo.gpus_of_job(0)[5])
    speed[slow_gpu] = 0.5  # one GPU of job0 computes at half clock
    comm = np.array([1.0, 1.8])  # job1's path is over-subscribed 1.8x
    wl.step(1.0, speed, comm)
    # step = compute / slowest member's clock + communication x congestion
    assert wl.step_time[0] == pytest.approx(wl.compute_s[0] / 0.5 + wl.comm_s[0])
    assert wl.step_time[1] == pytest.approx(wl.compute_s[1] + 1.8 * wl.comm_s[1])
    assert wl.comm_slowdown.tolist() == [1.0, 1.8]
    # the fast members of job0 wait for the slow one: less time computing, less power
    peers = topo.gpus_of_job(0)[topo.gpus_of_job(0) != slow_gpu]
    assert (wl.gpu_compute_frac[peers] < wl.gpu_compute_frac[slow_gpu]).all()
    # ... and the engine records each job's step time as job telemetry
    sim = small_sim(None, gpus=32, job_nodes=2, params={"step_jitter": 0.0}, duration=30)
    job = sim.step()[-1]
    assert job.kind == "job"
    np.testing.assert_allclose(job.columns["step_time"], sim.workload.step_time, rtol=1e-3)
    np.testing.assert_allclose(job.columns["step_time"], sim.workload.nominal_step, rtol=0.02)


def test_idle_gpus_between_jobs_report_idle_and_no_step() -> None:
    topo = build_topology(64, job_nodes=2, idle_fraction=0.0)
    sim = ClusterSimulator(topo, seed=3, params={"missing_prob": 0.0, "job_run_mean_s": 120.0, "job_gap_mean_s": 120.0},
                           warmup_s=0)
    gaps = busy = 0
    for _ in range(300):
        frames = {f.kind: f for f in sim.step()}
        gpu, job = frames["gpu"], frames["job"]
        bits = gpu.columns["throttle_reasons"].astype(np.int64)
        for j in range(len(topo.jobs)):
            members = topo.gpus_of_job(j)
            if np.isnan(job.columns["step_time"][j]):  # between runs of this job
                gaps += 1
                assert (bits[members] & facts.THROTTLE_IDLE).all()
                assert (gpu.columns["util"][members] == 0).all()
                assert (gpu.columns["power"][members] < 150).all()
            else:
                busy += 1
                assert not (bits[members] & facts.THROTTLE_IDLE).any()
    assert gaps > 100 and busy > 100


def test_healthy_optics_drift_slowly_and_stay_up() -> None:
    from foreshock.simulator.optics import OpticsModel

    topo = build_topology(64, idle_fraction=0.0)
    params = SimParams(rx_noise_db=0.0)
    optics = OpticsModel(topo, params, np.random.default_rng(2))
    start = optics.tx_power[optics.partner] - optics.loss
    for k in range(24 * 60):  # a day in 1-minute steps
        optics.step(60.0, 60.0 * k)
    wander = optics.rx_power - start
    # a random walk of 0.03 dB per sqrt(hour): ~0.15 dB after a day, far from the ~6 dB margin
    assert np.std(wander) == pytest.approx(params.rx_drift_db_per_sqrt_h * math.sqrt(24), rel=0.3)
    assert optics.link_up.all() and optics.flaps.sum() == 0
    assert (optics.ber < facts.PREFEC_BER_UNCLEAN).all()
