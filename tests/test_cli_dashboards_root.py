"""``foreshock dashboards generate`` run outside the repository root: it wrote a second copy of the
generated files into whatever folder it ran in, and ``--check`` there called every file "out of
date" (they were missing) and asked to regenerate and commit (h22's README walk-through)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import foreshock
from foreshock.cli import dashboards
from foreshock.cli.main import cli
from foreshock.dashboards.generate import RULES_PATH

ROOT = Path(__file__).resolve().parents[1]


def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


@pytest.mark.parametrize("check", [False, True], ids=["generate", "check"])
def test_outside_a_checkout_without_root_it_refuses_and_writes_nothing(tmp_path: Path, monkeypatch,
                                                                       check: bool) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dashboards, "_installed_checkout", lambda: None, raising=False)  # as from a wheel
    result = CliRunner(env={"COLUMNS": "300"}).invoke(cli, ["dashboards", "generate"] + (["--check"] if check else []))
    assert result.exit_code == 2, result.output
    assert f"{tmp_path.resolve()} is not a foreshock checkout" in result.output and "--root" in result.output
    assert files_under(tmp_path) == []


def test_a_folder_with_the_same_layout_is_no_checkout(tmp_path: Path, monkeypatch) -> None:
    """An ops repository with its own dashboards/ and deploy/prometheus/ folders was taken for a
    checkout and written into (review h28)."""
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "deploy" / "prometheus").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dashboards, "_installed_checkout", lambda: None, raising=False)
    result = CliRunner(env={"COLUMNS": "300"}).invoke(cli, ["dashboards", "generate"])
    assert result.exit_code == 2 and "is not a foreshock checkout" in result.output, result.output
    assert files_under(tmp_path) == []


def test_outside_a_checkout_it_uses_the_checkout_foreshock_is_installed_from(tmp_path: Path, monkeypatch) -> None:
    if not Path(foreshock.__file__).resolve().is_relative_to(ROOT):
        pytest.skip("foreshock is not installed in editable mode from this checkout")
    monkeypatch.chdir(tmp_path)
    result = CliRunner(env={"COLUMNS": "300"}).invoke(cli, ["dashboards", "generate", "--check"])
    assert result.exit_code == 0, result.output
    assert f"using the one foreshock is installed from, {ROOT}" in " ".join(result.output.split())
    assert files_under(tmp_path) == []


def test_check_calls_a_missing_file_missing_and_names_the_root(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "300"})
    assert runner.invoke(cli, ["dashboards", "generate", "--root", str(tmp_path)]).exit_code == 0
    (tmp_path / RULES_PATH).unlink()
    (tmp_path / "dashboards/generated/foreshock-gpu.json").write_text("{}")
    result = runner.invoke(cli, ["dashboards", "generate", "--root", str(tmp_path), "--check"])
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert f"missing: {RULES_PATH}" in said and "out of date: dashboards/generated/foreshock-gpu.json" in said
    assert f"under {tmp_path.resolve()}: 1 missing, 1 out of date" in said
