"""The incident engine on hand-built finding streams over a small cluster.

Topology: two cooling loops (cdu0: rack0, rack1; cdu1: rack2, rack3), two nodes of 4 GPUs per
rack, a rail-optimised fabric (leaf r for GPU r of every node, two spines), job0 on the nodes of
cdu0 and job1 on those of cdu1. Each test feeds findings the way the detector bank does (one
``observe`` per telemetry step) and checks what an operator would see.
"""

from __future__ import annotations

import copy
import doctest
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import incidents as incidents_module
from foreshock.detectors.incident_domains import JOB, key
from foreshock.detectors.incident_external import ExternalEvent, iter_events, parse_event, parse_time
from foreshock.detectors.incident_impact import STALLED_RATIO
from foreshock.detectors.incident_signals import classify
from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Incident, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

GPUS = 4
NODES = 8


def make_topology() -> Topology:
    nodes = [f"node{i}" for i in range(NODES)]
    links = [{"name": f"{n}/gpu{r}~leaf{r}", "a": f"{n}/gpu{r}", "b": f"leaf{r}"} for n in nodes for r in range(GPUS)]
    links += [{"name": f"leaf{r}~spine{s}", "a": f"leaf{r}", "b": f"spine{s}"} for r in range(GPUS) for s in range(2)]
    return Topology.from_dict({
        "cluster": "t",
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}, {"name": "row1", "cooling_loop": "cdu1"}],
        "racks": [{"name": f"rack{k}", "row": f"row{k // 2}"} for k in range(4)],
        "nodes": [{"name": n, "rack": f"rack{i // 2}", "gpus": GPUS} for i, n in enumerate(nodes)],
        "switches": [{"name": f"leaf{r}", "tier": "leaf", "rail": r} for r in range(GPUS)]
        + [{"name": f"spine{s}", "tier": "spine"} for s in range(2)],
        "links": links,
        "jobs": [{"name": "job0", "nodes": nodes[:4]}, {"name": "job1", "nodes": nodes[4:]}],
    })


TOPO = make_topology()


def gpu(node: int, index: int) -> int:
    return node * GPUS + index


def link(node: int, rail: int) -> int:
    return node * GPUS + rail


def thermal(ts: float, g: int, eta: float = 900.0, active: bool = True) -> Prediction:
    return Prediction(ts, "gpu", g, "thermal_throttle", eta, 0.9, "thermal", "core heading for 90 °C", active)


def run(engine: IncidentEngine, findings: list, until: float, step: float = 10.0, start: float = 0.0,
        frames: dict[float, list[Frame]] | None = None) -> list[Incident]:
    """Feed findings in time steps like the bank does; return the incidents emitted."""
    findings = sorted(findings, key=lambda f: f.ts)
    out: list[Incident] = []
    i = 0
    t = start
    while t <= until:
        j = i
        while j < len(findings) and findings[j].ts <= t:
            j += 1
        for fr in (frames or {}).get(t, []):
            engine.observe_frame(fr)
        out += [f for f in engine.observe(findings[i:j], t) if isinstance(f, Incident)]
        i = j
        t += step
    engine.check_invariants()
    return out


def by_id(out: list[Incident]) -> dict[str, list[Incident]]:
    d: dict[str, list[Incident]] = {}
    for inc in out:
        d.setdefault(inc.incident_id, []).append(inc)
    return d


# ---- one cause, one incident, the right root ---------------------------------------------------
def cooling_loss_stream(end: float = 1800.0) -> list:
    """Every GPU of cdu0 (nodes 0-3) heads for throttling, one after another; rack inlets rise."""
    out: list = [Anomaly(30.0, "rack", r, "inlet_temp", 3.0, "cooling", "inlet +3 °C") for r in (0, 1)]
    for g in range(4 * GPUS):
        for t in np.arange(20.0 + 12 * g, end, 60.0):
            out.append(thermal(float(t), g, eta=max(60.0, 900.0 - t / 2)))
        out.append(thermal(end + g, g, active=False))
    return out


def test_cooling_loop_fault_is_one_incident_rooted_at_the_loop():
    engine = IncidentEngine(TOPO)
    stream = cooling_loss_stream()
    out = run(engine, stream, until=1800.0 + 2000.0)
    incidents = by_id(out)
    assert len(incidents) == 1, [(i, e[-1].root_entity) for i, e in incidents.items()]
    updates = next(iter(incidents.values()))
    last_live = [u for u in updates if u.state != "resolved"][-1]
    assert (last_live.root_kind, last_live.root_entity, last_live.fault_hint) == ("cooling_loop", "cdu0", "cooling_loss")
    loop0 = {TOPO.gpus[g] for g in range(16)}
    assert loop0 <= set(last_live.members)
    assert not {m for m in last_live.members if m.startswith(("node4", "node5", "node6", "node7"))}
    assert "inlet rising on 2 racks" in last_live.reason
    # grouped, not re-raised per member: far fewer emissions than members, let alone findings
    assert len(updates) <= 8 < len(stream) // 50
    states = [u.state for u in updates]
    assert states[0] == "open" and states[-1] == "resolved" and "growing" in states
    assert [s for s in states if s == "resolved"] == ["resolved"]


def test_loop_root_needs_spread_over_racks():
    """Three GPUs of one node heating together are that node's trouble, not the loop's."""
    engine = IncidentEngine(TOPO)
    stream = [thermal(float(t), gpu(1, i)) for i in range(3) for t in range(0, 600, 60)]
    inc = [u for u in run(engine, stream, until=600.0) if u.state != "resolved"][-1]
    assert (inc.root_kind, inc.root_entity, inc.fault_hint) == ("node", "node1", "fan_failure")


def test_single_gpu_with_calm_peers_is_its_thermal_interface():
    engine = IncidentEngine(TOPO)
    g = gpu(2, 1)
    stream = [thermal(float(t), g, eta=3000.0 - t) for t in range(0, 3600, 60)]
    stream += [Anomaly(float(t), "gpu", g, "gpu_temp", 0.3, "cooling", "R +30 % vs rack") for t in range(300, 3600, 600)]
    out = run(engine, stream, until=3600.0)
    assert len(by_id(out)) == 1
    inc = out[-1]
    assert (inc.root_kind, inc.root_entity, inc.fault_hint) == ("gpu", "node2/gpu1", "tim_degradation")
    assert "3 peers" in inc.reason and "calm" in inc.reason
    assert inc.members == ("node2/gpu1",)
    # its own prediction is the spread: this GPU, with the detector's ETA counting down
    assert inc.predicted_members and inc.predicted_members[0][0] == "node2/gpu1"
    assert inc.predicted_members[0][1] == pytest.approx(max(0.0, 3000.0 - inc.ts), abs=1.0)
    first = out[0]  # at the first report the ETA was the detector's, counted down to that moment
    assert first.predicted_members[0][1] == pytest.approx(3000.0 - first.ts, abs=1.0)


def test_hbm_overheat_then_xid48_stays_one_incident():
    engine = IncidentEngine(TOPO)
    g = gpu(5, 2)
    stream = [Prediction(float(t), "gpu", g, "hbm_overheat", 1200.0, 0.8, "thermal", "HBM heading for 96 °C")
              for t in range(0, 1800, 60)]
    stream.append(Anomaly(1500.0, "gpu", g, "xid_last", 48.0, "xid", "XID 48 on node5/gpu2"))
    out = run(engine, stream, until=1800.0)
    assert len(by_id(out)) == 1
    assert (out[-1].root_entity, out[-1].fault_hint) == ("node5/gpu2", "hbm_overheat")


