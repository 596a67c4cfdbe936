"""Blast radius and cost of an incident: who is exposed next, how soon, and what it costs jobs.

The incident engine knows *which* entities a cause has reached; this module answers the two
questions an operator asks next, from optional telemetry (:class:`Telemetry`, fed frame by
frame) and the topology:

- **Exposed entities**, ranked by headroom: the GPUs of a failing loop, rack, PDU or node that
  show nothing yet (thermal margin to their own limit, ETA from their measured heating rate),
  and the links that take a failing link's traffic (the capacity left once they carry it, ETA
  = the failing link's).
- **Job impact**: in synchronous training the slowest member sets the pace, so a job's
  predicted step slowdown is the worst of its members' current evidence; a fresh measured step
  time against the job's own baseline stands in for the effects already seen (predictions of
  what is still to come can only raise it); GPU-hours at risk per hour = ``GPUs × (1 −
  1/slowdown)``, the whole job when it cannot step at all.

Without telemetry the exposed entities are still named, with ETA -1 (unknown).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from foreshock import facts
from foreshock.frames import Frame
from foreshock.remap import saved_slots, take_rows

from .counters import DROP_SIZE, MAX_PORT_RATE_BPS, PROBLEMS, STAMP_SLACK, CounterRates, modulus_for_bits
from .gpu_inputs import kernel, reported_core_limit
from .incident_domains import JOB, Domains, key

TEL_TS, TEL_TEMP, TEL_SLOPE, TEL_LIMIT, TEL_POWER_HEADROOM, TEL_REF_TS, TEL_REF_TEMP = range(7)
"""Columns of the per-GPU telemetry."""
LINK_TS, LINK_TX, LINK_UTIL = range(3)
"""Columns of the per-link telemetry: the time of its last row, the ``tx_data`` reading last taken
(:func:`_track_link`), the utilisation."""
JOB_BASE, JOB_LAST, JOB_TS = range(3)
JOB_BASE_TAU_S = 3600.0
"""A job's baseline step time follows its pace with this time constant (while it runs no more
than ``JOB_SLOW_RATIO`` slow): a learning step per sample had it follow any slowdown building
over more than a couple of minutes (1 % a sample of a step time reported every second): a job
30 % slow after ten minutes read x1.00 and no GPU-hours at risk (an audit, 2026-12-05)."""
JOB_BASE_FALL_TAU_S = 300.0
"""... and down to a faster pace with this one: a job's first steps (warm-up, compilation) run
slow, and a baseline learnt from them for an hour would read a real slowdown then as none."""
JOB_SLOW_RATIO = 1.1
"""A step time this much over the baseline is a slowdown, not the job's pace: the baseline holds."""
TX_NOT_SANE = "link tx_data counter went back or rose past the line rate: utilisation unknown"
"""The input problem of a link row whose transmitted-bytes counter cannot give a utilisation."""
TX_MODULUS = modulus_for_bits(32, 4.0)
"""Where a 32-bit ``port_xmit_data`` (4-byte words) wraps, in bytes (2**34). ``tx_data`` is read as
the congestion and optics detectors read their counters (:class:`~foreshock.detectors.counters.CounterRates`):
a fall from at most this is a wrap where it fits the counter's pace, else a reset; a 64-bit counter's
readings lie far above it (17 GB: under a second of a 400G port's traffic), so its falls are resets as
before. Until 2026-12-06 every fall was a problem and a rise after wraps a utilisation: on a healthy
recording of 32-bit counters (``simulate --counter-bits 32``) 30 % of the link rows were counted, and
the rest read as a few percent on busy links."""
TX_MAX_BYTES_PER_S = STAMP_SLACK * MAX_PORT_RATE_BPS / 8.0
"""Most bytes a port's ``tx_data`` can seem to count per second (the counters' physical bound); a
rise past ``STAMP_SLACK`` times the link's own rate is judged after it (:func:`_track_link`)."""
TX_REPORTED = ("resets_confirmed", "implausible_rise", "rebased", "rebased_down", "stale_or_out_of_order",
               "invalid_value", "unknown_slot", "saturated", "glitches")
