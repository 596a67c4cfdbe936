"""GPU thermal, power and clock model, vectorised over every GPU of the cluster.

Per physics step of ``dt`` seconds, for each GPU:

1. leakage from the current die temperature (doubles every ``leak_doubling_c``);
2. the driver's clock choice, like NVML's limiters:
   - SW power cap: the highest clock whose power stays under the enforced limit (bit 0x4 when
     it is the binding limit in the phase the sample lands in, the one its clock is from);
   - SW thermal slowdown: a feedback limiter that holds the die just under max operating
     (87 °C) and HBM at its max operating (95 °C) by cutting the clock (0x20);
   - HW slowdown at 89 °C: clocks cut >= 2x until the die is 1 °C below (0x8 | 0x40);
   - HW power brake, asserted by the node when a PSU fails: clocks cut >= 2x (0x80 | 0x8);
   - idle (0x1) when no work runs; clocks drop to the idle clock;
3. board power at that clock;
4. core and HBM temperatures relax toward ``inlet + R·P`` with their own time constants
   (exact exponential step, stable for any ``dt``);
5. cumulative counters: energy, power- and thermal-throttle time (seconds).

A physics step longer than ``gpu_max_dt_s`` (1 s) is integrated in sub-steps: the die's time
constant is 10 s and the driver's limiters react within a second, so a 5-s step let the
temperature jump ~5 °C between two limiter decisions, limit-cycle between 63 and 94 °C and trip
the 92 °C shutdown that the real driver prevents. Reason bits and clocks are the last
sub-step's (the state at the sampling instant); counters integrate every sub-step.
"""

from __future__ import annotations

import math

import numpy as np

from foreshock import facts

from .params import SimParams


def manufacturing_spread(rng: np.random.Generator, sigma: float, n: int) -> np.ndarray:
    """``n`` factors around 1 of relative standard deviation ``sigma``, clipped at 4 sigma: how
    much one board's constant differs from the nominal one."""
    return np.clip(1.0 + sigma * rng.standard_normal(n), 1.0 - 4 * sigma, 1.0 + 4 * sigma)


