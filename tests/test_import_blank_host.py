"""``foreshock import``: a GPU whose host is empty or blank (a jsonl entity ``/gpu0``, a dcgm series with
``Hostname=" "``) is counted as an unknown gpu entity, not fatal to the import of every other one
(the derived topology refused a node without a name); a malformed ``--topology`` file is a clean error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.import_cmd import command
from foreshock.streams.samples import GpuHostError, SampleBatch, gpu_topology, split_gpu_entity


def _problem_count(printed: str, stage: str, reason: str) -> int:
    """The count of a row of the printed problems table (0 where there is none)."""
    for line in printed.splitlines():
        cells = [cell.strip() for cell in line.split("│")]
        if len(cells) >= 4 and cells[1:3] == [stage, reason]:
            return int(cells[3])
    return 0


@pytest.mark.parametrize("name", ["/gpu0", " /gpu3", "\t/gpu1"])
def test_a_gpu_name_without_a_host_is_its_own_error(name: str) -> None:
    with pytest.raises(GpuHostError):
        split_gpu_entity(name)


def test_the_derived_topology_leaves_out_gpus_without_a_host() -> None:
    batch = SampleBatch("gpu", ["n0/gpu1", " /gpu0"], np.array([1.0, 1.0]), np.array([0, 1]))
    assert gpu_topology([batch]).gpus == ["n0/gpu0", "n0/gpu1"]


def test_jsonl_records_of_a_gpu_without_a_host_are_counted_and_the_rest_imported(tmp_path: Path) -> None:
    good = [{"kind": "gpu", "entity": "n0/gpu0", "ts": 1764892800 + i, "gpu_temp": 50} for i in range(1000)]
    bad = [{"kind": "gpu", "entity": entity, "ts": 1764892805, "gpu_temp": 50} for entity in ("/gpu0", " /gpu3")]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in good + bad))
    result = CliRunner().invoke(command, ["--format", "jsonl", str(path), "--out", str(tmp_path / "rec")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "rec").is_dir()
    assert _problem_count(result.output, "jsonl", "unknown gpu entity") == 2


def test_a_dcgm_series_with_a_blank_hostname_is_counted_and_the_rest_imported(tmp_path: Path) -> None:
    path = tmp_path / "scrape.prom"
    path.write_text('DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",Hostname="node7"} 25\n'
                    'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",Hostname=" "} 26\n')
    result = CliRunner().invoke(command, ["--format", "dcgm", str(path), "--out", str(tmp_path / "rec"),
                                          "--time", "2026-12-01T00:00:00"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "1 of 1" in result.output  # node7's GPU alone
    assert _problem_count(result.output, "import", "unknown gpu entity") == 1


def test_a_dcgm_scrape_whose_every_hostname_is_blank_is_a_clean_error(tmp_path: Path) -> None:
    path = tmp_path / "scrape.prom"
    path.write_text('DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",Hostname=" "} 26\n')
    result = CliRunner().invoke(command, ["--format", "dcgm", str(path), "--out", str(tmp_path / "rec"),
                                          "--time", "2026-12-01T00:00:00"])
    assert result.exit_code == 1 and not isinstance(result.exception, ValueError), result.output
    assert "no samples imported" in result.output
    assert _problem_count(result.output, "import", "unknown gpu entity") == 1
    assert not (tmp_path / "rec").exists()


def test_a_malformed_topology_file_is_a_clean_error_naming_it(tmp_path: Path) -> None:
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"kind": "gpu", "entity": "n0/gpu0", "ts": 1764892800, "gpu_temp": 50}) + "\n")
    topology = tmp_path / "topology.yaml"
    topology.write_text("cluster: c\nnodes: []\nnodes: []\n")  # a key given twice
    result = CliRunner().invoke(command, ["--format", "jsonl", str(data), "--topology", str(topology),
                                          "--out", str(tmp_path / "rec")])
    assert result.exit_code == 1, result.output
    assert not isinstance(result.exception, ValueError)  # (TopologyError is one: it had escaped as a traceback)
    assert str(topology) in result.output and "Error:" in result.output