def test_fan_failure_roots_at_the_node():
    engine = IncidentEngine(TOPO)
    stream = [Anomaly(100.0 + 5 * i, "gpu", gpu(6, i), "throttle_reasons", 32.0, "throttle_bits",
                      "throttling observed: sw_thermal") for i in range(GPUS)]
    stream += [Anomaly(130.0, "node", 6, "fan_speed", 0.8, "cooling", "node fans")]
    out = run(engine, stream, until=400.0)
    assert len(by_id(out)) == 1
    assert (out[-1].root_kind, out[-1].root_entity, out[-1].fault_hint) == ("node", "node6", "fan_failure")
    assert len(out[-1].members) == GPUS + 1


def optic_stream(down_at: float = 3000.0) -> list:
    dead = link(0, 0)
    optic = 2 * dead + 1
    name = TOPO.links[dead]
    s: list = [Anomaly(0.0, "optic", optic, "rx_power", 1.5, "optics", f"RX power stepped -1.5 dB on {name}#b")]
    s += [Prediction(float(t), "link", dead, "link_down", max(0.0, down_at - t), 0.8, "optics",
                     f"{name}#b: pre-FEC BER 1e-6 reaches the FEC limit in {(down_at - t) / 3600:.1f} h")
          for t in range(100, int(down_at), 60)]
    s.append(Anomaly(down_at, "link", dead, "link_downed", 1.0, "link_errors", f"fatal: link down on {name}"))
    # congestion on links that took the traffic: one names the cause, the others do not
    s.append(Prediction(down_at + 5, "link", link(0, 1), "congestion", 0.0, 1.0, "congestion",
                        f"congestion on {TOPO.links[link(0, 1)]}; likely cause: traffic rerouted from {name}, which went down 5 s ago"))
    s.append(Prediction(down_at + 5, "link", link(0, 2), "congestion", 0.0, 1.0, "congestion",
                        f"congestion on {TOPO.links[link(0, 2)]}; one hot port"))
    s.append(Prediction(down_at + 5, "link", link(1, 1), "congestion", 0.0, 1.0, "congestion",
                        f"congestion on {TOPO.links[link(1, 1)]}; spreading over 2 ports of leaf1"))
    return s


def test_optic_then_link_down_then_congestion_is_one_incident_rooted_at_the_optic():
    engine = IncidentEngine(TOPO)
    out = run(engine, optic_stream(), until=3400.0)
    incidents = by_id(out)
    assert len(incidents) == 1, {k: v[-1].members for k, v in incidents.items()}
    first, last = out[0], out[-1]
    assert (last.root_kind, last.root_entity, last.fault_hint) == ("optic", "node0/gpu0~leaf0#b", "optic_degradation")
    assert {"node0/gpu0~leaf0", "node0/gpu1~leaf1", "node0/gpu2~leaf2", "node1/gpu1~leaf1"} <= set(last.members)
    # before the link went down, the links that would take its traffic were the predicted spread,
    # with the link-down ETA
    assert first.root_kind == "optic"
    spread = dict(first.predicted_members)
    assert 2900 - 200 < spread["node0/gpu0~leaf0"] <= 2900
    assert {"node0/gpu1~leaf1", "node0/gpu2~leaf2", "node0/gpu3~leaf3"} <= set(spread)
    assert "job0" in dict(last.jobs)


def test_congestion_before_its_cause_is_reported_still_merges():
    """In one batch the congestion detector may speak before the link-error detector."""
    engine = IncidentEngine(TOPO)
    dead = link(3, 2)
    name = TOPO.links[dead]
    stream = [Prediction(500.0, "link", link(3, 0), "congestion", 0.0, 1.0, "congestion", "one hot port"),
              Prediction(500.0, "link", link(3, 1), "congestion", 0.0, 1.0, "congestion", "2 ports congested nearby"),
              Anomaly(500.0, "link", dead, "link_downed", 1.0, "link_errors", f"fatal: down on {name}")]
    out = run(engine, stream, until=800.0)
    assert len(by_id(out)) == 1
    assert (out[-1].root_kind, out[-1].root_entity) == ("link", name)


def test_independent_faults_in_different_domains_stay_apart():
    engine = IncidentEngine(TOPO)
    tim = gpu(1, 3)
    stream = [thermal(float(t), tim, eta=2000.0) for t in range(0, 1800, 60)]
    stream += [Anomaly(600.0, "gpu", gpu(6, i), "throttle_reasons", 1.0, "power", "HW power brake (0x80)")
               for i in range(GPUS)]
    stream += [Anomaly(610.0, "node", 6, "psu_power", 1.0, "power", "node-wide power brake")]
    stream += [Anomaly(620.0, "gpu", gpu(3, 0), "xid_last", 79.0, "xid", "XID 79: fell off the bus")]
    stream += optic_stream(down_at=1500.0)
    out = run(engine, stream, until=1800.0)
    final = {k: [u for u in v if u.state != "resolved"][-1] for k, v in by_id(out).items()}
    roots = sorted((i.root_kind, i.root_entity, i.fault_hint) for i in final.values())
    assert roots == [("gpu", "node1/gpu3", "tim_degradation"), ("gpu", "node3/gpu0", "xid79"),
                     ("node", "node6", "psu_failure"), ("optic", "node0/gpu0~leaf0#b", "optic_degradation")]
    members = [set(i.members) for i in final.values()]
    assert all(not (a & b) for i, a in enumerate(members) for b in members[i + 1:])


def test_a_gpu_of_an_overheating_loop_that_falls_off_the_bus_is_a_new_incident():
    engine = IncidentEngine(TOPO)
    stream = cooling_loss_stream(end=1200.0)
    stream.append(Anomaly(900.0, "gpu", gpu(2, 2), "xid_last", 79.0, "xid", "XID 79"))
    out = run(engine, stream, until=1200.0)
    final = {k: v[-1] for k, v in by_id(out).items()}
    assert sorted((i.root_kind, i.root_entity) for i in final.values()) == [
        ("cooling_loop", "cdu0"), ("gpu", "node2/gpu2")]


def test_two_gpus_failing_far_apart_in_time_in_one_loop_are_not_a_loop_incident():
    engine = IncidentEngine(TOPO)
    stream = [thermal(float(t), gpu(0, 0), eta=3000.0) for t in range(0, 7200, 60)]
    stream += [thermal(float(t), gpu(3, 3), eta=3000.0) for t in range(3600, 7200, 60)]
    stream += [thermal(float(t), gpu(2, 1), eta=3000.0) for t in range(5400, 7200, 60)]
    out = run(engine, stream, until=7200.0)
    roots = sorted(v[-1].root_entity for v in by_id(out).values())
    assert roots == ["node0/gpu0", "node2/gpu1", "node3/gpu3"]


