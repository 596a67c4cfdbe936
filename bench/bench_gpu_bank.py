"""The GPU detector bank vs river's HalfSpaceTrees, on the same observations, in the same run.

One observation = all fields of one GPU at one time. The stream: ``--gpus`` GPUs (16,384: the
Llama 3 cluster) sampled ``--ticks`` times per run, ``--interval`` s apart (1 s by default: one tick
in ten solves the thermal and power forecasts; at 10 s every tick does), one GPU frame (and one
rack frame) per tick,
as the embedded pipeline delivers them; GPUs alternate compute (~600 W) and communication
(~300 W) samples with NVML's +-5 W noise, a few have a failing
thermal interface so the predictive paths run too. foreshock's GPU bank — thermal, power,
cooling, straggler (the first three share one thermal fit per frame), and the incident engine
that ``DetectorBank.from_names`` adds — processes every frame end to end (column gathering,
kernels, findings), on one core. Beside it, on the same frames in the same runs (the two banks
take turns going first), the default bank's detectors that take GPU frames (``DEFAULT_BANK``'s,
from the registry: robust_zscore, throttle_bits and xid besides the four) with the incident
engine: what the default pipeline's bank costs a GPU frame (its input guard and store excluded).
river's HalfSpaceTrees (``score_one`` then ``learn_one``, as river runs) gets ``--river-points``
observations of the same stream as the shared per-GPU feature vector (computed beforehand, not
timed), taken once the feature stream is warm (every slope defined: a fresh stream's first ticks
give NaN slopes, which river would see as constants). Each figure is the median of ``--runs``
runs (min, max); the fastest tick (one rack and one GPU frame) is printed beside them, the
figure least moved by this VM's speed drifting.
State bytes per GPU: every array of each bank's detector state (a shared one once) over the GPU
count.

    .venv/bin/python bench/bench_gpu_bank.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _util import emit, repeat, summary  # noqa: E402

from foreshock import facts  # noqa: E402
from foreshock.detectors.bank import DetectorBank  # noqa: E402
from foreshock.detectors.baselines import FEATURE_LIMITS, FEATURES, FeatureStream  # noqa: E402
from foreshock.detectors.registry import DEFAULT_BANK, create  # noqa: E402
from foreshock.frames import Frame  # noqa: E402
from foreshock.health import PipelineHealth  # noqa: E402
from foreshock.topology import Topology  # noqa: E402

GPU_BANK = ("thermal", "power", "cooling", "straggler")
"""The headline bank: the predictive detectors the throttling issue's target names."""
RIVER_WARM_TICKS_MAX = 1000
"""At most this many ticks warm river's feature stream (its slopes are NaN for their first 30 s)."""


def default_gpu_detectors(topo: Topology) -> tuple[str, ...]:
    """The detectors of the default bank (``DEFAULT_BANK``: what demo, replay and watch run) that take
    GPU frames, asked of the registry: the default pipeline runs every one of them on each GPU frame,
    so a figure for ``GPU_BANK`` alone flatters what a GPU costs it."""
    return tuple(name for name in DEFAULT_BANK if "gpu" in create(name, topo).kinds)


