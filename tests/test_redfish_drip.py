"""A BMC request is bounded in wall time from connecting to its body's last byte, headers
included, and a poll leaves no thread reading a BMC once it has returned: against a raw BMC on
127.0.0.1 that drips its status line and headers a byte at a time (each byte well inside the
client's per-read timeout), or answers each request whole but late."""

from __future__ import annotations

import base64
import json
import logging
import select
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from foreshock.health import PipelineHealth
from foreshock.streams.redfish import TOO_SLOW, BmcClient, RedfishError, RedfishSource, tls_context

from local_http import RawListener

CERTS = Path(__file__).parent / "data" / "redfish"
USER, PASSWORD = "admin", "dr1p-s3cret"
TOKEN = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: " + b"a" * 4000 + b"\r\n\r\n"


def whole(document: Any) -> bytes:
    body = json.dumps(document).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


class RawBmc(RawListener):
    """A BMC written byte by byte on 127.0.0.1. ``routes`` maps a path to ``(answer, delay_s,
    every_s)``: the answer's bytes are sent after ``delay_s``, whole, or, with ``every_s``, a byte
    every ``every_s`` seconds. A connection the client closes is seen at once (``open``: those
    the client still holds; ``seen``: the paths asked, in order)."""

    def __init__(self, routes: dict[str, tuple[bytes, float, float | None]], tls: bool = False) -> None:
        self.routes = routes
        self.seen: list[str] = []
        self.open = 0
        self._lock = threading.Lock()
        self._tls = None
        if tls:
            self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._tls.load_cert_chain(CERTS / "bmc-cert.pem", CERTS / "bmc-key.pem")
        super().__init__()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    def serve(self, conn: socket.socket) -> None:
        with self._lock:
            self.open += 1
        try:
            if self._tls is not None:
                conn.settimeout(2.0)
                conn = self._tls.wrap_socket(conn, server_side=True)
            request = b""
            while b"\r\n\r\n" not in request:
                got = conn.recv(4096)
                if not got:
                    return
                request += got
            path = request.split(b" ", 2)[1].decode()
            with self._lock:
                self.seen.append(path)
            answer, delay_s, every_s = self.routes[path]
            if self._client_gone(conn, delay_s):
                return
            if every_s is None:
                conn.sendall(answer)
                self._client_gone(conn, 2.0)  # until the client has read it and closed
                return
            for i in range(len(answer)):
                conn.sendall(answer[i:i + 1])
                if self._client_gone(conn, every_s):
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self.open -= 1
            conn.close()

    def _client_gone(self, conn: socket.socket, wait_s: float) -> bool:
        """Waits ``wait_s`` (less if the test stops the BMC); True if the client closed meanwhile."""
        end = time.monotonic() + wait_s
        while not self.stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            readable, _, _ = select.select([conn], [], [], min(left, 0.02))
            if readable and not conn.recv(4096):  # (a TLS socket: the client's close_notify, or EOF)
                return True
        return True



@pytest.fixture
def bmcs():
    started: list[RawBmc] = []

    def start(routes: dict[str, tuple[bytes, float, float | None]], tls: bool = False) -> RawBmc:
        started.append(RawBmc(routes, tls))
        return started[-1]

    yield start
    for bmc in started:
        bmc.close()


def get_in_a_thread(client: BmcClient, path: str, give_it_s: float) -> tuple[BaseException | None, float]:
    """``client.get(path)``'s exception and how long it took; a get still running after
    ``give_it_s`` fails the test (the BMC, stopped by the fixture, then lets it go)."""
    outcome: list[BaseException | None] = []
    began = time.monotonic()

    def run() -> None:
        try:
            client.get(path)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(give_it_s)
    assert not thread.is_alive(), f"the request was still reading the BMC after {give_it_s} s"
    return outcome[0], time.monotonic() - began


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_bmc_dripping_its_headers_is_given_up_at_the_timeout(bmcs, tls: bool):
    """A byte of the status line and headers every 0.05 s: each read is inside the 1 s timeout,
    and http.client reads headers line by line, so the request ran for as long as the BMC dripped
    (its 4 kB head: 200 s)."""
    bmc = bmcs({"/redfish/v1/Chassis": (HEAD, 0.0, 0.05)}, tls=tls)
    context = tls_context(str(CERTS / "bmc-cert.pem")) if tls else None
    client = BmcClient(bmc.url, USER, PASSWORD, timeout=1.0, context=context)
    error, took = get_in_a_thread(client, "/redfish/v1/Chassis", give_it_s=5.0)
    assert isinstance(error, RedfishError) and error.reason == TOO_SLOW, error
    assert 0.95 < took < 2.5, took  # (the bound leaves a loaded machine room: the drip would take 200 s)
    assert "the answer not whole" in error.detail and PASSWORD not in str(error) and TOKEN not in str(error)


