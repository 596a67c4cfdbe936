"""A recording has a ground truth only where its writer was given one (the simulator's events,
even none): a capture (``import``, ``record``) gets no ``events.jsonl``. Until 2026-12-03 every
writer left one, empty for captures, so ``evaluate`` took a real capture for a run in which nothing
happened (``ground_truth: true``, no warning) and scored every alarm on it as a false one unsaid."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from foreshock.cli import evaluate
from foreshock.cli.import_cmd import command as import_command
from foreshock.events import Event
from foreshock.frames import Frame
from foreshock.recording import EVENTS_FILE, Recording, RecordingWriter
from foreshock.topology import Topology


def _write(path: Path, topology: Topology, events: list[Event] | None) -> Recording:
    with RecordingWriter(path, topology, {"interval": 1.0}) as w:
        for t in range(5):
            w.write(Frame("gpu", np.full(4, 100.0 + t), np.arange(4), {"gpu_temp": np.full(4, 40.0)}))
        if events is not None:
            w.add_events(events)
    return Recording.open(path)


def test_only_a_writer_given_events_writes_an_events_file(tmp_path: Path, small_topology: Topology) -> None:
    assert not (_write(tmp_path / "capture", small_topology, None).path / EVENTS_FILE).exists()
    healthy = _write(tmp_path / "healthy", small_topology, [])  # a simulated run where nothing happened
    assert (healthy.path / EVENTS_FILE).read_text() == ""
    onset = Event(102.0, "fault_onset", "gpu", small_topology.gpus[0], "f1", "tim_degradation")
    assert _write(tmp_path / "faulty", small_topology, [onset]).events() == [onset]
    # a capture written into a simulated recording's folder does not keep the old ground truth
    assert not (_write(tmp_path / "faulty", small_topology, None).path / EVENTS_FILE).exists()


def test_an_imported_capture_is_evaluated_as_one_without_ground_truth(shared_data: Path, tmp_path: Path,
                                                                      caplog) -> None:
    out = tmp_path / "h200"
    result = CliRunner().invoke(import_command, [
        "--format", "nvidia-smi", str(shared_data / "nvidia-smi" / "linux-x86_64__nvidia-h200__590.48.01.txt"),
        "--out", str(out), "--time", "2026-07-01T00:00:00Z"])
    assert result.exit_code == 0, result.output
    assert not (out / EVENTS_FILE).exists()
    with caplog.at_level(logging.WARNING):
        result = CliRunner().invoke(evaluate.command, [str(out), "--detectors", "threshold", "--no-plots",
                                                       "--report", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "report" / "report.json").read_text())["meta"]["ground_truth"] is False
    assert any("no ground truth" in r.getMessage() for r in caplog.records)
