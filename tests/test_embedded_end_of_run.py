"""The end of a finite embedded run (a replay's last frame, a demo or watch stopped): the incident
engine is flushed once, and what it tells goes through the sinks like any other finding.

The engine ticks every ``tick_s`` (10 s) of telemetry: an incident whose hold time (60 s) passed
after its last tick and before the end was never told — not in the findings file, ``/metrics`` or
the summary — where ``foreshock incidents`` (which flushes) told it."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.detectors.base import Detector
from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly, Finding, Incident
from foreshock.frames import Frame
from foreshock.recording import RecordingWriter
from foreshock.streams.embedded import EmbeddedPipeline
from foreshock.topology import Topology

T0 = 1_700_000_000.0
STEP_S = 5.0
END_S = 165.0  # the last frame: ticks at 160 and 170 s, so nothing ticks at 165 s but the end
FIRED_S = (105.0, 110.0)  # two findings: confirmed 60 s after the first, at 165 s


class XidOnGpu0(Detector):
    """An XID 79 on GPU 0 in the frames stamped at ``FIRED_S``."""

    name = "xid_on_gpu0"
    kinds = ("gpu",)

    def update(self, frame: Frame) -> list[Finding]:
        t = float(np.nanmax(frame.ts))
        return [Anomaly(t, "gpu", 0, "xid_last", 79.0, "xid", "XID 79")] if t - T0 in FIRED_S else []


class Collected:
    def __init__(self) -> None:
        self.findings: list[Finding] = []

    def observe_frame(self, frame: Frame, received_wall: float | None = None) -> None:
        pass

    def observe_findings(self, findings) -> None:  # type: ignore[no-untyped-def]
        self.findings += findings


def frames(topology: Topology, end_s: float = END_S) -> list[Frame]:
    n = topology.size("gpu")
    return [Frame("gpu", np.full(n, T0 + t), np.arange(n), {"gpu_temp": np.full(n, 50.0)})
            for t in np.arange(0.0, end_s + STEP_S / 2, STEP_S)]


def test_an_incident_due_at_the_end_of_a_run_reaches_the_sinks_and_the_stats(small_topology: Topology) -> None:
    engine = IncidentEngine(small_topology, hold_s=60.0, tick_s=10.0)
    sink = Collected()
    pipeline = EmbeddedPipeline(small_topology, DetectorBank(small_topology, [XidOnGpu0(small_topology)], [engine]),
                                sinks=[sink])
    per_frame: list[Finding] = []
    stats = pipeline.run(frames(small_topology), on_frame=lambda _frame, found: per_frame.extend(found))
    assert not any(isinstance(f, Incident) for f in per_frame), "no frame's tick confirmed it"
    told = [f for f in sink.findings if isinstance(f, Incident)]
    assert [(i.state, i.root_entity, i.ts) for i in told] == [("open", "node0/gpu0", T0 + END_S)]
    assert [i.incident_id for i in pipeline.store.incidents()] == [told[0].incident_id]  # /metrics has it
    assert stats.by_type == {"anomaly": 2, "incident": 1} and stats.findings == 3
    # once per end: ending again tells nothing new
    assert pipeline.end_stream() == told and len([f for f in sink.findings if isinstance(f, Incident)]) == 1


def write_recording(path, topology: Topology) -> None:
    with RecordingWriter(path, topology, {"interval": STEP_S, "source": "test"}) as w:
        for frame in frames(topology):
            w.write(frame)


def event(node: str, t: float) -> str:
    return json.dumps({"node": node, "time": T0 + t, "type": "fan_failure", "severity": "critical"}) + "\n"


def test_replay_writes_the_incident_due_at_its_end_and_counts_late_events_once(tmp_path,
                                                                              small_topology: Topology) -> None:
    """``replay --external``: two alerts on node0 open an incident at the replay's last frame (in
    the findings file and the summary); an alert dated after the last telemetry is counted once as
    an input problem (not again by the engine's flush) and named in the external summary."""
    write_recording(tmp_path / "rec", small_topology)
    external = tmp_path / "alerts.jsonl"
    external.write_text(event("node0", FIRED_S[0]) + event("node0", FIRED_S[1]) + event("node0", END_S + 300))
    findings_path = tmp_path / "findings.jsonl"
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "rec"), "--port", "0", "--external", str(external),
                                      "--findings", str(findings_path)])
    assert result.exit_code == 0, result.output
    written = [json.loads(line) for line in findings_path.read_text().splitlines()]
    incidents = [f for f in written if f["type"] == "incident"]
    assert [(f["state"], f["ts"]) for f in incidents] == [("open", T0 + END_S)], written
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["findings"].get("incident") == 1
    assert summary["input_problems"] == 1
    said = " ".join(result.output.split())  # (rich wraps the summary at the terminal's width)
    assert "1 dated after the last telemetry (still queued): not grouped" in said
