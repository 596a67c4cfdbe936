"""A job's cost after a PSU's brake ended (audit /tmp/s63/audit_inc/): the engine takes the job's
measured step time only where it is newer than its members' last observed effect, and read that
moment from the member's last finding of any kind. Routine power-cap findings (symptoms, not
effects) arrive every few seconds on a derated node, so the measured x1.07 was thrown out whenever
one came just before the job's frame, and the incident fell back to the brake's x2.0 of minutes
before: told x2.0, x1.09, x2.0, x1.1, ... each swing past the step that tells it again."""

from __future__ import annotations

import numpy as np

from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Incident
from foreshock.frames import Frame

from test_incident_job_cost import BASE_S, FAULT_AT, TOPOLOGY

BRAKE_S = 90.0  # the brake holds this long, then the node runs power-capped at its derated limit
CAPPED = 1.07  # the job's pace under the cap


def _step_time(t: float) -> float:
    return BASE_S * (1.0 if t < FAULT_AT else 2.0 if t < FAULT_AT + BRAKE_S else CAPPED)


def test_a_jobs_cost_after_the_brake_is_what_its_step_time_measures() -> None:
    engine, told = IncidentEngine(TOPOLOGY), []
    for t in np.arange(0.0, FAULT_AT + 900.0, 1.0):  # (resolved quiet_s after the last brake)
        findings = []
        if t in (FAULT_AT, FAULT_AT + 60):  # HW power brake with HW slowdown (0x88) on the node's GPU 0
            findings.append(Anomaly(float(t), "gpu", 0, "throttle_reasons", 136.0, "throttle_bits", "brake"))
        elif FAULT_AT + BRAKE_S <= t and t % 5 == 0:  # its SW power cap (0x4), seen every few seconds
            findings.append(Anomaly(float(t), "gpu", 0, "power_throttle_time", 2.0, "robust_zscore", "cap"))
        # the cap's finding comes before the job's frame of the same second, as it may in a tick
        told += [f for f in engine.observe(findings, float(t)) if isinstance(f, Incident)]
        engine.observe_frame(Frame("job", np.array([t]), np.array([0], np.int32),
                                   {"step_time": np.array([_step_time(float(t))])}))
    after = [inc for inc in told if inc.ts >= FAULT_AT + BRAKE_S + 300 and inc.state != "resolved"]
    costs = [dict(inc.jobs).get("job0", 1.0) for inc in after]
    assert costs and all(abs(c - CAPPED) < 0.03 for c in costs), costs  # it had swung to x2.0 and back
    now = engine.incidents(FAULT_AT + 900.0)
    assert now and abs(dict(now[0].jobs)["job0"] - CAPPED) < 0.03
