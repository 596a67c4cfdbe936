"""``foreshock record``: poll a live source (dcgm-exporter, nvidia-smi, NVML, IB sysfs, ethtool -m)
into a recording folder that ``replay``, ``evaluate`` and ``incidents`` read.

The recording is opened at the first poll that yields telemetry (a polled source learns its
topology from what it reads) and is always closed properly — at ``--duration``, after
``--polls``, or on Ctrl-C, SIGTERM or SIGHUP — so an interrupted recording is still a valid one.
Once stopped, the poll in hand is waited for as long as the source's own limit on a poll allows
(:func:`stop_within`: its command's timeout, its NVML deadline, its answer window); a second signal
cuts that to :data:`WIND_DOWN_S`. A poll that has not ended by then (a call that never returns) is
left: the rows read before it are written, the recording marked incomplete, and the summary printed.
It is written in parts closed every ``--commit-every`` seconds, so a recorder killed outright
(SIGKILL, the OOM killer, a power cut) loses only its last part. A part that cannot be written
(a full disk) ends the recording: what was closed before it stays readable, the rows lost are
counted, and the command exits with the error.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from foreshock.frames import Frame
from foreshock.guard import LONGEST_WAIT_S
from foreshock.health import PipelineHealth
from foreshock.recording import RecordingWriter
from foreshock.streams.polling import PollingSource
from foreshock.topology import Topology

from .agent import URL_HELP, open_source, options_given, refuse_unread_options
from .common import LIVE_INTERVAL, cluster_option, finite_number, node_named, refuse_recording, stop_on_signals

LIVE_SOURCES = ("dcgm", "nvidia-smi", "nvml", "infiniband", "dom", "ethtool", "redfish", "cdu")

WIND_DOWN_S = 2.0
"""How long ``record`` and ``watch`` wait, once a stop is asked for (``--duration``, the first Ctrl-C,
SIGTERM or SIGHUP), for the poll in hand to end past the source's own limit on a poll
(:func:`stop_within`), and at most after a second signal. A poll stuck in a call that never returns
(a hung driver call) held them for good: the stop was ignored, and a second signal killed ``record``
with every row read before the hang unwritten. Past it the poll is left (its thread ends with the
process), the rows read before it are written and the summary printed. It alone, for every source,
cut a healthy slow poll (a 3-s nvidia-smi) short at ``--duration``: its rows were lost."""
STOP_CHECK_S = 0.1
"""How often ``record``, waiting for the source's next frame, looks whether a stop was asked for (a
signal's handler cannot wake the wait)."""

log = logging.getLogger("foreshock")


def stop_within(source: object) -> float:
    """How long the poll in hand of ``source`` is waited for once a stop is asked for: the source's
    own limit on a poll (``poll_limit_s``: NVML's deadline, Redfish's answer window; or the
    ``timeout`` of its command or scrape: nvidia-smi, dcgm, ethtool), plus :data:`WIND_DOWN_S`; that
    alone for a source with neither (its poll has no bound of its own)."""
    limit = getattr(source, "poll_limit_s", None)
    if limit is None:
        limit = getattr(source, "timeout", None)
    if not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit < 0:
        limit = 0.0
    return float(limit) + WIND_DOWN_S


def hurry(source: object) -> None:
    """End the poll in hand of ``source`` at once where it can be (``hurry``: NVML, Redfish, CDU), else stop it."""
    hurried = getattr(source, "hurry", None)
    if callable(hurried):
        hurried()
    elif isinstance(source, PollingSource):
        source.stop()


