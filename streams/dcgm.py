"""dcgm-exporter: parse its Prometheus text exposition into gpu samples, and scrape it live.

dcgm-exporter (port 9400, every 30 s by default) prints one line per GPU and DCGM field::

    DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-...",device="nvidia0",modelName="Tesla T4",Hostname="node7"} 25

Metric names map to foreshock fields through the field table (``dcgm`` column, aliases and
``*scale`` to base units), so ``DCGM_FI_DEV_SM_CLOCK 300`` becomes ``sm_clock = 3.0e8`` Hz and
the energy counter's millijoules become joules. A field the page serves under several of its
names (``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, both in the exporter's
profiling set) is read from the first the table lists (``source_preference``). The entity is
``<Hostname>/gpu<gpu>`` (``hostname`` is accepted too: the label was renamed in 2026; without
either — an exporter run with ``--no-hostname`` — the host of the ``instance`` label Prometheus
adds to a federated series, else the scrape target's host). Bad input is counted in :class:`~foreshock.health.PipelineHealth` under stage
``dcgm`` and never raises: malformed lines (a timestamp too long for an int64 among them),
non-numeric values, NaN, the "not supported" sentinels, series without a ``gpu`` label or with an
index past :data:`~foreshock.streams.samples.MAX_GPU_INDEX`, lines stamped far ahead of the scrape
(:data:`MAX_AHEAD_S`), and metrics the table does not map (ignored). A scrape
(:meth:`DcgmScrapeSource.scrape`) takes at most the source's ``timeout`` in all, from resolving the
exporter's host name to the page's last byte, and brings at most :data:`MAX_PAGE_BYTES`: urllib's
timeout bounds each socket operation only, so an exporter (or a proxy) sending its page a byte at a
time held a poll for hours, and a body without end was held in memory as it grew. Either is counted
(``scrape too slow``, ``page too large``) and what came of the page is dropped; so is a page that
names no GPU at all (``no GPU rows in page``: empty, comments only, every line refused).

MIG. With MIG enabled, the exporter emits one series per GPU instance, labelled
``GPU_I_ID``/``GPU_I_PROFILE`` (``3g.40gb``). foreshock's entity is the *physical* GPU — heat,
power, clocks and throttling happen there — so instance series are folded into their GPU:

* device-level fields (temperature, power, energy, clocks, throttle reasons, ECC, ...) repeat
  the same value on every instance series; the GPU gets that value once, never a sum — an
  energy counter is not counted seven times;
* per-instance fields (utilisation: ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``) differ by instance;
  the GPU gets their mean weighted by each instance's compute slices (the ``N`` of ``Ng.``):
  the busy fraction of the allocated compute.

One rule does both: per (GPU, field), identical values are taken as they are, differing ones
are averaged with slice weights (weight 1 for a series without MIG labels). Differing values
from series *without* MIG labels (two exporters on one GPU, say) are averaged the same way and
counted as ``conflicting duplicate series``. A code or a bitmask is never averaged (the mean of
XIDs 79 and 47 is XID 63, of throttle masks 0x80 and 0 the hw_thermal bit 0x40): differing
bitmasks give the bits any of them sets, differing codes the largest, a code one series did report.
"""

from __future__ import annotations

import http.client
import logging
import math
import re
import time
import urllib.error
import urllib.request
from array import array
from collections import Counter, deque
from functools import lru_cache
from typing import Any, Callable
from urllib.parse import urlparse

import numpy as np

from foreshock.fields import field_names, get_field, source_index, source_preference
from foreshock.frames import Frame
from foreshock.guard import MAX_AHEAD_S
from foreshock.health import PipelineHealth
from foreshock.topology import UNKNOWN, Topology

from .polling import GpuBoards, PollingSource, count_once, not_yet_told, steady_unlisted
from .redfish import READ_CHUNK_BYTES, _AnswerLate, _DeadlineHTTPHandler, _DeadlineHTTPSHandler, _DeadlineRequest
from .samples import MAX_GPU_INDEX, SampleBatch, gpu_entity, gpu_topology, split_gpu_entity

STAGE = "dcgm"

log = logging.getLogger("foreshock.dcgm")

MAX_PAGE_BYTES = 256 << 20
"""The most one scrape may bring (:attr:`DcgmScrapeSource.max_page_bytes`): a Prometheus
``/federate`` page of a 16,384-GPU cluster is 58 MB (262,000 series); a longer body
(a wrong URL serving a stream, a broken proxy) is refused, not held in memory."""

SCRAPE_TOO_SLOW = "scrape too slow"
"""The problem counted for a scrape whose page was not whole within the source's ``timeout``."""
PAGE_TOO_LARGE = "page too large"
"""The problem counted for a page longer than :data:`MAX_PAGE_BYTES`."""
GPU_DISAPPEARED = "GPU disappeared from page"
"""The problem counted for a GPU served at the previous page read and absent from this one (the
exporter's face of a GPU fallen off the bus, XID 79, which nvidia-smi and NVML count as ``GPU lost or
requires reset``; or its node or exporter gone from a federation): once each time it goes, not at
every page while it stays away, and named in the log each time (as ``port disappeared`` of an IB
port). It is logged, not counted, when it is back. The first page after polls that read none judges
no GPU gone (a federation back from a restart serves its targets as it scrapes them again): one
still absent from the page after it is counted then."""
NO_ROWS = "no GPU rows in page"
"""The problem counted for a page served (HTTP 200) that gave no GPU row: empty, comments only, or
every line refused. A poll that read nothing is not a quiet one (nvidia-smi's ``NO_ROWS`` alike)."""

