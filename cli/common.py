"""Shared wiring for the commands that run the embedded pipeline (replay, demo, watch)."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.registry import DEFAULT_BANK
from foreshock.events import Event
from foreshock.exporters.console import FindingTally, TimeOrigin, render_summary
from foreshock.exporters.jsonl import JsonlSink
from foreshock.exporters.prometheus import MetricsPortError, serve, stop
from foreshock.exporters.store import FindingStore
from foreshock.fields import ENTITY_KINDS
from foreshock.frames import Frame
from foreshock.guard import LONGEST_WAIT_S, MIN_INTERVAL_S
from foreshock.health import PipelineHealth
from foreshock.recording import EVENTS_FILE, META_FILE, PARTIAL, TOPOLOGY_FILE, RecordingError
from foreshock.simulator.engine import MAX_INTERVAL_S
from foreshock.simulator.topology_gen import cluster_size_problem
from foreshock.streams.embedded import EmbeddedPipeline, RunStats
from foreshock.streams.external_feed import ExternalFeed, external_targets, feed_before_frames
from foreshock.topology import Topology

log = logging.getLogger("foreshock.cli")


def detector_option(func):  # type: ignore[no-untyped-def]
    return click.option("--detectors", default=None,
                        help="Comma-separated detector names (default: the standard bank; `default` names it, "
                             "e.g. `default,loop_warming` adds the cooling-loss warning for GPU telemetry alone).")(func)


def detector_names(detectors: str | None) -> list[str] | None:
    """``--detectors`` as registry names, ``default`` standing for the standard bank (so an opt-in
    detector is added without listing the ten); None (the standard bank) where not given."""
    if not detectors:
        return None
    names: list[str] = []
    for name in (d.strip() for d in detectors.split(",") if d.strip()):
        for one in (DEFAULT_BANK if name == "default" else [name]):
            if one not in names:
                names.append(one)
    return names


def param_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--param", "params", multiple=True, metavar="DETECTOR.NAME=VALUE",
        help="Set a detector parameter, e.g. optics.bucket_s=3600 (repeatable; names in each "
             "detector's PARAMS).")(func)


def parse_telemetry(telemetry: str | None) -> list[str] | None:
    """``--telemetry gpu,job`` (evaluate, train) -> ``["gpu", "job"]``; None (every kind) unless given."""
    if telemetry is None:
        return None
    fed = [k.strip() for k in telemetry.split(",") if k.strip()]
    if not fed or set(fed) - set(ENTITY_KINDS):
        raise click.UsageError(f"--telemetry takes entity kinds from {', '.join(ENTITY_KINDS)}; got {telemetry!r}")
    return fed


def parse_params(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``["optics.bucket_s=3600", ...]`` -> ``{"optics": {"bucket_s": 3600.0}}``; numbers become
    floats, anything else stays a string (the detector validates its own parameters)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        target, sep, raw = item.partition("=")
        detector, dot, name = target.strip().partition(".")
        if not sep or not dot or not detector or not name or not raw.strip():
            raise click.UsageError(f"--param {item!r}: expected DETECTOR.NAME=VALUE, e.g. optics.bucket_s=3600")
        value: Any
        try:
            value = float(raw)
        except ValueError:
            value = raw.strip()
        out.setdefault(detector, {})[name.strip()] = value
    return out


def cluster_name_arg(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A click callback for ``--cluster``: a name, not blank nor padded (a label no rule's matcher finds)."""
    if value is not None and (not value.strip() or value != value.strip()):
        raise click.BadParameter(f"a cluster name, not {value!r}")
    return value


cluster_option = click.option(
    "--cluster", default=None, callback=cluster_name_arg,
    help="The cluster label of the topology derived from what the source reads (default: 'default', the same for "
         "every source, so that a cluster's GPU, InfiniBand and BMC sources, on one node or many, add up in one "
         "cluster where rules aggregate by cluster; name it where several clusters share one Prometheus). A "
         "--topology file names its own cluster, which stands: --cluster is refused with it.")
"""``--cluster`` of ``watch``, ``record`` and ``agent`` (:data:`~foreshock.streams.polling.DERIVED_CLUSTER`)."""


