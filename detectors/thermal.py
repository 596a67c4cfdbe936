"""Online first-order thermal model per GPU: predicts thermal throttling and HBM overheating.

Physics: the core (and, separately, the HBM) temperature relaxes toward ``inlet + R·P`` with a
time constant ``tau``::

    dT/dt = (inlet + R·P - T) / tau

For every GPU and both models the detector fits, online and from telemetry alone:

- ``tau`` from transients (after a power step, how fast ``T`` closes on its target),
- ``R`` as the ratio ``(T - inlet) / P_f`` where ``P_f`` is power passed through the same
  first-order filter (so the ratio holds in transients too, not only at steady state),
  tracked with Holt's linear smoothing — level and *drift* (°C/W per second),
- the inlet level and its trend (Holt again), from the rack frames or the node proxy
  (see :mod:`foreshock.detectors.gpu_inputs`); when the rack reports its coolant flow and the
  flow drops, the heat balance (coolant rise over facility water ~ 1 / flow) says where the
  inlet will settle — minutes before the inlet itself moves. An inlet trend is forecast as a
  cooling loop settles (first-order, damped by the loop's time constant, learnt from the
  inlet's own settling), not as a ramp that never ends;
- leakage: power grows with temperature (``leak_w_per_c``), which amplifies every rise until
  the power limit holds it.

Prediction: the steady-state target ``T_ss(h) = inlet(h) + R(h)·P`` is linear in the horizon
``h``; the temperature follows it with lag ``tau``. The detector solves for the first ``h`` at
which the temperature reaches the GPU's limit — max operating (SW thermal slowdown, 87 °C on
Hopper, or the GPU's own ``slowdown_temp - 2``) for ``thermal_throttle``, HBM max operating
(95 °C) for ``hbm_overheat`` — and emits a :class:`~foreshock.findings.Prediction` when that
ETA falls inside its horizon with enough confidence (warm-up on load, fit residual).

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

from typing import Any, ClassVar

import numpy as np

from foreshock import facts
from foreshock.findings import Finding, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .alarm import (A_SIZE, CODE_NONE, CODE_WITHDRAW, O_CODE, O_CONF, O_ETA, O_ROW, O_V0,
                    O_WHICH, OUT_SIZE, alarm_step, emit, new_alarm_columns)
from .base import Detector
from .gpu_inputs import (DAMP_MIN_OBS, flow_asymptote, inline, kernel, RACK_DAMP, RACK_DAMP_N, gpu_inlet, gpu_obs, new_node_state, new_rack_state,
                         rack_inlet_obs, site_loop_rise, site_loop_tau, update_rack_inlet)

OBS_FIELDS = ("gpu_temp", "hbm_temp", "power", "slowdown_temp", "energy", "power_limit")
X_TS, X_SLOT, X_TEMP, X_HBM, X_POWER, X_SLOWDOWN, X_ENERGY, X_PLIMIT = range(8)

# ---- per-GPU state: common columns, then one block per model ----------------------------------
# last ts, reference power, inlet level/slope/curvature/samples, last energy reading, power limit
G_TS, G_PREF, G_UL, G_UB, G_UN, G_ENERGY, G_PLIM, G_EVAL_TS = range(8)  # ... last forecast
G_SIZE = 8
# model block (relative columns)
M_TAU, M_PF, M_RL, M_RB, M_RES, M_TPREV, M_LOADED, M_ETA, M_SURE = range(9)
M_SIZE = 9
CORE, HBM = 0, 1
# call sites of cached_decay (rows of the decay cache)
C_LEVEL, C_SLOPE, C_UL, C_UB, C_REF, C_OWN0 = range(6)
DECAY_SLOTS = 10  # C_OWN0.. for the kernels of other detectors that share these functions
MODEL_EVENTS = ("thermal_throttle", "hbm_overheat")

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
    "load_min_w": 200.0,  # fit R only under load (idle power is mostly offsets)
    "gap_s": 600.0,  # a longer gap restarts the filters
    "r_nominal": facts.THERMAL_RESISTANCE_C_PER_W,
    "inlet_stale_s": 300.0,
    "limit_core_c": facts.MAX_OPERATING_TEMP_C,
    "limit_hbm_c": facts.HBM_MAX_OPERATING_TEMP_C,
    "slowdown_to_max_operating_c": facts.HW_SLOWDOWN_TEMP_C - facts.MAX_OPERATING_TEMP_C,
    "tau_min_s": 2.0,
    "tau_max_s": 3000.0,
    "tau_excitation_c": 3.0,  # observe tau only when T is this far from its target
    "site_damping_s": float("nan"),  # state, not a setting: the loops' learnt time constant
    "site_rise_c": float("nan"),  # state, not a setting: the loops' learnt coolant rise
}
PARAM_NAMES = tuple(PARAMS)
P = {name: i for i, name in enumerate(PARAM_NAMES)}
(P_TAU_CORE, P_TAU_HBM, P_TAU_LEVEL, P_TAU_SLOPE, P_TAU_UL, P_TAU_UB, P_DAMP, P_LEARN_DAMP, P_DRIFT_DAMP, P_RISE, P_LEAK, P_MARGIN, P_MARGIN_RISE,
 P_TAU_REF, P_HORIZON,
 P_CLEAR, P_OFF_HOLD, P_REFRESH, P_EVERY, P_ON, P_URGENT, P_CONF_MIN, P_WARMUP, P_LOAD_MIN, P_GAP, P_R_NOM,
 P_STALE, P_LIM_CORE, P_LIM_HBM, P_SLOWDOWN_OFF, P_TAU_MIN, P_TAU_MAX, P_TAU_EXC, P_SITE_DAMP, P_SITE_RISE) = range(len(PARAMS))


def params_vector(overrides: dict[str, float]) -> np.ndarray:
    unknown = sorted(set(overrides) - set(PARAMS))
    if unknown:
        raise ValueError(f"thermal: unknown parameters {unknown}; known: {sorted(PARAMS)}")
    vec = np.array([float(overrides.get(k, v)) for k, v in PARAMS.items()])
    if vec[P_HORIZON] <= 0 or vec[P_TAU_CORE] <= 0 or vec[P_TAU_HBM] <= 0:
        raise ValueError("thermal: horizon_s and the time constants must be positive")
    return vec


def new_model_state(n: int, params: np.ndarray) -> np.ndarray:
    """``(n, G_SIZE + 2 * M_SIZE)``: common columns, core block, HBM block."""
    state = np.full((n, G_SIZE + 2 * M_SIZE), np.nan)
    state[:, G_UN] = 0.0
    for m, tau in ((CORE, params[P_TAU_CORE]), (HBM, params[P_TAU_HBM])):
        off = G_SIZE + m * M_SIZE
        state[:, off + M_TAU] = tau
        state[:, off + M_RB] = 0.0
        state[:, off + M_RES] = 0.0
        state[:, off + M_LOADED] = 0.0
        state[:, off + M_ETA] = np.inf
        state[:, off + M_SURE] = 0.0
    return state


# ---- kernels ------------------------------------------------------------------------------
@kernel
def decay(dt: float, tau: float) -> float:
    """Weight of the old value after ``dt`` for a first-order filter of time constant ``tau``."""
    return np.exp(-dt / tau)  # type: ignore[no-any-return]


def new_decay_cache() -> np.ndarray:
    """Scratch for :func:`cached_decay`: most rows of a frame share ``dt``, and the time
    constants are parameters, so each call site's ``exp`` is computed once per distinct dt."""
    return np.full((DECAY_SLOTS, 3), np.nan)


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
def model_step(s: np.ndarray, i: int, off: int, dt: float, temp: float, power: float,
               inlet: float, params: np.ndarray, cache: np.ndarray) -> None:
    """Fit one first-order model (core or HBM) of GPU ``i`` on one sample."""
    tau = s[i, off + M_TAU]
    a = decay(dt, tau)
    tprev = s[i, off + M_TPREV]
    rl = s[i, off + M_RL]
    if tprev == tprev and inlet == inlet and power == power and rl == rl:
        target = inlet + rl * power
        resid = temp - (target + (tprev - target) * a)
        w = 1.0 - cached_decay(cache, C_LEVEL, dt, params[P_TAU_LEVEL])
        s[i, off + M_RES] += w * (resid * resid - s[i, off + M_RES])
        gap = tprev - target
        if abs(gap) >= params[P_TAU_EXC]:
            ratio = (temp - target) / gap
            if 0.02 < ratio < 0.98:
                log_tau = np.log(tau) + 0.1 * (np.log(-dt / np.log(ratio)) - np.log(tau))
                s[i, off + M_TAU] = min(max(np.exp(log_tau), params[P_TAU_MIN]), params[P_TAU_MAX])
    if power == power:
        pf = s[i, off + M_PF]
        s[i, off + M_PF] = power if pf != pf else a * pf + (1.0 - a) * power
    s[i, off + M_TPREV] = temp
    pf = s[i, off + M_PF]
    if inlet == inlet and pf > params[P_LOAD_MIN]:
        r = (temp - inlet) / pf
        if rl != rl:
            s[i, off + M_RL] = r
            s[i, off + M_RB] = 0.0
        else:
            s[i, off + M_RL], s[i, off + M_RB] = holt(
                rl, s[i, off + M_RB], r, dt, 1.0 - cached_decay(cache, C_LEVEL, dt, params[P_TAU_LEVEL]),
                1.0 - cached_decay(cache, C_SLOPE, dt, params[P_TAU_SLOPE]))
        s[i, off + M_LOADED] += min(dt, 120.0)  # a long gap is not load seen


