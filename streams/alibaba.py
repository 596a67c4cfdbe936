"""The Alibaba optical transport pre-FEC BER series, as optic samples with a topology.

``../shared/data/optics/alibaba_prefec_ber.csv`` (alibaba/alibaba-cloud-transport-system)
holds hourly pre-FEC bit error rates of DWDM channel ends::

    device_name,logical_name,item,stats_type,value,och,center_frequency,och_group,time,side,pn
    T3,/1/1/L1,preFecBer,avg,0.00185,1,191400000,1,2000/1/1 00:00,Z,ot1

The entity is the channel end, ``<device><logical port>`` (``T3/1/1/L1``); the value is the
``prefec_ber`` field (a ratio). Each row is one statistic of the hour (``avg``, ``max``,
``min``, ``instant``); one is imported (``avg`` by default: every end has it) and the valid rows
of the others are reported as skipped. Times are read as UTC. A BER is a ratio of at most 0.5
(:data:`MAX_BER`); a row holding bytes that are not UTF-8 is counted (``undecodable bytes``) and
the rest of the file read.

Topology: a channel is identified by its transport plane and optical channel number
(``pn``, ``och``) and has an ``A`` end and a ``Z`` end on two devices. Each channel becomes a
link ``<pn>/och<N>`` from the A device to the Z device (devices are switches of tier
``transport``); its optic at end ``a`` is the A end, at end ``b`` the Z end. A channel with one
end only still gets its link (the missing end's optic has no data). The first valid row (of any
statistic) to name a channel side and an end pairs them: a later row giving that side another
end, or that end another side, is counted and left out (had it been taken, one optic got two
values an hour and another none). Each link carries its plane's FEC limit (``fec_limit_ber``,
:data:`FEC_LIMIT_BY_PLANE`): these soft-decision DWDM transponders correct BERs two orders of
magnitude above a 400G KP4 link's 2.4e-4, so the optics detector's default would call every
channel failing. The links of another plane keep that default, counted as ``link of a plane
without a known FEC limit``.
"""

from __future__ import annotations

import csv
import io
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .samples import SampleBatch

STAGE = "alibaba"
STATS = ("avg", "max", "min", "instant")
FEC_LIMIT_BY_PLANE = {"ot1": 3.7e-2, "ot2": 5.4e-2}
"""Pre-FEC BER at each transport plane's measured OSNR limit (the dataset's ``ber-marign.json``):
the BER at which the transponder's FEC stops correcting."""
MAX_BER = 0.5
"""The largest bit error ratio a row may hold: past 0.5 a receiver does worse than guessing every
bit, which no receiver reports (``7`` is another unit or a shifted column, not a reading)."""
_COLUMNS = ("device_name", "logical_name", "item", "stats_type", "value", "och", "time", "side", "pn")
# Bytes that are not UTF-8 (a cell saved by a Latin-1 editor) are read as the lone surrogates
# U+DC80..U+DCFF ("surrogateescape"), which UTF-8 never decodes to: their rows are told by them
_UNDECODABLE = re.compile(r"[\udc80-\udcff]")


@dataclass
class AlibabaImport:
    """The imported series: samples, topology, end -> optic name, and what was skipped."""

    batch: SampleBatch
    topology: Topology
    optic_of_end: dict[str, str]
    skipped: Counter[str] = field(default_factory=Counter)


