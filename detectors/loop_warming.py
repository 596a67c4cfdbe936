"""A cooling loop losing flow, read from the GPUs' own inlet: the five-minute warning that GPU
telemetry alone (dcgm-exporter: no rack inlet, no coolant flow) can give. Opt-in
(``--detectors``, and the ``foreshock+loop_warming`` set of ``foreshock evaluate``).

The thermal detector forecasts a GPU's temperature from the inlet where it is and waits for the
dies to close on their limit: from GPU telemetry alone it warns a cooling-loss throttle 1.2-1.9
minutes ahead. A scikit-learn model trained on the same telemetry warned 6-9 minutes ahead at the
same precision (docs/throttling.md, "The baselines set up as a careful user would"): it reads
the inlet the GPUs imply rising while their dies climb. This detector reads that signal as a
rule, relative to each GPU's own baseline (the model read the inlet as an absolute level, which
the simulator's identical racks teach and no real fleet would):

- the power and the inlet a GPU reads (:class:`~.baselines.FeatureStream`: its rack's inlet, else
  the median of its rack's nodes' proxies, ``T - R_nominal * P``) are read as their **means** over
  ``smooth_s``, weighted by time, and their rates as that mean less the mean over ``smooth_s +
  rate_span_s``, over ``rate_span_s``. The stream's own per-sample power and inlet carry a job's
  3-9 s steps at 1-s sampling (the inlet the proxy implies swung 17-30 °C, its slope ±5 °C/min, the
  power's 75 W/min median): judged on them, no row of a simulated cooling loss at 1 s was steady,
  and 11 of its 54 throttles were called, against 56 of 56 at 10 s (until 2026-12-05). The means
  read 1-s and 10-s sampling alike (±0.2 °C at work, both);
- that inlet has a **baseline**: its mean's average over ``tau_base_s``, learnt only while the GPU
  works at a steady power (utilisation ≥ ``util_on``, its mean power's rate under
  ``steady_power_w_per_min``, its mean inlet's under ``steady_inlet_c_per_min``). The
  inlet the GPUs imply reads ~4 °C lower idle than at work: a baseline learnt from idle readings
  took every job start for a 4 °C rise with the dies climbing (35-77 false alarms per 1000
  GPU-h on seeds 33, 34 and 791). The baseline keeps the power it was learnt at too, and a GPU is
  scored only within ``power_band`` of it; at steady work at another power the baseline starts
  over there. The inlet the proxy implies moves with the power wherever a board's resistance is
  not the nominal one (``(R - R_nominal)·ΔP``): a rack's job stepping from 450 to 700 W on boards
  20 % over nominal read as its loop losing flow, every GPU predicted (until 2026-12-04);
- a GPU at work is predicted to throttle when its mean inlet, carried forward by its rate over
  ``smooth_s`` (a mean lags a ramp by its time constant: half a minute of lead), stands
  ``rise_on_c`` over that baseline and the inlet, the die and the HBM all rise at
  ``rising_c_per_min`` or more, the die no faster than ``die_per_inlet_max`` times the inlet (work
  starting moves the die ten times faster than the inlet it implies; a coolant rise, about as
  fast). A GPU that has read no HBM temperature
  for :data:`HBM_UNREAD_S` (``DCGM_FI_DEV_MEMORY_TEMP`` not supported, the field dropped) is
  judged on its die and inlet alone: "HBM not read" was taken for "HBM not rising", and such a GPU
  was never predicted (0 of 56 throttles, until 2026-12-05). Its ETA is the die's margin to its
  limit at the die's present rate (at most ``horizon_s``).

Figures (GPU telemetry alone, seeds 21 / 33 / 34 / 791, the cooling-loss throttles; recall /
precision / median lead): 0.98 / 1.00 / 5.7 min, 0.96 / 0.98 / 6.8 min, 0.96 / 0.97 / 6.0 min,
0.97 / 0.88 / 6.6 min, where the thermal detector gives 1.3-1.8 min. Like the flow-based forecast
with rack frames it calls a loss mid-rise, so a loss that stops short (791: a 9.9 % floor) costs
precision as it costs the thermal detector's. Read on the means (2026-12-05), the GPU-only
evaluation of the 10-s recordings of seeds 34 / 51 / 21 (the ``foreshock+loop_warming`` set's
thermal recall / precision / median lead / false alarms per 1000 GPU-h) gives 0.99 / 0.985 / 6.0 min
/ 0.65, 0.97 / 1.00 / 6.5 min / 0, 1.00 / 1.00 / 5.9 min / 0 (6.3, 7.0 and 5.6 min before); the
simulator's cooling loss on 64 GPUs (seed 7) is warned of 56 of 56 at 1 s (8.5 min at the median)
as at 10 s (8.0 min), where the per-sample slopes had 48.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from foreshock.findings import Finding, Prediction
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .alarm import CODE_WITHDRAW, O_CODE, O_CONF, O_ROW, OUT_SIZE, new_alarm_columns
from .base import add_columns, resolve_params
from .baselines import F_SLOPE_GAP_S, FEATURES, FeatureDetector, _score_alarms
from .thermal_fit import repeat_free_runs

PARAMS: dict[str, float] = {
    "tau_base_s": 3600.0,  # the inlet's baseline: its average at steady work over this
    "util_on": 0.5,  # a GPU at work
    # the power and the inlet are read as their means over this (weighted by time: 1-s sampling
    # reads as 10-s does; at 1 s the stream's inlet swings with a job's 3-9 s power steps) ...
    "smooth_s": 30.0,
    "rate_span_s": 60.0,  # ... their rates as that mean less the mean over smooth_s + this, over this
    "steady_power_w_per_min": 20.0,  # steady work: the mean power moves less than this ...
    "steady_inlet_c_per_min": 0.2,  # ... and the mean inlet less than this
    "rise_on_c": 2.0,  # the inlet this far over its baseline ...
    "rising_c_per_min": 0.5,  # ... with the inlet, the die and the HBM rising at least this fast,
    # the die no faster than this many times the inlet: a coolant rise moves the die about as fast
    # as the inlet (2.4 against 2.2 °C/min on seed 21's losses); work starting on a node moves the
    # die ten times faster (seed 34's node96: +12.5 °C/min on an inlet 1.4 °C/min up)
    "die_per_inlet_max": 3.0,
    "clear_ratio": 0.8,  # the alarm clears below this share of rise_on_c
    "power_band": 0.15,  # scored within this share of the power its baseline was learnt at
    "on_count": 2.0,  # consecutive samples to start a prediction
    "off_hold_s": 120.0,  # below the clear level this long to withdraw it
    "refresh_s": 60.0,
    "horizon_s": 1800.0,  # the ETA is at most this far ahead
}
F = {name: i for i, name in enumerate(FEATURES)}
B_LEVEL, B_TS, B_POWER = 0, 1, 2  # per GPU: the inlet's baseline, when it was last taken in, its power
# the power's and the inlet's means (over smooth_s, and smooth_s + rate_span_s), when each was last
# read valid and since when it has averaged (a mean restarts after F_SLOPE_GAP_S unread, as a slope)
B_P_FAST, B_P_SLOW, B_P_AT, B_P_FROM = 3, 4, 5, 6
B_U_FAST, B_U_SLOW, B_U_AT, B_U_FROM = 7, 8, 9, 10
B_HBM_AT = 11  # when the GPU last read an HBM temperature
B_SIZE = 12
HBM_UNREAD_S = F_SLOPE_GAP_S
"""A GPU that has read no HBM temperature for this long is judged without it: the feature
stream holds the HBM's slope over a shorter gap, so a sensor that misses polls keeps its condition."""
# what _step judged, per row
J_RISE, J_RATE, J_USUAL, J_HBM = 0, 1, 2, 3
J_SIZE = 4


