"""New XID errors and uncorrectable ECC errors, per GPU, as findings.

dcgm-exporter's XID field is the *last* XID the driver logged, never reset (FACTS: alerting on
``DCGM_FI_DEV_XID_ERRORS > 0`` latches forever). A new event is therefore a **change** of the
value; the first value seen for a GPU may be latched from long ago and is not reported. XID 79
("fallen off the bus") is what a GPU says last: its other fields stop reporting. Double-bit
ECC errors (``ecc_dbe``, a counter) are reported on every increase, read by the counter rules
(:class:`~foreshock.detectors.counters.CounterRates`, no wrap, at most :data:`DBE_MAX_PER_S`): a
negative reading is refused, one low reading then back (2 -> 0 -> 2) is a glitch and no new error,
one far above what a GPU can report is refused, a decrease that stands is a reset (a driver reload
clears the volatile count) and errors are counted from zero after it; each is counted in the
pipeline's health. The counter rules judge a low reading only once a counter's pace is known (its
second reading on, and again after a reset); a DBE count is flat almost always, so its pace is 0
where they know none: 2 -> 0 -> 2 is a glitch at a GPU's second and third readings too (at the
pipeline's start, on a fresh board), where it had been "2 new" errors again. Read raw, one 0
reading of a GPU's 2 old DBEs became "2 new uncorrectable ECC
errors" (a false GPU-error incident that absorbed a real XID 79 in a replay). The counter rules count a
decrease read as a reset as an increase of its low value at once (errors since the clear) and, if the
next reading shows a glitch, take only the rise above the value before it then; a DBE finding cannot
be taken back, so the low value's "increase" is held until that reading decides (5 -> 3 -> 5 had
been "3 new" errors): reported there with the reading's own rise if the reset stands, and only the
rise above the value before the drop if it was a glitch.

An XID is a whole number in the guard's range for ``xid_last`` (:func:`is_xid_code`); any other
reading (an exporter's -1 for N/A, DCGM's not-supported sentinel 9223372036854775794, 79.5) is no
code: not reported, and not remembered either (remembered, the next real reading of the unchanged
latched code read as a new XID).

Findings are :class:`~foreshock.findings.Anomaly` on the GPU: field ``xid_last`` with the code
as score, or ``ecc_dbe`` with the increase as score. They are what the incident engine roots a
lost or failing GPU on — so the XIDs an *application* causes (:data:`APPLICATION_XIDS`: 13, 31, 43,
45, info per FACTS) are not findings: every crashing user job would open a GPU-error incident on a
healthy GPU. They still count in the exporter's ``foreshock_xid_events_total{severity="info"}``.

>>> from foreshock.topology import Topology
>>> from foreshock.frames import Frame
>>> topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
...                            "nodes": [{"name": "n", "rack": "k", "gpus": 2}]})
>>> det, found = XidDetector(topo), []
>>> for t, codes in enumerate([[13, 0], [13, 0], [13, 79], [13, 79]]):   # 13 was latched
...     found += det.update(Frame("gpu", [t, t], [0, 1], {"xid_last": codes, "ecc_dbe": [0, 0]}))
>>> [(f.slot, f.field, f.score) for f in found]
[(1, 'xid_last', 79.0)]
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping

import numpy as np

from foreshock.facts import XID_SEVERITY
from foreshock.fields import get_field
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.numba_config import jit
from foreshock.topology import Topology

from .base import Detector
from .counters import DROP_SIZE, CounterRates, report_problems, with_counter_pace_and_drop

RESET = 0.0
"""``s_drop``'s fourth column for a decrease read as a reset (``foreshock.detectors.counters``)."""

XID_MEANING = {48: "double-bit ECC error", 63: "row remap pending", 64: "row remap failure", 74: "NVLink error",
               79: "GPU fell off the bus", 92: "high single-bit ECC rate", 94: "contained ECC error",
               95: "uncontained ECC error", 119: "GSP timeout", 120: "GSP error"}
