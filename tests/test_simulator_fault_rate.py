"""``--fault-acceleration``: the random-fault rate is FACTS' 6.5 failures per 1000 node-days
times the acceleration (25 by default, 1 = the real rate), from the command line to the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.recording import Recording
from foreshock.simulator import ClusterSimulator

FACTS_PER_NODE_S = 6.5 / 1000 / 86400  # FACTS: Meta research clusters (HPCA'25)


def test_the_engine_rate_is_facts_rate_times_the_acceleration() -> None:
    default = ClusterSimulator(gpus=64, seed=0, random_faults=True, warmup_s=0)
    real = ClusterSimulator(gpus=64, seed=0, random_faults=True, fault_acceleration=1, warmup_s=0)
    assert real.fault_rate == pytest.approx(8 * FACTS_PER_NODE_S)
    assert default.fault_rate == pytest.approx(25 * real.fault_rate)


def _simulate(out: Path, *extra: str) -> dict[str, float]:
    result = CliRunner().invoke(cli, ["simulate", "--gpus", "16", "--duration", "120", "--interval", "10", "--seed",
                                      "2", "--random-faults", "--out", str(out), "--no-progress", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_option_reaches_the_engine_and_changes_how_many_faults_arrive(tmp_path: Path) -> None:
    # 2 nodes x 120 s: at 1e6x FACTS' rate ~18 faults are drawn (some land on a target that is
    # already failing and are skipped); at the real rate the expectation is 4e-5, i.e. none.
    fast = _simulate(tmp_path / "fast", "--fault-acceleration", "1e6")
    real = _simulate(tmp_path / "real", "--fault-acceleration", "1")
    default = _simulate(tmp_path / "default")
    assert fast["faults"] >= 5
    assert real["faults"] == 0 and default["faults"] == 0
    assert Recording.open(tmp_path / "fast").meta["fault_acceleration"] == 1e6
    assert Recording.open(tmp_path / "real").meta["fault_acceleration"] == 1.0
    assert Recording.open(tmp_path / "default").meta["fault_acceleration"] == 25.0


def test_a_negative_acceleration_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["simulate", "--gpus", "16", "--duration", "10", "--out", str(tmp_path / "x"),
                                      "--fault-acceleration", "-1"])
    assert result.exit_code != 0 and "--fault-acceleration" in result.output
