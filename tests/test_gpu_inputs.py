"""Inputs shared by the per-GPU detectors (detectors/gpu_inputs.py): the throttle-reasons parser and
the rack state (inlet, coolant flow, heat, the loop's learnt time constant and rise)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import gpu_inputs as gi
from foreshock.detectors.gpu_inputs import REASON_BITS_LIMIT, reason_bits, reason_bits_column

from naive_refs import branches_seen

VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.integers(0, 2 ** 41).map(float),
                   st.sampled_from([0.0, 1.0, 0x24, -1.0, REASON_BITS_LIMIT - 1, REASON_BITS_LIMIT]))


@pytest.mark.kernel
@settings(deadline=None)  # the first call compiles the kernel
@given(st.lists(VALUES, max_size=40))
def test_the_column_parser_reads_every_value_as_the_kernels_do(values):
    """Harness code parses a frame's column at once; kernels parse a sample at a time: one rule."""
    got = reason_bits_column(np.array(values, dtype=float))
    assert got.dtype == np.int64
    assert list(got) == [reason_bits(v) for v in values]


def test_values_that_are_not_a_bitmask_read_as_missing():
    got = reason_bits_column(np.array([np.nan, -4.0, np.inf, 2.0 ** 40, 2.0 ** 40 - 1, 0x24]))
    assert list(got) == [-1, -1, -1, -1, 2 ** 40 - 1, 0x24]