# ---- lifecycle -------------------------------------------------------------------------------------
def test_lifecycle_open_growing_stable_resolved_and_reopen():
    engine = IncidentEngine(TOPO, hold_s=60.0, update_interval_s=30.0, stable_s=300.0, quiet_s=600.0)
    a, b = gpu(4, 0), gpu(4, 1)
    stream = [thermal(float(t), a) for t in range(0, 1200, 60)]
    stream += [thermal(float(t), b) for t in range(400, 1200, 60)]
    stream += [thermal(1200.0, a, active=False), thermal(1200.0, b, active=False)]
    out = run(engine, stream, until=2400.0)
    assert len(by_id(out)) == 1
    timeline = [(u.ts, u.state, len(u.members)) for u in out]
    assert timeline[0] == (60.0, "open", 1)
    assert ("growing", 2) in [(s, n) for _, s, n in timeline]
    stable = [t for t, s, _ in timeline if s == "stable"]
    assert stable and stable[-1] >= 400 + 300
    resolved = [t for t, s, _ in timeline if s == "resolved"]
    assert len(resolved) == 1 and resolved[0] >= 1200 + 600
    # refreshes of the same prediction never re-raise: one emission per change — one of them, since
    # 2026-12-05, the withdrawals at 1,200 s ending the job's predicted cost (told the next tick, not
    # quiet_s later)
    assert len(out) == len(timeline) <= 6
    (withdrawn,) = [u for u in out if 1200.0 <= u.ts < 1800.0]
    before = [u for u in out if u.ts < 1200.0][-1]
    assert any(x > 1.0 for _, x in before.jobs) and withdrawn.jobs and all(x == 1.0 for _, x in withdrawn.jobs)
    # the same GPU failing again soon after reopens the same incident (a flapping cause)
    again = run(engine, [thermal(2500.0, a), thermal(2560.0, a)], start=2410.0, until=2700.0)
    assert {u.incident_id for u in again} == {out[0].incident_id}
    assert again[0].state == "growing"


def test_pending_incident_needs_more_than_one_weak_finding():
    engine = IncidentEngine(TOPO, quiet_s=300.0)
    one = [Anomaly(10.0, "gpu", gpu(5, 0), "gpu_temp", 0.1, "cooling", "R drift")]
    assert run(engine, one, until=1000.0) == []
    assert engine.stats["unconfirmed"] == 1
    # symptoms alone (power caps, peer outliers) never open an incident
    caps = [Prediction(float(t), "gpu", gpu(5, 1), "power_cap", 30.0, 0.9, "power", "rising") for t in range(0, 600, 30)]
    assert run(engine, caps, start=1010.0, until=1700.0) == []
    assert engine.stats["unattached"] >= len(caps) - 1


def test_symptoms_inside_an_open_loop_incident_join_it():
    engine = IncidentEngine(TOPO)
    stream = cooling_loss_stream(end=1200.0)
    capped = gpu(3, 3)
    stream += [Anomaly(700.0, "gpu", capped, "throttle_reasons", 4.0, "throttle_bits", "throttling observed: sw_power_cap")]
    out = run(engine, stream, until=1200.0)
    assert TOPO.gpus[capped] in out[-1].members


def test_symptoms_do_not_keep_an_incident_open():
    """Routine power caps under full load never stop; the loop incident still resolves."""
    engine = IncidentEngine(TOPO, quiet_s=600.0)
    stream = cooling_loss_stream(end=1200.0)
    stream += [Prediction(float(t), "gpu", g, "power_cap", 60.0, 0.8, "power", "power rising")
               for t in range(1300, 4000, 60) for g in (1, 6, 11)]
    out = run(engine, stream, until=4000.0)
    resolved = [u for u in out if u.state == "resolved"]
    assert len(resolved) == 1 and resolved[0].ts <= 1200.0 + 16 + 600.0 + 20.0


# ---- job impact and spread -------------------------------------------------------------------------
def test_job_impact_slowest_member_sets_the_pace():
    engine = IncidentEngine(TOPO)
    stream = [thermal(float(t), gpu(0, 1)) for t in range(0, 300, 60)]
    stream += [Anomaly(30.0, "gpu", gpu(0, 2), "throttle_reasons", 8.0, "throttle_bits", "hw_slowdown")]
    out = run(engine, stream, until=300.0)
    inc = out[-1]
    assert inc.root_entity == "node0"
    assert dict(inc.jobs) == {"job0": 2.0}
    n_job = len(TOPO.gpus_of_job(0))
    assert inc.gpu_hours_at_risk_per_hour == pytest.approx(n_job * (1 - 1 / 2.0))


def test_gpu_off_the_bus_stalls_its_job():
    engine = IncidentEngine(TOPO)
    out = run(engine, [Anomaly(0.0, "gpu", gpu(6, 3), "xid_last", 79.0, "xid", "XID 79")], until=120.0)
    inc = out[-1]
    assert dict(inc.jobs) == {"job1": STALLED_RATIO}
    assert inc.gpu_hours_at_risk_per_hour == len(TOPO.gpus_of_job(1))
    # a stalled job's step time measured by telemetry confirms it; the incident stays open while
    # the GPU is silent (telemetry flows for the others)
    for t in range(120, 3000, 60):
        engine.observe_frame(Frame("gpu", np.full(3, float(t)), np.array([0, 1, 2], np.int32),
                                   {"gpu_temp": np.full(3, 50.0)}))
        assert not [f for f in engine.observe([], float(t)) if isinstance(f, Incident) and f.state == "resolved"]


def test_a_gpu_back_on_the_bus_does_not_open_a_second_incident_for_the_same_fault():
    """After an XID 79 the GPU is repaired and rejoins; for a while it differs from its peers (its job
    restarts, its clocks and caches are fresh). What the detectors say about it then is the same
    fault's aftermath, not a new cause: no second incident (seed 779 of the mixed scenario showed a
    'thermal interface' incident on the repaired GPU 70 s after the XID incident resolved).
    A cause that persists past the aftermath window still opens its own incident."""
    engine = IncidentEngine(TOPO)
    lost = gpu(6, 3)
    back_at = 1800.0

    def frames(t: float) -> list[Frame]:
        slots = np.arange(len(TOPO.gpus), dtype=np.int32)
        if t < back_at:
            slots = slots[slots != lost]  # silent while off the bus
        return [Frame("gpu", np.full(len(slots), t), slots, {"gpu_temp": np.full(len(slots), 50.0)})]

    out = run(engine, [Anomaly(0.0, "gpu", lost, "xid_last", 79.0, "xid", "XID 79")], until=3600.0,
              frames={float(t): frames(float(t)) for t in range(0, 3610, 10)})
    (first,) = by_id(out).values()
    resolved_at = next(u.ts for u in first if u.state == "resolved")
    assert resolved_at >= back_at
    after = [Anomaly(resolved_at + 70.0, "gpu", lost, "gpu_temp", 9.0, "straggler",
                     "temperature 46.7 °C vs job job1 median 36.9 °C (16 busy GPUs in the job) at the same load"),
             Anomaly(resolved_at + 530.0, "gpu", lost, "hbm_temp", 6.0, "robust_zscore", "CUSUM")]
    again = run(engine, after, start=resolved_at + 10.0, until=resolved_at + 2000.0)
    assert again == []
    # a thermal cause on the same GPU that persists past the aftermath window is reported, and an
    # observed effect (throttling) inside the window at once
    start = resolved_at + 2000.0
    later = [thermal(start + t, lost, eta=3600.0) for t in range(0, 3600, 60)]
    new = run(engine, later, start=start, until=start + 3600.0)
    assert {u.incident_id for u in new} - {first[0].incident_id}
    assert min(u.ts for u in new) <= resolved_at + engine.reopen_s + 200.0
    assert new[-1].root_entity == TOPO.gpus[lost] and new[-1].fault_hint == "tim_degradation"
    fresh = IncidentEngine(TOPO)
    run(fresh, [Anomaly(0.0, "gpu", lost, "xid_last", 79.0, "xid", "XID 79")], until=1200.0)
    observed = [Anomaly(1300.0 + t, "gpu", lost, "throttle_reasons", 32.0, "throttle_bits", "sw_thermal")
                for t in (0.0, 60.0)]
    assert run(fresh, observed, start=1210.0, until=1500.0)


