"""Third review of the incident engine (r106): a hot GPU on the next node is not taken by a node's
incident, the external-event horizon survives a checkpoint, job impact stays linear in the number of
live incidents, and a leaf or a node losing its links is one incident."""

from __future__ import annotations

import math
import pickle
import re

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Incident, Prediction
from foreshock.frames import Frame
from foreshock.simulator.topology_gen import build_topology
from foreshock.topology import Topology

# one cooling loop, two racks of two nodes of 8 GPUs (the reviewer's cluster)
TOPO = Topology.from_dict({
    "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
    "racks": [{"name": "rack0", "row": "row0"}, {"name": "rack1", "row": "row0"}],
    "nodes": [{"name": f"n{i}", "rack": f"rack{i // 2}", "gpus": 8} for i in range(4)]})


def heating(ts: float, g: int, eta: float = 300.0) -> Prediction:
    return Prediction(ts, "gpu", g, "thermal_throttle", eta, 0.9, "thermal", "core heading for 90 °C")


def feed(engine: IncidentEngine, findings: list, until: float, step: float = 10.0) -> list[Incident]:
    """One ``observe`` per telemetry step, as the bank does; the incidents emitted."""
    findings = sorted(findings, key=lambda f: f.ts)
    out: list[Incident] = []
    i, t = 0, 0.0
    while t <= until:
        j = i
        while j < len(findings) and findings[j].ts <= t:
            j += 1
        out += [f for f in engine.observe(findings[i:j], t) if isinstance(f, Incident)]
        i, t = j, t + step
    return out


def latest(out: list[Incident]) -> dict[str, Incident]:
    """Each incident's latest update (merged-away ones left out)."""
    last = {u.incident_id: u for u in out}
    return {i: u for i, u in last.items() if not u.reason.startswith("merged into")}


def node_of(member: str) -> str:
    return member.split("/")[0]


def assert_node_incidents_hold_their_node_only(out: list[Incident]) -> None:
    for u in out:
        if u.root_kind == "node":
            assert {node_of(m) for m in u.members} == {u.root_entity}, (u.incident_id, u.members)
        # never more GPUs of a domain than it has
        for said, of in re.findall(r"(\d+) of (\d+) GPUs", u.reason):
            assert int(said) <= int(of), u.reason


# ---- R1: a join or a merge only where the root becomes the shared domain ------------------------
@settings(max_examples=40, deadline=None)
@given(outsider_node=st.sampled_from([1, 2, 3]), outsider_index=st.integers(0, 7),
       outsider_at=st.sampled_from([0.0, 10.0, 60.0, 300.0, 500.0]),
       fan_first=st.booleans(), onsets=st.permutations(range(8)), hot_outlier=st.booleans())
def test_a_hot_gpu_on_another_node_is_not_taken_by_a_nodes_fan_incident(outsider_node, outsider_index, outsider_at,
                                                                       fan_first, onsets, hot_outlier):
    """Node n0's fans fail (its node finding, then its 8 GPUs heating within a minute, in any
    order) while one GPU of another node runs hot on its own (a thermal interface): the straggler
    detector's hot outlier or a throttle prediction, at the same time or minutes later. Together
    they are enough GPUs on two nodes for the rack, but the node explains nearly all of it: the
    node's incident holds the node only, and the other GPU has an incident of its own, rooted at it."""
    outsider = TOPO.slot("gpu", f"n{outsider_node}/gpu{outsider_index}")
    fan = Anomaly(0.0 if fan_first else 20.0, "node", 0, "fan_speed", 5.0, "cooling", "fan slow")
    stream: list = [fan]
    for order, g in enumerate(onsets):
        stream += [heating(float(t), g) for t in range(10 + 5 * order, 900, 10)]
    if hot_outlier:
        stream += [Anomaly(outsider_at + t, "gpu", outsider, "gpu_temp", 5.0, "straggler", "hotter than job peers")
                   for t in range(0, 600, 60)]
    else:
        stream += [heating(outsider_at + t, outsider, eta=900.0) for t in range(0, 600, 10)]
    engine = IncidentEngine(TOPO)
    out = feed(engine, stream, until=1200.0)
    engine.check_invariants()
    assert_node_incidents_hold_their_node_only(out)
    incidents = latest(out)
    roots = sorted((u.root_kind, u.root_entity) for u in incidents.values())
    assert roots == sorted([("node", "n0"), ("gpu", TOPO.gpus[outsider])]), roots
    fans = next(u for u in incidents.values() if u.root_kind == "node")
    assert set(fans.members) == {"n0", *(f"n0/gpu{i}" for i in range(8))}
    assert "8 of 8 GPUs of n0" in fans.reason


