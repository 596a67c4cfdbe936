"""Peer outliers inside a training job: the GPU that sets the pace of a synchronous job.

In synchronous training the slowest rank sets the step time of every rank. Per GPU the
detector keeps exponentially weighted means of its SM clock (as a fraction of its maximum),
core temperature, utilisation and the share of time a throttle bit (thermal, power brake, HW
slowdown; not the SW power cap, see :data:`THROTTLING`) was set. Every ``interval_s`` of telemetry
time it compares each busy GPU with the other busy GPUs of its job (median and MAD — robust to the
outlier itself):

- **slower**: clock below the job median by more than ``clock_gap`` (and ``k_mad`` MADs), at the
  same load: not a GPU drawing more than ``1 + clock_power_band`` times the job's median power and
  not throttling (its throttled share under ``throttle_gap``), whose clock its work holds down (a
  real H200 under a bf16 matmul sat on its power cap at 691 W and 1,483 MHz, under a memory-bound
  copy at 407 W and 1,980: a job's heavier stage was "slower" by 25 %). A GPU that runs hot draws
  more through leakage (3 W/°C), and is still compared: it throttles, or its excess is far below;
- **hotter**: temperature above the job median by more than ``temp_gap_c`` at the same load: a GPU
  drawing more than ``1 + power_band`` times the job's median power is read down by ``temp_per_w``
  °C per watt above that (a pipeline's last stage, given more work, runs hotter for no fault of its
  own; within the band, a GPU that runs hot draws a little more through leakage, and is read as it is).
  Where racks report their inlet (rack frames' ``inlet_temp``, else ``coolant_temp``), each GPU's
  temperature is taken over its rack's *usual* inlet (see :data:`R_USUAL`): a job spanning two racks
  at 25 and 32 °C (two loops, or the two ends of one) read every GPU of the warmer rack as "hotter",
  with nothing wrong with it, while a loop warming above its usual (a CDU losing flow) still shows,
  minutes before its GPUs throttle. A GPU whose rack reports none is taken over the
  job's median usual inlet; a job none of whose racks reports one (dcgm-exporter alone) is compared
  on temperatures as they are;
- **throttling more**: throttled share above the job median by more than ``throttle_gap``.

A job whose busy GPUs split in two equal halves far apart (one node of a two-node job slower, hotter or
throttling; 4 GPUs of a node's 8) is judged against its better half: its median and MAD, not the job's
(see :func:`_compare_kernel`). Between two halves the job's median sits in the empty stretch midway and
its MAD is half the distance between them, which no GPU's deficit reaches ``k_mad`` times: a node at half
the clock of its job's other node went unnamed, while in synchronous training it sets the pace of both.

A GPU whose clock comes without its maximum (dcgm-exporter's default counters have no
``DCGM_FI_DEV_MAX_SM_CLOCK``) is compared on its clock as read (:data:`RAW_CLOCK_HZ`): the check is a
relative deficit against its job's median, which a common scale leaves as it is (a job's GPUs are one
model). Per GPU its clock mean is of one kind (``s_clock_raw``), and a job whose GPUs hold both kinds
compares those of the kind most of them hold (ties: the ratios), never the two in one median.

Findings are :class:`~foreshock.findings.Anomaly` on the GPU (field ``sm_clock``,
``gpu_temp`` or ``throttle_reasons``), score = the relative deficit or excess, emitted when
the outlier appears and refreshed every ``refresh_s`` while it lasts: until its excess falls under
``clear_fraction`` of the bar that raised it (a GPU right at the bar, noisy, is not named anew each
time it dips under the bar and comes back).

Example (job of 16 GPUs; GPU 5 runs 15 % slower)::

    >>> import numpy as np
    >>> from foreshock.topology import Topology
    >>> from foreshock.frames import Frame
    >>> topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
    ...     "nodes": [{"name": "a", "rack": "k"}, {"name": "b", "rack": "k"}],
    ...     "jobs": [{"name": "j", "nodes": ["a", "b"]}]})
    >>> det, found = StragglerDetector(topo), []
    >>> clock = np.full(16, 1.98e9); clock[5] *= 0.85
    >>> for t in np.arange(0.0, 600.0, 10.0):
    ...     found += det.update(Frame("gpu", np.full(16, t), np.arange(16), {
    ...         "sm_clock": clock, "sm_clock_max": np.full(16, 1.98e9), "util": np.ones(16),
    ...         "gpu_temp": np.full(16, 60.0), "throttle_reasons": np.zeros(16)}))
    >>> sorted({(f.slot, f.field) for f in found})
    [(5, 'sm_clock')]
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from foreshock import facts
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.guard import MAX_AHEAD_S
from foreshock.health import PipelineHealth
from foreshock.numba_config import jit
from foreshock.remap import Remap
from foreshock.topology import Topology

from .base import Detector, add_columns, resolve_params
from .order_stats import bucket_by_group, median_of, select_kth
from .gpu_inputs import (frame_now, HELD, INLET_MAX_C, INLET_MIN_C, inline, reason_bits, rack_inlet_obs,
                         reading_jump, Scratch, gpu_columns, kernel)

OBS_FIELDS = ("sm_clock", "sm_clock_max", "util", "gpu_temp", "throttle_reasons", "power")
(S_TS, S_CLOCK, S_TEMP, S_UTIL, S_THROTTLE, S_N, S_BUSY_TS, S_POWER, S_UTIL_TS, S_BUSY_W,
 S_CLOCK_TS, S_TEMP_TS, S_THROTTLE_TS, S_POWER_TS) = range(14)
S_SIZE = 14
"""Per GPU: its last tick (``S_TS``), its busy-only means (``S_CLOCK``, ``S_TEMP``, ``S_THROTTLE``,
``S_POWER``: over busy samples, see :func:`_ew_kernel`) and utilisation mean; ``S_N`` counts busy
samples, ``S_BUSY_TS`` is the last of them and ``S_BUSY_W`` the weight its means took at it;
``S_UTIL_TS`` is when a utilisation was last read (the comparisons need it fresh: a GPU whose util
stopped coming kept its last one, "busy" on means frozen since, and was named "slower" every
``refresh_s`` for good). ``S_CLOCK_TS``, ``S_TEMP_TS``, ``S_THROTTLE_TS`` and ``S_POWER_TS`` are when
each busy mean last took a value: a GPU still busy whose clock (or temperature, throttle reasons,
power) stopped coming — an exporter that lost the field — is not compared on that mean, frozen since
(:func:`_compare_kernel`). The means that already took a value at tick ``S_TS`` are those whose time
(``S_UTIL_TS`` and the four) is ``S_TS`` (:func:`_taken`), so that a second row of the same tick (two
sources scraping it, a frame split by field) adds the fields it alone brings and weighs none twice:
a mean's time is set only with a value, at the row's tick, and ticks only move on. (Until 2026-12-06
a column ``S_TAKEN`` kept those bits, at 10: :data:`LAYOUT1_S_SIZE`.)"""
LAYOUT1_S_SIZE = 15
"""``s_gpu``'s width in layout 1 (a state without ``state_layout``, before 2026-12-06): the columns
above with ``S_TAKEN`` (the ``T_*`` bits of the means taken at tick ``S_TS``) at
:data:`LAYOUT1_S_TAKEN`, the four means' times after it (11..14). Narrower layout-1 states are older
still (columns added at the end: :meth:`StragglerDetector.upgrade_state`)."""
LAYOUT1_S_TAKEN = 10
STATE_LAYOUT = 2
"""The layout of the detector's arrays (``state_layout`` in its state; a state without it is layout 1).
Removing ``S_TAKEN`` made ``s_gpu``'s width no sign of its version: the layout is said outright."""
T_UTIL, T_CLOCK, T_TEMP, T_POWER, T_THROTTLE = 1, 2, 4, 8, 16
T_ALL = 31


