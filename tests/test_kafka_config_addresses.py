"""The Kafka address and the SASL pre-flight, without a broker: plain TCP listeners on the loopback
stand in for one. An IPv6 bootstrap is written ``[ADDRESS]:PORT`` as kafka-python and aiokafka read
it; a listener that resets the connection or answers with a nonsense size is a
:class:`KafkaUnavailableError` naming the address (``agent``/``worker`` catch only
:class:`KafkaConnectError`), after which the next bootstrap server is tried."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Callable, Iterator

import pytest
from click.testing import CliRunner, Result

from foreshock.streams.kafka_config import KafkaAuthError, KafkaSettings, KafkaUnavailableError, check_broker

Behaviour = Callable[[socket.socket], None]


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture
def no_kafka_env(monkeypatch) -> None:
    for name in ("FORESHOCK_KAFKA", "FORESHOCK_KAFKA_USER", "FORESHOCK_KAFKA_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def listen() -> Iterator[Callable[..., tuple[int, list[tuple[str, int]]]]]:
    """``listen(behaviour, family)`` -> (port, peers): a listener whose connections ``behaviour``
    handles in a thread, and the addresses that connected to it."""
    servers: list[socket.socket] = []

    def start(behaviour: Behaviour | None = None, family: int = socket.AF_INET) -> tuple[int, list[tuple[str, int]]]:
        srv = socket.socket(family, socket.SOCK_STREAM)
        srv.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        srv.listen(4)
        srv.settimeout(10)
        servers.append(srv)
        peers: list[tuple[str, int]] = []

        def serve() -> None:
            while True:
                try:
                    conn, peer = srv.accept()
                except OSError:  # closed at the end of the test
                    return
                peers.append(peer[:2])
                with conn:
                    if behaviour is not None:
                        behaviour(conn)

        threading.Thread(target=serve, daemon=True).start()
        return srv.getsockname()[1], peers

    yield start
    for srv in servers:
        srv.close()


def read_request(conn: socket.socket) -> tuple[int, int]:
    """(api key, correlation id) of one Kafka request, read whole."""
    (size,) = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))
    payload = conn.recv(size, socket.MSG_WAITALL)
    api_key, _version, correlation = struct.unpack(">hhi", payload[:8])
    return api_key, correlation


def respond(conn: socket.socket, correlation: int, body: bytes) -> None:
    conn.sendall(struct.pack(">ii", 4 + len(body), correlation) + body)


def kafka_string(text: str) -> bytes:
    return struct.pack(">h", len(text.encode())) + text.encode()


def fake_sasl_broker(refusal: str | None) -> Behaviour:
    """SaslHandshake v1 offering PLAIN, then SaslAuthenticate v0 accepted or refused with ``refusal``."""
    def behaviour(conn: socket.socket) -> None:
        _, correlation = read_request(conn)
        respond(conn, correlation, struct.pack(">hi", 0, 1) + kafka_string("PLAIN"))
        _, correlation = read_request(conn)
        if refusal is None:
            respond(conn, correlation, struct.pack(">hhi", 0, -1, 0))
        else:  # SASL_AUTHENTICATION_FAILED
            respond(conn, correlation, struct.pack(">h", 58) + kafka_string(refusal) + struct.pack(">i", 0))
    return behaviour


def reset_after_request(conn: socket.socket) -> None:
    read_request(conn)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST


def answer_with_size(size: int, then: bytes = b"") -> Behaviour:
    def behaviour(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(struct.pack(">i", size) + then)
        # kept open until the client closes it (longer than its time-out): a client waiting for
        # the promised bytes waits its whole time-out, not until this end gives up
        conn.settimeout(30)
        try:
            conn.recv(1)
        except OSError:
            pass
    return behaviour


def sasl(bootstrap: str) -> KafkaSettings:
    return KafkaSettings(bootstrap, "SASL_PLAINTEXT", "PLAIN", "u", "p")


# ---- addresses ---------------------------------------------------------------------------
@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
def test_a_bracketed_ipv6_bootstrap_passes_the_preflight_and_reaches_the_clients_as_the_same_address(
        listen) -> None:
    """``[::1]:PORT`` is how kafka-python and aiokafka take an IPv6 address; the pre-flight once
    kept the brackets in the host, could not resolve it and refused a listening broker."""
    from aiokafka.conn import collect_hosts as aiokafka_hosts
    from faust.transport.drivers.aiokafka import server_list
    from faust.utils.urls import urllist
    from kafka.cluster import collect_hosts as kafka_python_hosts

    port, peers = listen(family=socket.AF_INET6)
    settings = KafkaSettings(f"[::1]:{port}")
    check_broker(settings, timeout_s=2)
    deadline = time.monotonic() + 5
    while not peers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert peers and peers[0][0] == "::1"
    assert [h[:2] for h in kafka_python_hosts(settings.kafka_python()["bootstrap_servers"])] == [("::1", port)]
    # faust reads the broker URL, and hands aiokafka the addresses its server_list makes of it
    faust_servers = server_list(urllist(settings.faust_broker(), default_scheme="kafka"), 9092)
    assert [h[:2] for h in aiokafka_hosts(faust_servers)] == [("::1", port)]


@pytest.mark.parametrize("address,hint", [("::1:9092", "[::1]:9092"), ("fd00::5:9092", "[fd00::5]:9092"),
                                          ("127.0.0.1:1,::1:9092", "[::1]:9092")])
def test_an_ipv6_address_without_brackets_is_refused_with_the_bracketed_spelling(address: str, hint: str) -> None:
    """kafka-python and aiokafka read ``::1:9092`` as the host name '::1:9092' (and faust's URL
    parser fails on it), while the pre-flight read it as ::1 port 9092 and passed."""
    with pytest.raises(ValueError, match="brackets") as info:
        KafkaSettings(address)
    assert hint in str(info.value)


@pytest.mark.parametrize("address", ["[::1]", "[::1]9092", "[::1:9092", "[kafka.example]:9092", "fe80::1",
                                     "127.0.0.1:99999", "127.0.0.1:0", "host:\u00b9"])
def test_an_address_that_no_client_could_use_is_refused(address: str) -> None:
    """All but the first two were taken by the parser before (the last with int()'s message): the
    brackets' content as a host name, or a port the socket layer wraps (99999 connects to 34463)."""
    with pytest.raises(ValueError, match="Kafka address"):
        KafkaSettings(address)


@pytest.mark.parametrize("address,says", [
    ("kafka://broker:9092", "without kafka://, as in broker:9092"),
    ("a:1;b:2", "separate servers with commas, as in a:1,b:2"),
    ("broker :9092", "space"), ("broker\n:9092", "space"), ("]:9092", "bracket"), ("a]b:9092", "bracket"),
])
def test_a_usual_slip_in_an_address_is_refused_naming_it(address: str, says: str) -> None:
    """A scheme prefix and ';' between servers were refused as IPv6 addresses without brackets; a
    host with a space or a bracket was taken, for the clients to look up a name no DNS serves."""
    with pytest.raises(ValueError) as info:
        KafkaSettings(address)
    assert says in str(info.value) and "IPv6" not in str(info.value)


def test_an_unusable_address_reaches_the_commands_as_a_usage_error(no_kafka_env) -> None:
    from foreshock.cli import agent, worker

    for command in (agent.command, worker.command):
        args = ["--kafka", "::1:9092"] + (["--source", "simulator"] if command is agent.command else [])
        result: Result = CliRunner().invoke(command, args)  # type: ignore[arg-type]
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
        assert "[::1]:9092" in result.output and "Traceback" not in result.output


# ---- credentials -------------------------------------------------------------------------
def test_a_password_without_a_user_is_refused_naming_both(no_kafka_env, monkeypatch) -> None:
    """Without a user the settings are PLAINTEXT, and the password was dropped without a word."""
    with pytest.raises(ValueError) as info:
        KafkaSettings.from_env("127.0.0.1:9092", None, "secret")
    message = str(info.value)
    assert "--password" in message and "--user" in message and "secret" not in message
    monkeypatch.setenv("FORESHOCK_KAFKA_PASSWORD", "secret")
    with pytest.raises(ValueError, match="FORESHOCK_KAFKA_PASSWORD"):
        KafkaSettings.from_env("127.0.0.1:9092")
    monkeypatch.setenv("FORESHOCK_KAFKA_USER", "u")
    assert KafkaSettings.from_env("127.0.0.1:9092").password == "secret"


def test_a_password_without_a_user_in_the_environment_is_a_usage_error_of_the_commands(no_kafka_env,
                                                                                      monkeypatch) -> None:
    from foreshock.cli import agent

    monkeypatch.setenv("FORESHOCK_KAFKA_PASSWORD", "secret")
    args = ["--source", "simulator", "--kafka", "127.0.0.1:9"]
    result: Result = CliRunner().invoke(agent.command, args)  # type: ignore[arg-type]
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "FORESHOCK_KAFKA_USER" in result.output


# ---- the SASL pre-flight against listeners that are not a SASL broker -----------------------
@pytest.mark.parametrize("behaviour", [
    reset_after_request,
    answer_with_size(-16, b"\0" * 16),  # recv(-16) raised ValueError
    answer_with_size(0),  # no room for the correlation id
    answer_with_size(4, struct.pack(">i", 1)),  # the handshake's correlation id, then no error code
    answer_with_size(64 << 20),  # the pre-flight waited for 64 MB that never came
], ids=["reset", "negative-size", "empty", "no-error-code", "huge-size"])
def test_a_listener_that_is_not_a_sasl_broker_is_an_unavailable_broker_naming_it(listen, behaviour) -> None:
    port, _ = listen(behaviour)
    t0 = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match=f"127.0.0.1:{port}"):
        check_broker(sasl(f"127.0.0.1:{port}"), timeout_s=10)
    assert time.monotonic() - t0 < 5.0  # an answer, not the 10 s time-out (wide apart on a loaded machine)


@pytest.mark.parametrize("refusal", [None, "Invalid username or password"])
def test_a_failed_sasl_exchange_goes_on_to_the_next_bootstrap_server(listen, refusal: str | None) -> None:
    bad, _ = listen(reset_after_request)
    good, peers = listen(fake_sasl_broker(refusal))
    settings = sasl(f"127.0.0.1:{bad},127.0.0.1:{good}")
    if refusal is None:
        check_broker(settings, timeout_s=2)
    else:  # the credentials are the cluster's: the broker's refusal ends the check
        with pytest.raises(KafkaAuthError, match=refusal):
            check_broker(settings, timeout_s=2)
    assert len(peers) == 1


def test_when_every_bootstrap_server_fails_sasl_each_is_named(listen) -> None:
    ports = [listen(reset_after_request)[0], listen(answer_with_size(-1))[0]]
    with pytest.raises(KafkaUnavailableError) as info:
        check_broker(sasl(",".join(f"127.0.0.1:{p}" for p in ports)), timeout_s=2)
    assert all(f"127.0.0.1:{p}" in str(info.value) for p in ports)
