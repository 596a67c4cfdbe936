"""The one XID kernel (``detectors/xid.py::xid_events``) the XID detector and the exporter's XID counter
(``exporters/store.py``) share, against a plain-Python reference written from its docstring.

They had twin kernels (``_xid_events``, ``_new_xids``), and neither tested a row's slot: a frame fed past
the input guard (the Frame API) with a GPU slot outside the topology wrote past the end of the per-GPU
array (a "double free or corruption" abort in an audit's replay) or, for a negative slot, read and wrote
the last GPU's last code (a finding about the wrong GPU). Such a code is now skipped and counted (nothing
is dropped silently): by the detector once per row (a Frame has every field's column, and the ``ecc_dbe``
counter rules count each row of such a slot; a frame without that column, by the kernel's count), by the
store in its health. The store's count of readings that are no code (fractional, outside the guard's
range) comes from the same pass.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import xid as xid_module
from foreshock.detectors.xid import XidDetector
from foreshock.exporters import store as store_module
from foreshock.exporters.store import FindingStore
from foreshock.frames import Frame
from foreshock.topology import Topology

pytestmark = pytest.mark.kernel  # (xid_events, and the detector's and the store's use of it: Numba kernels)

GPUS = 4
NAN, INF = math.nan, math.inf
DCGM_NOT_SUPPORTED = 9223372036854775794.0  # DCGM's int64 "field not supported" blank value (FACTS)
XID_RANGE = (0.0, 1023.0)  # the guard's range for xid_last (core/fields.py), written out: not read from the code
APPLICATION = {13, 31, 43, 45}  # XIDs a user's program causes: no detector finding (detectors/xid.py docstring)
GUARD = -12345.0  # a value no kernel writes: the cells past a per-GPU array's end hold it


def gpus(n: int = GPUS) -> Topology:
    return Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": "n", "rack": "k", "gpus": n}]})


def guarded(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A per-GPU array of ``n`` NaN (none seen) that is a view of a longer one holding ``GUARD`` past its end:
    a write past the view's end lands there (seen by the test) rather than in memory numpy does not own
    (which aborted the process)."""
    backing = np.full(n + 8, GUARD)
    backing[:n] = NAN
    return backing, backing[:n]


def naive(slots: list[int], values: list[float], last: list[float]) -> tuple[list[tuple[int, float]], int, int, int]:
    """The kernel's contract, row by row: a code (a whole number in the guard's range) of a GPU in ``last``
    whose last code differs (none yet: only remembered) is an event unless it is 0 (no XID); it becomes the
    GPU's last code. A code of a slot outside ``last`` is skipped and counted; a reading that is no code is
    neither taken nor remembered, counted as fractional or as outside the range (±inf: outside); NaN is no
    reading. ``last`` is updated in place. Returns (events as (row, code), outside, fractional, outside range)."""
    events: list[tuple[int, float]] = []
    outside = fractional = out_of_range = 0
    for i, (s, v) in enumerate(zip(slots, values)):
        if math.isnan(v):
            continue
        if math.isinf(v) or not XID_RANGE[0] <= v <= XID_RANGE[1] or v != math.floor(v):
            if math.isinf(v) or v == math.floor(v):  # (floor(inf) raises: inf tested first)
                out_of_range += 1
            else:
                fractional += 1
            continue
        if not 0 <= s < len(last):
            outside += 1
            continue
        if not math.isnan(last[s]) and v != last[s] and v != 0.0:
            events.append((i, v))
        last[s] = v
    return events, outside, fractional, out_of_range


# codes repeated (a latched XID read again is no event) and changed, 0 (no XID), and readings that are no
# code: an exporter's -1 (N/A), DCGM's not-supported sentinel, fractional (two series averaged), past 1023
value = st.one_of(
    st.sampled_from([0.0, 0.0, 13.0, 48.0, 48.0, 79.0, 79.0, 94.0, 1023.0, -1.0, 79.5, 1024.0, 1e300, NAN, INF, -INF,
                     DCGM_NOT_SUPPORTED]),
    st.integers(-2, 6).map(float),
    st.floats(-5.0, 1100.0),
)
slot = st.integers(-3, GPUS + 2)  # some outside 0..GPUS-1 on both sides
known = st.lists(st.sampled_from([NAN, 0.0, 13.0, 79.0]), min_size=GPUS, max_size=GPUS)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(slot, value), max_size=40), start=known)
def test_the_kernel_matches_a_naive_row_loop(rows, start):
    """Events, what ``last`` ends at and the three counts are the reference's; nothing is written past
    ``last``'s end (its guard cells keep their value)."""
    slots = np.array([s for s, _ in rows], dtype=np.int32)
    values = np.array([v for _, v in rows], dtype=np.float64)
    backing, last = guarded(GPUS)
    last[:] = start
    out = np.full((len(rows), 3), NAN)
    n, outside, fractional, out_of_range = xid_module.xid_events(slots, values, last, out)
    ref_last = list(start)
    want, *want_counts = naive(slots.tolist(), values.tolist(), ref_last)
    assert [(int(r), k, v) for r, k, v in out[:n].tolist()] == [(i, xid_module.KIND_XID, v) for i, v in want]
    assert [outside, fractional, out_of_range] == want_counts
    np.testing.assert_array_equal(last, ref_last)
    assert (backing[GPUS:] == GUARD).all()