@kernel
def temp_at(h: float, temp0: float, a0: float, b: float, bdamp: float, tau: float, du: float,
            damp: float, amp: float, cap: float) -> float:
    """Forecast temperature ``h`` s ahead.

    The target is ``a0`` (inlet and R·P now) plus two settling rises: R drifting at ``b`` °C/s
    damped over ``bdamp`` (a failing interface keeps drifting for a long time, a step such as
    a fan failure stops), and the inlet rising at ``du`` °C/s damped over ``damp`` (a cooling
    loop settles; it does not ramp forever). The temperature follows with a first-order lag
    ``tau`` (a delay of ``tau`` for the rises). Leakage power grows with temperature, which
    amplifies every change by ``amp = 1 / (1 - R·dP/dT)`` — until power reaches its limit,
    ``cap`` °C above the target at today's power.
    """
    lagged = max(h - tau, 0.0)
    drift = b * bdamp * (1.0 - np.exp(-lagged / bdamp))
    rise = du * damp * (1.0 - np.exp(-lagged / damp))
    plain = a0 + (temp0 - a0) * np.exp(-h / tau) + drift + rise
    capped = a0 + cap + drift + rise
    return min(temp0 + (plain - temp0) * amp, max(capped, plain))  # type: ignore[no-any-return]


