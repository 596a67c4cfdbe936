"""Counter rates: the Numba kernel against a plain-Python reference, wraps, resets, precision."""

from __future__ import annotations

import doctest
import math
from typing import Callable

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from foreshock.detectors import counters
from foreshock.detectors.counters import MIN_DT_S, PROBLEMS, CounterRates, modulus_for_bits


def naive_rates(ts, slot, values, modulus, max_rate, n_slots, together=False, bounded_by=None):
    """Reference: one (slot, counter) at a time, in plain Python, straight from the docstring.

    ``together``: a row is taken for every counter or none; ``bounded_by``: {column: the column
    whose plain rise over the same interval bounds its rise} (see ``CounterRates``)."""
    top = 2.0**32 - 1
    rows, k = values.shape
    delta = np.full((rows, k), np.nan)
    rate = np.full((rows, k), np.nan)
    last: dict[tuple[int, int], tuple[float, float]] = {}
    pace: dict[tuple[int, int], float] = {}  # recent peak rate; absent = none known
    # (value, ts, pace, read as "reset", "wrap" or "fell") before a decrease
    drop: dict[tuple[int, int], tuple[float, float, float, str]] = {}
    held: set[tuple[int, int]] = set()  # a reading at 2**32-1 waiting for the next to confirm it
    high: dict[tuple[int, int], tuple[float, float]] = {}  # (value, ts) of the last reading refused as too fast
    # a wrapping counter with a row without it since its last reading (nothing pending or held): its
    # next decrease is a reset, never a wrap (a port gone and back with its counters cleared)
    gap: set[tuple[int, int]] = set()
    resets = np.zeros((n_slots, k), dtype=np.int64)
    problems = dict.fromkeys(PROBLEMS, 0)

    def stands(pending):
        """A pending drop the next reading did not come back from: a reset or a fall counted now."""
        if pending[3] == "reset":
            problems["resets_confirmed"] += 1
        elif pending[3] == "fell":
            problems["rebased_down"] += 1

    def goes_on(v, key, t, bound):
        """Whether ``v`` goes on from the reading refused before it: higher, no faster than the
        bound; all ones only from all ones."""
        if key not in high:
            return False
        hv, ht = high[key]
        if v == top:
            return hv == top and t - ht >= MIN_DT_S
        return t - ht >= MIN_DT_S and v > hv and v - hv <= bound * (t - ht)

    for i in range(rows):
        s, t = int(slot[i]), float(ts[i])
        if not 0 <= s < n_slots or math.isnan(t):
            problems["unknown_slot"] += 1
            continue
        rebase_row = False
        fell_unknown: list[int] = []  # counters re-based on a fall a clear cannot explain
        if together:
            # the row is skipped for all when one reading is missing, invalid or refused as too fast,
            # unless it goes on from the row refused before it: then all are re-based on that row
            unusable, too_fast = False, 0
            for j in range(k):
                v = float(values[i, j])
                if math.isnan(v):
                    unusable = True
                elif v < 0 or math.isinf(v):
                    problems["invalid_value"] += 1
                    unusable = True
                elif (s, j) in last and t - last[(s, j)][1] >= MIN_DT_S:
                    lv, lt = last[(s, j)]
                    pending = drop.get((s, j))
                    # (the kernel's form: ``v <= before + bound * dt`` rounds apart from it at the bound)
                    back = pending is not None and v >= pending[0] and v - pending[0] <= max_rate[j] * (t - pending[1]) \
                        and (pending[3] == "fell" or t - lt <= 16.0 * (lt - pending[1]))  # a clear: soon after it
                    if v >= lv and v - lv > max_rate[j] * (t - lt) and not back:
                        too_fast += 1
            if unusable:
                problems["implausible_rise"] += too_fast
                continue
            if not too_fast:
                for j, b in (bounded_by or {}).items():
                    quiet = all((s, c) not in drop and (s, c) not in held for c in (j, b))
                    if quiet and (s, j) in last and (s, b) in last and last[(s, j)][1] == last[(s, b)][1] \
                            and t - last[(s, j)][1] >= MIN_DT_S:
                        rise, bound = values[i, j] - last[(s, j)][0], values[i, b] - last[(s, b)][0]
                        if 0 <= bound < rise:
                            too_fast += 1
            if too_fast:
                based = [j for j in range(k) if (s, j) in last]
                same_row = len({high[(s, j)][1] if (s, j) in high else None for j in based}) == 1
                stood = bool(based) and same_row and all(goes_on(float(values[i, j]), (s, j), t, max_rate[j])
                                                         for j in based)
                for j, b in (bounded_by or {}).items():
                    if stood and j in based and b in based and \
                            values[i, j] - high[(s, j)][0] > values[i, b] - high[(s, b)][0]:
                        stood = False
                if not stood:
                    problems["implausible_rise"] += too_fast
                    for j in based:  # kept: the next row may go on from it
                        high[(s, j)] = (float(values[i, j]), t)
                    continue
                rebase_row = True
        for j in range(k):
            v = float(values[i, j])
            if math.isnan(v):
                if modulus[j] > 0 and (s, j) in last and (s, j) not in drop and (s, j) not in held:
                    gap.add((s, j))
                continue
            if v < 0 or math.isinf(v):
                problems["invalid_value"] += 1
                continue
            if (s, j) not in last:
                problems["saturated"] += v == top
                last[(s, j)] = (v, t)
                continue
            lv, lt = last[(s, j)]
            dt = t - lt
            if dt < MIN_DT_S:
                problems["stale_or_out_of_order"] += 1
                continue
            recent = pace.get((s, j))
            bound = max_rate[j]
            pending = drop.get((s, j))
            glitch = False
            if pending is not None:
                # back where it was before the drop, no faster than the bound (or 16x the pace before it)
                back = bound if bound < math.inf else 16.0 * pending[2]
                # ... and, read as a clear (a reset or a wrap), soon after it: within 16x the interval before it
                soon = pending[3] == "fell" or dt <= 16.0 * (lt - pending[1])
                glitch = v >= pending[0] and v - pending[0] <= back * (t - pending[1]) and soon
            if rebase_row or (not glitch and v >= lv and v - lv > bound * dt):
                if rebase_row or goes_on(v, (s, j), t, bound):
                    # the refused reading before it stood: the counter is re-based on it, the jump to
                    # it not taken; what was pending is decided as a taken reading decides it
                    hv, ht = high.pop((s, j))
                    gap.discard((s, j))
                    if pending is not None:
                        del drop[(s, j)]
                        stands(pending)
                    if (s, j) in held:
                        held.discard((s, j))
                        problems["implausible_rise"] += v != top
                    problems["rebased"] += 1
                    problems["saturated"] += v == top and lv != v
                    d = v - hv
                    pace[(s, j)] = d / (t - ht)
                    if v == top and hv == top:  # stopped at the top: its increase unknown
                        d = math.nan
                    last[(s, j)] = (v, t)
                    delta[i, j] = d
                    rate[i, j] = d / (t - ht)
                else:  # faster than it can count: refused, nothing changes but the refused reading kept
                    problems["implausible_rise"] += 1
                    high[(s, j)] = (v, t)
                continue
            high.pop((s, j), None)  # taken from the last good one: the refused reading was a bad one
            if not glitch and v >= lv:
                fits_pace = recent is not None and v - lv <= 16.0 * recent * dt
                if v == top and lv != v and (s, j) not in held and not fits_pace:
                    held.add((s, j))  # all at once at the top: the next reading tells
                    gap.discard((s, j))
                    if pending is not None:  # it decides a pending drop first: not back
                        del drop[(s, j)]
                        stands(pending)
                    continue
            if (s, j) in held:
                held.discard((s, j))
                problems["implausible_rise"] += v != top
            after_gap = (s, j) in gap  # this reading is taken: the gap is behind it
            gap.discard((s, j))
            if pending is not None:
                del drop[(s, j)]  # only the reading right after a reset or a wrap decides
                if not glitch:
                    stands(pending)
            # reaching where a legacy PortCounters counter stops is counted once (a return there after
            # one bad reading is not)
            at_top = v == top and lv != v
            if glitch:
                # back where it was before the drop: the low reading was a glitch
                before, before_t, before_pace, read_as = pending
                span = dt
                if read_as == "fell" and together:  # nothing counted for the low reading: this interval's share
                    d = (v - before) * (dt / (t - before_t))
                elif read_as == "fell":  # nothing counted for it: the whole rise, its rate over the time since
                    d = v - before
                    span = t - before_t
                else:  # the low reading was counted as a wrap from before, or as a reset of itself
                    counted = (modulus[j] - before) + lv if read_as == "wrap" else lv
                    d = max(v - before - counted, 0.0)
                problems["glitches"] += 1
                if read_as == "reset":
                    resets[s, j] = max(resets[s, j] - 1, 0)
                pace[(s, j)] = max((v - before) / (t - before_t), before_pace / 2)
                last[(s, j)] = (v, t)
                delta[i, j] = d
                rate[i, j] = d / span
                continue
            problems["saturated"] += at_top
            if v >= lv:
                d = v - lv
            else:
                m = modulus[j]
                wrapped = (m - lv) + v
                # a wrap must fit the half range, the rate limit and 16x the counter's recent pace,
                # and not come from 2**32-1 (a counter stopped there is cleared)
                if m > 0 and lv <= m and lv != top and wrapped <= min(m / 2, bound * dt) \
                        and recent is not None and wrapped <= 16.0 * recent * dt and not after_gap:
                    d = wrapped
                    problems["wraps"] += 1
                    drop[(s, j)] = (lv, lt, recent, "wrap")  # a glitch near the top fits a wrap too
                elif v > bound * dt:
                    # more than a clear in the interval can have counted: the value before was wrong;
                    # re-based on this one, no increase, no pace; pending where a pace was known
                    if recent is not None:
                        drop[(s, j)] = (lv, lt, recent, "fell")
                    else:
                        problems["rebased_down"] += 1
                    pace.pop((s, j), None)
                    last[(s, j)] = (v, t)
                    fell_unknown.append(j)
                    continue
                else:
                    d = v
                    resets[s, j] += 1
                    problems["resets"] += 1
                    if recent is not None:
                        drop[(s, j)] = (lv, lt, recent, "reset")
                    else:
                        problems["resets_confirmed"] += 1
                    pace.pop((s, j), None)  # when the clear came in the interval is unknown
                    recent = math.nan
            if recent is None:  # an increase or a wrap: the pace is the faster of now and half the last
                pace[(s, j)] = d / dt
            elif not math.isnan(recent):
                pace[(s, j)] = max(d / dt, recent / 2)
            last[(s, j)] = (v, t)
            if v == top and lv == top:  # stopped at the top: what it counted since is unknown (its pace a flat one's)
                d = math.nan
            delta[i, j] = d
            rate[i, j] = d / dt
        if together and fell_unknown:  # one increase unknown: none of the row's is given
            delta[i, :] = np.nan
            rate[i, :] = np.nan
    return delta, rate, problems, resets