@inline
def _taken(s: np.ndarray, i: int, ts: float) -> int:
    """The ``T_*`` bits of GPU ``i``'s means that took a value at tick ``ts`` (their time is ``ts``)."""
    return ((T_UTIL if s[i, S_UTIL_TS] == ts else 0) | (T_CLOCK if s[i, S_CLOCK_TS] == ts else 0)
            | (T_TEMP if s[i, S_TEMP_TS] == ts else 0) | (T_POWER if s[i, S_POWER_TS] == ts else 0)
            | (T_THROTTLE if s[i, S_THROTTLE_TS] == ts else 0))
THROTTLING = facts.THERMAL_THROTTLE_MASK | facts.THROTTLE_HW_POWER_BRAKE
"""The throttle bits that count for "throttling more". Not the SW power cap (0x4): under full load
GPUs sit on it by turns (the nvidia-smi capture: 0x4 held at 691 W), and a GPU that holds it more
than its peers only shows it in its clock, which the "slower" check compares. Counted, it flagged
half of a 128-GPU job a minute into its run on seed 21 (126 GPUs: "throttled share 1 vs job median
0.168"), none of them near a fault."""

TEMP_MIN_C, TEMP_MAX_C = -50.0, 200.0
"""A core temperature a sample reads (bounds excluded; the thermal fit's): anything else is no reading.
An infinite one was averaged in and named its GPU "hotter" with score inf; 1e6 °C (a sentinel) sat in
its mean, the GPU named "hotter" again at every refresh while it faded (review h43)."""
CLOCK_RATIO_MAX = 1.2
UTIL_MAX = 1.2
"""The most ``sm_clock / sm_clock_max`` and ``util`` read (boost and rounding stay far below); above, or
below 0, a sample has no clock or utilisation."""
RAW_CLOCK_HZ = 2.5e9
"""The scale a clock read without its maximum is taken over (``sm_clock / RAW_CLOCK_HZ``, as if it were
the maximum): above any data-centre GPU's boost (an L40S reaches 2.52 GHz; within the 1.2 bound up to
3 GHz). Skipped, a clock without its maximum was no reading at all: with dcgm-exporter's default
counters the "slower" check was silently off (a GPU 30 % slower among 31 peers went unnamed)."""

R_TS, R_INLET, R_USUAL, R_LAST, R_HELD, R_HELD_TS = range(6)
R_SIZE = 6
"""Per rack: the time of its last inlet reading, the inlet averaged over ``tau_s`` (as the GPUs'
temperatures are), its *usual* inlet (below), and the last reading as read, with a reading held back
as a jump no loop makes (and when): a glitch is dropped, not averaged in, as the thermal fit drops it
(``gpu_inputs.reading_jump``). The usual inlet follows the average down at once, so a sensor that
read 1 °C one poll in three dragged it ~10 °C low, and every GPU of its rack was named "hotter" than
its job (until 2026-12-02). The usual inlet is the lower envelope of that average, which follows it down
at once and up only over ``inlet_usual_tau_s``. The temperature check takes each GPU over its rack's
usual inlet, not over the inlet now: a rack that always runs warmer (its place on the loop, another
loop) is its usual, while a loop that warms above its usual (a CDU losing flow: every GPU on it runs
hotter minutes before it throttles, ahead of the job's slowdown) still reads hotter. Taken over the
inlet now, those GPUs went unnamed until they throttled. A low envelope, not a mean: a mean would
keep part of a flow loss of 40 minutes, and read the loop cooler than usual (and the other racks of
its jobs hotter) for hours after the flow came back."""

PARAMS: dict[str, float] = {
    "tau_s": 120.0,
    "interval_s": 60.0,
    "busy_util": 0.5,
    "min_samples": 6.0,
    "clock_gap": 0.05,
    "temp_gap_c": 8.0,
    "throttle_gap": 0.25,
    "k_mad": 4.0,
    "refresh_s": 600.0,
    # a GPU reported as an outlier stays one until its excess (and its distance in MADs) falls under
    # this share of the bar that raised it: an outlier right at the bar, noisy, is one finding per
    # refresh_s rather than one each time it dips under the bar and comes back
    "clear_fraction": 0.8,
    # °C per W a GPU above its job's median power is read down by, to compare its temperature at
    # the same load (the nominal die-to-coolant resistance)
    "temp_per_w": facts.THERMAL_RESISTANCE_C_PER_W,
    "power_band": 0.1,  # ... for the watts above this share over the job's median power
    "clock_power_band": 0.25,  # a GPU above this share over its job's median power is not "slower"
    # how fast a rack's usual inlet rises to a higher level (it falls at once): hours, so that a loop
    # losing flow (tens of minutes) stays above its usual, and a rack moved for good is learnt over hours
    "inlet_usual_tau_s": 21600.0,
    # a job whose two middle values (the median's, an even count) lie this many gaps apart is split in
    # two halves, judged against its better half (_compare_kernel). Two: the cautious side of the gap
    # (a two-GPU job whose GPUs differ by 5 % is within the 8 % identical GPUs vary, FACTS/SC22); and
    # far above the distance between two neighbouring values of a job of any size spread by noise
    "split_gaps": 2.0,
}