KIND_XID, KIND_DBE = 0, 1
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
"""XIDs a user's program causes, not the GPU (NVIDIA's XID catalogue): 13 graphics engine exception
(an illegal instruction or out-of-range access), 31 GPU memory page fault (an illegal address), 43
GPU stopped processing (the application's channel reset), 45 preemptive cleanup (the driver
killing a process after such an error, or on a Ctrl-C). None is in FACTS' list of XIDs worth
knowing (severity info); until 2026-12-01 each rooted a "gpu_error" incident (family lost)."""

XID_LOWEST, XID_HIGHEST = get_field("xid_last").valid
"""The XID codes there are: the guard's range for ``xid_last`` (``foreshock.fields.VALID_BY_FIELD``),
so a frame fed past the guard (the Frame API) reads codes as a guarded one does."""

DBE_MAX_PER_S = 1000.0
"""Most uncorrectable ECC errors a GPU's counter can add per second: far above what one reports (each
uncorrectable error stops the work that hit it and is logged by the driver as an XID), so it refuses
garbage (a 1e12 reading), never a burst."""

XID_OUTSIDE_TOPOLOGY = "XID reading of a slot outside the topology: skipped"
"""The detector's problem for the codes :func:`xid_events` skips as their slot is outside the topology (a
frame fed past the guard), as nothing is dropped silently. A :class:`~foreshock.frames.Frame` has a column
for every field: the ``ecc_dbe`` counter rules count each row of such a slot (``unknown_slot``), whatever
it holds, so this counts only a frame without that column (counted by both, one row read as two problems)."""


@jit
def is_xid_code(v: float) -> bool:
    """Whether ``v`` is an XID code: a whole number in the guard's range (the range test first: it
    is False for NaN and ±inf, which ``math.floor`` cannot take). The detector and the exporter's
    XID counter (``foreshock.exporters.store``) read codes by this one rule."""
    return v >= XID_LOWEST and v <= XID_HIGHEST and v == math.floor(v)


@jit
def xid_events(slot: np.ndarray, xid: np.ndarray, last: np.ndarray, out: np.ndarray) -> tuple[int, int, int, int]:
    """Rows where a GPU's last-XID changes to a new code: the one rule of the detector and the
    exporter's XID counter (``foreshock.exporters.store``), which had each a twin of it.

    ``last`` is the last XID seen per GPU (NaN: none yet); ``out`` rows are (row, kind, value), a change to
    code 0 (no XID) is none. A value that is not a code (:func:`is_xid_code`: a garbled reading, two series
    averaged, an exporter's -1 for N/A, DCGM's not-supported sentinel) is not taken, and not remembered (79.5
    was read as XID 79, "fell off the bus"; 48 -> 48.5 -> 48 as a second XID 48; 79 -> -1 -> 79 as a new
    XID 79). A code of a slot outside ``last`` (a frame fed past the guard, through the Frame API) is
    skipped: read, it was an out-of-bounds read and write (a crash, or another array's memory corrupted; a
    negative slot read the last GPU's). The guard counts and drops both before a pipeline's detectors see
    them; fed past it, the caller counts them from what this returns.
    Returns (rows written, codes skipped as their slot is outside ``last``, non-codes that are not whole
    numbers, whole non-codes outside the guard's range (±inf included)); NaN (nothing read) is none."""
    n = 0
    outside = 0
    fractional = 0
    out_of_range = 0
    size = np.uint64(len(last))
    for i in range(len(slot)):
        v = xid[i]
        if not is_xid_code(v):
            if v != v:
                continue  # not read
            if v != np.floor(v):  # (np.floor: math.floor casts to int64, which 1e300 overflows)
                fractional += 1
            else:
                out_of_range += 1
            continue
        s = slot[i]
        if np.uint64(s) >= size:  # s < 0 or s >= len(last) in one test (a negative slot wraps to above 2**63)
            outside += 1
            continue
        prev = last[s]
        if prev == prev and v != prev and v > 0:
            out[n, 0] = i
            out[n, 1] = KIND_XID
            out[n, 2] = v
            n += 1
        last[s] = v
    return n, outside, fractional, out_of_range


