"""The incident engine, cases found in review (h44): withdrawals, entities that move between
incidents, the evidence a rack needs, the predicted spread, and a checkpoint's round trip.

Same cluster and helpers as ``test_incidents.py``: two loops of two racks, two nodes of 4 GPUs
per rack, a leaf per rail; job0 on the nodes of cdu0, job1 on those of cdu1."""

from __future__ import annotations

import json

from foreshock.detectors.incident_external import ExternalEvent
from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Incident, Prediction

from test_incidents import TOPO, by_id, gpu, link, run, thermal


def power_cap(ts: float, g: int, active: bool = True) -> Prediction:
    return Prediction(ts, "gpu", g, "power_cap", 60.0, 0.8, "power", "power draw at the cap", active)


def resolved_at(updates: list[Incident]) -> float:
    ends = [u.ts for u in updates if u.state == "resolved"]
    assert ends, [(u.ts, u.state) for u in updates]
    return ends[0]


def test_a_symptoms_withdrawal_does_not_keep_a_finished_incident_open():
    """A routine power cap predicted and withdrawn every two minutes under full load: said, it
    does not keep the fan incident open; withdrawn, it did, for as long as it flapped."""
    quiet = 900.0
    s = [thermal(float(t), g) for g in (gpu(4, 0), gpu(4, 1)) for t in range(0, 600, 60)]
    s += [thermal(600.0, g, active=False) for g in (gpu(4, 0), gpu(4, 1))]
    for t in range(700, 8000, 120):
        s += [power_cap(float(t), gpu(4, 0)), power_cap(float(t + 60), gpu(4, 0), active=False)]
    out = run(IncidentEngine(TOPO, quiet_s=quiet), s, until=8000.0)
    assert len(by_id(out)) == 1
    # the cause went quiet with its withdrawal at 600: resolved one quiet time later, caps or not
    assert resolved_at(out) <= 600.0 + quiet + 10.0


def test_a_prediction_of_an_entity_that_moved_on_is_withdrawn_where_it_went():
    """A GPU of a fan incident falls off the bus (a new cause: an XID 79 incident takes it), then
    the thermal predictions of both GPUs are withdrawn. The fan incident kept the moved GPU's
    prediction (its withdrawal went to the XID incident, which never held it): open until the
    hour-long ETA ran out, and naming the GPU among its next, twice."""
    quiet, eta = 900.0, 3600.0
    hot = [gpu(4, 0), gpu(4, 1)]
    s: list = [thermal(float(t), g, eta=eta) for g in hot for t in range(0, 600, 60)]
    s.append(Anomaly(600.0, "gpu", hot[0], "xid_last", 79.0, "xid", "XID 79"))
    s += [thermal(620.0, g, eta=eta, active=False) for g in hot]
    out = run(IncidentEngine(TOPO, quiet_s=quiet), s, until=6000.0)
    incidents = by_id(out)
    assert len(incidents) == 2
    fan = next(v for v in incidents.values() if v[0].root_kind == "node")
    lost = next(v for v in incidents.values() if v[0].fault_hint == "xid79")
    assert resolved_at(fan) <= 620.0 + quiet + 10.0
    moved = TOPO.gpus[hot[0]]
    for u in fan:
        names = [n for n, _ in u.predicted_members]
        assert len(names) == len(set(names)), u.predicted_members
        if u.ts >= 600.0:
            assert moved not in names, u.predicted_members
    # the withdrawal of a prediction it never held is not the XID incident's finding
    assert all(u.findings == 1 for u in lost)


def test_the_predicted_spread_names_no_member_as_exposed():
    """Members show the cause already: only the member's own pending prediction may name it,
    with its ETA, not the list of exposed entities that show nothing yet (ETA unknown)."""
    hot = [gpu(4, 0), gpu(4, 1)]
    s: list = [thermal(float(t), g, eta=3600.0) for g in hot for t in range(0, 600, 60)]
    s.append(Anomaly(600.0, "gpu", hot[0], "xid_last", 79.0, "xid", "XID 79"))
    out = run(IncidentEngine(TOPO), s, until=900.0)
    fan = next(v for v in by_id(out).values() if v[0].root_kind == "node")
    for u in fan:
        exposed = {n for n, e in u.predicted_members if e == -1.0}
        assert not exposed & set(u.members), u