def cluster(gpus: int) -> Topology:
    nodes = gpus // 8
    racks = max(1, nodes // 4)
    return Topology.from_dict({
        "cluster": "bench",
        "rows": [{"name": f"row{r}", "cooling_loop": f"cdu{r}"} for r in range(max(1, racks // 4))],
        "racks": [{"name": f"rack{k}", "row": f"row{min(k // 4, max(1, racks // 4) - 1)}"} for k in range(racks)],
        "nodes": [{"name": f"node{i}", "rack": f"rack{min(i // 4, racks - 1)}"} for i in range(nodes)],
        "jobs": [{"name": f"job{j}", "nodes": [f"node{i}" for i in range(j * 16, min((j + 1) * 16, nodes))]}
                 for j in range((nodes + 15) // 16)],
    })


class Stream:
    """Endless GPU and rack frames, ``interval`` s apart."""

    def __init__(self, topo: Topology, seed: int = 0, interval: float = 1.0) -> None:
        self.topo = topo
        self.interval = interval
        self.rng = np.random.default_rng(seed)
        n = topo.size("gpu")
        self.n = n
        self.r = facts.THERMAL_RESISTANCE_C_PER_W * (1 + 0.03 * self.rng.standard_normal(n))
        self.failing = self.rng.random(n) < 0.002
        self.energy = self.rng.uniform(1e8, 1e9, n)
        self.temp = 24 + self.r * 600
        self.t = 1.7e9

    def tick(self) -> tuple[Frame, Frame]:
        n, rng = self.n, self.rng
        self.t += self.interval
        self.r[self.failing] *= 1.0002
        # training steps: most 1-s samples land in compute (~600 W), some in communication
        power = np.where(rng.random(n) < 0.2, 300.0, 600.0) + rng.uniform(-5, 5, n)
        self.energy += power * self.interval
        self.temp = 24 + self.r * power + (self.temp - 24 - self.r * power) * np.exp(-self.interval / 10)
        racks = self.topo.size("rack")
        rack = Frame("rack", np.full(racks, self.t), np.arange(racks), {"inlet_temp": np.full(racks, 24.0)})
        gpu = Frame("gpu", np.full(n, self.t), np.arange(n), {
            "gpu_temp": np.round(self.temp), "hbm_temp": np.round(24 + 0.027 * power), "power": power,
            "power_limit": np.full(n, 700.0), "energy": self.energy.copy(),
            "slowdown_temp": np.full(n, 89.0), "sm_clock": np.full(n, 1.98e9), "sm_clock_max": np.full(n, 1.98e9),
            "util": np.ones(n), "throttle_reasons": np.zeros(n)})
        return rack, gpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--ticks", type=int, default=30, help="frames per timed run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--river-points", type=int, default=20000)
    ap.add_argument("--interval", type=float, default=1.0,
                    help="seconds between ticks: at 1 s one tick in ten solves the thermal and power forecasts "
                         "(forecast_every_s), at 10 s (the evaluation's sampling; the simulator's default is 1 s) "
                         "every tick does")
    args = ap.parse_args()

    topo = cluster(args.gpus)
    stream = Stream(topo, interval=args.interval)
    default_names = default_gpu_detectors(topo)
    bank = DetectorBank.from_names(topo, GPU_BANK)
    default = DetectorBank.from_names(topo, default_names)
    for _ in range(5):  # compile and warm the state
        for frame in stream.tick():
            bank.update(frame)
            default.update(frame)

    findings = 0
    frame_s: list[float] = []  # each tick's time (rack and GPU frame), for the fastest tick
    default_rates: list[float] = []  # the default GPU detectors' rate in each run, beside the headline's

    def time_bank(target: DetectorBank, frames: list[tuple[Frame, Frame]], headline: bool) -> float:
        nonlocal findings
        t0 = time.perf_counter()
        for rack, gpu in frames:
            t1 = time.perf_counter()
            target.update(rack)
            made = len(target.update(gpu))
            if headline:
                findings += made
                frame_s.append(time.perf_counter() - t1)
        return args.ticks * args.gpus / (time.perf_counter() - t0)

    def run_banks() -> float:
        frames = [stream.tick() for _ in range(args.ticks)]
        # the same frames for both; turns at going first, so neither always meets them cold in cache
        if len(default_rates) % 2:
            default_rates.append(time_bank(default, frames, False))
            return time_bank(bank, frames, True)
        ours = time_bank(bank, frames, True)
        default_rates.append(time_bank(default, frames, False))
        return ours

    ours = repeat(run_banks, runs=args.runs, warmup=1)
    theirs = summary(default_rates[1:])  # the warm-up run's left out, as repeat leaves it out of ours
    # this VM's speed drifts by up to ~1.6x over minutes (river's figure moves with it): the
    # fastest tick is the code's cost with the least of that drift in it
    fastest = args.gpus / min(frame_s[args.ticks:])  # the warm-up run's ticks left out

    # river on the same observations: the shared feature vector, one event at a time, from a warm
    # feature stream (its slopes need 30 s of samples; before, they are NaN, set to a constant)
    from river import anomaly

    feats = FeatureStream(topo, PipelineHealth(), "bench")
    def next_features() -> np.ndarray:
        rack, gpu = stream.tick()
        feats.observe_rack(rack)
        return feats.features(gpu)[1]

    warm_ticks = 0
    x = next_features()
    while not np.isfinite(x).all() and warm_ticks < RIVER_WARM_TICKS_MAX:
        warm_ticks += 1
        x = next_features()
    nan_share = float((~np.isfinite(x)).mean())  # 0 once warm; said if the cap was reached first
    rows: list[dict[str, float]] = []
    lo = np.array([FEATURE_LIMITS[f][0] for f in FEATURES])
    while True:
        x = np.where(np.isfinite(x), x, lo)
        rows.extend(dict(zip(FEATURES, r)) for r in x[: args.river_points - len(rows)].tolist())
        if len(rows) >= args.river_points:
            break
        x = next_features()
    limits = {k: (float(a), float(b)) for k, (a, b) in FEATURE_LIMITS.items()}

    def run_river() -> float:
        model = anomaly.HalfSpaceTrees(n_trees=10, height=8, window_size=250, limits=limits,  # type: ignore[arg-type]
                                       seed=42)
        t0 = time.perf_counter()
        for row in rows:
            model.score_one(row)
            model.learn_one(row)
        return len(rows) / (time.perf_counter() - t0)

    river = repeat(run_river, runs=max(1, min(args.runs, 3)), warmup=0)
    state = bank.state_nbytes() / args.gpus
    default_state = default.state_nbytes() / args.gpus
    print(f"{args.gpus:,} GPUs, {args.ticks} frames {args.interval:g} s apart per run, both banks on the same frames "
          f"(each with the incident engine):")
    print(f"  foreshock GPU bank ({', '.join(GPU_BANK)}):")
    print(f"    {ours['median']:>14,.0f} obs/s  (min {ours['min']:,.0f}, max {ours['max']:,.0f}); "
          f"state {state:,.0f} bytes per GPU")
    print(f"  default bank's GPU detectors ({', '.join(default_names)}):")
    print(f"    {theirs['median']:>14,.0f} obs/s  (min {theirs['min']:,.0f}, max {theirs['max']:,.0f}); "
          f"state {default_state:,.0f} bytes per GPU")
    print(f"  river HST  {river['median']:>14,.0f} obs/s  (min {river['min']:,.0f}, max {river['max']:,.0f}; "
          f"{len(rows):,} obs after {warm_ticks} warm-up ticks of the feature stream"
          + (f", {nan_share:.0%} of features still NaN" if nan_share else "") + ")")
    print(f"  ratio      {ours['median'] / river['median']:>14,.0f} x  (GPU bank {', '.join(GPU_BANK)} vs river); "
          f"default GPU detectors vs river {theirs['median'] / river['median']:,.0f} x")
    print(f"  fastest tick {fastest:>12,.0f} obs/s  ({1e9 / fastest:.0f} ns per GPU, GPU bank "
          f"{', '.join(GPU_BANK)}; the medians carry this VM's drift)")
    print(f"  findings of the GPU bank during the timed runs: {findings}")
    emit("detector_bank_vs_river", foreshock_obs_per_s=round(ours["median"]), river_obs_per_s=round(river["median"]),
         ratio=round(ours["median"] / river["median"], 1), state_bytes_per_gpu=round(state),
         foreshock_min=round(ours["min"]), foreshock_max=round(ours["max"]), river_min=round(river["min"]),
         river_max=round(river["max"]), fastest_tick_obs_per_s=round(fastest), gpus=args.gpus, runs=args.runs,
         interval_s=args.interval,
         detectors=list(GPU_BANK),
         default_gpu_detectors=list(default_names), default_gpu_obs_per_s=round(theirs["median"]),
         default_gpu_min=round(theirs["min"]), default_gpu_max=round(theirs["max"]),
         default_gpu_ratio=round(theirs["median"] / river["median"], 1),
         default_gpu_state_bytes_per_gpu=round(default_state),
         river_warm_ticks=warm_ticks, river_nan_share=round(nan_share, 4))

if __name__ == "__main__":
    main()
