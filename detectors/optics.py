"""Optics health: robust trends of received power, laser bias and pre-FEC BER per transceiver,
turned into a prediction that the link will go down, and when.

Per optic (one at each link end), samples are averaged into time buckets (``bucket_s``); the
last ``window`` buckets of each signal are kept in a ring, and at every bucket close a
**Theil–Sen** line is fitted to them: the median of the slopes between every point of the
older half and every point of the newer half (long baselines, so the slope is steady; a median,
so outlier buckets do not move it). Its robust level is the median residual at the newest
bucket, and the share of pair slopes that agree in sign (Kendall-like) is the trend's
confidence.

Signals and what they predict, each against a threshold that is a parameter:

- **pre-FEC BER**, from the PHY counters (corrected bits / received bits over the bucket) or
  from the ``prefec_ber`` gauge. The two counters are read together, a row for both or neither,
  each at most the line rate with room for a read late in its poll
  (:data:`~foreshock.detectors.counters.LINE_BITS_MAX_PER_S`) and the corrected bits at most the
  bits received over the same interval: a reading past either bound is refused and counted
  (``implausible_rise``), never a BER spike and a reset on its fall back; a row that the next goes
  on from stood, and both are re-based on it (``rebased``: a pair read 0 at the first poll costs
  one row, not every row until the bits' total fits the bound).
  The BER is trended on a log scale as the **Q factor in dB**
  (``20·log10(√2·erfcinv(2·BER))``): for a receiver whose noise does not grow with signal,
  Q is proportional to received power, so a link losing dB per hour loses Q dB at the same
  rate — a straight line, where ``log10(BER)`` bends ever steeper. ETA = time until the
  FEC limit: the link's own ``fec_limit_ber`` from the topology when given, else the parameter
  ``fec_limit_ber`` (2.4e-4 for 400G KP4 by default; a soft-decision limit such as 2e-2 for
  coherent DWDM).
- **RX power** (dBm). ETA = time until the module's low RX power alarm
  (vendor-specific, off when unknown).
- **TX bias** rising at constant TX power: laser ageing (the TX power trend must not rise
  with it, else the bias change was commanded). ETA = time until the module's high-bias alarm
  or, when unknown, ``bias_eol_ratio`` × the bias first seen (Telcordia-style end of life at
  +50 %).

**The module's own alarms.** Each transceiver reports its alarm thresholds (``ethtool -m``:
``Laser rx power low alarm threshold``, ``Laser bias current high alarm threshold``; parsed
into :attr:`foreshock.streams.dom.ModuleDom.thresholds`, and carried in the optic rows as
``rx_power_alarm_low`` / ``tx_bias_alarm_high``, which the detector takes as they arrive;
:meth:`OpticsDetector.set_module_thresholds` sets them by name). Until an optic's module has
reported one, the parameters
``rx_power_low_alarm_dbm`` and ``tx_bias_high_alarm_a`` stand in (NaN = unknown). A module
without a thresholds page prints them as 0 mW / 0 mA: not levels, ignored.

**Module temperature.** A laser held at constant output power by its bias loop draws more bias as
it warms (its threshold current rises) and less when it cools, and a module's power readings
drift with its temperature too; a dying laser's bias rises at a steady temperature. So each
signal is trended net of what the module temperature (``module_temp``, averaged into the same
buckets) explains: over the window, the signal is fitted by least squares as a line in time plus
a coefficient times the temperature (again without the points off that plane by more than
:data:`TEMP_TRIM_K` RMS residuals), and each point is taken to the newest point's temperature by
that coefficient before the Theil-Sen line is fitted, so the level is still what the module reads
now. A warm-up of ten minutes or more then reads as flat, not as a steep trend whose newest
points still rise; an ageing laser's bias keeps its slope whether the temperature moves during it
or not. Nothing is corrected when the temperature spans less than ``temp_move_c`` over the window
(a steady module is judged exactly as before), when a bucket's temperature is unknown (a module or
source that does not report it), or when temperature and time are so collinear (``r2`` over
``temp_time_r2_max``) that a trend and a drift are one line: a temperature rising at a steady rate
for the whole window is not allowed to explain a trend away, and a ramp that starts together with
a same-shaped temperature rise is told from it only once the temperature settles.

**Steps.** Every signal is corrected for steps: a jump off the fitted line of more than
``step_min_db`` (10 % for the bias) and ``step_k`` × the fit's residual scale that persists
for two buckets is a step (a reseated connector, a patch change, a sudden loss): the older
buckets are shifted by it, so the line keeps the trend and does not read the step as one,
while the level — and so the ETA — starts from where the signal is now. An RX power step is
reported as an anomaly.

**Replaced modules.** A step that follows a dark stretch of the optic (a loss-of-signal sample,
or no sample at all for ``dark_gap_buckets`` whole buckets, counted in the optic's own usual
spacing between samples, so that an optic polled every 5 minutes is not dark between its polls:
:func:`silent_dark`) and either improves the RX power or
Q or moves the laser bias is a new module, not a step of the old one: a module cannot be swapped
without the link going dark, and a step that keeps the trend would hand the failing module's
decline, or its laser's bias as the end-of-life reference, to the healthy one. The optic's
ring, fits and bias reference start over, so its ETAs are unknown (and an active prediction is
withdrawn after ``off_hold_s``, as when a trend clears) until ``min_points`` buckets of the new
module are in. A worsening step after a dark stretch (a flapping, failing link) and any step
while the optic kept reporting (a patch change or bend, a firmware power-reporting change, a
laser whose bias jumps at constant power) keep the trend as above. A connector reseated with
the link dark that comes back better counts as a replacement: if the decline was not the
connector's, it is learnt again within ``min_points`` buckets. An optic dark so long that its
trend lapsed (fewer than ``min_points`` buckets left in the window) is judged on its first
buckets back against the last level it had, flat, by the same rule.

The smallest ETA among the predictors of the two ends of a link that have ``confidence_min``
(a doubtful one does not hide a confident one), when under ``horizon_s``, is a
:class:`~foreshock.findings.Prediction` ``link_down`` on the link (slot = optic slot // 2)
through the shared start/refresh/withdraw state machine (:mod:`.alarm`); the same ETAs decide
the clear. A BER already past the FEC limit gives ETA 0: the link is about to flap. Each ETA
counts down from its fit's last point, for one window at most: an end silent or dark longer
is unknown, so its last trend is withdrawn, not held as "now". A link whose two ends have both
been silent for more than a window of buckets has no row left to judge it by: its prediction is
withdrawn, and its ends' ETAs forgotten, at the next row of any optic. A prediction withdrawn
while an end is dark or silent says so (its trend is lost; not a recovery).

A slope becomes an ETA only when it is ``slope_z_min`` (6) standard errors from flat, the error from
the fit's own residual scale (:func:`slope_standard_error`): the fit runs at every bucket close,
~1,440 times a day per signal, and a chance dip of a flat, noisy optic passed the sign agreement.
Nor, toward its threshold, unless it is ``wander_ratio`` (5) times the spread of the optic's window
slopes as its slopes away from the threshold show it (:func:`learn_wander`): a module's RX power
wanders with temperature over hours, a straight line over one window whose residuals are too smooth
for that error to see, and a wander falls about as steeply as it rises.
No window's trend is extrapolated more than ``max_extrapolation`` windows ahead (12 × 32 minutes
by default: a half-hour trend says nothing about next month), so the early warning has its own,
longer trend: each closed bucket's means (after the step correction) are averaged into
``trend_bucket_s`` points (an hour), ``trend_window`` of them kept (72: three days), and at each
point's close every signal is fitted over them as the window is (net of the module temperature,
Theil-Sen, the same confidence and :func:`trend_persists`) once ``trend_min_points`` (24) are in,
and extrapolated at most ``max_extrapolation`` of its own windows (36 days). A step shifts its
older points as it does the window's; a replaced module starts it over. A significant worsening
trend that reaches its threshold beyond the horizon but within ``trend_horizon_s`` (90 days),
counted from its last point, is an early-warning :class:`~foreshock.findings.Anomaly` on the
optic, repeated at most every ``trend_refresh_s``; so is every step. Where the window already
spans as long (hourly buckets over days) the early warning is the window's own fit: a shorter
trend would read a day's wander of the signal as weeks to the limit.

A replaced module's alarm thresholds go back to the parameters unless the new module reported its
own after the dark stretch: the old module's levels are not the new one's.

Samples with loss of signal (``los`` = 1, or RX power under ``los_dbm``) are not trended.

>>> import numpy as np
>>> from foreshock.frames import Frame
>>> from foreshock.topology import Topology
>>> topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
...     "nodes": [{"name": "n0", "rack": "k", "gpus": 1}], "switches": [{"name": "leaf0"}],
...     "links": [{"name": "n0/gpu0~leaf0", "a": "n0/gpu0", "b": "leaf0"}]})
>>> det = OpticsDetector(topo)
>>> rng = np.random.default_rng(1)
>>> found = []
>>> for t in np.arange(0.0, 6 * 3600, 30.0):      # end b loses 1 dB per hour from 2 h on
...     loss = max(0.0, (t - 7200) / 3600)
...     rx = np.array([-1.0, -1.0 - loss]) + rng.normal(0, 0.05, 2)
...     ber = 0.5 * np.array([math.erfc(q / math.sqrt(2)) for q in 3.49 * 10 ** ((rx + 6.5) / 20)])
...     found += det.update(Frame("optic", [t, t], [0, 1], {"rx_power": rx, "prefec_ber": ber}))
>>> first = next(f for f in found if f.type == "prediction")
>>> first.event, first.slot, round((first.ts - 7200) / 3600, 1) < 2.0   # found within 2 h ...
('link_down', 0, True)
>>> fec_limit_at = 7200 + 5.5 * 3600    # ... of 5.5 h of margin, with the ETA about right
>>> abs(first.ts + first.eta_s - fec_limit_at) < 3600
True
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping

import numpy as np

from foreshock import facts
from foreshock.findings import Anomaly, Finding, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.numba_config import jit
from foreshock.topology import Topology

from .alarm import (A_ACTIVE, A_SIZE, CODE_START, CODE_WITHDRAW, O_CODE, O_CONF, O_ETA, O_ROW, O_V0,
                    O_WHICH, OUT_SIZE, alarm_step, alarm_withdraw, emit, new_alarm_columns)
from .base import Detector, add_columns, resolve_params
from .counters import LINE_BITS_MAX_PER_S, CounterRates, report_problems, with_counter_pace_and_drop
from .order_stats import MEDIAN_BRACKET, median_of

# ---- inputs: one matrix per frame ------------------------------------------------------------
X_RX, X_TXP, X_BIAS, X_BER, X_BITS, X_CORR, X_LOS, X_TEMP = range(8)
X_SIZE = 8

# ---- trended signals --------------------------------------------------------------------------
SIG_RX, SIG_BIAS, SIG_TXP, SIG_Q = range(4)
N_SIG = 4
SIGNAL_NAMES = ("rx_power", "tx_bias", "tx_power", "prefec_ber")
# bucket accumulators: sum and count per signal (for the BER: corrected bits and bits from the
# PHY counters), then the BER gauge's sum and count, used when the counters did not move, then
# the module temperature's sum and count (not trended: what the trended signals are corrected by)
ACC_SIZE = 2 * N_SIG + 4
ACC_BER_GAUGE = 2 * N_SIG
ACC_TEMP = 2 * N_SIG + 2
# fit columns per signal (F_PERSIST: 1 when the trend goes on in the newest points, 0 when it
# does not and so is not extrapolated, NaN = not judged, taken as persisting; F_TEMP_COEF: the
# signal's change per degree C of module temperature taken out before the fit, NaN = none taken
# out, see temperature_coefficient; F_SLOPE_SE: the slope's standard error from the fit's residual scale,
# NaN = not known, taken as significant, see slope_standard_error; F_WANDER: the square of the spread of the
# optic's slopes from those away from its threshold, NaN = not learnt, not judged, and F_WANDER_N the fits it
# is learnt from, see learn_wander)
F_SLOPE, F_LEVEL, F_CONF, F_SCALE, F_PENDING, F_T, F_PERSIST, F_TEMP_COEF, F_SLOPE_SE, F_WANDER, F_WANDER_N = range(11)
F_SIZE = 11
# the early-warning trend, per optic (s_trend columns): the hour (trend bucket) being averaged and
# the newest one in the ring (NaN = none), the ETA of each predictor (inf = none)
T_OPEN, T_NEWEST, T_ETA_RX, T_ETA_Q, T_ETA_BIAS = range(5)
T_SIZE = 5
# its open point's accumulators (s_trend_acc): sum and count of bucket means per signal, then of the
# module temperature
T_ACC_SIZE = 2 * N_SIG + 2
# per-optic module alarm thresholds (s_module_alarm columns)
M_RX_LOW, M_BIAS_HIGH = range(2)
MODULE_THRESHOLD_KEYS = ("rx_power_low_alarm", "tx_bias_high_alarm")
"""The :attr:`foreshock.streams.dom.ModuleDom.thresholds` keys behind the ``M_*`` columns
(dBm and amperes, as the DOM parser stores them)."""
MODULE_ALARM_FIELDS = ("rx_power_alarm_low", "tx_bias_alarm_high")
"""The optic-row fields that carry the same levels, column for column."""
UNSET_RX_ALARM_DBM = -40.0
"""A low RX power alarm at or under this (0 mW, which the DOM parser floors to -40 dBm) is a
module that does not implement its thresholds page, as is a high bias alarm of 0 mA: ``ethtool
-m`` prints zeros for them. Taken as levels, a 0 mA bias alarm read every bias as past it, and a
bias drifting up with temperature became a ``link_down`` predicted "now"; such a value is
ignored (the optic keeps the parameter, or what it had)."""


def module_alarm_usable(col: int, value: Any) -> np.ndarray:
    """Whether ``value`` (a number or an array) is a level the module really set for column ``col``
    (``M_*``): finite and above what ``ethtool -m`` prints for a thresholds page it does not
    implement. The one test for it: the DOM parser (which leaves such levels out of the optic row),
    :meth:`OpticsDetector.set_module_thresholds` and the rows the detector takes all call it."""
    unset = UNSET_RX_ALARM_DBM if col == M_RX_LOW else 0.0
    with np.errstate(invalid="ignore"):
        level = np.asarray(value, dtype=np.float64)
        return np.isfinite(level) & (level > unset)
# per-optic scalar columns
# (O_DARK: the latest bucket in which the optic was dark, NaN = never; O_ALARM_BUCKET: the bucket
# its module alarm thresholds were last reported in, NaN = never or unknown; O_SPACING: the optic's usual
# step between the buckets it reports in, NaN = not seen yet, see silent_dark)
(O_BUCKET, O_COUNT, O_POS, O_BIAS_REF, O_ETA_RX, O_ETA_Q, O_ETA_BIAS, O_TREND_EMIT, O_DARK, O_ALARM_BUCKET,
 O_SPACING) = range(11)
O_SIZE = 11
SPACING_WEIGHT = 0.125
"""The weight of each new step between an optic's reported buckets in its usual spacing (``O_SPACING``,
an average over about the last eight): enough to follow a poll interval that changes, not a single
late poll. A step longer than a dark stretch counts as just one (``dark_gap_buckets`` x the spacing),
so an unplugged hour does not teach the optic an hour's spacing, and a poll interval lengthened at once
is learnt in ~8 polls (each one up to twice as long as the last bar)."""
# predictors (which signal gave the ETA)
PRED_RX, PRED_Q, PRED_BIAS = range(3)
PRED_SIGNAL = (SIG_RX, SIG_Q, SIG_BIAS)
BER_MAX = 0.45  # a BER of 0.5 is a coin toss: Q = 0, -inf dB
# emission kinds (EMIT_LINK_SILENT: a link_down withdrawn because both its ends stopped reporting)
EMIT_LINK_DOWN, EMIT_STEP, EMIT_TREND, EMIT_LINK_SILENT = 0, 1, 2, 3

PARAMS: dict[str, float] = {
    "bucket_s": 60.0,  # samples are averaged into buckets this long
    "window": 32.0,  # buckets in the trend window (window * bucket_s of history)
    "min_points": 8.0,  # buckets before a trend is trusted
    "fec_limit_ber": facts.PREFEC_BER_FEC_LIMIT,
    "ber_floor": 1e-15,  # gauge values below this are clamped (a BER of 0 has no Q)
    "rx_power_low_alarm_dbm": float("nan"),  # the module's own alarm; NaN = unknown
    "tx_bias_high_alarm_a": float("nan"),  # the module's own alarm; NaN = use bias_eol_ratio
    "bias_eol_ratio": 1.5,
    "los_dbm": -30.0,  # RX power below this is loss of signal, not a trend sample
    "horizon_s": 6 * 3600.0,  # predict link-downs at most this far ahead
    "trend_horizon_s": 90 * 86400.0,  # a worsening trend that gets there within this is an anomaly
    "trend_refresh_s": 86400.0,  # ... repeated at most this often per optic
    "max_extrapolation": 12.0,  # a trend is never extrapolated more than this many windows ahead
    "min_slope_db_per_day": 1.0,  # a slower Q or RX decline is not a trend (ageing noise)
    "min_bias_slope_per_day": 0.02,  # relative bias rise per day to call laser ageing
    "tx_flat_db_per_day": 0.5,  # TX power counts as constant below this rise
    "confidence_min": 0.6,
    "step_min_db": 1.0,
    "step_k": 6.0,
    "clear_factor": 1.5,  # withdraw when the ETA exceeds horizon * clear_factor ...
    "off_hold_s": 600.0,  # ... for this long
    "refresh_s": 60.0,
    "on_count": 2.0,  # consecutive firing evaluations (bucket closes) to start
    "dark_gap_buckets": 2.0,  # whole buckets (x the optic's usual spacing) without a sample: gone dark
    "persist_ratio": 0.5,  # the window's newer half and newest quarter must show this share of the
    "persist_share": 0.25,  # trend's slope in this share of their pair slopes (else a step or warm-up)
    "temp_move_c": 1.0,  # module temperature spanning this much over the window is corrected for ...
    "temp_time_r2_max": 0.95,  # ... unless it is this collinear with time (r^2): then the two are one
    "trend_bucket_s": 3600.0,  # the early-warning trend: bucket means averaged into points this long ...
    "trend_window": 72.0,  # ... this many of them in its window (3 days) ...
    "trend_min_points": 24.0,  # ... trusted from this many (a day: a day-night cycle seen once)
    # a slope is extrapolated into an ETA only when it is this many standard errors (from the fit's own
    # residual scale, slope_standard_error) from flat: each signal of each optic is tested at every bucket
    # close (~1,440 times a day), so a 3-sigma dip of a flat noisy optic came by daily. Not 5: one window's
    # median absolute residual is itself noisy (a chance quiet window halves it), which gives the ratio a
    # t-like tail: on white noise, |ratio| > 5 at 4e-4 of 32-bucket fits, > 6 at 8e-5 (simulated), and
    # 64 flat links x 24 h had 3 false link_downs at 5, none at 6 (26 without the test)
    "slope_z_min": 6.0,
    # a slope toward the threshold is a trend only when this many times the spread of the optic's slopes as
    # its slopes away from the threshold show it (learn_wander): a healthy optic whose power wanders over hours
    # falls about as steeply as it rises. 64 flat links x 24 h at -3 dBm wandering 0.3-0.5 dB (AR(1), 30-120
    # min time constant, + 0.1 dB white; alarm -5 dBm): 64 predicted without it, 16-18 with it at 5, every one
    # within 3 h of the detector's start (optics not yet seen to rise) (at 4: 16-21; simulated)
    "wander_ratio": 5.0,
    "wander_windows": 24.0,  # ... learnt over this many windows of closes (~13 h), exponentially weighted
}
PARAM_NAMES = tuple(PARAMS)
(P_BUCKET, P_WINDOW, P_MIN_POINTS, P_FEC, P_BER_FLOOR, P_RX_ALARM, P_BIAS_ALARM, P_BIAS_EOL,
 P_LOS, P_HORIZON, P_TREND_HORIZON, P_TREND_REFRESH, P_MAX_EXTRAP, P_MIN_SLOPE, P_MIN_BIAS_SLOPE, P_TX_FLAT, P_CONF_MIN, P_STEP_MIN, P_STEP_K,
 P_CLEAR, P_OFF_HOLD, P_REFRESH, P_ON, P_DARK_GAP, P_PERSIST_RATIO, P_PERSIST_SHARE, P_TEMP_MOVE,
 P_TEMP_R2_MAX, P_TREND_BUCKET, P_TREND_WINDOW, P_TREND_MIN_POINTS, P_SLOPE_Z_MIN, P_WANDER_RATIO,
 P_WANDER_WINDOWS) = range(len(PARAMS))

DAY_S = 86400.0


def params_vector(overrides: dict[str, float]) -> np.ndarray:
    vec = np.array(list(resolve_params("optics", PARAMS, overrides).values()))
    if not vec[P_BUCKET] > 0 or not vec[P_HORIZON] > 0:
        raise ValueError("optics: bucket_s and horizon_s must be > 0")
    if not 4 <= vec[P_WINDOW] <= 1024 or not 2 <= vec[P_MIN_POINTS] <= vec[P_WINDOW]:
        raise ValueError("optics: need 4 <= window <= 1024 and 2 <= min_points <= window")
    if not 0.0 < vec[P_FEC] < 0.5:
        raise ValueError("optics: fec_limit_ber must be in (0, 0.5)")
    if not vec[P_DARK_GAP] >= 1:  # at 0, every bucket after the last would be a dark stretch
        raise ValueError("optics: dark_gap_buckets must be >= 1")
    # temp_move_c inf: never corrected; 0 would fit a coefficient to a span of rounding errors
    if not vec[P_TEMP_MOVE] > 0 or not 0 <= vec[P_TEMP_R2_MAX] <= 1:
        raise ValueError("optics: need temp_move_c > 0 and 0 <= temp_time_r2_max <= 1")
    if not vec[P_TREND_BUCKET] >= vec[P_BUCKET] or not 4 <= vec[P_TREND_WINDOW] <= 1024 \
            or not 2 <= vec[P_TREND_MIN_POINTS] <= vec[P_TREND_WINDOW]:
        raise ValueError("optics: need trend_bucket_s >= bucket_s, 4 <= trend_window <= 1024 and "
                         "2 <= trend_min_points <= trend_window")
    # wander_windows 0 would weight the newest slope by 1/0; wander_ratio 0 (or inf, never a trend) is the
    # caller's to choose, a NaN not
    if not vec[P_WANDER_WINDOWS] > 0 or not vec[P_WANDER_RATIO] >= 0:
        raise ValueError("optics: need wander_windows > 0 and wander_ratio >= 0")
    return vec


# ---- the Q factor -------------------------------------------------------------------------------
@jit
def q_db_of_ber(ber: float) -> float:
    """Q factor in dB (``20·log10(q)``, ``BER = 0.5·erfc(q/√2)``); NaN for NaN, BER >= 0.5 -> -inf.

    Newton's method on ``log erfc`` (well conditioned in the far tail) from the asymptotic
    guess; eight steps reach double precision for BERs between 1e-300 and 0.5.
    """
    if ber != ber:
        return np.nan
    if ber >= 0.5:
        return -np.inf
    y = 2.0 * max(ber, 1e-300)
    x = math.sqrt(max(-math.log(y), 0.0))
    target = math.log(y)
    for _ in range(30):
        e = math.erfc(x)
        if e <= 0.0:
            break
        step = (math.log(e) - target) / (-2.0 / math.sqrt(math.pi) * math.exp(-x * x) / e)
        x = max(x - step, 0.0)
        if abs(step) < 1e-12 * max(x, 1.0):
            break
    return 20.0 * math.log10(max(x * math.sqrt(2.0), 1e-300))


@jit
def ber_of_q_db(q_db: float) -> float:
    return 0.5 * math.erfc(10.0 ** (q_db / 20.0) / math.sqrt(2.0))  # type: ignore[no-any-return]


# ---- Theil-Sen over a ring --------------------------------------------------------------------
@jit
def theil_sen(t: np.ndarray, y: np.ndarray, m: int, scratch: np.ndarray) -> tuple[float, float, float, float]:
    """Robust line through the first ``m`` (time-ordered) points: (slope, level at t[m-1],
    sign agreement in [0.5, 1], median absolute residual).

    Slopes are taken between every point of the older half and every point of the newer half;
    pairs closer than 1e-9 s are skipped. ``scratch`` holds the pair slopes and the medians'
    workspace: ``m * m // 2 + m + MEDIAN_BRACKET + 1`` values (at least ``max(m, m * m // 4)``;
    less only costs speed).
    """
    h = m // 2
    k = 0
    if h > 0:
        # every pair is far enough apart when the closest one is (rounding is monotonic): then
        # the loop needs no test and vectorises. The slopes are the same, in the same order.
        # (A NaN time sticks in t_old or t_new and fails the test: the careful loop skips it.)
        t_old = t[0]
        for i in range(1, h):
            t_old = t[i] if (t[i] > t_old) | (t[i] != t[i]) else t_old
        t_new = t[h]
        for j in range(h + 1, m):
            t_new = t[j] if (t[j] < t_new) | (t[j] != t[j]) else t_new
        if t_new - t_old > 1e-9:
            w = m - h
            for i in range(h):
                ti = t[i]
                yi = y[i]
                at = i * w - h
                for j in range(h, m):
                    # np.true_divide: no zero-division check (none can occur), so it vectorises
                    scratch[at + j] = np.true_divide(y[j] - yi, t[j] - ti)
            k = h * w
        else:
            for i in range(h):
                for j in range(h, m):
                    dt = t[j] - t[i]
                    if dt > 1e-9:
                        scratch[k] = (y[j] - y[i]) / dt
                        k += 1
    if k == 0:
        return np.nan, np.nan, np.nan, np.nan
    # counted before the median (it only reads the slopes); a slope agrees when it is nonzero
    # and on the median's side of zero (not positive, NaN included, when the median is not)
    nonzero = 0
    positive = 0
    for i in range(k):
        nonzero += scratch[i] != 0.0
        positive += scratch[i] > 0.0
    slope = median_of(scratch, k, scratch[k:])
    agree = positive if slope > 0.0 else nonzero - positive
    agreement = agree / nonzero if nonzero > 0 else 0.5
    t_end = t[m - 1]
    for i in range(m):
        scratch[i] = y[i] - slope * (t[i] - t_end)
    level = median_of(scratch, m, scratch[m:])
    for i in range(m):
        scratch[i] = abs(scratch[i] - level)
    scale = median_of(scratch, m, scratch[m:])
    return slope, level, agreement, scale


THEIL_SEN_SE_FACTOR = 1.19
"""The standard deviation of :func:`theil_sen`'s slope (older half against newer half) on white normal
noise, in units of the least-squares slope's ``sigma / sqrt(sum((t - mean t)^2))``: 1.18-1.22 by
simulation for 8 to 168 evenly spaced points (its efficiency is ~0.7 of least squares')."""
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation


@jit
def slope_standard_error(t: np.ndarray, m: int, scale: float) -> float:
    """The standard error of the Theil-Sen slope fitted to the first ``m`` points at times ``t`` whose
    median absolute residual is ``scale``: :data:`THEIL_SEN_SE_FACTOR` x the least-squares slope's
    ``sigma / sqrt(sum((t - mean t)^2))``, sigma from the MAD. NaN without a spread in time or a scale.

    A slope is only a trend when it stands out of this (``slope_z_min``): without the test, the
    sign agreement and fill (the confidence) passed a chance dip of a flat noisy optic (3 sigma of
    its noise over half a window: the pair slopes then agree ~90 %), and it was extrapolated up to
    ``max_extrapolation`` windows to a ``link_down`` predicted 1-6 h ahead (16 healthy links at
    0.2 dB of RX noise: 6 predicted in a day)."""
    if m < 2 or scale != scale:
        return np.nan
    mean_t = 0.0
    for k in range(m):
        mean_t += t[k]
    mean_t /= m
    s_tt = 0.0
    for k in range(m):
        s_tt += (t[k] - mean_t) * (t[k] - mean_t)
    if not s_tt > 0.0:
        return np.nan
    return THEIL_SEN_SE_FACTOR * MAD_TO_SIGMA * scale / math.sqrt(s_tt)


@jit
def learn_wander(fit: np.ndarray, o: int, g: int, slope: float, params: np.ndarray) -> None:
    """Learn signal ``g`` of optic ``o``'s wander from its newest window slope ``slope``: ``F_WANDER``
    holds twice the mean square of the slope's part *away* from its threshold (a rise of RX power, TX
    power or Q, a fall of the laser bias; 0 for a slope toward it), over the optic's fits since its
    first (``F_WANDER_N`` of them) and then over the last ``wander_windows`` windows of closes
    (exponentially weighted): the square of the spread of its window slopes, had they been as often
    up as down. A slope toward the threshold is a trend only when it is ``wander_ratio`` times that
    spread (:func:`_etas_of_fit`). NaN before the optic's first fit: not judged.

    Why: real RX power (and so Q) wanders with module and ambient temperature, tenths of a dB over
    an hour or two, and over a 32-minute window such a wander is a straight line: the residuals about
    it are small and smooth, so :func:`slope_standard_error`, which takes them as independent, is far
    too small: such a wander's slope passed 6 of them in 22-25 % of 32-bucket windows (white noise:
    1e-4), and a healthy optic's falls became ``link_down`` predictions (an audit, 2026-12-05: 64 of 64
    flat links wandering 0.3-0.5 dB with a 30-120 min time constant predicted in a day). Correcting
    that error for the residuals' autocorrelation (the effective-sample-size factor
    ``sqrt((1 + rho) / (1 - rho))``, rho their lag-1 autocorrelation) did not mend it: a line fitted
    to the window takes most of a slow wander into its slope, so rho of what is left reads 0.2-0.7
    and the slope still passed 6 corrected errors in 7-10 % of windows (simulated). Nothing inside one
    window tells a wander's fall from the onset of a decline; the optic's own history does: a wander
    falls about as steeply as it rises, so its rises measure its falls. Only the harmless direction is
    learnt: a decline shows no slope away from the threshold, so it cannot teach the optic that its own
    slope is usual (learnt both ways, a link already failing when first seen, or a laser ageing from
    the first minute, was never predicted), and a steady trend on a noisy optic drives the spread down,
    not up. On white noise the spread is about the slope's own standard deviation, and ``wander_ratio``
    (5) of it asks little more than ``slope_z_min`` (6) standard errors do. What this cannot do: judge
    the first falls of an optic not yet seen to rise (after a cold start, or a replaced module, whose
    history is dropped), and tell a decline not much steeper than the wander's own slopes from the
    wander in one window (it is learnt as the rises fade from the mean, over hours; the early-warning
    trend sees a slow one too).
    """
    if slope != slope:
        return
    away = -slope if g == SIG_BIAS else slope
    harmless = 2.0 * max(away, 0.0) ** 2  # a symmetric wander's slopes: half of them rise
    held = fit[o, g, F_WANDER]
    n = fit[o, g, F_WANDER_N]
    if held != held or n != n:
        fit[o, g, F_WANDER] = harmless
        fit[o, g, F_WANDER_N] = 1.0
        return
    n += 1.0
    fit[o, g, F_WANDER_N] = n
    weight = max(1.0 / n, 1.0 / (params[P_WANDER_WINDOWS] * params[P_WINDOW]))
    fit[o, g, F_WANDER] = held + weight * (harmless - held)


@jit
def _half_share(t: np.ndarray, y: np.ndarray, lo: int, hi: int, bar: float, rising: bool) -> float:
    """The share of the pair slopes within points ``lo`` to ``hi - 1`` (each point of their older
    half against each of their newer half, as :func:`theil_sen` pairs them) that reach ``bar`` in
    the trend's direction (at or above it when ``rising``, else at or below); NaN without a pair."""
    h = lo + (hi - lo) // 2
    pairs = 0
    reaching = 0
    for i in range(lo, h):
        for j in range(h, hi):
            dt = t[j] - t[i]
            if dt > 1e-9:
                pair = (y[j] - y[i]) / dt
                pairs += 1
                reaching += pair >= bar if rising else pair <= bar
    return reaching / pairs if pairs > 0 else np.nan


@jit
def trend_persists(t: np.ndarray, y: np.ndarray, m: int, slope: float, params: np.ndarray) -> bool:
    """Whether the line of slope ``slope`` fitted to the first ``m`` points is a trend that goes
    on now: at least ``persist_share`` of the pair slopes of its newer half and of its newest
    quarter reach ``persist_ratio`` × ``slope``, and as many of its newest eighth's reach ``slope``.

    A real decline keeps falling to the last point, however flat the window was before its onset
    (judged on the older half too, a failure's first half hour, flat then falling, cost ~15 min
    of lead). A level shift too small to be corrected as a step, or a module's bias rising as it
    warms up, is flat once done; fitted over the whole window either reads as a steep trend until
    the window slides past it, but the Theil-Sen slope only turns steep once most of its pairs
    straddle the change, by when the newest points lie after it, flat. The newest eighth (4
    buckets) sees a warm-up end soonest; it is held to the whole slope (a real trend's newest
    points fall at least as fast as a line diluted by the flat time before its onset) because
    half the slope is within a flat stretch's noise. A lenient share (a quarter, where the median
    would be a half) leaves a noisy real trend its parts: only a part clearly flatter than the
    trend contradicts it. No slope (zero or NaN) and a part without a pair contradict nothing.
    """
    if not (slope > 0.0 or slope < 0.0):
        return True
    bar = params[P_PERSIST_RATIO] * slope
    rising = slope > 0.0
    return not (_half_share(t, y, m // 2, m, bar, rising) < params[P_PERSIST_SHARE]
                or _half_share(t, y, m - m // 4, m, bar, rising) < params[P_PERSIST_SHARE]
                or _half_share(t, y, m - m // 8, m, slope, rising) < params[P_PERSIST_SHARE])


TEMP_TRIM_K = 3.0
"""Points further than this many root-mean-square residuals off the first least-squares plane are
left out of the second, so a bad bucket does not set the temperature coefficient (up to three of
a window of 32, each several times the noise: a bad bucket inflates the RMS it is judged by, but
by a factor of its share of the window). The RMS comes with the sums, where a median absolute
residual took another pass that made a close of a warming module half again as slow."""


@jit
def _plane_on_time_and_temperature(t: np.ndarray, temp: np.ndarray, y: np.ndarray, m: int, level: float,
                                   slope: float, coef: float,
                                   limit: float) -> tuple[float, float, float, float, float]:
    """Least squares ``y ≈ level + slope·(t - t[m-1]) + coef·(temp - temp[m-1])`` over the first
    ``m`` points, leaving out each point further than ``limit`` from the plane given as
    ``level, slope, coef`` (``limit`` inf: none). Returns the new ``(level, slope, coef, r2, rms)``:
    ``r2`` the squared correlation of time and temperature over the points used (1: the two cannot
    be told apart), ``rms`` the root-mean-square residual; all NaN when fewer than 4 points are
    used or either does not vary."""
    t_end, temp_end = t[m - 1], temp[m - 1]
    n = 0
    sum_t = sum_temp = sum_y = 0.0
    for i in range(m):
        dt, dtemp = t[i] - t_end, temp[i] - temp_end
        if abs(y[i] - level - slope * dt - coef * dtemp) <= limit:
            n += 1
            sum_t += dt
            sum_temp += dtemp
            sum_y += y[i]
    if n < 4:
        return np.nan, np.nan, np.nan, np.nan, np.nan
    mean_t, mean_temp, mean_y = sum_t / n, sum_temp / n, sum_y / n
    s_tt = s_temptemp = s_ttemp = s_ty = s_tempy = s_yy = 0.0
    for i in range(m):
        dt, dtemp = t[i] - t_end, temp[i] - temp_end
        if abs(y[i] - level - slope * dt - coef * dtemp) <= limit:
            ct, ctemp, cy = dt - mean_t, dtemp - mean_temp, y[i] - mean_y
            s_tt += ct * ct
            s_temptemp += ctemp * ctemp
            s_ttemp += ct * ctemp
            s_ty += ct * cy
            s_tempy += ctemp * cy
            s_yy += cy * cy
    det = s_tt * s_temptemp - s_ttemp * s_ttemp
    if not (s_tt > 0.0 and s_temptemp > 0.0 and det > 0.0):
        return np.nan, np.nan, np.nan, np.nan, np.nan
    new_slope = (s_temptemp * s_ty - s_ttemp * s_tempy) / det
    new_coef = (s_tt * s_tempy - s_ttemp * s_ty) / det
    residual_sq = max(s_yy - new_slope * s_ty - new_coef * s_tempy, 0.0)  # rounding may leave it under 0
    return (mean_y - new_slope * mean_t - new_coef * mean_temp, new_slope, new_coef,
            s_ttemp * s_ttemp / (s_tt * s_temptemp), math.sqrt(residual_sq / n))


@jit
def temperature_coefficient(t: np.ndarray, temp: np.ndarray, y: np.ndarray, m: int, params: np.ndarray) -> float:
    """How much the signal ``y`` moves per degree C of module temperature ``temp``, fitted with
    a line in time over the first ``m`` points: ``y ≈ level + slope·t + coef·temp`` by least
    squares, then again without the points more than :data:`TEMP_TRIM_K` RMS residuals off that
    plane. NaN (nothing to correct for) when a point's temperature is unknown, when the
    temperature spans less than ``temp_move_c`` over the points, or when it is so collinear with
    time (``r2`` over ``temp_time_r2_max``) that a trend and a temperature drift are one line.

    A laser's bias rises with its temperature (threshold current) and comes back when it settles;
    a module's RX and TX power readings drift with it too. A warm-up of ten minutes or more read
    as a steep trend, and its newest points were still rising when it was claimed. Fitted jointly
    with time, the coefficient takes the part that follows the temperature and leaves a real
    trend to the time slope, also when the temperature moves during it, as long as the
    temperature does not move in step with time over the whole window (then nothing is
    corrected: a trend is not explained away).
    """
    if m < 4:
        return np.nan
    low, high = np.inf, -np.inf
    for i in range(m):
        if not abs(temp[i]) < np.inf:  # NaN and inf fail this
            return np.nan
        low = min(low, temp[i])
        high = max(high, temp[i])
    if not high - low >= params[P_TEMP_MOVE]:
        return np.nan
    level, slope, coef, r2, rms = _plane_on_time_and_temperature(t, temp, y, m, 0.0, 0.0, 0.0, np.inf)
    if not r2 <= params[P_TEMP_R2_MAX]:  # NaN too
        return np.nan
    if rms > 0.0:
        level, slope, coef, r2, rms = _plane_on_time_and_temperature(t, temp, y, m, level, slope, coef,
                                                                     TEMP_TRIM_K * rms)
        if not r2 <= params[P_TEMP_R2_MAX]:
            return np.nan
    return coef


@jit
def silent_dark(optic: np.ndarray, o: int, gap: float, params: np.ndarray) -> bool:
    """Whether optic ``o``, whose newest sample is ``gap`` buckets after its last one, was silent for a
    dark stretch, and learn its usual spacing (``O_SPACING``) from the step.

    Dark is more than ``dark_gap_buckets`` x its usual spacing (at least a bucket): ``ethtool -m``
    is often polled every 3-5 minutes, and at 60-s buckets every poll of such an optic left two
    whole buckets without a sample, so each was a "dark stretch" although its ``los`` stayed 0,
    and an improving step (a patch cord swapped while lit) became "a replaced module": its trends
    and bias reference wiped, its prediction withdrawn. An optic reported every bucket is judged as
    before (spacing 1). The first step an optic shows seeds its spacing, not judged."""
    spacing = optic[o, O_SPACING]
    if spacing != spacing:
        optic[o, O_SPACING] = gap
        return False
    bar = params[P_DARK_GAP] * max(spacing, 1.0)
    optic[o, O_SPACING] = spacing + SPACING_WEIGHT * (min(gap, bar) - spacing)
    return gap > bar


@jit
def _close_bucket(o: int, acc: np.ndarray, optic: np.ndarray, ring_t: np.ndarray, ring: np.ndarray,
                  ring_temp: np.ndarray, fit: np.ndarray, params: np.ndarray, q_limit: float,
                  module_alarm: np.ndarray, work: np.ndarray) -> tuple[np.ndarray, bool]:
    """Turn optic ``o``'s open bucket into ring points, refit each signal, update the ETAs.

    ``ring_temp`` (optics, W): each ring point's module temperature (NaN = unknown). Each signal
    is fitted net of what the temperature explains (:func:`temperature_coefficient`). ``work``
    (5, L): fit times, fit values, pair slopes and the medians' workspace, then this bucket's
    means and steps, then the fit points' temperatures (no allocation per close). Returns the size
    of a confirmed step per signal (NaN where none): a view on ``work[3]``, valid until the next
    close; and whether the steps were a replaced module, whose history was dropped (see the
    module docstring).
    """
    window = ring_t.shape[1]
    t_b = (optic[o, O_BUCKET] + 0.5) * params[P_BUCKET]
    means = work[3, :N_SIG]
    for g in range(N_SIG):
        num, den = acc[o, 2 * g], acc[o, 2 * g + 1]
        means[g] = num / den if den > 0.0 else np.nan
    bits = acc[o, 2 * SIG_Q + 1]
    if bits > 0.0:
        # no corrected bit in the bucket says BER < 1 / bits: half a bit is the estimate
        means[SIG_Q] = max(acc[o, 2 * SIG_Q], 0.5) / bits
    elif acc[o, ACC_BER_GAUGE + 1] > 0.0:
        means[SIG_Q] = acc[o, ACC_BER_GAUGE] / acc[o, ACC_BER_GAUGE + 1]
    temp_count = acc[o, ACC_TEMP + 1]
    temp_mean = acc[o, ACC_TEMP] / temp_count if temp_count > 0.0 else np.nan
    work[3, 2 * N_SIG] = temp_mean  # for the early-warning trend (_trend_update)
    for k in range(ACC_SIZE):
        acc[o, k] = 0.0
    if means[SIG_Q] == means[SIG_Q]:
        means[SIG_Q] = q_db_of_ber(min(max(means[SIG_Q], params[P_BER_FLOOR]), BER_MAX))
    steps = work[3, N_SIG:2 * N_SIG]
    steps[:] = np.nan
    count = int(optic[o, O_COUNT])
    pos = int(optic[o, O_POS])
    # dark since the last bucket before the pending one: a step confirmed now began after it
    dark = count >= 2 and optic[o, O_DARK] >= math.floor(ring_t[o, (pos - 2) % window] / params[P_BUCKET])
    new_module = False
    # step detection against the current fit, before the new point joins the ring
    for g in range(N_SIG):
        y = means[g]
        slope = fit[o, g, F_SLOPE]
        t_last = fit[o, g, F_T]
        if slope != slope and t_last == t_last and optic[o, O_DARK] >= math.floor(t_last / params[P_BUCKET]):
            # dark so long that the trend has lapsed (fewer than min_points left in the window):
            # the first buckets back are judged against the last level seen, flat. Skipped, a
            # module replaced after a real repair was never recognised, and the old laser's first
            # bias stayed the new one's end-of-life reference ("now", at confidence 1.0).
            slope = 0.0
        if y != y or slope != slope or fit[o, g, F_LEVEL] != fit[o, g, F_LEVEL]:
            continue
        predicted = fit[o, g, F_LEVEL] + slope * (t_b - fit[o, g, F_T])
        resid = y - predicted
        floor = params[P_STEP_MIN] if g != SIG_BIAS else 0.1 * abs(fit[o, g, F_LEVEL])
        scale = fit[o, g, F_SCALE]
        noise = params[P_STEP_K] * 1.4826 * scale if scale == scale else 0.0
        big = abs(resid) > max(noise, floor)
        pending = fit[o, g, F_PENDING]
        if big and pending == pending and (pending > 0.0) == (resid > 0.0):
            # the pending bucket may straddle the step; the new one is wholly after it, so its
            # residual is the step
            steps[g] = resid
            fit[o, g, F_PENDING] = np.nan
            # a lower RX power or Q after the dark stretch may be the old module failing on;
            # the bias is the module's own laser, so a bias step in either direction is new
            if dark and (g == SIG_BIAS or ((g == SIG_RX or g == SIG_Q) and resid > 0.0)):
                new_module = True
        elif big:
            fit[o, g, F_PENDING] = resid
        else:
            fit[o, g, F_PENDING] = np.nan
    if new_module:
        # nothing of the old module describes the new one: not its trend, not its laser's
        # first bias, not when its trend was last warned about. The straddling pending bucket
        # goes too; the level starts from this bucket, the slope once min_points are in.
        for k in range(window):
            ring_t[o, k] = np.nan
            ring_temp[o, k] = np.nan
            for g in range(N_SIG):
                ring[o, g, k] = np.nan
        count = 0
        pos = 0
        for g in range(N_SIG):
            for c in range(F_SIZE):
                fit[o, g, c] = np.nan
            fit[o, g, F_LEVEL] = means[g]
            fit[o, g, F_T] = t_b
        optic[o, O_BIAS_REF] = np.nan
        optic[o, O_TREND_EMIT] = np.nan
        # nor its alarm thresholds, unless the new module reported its own after the dark stretch
        if not optic[o, O_ALARM_BUCKET] > optic[o, O_DARK]:
            module_alarm[o, M_RX_LOW] = params[P_RX_ALARM]
            module_alarm[o, M_BIAS_HIGH] = params[P_BIAS_ALARM]
    else:
        for g in range(N_SIG):
            shift = steps[g]
            if shift == shift:
                # shift every ring point older than the pending one, so the line keeps its trend
                for k in range(1, count):
                    idx = (pos - 1 - k) % window
                    ring[o, g, idx] += shift
                fit[o, g, F_LEVEL] += shift
    ring_t[o, pos] = t_b
    ring_temp[o, pos] = temp_mean
    for g in range(N_SIG):
        ring[o, g, pos] = means[g]
    pos = (pos + 1) % window
    count = min(count + 1, window)
    optic[o, O_POS] = pos
    optic[o, O_COUNT] = count
    # refit every signal on its valid points, oldest first
    ts_buf = work[0]
    ys_buf = work[1]
    scratch = work[2]
    temp_buf = work[4]
    oldest = (pos - count) % window  # one modulo, not one per point: an integer division is slow
    # whether the temperature moved enough over the window to be corrected for at all: the
    # signals' points are among the window's, so one test here spares the steady modules (most)
    # gathering and testing their temperatures per signal
    temp_low, temp_high = np.inf, -np.inf
    for k in range(count):
        idx = oldest + k
        if idx >= window:
            idx -= window
        temp = ring_temp[o, idx]  # a NaN (unknown) fails both tests
        if temp < temp_low:
            temp_low = temp
        if temp > temp_high:
            temp_high = temp
    temp_moved = temp_high - temp_low >= params[P_TEMP_MOVE]
    for g in range(N_SIG):
        m = 0
        for k in range(count):
            idx = oldest + k
            if idx >= window:
                idx -= window
            v = ring[o, g, idx]
            if abs(v) < np.inf:  # NaN and inf fail this
                ts_buf[m] = ring_t[o, idx]
                ys_buf[m] = v
                temp_buf[m] = ring_temp[o, idx]
                m += 1
        if m < params[P_MIN_POINTS] or ys_buf[m - 1] != means[g]:
            # too few points, or this bucket had none: the trend is not current
            if m < params[P_MIN_POINTS]:
                fit[o, g, F_SLOPE] = np.nan
            continue
        # the trend is of what the module temperature does not explain: each point is taken to the
        # newest point's temperature, so the newest point, and the level, stay as they were read
        coef = temperature_coefficient(ts_buf, temp_buf, ys_buf, m, params) if temp_moved else np.nan
        if coef == coef:
            for k in range(m):
                ys_buf[k] -= coef * (temp_buf[k] - temp_buf[m - 1])
        fit[o, g, F_TEMP_COEF] = coef
        slope, level, agreement, scale = theil_sen(ts_buf, ys_buf, m, scratch)
        fill = min(1.0, m / (0.5 * window))
        fit[o, g, F_SLOPE] = slope
        fit[o, g, F_LEVEL] = level
        fit[o, g, F_CONF] = max(0.0, 2.0 * agreement - 1.0) * fill
        fit[o, g, F_SCALE] = scale
        fit[o, g, F_T] = ts_buf[m - 1]
        fit[o, g, F_PERSIST] = 1.0 if trend_persists(ts_buf, ys_buf, m, slope, params) else 0.0
        fit[o, g, F_SLOPE_SE] = slope_standard_error(ts_buf, m, scale)
        learn_wander(fit, o, g, slope, params)
    _update_etas(o, optic, fit, params, q_limit, module_alarm)
    return steps, new_module


@jit
def _trend_update(o: int, t_b: float, means: np.ndarray, temp_mean: float, steps: np.ndarray, new_module: bool,
                  trend_state: tuple, optic: np.ndarray, params: np.ndarray,  # type: ignore[type-arg]
                  q_limit: float, module_alarm: np.ndarray, work: np.ndarray) -> bool:
    """Feed optic ``o``'s bucket just closed (centred at ``t_b``: its ``means`` per signal, after the
    step correction, and ``temp_mean``) to its early-warning trend: the means are averaged into
    ``trend_bucket_s`` points, a ring of ``trend_window`` of them, refitted at each point's close
    (:func:`_trend_close_point`). A step shifts the older points as the short ring's are; a replaced
    module starts the trend over. Returns whether a point closed (and so the trend's ETAs are new)."""
    trend_acc, trend, trend_ring, trend_fit = trend_state
    if new_module:
        trend_acc[o, :] = 0.0
        trend_ring[o, :, :] = np.nan
        trend_fit[o, :, :] = np.nan
        trend[o, T_OPEN] = np.nan
        trend[o, T_NEWEST] = np.nan
        trend[o, T_ETA_RX] = np.inf
        trend[o, T_ETA_Q] = np.inf
        trend[o, T_ETA_BIAS] = np.inf
    else:
        for g in range(N_SIG):
            shift = steps[g]
            if shift == shift:
                # as in the short ring: all but the pending bucket (the latest one fed) were before it
                trend_ring[o, g, :] += shift
                fed = trend_acc[o, 2 * g + 1]
                if fed > 1.0:
                    trend_acc[o, 2 * g] += shift * (fed - 1.0)
                if trend_fit[o, g, F_LEVEL] == trend_fit[o, g, F_LEVEL]:
                    trend_fit[o, g, F_LEVEL] += shift
    point = math.floor(t_b / params[P_TREND_BUCKET])
    closed = False
    open_point = trend[o, T_OPEN]
    if open_point == open_point and point > open_point:
        _trend_close_point(o, trend_state, optic, params, q_limit, module_alarm, work)
        closed = True
    if not open_point == open_point or point > open_point:
        trend[o, T_OPEN] = point
    for g in range(N_SIG):
        if abs(means[g]) < np.inf:
            trend_acc[o, 2 * g] += means[g]
            trend_acc[o, 2 * g + 1] += 1.0
    if abs(temp_mean) < np.inf:
        trend_acc[o, 2 * N_SIG] += temp_mean
        trend_acc[o, 2 * N_SIG + 1] += 1.0
    return closed


@jit
def _trend_close_point(o: int, trend_state: tuple, optic: np.ndarray, params: np.ndarray,  # type: ignore[type-arg]
                       q_limit: float, module_alarm: np.ndarray, work: np.ndarray) -> None:
    """Close optic ``o``'s open early-warning point into its ring (points skipped since the newest,
    an optic silent for them, are unknown), refit each signal over the ring as the short window is
    fitted (net of the module temperature, :func:`temperature_coefficient`, then :func:`theil_sen`;
    confidence from the pair slopes' agreement and the ring's fill), and set its ETAs, extrapolated
    at most ``max_extrapolation`` trend windows ahead."""
    trend_acc, trend, trend_ring, trend_fit = trend_state
    size = trend_ring.shape[2]
    point = trend[o, T_OPEN]
    newest = trend[o, T_NEWEST]
    if newest == newest:
        for k in range(int(min(point - newest - 1.0, size))):
            trend_ring[o, :, int((newest + 1.0 + k) % size)] = np.nan
    at = int(point % size)
    for g in range(N_SIG + 1):  # the signals, then the temperature
        count = trend_acc[o, 2 * g + 1]
        trend_ring[o, g, at] = trend_acc[o, 2 * g] / count if count > 0.0 else np.nan
    trend_acc[o, :] = 0.0
    trend[o, T_NEWEST] = point
    ts_buf, ys_buf, scratch, temp_buf = work[0], work[1], work[2], work[4]
    for g in range(N_SIG):
        if not abs(trend_ring[o, g, at]) < np.inf:
            continue  # no mean of this signal in this point: the trend is not current
        m = 0
        for k in range(size):
            p = point - size + 1.0 + k
            idx = int(p % size)
            v = trend_ring[o, g, idx]
            if abs(v) < np.inf:
                ts_buf[m] = (p + 0.5) * params[P_TREND_BUCKET]
                ys_buf[m] = v
                temp_buf[m] = trend_ring[o, N_SIG, idx]
                m += 1
        if m < params[P_TREND_MIN_POINTS]:
            trend_fit[o, g, F_SLOPE] = np.nan
            continue
        coef = temperature_coefficient(ts_buf, temp_buf, ys_buf, m, params)
        if coef == coef:
            for k in range(m):
                ys_buf[k] -= coef * (temp_buf[k] - temp_buf[m - 1])
        slope, level, agreement, scale = theil_sen(ts_buf, ys_buf, m, scratch)
        trend_fit[o, g, F_SLOPE] = slope
        trend_fit[o, g, F_LEVEL] = level
        trend_fit[o, g, F_CONF] = max(0.0, 2.0 * agreement - 1.0) * min(1.0, m / (0.5 * size))
        trend_fit[o, g, F_SCALE] = scale
        trend_fit[o, g, F_T] = ts_buf[m - 1]
        trend_fit[o, g, F_TEMP_COEF] = coef
        # as the window's: a day's dip, or a shift too small to be a step, that the newest points
        # no longer follow is not extrapolated for weeks
        trend_fit[o, g, F_PERSIST] = 1.0 if trend_persists(ts_buf, ys_buf, m, slope, params) else 0.0
        trend_fit[o, g, F_SLOPE_SE] = slope_standard_error(ts_buf, m, scale)
    reach = params[P_MAX_EXTRAP] * size * params[P_TREND_BUCKET]
    _etas_of_fit(o, optic, trend_fit, params, q_limit, module_alarm, reach, trend, T_ETA_Q, T_ETA_RX, T_ETA_BIAS)


@jit
def _eta_down(level: float, slope: float, threshold: float, min_slope: float) -> float:
    """Time for a falling signal to reach ``threshold`` (0 if already there, inf if not falling)."""
    if level != level or threshold != threshold:
        return np.inf
    if level <= threshold:
        return 0.0
    if not slope < -min_slope:
        return np.inf
    return (level - threshold) / -slope


@jit
def _update_etas(o: int, optic: np.ndarray, fit: np.ndarray, params: np.ndarray, q_limit: float,
                 module_alarm: np.ndarray) -> None:
    """ETA of each predictor of optic ``o`` from its fit; inf when not heading for its threshold,
    when that is more than ``max_extrapolation`` windows ahead (a 30-minute trend says nothing
    about next month), or when its trend does not go on in its newest points (``F_PERSIST`` 0,
    :func:`trend_persists`: a small step or a warm-up, not a trend). A threshold already crossed
    (ETA 0) needs no extrapolation and stands. ``module_alarm`` (optics, 2): each module's own
    RX-low and bias-high alarms (``M_*`` columns, NaN = unknown)."""
    reach = params[P_MAX_EXTRAP] * params[P_WINDOW] * params[P_BUCKET]
    _etas_of_fit(o, optic, fit, params, q_limit, module_alarm, reach, optic, O_ETA_Q, O_ETA_RX, O_ETA_BIAS)


@jit
def _etas_of_fit(o: int, optic: np.ndarray, fit: np.ndarray, params: np.ndarray, q_limit: float,
                 module_alarm: np.ndarray, reach: float, dest: np.ndarray, col_q: int, col_rx: int,
                 col_bias: int) -> None:
    """:func:`_update_etas` for any fit (the short window's or the early-warning trend's), extrapolated
    at most ``reach`` seconds: the ETAs go to ``dest[o, col_*]``."""
    min_slope = params[P_MIN_SLOPE] / DAY_S
    dest[o, col_q] = np.inf
    dest[o, col_rx] = np.inf
    dest[o, col_bias] = np.inf
    if fit[o, SIG_Q, F_SLOPE] == fit[o, SIG_Q, F_SLOPE]:
        dest[o, col_q] = _eta_down(fit[o, SIG_Q, F_LEVEL], fit[o, SIG_Q, F_SLOPE], q_limit, min_slope)
    if fit[o, SIG_RX, F_SLOPE] == fit[o, SIG_RX, F_SLOPE]:
        dest[o, col_rx] = _eta_down(fit[o, SIG_RX, F_LEVEL], fit[o, SIG_RX, F_SLOPE],
                                    module_alarm[o, M_RX_LOW], min_slope)
    bias_slope = fit[o, SIG_BIAS, F_SLOPE]
    bias = fit[o, SIG_BIAS, F_LEVEL]
    if bias_slope == bias_slope and bias > 0.0:
        if optic[o, O_BIAS_REF] != optic[o, O_BIAS_REF]:
            optic[o, O_BIAS_REF] = bias
        txp_slope = fit[o, SIG_TXP, F_SLOPE]
        tx_flat = not (txp_slope * DAY_S > params[P_TX_FLAT])  # NaN (no TX power) counts as flat
        limit = module_alarm[o, M_BIAS_HIGH]
        if limit != limit:
            limit = params[P_BIAS_EOL] * optic[o, O_BIAS_REF]
        if tx_flat and bias_slope * DAY_S > params[P_MIN_BIAS_SLOPE] * bias:
            dest[o, col_bias] = 0.0 if bias >= limit else (limit - bias) / bias_slope
    for col, sig in ((col_q, SIG_Q), (col_rx, SIG_RX), (col_bias, SIG_BIAS)):
        # a slope within slope_z_min standard errors of flat is the window's noise, not a trend (a NaN
        # error, a fit from before it was kept, is not judged)
        noise = params[P_SLOPE_Z_MIN] * fit[o, sig, F_SLOPE_SE]
        # nor one within wander_ratio x the spread of the optic's slopes that its slopes away from the
        # threshold show (learn_wander; NaN, not learnt yet or a fit from before it was kept: not judged)
        wander = params[P_WANDER_RATIO] * math.sqrt(fit[o, sig, F_WANDER])
        if wander == wander:
            noise = max(noise, wander) if noise == noise else wander
        if dest[o, col] > reach or (dest[o, col] > 0.0 and (fit[o, sig, F_PERSIST] == 0.0
                                                            or abs(fit[o, sig, F_SLOPE]) < noise)):
            dest[o, col] = np.inf


@jit
def _optics_kernel(ts: np.ndarray, slot: np.ndarray, x: np.ndarray, state: tuple,  # type: ignore[type-arg]
                   trend_state: tuple, params: np.ndarray,  # type: ignore[type-arg]
                   q_limit: np.ndarray, module_alarm: np.ndarray, work: np.ndarray, out: np.ndarray) -> int:
    """Accumulate samples into buckets; at each bucket close refit and run the link alarm.

    ``state`` = (acc (optics, ACC_SIZE), optic (optics, O_SIZE), ring_t (optics, W),
    ring (optics, N_SIG, W), ring_temp (optics, W), fit (optics, N_SIG, F_SIZE),
    alarm (links, A_SIZE), link_bucket (links,)); ``trend_state`` = (trend_acc (optics, T_ACC_SIZE),
    trend (optics, T_SIZE), trend_ring (optics, N_SIG + 1, trend_window), trend_fit (optics, N_SIG,
    F_SIZE)), the early-warning trend's (:func:`_trend_update`). ``q_limit`` is each optic's FEC limit as a Q factor (dB),
    ``module_alarm`` (optics, 2) its module's alarm thresholds. Emissions go to ``out`` (see
    :mod:`.alarm`).
    """
    acc, optic, ring_t, ring, ring_temp, fit, alarm, link_bucket = state
    n_opt = optic.shape[0]
    n_out = 0
    swept = -np.inf  # the latest bucket the silent links were looked for in
    for i in range(len(ts)):
        o = slot[i]
        t = ts[i]
        if o < 0 or o >= n_opt or t != t:
            continue
        b = math.floor(t / params[P_BUCKET])
        if b > swept:
            # a silence only lengthens as the buckets go on: once per bucket finds it as early as per row
            n_out = _withdraw_silent_links(i, float(b), t, state, params, out, n_out)
            swept = b
        cur = optic[o, O_BUCKET]
        if cur == cur and b > cur:
            steps, new_module = _close_bucket(o, acc, optic, ring_t, ring, ring_temp, fit, params, q_limit[o],
                                              module_alarm, work)
            for g in range(N_SIG):
                if steps[g] == steps[g]:
                    n_out = emit(out, n_out, i, EMIT_STEP, CODE_START, np.nan, 1.0,
                                 (steps[g], fit[o, g, F_LEVEL], float(g), 1.0 if new_module else 0.0, 0.0, 0.0))
            if params[P_TREND_WINDOW] * params[P_TREND_BUCKET] > params[P_WINDOW] * params[P_BUCKET]:
                t_b = (cur + 0.5) * params[P_BUCKET]
                if _trend_update(o, t_b, work[3, :N_SIG], work[3, 2 * N_SIG], steps, new_module, trend_state,
                                 optic, params, q_limit[o], module_alarm, work):
                    n_out = _trend_warning(i, o, t, optic, trend_state[1], T_ETA_Q, T_ETA_RX, T_ETA_BIAS,
                                           trend_state[3], params, out, n_out)
            else:
                # a window at least as long (hourly buckets, days of them): the early warning is its own
                # fit's, not a shorter trend's that would read the window's noise as worsening
                n_out = _trend_warning(i, o, t, optic, optic, O_ETA_Q, O_ETA_RX, O_ETA_BIAS, fit, params,
                                       out, n_out)
            n_out = _link_alarm(i, o, cur, t, state, params, out, n_out)
        if cur == cur and b > cur and silent_dark(optic, o, b - cur, params):
            optic[o, O_DARK] = b - 1  # silent for whole buckets: unplugged, or its module was
        if cur != cur or b > cur:
            optic[o, O_BUCKET] = b
        elif b < cur:
            continue  # late sample for a closed bucket
        rx = x[i, X_RX]
        if x[i, X_LOS] >= 0.5 or rx < params[P_LOS]:
            optic[o, O_DARK] = b
            continue  # loss of signal: the link is down, not trending
        for g, col in ((SIG_RX, X_RX), (SIG_BIAS, X_BIAS), (SIG_TXP, X_TXP)):
            v = x[i, col]
            if abs(v) < np.inf:  # NaN and inf fail this
                acc[o, 2 * g] += v
                acc[o, 2 * g + 1] += 1.0
        temp = x[i, X_TEMP]
        if abs(temp) < np.inf:
            acc[o, ACC_TEMP] += temp
            acc[o, ACC_TEMP + 1] += 1.0
        # pre-FEC BER: the PHY counters when they moved (exact over the bucket), else the gauge
        bits, corr = x[i, X_BITS], x[i, X_CORR]
        if bits > 0.0 and corr == corr:
            acc[o, 2 * SIG_Q] += corr
            acc[o, 2 * SIG_Q + 1] += bits
        else:
            ber = x[i, X_BER]
            if 0.0 <= ber < np.inf:
                acc[o, ACC_BER_GAUGE] += min(max(ber, params[P_BER_FLOOR]), BER_MAX)
                acc[o, ACC_BER_GAUGE + 1] += 1.0
    return n_out


@jit
def _trend_warning(row: int, o: int, t: float, optic: np.ndarray, etas: np.ndarray, col_q: int, col_rx: int,
                   col_bias: int, fit: np.ndarray, params: np.ndarray, out: np.ndarray, n_out: int) -> int:
    """A significant worsening trend (ETAs in ``etas[o, col_*]``, ``fit`` its fits: the early-warning
    trend's, or the window's own when that is as long) that reaches its threshold beyond the
    prediction horizon but within ``trend_horizon_s``, counted from ``t``: an early warning, at most
    every ``trend_refresh_s``."""
    last = optic[o, O_TREND_EMIT]
    if last == last and t - last < params[P_TREND_REFRESH]:
        return n_out
    for pred, col in ((PRED_Q, col_q), (PRED_RX, col_rx), (PRED_BIAS, col_bias)):
        sig = PRED_SIGNAL[pred]
        eta = etas[o, col]
        if eta > 0.0:  # counted from the fit's last point, as the link's ETAs are
            eta = max(eta - max(t - fit[o, sig, F_T], 0.0), 0.0)
        if params[P_HORIZON] < eta <= params[P_TREND_HORIZON] and fit[o, sig, F_CONF] >= params[P_CONF_MIN]:
            optic[o, O_TREND_EMIT] = t
            return emit(out, n_out, row, EMIT_TREND, CODE_START, eta, fit[o, sig, F_CONF],
                        (float(pred), float(o), fit[o, sig, F_SLOPE], fit[o, sig, F_LEVEL], 0.0, 0.0))
    return n_out


@jit
def _withdraw_silent_links(row: int, bucket: float, t: float, state: tuple,  # type: ignore[type-arg]
                           params: np.ndarray, out: np.ndarray, n_out: int) -> int:
    """Withdraw the ``link_down`` prediction of each link whose two ends have both had no row for
    more than ``window`` buckets (older than any fit :func:`_link_alarm` still counts), and forget
    their ETAs. :func:`_link_alarm` lets a silent end's trend go only when a row of the link closes a
    bucket: with both ends silent none comes, and the prediction stood at ETA 0 for ever (and the
    ETA gauge with it). Only links with an active prediction are looked at. Each withdrawal names
    the end its soonest ETA was at (``EMIT_LINK_SILENT``)."""
    _, optic, _, _, _, _, alarm, _ = state
    n_opt = optic.shape[0]
    for link in range(alarm.shape[0]):
        if alarm[link, A_ACTIVE] == 0.0:
            continue
        silent = True
        named_end = 2 * link
        soonest = np.inf
        for end in (2 * link, 2 * link + 1):
            if end >= n_opt:
                continue
            last = optic[end, O_BUCKET]
            if last == last and bucket - last <= params[P_WINDOW]:
                silent = False
            for col in (O_ETA_Q, O_ETA_RX, O_ETA_BIAS):
                if optic[end, col] < soonest:
                    soonest = optic[end, col]
                    named_end = end
        if not silent:
            continue
        for end in (2 * link, 2 * link + 1):
            if end < n_opt:
                optic[end, O_ETA_Q] = np.inf
                optic[end, O_ETA_RX] = np.inf
                optic[end, O_ETA_BIAS] = np.inf
        code = alarm_withdraw(alarm, link, 0, t)
        n_out = emit(out, n_out, row, EMIT_LINK_SILENT, code, np.inf, 0.0,
                     (float(PRED_Q), float(named_end), np.nan, np.nan, np.nan, np.nan))
    return n_out


@jit
def _link_alarm(row: int, o: int, bucket: float, t: float, state: tuple,  # type: ignore[type-arg]
                params: np.ndarray, out: np.ndarray, n_out: int) -> int:
    """Evaluate the link of optic ``o`` once per bucket: the smallest ETA among the predictors of
    its two ends that have ``confidence_min`` (an ETA of 0 needs no extrapolation: confidence 1).

    The confidence is tested per predictor, before the smallest ETA is taken: taken after, a
    doubtful earlier ETA (a zig-zag at the other end) hid a confident one and the link was never
    predicted. The same confident set decides the clear. Each ETA counts down from its fit's last
    point; a fit whose last point is more than a window old (its end silent, or dark, since) is
    unknown: counted down for ever, the last trend of an end that stopped reporting became a
    ``link_down`` "now" held for days. The level reported is the fit's, extrapolated to ``t``.
    """
    _, optic, _, _, _, fit, alarm, link_bucket = state
    link = o // 2
    if not bucket > link_bucket[link]:
        return n_out
    link_bucket[link] = bucket
    stale_s = params[P_WINDOW] * params[P_BUCKET]
    best_eta = np.inf
    best_conf = 0.0
    best_end = o
    best_pred = PRED_Q
    best_elapsed = 0.0
    for end in (2 * link, 2 * link + 1):
        for pred, col, sig in ((PRED_Q, O_ETA_Q, SIG_Q), (PRED_RX, O_ETA_RX, SIG_RX),
                               (PRED_BIAS, O_ETA_BIAS, SIG_BIAS)):
            eta = optic[end, col]
            if not eta < np.inf:
                continue
            # the sample that closed the bucket lies up to one bucket after the fit's last point
            elapsed = max(t - fit[end, sig, F_T], 0.0)
            if not elapsed <= stale_s:  # NaN (never fitted) too
                # its end silent or dark for a window: unknown, withdrawn from the ETA gauge too
                # (left in place, the last ETA of an end that stopped reporting was exported for ever)
                optic[end, col] = np.inf
                continue
            conf = fit[end, sig, F_CONF]
            if eta == 0.0:
                conf = 1.0  # already past the threshold: no extrapolation involved
            else:
                eta = max(eta - elapsed, 0.0)
            if not conf >= params[P_CONF_MIN]:
                continue
            if eta < best_eta or (eta == best_eta and conf > best_conf):
                best_eta, best_conf, best_end, best_pred, best_elapsed = eta, conf, end, pred, elapsed
    sig = PRED_SIGNAL[best_pred]
    firing = best_eta <= params[P_HORIZON]
    clear = not best_eta <= params[P_HORIZON] * params[P_CLEAR]
    code = alarm_step(alarm, link, 0, t, firing, clear, params[P_ON], params[P_OFF_HOLD], params[P_REFRESH])
    if code != 0:
        # the levels now, on the fits' lines: a stale level beside "now" contradicted itself
        rx_elapsed = max(t - fit[best_end, SIG_RX, F_T], 0.0)
        n_out = emit(out, n_out, row, EMIT_LINK_DOWN, code, best_eta, best_conf,
                     (float(best_pred), float(best_end), fit[best_end, sig, F_SLOPE],
                      fit[best_end, sig, F_LEVEL] + fit[best_end, sig, F_SLOPE] * best_elapsed,
                      fit[best_end, SIG_RX, F_LEVEL] + fit[best_end, SIG_RX, F_SLOPE] * rx_elapsed,
                      fit[best_end, SIG_RX, F_SLOPE]))
    return n_out


class OpticsDetector(Detector):
    """Per-optic robust trends -> ``link_down`` predictions per link; RX power steps."""

    slot_kinds: ClassVar[Mapping[str, str]] = {
        **{name: "optic" for name in ("s_counter_state", "s_counter_resets", "s_counter_rate", "s_counter_drop",
                                      "s_acc", "s_optic", "s_ring_t", "s_ring", "s_ring_temp", "s_fit",
                                      "s_module_alarm", "s_trend_acc", "s_trend", "s_trend_ring", "s_trend_fit")},
        "s_alarm": "link", "s_link_bucket": "link"}
    name: ClassVar[str] = "optics"
    kinds: ClassVar[tuple[str, ...]] = ("optic",)

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, **params: Any) -> None:
        super().__init__(topology)
        self.health = health or PipelineHealth()
        self.params = params_vector(params)
        self.horizon_s = float(self.params[P_HORIZON])
        n_opt = topology.size("optic")
        n_links = topology.size("link")
        window = int(self.params[P_WINDOW])
        # both count bits on the port's line (a reading above the line rate is a bad one, not taken),
        # corrected bits are bits received, and the pair is read together or not at all: taken alone,
        # a row with one missing or refused had the other's increase span one interval and its own the
        # next two (a BER off by up to 2x)
        self.counters = CounterRates(n_opt, ("rx_bits", "rx_corrected_bits"), max_rate=LINE_BITS_MAX_PER_S,
                                     together=True, bounded_by={"rx_corrected_bits": "rx_bits"})
        # with the pace and the value before a low reading, which tell one bad reading from a clear:
        # kept in the checkpoint, or a low reading across a restore reads as the counter's whole total
        self.s_counter_state, self.s_counter_resets = self.counters.s_state, self.counters.s_resets
        self.s_counter_rate, self.s_counter_drop = self.counters.s_rate, self.counters.s_drop
        self.s_acc = np.zeros((n_opt, ACC_SIZE))
        self.s_optic = np.full((n_opt, O_SIZE), np.nan)
        self.s_optic[:, O_COUNT] = 0.0
        self.s_optic[:, O_POS] = 0.0
        self.s_optic[:, [O_ETA_RX, O_ETA_Q, O_ETA_BIAS]] = np.inf
        self.s_ring_t = np.full((n_opt, window), np.nan)
        self.s_ring = np.full((n_opt, N_SIG, window), np.nan)
        # each ring point's module temperature: float32 resolves 1e-5 degree at 100 degrees, finer
        # than the 1/256 degree a module reports, in half the state
        self.s_ring_temp = np.full((n_opt, window), np.nan, dtype=np.float32)
        self.s_fit = np.full((n_opt, N_SIG, F_SIZE), np.nan)
        self.s_alarm = new_alarm_columns(n_links, 1)
        self.s_link_bucket = np.full(n_links, -np.inf)
        # fit times, fit values, pair slopes and the medians' workspace, a bucket's means and steps,
        # the fit points' temperatures
        # the early-warning trend: its open point, ring (the signals' means, then the temperature's) and
        # fits. float32 ring: a mean resolves 1e-6 dB, or 1e-9 A of bias, in half the state
        trend_window = int(self.params[P_TREND_WINDOW])
        self.s_trend_acc = np.zeros((n_opt, T_ACC_SIZE))
        self.s_trend = np.full((n_opt, T_SIZE), np.nan)
        self.s_trend[:, [T_ETA_RX, T_ETA_Q, T_ETA_BIAS]] = np.inf
        self.s_trend_ring = np.full((n_opt, N_SIG + 1, trend_window), np.nan, dtype=np.float32)
        self.s_trend_fit = np.full((n_opt, N_SIG, F_SIZE), np.nan)
        longest = max(window, trend_window)
        self._work = np.empty((5, longest * longest // 2 + longest + MEDIAN_BRACKET + 1))
        # each optic's FEC limit: its link's own (topology ``fec_limit_ber``), else the parameter
        own = topology.link_fec_limit[topology.optic_link] if n_opt else np.zeros(0)
        self.fec_limit = np.where(np.isfinite(own), own, self.params[P_FEC])
        self.q_limit = np.array([q_db_of_ber(float(b)) for b in self.fec_limit], dtype=np.float64)
        # each module's own alarms (set_module_thresholds), the parameters until it reports them
        self.s_module_alarm = np.empty((n_opt, len(MODULE_THRESHOLD_KEYS)))
        self.s_module_alarm[:, M_RX_LOW] = self.params[P_RX_ALARM]
        self.s_module_alarm[:, M_BIAS_HIGH] = self.params[P_BIAS_ALARM]

    def set_module_thresholds(self, thresholds: Mapping[str, Mapping[str, float]]) -> int:
        """Judge each optic against its own module's alarms: ``{optic name: ModuleDom.thresholds}``
        (``rx_power_low_alarm`` in dBm, ``tx_bias_high_alarm`` in A; other keys are ignored).

        Takes effect at each optic's next bucket close. A missing or non-finite value, or a zero
        one (a module without thresholds, :data:`UNSET_RX_ALARM_DBM`), keeps what the optic had;
        an optic not in the topology is counted (stage ``optics``). Returns how
        many values were set.
        """
        optics = list(thresholds)
        slots = self.topology.slots("optic", optics)
        applied = 0
        for optic, o in zip(optics, slots.tolist()):
            values = thresholds[optic]
            if o < 0:
                self.health.problem(self.name, "module thresholds for an optic not in the topology", detail=optic)
                continue
            for col, key in enumerate(MODULE_THRESHOLD_KEYS):
                value = values.get(key)
                if value is not None and bool(module_alarm_usable(col, float(value))):
                    self.s_module_alarm[o, col] = float(value)
                    # reported by the module seen last: kept if it is found replaced by a later one
                    self.s_optic[o, O_ALARM_BUCKET] = self.s_optic[o, O_BUCKET]
                    applied += 1
        return applied

    def _take_module_alarms(self, frame: Frame) -> None:
        """The alarm levels a module reports in its own rows (``rx_power_alarm_low``,
        ``tx_bias_alarm_high``: the DOM source fills them from ``ethtool -m``) replace what the
        optic had — the same as :meth:`set_module_thresholds`, but carried by the telemetry, so a
        replay or a Kafka worker judges each module by its own levels too."""
        for col, field in enumerate(MODULE_ALARM_FIELDS):
            values = frame.columns.get(field)
            if values is None:
                continue
            given = module_alarm_usable(col, values)  # a module without a thresholds page prints zeros
            # a row outside the topology is the kernel's to count: written here, slot -1 set the last
            # optic's alarm and a slot past the end raised IndexError out of update()
            given &= (frame.slot >= 0) & (frame.slot < len(self.s_module_alarm))
            if given.any():  # later rows of an optic win, as later readings should
                self.s_module_alarm[frame.slot[given], col] = values[given]
                # when: a module found replaced after this keeps them only if it reported them
                bucket = np.floor(frame.ts[given] / self.params[P_BUCKET])
                np.fmax.at(self.s_optic[:, O_ALARM_BUCKET], frame.slot[given], bucket)

    def update(self, frame: Frame) -> list[Finding]:
        if frame.kind != "optic" or len(frame) == 0:
            return []
        cols = frame.columns
        counters = np.stack([cols["rx_bits"], cols["rx_corrected_bits"]], axis=1)
        delta, _, problems = self.counters.update(frame.ts, frame.slot, counters)
        report_problems(self.health, self.name, problems)
        self._take_module_alarms(frame)
        x = np.empty((len(frame), X_SIZE))
        x[:, X_RX] = cols["rx_power"]
        x[:, X_TXP] = cols["tx_power"]
        x[:, X_BIAS] = cols["tx_bias"]
        x[:, X_BER] = cols["prefec_ber"]
        x[:, X_BITS] = delta[:, 0]
        x[:, X_CORR] = delta[:, 1]
        x[:, X_LOS] = cols["los"]
        x[:, X_TEMP] = cols["module_temp"]
        # per row: a step per signal, a trend warning, the link's alarm, and a link withdrawn as silent
        # (each active alarm once, and each started in the frame once more)
        n_active = int(np.count_nonzero(self.s_alarm[:, A_ACTIVE]))
        out = np.empty((len(frame) * (N_SIG + 3) + n_active, OUT_SIZE))
        state = (self.s_acc, self.s_optic, self.s_ring_t, self.s_ring, self.s_ring_temp, self.s_fit,
                 self.s_alarm, self.s_link_bucket)
        trend_state = (self.s_trend_acc, self.s_trend, self.s_trend_ring, self.s_trend_fit)
        n = _optics_kernel(frame.ts, frame.slot, x, state, trend_state, self.params, self.q_limit, self.s_module_alarm,
                           self._work, out)
        return [self._finding(frame, rec) for rec in out[:n]]

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state saved before ``O_DARK`` existed: never seen dark (NaN), as a fresh optic. One saved
        before the counters' pace and drops were kept: none known, none pending. One saved before
        ``F_PERSIST`` existed: not judged (NaN, taken as persisting) until each signal's next fit; so
        with ``F_SLOPE_SE`` (NaN: taken as significant), in the window's and the early-warning trend's fits,
        and with ``F_WANDER`` and ``F_WANDER_N`` (NaN: not judged until the window's next fit starts learning
        it; the early-warning trend's are not learnt).
        One saved before module temperatures were kept (no ``s_ring_temp``, ``s_acc`` without the
        temperature's sum and count, ``s_fit`` without ``F_TEMP_COEF``): its ring points' and open
        bucket's temperatures unknown, so nothing is corrected for temperature until the window
        holds only buckets with one, as for a module that does not report it. One saved before the
        early-warning trend existed (no ``s_trend*``): that trend starts empty, as for a new optic."""
        state = with_counter_pace_and_drop(state, "s_counter_state", "s_counter_rate", "s_counter_drop")
        ring_t = np.asarray(state.get("s_ring_t"))
        if "s_ring_temp" not in state and ring_t.ndim == 2:
            state = {**state, "s_ring_temp": np.full(ring_t.shape, np.nan)}
        acc = np.asarray(state.get("s_acc"))
        if acc.ndim == 2 and acc.shape[1] < ACC_SIZE:  # sums and counts: none yet is 0, not NaN
            wide_acc = np.zeros((acc.shape[0], ACC_SIZE))
            wide_acc[:, :acc.shape[1]] = acc
            state = {**state, "s_acc": wide_acc}
        for key in ("s_fit", "s_trend_fit"):
            fit = np.asarray(state.get(key))
            if fit.ndim == 3 and fit.shape[2] < F_SIZE:
                wide = np.full(fit.shape[:2] + (F_SIZE,), np.nan)
                wide[:, :, :fit.shape[2]] = fit
                state = {**state, key: wide}
        if "s_trend" not in state:
            fresh = type(self)(self.topology, **dict(zip(PARAM_NAMES, self.params.tolist())))
            state = {**state, **{k: v for k, v in fresh.state_arrays().items() if k.startswith("s_trend")}}
        return add_columns(state, "s_optic", O_SIZE)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.counters.bind(self.s_counter_state, self.s_counter_resets, self.s_counter_rate, self.s_counter_drop)

    def _finding(self, frame: Frame, rec: np.ndarray) -> Finding:
        row, which, code = int(rec[O_ROW]), int(rec[O_WHICH]), int(rec[O_CODE])
        ts, optic = float(frame.ts[row]), int(frame.slot[row])
        v = rec[O_V0:O_V0 + 6]
        if which == EMIT_STEP:
            return self._step(ts, optic, float(v[0]), float(v[1]), int(v[2]), bool(v[3]))
        if which == EMIT_TREND:
            return self._trend(ts, optic, int(v[0]), float(rec[O_ETA]), float(rec[O_CONF]), float(v[2]), float(v[3]))
        pred, end = int(v[0]), int(v[1])
        link = end // 2
        eta = float(rec[O_ETA])
        if which == EMIT_LINK_SILENT:
            reason = self._silent_reason(end)
        elif code == CODE_WITHDRAW:
            reason = self._withdraw_reason(ts, link)
        else:
            reason = self._reason(pred, end, eta, float(v[2]), float(v[3]), float(v[4]), float(v[5]))
        return Prediction(ts=ts, entity_kind="link", slot=link, event="link_down",
                          eta_s=eta if np.isfinite(eta) else -1.0, confidence=round(float(rec[O_CONF]), 3),
                          detector=self.name, reason=reason, active=code != CODE_WITHDRAW)

    def _withdraw_reason(self, ts: float, link: int) -> str:
        """Why a link's prediction is withdrawn. An end that is dark (loss of signal) or silent has
        lost its trend, which is not a recovery: "no longer trending to failure" said of a link left
        down read as one."""
        bucket = math.floor(ts / self.params[P_BUCKET])
        for end in (2 * link, 2 * link + 1):
            name = self.topology.name("optic", end)
            if self.s_optic[end, O_DARK] >= bucket - 1:  # dark in this bucket or the last one
                return f"{name}: link dark (loss of signal), its trend lost; not a recovery"
            # silent for a dark stretch by its own spacing (silent_dark), a slow poll's gap not counted
            spacing = self.s_optic[end, O_SPACING]
            spacing = max(spacing, 1.0) if spacing == spacing else 1.0
            if bucket - self.s_optic[end, O_BUCKET] > self.params[P_DARK_GAP] * spacing:
                return self._silent_reason(end)
        return f"optics of {self.topology.links[link]} no longer trending to failure"

    def _silent_reason(self, end: int) -> str:
        return f"{self.topology.name('optic', end)}: no longer reporting, its trend unknown; not a recovery"

    def _step(self, ts: float, optic: int, step: float, level: float, sig: int, new_module: bool = False) -> Anomaly:
        name = self.topology.name("optic", optic)
        if sig == SIG_Q:
            after = float(ber_of_q_db(level))
            before = float(ber_of_q_db(level - step))
            what = f"pre-FEC BER jumped from {before:.1e} to {after:.1e} (Q {step:+z.1f} dB)"
        elif sig == SIG_BIAS:
            what = f"laser bias stepped {step * 1e3:+z.2f} mA to {level * 1e3:.2f} mA"
        elif sig == SIG_TXP:
            what = f"TX power stepped {step:+z.1f} dB to {level:.1f} dBm"
        else:
            what = f"RX power stepped {step:+z.1f} dB to {level:.1f} dBm (connector, patch or fibre change?)"
        if new_module:
            what += "; after the link was dark: a replaced module, its trends start over"
        return Anomaly(ts=ts, entity_kind="optic", slot=optic, field=SIGNAL_NAMES[sig], score=abs(step),
                       detector=self.name, reason=f"{name}: {what}")

    def _trend(self, ts: float, optic: int, pred: int, eta: float, conf: float, slope: float,
               level: float) -> Anomaly:
        name = self.topology.name("optic", optic)
        p = self.params
        days = eta / DAY_S
        # whole days from ten on; tenths under them, with the hours under one (the warning starts past
        # the 6-h horizon: one 8.7 h off read "there in ~0 days" until 2026-12-05)
        when = f"{days:.0f} days" if days >= 10 else f"{days:.1f} days" + (f" ({eta / 3600:.1f} h)" if days < 1 else "")
        if pred == PRED_Q:
            margin = level - float(self.q_limit[optic])
            what = (f"pre-FEC BER {float(ber_of_q_db(level)):.1e} worsening {slope * DAY_S:+z.2f} dB/day (Q), "
                    f"{margin:.1f} dB above the FEC limit {self.fec_limit[optic]:.1e}")
        elif pred == PRED_RX:
            alarm = self.s_module_alarm[optic, M_RX_LOW]
            what = f"RX power {level:.1f} dBm falling {slope * DAY_S:+z.2f} dB/day toward its alarm {alarm:.1f} dBm"
        else:
            what = f"laser bias {level * 1e3:.1f} mA rising {slope * DAY_S * 1e3:+z.2f} mA/day at constant TX power"
        return Anomaly(ts=ts, entity_kind="optic", slot=optic, field=SIGNAL_NAMES[PRED_SIGNAL[pred]],
                       score=round(p[P_TREND_HORIZON] / max(eta, 1.0), 3), detector=self.name,
                       reason=f"{name}: {what}; there in ~{when} at this rate (trend confidence {conf:.2f})")

    def _reason(self, pred: int, end: int, eta: float, slope: float, level: float,
                rx_level: float, rx_slope: float) -> str:
        optic = self.topology.name("optic", end)
        when = "now" if eta <= 0 else f"in {eta / 3600:.1f} h"
        rx = (f"; RX power {rx_level:.1f} dBm ({rx_slope * 3600:+z.2f} dB/h)"
              if np.isfinite(rx_level) and np.isfinite(rx_slope) else "")
        if pred == PRED_Q:
            ber = float(ber_of_q_db(level))
            return (f"{optic}: pre-FEC BER {ber:.1e} (Q {level:.1f} dB, {slope * 3600:+z.2f} dB/h) "
                    f"reaches the FEC limit {self.fec_limit[end]:.1e} {when}{rx}")
        if pred == PRED_RX:
            return (f"{optic}: RX power {level:.1f} dBm ({slope * DAY_S:+z.1f} dB/day) reaches the "
                    f"module's low alarm {self.s_module_alarm[end, M_RX_LOW]:.1f} dBm {when}")
        alarm = self.s_module_alarm[end, M_BIAS_HIGH]
        limit = (f"the module's high bias alarm {alarm * 1e3:.1f} mA" if np.isfinite(alarm)
                 else f"end of life ({self.params[P_BIAS_EOL]:g} x the bias first seen)")
        return (f"{optic}: laser bias {level * 1e3:.1f} mA rising {slope * DAY_S * 1e3:+z.2f} mA/day at "
                f"constant TX power (laser ageing), reaches {limit} {when}")

    def gauges(self) -> dict[str, tuple[str, Any, str]]:
        return {
            "optic_rx_power_trend_db_per_day": ("optic", self.s_fit[:, SIG_RX, F_SLOPE] * DAY_S,
                                                "Robust (Theil-Sen) RX power trend"),
            "optic_link_down_eta_seconds": ("optic", self._eta_now(),
                                            "Time until this optic's link is expected to fail"),
        }

    def _eta_now(self) -> np.ndarray:
        """Per optic, its soonest ETA counted down from its fit's last point to the optic's newest
        bucket, as the link's prediction counts it (:func:`_link_alarm`); NaN for none. Each ETA is
        solved at its signal's fit, and a signal no longer fitted (its field gone NaN, the rest of
        the row there) had its last ETA exported frozen while the prediction counted down (an
        audit, 2026-12-04: 1.52 h at 2.5, 2.67 and 2.83 h). One whose fit is more than a window
        older than the optic's newest bucket is unknown, as there."""
        now = (self.s_optic[:, O_BUCKET] + 0.5) * self.params[P_BUCKET]
        stale_s = self.params[P_WINDOW] * self.params[P_BUCKET]
        eta = np.full(len(self.s_optic), np.inf)
        for col, sig in ((O_ETA_Q, SIG_Q), (O_ETA_RX, SIG_RX), (O_ETA_BIAS, SIG_BIAS)):
            solved = self.s_optic[:, col]
            with np.errstate(invalid="ignore"):
                elapsed = np.maximum(now - self.s_fit[:, sig, F_T], 0.0)
                counted = np.where(elapsed <= stale_s, np.maximum(solved - elapsed, 0.0), np.inf)
            eta = np.minimum(eta, np.where(solved < np.inf, counted, np.inf))
        return np.where(np.isfinite(eta), eta, np.nan)  # type: ignore[no-any-return]
