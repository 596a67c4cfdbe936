"""The detector bank: one object that runs every detector over every frame.

The same bank serves the embedded pipeline and the Kafka workers. Findings from detectors
flow on to *processors* (the incident engine) that turn findings into further findings.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Protocol, Sequence

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.findings import BOARD_FOLLOWED, Finding, Prediction
from foreshock.frames import Frame
from foreshock.guard import MAX_AHEAD_S, BoardSwap
from foreshock.remap import Remap
from foreshock.topology import Topology

from .base import Detector
from .gpu_inputs import frame_now
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


PROCESSORS_SLACK_S = MAX_AHEAD_S
"""How far past a frame's median stamp its latest may lie and still be the processors' "now"
(:func:`~foreshock.detectors.gpu_inputs.frame_now`): a frame of one tick spans seconds, one of a
Kafka bundle a linger; a row further ahead has a wrong clock (the input guard's bound)."""


def follow_predictions(swap: BoardSwap, active: Iterable[Prediction], gpu_name: Callable[[int], str]) -> list[Prediction]:
    """What a board swap (``InputGuard.split_by_board``) makes of the active predictions about GPUs
    (``active``; others are ignored), for the sinks and the processors, in this order:

    - withdrawn, at ``swap.ts``: those about a slot whose board changed or that a board left (the
      detector state there is now another board's, or a new GPU's, and would never withdraw them);
    - made again in its new slot: those about a board that moved (its state moved with it, the
      detectors know they raised them and will withdraw them there), at ``swap.ts``, with the same
      detector, event, confidence and time of the event (a known ETA shortened by the time
      since; an unknown one, negative, kept), its reason saying where the board moved from (once:
      a board moved again says only where from last). Where one takes the place of a prediction
      of the same detector and event in that slot, that one's withdrawal is left out: it is
      replaced, not withdrawn and raised again."""
    went = {int(source): int(slot) for slot, source in zip(swap.slots.tolist(), swap.came_from.tolist())
            if source >= 0}
    touched = set(swap.slots.tolist()) | set(swap.left.tolist())
    about = [p for p in active if p.entity_kind == "gpu" and p.active and p.slot in touched]
    carried = [replace(p, ts=swap.ts, slot=went[p.slot], eta_s=_eta_at(p, swap.ts),
                       reason=f"{BOARD_FOLLOWED.sub('', p.reason)} (its board moved from {gpu_name(p.slot)})")
               for p in about if p.slot in went]
    replaced = {(p.detector, p.event, p.slot) for p in carried}
    withdrawn = [replace(p, ts=swap.ts, active=False,
                         reason=f"withdrawn: the GPU's board moved to {gpu_name(went[p.slot])}" if p.slot in went
                         else "withdrawn: another board in the GPU's slot")
                 for p in about if (p.detector, p.event, p.slot) not in replaced]
    return withdrawn + carried


def _eta_at(prediction: Prediction, ts: float) -> float:
    """``prediction``'s ETA seen from ``ts``: the time left to its event (0: due), or as it is
    where it is unknown (negative: ``power_cap``'s "no finite forecast" is -1, not "now")."""
    if prediction.eta_s < 0:
        return prediction.eta_s
    return max(prediction.eta_s - (ts - prediction.ts), 0.0)


PACKED_KINDS = "biuf"
"""The dtype kinds :class:`ParkedRows` packs as bytes (numbers and booleans); rows of any other
are kept as they are."""


class ParkedRows(NamedTuple):
    """One GPU's detector rows set aside (``DetectorBank.park_gpus``), packed: one byte array per
    GPU, not one array per detector and key (1.8 kB a GPU in the default bank, not 4.9)."""

    layout: tuple[tuple[str, str, np.dtype, tuple[int, ...]], ...]  # (detector, key, dtype, row shape), in order
    packed: np.ndarray  # uint8: the rows' bytes, one after another
    other: dict[tuple[str, str], np.ndarray]  # rows of a dtype not packed (object), as they are

    def rows(self) -> dict[str, dict[str, np.ndarray]]:
        """Detector name -> state key -> the GPU's row."""
        out: dict[str, dict[str, np.ndarray]] = {}
        offset = 0
        for detector, key, dtype, shape in self.layout:
            count = int(np.prod(shape, dtype=np.int64))
            out.setdefault(detector, {})[key] = np.frombuffer(self.packed, dtype, count, offset).reshape(shape).copy()
            offset += count * dtype.itemsize
        for (detector, key), row in self.other.items():
            out.setdefault(detector, {})[key] = row
        return out


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
        # (node, board) -> the detector rows of a board displaced from its slot and read nowhere
        # else yet (``BoardSwap.parked``): the guard says which to keep and which to give up.
        # Kept with the state (:meth:`state_dict`), as the guard keeps its list of them
        self._parked: dict[tuple[int, float], ParkedRows] = {}
        # (node, board) -> the predictions about a parked board, withdrawn when it was parked and
        # made again where it is read again (:meth:`follow_predictions`): its rows keep the
        # detectors' latches "raised", which would otherwise hold them back until their next
        # refresh. Only of boards whose rows are parked; given up with them
        self._parked_predictions: dict[tuple[int, float], list[Prediction]] = {}

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
        stamps = frame.ts[np.isfinite(frame.ts)]
        if self.processors and len(stamps):
            # the time the frame speaks for, not one odd row's: a row stamped a day ahead (replay and
            # evaluate have no clock to refuse it by) moved the incident engine's clock a day on
            now = frame_now(stamps, PROCESSORS_SLACK_S)
            findings.extend(run_processors(self.processors, findings, now, (frame,)))
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

    def take_swap(self, swap: BoardSwap, fresh: dict[str, Any]) -> list[Finding]:
        """A board swap (``InputGuard.split_by_board``) applied to the bank, as the embedded pipeline
        and the evaluation both do it: a displaced board's state parked (:meth:`park_gpus`), the
        moved boards' state moved and the new ones' started afresh from ``fresh`` (:meth:`move_gpus`,
        :meth:`restart_gpus`), a parked board read again given its state back (:meth:`unpark_gpus`),
        then the processors that keep incidents by GPU slot made to follow the boards
        (:meth:`follow_moves`). Returns the incidents told again; the caller then withdraws and
        makes again the predictions (:meth:`follow_predictions`) and passes them on, so a moved
        board's re-made predictions land in its own renamed incident."""
        self.park_gpus(swap)
        if (swap.came_from >= 0).any() or len(swap.left):
            self.move_gpus(swap.take_from(self.topology.size("gpu")), fresh)
        else:
            self.restart_gpus(swap.slots, fresh)
        self.unpark_gpus(swap)
        return self.follow_moves(swap)

    def follow_moves(self, swap: BoardSwap) -> list[Finding]:
        """Hand a board swap to the processors that keep incidents by GPU slot (``IncidentEngine.
        follow_moves``): an incident follows the boards that moved, as their state does
        (:meth:`move_gpus`), and a parked board takes its incidents back where it is read again.
        Returns the incidents told again."""
        moved_from = np.full(self.topology.size("gpu"), -1, dtype=np.int64)
        moved_from[swap.slots] = swap.came_from
        out: list[Finding] = []
        for proc in self.processors:
            follow = getattr(proc, "follow_moves", None)
            if callable(follow):
                out += follow(moved_from, swap.ts, swap.park_keys(self.topology), swap.unpark_keys(self.topology),
                              swap.dropped)
        return out

    def park_gpus(self, swap: BoardSwap) -> None:
        """Before a board swap's state moves (:meth:`move_gpus`, :meth:`restart_gpus`): set aside
        the rows of the slots whose board is displaced and read nowhere else (``swap.parked``),
        by (node, board), and give up those the guard gave up (``swap.dropped``)."""
        for key in swap.dropped:
            self._parked.pop(key, None)
        keys = swap.park_keys(self.topology)
        if keys:
            self._park_rows(keys)
        # the predictions go with their rows (dropped, past the cap, or left by a caller that
        # took a swap without :meth:`follow_predictions`)
        self._parked_predictions = {key: kept for key, kept in self._parked_predictions.items() if key in self._parked}

    def _park_rows(self, keys: list[tuple[int, tuple[int, float]]]) -> None:
        """Set aside the rows of each (slot, (node, board)) of ``keys``, packed (:class:`ParkedRows`)."""
        slots = np.array([slot for slot, _ in keys], dtype=np.int64)
        layout: list[tuple[str, str, np.dtype, tuple[int, ...]]] = []
        packed: list[np.ndarray] = []  # per key: per slot, its row's bytes
        other: list[dict[tuple[str, str], np.ndarray]] = [{} for _ in keys]
        for name, k, arr in self._gpu_arrays():  # copies, at a swap only
            if arr.dtype.kind not in PACKED_KINDS:
                for i, slot in enumerate(slots.tolist()):
                    other[i][name, k] = arr[slot].copy()
                continue
            layout.append((name, k, arr.dtype, arr.shape[1:]))
            packed.append(np.ascontiguousarray(arr[slots]).reshape(len(slots), -1).view(np.uint8))
        rows = np.concatenate(packed, axis=1) if packed else np.zeros((len(slots), 0), dtype=np.uint8)
        shared = tuple(layout)
        for i, (_, key) in enumerate(keys):
            self._parked[key] = ParkedRows(shared, rows[i].copy(), other[i])
        while len(self._parked) > self.topology.size("gpu"):  # the guard bounds them; never more than a row per GPU
            del self._parked[next(iter(self._parked))]

    def unpark_gpus(self, swap: BoardSwap) -> None:
        """After a board swap's state moved: each slot whose board was parked (``swap.unparked``)
        takes its rows back (it started afresh in the move). Loaded through ``remap_state`` with
        every slot in place, so that what a detector derives from its GPUs' rows (the power
        detector's braking GPUs per node) is counted again. A board the bank holds no rows of
        (the guard's parking outlived the bank's) stays as it started: afresh."""
        unpark = swap.unpark_keys(self.topology)
        for _, key in unpark:
            if key not in self._parked:  # no rows to take back: its predictions are not made again
                self._parked_predictions.pop(key, None)
        restore = [(slot, self._parked.pop(key).rows()) for slot, key in unpark if key in self._parked]
        if not restore:
            return
        in_place = Remap.rearranged(self.topology, np.arange(self.topology.size("gpu")))
        for detector in self.detectors:
            state = detector.state_dict()
            for slot, rows in restore:
                for k, row in rows.get(detector.name, {}).items():
                    state[k][slot] = row
            detector.load_state_dict(detector.remap_state(state, in_place))

    def follow_predictions(self, swap: BoardSwap, active: Iterable[Prediction],
                           gpu_name: Callable[[int], str]) -> list[Prediction]:
        """What a board swap the bank took (:meth:`take_swap`) makes of the active predictions
        about GPUs (``active``, from before the swap): :func:`follow_predictions` (withdrawn where
        a board left or changed, made again where a board moved), then, made again at ``swap.ts``
        in its slot now, each prediction about a parked board read again (``swap.unparked``): its
        rows came back with the detectors' latches "raised", and they would make it again only at
        their next refresh (a minute; cooling ten) and withdraw it, if it cleared first, a second
        time. Same detector, event and confidence, a known ETA shortened by the time since (an
        unknown one, negative, kept), its reason saying where the board is back; one whose event
        time has passed while it was away is not made again. The predictions about a board parked
        at this swap are kept with its rows for that (withdrawn all the same: its slot is another
        board's, or none's). A withdrawal in the slot of one made again, of the same detector and
        event, is left out: it is replaced."""
        active = [p for p in active if p.entity_kind == "gpu" and p.active]
        for slot, key in swap.park_keys(self.topology):
            about = [p for p in active if p.slot == slot]
            if about and key in self._parked:
                self._parked_predictions[key] = about
            else:
                self._parked_predictions.pop(key, None)
        back = [replace(p, ts=swap.ts, slot=slot, eta_s=_eta_at(p, swap.ts),
                        reason=f"{BOARD_FOLLOWED.sub('', p.reason)} (its board back at {gpu_name(slot)})")
                for slot, key in swap.unpark_keys(self.topology) for p in self._parked_predictions.pop(key, ())
                if p.eta_s < 0 or p.ts + p.eta_s >= swap.ts]
        made = {(p.detector, p.event, p.slot) for p in back}
        return [p for p in follow_predictions(swap, active, gpu_name)
                if p.active or (p.detector, p.event, p.slot) not in made] + back

    @property
    def parked(self) -> dict[tuple[int, float], ParkedRows]:
        """The parked boards' rows, by (node, board) (:meth:`park_gpus`)."""
        return self._parked

    @property
    def parked_predictions(self) -> dict[tuple[int, float], list[Prediction]]:
        """The predictions about the parked boards, by (node, board) (:meth:`follow_predictions`)."""
        return self._parked_predictions

    def _load_remapped(self, remap: Remap, fresh: dict[str, Any]) -> None:
        current = {d.name: d.state_dict() for d in self.detectors}  # (not the processors': they keep theirs)
        for detector in self.detectors:
            # the fresh state first: a remap takes the rows of the entities it does not keep from
            # the detector's own state (``Detector.remap_state``), as a fresh bank's on a move
            detector.load_state_dict(fresh[detector.name])
            detector.load_state_dict(detector.remap_state(current[detector.name], remap))

    def state_dict(self) -> dict[str, Any]:
        return {
            "detectors": {d.name: d.state_dict() for d in self.detectors},
            "processors": {p.name: p.state_dict() for p in self.processors},
            "parked": self._parked_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for d in self.detectors:
            d.load_state_dict(state["detectors"][d.name])
        for p in self.processors:
            p.load_state_dict(state["processors"][p.name])
        self._parked = self._parked_from(state.get("parked"))
        saved = (state.get("parked") or {}).get("predictions", ())
        self._parked_predictions = {}
        for node, board, prediction in saved:
            if (node, board) in self._parked:
                self._parked_predictions.setdefault((node, board), []).append(prediction)

    def previous_layout_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (this bank's ``state_dict()``) with each detector's state as the version before its
        last layout change kept it (``Detector.previous_layout_state``); the processors' and the parked
        rows as they are (a version whose detectors kept other rows does not read those back:
        :meth:`_parked_from`). A worker reads a checkpoint written by that version against it."""
        detectors = {d.name: d.previous_layout_state(state["detectors"][d.name])
                     for d in self.detectors if d.name in state["detectors"]}
        return {**state, "detectors": {**state["detectors"], **detectors}}

    def _gpu_arrays(self) -> Iterator[tuple[str, str, np.ndarray]]:
        """Each detector's per-GPU state arrays (slot on axis 0), copies: (detector, key, array),
        in the order :class:`ParkedRows` packs their rows."""
        for detector in self.detectors:
            state = detector.state_dict()
            for k, kind in detector.slot_kinds.items():
                arr = state.get(k)
                if kind == "gpu" and isinstance(arr, np.ndarray):
                    yield detector.name, k, arr

    def _gpu_layout(self) -> tuple[tuple[str, str, np.dtype, tuple[int, ...]], ...]:
        """The packed layout of a GPU's rows in this bank (:class:`ParkedRows`), as :meth:`park_gpus` makes it."""
        return tuple((name, k, arr.dtype, arr.shape[1:]) for name, k, arr in self._gpu_arrays()
                     if arr.dtype.kind in PACKED_KINDS)

    def _parked_state(self) -> dict[str, Any]:
        """The parked rows as arrays, for a checkpoint: ``keys`` (node, board) and ``rows`` (their
        packed bytes, in this bank's layout), with ``predictions``, (node, board, prediction) of
        each (:meth:`follow_predictions`). Rows of a dtype not packed (none in the bank) are left
        out, their boards with them."""
        kept = [(key, parked.packed) for key, parked in self._parked.items() if not parked.other]
        return {"keys": np.array([key for key, _ in kept], dtype=np.float64).reshape(-1, 2),
                "rows": np.stack([rows for _, rows in kept]) if kept else np.zeros((0, 0), dtype=np.uint8),
                "predictions": [(node, board, prediction) for (node, board), _ in kept
                                for prediction in self._parked_predictions.get((node, board), ())]}

    def _parked_from(self, saved: dict[str, Any] | None) -> dict[tuple[int, float], ParkedRows]:
        """The parked rows of a state (:meth:`_parked_state`); none where it has none (saved before
        boards were parked, or moved to other hardware: ``remap_state``) or where this bank's
        detectors keep other rows (another version): those boards start afresh when read again."""
        if not saved or not len(saved["keys"]):
            return {}
        layout = self._gpu_layout()
        width = sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for _, _, dtype, shape in layout)
        rows = np.asarray(saved["rows"], dtype=np.uint8)
        if rows.ndim != 2 or rows.shape[1] != width:
            return {}
        return {(int(n), float(b)): ParkedRows(layout, rows[i].copy(), {})
                for i, (n, b) in enumerate(np.asarray(saved["keys"]).tolist())}

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
