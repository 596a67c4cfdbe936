"""One low counter reading between two right ones is a glitch, not a reset (review h45).

Read as a reset, the low reading made the next, correct one an increase from the low value: the
counter's whole total in one interval. A driver reporting 0 for one poll, a truncated sysfs read
or a bad relay became congestion, "fatal: 50000 symbol errors in the last hour" or three link
downs. A real clear (the counter stays low and grows from there) and a wrap read as before.

Then (h52): near the top of a counter that wraps, the low reading fitted the wrap rule and slipped
through as a wrap (the next reading an increase of nearly 2**32); and the value before a low
reading was not in the detectors' checkpoints, so a glitch across a restore read as a reset.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.congestion import CongestionDetector
from foreshock.detectors.counters import PACE_SLACK, CounterRates, modulus_for_bits, report_problems
from foreshock.detectors.link_errors import LinkErrorsDetector
from foreshock.detectors.optics import OpticsDetector
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from test_counters import assert_matches_reference, naive_rates  # the module's reference, glitches included


def one_link_topology() -> Topology:
    return Topology.from_dict({
        "rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
        "nodes": [{"name": "n0", "rack": "k", "gpus": 1}], "switches": [{"name": "leaf0"}],
        "links": [{"name": "n0/gpu0~leaf0", "a": "n0/gpu0", "b": "leaf0"}],
    })


def feed(det, ts, **columns):
    """One link's samples, one frame per sample; all findings."""
    found = []
    for i, t in enumerate(ts):
        found += det.update(Frame("link", [float(t)], [0], {k: [v[i]] for k, v in columns.items()}))
    return found


def glitch_problems(health: PipelineHealth, stage: str) -> int:
    return sum(n for (where, reason), n in health.problems.items() if where == stage and "bad reading" in reason)


def one_counter(raw, ts=None, modulus: float = 0.0) -> tuple[CounterRates, np.ndarray, dict[str, int]]:
    rates = CounterRates(1, ["x"], modulus=modulus)
    raw = np.asarray(raw, dtype=np.float64)
    ts = np.arange(len(raw), dtype=np.float64) * 10.0 if ts is None else np.asarray(ts, dtype=np.float64)
    delta, _, problems = rates.update(ts, np.zeros(len(raw), np.int32), raw[:, None])
    return rates, delta[:, 0], problems


# ---- the three cases the review found ---------------------------------------------------------
def test_one_truncated_xmit_wait_reading_is_no_congestion():
    """A healthy NDR port: xmit_wait ~2.49e9 total, ~1000 ticks/s (0.0002 % of the time); one poll
    reads '249' of '2490050000'. Before: the next poll was +2.49e9 in 10 s, congestion at ~32 %."""
    health = PipelineHealth()
    det = CongestionDetector(one_link_topology(), health=health)
    ts = np.arange(12) * 10.0
    wait = 2.49e9 + 1000.0 * ts
    wait[5] = 249.0
    found = feed(det, ts, xmit_wait=wait, link_state=[4.0] * 12, link_rate=[400e9] * 12)
    assert found == []
    assert glitch_problems(health, "congestion") == 1


def test_one_truncated_symbol_error_reading_is_not_50000_new_errors():
    """A static symbol_error of 50000 reading '50' once. Before: 'fatal: 50000 symbol errors in
    the last hour' and 5e3/s. The low reading itself still counts as a reset of 50 (it cannot be
    told from one when it comes), below the 120-an-hour threshold; nothing more is added."""
    health = PipelineHealth()
    det = LinkErrorsDetector(one_link_topology(), health=health)
    ts = np.arange(12) * 10.0
    sym = np.full(12, 50000.0)
    sym[5] = 50.0
    found = feed(det, ts, symbol_error=sym, link_state=[4.0] * 12)
    assert [f.field for f in found] == []
    assert glitch_problems(health, "link_errors") == 1


