"""The replay's window-cutting kernels (core/recording.py) against plain-Python references written
from their docstrings, on hypothesis stamps: NaN and infinite stamps, repeats, rows at the window's
edges, strays far ahead that the rows after them fall back from. ``_first_stamp``: where the replay
starts; ``_first_at_or_after``: the prefix of a batch that belongs before a window's end;
``_next_stamp``: where the rows left after a window start."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock import recording as rc

NAN, INF = math.nan, math.inf


def naive_first_stamp(ts: list[float], window: float) -> float:
    """The first finite stamp (inf where none); where none of the next four finite stamps lies
    within ten windows of it but two of those four do of each other, it is a stray, and the start
    is the first of the first such pair."""
    near = [t for t in ts if math.isfinite(t)][:5]
    if not near:
        return INF
    span = 10 * window
    if any(abs(t - near[0]) <= span for t in near[1:]):
        return near[0]
    pairs = [(i, j) for i in range(1, len(near)) for j in range(i + 1, len(near)) if abs(near[j] - near[i]) <= span]
    return near[min(pairs)[0]] if pairs else near[0]


@pytest.mark.kernel
@settings(max_examples=200, deadline=None)
@given(ts=st.lists(st.sampled_from([NAN, INF, -INF, 0.0, 5.0, 10.0, 10.5, 1000.0, 1000.0, 1010.0, 1e12, 2e12]),
                   max_size=9))
def test_first_stamp_matches_the_naive_rule(ts):
    got = rc._first_stamp(np.array(ts, dtype=np.float64), 1.0)
    assert got == naive_first_stamp(ts, 1.0)


T_END, WINDOW = 100.0, 10.0
stamps = st.lists(st.sampled_from([NAN, INF, -INF, 50.0, 96.0, 99.5, T_END, T_END, 105.0, T_END + WINDOW, 115.0,
                                   300.0, 1e6]), max_size=20)
since_s = st.sampled_from([0.0, 96.0, T_END])  # 96: a stamp that falls back exactly to it
ahead_s = st.integers(0, 5)


def naive_prefix(ts: list[float], t_end: float, window: float, since: float, ahead: int) -> tuple[int, bool]:
    """Rows ride along (stay in the prefix) while before ``t_end`` or without a finite stamp; the first
    row at or after ``t_end`` ends the prefix, unless it lies a window or more past ``t_end`` and one of
    the ``max(ahead, rows before it)`` rows after it falls back into ``[since, t_end)``: then it and the
    rows up to the first such one ride along. Also: whether the rows looked at ran past the end."""
    n, i = len(ts), 0
    while i < n:
        t = ts[i]
        if not math.isfinite(t) or t < t_end:
            i += 1
            continue
        if t < t_end + window:
            return i, False
        look = list(range(i + 1, min(i + 1 + max(ahead, i), n)))
        back = [j for j in look if since <= ts[j] < t_end]
        if not back:
            return i, i + 1 + max(ahead, i) > n
        i = back[0]
    return n, False


@pytest.mark.kernel
@settings(max_examples=300, deadline=None)
@given(ts=stamps, since=since_s, ahead=ahead_s)
def test_first_at_or_after_matches_the_naive_prefix(ts, since, ahead):
    got = rc._first_at_or_after(np.array(ts, dtype=np.float64), T_END, WINDOW, since, ahead)
    assert (int(got[0]), bool(got[1])) == naive_prefix(ts, T_END, WINDOW, since, ahead)


def naive_next(ts: list[float], t_end: float, window: float, since: float, ahead: int) -> tuple[float, bool]:
    """The first finite stamp at or after ``t_end``; where it lies a window or more past ``t_end`` and
    one of the ``ahead`` rows after it falls back (at or after ``since``, over a window before it), the
    first such stamp instead. -inf where there is none. Also: whether the rows looked at ran past the end."""
    n = len(ts)
    for i, t in enumerate(ts):
        if not (math.isfinite(t) and t >= t_end):
            continue
        if t < t_end + window:
            return t, False
        back = [ts[j] for j in range(i + 1, min(i + 1 + ahead, n)) if since <= ts[j] < t - window]
        return (back[0], False) if back else (t, i + 1 + ahead > n)
    return -INF, False


@pytest.mark.kernel
@settings(max_examples=300, deadline=None)
@given(ts=stamps, since=since_s, ahead=ahead_s)
def test_next_stamp_matches_the_naive_start(ts, since, ahead):
    got = rc._next_stamp(np.array(ts, dtype=np.float64), T_END, WINDOW, since, ahead)
    assert (float(got[0]), bool(got[1])) == naive_next(ts, T_END, WINDOW, since, ahead)