"""The counter problems (:data:`~foreshock.detectors.counters.PROBLEMS`) counted as :data:`TX_NOT_SANE`:
those ``report_problems`` reports (wraps are what a 32-bit counter does at speed, not problems)."""
assert set(TX_REPORTED) <= set(PROBLEMS)
LINK_COUNTER = 2 + 1 + DROP_SIZE
"""Columns of a checkpoint's ``s_link_counter``: the ``tx_data`` counter's state per link (its last
reading taken and its time, its pace, its pending drop: :class:`CounterRates`). Taken back per link
where its reading is the link's ``LINK_TX`` (a state moved to other hardware moves ``s_link_tel``
alone); else, and from a checkpoint saved before it, the counter goes on from ``LINK_TX`` with no pace."""
TEL_OUTSIDE = "telemetry row with a slot outside the topology: left out"
"""The input problem of a GPU, link or job row whose slot is no entity of the topology: until
2026-12-05 a link or job row past the end raised IndexError out of the detector bank, slot -1 wrote
the last link's or job's row (a step time landed on another job), and GPU rows went uncounted."""
STEP_FRESH_S = 300.0
"""A job's last measured step time tells its current pace for this long (a few reporting
intervals); after that the job has stopped, or its telemetry has, and it tells nothing."""
SLOPE_BASELINE_S = 300.0
"""The heating rate is measured over at least this long: integer °C readings are too coarse for
sample-to-sample differences."""
MIN_HEATING_C_PER_S = 0.005
"""Below 0.3 °C/min a heating rate is noise on integer readings: no ETA is given from it."""
STALLED_RATIO = facts.STALLED_STEP_RATIO
AT_LIMIT_C = 1.0
"""A GPU within this of its own limit is held there: the SW thermal limiter holds the die just
under max operating (integer readings of 86-87 °C under an 87 °C limit), HW slowdown above it."""


