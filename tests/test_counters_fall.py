"""A fall that is not a clear (detectors/counters.py): a counter's decrease to more than it can have
counted since a clear in the interval re-bases it (``rebased_down``) instead of being read as a reset.

A counter's first reading is taken as its baseline with nothing to judge it by. Garbage there (a GPU's
``energy`` read as 1e15 as a collector starts, all ones of 64 bits while a port initialises), or two
garbage readings that rose from each other and stood, fell back to the counter's true total, and a
reset takes the new value as the increase since the clear: a day of energy in one second, weeks of an
optic's received bits in one poll. A clear in the interval can only have counted up to the counter's
bound times the interval, so a fall to more than that is the value before it being wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from foreshock.detectors.counters import LINK_DOWNS_MAX_PER_S, CounterRates
from foreshock.detectors.link_errors import LinkErrorsDetector
from foreshock.detectors.mahalanobis import MAX_RATE
from foreshock.frames import Frame

from test_counters import assert_matches_reference
from test_counters_rebase import energy_rates, feed, optic_pair
from test_detector_counter_bounds import as_records, one_link, optic_frames, run_mahalanobis, run_optics, same_state

DAY_OF_ENERGY = 6.0e7  # J: a GPU up a day at ~700 W
REBASED_DOWN = "fell to more than it can have counted since a clear"


@pytest.mark.parametrize("garbage", [1e15, 2.0**64 - 1])
def test_a_garbage_first_reading_costs_one_poll_not_the_counters_whole_total(garbage):
    """Before: the fall back to the true total was a reset whose increase was that total, 6e7 J in
    a second (60 MW). Now the counter is re-based on the true total, nothing taken for that poll, and
    every increase after it is the true one."""
    true = DAY_OF_ENERGY + 700.0 * np.arange(60)
    raw = true.copy()
    raw[0] = garbage
    rates = energy_rates()
    delta, rate, problems = feed(rates, raw)
    assert np.isnan(delta[:2, 0]).all() and np.isnan(rate[:2, 0]).all()
    np.testing.assert_array_equal(delta[2:, 0], np.diff(true)[1:])
    assert problems["rebased_down"] == 1
    assert problems["resets"] == problems["resets_confirmed"] == 0 and rates.s_resets[0, 0] == 0


def test_two_garbage_readings_that_stood_fall_back_to_a_re_base_not_a_reset():
    """Two garbage readings rising from each other within the bound stand (the counter is re-based on
    the first); the fall back to the true total is then no clear either."""
    true = DAY_OF_ENERGY + 700.0 * np.arange(20)
    raw = true.copy()
    raw[5], raw[6] = 1e13, 1e13 + 900.0
    delta, _, problems = feed(energy_rates(), raw)
    assert problems["implausible_rise"] == 1 and problems["rebased"] == 1
    assert delta[6, 0] == 900.0  # taken from the reading that stood
    assert np.isnan(delta[7, 0])  # the fall back: re-based, not +6e7
    np.testing.assert_array_equal(delta[8:, 0], np.diff(true)[7:])
    assert problems["rebased_down"] == 1 and problems["resets"] == 0


def test_a_low_reading_above_the_bound_and_then_back_is_a_glitch():
    """With a pace known the value before was judged: a fall to more than a clear explains is held
    for the next reading. A truncated read (one digit lost) back at the next poll was the bad one:
    nothing taken for it, and the next reading takes the whole rise since the last good one, its
    rate over that time. Read as a reset, it had been 6e6 J in one second (6 MW), then 0."""
    true = DAY_OF_ENERGY + 700.0 * np.arange(8)
    raw = true.copy()
    raw[3] = true[3] / 10
    rates = energy_rates()
    delta, rate, problems = feed(rates, raw)
    assert np.isnan(delta[3, 0]) and np.isnan(rate[3, 0])
    assert delta[4:, 0].tolist() == [1400.0, 700.0, 700.0, 700.0] and rate[4:, 0].tolist() == [700.0] * 4
    assert {name: n for name, n in problems.items() if n} == {"glitches": 1}
    assert rates.s_resets[0, 0] == 0


def test_a_fall_held_then_gone_on_from_stands_at_the_next_reading():
    """The value before had been judged by its pace, yet the counter goes on from the lower one: the
    fall stands (``rebased_down`` counted then) and the counter counts from it."""
    raw = [DAY_OF_ENERGY, DAY_OF_ENERGY + 700.0, 1e6, 1e6 + 700.0, 1e6 + 1400.0]
    delta, _, problems = feed(energy_rates(), raw)
    assert np.isnan(delta[2, 0]) and delta[3:, 0].tolist() == [700.0, 700.0]
    assert {name: n for name, n in problems.items() if n} == {"rebased_down": 1}


def test_a_true_clear_is_still_a_reset_counting_what_came_after_it():
    """A GPU rebooted between two polls: its energy starts again from zero, and what it reads next is
    within what it can count in the interval: a reset, its increase the new value."""
    raw = [DAY_OF_ENERGY, DAY_OF_ENERGY + 7000.0, 3500.0, 10500.0]
    delta, _, problems = feed(energy_rates(), raw, interval=10.0)
    assert delta[1:, 0].tolist() == [7000.0, 3500.0, 7000.0]
    assert problems["resets"] == problems["resets_confirmed"] == 1 and problems["rebased_down"] == 0


@pytest.mark.parametrize("after, read_as", [(0.0, {"resets": 1, "resets_confirmed": 1}), (1.0, {"rebased_down": 1})])
def test_the_bound_over_the_interval_is_the_line(after, read_as):
    """A fall to exactly the bound times the interval is a clear that counted at the bound the whole
    interval; one count more is not."""
    bound, interval = 100.0, 10.0
    delta, _, problems = feed(CounterRates(1, ["x"], max_rate=bound), [1e9, bound * interval + after],
                              interval=interval)
    assert {name: n for name, n in problems.items() if n} == read_as
    assert (delta[1, 0] == bound * interval) if after == 0.0 else np.isnan(delta[1, 0])


def test_a_counter_without_a_bound_reads_every_fall_as_a_reset():
    delta, _, problems = feed(CounterRates(1, ["x"]), [1e15, DAY_OF_ENERGY])
    assert delta[1, 0] == DAY_OF_ENERGY and problems["resets"] == 1 and problems["rebased_down"] == 0


def test_a_small_counter_cannot_tell_garbage_from_a_clear():
    """Documented limit: a ``link_downed`` whose true total (3) is within what it can count in a poll
    falls back from a garbage first reading as a reset that counted 3."""
    delta, _, problems = feed(CounterRates(1, ["link_downed"], max_rate=LINK_DOWNS_MAX_PER_S), [1e12, 3.0, 3.0],
                              interval=10.0)
    assert delta[1:, 0].tolist() == [3.0, 0.0] and problems["resets"] == 1 and problems["rebased_down"] == 0


def test_the_optic_pair_re_bases_its_bits_and_gives_no_ber_for_that_poll():
    """Weeks of received bits (3e17) after a garbage first reading: before, a reset taking 3e17 bits in
    one 10-s poll, a BER 1e5 times too low for it. Now no increase of the bits for that poll (and so
    no BER: the corrected bits' increase is not given alone), and both counters' increases after it
    span the same intervals."""
    pair = optic_pair()
    bits = 3e17 + 4.25e12 * np.arange(5)
    corrected = 2e13 + 4.25e4 * np.arange(5)
    raw = np.stack([bits, corrected], axis=1)
    raw[0, 0] = 1e20
    delta, _, problems = feed(pair, raw, interval=10.0)
    assert np.isnan(delta[1, 0]) and problems["rebased_down"] == 1 and problems["resets"] == 0
    assert np.isnan(delta[1, 1])  # read together: the corrected bits' increase alone is not given
    np.testing.assert_allclose(delta[2:, 0], 4.25e12)
    np.testing.assert_allclose(delta[2:, 1], 4.25e4)


def test_a_truncated_bits_reading_of_the_pair_is_a_glitch_and_both_increases_span_one_interval():
    """The pair with a pace known, ``rx_bits`` read with two digits lost once: no increase for
    either in that row, and in the next each counter's own interval (a BER as without the bad
    reading)."""
    pair = optic_pair()
    bits = 3e17 + 4.25e12 * np.arange(6)
    corrected = 2e13 + 4.25e4 * np.arange(6)
    raw = np.stack([bits, corrected], axis=1)
    raw[3, 0] = bits[3] / 100
    delta, _, problems = feed(pair, raw, interval=10.0)
    assert np.isnan(delta[3]).all()
    np.testing.assert_allclose(delta[4:, 0], 4.25e12)
    np.testing.assert_allclose(delta[4:, 1], 4.25e4)
    assert {name: n for name, n in problems.items() if n} == {"glitches": 1}


def test_the_optics_detector_reads_a_garbage_first_reading_as_a_missing_one():
    """Before: the same findings (none), but a reset counted against the port."""
    found, health, states = run_optics(optic_frames("rx_bits", 1e20, bad_at=0.0))
    without, health_without, states_without = run_optics(optic_frames("rx_bits", np.nan, bad_at=0.0))
    assert without == [] and as_records(found) == as_records(without)
    assert all(same_state(a, b) for a, b in zip(states, states_without))
    assert [n for (_, reason), n in health.problems.items() if REBASED_DOWN in reason] == [1]
    assert health_without.problems == {}


def test_the_gpu_model_reads_a_garbage_first_energy_reading_as_a_missing_one():
    """The Mahalanobis model learns energy's rate: the fall back from 1e15 J to the counter's 1e9 J had
    been 1e9 W learnt in its warm-up (the model's mean rate after 600 s: 673,744 W, against 454)."""
    fields = "gpu_temp,power,energy,util"
    found, health, det = run_mahalanobis("energy", 1e15, fields, at=0)
    without, _, det_without = run_mahalanobis("energy", np.nan, fields, at=0)
    assert without == [] and as_records(found) == as_records(without)
    np.testing.assert_allclose(det.s_gpu_mean, det_without.s_gpu_mean)
    np.testing.assert_allclose(det.s_gpu_cov, det_without.s_gpu_cov)
    assert [n for (_, reason), n in health.problems.items() if REBASED_DOWN in reason] == [1]
    assert MAX_RATE["energy"] < DAY_OF_ENERGY  # (the bound that tells it: a second of energy, not a day)


def test_a_held_state_down_is_counted_once_when_the_fall_comes_in_the_same_frame():
    """Review r1: the link-errors kernel keeps the ``link_downed`` reading the counter last took, to
    tell a clear; after a fall re-based with no increase it still held the garbage, so a later row
    of the same frame looked like a clear and a state-down held for the counter was counted again."""
    topology = one_link()
    ts, state = [0.0, 10.0, 20.0, 30.0], [4.0, 4.0, 1.0, 4.0]  # ACTIVE, then DOWN for a poll, back
    downed = [1e12, 60.0, np.nan, 61.0]  # garbage first, then the true total; no reading while down

    def downs(one_frame: bool) -> list[str]:
        det = LinkErrorsDetector(topology)
        if one_frame:
            found = det.update(Frame("link", ts, [0] * 4, {"link_downed": downed, "link_state": state}))
        else:
            found = [f for i in range(4) for f in det.update(
                Frame("link", [ts[i]], [0], {"link_downed": [downed[i]], "link_state": [state[i]]}))]
        return [f.field for f in found]

    assert downs(one_frame=True) == downs(one_frame=False) == ["link_downed"]


def test_a_link_down_around_a_truncated_reading_is_counted_whole():
    """Review r2: 100 -> 101 -> 10 (a truncated read, more than 5 downs a second can explain) -> 102.
    Shared by time, the glitch's rise had been half a down (``+0.5``, dropped from the flap ring)."""
    delta, _, problems = feed(CounterRates(1, ["link_downed"], max_rate=LINK_DOWNS_MAX_PER_S),
                              [100.0, 101.0, 10.0, 102.0])
    assert np.isnan(delta[2, 0]) and delta[3, 0] == 1.0
    assert {name: n for name, n in problems.items() if n} == {"glitches": 1}


@pytest.mark.kernel
@settings(max_examples=150, deadline=None)
@given(together=st.booleans(), data=st.data())
def test_kernel_matches_reference_around_falls_no_clear_explains(together, data):
    """Two counters far above what they count in a poll (1e8-1e12, at most 1e4 a second), with
    readings that fall to more than a clear explains (digits lost: a glitch if the next is back, a
    re-base if it goes on from there, or garbage first and the true total after it), some missing;
    alone or together, fed in two parts with a checkpoint between: the kernel equals the reference,
    delta for delta and count for count, and read together a row's increases are known for both or
    neither."""
    n_rows = data.draw(st.integers(3, 30))
    ts = np.cumsum(data.draw(st.lists(st.floats(0.5, 10.0), min_size=n_rows, max_size=n_rows)))
    pace = np.array(data.draw(st.lists(st.floats(0.0, 1e4), min_size=2, max_size=2)))
    if together:
        pace[1] = min(pace[1], pace[0])
    values = np.array(data.draw(st.lists(st.floats(1e8, 1e12), min_size=2, max_size=2))) + ts[:, None] * pace
    if data.draw(st.booleans()):
        values[0, data.draw(st.integers(0, 1))] = 1e15  # garbage first
    for _ in range(data.draw(st.integers(1, 4))):
        i, j = data.draw(st.integers(1, n_rows - 1)), data.draw(st.integers(0, 1))
        how = data.draw(st.sampled_from(["truncated once", "truncated from here on", "missing"]))
        cut_by = data.draw(st.sampled_from([10.0, 100.0, 1e4]))
        if how == "truncated once":
            values[i, j] /= cut_by
        elif how == "truncated from here on":  # it goes on from the low value: the fall stands
            values[i:, j] -= values[i, j] * (1 - 1 / cut_by)
        else:
            values[i, j] = np.nan
    max_rate = [1e4, 1e4 if together else data.draw(st.sampled_from([1e4, np.inf]))]
    bounded_by = {"b": "a"} if together else None
    make = lambda: CounterRates(1, ["a", "b"], max_rate=max_rate, together=together,  # noqa: E731
                                bounded_by=bounded_by)
    both, _, problems = assert_matches_reference(make, ts, np.zeros(n_rows, np.int32), values,
                                                 data.draw(st.integers(0, n_rows)))
    event(f"rebased_down: {problems['rebased_down'] > 0}, glitch: {problems['glitches'] > 0}")
    if together:
        assert np.array_equal(np.isnan(both[:, 0]), np.isnan(both[:, 1]))
