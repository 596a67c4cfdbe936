"""`foreshock replay` and `demo` as their users meet them (review r61): a signal ends a run with its
summary, user strings print literally, bad options are usage errors, and the ground-truth table
says what happened."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from foreshock.cli import common
from foreshock.cli.main import cli
from foreshock.events import Event
from foreshock.exporters.console import FindingTally, render_summary
from foreshock.findings import Anomaly, Incident, Prediction
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

TOPO = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "rack0", "row": "r"}],
                           "nodes": [{"name": "n0", "rack": "rack0", "gpus": 2}]})


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 simulated GPUs for 300 s (a second a sample)."""
    path = tmp_path_factory.mktemp("ux") / "rec"
    result = CliRunner().invoke(cli, ["simulate", "--gpus", "8", "--duration", "300", "--out", str(path)])
    assert result.exit_code == 0, result.output
    return path


class Killed(Exception):
    """Raised by the test's own handler: the command let a signal reach the handler it found."""


def _signal_once_running(monkeypatch: pytest.MonkeyPatch, sig: signal.Signals) -> list[threading.Thread]:
    """Send ``sig`` to this process a little after the run's frames start flowing: once
    ``run_with_progress`` is called, which the command does with its handlers in place (a signal
    timed from outside, by the findings file, could come before them on a loaded machine)."""
    threads: list[threading.Thread] = []
    running = common.run_with_progress

    def signalled(*args: Any, **kwargs: Any) -> Any:
        thread = threading.Thread(target=lambda: (time.sleep(0.5), os.kill(os.getpid(), sig)), daemon=True)
        thread.start()
        threads.append(thread)
        return running(*args, **kwargs)

    monkeypatch.setattr(common, "run_with_progress", signalled)
    return threads


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", ["replay", "demo"])
def test_a_signal_ends_the_run_with_its_summary(tmp_path, recording: Path, command: str,
                                                sig: signal.Signals, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C or SIGTERM: the run stops as `watch` does, its summary and JSON line printed (with
    "interrupted"), exit status 0; before, click's "Aborted!" (status 1) or death by SIGTERM."""
    findings = tmp_path / "f.jsonl"
    args = (["replay", str(recording), "--speed", "10"] if command == "replay" else
            ["demo", "--gpus", "8", "--duration", "3600", "--interval", "5", "--speed", "60"])

    def killed(_signum: int, _frame: Any) -> None:
        raise Killed

    # the test's SIGTERM handler stands for the default one (which would end pytest)
    before = signal.signal(signal.SIGTERM, killed)
    try:
        threads = _signal_once_running(monkeypatch, sig)
        result = CliRunner().invoke(cli, [*args, "--port", "0", "--findings", str(findings)])
        for thread in threads:
            thread.join()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 0, result.output
    name = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
    assert f"stopped by {name}" in result.output and "foreshock summary" in result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["name"] == command and summary["interrupted"] is True and summary["samples"] > 0
    # stopped, not run to its end (300 s, 3600 s of telemetry; by telemetry, not wall time: a
    # first frame's JIT compile on a loaded machine can take longer than the whole paced run)
    assert summary["telemetry_seconds"] < (200 if command == "replay" else 3000), summary
    assert findings.read_text().endswith("\n") or findings.read_text() == ""


def test_a_run_to_its_end_is_not_interrupted(recording: Path) -> None:
    result = CliRunner().invoke(cli, ["replay", str(recording), "--port", "0"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["interrupted"] is False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler of its own for ``sig`` (Linux: its SigCgt mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the handlers from /proc/PID/status")
def test_ctrl_c_during_replay_hold_is_a_normal_exit(recording: Path) -> None:
    """`replay --hold` says it is holding /metrics, and Ctrl-C then ends it (status 0, no
    "Aborted!")."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", "from foreshock.cli.main import cli; cli()", "replay",
                             str(recording), "--port", str(port), "--hold", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = b""
        while b'"name"' not in line:  # the JSON line: the run is over, the hold begins
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line or proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
        # Ctrl-C once the hold's handlers are in place, not a fixed while after the JSON line: the
        # run's own were put back before it (SIGTERM to its default), and the hold installs SIGINT's,
        # then SIGTERM's (stop_on_signals), so a caught SIGTERM says SIGINT's is the hold's
        deadline = time.monotonic() + 30
        while not _catches(proc.pid, signal.SIGTERM):
            assert proc.poll() is None and time.monotonic() < deadline, "the hold never took SIGTERM"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    text = err.decode()
    assert proc.returncode == 0, text
    assert f"serving /metrics on http://127.0.0.1:{port}/metrics for 60 s (Ctrl-C to stop)" in text
    assert "Aborted" not in text


def test_an_ipv6_host_prints_a_bracketed_url(monkeypatch, capsys, small_topology: Topology) -> None:
    """"[fd00::2]" was read as a rich markup tag: the URL printed as http://:9108/metrics."""
    monkeypatch.setattr(common, "serve", lambda store, host, port, top_k: object())
    common.build_pipeline(small_topology, None, "fd00::2", 9108, None, 16)
    assert "http://[fd00::2]:9108/metrics" in capsys.readouterr().err
    assert common.metrics_url("fd00::2", 9108) == "http://[fd00::2]:9108/metrics"


def test_a_bracketed_external_path_prints_as_it_is(tmp_path, recording: Path) -> None:
    """A path with "[/b]" in it was a MarkupError traceback; with "[x]", printed without it."""
    folder = tmp_path / "a[" / "b]"
    folder.mkdir(parents=True)
    external = folder / "ext[x].jsonl"
    external.write_text("")
    result = CliRunner().invoke(cli, ["replay", str(recording), "--port", "0", "--external", str(external)],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert f"following external events in {external}" in result.output
    assert f"0 external events read from {external}" in result.output


def test_incidents_tells_the_bad_lines_of_its_external_file_as_replay_does(tmp_path, recording: Path) -> None:
    """r91: `incidents --external` printed "1 external events from FILE", its bad line only in the log."""
    external = tmp_path / "ext.jsonl"
    external.write_text(json.dumps({"node": "node0", "time": 1.0, "type": "fan_failure"}) + "\nnot json\n")
    result = CliRunner().invoke(cli, ["incidents", str(recording), "--external", str(external), "--no-progress"],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert f"1 external event read from {external}, 1 bad line" in result.output


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_a_usage_error(recording: Path, port: str) -> None:
    result = CliRunner().invoke(cli, ["replay", str(recording), "--port", port])
    assert result.exit_code == 2, result.output
    assert "--port" in result.output and "0<=x<=65535" in result.output


@pytest.mark.parametrize("speed", ["0", "-2", "nan"])
def test_demo_refuses_a_speed_that_is_not_positive(speed: str) -> None:
    result = CliRunner().invoke(cli, ["demo", "--gpus", "8", "--duration", "60", "--port", "0", "--speed", speed])
    assert result.exit_code == 2, result.output
    assert "--speed" in result.output and "finite number > 0" in result.output


def test_demo_progress_total_counts_the_ticks_the_simulator_runs() -> None:
    """62 s at 5 s: 13 ticks (the last partly past the end), not int(62 / 5) = 12."""
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["demo", "--gpus", "8", "--duration", "62", "--interval", "5", "--port", "0"])
    assert result.exit_code == 0, result.output
    bar = next(line for line in result.output.splitlines() if line.startswith("demo:"))
    done, total = next(word for word in bar.split() if "/" in word and word[0].isdigit()).split("/")
    samples = json.loads(result.output.strip().splitlines()[-1])["samples"]
    assert int(done) == int(total) == samples


def _summary(tally: FindingTally, events: list[Event]) -> str:
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), events, console=Console(file=out, width=200))
    return out.getvalue()


def test_the_truth_table_says_how_many_faults_it_left_out() -> None:
    tally = FindingTally(TOPO)
    tally.first_ts = 0.0
    events = [Event(60.0 * i, "fault_onset", "gpu", "n0/gpu0", f"f{i}", "xid79") for i in range(18)]
    text = _summary(tally, events)
    assert "3 more faults" in text


def test_an_anomaly_at_the_impact_is_no_lead() -> None:
    """Only a prediction is ahead of an impact; an anomaly in the impact's own sample had read
    "0.0 min ahead"."""
    tally = FindingTally(TOPO)
    tally.first_ts = 0.0
    tally.observe_findings([Anomaly(700.0, "gpu", 1, "xid_last", 10.0, "xid", "xid 79")])
    events = [Event(100.0, "fault_onset", "gpu", "n0/gpu1", "f1", "xid79"),
              Event(700.0, "xid", "gpu", "n0/gpu1", "f1", "xid79")]
    row = next(line for line in _summary(tally, events).splitlines() if "xid79" in line and "│" in line)
    assert "detected at impact" in row and "ahead" not in row

    tally.observe_findings([Prediction(400.0, "gpu", 1, "thermal_throttle", 300.0, 0.8, "thermal", "r")])
    events.append(Event(700.0, "thermal_throttle_start", "gpu", "n0/gpu1", "f1", "xid79"))
    row = next(line for line in _summary(tally, events).splitlines() if "xid79" in line and "│" in line)
    assert "5.0 min ahead" in row  # the prediction's lead on the throttle (the first impact by order)


def test_a_loop_fault_names_the_incident_at_the_rack_it_feeds() -> None:
    """cooling_loss on cdu0, which feeds rack0; the incident engine roots it at rack0."""
    tally = FindingTally(TOPO)
    tally.first_ts = 0.0
    tally.observe_findings([Incident(50.0, "i0", "resolved", "rack", "rack0", "before the fault", members=("n0/gpu0",)),
                            Incident(400.0, "i1", "open", "rack", "rack0", "rack rack0 heating",
                                     members=("n0/gpu0", "n0/gpu1"))])
    events = [Event(100.0, "fault_onset", "loop", "cdu0", "f1", "cooling_loss", {"racks": ["rack0"]}),
              Event(900.0, "thermal_throttle_start", "gpu", "n0/gpu1", "f1", "cooling_loss")]
    flat = " ".join(line.strip() for line in _summary(tally, events).splitlines())
    assert "incident rack rack0" in flat and "no incident" not in flat


def test_incidents_writes_its_findings_file_as_replay_does_and_refuses_a_folder_not_there(tmp_path,
                                                                                          recording: Path) -> None:
    """A helper's audit (2026-12-05): `incidents --findings` into a folder that does not exist gave a
    FileNotFoundError traceback where replay, watch and demo say so in one line; and its lines
    carried the slot alone where replay's name the entity too."""
    missing = tmp_path / "nowhere" / "f.jsonl"
    result = CliRunner().invoke(cli, ["incidents", str(recording), "--findings", str(missing), "--no-progress"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output.strip().splitlines()[-1] == f"Error: --findings {missing}: No such file or directory"
    written = tmp_path / "f.jsonl"
    result = CliRunner().invoke(cli, ["incidents", str(recording), "--findings", str(written), "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in written.read_text().splitlines()]
    gpu_lines = [line for line in lines if line.get("entity_kind") == "gpu"]
    assert gpu_lines and all(line["entity"] == f"node{line['slot'] // 8}/gpu{line['slot'] % 8}" for line in gpu_lines)
