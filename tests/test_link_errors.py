"""Link error thresholds (from FACTS) and flap counting."""

from __future__ import annotations

import doctest
import math
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock import facts
from foreshock.detectors import link_errors
from foreshock.detectors.link_errors import (BIN_S, COUNTERS, FLAP, HOUR_BINS, INCREASE, N_RATE_RULES, PER_HOUR,
                                             PER_SECOND, RATE_DROP, RULES, STATE, LinkErrorsDetector,
                                             _link_error_kernel)
from foreshock.frames import Frame
from foreshock.topology import Topology


def one_link_topology(n: int = 1) -> Topology:
    return Topology.from_dict({
        "rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
        "nodes": [{"name": "n0", "rack": "k", "gpus": n}], "switches": [{"name": "leaf0"}],
        "links": [{"name": f"n0/gpu{i}~leaf0", "a": f"n0/gpu{i}", "b": "leaf0"} for i in range(n)],
    })


def feed(det, ts, **columns):
    """Feed one link's samples one frame per sample; return all findings."""
    found = []
    for i, t in enumerate(ts):
        cols = {k: [v[i]] for k, v in columns.items()}
        found += det.update(Frame("link", [float(t)], [0], cols))
    return found


def fields(found):
    return [f.field for f in found]


# ---- the thresholds come from FACTS ---------------------------------------------------------
def test_rules_use_the_facts_thresholds():
    table = {r.name: r.threshold for r in RULES}
    assert table["symbol_error"] == facts.SYMBOL_ERRORS_FATAL_PER_HOUR == 120
    assert table["symbol_error_rate"] == facts.SYMBOL_ERRORS_WARN_PER_S == 10
    assert table["link_error_recovery"] * 60 == facts.LINK_ERROR_RECOVERY_WARN_PER_MIN == 5
    assert table["rcv_errors"] == facts.RCV_ERRORS_WARN_PER_S == 10
    assert table["xmit_discards"] == facts.XMIT_DISCARDS_WARN_PER_S == 100
    assert table["link_flap"] == facts.FLAP_CYCLES == 3


@pytest.mark.parametrize("field", ["link_downed", "buffer_overrun_errors", "link_integrity_errors"])
def test_any_increase_is_fatal(field):
    det = LinkErrorsDetector(one_link_topology())
    found = feed(det, [0, 60, 120, 180], **{field: [7, 7, 8, 8]})
    assert fields(found)[:1] == [field]
    assert found[0].ts == 120 and "fatal" in found[0].reason and found[0].score == 1.0


def test_symbol_errors_120_per_hour_is_the_line():
    # 120 errors within the hour: not over the line
    det = LinkErrorsDetector(one_link_topology())
    assert not [f for f in feed(det, [0, 600, 1200], symbol_error=[0, 60, 120]) if "fatal" in f.reason]
    # 121: fatal
    det = LinkErrorsDetector(one_link_topology())
    found = feed(det, [0, 600, 1200], symbol_error=[0, 60, 121])
    fatal = [f for f in found if f.field == "symbol_error" and "fatal" in f.reason]
    assert len(fatal) == 1 and fatal[0].ts == 1200 and "121" in fatal[0].reason


def test_symbol_errors_leave_the_window_after_an_hour():
    det = LinkErrorsDetector(one_link_topology())
    ts = [0, 300, 600, 4500, 4800]
    found = feed(det, ts, symbol_error=[0, 200, 200, 201, 202])  # 200 at t=300, then 1 each
    fatal = [f.ts for f in found if f.field == "symbol_error" and "fatal" in f.reason]
    assert fatal == [300, 600]  # the refresh (60 s) repeats it at 600; at 4500 it has left the hour


def test_errors_counted_through_an_agent_outage_are_spread_over_it():
    """A link at 30 symbol errors an hour (well under the 120 line); its agent is down for 6 hours
    while the port keeps counting. The 180 errors the counter gained came over 6 hours: until
    2026-12-01 all of them landed in the trailing hour and the link was "fatal" for an hour."""
    det = LinkErrorsDetector(one_link_topology())
    ts = list(range(0, 7200, 60)) + list(range(7200 + 6 * 3600, 7200 + 6 * 3600 + 3600, 60))
    errors = [30.0 * t / 3600 for t in ts]
    assert not [f for f in feed(det, ts, symbol_error=errors) if f.field == "symbol_error" and "fatal" in f.reason]
    # ... while the same 180 within a minute, sampled as usual, is fatal at once
    det = LinkErrorsDetector(one_link_topology())
    found = feed(det, [0, 60, 120], symbol_error=[0.0, 0.5, 180.5])
    assert [f.ts for f in found if f.field == "symbol_error" and "fatal" in f.reason] == [120]


