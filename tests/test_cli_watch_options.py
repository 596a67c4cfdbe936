"""``foreshock watch``: the errors of its /metrics address and of ``--bmc`` / ``--cdu`` given a URL
alone name the option given and say what to give instead (h22's README walk-through)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from foreshock.cli.main import cli
from foreshock.topology import Topology

from local_http import ScrapeServer

PAGE = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="node7"} 41 %d\nDCGM_FI_DEV_GPU_TEMP{gpu="1",Hostname="node7"} 43 %d\n'


def watch(*args: str) -> Result:
    """A watch of a dcgm-exporter serving node7's two GPUs for three polls."""
    server = ScrapeServer([PAGE % (1000 + i, 1000 + i) for i in range(3)])
    try:
        return CliRunner(env={"COLUMNS": "300"}).invoke(
            cli, ["watch", "--source", "dcgm", "--url", server.url, "--interval", "0.02", "--polls", "3", *args])
    finally:
        server.close()


def refused(result: Result) -> str:
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    return result.output.partition("Error: ")[2]


@pytest.fixture
def node7_topology(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    Topology.from_gpu_hosts([("node7", 0), ("node7", 1)]).dump(path)  # its one loop: "unknown"
    return path


def test_a_metrics_host_that_is_no_address_here_names_host_and_node(tmp_path: Path) -> None:
    """``--host node7`` from a user meaning the node said "choose another --port"."""
    said = refused(watch("--host", "192.0.2.1", "--port", "19108"))
    assert said.startswith("cannot serve /metrics on 192.0.2.1:19108")
    assert "check --host, the address of this machine that /metrics binds to" in said
    assert "a node's name goes to --node" in said and "--port" not in said


def test_a_cdu_url_alone_names_cdu_only_and_says_how_to_name_its_loop(node7_topology: Path, tmp_path: Path) -> None:
    findings = tmp_path / "findings.jsonl"
    said = refused(watch("--topology", str(node7_topology), "--cdu", "http://127.0.0.1:1/", "--port", "0",
                         "--findings", str(findings)))
    assert said.startswith("--cdu: cooling loop '127.0.0.1' is not in the topology")
    assert "--bmc" not in said and "--cdu LOOP=URL" in said
    assert not findings.exists()  # refused before the pipeline opened its outputs


def test_a_named_cdu_loop_missing_from_the_topology_is_not_told_to_name_it(node7_topology: Path) -> None:
    said = refused(watch("--topology", str(node7_topology), "--cdu", "cdu9=http://127.0.0.1:1/", "--port", "0"))
    assert said.startswith("--cdu: cooling loop 'cdu9' is not in the topology") and "LOOP=URL" not in said


@pytest.mark.parametrize("node", [None, "node8"])
def test_a_bmc_url_alone_for_a_node_not_in_the_topology_says_where_its_name_came_from(
        tmp_path: Path, monkeypatch, node: str | None) -> None:
    """A URL alone is named after --node, else this machine's hostname; dcgm-exporter named the
    GPUs' node node7. The BMC's rows could never be read: it was accepted, and its rows were
    counted as an unknown node entity's at every poll."""
    monkeypatch.setattr("socket.gethostname", lambda: "login1")
    findings = tmp_path / "findings.jsonl"
    said = refused(watch("--bmc", "http://127.0.0.1:1/", "--port", "0", "--findings", str(findings),
                         *(["--node", node] if node else [])))
    named = node or "login1"
    assert said.startswith(f"--bmc: a URL alone is the BMC of node '{named}' "
                           f"({'--node' if node else 'no --node: this machine' + chr(39) + 's hostname'})")
    assert "(its nodes: node7)" in said and "--bmc NODE=URL" in said and "--cdu" not in said
    assert not findings.exists()


def test_watch_help_says_what_a_url_alone_means() -> None:
    text = " ".join(CliRunner(env={"COLUMNS": "300"}).invoke(cli, ["watch", "--help"]).output.split())
    assert "one URL alone: the BMC of the node --node names (default: this machine's hostname)" in text
    assert "(a URL alone names its loop after the URL's host name)" in text


def watch_down(*args: str) -> Result:
    """A watch of a dcgm-exporter that never answers (a closed port), for one poll."""
    return CliRunner(env={"COLUMNS": "300"}).invoke(
        cli, ["watch", "--source", "dcgm", "--url", "http://127.0.0.1:1/metrics", "--interval", "0.02", "--polls", "1",
              "--port", "0", *args])


@pytest.mark.parametrize("given, told", [
    (["--cdu", "https://cdu-a.example"], "--cdu: cooling loop 'cdu-a.example' is not in the topology"),
    (["--cdu", "cdu9=https://cdu-a.example"], "--cdu: cooling loop 'cdu9' is not in the topology"),
    (["--bmc", "http://127.0.0.1:1/", "--node", "node8"], "--bmc: a URL alone is the BMC of node 'node8' (--node)"),
], ids=["cdu-url-alone", "cdu-named", "bmc-url-alone"])
def test_with_a_topology_file_a_misnamed_bmc_or_cdu_is_refused_before_the_first_poll(
        node7_topology: Path, given: list[str], told: str) -> None:
    """The checks waited for the source's first frame: with the exporter down, the watch said only
    "no telemetry came from dcgm in N polls" (without --polls it waited until Ctrl-C) and never
    named the misnamed loop or node (review h28)."""
    said = refused(watch_down("--topology", str(node7_topology), *given))
    assert said.startswith(told) and "no telemetry" not in said


@pytest.mark.parametrize("bmc, told", [
    ("node8=http://127.0.0.1:1/", "--bmc: node 'node8' is not in the --topology file (its nodes: node7)"),
    ("node7=http://127.0.0.1:1/,node8=http://127.0.0.1:1/,node9=http://127.0.0.1:1/",
     "--bmc: nodes 'node8', 'node9' are not in the --topology file (its nodes: node7)"),
])
def test_with_a_topology_file_a_named_bmc_node_it_lacks_is_refused(node7_topology: Path, tmp_path: Path,
                                                                   bmc: str, told: str) -> None:
    """The file never grows: a BMC named for a node it lacks was started, and its rows counted as an
    unknown node entity's at every poll."""
    findings = tmp_path / "findings.jsonl"
    said = refused(watch_down("--topology", str(node7_topology), "--bmc", bmc, "--findings", str(findings)))
    assert said.startswith(told) and "add it to the file" in said
    assert not findings.exists()


def test_without_a_topology_file_a_named_bmc_node_not_yet_served_is_taken(tmp_path: Path) -> None:
    """A derived topology may grow (a node added later): a named BMC it lacks yet is no usage error."""
    result = watch("--bmc", "node8=http://127.0.0.1:1/", "--port", "0", "--findings", str(tmp_path / "f.jsonl"))
    assert result.exit_code == 0, result.output
    assert "and 1 BMC:" in result.output


@pytest.mark.parametrize("source, beside", [("redfish", "--bmc"), ("cdu", "--cdu")])
def test_a_bmc_or_cdu_source_with_more_of_the_same_beside_it_is_refused(source: str, beside: str) -> None:
    """Review r1 of e9ff698: `--source redfish --bmc` (or `cdu --cdu`) polled the same BMCs on two
    grids, each refusing the other's rows as out of order or as repeats wherever the grids came
    within a poll of each other. Refused, before any poll, saying to name them all in --url."""
    result = CliRunner(env={"COLUMNS": "300"}).invoke(
        cli, ["watch", "--source", source, "--url", "n1=http://127.0.0.1:1", "--polls", "1", "--port", "0",
              beside, "n1=http://127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert f"--source {source} polls them itself" in " ".join(result.output.split())