class Telemetry:
    """The little telemetry the engine keeps, by slot: per GPU its temperature, heating rate,
    limit and power headroom; per link its utilisation; per job its last step time (and
    when it was measured) and baseline."""

    ARRAYS = ("s_gpu_tel", "s_link_tel", "s_job_tel")

    def __init__(self, n_gpus: int, n_links: int, n_jobs: int) -> None:
        self.s_gpu_tel = np.full((n_gpus, 7), np.nan)
        self.s_link_tel = np.full((n_links, 3), np.nan)
        self.tx = CounterRates(n_links, ("tx_data",), modulus=TX_MODULUS, max_rate=TX_MAX_BYTES_PER_S)
        self.s_job_tel = np.full((n_jobs, 3), np.nan)
        self.gpu_frames_ts = -math.inf  # newest GPU telemetry seen
        self._seen = np.zeros(n_gpus, np.bool_)  # scratch of the GPU kernel (all False between frames)

    def observe(self, frame: Frame) -> int:
        """Take ``frame``'s telemetry in; return how many of its link rows' ``tx_data`` counters went
        back or rose past what the line can carry (:data:`TX_NOT_SANE`, for the engine to count).
        Rows whose slot is outside the topology are left out (:meth:`rows_outside` counts them)."""
        if len(frame) == 0:
            return 0
        cols, slot, ts = frame.columns, frame.slot, frame.ts
        if frame.kind == "gpu":  # (the kernel leaves such rows out itself)
            newest = _track_gpu(self.s_gpu_tel, slot, ts, cols, self._seen)
            if newest is not None:
                self.gpu_frames_ts = max(self.gpu_frames_ts, newest)
        elif frame.kind == "link" and "tx_data" in cols and "link_rate" in cols:
            inside = _inside(slot, len(self.s_link_tel))
            return _track_link(self.s_link_tel, self.tx, slot[inside], ts[inside], cols["tx_data"][inside],
                               cols["link_rate"][inside])
        elif frame.kind == "job" and "step_time" in cols:
            inside = _inside(slot, len(self.s_job_tel))
            _track_job(self.s_job_tel, slot[inside], ts[inside], cols["step_time"][inside])
        return 0

    def rows_outside(self, frame: Frame) -> int:
        """How many of ``frame``'s GPU, link or job rows have a slot outside the topology
        (:data:`TEL_OUTSIDE`, for the engine to count): :meth:`observe` leaves them out."""
        table = {"gpu": self.s_gpu_tel, "link": self.s_link_tel, "job": self.s_job_tel}.get(frame.kind)
        if table is None or len(frame) == 0:
            return 0
        return int(len(frame) - np.count_nonzero(_inside(frame.slot, len(table))))

    def silent_since(self, gpu: int, t: float) -> bool:
        """Telemetry keeps flowing after ``t`` but not from this GPU (it is still off the bus)."""
        return self.gpu_frames_ts > t and not self.s_gpu_tel[gpu, TEL_TS] > t

    def at_limit(self, gpu: int, since: float) -> bool:
        """The GPU's last temperature, read after ``since``, within ``AT_LIMIT_C`` of its limit."""
        t = self.s_gpu_tel[gpu]
        return bool(t[TEL_TS] > since and t[TEL_LIMIT] - t[TEL_TEMP] <= AT_LIMIT_C)

    def carried_since(self, link: int, t: float) -> bool:
        """The link carried traffic in a reading after ``t`` (it is up: a down link sends nothing)."""
        return bool(self.s_link_tel[link, LINK_TS] > t and self.s_link_tel[link, LINK_UTIL] > 0)

    def state_dict(self) -> dict[str, Any]:
        n = len(self.s_link_tel)
        counter = np.hstack([self.tx.s_state.reshape(n, 2), self.tx.s_rate.reshape(n, 1),
                             self.tx.s_drop.reshape(n, DROP_SIZE)])
        return {**{m: getattr(self, m).copy() for m in self.ARRAYS}, "s_link_counter": counter,
                "gpu_frames_ts": self.gpu_frames_ts}

    def load_state_dict(self, state: dict[str, Any], job_slots: np.ndarray | None = None) -> None:
        """``job_slots``: where each saved job is in this job list (-1 gone), when it changed."""
        for name in self.ARRAYS:
            arr = np.asarray(state[name], dtype=np.float64)
            if name == "s_job_tel" and arr.ndim == 2 and arr.shape[1] == JOB_TS:
                # saved before step times carried their time: unknown, so too old to tell anything
                arr = np.hstack([arr, np.full((len(arr), 1), np.nan)])
            if name == "s_job_tel" and job_slots is not None:
                arr = take_rows(arr, np.full_like(self.s_job_tel, np.nan), saved_slots(job_slots, len(self.s_job_tel)))
            if arr.shape != getattr(self, name).shape:
                raise ValueError(f"telemetry state {name!r} has shape {arr.shape}, expected {getattr(self, name).shape}")
            setattr(self, name, arr.copy())
        self.gpu_frames_ts = float(state["gpu_frames_ts"])
        n = len(self.s_link_tel)
        counter = np.full((n, LINK_COUNTER), np.nan)
        counter[:, 0], counter[:, 1] = self.s_link_tel[:, LINK_TX], self.s_link_tel[:, LINK_TS]
        saved = np.asarray(state.get("s_link_counter", counter), dtype=np.float64)
        if saved.shape == counter.shape:
            same = saved[:, 0] == self.s_link_tel[:, LINK_TX]
            counter[same] = saved[same]
        self.tx.bind(np.ascontiguousarray(counter[:, :2].reshape(n, 1, 2)), np.zeros((n, 1), np.int64),
                     np.ascontiguousarray(counter[:, 2:3]),
                     np.ascontiguousarray(counter[:, 3:].reshape(n, 1, DROP_SIZE)))

    def measured_slowdown(self, job: int, now: float, since: float = -math.inf) -> float:
        """The job's last step time against its baseline, NaN when it has none measured within
        ``STEP_FRESH_S`` of ``now``, or none since ``since`` (a step time from before a GPU fell
        off the bus does not tell what that cost)."""
        base, last, ts = self.s_job_tel[job]
        if base > 0 and np.isfinite(last) and now - ts <= STEP_FRESH_S and ts >= since:
            return float(last / base)
        return math.nan

    @property
    def nbytes(self) -> int:
        counter = self.tx.s_state.nbytes + self.tx.s_rate.nbytes + self.tx.s_drop.nbytes + self.tx.s_resets.nbytes
        return int(sum(getattr(self, n).nbytes for n in self.ARRAYS)) + counter


