"""Physical parameters of the simulated cluster, calibrated on ``shared/FACTS.md``.

Every number lives here once, as a dataclass field with a default, so tests and scenarios can
override any of them (``SimParams(gpu_spread=0.0)``) and nothing else in the simulator hides a
magic constant.

Calibration (H200 SXM capture, 24 °C inlet):

- power = static + leakage(T) + dynamic(activity, clock):
  static 37 W; leakage 80 W at 52 °C, doubling every 25 °C; dynamic 510 W at full gpu-burn
  activity and the 1980 MHz max clock, rising as clock^2.5 (voltage rises with clock).
  Idle (activity 0, 28 °C) gives 37 + 41 = 78 W; gpu-burn (52 °C) gives 37 + 80 + 510 = 627 W.
- die temperature relaxes toward inlet + R·P with R = 0.046 °C/W (24 + 0.046·627 ≈ 52.8 °C);
  HBM toward inlet + 0.027·P (≈ 41 °C) with its own, slower time constant.
- per-GPU manufacturing spread: R, leakage and dynamic power each vary by a few percent
  ("Not all GPUs are created equal": ~8 % variation across identical GPUs).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any, get_type_hints

import numpy as np

from foreshock import facts


@dataclass(frozen=True)
class SimParams:
    # --- GPU power ---------------------------------------------------------------------------
    static_power_w: float = 37.0
    leak_ref_w: float = 80.0  # leakage at leak_ref_temp_c
    leak_ref_temp_c: float = facts.LOAD_TEMP_C
    leak_doubling_c: float = 25.0
    dyn_max_w: float = 510.0  # dynamic power at activity 1 (gpu-burn) and the max clock
    dyn_clock_exponent: float = 2.5
    comm_activity: float = 0.30  # power activity while a step communicates
    wait_activity: float = 0.15  # ... and while a fast rank waits for the slowest
    power_limit_w: float = facts.POWER_LIMIT_W
    # --- GPU thermal -------------------------------------------------------------------------
    r_core_c_per_w: float = facts.THERMAL_RESISTANCE_C_PER_W
    r_hbm_c_per_w: float = facts.HBM_THERMAL_RESISTANCE_C_PER_W
    tau_core_s: float = 10.0
    tau_hbm_s: float = 40.0
    gpu_spread: float = 0.03  # relative sigma of R (core and HBM) per GPU
    leak_spread: float = 0.08
    dyn_spread: float = 0.03
    # --- clocks and the driver's limiters ----------------------------------------------------
    clock_max_hz: float = facts.SM_CLOCK_MAX_HZ
    clock_idle_hz: float = facts.SM_CLOCK_IDLE_HZ
    clock_min_hz: float = 600e6  # lowest clock the SW limiters choose
    clock_step_hz: float = facts.SM_CLOCK_STEP_HZ
    max_operating_c: float = facts.MAX_OPERATING_TEMP_C
    hw_slowdown_c: float = facts.HW_SLOWDOWN_TEMP_C
    hw_slowdown_release_c: float = facts.HW_SLOWDOWN_TEMP_C - 1.0
    hbm_max_operating_c: float = facts.HBM_MAX_OPERATING_TEMP_C
    shutdown_c: float = facts.SHUTDOWN_TEMP_C
    sw_thermal_gain: float = 0.002  # integral gain: clock-scale change per °C of error per second
    sw_thermal_fast_gain: float = 0.02  # extra cut per °C once the die is 1 °C over max operating
    hw_slowdown_factor: float = 0.45  # HW slowdown cuts clocks >= 2x
    power_brake_factor: float = 0.30  # HW power brake cuts clocks >= 2x
    gpu_max_dt_s: float = 1.0  # GPU thermal and limiters are integrated in steps no longer than this
    # --- repairs -----------------------------------------------------------------------------
    # an XID 79 repair swaps the board (an RMA, as a ``gpu_replacement`` fault does): the GPU
    # returns with a new UUID and constants. Off by default: every seed's telemetry stays as it was
    xid79_new_board: bool = False
    # --- telemetry ---------------------------------------------------------------------------
    power_noise_w: float = facts.POWER_NOISE_W  # uniform +-noise on power.draw
    missing_prob: float = 5e-4  # chance a sample (one entity, one tick) is missing
    # --- cooling -----------------------------------------------------------------------------
    facility_temp_c: float = 20.0  # facility water; the loop adds a load-dependent rise
    loop_rise_c: float = 4.0  # coolant rise at design load and full flow (-> ~24 °C inlet)
    design_gpu_w: float = 640.0  # per-GPU design load the loop is sized for
    design_node_w: float = 1500.0
    tau_loop_s: float = 180.0  # coolant mass of a loop
    diurnal_amplitude_c: float = 1.5  # facility water swing over a day (peaks mid-afternoon)
    rack_flow_lps: float = 1.2  # nominal coolant flow per rack, litres per second
    node_base_w: float = 1500.0  # CPUs, NICs, memory, fans of a node at nominal speed
    fan_power_w: float = 300.0  # fan power at full speed
    # --- workload ----------------------------------------------------------------------------
    job_intensity_range: tuple[float, float] = (0.95, 1.20)  # dynamic activity in compute
    compute_s_range: tuple[float, float] = (2.0, 6.0)
    comm_fraction_range: tuple[float, float] = (0.15, 0.30)  # communication share of a step
    comm_load_range: tuple[float, float] = (0.70, 0.92)  # NIC load while communicating
    job_run_mean_s: float = 4 * 3600.0
    job_gap_mean_s: float = 600.0
    job_churn: bool = True
    step_jitter: float = 0.01
    slowdown_ratio: float = 1.10  # a job is slowed when a step takes this much longer than nominal
    # --- fabric ------------------------------------------------------------------------------
    cross_su_fraction: float = 0.5  # share of a multi-SU job's traffic that crosses spines
    ecn_start_ratio: float = 0.95  # queue build-up (ECN marks) begins at this link load
    congestion_min_stall: float = 1e-3  # ground truth: a port is congested when stalled >= this share of the time
    mtu_bytes: float = 4096.0
    counter_bits: int = 64  # 32: link counters wrap like 32-bit PortCounters
    # --- optics ------------------------------------------------------------------------------
    tx_power_dbm: float = 1.0
    tx_power_spread_db: float = 0.4
    link_loss_db: float = 1.5
    link_loss_spread_db: float = 0.3
    rx_sensitivity_dbm: float = -6.5  # RX power at which pre-FEC BER reaches the FEC limit
    los_dbm: float = -10.0
    fec_limit_ber: float = facts.PREFEC_BER_FEC_LIMIT
    ber_floor: float = 1e-15
    rx_noise_db: float = 0.05
    rx_drift_db_per_sqrt_h: float = 0.03  # slow random walk with age
    flap_rate_at_limit: float = 0.003  # link-down chance per second at the FEC limit ...
    flap_rate_per_db: float = 10.0  # ... times this per dB past it
    flap_down_s: tuple[float, float] = (5.0, 20.0)
    max_flaps: int = 4  # after this many the port is left down
    line_bits_per_s_factor: float = 1.0625  # PHY bits per data bit (FEC overhead)

    def with_overrides(self, overrides: dict[str, Any] | None) -> "SimParams":
        """A copy with some fields replaced; unknown names, and values of the wrong type or out of
        range (:func:`check_override`), raise ``ValueError`` naming the parameter."""
        if not overrides:
            return self
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown simulator parameters {unknown}")
        cast: dict[str, Any] = {k: check_override(k, tuple(v) if isinstance(v, list) else v)
                                for k, v in overrides.items()}
        return replace(self, **cast)

    @property
    def leak_k(self) -> float:
        return math.log(2.0) / self.leak_doubling_c

    @property
    def q_at_sensitivity(self) -> float:
        """Q factor that gives the FEC-limit BER (BER = Q-function(Q))."""
        return _inverse_q(self.fec_limit_ber)


_POSITIVE = frozenset({
    "leak_doubling_c", "power_limit_w", "r_core_c_per_w", "r_hbm_c_per_w", "tau_core_s", "tau_hbm_s",
    "clock_max_hz", "clock_idle_hz", "clock_min_hz", "clock_step_hz", "gpu_max_dt_s", "design_gpu_w",
    "design_node_w", "tau_loop_s", "rack_flow_lps", "job_run_mean_s", "job_gap_mean_s", "slowdown_ratio",
    "ecn_start_ratio", "mtu_bytes", "ber_floor", "line_bits_per_s_factor", "compute_s_range", "flap_down_s",
})
"""Parameters the model divides by or takes the log of: more than zero."""
_FRACTION = frozenset({
    "comm_activity", "wait_activity", "hw_slowdown_factor", "power_brake_factor", "missing_prob",
    "comm_fraction_range", "comm_load_range", "cross_su_fraction",
})
"""Shares and probabilities: from 0 to 1."""
_SIGNED = frozenset({
    "leak_ref_temp_c", "max_operating_c", "hw_slowdown_c", "hw_slowdown_release_c", "hbm_max_operating_c",
    "shutdown_c", "facility_temp_c", "tx_power_dbm", "rx_sensitivity_dbm", "los_dbm",
})
"""Temperatures and optical powers (dBm): any finite number. Every other number is at least 0."""


def check_override(name: str, value: Any) -> Any:
    """``value`` for parameter ``name`` as the simulator can use it, else ``ValueError`` naming
    both: the field's type (a number for a float, a whole number for an int, true/false for a
    bool, a pair of numbers for a range), finite, and within the parameter's range (positive
    where the model divides by it, 0..1 for shares and probabilities, 32 or 64 counter bits,
    a range's low end at most its high end, ``fec_limit_ber`` under 0.5)."""
    kind = _FIELD_TYPES[name]
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"simulator parameter {name} must be true or false, not {value!r}")
        return value
    items = value if kind is tuple else (value,)
    if kind is tuple and not (isinstance(value, tuple) and len(value) == 2):
        raise ValueError(f"simulator parameter {name} must be a pair of numbers [low, high], not {value!r}")
    for x in items:
        number = isinstance(x, numbers.Integral if kind is int else numbers.Real)  # (numpy's too)
        if isinstance(x, (bool, np.bool_)) or not number:
            what = "a whole number" if kind is int else "a number"
            raise ValueError(f"simulator parameter {name} must be {what}, not {x!r}")
        if not math.isfinite(x):
            raise ValueError(f"simulator parameter {name} must be finite, not {x!r}")
        if name in _POSITIVE and not x > 0:
            raise ValueError(f"simulator parameter {name} must be more than 0, not {x!r}")
        if name in _FRACTION and not 0 <= x <= 1:
            raise ValueError(f"simulator parameter {name} must be within [0, 1], not {x!r}")
        if name not in _SIGNED and x < 0:
            raise ValueError(f"simulator parameter {name} must not be negative, not {x!r}")
    if kind is tuple and value[0] > value[1]:
        raise ValueError(f"simulator parameter {name}: its low end {value[0]!r} is above its high end {value[1]!r}")
    if name == "counter_bits" and value not in (32, 64):
        raise ValueError(f"simulator parameter counter_bits must be 32 or 64, not {value!r}")
    if name == "fec_limit_ber" and not 0 < value < 0.5:
        raise ValueError(f"simulator parameter fec_limit_ber must be within (0, 0.5), not {value!r}")
    return value


_FIELD_TYPES: dict[str, type] = {
    name: getattr(hint, "__origin__", hint) for name, hint in get_type_hints(SimParams).items()
}
"""Parameter -> float, int, bool or tuple (a (low, high) range)."""


def _inverse_q(ber: float) -> float:
    """Solve 0.5·erfc(q/√2) = ber for q by bisection (called once per parameter set)."""
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if 0.5 * math.erfc(mid / math.sqrt(2.0)) > ber:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