@jit
def _dbe_pending(slot: np.ndarray, state: np.ndarray, drop: np.ndarray, seen: np.ndarray, nth: np.ndarray,
                 before: np.ndarray) -> tuple[int, int]:
    """Before the counter rules read the rows: each row's place among its slot's rows (``nth``, 0:
    its first) and, for a slot with a reset pending (``RESET`` in ``drop``), ``before`` = [1, the
    value before the drop, its time, the low value (counted as its own increase, held), 1: the
    reset counted]; [0, ...] for any other row (a slot outside the arrays too). ``seen`` is zeros,
    (slots, 1): scratch, left zeros. Returns the most rows of one slot less one (0: one row per slot)
    and the number of rows with a reset pending."""
    most = 0
    pending = 0
    for i in range(len(slot)):
        s = slot[i]
        before[i, 0] = 0.0
        nth[i] = 0
        if s < 0 or s >= len(seen):
            continue
        nth[i] = seen[s, 0]
        seen[s, 0] += 1
        most = max(most, nth[i])
        if drop[s, 0, 3] == RESET:
            before[i, 0] = 1.0
            pending += 1
            before[i, 1] = drop[s, 0, 0]
            before[i, 2] = drop[s, 0, 1]
            before[i, 3] = state[s, 0, 0]
            before[i, 4] = 1.0
    for i in range(len(slot)):
        s = slot[i]
        if 0 <= s < len(seen):
            seen[s, 0] = 0
    return most, pending


@jit
def _mark_pending_resets(slot: np.ndarray, before: np.ndarray, resets: np.ndarray, mark: int) -> None:
    """``resets`` (the counter rules' reset counts, scratch of zeros between updates) set to ``mark``
    at the slot of each row with a reset pending (``before`` from :func:`_dbe_pending`): 1 before the
    rules read the rows (the reset counted, for them to take back if the next reading shows a glitch),
    0 after, for every row's slot (a new reset counted there too)."""
    for i in range(len(slot)):
        s = slot[i]
        if 0 <= s < len(resets) and (mark == 0 or before[i, 0] == 1.0):
            resets[s, 0] = mark


@jit
def _dbe_new(slot: np.ndarray, dbe: np.ndarray, delta: np.ndarray, drop: np.ndarray, resets: np.ndarray,
             before: np.ndarray, out: np.ndarray) -> None:
    """After the counter rules read rows of distinct slots (``before`` from :func:`_dbe_pending`,
    ``delta`` the rules' increases): the new errors each row reports, into ``out`` (the docstring).
    A reset read now is held (0); one pending and decided by this row adds what it held if it stands,
    and if the rules took it back (a glitch: its reset uncounted) the row reports only its rise
    above the value before the drop. Pending and not decided (no reading taken), nothing."""
    for i in range(len(slot)):
        d = delta[i, 0]
        new = d if d > 0.0 else 0.0  # a real increase (NaN: refused, first, missing)
        s = slot[i]
        if 0 <= s < drop.shape[0]:
            pending = before[i, 0] == 1.0
            still = pending and drop[s, 0, 3] == RESET and drop[s, 0, 1] == before[i, 2]
            if drop[s, 0, 3] == RESET and not still:
                new = 0.0  # a reset read now: held for the next reading
            if pending and not still:
                if resets[s, 0] < before[i, 4]:
                    new = dbe[i] - before[i, 1]  # a glitch: only the rise above the value before
                else:
                    new += before[i, 3]  # the reset stands: what it counted, with this reading's rise
        out[i] = new


