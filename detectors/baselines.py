"""Baselines foreshock is compared with, side by side, on the same per-GPU feature stream.

- :class:`ThresholdDetector` (``threshold``) — what today's tools do: alert when a GPU is at or
  above a fixed temperature, power share or already shows the throttle bit (AWS HyperPod's
  80/85 °C, gpud's and NVSentinel's bit checks).
- :class:`HalfSpaceTreesDetector` (``river_hst``) — river's unsupervised ``HalfSpaceTrees`` on
  the per-GPU feature vector, one model for all GPUs (``score_one`` then ``learn_one``), its
  reference window 25 fleet ticks long (``window_ticks``; ``window_size`` sets it in samples); its
  alarm threshold is the 99.9th percentile of the scores it gave over 30 minutes after ten
  minutes of start-up (like NAB's probation period). An
  anomaly does not say which event is coming, so an alarm predicts every scored GPU event.
- :class:`SklearnDetector` (``sklearn``) — a scikit-learn classifier trained offline by
  ``foreshock train`` (:mod:`foreshock.detectors.train`) to say "throttle within H seconds".

The feature stream (:data:`FEATURES`, :func:`feature_kernel`) is shared by all three and by
training, so a model sees at run time exactly the features it was trained on.

Model files are skops archives loaded with an explicit list of trusted types: loading never
runs code from the file. A file holding anything else, a different feature list, another
format version, a classifier for an event that is not a GPU's (:func:`learnable_events`) or
classifiers of another scikit-learn version is refused with :class:`ModelFileError`.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import json
import os
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from foreshock import facts
from foreshock.findings import Finding, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.remap import Remap
from foreshock.topology import Topology

from .alarm import (CODE_NONE, CODE_REFRESH, CODE_WITHDRAW, O_CODE, O_CONF, O_ROW, O_V0, O_WHICH, OUT_SIZE,
                    alarm_step, alarm_withdraw, emit, new_alarm_columns, silent_gpu_withdrawals)
from .base import Detector, add_columns
from .gpu_inputs import (frame_now, gpu_inlet, gpu_obs, kernel, new_inlet_states, rack_inlet_obs, reason_bits,
                         relinked_inlet_states, reported_core_limit, update_rack_inlet, upgrade_rack_state)
from .thermal_fit import PARAMS as THERMAL_FIT_PARAMS
from .thermal_fit import poll_order, repeat_free_runs

# ---- the shared per-GPU feature stream -------------------------------------------------------
OBS_FIELDS = ("gpu_temp", "hbm_temp", "power", "power_limit", "energy", "sm_clock", "sm_clock_max",
              "util", "throttle_reasons", "slowdown_temp", "max_op_temp", "hbm_max_op_temp")
X_TS, X_SLOT, X_TEMP, X_HBM, X_POWER, X_LIMIT, X_ENERGY, X_CLOCK, X_CLOCK_MAX, X_UTIL, X_REASONS, \
    X_SLOWDOWN, X_MAX_OP, X_HBM_MAX_OP = range(14)

FEATURES: tuple[str, ...] = (
    "gpu_temp", "hbm_temp", "power_w", "power_frac", "clock_frac", "util",
    "temp_slope_c_per_min", "hbm_slope_c_per_min", "power_slope_w_per_min",
    "core_margin_c", "hbm_margin_c", "temp_over_inlet_c", "inlet_c", "inlet_slope_c_per_min",
    "thermal_bit", "power_cap_bit",
)
"""Per-GPU features, in this order, for every baseline and for training."""
FEATURE_LIMITS: dict[str, tuple[float, float]] = {
    "gpu_temp": (20, 100), "hbm_temp": (20, 110), "power_w": (0, 800), "power_frac": (0, 1.2),
    "clock_frac": (0, 1), "util": (0, 1), "temp_slope_c_per_min": (-10, 10),
    "hbm_slope_c_per_min": (-10, 10), "power_slope_w_per_min": (-300, 300),
    "core_margin_c": (-10, 70), "hbm_margin_c": (-10, 80), "temp_over_inlet_c": (0, 80),
    "inlet_c": (10, 80), "inlet_slope_c_per_min": (-5, 5), "thermal_bit": (0, 1), "power_cap_bit": (0, 1),
}
"""Ranges for river's HalfSpaceTrees (it needs features scaled to known limits)."""

F_SLOPE_TAU_S = 60.0
F_SLOPE_GAP_S = 600.0
"""A reading this long after its value's last valid one restarts the value's slope: a change over
minutes of a dark sensor or a GPU off the bus is no rate of change."""
F_SLOPE_MIN_S = 30.0
"""A slope is given (not NaN) once it averages this much time: its first rates, over a second or
two of whole-degree readings, are noise (1 °C in 1 s reads as 60 °C/min)."""
# state columns. Each sloped value keeps when it was last read valid (F_*_AT): rows keep coming while
# a sensor is dark (NaN), so the time since the GPU's last row is not the time its change took; and
# how much of its slope's average is filled (F_*_W: 1 - exp(-time averaged / tau))
F_TS, F_TEMP, F_HBM, F_POWER, F_ENERGY, F_TSLOPE, F_HSLOPE, F_PSLOPE, F_INLET, F_USLOPE, \
    F_TEMP_AT, F_HBM_AT, F_POWER_AT, F_INLET_AT, F_TEMP_W, F_HBM_W, F_POWER_W, F_INLET_W = range(18)
F_SIZE = 18


@kernel
def _track(s: np.ndarray, i: int, value: int, at: int, slope: int, weight: int, x: float, ts: float) -> float:
    """Read ``x`` at ``ts`` into GPU ``i``'s value (state columns ``value``, ``at``, ``slope``,
    ``weight``); returns its slope per minute, NaN until it averages :data:`F_SLOPE_MIN_S`.

    The slope is an exponentially weighted mean (time constant :data:`F_SLOPE_TAU_S`) of the rates
    between valid readings, each over the time since the previous valid one, divided by the weight
    filled so far (a bias-corrected mean: the first rates are not taken for the whole average). It
    is kept while ``x`` is missing, and restarts from ``x`` where the last valid reading is more
    than :data:`F_SLOPE_GAP_S` old (or there is none)."""
    if x == x:
        dt = ts - s[i, at]
        if not dt <= F_SLOPE_GAP_S or s[i, value] != s[i, value]:  # (NaN: never read)
            s[i, slope] = np.nan
            s[i, weight] = 0.0
        elif dt > 0.0:
            d = (x - s[i, value]) / dt * 60.0
            a = 1.0 - np.exp(-dt / F_SLOPE_TAU_S)
            filled = s[i, weight] if s[i, weight] == s[i, weight] else 0.0  # (NaN: none averaged yet)
            w = filled + a * (1.0 - filled)
            s[i, slope] = d if s[i, slope] != s[i, slope] else s[i, slope] + a / w * (d - s[i, slope])
            s[i, weight] = w
        s[i, value] = x
        s[i, at] = ts
    if s[i, weight] >= 1.0 - np.exp(-F_SLOPE_MIN_S / F_SLOPE_TAU_S) - 1e-12:  # (up to rounding)
        return s[i, slope]  # type: ignore[no-any-return]
    return np.nan


