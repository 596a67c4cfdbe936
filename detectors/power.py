"""Power cap and power brake, per GPU and per node.

- **Power cap** (``Prediction(event="power_cap")``): the cap acts on the power of compute
  phases, so the detector tracks the upper envelope of the power samples (each a 1-second
  average; the interval mean is diluted by communication phases) and its trend (Holt). Power
  also follows temperature through leakage: the detector reads the same first-order thermal
  model as :mod:`foreshock.detectors.thermal` (one fit serves both, see
  :mod:`foreshock.detectors.thermal_fit`) and adds ``leak_w_per_c`` times the forecast
  temperature rise. The inlet's part of that rise is taken only as far as the dies show it, as
  the thermal detector holds its R to them: the inlet's own trend at most ``trend_confirm`` times
  the die's rise, the steady state at most the die's smoothed temperature plus its lag — a rack
  inlet sensor that steps +8 °C (recalibrated or replaced) while the dies stay put is not the
  loop warming. A drop of the rack's coolant flow, which reads before the inlet moves, is
  forecast as it is. The ETA is the first time the envelope so forecast reaches the enforced
  limit (minus a measurement margin). A GPU held down by the thermal limiter that drew close
  to its limit before is predicted to meet the cap as it cools below max operating
  temperature again (``release_below_c`` under it: the limiter holds a die at the temperature,
  not under it). A GPU that has sent nothing for the thermal fit's ``gap_s`` has its
  prediction withdrawn as no longer reporting (``ThermalFitDetector.withdraw_silent_gpus``).
  A GPU already at the cap (bit 0x4) is not predicted — it is there; without
  throttle reasons (dcgm-exporter's default counters), a sample pinned at the limit with the SM
  clock below its max is the cap binding (:func:`cap_binds`). A sample under the cap within
  ``cap_hold_s`` of one it bound at (a job's communication phase) is still at it, with reasons or
  without. An envelope already at the
  limit (``margin_w`` 0: the envelope of ±5 W-noisy samples sits ~5 W above the power it
  tracks) is predicted with ETA 0 and says so.
- **Not predicted: a flat GPU a few watts under its limit.** Its onset is set by sub-degree
  temperature drift (leakage ~2 W/°C, readings in whole °C) and by the share of each 1-s sample
  spent waiting for slower job peers — below what ±5 W samples resolve. Measured on 1,024-GPU
  6-h ``mixed --random-faults`` recordings (seeds 21, 33, 34, 51), a claim whenever the 2-min
  envelope of uncapped loaded samples is within 10 W of the limit comes true within the 300-s
  horizon 3–5 % of the time (31–223 false alarms per 1000 GPU-hours; within 5 W: 2–10 % on
  the seeds where it claims anything); restricted to GPUs whose cap bit was seen within the
  last 30 min, 17–39 %. So ``margin_w`` stays 0 and such GPUs are left to the leakage forecast.
- **Power brake** (bit 0x80): an immediate :class:`~foreshock.findings.Anomaly` on the GPU
  when the bit rises, and one on the node when several of its GPUs brake together — the
  signature of a failing power supply or a PDU emergency rather than of one GPU. "Together" is
  judged on whole polls: the node's count once a poll's rows are all read, not as each row comes.
- A die temperature outside -50…200 °C is no reading, for the slope and the forecast alike.

Example (a GPU whose power creeps up 0.5 W/s from 640 W toward its 700 W limit)::

    >>> import numpy as np
    >>> from foreshock.topology import Topology
    >>> from foreshock.frames import Frame
    >>> topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
    ...                            "nodes": [{"name": "n", "rack": "k", "gpus": 1}]})
    >>> det, found = PowerDetector(topo, trend_weight=1.0), []  # extrapolate the envelope's own trend
    >>> for t in np.arange(0.0, 600.0, 5.0):
    ...     p = min(700.0, 640.0 + 0.5 * max(0.0, t - 300.0))
    ...     found += det.update(Frame("gpu", [t], [0], {"power": [p], "power_limit": [700.0]}))
    >>> first = next(f for f in found if f.event == "power_cap")
    >>> 30.0 <= 420.0 - first.ts <= det.horizon_s     # the cap comes at t = 420 s
    True
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from foreshock import facts
from foreshock.findings import Anomaly, Finding, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.remap import Remap
from foreshock.topology import Topology

from .alarm import (alarms_as_layout1, CODE_NONE, CODE_START, CODE_WITHDRAW, O_CODE, O_CONF, O_ETA, O_ROW, O_V0,
                    O_WHICH, OUT_SIZE, compact_from_alarm_columns, compact_step, emit, new_compact_alarms)
from .base import add_columns, resolve_params
from . import gpu_inputs as gi
from .gpu_inputs import reason_bits, Scratch, inline, kernel, site_loop_rise, site_loop_tau
from . import thermal as th
from . import thermal_fit as tf
from .thermal_fit import FIT_SLOT_KINDS, R_DT, R_TPREV, X_REASONS, ThermalFit, ThermalFitDetector

# envelope, its Holt level/slope, loaded samples with whether it brakes and whether the thermal
# limiter holds it (S_FLAGS: see PK_*), envelope before the thermal throttle, temperature slope (°C/s)
S_ENV, S_LEVEL, S_SLOPE, S_FLAGS, S_ENV_PRE, S_TB, S_ETA, S_EVAL_TS = range(8)
# ... the last forecast ETA and when it was solved; 1 once the GPU drew well over the default
# limit while reporting none (else 0 or NaN, or minus the count of readings past it while that is
# judged: see DEFAULT_LIMIT_SLACK_W and OVER_DEFAULT_READINGS); when its throttle reasons
# were last read (see reasons_stale_s); its die temperature smoothed (see confirmed_r_level);
# when its power cap last bound (see cap_hold_s); when its brake was last let go (a brake back
# within off_hold_s is not announced again: see _power_kernel)
S_OVER_DEFAULT, S_BITS_TS, S_T_SEEN, S_CAP_TS, S_BRAKE_OFF_TS = range(8, 13)
# ... and the confidence its cap forecast had when the brake or the thermal limiter took hold (the
# node-brake and thermal-release predictions rest on what it drew before, not on samples since)
S_CONF_PRE = 13
# ... and its die temperature between whole degrees (see the kernel: where the leakage forecast starts)
S_T_EST = 14
S_SIZE = 15
PK_BRAKE, PK_THERMAL, PK_SAMPLES = 1, 2, 4
"""``S_FLAGS``, a whole number: braking (PK_BRAKE), thermally throttled (PK_THERMAL), and the count
of loaded samples times PK_SAMPLES — exact as a float64 up to 2^51 samples. Read and written only
through :func:`loaded_samples`, :func:`is_braking`, :func:`is_thermal` and their setters (and
:func:`braking_of` over every GPU). Until 2026-12-06 three columns (layout 1's S_N, S_BRAKE,
S_THERMAL: 3, 4, 5)."""
DEFAULT_LIMIT_SLACK_W = 5.0 * facts.POWER_NOISE_W
"""A GPU that reports no power limit (dcgm-exporter's default counters do not) is taken to have
Hopper's 700 W — until its compute-phase power is this far over it, in more than one sample
(:data:`OVER_DEFAULT_READINGS`): then it is not a 700 W part (a 1,000 W Blackwell, say), its limit is
unknown, and no cap is forecast for it until it reports one (or its readings pause for the fit's gap,
``gap_s``: it may be another board then). Drawing less later (idle, a lighter job) does not make it
a 700 W part: it drew over one's limit. Until 2026-12-01 such a GPU at 850 W was predicted to meet
"the 700 W limit" every minute."""
OVER_DEFAULT_READINGS = 3.0
OVER_DEFAULT_FORGET = 0.1
"""A reading more than ``DEFAULT_LIMIT_SLACK_W`` over the 700 W default, from a GPU that reports no
limit, is no reading (as one past a reported limit by ``OVER_LIMIT_READING_W`` is) until
``OVER_DEFAULT_READINGS`` of them count up, each loaded reading at or under the default (±5 W)
taking ``OVER_DEFAULT_FORGET`` off (``S_OVER_DEFAULT`` holds that count, negated, while it builds; a
gap starts it over): then the GPU is not a 700 W part, and the reading is taken. Ten readings at the
default forget one over it: a glitch every few minutes or rarer is never enough, while a 1,000-W
part whose steps alternate 900 W and 700 W is decided in four steps (with one taken off per reading
at the default, as first written, such a part was never decided: every 900-W reading was dropped and
it was predicted at 700 W, "already at the limit", 35 times an hour). Taken at once, one 1,000-W
glitch of a Hopper lifted the envelope, a running maximum, and its level past the slack, and no cap
was forecast for it again until a 10-minute gap (until 2026-12-05); one of 745 W did so for minutes."""
# node state: GPUs braking now, node event raised, since when its count has read 0 while raised
# (the event ends once none has braked for off_hold_s: see _node_brake_events)
N_COUNT, N_ACTIVE, N_ZERO_TS = 0, 1, 2
N_SIZE = 3
WHICH_CAP, WHICH_GPU_BRAKE, WHICH_NODE_BRAKE = 0, 1, 2
C_SLOPE, C_LEVEL, C_SEEN = 0, 1, 2  # call sites of cached_decay (rows of this kernel's decay cache)
C_SITES = 3
LIMIT_CUT_SLACK_W = facts.POWER_NOISE_W
"""The compute-phase envelope (a running maximum forgetting ``envelope_decay_w_per_s``) and its Holt
level and trend hold what the GPU drew under its old limit. Where the enforced limit (as reported)
falls under the envelope by more than a reading's noise (``nvidia-smi -pl 500`` on a GPU drawing
640 W), what it drew before is no longer drawable: they start again from the sample (at most the new
limit), the trend at 0. Until 2026-12-05 a GPU so cut, without throttle reasons or clocks, was
predicted "compute-phase power 628 W already at the 500 W limit", then 598, 568 ... W for four
minutes, every sample since at or under 499.9 W. Samples held under a limit read at most the
reading's ±5 W over it (this slack): an envelope higher was drawn before the limit fell. A GPU that
reports no limit is left alone: its envelope is not clipped to the 700 W default (a part that is not a
700 W one draws over it: DEFAULT_LIMIT_SLACK_W)."""
CAP_HELD_UNDER_W = 3.0 * facts.POWER_NOISE_W
"""How far under its limit a capped GPU's ``power.draw`` reads: the driver holds the board's power
*under* the limit, and the reading is good to ±5 W. The real H200 capture (tests/data/h200_step)
reads 688-696 W, median 691, under its 700 W limit with the cap bit set: within 5 W of the limit
were 3 of its 753 capped samples, within 15 W 736; no uncapped sample was within 15 W with its
clock cut."""

@inline
def loaded_samples(s: np.ndarray, i: int) -> float:
    """GPU ``i``'s count of loaded samples (the cap forecast's warm-up; 0: idle or restarting)."""
    return np.floor(s[i, S_FLAGS] / PK_SAMPLES)  # type: ignore[no-any-return]


@inline
def set_loaded_samples(s: np.ndarray, i: int, n: float) -> None:
    s[i, S_FLAGS] = n * PK_SAMPLES + (int(s[i, S_FLAGS]) & (PK_BRAKE | PK_THERMAL))


@inline
def is_braking(s: np.ndarray, i: int) -> bool:
    """Whether GPU ``i`` brakes (HW power brake, 0x80), as last read."""
    return (int(s[i, S_FLAGS]) & PK_BRAKE) != 0


@inline
def set_braking(s: np.ndarray, i: int, on: bool) -> None:
    flags = int(s[i, S_FLAGS])
    s[i, S_FLAGS] = (flags | PK_BRAKE) if on else (flags & ~PK_BRAKE)


@inline
def is_thermal(s: np.ndarray, i: int) -> bool:
    """Whether a thermal limiter held GPU ``i`` at its last reading of reasons."""
    return (int(s[i, S_FLAGS]) & PK_THERMAL) != 0


@inline
def set_thermal(s: np.ndarray, i: int, on: bool) -> None:
    flags = int(s[i, S_FLAGS])
    s[i, S_FLAGS] = (flags | PK_THERMAL) if on else (flags & ~PK_THERMAL)


def braking_of(s_gpu: np.ndarray) -> np.ndarray:
    """:func:`is_braking` of every GPU (``s_gpu``: the detector's rows), as booleans."""
    return (np.asarray(s_gpu)[:, S_FLAGS].astype(np.int64) & PK_BRAKE) != 0


def thermal_of(s_gpu: np.ndarray) -> np.ndarray:
    """:func:`is_thermal` of every GPU, as booleans."""
    return (np.asarray(s_gpu)[:, S_FLAGS].astype(np.int64) & PK_THERMAL) != 0


def loaded_samples_of(s_gpu: np.ndarray) -> np.ndarray:
    """:func:`loaded_samples` of every GPU."""
    return np.floor(np.asarray(s_gpu)[:, S_FLAGS] / PK_SAMPLES)


def with_flags(s_gpu: np.ndarray, samples: np.ndarray, braking: np.ndarray, thermal: np.ndarray) -> np.ndarray:
    """``s_gpu`` (a copy) with each GPU's ``S_FLAGS`` made of its loaded ``samples`` (whole numbers) and
    whether it is ``braking`` and ``thermal`` (booleans)."""
    out = np.array(s_gpu, dtype=np.float64)
    out[:, S_FLAGS] = (np.asarray(samples, dtype=np.float64) * PK_SAMPLES + np.where(braking, PK_BRAKE, 0)
                       + np.where(thermal, PK_THERMAL, 0))
    return out


PARAMS: dict[str, float] = {
    "tau_level_s": 20.0,
    "tau_slope_s": 90.0,
    "envelope_decay_w_per_s": 0.5,  # the compute-phase envelope forgets this fast
    "leak_w_per_c": 3.0,  # leakage: power demand rises with temperature
    "trend_weight": 0.0,  # how much of the envelope's own trend to extrapolate (job intensity
    # steps, it does not drift: by default only temperature, through leakage, moves it)
    "horizon_s": 300.0,
    "margin_w": 0.0,  # the envelope of noisy samples sits ~5 W above the power it tracks
    "release_margin_w": 150.0,  # a thermally throttled GPU that drew this close to the limit ...
    "release_eta_s": 60.0,  # ... meets the cap about this soon after it cools below max operating
    "release_inlet_c_per_s": -0.01,  # ... once its inlet falls this fast (cooling restored)
    # ... and its die this far under max operating: the limiter holds a die *at* that target, and a
    # held die reads one degree under it as often as one over. At 1 °C under, the GPUs of failing
    # loops still held (their inlet dipping as a job elsewhere on the loop ended) were called: 112
    # false claims on seeds 53 and 55, none of them followed by a cap, where every claim that came
    # true was made 2 °C under or more (on 62, 120 of 123; until 2026-12-04 the rule read "at or
    # under max operating")
    "release_below_c": 2.0,
    "min_samples": 12.0,
    "load_min_w": 200.0,
    "clear_factor": 2.0,
    "off_hold_s": 60.0,
    "refresh_s": 60.0,
    "on_count": 2.0,  # consecutive firing samples to start a prediction ...
    "urgent_s": 0.0,  # ... or one, when the cap is this close (0: never)
    "node_brake_min": 2.0,  # GPUs of one node braking together make a node event
    # a brake is held while the throttle reasons say so: reasons unread this long (an exporter
    # restarted without its custom counters, or the GPU gone from the feed) let it go — a held
    # brake stops the GPU's own cap forecast, and on a braking node predicts the cap, every
    # minute, for as long as it is held
    "reasons_stale_s": 300.0,
    # without reasons, a sample under the cap this soon after one the cap bound (see cap_binds) is
    # still the cap's: a job's communication phase between capped compute phases
    "cap_hold_s": 60.0,
}
PARAM_NAMES = tuple(PARAMS)
(P_TAU_LEVEL, P_TAU_SLOPE, P_ENV_DECAY, P_LEAK, P_TREND, P_HORIZON, P_MARGIN,
 P_RELEASE_MARGIN, P_RELEASE_ETA, P_RELEASE_INLET, P_RELEASE_BELOW, P_MIN_N, P_LOAD_MIN, P_CLEAR, P_OFF_HOLD,
 P_REFRESH, P_ON, P_URGENT, P_NODE_MIN, P_REASONS_STALE, P_CAP_HOLD) = range(len(PARAMS))


def params_vector(overrides: dict[str, float]) -> np.ndarray:
    vec = np.array(list(resolve_params("power", PARAMS, overrides).values()))
    if vec[P_HORIZON] <= 0 or vec[P_TAU_LEVEL] <= 0 or vec[P_TAU_SLOPE] <= 0:
        raise ValueError("power: horizon_s and the time constants must be positive")
    return vec


@kernel
def cap_eta(level: float, slope: float, limit: float, margin: float) -> float:
    """Seconds until ``level + slope·t`` reaches ``limit - margin`` (0 if there, inf if never)."""
    gap = limit - margin - level
    if gap <= 0.0:
        return 0.0
    if slope <= 0.0:
        return np.inf
    return gap / slope


@inline
def confirmed_r_level(m: np.ndarray, i: int, t_seen: float, du: float, tparams: np.ndarray) -> float:
    """The core model's R level, held to what the die shows (as the thermal detector holds it,
    :func:`foreshock.detectors.thermal.confirmed_resistance`): the steady state ``inlet + R·P`` at
    most the die's smoothed temperature ``t_seen`` plus ``margin_c`` and what the die and its
    smoothing trail a rising inlet ``du`` by. The fit's R follows a step of the inlet over minutes:
    a rack's inlet sensor that steps +8 °C (recalibrated or replaced) while the dies stay put left
    the steady state 7 °C over the dies for minutes, and the leakage that adds called the cap on
    most of a rack's GPUs (until 2026-12-01). The dies are measured against the inlet as it reads
    now, so the step shows at once: the R they show, smoothed as the thermal detector smooths it,
    trails a step by a minute, and a GPU or two near its limit was still called in that minute."""
    off = tf.G_SIZE
    rl, ul, pref, pf = m[i, off + tf.M_RL], m[i, tf.G_UL], m[i, tf.G_PREF], m[i, off + tf.M_PF]
    if t_seen == t_seen and ul == ul and pf > tf.load_min_of(m, i, tparams) and pref > 0.0:
        lag = m[i, off + tf.M_TAU] + tparams[tf.P_TREND_SMOOTH]
        rl = min(rl, (t_seen - ul) / pf + (tparams[tf.P_MARGIN] + max(du, 0.0) * lag) / pref)
    return rl  # type: ignore[no-any-return]


@inline
def led_by_flow(m: np.ndarray, i: int, rack: int, racks: np.ndarray, tparams: np.ndarray) -> bool:
    """Whether the inlet forecast of GPU ``i`` (:func:`foreshock.detectors.thermal.inlet_rate`) comes
    from its rack's coolant flow (dropped: where the heat balance settles the inlet) rather than
    from the inlet's own trend. The flow reads minutes before the inlet moves and is no reading of
    the inlet sensor: it is not held to the dies' rise."""
    # (where the flow settles the inlet, NaN at nominal flow, is carried no distance here: only
    # whether there is one matters)
    settles = gi.flow_asymptote(racks, rack, tparams[tf.P_RISE], 0.0, 0.0, m[i, tf.G_TS], tparams[tf.P_STALE])
    return settles == settles and m[i, tf.G_UL] == m[i, tf.G_UL]  # type: ignore[no-any-return]


@kernel
def thermal_cap_eta(m: np.ndarray, i: int, temp: float, level: float, slope: float, limit: float,
                    damp: float, du: float, rl: float, tparams: np.ndarray, params: np.ndarray) -> float:
    """First time the envelope, pushed by its trend and by leakage as the thermal model's
    forecast temperature rises, reaches the limit; inf beyond the horizon. ``rl`` is the core
    model's R level as the die confirms it (:func:`confirmed_r_level`)."""
    horizon = params[P_HORIZON]
    target = limit - params[P_MARGIN]
    if level >= target:
        return 0.0  # there already: the search below would answer its first step's tolerance (7e-05 s)
    slope = max(slope, 0.0) * params[P_TREND]
    off = tf.G_SIZE
    ul, pref = m[i, tf.G_UL], m[i, tf.G_PREF]
    top = max(ul + rl * pref, temp) + max(du, 0.0) * min(damp, horizon) \
        + max(m[i, off + tf.M_RB] * pref, 0.0) * min(tparams[tf.P_DRIFT_DAMP], horizon)
    if level + slope * horizon + params[P_LEAK] * max(top - temp, 0.0) * 2.0 < target:
        return np.inf  # not even the highest temperature it could reach pushes it to the cap
    if rl != rl or ul != ul or pref != pref or temp != temp or m[i, off + tf.M_LOADED] < tparams[tf.P_WARMUP]:
        return cap_eta(level, slope, limit, params[P_MARGIN])  # no trusted thermal model yet
    a0 = ul + rl * pref
    b = m[i, off + tf.M_RB] * pref
    tau = m[i, off + tf.M_TAU]
    gain = rl * params[P_LEAK]
    amp = 1.0 / (1.0 - gain) if 0.0 <= gain < 0.5 else 2.0
    lo = 0.0
    hi = -1.0
    for k in range(1, 33):
        h = horizon * (k / 32.0) ** 2
        rise = th.temp_at(h, temp, a0, b, tparams[tf.P_DRIFT_DAMP], tau, du, damp, amp, np.inf) - temp
        if level + slope * h + params[P_LEAK] * max(rise, 0.0) >= target:
            hi = h
            break
        lo = h
    if hi < 0.0:
        return np.inf
    for _ in range(12):
        mid = 0.5 * (lo + hi)
        rise = th.temp_at(mid, temp, a0, b, tparams[tf.P_DRIFT_DAMP], tau, du, damp, amp, np.inf) - temp
        if level + slope * mid + params[P_LEAK] * max(rise, 0.0) >= target:
            hi = mid
        else:
            lo = mid
    return hi


@inline
def end_node_event(node_brake: np.ndarray, node: int) -> None:
    """Node ``node``'s brake event over: the next ``node_min`` GPUs braking together raise another."""
    node_brake[node, N_ACTIVE] = 0.0
    node_brake[node, N_ZERO_TS] = np.nan


@inline
def release_brake(s: np.ndarray, i: int, node: int, node_brake: np.ndarray) -> None:
    """GPU ``i`` no longer brakes (its reasons say so, or went unread too long, see also
    :func:`_age_out_brakes`): off its node's count. The node event ends where the count is 0 once
    a whole poll is read (:func:`_node_brake_events`), not at the row that took it there."""
    set_braking(s, i, False)
    node_brake[node, N_COUNT] = max(node_brake[node, N_COUNT] - 1.0, 0.0)


@kernel
def _age_out_brakes(obs: tuple[np.ndarray, ...], rows: np.ndarray, n_rows: int, parents: np.ndarray,
                    node_gpus: tuple[np.ndarray, np.ndarray], s: np.ndarray, node_brake: np.ndarray,
                    stale_s: float) -> int:
    """Lets go, after a GPU frame, the brakes of the frame's nodes whose GPUs' throttle reasons went
    unread for over ``stale_s`` (``reasons_stale_s``) by the time of a fitted row of their node; returns
    how many. ``node_gpus`` is each node's GPUs as (offsets, GPUs). A GPU lets its own brake go at its
    own row (:func:`_power_kernel`): one that sends no rows at all (fell off the bus, XID 79) held its
    brake, and its node's count, for good — the next single GPU of the node to brake, hours later, was
    "2 of 8 GPUs braking together", and a second node-wide brake raised no node event (until
    2026-12-03). Run after the frame, not at each row, so that a braking GPU whose row comes later in
    the same frame (the first frame after the whole feed paused) is read before it is judged. A node
    whose count this takes to 0 has its event ended."""
    at, gpus = node_gpus
    released = 0
    for row in range(n_rows):
        if rows[row, R_DT] < 0.0:
            continue  # out of order: the fit skipped it
        node = parents[int(obs[tf.X_SLOT][row]), 1]
        if node_brake[node, N_COUNT] == 0.0:
            continue
        ts = obs[tf.X_TS][row]
        for k in range(at[node], at[node + 1]):
            j = gpus[k]
            if is_braking(s, j) and not ts - s[j, S_BITS_TS] <= stale_s:
                release_brake(s, j, node, node_brake)
                released += 1
        if node_brake[node, N_COUNT] == 0.0:
            end_node_event(node_brake, node)  # (reasons unread: no flicker to wait out)
    return released


@kernel
def _node_brake_events(obs: tuple[np.ndarray, ...], rows: np.ndarray, span: tuple[int, int], first: int,
                       parents: np.ndarray, s: np.ndarray, node_brake: np.ndarray, node_min: float,
                       off_hold: float, out: np.ndarray, n_out: int) -> int:
    """Judges each node of the run of rows ``span`` once the whole run is read. A run is a poll
    (the fit cuts a frame into runs where a GPU repeats, see
    :class:`~foreshock.detectors.thermal_fit.ThermalFit`), except where a GPU is missing from one
    poll of a frame holding several. A node's event ends where none of its GPUs has braked for
    ``off_hold`` s (ended under ``node_min``, a supply whose GPUs' brakes flicker, one of three
    steady, raised ten events in ten minutes: review r3; ended at the first poll with none, two
    GPUs braking on every other poll raised 30 in ten minutes, until 2026-12-04), and starts where
    ``node_min`` do; the run's GPU brakes
    (``out[first:n_out]``) report the count. Returns the emission count.
    Judged as each row set or let go a brake, the count depended on the order of one poll's rows:
    a GPU that stopped braking as another started, its row read later, made "2 of 4 GPUs braking
    together" though no poll showed two (two GPUs braking by turns: 29 node events in ten minutes),
    or kept a node event up so that the node's next one was never raised (reviews r2 and r3,
    2026-12-03). A start is stamped at the node's last braking row of the run."""
    lo, hi = span
    for k in range(first, n_out):
        if out[k, O_WHICH] == WHICH_GPU_BRAKE:
            out[k, O_V0] = node_brake[parents[int(obs[tf.X_SLOT][int(out[k, O_ROW])]), 1], N_COUNT]
    for row in range(hi - 1, lo - 1, -1):
        if rows[row, R_DT] < 0.0:
            continue  # (a late row the fit skipped is no reading)
        i = int(obs[tf.X_SLOT][row])
        node = parents[i, 1]
        if node_brake[node, N_COUNT] == 0.0:
            if node_brake[node, N_ACTIVE] == 1.0:
                ts = obs[tf.X_TS][row]
                since = node_brake[node, N_ZERO_TS]
                if since != since:
                    node_brake[node, N_ZERO_TS] = ts
                elif ts - since >= off_hold:
                    end_node_event(node_brake, node)
            continue
        node_brake[node, N_ZERO_TS] = np.nan
        if is_braking(s, i) and node_brake[node, N_COUNT] >= node_min and node_brake[node, N_ACTIVE] == 0.0:
            node_brake[node, N_ACTIVE] = 1.0
            n_out = emit(out, n_out, row, WHICH_NODE_BRAKE, CODE_START, 0.0, 1.0,
                         (node_brake[node, N_COUNT], float(node), 0.0, 0.0, 0.0, 0.0))
    return n_out


def node_gpu_lists(gpu_node: np.ndarray, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Each node's GPUs as (offsets, GPUs): node ``k``'s are ``gpus[offsets[k]:offsets[k + 1]]``."""
    gpu_node = np.asarray(gpu_node, dtype=np.int64)
    offsets = np.zeros(n_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(gpu_node, minlength=n_nodes), out=offsets[1:])
    return offsets, np.argsort(gpu_node, kind="stable").astype(np.int64)


@inline
def held_over_default(s: np.ndarray, i: int, power: float, dt: float, gap: float, load_min: float) -> bool:
    """For GPU ``i`` that reports no limit: whether its reading ``power``, more than
    ``DEFAULT_LIMIT_SLACK_W`` over the 700 W default, is held back as no reading while it may still be
    a glitch (:data:`OVER_DEFAULT_READINGS`). Keeps the count in ``S_OVER_DEFAULT`` (negated) and sets
    it to 1 at the reading that decides the GPU is not a 700 W part (that reading is taken)."""
    flag = s[i, S_OVER_DEFAULT]
    if dt >= gap:
        flag = 0.0  # after a gap it may be another GPU (a replaced board): judged again
    if flag == 1.0:
        return False  # not a 700 W part: its readings are its own
    pending = -flag if flag < 0.0 else 0.0  # (NaN: a state saved before the column, none counted)
    held = False
    if power > facts.POWER_LIMIT_W + DEFAULT_LIMIT_SLACK_W:
        pending += 1.0
        held = pending < OVER_DEFAULT_READINGS
    elif load_min <= power <= facts.POWER_LIMIT_W + facts.POWER_NOISE_W:
        pending = max(pending - OVER_DEFAULT_FORGET, 0.0)  # a loaded reading a 700 W part gives
    s[i, S_OVER_DEFAULT] = 1.0 if pending >= OVER_DEFAULT_READINGS else (-pending if pending > 0.0 else 0.0)
    return held


@inline
def cap_binds(power: float, limit: float, clock: float, clock_max: float) -> bool:
    """Whether the power cap binds at a sample that carries no throttle reasons (dcgm-exporter's
    default counters have none): its power pinned at the limit (from ``CAP_HELD_UNDER_W`` under it
    to the ±5 W of the reading over it) with the SM clock cut below its max. A GPU held at a
    lowered limit (``nvidia-smi -pl 500`` on a 700 W part) was predicted "already at the limit"
    again and again while it sat capped (until 2026-12-01); a GPU whose power rises towards its
    limit still runs at its max clock (the real H200: 1,980 MHz at 627 W under gpu-burn). Unknown
    (False) where either clock is not reported."""
    return limit - CAP_HELD_UNDER_W <= power <= limit + facts.POWER_NOISE_W and clock < clock_max


@kernel
def _power_kernel(obs: tuple[np.ndarray, ...], rows: np.ndarray, span: tuple[int, int],
                  parents: np.ndarray, state: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                  racks: np.ndarray, params: tuple[np.ndarray, np.ndarray], out: np.ndarray, n_out: int,
                  cache: np.ndarray, counts: np.ndarray) -> int:
    """Power brake, node brake and power-cap prediction over the fitted rows ``span`` of a
    GPU frame; returns the emission count. ``counts[0]`` counts the power readings past their
    limit by more than :data:`~foreshock.detectors.thermal_fit.OVER_LIMIT_READING_W`.

    ``obs`` is the thermal fit's observation columns (its ``X_CLOCK`` and ``X_CLOCK_MAX`` are read
    here only), ``rows`` the fit's per-row output, ``state`` = (thermal fit state, power state,
    alarms, node brake state), ``params`` = (thermal parameters, power parameters)."""
    m, s, alarms, node_brake = state
    tparams, p = params
    horizon = p[P_HORIZON]
    for row in range(span[0], span[1]):
        dt = rows[row, R_DT]
        if dt < 0.0:
            continue  # out of order: the fit skipped it
        ts = obs[tf.X_TS][row]
        i = int(obs[tf.X_SLOT][row])
        temp = obs[tf.X_TEMP][row]
        if not -50.0 < temp < 200.0:
            # no reading (NaN, an exporter's sentinel): for the slope and the forecast alike. Only
            # the slope had been guarded; a die reading -100 °C was forecast warming ~150 °C, and
            # leakage carried a steady 640-W GPU to its cap (review r2, 2026-12-03)
            temp = np.nan
        if temp == temp:
            old = rows[row, R_TPREV]  # the temperature the fit held before this sample
            if old == old:
                w = 1.0 - tf.cached_decay(cache, C_SLOPE, dt, p[P_TAU_SLOPE])
                s[i, S_TB] += w * ((temp - old) / dt - s[i, S_TB])
            # the die between whole degrees: carried by its trend, held within half a degree of the
            # reading. The leakage forecast starts from it: started from the reading, its rise
            # restarted at each tick up while the envelope already held the leakage of the fraction,
            # and on a die warming 0.5 °C/min the ETA jumped up 60-170 s at each tick (until 2026-12-05)
            est = s[i, S_T_EST]
            est = temp if old != old or est != est else est + s[i, S_TB] * dt
            s[i, S_T_EST] = min(max(est, temp - 0.5), temp + 0.5)
            # its die's temperature smoothed over trend_smooth_s, as the thermal detector smooths
            # the R it shows (integer readings, a training step's rhythm); it starts over after a gap
            if old != old or s[i, S_T_SEEN] != s[i, S_T_SEEN]:
                s[i, S_T_SEEN] = temp
            else:
                s[i, S_T_SEEN] += (1.0 - tf.cached_decay(cache, C_SEEN, dt, tparams[tf.P_TREND_SMOOTH])) \
                    * (temp - s[i, S_T_SEEN])
        bits = reason_bits(obs[X_REASONS][row])
        capped = False
        thermal = False
        # --- power brake: immediate, per GPU and per node ---------------------------------
        node = parents[i, 1]
        if bits >= 0:
            s[i, S_BITS_TS] = ts
            braking = (bits & facts.THROTTLE_HW_POWER_BRAKE) != 0
            if braking and not is_braking(s, i):
                set_braking(s, i, True)
                s[i, S_ENV_PRE] = s[i, S_ENV]  # what it drew before the brake
                s[i, S_CONF_PRE] = min(1.0, loaded_samples(s, i) / (2.0 * p[P_MIN_N]))  # ... and on how many samples
                node_brake[node, N_COUNT] += 1.0
                if not ts - s[i, S_BRAKE_OFF_TS] < p[P_OFF_HOLD]:
                    # a brake back within off_hold_s of its release is the same one flickering (a
                    # supply dropping in and out): 60 anomalies in ten minutes until 2026-12-04
                    n_out = emit(out, n_out, row, WHICH_GPU_BRAKE, CODE_START, 0.0, 1.0,
                                 (node_brake[node, N_COUNT], 0.0, 0.0, 0.0, 0.0, 0.0))
                # whether the node brakes as a whole is decided once the poll is read (_node_brake_events)
            elif not braking and is_braking(s, i):
                release_brake(s, i, node, node_brake)
                s[i, S_BRAKE_OFF_TS] = ts
            capped = (bits & facts.THROTTLE_SW_POWER_CAP) != 0
            thermal = (bits & (facts.THROTTLE_SW_THERMAL | facts.THROTTLE_HW_THERMAL)) != 0
        elif is_braking(s, i) and not ts - s[i, S_BITS_TS] <= p[P_REASONS_STALE]:
            # reasons unread for long: whether it still brakes is unknown — let the brake go
            release_brake(s, i, node, node_brake)
        # --- power cap: the compute-phase envelope, pushed by trend and by leakage -----------
        # A sample is a 1-s average: most land in compute phases, so their upper envelope is the
        # power the cap acts on (the interval mean, diluted by communication phases, is not).
        power = obs[tf.X_POWER][row]
        over_limit = power > m[i, tf.G_PLIM] + tf.OVER_LIMIT_READING_W  # (no reading for the fit either)
        reported = m[i, tf.G_PLIM] == m[i, tf.G_PLIM]
        # ... and none reported: past the assumed default by its slack, no reading while it may be a
        # glitch (see OVER_DEFAULT_READINGS; the fit takes it, it knows no limit)
        over_default = not reported and 0.0 < power < 1e5 \
            and held_over_default(s, i, power, dt, tparams[tf.P_GAP], p[P_LOAD_MIN])
        if power != power or not 0.0 < power < 1e5 or over_limit or over_default:
            # no reading (0 W included: no powered board draws it, see thermal_fit.observe), or
            # none the limiter allows: nothing is forecast from it, and a prediction held stands
            # down once none has come for off_hold_s (skipped, it had held for good while a GPU's
            # power read NaN or 0 W and its other fields came: until 2026-12-04)
            counts[0] += 1.0 if over_limit else 0.0
            counts[1] += 1.0 if over_default else 0.0
            at_cap = capped or ts - s[i, S_CAP_TS] <= p[P_CAP_HOLD]
            code = compact_step(alarms, i, 0, ts, False, not at_cap, p[P_ON], p[P_OFF_HOLD], p[P_REFRESH])
            if code != CODE_NONE:
                n_out = emit(out, n_out, row, WHICH_CAP, code, np.inf, 0.0,
                             (np.nan, np.nan, m[i, tf.G_PLIM], np.nan, 0.0, 0.0))
            continue
        limit = m[i, tf.G_PLIM]
        if not reported:  # none reported: Hopper's, unless it drew well over that (see below)
            limit = np.nan if s[i, S_OVER_DEFAULT] == 1.0 else facts.POWER_LIMIT_W
        node_event = is_braking(s, i) and node_brake[parents[i, 1], N_ACTIVE] == 1.0
        if thermal:
            if not is_thermal(s, i):  # remember what it drew before the limiter held it down
                set_thermal(s, i, True)
                s[i, S_ENV_PRE] = s[i, S_ENV]
                s[i, S_CONF_PRE] = min(1.0, loaded_samples(s, i) / (2.0 * p[P_MIN_N]))
        else:
            set_thermal(s, i, False)
        if loaded_samples(s, i) == 0.0 or power < p[P_LOAD_MIN] or dt >= tparams[tf.P_GAP]:
            # idle or restarting: the trend starts over (a job start is a step, not a trend)
            s[i, S_ENV] = power
            s[i, S_LEVEL] = power
            s[i, S_SLOPE] = 0.0
            set_loaded_samples(s, i, 1.0 if power >= p[P_LOAD_MIN] else 0.0)
            if dt >= tparams[tf.P_GAP]:
                s[i, S_OVER_DEFAULT] = 0.0  # after a gap it may be another GPU (a replaced board)
        else:
            cut = m[i, tf.G_PLIM]  # (the reported limit only: none, the default's slack is read above it)
            if s[i, S_ENV] > cut + LIMIT_CUT_SLACK_W:
                # a limit cut under what it drew (LIMIT_CUT_SLACK_W): the envelope starts again from
                # what the limiter now allows, and its trend too (a step, not a trend)
                cut = min(cut, power)
                s[i, S_ENV] = cut
                s[i, S_LEVEL] = min(s[i, S_LEVEL], cut)
                s[i, S_SLOPE] = 0.0
            s[i, S_ENV] = max(power, s[i, S_ENV] - p[P_ENV_DECAY] * dt)
            s[i, S_LEVEL], s[i, S_SLOPE] = tf.holt(
                s[i, S_LEVEL], s[i, S_SLOPE], s[i, S_ENV], dt,
                1.0 - tf.cached_decay(cache, C_LEVEL, dt, p[P_TAU_LEVEL]),
                1.0 - tf.cached_decay(cache, C_SLOPE, dt, p[P_TAU_SLOPE]))
            set_loaded_samples(s, i, loaded_samples(s, i) + 1.0)
        # Holt's level runs ahead of a step (a job's first samples ramp from idle to load) and
        # then overshoots the envelope it smooths by tens of watts for a minute or two; the
        # envelope, a running maximum of noisy samples, is already the highest honest estimate.
        level = min(s[i, S_LEVEL], s[i, S_ENV])
        if not reported and level > facts.POWER_LIMIT_W + DEFAULT_LIMIT_SLACK_W:
            # reports no limit and draws well over the default's: not a 700 W part, limit unknown
            s[i, S_OVER_DEFAULT] = 1.0
            limit = np.nan
        if bits < 0:  # no reasons: the sample's power and clock say whether the cap binds now ...
            capped = cap_binds(power, limit, obs[tf.X_CLOCK][row], obs[tf.X_CLOCK_MAX][row])
        if capped:
            s[i, S_CAP_TS] = ts
        elif ts - s[i, S_CAP_TS] <= p[P_CAP_HOLD]:
            # ... and a sample under it between capped ones (a job's communication phase; with
            # reasons, the cap bit off) is still at the cap, not heading for it (its die cooled a
            # little, and the leakage forecast brought it back to the limit: predicted every minute
            # or two for as long as it was capped — with reasons, 1,857 times on the fourteen
            # 1,024-GPU recordings until 2026-12-01, none of them scored, in an episode). Held from a
            # sample it bound at only: a held sample extending the hold kept a GPU once capped
            # "capped" for good — its limit raised back, its power creeping to the new one was never
            # predicted; tried with reasons, that cost recall 0.24 -> 0.05 on seed 21. (A held
            # sample withdraws no prediction either: "no longer heading for the limit" waits for
            # the hold to end, up to cap_hold_s later.)
            capped = True
        eta = np.inf
        held = thermal or is_braking(s, i)
        if loaded_samples(s, i) >= p[P_MIN_N] and not held and limit == limit:
            since = ts - s[i, S_EVAL_TS]
            if not since < tparams[tf.P_EVERY]:  # solved every forecast_every_s, aged between
                damp = th.inlet_damping(parents[i, 0], racks, tparams)
                # the flow's fall carried over the loop's time constant only: this 5-minute cap
                # forecast, carried as far as the 30-minute thermal one, called caps on failing
                # loops that did not come within its horizon (seed 783: false cap alarms charged
                # to the cooling loss 4.6 -> 16.9 per 1000 GPU-h)
                du = th.inlet_rate(m, i, parents[i, 0], racks, damp, tparams, damp)
                if not led_by_flow(m, i, parents[i, 0], racks, tparams):
                    # the inlet's own trend: only as fast as the die shows it rise (a rack sensor
                    # stepping +8 °C, recalibrated, is no warming loop while the dies stay put)
                    du = min(du, tparams[tf.P_TREND_CONFIRM] * max(s[i, S_TB], 0.0))
                rl = confirmed_r_level(m, i, s[i, S_T_SEEN], du, tparams)
                t0 = s[i, S_T_EST] if temp == temp else temp  # (the die between degrees: see above)
                s[i, S_ETA] = thermal_cap_eta(m, i, t0, level, s[i, S_SLOPE], limit, damp, du, rl, tparams, p)
                s[i, S_EVAL_TS] = ts
                since = 0.0
            eta = max(s[i, S_ETA] - since, 0.0)
        max_op = tf.core_limit(m, i, tparams)  # its own, as last reported (the fit keeps it)
        released = False
        drew_pre = 0.0  # what a thermally held GPU drew before, where that predicts the cap (its reason)
        if thermal and s[i, S_ENV_PRE] >= limit - p[P_RELEASE_MARGIN] and temp == temp \
                and temp <= max_op - p[P_RELEASE_BELOW] and m[i, tf.G_UB] <= p[P_RELEASE_INLET]:
            # cooling below max operating: the thermal limiter lets go and the cap takes over
            eta = p[P_RELEASE_ETA]
            released = True
            drew_pre = s[i, S_ENV_PRE]
        if node_event and s[i, S_ENV_PRE] >= p[P_LOAD_MIN]:
            # a node-wide power event (a failed supply): when the brake lifts, the node runs on
            # a smaller power budget and a loaded GPU meets its (lowered) cap
            eta = p[P_RELEASE_ETA]
            released = True
        confidence = min(1.0, loaded_samples(s, i) / (2.0 * p[P_MIN_N]))
        if released and s[i, S_CONF_PRE] == s[i, S_CONF_PRE]:
            # what it drew before the brake or the limiter: a braked GPU under load_min_w counts as
            # idle since (S_N 0), and its prediction went out with confidence 0 (until 2026-12-05)
            confidence = max(confidence, s[i, S_CONF_PRE])
        firing = eta <= horizon and not capped
        clear = not eta <= horizon * p[P_CLEAR] and not capped
        on_count = 1.0 if eta <= p[P_URGENT] else p[P_ON]
        code = compact_step(alarms, i, 0, ts, firing, clear, on_count, p[P_OFF_HOLD], p[P_REFRESH])
        if code != CODE_NONE:
            # (the reason's values: v[4] what it drew before a thermal release, else 0; v[5] 1 on a
            # node-wide brake, else -1 where the limit is the default assumed, none reported, else 0)
            n_out = emit(out, n_out, row, WHICH_CAP, code, eta, confidence,
                         (level, s[i, S_SLOPE], limit, s[i, S_TB], drew_pre,
                          1.0 if node_event else (0.0 if reported else -1.0)))
    return n_out



STATE_LAYOUT = 2
"""The layout of the detector's own arrays (``state_layout`` in its state; a state without it is
layout 1). Removing columns makes an array's width no sign of its version any more, so the layout is
said outright."""
LAYOUT1_S_SIZE = 17
"""Layout 1's ``s_gpu`` width (before 2026-12-06); narrower ones are older still (columns added at
the end: NaN there, see :meth:`PowerDetector.upgrade_state`). Its columns: this layout's up to
S_SLOPE, then the loaded samples, braking and thermally held flags (3, 4, 5: S_FLAGS here), then this
layout's from S_ENV_PRE on."""
LAYOUT1_N, LAYOUT1_BRAKE, LAYOUT1_THERMAL = 3, 4, 5