UNMAPPED_NAMED = 5
"""Unmapped metric names the "unmapped metric ignored" log line names; it counts the rest."""

UNLISTED_POLLS = 3
"""Consecutive polls that must serve GPUs a derived topology lacks before the source takes them in
(``DcgmScrapeSource.takes_in_new_gpus``): one odd scrape rebuilds nothing."""

FORGET_AFTER_S = 24 * 3600.0
"""Seconds a host may go without any of its GPUs served before a derived topology that
follows the hardware drops it (``DcgmScrapeSource.forget_after_s``; 0: never). Long enough that a
node down for a repair (minutes to hours) keeps its place and its learnt state; short enough that a
cluster whose nodes come and go under new hostnames (autoscaling, recycled node pools) does not
grow its topology, state and /metrics without end. Measured on a monotonic clock
(``DcgmScrapeSource.silence_clock``), not the wall clock the rows are stamped with."""

# A line stamped more than the guard's MAX_AHEAD_S past its scrape is refused (``future
# timestamp``): a GPU's row takes the newest stamp of its lines, and the source leaves out every
# later row no newer than the last it read, so one line stamped in microseconds (a year ahead in
# milliseconds) hid its GPU for good.

STAMP_DIGITS = 19
"""Most digits of a line's timestamp: Prometheus stamps are int64 milliseconds (19 digits at most).
Longer ones are malformed lines, not numbers: past 308 digits ``/ 1000`` overflows a float, and
``int()`` refuses strings past 4300 digits."""

TAKEN_MAX = 64
"""Topologies a following source keeps for :meth:`DcgmScrapeSource.taken_topologies` until they
are taken (``foreshock watch`` takes them at every frame); past that the oldest go."""

TOLD_MAX = 4096
"""GPU names the source remembers having logged as missing from its topology; past that it forgets
them (and may log one again): the set stays bounded over weeks of churn."""

NOT_SUPPORTED_INT64_MIN = 0x7FFFFFFFFFFFFFF0
"""DCGM_FT_INT64_BLANK and its siblings (not found / not supported / not permissioned)."""
_INT64_SENTINEL_FLOOR = float(NOT_SUPPORTED_INT64_MIN)  # = 2**63 as a float64
_FP64_BLANK = 140737488355328.0  # DCGM_FT_FP64_BLANK = 2**47; +1, +2, +3 for the others
_INT32_BLANK = 0x7FFFFFF0  # DCGM_FT_INT32_BLANK; +1, +2, +3 likewise

_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,|$)')
_SLICES = re.compile(r"^(\d+)g\.")


def is_not_supported(value: float) -> bool:
    """True for DCGM's blank / not-supported sentinels (int64, int32 and fp64 variants)."""
    return (value >= _INT64_SENTINEL_FLOOR
            or _FP64_BLANK <= value <= _FP64_BLANK + 3
            or _INT32_BLANK <= value <= _INT32_BLANK + 3)


def _is_int(text: str) -> bool:
    digits = text.removeprefix("-")
    return digits.isascii() and digits.isdigit()  # str.isdigit alone accepts "²", which int() rejects


def _labels(block: str) -> dict[str, str] | None:
    """Parse ``a="x",b="y"``; None when the block is malformed."""
    labels: dict[str, str] = {}
    pos = 0
    end = len(block)
    while pos < end:
        m = _LABEL.match(block, pos)
        if m is None:
            return None if block[pos:].strip() else labels
        labels[m.group(1)] = m.group(2)
        pos = m.end()
        if m.group(3) == "" and pos < end:
            return None
    return labels


@lru_cache(maxsize=1)
def _metric_cells() -> dict[str, tuple[int, float, int]]:
    """Metric name -> (its field's column among the gpu fields, scale to base units, its place
    among the field's names): one lookup a line."""
    column = {name: i for i, name in enumerate(field_names("gpu"))}
    preference = source_preference("dcgm")
    return {name: (column[field.name], scale, preference[name]) for name, (field, scale) in source_index("dcgm").items()}


def _target_host(instance: str | None) -> str | None:
    """The host of a Prometheus ``instance`` label (``node7:9400``, ``[fd00::7]:9400``)."""
    if not instance:
        return None
    host = instance.rsplit("]", 1)[0].lstrip("[") if instance.startswith("[") else instance.rsplit(":", 1)[0]
    return host or None