def live_source_options(host_alias: bool = False):  # type: ignore[no-untyped-def]
    """The options that choose and configure a live source (``record``, ``watch``). The node-name
    option is ``--node`` on both; with ``host_alias`` (``record``, whose option it was) ``--host`` too,
    a deprecated alias (:func:`node_named`): ``watch`` serves /metrics on ``--host``."""
    options = [
        click.option("--source", type=click.Choice(LIVE_SOURCES), required=True, help="What to poll."),
        click.option("--duration", type=click.FloatRange(min=0, min_open=True, max=LONGEST_WAIT_S), default=None,
                     callback=finite_number(),
                     help="Stop after this many seconds (default: until --polls, or Ctrl-C)."),
        click.option("--polls", type=click.IntRange(min=1), default=None, help="Stop after this many polls."),
        click.option("--interval", type=LIVE_INTERVAL, default=None,
                     callback=finite_number(),
                     help="Seconds between polls (default: per source — dcgm 30, nvidia-smi 10, nvml 1, "
                          "infiniband 1, dom 60, ethtool 10, redfish 30, cdu 10)."),
        click.option("--url", default=None, help=URL_HELP),
        click.option("--executable", default=None,
                     help="nvidia-smi / dom / ethtool: the program to run (default nvidia-smi / ethtool)."),
        click.option("--root", default=None, help="infiniband: the sysfs root (default /sys/class/infiniband)."),
        click.option("--interfaces", default=None, help="dom / ethtool (-m / -S): comma-separated network interfaces."),
        click.option("--node", "node", default=None, help="Node name for local sources (default: this host's name)."),
        *([click.option("--host", "host_alias", default=None, hidden=True,
                        help="Deprecated: the old name of --node.")] if host_alias else []),
        click.option("--topology", "topology_path", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="The cluster's topology file to name entities by (default: one derived from what the "
                          "source reads)."),
        cluster_option,
    ]

    def apply(func):  # type: ignore[no-untyped-def]
        for option in reversed(options):
            func = option(func)
        return func
    return apply


def open_live_source(source: str, url: str | None, executable: str | None, root: str | None, interfaces: str | None,
                     interval: float | None, polls: int | None, node: str | None,
                     topology_path: str | None, node_flag: str = "--node", cluster: str | None = None,
                     ) -> tuple[PollingSource, Callable[[], Topology | None]]:
    """The polled source and a callable giving its topology once known; a source that cannot
    open (no NVIDIA driver for nvml, say) is a clear error, not a traceback."""
    try:
        frames, topology_of = open_source(source, None, url, executable, root, interfaces, interval, polls, node,
                                          None, False, 0, "", 0, None, topology_path, node_flag, cluster)
    except click.UsageError:
        raise
    except Exception as exc:  # e.g. no NVIDIA driver for --source nvml
        raise click.ClickException(f"cannot open source {source}: {type(exc).__name__}: {exc}") from None
    assert isinstance(frames, PollingSource)  # every live source polls
    return frames, topology_of


