"""``foreshock import``: real captures -> recordings that read back with the exact values."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from foreshock.cli.import_cmd import command
from foreshock.recording import Recording


def run(*args: str) -> str:
    result = CliRunner().invoke(command, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_import_dcgm(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    text = run("--format", "dcgm", str(shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom"), "--out", str(out),
               "--time", "2026-07-01T00:00:00Z")
    assert "unmapped metric ignored" in text and "gpu" in text
    rec = Recording.open(out)
    assert rec.meta["source"] == "import:dcgm"
    frame = rec.read_kind("gpu")
    slot = rec.topology.slot("gpu", "424773df46e0/gpu0")
    row = int(np.flatnonzero(frame.slot == slot)[0])
    assert frame.ts[row] == datetime(2026, 7, 1, tzinfo=timezone.utc).timestamp()
    assert (frame.columns["sm_clock"][row], frame.columns["gpu_temp"][row], frame.columns["power"][row]) == (
        3.0e8, 25.0, 8.969)
    assert frame.columns["energy"][row] == 128996.013


def test_import_nvidia_smi_capture_takes_every_query_gpu_section(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    run("--format", "nvidia-smi", str(shared_data / "nvidia-smi" / "linux-x86_64__nvidia-h200__590.48.01.txt"),
        "--out", str(out), "--host", "h200")
    frame = Recording.open(out).read_kind("gpu")
    assert len(frame) == 2  # idle, then load
    assert frame.columns["throttle_reasons"].tolist() == [1.0, 0.0]
    assert frame.columns["power"].tolist() == [77.71, 627.40]
    assert frame.columns["sm_clock"].tolist() == [345e6, 1.98e9]


def test_import_dmon_capture(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    text = run("--format", "dmon", str(shared_data / "nvidia-smi" / "linux-x86_64__nvidia-h200__590.48.01.txt"),
               "--out", str(out))
    assert "no input problems" in text
    rec = Recording.open(out)
    frame = rec.read_kind("gpu")
    start = datetime(2026, 7, 3, 22, 10, 45, tzinfo=timezone.utc).timestamp()  # collected_at
    assert frame.ts.tolist() == [start + k for k in range(10)]
    assert frame.columns["power"][5:].tolist() == [630.0, 628.0, 629.0, 632.0, 630.0]
    assert (frame.columns["gpu_temp"][5], frame.columns["hbm_temp"][5], frame.columns["sm_clock"][5]) == (
        53.0, 41.0, 1.98e9)
    assert rec.meta["interval"] == 1.0


def test_import_alibaba(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    text = run("--format", "alibaba", str(shared_data / "optics" / "alibaba_prefec_ber.csv"), "--out", str(out))
    assert "blank row" in text and "stats_type max" in text
    rec = Recording.open(out)
    frame = rec.read_kind("optic")
    assert len(frame) == 10322 and len(np.unique(frame.slot)) == 50
    assert rec.meta["interval"] == 3600.0
    assert len(rec.topology.links) == 25


def test_import_sysfs_tree(tmp_path: Path) -> None:
    port = tmp_path / "ib" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    for name in ("port_xmit_data", "port_rcv_data", "port_xmit_wait", "symbol_error", "link_downed",
                 "link_error_recovery", "port_rcv_errors", "port_xmit_discards",
                 "excessive_buffer_overrun_errors", "local_link_integrity_errors"):
        (port / "counters" / name).write_text("10\n")
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    out = tmp_path / "rec"
    run("--format", "sysfs", str(tmp_path / "ib"), "--out", str(out), "--host", "gpu-node-1", "--time",
        "2026-01-01T00:00:00")
    rec = Recording.open(out)
    frame = rec.read_kind("link")
    assert rec.topology.links == ["gpu-node-1/mlx5_0/1"]
    assert frame.columns["tx_data"].tolist() == [40.0] and frame.columns["link_rate"].tolist() == [4e11]


def test_import_jsonl_counts_rejected_records(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    records = [{"kind": "gpu", "entity": "n1/gpu0", "ts": 10.0, "gpu_temp": 50},
               {"kind": "gpu", "entity": "n1/gpu1", "ts": 10.0, "power": 300.5},
               {"kind": "gpu", "entity": "n1/gpu0", "ts": 11.0, "gpu_temp": "hot"},
               {"kind": "gpu", "entity": "n1/gpu0", "ts": 12.0, "wattage": 1}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n{not json\n")
    out = tmp_path / "rec"
    text = run("--format", "jsonl", str(path), "--out", str(out))
    assert "non-numeric field value" in text and "invalid JSON line" in text and "unknown fields" in text
    frame = Recording.open(out).read_kind("gpu")
    assert len(frame) == 2
    assert frame.columns["power"][1] == 300.5


def test_bad_arguments_give_clear_errors(tmp_path: Path) -> None:
    result = CliRunner().invoke(command, ["--format", "dcgm", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "does not exist" in result.output
    empty = tmp_path / "empty.prom"
    empty.write_text("# nothing here\n")
    result = CliRunner().invoke(command, ["--format", "dcgm", str(empty), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "no GPU samples" in result.output
