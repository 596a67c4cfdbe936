"""Fabric findings of an audit of the incident engine (2026-12-04), each reproduced first:

- a flapping link's incident told its first re-fire and none after: the member's re-fire of a
  burst long over counted as "already counted in this re-fire";
- congestion naming a link whose incident had resolved (a link still down reports ``link_downed``
  once) opened a second incident rooted at the congested link, hinted a link failure, instead of
  reopening the named link's.
"""

from __future__ import annotations

from test_incidents import TOPO, link, run

from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Prediction


def _down(t: float, lk: int) -> Anomaly:
    return Anomaly(float(t), "link", lk, "link_downed", 1.0, "link_errors", f"fatal: link down on {TOPO.links[lk]}")


def test_a_flapping_link_is_told_firing_again_at_every_flap() -> None:
    flapping = link(2, 1)
    findings = [_down(t, flapping) for t in (0, 1200, 2400, 3600)]  # each down > coherence_s after the last
    findings.append(Anomaly(2400.0, "link", flapping, "link_flaps", 3.0, "link_errors",
                            f"flapping: {TOPO.links[flapping]} down 3 times in 12 h"))
    out = run(IncidentEngine(TOPO), findings, until=4500.0)
    refires = [i.ts for i in out if i.state == "growing" and "fired again" in i.reason]
    assert refires == [1200.0, 2400.0, 3600.0]
    assert {i.incident_id for i in out} == {"inc-1"}


def test_congestion_naming_a_link_whose_incident_resolved_reopens_it() -> None:
    failed, sibling = link(0, 0), link(0, 1)

    def congested(t: float) -> Prediction:
        return Prediction(float(t), "link", sibling, "congestion", 0.0, 1.0, "congestion",
                          f"congestion on {TOPO.links[sibling]} (x); one hot port; likely cause: traffic rerouted "
                          f"from {TOPO.links[failed]}, which went down 5 s ago")

    out = run(IncidentEngine(TOPO), [_down(100, failed)] + [congested(t) for t in range(1200, 1600, 30)], until=1600.0)
    assert {i.incident_id for i in out} == {"inc-1"}
    assert [i.state for i in out] == ["open", "stable", "resolved", "growing"]
    reopened = out[-1]
    assert reopened.root_entity == TOPO.links[failed] and set(reopened.members) == {TOPO.links[failed],
                                                                                   TOPO.links[sibling]}


def test_a_congested_link_failing_itself_is_a_cause_of_its_own() -> None:
    """Link M goes down; its traffic congests sibling L (congestion naming M). Minutes later L fails
    itself — its optic predicted to take it down, or symbol errors. That joined M's incident (L was
    a member, congested) and moved its root onto L's optic, or onto L: the on-call person was sent
    to the wrong link, and L's fault had no incident. Now M's incident keeps its root and its
    congestion, and L's fault opens its own."""
    failed, sibling = link(0, 0), link(0, 1)

    def congested(t: float) -> Prediction:
        return Prediction(float(t), "link", sibling, "congestion", 0.0, 1.0, "congestion",
                          f"congestion on {TOPO.links[sibling]} (x); one hot port; likely cause: traffic rerouted "
                          f"from {TOPO.links[failed]}, which went down 5 s ago")

    own_faults = {
        "optic": [Prediction(float(t), "link", sibling, "link_down", 20000.0 - t, 0.8, "optics",
                             f"{TOPO.links[sibling]}#b: pre-FEC BER 1e-6 reaches the FEC limit in 5.0 h")
                  for t in range(700, 2000, 60)],
        "errors": [Anomaly(float(t), "link", sibling, "symbol_error", 2.0, "link_errors",
                           f"fatal: symbol errors on {TOPO.links[sibling]}") for t in range(700, 2000, 60)],
    }
    for name, faults in own_faults.items():
        out = run(IncidentEngine(TOPO), [_down(100, failed)] + [congested(t) for t in range(105, 2000, 30)] + faults,
                  until=2000.0)
        first = [i for i in out if i.incident_id == "inc-1"]
        assert {i.root_entity for i in first} == {TOPO.links[failed]}, name
        second = [i for i in out if i.incident_id == "inc-2"]
        assert second and second[0].root_entity.startswith(TOPO.links[sibling]), name
        assert {i.incident_id for i in out} == {"inc-1", "inc-2"}, name
