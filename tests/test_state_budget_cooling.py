"""The cooling detector's per-GPU state, shrunk for the 1 KiB-per-GPU budget: ``s_idle`` holds its
values in float32 (degrees, seconds learnt, scores: no time of day), its four small counts moved out
to ``s_idle_count`` (uint8, held at COUNT_MAX), ``s_gpu_base`` (R and the seconds it has learnt) in
float32; 56 B a GPU less (s_idle 72 -> 20 + 4, s_gpu_base 16 -> 8). The times and the fit's loaded
seconds stay float64. A checkpoint written before (``s_idle`` float64 of nine columns: base, seen,
run, hot, inlet, score, unread, lscore, held; ``s_gpu_base`` float64) loads and goes on as it
would have."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from foreshock.detectors.cooling import (C_HELD, C_HOT, C_RUN, C_UNREAD, COUNT_MAX, I_BASE, I_INLET, I_LSCORE,
                                         I_SCORE, I_SEEN, CoolingDetector, count_on)
from foreshock.frames import Frame
from foreshock.remap import Remap
from thermal_synth import small_topology

TOPO = small_topology(nodes=4, gpus=8, racks=1)
N = TOPO.size("gpu")
CHECKPOINT_T = 2.6 * 3600  # both flags up (GPU 3 loaded, GPU 21 idle), their counts running
# the old layout's columns of s_idle, as it was documented (I_BASE, I_SEEN, I_RUN, I_HOT, I_INLET,
# I_SCORE, I_UNREAD, I_LSCORE, I_HELD = range(9))
OLD_BASE, OLD_SEEN, OLD_RUN, OLD_HOT, OLD_INLET, OLD_SCORE, OLD_UNREAD, OLD_LSCORE, OLD_HELD = range(9)


def _frames() -> list[Frame]:
    """Nodes 0 and 1 at 650 W, GPU 3's interface degrading from the second hour (dark through one
    comparison at 3 h: its flag held); nodes 2 and 3 idle, GPU 21 4 °C warm from 1.5 h (dark through
    one comparison at 12,900 s), GPU 19's temperature gone for good from 4.5 h."""
    rng = np.random.default_rng(4)
    r = 0.046 * (1 + 0.03 * np.random.default_rng(0).standard_normal(N))
    idle = 78.0 + rng.uniform(-4, 4, N)
    out = []
    for t in np.arange(0.0, 5.5 * 3600, 30.0):
        power = idle.copy()
        power[:16] = 650.0
        rr = r.copy()
        rr[3] *= 1 + 0.6 * min(1.0, max(0.0, t - 3600) / 3600)
        extra = np.zeros(N)
        extra[21] = 4.0 if t >= 5400 else 0.0
        temp = np.round(24.2 + rr * power + extra)
        if 2.95 * 3600 <= t <= 3.05 * 3600:
            temp[3] = np.nan
        if 12870 <= t <= 12930:  # the comparison at 12900 s, a refresh due
            temp[21] = np.nan
        if t >= 4.5 * 3600:
            temp[19] = np.nan
        out.append(Frame("rack", np.array([t]), np.array([0]), {"inlet_temp": np.array([24.2])}))
        out.append(Frame("gpu", np.full(N, t), np.arange(N), {"gpu_temp": temp, "power": power + rng.normal(0, 2, N)}))
    return out


FRAMES = _frames()
SPLIT = next(i for i, f in enumerate(FRAMES) if f.ts[0] >= CHECKPOINT_T)


def _run(det: CoolingDetector, frames: list[Frame]) -> list[tuple[Any, ...]]:
    found: list[Any] = []  # (the cooling detector's: anomalies)
    for f in frames:
        found += det.update(f)
    return [(f.ts, f.entity_kind, f.slot, f.score, f.reason) for f in found]


def _at_checkpoint() -> tuple[CoolingDetector, dict[str, Any]]:
    det = CoolingDetector(TOPO)
    _run(det, FRAMES[:SPLIT])
    return det, pickle.loads(pickle.dumps(det.state_dict()))


