"""An incident is told again when an entity it had not named comes to head its predicted spread
(2026-12-05): before, an update came only with members joining or leaving, a new root, the move to
stable or its jobs' cost moving, so a stable incident whose spread turned to other GPUs kept telling
the ones it named first (a simulated day: a node's incident, stable, went from naming nothing to
five of its GPUs predicted to throttle, and no update said so; it resolved 32 minutes later).

Topology (tests/test_incidents.py): two loops of two racks of two nodes of 4 GPUs."""

from __future__ import annotations

import pickle

import numpy as np

from foreshock.detectors.incidents import SPREAD_HEAD, IncidentEngine
from foreshock.findings import Anomaly, Incident
from foreshock.frames import Frame

from test_incidents import TOPO, run, thermal

LOOP0 = np.arange(16, dtype=np.int32)  # node0-3's GPUs
HOT_AT = 1500.0  # node2/gpu0 (slot 8) runs 86 °C from here, against 87 °C: the least headroom on the loop


def frames(until: float, hot_at: float = HOT_AT, cool_at: float = np.inf) -> dict[float, list[Frame]]:
    """Loop-0 GPUs warm at different margins (slot 15 the hottest), all heating at 0.01 °C/s, and
    slot 8 jumping to 86 °C between ``hot_at`` and ``cool_at``."""
    out = {}
    for t in range(0, int(until) + 1, 10):
        temp = 50.0 + LOOP0.astype(float) + 0.001 * t
        if hot_at <= t < cool_at:
            temp[8] = 86.0
        out[float(t)] = [Frame("gpu", np.full(16, float(t)), LOOP0, {"gpu_temp": temp,
                                                                   "slowdown_temp": np.full(16, 89.0)})]
    return out


def stream(until: float) -> list:
    """cdu0's racks warm at 430 s; GPUs 0 and 5 predicted to throttle every minute (its members)."""
    out: list = [Anomaly(430.0, "rack", r, "inlet_temp", 3.0, "cooling", "inlet") for r in (0, 1)]
    out += [thermal(float(t), g, eta=3000.0) for g in (0, 5) for t in range(400, int(until), 60)]
    return out


def names(inc: Incident) -> list[str]:
    return [n for n, _ in inc.predicted_members]


def loop_updates(until: float, **kw: float) -> list[Incident]:
    engine = IncidentEngine(TOPO, max_predicted=SPREAD_HEAD)
    return [u for u in run(engine, stream(until), until=until, frames=frames(until, **kw))
            if u.root_entity == "cdu0"]


def test_a_stable_incident_is_told_again_when_an_entity_it_had_not_named_heads_its_spread() -> None:
    out = loop_updates(2400.0)
    before = [u for u in out if u.ts < HOT_AT]
    assert before[-1].state == "stable"  # nothing joined for stable_s: no update owed for members
    assert "node2/gpu0" not in names(before[-1])
    assert names(before[-1])[-1] == "node3/gpu3"  # the exposed GPU with the least headroom then
    after = [u for u in out if HOT_AT <= u.ts]
    # told within one update interval (30 s), in the state it had, with the new GPU named
    assert after and after[0].ts <= HOT_AT + 30.0, [(u.ts, names(u)) for u in out]
    assert after[0].state == "stable"
    assert "node2/gpu0" in names(after[0])
    assert after[0].members == before[-1].members
    # and once only: nothing new heads the list afterwards (the ETAs move every sample)
    assert len(after) == 1, [(u.ts, names(u)) for u in after]


def test_a_name_leaving_the_spread_is_not_told_and_one_told_before_coming_back_is_not_told_twice() -> None:
    # node2/gpu0 runs hot only for five minutes: the spread names it (told), then turns back to
    # node3/gpu3, which the update naming node2/gpu0 did not name: told again, once
    out = loop_updates(2700.0, cool_at=HOT_AT + 300.0)
    after = [u for u in out if HOT_AT <= u.ts]
    assert [("node2/gpu0" in names(u), "node3/gpu3" in names(u)) for u in after] == [(True, False), (False, True)]
    assert after[1].ts <= HOT_AT + 300.0 + 30.0
    # and without the cool-down, a run as long tells it only once (test above): the ETA wobbles
    # of the GPUs it already named tell nothing
    assert len(loop_updates(2700.0)) == len([u for u in loop_updates(2700.0) if u.ts < HOT_AT]) + 1


