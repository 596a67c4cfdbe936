"""A PFC priority not available at a link's first poll, and a source restarted after it.

Audit finding: :class:`PfcPauseTotals` started a link's total at its first poll's values, a
priority reading all ones (not available, NaN) there left out; its first reading later was a
baseline, so its lifetime was never in the total. A restarted source (a fresh PfcPauseTotals: sources
keep no checkpoint) starts at the sum of the printed values, lifetime included, and the detectors,
which keep their counter state across the source's restart and difference the field, read the
lifetime as pause time once (20 s of lifetime in a 10-s poll: "PFC pause 200 %", congestion on a
port where nothing paused). The expected figures are arithmetic on the inputs written here.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.streams.ethtool_stats import PfcPauseTotals
from test_pfc_priorities import LINK, POLL_S, Port as PolledPort
NAN = math.nan


class Port(PolledPort):
    """A port whose congestion detector lives on across a restart of the source (:meth:`restart`):
    the downstream that differences the field."""

    def restart(self) -> None:
        """The source restarted: a fresh PfcPauseTotals, the detector's state kept."""
        self.pfc = PfcPauseTotals(self.health)


def test_a_priority_not_available_at_the_first_poll_is_in_the_total_it_starts_at() -> None:
    """The audit's sequence: priority 3 all ones at the first poll, then 20 s of lifetime; priority 4
    at 1000 s; nothing paused after. The field starts once both are read: at 20 + 1000 s."""
    port = Port()
    port.poll(0.0, {3: NAN, 4: 1000e6})
    for k in range(1, 4):
        port.poll(k * POLL_S, {3: 20e6, 4: 1000e6})
    assert math.isnan(port.field[0])  # a priority not available: no figure for the poll, as before
    # the level a source that read both at its first poll starts at (was 1000: priority 3 left out)
    assert port.field[1:] == [pytest.approx(1020.0)] * 3
    assert port.found == []  # nothing paused


def test_a_source_restarted_after_it_publishes_no_pause_time() -> None:
    port = Port()
    port.poll(0.0, {3: NAN, 4: 1000e6})
    port.poll(10.0, {3: 20e6, 4: 1000e6})
    port.poll(20.0, {3: 20e6, 4: 1000e6})
    port.restart()
    port.poll(30.0, {3: 20e6, 4: 1000e6})
    port.poll(40.0, {3: 20e6 + 5e3, 4: 1000e6})  # then 5 ms paused on priority 3: 0.05 %, under 0.2 %
    # one level across the restart: the running total and the fresh sum agree (before: 1000 -> 1020,
    # priority 3's 20-s lifetime read as 200 % of a 10-s poll paused, and congestion raised)
    assert port.field[1:] == pytest.approx([1020.0, 1020.0, 1020.0, 1020.005])
    assert port.found == []

    # restarted while the priority is still not available: nothing published until it is read
    again = Port()
    again.poll(0.0, {3: NAN, 4: 1000e6})
    again.restart()
    again.poll(10.0, {3: NAN, 4: 1000e6})
    again.poll(20.0, {3: 20e6, 4: 1000e6})
    assert math.isnan(again.field[1]) and again.field[2] == pytest.approx(1020.0)
    assert again.found == []


def test_a_priority_turned_off_and_on_after_a_first_poll_without_it_is_no_pause_time() -> None:
    """Priority 4 not available at the first poll (3 s of lifetime), read, then not printed for two
    polls (PFC off on it: not paused), then printed again; nothing paused; the source restarted."""
    port = Port()
    polls = [{3: 1000e6, 4: NAN}, {3: 1000e6, 4: 3e6}, {3: 1000e6}, {3: 1000e6}, {3: 1000e6, 4: 3e6}]
    for k, prios in enumerate(polls):
        port.poll(k * POLL_S, prios)
    port.restart()
    port.poll(len(polls) * POLL_S, {3: 1000e6, 4: 3e6})
    # one level from the start to after the restart: 1000 + 3 s, never moved (before: 1000, and the
    # restart's 1003 read as 3 s of pause in a 10-s poll, 30 %, congestion)
    assert math.isnan(port.field[0])
    assert port.field[1:] == [pytest.approx(1003.0)] * 5
    assert port.found == []
    assert ("ethtool", "PFC pause counter reset") not in port.health.problems