def node_named(node: str | None, host: str | None, command: str) -> tuple[str | None, str]:
    """The node name ``--node`` or its deprecated alias ``--host`` gives (``record``, ``agent``: their
    option had been ``--host``, while ``watch`` binds /metrics to its ``--host`` and names nodes
    ``--node``), and the flag used, for messages. Both, naming different nodes: a usage error."""
    if host is None:
        return node, "--node"
    if node is not None and node != host:
        raise click.UsageError(f"--host is the old name of --node: give --node alone (not --node {node} --host {host})")
    click.echo(f"{command}: --host NODE is deprecated, use --node NODE (as watch does, whose --host is the address "
               "/metrics binds to)", err=True)
    return host, "--host"


def serve_options(func):  # type: ignore[no-untyped-def]
    func = click.option("--host", default="127.0.0.1", show_default=True,
                        help="Address of this machine that /metrics binds to (0.0.0.0: all of them).")(func)
    func = click.option("--port", default=9108, show_default=True, type=click.IntRange(0, 65535),
                        help="Port for /metrics (0 = do not serve).")(func)
    func = click.option("--findings", "findings_path", type=click.Path(dir_okay=False), default=None,
                        help="Also write every finding to this JSON-lines file (one a line, as it is found, "
                             "its entity named beside its slot).")(func)
    func = click.option("--top-k", default=16, show_default=True, type=click.IntRange(min=0),
                        help="Per-GPU series exported for the K GPUs nearest their core limit and the K nearest their HBM "
                             "limit (up to 2×K), besides flagged ones (0: flagged ones only).")(func)
    return func


def external_option(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--external", "external_path", type=click.Path(exists=True, dir_okay=False), default=None,
        callback=regular_file,
        help="Follow this JSON-lines file of outside fault/alert events ({\"node\", \"time\", \"type\", "
             "\"severity\"}, e.g. from a scheduler or a BMC), like tail -f: lines in it and lines appended "
             "while the pipeline runs are grouped into incidents. A regular file (a pipe is refused).")(func)