def test_what_the_spread_was_told_with_survives_a_checkpoint() -> None:
    until = 2400.0
    whole = IncidentEngine(TOPO, max_predicted=SPREAD_HEAD)
    want = [u for u in run(whole, stream(until), until=until, frames=frames(until)) if u.ts >= 1200.0]
    first = IncidentEngine(TOPO, max_predicted=SPREAD_HEAD)
    run(first, [f for f in stream(until) if f.ts < 1200.0], until=1190.0, frames=frames(until))
    second = IncidentEngine(TOPO, max_predicted=SPREAD_HEAD)
    second.load_state_dict(pickle.loads(pickle.dumps(first.state_dict())))
    got = run(second, [f for f in stream(until) if f.ts >= 1200.0], until=until, start=1200.0, frames=frames(until))
    assert [(u.ts, u.state, names(u)) for u in got] == [(u.ts, u.state, names(u)) for u in want]
    assert any(u.ts >= HOT_AT and "node2/gpu0" in names(u) for u in got)


def test_a_checkpoint_from_before_the_spread_was_saved_tells_it_only_with_another_change() -> None:
    # no record of what was named: telling the spread at once would repeat the update for every
    # incident a restored worker holds; the next update for another reason records it
    until = 2400.0
    first = IncidentEngine(TOPO, max_predicted=SPREAD_HEAD)
    run(first, [f for f in stream(until) if f.ts < 1200.0], until=1190.0, frames=frames(until))
    state = first.state_dict()
    for inc in state["incidents"]:
        del inc["emitted_spread"]
    second = IncidentEngine(TOPO, max_predicted=SPREAD_HEAD)
    second.load_state_dict(state)
    got = run(second, [f for f in stream(until) if f.ts >= 1200.0], until=until, start=1200.0, frames=frames(until))
    assert not [u for u in got if u.root_entity == "cdu0" and u.ts >= HOT_AT]


def test_a_name_heading_the_spread_only_as_its_prediction_falls_due_is_not_told() -> None:
    # GPUs 8-10 (node2) predicted at 400 s with 60 s to go: due (ETA 0) from 460 s; node0/gpu1 with
    # 700 s: due from 1100 s. Due predictions tie at ETA 0 and sort by name, so node0/gpu1, beyond a
    # list of three when the incident was told stable, heads it once due: not news (a review found
    # a loop's loss told every 30 s so, seeds 11 and 23)
    engine = IncidentEngine(TOPO, max_predicted=SPREAD_HEAD)
    stream: list = [Anomaly(430.0, "rack", r, "inlet_temp", 3.0, "cooling", "inlet") for r in (0, 1)]
    stream += [thermal(400.0, g, eta=60.0) for g in (8, 9, 10)] + [thermal(400.0, 1, eta=700.0)]
    out = [u for u in run(engine, stream, until=1600.0) if u.root_entity == "cdu0"]
    told_stable = [u for u in out if u.state == "stable"]
    assert told_stable and told_stable[0].ts < 1100.0
    assert "node0/gpu1" not in names(told_stable[0])
    # (until node2's predictions expire at 1360 s, ETA plus quiet_s: the list then turns to GPUs
    # exposed, and is told)
    assert not [u for u in out if 1100.0 <= u.ts < 1360.0], [(u.ts, u.state, names(u)) for u in out]


def test_a_job_slowdown_moving_by_the_step_is_told_whatever_the_float_reads(monkeypatch) -> None:
    # x1.05 told, x1.15 now: 1.15 - 1.05 reads 0.0999999... in floats, under JOB_SLOWDOWN_STEP (0.1);
    # the review of 2026-12-05 found such a move untold (seed 23, job7)
    engine = IncidentEngine(TOPO)
    run(engine, [thermal(float(t), 1) for t in range(0, 600, 60)], until=600.0)
    (inc,) = engine._incidents.values()
    inc.emitted_jobs = {"job0": 1.05}
    inc.emitted_spread = frozenset(n for n, _ in engine._spread(inc, list(inc.members.values()), 700.0))
    monkeypatch.setattr(engine, "_job_impact", lambda inc, members, now: ((("job0", 1.15),), 0.0))
    assert engine._told_moved(inc, 700.0)
    monkeypatch.setattr(engine, "_job_impact", lambda inc, members, now: ((("job0", 1.14),), 0.0))
    inc.jobs_checked_ts = -np.inf
    assert not engine._told_moved(inc, 700.0)