@click.command("record")
@live_source_options(host_alias=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The recording folder to write (created; must not hold a recording already).")
@click.option("--commit-every", "commit_every", type=click.FloatRange(min=0, min_open=True), default=600.0,
              show_default=True, callback=finite_number(),
              help="Close the recording's parts and list them in recording.json every this many seconds: "
                   "a recorder that is killed (SIGKILL, out of memory, power cut) loses at most this much.")
def command(source: str, out_dir: Path, commit_every: float, duration: float | None, polls: int | None,
            interval: float | None, url: str | None, executable: str | None, root: str | None,
            interfaces: str | None, node: str | None, host_alias: str | None, topology_path: str | None,
            cluster: str | None) -> None:
    """Record live telemetry from SOURCE into a recording folder."""
    refuse_recording(out_dir)  # (no --overwrite: live telemetry cannot be recorded again)
    # (open_source: the others)
    refuse_unread_options(source, **options_given(click.get_current_context(), "node", "host_alias", "cluster"))
    node, node_flag = node_named(node, host_alias, "record")
    polled, topology_of = open_live_source(source, url, executable, root, interfaces, interval, polls, node,
                                           topology_path, node_flag, cluster)
    health: PipelineHealth = polled.health
    stopping = threading.Event()  # a stop is asked for: the poll in hand is waited for stop_within(polled) at most
    hurried = threading.Event()  # a second signal: the poll in hand is waited for WIND_DOWN_S at most

    def stop_polling() -> None:
        stopping.set()
        polled.stop()

    timer = threading.Timer(duration, stop_polling) if duration else None
    console = Console(stderr=True)
    writer: RecordingWriter | None = None
    counted = {"samples": 0, "frames": 0}
    started = time.monotonic()
    interrupted = False
    stopped_by: list[str] = []
    write_failed: list[OSError] = []
    left: list[str] = []  # the source, left in its poll after a stop (_frames_or_quiet)
    restore_second: list[Callable[[], None]] = []

    def hurry_up(sig: signal.Signals) -> None:
        stopped_by.append(sig.name)
        hurried.set()
        hurry(polled)

    def stop(sig: signal.Signals) -> None:
        stopped_by.append(sig.name)
        stop_polling()
        if not restore_second:
            restore_second.append(stop_on_signals(hurry_up))

    # the first Ctrl-C, SIGTERM or SIGHUP stops after the poll in hand. Killed by the others
    # mid-recording, every part lost its Parquet footer and recording.json was never written; a
    # Ctrl-C raised mid-commit left a list that disagreed with the parts. A second one cuts the wait
    # for the poll in hand short (WIND_DOWN_S); a third Ctrl-C still interrupts (KeyboardInterrupt below).
    restore = stop_on_signals(stop)
    try:
        if timer is not None:
            timer.daemon = True
            timer.start()
        with Progress(SpinnerColumn(), TextColumn("[bold]record[/bold] " + source + " {task.fields[samples]:,} samples, "
                                                  "{task.fields[polls]} polls"), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("record", samples=0, polls=0)
            committed_at, parts_seen = time.monotonic(), 0
            for frame in _frames_or_quiet(polled, lambda: committed_at + commit_every - time.monotonic(), stopping,
                                          left, stop_within(polled), hurried):
                if frame is None:  # the source is quiet (a hung poll): the rows held are committed on time
                    if writer is not None:
                        try:
                            writer.commit()
                        except OSError as exc:
                            write_failed.append(exc)
                            polled.stop()
                            break
                    committed_at = time.monotonic()
                    continue
                try:
                    if writer is None:
                        topology = topology_of()
                        if topology is None:  # pragma: no cover - a source yields frames only once it knows them
                            continue
                        writer = RecordingWriter(out_dir, topology, meta={"source": source, "interval": polled.interval,
                                                                          "host": node}, segment_s=commit_every,
                                                 health=health)
                    writer.write(frame)
                except OSError as exc:  # a full disk: the part being written is lost (counted), not the others
                    write_failed.append(exc)
                    polled.stop()
                    break
                if sum(writer.parts.values()) != parts_seen:  # the writer committed on its own schedule
                    committed_at, parts_seen = time.monotonic(), sum(writer.parts.values())
                counted["samples"] += len(frame)
                counted["frames"] += 1
                progress.update(task, samples=counted["samples"], polls=polled.polls)
    except KeyboardInterrupt:
        interrupted = True
        polled.stop()
    finally:
        if timer is not None:
            timer.cancel()
        if writer is not None:
            if left:
                writer.mark_interrupted()  # the poll in hand, left, is missing from its end
            try:
                writer.close()
            except OSError as exc:
                write_failed.append(exc)
        for undo in restore_second:
            undo()
        restore()  # after the close: a second SIGTERM during it must not cut the footers short
    interrupted = interrupted or bool(stopped_by) or bool(left)
    wall = time.monotonic() - started
    _summary(console, out_dir, writer, health, polled.polls, wall, interrupted)
    summary: dict[str, Any] = {"name": "record", "source": source, "path": str(out_dir), "polls": polled.polls,
                               "samples": counted["samples"], "rows": dict(writer.rows) if writer else {},
                               "parts": dict(writer.parts) if writer else {},
                               "wall_seconds": round(wall, 3), "input_problems": health.total_problems(),
                               "interrupted": interrupted}
    click.echo(json.dumps(summary))
    if write_failed:
        lost = sum(writer.lost_rows.values()) if writer else 0
        raise click.ClickException(
            f"cannot write the recording {out_dir}: {write_failed[0]}"
            + (f"; {lost:,} rows lost with the part being written, the parts closed before it kept" if lost else ""))
    if writer is None:
        raise click.ClickException(f"no telemetry came from {source} in {polled.polls} polls: nothing recorded "
                                   "(the counted problems above say why)")


def _frames_or_quiet(source: Iterable[Frame], wait_s: Callable[[], float], stopping: threading.Event | None = None,
                     left: list[str] | None = None, within: float | None = None,
                     hurried: threading.Event | None = None) -> Iterator[Frame | None]:
    """The frames of ``source``, polled in a thread of its own, and None each time none came for
    ``wait_s()`` seconds (asked again after each item): the recording writer commits only when it
    is handed a frame, so a source gone quiet (a poll that hangs, an exporter that stops answering)
    held the rows read before unwritten past ``--commit-every``, lost to a recorder killed then.
    The consumer, not the thread, writes: the writer is never used from two threads. An error that
    ends the source is raised to the consumer; the source's own end ends the frames.

    Once ``stopping`` is set the source is waited for ``within`` seconds more at most (its own limit
    on a poll: :func:`stop_within`; :data:`WIND_DOWN_S` if not given), and once ``hurried`` is set
    (a second signal) :data:`WIND_DOWN_S` more at most: a poll that does not end by then (a call
    that never returns) is left in its thread (a daemon's, which does not hold the process), the
    frames end, and why is added to ``left`` (as when hurried before the source has ended). Cut at
    WIND_DOWN_S alone, a healthy poll slower than that (a 3-s nvidia-smi) had lost its rows at
    ``--duration`` and the recording been marked incomplete."""
    arrived: queue.Queue[Frame | _SourceEnded] = queue.Queue()  # (the consumer takes each frame at once)

    def pump() -> None:
        failed: BaseException | None = None
        try:
            for frame in source:
                arrived.put(frame)
        except BaseException as exc:  # an error in this thread is the consumer's to hear of
            failed = exc
        finally:
            arrived.put(_SourceEnded(failed))

    threading.Thread(target=pump, name="record-poll", daemon=True).start()
    quiet_at = time.monotonic() + max(wait_s(), 0.0)
    give_up_at = math.inf  # once a stop is asked for: when the source is left
    waited = WIND_DOWN_S if within is None else within  # how long the poll in hand may take past the stop
    cut = False  # hurried: give_up_at brought to WIND_DOWN_S from then
    while True:
        now = time.monotonic()
        if stopping is not None and stopping.is_set() and give_up_at == math.inf:
            give_up_at = now + waited
        if hurried is not None and hurried.is_set() and not cut:
            cut = True
            waited = min(waited, WIND_DOWN_S)
            give_up_at = min(give_up_at, now + WIND_DOWN_S)
            if left is not None:  # the source has not ended: its poll in hand is cut short, its frame partial
                left.append("the source's poll in hand cut short by a second signal")
        if now >= give_up_at:
            why = f"the source's poll in hand did not end within {waited:g} s of the stop: left"
            log.warning("record: %s (its rows are not in the recording, marked incomplete)", why)
            if left is not None:
                left.append(why)
            return
        # a stop is looked for every STOP_CHECK_S: a signal's handler runs in this thread, between waits
        looks = stopping is not None or hurried is not None
        until = min(quiet_at, give_up_at, now + STOP_CHECK_S if looks else math.inf)
        try:
            item = arrived.get(timeout=max(until - now, 0.0))
        except queue.Empty:
            if time.monotonic() >= quiet_at:
                yield None
                quiet_at = time.monotonic() + max(wait_s(), 0.0)
            continue
        if isinstance(item, _SourceEnded):
            if item.error is not None:
                raise item.error
            if hurried is not None and hurried.is_set() and not cut and left is not None:
                left.append("the source's poll in hand cut short by a second signal")  # (as above; it ended first)
            return
        yield item
        quiet_at = time.monotonic() + max(wait_s(), 0.0)


class _SourceEnded:
    """What :func:`_frames_or_quiet`'s thread hands over last: the source's end, or the error that ended it."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


def _summary(console: Console, out_dir: Path, writer: RecordingWriter | None, health: PipelineHealth, polls: int,
             wall: float, interrupted: bool) -> None:
    if writer is not None:
        table = Table(title=f"Recorded into {escape(str(out_dir))}" + (" (stopped early)" if interrupted else ""))
        for column in ("kind", "rows", "entities"):
            table.add_column(column)
        for kind, rows in sorted(writer.rows.items()):
            table.add_row(kind, f"{rows:,}", f"{writer.topology.size(kind):,}")
        console.print(table)
    if health.problems:
        problems = Table(title="Problems counted while polling")
        for column in ("stage", "problem", "count"):
            problems.add_column(column)
        for (stage, reason), n in sorted(health.problems.items()):
            problems.add_row(stage, escape(reason), f"{n:,}")  # a reason may quote the source
        console.print(problems)
    console.print(f"{polls} polls in {wall:.1f} s")
