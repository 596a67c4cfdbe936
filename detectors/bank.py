"""The detector bank: one object that runs every detector over every frame.

The same bank serves the embedded pipeline and the Kafka workers. Findings from detectors
flow on to *processors* (the incident engine) that turn findings into further findings.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.findings import Finding, Prediction
from foreshock.frames import Frame
from foreshock.guard import BoardSwap
from foreshock.remap import Remap
from foreshock.topology import Topology

from .base import Detector
from .registry import DEFAULT_BANK, DEFAULT_PROCESSORS, create, create_processor
from .thermal_fit import share_thermal_fits


class FindingProcessor(Protocol):
    name: str

    def observe(self, findings: Sequence[Finding], now: float) -> list[Finding]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def report_problems_to(parts: Iterable[object], health: PipelineHealth) -> None:
    """Count the input problems each detector or processor finds itself (counter values that go
    backwards, findings for unknown entities, ...) in ``health`` — the pipeline's, which the
    exporter publishes — instead of each one's private default."""
    for part in parts:
        if isinstance(getattr(part, "health", None), PipelineHealth):
            part.health = health  # type: ignore[attr-defined]


def run_processors(processors: Sequence[FindingProcessor], findings: Sequence[Finding], now: float,
                   frames: Sequence[Frame] = ()) -> list[Finding]:
    """Run the finding processors (the incident engine) in turn: each reads ``frames`` first
    (``observe_frame``, where it has one: headroom such as temperatures and link state, for the
    spread it predicts), then ``findings`` with what the processors before it made. Returns what
    the processors made. The embedded bank after each frame and the Kafka incident stage after
    each source frame's pieces both run them so."""
    seen = list(findings)
    for proc in processors:
        observe_frame = getattr(proc, "observe_frame", None)
        if observe_frame is not None:
            for frame in frames:
                observe_frame(frame)
        seen.extend(proc.observe(seen, now))
    return seen[len(findings):]


def follow_predictions(swap: BoardSwap, active: Iterable[Prediction], gpu_name: Callable[[int], str]) -> list[Prediction]:
    """What a board swap (``InputGuard.split_by_board``) makes of the active predictions about GPUs
    (``active``; others are ignored), for the sinks and the processors, in this order:

    - withdrawn, at ``swap.ts``: those about a slot whose board changed or that a board left (the
      detector state there is now another board's, or a new GPU's, and would never withdraw them);
    - made again in its new slot: those about a board that moved (its state moved with it, the
      detectors know they raised them and will withdraw them there), at ``swap.ts``, with the same
      detector, event, confidence and time of the event (the ETA shortened by the time since).
      Where one takes the place of a prediction of the same detector and event in that slot, that
      one's withdrawal is left out: it is replaced, not withdrawn and raised again."""
    went = {int(source): int(slot) for slot, source in zip(swap.slots.tolist(), swap.came_from.tolist())
            if source >= 0}
    touched = set(swap.slots.tolist()) | set(swap.left.tolist())
    about = [p for p in active if p.entity_kind == "gpu" and p.active and p.slot in touched]
    carried = [replace(p, ts=swap.ts, slot=went[p.slot], eta_s=max(p.eta_s - (swap.ts - p.ts), 0.0),
                       reason=f"{p.reason} (its board moved from {gpu_name(p.slot)})")
               for p in about if p.slot in went]
    replaced = {(p.detector, p.event, p.slot) for p in carried}
    withdrawn = [replace(p, ts=swap.ts, active=False,
                         reason=f"withdrawn: the GPU's board moved to {gpu_name(went[p.slot])}" if p.slot in went
                         else "withdrawn: another board in the GPU's slot")
                 for p in about if (p.detector, p.event, p.slot) not in replaced]
    return withdrawn + carried