def upgrade_layout1(state: dict[str, Any]) -> dict[str, Any]:
    """A state of layout 1 (saved before ``state_layout``) in this one: ``s_gpu`` widened to layout 1
    first (where older), its three count and flag columns packed into ``S_FLAGS``, and ``s_alarm``'s
    four-column block as a compact one (:func:`~.alarm.compact_from_alarm_columns`)."""
    out = add_columns(state, "s_gpu", LAYOUT1_S_SIZE)
    out = dict(out)
    if "s_gpu" in out and np.ndim(out["s_gpu"]) == 2 and np.shape(out["s_gpu"])[1] == LAYOUT1_S_SIZE:
        old = np.asarray(out["s_gpu"], dtype=np.float64)
        new = np.delete(old, [LAYOUT1_BRAKE, LAYOUT1_THERMAL], axis=1)  # (S_N's column becomes S_FLAGS)
        out["s_gpu"] = with_flags(new, old[:, LAYOUT1_N], old[:, LAYOUT1_BRAKE] == 1.0,
                                  old[:, LAYOUT1_THERMAL] == 1.0)
    if "s_alarm" in state and np.ndim(state["s_alarm"]) == 2:
        out["s_alarm"] = compact_from_alarm_columns(state["s_alarm"], 1)
    return out