def test_a_lone_prediction_withdrawn_before_the_hold_time_is_no_incident():
    engine = IncidentEngine(TOPO, hold_s=60.0)
    out = run(engine, [thermal(0.0, gpu(4, 0)), thermal(20.0, gpu(4, 0), active=False)], until=3000.0)
    assert out == []
    assert engine.stats["unconfirmed"] == 1
    # said twice before it was withdrawn, it is two findings: announced, as it always was
    said_twice = [thermal(0.0, gpu(4, 0)), thermal(10.0, gpu(4, 0)), thermal(20.0, gpu(4, 0), active=False)]
    assert run(IncidentEngine(TOPO, hold_s=60.0), said_twice, until=3000.0)


def test_one_nodes_finding_and_a_gpu_on_another_node_are_not_the_racks():
    """A GPU heating on node4 and a fan failing on node5 (both in rack2) are two causes; so are an
    XID 79 on node4 and a BMC's XID alert for node5. One node-level finding is not rack-level
    evidence (SUPPORT: three GPUs on two nodes, or a rack-level finding)."""
    tim = [thermal(float(t), gpu(4, 0), eta=2000.0) for t in range(0, 900, 60)]
    fans = [Anomaly(float(t), "node", 5, "fan_speed", 3.0, "cooling", "fan 2 slow") for t in range(60, 900, 60)]
    out = run(IncidentEngine(TOPO), tim + fans, until=900.0)
    roots = sorted((v[-1].root_kind, v[-1].root_entity) for v in by_id(out).values())
    assert roots == [("gpu", "node4/gpu0"), ("node", "node5")]

    engine = IncidentEngine(TOPO)
    engine.add_external([ExternalEvent("node5", 100.0, "xid 79 gpu fell off the bus", "critical")])
    out = run(engine, [Anomaly(50.0, "gpu", gpu(4, 0), "xid_last", 79.0, "xid", "XID 79")], until=600.0)
    assert "rack" not in {v[-1].root_kind for v in by_id(out).values()}

    # node-level findings on both nodes of the rack are the rack's
    fans4 = [Anomaly(f.ts, "node", 4, "fan_speed", 3.0, "cooling", "fan 1 slow") for f in fans]
    out = run(IncidentEngine(TOPO), fans + fans4, until=900.0)
    assert [(v[-1].root_kind, v[-1].root_entity) for v in by_id(out).values()] == [("rack", "rack2")]


def test_an_optics_trend_is_not_taken_by_a_thermal_incident_of_its_node():
    """The optic of node4's rail-0 link trends toward failure while node4's fans fail: the trend
    is not the fans' doing. Taken by their incident, it was missing when the link-down prediction
    naming the optic opened the fabric incident, which then blamed the link, not the optic."""
    lk = link(4, 0)
    optic = 2 * lk
    name = TOPO.name("optic", optic)

    def stream(fan: bool) -> list:
        s: list = [Anomaly(float(t), "optic", optic, "rx_power", 3.0, "optics", "rx power falling")
                   for t in range(100, 1200, 60)]
        s += [Prediction(float(t), "link", lk, "link_down", 3600.0, 0.9, "optics", f"optic {name} will fail")
              for t in (600, 660)]
        if fan:
            s += [Anomaly(float(t), "node", 4, "fan_speed", 3.0, "cooling", "fan slow") for t in range(0, 1200, 60)]
        return s

    def fabric(out: list[Incident]) -> Incident:
        return next(v[-1] for v in by_id(out).values() if v[-1].root_kind in ("optic", "link"))

    alone = fabric(run(IncidentEngine(TOPO), stream(False), until=900.0))
    out = run(IncidentEngine(TOPO), stream(True), until=900.0)
    both = fabric(out)
    assert (both.root_kind, both.root_entity, both.fault_hint) == (alone.root_kind, alone.root_entity, alone.fault_hint)
    assert both.root_entity == name
    fan = next(v[-1] for v in by_id(out).values() if v[-1].root_kind == "node")
    assert name not in fan.members