@pytest.mark.parametrize("field,rule_rate,below,above", [
    ("symbol_error", "symbol_error_rate", 9.0, 11.0),
    ("rcv_errors", "rcv_errors", 9.0, 11.0),
    ("xmit_discards", "xmit_discards", 99.0, 101.0),
    ("link_error_recovery", "link_error_recovery", 4.0 / 60, 6.0 / 60),
])
def test_warning_rates(field, rule_rate, below, above):
    rule = [r for r in RULES if r.name == rule_rate][0]
    dt = max(10.0, rule.window_s)  # a rate is taken over at least the unit its rule is stated per
    for rate, expect in ((below, False), (above, True)):
        det = LinkErrorsDetector(one_link_topology())
        values = [0.0, rate * dt]
        found = [f for f in feed(det, [0, dt], **{field: values})
                 if f.field == rule.anomaly_field and rule.severity in f.reason]
        assert bool(found) == expect, (field, rate)
        if expect:
            assert found[0].score == pytest.approx(above / rule.threshold)


@pytest.mark.parametrize("interval", [1.0, 10.0, 30.0, 60.0, 300.0])
def test_recoveries_per_minute_do_not_depend_on_the_poll_interval(interval):
    """NVSentinel's "link_error_recovery > 5/min". Until 2026-12-01 it was tested on each sample's
    rate: polled every second (the sysfs source's default), a single recovery in an hour read
    1/s = 60/min and warned, while polled every 30 s the same recovery passed."""
    ts = np.arange(0.0, 3600.0 + interval, interval)

    def warnings(per_min, first=0.0):
        det = LinkErrorsDetector(one_link_topology())
        recoveries = 100 + np.floor(np.maximum(ts - first, 0.0) * per_min / 60.0)
        return [f for f in feed(det, ts, link_error_recovery=recoveries) if f.field == "link_error_recovery"]

    single = 100 + (ts >= 1800)  # one recovery in the hour
    det = LinkErrorsDetector(one_link_topology())
    assert not [f for f in feed(det, ts, link_error_recovery=single) if f.field == "link_error_recovery"]
    assert not warnings(4.0)  # a steady 4/min: under the line at every poll interval
    found = warnings(6.0)  # a steady 6/min: over it at every poll interval
    assert found and found[0].ts <= 60.0 + interval and "at 6/min" in found[0].reason
    assert found[0].score == pytest.approx(6.0 / 5.0)


def test_per_second_rates_are_taken_over_at_least_a_second():
    """Sub-second polls: 4 symbol errors within one 0.25-s sample, then none for the rest of the
    second, read 16/s, over the 10/s warning, when each sample's rate was tested."""
    ts = np.arange(0.0, 10.0, 0.25)
    det = LinkErrorsDetector(one_link_topology())
    assert not feed(det, ts, symbol_error=np.where(ts >= 5.0, 4.0, 0.0))
    det = LinkErrorsDetector(one_link_topology())  # a steady 11/s is over it
    found = [f for f in feed(det, ts, symbol_error=np.floor(11.0 * ts)) if f.field == "symbol_error"]
    assert found and found[0].ts == 1.0 and "at 11/s" in found[0].reason


def test_a_held_warning_repeats_every_refresh():
    det = LinkErrorsDetector(one_link_topology(), refresh_s=60.0)
    ts = np.arange(0, 301, 10.0)
    found = feed(det, ts, rcv_errors=list(ts * 20))  # 20/s for five minutes
    times = [f.ts for f in found if f.field == "rcv_errors"]
    assert times == [10.0, 70.0, 130.0, 190.0, 250.0]


