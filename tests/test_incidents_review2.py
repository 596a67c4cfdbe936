"""Second review of the incident engine (r71): scoring by when members joined, job impact from
current evidence, external events (bytes, words, NIC alarms, dated after the end), the CLI's
fault durations and the benchmark's short memory phase."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foreshock.detectors.incident_eval import score_incidents
from foreshock.detectors.incident_external import ExternalEvent, read_events
from foreshock.detectors.incident_impact import STALLED_RATIO
from foreshock.detectors.incident_signals import SIGNALS, external_signal
from foreshock.detectors.incidents import IncidentEngine
from foreshock.events import Event
from foreshock.findings import Anomaly, Incident, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.simulator.topology_gen import build_topology

from bench_modules import load_bench


T0 = 1_700_000_000.0


def ev(t: float, typ: str, kind: str, entity: str, fid: str = "", ftype: str = "", **detail) -> Event:
    return Event(t, typ, kind, entity, fid, ftype, detail)


def inc(t: float, iid: str, root_kind: str, root: str, members: list[str]) -> Incident:
    return Incident(t, iid, "open", root_kind, root, "r", tuple(members))


NODE0 = [f"node0/gpu{i}" for i in range(8)]
NODE1 = [f"node1/gpu{i}" for i in range(8)]


def _row(rep: dict, fid: str) -> dict:
    return next(r for r in rep["by_fault"] if r["fault"] == fid)


# ---- R1/R2: members attributed by when they joined --------------------------------------------
def test_members_go_to_the_fault_active_when_they_joined(small_topology):
    """A loop incident holds node1's GPUs from the first cooling loss on: a PSU fault on node1
    later is not credited through them, and a second loss of the same loop gets the members
    that joined during it (not the first loss, long over)."""
    events = [ev(100, "fault_onset", "loop", "cdu0", "f1", "cooling_loss", duration_s=200.0),
              ev(2000, "fault_onset", "node", "node1", "f2", "psu_failure", duration_s=500.0),
              ev(3000, "fault_onset", "loop", "cdu0", "f3", "cooling_loss", duration_s=300.0)]
    events += [ev(120, "thermal_throttle_start", "gpu", g, "f1", "cooling_loss") for g in NODE0[:4]]
    events += [ev(2001, "power_brake_start", "gpu", g, "f2", "psu_failure") for g in NODE1]
    events += [ev(3010, "thermal_throttle_start", "gpu", g, "f3", "cooling_loss") for g in NODE0[4:]]
    early = NODE0[:4] + NODE1
    findings = [inc(150, "inc-1", "cooling_loop", "cdu0", early),
                inc(2000, "inc-1", "cooling_loop", "cdu0", early),
                inc(3020, "inc-1", "cooling_loop", "cdu0", early + NODE0[4:]),
                inc(2010, "inc-2", "node", "node1", NODE1)]
    rep = score_incidents(findings, events, small_topology)
    assert _row(rep, "f2")["incidents"] == ["inc-2"]  # not also the loop incident
    assert _row(rep, "f3")["incidents"] == ["inc-1"] and _row(rep, "f3")["member_recall"] == 1.0
    assert rep["merged_independent_faults"] == 0
    # onset to incident: when an entity of the fault joined, not the loop incident's routine
    # emission at the PSU fault's onset (it had held node1's GPUs for half an hour)
    assert _row(rep, "f2")["onset_to_incident_s"] == 10.0
    assert _row(rep, "f3")["onset_to_incident_s"] == 20.0


def test_onset_to_incident_counts_the_entity_joining(small_topology):
    events = [ev(2000, "fault_onset", "node", "node1", "f1", "psu_failure", duration_s=500.0)]
    events += [ev(2001, "power_brake_start", "gpu", g, "f1", "psu_failure") for g in NODE1]
    findings = [inc(1000, "inc-1", "node", "node1", NODE1[:1]),  # held for another cause
                inc(2000, "inc-1", "node", "node1", NODE1[:1]),  # a routine emission at the onset
                inc(2030, "inc-1", "node", "node1", NODE1)]
    rep = score_incidents(findings, events, small_topology)
    assert _row(rep, "f1")["incidents"] == ["inc-1"]
    assert _row(rep, "f1")["onset_to_incident_s"] == 30.0


# ---- R3/R4/R5: job impact from current evidence -------------------------------------------------
@pytest.fixture(scope="module")
def topo64():
    return build_topology(64)


def _steps(t, ts: float, job: int, step: float) -> Frame:
    n = len(t.jobs)
    return Frame("job", np.full(n, ts), np.arange(n), {"step_time": np.where(np.arange(n) == job, step, 1.0)})


def test_job_impact_follows_current_evidence_not_its_peak(topo64):
    """A GPU's HW slowdown (2x) clears and the job's step time is back: the incident, kept live by
    a prediction on another GPU, says that prediction's 1.15x, not the 2x of long ago."""
    t = topo64
    eng = IncidentEngine(t)
    job3 = t.jobs.index("job3")
    g0, g1 = t.gpus.index("node7/gpu0"), t.gpus.index("node7/gpu1")
    for s in range(0, 2000, 10):
        ts = T0 + s
        eng.observe_frame(_steps(t, ts, job3, 2.0 if 100 <= s < 300 else 1.0))
        batch: list = []
        if s % 60 == 0:
            batch.append(Prediction(ts, "gpu", g1, "thermal_throttle", 1200.0, 0.9, "thermal", "core heading for 88 C"))
        if s == 100:
            batch.append(Anomaly(ts, "gpu", g0, "throttle_reasons", 8.0, "throttle_bits", "hw_slowdown"))
        if s == 300:
            batch.append(Anomaly(ts, "gpu", g0, "throttle_reasons", 0.0, "throttle_bits", "throttling cleared"))
        eng.observe(batch, ts)
        if s == 200:
            assert dict(eng.incidents(ts)[0].jobs)["job3"] == 2.0  # measured while it lasts
    (now,) = eng.incidents(T0 + 1990)
    assert dict(now.jobs)["job3"] == 1.15
    assert now.gpu_hours_at_risk_per_hour == pytest.approx(8 * (1 - 1 / 1.15), abs=1e-3)


