"""``foreshock watch``: the embedded pipeline over a live source, against dcgm-exporter
endpoints served on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.findings import finding_from_dict
from foreshock.simulator.formats import dcgm_exposition
from foreshock.topology import Topology

from local_http import ScrapeServer
from thermal_synth import Fault, World, small_topology


def stamped(text: str, ts: float) -> str:
    """Give every sample line the exposition format's own timestamp (milliseconds)."""
    return "".join(line + (f" {int(ts * 1000)}\n" if line and not line.startswith("#") else "\n")
                   for line in text.splitlines())


@pytest.mark.slow
def test_watch_predicts_a_failing_interface_from_a_live_dcgm_exporter(tmp_path: Path):
    """Two nodes' GPUs (no inlet: dcgm-exporter alone) as the exporter would serve them, one
    scrape per 10 s of telemetry (the lines carry their timestamps, so the test need not wait
    10 s a poll). node0/gpu5's thermal interface degrades from 10 min in; watch builds its
    topology from the first scrape and predicts that GPU's throttle well before it comes."""
    topo = small_topology(nodes=2, gpus=8, racks=1)
    world = World(topo, faults=[Fault("tim_degradation", 5, 600, 1.2, "f1")], seed=1)
    frames, events = world.run(4500.0)
    onset = next(e.time for e in events if e.type == "thermal_throttle_start" and e.entity == "node0/gpu5")
    pages = [stamped(dcgm_exposition(f, topo), float(f.ts[0])) for f in frames if f.kind == "gpu"]
    server = ScrapeServer(pages)
    try:
        result = CliRunner().invoke(cli, ["watch", "--source", "dcgm", "--url", server.url, "--interval", "0.02",
                                          "--polls", str(len(pages)), "--port", "0",
                                          "--findings", str(tmp_path / "findings.jsonl")])
    finally:
        server.close()
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["name"] == "watch" and summary["samples"] == len(pages) * 16 and summary["input_problems"] == 0
    found = [finding_from_dict(json.loads(line)) for line in (tmp_path / "findings.jsonl").read_text().splitlines()]
    throttles = [f for f in found if f.type == "prediction" and getattr(f, "event", "") == "thermal_throttle"]
    derived = Topology.from_gpu_hosts([(f"node{n}", g) for n in range(2) for g in range(8)])
    assert {derived.gpus[p.slot] for p in throttles} == {"node0/gpu5"}
    assert onset - min(p.ts for p in throttles) >= 600  # ten minutes ahead at least