@kernel
def time_to_limit(temp0: float, a0: float, b: float, bdamp: float, tau: float, du: float,
                  damp: float, amp: float, cap: float, limit: float, horizon: float) -> float:
    """First ``h`` in ``[0, horizon]`` with ``temp_at(h) >= limit``; ``inf`` when none."""
    if temp0 >= limit:
        return 0.0
    # cheap upper bound first: the target never reaches the limit, so neither does the temperature
    top = max(a0, temp0) + max(b, 0.0) * min(bdamp, horizon) + max(du, 0.0) * min(damp, horizon)
    if min(temp0 + (top - temp0) * amp, max(top + cap, top)) < limit:
        return np.inf
    lo = 0.0
    hi = -1.0
    for k in range(1, 33):
        h = horizon * (k / 32.0) ** 2  # denser near now
        if temp_at(h, temp0, a0, b, bdamp, tau, du, damp, amp, cap) >= limit:
            hi = h
            break
        lo = h
    if hi < 0.0:
        return np.inf
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
def inlet_rate(s: np.ndarray, i: int, rack: int, racks: np.ndarray, damp: float,
               params: np.ndarray) -> float:
    """The inlet's rate of rise to forecast with (°C/s, damped by ``damp``): when the loop's
    coolant flow has dropped, the approach to where the heat balance settles the inlet at that
    flow (the flow reading moves minutes before the inlet does, and says where it stops);
    otherwise the inlet's own trend."""
    prior = params[P_SITE_RISE] if params[P_SITE_RISE] == params[P_SITE_RISE] else params[P_RISE]
    u_inf = flow_asymptote(racks, rack, prior, damp)
    ul = s[i, G_UL]
    if u_inf == u_inf and ul == ul:
        return (u_inf - ul) / damp  # type: ignore[no-any-return]
    return s[i, G_UB]  # type: ignore[no-any-return]


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
    u_end = ul + max(du, 0.0) * damp
    power = min(s[i, G_PREF], max((limit_core - u_end) / r_core, 0.0))
    return u_end + r_hbm * power < limit_hbm  # type: ignore[no-any-return]


