"""nvidia-smi: parse ``--query-gpu ... --format=csv`` and ``dmon`` output into gpu samples, and
run ``nvidia-smi`` on an interval as a live source.

``--query-gpu`` CSV (what nvidia_gpu_exporter parses)::

    timestamp, index, power.draw [W], clocks.current.sm [MHz], clocks_event_reasons.active, ...
    2026/07/03 22:11:09.763, 0, 627.40 W, 1980 MHz, 0x0000000000000000, ...

Units sit in the header (``[W]``) and again after each value (``627.40 W``) unless
``nounits``; nvidia-smi prints one fixed unit per query, and a CSV stating another (edited, converted:
``power.draw [mW]``, ``122 F``) is converted where an SI prefix apart, else the cell is NaN and counted
(:data:`UNIT_MISMATCH`); ``[N/A]``, ``[Not Supported]`` and ``[Requested functionality has been
deprecated]`` mean "no value" (NaN, not a problem); ``[GPU is lost]``, ``[GPU requires reset]`` and
``[Unknown Error]`` say the GPU has failed (NaN, the GPU counted once as it enters that state);
bitmasks are hex. An nvidia-smi that cannot read a GPU still prints the others' rows, then exits
non-zero: the live source reads them. Query names map to
fields through the field table's ``nvidia_smi`` column (scale to base units included).
Timestamps are nvidia-smi's local time, with no zone; imports read them (and dmon's ``-o DT``) in
``foreshock import --tz`` where given, else in the capture's host's zone (:func:`capture_zone`):
the capture tool writes ``collected_at:`` in UTC (``date -u``: always ``Z``, whatever the host's
zone), so a ``Z`` says nothing of the zone nvidia-smi printed in; the host's offset is the gap
from ``collected_at:`` to the capture's first CSV timestamp, which follows it within seconds
(the real captures were taken on UTC hosts: no gap; a CEST host prints its rows two hours
ahead). A ``collected_at:`` stating another offset (``+02:00``) gives the zone; else UTC. Live
polling stamps rows with the poll time instead.

``dmon`` prints a ``# gpu pwr gtemp ...`` header, a ``# Idx W C ...`` units row, then one
line per GPU per interval; without ``-o T``/``-o DT`` it prints no time, so rows are placed on
``start + cycle * interval`` (a cycle starts at a GPU it has had, or one printed before the
previous row's in the cycles so far). ``-`` means no value.

A GPU's ``uuid`` (``GPU-...``) is a string, not a field: :func:`parse_query_gpu` reads it apart
from the field table into its ``uuids`` map, and the live source asks for it (unless
:attr:`NvidiaSmiSource.reads_boards` is turned off) and carries it as the ``board_id`` field: a
GPU whose UUID changes from one known to another is another board in its slot (an RMA), logged
and counted here and started afresh by the pipeline, under the rule every UUID-reading source
follows (:class:`~foreshock.streams.polling.GpuBoards`); a missing one (``[N/A]``, the name
rejected by the driver) is no change.

The capture files in ``../shared/data/nvidia-smi/`` hold many commands' outputs, each under a
``# idle :: query-gpu (...)`` banner; :func:`capture_section_list` splits them, each with its
capture's ``collected_at:`` (a file may hold several captures appended).
"""

from __future__ import annotations

import csv
import logging
import re
import socket
import subprocess
from collections import Counter, deque
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Iterator, Sequence

import numpy as np

from foreshock import facts
from foreshock.boards import board_id
from foreshock.fields import load_fields, source_index
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .dcgm import TAKEN_MAX, TOLD_MAX, UNLISTED_POLLS, grown_topology
from .polling import GpuBoards, PollingSource, count_once, not_yet_told, run_process, steady_unlisted
from .samples import (FAULT_TOKENS, MAX_GPU_INDEX, SampleBatch, gpu_entity, gpu_topology, line_chunks, parse_token,
                      parse_tokens, parse_tokens_units, token_fault)

STAGE = "nvidia-smi"
DMON_STAGE = "dmon"

log = logging.getLogger("foreshock.sources")

_RULE = re.compile(r"^#{20,}\s*$")
_UNIT = re.compile(r"\s*\[([^\]]*)\]\s*$")
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_MISSING = frozenset({"", "[n/a]", "n/a"})
TLIMIT_QUERY = "temperature.gpu.tlimit"
"""T.Limit: a headroom in °C, not a temperature. Drivers 590 print ``GPU T.Limit Temp : 59 C`` at
28 °C on an H200 (and ``GPU Max Operating T.Limit Temp : 0 C`` in ``-q``, every threshold an offset
from T.Limit), so where it is the GPU's own headroom ``max_op_temp`` is ``temperature.gpu`` plus it.
But it is the headroom to the *nearest* slowdown threshold (NVML's margin temperature, the same
number), the memory's max operating temperature included: on a real H200 under a memory-bound copy
(2026-12-04) it read 95 less ``temperature.memory`` (39 at 44 °C core and 56 °C memory on one
machine, 36 at 48 and 59 on another: ``tests/data/h200_tlimit/``), and ``temperature.gpu`` plus it
put the die's limit at 82-86 °C in 157 of that recording's 268 rows where NVML reads 87.
:func:`max_op_from_tlimit` derives the die's limit only from rows where the memory is clearly
further from its own. The field table cannot say "plus another column", so :func:`parse_query_gpu`
derives it and the live source asks for it besides the table's names. (The memory's max operating
temperature has no query name: ``-q`` prints only its offset, 0, from T.Limit, so the memory's
limit is taken as Hopper's 95 °C, ``facts.HBM_MAX_OPERATING_TEMP_C``.)"""

TLIMIT_WITHOUT_MEMORY = "T.Limit without temperature.memory: read as no limit"
"""The problem counted for rows that print T.Limit but no memory temperature column: whose headroom
it is cannot be told, so it gives no limit (counted per row in a file; by a live source, once)."""

TLIMIT_MEMORY_CLEAR_C = 3.0
"""T.Limit is read as the GPU's own headroom only where the memory's headroom to its max operating
temperature is at least this much larger. The temperatures and T.Limit are whole degrees, read at
slightly different instants (by another call, for NVML's margin): on the real H200 the rows whose
memory headroom was one degree over T.Limit were the memory's (the die's limit derived from 25 of
26 such rows read 82-85 °C, not 87), and once, beside a memory temperature read by another call, a
margin two under the memory's headroom was too. Three: every limit read over the two machines'
rows (872, nvidia-smi's and NVML's) is 86-88 °C, and on the machine whose die stayed the nearer
all but one of its 236 rows are read."""

UNIT_MISMATCH = "unit mismatch"
"""The problem counted for each cell (with a number) whose unit, its own suffix (``122 F``) or else its
header's (``temperature.gpu [F]``), is not the one nvidia-smi prints for its query nor a prefix of it
:func:`_unit_factor` converts (``630000 mW``): read in the printed unit, ``122 F`` was a 122 °C
thermal emergency. The cell is set to NaN."""

_PRINTED_UNITS: dict[tuple[str, float], str] = {
    ("watts", 1.0): "W", ("hertz", 1e6): "MHz", ("ratio", 0.01): "%", ("seconds", 1e-6): "us",
    ("celsius", 1.0): "", ("bitmask", 1.0): "", ("errors", 1.0): "", ("rows", 1.0): "",
}
"""The unit nvidia-smi prints for a query (fixed per query, whatever the value), by the unit and scale
of the field the table reads it into: W, MHz, %, us, and none for temperatures, bitmasks (hex) and
counts. A field not here is not checked."""

_SAME_UNITS = {"celsius": "C"}
"""A unit that means the printed one for a field's unit: ``nvidia-smi -q`` and ``dmon`` print
temperatures in ``C``, where the CSV prints none."""