PV_NAMES = ("interval_s", "busy_util", "min_samples", "clock_gap", "temp_gap_c", "throttle_gap", "k_mad",
            "refresh_s", "temp_per_w", "power_band", "clock_power_band", "clear_fraction", "split_gaps")
(PV_INTERVAL, PV_BUSY_UTIL, PV_MIN_SAMPLES, PV_CLOCK_GAP, PV_TEMP_GAP, PV_THROTTLE_GAP, PV_K_MAD, PV_REFRESH,
 PV_TEMP_PER_W, PV_POWER_BAND, PV_CLOCK_POWER_BAND, PV_CLEAR_FRACTION, PV_SPLIT_GAPS) = range(13)
# the checks, in the order of s_flag's columns (their gaps are PV_CLOCK_GAP + check): slower
# (relative clock deficit), hotter, throttling more
C_CLOCK, C_TEMP, C_THROTTLE = 0, 1, 2
CHECK_FIELDS = (S_CLOCK, S_TEMP, S_THROTTLE)
CHECK_SIGNS = (-1.0, 1.0, 1.0)
CHECK_NAMES = (("sm_clock", "clock"), ("gpu_temp", "temperature"), ("throttle_reasons", "throttled share"))
# one outlier due a report; O_INLET: the usual inlet its temperature was taken over (NaN: none);
# O_HALF: 1 where its job was split in two halves and O_MEDIAN is its better half's median, else 0
O_GPU, O_CHECK, O_EXCESS, O_X, O_MEDIAN, O_INLET, O_HALF = range(7)
O_SIZE = 7


@kernel
def _ew_kernel(obs: tuple[np.ndarray, ...], s: np.ndarray, tau: float, busy_util: float) -> int:
    """Exponentially weighted per-GPU means from ``obs`` = ``(ts, slot, OBS_FIELDS...)`` columns
    (:func:`~.gpu_inputs.gpu_columns`: the frame's own arrays, not a gathered copy, which cost
    ~8 ns per GPU, a sixth of the detector's time); returns rows skipped as out of order (older
    than their GPU's last tick).

    Utilisation is averaged over the samples that report one, each weighted by the time since the
    GPU's last utilisation. Clock, temperature and throttled share are averaged over *busy* samples
    only (utilisation reported and at least ``busy_util``), each weighted by the time since the GPU's
    last busy sample: the comparisons are "at the same load", and a GPU that joined its job late, or
    came back after a pause, must not carry its idle clock (0.17 of max against its peers' 0.75)
    into them. Averaged over all samples, such a GPU was a "slower" straggler two minutes after it
    started. Busy history older than a few ``tau`` fades by itself.

    A row at its GPU's last tick (``ts`` equal to it) continues that tick: two sources scraping one
    tick, or a frame split by field. Each mean that has not yet taken a value at this tick
    (:func:`_taken`) takes this row's, with the weight the tick's first value got (a busy tick's is
    ``S_BUSY_W``), and no mean moves twice: a field the tick already brought (a duplicate row) keeps
    the first value. The tick is busy if its first utilisation was: fields that come before any
    utilisation of their tick are not known to be busy, and are not averaged. Dropped as out of
    order, such rows lost every field after the first frame's (until 2026-12-04)."""
    skipped = 0
    # the rows of a frame share their steps: one exp per frame for each kind of weight
    util_step, w_util_step, busy_step, w_busy_step = np.nan, np.nan, np.nan, np.nan
    ts_col, slots, clocks, clock_maxes, utils, temps, all_reasons, powers = obs
    for row in range(len(ts_col)):
        ts = ts_col[row]
        i = int(slots[row])
        last = s[i, S_TS]
        if ts < last:  # (False for a GPU with no tick yet)
            skipped += 1
            continue
        if ts != last:  # a new tick: no mean has taken a value at it yet (each one's time is older)
            s[i, S_TS] = ts
        taken = _taken(s, i, ts)
        clock, clock_max, util, temp = clocks[row], clock_maxes[row], utils[row], temps[row]
        reasons, power = all_reasons[row], powers[row]
        if not 0.0 <= util <= UTIL_MAX:  # (NaN too)
            util = np.nan
        if util == util and (taken & T_UTIL) == 0:
            last_util = s[i, S_UTIL_TS]
            if last_util != last_util or s[i, S_UTIL] != s[i, S_UTIL]:
                s[i, S_UTIL] = util
            else:
                if ts - last_util != util_step:
                    util_step = ts - last_util
                    w_util_step = 1.0 - np.exp(-util_step / tau)
                s[i, S_UTIL] += w_util_step * (util - s[i, S_UTIL])
            s[i, S_UTIL_TS] = ts
            taken |= T_UTIL
            if util >= busy_util:  # the tick is busy: its busy means move at it, by this weight
                last_busy = s[i, S_BUSY_TS]
                if last_busy != last_busy:
                    s[i, S_BUSY_W] = 1.0
                else:
                    if ts - last_busy != busy_step:
                        busy_step = ts - last_busy
                        w_busy_step = 1.0 - np.exp(-busy_step / tau)
                    s[i, S_BUSY_W] = w_busy_step
                s[i, S_BUSY_TS] = ts
                s[i, S_N] += 1.0
        if s[i, S_BUSY_TS] != ts:  # idle, or not known to be busy
            continue
        w = s[i, S_BUSY_W]
        x = clock / clock_max if 0.0 < clock_max < np.inf else np.nan  # (NaN with a NaN clock)
        if (taken & T_CLOCK) == 0 and 0.0 <= x <= CLOCK_RATIO_MAX:
            s[i, S_CLOCK] = x if s[i, S_CLOCK] != s[i, S_CLOCK] else s[i, S_CLOCK] + w * (x - s[i, S_CLOCK])
            s[i, S_CLOCK_TS] = ts
            taken |= T_CLOCK
        if (taken & T_TEMP) == 0 and TEMP_MIN_C < temp < TEMP_MAX_C:
            s[i, S_TEMP] = temp if s[i, S_TEMP] != s[i, S_TEMP] else s[i, S_TEMP] + w * (temp - s[i, S_TEMP])
            s[i, S_TEMP_TS] = ts
            taken |= T_TEMP
        # (0 W: an exporter's N/A, no reading — as the thermal fit reads it)
        if (taken & T_POWER) == 0 and 0.0 < power < 1e5:
            s[i, S_POWER] = power if s[i, S_POWER] != s[i, S_POWER] else s[i, S_POWER] + w * (power - s[i, S_POWER])
            s[i, S_POWER_TS] = ts
            taken |= T_POWER
        bits = reason_bits(reasons)
        if (taken & T_THROTTLE) == 0 and bits >= 0:
            x = 1.0 if (bits & THROTTLING) != 0 else 0.0
            s[i, S_THROTTLE] = x if s[i, S_THROTTLE] != s[i, S_THROTTLE] else s[i, S_THROTTLE] + w * (x - s[i, S_THROTTLE])
            s[i, S_THROTTLE_TS] = ts
            taken |= T_THROTTLE
    return skipped


