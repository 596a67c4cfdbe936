"""The thermal and power detectors' state held to the GPU bank's budget (2026-12-06): the alarms' compact
blocks (``alarm.K_*``: the active flag and the firing count in one column), the fit without its count
of inlet samples (``G_UL`` NaN says what it said), the forecast's ETA and sure flag per model in one flag
word next to ``F_FAR`` and without the inlet source its tracks read (the fit's rows say where it moved),
and power's loaded samples, brake and thermal flags in one column (``power.S_FLAGS``).

The new widths are the contract; a checkpoint written before (layout 1: no ``state_layout`` nor
``fit_layout`` in it) loads and goes on with the findings of a state never saved. The package's
``*_as_layout1`` (``thermal_fit.model_as_layout1``, ``alarm.alarms_as_layout1``,
``thermal.forecast_as_layout1``, ``power.gpu_as_layout1``; of a detector's whole state
:func:`as_layout1` below, and each detector's ``previous_layout_state``) write a state as the code before
kept it: the tests of older checkpoints build theirs from them."""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors import alarm as al
from foreshock.detectors import power as pw
from foreshock.detectors import thermal as th
from foreshock.detectors import thermal_fit as tf
from foreshock.detectors.thermal_fit import share_thermal_fits
from foreshock.findings import Prediction

from thermal_synth import Fault, World, run, small_topology

# layout 1's columns (the code before 2026-12-06), as its modules defined them
L1_G_UN = 4  # the fit's count of inlet samples; the columns after it one further on
L1_G_USRC = tf.G_USRC + 1
L1_F_ETA, L1_F_SURE, L1_F_MODEL_SIZE = 0, 1, 7
L1_F_BITS_TS, L1_F_TREND_SRC, L1_F_FAR, L1_F_SIZE = 16, 19, 26, 28
L1_S_N, L1_S_BRAKE, L1_S_THERMAL, L1_S_CONF_PRE, L1_S_OVER_DEFAULT, L1_S_BRAKE_OFF_TS = 3, 4, 5, 15, 10, 14


def as_layout1(name: str, state: dict) -> dict:
    """A thermal, power or cooling detector's ``state_dict()`` as the code before 2026-12-06 wrote its fit
    and thermal's and power's own arrays (another reader of the fit: the fit's alone; cooling's own arrays
    are its ``previous_layout_state``'s)."""
    return {"thermal": th.thermal_as_layout1, "power": pw.power_as_layout1}.get(name, tf.fit_as_layout1)(state)


# ---- the contract ----------------------------------------------------------------------------
def test_the_new_widths_and_layout_markers():
    topo = small_topology(nodes=2, gpus=4, racks=1)
    thermal, power = th.ThermalDetector(topo), pw.PowerDetector(topo)
    assert (al.K_SIZE, tf.G_SIZE, tf.MODEL_WIDTH, th.F_SIZE, pw.S_SIZE, tf.ROW_SIZE) == (3, 6, 31, 24, 15, 4)
    assert thermal.s_alarm.shape == (8, 2 * al.K_SIZE) and power.s_alarm.shape == (8, al.K_SIZE)
    assert thermal.s_forecast.shape == (8, th.F_SIZE) and power.s_gpu.shape == (8, pw.S_SIZE)
    assert thermal.s_model.shape == (8, tf.MODEL_WIDTH)
    for det in (thermal, power):
        state = det.state_dict()
        assert state["state_layout"] == 2 and state["fit_layout"] == tf.FIT_LAYOUT == 2
    # per GPU: 8 columns fewer of thermal's (forecast 4, alarms 2, fit 1) and 3 of power's (flags 2, alarm 1)
    assert (thermal.s_forecast.shape[1] + thermal.s_alarm.shape[1] + thermal.s_model.shape[1]) * 8 == 488
    assert (power.s_gpu.shape[1] + power.s_alarm.shape[1]) * 8 == 144


@pytest.mark.kernel
@pytest.mark.parametrize("seed", range(6))
def test_a_compact_alarm_steps_as_the_four_column_one(seed):
    """Same codes at the same steps; same times; the count while not active; active alike; a tag set
    while active read back; withdrawn alike, by the silent-slot pass too."""
    rng = np.random.default_rng(seed)
    n = 5
    old, new = al.new_alarm_columns(n, 2), al.new_compact_alarms(n, 2)
    ts = 0.0
    for step in range(600):
        ts += float(rng.choice([1.0, 10.0, 30.0]))
        i, b = int(rng.integers(n)), int(rng.integers(2))
        firing, clear = bool(rng.random() < 0.5), bool(rng.random() < 0.4)
        on_count = float(rng.choice([1.0, 2.0, 3.0]))
        off_hold, refresh = float(rng.choice([0.0, 30.0, 60.0])), float(rng.choice([0.0, 60.0, np.inf]))
        want = al.alarm_step(old, i, b * al.A_SIZE, ts, firing, clear, on_count, off_hold, refresh)
        got = al.compact_step(new, i, b * al.K_SIZE, ts, firing, clear, on_count, off_hold, refresh)
        assert got == want, step
        if want in (al.CODE_START, al.CODE_REFRESH) and rng.random() < 0.5:  # a detector's tag (thermal's model)
            tag = float(rng.choice([1.0, 2.0]))
            old[i, b * al.A_SIZE + al.A_ACTIVE] = tag
            al.set_compact_tag(new, i, b * al.K_SIZE, tag)
        if rng.random() < 0.02:
            assert al.alarm_withdraw(old, i, b * al.A_SIZE, ts) == al.compact_withdraw(new, i, b * al.K_SIZE, ts)
        np.testing.assert_array_equal(al.compact_from_alarm_columns(old, 2), new)
        for k in range(2):
            assert al.compact_active(new, i, k * al.K_SIZE) == (old[i, k * al.A_SIZE + al.A_ACTIVE] != 0.0)
            assert al.compact_tag(new, i, k * al.K_SIZE) == old[i, k * al.A_SIZE + al.A_ACTIVE]
    last_ts = rng.choice([np.nan, ts - 1000.0, ts], n)
    want_slots, want_blocks = al.withdraw_silent(old, 2, last_ts, ts + 1.0, 600.0)
    got_slots, got_blocks = al.withdraw_silent(new, 2, last_ts, ts + 1.0, 600.0, compact=True)
    assert got_slots.tolist() == want_slots.tolist() and got_blocks.tolist() == want_blocks.tolist()
    np.testing.assert_array_equal(al.compact_from_alarm_columns(old, 2), new)


