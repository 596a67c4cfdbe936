"""``foreshock demo``: a simulated cluster with a fault, live through the embedded pipeline.

The simulator runs as a live source (timestamps start at the current hour, so Prometheus sees
recent samples), the default detector bank predicts, ``/metrics`` is served on loopback, and a summary
compares what foreshock said with the simulator's ground truth.
"""

from __future__ import annotations

import math
import time

import click
from rich.console import Console
from rich.markup import escape

from foreshock.exporters.console import TimeOrigin
from foreshock.guard import MIN_INTERVAL_S
from foreshock.simulator import ClusterSimulator, ScenarioError, formats, list_scenarios
from foreshock.streams.sources import IterableSource
from foreshock.streams.via_format import VIA_KIND, ViaFormat

from .common import (MAX_INTERVAL_S, build_pipeline, cluster_gpus, detector_option, external_option, finish,
                     finite_number, follow_external, hold_metrics, param_option, refuse_short_run, run_until_signalled,
                     serve_options, sim_interval, stop_server)


@click.command("demo")
@click.option("--gpus", default=256, show_default=True, type=int, callback=cluster_gpus,
              help="Cluster size in GPUs, a multiple of 8.")
@click.option("--duration", default=3 * 3600.0, show_default=True, type=float,
              help="Simulated seconds to run.")
@click.option("--interval", default=5.0, show_default=True, type=click.FloatRange(min=MIN_INTERVAL_S),
              callback=sim_interval, help=f"Sampling interval (s; at most {MAX_INTERVAL_S:g}).")
@click.option("--scenario", default="cooling-loss", show_default=True,
              help=f"Fault scenario: one of {', '.join(list_scenarios())} or a YAML file.")
@click.option("--seed", default=7, show_default=True, type=int, help="Same seed, same cluster and fault.")
@click.option("--speed", type=float, default=None, callback=finite_number(positive=True),
              help="Run at X times real time (default: as fast as the CPU allows).")
@click.option("--hold", type=float, default=0.0, callback=finite_number(),
              help="Keep serving /metrics this many seconds after the run.")
@click.option("--via", type=click.Choice(list(VIA_KIND)), default=None,
              help="Feed the detectors gpu frames (dcgm, nvidia-smi) or host link frames (sysfs) through that real "
                   "format and its importer, as the real source path would deliver them. Default: frames as simulated.")
@detector_option
@param_option
@external_option
@serve_options
def command(gpus: int, duration: float, interval: float, scenario: str, seed: int, speed: float | None,
            hold: float, via: str | None, detectors: str | None, params: tuple[str, ...], external_path: str | None, host: str, port: int, findings_path: str | None, top_k: int) -> None:
    """Simulate a cluster with a fault, predict it live, serve /metrics, print what was found."""
    if duration <= 0:
        raise click.UsageError("--duration must be > 0")  # (--interval: the simulator's floor, below)
    refuse_short_run(duration, interval)
    try:
        # frames carry the wall clock (Prometheus wants recent samples), but the cluster's day
        # starts at midnight whatever the hour, and the clock at the start of the hour: detectors
        # bucket by the epoch's minutes (the optics' 60 s windows), and a start at any second had
        # told the same seed's story differently from one run to the next
        # — unless an external feed is followed: its events are stamped by the wall clock, and an
        # event a minute from now fell past the end of a short run started at the hour
        start = time.time() if external_path else math.floor(time.time() / 3600.0) * 3600.0
        sim = ClusterSimulator(gpus=gpus, scenario=scenario, seed=seed, interval=interval, duration=duration,
                               start_time=start, start_hour=0.0)
    except (ScenarioError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    console = Console(stderr=True)
    for fault in sim.faults:
        # in whole minutes where it is one ("+18 min"), else in seconds as `simulate` says it: a
        # rounded "+2 min" beside the summary's "+0:01:40" read as two onsets
        at = f"+{fault.onset / 60:.0f} min" if fault.onset % 60 == 0 else f"+{fault.onset:,.0f} s"
        console.print(f"[dim]{escape(f'scenario {scenario}: {fault.type} on {fault.target_name}')} at "
                      f"{at} (hidden from the detectors)[/dim]")
    if sim.params.missing_prob > 0:  # or the summary's "input problems" read as a fault
        console.print(f"[dim]the simulator drops {sim.params.missing_prob:.2%} of samples as failed scrapes: "
                      "the guard counts them as input problems (missing_values)[/dim]")
    run = build_pipeline(sim.topology, detectors, host, port, findings_path, top_k, params, external_path)
    frames = sim.iter_frames(duration)
    if via:
        frames = ViaFormat(sim.topology, via, formats, run.health).frames(frames)
    source = IterableSource(sim.topology, frames, speed=speed)
    # the simulator steps while its clock is short of the duration (less 1e-9 s): a last tick
    # partly past it counts (ClusterSimulator.iter_ticks)
    ticks = math.ceil(duration / interval - 1e-9)
    total = ticks * sum(sim.topology.size(k) for k in ("gpu", "link", "optic", "node", "rack", "job"))
    # Ctrl-C or SIGTERM ends the demo early with its summary, as `watch` (exit status 0); the
    # ground truth is what the simulator did until then
    stats, stopped_by = run_until_signalled(run, follow_external(run, source), source.stop, total,
                                            f"demo: {gpus} GPUs, {duration / 3600:.1f} h simulated")
    # the summary counts from the simulation's start, as the header's "+N min" above does
    finish(run, stats, sim.events, json_name="demo", interrupted=stopped_by is not None,
           origin=TimeOrigin(sim.start_time, "the simulation's start"))
    # a signal ends the command: the hold after a run a signal stopped served /metrics for the rest
    # of --hold, deaf to the SIGTERM just sent (audit s65)
    hold_metrics(run, host, port, hold if stopped_by is None else 0.0)
    stop_server(run)
