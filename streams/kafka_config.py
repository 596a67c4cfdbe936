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

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass, replace
from typing import Any

PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT")
MECHANISMS = ("PLAIN",)

_API_SASL_HANDSHAKE = 17
_API_SASL_AUTHENTICATE = 36
# far above any SaslHandshake/SaslAuthenticate answer: a bigger size prefix is not Kafka talking
_MAX_RESPONSE_BYTES = 1 << 20


class KafkaConnectError(RuntimeError):
    """The broker cannot be used; the message says why and where."""


class KafkaUnavailableError(KafkaConnectError):
    """Nothing answers at the bootstrap address (or it is not a Kafka broker)."""


class KafkaAuthError(KafkaConnectError):
    """The broker rejected the SASL credentials."""


@dataclass(frozen=True)
class KafkaSettings:
    """Where the broker is and how to authenticate. ``bootstrap`` is ``host:port[,host:port]``, an
    IPv6 address in brackets (``[::1]:9092``), as kafka-python and aiokafka read it."""

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
        """``(host, port)`` per bootstrap server; an IPv6 host without its brackets, as sockets take it."""
        return [_split_address(item.strip()) for item in self.bootstrap.split(",")]

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
        if password and not username:
            # without a user the settings are PLAINTEXT: the password would be dropped without a word
            raise ValueError("a Kafka password (--password or FORESHOCK_KAFKA_PASSWORD) needs a user "
                             "(--user or FORESHOCK_KAFKA_USER)")
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
        return ";".join(f"kafka://{_join_address(h, p)}" for h, p in self.servers())

    def faust_credentials(self) -> Any:
        """``broker_credentials`` for faust (None for PLAINTEXT)."""
        if not self.sasl:
            return None
        import faust  # faust is slow to import; only the workers need it

        return faust.SASLCredentials(username=self.username, password=self.password,
                                     mechanism=self.sasl_mechanism)


