"""Online first-order thermal model per GPU: predicts thermal throttling and HBM overheating.

Physics: the core (and, separately, the HBM) temperature relaxes toward ``inlet + R·P`` with a
time constant ``tau``::

    dT/dt = (inlet + R·P - T) / tau

For every GPU and both models the detector fits, online and from telemetry alone (the fit
lives in :mod:`foreshock.detectors.thermal_fit`, shared with power and cooling; this module
forecasts from it):

- ``tau`` from transients (after a power step, how fast ``T`` closes on its target),
- ``R`` as the ratio ``(T - inlet) / P_f`` where ``P_f`` is power passed through the same
  first-order filter (so the ratio holds in transients too, not only at steady state),
  tracked with Holt's linear smoothing — level and *drift* (°C/W per second),
- the inlet level and its trend (Holt again), from the rack frames or the node proxy
  (see :mod:`foreshock.detectors.gpu_inputs`); when the rack reports its coolant flow and the
  flow drops, the heat balance (coolant rise over facility water ~ heat / flow) says where the
  inlet will settle — minutes before the inlet itself moves (a rise learnt where an earlier loss
  settled, its GPUs throttled and their heat cut, may raise the design rise, never lower it; a
  rack learns its own where its loss settles, with the heat it carried then — its PDU power, where
  the rack reports one — and where work lands on the loop later, its heat jumping, the forecast
  scales the rise by the heat now: jobs starting on a loop that settled idle);
  once the flow is back, the inlet heads back to its baseline, whatever its own trend still says.
  An inlet trend is forecast as a cooling loop settles (first-order, damped by the loop's time
  constant, learnt from the inlet's own settling), not as a ramp that never ends;
- leakage: power grows with temperature (``leak_w_per_c``), which amplifies every rise until
  the power limit holds it.

The forecast extrapolates an R trend only as far as the temperature confirms it
(:func:`observe_trend`, :func:`confirmed_resistance`): the R drift is capped at
``trend_confirm`` times the rate at which ``(T - inlet) / P_f`` actually rose over the last
``W/2`` to ``W`` (``W = max(trend_window_s, 3 tau)``) less ``trend_noise`` times the rate the
samples' own scatter (the fit's residual) can show over ``W/2`` — so a GPU sitting just under
its limit is not called on a chance uptick of noisy integer readings — and the R level at what
the temperature shows now plus what a rising R gains over the observation's lag. A failing
thermal interface keeps rising and is extrapolated as before; a one-off step (fans failing)
goes flat within minutes and is not — the Holt slope of the fit would otherwise keep ramping
it on for half an hour. The inlet part of the forecast (cooling loss) is not held back this way,
but the inlet's own trend is by the dies (:func:`follow_inlet`): a coolant warming raises them with
their time constant, a sensor stepping (8 °C, under the jump ``gpu_inputs`` holds back) does not,
and the trend is taken only at the share of its rise they followed (the reason says so). A reading
missing between two does not restart the R trend's track: it steps over the true time between them.

Prediction: the steady-state target ``T_ss(h) = inlet(h) + R(h)·P`` is linear in the horizon
``h``; the temperature follows it with lag ``tau``. The detector solves for the first ``h`` at
which the temperature reaches the GPU's limit — its own max operating temperature (SW thermal
slowdown: ``max_op_temp`` where reported, else its own ``slowdown_temp - 2``, else 87 °C as on
Hopper) for the core, its own memory max operating temperature (``hbm_max_op_temp``, else 95 °C)
for the memory — and emits a :class:`~foreshock.findings.Prediction` when that ETA falls inside its
horizon with enough confidence (warm-up on load, fit residual): ``hbm_overheat`` from the HBM's
forecast, and ``thermal_throttle`` from whichever of the two reaches its limit first, since the
driver's SW thermal slowdown holds both (NVML: GPU temperature above the GPU max operating
temperature, or memory temperature above the memory max operating temperature). A core
prediction's reason also gives the same forecast's time to the HW slowdown temperature (the GPU's
slowdown temperature, 89 °C by default): what follows if the SW limiter does not hold the die. On a
loop losing coolant flow it also gives the flow (share of baseline, pace of its fall) and whether
the die crosses even at today's flow or only if the flow keeps falling: mid-fall a loss that will
stop at 15 % of baseline reads as one heading for 6 %, and both are called. Where a thermal limiter
already holds another GPU of its (synchronous) job, the reason names the one held longest and for
how long: the job runs at that GPU's pace, and as its hold deepens this one draws less than the
forecast, which holds today's power, assumes. A GPU with
no work scheduled (idle bit 0x1; without reasons, utilisation under 5 %) is not predicted to
throttle — its job stopped, there is nothing to slow, and the driver's SW thermal limiter does not
act on idle clocks — and a prediction made while it worked is withdrawn once it has idled for
``off_hold_s`` (the HBM model is not gated). A GPU that has sent nothing for the fit's ``gap_s``
has its predictions withdrawn as no longer reporting (:meth:`~.thermal_fit.ThermalFitDetector.withdraw_silent_gpus`).

Example (a GPU whose thermal interface is failing: R rises 50 % per hour)::

    >>> import numpy as np
    >>> from foreshock.topology import Topology
    >>> from foreshock.frames import Frame
    >>> topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
    ...                            "nodes": [{"name": "n", "rack": "k", "gpus": 1}]})
    >>> det = ThermalDetector(topo)
    >>> temp, found = 24.0 + 0.046 * 650, []
    >>> for t in np.arange(0.0, 4 * 3600, 10.0):
    ...     r = 0.046 * (1 + 0.5 * t / 3600)
    ...     temp += (24.0 + r * 650 - temp) * (1 - np.exp(-10 / 30))
    ...     _ = det.update(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
    ...     found += det.update(Frame("gpu", [t], [0], {"gpu_temp": [round(temp)], "power": [650.0]}))
    >>> first = next(p for p in found if p.event == "thermal_throttle")
    >>> crossing = 3600 * 2 * ((87 - 24) / (0.046 * 650) - 1)   # when T_ss reaches 87 °C
    >>> crossing - first.ts > 300    # predicted more than five minutes ahead
    True
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from foreshock.facts import (HBM_THERMAL_RESISTANCE_C_PER_W, THROTTLE_HW_POWER_BRAKE, THROTTLE_HW_SLOWDOWN,
                             THROTTLE_HW_THERMAL, THROTTLE_IDLE, THROTTLE_SW_THERMAL)
from foreshock.findings import Finding, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .alarm import (CODE_NONE, CODE_WITHDRAW, K_SIZE, O_CODE, O_CONF, O_ETA, O_ROW, O_V0, O_WHICH, OUT_SIZE,
                    alarms_as_layout1, compact_active, compact_from_alarm_columns, compact_step, compact_tag, emit,
                    new_compact_alarms, set_compact_tag)
from .base import add_columns
from .gpu_inputs import (DAMP_MIN_OBS, FLOW_NOMINAL, flow_asymptote, INLET_NODE_PROXY, INLET_RACK_PROXY, inline,
                         kernel, RACK_DAMP, RACK_DAMP_N,
                         RACK_FLOW, RACK_FLOW0, RACK_FLOW_SLOPE, reason_bits, Scratch, site_loop_rise,
                         site_loop_tau)
# the thermal model's fit is shared with power and cooling (see thermal_fit); its parameters
# (PARAMS, one vector: fit and forecast) are this detector's
from .thermal_fit import PARAMS  # noqa: F401
from .thermal_fit import (CORE, FIT_SLOT_KINDS, G_PLIM, G_PREF, G_SIZE, G_TS, G_UB, G_UL, G_USRC, HBM,
                          M_LOADED, M_PF, M_RB, M_RES, M_RL, M_SIZE, M_TAU, N_MODELS, P_CLEAR, P_CONF_MIN, P_DAMP,
                          P_DRIFT_DAMP, P_EVERY, P_FLOW_CARRY, P_FLOW_PLAN_FLOOR, P_FOLLOW_SLACK, P_FOLLOW_TAUS,
                          P_GAP, P_HORIZON, P_LEAK, P_LEARN_DAMP, P_MARGIN, P_MARGIN_RISE,
                          P_OFF_HOLD, P_ON, P_REASONS_STALE, P_REFRESH,
                          P_RISE, P_R_NOM, P_SITE_DAMP, P_SITE_RISE, P_STALE, P_TREND_CONFIRM,
                          P_TREND_NOISE, P_TREND_SMOOTH, P_TREND_WINDOW, P_URGENT, P_WARMUP, R_DT, load_min_of,
                          R_SRC_SAME, ThermalFit, ThermalFitDetector, X_HBM, X_REASONS, X_SLOT, X_TEMP, X_TS,
                          X_UTIL, core_limit, fit_as_layout1, hbm_limit, hw_slowdown_limit, params_vector)

MODEL_EVENTS = ("thermal_throttle", "hbm_overheat")
INLET_WORDS = {
    INLET_RACK_PROXY: " (no rack reading: estimated from its rack's nodes' coolest GPUs, R nominal)",
    INLET_NODE_PROXY: " (no rack reading: estimated from its node's coolest GPU, R nominal)",
}
"""A reason's inlet where no rack reports one (``thermal_fit.G_USRC`` at the row: ``O_INLET_SRC``):
an estimate that puts the node's coolest GPU at the nominal resistance — its R reads near nominal by
construction, and the inlet is off by as much as that GPU's R is (9 °C on the real H100 capture's
0.032 °C/W at 632 W). Until 2026-12-01 it read as a measurement."""
FLOW_FALLING_PER_MIN = 0.005
"""A reason calls a coolant flow falling from this share of its baseline per minute."""
IDLE_UTIL = 0.05
"""Without throttle reasons, a GPU whose kernels ran less than this share of the time is idle."""
# forecast state per GPU: when the forecast was last solved (it is solved every
# forecast_every_s and aged between), then per model the R the temperature shows (see
# observe_trend): smoothed R sample, and two checkpoints of it; last, since when a thermal limiter
# has held the GPU (NaN: not held; read by a job peer's reason) and when its throttle reasons were
# last read (a hold is kept through a missing reading, not through reasons unread for longer than
# reasons_stale_s)
F_EVAL_TS, F_MODEL0 = 0, 1
F_RS, F_C0, F_C0_TS, F_C1, F_C1_TS = range(5)  # relative to the model's block
F_MODEL_SIZE = 5
F_HELD_SINCE = F_MODEL0 + N_MODELS * F_MODEL_SIZE
F_BITS_TS = F_HELD_SINCE + 1
# ... then per model when the trend track took its last sample (a reading missing between two is
# bridged: the track's smoothing steps over the true time between them; another inlet source — the
# fit's G_USRC moving at the row, thermal_fit.R_SRC_SAME — starts the tracks over);
F_TREND_TS = F_BITS_TS + 1
# ... and whether the dies follow the inlet (follow_inlet): the inlet lagged by the core's time
# constant, the rise that lag gives the die and the rise the die showed (both summed over the
# last inlet_follow_taus time constants), and the core reading, its filtered power and time that
# the next reading steps from
F_U_LAG = F_TREND_TS + N_MODELS
F_EXPECTED, F_FOLLOWED, F_T_LAST, F_PF_LAST, F_FOLLOW_TS = range(F_U_LAG + 1, F_U_LAG + 6)
# ... and per model the ETA the alarms' clear test reads (:func:`model_reach`): the ETA itself,
# or, beyond the horizon while an alarm stands, solved out to horizon * clear_factor
F_FAR = F_FOLLOW_TS + 1
# ... and a word of flags (FL_*, by model: forecast_sure, forecast_eta): whether the last forecast was
# sure, and whether its ETA was beyond reach (inf) where F_FAR is not — its only other value: the ETA
# is F_FAR's, or inf where the clear test solved further (until 2026-12-06 each kept in a column of
# its own per model, the layout-1 columns F_ETA and F_SURE)
F_FLAGS = F_FAR + N_MODELS
F_SIZE = F_FLAGS + 1
FL_SURE, FL_ETA_INF = 1, 1 << N_MODELS  # (shifted by the model)
FOLLOW_STEADY_C = 0.05
"""An inlet this close to its lagged value, with nothing above the slack left to confirm, is
steady: the follow check starts over (:func:`follow_inlet`) rather than summing nothing."""
T_R, T_RATE = 0, 1  # observe_trend's result: R observed now, its rate (°C/W per s)
# a row's forecast of one model, kept until both alarms have stepped: reading usable, ETA,
# confidence, steady-state target and its slope (NaN: aged or out of reach), fires, the reading,
# its limit, and the R the temperature shows with its rate (observe_trend)
(V_USABLE, V_ETA, V_CONF, V_TARGET, V_SLOPE, V_FIRING, V_TEMP, V_LIMIT, V_SEEN_R,
 V_SEEN_RATE, V_FAR) = range(11)
V_SIZE = 11  # ... and the ETA the clear test reads (F_FAR)
# an emission's columns after the alarm's (alarm.OUT_SIZE, all taken): the share of the inlet's own
# rise the dies confirm (follow_inlet), that rise, and how much of it the dies showed
O_INLET_SHARE, O_INLET_EXPECTED, O_INLET_FOLLOWED = range(OUT_SIZE, OUT_SIZE + 3)
# ... the inlet source the row's fit read (thermal_fit.G_USRC), and the job's pacer as of the row's
# poll (ThermalDetector._record_pacers: the held peer held longest, since when, how many more; NaN:
# none). The reason is worded after the whole frame, so what it says of the row is taken at the row:
# until 2026-12-05 it read the state as of the frame's end, and a replay window's rows said
# "held by the thermal limiter for -10 min", or "(no rack reading ...)" before the rack went dark
O_INLET_SRC = OUT_SIZE + 3
O_PACER, O_PACER_SINCE, O_PACER_MORE = range(OUT_SIZE + 4, OUT_SIZE + 7)
THERMAL_OUT_SIZE = OUT_SIZE + 7


def new_forecast_state(n: int) -> np.ndarray:
    state = np.full((n, F_SIZE), np.nan)
    state[:, F_FLAGS] = sum(FL_ETA_INF << m for m in range(N_MODELS))  # no ETA, none sure
    return state


@inline
def forecast_eta(fc: np.ndarray, i: int, m: int) -> float:
    """Model ``m``'s last forecast ETA of GPU ``i``: inf where its flag says so, else ``F_FAR``'s."""
    if int(fc[i, F_FLAGS]) & (FL_ETA_INF << m):
        return np.inf
    return fc[i, F_FAR + m]  # type: ignore[no-any-return]


@inline
def forecast_sure(fc: np.ndarray, i: int, m: int) -> bool:
    """Whether model ``m``'s last forecast of GPU ``i`` was sure (:func:`model_eta`)."""
    return (int(fc[i, F_FLAGS]) & (FL_SURE << m)) != 0