def cooling_loss_frames(seconds: float = 3 * 3600):
    """A loop losing coolant under a loaded rack, a TIM failing on another rack's GPU, a GPU's power
    demand ramping to its cap; GPUs 4-15 silent from 2 h for 15 minutes (their predictions
    withdrawn as no longer reporting), then back: thermal throttles and HBM forecasts, and power caps,
    start, refresh and are withdrawn."""
    topo = small_topology(nodes=4, gpus=4, racks=2)
    world = World(topo, load_w=650.0, seed=11, faults=[Fault("cooling_loss", 0, 1800, 0.004),
                                                       Fault("tim_degradation", 12, 600, 1.5),
                                                       Fault("power_ramp", 5, 1200, 0.02)])
    frames, _ = world.run(seconds)
    t_dark = world.t0 + 2 * 3600
    return topo, [f.take(~((f.slot >= 4) & (f.ts >= t_dark) & (f.ts < t_dark + 900))) if f.kind == "gpu" else f
                  for f in frames]


@pytest.fixture(scope="module")
def scenario():
    return cooling_loss_frames()


def pair(topo):
    thermal, power = th.ThermalDetector(topo), pw.PowerDetector(topo)
    share_thermal_fits([thermal, power])
    return thermal, power


def feed(dets, frames):
    out = []
    for f in frames:
        for d in dets:
            out += d.update(f)
    return out


def test_the_scenario_starts_holds_and_withdraws_alarms(scenario):
    topo, frames = scenario
    found = feed(pair(topo), frames)
    preds = [f for f in found if isinstance(f, Prediction)]
    for event in ("thermal_throttle", "power_cap"):
        mine = [p for p in preds if p.event == event]
        assert any(p.active for p in mine) and any(not p.active for p in mine), event
    # held: refreshed while it stands (more active findings than starts)
    throttles = [p for p in preds if p.event == "thermal_throttle"]
    assert sum(p.active for p in throttles) > 2 * sum(not p.active for p in throttles)


@pytest.mark.parametrize("cut", [120, 400, 700])
def test_a_layout1_checkpoint_goes_on_as_a_state_never_saved(scenario, cut):
    topo, frames = scenario
    whole = pair(topo)
    feed(whole, frames[:cut])
    saved = {d.name: as_layout1(d.name, d.state_dict()) for d in whole}
    assert all("state_layout" not in s and "fit_layout" not in s for s in saved.values())
    assert saved["thermal"]["s_forecast"].shape[1] == L1_F_SIZE and saved["thermal"]["s_alarm"].shape[1] == 8
    assert saved["power"]["s_gpu"].shape[1] == 17 and saved["thermal"]["s_model"].shape[1] == 32
    restored = pair(topo)
    for d in restored:
        d.load_state_dict(saved[d.name])
    for a, b in zip(whole, restored):  # the state read back as it was (a source not yet read aside)
        known = np.isfinite(a.s_model[:, tf.G_USRC])
        for k, v in a.state_arrays().items():
            np.testing.assert_array_equal(getattr(b, k)[known] if k == "s_forecast" else getattr(b, k),
                                          v[known] if k == "s_forecast" else v, err_msg=k)
    assert feed(restored, frames[cut:]) == feed(whole, frames[cut:])


def test_a_layout1_checkpoint_older_still_goes_on():
    """Saved before G_USRC and F_BITS_TS (layout 1 widened first)."""
    topo = small_topology(nodes=1, gpus=1, racks=1)
    world = World(topo, load_w=650.0, seed=6, faults=[Fault("tim_degradation", 0, 600, 1.0)])
    frames, _ = world.run(2 * 3600)
    a = th.ThermalDetector(topo)
    run(a, frames[:400])
    old = as_layout1("thermal", a.state_dict())
    old["s_model"] = old["s_model"][:, :L1_G_USRC]
    old["s_forecast"] = old["s_forecast"][:, :L1_F_BITS_TS]
    b = th.ThermalDetector(topo)
    b.load_state_dict(old)
    assert b.s_model.shape[1] == tf.MODEL_WIDTH and b.s_forecast.shape[1] == th.F_SIZE
    out = run(a, frames[400:])
    assert [p for p in out if isinstance(p, Prediction)] and run(b, frames[400:]) == out

