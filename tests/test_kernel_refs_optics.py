"""The optics kernel's link decisions (detectors/optics.py), which no other test holds against a
reference: ``_link_alarm`` (a link's ``link_down`` prediction from its ends' ETAs, once per bucket)
and ``_withdraw_silent_links`` (a prediction whose link went silent at both ends). Each against a
plain-Python reference written from its docstring, on hypothesis states: NaN and infinite ETAs, fits
never made, stale or just in time, confidences at the bar, ETAs at the horizon and the clear level."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import alarm as al
from foreshock.detectors import optics as op
from naive_refs import naive_alarm_step, new_alarm

NAN, INF = math.nan, math.inf
CODES = {"start": al.CODE_START, "refresh": al.CODE_REFRESH, "withdraw": al.CODE_WITHDRAW}
N_LINKS = 2
N_OPT = 2 * N_LINKS
ETA_COLS = ((op.PRED_Q, op.O_ETA_Q, op.SIG_Q), (op.PRED_RX, op.O_ETA_RX, op.SIG_RX),
            (op.PRED_BIAS, op.O_ETA_BIAS, op.SIG_BIAS))
HORIZON, CLEAR, WINDOW, BUCKET = 600.0, 1.5, 4.0, 60.0  # stale after 240 s; clear beyond 900 s


def params(on_count: float) -> np.ndarray:
    return op.params_vector({"horizon_s": HORIZON, "clear_factor": CLEAR, "window": WINDOW, "min_points": 2.0,
                             "bucket_s": BUCKET, "off_hold_s": 120.0, "refresh_s": 60.0, "on_count": on_count,
                             "confidence_min": 0.6})


def new_state(data, pool) -> tuple:  # type: ignore[no-untyped-def]
    """The detector's state arrays, with drawn ETAs, fits and last buckets."""
    optic = np.full((N_OPT, op.O_SIZE), NAN)
    fit = np.full((N_OPT, op.N_SIG, op.F_SIZE), NAN)
    for o in range(N_OPT):
        draw_optic(data, optic, fit, o, 0.0, pool)
        optic[o, op.O_BUCKET] = data.draw(st.sampled_from([NAN, 0.0, 3.0, 4.0, 5.0]))
    w = int(WINDOW)
    return (np.zeros((N_OPT, op.ACC_SIZE)), optic, np.full((N_OPT, w), NAN), np.full((N_OPT, op.N_SIG, w), NAN),
            np.full((N_OPT, w), NAN, dtype=np.float32), fit, al.new_alarm_columns(N_LINKS, 1),
            np.full(N_LINKS, -INF))


# ETAs: mostly none (inf), so that the few drawn are the link's soonest more often (60: counted down to
# 0); or few values, so that ends and predictors tie
SPARSE = (NAN, INF, INF, INF, INF, 0.0, 60.0, HORIZON, HORIZON + 60, HORIZON * CLEAR, HORIZON * CLEAR + 60, 1e5)
DENSE = (NAN, INF, 0.0, HORIZON, HORIZON * CLEAR, 1e5)


def draw_optic(data, optic, fit, o, t, pool):  # type: ignore[no-untyped-def]
    """An optic refitted at ``t``: its ETAs, and its fits' confidence, last point, slope and level."""
    for _, col, sig in ETA_COLS:
        optic[o, col] = data.draw(st.sampled_from(pool))
        fit[o, sig, op.F_CONF] = data.draw(st.sampled_from([NAN, 0.2, 0.6, 0.9, 0.9]))
        fit[o, sig, op.F_T] = t - data.draw(st.sampled_from([NAN, 0.0, 60.0, WINDOW * BUCKET, WINDOW * BUCKET + 1,
                                                             -30.0]))
        fit[o, sig, op.F_SLOPE] = data.draw(st.sampled_from([-0.5, 0.0, 0.25]))
        fit[o, sig, op.F_LEVEL] = data.draw(st.sampled_from([-3.0, 12.0]))
    fit[o, op.SIG_RX, op.F_T] = t - data.draw(st.sampled_from([0.0, 60.0]))  # (the RX level is reported)


