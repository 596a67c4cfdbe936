"""The per-GPU thermal fit that the thermal, power and cooling detectors share.

Each of those detectors reads the same first-order thermal model of every GPU (see
:mod:`foreshock.detectors.thermal` for the physics): the thermal resistance ``R`` and time
constant ``tau`` of the core and the HBM, the reference power, the inlet temperature and its
trend. :class:`ThermalFit` fits it once per frame for all of them:

- it owns the fit's state (``s_model``: per GPU, common columns then one block per model), the
  rack inlet state and the node inlet proxy (see :mod:`foreshock.detectors.gpu_inputs`);
- :meth:`ThermalFit.update` is memoised on the frame: the first detector of a bank to see a
  frame runs the fit, the others reuse it (a detector that sees the same frame again — a
  re-fed frame — runs it again, as it would alone, and finds its rows out of order);
- detectors that predict per sample (thermal, power) are *consumers*: after the fit of a run of
  rows the fit calls each consumer's :meth:`FitConsumer.after_fit` on those rows, so every
  prediction reads the model exactly as it stood after its own sample. A frame in which a GPU
  appears twice (a replay window of several ticks) is cut into runs without repeats for that, its
  rows taken in time order first where it lists them otherwise (by GPU): each run is one poll.

Each detector owns a fit of its own until a :class:`~foreshock.detectors.bank.DetectorBank`
puts them together with :func:`share_thermal_fits`: detectors whose fits have the same
parameters and the same state then use one. A bank of ``power`` alone works as before. The
fit's arrays are part of every sharing detector's ``state_dict()`` (each detector's state is
complete on its own); loading writes them in place, so they stay shared.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Protocol, Sequence

import numpy as np

from foreshock import facts
from foreshock.findings import Finding
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.remap import Remap
from foreshock.topology import Topology

from .alarm import silent_gpu_withdrawals
from .base import Detector, add_columns, resolve_params
from .gpu_inputs import (INLET_NODE_PROXY, INLET_RACK_PROXY, Scratch, frame_now, gpu_columns, inline, kernel,
                         new_inlet_states, node_feed, node_tick, rack_inlet_obs, read_inlet, relinked_inlet_states, update_rack_inlet,
                         upgrade_rack_state)

# (the fit reads no clock: sm_clock and sm_clock_max are the power detector's, in the fit's
# columns so that its kernel reads them from the same ``obs``)
OBS_FIELDS = ("gpu_temp", "hbm_temp", "power", "slowdown_temp", "energy", "power_limit", "throttle_reasons",
              "util", "max_op_temp", "hbm_max_op_temp", "sm_clock", "sm_clock_max")
X_TS, X_SLOT, X_TEMP, X_HBM, X_POWER, X_SLOWDOWN, X_ENERGY, X_PLIMIT, X_REASONS, X_UTIL, X_MAX_OP, \
    X_HBM_MAX_OP, X_CLOCK, X_CLOCK_MAX = range(14)

# ---- per-GPU fit state: common columns, then one block per model --------------------------
# last ts, reference power, inlet level/slope (the level NaN: no inlet read yet, or its source just
# switched — the next inlet starts the trend; until 2026-12-06 a count of inlet samples said so, in a
# column of its own), last energy reading, power limit
G_TS, G_PREF, G_UL, G_UB, G_ENERGY, G_PLIM = range(6)
G_SIZE = 6
# model block (relative columns): time constant, filtered power, R level and slope, squared
# residual, previous temperature, loaded seconds, how stale R is (seconds unloaded since it
# was last seen; below zero, the seconds of catching up left — see STALE_R_S), and the time
# constant's decay over the last step with that step (an exp per model and sample otherwise:
# the steps repeat, and tau changes only where a sample observes it)
M_TAU, M_PF, M_RL, M_RB, M_RES, M_TPREV, M_LOADED, M_STALE, M_DECAY, M_DECAY_DT = range(10)
M_SIZE = 10
STALE_R_S = 300.0
"""R unseen this long (the GPU unloaded) may have moved meanwhile — an interface degrades whether
the GPU works or not. Once load is back, the R level then follows the readings at CATCH_UP_TAU_S
for CATCH_UP_S instead of the Holt level's pace, its slope left as it was, and the residual and
time constant, measured against the stale R, are not learnt meanwhile (seed 805 at 8,192 GPUs,
node739/gpu0: R 0.105 °C/W against a stale 0.046 after a 14-minute idle; the fit took the whole
14 minutes to catch up, and the stale residual held the confidence under its floor)."""
CATCH_UP_S = 120.0
CATCH_UP_TAU_S = 30.0
OVER_LIMIT_READING_W = 10.0 * facts.POWER_NOISE_W
"""A power reading this far over the GPU's enforced limit (reported in the row, else the last one
reported) is no reading: the driver holds each 1-s average under the limit (the real H200 capped
reads 688-696 W under 700 W), so it is an exporter's glitch, or a limit just lowered that the power
has not followed yet. Taken, one 3,000-W reading set the fit's reference power and the power
detector's envelope, a running maximum, for an hour: "2,175 W already at the 700 W limit",
predicted every minute for 78 minutes (until 2026-12-04). The power detector counts them."""
SLOPE_AFTER_S = 300.0
SETTLE_TAU_S = 60.0
"""A GPU's first SLOPE_AFTER_S of loaded time settle its R: the level follows the readings at
SETTLE_TAU_S (five time constants: settled) and learns no drift, then Holt's level (tau_level_s)
and slope take over. The first readings under load are off while the power filter catches up with
the step from idle, and Holt's slope learnt the level's settling from them as a drift, which
overshot it for most of an hour (seed 34, node36: first readings 0.057 °C/W, the level undershot
to 0.0395 against a true 0.045 and was back only 55 min later; the cooling detector's first peer
comparison read its settled neighbour node39 as a node with failing fans)."""
CORE, HBM = 0, 1
N_MODELS = 2
G_USRC = G_SIZE + N_MODELS * M_SIZE
"""After the model blocks: where the GPU's inlet last came from (``gpu_inputs.INLET_*``; NaN: not
yet, or a state saved before it was kept). Where it changes — a rack's inlet sensor going dark for
longer than ``inlet_stale_s`` hands its GPUs to the node proxy, and back when it returns — the
inlet steps by as much as the proxy is off (``R - R_nominal`` times the power: 8 °C on GPUs at
0.06 °C/W, 640 W), and each model's R by that over the power; so does a rack's reading shifting to
another level (``gpu_inputs.RACK_SHIFTS``). The inlet's trend starts over from the new reading, each
R is moved by the step and catches up with the readings (:func:`switch_inlet_source`), and the
forecast's R trend restarts: until 2026-12-01 a 10-minute
rack-sensor outage read as the loop warming +5 °C/min, and every loaded GPU of the rack was
predicted to throttle."""
G_ENERGY_TS = G_USRC + 1
"""... and when the energy counter last moved: an interval's mean power is the counter's advance
over the time since then. An exporter serves its last collection until the next (dcgm-exporter
collects every 30 s, whatever the poll): polled every 10 s, the counter repeated twice, then moved
by 30 s of energy. Read as 0 W, 0 W and three times the power over 10 s, the jump made that power
the GPU's reference (a step up is taken at once): 1,900 W, and every loaded GPU was predicted to
meet its power cap through leakage (until 2026-12-01)."""
G_SLOWDOWN = G_ENERGY_TS + 1
"""... and the GPU's own HW slowdown temperature as last reported (40-130 °C; NaN: never): kept, as
the power limit is, through a poll that misses it. A GPU whose own limits sit above Hopper's (a
slowdown of 95 °C, running at 89 °C) was held to the 87 °C default for the one poll whose read
failed, and predicted to throttle with ETA 0 (until 2026-12-01)."""
G_MAX_OP = G_SLOWDOWN + 1
"""... and the GPU's own max operating temperatures as last reported, core then memory (40-130 °C;
NaN: never; kept through a poll that misses them, as the slowdown temperature is): the limits its
SW thermal slowdown holds the die and the HBM under (DCGM fields 152 and 151, NVML's GPU_MAX and
MEM_MAX thresholds, nvidia-smi's T.Limit). Before 2026-12-01 neither was read: the core limit was
the slowdown temperature less 2 °C (else 87 °C) and the HBM's a fixed 95 °C, so a part whose own
limits sit elsewhere (a max operating temperature of 83 °C) was predicted against the wrong one."""
G_HBM_MAX_OP = G_MAX_OP + 1
MODEL_WIDTH = G_HBM_MAX_OP + 1
# per row of a fitted frame: the step (s; < 0: row skipped as out of order), the core temperature
# before this sample (NaN after a gap) — what consumers need besides the state — what its energy
# counter read (E_*: 0 a sane interval mean, or none), and 1 where its inlet source (G_USRC) is the
# one it was before the row (else 0: another, or none yet — the thermal forecast's trend tracks start
# over; until 2026-12-06 the forecast kept the source it last read in a column per GPU)
R_DT, R_TPREV, R_ENERGY_BAD, R_SRC_SAME = 0, 1, 2, 3
ROW_SIZE = 4
E_NOT_SANE, E_DISAGREES, E_OVER_LIMIT = 1.0, 2.0, 3.0
# a fitted frame's input problems as counted (see _fit_kernel): rows by E_* code (0 is not counted),
# then die readings (core, HBM) colder than their inlet under load (DIE_BELOW_INLET)
C_DIE_COLD = 4
C_SIZE = 5
ENERGY_NOT_SANE = "energy counter went back or rose past 100 kW: the sample's power reading taken"
"""The input problem of a GPU whose energy counter, read against its last reading within the fit's
gap, gives a negative or impossible interval mean (a reset at a driver reload, a wrap, a garbage
reading): its sample's power is read from ``power`` instead, as before, but the reading is counted
(until 2026-12-05 nothing said so; a fuzz test of the pipeline found it). Counted once a sample: the
reading is the counter's baseline with no time (``G_ENERGY_TS`` NaN), so the next interval, judged
from nothing, gives no mean and no count (the next sample's power is its own reading). Until
2026-12-06 a glitch to 0 and back was counted twice (the fall, then the rise back from 0), a reading of
-1 in 50 rows 100 times, and each of those again by every detector that reads the fit
(:meth:`ThermalFitDetector.update_fit`: now once, by the detector the frame was fitted for)."""
ENERGY_DISAGREES = ("energy counter disagrees with the power readings (clock step?): the sample's power "
                    "reading taken")
"""The input problem of a GPU whose energy counter's interval mean disagrees with the sample's own
``power`` (and the filtered power, where known: :data:`ENERGY_MEAN_OVER`). A sample without a power
reading has nothing to disagree with: its mean is taken (until 2026-12-06 it was judged against the
filtered power alone, and a recording without a ``power`` column, as a dcgm-exporter configured with
energy but not power serves, counted 904 samples of a healthy 256-GPU, 10-minute run, at every load
change, and took the filtered power for them)."""
ENERGY_MEAN_OVER = 3.0
ENERGY_MEAN_UNDER = 0.5
"""An interval mean from the energy counter is its advance over the span between the rows' stamps:
a host clock that steps (NTP) or one row stamped ahead spreads the advance over a span it was not
drawn in. A clock stepping 30 s forward on 10-s polls read a GPU at 625 W as 156 W; the fit's filtered
power fell 626 -> 280 W, its residual 0.09 -> 32, and a failing loop's throttle was predicted 330 s
after it began instead of 200 s before (the row after one stamped 30 s ahead read 2,500 W, dropped
as over the limit, uncounted; until 2026-12-05). So a mean over ENERGY_MEAN_OVER times the larger of
the sample's own ``power`` and the filtered power (the interval means so far), or under
ENERGY_MEAN_UNDER times the smaller, is no interval mean: the sample's power is taken, and counted.
A 1-s sample can land in a step's communication or wait phase while the mean covers the whole step;
on a simulated 1,024-GPU 6-h recording (seed 34, 2.2 M intervals, honest stamps) the mean read at
most 2.24 times the larger (a job starting, its sample in a communication phase) and never under
0.78 times the smaller: no honest interval is refused. The GPU bank bench's mean is its sample. A
step of 30 s on 10-s polls reads 0.25 or 4 times; missed polls with honest stamps read the power
over their whole span, as the energy counter should (a clock step under a poll's length is a
smaller error than the rhythm's, and is not told from it)."""
ENERGY_OVER_LIMIT = "energy counter's interval mean over the enforced power limit: not taken"
"""... and one that agrees with no reading to compare against (the sample's power missing) and lies
past the GPU's limit by OVER_LIMIT_READING_W: no power is taken for the sample (as for a reading
that far over the limit), and counted (until 2026-12-05 dropped silently)."""
DIE_BELOW_INLET_C = 1.0
DIE_BELOW_INLET = "die colder than its inlet under load (stuck sensor?): not fitted"
"""A loaded GPU's die (or HBM) cannot read below the coolant that cools it: heat flows from the die
to the inlet. A reading more than DIE_BELOW_INLET_C (whole-degree readings of both) under the inlet
while the GPU draws over ``load_min_w`` is a stuck or failed sensor, not a temperature: that model
skips the sample, as it skips a missing reading, and it is counted. A ``gpu_temp`` frozen at 53 °C
for 80 minutes while its rack inlet warmed to 65.9 °C at 463-640 W was fitted an R of -0.0243 °C/W,
exported by the resistance gauge, nothing counted, its real throttle never predicted (its 15
rack-mates' were; until 2026-12-05). An R is never learnt below 0 either (a die within the rounding
of its inlet). Judged only where the inlet is a rack's sensor: the GPUs' own proxy reads
(R - R_nominal) * P high on boards above nominal (8 °C at 0.06 °C/W, 640 W), and a healthy HBM 7 °C
over the true inlet at 260 W read under it: every reading of such GPUs was dropped, their HBM never
fitted (an audit of this check, the same day)."""
# the decays of the fit's fixed time constants over one step (kept while the step repeats: the
# rows of a frame mostly share theirs): the step, then one per time constant
D_DT, D_LEVEL, D_SLOPE, D_UL, D_UB, D_REF, D_SETTLE = range(7)
D_SIZE = 7

# ---- parameters (one float64 vector, so kernels take a single array) ----------------------
PARAMS: dict[str, float] = {
    "tau_core_s": 30.0,  # initial guesses; fitted online
    "tau_hbm_s": 60.0,
    "tau_level_s": 300.0,  # Holt level time constant for R and inlet
    "tau_slope_s": 900.0,  # Holt slope (drift) time constant
    "tau_inlet_level_s": 20.0,
    "tau_inlet_slope_s": 60.0,
    "inlet_damping_s": 240.0,  # an inlet trend is a cooling loop settling (its coolant mass, minutes):
    # a prior, replaced by the loop's own time constant (slope / -curvature) learnt as a rise bends
    "learn_damping": 1.0,  # 0: keep the prior
    "drift_damping_s": 1800.0,  # a resistance trend is forecast to settle over this (a drift
    # persists for hours and is caught anyway; a step such as a fan failure must not ramp on)
    "design_rise_c": 4.0,  # a cooling loop's coolant rise over facility water at its baseline flow
    # (the CDU approach): sets where the inlet settles when flow drops; learnt once a loss settles
    "leak_w_per_c": 3.0,  # leakage power rises with temperature (W per °C at load), up to the cap
    "margin_c": 0.5,  # fire only when the forecast clears the limit by this much ...
    "margin_per_rise": 0.1,  # ... plus this share of the rise it extrapolates (far forecasts are unsure)
    "tau_ref_power_s": 120.0,  # reference power for the steady-state target
    "horizon_s": 1800.0,  # predict crossings at most this far ahead
    "clear_factor": 1.5,  # withdraw when the ETA exceeds horizon * clear_factor ...
    "off_hold_s": 300.0,  # ... for this long
    "refresh_s": 60.0,
    "forecast_every_s": 10.0,  # the fit runs on every sample; the forecast is solved this often
    "on_count": 2.0,  # consecutive firing samples to start a prediction ...
    "urgent_s": 120.0,  # ... or one, when the crossing is this close
    "confidence_min": 0.5,
    "warmup_s": 600.0,  # loaded time before full confidence
    # fit R only under load (idle power is mostly offsets): this on a board whose enforced limit is
    # 700 W or more, scaled down with a lower one (load_min_of: a 70-W T4 works at 20 W)
    "load_min_w": 200.0,
    "gap_s": 600.0,  # a longer gap restarts the filters
    "r_nominal": facts.THERMAL_RESISTANCE_C_PER_W,
    "inlet_stale_s": 300.0,
    # a thermal hold is kept through a sample without throttle reasons, not through reasons unread
    # this long (an exporter restarted without its custom counters): then it is let go (as
    # power.reasons_stale_s lets a brake go)
    "reasons_stale_s": 300.0,
    # the limits where the GPU reports none of its own (max_op_temp, hbm_max_op_temp; for the core,
    # else its slowdown_temp less slowdown_to_max_operating_c)
    "limit_core_c": facts.MAX_OPERATING_TEMP_C,
    "limit_hbm_c": facts.HBM_MAX_OPERATING_TEMP_C,
    "slowdown_to_max_operating_c": facts.HW_SLOWDOWN_TEMP_C - facts.MAX_OPERATING_TEMP_C,
    "tau_min_s": 2.0,
    "tau_max_s": 3000.0,
    "tau_excitation_c": 3.0,  # observe tau only when T is this far from its target
    "site_damping_s": float("nan"),  # state, not a setting: the loops' learnt time constant
    "site_rise_c": float("nan"),  # state, not a setting: the loops' learnt coolant rise
    # the forecast extrapolates only what the temperature confirms (see thermal.observe_trend):
    "trend_window_s": 300.0,  # R's observed rate is measured over the last W/2..W, W = max(this, 3 tau)
    "trend_smooth_s": 60.0,  # R samples are smoothed over this first (integer °C readings)
    "trend_confirm": 1.5,  # the R drift extrapolated is at most this multiple of the observed one
    "trend_noise": 0.5,  # ... less this many times the rate that the samples' scatter alone can show
    # how far ahead the thermal forecast carries a falling coolant flow's trend (at most a
    # fourfold drop): a design figure, apart from the loop's learnt time constant, which only
    # sets how fast the inlet approaches where that flow settles it. Tied to the time constant,
    # an accurately learnt loop (175 s against the 240 s prior) carried the flow less and every
    # loss after the first was called a minute later. (The power detector's 5-minute forecast
    # carries it over the loop's time constant.)
    "flow_carry_s": 240.0,
    # ... and no lower than this share of the baseline flow (0: as far as the fourfold cap
    # allows). Where a falling flow stops no reading tells mid-fall: a planning floor spares
    # losses that stop above it and warns later on those that go below (docs/throttling.md: the figures)
    "flow_plan_floor": 0.0,
    # the inlet's own trend is forecast only as far as the dies follow it (thermal.follow_inlet): a
    # coolant warming raises them with their time constant, a sensor stepping does not. The check
    # weighs the last inlet_follow_taus core time constants, and allows the dies' scatter plus this
    # much (°C) of the inlet's rise unfollowed
    "inlet_follow_taus": 4.0,
    "inlet_follow_slack_c": 1.0,
}
PARAM_NAMES = tuple(PARAMS)
P = {name: i for i, name in enumerate(PARAM_NAMES)}
(P_TAU_CORE, P_TAU_HBM, P_TAU_LEVEL, P_TAU_SLOPE, P_TAU_UL, P_TAU_UB, P_DAMP, P_LEARN_DAMP, P_DRIFT_DAMP, P_RISE, P_LEAK, P_MARGIN, P_MARGIN_RISE,
 P_TAU_REF, P_HORIZON,
 P_CLEAR, P_OFF_HOLD, P_REFRESH, P_EVERY, P_ON, P_URGENT, P_CONF_MIN, P_WARMUP, P_LOAD_MIN, P_GAP, P_R_NOM,
 P_STALE, P_REASONS_STALE, P_LIM_CORE, P_LIM_HBM, P_SLOWDOWN_OFF, P_TAU_MIN, P_TAU_MAX, P_TAU_EXC, P_SITE_DAMP,
 P_SITE_RISE,
 P_TREND_WINDOW, P_TREND_SMOOTH, P_TREND_CONFIRM, P_TREND_NOISE, P_FLOW_CARRY, P_FLOW_PLAN_FLOOR,
 P_FOLLOW_TAUS, P_FOLLOW_SLACK) = range(len(PARAMS))


def params_vector(overrides: dict[str, float]) -> np.ndarray:
    vec = np.array(list(resolve_params("thermal", PARAMS, overrides).values()))
    if vec[P_HORIZON] <= 0 or vec[P_TAU_CORE] <= 0 or vec[P_TAU_HBM] <= 0:
        raise ValueError("thermal: horizon_s and the time constants must be positive")
    if not 0.0 <= vec[P_FLOW_PLAN_FLOOR] < 1.0:
        raise ValueError("thermal: flow_plan_floor is a share of the baseline flow, 0 to under 1")
    if not vec[P_FOLLOW_TAUS] > 0.0:
        raise ValueError("thermal: inlet_follow_taus must be positive")
    return vec
FIT_PARAMS = ("tau_core_s", "tau_hbm_s", "tau_level_s", "tau_slope_s", "tau_inlet_level_s",
              "tau_inlet_slope_s", "tau_ref_power_s", "load_min_w", "gap_s", "r_nominal",
              "inlet_stale_s", "tau_min_s", "tau_max_s", "tau_excitation_c")
"""The parameters the fit reads; detectors whose fits agree on these can share one."""


def new_model_state(n: int, params: np.ndarray) -> np.ndarray:
    """``(n, MODEL_WIDTH)``: common columns, core block, HBM block, the inlet's source."""
    state = np.full((n, MODEL_WIDTH), np.nan)
    for m, tau in ((CORE, params[P_TAU_CORE]), (HBM, params[P_TAU_HBM])):
        off = G_SIZE + m * M_SIZE
        state[:, off + M_TAU] = tau
        state[:, off + M_RB] = 0.0
        state[:, off + M_RES] = 0.0
        state[:, off + M_LOADED] = 0.0
        state[:, off + M_STALE] = 0.0
    return state


# ---- kernels ------------------------------------------------------------------------------
@kernel
def decay(dt: float, tau: float) -> float:
    """Weight of the old value after ``dt`` for a first-order filter of time constant ``tau``."""
    return np.exp(-dt / tau)  # type: ignore[no-any-return]


def new_decay_cache(sites: int) -> np.ndarray:
    """Scratch for :func:`cached_decay` with one row per call site: most rows of a frame share
    ``dt``, and the time constants are parameters, so each site's ``exp`` is computed once per
    distinct dt."""
    return np.full((sites, 3), np.nan)


def new_step_decays() -> np.ndarray:
    """Scratch for :func:`step_decays`."""
    return np.full(D_SIZE, np.nan)


@inline
def step_decays(d: np.ndarray, dt: float, params: np.ndarray) -> None:
    """``decay(dt, tau)`` of each fixed time constant of the fit into ``d`` (see ``D_*``), unless
    ``d`` holds this step's already: once per distinct step, not once per use."""
    if d[D_DT] != dt:
        d[D_DT] = dt
        d[D_LEVEL] = np.exp(-dt / params[P_TAU_LEVEL])
        d[D_SLOPE] = np.exp(-dt / params[P_TAU_SLOPE])
        d[D_UL] = np.exp(-dt / params[P_TAU_UL])
        d[D_UB] = np.exp(-dt / params[P_TAU_UB])
        d[D_REF] = np.exp(-dt / params[P_TAU_REF])
        d[D_SETTLE] = np.exp(-dt / SETTLE_TAU_S)


@inline
def cached_decay(cache: np.ndarray, k: int, dt: float, tau: float) -> float:
    """``decay(dt, tau)`` memoised in row ``k`` of ``cache`` (one row per call site)."""
    if cache[k, 0] != dt or cache[k, 1] != tau:
        cache[k, 0] = dt
        cache[k, 1] = tau
        cache[k, 2] = np.exp(-dt / tau)
    return cache[k, 2]  # type: ignore[no-any-return]


@kernel
def holt(level: float, slope: float, x: float, dt: float, w_level: float,
         w_slope: float) -> tuple[float, float]:
    """Holt's linear smoothing with irregular steps: new (level, slope per second).

    ``w_level``/``w_slope`` are the step's smoothing weights, ``1 - exp(-dt / tau)``."""
    pred = level + slope * dt
    new_level = pred + w_level * (x - pred)
    new_slope = slope + w_slope * ((new_level - level) / dt - slope)
    return new_level, new_slope


@inline
def load_min_of(s: np.ndarray, i: int, params: np.ndarray) -> float:
    """GPU ``i``'s least power under load: ``load_min_w`` (200 W) on a board whose enforced limit is
    :data:`facts.POWER_LIMIT_W` (700 W) or more, scaled with a lower one, or where none is known. Until
    2026-12-06 it was 200 W whatever the board: a T4 (70 W), an L4 or an A10 never counted as loaded,
    its R was never fitted and no thermal throttle was ever predicted on it (an audit's T4 ramping
    +4 °C/min at 60 W throttled unwarned; with 20 W it was called 2 min ahead, as at 500 W of 700)."""
    plim = s[i, G_PLIM]
    if plim < facts.POWER_LIMIT_W:  # (False for NaN: no limit known)
        return params[P_LOAD_MIN] * plim / facts.POWER_LIMIT_W  # type: ignore[no-any-return]
    return params[P_LOAD_MIN]  # type: ignore[no-any-return]


def load_min_of_all(s: np.ndarray, params: np.ndarray) -> np.ndarray:
    """:func:`load_min_of` of every GPU of the fit's state ``s``."""
    plim = s[:, G_PLIM]
    with np.errstate(invalid="ignore"):
        return np.where(plim < facts.POWER_LIMIT_W, params[P_LOAD_MIN] * plim / facts.POWER_LIMIT_W,
                        params[P_LOAD_MIN])


@inline
def model_step(s: np.ndarray, i: int, off: int, dt: float, temp: float, power: float,
               inlet: float, params: np.ndarray, d: np.ndarray, load_min: float) -> tuple[bool, float]:
    """Fit one first-order model (core or HBM) of GPU ``i`` on one sample. Returns whether the
    sample observes the time constant, and the ratio it observes it by: the caller updates
    ``tau`` (:func:`learn_tau`) once the run's rows are fitted (see :func:`_fit_kernel`). ``load_min``:
    the GPU's least power under load (:func:`load_min_of`), taken once per row for both models."""
    if s[i, off + M_DECAY_DT] == dt:
        a = s[i, off + M_DECAY]
    else:
        a = decay(dt, s[i, off + M_TAU])
        s[i, off + M_DECAY] = a
        s[i, off + M_DECAY_DT] = dt
    tprev = s[i, off + M_TPREV]
    rl = s[i, off + M_RL]
    pf = s[i, off + M_PF]
    pf_next = pf if power != power else (power if pf != pf else a * pf + (1.0 - a) * power)
    loaded = inlet == inlet and pf_next > load_min
    stale = s[i, off + M_STALE]
    catching = loaded and rl == rl and (stale < 0.0 or stale >= STALE_R_S)
    excited, ratio = False, np.nan
    if tprev == tprev and inlet == inlet and power == power and rl == rl and not catching:
        target = inlet + rl * power
        resid = temp - (target + (tprev - target) * a)
        w = 1.0 - d[D_LEVEL]
        s[i, off + M_RES] += w * (resid * resid - s[i, off + M_RES])
        gap = tprev - target
        # tau shows where the temperature is far from its target and has gone part of the way.
        # Bitwise & (no short cut) and no branch on it here: under a training step's rhythm it
        # is a coin toss per sample, and the mispredicted branch took a quarter of the fit's time
        # (bench_gpu_bank: 72 -> 65 ns per GPU with the update deferred to _fit_kernel's end)
        ratio = (temp - target) / gap if gap != 0.0 else np.nan
        excited = (abs(gap) >= params[P_TAU_EXC]) & (ratio > 0.02) & (ratio < 0.98)
    s[i, off + M_PF] = pf_next
    s[i, off + M_TPREV] = temp
    if loaded:
        r = max((temp - inlet) / pf_next, 0.0)  # (a die within the rounding of its inlet: DIE_BELOW_INLET)
        if rl != rl:
            s[i, off + M_RL] = r
            s[i, off + M_RB] = 0.0
        elif catching:  # back under load after R went unseen (STALE_R_S): catch its level up
            if stale >= 0.0:
                stale = -CATCH_UP_S
            s[i, off + M_RL] = rl + (1.0 - decay(dt, CATCH_UP_TAU_S)) * (r - rl)
            s[i, off + M_STALE] = min(stale + dt, 0.0)
        else:
            if s[i, off + M_LOADED] >= SLOPE_AFTER_S:
                w_level, w_slope = 1.0 - d[D_LEVEL], 1.0 - d[D_SLOPE]
            else:  # its first minutes under load settle R: a quick level, no drift (SLOPE_AFTER_S)
                w_level, w_slope = 1.0 - d[D_SETTLE], 0.0
            level, s[i, off + M_RB] = holt(rl, s[i, off + M_RB], r, dt, w_level, w_slope)
            s[i, off + M_RL] = max(level, 0.0)  # (a falling slope extrapolated past 0: not learnt)
            s[i, off + M_STALE] = 0.0
        s[i, off + M_LOADED] += min(dt, 120.0)  # a long gap is not load seen
    elif rl == rl:
        s[i, off + M_STALE] = max(stale, 0.0) + dt
    return excited, ratio


@inline
def learn_tau(s: np.ndarray, i: int, off: int, dt: float, ratio: float, params: np.ndarray) -> None:
    """Move log tau a tenth of the way to what a sample observed: it went ``ratio`` of the way
    back to its target in ``dt`` (``0 < ratio < 1``)."""
    tau = s[i, off + M_TAU]
    log_tau = np.log(tau) + 0.1 * (np.log(-dt / np.log(ratio)) - np.log(tau))
    tau = min(max(np.exp(log_tau), params[P_TAU_MIN]), params[P_TAU_MAX])
    s[i, off + M_TAU] = tau
    s[i, off + M_DECAY] = decay(dt, tau)  # for the next sample, if its step is this one
    s[i, off + M_DECAY_DT] = dt


@inline
def valid_limit(plim: float) -> bool:
    return 50.0 < plim < 1e5  # (False for NaN)


@inline
def power_limit(obs: tuple[np.ndarray, ...], row: int, s: np.ndarray, i: int) -> float:
    """GPU ``i``'s enforced power limit at ``row``: the row's, else the last one reported (NaN: none)."""
    plim = obs[X_PLIMIT][row]
    return plim if valid_limit(plim) else s[i, G_PLIM]  # type: ignore[no-any-return]


@inline
def observe(obs: tuple[np.ndarray, ...], row: int, s: np.ndarray, n_models: int, parents: np.ndarray,
            racks: np.ndarray, nodes: np.ndarray, params: np.ndarray,
            d: np.ndarray) -> tuple[float, float, float, float]:
    """Common per-sample bookkeeping: ``(dt, power, inlet, energy_bad)``; ``dt < 0`` means skip the
    row; ``energy_bad`` 0.0 where the energy counter gave a sane interval mean (or none), else why not
    (``E_*``: ENERGY_NOT_SANE, ENERGY_DISAGREES, ENERGY_OVER_LIMIT).

    Power is the interval mean from the energy counter where it is sane (a ``power.draw``
    sample alone aliases the training-step rhythm), else the sample. After a gap the filters
    restart. The common part of the fit (:func:`_fit_kernel` runs it once per sample).
    """
    ts = obs[X_TS][row]
    i = int(obs[X_SLOT][row])
    power = obs[X_POWER][row]
    last = s[i, G_TS]
    dt = ts - last
    if last == last and dt <= 0.0:
        return -1.0, np.nan, np.nan, 0.0
    if power == power and not 0.0 < power < 1e5:
        # a sentinel or garbage reading is missing, not a measurement; and so is 0 W, which no
        # powered board draws (exporters that print 0 for N/A): a node's loaded GPUs read 0 W for
        # ten minutes, their proxy inlet (no rack frames) read T - R·0 as the inlet jumping, and all 8
        # were predicted to throttle (until 2026-12-01)
        power = np.nan
    energy = obs[X_ENERGY][row]
    e_last = s[i, G_ENERGY]
    energy_bad = 0.0
    if energy != e_last:  # (a reading equal to the last is the exporter's cache: see G_ENERGY_TS)
        span = ts - s[i, G_ENERGY_TS]
        if energy == energy and e_last == e_last and last == last and dt <= params[P_GAP] \
                and span <= params[P_GAP]:
            mean_power = (energy - e_last) / span
            if not 0.0 <= mean_power < 1e5:
                energy_bad = E_NOT_SANE
            else:
                # against the sample's power and the interval means so far (ENERGY_MEAN_OVER; NaN: not
                # compared — bitwise, no branch: a sample lands in a compute or a communication phase
                # at random, and a branch on which is the larger mispredicted a fifth of the time)
                pf = s[i, G_SIZE + CORE * M_SIZE + M_PF]
                p_nan, f_nan = power != power, pf != pf
                over = ((mean_power > ENERGY_MEAN_OVER * power) | p_nan) \
                    & ((mean_power > ENERGY_MEAN_OVER * pf) | f_nan)
                under = ((mean_power < ENERGY_MEAN_UNDER * power) | p_nan) \
                    & ((mean_power < ENERGY_MEAN_UNDER * pf) | f_nan)
                if (over | under) & (power == power):  # (no power reading: none to disagree with)
                    energy_bad = E_DISAGREES  # (the sample's power stands)
                elif mean_power > power_limit(obs, row, s, i) + OVER_LIMIT_READING_W:
                    energy_bad = E_OVER_LIMIT
                    power = np.nan
                else:
                    power = mean_power
        s[i, G_ENERGY] = energy
        # after a reading that is no interval mean the next one is judged from nothing (ENERGY_NOT_SANE)
        s[i, G_ENERGY_TS] = np.nan if energy_bad == E_NOT_SANE else ts
    if power > power_limit(obs, row, s, i) + OVER_LIMIT_READING_W:  # (False where no limit is known)
        power = np.nan
    if last != last or dt > params[P_GAP]:
        s[i, G_PREF] = power
        for m in range(n_models):
            s[i, G_SIZE + m * M_SIZE + M_PF] = power
            s[i, G_SIZE + m * M_SIZE + M_TPREV] = np.nan
        dt = params[P_GAP]  # Holt steps after a gap see one long step
    s[i, G_TS] = ts
    step_decays(d, dt, params)
    # the node proxy is fed after the core model's step (_fit_kernel): it needs this sample's
    # filtered power
    node_tick(ts, parents[i, 1], nodes)
    inlet, source = read_inlet(ts, parents[i, 1], parents[i, 0], racks, nodes, params[P_STALE])
    if inlet == inlet:
        if s[i, G_USRC] == s[i, G_USRC] and s[i, G_USRC] != source:
            switch_inlet_source(s, i, n_models, inlet, load_min_of(s, i, params))
        s[i, G_USRC] = source
    if power == power:
        pr = s[i, G_PREF]
        w = d[D_REF]
        if pr != pr or power > 1.5 * pr:
            s[i, G_PREF] = power  # a step up (a job starting) is the new reference at once
        else:
            s[i, G_PREF] = w * pr + (1.0 - w) * power
    if inlet == inlet:
        if s[i, G_UL] != s[i, G_UL]:  # the first inlet (of its source): the trend starts here
            s[i, G_UL] = inlet
            s[i, G_UB] = 0.0
        else:
            s[i, G_UL], s[i, G_UB] = holt(s[i, G_UL], s[i, G_UB], inlet, dt,
                                          1.0 - d[D_UL], 1.0 - d[D_UB])
    plim = obs[X_PLIMIT][row]
    if valid_limit(plim):
        s[i, G_PLIM] = plim
    # the GPU's own thresholds, kept through a poll that misses them (an offset from T.Limit, or 0,
    # is not one: see facts.OWN_LIMIT_MIN_C)
    for x, g in ((X_SLOWDOWN, G_SLOWDOWN), (X_MAX_OP, G_MAX_OP), (X_HBM_MAX_OP, G_HBM_MAX_OP)):
        own = obs[x][row]
        if facts.OWN_LIMIT_MIN_C < own < facts.OWN_LIMIT_MAX_C:  # (False for NaN)
            s[i, g] = own
    return dt, power, inlet, energy_bad


@inline
def core_limit(s: np.ndarray, i: int, params: np.ndarray) -> float:
    """GPU ``i``'s core limit: its own max operating temperature as last reported, else its own
    slowdown temperature less ``slowdown_to_max_operating_c``, else ``limit_core_c``."""
    if s[i, G_MAX_OP] == s[i, G_MAX_OP]:
        return s[i, G_MAX_OP]  # type: ignore[no-any-return]
    if s[i, G_SLOWDOWN] == s[i, G_SLOWDOWN]:
        return s[i, G_SLOWDOWN] - params[P_SLOWDOWN_OFF]  # type: ignore[no-any-return]
    return params[P_LIM_CORE]  # type: ignore[no-any-return]


@inline
def hbm_limit(s: np.ndarray, i: int, params: np.ndarray) -> float:
    """GPU ``i``'s HBM limit: its own memory max operating temperature as last reported, else
    ``limit_hbm_c``."""
    if s[i, G_HBM_MAX_OP] == s[i, G_HBM_MAX_OP]:
        return s[i, G_HBM_MAX_OP]  # type: ignore[no-any-return]
    return params[P_LIM_HBM]  # type: ignore[no-any-return]


@inline
def hw_slowdown_limit(s: np.ndarray, i: int, limit_core: float, params: np.ndarray) -> float:
    """GPU ``i``'s HW slowdown temperature: its own as last reported, else
    ``slowdown_to_max_operating_c`` over its core limit (``limit_core``, :func:`core_limit`)."""
    if s[i, G_SLOWDOWN] == s[i, G_SLOWDOWN]:
        return s[i, G_SLOWDOWN]  # type: ignore[no-any-return]
    return limit_core + params[P_SLOWDOWN_OFF]


@inline
def switch_inlet_source(s: np.ndarray, i: int, n_models: int, inlet: float, load_min: float) -> None:
    """GPU ``i``'s inlet now comes from another source (``G_USRC``): its level steps to ``inlet``.
    The inlet's trend starts over from it. Each model's R, fitted against the old source, is moved
    by the step over its filtered power (the steady-state target ``inlet + R·P`` stays where it was:
    the dies did not move) where it works, and then catches up with the readings (the STALE_R_S
    path: its level follows them for CATCH_UP_S, residual and tau not learnt meanwhile); and no
    previous temperature is kept, so the forecast's R trend starts over too (as after a gap)."""
    step = inlet - s[i, G_UL]
    s[i, G_UL] = np.nan  # (the inlet read next, this sample's, starts the level and trend over)
    for m in range(n_models):
        off = G_SIZE + m * M_SIZE
        s[i, off + M_TPREV] = np.nan
        if s[i, off + M_RL] == s[i, off + M_RL]:
            if s[i, off + M_PF] > load_min and step == step:
                s[i, off + M_RL] -= step / s[i, off + M_PF]
            s[i, off + M_STALE] = STALE_R_S


@kernel
def _fit_kernel(obs: tuple[np.ndarray, ...], lo: int, hi: int, parents: np.ndarray, s: np.ndarray,
                env: tuple[np.ndarray, np.ndarray], params: np.ndarray, rows: np.ndarray,
                decays: np.ndarray, taus: np.ndarray, counts: np.ndarray) -> int:
    """Fit both models on rows ``lo..hi-1``; fill ``rows`` (see ``R_*``); return rows skipped
    as out of order. ``env`` = (rack state, node state); ``taus``: scratch of at least
    ``N_MODELS * (hi - lo)`` rows of 4; ``counts`` (C_*) gains the rows' input problems.

    The samples that observe a time constant are gathered without a branch and learnt after the
    rows (:func:`model_step`): no GPU appears twice in the rows (:func:`repeat_free_runs`), so
    each tau is still read before it is learnt, as in one pass."""
    racks, nodes = env
    skipped = 0
    n_taus = 0
    for row in range(lo, hi):
        src_before = s[int(obs[X_SLOT][row]), G_USRC]
        dt, power, inlet, energy_bad = observe(obs, row, s, N_MODELS, parents, racks, nodes, params, decays)
        rows[row, R_DT] = dt
        rows[row, R_ENERGY_BAD] = energy_bad
        rows[row, R_SRC_SAME] = 1.0 if s[int(obs[X_SLOT][row]), G_USRC] == src_before else 0.0
        if energy_bad != 0.0:  # (by its E_* code; mostly 0: a sane mean, or none)
            counts[int(energy_bad)] += 1.0
        if dt < 0.0:
            skipped += 1
            continue
        i = int(obs[X_SLOT][row])
        rows[row, R_TPREV] = s[i, G_SIZE + CORE * M_SIZE + M_TPREV]
        n_cold = 0
        # judged against a rack's sensor only: a proxy inlet (T - R_nominal * P) reads high by
        # (R - R_nominal) * P on boards above nominal, and a healthy HBM under it is no stuck sensor
        src = s[i, G_USRC]
        from_rack = src == src and src != INLET_RACK_PROXY and src != INLET_NODE_PROXY
        load_min = load_min_of(s, i, params)
        for m in range(N_MODELS):
            temp = obs[X_TEMP][row] if m == CORE else obs[X_HBM][row]
            off = G_SIZE + m * M_SIZE
            # a loaded die colder than its inlet is a stuck sensor, no reading (DIE_BELOW_INLET); loaded:
            # this sample's power, else (none) the power filtered so far
            cold = from_rack and -50.0 < temp < inlet - DIE_BELOW_INLET_C and (
                power > load_min or (power != power and s[i, off + M_PF] > load_min))
            n_cold += cold
            if not (temp == temp and -50.0 < temp < 200.0) or cold:
                # no temperature, the clock moved on (G_TS): the next reading's step is one poll, its
                # previous temperature polls older. Judged as one step, it skewed tau, the residual
                # (confidence 1.0 -> 0.53) and the power detector's temperature slope (until
                # 2026-12-02). No previous temperature, as after a gap: the next reading starts over
                s[i, off + M_TPREV] = np.nan
                continue
            excited, ratio = model_step(s, i, off, dt, temp, power, inlet, params, decays, load_min)
            if m == CORE:
                pf = s[i, off + M_PF]
                unsteady = params[P_R_NOM] * abs(power - pf)  # NaN (unknown) counts as steady
                node_feed(parents[i, 1], temp, pf, nodes, params[P_R_NOM],
                          unsteady if unsteady == unsteady else 0.0)
            taus[n_taus, 0] = i
            taus[n_taus, 1] = off
            taus[n_taus, 2] = dt
            taus[n_taus, 3] = ratio
            n_taus += 1 if excited else 0
        if n_cold:
            counts[C_DIE_COLD] += n_cold
    for k in range(n_taus):
        learn_tau(s, int(taus[k, 0]), int(taus[k, 1]), taus[k, 2], taus[k, 3], params)
    return skipped


@kernel
def sum_rack_gpu_heat(model: np.ndarray, gpus: np.ndarray, gpu_rack: np.ndarray, now: float, stale: float,
                      heat: np.ndarray, count: np.ndarray) -> None:
    """Into ``heat`` and ``count`` (per rack, zeroed), the core model's filtered power (``M_PF``) of
    each GPU of ``gpus`` (whose racks ``gpu_rack`` lists) fitted within ``stale`` of ``now`` with a
    power above 0, and how many. One pass over the GPUs' rows: gathering the two columns with numpy
    and counting them cost 0.33 ms a rack frame on 16,384 GPUs, 20 ns per GPU of the bank's tick."""
    pf = G_SIZE + CORE * M_SIZE + M_PF
    for i in range(len(gpus)):
        g = gpus[i]
        power = model[g, pf]
        if now - model[g, G_TS] <= stale and power > 0.0:
            r = gpu_rack[i]
            heat[r] += power
            count[r] += 1


@kernel
def repeat_free_runs(slots: np.ndarray, seen: np.ndarray, first_id: int, ends: np.ndarray) -> int:
    """Cut the rows (their ``slots``) into runs in which no GPU appears twice; ``ends[k]`` is the
    end (exclusive) of run ``k``; returns the number of runs. ``seen[slot]`` holds the id of the run
    the slot was last seen in: ids start at ``first_id`` and must never have been used before."""
    n = 0
    run = first_id
    for row in range(len(slots)):
        i = int(slots[row])
        if seen[i] == run:
            ends[n] = row
            n += 1
            run += 1
        seen[i] = run
    if len(slots) > 0:
        ends[n] = len(slots)
        n += 1
    return n


@kernel
def poll_order_keys(ts: np.ndarray, slots: np.ndarray, fitted: np.ndarray, latest: np.ndarray,
                    keys: np.ndarray) -> None:
    """Into ``keys``, per row, its stamp, or +inf for a late row: one no newer than its GPU's last
    fitted sample (``fitted``: the state's ``G_TS``) or than a row of its GPU listed before it. The
    fit skips a late row wherever it stands after those; sorted stably by these keys, the rows stand
    in time order across GPUs, each GPU's rows as listed, the late rows last: none cuts a poll into
    two runs. ``latest`` (per slot, -inf) is left as it was found."""
    for row in range(len(ts)):
        i = int(slots[row])
        t = ts[row]
        newest = latest[i]
        if fitted[i] > newest:  # (NaN: never fitted)
            newest = fitted[i]
        keys[row] = t if t > newest else np.inf
        latest[i] = max(latest[i], t)
    for row in range(len(ts)):
        latest[int(slots[row])] = -np.inf


def poll_order(ts: np.ndarray, slots: np.ndarray, fitted: np.ndarray, latest: np.ndarray) -> np.ndarray:
    """The order to take the rows of a frame of several polls in: stably by :func:`poll_order_keys`
    (time order across GPUs, each GPU's own rows as listed, late rows last). The thermal fit and
    the baselines' feature stream both take such a frame so, after their own cheap checks that it
    needs it (its stamps go back; a GPU repeats in it)."""
    keys = np.empty(len(ts))
    poll_order_keys(ts, slots, fitted, latest, keys)
    return np.argsort(keys, kind="stable")


# ---- the shared fit ---------------------------------------------------------------------------
class FitConsumer(Protocol):
    """A detector that predicts per sample from the fit (thermal, power)."""

    def begin_frame(self, fit: "ThermalFit") -> None:
        """A new GPU frame is being fitted (``fit.obs`` holds its rows): reset the emissions."""

    def after_fit(self, fit: "ThermalFit", lo: int, hi: int) -> None:
        """Rows ``lo..hi-1`` of ``fit.obs`` are fitted: predict on them."""


class _Tally(PipelineHealth):
    """Input problems of one fitted frame, relayed by each detector to its own health
    (``found`` is replaced, not cleared, per frame: detectors hold the previous list)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, int]] = []

    def problem(self, stage: str, reason: str, count: int = 1, detail: str = "") -> None:
        if count > 0:
            self.found.append((reason, count))


# the fit's arrays, which every ThermalFitDetector holds as state (``Detector.slot_kinds``)
FIT_SLOT_KINDS: Mapping[str, str] = {"s_model": "gpu", "s_rack": "rack", "s_node": "node"}


class ThermalFit:
    """The thermal model of every GPU of ``topology``, fitted once per frame (see module doc)."""

    def __init__(self, topology: Topology, params: np.ndarray) -> None:
        self.topology = topology
        self.params = params.copy()
        n = topology.size("gpu")
        self.parents = np.ascontiguousarray(np.stack([topology.gpu_rack, topology.gpu_node], axis=1),
                                            dtype=np.int64) if n else np.zeros((0, 2), np.int64)
        self.s_model = new_model_state(n, self.params)
        self.s_rack, self.s_node = new_inlet_states(topology)
        gpu_rack = np.asarray(topology.gpu_rack, dtype=np.int64) if n else np.zeros(0, np.int64)
        self._in_rack = np.flatnonzero(gpu_rack >= 0)  # the GPUs that have a rack, and their racks
        self._gpu_rack = gpu_rack[self._in_rack]
        self._loop_racks = topology.physical_racks
        self.consumers: list[FitConsumer] = []
        self.obs: tuple[np.ndarray, ...] = tuple(np.empty(0) for _ in range(2 + len(OBS_FIELDS)))
        self.rows = np.empty((0, ROW_SIZE))
        self.problems: list[tuple[str, int]] = []
        self._frame: Frame | None = None
        self._served: list[object] = []
        self._seen = np.full(n, -1, np.int64)
        self._next_run = 0
        self._latest = np.full(n, -np.inf)  # poll_order's scratch
        self._tally = _Tally()
        self._scratch = Scratch()
        self.heard_all = False  # see _fit_gpu

    @property
    def key(self) -> tuple[Any, ...]:
        """Fits with equal keys compute the same thing from the same frames."""
        return (id(self.topology),) + tuple(float(self.params[P[name]]) for name in FIT_PARAMS)

    def state(self) -> dict[str, np.ndarray]:
        return {"s_model": self.s_model, "s_rack": self.s_rack, "s_node": self.s_node}

    def same_state(self, other: "ThermalFit") -> bool:
        mine, theirs = self.state(), other.state()
        return all(np.array_equal(mine[k], theirs[k], equal_nan=True) for k in mine)

    def update(self, frame: Frame, caller: object) -> None:
        """Fit on ``frame`` (a ``gpu`` or ``rack`` frame) for ``caller``, unless it was just
        fitted for another detector."""
        if frame is self._frame and caller not in self._served:
            self._served.append(caller)
            return
        self._frame, self._served = frame, [caller]
        tally = self._tally
        tally.found = []
        if frame.kind == "rack":
            update_rack_inlet(self._with_gpu_heat(rack_inlet_obs(frame, len(self.s_rack), tally, "")), self.s_rack)
        elif frame.kind == "gpu":
            self._fit_gpu(frame, tally)
        self.problems = tally.found

    @property
    def fitted_for(self) -> object:
        """The detector the frame fitted last was fitted for (the first to ask): the one that counts
        its input problems (one sample, one problem), which every detector reading the fit counted
        until 2026-12-06 (thermal, power and cooling: 3x)."""
        return self._served[0] if self._served else None

    def _with_gpu_heat(self, obs: np.ndarray) -> np.ndarray:
        """Rack rows ``[ts, slot, inlet, flow, heat]`` with the rack's GPUs' heat and the heat under
        which it shows no work appended (``gpu_inputs.track_heat``), where a row has no PDU power:
        the core model's filtered power (``M_PF``: the energy counter's interval mean where sane) of
        the rack's GPUs fitted within ``inlet_stale_s`` of the frame, summed, and ``load_min_w`` for
        each of them (NaN where none is, or the rack is no loop's: an import's ``unknown`` one).
        Once per rack frame, over every GPU: their latest power, whichever frames brought it."""
        if not len(obs) or (obs[:, 4] > 0.0).all():
            return obs
        stale = self.params[P_STALE]
        n_racks = len(self.s_rack)
        heat, count = np.zeros(n_racks), np.zeros(n_racks, dtype=np.int64)
        sum_rack_gpu_heat(self.s_model, self._in_rack, self._gpu_rack, frame_now(obs[:, 0], stale), stale,
                          heat, count)
        heat[(count == 0) | ~self._loop_racks] = np.nan
        floor = count * self.params[P_LOAD_MIN]
        slot = obs[:, 1].astype(np.int64)
        return np.ascontiguousarray(np.column_stack([obs, heat[slot], floor[slot]]))

    @property
    def n_rows(self) -> int:
        """The rows of the frame fitted last (``obs``)."""
        return len(self.obs[X_TS])

    def _in_time_order(self, obs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """``obs`` of a frame of several polls with its rows in time order across GPUs, each GPU's own
        rows as listed, late rows last (:func:`poll_order`); as it is where they already stand in
        time order (one pass: several ticks listed tick by tick). A frame of one poll (no GPU repeats:
        one run, judged whole) is left as listed, as before: its stamps spread over the scrape, so
        most such frames are not in time order, and sorting each would cost every tick a sort.

        The runs (:func:`repeat_free_runs`) are the polls the consumers judge together: a frame of
        two polls listed by GPU (a source batching by GPU; GPU0 at 100 and 105 s, then GPU1 at 100
        and 105 s) was cut GPU0@100 | GPU0@105 GPU1@100 | GPU1@105, and the power detector read GPU0
        braking at 105 s and GPU1 at 100 s as "2 of 4 GPUs braking together", which no poll showed
        (until 2026-12-05). The consumers read the rows from ``obs`` only, so reordering it reorders
        them for all. A GPU's own rows are not sorted: one listed after a newer one of its GPU is
        late, as the input guard (``out_of_order``) and the straggler detector count it (sorted in,
        a host clock stepping back would swap two samples). The same rows are fitted, and skipped
        and counted, as in the order listed.
        """
        ts = obs[X_TS]
        if not (ts[1:] < ts[:-1]).any():
            return obs
        order = poll_order(ts, obs[X_SLOT], self.s_model[:, G_TS], self._latest)
        return tuple(column[order] for column in obs)

    def _fit_gpu(self, frame: Frame, tally: _Tally) -> None:
        obs = gpu_columns(frame, OBS_FIELDS, len(self.s_model), tally, "", self._scratch)
        n_rows = len(obs[X_TS])
        ends = self._scratch.take("ends", (n_rows + 1, 1), dtype=np.int64)[:, 0]
        n_runs = repeat_free_runs(obs[X_SLOT], self._seen, self._next_run, ends)
        self._next_run += n_runs
        if n_runs > 1:  # several polls (a GPU repeats): in time order, else the runs mix them
            ordered = self._in_time_order(obs)
            if ordered is not obs:
                obs = ordered
                n_runs = repeat_free_runs(obs[X_SLOT], self._seen, self._next_run, ends)
                self._next_run += n_runs
        self.obs = obs
        # every GPU of the topology in this frame once (one run of n rows, no repeats), its stamps
        # within gap_s: each GPU's G_TS, set or left newer by its row, lies within gap_s of the
        # frame's time, so none is silent (ThermalFitDetector.withdraw_silent_gpus skips its pass
        # over every GPU: 11 ns per GPU of the bank's 10-s tick for the thermal and power detectors)
        self.heard_all = (n_runs == 1 and n_rows == len(self.s_model) and n_rows > 0
                          and float(obs[X_TS].max()) - float(obs[X_TS].min()) <= self.params[P_GAP])
        self.rows = self._scratch.take("rows", (n_rows, ROW_SIZE))
        for consumer in self.consumers:
            consumer.begin_frame(self)
        decays = new_step_decays()
        taus = self._scratch.take("taus", (N_MODELS * n_rows + 1, 4))
        counts = np.zeros(C_SIZE)
        skipped = 0
        lo = 0
        for hi in ends[:n_runs].tolist():
            skipped += _fit_kernel(obs, lo, hi, self.parents, self.s_model, (self.s_rack, self.s_node),
                                   self.params, self.rows, decays, taus, counts)
            for consumer in self.consumers:
                consumer.after_fit(self, lo, hi)
            lo = hi
        tally.problem("", "gpu samples out of time order", skipped)
        for code, reason in ((E_NOT_SANE, ENERGY_NOT_SANE), (E_DISAGREES, ENERGY_DISAGREES),
                             (E_OVER_LIMIT, ENERGY_OVER_LIMIT)):
            tally.problem("", reason, int(counts[int(code)]))
        tally.problem("", DIE_BELOW_INLET, int(counts[C_DIE_COLD]))


FIT_LAYOUT = 2
"""The layout of ``s_model`` (``fit_layout`` in the state of each detector that reads the fit; a state
without it is layout 1). Removing a column makes the array's width no sign of its version any more,
so the layout is said outright."""
LAYOUT1_G_UN = 4
"""Layout 1's count of inlet samples, a column of its own until 2026-12-06 (0 where ``G_UL`` is NaN)."""
LAYOUT1_WIDTH = MODEL_WIDTH + 1
LAYOUT1_G_TS, LAYOUT1_G_ENERGY_TS = G_TS, G_ENERGY_TS + 1


def model_from_layout1(old: np.ndarray) -> np.ndarray:
    """``s_model`` of layout 1 in this one. Layout 1 kept the inlet's sample count at
    :data:`LAYOUT1_G_UN` (the columns after it one further on): its only reading, whether it is 0,
    is the inlet level's NaN here (0 only before a GPU's first inlet; the source switching zeroed it,
    and the same sample's inlet counted at once). A layout 1 state saved before the GPUs' inlet source
    (``G_USRC``: NaN, not known), when their energy counter last moved (``G_ENERGY_TS``: the last
    sample's time, when it was read), their slowdown temperature (``G_SLOWDOWN``) and their max
    operating temperatures (``G_MAX_OP``, ``G_HBM_MAX_OP``) (NaN: taken from the next report) is
    widened first."""
    old = add_columns({"s": old}, "s", LAYOUT1_WIDTH, {LAYOUT1_G_ENERGY_TS: LAYOUT1_G_TS})["s"]
    if old.shape[1] != LAYOUT1_WIDTH:
        return old  # (not a layout 1 array: load_state_dict says so)
    new = np.delete(old, LAYOUT1_G_UN, axis=1)
    new[old[:, LAYOUT1_G_UN] == 0.0, G_UL] = np.nan
    return new


def model_as_layout1(s_model: np.ndarray) -> np.ndarray:
    """``s_model`` as layout 1 kept it (:func:`model_from_layout1` undone): the inlet's sample count
    back at :data:`LAYOUT1_G_UN`, 0 before the first inlet (where the level is NaN), else 1. Exact for
    a fresh fit; of a fit that read inlets, the count is 1 where layout 1 held how many it had read —
    its only reading, whether it is 0, is the same, so the future findings are."""
    s_model = np.asarray(s_model, dtype=np.float64)
    return np.insert(s_model, LAYOUT1_G_UN, np.where(np.isnan(s_model[:, G_UL]), 0.0, 1.0), axis=1)


def fit_as_layout1(state: dict[str, Any]) -> dict[str, Any]:
    """A fit reader's state as layout 1 kept the fit (:meth:`ThermalFitDetector.upgrade_state` undone):
    no ``fit_layout``, ``s_model`` by :func:`model_as_layout1`; the rest as it came."""
    out = {k: v for k, v in state.items() if k != "fit_layout"}
    if "s_model" in state and np.ndim(state["s_model"]) == 2:
        out["s_model"] = model_as_layout1(state["s_model"])
    return out


class ThermalFitDetector(Detector):
    """Base of the detectors that read the thermal fit: holds it, its arrays as state, and
    relays its input problems to the detector's own health."""

    health: PipelineHealth
    slot_kinds: ClassVar[Mapping[str, str]] = FIT_SLOT_KINDS

    def state_dict(self) -> dict[str, Any]:
        """... and the fit's layout (``fit_layout``: see :data:`FIT_LAYOUT`)."""
        return {**super().state_dict(), "fit_layout": FIT_LAYOUT}

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Racks' flow time (``upgrade_rack_state``), and a state saved before ``fit_layout`` (layout
        1) in this one (:func:`model_from_layout1`)."""
        state = upgrade_rack_state(state)
        if "fit_layout" in state:
            return state
        out = {**state, "fit_layout": FIT_LAYOUT}
        if "s_model" in state and np.ndim(state["s_model"]) == 2:
            out["s_model"] = model_from_layout1(np.asarray(state["s_model"], dtype=np.float64))
        return out

    def previous_layout_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """... the fit as layout 1 kept it (:func:`fit_as_layout1`); a subclass adds its own arrays."""
        return fit_as_layout1(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.read_site_loops()

    def read_site_loops(self) -> None:
        """Take what the detector reads from every loop's learnt state (the site's coolant rise and
        time constant) from the rack state as it now stands: after each rack frame, and after a
        load — a bank restored between two rack polls forecast with the design prior until the next
        (until 2026-12-02). Default: nothing."""

    def remap_state(self, state: dict[str, Any], remap: Remap) -> dict[str, Any]:
        """... and each rack's list of nodes for its inlet proxy threaded for this topology: the
        rows moved hold the old numbering's node indices (``relinked_inlet_states``)."""
        moved = super().remap_state(state, remap)
        s_rack, s_node = relinked_inlet_states(moved["s_rack"], moved["s_node"], self.topology)
        return {**moved, "s_rack": s_rack, "s_node": s_node}

    def init_fit(self, params: np.ndarray, consumer: bool) -> None:
        self.fit_consumer = consumer
        self.use_fit(ThermalFit(self.topology, params))

    def use_fit(self, fit: ThermalFit) -> None:
        self.fit = fit
        self.s_model, self.s_rack, self.s_node = fit.s_model, fit.s_rack, fit.s_node
        if self.fit_consumer:
            fit.consumers.append(self)  # type: ignore[arg-type]

    def update_fit(self, frame: Frame) -> None:
        """Fit ``frame`` (or reuse the fit of it); count its input problems, once: by the detector the
        frame was fitted for (:attr:`ThermalFit.fitted_for`; thermal in the default bank)."""
        self.fit.update(frame, self)
        if self.fit.fitted_for is self:  # (one sample, one problem, one stage)
            for reason, count in self.fit.problems:
                self.health.problem(self.name, reason, count)

    def withdraw_silent_gpus(self, alarms: np.ndarray, events: Sequence[str], compact: bool = False) -> list[Finding]:
        """After a GPU frame is fitted: withdraw the predictions (``alarms``, one alarm block per
        event of ``events``) of each GPU that has sent nothing for the fit's ``gap_s`` before the
        frame's time (its exporter hung, its host down, the GPU off the bus: XID 79), saying so.

        A prediction steps only on its GPU's own rows, so one whose GPU went silent held for ever
        (the store lets its gauge lapse; the detector and the findings kept it open). ``gap_s``
        (600 s) is the span after which the fit restarts its filters: what the prediction rested on
        is gone. It is 60 polls at 10 s — no jitter nor dropped scrape comes near it — and longer
        than the thermal and power ``off_hold_s``, so a GPU that clears is withdrawn by its own
        rows first. A GPU that reports again predicts afresh (``on_count`` samples). ``compact``: the
        blocks are :mod:`~.alarm`'s compact ones."""
        if self.fit.heard_all:  # (none is silent: see ThermalFit._fit_gpu)
            return []
        return silent_gpu_withdrawals(self.name, alarms, tuple((e,) for e in events), self.s_model[:, G_TS],
                                      self.fit.obs[X_TS], float(self.fit.params[P_GAP]), compact)


def share_thermal_fits(detectors: list[Detector]) -> None:
    """Let detectors whose thermal fits agree (parameters and state) use one fit."""
    shared: dict[tuple[Any, ...], ThermalFit] = {}
    for det in detectors:
        if not isinstance(det, ThermalFitDetector):
            continue
        fit = shared.setdefault(det.fit.key, det.fit)
        if fit is not det.fit and fit.same_state(det.fit):
            det.fit.consumers.clear()
            det.use_fit(fit)
