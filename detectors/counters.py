"""Rates from raw cumulative counters, per (entity slot, counter), with wraps and resets.

Frames carry counters raw (DESIGN.md); every detector that needs a rate — fabric counters,
PHY error counters, GPU energy — runs its columns through one :class:`CounterRates`.

How a decrease is read
----------------------
A counter that goes *down* between two samples either wrapped (a 32-bit ``port_xmit_data``
passes 2**32 in seconds at 400 Gb/s) or was reset (driver reload, ``perfquery -x -R``, a
module swap). For a counter declared with a wrap modulus ``M``::

    wrapped = (M - last) + value
    wrap   if last <= M and wrapped <= min(M / 2, max_rate * dt, PACE_SLACK * pace * dt)
              and no row came without the counter since last (:data:`GAP`)
    reset  otherwise (a re-base where value > max_rate * dt: "A fall that is not a clear")

The half-range rule is the usual one (SNMP, Prometheus exporters): a wrap that moved more than
half the range between two samples cannot be told from a reset, so it is not guessed at.
Give ``max_rate`` (e.g. the link's line rate in bytes/s) to tighten it. A counter declared
without a modulus (``0``) never wraps: every decrease is a reset (or the re-base above).

The half-range rule alone read a 32-bit counter cleared from above 2**31 (``perfquery -R``, a
driver reload) as a wrap: 3.0e9 -> 12 became an increase of 2**32 - 3.0e9 + 12 = 1.29e9 counts
that never happened (a ``port_xmit_wait`` at a few thousand ticks a second read as a port
stalled for minutes). So a wrap must also fit the counter's own pace: ``pace`` (``s_rate``) is
its recent peak rate, the fastest of its last intervals, halved at each interval after it
(``pace = max(rate, pace / 2)``), and a wrap may be up to ``PACE_SLACK`` times that pace over
the interval. With no pace known (the counter's second reading, or the first after a reset:
when the clear came is not known) a decrease is a reset (unless no clear explains it: "A fall
that is not a clear"). A reset under-counts by the part of
the interval before the clear, a wrong wrap adds up to 2**31 phantom counts; a true wrap read
as a reset (a counter idle, then suddenly ``PACE_SLACK`` times faster) loses what it counted
before passing the top in that one interval.

A reset follows Prometheus' ``rate()``: the counter restarted from zero, so the increase since
the previous sample is the new value itself — never negative, never the near-2**64 number a
naive unsigned subtraction gives. Every reset is counted per (slot, counter) in
``s_resets`` and reported back, so a detector can say "counter reset" instead of a rate.

One low reading
---------------
A reading can be low once and right again at the next poll: a driver or firmware momentarily
reporting 0, a truncated sysfs read (``249`` of ``2490000000``), a bad relay. Read as a reset,
the next, correct reading was an increase from the low value: the counter's whole total in one
interval (a ``port_xmit_wait`` of 2.49e9 as a port stalled ~32 % of the time, 50000 old symbol
errors as new ones, ``link_downed`` 3 -> 0 -> 3 as three downs). Near the top of a counter
that wraps, the low reading can fit the wrap rule instead (the value before it within
``PACE_SLACK`` intervals of the top, the low one small): read as a wrap, the next, correct
reading was an increase from the low value too, nearly the whole range (a 32-bit
``port_xmit_wait`` at ``2**32 - 6e4`` read as 0 once: +4.29e9 ticks, a port stalled half the
time). So a decrease, read as a reset or as a wrap, keeps the value before it, its time, its
pace and which of the two it was read as (``s_drop``) for the next reading, which decides::

    glitch  if  value >= before  and  value - before <= bound * (t - t_before)
                and  t - t_low <= PACE_SLACK * (t_low - t_before)   (read as a reset or a wrap)
    reset   otherwise (the counter stayed low, or grew from there: as it would have anyway)
    wrap    otherwise (it goes on from the low value: a wrap is never followed by a value back
            near the top unless the counter moved over half its range in an interval, which the
            half-range rule does not guess at either)

A glitch is counted (``glitches``, a health problem) and not a reset (its ``s_resets`` count is
taken back; a wrap's ``wraps`` stays counted, as a reset's ``resets`` does); its increase is
taken from the value before the drop, less what the low reading was already counted as (the
low value for a reset, the way round from before for a wrap), so the two intervals together
count the larger of the true increase and what the low reading counted (a truncated ``50`` of a
static ``50000`` counts 50, never 50000; a glitch read as a wrap at most ``PACE_SLACK``
intervals' worth); the pace is the one before the drop, updated with the rate over both
intervals. ``bound`` is the counter's physical bound (``max_rate``: ``xmit_wait`` at line rate,
:data:`EVENTS_MAX_PER_S`, ...) where it has one, else ``PACE_SLACK`` times its pace before the drop.
The pace alone was too tight for a bursty counter: it halves at every flat poll, so an
``xmit_wait`` read as 0 just as it resumed after three idle polls was "back" faster than 16x a
pace decayed to an eighth, read as a reset, and the next, correct reading counted its whole total
in one interval (congestion at "356 % of the time"). Only the reading right after the drop decides
(missing, invalid, refused and stale rows do not; a re-base on a refused one does, and the reset
stands, below), and only with a pace known before it (the same
rule as a wrap's). A real clear is read as a glitch only when the counter gets back above its
whole pre-clear total within one interval, which a counter whose total is many intervals' worth
cannot do: what is lost is at most that total. "One interval" is kept to its word: the reading must
come within ``PACE_SLACK`` times the interval before the low one (a poll, or a few missed). A
clear followed by a long gap (the poller away an hour) had grown back past the total over the gap,
within the bound times the whole of it: the reset was taken back as a glitch, and the hour counted
from the pre-clear total (70 % lost). Later than that the drop stands as what it was read as. (A
fall no clear explains, below, is no clear: back above the value before, however late, it was a
glitch.) A reset is reported (``resets_confirmed``, README
"Bad input": a counter going backwards) once it stands: at the reading after it, or at once when
no pace is known to judge a way back by. ``s_drop``
is tied to ``s_state`` like the pace: a detector keeps both in its checkpoint and hands them back
with :meth:`CounterRates.bind`, so a glitch across a restore reads as it does without one; one
that rebinds ``s_state`` alone starts with no drop pending (a reset, then an increase).

One high reading
----------------
The mirror of a low reading: garbage in one poll (``1e12`` for a ``link_downed`` of 1), read as an
increase, was a fatal ``link_downed +1e12``, a flapping link, "1e12 symbol errors in the last hour"
for an hour and congestion, and the fall back a reset. A counter has a physical bound
(``max_rate``): a reading further above the last one than the bound times the time since it is
not taken. It is counted (``implausible_rise``, a health problem), gives no delta, and leaves
everything as it was (the last value and its time, the pace, a pending drop): the next reading is
judged from the last good one, over the longer interval, so the bound grows with the time since and
a counter that really moved on is taken at the first reading that fits, or re-based (below).

A high reading that stands is the counter's new baseline
--------------------------------------------------------
The last good value can be the wrong one. A counter takes a reading as its baseline with no pace to
judge it by: its first reading, its second (a decrease there is a reset, or a re-base below), the first after a reset,
the first after a restore without its pace. A low one there (a 0 read as a collector starts, a
truncated read) made every true reading after it "too fast" until the bound times the time since
passed the counter's whole total: an optic's ``rx_bits`` of weeks of uptime (3e17) read 0 once at
the second poll was refused for 6.5 h at a 400G line (and, read together, the BER with it), a GPU's
``energy`` of a day for 3.9 h. So the mirror of the low-reading rule: a refused reading is kept
(``s_drop``'s last two columns: the value and its time) for the next reading, which decides::

    stood    if  refused too, and  value > high  and  value - high <= max_rate * (t - t_high)
    bad      if  taken (judged from the last good one, as before): the high reading is forgotten
    pending  otherwise (refused, and not going on from it): this reading is now the one kept

A reading that stood is the counter's new baseline: the counter is re-based on it (``rebased``, a
health problem; not a reset, nothing went backwards, and ``s_resets`` does not count it) and the
increase from it to the reading that confirmed it is taken, its rate over the time since it. The jump
to it is not taken: what the counter did between the last good reading and it is not known (the low
baseline was a glitch, or it was cleared and counted since). A re-base decides what else was pending
as a taken reading does: a reset's drop stands (``resets_confirmed``), a held ``SATURATED_AT`` not
still there was a bad reading. One garbage reading followed by readings that go on from the last
good one stays refused, as before. The same reading again does not go on from it (a garbage value
repeated by a stuck read, all ones of 64 bits while a port re-initialises, had stood, and the fall
back from it was a reset re-adding the counter's whole total); so a counter that does not move after
a low baseline stays refused, counted, until its first rise, which stands. Two garbage readings that
rise from each other within the bound still stand; the fall back is then a re-base where the true
value is above what the counter counts in an interval (below), else a reset. All
ones (``SATURATED_AT``) go on only from all ones (read twice: where a counter stops); once, it is as
often a failed read. Missing, invalid and stale readings decide nothing.

A fall that is not a clear
--------------------------
A reset's increase is the new value: all the counter counted since the clear, in the interval.
A counter with a physical bound cannot have counted more than the bound times the interval, so
a fall to a value above that is no clear: the value before it was the wrong one. A garbage
reading taken as a baseline (a first reading, which nothing judges: ``1e15`` for a GPU's
``energy`` as a collector starts) or two garbage readings that rose from each other and stood
(above) fell back to the counter's true total, which a reset took whole: a day of energy in
one second (megawatts), weeks of an optic's ``rx_bits`` in one poll. Such a fall re-bases the
counter on the lower value (``rebased_down``, a health problem; not a reset: ``s_resets`` does
not count it), no increase taken for it, no pace known after it. With a pace known, though, the
value before had been judged, and the lower reading may be the bad one (a truncated read: one
digit of a day of ``energy`` lost): as with a reset, the fall is pending (``FELL`` in ``s_drop``)
for the next reading. Back above the value before within the bound, it was a glitch: nothing
taken for the low reading, and the next reading's increase is the whole rise since the value
before, its rate over that time (every event counted once); read together with others, its
share by time of that rise instead, so that it spans its own interval as theirs do. Read as a
reset, it had been 6e6 J in a second, then 0. Otherwise the fall stands, and
``rebased_down`` is counted then. It cannot tell a small counter's garbage from a clear: a
``link_downed`` whose true total is 3 falls back from a garbage first reading to 3, within its
bound over a poll, and is read as a reset that counted 3.

Counters read together
----------------------
Counters used together (``together``: the optics' received and corrected bits, whose ratio is the
pre-FEC BER) are taken in a row for all of them or none: one missing, invalid or refused reading
leaves all at their last good values, so their increases span the same interval. Taken alone, a
refused corrected-bits reading left the next increase of received bits over one interval and its
own over two (a BER up to 2x). One counter can bound another's rise (``bounded_by``: corrected bits
are bits received): a row where it rose more over the same interval is refused the same way. A
row refused as too fast with every reading valid is the one kept, and the next row stood when every
counter with a baseline goes on from its own reading in it (a bounded counter's rise from there no
more than its bound's): all are re-based on it together, so their increases still span the same
interval (re-based alone, the bits' increase would span the time since the refused row and the
corrected bits' the time since their last good one). A row where one of them falls to more than a
clear can explain (re-based, its increase unknown: "A fall that is not a clear") gives no increase
for any of them, and all go on from it. The one exception to the same interval: a
reading of exactly ``SATURATED_AT`` held for a poll (below) holds that counter alone, so its next
increase spans two intervals and the others' one. It cannot happen to the optics' pair, which comes
from ``ethtool -S``: that source reads all ones as no reading (NaN), and a row with one missing is
taken for none.

Held at 2**32-1
---------------
A reading of exactly ``SATURATED_AT`` (2**32-1) reached faster than ``PACE_SLACK`` times the
counter's pace (or with no pace known) is where a legacy counter stops, or all ones read once (a
failed read), and within any line-rate bound (a 32-bit ``xmit_wait`` from 1e9 to the top in 10 s is
a port stalled 42 % of the time). Taken, it raised congestion, and its fall back was read as a wrap
(1e9 phantom ticks). So it is held (no delta, nothing else changed) for the next reading (``HELD``
in ``s_drop``, kept in the checkpoint with it): still there, the counter stopped there and its rise
is taken then (``saturated`` counted, a poll late); anything else and the held reading was a bad
one (``implausible_rise``), the reading judged from the last good one. From then on each reading
still there (after one there: the last, or the refused one it re-bases on) has an unknown increase
and rate (NaN; its pace is a flat counter's, what the readings show): the counter stopped, it did
not stop counting. A counter at
``SATURATED_AT`` is never read as wrapping from there: a legacy counter that stopped there is
cleared, not wrapped.

Float64 and 64-bit counters
---------------------------
Frame columns are float64, which holds integers exactly only up to 2**53. A 64-bit counter
above that arrives rounded to its float64 neighbour: near 2**64 the spacing is 2**12 = 4096,
so a delta can be off by up to one spacing (±4096 counts). ``M - last`` is computed first
because it is exact for ``last`` in [M/2, M] (Sterbenz), which keeps the wrap arithmetic from
adding error of its own. At fabric data rates (~5e10 bytes/s) the rounding is below 1e-7 of a
one-second delta; only a slow counter that somehow sits above 2**53 would lose increments,
and none of the fields foreshock reads does (error counters stay small; byte counters that
large take years at line rate).

Legacy InfiniBand PortCounters (``symbol_error`` 16 bits, ``link_downed`` 8 bits, ...) saturate
at their maximum instead of wrapping and are cleared by software: declare them without a
modulus, so a decrease is read as the clear it is (the sysfs source counts those stuck at their
maximum: :mod:`foreshock.streams.infiniband`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from foreshock import facts
from foreshock.numba_config import jit_exact

# Problem counters returned by the kernel, in this order.
PROBLEMS: tuple[str, ...] = (
    "resets", "wraps", "stale_or_out_of_order", "invalid_value", "unknown_slot", "saturated", "glitches",
    "implausible_rise", "resets_confirmed", "rebased", "rebased_down",
)
"""``resets`` counts each decrease read as a reset when it comes (the next reading may show it a
glitch); ``resets_confirmed`` counts each once it stands (the reading after it did not come back,
or there was no pace to judge a way back by), which is what :func:`report_problems` reports.
``implausible_rise`` counts each reading refused as faster than the counter can count, when it is
refused; ``rebased`` each counter re-based on one that stood (the reading after it went on from it:
module docstring, "A high reading that stands"), the jump to it not taken. A re-base is not a reset (the
counter did not go backwards: ``s_resets`` does not count it). ``rebased_down`` counts each decrease to
more than the counter can have counted since a clear in the interval (module docstring, "A fall that is
not a clear") once it stands, as ``resets_confirmed`` does: the value before it was the wrong one, and
the counter is re-based on the lower one, no increase taken."""
(_RESET, _WRAP, _STALE, _INVALID, _BAD_SLOT, _SATURATED, _GLITCH, _IMPLAUSIBLE, _CLEARED, _REBASED,
 _REBASED_DOWN) = range(len(PROBLEMS))

SATURATED_AT = 2.0**32 - 1.0
"""Where 32-bit legacy InfiniBand PortCounters stop: ``port_xmit_wait`` (sysfs reads it from
PortCounters, 32 bits, also where the HCA has 64-bit data counters) and the 32-bit data counters.
A counter reaching it is counted once as ``saturated`` (when it gets there, or at its first sample
if it is there already): from then on it does not move, and what it counts is not seen until someone
clears the counters (``perfquery -x -R``). So a reading there after one there has an unknown increase
and rate (NaN), not 0: read as 0, a congested port looked idle and its congestion "cleared". A healthy NDR
port's ``port_xmit_wait`` reads ~2.5e9 (FACTS), over half way there. The 8- and 16-bit error counters
(``link_downed`` at 255, ``symbol_error`` at 65535) are not judged here: a frame's field does not say
which counter fed it, a slow 64-bit counter (mlx5 ``np_cnp_sent``, ``tx_discards_phy``) sits on 65535
for polls on its way up, and the simulator's do. The sysfs source, which reads them by name, counts
them (:data:`foreshock.streams.infiniband.NATIVE_BITS`)."""

PACE_SLACK = 16.0
"""How much faster than its recent pace a counter may have run in an interval whose decrease is
read as a wrap (traffic and congestion come in bursts; a clear's phantom increase is 2**31-scale)."""

PACE_DECAY = 0.5
"""Per interval, the recent peak rate falls to this share of itself unless a faster one replaces it."""

DROP_SIZE = 6
"""Columns of ``s_drop``: the value before a decrease, its time, the pace then, and how the decrease
was read: 0.0 a reset, 1.0 a wrap, ``FELL`` a fall no clear explains. With no drop pending (NaN
value), ``HELD`` in the fourth column marks a reading at ``SATURATED_AT`` held for the next reading
to confirm: the reading that comes right after a drop decides it before it can be held, so the two
are never pending together; ``GAP`` there marks a wrapping counter that had a row without a reading
since its last one (:data:`GAP`).
The last two: the last reading refused as too fast and its time (NaN: none), pending with either of
those, for the next reading to tell a bad one from one that stood. A state saved with 3 or 4
columns (before wraps' drops, before refused readings were kept) loads widened (:func:`widened_drop`)."""
HELD = 2.0
FELL = 3.0
"""``s_drop``'s fourth column for a decrease to more than a clear in the interval can explain, with a
pace known: re-based there, nothing taken, pending for the next reading (back where it was: the low
reading was the bad one, a glitch)."""
GAP = 4.0
"""``s_drop``'s fourth column, with nothing pending or held, for a counter with a wrap modulus whose
slot sent a row without it since its last reading (a port gone from sysfs, re-initialising: the
InfiniBand source's DOWN rows carry no counters): a decrease at its next reading is a reset, never a
wrap. Those are the moments counters are cleared (an HCA reset brings the port back with them at 0),
and the pace test alone did not tell: it allows ``PACE_SLACK`` times the pace over the whole gap, so
a 32-bit ``xmit_wait`` at a mild 2e5 ticks/s, away 10 min and back cleared from 3.0e9 to 1000, read
as a wrap of 1.29e9 ticks (congestion at 0.27 % of the time for a port that was idle). A true wrap
read as a reset there loses what the counter counted before passing the top in that one interval; a
clear read as a wrap adds up to 2**31 counts. The reading that comes (taken, or re-based on) clears it;
a refused, stale or invalid one leaves it."""

MAX_PORT_RATE_BPS = 2.0 * facts.LINK_RATE_UPLINK_BPS
"""The fastest port the counters' physical bounds allow for: 1.6 Tb/s, twice the fastest port
FACTS lists (800 Gb/s twin-port uplinks), so a port of the next generation is not refused."""

EVENTS_MAX_PER_S = MAX_PORT_RATE_BPS / 64.0
"""Most a fabric error or packet counter can count per second (``symbol_error``, ``port_rcv_errors``,
``port_xmit_discards``, ECN marks, CNPs, ...): one per 64 bits on the wire at ``MAX_PORT_RATE_BPS``
(2.5e10/s). No PHY checks a smaller unit (a 64b/66b block; FEC codewords and packets are larger), so
no real counter gets near it; a garbage reading (1e12 in a 10-s poll: 1e11/s) does."""

STAMP_SLACK = 4.0
"""How many times its true rate a counter can seem to run between two rows: a poll stamps its rows
when it starts and reads the ports (or GPUs) one after another, so a counter read late in one poll
and early in the next (``ethtool -S`` over many ports, a slow sysfs read, a poll that stalled) rose
over more time than the stamps say; a 10-s poll whose read of one port came 1.8 s late was 1.18x.
Bounds that sit on a true rate (bits at the line rate, time at the time elapsed) carry it; they
only have to catch garbage, which is orders of magnitude off."""

LINE_BITS_MAX_PER_S = STAMP_SLACK * 1.25 * MAX_PORT_RATE_BPS
"""Most bits a port's PHY can seem to count per second (an optic's ``rx_bits``, and so
``rx_corrected_bits``): ``MAX_PORT_RATE_BPS`` of data with up to 25 % FEC and coding overhead on the
line (KP4 RS(544,514) with 256b/257b coding: 6.25 %, the simulator's ``line_bits_per_s_factor``;
coherent 400ZR: ~20 %), 2e12 bits/s, times ``STAMP_SLACK``: 8e12. A 400G port's line runs at
4.25e11, an 800G one's at 8.5e11. At the line rate alone (2e12, until 2026-12-03) a 1.6T port read
1.8 s late in a 10-s poll was refused. Garbage is still caught: ``1e15`` corrected bits in a 10-s
poll is 1e14/s, ``1e20`` bits 1e19/s."""

TIME_MAX_PER_S = STAMP_SLACK
"""Most a counter of time (PFC pause, clocks held by the power cap or a thermal slowdown) can seem to
add per second: the time elapsed, times ``STAMP_SLACK`` (a GPU read 1 s late in a 1-s poll held
throughout had added 2 s in a stamped second, the 2 s/s the bound was until 2026-12-03). Garbage
(``1e6`` s: 11 days) is still caught at any poll interval under three days."""

LINK_DOWNS_MAX_PER_S = 5.0
"""Most ``link_downed`` can count per second: each down is followed by link training before the
port can go down again, far longer than 0.2 s."""

MIN_DT_S = 1e-6
"""Samples closer than this are the same sample (a rate over a shorter gap would be noise, or
overflow to inf); such a row is counted as ``stale_or_out_of_order``."""


def modulus_for_bits(bits: int, scale: float = 1.0) -> float:
    """Wrap modulus of a ``bits``-wide counter, in base units (``scale`` as in fields.csv).

    ``port_xmit_data`` counts 4-byte words; after the field table's ``*4`` it wraps at
    ``2**32 * 4`` bytes: ``modulus_for_bits(32, 4.0)``. ``bits=0`` means "never wraps".
    """
    if bits < 0 or bits > 64:
        raise ValueError(f"counter width must be 0 (no wrap) or 1..64 bits, got {bits}")
    return 0.0 if bits == 0 else float(2**bits) * scale


@jit_exact
def _soon_after_low(read_as: float, dt: float, since_before: float) -> bool:
    """Whether a reading ``dt`` after a low one (the last taken; ``since_before`` after the value
    before that) can show a low one read as a reset or a wrap (``read_as``) a glitch: it comes within
    ``PACE_SLACK`` times the interval before the low one (the next poll, or one after a few missed). A
    clear followed by a long gap (the poller away an hour) had the counter back above its pre-clear
    total within the bound over the whole gap: the reset was taken back as a glitch and the hour's
    increase counted from the value before the clear (70 % lost). Later than this, the drop stands as
    read. A fall no clear explains (``FELL``) was no clear: however late, a reading back above the
    value before shows the low one the bad one."""
    return read_as == FELL or dt <= PACE_SLACK * (since_before - dt)


@jit_exact
def _rise_refused(v: float, last: float, dt: float, max_rate: float, before: float, since_before: float,
                  read_as: float) -> bool:
    """Whether a valid reading ``v``, ``dt`` after the last one taken (``last``), rose faster than the
    counter can count (``max_rate``): refused, unless a low reading is pending (``before``, the value
    before it, ``since_before`` s ago, read as ``read_as``; NaN: none) and ``v`` is back from it within
    the bound, soon enough after the low one (:func:`_soon_after_low`): a glitch, taken. The one test
    for it: the kernel's, and the row test of counters read together."""
    if not (v >= last and v - last > max_rate * dt):
        return False
    # a rise over an infinite bound is never refused, so the bound here is finite: the glitch's own
    return not (before == before and v >= before and v - before <= max_rate * since_before
                and _soon_after_low(read_as, dt, since_before))


@jit_exact
def _stood(v: float, high: float, since_high: float, max_rate: float) -> bool:
    """Whether a reading ``v`` refused as too fast goes on from the refused reading before it (``high``,
    ``since_high`` s ago; NaN: none): higher, and no faster than the counter can count. Not the same
    value again: a garbage reading repeated (a stuck read, all ones of 64 bits while a port
    re-initialises) had stood, and the counter's fall back from it was a reset re-adding its whole
    total (a ``link_downed`` of 3: "fatal: link_downed +3" and a flapping link). A counter that does
    not move after a low baseline stays refused (counted) until it does, and its first rise stands.
    A reading of all ones (``SATURATED_AT``) goes on only from one there too (where a counter stops,
    read twice): once, it is as often a failed read."""
    if v == SATURATED_AT:
        return high == SATURATED_AT and since_high >= MIN_DT_S
    return high == high and since_high >= MIN_DT_S and v > high and v - high <= max_rate * since_high


@jit_exact
def _row_stood(i: int, s: int, t: float, values: np.ndarray, spec: np.ndarray, state: np.ndarray,
               drop: np.ndarray) -> bool:
    """Whether row ``i`` of counters read together, refused as too fast, goes on from the row refused
    before it: every counter with a baseline from its own reading in that row (:func:`_stood`), that
    row the same for all, and a bounded counter's rise from there no more than its bound's."""
    k = values.shape[1]
    high_t = np.nan
    for j in range(k):
        if state[s, j, 0] != state[s, j, 0]:
            continue  # never taken: no baseline to re-base (its reading here is its first)
        if high_t != high_t:
            high_t = drop[s, j, 5]
        if drop[s, j, 5] != high_t or not _stood(values[i, j], drop[s, j, 4], t - high_t, spec[j, 1]):
            return False
    for j in range(k):
        b = int(spec[j, 2])
        if b >= 0 and state[s, j, 0] == state[s, j, 0] and state[s, b, 0] == state[s, b, 0] \
                and values[i, j] - drop[s, j, 4] > values[i, b] - drop[s, b, 4]:
            return False
    return high_t == high_t  # (NaN: no counter has a baseline, and nothing was refused)


@jit_exact
def _row_refusals(i: int, s: int, t: float, values: np.ndarray, spec: np.ndarray, state: np.ndarray,
                  drop: np.ndarray, problems: np.ndarray) -> int:
    """How row ``i`` of counters read together is refused: 0, not at all (taken for all of them); -1,
    one reading is missing or invalid; else how many rose faster than the counter can count, or more
    than the counter that bounds it (``spec[:, 2]``) over the same interval (the row refused for all,
    unless it goes on from the row refused before it: :func:`_row_stood`). Counts each invalid or
    refused reading in ``problems``. Kept this small on purpose: Numba inlines it into the kernel's
    loop; a call per row instead (with the re-base rule in here) made the pair's rates 3.5x slower."""
    k = values.shape[1]
    refused = 0
    for j in range(k):
        v = values[i, j]
        last = state[s, j, 0]
        dt = t - state[s, j, 1]
        if v != v:
            refused = -1  # missing: the others alone would span another interval than it
        elif v < 0.0 or v == np.inf:
            problems[_INVALID] += 1
            refused = -1
        elif last == last and dt >= MIN_DT_S and _rise_refused(v, last, dt, spec[j, 1], drop[s, j, 0],
                                                               t - drop[s, j, 1], drop[s, j, 3]):
            problems[_IMPLAUSIBLE] += 1
            if refused >= 0:  # (one missing or invalid reading makes the row unusable, whatever else)
                refused += 1
    if refused:
        return refused
    for j in range(k):
        b = int(spec[j, 2])
        if b < 0:
            continue
        # judged only on two plain rises over one interval: nothing pending or held for either (a
        # glitch's return reads as a rise from the low value; a held one's next rise spans two
        # intervals), and the same last time (so it is then, unless a state saved apart was loaded)
        plain = drop[s, j, 3] != drop[s, j, 3] and drop[s, b, 3] != drop[s, b, 3]
        same_interval = state[s, j, 1] == state[s, b, 1] and t - state[s, j, 1] >= MIN_DT_S
        rise, bound = values[i, j] - state[s, j, 0], values[i, b] - state[s, b, 0]
        if plain and same_interval and rise >= 0.0 and bound >= 0.0 and rise > bound:
            problems[_IMPLAUSIBLE] += 1
            refused += 1
    return refused


@jit_exact
def _count_stood(read_as: float, problems: np.ndarray) -> None:
    """Count a decrease that stood (no way back came, or none could be judged), by how it was read:
    a reset (``resets_confirmed``), a fall no clear explains (``rebased_down``); a wrap is counted
    when it comes. The one count for it, wherever it is decided."""
    if read_as == 0.0:
        problems[_CLEARED] += 1
    elif read_as == FELL:
        problems[_REBASED_DOWN] += 1


@jit_exact
def _rebase(i: int, s: int, j: int, v: float, t: float, state: np.ndarray, pace: np.ndarray,
            drop: np.ndarray, problems: np.ndarray, out: np.ndarray) -> None:
    """Re-base counter ``j`` of slot ``s`` on the refused reading ``v`` went on from (``drop[s, j, 4:]``)
    and take the increase from it, over the time since it; the jump to it is not taken. What was
    pending is decided as a taken reading decides it: a reset's drop stands (no way back came), a
    reading held at ``SATURATED_AT`` not still there was a bad one."""
    high = drop[s, j, 4]
    span = t - drop[s, j, 5]
    if drop[s, j, 0] == drop[s, j, 0]:
        _count_stood(drop[s, j, 3], problems)
    if drop[s, j, 3] == HELD and v != SATURATED_AT:
        problems[_IMPLAUSIBLE] += 1
    problems[_REBASED] += 1
    problems[_SATURATED] += v == SATURATED_AT and state[s, j, 0] != v
    for c in range(DROP_SIZE):
        drop[s, j, c] = np.nan
    delta = v - high
    pace[s, j] = delta / span  # nothing before the jump tells the counter's pace
    if v == SATURATED_AT and high == v:
        delta = np.nan  # stopped there: its increase is unknown ("Held at 2**32-1")
    state[s, j, 0] = v
    state[s, j, 1] = t
    out[0, i, j] = delta
    out[1, i, j] = delta / span


@jit_exact
def _counter_deltas(ts: np.ndarray, slot: np.ndarray, values: np.ndarray, spec: np.ndarray, together: bool,
                    state: np.ndarray, pace: np.ndarray, drop: np.ndarray, counts: np.ndarray,
                    out: np.ndarray) -> np.ndarray:
    """Increase and rate of every (row, counter); updates the per-slot state in place.

    ts (rows,), slot (rows,) int32, values (rows, k); spec (k, 3) = [modulus, max_rate, the column
    whose rise bounds this one's, -1: none]; together: a row is taken for all counters or none
    (:func:`_row_refusals`), or re-based for all (:func:`_row_stood`);
    state (slots, k, 2) = [last value, last ts] with NaN = nothing seen yet; pace (slots, k) the
    recent peak rate, NaN = none known (see the module docstring); drop (slots, k, DROP_SIZE) =
    [value, ts, pace, how it was read: 0.0 a reset, 1.0 a wrap, ``FELL`` a fall no clear explains]
    from before a decrease, NaN = none pending (the next reading tells a one-reading glitch from
    what it was read as), or [NaN, NaN, NaN, HELD]
    while a reading at ``SATURATED_AT`` is held for the next one to confirm; then [value, ts] of the
    last reading refused as too fast, NaN = none (the next reading tells a bad one from one that
    stood: the counter re-based on it); counts (slots, k)
    int64 resets; out (2, rows, k) = [delta, rate], NaN where unknown (two C-contiguous planes, so
    the kernels downstream get contiguous matrices).
    Returns the problem totals in ``PROBLEMS`` order.
    """
    problems = np.zeros(len(PROBLEMS), dtype=np.int64)
    n_rows, k = values.shape
    n_slots = state.shape[0]
    for i in range(n_rows):
        s = slot[i]
        t = ts[i]
        for j in range(k):
            out[0, i, j] = np.nan
            out[1, i, j] = np.nan
        if s < 0 or s >= n_slots or t != t:
            problems[_BAD_SLOT] += 1
            continue
        rebase_row = False
        fell_unknown = False  # a counter of the row re-based on a fall (its increase unknown)
        if together:
            refusals = _row_refusals(i, s, t, values, spec, state, drop, problems)
            if refusals != 0:
                if refusals < 0 or not _row_stood(i, s, t, values, spec, state, drop):
                    if refusals > 0:  # every reading valid: kept, the next row may go on from it
                        for j in range(k):
                            if state[s, j, 0] == state[s, j, 0]:
                                drop[s, j, 4] = values[i, j]
                                drop[s, j, 5] = t
                    continue
                # it goes on from the row refused before it: that one stood, and all are re-based on
                # it; this row's readings were not refused after all
                problems[_IMPLAUSIBLE] -= refusals
                rebase_row = True
        for j in range(k):
            v = values[i, j]
            if v != v:  # missing sample: keep the last good value
                if spec[j, 0] > 0.0 and state[s, j, 0] == state[s, j, 0] and drop[s, j, 3] != drop[s, j, 3]:
                    drop[s, j, 3] = GAP  # (nothing pending or held): a decrease after it is a reset
                continue
            if v < 0.0 or v == np.inf:  # negative (incl. -inf) or +inf
                problems[_INVALID] += 1
                continue
            modulus = spec[j, 0]
            max_rate = spec[j, 1]
            last = state[s, j, 0]
            last_t = state[s, j, 1]
            if last != last:
                problems[_SATURATED] += v == SATURATED_AT  # first seen where a legacy counter stops
                state[s, j, 0] = v
                state[s, j, 1] = t
                continue
            dt = t - last_t
            if not dt >= MIN_DT_S:
                problems[_STALE] += 1
                continue
            recent = pace[s, j]
            before = drop[s, j, 0]
            if rebase_row or _rise_refused(v, last, dt, max_rate, before, t - drop[s, j, 1], drop[s, j, 3]):
                if rebase_row or _stood(v, drop[s, j, 4], t - drop[s, j, 5], max_rate):
                    # it goes on from the reading refused before it: that one stood, the baseline was
                    # the wrong one (a low reading taken with no pace to judge it by)
                    _rebase(i, s, j, v, t, state, pace, drop, problems, out)
                    continue
                # faster than the counter can count: a bad reading (the mirror of a low one), not
                # taken; what is pending stays pending, the next reading is judged from the last good
                # one, and from this one (kept in its place: the next reading may go on from it)
                problems[_IMPLAUSIBLE] += 1
                drop[s, j, 4] = v
                drop[s, j, 5] = t
                continue
            if drop[s, j, 4] == drop[s, j, 4]:  # taken from the last good one: the refused one was bad
                drop[s, j, 4] = drop[s, j, 5] = np.nan
            pending = before == before  # the last reading taken was a drop: this one tells what it was
            marked = drop[s, j, 3]  # (a pending drop has 0, 1 or FELL there; else HELD, GAP or NaN)
            held = marked == HELD
            gap = marked == GAP
            if marked != marked and v >= last and v != SATURATED_AT:
                # the common case (nothing pending, held or after a gap, an increase): as the general
                # path below takes it
                delta = v - last
                pace[s, j] = max(delta / dt, PACE_DECAY * recent) if recent == recent else delta / dt
                state[s, j, 0] = v
                state[s, j, 1] = t
                out[0, i, j] = delta
                out[1, i, j] = delta / dt
                continue
            glitch = False
            read_as_wrap = False
            read_as_reset = False
            span = dt  # the time the row's increase is over (its rate's denominator)
            if pending:
                elapsed = t - drop[s, j, 1]
                before_pace = drop[s, j, 2]
                read_as_wrap = drop[s, j, 3] == 1.0
                read_as_reset = drop[s, j, 3] == 0.0  # (else FELL)
                # back where it was, no faster than the counter can count (its physical bound; without
                # one, 16x its pace before the drop): the low reading was a bad one
                back_rate = max_rate if max_rate < np.inf else PACE_SLACK * before_pace
                glitch = v >= before and v - before <= back_rate * elapsed and _soon_after_low(drop[s, j, 3], dt, elapsed)
            if not glitch and v >= last:
                rise = v - last
                if v == SATURATED_AT and last != v and not held and not (
                        recent == recent and rise <= PACE_SLACK * recent * dt):  # faster than its pace
                    # at the top of 32 bits all at once: where a counter stops, or all ones read once;
                    # held (not taken) until the next reading says which. It decides a pending drop
                    # first (not back: a reset or wrap that stands), so the two never wait together.
                    if pending:
                        _count_stood(drop[s, j, 3], problems)
                    drop[s, j, 0] = drop[s, j, 1] = drop[s, j, 2] = np.nan
                    drop[s, j, 3] = HELD
                    continue
            if held or gap:
                drop[s, j, 3] = np.nan  # (a held reading's, or the gap's, mark: this reading decides)
                if held and v != SATURATED_AT:
                    problems[_IMPLAUSIBLE] += 1  # not still there: the held reading was a bad one
            if pending:
                if not glitch:
                    _count_stood(drop[s, j, 3], problems)  # not back: the reset or the fall stands
                drop[s, j, :] = np.nan  # only the reading right after the drop decides
            saturated = v == SATURATED_AT and last != v  # got there (one back there after a bad reading is not)
            if glitch:
                if read_as_wrap or read_as_reset:
                    # the low reading was counted already: as an increase of itself (a reset) or as
                    # the way round from before (a wrap)
                    counted = (modulus - before) + last if read_as_wrap else last
                    delta = max(v - before - counted, 0.0)
                elif together:
                    # the low reading counted nothing (a fall no clear explains): this interval's
                    # share of the increase since before it, so that its delta spans its own interval
                    # as those of the counters read with it do (their last row gave none either)
                    delta = (v - before) * (dt / elapsed)
                else:
                    # the low reading counted nothing: the whole increase since before it (every
                    # event once: a share of a link down had been +0.5), its rate over that time
                    delta = v - before
                    span = elapsed
                problems[_GLITCH] += 1
                if read_as_reset and counts[s, j] > 0:
                    counts[s, j] -= 1  # not a reset after all
                pace[s, j] = max((v - before) / elapsed, PACE_DECAY * before_pace)
            elif v >= last:
                problems[_SATURATED] += saturated
                delta = v - last
                pace[s, j] = max(delta / dt, PACE_DECAY * recent) if recent == recent else delta / dt
                if v == SATURATED_AT and last == v:
                    # stopped at the top of 32 bits (legacy PortCounters): what it counted since is not
                    # seen, so its increase is unknown, not 0 (read as 0, a port stalled past the top
                    # looked idle and its congestion "cleared"). The pace is what the readings show (a
                    # flat counter's), as before: it judges the way back of a low reading from here
                    delta = np.nan
            else:
                problems[_SATURATED] += saturated
                wrapped = (modulus - last) + v
                limit = min(0.5 * modulus, max_rate * dt)
                # no pace known, or a row without the counter since its last reading (GAP): a reset
                paced = recent == recent and not gap and wrapped <= PACE_SLACK * recent * dt
                # a counter at 2**32-1 stopped there (legacy PortCounters saturate): it is cleared, not wrapped
                if modulus > 0.0 and last <= modulus and last != SATURATED_AT and wrapped <= limit and paced:
                    delta = wrapped
                    problems[_WRAP] += 1
                    # kept for the next reading: back near the top, the low reading was a glitch
                    drop[s, j, 0] = last
                    drop[s, j, 1] = last_t
                    drop[s, j, 2] = recent
                    drop[s, j, 3] = 1.0
                    pace[s, j] = max(delta / dt, PACE_DECAY * recent)
                else:
                    if v > max_rate * dt:
                        # more than the counter can have counted since a clear in the interval: not a
                        # reset; the value before was the wrong one (garbage taken as a baseline with
                        # no pace to judge it by, or two that rose from each other and stood).
                        # Re-based on this one, its increase unknown (read as a reset, it was the
                        # counter's whole total)
                        read_as = FELL
                        delta = np.nan
                        fell_unknown = True
                    else:
                        read_as = 0.0
                        delta = v
                        counts[s, j] += 1
                        problems[_RESET] += 1
                    if recent == recent:  # kept for the next reading, which tells a glitch from either
                        drop[s, j, 0] = last
                        drop[s, j, 1] = last_t
                        drop[s, j, 2] = recent
                        drop[s, j, 3] = read_as
                    else:
                        _count_stood(read_as, problems)  # nothing to judge a way back by: it stands now
                    pace[s, j] = np.nan  # when in the interval the clear came is unknown
            state[s, j, 0] = v
            state[s, j, 1] = t
            out[0, i, j] = delta
            out[1, i, j] = delta / span
        if together and fell_unknown:
            # one counter's increase over the interval is unknown: the others' are not given
            # either (their ratio over it is unknown), though each goes on from this row
            for j in range(k):
                out[0, i, j] = np.nan
                out[1, i, j] = np.nan
    return problems


class CounterRates:
    """Per-slot rates of a fixed set of counters.

    Parameters
    ----------
    n_slots:
        Number of entity slots (``topology.size(kind)``).
    names:
        The counters, in the column order ``update`` receives them.
    modulus:
        Wrap modulus per counter in base units (see :func:`modulus_for_bits`); one value for
        all or one per counter. ``0`` = never wraps (every decrease is a reset).
    max_rate:
        The fastest the counter can physically count (base units per second: a port's line rate
        in bytes/s, ``xmit_wait`` ticks/s at line rate, :data:`EVENTS_MAX_PER_S`, ...). A reading
        further above the last one than that is refused: counted as ``implausible_rise``, not
        taken, unless it goes on from the reading refused before it (within the bound from there):
        that one stood, and the counter is re-based on it (``rebased``); a decrease whose wrapped
        increase would exceed it is read as a reset, unless the new value itself exceeds it (more
        than a clear in the interval can have counted): then the value before was the wrong one,
        and the counter is re-based on the new one (``rebased_down``); a reading back above the
        value before a low one within it is a glitch. ``inf`` = no bound (the half-range rule for
        wraps, 16x the pace for glitches; no reading refused).
    together:
        The counters are read together and used together (a ratio of their increases: the pre-FEC
        BER is corrected bits / received bits): a row is taken for all of them or for none. One
        missing, invalid or refused reading leaves all of them at their last good values, and a row
        that goes on from a refused one re-bases all of them on it, so their increases span the same
        interval; taken alone, the other's increase spanned one interval and its own the next two (a
        ratio off by up to 2x). One exception: a reading of exactly ``SATURATED_AT`` held for a poll
        (module docstring) holds that counter alone, so its next increase spans two intervals and
        the others' one. The optics' pair cannot meet it: the ethtool source reads all ones as no
        reading (NaN), and a row with one missing is taken for none.
    bounded_by:
        ``{counter: other}``: the counter's rise in a row can be no larger than the other's over the
        same interval (corrected bits are bits received); a row where it is larger is refused like
        a rise past ``max_rate``. Judged on plain rises only (nothing pending or held for either).
        Needs ``together``.

    Example
    -------
    >>> import numpy as np
    >>> rates = CounterRates(1, ["rx"], modulus=modulus_for_bits(32))
    >>> ts = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    >>> raw = np.array([[2.0**32 - 30], [2.0**32 - 10], [5.0], [25.0], [3.0]])  # a wrap, then a reset
    >>> delta, rate, problems = rates.update(ts, np.zeros(5, np.int32), raw)
    >>> rate[:, 0].tolist()
    [nan, 20.0, 15.0, 20.0, 3.0]
    >>> problems["wraps"], problems["resets"], int(rates.s_resets[0, 0])
    (1, 1, 1)
    """

    def __init__(self, n_slots: int, names: Sequence[str], modulus: float | Sequence[float] = 0.0,
                 max_rate: float | Sequence[float] = np.inf, together: bool = False,
                 bounded_by: Mapping[str, str] | None = None) -> None:
        if n_slots < 0:
            raise ValueError(f"n_slots must be >= 0, got {n_slots}")
        self.names = tuple(names)
        k = len(self.names)
        mod = np.broadcast_to(np.asarray(modulus, dtype=np.float64), (k,))
        top = np.broadcast_to(np.asarray(max_rate, dtype=np.float64), (k,))
        if np.any(~(mod >= 0)) or np.any(np.isinf(mod)):
            raise ValueError("modulus must be finite and >= 0 (0 = never wraps)")
        if np.any(~(top > 0)):
            raise ValueError("max_rate must be > 0 (inf = no limit)")
        bounds = dict(bounded_by or {})
        if bounds and not together:
            raise ValueError("bounded_by compares rises over one interval: it needs together=True")
        unknown = sorted({*bounds, *bounds.values()} - set(self.names))
        if unknown or any(counter == other for counter, other in bounds.items()):
            raise ValueError(f"bounded_by must pair two different counters of {self.names}, got {bounds}")
        bounding = np.array([self.names.index(bounds[n]) if n in bounds else -1 for n in self.names], np.float64)
        self.together = together
        self.spec = np.ascontiguousarray(np.stack([mod, top, bounding], axis=1))
        self.s_state = np.full((n_slots, k, 2), np.nan)
        self.s_resets = np.zeros((n_slots, k), dtype=np.int64)
        self.s_rate = np.full((n_slots, k), np.nan)  # recent peak rate (the wrap test's pace)
        self._rate_of = self.s_state
        # [value, ts, pace, read as a reset (0), a wrap (1) or a fall no clear explains (FELL)]
        # from before a decrease: the next reading may show it a glitch
        self.s_drop = np.full((n_slots, k, DROP_SIZE), np.nan)
        self._drop_of = self.s_state

    def _pace(self) -> np.ndarray:
        """``s_rate``, for the ``s_state`` in use. A detector that loads a saved state rebinds
        ``s_state`` (its own array, saved without the pace): the pace is then unknown (NaN), never
        another slot's or another shape's, so the next decrease of each counter is a reset."""
        if self._rate_of is not self.s_state or self.s_rate.shape != self.s_state.shape[:2]:
            self.s_rate = np.full(self.s_state.shape[:2], np.nan)
            self._rate_of = self.s_state
        return self.s_rate

    def _drop(self) -> np.ndarray:
        """``s_drop``, for the ``s_state`` in use; like the pace, none pending once ``s_state`` is
        rebound without it (a low reading before a restore then reads as the reset it looked like)."""
        if self._drop_of is not self.s_state or self.s_drop.shape != (*self.s_state.shape[:2], DROP_SIZE):
            self.s_drop = np.full((*self.s_state.shape[:2], DROP_SIZE), np.nan)
            self._drop_of = self.s_state
        return self.s_drop

    def update(self, ts: np.ndarray, slot: np.ndarray,
               values: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
        """Feed raw counter values (rows, k); returns (delta, rate, problem counts).

        ``delta`` and ``rate`` are (rows, k), NaN for a first sample, a missing or invalid
        value, a stale timestamp or an unknown slot. Rows must be in time order per slot
        (frames from one source are); a row not at least ``MIN_DT_S`` newer than the last one
        for its slot is counted as ``stale_or_out_of_order`` and skipped.
        """
        values = np.ascontiguousarray(values, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != len(self.names):
            raise ValueError(f"expected a (rows, {len(self.names)}) matrix of {self.names}, got {values.shape}")
        ts = np.ascontiguousarray(ts, dtype=np.float64)
        slot = np.ascontiguousarray(slot, dtype=np.int32)
        if len(ts) != len(values) or len(slot) != len(values):
            raise ValueError("ts, slot and values must have the same number of rows")
        out = np.empty((2, len(values), len(self.names)))
        problems = _counter_deltas(ts, slot, values, self.spec, self.together, self.s_state, self._pace(),
                                   self._drop(), self.s_resets, out)
        return out[0], out[1], dict(zip(PROBLEMS, (int(p) for p in problems)))

    def bind(self, s_state: np.ndarray, s_resets: np.ndarray, s_rate: np.ndarray,
             s_drop: np.ndarray | None = None) -> None:
        """Use a detector's own state arrays (loaded from a checkpoint), the pace with them, and the
        pending drops if it keeps them (else none is pending)."""
        if s_state.shape[:2] != s_resets.shape or s_rate.shape != s_resets.shape:
            raise ValueError(f"counter state shapes disagree: {s_state.shape}, {s_resets.shape}, {s_rate.shape}")
        drop_shape = (*s_resets.shape, DROP_SIZE)
        if s_drop is not None and s_drop.shape != drop_shape:
            raise ValueError(f"counter state 's_drop' has shape {s_drop.shape}, expected {drop_shape}")
        self.s_state, self.s_resets, self.s_rate, self._rate_of = s_state, s_resets, s_rate, s_state
        self.s_drop = np.full(drop_shape, np.nan) if s_drop is None else s_drop
        self._drop_of = s_state

    def state_dict(self, prefix: str = "") -> dict[str, Any]:
        return {f"{prefix}s_state": self.s_state.copy(), f"{prefix}s_resets": self.s_resets.copy(),
                f"{prefix}s_rate": self._pace().copy(), f"{prefix}s_drop": self._drop().copy()}

    def load_state_dict(self, state: dict[str, Any], prefix: str = "") -> None:
        """A state saved before ``s_rate`` existed loads with no pace known (NaN), one saved before
        ``s_drop`` existed with no drop pending (NaN), one whose ``s_drop`` is narrower widened
        (:func:`widened_drop`)."""
        for name in ("s_state", "s_resets"):
            own = getattr(self, name)
            arr = np.asarray(state[f"{prefix}{name}"], dtype=own.dtype)
            if arr.shape != own.shape:
                raise ValueError(f"counter state {name!r} has shape {arr.shape}, expected {own.shape}")
            setattr(self, name, arr.copy())
        rate = np.asarray(state.get(f"{prefix}s_rate", np.full(self.s_rate.shape, np.nan)), dtype=np.float64)
        if rate.shape != self.s_state.shape[:2]:
            raise ValueError(f"counter state 's_rate' has shape {rate.shape}, expected {self.s_state.shape[:2]}")
        self.s_rate, self._rate_of = rate.copy(), self.s_state
        shape = (*self.s_state.shape[:2], DROP_SIZE)
        drop = widened_drop(np.asarray(state.get(f"{prefix}s_drop", np.full(shape, np.nan)), dtype=np.float64))
        if drop.shape != shape:
            raise ValueError(f"counter state 's_drop' has shape {drop.shape}, expected {shape}")
        self.s_drop, self._drop_of = drop.copy(), self.s_state


def widened_drop(drop: np.ndarray) -> np.ndarray:
    """A saved ``s_drop`` (slots, counters, columns) as this version keeps it (:data:`DROP_SIZE`):
    one with 3 columns (before a wrap's drop was kept) with each pending drop a reset's, as every one
    then was; one with 3 or 4 (before a refused reading was kept) with none pending (NaN). Any other
    shape is returned as it came (the loader judges it)."""
    if drop.ndim != 3 or drop.shape[2] not in (3, 4):  # the widths saved before
        return drop
    wide = np.full((*drop.shape[:2], DROP_SIZE), np.nan)
    wide[:, :, :drop.shape[2]] = drop
    if drop.shape[2] == 3:
        wide[:, :, 3] = np.where(np.isnan(drop[:, :, 0]), np.nan, 0.0)  # each drop pending a reset's
    return wide


def with_counter_pace_and_drop(state: dict[str, Any], state_key: str, rate_key: str,
                               drop_key: str) -> dict[str, Any]:
    """A detector's saved ``state`` with its counters' pace (``rate_key``) and pending drops
    (``drop_key``) where it was saved without them (before they were kept): none known, none
    pending (NaN), shaped after the saved counter state ``state_key``; pending drops saved with
    fewer columns widened (:func:`widened_drop`). A state without ``state_key`` (``load_state_dict``
    will refuse it) is returned as it came. For ``Detector.upgrade_state``."""
    counters = state.get(state_key)
    if counters is None:
        return state
    shape = np.shape(counters)[:2]
    missing = {rate_key: np.full(shape, np.nan), drop_key: np.full((*shape, DROP_SIZE), np.nan)}
    state = {**state, **{key: fresh for key, fresh in missing.items() if key not in state}}
    drop = np.asarray(state[drop_key])
    if drop.ndim == 3 and drop.shape[2] < DROP_SIZE:
        state[drop_key] = widened_drop(drop.astype(np.float64))
    return state


def report_problems(health: Any, stage: str, problems: dict[str, int]) -> None:
    """Send counter problems to a :class:`foreshock.health.PipelineHealth`: a glitch or a reading
    above what the counter can count is a bad reading, a counter re-based on a high one that stood
    is one too (the reading it was judged from), as is one re-based on a fall a clear cannot explain;
    a reset is reported once it stands (a
    counter going backwards: docs/bad-input.md; one seen to come back was a glitch, reported as
    that); wraps are what a 32-bit counter does at speed, the input being right, so they are not."""
    reasons = {
        "resets_confirmed": "counter went backwards and stayed there: cleared (perfquery -R, a driver reload, a "
                            "module swap); counted from zero",
        "implausible_rise": "counter read higher than it can have counted (faster than its physical bound, or 2**32-1 "
                            "once then back): one bad reading, ignored",
        "rebased": "counter read higher than it can have counted, then went on from there: the value it was judged "
                   "from was wrong (a low first reading, or a clear), counted from the new one (the jump not counted)",
        "rebased_down": "counter fell to more than it can have counted since a clear: the value it was judged from "
                        "was wrong (a garbage first reading), counted from the new one (the fall not read as a reset)",
        "stale_or_out_of_order": "counter sample not newer than the last one for its entity",
        "invalid_value": "negative or infinite counter value",
        "unknown_slot": "row with a slot outside the topology or a NaN timestamp",
        "saturated": "counter reached 2**32-1, where 32-bit PortCounters stop: its increases are no longer "
                     "seen until it is cleared",
        "glitches": "counter read lower than before once, then back: one bad reading, not a reset or a wrap (its drop "
                    "ignored)",
    }
    for key, reason in reasons.items():
        if problems.get(key, 0):
            health.problem(stage, reason, problems[key])
