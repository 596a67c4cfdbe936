"""mlx5 ``ethtool -S`` counters: RoCE congestion counters for links, PHY/FEC counters for
optics, and pre-FEC / post-FEC bit error rates from two readings.

``ethtool -S IFACE`` prints ``NIC statistics:`` then ``     name: value`` lines. The field
table's ``ethtool`` column says which names feed which field: PFC pause duration
(``rx_prio3_pause_duration``, µs -> s), ``*_bytes_phy``, ``link_down_events_phy``,
``tx_discards_phy`` for the link; ``rx_bits_phy``, ``rx_corrected_bits_phy``,
``rx_pcs_symbol_err_phy`` for the optic at the port. The ECN/CNP chain
(``np_ecn_marked_roce_packets`` -> ``np_cnp_sent`` -> ``rp_cnp_handled``) is mapped too, but
mlx5 exports it as RDMA ``hw_counters`` in sysfs (read by :mod:`.infiniband`), not in its
``ethtool -S`` list; the names are used when a driver does print them.

FEC (mlx5 counter documentation): ``rx_bits_phy`` counts bits received at the PHY,
``rx_corrected_bits_phy`` the bits FEC corrected, ``rx_pcs_symbol_err_phy`` the symbols FEC
could *not* correct. Between two readings::

    pre-FEC BER  = Δ rx_corrected_bits_phy / Δ rx_bits_phy
    post-FEC BER ≈ Δ rx_pcs_symbol_err_phy / Δ rx_bits_phy   (an upper bound: each
                                                             uncorrected symbol counted as one bit)

A counter that went backwards (reset, driver reload) or no new bits gives NaN and the reset is
counted; it never becomes a negative or a huge rate.

A counter reading all ones (``18446744073709551615`` or ``4294967295``) is no reading: it is
missing (NaN) and counted (:data:`NOT_AVAILABLE`). Taken as a value, one such reading between two
real ones was an increase of ~1.8e19 (or ~4.3e9) counts and then a reset: ``link_downed``
+1.8e19, a fatal link down and a flapping link from one bad poll.

This source and the sysfs one (:mod:`.infiniband`) fill the same link fields of a RoCE port
(``tx_data``, ``rx_data``, ``link_downed``, ``xmit_discards``, the ECN/CNP chain) from different
counters: ``tx_bytes_phy`` counts bytes at the PHY, ``port_xmit_data`` 4-byte words at the RDMA
port, and they differ in value and in when they were cleared. Both naming one link, their rows
would interleave in one counter series, every switch between them a reset or a jump. The CLI
cannot make them one link: ``watch`` and ``record`` poll one ``--source``, and ``agent`` names
this source's links ``<host>/<iface>`` and the sysfs source's ``<host>/<dev>/<port>`` (an
interface name holds no ``/``), with or without ``--topology``. Only the library can: an
``interfaces`` mapping here and a ``link_names`` mapping there naming one link. Give each link one
counter source.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

import numpy as np

from foreshock.fields import source_index
from foreshock.frames import Frame
from foreshock.health import PipelineHealth

from .polling import EthtoolSource, count_once
from .samples import U64_MAX, BatchBuilder, SampleBatch, parse_count

STAGE = "ethtool"
# mlx5 prints PFC counters for each PFC-enabled priority (en_stats.c: ``for_each_set_bit(prio,
# &pfc_combined, NUM_PPORT_PRIO)``); the lossless (RoCE) class is on 3 by default, not always:
# ``pfc_pause_duration`` adds up every printed priority's pause time (the field table names priority 3)
_PRIO_PAUSE = re.compile(r"^rx_prio[0-7]_pause_duration$")
# ``name: value``; drivers that print per-queue counters (bnxt_en) prefix them ``[N]: ``
_STAT = re.compile(r"^\s*(?:\[(\d+)\]:\s*)?([^\s:\[][^:]*?):\s*(\S+)\s*$")
NOT_AVAILABLE = frozenset({U64_MAX, 2**32 - 1})
"""All-ones counter values, read as "not available", not as counts.

2**64-1 is the kernel's "not set" (``ETHTOOL_STAT_NOT_SET``, ``~0ULL``, in ``include/linux/ethtool.h``):
no counter gets there (a byte counter at 400 Gb/s would take 11 years).