def test_a_gpu_back_on_the_bus_still_joins_a_loop_that_fails_around_it():
    from dataclasses import replace

    engine = IncidentEngine(TOPO)
    back = gpu(1, 1)  # on cdu0
    first = run(engine, [Anomaly(0.0, "gpu", back, "xid_last", 79.0, "xid", "XID 79")], until=1000.0)
    assert first[-1].state == "resolved"
    loop = [replace(f, ts=f.ts + 1000.0) for f in cooling_loss_stream(end=1200.0)]
    out = run(engine, loop, start=1010.0, until=2300.0)
    final = [u for u in out if u.root_kind == "cooling_loop"][-1]
    assert TOPO.gpus[back] in final.members


def test_predicted_spread_is_ranked_by_headroom_with_telemetry():
    engine = IncidentEngine(TOPO)
    # telemetry: loop-0 GPUs warm at different margins, all heating at 0.01 °C/s
    slots = np.arange(16, dtype=np.int32)
    base = 50.0 + slots.astype(float)  # GPU 15 is the hottest: least headroom
    frames = {float(t): [Frame("gpu", np.full(16, float(t)), slots,
                               {"gpu_temp": base + 0.01 * t, "slowdown_temp": np.full(16, 89.0)})]
              for t in range(0, 900, 10)}
    stream = [Anomaly(430.0, "rack", r, "inlet_temp", 3.0, "cooling", "inlet") for r in (0, 1)]
    stream += [thermal(float(t), g) for g in (0, 5, 9) for t in range(400, 900, 60)]
    out = run(engine, stream, until=890.0, frames=frames)
    inc = out[-1]
    assert inc.root_entity == "cdu0"
    exposed = [(n, eta) for n, eta in inc.predicted_members if n not in inc.members]
    names = [n for n, _ in exposed]
    assert names[:3] == ["node3/gpu3", "node3/gpu2", "node3/gpu1"]
    # ETA from headroom and heating rate: (87 °C - T) / 0.01 °C/s, T as of the last telemetry
    t_seen = inc.ts
    expect = (87.0 - (50.0 + 15 + 0.01 * t_seen)) / 0.01
    assert exposed[0][1] == pytest.approx(expect, rel=0.05)
    # without telemetry the same incident still names the exposed GPUs, with unknown ETAs
    blind = IncidentEngine(TOPO)
    inc2 = run(blind, stream, until=890.0)[-1]
    assert {n for n, _ in inc2.predicted_members if n not in inc2.members} == set(names)
    assert all(eta == -1.0 for n, eta in inc2.predicted_members if n not in inc2.members)


def test_reroute_targets_are_ranked_by_link_capacity_left_with_the_link_down_eta():
    """A failing NIC link's traffic moves to its node's other NIC links: the busiest sibling has the
    least capacity left once it takes a share, so it comes first; each carries the link-down ETA."""
    engine = IncidentEngine(TOPO)
    rate = 400e9  # bits/s
    util = {link(0, 1): 0.2, link(0, 2): 0.6, link(0, 3): 0.4, link(0, 0): 0.5}
    slots = np.array(sorted(util), dtype=np.int32)
    per_s = np.array([util[int(s)] * rate / 8.0 for s in slots])  # bytes per second
    frames = {float(t): [Frame("link", np.full(len(slots), float(t)), slots,
                               {"tx_data": per_s * t, "link_rate": np.full(len(slots), rate)})]
              for t in range(0, 400, 10)}
    stream = [f for f in optic_stream(down_at=3000.0) if f.ts < 400.0]
    out = run(engine, stream, until=390.0, frames=frames)
    inc = out[-1]
    assert inc.root_kind == "optic"
    spread = list(inc.predicted_members)
    names = [n for n, _ in spread]
    siblings = [TOPO.links[link(0, r)] for r in (2, 3, 1)]  # capacity left, 1 - 4/3 u: 0.20, 0.47, 0.73
    assert names[0] == TOPO.links[link(0, 0)]  # the failing link itself, with the detector's ETA
    assert names[1:4] == siblings
    link_eta = dict(spread)[TOPO.links[link(0, 0)]]
    assert link_eta == pytest.approx(3000.0 - inc.ts, abs=70.0)
    # the siblings inherit the ETA of the failure that will load them, counted down like the link's
    # (the optic is a member too and knows no ETA: that must not hide the link's)
    assert [eta for _, eta in spread[1:4]] == [link_eta] * 3


# ---- sinks: console and JSON lines ------------------------------------------------------------------
def test_console_and_jsonl_sinks_show_the_incident(tmp_path):
    """The console summary of `replay`/`demo` lists each incident once (its latest state) with its
    root, why, members, what comes next (ETA in minutes) and the job's slowdown; the JSONL sink
    writes every emission so that it reads back equal."""
    import io

    from rich.console import Console

    from foreshock.exporters.console import FindingTally, render_summary
    from foreshock.exporters.jsonl import JsonlSink
    from foreshock.findings import finding_from_dict

    out = run(IncidentEngine(TOPO), optic_stream(down_at=3000.0), until=1200.0)
    assert len(by_id(out)) == 1 and len(out) >= 2
    tally = FindingTally(TOPO)
    tally.first_ts = 0.0
    tally.observe_findings(out)
    sink = JsonlSink(tmp_path / "findings.jsonl")
    sink.observe_findings(out)
    sink.close()
    text = io.StringIO()
    render_summary(tally, PipelineHealth(), console=Console(file=text, width=400))
    lines = text.getvalue().splitlines()
    rows = [line for line in lines if line.startswith("│") and "optic node0/gpu0~leaf0#b" in line]
    assert len(rows) == 1, text.getvalue()  # one row per incident, not per emission
    last = out[-1]
    eta_min = f"{last.predicted_members[0][1] / 60:.0f} min"
    assert last.state in rows[0] and f"node0/gpu0~leaf0 ({eta_min})" in rows[0]
    assert "job0 x1.04" in rows[0]
    # the why under the table, at full width, once
    assert [line for line in lines if "why" in line] == [f"  why: {last.reason}"]
    back = [finding_from_dict(json.loads(line)) for line in (tmp_path / "findings.jsonl").read_text().splitlines()]
    assert back == out