def _series(block: str, default_host: str, entities: dict[str, int],
            uuids: dict[str, str] | None) -> tuple[int, float, int, str] | str:
    """A label block -> (entity index, MIG slice weight, is-MIG, entity name) or the problem that
    rejects it; with ``uuids``, notes the GPU's ``UUID`` label there ("" where its series disagree)."""
    labels = _labels(block)
    if labels is None:
        return "malformed labels"
    gpu = labels.get("gpu", "")
    if not gpu.strip():
        return "series without a gpu label"
    if not _is_int(gpu) or gpu.startswith("-"):
        return "bad GPU index"  # gpu="-1", gpu="zero": a label, but no index (it read as none until 2026-12-06)
    digits = gpu.lstrip("0")  # (int() refuses strings past 4300 digits, leading zeros included)
    if len(digits) > len(str(MAX_GPU_INDEX)) or int(digits or "0") > MAX_GPU_INDEX:
        return "bad GPU index"  # a derived topology would list every GPU up to it
    host = labels.get("Hostname") or labels.get("hostname") or _target_host(labels.get("instance")) or default_host
    is_mig = "GPU_I_ID" in labels or "GPU_I_PROFILE" in labels
    slices = _SLICES.match(labels.get("GPU_I_PROFILE", ""))
    name = gpu_entity(host, int(gpu))
    entity = entities.setdefault(name, len(entities))
    if uuids is not None and (uuid := labels.get("UUID")):
        # MIG instance series carry their GPU's UUID; two differing ones name no one board
        uuids[name] = uuid if uuids.get(name, uuid) == uuid else ""
    return entity, float(slices.group(1)) if slices else 1.0, int(is_mig), name


def parse_dcgm_text(text: str, ts: float, health: PipelineHealth | None = None,
                    default_host: str = "localhost", once: set[str] | None = None,
                    uuids: dict[str, str] | None = None) -> SampleBatch:
    """Parse one dcgm-exporter scrape into a gpu batch (one row per GPU).

    ``ts`` is the scrape time, used unless lines carry their own (millisecond) timestamps. A line
    stamped more than :data:`MAX_AHEAD_S` after it is refused (``future timestamp``).

    ``once`` is what a source polling the same exporter has counted already. A metric foreshock
    does not read, and a field a GPU does not support (the not-supported sentinel), are facts
    about the exporter's configuration and the GPU, not bad input: with ``once`` each counts the
    first scrape it appears in (the metric by name, the sentinel by metric and GPU: not by label
    block, which a Kubernetes exporter changes with every pod on the GPU), not every scrape —
    a default dcgm-exporter page can have more such lines than readings, and counted at every
    poll they would keep ForeshockInputProblems firing on a healthy exporter.

    ``uuids``, when given, is filled with each GPU's ``UUID`` label (GPU name -> UUID; "" where
    its series name different ones): read once per distinct label block, not per line.
    """
    health = health if health is not None else PipelineHealth()
    index = _metric_cells()
    names = field_names("gpu")
    entities: dict[str, int] = {}
    ent, fld = array("i"), array("i")
    val, weight, stamp = array("d"), array("d"), array("d")
    mig, rank = array("b"), array("b")
    problems: Counter[str] = Counter()
    unmapped: Counter[str] = Counter()
    seen: dict[str, tuple[int, float, int, str] | str] = {}
    latest = ts + MAX_AHEAD_S
    ahead = 0.0  # the furthest a refused line was stamped ahead of ts, for the log line

    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        # str methods, not a regex: this loop runs once per series of a cluster-wide scrape.
        brace = line.find("{")
        if brace >= 0:
            close = line.rfind("}")
            if close < brace:
                problems["malformed line"] += 1
                continue
            name, block, tail = line[:brace], line[brace + 1:close], line[close + 1:].split()
        else:
            head = line.split(None, 1)
            name, block, tail = head[0], "", head[1].split() if len(head) > 1 else []
        if not name or not 1 <= len(tail) <= 2 or \
                (len(tail) == 2 and not (_is_int(tail[1]) and len(tail[1].removeprefix("-")) <= STAMP_DIGITS)):
            problems["malformed line"] += 1
            continue
        mapped = index.get(name)
        if mapped is None:
            unmapped[name] += 1
            continue
        series = seen.get(block)
        if series is None:
            # Label blocks repeat for every metric of a GPU: parse each distinct one once.
            series = seen[block] = _series(block, default_host, entities, uuids)
        if isinstance(series, str):
            problems[series] += 1
            continue
        try:
            value = float(tail[0])
        except ValueError:
            problems["non-numeric value"] += 1
            continue
        if value != value:
            problems["NaN value"] += 1
            continue
        if value in (np.inf, -np.inf):
            problems["infinite value"] += 1
            continue
        if is_not_supported(value):
            if count_once(once, f"{name}@{series[3]}"):
                problems["not-supported sentinel dropped"] += 1
            continue
        at = int(tail[1]) / 1000.0 if len(tail) == 2 else ts
        if at > latest:
            problems["future timestamp"] += 1
            ahead = max(ahead, at - ts)
            continue
        column, scale, preferred = mapped
        ent.append(series[0])
        fld.append(column)
        val.append(value * scale)
        weight.append(series[1])
        stamp.append(at)
        mig.append(series[2])
        rank.append(preferred)

    details = {"future timestamp": f"up to {ahead:.0f} s after the scrape (limit {MAX_AHEAD_S:g} s): the line left "
                                   "out (a clock ahead, or a stamp not in milliseconds)",
               "bad GPU index": f"a gpu label that is no index from 0 to {MAX_GPU_INDEX}: the series left out"}
    for reason, count in problems.items():
        health.problem(STAGE, reason, count, detail=details.get(reason, ""))
    if once is not None:
        unmapped = Counter({name: 1 for name in unmapped if count_once(once, name)})
    if unmapped:
        named = sorted(unmapped)[:UNMAPPED_NAMED]
        rest = len(unmapped) - len(named)  # the log line says how many names it leaves out
        health.problem(STAGE, "unmapped metric ignored", sum(unmapped.values()),
                       detail=", ".join(named) + (f" +{rest} more" if rest else ""))
    return _fold(names, list(entities), ent, fld, val, weight, stamp, mig, rank, health)


