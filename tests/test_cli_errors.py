"""Bad outputs and bad numbers fail up front with an ``Error:`` line, never a traceback and never
after a long run (evaluate, train, simulate, replay, incidents)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from foreshock.cli import evaluate, incidents, replay, simulate, train
from foreshock.recording import RecordingWriter

from corrupt_parquet import corrupt_page


def invoke(command: object, *args: str) -> Result:
    return CliRunner().invoke(command, list(args))  # type: ignore[arg-type]


def refused(result: Result, code: int = 1) -> str:
    assert result.exit_code == code and isinstance(result.exception, SystemExit), result.output
    return result.output


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "afile"
    path.write_text("")
    return path


def test_evaluate_checks_the_report_folder_before_the_run(empty_recording, a_file: Path) -> None:
    rec = empty_recording("gpu", 30.0)
    text = refused(invoke(evaluate.command, str(rec.path), "--detectors", "foreshock", "--report",
                          str(a_file / "sub"), "--no-plots"))
    assert "cannot create the report folder" in text


def test_train_checks_the_model_folder_before_the_run(empty_recording, a_file: Path) -> None:
    rec = empty_recording("gpu", 30.0)
    text = refused(invoke(train.command, str(rec.path), "--out", str(a_file / "sub" / "model.skops")))
    assert "cannot create the folder" in text


def test_simulate_checks_the_out_folder_before_the_run(a_file: Path) -> None:
    text = refused(invoke(simulate.command, "--gpus", "8", "--duration", "2", "--no-progress",
                          "--out", str(a_file / "sub")))
    assert "cannot create" in text


@pytest.mark.parametrize("option", ["--duration", "--interval", "--physics-dt", "--fault-acceleration"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_simulate_refuses_non_finite_numbers(option: str, value: str, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    text = refused(invoke(simulate.command, "--gpus", "8", "--duration", "2", "--no-progress", option, value,
                          "--out", str(out)), code=2)
    assert option in text and "finite" in text
    assert not out.exists()


@pytest.mark.parametrize("args", [["--speed", "nan"], ["--speed", "inf"], ["--hold", "nan"]])
def test_replay_refuses_non_finite_numbers(args: list[str], empty_recording) -> None:
    rec = empty_recording("gpu", 30.0)
    text = refused(invoke(replay.command, str(rec.path), "--port", "0", *args), code=2)
    assert args[0] in text and "finite" in text


def test_a_metrics_port_in_use_is_a_usage_error_not_a_traceback(empty_recording, a_taken_port: int,
                                                                 tmp_path: Path) -> None:
    """demo, replay and watch serve /metrics through build_pipeline; a taken port gave a traceback
    ending in OSError: [Errno 98] Address already in use."""
    rec = empty_recording("gpu", 30.0)
    findings = tmp_path / "findings.jsonl"
    text = refused(invoke(replay.command, str(rec.path), "--port", str(a_taken_port), "--findings", str(findings)),
                   code=2)
    assert f"cannot serve /metrics on 127.0.0.1:{a_taken_port}" in text and "choose another --port" in text


def test_a_refused_metrics_port_leaves_the_previous_findings_file_as_it_was(empty_recording, a_taken_port: int,
                                                                           tmp_path: Path) -> None:
    """The findings file was opened (truncated) before /metrics was bound: a run refused for its
    --port or --host emptied the previous run's findings (review h28)."""
    rec = empty_recording("gpu", 30.0)
    findings = tmp_path / "findings.jsonl"
    previous = '{"type": "prediction", "ts": 1.0}\n'
    findings.write_text(previous)
    refused(invoke(replay.command, str(rec.path), "--port", str(a_taken_port), "--findings", str(findings)), code=2)
    assert findings.read_text() == previous


@pytest.mark.parametrize("cause", ["not this machine's", "does not resolve"])
def test_a_metrics_host_that_cannot_be_bound_names_host_not_port(empty_recording, monkeypatch, cause: str) -> None:
    """``--host node7`` (a node's name, meant for watch's --node) said "choose another --port" (h22)."""
    import socket

    from foreshock.exporters import prometheus

    host = "192.0.2.1"  # TEST-NET-1 (RFC 5737): on no interface of this machine
    if cause == "does not resolve":
        host = "node7"

        def unresolved(*_args, **_kwargs):  # type: ignore[no-untyped-def]
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

        monkeypatch.setattr(prometheus, "start_http_server", unresolved)  # no resolver asked
    rec = empty_recording("gpu", 30.0)
    text = refused(invoke(replay.command, str(rec.path), "--port", "19108", "--host", host), code=2)
    assert f"cannot serve /metrics on {host}:19108" in text and "check --host" in text
    assert "--port" not in text.partition("Error:")[2]  # the port is not at fault


