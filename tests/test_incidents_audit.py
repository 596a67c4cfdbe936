"""Findings of an audit of the incident engine (2026-12-04), each reproduced first:

- a finding stamped far ahead of telemetry (a clock hours fast, a stamp in milliseconds) opened a
  pending incident that could be neither confirmed nor dropped until telemetry reached its stamp,
  and every later finding of its entity joined it, hidden: a real node-wide throttle never opened;
- a pending incident held through a gap in the stream longer than ``quiet_s`` was confirmed on
  stale evidence: announced open, and resolved at the next tick;
- a finding delivered a little late after its incident resolved (stamped before the resolving
  tick) opened a second incident for the same cause instead of reopening the first.
"""

from __future__ import annotations

from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Incident, Prediction
from foreshock.health import PipelineHealth
from foreshock.topology import Topology


def _topology() -> Topology:
    names = [f"node{i}" for i in range(4)]
    return Topology.from_dict({
        "cluster": "synth", "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
        "racks": [{"name": f"rack{r}", "row": "row0"} for r in range(2)],
        "nodes": [{"name": n, "rack": f"rack{i // 2}", "gpus": 8} for i, n in enumerate(names)],
        "jobs": [{"name": "job0", "nodes": names}]})


def _throttled(t: float, gpu: int, kind: str = "gpu", field: str = "thermal_throttle_time") -> Anomaly:
    return Anomaly(float(t), kind, gpu, field, 5.0, "throttle_bits")


def _incidents(found: list) -> list[tuple[float, str, str]]:
    return [(f.ts, f.incident_id, f.state) for f in found if isinstance(f, Incident)]


def test_a_finding_dated_far_ahead_of_telemetry_is_refused_and_hides_nothing() -> None:
    health = PipelineHealth()
    engine = IncidentEngine(_topology(), health=health)
    found = engine.observe([Prediction(1e6, "gpu", 0, "thermal_throttle", 600.0, 0.9, "thermal")], 0.0)
    for t in range(10, 700, 10):  # node0's first four GPUs throttle, observed
        found += engine.observe([_throttled(t, g) for g in range(4)], float(t))
    opened = [f for f in found if isinstance(f, Incident) and f.state == "open"]
    assert opened and opened[0].root_entity == "node0" and opened[0].ts <= 120.0
    assert health.problems[("incidents", "finding dated too far ahead of telemetry: refused")] == 1


def test_a_pending_incident_held_through_a_long_gap_is_dropped_not_announced() -> None:
    engine = IncidentEngine(_topology())
    found = engine.observe([_throttled(0.0, 2, kind="node", field="fan_speed")], 0.0)
    for now in (30.0, 2030.0, 2040.0):  # the stream's next frame comes 2000 s later
        found += engine.observe([], now)
    assert _incidents(found) == []


def test_a_finding_delivered_late_after_its_incident_resolved_reopens_it() -> None:
    runs = {}
    for late in (0.0, 15.0):
        engine = IncidentEngine(_topology())
        found = []
        for t in range(0, 200, 10):
            found += engine.observe([_throttled(t, 0)], float(t))
        t = 200
        while not any(state == "resolved" for _, _, state in _incidents(found)):
            found += engine.observe([], float(t))
            t += 10
        for now in range(t, t + 400, 10):  # the throttle comes back, its findings `late` s behind
            found += engine.observe([_throttled(now - late, 0)], float(now))
        runs[late] = [(inc, state) for _, inc, state in _incidents(found)]
    assert runs[15.0] == runs[0.0] == [("inc-1", "open"), ("inc-1", "stable"), ("inc-1", "resolved"),
                                       ("inc-1", "growing")]
