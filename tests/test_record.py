"""``foreshock record``: a live source polled into a recording folder that replays."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.recording import Recording
from test_streams_nvidia_smi import H200, make_stub


def test_record_nvidia_smi_polls_then_replay(tmp_path: Path, shared_data: Path) -> None:
    stub, calls = make_stub(tmp_path, shared_data / H200)
    out = tmp_path / "rec"
    runner = CliRunner()
    res = runner.invoke(cli, ["record", "--source", "nvidia-smi", "--executable", str(stub), "--interval", "0.05",
                              "--polls", "3", "--host", "h200-test", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["polls"] == 3 and summary["interrupted"] is False
    assert len(calls.read_text().splitlines()) == 3  # the executable really ran once per poll
    rec = Recording.open(out)
    frames = list(rec.iter_frames())
    gpu = np.concatenate([f.columns["gpu_temp"] for f in frames if f.kind == "gpu"])
    assert summary["samples"] == len(gpu) == 3 * rec.topology.size("gpu") > 0
    assert rec.topology.gpus[0].startswith("h200-test/")
    # the captured H200 ran steady at 53 °C under load (shared/data/nvidia-smi)
    assert np.nanmax(gpu) < 60 and np.nanmin(gpu) > 40
    res = runner.invoke(cli, ["replay", str(out), "--port", "0"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["samples"] == len(gpu)


def test_record_stops_at_duration_and_leaves_a_valid_recording(tmp_path: Path, shared_data: Path) -> None:
    stub, _ = make_stub(tmp_path, shared_data / H200)
    out = tmp_path / "rec"
    res = CliRunner().invoke(cli, ["record", "--source", "nvidia-smi", "--executable", str(stub), "--interval", "0.1",
                                   "--duration", "0.55", "--out", str(out)])
    assert res.exit_code == 0, res.output
    polls = json.loads(res.output.strip().splitlines()[-1])["polls"]
    assert 3 <= polls <= 7
    meta = json.loads((out / "recording.json").read_text())
    assert meta["source"] == "nvidia-smi" and meta["rows"]["gpu"] == polls * Recording.open(out).topology.size("gpu")


def test_record_refuses_to_overwrite_and_reports_a_source_that_gives_nothing(tmp_path: Path, shared_data: Path) -> None:
    stub, _ = make_stub(tmp_path, shared_data / H200)
    out = tmp_path / "rec"
    args = ["record", "--source", "nvidia-smi", "--executable", str(stub), "--interval", "0.05", "--polls", "1",
            "--out", str(out)]
    assert CliRunner().invoke(cli, args).exit_code == 0
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 2 and "already holds a recording" in again.output
    missing = CliRunner().invoke(cli, ["record", "--source", "nvidia-smi", "--executable", str(tmp_path / "nope"),
                                       "--interval", "0.02", "--polls", "2", "--out", str(tmp_path / "empty")])
    assert missing.exit_code == 1 and "nothing recorded" in missing.output
    assert not (tmp_path / "empty" / "recording.json").exists()


def test_record_ethtool_phy_counters_give_prefec_ber(tmp_path: Path) -> None:
    """``record --source ethtool`` runs ``ethtool -S IFACE`` per poll; from the second poll on the
    optic rows carry the pre-FEC BER of the PHY counters between two readings."""
    data = Path(__file__).parent / "data"
    count = tmp_path / "count"
    stub = tmp_path / "ethtool"
    # first call: reading t0, then t1 (the fixture pair: 12,000 corrected of 4e12 bits = 3e-9)
    stub.write_text(f"#!/bin/sh\n[ \"$1\" = -S ] || exit 3\necho x >> {count}\n"
                    f"if [ $(wc -l < {count}) -eq 1 ]; then cat {data}/ethtool_S_mlx5_t0.txt; "
                    f"else cat {data}/ethtool_S_mlx5_t1.txt; fi\n")
    stub.chmod(0o755)
    out = tmp_path / "rec"
    res = CliRunner().invoke(cli, ["record", "--source", "ethtool", "--executable", str(stub), "--interfaces", "eth4",
                                   "--interval", "0.05", "--polls", "2", "--host", "n1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rec = Recording.open(out)
    assert rec.topology.links == ["n1/eth4"]
    ber = np.concatenate([f.columns["prefec_ber"] for f in rec.iter_frames() if f.kind == "optic"])
    assert len(ber) == 2 and np.isnan(ber[0]) and abs(ber[1] - 3e-9) < 1e-15


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_record_stopped_by_a_signal_leaves_a_valid_recording(tmp_path: Path, shared_data: Path, sig) -> None:
    """SIGTERM is what systemd, docker, Slurm and `timeout` send. It used to kill `record` with the
    writer open: no Parquet footers, no recording.json, every polled sample lost."""
    stub, calls = make_stub(tmp_path, shared_data / H200)
    out = tmp_path / "rec"
    # a signal this test runs with ignored (under nohup: SIGHUP) the recorder rightly leaves ignored
    proc = subprocess.Popen([sys.executable, "-m", "foreshock.cli.main", "record", "--source", "nvidia-smi",
                             "--executable", str(stub), "--interval", "0.1", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not (calls.exists() and len(calls.read_text().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["interrupted"] is True and summary["polls"] >= 3
    rec = Recording.open(out)
    assert rec.meta["rows"]["gpu"] == summary["samples"] == sum(len(f) for f in rec.iter_frames()) > 0


def test_record_killed_outright_keeps_what_it_had_committed(tmp_path: Path, shared_data: Path) -> None:
    """SIGKILL (the OOM killer, `kill -9`, a node going down) cannot be handled. The recorder
    used to hold one open Parquet file per kind, which is unreadable without its footer, and
    write recording.json only at the end: everything polled was lost. With parts committed every
    ``--commit-every`` seconds, the recording replays up to the last one."""
    stub, calls = make_stub(tmp_path, shared_data / H200)
    out = tmp_path / "rec"
    proc = subprocess.Popen([sys.executable, "-m", "foreshock.cli.main", "record", "--source", "nvidia-smi",
                             "--executable", str(stub), "--interval", "0.1", "--commit-every", "0.3",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "recording.json").exists() or json.loads((out / "recording.json").read_text())[
                "parts"].get("gpu", 0) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.kill()
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    polls = len(calls.read_text().splitlines())
    rec = Recording.open(out)
    assert rec.interrupted and rec.meta["parts"]["gpu"] >= 2
    gpus = rec.topology.size("gpu")
    rows = sum(len(f) for f in rec.iter_frames())
    assert rows == rec.meta["rows"]["gpu"] and rows % gpus == 0 and 2 <= rows // gpus <= polls
    res = CliRunner().invoke(cli, ["replay", str(out), "--port", "0"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["samples"] == rows


def test_record_on_a_full_disk_exits_with_the_error_keeping_the_parts_closed_before(
        tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk (ENOSPC) at the close of the second part: `record` ended in a traceback, then
    its cleanup renamed that part, cut short, into place and listed it: the recording did not open."""
    import errno

    import foreshock.recording as recording

    real_close = recording.pq.ParquetWriter.close
    closes = [0]

    def close(self) -> None:  # type: ignore[no-untyped-def]
        closes[0] += 1
        if closes[0] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_close(self)

    monkeypatch.setattr(recording.pq.ParquetWriter, "close", close)
    stub, _ = make_stub(tmp_path, shared_data / H200)
    out = tmp_path / "rec"
    res = CliRunner().invoke(cli, ["record", "--source", "nvidia-smi", "--executable", str(stub), "--interval", "0.05",
                                   "--commit-every", "0.12", "--polls", "40", "--out", str(out)])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "cannot write the recording" in res.output and "No space left on device" in res.output
    assert "rows lost with the part being written" in res.output
    summary = json.loads([line for line in res.output.splitlines() if line.startswith("{")][-1])
    assert summary["polls"] < 40 and summary["input_problems"] > 0 and summary["parts"] == {"gpu": 1}
    rec = Recording.open(out)
    assert not rec.interrupted and rec.meta["parts"] == {"gpu": 1}
    assert rec.meta["rows"]["gpu"] == summary["rows"]["gpu"] == len(rec.read_kind("gpu")) > 0
    assert not list(out.glob("*.partial"))


def test_record_ctrl_c_during_a_commit_stops_after_it(tmp_path: Path, shared_data: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C raised KeyboardInterrupt wherever it landed: just after a part's rename, the part was
    not counted, and the close renamed it again (FileNotFoundError), leaving a list without it.
    Now the first Ctrl-C stops the recorder after the poll in hand, as SIGTERM does."""
    import os

    real_replace = os.replace
    sent = [False]

    def replace(src, dst) -> None:  # type: ignore[no-untyped-def]
        real_replace(src, dst)
        if str(src).endswith(".parquet.partial") and not sent[0]:
            sent[0] = True
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "replace", replace)
    stub, _ = make_stub(tmp_path, shared_data / H200)
    out = tmp_path / "rec"
    res = CliRunner().invoke(cli, ["record", "--source", "nvidia-smi", "--executable", str(stub), "--interval", "0.05",
                                   "--commit-every", "0.12", "--polls", "40", "--out", str(out)])
    assert res.exit_code == 0, (res.output, res.exception)
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert sent[0] and summary["interrupted"] is True and summary["polls"] < 40
    rec = Recording.open(out)
    assert not rec.interrupted and rec.meta["rows"]["gpu"] == summary["samples"] == len(rec.read_kind("gpu"))
