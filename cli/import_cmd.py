"""``foreshock import``: real captures -> a recording folder that ``foreshock replay`` reads."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from datetime import datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Callable, Iterator
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from foreshock.frames import REASONS_AFTER_ENTITY, Frame, frames_from_records, unknown_entity_reason
from foreshock.guard import MIN_INTERVAL_S
from foreshock.health import PipelineHealth
from foreshock.recording import RecordingWriter
from foreshock.streams import dcgm, nvidia_smi
from foreshock.streams.alibaba import STATS, read_alibaba
from foreshock.streams.dcgm import parse_dcgm_text, scrape_rounds, split_pages
from foreshock.streams.infiniband import list_ports, port_topology, read_infiniband
from foreshock.streams.nvidia_smi import (CaptureSection, capture_collected, capture_collected_at, capture_section_list,
                                          capture_zone, human_report, newest_csv_stamp, parse_dmon,
                                          parse_query_gpu_chunks)
from foreshock.streams.polling import with_board_ids
from foreshock.streams.samples import (MAX_GPU_INDEX, GpuIndexError, SampleBatch, gpu_topology, line_chunks,
                                       split_gpu_entity)
from foreshock.topology import Topology, TopologyError

from .common import cluster_name_arg, finite_number, overwrite_option, refuse_recording

FORMATS = ("dcgm", "nvidia-smi", "dmon", "alibaba", "sysfs", "jsonl")
# 1e11 s since the epoch is the year 5138: larger stamps are ms, us or ns, not seconds
SECONDS_LIMIT = 1e11
# utf-8-sig: files saved by Windows tools (Excel, Notepad, PowerShell) start with a BOM that
# would otherwise glue itself to the first header, metric or JSON record
ENCODING = "utf-8-sig"


# a fixed offset as --tz takes it: +02:00, -0530, +02
_OFFSET = re.compile(r"^([+-])(\d{2}):?(\d{2})?$")


def _parse_time(text: str, zone: tzinfo = timezone.utc) -> float:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"not an ISO time: {text!r}") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=zone)).timestamp()


def _parse_zone(ctx: click.Context, param: click.Parameter, text: str | None) -> tzinfo | None:
    """``--tz``: ``UTC``/``Z``, an offset (``+02:00``) or a zone name (``Europe/Berlin``, whose
    offset follows daylight saving time over a long log)."""
    if text is None:
        return None
    if text.strip().upper() in ("UTC", "Z"):
        return timezone.utc
    m = _OFFSET.match(text.strip())
    if m:
        offset = timedelta(hours=int(m.group(2)), minutes=int(m.group(3) or 0))
        if offset < timedelta(hours=24):
            return timezone(-offset if m.group(1) == "-" else offset)
    else:
        try:
            return ZoneInfo(text.strip())
        except (ZoneInfoNotFoundError, ValueError, OSError):  # a path-like or empty name, a folder (Europe)
            pass
    raise click.BadParameter(f"not a time zone: {text!r} (UTC, an offset such as +02:00, or a name "
                             "such as Europe/Berlin)")


LINE_FED_STAGES = {"dcgm": dcgm.STAGE, "nvidia-smi": nvidia_smi.STAGE, "dmon": nvidia_smi.DMON_STAGE}
"""The formats whose every line ends with a line feed, and the stage that counts their problems:
the Prometheus text format requires one after the last line, nvidia-smi prints one after each row.
(Not the Alibaba CSV: the published file ends without one, on a row of empty cells;
``streams.alibaba`` leaves out only a last line that holds data.)"""


def _whole_lines(text: str, stage: str, health: PipelineHealth) -> str:
    """``text`` up to its last line feed. A file of a line-fed format whose last line has none was
    cut while it was written or copied (a ``nvidia-smi -l 1`` log still running, a scrape saved
    half-way), and its last number may be cut with it: ``100 %`` read as ``10``, ``25`` °C as ``2``,
    readings that look real. That line is left out and counted as ``truncated row`` (a blank one,
    which holds nothing, only left out)."""
    end = text.rfind("\n") + 1
    if text[end:].strip():
        health.problem(stage, "truncated row",
                       detail="the file's last line has no line feed (cut while written or copied): left out")
    return text[:end]


def _sections(text: str, kind: str) -> list[CaptureSection]:
    """The ``<phase> :: <kind>`` sections of an nvidia-smi capture file in file order, those of
    each capture of a file holding several (a title repeats: keyed by it, the earlier captures'
    rows were lost), or the whole text as one, with the file's first ``collected_at:`` if any."""
    found = [section for section in capture_section_list(text) if section.title.endswith(f":: {kind}")]
    if found:
        return found
    collected = capture_collected(text)
    return [CaptureSection("", text, collected, 0, capture_zone(collected, text))]


