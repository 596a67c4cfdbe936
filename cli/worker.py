"""``foreshock worker``: a faust-streaming worker of the distributed (Kafka) pipeline."""

from __future__ import annotations

import click

from foreshock.guard import MAX_AHEAD_S

from .common import param_option
from .kafka_options import kafka_options, settings_from


@click.command("worker")
@kafka_options
@click.option("--group", "app_id", default="foreshock", show_default=True,
              help="Consumer group (faust app id): workers of one group share the partitions.")
@click.option("--topology", "topology_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Topology YAML (default: the one the agents publish on foreshock.topology).")
@click.option("--detectors", default=None, help="Comma-separated detector names (default: the standard bank; "
              "`default` names it, e.g. `default,loop_warming`).")
@param_option
@click.option("--checkpoint-interval", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds between detector-state checkpoints (bounds the findings repeated after a crash).")
@click.option("--session-timeout", type=click.FloatRange(min=1.0), default=10.0, show_default=True,
              help="Seconds after which a silent worker's partitions move to the others.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address for /metrics.")
@click.option("--port", default=9109, show_default=True, type=int, help="Port for this worker's /metrics (0 = none).")
@click.option("--top-k", default=16, show_default=True, type=click.IntRange(min=0),
              help="Per-GPU series exported for the K GPUs nearest their core limit and the K nearest their HBM limit "
                   "(up to 2×K), besides flagged ones.")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]),
              help="Least severe log level the worker prints (passed to faust's worker).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="faust's data directory (default: a temporary folder, removed when the worker stops).")
@click.option("--role", type=click.Choice(["all", "detect", "incidents"]), default="all", show_default=True,
              help="all: detection and the incident stage; detect / incidents: one of them, in the consumer "
                   "group GROUP.detect / GROUP.incidents (run detect workers plus an incidents worker, so the "
                   "incident stage does not slow one worker's detection; never mix with all-role workers).")
@click.option("--max-clock-ahead", "max_clock_ahead", type=click.FloatRange(min=0), default=MAX_AHEAD_S, show_default=True,
              help="Refuse rows stamped more seconds ahead of this host's clock (counted as future_timestamp): a "
                   "sending host with a wrong clock would otherwise blind its entities for as long once it is put "
                   "right. 'inf' for no limit, for a simulation published faster than real time.")
def command(kafka: str | None, user: str | None, password: str | None, namespace: str, partitions: int,
            app_id: str, topology_path: str | None, detectors: str | None, params: tuple[str, ...],
            checkpoint_interval: float, session_timeout: float, host: str, port: int, top_k: int, log_level: str,
            data_dir: str | None, role: str, max_clock_ahead: float) -> None:
    """Consume telemetry from Kafka, run the detector bank on this worker's partitions, publish
    findings and incidents. Start several with the same --group to share the load."""
    from foreshock.detectors.bank import DetectorBank
    from foreshock.exporters.prometheus import MetricsPortError
    from foreshock.streams.faust_app import WorkerConfig, run_worker
    from foreshock.streams.kafka_agent import fetch_topology
    from foreshock.streams.kafka_config import KafkaConnectError
    from foreshock.streams.kafka_topics import Topics, ensure_topics
    from foreshock.topology import Topology

    from .common import checked_bank, detector_names, parse_params, store_params

    settings = settings_from(kafka, user, password)
    try:
        topics = ensure_topics(settings, Topics(namespace, partitions))
        topology = Topology.load(topology_path) if topology_path else fetch_topology(
            settings, topics, waiting=lambda text: click.echo(text, err=True))
    except (KafkaConnectError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    names = detector_names(detectors)
    by_detector = parse_params(params)  # every worker of a group should be given the same
    checked_bank(topology, names, by_detector)
    config = WorkerConfig(settings, topics, topology,
                          lambda hardware: DetectorBank.from_names(hardware, names, params=by_detector),
                          store_params=store_params(by_detector),
                          app_id=app_id, checkpoint_interval_s=checkpoint_interval,
                          session_timeout_s=session_timeout, metrics_host=host, metrics_port=port,
                          metrics_top_k=top_k, data_dir=data_dir, role=role, max_clock_ahead_s=max_clock_ahead)
    click.echo(f"worker {config.worker_id}: {role}, group {config.group}, {topics.partitions} partitions, "
               f"{len(topology.gpus)} GPUs" + (f", metrics on http://{host}:{port}/metrics" if port else ""), err=True)
    try:
        run_worker(config, loglevel=log_level)
    except MetricsPortError as exc:
        raise click.UsageError(exc.usage("--port")) from None