@settings(max_examples=100, deadline=None)
@given(polls=st.lists(st.lists(st.tuples(slot, value), max_size=8), max_size=6), start=known)
def test_the_detector_and_the_store_read_the_same_events_from_it(polls, start):
    """Frames of XID readings (slots outside the topology among them) fed through the Frame API to the
    detector and the store: the detector finds the reference's events but the application XIDs, the store
    counts every one of them per (GPU, code); each row of a slot outside is one problem of the detector's
    (whatever it holds: the ``ecc_dbe`` counter rules', on the NaN column every Frame has), the codes skipped
    for their slot and the readings that are no code are the store's — never a write past the per-GPU arrays."""
    det, store = XidDetector(gpus()), FindingStore(gpus())
    det_backing, det.s_last_xid = guarded(GPUS)
    store_backing, store._last_xid = guarded(GPUS)
    det.s_last_xid[:], store._last_xid[:] = start, start
    ref_last = list(start)
    found: list[tuple[int, int]] = []
    want_found: list[tuple[int, int]] = []
    want_xids: Counter[tuple[int, int]] = Counter()
    want_problems = [0, 0, 0]
    rows_outside = 0
    for t, rows in enumerate(polls):
        slots, values = [s for s, _ in rows], [v for _, v in rows]
        frame = Frame("gpu", [10.0 * t] * len(rows), slots, {"xid_last": values})
        found += [(f.slot, int(f.score)) for f in det.update(frame)]
        store.observe_frame(frame)
        events, *counts = naive(slots, values, ref_last)
        want_found += [(slots[i], int(v)) for i, v in events if int(v) not in APPLICATION]
        want_xids.update((slots[i], int(v)) for i, v in events)
        want_problems = [a + b for a, b in zip(want_problems, counts)]
        rows_outside += sum(not 0 <= s < GPUS for s in slots)
    assert found == want_found
    assert dict(store._xids) == dict(want_xids)
    outside, fractional, out_of_range = want_problems
    assert sum(n for (stage, _), n in det.health.problems.items() if stage == "xid") == rows_outside
    assert store.health.problems.get(("store", store_module.XID_OUTSIDE_TOPOLOGY), 0) == outside
    assert store.health.problems.get(("store", "XID code not a whole number: not counted"), 0) == fractional
    assert store.health.problems.get(("store", "XID code outside the guard's range: not counted"), 0) == out_of_range
    np.testing.assert_array_equal(det.s_last_xid, ref_last)
    np.testing.assert_array_equal(store._last_xid, ref_last)
    assert (det_backing[GPUS:] == GUARD).all() and (store_backing[GPUS:] == GUARD).all()


def test_a_negative_slot_is_no_finding_about_the_last_gpu():
    """Slot -1 indexed from the end: its XID 79 was "GPU fell off the bus" on the last GPU, whose latched
    code it also overwrote (its next reading then read as a new XID). The row is one problem."""
    det = XidDetector(gpus(2))
    assert det.update(Frame("gpu", [0.0, 0.0], [0, 1], {"xid_last": [0.0, 48.0]})) == []
    assert det.update(Frame("gpu", [10.0], [-1], {"xid_last": [79.0]})) == []
    assert det.update(Frame("gpu", [20.0, 20.0], [0, 1], {"xid_last": [0.0, 48.0]})) == []  # 48 still latched
    assert sum(n for (stage, _), n in det.health.problems.items() if stage == "xid") == 1


def test_codes_outside_in_a_frame_without_a_dbe_column_are_counted_by_the_detector():
    """A frame whose ``ecc_dbe`` column was taken out after it was made (a Frame makes every field's):
    no counter rules count its rows, so the detector counts the codes it skipped (nothing silently dropped)."""
    det = XidDetector(gpus(2))
    det.update(Frame("gpu", [0.0, 0.0], [0, 1], {"xid_last": [0.0, 48.0]}))
    frame = Frame("gpu", [10.0, 10.0, 10.0, 10.0], [0, -1, 2, 7], {"xid_last": [0.0, 79.0, 79.0, NAN]})
    del frame.columns["ecc_dbe"]
    assert det.update(frame) == []
    assert det.health.problems == {("xid", xid_module.XID_OUTSIDE_TOPOLOGY): 2}  # the two codes (NaN: none read)
    np.testing.assert_array_equal(det.s_last_xid, [0.0, 48.0])
