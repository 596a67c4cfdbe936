"""Power detector, third audit: a GPU that reports no power limit (dcgm-exporter's default counters)
and the cap forecast's reason text.

1. One glitch reading (900-1,000 W, or 745 W) of such a GPU flagged it "not a 700 W part": its cap
   was never forecast again until a 10-minute gap.
2. A thermal-release prediction said the GPU "drew up to the 700 W limit" when it drew 560 W.
3. A GPU at 718 W with no limit reported was "already at the 700 W limit within the ±5 W
   measurement noise" — 18 W over an assumed limit.
"""

import re

import numpy as np
import pytest

from foreshock import facts
from foreshock.detectors import power as pw
from foreshock.findings import Prediction
from foreshock.frames import Frame
from thermal_synth import small_topology


def caps(found):
    return [f for f in found if isinstance(f, Prediction) and f.event == "power_cap" and f.active]


def creeping_no_limit(glitches=None, until=1500.0, start=0.0):
    """One GPU, no power limit reported, flat at 640 W, then creeping 0.5 W/s from t = 1200 s to
    reach 700 W at t = 1320 s; ``glitches`` maps a time to the reading that replaces the true one."""
    frames = []
    for t in np.arange(start, until, 5.0):
        p = min(700.0, 640.0 + 0.5 * max(0.0, t - 1200.0))
        p = (glitches or {}).get(float(t), p)
        frames.append(Frame("gpu", [t], [0], {"power": [p]}))
    return frames


def run(det, frames):
    found = []
    for f in frames:
        found += det.update(f)
    return found


TOPO = small_topology(nodes=1, gpus=1, racks=1)


# ---- 1. one glitch reading does not decide "not a 700 W part" ------------------------------------
@pytest.mark.parametrize("glitches", [{300.0: 1000.0}, {300.0: 900.0}, {300.0: 745.0},
                                      {300.0: 1000.0, 305.0: 1000.0}])
def test_a_glitch_reading_of_a_gpu_reporting_no_limit_does_not_stop_its_cap_forecast(glitches):
    found = caps(run(pw.PowerDetector(TOPO, trend_weight=1.0), creeping_no_limit(glitches)))
    # the cap (700 W at t = 1320 s) is forecast while the power creeps to it, within the horizon ...
    assert found, "no cap forecast after the glitch"
    assert 1200.0 < found[0].ts < 1320.0 and found[0].ts + found[0].eta_s >= 1320.0 - 120.0, found[0]
    # ... and the glitch itself predicted nothing (a 745-W one was "already over the limit" at once)
    assert not [f for f in found if f.ts < 1200.0], found[0].reason


def test_a_gpu_reporting_no_limit_that_draws_850_w_in_its_compute_phases_is_still_no_700_w_part():
    """A 1,000-W part (no limit reported) whose compute phases draw 850 W, its communication phases
    510 W: not predicted at the 700 W default, from its first job to its second after an idle spell."""
    rng = np.random.default_rng(3)
    frames = []
    for t in np.arange(0.0, 3600.0, 10.0):
        if 1500.0 <= t < 1800.0:
            p = 90.0  # idle between jobs
        else:
            p = 850.0 if (t / 57.0) % 1.0 < 0.75 else 510.0
        frames.append(Frame("gpu", [t], [0], {"power": [p + rng.uniform(-5, 5)], "gpu_temp": [60.0]}))
    det = pw.PowerDetector(TOPO)
    found = caps(run(det, frames))
    assert not found, found[0].reason
    assert det.s_gpu[0, pw.S_OVER_DEFAULT] == 1.0


def test_a_gpu_once_over_the_default_is_not_forecast_at_it_when_it_draws_less():
    """No limit reported: a GPU that drew 850 W for ten minutes is no 700 W part; a lighter job after
    it, 640 W creeping to 700 W without a gap in its readings, is not heading for "the 700 W limit"."""
    frames = [Frame("gpu", [t], [0], {"power": [850.0]}) for t in np.arange(0.0, 600.0, 5.0)]
    frames += creeping_no_limit(start=600.0)
    det = pw.PowerDetector(TOPO, trend_weight=1.0)
    found = caps(run(det, frames))
    assert not found, [(f.ts, f.reason) for f in found]
    assert det.s_gpu[0, pw.S_OVER_DEFAULT] == 1.0


def test_readings_held_over_the_default_are_counted():
    """Nothing is dropped silently: a glitch held as no reading is a counted problem of the detector."""
    det = pw.PowerDetector(TOPO, trend_weight=1.0)
    run(det, creeping_no_limit({300.0: 1000.0, 305.0: 1000.0}, until=400.0))
    held = {reason: n for (stage, reason), n in det.health.problems.items() if stage == det.name}
    assert [n for reason, n in held.items() if "default limit" in reason] == [2], held


