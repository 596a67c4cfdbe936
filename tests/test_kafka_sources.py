"""Ingest agents on real captured formats, through the real broker: ``foreshock agent`` (the
CLI, as a process) scrapes a local HTTP server serving a real dcgm-exporter page, or runs a
stub ``nvidia-smi`` printing a real ``--query-gpu`` capture; the frames it publishes on
``telemetry.frames`` must decode to the capture's exact values, in base units."""

from __future__ import annotations

import csv
import json
import re
import stat
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka_support import kafka_settings  # noqa: F401

from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.streams.dcgm import parse_dcgm_text
from foreshock.streams.kafka_agent import fetch_topology
from foreshock.streams.kafka_codec import PartitionMap, decode_bundle, headers_dict
from foreshock.streams.kafka_config import KafkaSettings
from foreshock.streams.kafka_topics import Topics
from foreshock.streams.nvidia_smi import capture_sections
from foreshock.topology import Topology

from board_ids import uuid_number

pytestmark = pytest.mark.kafka

H200 = Path("nvidia-smi") / "linux-x86_64__nvidia-h200__590.48.01.txt"
POLLS = 2


def run_agent_cli(settings: KafkaSettings, topics: Topics, *args: str) -> dict[str, object]:
    """``foreshock agent ...`` as a process; returns its JSON summary (the last line of stdout)."""
    proc = subprocess.run(
        [sys.executable, "-m", "foreshock.cli.main", "agent", "--kafka", settings.bootstrap,
         "--namespace", topics.namespace, "--partitions", str(topics.partitions), "--polls", str(POLLS),
         "--interval", "0.2", *args],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["send_failed"] == 0 and summary["frames"] == POLLS, summary
    return summary


def published_gpu_rows(settings: KafkaSettings, topics: Topics, want_rows: int,
                       timeout_s: float = 20.0) -> tuple[Topology, list[Frame]]:
    """The topology on ``foreshock.topology`` and the gpu pieces on ``telemetry.frames``, decoded
    and validated the way a worker does, until ``want_rows`` rows arrived."""
    topology = fetch_topology(settings, topics, timeout_s=timeout_s)
    pmap = PartitionMap(topology, topics.partitions)
    consumer = KafkaConsumer(**settings.kafka_python(), enable_auto_commit=False)
    tps = [TopicPartition(topics.frames, p) for p in range(topics.partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout_s
    try:
        while sum(len(f) for f in frames) < want_rows and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                for record in records:
                    for piece in decode_bundle(record.value, headers_dict(record.headers), topology, pmap,
                                               tp.partition):
                        assert piece.error is None, piece.error
                        assert piece.frame is not None and piece.frame.kind == "gpu"
                        frames.append(piece.frame)
    finally:
        consumer.close()
    return topology, frames


def values_of(topology: Topology, frames: list[Frame], gpu: str) -> list[dict[str, float]]:
    """Per published row of one GPU (in time order): its non-NaN fields."""
    slot = topology.slot("gpu", gpu)
    rows = [(float(f.ts[i]), {k: float(v[i]) for k, v in f.columns.items() if not np.isnan(v[i])})
            for f in frames for i in np.flatnonzero(f.slot == slot)]
    rows.sort(key=lambda r: r[0])
    assert all(a[0] < b[0] for a, b in zip(rows, rows[1:]))  # one row per poll, stamped at the poll
    return [values for _, values in rows]


def new_topics() -> Topics:
    return Topics(f"src{uuid.uuid4().hex[:8]}.", 2)


def page_uuid(page: str, host: str) -> str:
    """The UUID label of ``host``'s GPU on a dcgm-exporter page (one GPU per host here)."""
    found = {m.group(1) for line in page.splitlines() if f'Hostname="{host}"' in line
             for m in [re.search(r'UUID="([^"]+)"', line)] if m}
    assert len(found) == 1, found
    return found.pop()


def test_dcgm_agent_publishes_the_real_scrape_with_exact_values(kafka_settings, dcgm_exporter):
    topics = new_topics()
    summary = run_agent_cli(kafka_settings, topics, "--source", "dcgm", "--url", f"{dcgm_exporter}/metrics")
    assert summary["samples"] == 2 * POLLS  # two GPUs (two hosts in the page), each poll
    # what the source counted (the page's metrics foreshock does not map, each once over the polls:
    # the page serves them at every scrape) is in the agent's summary
    page = PipelineHealth()
    parse_dcgm_text(urllib.request.urlopen(f"{dcgm_exporter}/metrics").read().decode(), 0.0, page)
    assert summary["input_problems"] == page.total_problems() > 0 and POLLS > 1
    topology, frames = published_gpu_rows(kafka_settings, topics, want_rows=2 * POLLS)
    assert topology.gpus == ["424773df46e0/gpu0", "551bdf382151/gpu0"]  # from the Hostname/gpu labels
    # the page's values, in base units: MHz -> Hz, mJ -> J; each GPU's board (its UUID label) as the
    # number the workers compare to find a board swapped
    text = urllib.request.urlopen(f"{dcgm_exporter}/metrics").read().decode()
    assert values_of(topology, frames, "424773df46e0/gpu0") == [{
        "sm_clock": 300e6, "gpu_temp": 25.0, "power": 8.969, "energy": 128996.013, "pcie_replays": 0.0,
        "util": 0.0, "xid_last": 0.0, "board_id": float(uuid_number(page_uuid(text, "424773df46e0")))}] * POLLS
    assert values_of(topology, frames, "551bdf382151/gpu0") == [
        {"slowdown_temp": 93.0, "power_limit": 70.0, "throttle_reasons": 1.0,
         "board_id": float(uuid_number(page_uuid(text, "551bdf382151")))}] * POLLS


def test_nvidia_smi_agent_publishes_the_real_h200_capture_with_exact_values(kafka_settings, shared_data,
                                                                             tmp_path):
    csv_text = capture_sections((shared_data / H200).read_text())["load :: query-gpu"]
    output = tmp_path / "query-gpu.csv"
    output.write_text(csv_text)
    stub = tmp_path / "nvidia-smi"
    stub.write_text(f"#!/bin/sh\ncat {output}\n")
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    topics = new_topics()
    run_agent_cli(kafka_settings, topics, "--source", "nvidia-smi", "--executable", str(stub),
                  "--host", "h200-test")
    topology, frames = published_gpu_rows(kafka_settings, topics, want_rows=POLLS)
    assert topology.gpus == ["h200-test/gpu0"]
    # H200 under gpu-burn, as captured: 627.40 W of a 700 W limit, 52 C core, 40 C HBM, SM clock
    # at its 1980 MHz maximum, 100 % busy, no throttle reason, no ECC errors or remapped rows; its
    # max operating temperature is the core's 52 C plus the 35 C T.Limit headroom the capture reads
    assert values_of(topology, frames, "h200-test/gpu0") == [{
        "power": 627.40, "power_limit": 700.0, "gpu_temp": 52.0, "hbm_temp": 40.0, "max_op_temp": 87.0,
        "sm_clock": 1.98e9,
        "sm_clock_max": 1.98e9, "util": 1.0, "throttle_reasons": 0.0, "power_throttle_time": 0.0,
        "thermal_throttle_time": 0.0, "ecc_dbe": 0.0, "remapped_rows": 0.0,
        "board_id": float(uuid_number(next(csv.DictReader(csv_text.splitlines(), skipinitialspace=True))["uuid"]))}
    ] * POLLS


def test_an_agent_serves_its_own_counters_while_it_runs(kafka_settings, dcgm_exporter):
    """``--metrics-port``: the samples an agent read and the problems its source counted, as the
    workers name them (``foreshock_input_problems_total{cluster,stage,reason}``), scraped while
    it runs; the server is gone once it has finished."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    topics = new_topics()
    proc = subprocess.Popen(
        [sys.executable, "-m", "foreshock.cli.main", "agent", "--kafka", kafka_settings.bootstrap,
         "--namespace", topics.namespace, "--partitions", "2", "--polls", "40", "--interval", "0.25",
         "--source", "dcgm", "--url", f"{dcgm_exporter}/metrics", "--metrics-port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    text = ""
    try:
        deadline = time.monotonic() + 30
        # the sample, not the family's HELP line: that is served before the first poll is read
        # (whose problems then carry no cluster yet), and the test used to stop at it now and then
        while 'foreshock_agent_samples_read_total{cluster="default"' not in text and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                continue
    finally:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert 'foreshock_agent_samples_read_total{cluster="default",kind="gpu"}' in text
    assert 'foreshock_input_problems_total{cluster="default",reason="unmapped metric ignored",stage="dcgm"}' in text
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_an_agent_whose_metrics_port_is_taken_says_so(kafka_settings, a_taken_port):
    """It gave a traceback ending in OSError: [Errno 98] Address already in use."""
    port = a_taken_port
    res = subprocess.run(
        [sys.executable, "-m", "foreshock.cli.main", "agent", "--kafka", kafka_settings.bootstrap,
         "--namespace", new_topics().namespace, "--source", "simulator", "--gpus", "8", "--duration", "5",
         "--metrics-port", str(port)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert f"cannot serve /metrics on 127.0.0.1:{port}" in res.stderr and "--metrics-port" in res.stderr


def test_a_worker_whose_metrics_port_is_taken_says_so(kafka_settings, tmp_path, a_taken_port):
    port = a_taken_port
    topology = tmp_path / "cluster.yaml"
    Topology.from_gpu_hosts([("node0", 0), ("node0", 1)]).dump(topology)
    res = subprocess.run(
        [sys.executable, "-m", "foreshock.cli.main", "worker", "--kafka", kafka_settings.bootstrap,
         "--namespace", new_topics().namespace, "--topology", str(topology), "--port", str(port)],
        capture_output=True, text=True, timeout=180)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert f"cannot serve /metrics on 127.0.0.1:{port}" in res.stderr and "--port" in res.stderr


def test_an_agent_stopped_by_sigterm_delivers_what_it_read_and_says_so(kafka_settings, shared_data: Path):
    """SIGTERM is how systemd and docker stop an agent. It used to kill it with the frames its
    publisher still held unsent; now the agent flushes, closes and prints its summary."""
    import signal

    from local_http import ScrapeServer

    # the exporter counts its scrapes: the agent publishes a poll's frame before it starts the next
    # poll, so a third scrape says two frames were handed to the publisher (which the 5-s linger
    # keeps from the broker, where they cannot be counted before the flush)
    exporter = ScrapeServer([(shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom").read_text()])
    topics = new_topics()
    proc = subprocess.Popen(
        [sys.executable, "-m", "foreshock.cli.main", "agent", "--kafka", kafka_settings.bootstrap,
         "--namespace", topics.namespace, "--partitions", "2", "--polls", "10000", "--interval", "0.2",
         "--source", "dcgm", "--url", exporter.url, "--linger-ms", "5000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        fetch_topology(kafka_settings, topics, timeout_s=60)  # published with its first frame
        deadline = time.monotonic() + 60
        while exporter.served < 3:
            assert proc.poll() is None and time.monotonic() < deadline, f"{exporter.served} scrapes"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        exporter.close()
    assert proc.returncode == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped_early"] is True and summary["send_failed"] == 0 and summary["frames"] >= 2
    # a 5-s linger holds every frame back: only the flush on the way out sent them
    _, frames = published_gpu_rows(kafka_settings, topics, want_rows=int(summary["samples"]))
    assert sum(len(f) for f in frames) == summary["samples"]