def test_one_zero_link_downed_reading_is_no_down_and_no_flapping():
    """link_downed 3 read as 0 once. Before: 'fatal: link_downed +3' and three downs in 12 h
    ('flapping') from a link that never went down."""
    health = PipelineHealth()
    det = LinkErrorsDetector(one_link_topology(), health=health)
    downed = [3.0, 3.0, 3.0, 0.0, 3.0, 3.0]
    found = feed(det, np.arange(6) * 10.0, link_downed=downed, link_state=[4.0] * 6)
    assert found == []
    assert glitch_problems(health, "link_errors") == 1


# ---- what the glitch adds, and what stays as it was ----------------------------------------------
def test_a_glitch_adds_nothing_to_the_true_increase_and_is_no_reset():
    """xmit_wait at 1000/s read as 249 once: the two intervals around it count the 20000 ticks
    that happened (249 at the low reading, the rest at the next), the reset is taken back, and the
    pace is the one from before the drop (the next wrap is judged by it)."""
    m = modulus_for_bits(32)
    raw = [2.49e9, 2.49e9 + 1e4, 249.0, 2.49e9 + 3e4, 2.49e9 + 4e4]
    rates, delta, problems = one_counter(raw, modulus=m)
    assert delta[1:].tolist() == [1e4, 249.0, 2e4 - 249.0, 1e4]
    assert problems["glitches"] == 1 and problems["resets"] == 1  # the reset is known a glitch only after
    assert rates.s_resets[0, 0] == 0
    assert rates.s_rate[0, 0] == 1000.0


@pytest.mark.parametrize("bounded", [True, False])
def test_a_clear_followed_by_a_long_polling_gap_stays_a_reset(bounded):
    """xmit_wait at 2.49e9 (FACTS: a healthy NDR port), 1e6 ticks/s, cleared (perfquery -R) at t=30,
    then the poller away an hour. Back above the pre-clear total "within the bound over the time
    since", it was read as a glitch: the reset taken back and the hour's increase counted from
    2.49e9 (3.0e5/s for 1e6/s). A glitch's way back must come soon after the low reading (within
    PACE_SLACK times the interval before it); this one came 360 intervals later: the reset stands."""
    from foreshock.detectors.congestion import params_vector, xmit_wait_limits

    modulus, bound = xmit_wait_limits(params_vector({})) if bounded else (0.0, np.inf)
    rates = CounterRates(1, ["x"], modulus=modulus, max_rate=bound)
    ts = [0.0, 10.0, 20.0, 30.0, 3630.0]
    raw = [2.49e9, 2.49e9 + 1e7, 2.49e9 + 2e7, 5e6, 5e6 + 3600 * 1e6]
    delta, rate, problems = rates.update(np.array(ts), np.zeros(5, np.int32), np.array(raw)[:, None])
    assert rate[4, 0] == 1e6 and delta[4, 0] == 3.6e9
    assert problems["glitches"] == 0 and problems["resets_confirmed"] == 1 and rates.s_resets[0, 0] == 1
    # the same reading back at the next poll is the glitch it was (the value before was right)
    rates = CounterRates(1, ["x"], modulus=modulus, max_rate=bound)
    ts[4] = 40.0
    raw[4] = 2.49e9 + 4e7
    delta, _, problems = rates.update(np.array(ts), np.zeros(5, np.int32), np.array(raw)[:, None])
    assert problems["glitches"] == 1 and rates.s_resets[0, 0] == 0 and delta[3:].sum() == 2e7


def test_a_glitch_of_a_counter_stuck_at_2_to_32_is_not_counted_saturated_again():
    top = 2.0**32 - 1
    _, delta, problems = one_counter([top, top, 7.0, top, top])
    assert problems["saturated"] == 1 and problems["glitches"] == 1
    # (stuck there, its increase is unknown, not 0; the glitch's way back from 7 adds nothing)
    np.testing.assert_array_equal(delta[1:], [np.nan, 7.0, 0.0, np.nan])


def test_a_glitch_is_reported_to_health_once_per_batch_like_other_problems():
    _, _, problems = one_counter([5.0, 5.0, 0.0, 5.0, 5.0, 0.0, 5.0])
    assert problems["glitches"] == 2
    health = PipelineHealth()
    report_problems(health, "link_errors", problems)
    assert glitch_problems(health, "link_errors") == 2


