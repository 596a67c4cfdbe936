"""Incident scoring against hand-made ground truth, the XID detector, and `foreshock incidents`."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import xid as xid_module
from foreshock.detectors.incident_eval import fault_truths, replay_findings, score_incidents
from foreshock.detectors.xid import XidDetector
from foreshock.events import Event
from foreshock.findings import Anomaly, Incident, Prediction
from foreshock.frames import Frame


def ev(t: float, typ: str, kind: str, entity: str, fid: str = "", ftype: str = "", **detail) -> Event:
    return Event(t, typ, kind, entity, fid, ftype, detail)


def inc(t: float, iid: str, state: str, root_kind: str, root: str, members: list[str], hint: str = "") -> Incident:
    return Incident(t, iid, state, root_kind, root, "r", tuple(members), fault_hint=hint)


@pytest.fixture
def truth(small_topology):
    """cdu0 = rack0 = node0, node1; cdu1 = rack1 = node2, node3 (conftest's small_topology)."""
    e = [
        ev(100, "fault_onset", "loop", "cdu0", "f1", "cooling_loss", duration_s=1000.0),
        ev(200, "fault_onset", "gpu", "node2/gpu3", "f2", "tim_degradation"),
        ev(300, "fault_onset", "gpu", "node3/gpu0", "f3", "xid79"),  # no consequence: not scored
        ev(400, "fault_onset", "node", "node3", "f4", "psu_failure"),
        ev(50, "power_cap_start", "gpu", "node1/gpu2"),  # no fault
        ev(500, "job_slowdown_start", "job", "job0", "f1", "cooling_loss"),
    ]
    e += [ev(120 + i, "thermal_throttle_start", "gpu", g, "f1", "cooling_loss")
          for i, g in enumerate(["node0/gpu0", "node0/gpu1", "node1/gpu0", "node1/gpu1"])]
    e.append(ev(900, "thermal_throttle_start", "gpu", "node2/gpu3", "f2", "tim_degradation"))
    e += [ev(401, "power_brake_start", "gpu", f"node3/gpu{i}", "f4", "psu_failure") for i in range(8)]
    return e


def test_fault_truth_scopes_and_consequences(truth, small_topology):
    faults = {f.fault_id: f for f in fault_truths(truth, small_topology)}
    assert faults["f1"].end == 1100.0 and math.isinf(faults["f2"].end)
    assert {"rack0", "node0", "node1/gpu7", "cdu0"} <= faults["f1"].scope
    assert not any(x.startswith(("node2", "node3")) for x in faults["f1"].scope)
    assert faults["f1"].consequences == {"node0/gpu0", "node0/gpu1", "node1/gpu0", "node1/gpu1"}
    assert faults["f1"].jobs == {"job0"}
    assert faults["f4"].scope >= {f"node3/gpu{i}" for i in range(8)} | {"node3"}
    assert not faults["f3"].consequences


def test_score_incidents_by_hand(truth, small_topology):
    raw = [Anomaly(float(i), "gpu", 0, "gpu_temp", 1.0, "x") for i in range(40)]
    incidents = [
        inc(150, "inc-1", "open", "cooling_loop", "cdu0", ["node0/gpu0", "node0/gpu1", "node1/gpu0"], "cooling_loss"),
        inc(300, "inc-1", "growing", "cooling_loop", "cdu0",
            ["node0/gpu0", "node0/gpu1", "node1/gpu0", "node1/gpu5", "rack0"], "cooling_loss"),
        inc(1500, "inc-1", "resolved", "cooling_loop", "cdu0",
            ["node0/gpu0", "node0/gpu1", "node1/gpu0", "node1/gpu5", "rack0"], "cooling_loss"),
        inc(260, "inc-2", "open", "node", "node2", ["node2/gpu3"], "fan_failure"),  # wrong root
        inc(410, "inc-3", "open", "node", "node3",  # merges the PSU with the TIM GPU next door
            ["node3/gpu0", "node3/gpu1", "node3/gpu2", "node3/gpu3", "node2/gpu3"], "psu_failure"),
        inc(5000, "inc-4", "open", "gpu", "node1/gpu7", ["node1/gpu7"]),  # long after f1: no fault
    ]
    rep = score_incidents(raw + incidents, truth, small_topology)
    assert rep["faults"] == 3 and rep["faults_total"] == 4
    assert rep["root_cause_accuracy"] == round(2 / 3, 4)
    assert rep["member_recall"] == round((3 / 4 + 1.0 + 4 / 8) / 3, 4)
    assert rep["member_precision"] == round((1.0 + 1.0 + 4 / 5) / 3, 4)
    assert rep["onset_to_incident_median_s"] == 50.0
    assert rep["compression"] == 10.0
    assert rep["merged_independent_faults"] == 1
    assert rep["unattributed_incidents"] == 1
    assert rep["cause_accuracy"] == round(2 / 3, 4)
    rows = {r["fault"]: r for r in rep["by_fault"]}
    assert rows["f2"]["root"] == "node:node2" and not rows["f2"]["root_correct"]
    assert rows["f1"]["job_recall"] == 0.0
    assert rows["f3"]["member_recall"] is None


def test_optics_compare_as_their_link(small_topology):
    link = small_topology.links[5]
    truth = [ev(0, "fault_onset", "optic", f"{link}#b", "f1", "optic_degradation"),
             ev(100, "link_down", "link", link, "f1", "optic_degradation")]
    found = [inc(50, "inc-1", "open", "optic", f"{link}#b", [f"{link}#b", link], "optic_degradation")]
    rep = score_incidents(found, truth, small_topology)
    assert rep["root_cause_accuracy"] == 1.0 and rep["member_recall"] == 1.0 and rep["member_precision"] == 1.0


def test_replay_findings_runs_the_engine(small_topology):
    findings = [Prediction(float(t), "gpu", 3, "thermal_throttle", 600.0, 0.9, "thermal") for t in range(0, 600, 60)]
    findings.append(Prediction(600.0, "gpu", 3, "thermal_throttle", 600.0, 0.9, "thermal", active=False))
    out = replay_findings(findings, small_topology, step_s=10.0)
    incidents = [f for f in out if isinstance(f, Incident)]
    assert incidents and {i.incident_id for i in incidents} == {"inc-1"}
    assert incidents[0].root_entity == "node0/gpu3"
    assert incidents[-1].state == "resolved"  # the clock runs on after the data until it quiets down
    assert [f for f in out if not isinstance(f, Incident)] == findings


def _off_the_bus(topology, lost: int, back_at: float, until: float) -> list[Frame]:
    """GPU telemetry every 10 s in which GPU ``lost`` is silent until ``back_at``."""
    frames = []
    for t in np.arange(0.0, until, 10.0):
        slots = np.arange(len(topology.gpus), dtype=np.int32)
        slots = slots[slots != lost] if t < back_at else slots
        frames.append(Frame("gpu", np.full(len(slots), t), slots, {"gpu_temp": np.full(len(slots), 50.0)}))
    return frames


def test_replay_gives_the_engine_the_telemetry(small_topology):
    """The evaluation replayed the findings without telemetry: an XID 79 incident resolved 15
    minutes after its last finding though the GPU was still off the bus (the live pipeline keeps
    it open until the GPU's telemetry comes back), and jobs' step times were never measured."""
    lost, back_at = 3, 1800.0
    xid79 = [Anomaly(0.0, "gpu", lost, "xid_last", 79.0, "xid", "XID 79")]

    def resolved_at(out):
        return next(f.ts for f in out if isinstance(f, Incident) and f.state == "resolved")

    blind = replay_findings(xid79, small_topology, step_s=10.0, end=3000.0)
    fed = replay_findings(xid79, small_topology, step_s=10.0, end=3000.0,
                          telemetry=_off_the_bus(small_topology, lost, back_at, 3000.0))
    assert resolved_at(blind) < back_at <= resolved_at(fed)


@settings(max_examples=25, deadline=None)
@given(finding_ts=st.lists(st.integers(0, 600), min_size=1, max_size=8),
       frame_ts=st.lists(st.integers(0, 900), max_size=12), step=st.sampled_from([1.0, 5.0, 10.0]))
def test_each_frame_reaches_the_engine_before_the_findings_of_its_time(finding_ts, frame_ts, step):
    """As the pipeline's bank does it: a frame, then the findings of its time; never a frame from
    after the time the engine is told it is."""
    from foreshock.detectors.incidents import IncidentEngine
    from thermal_synth import small_topology

    calls: list[tuple[str, float]] = []
    observe, observe_frame = IncidentEngine.observe, IncidentEngine.observe_frame
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(IncidentEngine, "observe", lambda self, batch, now: (calls.append(("now", now)),
                                                                           observe(self, batch, now))[1])
        patch.setattr(IncidentEngine, "observe_frame", lambda self, frame: (calls.append(("frame", frame.ts[0])),
                                                                          observe_frame(self, frame))[1])
        findings = [Anomaly(float(t), "gpu", 1, "gpu_temp", 5.0, "x", "hot") for t in finding_ts]
        frames = [Frame("gpu", [float(t)], [2], {"gpu_temp": [40.0]}) for t in sorted(frame_ts)]
        replay_findings(findings, small_topology(nodes=1, gpus=4, racks=1), step_s=step, telemetry=frames)
    nows = [t for what, t in calls if what == "now"]
    given_at = [(t, sum(1 for what, _ in calls[:i] if what == "now")) for i, (what, t) in enumerate(calls)
                if what == "frame"]
    for t, before in given_at:  # given after `before` engine steps
        assert before == 0 or nows[before - 1] < t  # not one step too late
        assert before < len(nows) and t <= nows[before]  # nor before its time
    # a frame past the engine's last step is never given; every other one is
    assert len(given_at) == sum(1 for t in frame_ts if t <= nows[-1])


# ---- the XID detector --------------------------------------------------------------------------
def test_xid_detector(small_topology):
    det = XidDetector(small_topology)
    f = det.update(Frame("gpu", [0.0, 0.0], [0, 1], {"xid_last": [13.0, 0.0], "ecc_dbe": [0.0, 2.0]}))
    assert f == []  # first values may be latched from long ago
    f = det.update(Frame("gpu", [1.0, 1.0], [0, 1], {"xid_last": [13.0, 48.0], "ecc_dbe": [0.0, 3.0]}))
    assert [(x.slot, x.field, x.score) for x in f] == [(1, "xid_last", 48.0), (1, "ecc_dbe", 1.0)]
    assert "double-bit ECC" in f[0].reason
    assert det.update(Frame("gpu", [2.0], [0], {"gpu_temp": [50.0]})) == []  # no XID column: nothing
    state = det.state_dict()
    det2 = XidDetector(small_topology)
    det2.load_state_dict(state)
    nxt = Frame("gpu", [3.0], [1], {"xid_last": [79.0], "ecc_dbe": [3.0]})
    assert det.update(nxt) == det2.update(nxt)
    assert doctest.testmod(xid_module).failed == 0


# ---- the command -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def psu_recording(tmp_path_factory) -> Path:
    from foreshock.cli.main import cli

    out = tmp_path_factory.mktemp("rec") / "psu"
    res = CliRunner().invoke(cli, ["simulate", "--scenario", "psu-failure", "--gpus", "64", "--duration", "900",
                                   "--interval", "5", "--seed", "1", "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    return out


def test_incidents_command_prints_a_timeline(psu_recording, tmp_path):
    from foreshock.cli.main import cli
    from foreshock.recording import Recording

    rec = Recording.open(psu_recording)
    onset = next(e for e in rec.events() if e.type == "fault_onset")
    other = next(n for n in rec.topology.nodes if n != onset.entity)
    external = tmp_path / "bmc.jsonl"
    external.write_text("\n".join([
        json.dumps({"node": other, "time": onset.time + 60, "type": "fan_failure", "severity": "critical"}),
        "{not json",
    ]) + "\n")
    findings = tmp_path / "findings.jsonl"
    res = CliRunner().invoke(cli, ["incidents", str(psu_recording), "--detectors", "power,throttle_bits,xid",
                                   "--external", str(external), "--findings", str(findings), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert f"OPEN root node {onset.entity}" in res.output
    assert f"OPEN root node {other} (fan_failure) — external" in res.output
    assert "root cause right for 1 of 1 faults with consequences" in res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["name"] == "incidents"
    assert summary["root_cause_accuracy"] == 1.0 and summary["member_recall"] == 1.0
    assert summary["incidents_total"] == 2 and summary["merged_independent_faults"] == 0
    lines = [json.loads(x) for x in findings.read_text().splitlines()]
    assert sum(1 for x in lines if x["type"] == "incident") >= 2
    assert summary["raw_findings"] == sum(1 for x in lines if x["type"] != "incident")


def test_evaluation_harness_reports_incidents(psu_recording, monkeypatch):
    from foreshock.detectors import evaluation
    from foreshock.detectors.incident_eval import score_run
    from foreshock.recording import Recording

    assert evaluation.SECTION_SCORERS["incidents"] is score_run
    monkeypatch.setitem(evaluation.DETECTOR_SETS, "foreshock", ("power", "throttle_bits", "xid"))
    result = evaluation.run_recording(Recording.open(psu_recording), ["foreshock"])
    section = evaluation.score(result, ["power_cap"])["incidents"]
    required = {"faults", "root_cause_accuracy", "member_recall", "member_precision", "onset_to_incident_median_s",
                "compression", "merged_independent_faults"}
    assert required <= set(section)
    assert section["faults"] == 1 and section["root_cause_accuracy"] == 1.0 and section["member_recall"] == 1.0
    assert score_run(result, detector_set="river") == {"skipped": "no 'river' detector set in this run"}


def test_evaluate_feeds_the_incident_engine_the_telemetry_the_run_was_given(psu_recording, monkeypatch):
    """``foreshock evaluate --telemetry gpu,job`` fed no job frame anywhere and said "(telemetry
    fed: gpu)": no detector reads job frames, and the incidents section replayed the findings
    without telemetry. Now the engine gets the kinds it reads that the run was given, in time order."""
    from foreshock.cli.main import cli
    from foreshock.detectors import evaluation, incident_eval
    from foreshock.recording import Recording

    rec = Recording.open(psu_recording)
    assert {"gpu", "link", "job", "rack"} <= set(rec.kinds())
    given: list[list[Frame]] = []

    def replay(findings, topology, telemetry=(), **kwargs):
        given.append(list(telemetry))
        return replay_findings(findings, topology, telemetry=given[-1], **kwargs)

    monkeypatch.setattr(incident_eval, "replay_findings", replay)
    monkeypatch.setitem(evaluation.DETECTOR_SETS, "foreshock", ("power", "throttle_bits", "xid"))
    for asked, engine_kinds in ((None, {"gpu", "link", "job"}), (("gpu", "job"), {"gpu", "job"}), (("gpu",), {"gpu"})):
        result = evaluation.run_recording(rec, ["foreshock"], telemetry=asked)
        assert set(result.incident_telemetry) == engine_kinds
        assert incident_eval.score_run(result)["faults"] == 1
        frames = given.pop()
        assert {f.kind for f in frames} == engine_kinds
        assert sum(len(f) for f in frames if f.kind == "job") == (rec.meta["rows"]["job"] if "job" in engine_kinds else 0)
        ends = [float(f.ts.max()) for f in frames]
        assert ends == sorted(ends)
    result = CliRunner().invoke(cli, ["evaluate", str(psu_recording), "--detectors", "foreshock", "--no-plots",
                                      "--telemetry", "gpu,job", "--report", str(psu_recording.parent / "report")])
    assert result.exit_code == 0, result.output
    assert "(telemetry fed: gpu, job)" in result.output
