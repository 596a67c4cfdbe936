"""The XID detector reads ``ecc_dbe`` (uncorrectable ECC errors, a counter) by the counter rules (r110 R1).

Read raw, a negative reading was neither refused nor counted, one low reading then back (2 -> 0 -> 2)
became "2 new uncorrectable ECC errors", and a counter cleared (a driver reload) was counted nowhere.
In a replay one 0 reading opened a false "GPU errors" incident that absorbed a real XID 79.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import xid as xid_module
from foreshock.detectors.counters import DROP_SIZE
from foreshock.detectors.xid import KIND_XID, XidDetector
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology


def gpus(n: int = 2) -> Topology:
    return Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": "n", "rack": "k", "gpus": n}]})


def feed(det: XidDetector, dbe_rows, xid_rows=None, interval: float = 10.0, start: float = 0.0):
    """One frame per poll, every GPU in it; the findings."""
    found = []
    for i, row in enumerate(dbe_rows):
        t = start + i * interval
        cols = {"ecc_dbe": np.asarray(row, dtype=np.float64)}
        cols["xid_last"] = np.asarray(xid_rows[i] if xid_rows is not None else [0.0] * len(row), dtype=np.float64)
        found += det.update(Frame("gpu", [t] * len(row), list(range(len(row))), cols))
    return found


def problems(health: PipelineHealth) -> dict[str, int]:
    return {reason: n for (stage, reason), n in health.problems.items() if stage == "xid"}


def test_one_low_or_negative_dbe_reading_is_no_new_error_and_is_counted():
    """r110's reproduction: GPU 0 has 2 DBEs since the driver loaded, one poll reads 0, then 2
    again; GPU 1 has none, one poll reads -1. Before: '2 new uncorrectable ECC errors' on GPU 0,
    '1 new' on GPU 1, nothing counted."""
    det = XidDetector(gpus())
    found = feed(det, [[2, 0], [2, 0], [0, -1], [2, 0], [2, 0]])
    assert found == []
    seen = problems(det.health)
    assert sum(n for reason, n in seen.items() if "negative" in reason) == 1
    assert sum(n for reason, n in seen.items() if "bad reading" in reason) == 1


@pytest.mark.parametrize("seen_before", [0, 1, 3])
def test_a_low_dbe_reading_is_no_new_error_however_early_it_comes(seen_before: int):
    """The 0 at a GPU's second reading (the pipeline just started, a fresh board), or right after a
    reset: "2 new uncorrectable ECC errors" had been found (no pace known, the drop was taken as a
    reset at once); read as at any other time, it is a glitch."""
    det = XidDetector(gpus(1))
    found = feed(det, [[2]] * (seen_before + 1) + [[0], [2], [2]])
    assert found == []
    assert sum(n for reason, n in problems(det.health).items() if "bad reading" in reason) == 1
    after_reset = XidDetector(gpus(1))  # cleared (5 -> 0, standing), 2 new errors, then a 0 read once
    assert [(f.ts, f.score) for f in feed(after_reset, [[5], [5], [0], [0], [2], [0], [2], [2]])] == [(40.0, 2.0)]


def test_a_garbage_high_dbe_reading_is_refused_and_the_next_real_error_found():
    det = XidDetector(gpus(1))
    found = feed(det, [[2], [2], [1e12], [2], [3], [3]])
    assert [(f.ts, f.score) for f in found] == [(40.0, 1.0)]
    assert sum(n for reason, n in problems(det.health).items() if "higher than it can have counted" in reason) == 1


def test_a_dbe_count_cleared_by_a_driver_reload_counts_from_zero_and_is_reported():
    """5 -> 0 and staying there (the volatile count cleared): no new error, a reset counted; then
    errors after the reload are found."""
    det = XidDetector(gpus(1))
    found = feed(det, [[5], [5], [0], [0], [1]])
    assert [(f.ts, f.score) for f in found] == [(40.0, 1.0)]
    assert sum(n for reason, n in problems(det.health).items() if "went backwards" in reason) == 1


@settings(max_examples=40, deadline=None)
@given(increments=st.lists(st.integers(0, 3), min_size=3, max_size=20), start=st.integers(0, 10**6),
       interval=st.sampled_from([1.0, 10.0, 30.0]))
def test_every_real_dbe_increase_is_one_finding_of_its_size(increments, start, interval):
    """A counter that only goes up, by less than DBE_MAX_PER_S allows: each increase is a finding
    with the increase as its score, nothing else, nothing counted as a problem."""
    assert max(increments) <= xid_module.DBE_MAX_PER_S * interval
    det = XidDetector(gpus(1))
    raw = np.cumsum([start, *increments]).astype(float)
    found = feed(det, [[v] for v in raw], interval=interval)
    assert [f.score for f in found] == [float(d) for d in increments if d > 0]
    assert all(f.field == "ecc_dbe" and f"{int(f.score)} new uncorrectable" in f.reason for f in found)
    assert not det.health.problems


def test_the_bank_counts_the_dbe_problems_in_the_pipeline_health():
    """``report_problems_to`` hands the pipeline's health to every part that has one."""
    from foreshock.detectors.bank import report_problems_to

    det, health = XidDetector(gpus(1)), PipelineHealth()
    report_problems_to([det], health)
    feed(det, [[1], [-1]])
    assert sum(problems(health).values()) == 1


