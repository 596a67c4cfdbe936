"""End to end: a recording replayed through the embedded pipeline, /metrics scraped over HTTP."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request

import numpy as np
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from foreshock.cli.common import build_pipeline, stop_server
from foreshock.cli.main import cli
from foreshock.events import Event
from foreshock.frames import Frame
from foreshock.recording import RecordingWriter
from foreshock.streams.sources import ReplaySource, paced
from foreshock.topology import Topology

from corrupt_parquet import corrupt_page

T0 = 1_700_000_000.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_ramp_recording(path, topology: Topology, bad_rows: bool = False) -> None:
    """GPU node2/gpu4 heats steadily from t=300 s and throttles (SW thermal) at t=500 s."""
    n = topology.size("gpu")
    hot = topology.slot("gpu", "node2/gpu4")
    rng = np.random.default_rng(3)
    with RecordingWriter(path, topology, {"interval": 1.0, "source": "test"}) as w:
        for t in range(600):
            temp = 50 + rng.normal(0, 0.3, n)
            if t >= 300:
                temp[hot] += (t - 300) * 0.2
            mask = np.zeros(n)
            if t >= 500:
                mask[hot] = 0x20
            ts = np.full(n, T0 + t)
            slots = np.arange(n)
            if bad_rows and t == 200:
                ts = np.r_[ts, T0 + 100.0, np.nan]  # one row out of order, one without a timestamp
                slots = np.r_[slots, 0, 1]
                temp = np.r_[temp, 50.0, 50.0]
                mask = np.r_[mask, 0.0, 0.0]
            w.write(Frame("gpu", ts, slots, {"gpu_temp": temp, "power": np.full(len(ts), 600.0),
                                            "throttle_reasons": mask}))
        w.add_events([Event(T0 + 300, "fault_onset", "gpu", "node2/gpu4", "f1", "tim_degradation"),
                      Event(T0 + 500, "thermal_throttle_start", "gpu", "node2/gpu4", "f1", "tim_degradation")])


def scrape(port: int) -> dict[str, list]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {fam.name: fam.samples for fam in text_string_to_metric_families(body)}


def test_replay_serves_findings_over_http(tmp_path, small_topology: Topology) -> None:
    write_ramp_recording(tmp_path / "rec", small_topology, bad_rows=True)
    source = ReplaySource(str(tmp_path / "rec"))
    port = free_port()
    run = build_pipeline(source.topology, None, "127.0.0.1", port, str(tmp_path / "findings.jsonl"), top_k=4)
    try:
        stats = run.pipeline.run(source)
        metrics = scrape(port)
    finally:
        stop_server(run)
        run.jsonl.close()
    assert stats.samples == 600 * 32 + 2
    anomalies = [s for s in metrics["foreshock_anomaly_score"] if s.labels["entity"] == "node2/gpu4"]
    assert {s.labels["field"] for s in anomalies} >= {"gpu_temp", "throttle_reasons"}
    assert all(s.labels["entity"] == "node2/gpu4" for s in metrics["foreshock_anomaly_score"]), \
        "only the heating GPU is anomalous"
    processed = {s.labels["kind"]: s.value for s in metrics["foreshock_samples_processed"] if s.name.endswith("_total")}
    assert processed["gpu"] == 600 * 32
    problems = {s.labels["reason"]: s.value for s in metrics["foreshock_input_problems"] if s.name.endswith("_total")}
    assert problems["out_of_order"] == 1 and problems["bad_timestamp"] == 1
    lines = (tmp_path / "findings.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert first["type"] == "anomaly" and first["slot"] == small_topology.slot("gpu", "node2/gpu4")
    assert T0 + 300 < first["ts"] < T0 + 500, "the ramp is seen before the throttle bit"


def test_replay_command_prints_summary_and_json(tmp_path, small_topology: Topology) -> None:
    write_ramp_recording(tmp_path / "rec", small_topology)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["replay", str(tmp_path / "rec"), "--max", "--port", "0"])
    assert result.exit_code == 0, result.output
    last = json.loads(result.output.strip().splitlines()[-1])
    assert last["name"] == "replay" and last["samples"] == 600 * 32
    assert last["findings"]["anomaly"] >= 2
    assert "tim_degradation" in result.output and "node2/gpu4" in result.output


def test_replay_of_a_broken_recording_is_a_clear_error(tmp_path, small_topology: Topology) -> None:
    write_ramp_recording(tmp_path / "rec", small_topology)
    (tmp_path / "rec" / "gpu.parquet").write_bytes(b"PAR1 not really")
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "rec"), "--port", "0"])
    assert result.exit_code != 0
    assert "gpu.parquet: unreadable Parquet" in result.output


@pytest.mark.parametrize("args, message", [(["--speed", "0"], "must be a finite number > 0"),
                                           (["--speed", "2", "--max"], "exclusive")])
def test_replay_rejects_bad_options(tmp_path, small_topology: Topology, args, message) -> None:
    write_ramp_recording(tmp_path / "rec", small_topology)
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "rec"), "--port", "0", *args])
    assert result.exit_code == 2 and message in result.output


@pytest.mark.parametrize("fmt, path", [("dcgm", "dcgm/dcgm-exporter-tesla-t4.prom"),
                                       ("alibaba", "optics/alibaba_prefec_ber.csv")])
def test_imported_real_captures_replay_through_the_default_bank(tmp_path, shared_data, fmt, path) -> None:
    """Imported topologies have no jobs (dcgm) or no GPUs (Alibaba): every detector and the incident
    engine must cope with the empty relations instead of crashing."""
    runner = CliRunner(env={"COLUMNS": "200"})
    out = tmp_path / "rec"
    result = runner.invoke(cli, ["import", "--format", fmt, str(shared_data / path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["replay", str(out), "--port", "0"])
    assert result.exit_code == 0, result.output
    last = json.loads(result.output.strip().splitlines()[-1])
    assert last["samples"] > 0


def write_short_recording(path, topology: Topology, ticks: int) -> None:
    with RecordingWriter(path, topology, {"interval": 1.0, "source": "test"}) as w:
        for t in range(ticks):
            n = topology.size("gpu")
            w.write(Frame("gpu", np.full(n, T0 + t), np.arange(n), {"gpu_temp": np.full(n, 50.0)}))


def test_replay_speed_paces_by_telemetry_time_and_max_does_not(tmp_path, small_topology: Topology) -> None:
    """`--speed 20` over 30 s of telemetry takes at least 1.5 s of wall time; `--max` does not wait."""
    write_short_recording(tmp_path / "rec", small_topology, ticks=31)
    runner = CliRunner(env={"COLUMNS": "200"})
    timings = {}
    # the first run pays for compiling the bank's kernels when the on-disk cache is cold; the next
    # ones time the replay itself
    for mode in ([], ["--max"], ["--speed", "20"], []):
        started = time.monotonic()
        result = runner.invoke(cli, ["replay", str(tmp_path / "rec"), "--port", "0", *mode])
        timings[" ".join(mode) or "default"] = time.monotonic() - started
        assert result.exit_code == 0, result.output
        assert json.loads(result.output.strip().splitlines()[-1])["samples"] == 31 * 32
    assert timings["--speed 20"] >= 1.5, timings
    assert timings["--speed 20"] < 1.5 + 20, timings  # paced, not stalled (a 20x slower bug would take 30 s)
    assert timings["--max"] < 1.0 and timings["default"] < 1.0, timings  # the default is --max


def test_paced_releases_frames_on_schedule_and_stops_when_asked() -> None:
    frames = [Frame("gpu", [T0 + t], [0], {}) for t in (0.0, 1.0, 2.0)]
    started = time.monotonic()
    released = []
    for frame in paced(frames, speed=10.0):
        released.append(time.monotonic() - started)
    assert released[0] < 0.05 and released[1] >= 0.1 - 1e-3 and released[2] >= 0.2 - 1e-3, released
    stop = threading.Event()
    gen = paced(frames, speed=0.01, stop=stop)  # the second frame is due in 100 s
    assert next(gen) is frames[0]
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    assert list(gen) == [] and time.monotonic() - started < 5.0


def test_a_broken_ground_truth_file_fails_before_the_replay_runs(tmp_path, small_topology: Topology) -> None:
    write_short_recording(tmp_path / "rec", small_topology, ticks=5)
    (tmp_path / "rec" / "events.jsonl").write_text('{"time": 1, "type": "xid"}\n')
    findings = tmp_path / "findings.jsonl"
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "rec"), "--port", "0", "--findings", str(findings)])
    assert result.exit_code == 1 and "events.jsonl:1: missing ['entity_kind', 'entity']" in result.output
    assert "replay" not in result.output.replace(str(tmp_path), ""), "the replay ran before the error"
    assert not findings.exists(), "the pipeline was built before the error"


def test_summary_json_line_is_strict_json_when_no_timestamp_is_valid(tmp_path, small_topology: Topology) -> None:
    """Every row without a usable time: counted as bad input, and the figures that need a time are null
    (NaN is not JSON; a strict parser of the line would fail)."""
    with RecordingWriter(tmp_path / "rec", small_topology, {"interval": 1.0}) as w:
        w.write(Frame("gpu", [np.nan, np.nan], [0, 1], {"gpu_temp": [50.0, 51.0]}))
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "rec"), "--port", "0"])
    assert result.exit_code == 0, result.output
    line = result.output.strip().splitlines()[-1]
    summary = json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in the JSON line: {line}"))
    assert summary["telemetry_start"] is None and summary["input_problems"] == 2


def test_the_summary_counts_and_spans_what_the_guard_accepted(tmp_path, small_topology: Topology) -> None:
    """A NaN stamp in the first frame made the JSON line's start, span and speed-up null (NaN
    carried through min), and a row an hour in the past stretched the span to 4,099 s of a 10-minute
    run, while the console counted only the accepted rows."""
    n = small_topology.size("gpu")
    with RecordingWriter(tmp_path / "rec", small_topology, {"interval": 1.0}) as w:
        for t in range(600):
            ts = np.full(n, T0 + t)
            if t == 0:
                ts[3] = np.nan
            if t == 100:
                ts[4] = T0 - 3600.0
            w.write(Frame("gpu", ts, np.arange(n), {"gpu_temp": np.full(n, 50.0)}))
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "rec"), "--max", "--port", "0"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["samples"] == 600 * n and summary["accepted_samples"] == 600 * n - 2
    assert summary["telemetry_start"] == T0 and summary["telemetry_seconds"] == 599.0
    assert f"{600 * n - 2:,} samples" in result.output


def test_an_unwritable_findings_file_is_a_clear_error(tmp_path, small_topology: Topology) -> None:
    write_ramp_recording(tmp_path / "rec", small_topology)
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "rec"), "--port", "0",
                                      "--findings", str(tmp_path / "missing" / "f.jsonl")])
    assert result.exit_code == 1 and "--findings" in result.output and "Traceback" not in result.output
    assert not isinstance(result.exception, FileNotFoundError)


def now_replay(path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["replay", str(path), "--now", "--port", "0"])
    return result.exit_code, result.output


def summary_line(output: str) -> dict:
    return json.loads(next(line for line in output.splitlines() if line.startswith('{"name": "replay"')))


@pytest.mark.parametrize("first_tick_at", [None, 0.0], ids=["stamps-right", "first-tick-at-epoch-zero"])
def test_replay_now_without_recording_json_starts_at_the_current_time(tmp_path, small_topology: Topology,
                                                                      first_tick_at) -> None:
    """Without recording.json (its recorder killed before writing it, a copy without it) there is no
    listed start: `--now` replayed the stamps unshifted, years old to Prometheus, and said nothing.
    The start is then the first stamp the files hold, a first tick stamped 1970 left out (shifted to
    now from there, the stream had been stamped decades ahead)."""
    n = small_topology.size("gpu")
    with RecordingWriter(tmp_path / "rec", small_topology, {"interval": 1.0}) as w:
        for t in range(30):
            ts = np.full(n, first_tick_at if t == 0 and first_tick_at is not None else T0 + t)
            w.write(Frame("gpu", ts, np.arange(n), {"gpu_temp": np.full(n, 50.0)}))
    (tmp_path / "rec" / "recording.json").unlink()
    before = time.time()
    code, output = now_replay(tmp_path / "rec")
    assert code == 0, output
    summary = summary_line(output)
    assert before - 1 <= summary["telemetry_start"] <= time.time() + 1, output
    assert summary["telemetry_seconds"] == (29.0 if first_tick_at is None else 28.0)


@pytest.mark.parametrize("listed", [True, False], ids=["start-null", "no-recording-json"])
def test_replay_now_of_a_recording_without_a_usable_stamp_is_refused(tmp_path, small_topology: Topology,
                                                                     listed) -> None:
    with RecordingWriter(tmp_path / "rec", small_topology, {"interval": 1.0}) as w:
        w.write(Frame("gpu", [np.nan, np.nan], [0, 1], {"gpu_temp": [50.0, 51.0]}))
    if not listed:
        (tmp_path / "rec" / "recording.json").unlink()
    code, output = now_replay(tmp_path / "rec")
    assert code == 2, output
    assert "--now" in output and "no sample with a usable timestamp" in output


def test_a_page_found_corrupt_mid_replay_ends_the_run_with_its_summary(tmp_path, small_topology: Topology) -> None:
    """A corrupt data page behind a sound footer is found only when read: the replay stopped with an
    error and no summary, its findings written. It now ends as a signal ends it (summary, JSON line
    with interrupted), then exits 1 naming the file."""
    n = small_topology.size("gpu")
    rec = tmp_path / "rec"
    # (the replay reads 65,536 rows at a time: the corrupt last group starts past the first read)
    with RecordingWriter(rec, small_topology, {"interval": 1.0}, rows_per_group=500 * n) as w:
        for t in range(3000):
            temp = np.full(n, 50.0)
            temp[3] += max(0, t - 100) * 0.2  # a GPU heating: findings before the corrupt page
            w.write(Frame("gpu", np.full(n, T0 + t), np.arange(n), {"gpu_temp": temp}))
    part = rec / "gpu.parquet"
    corrupt_page(part, "gpu_temp")
    findings = tmp_path / "findings.jsonl"
    result = CliRunner().invoke(cli, ["replay", str(rec), "--port", "0", "--findings", str(findings)])
    assert result.exit_code == 1, result.output
    summary = summary_line(result.output)
    error = result.output.index(f"Error: {part}: unreadable Parquet")
    assert result.output.index('{"name": "replay"') < error, "the error is said last"
    assert summary["interrupted"] is True
    assert summary["error"].startswith(f"{part}: unreadable Parquet")  # (not to be taken for a signal's stop)
    assert 0 < summary["samples"] <= 2500 * n
    assert summary["findings"].get("anomaly", 0) > 0
    assert "stopped by an unreadable recording" in result.output
    assert len(findings.read_text().splitlines()) == sum(summary["findings"].values())


def test_a_first_page_found_corrupt_is_an_error_naming_the_file_not_a_traceback(tmp_path, small_topology: Topology) -> None:
    """The recording's first stamps are read before the run (the guard's anchor): a corrupt page
    among them raised out of the command as a traceback."""
    n = small_topology.size("gpu")
    rec = tmp_path / "rec"
    with RecordingWriter(rec, small_topology, {"interval": 1.0}, rows_per_group=500 * n) as w:
        for t in range(1000):
            w.write(Frame("gpu", np.full(n, T0 + t), np.arange(n), {"gpu_temp": np.full(n, 50.0)}))
    part = rec / "gpu.parquet"
    corrupt_page(part, "ts", row_group=0, at=0)
    # a fault of the ground truth, never shown to the detectors: stopped before any sample, the run
    # had listed it as missed ("foreshock first said nothing")
    (rec / "events.jsonl").write_text(json.dumps({"time": T0 + 500, "type": "fault_onset", "entity_kind": "gpu",
                                                  "entity": small_topology.gpus[3], "fault_id": "f1",
                                                  "fault_type": "tim_degradation"}) + "\n")
    result = CliRunner().invoke(cli, ["replay", str(rec), "--port", "0"])
    assert result.exit_code == 1, result.output
    assert f"Error: {part}: unreadable Parquet" in result.output
    assert isinstance(result.exception, SystemExit)  # click's exit 1, not an exception out of the command
    assert "tim_degradation" not in result.output


def test_a_row_naming_no_entity_is_counted_and_the_replay_goes_on(tmp_path, small_topology: Topology) -> None:
    """One null ``slot`` cell (another writer's file) stopped the replay at its batch, exit 1, nothing
    counted; a slot past the topology was already a counted ``unknown_entity``. Now so is a null one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = small_topology.size("gpu")
    rec = tmp_path / "rec"
    with RecordingWriter(rec, small_topology, {"interval": 1.0}) as w:
        for t in range(20):
            w.write(Frame("gpu", np.full(n, T0 + t), np.arange(n), {"gpu_temp": np.full(n, 50.0)}))
    part = rec / "gpu.parquet"
    table = pq.read_table(part)
    slots = table.column("slot").to_pylist()
    slots[5 * n + 2] = None
    pq.write_table(table.set_column(table.schema.get_field_index("slot"), "slot", pa.array(slots, pa.int32())), part)
    result = CliRunner().invoke(cli, ["replay", str(rec), "--max", "--port", "0"])
    assert result.exit_code == 0, result.output
    summary = summary_line(result.output)
    assert summary["interrupted"] is False
    assert summary["samples"] == 20 * n and summary["accepted_samples"] == 20 * n - 1
    assert "guard/unknown_entity 1" in result.output
