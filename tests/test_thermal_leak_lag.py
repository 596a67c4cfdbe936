"""The thermal forecast's leakage model against the model's own ODE, integrated numerically here.

The forecast (:func:`foreshock.detectors.thermal.temp_at`) says leakage power grows ``k`` W/°C with
temperature up to the power limit::

    dT/dt = (a0 + rises(t) + min(R·k·(T - temp0), cap) - T) / tau,   amp = 1 / (1 - R·k)

Below the limit the feedback lengthens the time constant to ``amp·tau`` as well as amplifying the rise,
and once power is at its limit leakage adds nothing more: the plain first-order path. Until 2026-12-05 the
closed form kept ``tau`` and amplified at the limit too: ETAs to 87 °C 14 % early under the limit, 24 %
at it. Each ETA here is compared with an independent integration of that ODE (no closed form of the code's).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from foreshock.detectors import thermal as th

LIMIT, HORIZON = 87.0, 1800.0
R, K = 0.046, 3.0  # an H100's core resistance (°C/W) and the detector's default leakage (W/°C)
AMP = 1.0 / (1.0 - R * K)


def ode_eta(temp0, a0, b, bdamp, tau, du, damp, amp, cap, limit=LIMIT, horizon=HORIZON):
    """First time the model's ODE reaches ``limit``, by small exact steps (the target held over each step at
    its midpoint value); inf past the horizon."""
    rk = 1.0 - 1.0 / amp
    dt = min(tau / 400.0, 0.05)
    step = 1.0 - math.exp(-dt / tau)
    temp, h = temp0, 0.0
    while h < horizon:
        if temp >= limit:
            return h
        mid = h + 0.5 * dt
        rises = b * bdamp * (1 - math.exp(-mid / bdamp)) + du * damp * (1 - math.exp(-mid / damp))
        target = a0 + rises + min(rk * (temp - temp0), cap)
        temp += (target - temp) * step
        h += dt
    return math.inf


def quadrature_eta(temp0, a0, tau, amp, cap, limit=LIMIT):
    """The no-rise ODE is autonomous: its time to ``limit`` is the integral of tau / (target(T) - T) dT from
    temp0 (midpoint rule on a fine temperature grid); inf where the target stops short of the limit."""
    rk = 1.0 - 1.0 / amp
    n = 200_000
    temps = temp0 + (limit - temp0) * (np.arange(n) + 0.5) / n
    pull = a0 + np.minimum(rk * (temps - temp0), cap) - temps
    if np.any(pull <= 0.0):
        return math.inf
    return float(np.sum(tau / pull) * (limit - temp0) / n)


def eta(temp0, a0, b, bdamp, tau, du, damp, amp, cap):
    return th.time_to_limit(temp0, a0, b, bdamp, tau, du, damp, amp, cap, LIMIT, HORIZON)


# (temp0, a0, b, bdamp, tau, du, damp, amp, cap): an H100 at 60 °C inlet, 580 W of a 700 W limit; one at its
# limit already (cap 0); one starting under the limit whose leakage takes it there on the way; a resistance
# drifting (a failing interface) and an inlet rising (a cooling loop losing flow), each under, at and across
# the limit; and no limit at all (the power-cap forecast's use: power rising with the temperature).
STEADY = {
    "under the limit": (75.0, 60.0 + R * 580.0, 0.0, 1800.0, 120.0, 0.0, 240.0, AMP, R * 120.0),
    "at the limit": (79.5, 57.5 + R * 700.0, 0.0, 1800.0, 120.0, 0.0, 240.0, AMP, 0.0),
    "reaching the limit on the way": (70.0, 85.6, 0.0, 1800.0, 120.0, 0.0, 240.0, AMP, 2.3),
    "no power limit": (75.0, 86.0, 0.0, 1800.0, 120.0, 0.0, 240.0, AMP, math.inf),
}
RISING = {
    "drift under the limit": (75.0, 84.0, 0.004, 1800.0, 120.0, 0.0, 240.0, AMP, 8.0),
    "drift at the limit": (80.0, 86.5, 0.003, 1800.0, 120.0, 0.0, 240.0, AMP, 0.0),
    "drift reaching the limit": (70.0, 86.0, 0.003, 1800.0, 120.0, 0.0, 240.0, AMP, 1.5),
    "inlet rising under the limit": (75.0, 82.0, 0.0, 1800.0, 120.0, 0.03, 300.0, AMP, 10.0),
    "inlet rising at the limit": (80.0, 86.0, 0.0, 1800.0, 120.0, 0.02, 240.0, AMP, 0.0),
    "inlet rising, reaching the limit": (72.0, 82.0, 0.0, 1800.0, 120.0, 0.03, 300.0, AMP, 3.0),
    "both, strong leakage": (70.0, 80.0, 0.005, 1800.0, 60.0, 0.04, 200.0, 1.3, 4.0),
}


@pytest.mark.kernel
@pytest.mark.parametrize("case", list(STEADY))
def test_eta_follows_the_leakage_model(case):
    # a steady target: the closed form is the ODE's exact solution, so within the ODE's own step error
    args = STEADY[case]
    want = ode_eta(*args)
    assert want < HORIZON
    assert eta(*args) == pytest.approx(want, rel=0.005, abs=0.5)


@pytest.mark.kernel
@pytest.mark.parametrize("case", list(RISING))
def test_eta_with_rising_targets_follows_the_leakage_model(case):
    # settling rises: their first-order response is taken as a delay of the time constant in force (amp·tau
    # under the limit, tau at it) and the limit as reached from the steady part: within a few %
    args = RISING[case]
    want = ode_eta(*args)
    assert want < HORIZON
    assert eta(*args) == pytest.approx(want, rel=0.03, abs=2.0)


@pytest.mark.kernel
@settings(max_examples=150, deadline=None)
@given(temp0=st.floats(40.0, 86.0), target_over=st.floats(0.3, 25.0), tau=st.floats(5.0, 200.0),
       gain=st.floats(0.03, 0.33), cap=st.one_of(st.just(0.0), st.floats(0.0, 15.0), st.just(math.inf)),
       capped_over=st.floats(0.3, 20.0))
def test_eta_matches_the_odes_quadrature(temp0, target_over, tau, gain, cap, capped_over):
    # no rises: the time to the limit is an integral over temperature, computed independently of any time
    # stepping; the forecast must agree with it within 1 % (or 1 s) wherever it is in the horizon
    amp = 1.0 / (1.0 - gain)
    # the path's own destination (amplified, or held by the limit where it gets there) over the limit, or, for
    # a capped one, maybe under it: then the forecast must find no crossing either
    a0 = temp0 + (LIMIT - temp0 + target_over) / amp if cap == math.inf else LIMIT + capped_over - min(cap, 15.0)
    amplified = temp0 + amp * (a0 - temp0)
    dest = amplified if amplified <= temp0 + cap / (1.0 - 1.0 / amp) else a0 + cap
    assume(abs(dest - LIMIT) > 0.2)
    want = quadrature_eta(temp0, a0, tau, amp, cap)
    assume(want < 0.9 * HORIZON or dest < LIMIT)
    got = eta(temp0, a0, 0.0, 1800.0, tau, 0.0, 240.0, amp, cap)
    if dest < LIMIT:
        assert math.isinf(want) and math.isinf(got)
    else:
        assert got == pytest.approx(want, rel=0.01, abs=1.0)


@pytest.mark.kernel
@settings(max_examples=150, deadline=None)
@given(temp0=st.floats(20.0, 95.0), a0=st.floats(20.0, 120.0), b=st.floats(-0.01, 0.01), bdamp=st.floats(60.0, 1e5),
       tau=st.floats(2.0, 200.0), du=st.floats(-0.2, 0.3), damp=st.floats(30.0, 900.0), amp=st.floats(1.0, 2.0),
       cap=st.one_of(st.just(0.0), st.floats(0.0, 40.0), st.just(math.inf)))
def test_ceiling_bounds_the_forecast_over_the_horizon(temp0, a0, b, bdamp, tau, du, damp, amp, cap):
    # time_to_limit (and the detector's out_of_reach) skip the search where the ceiling is under the limit:
    # a ceiling under the forecast anywhere in the horizon would hide a crossing
    top = th.ceiling(temp0, a0, b, bdamp, du, damp, amp, cap, HORIZON)
    for h in np.linspace(0.0, HORIZON, 721):
        assert th.temp_at(h, temp0, a0, b, bdamp, tau, du, damp, amp, cap) <= top + 1e-9
