"""Audit s64 (a new operator's broker-mode journey): every worker start warned of energy counters going
back and counter glitches "counted in foreshock_input_problems_total", which no metric counted (the
warm-up's made-up frames); a stopped worker's summary was logged at info, under the default level, so
it said nothing; and a record's problem was logged with its reason twice ("bad_headers: bad_headers:
missing or malformed header ...")."""

from __future__ import annotations

import logging

import pytest

from foreshock.detectors.bank import DetectorBank
from foreshock.streams.kafka_worker import DetectionStage
from foreshock.topology import Topology
from kafka_support import kafka_settings  # noqa: F401


def test_the_warm_up_logs_no_input_problem(caplog: pytest.LogCaptureFixture) -> None:
    topo = Topology.from_dict({"rows": [{"name": "r", "cooling_loop": "cdu0"}],
                               "racks": [{"name": "rack0", "row": "r"}],
                               "nodes": [{"name": f"n{i}", "rack": "rack0", "gpus": 2} for i in range(2)]})
    stage = DetectionStage(topo, lambda hardware: DetectorBank.from_names(hardware), 1)
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        stage.warm_up()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert not stage.health.problems  # nor counted in the worker's own health


def test_a_record_problem_says_its_reason_once(small_topology: Topology, caplog: pytest.LogCaptureFixture) -> None:
    stage = DetectionStage(small_topology, lambda hw: DetectorBank.from_names(hw, processors=()), 1)
    stage.load(0, None)
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        result = stage.process(0, 0, b"not a bundle", [])  # no headers at all
    assert [d.reason for d in result.dead_letters] == ["bad_headers"]
    assert result.dead_letters[0].detail.startswith("bad_headers: missing or malformed header")  # the letter's
    assert "worker: bad_headers: missing or malformed header" in caplog.text
    assert "bad_headers: bad_headers" not in caplog.text


def test_a_stopped_worker_prints_its_counts_at_the_default_log_level(tmp_path, monkeypatch, capsys) -> None:
    """The run's end (here at once: the group's loop stubbed out) prints the worker's status to stderr
    whatever the log level, as the agent prints its summary."""
    from foreshock.streams import faust_app
    from foreshock.streams.kafka_config import KafkaSettings
    from foreshock.streams.kafka_topics import Topics

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(faust_app._QuietWorker, "execute_from_commandline", lambda self: None)
    topology = Topology.from_gpu_hosts([("n0", g) for g in range(2)])
    config = faust_app.WorkerConfig(KafkaSettings("127.0.0.1:1"), Topics("s64.", 1), topology,
                                    lambda hardware: DetectorBank.from_names(hardware), app_id="s64", role="incidents")
    faust_app.run_worker(config)
    err = capsys.readouterr().err
    assert err.startswith("worker stopped: {") and '"records"' in err


@pytest.mark.kafka
def test_a_worker_waiting_for_its_topology_says_so_once(kafka_settings) -> None:
    """A worker started before any agent waited its minute in silence, then failed: the wait is said
    when it starts (the CLI prints it to stderr), once, and the end says what to do."""
    import uuid

    from foreshock.streams.kafka_agent import fetch_topology
    from foreshock.streams.kafka_topics import Topics, ensure_topics

    topics = ensure_topics(kafka_settings, Topics(f"s64{uuid.uuid4().hex[:8]}.", 1))
    said: list[str] = []
    with pytest.raises(TimeoutError, match="start an agent first, or pass --topology"):
        fetch_topology(kafka_settings, topics, timeout_s=2.0, waiting=said.append)
    assert len(said) == 1 and said[0].startswith(f"waiting up to 2 s for an agent's topology on {topics.topology}")


def test_metrics_are_served_while_the_worker_warms_up(tmp_path, monkeypatch) -> None:
    """On a fresh Numba cache the warm-up compiles for minutes, and /metrics (named in the start line)
    refused connections meanwhile: it is served before the warm-up now."""
    import socket
    import urllib.request

    from foreshock.streams import faust_app
    from foreshock.streams.kafka_config import KafkaSettings
    from foreshock.streams.kafka_topics import Topics

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    answered: list[int] = []

    def warm_up(self: DetectionStage) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            answered.append(reply.status)

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(DetectionStage, "warm_up", warm_up)
    monkeypatch.setattr(faust_app._QuietWorker, "execute_from_commandline", lambda self: None)
    topology = Topology.from_gpu_hosts([("n0", g) for g in range(2)])
    config = faust_app.WorkerConfig(KafkaSettings("127.0.0.1:1"), Topics("s64w.", 1), topology,
                                    lambda hardware: DetectorBank.from_names(hardware), app_id="s64w",
                                    metrics_port=port)
    faust_app.run_worker(config)
    assert answered == [200]


def test_a_header_that_is_no_utf8_is_named_in_the_problem() -> None:
    """A header whose value is no UTF-8 read "missing or malformed header 'utf-8' codec can't decode
    byte ...": the decode error stood where the header's name belongs (an audit, 2026-12-06)."""
    from foreshock.streams.kafka_codec import H_AGENT, H_SENT, RecordError, bundle_table

    with pytest.raises(RecordError) as bad:
        bundle_table(b"", {H_AGENT: b"\xff\xfeagent", H_SENT: b"1.0"})
    assert f"malformed header {H_AGENT!r}: 'utf-8' codec can't decode" in str(bad.value)
    with pytest.raises(RecordError) as bad:
        bundle_table(b"", {H_AGENT: b"a1", H_SENT: b"soon"})
    assert f"malformed header {H_SENT!r}: could not convert" in str(bad.value)
    with pytest.raises(RecordError) as bad:
        bundle_table(b"", {H_AGENT: b"a1"})
    assert f"header {H_SENT!r}: missing" in str(bad.value)