# ---- the rack kernel vs a naive reference -------------------------------------------------------
class NaiveRack:
    """One rack's state from its rows, restated from the model: the latest inlet; the heat over
    20 s and 180 s (the PDU's, else the GPUs' once the PDU is silent, never one average over both);
    the flow, its trend and its baseline (with the inlet at baseline); a loss, and the loop's coolant
    rise learnt where one settles (with the heat it was learnt at); the loop's time constant from
    consecutive windows of the inlet settling."""

    def __init__(self):
        self.v = dict.fromkeys(("ts", "inlet", "u1", "u2", "u1_ts", "damp", "flow", "flow0", "u0", "rise",
                                "flow_slope", "f1", "heat", "heat_slow", "rise_heat", "held", "held_ts",
                                "shifts", "flow_ts", "flow_held", "flow0_new", "flow0_before", "flow0_trial_end",
                                "heat_src", "heat_ts", "heat_floor"), math.nan)
        self.v.update(damp_n=0.0, rise_n=0.0, loss=0.0)
        self.seen = {"rise learnt": 0, "loop tau learnt": 0, "recovered": 0, "late": 0, "not an inlet": 0,
                     "jump held": 0, "level shift": 0, "flow jump held": 0, "flow jump undone": 0,
                     "flow jump kept": 0, "heat from the gpus": 0, "heat source switched": 0, "rise too small": 0,
                     "baseline unfelt": 0}

    def settled(self, inlet):
        u1, u2 = self.v["u1"], self.v["u2"]
        return abs(u1 - u2) < gi.SETTLED_C and abs(inlet - u1) < gi.SETTLED_C  # False with a NaN

    def row(self, ts, inlet, flow, heat, gpu_heat=math.nan, gpu_floor=math.nan):
        v = self.v
        if not 0.0 < inlet < 1e6:  # above freezing (0: a failed read), else no reading (NaN too)
            self.seen["not an inlet"] += 1
            return
        if v["ts"] > ts:
            self.seen["late"] += 1
            return
        to_held = abs(inlet - v["held"])
        if to_held <= max(gi.INLET_JUMP_C, gi.INLET_JUMP_RATE_C_PER_S * (ts - v["held_ts"])) \
                and to_held < abs(inlet - v["inlet"]):  # near the held jump, nearer than the last
            v["shifts"] = 1.0 if math.isnan(v["shifts"]) else v["shifts"] + 1  # confirmed: another level
            self.seen["level shift"] += 1
        elif abs(inlet - v["inlet"]) > max(gi.INLET_JUMP_C, gi.INLET_JUMP_RATE_C_PER_S * (ts - v["ts"])):
            v["held"], v["held_ts"] = inlet, ts  # a jump no loop makes: held back for a reading
            self.seen["jump held"] += 1
            return
        v["held"] = math.nan
        dt = ts - v["ts"]
        v["ts"], v["inlet"] = ts, inlet
        self.heat(ts, dt, heat, gpu_heat, gpu_floor)
        if self.flow(ts, dt, inlet, flow):
            v["flow_ts"] = ts
        self.loop_tau(ts, inlet)

    @staticmethod
    def smooth(old, x, dt, tau):
        w = 1 - math.exp(-dt / tau) if dt > 0 else 1.0
        return x if math.isnan(old) else old + w * (x - old)

    @staticmethod
    def one_level(a, b):
        return a >= gi.FLOW_NOMINAL * b and b >= gi.FLOW_NOMINAL * a

    def forget_rise(self):
        self.v.update(rise=math.nan, rise_n=0.0, rise_heat=math.nan)

    def heat(self, ts, dt, pdu, gpus, gpus_floor):
        v = self.v
        if pdu > 0:
            src, heat, floor = "pdu", pdu, 0.0
        elif gpus > 0 and (v["heat_src"] != "pdu" or ts - v["heat_ts"] > gi.HEAT_SOURCE_STALE_S):
            src, heat, floor = "gpus", gpus, gpus_floor  # no PDU, or one silent for minutes
            self.seen["heat from the gpus"] += 1
        else:
            return
        if v["heat_src"] in ("pdu", "gpus") and v["heat_src"] != src:  # start over on the new source
            v["heat"] = v["heat_slow"] = math.nan
            self.forget_rise()
            self.seen["heat source switched"] += 1
        v.update(heat_src=src, heat_ts=ts, heat_floor=floor)
        v["heat"] = self.smooth(v["heat"], heat, dt, gi.HEAT_TAU_S)
        v["heat_slow"] = self.smooth(v["heat_slow"], heat, dt, gi.HEAT_SLOW_TAU_S)

    def flow(self, ts, dt, inlet, flow):
        """Whether ``flow`` was read."""
        v = self.v
        if not 0 <= flow < math.inf:
            return False
        f0 = v["flow0"]
        undone = False
        if not math.isnan(v["flow0_before"]):  # a baseline a jump raised, on trial
            if not ts < v["flow0_trial_end"]:
                v["flow0_before"] = math.nan  # it held
                self.seen["flow jump kept"] += 1
            elif gi.FLOW_NOMINAL * flow <= v["flow0_before"] and inlet - v["u0"] < gi.RECOVERED_C:
                f0 = v["flow0"] = v["flow0_before"]  # back at the one before (or under), the loop no warmer: undone
                v["flow0_before"], undone = math.nan, True
                self.seen["flow jump undone"] += 1
        seeded = not math.isnan(f0) and not v["flow0_new"] == 1.0  # a baseline a second reading confirmed
        moved = False
        if seeded and flow > gi.FLOW_JUMP * f0:
            if not self.one_level(flow, v["flow_held"]):
                v["flow_held"] = flow  # held back for a reading
                self.seen["flow jump held"] += 1
                return False
            moved = True
        if seeded:
            v["flow_held"] = math.nan
        if not math.isnan(v["flow"]) and dt > 0:
            v["flow_slope"] = self.smooth(v["flow_slope"], (flow - v["flow"]) / dt, dt, gi.FLOW_SLOPE_TAU_S)
        if undone:
            v["flow_slope"] = math.nan
        v["flow"] = flow
        if not seeded and not self.one_level(flow, f0):  # no baseline yet, or the first reading disagreed
            if flow > 0:
                if not math.isnan(f0):
                    v["flow_slope"] = math.nan
                v["flow0"], v["u0"], v["flow0_new"] = flow, inlet, 1.0
            return True
        v["flow0_new"] = 0.0
        if moved:  # a confirmed jump: the baseline moves there, the rise learnt at the old one forgotten
            if math.isnan(v["flow0_before"]):  # on trial (a jump upon a jump keeps the first one's)
                v["flow0_before"], v["flow0_trial_end"] = f0, ts + gi.FLOW_TRIAL_S
            f0 = v["flow0"] = flow
            self.forget_rise()
        if flow >= gi.FLOW_NOMINAL * f0:
            if v["loss"]:
                if inlet - v["u0"] < gi.RECOVERED_C or self.settled(inlet):
                    v["loss"] = 0.0
                    self.seen["recovered"] += 1
            elif dt > 0:  # nominal: the baseline follows slow changes
                w = 1 - math.exp(-dt / gi.BASELINE_TAU_S)
                v["flow0"], v["u0"] = f0 + w * (flow - f0), v["u0"] + w * (inlet - v["u0"])
            return True
        v["loss"] = 1.0
        steady_flow = abs(flow - v["f1"]) < 0.01 * f0 and abs(v["flow_slope"]) * gi.DAMP_WINDOW_S < 0.01 * f0
        steady_heat = not abs(v["heat"] - v["heat_slow"]) > gi.HEAT_STEADY * v["heat_slow"]
        settled = self.settled(inlet) and steady_flow and steady_heat
        if settled and 0 < flow < gi.FLOW_UNFELT * f0 and v["heat_slow"] > v["heat_floor"] \
                and inlet - v["u0"] < gi.RECOVERED_C:
            # a deep loss the inlet does not feel, on a rack whose heat shows work: the baseline was not the loop's
            v.update(flow0=flow, u0=inlet, loss=0.0)
            self.forget_rise()
            self.seen["baseline unfelt"] += 1
            return True
        if settled and 0 < flow < 0.5 * f0:
            rise = (inlet - v["u0"]) / (f0 / flow - 1)
            if rise < gi.RISE_MIN_C:  # noise, not the loop
                self.seen["rise too small"] += 1
            else:
                v["rise"] = rise if math.isnan(v["rise"]) else v["rise"] + 0.2 * (rise - v["rise"])
                v["rise_heat"] = v["heat_slow"] if math.isnan(v["rise_heat"]) else \
                    v["rise_heat"] + 0.2 * (v["heat_slow"] - v["rise_heat"])
                v["rise_n"] += 1
                self.seen["rise learnt"] += 1
        return True

    def loop_tau(self, ts, inlet):
        v = self.v
        since = ts - v["u1_ts"]
        if since < gi.DAMP_WINDOW_S:
            return
        if since <= 2 * gi.DAMP_WINDOW_S:  # consecutive windows: did the inlet's step shrink?
            d_new, d_old = inlet - v["u1"], v["u1"] - v["u2"]
            if d_new * d_old > 0 and abs(d_old) >= gi.DAMP_MIN_STEP_C and 0.05 < d_new / d_old < 0.95:
                tau = -since / math.log(d_new / d_old)
                v["damp"] = tau if math.isnan(v["damp"]) else math.exp(
                    math.log(v["damp"]) + 0.3 * (math.log(tau) - math.log(v["damp"])))
                v["damp_n"] += 1
                self.seen["loop tau learnt"] += 1
            v["u2"] = v["u1"]
        else:
            v["u2"] = math.nan
        v["u1"], v["f1"], v["u1_ts"] = inlet, v["flow"], ts


