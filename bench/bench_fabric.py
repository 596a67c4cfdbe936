"""Fabric detectors: counter rates, congestion and optics, in port observations per second on one core.

The stream: a rail-optimised fabric of ``--gpus`` GPUs (the simulator's topology generator: one
NIC link per GPU, leaf uplinks, an optic at each link end), ``--ticks`` one-second ticks of
every link's cumulative counters (64-bit, healthy traffic, a few ports congested) and every
optic's DOM and PHY counters (a few optics degrading), built once in memory. One *port
observation* is one row: all fields of one link, or of one optic, at one time.

Steady state: the optics detector averages samples into buckets (60 s) and refits four Theil-Sen
trends per optic at each bucket close, once it holds ``min_points`` buckets. A detector timed
from empty over two minutes of ticks never fits a trend (3-4x faster than it runs for real), so
each optics detector is first fed ``--warm-buckets`` untimed buckets (one sample per bucket,
default 40 > the 32-bucket window: the rings are full), and the timed ticks then close a bucket
every 60 ticks, every fit running, as at 1-s sampling in a pipeline. ``--warm-buckets 0`` gives
the cold figure.

Figures (each the median of ``--runs`` runs, with min and max), per core: rows over the
thread's CPU time, so a busy shared machine does not halve them (``--wall`` for wall-clock):

- ``counter_rates``: the counter-rate kernel alone (the five congestion counters per link row);
- ``congestion``, ``link_errors``, ``optics``: each detector on its own rows;
- ``port_obs_per_s`` (headline): counter rates + congestion + optics, i.e. the congestion
  detector on link rows and the optics detector on optic rows, over all rows;
- ``with_link_errors_obs_per_s``: the default bank's whole fabric set (``DEFAULT_BANK``'s
  congestion, link_errors and optics: adds the link-error rules on the same link rows), over all
  rows. A row is counted once per tick however many detectors read it.

Prints the figures, then a JSON line with ``"name": "fabric_detectors"``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _util import emit, repeat  # noqa: E402

from foreshock import facts  # noqa: E402
from foreshock.detectors.base import Detector  # noqa: E402
from foreshock.detectors.congestion import COUNTERS, CongestionDetector  # noqa: E402
from foreshock.detectors.counters import CounterRates  # noqa: E402
from foreshock.detectors.link_errors import LinkErrorsDetector  # noqa: E402
from foreshock.detectors.optics import F_SLOPE  # noqa: E402
from foreshock.detectors.optics import PARAMS as OPTICS_PARAMS  # noqa: E402
from foreshock.detectors.optics import OpticsDetector  # noqa: E402
from foreshock.frames import Frame  # noqa: E402
from foreshock.simulator.topology_gen import build_topology  # noqa: E402
from foreshock.topology import Topology  # noqa: E402


def make_stream(topo: Topology, ticks: int, seed: int = 0) -> tuple[list[Frame], list[Frame]]:
    rng = np.random.default_rng(seed)
    n_links, n_opt = topo.size("link"), topo.size("optic")
    rate = np.where(topo.link_gpu >= 0, facts.LINK_RATE_GPU_BPS, facts.LINK_RATE_UPLINK_BPS)
    ticks_per_s = rate / 8 / facts.XMIT_WAIT_TICK_BYTES
    hot = rng.random(n_links) < 0.002  # a few congested ports
    counters = {name: rng.uniform(1e6, 1e12, n_links).round() for name in
                ("tx_data", "rx_data", "xmit_wait", "ecn_marked", "cnp_sent", "cnp_handled", "symbol_error",
                 "link_error_recovery", "rcv_errors", "xmit_discards")}
    counters.update({k: np.zeros(n_links) for k in ("link_downed", "buffer_overrun_errors", "link_integrity_errors")})
    counters["pfc_pause_duration"] = rng.uniform(0, 50, n_links)
    degrading = rng.random(n_opt) < 0.002
    bits = rng.uniform(1e15, 1e16, n_opt)
    corrected = np.floor(bits * 1e-12)
    rx0 = rng.normal(-0.7, 0.4, n_opt)
    links, optics = [], []
    for t in range(ticks):
        util = rng.uniform(0.1, 0.9, n_links)
        counters["tx_data"] += util * rate / 8
        counters["rx_data"] += util * rate / 8
        counters["xmit_wait"] += np.round(ticks_per_s * np.where(hot, 0.05, 2e-4 * util))
        counters["ecn_marked"] += rng.poisson(np.where(hot, 2e5, 2.0))
        counters["cnp_sent"] += rng.poisson(1.0, n_links)
        counters["cnp_handled"] += rng.poisson(1.0, n_links)
        counters["pfc_pause_duration"] += np.where(hot, 0.04, 1e-6)
        counters["symbol_error"] += rng.poisson(0.001, n_links)
        cols = {k: v.copy() for k, v in counters.items()}
        cols["link_state"] = np.full(n_links, float(facts.IB_PORT_STATE_ACTIVE))
        cols["link_rate"] = rate.astype(np.float64)
        links.append(Frame("link", np.full(n_links, float(t)), np.arange(n_links), cols))
        rx = rx0 - np.where(degrading, 3.0 * t / 3600, 0.0) + rng.normal(0, 0.05, n_opt)
        line = np.repeat(rate, 2) * 1.0625
        bits += line
        corrected += np.floor(line * 1e-12 * np.where(degrading, 100.0, 1.0))
        optics.append(Frame("optic", np.full(n_opt, float(t)), np.arange(n_opt), {
            "rx_power": rx, "tx_power": rng.normal(1.0, 0.03, n_opt), "tx_bias": rng.normal(7e-3, 3e-5, n_opt),
            "module_temp": rng.normal(45, 0.2, n_opt), "module_voltage": rng.normal(3.3, 0.002, n_opt),
            "rx_bits": bits.copy(), "rx_corrected_bits": corrected.copy(), "rx_symbol_errors": np.zeros(n_opt),
            "prefec_ber": np.full(n_opt, 1e-12), "los": np.zeros(n_opt)}))
    return links, optics


CLOCK = time.thread_time
"""CPU time of this thread: "per core" even when the machine is shared (the kernels are serial;
NUMBA_NUM_THREADS=1). ``--wall`` measures wall-clock time instead."""


def restamp(frames: list[Frame], start: float, step: float) -> list[Frame]:
    """The same rows at times ``start, start + step, ...`` (one time per frame)."""
    return [Frame(f.kind, np.full(len(f), start + i * step), f.slot, f.columns) for i, f in enumerate(frames)]


def rate_of(pairs: list[tuple[Callable[[], Detector], list[Frame]]]) -> float:
    """Rows per second of fresh detectors over their frames, tick by tick as a pipeline feeds them.

    Each frame's rows are counted once per tick however many detectors read it (congestion and
    link_errors both read the link frames: counted per detector, adding a detector raised the rate)."""
    running = [(make(), frames) for make, frames in pairs]
    streams = list({id(frames): frames for _, frames in pairs}.values())  # each frame list once
    rows = sum(len(frame) for frames in streams for frame in frames)
    t0 = CLOCK()
    for i in range(len(pairs[0][1])):
        for det, frames in running:
            det.update(frames[i])
    return rows / (CLOCK() - t0)

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=4096)
    ap.add_argument("--ticks", type=int, default=120)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--wall", action="store_true", help="Wall-clock instead of CPU time (an idle machine).")
    ap.add_argument("--warm-buckets", type=int, default=40,
                    help="Untimed optics buckets fed first, so the timed ticks run every trend fit (0 = cold).")
    args = ap.parse_args()
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter
    topo = build_topology(args.gpus)
    t0 = time.perf_counter()
    warm = max(args.warm_buckets, 0)
    links, optics = make_stream(topo, warm + args.ticks)
    bucket_s = OPTICS_PARAMS["bucket_s"]
    warm_optics = restamp(optics[:warm], 0.0, bucket_s)  # one sample per bucket
    links = restamp(links[warm:], warm * bucket_s, 1.0)
    optics = restamp(optics[warm:], warm * bucket_s, 1.0)
    print(f"{topo.size('link'):,} links, {topo.size('optic'):,} optics, {args.ticks} ticks "
          f"({sum(map(len, links)) + sum(map(len, optics)):,} port observations) built in "
          f"{time.perf_counter() - t0:.1f} s; optics warmed with {warm} buckets", flush=True)

    n_links = topo.size("link")
    matrices = [np.stack([f.columns[c] for c in COUNTERS], axis=1) for f in links]

    def counter_rates() -> float:
        cr = CounterRates(n_links, COUNTERS)
        t = CLOCK()
        for f, m in zip(links, matrices):
            cr.update(f.ts, f.slot, m)
        return sum(map(len, links)) / (CLOCK() - t)

    def congestion() -> CongestionDetector:
        return CongestionDetector(topo)

    def link_errors() -> LinkErrorsDetector:
        return LinkErrorsDetector(topo)

    warmed = OpticsDetector(topo)
    for frame in warm_optics:
        warmed.update(frame)
    warm_state = warmed.state_dict()
    # optics whose four trends are all fitted when the clock starts (every one, once warmed)
    trended = int(np.isfinite(warmed.s_fit[:, :, F_SLOPE]).all(axis=1).sum())

    def optics_det() -> OpticsDetector:
        det = OpticsDetector(topo)
        det.load_state_dict(warm_state)  # untimed: rate_of builds its detectors before starting the clock
        return det

    figures = {
        "counter_rates": repeat(counter_rates, args.runs),
        "congestion": repeat(lambda: rate_of([(congestion, links)]), args.runs),
        "link_errors": repeat(lambda: rate_of([(link_errors, links)]), args.runs),
        "optics": repeat(lambda: rate_of([(optics_det, optics)]), args.runs),
        "headline": repeat(lambda: rate_of([(congestion, links), (optics_det, optics)]), args.runs),
        "all": repeat(lambda: rate_of([(congestion, links), (link_errors, links), (optics_det, optics)]), args.runs),
    }
    for name, f in figures.items():
        label = {"headline": "counter rates + congestion + optics (headline)",
                 "all": "congestion + link_errors + optics (DEFAULT_BANK's fabric detectors)"}.get(name, name)
        print(f"{label:70s} {f['median'] / 1e6:7.2f} M port obs/s  (min {f['min'] / 1e6:.2f}, "
              f"max {f['max'] / 1e6:.2f}, {f['runs']} runs)")
    state = sum(d.state_nbytes() for d in (congestion(), link_errors(), OpticsDetector(topo)))
    head = figures["headline"]
    print(f"optics with all four trends fitted when timing starts: {trended:,} of {topo.size('optic'):,}")
    print(f"state: {state / (n_links + topo.size('optic')):.0f} B per port; target >= 5 M port obs/s per core: "
          f"{'met' if head['median'] >= 5e6 else 'NOT met'}")
    emit("fabric_detectors", port_obs_per_s=round(head["median"]), port_obs_detectors=["congestion", "optics"],
         port_obs_per_s_min=round(head["min"]),
         port_obs_per_s_max=round(head["max"]), runs=head["runs"],
         with_link_errors_obs_per_s=round(figures["all"]["median"]),
         with_link_errors_detectors=["congestion", "link_errors", "optics"],
         counter_rates_obs_per_s=round(figures["counter_rates"]["median"]),
         congestion_obs_per_s=round(figures["congestion"]["median"]),
         link_errors_obs_per_s=round(figures["link_errors"]["median"]),
         optics_obs_per_s=round(figures["optics"]["median"]),
         clock="wall" if args.wall else "thread CPU time", warm_buckets=warm, optics_trended=trended,
         gpus=args.gpus, links=n_links, optics=topo.size("optic"), ticks=args.ticks,
         state_bytes_per_port=round(state / (n_links + topo.size("optic"))))


if __name__ == "__main__":
    main()