_UNIT_PREFIXES = {"": 1.0, "n": 1e-9, "u": 1e-6, "\u00b5": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}
_PREFIXED_UNITS = ("W", "Hz", "s")
"""The printed units a stated one converts to when it is the same with another SI prefix (``mW``,
``kW``, ``GHz``, ``kHz``, ``ms``)."""

UNMAPPED_COLUMN = "unknown column ignored"
"""The problem counted once for each CSV column whose name no ``--query-gpu`` has (a header garbled on
the way: ``power.dr@w [W]``, ``power.draw [W``): its cells are not read, so the field it was meant to
be is NaN throughout without another word; the first names are logged (as dcgm's ``unmapped metric
ignored``). A column named as a query is (:data:`_QUERY_NAME`) that the field table does not map
(``driver_version``: the real captures ask for 200 such) is not counted: nvidia-smi refuses a name it
does not know, so it is a query asked for, not bad input. (A garbled name that still looks like a query,
``power.drw``, cannot be told from one.) The live source asks only for the names it reads."""

NO_ROWS = "no GPU rows in output"
"""The problem counted for a poll whose nvidia-smi exited 0 printing no GPU row (nothing, or its
header alone): a poll that read nothing is not a quiet one."""

UUID_QUERY = "uuid"
"""The board's UUID (``GPU-...``; ``gpu_uuid`` is the same query under another name): a string,
so it is no field of the table's (a float column) and is read on its own (``uuids``)."""
_UUID_COLUMNS = (UUID_QUERY, "gpu_uuid")

HW_THERMAL_QUERY = "clocks_event_reasons_counters.hw_thermal_slowdown"
"""Time (µs) HW thermal slowdown held the clocks. ``thermal_throttle_time`` is the time held by SW *or*
HW thermal slowdown (the field table's help; NVML's thermal violation time and the simulator count
both), but nvidia-smi splits it into this counter and ``..sw_thermal_slowdown``, the one the table
maps. The table cannot say "plus another column", so :func:`parse_query_gpu` adds it to the SW one
(:func:`_thermal_time`) and the live source asks for it besides the table's names. Drivers before
R535 have neither counter (no ``clocks_throttle_reasons_counters`` alias exists)."""
_HW_THERMAL_SCALE = 1e-6  # µs, as the SW counter the table reads (its ``*1e-6``)
_GPU_ID_COLUMNS = ("pci.bus_id",)
"""What tells a host's GPUs apart in a CSV without an ``index`` column, before :data:`_UUID_COLUMNS`."""
_UNMAPPED_NAMED = 5
"""Unknown column names the problem's log line names; it counts the rest."""
_QUERY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*")
"""What a ``--query-gpu`` name looks like (``timestamp``, ``clocks_event_reasons.hw_slowdown``)."""


EXIT_MEANING = {9: "the NVIDIA driver is not loaded",
                15: "a GPU has fallen off the bus or is otherwise inaccessible",
                16: "a GPU requires a reset"}
"""What some of nvidia-smi's exit statuses say (they are NVML's return codes: ``NVML_ERROR_GPU_IS_LOST``
is 15), for the log."""


# ---- capture files ------------------------------------------------------------------------
_COLLECTED_AT = re.compile(r"^collected_at:\s*(\S+)", re.MULTILINE)
_CSV_STAMP = re.compile(r"^(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\s*,", re.MULTILINE)
"""A CSV row's leading nvidia-smi timestamp (``--query-gpu``, ``--query-compute-apps``, ...)."""
ZONE_STEP_S = 900
"""Zone offsets are whole quarter hours (+05:30 India, +05:45 Nepal)."""
ZONE_OFFSETS_MIN = frozenset({60 * h for h in range(-12, 15)} | {
    -570, -210, -150, 210, 270, 330, 345, 390, 525, 570, 630, 765, 825})
"""The UTC offsets zones use (minutes): whole hours, and -9:30, -3:30, -2:30, +3:30, +4:30, +5:30,
+5:45, +6:30, +8:45, +9:30, +10:30, +12:45, +13:45. Any quarter hour had been taken: a UTC host's
capture whose first CSV row came 15 minutes after its header was read as from a "+00:15" host and
every row moved 15 minutes early."""
CAPTURE_LEAD_S = (-60, 240)
"""How long after ``collected_at:``, beyond a whole number of quarter hours, the capture's first CSV
timestamp may be for that number to be read as its host's zone: the first CSV section runs seconds
after the header (a few nvidia-smi calls between them: help, ``-L``, ``-q``); a gap minutes off a
zone's offset is some other clock or an edited capture, not a zone."""


@dataclass(frozen=True)
class CaptureSection:
    """One banner's section of a capture file, with the ``collected_at:`` of the capture it is
    part of: files holding several captures one after another (``cat h100.txt h200.txt``) repeat
    every title, and each capture's rows are in its own time and zone."""

    title: str
    body: str
    collected: datetime | None
    """Its capture's ``collected_at:`` (naive where it states no zone; None where none came before)."""
    capture: int
    """Which capture of the file: one more at each ``collected_at:`` header after the first."""
    zone: tzinfo | None = None
    """The zone its capture's host printed local times in (:func:`capture_zone`), None where unknown."""

    def collected_at(self, zone: tzinfo = timezone.utc) -> float | None:
        """Its capture's ``collected_at:`` in epoch seconds, read in ``zone`` where it states none."""
        if self.collected is None:
            return None
        return (self.collected if self.collected.tzinfo else self.collected.replace(tzinfo=zone)).timestamp()


_REPORT_MARKS = (
    (re.compile(r"^=+\s*NVSMI LOG\s*=+\s*$", re.MULTILINE), "nvidia-smi -q (the human-readable report)"),
    (re.compile(r"^\|\s*NVIDIA-SMI\s+\S+.*Driver Version", re.MULTILINE), "nvidia-smi's default table"),
)
_CSV_HEADER = re.compile(r"^\s*timestamp\s*,", re.MULTILINE)
_DMON_HEADER = re.compile(r"^#\s*(?:Date\s+Time\s+)?(?:Time\s+)?gpu\b", re.MULTILINE)
READABLE = ("`nvidia-smi --query-gpu=timestamp,index,temperature.gpu,power.draw,... --format=csv` (add -l SECONDS "
            "for a log) for --format nvidia-smi, or `nvidia-smi dmon` for --format dmon")
"""What the nvidia-smi importers read, for the message refusing another of its outputs."""


def human_report(text: str) -> str | None:
    """What nvidia-smi output ``text`` is when it is one foreshock does not read and holds nothing it
    does (neither a ``--query-gpu`` CSV header nor a ``dmon`` one): ``nvidia-smi -q``'s report or the
    default table; None otherwise. Each of its lines had been counted as ``no timestamp column``
    (251 for one GPU's ``-q``) without a word of what to capture instead (:data:`READABLE`)."""
    if _CSV_HEADER.search(text) or _DMON_HEADER.search(text):
        return None
    return next((what for mark, what in _REPORT_MARKS if mark.search(text)), None)