def regular_file(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A click callback refusing a path that is no regular file: the external feed follows a file
    as it grows, and a pipe (bash's ``<(cmd)``) never grows — its events were never read, and
    nothing said so. A path gone since click saw it passes: the feed waits for it, and says so."""
    try:
        mode = os.stat(value).st_mode if value is not None else None
    except OSError:
        return value
    if mode is not None and not stat.S_ISREG(mode):
        raise click.BadParameter(f"{value} is not a regular file (a pipe, such as bash's <(...), cannot be "
                                 "followed): write the events to a file and give its path")
    return value


@dataclass
class PipelineRun:
    pipeline: EmbeddedPipeline
    store: FindingStore
    tally: FindingTally
    health: PipelineHealth
    server: object | None
    jsonl: JsonlSink | None
    external: ExternalFeed | None = None
    make_bank: Callable[[Topology], DetectorBank] | None = None  # the same bank for another topology


def move_run(run: PipelineRun, topology: Topology, stage: str) -> str:
    """Carry ``run`` over to ``topology`` (a live source took in new GPUs or ports, or forgot a host,
    ``foreshock watch``): the detectors', the input guard's and the /metrics store's state follow
    each entity by name (``EmbeddedPipeline.move_to``), the /metrics server keeps its port and
    counters, the summary names findings under the new topology. Counted
    (``foreshock_topology_changes_total``) and logged in one line, which is returned: the GPUs
    (by host) and links (by name) added or dropped, and what the topology now holds."""
    assert run.make_bank is not None
    old = run.pipeline.topology
    fresh = run.pipeline.move_to(topology, run.make_bank(topology))
    run.tally.topology = topology  # it keeps findings by entity name: only new ones need the new names
    if run.jsonl is not None:
        run.jsonl.topology = topology  # the findings file names each entity; its slots are renumbered
    run.health.topology_changed(stage)
    changes: list[str] = []
    for kind, label, shown in (("gpu", "GPU", _hosts_of), ("link", "link", _names_of)):
        before, now = set(old.names(kind)), set(topology.names(kind))
        # dropped: a host the source forgot (--forget-after)
        for sign, names in (("+", sorted(now - before)), ("-", sorted(before - now))):
            if names:
                changes.append(f"{sign}{counted(len(names), label)} ({shown(names)})")
    line = (f"topology changed: {', '.join(changes) or 'renumbered'}; now {topology_holds(topology)}; detector, "
            "input guard and /metrics state kept by entity name")
    if fresh:
        line += f"; {', '.join(fresh)} cannot move its state: started fresh"
    log.warning(line)
    return line


def topology_holds(topology: Topology) -> str:
    """What ``topology`` holds, in a few words: its GPUs, links and optics (those it has) on its nodes."""
    held = [counted(topology.size(kind), label) for kind, label in (("gpu", "GPU"), ("link", "link"),
                                                                   ("optic", "optic")) if topology.size(kind)]
    return f"{', '.join(held) or 'no GPUs or links'} on {counted(topology.size('node'), 'node')}"


def counted(n: int, label: str, plural: str | None = None) -> str:
    """``n`` and ``label``, plural unless one: "1 node", "2 GPUs" (``plural``: "switches")."""
    return f"{n:,} {label if n == 1 else plural or label + 's'}"


def _hosts_of(gpus: Sequence[str], shown: int = 5) -> str:
    hosts = sorted({name.rpartition("/")[0] for name in gpus})
    return ", ".join(hosts[:shown]) + (f" and {len(hosts) - shown} more" if len(hosts) > shown else "")


def _names_of(names: Sequence[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def follow_external(run: PipelineRun, frames: Iterable[Frame]) -> Iterable[Frame]:
    """``frames``, with the events of the followed ``--external`` file handed to the incident
    engine before each frame, and the file read a last time when they end (unchanged without
    one): :func:`~foreshock.streams.external_feed.feed_before_frames`."""
    if run.external is None:
        return frames
    Console(stderr=True).print(f"[dim]following external events in {escape(str(run.external.path))}[/dim]")
    targets = external_targets(run.pipeline.bank.processors)
    return feed_before_frames(_ended_when_done(frames, run.pipeline, run.external, targets), run.external, targets)


def _ended_when_done(frames: Iterable[Frame], pipeline: EmbeddedPipeline, feed: ExternalFeed,
                     targets: Sequence[object]) -> Iterator[Frame]:
    """``frames``, the pipeline's stream ended (:meth:`EmbeddedPipeline.end_stream`) as soon as they
    end, before the feed's own end (its last read, its count of the events still queued): the
    incident engine's flush counts the events it still queues as a problem, and the feed would
    count them again. Here they are counted once, by the flush; the feed's summary still names
    them (its ``still_queued``, which the feed no longer finds queued)."""
    yield from frames
    queued = max((q() for t in targets if callable(q := getattr(t, "queued_external", None))), default=0)
    pipeline.end_stream()
    feed.still_queued += queued


def checked_bank(topology: Topology, names: Sequence[str] | None,
                 by_detector: dict[str, dict[str, Any]]) -> DetectorBank:
    """The bank of ``names`` (None: the standard bank) with the ``--param`` values ``by_detector``;
    a detector unknown, a parameter it does not have or refuses, or a ``--param`` for no detector
    of the bank is a usage error (before anything starts: a worker, a /metrics server, a file)."""
    try:
        bank = DetectorBank.from_names(topology, names, params=by_detector)
    except (ValueError, TypeError) as exc:  # unknown detector, parameter name or value
        raise click.UsageError(str(exc)) from None
    in_bank = {d.name for d in bank.detectors} | {getattr(p, 'name', '') for p in bank.processors}
    unused = sorted(set(by_detector) - in_bank)
    if unused:
        raise click.UsageError(f"--param for detectors not in the bank: {', '.join(unused)}")
    return bank


def store_params(by_detector: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the store must know of the ``--param`` values ``by_detector`` (``FindingStore``'s
    keywords): the congestion detector's parameters, for its gauges, and each detector's
    ``refresh_s``, for how long a flag it holds and says again is kept."""
    return {"congestion_params": by_detector.get("congestion"),
            "flag_refresh_s": {name: p["refresh_s"] for name, p in by_detector.items() if "refresh_s" in p}}


def build_pipeline(topology: Topology, detectors: str | None, host: str, port: int,
                   findings_path: str | None, top_k: int, params: Sequence[str] = (),
                   external_path: str | None = None, health: PipelineHealth | None = None,
                   node_option: str | None = None) -> PipelineRun:
    """The embedded pipeline and its sinks; ``health``: the counters to share (a live source's, so
    what it counts while polling is exported with the rest); ``node_option``: the command's option
    naming a node, which a ``--host`` that is no address of this machine may have meant."""
    health = health if health is not None else PipelineHealth()
    names = detector_names(detectors)
    by_detector = parse_params(params)
    bank = checked_bank(topology, names, by_detector)
    if external_path:
        try:
            external_targets(bank.processors)
        except ValueError as exc:
            raise click.UsageError(f"--external: {exc}") from None
    store = FindingStore(topology, health, **store_params(by_detector))
    tally = FindingTally(topology)
    # /metrics bound before the findings file is opened: opening truncates it, and a refused
    # --port or --host emptied the previous run's findings (review h28)
    server = None
    if port:
        try:
            server = serve(store, host=host, port=port, top_k=top_k)
        except MetricsPortError as exc:
            raise click.UsageError(exc.usage("--port", node_option=node_option)) from None
    try:
        jsonl = JsonlSink(findings_path, topology) if findings_path else None
    except OSError as exc:
        if server is not None:
            stop(server)
        raise click.ClickException(f"--findings {findings_path}: {exc.strerror or exc}") from None
    if server is not None:
        Console(stderr=True).print(f"[dim]serving Prometheus metrics on {escape(metrics_url(host, port))}[/dim]")
    sinks = [tally] + ([jsonl] if jsonl else [])
    pipeline = EmbeddedPipeline(topology, bank, store, sinks, health)
    external = ExternalFeed(external_path, health) if external_path else None

    def make_bank(other: Topology) -> DetectorBank:
        return DetectorBank.from_names(other, names, params=by_detector)

    return PipelineRun(pipeline, store, tally, health, server, jsonl, external, make_bank)


def run_with_progress(run: PipelineRun, frames: Iterable[Frame], total_samples: int | None,
                      description: str, limit_s: float | None = None) -> RunStats:
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[found]} findings"), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task(description, total=total_samples, found=0)
        found = 0

        def on_frame(frame: Frame, findings: list) -> None:  # type: ignore[type-arg]
            nonlocal found
            found += len(findings)
            progress.update(task, advance=len(frame), found=found)

        stats = run.pipeline.run(frames, on_frame=on_frame, limit_s=limit_s)
    return stats


def run_until_signalled(run: PipelineRun, frames: Iterable[Frame], stop: threading.Event,
                        total_samples: int | None, description: str) -> tuple[RunStats, str | None]:
    """:func:`run_with_progress`, which Ctrl-C, SIGTERM or SIGHUP end early as ``watch`` does: the
    first sets ``stop`` (the source's, which then yields no further frame), the run ends as if its
    input had, and the caller prints its summary. Returns the stats and what stopped the run
    ("Ctrl-C", "SIGTERM", ...), None when it ran to its end. A second signal acts as before."""
    stopped_by: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        stop.set()
        stopped_by.append(signal_label(sig))

    restore = stop_on_signals(on_signal)
    try:
        stats = run_with_progress(run, frames, total_samples, description)
    finally:
        restore()
    if stopped_by:
        Console(stderr=True).print(f"[yellow]stopped by {stopped_by[0]}[/yellow]")
    return stats, stopped_by[0] if stopped_by else None


def signal_label(sig: signal.Signals) -> str:
    """How a signal that stopped a run is named to its user: Ctrl-C for SIGINT."""
    return "Ctrl-C" if sig == signal.SIGINT else sig.name


def hold_metrics(run: PipelineRun, host: str, port: int, hold: float) -> None:
    """Keep serving /metrics ``hold`` seconds after the run (to be scraped once more), saying so;
    Ctrl-C, SIGTERM or SIGHUP end the wait (and the command) as a normal exit."""
    if hold <= 0 or run.server is None:
        return
    Console(stderr=True).print(f"serving /metrics on {escape(metrics_url(host, port))} for {hold:g} s "
                               "(Ctrl-C to stop)")
    done = threading.Event()
    restore = stop_on_signals(lambda _sig: done.set())
    try:
        done.wait(hold)
    finally:
        restore()


def metrics_url(host: str, port: int) -> str:
    """The /metrics URL of a server bound to ``host``: an IPv6 address goes in brackets."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/metrics"


def finish(run: PipelineRun, stats: RunStats, events: Sequence[Event] = (), json_name: str = "run",
           interrupted: bool | None = None, origin: TimeOrigin | None = None, error: str | None = None) -> None:
    """Close the findings file, print the summary and the JSON line; ``interrupted`` (given by the
    commands a signal can end early) goes in the JSON line, and so does ``error``, what ended a run
    early that a script reading the line must not take for a signal (an unreadable recording);
    ``origin``: where the summary's clocks count from, where the run knows its start (default: its
    first sample)."""
    if run.jsonl is not None:
        run.jsonl.close()
    if run.external is not None:
        Console(stderr=True).print(f"[dim]{external_summary(run.external)}[/dim]")
    render_summary(run.tally, run.health, events, origin=origin)
    skipped = run.health.skipped()
    click.echo(json.dumps({
        "name": json_name, "samples": stats.samples, "accepted_samples": stats.accepted,
        "wall_seconds": round(stats.wall_s, 3),
        "samples_per_s": round(stats.samples_per_s), "telemetry_start": _json_number(stats.start_ts),
        "telemetry_seconds": _json_number(stats.telemetry_s), "speedup": _json_number(round(stats.speedup, 1)),
        "findings": stats.by_type, "input_problems": run.health.total_problems(),
        **({"polls_skipped": sum(skipped.values())} if skipped else {}),
        **({} if interrupted is None else {"interrupted": interrupted}),
        **({} if error is None else {"error": error}),
    }, allow_nan=False))


def external_summary(feed: ExternalFeed) -> str:
    """What became of the followed file's events, said at the end of the run: read, and of those
    the ones never grouped (read with no telemetry after them, so never handed over, or handed
    over but dated after the last telemetry, still queued by the engine); bad lines, and a last
    line still being written. (Events the engine refused or could not place are in the input
    problems.)"""
    def n(count: int, word: str) -> str:
        return f"{count} {word}{'' if count == 1 else 's'}"

    parts = [f"{n(feed.events, 'external event')} read from {escape(str(feed.path))}"]
    never = [f"{count} {what}" for count, what in (
        (feed.not_handed, f"with no telemetry after {'it' if feed.not_handed == 1 else 'them'}"),
        (feed.still_queued, "dated after the last telemetry (still queued)")) if count]
    if never:
        parts.append(" and ".join(never) + ": not grouped")
    if feed.bad:
        parts.append(n(feed.bad, "bad line"))
    if feed.unfinished:
        parts.append("the last line still being written at the end: not read")
    return ", ".join(parts)


def until_unreadable(frames: Iterable[Frame], unreadable: list[RecordingError]) -> Iterator[Frame]:
    """``frames`` up to a recording part found unreadable (a corrupt page behind a sound footer):
    they end there, as a signal ends them, the error kept in ``unreadable`` for the command to say
    once its run is summed up, and exit with (replay, and an agent replaying)."""
    try:
        yield from frames
    except RecordingError as exc:
        unreadable.append(exc)


LIVE_INTERVAL = click.FloatRange(min=MIN_INTERVAL_S, max=LONGEST_WAIT_S)
"""The type of a live source's poll interval option (``watch``, ``record``, ``agent``): the guard's
least spacing at the least, :data:`~foreshock.guard.LONGEST_WAIT_S` (a timer's longest wait) at most."""


def finite_number(positive: bool = False) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback refusing NaN and infinities (``FloatRange`` lets NaN through: every
    comparison with it is false) and, with ``positive``, numbers <= 0; an option not given passes."""
    def check(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is not None and not (math.isfinite(value) and (value > 0 or not positive)):
            raise click.BadParameter(f"must be a finite number{' > 0' if positive else ''}, got {value}")
        return value

    return check


def sim_interval(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A click callback for the simulator's sampling ``--interval`` (simulate, demo, agent --source
    simulator): finite (``finite_number``'s message for NaN and inf), at most
    :data:`~foreshock.simulator.engine.MAX_INTERVAL_S` (an hour); one not given passes. Beyond it one
    tick ran for hours, deaf to Ctrl-C and SIGTERM (``demo --interval 1e7``)."""
    value = finite_number()(ctx, param, value)
    if value is not None and value > MAX_INTERVAL_S:
        raise click.BadParameter(f"at most {MAX_INTERVAL_S:g} seconds (an hour) for the simulator, got {value:g}")
    return value


def refuse_short_run(duration: float, interval: float, given: str = "--duration") -> None:
    """Refuse a simulated run shorter than one sampling interval (simulate, demo): the simulator runs
    whole intervals, so it ran one past the end asked, and said nothing. ``given`` names where the
    duration came from (simulate's may be the scenario's own)."""
    if duration < interval:
        raise click.UsageError(f"{given} ({duration:g} s) is shorter than one sampling interval "
                               f"(--interval {interval:g} s)")


def cluster_gpus(_ctx: click.Context, _param: click.Parameter, value: int | None) -> int | None:
    """A click callback for a simulated cluster's ``--gpus`` (simulate, demo, agent): the
    simulator's size rule, told the same way by each; an option not given passes."""
    problem = None if value is None else cluster_size_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


OVERWRITE_HELP = "Replace a recording already in the --out folder (by default such a folder is refused)."


def overwrite_option(func):  # type: ignore[no-untyped-def]
    return click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)(func)


