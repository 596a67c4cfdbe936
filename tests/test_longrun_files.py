"""The findings file of a run of weeks: rotated under it, read while it is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

from foreshock.exporters.jsonl import JsonlSink
from foreshock.findings import Anomaly, Incident, Prediction, finding_from_dict
from foreshock.topology import Topology


def _anomaly(ts: float) -> Anomaly:
    return Anomaly(ts, "gpu", 0, "gpu_temp", 5.0, "univariate")


def test_a_findings_file_rotated_by_copytruncate_goes_on_from_its_start(tmp_path: Path) -> None:
    """logrotate's copytruncate (the way to rotate a file a process keeps open) truncates the file
    under the writer. The sink wrote on at its old offset: the file became a hole of NUL bytes as
    long as everything written before, then the new lines — as large as before the rotation, and
    no longer JSON lines. It appends: after the truncation the file holds the new lines only."""
    path = tmp_path / "findings.jsonl"
    path.write_text("an earlier run's findings\n")
    sink = JsonlSink(path)
    sink.observe_findings([_anomaly(float(t)) for t in range(100)])
    os.truncate(path, 0)  # copytruncate, after its copy
    sink.observe_findings([_anomaly(100.0), _anomaly(101.0)])
    sink.close()
    data = path.read_bytes()
    assert b"\0" not in data
    assert [json.loads(line)["ts"] for line in data.decode().splitlines()] == [100.0, 101.0]


def test_each_finding_is_in_the_file_once_written(tmp_path: Path) -> None:
    """A reader following the file (tail -f, a log shipper) saw findings only in 8 KB blocks —
    hours late on a quiet cluster — and a killed run lost the last block."""
    path = tmp_path / "findings.jsonl"
    sink = JsonlSink(path)
    sink.observe_findings([_anomaly(1.0)])
    assert json.loads(path.read_text())["ts"] == 1.0
    sink.close()


def test_each_finding_in_the_file_names_its_entity_and_reads_back(tmp_path: Path) -> None:
    """A finding carried only its slot ("slot": 9): a log shipper or a person reading the file
    needed the topology to know which GPU it meant. The sink names it beside the slot; the name
    does not get in the way of reading the finding back."""
    topology = Topology.from_gpu_hosts([(f"node{n}", g) for n in range(2) for g in range(8)])
    path = tmp_path / "findings.jsonl"
    sink = JsonlSink(path, topology)
    written = [Anomaly(1.0, "gpu", 9, "gpu_temp", 5.0, "univariate"),
               Prediction(2.0, "node", 0, "power_brake", 0.0, 0.9, "power"),
               Incident(3.0, "inc-1", "open", "node", "node1", "hot", members=("node1/gpu1",))]
    sink.observe_findings(written)
    sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.get("entity") for line in lines] == ["node1/gpu1", "node0", None]
    assert [finding_from_dict(line) for line in lines] == written