def split_pages(text: str) -> list[str]:
    """The scrapes of a file holding several, one after another (``while sleep 30; do curl
    host:9400/metrics >> gpus.prom; done``): a page starts at each repeat of the text's first
    ``# HELP`` line, as every dcgm-exporter page opens with the same family. A text without one,
    or with it once, is one page (a series repeated within a page stays a duplicate to count)."""
    start = text.find("# HELP ")
    if start < 0:
        return [text]
    first = text[start:text.find("\n", start) + 1 or len(text)]
    cuts = [0]
    at = text.find("\n" + first, start)
    while at >= 0:
        cuts.append(at + 1)
        at = text.find("\n" + first, at + 1)
    return [text[a:b] for a, b in zip(cuts, cuts[1:] + [len(text)])]


def page_gpus(page: str, default_host: str = "localhost") -> set[str]:
    """The GPUs (``host/gpuN``) a page's series name, by the rule :func:`parse_dcgm_text` names
    them with, whatever their metric or value: what tells one host's page from another's."""
    gpus: set[str] = set()
    seen: set[str] = set()
    for raw in page.splitlines():
        line = raw.strip()
        brace = line.find("{")
        if not line or line[0] == "#" or brace < 0:
            continue
        block = line[brace + 1:line.rfind("}")]
        if block not in seen:  # label blocks repeat for every metric of a GPU: each read once
            seen.add(block)
            series = _series(block, default_host, {}, None)
            if not isinstance(series, str):
                gpus.add(series[3])
    return gpus


def scrape_rounds(pages: list[str], default_host: str = "localhost") -> list[int]:
    """Each page's scrape round in a file appended by one loop over several hosts' exporters
    (``for h in n1 n2; do curl $h:9400/metrics; done >> gpus.prom`` every 30 s): a page per host
    per round, all of a round taken together, so consecutive pages of distinct hosts share a round.
    A page whose host the round has had already starts the next round (the same exporter scraped
    again), and a page naming no GPU (an exporter up without one) is a round of its own: kept in
    the round, it had merged the pages before and after it, one host's scrapes 30 s apart put at
    one time. Only for a file said to be such a loop (``import --round-of-hosts``): one endpoint
    answering for different hosts in turn (a load-balanced Service, an exporter container restarted
    under a new Hostname) writes the same pages, each its own scrape."""
    if len(pages) < 2:  # (one page: one round, without reading it twice)
        return [0] * len(pages)
    rounds: list[int] = []
    had: set[str] = set()  # the hosts of the round so far
    now = 0
    for page in pages:
        hosts = {gpu.rsplit("/", 1)[0] for gpu in page_gpus(page, default_host)}
        if rounds and (not hosts or not had or hosts & had):
            now += 1
            had = set()
        had |= hosts
        rounds.append(now)
    return rounds


def _fold(names: tuple[str, ...], entities: list[str], ent: array, fld: array, val: array,
          weight: array, stamp: array, mig: array, rank: array, health: PipelineHealth) -> SampleBatch:
    """Fold (GPU, field, value) cells into one row per GPU (the MIG rule in the module docstring),
    from each field's preferred name where the page serves it under several."""
    n_ent, n_fld = len(entities), len(names)
    if not len(ent):
        return SampleBatch.empty("gpu")
    e = np.frombuffer(ent, dtype=np.int32)
    key = e.astype(np.int64) * n_fld + np.frombuffer(fld, dtype=np.int32)
    v = np.frombuffer(val, dtype=np.float64)
    w = np.frombuffer(weight, dtype=np.float64)
    m = np.frombuffer(mig, dtype=np.int8)
    s = np.frombuffer(stamp, dtype=np.float64)
    size = n_ent * n_fld
    r = np.frombuffer(rank, dtype=np.int8)
    if r.any():
        best = np.full(size, np.iinfo(np.int8).max, dtype=np.int8)
        np.minimum.at(best, key, r)
        first = r == best[key]
        e, key, v, w, m, s = e[first], key[first], v[first], w[first], m[first], s[first]
    lo = np.full(size, np.inf)
    hi = np.full(size, -np.inf)
    np.minimum.at(lo, key, v)
    np.maximum.at(hi, key, v)
    wsum = np.bincount(key, weights=w, minlength=size)
    wmean = np.bincount(key, weights=w * v, minlength=size) / np.where(wsum > 0, wsum, 1.0)
    cells = np.where(wsum > 0, np.where(lo == hi, lo, wmean), np.nan).reshape(n_ent, n_fld)
    _fold_codes_and_bitmasks(names, key, v, hi, cells)

    differing = np.zeros(size, dtype=bool)
    differing[key] = lo[key] != hi[key]
    plain = m == 0
    conflicts = np.unique(key[plain & differing[key]])
    if len(conflicts):
        health.problem(STAGE, "conflicting duplicate series", len(conflicts))

    ts = np.full(n_ent, -np.inf)
    np.maximum.at(ts, e, s)
    # GPUs whose every value was rejected have no row (their label block was still seen).
    has = np.bincount(e, minlength=n_ent) > 0
    cells, ts = cells[has], ts[has]
    columns = {name: cells[:, i] for i, name in enumerate(names) if not np.isnan(cells[:, i]).all()}
    kept = [name for name, keep in zip(entities, has) if keep]
    return SampleBatch("gpu", kept, ts, np.arange(len(kept), dtype=np.int32), columns)


