"""Per-GPU state of robust_zscore, throttle_bits, xid and straggler, cut towards the issue's 1 KiB per
GPU for the default bank (2026-12-06): values in float32 (robust_zscore's state, throttle_bits' last
bits, xid's last code and DBE pace, straggler's clock kind), xid's DBE reset count no longer kept per
GPU, straggler's ``S_TAKEN`` column derived from the means' own times. The new layout as a contract,
checkpoints of the old layouts loading and going on as the old code would, and each detector's
behaviour after the change (and after a checkpoint)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from foreshock import facts
from foreshock.detectors import straggler as sg
from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.counters import DROP_SIZE
from foreshock.detectors.ewma_cusum import LEVEL, N_STATE, SCALE, RobustZScoreDetector
from foreshock.detectors.throttle_bits import ThrottleBitsDetector
from foreshock.detectors.xid import RESET, XidDetector
from foreshock.frames import Frame
from foreshock.remap import Remap

from thermal_synth import run, small_topology

TOPO = small_topology()  # 32 GPUs, one job
N = TOPO.size("gpu")
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def frames(minutes=40, slow=5, step_at=None, dbe=None, xid=None, start=0.0):
    """Frames every 10 s of the 32-GPU job: GPU ``slow`` 15 % slower; GPU 7's temperatures up 12 °C from
    ``step_at`` (s); ``dbe(t)``/``xid(t)``: the ecc_dbe/xid_last columns at ``t`` (default 0s)."""
    rng = np.random.default_rng(11)
    out = []
    for t in np.arange(start, start + minutes * 60.0, 10.0):
        clock = np.full(N, facts.SM_CLOCK_MAX_HZ) * (1 - 0.005 * rng.random(N))
        clock[slow] *= 0.85
        temp = 60 + rng.normal(0, 0.5, N)
        if step_at is not None and t >= step_at:
            temp[7] += 12.0
        out.append(Frame("gpu", np.full(N, t), np.arange(N), {
            "sm_clock": clock, "sm_clock_max": np.full(N, facts.SM_CLOCK_MAX_HZ), "util": np.ones(N),
            "gpu_temp": temp, "hbm_temp": temp + 5.0, "power": 650 + rng.normal(0, 5, N),
            "throttle_reasons": np.zeros(N), "ecc_dbe": np.zeros(N) if dbe is None else dbe(t),
            "xid_last": np.zeros(N) if xid is None else xid(t)}))
    return out


def per_gpu(det):
    return sum(a.nbytes for k, a in det.state_dict().items()
               if isinstance(a, np.ndarray) and det.slot_kinds.get(k) == "gpu" and k.startswith("s_")) / N


# ---- the layout ------------------------------------------------------------------------------------
def test_the_new_layout_dtypes_and_widths():
    z = RobustZScoreDetector(TOPO)
    assert z.s_state.dtype == F32 and z.s_state.shape == (N, 3, N_STATE) and per_gpu(z) == 60
    t = ThrottleBitsDetector(TOPO)
    assert (t.s_last.dtype, t.s_reported.dtype) == (F32, F64) and per_gpu(t) == 12  # the report time: float64
    x = XidDetector(TOPO)
    assert set(x.state_dict()) == {"s_last_xid", "s_dbe_state", "s_dbe_rate", "s_dbe_drop"}
    assert (x.s_last_xid.dtype, x.s_dbe_rate.dtype, x.s_dbe_state.dtype, x.s_dbe_drop.dtype) == (F32, F32, F64, F64)
    assert x.s_dbe_state.shape == (N, 1, 2) and x.s_dbe_drop.shape == (N, 1, DROP_SIZE) and per_gpu(x) == 72
    # the counter rules' reset counts are the detector's scratch, not one more array per GPU
    assert x.counters.s_resets is x._slot_scratch and x.counters.s_rate is x.s_dbe_rate
    s = sg.StragglerDetector(TOPO)
    assert sg.S_SIZE == 14 and s.s_gpu.shape == (N, 14) and s.s_gpu.dtype == F64
    assert (sg.S_BUSY_W, sg.S_CLOCK_TS, sg.S_TEMP_TS, sg.S_THROTTLE_TS, sg.S_POWER_TS) == (9, 10, 11, 12, 13)
    assert not hasattr(sg, "S_TAKEN") and s.s_clock_raw.dtype == F32 and s.s_flag.dtype == F64
    assert s.state_dict()["state_layout"] == sg.STATE_LAYOUT == 2
    assert per_gpu(s) == 14 * 8 + 3 * 8 + 4  # (s_rack is per rack)


def test_float32_arrays_stay_float32_through_loads_remaps_and_moves():
    """Loaded from float64 (an old checkpoint), remapped to another topology, and moved within the
    bank (a board swap's restart and move): the arrays stay float32."""
    names = ["robust_zscore", "throttle_bits", "xid", "straggler"]
    bank = DetectorBank.from_names(TOPO, names, processors=())
    for f in frames(minutes=3):
        bank.update(f)
    fresh = DetectorBank.from_names(TOPO, names, processors=()).state_dict()["detectors"]
    wide = {name: {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype == F32 else v)
                   for k, v in st.items()} for name, st in bank.state_dict()["detectors"].items()}
    for d in bank.detectors:
        d.load_state_dict(wide[d.name])
    bank.restart_gpus([3], fresh)
    bank.move_gpus(np.r_[1, 0, np.arange(2, N)], fresh)
    grown = small_topology(nodes=5)
    for d in bank.detectors:
        other = type(d)(grown)
        other.load_state_dict(other.remap_state(d.state_dict(), Remap(TOPO, grown)))
        for det in (d, other):
            got = {k: a.dtype for k, a in det.state_arrays().items()}
            want = {"robust_zscore": {"s_state": F32}, "throttle_bits": {"s_last": F32, "s_reported": F64},
                    "xid": {"s_last_xid": F32, "s_dbe_rate": F32, "s_dbe_state": F64, "s_dbe_drop": F64},
                    "straggler": {"s_gpu": F64, "s_flag": F64, "s_rack": F64, "s_clock_raw": F32}}[d.name]
            assert got == want, d.name
    assert bank.detectors[2].counters.s_rate is bank.detectors[2].s_dbe_rate


