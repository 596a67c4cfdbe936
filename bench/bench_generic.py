"""Generic univariate detectors vs river, on the same stream, in the same run, on one core.

The stream: ``--series`` series x ``--steps`` steps of noisy seasonal telemetry with spikes
and level shifts. foreshock runs the whole univariate bank (robust EWMA z, CUSUM, Page-Hinkley,
damped Holt, range novelty, seasonal difference) over it in batches of ``--batch`` steps; every
point goes through all six detectors, and points/s counts points (not detector-updates).
river runs, one event at a time as river does, on the first ``--river-points`` points of the
same stream: HalfSpaceTrees (river's streaming anomaly detector), and its PageHinkley and ADWIN
drift detectors; our own river adapter (learn_one/score_one per event) runs there too, to show
what the per-event Python call costs. Memory per series: the bank's state arrays per series,
against the heap one river HalfSpaceTrees holds. The multivariate detector's rate (node-steps/s, 32
fields per node) is reported alongside, and the ``mahalanobis`` pipeline detector's (GPU rows/s
through ``update(frame)`` at 1,024 GPUs, its 8 default fields). Each figure is the median of
``--runs`` runs (min, max).
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
from _util import emit, repeat  # noqa: E402

from foreshock.detectors.cusum import Cusum  # noqa: E402
from foreshock.detectors.ewma_zscore import EwmaZScore  # noqa: E402
from foreshock.detectors.holt import Holt  # noqa: E402
from foreshock.detectors.mahalanobis import MahalanobisDetector  # noqa: E402
from foreshock.detectors.multivariate import OnlineMahalanobis  # noqa: E402
from foreshock.detectors.page_hinkley import PageHinkley  # noqa: E402
from foreshock.detectors.range_novelty import RangeNovelty  # noqa: E402
from foreshock.detectors.river_adapters import UnivariateAdapter  # noqa: E402
from foreshock.detectors.seasonal import SeasonalDiff  # noqa: E402
from foreshock.detectors.univariate import UnivariateDetector  # noqa: E402
from foreshock.frames import Frame  # noqa: E402
from foreshock.topology import Topology  # noqa: E402


def make_stream(series: int, steps: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(steps)[:, None]
    x = 50 + 5 * np.sin(2 * np.pi * t / 60 + rng.uniform(0, 6, series)) + rng.normal(0, 1, (steps, series))
    spikes = rng.random((steps, series)) < 0.001
    x[spikes] += rng.normal(0, 10, int(spikes.sum()))
    x[steps // 2:, : series // 10] += 3.0
    return np.ascontiguousarray(x)


def make_bank(series: int) -> list[UnivariateDetector]:
    return [EwmaZScore(series), Cusum(series), PageHinkley(series), Holt(series),
            RangeNovelty(series), SeasonalDiff(series, period=60)]


def run_bank(stream: np.ndarray, batch: int, detectors: list[UnivariateDetector]) -> float:
    t0 = time.perf_counter()
    for i in range(0, stream.shape[0], batch):
        chunk = stream[i:i + batch]
        for det in detectors:
            det.update(chunk)
    return stream.size / (time.perf_counter() - t0)


def per_detector_rates(stream: np.ndarray, batch: int, runs: int) -> dict[str, dict[str, float]]:
    out = {}
    for det in make_bank(stream.shape[1]):
        cls, name = type(det), det.name
        kwargs = {"period": 60} if name == "seasonal_diff" else {}
        out[name] = repeat(lambda: run_bank(stream, batch, [cls(stream.shape[1], **kwargs)]), runs=runs)
    return out


def mahalanobis_rate(nodes: int, fields: int, steps: int) -> float:
    """Node-steps/s of the multivariate detector (every step: solve + rank-1 update per node)."""
    x = np.random.default_rng(1).normal(size=(steps, nodes, fields))
    det = OnlineMahalanobis(nodes, fields)
    det.update(x[:2])
    t0 = time.perf_counter()
    det.update(x)
    return nodes * steps / (time.perf_counter() - t0)


def gpu_frames(gpus: int, steps: int) -> tuple[Topology, list[Frame]]:
    """One frame per second of ``gpus`` GPUs whose temperatures, clock and utilisation follow a
    random power; the throttle counters advance (rates, not raw values, reach the model)."""
    topo = Topology.from_gpu_hosts([(f"n{g // 8}", g % 8) for g in range(gpus)])
    rng = np.random.default_rng(2)
    frames = []
    for t in range(steps):
        p = rng.uniform(300, 700, gpus)
        frames.append(Frame("gpu", np.full(gpus, float(t)), np.arange(gpus), {
            "power": p, "gpu_temp": 30 + 0.04 * p + rng.normal(0, 0.5, gpus), "hbm_temp": 25 + 0.03 * p,
            "sm_clock": 1.98e9 - 2e5 * p, "util": np.full(gpus, 0.97), "power_throttle_time": np.full(gpus, 0.3 * t),
            "thermal_throttle_time": np.zeros(gpus), "pcie_replays": np.full(gpus, 5.0)}))
    return topo, frames


def mahalanobis_detector_rate(topo: Topology, frames: list[Frame], warm: int) -> float:
    """GPU rows/s of the ``mahalanobis`` detector's ``update`` after ``warm`` frames (every GPU
    scored, so each row is a solve, a rank-1 update and an alarm step)."""
    det = MahalanobisDetector(topo, warmup=warm // 2)
    for frame in frames[:warm]:
        det.update(frame)
    t0 = time.perf_counter()
    for frame in frames[warm:]:
        det.update(frame)
    return sum(len(f) for f in frames[warm:]) / (time.perf_counter() - t0)


def river_hst_bytes(values: np.ndarray, lo: float, hi: float) -> int:
    """Heap held by one river HalfSpaceTrees after it has learnt ``values`` (one series' model)."""
    import tracemalloc

    from river import anomaly

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    model = anomaly.HalfSpaceTrees(seed=42, limits={"x": (lo, hi)})
    for v in values:
        model.learn_one({"x": float(v)})
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del model
    return held


def river_rate(make, values: np.ndarray, how: str) -> float:  # type: ignore[no-untyped-def]
    model = make()
    t0 = time.perf_counter()
    if how == "anomaly":
        for v in values:
            x = {"x": v}
            model.score_one(x)
            model.learn_one(x)
    else:
        for v in values:
            model.update(v)
    return values.size / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--river-points", type=int, default=20000)
    args = ap.parse_args()

    from river import anomaly, drift

    stream = make_stream(args.series, args.steps)
    run_bank(stream[:20], 10, make_bank(args.series))      # compile / load kernels

    bank = repeat(lambda: run_bank(stream, args.batch, make_bank(args.series)), runs=args.runs)
    singles = per_detector_rates(stream, args.batch, args.runs)

    # river sees the same values, event by event (series-major: one series' history in order)
    values = [float(v) for v in stream.T.ravel()[: args.river_points]]
    arr = np.array(values)
    lo, hi = float(arr.min()), float(arr.max())
    river_runs = max(3, args.runs // 2)
    hst = repeat(lambda: river_rate(lambda: anomaly.HalfSpaceTrees(seed=42, limits={"x": (lo, hi)}), arr[:args.river_points // 4],
                                    "anomaly"), runs=river_runs)
    ph = repeat(lambda: river_rate(drift.PageHinkley, arr, "drift"), runs=river_runs)
    adwin = repeat(lambda: river_rate(drift.ADWIN, arr, "drift"), runs=river_runs)
    mv = repeat(lambda: mahalanobis_rate(256, 32, 40), runs=max(3, args.runs // 2))
    mv_topo, mv_frames = gpu_frames(1024, 300)
    mvd = repeat(lambda: mahalanobis_detector_rate(mv_topo, mv_frames, warm=100), runs=max(3, args.runs // 2))
    adapter = repeat(lambda: river_rate(lambda: UnivariateAdapter("ewma_zscore"), arr, "anomaly"), runs=river_runs)

    print(f"stream: {args.series} series x {args.steps} steps = {stream.size:,} points, batches of {args.batch}")
    print(f"foreshock bank (6 detectors/point): {bank['median']:>14,.0f} points/s  (min {bank['min']:,.0f}, max {bank['max']:,.0f})")
    for name, r in singles.items():
        print(f"  {name:<16} alone:            {r['median']:>14,.0f} points/s  (min {r['min']:,.0f}, max {r['max']:,.0f})")
    print(f"river HalfSpaceTrees:                 {hst['median']:>14,.0f} obs/s     (min {hst['min']:,.0f}, max {hst['max']:,.0f})")
    print(f"river PageHinkley (drift):            {ph['median']:>14,.0f} updates/s (min {ph['min']:,.0f}, max {ph['max']:,.0f})")
    print(f"river ADWIN (drift):                  {adwin['median']:>14,.0f} updates/s (min {adwin['min']:,.0f}, max {adwin['max']:,.0f})")
    print(f"foreshock EWMA z via river adapter:   {adapter['median']:>14,.0f} obs/s     (per-event Python calls)")
    print(f"multivariate Mahalanobis, 32 fields:  {mv['median']:>14,.0f} node-steps/s (min {mv['min']:,.0f}, max {mv['max']:,.0f})")
    print(f"mahalanobis detector, 1,024 GPUs:     {mvd['median']:>14,.0f} GPU rows/s (min {mvd['min']:,.0f}, max {mvd['max']:,.0f})")
    per_series = {det.name: det.state_nbytes() / args.series for det in make_bank(args.series)}
    bank_bytes = sum(per_series.values())
    mv_bytes = OnlineMahalanobis(256, 32).state_nbytes() / 256
    hst_bytes = river_hst_bytes(arr[:2000], lo, hi)
    print(f"memory per series: foreshock bank {bank_bytes:,.0f} B (" +
          ", ".join(f"{k} {v:,.0f}" for k, v in per_series.items()) +
          f"); river HalfSpaceTrees {hst_bytes:,} B; Mahalanobis {mv_bytes:,.0f} B per 32-field node")
    ratio = bank["median"] / hst["median"]
    print(f"ratio bank / river HST: {ratio:,.0f}x; foreshock PageHinkley / river PageHinkley: "
          f"{singles['page_hinkley']['median'] / ph['median']:,.0f}x")
    emit("generic_detectors",
         foreshock_points_per_s=round(bank["median"]), foreshock_points_per_s_min=round(bank["min"]),
         foreshock_points_per_s_max=round(bank["max"]),
         river_obs_per_s=round(hst["median"]), river_obs_per_s_min=round(hst["min"]),
         river_obs_per_s_max=round(hst["max"]), ratio=round(ratio, 1),
         detectors_per_point=6,
         per_detector_points_per_s={k: round(v["median"]) for k, v in singles.items()},
         river_page_hinkley_per_s=round(ph["median"]), river_adwin_per_s=round(adwin["median"]),
         page_hinkley_ratio=round(singles["page_hinkley"]["median"] / ph["median"], 1),
         river_adapter_obs_per_s=round(adapter["median"]),
         mahalanobis_32_fields_node_steps_per_s=round(mv["median"]),
         mahalanobis_detector_gpu_rows_per_s=round(mvd["median"]),
         mahalanobis_detector_gpu_rows_per_s_min=round(mvd["min"]),
         mahalanobis_detector_gpu_rows_per_s_max=round(mvd["max"]),
         state_bytes_per_series=round(bank_bytes),
         state_bytes_per_series_by_detector={k: round(v) for k, v in per_series.items()},
         river_hst_bytes_per_series=hst_bytes, mahalanobis_bytes_per_32_field_node=round(mv_bytes),
         series=args.series, steps=args.steps, batch=args.batch, runs=args.runs)


if __name__ == "__main__":
    main()