def recording_files(path: Path) -> list[str]:
    """The files of a recording in folder ``path`` (names, its list first; none where it holds none, or
    is no folder): its list, topology and ground truth, and every part of a kind, closed or being
    written. Each is one a new recording written there removes or replaces (``RecordingWriter``),
    and each alone makes the folder a recording: one without ``recording.json`` (a recorder
    killed before its first commit) is still read from its parts."""
    if not path.is_dir():
        return []
    parts = {p.name for kind in ENTITY_KINDS
             for pattern in (f"{kind}.parquet", f"{kind}.*.parquet", f"{kind}.*parquet{PARTIAL}")
             for p in path.glob(pattern)}
    return [name for name in (META_FILE, TOPOLOGY_FILE, EVENTS_FILE) if (path / name).is_file()] + sorted(parts)


def refuse_recording(path: Path, overwrite: bool | None = None) -> None:
    """Refuse to write a recording into ``path`` where one is already (``recording_files``): the
    writer removes its parts and ground truth, and a run of minutes (a simulation, a live recording)
    was replaced without a word. An empty folder, or one holding other files only, is taken.
    ``overwrite``: the command's ``--overwrite`` (True: replace it; None: the command has no such
    option, as ``record``, whose live telemetry cannot be made again)."""
    held = recording_files(path)
    if not held or overwrite:
        return
    shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
    raise click.UsageError(f"{path} already holds a recording ({shown}); choose a new folder"
                           + (", or give --overwrite to replace it" if overwrite is not None else ""))


