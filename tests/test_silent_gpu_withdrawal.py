"""A GPU prediction whose GPU stops reporting is withdrawn, once, as no longer reporting.

The thermal and power alarms step only on their GPU's own rows: a GPU that went silent (exporter
hung, host down, XID 79) kept its ``thermal_throttle`` / ``power_cap`` prediction open for ever in
the detector and the findings (the store only let its gauge lapse, ETA + 5 min after the last
refresh)."""
from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors import alarm as al
from foreshock.detectors import power as pw
from foreshock.detectors import thermal as th
from foreshock.detectors import thermal_fit as tf
from foreshock.exporters.store import FindingStore
from foreshock.findings import Prediction
from foreshock.frames import Frame

from test_power import heating_gpu
from thermal_synth import Fault, World, small_topology

SILENT_WORDS = "no longer reporting; not a recovery"
GAP_S = tf.PARAMS["gap_s"]


def drive(det, frames, silent_slot, silent_after_first=60.0, back_after=None, drop=None):
    """Run ``det`` over ``frames`` with a store; ``silent_slot``'s GPU rows stop
    ``silent_after_first`` s after its first active prediction (and come back ``back_after`` s
    after they stopped, if given). ``drop(ts)``: drop that slot's row at ``ts`` instead (scrapes
    missed). Returns the findings, when the rows stopped, and the store's predictions of the slot
    right after each frame that withdrew one of them."""
    store = FindingStore(det.topology)
    found, silent_from, store_after_withdrawal = [], None, []
    for f in frames:
        if f.kind == "gpu":
            t = float(f.ts[0])
            gone = silent_from is not None and t >= silent_from and (back_after is None
                                                                      or t < silent_from + back_after)
            if gone or (drop is not None and drop(t)):
                f = f.take(np.flatnonzero(f.slot != silent_slot))
        store.observe_frame(f)
        new = det.update(f)
        store.observe_findings(new)
        found += new
        mine = [p for p in new if isinstance(p, Prediction) and p.slot == silent_slot]
        if drop is None and silent_from is None and any(p.active for p in mine):
            silent_from = float(f.ts[0]) + silent_after_first
        if any(not p.active for p in mine):
            store_after_withdrawal.append([p for p in store.snapshot().predictions if p.slot == silent_slot])
    return found, silent_from, store_after_withdrawal


def of_slot(found, slot, event):
    return [p for p in found if isinstance(p, Prediction) and p.slot == slot and p.event == event]


def tim_frames():
    topo = small_topology()
    world = World(topo, faults=[Fault("tim_degradation", 5, 1800, 0.6, "f1")], seed=1)
    frames, _ = world.run(4.5 * 3600)
    return topo, world, frames


def test_a_thermal_prediction_of_a_gpu_that_stops_reporting_is_withdrawn_once():
    topo, world, frames = tim_frames()
    found, silent_from, in_store = drive(th.ThermalDetector(topo), frames, silent_slot=5)
    assert silent_from is not None, "the case is real: GPU 5 is predicted to throttle"
    preds = of_slot(found, 5, "thermal_throttle")
    withdrawn = [p for p in preds if not p.active]
    assert len(withdrawn) == 1, [(p.ts - world.t0, p.active, p.reason) for p in preds]
    w = withdrawn[0]
    assert SILENT_WORDS in w.reason
    last_row = silent_from - world.interval  # its last row (ticks fall on the interval)
    assert GAP_S < w.ts - last_row <= GAP_S + 2 * world.interval
    assert preds[-1] is w  # nothing more of it: it sent nothing since
    # the store drops it (and its ETA gauge) at once, not when its ETA lapses (ETA + 5 min after
    # its last refresh: more than 20 minutes here)
    assert in_store == [[]]
    assert preds[-2].eta_s + 300 > w.ts - preds[-2].ts + 60


def test_a_gpu_back_after_its_silence_is_predicted_afresh():
    topo, world, frames = tim_frames()
    found, silent_from, _ = drive(th.ThermalDetector(topo), frames, silent_slot=5, back_after=2 * GAP_S)
    preds = of_slot(found, 5, "thermal_throttle")
    states = [p.active for p in preds if p.ts >= silent_from]
    assert states[:2] == [False, True]  # withdrawn while silent, then started again once back
    assert SILENT_WORDS in preds[[p.ts >= silent_from for p in preds].index(True)].reason