def test_pause_unread_when_pfc_went_off_is_counted_once_when_the_priority_is_printed_again() -> None:
    """Priority 4 paused 0.5 ms, its reading lost (all ones), then PFC off on it for two polls (not
    paused: not printed) and on again. Forgotten while off, it restarted from its reading: the 0.5 ms
    was in no increase of the running total, but in a restarted source's sum, a rise at the restart."""
    port = Port()
    polls = [{3: 1000e6, 4: 3e6}, {3: 1000e6, 4: NAN}, {3: 1000e6}, {3: 1000e6}, {3: 1000e6, 4: 3e6 + 500}]
    for k, prios in enumerate(polls):
        port.poll(k * POLL_S, prios)
    port.restart()
    port.poll(len(polls) * POLL_S, {3: 1000e6, 4: 3e6 + 500})
    assert math.isnan(port.field[1])  # priority 4 not available: no figure for the poll
    # taken when read again (from its last reading, 3 s), and the restart agrees: counted once
    assert port.field[2:] == pytest.approx([1003.0, 1003.0, 1003.0005, 1003.0005], abs=1e-9)
    assert port.found == []  # 0.5 ms in a poll is under the 0.2 % threshold


VALID, UNAVAILABLE, ABSENT = "valid", "nan", "absent"


@st.composite
def pause_polls(draw: st.DrawFn) -> tuple[list[int], list[list[str]], list[list[int]], int]:
    """(priorities, status per poll and priority, true counter per poll and priority (µs), start).

    ``start`` is the first poll with every priority printed and read: every poll before it prints
    them all, one at least not available (a restarted source can only match a running one on the
    priorities the running one has counted from its start: one first printed later starts at its
    reading there, its lifetime not pause). After it a priority may be not available or not printed
    (PFC off) at any poll. Counters only rise (no reset), over any interval: read or not."""
    prios = draw(st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True))
    n = draw(st.integers(2, 9))
    start = draw(st.integers(0, n - 1))
    status: list[list[str]] = []
    for j in range(n):
        if j < start:
            row = draw(st.lists(st.sampled_from([VALID, UNAVAILABLE]), min_size=len(prios), max_size=len(prios)))
            row[draw(st.integers(0, len(prios) - 1))] = UNAVAILABLE
        elif j == start:
            row = [VALID] * len(prios)
        else:
            row = draw(st.lists(st.sampled_from([VALID, UNAVAILABLE, ABSENT]), min_size=len(prios),
                                max_size=len(prios)))
        status.append(row)
    counters = [draw(st.lists(st.integers(0, 10**9), min_size=len(prios), max_size=len(prios)))]
    for j in range(1, n):
        rise = draw(st.lists(st.integers(0, 10**7), min_size=len(prios), max_size=len(prios)))
        counters.append([c + r for c, r in zip(counters[-1], rise)])
    return prios, status, counters, start


def readings(prios: list[int], status: list[str], counters: list[int]) -> dict[str, float]:
    """One poll's parsed stats: not printed left out, not available NaN."""
    return {f"rx_prio{p}_pause_duration": (float(c) if s == VALID else NAN)
            for p, s, c in zip(prios, status, counters) if s != ABSENT}


def published(totals: PfcPauseTotals, stats: dict[str, float]) -> float:
    """The field a poll publishes, NaN where none (no priority printed, or one not available)."""
    total = totals.update(LINK, stats)
    return NAN if total is None else total


@settings(max_examples=300, deadline=None, database=None)
@given(pause_polls())
def test_published_increases_are_the_priorities_own_and_a_restart_never_rises_over_the_running_one(
        polls: tuple[list[int], list[list[str]], list[list[int]], int]) -> None:
    prios, status, counters, start = polls
    stats = [readings(prios, s, c) for s, c in zip(status, counters)]
    running = PfcPauseTotals()
    level = [published(running, s) for s in stats]
    assert all(math.isnan(x) for x in level[:start])  # a priority not available at each poll before
    # the running one starts at the sum of its first poll with all read (not at the ones read before)
    assert level[start] == sum(counters[start])
    # each published level since the start is up by the priorities' own increases between consecutive
    # readings of each (across polls it was not available or not printed): nothing paused is added
    # (a priority printed again is not read from zero), no pause is lost
    own = 0
    last = list(counters[start])
    for j in range(start + 1, len(stats)):
        for i, s in enumerate(status[j]):
            if s == VALID:
                own += counters[j][i] - last[i]
                last[i] = counters[j][i]
        if not math.isnan(level[j]):
            assert level[j] - level[start] == own
    # a source restarted at any poll publishes no level over the running one's: the detectors, which
    # keep their state across the restart, never read a priority's lifetime as pause time
    for k in range(1, len(stats)):
        fresh = PfcPauseTotals()
        for j in range(k, len(stats)):
            again = published(fresh, stats[j])
            if not math.isnan(again) and not math.isnan(level[j]):
                assert again <= level[j], (k, j)
