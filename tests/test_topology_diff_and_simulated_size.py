"""``topology diff`` where OLD has none of a kind NEW adds, and the largest simulated cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.simulator.topology_gen import MAX_GPUS, cluster_size_problem

BASE = ("cluster: c\nrows: [{name: row0, cooling_loop: cdu0}]\nracks: [{name: rack0, row: row0}]\n"
        "nodes: [{name: node0, rack: rack0, gpus: 2}]\n")
LINKS = ("switches: [{name: leaf0, tier: leaf, rail: 0}]\n"
         "links: [{name: node0/gpu0~leaf0, a: node0/gpu0, b: leaf0},\n"
         "        {name: node0/gpu1~leaf0, a: node0/gpu1, b: leaf0}]\n")


@pytest.mark.parametrize("old, new, kind, added", [
    (BASE, BASE + LINKS, "link", 2),  # the fabric described for the first time
    (BASE, BASE + LINKS, "optic", 4),
    (BASE.replace("gpus: 2", "gpus: 0"), BASE, "gpu", 2),  # a node's GPUs fitted
])
def test_topology_diff_when_old_has_none_of_a_kind_new_adds(tmp_path: Path, old: str, new: str, kind: str,
                                                            added: int) -> None:
    """Indexing OLD's empty partition array raised an IndexError (a traceback)."""
    (tmp_path / "old.yaml").write_text(old)
    (tmp_path / "new.yaml").write_text(new)
    res = CliRunner().invoke(cli, ["topology", "diff", str(tmp_path / "old.yaml"), str(tmp_path / "new.yaml")])
    assert res.exit_code == 0, res.output
    summary: dict[str, Any] = json.loads(res.output.strip().splitlines()[-1])
    assert summary[kind] == {"old": 0, "new": added, "kept": 0, "moved_partition": 0, "added": added, "removed": 0}
    assert summary["rack"]["kept"] == 1 and summary["node"]["kept"] == 1


def test_simulated_cluster_size_has_an_upper_bound() -> None:
    assert MAX_GPUS >= 8 * 16_384 and MAX_GPUS % 8 == 0  # well above the 16,384-GPU clusters benched
    assert cluster_size_problem(MAX_GPUS) is None
    problem = cluster_size_problem(MAX_GPUS + 8)
    assert problem is not None and f"at most {MAX_GPUS:,} GPUs" in problem


@pytest.mark.parametrize("command", [
    ["simulate", "--duration", "10", "--out", "/nonexistent/foreshock-size"],
    ["demo", "--duration", "10", "--port", "0"],
], ids=["simulate", "demo"])
def test_a_typo_sized_cluster_is_a_usage_error_not_a_memory_error(command: list[str]) -> None:
    """`--gpus 1000000000` (for 1000) passed and built node dicts until a MemoryError."""
    res = CliRunner(env={"COLUMNS": "300"}).invoke(cli, [*command, "--gpus", "1000000000"])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    text = " ".join(res.output.split())
    assert f"Invalid value for '--gpus': must be at most {MAX_GPUS:,} GPUs" in text and "not 1,000,000,000" in text


def test_a_scenario_default_past_the_bound_is_refused() -> None:
    from foreshock.simulator.scenario import ScenarioError, scenario_from_dict

    with pytest.raises(ScenarioError, match=f"defaults: gpus must be at most {MAX_GPUS:,} GPUs"):
        scenario_from_dict({"name": "x", "defaults": {"gpus": 10**9}, "faults": []})
