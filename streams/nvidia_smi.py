"""nvidia-smi: parse ``--query-gpu ... --format=csv`` and ``dmon`` output into gpu samples, and
run ``nvidia-smi`` on an interval as a live source.

``--query-gpu`` CSV (what nvidia_gpu_exporter parses)::

    timestamp, index, power.draw [W], clocks.current.sm [MHz], clocks_event_reasons.active, ...
    2026/07/03 22:11:09.763, 0, 627.40 W, 1980 MHz, 0x0000000000000000, ...

Units sit in the header (``[W]``) and again after each value (``627.40 W``) unless
``nounits``; ``[N/A]``, ``[Not Supported]`` and ``[Requested functionality has been
deprecated]`` mean "no value" (NaN, not a problem); bitmasks are hex. Query names map to
fields through the field table's ``nvidia_smi`` column (scale to base units included).
Timestamps are nvidia-smi's local time; imports read them as UTC (the real captures were taken
on UTC hosts: their ``collected_at: ...Z`` header matches the CSV), live polling stamps rows
with the poll time instead.

``dmon`` prints a ``# gpu pwr gtemp ...`` header, a ``# Idx W C ...`` units row, then one
line per GPU per interval; without ``-o T``/``-o DT`` it prints no time, so rows are placed on
``start + cycle * interval`` (a cycle ends when a GPU index repeats). ``-`` means no value.

A GPU's ``uuid`` (``GPU-...``) is a string, not a field: :func:`parse_query_gpu` reads it apart
from the field table into its ``uuids`` map, and the live source asks for it (unless
:attr:`NvidiaSmiSource.reads_boards` is turned off) and carries it as the ``board_id`` field: a
GPU whose UUID changes from one known to another is another board in its slot (an RMA), logged
and counted here and started afresh by the pipeline, under the rule every UUID-reading source
follows (:class:`~foreshock.streams.polling.GpuBoards`); a missing one (``[N/A]``, the name
rejected by the driver) is no change.

The capture files in ``../shared/data/nvidia-smi/`` hold many commands' outputs, each under a
``# idle :: query-gpu (...)`` banner; :func:`capture_sections` splits them.
"""

from __future__ import annotations

import csv
import re
import socket
from collections import Counter
from datetime import datetime, timezone
from typing import Iterator, Sequence

import numpy as np

from foreshock.fields import load_fields, source_index
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .polling import GpuBoards, PollingSource, run_command
from .samples import MAX_GPU_INDEX, SampleBatch, gpu_entity, gpu_topology, line_chunks, parse_tokens

STAGE = "nvidia-smi"
DMON_STAGE = "dmon"

_RULE = re.compile(r"^#{20,}\s*$")
_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_MISSING = frozenset({"", "[n/a]", "n/a"})
TLIMIT_QUERY = "temperature.gpu.tlimit"
"""The headroom to the GPU's max operating temperature (T.Limit), not a temperature: drivers 590
print ``GPU T.Limit Temp : 59 C`` at 28 °C on an H200 (and ``GPU Max Operating T.Limit Temp : 0 C``
in ``-q``, every threshold an offset from T.Limit), so ``max_op_temp`` is ``temperature.gpu`` plus
it. The field table cannot say "plus another column", so :func:`parse_query_gpu` derives it and the
live source asks for it besides the table's names. (The memory's max operating temperature has no
query name: ``-q`` prints only its offset, 0, from a memory T.Limit it does not print.)"""

UUID_QUERY = "uuid"
"""The board's UUID (``GPU-...``; ``gpu_uuid`` is the same query under another name): a string,
so it is no field of the table's (a float column) and is read on its own (``uuids``)."""
_UUID_COLUMNS = (UUID_QUERY, "gpu_uuid")


# ---- capture files ------------------------------------------------------------------------
def capture_sections(text: str) -> dict[str, str]:
    """Split an nvidia_gpu_exporter capture into ``{"idle :: query-gpu": body, ...}``.

    A section is a banner (a ``####`` rule, ``# title (note)`` and ``# $ command`` lines, a
    rule) followed by its body up to the next banner. Titles drop the parenthesised note.
    """
    sections: dict[str, list[str]] = {}
    title: str | None = None
    in_banner = False
    banner: list[str] = []
    for line in text.splitlines():
        if _RULE.match(line):
            if in_banner:
                first = next((b for b in banner if b.strip("# ").strip() and not b.startswith("# $")), "")
                title = re.sub(r"\s*\(.*\)\s*$", "", first.lstrip("#").strip())
                sections[title] = []
                in_banner = False
            else:
                in_banner = True
                banner = []
            continue
        if in_banner:
            banner.append(line)
        elif title is not None:
            sections[title].append(line)
    return {name: "\n".join(lines).strip("\n") + "\n" for name, lines in sections.items()}


