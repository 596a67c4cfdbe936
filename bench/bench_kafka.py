"""End-to-end throughput and latency through the real Kafka broker: agent -> broker -> faust
workers -> findings. `make bench-kafka` starts and stops the broker around it.

Phase 1 (throughput, ``--runs`` times after ``--warmup-runs`` uncounted ones, each on fresh
topics and fresh workers): a simulated
recording is replayed as fast as the agent can publish, one frame per kind and sampling tick
(what a live source sends); samples/s = samples / (first publish -> last piece report read
back from the findings topic). Phase 2 (latency): the recording's last seconds paced at real
time with timestamps shifted to now; latency = time the findings message is read - the newest
sample timestamp of its piece. Prints figures (median, min, max of the runs), then a JSON line
last.

Everything shares this machine: the agent, the broker, the workers and this reader. On a
machine with few cores the end-to-end figure is the *pipeline's* rate under that contention,
and the per-worker figure (end-to-end / workers) is a lower bound of what one worker does on
a core of its own. The CPU seconds each part spent per million samples (the broker's with
``--broker-pid``) say where the time goes, and what the cores could do with nothing else on them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from foreshock.frames import Frame
from foreshock.recording import Recording
from foreshock.streams.kafka_agent import AgentStats, FramePublisher, run_agent
from foreshock.streams.kafka_codec import decode_findings, is_telemetry
from foreshock.streams.kafka_config import KafkaSettings
from foreshock.streams.kafka_topics import Topics, ensure_topics
from foreshock.streams.sources import ReplaySource, paced

TARGET_SAMPLES_PER_S = 1_000_000
TARGET_P99_S = 2.0


def start_workers(settings: KafkaSettings, topics: Topics, group: str, topology: Path, n: int,
                  log_dir: Path, incident_worker: bool = False) -> list[subprocess.Popen[bytes]]:
    """``n`` workers of one group (all roles), or with ``incident_worker`` ``n`` detect workers
    and one incidents worker (groups GROUP.detect and GROUP.incidents); once every group is stable."""
    roles = [("detect", n), ("incidents", 1)] if incident_worker else [("all", n)]
    procs = []
    for role, count in roles:
        for i in range(count):
            log = open(log_dir / f"{group}-{role}{i}.log", "wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "foreshock.cli.main", "worker", "--kafka", settings.bootstrap,
                 "--namespace", topics.namespace, "--partitions", str(topics.partitions), "--group", group,
                 "--topology", str(topology), "--port", "0", "--checkpoint-interval", "5", "--role", role],
                stdout=log, stderr=subprocess.STDOUT))
    want = {group if role == "all" else f"{group}.{role}": count for role, count in roles}
    admin = KafkaAdminClient(**settings.kafka_python())
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            try:
                infos = admin.describe_groups(list(want))
                if all(infos[g]["group_state"] == "Stable" and len(infos[g]["members"]) == c
                       for g, c in want.items()):
                    return procs
            except Exception:
                pass
            if any(p.poll() is not None for p in procs):
                raise SystemExit(f"a worker exited during start-up (logs in {log_dir})")
            time.sleep(0.5)
    finally:
        admin.close()
    raise SystemExit(f"workers of {group} did not join within 180 s (logs in {log_dir})")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class FindingsReader(threading.Thread):
    """Reads the findings topic from ``start_offset`` until ``expect(n)`` distinct pieces were
    reported; records (wall time read, piece 'now') per distinct non-empty piece."""

    def __init__(self, settings: KafkaSettings, topic: str, start_offset: int = 0, timeout_s: float = 300) -> None:
        super().__init__(daemon=True)
        self.settings, self.topic, self.start_offset, self.timeout_s = settings, topic, start_offset, timeout_s
        self.want: int | None = None
        self.walls: list[float] = []
        self.nows: list[float] = []
        self.end_offset = start_offset
        self.last_wall = 0.0
        self.cpu_s = 0.0  # this thread's CPU time: the reader's share of this process
        self.seen: set[tuple[str, int, int]] = set()

    def expect(self, pieces: int) -> None:
        self.want = pieces

    def run(self) -> None:
        consumer = KafkaConsumer(**self.settings.kafka_python(), enable_auto_commit=False,
                                 max_partition_fetch_bytes=8 << 20)
        tp = TopicPartition(self.topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, self.start_offset)
        deadline = time.monotonic() + self.timeout_s
        try:
            while (self.want is None or len(self.seen) < self.want) and time.monotonic() < deadline:
                for record in consumer.poll(timeout_ms=100).get(tp, []):
                    self.end_offset = record.offset + 1
                    if is_telemetry(record.headers):
                        continue
                    wall = time.time()
                    for msg in decode_findings(record.value, with_findings=False):
                        if msg.piece_id not in self.seen:
                            self.seen.add(msg.piece_id)
                            self.last_wall = time.perf_counter()
                            if msg.now is not None:
                                self.walls.append(wall)
                                self.nows.append(msg.now)
        finally:
            consumer.close()
            self.cpu_s = time.thread_time()

    def result(self) -> None:
        self.join()
        if self.want is None or len(self.seen) < self.want:
            raise SystemExit(f"only {len(self.seen)} of {self.want} pieces came back within {self.timeout_s} s")


@dataclass
class RunFigures:
    """One throughput run: wall seconds and the CPU seconds each part spent."""

    total_s: float
    publish_s: float
    worker_cpu: float
    per_worker_cpu: list[float]  # each worker's own (the incidents worker's last, when there is one)
    agent_cpu: float  # this process, less the findings reader's thread
    reader_cpu: float
    broker_cpu: float  # NaN without --broker-pid
    stats: AgentStats


def throughput_run(settings: KafkaSettings, rec: Path, partitions: int, workers: int, log_dir: Path,
                   compression: str | None, broker_pid: int | None,
                   incident_worker: bool = False) -> tuple[RunFigures, Any]:
    """One run on fresh topics and workers: its figures and context."""
    topics = ensure_topics(settings, Topics(f"bench{uuid.uuid4().hex[:6]}.", partitions))
    group = f"bench-{topics.namespace}"
    procs = start_workers(settings, topics, group, rec / "topology.yaml", workers, log_dir, incident_worker)
    reader = FindingsReader(settings, topics.findings)
    source = ReplaySource(str(rec))
    cpu0 = [cpu_seconds(p.pid) for p in procs]
    broker0 = cpu_seconds(broker_pid) if broker_pid else float("nan")
    own0 = time.process_time()
    reader.start()
    t0 = time.perf_counter()
    stats = run_agent(settings, source, source.topology, topics, agent_id="bench", compression=compression)
    publish_s = time.perf_counter() - t0
    reader.expect(stats.pieces)
    reader.result()
    per_worker = [cpu_seconds(p.pid) - c0 for p, c0 in zip(procs, cpu0)]
    figures = RunFigures(reader.last_wall - t0, publish_s, sum(per_worker), per_worker,
                         time.process_time() - own0 - reader.cpu_s, reader.cpu_s,
                         cpu_seconds(broker_pid) - broker0 if broker_pid else float("nan"), stats)
    return figures, (topics, procs, reader.end_offset, source)


def field_values_per_sample(rec: Path) -> float:
    """Reported field values (not NaN) per sample (row) of the recording: what a Prometheus-style
    count of samples — one per series and timestamp — would count for each of ours."""
    recording = Recording.open(rec)
    rows = values = 0
    for kind in recording.kinds():
        for frame in recording.iter_kind(kind):
            rows += len(frame)
            values += sum(int(np.count_nonzero(~np.isnan(c))) for c in frame.columns.values())
    return values / rows if rows else 0.0


def latency_run(settings: KafkaSettings, topics: Topics, source: ReplaySource, start_offset: int,
                seconds: float, compression: str | None) -> np.ndarray:
    """The last ``seconds`` of telemetry at real time, shifted to now: seconds from each piece's
    newest sample to its findings being read."""
    frames = list(source.recording.iter_frames())  # one frame per kind and tick, as a live source sends
    t_end = max(float(f.ts.max()) for f in frames if len(f))
    ticks = [f for f in frames if len(f) and float(f.ts.min()) >= t_end - seconds]
    publisher = FramePublisher(settings, source.topology, topics, agent_id="bench-rt", publish_topology=False,
                               compression=compression)
    reader = FindingsReader(settings, topics.findings, start_offset, timeout_s=120)
    reader.start()
    shift = time.time() - float(ticks[0].ts.min())  # the first tick is "now"
    for frame in paced((Frame(f.kind, f.ts + shift, f.slot, f.columns) for f in ticks), 1.0):
        publisher.publish(frame)
    publisher.close()
    reader.expect(publisher.stats.pieces)
    reader.result()
    return np.array(reader.walls) - np.array(reader.nows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kafka", default=os.environ.get("FORESHOCK_KAFKA", "127.0.0.1:19092"))
    # 8,192 GPUs: 4,096 per partition (2), the size of piece a fleet deployment hands each worker
    # (100,000 GPUs over tens of partitions is thousands per partition). A worker pays a fixed
    # cost per piece (one partition's rows of one frame, ~85 us of Python around the kernels),
    # so a small cluster cut in 4 measures that cost more than the stream: 1,024 GPUs (256 per
    # partition) gave 419k-471k samples/s, with the worker at 1.4-1.9 CPU s per million
    ap.add_argument("--gpus", type=int, default=8192)
    # 11M samples a run (~15 s): a run of a few seconds mostly measures what every run pays
    # once — fresh topics, the consumer group's join and assignment, the first fetches — not the
    # stream (1,024 GPUs x 180 s: 294k samples/s with the broker at 1.0-1.4 CPU s per million;
    # x 1800 s: 419k-471k/s with it at 0.47-0.55)
    ap.add_argument("--seconds", type=float, default=240.0, help="simulated seconds in the recording")
    # two, even on two cores: a worker is one Python thread, so with one worker the second core
    # idles once the agent has published and the worker still has its backlog to work through
    # (8,192 GPUs, 12 MB bundles: bench medians 773k-847k samples/s with 1 worker, 777k-976k with 2)
    ap.add_argument("--workers", type=int, default=2, help="worker processes (one consumer group)")
    # the incident stage sees the whole cluster's findings: on one of two all-role workers it makes
    # that worker the slow one (per-worker CPU 5.2 against 3.2 s a run); on a worker of its own the
    # two detect workers share the detection evenly (measured, 8,192 GPUs, A/B/A: bench medians
    # 1.32M and 1.10M samples/s with it, 0.89M without)
    ap.add_argument("--incident-worker", action=argparse.BooleanOptionalAction, default=True,
                    help="--workers detect workers plus one incidents worker (`foreshock worker --role`); "
                         "--no-incident-worker: all-role workers")
    # one partition per worker, as a deployment of this size runs: each worker then keeps one
    # pipeline (one set of state arrays, one checkpoint) and takes 4,096 GPUs' pieces. Measured
    # on 8,192 GPUs with 2 workers: 2 partitions 1.41 CPU s per million samples (all parts),
    # 4 partitions 2.07 — half the pieces, messages and checkpoints per sample
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="throughput runs (median, min, max reported)")
    # two: a fresh broker's JVM is still compiling through its second run of this size (broker CPU
    # over three consecutive counted runs after one warm-up: 8.0, 6.6, 3.6 s)
    ap.add_argument("--warmup-runs", type=int, default=2,
                    help="throughput runs first, not reported: a fresh broker's JVM spends its first runs "
                         "compiling (measured: 2-3x its steady CPU per sample)")
    ap.add_argument("--compression", choices=["none", "lz4", "zstd"], default="lz4",
                    help="Arrow buffer compression of the frames messages")
    ap.add_argument("--latency-seconds", type=float, default=15.0, help="real-time phase length")
    ap.add_argument("--broker-pid", type=int, default=None,
                    help="the broker's process id: its CPU time is reported too (`make bench-kafka` passes it)")
    args = ap.parse_args()
    compression = None if args.compression == "none" else args.compression

    from foreshock.simulator import ClusterSimulator

    settings = KafkaSettings(args.kafka)
    tmp = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    rec = tmp / "rec"
    ClusterSimulator(gpus=args.gpus, scenario="cooling-loss", seed=1, duration=args.seconds).record(rec)
    values_per_sample = field_values_per_sample(rec)
    rates, publish_rates, cpu_rates = [], [], []
    cpu_us: dict[str, list[float]] = {"agent": [], "broker": [], "workers": [], "reader": []}
    stats = AgentStats()
    last: Any = None
    load_before = os.getloadavg()
    try:
        for run in range(-args.warmup_runs, args.runs):
            if last is not None:
                stop_workers(last[1])
            fig, last = throughput_run(settings, rec, args.partitions, args.workers, tmp, compression,
                                       args.broker_pid, args.incident_worker)
            stats = fig.stats
            if run < 0:
                print(f"  warm-up run: {stats.samples / fig.total_s:,.0f} samples/s end to end (not counted)", flush=True)
                continue
            rates.append(stats.samples / fig.total_s)
            publish_rates.append(stats.samples / fig.publish_s)
            cpu_rates.append(stats.samples / fig.worker_cpu)
            for part, cpu in (("agent", fig.agent_cpu), ("broker", fig.broker_cpu), ("workers", fig.worker_cpu),
                              ("reader", fig.reader_cpu)):
                cpu_us[part].append(cpu / stats.samples * 1e6)
            print(f"  run {run + 1}: {rates[-1]:,.0f} samples/s end to end ({fig.total_s:.2f} s; the agent "
                  f"published in {fig.publish_s:.2f} s = {publish_rates[-1]:,.0f} samples/s; the workers used "
                  f"{fig.worker_cpu:.2f} CPU s ({' + '.join(f'{c:.2f}' for c in fig.per_worker_cpu)}) = "
                  f"{cpu_rates[-1]:,.0f} samples per worker CPU second; agent "
                  f"{fig.agent_cpu:.2f}, broker {fig.broker_cpu:.2f}, findings reader {fig.reader_cpu:.2f} CPU s)",
                  flush=True)
        topics, procs, end_offset, source = last
        latency = latency_run(settings, topics, source, end_offset, args.latency_seconds, compression)
    finally:
        if last is not None:
            stop_workers(last[1])
    shutil.rmtree(tmp, ignore_errors=True)  # the recording and the worker logs (kept when a run fails)
    rate = float(np.median(rates))
    p50, p99 = float(np.percentile(latency, 50)), float(np.percentile(latency, 99))
    per_worker = rate / args.workers
    per_core = float(np.median(cpu_rates))
    # a 100,000-GPU cluster at 1 s: samples per second in the same mix of kinds as the recording
    per_gpu = stats.samples / (args.gpus * args.seconds)
    cluster = 100_000 * per_gpu
    need = int(np.ceil(cluster / per_worker))
    need_cores = int(np.ceil(cluster / per_core))
    print(f"recording: {args.gpus} GPUs x {args.seconds:.0f} s = {stats.samples:,} samples "
          f"({per_gpu:.1f} samples per GPU-second, all kinds) in {stats.frames} frames "
          f"-> {stats.pieces} pieces in {stats.messages} messages ({stats.bytes / 1e6:.0f} MB, "
          f"{args.partitions} partitions, compression {args.compression})")
    print(f"throughput: {rate:,.0f} samples/s end to end (median of {args.runs}; min {min(rates):,.0f}, "
          f"max {max(rates):,.0f}) with {args.workers} "
          f"{'detect workers and an incidents worker' if args.incident_worker else 'worker(s)'}; the agent alone published "
          f"{np.median(publish_rates):,.0f} samples/s")
    print(f"  a sample here is one entity's row (all its fields at one time): {values_per_sample:.1f} field "
          f"values each, so {rate * values_per_sample:,.0f} field values/s — the unit Prometheus counts")
    cpu_med = {part: float(np.median(v)) for part, v in cpu_us.items()}
    cpu_total = sum(v for v in cpu_med.values() if np.isfinite(v))
    cores = os.cpu_count() or 1
    print(f"CPU per million samples (median): agent {cpu_med['agent']:.2f} s, broker {cpu_med['broker']:.2f} s, "
          f"workers {cpu_med['workers']:.2f} s, findings reader {cpu_med['reader']:.2f} s; together {cpu_total:.2f} CPU s, so "
          f"{cores} cores busy with nothing else would bound the pipeline at {cores * 1e6 / cpu_total:,.0f} samples/s")
    print(f"load average (1 min) before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} "
          f"(other processes on these cores slow every figure here)")
    print(f"latency at real time ({len(latency)} pieces): p50 {p50:.3f} s, p99 {p99:.3f} s")
    print(f"targets: >= {TARGET_SAMPLES_PER_S:,} samples/s {'met' if rate >= TARGET_SAMPLES_PER_S else 'NOT met'}, "
          f"p99 < {TARGET_P99_S:.0f} s {'met' if p99 < TARGET_P99_S else 'NOT met'} "
          f"({os.cpu_count()} cores shared by agent, broker, workers and this reader)")
    print(f"sizing: 100,000 GPUs at 1 s sampling = {cluster:,.0f} samples/s (the recording's mix of kinds)")
    print(f"  -> {need} worker{'s' if need != 1 else ''} at the measured end-to-end {per_worker:,.0f} samples/s per worker (conservative: "
          f"here each worker shares the cores with the agent, the broker and whatever else runs)")
    print(f"  -> {need_cores} worker{'s' if need_cores != 1 else ''} with a core each, from the workers' own CPU time ({per_core:,.0f} samples "
          f"per CPU second, median)")
    print(f"  either way: partitions >= workers, and few partitions per worker — a worker pays a fixed cost per "
          f"piece (one partition's rows of one frame; {args.gpus // args.partitions} GPUs per partition here), so "
          f"fewer, larger pieces cost less per sample; and one worker at a time runs the incident stage for "
          f"the whole cluster ({'here one of its own, `--role incidents`' if args.incident_worker else 'here one of the workers'})")
    print(json.dumps({"name": "kafka_end_to_end", "samples_per_s": round(rate),
                      "samples_per_s_min": round(min(rates)), "samples_per_s_max": round(max(rates)),
                      "latency_p50_s": round(p50, 4), "latency_p99_s": round(p99, 4), "workers": args.workers,
                      "incident_worker": args.incident_worker,
                      "partitions": args.partitions, "gpus": args.gpus, "runs": args.runs,
                      "agent_samples_per_s": round(float(np.median(publish_rates))),
                      "per_worker_samples_per_s": round(per_worker), "workers_for_100k_gpus": need,
                      "samples_per_worker_cpu_s": round(per_core), "workers_for_100k_gpus_one_core_each": need_cores,
                      "cpu_us_per_sample": {k: round(v, 3) if np.isfinite(v) else None for k, v in cpu_med.items()},
                      "field_values_per_s": round(rate * values_per_sample),
                      "compression": args.compression, "load_1min": round(load_before[0], 2)}))


if __name__ == "__main__":
    main()