def exposed_gpus(dom: Domains, tel: Telemetry, gpus: np.ndarray, power: bool, room: int) -> list[tuple[str, float]]:
    """GPUs exposed to a cause, least headroom first: thermal margin (power headroom for a power
    cause), with an ETA from the measured heating rate (-1: not heating, or no telemetry)."""
    if not len(gpus) or room <= 0:
        return []
    t = tel.s_gpu_tel[gpus]
    if power:
        headroom, eta = t[:, TEL_POWER_HEADROOM], np.full(len(gpus), np.nan)
    else:
        headroom = t[:, TEL_LIMIT] - t[:, TEL_TEMP]
        heating = t[:, TEL_SLOPE] >= MIN_HEATING_C_PER_S
        eta = np.where(heating, np.maximum(headroom, 0.0) / np.where(heating, t[:, TEL_SLOPE], 1.0), np.nan)
    order = np.lexsort((gpus, np.where(np.isfinite(headroom), headroom, np.inf)))[:room]
    return [(dom.topology.gpus[int(gpus[i])], round(float(eta[i]), 1) if np.isfinite(eta[i]) else -1.0)
            for i in order]


def reroute_targets_ranked(dom: Domains, tel: Telemetry, failing: dict[int, float], skip: set[int],
                           room: int) -> list[tuple[str, float]]:
    """Links that take the traffic of failing links (link -> ETA of its failure), least capacity
    left first once they carry the failing link's share; ``skip`` holds links already hit or failing
    themselves (the engine's: its members, its failing links, links another incident holds)."""
    cand: dict[int, tuple[float, float]] = {}
    for link, eta in failing.items():
        targets = dom.reroute_targets(link)
        live = [int(t) for t in targets if int(t) not in skip]
        if not live:
            continue
        after = tel.s_link_tel[live, LINK_UTIL] * (len(targets) + 1) / max(len(targets), 1)
        for t, u in zip(live, after):
            head = float(1.0 - u) if np.isfinite(u) else math.inf
            if t not in cand or head < cand[t][0]:
                cand[t] = (head, eta)
    ranked = sorted(cand.items(), key=lambda kv: (kv[1][0], kv[0]))[:room]
    return [(dom.topology.links[t], round(eta, 1)) for t, (_, eta) in ranked]


def job_impact(dom: Domains, tel: Telemetry, evidence: dict[int, tuple[float, float, float]],
               measured_for: set[int], now: float) -> tuple[tuple[tuple[str, float], ...], float]:
    """Per job (job slot -> (slowdown of the effects its members show now, slowdown its members'
    active predictions foretell, when they last showed an effect)): the step slowdown, and the
    GPU-hours at risk per hour. For a job in ``measured_for`` (the incident that explains its
    measured slowdown) a step time measured since those effects, and fresh, replaces them: it is
    what they cost; what is predicted still raises it."""
    out = []
    risk = 0.0
    for j in sorted(evidence):
        shown, foretold, seen = evidence[j]
        measured = tel.measured_slowdown(j, now, since=seen) if j in measured_for else math.nan
        ratio = max(shown if math.isnan(measured) else measured, foretold)
        n = len(dom.gpus_in(key(JOB, j)))
        risk += n * facts.lost_share(ratio)
        ratio = min(ratio, STALLED_RATIO)  # inf included: gauges and JSON want a finite number
        out.append((dom.topology.jobs[j], round(ratio, 3)))
    return tuple(out), risk


def _inside(slot: np.ndarray, n: int) -> np.ndarray:
    """Which rows' slots are entities of a table of ``n`` (a negative slot would index from its end)."""
    slot = np.asarray(slot)
    return (slot >= 0) & (slot < n)