def test_flapping_needs_three_downs_within_12_hours():
    det = LinkErrorsDetector(one_link_topology())
    h = 3600.0
    found = feed(det, [0, 1 * h, 5 * h, 11 * h], link_downed=[0, 1, 2, 3])
    flaps = [f for f in found if f.field == "link_flaps"]
    assert len(flaps) == 1 and flaps[0].ts == 11 * h and "3 times in 12 h" in flaps[0].reason
    # the same downs 13 h apart at the ends: no flap
    det = LinkErrorsDetector(one_link_topology())
    found = feed(det, [0, 1 * h, 7 * h, 14 * h], link_downed=[0, 1, 2, 3])
    assert "link_flaps" not in fields(found)


def test_downs_counted_through_an_agent_outage_are_spread_over_it():
    """A link that went down once a day while its agent was out for three days: the counter
    gained 3, i.e. 3 downs in 72 h, not flapping by gpud's 3 in 12 h. Until 2026-12-01 all three
    were stamped at the first sample after the outage and a fatal ``link_flaps`` was raised."""
    h = 3600.0
    back = 60.0 + 72 * h
    det = LinkErrorsDetector(one_link_topology())
    assert fields(feed(det, [0.0, 60.0, back], link_downed=[10, 10, 13])) == ["link_downed"]  # still fatal
    # the outage's last down counts as at its end: two more within 12 h of it make three
    assert fields(feed(det, [back + 6 * h], link_downed=[14])) == ["link_downed"]
    assert fields(feed(det, [back + 8 * h], link_downed=[15])) == ["link_downed", "link_flaps"]
    # the same three downs within a 6-hour outage are a flapping link
    det = LinkErrorsDetector(one_link_topology())
    assert fields(feed(det, [0.0, 60.0, 60.0 + 6 * h], link_downed=[10, 10, 13])) == ["link_downed", "link_flaps"]


def test_flaps_from_link_state_when_the_counter_is_absent():
    det = LinkErrorsDetector(one_link_topology())
    states = [4, 1, 4, 1, 4, 2, 4]
    found = feed(det, range(0, 7 * 60, 60), link_state=states)
    assert fields(found) == ["link_state", "link_state", "link_state", "link_flaps"]


def test_a_counter_reset_is_not_an_increase():
    det = LinkErrorsDetector(one_link_topology())
    found = feed(det, [0, 60, 120], link_downed=[5, 0, 0], symbol_error=[1000, 0, 3])
    assert found == []
    assert det.counters.s_resets[0].tolist() == [1, 0, 0, 1, 0, 0, 0]


def test_a_port_back_active_at_a_lower_rate_is_a_speed_or_width_fallback():
    """An NDR port goes down and retrains at 1x (sysfs ``rate`` "100 Gb/sec (1X NDR)"): the link
    is up at a quarter of its bandwidth, its error counters clean. Before, the ``link_downed``
    increase was all that was said; the fallback itself was not. Said once per drop; a down port's
    rate, a rise back and a rate first seen after a load say nothing."""
    det = LinkErrorsDetector(one_link_topology())
    state = [4.0, 4.0, 1.0, 4.0, 4.0, 1.0, 2.0, 4.0, 4.0]
    rate = [400e9, 400e9, 10e9, 100e9, 100e9, 10e9, 10e9, 400e9, 200e9]  # down: SDR, says nothing
    found = feed(det, [30.0 * k for k in range(len(state))], link_state=state, link_rate=rate,
                 link_downed=[0, 0, 1, 1, 1, 2, 2, 2, 2])
    drops = [f for f in found if f.field == "link_rate"]
    assert [(f.ts, round(f.score, 6)) for f in drops] == [(90.0, 4.0), (240.0, 2.0)]
    assert "ACTIVE at 100 Gb/s, down from 400 Gb/s" in drops[0].reason and drops[0].reason.startswith("warning")
    assert RULES[-1].test == RATE_DROP  # last: a checkpoint's s_last_emit only lacks its column
    old = {k: v for k, v in det.state_dict().items() if k != "s_active_rate"}
    old["s_last_emit"] = old["s_last_emit"][:, :-1]
    fresh = LinkErrorsDetector(one_link_topology())
    fresh.load_state_dict(old)  # a checkpoint from before the rule: its first rate is a first
    assert np.isnan(fresh.s_active_rate).all() and fresh.s_last_emit.shape == (1, len(RULES))
    assert feed(fresh, [300.0, 330.0], link_state=[4.0, 4.0], link_rate=[200e9, 100e9])[0].field == "link_rate"