def _old_layout(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as the code before wrote it: s_idle float64 of nine columns, s_gpu_base float64."""
    idle, counts = state["s_idle"], state["s_idle_count"]
    old = np.zeros((N, 9))
    old[:, [OLD_BASE, OLD_SEEN, OLD_INLET, OLD_SCORE, OLD_LSCORE]] = idle[:, [I_BASE, I_SEEN, I_INLET, I_SCORE,
                                                                              I_LSCORE]]
    old[:, [OLD_RUN, OLD_HOT, OLD_UNREAD, OLD_HELD]] = counts[:, [C_RUN, C_HOT, C_UNREAD, C_HELD]]
    out = {k: v for k, v in state.items() if k != "s_idle_count"}
    return {**out, "s_idle": old, "s_gpu_base": np.asarray(state["s_gpu_base"], dtype=np.float64)}


def _assert_layout(det: CoolingDetector) -> None:
    assert det.s_idle.dtype == np.float32 and det.s_idle.shape == (N, 5)
    assert det.s_idle_count.dtype == np.uint8 and det.s_idle_count.shape == (N, 4)
    assert det.s_gpu_base.dtype == np.float32 and det.s_gpu_base.shape == (N, 2)
    assert det.s_gpu_loaded.dtype == np.float64 and det.s_gpu_flag.dtype == np.float64  # seconds, times


# ---- the layout ----------------------------------------------------------------------------------

def test_the_per_gpu_state_is_float32_values_and_uint8_counts_and_stays_so() -> None:
    det = CoolingDetector(TOPO)
    _assert_layout(det)
    per_gpu = sum(a.nbytes for k, a in det.state_arrays().items()
                  if k in ("s_gpu_base", "s_gpu_loaded", "s_gpu_flag", "s_idle", "s_idle_count")) / N
    assert per_gpu == 8 + 8 + 8 + 20 + 4  # was 16 + 8 + 8 + 72
    _run(det, FRAMES[:SPLIT])
    _assert_layout(det)  # nothing reassigned them wider
    assert (det.s_idle_count[16:, C_RUN] >= 2).all() and np.isfinite(det.s_idle[16:, I_BASE]).any()
    fresh = CoolingDetector(TOPO)
    fresh.load_state_dict(det.state_dict())
    _assert_layout(fresh)
    moved = CoolingDetector(TOPO)
    moved.load_state_dict(moved.remap_state(det.state_dict(), Remap.rearranged(TOPO, np.arange(N)[::-1])))
    _assert_layout(moved)
    np.testing.assert_array_equal(moved.s_idle_count, det.s_idle_count[::-1])


def test_a_count_is_held_at_its_largest_rather_than_wrapping() -> None:
    c = np.array([0, 1, COUNT_MAX - 1, COUNT_MAX], dtype=np.uint8)
    on = count_on(c)
    assert on.dtype == np.uint8 and on.tolist() == [1, 2, COUNT_MAX, COUNT_MAX]


def test_idle_gpus_settled_for_ever_are_still_settled() -> None:
    det, _ = _at_checkpoint()
    det.s_idle_count[16:, C_RUN] = COUNT_MAX  # idle for 255 comparisons and more: one more must not wrap to 0
    found = _run(det, FRAMES[SPLIT:])
    assert det.s_idle_count[16:18, C_RUN].tolist() == [COUNT_MAX, COUNT_MAX]
    assert any(f[2] == 21 and "idle" in f[4] for f in found)


# ---- checkpoints ---------------------------------------------------------------------------------

def test_a_checkpoint_round_trip_goes_on_as_if_uninterrupted() -> None:
    whole = _run(CoolingDetector(TOPO), FRAMES)
    _, state = _at_checkpoint()
    det = CoolingDetector(TOPO)
    det.load_state_dict(state)
    after = _run(det, FRAMES[SPLIT:])
    assert after == [f for f in whole if f[0] >= FRAMES[SPLIT].ts[0]]
    # the idle GPU running warm against its node-mates is still flagged, refreshed every 10 min,
    # held through the comparison that could not read it; the loaded one's held flag as well
    idle = [f for f in after if f[2] == 21]
    assert idle and all("idle" in f[4] for f in idle) and np.diff([f[0] for f in idle]).max() <= 600
    assert any("not read at this comparison" in f[4] for f in idle)
    assert any(f[2] == 3 and "not compared at this comparison" in f[4] for f in after)


def test_a_checkpoint_of_the_old_layout_loads_and_goes_on_as_it_would_have() -> None:
    ref, state = _at_checkpoint()
    expected = _run(ref, FRAMES[SPLIT:])
    old = _old_layout(state)
    assert "s_idle_count" not in old and old["s_idle"].shape == (N, 9) and old["s_idle"].dtype == np.float64
    det = CoolingDetector(TOPO)
    det.load_state_dict(old)
    _assert_layout(det)
    np.testing.assert_array_equal(det.s_idle, state["s_idle"])
    np.testing.assert_array_equal(det.s_idle_count, state["s_idle_count"])
    assert _run(det, FRAMES[SPLIT:]) == expected
    # ... and moved onto other hardware (the remap upgrades it first)
    moved = CoolingDetector(TOPO)
    moved.load_state_dict(moved.remap_state(old, Remap.rearranged(TOPO, np.arange(N))))
    _assert_layout(moved)
    assert _run(moved, FRAMES[SPLIT:]) == expected


def test_an_old_state_of_seven_columns_with_counts_past_a_byte_loads() -> None:
    """Saved before I_LSCORE and I_HELD (seven columns), unread NaN (before I_UNREAD was counted), an
    idle run longer than a byte holds: the counts held at COUNT_MAX, NaN counts none."""
    old = CoolingDetector(TOPO).state_dict()
    del old["s_idle_count"]
    idle = np.zeros((N, 7))
    idle[:, [OLD_BASE, OLD_INLET, OLD_SCORE]] = np.nan
    idle[:, OLD_UNREAD] = np.nan
    idle[0, [OLD_BASE, OLD_SEEN, OLD_RUN, OLD_HOT, OLD_INLET, OLD_SCORE, OLD_UNREAD]] = [2.5, 1.0e6, 4000, 3, 24.2,
                                                                                       0.7, 1]
    old["s_idle"] = idle
    old["s_gpu_base"] = np.full((N, 2), np.nan)
    det = CoolingDetector(TOPO)
    det.load_state_dict(old)
    _assert_layout(det)
    assert det.s_idle[0, [I_BASE, I_SEEN, I_INLET]].tolist() == [2.5, 1.0e6, np.float32(24.2)]
    assert det.s_idle[0, I_SCORE] == np.float32(0.7) and np.isnan(det.s_idle[:, I_LSCORE]).all()
    assert det.s_idle_count[0].tolist() == [COUNT_MAX, 3, 1, 0]
    assert not det.s_idle_count[1:].any()


def test_a_new_state_of_five_columns_is_not_taken_for_the_oldest_layout() -> None:
    """Five columns were the old layout once too (base .. inlet): the counts' key tells them apart."""
    det, state = _at_checkpoint()
    fresh = CoolingDetector(TOPO)
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.s_idle, det.s_idle)
    np.testing.assert_array_equal(fresh.s_idle_count, det.s_idle_count)