class GpuModel:
    def __init__(self, n: int, params: SimParams, rng: np.random.Generator,
                 inlet_c: float = facts.NOMINAL_INLET_C) -> None:
        p = self.params = params
        self.n = n
        # hidden per-GPU constants (manufacturing spread)
        self.r_core = p.r_core_c_per_w * manufacturing_spread(rng, p.gpu_spread, n)
        self.r_hbm = p.r_hbm_c_per_w * manufacturing_spread(rng, p.gpu_spread, n)
        self.leak_scale = manufacturing_spread(rng, p.leak_spread, n)
        self.dyn_scale = manufacturing_spread(rng, p.dyn_spread, n)
        # state
        idle_power = p.static_power_w + p.leak_ref_w * np.exp(p.leak_k * (inlet_c + 4.0 - p.leak_ref_temp_c))
        self.temp = inlet_c + self.r_core * idle_power
        self.hbm_temp = inlet_c + self.r_hbm * idle_power
        self.power = idle_power.copy()
        self.clock = np.full(n, p.clock_idle_hz)  # as sampled
        self.compute_clock = np.full(n, p.clock_idle_hz)  # while computing: sets the job's pace
        self.sw_scale = np.ones(n)  # SW thermal limiter, fraction of the max clock allowed
        self.hw_slowdown = np.zeros(n, dtype=bool)
        self.reasons = np.full(n, facts.THROTTLE_IDLE, dtype=np.int64)
        self.energy = rng.uniform(1e8, 5e9, n)  # joules since driver load (weeks of uptime)
        self.power_throttle_time = np.zeros(n)
        self.thermal_throttle_time = np.zeros(n)
        # health state faults write and telemetry reads
        self.alive = np.ones(n, dtype=bool)
        self.util = np.zeros(n)
        self.power_limit = np.full(n, p.power_limit_w)
        self.xid_last = np.zeros(n)
        self.ecc_dbe = np.zeros(n)
        self.pcie_replays = np.floor(rng.exponential(20.0, n))
        self.remapped_rows = np.zeros(n)
        # the board in each slot: boards.board_id of its UUID (the engine names the boards)
        self.board_id = np.full(n, np.nan)

    def replace_board(self, g: int, rng: np.random.Generator) -> None:
        """Another board in GPU ``g``'s slot (an RMA): its own manufacturing constants, drawn from
        the fleet's spread with ``rng`` (the new board's own stream, so no other draw moves), and
        its counters as the driver loaded at the swap's reboot leaves them: energy from the
        burn-in (up to 10 MJ, ~4 h at 700 W), no throttle time, ECC error, remapped row, PCIe
        replay or XID yet. The caller sets ``board_id``."""
        p = self.params
        self.r_core[g] = p.r_core_c_per_w * manufacturing_spread(rng, p.gpu_spread, 1)[0]
        self.r_hbm[g] = p.r_hbm_c_per_w * manufacturing_spread(rng, p.gpu_spread, 1)[0]
        self.leak_scale[g] = manufacturing_spread(rng, p.leak_spread, 1)[0]
        self.dyn_scale[g] = manufacturing_spread(rng, p.dyn_spread, 1)[0]
        self.energy[g] = rng.uniform(0.0, 1e7)
        for counter in (self.power_throttle_time, self.thermal_throttle_time, self.ecc_dbe, self.remapped_rows,
                        self.pcie_replays, self.xid_last):
            counter[g] = 0.0
        self.sw_scale[g] = 1.0
        self.hw_slowdown[g] = False

    def step(self, dt: float, inlet: np.ndarray, compute_frac: np.ndarray, compute_activity: np.ndarray,
             other_activity: np.ndarray, running: np.ndarray, brake: np.ndarray, r_factor: np.ndarray,
             hbm_r_factor: np.ndarray, max_dt: float | None = None) -> None:
        """Advance every GPU by ``dt`` seconds, in sub-steps of at most ``max_dt`` (default
        ``params.gpu_max_dt_s``).

        A step of work has two phases: ``compute_frac`` of ``dt`` at ``compute_activity`` (dynamic
        power activity, 1 = gpu-burn at the max clock) and the rest at ``other_activity``
        (communication, waiting for the slowest rank). The driver picks a clock per phase: the SW
        power cap bites in compute and releases in communication, as on real training GPUs.
        ``running`` says whether work is scheduled (else idle clocks and bit 0x1), ``brake`` is the
        node's power-brake signal, ``r_factor``/``hbm_r_factor`` multiply the thermal resistances
        (faults). ``self.power_limit`` is the enforced limit; ``self.alive`` is False for a GPU that
        fell off the bus (it draws nothing).
        """
        limit = self.params.gpu_max_dt_s if max_dt is None else max_dt
        n_sub = max(1, math.ceil(dt / limit - 1e-9))
        for _ in range(n_sub):
            self._substep(dt / n_sub, inlet, compute_frac, compute_activity, other_activity, running, brake,
                          r_factor, hbm_r_factor)

    def _substep(self, dt: float, inlet: np.ndarray, compute_frac: np.ndarray, compute_activity: np.ndarray,
                 other_activity: np.ndarray, running: np.ndarray, brake: np.ndarray, r_factor: np.ndarray,
                 hbm_r_factor: np.ndarray) -> None:
        p = self.params
        alive = self.alive
        running = running & alive
        fmax = p.clock_max_hz
        base = self.base_power()
        self._thermal_limiter(dt)
        f_thermal = fmax * self.sw_scale
        # HW slowdown with hysteresis
        self.hw_slowdown = np.where(self.hw_slowdown, self.temp >= p.hw_slowdown_release_c,
                                    self.temp >= p.hw_slowdown_c)
        f_req = np.where(running, fmax, p.clock_idle_hz)
        cf = np.where(running, np.clip(compute_frac, 0.0, 1.0), 0.0)
        f_c, p_c, cap_c = self._phase(base, compute_activity, f_req, f_thermal, brake)
        f_o, p_o, cap_o = self._phase(base, other_activity, f_req, f_thermal, brake)
        power = np.where(alive, cf * p_c + (1.0 - cf) * p_o, 0.0)
        capped_share = np.where(running, cf * cap_c + (1.0 - cf) * cap_o, 0.0)  # for the counter
        sw_thermal = running & (self.sw_scale < 1.0)
        # a sample lands in the phase that fills most of the step: its clock, and its power cap
        # bit (taken from any capped phase, 0x4 came with the max clock in 38 % of its samples)
        in_compute = cf >= 0.5
        # reason bits as NVML reports them
        reasons = np.where(running, 0, facts.THROTTLE_IDLE).astype(np.int64)
        reasons |= np.where(running & np.where(in_compute, cap_c, cap_o), facts.THROTTLE_SW_POWER_CAP, 0)
        reasons |= np.where(sw_thermal, facts.THROTTLE_SW_THERMAL, 0)
        reasons |= np.where(self.hw_slowdown, facts.THROTTLE_HW_SLOWDOWN | facts.THROTTLE_HW_THERMAL, 0)
        reasons |= np.where(brake, facts.THROTTLE_HW_POWER_BRAKE | facts.THROTTLE_HW_SLOWDOWN, 0)
        # thermal relaxation (exact for a first-order system)
        a_core = 1.0 - np.exp(-dt / p.tau_core_s)
        a_hbm = 1.0 - np.exp(-dt / p.tau_hbm_s)
        self.temp += (inlet + self.r_core * r_factor * power - self.temp) * a_core
        self.hbm_temp += (inlet + self.r_hbm * hbm_r_factor * power - self.hbm_temp) * a_hbm
        self.compute_clock = np.where(alive, np.where(running, f_c, f_o), 0.0)
        self.clock = np.where(alive, np.where(in_compute, f_c, f_o), 0.0)
        self.power = power
        self.reasons = np.where(alive, reasons, 0)
        self.energy += power * dt
        self.power_throttle_time += np.where(alive, capped_share * dt, 0.0)
        thermal = (sw_thermal | self.hw_slowdown) & alive
        self.thermal_throttle_time += np.where(thermal, dt, 0.0)

    def base_power(self) -> np.ndarray:
        """Static power plus leakage at the current die temperature (W): what a GPU draws before
        any work, and what the SW power cap's headroom is measured from."""
        p = self.params
        # (the exponent is capped far above the 92 °C shutdown, only to keep numbers finite)
        leak = p.leak_ref_w * self.leak_scale * np.exp(np.minimum(p.leak_k * (self.temp - p.leak_ref_temp_c), 4.0))
        return p.static_power_w + leak

    def power_cap_margin(self, activity: np.ndarray) -> np.ndarray:
        """Watts between the enforced power limit and what a phase of ``activity`` would draw
        at the max clock, at the current die temperature. Below zero the SW power cap binds in
        that phase (unless the thermal limiter already holds the clock lower). Hidden state: no
        telemetry reports it; analyses use it to ask what could be predicted at best."""
        return self.power_limit - self.base_power() - self.full_clock_dynamic_power(activity)

    def full_clock_dynamic_power(self, activity: np.ndarray) -> np.ndarray:
        """Dynamic power (W) of a phase of ``activity`` (1 = gpu-burn) at the max clock."""
        return self.params.dyn_max_w * self.dyn_scale * activity

    def _thermal_limiter(self, dt: float) -> None:
        """SW thermal slowdown: an integral controller holding the die just under max operating
        (and HBM at its max operating), with a fast cut once the die is 1 °C over."""
        p = self.params
        step_dt = min(dt, 5.0)  # the driver reacts within seconds even if we sample slowly
        err = np.maximum(self.temp - (p.max_operating_c - 0.3), self.hbm_temp - p.hbm_max_operating_c)
        engaged = (self.sw_scale < 1.0) | (self.temp > p.max_operating_c) | (self.hbm_temp > p.hbm_max_operating_c)
        fast = np.maximum(self.temp - p.max_operating_c - 1.0, 0.0)
        delta = (p.sw_thermal_gain * err + p.sw_thermal_fast_gain * fast) * step_dt
        self.sw_scale = np.where(engaged, self.sw_scale - delta, self.sw_scale)
        np.clip(self.sw_scale, p.clock_min_hz / p.clock_max_hz, 1.0, out=self.sw_scale)

    def _phase(self, base: np.ndarray, activity: np.ndarray, f_req: np.ndarray, f_thermal: np.ndarray,
               brake: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Clock, power and "power cap binding" for one phase of work."""
        p = self.params
        fmax = p.clock_max_hz
        dyn_full = self.full_clock_dynamic_power(activity)
        # SW power cap: the clock at which base + dyn_full * (f/fmax)^a == limit
        headroom = np.maximum(self.power_limit - base, 1.0)
        ratio = headroom / np.maximum(dyn_full, 1e-9)
        f_power = fmax * np.minimum(ratio, 1e6) ** (1.0 / p.dyn_clock_exponent)
        # the limiter's clock is the highest clock step at or under that one: rounded to the
        # nearest step, one within half a step of the max clock came back at the max clock, with
        # its 0x4 bit (clocks held under the requested clock) set
        f_cap = np.floor(f_power / p.clock_step_hz) * p.clock_step_hz
        f = np.minimum(f_req, np.maximum(np.minimum(f_cap, f_thermal), p.clock_min_hz))
        f = np.where(self.hw_slowdown, f * p.hw_slowdown_factor, f)
        f = np.where(brake, f * p.power_brake_factor, f)
        f = np.maximum(np.round(f / p.clock_step_hz) * p.clock_step_hz, p.clock_step_hz)
        capped = (f_power < f_req) & (f_power <= f_thermal)
        power = base + dyn_full * (f / fmax) ** p.dyn_clock_exponent
        power = np.minimum(power, np.maximum(self.power_limit, base))  # the limiter holds the limit
        return f, power, capped

    # ---- derived views used by ground truth ------------------------------------------------
    @property
    def thermal_throttled(self) -> np.ndarray:
        return (self.reasons & (facts.THROTTLE_SW_THERMAL | facts.THROTTLE_HW_THERMAL)) != 0

    @property
    def power_capped(self) -> np.ndarray:
        return (self.reasons & facts.THROTTLE_SW_POWER_CAP) != 0

    @property
    def power_braked(self) -> np.ndarray:
        return (self.reasons & facts.THROTTLE_HW_POWER_BRAKE) != 0

    def steady_temp(self, inlet: np.ndarray, r_factor: np.ndarray | float = 1.0) -> np.ndarray:
        """Die temperature this GPU tends to at its current power (inlet + R·P)."""
        return inlet + self.r_core * r_factor * self.power
