"""Incidents do not depend on the order findings arrive in (audit /tmp/audit_inc2/, 2026-12-05).

A rack's or node's finding (its inlet rising, its fans, its PSU) that came after finer incidents
under it had opened (a GPU braking or heating, a node's fans) opened an incident of its own beside
them, where the same frame listed coarse-first gave one incident: one cause as two or three. Live,
the coarse signal often comes later (a rack's inlet rises after its dies). Independent faults under
the same rack (an XID, a thermal interface failing long before the inlet rose) stay apart."""

from __future__ import annotations

import itertools

from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Finding, Incident
from test_incidents_audit import _topology as topology  # four 8-GPU nodes, two racks, one loop, one job

# slots in that topology: node n holds GPUs 8n..8n+7; racks hold nodes 0-1 and 2-3
INLET_RACK1 = ("inlet(rack1)", lambda t: Anomaly(t, "rack", 1, "inlet_temp", 5.0, "zscore"))
FANS_NODE2 = ("fans(node2)", lambda t: Anomaly(t, "node", 2, "fan_speed", 5.0, "zscore"))
HOT_NODE3_GPU0 = ("throttle(node3/gpu0)", lambda t: Anomaly(t, "gpu", 24, "thermal_throttle_time", 5.0,
                                                            "throttle_bits"))
PSU_NODE0 = ("psu(node0)", lambda t: Anomaly(t, "node", 0, "psu_power", 5.0, "zscore"))
BRAKE_NODE0_GPU6 = ("brake(node0/gpu6)", lambda t: Anomaly(t, "gpu", 6, "throttle_reasons", 1.0, "power"))
XID_NODE3_GPU1 = ("xid(node3/gpu1)", lambda t: Anomaly(t, "gpu", 25, "xid", 48.0, "xid"))

# what the coarse-first order gives, written out: the rack's coolant explains the fans and the hot
# GPU under it; node0's PSU explains its GPU's brake (another family, another rack: its own incident)
RACK1 = ("rack", "rack1", "rack_cooling", ("node2", "node3/gpu0", "rack1"))
PSU0 = ("node", "node0", "psu_failure", ("node0", "node0/gpu6"))


def grouping(engine: IncidentEngine, now: float) -> list[tuple]:
    return sorted((i.root_kind, i.root_entity, i.fault_hint, tuple(sorted(i.members))) for i in engine.incidents(now))


def run(frames: dict[str, float], end: float = 300.0, step: int = 10) -> tuple[IncidentEngine, list[Incident]]:
    """Each finding (label -> the time it starts) repeated every ``step`` s, in the dict's order."""
    makers = dict([INLET_RACK1, FANS_NODE2, HOT_NODE3_GPU0, PSU_NODE0, BRAKE_NODE0_GPU6, XID_NODE3_GPU1])
    engine, told = IncidentEngine(topology()), []
    for t in range(int(min(frames.values())), int(end), step):
        fs: list[Finding] = [makers[k](float(t)) for k, start in frames.items() if t >= start]
        told += [f for f in engine.observe(fs, float(t)) if isinstance(f, Incident)]
    engine.check_invariants()  # merges keep the membership and domain indexes whole
    return engine, told


def test_every_order_of_one_frame_gives_the_coarse_first_grouping() -> None:
    """All 120 orders of five findings in each frame: the old code gave the coarse-first grouping
    for some orders only (fans and the hot GPU before the inlet: three thermal incidents; the brake
    before the PSU: two power incidents)."""
    labels = [INLET_RACK1[0], FANS_NODE2[0], HOT_NODE3_GPU0[0], PSU_NODE0[0], BRAKE_NODE0_GPU6[0]]
    for order in itertools.permutations(labels):
        engine, _ = run(dict.fromkeys(order, 0.0), end=200.0)
        assert grouping(engine, 200.0) == [PSU0, RACK1], order


def test_a_coarse_finding_frames_later_takes_in_the_finer_incidents() -> None:
    """The rack's inlet (and node0's PSU) rising 0 s to 590 s after the finer findings began — within
    coherence_s (600 s), the window in which a rack incident coming first would have claimed them —
    gives the same incidents as coming first; the incident keeps the oldest id and its history."""
    for lag in (-10, 0, 10, 30, 120, 590):
        engine, told = run({FANS_NODE2[0]: 0.0, HOT_NODE3_GPU0[0]: 0.0, BRAKE_NODE0_GPU6[0]: 0.0,
                            INLET_RACK1[0]: float(lag), PSU_NODE0[0]: float(lag)}, end=lag + 300.0)
        assert grouping(engine, lag + 300.0) == [PSU0, RACK1], lag
        if lag >= 120:
            # the finer incidents had been told (hold_s 60 s): the one merged away (the hot GPU's,
            # inc-2) is told resolved, pointing at the one that stays — the first to open (node2's
            # fans, inc-1, at t=0), now rooted at the rack; the brake's (inc-3) takes the PSU in
            merged = [(f.ts, f.incident_id, f.reason) for f in told if f.state == "resolved"]
            assert merged == [(lag, "inc-2", "merged into inc-1")], lag
            assert {f.incident_id for f in told if f.root_entity in ("node2", "rack1")} == {"inc-1"}, lag
            assert {f.incident_id for f in told if f.root_entity in ("node0/gpu6", "node0")} == {"inc-3"}, lag
            assert [f.state for f in told if f.root_entity == "rack1"][0] == "growing", lag


def test_independent_faults_under_the_rack_stay_apart_in_any_order() -> None:
    """An XID 48 on a GPU of rack1 (another family) is no consequence of its inlet; in one frame,
    in any order, the rack takes in node2's fans and leaves the XID's incident alone."""
    labels = [INLET_RACK1[0], FANS_NODE2[0], XID_NODE3_GPU1[0]]
    for order in itertools.permutations(labels):
        engine, _ = run(dict.fromkeys(order, 0.0), end=200.0)
        got = grouping(engine, 200.0)
        assert ("rack", "rack1", "rack_cooling", ("node2", "rack1")) in got, order
        assert ("gpu", "node3/gpu1", "gpu_error", ("node3/gpu1",)) in got, order
        assert len(got) == 2, order


def test_a_gpu_heating_long_before_the_inlet_rose_stays_its_own_cause() -> None:
    """node3/gpu0 heating alone for 20 minutes before rack1's inlet rises: a rack incident that came
    first would not have claimed it either (it stopped spreading more than coherence_s, 600 s,
    before). node2's fans, failing with the inlet, are the rack's."""
    engine, _ = run({HOT_NODE3_GPU0[0]: 0.0, FANS_NODE2[0]: 1200.0, INLET_RACK1[0]: 1210.0}, end=1500.0)
    assert grouping(engine, 1500.0) == [("gpu", "node3/gpu0", "tim_degradation", ("node3/gpu0",)),
                                        ("rack", "rack1", "rack_cooling", ("node2", "rack1"))]
