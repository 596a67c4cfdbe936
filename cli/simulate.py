"""``foreshock simulate``: run the cluster simulator and write a recording folder."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

import click

from foreshock.guard import MIN_INTERVAL_S
from foreshock.health import PipelineHealth
from foreshock.simulator import (
    RANDOM_FAULT_ACCELERATION, ClusterSimulator, ScenarioError, formats, list_scenarios, load_scenario,
)
from foreshock.simulator.faults import FAILURES_PER_1000_NODE_DAYS
from foreshock.simulator.topology_gen import MAX_GPUS
from foreshock.streams.via_format import VIA_KIND, ViaFormat

from .common import (MAX_INTERVAL_S, cluster_gpus, create_folder, finite_number, overwrite_option, refuse_recording,
                     refuse_short_run, signal_label, sim_interval, stop_on_signals)

# random faults expected in one run (rate x duration): each draw reads the faults drawn before it, and
# each fault is followed every physics step; 1e6x on 16 GPUs for 120 s expects ~18, the default on the
# largest cluster for 6 hours ~700 (20,000 expected on 1,024 GPUs for an hour took 50 s)
MAX_EXPECTED_RANDOM_FAULTS = 10_000

VIA_HELP = ("Pass every gpu frame (dcgm, nvidia-smi) or host link frame (sysfs) through that real "
            "format and its importer, so the recording holds what the real source path delivers "
            "(integer units; fields the format lacks are NaN). Default: frames as simulated.")


@click.command("simulate")
@click.option("--gpus", type=int, default=None, callback=cluster_gpus,
              help=f"Cluster size in GPUs, a multiple of 8, at most {MAX_GPUS:,} "
                   "(default: the scenario's, else 256).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None, callback=finite_number(),
              help="Simulated seconds (default: the scenario's, else 3600).")
@click.option("--scenario", default="healthy", show_default=True,
              help=f"Packaged scenario ({', '.join(list_scenarios())}) or a YAML file.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Same seed, same run.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Recording folder to write (Parquet per kind, topology.yaml, events.jsonl); one that holds a "
                   "recording already is refused unless --overwrite is given.")
@overwrite_option
@click.option("--random-faults", is_flag=True,
              help="Add random faults at FACTS' failure rate x --fault-acceleration (see foreshock.simulator.faults).")
@click.option("--fault-acceleration", type=click.FloatRange(min=0), default=RANDOM_FAULT_ACCELERATION,
              show_default=True, callback=finite_number(),
              help=f"Multiplier on FACTS' {FAILURES_PER_1000_NODE_DAYS:g} failures per 1000 node-days for random faults "
                   "(1 = the real rate; "
                   "applies with --random-faults or a scenario that draws them; at most "
                   f"{MAX_EXPECTED_RANDOM_FAULTS:,} faults expected in the run).")
@click.option("--interval", type=click.FloatRange(min=MIN_INTERVAL_S), default=1.0,
              show_default=True, callback=sim_interval,
              help=f"Sampling interval in seconds (30 = dcgm-exporter's default; at most {MAX_INTERVAL_S:g}).")
@click.option("--physics-dt", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              callback=finite_number(),
              help="Internal physics step in seconds (at most the interval); larger is faster, coarser.")
@click.option("--counter-bits", type=click.Choice(["32", "64"]), default="64", show_default=True,
              help="Width of the link counters (32 makes them wrap like classic IB PortCounters).")
@click.option("--via", type=click.Choice(list(VIA_KIND)), default=None, help=VIA_HELP)
@click.option("--no-progress", is_flag=True, help="No progress bar (e.g. in CI logs).")
def command(gpus: int | None, duration: float | None, scenario: str, seed: int, out_dir: Path, overwrite: bool,
            random_faults: bool, fault_acceleration: float, interval: float, physics_dt: float, counter_bits: str,
            via: str | None, no_progress: bool) -> None:
    """Simulate a GPU training cluster and record its telemetry with ground truth.

    Prints a JSON line last: {"gpus", "simulated_seconds", "wall_seconds", "faults", "events"}, with
    "interrupted": true where Ctrl-C, SIGTERM or SIGHUP stopped the run (the recording marked cut short).
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    # before the simulator is built: refused, nothing has run (a recording is minutes to make again)
    refuse_recording(out_dir, overwrite)
    if physics_dt > interval and click.get_current_context().get_parameter_source("physics_dt") \
            != click.core.ParameterSource.DEFAULT:
        # the simulator takes the interval as its step then: a coarser run than asked would pass unsaid
        raise click.BadParameter(f"{physics_dt:g} s is longer than the sampling interval ({interval:g} s): "
                                 "the physics step is at most the interval", param_hint="--physics-dt")
    try:
        scen = load_scenario(scenario)
    except ScenarioError as exc:
        raise click.BadParameter(str(exc), param_hint="--scenario") from None
    n_gpus = gpus if gpus is not None else int(scen.defaults.get("gpus", 256))  # (checked by load_scenario)
    try:
        sim = ClusterSimulator(gpus=n_gpus, scenario=scen, seed=seed, interval=interval, duration=duration,
                               random_faults=True if random_faults else None, physics_dt=physics_dt,
                               fault_acceleration=fault_acceleration,
                               params={"counter_bits": int(counter_bits)}, refuse_overlapping_faults=True)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    expected = sim.fault_rate * sim.duration
    if sim.random_faults and expected > MAX_EXPECTED_RANDOM_FAULTS:
        raise click.BadParameter(
            f"{fault_acceleration:g} expects {expected:,.0f} random faults in this run ({n_gpus:,} GPUs, "
            f"{sim.duration:g} s); at most {MAX_EXPECTED_RANDOM_FAULTS:,} are drawn in reasonable time",
            param_hint="--fault-acceleration")
    refuse_short_run(sim.duration, sim.interval,
                     "--duration" if duration is not None else "the scenario's duration")
    create_folder(out_dir, "the recording folder")
    console = Console(stderr=True)
    health = PipelineHealth()
    total = sim.duration
    stop = threading.Event()
    stopped_by: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        stopped_by.append(signal_label(sig))
        stop.set()

    # the first Ctrl-C, SIGTERM or SIGHUP ends the run after the tick in hand, the recording closed
    # and marked cut short. Killed by SIGTERM (timeout, systemd, Slurm), every Parquet file lacked its
    # footer and recording.json was never written. A second Ctrl-C still interrupts.
    restore = stop_on_signals(on_signal)
    with Progress(TextColumn("[bold]simulate[/] {task.description}"), BarColumn(),
                  TextColumn("{task.completed:,.0f}/{task.total:,.0f} s"), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, disable=no_progress) as progress:
        task = progress.add_task(f"{scen.name}, {n_gpus:,} GPUs", total=total)
        through = ViaFormat(sim.topology, via, formats, health) if via else None
        try:
            summary = sim.record(out_dir, total, progress=lambda done, _total: progress.update(task, completed=done),
                                 meta={"via": via} if via else None, through=through.tick if through is not None else None,
                                 stop=stop)
        except OSError as exc:  # the folder exists but cannot be written (permissions, disk full)
            raise click.ClickException(f"cannot write the recording to {out_dir}: {exc.strerror or exc}") from None
        finally:
            restore()  # after the recording's close: a first signal during it must not cut the footers short
            if through is not None:
                through.close()
    if stopped_by:
        console.print(f"[yellow]stopped by {stopped_by[0]}[/yellow]: the recording holds "
                      f"{summary.simulated_seconds:,g} s of the {total:,g} s asked, marked as cut short")
    speed = summary.simulated_seconds / max(summary.wall_seconds, 1e-9)
    console.print(f"[green]wrote[/] {out_dir}: {summary.rows:,} rows, {summary.faults} faults, "
                  f"{summary.events} ground-truth events, {speed:,.0f}x real time")
    if abs(summary.simulated_seconds - total) > 1e-6 and not stopped_by:
        console.print(f"  {summary.simulated_seconds:,g} s simulated for the {total:,g} s asked: "
                      f"whole sampling intervals of {sim.interval:g} s")
    for fault in sim.faults:
        if fault.started:
            console.print(f"  {fault.id} {fault.type} on {fault.target_name} at +{fault.onset:,.0f} s")
    if health.problems:
        console.print(f"[yellow]{health.total_problems():,} problems parsing the {via} format:[/] "
                      + ", ".join(f"{stage}: {reason} x{n:,}" for (stage, reason), n in health.problems.items()))
    sys.stdout.write(json.dumps(summary.as_dict()) + "\n")