def _zone(section: CaptureSection, told: tzinfo | None) -> tzinfo:
    """The zone a section's zone-less times are read in: ``--tz`` where given, else its capture's
    host's (the offset its ``collected_at:`` states, or the one its first CSV timestamp shows: the
    capture tool writes ``collected_at:`` in UTC, ``Z``, while nvidia-smi prints local time), else UTC."""
    return told or section.zone or timezone.utc


def _dmon_batches(text: str, host: str, when: float, timed: bool, interval: float, told: tzinfo | None,
                  health: PipelineHealth) -> list[SampleBatch]:
    """The dmon sections' samples. dmon prints no dates: with ``--time`` (``timed``) the sections
    follow each other from it (``when``); else each capture's sections start at its own
    ``collected_at:`` (``when`` for text before any), each no earlier than the newest CSV timestamp
    of the sections before it in its capture (the commands ran in file order: ``load :: dmon`` ran
    after ``load :: query-gpu``, some seconds into the capture, not right after the idle dmon) nor
    than the end of its capture's previous dmon section."""
    sections = capture_section_list(text)
    is_dmon = [section.title.endswith(":: dmon") for section in sections]
    if not any(is_dmon):  # a bare dmon log: the whole text
        sections, is_dmon = _sections(text, "dmon"), [True]
    batches: list[SampleBatch] = []
    ends: dict[int, float] = {}  # capture -> where its next dmon section may start
    newest: dict[int, float] = {}  # capture -> its newest CSV timestamp so far
    for section, dmon in zip(sections, is_dmon):
        zone = _zone(section, told)
        if not dmon:
            stamp = None if timed else newest_csv_stamp(section.body, zone)
            if stamp is not None:
                newest[section.capture] = max(stamp, newest.get(section.capture, stamp))
            continue
        key = 0 if timed else section.capture  # --time: one run of sections from it
        collected = None if timed else section.collected_at(zone)
        start = max(ends.get(key, collected if collected is not None else when), newest.get(key, -math.inf))
        batch = parse_dmon(section.body, host, start, interval, health, zone)
        batches.append(batch)
        if len(batch):
            ends[key] = float(batch.ts.max()) + interval
    return batches


def _interval(frames: list[Frame]) -> float | None:
    """The recording's sampling interval: the median of each entity's own gaps between its rows,
    pooled over entities, None where no entity has two times. Not the gaps between every row's
    stamps: a host's 8 GPUs polled every second, printed 3 ms apart, gave 0.003 s (replay cut each
    poll into 8 windows and reported time jumps), two hosts polled half a second apart 0.5 s."""
    gaps = []
    for frame in frames:
        order = np.lexsort((frame.ts, frame.slot))
        slot, ts = frame.slot[order], frame.ts[order]
        step = np.diff(ts)
        gaps.append(step[(slot[1:] == slot[:-1]) & (step > 0) & np.isfinite(step)])  # a repeated stamp is no gap
    pooled = np.concatenate(gaps) if gaps else np.empty(0)
    return float(np.median(pooled)) if len(pooled) else None


