"""How foreshock reaches a Kafka broker: address, security, credentials, and a fast pre-flight.

One :class:`KafkaSettings` serves the kafka-python agents and the faust (aiokafka) workers.
:func:`check_broker` connects once before any client is built and turns the two common
mistakes into clear errors within seconds:

- nothing listening -> :class:`KafkaUnavailableError` naming the address;
- wrong SASL user or password -> :class:`KafkaAuthError` with the broker's own message.

Why the pre-flight exists: kafka-python 3.0.x does not surface a failed SASL authentication.
The broker answers the SaslAuthenticate request with the error and closes the connection at
the same moment; kafka-python's transport reads the error bytes and the end of stream in one
go, reports only "socket disconnected", and keeps retrying the bootstrap until
``bootstrap_timeout_ms`` (30 s by default) ends in a ``KafkaTimeoutError("Unable to
bootstrap ...")`` that never mentions authentication. The pre-flight speaks the two SASL
requests itself (SaslHandshake v1, SaslAuthenticate v0) and reads the broker's answer.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass, replace
from typing import Any

PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT")
MECHANISMS = ("PLAIN",)

_API_SASL_HANDSHAKE = 17
_API_SASL_AUTHENTICATE = 36


class KafkaConnectError(RuntimeError):
    """The broker cannot be used; the message says why and where."""


class KafkaUnavailableError(KafkaConnectError):
    """Nothing answers at the bootstrap address (or it is not a Kafka broker)."""


class KafkaAuthError(KafkaConnectError):
    """The broker rejected the SASL credentials."""


@dataclass(frozen=True)
class KafkaSettings:
    """Where the broker is and how to authenticate. ``bootstrap`` is ``host:port[,host:port]``."""

    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    username: str | None = None
    password: str | None = None
    client_id: str = "foreshock"

    def __post_init__(self) -> None:
        if self.security_protocol not in PROTOCOLS:
            raise ValueError(f"security protocol {self.security_protocol!r} not supported; use one of {PROTOCOLS}")
        if self.sasl and self.sasl_mechanism not in MECHANISMS:
            raise ValueError(f"SASL mechanism {self.sasl_mechanism!r} not supported; use one of {MECHANISMS}")
        if self.sasl and (not self.username or self.password is None):
            raise ValueError("SASL_PLAINTEXT needs a username and a password")
        self.servers()  # validates the address list

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL")

    def servers(self) -> list[tuple[str, int]]:
        out = []
        for item in self.bootstrap.split(","):
            host, sep, port = item.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"Kafka address {item.strip()!r} is not HOST:PORT")
            out.append((host, int(port)))
        return out

    def with_client_id(self, client_id: str) -> "KafkaSettings":
        return replace(self, client_id=client_id)

    @classmethod
    def from_env(cls, bootstrap: str | None = None, username: str | None = None,
                 password: str | None = None) -> "KafkaSettings":
        """Arguments win over ``FORESHOCK_KAFKA``, ``FORESHOCK_KAFKA_USER`` and
        ``FORESHOCK_KAFKA_PASSWORD``; a username switches to SASL_PLAINTEXT."""
        bootstrap = bootstrap or os.environ.get("FORESHOCK_KAFKA")
        if not bootstrap:
            raise ValueError("no Kafka address: pass --kafka HOST:PORT or set FORESHOCK_KAFKA")
        username = username or os.environ.get("FORESHOCK_KAFKA_USER")
        password = password if password is not None else os.environ.get("FORESHOCK_KAFKA_PASSWORD")
        if username:
            return cls(bootstrap, "SASL_PLAINTEXT", "PLAIN", username, password)
        return cls(bootstrap)

    # ---- client configurations ---------------------------------------------------------
    def kafka_python(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python's KafkaProducer / KafkaConsumer / KafkaAdminClient."""
        conf: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "client_id": self.client_id,
                                "security_protocol": self.security_protocol}
        if self.sasl:
            conf.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.username,
                        sasl_plain_password=self.password)
        return conf

    def faust_broker(self) -> str:
        return ";".join(f"kafka://{h}:{p}" for h, p in self.servers())

    def faust_credentials(self) -> Any:
        """``broker_credentials`` for faust (None for PLAINTEXT)."""
        if not self.sasl:
            return None
        import faust  # faust is slow to import; only the workers need it

        return faust.SASLCredentials(username=self.username, password=self.password,
                                     mechanism=self.sasl_mechanism)


def check_broker(settings: KafkaSettings, timeout_s: float = 5.0) -> None:
    """Connect to the first reachable bootstrap server; authenticate if SASL is configured.

    Raises :class:`KafkaUnavailableError` or :class:`KafkaAuthError` with a message that
    names the address (and the user), within about ``timeout_s`` per server.
    """
    errors = []
    for host, port in settings.servers():
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
            continue
        with sock:
            sock.settimeout(timeout_s)
            if settings.sasl:
                _sasl_plain(sock, settings, f"{host}:{port}")
            return
    raise KafkaUnavailableError(f"no Kafka broker reachable at {settings.bootstrap} ({'; '.join(errors)})")


# ---- the two SASL requests (Kafka protocol, non-flexible versions) -----------------------
def _string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _request(sock: socket.socket, api_key: int, version: int, correlation: int, client_id: str,
             body: bytes) -> bytes:
    header = struct.pack(">hhi", api_key, version, correlation) + _string(client_id)
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    size = struct.unpack(">i", _read_exactly(sock, 4))[0]
    response = _read_exactly(sock, size)
    if struct.unpack(">i", response[:4])[0] != correlation:
        raise KafkaUnavailableError("unexpected Kafka response (correlation id mismatch)")
    return response[4:]


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        try:
            chunk = sock.recv(n)
        except socket.timeout:
            raise KafkaUnavailableError("the broker did not answer in time") from None
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _sasl_plain(sock: socket.socket, settings: KafkaSettings, where: str) -> None:
    user = settings.username or ""
    try:
        body = _request(sock, _API_SASL_HANDSHAKE, 1, 1, settings.client_id, _string(settings.sasl_mechanism))
        (error,) = struct.unpack(">h", body[:2])
        if error == 33:  # UNSUPPORTED_SASL_MECHANISM
            raise KafkaAuthError(f"the broker at {where} does not offer SASL {settings.sasl_mechanism}")
        if error != 0:
            raise KafkaUnavailableError(f"SASL handshake with {where} failed (Kafka error code {error}); "
                                        "is this the SASL_PLAINTEXT listener?")
        token = b"\0" + user.encode() + b"\0" + (settings.password or "").encode()
        body = _request(sock, _API_SASL_AUTHENTICATE, 0, 2, settings.client_id,
                        struct.pack(">i", len(token)) + token)
    except EOFError:
        raise KafkaUnavailableError(f"the broker at {where} closed the connection during SASL "
                                    "(a PLAINTEXT listener, or not Kafka?)") from None
    (error,) = struct.unpack(">h", body[:2])
    if error != 0:
        (length,) = struct.unpack(">h", body[2:4])
        message = body[4:4 + length].decode(errors="replace") if length >= 0 else ""
        raise KafkaAuthError(f"SASL/{settings.sasl_mechanism} authentication as {user!r} at {where} failed: "
                             f"{message or f'Kafka error code {error}'}")