class XidDetector(Detector):
    """New XIDs (changes of the last-XID field) and DBE ECC increments per GPU."""

    slot_kinds: ClassVar[Mapping[str, str]] = {name: "gpu" for name in (
        "s_last_xid", "s_dbe_state", "s_dbe_rate", "s_dbe_drop")}
    name: ClassVar[str] = "xid"
    kinds: ClassVar[tuple[str, ...]] = ("gpu",)

    def __init__(self, topology: Topology, health: PipelineHealth | None = None) -> None:
        super().__init__(topology)
        self.health = health or PipelineHealth()
        n = topology.size("gpu")
        self.s_last_xid = np.full(n, np.nan, dtype=np.float32)  # a code (0..1023, exact) or NaN
        self.counters = CounterRates(n, ("ecc_dbe",), modulus=0.0, max_rate=DBE_MAX_PER_S)
        # the DBE counter's state, with its pace and the value before a low reading: in the
        # checkpoint, or a low reading across a restore reads as a reset and its return as new errors.
        # The pace is a value (no time, no count): float32. The counter's value and its time stay float64
        self.s_dbe_state, self.s_dbe_drop = self.counters.s_state, self.counters.s_drop
        self.s_dbe_rate = np.full((n, 1), np.nan, dtype=np.float32)
        # Scratch, not state, all zeros between uses, one array for two of them: _dbe_pending's per-slot
        # row counts, and the reset counts the counter rules keep (only whether a pending reset was taken
        # back is read, and a reset is pending only where ``s_dbe_drop`` says so: :meth:`_new_dbes_once`)
        self._slot_scratch = np.zeros((n, 1), dtype=np.int64)
        self.counters.bind(self.s_dbe_state, self._slot_scratch, self.s_dbe_rate, self.s_dbe_drop)

    def update(self, frame: Frame) -> list[Finding]:
        if frame.kind != "gpu" or len(frame) == 0:
            return []
        events = np.empty((2 * len(frame), 3))
        n = 0
        xid = frame.columns.get("xid_last")
        dbe = frame.columns.get("ecc_dbe")
        if xid is not None:
            n, outside, _, _ = xid_events(frame.slot, np.ascontiguousarray(xid, dtype=np.float64), self.s_last_xid,
                                          events)  # (its non-codes: the guard's to count)
            if outside and dbe is None:  # (a Frame has an ``ecc_dbe`` column: its counter rules count the row)
                self.health.problem(self.name, XID_OUTSIDE_TOPOLOGY, outside)
        if dbe is not None:
            new = self._new_dbes(frame.ts, frame.slot, np.asarray(dbe, dtype=np.float64))
            rows = np.flatnonzero(new > 0.0)
            events[n:n + len(rows)] = np.stack([rows, np.full(len(rows), KIND_DBE), new[rows]], axis=1)
            n += len(rows)
        events = events[:n][np.lexsort((events[:n, 1], events[:n, 0]))]  # by row, an XID before its DBEs
        findings: list[Finding] = []
        for row, kind, value in events:
            r, g = int(row), int(frame.slot[int(row)])
            name = self.topology.gpus[g]
            if int(kind) == KIND_XID:
                code = int(value)
                if code in APPLICATION_XIDS:
                    continue
                what = XID_MEANING.get(code, "driver error")
                findings.append(Anomaly(float(frame.ts[r]), "gpu", g, "xid_last", float(code), self.name,
                                        f"XID {code} on {name}: {what} ({XID_SEVERITY.get(code, 'info')})"))
            else:
                findings.append(Anomaly(float(frame.ts[r]), "gpu", g, "ecc_dbe", float(value), self.name,
                                        f"{int(value)} new uncorrectable (double-bit) ECC error(s) on {name}"))
        return findings

    def _new_dbes(self, ts: np.ndarray, slot: np.ndarray, dbe: np.ndarray) -> np.ndarray:
        """The new uncorrectable errors each row reports (0 or NaN: none), by the counter rules, less the
        increase a reset reads while the reading after it has not decided it (the docstring).

        What a reading decided shows in the counter's state only: a frame holding a GPU's rows of
        several polls (a replay's batch) is fed one poll of each GPU at a time."""
        slot = np.ascontiguousarray(slot, dtype=np.int32)
        dbe = np.ascontiguousarray(dbe, dtype=np.float64)
        nth = np.empty(len(slot), dtype=np.int64)
        before = np.empty((len(slot), 5))
        counters = self.counters
        most, pending = _dbe_pending(slot, counters.s_state, counters.s_drop, self._slot_scratch, nth, before)
        if most == 0:  # one row per GPU, as a live poll's frame
            return self._new_dbes_once(ts, slot, dbe, before, pending > 0)
        new = np.zeros(len(slot))
        for k in range(most + 1):
            rows = np.flatnonzero(nth == k)
            slot_k, before_k = slot[rows], np.empty((len(rows), 5))  # (the pending drops now, after poll k - 1)
            _, pending = _dbe_pending(slot_k, counters.s_state, counters.s_drop, self._slot_scratch,
                                      np.empty(len(rows), dtype=np.int64), before_k)
            new[rows] = self._new_dbes_once(ts[rows], slot_k, dbe[rows], before_k, pending > 0)
        return new

    def _new_dbes_once(self, ts: np.ndarray, slot: np.ndarray, dbe: np.ndarray, before: np.ndarray,
                       pending: bool) -> np.ndarray:
        """:meth:`_new_dbes` of rows of distinct GPUs, ``before`` from :func:`_dbe_pending` (``pending``:
        any reset pending there)."""
        np.nan_to_num(self.s_dbe_rate, copy=False, nan=0.0)  # a pace the rules do not know: flat (the docstring)
        resets = self.counters.s_resets  # (``self._slot_scratch``, zeros here)
        if pending:  # each pending reset counted, for the rules to take back if this reading shows a glitch
            _mark_pending_resets(slot, before, resets, 1)
        delta, _, problems = self.counters.update(ts, slot, dbe[:, None])
        report_problems(self.health, self.name, problems)
        if not pending and not problems["resets"]:
            return delta[:, 0]  # nothing held or to hold (almost always): the rules' increases
        new = np.empty(len(slot))
        _dbe_new(slot, dbe, np.ascontiguousarray(delta), self.counters.s_drop, resets, before, new)
        _mark_pending_resets(slot, before, resets, 0)
        return new

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state saved when ``s_last`` held [last XID, last DBE count] per GPU (the DBE count read
        raw): the XID goes on; the DBE count is the counter's last value, seen at a time not known
        (``-inf``: the next reading's increase is taken, over an interval too long to refuse it),
        no pace known, no drop pending. One saved with a narrower ``s_dbe_drop`` has it widened. One
        saved with the counter's reset count (``s_dbe_resets``, before 2026-12-06) has it dropped: the
        detector reads only whether a reset pending in ``s_dbe_drop`` is taken back, which the drop
        itself says (the count is not kept, :meth:`__init__`)."""
        saved = state.get("s_last")
        if saved is not None and "s_last_xid" not in state and np.ndim(saved) == 2 and np.shape(saved)[1] == 2:
            saved = np.asarray(saved, dtype=np.float64)
            n = len(saved)
            dbe = saved[:, 1]
            seen_at = np.where(np.isnan(dbe), np.nan, -np.inf)
            state = {k: v for k, v in state.items() if k != "s_last"}
            state.update(s_last_xid=saved[:, 0].copy(), s_dbe_state=np.stack([dbe, seen_at], axis=1)[:, None, :],
                         s_dbe_rate=np.full((n, 1), np.nan), s_dbe_drop=np.full((n, 1, DROP_SIZE), np.nan))
        state = {k: v for k, v in state.items() if k != "s_dbe_resets"}
        return with_counter_pace_and_drop(state, "s_dbe_state", "s_dbe_rate", "s_dbe_drop")

    def previous_layout_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """... as kept before 2026-12-06: with the counter's reset counts (``s_dbe_resets``, int64, one per
        GPU), zeros here. Exact for a fresh state and for one whose GPUs' DBE counters never went
        back; that version counted each reset there, which :meth:`upgrade_state` drops unread."""
        last = np.asarray(state.get("s_last_xid"))
        if "s_dbe_resets" in state or last.ndim != 1:
            return state
        return {**state, "s_dbe_resets": np.zeros((len(last), 1), dtype=np.int64)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._slot_scratch[...] = 0
        self.counters.bind(self.s_dbe_state, self._slot_scratch, self.s_dbe_rate, self.s_dbe_drop)
