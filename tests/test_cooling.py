"""Cooling degradation: resistance drift per GPU vs own history and rack peers, nodes, racks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.cooling import CoolingDetector, group_median, median_of_others
from foreshock.findings import Anomaly
from foreshock.frames import Frame
from foreshock.topology import Topology

from thermal_synth import run, small_topology


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 4), st.one_of(st.floats(-1e3, 1e3), st.just(float("nan")))),
                max_size=60))
def test_group_median_matches_numpy(pairs):
    groups = np.array([g for g, _ in pairs], dtype=np.int64)
    values = np.array([v for _, v in pairs], dtype=float)
    got = group_median(values, groups, 5)
    for g in range(5):
        sel = values[(groups == g) & np.isfinite(values)]
        if len(sel):
            assert got[g] == pytest.approx(float(np.median(sel)))
        else:
            assert np.isnan(got[g])


@settings(deadline=None)
@given(st.lists(st.one_of(st.floats(-50, 50), st.just(float("nan")), st.just(float("inf"))), max_size=12)
       | st.lists(st.sampled_from([0.5, 1.0, 2.0]), max_size=9))  # (many repeats)
def test_median_of_others_is_numpy_median_with_each_element_deleted(values):
    """The facility-water reference per cooling loop: equal to what the loop over the loops gave,
    ``np.median`` of the finite values of ``np.delete(values, k)``."""
    values = np.array(values, dtype=float)
    others, every = median_of_others(values)
    finite = values[np.isfinite(values)]
    assert np.array_equal([every], [np.median(finite) if len(finite) else np.nan], equal_nan=True)
    for k in range(len(values)):
        rest = np.delete(values, k)
        rest = rest[np.isfinite(rest)]
        want = float(np.median(rest)) if len(rest) else np.nan
        assert np.array_equal([others[k]], [want], equal_nan=True), (k, others[k], want)


def cluster(r_of, inlet_of, hours=4.0, dt=30.0, n_nodes=4, power=650.0):
    """Frames of a 4-node, 2-rack cluster at steady power; R and inlet are functions of time."""
    topo = small_topology(nodes=n_nodes, gpus=8, racks=2)
    n = topo.size("gpu")
    frames = []
    for t in np.arange(0.0, hours * 3600, dt):
        inlet = inlet_of(t)
        r = r_of(t, n)
        frames.append(Frame("rack", np.full(2, t), np.arange(2), {"inlet_temp": inlet}))
        frames.append(Frame("gpu", np.full(n, t), np.arange(n), {
            "gpu_temp": np.round(inlet[topo.gpu_rack] + r * power), "power": np.full(n, power)}))
    return topo, frames


SPREAD = 0.046 * (1 + 0.03 * np.random.default_rng(0).standard_normal(32))


def test_failing_thermal_interface_flagged_early_peers_not():
    def r_of(t, n):
        r = SPREAD[:n].copy()
        r[13] *= 1 + 0.3 * max(0.0, t - 7200) / 3600  # +30 % per hour from t = 2 h
        return r
    topo, frames = cluster(r_of, lambda t: np.array([24.0, 24.5]))
    found = run(CoolingDetector(topo), frames)
    gpus = [f for f in found if f.entity_kind == "gpu"]
    assert {f.slot for f in gpus} == {13}
    first = gpus[0]
    # flagged while R is up ~25 %: hours before a throttle (which needs R roughly doubled)
    assert 7200 < first.ts < 7200 + 3600
    assert "own baseline" in first.reason and "rack" in first.reason
    assert not [f for f in found if f.entity_kind in ("node", "rack")]


def test_node_fans_flag_the_node_and_inlet_rise_flags_the_racks():
    def r_of(t, n):
        r = SPREAD[:n].copy()
        if t >= 5400:
            r[8:16] *= 1.3  # node1's fans fail: all its GPUs run hotter per watt
        return r

    def inlet_of(t):
        rise = 8.0 if t >= 9000 else 0.0  # the loop loses flow: both racks warm
        return np.array([24.0 + rise, 24.5 + rise])
    topo, frames = cluster(r_of, inlet_of)
    found = run(CoolingDetector(topo), frames)
    nodes = [f for f in found if f.entity_kind == "node"]
    racks = [f for f in found if f.entity_kind == "rack"]
    assert {f.slot for f in nodes} == {1} and nodes[0].field == "fan_speed"
    assert "other nodes of loop cdu0" in nodes[0].reason  # two nodes a rack: the loop is the reference
    assert {f.slot for f in racks} == {0, 1}
    assert all(f.ts >= 9000 for f in racks) and "loop" in racks[0].reason
    assert all(isinstance(f, Anomaly) and f.score > 0 for f in found)


def two_loops() -> Topology:
    """Two cooling loops (cdu0 feeds rack0-1, cdu1 rack2-3), a node of 8 GPUs a rack."""
    return Topology.from_dict({
        "cluster": "synth",
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}, {"name": "row1", "cooling_loop": "cdu1"}],
        "racks": [{"name": f"rack{k}", "row": f"row{k // 2}"} for k in range(4)],
        "nodes": [{"name": f"node{k}", "rack": f"rack{k}", "gpus": 8} for k in range(4)]})


@pytest.mark.parametrize("swing", [4.0, 5.0])
def test_the_facility_waters_daily_swing_is_not_a_loop_losing_capacity(swing):
    """A 48-hour simulation with the facility water swinging ±3-4 °C over the day (dry coolers
    following the weather) had every rack of both loops flagged each afternoon, "the cooling loop
    (CDU) is losing capacity", and incidents opened for both loops. The loops share the facility
    water: a rise they share is not one loop's. A loop that does lose capacity meanwhile is still
    flagged, against the other loop's rise."""
    topo = two_loops()
    n = topo.size("gpu")
    r = SPREAD[:n]

    def frames(loss_at: float | None):
        out = []
        for t in np.arange(0.0, 40 * 3600, 60.0):
            inlet = 24.0 + swing * np.sin(2 * np.pi * (t / 3600 - 9.0) / 24) + np.array([0.0, 0.3, 0.1, 0.4])
            if loss_at is not None and t >= loss_at:
                inlet[2:] += min((t - loss_at) / 1800, 1.0) * 8.0  # cdu1 loses flow
            out.append(Frame("rack", np.full(4, t), np.arange(4), {"inlet_temp": inlet}))
            out.append(Frame("gpu", np.full(n, t), np.arange(n), {
                "gpu_temp": np.round(inlet[topo.gpu_rack] + r * 650.0), "power": np.full(n, 650.0)}))
        return out

    assert [f for f in run(CoolingDetector(topo), frames(None)) if f.entity_kind == "rack"] == []
    racks = [f for f in run(CoolingDetector(topo), frames(33 * 3600.0)) if f.entity_kind == "rack"]
    assert {f.slot for f in racks} == {2, 3} and racks[0].ts >= 33 * 3600
    assert "2 of 2 racks on loop cdu1" in racks[0].reason


