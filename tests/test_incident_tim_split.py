"""A GPU's failing thermal interface outlives the node fan failure it was folded into (audit of
2026-12-05, /tmp/s63/audit_inc/sc/timfan.yaml): node5's fans failed at +900 s and were repaired at
+2100 s while node5/gpu3's thermal interface went on degrading. Its findings, the only strong ones
left, held the fan incident open to the end of the run, an hour after the repair ("8 of 8 GPUs of
node5 heating together: node fans or airflow", its job's cost told there), and no incident ever
named the thermal interface. Once the rest of the incident has shown nothing for ``quiet_s``, the
fan incident resolves and the GPU still heating is an incident of its own, rooted at that GPU."""

from __future__ import annotations

import pickle

from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Finding, Incident
from foreshock.topology import Topology

TOPOLOGY = Topology.from_dict({
    "rows": [{"name": "row0", "cooling_loop": "cdu0"}], "racks": [{"name": "rack0", "row": "row0"}],
    "nodes": [{"name": f"n{i}", "rack": "rack0", "gpus": 4} for i in range(2)],
    "jobs": [{"name": "job0", "nodes": ["n0", "n1"]}]})
FANS_FAIL, FANS_REPAIRED, END = 600.0, 1800.0, 5400.0
TIM_GPU = 2  # n0/gpu2, whose thermal interface degrades from the start and is never repaired


def _findings(t: float, fans_repaired_at: float) -> list[Finding]:
    """What the detectors say at ``t``, every 300 s as the cooling and straggler detectors repeat: the
    node's stopped fan and all its GPUs running hot while the fans are out, and the degrading GPU's
    thermal resistance all along (throttling from 3000 s)."""
    out: list[Finding] = []
    if t % 300 == 0 and FANS_FAIL <= t < fans_repaired_at:
        out.append(Anomaly(t, "node", 0, "fan_speed", 1.0, "cooling", "a chassis fan of n0 reads 0%: stopped"))
        out += [Anomaly(t + 20, "gpu", g, "gpu_temp", 11.0, "straggler", "temperature over its job's peers")
                for g in range(4)]
    if t % 300 == 0 and t >= FANS_FAIL:
        out.append(Anomaly(t + 20, "gpu", TIM_GPU, "gpu_temp", 1.4, "cooling", "thermal resistance rising"))
    if t % 60 == 0 and t >= 3000:
        out.append(Anomaly(t, "gpu", TIM_GPU, "throttle_reasons", 32.0, "throttle_bits", "sw_thermal"))
    return out


def _run(engine: IncidentEngine, start: float, until: float, fans_repaired_at: float) -> list[Incident]:
    told: list[Incident] = []
    pending: list[Finding] = []
    for t in range(int(start), int(until), 10):
        pending += _findings(float(t), fans_repaired_at)
        due = [f for f in pending if f.ts <= t]  # (the GPUs' findings come a frame or two later)
        pending = [f for f in pending if f.ts > t]
        told += [f for f in engine.observe(due, float(t)) if isinstance(f, Incident)]
        engine.check_invariants()  # (the split keeps the member and domain indexes whole)
    return told


def _latest(told: list[Incident]) -> dict[str, Incident]:
    return {inc.incident_id: inc for inc in told}


