"""Kernels that drive the alarm state machine (detectors/alarm.py) straight from scores, each against
a plain-Python reference written from the kernels' docstrings: the baselines' score alarms
(``baselines._score_alarms``), the Mahalanobis episodes (``mahalanobis._episodes``) and the withdrawal
of silent slots (``alarm._silent_alarms``). The alarm's life is :func:`naive_refs.naive_alarm_step`;
a withdrawal without the clear hold is restated here. Kernels are read as module attributes at call
time, so that a mutated copy patched in is what runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import alarm as al
from foreshock.detectors import baselines as bl
from foreshock.detectors import mahalanobis as mh
from naive_refs import naive_alarm_step, new_alarm

NAN = math.nan
CODES = {"start": al.CODE_START, "refresh": al.CODE_REFRESH, "withdraw": al.CODE_WITHDRAW}


def as_columns(a: dict) -> list[float]:
    """A reference alarm as the kernel's four state columns."""
    return [1.0 if a["active"] else 0.0, float(a["on"]), a["emit_ts"], a["off_ts"]]


def from_columns(row: np.ndarray) -> dict:
    return {"active": row[al.A_ACTIVE] != 0.0, "on": float(row[al.A_ON]), "emit_ts": float(row[al.A_EMIT_TS]),
            "off_ts": float(row[al.A_OFF_TS])}


# rows: (time step, slot, score); times never go back (a guarded frame), repeats allowed
LEVELS = (1.0, 2.0, 5.0)  # on / off levels, hit exactly by some scores
score = st.one_of(st.sampled_from([NAN, math.inf, 0.0, 1.0, 2.0, 5.0, 5.0, 10.0]), st.floats(-3, 12))
rows_strategy = st.lists(st.tuples(st.sampled_from([0.0, 0.0, 1.0, 5.0, 30.0]), st.integers(0, 3),
                                   st.lists(score, min_size=2, max_size=2)), max_size=60)
timing_strategy = st.tuples(st.sampled_from([1.0, 2.0, 3.0]), st.sampled_from([0.0, 10.0, 60.0]),
                            st.sampled_from([0.0, 30.0, math.inf]))


def naive_score_alarms(ts, slots, scores, alarms, on_level, off_level, timing):
    """Per row, per score column with a score (NaN: none), the slot's alarm steps: firing at or above
    the on level, clear strictly below the off level; each start, refresh or withdrawal is emitted
    as (row, column, code, ETA -1, confidence 1, the score, then five zeros)."""
    on_count, off_hold, refresh = timing
    out = []
    for row, (t, s) in enumerate(zip(ts, slots)):
        for k in range(len(on_level)):
            x = scores[row][k]
            if math.isnan(x):
                continue
            what = naive_alarm_step(alarms[s][k], t, x >= on_level[k], x < off_level[k], on_count, off_hold, refresh)
            if what is not None:
                out.append([row, k, CODES[what], -1.0, 1.0, x, 0.0, 0.0, 0.0, 0.0, 0.0])
    return out


@pytest.mark.kernel
@settings(max_examples=150, deadline=None)
@given(rows=rows_strategy, timing=timing_strategy, levels=st.permutations(LEVELS))
def test_score_alarms_matches_the_naive_alarm(rows, timing, levels):
    n_slots, k = 4, 2
    ts = np.cumsum([r[0] for r in rows]).astype(np.float64)
    slots = [r[1] for r in rows]
    obs = np.column_stack([ts, np.array(slots, dtype=np.float64)]) if rows else np.empty((0, 2))
    scores = np.array([r[2] for r in rows], dtype=np.float64).reshape(len(rows), k)
    on_level = np.array([max(levels[0], levels[1]), levels[2]])
    off_level = np.array([min(levels[0], levels[1]), levels[2]])  # the second column: on == off
    alarms = al.new_alarm_columns(n_slots, k)
    out = np.full((k * len(rows), al.OUT_SIZE), -7.0)
    n = bl._score_alarms(np.ascontiguousarray(obs), np.ascontiguousarray(scores), alarms, on_level, off_level,
                         np.array(timing, dtype=np.float64), out)
    ref = [[new_alarm() for _ in range(k)] for _ in range(n_slots)]
    want = naive_score_alarms(ts.tolist(), slots, scores.tolist(), ref, on_level, off_level, timing)
    assert n == len(want)
    got = out[:n]
    np.testing.assert_array_equal(got[:, :al.O_V0 + 6], np.array(want).reshape(n, al.O_V0 + 6))
    assert np.isnan(got[:, al.O_V0 + 6:]).all()
    for s in range(n_slots):
        for b in range(k):
            np.testing.assert_array_equal(alarms[s, b * al.A_SIZE:(b + 1) * al.A_SIZE], as_columns(ref[s][b]))


