"""The simulation engine: wires workload, GPUs, cooling, optics, fabric, faults and ground truth.

One physics step of ``dt`` seconds (1 s by default, never more than the sampling interval):

1. faults set the hidden inputs (CDU flow, thermal resistances, fans, power brake and limits,
   optic losses, dead GPUs, stopped jobs) and note which fault touches which entity; a repair
   that swaps a GPU's board (``gpu_replacement``) puts the new board in first;
2. jobs advance their steps (pace of the slowest member, communication stretched by congestion);
3. GPUs choose clocks (driver limiters), draw power, heat up or cool down;
4. cooling loops follow the heat they carry; fans follow the hottest GPU;
5. optics drift, BER follows RX power, links flap or go down;
6. the fabric routes each job's traffic (around down links) and grows the port counters;
7. ground-truth trackers turn conditions into debounced episodes attributed to faults.

Every ``interval`` seconds the engine samples telemetry into one frame per entity kind.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from foreshock import facts
from foreshock.boards import board_id
from foreshock.events import Event
from foreshock.fields import ENTITY_KINDS
from foreshock.frames import Frame
from foreshock.guard import MIN_INTERVAL_S
from foreshock.recording import RecordingWriter, deferred_signals
from foreshock.topology import Topology

from .cooling import DAY_S, CoolingModel
from .fabric import FabricModel
from .faults import (
    CURED_BY_NEW_BOARD, DEFAULT_PARAMS, FAULT_TYPES, RANDOM_FAULT_ACCELERATION, RANDOM_FAULT_MIX, Fault,
    draw_random_params, random_fault_rate_per_s,
)
from .formats import gpu_uuid
from .gpu_model import GpuModel
from .optics import OpticsModel
from .params import SimParams
from .scenario import FaultSpec, Scenario, load_scenario, resolve_time
from .telemetry import Telemetry
from .topology_gen import build_topology
from .truth import EpisodeTracker
from .workload import Workload

DEFAULT_START = 1_700_006_400.0  # 2023-11-15 00:00:00 UTC: the diurnal swing starts at midnight
DEFAULT_DURATION_S = 3600.0
MAX_INTERVAL_S = 3600.0
"""The longest sampling interval: an hour between samples (no detector or dashboard reads anything
coarser). One tick runs every physics step of its interval at once, so ``interval=1e7`` spent hours in
one uninterruptible tick (``demo --interval 1e7`` printed nothing and ignored SIGTERM)."""

HOLD_S = {"thermal_throttle": 30.0, "power_cap": 60.0, "power_brake": 30.0, "hbm_overheat": 30.0,
          "congestion": 30.0, "job_slowdown": 60.0}
"""Debounce per consequence: an episode ends only after its condition stayed false this long."""
HBM_AT_LIMIT_MARGIN_C = 0.5
"""HBM counts as overheating from 0.5 °C under its max operating temperature: the SW thermal
limiter holds it right there, so "above" alone would flicker."""
AFTERMATH_S = 900.0
"""After a fault is repaired its consequences (a loop still cooling down) are attributed to it
for this long, on the entities no active fault acts on (a node's PSU or fans leave nothing behind
for its GPUs: :meth:`ClusterSimulator._attribute`)."""
REBOOT_S = 600.0
"""A GPU that shut down thermally is back this long after it went down (once cool and repaired)."""
SETTLED_C = 1.0
"""A loop's coolant counts as settled within this of where it heads (``CoolingModel.target``): a
GPU another fault kept over its limits after its shutdown's repair waits for that to reboot."""
WARMUP_S = 600.0
"""Physics run before the first sample so the cluster starts in its steady state."""
FAULT_DRAW_BLOCK_S = 10.0
"""Random faults are drawn on a clock of their own, in blocks of this many seconds, each block
as the 10-s sampling always drew one interval (a Poisson count, then per fault its type, target,
parameters and an onset inside the block): the same seed draws the same faults at any sampling
interval (a draw per interval had 10-s recordings fault other clusters than 1-s ones). 10 s, the
interval of every recording the README and docs score, keeps their faults as they were (a 1-s
recording made before 2026-12-03 drew other faults). Board swaps (the ``gpu-replacement``
scenario, ``xid79_new_board``) read the schedule too (:meth:`ClusterSimulator._board_cures`): which
faults a swap cures, and so which random faults are dropped as duplicates, does not depend on the
physics step either; a block is drawn before the step that reaches its start, so a swap in that
step finds the faults drawn with their onsets before it."""
FAULT_CLOCK_SLACK_S = 1e-9
"""A block is drawn before the physics step that reaches its start, within this: sub-steps that
do not add up exactly (ten of 0.1 s make 0.9999999999999999 s) still reach it."""
BOARD_STREAM = 0xB0A4D
"""Mixed into the seed of each new board's own random stream (seed, this, GPU, board number): a
swap draws nothing from the run's streams, so the rest of the run stays as it was."""


@dataclass
class RunSummary:
    gpus: int
    simulated_seconds: float
    wall_seconds: float
    faults: int
    events: int
    frames: int
    rows: int
    interrupted: bool = False  # stopped before its end (``record``'s ``stop``)

    def as_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "simulated_seconds": self.simulated_seconds,
                "wall_seconds": round(self.wall_seconds, 3), "faults": self.faults, "events": self.events,
                **({"interrupted": True} if self.interrupted else {})}  # (a whole run's line as it was)


