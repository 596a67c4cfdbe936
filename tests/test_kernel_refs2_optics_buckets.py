"""The optics kernel's bucket bookkeeping (``_optics_kernel``, detectors/optics.py) against a plain-Python
reference written from its docstring and comments, on hypothesis rows: optics interleaved, rows of
unknown optics or with no stamp (NaN), stamps going back into a bucket already closed (a late sample,
dropped), gaps of exactly ``dark_gap_buckets`` and one more, loss of signal (the LOS flag at and under
0.5, RX power at and under ``los_dbm``, -inf). Checked: each optic's open bucket (``O_BUCKET``) and the
bucket it was last seen dark in (``O_DARK``: its own LOS, or the last of whole buckets it sent nothing
in); and that every emission of a step, a trend warning or a link alarm comes at a row that closed its
optic's bucket, the steps as the kernel documents them (at most one per signal, start, ETA NaN,
confidence 1, the signal and the new-module flag). What a step is (``_close_bucket``'s detection) is
not restated here. Stamps are finite or NaN: the input guard refuses infinite ones. The kernel is read
as a module attribute at call time, so that a mutated copy patched in is what runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from foreshock.detectors import alarm as al
from foreshock.detectors import optics as op
from test_optics import links

pytestmark = pytest.mark.kernel

NAN, INF = math.nan, math.inf
BUCKET, DARK_GAP, LOS_DBM = 60.0, 2.0, -30.0
N_LINKS = 2

STEPS = st.sampled_from([0.0, 1.0, 30.0, 30.0, 59.0, 60.0, 60.0, 61.0, 120.0, 180.0, 181.0, 240.0, -60.0, -1.0])
# mostly a steady level with jumps, so that some closes find a step
RX = st.sampled_from([NAN, -INF, -31.0, LOS_DBM, -29.9, 3.0, INF] + [-5.0] * 12 + [-12.0] * 4)
LOS = st.sampled_from([NAN, NAN, 0.49, 0.5, 1.0] + [0.0] * 8)
OPTIC = st.sampled_from([-1, 2 * N_LINKS, 0, 0, 0, 1, 1, 2, 3])
ROW = st.tuples(STEPS, OPTIC, RX, LOS, st.sampled_from([False] * 12 + [True]))
# ... or one optic read once a bucket (sometimes a bucket missed, or two rows in one), its RX power a
# steady level for a few buckets at a time: the steps a fit finds
RUN = st.tuples(st.sampled_from([-5.0, -5.0, -12.0, -2.0, -31.0]), st.integers(1, 6), st.sampled_from([0, 1]))
REGULAR = st.lists(RUN, max_size=10).map(lambda runs: [
    (st_, o, level, 0.0, False) for level, k, o in runs for _ in range(k) for st_ in (60.0, 20.0)])
ROWS = st.one_of(st.lists(ROW, max_size=80), REGULAR, st.tuples(REGULAR, st.lists(ROW, max_size=20)).map(
    lambda pair: pair[0] + pair[1]))


def naive_buckets(rows, n_opt):
    """Per optic, its open bucket and its last dark bucket; the rows that closed a bucket."""
    bucket, dark, closes, spacing = [NAN] * n_opt, [NAN] * n_opt, set(), [NAN] * n_opt
    for i, (t, o, rx, los) in enumerate(rows):
        if not 0 <= o < n_opt or math.isnan(t):
            continue
        b = math.floor(t / BUCKET)
        cur = bucket[o]
        if not math.isnan(cur) and b > cur:
            closes.add(i)
            gap = b - cur
            if math.isnan(spacing[o]):  # the optic's first step seeds its usual spacing, not judged
                spacing[o] = gap
            else:  # whole buckets without a sample, beyond DARK_GAP x its usual spacing: gone dark
                bar = DARK_GAP * max(spacing[o], 1.0)
                spacing[o] += op.SPACING_WEIGHT * (min(gap, bar) - spacing[o])
                if gap > bar:
                    dark[o] = b - 1
        if math.isnan(cur) or b > cur:
            bucket[o] = b
        elif b < cur:
            continue  # a late sample for a closed bucket
        if los >= 0.5 or rx < LOS_DBM:  # loss of signal
            dark[o] = b
    return bucket, dark, closes


@settings(max_examples=200, deadline=None)
@given(steps=ROWS,
       split=st.integers(0, 120))
@example(steps=[(0.0, 0, -5.0, 0.0, False), (180.0, 0, -5.0, 0.0, False), (60.0, 0, -5.0, 0.0, False),
                (1.0, 1, LOS_DBM, 0.5, False)], split=2).via("a gap of 3 buckets, then LOS at the flag's bar")
def test_optics_kernel_buckets_and_dark_optics_match_the_naive_reference(steps, split):
    det = op.OpticsDetector(links(N_LINKS), bucket_s=BUCKET, window=4, min_points=2, dark_gap_buckets=DARK_GAP,
                            los_dbm=LOS_DBM)
    n_opt = det.s_optic.shape[0]
    rows, t = [], 10_000.0 * BUCKET
    for step, o, rx, los, no_stamp in steps:
        t += step
        rows.append((NAN if no_stamp else t, o, rx, los))
    ts = np.array([r[0] for r in rows], dtype=np.float64)
    slot = np.array([r[1] for r in rows], dtype=np.int32)
    x = np.full((len(rows), op.X_SIZE), NAN)
    x[:, op.X_RX] = [r[2] for r in rows]
    x[:, op.X_LOS] = [r[3] for r in rows]
    x[:, op.X_TXP], x[:, op.X_BIAS], x[:, op.X_TEMP] = -1.0, 0.008, 45.0
    state = (det.s_acc, det.s_optic, det.s_ring_t, det.s_ring, det.s_ring_temp, det.s_fit, det.s_alarm,
             det.s_link_bucket)
    trend_state = (det.s_trend_acc, det.s_trend, det.s_trend_ring, det.s_trend_fit)
    emitted = []
    cut = min(split, len(rows))  # two frames: the state carried from one to the next
    for part in (slice(0, cut), slice(cut, None)):
        out = np.full((len(rows) * (op.N_SIG + 3) + N_LINKS, al.OUT_SIZE), NAN)
        n = op._optics_kernel(ts[part], slot[part], np.ascontiguousarray(x[part]), state, trend_state, det.params,
                              det.q_limit, det.s_module_alarm, det._work, out)
        got = out[:n].copy()
        got[:, al.O_ROW] += part.start or 0
        emitted.extend(got.tolist())
    bucket, dark, closes = naive_buckets(rows, n_opt)
    np.testing.assert_array_equal(det.s_optic[:, op.O_BUCKET], bucket)
    np.testing.assert_array_equal(det.s_optic[:, op.O_DARK], dark)
    steps_at: dict[int, list[float]] = {}
    for e in emitted:
        row, which = int(e[al.O_ROW]), int(e[al.O_WHICH])
        if which in (op.EMIT_STEP, op.EMIT_TREND, op.EMIT_LINK_DOWN):
            assert row in closes, (row, which)
        if which == op.EMIT_STEP:
            assert e[al.O_CODE] == al.CODE_START and math.isnan(e[al.O_ETA]) and e[al.O_CONF] == 1.0
            assert not math.isnan(e[al.O_V0]) and e[al.O_V0 + 3] in (0.0, 1.0)
            assert e[al.O_V0 + 4:al.O_V0 + 6] == [0.0, 0.0]
            steps_at.setdefault(row, []).append(e[al.O_V0 + 2])
    for signals in steps_at.values():  # one step per signal at most, in signal order
        assert signals == sorted(set(signals)) and set(signals) <= set(map(float, range(op.N_SIG)))
