"""The CLI audit of s62: a simulator interval with no upper limit (``demo --interval 1e7`` hung in one
tick, deaf to SIGTERM), unwritable outputs found by a traceback after the whole run (``train --out``,
``evaluate --report``), a suggested command that does not exist (``foreshock train no --telemetry``),
and one message ("record faults that cause it") for three causes of a class missing in training."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.detectors import baselines as bl
from foreshock.detectors import evaluation
from foreshock.detectors import train as tr
from foreshock.simulator import ClusterSimulator

ROOT = os.geteuid() == 0


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("s62") / "rec"
    result = CliRunner().invoke(cli, ["simulate", "--gpus", "16", "--duration", "600", "--interval", "10",
                                      "--no-progress", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A folder that exists and takes no file: /proc as root (whom no mode stops), else a read-only one."""
    if ROOT:
        yield Path("/proc")
        return
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    yield folder
    folder.chmod(0o755)


# -- 1. the simulator's interval: at most an hour, for every command that runs it ------------------------

def test_demo_refuses_an_interval_over_an_hour_at_once() -> None:
    """A subprocess with a timeout: before the fix the demo hung inside its first tick for hours."""
    began = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", "from foreshock.cli.main import cli; cli()", "demo", "--port",
                               "0", "--gpus", "16", "--duration", "600", "--interval", "1e7"],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("demo --interval 1e7 still running after 60 s")
    assert done.returncode == 2, done.stderr
    assert "--interval" in done.stderr and "3600" in _flat(done.stderr)
    assert time.monotonic() - began < 60


@pytest.mark.parametrize("command", [
    ["demo", "--port", "0", "--gpus", "16", "--duration", "600"],
    ["simulate", "--gpus", "16", "--duration", "600", "--out", "{out}"],
    ["agent", "--kafka", "127.0.0.1:1", "--source", "simulator"],  # refused before the broker is tried
])
def test_every_simulating_command_refuses_an_interval_over_an_hour(command: list[str], tmp_path: Path) -> None:
    args = [a.replace("{out}", str(tmp_path / "out")) for a in command]
    result = CliRunner(env={"COLUMNS": "300"}).invoke(cli, [*args, "--interval", "3600.5"])
    assert result.exit_code == 2, result.output
    assert "'--interval'" in result.output and "at most 3600" in _flat(result.output)
    assert not (tmp_path / "out").exists()


def test_the_simulator_itself_refuses_an_interval_over_an_hour() -> None:
    with pytest.raises(ValueError, match="at most 3600"):
        ClusterSimulator(gpus=8, interval=1e7, duration=60.0)
    assert ClusterSimulator(gpus=8, interval=3600.0, duration=7200.0).interval == 3600.0


# -- 2. unwritable outputs: refused up front, and a failed write told, not a traceback ------------------