def test_a_straggler_state_of_an_unknown_layout_is_refused():
    s = sg.StragglerDetector(TOPO)
    with pytest.raises(ValueError, match="layout"):
        s.load_state_dict({**s.state_dict(), "state_layout": 3})


# ---- old checkpoints ---------------------------------------------------------------------------------
def straggler_layout1(state):
    """``state`` as layout 1 wrote it: no ``state_layout``, ``s_gpu`` of 15 columns with ``S_TAKEN`` at
    10 (the ``T_*`` bits of the means taken at tick ``S_TS``), the four means' times at 11..14."""
    g = state["s_gpu"]
    taken = sum(bit * (g[:, col] == g[:, sg.S_TS]) for bit, col in (
        (sg.T_UTIL, sg.S_UTIL_TS), (sg.T_CLOCK, sg.S_CLOCK_TS), (sg.T_TEMP, sg.S_TEMP_TS),
        (sg.T_POWER, sg.S_POWER_TS), (sg.T_THROTTLE, sg.S_THROTTLE_TS)))
    old = np.column_stack([g[:, :10], taken, g[:, 10:]])
    assert old.shape[1] == sg.LAYOUT1_S_SIZE == 15
    return {**{k: v for k, v in state.items() if k != "state_layout"}, "s_gpu": old,
            "s_clock_raw": state["s_clock_raw"].astype(np.float64)}


def test_a_layout1_straggler_checkpoint_taken_inside_a_tick_goes_on_as_before():
    """A tick split by field (util and clock, then temperature and power) with the checkpoint between
    the halves: the old layout's ``S_TAKEN`` bits say util and clock were taken; loaded, the second
    half adds the rest and nothing twice, exactly as a detector that never stopped; and after it, the
    same findings (the slower GPU named)."""
    fs = frames(minutes=30)
    cut = 90
    head = dict(fs[cut].columns)
    first = Frame("gpu", fs[cut].ts, fs[cut].slot, {k: (v if k in ("sm_clock", "sm_clock_max", "util")
                                                        else np.full(N, np.nan)) for k, v in head.items()})
    second = Frame("gpu", fs[cut].ts, fs[cut].slot, {k: (np.full(N, np.nan) if k in ("sm_clock", "sm_clock_max",
                                                                                       "util") else v)
                                                     for k, v in head.items()})
    a = sg.StragglerDetector(TOPO, refresh_s=120)
    run(a, fs[:cut] + [first])
    old = straggler_layout1(a.state_dict())
    assert set(old["s_gpu"][:, sg.LAYOUT1_S_TAKEN].tolist()) == {float(sg.T_UTIL | sg.T_CLOCK)}
    b = sg.StragglerDetector(TOPO, refresh_s=120)
    b.load_state_dict(pickle.loads(pickle.dumps(old)))
    np.testing.assert_array_equal(b.s_gpu, a.s_gpu)
    assert b.s_clock_raw.dtype == F32 and b.state_layout == sg.STATE_LAYOUT
    again = Frame("gpu", first.ts, first.slot, {**first.columns, "util": np.zeros(N)})  # util again: not taken
    for det in (a, b):
        det.update(second)
        det.update(again)
    np.testing.assert_array_equal(b.s_gpu, a.s_gpu)
    assert (a.s_gpu[:, sg.S_TEMP_TS] == fs[cut].ts[0]).all() and (a.s_gpu[:, sg.S_UTIL] == 1.0).all()
    rest = run(a, fs[cut + 1:])
    assert {f.slot for f in rest} == {5} and run(b, fs[cut + 1:]) == rest