def gpu_as_layout1(s_gpu: np.ndarray) -> np.ndarray:
    """``s_gpu`` as layout 1 kept it (:func:`upgrade_layout1` undone, exactly): the loaded samples, braking
    and thermally held flags out of ``S_FLAGS`` into columns 3-5 (``LAYOUT1_N`` ...)."""
    s_gpu = np.asarray(s_gpu, dtype=np.float64)
    old = np.delete(s_gpu, S_FLAGS, axis=1)
    for col, values in ((LAYOUT1_N, loaded_samples_of(s_gpu)), (LAYOUT1_BRAKE, braking_of(s_gpu)),
                        (LAYOUT1_THERMAL, thermal_of(s_gpu))):
        old = np.insert(old, col, values.astype(np.float64), axis=1)
    return old


def power_as_layout1(state: dict[str, Any]) -> dict[str, Any]:
    """A power detector's ``state_dict()`` as layout 1 kept it (:meth:`PowerDetector.upgrade_state` undone):
    the fit's (:func:`~.thermal_fit.fit_as_layout1`), ``s_gpu`` by :func:`gpu_as_layout1`, ``s_alarm``'s
    block four columns wide (:func:`~.alarm.alarms_as_layout1`); no ``state_layout``."""
    out = {k: v for k, v in tf.fit_as_layout1(state).items() if k != "state_layout"}
    if "s_gpu" in state and np.ndim(state["s_gpu"]) == 2:
        out["s_gpu"] = gpu_as_layout1(state["s_gpu"])
    if "s_alarm" in state and np.ndim(state["s_alarm"]) == 2:
        out["s_alarm"] = alarms_as_layout1(state["s_alarm"], 1)
    return out