def _split_address(item: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT`` -> ``(host, port)``; a ValueError says what is wrong with it."""
    # the usual slips, named: each would otherwise read as an IPv6 address without its brackets
    scheme, sep, rest = item.partition("://")
    if sep:
        raise ValueError(f"Kafka address {item!r}: give it without {scheme}://, as in {rest or 'HOST:PORT'}")
    if ";" in item:
        raise ValueError(f"Kafka address {item!r}: separate servers with commas, as in {item.replace(';', ',')}")
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket or not _is_ipv6(host) or not rest.startswith(":"):
            raise ValueError(f"Kafka address {item!r} is not [IPV6]:PORT")
        sep, port = ":", rest[1:]
    else:
        host, sep, port = item.rpartition(":")
        if ":" in host:
            # kafka-python and aiokafka read an unbracketed IPv6 address with a port as one host name
            hint = f"[{host}]:{port}" if _is_ipv6(host) and port else "[ADDRESS]:PORT"
            raise ValueError(f"Kafka address {item!r}: an IPv6 address goes in brackets, as in {hint}")
    if not sep or not host or not (port.isascii() and port.isdigit()):
        raise ValueError(f"Kafka address {item!r} is not HOST:PORT")
    if any(c.isspace() or c in "[]" for c in host):
        # the clients would look up a name no DNS serves, and faust's "kafka://a :1;..." splits it
        raise ValueError(f"Kafka address {item!r}: the host {host!r} has a space or a bracket in it")
    if not 0 < int(port) < 65536:
        raise ValueError(f"Kafka address {item!r}: the port must be 1 to 65535")
    return host, int(port)


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def _join_address(host: str, port: int) -> str:
    """The inverse of :func:`_split_address`: an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_broker(settings: KafkaSettings, timeout_s: float = 5.0) -> None:
    """Connect to the first usable bootstrap server; authenticate if SASL is configured.

    Raises :class:`KafkaUnavailableError` or :class:`KafkaAuthError` with a message that
    names the address (and the user), within about ``timeout_s`` per server. A server that is
    down or does not speak SASL sends the check on to the next one; refused credentials do not
    (every broker of a cluster shares them).
    """
    servers = settings.servers()
    errors = []
    reached = False
    for host, port in servers:
        where = _join_address(host, port)
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            errors.append(f"{where}: {exc.strerror or exc}")
            continue
        except UnicodeError:  # the IDNA encoding of the name failed (an empty label, a label over 63)
            errors.append(f"{where}: not a valid host name")
            continue
        with sock:
            sock.settimeout(timeout_s)
            if settings.sasl:
                try:
                    _sasl_plain(sock, settings, where)
                except KafkaUnavailableError as exc:
                    if len(servers) == 1:
                        raise
                    errors.append(str(exc))
                    reached = True
                    continue
            return
    raise KafkaUnavailableError(f"no Kafka broker {'usable' if reached else 'reachable'} at {settings.bootstrap} "
                                f"({'; '.join(errors)})")


# ---- the two SASL requests (Kafka protocol, non-flexible versions) -----------------------
def _string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _request(sock: socket.socket, where: str, api_key: int, version: int, correlation: int, client_id: str,
             body: bytes) -> bytes:
    header = struct.pack(">hhi", api_key, version, correlation) + _string(client_id)
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    size = struct.unpack(">i", _read_exactly(sock, where, 4))[0]
    if not 4 <= size <= _MAX_RESPONSE_BYTES:  # a response holds at least its correlation id
        raise KafkaUnavailableError(f"unexpected answer from {where} (a response of {size} bytes; not Kafka?)")
    response = _read_exactly(sock, where, size)
    if struct.unpack(">i", response[:4])[0] != correlation:
        raise KafkaUnavailableError(f"unexpected answer from {where} (correlation id mismatch)")
    return response[4:]


def _read_exactly(sock: socket.socket, where: str, n: int) -> bytes:
    chunks = []
    while n:
        try:
            chunk = sock.recv(n)
        except socket.timeout:
            raise KafkaUnavailableError(f"the broker at {where} did not answer in time") from None
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _sasl_plain(sock: socket.socket, settings: KafkaSettings, where: str) -> None:
    user = settings.username or ""
    message = ""
    try:
        body = _request(sock, where, _API_SASL_HANDSHAKE, 1, 1, settings.client_id, _string(settings.sasl_mechanism))
        (error,) = struct.unpack(">h", body[:2])
        if error == 33:  # UNSUPPORTED_SASL_MECHANISM
            raise KafkaAuthError(f"the broker at {where} does not offer SASL {settings.sasl_mechanism}")
        if error != 0:
            raise KafkaUnavailableError(f"SASL handshake with {where} failed (Kafka error code {error}); "
                                        "is this the SASL_PLAINTEXT listener?")
        token = b"\0" + user.encode() + b"\0" + (settings.password or "").encode()
        body = _request(sock, where, _API_SASL_AUTHENTICATE, 0, 2, settings.client_id,
                        struct.pack(">i", len(token)) + token)
        (error,) = struct.unpack(">h", body[:2])
        if error != 0:
            (length,) = struct.unpack(">h", body[2:4])
            message = body[4:4 + length].decode(errors="replace") if length >= 0 else ""
    except EOFError:
        raise KafkaUnavailableError(f"the broker at {where} closed the connection during SASL "
                                    "(a PLAINTEXT listener, or not Kafka?)") from None
    except struct.error:  # an answer too short for the fields the request's version has
        raise KafkaUnavailableError(f"the broker at {where} sent a malformed SASL answer (not Kafka?)") from None
    except OSError as exc:  # a reset connection, a send that timed out
        raise KafkaUnavailableError(f"the connection to {where} failed during SASL: {exc.strerror or exc}") from None
    if error != 0:
        raise KafkaAuthError(f"SASL/{settings.sasl_mechanism} authentication as {user!r} at {where} failed: "
                             f"{message or f'Kafka error code {error}'}")