class LoopWarmingDetector(FeatureDetector):
    """A GPU's inlet rising over its own baseline while its dies climb: its loop is losing flow."""

    name: ClassVar[str] = "loop_warming"
    events = ("thermal_throttle",)
    slot_kinds: ClassVar[Mapping[str, str]] = {**FeatureDetector.slot_kinds, "s_base": "gpu"}

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, **params: float) -> None:
        super().__init__(topology, health)
        self.params = resolve_params(self.name, PARAMS, params)
        p = self.params
        self.s_base = np.full((topology.size("gpu"), B_SIZE), np.nan)
        self.s_alarm = new_alarm_columns(topology.size("gpu"), 1)
        self.level = np.array([p["rise_on_c"]])
        self.timing = np.array([p["on_count"], p["off_hold_s"], p["refresh_s"]])

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """... and ``s_base`` saved before its power (``B_POWER`` NaN: the GPU scored again from its
        next steady work, its baseline started over there)."""
        return add_columns(super().upgrade_state(state), "s_base", B_SIZE)

    def _decide(self, obs: np.ndarray, feats: np.ndarray) -> list[Finding]:
        if not len(obs):
            return []
        judged = np.full((len(obs), J_SIZE), np.nan)
        # a frame may hold several ticks of one GPU: it is cut into runs in which no GPU repeats (as
        # the thermal fit cuts it), so each baseline steps through its own rows in order
        ends = np.empty(len(obs) + 1, np.int64)
        n_runs = repeat_free_runs(obs[:, 1], np.full(len(self.s_base), -1, np.int64), 0, ends)
        lo = 0
        for hi in ends[:n_runs].tolist():
            judged[lo:hi] = self._step(obs[lo:hi], feats[lo:hi])
            lo = hi
        p = self.params
        rise = judged[:, J_RISE]
        inlet_rate = np.nan_to_num(judged[:, J_RATE])
        die_rate = np.nan_to_num(feats[:, F["temp_slope_c_per_min"]])
        # the HBM's condition where the GPU reads its HBM (an unread HBM is no HBM not rising)
        hbm = (np.nan_to_num(feats[:, F["hbm_slope_c_per_min"]]) >= p["rising_c_per_min"]) | (judged[:, J_HBM] == 0.0)
        rising = ((inlet_rate >= p["rising_c_per_min"]) & (die_rate >= p["rising_c_per_min"]) & hbm
                  & (die_rate <= p["die_per_inlet_max"] * inlet_rate)
                  & (np.nan_to_num(feats[:, F["util"]]) >= p["util_on"]))
        # scored where the GPU reads an inlet; not firing (0) unless rising over a known baseline
        score = np.where(np.isfinite(feats[:, F["inlet_c"]]), np.where(rising & np.isfinite(rise), rise, 0.0), np.nan)
        out = np.empty((len(obs), OUT_SIZE))
        n = _score_alarms(obs, np.ascontiguousarray(score[:, None]), self.s_alarm, self.level,
                          self.level * p["clear_ratio"], self.timing, out)
        return [self._prediction(obs, feats, judged, rec) for rec in out[:n]]

    def _step(self, obs: np.ndarray, feats: np.ndarray) -> np.ndarray:
        """One row per GPU: the power's and the inlet's means stepped, and per row (``J_*``) the
        mean inlet over its GPU's baseline (as it stood before this row), the mean inlet's rate, the
        baseline, and whether the GPU reads its HBM (1) or has read none for :data:`HBM_UNREAD_S`
        (0); the baseline stepped where the GPU works at a steady power."""
        p = self.params
        slots = obs[:, 1].astype(np.int64)
        ts = obs[:, 0]
        power, power_rate = self._smooth(slots, ts, feats[:, F["power_w"]], B_P_FAST)
        inlet, inlet_rate = self._smooth(slots, ts, feats[:, F["inlet_c"]], B_U_FAST)
        hbm_at = np.where(np.isfinite(feats[:, F["hbm_temp"]]), ts, self.s_base[slots, B_HBM_AT])
        self.s_base[slots, B_HBM_AT] = hbm_at
        base = self.s_base[slots]
        # at the power its baseline was learnt at (a baseline saved without one: at none, until the
        # GPU's next steady work)
        near = np.abs(power - base[:, B_POWER]) <= p["power_band"] * base[:, B_POWER]
        # the mean inlet where the inlet is now (a mean lags a ramp by its time constant, smooth_s)
        now = inlet + np.nan_to_num(inlet_rate) * p["smooth_s"] / 60.0
        rise = np.where(near, now - base[:, B_LEVEL], np.nan)
        steady = (np.isfinite(feats[:, F["inlet_c"]]) & np.isfinite(feats[:, F["power_w"]])
                  & (np.nan_to_num(feats[:, F["util"]]) >= p["util_on"])
                  & (np.abs(np.nan_to_num(power_rate, nan=np.inf)) < p["steady_power_w_per_min"])
                  & (np.abs(np.nan_to_num(inlet_rate, nan=np.inf)) < p["steady_inlet_c_per_min"]))
        known = np.isfinite(base[:, B_LEVEL]) & near  # (steady at another power: it starts over there)
        dt = np.where(known, ts - base[:, B_TS], 0.0)
        share = np.where(known, 1.0 - np.exp(-np.clip(dt, 0.0, None) / p["tau_base_s"]), 1.0)
        level = np.where(known, base[:, B_LEVEL] + share * (inlet - base[:, B_LEVEL]), inlet)
        at_power = np.where(known, base[:, B_POWER] + share * (power - base[:, B_POWER]), power)
        self.s_base[slots[steady], B_LEVEL] = level[steady]
        self.s_base[slots[steady], B_TS] = ts[steady]
        self.s_base[slots[steady], B_POWER] = at_power[steady]
        judged = np.empty((len(obs), J_SIZE))
        judged[:, J_RISE] = rise
        judged[:, J_RATE] = inlet_rate
        judged[:, J_USUAL] = base[:, B_LEVEL]
        judged[:, J_HBM] = (ts - hbm_at <= HBM_UNREAD_S).astype(np.float64)  # (NaN: never read)
        return judged

    def _smooth(self, slots: np.ndarray, ts: np.ndarray, x: np.ndarray, col: int) -> tuple[np.ndarray, np.ndarray]:
        """``x`` (one row per GPU) read into its GPU's means (``s_base`` columns ``col`` on: the
        means over ``smooth_s`` and over ``smooth_s + rate_span_s``, when last read valid, since
        when averaged); returns the mean over ``smooth_s`` and the rate per minute, NaN until the
        means average ``rate_span_s``. The means are weighted by time, so 1-s and 10-s sampling
        read a signal alike; for a ramp they lag it by their time constants, so their difference
        over ``rate_span_s`` is its rate. A value unread for :data:`~.baselines.F_SLOPE_GAP_S`
        (or never read) restarts its means; a missing one (NaN) leaves them as they stand."""
        p = self.params
        fast, slow, at, since = col, col + 1, col + 2, col + 3
        s = self.s_base[slots]
        read = np.isfinite(x)
        dt = ts - s[:, at]
        restart = read & ~(dt <= F_SLOPE_GAP_S) | read & ~np.isfinite(s[:, fast])
        step = read & ~restart & (dt > 0.0)
        dt = np.where(step, dt, 0.0)
        s[:, fast] = np.where(step, s[:, fast] + (1.0 - np.exp(-dt / p["smooth_s"])) * (x - s[:, fast]), s[:, fast])
        s[:, slow] = np.where(step, s[:, slow] + (1.0 - np.exp(-dt / (p["smooth_s"] + p["rate_span_s"])))
                              * (x - s[:, slow]), s[:, slow])
        s[restart, fast] = s[restart, slow] = x[restart]
        s[restart, since] = ts[restart]
        s[read, at] = np.maximum(ts[read], np.nan_to_num(s[read, at], nan=-np.inf))
        self.s_base[slots] = s
        filled = ts - s[:, since] >= p["rate_span_s"]
        rate = np.where(filled, (s[:, fast] - s[:, slow]) / p["rate_span_s"] * 60.0, np.nan)
        return s[:, fast], rate

    def _prediction(self, obs: np.ndarray, feats: np.ndarray, judged: np.ndarray, rec: np.ndarray) -> Prediction:
        row = int(rec[O_ROW])
        slot = int(obs[row, 1])
        if int(rec[O_CODE]) == CODE_WITHDRAW:
            return Prediction(float(obs[row, 0]), "gpu", slot, self.events[0], float(self.params["horizon_s"]),
                              round(float(rec[O_CONF]), 3), self.name,
                              "the inlet no longer rising over its baseline with the dies",
                              active=False)
        f = feats[row]
        margin, rate = f[F["core_margin_c"]], f[F["temp_slope_c_per_min"]]
        # a poll without the die's reading (its slopes are held, so the row still scores): the
        # horizon, as where the die is not rising; its NaN ETA had been exported as "no finite
        # forecast" and kept by the store as a finding that never lapses
        known = bool(np.isfinite(margin) and np.isfinite(rate))
        eta = float(np.clip(margin / rate * 60.0, 0.0, self.params["horizon_s"])) if known and rate > 0 \
            else float(self.params["horizon_s"])
        to_limit = f"with {margin:.0f} °C to its limit" if known else "its temperature not read this poll"
        j = judged[row]
        hbm = "" if j[J_HBM] else \
            f" (no HBM temperature read for {HBM_UNREAD_S / 60:.0f} min: judged on the die and inlet)"
        reason = (f"the inlet it reads is {j[J_RISE]:.1f} °C over its usual {j[J_USUAL]:.1f} °C and "
                  f"rising {j[J_RATE]:.1f} °C/min, the die {f[F['temp_slope_c_per_min']]:+z.1f} "
                  f"°C/min {to_limit}{hbm}: its cooling loop is losing flow")
        return Prediction(float(obs[row, 0]), "gpu", slot, self.events[0], eta, round(float(rec[O_CONF]), 3),
                          self.name, reason)