def test_an_outsider_merged_while_the_rack_explained_most_leaves_when_the_root_narrows_to_a_node():
    """Two GPUs of n0 and one of n1 heating together rank at the rack and are merged; when n0's
    other GPUs follow, n0 explains nearly all of it and is the root: the n1 GPU leaves for an
    incident of its own, rooted at it (it stayed a member, and the reason said '9 of 8 GPUs of n0')."""
    outsider = TOPO.slot("gpu", "n1/gpu3")
    first = [heating(float(t), g) for g in (0, 1) for t in range(0, 900, 10)]
    hot = [heating(float(t), outsider) for t in range(0, 900, 10)]
    rest = [heating(float(t), g) for g in range(2, 8) for t in range(120, 900, 10)]
    engine = IncidentEngine(TOPO)
    out = feed(engine, first + hot + rest, until=900.0)
    engine.check_invariants()
    # the rack explained it at first (the case this is about) ...
    assert any(u.root_entity == "rack0" and "n1/gpu3" in u.members for u in out)
    # ... and n0 in the end, holding only its own GPUs; the n1 GPU is a cause of its own
    assert_node_incidents_hold_their_node_only(out)
    incidents = latest(out)
    roots = sorted((u.root_kind, u.root_entity) for u in incidents.values())
    assert roots == [("gpu", "n1/gpu3"), ("node", "n0")], roots
    assert any("8 of 8 GPUs of n0" in u.reason for u in incidents.values())


@settings(max_examples=30, deadline=None)
@given(onsets=st.permutations(range(32)), spread_s=st.sampled_from([60, 200, 400]), inlet=st.booleans())
def test_a_cdu_losing_capacity_is_still_one_incident_rooted_at_the_loop(onsets, spread_s, inlet):
    """Every GPU of the loop heats within ``spread_s`` in any order (the first ones may well be
    one node's or one rack's): one incident in the end, rooted at the loop, holding all of them."""
    stream: list = []
    for order, g in enumerate(onsets):
        start = 10.0 * round(order * spread_s / 320.0)
        stream += [heating(start + t, g) for t in range(0, 1200, 30)]
    if inlet:
        stream += [Anomaly(float(t), "rack", r, "inlet_temp", 4.0, "cooling", "inlet rising")
                   for r in (0, 1) for t in range(spread_s, 1200, 120)]
    engine = IncidentEngine(TOPO)
    out = feed(engine, stream, until=1400.0)
    engine.check_invariants()
    incidents = latest(out)
    assert len(incidents) == 1, [(u.incident_id, u.root_entity, u.members) for u in incidents.values()]
    u = next(iter(incidents.values()))
    assert (u.root_kind, u.root_entity) == ("cooling_loop", "cdu0")
    assert set(TOPO.gpus) <= set(u.members)


# ---- R6: the external-event horizon is in the checkpoint ------------------------------------------
def fan_alarm(ts: float):
    from foreshock.detectors.incident_external import ExternalEvent
    return ExternalEvent("n1", ts, "fan_failure", "critical")


def restored(engine: IncidentEngine, drop: tuple[str, ...] = ()) -> IncidentEngine:
    state = pickle.loads(pickle.dumps(engine.state_dict()))
    for k in drop:
        state.pop(k, None)
    twin = IncidentEngine(TOPO)
    twin.load_state_dict(state)
    return twin


@settings(max_examples=25, deadline=None)
@given(seen_until=st.integers(1, 30).map(lambda n: 10.0 * n), ahead=st.floats(0.0, 2 * 86400.0),
       old_checkpoint=st.booleans())
