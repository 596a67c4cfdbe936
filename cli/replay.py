"""``foreshock replay``: run the embedded pipeline over a recorded telemetry folder."""

from __future__ import annotations

import time
from dataclasses import replace

import click

from foreshock.recording import RecordingError
from foreshock.streams.sources import ReplaySource

from .common import (build_pipeline, detector_option, external_option, finish, finite_number, follow_external,
                     param_option, recording_rows, run_with_progress, serve_options, stop_server)


@click.command("replay")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--speed", type=float, default=None, callback=finite_number(positive=True),
              help="Replay at X times real time (default: --max).")
@click.option("--max", "max_speed", is_flag=True, help="Replay as fast as the CPU allows (the default).")
@click.option("--now", "shift_now", is_flag=True, help="Shift timestamps so the replay starts at the current time.")
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
    except RecordingError as exc:
        raise click.ClickException(str(exc)) from None
    run = build_pipeline(source.topology, detectors, host, port, findings_path, top_k, params, external_path)
    try:
        stats = run_with_progress(run, follow_external(run, source), recording_rows(source.recording.meta), "replay")
    except RecordingError as exc:
        raise click.ClickException(str(exc)) from None
    finish(run, stats, events, json_name="replay")
    if hold > 0 and run.server is not None:
        time.sleep(hold)
    stop_server(run)