def test_a_real_reset_stays_a_reset():
    """Cleared (perfquery -R, a driver reload) and counting from there: every delta as a plain
    reset gives it, no glitch."""
    raw = [2.49e9, 2.49e9 + 1e4, 249.0, 249.0 + 1e4, 249.0 + 2e4]
    rates, delta, problems = one_counter(raw)
    assert delta[1:].tolist() == [1e4, 249.0, 1e4, 1e4]
    assert problems["resets"] == 1 and problems["glitches"] == 0
    assert rates.s_resets[0, 0] == 1


def test_back_above_but_faster_than_the_pace_allows_is_a_reset():
    """A counter at 10/s, cleared, then past its old total faster than 16x that pace: it counted
    all of it from zero, a reset. At exactly 16x the pace it is a glitch."""
    pace = 10.0
    before = 1000.0 + 2 * 10.0 * pace
    limit = before + PACE_SLACK * pace * 20.0
    _, delta, problems = one_counter([1000.0, 1100.0, before, 0.0, limit + 1.0])
    assert problems["glitches"] == 0 and delta[4] == limit + 1.0
    _, delta, problems = one_counter([1000.0, 1100.0, before, 0.0, limit])
    assert problems["glitches"] == 1 and delta[4] == limit - before


def test_only_the_reading_right_after_the_drop_decides():
    """Low twice: the second low reading grows from the first (a reset, as before), and a later
    reading back at the old total is an increase from there, not a glitch."""
    _, delta, problems = one_counter([100.0, 100.0, 0.0, 2.0, 100.0])
    assert problems["glitches"] == 0 and problems["resets"] == 1
    assert delta[1:].tolist() == [0.0, 0.0, 2.0, 98.0]


def test_a_missing_or_stale_reading_does_not_end_a_pending_drop():
    ts = [0.0, 10.0, 20.0, 30.0, 20.0, 40.0]
    raw = [100.0, 100.0, 0.0, np.nan, 100.0, 100.0]
    _, delta, problems = one_counter(raw, ts=ts)
    assert problems["stale_or_out_of_order"] == 1 and problems["glitches"] == 1
    assert delta[5] == 0.0


def test_no_pace_known_before_the_drop_is_a_reset_as_before():
    """The counter's second reading is the low one: no pace to judge the way back by."""
    _, delta, problems = one_counter([5e4, 50.0, 5e4])
    assert problems["glitches"] == 0 and delta[2] == 5e4 - 50.0


def test_a_wrap_stays_a_wrap():
    """A 32-bit counter at ~1e7/s passing the top: the next reading is far below the one before the
    wrap, never a glitch, and each delta is the true increment."""
    m = modulus_for_bits(32)
    start = m - 3e7
    true = [start + i * 1e7 for i in range(6)]
    rates, delta, problems = one_counter([x % m for x in true], ts=np.arange(6.0), modulus=m)
    assert problems["wraps"] == 1 and problems["glitches"] == 0 and problems["resets"] == 0
    assert delta[1:].tolist() == [1e7] * 5


# ---- state ------------------------------------------------------------------------------------
def test_a_pending_drop_survives_a_state_round_trip():
    raw = np.array([[100.0], [200.0], [0.0], [300.0]])
    ts, slot = np.arange(4.0), np.zeros(4, np.int32)
    a = CounterRates(1, ["x"])
    a.update(ts[:3], slot[:3], raw[:3])
    saved = a.state_dict()
    b = CounterRates(1, ["x"])
    b.load_state_dict(saved)
    delta, _, problems = b.update(ts[3:], slot[3:], raw[3:])
    assert problems["glitches"] == 1 and delta[0, 0] == 100.0
    del saved["s_drop"]  # a state saved before s_drop: none pending, a reset then an increase
    c = CounterRates(1, ["x"])
    c.load_state_dict(saved)
    delta, _, problems = c.update(ts[3:], slot[3:], raw[3:])
    assert problems["glitches"] == 0 and delta[0, 0] == 300.0


