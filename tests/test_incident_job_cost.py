"""What an incident says a job pays (its step slowdown, GPU-hours at risk) against a helper's audit
(2026-12-05, repros in /tmp/audit_spread/): the job's baseline step time learnt 1 % a sample, so it
followed any slowdown building over a couple of minutes (a job 30 % slow read x1.00); and an
incident was told again only when its members, root or state changed, so a job's cost that moved
after it settled stood untold for hours (an optic's incident told x1.04 while the job ran x1.19)."""

from __future__ import annotations

import numpy as np

from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Incident
from foreshock.frames import Frame
from foreshock.topology import Topology

TOPOLOGY = Topology.from_dict({
    "rows": [{"name": "row0", "cooling_loop": "cdu0"}], "racks": [{"name": "rack0", "row": "row0"}],
    "nodes": [{"name": f"n{i}", "rack": "rack0", "gpus": 4} for i in range(2)],
    "jobs": [{"name": "job0", "nodes": ["n0", "n1"]}]})
BASE_S = 4.0  # the job's step time before the fault
FAULT_AT = 3600.0


def _run(step_time: object, until: float) -> tuple[IncidentEngine, list[Incident]]:
    """The job's step time each second (``step_time(t)``, as the simulator writes them) and, from 300 s
    after FAULT_AT, its GPU 0 throttled by the SW thermal limiter every 10 s."""
    engine, told = IncidentEngine(TOPOLOGY), []
    for t in np.arange(0.0, until, 1.0):
        engine.observe_frame(Frame("job", np.array([t]), np.array([0], np.int32),
                                   {"step_time": np.array([step_time(t)])}))  # type: ignore[operator]
        found = ([Anomaly(float(t), "gpu", 0, "throttle_reasons", 32.0, "throttle_bits", "sw_thermal")]
                 if t >= FAULT_AT + 300 and t % 10 == 0 else [])
        told += [f for f in engine.observe(found, float(t)) if isinstance(f, Incident)]
    return engine, told


def test_a_slowdown_building_over_minutes_is_measured_against_the_pace_before_it() -> None:
    def ramp(t: float) -> float:  # 30 % slower over ten minutes
        return BASE_S * (1.0 + 0.3 * min(max((t - FAULT_AT) / 600.0, 0.0), 1.0))

    engine, told = _run(ramp, FAULT_AT + 1200.0)
    assert told and told[-1].state == "stable"
    assert abs(dict(told[-1].jobs)["job0"] - 1.3) < 0.01  # it had read x1.002, its baseline 5.2 s
    now = engine.incidents(FAULT_AT + 1200.0)[0]
    assert abs(dict(now.jobs)["job0"] - 1.3) < 0.01 and now.gpu_hours_at_risk_per_hour > 1.8


def test_a_jobs_cost_that_moves_after_the_incident_settled_is_told() -> None:
    def later_worse(t: float) -> float:  # x1.04 from the fault, x1.19 from 25 minutes after it
        return BASE_S * (1.0 if t < FAULT_AT else 1.04 if t < FAULT_AT + 1500 else 1.19)

    _, told = _run(later_worse, FAULT_AT + 2400.0)
    stable = next(i for i, inc in enumerate(told) if inc.state == "stable")
    assert dict(told[stable].jobs)["job0"] < 1.06
    after = [inc for inc in told[stable + 1:] if inc.ts >= FAULT_AT + 1500]
    assert after and after[0].state == "stable" and after[0].ts <= FAULT_AT + 1500 + 60
    assert dict(after[0].jobs)["job0"] > 1.15  # told once, within the update interval and a tick
    assert len(after) == 1
