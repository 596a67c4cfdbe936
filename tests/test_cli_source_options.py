"""``record``, ``watch`` and ``agent`` refuse an option of another source (--url, --executable,
--root, --interfaces, --path) rather than ignoring it (r61: ``--source infiniband --interfaces
mlx5_0`` polled every port without a word); options left unset never trip the check.

Every refused command fails at the check, before a source is opened, a server started or the
broker reached; ``--polls 1`` only bounds the run where the check is missing."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from foreshock.cli.agent import refuse_unread_options
from foreshock.cli.main import cli

NOWHERE = "/nonexistent/foreshock-h76"


def refused(result: Result) -> str:
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    return " ".join(result.output.partition("Error: ")[2].split())  # unwrapped


def record(tmp_path: Path, *args: str) -> Result:
    return CliRunner(env={"COLUMNS": "300"}).invoke(
        cli, ["record", "--polls", "1", "--interval", "0.02", "--out", str(tmp_path / "rec"), *args])


def watch(*args: str) -> Result:
    return CliRunner(env={"COLUMNS": "300"}).invoke(
        cli, ["watch", "--polls", "1", "--interval", "0.02", "--port", "0", *args])


def agent(*args: str) -> Result:
    # a broker no one listens on: without the check, the agent fails there (exit 1) instead
    return CliRunner(env={"COLUMNS": "300"}).invoke(
        cli, ["agent", "--kafka", "127.0.0.1:1", "--polls", "1", "--interval", "0.02", *args])


def test_record_refuses_the_options_nvidia_smi_does_not_read(tmp_path: Path) -> None:
    # r61's repro: each of the three was ignored; the first is named
    text = refused(record(tmp_path, "--source", "nvidia-smi", "--executable", NOWHERE,
                          "--url", "http://10.0.0.1:9400/metrics", "--root", NOWHERE, "--interfaces", "eth9"))
    assert text == "--url is read by --source dcgm / --source redfish / --source cdu only; " \
                   "--source nvidia-smi does not read it"
    assert not (tmp_path / "rec").exists()


def test_record_refuses_interfaces_for_infiniband_and_says_what_it_polls(tmp_path: Path) -> None:
    text = refused(record(tmp_path, "--source", "infiniband", "--root", str(tmp_path), "--interfaces", "mlx5_0"))
    assert text == "--interfaces is read by --source dom / --source ethtool only; " \
                   "--source infiniband polls every port under --root"


@pytest.mark.parametrize(("source", "option", "value"), [
    ("dcgm", "--root", NOWHERE),
    ("dcgm", "--executable", NOWHERE),
    ("ethtool", "--root", NOWHERE),
    ("infiniband", "--executable", NOWHERE),
    ("nvml", "--interfaces", "eth0"),
])
def test_watch_refuses_an_option_of_another_source(tmp_path: Path, source: str, option: str, value: str) -> None:
    source_args = {"dcgm": ["--url", "http://127.0.0.1:1/metrics"], "ethtool": ["--interfaces", "eth0"],
                   "infiniband": ["--root", str(tmp_path)], "nvml": []}[source]
    text = refused(watch("--source", source, *source_args, option, value))
    assert text.startswith(f"{option} is read by ") and f"; --source {source} " in text, text


@pytest.mark.parametrize(("source", "args", "option"), [
    ("infiniband", ["--root", NOWHERE, "--interfaces", "mlx5_0"], "--interfaces"),
    ("dcgm", ["--url", "http://127.0.0.1:1/metrics", "--path", "."], "--path"),
    ("replay", ["--path", ".", "--url", "http://127.0.0.1:1/metrics"], "--url"),
    ("simulator", ["--executable", NOWHERE], "--executable"),
])
def test_agent_refuses_an_option_of_another_source_before_reaching_the_broker(
        source: str, args: list[str], option: str) -> None:
    text = refused(agent("--source", source, *args))
    assert text.startswith(f"{option} is read by ") and f"; --source {source} " in text, text


@pytest.mark.parametrize(("source", "given"), [
    ("dcgm", {"url": "http://127.0.0.1:1/metrics"}),
    ("redfish", {"url": "node1=https://bmc1"}),
    ("cdu", {"url": "loop1=https://cdu1"}),
    ("nvidia-smi", {"executable": NOWHERE}),
    ("nvml", {}),
    ("infiniband", {"root": NOWHERE}),
    ("dom", {"executable": NOWHERE, "interfaces": "eth0"}),
    ("ethtool", {"executable": NOWHERE, "interfaces": "eth0"}),
    ("replay", {"path": NOWHERE}),
    ("simulator", {}),
])
def test_the_options_a_source_reads_and_those_left_unset_pass(source: str, given: dict[str, str]) -> None:
    unset: dict[str, str | None] = {name: None for name in ("path", "url", "executable", "root", "interfaces")}
    refuse_unread_options(source, **{**unset, **given})


def test_an_unset_option_a_source_needs_is_still_told_by_the_source(tmp_path: Path) -> None:
    # the check passes (nothing given); open_source's own "needs" message follows
    assert refused(record(tmp_path, "--source", "dom")) == "--source dom needs --interfaces eth0,eth1"


def test_the_check_raises_a_usage_error() -> None:
    with pytest.raises(click.UsageError, match="--root is read by --source infiniband only; --source dom"):
        refuse_unread_options("dom", interfaces="eth0", root="/sys")


def _cluster(tmp_path: Path) -> str:
    from foreshock.topology import Topology

    path = tmp_path / "cluster.yaml"
    Topology.from_gpu_hosts([("node7", 0), ("node8", 0)]).dump(path)
    return str(path)


def test_a_source_naming_this_machine_as_the_topology_does_not_is_refused(tmp_path: Path) -> None:
    """A host name read as ``node7.cluster.local`` against a file that says ``node7``: every row had
    been refused as an unknown entity (one log line), and ``watch`` waited for a first frame for
    ever (review r1, 2026-12-03). Refused before the source is opened, naming the likely name and
    the command's own option for it (``agent`` opens its sources the same way, once its broker
    answers)."""
    cluster = _cluster(tmp_path)
    text = refused(watch("--source", "nvml", "--topology", cluster, "--node", "node7.cluster.local"))
    assert text == ("--source nvml names this machine's rows 'node7.cluster.local', which the --topology file "
                    "does not list (its nodes: node7, node8): perhaps --node node7")
    text = refused(record(tmp_path, "--source", "nvidia-smi", "--topology", cluster, "--host", "gpu-box"))
    assert text.endswith("pass --host NAME as the file names this machine")
    assert not (tmp_path / "rec").exists()


def test_a_source_naming_this_machine_as_the_topology_does_passes_the_check(tmp_path: Path) -> None:
    # it goes on to open the source: no NVIDIA driver here, a clear error of another kind
    result = watch("--source", "nvml", "--topology", _cluster(tmp_path), "--node", "node7")
    assert "does not list" not in result.output