def test_a_rate_next_to_zero_scores_a_finite_fallback():
    """A corrupt rate of 1e-300 b/s (tests/test_fuzz_pipeline.py drew it) scored 400e9 / 1e-300 = inf."""
    det = LinkErrorsDetector(one_link_topology())
    found = feed(det, [0.0, 30.0], link_state=[4.0, 4.0], link_rate=[400e9, 1e-300])
    (drop,) = [f for f in found if f.field == "link_rate"]
    assert drop.score == 400e9  # against 1 b/s: the most a fallback can say


@pytest.mark.parametrize("gap", ["same timestamp", "link_downed unreadable"])
def test_a_down_the_counter_sees_is_not_counted_again_from_the_port_state(gap):
    """An IB port with ``link_downed`` goes down twice, 1 h apart. The poll that first sees it DOWN
    gives no increase (a repeated timestamp, or the counter file unreadable that poll): the
    ``link_state`` fallback counted the down, and the counter's increase at the next poll counted it
    again. Two downs read as three: "flapping", and each down reported twice."""
    det = LinkErrorsDetector(one_link_topology())
    rows, t, d = [], 0.0, 0
    for _ in range(2):
        rows += [(t, 4.0, d), (t + 30, 4.0, d)]
        t, d = t + 60, d + 1
        rows += [(t - 30, 1.0, d)] if gap == "same timestamp" else [(t, 1.0, np.nan)]
        rows += [(t + 30, 1.0, d), (t + 60, 4.0, d)]
        t += 3600
    found = feed(det, [r[0] for r in rows], link_state=[r[1] for r in rows], link_downed=[r[2] for r in rows])
    assert fields(found) == ["link_downed", "link_downed"]
    # a source without the counter still counts downs from the state
    det = LinkErrorsDetector(one_link_topology())
    found = feed(det, [r[0] for r in rows if r[0] != 30.0 or gap != "same timestamp"],
                 link_state=[r[1] for r in rows if r[0] != 30.0 or gap != "same timestamp"])
    assert fields(found) == ["link_state", "link_state"]


def test_a_down_after_one_the_counter_answered_for_is_counted_in_full():
    """A port DOWN on a poll whose ``link_downed`` was unreadable; the counter's next reading shows
    no increase, so the down is counted late from the state. That reading answered for it: the
    increase after it is a new down. Before, it was taken for the late one and swallowed (no fatal,
    not in the flap ring), and a flapping link needed a fourth down to be called one."""
    det = LinkErrorsDetector(one_link_topology())
    found = feed(det, [0, 60, 120, 180, 240, 300], link_state=[4, 4, 1, 4, 4, 4],
                 link_downed=[0, 0, np.nan, 0, 1, 2])
    assert [(f.ts, f.field) for f in found] == [(180.0, "link_state"), (240.0, "link_downed"),
                                                (300.0, "link_downed"), (300.0, "link_flaps")]
    assert det.s_downs[0].tolist() == [120.0, 240.0, 300.0]


def test_a_down_counted_while_the_counter_is_silent_is_not_counted_again_by_it():
    """The port gone (two DOWN rows, no reading): its down is counted late, before the counter has
    answered. The counter's next increase is that same down, counted once."""
    det = LinkErrorsDetector(one_link_topology())
    found = feed(det, [0, 60, 120, 180, 240, 300], link_state=[4, 4, 1, 1, 4, 4],
                 link_downed=[0, 0, np.nan, np.nan, 1, 1])
    assert [(f.ts, f.field) for f in found] == [(180.0, "link_state")]
    assert det.s_downs[0].tolist()[-1] == 120.0 and np.isnan(det.s_downs[0][:-1]).all()


