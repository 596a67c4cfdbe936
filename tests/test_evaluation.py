"""The evaluation harness: scoring by hand-checked examples, time alignment, the CLI end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.detectors import evaluation as ev
from foreshock.events import Event
from foreshock.findings import Anomaly, Prediction
from foreshock.frames import Frame
from foreshock.recording import Recording, RecordingWriter

from thermal_synth import Fault, World, small_topology, write_recording

KIND = ev.EVENT_KINDS["thermal_throttle"]  # horizon 1800 s, merge 600 s, warm-up 600 s


def gpu_event(t, kind, gpu, fault=("", "")):
    return Event(float(t), kind, "gpu", f"node0/gpu{gpu}", *fault)


def pred(t, gpu, active=True, event="thermal_throttle"):
    return Prediction(float(t), "gpu", gpu, event, 60.0, 0.9, "thermal", "", active)


@pytest.fixture
def scored():
    topo = small_topology(nodes=1, gpus=4, racks=1)
    rec = Recording(Path("."), topo, {"faults": [{"id": "f1", "duration_s": None}]})
    tim, cool = ("f1", "tim_degradation"), ("f2", "cooling_loss")
    events = [
        Event(1000.0, "fault_onset", "gpu", "node0/gpu0", *tim),
        Event(7000.0, "fault_onset", "gpu", "node0/gpu1", *cool),
        gpu_event(5000, "thermal_throttle_start", 0, tim), gpu_event(5100, "thermal_throttle_end", 0, tim),
        gpu_event(5300, "thermal_throttle_start", 0, tim), gpu_event(5400, "thermal_throttle_end", 0, tim),
        gpu_event(8000, "thermal_throttle_start", 1, cool), gpu_event(8100, "thermal_throttle_end", 1, cool),
        gpu_event(300, "thermal_throttle_start", 2), gpu_event(400, "thermal_throttle_end", 2),  # warm-up
        gpu_event(6000, "power_cap_start", 3),  # another kind: ignored here
    ]
    findings = [
        pred(4000, 0), pred(4060, 0), pred(5600, 0, active=False),  # hit, lead 1000 s
        pred(5350, 0), pred(5360, 0, active=False),  # raised during the episode: not scored
        pred(7990, 1),  # hit, lead 10 s, open to the end
        pred(350, 2),  # during a warm-up episode: not scored
        pred(2000, 3), pred(2100, 3, active=False),  # a false alarm
        pred(9000, 3),  # open from 9000 to 13000: three horizons, three false statements
        pred(9500, 3, event="power_cap"),
        Anomaly(9000.0, "gpu", 3, "gpu_temp", 3.0, "cooling"),
    ]
    return ev.score_kind(findings, events, KIND, rec, 0.0, 13000.0)


def test_episodes_merge_gaps_and_keep_their_fault():
    eps = ev.episodes([gpu_event(5000, "thermal_throttle_start", 0), gpu_event(5100, "thermal_throttle_end", 0),
                       gpu_event(5699, "thermal_throttle_start", 0), gpu_event(5800, "thermal_throttle_end", 0),
                       gpu_event(6500, "thermal_throttle_start", 0, ("f1", "tim_degradation"))], KIND)
    assert [(e.start, e.end, e.fault_type) for e in eps] == [(5000, 5800, "none"), (6500, np.inf, "tim_degradation")]


def test_scores_by_hand(scored):
    # 2 scored episodes, both predicted; leads 1000 and 10 s; 2 true and 4 false statements
    assert scored["episodes"] == 2
    assert scored["recall"] == 1.0
    assert scored["precision"] == pytest.approx(2 / 6, abs=1e-4)
    assert scored["lead_median_s"] == pytest.approx(505.0)
    assert scored["lead_p10_s"] == pytest.approx(10 + 0.1 * 990)
    gpu_hours = 4 * 13000 / 3600
    assert scored["false_alarms_per_1000_gpu_hours"] == pytest.approx(4 / gpu_hours * 1000, abs=1e-3)
    by = scored["by_fault"]
    assert by["tim_degradation"]["episodes"] == 1 and by["tim_degradation"]["lead_median_s"] == 1000.0
    assert by["tim_degradation"]["precision"] == 1.0
    assert by["cooling_loss"]["recall"] == 1.0 and by["cooling_loss"]["lead_median_s"] == 10.0
    assert by["none"]["episodes"] == 0 and by["none"]["recall"] is None and by["none"]["precision"] == 0.0


def test_alarm_after_onset_predicts_nothing():
    topo = small_topology(nodes=1, gpus=4, racks=1)
    rec = Recording(Path("."), topo, {})
    events = [gpu_event(5000, "thermal_throttle_start", 0)]
    m = ev.score_kind([pred(5000, 0)], events, KIND, rec, 0.0, 9000.0)  # fires with the bit
    assert m["recall"] == 0.0 and m["precision"] is None and m["lead_median_s"] is None


def test_aligned_frames_never_read_the_future(tmp_path):
    topo = small_topology(nodes=1, gpus=2, racks=1)
    with RecordingWriter(tmp_path, topo, {"interval": 10.0}, rows_per_group=3) as w:
        for t in (0, 10, 20, 50, 60):  # a gap from 20 to 50
            w.write(Frame("rack", [t], [0], {"inlet_temp": [24.0 + t]}))
            w.write(Frame("gpu", [t, t], [0, 1], {"gpu_temp": [50.0, 51.0]}))
    rec = Recording.open(tmp_path)
    seen = [(f.kind, tuple(f.ts)) for f in ev.aligned_frames(rec, ("gpu", "rack"))]
    assert seen == [("rack", (0,)), ("gpu", (0, 0)), ("rack", (10,)), ("gpu", (10, 10)), ("rack", (20,)),
                    ("gpu", (20, 20)), ("rack", (50,)), ("gpu", (50, 50)), ("rack", (60,)), ("gpu", (60, 60))]


def test_report_shape_and_extension_point(tmp_path):
    topo = small_topology()
    path = tmp_path / "rec"
    write_recording(path, World(topo, seed=5, faults=[Fault("tim_degradation", 6, 1200, 1.2, "f1")]), 3 * 3600)
    ev.register_event_kind(ev.EventKind("toy", "toy_start", None, "toy", "gpu", horizon_s=60.0))
    try:
        rec = Recording.open(path)
        result = ev.run_recording(rec, ["foreshock", "threshold"], trace_gpus=ev.pick_trace_gpus(rec))
        report = ev.score(result)
    finally:
        del ev.EVENT_KINDS["toy"]
    assert set(report["detectors"]) == {"foreshock", "threshold"}
    for per_kind in report["detectors"].values():
        assert "toy" in per_kind and "thermal_throttle" in per_kind
        for metrics in per_kind.values():
            assert set(metrics) == set(ev.METRICS) | {"by_fault"}
            for sub in metrics["by_fault"].values():
                assert set(sub) == set(ev.METRICS)
    fs = report["detectors"]["foreshock"]["thermal_throttle"]
    th = report["detectors"]["threshold"]["thermal_throttle"]
    assert fs["episodes"] == 1 and fs["recall"] == 1.0 and fs["lead_median_s"] > th["lead_median_s"]
    written = ev.write_plots(result, report, tmp_path / "plots")
    assert (tmp_path / "plots" / "lead_times.png").stat().st_size > 1000
    assert any(p.name.startswith("gpu_node0_gpu6") for p in written)


def test_cli_evaluate_end_to_end(tmp_path):
    from foreshock.cli.main import cli

    topo = small_topology(nodes=2, gpus=4, racks=1)
    write_recording(tmp_path / "rec", World(topo, seed=8, faults=[Fault("tim_degradation", 2, 600, 1.5)]), 2 * 3600)
    result = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "rec"), "--detectors", "foreshock,threshold",
                                      "--report", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert summary["detectors"]["foreshock"]["thermal_throttle"]["recall"] == \
        report["detectors"]["foreshock"]["thermal_throttle"]["recall"] == 1.0
    assert (tmp_path / "out" / "lead_times.png").exists()
    bad = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "rec"), "--detectors", "sklearn",
                                   "--report", str(tmp_path / "out2")])
    assert bad.exit_code != 0 and "needs --model" in bad.output