def test_a_redirect_within_the_bmc_keeps_the_requests_deadline(bmcs):
    """A chain of redirects is one request's time: the dripping answer at the end of a redirect is
    given up when the first request's timeout is up, not one timeout after the redirect."""
    moved = b"HTTP/1.1 302 Found\r\nLocation: /redfish/v1/Chassis/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    bmc = bmcs({"/redfish/v1/Chassis": (moved, 1.4, None), "/redfish/v1/Chassis/": (HEAD, 0.0, 0.05)})
    client = BmcClient(bmc.url, USER, PASSWORD, timeout=2.0)
    error, took = get_in_a_thread(client, "/redfish/v1/Chassis", give_it_s=6.0)
    assert isinstance(error, RedfishError) and error.reason == TOO_SLOW, error
    assert bmc.seen == ["/redfish/v1/Chassis", "/redfish/v1/Chassis/"]
    # 1.4 s to the redirect, then what is left of the 2 s: 2 s in all, where a fresh timeout for
    # the redirect took at least 3.4 s (the timings wide, for a loaded machine)
    assert took < 2.9, took


def late_tree(late_s: float) -> dict[str, tuple[bytes, float, float | None]]:
    """A node's Redfish tree, each answer whole but ``late_s`` late."""
    return {
        "/redfish/v1/Chassis": (whole({"Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]}), late_s, None),
        "/redfish/v1/Chassis/1": (whole({"Thermal": {"@odata.id": "/redfish/v1/Chassis/1/Thermal"},
                                         "Power": {"@odata.id": "/redfish/v1/Chassis/1/Power"}}), late_s, None),
        "/redfish/v1/Chassis/1/Thermal": (whole({"Fans": [{"Reading": 50, "ReadingUnits": "Percent"}]}), late_s, None),
        "/redfish/v1/Chassis/1/Power": (whole({"PowerControl": [{"PowerConsumedWatts": 5000}]}), late_s, None),
    }


@pytest.mark.parametrize("drip", [False, True], ids=["each-answer-late", "headers-dripped"])
def test_no_read_is_left_holding_a_bmc_once_the_poll_returns(bmcs, caplog, drip: bool):
    """The poll waits 1.875 s (1.25 x the 1.5 s timeout: the good BMC's four requests room on a
    loaded machine). A node answering each of its four requests 0.8 s late (each well inside the
    timeout) needs 3.2 s, its last request asked 2.4 s in at the earliest; one dripping its
    headers, its timeout. Either way, when the poll returns its read has ended and its BMC
    connection is closed, and it asks nothing more afterwards: the read went on in a thread of
    its own, asking the BMC its next resources (all four by 2.4 s), after the poll had given up
    on it."""
    tree = late_tree(0.8)
    if drip:
        tree["/redfish/v1/Chassis"] = (HEAD, 0.0, 0.05)
    slow = bmcs(tree)
    good = bmcs(late_tree(0.0))
    health = PipelineHealth()
    src = RedfishSource({"slow": slow.url, "good": good.url}, interval=0.05, timeout=1.5, user=USER,
                        password=PASSWORD, health=health)
    with caplog.at_level(logging.DEBUG):
        batch = src.read()
        # (the BMC's thread sees the closed connection within a few ms, later on a loaded machine,
        # each request it was asked in ``seen`` by then; a read left running held it open, the
        # drip for 200 s)
        deadline = time.monotonic() + 5
        while slow.open and time.monotonic() < deadline:
            time.sleep(0.005)
        open_after_the_poll, asked = slow.open, list(slow.seen)
        time.sleep(1.0)  # long enough for a read left running to ask its next resource (0.8 s apart)
        asked_later = list(slow.seen)
    src.stop()
    assert batch.entity_names() == ["good"]
    assert open_after_the_poll == 0
    assert asked_later == asked
    # its last resource never asked: the three answers before it take 2.4 s, past the poll's
    # 1.875 s (a read left running asked it 2.4 s in, while this test watched)
    assert "/redfish/v1/Chassis/1/Power" not in asked_later, asked_later
    assert health.problems == {("redfish", TOO_SLOW): 1}
    assert PASSWORD not in caplog.text and TOKEN not in caplog.text


def test_a_read_that_cannot_be_cut_short_is_not_asked_again_even_after_stop():
    """A read that does not end by its poll's deadline (here a fetch that ignores it) stays the
    only one in flight for its BMC: a poll after :meth:`stop` does not start a second one."""
    health = PipelineHealth()
    src = RedfishSource({"stuck": "http://127.0.0.1:9"}, interval=0.05, timeout=0.1, health=health)
    release = threading.Event()
    asked: list[str] = []

    def hang(path: str) -> Any:
        asked.append(path)
        release.wait(5)
        raise RedfishError("BMC unreachable", path)

    src.clients["stuck"].get = hang  # type: ignore[method-assign]
    try:
        assert not len(src.read())
        src.stop()
        assert not len(src.read())
        assert asked == ["/redfish/v1/Chassis"]
        assert health.problems == {("redfish", TOO_SLOW): 2}
    finally:
        release.set()
        src.stop()

