"""The cluster a live source's derived topology is named, and the node option's name.

``cluster`` had differed by source without a topology file (``imported`` for dcgm and nvidia-smi, the
host for InfiniBand, ``redfish`` for Redfish), so one node's GPU, IB and BMC watches landed in three
clusters of the rules that aggregate ``by (cluster)``, and nothing could set it: every source now
names it :data:`DERIVED_CLUSTER`, and ``--cluster`` (watch, record, agent, import) another; a
``--topology`` file's own name stands (``--cluster`` with it is refused). ``record`` named the node
``--host`` where ``watch`` says ``--node`` (its ``--host`` is the /metrics address): both take
``--node``, and ``record``'s ``--host`` stays a deprecated alias."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from foreshock.cli.main import cli
from foreshock.recording import Recording
from foreshock.streams.dcgm import DcgmScrapeSource
from foreshock.streams.infiniband import InfinibandSource
from foreshock.streams.nvidia_smi import NvidiaSmiSource
from foreshock.streams.polling import DERIVED_CLUSTER
from foreshock.streams.redfish import RedfishSource
from foreshock.topology import Topology
from test_fabric_sources_review import make_port
from test_streams_nvidia_smi import H200, make_stub

PAGE = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n1",UUID="GPU-0"} 41\n'


class _Page(DcgmScrapeSource):
    def scrape(self) -> str | None:
        return PAGE


def _derived(tmp_path: Path, shared_data: Path, cluster: str | None) -> dict[str, Topology | None]:
    """Each source's derived topology, named ``cluster`` where given (as the commands name it)."""
    stub, _ = make_stub(tmp_path, shared_data / H200)
    make_port(tmp_path / "ib", "mlx5_0", "1")
    sources = {"dcgm": _Page("http://exporter:9400/metrics", interval=1.0),
               "nvidia-smi": NvidiaSmiSource(str(stub), interval=1.0, host="n1"),
               "infiniband": InfinibandSource(str(tmp_path / "ib"), interval=1.0, host="n1"),
               "redfish": RedfishSource({"n1": "http://127.0.0.1:1"}, interval=1.0, user="u", password="p")}
    for source in sources.values():
        if cluster is not None:
            source.name_cluster(cluster)
        source.poll() if not isinstance(source, RedfishSource) else None
    return {name: source.topology for name, source in sources.items()}


def test_every_live_source_names_its_derived_cluster_alike(tmp_path: Path, shared_data: Path) -> None:
    topologies = _derived(tmp_path, shared_data, None)
    assert {name: t.cluster if t else None for name, t in topologies.items()} == dict.fromkeys(topologies,
                                                                                             DERIVED_CLUSTER)


def test_name_cluster_names_a_derived_topology_held_already_and_those_derived_later(tmp_path: Path,
                                                                                   shared_data: Path) -> None:
    topologies = _derived(tmp_path, shared_data, "c7")
    assert {name: t.cluster if t else None for name, t in topologies.items()} == dict.fromkeys(topologies, "c7")


def _record(tmp_path: Path, shared_data: Path, *args: str, out: str = "rec") -> Result:
    stub, _ = make_stub(tmp_path, shared_data / H200)
    return CliRunner().invoke(cli, ["record", "--source", "nvidia-smi", "--executable", str(stub), "--interval",
                                    "0.05", "--polls", "1", "--out", str(tmp_path / out), *args])


def test_record_takes_cluster_and_node(tmp_path: Path, shared_data: Path) -> None:
    result = _record(tmp_path, shared_data, "--cluster", "c7", "--node", "gpunode7")
    assert result.exit_code == 0, result.output
    topology = Recording.open(tmp_path / "rec").topology
    assert topology.cluster == "c7" and topology.gpus[0].startswith("gpunode7/")


def test_record_names_the_default_cluster_without_cluster(tmp_path: Path, shared_data: Path) -> None:
    result = _record(tmp_path, shared_data)
    assert result.exit_code == 0, result.output
    assert Recording.open(tmp_path / "rec").topology.cluster == DERIVED_CLUSTER