@kernel
def model_eta(s: np.ndarray, i: int, off: int, temp: float, limit: float, damp: float, du: float,
              params: np.ndarray) -> tuple[float, float, float, float, bool]:
    """(ETA to ``limit``, confidence, steady-state target now, its slope °C/s, sure) of one model.

    ``sure``: the forecast clears the limit by a margin that grows with how far it extrapolates
    (``margin_c + margin_per_rise * rise``), so a GPU heading for just about its limit is not
    called early on a forecast that is mostly extrapolation."""
    rl = s[i, off + M_RL]
    ul = s[i, G_UL]
    pref = s[i, G_PREF]
    if rl != rl or ul != ul or pref != pref or temp != temp:
        return np.inf, 0.0, np.nan, np.nan, False
    a0 = ul + rl * pref
    b = s[i, off + M_RB] * pref
    gain = rl * params[P_LEAK]
    amp = 1.0 / (1.0 - gain) if 0.0 <= gain < 0.5 else 2.0
    plim = s[i, G_PLIM]
    cap = rl * max(plim - pref, 0.0) if plim == plim else np.inf
    tau = s[i, off + M_TAU]
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
def confidence_of(s: np.ndarray, i: int, off: int, params: np.ndarray) -> float:
    """Trust in a model: its loaded warm-up, and how well it predicts the next sample (°C)."""
    warm = min(1.0, s[i, off + M_LOADED] / params[P_WARMUP])
    return warm / (1.0 + np.sqrt(s[i, off + M_RES]) / 2.0)  # type: ignore[no-any-return]


@inline
def observe(obs: np.ndarray, row: int, s: np.ndarray, n_models: int, parents: np.ndarray,
            racks: np.ndarray, nodes: np.ndarray, params: np.ndarray,
            cache: np.ndarray) -> tuple[float, float, float]:
    """Common per-sample bookkeeping: ``(dt, power, inlet)``; ``dt < 0`` means skip the row.

    Power is the interval mean from the energy counter where it is sane (a ``power.draw``
    sample alone aliases the training-step rhythm), else the sample. After a gap the filters
    restart. Shared by every detector that fits the thermal model (this one, cooling).
    """
    ts = obs[row, X_TS]
    i = int(obs[row, X_SLOT])
    power = obs[row, X_POWER]
    last = s[i, G_TS]
    dt = ts - last
    if last == last and dt <= 0.0:
        return -1.0, np.nan, np.nan
    if power == power and not 0.0 <= power < 1e5:
        power = np.nan  # a sentinel or garbage reading is missing, not a measurement
    energy = obs[row, X_ENERGY]
    e_last = s[i, G_ENERGY]
    s[i, G_ENERGY] = energy
    if energy == energy and e_last == e_last and last == last and dt <= params[P_GAP]:
        mean_power = (energy - e_last) / dt
        if 0.0 <= mean_power < 1e5:
            power = mean_power
    if last != last or dt > params[P_GAP]:
        s[i, G_PREF] = power
        for m in range(n_models):
            s[i, G_SIZE + m * M_SIZE + M_PF] = power
            s[i, G_SIZE + m * M_SIZE + M_TPREV] = np.nan
        dt = params[P_GAP]  # Holt steps after a gap see one long step
    s[i, G_TS] = ts
    inlet = gpu_inlet(ts, parents[i, 1], parents[i, 0], obs[row, X_TEMP], s[i, G_SIZE + M_PF],
                      racks, nodes, params[P_R_NOM], params[P_STALE])
    if power == power:
        pr = s[i, G_PREF]
        w = cached_decay(cache, C_REF, dt, params[P_TAU_REF])
        if pr != pr or power > 1.5 * pr:
            s[i, G_PREF] = power  # a step up (a job starting) is the new reference at once
        else:
            s[i, G_PREF] = w * pr + (1.0 - w) * power
    if inlet == inlet:
        if s[i, G_UN] == 0.0:
            s[i, G_UL] = inlet
            s[i, G_UB] = 0.0
        else:
            s[i, G_UL], s[i, G_UB] = holt(s[i, G_UL], s[i, G_UB], inlet, dt,
                                          1.0 - cached_decay(cache, C_UL, dt, params[P_TAU_UL]),
                                          1.0 - cached_decay(cache, C_UB, dt, params[P_TAU_UB]))
        s[i, G_UN] += 1.0
    plim = obs[row, X_PLIMIT]
    if plim == plim and 50.0 < plim < 1e5:
        s[i, G_PLIM] = plim
    return dt, power, inlet


