"""Incident engine speed and memory: 16,384 GPUs, 1,000 findings per second, a 24-hour replay.

A synthetic finding stream over the 16,384-GPU cluster topology (the simulator's generator)
plays the part of the detector bank: a steady background of symptoms (routine power caps, peer
outliers, optic trends, z-score blips) plus faults arriving at random — a cooling loop losing
flow (256 GPUs heading for throttling, rack inlets rising), a thermal interface degrading, a
PSU braking a node, an optic trending to failure then taking its link down and congesting its
siblings, a GPU falling off the bus — each refreshing its findings as the detectors do.

1. **Throughput**: ``--rate`` findings per telemetry second (1,000) for ``--minutes`` of
   telemetry; the engine's own time is measured (``observe`` per second, as the bank calls
   it), so ``findings_per_s`` is what one core sustains; the worst second is reported too.
2. **Memory over 24 hours**: ``--hours`` of telemetry at ``--memory-rate`` findings/s with a
   fault every ``--fault-every`` seconds (incidents open, grow and resolve all day long);
   Python heap (tracemalloc) and RSS at each hour; ``memory_growth_mib`` is the heap growth
   from the end of hour 2 (warm) to the end, and the incidents held at the end are printed.
   ``--no-trace`` drops tracemalloc (~3x faster: 24 h at the full 1,000/s in ~30 min) and takes
   the growth from RSS, printing the interpreter's allocated blocks by hour beside it.

    python bench/bench_incidents.py [--rate 1000] [--minutes 15] [--hours 24] [--memory-rate 20]

Prints readable figures, then one JSON line last with "name": "incident_engine".
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import emit  # noqa: E402

from foreshock.detectors.incidents import IncidentEngine  # noqa: E402
from foreshock.findings import Anomaly, Finding, Prediction  # noqa: E402
from foreshock.simulator.topology_gen import build_topology  # noqa: E402
from foreshock.topology import Topology  # noqa: E402


def rss_mib() -> float:
    try:
        with open(f"/proc/{os.getpid()}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Fault:
    """One injected cause: emits the findings the detectors would, second by second."""

    def __init__(self, kind: str, start: float, end: float, items: list[tuple[float, str, int, str]]) -> None:
        self.kind, self.start, self.end = kind, start, end
        self.items = items  # (first emission offset, entity kind, slot, what)

    def emit(self, t: float, out: list[Finding]) -> None:
        age = t - self.start
        final = t >= self.end
        for offset, kind, slot, what in self.items:
            if age < offset:
                continue
            # refresh every 60 s like the detectors' alarms; withdraw at the end
            due = int(age - offset) % 60 == 0
            if what == "thermal":
                if final:
                    out.append(Prediction(t, kind, slot, "thermal_throttle", 0.0, 0.9, "thermal", "cleared", False))
                elif due:
                    out.append(Prediction(t, kind, slot, "thermal_throttle", 900.0 - min(age, 800.0), 0.9, "thermal",
                                          "core heading for 88 °C"))
            elif what == "inlet" and due and int(age - offset) % 600 == 0 and not final:
                out.append(Anomaly(t, kind, slot, "inlet_temp", 3.0, "cooling", "inlet rising"))
            elif what == "brake" and age == offset:
                out.append(Anomaly(t, kind, slot, "throttle_reasons", 1.0, "power", "HW power brake (0x80)"))
            elif what == "psu" and age == offset:
                out.append(Anomaly(t, kind, slot, "psu_power", 1.0, "power", "node-wide power brake"))
            elif what == "link_down_pred" and due and not final:
                out.append(Prediction(t, kind, slot, "link_down", max(0.0, self.end - t), 0.8, "optics",
                                      f"{self._optic}: pre-FEC BER reaches the FEC limit"))
            elif what == "link_down" and age == offset:
                out.append(Anomaly(t, kind, slot, "link_downed", 1.0, "link_errors", f"fatal: down on {self._link}"))
            elif what == "congestion" and due and not final:
                out.append(Prediction(t, kind, slot, "congestion", 0.0, 1.0, "congestion",
                                      f"congestion; likely cause: traffic rerouted from {self._link}, which went down"))
            elif what == "xid" and age == offset:
                out.append(Anomaly(t, kind, slot, "xid_last", 79.0, "xid", "XID 79: fell off the bus"))

    _optic = ""
    _link = ""


class Scene:
    """Background symptoms plus random faults over a topology."""

    def __init__(self, topo: Topology, rate: float, fault_every_s: float, seed: int = 0) -> None:
        self.topo, self.rate, self.fault_every_s = topo, rate, fault_every_s
        self.rng = np.random.default_rng(seed)
        self.faults: list[Fault] = []
        self.n_gpu, self.n_link, self.n_optic = topo.size("gpu"), topo.size("link"), topo.size("optic")
        self.gpu_loop = topo.rack_loop[topo.gpu_rack]
        self.nic_links = np.flatnonzero(topo.link_gpu >= 0)

    def new_fault(self, t: float) -> Fault:
        rng, topo = self.rng, self.topo
        kind = str(rng.choice(["cooling", "tim", "psu", "optic", "xid"], p=[0.15, 0.3, 0.15, 0.2, 0.2]))
        if kind == "cooling":
            loop = int(rng.integers(len(topo.loops)))
            gpus = np.flatnonzero(self.gpu_loop == loop)
            racks = np.flatnonzero(topo.rack_loop == loop)
            items = [(float(rng.uniform(30, 900)), "gpu", int(g), "thermal") for g in gpus]
            items += [(60.0, "rack", int(r), "inlet") for r in racks]
            return Fault(kind, t, t + 3600, items)
        if kind == "tim":
            return Fault(kind, t, t + 7200, [(0.0, "gpu", int(rng.integers(self.n_gpu)), "thermal")])
        if kind == "psu":
            node = int(rng.integers(len(topo.nodes)))
            items = [(0.0, "gpu", int(g), "brake") for g in topo.gpus_of_node(node)] + [(1.0, "node", node, "psu")]
            return Fault(kind, t, t + 1800, items)
        if kind == "optic":
            link = int(rng.choice(self.nic_links))
            node = int(topo.gpu_node[topo.link_gpu[link]])
            sibs = [int(x) for x in np.flatnonzero(topo.link_gpu >= 0) if topo.gpu_node[topo.link_gpu[x]] == node and x != link]
            items = [(0.0, "link", link, "link_down_pred"), (3000.0, "link", link, "link_down")]
            items += [(3005.0, "link", s, "congestion") for s in sibs]
            f = Fault(kind, t, t + 3600, items)
            f._optic, f._link = topo.name("optic", 2 * link + 1), topo.links[link]
            return f
        return Fault(kind, t, t + 1800, [(0.0, "gpu", int(rng.integers(self.n_gpu)), "xid")])

    def second(self, t: float) -> list[Finding]:
        out: list[Finding] = []
        if self.rng.random() < 1.0 / self.fault_every_s:
            self.faults.append(self.new_fault(t))
        for f in self.faults:
            f.emit(t, out)
        self.faults = [f for f in self.faults if t < f.end]
        n = max(0, int(self.rng.poisson(self.rate)) - len(out))
        rng = self.rng
        kinds = rng.random(n)
        gpus = rng.integers(0, self.n_gpu, n)
        for k, g in zip(kinds, gpus):
            g = int(g)
            if k < 0.6:
                out.append(Anomaly(t, "gpu", g, "throttle_reasons", 4.0, "throttle_bits", "throttling observed: sw_power_cap"))
            elif k < 0.8:
                out.append(Prediction(t, "gpu", g, "power_cap", 60.0, 0.8, "power", "power rising toward the limit"))
            elif k < 0.9:
                out.append(Anomaly(t, "gpu", g, "sm_clock", 0.06, "straggler", "clock below job median"))
            elif k < 0.95:
                out.append(Anomaly(t, "gpu", g, "power", 9.0, "robust_zscore", "CUSUM over threshold"))
            else:
                out.append(Anomaly(t, "optic", int(rng.integers(self.n_optic)), "prefec_ber", 3.0, "optics",
                                   "pre-FEC BER worsening"))
        return out


def throughput(topo: Topology, rate: float, seconds: int, fault_every: float) -> dict[str, float]:
    engine = IncidentEngine(topo)
    scene = Scene(topo, rate, fault_every, seed=1)
    t0 = 1_700_000_000.0
    busy = worst = 0.0
    n = emitted = 0
    for s in range(seconds):
        batch = scene.second(t0 + s)
        c = time.perf_counter()
        emitted += len(engine.observe(batch, t0 + s))
        dt = time.perf_counter() - c
        busy += dt
        worst = max(worst, dt)
        n += len(batch)
    return {"findings": n, "engine_s": busy, "findings_per_s": n / busy, "worst_second_s": worst,
            "incident_updates": emitted, "incidents_opened": engine.stats["incidents"]}


def memory(topo: Topology, rate: float, hours: float, fault_every: float, trace: bool = True) -> dict[str, object]:
    """Heap by hour: tracemalloc's traced bytes; or, with ``trace=False`` (~3x faster: a day at the
    full rate), the interpreter's allocated blocks by hour, and the growth taken from RSS."""
    engine = IncidentEngine(topo)
    scene = Scene(topo, rate, fault_every, seed=2)
    t0 = 1_700_000_000.0
    gc.collect()
    if trace:
        tracemalloc.start()
    heap: list[float] = []
    blocks: list[int] = []
    rss: list[float] = []
    n = 0
    wall = time.perf_counter()
    seconds = max(int(hours * 3600), 1)
    for s in range(seconds):
        batch = scene.second(t0 + s)
        n += len(batch)
        engine.observe(batch, t0 + s)
        del batch
        if (s + 1) % 3600 == 0 or s + 1 == seconds:  # hourly, and at the end: a run under an hour has one
            scene_items = sum(len(f.items) for f in scene.faults)  # the generator's own state, not the engine's
            gc.collect()
            blocks.append(sys.getallocatedblocks())
            heap.append(tracemalloc.get_traced_memory()[0] / 2**20 if trace else math.nan)
            rss.append(rss_mib())
            size = f"heap {heap[-1]:7.2f} MiB" if trace else f"blocks {blocks[-1]:,}"
            print(f"  {(s + 1) / 3600:5.2f} h: {size}, RSS {rss[-1]:7.1f} MiB, "
                  f"incidents held {len(engine._incidents):4d} (live {sum(1 for i in engine._incidents.values() if i.live)}), "
                  f"opened {engine.stats['incidents']}, generator items {scene_items}", flush=True)
    if trace:
        tracemalloc.stop()
    series = heap if trace else rss
    warm = series[1] if len(series) > 1 else series[0]
    return {"findings": n, "wall_s": time.perf_counter() - wall, "heap_mib": heap if trace else [],
            "allocated_blocks": blocks, "rss_mib": rss, "growth_of": "heap" if trace else "rss",
            "memory_growth_mib": max(series[-1] - warm, 0.0) if series else 0.0,
            "heap_max_after_warmup_mib": max(series[1:] or series), "incidents_opened": engine.stats["incidents"],
            "incidents_held_at_end": len(engine._incidents), "state_nbytes": engine.state_nbytes()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--rate", type=float, default=1000.0, help="findings per telemetry second (throughput)")
    ap.add_argument("--minutes", type=float, default=15.0, help="telemetry minutes for the throughput phase")
    ap.add_argument("--fault-every", type=float, default=60.0, help="mean seconds between faults (throughput)")
    ap.add_argument("--hours", type=float, default=24.0, help="telemetry hours for the memory phase (0: skip)")
    ap.add_argument("--memory-rate", type=float, default=20.0, help="findings per telemetry second (memory)")
    ap.add_argument("--memory-fault-every", type=float, default=600.0)
    ap.add_argument("--no-trace", action="store_true",
                    help="memory phase without tracemalloc (allocated blocks instead; fast enough for 24 h at 1,000/s)")
    args = ap.parse_args()

    topo = build_topology(args.gpus)
    print(f"topology: {topo.size('gpu'):,} GPUs, {topo.size('link'):,} links, {topo.size('optic'):,} optics, "
          f"{len(topo.loops)} cooling loops")
    tp = throughput(topo, args.rate, int(args.minutes * 60), args.fault_every)
    print(f"throughput: {tp['findings']:,} findings in {tp['engine_s']:.2f} s of engine time -> "
          f"{tp['findings_per_s']:,.0f} findings/s ({tp['findings_per_s'] / args.rate:.0f}x the {args.rate:,.0f}/s target); "
          f"worst second {tp['worst_second_s'] * 1e3:.1f} ms; {tp['incidents_opened']} incidents, "
          f"{tp['incident_updates']} incident updates")
    mem: dict[str, object] = {}
    if args.hours > 0:
        print(f"memory: {args.hours:g} h at {args.memory_rate:g} findings/s, a fault every {args.memory_fault_every:g} s")
        mem = memory(topo, args.memory_rate, args.hours, args.memory_fault_every, trace=not args.no_trace)
        print(f"memory: {mem['growth_of']} growth {mem['memory_growth_mib']:.2f} MiB from hour 2 to the end; "
              f"{mem['incidents_opened']} incidents opened, {mem['incidents_held_at_end']} held at the end; "
              f"{mem['findings']:,} findings in {mem['wall_s']:.0f} s")
    emit("incident_engine", gpus=topo.size("gpu"), rate=args.rate,
         findings_per_s=round(tp["findings_per_s"]), worst_second_ms=round(tp["worst_second_s"] * 1e3, 2),
         throughput_findings=tp["findings"], incidents=tp["incidents_opened"],
         memory_hours=args.hours, memory_rate=args.memory_rate, memory_growth_of=mem.get("growth_of") if mem else None,
         memory_growth_mib=round(float(mem.get("memory_growth_mib", 0.0)), 3) if mem else None,  # type: ignore[arg-type]
         heap_mib_by_hour=[round(x, 2) for x in mem.get("heap_mib", [])] if mem else None,  # type: ignore[attr-defined]
         rss_mib_end=round(mem["rss_mib"][-1], 1) if mem and mem.get("rss_mib") else None,  # type: ignore[index]
         incidents_24h=mem.get("incidents_opened") if mem else None,
         incidents_held_at_end=mem.get("incidents_held_at_end") if mem else None)


if __name__ == "__main__":
    main()
