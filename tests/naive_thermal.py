"""The thermal detector's naive per-sample reference (test_thermal, test_thermal_inlet_follow).

The kernel predicts on each run of a frame's rows after the shared fit, solves the forecast every
forecast_every_s and ages it between (computing a model's confidence there only where the
forecast is sure), and emits into a buffer. The reference takes one sample at a time, reads the
fit as it stood after that sample (a fit fed one-row frames), and restates the detector's rules;
the forecast itself (model_eta, observe_trend, the inlet helpers: references of their own in
test_thermal) is called, not restated. It keeps its state in the kernel's forecast columns, so the
two compare column by column.
"""

from __future__ import annotations

import math

import numpy as np

from foreshock import facts
from foreshock.detectors import thermal as th
from foreshock.detectors import thermal_fit as tf

from naive_refs import PerSample, naive_alarm_step, new_alarm


class NaiveThermal(PerSample):
    def __init__(self, topo):
        self.p = tf.params_vector({})
        self.fit = tf.ThermalFit(topo, self.p)
        self.rack_of = topo.gpu_rack
        n = topo.size("gpu")
        self.fc = th.new_forecast_state(n)
        # per GPU and model: the last forecast's ETA and whether it was sure, and the inlet source the
        # trend tracks read (the detector keeps the first two in F_FLAGS, next to F_FAR, and reads the
        # source's moves off the fit's rows: this reference keeps them as first written)
        self.eta = np.full((n, tf.N_MODELS), math.inf)
        self.sure = np.zeros((n, tf.N_MODELS), dtype=bool)
        self.trend_src = np.full(n, math.nan)
        self.own = {}  # (gpu, field) -> its own threshold as last reported (slowdown, max operating)
        self.alarm = [[new_alarm() for _ in range(tf.N_MODELS)] for _ in range(n)]
        self.found = []  # (ts, slot, event, active, eta, confidence)
        self.seen = {"due": 0, "start": 0, "refresh": 0, "withdraw": 0, "idle": 0, "hbm": 0, "via_hbm": 0,
                     "held": 0, "brake, not held": 0, "hold let go unread": 0, "unread": 0, "unread withdrawn": 0}
        # the inlet follow check and the bridged trend track (test_thermal_inlet_follow's inputs reach them)
        self.seen_follow = {"bridged": 0, "discounted": 0, "source restart": 0, "follow restart": 0}

    def follow_share(self, ts, i, temp):
        """The share of the inlet's own rise the dies confirm after GPU ``i``'s core reading
        ``temp``: the inlet lagged by the core's tau, the rise that gives the die (expected) and the
        rise the die showed less R times its filtered power's change (followed), both forgotten
        over inlet_follow_taus time constants; (followed + slack) / expected, within 0..1, and 1
        while expected is within slack (the fit's residual's root plus inlet_follow_slack_c). A
        reading missing is stepped over; one more than gap_s after the last starts the check over."""
        p, s, fc = self.p, self.fit.s_model, self.fc
        off = tf.G_SIZE + tf.CORE * tf.M_SIZE
        ul, rl, pf, tau = (s[i, c] for c in (tf.G_UL, off + tf.M_RL, off + tf.M_PF, off + tf.M_TAU))
        slack = p[tf.P_FOLLOW_SLACK] + math.sqrt(s[i, off + tf.M_RES])
        if -50.0 < temp < 200.0 and not any(map(math.isnan, (ul, rl, pf))):
            last_u_lag, dt = fc[i, th.F_U_LAG], ts - fc[i, th.F_FOLLOW_TS]
            if math.isnan(last_u_lag) or not dt <= p[tf.P_GAP] or (
                    abs(ul - last_u_lag) < th.FOLLOW_STEADY_C and not fc[i, th.F_EXPECTED] > slack):
                self.seen_follow["follow restart"] += 1
                expected, followed, u_lag = 0.0, 0.0, ul
            else:
                u_lag = last_u_lag + (1 - math.exp(-dt / tau)) * (ul - last_u_lag)
                keep = math.exp(-dt / (p[tf.P_FOLLOW_TAUS] * tau))
                expected = keep * fc[i, th.F_EXPECTED] + (u_lag - last_u_lag)
                followed = keep * fc[i, th.F_FOLLOWED] + (temp - fc[i, th.F_T_LAST]) - rl * (pf - fc[i, th.F_PF_LAST])
            fc[i, [th.F_U_LAG, th.F_EXPECTED, th.F_FOLLOWED, th.F_T_LAST, th.F_PF_LAST, th.F_FOLLOW_TS]] = \
                u_lag, expected, followed, temp, pf, ts
        if not fc[i, th.F_EXPECTED] > slack:
            return 1.0
        self.seen_follow["discounted"] += 1
        return min(max((fc[i, th.F_FOLLOWED] + slack) / fc[i, th.F_EXPECTED], 0.0), 1.0)

    def trusted_rate(self, i, rack, damp, share):
        """The forecast's inlet rate: the coolant flow's where it has dropped (or is back), else the
        inlet's own trend, a rise of it at ``share``."""
        p, s = self.p, self.fit.s_model
        du = th.flow_inlet_rate(s, i, rack, self.fit.s_rack, damp, p, p[tf.P_FLOW_CARRY])
        if not math.isnan(du):
            return du
        return s[i, tf.G_UB] * share if s[i, tf.G_UB] > 0.0 else s[i, tf.G_UB]

    def trend_weight(self, ts, i, m, tprev):
        """Model ``m``'s R trend smoothing weight for a reading at ``ts``: over the time since the
        track's last reading (readings missing between are stepped over), NaN (it starts over)
        where that is longer than gap_s or there is none."""
        p, fc = self.p, self.fc
        step = ts - fc[i, th.F_TREND_TS + m]
        fc[i, th.F_TREND_TS + m] = ts
        if not step <= p[tf.P_GAP]:
            return math.nan
        self.seen_follow["bridged"] += m == tf.CORE and math.isnan(tprev)  # the fit itself started over
        return 1 - math.exp(-step / p[tf.P_TREND_SMOOTH])

    def sample(self, ts, i, dt, tprev, c):
        p, s, fc, racks = self.p, self.fit.s_model, self.fc, self.fit.s_rack
        horizon = p[tf.P_HORIZON]
        rack = int(self.rack_of[i])
        damp = th.inlet_damping(rack, racks, p)
        if not s[i, tf.G_USRC] == self.trend_src[i]:  # another inlet source: the tracks and the check start over
            self.seen_follow["source restart"] += 1
            self.trend_src[i] = s[i, tf.G_USRC]
            fc[i, [th.F_U_LAG, th.F_EXPECTED, th.F_FOLLOWED]] = math.nan, 0.0, 0.0
            fc[i, th.F_TREND_TS:th.F_TREND_TS + tf.N_MODELS] = math.nan
        du = self.trusted_rate(i, rack, damp, self.follow_share(ts, i, c["gpu_temp"]))
        reasons = c["throttle_reasons"]
        if 0.0 <= reasons < 2.0 ** 40:
            bits = int(reasons)
            fc[i, th.F_BITS_TS] = ts
            idle = bool(bits & facts.THROTTLE_IDLE)
            # a thermal limiter: SW/HW thermal, or the HW slowdown bit unless a power brake raised it
            brake = bool(bits & facts.THROTTLE_HW_POWER_BRAKE)
            held = bool(bits & (facts.THROTTLE_SW_THERMAL | facts.THROTTLE_HW_THERMAL)) or \
                (bool(bits & facts.THROTTLE_HW_SLOWDOWN) and not brake)
            self.seen["brake, not held"] += brake and not held
            if not held:
                fc[i, th.F_HELD_SINCE] = math.nan
            elif math.isnan(fc[i, th.F_HELD_SINCE]):
                fc[i, th.F_HELD_SINCE] = ts  # held from this sample on
                self.seen["held"] += 1
        else:  # no reasons reported: no kernels running is idle
            if not ts - fc[i, th.F_BITS_TS] <= p[tf.P_REASONS_STALE]:  # unread for long: a hold is unknown
                self.seen["hold let go unread"] += not math.isnan(fc[i, th.F_HELD_SINCE])
                fc[i, th.F_HELD_SINCE] = math.nan
            idle = 0.0 <= c["util"] < th.IDLE_UTIL
        for name in ("slowdown_temp", "max_op_temp", "hbm_max_op_temp"):  # its own thresholds, kept once reported
            if 40.0 < c[name] < 130.0:
                self.own[i, name] = c[name]
        # the core's limit: its max operating temperature, else its slowdown less 2 °C, else 87 °C;
        # the HBM's: its memory max operating temperature, else 95 °C
        if (i, "max_op_temp") in self.own:
            limit_core = self.own[i, "max_op_temp"]
        elif (i, "slowdown_temp") in self.own:
            limit_core = self.own[i, "slowdown_temp"] - p[tf.P_SLOWDOWN_OFF]
        else:
            limit_core = p[tf.P_LIM_CORE]
        limit_hbm = self.own.get((i, "hbm_max_op_temp"), p[tf.P_LIM_HBM])
        since = ts - fc[i, th.F_EVAL_TS]
        due = not since < p[tf.P_EVERY]
        if due:
            fc[i, th.F_EVAL_TS] = ts
            self.seen["due"] += 1
        model = {}  # model -> (eta, confidence, firing, clear)
        for m, temp, limit in ((tf.CORE, c["gpu_temp"], limit_core), (tf.HBM, c["hbm_temp"], limit_hbm)):
            if not -50.0 < temp < 200.0:
                continue
            off, f = tf.G_SIZE + m * tf.M_SIZE, th.F_MODEL0 + m * th.F_MODEL_SIZE
            pf = s[i, off + tf.M_PF]
            r = (temp - s[i, tf.G_UL]) / pf if pf > p[tf.P_LOAD_MIN] else math.nan
            observed = th.observe_trend(fc, i, f, ts, self.trend_weight(ts, i, m, tprev), r, s[i, off + tf.M_TAU], p)
            conf = th.confidence_of(s, i, off, p)
            if due:
                eta, _, _, _, sure = th.model_eta(s, i, off, temp, limit, (damp, du), observed, p)
                if m == tf.HBM and eta <= horizon and th.hbm_held_by_core(s, i, du, damp, limit_core, limit, p):
                    eta, sure = math.inf, False
                self.eta[i, m], self.sure[i, m] = eta, sure
                # the clear test's ETA: past the horizon while an alarm it clears stands (the
                # throttle alarm reads both models', hbm_overheat the HBM's), solved out to
                # horizon * clear_factor
                far = eta
                if eta > horizon and (self.alarm[i][0]["active"] or (m == tf.HBM and self.alarm[i][1]["active"])):
                    far = th.model_reach(s, i, off, temp, limit, (damp, du), observed, p, horizon * p[tf.P_CLEAR])
                    if m == tf.HBM and far <= horizon * p[tf.P_CLEAR] and \
                            th.hbm_held_by_core(s, i, du, damp, limit_core, limit, p):
                        far = math.inf
                fc[i, th.F_FAR + m] = far
                fc[i, th.F_FLAGS] = sum((th.FL_SURE << k) * bool(self.sure[i, k])
                                        + (th.FL_ETA_INF << k) * (not self.eta[i, k] == fc[i, th.F_FAR + k])
                                        for k in range(tf.N_MODELS))
            else:  # the last forecast, aged
                eta, sure = max(self.eta[i, m] - since, 0.0), bool(self.sure[i, m])
                far = max(fc[i, th.F_FAR + m] - since, 0.0)
            model[m] = (eta, conf, sure and conf >= p[tf.P_CONF_MIN], not far <= horizon * p[tf.P_CLEAR])
        # thermal_throttle: the SW thermal limiter holds the core and the memory, each under its own
        # limit; the alarm follows whichever forecast fires (the earlier ETA if both or neither do),
        # steps only with a core reading, and idles with the GPU
        if tf.CORE in model:
            hbm = model.get(tf.HBM, (math.inf, math.nan, False, True))
            core = model[tf.CORE]
            via = tf.HBM if (hbm[2] and not core[2]) or (hbm[2] == core[2] and hbm[0] < core[0]) else tf.CORE
            eta, conf = (hbm if via == tf.HBM else core)[:2]
            firing, clear = core[2] or hbm[2], core[3] and hbm[3]
            if idle:
                firing, clear = False, True
                self.seen["idle"] += 1
            self.step(i, 0, ts, firing, clear, eta, conf, "thermal_throttle")
            self.seen["via_hbm"] += via == tf.HBM and firing
        else:
            self.unread(i, 0, ts, "thermal_throttle")
        if tf.HBM in model:
            eta, conf, firing, clear = model[tf.HBM]
            self.step(i, 1, ts, firing, clear, eta, conf, "hbm_overheat")
        else:
            self.unread(i, 1, ts, "hbm_overheat")

    def unread(self, i, k, ts, event):
        """No usable reading for alarm ``k``: a raised one stands down once none has come for
        off_hold_s; one not raised keeps its count of firing rows."""
        if self.alarm[i][k]["active"]:
            self.seen["unread"] += 1
            self.step(i, k, ts, False, True, math.inf, 0.0, event)
            self.seen["unread withdrawn"] += not self.alarm[i][k]["active"]

    def alarm_blocks(self):
        return self.alarm

    def silent_withdrawn(self, now, i, k):
        self.found.append((now, i, ("thermal_throttle", "hbm_overheat")[k], False, -1.0, 0.0))
        self.seen["silent"] = self.seen.get("silent", 0) + 1

    def step(self, i, k, ts, firing, clear, eta, conf, event):
        p = self.p
        code = naive_alarm_step(self.alarm[i][k], ts, firing, clear,
                                1.0 if eta <= p[tf.P_URGENT] else p[tf.P_ON], p[tf.P_OFF_HOLD], p[tf.P_REFRESH])
        if code is not None:
            self.found.append((ts, i, event, code != "withdraw", eta if math.isfinite(eta) else -1.0, round(conf, 3)))
            self.seen[code] += 1
            self.seen["hbm"] += event == "hbm_overheat"