def capture_section_list(text: str) -> list[CaptureSection]:
    """The sections of an nvidia_gpu_exporter capture, in file order, a repeated title kept.

    A section is a banner (a ``####`` rule, ``# title (note)`` and ``# $ command`` lines, a
    rule) followed by its body up to the next banner. Titles drop the parenthesised note. A
    section holding a ``collected_at:`` line (the capture's header) starts a capture: it and the
    sections after it carry that time, so two captures appended to one file keep their own.
    """
    found: list[tuple[str, list[str]]] = []
    in_banner = False
    banner: list[str] = []
    for line in text.splitlines():
        if _RULE.match(line):
            if in_banner:
                first = next((b for b in banner if b.strip("# ").strip() and not b.startswith("# $")), "")
                found.append((re.sub(r"\s*\(.*\)\s*$", "", first.lstrip("#").strip()), []))
                in_banner = False
            else:
                in_banner = True
                banner = []
            continue
        if in_banner:
            banner.append(line)
        elif found:
            found[-1][1].append(line)
    read: list[tuple[str, str, datetime | None, int]] = []
    collected: datetime | None = None
    capture = -1
    for title, lines in found:
        body = "\n".join(lines).strip("\n") + "\n"
        m = _COLLECTED_AT.search(body)
        if m:
            collected = _read_collected_at(m.group(1))
            capture += 1
        read.append((title, body, collected, max(capture, 0)))
    # each capture's zone, from its header and the first CSV timestamp after it
    first_csv: dict[int, str] = {}  # capture -> the body of its first section with CSV rows
    for _, body, collected, capture in read:
        if collected is not None and capture not in first_csv and _CSV_STAMP.search(body):
            first_csv[capture] = body
    zones = {capture: capture_zone(collected, first_csv.get(capture, "")) for _, _, collected, capture in read}
    return [CaptureSection(title, body, collected, capture, zones[capture]) for title, body, collected, capture in read]


def capture_sections(text: str) -> dict[str, str]:
    """Split an nvidia_gpu_exporter capture into ``{"idle :: query-gpu": body, ...}``: by title,
    so of a file holding several captures only the last's (:func:`capture_section_list` keeps all)."""
    return {section.title: section.body for section in capture_section_list(text)}