# ---- the kernel against a plain-Python reference ------------------------------------------------
def naive_rules(ts, slot, delta, rate, state, refresh, flap_window, flap_cycles, n_links, link_rate=None,
                downed_raw=None, downed_last=None):
    sym_events = defaultdict(list)
    downs = defaultdict(list)
    spans: dict[tuple[int, int], list[float]] = {}  # (link, rule) -> [start, increase since]
    last_state: dict[int, float] = {}
    active_rate: dict[int, float] = {}  # the rate each port last ran at while ACTIVE
    last_read = dict(downed_last or {})  # link -> its link_downed reading last taken: no link_state fallback
    held: dict[int, tuple[float, float]] = {}  # link -> (time, state) of a down the counter has not answered
    counted: set[int] = set()  # links whose down counted from the state the counter's next reading may hold
    last_emit: dict[tuple[int, int], float] = {}
    out = []
    sym, down = COUNTERS.index("symbol_error"), COUNTERS.index("link_downed")
    for i in range(len(ts)):
        s, t = int(slot[i]), float(ts[i])
        if not 0 <= s < n_links or math.isnan(t):
            continue
        b = math.floor(t / BIN_S)
        if not math.isnan(delta[i, sym]):  # a gap's errors at their mean pace: its last hour's share
            d = delta[i, sym] if math.isnan(rate[i, sym]) else min(delta[i, sym], rate[i, sym] * 3600.0)
            sym_events[s].append((b, d))
        hour = sum(c for bb, c in sym_events[s] if b - HOUR_BINS < bb <= b)
        st_ = state[i]
        left_active = not math.isnan(st_) and last_state.get(s) == 4.0 and st_ != 4.0
        raw = math.nan if downed_raw is None else float(downed_raw[i])
        reading = 0.0 <= raw < math.inf
        d_down = float(delta[i, down])
        stuck = raw == 255.0 and not d_down > 0  # an 8-bit link_downed at its maximum: no counter this row
        if stuck:
            d_down = math.nan
        has_counter = s in last_read and not stuck
        state_down = left_active and not has_counter
        late = None  # (time, state) of a held down the counter did not see
        if not math.isnan(d_down):
            cleared = has_counter and raw < last_read[s] and d_down == raw  # read as a clear: its increase is itself
            if reading:
                last_read[s] = raw
            if s in counted:  # its increase holds the down counted from the state
                counted.discard(s)
                if d_down > 0 and not cleared:
                    d_down -= 1.0
            if s in held:  # an increase has the held down; none, or a clear, did not see it
                was = held.pop(s)
                late = was if d_down <= 0 or cleared else None
        else:
            if reading and not has_counter:
                last_read[s] = raw
            if s in held and (stuck or (not math.isnan(st_) and not reading)):  # still no reading: the port is gone
                late = held.pop(s)
                if not stuck:
                    counted.add(s)  # unanswered: the counter's next reading may hold it too
            if stuck:
                counted.discard(s)  # a stuck counter answers for nothing
        if left_active and has_counter and not reading:
            held[s] = (t, st_)
        spacing = 0.0
        if not math.isnan(d_down):
            n_down = int(min(d_down, flap_cycles))
            if d_down > 0:  # a sample's downs at their mean pace over its interval
                spacing = 1.0 / rate[i, down]
        else:
            n_down = 1 if state_down else 0
        if not math.isnan(st_):
            last_state[s] = st_
        bps = math.nan if link_rate is None else float(link_rate[i])
        was_bps = math.nan
        if st_ == 4.0 and bps > 0:
            was_bps = active_rate.get(s, math.nan)
            active_rate[s] = bps
        downs[s] += [t - j * spacing for j in range(n_down)]
        if late is not None:
            downs[s].append(late[0])
            n_down += 1
        recent = min(flap_cycles, sum(1 for x in downs[s] if t - x <= flap_window))
        for r, rule in enumerate(RULES):
            value = math.nan
            increase = d_down if rule.counter == down else delta[i, rule.counter]
            if rule.test == INCREASE and increase > 0:
                value = increase
            elif rule.test == PER_HOUR and hour > rule.threshold:
                value = hour
            elif rule.test == PER_SECOND and not math.isnan(delta[i, rule.counter]):
                # the rate over spans of at least window_s, each sample's increase in the span it closes
                d = delta[i, rule.counter]
                span = spans.setdefault((s, r), [t - d / rate[i, rule.counter] if d > 0 else t, 0.0])
                span[1] += d
                if t - span[0] >= rule.window_s:
                    span_rate = span[1] / (t - span[0])
                    spans[(s, r)] = [t, 0.0]
                    if span_rate > rule.threshold:
                        value = span_rate
            elif rule.test == FLAP and n_down > 0 and recent >= flap_cycles:
                value = float(recent)
            elif rule.test == STATE and state_down and math.isnan(d_down):
                value = st_
            elif rule.test == STATE and late is not None:
                value = late[1]
            elif rule.test == RATE_DROP and bps < was_bps:
                value = was_bps
            if math.isnan(value):
                continue
            if rule.test in (PER_HOUR, PER_SECOND):
                last = last_emit.get((s, r))
                if last is not None and t - last < refresh:
                    continue
            last_emit[(s, r)] = t
            out.append((i, r, value))
    return out


