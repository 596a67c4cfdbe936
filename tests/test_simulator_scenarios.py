"""Each packaged scenario's ground truth holds the consequences it should, and none it should not."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from foreshock import facts
from foreshock.events import Event
from foreshock.simulator import ClusterSimulator, list_scenarios

NAMED = ["healthy", "cooling-loss", "tim-degradation", "optic-degradation", "psu-failure", "mixed"]
FAULT_FREE_TYPES = {"power_cap_start", "power_cap_end", "job_end", "job_start"}  # full load; the schedule
LINK_TYPES = {"link_down", "link_up", "congestion_start", "congestion_end"}


def run(name: str, gpus: int, duration: float, interval: float, dt: float, **params) -> ClusterSimulator:
    sim = ClusterSimulator(gpus=gpus, scenario=name, seed=11, interval=interval, duration=duration,
                           physics_dt=dt, params={"missing_prob": 0.0, **params})
    for _ in sim.iter_ticks():
        pass
    return sim


def types(events: list[Event]) -> Counter[str]:
    return Counter(e.type for e in events)


def test_all_named_scenarios_are_packaged() -> None:
    assert set(NAMED) <= set(list_scenarios())


def test_healthy_full_load_has_nothing_but_power_caps() -> None:
    sim = run("healthy", 64, 1800, 30, 2, job_intensity_range=[1.15, 1.2])
    seen = types(sim.events)
    assert seen["power_cap_start"] > 0  # full load does hit the 700 W cap ...
    assert set(seen) <= FAULT_FREE_TYPES  # ... and nothing else happens
    assert all(e.fault_id == "" for e in sim.events)
    assert not sim.faults


def test_cooling_loss_throttles_its_loop_only_minutes_after_onset() -> None:
    sim = run("cooling-loss", 128 * 2, 3600, 30, 2)
    topo = sim.topology
    (onset,) = [e for e in sim.events if e.type == "fault_onset"]
    assert onset.entity_kind == "loop" and onset.fault_type == "cooling_loss"
    loop = topo.loops.index(onset.entity)
    loop_gpus = {topo.gpus[g] for g in np.flatnonzero(topo.rack_loop[topo.gpu_rack] == loop)}
    assert set(onset.detail["racks"]) == {topo.racks[r] for r in np.flatnonzero(topo.rack_loop == loop)}
    throttles = [e for e in sim.events if e.type == "thermal_throttle_start"]
    assert len(throttles) >= 0.5 * len(loop_gpus)
    assert {e.entity for e in throttles} <= loop_gpus
    assert {e.fault_id for e in throttles} == {onset.fault_id}
    assert all(e.detail["reasons"] & facts.THROTTLE_SW_THERMAL for e in throttles)
    # the loop heats for minutes first: room to predict
    assert min(e.time for e in throttles) - onset.time > 600
    # every consequence attributed to the fault is in its loop; nothing else goes wrong
    for e in sim.events:
        if e.fault_id and e.entity_kind == "gpu":
            assert e.entity in loop_gpus
    assert not set(types(sim.events)) & (LINK_TYPES | {"power_brake_start", "xid", "hbm_overheat_start"})
    # repaired (60% of the run), the loop cools and the throttles end
    assert types(sim.events)["thermal_throttle_end"] == len(throttles)


def test_tim_degradation_throttles_one_gpu_after_a_long_lead() -> None:
    sim = run("tim-degradation", 32, 10800, 60, 5)
    (onset,) = [e for e in sim.events if e.type == "fault_onset"]
    assert onset.entity_kind == "gpu"
    throttles = [e for e in sim.events if e.type == "thermal_throttle_start"]
    assert throttles and {e.entity for e in throttles} == {onset.entity}
    assert all(e.fault_id == onset.fault_id for e in throttles)
    assert throttles[0].time - onset.time > 1800  # R drifts for a long while first
    job = sim.topology.jobs[sim.topology.gpu_job[sim.topology.slot("gpu", onset.entity)]]
    slow = [e for e in sim.events if e.type == "job_slowdown_start"]
    assert slow and {e.entity for e in slow} == {job} and {e.fault_id for e in slow} == {onset.fault_id}
    assert not set(types(sim.events)) & (LINK_TYPES | {"power_brake_start", "xid", "hbm_overheat_start"})
    # its peers stay calm
    peers = [e for e in sim.events if e.type.startswith("thermal") and e.entity != onset.entity]
    assert not peers


def test_optic_degradation_ber_climbs_then_link_down_then_congestion() -> None:
    sim = ClusterSimulator(gpus=32, scenario="optic-degradation", seed=11, interval=60, duration=9000,
                           physics_dt=5, params={"missing_prob": 0.0})
    ber, state = [], []
    optic_slot = sim.faults[0].target
    for tick in sim.iter_ticks():
        optic = next(f for f in tick if f.kind == "optic")
        ber.append(optic.columns["prefec_ber"][optic_slot])
        state.append(next(f for f in tick if f.kind == "link").columns["link_state"][optic_slot // 2])
    (onset,) = [e for e in sim.events if e.type == "fault_onset"]
    assert onset.entity_kind == "optic"
    link = onset.detail["link"]
    downs = [e for e in sim.events if e.type == "link_down"]
    assert downs and {e.entity for e in downs} == {link} and {e.fault_id for e in downs} == {onset.fault_id}
    assert downs[0].time - onset.time > 1800  # BER climbs for a long time first
    first_down_tick = int((downs[0].time - sim.start_time) // 60)
    assert ber[first_down_tick - 2] > 1000 * ber[0]
    assert ber[first_down_tick - 2] > facts.PREFEC_BER_UNCLEAN
    assert max(b for b in ber if b == b) <= 0.5
    # past the FEC limit it flaps (down, retrains, down again), then is left down
    ups = [e for e in sim.events if e.type == "link_up"]
    assert len(downs) >= 2 and len(ups) >= 1 and ups[0].time > downs[0].time
    assert [e.detail["disabled"] for e in downs] == [False] * (len(downs) - 1) + [True]
    assert downs[-1].time > ups[-1].time and state[-1] == facts.IB_PORT_STATE_DOWN
    # traffic moved to another rail congests those links, not the dead one
    congested = {e.entity for e in sim.events if e.type == "congestion_start"}
    assert congested and link not in congested
    assert all(e.fault_id == onset.fault_id for e in sim.events if e.type == "congestion_start")
    assert not set(types(sim.events)) & {"thermal_throttle_start", "power_brake_start", "xid"}


def test_every_job_slowdown_of_an_optic_fault_is_attributed_to_it() -> None:
    """A job's step uses the fabric state of the previous physics step; when its slow step is
    recorded on the step its link retrains, the attribution must look at that state too (it
    used to look at the retrained fabric, find no congestion and leave the slowdown without a
    fault, with ``comm_slowdown`` 1.0). Seed 3 flaps on such steps."""
    sim = ClusterSimulator(gpus=64, scenario="optic-degradation", seed=3, interval=60, duration=7200,
                           physics_dt=5, params={"missing_prob": 0.0})
    for _ in sim.iter_ticks():
        pass
    flaps = [e for e in sim.events if e.type == "link_down"]
    slow = [e for e in sim.events if e.type == "job_slowdown_start"]
    assert len(flaps) >= 3 and len(slow) >= 3
    assert [e.fault_id for e in slow] == ["f1"] * len(slow)
    assert all(e.detail["comm_slowdown"] > 1.2 for e in slow)  # slowed by communication


def test_psu_failure_brakes_one_node_only() -> None:
    sim = run("psu-failure", 64, 1800, 30, 2)
    (onset,) = [e for e in sim.events if e.type == "fault_onset"]
    assert onset.entity_kind == "node"
    brakes = [e for e in sim.events if e.type == "power_brake_start"]
    assert sorted(e.entity for e in brakes) == sorted(f"{onset.entity}/gpu{i}" for i in range(8))
    assert types(sim.events)["power_brake_end"] == 8  # the brake releases, the derated limit stays
    assert not set(types(sim.events)) & (LINK_TYPES | {"thermal_throttle_start", "xid"})
    assert all(e.fault_id == onset.fault_id for e in sim.events if e.fault_id)


EXPECTED = {
    "cooling_loss": "thermal_throttle_start",
    "tim_degradation": "thermal_throttle_start",
    "fan_failure": "thermal_throttle_start",
    "psu_failure": "power_brake_start",
    "optic_degradation": "link_down",
    "hbm_overheat": "hbm_overheat_start",
    "xid79": "xid",
}


@pytest.mark.slow
def test_mixed_every_fault_shows_its_consequence_in_its_own_domain() -> None:
    sim = run("mixed", 256, 21600, 60, 10)
    by_fault: dict[str, Counter[str]] = {}
    for e in sim.events:
        if e.fault_id:
            by_fault.setdefault(e.fault_id, Counter())[e.type] += 1
    assert len(sim.faults) == 8
    for f in sim.faults:
        assert by_fault[f.id]["fault_onset"] == 1
        assert by_fault[f.id][EXPECTED[f.type]] >= 1, (f.type, by_fault[f.id])
    xids = {(e.fault_type, e.detail["code"]) for e in sim.events if e.type == "xid"}
    assert ("hbm_overheat", 48) in xids and ("xid79", 79) in xids
    interrupted = [e for e in sim.events if e.type == "job_slowdown_start" and e.fault_type == "xid79"]
    assert interrupted and interrupted[0].detail["reason"] == "interrupted"
    # nothing happens without a cause but the power cap under full load ...
    assert {e.type for e in sim.events if not e.fault_id} <= FAULT_FREE_TYPES
    # ... and each fault's consequences stay in its own domain
    topo = sim.topology
    faults = {f.id: f for f in sim.faults}
    for e in sim.events:
        if not e.fault_id or e.type == "fault_onset":
            continue
        f = faults[e.fault_id]
        if f.kind == "loop":
            gpus = np.flatnonzero(topo.rack_loop[topo.gpu_rack] == f.target)
        elif f.kind == "node":
            gpus = np.flatnonzero(topo.gpu_node == f.target)
        elif f.kind == "gpu":
            gpus = np.array([f.target])
        else:  # optic: its link's GPU; rerouted traffic stays inside that GPU's job
            gpu = int(topo.link_gpu[f.target // 2])
            gpus = topo.gpus_of_job(int(topo.gpu_job[gpu]))
        names = {topo.gpus[g] for g in gpus}
        if e.entity_kind == "gpu":
            assert e.entity in names, (f.type, e)
        elif e.entity_kind == "job":
            assert set(topo.gpus[g] for g in topo.gpus_of_job(topo.jobs.index(e.entity))) & names, (f.type, e)
        elif e.entity_kind == "link":
            assert f.kind == "optic" and topo.gpus[int(topo.link_gpu[topo.links.index(e.entity)])] in names, e
    # auto targets land in different cooling loops while loops are free
    loops = []
    for f in sim.faults[:2]:
        if f.kind == "loop":
            loops.append(f.target)
        elif f.kind == "optic":
            loops.append(int(topo.rack_loop[topo.gpu_rack[topo.link_gpu[f.target // 2]]]))
        else:
            gpu = f.target if f.kind == "gpu" else int(np.flatnonzero(topo.gpu_node == f.target)[0])
            loops.append(int(topo.rack_loop[topo.gpu_rack[gpu]]))
    assert len(set(loops)) == 2


@pytest.mark.parametrize("name", NAMED)
def test_named_scenarios_load_and_start(name: str) -> None:
    sim = ClusterSimulator(gpus=16, scenario=name, seed=0, interval=10, duration=600, warmup_s=0)
    frames = sim.step()
    assert [f.kind for f in frames] == ["gpu", "link", "optic", "node", "rack", "job"]