@inline
def keep_forecast(fc: np.ndarray, i: int, m: int, eta: float, far: float, sure: bool) -> None:
    """Keep model ``m``'s forecast of GPU ``i``: its clear test's ETA ``far`` (``F_FAR``), and in
    the flags whether it was ``sure`` and whether its ``eta`` is other than ``far`` — then inf: the
    ETA is within the horizon or inf (:func:`time_to_limit`), and ``far`` is the ETA, or solved further
    where the ETA is beyond the horizon."""
    flags = int(fc[i, F_FLAGS]) & ~((FL_SURE | FL_ETA_INF) << m)
    if sure:
        flags |= FL_SURE << m
    if not eta == far:
        flags |= FL_ETA_INF << m
    fc[i, F_FLAGS] = flags
    fc[i, F_FAR + m] = far


# ---- forecast kernels -------------------------------------------------------------------------
@inline
def lagged_rises(h: float, lag: float, b: float, bdamp: float, du: float, damp: float) -> float:
    """The target's two settling rises (R drifting at ``b`` °C/s damped over ``bdamp``, the inlet
    at ``du`` damped over ``damp``) as a temperature that follows them with a first-order lag
    ``lag`` shows them ``h`` s ahead: delayed by the lag (a first-order lag's response to a ramp
    trails it by its time constant)."""
    lagged = max(h - lag, 0.0)
    drift = b * bdamp * (1.0 - np.exp(-lagged / bdamp))
    return drift + du * damp * (1.0 - np.exp(-lagged / damp))  # type: ignore[no-any-return]


@kernel
def temp_at(h: float, temp0: float, a0: float, b: float, bdamp: float, tau: float, du: float,
            damp: float, amp: float, cap: float) -> float:
    """Forecast temperature ``h`` s ahead.

    The target is ``a0`` (inlet and R·P now) plus two settling rises: R drifting at ``b`` °C/s
    damped over ``bdamp`` (a failing interface keeps drifting for a long time, a step such as
    a fan failure stops), and the inlet rising at ``du`` °C/s damped over ``damp`` (a cooling
    loop settles; it does not ramp forever). The temperature follows with a first-order lag.
    Leakage power grows with temperature (``k`` W/°C) until power reaches its limit, ``cap`` °C
    above the target at today's power::

        dT/dt = (a0 + rises + min(R·k·(T - temp0), cap) - T) / tau,   amp = 1 / (1 - R·k)

    solved piecewise. Below the limit the rise is amplified ``amp`` times and, the leakage feeding
    back, settles ``amp`` times slower: ``temp0 + amp·(a0 - temp0)·(1 - exp(-h / (amp·tau)))`` —
    until it is ``cap·amp / (amp - 1)`` °C above ``temp0``, where power reaches its limit (at once
    where it is there already, ``cap`` 0). From there leakage adds nothing: the plain first-order
    path toward ``a0 + cap`` with ``tau``. (Until 2026-12-05 the amplified rise kept ``tau`` and was
    taken at the limit too: ETAs to 87 °C 14 % early under the limit, 24 % at it.)

    The rises are the target's, so they follow the same rule: amplified and delayed by ``amp·tau``
    (a first-order lag's response to a ramp trails it by its time constant) below the limit, plain
    and delayed by ``tau`` past it, what they had reached relaxing onto that with ``tau``. Where
    power reaches its limit is solved from the steady part alone (closed form: the search calls this
    a hundred times per forecast); a rising target gets there sooner, and the forecast is held under
    the path with power at its limit from now (toward ``a0 + cap`` and the rises, with ``tau``),
    which the true one never exceeds. Against the ODE integrated: exact without rises, within a
    few % with them (the delay is the approximation: tests/test_thermal_leak_lag.py)."""
    slow = amp * tau
    gap = amp * (a0 - temp0)  # where the amplified path settles, above temp0
    # the rise at which leakage brings power to its limit: R·k·x = cap, with R·k = 1 - 1/amp
    reach = cap * amp / (amp - 1.0) if amp > 1.0 else np.inf
    h_lim = -slow * np.log(1.0 - reach / gap) if gap > reach else np.inf
    if h <= h_lim:
        t = temp0 + gap * (1.0 - np.exp(-h / slow)) + amp * lagged_rises(h, slow, b, bdamp, du, damp)
    else:
        decay = np.exp(-(h - h_lim) / tau)
        held = a0 + cap
        shown = amp * lagged_rises(h_lim, slow, b, bdamp, du, damp) - lagged_rises(h_lim, tau, b, bdamp, du, damp)
        t = held + (temp0 + reach - held) * decay + lagged_rises(h, tau, b, bdamp, du, damp) + shown * decay
    if cap < np.inf:
        held = a0 + cap
        t = min(t, held + (temp0 - held) * np.exp(-h / tau) + lagged_rises(h, tau, b, bdamp, du, damp))
    return t  # type: ignore[no-any-return]


