"""A tiny first-order GPU thermal/power world for detector tests (independent of the simulator).

Each GPU's core and HBM temperatures relax toward ``inlet + R·P`` (exact exponential steps);
power follows a per-GPU demand, capped at the power limit (bit 0x4) and cut to hold the core at
max operating temperature, or the HBM at its own, once it gets there (bit 0x20). Faults: a
rack's inlet ramps up (cooling loss), a GPU's R ramps up (thermal-interface degradation) or its
HBM's does (the HBM cooling path degrading), or its power demand ramps up. Ground truth is returned
as :class:`foreshock.events.Event` objects, like a simulator recording's ``events.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from foreshock import facts
from foreshock.events import Event
from foreshock.frames import Frame
from foreshock.topology import Topology


@dataclass
class Fault:
    kind: str  # "cooling_loss" (rack) | "tim_degradation", "hbm_degradation", "power_ramp" (gpu)
    target: int
    onset: float
    rate: float  # °C/s of inlet, fraction of R (core or HBM) per hour, or W/s of power demand
    fault_id: str = "f0"


@dataclass
class World:
    topology: Topology
    interval: float = 10.0
    seed: int = 0
    inlet_c: float = 24.0
    load_w: float = 640.0
    power_noise_w: float = 5.0
    tau_core: float = 25.0
    tau_hbm: float = 80.0
    r_hbm: float = 0.028
    # the board: its enforced power limit and its core's resistance (a 700-W H100/H200 by default; a
    # 70-W T4 is ~0.75 °C/W)
    power_limit_w: float = facts.POWER_LIMIT_W
    r_core: float = facts.THERMAL_RESISTANCE_C_PER_W
    faults: list[Fault] = field(default_factory=list)
    idle_gpus: tuple[int, ...] = ()
    t0: float = 1_700_000_000.0

    def run(self, duration: float, slowdown_temp: float | None = None) -> tuple[list[Frame], list[Event]]:
        """Frames (rack and GPU, one of each per tick, rack first) and ground-truth events."""
        rng = np.random.default_rng(self.seed)
        topo = self.topology
        n, n_racks = topo.size("gpu"), topo.size("rack")
        r_core = self.r_core * (1 + 0.03 * rng.standard_normal(n))
        r_hbm = self.r_hbm * (1 + 0.03 * rng.standard_normal(n))
        demand = self.load_w * (1 + 0.02 * rng.standard_normal(n))
        demand[list(self.idle_gpus)] = facts.IDLE_POWER_W
        rack_of = topo.gpu_rack
        temp = self.inlet_c + r_core * demand
        hbm = self.inlet_c + r_hbm * demand
        limit = facts.MAX_OPERATING_TEMP_C
        throttled = np.zeros(n, bool)
        capped = np.zeros(n, bool)
        hbm_hot = np.zeros(n, bool)
        energy = rng.uniform(1e8, 1e9, n)
        frames: list[Frame] = []
        events: list[Event] = []
        fault_of = {}
        for f in self.faults:
            events.append(Event(self.t0 + f.onset, "fault_onset", "rack" if f.kind == "cooling_loss" else "gpu",
                                topo.name("rack" if f.kind == "cooling_loss" else "gpu", f.target),
                                f.fault_id, f.kind))
        for t in np.arange(0.0, duration, self.interval):
            ts = self.t0 + t
            inlet = np.full(n_racks, self.inlet_c)
            r_now = r_core.copy()
            r_hbm_now = r_hbm.copy()
            dem = demand.copy()
            for f in self.faults:
                if t < f.onset:
                    continue
                if f.kind == "cooling_loss":
                    inlet[f.target] += f.rate * (t - f.onset)
                    fault_of.update({int(g): f for g in topo.gpus_of_rack(f.target)})
                elif f.kind == "tim_degradation":
                    r_now[f.target] *= 1 + f.rate * (t - f.onset) / 3600
                    fault_of[f.target] = f
                elif f.kind == "hbm_degradation":
                    r_hbm_now[f.target] *= 1 + f.rate * (t - f.onset) / 3600
                    fault_of[f.target] = f
                elif f.kind == "power_ramp":
                    dem[f.target] += f.rate * (t - f.onset)
                    fault_of[f.target] = f
            u = inlet[rack_of]
            power = np.minimum(dem, self.power_limit_w)
            cap_bit = dem >= self.power_limit_w
            # the SW thermal limiter holds the core at its limit and the HBM at its own (NVML's
            # SW thermal slowdown): the power that does it
            hold = np.minimum((limit - u) / r_now, (facts.HBM_MAX_OPERATING_TEMP_C - u) / r_hbm_now)
            therm_bit = (temp >= limit - 0.01) | (hbm >= facts.HBM_MAX_OPERATING_TEMP_C - 0.01)
            power = np.where(therm_bit, np.minimum(power, hold), power)
            a_c = np.exp(-self.interval / self.tau_core)
            a_h = np.exp(-self.interval / self.tau_hbm)
            temp = u + r_now * power + (temp - u - r_now * power) * a_c
            hbm = u + r_hbm_now * power + (hbm - u - r_hbm_now * power) * a_h
            energy = energy + power * self.interval
            reasons = (facts.THROTTLE_SW_POWER_CAP * cap_bit + facts.THROTTLE_SW_THERMAL * therm_bit).astype(float)
            frames.append(Frame("rack", np.full(n_racks, ts), np.arange(n_racks), {
                "inlet_temp": np.round(inlet, 1)}))
            cols = {
                "gpu_temp": np.round(temp), "hbm_temp": np.round(hbm),
                "power": power + self.power_noise_w * rng.standard_normal(n),
                "power_limit": np.full(n, self.power_limit_w), "throttle_reasons": reasons,
                "energy": energy.copy(),
                "sm_clock": np.where(therm_bit | cap_bit, 0.85, 1.0) * facts.SM_CLOCK_MAX_HZ,
                "sm_clock_max": np.full(n, facts.SM_CLOCK_MAX_HZ),
                "util": np.where(np.isin(np.arange(n), self.idle_gpus), 0.0, 1.0),
            }
            if slowdown_temp is not None:
                cols["slowdown_temp"] = np.full(n, slowdown_temp)
            frames.append(Frame("gpu", np.full(n, ts), np.arange(n), cols))
            for bits, state, kind in ((therm_bit, throttled, "thermal_throttle"),
                                      (cap_bit, capped, "power_cap"),
                                      (hbm >= facts.HBM_MAX_OPERATING_TEMP_C, hbm_hot, "hbm_overheat")):
                for g in np.flatnonzero(bits != state):
                    f = fault_of.get(int(g))
                    events.append(Event(ts, f"{kind}_{'start' if bits[g] else 'end'}", "gpu", topo.name("gpu", int(g)),
                                        f.fault_id if f else "", f.kind if f else ""))
                state[:] = bits
        return frames, events


def run(det, frames):  # type: ignore[no-untyped-def]
    """Feed ``frames`` to a detector one at a time, as the bank does; every finding, in order."""
    out = []
    for f in frames:
        out += det.update(f)
    return out


def small_topology(nodes: int = 4, gpus: int = 8, racks: int = 2) -> Topology:
    names = [f"node{i}" for i in range(nodes)]
    return Topology.from_dict({
        "cluster": "synth",
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
        "racks": [{"name": f"rack{r}", "row": "row0"} for r in range(racks)],
        "nodes": [{"name": n, "rack": f"rack{i * racks // nodes}", "gpus": gpus} for i, n in enumerate(names)],
        "jobs": [{"name": "job0", "nodes": names}],
    })


def write_recording(path, world: World, duration: float, **run_kw):  # type: ignore[no-untyped-def]
    """Run ``world`` and write a recording folder (rack and GPU frames, events) at ``path``."""
    from foreshock.recording import RecordingWriter

    frames, events = world.run(duration, **run_kw)
    with RecordingWriter(path, world.topology, {"source": "thermal_synth", "interval": world.interval,
                                                "seed": world.seed}) as writer:
        for frame in frames:
            writer.write(frame)
        writer.add_events(events)
    return frames, events