def test_train_refuses_an_unwritable_model_folder_before_reading_anything(
        recording: Path, unwritable: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_training(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("trained before the model's folder was found unwritable")

    monkeypatch.setattr("foreshock.cli.train.train_and_save", no_training)
    result = CliRunner().invoke(cli, ["train", str(recording), "--events", "power_cap",
                                      "--out", str(unwritable / "m.skops")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"cannot write in the folder {unwritable}" in _flat(result.output)


def test_train_tells_a_model_write_that_fails_and_keeps_the_model_there(
        recording: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import skops.io

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def fake_train(_recordings: object, out: str, *_args: object) -> tuple[Path, dict[str, object]]:
        return bl.save_model(out, {}), {}

    out = tmp_path / "m.skops"
    out.write_bytes(b"the model of an earlier run")
    monkeypatch.setattr(skops.io, "dump", full)
    monkeypatch.setattr("foreshock.cli.train.train_and_save", fake_train)
    result = CliRunner().invoke(cli, ["train", str(recording), "--events", "power_cap", "--out", str(out)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"cannot write the model to {out}: No space left on device" in _flat(result.output)
    assert out.read_bytes() == b"the model of an earlier run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.skops"]  # no part file left


def test_evaluate_refuses_an_unwritable_report_folder_before_running(
        recording: Path, unwritable: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_run(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("ran before the report folder was found unwritable")

    monkeypatch.setattr(evaluation, "run_recording", no_run)
    result = CliRunner().invoke(cli, ["evaluate", str(recording), "--detectors", "threshold",
                                      "--report", str(unwritable), "--no-plots"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"cannot write in the report folder {unwritable}" in _flat(result.output)


def test_evaluate_tells_a_report_write_that_fails(recording: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(evaluation, "write_report", full)
    result = CliRunner().invoke(cli, ["evaluate", str(recording), "--detectors", "threshold",
                                      "--report", str(tmp_path / "rep"), "--no-plots"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"cannot write the report to {tmp_path / 'rep'}: No space left on device" in _flat(result.output)


# -- 3. the telemetry mismatch suggests a command that exists ---------------------------------------------

def test_a_model_of_gpu_telemetry_fed_racks_suggests_real_commands() -> None:
    said = bl.telemetry_mismatch("m.skops", ("gpu",), ("gpu", "rack"))
    assert said is not None
    assert "train no --telemetry" not in said
    assert "train one without --telemetry (`foreshock train REC... --out MODEL`)" in said
    assert "or run this with --telemetry gpu,job" in said
    other = bl.telemetry_mismatch("m.skops", ("gpu", "rack"), ("gpu",))
    assert other is not None and "`foreshock train REC... --telemetry gpu,job --out MODEL`" in other


# -- 4. a class missing in training: each cause told its own remedy ----------------------------------------

@pytest.mark.parametrize("telemetry", ["rack", "link,job"])
def test_train_refuses_telemetry_without_gpu_up_front(recording: Path, tmp_path: Path, telemetry: str) -> None:
    result = CliRunner().invoke(cli, ["train", str(recording), "--telemetry", telemetry,
                                      "--out", str(tmp_path / "m.skops")])
    assert result.exit_code == 2, result.output
    assert "the classifiers read GPU telemetry" in _flat(result.output)
    assert "record faults" not in result.output


def _dataset(labels: list[float]) -> tr.Dataset:
    n = len(labels)
    return tr.Dataset(np.zeros((n, len(bl.FEATURES))), {"thermal_throttle": np.array(labels, dtype=float)},
                      groups=np.arange(n, dtype=np.int64), weights=np.ones(n))


def test_no_negatives_names_the_horizon_not_the_faults() -> None:
    """Every negative censored (the recording no longer than the horizon): ``(499 positives of 499)``."""
    with pytest.raises(ValueError) as caught:
        tr.train(_dataset([1.0, 1.0, 1.0, np.nan, np.nan]), ["thermal_throttle"])
    said = str(caught.value)
    assert "no negative samples" in said and "(3 positives of 3)" in said
    assert "1800 s" in said and "longer recordings" in said
    assert "record faults" not in said


def test_no_samples_and_no_positives_are_told_apart() -> None:
    with pytest.raises(ValueError, match="no samples to learn 'thermal_throttle'.*GPU"):
        tr.train(_dataset([]), ["thermal_throttle"])
    with pytest.raises(ValueError, match=r"no positive samples .*\(0 positives of 3\); record faults that cause it"):
        tr.train(_dataset([0.0, 0.0, 0.0, np.nan]), ["thermal_throttle"])


def test_demo_refuses_a_duration_shorter_than_one_interval() -> None:
    """As simulate does: a 10-s demo sampled every 60 s ran one tick past the end asked (paced in real
    time: a minute) and said nothing of it."""
    result = CliRunner().invoke(cli, ["demo", "--duration", "10", "--interval", "60", "--port", "0", "--gpus", "16"])
    assert result.exit_code == 2, result.output
    assert "shorter than one sampling interval" in result.output