def test_a_thermal_interface_that_outlives_the_fans_repair_is_an_incident_of_its_own() -> None:
    told = _run(IncidentEngine(TOPOLOGY), 0.0, END, FANS_REPAIRED)
    # while the fans are out the GPU is one of the node's, heating with the rest of it
    during = [inc for inc in told if inc.ts < FANS_REPAIRED]
    assert during and {(inc.incident_id, inc.root_entity, inc.fault_hint) for inc in during} == {
        ("inc-1", "n0", "fan_failure")}
    assert "n0/gpu2" in during[-1].members

    latest = _latest(told)
    fans = [inc for inc in latest.values() if inc.root_entity == "n0"]
    tim = [inc for inc in latest.values() if inc.root_entity == "n0/gpu2"]
    # the fan incident resolves once its own members have shown nothing for quiet_s (900 s), not an
    # hour later on the GPU's findings: until 2026-12-05 it was still live at the end of the run
    assert len(fans) == 1 and fans[0].state == "resolved" and fans[0].fault_hint == "fan_failure"
    resolved_at = next(inc.ts for inc in told if inc.incident_id == fans[0].incident_id and inc.state == "resolved")
    assert resolved_at <= FANS_REPAIRED + 900 + 600
    assert "n0/gpu2" not in fans[0].members
    # and the GPU still heating is told as its own cause, its thermal interface, live to the end
    assert len(tim) == 1 and tim[0].state != "resolved" and tim[0].fault_hint == "tim_degradation"
    assert tim[0].root_kind == "gpu" and tim[0].members == ("n0/gpu2",)
    assert tim[0].incident_id != fans[0].incident_id


def test_a_gpu_still_heating_with_its_failing_fans_stays_in_their_incident() -> None:
    # the fans never repaired: the node's GPUs keep showing it, and the GPU heating most is the fans'
    told = _run(IncidentEngine(TOPOLOGY), 0.0, END, END)
    latest = _latest(told)
    assert len(latest) == 1
    (inc,) = latest.values()
    assert inc.root_entity == "n0" and inc.fault_hint == "fan_failure" and inc.state != "resolved"
    assert "n0/gpu2" in inc.members


def test_the_split_comes_the_same_after_a_checkpoint_restore() -> None:
    whole = _run(IncidentEngine(TOPOLOGY), 0.0, END, FANS_REPAIRED)
    engine = IncidentEngine(TOPOLOGY)
    first = _run(engine, 0.0, 2500.0, FANS_REPAIRED)
    restored = IncidentEngine(TOPOLOGY)
    restored.load_state_dict(pickle.loads(pickle.dumps(engine.state_dict())))
    rest = _run(restored, 2500.0, END, FANS_REPAIRED)

    def said(told: list[Incident]) -> list[tuple[object, ...]]:
        return [(i.ts, i.incident_id, i.state, i.root_entity, i.members) for i in told]

    assert said(first + rest) == said(whole)


def test_a_node_incident_reopened_by_a_cause_that_speaks_seldom_keeps_its_hottest_gpu() -> None:
    """(review of 2d0c49b, /tmp/s63/review/split/) Fans never repaired, their node's findings every
    1,200 s: the incident resolves after quiet_s, reopens, and takes a quiet time of its own, longer
    than the engine's. The split judged "the rest went quiet" by the engine's 900 s, so the node's
    hottest GPU, throttling every minute, was split off as an invented thermal interface while the
    fan incident went on growing without it. Judged by the incident's own quiet time it stays."""
    every = 1200

    def findings(t: float) -> list[Finding]:
        out: list[Finding] = []
        if t % every == 0 and t >= FANS_FAIL:
            out.append(Anomaly(t, "node", 0, "fan_speed", 1.0, "cooling", "a chassis fan of n0 reads 0%: stopped"))
            out += [Anomaly(t + 20, "gpu", g, "gpu_temp", 11.0, "straggler", "temperature over its job's peers")
                    for g in range(4)]
        if t % 60 == 0 and t >= 3000:
            out.append(Anomaly(t, "gpu", TIM_GPU, "throttle_reasons", 32.0, "throttle_bits", "sw_thermal"))
        return out

    engine, told, pending = IncidentEngine(TOPOLOGY), [], []
    for t in range(0, 9000, 10):
        pending += findings(float(t))
        due = [f for f in pending if f.ts <= t]
        pending = [f for f in pending if f.ts > t]
        told += [f for f in engine.observe(due, float(t)) if isinstance(f, Incident)]
    assert {(inc.incident_id, inc.root_entity, inc.fault_hint) for inc in told} == {("inc-1", "n0", "fan_failure")}
    assert "n0/gpu2" in told[-1].members