2**32-1 is taken as missing too, knowing a 32-bit counter passes through it once per wrap.
FACTS.md records no driver's "not available" value for ``ethtool -S``; all ones is what a 32-bit
read of a device gone from the PCIe bus returns, and a driver widening such a read (or a 32-bit
field it never filled) prints 4294967295. The two mistakes are not alike: a real 4294967295 read as
missing costs that one reading (the detectors keep a counter's last value across a NaN, so the
next reading's increase covers both intervals: :class:`foreshock.detectors.counters.CounterRates`)
and one problem counted; a sentinel read as a value between two real readings is a phantom
increase of ~4.3e9 (``link_downed`` +4294967294, fatal) and then a reset. The counters read here
are 64-bit but for ``link_down_events_phy`` (32 bits in mlx5's PPCNT, never near its top) and the
ECN/CNP chain (mlx5 prints those in sysfs, not here); none of them saturates at 2**32-1 (those
are the IB PortCounters, read by :mod:`.infiniband`). A counter that did stop there would read as
missing, and be counted, at every poll."""


def parse_ethtool_stats(text: str, health: PipelineHealth | None = None) -> dict[str, float]:
    """All counters of one ``ethtool -S`` output, by name (non-numeric values, and values no u64
    holds, counted, left out; an all-ones value, :data:`NOT_AVAILABLE`, NaN: :func:`stats_batches`
    counts those of the counters it reads).
    A per-queue counter (Broadcom's ``[3]: rx_ucast_packets: 1418``) is named ``[3]rx_ucast_packets``:
    foreshock reads port counters only, and until 2026-12-01 every such line was counted as
    malformed at every poll — hundreds a poll on a healthy NIC."""
    health = health if health is not None else PipelineHealth()
    stats: dict[str, float] = {}
    bad = 0
    for line in text.splitlines():
        if not line.strip() or line.rstrip().endswith("statistics:"):
            continue
        m = _STAT.match(line)
        if m is None:
            bad += 1
            continue
        try:
            value = parse_count(m.group(3))  # ``ethtool -S`` prints each counter as a u64 (``%llu``)
        except ValueError:
            bad += 1
            continue
        queue, name = m.group(1), m.group(2)
        # judged on the integer: as a float, 2**64-1 is 2**64, and so are its real neighbours
        stats[f"[{queue}]{name}" if queue else name] = np.nan if value in NOT_AVAILABLE else float(value)
    if bad:
        health.problem(STAGE, "malformed counter line", bad)
    return stats


def fec_ber(prev: Mapping[str, float], cur: Mapping[str, float]) -> tuple[float, float]:
    """``(pre-FEC BER, post-FEC BER)`` between two readings of one port (NaN when undefined)."""
    pre, post = fec_ber_arrays(
        np.array([prev.get("rx_bits_phy", np.nan)]), np.array([prev.get("rx_corrected_bits_phy", np.nan)]),
        np.array([prev.get("rx_pcs_symbol_err_phy", np.nan)]), np.array([cur.get("rx_bits_phy", np.nan)]),
        np.array([cur.get("rx_corrected_bits_phy", np.nan)]), np.array([cur.get("rx_pcs_symbol_err_phy", np.nan)]))
    return float(pre[0]), float(post[0])


def fec_ber_arrays(bits0: np.ndarray, corrected0: np.ndarray, symbols0: np.ndarray,
                   bits1: np.ndarray, corrected1: np.ndarray, symbols1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised :func:`fec_ber` over ports: readings 0 (earlier) and 1 (later)."""
    d_bits = bits1 - bits0
    d_corr = corrected1 - corrected0
    d_sym = symbols1 - symbols0
    valid = (d_bits > 0) & (d_corr >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        pre = np.where(valid, d_corr / d_bits, np.nan)
        post = np.where(valid & (d_sym >= 0), d_sym / d_bits, np.nan)
    return pre, post


def counters_went_back(prev: Mapping[str, float], cur: Mapping[str, float]) -> list[str]:
    """Names of counters that decreased between two readings (a reset or a wrap)."""
    return [name for name, value in cur.items() if name in prev and value < prev[name]]


FEC_COUNTERS = ("rx_bits_phy", "rx_corrected_bits_phy", "rx_pcs_symbol_err_phy")
"""The counters :func:`fec_ber` reads together (their deltas over one interval)."""
PRE_FEC = ("rx_bits_phy", "rx_corrected_bits_phy")
"""The pre-FEC BER's pair: Δ corrected bits over Δ bits."""
POST_FEC = ("rx_bits_phy", "rx_pcs_symbol_err_phy")
"""The post-FEC BER's pair: Δ uncorrected symbols over Δ bits."""


def _delta_ratio(base: tuple[float, float], cur: tuple[float, float]) -> float:
    """Δ numerator / Δ bits between a pair's baseline ``(bits, count)`` and its reading now: NaN
    when no bits came or a counter went back (a reset), as :func:`fec_ber_arrays` gives it."""
    d_bits, d_count = cur[0] - base[0], cur[1] - base[1]
    return d_count / d_bits if d_bits > 0 and d_count >= 0 else math.nan


class FecTracker:
    """Keeps each port's previous reading to fill ``prefec_ber`` on the next one.

    Each BER has its own baseline, its pair's last reading with both counters available: a counter
    not available (NaN, :data:`NOT_AVAILABLE`) holds back the baseline of the pairs it is in, and
    no other. Until 2026-12-04 one unavailable FEC counter held back all three: a driver reading
    ``rx_pcs_symbol_err_phy`` as all ones at every poll froze the pre-FEC pair at its last reading
    before that, and the pre-FEC BER became an average since then (a link at 1e-3 read 1.1e-4,
    under the KP4 limit), and after a driver reload a reset at every poll."""

    def __init__(self, health: PipelineHealth | None = None) -> None:
        self.health = health if health is not None else PipelineHealth()
        # each port's last reading, an unavailable FEC counter at its last value (what a reset is judged on)
        self.previous: dict[str, dict[str, float]] = {}
        # each port's baseline of each pair (:data:`PRE_FEC`, :data:`POST_FEC`)
        self.baselines: dict[str, dict[tuple[str, str], tuple[float, float]]] = {}

    def update(self, port: str, stats: dict[str, float]) -> tuple[float, float]:
        """``(pre-FEC BER, post-FEC BER)`` since the port's baselines (NaN at its first reading)."""
        prev = self.previous.get(port)
        bases = self.baselines.setdefault(port, {})
        # a counter not printed (absent) is no all-ones reading: only NaN holds a value back
        unavailable = {name for name in FEC_COUNTERS if np.isnan(stats.get(name, 0.0))}
        kept = {name: prev[name] for name in unavailable if prev is not None and not np.isnan(prev.get(name, np.nan))}
        self.previous[port] = {**stats, **kept}
        ber = []
        for pair in (PRE_FEC, POST_FEC):
            cur = (stats.get(pair[0], np.nan), stats.get(pair[1], np.nan))
            base = bases.get(pair)
            ber.append(np.nan if base is None else _delta_ratio(base, cur))
            # held back whole: the next reading's deltas then span the same polls (a ratio of
            # deltas, no time in it), so an all-ones reading costs that poll's BER, not the next one's
            if base is None or not unavailable & set(pair):
                bases[pair] = cur
        if prev is not None:
            back = [n for n in counters_went_back(prev, stats) if n.endswith("_phy")]
            if back:
                self.health.problem(STAGE, "counter reset", detail=f"{port}: {', '.join(back[:3])}")
        return ber[0], ber[1]


class PfcPauseTotals:
    """Each link's PFC pause time as one counter that only rises: the running total, over polls, of
    each printed priority's own increase (``rx_prioN_pause_duration``, in the counters' unit).

    mlx5 prints a priority's counters only while PFC is enabled on it, so a sum of the printed
    values fell by a priority's lifetime total when PFC was turned off on it and jumped back when it
    was turned on again: with nothing paused, the congestion detector read the jump as pause time
    (a 3-s lifetime back in a 10-s poll: "PFC pause 30 %"). Here a priority not printed adds nothing
    and keeps its last reading: PFC off on it, nothing is paused on it, so printed again its increase
    from that reading is the pause it counted before PFC went off and after it came on, unread, taken
    then. Forgotten, that pause was in no increase of a running total but in a restarted source's sum
    (below): read as one rise at the restart. A priority printed for the first time (PFC enabled on it)
    starts from its reading: its lifetime is not pause. A priority's own decrease is held for one poll, as
    the counters module holds one (:mod:`foreshock.detectors.counters`, "One low reading"): back at
    or above the value before it, the low reading was a bad one and the rise from the value before
    is taken; otherwise it was a reset and the priority goes on from the low reading (its increase
    from the clear to the low reading is not known: nothing taken for it), counted in both cases.
    Judged on the sum instead, one priority's reset read as the whole sum's, and a reset's increase is
    the new value: every other priority's lifetime in one poll.

    A priority not available (NaN, all ones) leaves the link's field NaN for that poll (the
    detectors keep a counter's last value across a NaN) and its own last value kept, so its next
    increase covers both polls; the other priorities' increases are added to the total all the same.

    A link's total starts at the sum of the values of its first poll with every printed priority
    available: its first published value. A fresh one (a source restarted; sources keep no
    checkpoint) starts there too, so the two agree on the level after the same readings. Started at
    a first poll with a priority not available, the total left that priority's lifetime out (its
    first reading later was a baseline): a source restarted after that published the lifetime as
    one jump, which the detectors (they difference the field as a counter, across the restart) read
    as pause time ("PFC pause 200 %" from a 20-s lifetime in a 10-s poll). Until the start the field
    is NaN, as it is for any poll with a priority not available, so nothing published is left out.

    A restarted one publishes no more than the running one as long as every priority it prints was
    printed from the running one's start: a priority first printed later (PFC enabled on it) starts
    at its reading there, and at its lifetime in a restarted one's sum, which the detector then reads
    as one rise (pause time if within the field's bound over the poll, else refused, not taken). A
    priority reset, or not printed at the restart, makes the restarted level lower: a fall, judged by
    the counter rules: a re-base above the field's bound over the poll, under it a reset whose
    increase is the new level (the other priorities' lifetimes read as pause once). Only state kept
    across the restart would tell those apart."""

    def __init__(self, health: PipelineHealth | None = None) -> None:
        self.health = health if health is not None else PipelineHealth()
        # per link: each priority's last reading taken (printed or not since), its low reading held (NaN: none)
        self.last: dict[str, dict[str, tuple[float, float]]] = {}
        self.total: dict[str, float] = {}  # per link: the running total

    def update(self, link: str, stats: Mapping[str, float]) -> float | None:
        """The link's total after this reading (NaN if a printed priority is not available; None if
        no priority is printed: no field, as before)."""
        names = [name for name in stats if _PRIO_PAUSE.match(name)]
        if not names:
            return None  # none printed: each keeps its last reading, as one not printed does
        kept = self.last.get(link, {})
        first = link not in self.total
        # not printed (PFC off: not paused) keeps its last reading; before the start none is in the total
        now = {} if first else {name: entry for name, entry in kept.items() if name not in stats}
        added = 0.0
        unavailable = False
        resets, glitches = [], []
        for name in names:
            value = stats[name]
            last, low = kept.get(name, (math.nan, math.nan))
            if math.isnan(value):
                unavailable = True
                if not math.isnan(last):
                    now[name] = (last, low)  # kept: its next increase covers this poll too
                continue
            if first:
                added += value  # the total starts at the sum of its first poll with all available
            elif math.isnan(last):
                pass  # new (PFC enabled on it, or never read yet): this reading is its baseline
            elif value >= last:
                added += value - last  # (held low: back, a bad reading; the rise from before it)
                if not math.isnan(low):
                    glitches.append(name)
            elif math.isnan(low):
                now[name] = (last, value)  # a decrease: held for the next poll to tell
                continue
            else:
                resets.append(name)  # still under the value before the low one: a reset
                added += max(value - low, 0.0)  # it goes on from the low reading (lower still: re-based)
            now[name] = (value, math.nan)
        self.last[link] = now
        if first and unavailable:
            # not started: a priority left out here would be left out of the level for good, and a
            # restarted source's first sum would hold it (its lifetime read as pause downstream)
            return math.nan
        total = self.total[link] = self.total.get(link, 0.0) + added
        if resets:
            self.health.problem(STAGE, "PFC pause counter reset", len(resets),
                                detail=f"{link}: {', '.join(resets[:3])}")
        if glitches:
            self.health.problem(STAGE, "PFC pause counter read low once, then back", len(glitches),
                                detail=f"{link}: {', '.join(glitches[:3])}")
        return math.nan if unavailable else total


def pfc_pause_duration(stats: Mapping[str, float], lookup: Mapping[str, Any], link: dict[str, float],
                       totals: PfcPauseTotals, name: str) -> None:
    """Set ``link["pfc_pause_duration"]`` to link ``name``'s pause time added up over its priorities
    (``totals``: :class:`PfcPauseTotals`), in the unit the field table gives the name it maps.

    Only priority 3 was read: a fabric whose lossless class is on priority 4 or 5 had its PFC
    storms unseen. Only PFC-enabled priorities are ever paused, so the others add nothing; with
    two lossless classes paused at once the sum counts the overlap twice: up to 8 s per second, one
    per priority (mlx5's ``NUM_PPORT_PRIO``), which the congestion detector's bound allows for
    (:data:`foreshock.detectors.congestion.PFC_PRIORITIES`)."""
    scale = [sc for key, (fld, sc) in lookup.items() if fld.name == "pfc_pause_duration" and _PRIO_PAUSE.match(key)]
    total = totals.update(name, stats)
    if total is not None and scale:
        link["pfc_pause_duration"] = total * scale[0]


def stats_batches(readings: Mapping[str, str], ts: float | Mapping[str, float], health: PipelineHealth | None = None,
                  tracker: FecTracker | None = None, once: set[str] | None = None,
                  pfc: PfcPauseTotals | None = None) -> tuple[SampleBatch, SampleBatch]:
    """``ethtool -S`` outputs (link name -> text) -> (link batch, optic batch).

    ``ts`` stamps every row, or is each link's own time (link name -> time): a poller's, the time
    each interface was read (:meth:`~.polling.EthtoolSource.read_times`), as its counters' rates need.

    ``pfc`` keeps each link's PFC pause total across polls (:class:`PfcPauseTotals`): a poller passes
    its own at every poll. Without one, each call's ``pfc_pause_duration`` is the sum of the printed
    priorities, a fresh total: a priority turned off and on between two calls then reads as pause time.

    With ``once`` (a polling source's, :func:`count_once`), an interface with no counter foreshock
    knows counts the first time only: its driver names its counters otherwise at every poll.

    The optic of each link is its local end, ``<link>#a``. With a ``tracker`` the optic rows
    also carry ``prefec_ber`` computed against the port's previous reading.
    """
    health = health if health is not None else PipelineHealth()
    pfc = pfc if pfc is not None else PfcPauseTotals(health)
    lookup = source_index("ethtool")
    links, optics = BatchBuilder("link"), BatchBuilder("optic")
    for link, text in readings.items():
        stats = parse_ethtool_stats(text, health)
        # counted where foreshock reads them: one a driver reports no value for and nobody reads
        # counted at every poll would be noise (as per-queue lines were)
        missing = [name for name, value in stats.items()
                   if np.isnan(value) and (name in lookup or _PRIO_PAUSE.match(name))]
        if missing:
            health.problem(STAGE, "counter not available (all ones)", len(missing),
                           detail=f"{link}: {', '.join(missing[:3])}")
        values: dict[str, dict[str, float]] = {"link": {}, "optic": {}}
        for name, value in stats.items():
            mapped = lookup.get(name)
            if mapped is not None:
                values[mapped[0].kind][mapped[0].name] = value * mapped[1]
        pfc_pause_duration(stats, lookup, values["link"], pfc, link)
        if tracker is not None:
            values["optic"]["prefec_ber"] = tracker.update(link, stats)[0]
        if not values["link"] and not any(k != "prefec_ber" for k in values["optic"]):
            if count_once(once, link):
                health.problem(STAGE, "no known counters", detail=link)
            continue
        at = ts[link] if isinstance(ts, Mapping) else ts
        links.add(at, link, values["link"])
        optics.add(at, f"{link}#a", values["optic"])
    return links.build(), optics.build()


class EthtoolStatsSource(EthtoolSource):
    """Runs ``ethtool -S IFACE`` for each interface every ``interval`` seconds.

    Yields a link frame and an optic frame (with pre-FEC BER from the second poll on).
    ``interfaces`` maps an interface to its link's name in the topology; a plain list makes
    each interface the link ``<host>/<iface>`` of a derived topology.
    """

    stage = STAGE
    reads = ("link", "optic")
    flag = "-S"
    default_interval = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tracker = FecTracker(self.health)
        self.pfc = PfcPauseTotals(self.health)  # each link's PFC pause total, across polls

    def poll(self) -> list[Frame]:
        readings = self.read_all()  # each interface's rows stamped when it was read, not when the poll began
        link_batch, optic_batch = stats_batches(readings, self.read_times(readings), self.health, self.tracker,
                                                self.counted_once, self.pfc)
        assert self._topology is not None
        return [link_batch.to_frame(self._topology, self.health, STAGE),
                optic_batch.to_frame(self._topology, self.health, STAGE)]