@inline
def ceiling(temp0: float, a0: float, b: float, bdamp: float, du: float, damp: float, amp: float,
            cap: float, horizon: float) -> float:
    """An upper bound on :func:`temp_at` over ``[0, horizon]``: the target with every rise taken in
    full, amplified, and no higher than the power limit allows."""
    top = max(a0, temp0) + max(b, 0.0) * min(bdamp, horizon) + max(du, 0.0) * min(damp, horizon)
    return min(temp0 + (top - temp0) * amp, max(top + cap, top))  # type: ignore[no-any-return]


@kernel
def time_to_limit(temp0: float, a0: float, b: float, bdamp: float, tau: float, du: float,
                  damp: float, amp: float, cap: float, limit: float, horizon: float) -> float:
    """First ``h`` in ``[0, horizon]`` with ``temp_at(h) >= limit``; ``inf`` when none."""
    if temp0 >= limit:
        return 0.0
    # cheap upper bound first: the target never reaches the limit, so neither does the temperature
    if ceiling(temp0, a0, b, bdamp, du, damp, amp, cap, horizon) < limit:
        return np.inf
    lo = 0.0
    hi = -1.0
    best_k, best_t = 0, temp0
    for k in range(1, 33):
        h = horizon * (k / 32.0) ** 2  # denser near now
        t = temp_at(h, temp0, a0, b, bdamp, tau, du, damp, amp, cap)
        if t >= limit:
            hi = h
            break
        if t > best_t:
            best_k, best_t = k, t
        lo = h
    if hi < 0.0:
        # a forecast that rises and falls back (a falling drift against a rising target) may
        # peak above the limit between two grid points: find the peak near the highest one
        if best_k == 0:
            return np.inf
        a = horizon * ((best_k - 1) / 32.0) ** 2
        c = horizon * (min(best_k + 1, 32) / 32.0) ** 2
        lo = a
        for _ in range(40):  # golden-section search for the maximum on [a, c]
            m1 = c - 0.618033988749895 * (c - a)
            m2 = a + 0.618033988749895 * (c - a)
            if temp_at(m1, temp0, a0, b, bdamp, tau, du, damp, amp, cap) < \
                    temp_at(m2, temp0, a0, b, bdamp, tau, du, damp, amp, cap):
                a = m1
            else:
                c = m2
        peak = 0.5 * (a + c)
        if temp_at(peak, temp0, a0, b, bdamp, tau, du, damp, amp, cap) < limit:
            return np.inf
        hi = peak
    for _ in range(20):
        mid = 0.5 * (lo + hi)
        if temp_at(mid, temp0, a0, b, bdamp, tau, du, damp, amp, cap) >= limit:
            hi = mid
        else:
            lo = mid
    return hi


@inline
def inlet_damping(rack: int, racks: np.ndarray, params: np.ndarray) -> float:
    """Time constant to damp the inlet trend with: the one learnt on this GPU's rack, else the
    site's (racks of one site share their loop design), else the prior."""
    if params[P_LEARN_DAMP] > 0.0:
        if rack >= 0 and racks[rack, RACK_DAMP_N] >= DAMP_MIN_OBS:
            return racks[rack, RACK_DAMP]  # type: ignore[no-any-return]
        if params[P_SITE_DAMP] == params[P_SITE_DAMP]:
            return params[P_SITE_DAMP]  # type: ignore[no-any-return]
    return params[P_DAMP]  # type: ignore[no-any-return]


@inline
def flow_inlet_rate(s: np.ndarray, i: int, rack: int, racks: np.ndarray, damp: float,
                    params: np.ndarray, carry: float) -> float:
    """:func:`inlet_rate` where the loop's coolant flow has dropped (or is back); NaN where the
    flow says nothing and the inlet's own trend (``G_UB``) is the rate."""
    prior = params[P_RISE]
    if params[P_SITE_RISE] == params[P_SITE_RISE]:
        prior = max(prior, params[P_SITE_RISE])
    u_inf = flow_asymptote(racks, rack, prior, carry, params[P_FLOW_PLAN_FLOOR], s[i, G_TS], params[P_STALE])
    ul = s[i, G_UL]
    if u_inf == u_inf and ul == ul:
        return (u_inf - ul) / damp  # type: ignore[no-any-return]
    return np.nan


@inline
def inlet_rate(s: np.ndarray, i: int, rack: int, racks: np.ndarray, damp: float,
               params: np.ndarray, carry: float) -> float:
    """The inlet's rate of rise to forecast with (°C/s, damped by ``damp``): when the loop's
    coolant flow has dropped, the approach to where the heat balance settles the inlet at the
    flow its trend reaches ``carry`` s ahead (the flow reading moves minutes before the inlet
    does, and says where it stops — at the baseline once the flow is back, while the inlet still
    trails it); otherwise the inlet's own trend."""
    # a loop's rise scales with its heat over its flow; the site's learnt rise was measured where
    # a loss settled — with that loop's GPUs throttled, their heat cut — so it is a floor of the
    # rise at full heat, not an estimate of it: it may raise the design prior, never lower it
    # (flow_inlet_rate)
    du = flow_inlet_rate(s, i, rack, racks, damp, params, carry)
    return du if du == du else s[i, G_UB]  # type: ignore[no-any-return]


@inline
def trusted_inlet_rate(s: np.ndarray, i: int, rack: int, racks: np.ndarray, damp: float,
                       params: np.ndarray, carry: float, share: float) -> float:
    """:func:`inlet_rate` with the inlet's own rise taken at the ``share`` the dies confirm
    (:func:`follow_inlet`). Not the flow's: it moves minutes before the inlet, and the dies
    cannot confirm a rise that has not come yet."""
    du = flow_inlet_rate(s, i, rack, racks, damp, params, carry)
    if du == du:
        return du
    du = s[i, G_UB]
    return du * share if du > 0.0 else du  # type: ignore[no-any-return]


@inline
def follow_inlet(fc: np.ndarray, s: np.ndarray, i: int, ts: float, temp: float, params: np.ndarray) -> float:
    """The share of the inlet's own rise that the dies confirm (1: all, or nothing to confirm), after
    GPU ``i``'s core reading ``temp`` at ``ts`` (NaN: none; the check bridges it).

    A coolant warming raises the die with its time constant ``tau``: the die follows the inlet
    lagged by ``tau`` (``u_lag``), less what its own power does (``R`` times the change of its
    filtered power). A sensor stepping moves the reading and not the die. Over the last
    ``inlet_follow_taus`` time constants the check sums the rise the lagged inlet gives the die
    (``expected``) and the rise the die showed less its power's part (``followed``); the share is
    ``(followed + slack) / expected``, ``slack`` the dies' scatter (the fit's residual) plus
    ``inlet_follow_slack_c``. The lag makes it fair to a real rise from its first reading: the die
    is asked to follow only what it could have by then (an 8 °C sensor step read 2 °C expected and
    0 followed one poll on, 3.5 °C a poll later; a coolant rising with it showed 4 °C)."""
    off = G_SIZE + CORE * M_SIZE
    ul, rl, pf, tau = s[i, G_UL], s[i, off + M_RL], s[i, off + M_PF], s[i, off + M_TAU]
    slack = params[P_FOLLOW_SLACK] + np.sqrt(s[i, off + M_RES])
    if temp == temp and -50.0 < temp < 200.0 and ul == ul and rl == rl and pf == pf:
        span = ts - fc[i, F_FOLLOW_TS]
        u_lag = fc[i, F_U_LAG]
        # (a steady inlet with nothing left to confirm starts over too: the die's own moves before
        # the inlet does are not what it is asked to follow, and most rows skip the two exps)
        if (u_lag != u_lag or not span <= params[P_GAP]
                or (abs(ul - u_lag) < FOLLOW_STEADY_C and not fc[i, F_EXPECTED] > slack)):
            fc[i, F_U_LAG] = ul  # (re)start: the die is taken to have felt the inlet as it reads now
            fc[i, F_EXPECTED] = 0.0
            fc[i, F_FOLLOWED] = 0.0
        else:
            lag = 1.0 - np.exp(-span / tau)
            keep = np.exp(-span / (params[P_FOLLOW_TAUS] * tau))
            fc[i, F_U_LAG] = u_lag + lag * (ul - u_lag)
            fc[i, F_EXPECTED] = keep * fc[i, F_EXPECTED] + (fc[i, F_U_LAG] - u_lag)
            fc[i, F_FOLLOWED] = keep * fc[i, F_FOLLOWED] + (temp - fc[i, F_T_LAST]) - rl * (pf - fc[i, F_PF_LAST])
        fc[i, F_T_LAST] = temp
        fc[i, F_PF_LAST] = pf
        fc[i, F_FOLLOW_TS] = ts
    expected = fc[i, F_EXPECTED]
    if not expected > slack:
        return 1.0
    return min(max((fc[i, F_FOLLOWED] + slack) / expected, 0.0), 1.0)  # type: ignore[no-any-return]


