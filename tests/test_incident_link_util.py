"""The incident engine's link utilisation (``Telemetry.observe`` on link frames) from the
transmitted-bytes counter: a garbage counter is counted as a problem row and read as unknown,
without a floating-point warning (a 1e300-byte jump overflowed the divide: a RuntimeWarning in
every pipeline log that met one, until 2026-12-05)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from foreshock.detectors.incident_impact import LINK_UTIL, Telemetry
from foreshock.frames import Frame

RATE = 400e9  # bits/s


def link_frame(t: float, tx_bytes: float) -> Frame:
    return Frame("link", np.array([t]), np.array([0]), {"tx_data": np.array([tx_bytes]),
                                                         "link_rate": np.array([RATE])})


def test_a_link_at_half_its_rate_reads_half() -> None:
    tel = Telemetry(1, 1, 1)
    assert tel.observe(link_frame(0.0, 0.0)) == 0
    assert tel.observe(link_frame(10.0, RATE / 8.0 * 10.0 * 0.5)) == 0
    assert tel.s_link_tel[0, LINK_UTIL] == pytest.approx(0.5)


# (time of the last good reading, of the garbage one, counter): a counter that went back; one
# near the float's top (the bits' multiply overflows); a jump stamped a hair after the last (the
# divide overflows); a jump far past the line rate
@pytest.mark.parametrize("t_last, t_bad, garbage", [(10.0, 20.0, -1.0), (10.0, 20.0, 1e308), (0.0, 1e-300, 1e300),
                                                    (10.0, 20.0, 1e30)])
def test_a_garbage_counter_is_counted_and_unknown_without_a_warning(t_last: float, t_bad: float,
                                                                    garbage: float) -> None:
    tel = Telemetry(1, 1, 1)
    tel.observe(link_frame(t_last - 10.0, 1000.0))
    tel.observe(link_frame(t_last, 1000.0 + RATE / 8.0 * 10.0 * 0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tel.observe(link_frame(t_bad, garbage)) == 1
    assert np.isnan(tel.s_link_tel[0, LINK_UTIL])