def _dcgm_boards(batch: SampleBatch, uuids: dict[str, str]) -> SampleBatch:
    """``batch`` with each row's ``board_id`` from its GPU's ``UUID`` label, as the live source
    carries it (README, "GPU board swaps": a replay restarts a GPU whose board changed). The
    parser folds a file into one row per GPU, so the GPU's UUID is its row's; a GPU whose series
    name two ("" in ``uuids``) has a row of two boards' values, and names no board (NaN). A page
    without UUID labels gets no column, as before."""
    return with_board_ids(batch, uuids) if len(batch) and any(uuids.values()) else batch


def _gpu_import(batches: list[SampleBatch], health: PipelineHealth) -> tuple[Topology | None, list[Frame]]:
    batch = SampleBatch.concat(batches).sorted_by_time() if batches else SampleBatch.empty("gpu")
    if not len(batch):
        return None, []  # the caller reports it, with the problems that explain it
    try:
        topology = gpu_topology([batch])
    except ValueError:  # every GPU's host empty or blank (Hostname=" "): no node to name, each row unknown
        health.problem("import", "unknown gpu entity", len(batch),
                       detail=", ".join(repr(name) for name in batch.entities[:3]))
        return None, []
    return topology, [batch.to_frame(topology, health)]


JSONL_CHUNK_LINES = 100_000


def _json_records(text: str, path: Path, health: PipelineHealth | None) -> Iterator[list[object]]:
    """The file's JSON records, a list per :data:`JSONL_CHUNK_LINES` lines (a list of every
    record of a days-long file took many times its size in memory); with ``health``, a line that
    is not JSON is counted, naming its number."""
    lineno = 0
    for piece in line_chunks(text, JSONL_CHUNK_LINES):
        records: list[object] = []
        # lines end at "\n" only: str.splitlines also splits at U+2028, U+2029 and U+0085, which
        # JSON allows unescaped inside a string, cutting a valid record in two
        for line in piece.removesuffix("\n").split("\n"):
            lineno += 1
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except (ValueError, RecursionError) as exc:  # JSONDecodeError, a 5000-digit number, deep nesting
                if health is not None:
                    why = exc.msg if isinstance(exc, json.JSONDecodeError) else \
                        "nested too deep" if isinstance(exc, RecursionError) else str(exc)
                    health.problem("jsonl", "invalid JSON line", detail=f"{path}:{lineno}: {why}")
        yield records


class _EntityNumbers:
    """Entity names numbered per kind as they first come, standing in for slots while the
    topology is still being learnt from the GPUs' names (see :func:`_jsonl`)."""

    def __init__(self) -> None:
        self.names: dict[str, list[str]] = {}
        self._number: dict[str, dict[str, int]] = {}

    def __call__(self, kind: str, name: str) -> int:
        numbers = self._number.setdefault(kind, {})
        number = numbers.get(name)
        if number is None:
            number = numbers[name] = len(numbers)
            self.names.setdefault(kind, []).append(name)
        return number

    def slots(self, kind: str, topology: Topology) -> np.ndarray:
        """The topology's slot of each numbered name of ``kind``, -1 for one it does not hold."""
        resolve = topology.slots_resolver()
        return np.array([resolve(kind, name) for name in self.names.get(kind, [])], dtype=np.int32)


UNKNOWN_NAMED = 5
"""Entity names the ``unknown <kind> entity`` log line names; it counts the rest."""


class _UnknownEntities:
    """Records whose entity the topology does not hold, counted per kind under one reason,
    ``unknown <kind> entity``, the first names in its detail: a reason quoting the name
    made one warning ("logged once") and one row of the problems table per name, hundreds
    for a file of hosts the topology lacks."""

    def __init__(self) -> None:
        self._records: dict[str, int] = {}  # kind -> records
        self._names: dict[str, dict[str, None]] = {}  # kind -> the names as quoted, in the order they came

    def add(self, kind: str, shown: str, count: int = 1) -> None:
        self._records[kind] = self._records.get(kind, 0) + count
        self._names.setdefault(kind, {})[shown] = None

    def count(self, health: PipelineHealth, note: str = "") -> None:
        for kind, records in self._records.items():
            names = list(self._names[kind])
            health.problem("jsonl", f"unknown {kind} entity", count=records,
                           detail=f"{len(names)} not in the topology: {_first_names(names)}{note}")