@pytest.mark.parametrize("seed", [0, 1])
def test_missed_scrapes_do_not_withdraw_a_prediction(seed):
    """Scrapes missed now and then (runs of up to 20 in a row: 200 s) leave the prediction alone."""
    topo, world, frames = tim_frames()
    rng = np.random.default_rng(seed)
    ticks = np.arange(world.t0, world.t0 + 4.5 * 3600, world.interval)
    missed = set()
    for start in rng.choice(ticks, 40, replace=False):
        missed.update(start + world.interval * np.arange(rng.integers(1, 21)))
    found, _, _ = drive(th.ThermalDetector(topo), frames, silent_slot=5, drop=lambda t: t in missed)
    assert of_slot(found, 5, "thermal_throttle"), "the case is real"
    assert not [p for p in found if isinstance(p, Prediction) and SILENT_WORDS in p.reason]


def two_heating_gpus():
    """``heating_gpu``'s GPU twice over (slots 0 and 1) on one node: both heading for the cap."""
    frames, _ = heating_gpu(duration=5400.0)
    topo = small_topology(nodes=1, gpus=2, racks=1)
    doubled = []
    for f in frames:
        if f.kind == "gpu":
            f = Frame("gpu", np.repeat(f.ts, 2), [0, 1], {k: np.repeat(v, 2) for k, v in f.columns.items()})
        doubled.append(f)
    return topo, doubled


def test_a_power_cap_prediction_of_a_gpu_that_stops_reporting_is_withdrawn_once():
    topo, frames = two_heating_gpus()
    found, silent_from, in_store = drive(pw.PowerDetector(topo), frames, silent_slot=0, silent_after_first=10.0)
    assert silent_from is not None, "the case is real: GPU 0 is predicted to meet its cap"
    withdrawn = [p for p in of_slot(found, 0, "power_cap") if not p.active]
    assert len(withdrawn) == 1 and SILENT_WORDS in withdrawn[0].reason
    assert GAP_S < withdrawn[0].ts - (silent_from - 10.0) <= GAP_S + 20.0
    assert in_store == [[]]
    # the GPU that kept reporting is left to its own rows
    assert not [p for p in of_slot(found, 1, "power_cap") if SILENT_WORDS in p.reason]


def naive_withdraw_silent(state, count, last_ts, now, silent_s):
    """Per slot and block, :func:`alarm.alarm_withdraw` where the slot is silent."""
    withdrawn = []
    for i in range(state.shape[0]):
        if now - last_ts[i] <= silent_s:
            continue
        for k in range(count):
            if al.alarm_withdraw(state, i, k * al.A_SIZE, now) == al.CODE_WITHDRAW:
                withdrawn.append((i, k))
    return withdrawn


@pytest.mark.kernel
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_withdraw_silent_matches_alarm_withdraw_slot_by_slot(seed, strided):
    """The compiled pass withdraws what the naive one does, in slot order; ``last_ts`` read as a
    column of a wider array too (the thermal fit's model rows, the feature stream's)."""
    rng = np.random.default_rng(seed)
    n, count = 40, 3
    state = al.new_alarm_columns(n, count)
    for k in range(count):
        state[:, k * al.A_SIZE + al.A_ACTIVE] = rng.random(n) < 0.4
        state[:, k * al.A_SIZE + al.A_ON] = rng.integers(0, 3, n)
        state[:, k * al.A_SIZE + al.A_EMIT_TS] = rng.uniform(0, 900, n)
        state[:, k * al.A_SIZE + al.A_OFF_TS] = np.where(rng.random(n) < 0.5, np.nan, 800.0)
    last_ts = np.where(rng.random(n) < 0.1, np.nan, rng.uniform(0, 1000, n))
    if strided:
        rows = np.zeros((n, 5))
        rows[:, 3] = last_ts
        last_ts = rows[:, 3]
    want_state = state.copy()
    want = naive_withdraw_silent(want_state, count, last_ts, 1000.0, 600.0)
    slots, blocks = al.withdraw_silent(state, count, last_ts, 1000.0, 600.0)
    assert list(zip(slots.tolist(), blocks.tolist())) == want and want
    np.testing.assert_array_equal(state, want_state)