def test_a_restored_engine_refuses_the_external_events_the_saved_one_refuses(seen_until, ahead, old_checkpoint):
    """An event dated ``ahead`` past the telemetry: refused by both the engine and its restored
    copy, or queued by both, and what follows is the same. A checkpoint from before the horizon
    was saved learns it from the last tick (the copy took an event a day ahead, and opened an
    incident the original never had)."""
    from foreshock.findings import finding_to_json

    original = IncidentEngine(TOPO)
    for t in range(0, int(seen_until) + 10, 10):
        original.observe([], float(t))
    copy = restored(original, drop=("latest_now",) if old_checkpoint else ())
    event = [fan_alarm(seen_until + ahead)]
    original.add_external(event)
    copy.add_external(event)
    assert len(copy._external) == len(original._external)
    outs = []
    for engine in (original, copy):
        out = []
        for t in range(int(seen_until) + 10, int(seen_until + ahead) + 2000, 600):
            out += engine.observe([], float(t))
        outs.append([finding_to_json(f) for f in out])
    assert outs[0] == outs[1]


# ---- R4: job impact from one map of claims per tick, not every other incident per snapshot -------
def reference_job_impact(self: IncidentEngine, inc, members, now):  # type: ignore[no-untyped-def]
    """The job impact as it was computed before (each snapshot asked every other live incident for
    its job evidence): the reference the per-tick map must match, output for output."""
    from foreshock.detectors.incident_impact import job_impact
    from foreshock.detectors.incidents import PENDING

    evidence = self._job_evidence(inc, members, now)
    measured = {j for j, (_, _, seen) in evidence.items()
                if not math.isnan(self.tel.measured_slowdown(j, now, since=seen))}
    if measured:
        mine = {j: (max(evidence[j][:2]), -inc.serial) for j in measured}
        for other in self._incidents.values():
            if other is inc or not other.live or other.state == PENDING or other.merged_into >= 0:
                continue
            theirs = self._job_evidence(other, list(other.members.values()), now)
            taken = {j for j in measured & theirs.keys() if (max(theirs[j][:2]), -other.serial) > mine[j]}
            self.claims_taken = getattr(self, "claims_taken", 0) + len(taken)
            measured -= taken
    return job_impact(self.dom, self.tel, evidence, measured, now)


class ReferenceEngine(IncidentEngine):
    _job_impact = reference_job_impact


STORM_TOPO = build_topology(128, seed=3)


def storm(seed: int) -> tuple[list, dict[float, list[Frame]]]:
    """A random hour on 128 GPUs: links down, GPUs heating (some predictions withdrawn), power
    brakes, GPUs off the bus, stragglers and slow steps, with every job's step time measured
    (its slowdown drifting), so that several incidents claim the same jobs."""
    rng = np.random.default_rng(seed)
    topo = STORM_TOPO
    nic = np.flatnonzero(topo.link_gpu >= 0)
    n_gpus, n_jobs = len(topo.gpus), len(topo.jobs)
    findings: list = []
    for _ in range(int(rng.integers(5, 40))):
        t0 = float(rng.integers(0, 300)) * 10.0
        span = range(int(t0), int(t0) + int(rng.integers(1, 60)) * 10, 10)
        what = rng.integers(0, 6)
        g = int(rng.integers(n_gpus))
        if what == 0:
            lk = int(rng.choice(nic))
            findings += [Anomaly(float(t), "link", lk, "link_downed", 1.0, "link_errors", "down") for t in span]
        elif what == 1:
            gs = rng.choice(n_gpus, size=int(rng.integers(1, 10)), replace=False) if rng.random() < 0.5 else [g]
            findings += [heating(float(t), int(x), eta=float(rng.integers(0, 900))) for x in gs for t in span]
            if rng.random() < 0.3:
                findings.append(Prediction(float(span[-1] + 10), "gpu", int(gs[0]), "thermal_throttle", 0.0, 0.9,
                                           "thermal", "withdrawn", False))
        elif what == 2:
            node = int(topo.gpu_node[g])
            gs = np.flatnonzero(topo.gpu_node == node)[: int(rng.integers(1, 9))]
            findings += [Anomaly(float(t), "gpu", int(x), "throttle_reasons", 1.0, "power", "power brake")
                         for x in gs for t in span]
        elif what == 3:
            findings += [Anomaly(float(t), "gpu", g, "missing", 1.0, "reporting", "off the bus") for t in span[:3]]
        elif what == 4:
            findings += [Anomaly(float(t), "gpu", g, "step_share", 3.0, "straggler", "lagging") for t in span]
        else:
            j = int(rng.integers(n_jobs))
            findings += [Anomaly(float(t), "job", j, "step_time", 4.0, "robust_zscore", "slow") for t in span]
    frames: dict[float, list[Frame]] = {}
    pace = np.ones(n_jobs)
    for t in range(0, 4000, 10):
        if t >= 600:
            pace = np.clip(pace * rng.uniform(0.95, 1.08, n_jobs), 1.0, 5.0)
        frames[float(t)] = [Frame("job", np.full(n_jobs, float(t)), np.arange(n_jobs, dtype=np.int32),
                                  {"step_time": pace.copy()})]
    return sorted(findings, key=lambda f: f.ts), frames