@kernel
def _thermal_kernel(obs: np.ndarray, parents: np.ndarray, s: np.ndarray, alarms: np.ndarray,
                    racks: np.ndarray, nodes: np.ndarray, params: np.ndarray,
                    out: np.ndarray, cache: np.ndarray) -> tuple[int, int]:
    """Fit and predict over a GPU frame; returns (emissions, rows skipped as out of order)."""
    n_out = 0
    skipped = 0
    horizon = params[P_HORIZON]
    clear_eta = horizon * params[P_CLEAR]
    for row in range(obs.shape[0]):
        dt, power, inlet = observe(obs, row, s, 2, parents, racks, nodes, params, cache)
        if dt < 0.0:
            skipped += 1
            continue
        ts = obs[row, X_TS]
        i = int(obs[row, X_SLOT])
        damp = inlet_damping(parents[i, 0], racks, params)
        du = inlet_rate(s, i, parents[i, 0], racks, damp, params)
        slowdown = obs[row, X_SLOWDOWN]
        if slowdown == slowdown and 40.0 < slowdown < 130.0:
            limit_core = slowdown - params[P_SLOWDOWN_OFF]
        else:
            limit_core = params[P_LIM_CORE]
        since = ts - s[i, G_EVAL_TS]
        due = not since < params[P_EVERY]  # NaN (never) counts as due
        if due:
            s[i, G_EVAL_TS] = ts
        for m in range(2):
            off = G_SIZE + m * M_SIZE
            t_m = obs[row, X_TEMP] if m == CORE else obs[row, X_HBM]
            limit = limit_core if m == CORE else params[P_LIM_HBM]
            if t_m != t_m or not -50.0 < t_m < 200.0:
                continue
            model_step(s, i, off, dt, t_m, power, inlet, params, cache)
            if due:
                eta, conf, target, slope, sure = model_eta(s, i, off, t_m, limit, damp, du, params)
                if m == HBM and eta <= horizon and hbm_held_by_core(s, i, du, damp, limit_core, limit, params):
                    eta, sure = np.inf, False
                s[i, off + M_ETA] = eta
                s[i, off + M_SURE] = 1.0 if sure else 0.0
            else:  # between forecasts: the last one, aged
                eta = max(s[i, off + M_ETA] - since, 0.0)
                sure = s[i, off + M_SURE] > 0.0
                conf = confidence_of(s, i, off, params)
                target = slope = np.nan
            firing = sure and conf >= params[P_CONF_MIN]
            clear = not eta <= clear_eta
            on_count = 1.0 if eta <= params[P_URGENT] else params[P_ON]
            code = alarm_step(alarms, i, m * A_SIZE, ts, firing, clear, on_count,
                              params[P_OFF_HOLD], params[P_REFRESH])
            if code != CODE_NONE:
                if not due:  # the reason needs the forecast's figures
                    _, _, target, slope, _ = model_eta(s, i, off, t_m, limit, damp, du, params)
                n_out = emit(out, n_out, row, m, code, eta, conf,
                             (target, slope, s[i, G_UL], s[i, off + M_RL], s[i, off + M_TAU], limit))
    return n_out, skipped