@kernel
def _inlet_kernel(obs: np.ndarray, s: np.ndarray, tau: float, usual_tau: float) -> None:
    """Each rack's inlet averaged over ``tau`` and its usual inlet (``R_*``, see :data:`R_SIZE`),
    from ``[ts, slot, inlet, ...]`` rows (:func:`~.gpu_inputs.rack_inlet_obs`). A row without an
    inlet (missing, or 0 °C: a BMC's unread sensor) or not after the rack's last is skipped, and so
    is one held back as a jump (:func:`~.gpu_inputs.reading_jump`)."""
    for row in range(obs.shape[0]):
        ts, r, v = obs[row, 0], int(obs[row, 1]), obs[row, 2]
        last = s[r, R_TS]
        if not INLET_MIN_C < v < INLET_MAX_C or ts <= last:  # (NaN: False)
            continue
        if reading_jump(s, r, ts, v, s[r, R_LAST], last, R_HELD, R_HELD_TS) == HELD:
            continue
        s[r, R_LAST] = v
        s[r, R_TS] = ts
        if last != last or s[r, R_INLET] != s[r, R_INLET]:
            s[r, R_INLET] = s[r, R_USUAL] = v
            continue
        s[r, R_INLET] += (1.0 - np.exp(-(ts - last) / tau)) * (v - s[r, R_INLET])
        if s[r, R_INLET] < s[r, R_USUAL]:
            s[r, R_USUAL] = s[r, R_INLET]
        else:
            s[r, R_USUAL] += (1.0 - np.exp(-(ts - last) / usual_tau)) * (s[r, R_INLET] - s[r, R_USUAL])


def upgrade_layout1(state: dict[str, Any]) -> dict[str, Any]:
    """``state``'s ``s_gpu`` of layout 1 (:data:`LAYOUT1_S_SIZE`, or narrower: older) in this layout.
    Widened to layout 1 first, as that version did: one saved before ``S_UTIL_TS`` (eight columns)
    reads its utilisation as read at its last sample, and every mean as taken at that tick; one saved
    before ``S_TAKEN`` (ten) reads every mean as taken at its last tick; one saved before the means' own
    times (eleven) reads each busy mean as taken at its last busy sample. Then ``S_TAKEN`` goes: the
    means taken at tick ``S_TS`` are those whose time is ``S_TS`` (:func:`_taken`), which is what every
    state the detector wrote itself held there. Only a state widened from before ``S_TAKEN`` and its
    times (ten or eleven columns) could differ, and only until its GPU's next tick: there a row of that
    very tick would add (or not add) a mean its bits said otherwise; no such row follows a restore
    unless a frame of one tick was split across it."""
    saved = np.asarray(state.get("s_gpu"))
    if saved.ndim != 2 or saved.shape[1] > LAYOUT1_S_SIZE:
        return state  # (load_state_dict judges its shape)
    old_util_ts, old_busy_ts, old_taken = 8, 6, LAYOUT1_S_TAKEN  # layout 1's columns (the same up to 9)
    state = add_columns(state, "s_gpu", LAYOUT1_S_TAKEN + 1, {old_busy_ts: S_TS, old_util_ts: S_TS})
    if saved.shape[1] <= old_taken:
        state["s_gpu"][:, old_taken] = T_ALL
    state = add_columns(state, "s_gpu", LAYOUT1_S_SIZE, {11 + m: old_busy_ts for m in range(4)})
    return {**state, "s_gpu": np.delete(np.asarray(state["s_gpu"], dtype=np.float64), old_taken, axis=1)}


def gpu_as_layout1(s_gpu: np.ndarray) -> np.ndarray:
    """``s_gpu`` as layout 1 kept it (:func:`upgrade_layout1` undone, exactly): ``S_TAKEN`` back at
    :data:`LAYOUT1_S_TAKEN`, the ``T_*`` bits of the means whose time is the GPU's tick ``S_TS``
    (:func:`_taken`): what layout 1 held there after every row (zeroed at a new tick, each bit set with
    its mean's time), 0 before a GPU's first tick (NaN equals nothing) and for a GPU started afresh."""
    s = np.asarray(s_gpu, dtype=np.float64)
    ts = s[:, S_TS]
    taken = np.zeros(len(s))
    for col, bit in ((S_UTIL_TS, T_UTIL), (S_CLOCK_TS, T_CLOCK), (S_TEMP_TS, T_TEMP), (S_POWER_TS, T_POWER),
                     (S_THROTTLE_TS, T_THROTTLE)):
        taken += np.where(s[:, col] == ts, float(bit), 0.0)
    return np.insert(s, LAYOUT1_S_TAKEN, taken, axis=1)


