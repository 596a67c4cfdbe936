"""`foreshock demo`: the simulated cooling fault shows up as findings on that loop's GPUs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.simulator import ClusterSimulator

pytestmark = pytest.mark.slow  # long end-to-end runs

ARGS = ["--gpus", "128", "--duration", "5400", "--interval", "10", "--seed", "3", "--scenario", "cooling-loss"]


def test_demo_finds_the_cooling_fault_on_the_affected_racks(tmp_path) -> None:
    findings_path = tmp_path / "findings.jsonl"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["demo", *ARGS, "--port", "0", "--findings", str(findings_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["name"] == "demo" and summary["samples"] > 0
    assert "foreshock summary" in result.output and "cooling_loss" in result.output
    # the simulator's deliberate failed scrapes are said to be so, before the summary counts them
    assert "drops 0.05% of samples as failed scrapes" in result.output
    assert summary["input_problems"] > 0

    # the same seed gives the same cluster and fault: find which GPUs the fault hits
    sim = ClusterSimulator(gpus=128, scenario="cooling-loss", seed=3, interval=10, duration=5400)
    (fault,) = sim.faults
    topo = sim.topology
    loop = topo.loops.index(fault.target_name)
    affected = set(np.flatnonzero(topo.rack_loop[topo.gpu_rack] == loop).tolist())
    findings = [json.loads(line) for line in findings_path.read_text().splitlines()]
    onset = summary["telemetry_start"] + fault.onset
    after = [f for f in findings if f["ts"] >= onset and f.get("entity_kind") == "gpu"
             and (f["type"] == "prediction" or f.get("field") in ("gpu_temp", "hbm_temp"))]
    flagged = {f["slot"] for f in after}
    assert flagged & affected, "no thermal finding on the GPUs the cooling loss hits"
    hits = len(flagged & affected) / len(affected)
    false = len(flagged - affected) / max(1, topo.size("gpu") - len(affected))
    assert hits >= 0.5 and false <= 0.1, (hits, false)