def _first_names(names: list[str]) -> str:
    """The first :data:`UNKNOWN_NAMED` of ``names``, and how many more."""
    rest = len(names) - UNKNOWN_NAMED
    return ", ".join(names[:UNKNOWN_NAMED]) + (f" and {rest} more" if rest > 0 else "")


def _jsonl(text: str, path: Path, topology_path: Path | None, health: PipelineHealth) -> tuple[Topology, list[Frame]]:
    """Parse the JSON lines once. Without ``--topology`` the topology is the one the GPUs' names
    imply (HOST/gpuN), known only at the end of the file, so rows keep a number per entity name
    until then (:class:`_EntityNumbers`) and are given their slots at the end; a record whose entity
    the topology does not hold is counted then, under the reason it had before any other: ``bad GPU
    index`` for a GPU past :data:`~foreshock.streams.samples.MAX_GPU_INDEX` (the topology would
    list every GPU up to it: 4294967295, a common "no index" sentinel, took all memory), else
    ``unknown <kind> entity`` (a GPU not named HOST/gpuN among them: ``gpu01``, ``gpu²``)."""
    if topology_path is not None:
        try:
            topology = Topology.load(topology_path)
        except TopologyError as exc:  # a user's file: a clean message, as `topology show` gives, not a traceback
            why = str(exc)
            named = why if str(topology_path) in why else f"{topology_path}: {why}"
            raise click.ClickException(f"--topology {named}") from None
        resolve: Callable[[str, str], int] = topology.slots_resolver()
    else:
        resolve = numbers = _EntityNumbers()
        gpus_per_host: dict[str, int] = {}
        # (kind, name, reason) -> records rejected after their entity was looked up: counted under
        # `reason` only if the topology holds the entity; {kind: {name: repr}} for non-string entities
        waiting: dict[tuple[str, str, str], int] = {}
        raw_entity: dict[str, dict[str, str]] = {}
        records_past_max_index: dict[str, int] = {}  # GPU name -> its records
    parts: dict[str, list[tuple[int, Frame]]] = {}
    unknown = _UnknownEntities()
    for piece, records in enumerate(_json_records(text, path, health)):
        if topology_path is None:
            for r in records:
                if not isinstance(r, dict):
                    continue
                entity = r.get("entity")
                if not isinstance(entity, str):  # its reason quotes it as JSON gave it (5, None), not as '5'
                    raw_entity.setdefault(str(r.get("kind")), {})[str(entity)] = repr(entity)
                elif r.get("kind") == "gpu":
                    try:
                        host, gpu = split_gpu_entity(entity)
                    except GpuIndexError:
                        records_past_max_index.setdefault(entity, 0)
                    except ValueError:  # GpuHostError among them: "/gpu0" named no node and aborted the import
                        pass  # a GPU the derived topology lacks: its records are counted at the end
                    else:
                        gpus_per_host[host] = max(gpus_per_host.get(host, 0), gpu + 1)
        frames, rejected = frames_from_records(records, resolve)  # type: ignore[arg-type]
        for record, reason in rejected:
            if topology_path is None and reason.startswith(REASONS_AFTER_ENTITY):
                key = (str(record.get("kind")), str(record.get("entity")), reason)
                waiting[key] = waiting.get(key, 0) + 1
            elif reason == unknown_entity_reason(record.get("kind"), record.get("entity")):
                unknown.add(str(record.get("kind")), repr(record.get("entity")))
            else:
                health.problem("jsonl", reason)
        for kind, frame in frames.items():
            parts.setdefault(kind, []).append((piece, frame))
    if topology_path is None:
        try:
            topology = Topology.from_gpu_hosts((host, n - 1) for host, n in gpus_per_host.items())
        except ValueError as exc:
            raise click.ClickException(f"{exc}; pass --topology for entities other than HOST/gpuN") from None
        slots = {kind: numbers.slots(kind, topology) for kind in numbers.names}

        def not_placed(kind: str, name: str, count: int) -> None:
            """Count ``count`` records of an entity the derived topology does not hold."""
            if kind == "gpu" and name in records_past_max_index:
                records_past_max_index[name] += count
            else:
                unknown.add(kind, raw_entity.get(kind, {}).get(name, repr(name)), count)

        for kind, pieces in parts.items():
            placed = []
            for piece, frame in pieces:
                slot = slots[kind][frame.slot]
                for number, count in zip(*np.unique(frame.slot[slot < 0], return_counts=True)):
                    not_placed(kind, numbers.names[kind][int(number)], int(count))
                kept = frame.take(slot >= 0)
                placed.append((piece, Frame(kind, kept.ts, slot[slot >= 0], kept.columns)))
            parts[kind] = [(piece, frame) for piece, frame in placed if len(frame)]
        known = topology.slots_resolver()
        for (kind, name, reason), count in waiting.items():
            if known(kind, name) >= 0:
                health.problem("jsonl", reason, count=count)
            else:
                not_placed(kind, name, count)
        past_max = [repr(name) for name, count in records_past_max_index.items() if count]
        health.problem("jsonl", "bad GPU index", count=sum(records_past_max_index.values()),
                       detail=f"{len(past_max)} GPU names with an index over {MAX_GPU_INDEX}: "
                              f"{_first_names(past_max)}")
    unknown.count(health, "" if topology_path is not None else
                  "; the topology is derived from names HOST/gpuN (pass --topology for others)")
    # kinds in the order their first rows came, as when every row was placed as it was read
    ordered = sorted((kind for kind in parts if parts[kind]), key=lambda kind: parts[kind][0][0])
    return topology, [Frame.concat(frame for _, frame in parts[kind]).sorted_by_time() for kind in ordered]