class PowerDetector(ThermalFitDetector):
    """Predicts ``power_cap``; reports power brake per GPU and per node at once."""

    slot_kinds: ClassVar[Mapping[str, str]] = {**FIT_SLOT_KINDS, "s_gpu": "gpu", "s_alarm": "gpu", "s_node_brake": "node"}
    name: ClassVar[str] = "power"
    kinds: ClassVar[tuple[str, ...]] = ("gpu", "rack")
    state_scalars: ClassVar[tuple[str, ...]] = ("state_layout",)
    state_layout: int = STATE_LAYOUT

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, **params: Any) -> None:
        super().__init__(topology)
        self.health = health or PipelineHealth()
        self.params = params_vector(params)
        self.thermal_params = tf.params_vector({})
        self.horizon_s = float(self.params[P_HORIZON])
        n = topology.size("gpu")
        self.init_fit(self.thermal_params, consumer=True)
        self.s_gpu = np.full((n, S_SIZE), np.nan)
        self.s_gpu[:, [S_FLAGS, S_TB, S_OVER_DEFAULT]] = 0.0  # (no samples, not braking, not held)
        self.s_gpu[:, S_ETA] = np.inf
        self.s_alarm = new_compact_alarms(n, 1)
        self.s_node_brake = np.zeros((topology.size("node"), N_SIZE))
        self.s_node_brake[:, N_ZERO_TS] = np.nan
        # power readings past their limit (see tf.OVER_LIMIT_READING_W), and past the 700 W default
        # held while they may be glitches (a GPU that reports no limit: OVER_DEFAULT_READINGS)
        self._counts = np.zeros(2)
        self._node_gpus = node_gpu_lists(topology.gpu_node, topology.size("node"))
        self._scratch = Scratch()
        self._out = np.empty((0, OUT_SIZE))
        self._n_out = 0

    def update(self, frame: Frame) -> list[Finding]:
        if frame.kind == "rack":
            self.update_fit(frame)
            self.read_site_loops()
            return []
        if frame.kind != "gpu" or len(frame) == 0:
            return []
        self.update_fit(frame)
        fit = self.fit
        found = self._findings(fit.obs, self._out[:self._n_out])
        found += self.withdraw_silent_gpus(self.s_alarm, ("power_cap",), compact=True)
        if self._counts[0]:
            self.health.problem(self.name, f"power reading over its enforced limit by more than "
                                f"{tf.OVER_LIMIT_READING_W:g} W: not taken for the cap forecast", int(self._counts[0]))
            self._counts[0] = 0.0
        if self._counts[1]:
            self.health.problem(self.name, f"power reading over the {facts.POWER_LIMIT_W:.0f} W default limit by more "
                                f"than {DEFAULT_LIMIT_SLACK_W:g} W, from a GPU that reports none: not taken for the "
                                f"cap "
                                f"forecast until {OVER_DEFAULT_READINGS:.0f} such, less a tenth for each at the "
                                f"default, say it is no {facts.POWER_LIMIT_W:.0f} W part", int(self._counts[1]))
            self._counts[1] = 0.0
        # (no node counts a braking GPU, the usual case: none to let go)
        if self.s_node_brake[:, N_COUNT].any():
            _age_out_brakes(fit.obs, fit.rows, fit.n_rows, fit.parents, self._node_gpus, self.s_gpu,
                            self.s_node_brake, float(self.params[P_REASONS_STALE]))
        return found

    def read_site_loops(self) -> None:
        self.thermal_params[tf.P_SITE_DAMP] = site_loop_tau(self.s_rack)
        self.thermal_params[tf.P_SITE_RISE] = site_loop_rise(self.s_rack)

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The fit's upgrades, and ``s_gpu`` saved before S_OVER_DEFAULT, S_BITS_TS, S_T_SEEN,
        S_CAP_TS, S_BRAKE_OFF_TS, S_CONF_PRE and S_T_EST (NaN: not over the default limit; reasons never
        read, so a brake held then is let go; no die temperature seen yet, taken from the next sample;
        its cap not seen binding; no brake let go; the confidence before a brake unknown, the current
        one stands; the die between degrees taken from the next reading), and ``s_node_brake`` before
        N_ZERO_TS (NaN: its count not read 0 while raised); a state saved before ``state_layout``
        (layout 1) in this one (:func:`upgrade_layout1`)."""
        state = add_columns(super().upgrade_state(state), "s_node_brake", N_SIZE)
        if "state_layout" in state:
            return state
        return {**upgrade_layout1(state), "state_layout": STATE_LAYOUT}

    def previous_layout_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """... layout 1 (:func:`power_as_layout1`)."""
        return power_as_layout1(state)

    def remap_state(self, state: dict[str, Any], remap: Remap) -> dict[str, Any]:
        """... and each node's count of braking GPUs counted again from the GPUs' brake flags as
        they now sit: the kernel keeps it as each flag changes, and a braking GPU whose state starts
        afresh (a board swapped in its slot) or moves (boards renumbered at a reboot) never lets its
        brake go there. The stale count made the next single GPU of the node to brake "2 of 8 GPUs
        braking together — power supply or PDU fault" (until 2026-12-02). A node event still raised
        ends where none of the node's GPUs brakes any more, as after a poll
        (:func:`_node_brake_events`)."""
        moved = super().remap_state(state, remap)
        braking = braking_of(moved["s_gpu"])
        node_brake = np.array(moved["s_node_brake"], dtype=float)
        node_brake[:, N_COUNT] = np.bincount(self.topology.gpu_node[braking], minlength=len(node_brake))
        node_brake[node_brake[:, N_COUNT] == 0.0, N_ACTIVE] = 0.0
        node_brake[node_brake[:, N_COUNT] == 0.0, N_ZERO_TS] = np.nan
        return {**moved, "s_node_brake": node_brake}

    def begin_frame(self, fit: ThermalFit) -> None:
        self._out = self._scratch.take("out", (3 * fit.n_rows, OUT_SIZE))
        self._n_out = 0

    def after_fit(self, fit: ThermalFit, lo: int, hi: int) -> None:
        first = self._n_out
        self._n_out = _power_kernel(fit.obs, fit.rows, (lo, hi), fit.parents,
                                    (fit.s_model, self.s_gpu, self.s_alarm, self.s_node_brake), fit.s_rack,
                                    (self.thermal_params, self.params), self._out, self._n_out,
                                    tf.new_decay_cache(C_SITES), self._counts)
        node_brake = self.s_node_brake
        # a run that emitted nothing, no node counting a braking GPU nor holding an event (the usual
        # case): the pass over its rows would change nothing (4 ns per GPU of the bank's tick)
        if self._n_out > first or node_brake[:, N_COUNT].any() or node_brake[:, N_ACTIVE].any():
            self._n_out = _node_brake_events(fit.obs, fit.rows, (lo, hi), first, fit.parents, self.s_gpu,
                                             node_brake, float(self.params[P_NODE_MIN]),
                                             float(self.params[P_OFF_HOLD]), self._out, self._n_out)

    def _findings(self, obs: tuple[np.ndarray, ...], out: np.ndarray) -> list[Finding]:
        findings: list[Finding] = []
        for rec in out:
            row, which, code = int(rec[O_ROW]), int(rec[O_WHICH]), int(rec[O_CODE])
            ts, slot = float(obs[tf.X_TS][row]), int(obs[tf.X_SLOT][row])
            v = rec[O_V0:O_V0 + 6]
            if which == WHICH_CAP:
                eta = float(rec[O_ETA])
                # the limit as the kernel took it: reported, or Hopper's default assumed (v[5] -1)
                named = f"the {v[2]:.0f} W limit" + (" (the default assumed: none reported)" if v[5] < 0 else "")
                noise = facts.POWER_NOISE_W
                if code == CODE_WITHDRAW and not np.isfinite(v[0]):
                    over = f"{tf.OVER_LIMIT_READING_W:g} W over its limit" if np.isfinite(v[2]) else \
                        f"{DEFAULT_LIMIT_SLACK_W:g} W over the {facts.POWER_LIMIT_W:.0f} W limit assumed, none reported"
                    reason = (f"its power no longer read (missing, 0 W, or more than {over}): no longer known "
                              "to be heading for the limit")
                elif code == CODE_WITHDRAW:
                    reason = f"compute-phase power {v[0]:.0f} W no longer heading for the limit"
                elif v[5] > 0:
                    reason = ("its node is power-braking (a failed power supply): when the brake lifts, "
                              "the node runs on a reduced power budget and the power cap holds this GPU")
                elif v[4] > 0:
                    # what it drew before the limiter held it down, against the limit (it is predicted
                    # where that was within release_margin_w of it, not only at it)
                    if abs(v[4] - v[2]) <= noise:
                        drew = f"it drew {v[4]:.0f} W before, at {named}"
                    elif v[4] < v[2]:
                        drew = f"it drew {v[4]:.0f} W before, within {self.params[P_RELEASE_MARGIN]:.0f} W of {named}"
                    else:
                        drew = f"it drew {v[4]:.0f} W before, {v[4] - v[2]:.0f} W over {named}"
                    reason = (f"cooling below max operating again after a thermal throttle; {drew}: the power "
                              f"cap takes over as clocks recover")
                elif v[0] >= v[2] - self.params[P_MARGIN]:
                    # no forecast involved: the envelope is there already (its own trend is not
                    # extrapolated by default, so quoting it would mislead)
                    if v[0] - v[2] <= noise:
                        at = f"already at {named} within the ±{noise:.0f} W measurement noise"
                    else:  # (no reported limit: the default assumed, which it may not have)
                        at = f"already {v[0] - v[2]:.0f} W over {named}, past the ±{noise:.0f} W measurement noise"
                    reason = f"compute-phase power {v[0]:.0f} W {at}: the cap binds at its next rise"
                else:
                    # the forecast's leakage comes from the thermal model's steady state, not from
                    # the measured slope: a GPU cooling for a moment can still be heading warmer
                    heat = ("leakage rising with it" if v[3] >= 0 else
                            "but its thermal model settles it warmer: leakage will rise")
                    reason = (f"compute-phase power {v[0]:.0f} W ({v[1] * 60:+z.1f} W/min, temperature "
                              f"{v[3] * 60:+z.2f} °C/min, {heat}) heading for {named}")
                findings.append(Prediction(ts, "gpu", slot, "power_cap", eta if np.isfinite(eta) else -1.0,
                                           round(float(rec[O_CONF]), 3), self.name, reason,
                                           active=code != CODE_WITHDRAW))
            elif which == WHICH_GPU_BRAKE and code == CODE_START:
                findings.append(Anomaly(ts, "gpu", slot, "throttle_reasons", 1.0, self.name,
                                        f"HW power brake (0x80) asserted: clocks cut >= 2x; "
                                        f"{int(v[0])} GPU(s) of its node braking"))
            elif which == WHICH_NODE_BRAKE:
                node = int(v[1])
                total = int(np.count_nonzero(self.topology.gpu_node == node))
                findings.append(Anomaly(ts, "node", node, "psu_power", float(v[0]) / max(total, 1), self.name,
                                        f"node-wide power brake: {int(v[0])} of {total} GPUs braking "
                                        f"together — power supply or PDU fault on "
                                        f"{self.topology.nodes[node]}"))
        return findings
