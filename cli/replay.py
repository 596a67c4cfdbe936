"""``foreshock replay``: run the embedded pipeline over a recorded telemetry folder."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import click
from rich.console import Console

from foreshock.recording import RecordingError
from foreshock.streams.sources import ReplaySource, UnknownStartError

from .common import (build_pipeline, detector_option, external_option, finish, finite_number, follow_external,
                     hold_metrics, param_option, recording_origin, recording_rows, run_until_signalled, serve_options,
                     stop_server, until_unreadable)


@click.command("replay")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--speed", type=float, default=None, callback=finite_number(positive=True),
              help="Replay at X times real time (default: --max).")
@click.option("--max", "max_speed", is_flag=True, help="Replay as fast as the CPU allows (the default).")
@click.option("--now", "shift_now", is_flag=True,
              help="Shift timestamps so the replay starts at the current time. Faster than real time (--max, "
                   "the default, or --speed above 1) the stamps then run ahead of the clock: --speed 1 to follow it.")
@click.option("--hold", type=float, default=0.0, callback=finite_number(),
              help="Keep serving /metrics this many seconds after the end.")
@detector_option
@param_option
@external_option
@serve_options
def command(path: str, speed: float | None, max_speed: bool, shift_now: bool, hold: float, detectors: str | None,
            params: tuple[str, ...], external_path: str | None,
            host: str, port: int, findings_path: str | None, top_k: int) -> None:
    """Replay a recording (a folder written by `simulate` or `import`) through the detectors."""
    if speed is not None and max_speed:
        raise click.UsageError("--speed and --max are exclusive")
    try:
        source = ReplaySource(path, speed=None if max_speed else speed, shift_to=time.time() if shift_now else None)
        # ground truth is read before the run: a broken events file fails now, not after a long replay
        events = [replace(e, time=e.time + source.offset) for e in source.recording.events()]
        # (where recording.json lists no span, reads the first stamps: a corrupt page is an error here)
        anchor = source.recording.stream_anchor
    except UnknownStartError as exc:
        raise click.UsageError(f"--now: {exc}") from None
    except RecordingError as exc:
        raise click.ClickException(str(exc)) from None
    run = build_pipeline(source.topology, detectors, host, port, findings_path, top_k, params, external_path)
    # rows stamped decades before the recording's (a clock not set) are counted, not taken as their
    # entities' first samples: a whole first tick stamped 1970 comes first in a replay
    run.pipeline.guard.stream_anchor = anchor + source.offset
    # Ctrl-C or SIGTERM ends the replay early with its summary, as `watch` (exit status 0); so does
    # a part found unreadable mid-run, past the checks of its footer (exit status 1, once summed up)
    unreadable: list[RecordingError] = []
    stats, stopped_by = run_until_signalled(run, follow_external(run, until_unreadable(source, unreadable)),
                                            source.stop, recording_rows(source.recording.meta), "replay")
    if unreadable:
        Console(stderr=True).print("[yellow]stopped by an unreadable recording: the summary covers what was read "
                                   "before it[/yellow]")
    stopped_early = stopped_by is not None or bool(unreadable)
    if stopped_early:
        # ground truth past the last replayed sample was never shown to the detectors; stopped before
        # any sample was taken, none was (every fault had been listed as missed after 0 samples)
        end = stats.start_ts + stats.telemetry_s if math.isfinite(stats.start_ts) else -math.inf
        events = [e for e in events if e.time <= end]
    finish(run, stats, events, json_name="replay", interrupted=stopped_early,
           origin=recording_origin(source.recording.meta, source.offset),
           error=str(unreadable[0]) if unreadable else None)
    # a signal ends the command: the hold after a run a signal stopped served /metrics for the rest
    # of --hold, deaf to the SIGTERM just sent (audit s65)
    hold_metrics(run, host, port, hold if stopped_by is None else 0.0)
    stop_server(run)
    if unreadable:
        raise click.ClickException(str(unreadable[0]))