def test_a_rebound_state_has_no_drop_pending():
    """A detector that puts its own saved s_state in place (it does not save s_drop) never judges
    a reading by a drop kept for another state."""
    a = CounterRates(1, ["x"])
    a.update(np.arange(3.0), np.zeros(3, np.int32), np.array([[100.0], [200.0], [0.0]]))
    b = CounterRates(1, ["x"])
    b.bind(a.s_state.copy(), a.s_resets.copy(), a.s_rate.copy())
    a.s_state = a.s_state.copy()
    for rates in (a, b):
        delta, _, problems = rates.update(np.array([3.0]), np.zeros(1, np.int32), np.array([[300.0]]))
        assert problems["glitches"] == 0 and delta[0, 0] == 300.0
    with pytest.raises(ValueError, match="s_drop"):
        b.bind(b.s_state, b.s_resets, b.s_rate, np.full((1, 1, 2), np.nan))


# ---- the kernel against the plain reference (test_counters), and a real counter with one bad reading
# few distinct levels, so readings go down and come back often
values_st = st.one_of(
    st.sampled_from([0.0, 3.0, 50.0, 100.0, 5e4, 2.0**31, 2.0**32 - 1, np.nan, np.inf, -1.0]),
    st.floats(0, 2.0**32, allow_nan=False),
)


@pytest.mark.kernel
@settings(max_examples=80, deadline=None)
@given(n_rows=st.integers(0, 40), n_slots=st.integers(1, 3), data=st.data())
def test_kernel_matches_reference_with_glitches(n_rows, n_slots, data):
    k = 3
    slot = np.array(data.draw(st.lists(st.integers(-1, n_slots), min_size=n_rows, max_size=n_rows)), np.int32)
    # mostly forward in time (a pace builds up, drops get a next reading), sometimes back or NaN
    steps = data.draw(st.lists(st.one_of(st.floats(0, 10, allow_nan=False), st.just(-1.0), st.just(np.nan)),
                               min_size=n_rows, max_size=n_rows))
    ts = np.cumsum(np.nan_to_num(steps, nan=0.0)) + np.where(np.isnan(steps), np.nan, 0.0)
    values = np.array(data.draw(st.lists(st.lists(values_st, min_size=k, max_size=k),
                                         min_size=n_rows, max_size=n_rows)), dtype=np.float64).reshape(n_rows, k)
    modulus = [modulus_for_bits(32), 0.0, modulus_for_bits(64)]
    max_rate = [np.inf, np.inf, 1e6]
    # streamed in two parts: the pending drop carries over
    _, both, _ = assert_matches_reference(
        lambda: CounterRates(n_slots, ["a", "b", "c"], modulus=modulus, max_rate=max_rate), ts, slot, values,
        data.draw(st.integers(0, n_rows)))
    assert not np.any(both[np.isfinite(both)] < 0)


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(
    increments=st.lists(st.integers(1000, 4000), min_size=3, max_size=40),
    start=st.integers(10**6, 10**9),
    data=st.data(),
)
def test_a_real_counter_with_one_bad_reading_counts_what_happened(increments, start, data):
    """A counter that never wraps, moving within 4x of its pace, with one reading replaced by a
    lower value: the deltas add up to the true increase, plus what the low reading exceeds the
    two intervals around it by; one glitch, no reset left."""
    true = np.cumsum([start, *increments]).astype(np.float64)
    bad = data.draw(st.integers(2, len(true) - 2))  # a pace is known before it, a reading follows it
    low = float(data.draw(st.integers(0, int(true[bad - 1]) - 1)))
    raw = true.copy()
    raw[bad] = low
    rates, delta, problems = one_counter(raw, ts=np.arange(len(raw), dtype=np.float64))
    around = true[bad + 1] - true[bad - 1]
    assert problems["glitches"] == 1 and rates.s_resets[0, 0] == 0
    assert np.nansum(delta) == true[-1] - true[0] - around + max(around, low)