def assert_matches_reference(make: Callable[[], CounterRates], ts: np.ndarray, slot: np.ndarray, values: np.ndarray,
                             cut: int) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Feed ``values`` to ``make()`` up to row ``cut``, the rest to another loaded from its state (what
    is pending crosses a checkpoint), and check the kernel equals :func:`naive_rates` given the same
    counters: delta for delta, rate for rate, count for count, resets per counter. Returns the
    deltas, rates and problem counts."""
    rates = make()
    d1, r1, p1 = rates.update(ts[:cut], slot[:cut], values[:cut])
    restored = make()
    restored.load_state_dict(rates.state_dict())
    d2, r2, p2 = restored.update(ts[cut:], slot[cut:], values[cut:])
    modulus, max_rate, bounding = restored.spec.T
    bounded_by = {j: int(b) for j, b in enumerate(bounding) if b >= 0} or None
    ref_d, ref_r, ref_p, ref_resets = naive_rates(ts, slot, values, list(modulus), list(max_rate),
                                                  restored.s_state.shape[0], together=restored.together,
                                                  bounded_by=bounded_by)
    delta, rate = np.vstack([d1, d2]), np.vstack([r1, r2])
    np.testing.assert_array_equal(delta, ref_d)
    np.testing.assert_array_equal(rate, ref_r)
    assert {key: p1[key] + p2[key] for key in PROBLEMS} == ref_p
    np.testing.assert_array_equal(restored.s_resets, ref_resets)
    return delta, rate, ref_p


values_st = st.one_of(
    st.floats(0, 2.0**32, allow_nan=False),
    st.sampled_from([0.0, 2.0**32 - 1, 2.0**16 - 1, 2.0**31, np.nan, np.inf, -np.inf, -1.0, 2.0**64 - 2048.0]),
)


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(
    n_rows=st.integers(0, 40),
    n_slots=st.integers(1, 4),
    data=st.data(),
)
def test_kernel_matches_reference_on_random_input(n_rows, n_slots, data):
    k = 3
    slot = np.array(data.draw(st.lists(st.integers(-1, n_slots), min_size=n_rows, max_size=n_rows)), np.int32)
    ts = np.array(data.draw(st.lists(st.one_of(st.floats(0, 100, allow_nan=False), st.just(np.nan)),
                                     min_size=n_rows, max_size=n_rows)))
    values = np.array(data.draw(st.lists(st.lists(values_st, min_size=k, max_size=k),
                                         min_size=n_rows, max_size=n_rows)), dtype=np.float64).reshape(n_rows, k)
    modulus = [modulus_for_bits(32), 0.0, modulus_for_bits(64)]
    max_rate = [np.inf, np.inf, 1e6]
    # fed in two parts: streaming (and a checkpoint) must equal the batch reference
    _, both, _ = assert_matches_reference(
        lambda: CounterRates(n_slots, ["a", "b", "c"], modulus=modulus, max_rate=max_rate), ts, slot, values,
        data.draw(st.integers(0, n_rows)))
    # never a negative or infinite rate, whatever the input
    assert not np.any(both[np.isfinite(both)] < 0)
    assert not np.any(np.isinf(both))


# what can happen to one reading of a counter moving at its pace: the cases the re-base rule is for
EDITS = ("low", "truncated", "garbage", "garbage twice", "jump", "all ones", "missing")


@pytest.mark.kernel
@settings(max_examples=150, deadline=None)
@given(n_slots=st.integers(1, 2), together=st.booleans(), data=st.data())
def test_kernel_matches_reference_where_high_readings_stand(n_slots, together, data):
    """Two counters moving at a pace under their bounds, with readings the re-base rule judges: a
    low first reading (or a low one later: a reset, or a glitch when a pace is known), a truncated one
    (low, but more than a clear explains: a fall re-based, or a glitch), garbage far above (once, or
    the same twice), a jump the counter goes on from (it stands), all ones, a
    missing one; read alone or together (the second bounded by the first). Fed in two parts with a
    checkpoint between: the kernel equals the reference, delta for delta and count for count."""
    n_rows = data.draw(st.integers(2, 40))
    slot = np.array(data.draw(st.lists(st.integers(0, n_slots - 1), min_size=n_rows, max_size=n_rows)), np.int32)
    # mostly forward in time, now and then a stale or out-of-order row
    steps = data.draw(st.lists(st.one_of(st.floats(0.5, 10.0), st.sampled_from([0.0, -1.0])),
                               min_size=n_rows, max_size=n_rows))
    ts = np.cumsum(steps)
    pace = np.array(data.draw(st.lists(st.floats(0.0, 1e3), min_size=2, max_size=2)))
    if together:
        pace[1] = min(pace[1], pace[0])  # corrected bits are bits received
    start = np.array(data.draw(st.lists(st.floats(1e6, 1e9), min_size=2, max_size=2)))
    values = start + np.maximum(ts, 0.0)[:, None] * pace
    values[0] = data.draw(st.sampled_from([values[0], 0.0 * values[0], [0.0, values[0, 1]], [values[0, 0], 3.0]]))
    for _ in range(data.draw(st.integers(0, 4))):
        i, j = data.draw(st.integers(0, n_rows - 1)), data.draw(st.integers(0, 1))
        edit = data.draw(st.sampled_from(EDITS))
        if edit == "low":
            values[i, j] = data.draw(st.sampled_from([0.0, 50.0]))
        elif edit == "truncated":  # digits lost once: low, yet above what a clear explains
            values[i, j] = values[i, j] / data.draw(st.sampled_from([10.0, 100.0]))
        elif edit == "garbage":
            values[i, j] = data.draw(st.sampled_from([1e12, 1e15, 1e20]))
        elif edit == "garbage twice":
            values[i:i + 2, j] = data.draw(st.sampled_from([1e12, 1e20]))
        elif edit == "jump":  # the counter goes on from far above: the old baseline was the wrong one
            values[i:, j] += data.draw(st.sampled_from([1e10, 1e13]))
        elif edit == "all ones":
            values[i, j] = 2.0**32 - 1
        else:
            values[i, j] = np.nan
    modulus = data.draw(st.lists(st.sampled_from([0.0, modulus_for_bits(32), modulus_for_bits(64)]),
                                 min_size=2, max_size=2))
    max_rate = data.draw(st.lists(st.sampled_from([2e3, 1e4, 1e6, np.inf]), min_size=2, max_size=2))
    bounded_by = {"b": "a"} if together and data.draw(st.booleans()) else None
    make = lambda: CounterRates(n_slots, ["a", "b"], modulus=modulus, max_rate=max_rate,  # noqa: E731
                                together=together, bounded_by=bounded_by)
    # what is pending (a refused reading, a drop, a held one) crosses the checkpoint
    _, both, problems = assert_matches_reference(make, ts, slot, values, data.draw(st.integers(0, n_rows)))
    event(f"rebased: {problems['rebased'] > 0}, together: {together}")
    event(f"fell: {problems['rebased_down'] > 0}, glitch: {problems['glitches'] > 0}")
    assert not np.any(both[np.isfinite(both)] < 0) and not np.any(np.isinf(both))


@pytest.mark.kernel
@settings(max_examples=40, deadline=None)
@given(
    increments=st.lists(st.integers(2**26, 2**30), min_size=2, max_size=60),
    # the first second ends under the top: at 2**32 - 1 exactly, with no pace known yet, a reading is
    # held as where a legacy counter stops or all ones read once (SATURATED_AT), not taken as a count
    start=st.integers(0, 2**32 - 2**30 - 2),
    bits=st.sampled_from([32, 64]),
)
def test_true_increments_survive_wraps(increments, start, bits):
    """A real counter of ``bits`` width, sampled every second: the rates are the increments.

    Its pace varies up to 16-fold from one second to the next (2**26..2**30 a second: a
    ``port_xmit_wait`` from lightly to fully stalled), and it does not pass the top in its first
    second (no pace known yet: a decrease there is a reset, see the next test)."""
    modulus = 2**bits
    raw, acc = [start], start
    for inc in increments:
        acc += inc
        raw.append(float(acc % modulus))
    increments = [0, *increments]
    rates = CounterRates(1, ["x"], modulus=modulus_for_bits(bits))
    ts = np.arange(len(raw), dtype=np.float64)
    delta, rate, problems = rates.update(ts, np.zeros(len(raw), np.int32), np.array(raw)[:, None])
    expected = np.array(increments[1:], dtype=np.float64)
    np.testing.assert_allclose(rate[1:, 0], expected, rtol=0, atol=4096 if bits == 64 else 0)
    assert problems["resets"] == 0
    assert problems["wraps"] == sum(1 for a, b in zip(raw, raw[1:]) if b < a)


def test_a_32_bit_counter_cleared_from_above_2_to_31_is_a_reset_not_a_wrap():
    """``perfquery -R`` (or a driver reload) on a 32-bit ``port_xmit_wait`` at 3.0e9 moving 1e4
    ticks a second: the half-range rule alone read 3.0e9 -> 12 as a wrap, an increase of
    2**32 - 3.0e9 + 12 = 1,294,967,308 ticks in one second that never happened."""
    rates = CounterRates(1, ["xmit_wait"], modulus=modulus_for_bits(32))
    raw = np.array([[3.0e9 - 2e4], [3.0e9 - 1e4], [3.0e9], [12.0], [10012.0]])
    delta, _, problems = rates.update(np.arange(5.0), np.zeros(5, np.int32), raw)
    assert delta[1:, 0].tolist() == [1e4, 1e4, 12.0, 1e4]
    assert problems["resets"] == 1 and problems["wraps"] == 0
    assert rates.s_resets[0, 0] == 1


def test_a_wrap_needs_a_known_pace():
    """The second reading of a counter has no pace to judge a wrap by: a decrease there is a
    reset (its value a lower bound of the increase), never a guess of up to 2**31. Once a pace
    is known, the same kind of decrease is recovered as the wrap it is."""
    m = modulus_for_bits(32)
    rates = CounterRates(2, ["x"], modulus=m)
    ts = np.array([0.0, 0.0, 1.0, 1.0, 2.0])
    slot = np.array([0, 1, 0, 1, 1], np.int32)
    raw = np.array([[m - 100.0], [m - 300.0], [50.0], [m - 200.0], [50.0]])
    delta, _, problems = rates.update(ts, slot, raw)
    assert delta[2, 0] == 50.0  # slot 0: second reading, a reset
    assert delta[4, 0] == 250.0  # slot 1: 100/s known, 200 + 50 through the top is a wrap
    assert problems["resets"] == 1 and problems["wraps"] == 1


def test_a_burst_within_16_times_the_recent_peak_still_wraps():
    m = modulus_for_bits(32)
    rates = CounterRates(1, ["x"], modulus=m)
    # 1e7/s, then idle two seconds (the peak halves: 5e6, 2.5e6), then 3e7 passing the top
    start = m - 1e7 - 2e7
    raw = np.array([[start], [start + 1e7], [start + 1e7], [start + 1e7], [(start + 4e7) - m]])
    delta, _, problems = rates.update(np.arange(5.0), np.zeros(5, np.int32), raw)
    assert delta[4, 0] == 3e7 and problems["wraps"] == 1
    # 5e7 after the peak has halved to 2.5e6: more than 16x the pace (4e7), read as a reset
    raw[4, 0] = (start + 6e7) - m
    rates = CounterRates(1, ["x"], modulus=m)
    delta, _, problems = rates.update(np.arange(5.0), np.zeros(5, np.int32), raw)
    assert delta[4, 0] == raw[4, 0] and problems["resets"] == 1


def test_reset_is_counted_never_negative_or_huge():
    rates = CounterRates(2, ["rx"], modulus=modulus_for_bits(64))
    ts = np.array([0.0, 0.0, 10.0, 10.0, 20.0, 20.0])
    slot = np.array([0, 1, 0, 1, 0, 1], np.int32)
    raw = np.array([[2.49e9], [5e6], [2.49e9 + 100.0], [5e6 + 10.0], [40.0], [5e6 + 20.0]])
    delta, rate, problems = rates.update(ts, slot, raw)
    assert rate[4, 0] == 4.0  # counter restarted at 0 and counted 40 in 10 s
    assert delta[4, 0] == 40.0
    assert problems["resets"] == 1 and problems["wraps"] == 0
    assert rates.s_resets.tolist() == [[1], [0]]


def test_32_bit_data_counter_in_bytes_wraps_at_4_times_2_to_32():
    """port_xmit_data counts 4-byte words; the field table scales it to bytes."""
    modulus = modulus_for_bits(32, 4.0)
    assert modulus == 4.0 * 2**32
    rates = CounterRates(1, ["tx_data"], modulus=modulus, max_rate=400e9 / 8)
    before = modulus - 4e9
    # 4e9 bytes a second, then 5e9 bytes in one second, wrapped
    raw = np.array([[before - 4e9], [before], [before + 4e9 - modulus + 1e9]])
    _, rate, problems = rates.update(np.array([-1.0, 0.0, 1.0]), np.zeros(3, np.int32), raw)
    assert rate[2, 0] == 5e9 and problems["wraps"] == 1
    # the same decrease over 0.01 s would need 500 GB/s as a wrap, and 100 GB/s as a clear (1e9
    # bytes since it): both more than the line rate, so one of the two readings is wrong. Nothing is
    # taken for it, and the next tells which: back above the value before (the low one was bad: a
    # glitch, the whole rise since before it), or going on from the low one
    ts = np.array([-1.0, 0.0, 0.01, 0.5])
    for after, read_as, last_delta in [(before + 2e9, "glitches", 2e9), (3e9, "rebased_down", 2e9)]:
        rates = CounterRates(1, ["tx_data"], modulus=modulus, max_rate=400e9 / 8)
        delta, rate, problems = rates.update(ts, np.zeros(4, np.int32), np.vstack([raw, [[after]]]))
        assert {name: n for name, n in problems.items() if n} == {read_as: 1}
        assert np.isnan(delta[2, 0]) and delta[3, 0] == last_delta
    # down to 1e8 bytes instead (10 GB/s since a clear): a reset
    raw[2, 0] = 1e8
    rates = CounterRates(1, ["tx_data"], modulus=modulus, max_rate=400e9 / 8)
    _, rate, problems = rates.update(np.array([-1.0, 0.0, 0.01]), np.zeros(3, np.int32), raw)
    assert problems["resets"] == 1 and problems["rebased_down"] == 0 and rate[2, 0] == 1e8 / 0.01


def test_float64_precision_near_2_to_64():
    """Deltas of 64-bit counters above 2**53 are exact to one float64 spacing (4096 near 2**64)."""
    m = modulus_for_bits(64)
    last = m - 3 * 4096.0  # representable exactly
    raw = np.array([[last - 20480.0], [last], [8192.0]])  # then wrapped: 3 * 4096 + 8192 = 20480 counts
    rates = CounterRates(1, ["c"], modulus=m)
    _, rate, problems = rates.update(np.array([-1.0, 0.0, 1.0]), np.zeros(3, np.int32), raw)
    assert problems["wraps"] == 1
    assert rate[2, 0] == 20480.0


def test_a_counter_stuck_at_its_portcounters_maximum_is_counted_once():
    """sysfs ``port_xmit_wait`` (32-bit PortCounters) stops at 2**32-1: a healthy NDR port's reads
    ~2.5e9. Once there, every rate from it read 0 — a congested port looked idle, its congestion
    "cleared" — and nothing said so: it is unknown (NaN) now, and counted. Counted once when it gets there (or at a first sample already there), not at every poll
    after; a clear and a new climb count again. 65535 is not judged: a slow 64-bit counter sits
    there on its way up (the simulator's ``np_cnp_sent`` does)."""
    from foreshock.health import PipelineHealth

    from foreshock.detectors.counters import report_problems

    top32, top16 = 2.0**32 - 1, 2.0**16 - 1
    rates = CounterRates(1, ["xmit_wait", "symbol_error"])
    # the clear's next reading climbs from it (straight back at the top would be one bad reading)
    raw = np.array([[4.2e9, top16], [top32, top16], [top32, top16], [top32, top16], [5.0, 3.0], [2e9, 6.0],
                    [top32, 9.0]])
    _, rate, problems = rates.update(np.arange(7.0), np.zeros(7, np.int32), raw)
    assert problems["saturated"] == 2  # xmit_wait reaching it twice; symbol_error at 65535 is not judged
    # the first climb, with no pace known, is held a poll (it could be all ones read once) and taken
    # when the next reading is still there; then its rate is unknown, not 0 (it stopped counting
    # where it can be read, not counting); 65535 to 65535 is a plain 0
    assert np.isnan(rate[1, 0]) and rate[2, 0] == (top32 - 4.2e9) / 2
    assert np.isnan(rate[3, 0]) and rate[3, 1] == 0.0
    assert rate[4, 0] == 5.0  # then cleared: a reset from it, as before
    health = PipelineHealth()
    report_problems(health, "congestion", problems)
    assert [(stage, n) for (stage, reason), n in health.problems.items() if "2**32-1" in reason] == [("congestion", 2)]


def test_empty_and_missing():
    rates = CounterRates(3, ["a", "b"])
    d, r, p = rates.update(np.empty(0), np.empty(0, np.int32), np.empty((0, 2)))
    assert d.shape == (0, 2) and r.shape == (0, 2) and sum(p.values()) == 0
    ts = np.array([0.0, 1.0, 2.0])
    vals = np.array([[1.0, np.nan], [np.nan, 5.0], [3.0, 7.0]])
    d, r, _ = rates.update(ts, np.zeros(3, np.int32), vals)
    # a NaN does not reset the memory: 1 -> (missing) -> 3 is +2 over 2 s
    assert r[2, 0] == 1.0 and r[2, 1] == 2.0
    assert np.isnan(r[1]).all()


def test_validation():
    with pytest.raises(ValueError, match="counter width"):
        modulus_for_bits(65)
    with pytest.raises(ValueError, match="modulus"):
        CounterRates(1, ["a"], modulus=-1.0)
    with pytest.raises(ValueError, match="max_rate"):
        CounterRates(1, ["a"], max_rate=0.0)
    with pytest.raises(ValueError, match="matrix"):
        CounterRates(1, ["a", "b"]).update(np.zeros(2), np.zeros(2, np.int32), np.zeros((2, 3)))


def test_state_round_trip_gives_identical_future_output():
    rng = np.random.default_rng(3)
    ts = np.repeat(np.arange(20.0), 2)
    slot = np.tile(np.array([0, 1], np.int32), 20)
    raw = np.cumsum(rng.integers(0, 2**29, (40, 1)), axis=0).astype(np.float64) % 2**32
    a = CounterRates(2, ["x"], modulus=modulus_for_bits(32))
    a.update(ts[:20], slot[:20], raw[:20])
    b = CounterRates(2, ["x"], modulus=modulus_for_bits(32))
    b.load_state_dict(a.state_dict())
    for x, y in zip(a.update(ts[20:], slot[20:], raw[20:])[:2], b.update(ts[20:], slot[20:], raw[20:])[:2]):
        np.testing.assert_array_equal(x, y)


def test_a_state_without_the_pace_loads_with_none_known():
    """A state saved before ``s_rate`` existed, or a detector's own ``s_state`` put in place
    (detectors save the counter state, not the pace): no pace known, so the next decrease is a
    reset, never a wrap judged by another slot's (or shape's) pace."""
    m = modulus_for_bits(32)
    a = CounterRates(1, ["x"], modulus=m)
    a.update(np.array([0.0, 1.0]), np.zeros(2, np.int32), np.array([[m - 300.0], [m - 200.0]]))
    saved = a.state_dict()
    assert saved["s_rate"].tolist() == [[100.0]]
    del saved["s_rate"]
    b = CounterRates(1, ["x"], modulus=m)
    b.load_state_dict(saved)
    delta, _, problems = b.update(np.array([2.0]), np.zeros(1, np.int32), np.array([[50.0]]))
    assert delta[0, 0] == 50.0 and problems["resets"] == 1
    a.s_state = a.s_state.copy()  # what a detector's load_state_dict does
    delta, _, problems = a.update(np.array([2.0]), np.zeros(1, np.int32), np.array([[50.0]]))
    assert delta[0, 0] == 50.0 and problems["resets"] == 1


def test_doctests():
    assert doctest.testmod(counters).failed == 0