# ---- external events ---------------------------------------------------------------------------
def test_external_events_group_like_findings():
    health = PipelineHealth()
    lines = [
        json.dumps({"node": "node2", "time": 100.0, "type": "psu_failure", "severity": "critical"}),
        json.dumps({"node": "node3", "time": "1970-01-01T00:01:50Z", "type": "PSU redundancy lost", "severity": "warning"}),
        "not json",
        json.dumps({"node": "node4", "time": 100.0}),
        json.dumps({"node": "node9", "time": 100.0, "type": "fan", "severity": "critical"}),
        json.dumps({"node": "node7", "time": 120.0, "type": "job_requeued", "severity": "info"}),
    ]
    events = list(iter_events(lines, health, "bmc.jsonl"))
    assert [e.node for e in events] == ["node2", "node3", "node9", "node7"]
    assert events[1].time == 110.0
    assert sum(health.problems.values()) == 2
    # `foreshock incidents --external` counts under the stage `replay --external`'s live feed uses
    assert {stage for stage, _ in health.problems} == {"external"}
    engine = IncidentEngine(TOPO, health)
    engine.add_external(events)
    assert engine.observe([], 50.0) == []  # not yet: they are grouped when telemetry time reaches them
    out = run(engine, [], start=60.0, until=400.0)
    assert len(by_id(out)) == 1
    inc = out[-1]
    assert (inc.root_kind, inc.root_entity) == ("pdu", "rack1")
    assert set(inc.members) == {"node2", "node3"}
    assert health.problems[("incidents", "external event for an unknown node")] == 1


def test_parse_event_rejects_bad_fields():
    with pytest.raises(ValueError, match="missing"):
        parse_event({"node": "n"})
    with pytest.raises(ValueError, match="non-empty"):
        parse_event({"node": "", "time": 1, "type": "x"})
    with pytest.raises(ValueError):
        parse_time(float("nan"))
    with pytest.raises(ValueError):
        parse_time(True)
    assert parse_event({"node": "n", "time": "5", "type": "x"}) == ExternalEvent("n", 5.0, "x", "warning")


# ---- robustness, state, bounds -----------------------------------------------------------------
def test_bad_findings_are_counted_not_fatal():
    health = PipelineHealth()
    engine = IncidentEngine(TOPO, health)
    bad = [Anomaly(0.0, "gpu", 9999, "gpu_temp", 1.0, "x"), Anomaly(0.0, "switch", 0, "x", 1.0, "x"),
           Anomaly(float("nan"), "gpu", 0, "gpu_temp", 1.0, "x")]
    assert engine.observe(bad, 10.0) == []
    assert health.problems[("incidents", "finding for an unknown entity")] == 2
    assert health.problems[("incidents", "finding with a non-finite timestamp")] == 1
    with pytest.raises(ValueError):
        IncidentEngine(TOPO, hold_s=-1.0)
    with pytest.raises(ValueError):
        IncidentEngine(TOPO, cover=0.2)


def test_state_round_trip_gives_identical_future_output():
    stream = cooling_loss_stream(end=1500.0) + optic_stream(down_at=1200.0)
    stream.append(Anomaly(700.0, "gpu", gpu(7, 0), "xid_last", 79.0, "xid", "XID 79"))
    a = IncidentEngine(TOPO)
    first = run(a, [f for f in stream if f.ts <= 800.0], until=800.0)
    assert first
    state = copy.deepcopy(a.state_dict())
    b = IncidentEngine(TOPO)
    b.load_state_dict(state)
    b.check_invariants()
    rest = [f for f in stream if f.ts > 800.0]
    out_a = run(a, rest, start=810.0, until=3000.0)
    out_b = run(b, rest, start=810.0, until=3000.0)
    assert out_a and out_a == out_b
    with pytest.raises(ValueError, match="shape"):
        IncidentEngine(TOPO).load_state_dict({**state, "telemetry": {**state["telemetry"], "s_gpu_tel": np.zeros((3, 7))}})


def test_a_restored_engine_finds_its_jobs_again_under_a_new_job_list():
    """A worker restarted with the job list in another order keeps the jobs' measured step times
    and its incidents' job consequences under the jobs' names, so it goes on exactly as the engine
    that never stopped: the next incident on job0 reads job0's 2.5x slowdown (before, the saved job
    slots were read against the new list, and job0 inherited job1's step time as its baseline)."""
    swapped = Topology.from_dict({**TOPO.to_dict(), "jobs": TOPO.to_dict()["jobs"][::-1]})
    assert swapped.jobs == ["job1", "job0"]

    def step_times(topo: Topology, start: float, until: float) -> dict[float, list[Frame]]:
        """job0 slows to 2.5x its step time once its GPU heads for throttling; job1 runs on."""
        slots = [topo.slot("job", "job0"), topo.slot("job", "job1")]
        return {float(t): [Frame("job", [float(t)] * 2, slots, {"step_time": [1.0 if t < 120 else 2.5, 2.0]})]
                for t in np.arange(start, until + 1, 10.0)}

    hot = gpu(0, 1)  # a GPU of job0
    stream = [thermal(float(t), hot) for t in range(0, 600, 60)]
    stream.append(Anomaly(130.0, "job", TOPO.slot("job", "job0"), "step_time", 3.0, "robust_zscore", "step time x2.5"))
    a = IncidentEngine(TOPO)
    first = run(a, stream, until=600.0, frames=step_times(TOPO, 0.0, 600.0))
    assert first and dict(first[-1].jobs) == {"job0": 2.5}
    b = IncidentEngine(swapped)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    b.check_invariants()
    later = [thermal(float(t), hot) for t in range(600, 900, 60)]
    later.append(Anomaly(700.0, "gpu", gpu(0, 2), "throttle_reasons", 8.0, "throttle_bits", "hw_slowdown"))
    out_a = run(a, later, start=610.0, until=2400.0, frames=step_times(TOPO, 610.0, 2400.0))
    out_b = run(b, later, start=610.0, until=2400.0, frames=step_times(swapped, 610.0, 2400.0))
    assert out_a and out_a == out_b
    assert dict(out_b[0].jobs) == {"job0": 2.5}


def test_a_job_rooted_incident_restored_under_a_new_job_list_is_not_told_again():
    """The root last told is found again by the job's name, as the root itself is: read raw, it
    named job0's old slot, which under the new list is job1's, so the restored engine took the
    root for changed and told the incident again with nothing new. No finding opens a job-rooted
    incident today (a job's slowdown joins others), so the checkpoint is built by hand from a GPU's."""
    a = IncidentEngine(TOPO)
    assert run(a, [thermal(float(t), gpu(0, 1)) for t in range(0, 600, 60)], until=600.0)
    state = copy.deepcopy(a.state_dict())
    [saved] = state["incidents"]
    job0 = key(JOB, TOPO.slot("job", "job0"))
    saved["members"] = [[job0, "job", TOPO.slot("job", "job0"), *saved["members"][0][3:]]]
    # (what it was told with, as a job's: the GPU's prediction now the job member's, named as the job)
    saved.update(family="job", root=job0, emitted_root=job0, emitted_keys=[job0], owned=[job0], root_kind="job",
                 emitted_spread=["job0"])
    swapped = Topology.from_dict({**TOPO.to_dict(), "jobs": TOPO.to_dict()["jobs"][::-1]})
    told = []
    for topo in (TOPO, swapped):
        engine = IncidentEngine(topo)
        engine.load_state_dict(copy.deepcopy(state))
        engine.check_invariants()
        told.append(run(engine, [], start=610.0, until=1500.0))
    assert told[1] == told[0] == []