def capture_collected_at(text: str) -> float | None:
    """The ``collected_at:`` time of a capture file, in epoch seconds (None when absent)."""
    m = re.search(r"^collected_at:\s*(\S+)", text, re.MULTILINE)
    if not m:
        return None
    try:
        return datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# ---- --query-gpu CSV ------------------------------------------------------------------------
def _utc_timestamp(text: str) -> float:
    """``2026/07/03 22:11:09.763`` (read as UTC) -> epoch seconds; ValueError when malformed."""
    dt = datetime.fromisoformat(text.strip().replace("/", "-"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def parse_query_gpu(text: str, host: str | None = None, health: PipelineHealth | None = None,
                    ts: float | None = None, columns: Sequence[str] | None = None,
                    uuids: dict[str, str] | None = None) -> SampleBatch:
    """Parse ``nvidia-smi --query-gpu=... --format=csv`` output into a gpu batch.

    ``host`` names the node when the CSV has no usable ``hostname`` column (default
    ``localhost``). ``ts`` overrides the CSV's timestamps (live polling); without it rows need a
    ``timestamp`` column. ``columns`` gives the header for ``--format=csv,noheader`` output.

    ``uuids``, when given, is filled with each GPU's ``uuid`` column (GPU name -> UUID; "" where
    its rows name different ones; none for ``[N/A]``), for the rows kept.

    Each bad line is counted once, under the first reason found (its width, timestamp or GPU
    index), and costs its own row only: the cells of a row left out are not read.
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
    names = [_UNIT.sub("", h).strip() for h in header]
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
        stamps = [_utc_timestamp_or_none(row[at]) for row in good]
        bad_stamps = stamps.count(None)
        if bad_stamps:  # left out before their cells are read: one bad line, one count
            problems["bad timestamp"] += bad_stamps
            good = [row for row, t in zip(good, stamps) if t is not None]
            stamps = [t for t in stamps if t is not None]
        times = np.array(stamps, dtype=np.float64)
    else:
        problems["no timestamp column"] += len(good)
        good, times = [], np.empty(0)

    if "index" in col_of:
        index, _, _ = parse_tokens([row[col_of["index"]] for row in good])
        bad_index = _bad_index(index)
        problems["bad GPU index"] += int(bad_index.sum())
        if bad_index.any():
            good = [row for row, bad in zip(good, bad_index) if not bad]
            index, times = index[~bad_index], times[~bad_index]
    else:
        index = np.zeros(len(good))  # a single-GPU host; several rows per time would collide
    n = len(good)
    cols = list(zip(*good)) if n else [() for _ in names]
    hosts = (cols[col_of["hostname"]] if "hostname" in col_of else ("",) * n)
    fallback = host or "localhost"

    values: dict[str, np.ndarray] = {}
    lookup = source_index("nvidia_smi")
    for name, i in col_of.items():
        mapped = lookup.get(name)
        if mapped is None:
            continue
        field, scale = mapped
        parsed, bad, nans = parse_tokens(cols[i])
        problems["non-numeric value"] += bad
        problems["NaN value"] += nans
        parsed *= scale
        # Two aliases of one field queried together: the first with a value wins.
        values[field.name] = np.where(np.isnan(values[field.name]), parsed, values[field.name]) \
            if field.name in values else parsed
    if TLIMIT_QUERY in col_of and "gpu_temp" in values:
        headroom, bad, nans = parse_tokens(cols[col_of[TLIMIT_QUERY]])
        problems["non-numeric value"] += bad
        problems["NaN value"] += nans
        values["max_op_temp"] = values["gpu_temp"] + headroom  # (the detectors judge its range)

    for reason, count in problems.items():
        health.problem(STAGE, reason, count)
    entities: dict[str, int] = {}
    entity = np.fromiter(
        (entities.setdefault(gpu_entity(h if h.strip().lower() not in _MISSING else fallback, int(g)), len(entities))
         for h, g in zip(hosts, index)),
        dtype=np.int32, count=n)
    if uuids is not None:
        uuid_column = next((cols[col_of[name]] for name in _UUID_COLUMNS if name in col_of), ())
        _read_uuids(entity, list(entities), uuid_column, uuids)
    return SampleBatch("gpu", list(entities), times, entity, values)


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


def _utc_timestamp_or_none(text: str) -> float | None:
    try:
        return _utc_timestamp(text)
    except ValueError:
        return None


def _bad_index(index: np.ndarray) -> np.ndarray:
    """Where a parsed GPU index column holds no GPU index: not a whole number from 0 to
    :data:`~foreshock.streams.samples.MAX_GPU_INDEX` (``1.5``, ``-1``, ``4294967295``, text)."""
    return ~np.isfinite(index) | (index < 0) | (index != np.floor(index)) | (index > MAX_GPU_INDEX)


def _read_uuids(entity: np.ndarray, names: list[str], tokens: Sequence[str], uuids: dict[str, str]) -> None:
    """Note each row's UUID under its GPU's name (``entity``: the row's index in ``names``);
    nvidia-smi's bracketed "no value" forms name none."""
    for row, token in zip(entity, tokens):
        uuid = token.strip()
        if not uuid or uuid.startswith("[") or uuid.lower() in _MISSING:
            continue
        name = names[row]
        uuids[name] = uuid if uuids.get(name, uuid) == uuid else ""  # two boards in one slot name none


def parse_query_gpu_chunks(text: str, host: str | None = None, health: PipelineHealth | None = None,
                           chunk_rows: int = 50_000) -> Iterator[SampleBatch]:
    """:func:`parse_query_gpu` over a long CSV (``nvidia-smi --query-gpu=... -l 1`` left running
    for days), ``chunk_rows`` lines at a time: parsed whole, its cells as Python strings took
    about ten times the file's size in memory; a chunk's strings are freed once it is columnar."""
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
    for piece in line_chunks(text, chunk_rows, pos):
        yield parse_query_gpu(piece, host, health, columns=header)


# ---- dmon ----------------------------------------------------------------------------------
def parse_dmon(text: str, host: str = "localhost", start: float = 0.0, interval: float = 1.0,
               health: PipelineHealth | None = None) -> SampleBatch:
    """Parse ``nvidia-smi dmon`` output (any ``-s`` selection, with or without ``-o DT``)."""
    health = health if health is not None else PipelineHealth()
    lookup = source_index("dmon")
    problems: Counter[str] = Counter()
    header: list[str] = []
    rows: list[list[str]] = []
    times: list[float] = []
    cycle = -1
    seen: set[str] = set()
    expect_units = False
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("#"):
            tokens = line.lstrip().lstrip("#").split()
            if "gpu" in tokens and not expect_units:
                header, expect_units = tokens, True
            else:
                expect_units = False  # the units row (# Idx W C ...) or a comment
            continue
        expect_units = False
        if not header:
            problems["data before header"] += 1
            continue
        tokens = line.split()
        if len(tokens) != len(header):
            problems["truncated row" if len(tokens) < len(header) else "row with extra columns"] += 1
            continue
        row = dict(zip(header, tokens))
        if "Date" in row and "Time" in row:
            try:
                t = datetime.strptime(f"{row['Date']} {row['Time']}", "%Y%m%d %H:%M:%S").replace(
                    tzinfo=timezone.utc).timestamp()
            except ValueError:
                problems["bad timestamp"] += 1
                continue
        elif "Time" in row:
            problems["time without date (use -o DT)"] += 1
            continue
        else:
            if row["gpu"] in seen or cycle < 0:
                cycle += 1
                seen = set()
            seen.add(row["gpu"])
            t = start + cycle * interval
        rows.append(tokens)
        times.append(t)

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
    for reason, count in problems.items():
        health.problem(DMON_STAGE, reason, count)
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
        self._choices = query_fields() + [[TLIMIT_QUERY]]  # (max_op_temp: see TLIMIT_QUERY)
        self.reads_boards = True
        # asked for with reads_boards; a choice like the others, emptied if the driver rejects it
        self._uuid_choice = [UUID_QUERY]
        self._boards = GpuBoards(self.health, STAGE)

    def argv(self) -> list[str]:
        choices = self._choices + ([self._uuid_choice] if self.reads_boards else [])
        names = ["timestamp", "index"] + [choice[0] for choice in choices if choice]
        return [self.executable, f"--query-gpu={','.join(names)}", "--format=csv"]

    def poll(self) -> list[Frame]:
        now = self.clock()
        out, error = run_command(self.argv(), self.health, STAGE, self.timeout)
        if out is None:
            m = _INVALID_FIELD.search(error)
            if m:
                self._drop_name(m.group(1))
            return []
        uuids: dict[str, str] | None = {} if self.reads_boards else None
        batch = parse_query_gpu(out, host=self.host, health=self.health, ts=now, uuids=uuids)
        if self._topology is None:
            if not len(batch):
                return []
            self._topology = gpu_topology([batch])
        if uuids:
            batch = self._boards.tag(batch, uuids, self._topology)
        return [batch.to_frame(self._topology, self.health, STAGE)]

    def _drop_name(self, name: str) -> None:
        for choice in [*self._choices, self._uuid_choice]:
            if choice and choice[0] == name:
                choice.pop(0)
                self.health.problem(STAGE, "query field rejected by the driver",
                                    detail=f"{name}; now {'trying ' + choice[0] if choice else 'dropped'}")
                return