def test_a_metrics_error_names_the_options_of_the_command() -> None:
    from foreshock.exporters.prometheus import MetricsPortError

    taken = MetricsPortError(98, "cannot serve /metrics on 127.0.0.1:9109: Address already in use")
    assert taken.usage("--metrics-port").endswith("choose another --metrics-port (0 serves none)")
    elsewhere = MetricsPortError(99, "cannot serve /metrics on 10.9.9.9:9109: Cannot assign requested address")
    elsewhere.bad_address = True
    said = elsewhere.usage("--metrics-port")
    assert "check --metrics-host" in said and "--metrics-port" not in said and "node" not in said
    assert elsewhere.usage("--port", node_option="--node").endswith("a node's name goes to --node")


def test_a_parameter_value_that_is_not_a_number_is_named(empty_recording) -> None:
    rec = empty_recording("gpu", 30.0)
    text = refused(invoke(replay.command, str(rec.path), "--port", "0", "--param", "thermal.inlet_stale_s=abc"),
                   code=2)
    assert "thermal.inlet_stale_s=abc" in text


def test_incidents_runs_on_an_empty_recording(small_topology, tmp_path: Path) -> None:
    with RecordingWriter(tmp_path / "rec", small_topology):
        pass  # no frames: recording.json holds "start": null, "end": null
    assert json.loads((tmp_path / "rec" / "recording.json").read_text())["start"] is None
    result = invoke(incidents.command, str(tmp_path / "rec"), "--no-progress")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["incidents_total"] == 0


def test_an_agent_replaying_across_a_gap_stops_at_sigterm_not_at_the_next_frame(tmp_path: Path, monkeypatch,
                                                                                 small_topology) -> None:
    """SIGTERM (systemd, docker) ends an agent after the frame in hand. A paced replay's stop is an
    Event, which the handler at first left unset: across an hour without data the agent ignored
    SIGTERM until its next frame was due, and was killed with its frames unsent. (The publisher
    is a stand-in here; tests/test_kafka_sources.py sends through the real broker.)"""
    import os
    import signal
    import threading
    import time

    import numpy as np

    from foreshock.cli import agent
    from foreshock.frames import Frame
    from foreshock.streams import kafka_agent, kafka_config

    n = small_topology.size("gpu")
    with RecordingWriter(tmp_path / "rec", small_topology, {"interval": 1.0}) as w:
        for t in (0.0, 1.0, 3600.0):  # an hour without data after the second sample
            w.write(Frame("gpu", np.full(n, t), np.arange(n, dtype=np.int32), {"gpu_temp": np.full(n, 40.0)}))

    # SIGTERM is sent 0.5 s after the second frame is published, while the replay waits out the
    # hour to the third: timed from the frames, not from the start (a cold start's first frame can
    # take a second, the 1.0 s gap another), and never before the agent's handler is in place (it
    # is installed before the first frame is read)
    timers: list[threading.Timer] = []
    signalled: list[float] = []

    def sigterm() -> None:
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    class Publisher:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.stats = kafka_agent.AgentStats()

        def publish(self, frame: Frame) -> None:
            self.stats.frames += 1
            if self.stats.frames == 2:
                timers.append(threading.Timer(0.5, sigterm))
                timers[-1].start()

        def close(self) -> None:
            pass

    monkeypatch.setattr(kafka_agent, "FramePublisher", Publisher)
    monkeypatch.setattr(kafka_agent, "check_broker", lambda settings: None)
    monkeypatch.setattr(kafka_config, "check_broker", lambda settings: None)
    try:
        result = invoke(agent.command, "--source", "replay", "--path", str(tmp_path / "rec"), "--speed", "1",
                        "--kafka", "127.0.0.1:9")
        ended = time.monotonic()
    finally:
        for timer in timers:
            timer.cancel()
    assert result.exit_code == 0, result.output
    # stopped at the signal: waiting for the next frame would take the hour's gap (~3600 s)
    assert len(signalled) == 1 and ended - signalled[0] < 20
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["stopped_early"] is True and summary["frames"] == 2