def test_record_keeps_host_as_a_deprecated_alias_of_node(tmp_path: Path, shared_data: Path) -> None:
    result = _record(tmp_path, shared_data, "--host", "gpunode7")
    assert result.exit_code == 0, result.output
    assert "--host NODE is deprecated, use --node NODE" in result.output
    assert Recording.open(tmp_path / "rec").topology.gpus[0].startswith("gpunode7/")
    result = _record(tmp_path, shared_data, "--host", "a", "--node", "b", out="rec2")
    assert result.exit_code == 2 and "--host is the old name of --node" in result.output


def test_cluster_is_refused_with_a_topology_file(tmp_path: Path, shared_data: Path) -> None:
    Topology.from_gpu_hosts([("n1", 0)], cluster="site").dump(tmp_path / "t.yaml")
    result = _record(tmp_path, shared_data, "--topology", str(tmp_path / "t.yaml"), "--node", "n1", "--cluster", "x")
    assert result.exit_code == 2 and "names its own" in result.output, result.output
    result = CliRunner().invoke(cli, ["watch", "--source", "dcgm", "--url", "http://127.0.0.1:1/metrics", "--polls",
                                      "1", "--port", "0", "--topology", str(tmp_path / "t.yaml"), "--cluster", "x"])
    assert result.exit_code == 2 and "names its own" in result.output, result.output


@pytest.mark.parametrize("value", ["", " ", " c7"])
def test_a_blank_or_padded_cluster_is_refused(tmp_path: Path, shared_data: Path, value: str) -> None:
    result = _record(tmp_path, shared_data, "--cluster", value)
    assert result.exit_code == 2 and "a cluster name" in result.output, result.output


def test_agent_takes_node_and_cluster_and_refuses_them_where_unread() -> None:
    def agent(*args: str) -> Result:
        return CliRunner().invoke(cli, ["agent", "--kafka", "127.0.0.1:1", *args])
    text = " ".join(agent("--source", "dcgm", "--url", "http://127.0.0.1:1/", "--node", "n7").output.split())
    assert "--node is read by --source nvidia-smi" in text, text
    text = " ".join(agent("--source", "replay", "--path", ".", "--cluster", "c7").output.split())
    assert "--cluster is read by" in text and "keeps the recording's topology" in text, text


def test_import_names_the_cluster_given(tmp_path: Path, shared_data: Path) -> None:
    capture = shared_data / "nvidia-smi" / "linux-x86_64__nvidia-h200__590.48.01.txt"
    result = CliRunner().invoke(cli, ["import", "--format", "nvidia-smi", str(capture), "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert Recording.open(tmp_path / "a").topology.cluster == "imported"  # (as before)
    result = CliRunner().invoke(cli, ["import", "--format", "nvidia-smi", str(capture), "--node", "n1", "--cluster",
                                      "c7", "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    topology = Recording.open(tmp_path / "b").topology
    assert topology.cluster == "c7" and topology.gpus == ["n1/gpu0"]


def test_watch_names_its_derived_cluster(tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from foreshock.cli import watch

    built: list[Topology] = []
    build = watch.build_pipeline

    def capture(topology: Topology, *args: Any, **kwargs: Any) -> Any:
        built.append(topology)
        return build(topology, *args, **kwargs)

    monkeypatch.setattr(watch, "build_pipeline", capture)
    stub, _ = make_stub(tmp_path, shared_data / H200)
    result = CliRunner().invoke(cli, ["watch", "--source", "nvidia-smi", "--executable", str(stub), "--interval",
                                      "0.05", "--polls", "2", "--port", "0", "--node", "gpunode7", "--cluster", "c7"])
    assert result.exit_code == 0, result.output
    assert [t.cluster for t in built] == ["c7"] and built[0].gpus[0].startswith("gpunode7/")
