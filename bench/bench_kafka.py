"""End-to-end throughput and latency through the real Kafka broker: agent -> broker -> faust
workers -> findings. `make bench-kafka` starts and stops the broker around it.

Phase 1 (throughput): a recording is replayed as fast as the agent can publish; samples/s =
samples / (first publish -> last findings message consumed). Phase 2 (latency): the same
recording paced at real time with timestamps shifted to now; latency = time the findings
message is consumed - the newest sample timestamp of its piece. Prints figures, then a JSON
line last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from foreshock.streams.kafka_agent import FramePublisher, run_agent
from foreshock.streams.kafka_codec import decode_findings
from foreshock.streams.kafka_config import KafkaSettings
from foreshock.streams.kafka_topics import Topics, ensure_topics
from foreshock.streams.sources import ReplaySource


def start_workers(settings: KafkaSettings, topics: Topics, group: str, topology: Path, n: int,
                  log_dir: Path) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i in range(n):
        log = open(log_dir / f"worker{i}.log", "wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "foreshock.cli.main", "worker", "--kafka", settings.bootstrap,
             "--namespace", topics.namespace, "--partitions", str(topics.partitions), "--group", group,
             "--topology", str(topology), "--port", "0", "--checkpoint-interval", "5"],
            stdout=log, stderr=subprocess.STDOUT))
    admin = KafkaAdminClient(**settings.kafka_python())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            info = admin.describe_groups([group])[group]
            if info["group_state"] == "Stable" and len(info["members"]) == n:
                break
        except Exception:
            pass
        time.sleep(0.5)
    admin.close()
    return procs


def consume(settings: KafkaSettings, topic: str, want: list[int], timeout_s: float,
            start_offset: int) -> tuple[list[float], list[float], int]:
    """(consume wall time, piece 'now') per distinct piece, until ``want`` (filled in by the
    caller once the agent is done) pieces arrived."""
    consumer = KafkaConsumer(**settings.kafka_python(), enable_auto_commit=False, max_partition_fetch_bytes=8 << 20)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, start_offset)
    seen: set[tuple[str, int, int]] = set()
    walls, nows = [], []
    deadline = time.monotonic() + timeout_s
    end = start_offset
    while (not want or len(seen) < want[0]) and time.monotonic() < deadline:
        for record in consumer.poll(timeout_ms=200).get(tp, []):
            end = record.offset + 1
            msg = decode_findings(record.value)
            if msg.piece_id not in seen:
                seen.add(msg.piece_id)
                if msg.now is not None:
                    walls.append(time.time())
                    nows.append(msg.now)
    consumer.close()
    if not want or len(seen) < want[0]:
        raise SystemExit(f"only {len(seen)} of {want} pieces came back within {timeout_s} s")
    return walls, nows, end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kafka", default=os.environ.get("FORESHOCK_KAFKA", "127.0.0.1:19092"))
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=180.0, help="simulated seconds in the recording")
    ap.add_argument("--workers", type=int, default=1, help="more than one only helps with more cores")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--latency-seconds", type=float, default=15.0, help="real-time phase length")
    args = ap.parse_args()

    from foreshock.simulator import ClusterSimulator

    settings = KafkaSettings(args.kafka)
    tmp = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    rec = tmp / "rec"
    ClusterSimulator(gpus=args.gpus, scenario="cooling-loss", seed=1, duration=args.seconds).record(rec)
    topics = ensure_topics(settings, Topics(f"bench{uuid.uuid4().hex[:6]}.", args.partitions))
    group = f"bench-{topics.namespace}"
    procs = start_workers(settings, topics, group, rec / "topology.yaml", args.workers, tmp)
    try:
        # phase 1: throughput
        source = ReplaySource(str(rec), batch_rows=16384)
        t0 = time.perf_counter()
        stats = run_agent(settings, source, source.topology, topics, agent_id="bench")
        publish_s = time.perf_counter() - t0
        _, _, end = consume(settings, topics.findings, [stats.pieces], 300, 0)
        total_s = time.perf_counter() - t0
        samples_per_s = stats.samples / total_s
        # phase 2: latency at real time (the last latency_seconds of telemetry, shifted to now)
        frames = list(source.recording.iter_frames(16384))
        t_end = max(float(f.ts.max()) for f in frames if len(f))
        tail = [f for f in frames if len(f) and float(f.ts.min()) >= t_end - args.latency_seconds]
        from foreshock.frames import Frame
        from foreshock.streams.sources import paced as pace

        # one frame per kind and tick, as a live source sends them
        ticks = [f.take(f.ts == t) for f in tail for t in np.unique(f.ts)]
        ticks.sort(key=lambda f: float(f.ts[0]))
        publisher = FramePublisher(settings, source.topology, topics, agent_id="bench-rt", publish_topology=False)
        result: dict[str, Any] = {}
        want: list[int] = []
        reader = threading.Thread(target=lambda: result.update(r=consume(settings, topics.findings, want, 120, end)))
        reader.start()
        shift = time.time() - float(ticks[0].ts[0])  # the first tick is "now"
        for frame in pace((Frame(f.kind, f.ts + shift, f.slot, f.columns) for f in ticks), 1.0):
            publisher.publish(frame)
        publisher.close()
        want.append(publisher.stats.pieces)
        reader.join()
        walls, nows, _ = result["r"]
        latency = np.array(walls) - np.array(nows)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    p50, p99 = float(np.percentile(latency, 50)), float(np.percentile(latency, 99))
    per_worker = samples_per_s / args.workers
    # a 100,000-GPU cluster at 1 s: samples per second in the same mix of kinds as the recording
    per_gpu = stats.samples / (args.gpus * args.seconds)
    need = 100_000 * per_gpu / per_worker
    print(f"recording: {args.gpus} GPUs x {args.seconds:.0f} s = {stats.samples:,} samples "
          f"({per_gpu:.1f} samples per GPU-second, all kinds), {stats.pieces} messages")
    print(f"throughput: agent published in {publish_s:.2f} s; end to end {total_s:.2f} s "
          f"-> {samples_per_s:,.0f} samples/s with {args.workers} workers ({per_worker:,.0f} per worker)")
    print(f"latency at real time ({len(latency)} pieces): p50 {p50:.3f} s, p99 {p99:.3f} s")
    print(f"100,000 GPUs at 1 s = {100_000 * per_gpu:,.0f} samples/s -> ~{np.ceil(need):.0f} workers "
          f"at the measured {per_worker:,.0f} samples/s per worker (this 2-core machine, broker and agent sharing it)")
    print(json.dumps({"name": "kafka_end_to_end", "samples_per_s": round(samples_per_s),
                      "latency_p50_s": round(p50, 4), "latency_p99_s": round(p99, 4), "workers": args.workers,
                      "per_worker_samples_per_s": round(per_worker), "workers_for_100k_gpus": int(np.ceil(need))}))


if __name__ == "__main__":
    main()
