"""Helpers for the tests that need a real Kafka broker (imported by tests/test_kafka_*.py).

``make test`` starts the shared broker (deploy/kafka/kafka.mk) and exports FORESHOCK_KAFKA and
FORESHOCK_KAFKA_SASL; without them the Kafka tests skip, saying so. Tests that stop or restart
a broker start a private one with deploy/kafka/broker.sh on free ports in their tmp folder.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from foreshock.streams.kafka_config import KafkaSettings

ROOT = Path(__file__).resolve().parents[1]
BROKER_SH = ROOT / "deploy" / "kafka" / "broker.sh"
JAAS = ROOT / "deploy" / "kafka" / "kafka_server_jaas.conf"

NO_BROKER = "needs the Kafka broker: run under `make test` (or `make kafka-up` and export FORESHOCK_KAFKA)"


def sasl_users() -> dict[str, str]:
    """The users defined in the broker's JAAS file: the single source of the test credentials."""
    return dict(re.findall(r'user_(\w+)="([^"]*)"', JAAS.read_text()))


def unique_topic(prefix: str = "test") -> str:
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def kafka_settings() -> KafkaSettings:
    address = os.environ.get("FORESHOCK_KAFKA")
    if not address:
        pytest.skip(NO_BROKER)
    return KafkaSettings(address)


@pytest.fixture
def kafka_sasl_address() -> str:
    address = os.environ.get("FORESHOCK_KAFKA_SASL")
    if not address:
        pytest.skip(NO_BROKER)
    return address


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def terminate(proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """Stop a worker or agent subprocess: SIGTERM, then SIGKILL if it has not ended in ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class PrivateBroker:
    """A broker of the test's own (same jars and config as the shared one, other ports)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.plain, self.sasl, self.controller = free_ports(3)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.plain}"

    def _call(self, *args: str) -> None:
        proc = subprocess.run([str(BROKER_SH), *args], capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"broker.sh {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")

    def start(self) -> None:
        self._call("start", str(self.run_dir), str(self.plain), str(self.sasl), str(self.controller))

    def stop(self) -> None:
        self._call("stop", str(self.run_dir))

    def clean(self) -> None:
        self._call("clean", str(self.run_dir))


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[PrivateBroker]:
    if not os.environ.get("FORESHOCK_KAFKA"):
        pytest.skip(NO_BROKER)
    broker = PrivateBroker(tmp_path / "kafka")
    broker.start()
    try:
        yield broker
    finally:
        broker.clean()
