"""Every option a command's --source does not read is refused, naming the option and the
source, rather than ignored (``agent --source nvml --gpus 512`` published one node's GPUs
without a word); an option left at its default never trips the check, whatever the default.
And a simulated cluster's size is told by one rule: ``demo``, ``simulate`` and ``agent --gpus``
refuse 12 GPUs with the same message a scenario's ``defaults`` gives.

Without the check, an agent reaches for the broker (none listens: exit 1) and a record or a
watch polls a port no one answers, or an empty sysfs, once (exit 1): a refusal is exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from foreshock.cli import agent
from foreshock.cli.main import cli

CLOSED = "http://127.0.0.1:1/metrics"


def refused(result: Result) -> str:
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    return " ".join(result.output.partition("Error: ")[2].split())  # unwrapped


def invoke(*args: str) -> Result:
    return CliRunner(env={"COLUMNS": "300"}).invoke(cli, list(args))


def run_agent(*args: str) -> Result:
    return invoke("agent", "--kafka", "127.0.0.1:1", *args)


@pytest.mark.parametrize(("source", "args", "option", "value"), [
    ("dcgm", ["--url", CLOSED], "--host", "node7"),
    ("nvml", [], "--speed", "2"),
    ("replay", ["--path", "."], "--interval", "1"),
    ("replay", ["--path", "."], "--polls", "1"),
    ("simulator", [], "--polls", "1"),
    ("simulator", [], "--now", None),
    ("nvml", [], "--gpus", "64"),  # the default, but given: the user meant something by it
    ("nvml", [], "--scenario", "healthy"),
    ("nvml", [], "--seed", "0"),
    ("nvml", [], "--duration", "60"),
])
def test_agent_refuses_an_option_its_source_does_not_read(source: str, args: list[str], option: str,
                                                          value: str | None) -> None:
    text = refused(run_agent("--source", source, *args, option, *([value] if value is not None else [])))
    assert text.startswith(f"{option} is read by --source ") and f" only; --source {source} " in text, text


def test_agent_tells_what_the_source_does_instead() -> None:
    text = refused(run_agent("--source", "dcgm", "--url", CLOSED, "--host", "node7"))
    assert text.endswith("; --source dcgm names each GPU's node by the exporter's Hostname label"), text
    text = refused(run_agent("--source", "replay", "--path", ".", "--interval", "1"))
    assert text.endswith("; --source replay keeps the recording's own timing (--speed paces it)"), text


@pytest.mark.parametrize(("argv", "unset"), [
    (["--source", "nvml"], ("host", "speed", "shift_now", "interval", "polls", "gpus", "scenario", "seed", "duration")),
    (["--source", "simulator"], ("speed", "shift_now", "gpus", "scenario", "seed", "duration")),
])
def test_options_left_at_their_default_are_not_given(argv: list[str], unset: tuple[str, ...]) -> None:
    # --gpus 64, --scenario healthy, --seed 0 and --now (False) have defaults that are not None
    ctx = agent.command.make_context("agent", ["--kafka", "127.0.0.1:1", *argv])
    given = agent.options_given(ctx, *unset)
    assert set(given.values()) == {None}, given
    agent.refuse_unread_options(argv[1], **given)


def test_options_given_are_keyed_by_their_flag() -> None:
    ctx = agent.command.make_context("agent", ["--kafka", "127.0.0.1:1", "--source", "nvml", "--now", "--gpus", "64",
                                               "--host", "n1"])
    assert agent.options_given(ctx, "shift_now", "gpus", "host", "seed") == {"now": True, "gpus": 64, "host": "n1",
                                                                            "seed": None}


@pytest.mark.parametrize("source", ["dcgm", "cdu"])
def test_record_refuses_host_for_a_source_that_names_its_nodes_itself(tmp_path: Path, source: str) -> None:
    url = {"dcgm": CLOSED, "cdu": "cdu0=http://127.0.0.1:1/"}[source]
    text = refused(invoke("record", "--source", source, "--url", url, "--host", "node7", "--polls", "1",
                          "--interval", "0.02", "--out", str(tmp_path / "rec")))
    assert text.startswith("--host is read by --source nvidia-smi / ") and f"only; --source {source} " in text, text
    assert not (tmp_path / "rec").exists()


def watch(*args: str) -> Result:
    return invoke("watch", "--polls", "1", "--interval", "0.02", "--port", "0", *args)


def test_watch_refuses_node_for_dcgm_without_a_bmc() -> None:
    text = refused(watch("--source", "dcgm", "--url", CLOSED, "--node", "node7"))
    assert text.startswith("--node is read by --source nvidia-smi / ") and "only; --source dcgm " in text, text


def test_watch_takes_node_for_dcgm_with_a_bmc_url_alone_to_name() -> None:
    # --node names the node of a --bmc URL alone: the check passes, the closed exporter ends the watch
    result = watch("--source", "dcgm", "--url", CLOSED, "--node", "node7", "--bmc", "http://127.0.0.1:1/")
    assert "is read by" not in result.output and result.exit_code == 1, result.output


def test_watch_refuses_forget_after_for_a_source_other_than_dcgm(tmp_path: Path) -> None:
    text = refused(watch("--source", "infiniband", "--root", str(tmp_path), "--forget-after", "600"))
    assert text == "--forget-after is read by --source dcgm only; --source infiniband does not read it", text


def test_watch_refuses_forget_after_with_a_topology_file(tmp_path: Path) -> None:
    from foreshock.topology import Topology

    topology = tmp_path / "cluster.yaml"
    Topology.from_gpu_hosts([("node7", 0)]).dump(topology)
    text = refused(watch("--source", "dcgm", "--url", CLOSED, "--topology", str(topology), "--forget-after", "600"))
    assert text.startswith("--forget-after is for a topology derived from the source"), text


SIZE_RULE = "must be a whole number of GPUs, at least 8 and a multiple of 8, not {}"


@pytest.mark.parametrize("gpus", ["12", "4"])
@pytest.mark.parametrize("command", [
    ["demo", "--duration", "10", "--port", "0"],
    ["simulate", "--duration", "10", "--out", "/nonexistent/foreshock-h82"],
    ["agent", "--kafka", "127.0.0.1:1", "--source", "simulator"],
], ids=["demo", "simulate", "agent"])
def test_every_command_sizing_a_simulated_cluster_tells_the_same_rule(command: list[str], gpus: str) -> None:
    text = refused(invoke(*command, "--gpus", gpus))
    assert text == "Invalid value for '--gpus': " + SIZE_RULE.format(gpus), text


def test_a_scenario_default_tells_the_same_rule() -> None:
    from foreshock.simulator.scenario import ScenarioError, scenario_from_dict
    from foreshock.simulator.topology_gen import cluster_size_problem

    assert cluster_size_problem(12) == SIZE_RULE.format(12)
    assert cluster_size_problem(True) == SIZE_RULE.format(True) and cluster_size_problem(8.0) is not None
    assert cluster_size_problem(8) is None and cluster_size_problem(16384) is None
    with pytest.raises(ScenarioError, match="defaults: gpus " + SIZE_RULE.format(12)):
        scenario_from_dict({"name": "x", "defaults": {"gpus": 12}, "faults": []})