def test_a_stopped_jobs_last_step_time_expires(topo64):
    t = topo64
    eng = IncidentEngine(t)
    job3 = t.jobs.index("job3")
    g = t.gpus.index("node7/gpu1")
    out = []
    for s in range(0, 3800, 10):
        ts = T0 + s
        eng.observe_frame(_steps(t, ts, job3, 1.0 if s < 100 else 2.0 if s < 300 else math.nan))
        batch = [Prediction(ts, "gpu", g, "thermal_throttle", 1200.0, 0.9, "thermal", "hot")] \
            if s >= 3600 and s % 60 == 0 else []
        out += eng.observe(batch, ts)
    assert out and all(dict(f.jobs)["job3"] == 1.15 for f in out)


def test_last_step_time_expires_without_nan(topo64):
    """Not reported at all any more (no NaN row either): too old after a few intervals."""
    t = topo64
    eng = IncidentEngine(t)
    job3 = t.jobs.index("job3")
    for s in range(0, 300, 10):
        eng.observe_frame(_steps(t, T0 + s, job3, 1.0 if s < 100 else 2.0))
    assert eng.tel.measured_slowdown(job3, T0 + 290) == 2.0
    assert math.isnan(eng.tel.measured_slowdown(job3, T0 + 3600))


def test_measured_slowdown_goes_to_the_incident_that_explains_it(topo64):
    """A PSU brake slows job0 3x; an unrelated TIM prediction on another of its GPUs keeps its own
    1.15x instead of reporting the job's whole measured loss a second time."""
    t = topo64
    eng = IncidentEngine(t)
    job0 = t.jobs.index("job0")
    node1 = t.nodes.index("node1")
    out = []
    for s in range(0, 900, 10):
        ts = T0 + s
        eng.observe_frame(_steps(t, ts, job0, 3.0 if s >= 200 else 1.0))
        batch: list = []
        if s % 60 == 0:
            batch.append(Prediction(ts, "gpu", 0, "thermal_throttle", 900.0, 0.9, "thermal", "core heading for 88 C"))
        if s == 200:
            batch += [Anomaly(ts, "gpu", int(g), "throttle_reasons", 128.0, "throttle_bits", "HW power brake")
                      for g in t.gpus_of_node(node1)]
            batch.append(Anomaly(ts, "node", node1, "psu_power", 1.0, "power", "node-wide power brake"))
        out += eng.observe(batch, ts)
    late = {f.root_kind: dict(f.jobs)["job0"] for f in out if f.ts >= T0 + 300}
    assert late == {"gpu": 1.15, "node": 3.0}


def test_a_step_time_from_before_the_gpu_fell_off_does_not_hide_the_stall(topo64):
    """The job's last step time (1.0, still fresh) was measured before its GPU fell off the bus:
    it tells nothing of what the loss costs, so the job stays stalled (my own rule's edge)."""
    t = topo64
    eng = IncidentEngine(t)
    job3 = t.jobs.index("job3")
    g = t.gpus.index("node7/gpu1")
    for s in range(0, 60, 10):
        eng.observe_frame(_steps(t, T0 + s, job3, 1.0))
        eng.observe([], T0 + s)
    out = eng.observe([Anomaly(T0 + 60, "gpu", g, "xid_last", 79.0, "xid", "XID 79: fallen off the bus")], T0 + 60)
    out += [f for s in range(70, 200, 10) for f in eng.observe([], T0 + s)]
    assert out and all(dict(f.jobs)["job3"] == STALLED_RATIO for f in out if f.state != "resolved")


