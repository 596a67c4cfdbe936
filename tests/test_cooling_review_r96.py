"""Cooling detector, review r96: peers at a GPU's own power, a node against a moved loop, an inlet's new level."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.cooling import CoolingDetector, median_at_same_power
from foreshock.frames import Frame
from foreshock.topology import Topology


def naive_median_at_same_power(values, power, groups, n_groups, band):
    """Per element, ``np.median`` over its group's finite values with power in its band."""
    out, count = np.full(len(values), np.nan), np.zeros(len(values), np.int64)
    usable = np.isfinite(values) & np.isfinite(power) & (groups >= 0) & (groups < n_groups)
    for i in np.flatnonzero(usable):
        a, b = power[i] * (1.0 - band), power[i] * (1.0 + band)
        sel = usable & (groups == groups[i]) & (power >= min(a, b)) & (power <= max(a, b))
        out[i], count[i] = np.median(values[sel]), np.count_nonzero(sel)
    return out, count


@pytest.mark.kernel
@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 3), st.one_of(st.floats(-1e3, 1e3), st.just(float("nan"))),
                          st.one_of(st.sampled_from([340.0, 400.0, 660.0, 700.0]), st.floats(-50, 900),
                                    st.just(float("nan")))), max_size=50),
       st.sampled_from([0.0, 0.1, 0.3]))
def test_median_at_same_power_matches_naive(rows, band):
    groups = np.array([g for g, _, _ in rows], dtype=np.int64)
    values = np.array([v for _, v, _ in rows], dtype=float)
    power = np.array([p for _, _, p in rows], dtype=float)
    got, got_n = median_at_same_power(values, power, groups, 4, band)
    want, want_n = naive_median_at_same_power(values, power, groups, 4, band)
    assert np.array_equal(got, want, equal_nan=True) and np.array_equal(got_n, want_n)


def one_rack(nodes: int = 4) -> Topology:
    return Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": f"n{i}", "rack": "k", "gpus": 8} for i in range(nodes)]})


def gpu_frames(topo, r_of, power_of, inlet_of, hours, seed=0):
    """Rack and GPU frames every 30 s: R, power and inlet per rack as functions of time."""
    rng = np.random.default_rng(seed)
    n, racks = topo.size("gpu"), topo.size("rack")
    for t in np.arange(0.0, hours * 3600, 30.0):
        inlet = inlet_of(t)
        p = power_of(t) + 5 * rng.standard_normal(n)
        yield Frame("rack", np.full(racks, t), np.arange(racks), {"inlet_temp": np.round(inlet, 1)})
        yield Frame("gpu", np.full(n, t), np.arange(n), {"gpu_temp": np.round(inlet[topo.gpu_rack] + r_of(t) * p),
                                                         "power": p, "power_limit": np.full(n, 700.0)})


R0 = 0.046 * (1 + 0.03 * np.random.default_rng(0).standard_normal(64))


def test_a_rack_running_two_loads_compares_each_gpu_with_its_own_load():
    """Half the rack at ~660 W, half at ~340 W: the rack's median power (500 W) was the one band
    centre, no GPU lay within 30 % of it, and GPU 3's interface failing (R +80 %/h) was never
    flagged; at one load it is, 900 s in. Each GPU's peers are now the rack-mates at its power."""
    topo = one_rack()
    power = np.repeat([660.0, 660.0, 340.0, 340.0], 8)

    def r_of(t):
        r = R0[:32].copy()
        r[3] *= 1 + 0.8 * max(0.0, t - 7200) / 3600
        return r
    det, found = CoolingDetector(topo), []
    for f in gpu_frames(topo, r_of, lambda t: power, lambda t: np.array([24.0]), 3.0):
        found += det.update(f)
    assert {(f.entity_kind, f.slot) for f in found} == {("gpu", 3)}
    assert 7200 < found[0].ts <= 7200 + 1200