def replay(engine: IncidentEngine, findings: list, frames: dict[float, list[Frame]], until: float) -> list[str]:
    from foreshock.findings import finding_to_json

    out, i, t = [], 0, 0.0
    while t <= until:
        j = i
        while j < len(findings) and findings[j].ts <= t:
            j += 1
        for fr in frames.get(t, []):
            engine.observe_frame(fr)
        out += [finding_to_json(f) for f in engine.observe(findings[i:j], t)]
        if t in (1000.0, 2500.0):  # a checkpoint round trip on the way
            engine.load_state_dict(pickle.loads(pickle.dumps(engine.state_dict())))
        i, t = j, t + 10.0
    out += [finding_to_json(f) for f in engine.incidents(until)]
    return out


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_job_impact_from_the_per_tick_claims_matches_asking_every_incident(seed):
    findings, frames = storm(seed)
    engine = IncidentEngine(STORM_TOPO)
    fast = replay(engine, findings, frames, until=4000.0)
    engine.check_invariants()
    slow = replay(ReferenceEngine(STORM_TOPO), findings, frames, until=4000.0)
    assert fast == slow


def test_the_random_storm_has_incidents_contending_for_measured_jobs():
    """The comparison above means something: in these storms other incidents do take jobs'
    measured slowdowns from the incident being told (the part the per-tick map replaces)."""
    taken = 0
    for seed in range(6):
        engine = ReferenceEngine(STORM_TOPO)
        findings, frames = storm(seed)
        replay(engine, findings, frames, until=4000.0)
        taken += getattr(engine, "claims_taken", 0)
    assert taken > 0


# ---- R5: a leaf or a node losing most of its links is one incident, rooted there -----------------
FABRIC_TOPO = build_topology(64, seed=7)


def ports_of_leaf(leaf: int) -> list[int]:
    t = FABRIC_TOPO
    return [i for i in range(len(t.links)) if t.link_a_switch[i] == leaf or t.link_b_switch[i] == leaf]


def nic_links_of_node(node: int) -> list[int]:
    t = FABRIC_TOPO
    return [i for i in range(len(t.links)) if t.link_gpu[i] >= 0 and t.gpu_node[t.link_gpu[i]] == node]


def links_down(links: list[int], onsets: list[float], until: float) -> list:
    return [Anomaly(float(t), "link", lk, "link_downed", 1.0, "link_errors", "link down")
            for lk, start in zip(links, onsets) for t in range(int(start), int(until), 10)]


LEAVES = [s for s, n in enumerate(FABRIC_TOPO.switches) if "leaf" in n]


