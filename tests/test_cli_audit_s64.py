"""Audit s63 (CLI), left then: ``simulate --physics-dt 20 --interval 10`` ran with 10-s physics steps
without a word (the simulator caps its step at the interval): a coarser run than asked. An explicit
``--physics-dt`` over the interval is refused now; the default (1 s) still gives way to a shorter
interval."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from foreshock.cli.main import cli


def simulate(out: Path, *extra: str) -> Result:
    return CliRunner().invoke(cli, ["simulate", "--scenario", "psu-failure", "--gpus", "16", "--duration", "60",
                                    "--out", str(out), "--no-progress", *extra])


def test_a_physics_step_longer_than_the_interval_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    result = simulate(tmp_path / "rec", "--interval", "10", "--physics-dt", "20")
    assert result.exit_code == 2
    assert "--physics-dt" in result.output and "longer than the sampling interval (10 s)" in result.output
    assert not (tmp_path / "rec").exists()


def test_a_physics_step_within_the_interval_and_the_default_under_a_short_interval_run(tmp_path: Path) -> None:
    for name, extra in (("within", ("--interval", "10", "--physics-dt", "5")), ("default", ("--interval", "0.5"))):
        result = simulate(tmp_path / name, *extra)
        assert result.exit_code == 0, result.output
        meta = json.loads((tmp_path / name / "recording.json").read_text())
        assert meta["physics_dt"] == (5.0 if name == "within" else 0.5)