def loop_of_two_racks() -> Topology:
    """One cooling loop, two racks of two nodes: under NODE_QUORUM, the loop is the nodes' reference."""
    return Topology.from_dict({
        "rows": [{"name": "r0", "cooling_loop": "cdu0"}],
        "racks": [{"name": f"k{i}", "row": "r0"} for i in range(2)],
        "nodes": [{"name": f"n{i}", "rack": f"k{i // 2}", "gpus": 8} for i in range(4)]})


def test_a_node_is_not_flagged_because_its_loop_reference_moved():
    """At 3 h n0 and n1 (rack k0) are re-pasted, R -25 %: the loop's median node drops half-way, and
    n2 and n3, untouched, read +11-15 % against it — they were flagged "node fans or airflow" for
    the rest of the run, their own history flat. Judged against themselves too, they are not; and
    n3's fans failing at 5 h (R x1.3) flag n3 alone, and hold it."""
    topo = loop_of_two_racks()

    def r_of(t):
        r = R0[:32].copy()
        if t >= 3 * 3600:
            r[:16] *= 0.75
        if t >= 5 * 3600:
            r[24:32] *= 1.3
        return r
    det, found = CoolingDetector(topo), []
    for f in gpu_frames(topo, r_of, lambda t: np.full(32, 650.0), lambda t: np.array([24.0, 24.0]), 7.5):
        found += det.update(f)
    nodes = [(f.slot, f.ts) for f in found if f.entity_kind == "node"]
    assert nodes and {nd for nd, _ in nodes} == {3}
    assert 5 * 3600 < min(ts for _, ts in nodes) <= 5 * 3600 + 900
    assert max(ts for _, ts in nodes) >= 7.5 * 3600 - 900  # held while the fans are out
    assert "other nodes of loop cdu0" in next(f.reason for f in found if f.entity_kind == "node")


def two_loops() -> Topology:
    return Topology.from_dict({
        "rows": [{"name": "r0", "cooling_loop": "cdu0"}, {"name": "r1", "cooling_loop": "cdu1"}],
        "racks": [{"name": f"k{i}", "row": f"r{i // 2}"} for i in range(4)],
        "nodes": [{"name": f"n{i}", "rack": f"k{i // 2}", "gpus": 8} for i in range(8)]})


def setpoint_inlet(t):
    inlet = np.full(4, 24.0)
    if t >= 3 * 3600:
        inlet[:2] += 6.0 * min(1.0, (t - 3 * 3600) / 1800)  # cdu0's supply setpoint raised, then held
    return inlet


def test_a_raised_supply_setpoint_is_said_once_to_be_a_new_level():
    """cdu0's supply setpoint is raised 6 °C for good; the dies follow, R unchanged. Both its racks
    were flagged "the cooling loop (CDU) is losing capacity" every refresh_s for as long as it ran
    (the baseline is not learnt while flagged). Flagged as it rises; once held steady for
    inlet_hold_s with R unchanged, said once to be a new level, and quiet from then on."""
    topo = two_loops()
    det, found = CoolingDetector(topo), []
    for f in gpu_frames(topo, lambda t: R0, lambda t: np.full(64, 650.0), setpoint_inlet, 9.0):
        found += det.update(f)
    racks = [f for f in found if f.entity_kind == "rack"]
    assert {f.slot for f in racks} == {0, 1} and len(found) == len(racks)
    assert all(3 * 3600 <= f.ts <= 3 * 3600 + 3 * 3600 for f in racks)  # quiet for the last 3 h
    last = [f for f in racks if "a new level" in f.reason]
    assert sorted(f.slot for f in last) == [0, 1] and all(f is racks[-1] or f is racks[-2] for f in last)


def test_a_loop_whose_gpus_run_hotter_is_not_taken_for_a_new_level():
    """The same steady inlet, but the racks' GPUs' R up 30 % meanwhile (not a setpoint): held flagged."""
    topo = two_loops()

    def r_of(t):
        return R0 * np.where((np.arange(64) < 32) & (t >= 3 * 3600), 1.3, 1.0)
    det, found = CoolingDetector(topo), []
    for f in gpu_frames(topo, r_of, lambda t: np.full(64, 650.0), setpoint_inlet, 7.0):
        found += det.update(f)
    racks = [f for f in found if f.entity_kind == "rack"]
    assert not [f for f in racks if "new level" in f.reason]
    assert max(f.ts for f in racks) >= 7 * 3600 - 900