def test_an_xid_and_a_dbe_on_one_row_come_xid_first_and_rows_in_order():
    det = XidDetector(gpus(2))
    feed(det, [[0, 0]], xid_rows=[[0, 0]])
    found = det.update(Frame("gpu", [10.0, 10.0], [1, 0], {"xid_last": [48.0, 79.0], "ecc_dbe": [1.0, 2.0]}))
    assert [(f.slot, f.field, f.score) for f in found] == [
        (1, "xid_last", 48.0), (1, "ecc_dbe", 1.0), (0, "xid_last", 79.0), (0, "ecc_dbe", 2.0)]


def test_a_frame_without_the_dbe_or_xid_column_reads_nothing_and_forgets_nothing():
    det = XidDetector(gpus(1))
    feed(det, [[2], [2]])
    assert det.update(Frame("gpu", [30.0], [0], {"gpu_temp": [50.0]})) == []
    assert det.update(Frame("gpu", [40.0], [0], {"ecc_dbe": [3.0]}))[0].score == 1.0
    assert det.update(Frame("gpu", [50.0], [0], {"xid_last": [79.0]}))[0].score == 79.0


# ---- the XID kernel (DBE no longer in it) against a plain reference ---------------------------------
def naive_xid(slot, xid, last):
    out = []
    for i, s in enumerate(slot):
        v = xid[i]
        if 0.0 <= v <= 1023.0 and v == int(v):  # a code: whole, in the guard's range for xid_last
            if np.isfinite(last[s]) and v != last[s] and v > 0:
                out.append((i, KIND_XID, v))
            last[s] = v
    return out


xid_values = st.one_of(st.sampled_from([0.0, 13.0, 48.0, 48.5, 79.0, 79.5, np.nan, np.inf]), st.floats(0, 5).map(float))


@pytest.mark.kernel
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), xid_values), max_size=40))
def test_xid_kernel_matches_reference(rows):
    slot = np.array([r[0] for r in rows], dtype=np.int32)
    xid = np.array([r[1] for r in rows], dtype=np.float64)
    last_k = np.full(4, np.nan)
    last_k[0] = 0.0  # one GPU already seen
    last_r = last_k.copy()
    out = np.empty((len(rows), 3))
    n, *_ = xid_module.xid_events(slot, xid, last_k, out)
    expected = naive_xid(slot, xid, last_r)
    assert [tuple(r) for r in out[:n].tolist()] == [(float(i), float(k), float(v)) for i, k, v in expected]
    np.testing.assert_array_equal(last_k, last_r)


# ---- state ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cut", range(1, 6))
def test_a_dbe_glitch_across_a_checkpoint_reads_as_without_one(cut):
    rows = [[2], [2], [0], [2], [3], [3]]
    never_stopped = feed(XidDetector(gpus(1)), rows)
    before = XidDetector(gpus(1))
    found = feed(before, rows[:cut])
    restored = XidDetector(gpus(1))
    restored.load_state_dict(before.state_dict())
    found += feed(restored, rows[cut:], start=10.0 * cut)
    assert found == never_stopped
    assert [f.score for f in found] == [1.0]


def test_a_state_saved_with_the_raw_dbe_count_loads_and_goes_on():
    """A checkpoint from before (``s_last`` = [last XID, last DBE] per GPU): the XIDs go on (the
    same code is no new XID), the DBE count goes on from its saved value (one more is one finding),
    a GPU never seen stays unseen."""
    old = {"s_last": np.array([[48.0, 2.0], [np.nan, np.nan]])}
    det = XidDetector(gpus(2))
    det.load_state_dict(old)
    found = det.update(Frame("gpu", [100.0, 100.0], [0, 1], {"xid_last": [48.0, 79.0], "ecc_dbe": [3.0, 5.0]}))
    assert [(f.slot, f.field, f.score) for f in found] == [(0, "ecc_dbe", 1.0)]
    assert det.state_dict()["s_dbe_drop"].shape == (2, 1, DROP_SIZE)
    found = det.update(Frame("gpu", [110.0, 110.0], [0, 1], {"xid_last": [79.0, 79.0], "ecc_dbe": [3.0, 6.0]}))
    assert [(f.slot, f.field, f.score) for f in found] == [(0, "xid_last", 79.0), (1, "ecc_dbe", 1.0)]
