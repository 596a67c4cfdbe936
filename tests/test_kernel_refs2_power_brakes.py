"""The power detector's ``_age_out_brakes`` (detectors/power.py) against a plain-Python reference
written from its docstring, on hypothesis frames and states: nodes of several GPUs, brakes held or
not, throttle reasons read just in time, exactly ``stale_s`` ago, later than the row, or never (NaN),
rows the fit skipped as out of order (``R_DT`` < 0; NaN and -0.0 are not), rows past ``n_rows``,
nodes whose event is active with a count already 0 (its off hold running). The kernel is read as a
module attribute at call time, so that a mutated copy patched in is what runs.

Reference: after the frame, for each fitted row in order, each GPU of the row's node that holds a
brake whose reasons were not read within ``stale_s`` of the row's stamp lets it go (off its node's
count, never below 0); a node whose count the row's releases take to 0 has its event ended (not
active, no zero time). Returns how many brakes were let go."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from foreshock.detectors import power as pw
from foreshock.detectors import thermal_fit as tf

pytestmark = pytest.mark.kernel

NAN, INF = math.nan, math.inf
N_NODES = 3
STALE = 60.0


def naive_age_out(rows, gpu_node, brake, bits_ts, count, active, zero_ts, stale_s):
    """``rows``: (ts, slot, dt) of the fitted rows; the per-GPU and per-node lists are updated in place."""
    released = 0
    for ts, slot, dt in rows:
        if dt < 0.0:  # the fit skipped it as out of order
            continue
        node = gpu_node[slot]
        took = False
        for j in range(len(gpu_node)):
            if gpu_node[j] != node or brake[j] != 1.0:
                continue
            read_within = ts - bits_ts[j] <= stale_s  # (NaN: never read)
            if not read_within:
                brake[j] = 0.0
                count[node] = max(count[node] - 1.0, 0.0)
                released += 1
                took = True
        if took and count[node] == 0.0:
            active[node], zero_ts[node] = 0.0, NAN
    return released


gpu_state = st.tuples(st.sampled_from([0.0, 1.0, 1.0]),  # brake held
                      st.sampled_from([NAN, -INF, 0.0, 40.0, 100.0 - STALE, 100.0 - STALE - 1e-9, 99.0, 130.0]))
row_strategy = st.tuples(st.sampled_from([100.0, 100.0, 101.0, 160.0, 1e4]), st.sampled_from([-1.0, -0.0, 0.0,
                                                                                              5.0, NAN]))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(1, 4), min_size=N_NODES, max_size=N_NODES),
       extra=st.integers(0, 3), stale_s=st.sampled_from([STALE, 0.0, INF]))
@example(data=None, sizes=[2, 1, 1], extra=0, stale_s=STALE).via("a GPU never read, its brake held")
def test_age_out_brakes_matches_the_naive_reference(data, sizes, extra, stale_s):
    if data is None:  # the explicit example: GPU 0 braking, never read; GPU 1 braking, read just now
        gpu_node, gpus, rows = [0, 0, 1, 2], [(1.0, NAN), (1.0, 100.0), (0.0, NAN), (1.0, 99.0)], [(100.0, 1, 0.0)]
        active0 = [1.0, 0.0, 1.0]
    else:
        gpu_node = [node for node, k in enumerate(sizes) for _ in range(k)]
        gpu_node = data.draw(st.permutations(gpu_node))  # a node's GPUs need not be adjacent
        gpus = data.draw(st.lists(gpu_state, min_size=len(gpu_node), max_size=len(gpu_node)))
        rows = data.draw(st.lists(st.tuples(row_strategy, st.integers(0, len(gpu_node) - 1)), max_size=12))
        rows = [(ts, slot, dt) for (ts, dt), slot in rows]
        active0 = data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=N_NODES, max_size=N_NODES))
    n = len(gpu_node)
    brake = [b for b, _ in gpus]
    bits_ts = [t for _, t in gpus]
    count = [float(sum(brake[j] for j in range(n) if gpu_node[j] == node)) for node in range(N_NODES)]
    zero_ts = [NAN if a == 0.0 else 50.0 for a in active0]

    s = np.full((n, pw.S_SIZE), NAN)
    s = pw.with_flags(s, np.zeros(n), np.array(brake) == 1.0, np.zeros(n, dtype=bool))  # (S_FLAGS: see PK_*)
    s[:, pw.S_BITS_TS] = bits_ts
    node_brake = np.zeros((N_NODES, pw.N_SIZE))
    node_brake[:, pw.N_COUNT] = count
    node_brake[:, pw.N_ACTIVE] = active0
    node_brake[:, pw.N_ZERO_TS] = zero_ts
    parents = np.ascontiguousarray(np.stack([np.zeros(n, np.int64), np.array(gpu_node, np.int64)], axis=1))
    offsets = np.zeros(N_NODES + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([gpu_node.count(node) for node in range(N_NODES)])
    members = np.array([j for node in range(N_NODES) for j in range(n) if gpu_node[j] == node], dtype=np.int64)
    # rows past n_rows (a scratch buffer's tail): a stale braking GPU's row, never read
    tail = [(1e6, j, 0.0) for j in range(n)][:extra]
    all_rows = rows + tail
    m = len(all_rows)
    obs = tuple(np.full(m, NAN) for _ in range(14))
    obs[tf.X_TS][:] = [r[0] for r in all_rows]
    obs[tf.X_SLOT][:] = [float(r[1]) for r in all_rows]
    fit_rows = np.full((m, 3), NAN)
    fit_rows[:, tf.R_DT] = [r[2] for r in all_rows]

    got = pw._age_out_brakes(obs, fit_rows, len(rows), parents, (offsets, members), s, node_brake, stale_s)
    want = naive_age_out(rows, gpu_node, brake, bits_ts, count, active0, zero_ts, stale_s)
    assert got == want
    np.testing.assert_array_equal(pw.braking_of(s), np.array(brake) == 1.0)
    np.testing.assert_array_equal(s[:, pw.S_BITS_TS], bits_ts)  # read, never written
    np.testing.assert_array_equal(node_brake[:, pw.N_COUNT], count)
    np.testing.assert_array_equal(node_brake[:, pw.N_ACTIVE], active0)
    np.testing.assert_array_equal(node_brake[:, pw.N_ZERO_TS], zero_ts)