@kernel
def feature_kernel(obs: np.ndarray, parents: np.ndarray, s: np.ndarray, racks: np.ndarray,
                   nodes: np.ndarray, out: np.ndarray) -> int:
    """Features per row into ``out`` (rows, len(FEATURES)); returns rows skipped (NaN row)."""
    skipped = 0
    for row in range(obs.shape[0]):
        ts = obs[row, X_TS]
        i = int(obs[row, X_SLOT])
        last = s[i, F_TS]
        dt = ts - last
        if last == last and dt <= 0.0:
            out[row, :] = np.nan
            skipped += 1
            continue
        temp, hbm, power = obs[row, X_TEMP], obs[row, X_HBM], obs[row, X_POWER]
        energy = obs[row, X_ENERGY]
        if power == power and not 0.0 <= power < 1e5:
            power = np.nan
        if last == last and dt <= 600.0 and energy == energy and s[i, F_ENERGY] == s[i, F_ENERGY]:
            mean_power = (energy - s[i, F_ENERGY]) / dt
            if 0.0 <= mean_power < 1e5:
                power = mean_power
        limit = obs[row, X_LIMIT]
        if not (limit == limit and limit > 0.0):
            limit = facts.POWER_LIMIT_W
        # the margins are to the GPU's own limits where this sample reports them (see thermal_fit's
        # core_limit and hbm_limit; one sample's features, nothing kept): its max operating
        # temperatures, else its slowdown temperature less 2 °C, else Hopper's
        core_limit = reported_core_limit(obs[row, X_MAX_OP], obs[row, X_SLOWDOWN])
        if core_limit != core_limit:
            core_limit = facts.MAX_OPERATING_TEMP_C
        hbm_max_op = obs[row, X_HBM_MAX_OP]
        hbm_limit = hbm_max_op if facts.OWN_LIMIT_MIN_C < hbm_max_op < facts.OWN_LIMIT_MAX_C \
            else facts.HBM_MAX_OPERATING_TEMP_C
        inlet = gpu_inlet(ts, parents[i, 1], parents[i, 0], temp, power, racks, nodes,
                          facts.THERMAL_RESISTANCE_C_PER_W, 300.0)
        temp_slope = _track(s, i, F_TEMP, F_TEMP_AT, F_TSLOPE, F_TEMP_W, temp, ts)
        hbm_slope = _track(s, i, F_HBM, F_HBM_AT, F_HSLOPE, F_HBM_W, hbm, ts)
        power_slope = _track(s, i, F_POWER, F_POWER_AT, F_PSLOPE, F_POWER_W, power, ts)
        inlet_slope = _track(s, i, F_INLET, F_INLET_AT, F_USLOPE, F_INLET_W, inlet, ts)
        s[i, F_TS] = ts
        s[i, F_ENERGY] = energy
        clock, clock_max = obs[row, X_CLOCK], obs[row, X_CLOCK_MAX]
        reasons = obs[row, X_REASONS]
        bits = max(reason_bits(reasons), 0)
        out[row, 0] = temp
        out[row, 1] = hbm
        out[row, 2] = power
        out[row, 3] = power / limit
        out[row, 4] = clock / clock_max if clock_max > 0.0 else np.nan
        out[row, 5] = obs[row, X_UTIL]
        out[row, 6] = temp_slope
        out[row, 7] = hbm_slope
        out[row, 8] = power_slope
        out[row, 9] = core_limit - temp
        out[row, 10] = hbm_limit - hbm
        out[row, 11] = temp - inlet
        out[row, 12] = inlet
        out[row, 13] = inlet_slope
        out[row, 14] = 1.0 if (bits & facts.THERMAL_THROTTLE_MASK) != 0 else 0.0
        out[row, 15] = 1.0 if (bits & facts.THROTTLE_SW_POWER_CAP) != 0 else 0.0
    return skipped