@pytest.mark.kernel
@settings(max_examples=50, deadline=None)
@given(data=st.data(), n_rows=st.integers(0, 60))
def test_rule_kernel_matches_reference(data, n_rows):
    n_links = 3
    k = len(COUNTERS)
    small = st.one_of(st.just(np.nan), st.just(0.0), st.integers(0, 150).map(float))
    slot = np.array(data.draw(st.lists(st.integers(-1, n_links), min_size=n_rows, max_size=n_rows)), np.int32)
    steps = data.draw(st.lists(st.sampled_from([0.5, 1.0, 30.0, 299.0, 3600.0, 20000.0]), min_size=n_rows,
                               max_size=n_rows))
    ts = np.cumsum(np.array(steps, dtype=np.float64)) if n_rows else np.empty(0)
    delta = np.array(data.draw(st.lists(st.lists(small, min_size=k, max_size=k), min_size=n_rows,
                                        max_size=n_rows)), dtype=np.float64).reshape(n_rows, k)
    rate = delta / np.array(steps, dtype=np.float64).reshape(-1, 1)  # hours-long steps: the gap rule
    state = np.array(data.draw(st.lists(st.sampled_from([np.nan, 4.0, 1.0, 2.0]), min_size=n_rows,
                                        max_size=n_rows)), dtype=np.float64)
    link_rate = np.array(data.draw(st.lists(st.sampled_from([np.nan, 0.0, 100e9, 200e9, 400e9]), min_size=n_rows,
                                            max_size=n_rows)), dtype=np.float64)
    det = LinkErrorsDetector(one_link_topology(n_links))
    out = np.empty((max(n_rows, 1) * len(RULES), 3))
    st_tuple = (det.s_hour_bins, det.s_hour_bin_index, det.s_downs, det.s_last_state, det.s_last_emit,
                det.s_rate_span, det.s_active_rate, det.s_state_down)
    # the raw link_downed: read where its delta is known, else sometimes (a first or stale reading)
    unread = np.array(data.draw(st.lists(st.booleans(), min_size=n_rows, max_size=n_rows)), dtype=bool)
    sentinel = np.array(data.draw(st.lists(st.booleans(), min_size=n_rows, max_size=n_rows)), dtype=bool)
    level = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 255.0]), min_size=n_rows, max_size=n_rows)))
    downed_raw = np.where(np.isnan(delta[:, COUNTERS.index("link_downed")]) & unread, np.where(sentinel, -1.0, np.nan),
                          level)  # (-1: a sentinel the counter refuses, as it does NaN; a lower level: a clear)
    downed_last = np.array(data.draw(st.lists(st.sampled_from([np.nan, 0.0, 1.0, 2.0, 255.0]), min_size=n_links,
                                              max_size=n_links)))
    read_before = {k: float(v) for k, v in enumerate(downed_last) if not np.isnan(v)}
    n = _link_error_kernel(ts, slot, delta, rate, state, link_rate, downed_raw, downed_last.copy(), det._table,
                           st_tuple, out)
    got = [(int(a), int(b), float(c)) for a, b, c in out[:n]]
    want = naive_rules(ts, slot, delta, rate, state, 60.0, facts.FLAP_WINDOW_S, facts.FLAP_CYCLES, n_links,
                       link_rate, downed_raw, read_before)
    assert got == [(a, b, float(c)) for a, b, c in want]