def read_alibaba(path: str | Path, stat: str = "avg", health: PipelineHealth | None = None) -> AlibabaImport:
    """Read the CSV; rows with problems (blank, bytes not UTF-8, bad time or value, unknown side, a
    channel side or end named twice, a last line cut without its line feed) are counted."""
    if stat not in STATS:
        raise ValueError(f"stat must be one of {STATS}, got {stat!r}")
    health = health if health is not None else PipelineHealth()
    path = Path(path)
    # utf-8-sig: Excel saves CSV with a BOM; a strict decode stopped the import at one bad byte
    with path.open(newline="", encoding="utf-8-sig", errors="surrogateescape") as fh:
        text = _whole_rows(fh.read(), health)
    undecodable = _UNDECODABLE.search(text) is not None
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None:
        raise ValueError(f"{path}: empty file")
    missing = [c for c in _COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{path}: not the Alibaba pre-FEC BER format (missing columns {missing})")
    col = {name: header.index(name) for name in _COLUMNS}
    rows = list(reader)

    problems: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    stamp_cache: dict[str, float] = {}
    ends: dict[str, int] = {}
    channel_ends: dict[tuple[str, int], dict[str, tuple[str, str]]] = {}
    place_of_end: dict[str, tuple[tuple[str, int], str]] = {}  # end -> (channel, side)
    ts = np.empty(len(rows))
    entity = np.empty(len(rows), dtype=np.int32)
    value = np.empty(len(rows))
    n = 0
    width = len(header)
    for row in rows:
        if undecodable and any(_UNDECODABLE.search(cell) for cell in row):
            problems["undecodable bytes"] += 1
            continue
        if len(row) != width:
            problems["row with wrong column count"] += 1
            continue
        if not any(cell.strip() for cell in row):
            problems["blank row"] += 1
            continue
        kind = row[col["stats_type"]]
        if row[col["item"]] != "preFecBer":
            problems["not a preFecBer row"] += 1
            continue
        device, port, side = row[col["device_name"]], row[col["logical_name"]], row[col["side"]]
        try:
            channel = (row[col["pn"]], int(row[col["och"]]))
        except ValueError:
            problems["bad channel number"] += 1
            continue
        if side not in ("A", "Z"):
            problems["unknown channel side"] += 1
            continue
        text_time = row[col["time"]]
        t = stamp_cache.get(text_time)
        if t is None:
            try:
                t = datetime.strptime(text_time, "%Y/%m/%d %H:%M").replace(tzinfo=timezone.utc).timestamp()
            except ValueError:
                problems["bad timestamp"] += 1
                continue
            stamp_cache[text_time] = t
        try:
            v = float(row[col["value"]])
        except ValueError:
            problems["non-numeric value"] += 1
            continue
        if not np.isfinite(v) or v < 0:
            problems["NaN or negative BER"] += 1
            continue
        if v > MAX_BER:
            problems[f"BER over {MAX_BER}"] += 1
            continue
        # only a valid row pairs a channel side with an end: one stray row had claimed a side first
        # and every genuine row of it was then refused
        end, place = f"{device}{port}", (channel, side)
        if channel_ends.get(channel, {}).get(side, (device, end)) != (device, end):
            problems["channel side claimed by two ends"] += 1
            continue
        if place_of_end.setdefault(end, place) != place:
            problems["end listed under two channel sides"] += 1
            continue
        channel_ends.setdefault(channel, {})[side] = (device, end)
        if kind != stat:
            skipped[f"stats_type {kind or '(blank)'} (imported: {stat})"] += 1
            continue
        ts[n], entity[n], value[n] = t, ends.setdefault(end, len(ends)), v
        n += 1
    for reason, count in problems.items():
        health.problem(STAGE, reason, count)

    topology, optic_of_end = _topology(channel_ends, health)
    names = list(ends)
    batch = SampleBatch("optic", [optic_of_end[e] for e in names], ts[:n], entity[:n], {"prefec_ber": value[:n]})
    return AlibabaImport(batch.sorted_by_time(), topology, {e: optic_of_end[e] for e in names}, skipped)


def _whole_rows(text: str, health: PipelineHealth) -> str:
    """``text`` without a last line that holds data but no line feed: a file cut while it was
    written or copied, whose last cell may be cut with it (``ot1`` read as plane ``ot``, which has
    no FEC limit; ``0.00185`` as ``0.0018``, a BER that looks real). That line is left out and
    counted as ``truncated row``. The published file ends without a line feed too, but on a row of
    empty cells, which holds nothing: that one is read (and counted as a blank row, as before)."""
    end = max(text.rfind("\n"), text.rfind("\r")) + 1
    if end and text[end:].replace(",", "").strip():  # (a header alone is not a cut row)
        health.problem(STAGE, "truncated row",
                       detail="the file's last line has no line feed (cut while written or copied): left out")
        return text[:end]
    return text


def _topology(channel_ends: dict[tuple[str, int], dict[str, tuple[str, str]]],
              health: PipelineHealth) -> tuple[Topology, dict[str, str]]:
    devices = sorted({device for sides in channel_ends.values() for device, _ in sides.values()},
                     key=lambda d: (len(d), d))
    links = []
    optic_of_end: dict[str, str] = {}
    planes_without_limit: dict[str, int] = {}  # plane -> its links
    for (pn, och), sides in sorted(channel_ends.items()):
        name = f"{pn}/och{och}"
        a = sides.get("A", sides.get("Z"))
        z = sides.get("Z", sides.get("A"))
        assert a is not None and z is not None
        link: dict[str, object] = {"name": name, "a": a[0], "b": z[0]}
        if pn in FEC_LIMIT_BY_PLANE:
            link["fec_limit_ber"] = FEC_LIMIT_BY_PLANE[pn]
        else:
            planes_without_limit[pn] = planes_without_limit.get(pn, 0) + 1
        links.append(link)
        if "A" in sides:
            optic_of_end[sides["A"][1]] = f"{name}#a"
        if "Z" in sides:
            optic_of_end[sides["Z"][1]] = f"{name}#b"
    # kept: a plane's channels are real, only its limit is unknown (the optics detector judges
    # them by its default, a 400G KP4 limit far below these transponders')
    health.problem(STAGE, "link of a plane without a known FEC limit", sum(planes_without_limit.values()),
                   detail=f"planes {sorted(planes_without_limit)} are not in FEC_LIMIT_BY_PLANE: their links "
                          "are judged by the optics detector's fec_limit_ber")
    topology = Topology.from_dict({
        "cluster": "alibaba-transport",
        "rows": [], "racks": [], "nodes": [],
        "switches": [{"name": d, "tier": "transport"} for d in devices],
        "links": links,
    })
    return topology, optic_of_end