def holds_thermally(bits: Any) -> Any:
    """A reasons bitmask (an int, or an int array: one answer per mask) that says a thermal limiter
    holds the GPU: SW or HW thermal slowdown, or HW slowdown (0x8) not raised by a power brake.
    0x8 is NVML's umbrella for every >= 2x clock cut — thermal, the external power brake (0x80 with
    it), fast-trigger power protection — and a node whose supply failed braked as 0x88: its GPUs
    were named "held by the thermal limiter". The one rule of the kernel (:func:`thermal_hold`) and
    the evaluation's onset classes (``evaluation.thermally_held``)."""
    return ((bits & (THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL)) != 0) | (
        ((bits & THROTTLE_HW_SLOWDOWN) != 0) & ((bits & THROTTLE_HW_POWER_BRAKE) == 0))


thermal_hold = inline(holds_thermally)
""":func:`holds_thermally` of one mask, inlined into the kernel."""


@inline
def hbm_held_by_core(s: np.ndarray, i: int, du: float, damp: float, limit_core: float,
                     limit_hbm: float, params: np.ndarray) -> bool:
    """True when the core's own limiter keeps the HBM below its limit: where the inlet settles,
    the driver cuts power to hold the core at its limit, and the HBM gets only that power."""
    r_core = s[i, G_SIZE + CORE * M_SIZE + M_RL]
    r_hbm = s[i, G_SIZE + HBM * M_SIZE + M_RL]
    ul = s[i, G_UL]
    if not (r_core > 0.0 and r_hbm == r_hbm and ul == ul) or du <= 0.0:
        return False  # only a warming inlet is held this way; an HBM drifting on its own is not
    r_hbm += max(s[i, G_SIZE + HBM * M_SIZE + M_RB], 0.0) * params[P_DRIFT_DAMP]
    # the coolant is heated by the dies, which the limiter holds at their limit: it is not forecast
    # hotter than that. (Without rack frames the inlet's own trend is carried ahead, and on a failing
    # loop +10 °C/min carried 4 minutes read as coolant at 96 °C: every HBM of the loop "overheating")
    u_end = min(ul + max(du, 0.0) * damp, limit_core)
    power = min(s[i, G_PREF], max((limit_core - u_end) / r_core, 0.0))
    return u_end + r_hbm * power < limit_hbm  # type: ignore[no-any-return]


@inline
def observe_trend(fc: np.ndarray, i: int, f: int, ts: float, w: float, r: float, tau: float,
                  params: np.ndarray) -> tuple[float, float]:
    """Track the R that the temperature shows, ``r = (T - inlet) / P_f`` (NaN: no usable sample
    under load — the track restarts), and its rate over the last ``W/2..W``,
    ``W = max(trend_window_s, 3 tau)``; returns ``(r smoothed, rate)``, NaN where unknown.
    ``w`` is the step's smoothing weight, ``1 - exp(-dt / trend_smooth_s)`` (NaN after a gap:
    the track restarts too).

    The fit's R is a Holt level and slope: after a one-off step (a fan failing) its slope lags
    and keeps extrapolating a rise the temperature stopped showing minutes ago. What the
    temperature did over the last minutes says whether a trend is real; two checkpoints of the
    smoothed sample, ``W/2`` apart, give that rate from a few numbers per GPU."""
    if r != r or w != w:
        fc[i, f + F_RS] = np.nan
        fc[i, f + F_C0] = np.nan
        fc[i, f + F_C0_TS] = np.nan
        fc[i, f + F_C1] = np.nan
        fc[i, f + F_C1_TS] = np.nan
        return np.nan, np.nan
    rs = fc[i, f + F_RS]
    if rs != rs:
        rs = r
    else:
        rs += w * (r - rs)
    fc[i, f + F_RS] = rs
    half = 0.5 * max(params[P_TREND_WINDOW], 3.0 * tau)
    c1_ts = fc[i, f + F_C1_TS]
    if c1_ts != c1_ts:
        fc[i, f + F_C1] = rs
        fc[i, f + F_C1_TS] = ts
    elif ts - c1_ts >= half:
        fc[i, f + F_C0] = fc[i, f + F_C1]
        fc[i, f + F_C0_TS] = c1_ts
        fc[i, f + F_C1] = rs
        fc[i, f + F_C1_TS] = ts
    c0_ts = fc[i, f + F_C0_TS]
    if c0_ts != c0_ts:
        return rs, np.nan
    return rs, (rs - fc[i, f + F_C0]) / (ts - c0_ts)


@inline
def confirmed_resistance(rl: float, rb: float, observed: tuple[float, float], noise: float, pref: float,
                         lag_s: float, slack_c: float, params: np.ndarray) -> tuple[float, float]:
    """The fit's R level and drift (°C/W, °C/W per s), held to what the temperature confirms.

    - the drift extrapolated is at most ``trend_confirm`` times the observed rate less ``noise``
      (the rate the samples' own scatter can show; none while the rate is unknown); a falling R
      is left alone (it only lowers the forecast);
    - the level is at most the observed R plus what it has risen in the ``lag_s`` the
      observation trails it by, plus ``slack_c`` °C at ``pref`` — after a step the Holt level
      overshoots (its slope carries it on) while the temperature sits flat."""
    r_seen, rate = observed[T_R], observed[T_RATE]
    rising = max(rate - noise, 0.0) if rate == rate else 0.0
    if rb > 0.0:
        rb = min(rb, params[P_TREND_CONFIRM] * rising)
    if r_seen == r_seen and pref > 0.0:
        rl = min(rl, r_seen + rising * lag_s + slack_c / pref)
    return rl, rb


@inline
def forecast_terms(s: np.ndarray, i: int, off: int, temp: float, inlet: tuple[float, float],
                   observed: tuple[float, float],
                   params: np.ndarray) -> tuple[float, float, float, float, float, float, float]:
    """The terms of one model's forecast for :func:`temp_at` (a0, b, tau, du, damp, amp, cap; see
    :func:`model_eta`); a0 NaN where there is no model."""
    rl = s[i, off + M_RL]
    ul = s[i, G_UL]
    pref = s[i, G_PREF]
    if rl != rl or ul != ul or pref != pref or temp != temp:
        return np.nan, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0
    damp, du = inlet
    tau = s[i, off + M_TAU]
    # the temperature trails its target by tau (the R sample by as much again, smoothed), and
    # by tau times the inlet's rise. (Not the fit's residual on top: it is the scatter of one
    # sample — and stays high for many minutes after a step — not the error of a smoothed level.)
    slack = params[P_MARGIN] + max(du, 0.0) * tau
    # a rate measured over half a window from integer readings that scatter by sqrt(res) °C (a
    # training step's rhythm, rounding) shows a trend of that order by chance — a GPU sitting
    # just under its limit would otherwise be called on a drift that is noise, extrapolated
    # (and amplified by leakage) for half an hour. A real drift (a failing interface) persists.
    half = 0.5 * max(params[P_TREND_WINDOW], 3.0 * tau)
    noise = params[P_TREND_NOISE] * np.sqrt(s[i, off + M_RES]) / (pref * half) if pref > 0.0 else 0.0
    rl, rb = confirmed_resistance(rl, s[i, off + M_RB], observed, noise, pref, tau + params[P_TREND_SMOOTH],
                                  slack, params)
    a0 = ul + rl * pref
    b = rb * pref
    gain = rl * params[P_LEAK]
    amp = 1.0 / (1.0 - gain) if 0.0 <= gain < 0.5 else 2.0
    plim = s[i, G_PLIM]
    cap = rl * max(plim - pref, 0.0) if plim == plim else np.inf
    return a0, b, tau, du, damp, amp, cap


@kernel
def model_reach(s: np.ndarray, i: int, off: int, temp: float, limit: float, inlet: tuple[float, float],
                observed: tuple[float, float], params: np.ndarray, reach: float) -> float:
    """:func:`model_eta`'s ETA solved out to ``reach`` s (``horizon * clear_factor``): an alarm
    stands down only once the ETA is past that (hysteresis), not once it is past the horizon —
    until 2026-12-05 an ETA past the horizon read inf, and a prediction was withdrawn while its
    GPU was still heading for the limit ~2000 s out, then raised again."""
    a0, b, tau, du, damp, amp, cap = forecast_terms(s, i, off, temp, inlet, observed, params)
    if a0 != a0:
        return np.inf
    return time_to_limit(temp, a0, b, params[P_DRIFT_DAMP], tau, du, damp, amp,  # type: ignore[no-any-return]
                         cap, limit, reach)


@kernel
def model_eta(s: np.ndarray, i: int, off: int, temp: float, limit: float,
              inlet: tuple[float, float], observed: tuple[float, float],
              params: np.ndarray) -> tuple[float, float, float, float, bool]:
    """(ETA to ``limit``, confidence, steady-state target now, its slope °C/s, sure) of one model.

    ``inlet`` = (damping, rate) of the inlet forecast; ``observed`` = :func:`observe_trend`'s
    R seen in the temperature, which the R part of the forecast must agree with
    (:func:`confirmed_resistance`). ``sure``: the forecast clears the limit by a margin that
    grows with how far it extrapolates (``margin_c + margin_per_rise * rise``), so a GPU heading
    for just about its limit is not called early on a forecast that is mostly extrapolation."""
    a0, b, tau, du, damp, amp, cap = forecast_terms(s, i, off, temp, inlet, observed, params)
    if a0 != a0:
        return np.inf, 0.0, np.nan, np.nan, False
    horizon = params[P_HORIZON]
    bdamp = params[P_DRIFT_DAMP]
    eta = time_to_limit(temp, a0, b, bdamp, tau, du, damp, amp, cap, limit, horizon)
    sure = False
    if eta <= horizon:
        rise = max(temp_at(horizon, temp, a0, b, bdamp, tau, du, damp, amp, cap) - temp, 0.0)
        margin = params[P_MARGIN] + params[P_MARGIN_RISE] * rise
        sure = time_to_limit(temp, a0, b, bdamp, tau, du, damp, amp, cap, limit + margin, horizon) <= horizon
    return eta, confidence_of(s, i, off, params), a0, b + du, sure


