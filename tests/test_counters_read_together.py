"""Counters read together (``CounterRates(together=True)``) and one counter bounding another's rise
(``bounded_by``): the optics' received and corrected bits, whose ratio is the pre-FEC BER.

Before: each counter was judged alone, so one refused (or invalid) reading of corrected bits left
the next increase of received bits over one interval and its own over two, and nothing held
corrected bits under received bits (a BER over 1 was taken, capped to 0.45, and claimed).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.counters import CounterRates, modulus_for_bits

from test_counters import assert_matches_reference, values_st  # the module's reference and its readings

PAIR = ("rx_bits", "rx_corrected_bits")


def pair(max_rate: float = 1e6) -> CounterRates:
    return CounterRates(1, PAIR, max_rate=max_rate, together=True, bounded_by={"rx_corrected_bits": "rx_bits"})


def feed(rates: CounterRates, rows: list[tuple[float, float]], dt: float = 1.0):
    raw = np.array(rows, dtype=np.float64)
    return rates.update(np.arange(len(raw)) * dt, np.zeros(len(raw), np.int32), raw)


@pytest.mark.kernel
@settings(max_examples=80, deadline=None)
@given(n_rows=st.integers(0, 40), n_slots=st.integers(1, 3), data=st.data())
def test_kernel_matches_reference_read_together(n_rows, n_slots, data):
    """Random readings (missing, invalid, all ones, near 2**64, drops and jumps) of three counters
    read together, the second bounded by the first, fed in two parts with a checkpoint between:
    the kernel equals the plain-Python reference, delta for delta and count for count."""
    slot = np.array(data.draw(st.lists(st.integers(-1, n_slots), min_size=n_rows, max_size=n_rows)), np.int32)
    if data.draw(st.booleans()):  # in time order, as a source sends them
        ts = np.cumsum(data.draw(st.lists(st.floats(0.0, 5.0), min_size=n_rows, max_size=n_rows)))
    else:
        ts = np.array(data.draw(st.lists(st.one_of(st.floats(0, 100, allow_nan=False), st.just(np.nan)),
                                         min_size=n_rows, max_size=n_rows)))
    # counters rising by up to 3e6 a row, so that rows are plain rises and the bound between them
    # matters, with some readings replaced by anything (missing, invalid, all ones, a drop, a jump)
    rises = data.draw(st.lists(st.lists(st.floats(0, 3e6), min_size=3, max_size=3), min_size=n_rows,
                               max_size=n_rows))
    values = np.cumsum(np.array(rises, dtype=np.float64).reshape(n_rows, 3), axis=0)
    for i, j, v in data.draw(st.lists(st.tuples(st.integers(0, max(n_rows - 1, 0)), st.integers(0, 2), values_st),
                                      max_size=n_rows // 2)):
        if n_rows:
            values[i, j] = v
    modulus = [0.0, 0.0, modulus_for_bits(32)]
    max_rate = data.draw(st.lists(st.sampled_from([np.inf, 1e6, 1e3]), min_size=3, max_size=3))
    make = lambda: CounterRates(n_slots, ["a", "b", "c"], modulus=modulus, max_rate=max_rate,  # noqa: E731
                                together=True, bounded_by={"b": "a"})
    both, _, _ = assert_matches_reference(make, ts, slot, values, data.draw(st.integers(0, n_rows)))
    # a row is taken for both or neither: their deltas are known together (but for a reading held at
    # 2**32-1, which holds that counter alone for a poll, and so its time)
    if not np.any(values[:, :2] == 2.0**32 - 1):
        assert not np.any(np.isnan(both[:, 0]) != np.isnan(both[:, 1]))


@pytest.mark.parametrize("bad", [np.nan, -1.0, np.inf, 1e15], ids=["missing", "negative", "inf", "too fast"])
@pytest.mark.parametrize("which", [0, 1], ids=PAIR)
def test_one_bad_reading_of_the_pair_leaves_both_where_they_were(bad, which):
    """1e6 bits a second, 100 of them corrected; one bad reading of either: the row is taken for
    neither, and the next increases both span the two intervals: the ratio is exact."""
    rows = [(1e6 * i, 100.0 * i) for i in range(5)]
    rows[2] = (bad, rows[2][1]) if which == 0 else (rows[2][0], bad)
    delta, _, problems = feed(pair(), rows)
    assert np.isnan(delta[2]).all()
    assert delta[3].tolist() == [2e6, 200.0] and delta[4].tolist() == [1e6, 100.0]
    assert problems["implausible_rise"] == (bad == 1e15)
    assert problems["invalid_value"] == (bad < 0 or bad == np.inf)
    assert problems["resets"] == 0 and problems["glitches"] == 0
    # judged alone, the other counter's reading was taken: its next delta spanned one interval
    alone = CounterRates(1, PAIR, max_rate=1e6)
    delta, _, _ = feed(alone, rows)
    assert delta[3, 1 - which] == (1e6 if which else 100.0)


def test_corrected_bits_rising_more_than_the_bits_received_is_refused():
    """Under the line-rate bound but above the bits received (a BER over 1): refused and counted;
    the next reading is taken from the last good one."""
    rows = [(1e6 * i, 100.0 * i) for i in range(5)]
    rows[2] = (rows[2][0], 100.0 + 5e5 + 1e6)  # +1.5e6 corrected bits over 1e6 received
    delta, _, problems = feed(pair(max_rate=1e7), rows)
    assert np.isnan(delta[2]).all() and delta[3].tolist() == [2e6, 200.0]
    assert problems["implausible_rise"] == 1
    # as many corrected as received is a BER of 1, the most there can be: taken
    rows[2] = (rows[2][0], 100.0 + 1e6)
    delta, _, problems = feed(pair(max_rate=1e7), rows)
    assert delta[2].tolist() == [1e6, 1e6] and problems["implausible_rise"] == 0
    # without the bound the first one was taken, and the fall back read as a reset
    delta, _, problems = feed(CounterRates(1, PAIR, max_rate=1e7, together=True),
                              [(1e6 * i, 100.0 * i) if i != 2 else (2e6, 1.5e6 + 100.0) for i in range(5)])
    assert delta[2, 1] == 1.5e6 and problems["resets"] == 1


def test_a_low_corrected_reading_back_the_next_poll_is_a_glitch_not_refused_for_ever():
    """Corrected bits (1e7 of them, from weeks of uptime) read 0 once, then back: the return is a
    rise from 0 ten times the bits' rise, but it is the glitch's way back (a drop is pending), judged
    by the glitch rule and taken. Compared with the bits' rise, it was refused, the drop stayed
    pending, and so was every reading after it."""
    rows = [(1e6 * i, 1e7 + 100.0 * i) for i in range(6)]
    rows[2] = (rows[2][0], 0.0)
    delta, _, problems = feed(pair(), rows)
    assert problems["glitches"] == 1 and problems["implausible_rise"] == 0 and problems["resets_confirmed"] == 0
    assert np.isfinite(delta[3:]).all() and delta[5].tolist() == [1e6, 100.0]


def test_rises_over_different_intervals_are_not_compared():
    """A corrected-bits reading at 2**32-1 with no pace known is held a poll (where a 32-bit counter
    stops), the bits taken: the next rise of corrected bits spans two intervals, the bits' one, and
    is not compared with it (1.5e6 over 1e6 here). Compared, a counter whose rise spans more
    intervals than its bound's could be refused for ever."""
    top = 2.0**32 - 1
    rows = [(0.0, top - 1e6), (1e6, top), (2e6, top + 5e5), (3e6, top + 6e5)]
    delta, _, problems = feed(pair(max_rate=1e7), rows)
    assert np.isnan(delta[1, 1]) and delta[1, 0] == 1e6  # held, the bits taken
    assert delta[2].tolist() == [1e6, 1.5e6] and delta[3].tolist() == [1e6, 1e5]
    assert problems["implausible_rise"] == 1  # the held reading, not there the poll after: a bad one


def test_a_clear_of_both_is_a_reset_and_they_go_on_together():
    rows = [(1e6 * i + 5e6, 100.0 * i + 500.0) for i in range(3)] + [(3e5, 30.0), (1.3e6, 130.0), (2.3e6, 230.0)]
    delta, _, problems = feed(pair(), rows)
    assert problems["resets"] == 2 and problems["resets_confirmed"] == 2 and problems["implausible_rise"] == 0
    assert delta[3:].tolist() == [[3e5, 30.0], [1e6, 100.0], [1e6, 100.0]]


def test_validation_of_bounded_by():
    with pytest.raises(ValueError, match="together"):
        CounterRates(1, PAIR, bounded_by={"rx_corrected_bits": "rx_bits"})
    for bounds in ({"rx_corrected_bits": "tx_bits"}, {"x": "rx_bits"}, {"rx_bits": "rx_bits"}):
        with pytest.raises(ValueError, match="bounded_by"):
            CounterRates(1, PAIR, together=True, bounded_by=bounds)