def test_a_layout1_straggler_state_of_eleven_columns_still_loads():
    """One saved before the means' own times (layout 1 cut at 11 columns, ``S_TAKEN`` last): each busy
    mean read as taken at its last busy sample, as before."""
    fs = frames(minutes=30)
    a = sg.StragglerDetector(TOPO, refresh_s=120)
    run(a, fs[:60])
    old = straggler_layout1(a.state_dict())
    old["s_gpu"] = old["s_gpu"][:, :11]
    b = sg.StragglerDetector(TOPO, refresh_s=120)
    b.load_state_dict(old)
    for col in (sg.S_CLOCK_TS, sg.S_TEMP_TS, sg.S_THROTTLE_TS, sg.S_POWER_TS):
        np.testing.assert_array_equal(b.s_gpu[:, col], a.s_gpu[:, sg.S_BUSY_TS])
    rest = run(a, fs[60:])
    assert rest and run(b, fs[60:]) == rest


def test_an_old_float64_zscore_checkpoint_loads_and_alarms_on_the_step():
    """The old state (float64, the same five columns) loads as float32 and goes on: the level step
    after it is one alarm on each of GPU 7's temperatures, nothing else."""
    fs = frames(minutes=30, step_at=1500.0)
    a = RobustZScoreDetector(TOPO, warmup=30)
    run(a, fs[:100])
    old = {"s_state": a.s_state.astype(np.float64)}
    b = RobustZScoreDetector(TOPO, warmup=30)
    b.load_state_dict(old)
    assert b.s_state.dtype == F32 and np.allclose(b.s_state, a.s_state)
    found = run(b, fs[100:])
    assert {(f.slot, f.field) for f in found} == {(7, "gpu_temp"), (7, "hbm_temp")}
    assert all(1500.0 <= f.ts <= 1560.0 for f in found)  # within a minute of the step


def test_an_old_xid_checkpoint_with_its_reset_count_loads():
    """The old state (``s_dbe_resets`` per GPU, float64 code and pace) taken with two DBE resets
    pending: both go on as the old code did: one comes back (a glitch: nothing new), the other stands
    (its errors since the clear and the reading's rise)."""
    def dbe(t):
        v = np.full(N, 5.0)
        if t == 290.0:
            v[[2, 4]] = 3.0
        elif t >= 300.0:
            v[4] = 4.0
        return v
    fs = frames(minutes=10, dbe=dbe)
    a = XidDetector(TOPO)
    run(a, fs[:30])
    assert (a.s_dbe_drop[[2, 4], 0, 3] == RESET).all()
    old = {"s_last_xid": a.s_last_xid.astype(np.float64), "s_dbe_state": a.s_dbe_state.copy(),
           "s_dbe_resets": (a.s_dbe_drop[:, :, 3] == RESET).astype(np.int64) * 3,  # counted over the years
           "s_dbe_rate": a.s_dbe_rate.astype(np.float64), "s_dbe_drop": a.s_dbe_drop.copy()}
    b = XidDetector(TOPO)
    b.load_state_dict(old)
    assert "s_dbe_resets" not in b.state_dict() and b.s_dbe_rate.dtype == F32
    found = run(b, fs[30:])
    assert [(f.slot, f.field, f.score) for f in found] == [(4, "ecc_dbe", 4.0)]
    assert (b._slot_scratch == 0).all()  # the scratch is left zeros


