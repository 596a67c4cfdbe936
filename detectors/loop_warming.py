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

- the inlet a GPU reads (:class:`~.baselines.FeatureStream`: its rack's inlet, else the median
  of its rack's nodes' proxies, ``T - R_nominal * P``) has a **baseline**: its average over
  ``tau_base_s``, learnt only while the GPU works at a steady power (utilisation ≥ ``util_on``,
  |power slope| < ``steady_power_w_per_min``, |inlet slope| < ``steady_inlet_c_per_min``). The
  inlet the GPUs imply reads ~4 °C lower idle than at work: a baseline learnt from idle readings
  took every job start for a 4 °C rise with the dies climbing (35-77 false alarms per 1000
  GPU-h on seeds 33, 34 and 791). The baseline keeps the power it was learnt at too, and a GPU is
  scored only within ``power_band`` of it; at steady work at another power the baseline starts
  over there. The inlet the proxy implies moves with the power wherever a board's resistance is
  not the nominal one (``(R - R_nominal)·ΔP``): a rack's job stepping from 450 to 700 W on boards
  20 % over nominal read as its loop losing flow, every GPU predicted (until 2026-12-04);
- a GPU at work is predicted to throttle when its inlet stands ``rise_on_c`` over that baseline
  and the inlet, the die and the HBM all rise at ``rising_c_per_min`` or more, the die no faster
  than ``die_per_inlet_max`` times the inlet (work starting moves the die ten times faster than
  the inlet it implies; a coolant rise, about as fast). Its ETA is the die's margin to its limit
  at the die's present rate (at most ``horizon_s``).

Figures (GPU telemetry alone, seeds 21 / 33 / 34 / 791, the cooling-loss throttles; recall /
precision / median lead): 0.98 / 1.00 / 5.7 min, 0.96 / 0.98 / 6.8 min, 0.96 / 0.97 / 6.0 min,
0.97 / 0.88 / 6.6 min, where the thermal detector gives 1.3-1.8 min. Like the flow-based forecast
with rack frames it calls a loss mid-rise, so a loss that stops short (791: a 9.9 % floor) costs
precision as it costs the thermal detector's.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from foreshock.findings import Finding, Prediction
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .alarm import CODE_WITHDRAW, O_CODE, O_CONF, O_ROW, OUT_SIZE, new_alarm_columns
from .base import add_columns, resolve_params
from .baselines import FEATURES, FeatureDetector, _score_alarms
from .thermal_fit import repeat_free_runs

PARAMS: dict[str, float] = {
    "tau_base_s": 3600.0,  # the inlet's baseline: its average at steady work over this
    "util_on": 0.5,  # a GPU at work
    "steady_power_w_per_min": 20.0,  # steady work: the power moves less than this ...
    "steady_inlet_c_per_min": 0.2,  # ... and the inlet less than this
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
B_SIZE = 3


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
        rise = np.full(len(obs), np.nan)
        # a frame may hold several ticks of one GPU: it is cut into runs in which no GPU repeats (as
        # the thermal fit cuts it), so each baseline steps through its own rows in order
        ends = np.empty(len(obs) + 1, np.int64)
        n_runs = repeat_free_runs(obs[:, 1], np.full(len(self.s_base), -1, np.int64), 0, ends)
        lo = 0
        for hi in ends[:n_runs].tolist():
            rise[lo:hi] = self._step(obs[lo:hi], feats[lo:hi])
            lo = hi
        p = self.params
        inlet_rate = np.nan_to_num(feats[:, F["inlet_slope_c_per_min"]])
        die_rate = np.nan_to_num(feats[:, F["temp_slope_c_per_min"]])
        rising = ((inlet_rate >= p["rising_c_per_min"]) & (die_rate >= p["rising_c_per_min"])
                  & (np.nan_to_num(feats[:, F["hbm_slope_c_per_min"]]) >= p["rising_c_per_min"])
                  & (die_rate <= p["die_per_inlet_max"] * inlet_rate)
                  & (np.nan_to_num(feats[:, F["util"]]) >= p["util_on"]))
        # scored where the GPU reads an inlet; not firing (0) unless rising over a known baseline
        score = np.where(np.isfinite(feats[:, F["inlet_c"]]), np.where(rising & np.isfinite(rise), rise, 0.0), np.nan)
        out = np.empty((len(obs), OUT_SIZE))
        n = _score_alarms(obs, np.ascontiguousarray(score[:, None]), self.s_alarm, self.level,
                          self.level * p["clear_ratio"], self.timing, out)
        return [self._prediction(obs, feats, rise, rec) for rec in out[:n]]

    def _step(self, obs: np.ndarray, feats: np.ndarray) -> np.ndarray:
        """One row per GPU: each inlet over its GPU's baseline (as it stood before this row), and
        the baseline stepped where the GPU works at a steady power."""
        p = self.params
        slots = obs[:, 1].astype(np.int64)
        ts, inlet, power = obs[:, 0], feats[:, F["inlet_c"]], feats[:, F["power_w"]]
        base = self.s_base[slots]
        # at the power its baseline was learnt at (a baseline saved without one: at none, until the
        # GPU's next steady work)
        near = np.abs(power - base[:, B_POWER]) <= p["power_band"] * base[:, B_POWER]
        rise = np.where(near, inlet - base[:, B_LEVEL], np.nan)
        steady = (np.isfinite(inlet) & (np.nan_to_num(feats[:, F["util"]]) >= p["util_on"])
                  & (np.abs(np.nan_to_num(feats[:, F["power_slope_w_per_min"]], nan=np.inf))
                     < p["steady_power_w_per_min"])
                  & (np.abs(np.nan_to_num(feats[:, F["inlet_slope_c_per_min"]], nan=np.inf))
                     < p["steady_inlet_c_per_min"]))
        steady &= np.isfinite(power)
        known = np.isfinite(base[:, B_LEVEL]) & near  # (steady at another power: it starts over there)
        dt = np.where(known, ts - base[:, B_TS], 0.0)
        share = np.where(known, 1.0 - np.exp(-np.clip(dt, 0.0, None) / p["tau_base_s"]), 1.0)
        level = np.where(known, base[:, B_LEVEL] + share * (inlet - base[:, B_LEVEL]), inlet)
        at_power = np.where(known, base[:, B_POWER] + share * (power - base[:, B_POWER]), power)
        self.s_base[slots[steady], B_LEVEL] = level[steady]
        self.s_base[slots[steady], B_TS] = ts[steady]
        self.s_base[slots[steady], B_POWER] = at_power[steady]
        return rise

    def _prediction(self, obs: np.ndarray, feats: np.ndarray, rise: np.ndarray, rec: np.ndarray) -> Prediction:
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
        reason = (f"the inlet it reads is {rise[row]:.1f} °C over its usual {f[F['inlet_c']] - rise[row]:.1f} °C and "
                  f"rising {f[F['inlet_slope_c_per_min']]:.1f} °C/min, the die {f[F['temp_slope_c_per_min']]:+.1f} "
                  f"°C/min {to_limit}: its cooling loop is losing flow")
        return Prediction(float(obs[row, 0]), "gpu", slot, self.events[0], eta, round(float(rec[O_CONF]), 3),
                          self.name, reason)