@click.command("import")
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="What PATH holds.")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Recording folder to write; one that holds a recording already is refused unless --overwrite "
                   "is given.")
@overwrite_option
@click.option("--node", "--host", "host", default=None,
              help="Node name when the capture does not say (nvidia-smi, dmon, sysfs).")
@click.option("--time", "at", default=None,
              help="ISO time of a single-snapshot capture (dcgm, sysfs), of a dcgm file's first scrape or of the "
                   "first dmon sample (without a zone: in --tz). Default: the capture's collected_at (each "
                   "capture's, for a file of several), else the file's modification time.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=MIN_INTERVAL_S),
              callback=finite_number(positive=True),
              help="dmon sampling interval, or the time between the scrapes of a dcgm file holding several (its "
                   "rounds with --round-of-hosts; seconds; neither carries a date, so they are stamped this far "
                   "apart).")
@click.option("--stat", default="avg", show_default=True, type=click.Choice(STATS),
              help="alibaba: which hourly statistic to import.")
@click.option("--topology", "topology_path", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="jsonl: topology.yaml the entities refer to (default: derived from HOST/gpuN names).")
@click.option("--cluster", default=None, callback=cluster_name_arg,
              help="The cluster label of the topology derived from the input (default: 'imported'; a sysfs tree's "
                   "host; the Alibaba data set's own). A --topology file names its own cluster, which stands: "
                   "--cluster is refused with it.")
@click.option("--tz", "told_zone", default=None, callback=_parse_zone, metavar="ZONE",
              help="Time zone of times the input prints without one: nvidia-smi CSV timestamps, dmon -o DT, a "
                   "collected_at or --time without a zone (nvidia-smi prints its host's local time). UTC, an "
                   "offset (+02:00) or a name (Europe/Berlin). Default: a capture's host's zone, the offset its "
                   "collected_at states, else (collected_at in UTC, Z, as the capture tool writes it) the gap from "
                   "it to the capture's first CSV timestamp, to a quarter hour; else UTC. Given, it is used instead.")