class FeatureStream:
    """Per-GPU features from GPU and rack frames (stateful: slopes need the previous sample)."""

    def __init__(self, topology: Topology, health: PipelineHealth, stage: str) -> None:
        n = topology.size("gpu")
        self.health = health
        self.stage = stage
        self.parents = np.ascontiguousarray(np.stack([topology.gpu_rack, topology.gpu_node], axis=1),
                                            dtype=np.int64) if n else np.zeros((0, 2), np.int64)
        self.s_feat = np.full((n, F_SIZE), np.nan)
        self.s_rack, self.s_node = new_inlet_states(topology)
        self.n = n

    def observe_rack(self, frame: Frame) -> None:
        update_rack_inlet(rack_inlet_obs(frame, len(self.s_rack), self.health, self.stage), self.s_rack)

    def features(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        """``(obs, features)`` for a GPU frame; rows out of order come back as NaN features."""
        obs = self._in_time_order(gpu_obs(frame, OBS_FIELDS, self.n, self.health, self.stage))
        out = np.empty((len(obs), len(FEATURES)))
        skipped = feature_kernel(obs, self.parents, self.s_feat, self.s_rack, self.s_node, out)
        if skipped:
            self.health.problem(self.stage, "gpu samples out of time order", skipped)
        return obs, out

    def _in_time_order(self, obs: np.ndarray) -> np.ndarray:
        """``obs`` of a frame of several polls (a GPU repeats) with its rows in time order across
        GPUs, each GPU's own rows as listed, late rows last (:func:`~.thermal_fit.poll_order`,
        as the thermal fit takes them); as listed where already in time order, or one poll.

        The inlet feature is judged across GPUs as the rows come: a node's proxy is the coolest of
        its GPUs' ``T - R_nominal * P`` over a tick (closed at the node's first row of a newer one),
        the rack's the median of its nodes'. A frame of two polls listed by GPU (GPU0 at 100 and
        105 s, then GPU1 at 100 and 105 s) closed each node's 100-s tick on its first GPU alone and
        read the others' 100-s rows into the 105-s tick: the simulator's cooling loss (64 GPUs,
        polls paired into frames) had ``loop_warming`` call 51 GPUs first at other times than fed
        poll by poll (until 2026-12-05). Late rows go as they went: the kernel skips and counts them."""
        ts, slots = obs[:, 0], obs[:, 1]
        if len(ts) < 2 or not (ts[1:] < ts[:-1]).any():
            return obs
        ends = np.empty(len(ts) + 1, np.int64)
        if repeat_free_runs(slots, np.full(self.n, -1, np.int64), 0, ends) < 2:
            return obs  # one poll: judged as listed, as the thermal fit judges it
        return np.ascontiguousarray(obs[poll_order(ts, slots, self.s_feat[:, F_TS], np.full(self.n, -np.inf))])

    def state(self) -> dict[str, np.ndarray]:
        return {"feat": self.s_feat, "rack": self.s_rack, "node": self.s_node}


class FeatureDetector(Detector):
    """Shared plumbing: a feature stream, per-GPU alarms per predicted event. A GPU that has sent
    nothing for :data:`SILENT_S` has its predictions withdrawn as no longer reporting, as the thermal
    and power detectors' are (until 2026-12-04 a baseline's prediction on a GPU that fell off the
    bus held for ever: it steps only on its GPU's own rows)."""

    slot_kinds: ClassVar[Mapping[str, str]] = {"s_feat": "gpu", "s_rack": "rack", "s_node": "node", "s_alarm": "gpu"}
    kinds: ClassVar[tuple[str, ...]] = ("gpu", "rack")
    events: tuple[str, ...] = ()
    score_log: "ScoreLog | None" = None
    s_alarm: np.ndarray

    def __init__(self, topology: Topology, health: PipelineHealth | None) -> None:
        super().__init__(topology)
        self.health = health or PipelineHealth()
        self.stream = FeatureStream(topology, self.health, self.name)
        self.s_feat = self.stream.s_feat
        self.s_rack = self.stream.s_rack
        self.s_node = self.stream.s_node

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        # a feature state saved before each value kept when it was last read valid (read at the
        # GPU's last row: off by the gap only where that row's value was missing) and how filled its
        # slope's average is (a slope there was a plain moving average: full)
        saved = np.asarray(state.get("s_feat"))
        state = add_columns(state, "s_feat", F_SIZE, {F_TEMP_AT: F_TS, F_HBM_AT: F_TS, F_POWER_AT: F_TS,
                                                      F_INLET_AT: F_TS})
        if saved.ndim == 2 and saved.shape[1] <= F_TEMP_W and state["s_feat"] is not saved:
            slopes = state["s_feat"][:, [F_TSLOPE, F_HSLOPE, F_PSLOPE, F_USLOPE]]
            state["s_feat"][:, F_TEMP_W:F_INLET_W + 1] = np.where(np.isfinite(slopes), 1.0, np.nan)
        return upgrade_rack_state(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.stream.s_feat, self.stream.s_rack, self.stream.s_node = self.s_feat, self.s_rack, self.s_node

    def remap_state(self, state: dict[str, Any], remap: Remap) -> dict[str, Any]:
        """Rows follow their entities; each rack's list of nodes (node indices, for the inlet
        proxy) is threaded anew for this topology, as the thermal fit's is."""
        out = super().remap_state(state, remap)
        out["s_rack"], out["s_node"] = relinked_inlet_states(out["s_rack"], out["s_node"], self.topology)
        return out

    def update(self, frame: Frame) -> list[Finding]:
        if frame.kind == "rack":
            self.stream.observe_rack(frame)
            return []
        if frame.kind != "gpu" or len(frame) == 0:
            return []
        obs, feats = self.stream.features(frame)
        return self._decide(obs, feats) + self._withdraw_silent(obs)

    def _decide(self, obs: np.ndarray, feats: np.ndarray) -> list[Finding]:
        raise NotImplementedError

    def alarm_events(self) -> tuple[tuple[str, ...], ...]:
        """The events each alarm block of ``s_alarm`` predicts (one block per event by default)."""
        return tuple((e,) for e in self.events)

    def _withdraw_silent(self, obs: np.ndarray) -> list[Finding]:
        """After a frame: withdraw the predictions of each GPU whose last row (the feature stream's)
        is more than :data:`SILENT_S` before the frame's time, saying so."""
        block_events = self.alarm_events()
        if not block_events:
            return []  # (a tap that keeps features and alarms on nothing)
        return silent_gpu_withdrawals(self.name, self.s_alarm, block_events, self.s_feat[:, F_TS], obs[:, 0],
                                      SILENT_S)

    def alarm_rule(self) -> tuple[tuple[tuple[str, ...], ...], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(events per score column, on levels, off ratio, off offset, timing) — see :class:`ScoreLog`."""
        raise NotImplementedError

    def log_scores(self) -> ScoreLog:
        """Start keeping every score from now on (for the evaluation's threshold sweep)."""
        columns, levels, ratio, offset, timing = self.alarm_rule()
        self.score_log = ScoreLog(self.name, self.topology.size("gpu"), columns, levels.astype(float).copy(),
                                  ratio, offset, timing)
        return self.score_log

    def _predictions(self, obs: np.ndarray, out: np.ndarray, reasons: Sequence[str],
                     eta_s: Sequence[float]) -> list[Finding]:
        found: list[Finding] = []
        for rec in out:
            row, which, code = int(rec[O_ROW]), int(rec[O_WHICH]), int(rec[O_CODE])
            found.append(Prediction(
                float(obs[row, 0]), "gpu", int(obs[row, 1]), self.events[which], float(eta_s[which]),
                round(float(rec[O_CONF]), 3), self.name,
                reasons[which].format(*rec[O_V0:O_V0 + 6]) if code != CODE_WITHDRAW else "below the alarm level",
                active=code != CODE_WITHDRAW))
        return found


@kernel
def _score_alarms(obs: np.ndarray, scores: np.ndarray, alarms: np.ndarray, on_level: np.ndarray,
                  off_level: np.ndarray, timing: np.ndarray, out: np.ndarray) -> int:
    """Alarm per (row, event) from a score matrix (rows, events) with on/off levels per event.

    ``timing`` = (on_count, off_hold_s, refresh_s). Emits the score in ``v0``.
    """
    n_out = 0
    for row in range(obs.shape[0]):
        i = int(obs[row, 1])
        for k in range(scores.shape[1]):
            x = scores[row, k]
            if x != x:
                continue
            code = alarm_step(alarms, i, 4 * k, obs[row, 0], x >= on_level[k], x < off_level[k],
                              timing[0], timing[1], timing[2])
            if code != CODE_NONE:
                n_out = emit(out, n_out, row, k, code, -1.0, 1.0, (x, 0.0, 0.0, 0.0, 0.0, 0.0))
    return n_out


SILENT_S = THERMAL_FIT_PARAMS["gap_s"]
"""A GPU silent this long has its baselines' predictions withdrawn: the thermal fit's ``gap_s``, after
which the thermal and power detectors withdraw theirs."""


# ---- score logs: replaying a baseline at other thresholds -----------------------------------
@dataclass
class ScoreLog:
    """Every score a baseline gave, with the alarm rule it applies to them — so the evaluation
    can replay its alarms at any other threshold (:meth:`spans`) without running it again.

    Column ``k`` of the scores predicts the events ``columns[k]``; its alarm starts at
    ``score >= level`` and clears below ``level * off_ratio[k] - off_offset[k]``, with the
    detector's ``timing`` (on_count, off_hold_s, refresh_s). Rows before ``valid_from`` could not
    alarm live (river's calibration) and are skipped."""

    detector: str
    slots: int
    columns: tuple[tuple[str, ...], ...]
    levels: np.ndarray
    off_ratio: np.ndarray
    off_offset: np.ndarray
    timing: np.ndarray
    valid_from: float = -np.inf
    _parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    _obs: np.ndarray | None = None
    _scores: np.ndarray | None = None
    _rows: int = 0
    # where the live detector withdrew silent GPUs (FeatureDetector._withdraw_silent): after row
    # count, at time, these slots — whatever the threshold, the same rows and times
    silences: list[tuple[int, float, np.ndarray]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._last_ts = np.full(self.slots, np.nan)  # each slot's last row, as the feature stream's F_TS
        self._silenced = np.zeros(self.slots, dtype=bool)  # slots told silent since their last row

    def add(self, obs: np.ndarray, scores: np.ndarray) -> None:
        """Keep one frame's rows and scores; note the GPUs gone silent as of the frame."""
        self._parts.append((obs[:, :2].copy(), np.asarray(scores, dtype=float).reshape(len(obs), -1).copy()))
        self._rows += len(obs)
        slot, ts = obs[:, 1].astype(np.int64), obs[:, 0]
        np.fmax.at(self._last_ts, slot, ts)  # the feature stream's F_TS: its rows out of order are skipped
        self._silenced[slot] = False
        stamps = ts[np.isfinite(ts)]
        if not len(stamps):
            return
        now = frame_now(stamps, SILENT_S)
        quiet = ~self._silenced & (now - self._last_ts > SILENT_S)  # (NaN: never heard, no alarm to withdraw)
        if quiet.any():
            self._silenced |= quiet
            self.silences.append((self._rows, now, np.flatnonzero(quiet)))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(obs, scores)``: (rows, 2) time and slot, (rows, columns) scores, in arrival order."""
        if self._parts:
            obs = [o for o, _ in self._parts]
            sc = [s for _, s in self._parts]
            if self._obs is not None and self._scores is not None:
                obs.insert(0, self._obs)
                sc.insert(0, self._scores)
            self._obs, self._scores = np.concatenate(obs), np.concatenate(sc)
            self._parts = []
        if self._obs is None or self._scores is None:
            return np.empty((0, 2)), np.empty((0, len(self.columns)))
        return self._obs, self._scores

    def spans(self, column: int, level: float, end: float,
              chunk_rows: int = 262_144) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(slot, start, stop)`` of every alarm the detector would have raised on ``column`` at
        ``level`` — the live alarm state machine, replayed; an alarm open at the end closes at
        ``end``."""
        obs, scores = self.arrays()
        on = np.array([level], dtype=float)
        off = on * self.off_ratio[column] - self.off_offset[column]
        col = np.ascontiguousarray(scores[:, column:column + 1])
        if np.isfinite(self.valid_from):
            col = np.where(obs[:, :1] >= self.valid_from, col, np.nan)
        alarms = new_alarm_columns(self.slots, 1)
        slots_out: list[np.ndarray] = []
        times: list[np.ndarray] = []
        codes: list[np.ndarray] = []
        cuts = [(rows, now, quiet) for rows, now, quiet in self.silences] + [(len(obs), np.nan, np.empty(0, np.int64))]
        a = 0
        for cut, now, quiet in cuts:
            while a < cut:  # the rows up to the cut, in chunks
                b = min(a + chunk_rows, cut)
                out = np.empty((b - a, OUT_SIZE))
                n = _score_alarms(np.ascontiguousarray(obs[a:b]), np.ascontiguousarray(col[a:b]), alarms, on, off,
                                  self.timing, out)
                keep = out[:n][out[:n, O_CODE] != CODE_REFRESH]
                row = keep[:, O_ROW].astype(np.int64) + a
                slots_out.append(obs[row, 1].astype(np.int64))
                times.append(obs[row, 0])
                codes.append(keep[:, O_CODE])
                a = b
            # withdrawn as no longer reporting, as the live detector withdrew them
            gone = np.array([g for g in quiet.tolist() if alarm_withdraw(alarms, g, 0, now) == CODE_WITHDRAW],
                            dtype=np.int64)
            if len(gone):
                slots_out.append(gone)
                times.append(np.full(len(gone), now))
                codes.append(np.full(len(gone), float(CODE_WITHDRAW)))
        slot = np.concatenate(slots_out) if slots_out else np.empty(0, np.int64)
        ts = np.concatenate(times) if times else np.empty(0)
        code = np.concatenate(codes) if codes else np.empty(0)
        order = np.argsort(slot, kind="stable")  # each slot's changes stay in time order
        slot, ts, starting = slot[order], ts[order], code[order] != CODE_WITHDRAW
        i = np.flatnonzero(starting)
        nxt = np.minimum(i + 1, max(len(slot) - 1, 0))
        closed = (i + 1 < len(slot)) & (slot[nxt] == slot[i]) & ~starting[nxt]
        stop = np.where(closed, ts[nxt], np.maximum(end, ts[i]))
        return slot[i], ts[i], stop


# ---- threshold rule ---------------------------------------------------------------------------
class ScoredBaseline(FeatureDetector):
    """A baseline that scores each sample and alarms above a threshold: the evaluation logs its
    scores (:meth:`log_scores`) and sweeps its threshold (the "matched" figures)."""


class ThresholdDetector(ScoredBaseline):
    """Alert at a fixed level or on the throttle bit, like today's tools."""

    name: ClassVar[str] = "threshold"
    events = ("thermal_throttle", "hbm_overheat", "power_cap")

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, core_c: float = 85.0,
                 hbm_c: float = 93.0, power_frac: float = 0.97, hysteresis: float = 2.0,
                 off_hold_s: float = 60.0) -> None:
        super().__init__(topology, health)
        self.levels = np.array([core_c, hbm_c, power_frac])
        self.off_offset = np.array([hysteresis, hysteresis, 0.02])
        self.off = self.levels - self.off_offset
        self.timing = np.array([1.0, off_hold_s, 60.0])
        self.s_alarm = new_alarm_columns(topology.size("gpu"), 3)

    def alarm_rule(self) -> tuple[tuple[tuple[str, ...], ...], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return tuple((e,) for e in self.events), self.levels, np.ones(3), self.off_offset, self.timing

    def _decide(self, obs: np.ndarray, feats: np.ndarray) -> list[Finding]:
        f = {name: feats[:, i] for i, name in enumerate(FEATURES)}
        # the bit counts as "at the level": today's tools alert on it
        scores = np.column_stack([
            np.where(f["thermal_bit"] > 0, np.inf, f["gpu_temp"]),
            f["hbm_temp"],
            np.where(f["power_cap_bit"] > 0, np.inf, f["power_frac"]),
        ])
        if self.score_log is not None:
            self.score_log.add(obs, scores)
        out = np.empty((3 * len(obs), OUT_SIZE))
        n = _score_alarms(obs, np.ascontiguousarray(scores), self.s_alarm, self.levels, self.off, self.timing, out)
        return self._predictions(obs, out[:n], (
            f"core {{0:.0f}} °C >= {self.levels[0]:.0f} °C or thermal throttle bit set",
            f"HBM {{0:.0f}} °C >= {self.levels[1]:.0f} °C",
            f"power at {{0:.0%}} of the limit (>= {self.levels[2]:.0%}) or power-cap bit set",
        ), (0.0, 0.0, 0.0))


HST_OFF_OFFSET = 0.05  # river's alarm clears this far below its level
HST_TIMING = np.array([2.0, 120.0, 60.0])
SKLEARN_OFF_RATIO = 0.8  # the classifier's alarm clears at this share of its level
SKLEARN_TIMING = np.array([2.0, 120.0, 60.0])


# ---- river HalfSpaceTrees -----------------------------------------------------------------
def _whole(detector: str, name: str, value: Any, least: int) -> int:
    """A whole-number parameter given as any number (``--param`` gives floats): ValueError naming
    it where it is not whole, or under ``least``."""
    number = _number(detector, name, value)
    if not (number.is_integer() and number >= least):
        raise ValueError(f"{detector}: {name} must be a whole number of at least {least}, not {value!r}")
    return int(number)


def _number(detector: str, name: str, value: Any) -> float:
    """A finite number parameter: ValueError naming it otherwise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{detector}: {name} must be a number, not {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{detector}: {name} must be finite, not {value!r}")
    return number


class HalfSpaceTreesDetector(ScoredBaseline):
    """river's HalfSpaceTrees over the feature stream, one model for all GPUs."""

    name: ClassVar[str] = "river_hst"
    events = ("thermal_throttle", "hbm_overheat", "power_cap")
    state_scalars: ClassVar[tuple[str, ...]] = ("threshold", "calibration_start", "calibration_end")

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, n_trees: int = 10,
                 height: int = 8, window_ticks: int = 25, window_size: int | None = None, seed: int = 42,
                 calibration_s: float = 1800.0, calibration_skip_s: float = 600.0, quantile: float = 0.999,
                 horizon_s: float = 1800.0) -> None:
        super().__init__(topology, health)
        from river import anomaly

        # checked here, so that a refused value is refused when the bank is built (a usage error
        # of evaluate's --param), not once data comes (river checks none of them; review h28:
        # ``--param river_hst.n_trees=5``, a float as every --param is, ended in a traceback)
        n_trees, height, window_ticks, seed = (_whole(self.name, k, v, least) for k, v, least in (
            ("n_trees", n_trees, 1), ("height", height, 1), ("window_ticks", window_ticks, 1), ("seed", seed, 0)))
        # One model learns every GPU, a fleet tick at a time: its reference window (the mass profile
        # a sample is scored against) must span whole ticks of the fleet, or it is a few racks' GPUs
        # (river's default 250 samples was a quarter of one 1,024-GPU tick)
        window_size = (window_ticks * max(topology.size("gpu"), 1) if window_size is None
                       else _whole(self.name, "window_size", window_size, 1))
        calibration_s, calibration_skip_s, quantile, horizon_s = (_number(self.name, k, v) for k, v in (
            ("calibration_s", calibration_s), ("calibration_skip_s", calibration_skip_s), ("quantile", quantile),
            ("horizon_s", horizon_s)))
        if not (0.0 < quantile <= 1.0 and calibration_s > 0 and calibration_skip_s >= 0 and horizon_s > 0):
            raise ValueError(f"{self.name}: quantile must be in (0, 1], calibration_s and horizon_s positive, "
                             f"calibration_skip_s not negative (got {quantile:g}, {calibration_s:g}, "
                             f"{horizon_s:g}, {calibration_skip_s:g})")
        limits: dict[Any, tuple[float, float]] = {name: (float(lo), float(hi))
                                                   for name, (lo, hi) in FEATURE_LIMITS.items()}
        self.model = anomaly.HalfSpaceTrees(n_trees=n_trees, height=height, window_size=window_size,
                                            limits=limits, seed=seed)
        self.lo = np.array([FEATURE_LIMITS[n][0] for n in FEATURES])
        self.calibration_s = calibration_s
        self.calibration_skip_s = calibration_skip_s
        self.quantile = quantile
        self.horizon_s = horizon_s
        self.threshold = np.inf
        self.calibration_end = np.nan
        self.calibration_start = np.nan
        self.calibration: list[float] = []
        self.s_alarm = new_alarm_columns(topology.size("gpu"), 1)

    def alarm_rule(self) -> tuple[tuple[tuple[str, ...], ...], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (self.events,), np.array([self.threshold]), np.ones(1), np.array([HST_OFF_OFFSET]), HST_TIMING

    def alarm_events(self) -> tuple[tuple[str, ...], ...]:
        return (self.events,)  # one score, one alarm: an anomaly predicts each scored event

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["model"] = copy.deepcopy(self.model)  # every attribute, window counters included
        state["calibration"] = list(self.calibration)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        state["model"] = copy.deepcopy(state["model"])
        state["calibration"] = list(state["calibration"])
        super().load_state_dict(state)

    def _decide(self, obs: np.ndarray, feats: np.ndarray) -> list[Finding]:
        x = np.where(np.isfinite(feats), feats, self.lo)  # HST has no notion of missing
        scores = np.full(len(x), np.nan)
        model = self.model
        # a row without the GPU's temperature (off the bus, out of order) is neither scored nor
        # learnt, as the classifier skips it: filled in with the lower limits it read as an anomaly
        for r in np.flatnonzero(np.isfinite(feats[:, 0])).tolist():
            sample = dict(zip(FEATURES, x[r].tolist()))
            scores[r] = model.score_one(sample)
            model.learn_one(sample)
        if len(obs) and not np.isfinite(self.threshold):
            t = float(obs[:, 0].max())
            if np.isnan(self.calibration_end):  # skip the start-up, then learn the normal scores
                self.calibration_start = t + self.calibration_skip_s
                self.calibration_end = self.calibration_start + self.calibration_s
            if t >= self.calibration_start:
                self.calibration.extend(scores[np.isfinite(scores)].tolist())
            if t >= self.calibration_end and self.calibration:
                self.threshold = max(0.5, float(np.quantile(self.calibration, self.quantile)))
                self.calibration = []
        level = np.array([self.threshold])
        if self.score_log is not None:
            self.score_log.add(obs, scores)
            self.score_log.levels[:] = self.threshold
            self.score_log.valid_from = self.calibration_end if np.isfinite(self.threshold) else np.inf
        out = np.empty((len(obs), OUT_SIZE))
        n = _score_alarms(obs, np.ascontiguousarray(scores[:, None]), self.s_alarm, level,
                          level - HST_OFF_OFFSET, HST_TIMING, out)
        found: list[Finding] = []
        for p in self._predictions(obs, out[:n], ("HalfSpaceTrees score {0:.2f}",), (self.horizon_s,)):
            assert isinstance(p, Prediction)
            # an anomaly does not name the event: it predicts each scored one
            for event in self.events:
                found.append(Prediction(p.ts, p.entity_kind, p.slot, event, p.eta_s, p.confidence,
                                        p.detector, p.reason, p.active))
        return found


# ---- scikit-learn model ---------------------------------------------------------------------
MODEL_FORMAT = "foreshock-model"
MODEL_VERSION = 1
TRUSTED_TYPES: tuple[str, ...] = ("sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",)
"""Types a model file may hold beyond those skops trusts by default (numpy, builtins,
scikit-learn estimators). Anything else — a function, ``os.system``, ``builtins.eval`` — is
refused before loading. A trusted type is not a safe value: skops leaves ``TreePredictor`` out
of its defaults because scikit-learn walks its node array without bounds checks, so
:func:`_check_classifier` checks every node before a model is used."""
MODEL_KEYS = frozenset({"format", "version", "features", "events", "meta"})
"""The keys of a model file's document (:func:`save_model`); a file with any other is refused."""
ENTRY_KEYS = frozenset({"model", "horizon_s", "threshold", "samples", "positives"})
"""The keys of an event's entry (``model``, ``horizon_s`` and ``threshold`` required; the training
counts are not read)."""
MODEL_TELEMETRY_KEY = "telemetry"
"""The meta entry naming the entity kinds the model's features were computed from in training
(``["gpu", "rack"]``: the racks gave inlets, ``inlet_temp`` or ``coolant_temp``; or ``["gpu"]``: inlets
read from the GPUs' proxy, as with ``train --telemetry gpu,job`` or racks of PDU power alone).
A model is served the same inputs or refused (:func:`telemetry_mismatch`): the proxy's inlet is
not the rack's, and a classifier trained on one reads the other wrongly. Files written before
it was recorded lack it: their inputs are unknown (every kind their recordings had)."""
MODEL_UNPACKED_MOST = 200 * 2**20
"""Bytes a model file's archive may unpack to, checked before anything is unpacked: a
200-iteration model of two events unpacks to 3.3 MB, while deflated zeros pack ~1000:1 (a
0.8 MB file was seen to unpack a 768 MiB array)."""
MODEL_SCHEMA_MOST = 32 * 2**20
"""Bytes the archive's ``schema.json`` may unpack to (that model's: 1.6 MB): skops builds a
Python object per item of it, several times the text's size."""
MODEL_ENTRIES_MOST = 100_000
"""Archive entries a model file may hold (that model: 1,249, three arrays per tree)."""
MODEL_NODES_MOST = 1_000_000
"""Objects a model file's schema may build, each reference to an object described before counted
with all it holds (that model: 4,453, 1,467 of its references shared). skops builds a reference as
the object it names and walks the graph so built, shared parts again at each reference, when it
audits the types: a 1-MB schema of lists each holding the one before twice, 22 deep, took 28 s to
refuse, 40 deep would take months (until 2026-12-04)."""
MODEL_DEPTH_MOST = 200
"""How deeply a model file's schema may nest (that model: 17)."""


class ModelFileError(ValueError):
    """A model file is unreadable, holds untrusted types, or does not match this foreshock."""


class ModelWriteError(Exception):
    """A model file cannot be written (its folder unwritable, the disk full): ``train`` says so
    rather than ending a whole run in a traceback."""


def learnable_events() -> tuple[str, ...]:
    """The event kinds a classifier of the per-GPU feature stream can learn and predict: the scored
    kinds (:data:`foreshock.detectors.evaluation.EVENT_KINDS`) of GPU entities. A link's or an
    optic's event has no GPU feature row to be labelled on."""
    from .evaluation import EVENT_KINDS  # (the evaluation harness imports this module)

    return tuple(name for name, kind in EVENT_KINDS.items() if kind.entity_kind == "gpu")


def _version_refusal(path: Path, trained_with: Any) -> ModelFileError:
    """scikit-learn does not support loading an estimator saved by another version (its
    ``InconsistentVersionWarning``): the trees may be read differently, or not at all."""
    import sklearn

    shown = trained_with if type(trained_with) is str and len(trained_with) <= 40 else _shown(trained_with)
    return ModelFileError(f"{path}: trained with scikit-learn {shown}, this is {sklearn.__version__}; "
                          "retrain with `foreshock train`")


def save_model(path: str | Path, models: dict[str, dict[str, Any]], meta: dict[str, Any] | None = None) -> Path:
    """Write ``{event: {"model", "horizon_s", "threshold"}}`` with the feature list and version."""
    import skops.io as sio

    doc = {"format": MODEL_FORMAT, "version": MODEL_VERSION, "features": list(FEATURES),
           "events": models, "meta": json.dumps(meta or {}, sort_keys=True)}
    path = Path(path)
    # written beside it and moved in place: a write that fails (the disk filling) leaves any model
    # already at ``path`` as it was, and no half-written file
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sio.dump(doc, part)
        os.replace(part, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            part.unlink(missing_ok=True)
        raise ModelWriteError(f"cannot write the model to {path}: {exc.strerror or exc}") from exc
    return path


_LOADED: dict[tuple[str, int, int], dict[str, Any]] = {}
"""Model files read and checked, by (resolved path, st_mtime_ns, st_size): ``evaluate --model``
checks the file at parse time, again when it checks a ``--param sklearn.*`` and once more when the
run builds the detector (each read of a 3.4 MB model ~0.3 s). A file rewritten (by ``train``)
changes its key and is read afresh; a refused file is never kept."""
_LOADED_MOST = 4  # a process loads one model, seldom two: a few are plenty, and memory stays bounded


def _read_model_file(path: Path) -> bytes:
    """The model file's bytes: its one read per load (the checks and the load all work on these)."""
    return path.read_bytes()


def load_model(path: str | Path) -> dict[str, Any]:
    """Load a model file safely; raise :class:`ModelFileError` with the reason otherwise.

    A file read before and unchanged since (same path, modification time and size) is not read
    again: its document is checked against this foreshock (format, version, features, classifiers)
    at every call and shared, each caller getting its own dicts around the same fitted classifiers
    (read-only: only ``predict_proba`` is called)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file (train one with `foreshock train`)")
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    doc = _LOADED.get(key)
    if doc is None:
        doc = _parsed_model(path, _read_model_file(path))
    _check_model(path, doc)
    if key not in _LOADED:
        while len(_LOADED) >= _LOADED_MOST:
            del _LOADED[next(iter(_LOADED))]  # the oldest
        _LOADED[key] = doc
    return {**doc, "features": list(doc["features"]),
            "events": {event: dict(entry) for event, entry in doc["events"].items()}}


def _parsed_model(path: Path, data: bytes) -> Any:
    """What the skops archive ``data`` (the bytes of ``path``, named in messages) holds, loaded only
    once it asks for no untrusted type; :class:`ModelFileError` with the reason otherwise."""
    import skops.io as sio
    from skops.io.exceptions import UntrustedTypesFoundException

    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ModelFileError(f"{path}: not a foreshock model file (expected a skops archive; "
                             "pickles are never loaded)")
    _check_archive(path, data)
    try:
        untrusted = sio.get_untrusted_types(data=data)
    except Exception as exc:  # a damaged archive or schema: report, do not guess
        raise ModelFileError(f"{path}: unreadable model file ({type(exc).__name__}: {exc})") from None
    refused = sorted(set(untrusted) - set(TRUSTED_TYPES))
    if refused:
        raise ModelFileError(f"{path}: refused — the file asks to load untrusted types {refused}; "
                             "it was not written by `foreshock train` or has been tampered with")
    from sklearn.exceptions import InconsistentVersionWarning

    try:
        # an estimator saved by another scikit-learn only warns as it is unpacked: refused here, so
        # that a file with no (or a false) version in its meta is caught too
        with warnings.catch_warnings():
            warnings.simplefilter("error", InconsistentVersionWarning)
            doc = sio.loads(data, trusted=list(TRUSTED_TYPES))
    except InconsistentVersionWarning as exc:
        raise _version_refusal(path, exc.original_sklearn_version) from None
    except UntrustedTypesFoundException as exc:
        raise ModelFileError(f"{path}: refused — untrusted types ({exc})") from None
    except Exception as exc:
        raise ModelFileError(f"{path}: unreadable model file ({type(exc).__name__}: {exc})") from None
    return doc


def _check_archive(path: Path, data: bytes) -> None:
    """:class:`ModelFileError` unless the archive ``data`` unpacks to a model file's size, judged
    from its directory before anything is unpacked (Python's zip reader stops an entry at the
    size its directory states, so an entry cannot unpack to more than it declares), and its schema
    builds a model file's objects (:func:`_check_schema`). One opening of the archive for both."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
            unpacked = sum(e.file_size for e in entries)
            schema_size = max((e.file_size for e in entries if e.filename == "schema.json"), default=0)
            if len(entries) > MODEL_ENTRIES_MOST or unpacked > MODEL_UNPACKED_MOST \
                    or schema_size > MODEL_SCHEMA_MOST:
                raise ModelFileError(
                    f"{path}: refused — the archive unpacks to {unpacked / 2**20:.1f} MiB in {len(entries):,} "
                    f"entries (schema {schema_size / 2**20:.1f} MiB); a model file holds at most "
                    f"{MODEL_UNPACKED_MOST / 2**20:.0f} MiB in {MODEL_ENTRIES_MOST:,} entries (schema "
                    f"{MODEL_SCHEMA_MOST / 2**20:.0f} MiB)")
            schema = json.loads(archive.read("schema.json"))
    except ModelFileError:
        raise
    except Exception as exc:  # a damaged directory or entry, no schema, not JSON (or nested past the parser)
        raise ModelFileError(f"{path}: unreadable model file ({type(exc).__name__}: {exc})") from None
    _check_schema(path, schema, {e.filename: e.file_size for e in entries})


def _check_schema(path: Path, schema: Any, sizes: dict[str, int]) -> None:
    """:class:`ModelFileError` unless the objects the archive's schema describes, each reference to
    one described before expanded as skops builds and audits it, stay within
    :data:`MODEL_NODES_MOST` and :data:`MODEL_DEPTH_MOST`, and the arrays they read within
    :data:`MODEL_UNPACKED_MOST`: an entry's declared size is counted at every node that reads it
    (skops unpacks an array once per node naming its file: one 20-MiB entry named by 60 nodes took
    2.6 GiB while the archive declared 22 MiB, until 2026-12-04). One pass, each object's expanded
    count and bytes kept by its ``__id__``."""
    seen: dict[Any, tuple[int, int]] = {}  # __id__ -> (objects, array bytes) of what it holds

    def walk(value: Any, depth: int) -> tuple[int, int]:
        if depth > MODEL_DEPTH_MOST:
            raise ModelFileError(f"{path}: refused — its schema nests deeper than {MODEL_DEPTH_MOST} "
                                 "(a model file's is under 20)")
        items: Any = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        ident = value.get("__id__") if isinstance(value, dict) else None
        nodes = 1 if ident is not None else 0
        if isinstance(ident, (dict, list)):
            ident = None  # (counted, but no key a reference could name)
        if ident is not None and ident in seen:
            return seen[ident]  # a reference: built as the object described before, all of it
        file = value.get("file") if isinstance(value, dict) else None
        nbytes = sizes.get(file, 0) if isinstance(file, str) else 0
        for item in items:
            if isinstance(item, (dict, list)):
                n, b = walk(item, depth + 1)
                nodes, nbytes = nodes + n, nbytes + b
            if nodes > MODEL_NODES_MOST or nbytes > MODEL_UNPACKED_MOST:
                raise ModelFileError(
                    f"{path}: refused — its schema builds over {MODEL_NODES_MOST:,} objects or reads over "
                    f"{MODEL_UNPACKED_MOST / 2**20:.0f} MiB of arrays, its references expanded (a model file "
                    "builds a few thousand); it was not written by `foreshock train` or has been tampered with")
        if ident is not None:
            seen[ident] = (nodes, nbytes)
        return nodes, nbytes

    walk(schema, 0)


def _shown(value: Any) -> str:
    """``value`` for a message: its repr, cut short (a tampered file may hold anything)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 80 else text[:77] + "..."


def _check_model(path: Path, doc: Any) -> None:
    """:class:`ModelFileError` unless ``doc`` is a model file of this foreshock's format, version
    and features, holding for each event a classifier that is safe to run and its alarm settings.
    Nothing else leaves: a value of a type no check foresaw is refused too, never a traceback."""
    try:
        _check_document(path, doc)
    except ModelFileError:
        raise
    except Exception as exc:
        raise ModelFileError(f"{path}: not a valid foreshock model file ({type(exc).__name__}: {exc})") from None


def _check_document(path: Path, doc: Any) -> None:
    """:func:`_check_model`'s checks; each value's type is checked before it is compared."""
    from .evaluation import EVENT_KINDS  # (the evaluation harness imports this module)

    fmt = doc.get("format") if type(doc) is dict else None
    if type(fmt) is not str or fmt != MODEL_FORMAT:
        raise ModelFileError(f"{path}: not a foreshock model file (format {_shown(fmt)})")
    version = doc.get("version")
    if type(version) is not int or version != MODEL_VERSION:
        raise ModelFileError(f"{path}: model format version {_shown(version)}, this foreshock reads "
                             f"version {MODEL_VERSION}; retrain with `foreshock train`")
    features = doc.get("features")
    if (type(features) not in (list, tuple) or not all(type(f) is str for f in features)
            or list(features) != list(FEATURES)):
        raise ModelFileError(f"{path}: trained on features {_shown(features)}, this foreshock computes "
                             f"{list(FEATURES)}; retrain with `foreshock train`")
    extra = set(doc) - MODEL_KEYS
    if extra:
        raise ModelFileError(f"{path}: holds {sorted(_shown(k) for k in extra)} beside a model's "
                             f"{sorted(MODEL_KEYS)}; it was not written by `foreshock train`")
    if "meta" in doc and type(doc["meta"]) is not str:
        raise ModelFileError(f"{path}: its meta is a {type(doc['meta']).__name__}, not the JSON text `foreshock "
                             "train` writes")
    if "meta" in doc:
        # not a JSON object: edited or damaged. Read as saying nothing, it had turned off the
        # telemetry and version checks without a word (a meta cut by one byte: a rack-trained
        # model scored on GPU telemetry alone, until 2026-12-04)
        try:
            info = json.loads(doc["meta"])
        except ValueError:
            info = None
        if type(info) is not dict:
            raise ModelFileError(f"{path}: its meta {_shown(doc['meta'])} is not the JSON object `foreshock train` "
                                 "writes; the file has been edited or damaged")
    _check_sklearn_version(path, doc.get("meta"))
    model_telemetry(path, doc)
    events = doc.get("events")
    if type(events) is not dict or not events:
        raise ModelFileError(f"{path}: holds no models")
    learnable = learnable_events()
    for event, entry in events.items():
        if type(event) is not str or event not in learnable:
            what = ("an event of a " + EVENT_KINDS[event].entity_kind + ", not a GPU's"
                    if type(event) is str and event in EVENT_KINDS else "not an event kind this foreshock scores")
            raise ModelFileError(f"{path}: holds a classifier for {_shown(event)}, {what}; a model predicts "
                                 f"{', '.join(learnable)}")
        if type(entry) is not dict or "model" not in entry:
            raise ModelFileError(f"{path}: entry {event!r} holds no classifier")
        extra = set(entry) - ENTRY_KEYS
        if extra:
            raise ModelFileError(f"{path}: entry {event!r} holds {sorted(_shown(k) for k in extra)} beside "
                                 f"{sorted(ENTRY_KEYS)}; it was not written by `foreshock train`")
        threshold: Any = entry.get("threshold")
        horizon: Any = entry.get("horizon_s")
        if not _is_number(threshold) or not 0.0 < threshold < 1.0:
            raise ModelFileError(f"{path}: entry {event!r} alarms at P >= {_shown(threshold)}, "
                                 "not a probability strictly between 0 and 1")
        if not _is_number(horizon) or not 0.0 < horizon < math.inf:
            raise ModelFileError(f"{path}: entry {event!r} has horizon {_shown(horizon)} s, "
                                 "not a finite number of seconds above 0")
        _check_classifier(path, event, entry["model"])


def _check_sklearn_version(path: Path, meta: Any) -> None:
    """:class:`ModelFileError` when the meta ``foreshock train`` wrote names another scikit-learn than
    this one. (A meta that is not that JSON object says nothing here: the classifiers' own versions
    are checked as they are unpacked, :func:`_parsed_model`.)"""
    import sklearn

    try:
        info = json.loads(meta) if type(meta) is str else None
    except ValueError:
        return
    if type(info) is not dict or "sklearn" not in info:
        return
    if type(info["sklearn"]) is not str or info["sklearn"] != sklearn.__version__:
        raise _version_refusal(path, info["sklearn"])


def model_telemetry(path: str | Path, doc: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The entity kinds the model was trained on (:data:`MODEL_TELEMETRY_KEY`), None where its
    file does not say (written before they were recorded, or a meta that is not ``train``'s JSON);
    :class:`ModelFileError` where it says something else than a list of the kinds features read."""
    try:
        info = json.loads(doc.get("meta") or "{}")
    except (TypeError, ValueError):
        return None
    if type(info) is not dict or MODEL_TELEMETRY_KEY not in info:
        return None
    kinds = info[MODEL_TELEMETRY_KEY]
    if (type(kinds) is not list or not kinds or not all(type(k) is str for k in kinds)
            or set(kinds) - set(FeatureDetector.kinds) or "gpu" not in kinds):
        raise ModelFileError(f"{path}: trained on telemetry {_shown(kinds)}, not a list of the kinds the "
                             f"features read ({', '.join(FeatureDetector.kinds)}, gpu among them)")
    return tuple(k for k in FeatureDetector.kinds if k in kinds)


def telemetry_mismatch(path: str | Path, trained: tuple[str, ...] | None, served: Sequence[str],
                       racks_without_inlet: bool = False) -> str | None:
    """Why a model trained on the telemetry ``trained`` may not be served ``served`` (what its feature
    stream will read in this run: ``foreshock.detectors.train.fed_kinds``, "rack" where the racks give
    an inlet), or None where they agree or the file does not say. ``racks_without_inlet``: the run
    feeds rack frames that give none (PDU power alone), said so where the served inlets are the proxy's."""
    if trained is None or set(trained) == set(served):
        return None

    def said(kinds: Sequence[str], note: bool = False) -> str:
        if "gpu" not in kinds:
            return "no GPU telemetry" + (" (rack telemetry alone)" if "rack" in kinds else "")
        if "rack" not in kinds:
            return ("GPU telemetry alone (inlets from the GPUs' proxy" +
                    ("; its rack frames give no inlet or coolant temperature" if note else "") + ")")
        return "GPU and rack telemetry (the racks' inlets and coolant)"
    if "gpu" not in served:  # nothing to train on: the features read the GPUs
        fix = "feed it GPU telemetry (name gpu in --telemetry)"
    elif "rack" not in served:
        fix = "train one on what this run feeds (`foreshock train REC... --telemetry gpu,job --out MODEL`)"
    else:  # (`train --telemetry gpu,job` had left the racks out: trained without --telemetry, it reads them)
        fix = ("train one without --telemetry (`foreshock train REC... --out MODEL`), or run this with "
               "--telemetry gpu,job")
    return (f"{path} was trained on {said(trained)}, this run feeds {said(served, racks_without_inlet)}: its "
            f"features would not mean what they meant in training; {fix}")


def _is_number(value: Any) -> bool:
    """An int or a float (not a bool, not NaN): what a threshold or a horizon may be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _check_classifier(path: Path, event: str, model: Any) -> None:
    """:class:`ModelFileError` unless ``model`` is a fitted HistGradientBoostingClassifier of the
    two classes [0, 1] on our features, whose ``predict_proba`` is safe to run.

    scikit-learn's compiled tree walk does no bounds checks: a node whose child or feature
    number was edited reads out of bounds (a segfault), a node pointing back at itself loops for
    ever. So every node is checked — a split's children come after it and inside the array (so a
    walk ends at a leaf), it splits on one of our features and not on categories (ours are all
    numbers), a leaf's value is finite — and so is every other value ``predict_proba`` reads
    (scikit-learn 1.9: ``_raw_predict``, ``_predict_iterations``, ``TreePredictor.predict``,
    ``HalfBinomialLoss.predict_proba``). No object on that path may keep an attribute that
    hides a method: a trusted numpy ufunc stored as ``predict_proba`` would be called."""
    from sklearn._loss.link import LogitLink
    from sklearn._loss.loss import HalfBinomialLoss
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.ensemble._hist_gradient_boosting.binning import _BinMapper
    from sklearn.ensemble._hist_gradient_boosting.common import PREDICTOR_RECORD_DTYPE
    from sklearn.ensemble._hist_gradient_boosting.predictor import TreePredictor

    def refused(why: str) -> ModelFileError:
        return ModelFileError(f"{path}: {event!r} classifier {why}; it was not written by `foreshock train` "
                              "or has been tampered with")

    methods: dict[type, set[str]] = {}

    def attributes(obj: Any, cls: type, what: str) -> dict[str, Any]:
        """``obj``'s own attributes, once it is exactly a ``cls`` hiding none of its methods."""
        if type(obj) is not cls:
            raise refused(f"has a {type(obj).__module__}.{type(obj).__qualname__} as {what}, not a {cls.__name__}")
        own = vars(obj)
        hiding = set(own) & methods.setdefault(cls, set(dir(cls)))
        if hiding:
            raise refused(f"stores {sorted(hiding)} on its {what}, hiding the class's own")
        return own

    def array(value: Any, what: str, dtype: Any, ndim: int) -> np.ndarray:
        if type(value) is not np.ndarray or value.dtype != dtype or value.ndim != ndim:
            raise refused(f"has {what} {_shown(value)}, not a {ndim}-d {np.dtype(dtype)} array")
        return value

    if type(model) is not HistGradientBoostingClassifier:
        raise refused(f"is a {type(model).__module__}.{type(model).__qualname__}, not a HistGradientBoostingClassifier")
    state = attributes(model, HistGradientBoostingClassifier, "classifier")
    if "_predictors" not in state:
        raise refused("is not fitted")
    n_features = len(FEATURES)
    if type(state.get("n_features_in_")) is not int or state["n_features_in_"] != n_features:
        raise refused(f"takes {_shown(state.get('n_features_in_'))} features, expected {n_features}")
    if type(state.get("n_trees_per_iteration_")) is not int or state["n_trees_per_iteration_"] != 1:
        raise refused(f"has {_shown(state.get('n_trees_per_iteration_'))} trees per iteration, not 1 (two classes)")
    classes = state.get("classes_")
    if type(classes) is not np.ndarray or classes.dtype.kind not in "iu" or classes.tolist() != [0, 1]:
        raise refused(f"predicts the classes {_shown(classes)}, not [0, 1]")
    if "_in_fit" in state or "_preprocessor" not in state or state["_preprocessor"] is not None:
        raise refused("is mid-fit or takes categorical features")  # predict would take another path
    baseline = array(state.get("_baseline_prediction"), "baseline", np.float64, 2)
    if baseline.shape != (1, 1) or not np.isfinite(baseline).all():
        raise refused(f"has baseline {_shown(baseline)}, not one finite number")
    loss = attributes(state.get("_loss"), HalfBinomialLoss, "loss")
    attributes(loss.get("link"), LogitLink, "link")
    categorical = array(attributes(state.get("_bin_mapper"), _BinMapper, "binner").get("is_categorical_"),
                        "categorical marks", np.uint8, 1)
    if categorical.shape != (n_features,) or categorical.any():
        raise refused(f"has categorical marks {_shown(categorical)}, not {n_features} zeros")
    iterations = state["_predictors"]
    if type(iterations) is not list or not iterations:
        raise refused("has no trees")
    for i, trees in enumerate(iterations):
        if type(trees) is not list or len(trees) != 1:
            raise refused(f"has {_shown(trees)} at iteration {i}, not a list of one tree")
        tree = attributes(trees[0], TreePredictor, f"tree {i}")
        for name in ("binned_left_cat_bitsets", "raw_left_cat_bitsets"):
            bits = array(tree.get(name), f"tree {i}'s {name}", np.uint32, 2)
            if bits.shape[1] != 8 or not bits.flags.c_contiguous:
                raise refused(f"has tree {i}'s {name} of shape {bits.shape}, not (n, 8) contiguous")
        nodes = array(tree.get("nodes"), f"tree {i}'s nodes", PREDICTOR_RECORD_DTYPE, 1)
        bad = _bad_node(nodes, n_features)
        if bad is not None:
            raise refused(f"has at tree {i}, node {bad[0]}, {bad[1]}")


def _bad_node(nodes: np.ndarray, n_features: int) -> tuple[int, str] | None:
    """The first node of a tree's node array (scikit-learn's ``PREDICTOR_RECORD_DTYPE``) that a
    walk from the root could not safely take, and why; ``None`` when every one is sound. A
    split's children must come after it (so no walk loops) and lie in the array (so none reads
    past it)."""
    if not len(nodes):
        return 0, "missing (an empty tree)"
    at = np.arange(len(nodes))
    split = nodes["is_leaf"] == 0
    left, right = nodes["left"].astype(np.int64), nodes["right"].astype(np.int64)
    feature = nodes["feature_idx"]
    for why, wrong in (
            ("a split with a child outside the tree or not after it",
             split & ((left <= at) | (right <= at) | (left >= len(nodes)) | (right >= len(nodes)))),
            (f"a split on a feature outside our {n_features}", split & ((feature < 0) | (feature >= n_features))),
            ("a split on categories", split & (nodes["is_categorical"] != 0)),
            ("a leaf value that is not finite", ~split & ~np.isfinite(nodes["value"]))):
        if wrong.any():
            return int(np.argmax(wrong)), why
    return None


class SklearnDetector(ScoredBaseline):
    """A trained classifier per event: P(event within its horizon) from the feature stream."""

    name: ClassVar[str] = "sklearn"

    def __init__(self, topology: Topology, health: PipelineHealth | None = None,
                 model_path: str | None = None, threshold: float | None = None) -> None:
        super().__init__(topology, health)
        if model_path is None:
            raise ModelFileError("the sklearn detector needs a model file: pass model_path "
                                 "(train one with `foreshock train`)")
        # the file's thresholds are held to this by the loader; one given here (`--param
        # sklearn.threshold=nan`, or 1.5) had been taken as it was, and the set never alarmed, silently
        if threshold is not None and not (_is_number(threshold) and 0.0 < threshold < 1.0):
            raise ValueError(f"threshold {_shown(threshold)} is not a probability strictly between 0 and 1 (the "
                             "set alarms at P >= it)")
        doc = load_model(model_path)
        self.model_path = str(model_path)
        self.events = tuple(doc["events"])
        self.models = [doc["events"][e]["model"] for e in self.events]
        self.horizons = [float(doc["events"][e].get("horizon_s", 1800.0)) for e in self.events]
        thr = [float(threshold if threshold is not None else doc["events"][e].get("threshold", 0.5))
               for e in self.events]
        self.levels = np.array(thr)
        self.s_alarm = new_alarm_columns(topology.size("gpu"), len(self.events))

    def alarm_rule(self) -> tuple[tuple[tuple[str, ...], ...], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        k = len(self.events)
        return (tuple((e,) for e in self.events), self.levels, np.full(k, SKLEARN_OFF_RATIO), np.zeros(k),
                SKLEARN_TIMING)

    def _decide(self, obs: np.ndarray, feats: np.ndarray) -> list[Finding]:
        if not len(obs):
            return []
        scores = np.full((len(obs), len(self.models)), np.nan)
        valid = np.isfinite(feats[:, 0])
        if valid.any():
            # One OpenMP thread: scikit-learn's OpenMP pool was seen to deadlock inside
            # predict_proba in a long-lived process that had used other thread pools (Numba,
            # faust); batches here are small, so one thread costs nothing.
            with threadpool_limits(limits=1, user_api="openmp"):
                for k, model in enumerate(self.models):
                    scores[valid, k] = model.predict_proba(feats[valid])[:, 1]
        if self.score_log is not None:
            self.score_log.add(obs, scores)
        out = np.empty((len(obs) * len(self.models), OUT_SIZE))
        n = _score_alarms(obs, np.ascontiguousarray(scores), self.s_alarm, self.levels,
                          self.levels * SKLEARN_OFF_RATIO, SKLEARN_TIMING, out)
        return self._predictions(obs, out[:n], tuple(f"P({e} within {h:.0f} s) = {{0:.2f}}"
                                                     for e, h in zip(self.events, self.horizons)),
                                 self.horizons)
