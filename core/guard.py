"""The input guard: the first stage after every source, in both pipelines.

Detectors assume each entity's samples arrive in time order with a known slot. The guard
enforces that, per entity kind, in one Numba pass over a frame, and *counts* every row it
sets aside (``PipelineHealth.problem``) — nothing disappears silently:

- ``unknown_entity``: slot outside the topology;
- ``bad_timestamp``: NaN or infinite ``ts``;
- ``duplicate_timestamp``: same ``ts`` as the entity's previous sample;
- ``out_of_order``: older than the entity's previous sample;
- ``missing_values``: NaN gaps in a field the frame does report: kept (NaN means missing), counted;
- ``inf_values``: infinities become NaN, counted.
"""

from __future__ import annotations

import numpy as np

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
def _scan_kernel(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per field (row of ``block``): NaN count after infinities became NaN, and the
    infinities, which it sets to NaN in ``block``."""
    fields, rows = block.shape
    nans = np.zeros(fields, dtype=np.int64)
    infs = np.zeros(fields, dtype=np.int64)
    for j in range(fields):
        n_nan = 0
        n_inf = 0
        for i in range(rows):
            v = block[j, i]
            if v != v:
                n_nan += 1
            elif v == np.inf or v == -np.inf:
                block[j, i] = np.nan
                n_inf += 1
        nans[j] = n_nan + n_inf
        infs[j] = n_inf
    return nans, infs


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
        # One pass over all fields at once (a per-field loop of numpy calls cost more than the
        # rows themselves on the small per-partition pieces a Kafka worker sees).
        block = np.array(list(out.columns.values()))  # (fields, rows) copy, C order
        nans, infs = _scan_kernel(block)
        matrix_inf = int(infs.sum())
        if matrix_inf:
            for name, n_inf, row in zip(out.columns, infs, block):
                if n_inf:
                    out.columns[name][:] = row  # the kernel set them to NaN in the copy
            self.health.problem(self.stage, "inf_values", matrix_inf, detail=f"{frame.kind} frame; set to NaN")
        # NaN is the contract's "missing". A field absent from the whole frame is simply not
        # reported by this source; a gap inside a reported field is counted, so a sensor going
        # dark is visible.
        gaps = int(nans[(nans > 0) & (nans < len(out))].sum())
        if gaps:
            self.health.problem(self.stage, "missing_values", gaps, detail=f"{frame.kind} frame")
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.s_last_ts.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        for k, v in state.items():
            self.s_last_ts[k] = np.asarray(v, dtype=np.float64).copy()
