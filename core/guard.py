"""The input guard: the first stage after every source, in both pipelines.

Detectors assume each entity's samples arrive in time order with a known slot. The guard
enforces that, per entity kind, in one Numba pass over a frame, and *counts* every row it
sets aside (``PipelineHealth.problem``) — nothing disappears silently:

- ``unknown_entity``: slot outside the topology;
- ``bad_timestamp``: NaN or infinite ``ts``;
- ``duplicate_timestamp``: same ``ts`` as the entity's previous sample;
- ``out_of_order``: older than the entity's previous sample;
- ``missing_values``: NaN gaps in a field the frame does report: kept (NaN means missing), counted;
- ``inf_values``: infinities become NaN, counted;
- ``out_of_range``: a gauge value no sensor of its field can read (``Field.valid``: a sentinel
  such as 65535 or -1, a raw RPM where a share is due) becomes NaN, counted with the field named.
"""

from __future__ import annotations

import numpy as np

from .fields import get_field, valid_bounds
from .frames import Frame
from .health import PipelineHealth
from .numba_config import jit
from .topology import Topology

REASONS = ("unknown_entity", "bad_timestamp", "duplicate_timestamp", "out_of_order")


@jit
def _guard_kernel(ts: np.ndarray, slot: np.ndarray, last_ts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    keep = np.zeros(len(ts), dtype=np.bool_)
    n_slots = len(last_ts)
    for i in range(len(ts)):
        s = slot[i]
        t = ts[i]
        if s < 0 or s >= n_slots:
            counts[0] += 1
        elif not np.isfinite(t):
            counts[1] += 1
        elif t == last_ts[s]:
            counts[2] += 1
        elif t < last_ts[s]:
            counts[3] += 1
        else:
            last_ts[s] = t
            keep[i] = True
    return keep


@jit
def _scan_columns(columns: tuple[np.ndarray, ...], rows: int, lo: np.ndarray, hi: np.ndarray,
                  out_of_range: np.ndarray) -> tuple[int, int]:
    """Over a tuple of equal-length float64 columns, in place: sets infinities, and finite values
    outside ``[lo[c], hi[c]]``, to NaN (counting the latter per column in ``out_of_range``).
    Returns (gaps, infinities): gaps are the NaN (infinities included) of the columns that have
    some but not ``rows`` of them — a column NaN in every row is a field the source does not report."""
    gaps = 0
    infs = 0
    c = 0
    for column in columns:
        n_nan = 0
        low = lo[c]
        high = hi[c]
        for i in range(rows):
            v = column[i]
            if low <= v <= high:  # the usual case, one test: bounds are finite, so NaN and ±inf fail it
                continue
            if v != v:
                n_nan += 1
            elif v == np.inf or v == -np.inf:
                column[i] = np.nan
                n_nan += 1
                infs += 1
            else:
                column[i] = np.nan
                out_of_range[c] += 1
        if 0 < n_nan < rows:
            gaps += n_nan
        c += 1
    return gaps, infs


def kernel_column(column: np.ndarray) -> np.ndarray:
    """The column itself when it is a writable C-contiguous float64 array (a ``Frame``'s columns
    are), else such a copy: a tuple of columns passed to a kernel must be of one Numba type."""
    if column.dtype == np.float64 and column.flags.c_contiguous and column.flags.writeable:
        return column
    return np.array(column, dtype=np.float64)


class InputGuard:
    """Keeps per-entity last timestamps; :meth:`check` returns the clean part of a frame."""

    def __init__(self, topology: Topology, health: PipelineHealth, stage: str = "guard") -> None:
        self.health = health
        self.stage = stage
        self.s_last_ts = {kind: np.full(topology.size(kind), -np.inf) for kind in
                          ("gpu", "link", "optic", "node", "rack", "job")}

    def check(self, frame: Frame) -> Frame:
        if len(frame) == 0:
            return frame
        counts = np.zeros(len(REASONS), dtype=np.int64)
        keep = _guard_kernel(frame.ts, frame.slot, self.s_last_ts[frame.kind], counts)
        dropped = bool(counts.any())  # every row is either counted here or kept
        if dropped:
            for reason, n in zip(REASONS, counts):
                if n:
                    self.health.problem(self.stage, reason, int(n), detail=f"{frame.kind} frame")
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
        names = tuple(columns)
        lo, hi = valid_bounds(frame.kind, names)
        outside = np.zeros(len(names), dtype=np.int64)
        gaps, infs = _scan_columns(tuple(columns.values()), len(out), lo, hi, outside)
        for c in np.flatnonzero(outside):
            self.health.problem(self.stage, f"out_of_range: {names[c]}", int(outside[c]),
                                detail=f"{frame.kind} frame; outside {lo[c]:g}..{hi[c]:g} {get_field(names[c]).unit}, "
                                       "set to NaN")
        if infs:
            self.health.problem(self.stage, "inf_values", int(infs), detail=f"{frame.kind} frame; set to NaN")
        # NaN is the contract's "missing". A field absent from the whole frame is simply not
        # reported by this source; a gap inside a reported field is counted, so a sensor going
        # dark is visible.
        if gaps:
            self.health.problem(self.stage, "missing_values", int(gaps), detail=f"{frame.kind} frame")
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.s_last_ts.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        for k, v in state.items():
            self.s_last_ts[k] = np.asarray(v, dtype=np.float64).copy()