# ---- a glitch that fits the wrap rule (h52) -------------------------------------------------------
M32 = modulus_for_bits(32)


def test_one_low_reading_near_the_top_of_a_32_bit_counter_is_a_glitch_not_a_wrap():
    """xmit_wait at 1000 ticks/s, 60000 under 2**32, read as 0 once: that fits a wrap (60000 <= 16 x
    the pace over 10 s), and the next, correct reading came out +4.29e9. Back near the old value,
    the low reading was a glitch: what the wrap counted (60000) stands for the 20000 that
    happened, nothing more; a wrap is no reset, so there is none to take back."""
    raw = [M32 - 1e5, M32 - 9e4, M32 - 8e4, M32 - 7e4, M32 - 6e4, 0.0, M32 - 4e4, M32 - 3e4]
    rates, delta, problems = one_counter(raw, modulus=M32)
    assert delta[1:].tolist() == [1e4, 1e4, 1e4, 1e4, 6e4, 0.0, 1e4]
    assert problems["glitches"] == 1 and problems["wraps"] == 1 and problems["resets"] == 0
    assert rates.s_resets[0, 0] == 0
    assert rates.s_rate[0, 0] == 1000.0  # the pace from before, over both intervals


def test_a_32_bit_counter_stuck_at_its_top_read_low_once_is_a_glitch_not_a_wrap():
    """Just stuck at 2**32-1 (its pace not yet decayed), read as 7 once: a wrap of 8 by the rule,
    then the way back up +2**32-8 and 'saturated' a second time. A counter stopped at 2**32-1 is
    cleared, never wrapped: the 7 is read as a reset of 7 (r110), then a glitch."""
    top = M32 - 1
    raw = [top - 3e4, top - 2e4, top - 1e4, top, top, 7.0, top, top]
    rates, delta, problems = one_counter(raw, modulus=M32)
    # (stuck at the top, its increase is unknown: NaN, not 0)
    np.testing.assert_array_equal(delta[1:], [1e4, 1e4, 1e4, np.nan, 7.0, 0.0, np.nan])
    assert problems["glitches"] == 1 and problems["saturated"] == 1 and problems["wraps"] == 0
    assert rates.s_resets[0, 0] == 0 and problems["resets_confirmed"] == 0


def test_a_wrap_then_on_from_the_low_value_stays_a_wrap_whatever_comes_next():
    """After a true wrap the counter goes on from the low value: an increase, or a clear (a reset
    from there), never a glitch."""
    raw = [M32 - 3e4, M32 - 2e4, M32 - 1e4, 5e3, 1.5e4, 2.5e4]
    _, delta, problems = one_counter(raw, modulus=M32)
    assert delta[1:].tolist() == [1e4, 1e4, 1.5e4, 1e4, 1e4]
    assert problems["wraps"] == 1 and problems["glitches"] == 0
    _, delta, problems = one_counter(raw[:4] + [100.0, 1100.0], modulus=M32)
    assert delta[4:].tolist() == [100.0, 1000.0]
    assert problems["wraps"] == 1 and problems["resets"] == 1 and problems["glitches"] == 0


def test_one_low_xmit_wait_reading_near_the_top_of_32_bits_is_no_congestion():
    """CongestionDetector(counter_bits=32), a healthy port 60000 ticks under 2**32 read as 0 once.
    Before: congestion at 55 % of the time on the reading after it."""
    health = PipelineHealth()
    det = CongestionDetector(one_link_topology(), health=health, counter_bits=32)
    ts = np.arange(10) * 10.0
    wait = M32 - 1e5 + 1000.0 * ts
    wait[5] = 0.0
    found = feed(det, ts, xmit_wait=wait, link_state=[4.0] * 10, link_rate=[400e9] * 10)
    assert found == []
    assert glitch_problems(health, "congestion") == 1


@pytest.mark.kernel
@settings(max_examples=80, deadline=None)
@given(increments=st.lists(st.integers(1000, 4000), min_size=4, max_size=30), under_top=st.integers(1, 30000),
       data=st.data())