def _read_collected_at(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def capture_collected(text: str) -> datetime | None:
    """The first ``collected_at:`` time of a capture file as it is written (naive where it states
    no zone), None when absent or unreadable."""
    m = _COLLECTED_AT.search(text)
    return _read_collected_at(m.group(1)) if m else None


def capture_zone(collected: datetime | None, text: str) -> tzinfo | None:
    """The zone of the host that wrote a capture, whose ``collected_at:`` is ``collected`` and
    whose text from it on is ``text``: the offset ``collected_at:`` states where not UTC, else the
    gap from it to the first CSV timestamp in ``text`` (read as UTC) rounded to a quarter hour, where
    that is an offset a zone uses (:data:`ZONE_OFFSETS_MIN`) and the stamp seconds after it
    (:data:`CAPTURE_LEAD_S`); None otherwise (no header, one without a zone, no CSV row, a gap no
    zone explains). A UTC host's capture whose first row came a whole hour after its header reads as
    from a zone an hour east: ``import --tz UTC`` says otherwise.

    The nvidia_gpu_exporter capture tool writes ``collected_at:`` with ``date -u`` (``Z``) while
    nvidia-smi prints local time: read in the ``Z``, the rows of a CEST host landed two hours
    late, and the dmon runs placed after them with them."""
    if collected is None or collected.tzinfo is None:
        return None
    if collected.utcoffset():  # (+02:00: the host said its zone)
        return collected.tzinfo
    m = _CSV_STAMP.search(text)
    first = _csv_timestamp_or_none(m.group(1)) if m else None
    if first is None:
        return None
    gap = first - collected.timestamp()
    offset = round(gap / ZONE_STEP_S) * ZONE_STEP_S
    # (ZONE_OFFSETS_MIN spans the farthest zones, -12:00 to +14:00: no bound of its own)
    if offset // 60 not in ZONE_OFFSETS_MIN or not CAPTURE_LEAD_S[0] <= gap - offset <= CAPTURE_LEAD_S[1]:
        return None
    return timezone(timedelta(seconds=offset))


def capture_collected_at(text: str, zone: tzinfo = timezone.utc) -> float | None:
    """The first ``collected_at:`` time of a capture file, in epoch seconds (None when absent); one
    without a zone is read in ``zone``, UTC unless told, as the capture's CSV timestamps are
    (:func:`_csv_timestamp`)."""
    at = capture_collected(text)
    if at is None:
        return None
    return (at if at.tzinfo is not None else at.replace(tzinfo=zone)).timestamp()


def newest_csv_stamp(body: str, zone: tzinfo = timezone.utc) -> float | None:
    """The newest leading timestamp of the CSV rows in a capture section's body (read in ``zone``,
    as :func:`parse_query_gpu` reads them), None where it has none: when that command ran, which
    places a dmon run that followed it (dmon prints no dates)."""
    stamps = [t for m in _CSV_STAMP.finditer(body) if (t := _csv_timestamp_or_none(m.group(1), zone)) is not None]
    return max(stamps, default=None)


# ---- --query-gpu CSV ------------------------------------------------------------------------
def _csv_timestamp(text: str, zone: tzinfo = timezone.utc) -> float:
    """``2026/07/03 22:11:09.763`` -> epoch seconds, read in ``zone``: nvidia-smi prints its host's
    local time with no zone (a stamp stating one keeps it); ValueError when malformed."""
    dt = datetime.fromisoformat(text.strip().replace("/", "-"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=zone)
    return dt.timestamp()


def parse_query_gpu(text: str, host: str | None = None, health: PipelineHealth | None = None,
                    ts: float | None = None, columns: Sequence[str] | None = None,
                    uuids: dict[str, str] | None = None, faults: dict[str, str] | None = None,
                    numbered: dict[str, dict[str, int]] | None = None, once: set[str] | None = None,
                    board_ids: bool = False, zone: tzinfo = timezone.utc,
                    columns_seen: set[str] | None = None) -> SampleBatch:
    """Parse ``nvidia-smi --query-gpu=... --format=csv`` output into a gpu batch.

    ``host`` names the node when the CSV has no usable ``hostname`` column (default
    ``localhost``). ``ts`` overrides the CSV's timestamps (live polling); without it rows need a
    ``timestamp`` column, read in ``zone`` (nvidia-smi prints its host's local time without one:
    an import reads them in the zone the capture's ``collected_at:`` or ``--tz`` gives, UTC by
    default). ``columns`` gives the header for ``--format=csv,noheader`` output.

    A row whose first cell is ``timestamp`` (or the first cell of the header in force) is a header
    again: two captures appended to one file. The rows after it are read by it; the same header
    repeated changes nothing.

    Without an ``index`` column, GPUs are told apart by ``pci.bus_id`` or ``uuid`` and numbered per
    host in order of first appearance, not by the driver's index (nvidia-smi prints them in index
    order, so the first poll's order is the driver's unless a GPU was missing from it); each GPU so
    numbered is counted once (``no index column: GPU numbered by first appearance``). ``numbered``
    (host -> id -> number) carries the numbering from one call to the next (a long file's chunks).
    With neither column, one row per host and time is read as GPU 0 and the others are left out and
    counted (``no index column: several GPUs at one time``), not merged into one series.

    ``uuids``, when given, is filled with each GPU's ``uuid`` column (GPU name -> UUID; "" where
    its rows name different ones; none for ``[N/A]``), for the rows kept. ``board_ids`` instead
    gives each row its own UUID's number as the ``board_id`` column (NaN for ``[N/A]``): a file
    (``foreshock import`` of an ``nvidia-smi -l`` log) can span a board swap in one GPU's slot,
    which a map of one UUID per GPU would read as no board at all, hiding the swap.

    ``thermal_throttle_time`` is the SW thermal slowdown counter plus :data:`HW_THERMAL_QUERY`
    where both are read (:func:`_thermal_time`), either alone where only it is.

    A GPU whose cells say it has failed (``[GPU is lost]``, ``[Unknown Error]``:
    :data:`~foreshock.streams.samples.FAULT_TOKENS`) keeps its row, those cells NaN, and is counted
    once under the fault's reason as it enters that state, rows read in order: ``faults`` (GPU name
    -> the fault its last row said; GPUs without one absent) carries the states from one call to the
    next (a live source's polls, a long file's chunks); without it, each call starts from none.

    Each bad line is counted once, under the first reason found (its width, timestamp or GPU
    index), and costs its own row only: the cells of a row left out are not read.

    ``once`` (a live source's own set, :func:`~.polling.count_once`) counts what its query lacks
    at every poll, such as T.Limit without the memory temperature (:data:`TLIMIT_WITHOUT_MEMORY`),
    the first time only.

    A column foreshock does not read is counted once by name (:data:`UNMAPPED_COLUMN`): once per call,
    or, with ``columns_seen`` (the names counted so far: a long file's chunks, its sections), once
    over all of them; ``once`` serves where ``columns_seen`` is not given.
    """
    health = health if health is not None else PipelineHealth()
    lines = [line for line in text.splitlines() if line.strip()]
    rows, unreadable = _csv_rows(lines)
    problems: Counter[str] = Counter({"unreadable line": unreadable})
    if columns is None:
        if not rows:
            health.problem(STAGE, "unreadable line", unreadable)
            return SampleBatch.empty("gpu")
        header, rows = rows[0], rows[1:]
    else:
        header = list(columns)
    faults = faults if faults is not None else {}
    numbered = numbered if numbered is not None else {}
    seen = columns_seen if columns_seen is not None else once if once is not None else set()
    batches = [_read_query_rows(part_header, part, host or "localhost", ts, problems, health, uuids, faults, numbered,
                                once, board_ids, zone, seen)
               for part_header, part in _header_parts(header, rows)]
    for reason, count in problems.items():
        health.problem(STAGE, reason, count)
    return batches[0] if len(batches) == 1 else SampleBatch.concat(batches)


def _is_header(row: Sequence[str], header: Sequence[str]) -> bool:
    """Whether a CSV row is a header line: its first cell is ``timestamp`` (asked first by the live
    source and the exporter) or the first cell of the header in force."""
    if not row:
        return False
    return row[0].strip() == "timestamp" or (bool(header) and header[0] != "" and row[0] == header[0])


def _header_parts(header: list[str], rows: list[list[str]]) -> list[tuple[list[str], list[list[str]]]]:
    """The rows in runs under the header in force for each: a header line within them (two
    captures appended to one file) starts a new run when it differs from the one in force."""
    parts: list[tuple[list[str], list[list[str]]]] = [(header, [])]
    for row in rows:
        if _is_header(row, parts[-1][0]):
            if row != parts[-1][0]:
                parts.append((row, []))
            continue
        parts[-1][1].append(row)
    return parts


def _last_header(text: str, header: list[str]) -> list[str]:
    """The header in force at the end of ``text`` (CSV lines), ``header`` at its start."""
    first = header[0] if header and header[0] else "timestamp"
    if "timestamp" not in text and first not in text:  # no header line in it: the common case, one scan
        return header
    for line in text.splitlines():
        if "timestamp" in line or first in line:
            rows, _ = _csv_rows([line])
            if rows and _is_header(rows[0], header):
                header = rows[0]
                first = header[0] if header[0] else "timestamp"
    return header


def _read_query_rows(header: list[str], rows: list[list[str]], fallback: str, ts: float | None,
                     problems: Counter[str], health: PipelineHealth, uuids: dict[str, str] | None,
                     faults: dict[str, str], numbered: dict[str, dict[str, int]],
                     once: set[str] | None = None, board_ids: bool = False,
                     zone: tzinfo = timezone.utc, columns_seen: set[str] | None = None) -> SampleBatch:
    """:func:`parse_query_gpu` for rows under one header; their problems added to ``problems``."""
    names = [_UNIT.sub("", h).strip() for h in header]
    # the unit each header states (None: it states none, as ``--format=csv,noheader`` columns)
    header_units = [m.group(1).strip() if (m := _UNIT.search(h)) else None for h in header]
    width = len(names)
    good = []
    for row in rows:
        if len(row) == width:
            good.append(row)
        else:
            problems["truncated row" if len(row) < width else "row with extra columns"] += 1
    col_of = {name: i for i, name in enumerate(names)}

    if ts is not None:
        times = np.full(len(good), float(ts))
    elif "timestamp" in col_of:
        at = col_of["timestamp"]
        stamps = [_csv_timestamp_or_none(row[at], zone) for row in good]
        bad_stamps = stamps.count(None)
        if bad_stamps:  # left out before their cells are read: one bad line, one count
            problems["bad timestamp"] += bad_stamps
            good = [row for row, t in zip(good, stamps) if t is not None]
            stamps = [t for t in stamps if t is not None]
        times = np.array(stamps, dtype=np.float64)
    else:
        problems["no timestamp column"] += len(good)
        good, times = [], np.empty(0)

    named = col_of.get("hostname")
    hosts = [fallback] * len(good) if named is None else \
        [row[named] if row[named].strip().lower() not in _MISSING else fallback for row in good]
    if "index" in col_of:
        index, _, _ = parse_tokens([row[col_of["index"]] for row in good])
        keep = ~_bad_index(index)
        problems["bad GPU index"] += int((~keep).sum())
    else:
        index, keep = _index_without_column(good, col_of, hosts, times, problems, health, numbered)
    if not keep.all():
        good = [row for row, kept in zip(good, keep) if kept]
        hosts = [h for h, kept in zip(hosts, keep) if kept]
        index, times = index[keep], times[keep]
    n = len(good)
    cols = list(zip(*good)) if n else [() for _ in names]

    values: dict[str, np.ndarray] = {}
    row_fault: dict[int, str] = {}  # row -> the most serious fault its cells say
    lookup = source_index("nvidia_smi")
    _count_unmapped([name for name in col_of if name not in lookup], columns_seen, health)
    for name, i in col_of.items():
        mapped = lookup.get(name)
        if mapped is None:
            continue
        field, scale = mapped
        parsed, bad, nans, units = parse_tokens_units(cols[i])
        problems["non-numeric value"] += bad - (_note_fault_cells(cols[i], row_fault) if bad else 0)
        problems["NaN value"] += nans
        _read_in_printed_unit(parsed, units, header_units[i], field.unit, scale, name, health)
        parsed *= scale
        # Two aliases of one field queried together: the first with a value wins.
        values[field.name] = np.where(np.isnan(values[field.name]), parsed, values[field.name]) \
            if field.name in values else parsed
    if TLIMIT_QUERY in col_of and "gpu_temp" in values:
        tokens = cols[col_of[TLIMIT_QUERY]]
        headroom, bad, nans, units = parse_tokens_units(tokens)
        problems["non-numeric value"] += bad - (_note_fault_cells(tokens, row_fault) if bad else 0)
        problems["NaN value"] += nans
        _read_in_printed_unit(headroom, units, header_units[col_of[TLIMIT_QUERY]], "celsius", 1.0, TLIMIT_QUERY,
                              health)
        memory_cols = [i for name, i in col_of.items() if name in lookup and lookup[name][0].name == "hbm_temp"]
        if not memory_cols and count_once(once, TLIMIT_WITHOUT_MEMORY):
            problems[TLIMIT_WITHOUT_MEMORY] += n
        no_sensor = np.logical_and.reduce([_says_none(cols[i]) for i in memory_cols]) if memory_cols else False
        values["max_op_temp"] = max_op_from_tlimit(values["gpu_temp"], values.get("hbm_temp"), headroom, no_sensor)
    if HW_THERMAL_QUERY in col_of:
        tokens = cols[col_of[HW_THERMAL_QUERY]]
        hw, bad, nans, units = parse_tokens_units(tokens)
        problems["non-numeric value"] += bad - (_note_fault_cells(tokens, row_fault) if bad else 0)
        problems["NaN value"] += nans
        _read_in_printed_unit(hw, units, header_units[col_of[HW_THERMAL_QUERY]], "seconds", _HW_THERMAL_SCALE,
                              HW_THERMAL_QUERY, health)
        sw_cols = [i for name, i in col_of.items()
                   if name in lookup and lookup[name][0].name == "thermal_throttle_time"]
        sw_none = np.logical_and.reduce([_says_none(cols[i]) for i in sw_cols]) if sw_cols else np.ones(n, bool)
        values["thermal_throttle_time"] = _thermal_time(values.get("thermal_throttle_time", np.zeros(n)), sw_none,
                                                        hw * _HW_THERMAL_SCALE, _says_none(tokens))

    entities: dict[str, int] = {}
    entity = np.fromiter((entities.setdefault(gpu_entity(h, int(g)), len(entities)) for h, g in zip(hosts, index)),
                         dtype=np.int32, count=n)
    _count_faults(entity, list(entities), row_fault, faults, health)
    if uuids is not None:
        uuid_column = next((cols[col_of[name]] for name in _UUID_COLUMNS if name in col_of), ())
        _read_uuids(entity, list(entities), uuid_column, uuids)
    if board_ids and (uuid_name := next((name for name in _UUID_COLUMNS if name in col_of), None)):
        values["board_id"] = _row_board_ids(cols[col_of[uuid_name]])
    return SampleBatch("gpu", list(entities), times, entity, values)


def _count_unmapped(names: list[str], seen: set[str] | None, health: PipelineHealth) -> None:
    """Count each of ``names`` (a header's columns the field table does not map) that is no query's
    name, once (:data:`UNMAPPED_COLUMN`), those already in ``seen`` not again."""
    fresh = [name for name in names if _QUERY_NAME.fullmatch(name) is None and count_once(seen, f"column {name}")]
    if fresh:
        shown = ", ".join(repr(name) for name in fresh[:_UNMAPPED_NAMED])
        rest = len(fresh) - _UNMAPPED_NAMED
        health.problem(STAGE, UNMAPPED_COLUMN, len(fresh),
                       detail=shown + (f" +{rest} more" if rest > 0 else "") + ": no --query-gpu name (a header "
                       "garbled?); their cells not read")


def _thermal_time(sw: np.ndarray, sw_none: np.ndarray, hw: np.ndarray, hw_none: np.ndarray) -> np.ndarray:
    """Each row's time held by SW or HW thermal slowdown (s): the two counters summed. A counter
    the board does not have (``[N/A]``, ``[Not Supported]``: ``*_none``) adds nothing, so a board
    with one keeps reading it; NaN where neither is read, and where one is NaN for another reason
    (a fault, garbage): half the time would read as a counter reset when it came back."""
    total = np.where(sw_none, 0.0, sw) + np.where(hw_none, 0.0, hw)
    return np.where(sw_none & hw_none, np.nan, total)


def _row_board_ids(tokens: Sequence[str]) -> np.ndarray:
    """Each row's ``board_id`` from its UUID cell (NaN for none: blank, ``[N/A]``), each UUID
    hashed once (a days-long log repeats a few)."""
    ids: dict[str, float] = {}
    out = np.empty(len(tokens), dtype=np.float64)
    for row, token in enumerate(tokens):
        uuid = token.strip()
        if not uuid or uuid.startswith("[") or uuid.lower() in _MISSING:
            uuid = ""
        number = ids.get(uuid)
        if number is None:
            number = ids[uuid] = board_id(uuid)
        out[row] = number
    return out


def _unit_factor(stated: str, printed: str, field_unit: str) -> float | None:
    """What a value in the ``stated`` unit is multiplied by to be in the ``printed`` one (1 where they
    are the same, :data:`_SAME_UNITS`; an SI prefix apart, :data:`_PREFIXED_UNITS`), None where it
    cannot be converted."""
    if stated == printed or stated == _SAME_UNITS.get(field_unit):
        return 1.0
    for base in _PREFIXED_UNITS:
        if stated.endswith(base) and printed.endswith(base):
            have, want = _UNIT_PREFIXES.get(stated[:-len(base)]), _UNIT_PREFIXES.get(printed[:-len(base)])
            if have is not None and want is not None:
                return have / want
    return None


def _read_in_printed_unit(values: np.ndarray, units: dict[str, list[int]], header_unit: str | None,
                          field_unit: str, scale: float, column: str, health: PipelineHealth) -> None:
    """Put a column's ``values`` in the unit nvidia-smi prints for its query (:data:`_PRINTED_UNITS`),
    in place, from the unit each cell states: its own suffix (``units``: unit -> rows), else its
    header's. A unit that cannot be converted sets the cell to NaN, counted (:data:`UNIT_MISMATCH`):
    the field table's scale assumes the printed unit, and ``630000 mW`` was read as 630000 W."""
    printed = _PRINTED_UNITS.get((field_unit, scale))
    if printed is None:
        return
    bare_unit = printed if header_unit is None else header_unit  # cells without a suffix (``nounits``)
    factors = {unit: _unit_factor(unit, printed, field_unit) for unit in [*units, bare_unit]}
    if all(factor == 1.0 for factor in factors.values()):  # the common case: every unit the printed one
        return
    rows: dict[str, np.ndarray] = {unit: np.asarray(at, dtype=np.intp) for unit, at in units.items()}
    if factors[bare_unit] != 1.0:
        bare = np.ones(len(values), dtype=bool)
        for at in rows.values():
            bare[at] = False
        rows[bare_unit] = np.concatenate([rows.get(bare_unit, np.empty(0, np.intp)), np.flatnonzero(bare)])
    for unit, at in rows.items():
        factor = factors[unit]
        if factor is None:
            numbers = int(np.count_nonzero(~np.isnan(values[at])))
            values[at] = np.nan
            health.problem(STAGE, UNIT_MISMATCH, numbers,
                           detail=f"{column} in {unit or 'no unit'!r} where nvidia-smi prints "
                                  f"{printed or 'no unit'}: set to NaN")
        elif factor != 1.0:
            values[at] *= factor


def _index_without_column(rows: list[list[str]], col_of: dict[str, int], hosts: list[str], times: np.ndarray,
                          problems: Counter[str], health: PipelineHealth,
                          numbered: dict[str, dict[str, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's GPU number and whether it is kept, for a CSV without an ``index`` column
    (:func:`parse_query_gpu`'s docstring): by ``pci.bus_id``, else ``uuid``, in order of first
    appearance per host; with neither, GPU 0 and a host's first row per time only."""
    # the bus id names the slot, as the driver's index does: a board swapped into it (another
    # uuid) stays the same GPU, as the pipeline's rule for boards wants
    id_column = next((col_of[name] for name in (*_GPU_ID_COLUMNS, *_UUID_COLUMNS) if name in col_of), None)
    index = np.zeros(len(rows))
    keep = np.ones(len(rows), dtype=bool)
    if id_column is None:
        seen: set[tuple[str, float]] = set()
        for row, (host, t) in enumerate(zip(hosts, times.tolist())):
            if (host, t) in seen:
                keep[row] = False
            seen.add((host, t))
        problems["no index column: several GPUs at one time"] += int((~keep).sum())
        return index, keep
    new: list[str] = []
    for row, (cells, host) in enumerate(zip(rows, hosts)):
        gpu_id = cells[id_column].strip()
        if not gpu_id or gpu_id.startswith("[") or gpu_id.lower() in _MISSING:
            keep[row] = False
            continue
        ids = numbered.setdefault(host, {})
        number = ids.get(gpu_id)
        if number is None:
            if len(ids) > MAX_GPU_INDEX:  # garbled ids, each a new GPU: as a garbled index would be
                keep[row] = False
                continue
            number = ids[gpu_id] = len(ids)
            new.append(f"{gpu_entity(host, number)} = {gpu_id}")
        index[row] = number
    problems["no index column: row without a usable GPU id"] += int((~keep).sum())
    if new:
        health.problem(STAGE, "no index column: GPU numbered by first appearance", len(new),
                       detail=", ".join(new[:3]) + (" ..." if len(new) > 3 else ""))
    return index, keep


def _csv_rows(lines: list[str]) -> tuple[list[list[str]], int]:
    """The cells of each line, and how many lines could not be read (a cell over the csv module's
    field limit, 128 KiB), which are left out. nvidia-smi quotes nothing, so a ``"`` is a garbled
    cell; read with the rest, it opened a quoted cell that swallowed every following line into one
    bad row (or raised, past the field limit). Read on its own, such a line is one bad row (of the
    wrong width, most likely), the others unharmed."""
    try:
        rows = list(csv.reader(lines, skipinitialspace=True))
        if len(rows) == len(lines):  # no row ran over a line's end: the one reader is the fast way
            return rows, 0
    except csv.Error:
        pass
    rows = []
    for line in lines:
        try:
            rows.append(next(csv.reader([line], skipinitialspace=True)))
        except csv.Error:
            continue
    return rows, len(lines) - len(rows)


def _csv_timestamp_or_none(text: str, zone: tzinfo = timezone.utc) -> float | None:
    try:
        return _csv_timestamp(text, zone)
    except ValueError:
        return None


def _bad_index(index: np.ndarray) -> np.ndarray:
    """Where a parsed GPU index column holds no GPU index: not a whole number from 0 to
    :data:`~foreshock.streams.samples.MAX_GPU_INDEX` (``1.5``, ``-1``, ``4294967295``, text)."""
    return ~np.isfinite(index) | (index < 0) | (index != np.floor(index)) | (index > MAX_GPU_INDEX)


_FAULT_ORDER = list(dict.fromkeys(FAULT_TOKENS.values()))  # the most serious first


def _note_fault_cells(tokens: Sequence[str], row_fault: dict[int, str]) -> int:
    """Note in ``row_fault`` (row -> reason) the cells of a column that say their GPU has failed,
    keeping a row's most serious fault; returns how many there were. Called only for a column with
    cells that are not numbers: a healthy poll pays nothing for it."""
    found = 0
    for row, token in enumerate(tokens):
        reason = token_fault(token)
        if reason is not None:
            found += 1
            known = row_fault.get(row)
            if known is None or _FAULT_ORDER.index(reason) < _FAULT_ORDER.index(known):
                row_fault[row] = reason
    return found


def _count_faults(entity: np.ndarray, names: list[str], row_fault: dict[int, str], faults: dict[str, str],
                  health: PipelineHealth) -> None:
    """Count, under its reason, each GPU whose row says a fault its previous row did not (per GPU,
    once per change of state, not per cell or per poll: a GPU lost for a day is one problem), and
    note each GPU's state in ``faults`` (a healthy GPU leaves it). The first of each reason is
    logged by ``health``."""
    if not row_fault and not faults:  # the common case: no GPU failed, now or before
        return
    entered: dict[str, list[str]] = {}  # reason -> the GPUs entering it
    for row, slot in enumerate(entity):
        name = names[slot]
        state = row_fault.get(row)
        if faults.get(name) == state:
            continue
        if state is None:
            del faults[name]
            continue
        faults[name] = state
        entered.setdefault(state, []).append(name)
    for reason, gpus in entered.items():
        health.problem(STAGE, reason, len(gpus), detail=", ".join(gpus[:3]) + (" ..." if len(gpus) > 3 else ""))


def csv_and_messages(text: str) -> tuple[str, list[str]]:
    """Split what an nvidia-smi that failed printed into the CSV (its header, the first line
    whose first cell is ``timestamp``, as the live source asks first, and the lines after it
    that hold a comma: rows, whole or not, for :func:`parse_query_gpu` to read and count) and the
    other lines (its messages, sentences with no comma: ``Unable to determine the device handle
    for GPU 0000:3B:00.0: Unknown Error``). No header: ``("", every line)``."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((i for i, line in enumerate(lines)
                   if _UNIT.sub("", line.split(",", 1)[0]).strip() == "timestamp"), None)
    if header is None:
        return "", lines
    rows = [line for line in lines[header + 1:] if "," in line]
    messages = lines[:header] + [line for line in lines[header + 1:] if "," not in line]
    return "".join(line + "\n" for line in [lines[header], *rows]), messages


def _read_uuids(entity: np.ndarray, names: list[str], tokens: Sequence[str], uuids: dict[str, str]) -> None:
    """Note each row's UUID under its GPU's name (``entity``: the row's index in ``names``);
    nvidia-smi's bracketed "no value" forms name none."""
    for row, token in zip(entity, tokens):
        uuid = token.strip()
        if not uuid or uuid.startswith("[") or uuid.lower() in _MISSING:
            continue
        name = names[row]
        uuids[name] = uuid if uuids.get(name, uuid) == uuid else ""  # two boards in one slot name none


def max_op_from_tlimit(gpu_temp: np.ndarray, memory_temp: np.ndarray | None, headroom: np.ndarray,
                       no_memory_sensor: np.ndarray | bool = False) -> np.ndarray:
    """Each row's GPU max operating temperature from T.Limit's ``headroom`` (:data:`TLIMIT_QUERY`):
    ``gpu_temp + headroom`` where that headroom is the GPU's own, NaN (no reading: the detectors
    and the exporter keep the GPU's limit from an earlier row, else their default) where the memory
    is as near its own limit, within :data:`TLIMIT_MEMORY_CLEAR_C`, or where whose headroom it is
    cannot be told: no memory temperature read (a fault, a failed call), or none asked for
    (``memory_temp`` None: the column absent). A row whose board has no memory sensor
    (``no_memory_sensor``: it reports the memory temperature as ``[N/A]`` or not supported) is read
    as the GPU's own. The detectors judge the range of what comes out (``facts.OWN_LIMIT_MIN_C``)."""
    derived = gpu_temp + headroom
    if memory_temp is None:
        return np.full_like(derived, np.nan)
    memory_headroom = facts.HBM_MAX_OPERATING_TEMP_C - memory_temp
    the_gpus_own = (memory_headroom >= headroom + TLIMIT_MEMORY_CLEAR_C) | (np.isnan(memory_temp) & no_memory_sensor)
    return np.where(the_gpus_own, derived, np.nan)


def _says_none(tokens: Sequence[str]) -> np.ndarray:
    """Per cell, whether it is a "no value" form (``[N/A]``, ``[Not Supported]``): the board has no
    such reading — not a fault (``[Unknown Error]``), nor a literal NaN, nor garbage."""
    out = np.zeros(len(tokens), dtype=bool)
    for k, token in enumerate(tokens):
        value, ok = parse_token(token)
        out[k] = ok and value != value and token.strip().lower() != "nan"
    return out


def parse_query_gpu_chunks(text: str, host: str | None = None, health: PipelineHealth | None = None,
                           chunk_rows: int = 50_000, board_ids: bool = False,
                           zone: tzinfo = timezone.utc, columns_seen: set[str] | None = None) -> Iterator[SampleBatch]:
    """:func:`parse_query_gpu` over a long CSV (``nvidia-smi --query-gpu=... -l 1`` left running
    for days), ``chunk_rows`` lines at a time: parsed whole, its cells as Python strings took
    about ten times the file's size in memory; a chunk's strings are freed once it is columnar.
    ``board_ids``: each row's ``board_id`` from its UUID, ``zone`` the timestamps', ``columns_seen`` the
    columns not read counted so far (:func:`parse_query_gpu`; without it, each counted once over the chunks)."""
    pos = 0
    for line in line_chunks(text, 1):  # the header is the first line that is not blank
        pos += len(line)
        if line.strip():
            rows, unreadable = _csv_rows([line])
            health = health if health is not None else PipelineHealth()
            health.problem(STAGE, "unreadable line", unreadable)
            header = rows[0] if rows else []  # (then every row is counted as one with extra columns)
            break
    else:
        return
    # as in one piece: a GPU failing across chunks is counted once, GPUs without an index keep
    # their numbers, and a header line (two captures appended) holds for the chunks after it
    faults: dict[str, str] = {}
    numbered: dict[str, dict[str, int]] = {}
    seen = columns_seen if columns_seen is not None else set()
    for piece in line_chunks(text, chunk_rows, pos):
        yield parse_query_gpu(piece, host, health, columns=header, faults=faults, numbered=numbered,
                              board_ids=board_ids, zone=zone, columns_seen=seen)
        header = _last_header(piece, header)


# ---- dmon ----------------------------------------------------------------------------------
def parse_dmon(text: str, host: str = "localhost", start: float = 0.0, interval: float = 1.0,
               health: PipelineHealth | None = None, zone: tzinfo = timezone.utc) -> SampleBatch:
    """Parse ``nvidia-smi dmon`` output (any ``-s`` selection, with or without ``-o DT``, whose
    local date and time are read in ``zone``, as :func:`parse_query_gpu` reads the CSV's).

    Each row is read by the header in force for it: dmon repeats its header now and then, and two
    runs appended to one log may differ (``-s p`` then ``-s pc``). Without times, a cycle starts at
    a row whose GPU the cycle has had already, or that dmon printed before the previous row's GPU
    in the cycles so far (in index order, or in the order ``-i`` gave), read from every row with
    an index, too short or too long: a row left out does not move the others."""
    health = health if health is not None else PipelineHealth()
    problems: Counter[str] = Counter()
    parts: list[tuple[list[str], list[list[str]], list[float]]] = []  # (header, its rows, their times)
    header: list[str] = []
    rows: list[list[str]] = []
    times: list[float] = []
    gpu_at, date_at, time_at = 0, -1, -1  # where the header in force has them (-1: it has none)
    cycle = -1
    place: dict[int, int] = {}  # GPU index -> its place in a cycle, in the order dmon first printed them
    in_cycle: set[int] = set()  # the GPUs the current cycle has had
    last_place = -1  # the place of the last row with an index
    expect_units = False
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("#"):
            tokens = line.lstrip().lstrip("#").split()
            if "gpu" in tokens and not expect_units:
                if tokens != header:
                    header, rows, times = tokens, [], []
                    parts.append((header, rows, times))
                    gpu_at = header.index("gpu")
                    date_at = header.index("Date") if "Date" in header else -1
                    time_at = header.index("Time") if "Time" in header else -1
                expect_units = True
            else:
                expect_units = False  # the units row (# Idx W C ...) or a comment
            continue
        expect_units = False
        if not header:
            problems["data before header"] += 1
            continue
        tokens = line.split()
        if time_at < 0:  # before the row's width is judged: a row left out still ends its cycle
            gpu = _dmon_index(tokens[gpu_at]) if gpu_at < len(tokens) else None
            if gpu is not None:
                at = place.setdefault(gpu, len(place))
                if cycle < 0 or gpu in in_cycle or at < last_place:
                    cycle += 1
                    in_cycle = set()
                in_cycle.add(gpu)
                last_place = at
        if len(tokens) != len(header):
            problems["truncated row" if len(tokens) < len(header) else "row with extra columns"] += 1
            continue
        if date_at >= 0 and time_at >= 0:
            try:
                t = datetime.strptime(f"{tokens[date_at]} {tokens[time_at]}", "%Y%m%d %H:%M:%S").replace(
                    tzinfo=zone).timestamp()
            except ValueError:
                problems["bad timestamp"] += 1
                continue
        elif time_at >= 0:
            problems["time without date (use -o DT)"] += 1
            continue
        else:
            t = start + max(cycle, 0) * interval
        rows.append(tokens)
        times.append(t)

    batches = [_read_dmon_rows(header, rows, times, host, problems) for header, rows, times in parts]
    for reason, count in problems.items():
        health.problem(DMON_STAGE, reason, count)
    if not batches:  # (no header: every line counted above)
        return SampleBatch("gpu", [], np.empty(0), np.empty(0, dtype=np.int32), {})
    return batches[0] if len(batches) == 1 else SampleBatch.concat(batches)


def _dmon_index(token: str) -> int | None:
    """A dmon row's GPU index, None when it is none (:func:`_bad_index`)."""
    if not (token.isascii() and token.isdigit()):  # (int() takes "1_0" and "+1")
        return None
    index = int(token)
    return index if index <= MAX_GPU_INDEX else None


def _read_dmon_rows(header: list[str], rows: list[list[str]], times: list[float], host: str,
                    problems: Counter[str]) -> SampleBatch:
    """:func:`parse_dmon` for rows under one header; their problems added to ``problems``."""
    lookup = source_index("dmon")
    col_of = {name: i for i, name in enumerate(header)}
    gpu, _, _ = parse_tokens([row[col_of["gpu"]] for row in rows]) if rows else (np.empty(0), 0, 0)
    bad_index = _bad_index(gpu)  # (int() read 1.5 as GPU 1)
    problems["bad GPU index"] += int(bad_index.sum())
    if bad_index.any():  # left out before their cells are read: one bad line, one count
        rows = [row for row, bad in zip(rows, bad_index) if not bad]
        times = [t for t, bad in zip(times, bad_index) if not bad]
        gpu = gpu[~bad_index]
    n = len(rows)
    cols = list(zip(*rows)) if n else [() for _ in header]
    values: dict[str, np.ndarray] = {}
    for name, i in col_of.items():
        mapped = lookup.get(name)
        if mapped is None:
            continue
        parsed, bad, nans = parse_tokens(cols[i])
        problems["non-numeric value"] += bad
        problems["NaN value"] += nans
        values[mapped[0].name] = parsed * mapped[1]
    entities: dict[str, int] = {}
    entity = np.fromiter((entities.setdefault(gpu_entity(host, int(g)), len(entities)) for g in gpu),
                         dtype=np.int32, count=n)
    return SampleBatch("gpu", list(entities), np.asarray(times, dtype=np.float64), entity, values)


# ---- live runner ----------------------------------------------------------------------------
def query_fields() -> list[list[str]]:
    """Per gpu field with an nvidia-smi name: its names, preferred first (the table's order)."""
    return [[sn.name for sn in f.sources["nvidia_smi"]] for f in load_fields() if "nvidia_smi" in f.sources]


class NvidiaSmiSource(PollingSource):
    """Runs ``nvidia-smi --query-gpu=... --format=csv`` every ``interval`` seconds.

    ``executable`` is configurable (tests use a stub printing a real capture). When the driver
    rejects a query name (``Field "x" is not a valid field to query``, older drivers lack the
    ``clocks_event_reasons.*`` names), the source switches that field to its next alias, or
    drops it, and retries on the next poll; each rejection is counted.

    With :attr:`reads_boards` (on unless turned off) the query asks for :data:`UUID_QUERY` too,
    carried as ``board_id`` (the module docstring); off, it does not.

    The topology is the one given, or derived from the first poll that reads any GPU. That poll
    may have exited non-zero with a GPU unreadable (its rows are read: :meth:`_read_failed`), so a
    derived topology can lack a GPU that is back later. A GPU the topology lacks is counted as an
    unknown entity (``unknown gpu entity``) and its name logged once, saying to add it to the
    topology file (a given topology) or to restart (a derived one). With :attr:`takes_in_new_gpus`
    (a consumer that moves its state onto the new topology, as ``foreshock watch`` does for the
    dcgm source) and a derived topology, a GPU read in
    :data:`~foreshock.streams.dcgm.UNLISTED_POLLS` consecutive polls is taken in instead, as the
    dcgm source takes in GPUs: :attr:`topology` becomes a new one (the GPUs listed keep their
    slots) from that poll's frame on, and :meth:`taken_topologies` tells each one taken. Off (the
    default: ``record`` and ``agent`` keep the first topology for good), a derived topology never
    changes. A garbled index (negative, past :data:`~foreshock.streams.samples.MAX_GPU_INDEX`) never
    reaches this: its row is left out and counted as ``bad GPU index`` by :func:`parse_query_gpu`.
    """

    stage = STAGE
    reads = ("gpu",)

    def __init__(self, executable: str = "nvidia-smi", interval: float = 10.0, host: str | None = None,
                 topology: Topology | None = None, health: PipelineHealth | None = None,
                 max_polls: int | None = None, timeout: float = 10.0) -> None:
        super().__init__(interval, health, max_polls)
        self.executable = executable
        self.host = host or socket.gethostname()
        self.timeout = timeout
        self._topology = topology
        self._derived = topology is None
        self.takes_in_new_gpus = False
        self._unlisted_polls: dict[str, int] = {}  # GPUs the topology lacks: polls in a row reading them
        self._told: set[str] = set()  # names logged as missing from the topology
        self._taken: deque[Topology] = deque(maxlen=TAKEN_MAX)  # the topologies taken since taken_topologies()
        # (max_op_temp: see TLIMIT_QUERY; thermal_throttle_time's HW part: HW_THERMAL_QUERY)
        self._choices = query_fields() + [[TLIMIT_QUERY], [HW_THERMAL_QUERY]]
        self.reads_boards = True
        # asked for with reads_boards; a choice like the others, emptied if the driver rejects it
        self._uuid_choice = [UUID_QUERY]
        self._boards = GpuBoards(self.health, STAGE)
        self._faults: dict[str, str] = {}  # GPU -> the fault its cells said last (parse_query_gpu's ``faults``)
        self._once: set[str] = set()  # what its query lacks at every poll, counted once (parse_query_gpu's ``once``)
        self._exits: set[int] = set()  # the exit statuses logged

    def argv(self) -> list[str]:
        choices = self._choices + ([self._uuid_choice] if self.reads_boards else [])
        names = ["timestamp", "index"] + [choice[0] for choice in choices if choice]
        return [self.executable, f"--query-gpu={','.join(names)}", "--format=csv"]

    def poll(self) -> list[Frame]:
        now = self.clock()
        done, _ = run_process(self.argv(), self.health, STAGE, self.timeout)
        if done is None:
            return []
        out = done.stdout if done.returncode == 0 else self._read_failed(done)
        if done.returncode == 0 and sum(1 for line in out.splitlines() if line.strip()) <= 1:
            # exit 0, and nothing but the header (or nothing at all): no GPU read this poll
            self.health.problem(STAGE, NO_ROWS, detail="nvidia-smi exited 0 and printed no GPU row")
            return []
        if not out:
            return []
        uuids: dict[str, str] | None = {} if self.reads_boards else None
        batch = parse_query_gpu(out, host=self.host, health=self.health, ts=now, uuids=uuids, faults=self._faults,
                                once=self._once)
        if self._topology is None:
            if not len(batch):
                return []
            self._topology = gpu_topology([batch], self.cluster)
        else:
            self._follow(batch)
        if uuids:
            batch = self._boards.tag(batch, uuids, self._topology)
        return [batch.to_frame(self._topology, self.health, STAGE)]

    def taken_topologies(self) -> list[Topology]:
        """The topologies this source has taken in (:attr:`takes_in_new_gpus`) since the last call,
        oldest first (as ``DcgmScrapeSource.taken_topologies``)."""
        taken = list(self._taken)
        self._taken.clear()
        return taken

    def _follow(self, batch: SampleBatch) -> None:
        """Take in each GPU the topology lacks once read in :data:`UNLISTED_POLLS` consecutive polls
        (a derived topology, :attr:`takes_in_new_gpus`): a GPU nvidia-smi could not read at the poll
        the topology was derived from. Otherwise log each one's name once, saying what to do."""
        assert self._topology is not None
        slots = self._topology.slots("gpu", batch.entities)
        unlisted = [name for name, slot in zip(batch.entities, slots) if slot < 0]
        if self._derived and self.takes_in_new_gpus:
            # only this poll's names are kept: a GPU read once (an odd poll) is forgotten at the next
            self._unlisted_polls, steady = steady_unlisted(self._unlisted_polls, unlisted, UNLISTED_POLLS)
            if steady:
                self._topology = grown_topology(self._topology, steady)
                self._taken.append(self._topology)
                log.warning("%s: took in %d GPU%s read after the topology was derived: %s; it now lists %d GPUs",
                            STAGE, len(steady), "" if len(steady) == 1 else "s", ", ".join(sorted(steady)),
                            self._topology.size("gpu"))
            return
        new = not_yet_told(self._told, unlisted, TOLD_MAX)
        if not new:
            return
        what = "add them to the --topology file and restart" if not self._derived else \
            "restart to watch them (the topology was derived from the first poll)"
        log.warning("%s: %d GPU%s not in the topology, their samples counted as unknown gpu entities: %s; %s",
                    STAGE, len(new), "" if len(new) == 1 else "s", ", ".join(new), what)

    def _read_failed(self, done: subprocess.CompletedProcess[str]) -> str:
        """The CSV to read of a run that exited non-zero ("" for none), its failure counted.

        nvidia-smi prints every GPU it could read and a line for each it could not (``Unable to
        determine the device handle for GPU ...: Unknown Error``), all on stdout, then exits
        non-zero: one lost GPU must not blind the source to the healthy ones. The exit is counted
        (``command failed``; each new status logged), the lines among the rows that are not rows
        too (``error message in output``), and the rows are read. A query name the driver rejects
        is dropped instead (:meth:`_drop_name`); output with no CSV header is not read."""
        text, messages = csv_and_messages(done.stdout)
        said = done.stderr.strip().splitlines() + messages
        meaning = EXIT_MEANING.get(done.returncode)
        what = (f"{self.executable} exit {done.returncode}{f' ({meaning})' if meaning else ''}"
                f"{': ' + said[0] if said else ''}")
        if self._exits and done.returncode not in self._exits:  # (the first is logged by health)
            log.warning("%s: %s", STAGE, what)
        self._exits.add(done.returncode)
        self.health.problem(STAGE, "command failed", detail=what)
        rejected = _INVALID_FIELD.search(done.stderr or done.stdout)
        if rejected:
            self._drop_name(rejected.group(1))
            return ""
        if text:
            self.health.problem(STAGE, "error message in output", len(messages), detail=messages[0] if messages else "")
        return text

    def _drop_name(self, name: str) -> None:
        for choice in [*self._choices, self._uuid_choice]:
            if choice and choice[0] == name:
                choice.pop(0)
                self.health.problem(STAGE, "query field rejected by the driver",
                                    detail=f"{name}; now {'trying ' + choice[0] if choice else 'dropped'}")
                return