@settings(max_examples=25, deadline=None)
@given(leaf=st.sampled_from(LEAVES), data=st.data())
def test_a_leaf_losing_its_ports_is_one_incident_rooted_at_the_leaf(leaf, data):
    """Every port of a leaf goes down within a minute, in any order (the switch reboots or dies):
    one incident, rooted at the leaf, holding its links (there was one incident per link)."""
    ports = data.draw(st.permutations(ports_of_leaf(leaf)))
    onsets = sorted(data.draw(st.lists(st.integers(0, 6).map(lambda n: 10.0 * n), min_size=len(ports),
                                       max_size=len(ports))))
    engine = IncidentEngine(FABRIC_TOPO)
    out = feed(engine, links_down(ports, onsets, 600.0), until=600.0)
    engine.check_invariants()
    incidents = latest(out)
    assert [(u.root_kind, u.root_entity) for u in incidents.values()] == [("leaf", FABRIC_TOPO.switches[leaf])]
    u = next(iter(incidents.values()))
    assert set(u.members) == {FABRIC_TOPO.links[i] for i in ports}
    assert u.fault_hint == "leaf_failure" and f"{len(ports)} of {len(ports)} links" in u.reason


@settings(max_examples=15, deadline=None)
@given(node=st.integers(0, len(FABRIC_TOPO.nodes) - 1), data=st.data())
def test_a_node_losing_its_nic_links_is_one_incident_rooted_at_the_node(node, data):
    links = data.draw(st.permutations(nic_links_of_node(node)))
    engine = IncidentEngine(FABRIC_TOPO)
    out = feed(engine, links_down(links, [0.0] * len(links), 600.0), until=600.0)
    incidents = latest(out)
    assert [(u.root_kind, u.root_entity) for u in incidents.values()] == [("node", FABRIC_TOPO.nodes[node])]
    assert set(next(iter(incidents.values())).members) == {FABRIC_TOPO.links[i] for i in links}


@settings(max_examples=30, deadline=None)
@given(on_a_leaf=st.booleans(), leaf=st.sampled_from(LEAVES), node=st.integers(0, len(FABRIC_TOPO.nodes) - 1),
       gap=st.sampled_from([0.0, 60.0, 300.0, 900.0]), data=st.data())
def test_a_minority_of_a_leafs_or_nodes_links_failing_stays_one_incident_per_link(on_a_leaf, leaf, node, gap, data):
    """Links of one leaf (or node) failing on their own (minutes apart, or even together, as long
    as they are not most of its links) are causes of their own: one incident each, at its link."""
    ports = ports_of_leaf(leaf) if on_a_leaf else nic_links_of_node(node)
    k = data.draw(st.integers(2, len(ports) // 2))
    failing = data.draw(st.permutations(ports))[:k]
    engine = IncidentEngine(FABRIC_TOPO)
    out = feed(engine, links_down(failing, [i * gap for i in range(k)], k * gap + 900.0), until=k * gap + 900.0)
    incidents = latest(out)
    assert sorted((u.root_kind, u.root_entity) for u in incidents.values()) == \
        sorted(("link", FABRIC_TOPO.links[i]) for i in failing)


def test_telling_n_incidents_asks_for_job_evidence_a_number_of_times_linear_in_n():
    """40 links down at once, on jobs whose step times are measured: the tick that tells the 40
    incidents asked each for every other's job evidence (40 x 40; 1,000 links took 10 s a tick
    on 8,192 GPUs); now once per incident told, and once more per incident for the tick's map."""
    topo = STORM_TOPO
    n_jobs = len(topo.jobs)
    nic = np.flatnonzero(topo.link_gpu >= 0)
    down = [int(x) for x in nic[np.linspace(0, len(nic) - 1, 40).astype(int)]]
    engine = IncidentEngine(topo)
    calls = [0]
    evidence = engine._job_evidence

    def counted(*args):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return evidence(*args)

    engine._job_evidence = counted  # type: ignore[method-assign]
    told = []
    for t in range(0, 500, 10):
        pace = 1.0 if t < 300 else 1.3
        engine.observe_frame(Frame("job", np.full(n_jobs, float(t)), np.arange(n_jobs, dtype=np.int32),
                                   {"step_time": np.full(n_jobs, pace)}))
        calls[0] = 0
        out = engine.observe([Anomaly(float(t), "link", lk, "link_downed", 1.0, "link_errors", "down")
                              for lk in down] if t >= 300 else [], float(t))
        if len(out) >= len(down):
            told.append(calls[0])
    assert told, "the 40 incidents were never told together"
    assert max(told) <= 2 * len(down) + 1