@inline
def out_of_reach(s: np.ndarray, i: int, off: int, temp: float, limit: float, damp: float, du: float,
                 params: np.ndarray) -> bool:
    """True when no forecast of :func:`model_eta` can reach ``limit`` within the horizon: the
    :func:`ceiling` that :func:`time_to_limit` checks first, taken with the fit's R level and drift
    as they stand (the temperature's confirmation only lowers them) and the largest leakage gain.
    Most GPUs, most of the time: this skips the forecast's setup (the noise floor, the
    confirmation), not only its search, and gives the same ETA (inf)."""
    rl, ul, pref = s[i, off + M_RL], s[i, G_UL], s[i, G_PREF]
    if rl != rl or ul != ul or pref != pref or temp != temp:
        return False  # no model: model_eta says so (with no confidence)
    plim = s[i, G_PLIM]
    cap = rl * max(plim - pref, 0.0) if plim == plim else np.inf
    return ceiling(temp, ul + rl * pref, s[i, off + M_RB] * pref, params[P_DRIFT_DAMP], du, damp, 2.0, cap,
                   params[P_HORIZON]) < limit  # type: ignore[no-any-return]


@inline
def confidence_of(s: np.ndarray, i: int, off: int, params: np.ndarray) -> float:
    """Trust in a model: its loaded warm-up, and how well it predicts the next sample (°C)."""
    warm = min(1.0, s[i, off + M_LOADED] / params[P_WARMUP])
    return warm / (1.0 + np.sqrt(s[i, off + M_RES]) / 2.0)  # type: ignore[no-any-return]


@inline
def emit_model(out: np.ndarray, n_out: int, row: int, which: int, code: int, s: np.ndarray, i: int, m: int,
               mv: np.ndarray, inlet: tuple[float, float], params: np.ndarray) -> int:
    """Emit alarm ``which``'s ``code`` with model ``m``'s forecast (``mv``, the row's): its ETA,
    confidence and the figures of its reason — solved here where the forecast was aged or out of
    reach, so they are computed only for what is emitted."""
    off = G_SIZE + m * M_SIZE
    target, slope, conf = mv[m, V_TARGET], mv[m, V_SLOPE], mv[m, V_CONF]
    if target != target:
        _, _, target, slope, _ = model_eta(s, i, off, mv[m, V_TEMP], mv[m, V_LIMIT], inlet,
                                           (mv[m, V_SEEN_R], mv[m, V_SEEN_RATE]), params)
        if conf != conf:
            conf = confidence_of(s, i, off, params)
    return emit(out, n_out, row, which, code, mv[m, V_ETA], conf,  # type: ignore[no-any-return]
                (target, slope, s[i, G_UL], s[i, off + M_RL], s[i, off + M_TAU], mv[m, V_LIMIT]))


@inline
def raised_by(active: float) -> int:
    """The model whose forecast the throttle alarm last started or refreshed on, from its
    tag (``A_ACTIVE`` of a four-column block): the kernel stores ``1 + model`` there
    (:func:`~.alarm.set_compact_tag`), so a withdrawal says which claim it takes back without a column
    of state more. When neither
    model fires the alarm's own pick (the earlier ETA; both inf: the core) is no guide: until
    2026-12-05 a throttle raised on the HBM's forecast was withdrawn as "core no longer heading for
    87 °C". An alarm saved before (1.0) reads as the core's, as it was worded then."""
    return HBM if active == 1.0 + HBM else CORE


@inline
def word_withdrawal(out: np.ndarray, n_out: int, row: int, raised: int, via: int, s: np.ndarray, i: int,
                    mv: np.ndarray, inlet: tuple[float, float], params: np.ndarray) -> int:
    """The throttle withdrawal just emitted (on ``via``'s forecast) worded by the model that raised
    the alarm (:func:`raised_by`): its reason's figures are that model's, its ETA and confidence
    the alarm's as before; without that model's reading, said so (limit NaN, as
    :func:`unread_step`)."""
    if raised == via:
        return n_out
    eta, conf = out[n_out - 1, O_ETA], out[n_out - 1, O_CONF]
    if mv[raised, V_USABLE] > 0.0:
        n_out = emit_model(out, n_out - 1, row, CORE, CODE_WITHDRAW, s, i, raised, mv, inlet, params)
    else:
        n_out = emit(out, n_out - 1, row, CORE, CODE_WITHDRAW, eta, conf,
                     (np.nan, np.nan, np.nan, np.nan, np.nan, np.nan))
    out[n_out - 1, O_ETA], out[n_out - 1, O_CONF] = eta, conf
    out[n_out - 1, O_V0 + 9] = raised
    return n_out


@inline
def emit_follow(out: np.ndarray, n_out: int, fc: np.ndarray, s: np.ndarray, i: int, share: float) -> None:
    """The last emission's inlet follow check (``O_INLET_*``; see :func:`follow_inlet`) and inlet
    source; no pacer yet (``O_PACER``: filled in after the poll, ThermalDetector._record_pacers)."""
    out[n_out - 1, O_INLET_SHARE] = share
    out[n_out - 1, O_INLET_EXPECTED] = fc[i, F_EXPECTED]
    out[n_out - 1, O_INLET_FOLLOWED] = fc[i, F_FOLLOWED]
    out[n_out - 1, O_INLET_SRC] = s[i, G_USRC]
    out[n_out - 1, O_PACER] = np.nan