def naive_link_alarm(row, o, bucket, t, optic, fit, alarm, link_bucket, p, out):  # type: ignore[no-untyped-def]
    """Once per bucket per link: of its ends' predictors whose fit's last point is at most a window
    old (else the ETA is unknown: set to inf), and with ``confidence_min`` (an ETA of 0: confidence 1),
    the smallest ETA counted down from the fit's last point (of equals the most confident, then the
    first); the link's alarm fires at the horizon and clears beyond ``horizon * clear_factor``; an
    emission reports the predictor, the end, the fit's slope and its level now, and RX's now."""
    link = o // 2
    if not bucket > link_bucket[link]:
        return
    link_bucket[link] = bucket
    best = (INF, -0.0, o, op.PRED_Q, 0.0)  # eta, -confidence, end, predictor, elapsed
    for end in (2 * link, 2 * link + 1):
        for pred, col, sig in ETA_COLS:
            eta = optic[end][col]
            if math.isnan(eta) or eta == INF:
                continue
            elapsed = t - fit[end][sig][op.F_T]
            elapsed = 0.0 if elapsed < 0 else elapsed
            if math.isnan(elapsed) or elapsed > WINDOW * BUCKET:
                optic[end][col] = INF
                continue
            conf = 1.0 if eta == 0.0 else fit[end][sig][op.F_CONF]
            eta = eta if eta == 0.0 else max(eta - elapsed, 0.0)
            if math.isnan(conf) or conf < p[op.P_CONF_MIN]:
                continue
            if (eta, -conf) < best[:2]:
                best = (eta, -conf, end, pred, elapsed)
    eta, conf, end, pred = best[0], -best[1] + 0.0, best[2], best[3]
    what = naive_alarm_step(alarm[link], t, eta <= HORIZON, not eta <= HORIZON * CLEAR, p[op.P_ON],
                            p[op.P_OFF_HOLD], p[op.P_REFRESH])
    if what is not None:
        sig = op.PRED_SIGNAL[pred]
        rx_elapsed = max(t - fit[end][op.SIG_RX][op.F_T], 0.0)
        slope, rx_slope = fit[end][sig][op.F_SLOPE], fit[end][op.SIG_RX][op.F_SLOPE]
        out.append([row, op.EMIT_LINK_DOWN, CODES[what], eta, conf, float(pred), float(end), slope,
                    fit[end][sig][op.F_LEVEL] + slope * best[4],
                    fit[end][op.SIG_RX][op.F_LEVEL] + rx_slope * rx_elapsed, rx_slope])


def naive_withdraw_silent_links(row, bucket, t, optic, alarm, out):  # type: ignore[no-untyped-def]
    """Each link with an active prediction whose two ends both had no row for over ``window``
    buckets (never: silent) is withdrawn now, its ends' ETAs forgotten (inf); the withdrawal names
    the end of the soonest ETA (the link's first end where none is known)."""
    for link in range(N_LINKS):
        a = alarm[link]
        if not a["active"]:
            continue
        ends = (2 * link, 2 * link + 1)
        heard = [not math.isnan(optic[e][op.O_BUCKET]) and bucket - optic[e][op.O_BUCKET] <= WINDOW for e in ends]
        if any(heard):
            continue
        etas = [(optic[e][col], e) for e in ends for _, col, _ in ETA_COLS if not math.isnan(optic[e][col])]
        soonest = min(etas, key=lambda x: x[0], default=(INF, ends[0]))
        named = soonest[1] if soonest[0] < INF else ends[0]
        for e in ends:
            for _, col, _ in ETA_COLS:
                optic[e][col] = INF
        a.update(active=False, on=0.0, off_ts=NAN, emit_ts=t)
        out.append([row, op.EMIT_LINK_SILENT, al.CODE_WITHDRAW, INF, 0.0, float(op.PRED_Q), float(named)]
                   + [NAN] * 4)


def alarm_columns(alarm: list[dict]) -> np.ndarray:
    return np.array([[1.0 if a["active"] else 0.0, float(a["on"]), a["emit_ts"], a["off_ts"]] for a in alarm])


@pytest.mark.kernel
@settings(max_examples=300, deadline=None)
@given(data=st.data(), on_count=st.sampled_from([1.0, 2.0]), steps=st.integers(1, 8))
def test_link_alarm_and_silent_links_match_the_naive_references(data, on_count, steps):
    p = params(on_count)
    pool = data.draw(st.sampled_from([SPARSE, DENSE]))
    state = new_state(data, pool)
    _, optic, _, _, _, fit, alarm, link_bucket = state
    ref_optic, ref_alarm, ref_bucket = optic.tolist(), [new_alarm() for _ in range(N_LINKS)], link_bucket.tolist()
    out = np.full((2 * steps * N_LINKS + 8, al.OUT_SIZE), -7.0)
    want: list[list[float]] = []
    n, t, bucket = 0, 1000.0, 5.0
    for row in range(steps):
        t += data.draw(st.sampled_from([0.0, 0.0, 60.0, 200.0]))
        bucket += data.draw(st.sampled_from([0.0, 1.0, 3.0]))
        o = data.draw(st.integers(0, N_OPT - 1))
        if data.draw(st.booleans()):  # the optic's bucket closed with a new fit
            draw_optic(data, optic, fit, o, t, pool)
            ref_optic[o] = optic[o].tolist()
        if data.draw(st.booleans()):
            n = op._withdraw_silent_links(row, bucket, t, state, p, out, n)
            naive_withdraw_silent_links(row, bucket, t, ref_optic, ref_alarm, want)
        n = op._link_alarm(row, o, bucket, t, state, p, out, n)
        naive_link_alarm(row, o, bucket, t, ref_optic, fit.tolist(), ref_alarm, ref_bucket, p, want)
        assert n == len(want), row
        np.testing.assert_array_equal(optic, ref_optic)
        np.testing.assert_array_equal(alarm, alarm_columns(ref_alarm))
        np.testing.assert_array_equal(link_bucket, ref_bucket)
    got = out[:n, :al.O_V0 + 6]
    np.testing.assert_allclose(got, np.array(want).reshape(n, al.O_V0 + 6), rtol=0, atol=1e-12)