def test_a_32_bit_counter_near_its_top_with_one_bad_reading_counts_what_happened(increments, under_top, data):
    """A 32-bit counter ending ``under_top`` below 2**32 (never wrapping), one of its last readings
    replaced by a lower value, often a small one (then it fits the wrap rule): one glitch, no reset
    left, never more counted than what the low reading was counted as beyond the true increase;
    the kernel and the reference agree."""
    true = np.cumsum([M32 - under_top - sum(increments), *increments]).astype(np.float64)
    bad = data.draw(st.integers(max(2, len(true) - 6), len(true) - 2))  # within ~16 intervals of the top
    low = float(data.draw(st.one_of(st.integers(0, 20000), st.integers(0, int(true[bad - 1]) - 1))))
    low = min(low, true[bad - 1] - 1)
    raw = true.copy()
    raw[bad] = low
    ts = np.arange(len(raw), dtype=np.float64)
    rates, delta, problems = one_counter(raw, ts=ts, modulus=M32)
    around = true[bad + 1] - true[bad - 1]
    assert problems["glitches"] == 1 and rates.s_resets[0, 0] == 0
    # the low reading: a reset of itself, or a wrap from before
    assert delta[bad] == (low if problems["wraps"] == 0 else (M32 - true[bad - 1]) + low)
    assert np.nansum(delta) == true[-1] - true[0] - around + max(around, delta[bad])
    ref_d, _, ref_p, ref_resets = naive_rates(ts, np.zeros(len(raw), np.int32), raw[:, None], [M32], [np.inf], 1)
    np.testing.assert_array_equal(delta, ref_d[:, 0])
    assert ref_p == problems and ref_resets[0, 0] == 0


def test_a_drop_saved_before_wraps_kept_theirs_loads_as_a_resets_drop():
    """A CounterRates state whose s_drop has 3 columns (value, time, pace: every pending drop was
    a reset's then) loads, and the reading after it is judged as before."""
    raw = np.array([[100.0], [200.0], [0.0], [300.0]])
    ts, slot = np.arange(4.0), np.zeros(4, np.int32)
    a = CounterRates(1, ["x"])
    a.update(ts[:3], slot[:3], raw[:3])
    saved = a.state_dict()
    saved["s_drop"] = saved["s_drop"][:, :, :3]
    b = CounterRates(1, ["x"])
    b.load_state_dict(saved)
    delta, _, problems = b.update(ts[3:], slot[3:], raw[3:])
    assert problems["glitches"] == 1 and delta[0, 0] == 100.0 and b.s_resets[0, 0] == 0


# ---- a glitch across a detector's checkpoint (h52) ------------------------------------------------
def _ramp(start: float, pace: float, low: float | None = 0.0) -> np.ndarray:
    """A counter polled 12 times, every 10 s, at ``pace``; read as ``low`` at poll 5."""
    raw = start + pace * 10.0 * np.arange(12)
    if low is not None:
        raw[5] = low
    return raw


def _optic_topology() -> Topology:
    return Topology.from_dict({
        "rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
        "nodes": [{"name": "n0", "rack": "k", "gpus": 1}], "switches": [{"name": "leaf0"}],
        "links": [{"name": "n0/gpu0~leaf0", "a": "n0/gpu0", "b": "leaf0"}],
    })


STATIC = np.full(12, 5e4)
STATIC[5] = 50.0
DOWNED = np.full(12, 3.0)
DOWNED[5] = 0.0
UP = [4.0] * 12
# (a fresh detector, the kind of its frames, one entity's columns per poll): each has one low reading at poll 5
CHECKPOINT_CASES = {
    "link_errors, symbol_error truncated": (lambda: LinkErrorsDetector(one_link_topology()), "link",
                                            {"symbol_error": STATIC, "link_state": UP}),
    "link_errors, link_downed read 0": (lambda: LinkErrorsDetector(one_link_topology()), "link",
                                        {"link_downed": DOWNED, "link_state": UP}),
    "congestion, xmit_wait truncated": (lambda: CongestionDetector(one_link_topology()), "link",
                                        {"xmit_wait": _ramp(2.49e9, 1000.0, low=249.0), "link_state": UP,
                                         "link_rate": [400e9] * 12}),
    "congestion, 32-bit xmit_wait near the top read 0": (
        lambda: CongestionDetector(one_link_topology(), counter_bits=32), "link",
        {"xmit_wait": _ramp(M32 - 1e5, 1000.0), "link_state": UP, "link_rate": [400e9] * 12}),
    "optics, corrected bits read 0": (lambda: OpticsDetector(_optic_topology()), "optic",
                                      {"rx_bits": _ramp(1e12, 5e10, low=None),
                                       "rx_corrected_bits": _ramp(5e8, 1e4)}),
}


