"""The finding store's kernels (exporters/store.py) against plain-Python references written from their
docstrings, on hypothesis rows: repeated slots, NaN and infinite stamps and values, slots outside the
arrays. ``_observe_latest`` and ``_newest``: each slot's latest values and newest stamp, and the frame's
clock. (The XID transitions it counts are the detector's kernel, ``xid.xid_events``, checked against a
reference in test_xid_shared_kernel.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.exporters import store

NAN, INF = math.nan, math.inf
BIG = np.finfo(np.float64).max

stamp = st.sampled_from([NAN, INF, -INF, 0.0, 5.0, 5.0, 10.0, -3.0, 1e300])
value = st.sampled_from([NAN, 0.0, 1.5, -2.0, INF])


def naive_clock(ts: list[float]) -> tuple[float, bool]:
    """The newest stamp, NaN skipped and infinities counted (-inf where none), and whether any is finite."""
    real = [t for t in ts if not math.isnan(t)]
    return (max(real) if real else -INF), any(math.isfinite(t) for t in real)


@pytest.mark.kernel
@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(stamp, st.integers(-1, 4), st.lists(value, min_size=2, max_size=2)), max_size=30),
       start=st.lists(st.sampled_from([-INF, 0.0, 7.0]), min_size=4, max_size=4))
def test_observe_latest_matches_a_naive_row_loop(rows, start):
    n_slots, fields = 4, 2
    ts = np.array([t for t, _, _ in rows], dtype=np.float64)
    slot = np.array([s for _, s, _ in rows], dtype=np.int32)
    columns = tuple(np.array([v[j] for _, _, v in rows], dtype=np.float64) for j in range(fields))
    latest = np.full((fields, n_slots), NAN)
    latest[0, 1] = 42.0  # a value from an earlier frame, kept where no new one comes
    seen = np.zeros(n_slots, dtype=np.bool_)
    last_seen = np.array(start, dtype=np.float64)

    ref_latest = latest.copy()
    ref_seen = [False] * n_slots
    ref_last = list(start)
    ref_valued = []
    for t, s, vals in rows:
        # a row with no value is no report of its entity (a lost GPU's row of NaN): not seen
        ref_valued.append(0 <= s < n_slots and any(not math.isnan(v) for v in vals))
        if not ref_valued[-1]:
            continue  # outside the arrays, or no value: only the clock reads it
        for j, v in enumerate(vals):
            if not math.isnan(v):
                ref_latest[j, s] = v
        ref_seen[s] = True
        if not math.isnan(t):
            ref_last[s] = max(ref_last[s], min(max(t, -BIG), BIG))  # infinities as np.nan_to_num makes them

    valued = np.ones(len(rows), dtype=np.bool_)  # (set on every row, whatever it held)
    newest, any_finite = store._observe_latest(ts, slot, columns, latest, seen, last_seen, valued)
    np.testing.assert_array_equal(valued, ref_valued)
    want_newest, want_finite = naive_clock(ts.tolist())
    assert (newest, any_finite) == (want_newest, want_finite)
    assert store._newest(ts) == (want_newest, want_finite)
    np.testing.assert_array_equal(latest, ref_latest)
    np.testing.assert_array_equal(seen, ref_seen)
    np.testing.assert_array_equal(last_seen, ref_last)
