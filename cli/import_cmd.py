"""``foreshock import``: real captures -> a recording folder that ``foreshock replay`` reads."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

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
from foreshock.streams.nvidia_smi import capture_collected_at, capture_sections, parse_dmon, parse_query_gpu
from foreshock.streams.samples import SampleBatch, gpu_topology, split_gpu_entity
from foreshock.topology import Topology

FORMATS = ("dcgm", "nvidia-smi", "dmon", "alibaba", "sysfs", "jsonl")


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


def _gpu_import(batches: list[SampleBatch], health: PipelineHealth) -> tuple[Topology, list[Frame]]:
    batch = SampleBatch.concat(batches).sorted_by_time()
    if not len(batch):
        raise click.ClickException("no GPU samples found in the input (see the problems above)")
    topology = gpu_topology([batch])
    return topology, [batch.to_frame(topology, health)]


def _jsonl(path: Path, topology_path: Path | None, health: PipelineHealth) -> tuple[Topology, list[Frame]]:
    records: list[object] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            health.problem("jsonl", "invalid JSON line", detail=f"{path}:{lineno}: {exc.msg}")
    if topology_path is not None:
        topology = Topology.load(topology_path)
    else:
        try:
            topology = Topology.from_gpu_hosts(
                split_gpu_entity(str(r.get("entity"))) for r in records
                if isinstance(r, dict) and r.get("kind") == "gpu")
        except ValueError as exc:
            raise click.ClickException(f"{exc}; pass --topology for entities other than HOST/gpuN") from None

    def resolve(kind: str, name: str) -> int:
        try:
            return topology.slot(kind, name)
        except (KeyError, ValueError):
            return -1

    frames, rejected = frames_from_records(records, resolve)  # type: ignore[arg-type]
    for _, reason in rejected:
        health.problem("jsonl", reason)
    return topology, [f.sorted_by_time() for f in frames.values()]


@click.command("import")
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="What PATH holds.")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Recording folder to write.")
@click.option("--host", default=None, help="Node name when the capture does not say (nvidia-smi, dmon, sysfs).")
@click.option("--time", "at", default=None,
              help="ISO time of a single-snapshot capture (dcgm, sysfs) or of the first dmon sample. "
                   "Default: the capture's collected_at, else the file's modification time.")
@click.option("--interval", default=1.0, show_default=True, type=float, help="dmon sampling interval (seconds).")
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
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    when = _parse_time(at) if at else (capture_collected_at(text) if text else None) or path.stat().st_mtime
    notes: dict[str, int] = {}

    if fmt == "dcgm":
        topology, frames = _gpu_import([parse_dcgm_text(text, when, health, host or "localhost")], health)
    elif fmt == "nvidia-smi":
        topology, frames = _gpu_import([parse_query_gpu(body, host, health) for body in _sections(text, "query-gpu")],
                                       health)
    elif fmt == "dmon":
        batches, start = [], when
        for body in _sections(text, "dmon"):
            batch = parse_dmon(body, host or "localhost", start, interval, health)
            batches.append(batch)
            if len(batch):  # sections follow each other: dmon prints no times of its own
                start = float(batch.ts.max()) + interval
        topology, frames = _gpu_import(batches, health)
    elif fmt == "alibaba":
        imported = read_alibaba(path, stat, health)
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

    meta: dict[str, object] = {"source": f"import:{fmt}", "imported_from": str(path)}
    stamps = np.unique(np.concatenate([f.ts for f in frames])) if frames else np.empty(0)
    if len(stamps) > 1:
        meta["interval"] = float(np.median(np.diff(stamps)))
    with RecordingWriter(out, topology, meta=meta) as writer:
        for frame in frames:
            writer.write(frame)
    _summary(console, out, frames, topology, health, notes, time.perf_counter() - started)


def _summary(console: Console, out: Path, frames: list[Frame], topology: Topology, health: PipelineHealth,
             notes: dict[str, int], seconds: float) -> None:
    table = Table(title=f"Imported into {out}")
    for column in ("kind", "rows", "entities", "first sample (UTC)", "last sample (UTC)"):
        table.add_column(column)
    for frame in frames:
        if not len(frame):
            continue
        first, last = (datetime.fromtimestamp(float(t), timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
                       for t in (frame.ts.min(), frame.ts.max()))
        table.add_row(frame.kind, str(len(frame)), f"{len(np.unique(frame.slot))} of {topology.size(frame.kind)}",
                      first, last)
    console.print(table)
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
    console.print(f"done in {seconds:.2f} s")