def _last_per_slot(slot: np.ndarray) -> np.ndarray:
    """Row index of each slot's last row (rows are time-ordered)."""
    first_of_reversed = np.unique(slot[::-1], return_index=True)[1]
    return len(slot) - 1 - first_of_reversed


def _track_gpu(tel: np.ndarray, slot: np.ndarray, ts: np.ndarray, cols: dict[str, np.ndarray],
               seen: np.ndarray) -> float | None:
    """Track each GPU's latest temperature, heating rate, limit and power headroom; return the
    newest timestamp of the frame (None when it has no finite one)."""
    names = ("gpu_temp", "slowdown_temp", "max_op_temp", "power", "power_limit")
    if all(k in cols for k in names):
        temp, slowdown, max_op, power, cap = (cols[k] for k in names)
    else:  # a frame carries every field; a stand-in for what a plain mapping lacks (or the
        # columns a Kafka worker forwards: IncidentEngine.frame_fields)
        nan = np.full(len(ts), np.nan)
        temp, slowdown, max_op, power, cap = (cols.get(k, nan) for k in names)
    newest = _track_gpu_kernel(tel, slot, ts, (temp, slowdown, max_op, power, cap), seen,
                               "power" in cols and "power_limit" in cols)
    return None if np.isnan(newest) else float(newest)


@kernel
def _track_gpu_kernel(tel: np.ndarray, slot: np.ndarray, ts: np.ndarray,
                      cols: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], seen: np.ndarray,
                      has_power: bool) -> float:
    """Per GPU, its last sample of the frame with a finite temperature and time (rows are in time
    order, so the frame is read backwards); returns the largest timestamp if any is finite, else
    NaN. ``cols`` = (temperature, slowdown temperature, max operating temperature, power, power
    limit); ``seen`` is scratch (all False, one per GPU; left so). Slots outside the table are left
    out."""
    temp, slowdown, max_op, power, cap = cols
    newest = -np.inf
    any_finite = False
    for r in range(len(ts) - 1, -1, -1):
        t = ts[r]
        if t == t:
            newest = max(newest, t)
            any_finite = any_finite or abs(t) < np.inf
        x = temp[r]
        s = slot[r]
        if not (abs(x) < np.inf and abs(t) < np.inf) or s < 0 or s >= len(seen) or seen[s]:
            continue
        seen[s] = True
        span = t - tel[s, TEL_REF_TS]
        if not span < SLOPE_BASELINE_S:  # NaN (no reference yet) counts as due
            if span > 0:
                tel[s, TEL_SLOPE] = (x - tel[s, TEL_REF_TEMP]) / span
            tel[s, TEL_REF_TS] = t
            tel[s, TEL_REF_TEMP] = x
        tel[s, TEL_TS] = t
        tel[s, TEL_TEMP] = x
        # the GPU's own limit: its max operating temperature, else 2 °C under its HW slowdown (an
        # offset from T.Limit, or 0, is no reading); kept through a sample that reports neither
        own = reported_core_limit(max_op[r], slowdown[r])
        if own == own:
            tel[s, TEL_LIMIT] = own
        elif tel[s, TEL_LIMIT] != tel[s, TEL_LIMIT]:
            tel[s, TEL_LIMIT] = facts.MAX_OPERATING_TEMP_C
        if has_power:
            tel[s, TEL_POWER_HEADROOM] = cap[r] - power[r]
    for r in range(len(ts)):
        s = slot[r]
        if 0 <= s < len(seen):
            seen[s] = False
    return newest if any_finite else np.nan