def test_a_checkpoint_round_trip_credits_a_jobs_finding_to_the_same_incident():
    """Two live incidents touch job1, heard from at the same time; the job's step-time finding goes
    to one of them. A restored engine rebuilt its domain index in another order and, breaking
    the tie by that order, credited the other: its future output differed."""
    up = TOPO.links.index("leaf0~spine0")
    nic = link(4, 0)  # node4/gpu0~leaf0: job1
    upname = TOPO.links[up]
    first = [
        Anomaly(0.0, "link", up, "link_downed", 1.0, "link_errors", f"link down on {upname}"),
        Anomaly(10.0, "link", up, "link_downed", 1.0, "link_errors", f"link down on {upname}"),
        Anomaly(20.0, "gpu", gpu(5, 1), "xid_last", 48.0, "xid", "XID 48"),
        Anomaly(30.0, "link", nic, "xmit_wait", 3.0, "congestion", f"traffic of {upname}"),
    ]
    later = [
        Anomaly(200.0, "gpu", gpu(5, 1), "xid_last", 48.0, "xid", "XID 48"),
        Anomaly(200.0, "link", nic, "xmit_wait", 3.0, "congestion", f"traffic of {upname}"),
        Anomaly(210.0, "job", 1, "step_time", 3.0, "robust_zscore", "step time x1.5"),
    ]
    a = IncidentEngine(TOPO)
    run(a, first, until=100.0)
    assert len(a.incidents()) == 2
    b = IncidentEngine(TOPO)
    b.load_state_dict(json.loads(json.dumps(a.state_dict(), default=lambda x: x.tolist())))
    b.check_invariants()
    out_a = run(a, later, start=110.0, until=2000.0)
    out_b = run(b, later, start=110.0, until=2000.0)
    assert out_a and out_a == out_b


def test_absorbing_members_it_already_lists_does_not_make_a_stable_incident_stable_again():
    """A stable loop incident takes back a GPU that had left it for an incident of its own: the
    merge added nothing, yet it flipped to growing without telling anyone and, stable_s later,
    announced 'stable' again, word for word."""
    s: list = [Anomaly(30.0, "rack", r, "inlet_temp", 3.0, "cooling", "inlet +3 °C") for r in (0, 1)]
    for g in range(16):  # cdu0
        end = 3500 if g >= 8 else 800  # rack1's GPUs keep heading for throttling
        s += [thermal(float(t), g) for t in range(20 + 10 * g, end, 60)]
        s.append(thermal(float(end), g, active=False))
    # much later one GPU of the loop heats again on its own (an incident of its own), then rack1's
    # inlet is flagged again, which brings that incident back into the loop's
    s += [thermal(float(t), gpu(0, 0)) for t in range(2000, 2400, 60)]
    s.append(Anomaly(2100.0, "rack", 1, "inlet_temp", 3.0, "cooling", "inlet +3 °C"))
    out = run(IncidentEngine(TOPO, stable_s=600.0, quiet_s=900.0), s, until=4000.0)
    merged = [u for u in out if u.state == "resolved" and u.reason.startswith("merged into")]
    assert merged, "the case is real: the GPU's incident was merged back"
    for updates in by_id(out).values():
        said = [(u.state, u.root_entity, u.members, u.reason) for u in updates]
        assert all(x != y for x, y in zip(said, said[1:])), said


def test_an_expired_prediction_is_not_listed_as_due():
    """A member's prediction never withdrawn, whose ETA plus quiet_s has passed, no longer keeps
    the incident open; nor is it listed among the predicted members, due now, for as long as the
    incident lives (here kept open by another GPU of the node)."""
    quiet = 900.0
    s = [thermal(0.0, gpu(4, 0), eta=60.0), thermal(30.0, gpu(4, 0), eta=60.0)]
    s += [thermal(float(t), gpu(4, 1), eta=900.0) for t in range(0, 6000, 60)]
    engine = IncidentEngine(TOPO, stable_s=600.0, quiet_s=quiet)
    out = run(engine, s, until=6000.0)
    gone = TOPO.gpus[gpu(4, 0)]
    early = [u for u in out if u.ts <= 30.0 + 60.0 + quiet]
    assert any(n == gone for u in early for n, _ in u.predicted_members)  # listed while it counted
    assert gone not in dict(engine.incidents(6000.0)[0].predicted_members)