class StragglerDetector(Detector):
    """Flags GPUs slower, hotter or more throttled than their job peers."""

    # (``gpu_job_saved``: each GPU's job slot when the state was saved, under the saved job list)
    slot_kinds: ClassVar[Mapping[str, str]] = {"s_gpu": "gpu", "s_flag": "gpu", "s_rack": "rack",
                                               "gpu_job_saved": "gpu", "s_clock_raw": "gpu"}
    name: ClassVar[str] = "straggler"
    kinds: ClassVar[tuple[str, ...]] = ("gpu", "rack")  # rack frames: the inlets (R_*)
    state_scalars: ClassVar[tuple[str, ...]] = ("next_ts", "state_layout")
    state_layout: int = STATE_LAYOUT
    state_extras: ClassVar[tuple[str, ...]] = ("gpu_job_saved", "jobs")

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, **params: Any) -> None:
        super().__init__(topology)
        self.p = resolve_params("straggler", PARAMS, params)
        self.params_vec = np.array([float(self.p[name]) for name in PV_NAMES])
        self.health = health or PipelineHealth()
        n = topology.size("gpu")
        self.gpu_job = topology.gpu_job.astype(np.int64)
        self.gpu_rack = topology.gpu_rack.astype(np.int64)
        self.s_gpu = np.full((n, S_SIZE), np.nan)
        self.s_gpu[:, S_N] = 0.0
        self.s_flag = np.full((n, 3), np.nan)  # time each outlier kind was last reported
        self.s_rack = np.full((topology.size("rack"), R_SIZE), np.nan)
        # 1 where a GPU's clock mean is of clocks read without their maximum (over RAW_CLOCK_HZ), else 0
        self.s_clock_raw = np.zeros(n, dtype=np.float32)
        self.next_ts = -np.inf
        self._scratch = Scratch()

    def state_dict(self) -> dict[str, Any]:
        """... and the jobs it was judged in: each GPU's job slot and the job list's keys
        (``Topology.job_keys``), so that a GPU loaded into another job starts afresh there."""
        return {**super().state_dict(), "gpu_job_saved": self.gpu_job.copy(), "jobs": self.topology.job_keys()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """... and a GPU whose job is not the one it was saved in (a job list changed while the
        worker was down: ``foreshock topology jobs``, a restart) starts afresh: its flags and its
        busy means were of the old job. Kept, a flag raised in the old job held the new job's report
        back for up to ``refresh_s`` (the last one standing named the old job) and held its lowered
        bar there — a GPU 4.6 % slower than its new peers, under the 5 % gap, named for good; and
        the old job's busy clock, 0.75 under a compute-bound job, made the new job's GPUs on that
        node stragglers at its start (until 2026-12-04). A state saved before the jobs were kept
        (no ``jobs``) is taken as of the jobs listed now."""
        super().load_state_dict(state)
        saved_jobs, saved_gpu_job = state.get("jobs"), state.get("gpu_job_saved")
        if saved_jobs is None or saved_gpu_job is None:
            return
        saved_gpu_job = np.asarray(saved_gpu_job, dtype=np.int64)
        # each saved job's slot here, and -1 (no job) last, for a GPU saved in none
        here = np.append(self.topology.job_slot_map(list(saved_jobs)), -1)
        then = here[np.where((saved_gpu_job >= 0) & (saved_gpu_job < len(here) - 1), saved_gpu_job, -1)]
        moved = then != self.gpu_job
        self.s_flag[moved] = np.nan
        self.s_gpu[moved] = np.nan
        self.s_gpu[moved, S_N] = 0.0
        self.s_clock_raw[moved] = 0.0

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state saved before ``S_BUSY_TS`` existed (six columns), read as if every GPU's last sample
        had been busy: its means go on from where they were rather than being thrown away. One saved
        before ``S_POWER`` (seven) starts its power mean at the next busy sample. One saved before
        the racks' inlets were kept (no ``s_rack``) knows none: learnt from the next rack frame on.
        One saved before ``S_UTIL_TS`` (eight) reads its utilisation as read at its last sample, and
        every mean as taken at that tick: a row of the same tick adds nothing (as it did then). One
        saved before the means' own times (eleven) reads each busy mean as taken at its last busy
        sample. One saved before clocks without their maximum were read (no ``s_clock_raw``) holds
        ratios only. One of layout 1 (no ``state_layout``) has ``S_TAKEN`` taken out
        (:func:`upgrade_layout1`)."""
        if "s_rack" not in state:
            state = {**state, "s_rack": np.full_like(self.s_rack, np.nan)}
        if "s_clock_raw" not in state:
            saved_gpu = np.asarray(state.get("s_gpu"))
            rows = len(saved_gpu) if saved_gpu.ndim == 2 else len(self.s_clock_raw)
            state = {**state, "s_clock_raw": np.zeros(rows)}
        # one saved before the last reading and the held one were kept (three columns): the next
        # reading is read as it comes
        state = add_columns(state, "s_rack", R_SIZE)
        if "state_layout" not in state:
            return {**upgrade_layout1(state), "state_layout": STATE_LAYOUT}
        if state["state_layout"] != STATE_LAYOUT:
            raise ValueError(f"straggler: state layout {state['state_layout']!r} is not one this version reads "
                             f"({STATE_LAYOUT})")
        return state

    def previous_layout_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """... layout 1: ``s_gpu`` with ``S_TAKEN`` (:func:`gpu_as_layout1`), no ``state_layout``."""
        out = {k: v for k, v in state.items() if k != "state_layout"}
        if "s_gpu" in state and np.ndim(state["s_gpu"]) == 2:
            out["s_gpu"] = gpu_as_layout1(state["s_gpu"])
        return out

    def remap_state(self, state: dict[str, Any], remap: Remap) -> dict[str, Any]:
        """... and a state saved without ``s_rack`` on other hardware: none known on its racks either."""
        if "s_rack" not in state:
            state = {**state, "s_rack": np.full((len(remap.new_of_old["rack"]), R_SIZE), np.nan)}
        return super().remap_state(state, remap)

    def update(self, frame: Frame) -> list[Finding]:
        if frame.kind == "rack" and len(frame):
            _inlet_kernel(rack_inlet_obs(frame, len(self.s_rack), self.health, self.name), self.s_rack,
                          self.p["tau_s"], self.p["inlet_usual_tau_s"])
            return []
        if frame.kind != "gpu" or len(frame) == 0:
            return []
        obs = self._without_rows_ahead(gpu_columns(frame, OBS_FIELDS, len(self.s_gpu), self.health, self.name,
                                                   self._scratch))
        obs = self._raw_clocks(obs)
        skipped = _ew_kernel(obs, self.s_gpu, self.p["tau_s"], self.p["busy_util"])
        if skipped:
            self.health.problem(self.name, "gpu samples out of time order", skipped)
        if not len(obs[0]):
            return []
        now = frame_now(obs[0], self.p["interval_s"])
        if now < self.next_ts:
            return []
        self.next_ts = now + self.p["interval_s"]
        return self._compare(now)

    def _without_rows_ahead(self, obs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """``obs`` less the rows stamped further than :data:`~foreshock.guard.MAX_AHEAD_S` past the
        frame's own time (:func:`~.gpu_inputs.frame_now`, with the input guard's bound as its slack),
        counted. Taken, one row a day ahead (a host's clock wrong for a poll) set its GPU's last tick
        a day on: every true row after it was "out of order" while the GPU, fresh, was still compared
        on its frozen means (until 2026-12-04). A frame of one GPU has no time but its own: the
        input guard, upstream, holds a stream's rows to its present."""
        ts = obs[0]
        if not len(ts) or float(ts.max()) - float(ts.min()) <= MAX_AHEAD_S:
            return obs
        keep = ts <= frame_now(ts, MAX_AHEAD_S)
        ahead = int(len(ts) - np.count_nonzero(keep))
        if not ahead:
            return obs
        self.health.problem(self.name, "gpu rows stamped too far ahead of their frame", ahead,
                            f"more than {MAX_AHEAD_S:g} s past the frame's median stamp (a wrong host clock)")
        return tuple(column[keep] for column in obs)

    def _raw_clocks(self, obs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """``obs`` with the rows whose clock comes without a maximum read over :data:`RAW_CLOCK_HZ`
        (a copy of the max column), and each GPU's kind of clock mean (``s_clock_raw``) kept: a GPU
        whose clock changes kind (an exporter that gained or lost the max) starts its mean afresh,
        never averaging a ratio with a raw clock. A GPU that brings both kinds in one frame (two
        sources) is read by its maximum. Rows all with their maximum, on GPUs all read so, cost
        two comparisons."""
        slots, clock, clock_max = obs[1], obs[2], obs[3]
        with np.errstate(invalid="ignore"):
            has_max = (clock_max > 0.0) & (clock_max < np.inf)
            raw = ~has_max & (clock > 0.0) & (clock <= RAW_CLOCK_HZ * CLOCK_RATIO_MAX)
            any_raw = bool(raw.any())
            if not any_raw and not self.s_clock_raw.any():
                return obs
            ratio = has_max & (clock >= 0.0) & (clock < np.inf)
        at = slots.astype(np.int64)
        with_max = np.zeros(len(self.s_clock_raw), np.bool_)
        with_max[at[ratio]] = True
        raw &= ~with_max[at]
        kind = np.full(len(self.s_clock_raw), np.nan)
        kind[at[ratio]] = 0.0
        kind[at[raw]] = 1.0
        flip = (kind == kind) & (kind != self.s_clock_raw)
        self.s_gpu[flip, S_CLOCK] = np.nan  # its mean restarts at its next busy clock
        self.s_clock_raw[flip] = kind[flip]
        if not raw.any():
            return obs
        return (*obs[:3], np.where(raw, RAW_CLOCK_HZ, clock_max), *obs[4:])

    def _clock_kinds_apart(self) -> np.ndarray:
        """``s_gpu``, or where a job's GPUs hold clock means of both kinds, a copy in which those
        of the kind fewer of them hold (ties: the raw clocks) have no clock: one median of ratios
        and raw clocks would name every GPU of the smaller kind."""
        j = self.gpu_job
        has = (j >= 0) & np.isfinite(self.s_gpu[:, S_CLOCK])
        if not (has & (self.s_clock_raw == 1.0)).any():
            return self.s_gpu
        n_jobs = len(self.topology.jobs)
        raw = np.bincount(j[has], weights=self.s_clock_raw[has], minlength=n_jobs)
        total = np.bincount(j[has], minlength=n_jobs)
        mixed = (raw > 0) & (raw < total)
        if not mixed.any():
            return self.s_gpu
        keep_raw = 2 * raw > total
        at = np.maximum(j, 0)
        drop = has & mixed[at] & ((self.s_clock_raw == 1.0) != keep_raw[at])
        s = self.s_gpu.copy()
        s[drop, S_CLOCK] = np.nan
        return s

    def _compare(self, now: float) -> list[Finding]:
        n_jobs = len(self.topology.jobs)
        if n_jobs == 0:
            return []  # no jobs known (e.g. a topology derived from dcgm labels): no peers to compare
        out = self._scratch.take("outliers", (len(CHECK_FIELDS) * len(self.s_gpu), O_SIZE))
        job = self._scratch.take("busy_job", (len(self.s_gpu), 1), dtype=np.int64)[:, 0]
        n_out = _compare_kernel(self._clock_kinds_apart(), self.gpu_job, n_jobs, self.s_flag, now, self.params_vec,
                                job, out, self.gpu_rack, self.s_rack)
        findings: list[Finding] = []
        peers = np.bincount(job[job >= 0], minlength=n_jobs)  # busy GPUs per job
        for g, col, excess, x, d, inlet, split in out[:n_out]:
            g, col = int(g), int(col)
            name, label = CHECK_NAMES[col]
            j = int(self.gpu_job[g])
            # a job split in two halves: d is its better half's median (see _compare_kernel)
            median = f"{self.topology.jobs[j]}'s better half median" if split else f"{self.topology.jobs[j]} median"
            unit = "" if col != C_TEMP else " °C"
            if col == C_TEMP and inlet == inlet:  # taken over the usual inlet
                rack = int(self.gpu_rack[g])
                whose = "its rack's" if 0 <= rack < len(self.s_rack) and self.s_rack[rack, R_USUAL] == inlet \
                    else "the job's"  # (its rack reports none)
                what = f"temperature {x:.3g} °C, {x - inlet:.3g} °C over {whose} usual inlet {inlet:.3g} °C"
                if abs(x - inlet - d - excess) >= 0.05:  # read down to the job's median power
                    what += f" at {self.s_gpu[g, S_POWER]:.0f} W ({d + excess:.3g} °C read at the job's load)"
                what += f", vs job {median} {d:.3g} °C over their usual inlets"
            elif col == C_TEMP and abs(x - d - excess) >= 0.05:  # read down to the job's median power
                what = (f"temperature {x:.3g} °C at {self.s_gpu[g, S_POWER]:.0f} W ({d + excess:.3g} °C read at "
                        f"the job's load) vs job {median} {d:.3g} °C")
            elif col == C_CLOCK and self.s_clock_raw[g] == 1.0:  # read without its maximum: in MHz
                what = (f"clock {x * RAW_CLOCK_HZ / 1e6:.4g} MHz vs job {median} "
                        f"{d * RAW_CLOCK_HZ / 1e6:.4g} MHz (no max clock reported: clocks compared as read)")
            else:
                what = f"{label} {x:.3g}{unit} vs job {median} {d:.3g}{unit}"
            findings.append(Anomaly(
                now, "gpu", g, name, float(excess), self.name,
                # (the job's busy GPUs, this one among them: "16 busy peers" had counted it as its own peer)
                f"{what} ({int(peers[j])} busy GPUs in the job{', split in two halves' if split else ''})"
                + (": this GPU sets the job's step time" if col == C_CLOCK else " at the same load")))
        return findings


@inline
def _fresh(s: np.ndarray, g: int, field: int, now: float, window: float) -> float:
    """GPU ``g``'s busy mean ``field`` where it took a value within ``window`` of ``now``, else NaN:
    a mean whose field stopped coming (the GPU still busy on its utilisation) stands still, and was
    compared for good — a clock frozen low named its GPU "slower" every ``refresh_s``."""
    when = s[g, S_CLOCK_TS] if field == S_CLOCK else s[g, S_TEMP_TS] if field == S_TEMP \
        else s[g, S_THROTTLE_TS] if field == S_THROTTLE else s[g, S_POWER_TS]
    return s[g, field] if now - when <= window else np.nan  # type: ignore[no-any-return]


@jit
def _split_half(vals: np.ndarray, members: np.ndarray, first: int, end: int, k: int, faster_high: bool,
                least: float, buf: np.ndarray, work: np.ndarray, med: np.ndarray, mad: np.ndarray, j: int) -> bool:
    """Where job ``j``'s ``k`` finite values (``vals`` of ``members[first:end]``, ``k`` even) split
    in two halves, their two middle values at least ``least`` apart (relative to the better one where
    ``faster_high``: a clock), set ``med[j]`` and ``mad[j]`` to its better half's (the higher values
    where ``faster_high``, else the lower) and return True; else leave them and return False."""
    m = 0
    for i in range(first, end):
        v = vals[members[i]]
        if abs(v) < np.inf:
            buf[m] = v
            m += 1
    lo = select_kth(buf, 0, k - 1, k // 2 - 1)
    hi = buf[k // 2]  # the smallest of the upper half, which select_kth left above lo
    for i in range(k // 2 + 1, k):
        hi = min(hi, buf[i])
    hole = hi - lo
    if not (hole > 0.0 and hole >= least * (hi if faster_high else 1.0)):
        return False
    m = 0
    for i in range(k):  # the better half, to the front (k / 2 values: nothing lies between lo and hi)
        v = buf[i]
        if (v >= hi) if faster_high else (v <= lo):
            buf[m] = v
            m += 1
    d = median_of(buf, m, work)
    for i in range(m):
        buf[i] = abs(buf[i] - d)
    med[j] = d
    mad[j] = median_of(buf, m, work)
    return True


@jit
def _compare_kernel(s: np.ndarray, gpu_job: np.ndarray, n_jobs: int, flag: np.ndarray, now: float,
                    p: np.ndarray, job: np.ndarray, out: np.ndarray, gpu_rack: np.ndarray, rack: np.ndarray) -> int:
    """Compare each busy GPU (utilisation read within ``3 * interval_s``, its mean at least
    ``busy_util``, ``min_samples`` busy samples) with its job's busy GPUs (median and MAD per job)
    on each check, on the means that took a value within ``3 * interval_s`` too (:func:`_fresh`: a
    stale one is no value, neither the GPU's nor in its job's median); one not busy is no outlier
    (its standing report ends, as when it goes silent); update ``flag`` (when each GPU was last
    reported per check, NaN while it is no outlier: one reported stays an outlier down to
    ``clear_fraction`` of the gap and of ``k_mad``); write the outliers due a report into ``out``
    (``O_*`` columns), check by check, GPUs in slot order; return their count. ``job`` receives each
    GPU's job where it is busy, else -1. The temperature check compares each GPU's temperature read
    down to its job's median busy power (see the module doc; ``O_X`` holds the temperature,
    ``O_MEDIAN`` the job's median of the read values), taken over the usual inlet of the GPU's rack
    (``rack[:, R_USUAL]``, by ``gpu_rack``), else over its job's median usual inlet, else (no rack
    of the job knows one) as it is; ``O_INLET`` holds the inlet taken (NaN: none).

    A job split in two halves is judged against its better half (``O_HALF`` 1, ``O_MEDIAN`` that
    half's median): an even count of values whose two middle ones lie at least ``split_gaps`` gaps
    apart (the clock's relative to the faster one). Its median sits midway between the halves and its
    MAD is half their distance, which no deficit reaches ``k_mad`` times; the better half's own median
    and MAD are its GPUs' noise, which the other half's deficit is then judged against. Only the
    median's own neighbours split a job: a job spread wide (a loop-wide cooling loss, its GPUs throttled
    by degrees) keeps its median and MAD. A bar capped at two gaps instead (2026-12-05) named the halves
    but also the slowest 10-14 % of such jobs (GPUs flagged on simulated recordings: rec34 56 -> 95,
    rec51 50 -> 84); split halves alone flag 63 and 65, each GPU added on the half of a job under a fault
    (node114's fan; job13's two loops, cdu6 then cdu7, each losing cooling), none near no fault.

    The busy GPUs are bucketed by job once (a counting sort) and every check reads its values
    through the buckets: six group medians, each bucketing the GPUs again, took 130 ns per GPU.
    Each job's median and MAD come from :func:`median_of` (counting, not quickselect: a job's
    few dozen noisy values made two quickselects cost ~325 ns per 16 values, against ~210)."""
    n = s.shape[0]
    window = 3.0 * p[PV_INTERVAL]
    for g in range(n):
        # busy on a utilisation read lately: one whose util stopped coming (NaN) is not known to be
        # busy, and its busy means stand still; kept "busy" on its last util, a recovered GPU was
        # named "slower" on its frozen clock mean every refresh_s (until 2026-12-04)
        busy = now - s[g, S_UTIL_TS] <= window and s[g, S_UTIL] >= p[PV_BUSY_UTIL] \
            and s[g, S_N] >= p[PV_MIN_SAMPLES] and 0 <= gpu_job[g] < n_jobs
        job[g] = gpu_job[g] if busy else -1
    start, members, largest = bucket_by_group(job, n_jobs)
    buf = np.empty(largest)
    work = np.empty(largest + 1)  # median_of's workspace: n + 1 values never fall back to np.median
    med = np.empty(n_jobs)
    mad = np.empty(n_jobs)
    half = np.zeros(n_jobs, np.bool_)  # the job is split: med and mad are its better half's
    power_med = np.full(n_jobs, np.nan)  # each job's median busy power
    inlet_med = np.full(n_jobs, np.nan)  # ... and median usual inlet
    inlet = np.full(n, np.nan)  # each GPU's usual inlet: its rack's, else its job's median
    vals = np.empty(n)  # the values compared: the field's, the temperature read at the job's median power
    n_out = 0
    heavier = np.zeros(n, np.bool_)  # its heavier work holds its clock down: not compared on it
    # -2, -1: the job's median usual inlet and median busy power, for the temperature
    for col in range(-2, len(CHECK_FIELDS)):
        field = S_POWER if col < 0 else CHECK_FIELDS[col]
        for g in range(n):
            if col == -2:
                inlet[g] = rack[gpu_rack[g], R_USUAL] if 0 <= gpu_rack[g] < rack.shape[0] else np.nan
                vals[g] = inlet[g]
            else:
                vals[g] = _fresh(s, g, field, now, window)
            if col == C_CLOCK and job[g] >= 0:  # (NaN: no power known, compared as it is)
                heavier[g] = _fresh(s, g, S_POWER, now, window) > power_med[job[g]] \
                    * (1.0 + p[PV_CLOCK_POWER_BAND]) and _fresh(s, g, S_THROTTLE, now, window) < p[PV_THROTTLE_GAP]
            if col == C_TEMP and job[g] >= 0:
                above = _fresh(s, g, S_POWER, now, window) - power_med[job[g]] * (1.0 + p[PV_POWER_BAND])
                if above > 0.0:  # (NaN: no power known, read as it is)
                    vals[g] -= p[PV_TEMP_PER_W] * above
                if inlet[g] != inlet[g]:  # its rack reports none: the job's (NaN: none of them does)
                    inlet[g] = inlet_med[job[g]]
                if inlet[g] == inlet[g]:
                    vals[g] -= inlet[g]
        for j in range(n_jobs):  # median and MAD of the job's finite values
            k = 0
            for m in range(start[j], start[j + 1]):
                v = vals[members[m]]
                if abs(v) < np.inf:
                    buf[k] = v
                    k += 1
            med[j] = mad[j] = np.nan
            if k > 0:
                d = median_of(buf, k, work)
                med[j] = d
                k = 0
                for m in range(start[j], start[j + 1]):
                    v = vals[members[m]]
                    if abs(v) < np.inf:
                        buf[k] = abs(v - d)
                        k += 1
                mad[j] = median_of(buf, k, work)
            half[j] = False
            if col >= 0 and k >= 2 and k % 2 == 0:
                # split: at least split_gaps gaps between the two middle values (the clock's relative)
                least = p[PV_SPLIT_GAPS] * p[PV_CLOCK_GAP + col]
                # a split puts every value half the hole or more from the midway median, its MAD too:
                # a MAD under a quarter of the least hole (rounding has no say) rules one out cheaply
                if mad[j] >= 0.25 * least * (med[j] if col == C_CLOCK else 1.0) and least > 0.0:
                    half[j] = _split_half(vals, members, start[j], start[j + 1], k, col == C_CLOCK, least,
                                          buf, work, med, mad, j)
        if col == -2:
            inlet_med[:] = med
            continue
        if col == -1:
            power_med[:] = med
            continue
        sign, gap = CHECK_SIGNS[col], p[PV_CLOCK_GAP + col]
        for g in range(n):
            x = vals[g] if job[g] >= 0 else np.nan
            d = med[max(job[g], 0)]
            spread = mad[max(job[g], 0)]
            # an outlier already reported stays one down to clear_fraction of the bars (hysteresis):
            # without, a GPU 5 % slower with 1 % noise was named 11 times in an hour, not 6
            bar = p[PV_CLEAR_FRACTION] if flag[g, col] == flag[g, col] else 1.0
            if col == C_CLOCK:  # the relative deficit
                excess = (d - x) / (d if d > 0.0 else np.nan)
                outlier = job[g] >= 0 and excess >= bar * gap and d - x >= bar * p[PV_K_MAD] * spread \
                    and not heavier[g]
            else:
                excess = sign * (x - d)
                outlier = job[g] >= 0 and excess >= bar * gap and excess >= bar * p[PV_K_MAD] * spread
            if not outlier:
                flag[g, col] = np.nan
                continue
            last = flag[g, col]
            if last != last or now - last >= p[PV_REFRESH]:
                flag[g, col] = now
                out[n_out, O_GPU] = g
                out[n_out, O_CHECK] = col
                out[n_out, O_EXCESS] = excess
                out[n_out, O_X] = s[g, field]
                out[n_out, O_MEDIAN] = d
                out[n_out, O_INLET] = inlet[g] if col == C_TEMP else np.nan
                out[n_out, O_HALF] = 1.0 if half[job[g]] else 0.0
                n_out += 1
    return n_out
