"""Audit s63 (CLI): ``simulate --out`` and ``import --out`` replaced a recording already in the
folder without a word (``record`` refused it), through one check that ``record`` shares; and
``incidents`` printed raw scores ("right for - faults", "member recall None")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from foreshock.cli.main import cli
from foreshock.recording import Recording

H200 = Path("nvidia-smi") / "linux-x86_64__nvidia-h200__590.48.01.txt"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def simulate(out: Path, *extra: str, duration: str = "60") -> Result:
    return invoke("simulate", "--scenario", "psu-failure", "--gpus", "16", "--duration", duration, "--interval", "10",
                  "--out", str(out), "--no-progress", *extra)


def files_of(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    out = tmp_path / "rec"
    result = simulate(out, duration="120")
    assert result.exit_code == 0, result.output
    assert (out / "events.jsonl").is_file() and (out / "link.parquet").is_file()
    return out


def refused(result: Result, out: Path, overwrite: bool = True) -> None:
    assert result.exit_code == 2, result.output
    assert f"{out} already holds a recording" in result.output and "choose a new folder" in result.output
    assert ("--overwrite" in result.output) is overwrite
    assert "Traceback" not in result.output


def test_simulate_refuses_a_folder_holding_a_recording(recording: Path) -> None:
    before = files_of(recording)
    refused(simulate(recording, duration="60"), recording)
    assert files_of(recording) == before  # the 120-s recording, untouched
    assert Recording.open(recording).meta["duration"] == 120.0


def test_simulate_overwrite_replaces_it(recording: Path) -> None:
    result = simulate(recording, "--overwrite", duration="60")
    assert result.exit_code == 0, result.output
    assert Recording.open(recording).meta["duration"] == 60.0


def test_simulate_takes_an_empty_folder_and_one_of_other_files_once(tmp_path: Path) -> None:
    """Refused is a folder holding a recording, not a folder that exists: an empty one (made by
    mkdir or a script) and one holding other files are written; the second run into them is refused."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert simulate(empty).exit_code == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    assert simulate(other).exit_code == 0
    assert (other / "notes.txt").read_text() == "mine\n" and (other / "recording.json").is_file()
    for out in (empty, other):
        refused(simulate(out, duration="30"), out)
        assert Recording.open(out).meta["duration"] == 60.0


def test_a_recording_without_its_list_is_still_one(recording: Path) -> None:
    """A recorder killed before its first commit leaves parts and no recording.json: it is read
    from its parts (``Recording.open``), so it is no folder to write over either."""
    (recording / "recording.json").unlink()
    before = files_of(recording)
    refused(simulate(recording), recording)
    assert files_of(recording) == before


def test_import_refuses_a_folder_holding_a_recording(recording: Path, shared_data: Path) -> None:
    before = files_of(recording)
    result = invoke("import", "--format", "nvidia-smi", str(shared_data / H200), "--out", str(recording))
    refused(result, recording)
    assert files_of(recording) == before  # its ground truth and its other kinds' parts kept


def test_import_overwrite_replaces_it(recording: Path, shared_data: Path) -> None:
    result = invoke("import", "--format", "nvidia-smi", str(shared_data / H200), "--out", str(recording),
                    "--overwrite", "--host", "h200")
    assert result.exit_code == 0, result.output
    rec = Recording.open(recording)
    assert rec.meta["source"] == "import:nvidia-smi" and rec.kinds() == ["gpu"]
    assert not (recording / "events.jsonl").exists()


def test_import_takes_an_empty_folder_once(tmp_path: Path, shared_data: Path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    args = ("import", "--format", "nvidia-smi", str(shared_data / H200), "--out", str(out), "--host", "h200")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert Recording.open(out).kinds() == ["gpu"]
    refused(invoke(*args), out)  # the same command again: the import it wrote is a recording


def test_record_refuses_a_recording_by_its_parts_too(recording: Path) -> None:
    """``record`` shares the check: a folder of parts without recording.json was taken and cleared
    (it looked for recording.json alone). It has no --overwrite: live telemetry cannot be made again."""
    (recording / "recording.json").unlink()
    before = files_of(recording)
    result = invoke("record", "--source", "nvidia-smi", "--executable", "/bin/false", "--polls", "1",
                    "--out", str(recording))
    refused(result, recording, overwrite=False)
    assert files_of(recording) == before


def test_incidents_says_scores_with_nothing_to_score_plainly(tmp_path: Path) -> None:
    """A fault with no consequence yet (a TIM wearing for 10 minutes, nothing throttled): no fault
    is scored. It printed "root cause right for - faults with consequences; member recall None"."""
    out = tmp_path / "tim"
    result = invoke("simulate", "--scenario", "tim-degradation", "--gpus", "16", "--duration", "600",
                    "--interval", "10", "--out", str(out), "--no-progress")
    assert result.exit_code == 0, result.output
    result = invoke("incidents", str(out), "--no-progress")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["faults"] == 0 and summary["faults_total"] == 1 and summary["member_recall"] is None
    text = " ".join(result.output.split())  # (rich may wrap the line)
    assert "None" not in text and "right for -" not in text
    assert "0 faults with consequences (1 injected)" in text
    assert "member recall —" in text


def test_a_negative_top_k_is_refused() -> None:
    """(audit /tmp/s63/audit_ux/) ``--top-k -3`` was taken (read as 0, said nowhere)."""
    result = CliRunner().invoke(cli, ["demo", "--top-k", "-3", "--port", "0"])
    assert result.exit_code == 2 and "--top-k" in result.output