def test_two_detectors_predicting_one_event_on_one_gpu_each_withdraw_their_own():
    """The thermal model and a threshold baseline both predict throttling on one GPU; the
    baseline withdraws its (the temperature fell back under its level). The model's prediction,
    an hour ahead, still holds: it kept the incident open and the GPU among its next. Keyed by
    event alone, the baseline's withdrawal removed the model's too."""
    quiet, eta = 900.0, 3600.0
    g = gpu(4, 0)

    def threshold(ts: float, active: bool = True) -> Prediction:
        return Prediction(ts, "gpu", g, "thermal_throttle", 0.0, 1.0, "threshold", "core over 85 °C", active)

    s = [thermal(0.0, g, eta=eta), threshold(5.0), thermal(30.0, g, eta=eta), threshold(35.0), threshold(60.0, False)]
    out = run(IncidentEngine(TOPO, quiet_s=quiet), s, until=6000.0)
    assert len(by_id(out)) == 1
    assert resolved_at(out) >= 30.0 + eta  # held by the model's prediction
    live = [u for u in out if u.state != "resolved" and u.ts > 60.0]
    assert live and all(TOPO.gpus[g] in dict(u.predicted_members) for u in live)
    # each withdrawn: nothing holds it past one quiet time
    out = run(IncidentEngine(TOPO, quiet_s=quiet), s + [thermal(100.0, g, eta=eta, active=False)], until=6000.0)
    assert resolved_at(out) <= 100.0 + quiet + 10.0


def test_a_checkpoint_from_before_predictions_were_kept_per_detector_still_loads():
    """A state saved when a member's predictions were ``{event: [ts, eta]}``: restored, the
    prediction still holds the incident, and any detector's withdrawal of the event withdraws it."""
    quiet, eta = 900.0, 3600.0
    g = gpu(4, 0)
    a = IncidentEngine(TOPO, quiet_s=quiet)
    run(a, [thermal(0.0, g, eta=eta), thermal(30.0, g, eta=eta)], until=100.0)
    state = json.loads(json.dumps(a.state_dict(), default=lambda x: x.tolist()))
    for d in state["incidents"]:
        for m in d["members"]:
            m[8] = {event: [ts, e] for event, _, ts, e in m[8]}
    assert any(m[8] for d in state["incidents"] for m in d["members"])

    held = IncidentEngine(TOPO, quiet_s=quiet)
    held.load_state_dict(state)
    held.check_invariants()
    out = run(held, [], start=110.0, until=3000.0)
    assert not [u for u in out if u.state == "resolved"]  # the hour-long prediction still holds it

    withdrawn = IncidentEngine(TOPO, quiet_s=quiet)
    withdrawn.load_state_dict(state)
    out = run(withdrawn, [thermal(200.0, g, eta=eta, active=False)], start=110.0, until=3000.0)
    assert resolved_at(out) <= 200.0 + quiet + 10.0



def test_a_nodes_fan_alone_is_not_said_as_heat_per_watt():
    """A BMC's fan reading is the only evidence (a Redfish-only watch, no GPU telemetry): the
    incident said the node "runs hot per watt against its rack", a comparison nothing made (an
    audit, 2026-12-06). Its words name both findings the node's signal stands for."""
    fans = [Anomaly(float(t), "node", 5, "fan_speed", 0.9, "cooling", "a chassis fan of node5 reads 10% of full "
                    "speed: stopped") for t in range(60, 900, 60)]
    (updates,) = by_id(run(IncidentEngine(TOPO), fans, until=900.0)).values()
    assert updates[-1].root_entity == "node5"
    assert updates[-1].reason.startswith("node5's airflow: a chassis fan slowed or stopped")
    assert "runs hot per watt" not in updates[-1].reason