# ---- the detector ------------------------------------------------------------------------
class ThermalDetector(Detector):
    """Per-GPU first-order thermal model; predicts ``thermal_throttle`` and ``hbm_overheat``."""

    name: ClassVar[str] = "thermal"
    kinds: ClassVar[tuple[str, ...]] = ("gpu", "rack")

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, **params: Any) -> None:
        super().__init__(topology)
        self.health = health or PipelineHealth()
        self.params = params_vector(params)
        self.horizon_s = float(self.params[P_HORIZON])
        n = topology.size("gpu")
        self.parents = np.ascontiguousarray(np.stack([topology.gpu_rack, topology.gpu_node], axis=1),
                                            dtype=np.int64) if n else np.zeros((0, 2), np.int64)
        self.s_model = new_model_state(n, self.params)
        self.s_alarm = new_alarm_columns(n, 2)
        self.s_rack = new_rack_state(topology.size("rack"))
        self.s_node = new_node_state(topology.size("node"))

    def update(self, frame: Frame) -> list[Finding]:
        if frame.kind == "rack":
            update_rack_inlet(rack_inlet_obs(frame, len(self.s_rack), self.health, self.name), self.s_rack)
            self.params[P_SITE_DAMP] = site_loop_tau(self.s_rack)
            self.params[P_SITE_RISE] = site_loop_rise(self.s_rack)
            return []
        if frame.kind != "gpu" or len(frame) == 0:
            return []
        obs = gpu_obs(frame, OBS_FIELDS, len(self.s_model), self.health, self.name)
        out = np.empty((2 * len(obs), OUT_SIZE))
        n_out, skipped = _thermal_kernel(obs, self.parents, self.s_model, self.s_alarm, self.s_rack,
                                         self.s_node, self.params, out, new_decay_cache())
        if skipped:
            self.health.problem(self.name, "gpu samples out of time order", skipped)
        return self._findings(obs, out[:n_out])

    def gauges(self) -> dict[str, tuple[str, np.ndarray, str]]:
        core = G_SIZE + CORE * M_SIZE
        return {
            "thermal_resistance_celsius_per_watt": (
                "gpu", self.s_model[:, core + M_RL].copy(),
                "Fitted die-to-coolant thermal resistance (first-order model)"),
            "thermal_time_constant_seconds": (
                "gpu", self.s_model[:, core + M_TAU].copy(), "Fitted core thermal time constant"),
        }

    def _findings(self, obs: np.ndarray, out: np.ndarray) -> list[Finding]:
        findings: list[Finding] = []
        for rec in out:
            row, which, code = int(rec[O_ROW]), int(rec[O_WHICH]), int(rec[O_CODE])
            ts, slot = float(obs[row, X_TS]), int(obs[row, X_SLOT])
            target, slope, inlet, r, tau, limit = (float(v) for v in rec[O_V0:O_V0 + 6])
            part = "core" if which == CORE else "HBM"
            if code == CODE_WITHDRAW:
                reason = f"{part} no longer heading for {limit:.0f} °C (steady state {target:.1f} °C)"
            else:
                reason = (f"{part} heading for {target:.1f} °C ({slope * 60:+.2f} °C/min) under "
                          f"current power, limit {limit:.0f} °C; R {r:.4f} °C/W "
                          f"({r / self.params[P_R_NOM] - 1:+.0%} vs nominal), tau {tau:.0f} s, "
                          f"inlet {inlet:.1f} °C")
            eta = float(rec[O_ETA])
            findings.append(Prediction(
                ts=ts, entity_kind="gpu", slot=slot, event=MODEL_EVENTS[which],
                eta_s=eta if np.isfinite(eta) else -1.0, confidence=round(float(rec[O_CONF]), 3),
                detector=self.name, reason=reason, active=code != CODE_WITHDRAW,
            ))
        return findings
