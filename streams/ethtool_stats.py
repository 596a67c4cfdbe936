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
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from foreshock.fields import source_index
from foreshock.frames import Frame
from foreshock.health import PipelineHealth

from .polling import EthtoolSource, count_once
from .samples import BatchBuilder, SampleBatch

STAGE = "ethtool"
# mlx5 prints PFC counters for every priority; the lossless (RoCE) class is on 3 by default, not
# always: ``pfc_pause_duration`` is the sum over priorities (the field table names priority 3)
_PRIO_PAUSE = re.compile(r"^rx_prio[0-7]_pause_duration$")
# ``name: value``; drivers that print per-queue counters (bnxt_en) prefix them ``[N]: ``
_STAT = re.compile(r"^\s*(?:\[(\d+)\]:\s*)?([^\s:\[][^:]*?):\s*(\S+)\s*$")


def parse_ethtool_stats(text: str, health: PipelineHealth | None = None) -> dict[str, float]:
    """All counters of one ``ethtool -S`` output, by name (non-numeric values counted, left out).
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
            queue, name = m.group(1), m.group(2)
            stats[f"[{queue}]{name}" if queue else name] = float(int(m.group(3)))
        except ValueError:
            bad += 1
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


class FecTracker:
    """Keeps each port's previous reading to fill ``prefec_ber`` on the next one."""

    def __init__(self, health: PipelineHealth | None = None) -> None:
        self.health = health if health is not None else PipelineHealth()
        self.previous: dict[str, dict[str, float]] = {}

    def update(self, port: str, stats: dict[str, float]) -> tuple[float, float]:
        prev = self.previous.get(port)
        self.previous[port] = stats
        if prev is None:
            return np.nan, np.nan
        back = [n for n in counters_went_back(prev, stats) if n.endswith("_phy")]
        if back:
            self.health.problem(STAGE, "counter reset", detail=f"{port}: {', '.join(back[:3])}")
        return fec_ber(prev, stats)


def pfc_pause_duration(stats: Mapping[str, float], lookup: Mapping[str, Any], link: dict[str, float]) -> None:
    """Set ``link["pfc_pause_duration"]`` to the pause time summed over every priority's
    ``rx_prioN_pause_duration``, in the unit the field table gives the name it maps.

    Only priority 3 was read: a fabric whose lossless class is on priority 4 or 5 had its PFC
    storms unseen. Only PFC-enabled priorities are ever paused, so the others add nothing; with
    two lossless classes paused at once the sum counts the overlap twice (a ratio over 1 is then
    possible; the congestion detector only compares it to a threshold)."""
    names = [name for name in stats if _PRIO_PAUSE.match(name)]
    scale = [sc for key, (fld, sc) in lookup.items() if fld.name == "pfc_pause_duration" and _PRIO_PAUSE.match(key)]
    if names and scale:
        link["pfc_pause_duration"] = sum(stats[name] for name in names) * scale[0]


def stats_batches(readings: Mapping[str, str], ts: float, health: PipelineHealth | None = None,
                  tracker: FecTracker | None = None, once: set[str] | None = None) -> tuple[SampleBatch, SampleBatch]:
    """``ethtool -S`` outputs (link name -> text) -> (link batch, optic batch).

    With ``once`` (a polling source's, :func:`count_once`), an interface with no counter foreshock
    knows counts the first time only: its driver names its counters otherwise at every poll.

    The optic of each link is its local end, ``<link>#a``. With a ``tracker`` the optic rows
    also carry ``prefec_ber`` computed against the port's previous reading.
    """
    health = health if health is not None else PipelineHealth()
    lookup = source_index("ethtool")
    links, optics = BatchBuilder("link"), BatchBuilder("optic")
    for link, text in readings.items():
        stats = parse_ethtool_stats(text, health)
        values: dict[str, dict[str, float]] = {"link": {}, "optic": {}}
        for name, value in stats.items():
            mapped = lookup.get(name)
            if mapped is not None:
                values[mapped[0].kind][mapped[0].name] = value * mapped[1]
        pfc_pause_duration(stats, lookup, values["link"])
        if tracker is not None:
            values["optic"]["prefec_ber"] = tracker.update(link, stats)[0]
        if not values["link"] and not any(k != "prefec_ber" for k in values["optic"]):
            if count_once(once, link):
                health.problem(STAGE, "no known counters", detail=link)
            continue
        links.add(ts, link, values["link"])
        optics.add(ts, f"{link}#a", values["optic"])
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

    def poll(self) -> list[Frame]:
        now = self.clock()
        link_batch, optic_batch = stats_batches(self.read_all(), now, self.health, self.tracker, self.counted_once)
        assert self._topology is not None
        return [link_batch.to_frame(self._topology, self.health, STAGE),
                optic_batch.to_frame(self._topology, self.health, STAGE)]