def create_folder(path: Path, what: str) -> None:
    """Create an output folder now, not after a run that can take minutes: a path that cannot be
    one is a clear error up front rather than a traceback at the end. So is a folder that exists
    but takes no file (read-only, or under /proc): a file is created in it and removed."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(f"cannot create {what} {path}: {exc.strerror or exc}") from None
    try:
        with tempfile.TemporaryFile(dir=path, prefix=".foreshock-write-check-"):
            pass
    except OSError as exc:
        raise click.ClickException(f"cannot write in {what} {path}: {exc.strerror or exc}") from None


def _json_number(value: float) -> float | None:
    """JSON has no NaN: a figure that does not exist (no valid timestamp in the input) is null."""
    return value if math.isfinite(value) else None


def stop_server(run: PipelineRun) -> None:
    if run.server is not None and isinstance(run.server, tuple):
        stop(run.server)


def recording_origin(meta: dict, offset: float = 0.0) -> TimeOrigin | None:  # type: ignore[type-arg]
    """Where a recording's summary clocks count from: the simulation's start (``start_time``, one
    sampling interval before its first sample, where ``simulate`` counts each fault's onset from)
    in a simulated recording, else its first sample (``start``); None in an empty one. ``offset``:
    how far the replay moves its timestamps (``replay --now``)."""
    first, sim_start = _time_in(meta, "start"), _time_in(meta, "start_time")
    if first is None:
        return None
    if sim_start is not None and sim_start <= first:  # (a start after the first sample is no start)
        return TimeOrigin(sim_start + offset, "the simulation's start")
    return TimeOrigin(first + offset, "the recording's first sample")


def _time_in(meta: dict, key: str) -> float | None:  # type: ignore[type-arg]
    """``meta[key]`` as a time in seconds; None where it is missing or no finite number."""
    value = meta.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def recording_rows(meta: dict) -> int | None:  # type: ignore[type-arg]
    rows = meta.get("rows")
    return int(sum(rows.values())) if isinstance(rows, dict) else None


def default_out(path: str | None, name: str) -> Path:
    return Path(path) if path else Path("out") / name


def stop_on_signals(stop: Callable[[signal.Signals], None],
                    signals: Sequence[signal.Signals] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)) -> Callable[[], None]:
    """Make the first of ``signals`` call ``stop`` (the run ends as asked, its files closed and its
    summary printed); the same signal again acts as before (a second Ctrl-C interrupts), and one
    set to be ignored stays ignored. SIGTERM is what systemd, docker, Slurm and ``timeout`` send:
    unhandled, it killed a run with its files open.
    Returns what puts the previous handlers back; off the main thread, where Python takes no
    signals, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    # a signal set to be ignored stays ignored: under nohup, SIGHUP must not end the run
    previous = {sig: handler for sig in signals if (handler := signal.getsignal(sig)) is not signal.SIG_IGN}

    def on_signal(signum: int, _frame: Any) -> None:
        sig = signal.Signals(signum)
        signal.signal(sig, previous[sig])
        stop(sig)

    for sig in previous:
        signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