def test_state_stays_bounded_over_many_incidents():
    engine = IncidentEngine(TOPO, keep_resolved=8, quiet_s=300.0)
    t = 0.0
    for k in range(200):  # one short GPU incident after another, each resolving
        g = k % len(TOPO.gpus)
        run(engine, [thermal(t, g), thermal(t + 60, g), thermal(t + 120, g, active=False)],
            start=t, until=t + 600.0, step=30.0)
        t += 600.0
    assert engine.stats["incidents"] >= 150
    assert len(engine._incidents) <= 8 + 2
    assert sum(len(d) for d in engine._index.values()) <= 10 * 6


def test_resolved_incidents_are_forgotten_once_they_cannot_reopen():
    engine = IncidentEngine(TOPO, keep_resolved=1000, quiet_s=300.0, reopen_s=900.0)
    t = 0.0
    for k in range(40):
        g = k % len(TOPO.gpus)
        run(engine, [thermal(t, g), thermal(t + 60, g), thermal(t + 120, g, active=False)],
            start=t, until=t + 600.0, step=30.0)
        t += 600.0
    # each resolves ~420 s after it starts and may reopen for 900 s: at most three are remembered
    assert engine.stats["incidents"] == 40
    assert len(engine._incidents) <= 3
    assert (engine.s_member_of[0] >= 0).sum() <= 3


def test_max_live_evicts_the_stalest():
    health = PipelineHealth()
    engine = IncidentEngine(TOPO, health, max_live=4)
    stream = [Anomaly(float(i), "gpu", gpu(i % NODES, i // NODES), "xid_last", 79.0, "xid", "XID 79") for i in range(12)]
    run(engine, stream, until=200.0)
    assert sum(1 for i in engine._incidents.values() if i.live) <= 4
    assert health.problems[("incidents", "too many live incidents: the stalest was resolved early")] >= 1


def test_an_evicted_incident_that_was_reported_is_reported_resolved():
    """Sinks keep an incident until they see it resolved (the Prometheus store, the console): one
    resolved early to make room must say so, or its gauges would show it open for ever."""
    engine = IncidentEngine(TOPO, max_live=2)
    xid = [Anomaly(float(10 * i), "gpu", gpu(i, 0), "xid_last", 79.0, "xid", "XID 79") for i in range(2)]
    opened = run(engine, xid, until=200.0)
    assert sorted(u.incident_id for u in opened if u.state == "open") == ["inc-1", "inc-2"]
    out = run(engine, [Anomaly(300.0, "gpu", gpu(5, 1), "xid_last", 79.0, "xid", "XID 79")], start=210.0, until=400.0)
    assert [u.incident_id for u in out if u.state == "resolved"] == ["inc-1"]  # the stalest
    assert engine.stats["evicted"] == 1


# ---- signals -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("finding", "signal"), [
    (Anomaly(0, "gpu", 0, "throttle_reasons", 1.0, "power", "HW power brake (0x80)"), "power_brake"),
    (Anomaly(0, "gpu", 0, "throttle_reasons", 4.0, "throttle_bits", "sw_power_cap"), "power_cap"),
    (Anomaly(0, "gpu", 0, "throttle_reasons", 32.0, "throttle_bits", "sw_thermal"), "thermal_observed"),
    (Anomaly(0, "gpu", 0, "throttle_reasons", 8.0 + 32.0, "throttle_bits", ""), "hw_slowdown_observed"),
    (Anomaly(0, "gpu", 0, "throttle_reasons", 0.3, "straggler", "throttled share"), "straggler"),
    (Anomaly(0, "gpu", 0, "gpu_temp", 0.3, "cooling", "R drifting"), "resistance_rising"),
    (Anomaly(0, "gpu", 0, "gpu_temp", 9.0, "straggler", "hotter than peers"), "hot_outlier"),
    (Anomaly(0, "gpu", 0, "gpu_temp", 9.0, "robust_zscore", "CUSUM"), "temperature_anomaly"),
    (Anomaly(0, "gpu", 0, "xid_last", 79.0, "xid", ""), "gpu_lost"),
    (Anomaly(0, "gpu", 0, "xid_last", 48.0, "xid", ""), "gpu_error"),
    (Anomaly(0, "link", 0, "link_flap", 3.0, "link_errors", ""), "link_down"),
    (Anomaly(0, "link", 0, "symbol_error_rate", 3.0, "link_errors", ""), "link_errors"),
    (Anomaly(0, "optic", 0, "prefec_ber", 3.0, "optics", ""), "optic_degrading"),
    (Anomaly(0, "rack", 0, "inlet_temp", 3.0, "cooling", ""), "inlet_rising"),
    (Anomaly(0, "job", 0, "step_time", 3.0, "x", ""), "job_slowdown"),
    (Anomaly(0, "gpu", 0, "util", 3.0, "x", ""), "generic"),
    (Prediction(0, "link", 0, "congestion", 0.0, 1.0, "congestion"), "congestion"),
    (Prediction(0, "gpu", 0, "something_new", 0.0, 1.0, "x"), "generic"),
])
def test_signal_table(finding, signal):
    assert classify(finding) == signal


def test_doctests():
    assert doctest.testmod(incidents_module).failed == 0


def test_no_float_infinity_in_json():
    """Incidents travel as JSON (JSONL sink, Kafka): every number must be finite."""
    engine = IncidentEngine(TOPO)
    out = run(engine, [Anomaly(0.0, "gpu", gpu(6, 3), "xid_last", 79.0, "xid", "XID 79")], until=120.0)
    from foreshock.findings import finding_to_json
    text = finding_to_json(out[-1])
    assert "Infinity" not in text and "NaN" not in text
    assert all(math.isfinite(x) for _, x in out[-1].jobs)


# ---- the engine's per-GPU telemetry kernel against a naive reference ----------------------------
def naive_track_gpu(tel, slot, ts, cols):
    """Each GPU's last row of the frame with finite time and temperature, in plain NumPy."""
    from foreshock import facts
    from foreshock.detectors import incident_impact as ii
    temp = cols["gpu_temp"]
    ok = np.isfinite(temp) & np.isfinite(ts)
    last = {}
    for r in np.flatnonzero(ok):
        last[int(slot[r])] = r
    for s, r in last.items():
        t, x = ts[r], temp[r]
        span = t - tel[s, ii.TEL_REF_TS]
        if not span < ii.SLOPE_BASELINE_S:
            if span > 0:
                tel[s, ii.TEL_SLOPE] = (x - tel[s, ii.TEL_REF_TEMP]) / span
            tel[s, ii.TEL_REF_TS], tel[s, ii.TEL_REF_TEMP] = t, x
        tel[s, ii.TEL_TS], tel[s, ii.TEL_TEMP] = t, x
        # its own limit: max operating, else slowdown less 2 (40-130 °C, else no reading); kept
        # through a sample with neither, 87 °C until one comes
        max_op, slowdown = cols["max_op_temp"][r], cols["slowdown_temp"][r]
        if 40.0 < max_op < 130.0:
            tel[s, ii.TEL_LIMIT] = max_op
        elif 40.0 < slowdown < 130.0:
            tel[s, ii.TEL_LIMIT] = slowdown - (facts.HW_SLOWDOWN_TEMP_C - facts.MAX_OPERATING_TEMP_C)
        elif np.isnan(tel[s, ii.TEL_LIMIT]):
            tel[s, ii.TEL_LIMIT] = facts.MAX_OPERATING_TEMP_C
        tel[s, ii.TEL_POWER_HEADROOM] = cols["power_limit"][r] - cols["power"][r]


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.0, 100.0, 400.0, math.nan, math.inf]),
                                   st.sampled_from([55.0, 61.0, 90.0, math.nan, -math.inf]),
                                   st.sampled_from([89.0, math.nan, 0.0]), st.sampled_from([300.0, math.nan]),
                                   st.sampled_from([83.0, math.nan, 0.0])),
                         max_size=12), min_size=1, max_size=4))