def test_a_node_is_not_told_hot_against_one_other_node():
    """One rack of four nodes, two of them idle (not compared). Of the two loaded, node1's R
    reads 20 % low (still settling, say): against the mean of the two, node0 would read +11 %
    hot — but which of two nodes is off cannot be told, so neither is flagged. With the idle
    nodes loaded as well, node0 is no outlier either; node1's low R flags nothing."""
    topo = small_topology(nodes=4, gpus=8, racks=1)
    n = topo.size("gpu")
    for idle in (True, False):
        power = np.where((topo.gpu_node >= 2) & idle, 60.0, 650.0)
        frames = []
        for t in np.arange(0.0, 3 * 3600, 30.0):
            r = SPREAD[:n].copy()
            r[8:16] *= 0.8
            frames.append(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
            frames.append(Frame("gpu", np.full(n, t), np.arange(n), {"gpu_temp": np.round(24.0 + r * power),
                                                                    "power": power}))
        assert [f for f in run(CoolingDetector(topo), frames) if f.entity_kind == "node"] == [], idle


def test_a_stopped_fan_flags_its_node_at_once_loaded_or_idle():
    """node2's slowest fan reads 0 from t = 1000 s to 4000 s while its GPUs idle (the resistance
    comparison cannot see it there): flagged at the first reading, refreshed every refresh_s,
    kept through readings that are missing, cleared by the first reading back at speed."""
    topo = small_topology(nodes=4, gpus=8, racks=2)
    det, found = CoolingDetector(topo), []
    for t in np.arange(0.0, 6000.0, 10.0):
        speed = np.full(4, 0.35)
        if 1000 <= t < 4000:
            speed[2] = np.nan if 2000 <= t < 2100 else 0.0  # a scrape or two lost meanwhile
        found += det.update(Frame("node", np.full(4, t), np.arange(4), {"fan_speed": speed}))
        found += det.update(Frame("gpu", np.full(32, t), np.arange(32), {"gpu_temp": np.full(32, 30.0),
                                                                        "power": np.full(32, 60.0)}))
    assert [(f.entity_kind, f.slot, f.ts) for f in found] == [("node", 2, t) for t in (1000.0, 1600.0, 2200.0, 2800.0,
                                                                                       3400.0)]
    assert "node2 reads 0% of full speed" in found[0].reason and found[0].field == "fan_speed"
    assert np.isnan(det.s_fan_flag[2])


def test_fan_readings_that_are_not_a_share_of_full_speed_are_counted_and_ignored():
    """A source that sends raw RPM (9000) or a sentinel (-1) must neither flag a node as stopped
    nor clear a stopped one; each such reading is counted as an input problem."""
    from foreshock.health import PipelineHealth
    topo = small_topology(nodes=4, gpus=8, racks=2)
    health = PipelineHealth()
    det, found = CoolingDetector(topo, health=health), []
    for t, speeds in ((0.0, [0.35, -1.0, 0.35, 0.0]), (10.0, [9000.0, 0.35, -1.0, 9000.0])):
        found += det.update(Frame("node", np.full(4, t), np.arange(4), {"fan_speed": np.array(speeds)}))
    assert [(f.slot, f.ts) for f in found] == [(3, 0.0)]  # node3 stopped, and a raw RPM did not clear it
    assert np.isfinite(det.s_fan_flag[3]) and np.isnan(det.s_fan_flag[1])
    assert health.problems[("cooling", "fan_speed outside 0..1.2 of full speed: ignored")] == 4


def test_a_node_that_always_runs_hotter_than_its_rack_is_not_flagged_for_good():
    """node1 (another chassis make, say) runs +15 % per watt over its rack from the first hour on:
    it was flagged "node fans or airflow" and refreshed every refresh_s, never cleared. A node is
    judged against how hot it usually runs (without a history yet, only +30 % flags it): node1 is
    not flagged, and when its fans do fail (and node5's) at 4 h, both are flagged and held."""
    topo = small_topology(nodes=8, gpus=8, racks=2)  # four nodes a rack
    n = topo.size("gpu")
    r0 = 0.046 * (1 + 0.03 * np.random.default_rng(0).standard_normal(n))
    r0[8:16] *= 1.15
    det, found = CoolingDetector(topo), []
    for t in np.arange(0.0, 5.5 * 3600, 30.0):
        r = r0.copy()
        if t >= 4 * 3600:
            r[8:16] *= 1.2
            r[40:48] *= 1.2
        found += det.update(Frame("rack", np.full(2, t), np.arange(2), {"inlet_temp": np.array([24.0, 24.0])}))
        found += det.update(Frame("gpu", np.full(n, t), np.arange(n), {"gpu_temp": np.round(24 + r * 650),
                                                                      "power": np.full(n, 650.0)}))
    nodes = [(f.slot, f.ts) for f in found if f.entity_kind == "node"]
    assert all(ts >= 4 * 3600 for _, ts in nodes)
    late = nodes
    assert {nd for nd, _ in late} == {1, 5} and min(ts for _, ts in late) <= 4 * 3600 + 600
    assert max(ts for nd, ts in late if nd == 1) >= 5.5 * 3600 - 600  # held while the fans are out
    assert "it usually runs +1" in next(f.reason for f in found if f.slot == 1 and f.ts >= 4 * 3600)
    assert not [f for f in found if f.entity_kind == "gpu" and f.ts < 4 * 3600]


def test_a_state_saved_before_node_baselines_loads():
    topo = small_topology(nodes=4, gpus=8, racks=2)
    old = CoolingDetector(topo).state_dict()
    del old["s_node_base"], old["s_idle_node_base"]
    det = CoolingDetector(topo)
    det.load_state_dict(old)
    assert det.s_node_base.shape == det.s_idle_node_base.shape == (4, 2)
    assert np.isnan(det.s_node_base).all() and np.isnan(det.s_idle_node_base).all()


def idle_cluster(r_of, hours=4.0, racks=2):
    """Frames of a 4-node cluster idling at ~78 W (no job): R as a function of time, whole °C."""
    topo = small_topology(nodes=4, gpus=8, racks=racks)
    n = topo.size("gpu")
    rng = np.random.default_rng(4)
    power = 78.0 + rng.uniform(-4, 4, n)
    frames = []
    for t in np.arange(0.0, hours * 3600, 30.0):
        inlet = np.full(racks, 24.2) + 0.3 * np.sin(t / 2000.0)  # the facility water wanders a little
        frames.append(Frame("rack", np.full(racks, t), np.arange(racks), {"inlet_temp": inlet}))
        frames.append(Frame("gpu", np.full(n, t), np.arange(n), {
            "gpu_temp": np.round(inlet[topo.gpu_rack] + r_of(t, n) * power), "power": power + rng.normal(0, 2, n)}))
    return topo, frames


def test_an_idle_gpus_failing_interface_is_flagged_from_its_temperature_over_the_inlet():
    """The fit reads R only under load. An idle GPU whose interface fails (R doubling in an hour,
    as seeds 783 and 792 had) shows only as its idle temperature over the inlet rising, 3.6 °C
    to 7 °C at ~78 W: flagged against its own idle history and its idle node-mates, not its
    node-mates, not the node."""
    def r_of(t, n):
        r = SPREAD[:n].copy()
        r[13] *= 1 + 1.0 * max(0.0, t - 7200) / 3600
        return r
    topo, frames = idle_cluster(r_of)
    found = run(CoolingDetector(topo), frames)
    assert {(f.entity_kind, f.slot) for f in found} == {("gpu", 13)}
    assert 7200 < found[0].ts < 7200 + 3600 and found[0].reason.startswith("idle,")
    assert "vs its own idle history" in found[0].reason


def test_an_idle_nodes_failed_fans_flag_the_node_without_fan_telemetry():
    """One rack of four idle nodes and no node frames (a GPU exporter alone): node2's fans fail,
    all its GPUs' R x2.2 — the node is flagged from their temperature over the inlet, and no GPU
    is (each runs as warm as its node-mates)."""
    def r_of(t, n):
        r = SPREAD[:n].copy()
        if t >= 5400:
            r[16:24] *= 2.2
        return r
    topo, frames = idle_cluster(r_of, racks=1)
    found = run(CoolingDetector(topo), frames)
    assert {(f.entity_kind, f.slot) for f in found} == {("node", 2)}
    assert 5400 < found[0].ts < 5400 + 1200 and "idle, all GPUs of node2" in found[0].reason


def test_a_node_that_always_idles_warmer_than_its_rack_is_not_flagged_for_good():
    """node1 idles ~2.5 °C warmer over the inlet than the rest of its rack from the start and for
    good (higher in an air-cooled rack, another chassis): it was flagged "idle ... node fans or
    airflow" every refresh_s for the whole run. Judged against how warm it usually idles, its flags
    stop once it has a history; node2's fans failing at 3 h still flag node2."""
    def r_of(t, n):
        r = SPREAD[:n].copy()
        r[8:16] += 2.5 / 78.0
        if t >= 3 * 3600:
            r[16:24] *= 2.2
        return r
    topo, frames = idle_cluster(r_of, hours=5.0, racks=1)
    nodes = [(f.slot, f.ts) for f in run(CoolingDetector(topo), frames) if f.entity_kind == "node"]
    assert not [ts for nd, ts in nodes if nd == 1 and ts >= 2 * 3600]
    assert {nd for nd, ts in nodes if ts >= 3 * 3600} == {2}
    assert 3 * 3600 < min(ts for nd, ts in nodes if nd == 2) < 3 * 3600 + 1200


def test_idle_gpus_on_a_loop_losing_its_flow_are_not_read_against_their_cool_history():
    """The loop's inlet climbs from 24 to 62 °C; idle power climbs with the dies' temperature
    (leakage), and so does each GPU's excess over the inlet — most for the GPU that leaks most
    (GPU 13, idling 25 % above its node-mates). Against its idle history, learnt at 24 °C, it
    would read several °C hot (the demo's failing loop flagged node19/gpu0 so): a history holds
    only at the coolant it was learnt at."""
    topo = small_topology(nodes=4, gpus=8, racks=2)
    n = topo.size("gpu")
    idle_w = np.full(n, 78.0)
    idle_w[13] = 97.0
    frames = []
    for t in np.arange(0.0, 5 * 3600, 30.0):
        inlet = 24.0 + 38.0 * min(max(t - 7200, 0.0) / 1200, 1.0)
        power = idle_w * (1 + 0.02 * (inlet - 24.0))  # leakage: idle power grows with the temperature
        frames.append(Frame("rack", np.full(2, t), np.arange(2), {"inlet_temp": np.full(2, inlet)}))
        frames.append(Frame("gpu", np.full(n, t), np.arange(n),
                            {"gpu_temp": np.round(inlet + SPREAD[:n] * power), "power": power}))
    assert [f for f in run(CoolingDetector(topo), frames) if f.entity_kind == "gpu"] == []


def test_an_idle_gpu_whose_node_mates_work_is_not_compared():
    """An idle GPU is compared only on a node at rest. When half of node1 starts a job, the air
    its idle GPUs sit in warms, unevenly by position (in a real chassis): GPU 8 reads 3 °C
    warmer over the inlet than before, its idle node-mates 9-11 not. Compared anyway, that would
    read as its own interface failing."""
    topo = small_topology(nodes=4, gpus=8, racks=2)
    n = topo.size("gpu")
    frames = []
    for t in np.arange(0.0, 4 * 3600, 30.0):
        power = np.full(n, 78.0)
        extra = np.zeros(n)
        if t >= 3600:
            power[12:16] = 650.0
            extra[8] = 3.0  # the working neighbours' heat
        frames.append(Frame("rack", np.full(2, t), np.arange(2), {"inlet_temp": np.array([24.0, 24.0])}))
        frames.append(Frame("gpu", np.full(n, t), np.arange(n),
                            {"gpu_temp": np.round(24.0 + SPREAD[:n] * power + extra), "power": power}))
    assert [f for f in run(CoolingDetector(topo), frames) if f.entity_kind == "gpu"] == []


def test_healthy_cluster_is_quiet():
    topo, frames = cluster(lambda t, n: SPREAD[:n], lambda t: np.array([24.0 + 0.5 * np.sin(t / 5000), 24.5]))
    assert run(CoolingDetector(topo), frames) == []
    topo, frames = idle_cluster(lambda t, n: SPREAD[:n], hours=6.0)  # idle: whole degrees, inlet wandering
    assert run(CoolingDetector(topo), frames) == []


def test_state_round_trip_gives_identical_future_output():
    def r_of(t, n):
        r = SPREAD[:n].copy()
        r[3] *= 1 + 0.3 * max(0.0, t - 5400) / 3600
        return r
    topo, frames = cluster(r_of, lambda t: np.array([24.0, 24.5]))
    half = len(frames) // 2
    a = CoolingDetector(topo)
    run(a, frames[:half])
    b = CoolingDetector(topo)
    b.load_state_dict(a.state_dict())
    rest_a, rest_b = run(a, frames[half:]), run(b, frames[half:])
    assert rest_a == rest_b and rest_a
    assert a.state_nbytes() / topo.size("gpu") <= 1024


def test_light_load_and_idle_gpus_are_not_compared_with_loaded_peers():
    """node1 runs at full load for 1.5 h, then at light load (220 W) for an hour, then idles
    (75 W). Temperatures carry a fixed 3 °C offset over ``inlet + R·P`` and read as integers, so
    ``(T - inlet) / P`` reads ~+20 % at 220 W against peers at 650 W, and an idle GPU keeps the
    R its fit last learnt under load. Nothing is wrong with node1's cooling: no finding."""
    topo = small_topology(nodes=4, gpus=8, racks=2)
    n = topo.size("gpu")
    node1 = topo.gpu_node == 1
    frames = []
    for t in np.arange(0.0, 4 * 3600, 30.0):
        inlet = np.array([24.0, 24.5])
        power = np.full(n, 650.0)
        power[node1] = 650.0 if t < 5400 else 220.0 if t < 9000 else 75.0
        temp = np.round(inlet[topo.gpu_rack] + SPREAD[:n] * power + 3.0)
        frames.append(Frame("rack", np.full(2, t), np.arange(2), {"inlet_temp": inlet}))
        frames.append(Frame("gpu", np.full(n, t), np.arange(n), {"gpu_temp": temp, "power": power}))
    found = run(CoolingDetector(topo), frames)
    assert found == [], [f.reason for f in found][:3]
    # a GPU back under full load is compared again: a failing interface on node1 is caught
    def r_of(t, n):
        r = SPREAD[:n].copy()
        r[8] *= 1 + 0.3 * max(0.0, t - 7200) / 3600
        return r
    topo, frames = cluster(r_of, lambda t: np.array([24.0, 24.5]))
    assert {f.slot for f in run(CoolingDetector(topo), frames) if f.entity_kind == "gpu"} == {8}