RACK_COLUMNS = {"ts": gi.RACK_TS, "inlet": gi.RACK_INLET, "u1": gi.RACK_U1, "u2": gi.RACK_U2,
                "u1_ts": gi.RACK_U1_TS, "damp": gi.RACK_DAMP, "damp_n": gi.RACK_DAMP_N, "flow": gi.RACK_FLOW,
                "flow0": gi.RACK_FLOW0, "u0": gi.RACK_U0, "rise": gi.RACK_RISE, "rise_n": gi.RACK_RISE_N,
                "flow_slope": gi.RACK_FLOW_SLOPE, "f1": gi.RACK_F1, "loss": gi.RACK_LOSS, "heat": gi.RACK_HEAT,
                "heat_slow": gi.RACK_HEAT_SLOW, "rise_heat": gi.RACK_RISE_HEAT, "held": gi.RACK_HELD,
                "held_ts": gi.RACK_HELD_TS, "shifts": gi.RACK_SHIFTS, "flow_ts": gi.RACK_FLOW_TS,
                "flow_held": gi.RACK_FLOW_HELD, "flow0_new": gi.RACK_FLOW0_NEW,
                "flow0_before": gi.RACK_FLOW0_BEFORE, "flow0_trial_end": gi.RACK_FLOW0_TRIAL_END,
                "heat_src": gi.RACK_HEAT_SRC, "heat_ts": gi.RACK_HEAT_TS, "heat_floor": gi.RACK_HEAT_FLOOR}
