"""Link error counters against the thresholds real tools use, and link flap counting.

Rules (from ``foreshock.facts``, i.e. NVSentinel and gpud; see FACTS.md "Fabric"):

- **fatal on any increase** of ``link_downed``, ``buffer_overrun_errors``
  (``excessive_buffer_overrun_errors``) or ``link_integrity_errors``
  (``local_link_integrity_errors``);
- **fatal** when ``symbol_error`` exceeds 120 in the trailing hour (IB spec, ~BER 1e-12). The
  hour is kept as twelve 5-minute bins per link, so the window is exact to 5 minutes and
  costs twelve numbers per link;
- **warnings** on rates: ``symbol_error`` > 10/s, ``link_error_recovery`` > 5/min,
  ``rcv_errors`` > 10/s, ``xmit_discards`` > 100/s. Each rate is taken over the unit its rule
  names — a second, or a minute — or over the sample's own interval when that is longer:
  samples closer than that are summed into spans of at least the unit, and the rate is the
  span's increase over its length. A per-sample rate would make the verdict depend on the poll
  interval: one recovery in an hour, polled every second, read 60/min. The spans follow each
  other (they do not slide), so a burst split across two spans is halved, as it is when it
  falls across two samples of a source polled once per unit;
- **speed or width fallback** when a port is ACTIVE at a lower ``link_rate`` than it last was
  ACTIVE at (HDR -> EDR, 4x -> 1x: a link retrained at a fraction of its bandwidth, which
  nothing else reports: it is up, and its error counters may be clean), once per drop;
- **flapping** when a link went down ≥ 3 times in 12 hours (gpud). Downs are counted from
  ``link_downed`` increments — which see a down/up shorter than a sample — and, for sources
  without that counter, from ``link_state`` leaving ACTIVE. The downs a sample's increment
  reports are spread evenly over its interval, the last at the sample: after an agent outage
  of days they are days apart, not all at the first sample after it.
- **a down the counter cannot see**: on a port that has ``link_downed``, ``link_state`` leaving
  ACTIVE on a row without a ``link_downed`` reading (its file unreadable once, or the port gone
  from sysfs: the InfiniBand source's DOWN row for a port its topology lists, FACTS.md "NIC
  lost") waits for the counter's answer. Its next reading with an increase saw the down: counted
  there, as ``link_downed``, not again. A reading with none, or a cleared counter (a port back
  from an HCA reset: nothing else tells it went down), or a second row with the state and still
  no reading (the port is gone) did not: the down is counted then, at the time it came, and
  reported as ``link_state`` (fatal, with the state the port went to). Counted on that last
  path, the counter has still not answered for it: at its next reading an increase is that same
  down (reported and counted one less); none, or a clear, ends the wait. Counted on a reading
  with none, it has answered: its next increase is a new down, counted in full.
- **a saturated counter**: a legacy 8-bit ``link_downed`` stops at 255 and never increases
  again; a row reading 255 with no increase counts as one without the counter, so ``link_state``
  leaving ACTIVE counts the down (fatal, and towards flapping), and a held down is counted then.

Every finding is an :class:`~foreshock.findings.Anomaly` on the link (score = value over
threshold, or the increase for "any increase" rules). A rule that keeps holding is repeated at
most every ``refresh_s``; "any increase" rules report every increase.

>>> import numpy as np
>>> from foreshock.frames import Frame
>>> from foreshock.topology import Topology
>>> topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
...     "nodes": [{"name": "n0", "rack": "k", "gpus": 1}], "switches": [{"name": "leaf0"}],
...     "links": [{"name": "n0/gpu0~leaf0", "a": "n0/gpu0", "b": "leaf0"}]})
>>> det = LinkErrorsDetector(topo)
>>> found = []
>>> for t, downs in enumerate([0, 0, 1, 1, 2, 3]):   # three downs within seconds: a flapping link
...     found += det.update(Frame("link", [t * 60.0], [0], {"link_downed": [downs]}))
>>> [f.field for f in found]
['link_downed', 'link_downed', 'link_downed', 'link_flaps']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np

from foreshock import facts
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.numba_config import jit
from foreshock.topology import Topology

from .base import Detector, add_columns
from .counters import (EVENTS_MAX_PER_S, LINK_DOWNS_MAX_PER_S, CounterRates, report_problems,
                       with_counter_pace_and_drop)

COUNTERS: tuple[str, ...] = (
    "link_downed", "buffer_overrun_errors", "link_integrity_errors", "symbol_error",
    "link_error_recovery", "rcv_errors", "xmit_discards",
)
_DOWNED, _OVERRUN, _INTEGRITY, _SYMBOL, _RECOVERY, _RCV, _DISCARDS = range(len(COUNTERS))

# Rule tests understood by the kernel.
INCREASE, PER_HOUR, PER_SECOND, FLAP, STATE, RATE_DROP = range(6)


@dataclass(frozen=True)
class Rule:
    """One threshold rule: ``test`` over ``counter`` against ``threshold`` (base units)."""

    name: str
    counter: int  # column in COUNTERS (-1: link_state)
    test: int
    threshold: float
    severity: str
    source: str
    field: str = ""  # the Anomaly's field when not ``name`` (the incident engine maps fields)
    window_s: float = 1.0  # PER_SECOND: the unit its threshold is stated per (a rate over less is noise)

    @property
    def anomaly_field(self) -> str:
        return self.field or self.name


RULES: tuple[Rule, ...] = (
    Rule("link_downed", _DOWNED, INCREASE, 0.0, "fatal", "NVSentinel: any increase"),
    Rule("buffer_overrun_errors", _OVERRUN, INCREASE, 0.0, "fatal", "NVSentinel: any increase"),
    Rule("link_integrity_errors", _INTEGRITY, INCREASE, 0.0, "fatal", "NVSentinel: any increase"),
    Rule("symbol_error", _SYMBOL, PER_HOUR, facts.SYMBOL_ERRORS_FATAL_PER_HOUR, "fatal",
         "IB spec via NVSentinel: > 120 per hour (~BER 1e-12)"),
    Rule("symbol_error_rate", _SYMBOL, PER_SECOND, facts.SYMBOL_ERRORS_WARN_PER_S, "warning",
         "NVSentinel: > 10/s", field="symbol_error"),
    Rule("link_error_recovery", _RECOVERY, PER_SECOND, facts.LINK_ERROR_RECOVERY_WARN_PER_MIN / 60.0,
         "warning", "NVSentinel: > 5/min", window_s=60.0),
    Rule("rcv_errors", _RCV, PER_SECOND, facts.RCV_ERRORS_WARN_PER_S, "warning", "NVSentinel: > 10/s"),
    Rule("xmit_discards", _DISCARDS, PER_SECOND, facts.XMIT_DISCARDS_WARN_PER_S, "warning",
         "NVSentinel: > 100/s"),
    Rule("link_state", -1, STATE, float(facts.IB_PORT_STATE_ACTIVE), "fatal",
         "port left ACTIVE (source without link_downed, or a down its link_downed did not read)"),
    Rule("link_flap", _DOWNED, FLAP, float(facts.FLAP_CYCLES), "fatal",
         f"gpud: >= {facts.FLAP_CYCLES} down/up cycles in {facts.FLAP_WINDOW_S / 3600:g} h", field="link_flaps"),
    # last, so a checkpoint's s_last_emit from before it only lacks its last column
    Rule("link_rate", -1, RATE_DROP, 1.0, "warning",
         "an ACTIVE port slower than it last ran: speed or width fallback (HDR -> EDR, 4x -> 1x)"),
)

DOWNED_MAX = 2.0**8 - 1
"""Where a legacy (8-bit PortCounters) ``link_downed`` stops (``streams/infiniband.py`` NATIVE_BITS): a
reading there sees no down any more, so the row counts as one without the counter."""
HOUR_BINS = 12
BIN_S = 3600.0 / HOUR_BINS
N_RATE_RULES = sum(1 for r in RULES if r.test == PER_SECOND)


@jit
def _add_down(downs: np.ndarray, s: int, x: float) -> None:
    """Put a down at ``x`` into link ``s``'s ring of its latest down times (ascending, NaN = empty,
    first); one older than every down a full ring holds is left out."""
    n_ring = downs.shape[1]
    if downs[s, 0] == downs[s, 0] and x <= downs[s, 0]:
        return
    k = 0
    while k < n_ring - 1 and (downs[s, k + 1] != downs[s, k + 1] or downs[s, k + 1] < x):
        downs[s, k] = downs[s, k + 1]
        k += 1
    downs[s, k] = x


@jit
def _link_error_kernel(ts: np.ndarray, slot: np.ndarray, delta: np.ndarray, rate: np.ndarray,
                       link_state: np.ndarray, link_rate: np.ndarray, downed_raw: np.ndarray, downed_last: np.ndarray,
                       rules: np.ndarray, state: tuple, out: np.ndarray) -> int:  # type: ignore[type-arg]
    """Apply ``rules`` (r, 6) = [counter, test, threshold, refresh_s, flap_window_s, window_s] row by row.

    ``state`` = (hour_bins (links, 12 + running total), hour_bin_index (links,) int64, downs (links, F) the
    latest down times, ascending, last_state (links,), last_emit (links, r), rate_span (links, q, 2) =
    [start, increase since] of each PER_SECOND rule's open span, in rule order, NaN start = none
    open, active_rate (links,) the port's ``link_rate`` when it was last seen ACTIVE, state_down
    (links, 3) = [time, state] of a down held for the counter to answer (NaN time = none), and 1.0
    where a down counted from the state awaits the counter's next reading). Writes (row, rule,
    value) into ``out`` and returns how many (RATE_DROP: the rate it ran at before; STATE: the
    state the port went to).

    ``downed_raw`` (rows,) the raw ``link_downed`` readings, ``downed_last`` (links,) each link's
    reading the counter last took before this frame, NaN = never read (updated here as rows read
    it). ``link_state`` leaving ACTIVE counts a down at once only on a link without the counter, or
    on a row whose counter reads :data:`DOWNED_MAX` with no increase (stuck there, it sees no down).
    On one with it, a row that read the counter (a repeated timestamp gives no increase) leaves
    the down to the counter's next increase: counted from both, two downs read as three, a
    flapping link. A row without a reading holds it (the module docstring): a down the counter
    then does not see (a port gone from sysfs, back with its counters cleared) is counted late,
    not lost; one it does see is counted once.
    """
    bins, bin_index, downs, last_state, last_emit, rate_span, active_rate, state_down = state
    flap_window = rules[0, 4]
    n_out = 0
    n_links = bins.shape[0]
    n_ring = downs.shape[1]
    for i in range(len(ts)):
        s = slot[i]
        t = ts[i]
        if s < 0 or s >= n_links or t != t:
            continue
        # trailing-hour symbol errors in 5-minute bins
        b = np.int64(np.floor(t / BIN_S))
        if b > bin_index[s]:
            for k in range(min(b - bin_index[s], HOUR_BINS)):
                bins[s, (bin_index[s] + 1 + k) % HOUR_BINS] = 0.0
            bin_index[s] = b
            hour = 0.0
            for k in range(HOUR_BINS):
                hour += bins[s, k]
            bins[s, HOUR_BINS] = hour  # the running total, recomputed when the bins roll
        d_sym = delta[i, _SYMBOL]
        r_sym = rate[i, _SYMBOL]
        if d_sym == d_sym and r_sym == r_sym and r_sym >= 0.0:
            # the increase since a sample hours ago (an agent that was down) came at its mean pace
            # over the gap: only the last hour's share is in the trailing hour. Counted whole, a
            # link at 30 errors an hour raised an hour of "fatal" after each 6-hour outage.
            d_sym = min(d_sym, r_sym * (HOUR_BINS * BIN_S))  # one product: fastmath folds it under JIT only
        if d_sym == d_sym and b == bin_index[s]:
            bins[s, b % HOUR_BINS] += d_sym
            bins[s, HOUR_BINS] += d_sym
        hour = bins[s, HOUR_BINS]
        # downs: the counter sees every down; link_state is the fallback when it is absent
        d_down = delta[i, _DOWNED]
        raw = downed_raw[i]
        reading = 0.0 <= raw < np.inf  # a reading the counter takes (a -1 sentinel is none)
        # stopped at its 8-bit maximum (its climb there still counts) it answers for no down: the row
        # is one without the counter, or a link_state DOWN/ACTIVE cycle after it was never counted
        stuck = raw == DOWNED_MAX and not d_down > 0.0
        if stuck:
            d_down = np.nan
        has_counter = downed_last[s] == downed_last[s] and not stuck
        st = link_state[i]
        left_active = st == st and last_state[s] == 4.0 and st != 4.0
        down_now = left_active and not has_counter  # the fallback: no counter to see it
        late = np.nan  # a held down the counter did not see: when it came
        late_state = np.nan
        held = state_down[s, 0]
        if d_down == d_down:  # the counter's answer
            # link_downed does not wrap: a decrease the counter read as a clear (its increase is the
            # reading itself). Not a decrease alone: after a fall re-based with no increase (a garbage
            # reading before it), ``downed_last`` still holds the garbage until the next increase
            cleared = raw < downed_last[s] and d_down == raw
            if reading:
                downed_last[s] = raw
            if state_down[s, 2] == 1.0:
                # a down counted from the state: an increase here is that down, a clear or none ends it
                state_down[s, 2] = np.nan
                if d_down > 0.0 and not cleared:
                    d_down -= 1.0
            if held == held:
                if d_down <= 0.0 or cleared:  # the counter did not see it (back from a reset, cleared)
                    late = held
                    late_state = state_down[s, 1]
                state_down[s, 0] = state_down[s, 1] = np.nan
        else:
            if reading and not has_counter:
                downed_last[s] = raw
            if held == held and (stuck or (st == st and not reading)):
                # a second row with the state and still no reading: the port is gone, not one bad read
                # (or a stuck counter, which will never see it)
                late = held
                late_state = state_down[s, 1]
                state_down[s, 0] = state_down[s, 1] = np.nan
                # the counter has not answered for it: its next reading may see it too. (One that
                # answered with no increase did not, and its next increase is a new down.)
                state_down[s, 2] = np.nan if stuck else 1.0
            elif stuck:
                state_down[s, 2] = np.nan  # a stuck counter's next increase (after a clear) is a new down
        if left_active and has_counter and not reading:
            state_down[s, 0] = t  # held for the counter's answer (a row that reads it leaves it to the counter)
            state_down[s, 1] = st
        n_down = 0
        spacing = 0.0
        if d_down == d_down:
            n_down = int(min(d_down, n_ring))
            if d_down > 0.0:
                # the downs came at their mean pace over the sample's interval (delta / rate): stamped
                # all at the sample, three downs over a 3-day agent outage read as a flapping link
                spacing = 1.0 / rate[i, _DOWNED]
        elif down_now:
            n_down = 1
        if st == st:
            last_state[s] = st
        # the rate an ACTIVE port runs at, against the rate it last ran at (a down port's rate says nothing)
        bps = link_rate[i]
        was_bps = np.nan
        if st == 4.0 and bps == bps and bps > 0.0:
            was_bps = active_rate[s]
            active_rate[s] = bps
        for j in range(n_down - 1, -1, -1):
            # spread back over its interval, a sample's downs may come before a link_state down in the ring
            _add_down(downs, s, t - j * spacing)
        if late == late:
            _add_down(downs, s, late)  # at its time: counted late, it is no later a down
            n_down += 1
        recent = 0
        for k in range(n_ring):
            if downs[s, k] == downs[s, k] and t - downs[s, k] <= flap_window:
                recent += 1
        q = -1  # this rule's span in rate_span
        for r in range(rules.shape[0]):
            col = int(rules[r, 0])
            test = int(rules[r, 1])
            threshold = rules[r, 2]
            value = np.nan
            if test == INCREASE:
                d = d_down if col == _DOWNED else delta[i, col]  # less a down counted from the state
                if d > threshold:
                    value = d
            elif test == PER_HOUR:
                if hour > threshold:
                    value = hour
            elif test == PER_SECOND:
                q += 1
                # over spans of at least the rule's unit: a second's one recovery is not 60/min
                d = delta[i, col]
                if d == d:
                    start = rate_span[s, q, 0]
                    if start != start:  # no span open: this sample's interval starts it
                        start = t - d / rate[i, col] if d > 0.0 else t
                        rate_span[s, q, 0] = start
                        rate_span[s, q, 1] = 0.0
                    rate_span[s, q, 1] += d
                    if t - start >= rules[r, 5]:
                        span_rate = rate_span[s, q, 1] / (t - start)
                        rate_span[s, q, 0] = t
                        rate_span[s, q, 1] = 0.0
                        if span_rate > threshold:
                            value = span_rate
            elif test == FLAP:
                if n_down > 0 and recent >= threshold:
                    value = float(recent)
            elif test == STATE:
                if down_now and d_down != d_down:
                    value = st
                elif late == late:
                    value = late_state
            elif test == RATE_DROP:
                if bps < was_bps * threshold:  # NaN (not ACTIVE, no rate, none before) fails
                    value = was_bps
            if value != value:
                continue
            if test != INCREASE and test != FLAP and test != STATE and test != RATE_DROP:
                last = last_emit[s, r]
                if last == last and t - last < rules[r, 3]:
                    continue
            last_emit[s, r] = t
            out[n_out, 0] = i
            out[n_out, 1] = r
            out[n_out, 2] = value
            n_out += 1
    return n_out


class LinkErrorsDetector(Detector):
    """FACTS thresholds on link error counters, and flap counting, per link."""

    slot_kinds: ClassVar[Mapping[str, str]] = {name: "link" for name in (
        "s_counter_state", "s_counter_resets", "s_counter_rate", "s_counter_drop", "s_hour_bins", "s_hour_bin_index",
        "s_downs", "s_last_state", "s_last_emit", "s_rate_span", "s_active_rate", "s_state_down")}
    name: ClassVar[str] = "link_errors"
    kinds: ClassVar[tuple[str, ...]] = ("link",)

    def __init__(self, topology: Topology, refresh_s: float = 60.0,
                 flap_cycles: int = facts.FLAP_CYCLES, flap_window_s: float = facts.FLAP_WINDOW_S,
                 health: PipelineHealth | None = None) -> None:
        super().__init__(topology)
        if refresh_s <= 0 or flap_window_s <= 0 or flap_cycles < 1:
            raise ValueError("refresh_s and flap_window_s must be > 0, flap_cycles >= 1")
        self.health = health or PipelineHealth()
        n = topology.size("link")
        self.rules = RULES
        table = np.array([[r.counter, r.test, r.threshold, refresh_s, flap_window_s, r.window_s] for r in RULES],
                         dtype=np.float64)
        table[[i for i, r in enumerate(RULES) if r.test == FLAP], 2] = float(flap_cycles)
        self._table = np.ascontiguousarray(table)
        # IB error counters saturate, never wrap (one stuck at its maximum is the sysfs source's to count);
        # each counts no faster than its physical bound: a reading above it is a bad one, not taken
        # (one garbage 1e12 was "fatal: link_downed +1e12", a flapping link and an hour of fatal symbol errors)
        bounds = [LINK_DOWNS_MAX_PER_S if name == "link_downed" else EVENTS_MAX_PER_S for name in COUNTERS]
        self.counters = CounterRates(n, COUNTERS, max_rate=bounds)
        # with the pace and the value before a low reading, which tell one bad reading from a clear:
        # kept in the checkpoint, or a low reading across a restore reads as the counter's whole
        # total of new errors (or link downs)
        self.s_counter_state, self.s_counter_resets = self.counters.s_state, self.counters.s_resets
        self.s_counter_rate, self.s_counter_drop = self.counters.s_rate, self.counters.s_drop
        self.s_hour_bins = np.zeros((n, HOUR_BINS + 1))
        self.s_hour_bin_index = np.full(n, np.iinfo(np.int64).min // 2, dtype=np.int64)
        self.s_downs = np.full((n, max(flap_cycles, 1)), np.nan)
        self.s_last_state = np.full(n, np.nan)
        self.s_last_emit = np.full((n, len(RULES)), np.nan)
        self.s_rate_span = np.full((n, N_RATE_RULES, 2), np.nan)
        self.s_active_rate = np.full(n, np.nan)
        self.s_state_down = np.full((n, 3), np.nan)  # [time, state] of a held down; 1.0: one counted awaits the counter

    def update(self, frame: Frame) -> list[Finding]:
        if len(frame) == 0:
            return []
        values = np.stack([frame.columns[c] for c in COUNTERS], axis=1)
        downed_last = self.counters.s_state[:, _DOWNED, 0].copy()  # read before (see the kernel)
        delta, rate, problems = self.counters.update(frame.ts, frame.slot, values)
        report_problems(self.health, self.name, problems)
        out = np.empty((len(frame) * len(RULES), 3))
        state = (self.s_hour_bins, self.s_hour_bin_index, self.s_downs, self.s_last_state, self.s_last_emit,
                 self.s_rate_span, self.s_active_rate, self.s_state_down)
        n = _link_error_kernel(frame.ts, frame.slot, delta, rate, frame.columns["link_state"],
                               frame.columns["link_rate"], np.ascontiguousarray(values[:, _DOWNED]), downed_last,
                               self._table, state, out)
        return [self._finding(frame, int(row), int(rule), float(value)) for row, rule, value in out[:n]]

    def _finding(self, frame: Frame, row: int, r: int, value: float) -> Anomaly:
        rule = self.rules[r]
        link = int(frame.slot[row])
        if rule.test == INCREASE:
            what, score = f"{rule.name} +{value:g}", value
        elif rule.test == PER_HOUR:
            what, score = f"{value:g} symbol errors in the last hour", value / rule.threshold
        elif rule.test == PER_SECOND:
            unit, per = (60.0, "min") if rule.window_s == 60.0 else (1.0, "s")
            what, score = f"{rule.anomaly_field} at {value * unit:.3g}/{per}", value / rule.threshold
        elif rule.test == RATE_DROP:
            now = float(frame.columns["link_rate"][row])
            # (a rate under 1 b/s is no port's: a corrupt reading of 1e-300 scored inf, which no
            # exposition can carry; the fuzz test found it)
            what, score = (f"port ACTIVE at {now / 1e9:g} Gb/s, down from {value / 1e9:g} Gb/s "
                           f"(speed or width fallback: {now / value:.0%} of its bandwidth)"), value / max(now, 1.0)
        elif rule.test == FLAP:
            window_h = self._table[r, 4] / 3600
            what, score = f"link went down {int(value)} times in {window_h:g} h (flapping)", value / rule.threshold
        else:
            what, score = f"port state {int(value)} (not ACTIVE)", 1.0
        return Anomaly(ts=float(frame.ts[row]), entity_kind="link", slot=link, field=rule.anomaly_field,
                       score=float(score),
                       detector=self.name, reason=f"{rule.severity}: {what} on {self.topology.links[link]} "
                                                  f"({rule.source})")

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state saved before ``s_rate_span`` existed, read as if no rate span were open: each
        rate rule's first span after the load starts at its next sample's interval, as on a fresh
        detector, while everything else goes on from where it was. One saved before the
        ``link_rate`` rule: no rate known yet (``s_active_rate`` NaN, the port's next ACTIVE rate
        is its first), that rule never emitted (its ``s_last_emit`` column NaN). One saved before
        ``s_state_down``: no down held or awaiting the counter (as on a fresh detector). One saved
        before the counters' pace and drops were kept: none known, none pending."""
        state = with_counter_pace_and_drop(state, "s_counter_state", "s_counter_rate", "s_counter_drop")
        if "s_last_emit" not in state:
            return state
        n = np.shape(state["s_last_emit"])[0]
        if "s_rate_span" not in state:
            state = {**state, "s_rate_span": np.full((n, N_RATE_RULES, 2), np.nan)}
        if "s_active_rate" not in state:
            state = {**state, "s_active_rate": np.full(n, np.nan)}
        if "s_state_down" not in state:
            state = {**state, "s_state_down": np.full((n, 3), np.nan)}
        return add_columns(state, "s_last_emit", len(RULES))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.counters.bind(self.s_counter_state, self.s_counter_resets, self.s_counter_rate, self.s_counter_drop)
