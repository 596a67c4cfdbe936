"""Bad outputs and bad numbers fail up front with an ``Error:`` line, never a traceback and never
after a long run (evaluate, train, simulate, replay, incidents)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from foreshock.cli import evaluate, incidents, replay, simulate, train
from foreshock.recording import RecordingWriter


def invoke(command: object, *args: str) -> Result:
    return CliRunner().invoke(command, list(args))  # type: ignore[arg-type]


def refused(result: Result, code: int = 1) -> str:
    assert result.exit_code == code and isinstance(result.exception, SystemExit), result.output
    return result.output


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "afile"
    path.write_text("")
    return path


def test_evaluate_checks_the_report_folder_before_the_run(empty_recording, a_file: Path) -> None:
    rec = empty_recording("gpu", 30.0)
    text = refused(invoke(evaluate.command, str(rec.path), "--detectors", "foreshock", "--report",
                          str(a_file / "sub"), "--no-plots"))
    assert "cannot create the report folder" in text


def test_train_checks_the_model_folder_before_the_run(empty_recording, a_file: Path) -> None:
    rec = empty_recording("gpu", 30.0)
    text = refused(invoke(train.command, str(rec.path), "--out", str(a_file / "sub" / "model.skops")))
    assert "cannot create the folder" in text


def test_simulate_checks_the_out_folder_before_the_run(a_file: Path) -> None:
    text = refused(invoke(simulate.command, "--gpus", "8", "--duration", "2", "--no-progress",
                          "--out", str(a_file / "sub")))
    assert "cannot create" in text


@pytest.mark.parametrize("option", ["--duration", "--interval", "--physics-dt", "--fault-acceleration"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_simulate_refuses_non_finite_numbers(option: str, value: str, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    text = refused(invoke(simulate.command, "--gpus", "8", "--duration", "2", "--no-progress", option, value,
                          "--out", str(out)), code=2)
    assert option in text and "finite" in text
    assert not out.exists()


@pytest.mark.parametrize("args", [["--speed", "nan"], ["--speed", "inf"], ["--hold", "nan"]])
def test_replay_refuses_non_finite_numbers(args: list[str], empty_recording) -> None:
    rec = empty_recording("gpu", 30.0)
    text = refused(invoke(replay.command, str(rec.path), "--port", "0", *args), code=2)
    assert args[0] in text and "finite" in text


def test_incidents_runs_on_an_empty_recording(small_topology, tmp_path: Path) -> None:
    with RecordingWriter(tmp_path / "rec", small_topology):
        pass  # no frames: recording.json holds "start": null, "end": null
    assert json.loads((tmp_path / "rec" / "recording.json").read_text())["start"] is None
    result = invoke(incidents.command, str(tmp_path / "rec"), "--no-progress")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["incidents_total"] == 0