def _run_recording(det, kind: str, columns: dict, polls: range, monkeypatch) -> tuple[list, list[np.ndarray]]:
    """Feed one entity's ``polls``, one frame each: the findings, and the counter deltas the detector got."""
    deltas: list[np.ndarray] = []
    update = det.counters.update

    def recorded(ts, slot, values):
        out = update(ts, slot, values)
        deltas.append(out[0].copy())
        return out

    monkeypatch.setattr(det.counters, "update", recorded)
    found = []
    for i in polls:
        found += det.update(Frame(kind, np.array([10.0 * i]), np.zeros(1, np.int32),
                                  {k: np.asarray(v[i:i + 1], dtype=np.float64) for k, v in columns.items()}))
    return found, deltas


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_a_glitch_across_a_checkpoint_reads_as_without_one(case, monkeypatch):
    """Saved and restored at any poll, around the low reading too (low, save, load, back at
    pace): the same counter deltas and the same findings as a detector that never stopped.
    Before, restored after the low reading, the return read as the counter's whole total
    ("fatal: +3 link downs", congestion); restored right before it, with no pace known, too."""
    make, kind, columns = CHECKPOINT_CASES[case]
    n = len(next(iter(columns.values())))
    never_stopped = make()
    found, deltas = _run_recording(never_stopped, kind, columns, range(n), monkeypatch)
    assert found == [] or kind == "optic"  # (one low reading is no finding)
    for cut in range(1, n):
        before = make()
        found_before, deltas_before = _run_recording(before, kind, columns, range(cut), monkeypatch)
        restored = make()
        restored.load_state_dict(before.state_dict())
        found_after, deltas_after = _run_recording(restored, kind, columns, range(cut, n), monkeypatch)
        np.testing.assert_array_equal(np.vstack(deltas_before + deltas_after), np.vstack(deltas), err_msg=f"cut {cut}")
        assert found_before + found_after == found, f"cut {cut}"
        np.testing.assert_array_equal(restored.counters.s_resets, never_stopped.counters.s_resets)


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_a_checkpoint_saved_before_the_drop_was_kept_loads_with_none_pending(case, monkeypatch):
    """A checkpoint without s_counter_drop (and, for the detectors that did not keep it, without
    the pace s_counter_rate) loads: no drop pending, no pace known; the return after the low
    reading is then an increase from it, as it was read before."""
    make, kind, columns = CHECKPOINT_CASES[case]
    n = len(next(iter(columns.values())))
    before = make()
    _run_recording(before, kind, columns, range(6), monkeypatch)  # the low reading is the last one
    old = before.state_dict()
    assert np.isfinite(old["s_counter_drop"][0]).any()  # a drop is pending
    del old["s_counter_drop"], old["s_counter_rate"]
    restored = make()
    restored.load_state_dict(old)
    state = restored.state_dict()
    assert np.isnan(state["s_counter_drop"]).all() and np.isnan(state["s_counter_rate"]).all()
    _, deltas = _run_recording(restored, kind, columns, range(6, n), monkeypatch)
    low = {name: values[5] for name, values in columns.items()}
    col = [name for name in low if name in restored.counters.names and low[name] < columns[name][4]][0]
    j = restored.counters.names.index(col)
    assert deltas[0][0, j] == columns[col][6] - columns[col][5]  # an increase from the low value
