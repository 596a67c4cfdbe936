"""A second fault on entities an incident already holds: the engine notes the re-fire in the held
incident (its time, the root its members point at) and the incident evaluation credits it.

Topology (tests/test_incidents.py): cdu0 cools rack0 and rack1, two nodes of 4 GPUs per rack.
"""

from __future__ import annotations

from typing import Callable

from foreshock.detectors.incident_eval import score_incidents
from foreshock.detectors.incidents import IncidentEngine
from foreshock.events import Event
from foreshock.findings import Anomaly, Finding, Incident, Prediction

from test_incidents import TOPO, gpu

T0 = 1_700_000_000.0
LOOP_GPUS = [gpu(n, i) for n in range(4) for i in (1, 2)]  # 8 GPUs on both racks of cdu0
KEEPER = gpu(0, 0)  # keeps heating all along: the loop incident never resolves


def heat(t: float, gpus: list[int], active: bool = True) -> list[Finding]:
    return [Prediction(T0 + t, "gpu", g, "thermal_throttle", 600.0, 0.9, "thermal", "core heading for 88 °C", active)
            for g in gpus]


def run(stream: dict[float, list[Finding]], end: float) -> list[Finding]:
    engine, out = IncidentEngine(TOPO), []
    t = 0.0
    while t <= end:
        batch = stream.get(t, [])
        out += batch
        out += engine.observe(batch, T0 + t)
        engine.check_invariants()
        t += 10.0
    return out


def loop_fails_twice() -> dict[float, list[Finding]]:
    """cdu0 loses flow at 0 s (all 8 GPUs heat until 300 s, then cool), and again at 1500 s; one
    GPU keeps heating all along, so the first incident is still live when the loop fails again."""
    stream: dict[float, list[Finding]] = {}
    for t in range(0, 3001, 30):
        batch = heat(t, [KEEPER])
        if t <= 300 or 1500 <= t <= 1800:
            batch += heat(t, LOOP_GPUS)
        elif t in (330, 1830):
            batch += heat(t, LOOP_GPUS, active=False)
        stream[float(t)] = batch
    return stream


def test_same_root_failing_again_is_noted_in_the_held_incident() -> None:
    out = run(loop_fails_twice(), 3000.0)
    incs = [f for f in out if isinstance(f, Incident)]
    assert {i.incident_id for i in incs} == {"inc-1"}, "one cause, one incident"
    assert all(i.root_entity == "cdu0" for i in incs)
    again = [i for i in incs if "fired again at" in i.reason]
    assert again, [(i.ts - T0, i.state, i.reason) for i in incs]
    first = again[0]
    # told at the next update after the loop failed again, as growth, with the time it did
    assert first.state == "growing" and first.ts - T0 <= 1500 + 60
    assert "fired again at 2023-11-14 22:38:20 UTC: cooling_loop cdu0" in first.reason  # T0 + 1500 s
    assert not any("fired again" in i.reason for i in incs if i.ts - T0 < 1500)


def loop_spreading_with_a_second_cause(second: Callable[[int], list[Finding]]) -> dict[float, list[Finding]]:
    """cdu0 fails at 0 s (quiet from 330 s) and spreads again from 1000 s (a GPU every 100 s), so its
    incident still grows and keeps its members; ``second(t)``'s findings join from 1500 to 1800 s."""
    spreading = [gpu(n, 3) for n in range(4)]
    stream: dict[float, list[Finding]] = {}
    for t in range(0, 3001, 30):
        batch = heat(t, [KEEPER])
        if t <= 300:
            batch += heat(t, LOOP_GPUS)
        elif t == 330:
            batch += heat(t, LOOP_GPUS, active=False)
        if 1000 <= t <= 1800:  # the loop still spreading: the members stay in its incident
            batch += heat(t, spreading[:(t - 1000) // 100 + 1])
        if 1500 <= t <= 1800:
            batch += second(t)
        stream[float(t)] = batch
    return stream


def test_new_cause_under_held_entities_is_noted_with_its_root() -> None:
    """node1's fans fail at 1500 s, its GPUs already members of the loop incident (still growing,
    so they stay in it): the note names node1 as a new cause, not the loop."""
    def fans_fail(t: int) -> list[Finding]:  # its two loop GPUs, quiet since 330 s, heat again
        fan = [Anomaly(T0 + t, "node", 1, "fan_speed", 4.0, "fans", "fan degraded")] if t == 1500 else []
        return heat(t, [gpu(1, 1), gpu(1, 2)]) + fan

    stream = loop_spreading_with_a_second_cause(fans_fail)
    out = run(stream, 3000.0)
    notes = [i.reason for i in out if isinstance(i, Incident) and "new cause at" in i.reason]
    assert notes and "node node1 (fan_failure)" in notes[0], [
        (i.ts - T0, i.incident_id, i.root_entity, i.reason) for i in out if isinstance(i, Incident)]


def fault(fid: str, t: float, kind: str, target: str, ftype: str, dur: float) -> Event:
    return Event(T0 + t, "fault_onset", kind, target, fid, ftype, {"duration_s": dur})


def test_evaluation_credits_a_noted_refire() -> None:
    """The loop's second failure adds no member to the incident that holds its GPUs: credited
    through the note (root, onset), and not counted as two independent faults merged."""
    out = run(loop_fails_twice(), 3000.0)
    events = [fault("f1", 0.0, "loop", "cdu0", "cooling_loss", 400.0),
              fault("f2", 1500.0, "loop", "cdu0", "cooling_loss", 400.0)]
    events += [Event(T0 + t, "thermal_throttle_start", "gpu", TOPO.gpus[g], fid, "cooling_loss", {})
               for fid, t in (("f1", 200.0), ("f2", 1700.0)) for g in LOOP_GPUS[:3]]
    rep = score_incidents(out, events, TOPO)
    rows = {r["fault"]: r for r in rep["by_fault"]}
    assert rows["f2"]["incidents"] == ["inc-1"] and rows["f2"]["refire"], rows["f2"]
    assert rows["f2"]["root_correct"] and rows["f2"]["member_recall"] == 1.0
    assert 0 <= rows["f2"]["onset_to_incident_s"] <= 60
    assert rep["root_cause_accuracy"] == 1.0 and rep["refire_credited"] == 1
    assert rep["merged_independent_faults"] == 0


def test_refire_survives_a_checkpoint() -> None:
    """The re-fire is in the saved state: a restored engine tells the same note."""
    stream = loop_fails_twice()
    a, b = IncidentEngine(TOPO), IncidentEngine(TOPO)
    said_a: list[Incident] = []
    said_b: list[Incident] = []
    for t in range(0, 2401, 10):
        batch = stream.get(float(t), [])
        said_a += [f for f in a.observe(batch, T0 + t) if isinstance(f, Incident)]
        if t == 1600:
            b.load_state_dict(a.state_dict())
        if t > 1600:
            said_b += [f for f in b.observe(batch, T0 + t) if isinstance(f, Incident)]
    after = [f for f in said_a if f.ts - T0 > 1600]
    assert [(f.ts, f.state, f.reason) for f in said_b] == [(f.ts, f.state, f.reason) for f in after]
    assert any("fired again" in f.reason for f in a.incidents(T0 + 2400))
