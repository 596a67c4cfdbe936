"""``foreshock import``: real captures -> a recording folder that ``foreshock replay`` reads."""

from __future__ import annotations

import json
import math
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from foreshock.frames import Frame, frames_from_records
from foreshock.health import PipelineHealth
from foreshock.recording import RecordingWriter
from foreshock.streams.alibaba import STATS, read_alibaba
from foreshock.streams.dcgm import parse_dcgm_text
from foreshock.streams.infiniband import list_ports, port_topology, read_infiniband
from foreshock.streams.nvidia_smi import capture_collected_at, capture_sections, parse_dmon, parse_query_gpu_chunks
from foreshock.streams.samples import SampleBatch, gpu_topology, line_chunks, split_gpu_entity
from foreshock.topology import Topology

from .common import finite_number

FORMATS = ("dcgm", "nvidia-smi", "dmon", "alibaba", "sysfs", "jsonl")
# 1e11 s since the epoch is the year 5138: larger stamps are ms, us or ns, not seconds
SECONDS_LIMIT = 1e11
# utf-8-sig: files saved by Windows tools (Excel, Notepad, PowerShell) start with a BOM that
# would otherwise glue itself to the first header, metric or JSON record
ENCODING = "utf-8-sig"


def _parse_time(text: str) -> float:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"not an ISO time: {text!r}") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def _sections(text: str, kind: str) -> list[str]:
    """Bodies of ``<phase> :: <kind>`` sections of an nvidia-smi capture file, or the whole text."""
    found = [body for title, body in capture_sections(text).items() if title.endswith(f":: {kind}")]
    return found or [text]


def _gpu_import(batches: list[SampleBatch], health: PipelineHealth) -> tuple[Topology | None, list[Frame]]:
    batch = SampleBatch.concat(batches).sorted_by_time() if batches else SampleBatch.empty("gpu")
    if not len(batch):
        return None, []  # the caller reports it, with the problems that explain it
    topology = gpu_topology([batch])
    return topology, [batch.to_frame(topology, health)]


JSONL_CHUNK_LINES = 100_000


def _json_records(text: str, path: Path, health: PipelineHealth | None) -> Iterator[list[object]]:
    """The file's JSON records, a list per :data:`JSONL_CHUNK_LINES` lines (a list of every
    record of a days-long file took many times its size in memory); with ``health``, a line that
    is not JSON is counted, naming its number."""
    lineno = 0
    for piece in line_chunks(text, JSONL_CHUNK_LINES):
        records: list[object] = []
        for line in piece.splitlines():
            lineno += 1
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                if health is not None:
                    health.problem("jsonl", "invalid JSON line", detail=f"{path}:{lineno}: {exc.msg}")
        yield records


def _jsonl(path: Path, topology_path: Path | None, health: PipelineHealth) -> tuple[Topology, list[Frame]]:
    text = path.read_text(encoding=ENCODING, errors="replace")
    if topology_path is not None:
        topology = Topology.load(topology_path)
    else:  # a first pass for the GPUs' names: the topology resolves the entities of the second
        try:
            topology = Topology.from_gpu_hosts(
                split_gpu_entity(str(r.get("entity"))) for records in _json_records(text, path, None) for r in records
                if isinstance(r, dict) and r.get("kind") == "gpu")
        except ValueError as exc:
            raise click.ClickException(f"{exc}; pass --topology for entities other than HOST/gpuN") from None

    def resolve(kind: str, name: str) -> int:
        try:
            return topology.slot(kind, name)
        except (KeyError, ValueError):
            return -1

    parts: dict[str, list[Frame]] = {}
    for records in _json_records(text, path, health):
        frames, rejected = frames_from_records(records, resolve)  # type: ignore[arg-type]
        for _, reason in rejected:
            health.problem("jsonl", reason)
        for kind, frame in frames.items():
            parts.setdefault(kind, []).append(frame)
    return topology, [Frame.concat(frames).sorted_by_time() for frames in parts.values()]


@click.command("import")
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="What PATH holds.")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Recording folder to write.")
@click.option("--host", default=None, help="Node name when the capture does not say (nvidia-smi, dmon, sysfs).")
@click.option("--time", "at", default=None,
              help="ISO time of a single-snapshot capture (dcgm, sysfs) or of the first dmon sample. "
                   "Default: the capture's collected_at, else the file's modification time.")
@click.option("--interval", default=1.0, show_default=True, type=float, callback=finite_number(positive=True),
              help="dmon sampling interval (seconds).")
@click.option("--stat", default="avg", show_default=True, type=click.Choice(STATS),
              help="alibaba: which hourly statistic to import.")
@click.option("--topology", "topology_path", default=None, type=click.Path(exists=True, path_type=Path),
              help="jsonl: topology.yaml the entities refer to (default: derived from HOST/gpuN names).")
def command(fmt: str, path: Path, out: Path, host: str | None, at: str | None, interval: float, stat: str,
            topology_path: Path | None) -> None:
    """Import real captures (dcgm-exporter text, nvidia-smi CSV or dmon, the Alibaba optics CSV,
    an InfiniBand sysfs tree, JSON lines) into a recording folder.

    Every problem in the input is counted and listed in the summary; nothing is dropped silently.
    """
    console = Console()
    health = PipelineHealth()
    started = time.perf_counter()
    if fmt != "sysfs" and path.is_dir():
        raise click.BadParameter(f"{path} is a folder; --format {fmt} reads a file", param_hint="PATH")
    text = path.read_text(encoding=ENCODING, errors="replace") if path.is_file() else ""
    when = _parse_time(at) if at else (capture_collected_at(text) if text else None) or path.stat().st_mtime
    notes: dict[str, int] = {}

    if fmt == "dcgm":
        topology, frames = _gpu_import([parse_dcgm_text(text, when, health, host or "localhost")], health)
    elif fmt == "nvidia-smi":
        topology, frames = _gpu_import([batch for body in _sections(text, "query-gpu")
                                        for batch in parse_query_gpu_chunks(body, host, health)], health)
    elif fmt == "dmon":
        batches, start = [], when
        for body in _sections(text, "dmon"):
            batch = parse_dmon(body, host or "localhost", start, interval, health)
            batches.append(batch)
            if len(batch):  # sections follow each other: dmon prints no times of its own
                start = float(batch.ts.max()) + interval
        topology, frames = _gpu_import(batches, health)
    elif fmt == "alibaba":
        try:
            imported = read_alibaba(path, stat, health)
        except (ValueError, UnicodeDecodeError) as exc:  # not the Alibaba CSV at all (empty, other columns)
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
        topology, frames = _jsonl(path, topology_path, health)

    if topology is None or not sum(len(f) for f in frames):
        # before the writer: it clears the folder, and an empty import must not replace a recording
        _problems(console, health, notes)
        why = "every row was rejected (see above)" if health.problems or notes else "the input holds no data"
        raise click.ClickException(f"no samples imported from {path}: {why}; {out} left unchanged")

    meta: dict[str, object] = {"source": f"import:{fmt}", "imported_from": str(path)}
    stamps = np.unique(np.concatenate([f.ts for f in frames])) if frames else np.empty(0)
    if len(stamps) > 1:
        meta["interval"] = float(np.median(np.diff(stamps)))
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
        problems = Table(title="Input problems (counted, not imported)")
        for column in ("stage", "reason", "count"):
            problems.add_column(column)
        for (stage, reason), count in sorted(health.problems.items()):
            problems.add_row(stage, escape(reason), str(count))
        console.print(problems)
    else:
        console.print("no input problems")
