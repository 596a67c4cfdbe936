"""``foreshock agent``: an ingest agent that publishes one source's telemetry to Kafka."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from typing import Any, Iterable

import click
from click.core import ParameterSource
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from foreshock.recording import RecordingError

from .common import (LIVE_INTERVAL, cluster_gpus, cluster_option, finite_number, node_named, sim_interval,
                     stop_on_signals, until_unreadable)
from .kafka_options import kafka_options, settings_from

SOURCES = ("simulator", "replay", "dcgm", "nvidia-smi", "nvml", "infiniband", "dom", "ethtool", "redfish", "cdu")
URL_HELP = ("dcgm: the dcgm-exporter metrics URL; redfish: NODE=https://BMC[,...]; cdu: LOOP=https://CDU[,...] "
            "(Redfish credentials from FORESHOCK_BMC_USER / FORESHOCK_BMC_PASSWORD).")


LIVE = tuple(source for source in SOURCES if source not in ("replay", "simulator"))
# the sources that name their node after --host (``watch``: --node) when what they read does not
NODE_NAMED = ("nvidia-smi", "nvml", "infiniband", "dom", "ethtool", "redfish")

# the sources that read each of the options several sources share, by flag (without its dashes);
# another source would ignore it (r61: ``--source infiniband --interfaces mlx5_0`` polled every
# port without a word). ``duration`` is agent's (simulated seconds): record's and watch's, read by
# every source, is not checked.
READ_BY: dict[str, tuple[str, ...]] = {
    "path": ("replay",),
    "url": ("dcgm", "redfish", "cdu"),
    "executable": ("nvidia-smi", "dom", "ethtool"),
    "root": ("infiniband",),
    "interfaces": ("dom", "ethtool"),
    "host": NODE_NAMED,
    "node": NODE_NAMED,
    "speed": ("replay", "simulator"),
    "now": ("replay",),
    "interval": ("simulator", *LIVE),
    "polls": LIVE,
    "gpus": ("simulator",),
    "scenario": ("simulator",),
    "seed": ("simulator",),
    "duration": ("simulator",),
    "forget-after": ("dcgm",),
    "cluster": tuple(source for source in LIVE if source != "cdu"),
}
# what a source does instead, for the message of an option it does not read
INSTEAD = {("interfaces", "infiniband"): "polls every port under --root",
           ("interfaces", "nvidia-smi"): "reads every GPU nvidia-smi lists",
           ("interfaces", "nvml"): "reads every GPU NVML lists",
           ("executable", "nvml"): "reads the NVIDIA driver through its library",
           **{(flag, "dcgm"): "names each GPU's node by the exporter's Hostname label" for flag in ("host", "node")},
           **{(flag, "cdu"): "names its cooling loops in --url" for flag in ("host", "node")},
           **{("speed", source): "polls every --interval" for source in LIVE},
           **{("duration", source): "runs until --polls, or a signal" for source in LIVE},
           ("now", "simulator"): "starts its clock now anyway",
           ("cluster", "replay"): "keeps the recording's topology and its cluster",
           ("cluster", "simulator"): "names its own cluster",
           ("cluster", "cdu"): "reads the --topology file, whose cluster name stands",
           ("interval", "replay"): "keeps the recording's own timing (--speed paces it)",
           ("polls", "replay"): "ends with the recording",
           ("polls", "simulator"): "ends after --duration"}


def refuse_unlisted_node(source: str, node: str, nodes: list[str], node_flag: str) -> None:
    """A usage error where ``node``, the name a source gives this machine's rows, is not among the
    topology's ``nodes``: a host name read as ``node7.cluster.local`` against a file (or Slurm)
    that says ``node7`` had every row refused as an unknown entity, one log line, and ``watch``
    waiting for a first frame for ever (review r1, 2026-12-03)."""
    if node in nodes:
        return
    near = [name for name in nodes if name.split(".")[0] == node.split(".")[0]]
    listed = ", ".join(nodes[:5]) + (f", ... ({len(nodes)} in all)" if len(nodes) > 5 else "")
    hint = f"perhaps {node_flag} {near[0]}" if near else f"pass {node_flag} NAME as the file names this machine"
    raise click.UsageError(f"--source {source} names this machine's rows {node!r}, which the --topology file "
                           f"does not list (its nodes: {listed}): {hint}")


def refuse_unread_options(source: str, **given: object) -> None:
    """A click.UsageError naming the first of ``given`` (options by flag without its dashes, None
    when not given: see :func:`options_given`) that ``source`` does not read, rather than ignoring it."""
    for name, value in given.items():
        readers = READ_BY[name]
        if value is None or source in readers:
            continue
        sources = " / ".join(f"--source {reader}" for reader in readers)
        instead = INSTEAD.get((name, source), "does not read it")
        raise click.UsageError(f"--{name} is read by {sources} only; --source {source} {instead}")


def options_given(ctx: click.Context, *names: str) -> dict[str, object]:
    """The options ``names`` (parameter names) of ``ctx``'s command as :func:`refuse_unread_options`
    takes them: by flag, the value where the user gave one (command line or environment), else None.
    An option left at its default never trips the check, whatever the default (``--gpus`` 64)."""
    flags = {param.name: param.opts[0].lstrip("-") for param in ctx.command.params}
    left = (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)
    return {flags[name]: None if ctx.get_parameter_source(name) in left else ctx.params[name] for name in names}


def open_source(source: str, path: str | None, url: str | None, executable: str | None, root: str | None,
            interfaces: str | None, interval: float | None, polls: int | None, host: str | None,
            speed: float | None, now: bool, gpus: int, scenario: str, seed: int, duration: float | None,
            topology_path: str | None = None, node_flag: str = "--host",
            cluster: str | None = None) -> tuple[Iterable[Any], Any]:
    """(frames, topology or a callable giving it once known) for a source; `agent` publishes the
    frames, `record` writes them to a recording folder. A live source numbers its entities by
    the topology file at ``topology_path`` when given (its entity names must be the file's), else
    by one it derives from what it reads. A source that names its rows after this machine
    (``host``, else its host name; the option is ``node_flag``) is refused with a topology that
    does not list that name: every row would be an unknown entity, the run silent for good. A live
    source's derived topology names its cluster ``cluster``, else
    :data:`~foreshock.streams.polling.DERIVED_CLUSTER`, whatever the source; with ``topology_path``,
    ``cluster`` is refused (the file names its own)."""
    refuse_unread_options(source, path=path, url=url, executable=executable, root=root, interfaces=interfaces,
                          cluster=cluster)
    topology = None
    if topology_path is not None and cluster is not None:
        raise click.UsageError("--cluster names the cluster of a topology derived from what the source reads; the "
                               "--topology file names its own (its 'cluster:'), which stands")
    if topology_path is not None:
        if source in ("replay", "simulator"):
            raise click.UsageError(f"--topology is for live sources; --source {source} brings its own")
        from foreshock.topology import Topology, TopologyError

        try:
            topology = Topology.load(topology_path)
        except (TopologyError, OSError) as exc:
            raise click.UsageError(f"--topology: {exc}") from None
        if source in NODE_NAMED and source != "redfish":  # (redfish's nodes are its --url list's)
            refuse_unlisted_node(source, host or socket.gethostname(), topology.nodes, node_flag)
    if source == "replay":
        from foreshock.streams.sources import ReplaySource, UnknownStartError

        if not path:
            raise click.UsageError("--source replay needs --path RECORDING")
        try:
            replay = ReplaySource(path, speed=speed, shift_to=time.time() if now else None)
        except UnknownStartError as exc:  # as `replay --now` says it (a traceback here)
            raise click.UsageError(f"--now: {exc}") from None
        except RecordingError as exc:
            raise click.ClickException(str(exc)) from None
        return replay, replay.topology
    if source == "simulator":
        from foreshock.simulator import ClusterSimulator
        from foreshock.streams.sources import IterableSource

        sim = ClusterSimulator(gpus=gpus, scenario=scenario, seed=seed, interval=interval or 1.0,
                               duration=duration, start_time=time.time())
        live = IterableSource(sim.topology, sim.iter_frames(), speed=speed)
        return live, sim.topology
    polled: Any
    if source == "dcgm":
        from foreshock.streams.dcgm import DcgmScrapeSource

        if not url:
            raise click.UsageError("--source dcgm needs --url http://HOST:9400/metrics")
        polled = DcgmScrapeSource(url, interval=interval or 30.0, topology=topology, max_polls=polls)
    elif source == "nvidia-smi":
        from foreshock.streams.nvidia_smi import NvidiaSmiSource

        polled = NvidiaSmiSource(executable or "nvidia-smi", interval=interval or 10.0, host=host, topology=topology,
                                 max_polls=polls)
    elif source == "nvml":
        from foreshock.streams.nvml import NvmlSource

        polled = NvmlSource(interval=interval or 1.0, host=host, topology=topology, max_polls=polls)
    elif source == "infiniband":
        from foreshock.streams.infiniband import DEFAULT_ROOT, InfinibandSource

        polled = InfinibandSource(root or DEFAULT_ROOT, interval=interval or 1.0, host=host, topology=topology,
                                  max_polls=polls)
    elif source == "dom":
        from foreshock.streams.dom import DomSource

        if not interfaces:
            raise click.UsageError("--source dom needs --interfaces eth0,eth1")
        polled = DomSource([i.strip() for i in interfaces.split(",") if i.strip()], interval=interval or 60.0,
                           executable=executable or "ethtool", host=host, topology=topology, max_polls=polls)
    elif source == "ethtool":  # ethtool -S: PHY counters (pre-FEC BER) and PFC pause per interface
        from foreshock.streams.ethtool_stats import EthtoolStatsSource

        if not interfaces:
            raise click.UsageError("--source ethtool needs --interfaces eth0,eth1")
        polled = EthtoolStatsSource([i.strip() for i in interfaces.split(",") if i.strip()],
                                    interval=interval or 10.0, executable=executable or "ethtool", host=host,
                                    topology=topology, max_polls=polls)
    elif source == "redfish":  # node BMCs: chassis fans and power
        from foreshock.streams.redfish import RedfishSource, parse_bmc_list

        if not url:
            raise click.UsageError("--source redfish needs --url NODE=https://BMC[,NODE=https://BMC...]")
        try:
            polled = RedfishSource(parse_bmc_list(url, host), interval=interval or 30.0, topology=topology,
                                   max_polls=polls)
        except ValueError as exc:
            raise click.UsageError(f"--source redfish: {exc}") from None
    elif source == "cdu":  # cooling loops' CDUs: the coolant supply and flow of their racks
        from foreshock.streams.redfish import CduSource, parse_bmc_list

        if not url or topology is None:
            raise click.UsageError("--source cdu needs --url LOOP=https://CDU[,LOOP=https://CDU...] and --topology "
                                   "(the racks each loop feeds)")
        try:
            polled = CduSource(parse_bmc_list(url, what="loop"), topology, interval=interval or 10.0, max_polls=polls)
        except ValueError as exc:
            raise click.UsageError(f"--url: {exc}") from None
    else:  # pragma: no cover - click.Choice
        raise click.UsageError(f"unknown source {source}")
    if topology is None:  # (NVML, dom, ethtool and Redfish derive theirs when created: renamed)
        from foreshock.streams.polling import DERIVED_CLUSTER

        polled.name_cluster(cluster or DERIVED_CLUSTER)
    return polled, lambda: polled.topology


@click.command("agent")
@click.option("--source", type=click.Choice(SOURCES), required=True, help="Where the telemetry comes from.")
@kafka_options
@click.option("--path", type=click.Path(exists=True, file_okay=False), default=None, help="replay: the recording folder.")
@click.option("--speed", type=float, default=None, callback=finite_number(positive=True),
              help="replay/simulator: X times real time (default: replay as fast as possible, simulator live = 1).")
@click.option("--now", "shift_now", is_flag=True,
              help="replay: shift timestamps so the replay starts now. Faster than real time (the default, or "
                   "--speed above 1) the stamps run ahead of the clock and the workers refuse rows past their "
                   "--max-clock-ahead: --speed 1 to follow the clock.")
@click.option("--url", default=None, help=URL_HELP)
@click.option("--executable", default=None, help="nvidia-smi / dom / ethtool: the program to run (default nvidia-smi / ethtool).")
@click.option("--root", default=None, help="infiniband: the sysfs root (default /sys/class/infiniband).")
@click.option("--interfaces", default=None, help="dom / ethtool: comma-separated network interfaces.")
@click.option("--interval", type=LIVE_INTERVAL, default=None,
              callback=finite_number(),
              help="Seconds between polls / simulator ticks (default: per source).")
@click.option("--topology", "topology_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Live sources: the cluster's topology file, the same the workers use (default: one derived from "
                   "what the source reads, which only fits when this agent is the cluster's only one).")
@click.option("--polls", type=click.IntRange(min=1), default=None, help="Stop after this many polls.")
@click.option("--node", default=None, help="Node name for local sources (default: this host's name).")
@click.option("--host", default=None, hidden=True, help="Deprecated: the old name of --node.")
@cluster_option
@click.option("--gpus", type=int, default=64, show_default=True, callback=cluster_gpus,
              help="simulator: cluster size in GPUs, a multiple of 8.")
@click.option("--scenario", default="healthy", show_default=True, help="simulator: scenario name or YAML file.")
@click.option("--seed", type=int, default=0, show_default=True, help="simulator: seed.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None, callback=finite_number(),
              help="simulator: simulated seconds (default: the scenario's).")
@click.option("--agent-id", default=None, help="Name of this agent in message headers (default host-pid).")
@click.option("--linger-ms", type=click.FloatRange(min=0), default=50.0, show_default=True,
              help="How long pieces wait to share a message with the next frames' (0 = one message per frame "
                   "and partition).")
@click.option("--compression", type=click.Choice(["none", "lz4", "zstd"]), default="lz4", show_default=True,
              help="Arrow buffer compression of the messages: fewer bytes through the broker, more CPU.")
@click.option("--metrics-port", type=click.IntRange(min=0), default=0, show_default=True,
              help="Serve this agent's own counters (samples read, input problems by stage and reason) on "
                   "/metrics at this port (0 = do not serve).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port.")
def command(source: str, kafka: str | None, user: str | None, password: str | None, namespace: str,
            partitions: int, path: str | None, speed: float | None, shift_now: bool, url: str | None,
            executable: str | None, root: str | None, interfaces: str | None, interval: float | None,
            polls: int | None, node: str | None, host: str | None, cluster: str | None, gpus: int, scenario: str,
            seed: int, duration: float | None,
            agent_id: str | None, linger_ms: float, compression: str, topology_path: str | None, metrics_port: int,
            metrics_host: str) -> None:
    """Publish telemetry from SOURCE to Kafka (telemetry.frames, Arrow IPC, partitioned by rack: a rack's nodes share a partition)."""
    from kafka.errors import KafkaError

    from foreshock.health import PipelineHealth
    from foreshock.streams.kafka_agent import run_agent
    from foreshock.streams.kafka_config import KafkaConnectError, check_broker
    from foreshock.streams.kafka_topics import Topics

    # a misplaced option is told before the broker is reached (open_source checks again, for record and watch)
    refuse_unread_options(source, **options_given(click.get_current_context(), "path", "url", "executable", "root",
                                                  "interfaces", "node", "host", "speed", "shift_now", "interval",
                                                  "polls", "gpus", "scenario", "seed", "duration", "cluster"))
    host, node_flag = node_named(node, host, "agent")
    if source == "simulator":  # the simulator's cap (an hour) before the broker: LIVE_INTERVAL's is a poll's
        ctx = click.get_current_context()
        param = next(p for p in ctx.command.params if p.name == "interval")
        try:
            sim_interval(ctx, param, interval)
        except click.BadParameter as exc:
            exc.ctx, exc.param = ctx, param  # (named as click names a callback's refusal: "for '--interval'")
            raise
    settings = settings_from(kafka, user, password)
    try:
        check_broker(settings)
    except KafkaConnectError as exc:
        raise click.ClickException(str(exc)) from None
    if source == "simulator" and speed is None:
        speed = 1.0
    try:
        frames, topology = open_source(source, path, url, executable, root, interfaces, interval, polls, host,
                                       speed, shift_now, gpus, scenario, seed, duration, topology_path, node_flag,
                                       cluster)
    except click.ClickException:
        raise
    except Exception as exc:  # no NVIDIA driver for --source nvml, say: a clear error, as record and watch give
        raise click.ClickException(f"cannot open source {source}: {type(exc).__name__}: {exc}") from None
    # a polled source counts its own problems (a scrape that failed, a BMC that refused): the
    # summary and /metrics report those with the publishing's
    polled_health = getattr(frames, "health", None)
    health = polled_health or PipelineHealth()
    server = None
    if metrics_port:
        from foreshock.exporters.prometheus import MetricsPortError, serve_health

        def cluster_label() -> str:
            known = topology() if callable(topology) else topology
            return known.cluster if known is not None else ""

        try:
            server = serve_health(health, cluster_label, metrics_host, metrics_port)
        except MetricsPortError as exc:
            raise click.UsageError(exc.usage("--metrics-port", node_option="--node")) from None
    console = Console(stderr=True)
    try:
        with Progress(SpinnerColumn(), TextColumn("[bold]agent[/bold] {task.fields[samples]:,} samples, "
                                                  "{task.fields[frames]:,} frames"), TimeElapsedColumn(),
                      console=console, transient=False) as progress:
            task = progress.add_task("agent", samples=0, frames=0)
            counted = {"samples": 0, "frames": 0}

            def on_frame(frame: Any) -> None:
                counted["samples"] += len(frame)
                counted["frames"] += 1
                if polled_health is None:  # a replay or the simulator: nobody else counts its samples
                    health.processed(frame.kind, len(frame))
                progress.update(task, samples=counted["samples"], frames=counted["frames"])

            # the first Ctrl-C, SIGTERM (systemd, docker) or SIGHUP ends the run after the frame in
            # hand: the publisher is flushed and closed and the summary printed. Killed outright by
            # SIGTERM, what it still held for the broker was lost.
            stopping = threading.Event()

            def stop_publishing(_sig: signal.Signals) -> None:
                stopping.set()
                # no wait for the next frame: a polled source's poll, or a paced replay's next
                # frame, which may be an hour away across a gap in the recording
                halt = getattr(frames, "stop", None)
                if isinstance(halt, threading.Event):  # replay and simulator sources
                    halt.set()
                elif callable(halt):  # polled sources
                    halt()

            restore = stop_on_signals(stop_publishing)
            # a recording part found unreadable mid-run ends the frames as a signal does: what was
            # published is flushed and summed up, then the command exits with the error (replay's way)
            unreadable: list[RecordingError] = []
            try:
                # a replay or the simulator can wait while the broker's backlog is full; a live
                # source's readings would go stale: it drops them (counted)
                stats = run_agent(settings, until_unreadable(frames, unreadable), topology, Topics(namespace, partitions), agent_id, health,
                                  on_frame=on_frame, stop=stopping, linger_ms=linger_ms,
                                  compression=None if compression == "none" else compression,
                                  live=source not in ("replay", "simulator"))
            except KafkaConnectError as exc:
                raise click.ClickException(str(exc)) from None
            except KafkaError as exc:  # a send the producer refused (counted in the log's send_failed)
                raise click.ClickException(f"Kafka: {type(exc).__name__}: {exc}") from None
            except KeyboardInterrupt:
                console.print("[yellow]stopped[/yellow]")
                return
            finally:
                restore()
    finally:
        if server is not None:
            from foreshock.exporters.prometheus import stop

            stop(server)
    click.echo(json.dumps({"name": "agent", "source": source, "frames": stats.frames, "samples": stats.samples,
                           "pieces": stats.pieces, "messages": stats.messages, "bytes": stats.bytes,
                           "send_failed": stats.failed, "backlog_dropped": stats.dropped,
                           "wall_seconds": round(stats.wall_s, 3), "samples_per_s": round(stats.samples_per_s),
                           "input_problems": health.total_problems(), "stopped_early": stopping.is_set(),
                           **({"error": str(unreadable[0])} if unreadable else {})}))
    if unreadable:
        raise click.ClickException(str(unreadable[0]))
    if stats.failed:
        raise click.ClickException(f"{stats.failed} of {stats.pieces} pieces could not be delivered (see the log)")

