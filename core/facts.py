"""Hardware constants foreshock builds on, each with its source (see shared/FACTS.md).

Thresholds are data, kept here once; the simulator, the detectors and the rule generator
read them from this module.
"""

from __future__ import annotations

# --- NVML clock-event ("throttle") reason bits; DCGM field 112 -------------------------------
THROTTLE_IDLE = 0x1
THROTTLE_APP_CLOCKS = 0x2
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8  # >= 2x clock cut
THROTTLE_SYNC_BOOST = 0x10
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
THROTTLE_DISPLAY_CLOCKS = 0x100

THROTTLE_BITS: dict[str, int] = {
    "idle": THROTTLE_IDLE,
    "app_clocks": THROTTLE_APP_CLOCKS,
    "sw_power_cap": THROTTLE_SW_POWER_CAP,
    "hw_slowdown": THROTTLE_HW_SLOWDOWN,
    "sync_boost": THROTTLE_SYNC_BOOST,
    "sw_thermal": THROTTLE_SW_THERMAL,
    "hw_thermal": THROTTLE_HW_THERMAL,
    "hw_power_brake": THROTTLE_HW_POWER_BRAKE,
    "display_clocks": THROTTLE_DISPLAY_CLOCKS,
}
THERMAL_THROTTLE_MASK = THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL | THROTTLE_HW_SLOWDOWN
"""Bits that mean the GPU is thermally limited."""

# --- Hopper SXM (H100/H200, GH100 die) -------------------------------------------------------
POWER_LIMIT_W = 700.0  # default and max enforced limit [P]
POWER_LIMIT_MIN_W = 200.0
IDLE_POWER_W = 78.0  # H200 idle capture [P]
IDLE_TEMP_C = 28.0
LOAD_POWER_W = 627.0  # H200 under gpu-burn [P]
LOAD_TEMP_C = 52.0
LOAD_HBM_TEMP_C = 41.0
SM_CLOCK_MAX_HZ = 1980e6
MAX_OPERATING_TEMP_C = 87.0  # SW thermal slowdown above it [P]
HW_SLOWDOWN_TEMP_C = 89.0  # [P]; NVSentinel reads 89 on H100
SHUTDOWN_TEMP_C = 92.0  # [P]
HBM_MAX_OPERATING_TEMP_C = 95.0  # [P]
# A GPU's own thresholds as an exporter reports them (slowdown_temp, max_op_temp, hbm_max_op_temp)
# are readings only inside this range: nvidia-smi 590 prints them as offsets from T.Limit (0, -2),
# and a 0 or a sentinel would otherwise become a limit
OWN_LIMIT_MIN_C = 40.0
OWN_LIMIT_MAX_C = 130.0
THERMAL_RESISTANCE_C_PER_W = 0.046  # die to coolant, derived from the H200 capture, 24 C inlet
NOMINAL_INLET_C = 24.0

# --- dcgm-exporter -----------------------------------------------------------------------------
DCGM_NOT_SUPPORTED_MIN = 0x7FFFFFFFFFFFFFF0  # drop every value at or above this [P]
DCGM_DEFAULT_INTERVAL_S = 30.0

# --- InfiniBand / optics (NVSentinel, gpud, IB spec) --------------------------------------------
SYMBOL_ERRORS_FATAL_PER_HOUR = 120.0  # ~BER 1e-12
SYMBOL_ERRORS_WARN_PER_S = 10.0
LINK_ERROR_RECOVERY_WARN_PER_MIN = 5.0
RCV_ERRORS_WARN_PER_S = 10.0
XMIT_DISCARDS_WARN_PER_S = 100.0
FLAP_CYCLES = 3  # >= 3 down/up cycles ...
FLAP_WINDOW_S = 12 * 3600.0  # ... within 12 hours
IB_PORT_STATE_ACTIVE = 4
PREFEC_BER_HEALTHY = 3e-12
PREFEC_BER_UNCLEAN = 1e-6

# --- XID codes worth knowing --------------------------------------------------------------------
XID_SEVERITY: dict[int, str] = {
    48: "critical",  # double-bit ECC
    63: "warning",  # row remap pending
    64: "critical",  # row remap failure
    74: "critical",  # NVLink error
    79: "critical",  # fallen off the bus
    92: "warning",  # high single-bit ECC rate
    94: "warning",  # contained ECC
    95: "critical",  # uncontained ECC
    119: "critical",  # GSP timeout
    120: "critical",  # GSP error
}

# --- Added for the simulator (issue 3); the detectors read the same numbers -------------------
HBM_THERMAL_RESISTANCE_C_PER_W = 0.027  # HBM ~41 C at 627 W board power with a 24 C inlet [P capture]
SM_CLOCK_IDLE_HZ = 345e6  # Hopper idle SM clock
SM_CLOCK_STEP_HZ = 15e6  # Hopper SM clocks move in 15 MHz bins
POWER_NOISE_W = 5.0  # power.draw is accurate to +-5 W [P]
IB_PORT_STATE_DOWN = 1
LINK_RATE_GPU_BPS = 400e9  # NDR / 400G RoCE NIC per GPU
LINK_RATE_UPLINK_BPS = 800e9  # leaf-spine (twin-port OSFP)
XMIT_WAIT_TICK_BYTES = 64.0
"""Simulator convention: one port_xmit_wait tick = the time to send 64 bytes at the port rate, so a
port waiting all the time counts ``rate / 8 / 64`` ticks per second (the IB spec leaves the tick
unspecified; real ports differ)."""
PREFEC_BER_FEC_LIMIT = 2.4e-4  # RS(544,514) "KP4" FEC limit for 400G PAM4 links

STALLED_STEP_RATIO = 100.0
"""Step slowdown reported for a job that cannot step at all (a GPU off the bus): the ratio is
unbounded, and gauges and JSON want a finite number; GPU-hours at risk count the whole job."""


def lost_share(step_ratio: float) -> float:
    """The share of a synchronous job's GPU time lost when its step runs ``step_ratio`` times
    slower (its GPUs all wait for the slowest member): ``1 - 1/ratio``, all of it once the job
    cannot step (``STALLED_STEP_RATIO`` or more, inf included)."""
    return 1.0 if step_ratio >= STALLED_STEP_RATIO else 1.0 - 1.0 / max(step_ratio, 1.0)
