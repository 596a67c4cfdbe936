"""Audit of the optics detector (2026-12-05, repros /tmp/audit_optics2/): a trend's slope became an ETA
without a test against the fit's own noise, so flat noisy optics were predicted to go down (1 to 6 of 16
healthy links a day); and an optic polled less often than every 3 buckets (``ethtool -m`` every 3-5
minutes) was "dark" between every two polls, so an improving step read as a replaced module."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.optics import F_SIZE, O_COUNT, O_DARK, O_SIZE, OpticsDetector
from foreshock.findings import Anomaly, Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology


def links(n: int) -> Topology:
    return Topology.from_dict({
        "rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
        "nodes": [{"name": f"n{i}", "rack": "k", "gpus": 1} for i in range(n)], "switches": [{"name": "leaf0"}],
        "links": [{"name": f"n{i}/gpu0~leaf0", "a": f"n{i}/gpu0", "b": "leaf0"} for i in range(n)]})


def ber_of_margin(margin_db: float) -> float:
    """A pre-FEC BER ``margin_db`` of Q above the default KP4 limit (Q ~3.49 there)."""
    return 0.5 * math.erfc(3.49 * 10 ** (margin_db / 20) / math.sqrt(2))


def frame(ts: float, n: int, **cols: list[float]) -> Frame:
    base = {"tx_power": [0.5] * n, "tx_bias": [7e-3] * n, "los": [0.0] * n, "rx_bits": [math.nan] * n,
            "rx_corrected_bits": [math.nan] * n, "prefec_ber": [math.nan] * n, "module_temp": [40.0] * n,
            "rx_power": [math.nan] * n}
    base.update(cols)
    return Frame("optic", np.full(n, float(ts)), np.arange(n),
                 {k: np.asarray(v, dtype=float) for k, v in base.items()})


def predicted_links(det: OpticsDetector, rows) -> set[int]:
    found: set[int] = set()
    for t, n, cols in rows:
        found |= {f.slot for f in det.update(frame(t, n, **cols)) if isinstance(f, Prediction) and f.active}
    return found


def test_flat_noisy_rx_power_is_not_predicted_to_reach_its_alarm():
    # 16 healthy links, RX power flat at -6 dBm with 0.2 dB of white noise a sample, alarm at -8 dBm, 24 h
    # of 30-s samples: nothing degrades, so any link_down is a false alarm (6 of 16 before the fix)
    n_links = 16
    det = OpticsDetector(links(n_links), rx_power_low_alarm_dbm=-8.0)
    rng = np.random.default_rng(11)
    rows = ((t, 2 * n_links, {"rx_power": list(-6.0 + rng.normal(0, 0.2, 2 * n_links))})
            for t in np.arange(0, 24 * 3600, 30.0))
    assert predicted_links(det, rows) == set()


def test_flat_noisy_ber_is_not_predicted_to_reach_the_fec_limit():
    # one link 1.5 dB of Q above its FEC limit, 0.5 dB of noise: a chance dip was a link_down in 0.7 h
    det = OpticsDetector(links(1))
    rng = np.random.default_rng(3)
    rows = ((t, 2, {"prefec_ber": [ber_of_margin(m) for m in 1.5 + rng.normal(0, 0.5, 2)]})
            for t in np.arange(0, 24 * 3600, 30.0))
    assert predicted_links(det, rows) == set()


def test_a_real_decline_as_noisy_is_still_predicted_ahead_of_its_alarm():
    # the same noise, but end b loses 1 dB an hour from 2 h on: -8 dBm is reached at 4 h. The noise test
    # must leave it its prediction, made before the alarm with an ETA near the truth
    det = OpticsDetector(links(1), rx_power_low_alarm_dbm=-8.0)
    rng = np.random.default_rng(5)
    first = None
    for t in np.arange(0, 4 * 3600, 30.0):
        loss = max(0.0, (t - 7200) / 3600)
        rx = np.array([-6.0, -6.0 - loss]) + rng.normal(0, 0.2, 2)
        for f in det.update(frame(t, 2, rx_power=list(rx))):
            if first is None and isinstance(f, Prediction) and f.active:
                first = f
    assert first is not None
    assert first.ts < 4 * 3600 - 1800  # at least half an hour ahead of the alarm
    assert abs(first.ts + first.eta_s - 4 * 3600) < 1800


def slow_poll(poll_s: float, silent: tuple[float, float] | None = None) -> tuple[OpticsDetector, list[Anomaly]]:
    """One link polled every ``poll_s`` for 6 h, never LOS; end b's RX power improves 2 dB at 3 h (a patch
    cord swapped while lit), or, with ``silent`` = (from, to), after the optic sent nothing between them."""
    det = OpticsDetector(links(1))
    rng = np.random.default_rng(2)
    found: list[Anomaly] = []
    for t in np.arange(0, 6 * 3600, poll_s):
        if silent and silent[0] <= t < silent[1]:
            continue
        rx = np.array([-4.0, -4.0 + 2.0 * (t >= 3 * 3600)]) + rng.normal(0, 0.02, 2)
        found += [f for f in det.update(frame(t, 2, rx_power=list(rx))) if isinstance(f, Anomaly)]
    return det, found


def test_an_optic_polled_every_few_minutes_is_not_dark_between_its_polls():
    for poll in (180.0, 300.0):
        det, found = slow_poll(poll)
        steps = [f for f in found if f.field == "rx_power" and "stepped" in f.reason]
        assert len(steps) == 1, (poll, [f.reason for f in found])
        # never LOS and never silent beyond its own poll: the step is a patch change, its trend kept
        assert "replaced module" not in steps[0].reason, poll
        assert math.isnan(det.s_optic[1, O_DARK]), poll
        assert det.s_optic[1, O_COUNT] == det.s_optic[0, O_COUNT] > 8, poll  # its ring was not wiped


def test_a_slowly_polled_optic_unplugged_for_an_hour_is_still_a_replaced_module():
    # the same optic silent from 2 h to 3 h (12 polls missed) and back 2 dB better: a module swapped
    det, found = slow_poll(300.0, silent=(2 * 3600, 3 * 3600))
    steps = [f for f in found if f.field == "rx_power" and "stepped" in f.reason]
    assert steps and "replaced module" in steps[0].reason
    assert det.s_optic[1, O_DARK] >= math.floor(2 * 3600 / 60)


def test_a_checkpoint_saved_before_the_new_columns_goes_on():
    # a state without O_SPACING (s_optic one column short) nor the slope's error (the fits one short):
    # upgraded and loaded, the detector runs on and its slow-polled optic learns its spacing anew
    det, _ = slow_poll(300.0)
    state = det.state_dict()
    state["s_optic"] = state["s_optic"][:, :O_SIZE - 1]
    state["s_fit"] = state["s_fit"][:, :, :F_SIZE - 1]
    state["s_trend_fit"] = state["s_trend_fit"][:, :, :F_SIZE - 1]
    fresh = OpticsDetector(links(1))
    fresh.load_state_dict(state)
    assert fresh.s_optic.shape[1] == O_SIZE and fresh.s_fit.shape[2] == F_SIZE
    for t in np.arange(6 * 3600, 8 * 3600, 300.0):
        fresh.update(frame(t, 2, rx_power=[-4.0, -2.0]))
    assert math.isnan(fresh.s_optic[1, O_DARK])


@pytest.mark.kernel
@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1e5), min_size=0, max_size=40), st.floats(0.0, 5.0), st.integers(0, 45))
def test_slope_standard_error_matches_its_formula(times: list[float], scale: float, m: int) -> None:
    """The kernel against its docstring's formula, written plainly: 1.19 x 1.4826 x scale over the
    square root of the first m times' summed squared deviations; NaN with fewer than two or no spread."""
    from foreshock.detectors.optics import slope_standard_error

    m = min(m, len(times))
    t = np.array(times + [0.0])  # (a buffer longer than the points it holds, as the detector's)
    got = slope_standard_error(t, m, scale)
    first = times[:m]
    s_tt = sum((x - sum(first) / m) ** 2 for x in first) if m else 0.0
    if m < 2 or not s_tt > 0.0:
        assert math.isnan(got)
    else:
        assert got == pytest.approx(1.19 * 1.4826 * scale / math.sqrt(s_tt), rel=1e-9)
