"""Options shared by the Kafka commands (``agent``, ``worker``): broker, credentials, topics."""

from __future__ import annotations

from typing import Any, Callable

import click

from foreshock.streams.kafka_config import KafkaSettings


def kafka_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option("--partitions", type=click.IntRange(min=1), default=8, show_default=True,
                        help="Partitions of telemetry.frames when this command creates it.")(func)
    func = click.option("--namespace", default="", help="Prefix for every topic name (several pipelines on one broker).")(func)
    func = click.option("--password", envvar="FORESHOCK_KAFKA_PASSWORD", default=None,
                        help="SASL/PLAIN password; needs --user (env FORESHOCK_KAFKA_PASSWORD).")(func)
    func = click.option("--user", envvar="FORESHOCK_KAFKA_USER", default=None,
                        help="SASL/PLAIN user: switches to SASL_PLAINTEXT (env FORESHOCK_KAFKA_USER).")(func)
    func = click.option("--kafka", envvar="FORESHOCK_KAFKA", default=None,
                        help="Broker address HOST:PORT[,HOST:PORT], IPv6 as [ADDRESS]:PORT "
                             "(env FORESHOCK_KAFKA).")(func)
    return func


def settings_from(kafka: str | None, user: str | None, password: str | None) -> KafkaSettings:
    try:
        return KafkaSettings.from_env(kafka, user, password)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