@kernel
def _thermal_kernel(obs: tuple[np.ndarray, ...], rows: np.ndarray, span: tuple[int, int], parents: np.ndarray,
                    state: tuple[np.ndarray, np.ndarray, np.ndarray], racks: np.ndarray,
                    params: np.ndarray, mv: np.ndarray, out: np.ndarray, n_out: int) -> int:
    """Predict on the fitted rows ``span`` of a GPU frame; returns the emission count.

    ``rows`` is the fit's per-row output (``R_DT``: rows it skipped), ``state`` = (fit state, forecast
    state, alarms), ``mv`` scratch for a row's forecast of each model (``N_MODELS x V_SIZE``), ``out``
    of ``THERMAL_OUT_SIZE`` columns."""
    s, fc, alarms = state
    horizon = params[P_HORIZON]
    clear_eta = horizon * params[P_CLEAR]
    smooth_dt, smooth_w = -1.0, 0.0  # the trend's smoothing weight, for the step last seen
    for row in range(span[0], span[1]):
        if rows[row, R_DT] < 0.0:
            continue  # out of order: the fit skipped it
        ts = obs[X_TS][row]
        i = int(obs[X_SLOT][row])
        damp = inlet_damping(parents[i, 0], racks, params)
        if not rows[row, R_SRC_SAME] > 0.0:
            # another inlet source (the inlet moved by design: thermal_fit.switch_inlet_source; or
            # none yet): the trend tracks and the dies' follow check start over (nothing expected of
            # the dies until they read again: a row without a core reading keeps no share of the
            # old source's)
            fc[i, F_U_LAG] = np.nan
            fc[i, F_EXPECTED] = 0.0
            fc[i, F_FOLLOWED] = 0.0
            for m in range(N_MODELS):
                fc[i, F_TREND_TS + m] = np.nan
        share = follow_inlet(fc, s, i, ts, obs[X_TEMP][row], params)
        du = trusted_inlet_rate(s, i, parents[i, 0], racks, damp, params, params[P_FLOW_CARRY], share)
        # no work scheduled (the idle bit; without reasons, as dcgm-exporter's default counters,
        # no kernel running): a slowdown would slow nothing, and the driver's SW thermal limiter
        # does not act on idle clocks — such a GPU's core is not predicted, and a prediction made
        # while it worked is withdrawn once it has idled for off_hold_s
        bits = reason_bits(obs[X_REASONS][row])
        if bits >= 0:
            fc[i, F_BITS_TS] = ts
            idle = (bits & THROTTLE_IDLE) != 0
            # since when a thermal limiter holds it (kept through a sample without reasons)
            if not thermal_hold(bits):
                fc[i, F_HELD_SINCE] = np.nan
            elif fc[i, F_HELD_SINCE] != fc[i, F_HELD_SINCE]:
                fc[i, F_HELD_SINCE] = ts
        else:
            if not ts - fc[i, F_BITS_TS] <= params[P_REASONS_STALE]:
                # reasons unread for long (an exporter that lost its custom counters): whether
                # it is still held is unknown. Until 2026-12-01 a job peer's reason went on naming
                # it "held by the thermal limiter for 169 min", 2 1/2 hours after the last reading
                fc[i, F_HELD_SINCE] = np.nan
            util = obs[X_UTIL][row]
            idle = util == util and 0.0 <= util < IDLE_UTIL
        # its own limits, as last reported (the fit keeps them), else the defaults
        limit_core = core_limit(s, i, params)
        limit_hbm = hbm_limit(s, i, params)
        since = ts - fc[i, F_EVAL_TS]
        due = not since < params[P_EVERY]  # NaN (never) counts as due
        if due:
            fc[i, F_EVAL_TS] = ts
        for m in range(N_MODELS):
            off = G_SIZE + m * M_SIZE
            f = F_MODEL0 + m * F_MODEL_SIZE
            t_m = obs[X_TEMP][row] if m == CORE else obs[X_HBM][row]
            limit = limit_core if m == CORE else limit_hbm
            mv[m, V_USABLE] = 0.0
            if t_m != t_m or not -50.0 < t_m < 200.0:
                continue
            # the trend track steps from its last reading: a reading missing between two (the fit
            # starts its own step over there, thermal_fit._fit_kernel) is bridged over the true time
            # between them; after a gap, or another inlet source (F_TREND_TS NaN), it starts over
            step = ts - fc[i, F_TREND_TS + m]
            fc[i, F_TREND_TS + m] = ts
            w = np.nan
            if step <= params[P_GAP]:
                if step != smooth_dt:  # rows mostly share their step: one exp per step
                    smooth_dt = step
                    smooth_w = 1.0 - np.exp(-smooth_dt / params[P_TREND_SMOOTH])
                w = smooth_w
            pf = s[i, off + M_PF]
            r = (t_m - s[i, G_UL]) / pf if pf > load_min_of(s, i, params) else np.nan  # as the fit's R
            observed = observe_trend(fc, i, f, ts, w, r, s[i, off + M_TAU], params)
            if due:
                if out_of_reach(s, i, off, t_m, limit, damp, du, params):
                    eta, conf, target, slope, sure = np.inf, confidence_of(s, i, off, params), np.nan, np.nan, False
                else:
                    eta, conf, target, slope, sure = model_eta(s, i, off, t_m, limit, (damp, du), observed, params)
                if m == HBM and eta <= horizon and hbm_held_by_core(s, i, du, damp, limit_core, limit, params):
                    eta, sure = np.inf, False
                # the clear test's ETA: past the horizon while an alarm it clears stands, solved
                # out to horizon * clear_factor (the throttle alarm reads both models', hbm_overheat
                # the HBM's)
                far = eta
                if eta > horizon and (compact_active(alarms, i, CORE * K_SIZE) or
                                      (m == HBM and compact_active(alarms, i, HBM * K_SIZE))):
                    far = model_reach(s, i, off, t_m, limit, (damp, du), observed, params, clear_eta)
                    if m == HBM and far <= clear_eta and hbm_held_by_core(s, i, du, damp, limit_core, limit,
                                                                          params):
                        far = np.inf
                keep_forecast(fc, i, m, eta, far, sure)
            else:  # between forecasts: the last one, aged
                eta = max(forecast_eta(fc, i, m) - since, 0.0)
                far = max(fc[i, F_FAR + m] - since, 0.0)
                sure = forecast_sure(fc, i, m)
                conf = confidence_of(s, i, off, params) if sure else np.nan  # else: only to emit
                target = slope = np.nan
            mv[m, V_USABLE] = 1.0
            mv[m, V_ETA] = eta
            mv[m, V_CONF] = conf
            mv[m, V_TARGET] = target
            mv[m, V_SLOPE] = slope
            mv[m, V_FIRING] = 1.0 if sure and conf >= params[P_CONF_MIN] else 0.0
            mv[m, V_TEMP] = t_m
            mv[m, V_LIMIT] = limit
            mv[m, V_SEEN_R] = observed[T_R]
            mv[m, V_SEEN_RATE] = observed[T_RATE]
            mv[m, V_FAR] = far
        # thermal_throttle: NVML's SW thermal slowdown holds the core under its max operating
        # temperature *and* the memory under its own (hbm_max_op_temp; 95 °C on Hopper), so the
        # GPU throttles at whichever limit comes first — the alarm follows the core's forecast, or the HBM's where
        # that one fires first. It steps on rows with a usable core reading (an HBM reading
        # missing adds nothing); an idle GPU has nothing to slow
        if mv[CORE, V_USABLE] > 0.0:
            fire_c, fire_h = mv[CORE, V_FIRING] > 0.0, mv[HBM, V_USABLE] > 0.0 and mv[HBM, V_FIRING] > 0.0
            eta_h = mv[HBM, V_ETA] if mv[HBM, V_USABLE] > 0.0 else np.inf
            far_h = mv[HBM, V_FAR] if mv[HBM, V_USABLE] > 0.0 else np.inf
            via = HBM if (fire_h and not fire_c) or (fire_h == fire_c and eta_h < mv[CORE, V_ETA]) else CORE
            eta = mv[via, V_ETA]
            firing = fire_c or fire_h
            clear = not mv[CORE, V_FAR] <= clear_eta and not far_h <= clear_eta
            if idle:
                firing, clear = False, True
            on_count = 1.0 if eta <= params[P_URGENT] else params[P_ON]
            raised = raised_by(compact_tag(alarms, i, CORE * K_SIZE))  # (read before the step clears it)
            code = compact_step(alarms, i, CORE * K_SIZE, ts, firing, clear, on_count,
                              params[P_OFF_HOLD], params[P_REFRESH])
            if code != CODE_NONE:
                n_out = emit_model(out, n_out, row, CORE, code, s, i, via, mv, (damp, du), params)
                out[n_out - 1, O_V0 + 9] = via
                if code == CODE_WITHDRAW:
                    n_out = word_withdrawal(out, n_out, row, raised, via, s, i, mv, (damp, du), params)
                else:  # the model that raised it, for its withdrawal's words (see raised_by)
                    set_compact_tag(alarms, i, CORE * K_SIZE, 1.0 + via)
                emit_follow(out, n_out, fc, s, i, share)
                if via == CORE and code != CODE_WITHDRAW:
                    # the same forecast to the HW slowdown temperature (clocks cut >= 2x): where
                    # the die goes at today's power if the SW limiter does not hold it at its limit
                    off = G_SIZE + CORE * M_SIZE
                    observed = (mv[CORE, V_SEEN_R], mv[CORE, V_SEEN_RATE])
                    t_m = mv[CORE, V_TEMP]
                    hw_limit = hw_slowdown_limit(s, i, limit_core, params)
                    out[n_out - 1, O_V0 + 6] = model_eta(s, i, off, t_m, hw_limit, (damp, du), observed, params)[0]
                    out[n_out - 1, O_V0 + 7] = hw_limit
                    # the same forecast with the flow held where it is: on a loop losing flow the
                    # ETA carries the fall ahead, and this says whether the claim hinges on it
                    # (flow_loss_text words it where the rack is losing flow)
                    du_now = trusted_inlet_rate(s, i, parents[i, 0], racks, damp, params, 0.0, share)
                    out[n_out - 1, O_V0 + 8] = model_eta(s, i, off, t_m, limit_core, (damp, du_now), observed,
                                                         params)[0]
        else:
            n_out = unread_step(alarms, i, CORE, ts, row, params, out, n_out)
        # hbm_overheat: the HBM model's own alarm (not gated on idle: the memory heats all the same)
        if mv[HBM, V_USABLE] > 0.0:
            eta = mv[HBM, V_ETA]
            on_count = 1.0 if eta <= params[P_URGENT] else params[P_ON]
            code = compact_step(alarms, i, HBM * K_SIZE, ts, mv[HBM, V_FIRING] > 0.0,
                                not mv[HBM, V_FAR] <= clear_eta, on_count, params[P_OFF_HOLD], params[P_REFRESH])
            if code != CODE_NONE:
                n_out = emit_model(out, n_out, row, HBM, code, s, i, HBM, mv, (damp, du), params)
                emit_follow(out, n_out, fc, s, i, share)
        else:
            n_out = unread_step(alarms, i, HBM, ts, row, params, out, n_out)
    return n_out


@inline
def unread_step(alarms: np.ndarray, i: int, which: int, ts: float, row: int, params: np.ndarray, out: np.ndarray,
                n_out: int) -> int:
    """A row of GPU ``i`` without a usable reading for alarm ``which`` (its temperature NaN or a
    sentinel, the rest of the row there): an active alarm stands down once none has come for
    ``off_hold_s``, said so (limit NaN in the emission: :meth:`ThermalDetector._findings`). Until
    2026-12-04 such rows were skipped, and a prediction made before a sensor went dark, or an
    exporter dropped the field, was held for good: the GPU was not silent, its power still read.
    An alarm not raised keeps its count of firing rows (a reading missing between two adds none)."""
    if not compact_active(alarms, i, which * K_SIZE):
        return n_out
    code = compact_step(alarms, i, which * K_SIZE, ts, False, True, params[P_ON], params[P_OFF_HOLD],
                        params[P_REFRESH])
    if code == CODE_NONE:
        return n_out
    n_out = emit(out, n_out, row, which, code, np.inf, 0.0, (np.nan, np.nan, np.nan, np.nan, np.nan, np.nan))
    out[n_out - 1, O_V0 + 9] = which
    out[n_out - 1, O_INLET_SHARE] = 1.0  # (no inlet follow check to tell)
    out[n_out - 1, O_INLET_EXPECTED] = out[n_out - 1, O_INLET_FOLLOWED] = np.nan
    out[n_out - 1, O_INLET_SRC] = out[n_out - 1, O_PACER] = np.nan
    return n_out


def unfollowed_inlet_text(share: float, expected: float, followed: float) -> str:
    """The reason's part on an inlet rise the dies did not follow (:func:`follow_inlet`): its own
    trend is forecast only at the share they confirm."""
    if not share < 1.0:
        return ""
    return (f"; its inlet rose {expected:.1f} °C over the last few time constants and the dies followed "
            f"{max(followed, 0.0):.1f} °C of it: the inlet's own trend is taken at {share:.0%} (a sensor "
            f"stepping moves the reading, not the dies)")