def test_a_throttle_bits_checkpoint_of_float64_bits_loads():
    b = ThrottleBitsDetector(TOPO)
    b.load_state_dict({"s_last": np.full(N, float(facts.THROTTLE_SW_THERMAL)), "s_reported": np.full(N, 0.0)})
    assert b.s_last.dtype == F32
    held = Frame("gpu", np.full(N, 100.0), np.arange(N), {"throttle_reasons": np.full(N, facts.THROTTLE_SW_THERMAL)})
    assert b.update(held) == []  # not an onset: it was on before the checkpoint
    later = Frame("gpu", np.full(N, 300.0), np.arange(N), {"throttle_reasons": np.full(N, facts.THROTTLE_SW_THERMAL)})
    assert len(b.update(later)) == N  # a reminder, 300 s after the last report


# ---- behaviour ---------------------------------------------------------------------------------------
def test_robust_zscore_alarms_on_a_level_step_and_not_on_noise():
    noise = RobustZScoreDetector(TOPO, warmup=30)
    assert run(noise, frames(minutes=60)) == []
    stepped = RobustZScoreDetector(TOPO, warmup=30)
    found = run(stepped, frames(minutes=60, step_at=2400.0))
    assert sorted((f.slot, f.field) for f in found) == [(7, "gpu_temp"), (7, "hbm_temp")]
    assert all(2400.0 <= f.ts <= 2460.0 for f in found)  # within a minute of the step
    assert np.isclose(stepped.s_state[0, 0, LEVEL], 60.0, atol=0.3) and 0.2 < stepped.s_state[0, 0, SCALE] < 0.6


def test_robust_zscore_count_in_float32_passes_the_warm_up_and_saturates_harmlessly():
    z = RobustZScoreDetector(TOPO, fields=("gpu_temp",), warmup=60)
    z.s_state[:, 0] = [50.0, 0.4, 0.0, 0.0, 2.0 ** 24]  # past 2**24 samples: ``+= 1`` no longer grows it
    calm = Frame("gpu", np.zeros(N), np.arange(N), {"gpu_temp": np.full(N, 50.2)})
    assert z.update(calm) == [] and (z.s_state[:, 0, 4] == 2.0 ** 24).all()
    hot = [Frame("gpu", np.full(N, t), np.arange(N), {"gpu_temp": np.full(N, 58.0)}) for t in range(1, 6)]
    assert {f.slot for f in run(z, hot)} == set(range(N))  # still past the warm-up: it alarms


def test_throttle_bits_refuses_watched_bits_float32_cannot_hold():
    with pytest.raises(ValueError, match="2\\*\\*24"):
        ThrottleBitsDetector(TOPO, watched=1 << 30)
    det = ThrottleBitsDetector(TOPO, watched=(1 << 24) - 1)
    found = det.update(Frame("gpu", np.zeros(N), np.arange(N), {"throttle_reasons": np.full(N, (1 << 24) - 1.0)}))
    assert {int(f.score) for f in found} == {(1 << 24) - 1} and (det.s_last == (1 << 24) - 1).all()


def test_xid_reads_new_codes_and_dbe_glitches_across_a_round_trip():
    def xid(t):
        v = np.full(N, 13.0)
        v[3] = 79.0 if t >= 400.0 else 13.0
        return v

    def dbe(t):
        v = np.full(N, 2.0)
        if t == 290.0:
            v[[6, 8]] = 0.0
        if t >= 300.0:
            v[8] = 0.0 if t < 500.0 else 1.0
        return v
    fs = frames(minutes=10, xid=xid, dbe=dbe)
    a = XidDetector(TOPO)
    assert run(a, fs[:30]) == []
    b = XidDetector(TOPO)
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    got = [(f.ts, f.slot, f.field, f.score) for f in run(b, fs[30:])]
    # GPU 6: 2 -> 0 -> 2, a glitch; GPU 8: cleared (0 stands), then one new error; GPU 3: XID 79
    assert got == [(400.0, 3, "xid_last", 79.0), (500.0, 8, "ecc_dbe", 1.0)]
    assert got == [(f.ts, f.slot, f.field, f.score) for f in run(a, fs[30:])]


def test_straggler_names_the_slower_gpu_after_a_checkpoint_round_trip():
    fs = frames(minutes=30)
    a = sg.StragglerDetector(TOPO, refresh_s=120)
    run(a, fs[:60])
    b = sg.StragglerDetector(TOPO, refresh_s=120)
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    assert b.s_clock_raw.dtype == F32
    found = run(b, fs[60:])
    assert {(f.slot, f.field) for f in found} == {(5, "sm_clock")} and run(a, fs[60:]) == found