def test_state_round_trip_gives_identical_future_output():
    rng = np.random.default_rng(7)
    topo = one_link_topology(4)
    t = np.arange(0, 4000, 20.0)
    cols = {name: np.cumsum(rng.poisson(0.3, (len(t), 4)), axis=0).astype(float) for name in COUNTERS}
    cols["link_state"] = np.where(rng.random((len(t), 4)) < 0.05, 1.0, 4.0)

    def frames(lo, hi):
        for i in range(lo, hi):
            yield Frame("link", np.full(4, t[i]), np.arange(4), {k: v[i] for k, v in cols.items()})

    a = LinkErrorsDetector(topo)
    for f in frames(0, 100):
        a.update(f)
    b = LinkErrorsDetector(topo)
    b.load_state_dict(a.state_dict())
    out_a = [x for f in frames(100, len(t)) for x in a.update(f)]
    out_b = [x for f in frames(100, len(t)) for x in b.update(f)]
    assert out_a == out_b and len(out_a) > 5


def test_a_checkpoint_from_before_the_rate_spans_loads():
    """A state saved before ``s_rate_span`` existed loads as if no span were open; the rest of it
    (here a link that went down twice) goes on."""
    a = LinkErrorsDetector(one_link_topology())
    feed(a, [0, 60, 120], link_downed=[0, 1, 2])
    old = {k: v for k, v in a.state_dict().items() if k != "s_rate_span"}
    b = LinkErrorsDetector(one_link_topology())
    b.load_state_dict(old)
    assert b.s_rate_span.shape == (1, N_RATE_RULES, 2) and np.isnan(b.s_rate_span).all()
    assert fields(feed(b, [180], link_downed=[3])) == ["link_downed", "link_flaps"]
    with pytest.raises(ValueError, match="unexpected state key"):
        b.load_state_dict({**a.state_dict(), "s_bogus": np.zeros(1)})


def test_doctests():
    assert doctest.testmod(link_errors).failed == 0


def test_a_counter_sentinel_does_not_hide_the_downs_the_port_state_shows():
    """A ``link_downed`` of -1 (an N/A sentinel the counter refuses) counted as "this link has the
    counter": within one frame (a replay window, a Kafka bundle), the downs its port state showed
    after it counted for nothing, while frame by frame they counted. Same samples, same findings."""
    from foreshock.frames import Frame

    state = [4.0, 1.0, 4.0, 1.0, 4.0, 1.0, 4.0]
    ts = [60.0 * k for k in range(len(state))]
    per_row = fields(feed(LinkErrorsDetector(one_link_topology()), ts, link_state=state, link_downed=[-1.0] * 7))
    batched = fields(LinkErrorsDetector(one_link_topology()).update(
        Frame("link", ts, [0] * 7, {"link_state": state, "link_downed": [-1.0] * 7})))
    assert per_row == batched and "link_flaps" in batched


@pytest.mark.parametrize("climbs", [False, True])
def test_a_link_downed_saturated_at_255_leaves_the_downs_to_the_port_state(climbs):
    """A legacy 8-bit link_downed stops at 255 (streams/infiniband.py NATIVE_BITS) and never increases
    again: read as the counter's answer, every later DOWN/ACTIVE cycle of link_state went uncounted
    (no fatal, no flapping). The climb to 255 itself is still the counter's increase, counted once."""
    det = LinkErrorsDetector(one_link_topology())
    state = [4.0, 4.0, 1.0, 4.0, 1.0, 4.0, 1.0, 4.0]
    downed = [254.0, 255.0, 255.0, 255.0, 255.0, 255.0, 255.0, 255.0] if climbs else [255.0] * 8
    if climbs:
        state[1] = 1.0  # the down that took it to 255
        state[2] = 4.0
    found = feed(det, [60.0 * k for k in range(8)], link_state=state, link_downed=downed)
    downs = [(f.ts, f.field) for f in found if f.field != "link_flaps"]
    if climbs:
        assert downs == [(60.0, "link_downed"), (240.0, "link_state"), (360.0, "link_state")]
    else:
        assert downs == [(120.0, "link_state"), (240.0, "link_state"), (360.0, "link_state")]
    assert fields(found)[-1] == "link_flaps" and all("fatal" in f.reason for f in found)