class DetectorBank:
    def __init__(self, topology: Topology, detectors: Iterable[Detector],
                 processors: Iterable[FindingProcessor] = ()) -> None:
        self.topology = topology
        self.detectors = list(detectors)
        share_thermal_fits(self.detectors)  # thermal, power and cooling: one fit per frame
        self.processors = list(processors)
        self._by_kind: dict[str, list[Detector]] = {}
        for det in self.detectors:
            for kind in det.kinds:
                self._by_kind.setdefault(kind, []).append(det)
        self.latency_s: dict[str, float] = {d.name: 0.0 for d in self.detectors}
        self.last_latency_s = 0.0

    @classmethod
    def from_names(cls, topology: Topology, names: Iterable[str] | None = None,
                   params: dict[str, dict[str, Any]] | None = None,
                   processors: Iterable[FindingProcessor] | None = None) -> "DetectorBank":
        """The bank for ``names`` (default: the standard bank) with the default processors (the
        incident engine) unless ``processors`` is given (``()`` for none). One factory for the
        embedded pipeline, the evaluation harness and the Kafka workers."""
        params = params or {}
        names = list(DEFAULT_BANK if names is None else names)
        if processors is None:
            processors = [create_processor(p, topology, **params.get(p, {})) for p in DEFAULT_PROCESSORS]
        return cls(topology, [create(n, topology, **params.get(n, {})) for n in names], processors)

    def report_problems_to(self, health: PipelineHealth) -> None:
        """Count the detectors' and processors' own input problems in ``health`` (see
        :func:`report_problems_to`)."""
        report_problems_to([*self.detectors, *self.processors], health)

    @property
    def kinds(self) -> set[str]:
        return set(self._by_kind)

    def update(self, frame: Frame) -> list[Finding]:
        """Run the detectors that consume ``frame.kind``, then the processors."""
        start = time.perf_counter()
        findings: list[Finding] = []
        for det in self._by_kind.get(frame.kind, ()):
            t0 = time.perf_counter()
            findings.extend(det.update(frame))
            # detectors sharing the thermal fit: the first to see a frame also carries the fit and
            # the per-sample predictions of the others (see thermal_fit)
            self.latency_s[det.name] = time.perf_counter() - t0
        if self.processors and len(frame):
            findings.extend(run_processors(self.processors, findings, float(frame.ts.max()), (frame,)))
        self.last_latency_s = time.perf_counter() - start
        return findings

    def pass_on(self, findings: list[Finding], now: float) -> list[Finding]:
        """Hand findings made outside the detectors (the withdrawals of a board swap's restarted
        GPUs) to the processors, as :meth:`update` hands them the detectors'; returns what the
        processors make of them (an incident losing a predicted member)."""
        return run_processors(self.processors, findings, now)

    def restart_gpus(self, slots: Sequence[int] | np.ndarray, fresh: dict[str, Any]) -> None:
        """Start the detector state of GPU ``slots`` afresh, as a new GPU's: their rows from
        ``fresh`` (a fresh bank's ``state_dict()["detectors"]``), every other row as it is. For a
        board swapped in a slot (an RMA, ``InputGuard.board_change``). The processors (the
        incident engine) keep theirs: an incident is the slot's history."""
        keep = np.ones(self.topology.size("gpu"), dtype=bool)
        keep[np.asarray(slots, dtype=np.int64)] = False
        self._load_remapped(Remap(self.topology, self.topology, keep={"gpu": keep}), fresh)

    def move_gpus(self, take_from: np.ndarray, fresh: dict[str, Any]) -> None:
        """Rearrange the GPUs' detector state: each GPU slot takes the rows of the slot
        ``take_from`` names (its own: as it is; another: its board moved here, ``InputGuard.
        follow_boards``; -1: a new GPU's, from ``fresh``, as :meth:`restart_gpus`). Read all at
        once, so boards trading places (a cycle) each take the other's. The processors keep theirs."""
        self._load_remapped(Remap.rearranged(self.topology, take_from), fresh)

    def _load_remapped(self, remap: Remap, fresh: dict[str, Any]) -> None:
        current = self.state_dict()["detectors"]
        for detector in self.detectors:
            # the fresh state first: a remap takes the rows of the entities it does not keep from
            # the detector's own state (``Detector.remap_state``), as a fresh bank's on a move
            detector.load_state_dict(fresh[detector.name])
            detector.load_state_dict(detector.remap_state(current[detector.name], remap))

    def state_dict(self) -> dict[str, Any]:
        return {
            "detectors": {d.name: d.state_dict() for d in self.detectors},
            "processors": {p.name: p.state_dict() for p in self.processors},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for d in self.detectors:
            d.load_state_dict(state["detectors"][d.name])
        for p in self.processors:
            p.load_state_dict(state["processors"][p.name])

    def remap_state(self, state: dict[str, Any], remap: Remap) -> dict[str, Any]:
        """A state saved under another topology, moved onto this (fresh) bank's entity by entity
        (``Detector.remap_state``); load it with :meth:`load_state_dict`."""
        if self.processors:
            raise ValueError("a bank with finding processors cannot move its state to other hardware")
        return {"detectors": {d.name: d.remap_state(state["detectors"][d.name], remap) for d in self.detectors},
                "processors": {}}

    def gauges(self) -> dict[str, tuple[str, Any, str]]:
        out: dict[str, tuple[str, Any, str]] = {}
        for d in self.detectors:
            out.update(d.gauges())
        return out

    def state_nbytes(self) -> int:
        """Bytes of detector state; an array several detectors share counts once."""
        total = sum(d.state_nbytes() for d in self.detectors)
        seen: set[int] = set()
        for d in self.detectors:
            for arr in d.state_arrays().values():
                if id(arr) in seen:
                    total -= arr.nbytes
                seen.add(id(arr))
        return total