def test_watch_counts_what_the_source_counts_and_predicts_nothing_on_a_steady_gpu(tmp_path: Path,
                                                                                   shared_data: Path):
    """The real Tesla T4 scrape, served as it is (steady, idle), with a broken line added: no
    prediction, and the source's problem shows in the watch's counters (exported with the rest);
    what the healthy page serves at every scrape does not."""
    scrape = (shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom").read_text()
    server = ScrapeServer([scrape + 'DCGM_FI_DEV_GPU_TEMP{gpu="0" 41\n'])
    try:
        result = CliRunner().invoke(cli, ["watch", "--source", "dcgm", "--url", server.url, "--interval", "0.02",
                                          "--polls", "3", "--port", "0"], env={"COLUMNS": "300"})
    finally:
        server.close()
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["samples"] == 3 * 2 and summary["findings"].get("prediction", 0) == 0  # two GPUs a scrape
    assert "telemetry: 6 samples" in result.output  # counted once, by the pipeline
    assert "dcgm/malformed line 3" in result.output  # the source's count, once per poll
    # The page's two GPUs report disjoint fields, and six of its metrics are not read: neither is
    # bad input, so neither grows with the polls (each poll had counted 16 such problems on 2
    # samples, and ForeshockInputProblems would have fired on a healthy exporter).
    assert summary["input_problems"] == 3 + 6
    assert "missing_values" not in result.output


def test_watch_says_why_when_the_source_gives_nothing():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"
    result = CliRunner().invoke(cli, ["watch", "--source", "dcgm", "--url", closed, "--interval", "0.02",
                                      "--polls", "2", "--port", "0"])
    assert result.exit_code == 1
    assert "nothing to watch" in result.output and "scrape failed ×2" in result.output


@pytest.mark.parametrize("sig, said", [("SIGINT", "Ctrl-C"), ("SIGTERM", "SIGTERM")])
def test_ctrl_c_ends_the_watch_with_its_summary(shared_data: Path, sig: str, said: str,
                                                monkeypatch: pytest.MonkeyPatch):
    """The first Ctrl-C (or SIGTERM, what systemd and docker send, which used to kill it without
    its summary) stops the polling after the poll in progress; the summary still prints and the
    command succeeds (--duration is only the test's safety net)."""
    import os
    import signal
    import time

    from foreshock.cli import watch

    signum = getattr(signal, sig)
    # The signal is sent once the run has processed two samples, 0.2 s later (while it waits for
    # a poll): timed from the frames, not from the start, since a cold first frame (the bank's
    # kernels loaded or compiled) can take longer than any fixed delay, and never before watch's
    # handlers are in place (run_with_progress is called with them installed)
    threads: list[threading.Thread] = []
    signalled: list[float] = []
    running = watch.run_with_progress

    def kill() -> None:
        time.sleep(0.2)
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signum)

    def counted(frames: Any) -> Any:
        samples = 0
        for frame in frames:
            yield frame
            samples += len(frame)  # back here, the run has processed the frame
            if samples >= 2 and not threads:
                threads.append(threading.Thread(target=kill, daemon=True))
                threads[-1].start()

    def signalling(run: Any, frames: Any, *args: Any, **kwargs: Any) -> Any:
        return running(run, counted(frames), *args, **kwargs)

    monkeypatch.setattr(watch, "run_with_progress", signalling)
    # Outside watch's handlers the signal is only recorded: one that came after the run had ended
    # on its own would otherwise end pytest. (A disposition inherited as ignored, the suite run in
    # the background or under nohup, watch would rightly have left ignored.)
    strays: list[int] = []
    inherited = signal.signal(signum, lambda got, _frame: strays.append(got))
    before = signal.getsignal(signum)
    server = ScrapeServer([(shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom").read_text()])
    try:
        try:
            result = CliRunner().invoke(cli, ["watch", "--source", "dcgm", "--url", server.url, "--interval", "0.05",
                                              "--duration", "120", "--port", "0"])
            ended = time.monotonic()
            for thread in threads:
                thread.join()
        finally:
            server.close()
        assert result.exit_code == 0, result.output
        assert len(signalled) == 1 and not strays, result.output
        # stopped at the signal: ignored, the watch would run on to --duration, 120 s from its
        # start (the signal comes after the first frames, seconds in, a minute at the most cold)
        assert ended - signalled[0] < 10, result.output
        assert f"stopped by {said}" in result.output
        assert json.loads(result.output.strip().splitlines()[-1])["samples"] >= 2
        assert signal.getsignal(signum) is before  # watch put back what it found: the next Ctrl-C acts as before
    finally:
        signal.signal(signum, inherited)


def test_watch_reads_gpus_and_the_nodes_bmc_together(tmp_path: Path, shared_data: Path, monkeypatch):
    """An H200 node through nvidia-smi (the real capture) and its BMC over Redfish beside it:
    both kinds reach the bank, and the BMC's stopped fan flags that node."""
    from test_streams_nvidia_smi import H200, make_stub
    from test_streams_redfish import PASSWORD, USER, TestBmc, legacy_tree

    stub, _ = make_stub(tmp_path, shared_data / H200)
    bmc = TestBmc(legacy_tree((7200.0, 0.0, 7100.0)))  # the second fan has stopped
    monkeypatch.setenv("FORESHOCK_BMC_USER", USER)
    monkeypatch.setenv("FORESHOCK_BMC_PASSWORD", PASSWORD)
    try:
        result = CliRunner().invoke(cli, ["watch", "--source", "nvidia-smi", "--executable", str(stub),
                                          "--node", "h200-test", "--interval", "0.1", "--polls", "8",
                                          "--bmc", bmc.url, "--bmc-interval", "0.2", "--port", "0",
                                          "--findings", str(tmp_path / "findings.jsonl")])
    finally:
        bmc.close()
    assert result.exit_code == 0, result.output
    assert "and 1 BMC:" in result.output
    found = [finding_from_dict(json.loads(line)) for line in (tmp_path / "findings.jsonl").read_text().splitlines()]
    fans = [f for f in found if f.type == "anomaly" and f.entity_kind == "node" and f.field == "fan_speed"]
    assert fans and "h200-test reads 0% of full speed" in fans[0].reason
    assert bmc.requests.count("/redfish/v1/Chassis/1U/Thermal") >= 2  # polled on its own clock meanwhile


def test_a_sample_served_again_is_not_read_twice():
    """A Prometheus federation serves each GPU's last scraped sample, with its scrape time, until
    the next scrape: polled faster than that, the same sample comes back. It is left out, and
    not counted as a duplicate (a problem); a newer one is read."""
    from foreshock.health import PipelineHealth
    from foreshock.streams.dcgm import DcgmScrapeSource

    page = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="node7"} 41 %d\nDCGM_FI_DEV_GPU_TEMP{gpu="1",Hostname="node7"} 43 %d\n'
    server = ScrapeServer([page % (1000, 1000), page % (1000, 1000), page % (1000, 2000)])
    try:
        src = DcgmScrapeSource(server.url, interval=0.02, health=PipelineHealth())
        polls = [src.poll() for _ in range(3)]
    finally:
        server.close()
    assert [[f.slot.tolist() for f in frames] for frames in polls] == [[[0, 1]], [], [[1]]]
    assert polls[2][0].ts.tolist() == [2.0] and src.health.total_problems() == 0