def _fold_codes_and_bitmasks(names: tuple[str, ...], key: np.ndarray, v: np.ndarray, hi: np.ndarray,
                             cells: np.ndarray) -> None:
    """In ``cells`` (GPU x field), differing values of a code field become the largest (``hi``),
    of a bitmask field the bits any of them sets; identical ones stay as they are."""
    n_fld = len(names)
    for f, name in enumerate(names):
        field = get_field(name)
        if not field.whole:  # (the fields whose values are whole numbers: codes and bitmasks)
            continue
        column = cells[:, f]
        differing = np.flatnonzero((column == column) & (column != hi[f::n_fld]))  # the mean of differing values
        if not len(differing):
            continue
        if field.unit != "bitmask":
            column[differing] = hi[f::n_fld][differing]
            continue
        mine = key % n_fld == f
        rows, values = key[mine] // n_fld, v[mine]
        whole = (values >= 0) & (values < 2.0 ** 53) & (values == np.floor(values))  # the rest: the guard's to count
        bits = np.zeros(len(column), dtype=np.int64)
        np.bitwise_or.at(bits, rows[whole], values[whole].astype(np.int64))
        column[differing] = bits[differing]


class DcgmScrapeSource(PollingSource):
    """Scrapes a dcgm-exporter ``/metrics`` URL every ``interval`` seconds, yielding gpu frames.

    The topology is the one given, or derived from the first scrape that names any GPU. A GPU
    the topology lacks is counted as an unknown entity (``unknown gpu entity``), and its name is
    logged once, saying to add it to the topology file (a given topology) or to restart (a derived
    one). With :attr:`takes_in_new_gpus` (``foreshock watch``, which moves its state onto the new
    topology) and a derived topology, a GPU unlisted in :data:`UNLISTED_POLLS` consecutive polls
    (a node replaced or added: new hostnames) is taken in instead: :attr:`topology` becomes a new
    one (:func:`grown_topology`) from that poll's frame on. GPUs no longer served stay listed (a node
    down for repair keeps its place and its learnt state) until none of their host's GPUs has been
    served for :attr:`forget_after_s` seconds (:data:`FORGET_AFTER_S`, 0: never) while the exporter
    served pages, on :attr:`silence_clock` (monotonic: a wall clock stepped forward is no silence):
    the host is then dropped (:func:`shrunk_topology`, logged with how long it was silent), so a
    cluster whose nodes come and go under new hostnames does not grow its topology without end. A
    host served again after that is a new one, taken in as above. A given topology never changes.
    :meth:`taken_topologies` tells each topology taken, in order, even one no frame was mapped on.

    The URL may be a Prometheus server's ``/federate?match[]={__name__=~"DCGM_.*"}``: every
    series keeps its ``Hostname`` label and carries the time Prometheus scraped it, so one source
    reads every GPU the Prometheus server scrapes. A sample served again (polled faster than
    Prometheus scrapes the exporter) is not new telemetry: a GPU whose row is stamped as the last
    one read is left out of the frame, not counted as a problem. An older row (the wall clock
    stepped back) is passed on, for the input guard to count.

    A metric foreshock does not read, and a GPU's not-supported sentinel, count once each over the
    source's life (``parse_dcgm_text``'s ``once``), so a healthy exporter's rate of input problems
    is zero.

    With :attr:`reads_boards` (on unless turned off) the source follows each listed GPU's ``UUID``
    label and carries it as the ``board_id`` field: one that changes from a known UUID to another
    (a board swapped in the slot; a first UUID or a missing label is no change) is logged and
    counted here (:class:`~foreshock.streams.polling.GpuBoards`), and the pipeline starts that
    GPU's detector state afresh from the new board's first row.
    """

    stage = STAGE
    reads = ("gpu",)

    def __init__(self, url: str, interval: float = 30.0, topology: Topology | None = None,
                 health: PipelineHealth | None = None, max_polls: int | None = None,
                 timeout: float = 10.0, default_host: str | None = None) -> None:
        super().__init__(interval, health, max_polls)
        self.url = url
        self.timeout = timeout
        self.max_page_bytes = MAX_PAGE_BYTES
        # connections whose lookup, connect and every read end by the scrape's deadline (redfish's)
        self._opener = urllib.request.build_opener(_DeadlineHTTPHandler(), _DeadlineHTTPSHandler(None),
                                                   _SameDeadlineRedirects)
        self.default_host = default_host or urlparse(url).hostname or "localhost"
        self._topology = topology
        self._derived = topology is None
        # per GPU name the topology lists, the newest row read; only listed GPUs: every name ever
        # served (an unknown GPU's rows are refused anyway) made it grow for as long as nodes churn
        self._last_ts: dict[str, float] = {}
        self.takes_in_new_gpus = False
        self.forget_after_s = FORGET_AFTER_S
        self._unlisted_polls: dict[str, int] = {}  # GPUs the topology lacks: polls in a row serving them
        # per node slot of the topology, when a GPU of it was last served (a derived one), and when
        # the exporter last served a page at all: on silence_clock. A wall clock stepped forward
        # (NTP, a VM resumed) made every host not served in the next poll silent for the step (h20)
        self.silence_clock: Callable[[], float] = time.monotonic
        self._heard = np.empty(0)
        self._served_at = math.nan
        self._out = False  # a poll since then served no page (the exporter down, or empty)
        self._told: set[str] = set()  # names logged as missing from the topology
        self._taken: deque[Topology] = deque(maxlen=TAKEN_MAX)  # the topologies taken since taken_topologies()
        self.reads_boards = True
        self._boards = GpuBoards(self.health, STAGE)  # per listed GPU, the UUID last served
        self._served: set[str] = set()  # the listed GPUs the last page read served
        self._gone: set[str] = set()  # listed GPUs counted as disappeared and not served since
        self._unread = False  # a poll since the last page read read none (down, or an empty page)

    def scrape(self) -> str | None:
        """The exporter's page, or None (counted) when it could not be had. A body cut short
        (``IncompleteRead``), a garbled status line (``BadStatusLine``: both ``HTTPException``,
        not ``OSError``) or a charset Python does not know (``LookupError``) is a failed scrape
        like a refused connection: raised instead, the poll failed without the outage being
        noted, and the hosts missing from the first page after a long one were forgotten at once.

        The whole scrape ends by ``timeout`` (the name's lookup, connecting, every read: redfish's
        deadline-bound connections) and brings at most :attr:`max_page_bytes`; past either, what
        came is dropped and counted (:data:`SCRAPE_TOO_SLOW`, :data:`PAGE_TOO_LARGE`)."""
        began = time.monotonic()
        request = _DeadlineRequest(self.url, {}, began + self.timeout)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                body = self._body(response)
                charset = response.headers.get_content_charset() or "utf-8"
            if body is None:
                return None
            return body.decode(charset, errors="replace")
        except _AnswerLate as late:  # (a lookup not answered in time among them)
            self.health.problem(STAGE, SCRAPE_TOO_SLOW, detail=(
                f"{self.url}: {late.received} bytes in {time.monotonic() - began:.3g} s, {late.what} not whole "
                f"within the {self.timeout:g} s timeout: the page dropped"))
            return None
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException, LookupError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
                # the connect or a TLS handshake given up at the deadline (the socket's timeout is the time left)
                self.health.problem(STAGE, SCRAPE_TOO_SLOW, detail=(
                    f"{self.url}: {reason} after {time.monotonic() - began:.3g} s (timeout {self.timeout:g} s)"))
                return None
            self.health.problem(STAGE, "scrape failed", detail=f"{self.url}: {exc!r}")
            return None

    def _body(self, response: http.client.HTTPResponse) -> bytearray | None:
        """The page, read in pieces (each ending by the scrape's deadline) while it stays under
        :attr:`max_page_bytes`; None (counted) past that."""
        cap = self.max_page_bytes
        length = response.headers.get("Content-Length", "")
        if length.strip().isdigit() and int(length) > cap:
            self.health.problem(STAGE, PAGE_TOO_LARGE, detail=f"{self.url}: {int(length)} bytes (at most {cap}): "
                                                              "not read")
            return None
        body = bytearray()  # grown in place: a list of pieces joined at the end held the page twice
        while piece := response.read1(READ_CHUNK_BYTES):
            if len(body) + len(piece) > cap:
                self.health.problem(STAGE, PAGE_TOO_LARGE, detail=f"{self.url}: more than {cap} bytes: the page "
                                                                  "dropped")
                return None
            body += piece
        if response.length:  # (read1 ends at the connection's end without a word where read() raised)
            raise http.client.IncompleteRead(bytes(body), response.length)
        return body

    def poll(self) -> list[Frame]:
        now = self.clock()
        text = self.scrape()
        if text is None:
            self._out = self._unread = True
            return []
        uuids: dict[str, str] | None = {} if self.reads_boards else None
        batch = parse_dcgm_text(text, now, self.health, self.default_host, self.counted_once, uuids)
        if not len(batch):
            # the exporter answered, but no GPU was read: counted, or a page emptied (a crashed DCGM,
            # a federation that lost its targets) was as quiet as a healthy one
            self.health.problem(STAGE, NO_ROWS, detail=f"{self.url}: a page of {len(text)} characters gave no GPU "
                                                       "row (empty, comments only, or every line refused)")
            self._out = self._unread = True
            return []
        if self._topology is None:
            self._topology = gpu_topology([batch], self.cluster)
            self._served_at = self.silence_clock()
            self._heard = np.full(self._topology.size("node"), self._served_at)
        else:
            self._follow(batch, self.silence_clock())
        self._note_gone(batch, self._topology)
        if uuids:
            batch = self._boards.tag(batch, uuids, self._topology)
        batch = self._new_rows(batch, self._topology)
        return [batch.to_frame(self._topology, self.health, STAGE)] if len(batch) else []

    def _note_gone(self, batch: SampleBatch, topology: Topology) -> None:
        """Count (:data:`GPU_DISAPPEARED`) and log each listed GPU the last page read served and this
        one does not, once as it goes; log each one counted that is served again. A poll that read no
        page says nothing of any GPU: it is not here (the exporter down is ``scrape failed``); nor does
        the first page read after it (:data:`GPU_DISAPPEARED`), whose absent GPUs stay to be judged."""
        slots = topology.slots("gpu", batch.entities)
        served = {name for name, slot in zip(batch.entities, slots) if slot >= 0}
        gone = sorted(self._served - served) if not self._unread else []
        back = sorted(self._gone & served)
        listed = set(topology.gpus) if self._unread else set()  # (a host forgotten meanwhile is no longer judged)
        self._served = served if not self._unread else served | (self._served & listed)
        self._unread = False
        if back:
            self._gone.difference_update(back)
            log.warning("%s: %d GPU%s served again after disappearing from the page: %s", STAGE, len(back),
                        "" if len(back) == 1 else "s", _names(back))
        if not gone:
            return
        self._gone.update(gone)
        what = (f"{len(gone)} GPU{'' if len(gone) == 1 else 's'} served at the last scrape absent from {self.url}: "
                f"{_names(gone)} (fallen off the bus, XID 79, or its node or exporter gone); no value is read of "
                "it until it is back")
        if self.health.problems.get((STAGE, GPU_DISAPPEARED), 0):  # (the first is logged by health)
            log.warning("%s: %s", STAGE, what)
        self.health.problem(STAGE, GPU_DISAPPEARED, len(gone), detail=what)

    def taken_topologies(self) -> list[Topology]:
        """The topologies this source has switched to since the last call, oldest first. Between two
        frames it may take more than one: a host forgotten in a poll that brought no new row (a
        federation polled faster than it scrapes) and served again in the next ones is dropped,
        then taken in as a new host; a consumer moving straight to the last topology would keep
        its state by name as if it had never left (h20)."""
        taken = list(self._taken)
        self._taken.clear()
        return taken

    def _follow(self, batch: SampleBatch, now: float) -> None:
        """Take in each GPU the topology lacks once it has been served in :data:`UNLISTED_POLLS`
        consecutive polls, and drop the hosts silent for :attr:`forget_after_s` (a derived
        topology, :attr:`takes_in_new_gpus`); otherwise log each one's name once, saying what to do.
        ``now`` is :attr:`silence_clock`'s."""
        assert self._topology is not None
        slots = self._topology.slots("gpu", batch.entities)
        unlisted = [name for name, slot in zip(batch.entities, slots) if slot < 0]
        if self._derived and self.takes_in_new_gpus:
            # the exporter served no page since the last one (down, or a federation restarting): no
            # host was silent meanwhile. A Prometheus /federate back from a restart serves its targets as it
            # scrapes them again, so the hosts missing from its first pages back were forgotten at
            # once after an outage longer than forget_after_s (review h19)
            if self._out:
                self._heard += now - self._served_at
            self._served_at, self._out = now, False
            # before judging silence: a host back after an outage of the exporter is not forgotten
            self._heard[self._topology.gpu_node[slots[slots >= 0]]] = now
            # per GPU served now and unlisted, in how many polls in a row: only the current page's
            # names, so a name served once (an odd scrape) is forgotten at the next poll
            self._unlisted_polls, steady = steady_unlisted(self._unlisted_polls, unlisted, UNLISTED_POLLS)
            if steady:
                self._topology = grown_topology(self._topology, steady)
                self._taken.append(self._topology)
                # grown_topology keeps the listed nodes' slots and appends the new ones
                added = self._topology.size("node") - len(self._heard)
                self._heard = np.concatenate([self._heard, np.full(added, now)])
            if self.forget_after_s > 0:
                self._forget_silent(now)
            return
        if not unlisted:
            return
        new = not_yet_told(self._told, unlisted, TOLD_MAX)
        if not new:
            return
        what = "add them to the --topology file and restart" if not self._derived else \
            "restart to watch them (the topology was derived from the first scrape)"
        log.warning("%s: %d GPU%s not in the topology, their samples counted as unknown gpu entities: %s; %s",
                    STAGE, len(new), "" if len(new) == 1 else "s", _names(new), what)

    def _forget_silent(self, now: float) -> None:
        """Drop from the topology the hosts none of whose GPUs has been served for
        :attr:`forget_after_s` (one comparison per host a poll), and what the source keeps of
        their GPUs; logged in one line with how long each was silent. Never every host: with no
        GPU served at all, the exporter is what went away (and a topology needs a GPU)."""
        assert self._topology is not None
        silent = np.flatnonzero(now - self._heard > self.forget_after_s)
        if not len(silent) or len(silent) == len(self._heard):
            return
        topology = self._topology
        hosts = [topology.nodes[i] for i in silent]
        gone = [topology.gpus[g] for g in np.flatnonzero(np.isin(topology.gpu_node, silent))]
        for name in gone:  # a host served again is a new one: no last row, no board to compare
            self._last_ts.pop(name, None)
            self._boards.uuids.pop(name, None)
            self._gone.discard(name)
            self._served.discard(name)
        # ... nor its sentinels counted: kept, one key per (metric, GPU) grew with every host that came and went
        gone_suffixes = tuple(f"@{name}" for name in gone)
        self.counted_once -= {k for k in self.counted_once if k.endswith(gone_suffixes)}
        silences = [f"{host} ({_span(now - self._heard[i])})" for host, i in zip(hosts, silent)]
        log.warning("%s: forgot %d host%s none of whose GPUs was served for over %s: %s; %d GPU%s and their state "
                    "dropped from the derived topology (a host served again is taken in as a new one)",
                    STAGE, len(hosts), "" if len(hosts) == 1 else "s", _span(self.forget_after_s), _names(silences),
                    len(gone), "" if len(gone) == 1 else "s")
        self._topology = shrunk_topology(topology, hosts)
        self._taken.append(self._topology)
        self._heard = np.delete(self._heard, silent)

    def _new_rows(self, batch: SampleBatch, topology: Topology) -> SampleBatch:
        """The rows but those stamped as each GPU's last one (a federation serves a sample until the
        next scrape: not new telemetry, not a problem). A row older than the last one (the wall
        clock stepped back) is kept, for the input guard to count (``out_of_order``): left out here,
        every row until the clock caught up was lost uncounted. Only GPUs ``topology`` lists are
        remembered: the others' rows are refused anyway."""
        if not len(batch):
            return batch
        last = np.array([self._last_ts.get(name, -np.inf) for name in batch.entities])[batch.entity]
        listed = topology.slots("gpu", batch.entities) >= 0
        for i in np.flatnonzero((batch.ts > last) & listed[batch.entity]):
            self._last_ts[batch.entities[batch.entity[i]]] = float(batch.ts[i])
        again = batch.ts == last
        if not again.any():
            return batch
        keep = ~again
        return SampleBatch("gpu", batch.entities, batch.ts[keep], batch.entity[keep],
                           {name: col[keep] for name, col in batch.columns.items()})