HEAT_SOURCES = {"pdu": gi.HEAT_PDU, "gpus": gi.HEAT_GPUS}


def random_rack_rows(seed, racks=3, steps=900):
    """Cooling loops losing flow and getting it back: the flow ramps to 5-30 % of baseline and
    holds, the inlet follows the heat balance with the loop's lag, work starts and stops (the
    heat jumps), a pump upgraded on some loops (the flow 2.5x for good), with missing heat and
    flow, flow meters reading 2-5x twice in a row (or 6-8x for over half an hour), garbage inlets,
    late rows and gaps. Rows are
    ``[ts, rack, inlet, flow, pdu, gpu_heat, gpu_floor]``: the GPUs draw 60-85 % of the PDU's power,
    32 of them at 200 W under which they show no work; some racks have no PDU, others lose theirs
    for a while (under HEAT_SOURCE_STALE_S or well over)."""
    rng = np.random.default_rng(seed)
    gpu_share, no_pdu = rng.uniform(0.6, 0.85, racks), rng.random(racks) < 0.3
    pdu_out_at, pdu_out_s = rng.uniform(0, 12000, (2, racks)), rng.choice([120.0, 250.0, 2000.0], (2, racks))
    f0, rise0, tau = rng.uniform(0.8, 1.5, racks), rng.uniform(3, 6, racks), rng.uniform(100, 300, racks)
    inlet, heat = np.full(racks, 24.0), rng.uniform(20e3, 40e3, racks)
    loss_at, floor = rng.uniform(600, 3000, racks), rng.uniform(0.05, 0.3, racks)
    back_at = loss_at + rng.uniform(1500, 4000, racks)
    upgrade_at = np.where(rng.random(racks) < 0.5, rng.uniform(0, 12000, racks), np.inf)
    glitch, glitch_left = np.ones(racks), np.zeros(racks, int)
    rows, t = [], 0.0
    for _ in range(steps):
        dt = rng.choice([10.0, 10.0, 10.0, 5.0, 400.0], p=[.5, .3, .1, .08, .02])
        t += dt
        ramp = np.clip((t - loss_at) / 600.0, 0, 1) * (t < back_at)
        flow = f0 * (1 - (1 - floor) * ramp) * np.where(t >= upgrade_at, 2.5, 1.0)
        start = (glitch_left == 0) & (rng.random(racks) < 0.005)
        long = start & (rng.random(racks) < 0.3)  # misreading 6-8x for longer than FLOW_TRIAL_S
        glitch = np.where(start, np.where(long, rng.uniform(6.0, 8.0, racks), rng.uniform(2.2, 5.0, racks)), glitch)
        glitch_left = glitch_left + np.where(long, 220, 2) * start
        heat = np.where(rng.random(racks) < 0.005, heat * rng.choice([0.3, 3.0], racks), heat)
        target = 24.0 + rise0 * (heat / 30e3) * (f0 / flow - 1)
        inlet = target + (inlet - target) * np.exp(-dt / tau)
        pdu_out = no_pdu | ((pdu_out_at <= t) & (t < pdu_out_at + pdu_out_s)).any(axis=0)
        for r in range(racks):
            row = [t - (rng.uniform(0, 30) if rng.random() < 0.02 else 0.0), r, round(inlet[r], 1),
                   flow[r] + rng.normal(0, 0.002), np.nan if pdu_out[r] else heat[r] * (1 + rng.normal(0, 0.03)),
                   heat[r] * gpu_share[r] * (1 + rng.normal(0, 0.03)), 32 * 200.0]
            if glitch_left[r]:  # the meter misreading (the pair agrees with itself)
                row[3] *= glitch[r]
                glitch_left[r] -= 1
            if rng.random() < 0.03:
                row[rng.choice([2, 3, 4, 5])] = rng.choice([np.nan, 1e9, -5.0, 0.0])
            if rng.random() < 0.02:  # a sensor glitch, or (where it holds) a level shift
                row[2] += 20.0 * (1.0 + (t // 1000) % 2)
            rows.append(row)
    return np.array(rows)


@pytest.mark.kernel
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from([1, 7, 60]))
def test_the_rack_kernel_matches_a_naive_reference(seed, chunk):
    rows = random_rack_rows(seed)
    state = gi.new_rack_state(3)
    for k in range(0, len(rows), chunk):  # frames of any size: one row each, or several ticks
        gi.update_rack_inlet(np.ascontiguousarray(rows[k:k + chunk]), state)
    naive = [NaiveRack() for _ in range(3)]
    for ts, r, *values in rows:
        naive[int(r)].row(ts, *values)
    for r in range(3):
        for name, col in RACK_COLUMNS.items():
            want = naive[r].v[name]
            want = HEAT_SOURCES.get(want, math.nan) if name == "heat_src" else want
            np.testing.assert_allclose(state[r, col], want, rtol=1e-9, atol=1e-12, equal_nan=True,
                                       err_msg=f"rack {r} {name}")


def test_the_rack_reference_comparison_reaches_every_branch():
    racks = []
    for seed in range(6):
        naive = [NaiveRack() for _ in range(3)]
        for ts, r, *values in random_rack_rows(seed):
            naive[int(r)].row(ts, *values)
        racks += naive
    seen = branches_seen(racks)
    assert all(count >= 3 for count in seen.values()), seen


# ---- a rack's flow baseline raised by a confirmed jump, on trial -----------------------------------
# a loaded rack's loop at nominal flow, a reading every dt, and where its inlet settles (shared with
# the edge-input tests)
from test_detector_edge_inputs import FLOW, HEAT, INLET, RISE, feed, forecast  # noqa: E402


@pytest.mark.parametrize("heat", [HEAT, math.nan])
@pytest.mark.parametrize("k", [2.5, 3.0, 4.5])
def test_a_confirmed_pair_of_flow_glitches_is_undone_once_the_flow_is_back(k, heat):
    """A flow meter reading 3x twice in a row: the pair agrees, so the baseline moved to 3.6 L/s, and
    it follows nominal readings only: the loop's own 1.2 L/s read as a loss at 33 % for good (above
    FLOW_UNFELT's depth, and the rule needs the rack's heat), forecast 8 °C over its inlet. Back at
    the baseline before it within the trial, the loop no warmer, the jump is undone at once, with or
    without the rack's heat; a loss from there is a loss against the loop's own baseline."""
    state = gi.new_rack_state(1)
    t = feed(state, [FLOW] * 60, heat=heat)
    t = feed(state, [k * FLOW] * 2, heat=heat, t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(k * FLOW)  # (a pump upgraded would read so too)
    t = feed(state, [FLOW], heat=heat, t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(FLOW) and state[0, gi.RACK_LOSS] == 0.0
    assert math.isnan(state[0, gi.RACK_FLOW_SLOPE])  # no trend through the glitch
    t = feed(state, [FLOW] * 360, heat=heat, t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(FLOW) and math.isnan(forecast(state))
    feed(state, [FLOW / 2], heat=heat, t0=t)
    assert state[0, gi.RACK_LOSS] == 1.0 and forecast(state) == pytest.approx(INLET + RISE)


def test_a_real_loss_right_after_a_flow_glitch_pair_is_read_at_its_depth():
    """The pump failing just after the glitch pair (0.4 of the loop's flow): a loss at 40 % of the
    loop's baseline, not at 11 % of the raised one (forecast 4x as deep)."""
    state = gi.new_rack_state(1)
    t = feed(state, [FLOW] * 60)
    t = feed(state, [3.0 * FLOW] * 2, t0=t)
    feed(state, [0.4 * FLOW], t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(FLOW) and state[0, gi.RACK_LOSS] == 1.0
    assert forecast(state) == pytest.approx(INLET + RISE * 1.5)


def test_a_raised_baseline_is_kept_while_the_loop_is_warmer_than_its_baseline():
    """The flow back under a raised baseline while the inlet stands over the baseline's by more
    than RECOVERED_C: the loop may be losing cooling it now needs (a CDU that raised its flow for
    more heat, and lost it): read as a loss until the inlet is back, then undone (within the trial)."""
    state = gi.new_rack_state(1)
    t = feed(state, [FLOW] * 60)
    t = feed(state, [3.0 * FLOW] * 2, t0=t)
    t = feed(state, [FLOW] * 6, inlets=INLET + 3.0, t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(3.0 * FLOW) and state[0, gi.RACK_LOSS] == 1.0
    feed(state, [FLOW] * 6, t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(FLOW) and state[0, gi.RACK_LOSS] == 0.0
    assert math.isnan(forecast(state))


def test_a_raised_baseline_that_holds_through_its_trial_is_the_loops():
    """A pump upgraded (2.5x, for good): past FLOW_TRIAL_S, a fall back to the old flow is a loss
    against the new baseline; within it, a fall that stays above the old flow (70 % of the new) is
    one at once. Within the trial, a jump upon a jump goes back to the first one's baseline (two
    glitch pairs in a row), and a fall there is read against the baseline before."""
    state = gi.new_rack_state(1)
    t = feed(state, [FLOW] * 60)
    t = feed(state, [2.5 * FLOW] * 6, t0=t)
    feed(state, [0.7 * 2.5 * FLOW], t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(2.5 * FLOW, rel=1e-3) and state[0, gi.RACK_LOSS] == 1.0

    state = gi.new_rack_state(1)
    t = feed(state, [FLOW] * 60)
    t = feed(state, [2.5 * FLOW] * int(gi.FLOW_TRIAL_S / 10 + 1), t0=t)
    t = feed(state, [FLOW], t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(2.5 * FLOW, rel=1e-3) and state[0, gi.RACK_LOSS] == 1.0
    assert math.isnan(state[0, gi.RACK_FLOW0_BEFORE]) and forecast(state) > INLET + RISE

    state = gi.new_rack_state(1)
    t = feed(state, [FLOW] * 60)
    t = feed(state, [2.5 * FLOW] * 2 + [2.5 * FLOW * 2.5] * 2, t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(2.5 * 2.5 * FLOW)
    feed(state, [FLOW], t0=t)
    assert state[0, gi.RACK_FLOW0] == pytest.approx(FLOW) and state[0, gi.RACK_LOSS] == 0.0


GPUS_LOADED, GPUS_IDLE, GPUS_FLOOR = 16 * 640.0, 16 * 78.0, 16 * 200.0  # a rack's 16 GPUs' power; load_min_w each


@pytest.mark.parametrize("pdu, gpus, starts_over", [(HEAT, math.nan, True), (math.nan, GPUS_LOADED, True),
                                                    (math.nan, GPUS_IDLE, False), (math.nan, math.nan, False)],
                         ids=["pdu", "loaded gpus", "idle gpus", "no heat"])
def test_a_baseline_far_above_the_flow_starts_over_where_the_racks_heat_shows_work(pdu, gpus, starts_over):
    """A baseline the loop does not have (a checkpoint's 364 L/s on a 1.2 L/s loop, or a glitch episode
    outlasting FLOW_TRIAL_S) starts over where the rack's heat shows work and the inlet did not move
    (FLOW_UNFELT): by its PDU's power, else, on a rack without one, by its GPUs' (until 2026-12-02 such
    a rack kept the loss for good). Idle GPUs, or no heat at all, tell nothing: an idle loop that lost
    its pump does not warm either, and starting over there would read the failed flow as nominal."""
    state = gi.new_rack_state(1)
    kw = {"heat": pdu, "gpu_heat": gpus, "gpu_floor": GPUS_FLOOR}
    t = feed(state, [FLOW] * 60, **kw)
    state[0, gi.RACK_FLOW0] = 364.0
    feed(state, [FLOW] * 6 * 60, t0=t, **kw)  # an hour, the inlet unmoved
    assert (state[0, gi.RACK_FLOW0] == pytest.approx(FLOW)) == starts_over
    assert (state[0, gi.RACK_LOSS] == 0.0) == starts_over


def test_a_racks_heat_stays_with_its_pdu_through_a_short_silence_and_starts_over_on_its_gpus():
    """The GPUs' power stands in for a PDU silent HEAT_SOURCE_STALE_S, not for a reading or a few
    missed: two sources are never averaged together (the GPUs miss the rest of the rack's draw), so a
    switch starts the heat over, and drops the rise learnt with the other's heat; a PDU that speaks
    again is taken back at once, starting over again."""
    state = gi.new_rack_state(1)
    gpus = 0.7 * HEAT
    t = feed(state, [FLOW] * 60, gpu_heat=gpus, gpu_floor=GPUS_FLOOR)
    assert state[0, gi.RACK_HEAT_SRC] == gi.HEAT_PDU and state[0, gi.RACK_HEAT_SLOW] == pytest.approx(HEAT)
    state[0, [gi.RACK_RISE, gi.RACK_RISE_N, gi.RACK_RISE_HEAT]] = RISE, 5.0, HEAT
    quiet = int(gi.HEAT_SOURCE_STALE_S // 10)
    t = feed(state, [FLOW] * quiet, heat=math.nan, gpu_heat=gpus, gpu_floor=GPUS_FLOOR, t0=t)
    assert state[0, gi.RACK_HEAT_SRC] == gi.HEAT_PDU and state[0, gi.RACK_HEAT_SLOW] == pytest.approx(HEAT)
    assert state[0, gi.RACK_RISE_N] == 5.0
    t = feed(state, [FLOW] * 2, heat=math.nan, gpu_heat=gpus, gpu_floor=GPUS_FLOOR, t0=t)
    assert state[0, gi.RACK_HEAT_SRC] == gi.HEAT_GPUS and state[0, gi.RACK_HEAT_FLOOR] == GPUS_FLOOR
    assert state[0, gi.RACK_HEAT] == state[0, gi.RACK_HEAT_SLOW] == pytest.approx(gpus)  # started over
    assert state[0, gi.RACK_RISE_N] == 0.0 and math.isnan(state[0, gi.RACK_RISE_HEAT])
    feed(state, [FLOW], gpu_heat=gpus, gpu_floor=GPUS_FLOOR, t0=t)
    assert state[0, gi.RACK_HEAT_SRC] == gi.HEAT_PDU and state[0, gi.RACK_HEAT_FLOOR] == 0.0
    assert state[0, gi.RACK_HEAT] == state[0, gi.RACK_HEAT_SLOW] == HEAT


def test_a_state_saved_before_the_heat_source_reads_its_heat_as_the_pdus():
    saved = gi.new_rack_state(2)[:, :gi.RACK_HEAT_SRC]
    saved[0, [gi.RACK_HEAT, gi.RACK_HEAT_SLOW, gi.RACK_TS]] = HEAT, HEAT, 1000.0
    rack = gi.upgrade_rack_state({"s_rack": saved})["s_rack"]
    assert rack.shape == (2, gi.RACK_SIZE)
    assert list(rack[0, [gi.RACK_HEAT_SRC, gi.RACK_HEAT_TS, gi.RACK_HEAT_FLOOR]]) == [gi.HEAT_PDU, 1000.0, 0.0]
    assert np.isnan(rack[1, [gi.RACK_HEAT_SRC, gi.RACK_HEAT_FLOOR]]).all()


# ---- the coolant rise learnt where a loss settles ------------------------------------------------
def test_a_loss_the_inlet_barely_feels_teaches_no_rise():
    """A flow read at a third of its baseline for half an hour (a meter misreading, a baseline a glitch
    pair raised) with the inlet a tenth over its baseline's (its noise): at f0 / flow - 1 = 2 that is
    a rise of 0.05 °C, which was learnt (until 2026-12-02) and forecast a real loss of the loop 80x too
    cool. A rise under RISE_MIN_C is not learnt: the prior stands; a real loss's is learnt."""
    state = gi.new_rack_state(1)
    t = feed(state, [FLOW] * 60)
    t = feed(state, [FLOW / 3] * 180, inlets=INLET + 0.1, t0=t)
    assert state[0, gi.RACK_RISE_N] == 0.0 and math.isnan(state[0, gi.RACK_RISE])
    t = feed(state, [FLOW] * 60, t0=t)  # back
    t = feed(state, [FLOW / 2], t0=t)  # a real loss: forecast by the prior, as it would be without it
    assert forecast(state) == pytest.approx(INLET + RISE)
    t = feed(state, [FLOW / 3] * 60, inlets=np.linspace(INLET, INLET + 2 * RISE, 60), t0=t)
    feed(state, [FLOW / 3] * 60, inlets=INLET + 2 * RISE, t0=t)
    assert state[0, gi.RACK_RISE_N] >= 3.0 and state[0, gi.RACK_RISE] == pytest.approx(RISE, rel=0.05)
