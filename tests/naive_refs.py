"""Shared parts of the naive kernel references: a prediction's life (detectors/alarm.py) restated,
and the thermal fit fed one sample at a time for references of the detectors that read it."""

from __future__ import annotations

import math

import numpy as np

from foreshock.detectors import gpu_inputs as gi
from foreshock.detectors import thermal_fit as tf


def new_alarm() -> dict:
    return {"active": False, "on": 0, "emit_ts": math.nan, "off_ts": math.nan}


def naive_alarm_step(a: dict, ts: float, firing: bool, clear: bool, on_count: float, off_hold_s: float,
                     refresh_s: float) -> str | None:
    """Start after ``on_count`` firing samples in a row; while active, refresh at most every
    ``refresh_s`` while firing, withdraw once ``clear`` has held for ``off_hold_s``."""
    if not a["active"]:
        a["on"] = a["on"] + 1 if firing else 0
        if a["on"] >= on_count:
            a.update(active=True, emit_ts=ts, off_ts=math.nan)
            return "start"
        return None
    if clear:
        if math.isnan(a["off_ts"]):
            a["off_ts"] = ts
        elif ts - a["off_ts"] >= off_hold_s:
            a.update(active=False, on=0, off_ts=math.nan, emit_ts=ts)
            return "withdraw"
        return None
    a["off_ts"] = math.nan
    if firing and ts - a["emit_ts"] >= refresh_s:
        a["emit_ts"] = ts
        return "refresh"
    return None


class PerSample:
    """A reference that predicts one GPU sample at a time from the thermal fit as it stood after
    that sample (the fit fed one-row frames). Subclasses set ``fit`` and ``p`` (the thermal
    parameters, whose site estimates follow the racks) and define ``sample``."""

    fit: tf.ThermalFit
    p: np.ndarray

    def rack_frame(self, frame) -> None:  # type: ignore[no-untyped-def]
        self.fit.update(frame, caller=self)
        self.p[tf.P_SITE_DAMP] = gi.site_loop_tau(self.fit.s_rack)
        self.p[tf.P_SITE_RISE] = gi.site_loop_rise(self.fit.s_rack)

    def gpu_frame(self, frame) -> None:  # type: ignore[no-untyped-def]
        self.take_rows(frame)
        self.withdraw_silent(frame)

    def take_rows(self, frame) -> None:  # type: ignore[no-untyped-def]
        """Each row of ``frame`` on its own: the fit, then :meth:`sample`."""
        for k in range(len(frame)):
            row = frame.take(np.array([k]))
            self.fit.update(row, caller=self)
            dt, tprev = self.fit.rows[0, tf.R_DT], self.fit.rows[0, tf.R_TPREV]
            if dt >= 0:  # (a late row the fit skipped predicts nothing)
                self.sample(float(row.ts[0]), int(row.slot[0]), dt, tprev,
                            {name: float(col[0]) for name, col in row.columns.items()})

    def withdraw_silent(self, frame) -> None:  # type: ignore[no-untyped-def]
        """After the frame: each active prediction of a GPU that has sent nothing for the fit's
        ``gap_s`` before the frame's time (its stamps' :func:`~gi.frame_now`) is withdrawn, once, as
        no longer reporting (``ThermalFitDetector.withdraw_silent_gpus``), GPU by GPU, block by block."""
        stamps = frame.ts[np.isfinite(frame.ts)]
        if not len(stamps):
            return
        gap = float(self.p[tf.P_GAP])
        now = gi.frame_now(stamps, gap)
        last = self.fit.s_model[:, tf.G_TS]
        for i, blocks in enumerate(self.alarm_blocks()):
            for k, a in enumerate(blocks):
                if a["active"] and not now - last[i] <= gap:
                    a.update(active=False, on=0, off_ts=math.nan, emit_ts=now)
                    self.silent_withdrawn(now, i, k)

    def sample(self, ts: float, i: int, dt: float, tprev: float, c: dict) -> None:
        raise NotImplementedError

    def alarm_blocks(self) -> list:
        """Each GPU's alarms, in the detector's block order."""
        raise NotImplementedError

    def silent_withdrawn(self, now: float, i: int, k: int) -> None:
        """Note GPU ``i``'s block ``k`` withdrawn at ``now`` as no longer reporting."""
        raise NotImplementedError


def run_both(detector, naive: PerSample, frames) -> list:  # type: ignore[no-untyped-def]
    """Feed ``frames`` to a detector and to its reference; returns the detector's findings."""
    found = []
    for frame in frames:
        found += detector.update(frame)
        naive.rack_frame(frame) if frame.kind == "rack" else naive.gpu_frame(frame)
    return found


def branches_seen(references) -> dict:  # type: ignore[no-untyped-def]
    """The references' ``seen`` counts summed: what their random inputs exercised."""
    seen: dict = {}
    for ref in references:
        for what, count in ref.seen.items():
            seen[what] = seen.get(what, 0) + count
    return seen