class _SameDeadlineRedirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects on the deadline of the request redirected: a chain of them is one scrape's
    time (urllib's own handler makes a plain request, which would get a deadline of its own)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None or not isinstance(req, _DeadlineRequest):
            return new
        return _DeadlineRequest(new.full_url, new.headers, req.deadline, origin_req_host=new.origin_req_host,
                                unverifiable=new.unverifiable, method=new.get_method())


def grown_topology(topology: Topology, gpus: list[str]) -> Topology:
    """A derived topology (``gpu_topology``: hosts with their GPU counts, one unknown rack) with
    ``gpus`` taken in. Its nodes keep their order, and so their slots and their GPUs' (unless a
    node listed gains a GPU, which shifts the GPUs after it); new hosts follow, sorted."""
    counts = _gpu_counts(topology)
    added: dict[str, int] = {}
    for name in gpus:
        host, index = split_gpu_entity(name)
        grown = counts if host in counts else added
        grown[host] = max(grown.get(host, 0), index + 1)
    return _derived_topology(topology.cluster, [*counts.items(), *sorted(added.items())])


def shrunk_topology(topology: Topology, hosts: list[str]) -> Topology:
    """A derived topology (``gpu_topology``) without the nodes ``hosts`` and their GPUs. The other
    nodes keep their order; their slots, and their GPUs', move down past those dropped (state
    follows them by name: ``core/remap.py``)."""
    dropped = set(hosts)
    return _derived_topology(topology.cluster, [(host, n) for host, n in _gpu_counts(topology).items()
                                                if host not in dropped])


def _gpu_counts(topology: Topology) -> dict[str, int]:
    """Per node of ``topology``, in its order, how many GPUs it lists."""
    return dict(zip(topology.nodes, np.bincount(topology.gpu_node, minlength=len(topology.nodes)).tolist()))


def _derived_topology(cluster: str, nodes: list[tuple[str, int]]) -> Topology:
    """Nodes (host, GPU count) in one unknown rack: what ``gpu_topology`` derives."""
    return Topology.from_dict({
        "cluster": cluster,
        "rows": [{"name": UNKNOWN, "cooling_loop": UNKNOWN}],
        "racks": [{"name": UNKNOWN, "row": UNKNOWN}],
        "nodes": [{"name": host, "rack": UNKNOWN, "gpus": n} for host, n in nodes],
    })


def _span(seconds: float) -> str:
    """A duration for a log line: ``25.0 h``, ``40 min``, ``12 s``."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _names(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