def test_a_held_inlet_survives_a_state_round_trip_and_old_states_load():
    topo = two_loops()
    frames = list(gpu_frames(topo, lambda t: R0, lambda t: np.full(64, 650.0), setpoint_inlet, 7.0))
    cut = len(frames) * 9 // 14  # 4.5 h: the inlet holding, flagged
    a = CoolingDetector(topo)
    for f in frames[:cut]:
        a.update(f)
    assert np.isfinite(a.s_rack_hold[:2]).all()
    b = CoolingDetector(topo)
    b.load_state_dict(a.state_dict())
    rest_a = [x for f in frames[cut:] for x in a.update(f)]
    rest_b = [x for f in frames[cut:] for x in b.update(f)]
    assert rest_a == rest_b and any("new level" in f.reason for f in rest_a)
    old = CoolingDetector(topo).state_dict()
    del old["s_rack_hold"]
    c = CoolingDetector(topo)
    c.load_state_dict(old)
    assert c.s_rack_hold.shape == (4, 3) and np.isnan(c.s_rack_hold).all()


def idle_loop_frames(r_of, sensor_offset_of, hours, step=30.0):
    """Frames of :func:`loop_of_two_racks` idling at ~78 W (no job), whole °C: R per GPU and each
    rack's inlet sensor error as functions of time (the coolant itself wanders a little)."""
    topo = loop_of_two_racks()
    rng = np.random.default_rng(4)
    power = 78.0 + rng.uniform(-4, 4, 32)
    for t in np.arange(0.0, hours * 3600, step):
        water = np.full(2, 24.2) + 0.3 * np.sin(t / 2000.0)
        yield Frame("rack", np.full(2, t), np.arange(2), {"inlet_temp": np.round(water + sensor_offset_of(t), 1)})
        yield Frame("gpu", np.full(32, t), np.arange(32), {
            "gpu_temp": np.round(water[topo.gpu_rack] + r_of(t) * power), "power": power + rng.normal(0, 2, 32)})


def test_an_idle_node_is_not_flagged_because_its_loop_reference_moved():
    """The idle side of the same: at 3 h rack k0's inlet sensor is re-based 8 °C high (the coolant
    unchanged), so n0 and n1 idle 8 °C cooler over their inlet; the loop's median idle node drops
    4 °C, and n2 and n3, untouched, were flagged "idle ... +4 °C warmer over the inlet than the other
    idle nodes of loop cdu0 — node fans or airflow" every refresh_s for the rest of the run, their
    own idle history flat. Judged against themselves too, they are not; and n3's fans failing at
    5 h (R x2.2: +4 °C over the inlet) flag n3 alone, and hold it — its GPUs' idle history is not
    learnt while the node is flagged (learnt, it had cleared the flag with the fans still out)."""
    def r_of(t):
        r = R0[:32].copy()
        if t >= 5 * 3600:
            r[24:32] *= 2.2
        return r

    def sensor_offset_of(t):
        return np.array([8.0 if t >= 3 * 3600 else 0.0, 0.0])
    det, found = CoolingDetector(loop_of_two_racks()), []
    for f in idle_loop_frames(r_of, sensor_offset_of, 11.0, step=60.0):
        found += det.update(f)
    nodes = [f for f in found if f.entity_kind == "node"]
    assert nodes and {f.slot for f in nodes} == {3}
    assert 5 * 3600 < nodes[0].ts <= 5 * 3600 + 1200
    assert nodes[-1].ts >= 11 * 3600 - 900  # held while the fans are out
    assert nodes[0].reason.startswith("idle, all GPUs of n3") and "other idle nodes of loop cdu0" in nodes[0].reason