def test_old_job_telemetry_state_loads(topo64):
    """A checkpoint from before step times carried their time (two columns) still loads."""
    eng = IncidentEngine(topo64)
    state = eng.tel.state_dict()
    state["s_job_tel"] = state["s_job_tel"][:, :2]
    eng.tel.load_state_dict(state)
    assert eng.tel.s_job_tel.shape == (len(topo64.jobs), 3)


# ---- R8/R7/R6/R9: external events -----------------------------------------------------------------
def test_a_line_that_is_not_utf8_is_counted_not_fatal(tmp_path):
    p = tmp_path / "ext.jsonl"
    p.write_bytes(b'{"node":"node1","time":1700008000,"type":"fan_failure","severity":"critical"}\n'
                  b'{"node":"node2","time":1700008000,"type":"fan \xe9chec","severity":"critical"}\n')
    health = PipelineHealth()
    events = read_events(p, health)
    assert [e.node for e in events] == ["node1"]
    assert health.total_problems() == 1


@pytest.mark.parametrize("typ, sig", [
    ("node_busy", "external_other"), ("health_report", "external_other"),
    ("reboot_attempt_failed", "external_other"), ("xid_43_app_fault", "external_other"),
    ("ecc_correctable_threshold", "external_other"), ("technician_dispatched", "external_other"),
    ("xid79", "external_lost"), ("XID 79", "external_lost"), ("gpu_fell_off_the_bus", "external_lost"),
    ("uncorrectable_ecc_error", "external_lost"), ("gpu_missing", "external_lost"),
    ("fan_failure", "external_thermal"), ("FanFailure", "external_thermal"), ("overtemp", "external_thermal"),
    ("psu_failure", "external_power"), ("nic_failure", "external_fabric"), ("ib_port_down", "external_fabric"),
])
def test_external_types_are_read_by_whole_words(typ, sig):
    assert external_signal(typ, "critical") == sig


def test_a_busy_node_does_not_stall_its_job(topo64):
    eng = IncidentEngine(topo64)
    eng.observe([], T0)
    eng.add_external([ExternalEvent("node0", T0 + 1, "node_busy", "warning")])
    out = [f for s in range(0, 200, 10) for f in eng.observe([], T0 + s)]
    assert out and all(j[1] < 2 for f in out for j in f.jobs)
    assert SIGNALS[external_signal("node_busy", "warning")].slowdown == 1.0


def test_a_nic_alarm_on_a_node_predicts_its_own_links(topo64):
    eng = IncidentEngine(topo64)
    eng.observe([], T0)
    eng.add_external([ExternalEvent("node6", T0 + 5, "nic_failure", "critical")])
    out = [f for s in range(0, 300, 10) for f in eng.observe([], T0 + s)]
    predicted = [n for f in out for n, _ in f.predicted_members]
    assert predicted and all(n.startswith("node6/") for n in predicted)


def test_external_events_after_the_end_are_counted(topo64):
    health = PipelineHealth()
    eng = IncidentEngine(topo64, health)
    eng.add_external([ExternalEvent("node3", T0 + 3605, "psu_failure", "critical"),
                      ExternalEvent("node5", (T0 + 600) * 1000, "psu_failure", "critical")])  # ms by mistake
    for s in range(0, 3601, 60):
        eng.observe([], T0 + s)
    eng.flush(T0 + 3600)
    assert health.total_problems() == 2


# ---- R10: the CLI scores with the recording's fault durations -----------------------------------------
from test_incidents_eval import psu_recording  # noqa: E402,F401  (a PSU failure on 64 GPUs, recorded once)


def test_incidents_command_scores_with_fault_durations(psu_recording, monkeypatch):
    from click.testing import CliRunner

    from foreshock.cli import incidents as cli_incidents
    from foreshock.cli.main import cli as main
    from foreshock.recording import Recording

    seen: dict = {}
    real = cli_incidents.score_incidents

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(cli_incidents, "score_incidents", spy)
    res = CliRunner().invoke(main, ["incidents", str(psu_recording), "--no-progress"])
    assert res.exit_code == 0, res.output
    faults = Recording.open(psu_recording).meta["faults"]
    assert seen.get("duration_of") == {str(f["id"]): float(f["duration_s"]) for f in faults
                                       if isinstance(f.get("duration_s"), (int, float))}
    assert seen["duration_of"]


# ---- R11: the benchmark's memory phase under an hour -----------------------------------------------
def test_bench_memory_phase_under_an_hour(small_topology):
    bench = load_bench("bench_incidents")
    res = bench.memory(small_topology, 2.0, 60 / 3600, 30.0, trace=False)
    assert len(res["rss_mib"]) == 1
