"""Incident engine audit 2 (2026-12-05): an incident's job-cost check time survives a checkpoint, and
a withdrawn prediction stops costing its job at once."""

from __future__ import annotations

import pickle

from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Finding, Incident, Prediction
from test_incidents_audit import _topology as topology  # four 8-GPU nodes, two racks, one loop, one job


def told(engine: IncidentEngine, findings: list[Finding], t: float) -> list[tuple]:
    return [(f.ts, f.incident_id, f.state, f.jobs) for f in engine.observe(findings, t) if isinstance(f, Incident)]


def test_a_restored_engine_tells_job_cost_updates_when_the_uninterrupted_one_does() -> None:
    """node1's fans fail (x1.0); node1/gpu0 throttles (x1.15) until t=50, so once that is older than
    quiet_s (120 s) the job's cost falls to x1.0 and an update is told. The time its job cost was
    last checked was not saved: restored, the engine checked at its next tick and told the update
    at another time (12 of 32 restore points differed)."""
    def frame(t: float) -> list[Finding]:
        fs: list[Finding] = [Anomaly(t, "node", 1, "fan_speed", 5.0, "zscore", "fans stalled")]
        if t <= 50:
            fs.append(Anomaly(t, "gpu", 8, "thermal_throttle_time", 5.0, "throttle_bits"))
        return fs

    def run(restore_at: float | None = None) -> list[tuple]:
        engine, out = IncidentEngine(topology(), quiet_s=120.0), []
        for t in range(0, 400, 5):
            if t == restore_at:
                saved = pickle.loads(pickle.dumps(engine.state_dict()))
                engine = IncidentEngine(topology(), quiet_s=120.0)
                engine.load_state_dict(saved)
            out += told(engine, frame(float(t)), float(t))
        return out

    uninterrupted = run()
    assert any(jobs == (("job0", 1.0),) for _, _, _, jobs in uninterrupted[1:])  # the update is there
    for restore_at in range(100, 260, 5):
        assert run(float(restore_at)) == uninterrupted, restore_at


def test_a_withdrawn_prediction_stops_costing_its_job() -> None:
    """node1's fans fail; node1/gpu0 is predicted to throttle at t=0 (x1.15 foretold) and the
    prediction is withdrawn at t=100: the job is back at x1.0, told within a tick or two, not
    quiet_s (900 s) later (the withdrawal moved the member's last time, and its predicted signal
    counted as shown)."""
    engine = IncidentEngine(topology())
    updates = []
    for t in range(0, 400, 10):
        fs: list[Finding] = [Anomaly(float(t), "node", 1, "fan_speed", 5.0, "zscore", "fans stalled")]
        if t == 0:
            fs.append(Prediction(0.0, "gpu", 8, "thermal_throttle", 600.0, 0.9, "thermal"))
        if t == 100:
            fs.append(Prediction(100.0, "gpu", 8, "thermal_throttle", 600.0, 0.9, "thermal", active=False))
        updates += told(engine, fs, float(t))
    assert [inc.jobs for inc in engine.incidents(390.0)] == [(("job0", 1.0),)]
    back = [ts for ts, _, _, jobs in updates if jobs == (("job0", 1.0),)]
    assert back and back[0] <= 160.0