def _track_link(tel: np.ndarray, tx: CounterRates, slot: np.ndarray, ts: np.ndarray, b_all: np.ndarray,
                rate: np.ndarray) -> int:
    """Utilisation from the transmitted-bytes counter, each link's last row of the frame, read by
    ``tx`` (:class:`CounterRates`: wraps, resets, glitches, readings past the bound) as the other
    detectors read their counters; a rise past ``STAMP_SLACK`` times the link's own rate reads as
    unknown. Returns the rows counted (:data:`TX_NOT_SANE`): the counter problems ``tx`` reports
    (:data:`TX_REPORTED`), and those rises. Until 2026-12-05 they went by without a word (a fuzz test
    found it), a jump of 1e15 bytes taken as the link at 100 %.

    An interval whose wraps cannot be told (both readings at most :data:`TX_MODULUS`, which a 64-bit
    counter is not for long, and the link able to carry half of it in the interval: it may have
    wrapped any number of times) gives no utilisation and is no problem: the counter goes on from
    the reading (its pace unknown, as after a reset). A 32-bit counter at 400 Gb/s wraps every 0.3 s."""
    ok = np.isfinite(b_all) & np.isfinite(ts)
    if not ok.any():
        return 0
    idx = np.flatnonzero(ok)[_last_per_slot(slot[ok])]
    s, t, b, r = slot[idx], ts[idx], b_all[idx], rate[idx]
    last, last_t = tx.s_state[s, 0, 0], tx.s_state[s, 0, 1]
    line = np.where(r > 0, r, MAX_PORT_RATE_BPS) * STAMP_SLACK / 8.0  # bytes/s
    with np.errstate(over="ignore", invalid="ignore"):  # (a garbage stamp: judged by tx below)
        untold = (b >= 0) & (b <= TX_MODULUS) & (last <= TX_MODULUS) & (t - last_t >= 0) \
            & ~(line * (t - last_t) < TX_MODULUS / 2.0)
    if untold.any():
        u = s[untold]
        tx.s_state[u, 0, 0], tx.s_state[u, 0, 1] = b[untold], t[untold]
        tx.s_rate[u] = np.nan
        tx.s_drop[u] = np.nan
    read = ~untold
    problems = 0
    util = np.full(len(s), np.nan)
    if read.any():
        _, bps, counted = tx.update(t[read], s[read], b[read, None])
        problems = sum(counted[k] for k in TX_REPORTED)
        with np.errstate(over="ignore", invalid="ignore"):
            util[read] = bps[:, 0] * 8.0 / np.where(r[read] > 0, r[read], np.nan)
    # a reading with a baseline before it judges the utilisation; one without (a first), or a link
    # without a rate, leaves the last one
    judged = read & (r > 0) & np.isfinite(last)
    too_fast = judged & (util > STAMP_SLACK)
    tel[s, LINK_TS], tel[s, LINK_TX] = t, tx.s_state[s, 0, 0]  # (the reading taken: a refused one is not)
    known = judged & np.isfinite(util) & ~too_fast
    tel[s, LINK_UTIL] = np.where(known, np.clip(util, 0.0, 1.0),
                                 np.where(judged | untold, np.nan, tel[s, LINK_UTIL]))
    return int(problems + np.count_nonzero(too_fast))


def _track_job(tel: np.ndarray, slot: np.ndarray, ts: np.ndarray, step: np.ndarray) -> None:
    """A slow baseline of each job's step time (``JOB_BASE_TAU_S``, one step per job and frame,
    held while it runs over ``JOB_SLOW_RATIO`` slow), the last one and its time; a job that reports
    no step time (NaN: not running) has no last one."""
    ok = np.isfinite(step) & (step > 0) & np.isfinite(ts)
    tel[slot[~ok], JOB_LAST] = np.nan
    if not ok.any():
        return
    idx = np.flatnonzero(ok)[_last_per_slot(slot[ok])]
    s, x, t = slot[idx], step[idx], ts[idx]
    base = tel[s, JOB_BASE]
    # the time since the job's last step time (unknown: a checkpoint saved without it) weighs the step
    tau = np.where(x < base, JOB_BASE_FALL_TAU_S, JOB_BASE_TAU_S)
    alpha = np.clip(np.nan_to_num((t - tel[s, JOB_TS]) / tau, nan=0.0), 0.0, 1.0)
    learn = x <= JOB_SLOW_RATIO * base
    tel[s, JOB_BASE] = np.where(np.isfinite(base), np.where(learn, base + alpha * (x - base), base), x)
    tel[s, JOB_LAST] = x
    tel[s, JOB_TS] = t