@click.option("--round-of-hosts", is_flag=True,
              help="dcgm: a file appended by one loop over several hosts' exporters (for h in n1 n2; do curl "
                   "$h:9400/metrics; done >> FILE, every --interval): consecutive pages of distinct hosts share a "
                   "stamp; a page of a host already in the round, or naming no GPU, starts the next round. Default: "
                   "each page --interval after the one before (a file cannot tell such a loop from one endpoint "
                   "answering for different hosts, as a load-balanced Service does).")
def command(fmt: str, path: Path, out: Path, overwrite: bool, host: str | None, at: str | None, interval: float,
            stat: str, topology_path: Path | None, cluster: str | None, told_zone: tzinfo | None,
            round_of_hosts: bool) -> None:
    """Import real captures (dcgm-exporter text, nvidia-smi CSV or dmon, the Alibaba optics CSV,
    an InfiniBand sysfs tree, JSON lines) into a recording folder.

    Every problem in the input is counted and listed in the summary; nothing is dropped silently.
    """
    if cluster is not None and topology_path is not None:
        raise click.UsageError("--cluster names the cluster of a topology derived from the input; the --topology "
                               "file names its own (its 'cluster:'), which stands")
    refuse_recording(out, overwrite)  # before the input is read: a large capture takes a while to parse
    console = Console()
    health = PipelineHealth()
    started = time.perf_counter()
    if fmt != "sysfs" and path.is_dir():
        raise click.BadParameter(f"{path} is a folder; --format {fmt} reads a file", param_hint="PATH")
    text = path.read_text(encoding=ENCODING, errors="replace") if path.is_file() else ""
    zone = told_zone or timezone.utc
    when = _parse_time(at, zone) if at else (capture_collected_at(text, zone) if text else None) or path.stat().st_mtime
    if fmt in LINE_FED_STAGES:
        text = _whole_lines(text, LINE_FED_STAGES[fmt], health)
    notes: dict[str, int] = {}
    if fmt in ("nvidia-smi", "dmon") and not any(s.title.endswith((":: query-gpu", ":: dmon"))
                                                  for s in capture_section_list(text)):
        report = human_report(text)  # a capture file's -q sections are left alone: it is read by its banners
        if report is not None:
            raise click.ClickException(f"{path} holds {report}, which foreshock does not import; capture "
                                       f"{nvidia_smi.READABLE}")

    if fmt == "dcgm":
        # a file of several scrapes: each its own samples, stamped --interval apart (their lines
        # carry no time), each GPU's board its page's UUID (one parse folded them into one row)
        batches: list[SampleBatch] = []
        once: set[str] = set()  # an unmapped metric, a GPU's unsupported field: counted in one page, as live
        # --round-of-hosts: several hosts' pages of one round share its time (streams.dcgm.scrape_rounds);
        # not by default: pages of distinct hosts are as well one endpoint answering for several (a
        # load-balanced Service, an exporter restarted under a new Hostname), each page its own scrape
        pages = split_pages(text)
        rounds = scrape_rounds(pages, host or "localhost") if round_of_hosts else list(range(len(pages)))
        for page, k in zip(pages, rounds):
            uuids: dict[str, str] = {}
            batch = parse_dcgm_text(page, when + k * interval, health, host or "localhost", once, uuids)
            batches.append(_dcgm_boards(batch, uuids))
        if len(pages) > 1:  # said, as their times are the option's, not the file's
            n_rounds = rounds[-1] + 1
            console.print(f"{len(pages)} scrapes in the file, stamped {interval:g} s apart (--interval)"
                          if n_rounds == len(pages) else
                          f"{len(pages)} scrapes in the file, {n_rounds} rounds of several hosts' pages, "
                          f"stamped {interval:g} s apart (--interval)")
        topology, frames = _gpu_import(batches, health)
    elif fmt == "nvidia-smi":
        # board_ids: each row's own UUID, so a log spanning a board swap restarts that GPU in replay
        # each capture's rows in its own zone (a file may hold several captures appended)
        seen: set[str] = set()  # a column not read: counted once over every section
        topology, frames = _gpu_import([batch for section in _sections(text, "query-gpu")
                                        for batch in parse_query_gpu_chunks(section.body, host, health, board_ids=True,
                                                                            zone=_zone(section, told_zone),
                                                                            columns_seen=seen)],
                                       health)
    elif fmt == "dmon":
        topology, frames = _gpu_import(_dmon_batches(text, host or "localhost", when, at is not None, interval,
                                                     told_zone, health), health)
    elif fmt == "alibaba":
        try:
            imported = read_alibaba(path, stat, health)
        except ValueError as exc:  # not the Alibaba CSV at all (empty, other columns)
            raise click.ClickException(str(exc)) from None
        topology, frames = imported.topology, [imported.batch.to_frame(imported.topology, health)]
        notes = dict(imported.skipped)
    elif fmt == "sysfs":
        if not path.is_dir():
            raise click.BadParameter(f"{path} is not a folder (expected a /sys/class/infiniband tree)")
        node = host or "localhost"
        topology = port_topology(node, list_ports(path))
        frames = [read_infiniband(path, node, when, health).to_frame(topology, health)]
    else:
        topology, frames = _jsonl(text, path, topology_path, health)

    if topology is None or not sum(len(f) for f in frames):
        # before the writer: it clears the folder, and an empty import must not replace a recording
        _problems(console, health, notes)
        why = "every row was rejected (see above)" if health.problems or notes else "the input holds no data"
        raise click.ClickException(f"no samples imported from {path}: {why}; {out} left unchanged")

    if cluster is not None:  # (slots are by name: the frames stand)
        topology = dataclasses.replace(topology, cluster=cluster)
    meta: dict[str, object] = {"source": f"import:{fmt}", "imported_from": str(path)}
    interval_s = _interval(frames)
    if interval_s is not None:
        meta["interval"] = interval_s
    try:
        with RecordingWriter(out, topology, meta=meta) as writer:
            for frame in frames:
                writer.write(frame)
    except OSError as exc:
        raise click.ClickException(f"cannot write the recording to {out}: {exc.strerror or exc}") from None
    _summary(console, out, frames, topology, health, notes, time.perf_counter() - started)


