"""Ground truth: turn per-step conditions into debounced start/end episodes.

A condition (e.g. "thermal bits set" for each GPU) is evaluated every physics step. An
episode starts the first step it holds and ends at the first step of a gap that lasts at least
``hold_s`` (so a power cap that releases for one communication phase of every training step
stays one episode). Each episode keeps the fault it started under, and the reason bits seen.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from foreshock.events import Event

FaultLookup = Callable[[int], tuple[str, str]]
"""Fault index -> (fault_id, fault_type); ("", "") for -1."""


class EpisodeTracker:
    def __init__(self, name: str, entity_kind: str, names: Sequence[str], hold_s: float,
                 faults: FaultLookup, with_bits: bool = False) -> None:
        n = len(names)
        self.name = name
        self.entity_kind = entity_kind
        self.names = names
        self.hold_s = hold_s
        self.faults = faults
        self.with_bits = with_bits
        self.active = np.zeros(n, dtype=bool)
        self.off_since = np.full(n, np.nan)  # first step of the current gap inside an episode
        self.cause = np.full(n, -1, dtype=np.int64)
        self.bits = np.zeros(n, dtype=np.int64)
        self.started = np.zeros(n)

    def update(self, t: float, on: np.ndarray, cause: np.ndarray | None = None,
               bits: np.ndarray | None = None, detail: Callable[[int], dict] | None = None) -> list[Event]:
        events: list[Event] = []
        starts = on & ~self.active
        if bits is not None:
            self.bits |= np.where(self.active | starts, bits, 0)
        if starts.any():
            for i in np.flatnonzero(starts):
                c = int(cause[i]) if cause is not None else -1
                fid, ftype = self.faults(c)
                d: dict = {}
                if bits is not None:
                    d["reasons"] = int(bits[i])
                if detail is not None:
                    d.update(detail(int(i)))
                events.append(Event(t, f"{self.name}_start", self.entity_kind, self.names[int(i)], fid, ftype, d))
                self.cause[i] = c
                self.started[i] = t
            self.active |= starts
            if bits is None:
                self.bits[starts] = 0
            else:
                self.bits[starts] = bits[starts]
        # gaps inside episodes
        gap = self.active & ~on
        self.off_since = np.where(self.active & on, np.nan, self.off_since)
        first_off = gap & np.isnan(self.off_since)
        self.off_since = np.where(first_off, t, self.off_since)
        ends = gap & (t - self.off_since >= self.hold_s)
        if ends.any():
            events.extend(self._end(np.flatnonzero(ends)))
        return events

    def close_gaps(self) -> list[Event]:
        """End, as the run ends, the episodes whose condition had cleared less than ``hold_s``
        before, at the first step of their gap: the run shows it clear from there to its end
        (left open, an episode reads as lasting for good). Episodes still on stay open."""
        return self._end(np.flatnonzero(self.active & ~np.isnan(self.off_since)))

    def _end(self, idx: np.ndarray) -> list[Event]:
        out = []
        for i in idx:
            fid, ftype = self.faults(int(self.cause[i]))
            t_end = float(self.off_since[i])
            d: dict = {"duration_s": round(t_end - float(self.started[i]), 3)}
            if self.with_bits:
                d["reasons"] = int(self.bits[i])
            out.append(Event(t_end, f"{self.name}_end", self.entity_kind, self.names[int(i)], fid, ftype, d))
        self.active[idx] = False
        self.off_since[idx] = np.nan
        self.cause[idx] = -1
        self.bits[idx] = 0
        return out
