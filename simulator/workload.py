"""Training jobs: synchronous steps of compute then communication, per job.

Each job (a fixed set of nodes from the topology) alternates running periods and gaps (idle
GPUs between jobs, when churn is on). While it runs, a step takes

    step_time = compute_s · max over members (f_max / f_member) + comm_s · comm_slowdown

— the slowest member sets the pace, and communication stretches when a link on the job's
path is over capacity. Faster members finish computing early and wait (low power) for it.

``phase`` is the position inside the current step (0..1); the fraction of each physics step
spent computing vs communicating is integrated exactly, so power and traffic averaged over a
1-second tick follow the step's rhythm.
"""

from __future__ import annotations

import numpy as np

from foreshock.topology import Topology

from .params import SimParams


def _compute_integral(phase: np.ndarray, compute_frac: np.ndarray) -> np.ndarray:
    """Time-in-compute (in steps) from 0 to ``phase`` for a step that computes first."""
    whole = np.floor(phase)
    return whole * compute_frac + np.minimum(phase - whole, compute_frac)


class Workload:
    def __init__(self, topo: Topology, params: SimParams, rng: np.random.Generator) -> None:
        self.params = p = params
        self.rng = rng
        n_jobs = len(topo.jobs)
        self.n_jobs = n_jobs
        self.gpu_job = topo.gpu_job
        self.job_size = np.bincount(self.gpu_job[self.gpu_job >= 0], minlength=n_jobs)
        self.intensity = rng.uniform(*p.job_intensity_range, n_jobs)
        self.compute_s = rng.uniform(*p.compute_s_range, n_jobs)
        comm_frac = rng.uniform(*p.comm_fraction_range, n_jobs)
        self.comm_s = self.compute_s * comm_frac / (1.0 - comm_frac)
        self.comm_load = rng.uniform(*p.comm_load_range, n_jobs)  # NIC load while communicating
        self.nominal_step = self.compute_s + self.comm_s
        self.phase = rng.uniform(0.0, 1.0, n_jobs)
        self.running = np.ones(n_jobs, dtype=bool)
        # time until a running job ends / a stopped one starts (remaining lifetimes, seeded)
        self.timer = rng.exponential(p.job_run_mean_s, n_jobs) if p.job_churn else np.full(n_jobs, np.inf)
        self.held = np.zeros(n_jobs, dtype=bool)  # faults stop a job (crashed rank) while set
        self.step_time = self.nominal_step.copy()
        self.comm_slowdown = np.ones(n_jobs)  # the stretch of communication the last step ran with
        self.steps_done = np.zeros(n_jobs)
        # per-step outputs
        n_gpus = len(self.gpu_job)
        self.gpu_running = np.zeros(n_gpus, dtype=bool)
        self.gpu_compute_frac = np.zeros(n_gpus)
        self.gpu_compute_activity = np.zeros(n_gpus)
        self.gpu_other_activity = np.zeros(n_gpus)
        self.comm_time_frac = np.zeros(n_jobs)  # fraction of the physics step spent communicating

    @property
    def active(self) -> np.ndarray:
        return self.running & ~self.held

    def step(self, dt: float, gpu_speed: np.ndarray, comm_slowdown: np.ndarray) -> None:
        """Advance jobs by ``dt``; ``gpu_speed`` = clock / max clock per GPU, ``comm_slowdown`` >= 1 per job."""
        p = self.params
        if p.job_churn and self.n_jobs:
            self.timer -= dt
            flip = self.timer <= 0
            if flip.any():
                idx = np.flatnonzero(flip)
                starting = ~self.running[idx]
                self.running[idx] = starting
                self.timer[idx] = np.where(
                    starting, self.rng.exponential(p.job_run_mean_s, len(idx)),
                    self.rng.exponential(p.job_gap_mean_s, len(idx)),
                )
                self.phase[idx] = 0.0
        active = self.active
        on_job = self.gpu_job >= 0
        job_of = np.where(on_job, self.gpu_job, 0)
        gpu_active = on_job & active[job_of]
        # slowest member (lowest clock) per job
        speed = np.where(gpu_active, np.clip(gpu_speed, 0.05, 1.0), np.inf)
        slowest = np.full(self.n_jobs, np.inf)
        if self.n_jobs:
            np.minimum.at(slowest, job_of[on_job], speed[on_job])
        slowest = np.where(np.isfinite(slowest), slowest, 1.0)
        compute_time = self.compute_s / slowest
        self.comm_slowdown = np.maximum(comm_slowdown[:self.n_jobs], 1.0)
        comm_time = self.comm_s * self.comm_slowdown
        jitter = 1.0 + p.step_jitter * self.rng.standard_normal(self.n_jobs)
        self.step_time = (compute_time + comm_time) * jitter
        c_job = compute_time / self.step_time
        d_phase = np.where(active, dt / self.step_time, 0.0)
        in_compute = (_compute_integral(self.phase + d_phase, c_job) - _compute_integral(self.phase, c_job))
        comp_frac = np.where(active, in_compute / np.maximum(d_phase, 1e-12), 0.0)
        self.comm_time_frac = np.where(active, np.clip(1.0 - comp_frac, 0.0, 1.0), 0.0)
        self.steps_done += np.floor(self.phase + d_phase) - np.floor(self.phase)
        self.phase = (self.phase + d_phase) % 1.0
        # per GPU: computing for its share of the job's compute window, then waiting for the
        # slowest member, then communicating
        cj = comp_frac[job_of]
        busy = np.where(gpu_active, np.minimum(slowest[job_of] / np.where(gpu_active, speed, 1.0), 1.0), 0.0)
        wait = cj * (1.0 - busy)
        comm = 1.0 - cj
        self.gpu_compute_frac = np.where(gpu_active, cj * busy, 0.0)
        self.gpu_compute_activity = np.where(gpu_active, self.intensity[job_of], 0.0)
        self.gpu_other_activity = np.where(
            gpu_active, (wait * p.wait_activity + comm * p.comm_activity) / np.maximum(wait + comm, 1e-12), 0.0)
        self.gpu_running = gpu_active

    @property
    def slowdown(self) -> np.ndarray:
        """Step time relative to the job's nominal step (NaN while a job is not running)."""
        return np.where(self.active, self.step_time / self.nominal_step, np.nan)
