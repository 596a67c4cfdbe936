"""Findings of an audit of the incident engine (2026-12-04), each reproduced first:

- a finding stamped far ahead of telemetry (a clock hours fast, a stamp in milliseconds) opened a
  pending incident that could be neither confirmed nor dropped until telemetry reached its stamp,
  and every later finding of its entity joined it, hidden: a real node-wide throttle never opened;
- a pending incident held through a gap in the stream longer than ``quiet_s`` was confirmed on
  stale evidence: announced open, and resolved at the next tick;
- a finding delivered a little late after its incident resolved (stamped before the resolving
  tick) opened a second incident for the same cause instead of reopening the first.

A second audit (2026-12-04, of boards that move and of external events):

- the external events taken were forgotten an hour behind telemetry (past 4,096 remembered), so
  a feed read again whole (a file rewritten, renamed into place) counted an old event a second
  time in the live incident it had joined;
- the memberships of a board parked at a renumbering were not in the engine's state: after a
  worker's restart the board, read again, rejoined none of its incidents (a second one opened);
- events queued since the last frame and dated by the stream's end were counted at its flush as
  dated after it, never grouped.
"""

from __future__ import annotations

import pickle

import numpy as np

from foreshock.detectors.incident_external import ExternalEvent
from foreshock.detectors.incidents import DUPLICATE_EXTERNAL, FORGOTTEN_EXTERNAL, IncidentEngine
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


def _hot(t: float, gpu: int) -> Prediction:
    return Prediction(float(t), "gpu", gpu, "thermal_throttle", 1800.0, 0.9, "thermal", "hot")


def test_an_external_event_read_again_after_its_memory_is_pruned_is_not_counted_again() -> None:
    health = PipelineHealth()
    engine = IncidentEngine(_topology(), health=health)
    fan = ExternalEvent("node0", 100.0, "fan_failure", "critical")
    engine.add_external([fan])
    for t in range(0, 7200, 10):  # node0's GPUs heat for two hours: its incident stays open
        if t == 1000:
            engine.add_external([fan])  # within the hour: known again
        engine.observe([_hot(t, 0), _hot(t, 1)], float(t))
    # a busy feed: 4,100 other events in the last minutes, which prune what is remembered
    engine.add_external([ExternalEvent(f"node{1 + i % 3}", 7000.0 + i * 0.01, f"note{i}", "info")
                         for i in range(4100)])
    engine.observe([_hot(7200, 0)], 7200.0)
    (live,) = [inc for inc in engine._incidents.values()
               if inc.live and any(m.kind == "node" and m.slot == 0 for m in inc.members.values())]
    assert live.external_types == {"fan_failure (critical)": 1}
    engine.add_external([fan])  # the file read again whole
    engine.observe([_hot(7210, 0)], 7210.0)
    assert live.external_types == {"fan_failure (critical)": 1}
    assert health.problems[("incidents", DUPLICATE_EXTERNAL)] == 1
    assert health.problems[("incidents", FORGOTTEN_EXTERNAL)] == 1
    # and an event dated after what was forgotten is still taken
    engine.add_external([ExternalEvent("node0", 7100.0, "fan_failure", "critical")])
    engine.observe([_hot(7220, 0)], 7220.0)
    assert live.external_types == {"fan_failure (critical)": 2}
    # what was forgotten, and when it prunes next, survive a checkpoint
    restored = IncidentEngine(_topology(), health=PipelineHealth())
    restored.load_state_dict(pickle.loads(pickle.dumps(engine.state_dict())))
    assert restored._external_forgotten_to == engine._external_forgotten_to > 3000.0
    assert restored._external_prune_at == engine._external_prune_at


def test_a_board_parked_before_a_restart_rejoins_its_incident_when_read_again() -> None:
    """Board 4 of node0 is displaced at a renumbering (parked under its key), the worker restarts
    from a checkpoint, then the board is read again at slot 3: the restored engine takes it back
    into its incident as the engine that never stopped does (a second incident had opened)."""
    topology = _topology()
    engine = IncidentEngine(topology)
    for t in range(0, 300, 10):
        engine.observe([_hot(t, 4)], float(t))
    moved = np.full(topology.size("gpu"), -1)
    moved[4] = 5
    engine.follow_moves(moved, 300.0, parked=[(4, (0, 1004.0))])
    restored = IncidentEngine(topology)
    restored.load_state_dict(pickle.loads(pickle.dumps(engine.state_dict())))
    told = {}
    for name, e in (("kept", engine), ("restored", restored)):
        found = e.follow_moves(np.full(topology.size("gpu"), -1), 310.0, unparked=[(3, (0, 1004.0))])
        for t in range(320, 700, 10):
            found += e.observe([_hot(t, 3)], float(t))
        told[name] = [(f.incident_id, f.state, f.root_entity) for f in found if isinstance(f, Incident)]
    assert told["kept"] and told["restored"] == told["kept"]
    assert {inc for inc, _, _ in told["restored"]} == {"inc-1"}


def test_events_queued_since_the_last_frame_and_dated_by_the_end_are_grouped_at_the_flush() -> None:
    health = PipelineHealth()
    engine = IncidentEngine(_topology(), health=health)
    found = []
    for t in range(0, 3000, 10):
        found += engine.observe([], float(t))
    engine.add_external([ExternalEvent("node1", 2995.0, "fan_failure", "critical")])
    found += engine.flush(3000.0)
    assert not any("never grouped" in reason for _, reason in health.problems)
    (held,) = engine._incidents.values()  # (pending: a flush confirms nothing not yet held long enough)
    assert held.external_types == {"fan_failure (critical)": 1}