def test_gpu_telemetry_kernel_matches_reference(frames):
    from foreshock.detectors.incident_impact import Telemetry
    tel = Telemetry(6, 1, 1)
    ref = np.full((6, 7), np.nan)
    t0 = 0.0
    for rows in frames:
        t0 += 500.0
        slot = np.array([r[0] for r in rows], np.int32)
        ts = np.array([t0 + r[1] for r in rows])
        cols = {"gpu_temp": np.array([r[2] for r in rows]), "slowdown_temp": np.array([r[3] for r in rows]),
                "power": np.array([r[4] for r in rows]), "power_limit": np.full(len(rows), 700.0),
                "max_op_temp": np.array([r[5] for r in rows])}
        before = tel.gpu_frames_ts
        tel.observe(Frame("gpu", ts, slot, cols))
        naive_track_gpu(ref, slot, ts, cols)
        assert np.array_equal(tel.s_gpu_tel, ref, equal_nan=True)
        newest = max([before] + [t for t in ts if not math.isnan(t)]) if np.isfinite(ts).any() else before
        assert tel.gpu_frames_ts == newest


def test_a_gpus_limit_is_its_own_max_operating_temperature_kept_through_a_missing_sample():
    """The headroom an incident ranks exposed GPUs by is to the GPU's own max operating temperature
    (83 °C reported), else its slowdown less 2; a sample that reports neither keeps the last, and a
    T.Limit offset (0) is no reading — it made the limit -2 °C (until 2026-12-01)."""
    from foreshock.detectors import incident_impact as ii
    tel = ii.Telemetry(3, 1, 1)
    nan = math.nan
    for t, max_op, slowdown in ((10.0, 83.0, 89.0), (20.0, nan, nan), (30.0, 0.0, 0.0)):
        tel.observe(Frame("gpu", [t, t, t], [0, 1, 2], {
            "gpu_temp": [70.0, 70.0, 70.0], "max_op_temp": [max_op, nan, nan],
            "slowdown_temp": [slowdown, slowdown, 0.0]}))
        assert tel.s_gpu_tel[:, ii.TEL_LIMIT].tolist() == [83.0, 87.0, 87.0], t


# ---- found by the review of 2026-12-01 (each failed before its fix) -------------------------------
def test_a_rack_inlet_under_a_loop_incident_that_stopped_growing_does_not_crash_the_engine():
    """A new rack-inlet incident was merged into the live loop incident it sat under, and the
    engine then went on consolidating the merged-away one: ``KeyError`` out of ``observe``, which
    stopped the pipeline, and again at every restart from the checkpoint."""
    findings = [Prediction(980.0, "gpu", 17, "thermal_throttle", 300.0, 0.9, "thermal", "x"),
                Prediction(1100.0, "gpu", 26, "thermal_throttle", 300.0, 0.9, "thermal", "x"),
                Anomaly(1260.0, "gpu", 20, "thermal_throttle_time", 79.0, "d", "r"),
                Anomaly(2080.0, "rack", 2, "inlet_temp", 3.0, "cooling", "inlet")]
    engine = IncidentEngine(TOPO)
    out = run(engine, findings, until=2200.0, start=900.0)
    engine.check_invariants()
    assert len(by_id(out)) == 1  # the inlet joined the loop's incident
    assert "rack2" in " ".join(out[-1].members)


def test_an_incident_is_announced_resolved_once():
    """A member that joined in the step an incident went quiet (a routine power cap) left it
    marked as changed, and the next tick announced it resolved a second time."""
    findings = [Prediction(float(t), "gpu", g, "thermal_throttle", -1.0, 0.9, "thermal", "hot")
                for t in range(0, 300, 10) for g in (0, 1)]
    findings.append(Anomaly(1200.0, "gpu", 2, "power_limit", 3.0, "power", "power cap"))
    out = run(IncidentEngine(TOPO), findings, until=1300.0)
    assert [i.state for i in out if i.state == "resolved"] == ["resolved"]


@pytest.mark.parametrize("late", ["external event re-read", "finding hours late", "link finding hours late",
                                  "finding after the resolution, delivered late"])
def test_evidence_from_long_ago_opens_no_incident(late):
    """An external event read again (a feed rewritten in place, a redelivery) or a finding that
    arrives hours late opened an incident for a fault long over, announced open and then resolved
    a tick later; with the old incident still kept, it reopened it. It is counted instead."""
    health = PipelineHealth()
    engine = IncidentEngine(TOPO, health)
    event = ExternalEvent("node0", 1000.0, "fan_failure", "critical")
    engine.add_external([event])
    first = run(engine, [], until=6000.0, start=900.0)
    assert [i.state for i in first][0] == "open" and first[-1].state == "resolved"
    if late == "external event re-read":
        # the one taken before is known again; another as old, never taken, is too old
        engine.add_external([event, ExternalEvent("node0", 1001.0, "fan_failure", "critical")])
        again = run(engine, [], until=20100.0, start=20000.0)
        assert health.problems[("incidents", incidents_module.DUPLICATE_EXTERNAL)] == 1
    elif late == "finding hours late":
        again = run(engine, [Anomaly(1000.0, "gpu", 5, "xid_last", 48.0, "xid", "XID 48")],
                    until=20100.0, start=20000.0)
    elif late == "link finding hours late":  # (a link's own finding names it: another path)
        name = TOPO.links[link(0, 0)]
        again = run(engine, [Anomaly(1000.0, "link", link(0, 0), "link_downed", 1.0, "link_errors",
                                     f"fatal: link down on {name}")], until=20100.0, start=20000.0)
    else:  # dated after a GPU's incident resolved, an hour in coming: it reopened it, resolved again
        engine = IncidentEngine(TOPO, health)
        first = run(engine, [Anomaly(1000.0, "gpu", 5, "xid_last", 48.0, "xid", "XID 48")],
                    until=2500.0, start=900.0)
        assert first[-1].state == "resolved" and first[-1].ts < 3000.0
        again = run(engine, [Anomaly(3000.0, "gpu", 5, "xid_last", 48.0, "xid", "XID 48")],
                    until=7100.0, start=7000.0)
    assert again == []
    assert any("too old to open an incident" in what for _, what in health.problems)


