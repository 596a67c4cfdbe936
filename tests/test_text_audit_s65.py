"""Texts that contradicted themselves or the facts (audit s65): an HBM fault re-firing under a loop's
incident named as a thermal interface's, a resistance at nominal read "-0% vs nominal", job rows
said both fed and not fed, and a fault listed under an incident beside "0 incidents merging".

Topology (tests/test_incidents.py): cdu0 cools rack0 and rack1, two nodes of 4 GPUs per rack.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from rich.console import Console

from foreshock.detectors.incident_eval import score_incidents
from foreshock.events import Event
from foreshock.findings import Finding, Incident, Prediction

from test_incidents import TOPO, gpu
from test_incidents_refire import LOOP_GPUS, T0, loop_spreading_with_a_second_cause, run

HBM_GPU = gpu(1, 1)  # a GPU of the loop's incident, quiet after the loop's first failure


def hbm_under_loop() -> list[Finding]:
    """cdu0 loses flow at 0 s (until 300 s) and keeps spreading from 1000 s, so its incident still
    grows and holds its GPUs; at 1500 s the HBM of node1/gpu1, a member quiet since 330 s, heads for
    its limit: a new cause under the incident, noted in its reason."""
    def hbm_heats(t: int) -> list[Finding]:
        return [Prediction(T0 + t, "gpu", HBM_GPU, "hbm_overheat", 600.0, 0.9, "thermal", "HBM heading for 95 °C")]

    stream = loop_spreading_with_a_second_cause(hbm_heats)
    return run(stream, 3000.0)


def test_new_cause_note_names_an_hbm_fault_as_the_open_path_does() -> None:
    """The note took its label from the (family, level) table alone: "(tim_degradation)" for a GPU
    whose HBM overheats, where an incident opened on it says hbm_overheat."""
    out = hbm_under_loop()
    notes = [i.reason for i in out if isinstance(i, Incident) and "new cause at" in i.reason]
    assert notes, [(i.ts - T0, i.incident_id, i.reason) for i in out if isinstance(i, Incident)]
    assert "gpu node1/gpu1 (hbm_overheat), 1 member" in notes[0], notes[0]
    assert not any("tim_degradation" in n for n in notes)


def test_fault_listed_through_a_refire_note_is_marked_beside_the_merge_count() -> None:
    """The loop's fault and the HBM fault both list inc-1 while the footer says 0 incidents merge
    independent faults: the HBM fault holds no share of the incident's members, only its note."""
    from foreshock.cli.incidents import render_truth

    events = [Event(T0, "fault_onset", "loop", "cdu0", "f1", "cooling_loss", {"duration_s": 400.0}),
              Event(T0 + 1500.0, "fault_onset", "gpu", "node1/gpu1", "f2", "hbm_overheat", {"duration_s": 400.0})]
    events += [Event(T0 + 200.0, "thermal_throttle_start", "gpu", TOPO.gpus[g], "f1", "cooling_loss", {})
               for g in LOOP_GPUS[:3]]
    report = score_incidents(hbm_under_loop(), events, TOPO)
    rows = {r["fault"]: r for r in report["by_fault"]}
    assert "inc-1" in rows["f1"]["incidents"] and rows["f2"]["incidents"] == ["inc-1"], rows
    assert report["merged_independent_faults"] == 0
    buf = io.StringIO()
    render_truth(Console(file=buf, width=400), report, T0)
    lines = buf.getvalue().splitlines()
    f1 = next(x for x in lines if "│ f1 " in x)
    f2 = next(x for x in lines if "│ f2 " in x)
    assert "inc-1 (re-fire note)" in f2, f2
    assert "re-fire note" not in f1, f1
    assert ("0 incidents merging independent faults (a fault counts when it holds at least 10% of an "
            "incident's members, not through a re-fire note)") in " ".join(buf.getvalue().split())


def test_thermal_reason_at_nominal_resistance_reads_no_minus_zero() -> None:
    """An HBM forecast whose fitted R is 0.1 % under nominal read "(-0% vs nominal)"."""
    from foreshock.detectors import alarm
    from foreshock.detectors import thermal as th
    from foreshock.facts import HBM_THERMAL_RESISTANCE_C_PER_W as R_NOM
    from thermal_synth import small_topology

    det = th.ThermalDetector(small_topology(nodes=1, gpus=2, racks=1))
    obs = tuple(np.array([T0, T0]) if i == 0 else np.array([0.0, 1.0]) if i == 1 else np.full(2, np.nan)
                for i in range(14))
    out = np.full((2, th.THERMAL_OUT_SIZE), np.nan)
    for row, r in enumerate((R_NOM * 0.999, R_NOM * 1.05)):
        out[row, [alarm.O_ROW, alarm.O_WHICH, alarm.O_CODE, alarm.O_ETA, alarm.O_CONF]] = \
            (row, th.HBM, alarm.CODE_START, 300.0, 0.8)
        # target, slope (°C/s: -0.00001 rounds to -0.00 °C/min), inlet, R, tau, limit
        out[row, alarm.O_V0:alarm.O_V0 + 6] = (90.0, -1e-5, 30.0, r, 60.0, 95.0)
        out[row, th.O_INLET_SHARE] = 1.0
    at_nominal, above = (f.reason for f in det._findings(obs, out))
    assert "(at nominal)" in at_nominal and "-0" not in at_nominal, at_nominal
    assert "moving +0.00 °C/min" in at_nominal, at_nominal
    assert "(+5% vs nominal)" in above, above


def test_no_detector_reason_formats_a_signed_number_that_can_read_minus_zero() -> None:
    """Python writes -0.001 as "-0%" under "+.0%" and "-0.0" under "+.1f": a signed format in a
    detector's reason takes "z" (no negative zero), as thermal's "R ... (-0% vs nominal)" lacked."""
    root = Path(__file__).resolve().parents[1] / "detectors"
    bad = [(p.name, m.group(0)) for p in sorted(root.glob("*.py"))
           for m in re.finditer(r":\+\.\d+[%feg]\}", p.read_text())]
    assert not bad, bad


def test_evaluate_says_job_rows_go_to_the_incident_engine_not_that_they_are_not_fed() -> None:
    """`evaluate --telemetry gpu,job` printed "not fed: job 7,200" and "(telemetry fed: gpu, job)"
    in one line: the job rows reach the incident engine (step times), no detector."""
    from foreshock.cli.evaluate import samples_text
    from foreshock.detectors.evaluation import RunResult

    rec = SimpleNamespace(meta={"rows": {"gpu": 10_000, "job": 7_200, "link": 500}})
    engine = RunResult(rec, {}, [], T0, T0 + 1.0, 0.0, 9_990, telemetry=("gpu", "job"),  # type: ignore[arg-type]
                       incident_telemetry=("gpu", "job"), detector_kinds=("gpu",))
    text = samples_text(rec, engine)  # type: ignore[arg-type]
    assert "not fed: job" not in text, text
    assert text == ("9,990 samples fed to the detectors (of 17,700 recorded; job 7,200 to the incident engine only "
                    "(step times: its jobs' slowdown); not fed: link 500; set aside by the input guard: 10)"), text
    # no incident engine in the run (no foreshock set): the job rows are fed to nothing
    alone = RunResult(rec, {}, [], T0, T0 + 1.0, 0.0, 9_990, telemetry=("gpu",),  # type: ignore[arg-type]
                      detector_kinds=("gpu",))
    said = samples_text(rec, alone)  # type: ignore[arg-type]
    assert "not fed: job 7,200, link 500" in said, said
