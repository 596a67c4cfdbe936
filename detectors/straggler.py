"""Peer outliers inside a training job: the GPU that sets the pace of a synchronous job.

In synchronous training the slowest rank sets the step time of every rank. Per GPU the
detector keeps exponentially weighted means of its SM clock (as a fraction of its maximum),
core temperature, utilisation and the share of time a throttle bit (thermal, power cap, power
brake, HW slowdown) was set. Every ``interval_s`` of telemetry time it compares each busy GPU
with the other busy GPUs of its job (median and MAD — robust to the outlier itself):

- **slower**: clock below the job median by more than ``clock_gap`` (and ``k_mad`` MADs);
- **hotter**: temperature above the job median by more than ``temp_gap_c`` at the same load;
- **throttling more**: throttled share above the job median by more than ``throttle_gap``.

Findings are :class:`~foreshock.findings.Anomaly` on the GPU (field ``sm_clock``,
``gpu_temp`` or ``throttle_reasons``), score = the relative deficit or excess, emitted when
the outlier appears and refreshed while it lasts.

Example (job of 16 GPUs; GPU 5 runs 15 % slower)::

    >>> import numpy as np
    >>> from foreshock.topology import Topology
    >>> from foreshock.frames import Frame
    >>> topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
    ...     "nodes": [{"name": "a", "rack": "k"}, {"name": "b", "rack": "k"}],
    ...     "jobs": [{"name": "j", "nodes": ["a", "b"]}]})
    >>> det, found = StragglerDetector(topo), []
    >>> clock = np.full(16, 1.98e9); clock[5] *= 0.85
    >>> for t in np.arange(0.0, 600.0, 10.0):
    ...     found += det.update(Frame("gpu", np.full(16, t), np.arange(16), {
    ...         "sm_clock": clock, "sm_clock_max": np.full(16, 1.98e9), "util": np.ones(16),
    ...         "gpu_temp": np.full(16, 60.0), "throttle_reasons": np.zeros(16)}))
    >>> sorted({(f.slot, f.field) for f in found})
    [(5, 'sm_clock')]
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from foreshock import facts
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .base import Detector, resolve_params
from .cooling import group_median
from .gpu_inputs import reason_bits, Scratch, gpu_obs, kernel

OBS_FIELDS = ("sm_clock", "sm_clock_max", "util", "gpu_temp", "throttle_reasons")
S_TS, S_CLOCK, S_TEMP, S_UTIL, S_THROTTLE, S_N = range(6)
S_SIZE = 6
THROTTLING = (facts.THERMAL_THROTTLE_MASK | facts.THROTTLE_SW_POWER_CAP
              | facts.THROTTLE_HW_POWER_BRAKE)

PARAMS: dict[str, float] = {
    "tau_s": 120.0,
    "interval_s": 60.0,
    "busy_util": 0.5,
    "min_samples": 6.0,
    "clock_gap": 0.05,
    "temp_gap_c": 8.0,
    "throttle_gap": 0.25,
    "k_mad": 4.0,
    "refresh_s": 600.0,
}


@kernel
def _ew_kernel(obs: np.ndarray, s: np.ndarray, tau: float) -> int:
    """Exponentially weighted per-GPU means; returns rows skipped as out of order."""
    skipped = 0
    step, w_step = np.nan, np.nan  # the rows of a frame share their step: one exp per frame
    for row in range(obs.shape[0]):
        ts = obs[row, 0]
        i = int(obs[row, 1])
        last = s[i, S_TS]
        if last == last and ts <= last:
            skipped += 1
            continue
        if last != last:
            w = 1.0
        else:
            if ts - last != step:
                step = ts - last
                w_step = 1.0 - np.exp(-step / tau)
            w = w_step
        s[i, S_TS] = ts
        clock, clock_max, util, temp, reasons = obs[row, 2], obs[row, 3], obs[row, 4], obs[row, 5], obs[row, 6]
        if clock == clock and clock_max == clock_max and clock_max > 0.0:
            x = clock / clock_max
            s[i, S_CLOCK] = x if s[i, S_CLOCK] != s[i, S_CLOCK] else s[i, S_CLOCK] + w * (x - s[i, S_CLOCK])
        if util == util:
            s[i, S_UTIL] = util if s[i, S_UTIL] != s[i, S_UTIL] else s[i, S_UTIL] + w * (util - s[i, S_UTIL])
        if temp == temp:
            s[i, S_TEMP] = temp if s[i, S_TEMP] != s[i, S_TEMP] else s[i, S_TEMP] + w * (temp - s[i, S_TEMP])
        bits = reason_bits(reasons)
        if bits >= 0:
            x = 1.0 if (bits & THROTTLING) != 0 else 0.0
            s[i, S_THROTTLE] = x if s[i, S_THROTTLE] != s[i, S_THROTTLE] else s[i, S_THROTTLE] + w * (x - s[i, S_THROTTLE])
        s[i, S_N] += 1.0
    return skipped


class StragglerDetector(Detector):
    """Flags GPUs slower, hotter or more throttled than their job peers."""

    name: ClassVar[str] = "straggler"
    kinds: ClassVar[tuple[str, ...]] = ("gpu",)
    state_scalars: ClassVar[tuple[str, ...]] = ("next_ts",)

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, **params: Any) -> None:
        super().__init__(topology)
        self.p = resolve_params("straggler", PARAMS, params)
        self.health = health or PipelineHealth()
        n = topology.size("gpu")
        self.gpu_job = topology.gpu_job.astype(np.int64)
        self.s_gpu = np.full((n, S_SIZE), np.nan)
        self.s_gpu[:, S_N] = 0.0
        self.s_flag = np.full((n, 3), np.nan)  # time each outlier kind was last reported
        self.next_ts = -np.inf
        self._scratch = Scratch()

    def update(self, frame: Frame) -> list[Finding]:
        if frame.kind != "gpu" or len(frame) == 0:
            return []
        obs = gpu_obs(frame, OBS_FIELDS, len(self.s_gpu), self.health, self.name, order="F",
                      scratch=self._scratch)
        skipped = _ew_kernel(obs, self.s_gpu, self.p["tau_s"])
        if skipped:
            self.health.problem(self.name, "gpu samples out of time order", skipped)
        if not len(obs):
            return []
        now = float(obs[:, 0].max())
        if now < self.next_ts:
            return []
        self.next_ts = now + self.p["interval_s"]
        return self._compare(now)

    def _compare(self, now: float) -> list[Finding]:
        p = self.p
        s = self.s_gpu
        n_jobs = len(self.topology.jobs)
        if n_jobs == 0:
            return []  # no jobs known (e.g. a topology derived from dcgm labels): no peers to compare
        busy = ((now - s[:, S_TS]) <= 3 * p["interval_s"]) & (s[:, S_UTIL] >= p["busy_util"]) \
            & (s[:, S_N] >= p["min_samples"]) & (self.gpu_job >= 0)
        job = np.where(busy, self.gpu_job, -1)
        findings: list[Finding] = []
        checks = (
            (0, S_CLOCK, -1.0, p["clock_gap"], "sm_clock", "clock"),
            (1, S_TEMP, 1.0, p["temp_gap_c"], "gpu_temp", "temperature"),
            (2, S_THROTTLE, 1.0, p["throttle_gap"], "throttle_reasons", "throttled share"),
        )
        for col, field, sign, gap, name, label in checks:
            x = np.where(busy, s[:, field], np.nan)
            med = group_median(x, job, n_jobs)
            mad = group_median(np.abs(x - med[np.maximum(job, 0)]), job, n_jobs)
            d = med[np.maximum(job, 0)]
            spread = mad[np.maximum(job, 0)]
            if field == S_CLOCK:
                excess = (d - x) / np.where(d > 0, d, np.nan)  # relative deficit
                out = busy & (excess >= gap) & ((d - x) >= p["k_mad"] * spread)
            else:
                excess = sign * (x - d)
                out = busy & (excess >= gap) & (excess >= p["k_mad"] * spread)
            flag = self.s_flag[:, col]
            was = np.isfinite(flag)
            due = out & (~was | (now - np.where(was, flag, now) >= p["refresh_s"]))
            flag[due] = now
            flag[~out] = np.nan
            for g in np.flatnonzero(due):
                j = int(self.gpu_job[g])
                unit = "" if field != S_TEMP else " °C"
                findings.append(Anomaly(
                    now, "gpu", int(g), name, float(excess[g]), self.name,
                    f"{label} {x[g]:.3g}{unit} vs job {self.topology.jobs[j]} median {d[g]:.3g}{unit} "
                    f"({int(np.count_nonzero(job == j))} busy peers)"
                    + (": this GPU sets the job's step time" if field == S_CLOCK else " at the same load")))
        return findings
