"""Simulator speed: a 16,384-GPU cluster (the Llama 3 training cluster) at 1 s sampling.

Runs the engine (every physics step, every frame of every kind, ground truth) for a bounded
simulated time, three times, and reports the median speed against real time with min/max —
measured in this process's CPU time, i.e. on one core even when the machine is shared (wall
clock is printed too),
the time per tick, the telemetry rows produced per second and the process's peak memory.
The issue's target is >= 20x real time on one core. The recording writer (Parquet, zstd) is
measured separately: it is I/O and compression, not simulation.

    python bench/bench_simulator.py [--gpus 16384] [--seconds 60] [--runs 3] [--record-seconds 10]

Prints readable figures, then one JSON line last with "name": "simulator".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

# one core, as the target says (numpy's BLAS is not used here, but keep it honest)
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(var, "1")

from foreshock.simulator import ClusterSimulator  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def one_run(gpus: int, seconds: float, seed: int) -> dict[str, float]:
    t0 = time.perf_counter()
    sim = ClusterSimulator(gpus=gpus, scenario="mixed", seed=seed, interval=1.0, duration=seconds * 10)
    setup = time.perf_counter() - t0
    rows = 0
    t1, c1 = time.perf_counter(), time.process_time()
    for tick in sim.iter_ticks(seconds):
        rows += sum(len(f) for f in tick)
    wall, cpu = time.perf_counter() - t1, time.process_time() - c1
    return {"setup_s": setup, "wall_s": wall, "cpu_s": cpu, "speed": seconds / cpu, "wall_speed": seconds / wall,
            "rows": rows, "links": len(sim.topology.links), "optics": sim.topology.size("optic")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--seconds", type=float, default=60.0, help="simulated seconds per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--record-seconds", type=float, default=10.0, help="simulated seconds written to Parquet (0: skip)")
    args = ap.parse_args()

    runs = [one_run(args.gpus, args.seconds, seed) for seed in range(args.runs)]
    speeds = [r["speed"] for r in runs]
    med = statistics.median(speeds)
    tick_ms = 1000.0 / med
    rows_per_s = statistics.median(r["rows"] / r["cpu_s"] for r in runs)
    wall_med = statistics.median(r["wall_speed"] for r in runs)
    print(f"simulator: {args.gpus:,} GPUs, {runs[0]['links']:,} links, {runs[0]['optics']:,} optics, 1 s sampling")
    print(f"  engine, one core (CPU time): {med:,.1f}x real time (median of {args.runs}; min {min(speeds):,.1f}x, "
          f"max {max(speeds):,.1f}x) = {tick_ms:,.1f} ms per simulated second, {rows_per_s / 1e6:,.2f} M rows/s")
    print(f"  engine, wall clock (shared machine, load {os.getloadavg()[0]:.1f}): {wall_med:,.1f}x real time")
    print(f"  setup (topology + 600 s warm-up): {statistics.median(r['setup_s'] for r in runs):,.1f} s")
    record_speed = None
    if args.record_seconds > 0:
        sim = ClusterSimulator(gpus=args.gpus, scenario="mixed", seed=0, interval=1.0, duration=3600)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            sim.topology.dump(os.path.join(tmp, "t.yaml"))  # the writer does this once, up front
            dump_s = time.perf_counter() - t0
            summary = sim.record(tmp, args.record_seconds)
        # wall clock: includes compression and I/O, excludes the one-time topology.yaml
        record_speed = summary.simulated_seconds / max(summary.wall_seconds - dump_s, 1e-9)
        print(f"  with the Parquet recording writer: {record_speed:,.1f}x real time ({summary.rows:,} rows; "
              f"plus {dump_s:,.1f} s once for topology.yaml)")
    peak = peak_rss_mb()
    target = 20.0
    print(f"  peak memory (RSS): {peak:,.0f} MiB; target >= {target:.0f}x: {'met' if med >= target else 'NOT met'}")
    sys.stdout.write(json.dumps({
        "name": "simulator", "gpus": args.gpus, "interval_s": 1.0, "simulated_s_per_run": args.seconds,
        "runs": args.runs, "speed_x_realtime": round(med, 2), "speed_x_realtime_min": round(min(speeds), 2),
        "speed_x_realtime_max": round(max(speeds), 2), "wall_speed_x_realtime": round(wall_med, 2),
        "ms_per_simulated_s": round(tick_ms, 2),
        "rows_per_s": round(rows_per_s), "record_speed_x_realtime": None if record_speed is None else round(record_speed, 2),
        "peak_rss_mib": round(peak), "target_x": target, "meets_target": med >= target,
    }) + "\n")


if __name__ == "__main__":
    main()
