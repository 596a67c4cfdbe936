"""The input guard: the first stage after every source, in both pipelines.

Detectors assume each entity's samples arrive in time order with a known slot. The guard
enforces that, per entity kind, in one Numba pass over a frame, and *counts* every row it
sets aside (``PipelineHealth.problem``) — nothing disappears silently:

- ``unknown_entity``: slot outside the topology;
- ``bad_timestamp``: NaN or infinite ``ts``, or, where the source knows a stamp its stream holds
  before the first frame (:attr:`InputGuard.stream_anchor`: a replay, from its recording), one more
  than :data:`MAX_BEHIND_S` before it: stamped by a clock not set (epoch zero, an agent started
  before NTP). Accepted as an entity's first sample, such a row had started the run in 1970;
- ``duplicate_timestamp``: same ``ts`` as the entity's previous sample;
- ``out_of_order``: older than the entity's previous sample;
- ``near_duplicate_timestamp``: newer than the entity's previous sample by less than
  ``min_spacing_s`` (:data:`MIN_SPACING_S`, 10 ms by default): the same sample again under a fresh
  stamp (a source emitting it twice, an agent retrying a send and stamping it anew, two
  overlapping captures replayed), which no source samples that fast. Accepted, its anomaly was
  counted twice;
- ``future_timestamp``: further ahead of the receiver's clock than ``max_ahead_s`` (where one is
  given: ``foreshock watch`` and the Kafka workers, whose agents stamp rows with their own hosts'
  clocks); without one (a replay, an evaluation, a simulation: no wall clock to go by), further
  than :data:`MAX_AHEAD_S` ahead of the stream's own present (:meth:`InputGuard.stream_present`).
  Accepted, such a row would have set the entity's last timestamp hours (or years) ahead, and
  every later row of it would have been refused as out of order for as long — kept so by the
  checkpoints across restarts;
- ``missing_values``: NaN gaps in a field the frame does report, where that entity has reported
  the field before (a sensor going dark): kept (NaN means missing), counted once per sample (row)
  however many of its fields are missing, as ``inf_values``. A field an entity has
  never reported is one it does not have (a T4 has no HBM sensor; a mixed fleet's exporter page
  leaves it blank for those GPUs): not counted, or every poll would count it again;
- ``inf_values``: infinities become NaN, counted (per sample);
- ``not_whole``: a value of a field that takes whole numbers only (a code such as the last XID, a
  bitmask such as the throttle reasons) that is not one becomes NaN, counted with the field named:
  79.5 had been read as XID 79 ("fell off the bus"), a bitmask averaged from two series as bits
  neither set;
- ``out_of_range``: a gauge value no sensor of its field can read (``Field.valid``: a sentinel
  such as 65535 or -1, a raw RPM where a share is due) becomes NaN, counted with the field named;
  so does a ``board_id`` that no UUID is carried as (:func:`valid_board_ids`): a corrupt cell, read
  as a board, had been taken for an RMA (the GPU's state parked, its incidents told again), and
  again at the next row, when the real board came back.

It also keeps the board last read in each GPU's slot (the ``board_id`` field, a number per UUID
that the GPU sources write): :meth:`InputGuard.board_change` tells the pipeline where a slot's
board changes (an RMA), so that GPU's detector state starts afresh there. Kept with the rest of
the state, a worker restarted after the swap still finds it. A board last read in another slot of
the same node has not been swapped but renumbered (a node rebooting with one GPU missing lists
every later GPU one index lower): :meth:`InputGuard.follow_boards` says where it came from, and
its state follows it (``DetectorBank.move_gpus``). A board displaced and read nowhere else yet (a
renumbering read in pieces, a UUID not read one poll, the missing GPU itself) has its state parked
by (node, board) until it is read again (``DetectorBank.park_gpus``), kept with the state, for a
day at most.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Any, Callable, Iterator, NamedTuple, Tuple

import numpy as np

from .fields import field_names, get_field, valid_bounds, whole_only
from .frames import Frame, median_stamp
from .health import PipelineHealth
from .numba_config import jit
from .remap import HARDWARE_KINDS, Remap, saved_slots, take_rows
from .topology import Topology

_REPORTED = ":reported"
_JOBS = "jobs:keys"
_BOARDS = "gpu:board"
_PARKED = "gpu:parked"
_STREAM_CLOCK = "stream:clock"
BoardChange = Tuple[float, np.ndarray, np.ndarray, np.ndarray]
"""``(ts, slots, old, new)``: when boards change, in which GPU slots, the boards before and after
(:meth:`InputGuard.board_change`)."""
PARK_FOR_S = 24 * 3600.0
"""How long (telemetry time) a displaced board's state stays parked (:meth:`InputGuard.follow_boards`):
a GPU reseated within a day finds its own state again; a board back from repair, or after longer,
starts afresh."""
MAX_AHEAD_S = 900.0
"""How far (s) a row may lie ahead of the present before its clock is taken as wrong, not
slightly off, and the row refused (``future_timestamp``): ahead of the wall clock where one is
given (``foreshock watch``'s guard; the Kafka workers' default ``--max-clock-ahead``), ahead of the
stream's own present where none is (an :class:`InputGuard` without ``max_ahead_s``: replay,
evaluate), and for a dcgm line, ahead of its scrape (``streams.dcgm``). The one bound for all."""
MAX_BEHIND_S = 10 * 365.25 * 86400.0
"""How far (s) a row may lie before a stamp its stream is known to hold (:attr:`InputGuard.stream_anchor`)
before its clock is taken as not set (epoch zero, a BMC's 2000-01-01) and the row refused
(``bad_timestamp``); and how far apart a recording's kinds may lie (``Recording.open``): ten years,
which no run spans, while a clock not set reads decades before, and milliseconds read as seconds
lie millennia ahead."""
MIN_SPACING_S = 0.01
"""The least time (s) between two samples of one entity: a row newer than its entity's previous
accepted one by less is refused (``near_duplicate_timestamp``), the same sample sent again with a
fresh stamp. 10 ms, ten times under the fastest that any source here samples an entity: ``dcgmi
dmon -d`` takes 100 ms at the least, the real nvidia-smi captures here poll at 100 ms and 500 ms
(``tests/data/h200_step``: 98.9 ms the closest two rows of a GPU), dcgm-exporter collects every
30 s by default, and the BMCs, CDUs, fabric counters and schedulers every few seconds or more; a
host's clock jitter of a few ms between polls stays well inside it. No source here samples
faster than :data:`MIN_INTERVAL_S`, and a live source leaves :data:`POLL_GAP_S` between one poll's
stamps and the next one's start, so its own rows never fall within it. An :class:`InputGuard`
parameter (``min_spacing_s``): 0 refuses only equal stamps, as before."""
MIN_INTERVAL_S = 2 * MIN_SPACING_S
"""The shortest sampling interval (s) a source here takes (every live source's ``--interval``,
the simulator's): twice :data:`MIN_SPACING_S`. A source sampling at the guard's own spacing saw
its rows refused as repeats whenever one poll started a fraction of a millisecond later than the
next (a 10-ms `watch` on a busy machine: rows 9.63 ms apart)."""
LONGEST_WAIT_S = 1e9
"""The longest interval or duration (s, about 31 years) a live source or run waits for: past
``threading.TIMEOUT_MAX`` (9.2e9 s on Linux) a timer's wait raises ``OverflowError`` in its thread
(``--interval 1e10`` had ended ``watch`` in a traceback)."""
POLL_GAP_S = MIN_SPACING_S + 0.005
"""The least time (s) from the stamps of a live source's poll (its start, or its end where rows are
stamped as answers come: ``PollingSource.stamps_at_start``) to the next poll's start, whatever its
grid says: the next poll's stamps then lie at least this far after them, past
:data:`MIN_SPACING_S` by 5 ms for a scheduler waking a poll late and a wall clock slewed against
the monotonic one the grid keeps."""
SPACING_ROUNDING_S = 1e-6
"""How far two stamps at exactly ``min_spacing_s`` may read closer through rounding: a float64 stamp
near 1.7e9 s is kept to 2.4e-7 s, so rows a 10-ms interval apart read 9.99999 ms apart at times
(rows stamped exactly 10 ms apart: 48 % had been refused). Not a near duplicate."""
BOARD_ID_LIMIT = 2.0 ** 52
"""``board_id`` values are whole numbers below this (``foreshock.boards.BOARD_ID_BITS``)."""


class BoardSwap(NamedTuple):
    """A change of boards (:meth:`InputGuard.board_change`) and, per slot, where its new board was
    read before (:meth:`InputGuard.split_by_board`). A board last read in another slot of the same
    node has *moved* (a GPU missing at a reboot renumbers the node's later GPUs): its learnt state
    follows it; any other board is a new one (an RMA) and starts afresh."""

    ts: float
    slots: np.ndarray  # the GPU slots reading another board from ``ts`` on
    old: np.ndarray  # their boards before (NaN: none; a slot a moved board had left)
    new: np.ndarray  # their boards from ``ts`` on
    came_from: np.ndarray  # per slot, the slot of the same node its board was last read in (-1: none, a new board)
    left: np.ndarray  # slots a moved board left and no other board came to: they hold no board now
    # slots whose board before, displaced and read nowhere else, has its state set aside (parked)
    # by (node, board) before the change: a renumbering read in pieces, or with a board unread one
    # poll, finds it there when the board is read again (the missing GPU back, too)
    parked: np.ndarray = np.empty(0, dtype=np.int64)
    # slots whose new board was held nowhere but parked on their node: they take its parked state
    unparked: np.ndarray = np.empty(0, dtype=np.int64)
    # (node, board) of parked states given up at this change (the oldest past a node's GPU count,
    # or parked longer than ``PARK_FOR_S``)
    dropped: tuple[tuple[int, float], ...] = ()

    @property
    def moved(self) -> np.ndarray:
        """Per slot of the change, whether its board moved there from another slot of its node,
        now or, parked, before."""
        return (self.came_from >= 0) | np.isin(self.slots, self.unparked)

    @property
    def replaced(self) -> np.ndarray:
        """Per slot of the change, whether a new board took another's place (an RMA): counted and
        logged as a swap, as before boards were followed."""
        return ~self.moved & np.isfinite(self.old)

    def park_keys(self, topology: Topology) -> list[tuple[int, tuple[int, float]]]:
        """Per slot whose board's state is parked at this change: (slot, (node, its board before))."""
        return self._keys(topology, self.parked, self.old)

    def unpark_keys(self, topology: Topology) -> list[tuple[int, tuple[int, float]]]:
        """Per slot taking a parked state at this change: (slot, (node, its board now))."""
        return self._keys(topology, self.unparked, self.new)

    def _keys(self, topology: Topology, which: np.ndarray, boards: np.ndarray) -> list[tuple[int, tuple[int, float]]]:
        at = np.flatnonzero(np.isin(self.slots, which))
        return [(slot, (int(topology.gpu_node[slot]), board))
                for slot, board in zip(self.slots[at].tolist(), boards[at].tolist())]

    def take_from(self, n_gpus: int) -> np.ndarray:
        """Per GPU slot of the topology, the slot whose state it takes (itself where nothing
        changes; -1: none, it starts afresh): :meth:`Remap.rearranged`'s ``gpu_from``."""
        take = np.arange(n_gpus, dtype=np.int64)
        take[self.slots] = self.came_from
        take[self.left] = -1
        return take

    def moves_by_node(self, topology: Topology) -> dict[int, list[tuple[int, int]]]:
        """Per node, the boards that moved in it: (slot before, slot now), by slot now."""
        out: dict[int, list[tuple[int, int]]] = {}
        for slot, source in sorted(zip(self.slots.tolist(), self.came_from.tolist())):
            if source >= 0:
                out.setdefault(int(topology.gpu_node[slot]), []).append((source, slot))
        return out


REASONS = ("unknown_entity", "bad_timestamp", "duplicate_timestamp", "out_of_order", "future_timestamp",
           "near_duplicate_timestamp")


@jit
def _guard_kernel(ts: np.ndarray, slot: np.ndarray, last_ts: np.ndarray, counts: np.ndarray,
                  latest: float, earliest: float, min_spacing: float, closest: np.ndarray) -> np.ndarray:
    """Which rows to keep; counts each row refused under its reason (``counts``, in the order of
    :data:`REASONS`) and notes in ``closest[0]`` the least spacing of a near duplicate (for the log
    line). ``last_ts``: per slot, its last kept stamp, advanced in place."""
    keep = np.zeros(len(ts), dtype=np.bool_)
    n_slots = len(last_ts)
    for i in range(len(ts)):
        s = slot[i]
        t = ts[i]
        if s < 0 or s >= n_slots:
            counts[0] += 1
        elif not np.isfinite(t) or t < earliest:
            counts[1] += 1
        elif t > latest:
            counts[4] += 1
        elif t == last_ts[s]:
            counts[2] += 1
        elif t < last_ts[s]:
            counts[3] += 1
        elif t - last_ts[s] < min_spacing:  # (-inf: an entity's first row is never one)
            counts[5] += 1
            closest[0] = min(closest[0], t - last_ts[s])
        else:
            last_ts[s] = t
            keep[i] = True
    return keep


@jit
def _scan_columns(columns: tuple[np.ndarray, ...], rows: int, lo: np.ndarray, hi: np.ndarray, whole: np.ndarray,
                  out_of_range: np.ndarray, not_whole: np.ndarray, slot: np.ndarray, field: np.ndarray,
                  reported: np.ndarray, unreported: np.ndarray, row_flags: np.ndarray) -> tuple[int, int]:
    """Over a tuple of equal-length float64 columns, in place: sets infinities, finite values
    outside ``[lo[c], hi[c]]``, and values that are not whole numbers in a column where ``whole[c]``,
    to NaN (counting the latter two per column in ``out_of_range`` and ``not_whole``).
    Returns (rows with a gap, rows with an infinity): samples, as ``foreshock_samples_processed_total``
    counts them, so that the two divide (ForeshockInputProblems' "1 % of the samples"); until
    2026-12-06 each value was counted, and a dropped scrape's row of a dozen NaN fields was a dozen
    problems. ``row_flags`` (zeros, one per row) is the kernel's scratch: bit 0 a gap, bit 1 an
    infinity. Gaps are the NaN (not infinities: counted as those alone; until 2026-12-06 an infinity
    was counted twice, as inf_values and as missing_values) where the row's entity gave a value of that
    field before: ``reported[field[c], slot]``, set here by every value inside the range, with
    ``unreported[field]`` counting the entities not yet seen: once every entity of the kind has
    reported a field, its column is scanned without writing. (Until ``reported`` was kept, a column
    NaN in every row was taken for a field the source does not report, which also hid the one GPU
    of a frame whose sensor went dark.)"""
    found = 0  # whether any row has a flag: a clean frame skips the counting pass
    c = 0
    for column in columns:
        low = lo[c]
        high = hi[c]
        f = field[c]
        seen = reported[f]
        learning = unreported[f] > 0
        whole_column = whole[c]
        for i in range(rows):
            v = column[i]
            if low <= v <= high:  # the usual case, one test: bounds are finite, so NaN and ±inf fail it
                if whole_column and v != np.floor(v):
                    column[i] = np.nan
                    not_whole[c] += 1
                    continue
                if learning and not seen[slot[i]]:
                    seen[slot[i]] = True
                    unreported[f] -= 1
                continue
            if v != v:
                if seen[slot[i]]:
                    row_flags[i] |= 1
                    found = 1
            elif v == np.inf or v == -np.inf:
                column[i] = np.nan
                row_flags[i] |= 2  # an infinity, not a gap (it was read: counted once, as inf_values)
                found = 1
            else:
                column[i] = np.nan
                out_of_range[c] += 1
        c += 1
    gaps = 0
    infs = 0
    if found:
        for i in range(rows):
            gaps += row_flags[i] & 1
            infs += row_flags[i] >> 1
    return gaps, infs


@jit
def _scrub_board_ids(ids: np.ndarray) -> int:
    """Sets to NaN, in place, each ``board_id`` that no UUID is carried as (not a whole number
    in 1 .. 2**52 - 1: negative, fractional, infinite, zero), and returns how many. NaN (not
    read) stays. Zero is refused too: a UUID's number is zero with odds of 2**-52, a source or a
    file filling a cell it did not read with zero is far likelier, and a refused board is only
    one not followed."""
    bad = 0
    for i in range(len(ids)):
        v = ids[i]
        if v != v:
            continue
        if not (1.0 <= v < BOARD_ID_LIMIT) or v != np.floor(v):
            ids[i] = np.nan
            bad += 1
    return bad


def valid_board_ids(ids: np.ndarray) -> np.ndarray:
    """Per value of ``ids``, whether it is a board's number (:func:`foreshock.boards.board_id`: a
    whole number in 1 .. 2**52 - 1) or NaN (not read); the guard sets every other to NaN."""
    ids = np.asarray(ids, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.isnan(ids) | ((ids >= 1.0) & (ids < BOARD_ID_LIMIT) & (ids == np.floor(ids)))  # type: ignore[no-any-return]


@lru_cache(maxsize=256)
def _field_positions(kind: str, names: tuple[str, ...]) -> np.ndarray:
    """Where each of ``names`` sits in ``field_names(kind)``: the row of ``InputGuard.s_reported``."""
    index = {name: i for i, name in enumerate(field_names(kind))}
    positions = np.array([index[name] for name in names], dtype=np.int64)
    positions.flags.writeable = False  # cached: shared by every caller
    return positions


def _unreported(reported: np.ndarray) -> np.ndarray:
    """Per field, how many entities have not reported it yet."""
    return (reported.shape[1] - reported.sum(axis=1)).astype(np.int64)


def kernel_column(column: np.ndarray) -> np.ndarray:
    """The column itself when it is a writable C-contiguous float64 array (a ``Frame``'s columns
    are), else such a copy: a tuple of columns passed to a kernel must be of one Numba type."""
    if column.dtype == np.float64 and column.flags.c_contiguous and column.flags.writeable:
        return column
    return np.array(column, dtype=np.float64)


class InputGuard:
    """Keeps per-entity last timestamps; :meth:`check` returns the clean part of a frame.

    ``max_ahead_s``: refuse rows stamped further ahead of ``clock()`` (``future_timestamp``);
    None (or infinite): no wall-clock limit (a replay or a simulation runs ahead of the wall clock
    by design), but rows further than :data:`MAX_AHEAD_S` ahead of the stream's own present
    are refused (:meth:`stream_present`).

    :attr:`stream_anchor`: a stamp the stream is known to hold, where its source knows one before
    the first frame (a replay: its recording's :attr:`~foreshock.recording.Recording.stream_anchor`);
    rows stamped more than :data:`MAX_BEHIND_S` before it are refused (``bad_timestamp``). Set by
    the caller before the first frame; not kept with the state (a replay is not resumed).

    ``min_spacing_s``: a row newer than its entity's previous kept row by less is refused
    (``near_duplicate_timestamp``; :data:`MIN_SPACING_S`). A setting, not state: a checkpoint holds
    the last kept stamps it is measured from, as before."""

    def __init__(self, topology: Topology, health: PipelineHealth, stage: str = "guard",
                 max_ahead_s: float | None = None, clock: Callable[[], float] = time.time,
                 min_spacing_s: float = MIN_SPACING_S) -> None:
        if not 0.0 <= min_spacing_s < np.inf:
            raise ValueError(f"min_spacing_s must be a finite number of seconds >= 0, got {min_spacing_s!r}")
        self.health = health
        self.stage = stage
        self.max_ahead_s = max_ahead_s
        self.clock = clock
        self.min_spacing_s = float(min_spacing_s)
        kinds = ("gpu", "link", "optic", "node", "rack", "job")
        self.s_last_ts = {kind: np.full(topology.size(kind), -np.inf) for kind in kinds}
        # (field, slot): has this entity ever given a valid value of this field? Field-major, so
        # the kernel walks one contiguous row per column.
        self.s_reported = {kind: np.zeros((len(field_names(kind)), topology.size(kind)), dtype=np.bool_)
                           for kind in kinds}
        self._unreported = {kind: _unreported(seen) for kind, seen in self.s_reported.items()}
        # per GPU slot, the board_id last read there (NaN: none yet)
        self.s_board = np.full(topology.size("gpu"), np.nan)
        # per node, the boards displaced from its slots and read nowhere since, whose state is
        # parked (``BoardSwap.parked``): board -> when parked, oldest first. Kept with the state,
        # as the bank keeps their rows: the missing GPU back after a worker's restart finds it
        self._parked: dict[int, dict[float, float]] = {}
        self._gpus_of_node = np.bincount(topology.gpu_node, minlength=topology.size("node"))
        self.topology = topology  # its job list: saved with the state, found again on load
        # per kind, the newest lower median stamp of its frames (:meth:`stream_present`); kept only
        # where no wall clock bounds the rows (-inf: none yet, or a live guard)
        self.s_stream_clock = dict.fromkeys(kinds, -np.inf)
        # a stamp the stream holds, as its source knows before the first frame (-inf: none known):
        # rows far before it were stamped by a clock not set. Known beforehand, not learnt from
        # the frames: a kind's first frame may be those rows (a whole GPU tick stamped 1970 comes
        # first in a replay), and a frame can move the stream's present by years (one in ms)
        self.stream_anchor = -np.inf

    def check(self, frame: Frame) -> Frame:
        if len(frame) == 0:
            return frame
        counts = np.zeros(len(REASONS), dtype=np.int64)
        latest, present = self._latest(frame)
        earliest = self.stream_anchor - MAX_BEHIND_S
        closest = np.full(1, np.inf)
        # (less the stamps' rounding: a poll every 10 ms, stamped at 1.7e9 s, is 9.9999 ms apart at times)
        spacing = max(0.0, self.min_spacing_s - SPACING_ROUNDING_S)
        keep = _guard_kernel(frame.ts, frame.slot, self.s_last_ts[frame.kind], counts, latest, earliest,
                             spacing, closest)
        dropped = bool(counts.any())  # every row is either counted here or kept
        if dropped:
            for reason, n in zip(REASONS, counts):
                if n:
                    self.health.problem(self.stage, reason, int(n),
                                        detail=self._detail(frame, reason, present, earliest, float(closest[0])))
        out = frame.take(keep) if dropped else frame
        if len(out) == 0 or not out.columns:
            return out
        # One kernel pass over the columns themselves, in place (no (fields, rows) copy: on the
        # small per-partition pieces a Kafka worker sees, copies and per-field numpy calls cost
        # more than the scan). The kernel needs writable C-contiguous float64 arrays; a frame's
        # columns are (``Frame`` makes them so), any other is replaced by such a copy.
        columns = out.columns
        for name, column in columns.items():
            columns[name] = kernel_column(column)
        if "board_id" in columns:
            bad_boards = _scrub_board_ids(columns["board_id"])
            if bad_boards:
                self.health.problem(self.stage, "out_of_range: board_id", bad_boards,
                                    detail=f"{frame.kind} frame; not a board's number (a UUID is carried as a "
                                           f"whole number 1..2^52-1), set to NaN (not read)")
        # every field but board_id, which names the board rather than measures it: a UUID not read
        # one poll is counted by its source already, not again as a sensor going dark
        scanned = {name: column for name, column in columns.items() if name != "board_id"}
        names = tuple(scanned)
        lo, hi = valid_bounds(frame.kind, names)
        outside = np.zeros(len(names), dtype=np.int64)
        fractional = np.zeros(len(names), dtype=np.int64)
        fields = _field_positions(frame.kind, names)
        gaps, infs = _scan_columns(tuple(scanned.values()), len(out), lo, hi, whole_only(frame.kind, names), outside,
                                   fractional, out.slot, fields, self.s_reported[frame.kind],
                                   self._unreported[frame.kind], np.zeros(len(out), dtype=np.uint8))
        for c in np.flatnonzero(outside):
            self.health.problem(self.stage, f"out_of_range: {names[c]}", int(outside[c]),
                                detail=f"{frame.kind} frame; outside {lo[c]:g}..{hi[c]:g} {get_field(names[c]).unit}, "
                                       "set to NaN")
        for c in np.flatnonzero(fractional):
            self.health.problem(self.stage, f"not_whole: {names[c]}", int(fractional[c]),
                                detail=f"{frame.kind} frame; a {get_field(names[c]).unit} is a whole number, "
                                       "set to NaN")
        if infs:
            self.health.problem(self.stage, "inf_values", int(infs),
                                detail=f"{frame.kind} frame; set to NaN (counted per sample)")
        # NaN is the contract's "missing". A field absent from the frame, or one its entity has
        # never given a value of, is simply not reported by this source; a NaN where the entity
        # gave a value before is counted, so a sensor going dark is visible.
        if gaps:
            self.health.problem(self.stage, "missing_values", int(gaps),
                                detail=f"{frame.kind} frame (counted per sample, however many of its fields)")
        return out

    def _latest(self, frame: Frame) -> tuple[float, float]:
        """The latest stamp ``frame``'s rows may carry, and the stream's present it is set from (NaN:
        the wall clock's). The wall clock alone where it is given (live): it bounds a whole frame
        stamped ahead, and a one-row piece, which the stream's present cannot; and a live guard's
        checkpoint stays one that code from before the stream's present reads."""
        if self.max_ahead_s is not None and np.isfinite(self.max_ahead_s):
            return self.clock() + self.max_ahead_s, np.nan
        present = self.stream_present(frame)
        return (present + MAX_AHEAD_S if np.isfinite(present) else np.inf), present

    def stream_present(self, frame: Frame) -> float:
        """The present of ``frame``'s stream, where no wall clock bounds its rows: the newest lower
        median stamp of its kind's frames, this one's included (kept as the kind's clock). A few
        stray rows (a GPU's row stamped in 2100, or in milliseconds) cannot move the lower median
        of a frame of many, so they lie ahead of it and are refused (:data:`MAX_AHEAD_S`),
        while a whole frame stamped hours ahead (a recording's gap) moves it and is taken. The
        kind's clock only widens the limit: rows of a frame whose median lags (most of its rows
        late) are no further ahead of the stream than its newest frames.

        Not caught: a stray that is (most of) its frame's rows, a frame of one row above all (a
        Kafka worker's per-partition piece of one entity), which moves the present itself, and,
        being kept as the kind's clock, widens the limit of that kind's later frames for as long.
        Per kind, so that such a frame of a kind sending few rows (jobs, racks) does not widen the
        GPUs' limit. A frame whose rows span more than twice the limit (a window of an hour) would
        have its latest rows refused: the recordings, the simulator and the agents give a sampling
        interval's rows per frame.

        Rows stamped more than :data:`MAX_BEHIND_S` before :attr:`stream_anchor` (refused,
        ``bad_timestamp``) are not the stream's present: a capture's first row, stamped 1.0 by a
        clock not set, and its next row made a replay's first frame, whose lower median (the older
        of two) was 1.0, and that next row was refused as 57 years ahead."""
        clock = self.s_stream_clock[frame.kind]
        ts = frame.ts if self.stream_anchor == -np.inf else frame.ts[frame.ts >= self.stream_anchor - MAX_BEHIND_S]
        median = median_stamp(ts)
        if median is None:
            return clock
        if median > clock:
            self.s_stream_clock[frame.kind] = clock = median
        return clock

    def board_change(self, frame: Frame) -> BoardChange | None:
        """When a GPU frame the guard let through (:meth:`check`'s result) first reads another
        board in a slot than the one last read there: ``(ts, slots, old, new)``, the earliest time
        of such a row and every slot whose board changes at that time, with the boards before and
        after (which are noted as the slots' boards now). None when no board changes. A slot's
        first board is no change, unless another slot of its node holds it (it moved there, old
        NaN: :meth:`follow_boards`); a NaN ``board_id`` (not read) is none either.

        The caller processes the rows stamped before ``ts``, starts those slots afresh, and asks
        again with the rest: a frame holding a slot's old board and its new one (a worker catching
        up) is split where the board changes, by time, so a tick stays whole, in whatever order the
        frame lists its slots (the guard keeps only each slot's own rows in time order)."""
        ids = frame.columns.get("board_id")
        if ids is None or frame.kind != "gpu" or not len(frame):
            return None
        read = np.isfinite(ids)
        if not read.any():  # not read (sources with reads_boards off; recordings made before boards)
            return None
        slot = frame.slot
        known = self.s_board[slot]
        first = read & np.isnan(known)
        if first.any():
            rows = np.flatnonzero(first)
            # a board held by another slot of its node that no longer reads it, or parked on the
            # node, has moved here (its node's GPUs were renumbered): a change, not a first board.
            # Only slots holding no board read first boards: a worker's first frames, and the
            # slots a moved board left
            moved = self._moved_here(frame, rows)
            rows = rows[~moved][::-1]  # reversed: where a slot's first rows disagree, the first row's wins
            self.s_board[slot[rows]] = ids[rows]
            known = self.s_board[slot]
        changed = read & (ids != known)  # NaN known: a board moved here from another slot (above)
        if not changed.any():
            return None
        when = float(frame.ts[changed].min())
        at = np.flatnonzero(changed & (frame.ts == when))
        at = np.concatenate([at, self._same_renumbering(frame, changed, at, when)])
        at = at[np.argsort(slot[at], kind="stable")]
        slots, old, new = slot[at].astype(np.int64), known[at], ids[at]
        self.s_board[slots] = new
        return when, slots, old, new

    def split_by_board(self, frame: Frame) -> Iterator[tuple[Frame, BoardSwap | None]]:
        """``frame`` (:meth:`check`'s result) cut where a GPU's board changes (:meth:`board_change`):
        ``(rows, swap)`` for the rows stamped before each change (none: an empty frame) and the
        change with where each new board came from (:meth:`follow_boards`), then ``(the rest,
        None)``. The caller processes each part's rows, then, for a swap, moves the moved boards'
        state and starts the others' slots afresh before the next part: the embedded pipeline and
        the evaluation, alike. Each swap's new boards and moved ones are counted here
        (``foreshock_gpus_replaced_total``, ``foreshock_gpus_moved_total``, the guard's stage).

        Each change comes later than the one before (every part after the first holds a row), so
        a frame is cut at most once per time stamp in it. A change no later than the one before
        would mean boards moving back and forth for ever (a fault of this logic: a board read in
        two slots of its node at once did so until 2026-12-02): it is handled, counted
        (``board_changes_unsettled``) and the rest of the frame processed as it is."""
        rest = frame
        previous = -np.inf
        while (change := self.board_change(rest)) is not None:
            when = change[0]
            before = rest.ts < when
            after = rest.take(~before)
            swap = self.follow_boards(change, after)
            # counted here, for every caller alike (the embedded pipeline, the evaluation)
            if swap.replaced.any():
                self.health.gpu_replaced(self.stage, int(swap.replaced.sum()))
            if swap.moved.any():
                self.health.gpu_moved(self.stage, int(swap.moved.sum()))
            yield rest.take(before), swap
            rest = after
            if when <= previous:
                self.health.problem(self.stage, "board_changes_unsettled", 1,
                                    detail=f"gpu frame: boards changing again at {when:.3f} (slots "
                                           f"{change[1].tolist()[:8]}); its last {len(rest)} rows processed "
                                           "as they are")
                break
            previous = when
        yield rest, None

    def follow_boards(self, change: BoardChange, rest: Frame | None = None) -> BoardSwap:
        """``change`` (:meth:`board_change`'s, just returned) with, per slot, the slot of the same
        node its new board was last read in: a board moved by a renumbering of its node's GPUs
        (one missing at a reboot shifts every later index down one; back, up one). A slot whose
        board moved away and to which no board came now holds none (NaN): the next board read
        there is a first one, or, if it is held by another slot of the node, moved back. A board
        of another node, or held nowhere, is a new board (an RMA).

        ``rest``: the frame's rows from the change on. A holder whose own next row there still
        reads the board has not let it go: the other slot reading it too is a source's fault (one
        bad row), and reads a new board; its state moving there and back was the endless loop of
        :meth:`split_by_board` until 2026-12-02.

        A board displaced from its slot and read nowhere else (the slot it moves to, if any, is
        not read yet: a renumbering cut into pieces by row order, or a UUID not read one poll;
        or an RMA) has its state parked by (node, board) (``BoardSwap.parked``); a board held
        nowhere but parked on its node takes it back when it is read (``BoardSwap.unparked``):
        a move, not a new board. A node parks at most as many boards as it has GPUs (the oldest
        goes), each for :data:`PARK_FOR_S` of telemetry time (``BoardSwap.dropped``).

        Per change, not per frame: vectorised over the slots, so that a change of every board at
        once (a source that numbers boards anew) costs milliseconds."""
        when, slots, old, new = change
        before = self.s_board.copy()
        before[slots] = old  # the boards as they were read before ``when``
        node = self.topology.gpu_node
        held = self._holders(before, new)
        came_from = np.array([held.get((int(node[s]), b), -1) for s, b in zip(slots.tolist(), new.tolist())],
                             dtype=np.int64)
        if rest is not None and (came_from >= 0).any():
            moving = np.flatnonzero(came_from >= 0)
            still = self._still_holds(rest, came_from[moving], new[moving], slots[moving], np.full(len(moving), when))
            came_from[moving[still]] = -1  # its holder still reads it: a new board here, not a move
        # a board read in two slots at once (a source's fault): its state goes to the first only
        sources, first = np.unique(came_from, return_index=True)
        twice = np.ones(len(came_from), dtype=bool)
        twice[first] = False
        came_from[twice & (came_from >= 0)] = -1
        sources = sources[sources >= 0]
        left = np.setdiff1d(sources, slots).astype(np.int64)
        self.s_board[left] = np.nan
        dropped = self._expire_parked(when)
        unparked = self._unpark(slots[came_from < 0], new[came_from < 0])
        parked, evicted = self._park_displaced(when, slots, old, sources)
        return BoardSwap(when, slots, old, new, came_from, left, parked, unparked, dropped + evicted)

    @property
    def parked(self) -> dict[tuple[int, float], float]:
        """The boards whose state is parked: (node, board) -> when parked (telemetry time)."""
        return {(n, b): ts for n, boards in self._parked.items() for b, ts in boards.items()}

    def _holders(self, board_of_slot: np.ndarray, boards: np.ndarray) -> dict[tuple[int, float], int]:
        """(node, board) -> the slot holding it in ``board_of_slot`` (a board per GPU slot), over the
        slots holding one of ``boards`` only: few, but for a mass change."""
        node = self.topology.gpu_node
        holders = np.flatnonzero(np.isin(board_of_slot, boards))
        return {(int(node[s]), b): int(s) for s, b in zip(holders.tolist(), board_of_slot[holders].tolist())}

    def _parked_boards(self) -> list[float]:
        """The boards parked on any node."""
        return [b for parked in self._parked.values() for b in parked]

    def _unpark(self, slots: np.ndarray, boards: np.ndarray) -> np.ndarray:
        """Of ``slots`` reading ``boards`` held nowhere on their node, those whose board is parked
        on their node: taken out of the parking, they take its state (``BoardSwap.unparked``)."""
        if not self._parked or not len(slots):
            return np.empty(0, dtype=np.int64)
        node = self.topology.gpu_node
        maybe = np.flatnonzero(np.isin(boards, self._parked_boards()))
        out = [int(slots[i]) for i in maybe.tolist()
               if self._parked.get(int(node[slots[i]]), {}).pop(float(boards[i]), None) is not None]
        return np.array(out, dtype=np.int64)

    def _park_displaced(self, when: float, slots: np.ndarray, old: np.ndarray,
                        sources: np.ndarray) -> tuple[np.ndarray, tuple[tuple[int, float], ...]]:
        """Park the boards displaced at ``when`` from ``slots`` (their boards before, ``old``) that
        moved nowhere (their slot is none of ``sources``) and that no other slot of their node
        holds now (read twice, the other slot's state is the board's): the slots whose state is
        to be parked, and the (node, board) given up to make room on their node, oldest first."""
        displaced = np.flatnonzero(np.isfinite(old) & ~np.isin(slots, sources))
        if not len(displaced):
            return np.empty(0, dtype=np.int64), ()
        node = self.topology.gpu_node
        held = self._holders(self.s_board, old[displaced])
        parked: list[int] = []
        evicted: list[tuple[int, float]] = []
        for slot, board in zip(slots[displaced].tolist(), old[displaced].tolist()):
            n = int(node[slot])
            if (n, board) in held:
                continue
            boards = self._parked.setdefault(n, {})
            while len(boards) >= self._gpus_of_node[n]:  # the oldest goes: memory stays bounded
                oldest = next(iter(boards))
                del boards[oldest]
                evicted.append((n, oldest))
            boards[board] = when
            parked.append(slot)
        return np.array(parked, dtype=np.int64), tuple(evicted)

    def _expire_parked(self, now: float) -> tuple[tuple[int, float], ...]:
        """Give up the states parked longer than :data:`PARK_FOR_S` before ``now``: their (node, board)."""
        expired = [(n, b) for n, boards in self._parked.items() for b, ts in boards.items() if now - ts > PARK_FOR_S]
        for n, b in expired:
            del self._parked[n][b]
        return tuple(expired)

    @classmethod
    def _still_holds(cls, frame: Frame, holders: np.ndarray, boards: np.ndarray, readers: np.ndarray,
                     since: np.ndarray) -> np.ndarray:
        """Per i, whether ``holders[i]`` still reads ``boards[i]`` in the poll where ``readers[i]``
        read it at ``since[i]``: the holder's first row from then on reads the board, before the
        reader's next row (a source's fault: one board read at two indices at once). A holder
        reading the board only in a later poll of a catch-up frame has it back from the reader
        (a GPU missing for a poll or two, then back): the board did move (review h27: a worker
        catching up counted such a renumbering as a replacement, and dropped the board's state)."""
        read, at = cls._next_reads(frame, holders, since)
        _, reader_next = cls._next_reads(frame, readers, np.nextafter(since, np.inf))
        return (read == boards) & (at < reader_next)  # type: ignore[no-any-return]

    @staticmethod
    def _next_reads(frame: Frame, slots: np.ndarray, since: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per ``(slots[i], since[i])``, the ``board_id`` that the slot's first row of ``frame``
        stamped ``since[i]`` or later reads (NaN: no such row, or not read), and that row's time
        (inf: none)."""
        out = np.full(len(slots), np.nan)
        when = np.full(len(slots), np.inf)
        if not len(slots) or not len(frame):
            return out, when
        # one sorted key per row, (slot, rank of its time): the row sought is the first at or after
        # (slot, rank of the first time at or after ``since``), if it is still the slot's
        times, rank = np.unique(frame.ts, return_inverse=True)
        width = len(times) + 1
        key = frame.slot.astype(np.int64) * width + rank
        order = np.argsort(key, kind="stable")
        slots = np.asarray(slots, dtype=np.int64)
        pos = np.searchsorted(key[order], slots * width + np.searchsorted(times, since))
        found = pos < len(order)
        found[found] = frame.slot[order[pos[found]]] == slots[found]
        out[found] = frame.columns["board_id"][order[pos[found]]]
        when[found] = frame.ts[order[pos[found]]]
        return out, when

    def _moved_here(self, frame: Frame, rows: np.ndarray) -> np.ndarray:
        """Per row of ``rows`` (each a first board read in its slot), whether its board moved
        there: another slot of its node holds it and that slot's own next row from then on does
        not still read it (:meth:`follow_boards`), or it is parked on the node."""
        slots, boards = frame.slot[rows], frame.columns["board_id"][rows]
        node = self.topology.gpu_node
        moved = np.zeros(len(rows), dtype=bool)
        found = np.flatnonzero(np.isin(boards, self.s_board))
        if len(found):
            held = self._holders(self.s_board, boards[found])
            holder = np.array([held.get((int(node[slots[i]]), float(boards[i])), -1) for i in found.tolist()],
                              dtype=np.int64)
            found, holder = found[holder >= 0], holder[holder >= 0]
            still = self._still_holds(frame, holder, boards[found], slots[found], frame.ts[rows[found]])
            moved[found[~still]] = True
        if self._parked:
            maybe = np.flatnonzero(~moved & np.isin(boards, self._parked_boards()))
            for i in maybe.tolist():
                moved[i] = float(boards[i]) in self._parked.get(int(node[slots[i]]), {})
        return moved

    def _same_renumbering(self, frame: Frame, changed: np.ndarray, at: np.ndarray, when: float) -> np.ndarray:
        """The rows, after ``when``, of the other board changes on the nodes of those at ``when``
        (rows ``at``) that belong with them: each the first row from ``when`` on of its slot. A
        node's GPUs stamped each with its own sample time (DCGM series a few ms apart) are read
        renumbered at once, but their changes would come one at a time, and a board read back in
        the slot it had left (the missing GPU back: 4 takes 3's board at t, 3 a new one at t - 1
        ms) would find its state gone with the board the new one displaced. No row of such a slot
        lies between ``when`` and its change, so its detectors see the same rows either way."""
        node = self.topology.gpu_node
        later = np.flatnonzero(changed & (frame.ts > when))
        if not len(later):
            return later
        slot = frame.slot
        later = later[np.isin(node[slot[later]], node[slot[at]]) & ~np.isin(slot[later], slot[at])]
        if not len(later):
            return later
        # per slot of those, its first row from ``when`` on: the change only if that row is it
        since = np.flatnonzero((frame.ts >= when) & np.isin(slot, slot[later]))
        since = since[np.lexsort((frame.ts[since], slot[since]))]
        first = since[np.r_[True, slot[since][1:] != slot[since][:-1]]]
        return first[changed[first]]

    def _detail(self, frame: Frame, reason: str, present: float, earliest: float = -np.inf,
                closest: float = np.inf) -> str:
        """What is logged, once, for the rows of ``frame`` set aside for ``reason``; ``present``:
        the stream's present the frame was held to (:meth:`stream_present`; NaN: the wall clock);
        ``earliest``: the earliest stamp it was held to (:attr:`stream_anchor`); ``closest``: the
        least spacing of a near duplicate after its entity's previous row."""
        if reason == "out_of_order":
            return self._behind(frame)
        if reason == "near_duplicate_timestamp":
            return (f"{frame.kind} frame, rows as little as {closest * 1e3:.3g} ms after their entity's previous one "
                    f"(minimum spacing {self.min_spacing_s * 1e3:g} ms; no device samples an entity faster than "
                    "100 ms, nor foreshock's sources faster than 20 ms): the same sample sent again with a fresh "
                    "stamp (a source emitting it twice, an agent retrying a send, overlapping captures replayed); "
                    "refused, or its anomalies had counted twice")
        if reason == "bad_timestamp" and (early := frame.ts < earliest).any():
            years = (self.stream_anchor - float(frame.ts[early].min())) / (365.25 * 86400)
            return (f"{frame.kind} frame, rows stamped up to {years:,.0f} years before the stream's other rows (limit "
                    f"{MAX_BEHIND_S / (365.25 * 86400):g} years): stamped by a clock not set (epoch zero, an agent "
                    "started before NTP); refused, or such a row had been its entity's first sample and the run's "
                    "start (NaN or infinite stamps, if any, are counted here too)")
        if reason != "future_timestamp":
            return f"{frame.kind} frame"
        newest = float(np.max(frame.ts[np.isfinite(frame.ts)]))
        if np.isnan(present):
            return (f"{frame.kind} frame up to {newest - self.clock():.0f} s ahead of this host's clock (limit "
                    f"{self.max_ahead_s:g} s): the sending host's clock is wrong (NTP), or its source runs faster "
                    "than real time")
        return (f"{frame.kind} frame, rows up to {newest - present:.0f} s ahead of the stream's present (the "
                f"newest median stamp of its frames; limit {MAX_AHEAD_S:g} s, no wall clock in this run): "
                "stamped by a wrong clock (a year off, or in another unit); refused, or every later row of their "
                "entity would have been refused as out of order")

    def _behind(self, frame: Frame) -> str:
        """How far behind their entities' newest rows the out-of-order rows are (after the
        kernel: the newest kept row of the frame included), and what that usually means: the one
        line logged for a clock stepped back an hour said only "gpu frame"."""
        last = self.s_last_ts[frame.kind]
        known = (frame.slot >= 0) & (frame.slot < len(last))
        with np.errstate(invalid="ignore"):  # (inf - inf: a stamp of inf against one never read; dropped below)
            behind = last[frame.slot[known]] - frame.ts[known]
        behind = behind[np.isfinite(behind) & (behind > 0)]
        most = float(behind.max()) if len(behind) else 0.0
        return (f"{frame.kind} frame, rows up to {most:.0f} s older than their entity's newest: its source's "
                "clock was stepped back (NTP), or old rows were sent again; they are refused until its rows are "
                "newer again")

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {k: v.copy() for k, v in self.s_last_ts.items()}
        state.update({f"{k}{_REPORTED}": v.copy() for k, v in self.s_reported.items()})
        state[_JOBS] = list(self.topology.job_keys())
        state[_BOARDS] = self.s_board.copy()
        # (node, board, when parked) per row, each node's oldest first; only where a board is
        # parked: code from before parking reads the key as an entity kind and refuses the whole
        # checkpoint (review h27: every partition of a worker rolled back started fresh)
        parked = [(n, b, ts) for n, boards in self._parked.items() for b, ts in boards.items()]
        if parked:
            state[_PARKED] = np.array(parked, dtype=np.float64).reshape(-1, 3)
        # likewise only where the stream's present is kept (no wall clock): a live worker's
        # checkpoint stays one that code from before it reads
        clocks = {kind: t for kind, t in self.s_stream_clock.items() if np.isfinite(t)}
        if clocks:
            state[_STREAM_CLOCK] = clocks
        return state

    def load_state_dict(self, state: dict[str, Any], remap: Remap | None = None) -> None:
        """Restore a saved state; ValueError where it numbers the hardware otherwise.

        ``remap``: the state was saved under other hardware; each entity's last timestamp and
        reported fields follow it by name, and new entities start fresh (``core/remap.py``).
        Jobs are found again by name and nodes (``Topology.job_slot_map``): a worker restarted
        with a new job list keeps what it knew of the jobs still listed, and starts the new ones
        fresh (their rows had been refused as unknown entities while the saved, shorter arrays
        lasted). A state without the reported fields (a checkpoint from before they were kept)
        leaves them empty: gaps count again once each entity has given a value; one without the
        boards (before 2026-12-02) knows none: each GPU's next board is its first. The parked
        boards are kept only where the hardware is the same (no ``remap``): the bank drops their
        rows on a move, so a parked board read again there starts afresh. The stream's present
        (:meth:`stream_present`) is kept with any hardware; a state without it (saved live, or
        before it was kept) starts it afresh, from the next frame of each kind."""
        saved_jobs = state.get(_JOBS)
        boards = np.full(self.topology.size("gpu"), np.nan)
        if _BOARDS in state:
            saved = np.asarray(state[_BOARDS], dtype=np.float64)
            boards = remap.rows("gpu", saved, boards) if remap is not None else saved.copy()
            if boards.shape != self.s_board.shape:
                raise ValueError(f"guard: state {_BOARDS!r} has shape {boards.shape}, expected {self.s_board.shape}")
        for k, v in state.items():
            if k in (_JOBS, _BOARDS, _PARKED, _STREAM_CLOCK):
                continue
            reported = k.endswith(_REPORTED)
            kind = k.removesuffix(_REPORTED)
            own = self.s_reported[kind] if reported else self.s_last_ts[kind]
            arr = np.asarray(v, dtype=own.dtype)
            if reported and arr.ndim == 2 and arr.shape[0] < own.shape[0]:
                # saved before fields of its kind were appended to fields.csv (max_op_temp and
                # hbm_max_op_temp, 2026-12-01): those are not reported yet. Until then such a
                # checkpoint was refused, and every Kafka partition started fresh at the upgrade
                arr = np.concatenate([arr, np.zeros((own.shape[0] - arr.shape[0], arr.shape[1]), dtype=own.dtype)])
            if remap is not None and kind in HARDWARE_KINDS:
                arr = remap.rows(kind, arr, own, axis=1 if reported else 0)
            if kind == "job" and saved_jobs is not None:
                arr = take_rows(arr, own, saved_slots(self.topology.job_slot_map(saved_jobs), own.shape[-1]), axis=-1)
            elif kind == "job" and arr.shape != own.shape:
                arr = own.copy()  # an old state of another length, without its job list: the jobs start fresh
            if arr.shape != own.shape:
                raise ValueError(f"guard: state {k!r} has shape {arr.shape}, expected {own.shape}")
            if reported:
                self.s_reported[kind] = arr.copy()
                self._unreported[kind] = _unreported(self.s_reported[kind])
            else:
                self.s_last_ts[kind] = arr.copy()
        self.s_board = boards
        self._parked = {}
        parked = np.asarray(state.get(_PARKED, np.empty((0, 3))), dtype=np.float64).reshape(-1, 3)
        for n, b, ts in parked.tolist() if remap is None else ():
            self._parked.setdefault(int(n), {})[b] = ts
        clocks = state.get(_STREAM_CLOCK, {})
        self.s_stream_clock = {kind: float(clocks.get(kind, -np.inf)) for kind in self.s_stream_clock}
