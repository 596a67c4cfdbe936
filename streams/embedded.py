"""The embedded pipeline: source -> input guard -> detector bank -> findings -> sinks, one process.

This is the default transport (``foreshock demo``, ``foreshock replay``). The Kafka workers run
the same guard and bank on their share of partitions.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from foreshock.detectors.bank import DetectorBank
from foreshock.exporters.store import FindingStore
from foreshock.findings import Finding
from foreshock.frames import Frame
from foreshock.guard import BoardSwap, InputGuard
from foreshock.health import PipelineHealth
from foreshock.remap import Remap
from foreshock.topology import Topology

log = logging.getLogger("foreshock.pipeline")


class Sink(Protocol):
    def observe_frame(self, frame: Frame, received_wall: float | None = None) -> None: ...

    def observe_findings(self, findings: Iterable[Finding]) -> None: ...


@dataclass
class RunStats:
    frames: int = 0
    samples: int = 0  # rows read
    accepted: int = 0  # rows the input guard let through (the telemetry span is theirs)
    findings: int = 0
    wall_s: float = 0.0
    telemetry_s: float = 0.0
    start_ts: float = float("nan")
    by_type: dict[str, int] = field(default_factory=dict)

    def count(self, findings: list[Finding]) -> None:
        self.findings += len(findings)
        for f in findings:
            self.by_type[f.type] = self.by_type.get(f.type, 0) + 1

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def speedup(self) -> float:
        return self.telemetry_s / self.wall_s if self.wall_s > 0 else 0.0


class EmbeddedPipeline:
    def __init__(self, topology: Topology, bank: DetectorBank, store: FindingStore | None = None,
                 sinks: Iterable[Sink] = (), health: PipelineHealth | None = None,
                 gauge_interval_s: float = 1.0, max_ahead_s: float | None = None,
                 fresh_state: Callable[[], dict[str, Any]] | None = None) -> None:
        """``max_ahead_s``: the input guard refuses rows stamped further ahead of the wall clock
        (``InputGuard``); None, for replays and simulations, which run ahead of it.

        ``fresh_state``: gives the detectors' state of a fresh bank like ``bank`` (``state_dict()
        ["detectors"]``), from which a GPU started afresh takes its rows (:meth:`restart_gpus`);
        by default a copy of ``bank``'s own is kept, taken here, when it must be fresh. (A Kafka
        worker, with a pipeline per partition, gives the one fresh state it keeps anyway.)"""
        self.topology = topology
        self.bank = bank
        self._fresh_state = fresh_state or self._kept(bank.state_dict()["detectors"])
        self.health = health or (store.health if store is not None else PipelineHealth())
        self.store = store or FindingStore(topology, self.health)
        self.guard = InputGuard(topology, self.health, max_ahead_s=max_ahead_s)
        bank.report_problems_to(self.health)
        self.sinks: list[Sink] = [self.store, *sinks]
        self.gauge_interval_s = gauge_interval_s
        self._last_gauges = 0.0
        self._end_told: list[Finding] | None = None  # what the end of the stream told (None: not ended)

    def move_to(self, topology: Topology, bank: DetectorBank) -> list[str]:
        """Go on under ``topology`` with ``bank`` (a fresh bank made for it): the detectors', the
        input guard's and the store's state follow each entity by name (``core/remap.py``), a new
        entity starts fresh, one ``topology`` no longer lists is left out. A processor (the
        incident engine) that cannot move its state starts fresh: returns the names of those.
        For ``foreshock watch``, whose live source took in new GPUs or forgot a host; the caller
        switches between frames, so every frame is processed under the topology its slots refer to."""
        remap = Remap(self.topology, topology)
        state = self.bank.state_dict()
        fresh_detectors = bank.state_dict()["detectors"]
        fresh: list[str] = []
        processors: dict[str, Any] = {}
        for proc in bank.processors:
            move = getattr(proc, "remap_state", None)
            if callable(move) and proc.name in state["processors"]:
                processors[proc.name] = move(state["processors"][proc.name], remap)
            else:
                processors[proc.name] = proc.state_dict()
                fresh.append(proc.name)
        bank.load_state_dict({"detectors": {d.name: d.remap_state(state["detectors"][d.name], remap)
                                            for d in bank.detectors},
                              "processors": processors})
        bank.report_problems_to(self.health)
        guard = InputGuard(topology, self.health, self.guard.stage, self.guard.max_ahead_s, self.guard.clock,
                           self.guard.min_spacing_s)
        guard.load_state_dict(self.guard.state_dict(), remap)
        self.store.move_to(topology, remap)
        self.topology, self.bank, self.guard = topology, bank, guard
        self._fresh_state = self._kept(fresh_detectors)
        self._resolve_left_behind()
        self._publish_gauges()  # the estimates under the new numbering, for the next scrape
        return fresh

    def _resolve_left_behind(self) -> None:
        """Resolve, for the sinks, each exported incident the moved engine no longer holds: one
        rooted at hardware the new topology no longer lists (a host ``watch`` forgot) is dropped by
        the move (``IncidentEngine.remap_state``) and would never be resolved, so ``/metrics`` and the
        findings file kept it open for good (review h19). One that lost members only is told again
        without them (``IncidentEngine.report_left_out``, h20)."""
        engines = [ids for ids in (getattr(p, "incident_ids", None) for p in self.bank.processors) if callable(ids)]
        if not engines:
            return  # the incidents this store exports come from elsewhere (a Kafka incident stage)
        held: set[str] = set().union(*(ids() for ids in engines))
        told: list[Finding] = [
            replace(inc, ts=self.store.last_ts, state="resolved",
                    reason=f"resolved: {inc.root_entity} left the topology (no longer served)")
            for inc in self.store.incidents() if inc.incident_id not in held]
        for proc in self.bank.processors:
            report_left_out = getattr(proc, "report_left_out", None)
            if callable(report_left_out):
                told += report_left_out(self.store.last_ts)
        for sink in self.sinks if told else ():
            sink.observe_findings(told)

    def restart_gpus(self, slots: np.ndarray) -> None:
        """Start the detector state of GPU ``slots`` afresh, as a new GPU's (no baseline of the
        board that was there before); the other GPUs' state stays as it is. For a board swapped
        in a slot (an RMA, :meth:`InputGuard.board_change`): the input guard keeps the slots'
        timestamps (a row older than the last one read is still out of order), the store its
        latest values but the old board's limits and flags, the incident engine its incidents (they
        are the slot's history)."""
        self.bank.restart_gpus(slots, self._fresh_state())
        self.store.forget_limits(slots)
        take_from = np.arange(self.topology.size("gpu"), dtype=np.int64)
        take_from[np.asarray(slots, dtype=np.int64)] = -1
        self.store.follow_gpu_boards(take_from)  # the old board's flags go with it

    @staticmethod
    def _kept(state: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        return lambda: state

    def process(self, frame: Frame, received_wall: float | None = None) -> list[Finding]:
        """Guard, detect and fan out one frame; never raises on bad data in the frame."""
        return self.process_rows(frame, received_wall)[1]

    def process_rows(self, frame: Frame, received_wall: float | None = None) -> tuple[Frame, list[Finding]]:
        """:meth:`process`, also returning the rows the guard let through (all of them: the sinks
        may have been handed them in parts). Where a GPU's board changes within them, the rows
        stamped before are processed, that GPU's state restarted, and the rest processed on."""
        received_wall = time.time() if received_wall is None else received_wall
        self._end_told = None  # a frame after an end: the stream goes on, and has an end again
        clean = self.guard.check(frame)
        findings: list[Finding] = []
        for rows, swap in self.guard.split_by_board(clean):
            if swap is None or len(rows):
                findings += self._detect(rows, received_wall)
            if swap is not None:
                findings += self._board_swapped(swap)
        now = time.monotonic()
        if now - self._last_gauges >= self.gauge_interval_s:
            self._last_gauges = now
            self._publish_gauges()
        return clean, findings

    def _detect(self, clean: Frame, received_wall: float) -> list[Finding]:
        """Detect on guarded rows and hand rows and findings to the sinks."""
        t0 = time.perf_counter()
        findings = self.bank.update(clean)
        self.store.observe_latency(time.perf_counter() - t0)
        for sink in self.sinks:
            sink.observe_frame(clean, received_wall)
            if findings:
                sink.observe_findings(findings)
        return findings

    def _board_swapped(self, swap: BoardSwap) -> list[Finding]:
        """Where GPU boards changed slots at ``swap.ts`` (``DetectorBank.take_swap``): a board new to
        its node (an RMA) starts afresh in its slot (counted, logged per GPU); a board that moved
        from another slot of its node (a GPU missing at a reboot renumbers the later ones) takes its
        detector state and its incidents along (logged once per node), and a slot it left that no
        board came to starts afresh. A board displaced and read nowhere else has its state parked
        in the bank, and takes it back where it is read again (``BoardSwap.parked``, logged per
        GPU). The predictions about what left a slot are withdrawn, those of a moved board made
        again in its new slot, those of a parked board kept with its state and made again where it
        is read again (``DetectorBank.follow_predictions``): the bank's processors and the sinks are
        handed them with the incidents told again, and all are returned with what the processors
        made of them."""
        def name(slot: int) -> str:
            return self.topology.name("gpu", slot)

        told = self.bank.take_swap(swap, self._fresh_state())  # incidents follow their boards too
        # the store forgets the limits of every slot whose board changed (its board's are read again
        # with its next row); the flags about a board go with it, or with it out of the slot
        self.store.forget_limits(np.union1d(swap.slots, swap.left))
        self.store.follow_gpu_boards(swap.take_from(self.topology.size("gpu")))
        for slot, was, now in zip(swap.slots[swap.replaced].tolist(), swap.old[swap.replaced].tolist(),
                                  swap.new[swap.replaced].tolist()):
            log.warning("GPU %s: another board in its slot (board_id %d -> %d); its detector state starts afresh "
                        "(input guard and /metrics state kept, but for the old board's limits and flags)",
                        name(slot), was, now)
        for slot, (_, board) in swap.unpark_keys(self.topology):
            log.warning("GPU %s: board_id %d read again on its node (at another index, or back from a reboot "
                        "without it); the detector state it had there follows it", name(slot), board)
        for node, moves in swap.moves_by_node(self.topology).items():
            empty = [name(s) for s in swap.left.tolist() if self.topology.gpu_node[s] == node]
            log.warning("%s: GPU boards moved to other indices (a GPU missing, or back, at a reboot?): %s; their detector "
                        "state and predictions follow them%s", self.topology.name("node", node),
                        ", ".join(f"{name(a)} -> {name(b)}" for a, b in moves),
                        f"; no board now in {', '.join(empty)}: started afresh" if empty else "")
        about = self.store.active_predictions("gpu", np.concatenate([swap.slots, swap.left]))
        predicted: list[Finding] = list(self.bank.follow_predictions(swap, about, name))
        # the incident engine, where it runs in the bank, is handed the predictions too
        changed = told + predicted + (self.bank.pass_on(predicted, swap.ts) if predicted else [])
        for sink in self.sinks if changed else ():
            sink.observe_findings(changed)
        return changed

    def end_stream(self) -> list[Finding]:
        """Tell what the processors hold due at the end of the stream, through the sinks as any other
        finding, and return it: the incident engine's pending incidents past their hold time and
        growth not told yet (``IncidentEngine.flush``). The engine ticks every ``tick_s`` of telemetry
        only, so an incident confirmed in the last seconds of a replay never reached the findings
        file, ``/metrics`` or the summary. Each processor is flushed at its own latest telemetry
        time (the time its frames spoke for, not one odd row's stamp). Once per end: called again
        before another frame, it returns what it told the first time and tells nothing."""
        if self._end_told is None:
            told: list[Finding] = []
            for proc in self.bank.processors:
                flush, latest = getattr(proc, "flush", None), getattr(proc, "latest_now", None)
                if callable(flush) and isinstance(latest, (int, float)) and math.isfinite(latest):
                    told += flush(latest)
            for sink in self.sinks if told else ():
                sink.observe_findings(told)
            self._end_told = told
        return self._end_told

    def _publish_gauges(self) -> None:
        gauges = self.bank.gauges()
        if gauges:
            # only the entities this pipeline has seen: others may belong to another partition
            owned = {kind: np.isfinite(last) for kind, last in self.guard.s_last_ts.items()}
            self.store.set_gauges(gauges, owned)

    def run(self, frames: Iterable[Frame], on_frame: Callable[[Frame, list[Finding]], Any] | None = None,
            limit_s: float | None = None) -> RunStats:
        """Process frames until the source ends (or ``limit_s`` of telemetry time has passed, or the
        source was stopped), then end the stream (:meth:`end_stream`): what it tells is counted in
        the stats and handed to the sinks, not to ``on_frame`` (no frame brought it)."""
        stats = RunStats()
        start = time.perf_counter()
        first_ts = last_ts = None
        for frame in frames:
            clean, findings = self.process_rows(frame)
            stats.frames += 1
            stats.samples += len(frame)
            stats.accepted += len(clean)
            stats.count(findings)
            # the span of what was accepted: a row the guard refused (a NaN stamp, one an hour in
            # the past) made the summary's span and speed-up null or wrong
            stamps = clean.ts[np.isfinite(clean.ts)]
            if len(stamps):
                lo, hi = float(stamps.min()), float(stamps.max())
                first_ts = lo if first_ts is None else min(first_ts, lo)
                last_ts = hi if last_ts is None else max(last_ts, hi)
            if on_frame is not None:
                on_frame(frame, findings)
            if limit_s is not None and first_ts is not None and last_ts is not None and last_ts - first_ts >= limit_s:
                break
        stats.count(self.end_stream())
        stats.wall_s = time.perf_counter() - start
        if first_ts is not None and last_ts is not None:
            stats.telemetry_s = last_ts - first_ts
            stats.start_ts = first_ts
        self._publish_gauges()
        return stats