def test_an_external_event_dated_far_ahead_is_refused_and_leaves_room_for_the_good_ones():
    """Events dated in milliseconds waited in the queue (and every checkpoint) for good; once it
    was full, every later event was dropped, a real fan failure among them."""
    health = PipelineHealth()
    engine = IncidentEngine(TOPO, health, max_external_queue=50)
    t = 100.0
    for k in range(200):  # (before any telemetry, as a replay loads its file, an event is taken)
        t = 100.0 + 60 * k
        engine.observe([], t)
        engine.add_external([ExternalEvent("node3", t * 1000.0, "psu_failure", "critical")])
    engine.add_external([ExternalEvent("node0", t + 60, "fan_failure", "critical")])
    out = run(engine, [], until=t + 260, start=t + 60)
    assert [i.root_entity for i in out] == ["node0"]
    assert engine.state_dict()["external"] == []
    assert health.problems[("incidents", "external event dated too far ahead of telemetry: refused")] == 200


def test_a_restored_engine_gives_each_entity_the_incident_that_held_it():
    """Ownership was rebuilt by replaying members in save order, so a resolved incident saved after
    the live loop incident took back a GPU the loop held; after the restart the loop listed its own
    member among the GPUs predicted next, and emitted other updates than an engine that never stopped."""
    findings = [Prediction(float(t), "gpu", g, "thermal_throttle", -1.0, 0.9, "thermal", "hot")
                for g in range(12) for t in range(100 * g, 3000, 30)]
    findings.append(Anomaly(100.0, "gpu", 12, "throttle_reasons", 1.0, "power", "power brake"))
    findings += [Prediction(float(t), "gpu", 12, "thermal_throttle", -1.0, 0.9, "thermal", "hot")
                 for t in range(1500, 3000, 30)]
    a = IncidentEngine(TOPO)
    run(a, [f for f in findings if f.ts <= 1600], until=1600.0)
    b = IncidentEngine(TOPO)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    b.check_invariants()
    for level in a.s_member_of:
        np.testing.assert_array_equal(b.s_member_of[level], a.s_member_of[level])
    rest = [f for f in findings if f.ts > 1600]
    assert run(b, rest, until=2200.0, start=1610.0) == run(a, rest, until=2200.0, start=1610.0)


def test_an_incident_keeps_a_bounded_number_of_external_event_types():
    """Reason strings from BMC SEL or the scheduler carry ids: every distinct one was kept for the
    incident's life, in every checkpoint and in its reason."""
    engine = IncidentEngine(TOPO)
    for k in range(500):
        engine.add_external([ExternalEvent("node0", 1000.0 + k, f"fan_failure sel#{k}", "critical")])
    run(engine, [], until=1600.0, start=900.0)
    (saved,) = engine.state_dict()["incidents"]
    assert len(saved["external_types"]) <= incidents_module.MAX_EXTERNAL_TYPES + 1
    assert sum(saved["external_types"].values()) == 500


@pytest.mark.parametrize("module", ["congestion", "cooling", "optics", "power", "straggler", "thermal_fit"])
def test_a_held_flag_is_said_again_before_its_incident_would_go_quiet(module):
    """The incident engine resolves an incident after quiet_s without findings. The cooling
    detector said a held flag again only every 1800 s, so a degraded loop or GPU left in service
    was announced resolved and opened again every half hour (a 72-hour simulation: dozens a day)."""
    import importlib
    import inspect

    params = importlib.import_module(f"foreshock.detectors.{module}").PARAMS
    quiet = inspect.signature(IncidentEngine).parameters["quiet_s"].default
    assert params["refresh_s"] < quiet


def test_a_cause_that_speaks_every_half_hour_keeps_one_incident_open_once_it_reopened():
    """A GPU left in service with a double-bit ECC error every 30 min had its incident announced
    resolved after each 15-min silence and open again at the next error: 9-12 times a day in a
    three-day simulation. Once reopened, an incident stays open through 1.5x the silence it showed."""
    errors = [Anomaly(float(t), "gpu", 5, "xid_last", 48.0, "xid", "XID 48") for t in range(1000, 6 * 3600, 1800)]
    out = run(IncidentEngine(TOPO), errors, until=6 * 3600 + 4000.0, start=900.0)
    states = [i.state for i in out]
    assert len(by_id(out)) == 1
    assert states.count("resolved") == 2  # after the first silence, and once the errors stop
    assert out[-1].state == "resolved" and out[-1].ts >= errors[-1].ts + 2700


def test_an_external_event_sent_again_is_one_event():
    """A feed file rewritten whole and renamed into place is read again from its start, and a
    Kafka record can be delivered twice: each repeat of an event had been taken as a new one and
    counted again in its incident (a fan failure reported once read as three)."""
    health = PipelineHealth()
    engine = IncidentEngine(TOPO, health)
    fan = ExternalEvent("node0", 1000.0, "fan_failure", "critical")
    engine.add_external([fan])
    first = run(engine, [], until=1300.0, start=900.0)
    assert [i.state for i in by_id(first)[first[0].incident_id]][-1] == "open"
    engine.add_external([fan])  # the file read again while the incident is open
    later = ExternalEvent("node0", 1310.0, "fan_failure", "critical")  # a second failure report: taken
    engine.add_external([later])
    out = run(engine, [], until=2600.0, start=1310.0)
    assert out[-1].state == "resolved"
    engine.add_external([fan, later])  # and again after it resolved
    again = run(engine, [], until=3000.0, start=2610.0)
    assert again == []
    (saved,) = engine.state_dict()["incidents"]
    assert sum(saved["external_types"].values()) == 2
    assert health.problems[("incidents", incidents_module.DUPLICATE_EXTERNAL)] == 3
    # a restored engine knows them too
    restored = IncidentEngine(TOPO, PipelineHealth())
    restored.load_state_dict(copy.deepcopy(engine.state_dict()))
    restored.add_external([later])
    assert restored.queued_external() == 0
    assert restored.health.problems[("incidents", incidents_module.DUPLICATE_EXTERNAL)] == 1


def test_external_events_remembered_are_forgotten_once_too_old_to_matter(monkeypatch):
    """The events taken are remembered to tell a repeat, but not for ever: those older than
    reopen_s before the latest telemetry are forgotten at each pruning, and at most
    max_external_queue are kept."""
    monkeypatch.setattr(incidents_module, "EXTERNAL_SEEN_PRUNE", 8)
    engine = IncidentEngine(TOPO, PipelineHealth(), reopen_s=3600.0, max_external_queue=100)
    for k in range(40):
        t = 1000.0 + 300.0 * k
        engine.observe([], t)
        engine.add_external([ExternalEvent(f"node{k % 4}", t, "fan_failure", "critical")])
    kept = engine.state_dict()["external_seen"]
    assert 12 <= len(kept) <= 2 * 13  # the last hour's 13 events, and those since the last pruning
    assert min(time for _, time, _, _ in kept) >= engine.latest_now - 3600.0 - 2 * 8 * 300.0
    small = IncidentEngine(TOPO, PipelineHealth(), max_external_queue=5)
    for k in range(40):  # no telemetry yet: nothing is too old, the earliest taken go
        small.add_external([ExternalEvent("node0", 1000.0 + k, "fan_failure", "critical")])
        small.observe([], 1000.0 + k)
    assert len(small.state_dict()["external_seen"]) <= 2 * 8
    assert [t for _, t, _, _ in small.state_dict()["external_seen"]][-1] == 1039.0