def _summary(console: Console, out: Path, frames: list[Frame], topology: Topology, health: PipelineHealth,
             notes: dict[str, int], seconds: float) -> None:
    table = Table(title=f"Imported into {out}")
    for column in ("kind", "rows", "entities", "first sample (UTC)", "last sample (UTC)"):
        table.add_column(column)
    for frame in frames:
        if not len(frame):
            continue
        first, last = _utc(float(frame.ts.min())), _utc(float(frame.ts.max()))
        table.add_row(frame.kind, str(len(frame)), f"{len(np.unique(frame.slot))} of {topology.size(frame.kind)}",
                      first, last)
    console.print(table)
    finite = [np.abs(f.ts[np.isfinite(f.ts)]) for f in frames]
    top = max((float(ts.max()) for ts in finite if len(ts)), default=0.0)
    if top > SECONDS_LIMIT:
        console.print(f"[yellow]warning:[/] timestamps up to {top:.6g} look like ms, us or ns since the epoch; "
                      "foreshock reads seconds")
    _problems(console, health, notes)
    console.print(f"done in {seconds:.2f} s")


def _utc(t: float) -> str:
    """A sample time as UTC, or the raw number where datetime cannot represent it."""
    try:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return f"{t:.0f}" if math.isfinite(t) else str(t)


def _problems(console: Console, health: PipelineHealth, notes: dict[str, int]) -> None:
    for reason, count in sorted(notes.items()):
        console.print(f"skipped {count} rows: {escape(reason)}")  # reasons quote the input
    if health.problems:
        # Not "not imported": some reasons drop a row, others keep it (a value set to NaN, a GPU
        # numbered by its first appearance); the reason says which.
        problems = Table(title="Input problems (counted)")
        for column in ("stage", "reason", "count"):
            problems.add_column(column)
        for (stage, reason), count in sorted(health.problems.items()):
            problems.add_row(stage, escape(reason), str(count))
        console.print(problems)
    else:
        console.print("no input problems")
