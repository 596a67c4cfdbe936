"""Replay end to end: Parquet decode -> input guard -> detector bank -> exporter store update.

Writes a synthetic recording (GPU frames of a 4,096-GPU cluster, one tick per second, with a
slow thermal ramp on a few GPUs so detectors do real work), then replays it at --max through the
embedded pipeline with the default detector bank. Reports samples/s (median, min, max of the
runs) and the speed-up over real time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _util import emit, repeat  # noqa: E402

from foreshock.detectors.bank import DetectorBank  # noqa: E402
from foreshock.frames import Frame  # noqa: E402
from foreshock.recording import RecordingWriter  # noqa: E402
from foreshock.streams.embedded import EmbeddedPipeline  # noqa: E402
from foreshock.streams.sources import ReplaySource  # noqa: E402
from foreshock.topology import Topology  # noqa: E402


def make_recording(path: Path, nodes: int, ticks: int) -> Topology:
    topo = Topology.from_dict({
        "cluster": "bench",
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
        "racks": [{"name": f"rack{r}", "row": "row0"} for r in range(max(1, nodes // 4))],
        "nodes": [{"name": f"node{i}", "rack": f"rack{i // 4}", "gpus": 8} for i in range(nodes)],
    })
    n = topo.size("gpu")
    rng = np.random.default_rng(0)
    with RecordingWriter(path, topo, {"interval": 1.0}) as w:
        for t in range(ticks):
            temp = 50 + rng.normal(0, 0.4, n)
            temp[:8] += 0.02 * t
            w.write(Frame("gpu", np.full(n, 1.7e9 + t), np.arange(n), {
                "gpu_temp": np.round(temp), "hbm_temp": np.round(temp - 10), "power": 600 + rng.normal(0, 5, n),
                "power_limit": np.full(n, 700.0), "sm_clock": np.full(n, 1.98e9), "util": np.ones(n),
                "throttle_reasons": np.zeros(n), "energy": np.full(n, 1e6 + 600.0 * t)}))
    return topo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rec"
        topo = make_recording(path, args.nodes, args.ticks)
        samples = topo.size("gpu") * args.ticks
        speedups = []

        def once() -> float:
            source = ReplaySource(str(path))
            pipeline = EmbeddedPipeline(topo, DetectorBank.from_names(topo))
            stats = pipeline.run(source)
            assert stats.samples == samples
            speedups.append(stats.speedup)
            return stats.samples_per_s

        rate = repeat(once, runs=args.runs)
    print(f"replay end to end: {rate['median']:,.0f} GPU samples/s (min {rate['min']:,.0f}, max {rate['max']:,.0f}); "
          f"{topo.size('gpu')} GPUs at 1 s replayed {np.median(speedups):,.0f}x faster than real time")
    emit("replay_end_to_end", gpus=topo.size("gpu"), samples=samples, samples_per_s=round(rate["median"]),
         samples_per_s_min=round(rate["min"]), samples_per_s_max=round(rate["max"]),
         speedup_vs_real_time=round(float(np.median(speedups))))


if __name__ == "__main__":
    main()