# ---- 2. the thermal-release reason quotes what the GPU drew ---------------------------------------
def throttled_frames(before_w):
    """Drew ``before_w`` under a 700 W limit; thermally held from t = 600 s (50 W less) while its
    inlet cools 0.02 °C/s."""
    out = []
    for t in np.arange(0.0, 1200.0, 10.0):
        held = t >= 600.0
        out.append(Frame("rack", [t], [0], {"inlet_temp": [40.0 - 0.02 * max(t - 600.0, 0.0)]}))
        out.append(Frame("gpu", [t], [0], {
            "gpu_temp": [84.0 + (t // 10) % 2 if held else 80.0], "power": [before_w - 50 if held else before_w],
            "power_limit": [700.0], "throttle_reasons": [float(facts.THROTTLE_SW_THERMAL) if held else 0.0]}))
    return out


@pytest.mark.parametrize("before_w", [560.0, 640.0])
def test_the_thermal_release_reason_says_what_the_gpu_drew_before(before_w):
    found = caps(run(pw.PowerDetector(TOPO), throttled_frames(before_w)))
    assert found, "no thermal-release prediction"
    reason = found[0].reason
    assert "thermal throttle" in reason
    assert "up to the 700 W limit" not in reason, reason  # it drew 140 / 60 W under it
    assert f"drew {before_w:.0f} W before" in reason and "within 150 W of the 700 W limit" in reason, reason


# ---- 3. "within the ±5 W noise" only where it is --------------------------------------------------
def flat_frames(power_w, limit_w):
    return [Frame("gpu", [t], [0], {"power": [power_w], "gpu_temp": [56.0], "power_limit": [limit_w]})
            for t in np.arange(0.0, 600.0, 10.0)]


def test_a_gpu_18_w_over_the_assumed_default_limit_is_not_within_the_noise_of_it():
    found = caps(run(pw.PowerDetector(TOPO), flat_frames(718.0, np.nan)))
    assert found, "no prediction"
    reason = found[0].reason
    assert "within the ±5 W" not in reason, reason
    assert re.search(r"\b718 W\b", reason) and re.search(r"\b18 W over the 700 W limit\b", reason), reason
    assert "none reported" in reason, reason  # the limit is the default assumed, not one the GPU reported


def test_a_gpu_at_its_reported_limit_is_still_within_the_noise_of_it():
    found = caps(run(pw.PowerDetector(TOPO), flat_frames(703.0, 700.0)))
    assert found and "703 W already at the 700 W limit within the ±5 W measurement noise" in found[0].reason
    assert "none reported" not in found[0].reason


# ---- a review of the fix: readings at the default must not cancel the part's own over it ----------
@pytest.mark.parametrize("pattern", ["alternating", "halves", "pairs", "compute_comm"])
def test_a_part_drawing_over_700_w_between_phases_at_or_under_it_is_still_no_700_w_part(pattern):
    """A 1,000-W part (no limit reported) whose job steps alternate compute phases at 850-950 W with
    phases at ~700 W (or communication at 500 W): decided in a few steps, never predicted at the 700 W
    default. With one taken off per reading at the default the count never built: every over-725-W
    reading was dropped and it was "already at the 700 W limit" 32-36 times an hour."""
    rng = np.random.default_rng(5)
    over = {"alternating": lambda k: k % 2 == 0, "halves": lambda k: rng.random() < 0.5,
            "pairs": lambda k: k % 4 < 2, "compute_comm": lambda k: k % 2 == 0}[pattern]
    low = 500.0 if pattern == "compute_comm" else 700.0
    frames = [Frame("gpu", [t], [0], {"power": [(rng.uniform(850, 950) if over(k) else low) + rng.uniform(-3, 3)],
                                      "gpu_temp": [65.0]})
              for k, t in enumerate(np.arange(0.0, 3600.0, 10.0))]
    det = pw.PowerDetector(TOPO)
    found = caps(run(det, frames))
    assert not found, (len(found), found[0].reason)
    assert det.s_gpu[0, pw.S_OVER_DEFAULT] == 1.0


def test_a_700_w_part_glitching_every_few_minutes_is_still_forecast():
    """One 1,000-W reading every 5 minutes (60 readings at 5 s): ten at the default forget one, so
    the count never reaches three, and the cap it creeps to is forecast."""
    glitches = {float(t): 1000.0 for t in range(300, 1200, 300)}
    found = caps(run(pw.PowerDetector(TOPO, trend_weight=1.0), creeping_no_limit(glitches)))
    assert found and 1200.0 < found[0].ts < 1320.0, [(f.ts, f.reason) for f in found]