def hw_slowdown_text(eta_hw: float, hw_limit: float) -> str:
    """The reason's part on the HW slowdown temperature, from the forecast that the ETA to max
    operating comes from (the SW thermal limiter starts cutting clocks there, so this is what
    follows if it cannot hold the die)."""
    if np.isnan(hw_limit):
        return ""
    if np.isfinite(eta_hw):
        return (f"; at today's power it reaches HW slowdown {hw_limit:.0f} °C (clocks cut >= 2x) in "
                f"{eta_hw / 60:.1f} min unless the SW limiter holds it")
    return f"; at today's power it stays under HW slowdown {hw_limit:.0f} °C within the horizon"


def flow_loss_text(rack: np.ndarray, eta_now: float, limit: float, horizon: float) -> str:
    """The reason's part on a cooling loop losing flow (``rack``: the GPU's rack state row):
    the flow now, how fast it falls, and whether the die crosses ``limit`` even at today's flow
    (ETA ``eta_now``) or only if the flow keeps falling — a falling flow is carried ahead, and
    where it stops no reading can tell yet (a loss that stops at 15 % of baseline reads as one
    heading for 6 % until it stops)."""
    flow, baseline, slope = rack[RACK_FLOW], rack[RACK_FLOW0], rack[RACK_FLOW_SLOPE]
    if not baseline > 0.0 or not flow < FLOW_NOMINAL * baseline:
        return ""
    text = f"; its rack's coolant flow is at {flow / baseline:.0%} of baseline"
    fall_per_min = -slope / baseline * 60.0
    falling = fall_per_min >= FLOW_FALLING_PER_MIN  # (the slope's filter trails a stop by a minute or two)
    if falling:
        text += f", falling {fall_per_min:.1%}/min"
    if eta_now <= horizon:
        return text + f"; even at today's flow the die reaches {limit:.0f} °C in {eta_now / 60:.1f} min"
    if falling:
        return text + f"; the ETA assumes it keeps falling: at today's flow the die stays under {limit:.0f} °C"
    return text


# ---- checkpoints --------------------------------------------------------------------------
STATE_LAYOUT = 2
"""The layout of the detector's own arrays (``state_layout`` in its state; a state without it is
layout 1). Removing columns makes an array's width no sign of its version any more (a narrower
array may be an older layout, or this one), so the layout is said outright."""
LAYOUT1_F_SIZE = 28
"""Layout 1's ``s_forecast`` width (before 2026-12-06); narrower ones are older still (columns added
at the end: see :func:`upgrade_layout1`). Its columns, where they differ from this layout's: per
model (a block of 7 from column 1) the ETA and whether it was sure, then the block's 5; the held
and reasons' times (15, 16), the trend tracks' times (17, 18), the inlet source they read (19), the
follow check's 6 (20-25), and the clear test's ETA per model (26, 27)."""
LAYOUT1_MODEL_SIZE, LAYOUT1_ETA, LAYOUT1_SURE = 7, 0, 1
LAYOUT1_HELD_SINCE, LAYOUT1_TREND_SRC, LAYOUT1_U_LAG, LAYOUT1_FAR = 15, 19, 20, 26


def upgrade_layout1(state: dict[str, Any]) -> dict[str, Any]:
    """A state of layout 1 (saved before ``state_layout``) in this one: ``s_alarm``'s four-column
    blocks as compact ones (:func:`~.alarm.compact_from_alarm_columns`), and ``s_forecast`` as
    :func:`forecast_from_layout1` reads it (its ``s_model`` already in the fit's layout)."""
    out = dict(state)
    if "s_alarm" in state and np.ndim(state["s_alarm"]) == 2:
        out["s_alarm"] = compact_from_alarm_columns(state["s_alarm"], N_MODELS)
    if "s_forecast" in state and "s_model" in state and np.ndim(state["s_forecast"]) == np.ndim(state["s_model"]) == 2:
        out["s_forecast"] = forecast_from_layout1(np.asarray(state["s_forecast"], dtype=np.float64),
                                                  np.asarray(state["s_model"])[:, G_USRC])
    return out


def forecast_from_layout1(old: np.ndarray, source: np.ndarray) -> np.ndarray:
    """``s_forecast`` of layout 1 in this one, ``source`` the fit's inlet source by GPU (G_USRC).

    - A layout 1 array saved before F_BITS_TS (NaN: reasons never read — a hold kept then is let go
      at the next sample without reasons), or before F_FAR (the ETA), is widened to layout 1 first.
    - Each model's ETA and sure flag go into F_FLAGS: the ETA differs from F_FAR only where it is inf
      (:func:`keep_forecast`).
    - The inlet source the trend tracks read: where it is not the fit's (NaN, or saved before it was
      kept), the next row would have started the tracks and the follow check over; they start over
      now (nothing reads them before that row), as the row's own switch would (twice is once). Where
      neither is known (no inlet read yet) they are left as they are: the next row starts them over.
    """
    old = add_columns({"s": old}, "s", LAYOUT1_F_SIZE,
                      {LAYOUT1_FAR + m: F_MODEL0 + m * LAYOUT1_MODEL_SIZE + LAYOUT1_ETA for m in range(N_MODELS)})["s"]
    if old.shape[1] != LAYOUT1_F_SIZE:
        return old  # (not a layout 1 array: load_state_dict says so)
    new = np.full((len(old), F_SIZE), np.nan)
    new[:, F_EVAL_TS] = old[:, F_EVAL_TS]
    flags = np.zeros(len(old), dtype=np.int64)
    for m in range(N_MODELS):
        o, f = F_MODEL0 + m * LAYOUT1_MODEL_SIZE, F_MODEL0 + m * F_MODEL_SIZE
        new[:, f:f + F_MODEL_SIZE] = old[:, o + 2:o + LAYOUT1_MODEL_SIZE]
        flags |= np.where(old[:, o + LAYOUT1_SURE] > 0.0, FL_SURE << m, 0)
        flags |= np.where(old[:, o + LAYOUT1_ETA] == old[:, LAYOUT1_FAR + m], 0, FL_ETA_INF << m)
    new[:, F_HELD_SINCE:F_U_LAG] = old[:, LAYOUT1_HELD_SINCE:LAYOUT1_TREND_SRC]  # held, reasons, trend times
    new[:, F_U_LAG:F_FAR] = old[:, LAYOUT1_U_LAG:LAYOUT1_FAR]
    new[:, F_FAR:F_FAR + N_MODELS] = old[:, LAYOUT1_FAR:LAYOUT1_FAR + N_MODELS]
    new[:, F_FLAGS] = flags
    # (neither known: no inlet read yet, the tracks as fresh; the next row starts them over anyway)
    saved_src, source = old[:, LAYOUT1_TREND_SRC], np.asarray(source, dtype=np.float64)
    moved = ~((saved_src == source) | (np.isnan(saved_src) & np.isnan(source)))
    new[moved, F_U_LAG] = np.nan
    new[moved, F_EXPECTED] = 0.0
    new[moved, F_FOLLOWED] = 0.0
    new[moved, F_TREND_TS:F_TREND_TS + N_MODELS] = np.nan
    return new


def forecast_as_layout1(fc: np.ndarray, source: np.ndarray) -> np.ndarray:
    """``s_forecast`` as layout 1 kept it (:func:`forecast_from_layout1` undone), ``source`` the fit's
    inlet source by GPU (``G_USRC``), which layout 1's column of the source the trend tracks read
    equalled after every row: each model's ETA (inf where ``FL_ETA_INF`` says so, else ``F_FAR``) and
    sure flag back in its block, the source back at :data:`LAYOUT1_TREND_SRC`: exactly (the flags' bits
    past the models' are not kept: none is set)."""
    fc = np.asarray(fc, dtype=np.float64)
    old = np.full((len(fc), LAYOUT1_F_SIZE), np.nan)
    old[:, F_EVAL_TS] = fc[:, F_EVAL_TS]
    flags = fc[:, F_FLAGS].astype(np.int64)
    for m in range(N_MODELS):
        o, f = F_MODEL0 + m * LAYOUT1_MODEL_SIZE, F_MODEL0 + m * F_MODEL_SIZE
        far = fc[:, F_FAR + m]
        old[:, o + LAYOUT1_ETA] = np.where(flags & (FL_ETA_INF << m), np.inf, far)
        old[:, o + LAYOUT1_SURE] = (flags & (FL_SURE << m)) != 0
        old[:, o + 2:o + LAYOUT1_MODEL_SIZE] = fc[:, f:f + F_MODEL_SIZE]
    old[:, LAYOUT1_HELD_SINCE:LAYOUT1_TREND_SRC] = fc[:, F_HELD_SINCE:F_U_LAG]
    old[:, LAYOUT1_TREND_SRC] = source
    old[:, LAYOUT1_U_LAG:LAYOUT1_FAR] = fc[:, F_U_LAG:F_FAR]
    old[:, LAYOUT1_FAR:LAYOUT1_FAR + N_MODELS] = fc[:, F_FAR:F_FAR + N_MODELS]
    return old


def thermal_as_layout1(state: dict[str, Any]) -> dict[str, Any]:
    """A thermal detector's ``state_dict()`` as layout 1 kept it (:meth:`ThermalDetector.upgrade_state`
    undone): the fit's (:func:`~.thermal_fit.fit_as_layout1`), ``s_alarm``'s blocks four columns wide
    (:func:`~.alarm.alarms_as_layout1`), ``s_forecast`` by :func:`forecast_as_layout1`; no ``state_layout``."""
    out = {k: v for k, v in fit_as_layout1(state).items() if k != "state_layout"}
    if "s_alarm" in state and np.ndim(state["s_alarm"]) == 2:
        out["s_alarm"] = alarms_as_layout1(state["s_alarm"], N_MODELS)
    if "s_forecast" in state and "s_model" in state and np.ndim(state["s_forecast"]) == np.ndim(state["s_model"]) == 2:
        out["s_forecast"] = forecast_as_layout1(state["s_forecast"], np.asarray(state["s_model"])[:, G_USRC])
    return out