def test_a_signal_set_to_be_ignored_stays_ignored() -> None:
    """Under ``nohup`` SIGHUP is ignored: taking it over would end an agent or a recording when
    its terminal closed."""
    import signal

    from foreshock.cli.common import stop_on_signals

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        stopped: list[signal.Signals] = []
        restore = stop_on_signals(stopped.append, (signal.SIGTERM, signal.SIGHUP))
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        restore()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and stopped == []
    finally:
        signal.signal(signal.SIGHUP, before)



@pytest.mark.parametrize("now", [False, True], ids=["not-a-recording", "now-without-a-usable-stamp"])
def test_an_agent_told_to_replay_a_recording_it_cannot_read_says_why(tmp_path: Path, small_topology, now: bool) -> None:
    """`agent --source replay` let a recording error out as a traceback (once the broker answered),
    and so the refusal of `--now` for a recording with no usable stamp; replay says both as messages."""
    import click
    import numpy as np

    from foreshock.cli.agent import open_source
    from foreshock.frames import Frame

    path = tmp_path / "rec"
    if now:  # a recording whose only rows have no timestamp, and no start in its metadata
        with RecordingWriter(path, small_topology, {"interval": 1.0}) as w:
            n = small_topology.size("gpu")
            w.write(Frame("gpu", np.full(n, np.nan), np.arange(n), {"gpu_temp": np.full(n, 50.0)}))
        meta = json.loads((path / "recording.json").read_text())
        (path / "recording.json").write_text(json.dumps({**meta, "start": None}))
    else:
        path.mkdir()
    with pytest.raises(click.UsageError if now else click.ClickException, match="--now" if now else str(path)):
        open_source("replay", str(path), None, None, None, None, None, None, None, None, now, 8, "healthy", 0, None)


def test_an_agent_replaying_a_part_found_corrupt_mid_run_sums_up_what_it_sent(tmp_path: Path, monkeypatch,
                                                                               small_topology) -> None:
    """A corrupt page behind a sound footer: the agent let the RecordingError out as a traceback,
    the frames it had published never summed up. It ends as replay does: summary, then exit 1
    naming the file. (The publisher is a stand-in, as above.)"""
    import numpy as np

    from foreshock.cli import agent
    from foreshock.frames import Frame
    from foreshock.streams import kafka_agent, kafka_config

    n = small_topology.size("gpu")
    rec = tmp_path / "rec"
    with RecordingWriter(rec, small_topology, {"interval": 1.0}, rows_per_group=500 * n) as w:
        for t in range(3000):
            w.write(Frame("gpu", np.full(n, 1.7e9 + t), np.arange(n, dtype=np.int32), {"gpu_temp": np.full(n, 40.0)}))
    part = rec / "gpu.parquet"
    corrupt_page(part, "gpu_temp")

    class Publisher:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.stats = kafka_agent.AgentStats()

        def publish(self, frame: Frame) -> None:
            self.stats.frames += 1
            self.stats.samples += len(frame)

        def close(self) -> None:
            pass

    monkeypatch.setattr(kafka_agent, "FramePublisher", Publisher)
    monkeypatch.setattr(kafka_agent, "check_broker", lambda settings: None)
    monkeypatch.setattr(kafka_config, "check_broker", lambda settings: None)
    result = invoke(agent.command, "--source", "replay", "--path", str(rec), "--kafka", "127.0.0.1:9")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    lines = result.output.strip().splitlines()
    summary = json.loads(next(line for line in lines if line.startswith('{"name": "agent"')))
    assert 0 < summary["samples"] < 3000 * n
    assert result.output.index('{"name": "agent"') < result.output.index(f"Error: {part}: unreadable Parquet")
    assert summary["error"].startswith(f"{part}: unreadable Parquet")  # (a script reads the line, not stderr)


@pytest.mark.parametrize("args", [["--speed", "0"], ["--speed", "-5"], ["--speed", "nan"], ["--duration", "nan"],
                                  ["--duration", "inf"]])
def test_an_agent_refuses_a_speed_or_duration_that_is_no_positive_finite_number(args: list[str]) -> None:
    """`agent --source simulator --speed 0` (or -5, or nan) ran unpaced: an hour of "live"
    telemetry published in two seconds, stamped up to an hour ahead."""
    from foreshock.cli import agent

    text = refused(invoke(agent.command, "--source", "simulator", "--kafka", "127.0.0.1:9", *args), code=2)
    assert "finite number" in text