class ClusterSimulator:
    """A simulated GPU training cluster; see the package docstring for the API."""

    def __init__(
        self,
        topology: Topology | None = None,
        *,
        gpus: int = 256,
        scenario: str | Path | Scenario | None = None,
        seed: int = 0,
        interval: float = 1.0,
        duration: float | None = None,
        random_faults: bool | None = None,
        fault_acceleration: float = RANDOM_FAULT_ACCELERATION,
        params: SimParams | dict[str, Any] | None = None,
        physics_dt: float | None = None,
        start_time: float = DEFAULT_START,
        start_hour: float | None = None,
        topology_options: dict[str, Any] | None = None,
        warmup_s: float = WARMUP_S,
        refuse_overlapping_faults: bool = False,
    ) -> None:
        if not (MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S):  # (faster, the guard refuses rows as repeats)
            raise ValueError(f"interval must be a number of seconds, at least {MIN_INTERVAL_S:g} and at most "
                             f"{MAX_INTERVAL_S:g} (an hour), got {interval}")
        if scenario is None:
            scen = Scenario("healthy")
        elif isinstance(scenario, Scenario):
            scen = scenario
        else:
            scen = load_scenario(scenario)
        self.scenario = scen
        base = params if isinstance(params, SimParams) else SimParams()
        self.params = p = base.with_overrides(scen.params).with_overrides(
            params if isinstance(params, dict) else None)
        self.seed = seed
        streams = np.random.SeedSequence(seed).spawn(8)
        self._rng_init, self._rng_work, self._rng_optics, self._rng_tel, self._rng_faults, \
            self._rng_fabric, self._rng_misc, self._rng_targets = (np.random.default_rng(s) for s in streams)
        self.topology = topology if topology is not None else build_topology(
            gpus, seed=seed, **(topology_options or {}))
        topo = self.topology
        self.interval = float(interval)
        if physics_dt is not None and not (physics_dt > 0 and math.isfinite(physics_dt)):
            raise ValueError(f"physics_dt must be a positive number of seconds, got {physics_dt}")
        dt = min(self.interval, physics_dt if physics_dt is not None else 1.0)
        # physics_dt is the longest sub-step: an interval it does not divide gets one more, shorter
        # (rounding gave 2.5 s / 1 s two 1.25-s steps); the tolerance keeps 0.3 / 0.1 at three
        self.substeps = max(1, math.ceil(self.interval / dt - 1e-9))
        self.dt = self.interval / self.substeps
        self.duration = float(duration if duration is not None else scen.defaults.get("duration", DEFAULT_DURATION_S))
        if not (self.duration > 0 and math.isfinite(self.duration)):
            raise ValueError(f"duration must be a positive number of seconds, got {self.duration}")
        self.start_time = float(start_time)
        self.elapsed = 0.0
        self.random_faults = scen.random_faults if random_faults is None else bool(random_faults)
        self.fault_acceleration = float(fault_acceleration)
        self.fault_rate = random_fault_rate_per_s(len(topo.nodes), self.fault_acceleration)

        # models
        self.gpu = GpuModel(len(topo.gpus), p, self._rng_init)
        # the board in each GPU's slot: the slot's first (number 0), one more at each swap
        self.board_number = np.zeros(len(topo.gpus), dtype=np.int64)
        self.gpu_uuids = [gpu_uuid(name) for name in topo.gpus]
        self.gpu.board_id[:] = [board_id(uuid) for uuid in self.gpu_uuids]
        # the diurnal swing follows start_time's own hour of the day, or starts at start_hour (UTC)
        self.start_hour = start_hour
        day_offset = 0.0 if start_hour is None else start_hour * 3600.0 - self.start_time % DAY_S
        self.cooling = CoolingModel(topo, p, self._rng_init, self.start_time, day_offset)
        self.workload = Workload(topo, p, self._rng_work)
        self.optics = OpticsModel(topo, p, self._rng_optics)
        self.fabric = FabricModel(topo, p, self._rng_fabric)
        self.telemetry = Telemetry(p, self._rng_tel, {k: topo.size(k) for k in ENTITY_KINDS})
        # relations
        self.gpu_rack = topo.gpu_rack
        self.gpu_loop = topo.rack_loop[self.gpu_rack]
        self.gpu_node = topo.gpu_node
        self.job_gpus = [topo.gpus_of_job(j) for j in range(len(topo.jobs))]
        # hidden fault inputs and attribution (reset every physics step)
        n_gpus, n_links = len(topo.gpus), len(topo.links)
        self.r_factor = np.ones(n_gpus)
        self.hbm_r_factor = np.ones(n_gpus)
        self.brake = np.zeros(len(topo.nodes), dtype=bool)
        # the PSU fault that brakes each node now: it alone sets the brake bit (0x80), so it names
        # the brake episodes whatever fault weighs most on the node's GPUs (a failed fan took them)
        self.brake_cause = np.full(len(topo.nodes), -1, dtype=np.int64)
        self.gpu_cause = np.full(n_gpus, -1, dtype=np.int64)
        self._cause_weight = np.full(n_gpus, -np.inf)  # what the fault in gpu_cause does to it (°C)
        self._aftermath_weight = np.full(n_gpus, -np.inf)  # what the repaired one there left behind (°C)
        self.link_cause = np.full(n_links, -1, dtype=np.int64)
        self.job_cause = np.full(len(topo.jobs), -1, dtype=np.int64)
        self.fault_dead = np.zeros(n_gpus, dtype=bool)  # fell off the bus (XID 79 fault)
        self.fault_held = np.zeros(len(topo.jobs), dtype=bool)  # stopped by a fault
        self._job_stopped = np.zeros(len(topo.jobs), dtype=bool)  # running but held at the last truth step
        self.shutdown = np.zeros(n_gpus, dtype=bool)  # thermal shutdown
        self.shutdown_since = np.zeros(n_gpus)
        self.shutdown_cause = np.full(n_gpus, -1, dtype=np.int64)  # names the GPU's stop (its job held)
        self.shutdown_origin = np.full(n_gpus, -1, dtype=np.int64)  # the fault that shut it down
        self.shutdown_kept = np.zeros(n_gpus, dtype=bool)  # kept over its limits after that fault's repair
        self.shutdown_power = np.zeros(n_gpus)  # drawn as it went over: its limiters at their floor there
        self._fault_inputs_dirty = False
        # the fault behind each job's congested path in the fabric state its next step will use
        self._job_fabric_cause = np.full(len(topo.jobs), -1, dtype=np.int64)

        # faults
        self.faults: list[Fault] = []
        self._used_loops: set[int] = set()
        # start of the next block of the random-fault clock (FAULT_DRAW_BLOCK_S): the 10-s sampling
        # drew its first faults after its first interval, for the block that follows, so the run's
        # first block draws none
        self._fault_clock = FAULT_DRAW_BLOCK_S
        # faults ended by a board swap: the time of the swap (the swapping fault's scheduled end);
        # their duration is cut to end there
        self._cured_at: dict[str, float] = {}
        scripted: list[tuple[int, Fault]] = []  # (the index in the scenario's list, the fault)
        for index, spec in sorted(enumerate(scen.faults), key=lambda s: resolve_time(s[1].onset, self.duration)):
            target, name = self._resolve_target(FAULT_TYPES[spec.type], spec.target)
            duration_s = spec.duration_s(self.duration)
            onset = resolve_time(spec.onset, self.duration)
            self._yield_floors(scen, scripted, spec.type, target, onset)
            if refuse_overlapping_faults:
                self._refuse_overlap(scen, scripted, index, spec, target, name, onset)
            scripted.append((index, self._add_fault(spec.type, target, name, onset, duration_s, spec.params)))

        # ground truth
        self.events: list[Event] = []
        lookup = self._fault_of
        self.trackers = {
            "thermal_throttle": EpisodeTracker("thermal_throttle", "gpu", topo.gpus, HOLD_S["thermal_throttle"], lookup, True),
            "power_cap": EpisodeTracker("power_cap", "gpu", topo.gpus, HOLD_S["power_cap"], lookup, True),
            "power_brake": EpisodeTracker("power_brake", "gpu", topo.gpus, HOLD_S["power_brake"], lookup, True),
            "hbm_overheat": EpisodeTracker("hbm_overheat", "gpu", topo.gpus, HOLD_S["hbm_overheat"], lookup),
            "congestion": EpisodeTracker("congestion", "link", topo.links, HOLD_S["congestion"], lookup),
            "job_slowdown": EpisodeTracker("job_slowdown", "job", topo.jobs, HOLD_S["job_slowdown"], lookup),
        }
        self.ticks = 0
        # called with the simulator after every physics step past the warm-up, to read hidden
        # state (analyses of what could be predicted at best; no telemetry depends on them)
        self.probes: list[Callable[[ClusterSimulator], None]] = []
        self._warm_up(warmup_s)

    # ---- public API ------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        """Current simulated time (epoch seconds), the ``ts`` of the last frames."""
        return self.start_time + self.elapsed

    def step(self) -> list[Frame]:
        """Advance one sampling interval; return one frame per entity kind (gpu, link, optic,
        node, rack, job) sampled at the new time."""
        for _ in range(self.substeps):
            # the blocks of the fault clock this step reaches are drawn before it (a draw reads
            # only the schedule): a fault drawn with its onset within the step starts in it, and a
            # board swap the step makes after that onset finds it on the old board and cures it
            self._draw_due_fault_blocks(self.elapsed + self.dt)
            self._physics_step(self.dt)
        self.ticks += 1
        return self.sample()

    def iter_frames(self, duration: float | None = None) -> Iterator[Frame]:
        """Frames of every kind, tick after tick, for ``duration`` simulated seconds (the run's
        duration when None; ``math.inf`` runs until the consumer stops)."""
        for frames in self.iter_ticks(duration):
            yield from frames

    def iter_ticks(self, duration: float | None = None) -> Iterator[list[Frame]]:
        end = self.elapsed + (self.duration if duration is None else duration)
        while self.elapsed + 1e-9 < end:
            yield self.step()

    __iter__ = iter_frames

    def record(self, out_dir: str | Path, duration: float | None = None,
               progress: Callable[[float, float], None] | None = None,
               meta: dict[str, Any] | None = None,
               through: Callable[[list[Frame]], list[Frame]] | None = None,
               stop: threading.Event | None = None) -> RunSummary:
        """Run for ``duration`` simulated seconds and write a recording folder (Parquet per kind,
        topology.yaml, events.jsonl with the ground truth, recording.json). ``through`` maps each
        tick's frames before they are written (e.g. through a real source's format and importer).
        ``stop`` set (a signal, ``foreshock simulate``) ends the run after the tick in hand: the
        recording is closed marked cut short, as by a Ctrl-C, and the summary says so."""
        total = self.duration if duration is None else float(duration)
        t0 = time.perf_counter()
        frames = rows = 0
        meta_all = {
            "source": "simulator", "interval": self.interval, "duration": total, "seed": self.seed,
            "scenario": self.scenario.name,
            "gpus": len(self.topology.gpus), "physics_dt": self.dt, "random_faults": self.random_faults,
            "fault_acceleration": self.fault_acceleration, "start_time": self.start_time,
            **({"start_hour": self.start_hour} if self.start_hour is not None else {}), **(meta or {}),
        }
        writer = RecordingWriter(out_dir, self.topology, meta_all)
        end = self.elapsed + total  # (as iter_ticks)
        finished = False
        written = self.now  # the time of the last tick whose frames were all written (none yet: the start)
        try:
            for tick in self.iter_ticks(total):
                out = through(tick) if through is not None else tick
                # a tick's frames written as one: a Ctrl-C between two of its kinds left the tick with
                # gpu rows and no link or optic rows; it is raised once the tick is whole
                with deferred_signals():
                    for frame in out:
                        writer.write(frame)
                        frames += 1
                        rows += len(frame)
                    written = self.now
                if progress is not None:
                    progress(self.elapsed, total)
                if stop is not None and stop.is_set():
                    break
            finished = self.elapsed + 1e-9 >= end
        finally:
            if not finished:
                # Ctrl-C or an error: what was simulated is kept, marked as a recording cut short
                # (``Recording.interrupted``; readers warn), "duration" says what was asked
                writer.mark_interrupted()
            self.events += self._close_cleared_episodes()
            started = [f for f in self.faults if f.started]
            truth = self.events
            if not finished:
                # the truth the recording's ticks cover: the physics steps of the interval in hand,
                # stopped before its frames were written, had logged events after the last frame
                # (events are stamped at physics steps: within half a step of the tick is at it)
                cut = written + self.dt / 2
                truth = [e for e in self.events if e.time <= cut]
                started = [f for f in started if self.start_time + f.onset <= cut]  # (its fault_onset's time)
            writer.meta["faults"] = [f.describe() for f in started]
            writer.add_events(truth)
            writer.close()
        return RunSummary(len(self.topology.gpus), self.elapsed, time.perf_counter() - t0,
                          len(started), len(truth), frames, rows, interrupted=not finished)

    def _close_cleared_episodes(self) -> list[Event]:
        """The end of the run ends the episodes whose condition had cleared, less than their hold
        before, at the time it cleared: left open, they read as lasting for good. (An episode
        still on at the end stays open, as it is.) Its tracker forgets them: if stepped on, the
        simulator starts a new episode where the condition comes back."""
        events: list[Event] = []
        for tracker in self.trackers.values():
            events += tracker.close_gaps()
        return events

    def sample(self) -> list[Frame]:
        """Telemetry at the current time, one frame per kind (does not advance time)."""
        ts = self.now
        tel = self.telemetry
        opt = self.optics
        link_up = opt.link_up
        cooling = self.cooling
        job_step = np.where(self.workload.active, self.workload.step_time, np.nan)
        return [
            tel.frame("gpu", ts, tel.gpu_columns(self.gpu)),
            tel.frame("link", ts, self.fabric.readings(link_up)),
            tel.frame("optic", ts, opt.module_readings(self.fabric.util)),
            tel.frame("node", ts, {"fan_speed": np.round(cooling.fan_speed, 3),
                                   "psu_power": np.round(cooling.psu_power, 1)}),
            tel.frame("rack", ts, {"inlet_temp": np.round(cooling.rack_inlet, 1),
                                   "coolant_temp": np.round(cooling.coolant[cooling.rack_loop], 1),
                                   "coolant_flow": np.round(cooling.rack_flow_lps, 3),
                                   "pdu_power": np.round(cooling.rack_power, 0)}),
            tel.frame("job", ts, {"step_time": np.round(job_step, 4)}, missing=False),
        ]

    # ---- physics ---------------------------------------------------------------------------------
    def _warm_up(self, seconds: float) -> None:
        """Settle temperatures, loops and counters before time 0; no faults, no ground truth."""
        if seconds <= 0:
            return
        steps = max(1, int(math.ceil(seconds / 5.0)))
        self.elapsed = -seconds
        for _ in range(steps):
            self._physics_step(seconds / steps, truth=False)
        self.elapsed = 0.0

    def _physics_step(self, dt: float, truth: bool = True) -> None:
        self.elapsed += dt
        t = self.now
        self._apply_faults(dt)
        gpu, wl = self.gpu, self.workload
        self._recover_shutdowns()
        gpu.alive = ~(self.fault_dead | self.shutdown)
        wl.held = self.fault_held.copy()
        if self.shutdown.any():
            jobs = self.topology.gpu_job[self.shutdown]
            wl.held[jobs[jobs >= 0]] = True
        speed = np.where(gpu.reasons & facts.THROTTLE_IDLE, 1.0, gpu.compute_clock / self.params.clock_max_hz)
        # the step below runs on the fabric state of the previous physics step: so does its attribution
        job_fabric_cause = self._job_fabric_cause
        was_running = wl.running.copy()
        wl.step(dt, speed, self.fabric.job_comm_slowdown)
        if truth:
            self._job_churn_events(t, was_running)
        gpu.util = np.where(wl.gpu_running, 1.0, 0.0)
        inlet = self.cooling.rack_inlet[self.gpu_rack]
        # the warm-up (no truth) settles a fault-free cluster far from every limiter in 5-s steps:
        # exact there, so it is not sub-stepped (cheaper, and every seed starts where it used to)
        gpu.step(dt, inlet, wl.gpu_compute_frac, wl.gpu_compute_activity, wl.gpu_other_activity, wl.gpu_running,
                 self.brake[self.gpu_node], self.r_factor, self.hbm_r_factor, max_dt=None if truth else math.inf)
        self._thermal_shutdowns(t, truth)
        self.cooling.step(dt, t, gpu.power, np.where(gpu.alive, gpu.temp, -np.inf))
        went_down, came_up = self.optics.step(dt, t)
        self.fabric.step(dt, wl.active, wl.comm_load, wl.comm_time_frac, gpu.alive, self.optics.link_up)
        self.fabric.add_optic_errors(self.optics.new_downs, self.optics.new_recoveries, self.optics.new_symbol_errors)
        self._job_fabric_cause = self._fabric_causes()
        n_replays = int(self._rng_misc.binomial(len(gpu.pcie_replays), min(2e-5 * dt, 1.0)))
        if n_replays:
            np.add.at(gpu.pcie_replays, self._rng_misc.integers(0, len(gpu.pcie_replays), n_replays), 1.0)
        if truth:
            self._hbm_errors(dt)
            self._truth(t, went_down, came_up, job_fabric_cause)
            for probe in self.probes:
                probe(self)

    def _job_churn_events(self, t: float, was_running: np.ndarray) -> None:
        """``job_end`` / ``job_start`` (job, no fault) where the schedule ended a job or started
        the next one on its nodes in this step: the job's GPUs go idle, or load again, for a
        reason no detector can see coming (a claim about their load cannot then be judged)."""
        flipped = np.flatnonzero(was_running != self.workload.running)
        for j in flipped:
            started = bool(self.workload.running[j])
            self.events.append(Event(t, "job_start" if started else "job_end", "job", self.topology.jobs[int(j)],
                                     "", "", {} if started else {"reason": "completed"}))

    def _thermal_shutdowns(self, t: float, truth: bool) -> None:
        """A die at the shutdown temperature (92 °C) powers off; its job stops. Leakage rises with
        temperature, so a hot enough inlet or a bad enough thermal interface runs away: this is
        the driver's last line of defence."""
        gpu = self.gpu
        hot = gpu.alive & (gpu.temp >= self.params.shutdown_c)
        if not hot.any():
            return
        for g in np.flatnonzero(hot):
            cause = int(self.gpu_cause[g])
            self.shutdown[g] = True
            self.shutdown_since[g] = self.elapsed
            self.shutdown_cause[g] = cause
            self.shutdown_origin[g] = cause
            self.shutdown_kept[g] = False
            self.shutdown_power[g] = gpu.power[g]
            gpu.xid_last[g] = 79
            if truth:
                fid, ftype = self._fault_of(cause)
                self.events.append(Event(t, "xid", "gpu", self.topology.gpus[g], fid, ftype,
                                         {"code": 79, "reason": "thermal shutdown"}))
        gpu.alive &= ~hot
        gpu.power[hot] = 0.0
        gpu.clock[hot] = 0.0
        gpu.reasons[hot] = 0  # powered off: no limiter holds it (ground truth saw its last throttle bits)

    def _recover_shutdowns(self) -> None:
        """A shut-down GPU comes back once it has cooled, the fault that shut it down is repaired,
        nothing keeps it over its limits now (:meth:`_kept_over_limits`, asked again at every
        step) and the node rebooted (``REBOOT_S``). While it is kept over after that repair, the
        fault then naming the GPU names its stop; that fault need not be repaired for it to come
        back: at the repair of a cooling loss the coolant is still hot, and a TIM degradation that
        never ends took the stop for good (the GPU never rebooted once the coolant had settled and
        it headed for 55 °C). One kept over waits for its loop's coolant to settle too
        (``SETTLED_C``): booted at full power with that fault on it into coolant still hot, it ran
        past 92 °C again within seconds (at 38 °C inlet under a TIM at ×2.6)."""
        if not self.shutdown.any():
            return
        down = np.flatnonzero(self.shutdown)
        kept_over = self._kept_over_limits(down)
        unsettled = (self.cooling.coolant - self.cooling.target(self.now) >= SETTLED_C)[self.gpu_loop[down]]
        for g, over, hot_loop in zip(down, kept_over, unsettled):
            origin = int(self.shutdown_origin[g])
            repaired = origin < 0 or self.faults[origin].ended
            if repaired and over:
                self.shutdown_kept[g] = True
                if self.gpu_cause[g] >= 0:
                    # the active fault that keeps it down names what follows (its job held), not
                    # the repaired one: the attribution's own order (an active fault over an aftermath)
                    self.shutdown_cause[g] = self.gpu_cause[g]
            elif (repaired and self.gpu.temp[g] < 45.0 and self.elapsed - self.shutdown_since[g] >= REBOOT_S
                  and not (self.shutdown_kept[g] and hot_loop)):
                self.shutdown[g] = False

    def _kept_over_limits(self, gpus: np.ndarray) -> np.ndarray:
        """Whether each of the shut-down ``gpus``, powered on now, would run away past the
        shutdown temperature again: the die heads for ``inlet + R·P`` (R raised by the active
        faults, e.g. a TIM degradation still there when the cooling loss that shut it down was
        repaired) and the least it draws running hot is what it drew as it went over. Rebooted
        anyway, it shut down again within seconds, and the ground truth showed a recovery
        between two shutdowns."""
        inlet = self.cooling.rack_inlet[self.gpu_rack[gpus]]
        heads_for = inlet + self.gpu.r_core[gpus] * self.r_factor[gpus] * self.shutdown_power[gpus]
        return np.asarray(heads_for >= self.params.shutdown_c)

    def _truth(self, t: float, went_down: np.ndarray, came_up: np.ndarray, job_fabric_cause: np.ndarray) -> None:
        gpu, ev = self.gpu, self.events
        tr = self.trackers
        bits = gpu.reasons
        ev += tr["thermal_throttle"].update(t, gpu.thermal_throttled, self.gpu_cause, bits)
        ev += tr["power_cap"].update(t, gpu.power_capped, self.gpu_cause, bits)
        brake_cause = self.brake_cause[self.gpu_node]  # (only a braking PSU sets the bit)
        ev += tr["power_brake"].update(t, gpu.power_braked, np.where(brake_cause >= 0, brake_cause, self.gpu_cause),
                                       bits)
        hbm_hot = gpu.alive & (gpu.hbm_temp >= self.params.hbm_max_operating_c - HBM_AT_LIMIT_MARGIN_C)
        ev += tr["hbm_overheat"].update(t, hbm_hot, self.gpu_cause)
        src = self.fabric.reroute_source
        cong_cause = np.where(src >= 0, self.link_cause[np.maximum(src, 0)], self.link_cause)
        ev += tr["congestion"].update(t, self.fabric.congested, cong_cause)
        wl = self.workload
        stopped = wl.running & wl.held
        slow = stopped | (wl.active & (wl.step_time > self.params.slowdown_ratio * wl.nominal_step))
        job_causes = self._job_causes(slow, job_fabric_cause)
        # a job stopped inside its slowdown episode (a member throttling, then its board pulled)
        # starts no episode: its own interruption marker tells that its GPUs went idle
        stopped_inside = stopped & ~self._job_stopped & tr["job_slowdown"].active
        self._job_stopped = stopped
        ev += tr["job_slowdown"].update(t, slow, job_causes, detail=self._job_detail)
        for j in np.flatnonzero(stopped_inside):
            fid, ftype = self._fault_of(int(job_causes[j]))
            ev.append(Event(t, "job_slowdown_start", "job", self.topology.jobs[int(j)], fid, ftype,
                            {"reason": "interrupted", "continues": True}))
        names = self.topology.links
        for link in went_down:
            fid, ftype = self._fault_of(int(self.link_cause[link]))
            ev.append(Event(t, "link_down", "link", names[link], fid, ftype,
                            {"flaps": int(self.optics.flaps[link]), "disabled": bool(self.optics.disabled[link])}))
        for link in came_up:
            fid, ftype = self._fault_of(int(self.link_cause[link]))
            ev.append(Event(t, "link_up", "link", names[link], fid, ftype, {"flaps": int(self.optics.flaps[link])}))

    def _fabric_causes(self) -> np.ndarray:
        """Per job, the fault behind an over-subscribed NIC link on its path (the down link whose
        traffic the link carries, else the link's own fault); -1 where none."""
        causes = np.full(len(self._job_fabric_cause), -1, dtype=np.int64)
        fab = self.fabric
        hot = fab.gpu_links[fab.rho[fab.gpu_links] > 1.0]
        if len(hot) and len(causes):
            src = fab.reroute_source[hot]
            cause = np.where(src >= 0, self.link_cause[np.maximum(src, 0)], -1)
            cause = np.where(cause >= 0, cause, self.link_cause[hot])
            jobs = self.topology.gpu_job[self.topology.link_gpu[hot]]
            np.maximum.at(causes, jobs[jobs >= 0], cause[jobs >= 0])
        return causes

    def _job_causes(self, slow: np.ndarray, fabric_cause: np.ndarray) -> np.ndarray:
        causes = self.job_cause.copy()
        if self.shutdown.any():
            down = np.flatnonzero(self.shutdown)
            jobs = self.topology.gpu_job[down]
            causes[jobs[jobs >= 0]] = self.shutdown_cause[down[jobs >= 0]]
        starting = slow & ~self.trackers["job_slowdown"].active
        for j in np.flatnonzero(starting & (causes < 0)):
            members = self.job_gpus[j]
            slowest = members[np.argmin(np.where(self.gpu.alive[members], self.gpu.compute_clock[members], np.inf))]
            c = int(self.gpu_cause[slowest])
            causes[j] = c if c >= 0 else int(fabric_cause[j])
        return causes

    def _job_detail(self, j: int) -> dict[str, Any]:
        wl = self.workload
        if wl.held[j]:
            return {"reason": "interrupted"}
        return {"slowdown": round(float(wl.step_time[j] / wl.nominal_step[j]), 3),
                "comm_slowdown": round(float(wl.comm_slowdown[j]), 3)}

    # ---- faults ----------------------------------------------------------------------------------
    def _fault_of(self, index: int) -> tuple[str, str]:
        if index < 0:
            return "", ""
        f = self.faults[index]
        return f.id, f.type

    def _add_fault(self, ftype: str, target: int, name: str, onset: float, duration: float | None,
                   params: dict[str, float]) -> Fault:
        fault = Fault(f"f{len(self.faults) + 1}", ftype, target, name, onset, duration, dict(params))
        self.faults.append(fault)
        return fault

    def _yield_floors(self, scen: Scenario, scripted: list[tuple[int, Fault]], ftype: str, target: int,
                      onset: float) -> None:
        """An earlier scripted fault of ``ftype`` on ``target`` lengthened by its ``min_duration`` past
        ``onset`` ends there instead, no earlier than its share of the run: in a short run of a small
        cluster ``mixed``'s two cooling losses fall on its one loop, and the first, held to its half
        hour, would still be on when the second begins (refused as overlapping)."""
        for i, f in scripted:
            spec = scen.faults[i]
            if f.type != ftype or f.target != target or spec.min_duration is None or f.duration is None \
                    or spec.duration is None:
                continue
            share = resolve_time(spec.duration, self.duration)
            if f.onset + share <= onset < f.onset + f.duration:
                f.duration = onset - f.onset

    def _refuse_overlap(self, scen: Scenario, scripted: list[tuple[int, Fault]], index: int, spec: FaultSpec,
                        target: int, name: str, onset: float) -> None:
        """``ValueError`` (a usage error) naming both faults where scenario fault ``index`` starts on
        a target while an earlier one of its type is still on there (:meth:`_on_at`; one with no
        duration is on for good, unless a board swap cured it): two XID 79s on one GPU wrote a
        second onset and XID event the telemetry cannot show. The random draw drops such faults.
        Asked by ``refuse_overlapping_faults`` (``foreshock simulate``): the engine itself still runs
        them by the board-swap rule (nested XID 79s, overlapping swaps), which tests stress."""
        for i, f in scripted:
            if f.type == spec.type and f.target == target and self._on_at(f, onset):
                auto = " (picked by target: auto)" if scen.faults[i].target is None or spec.target is None else ""
                end = "never repaired" if f.duration is None else f"until {f.onset + f.duration:g} s"
                raise ValueError(
                    f"scenario {scen.name!r}: faults[{index}] ({spec.type} on {name}, onset {onset:g} s) overlaps "
                    f"faults[{i}] ({f.type} on {f.target_name}{auto}, onset {f.onset:g} s, {end}): "
                    f"a fault of one type cannot start again on a target where it is still on")

    def _resolve_target(self, kind: str, target: str | int | None) -> tuple[int, str]:
        """Slot and name of a scenario fault's target; ``ValueError`` (a usage error) naming the
        target and the cluster's size where the cluster has no such entity."""
        topo = self.topology
        if target is None:
            return self._auto_target(kind)
        if isinstance(target, bool) or not isinstance(target, (str, int)):  # (YAML's true is no slot 1)
            raise ValueError(f"fault target {target!r}: expected 'auto', an entity name or a slot number")
        if kind == "loop":
            loops = topo.loops
            if isinstance(target, int):
                if not 0 <= target < len(loops):
                    raise ValueError(f"no cooling loop {target} {self._cluster_has('loop')}")
                return target, loops[target]
            if target in loops:
                return loops.index(target), target
            if target in topo.rows:
                loop = topo.row_loop[topo.rows.index(target)]
                return loops.index(loop), loop
            raise ValueError(f"unknown cooling loop or row {target!r} {self._cluster_has('loop')}")
        if isinstance(target, int):
            if not 0 <= target < topo.size(kind):
                raise ValueError(f"no {kind} slot {target} {self._cluster_has(kind)}")
            return target, topo.name(kind, target)
        if kind == "optic" and "#" not in target:
            target = f"{target}#a"
        try:
            return topo.slot(kind, target), target
        except KeyError:
            raise ValueError(f"no {kind} {target!r} {self._cluster_has(kind)}") from None

    def _cluster_has(self, kind: str) -> str:
        """What the cluster has of ``kind``, for an error about a target it lacks."""
        topo = self.topology
        if kind == "loop":
            count, listed = f"{len(topo.loops)} cooling loops", ", ".join(topo.loops)
        else:
            count, listed = f"{topo.size(kind)} {kind}s", f"{topo.name(kind, 0)} .. {topo.name(kind, topo.size(kind) - 1)}"
        return f"in this cluster of {len(topo.gpus)} GPUs ({count}: {listed})"

    def _auto_target(self, kind: str) -> tuple[int, str]:
        """A seeded pick among entities carrying a running job, in a loop no earlier fault used."""
        topo, rng = self.topology, self._rng_targets
        candidates = np.flatnonzero(topo.gpu_job >= 0)
        if len(candidates) == 0:
            candidates = np.arange(len(topo.gpus))
        fresh = candidates[~np.isin(self.gpu_loop[candidates], list(self._used_loops))]
        if len(fresh):
            candidates = fresh
        g = int(rng.choice(candidates))
        self._used_loops.add(int(self.gpu_loop[g]))
        if kind == "loop":
            loop = int(self.gpu_loop[g])
            return loop, topo.loops[loop]
        if kind == "gpu":
            return g, topo.gpus[g]
        if kind == "node":
            node = int(topo.gpu_node[g])
            return node, topo.nodes[node]
        if kind == "optic":
            link = int(self.fabric.gpu_link[g])
            optic = 2 * link + int(rng.integers(2))
            return optic, topo.name("optic", optic)
        raise ValueError(f"cannot pick a target of kind {kind!r}")

    def _draw_due_fault_blocks(self, reach: float) -> None:
        """Draw each block of the fault clock whose start the coming physics step, ending at
        ``reach`` (elapsed seconds), reaches, before that step: the 10-s sampling drew the coming
        10 s after each of its intervals, before the steps that run into them. Where the steps
        land on every whole second (the default 1-s step at a whole-second interval, sub-second
        intervals that divide 1 s) a block's onsets all lie at or past the step's end; elsewhere
        (2.5 s: 5/6-s steps; a physics step over 1 s) an onset within the step starts in it, as a
        scripted one does, and a board swap due in the step after that onset cures it (drawn
        after the step, it had started after the swap, on the new board, for good). Without
        random faults the clock runs on and draws nothing: turned on mid-run, they start from
        then."""
        while self._fault_clock <= reach + FAULT_CLOCK_SLACK_S:
            if self.random_faults:
                self._draw_random_faults(self._fault_clock)
            self._fault_clock += FAULT_DRAW_BLOCK_S

    def _draw_random_faults(self, block_start: float) -> None:
        """The random faults of the fault-clock block starting at ``block_start``; one of a type
        already on its target at the block's start is dropped (before its parameters are drawn)."""
        rng, topo = self._rng_faults, self.topology
        n_new = int(rng.poisson(self.fault_rate * FAULT_DRAW_BLOCK_S))
        types = list(RANDOM_FAULT_MIX)
        weights = np.array([RANDOM_FAULT_MIX[k] for k in types])
        for _ in range(n_new):
            ftype = types[int(rng.choice(len(types), p=weights / weights.sum()))]
            kind = FAULT_TYPES[ftype]
            size = len(topo.loops) if kind == "loop" else topo.size(kind)
            target = int(rng.integers(size))
            name = topo.loops[target] if kind == "loop" else topo.name(kind, target)
            if any(f.type == ftype and f.target == target and self._on_at(f, block_start) for f in self.faults):
                continue
            params, duration = draw_random_params(ftype, rng)
            onset = block_start + float(rng.uniform(0.0, FAULT_DRAW_BLOCK_S))
            self._add_fault(ftype, target, name, onset, duration, params)

    def _on_at(self, f: Fault, t: float) -> bool:
        """Whether fault ``f`` is on, or still to come, at time ``t``, read from its schedule: it
        ends at its onset plus duration, or at the board swap that cures it (:meth:`_cure_time`),
        whichever physics step the block is drawn at (a step of 5/6 s reaches 2 s at 2.5 s, where
        a fault due to end at 2.2 s has ended; 0.2-s steps reach 20 s at 19.99999999999996, a step
        before a swap due at 20 s, which cures there what it cures at 20 s all the same)."""
        cured = self._cure_time(f)
        if cured is not None:
            return cured > t
        return f.duration is None or f.onset + f.duration > t

    def _cure_time(self, f: Fault) -> float | None:
        """When a board swap ends fault ``f``, read from the schedule whatever the physics step
        (:meth:`_board_cures`). None where no swap cures it."""
        cured = self._cured_at.get(f.id)
        if cured is not None or f.kind != "gpu" or f.type not in CURED_BY_NEW_BOARD:
            return cured
        return self._board_cures(f.target).get(f.id)

    def _board_cures(self, g: int) -> dict[str, float]:
        """The faults of GPU ``g``'s boards that a board swap ends, and when, read from the
        schedule: the swaps (faults whose repair swaps boards, :meth:`_swaps_board`) in the order
        of their scheduled ends (a tie in the order of the faults), each swapping at its end
        unless a swap before cured it (an XID 79 of the old board: the new board is already in);
        each cures the faults of the board itself (``CURED_BY_NEW_BOARD``) not cured yet that are
        on at its time, begun strictly before it and ending after it. One begun at the swap's time,
        or after, even within the same step, is the new board's (a scripted fault at a return is
        the replacement arriving bad), as ``Fault.active_at`` has the swapping fault over then.
        One pass over the slot's faults (following each swap back through the swaps that might
        cure it had taken 2^n calls for n nested XID 79s); the swaps already made are read back
        from ``_cured_at``, as their cured faults' durations now end at them."""
        faults = [f for f in self.faults if f.kind == "gpu" and f.target == g]
        cures = {f.id: self._cured_at[f.id] for f in faults if f.id in self._cured_at}
        swaps = sorted((f.onset + f.duration, i) for i, f in enumerate(faults)
                       if self._swaps_board(f) and f.duration is not None)
        for swap_time, i in swaps:
            swapping = faults[i]
            if swapping.id in cures:
                continue
            for other in faults:
                end = math.inf if other.duration is None else other.onset + other.duration
                if (other is not swapping and other.type in CURED_BY_NEW_BOARD and other.id not in cures
                        and other.onset < swap_time < end):
                    cures[other.id] = swap_time
        return cures

    def _reset_fault_inputs(self) -> None:
        p = self.params
        self.cooling.flow[:] = 1.0
        self.cooling.fan_health[:] = 1.0
        self.r_factor[:] = 1.0
        self.hbm_r_factor[:] = 1.0
        self.brake[:] = False
        self.brake_cause[:] = -1
        self.gpu.power_limit[:] = p.power_limit_w
        self.fault_dead[:] = False
        self.optics.degradation_db[:] = 0.0
        self.fault_held[:] = False
        self.gpu_cause[:] = -1
        self._cause_weight[:] = -np.inf
        self._aftermath_weight[:] = -np.inf
        self.link_cause[:] = -1
        self.job_cause[:] = -1

    def _apply_faults(self, dt: float) -> None:
        if not self.faults and not self._fault_inputs_dirty:
            return
        self._reset_fault_inputs()
        self._fault_inputs_dirty = False
        # boards swapped in at this step, first: the faults of the old boards end before any of
        # them sets its effect on the new one; in the order of their times, as the schedule has
        # them (an XID 79 a swap cured in this step swaps no board of its own)
        due = sorted((f.onset + f.duration, i) for i, f in enumerate(self.faults)
                     if self._swaps_board(f) and not f.ended and f.duration is not None
                     and self.elapsed >= f.onset + f.duration)
        for swap_time, i in due:
            if not self.faults[i].ended:
                self._replace_board(self.faults[i], swap_time)
        active: list[int] = []
        for i, f in enumerate(self.faults):
            if not f.started and self.elapsed >= f.onset:
                f.started = True
                self._on_fault_start(i, f)
            if not f.started:
                continue
            if not f.ended and not f.active_at(self.elapsed):
                f.ended = True
                self._on_fault_end(f)
            if not f.ended:
                active.append(i)
            elif f.duration is not None and self.elapsed < f.onset + f.duration + AFTERMATH_S:
                self._fault_inputs_dirty = True
                self._attribute(i, f)
        # the active faults after every aftermath: a fault acting on an entity now names what
        # happens to it, not one repaired before (a TIM-driven shutdown blamed on a repaired
        # cooling loss was "repaired" and rebooted into the next shutdown). In the order of their
        # onsets, so that of two acting as much on a GPU the later names it (:meth:`_name_gpus`)
        active.sort(key=lambda i: self.faults[i].onset)
        for i in active:
            self._fault_inputs_dirty = True
            self._apply_active(i, self.faults[i])

    def _apply_active(self, i: int, f: Fault) -> None:
        """What active fault ``f`` (index ``i``) does to the hidden inputs now, and the entities it
        names as their cause (for GPUs, where it acts on them most: :meth:`_name_gpus`)."""
        topo, p = self.topology, self.params
        el = self.elapsed - f.onset
        if f.type == "cooling_loss":
            ramp = min(1.0, el / max(f.p("ramp_s"), 1e-9))
            loop = f.target
            flow = 1.0 - (1.0 - f.p("flow_fraction")) * ramp
            self.cooling.flow[loop] = min(self.cooling.flow[loop], flow)
            # the coolant's rise at design load (CoolingModel.target): every die's and HBM's too
            rise = p.loop_rise_c * (1.0 / max(flow, 0.02) - 1.0)
            self._name_gpus(np.flatnonzero(self.gpu_loop == loop), i, rise)
        elif f.type == "tim_degradation":
            factor = min(1.0 + f.p("r_per_hour") * el / 3600.0, f.p("max_factor"))
            self.r_factor[f.target] *= factor
            self._name_gpus(np.array([f.target]), i, (factor - 1.0) * p.r_core_c_per_w * p.power_limit_w)
        elif f.type == "fan_failure":
            gpus = np.flatnonzero(self.gpu_node == f.target)
            self.cooling.fan_health[f.target] = min(self.cooling.fan_health[f.target], 1.0 - f.p("fans_failed"))
            increase = f.p("r_increase") * min(1.0, el / max(f.p("ramp_s"), 1e-9))
            self.r_factor[gpus] *= 1.0 + increase
            self._name_gpus(gpus, i, increase * p.r_core_c_per_w * p.power_limit_w)
        elif f.type == "psu_failure":
            gpus = np.flatnonzero(self.gpu_node == f.target)
            if el < f.p("brake_s"):
                self.brake[f.target] = True
                self.brake_cause[f.target] = i
                # the brake cuts the clocks at least 2x: most of the power at the limit goes
                deficit = p.power_limit_w * (1.0 - p.power_brake_factor)
            else:
                self.gpu.power_limit[gpus] = np.minimum(self.gpu.power_limit[gpus], f.p("derated_limit_w"))
                deficit = max(p.power_limit_w - f.p("derated_limit_w"), 0.0)
            self._name_gpus(gpus, i, deficit * p.r_core_c_per_w)
        elif f.type == "optic_degradation":
            self.optics.degradation_db[f.target] += f.p("initial_db") + f.p("db_per_hour") * el / 3600.0
            self.link_cause[f.target // 2] = i
        elif f.type == "hbm_overheat":
            factor = min(1.0 + f.p("r_per_hour") * el / 3600.0, f.p("max_factor"))
            self.hbm_r_factor[f.target] *= factor
            self._name_gpus(np.array([f.target]), i, (factor - 1.0) * p.r_hbm_c_per_w * p.power_limit_w)
        elif f.type in ("xid79", "gpu_replacement"):  # out of service: reports nothing, its job stops
            self.fault_dead[f.target] = True
            self._name_gpus(np.array([f.target]), i, math.inf)  # off the bus: nothing else shows
            job = int(topo.gpu_job[f.target])
            if job >= 0:
                self.fault_held[job] = True
                self.job_cause[job] = i

    def _name_gpus(self, gpus: np.ndarray, i: int, weight: float) -> None:
        """Active fault ``i`` names ``gpus`` as its doing where it weighs at least as much as the
        active fault named before (faults come in the order of their onsets: on a tie the later
        one names them). ``weight`` is how far the fault, as it is now, raises the steady
        temperature (inlet + R·P) of a GPU at the power limit, with nominal resistances: the
        coolant's rise for a cooling loss, ΔR·P for a fan or TIM (the die), for an HBM fault
        (the HBM); a PSU's cut of the power limit counts as the die cooling that cut is worth
        (R·ΔP), a brake as most of the power gone. So the fault that drives a GPU's throttling
        names it, not the last one in the fault list (a 1 % flow loss on the loop took a failed
        fan's throttles; a random fault, listed after the scenario's, took those of a later
        scenario fault)."""
        take = weight >= self._cause_weight[gpus]
        self.gpu_cause[gpus[take]] = i
        self._cause_weight[gpus[take]] = weight

    def _swaps_board(self, f: Fault) -> bool:
        """Whether ``f``'s repair puts another board in the GPU's slot."""
        return f.type == "gpu_replacement" or (f.type == "xid79" and self.params.xid79_new_board)

    def _replace_board(self, f: Fault, swap_time: float) -> None:
        """The repair of ``f`` swaps GPU ``f.target``'s board at ``swap_time`` (its scheduled end;
        the physics at the first step reaching it): a new UUID (``board_id``), the new board's
        constants from its own random stream, and the old board's faults (its thermal interface,
        its HBM, its bus) on at ``swap_time`` repaired there (:meth:`_board_cures`), one that began
        within this step before the swap too. Ground truth: ``gpu_replaced`` at ``swap_time``,
        with both UUIDs and board numbers and how the new board's resistances compare with the
        old one's."""
        g, gpu = f.target, self.gpu
        # the slot's faults due within this step before the swap are the old board's: they start
        # on it, before it goes (started after the swap, an XID 79 there left the new board
        # reporting xid_last 79 to the end)
        for i, other in enumerate(self.faults):
            if (not other.started and other.kind == "gpu" and other.target == g
                    and (other.onset < swap_time or other is f)):
                other.started = True
                self._on_fault_start(i, other)
        self.board_number[g] += 1
        number = int(self.board_number[g])
        old_uuid, new_uuid = self.gpu_uuids[g], gpu_uuid(self.topology.gpus[g], number)
        old_board, old_r_core, old_r_hbm = gpu.board_id[g], gpu.r_core[g], gpu.r_hbm[g]
        gpu.replace_board(g, np.random.default_rng([self.seed, BOARD_STREAM, g, number]))
        self.gpu_uuids[g] = new_uuid
        gpu.board_id[g] = board_id(new_uuid)
        cured = []
        cures = self._board_cures(g)
        for other in self.faults:
            if other.kind != "gpu" or other.target != g or other.ended or cures.get(other.id) != swap_time:
                continue
            other.duration = swap_time - other.onset  # repaired by the swap: its aftermath follows
            other.ended = True
            self._cured_at[other.id] = swap_time
            cured.append(other.id)
        self.events.append(Event(self.start_time + swap_time, "gpu_replaced", "gpu", f.target_name, f.id, f.type, {
            "old_uuid": old_uuid, "new_uuid": new_uuid,
            "old_board_id": int(old_board), "new_board_id": int(gpu.board_id[g]), "board_number": number,
            "r_core_ratio": round(float(gpu.r_core[g] / old_r_core), 6),
            "r_hbm_ratio": round(float(gpu.r_hbm[g] / old_r_hbm), 6),
            "faults_cured": cured,
        }))

    def _on_fault_end(self, f: Fault) -> None:
        """Repair: a replaced optic lets its link train again."""
        if f.kind == "optic":
            link = f.target // 2
            self.optics.disabled[link] = False
            self.optics.flaps[link] = 0

    def _attribute(self, i: int, f: Fault) -> None:
        """After repair, what the fault left behind is still its doing (set before the active
        faults, which override it where they act). Of two aftermaths on a GPU the one that left
        more behind names it, weighed as :meth:`_name_gpus` weighs active faults: a loop's
        coolant still above where it settles at full flow, by that much on every die (in the
        fault list's order a PSU repaired 331 s earlier took the power caps the still-hot coolant
        of its rack's loop drove); a GPU's own repaired fault (its board swapped, back on the bus,
        its resistance restored) by nothing, so still-hot coolant comes first. A node's PSU or fans
        leave nothing: the repair lifts the brake and the derated limit, or restores the
        resistance, at once, and the die follows within ``tau_core_s`` (10 s), so a consequence
        starting after it is not theirs."""
        if f.type == "cooling_loss":
            # the flows are at their nominal here (:meth:`_reset_fault_inputs`, before the active
            # faults set theirs): the target is where the coolant settles once repaired
            cool = self.cooling
            excess = float(cool.coolant[f.target] - cool.target(self.now)[f.target])
            self._name_aftermath(np.flatnonzero(self.gpu_loop == f.target), i, max(excess, 0.0))
        elif f.kind == "gpu":
            self._name_aftermath(np.array([f.target]), i, 0.0)
        elif f.kind == "optic":
            self.link_cause[f.target // 2] = i

    def _name_aftermath(self, gpus: np.ndarray, i: int, weight: float) -> None:
        """Repaired fault ``i`` names ``gpus`` where it left at least as much behind as the
        aftermath named before (on a tie the later in the fault list, as before the weighing). A
        weight of its own: any active fault still overrides it (:meth:`_name_gpus`)."""
        take = weight >= self._aftermath_weight[gpus]
        self.gpu_cause[gpus[take]] = i
        self._aftermath_weight[gpus[take]] = weight

    def _on_fault_start(self, index: int, f: Fault) -> None:
        t = self.start_time + f.onset
        detail: dict[str, Any] = {"cause": _CAUSES[f.type], "params": {**DEFAULT_PARAMS[f.type], **f.params},
                                  "duration_s": f.duration}
        topo = self.topology
        if f.type == "cooling_loss":
            racks = [topo.racks[r] for r in np.flatnonzero(topo.rack_loop == f.target)]
            detail["racks"] = racks
        elif f.kind == "optic":
            detail["link"] = topo.links[f.target // 2]
        elif f.kind == "gpu":
            detail["node"] = topo.nodes[int(topo.gpu_node[f.target])]
        self.events.append(Event(t, "fault_onset", f.kind, f.target_name, f.id, f.type, detail))
        if f.type == "xid79":
            self.gpu.xid_last[f.target] = 79
            self.events.append(Event(t, "xid", "gpu", f.target_name, f.id, f.type, {"code": 79}))

    def _hbm_errors(self, dt: float) -> None:
        """An HBM held at its limit long enough (``dbe_after_s`` in all) fails a row: an
        uncorrectable (DBE) error, XID 48, again every ``dbe_every_s`` while it is still there.
        Each one needs the HBM at its limit as it happens: a GPU off the bus, or one whose HBM
        cooled, reports none."""
        for i, f in enumerate(self.faults):
            if f.type != "hbm_overheat" or not f.started or f.ended:
                continue
            g = f.target
            hot = self.gpu.alive[g] and self.gpu.hbm_temp[g] >= self.params.hbm_max_operating_c - HBM_AT_LIMIT_MARGIN_C
            if hot:
                f.hbm_hot_s += dt
            if hot and f.hbm_hot_s >= f.p("dbe_after_s") and self.elapsed >= f.next_dbe_s:
                f.dbe_count += 1
                f.next_dbe_s = self.elapsed + f.p("dbe_every_s")
                self.gpu.ecc_dbe[g] += 1
                self.gpu.remapped_rows[g] += 1
                self.gpu.xid_last[g] = 48
                self.events.append(Event(self.now, "xid", "gpu", self.topology.gpus[g], f.id, f.type,
                                         {"code": 48, "ecc_dbe": int(self.gpu.ecc_dbe[g])}))


_CAUSES = {
    "cooling_loss": "CDU flow loss on the cooling loop: coolant and every rack inlet of the row heat up",
    "tim_degradation": "thermal interface of one GPU degrading: its die-to-coolant resistance rises",
    "fan_failure": "node fans failed: the node's GPUs lose cooling",
    "psu_failure": "node PSU failed: HW power brake, then a derated power limit",
    "optic_degradation": "transceiver degrading: RX power falls toward sensitivity, BER rises",
    "hbm_overheat": "HBM cooling path degrading: HBM temperature rises, then uncorrectable ECC errors",
    "xid79": "GPU fell off the bus (XID 79): its job stops until the node is repaired",
    "gpu_replacement": "GPU board swapped (RMA): out of service, then back on a new board (new UUID, resistance, counters)",
}