# ---- the detector ------------------------------------------------------------------------
class ThermalDetector(ThermalFitDetector):
    """Per-GPU first-order thermal model; predicts ``thermal_throttle`` and ``hbm_overheat``."""

    slot_kinds: ClassVar[Mapping[str, str]] = {**FIT_SLOT_KINDS, "s_forecast": "gpu", "s_alarm": "gpu"}
    name: ClassVar[str] = "thermal"
    kinds: ClassVar[tuple[str, ...]] = ("gpu", "rack")
    state_scalars: ClassVar[tuple[str, ...]] = ("state_layout",)
    state_layout: int = STATE_LAYOUT

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, **params: Any) -> None:
        super().__init__(topology)
        self.health = health or PipelineHealth()
        self.params = params_vector(params)
        self.horizon_s = float(self.params[P_HORIZON])
        n = topology.size("gpu")
        self.init_fit(self.params, consumer=True)
        self.s_forecast = new_forecast_state(n)
        self.s_alarm = new_compact_alarms(n, N_MODELS)
        self._scratch = Scratch()
        self._out = np.empty((0, THERMAL_OUT_SIZE))
        self._n_out = 0
        self._row_models = np.empty((N_MODELS, V_SIZE))  # the kernel's scratch
        self._job_members: dict[int, np.ndarray] = {}  # a job's GPU slots, on its first reason

    def update(self, frame: Frame) -> list[Finding]:
        if frame.kind == "rack":
            self.update_fit(frame)
            self.read_site_loops()
            return []
        if frame.kind != "gpu" or len(frame) == 0:
            return []
        self.update_fit(frame)
        return (self._findings(self.fit.obs, self._out[:self._n_out])
                + self.withdraw_silent_gpus(self.s_alarm, MODEL_EVENTS, compact=True))

    def read_site_loops(self) -> None:
        self.params[P_SITE_DAMP] = site_loop_tau(self.s_rack)
        self.params[P_SITE_RISE] = site_loop_rise(self.s_rack)

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The fit's upgrades, and a state saved before ``state_layout`` (layout 1: four-column alarm
        blocks, the wider forecast rows) in this one (:func:`upgrade_layout1`)."""
        state = super().upgrade_state(state)
        if "state_layout" in state:
            return state
        return {**upgrade_layout1(state), "state_layout": STATE_LAYOUT}

    def previous_layout_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """... layout 1 (:func:`thermal_as_layout1`)."""
        return thermal_as_layout1(state)

    def begin_frame(self, fit: ThermalFit) -> None:
        self._out = self._scratch.take("out", (2 * fit.n_rows, THERMAL_OUT_SIZE))
        self._n_out = 0

    def after_fit(self, fit: ThermalFit, lo: int, hi: int) -> None:
        first = self._n_out
        self._n_out = _thermal_kernel(fit.obs, fit.rows, (lo, hi), fit.parents,
                                      (fit.s_model, self.s_forecast, self.s_alarm), fit.s_rack,
                                      self.params, self._row_models, self._out, self._n_out)
        if self._n_out > first:  # (few rows emit: the rest pay one comparison per poll)
            self._record_pacers(fit.obs, self._out[first:self._n_out])

    def _record_pacers(self, obs: tuple[np.ndarray, ...], out: np.ndarray) -> None:
        """Each throttle prediction's job pacer (``O_PACER``: the held peer held longest, since when,
        how many more) as the poll just fitted leaves its peers: the state a tick-by-tick feed's
        reason reads after the tick. A peer's hold is kept in the state as rows come (the kernel), so
        read once the whole frame is fitted — a replay window's — it ended some rows' holds before
        them, or started them after (until 2026-12-05: "held by the thermal limiter for -10 min").
        Taken after the poll, not at the row: a peer listed after this GPU in the same poll counts,
        as it does fed tick by tick."""
        for rec in out:
            if int(rec[O_WHICH]) != CORE or int(rec[O_CODE]) == CODE_WITHDRAW:
                continue
            row = int(rec[O_ROW])
            slot, ts = int(obs[X_SLOT][row]), float(obs[X_TS][row])
            job = int(self.topology.gpu_job[slot])
            if job < 0:
                continue
            members = self._job_members.get(job)
            if members is None:
                members = self._job_members[job] = self.topology.gpus_of_job(job)
            since = self.s_forecast[members, F_HELD_SINCE]
            # ... and still reporting: a member that fell off the bus keeps its last hold in the state
            fresh = ts - self.s_model[members, G_TS] <= self.params[P_REASONS_STALE]
            held = (since == since) & fresh & (members != slot)
            if held.any():
                first = int(np.argmin(np.where(held, since, np.inf)))
                rec[O_PACER], rec[O_PACER_SINCE], rec[O_PACER_MORE] = members[first], since[first], held.sum() - 1

    def gauges(self) -> dict[str, tuple[str, np.ndarray, str]]:
        core = G_SIZE + CORE * M_SIZE
        return {
            "thermal_resistance_celsius_per_watt": (
                "gpu", self.s_model[:, core + M_RL].copy(),
                "Fitted die-to-coolant thermal resistance (first-order model)"),
            "thermal_time_constant_seconds": (
                "gpu", self.s_model[:, core + M_TAU].copy(), "Fitted core thermal time constant"),
        }

    def _job_pacer_text(self, rec: np.ndarray, ts: float) -> str:
        """Where a thermal limiter already holds another GPU of this one's (synchronous) job, say so
        (``rec``: the emission, its pacer as of its poll: :meth:`_record_pacers`).

        The held GPU sets the job's pace: as its hold deepens (its loop warming, its interface
        failing) the job slows and this GPU draws less than the ETA assumes, so it may cross later
        or settle under its limit. Seed 832: job8's GPUs on a failing loop settled at 85 °C at
        440 W, paced by a member an HBM fault had held for hours."""
        pacer = float(rec[O_PACER])
        if pacer != pacer:
            return ""
        job = int(self.topology.gpu_job[int(pacer)])
        more = int(rec[O_PACER_MORE])
        return (f"; job {self.topology.jobs[job]} is paced by {self.topology.name('gpu', int(pacer))}, "
                f"held by the thermal limiter for {(ts - float(rec[O_PACER_SINCE])) / 60:.0f} min"
                + (f" ({more} more held)" if more else "")
                + ": as that hold deepens the job slows, and this GPU draws less than the ETA assumes")

    def _findings(self, obs: tuple[np.ndarray, ...], out: np.ndarray) -> list[Finding]:
        findings: list[Finding] = []
        for rec in out:
            row, which, code = int(rec[O_ROW]), int(rec[O_WHICH]), int(rec[O_CODE])
            ts, slot = float(obs[X_TS][row]), int(obs[X_SLOT][row])
            target, slope, inlet, r, tau, limit = (float(v) for v in rec[O_V0:O_V0 + 6])
            # which model the alarm follows: a thermal throttle comes from the core's forecast
            # or the HBM's, whichever reaches its limit first
            via = int(rec[O_V0 + 9]) if which == CORE else HBM
            part = "core" if via == CORE else "HBM"
            # the HBM's own nominal: its resistance to the coolant is about 0.6 of the die's
            r_nominal = self.params[P_R_NOM] if via == CORE else HBM_THERMAL_RESISTANCE_C_PER_W
            inlet_followed = unfollowed_inlet_text(*(float(v) for v in rec[O_INLET_SHARE:O_INLET_FOLLOWED + 1]))
            if code == CODE_WITHDRAW and not np.isfinite(limit):
                reason = f"{part} temperature no longer read: no longer known to be heading for its limit"
            elif code == CODE_WITHDRAW:
                reason = (f"{part} no longer heading for {limit:.0f} °C (steady state {target:.1f} °C)"
                          + inlet_followed)
            else:
                # the steady state under current power and inlet, and how fast that moves (R
                # drifting, inlet rising): the ETA comes from both, so a target still under the
                # limit that rises fast is a throttle on its way
                # ("z": a drift rounding to nothing had read "-0% vs nominal")
                drift = f"{r / r_nominal - 1:+z.0%}"
                reason = (f"{part} heading for its limit {limit:.0f} °C: steady state under current power "
                          f"{target:.1f} °C, moving {slope * 60:+z.2f} °C/min; R {r:.4f} °C/W "
                          f"({'at nominal' if drift == '+0%' else drift + ' vs nominal'}), tau {tau:.0f} s, "
                          f"inlet {inlet:.1f} °C{INLET_WORDS.get(float(rec[O_INLET_SRC]), '')}")
                reason += inlet_followed
                if which == CORE and via == HBM:
                    reason += ("; the SW thermal limiter cuts clocks to hold the memory there (NVML's SW "
                               "thermal slowdown acts on either limit)")
                elif which == CORE:
                    reason += hw_slowdown_text(float(rec[O_V0 + 6]), float(rec[O_V0 + 7]))
                    rack = int(self.fit.parents[slot, 0])
                    if rack >= 0:
                        reason += flow_loss_text(self.s_rack[rack], float(rec[O_V0 + 8]), limit, self.horizon_s)
                if which == CORE:
                    reason += self._job_pacer_text(rec, ts)
            eta = float(rec[O_ETA])
            findings.append(Prediction(
                ts=ts, entity_kind="gpu", slot=slot, event=MODEL_EVENTS[which],
                eta_s=eta if np.isfinite(eta) else -1.0, confidence=round(float(rec[O_CONF]), 3),
                detector=self.name, reason=reason, active=code != CODE_WITHDRAW,
            ))
        return findings
