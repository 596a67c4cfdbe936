"""The optics detector's early warning, ``_trend_warning`` (detectors/optics.py), against a plain-Python
reference written from its docstring, on hypothesis states: ETAs NaN, 0, negative, infinite, right at
the horizon and at ``trend_horizon_s`` (before and after the countdown from the fit's last point),
fits never made (NaN last point and confidence), last points later than now, confidences at the bar,
a previous warning less than, exactly and more than ``trend_refresh_s`` ago. Both of the kernel's
callers' layouts are driven: the early-warning trend's own ETA table (``T_ETA_*``), and the optic's
row itself (``O_ETA_*``, the window's fit). The kernel is read as a module attribute at call time, so
that a mutated copy patched in is what runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from foreshock.detectors import alarm as al
from foreshock.detectors import optics as op

pytestmark = pytest.mark.kernel

NAN, INF = math.nan, math.inf
HORIZON, TREND_HORIZON, REFRESH, CONF_MIN = 600.0, 6000.0, 1000.0, 0.6
N_OPT = 2
T = 10_000.0
PREDICTORS = (op.PRED_Q, op.PRED_RX, op.PRED_BIAS)  # the order the kernel looks at them in


def params() -> np.ndarray:
    return op.params_vector({"horizon_s": HORIZON, "trend_horizon_s": TREND_HORIZON, "trend_refresh_s": REFRESH,
                             "confidence_min": CONF_MIN})


def naive_trend_warning(row, o, t, last_emit, etas, fits):
    """``etas``: predictor -> the optic's ETA; ``fits``: signal -> (last point, confidence, slope, level).
    No warning within ``trend_refresh_s`` of the last one (none yet: any time). Else the first predictor
    (Q, RX, bias) whose ETA, counted down from its fit's last point to ``t`` (a positive ETA only: 0 is
    now, never counted below 0; a fit later than ``t`` counts nothing; no last point: no ETA), lies
    beyond the horizon and within ``trend_horizon_s``, its fit's confidence at least ``confidence_min``:
    one warning, (row, trend, start, ETA, confidence, predictor, optic, slope, level, 0, 0), and ``t``
    becomes the last warning's time. Returns (warning or None, last warning's time)."""
    if not math.isnan(last_emit) and t - last_emit < REFRESH:
        return None, last_emit
    for pred in PREDICTORS:
        f_t, conf, slope, level = fits[op.PRED_SIGNAL[pred]]
        eta = etas[pred]
        if eta > 0.0:
            elapsed = t - f_t
            if math.isnan(elapsed):
                continue
            eta = max(eta - max(elapsed, 0.0), 0.0)
        if HORIZON < eta <= TREND_HORIZON and conf >= CONF_MIN:
            return [row, op.EMIT_TREND, al.CODE_START, eta, conf, float(pred), float(o), slope, level, 0.0, 0.0], t
    return None, last_emit


ETAS = st.sampled_from([NAN, INF, -INF, -5.0, 0.0, 0.0, 100.0, HORIZON, HORIZON + 1, HORIZON + 60, 3000.0,
                        TREND_HORIZON, TREND_HORIZON + 60, TREND_HORIZON + 61, 1e9])
AGES = st.sampled_from([NAN, 0.0, 0.0, 60.0, 61.0, 2400.0, -30.0, INF])  # t - the fit's last point
CONFS = st.sampled_from([NAN, 0.0, 0.59, CONF_MIN, 0.9, 1.0])
LAST_EMIT = st.sampled_from([NAN, NAN, T - REFRESH, T - REFRESH + 1, T - 5 * REFRESH, T, T + 50.0])


@settings(max_examples=400, deadline=None)
@given(data=st.data(), own_row=st.booleans(), o=st.integers(0, N_OPT - 1), last_emit=LAST_EMIT)
@example(data=None, own_row=False, o=1, last_emit=NAN).via("an ETA at the trend horizon once counted down")
def test_trend_warning_matches_the_naive_reference(data, own_row, o, last_emit):
    optic = np.full((N_OPT, op.O_SIZE), NAN)
    fit = np.full((N_OPT, op.N_SIG, op.F_SIZE), NAN)
    if own_row:  # the window's own fit: ETAs in the optic's row
        table, cols = optic, {op.PRED_Q: op.O_ETA_Q, op.PRED_RX: op.O_ETA_RX, op.PRED_BIAS: op.O_ETA_BIAS}
    else:
        table = np.full((N_OPT, op.T_SIZE), NAN)
        cols = {op.PRED_Q: op.T_ETA_Q, op.PRED_RX: op.T_ETA_RX, op.PRED_BIAS: op.T_ETA_BIAS}
    etas, fits = {}, {}
    for pred in PREDICTORS:
        sig = op.PRED_SIGNAL[pred]
        if data is None:  # Q: 6060 s, fit 60 s old: 6000, at the trend horizon
            eta, age, conf = (TREND_HORIZON + 60, 60.0, 0.9) if pred == op.PRED_Q else (NAN, NAN, NAN)
        else:
            eta, age, conf = data.draw(ETAS), data.draw(AGES), data.draw(CONFS)
        etas[pred] = eta
        fits[sig] = (T - age, conf, -0.25 * (sig + 1), 7.0 + sig)
        table[o, cols[pred]] = eta
        fit[o, sig, op.F_T], fit[o, sig, op.F_CONF] = T - age, conf
        fit[o, sig, op.F_SLOPE], fit[o, sig, op.F_LEVEL] = fits[sig][2], fits[sig][3]
    optic[o, op.O_TREND_EMIT] = last_emit
    other = optic[1 - o].copy()
    out = np.full((4, al.OUT_SIZE), -7.0)
    n = op._trend_warning(3, o, T, optic, table, cols[op.PRED_Q], cols[op.PRED_RX], cols[op.PRED_BIAS], fit,
                          params(), out, 1)
    want, emitted = naive_trend_warning(3, o, T, last_emit, etas, fits)
    assert n == (1 if want is None else 2)
    if want is not None:
        np.testing.assert_array_equal(out[1, :al.O_V0 + 6], want)
    np.testing.assert_array_equal(out[n:], -7.0)  # nothing written past the count
    np.testing.assert_array_equal(out[0], -7.0)  # nor before it
    np.testing.assert_array_equal(optic[o, op.O_TREND_EMIT], emitted)
    np.testing.assert_array_equal(optic[1 - o], other)
    for pred in PREDICTORS:  # the ETAs are read, never counted down in place
        np.testing.assert_array_equal(table[o, cols[pred]], etas[pred])