@pytest.mark.kernel
@settings(max_examples=150, deadline=None)
@given(rows=rows_strategy, on_count=st.sampled_from([1.0, 2.0, 3.0]), off_hold=st.sampled_from([0.0, 10.0, 60.0]))
def test_episodes_match_the_naive_alarm(rows, on_count, off_hold):
    """An episode starts where the entity's alarm starts: firing strictly above the on limit, clear
    strictly below the clear limit, no refresh; a row without a D^2 (NaN) decides nothing."""
    n_slots, on_d2, clear_d2 = 4, 5.0, 2.0
    ts = np.cumsum([r[0] for r in rows]).astype(np.float64)
    slots = np.array([r[1] for r in rows], dtype=np.int64)
    d2 = np.array([r[2][0] for r in rows], dtype=np.float64)
    alarm = al.new_alarm_columns(n_slots, 1)
    starts = np.full(len(rows), -1, np.int64)
    n = mh._episodes(ts, slots, d2, alarm, np.array([on_d2, clear_d2, on_count, off_hold]), starts)
    ref = [new_alarm() for _ in range(n_slots)]
    want = []
    for i in range(len(rows)):
        if math.isnan(d2[i]):
            continue
        what = naive_alarm_step(ref[slots[i]], ts[i], d2[i] > on_d2, d2[i] < clear_d2, on_count, off_hold, math.inf)
        if what == "start":
            want.append(i)
    assert starts[:n].tolist() == want
    for s in range(n_slots):
        np.testing.assert_array_equal(alarm[s], as_columns(ref[s]))


def naive_withdraw(a: dict, now: float) -> bool:
    """A prediction withdrawn now without the clear hold: off, its firing count and clear time
    forgotten, its last emission now; False (nothing changes) if it was not active."""
    if not a["active"]:
        return False
    a.update(active=False, on=0.0, off_ts=NAN, emit_ts=now)
    return True


block = st.tuples(st.booleans(), st.sampled_from([0.0, 1.0, 2.0]), st.sampled_from([NAN, 0.0, 400.0, 999.0]),
                  st.sampled_from([NAN, 500.0, 990.0]))


@pytest.mark.kernel
@settings(max_examples=150, deadline=None)
@given(slots=st.lists(st.tuples(st.lists(block, min_size=2, max_size=2),
                                st.sampled_from([NAN, -math.inf, 0.0, 399.0, 400.0, 401.0, 1000.0, 1e9])),
                      max_size=12),
       silent_s=st.sampled_from([0.0, 600.0, math.inf]))
def test_silent_alarms_match_a_naive_withdrawal(slots, silent_s):
    """Each active alarm of a slot last heard more than ``silent_s`` before ``now`` (never heard:
    NaN, silent too) is withdrawn, in slot then block order; the counting pass changes nothing."""
    now, count = 1000.0, 2
    state = al.new_alarm_columns(len(slots), count)
    for i, (blocks, _) in enumerate(slots):
        for b, (active, on, emit_ts, off_ts) in enumerate(blocks):
            state[i, b * al.A_SIZE:(b + 1) * al.A_SIZE] = [float(active), on, emit_ts, off_ts]
    last_ts = np.array([t for _, t in slots], dtype=np.float64)
    ref = [[from_columns(state[i, b * al.A_SIZE:(b + 1) * al.A_SIZE]) for b in range(count)] for i in range(len(slots))]
    want = []
    for i in range(len(slots)):
        silent = math.isnan(last_ts[i]) or now - last_ts[i] > silent_s
        for b in range(count):
            if silent and naive_withdraw(ref[i][b], now):
                want.append((i, b))
    before = state.copy()
    n = al._silent_alarms(state, count, last_ts, now, silent_s, np.empty(0, np.int64), np.empty(0, np.int64))
    assert n == len(want)
    np.testing.assert_array_equal(state, before)  # counting only
    got_slots, got_blocks = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    assert al._silent_alarms(state, count, last_ts, now, silent_s, got_slots, got_blocks) == n
    assert list(zip(got_slots.tolist(), got_blocks.tolist())) == want
    for i in range(len(slots)):
        for b in range(count):
            np.testing.assert_array_equal(state[i, b * al.A_SIZE:(b + 1) * al.A_SIZE], as_columns(ref[i][b]))
