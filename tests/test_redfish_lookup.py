"""A BMC request ends by its deadline from its first step: resolving the BMC's host name (which
``getaddrinfo`` does with no timeout at all) and a proxy's answer to CONNECT are bound by it as
its reads are. Against BMCs and a proxy on 127.0.0.1, the host names resolved by a stand-in
resolver (``socket.getaddrinfo`` replaced) that hangs, is slow, fails late or moves a name."""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from typing import Any, Iterator

import pytest

from foreshock.health import PipelineHealth
from foreshock.streams import redfish
from foreshock.streams.redfish import TOO_SLOW, BmcClient, RedfishError, RedfishSource, tls_context
from conftest_prom import wait_until
from local_http import RawListener
from test_redfish_drip import CERTS, PASSWORD, USER, RawBmc, get_in_a_thread, late_tree

# How long these tests let a lookup's addresses be used (the module's default is 30 s): long enough
# for a poll's requests (or two gets) to share a lookup on a loaded machine, short enough for the
# test of a moved name to wait it out.
KEPT_S = 2.0


class Resolver:
    """Stands in for the system resolver for the names in ``names`` (each: the port on 127.0.0.1
    it resolves to, and how it answers), the real one answering any other name. ``asked``
    counts the lookups of each name, ``running`` those not yet answered."""

    def __init__(self) -> None:
        self.real = socket.getaddrinfo
        self.names: dict[str, dict[str, Any]] = {}
        self.asked: dict[str, int] = {}
        self.running = 0
        self.release = threading.Event()  # lets every hung lookup go (at teardown, or when a test says)
        self._lock = threading.Lock()

    def name(self, host: str, port: int, hang: bool = False, delay_s: float = 0.0, fail: bool = False) -> None:
        self.names[host] = {"port": port, "hang": hang, "delay_s": delay_s, "fail": fail}

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        how = self.names.get(host)
        if how is None:
            return self.real(host, port, *args, **kwargs)
        with self._lock:
            self.asked[host] = self.asked.get(host, 0) + 1
            self.running += 1
        try:
            if how["hang"]:
                self.release.wait(30)
            time.sleep(how["delay_s"])
            if how["fail"]:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", how["port"]))]
        finally:
            with self._lock:
                self.running -= 1


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Resolver]:
    fake = Resolver()
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    if hasattr(redfish, "HostLookups"):  # a fresh cache per test, keeping addresses KEPT_S
        monkeypatch.setattr(redfish, "HOST_LOOKUPS", redfish.HostLookups(kept_s=KEPT_S))
    yield fake
    fake.release.set()


@pytest.fixture
def bmcs() -> Iterator[Any]:
    started: list[RawBmc] = []

    def start(late_s: float = 0.0, tls: bool = False) -> RawBmc:
        started.append(RawBmc(late_tree(late_s), tls))
        return started[-1]

    yield start
    for bmc in started:
        bmc.close()


def port_of(bmc: RawBmc) -> int:
    return int(bmc.url.rsplit(":", 1)[1])


def lookup_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("redfish-lookup")]


def test_a_hung_resolver_is_given_up_at_the_requests_deadline(resolver, bmcs):
    """A name whose lookup never comes back: the request ends at its 1 s timeout, counted as
    the BMC too slow and saying it was the name's lookup (it waited for the resolver as long as
    the resolver hung)."""
    bmc = bmcs()
    resolver.name("bmc-hung.test", port_of(bmc), hang=True)
    client = BmcClient(f"http://bmc-hung.test:{port_of(bmc)}", USER, PASSWORD, timeout=1.0)
    error, took = get_in_a_thread(client, "/redfish/v1/Chassis", give_it_s=5.0)
    assert isinstance(error, RedfishError) and error.reason == TOO_SLOW, error
    assert 0.95 < took < 2.5, took  # (the bound leaves a loaded machine room: the hang is endless)
    assert "bmc-hung.test" in error.detail and "not resolved" in error.detail
    assert bmc.seen == []


@pytest.mark.slow
def test_polls_of_a_hung_resolver_end_by_their_deadline_with_one_lookup_in_flight(resolver, bmcs, caplog):
    """Twelve polls while one node's name hangs in the resolver: each poll returns by its
    requests' deadline (the 1 s timeout) with no read of the node left in flight, the other
    node read every time; the node counted too slow once per poll (not again when the lookup
    finally returns) and logged once; the resolver asked once in all, one thread waiting on it
    (not one per poll). When the resolver answers, the next poll reads the node with that
    answer, asking the resolver nothing more."""
    hung, good = bmcs(), bmcs()
    resolver.name("bmc-hung.test", port_of(hung), hang=True)
    health = PipelineHealth()
    src = RedfishSource({"hung": f"http://bmc-hung.test:{port_of(hung)}", "good": good.url}, interval=0.05,
                        timeout=1.0, user=USER, password=PASSWORD, health=health)
    polls = 12
    took, in_flight, threads, rows = [], [], [], []
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(polls):
                began = time.monotonic()
                batch = src.read()
                took.append(time.monotonic() - began)
                in_flight.append(sorted(src._reads.pending))
                threads.append(len(lookup_threads()))
                rows.append(batch.entity_names())
            # by the requests' 1 s deadline, before the poll's own (1.25 s): a read left waiting
            # on the resolver held each poll that and redfish.WIND_DOWN_S more (1.5 s)
            assert max(took) < src.answer_within, took
            assert in_flight == [[]] * polls
            assert rows == [["good"]] * polls
            assert resolver.asked == {"bmc-hung.test": 1} and max(threads) == 1, (resolver.asked, threads)
            resolver.release.set()
            # (until the answer is kept, not merely returned: under load the lookup thread can
            # take a while between the resolver returning and the addresses being stored)
            deadline = time.monotonic() + 5
            while redfish.HOST_LOOKUPS.in_flight() and time.monotonic() < deadline:
                time.sleep(0.005)
            answered = src.read()
        assert answered.entity_names() == ["hung", "good"]
        assert resolver.asked == {"bmc-hung.test": 1}
        assert health.problems == {("redfish", TOO_SLOW): polls}
        assert caplog.text.count(TOO_SLOW) == 1
    finally:
        src.stop()


def test_the_lookups_in_flight_are_bounded_by_the_hosts_not_the_requests(resolver, bmcs):
    """Eight threads asking for two hung names, five rounds of requests each given up at 0.15 s:
    two lookups in all, two threads waiting on the resolver."""
    bmc = bmcs()
    hosts = ["bmc-a.test", "bmc-b.test"]
    for host in hosts:
        resolver.name(host, port_of(bmc), hang=True)
    clients = [BmcClient(f"http://{host}:{port_of(bmc)}", timeout=0.15) for host in hosts]
    errors: list[str] = []
    lock = threading.Lock()

    def ask(client: BmcClient) -> None:
        try:
            client.get("/redfish/v1/Chassis")
        except RedfishError as exc:
            with lock:
                errors.append(exc.reason)

    for _ in range(5):
        askers = [threading.Thread(target=ask, args=(clients[i % 2],)) for i in range(8)]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join(2)
    assert errors == [TOO_SLOW] * 40
    assert resolver.asked == dict.fromkeys(hosts, 1)
    assert resolver.running == 2 and len(lookup_threads()) == 2 and redfish.HOST_LOOKUPS.in_flight() == 2


def test_a_slow_resolver_is_asked_once_per_host_not_at_every_request(resolver, bmcs, monkeypatch):
    """A resolver taking 0.4 s an answer, a node's read four requests within a 1 s timeout:
    looked up at every connection, the node never made its poll's deadline (1.6 s of lookups
    past its 1.25 s); its address kept, it gives a row at every poll."""
    # (kept the module's 30 s: this test is not about their end, and its three polls may take
    # a while on a loaded machine)
    monkeypatch.setattr(redfish, "HOST_LOOKUPS", redfish.HostLookups())
    bmc = bmcs()
    resolver.name("bmc-slow.test", port_of(bmc), delay_s=0.4)
    health = PipelineHealth()
    src = RedfishSource({"slow": f"http://bmc-slow.test:{port_of(bmc)}"}, interval=0.05, timeout=1.0,
                        user=USER, password=PASSWORD, health=health)
    try:
        rows = [src.read().entity_names() for _ in range(3)]
    finally:
        src.stop()
    assert rows == [["slow"]] * 3
    assert health.problems == {}
    assert resolver.asked == {"bmc-slow.test": 1}
    assert len(bmc.seen) == 2 + 2 * 3  # discovery (Chassis, Chassis/1), then Thermal and Power each poll


def test_a_moved_host_name_is_followed_once_its_address_is_no_longer_kept(resolver, bmcs):
    """The name moves from one BMC to another while both answer (an address given to another
    board): requests go to the old one while its address is kept, to the new one after."""
    old, new = bmcs(), bmcs()
    resolver.name("bmc-moving.test", port_of(old))
    client = BmcClient("http://bmc-moving.test:443", timeout=0.5)
    client.get("/redfish/v1/Chassis")
    no_longer_kept = time.monotonic() + KEPT_S  # (its lookup's answer was kept before the get returned)
    resolver.name("bmc-moving.test", port_of(new))
    client.get("/redfish/v1/Chassis")
    assert (len(old.seen), len(new.seen)) == (2, 0)  # kept: the resolver not asked again
    time.sleep(max(0.0, no_longer_kept - time.monotonic()) + 0.05)
    client.get("/redfish/v1/Chassis")
    assert (len(old.seen), len(new.seen)) == (2, 1)
    assert resolver.asked == {"bmc-moving.test": 2}


def test_a_kept_address_that_no_longer_connects_is_looked_up_again_at_once(resolver, bmcs):
    """The old BMC gone (its port refuses), the name moved: the request that finds the kept
    address refused looks the name up again and reaches the new BMC, no failure counted."""
    old, new = bmcs(), bmcs()
    resolver.name("bmc-moving.test", port_of(old))
    client = BmcClient("http://bmc-moving.test:443", timeout=0.5)
    client.get("/redfish/v1/Chassis")
    old.close()
    resolver.name("bmc-moving.test", port_of(new))
    assert isinstance(client.get("/redfish/v1/Chassis"), dict)
    assert (len(old.seen), len(new.seen)) == (1, 1)
    assert resolver.asked == {"bmc-moving.test": 2}


def test_a_lookup_failing_after_its_request_gave_up_is_told_to_the_next_request(resolver, bmcs):
    """A name unknown, said only after 2 s (past the 1 s timeout): the first request is too
    slow, the next one counts the real reason (unreachable: the name unknown) without asking
    the resolver again, and the one after that asks it anew."""
    bmc = bmcs()
    resolver.name("bmc-unknown.test", port_of(bmc), delay_s=2.0, fail=True)
    client = BmcClient(f"http://bmc-unknown.test:{port_of(bmc)}", timeout=1.0)
    error, took = get_in_a_thread(client, "/redfish/v1/Chassis", give_it_s=5.0)
    # its timeout, not the lookup's 2 s
    assert isinstance(error, RedfishError) and error.reason == TOO_SLOW and took < 1.5, (error, took)
    # the lookup fails meanwhile, with no request waiting for it
    wait_until(lambda: not redfish.HOST_LOOKUPS.in_flight(), 5, 0.005, "the lookup to fail")
    error, took = get_in_a_thread(client, "/redfish/v1/Chassis", give_it_s=5.0)
    assert isinstance(error, RedfishError) and error.reason == "BMC unreachable", error
    # at once: asking the resolver anew waited the 1 s timeout
    assert "Name or service not known" in error.detail and took < 0.5, took
    assert resolver.asked == {"bmc-unknown.test": 1}
    error, _ = get_in_a_thread(client, "/redfish/v1/Chassis", give_it_s=5.0)
    assert isinstance(error, RedfishError) and error.reason == TOO_SLOW
    assert resolver.asked == {"bmc-unknown.test": 2}


class Proxy(RawListener):
    """An HTTP proxy on 127.0.0.1 taking one CONNECT at a time. ``answer``: ``tunnel`` (200, then
    the bytes relayed to the BMC on 127.0.0.1 at ``to_port``, whatever host CONNECT named),
    ``drip`` (its 200 and a long header, a byte every 0.05 s) or ``refuse`` (407)."""

    def __init__(self, answer: str, to_port: int = 0) -> None:
        self.answer, self.to_port = answer, to_port
        self.connects: list[bytes] = []
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    def serve(self, conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                got = conn.recv(4096)
                if not got:
                    return
                request += got
            self.connects.append(request.split(b"\r\n", 1)[0])
            if self.answer == "refuse":
                conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
            elif self.answer == "drip":
                answer = b"HTTP/1.1 200 Connection established\r\nX-Slow: " + b"a" * 4000 + b"\r\n\r\n"
                for i in range(len(answer)):
                    if self.stop.wait(0.05):
                        return
                    conn.sendall(answer[i:i + 1])
            else:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                with socket.create_connection(("127.0.0.1", self.to_port)) as bmc:
                    self._relay(conn, bmc)

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        while not self.stop.is_set():
            ready, _, _ = select.select([a, b], [], [], 0.05)
            for side in ready:
                data = side.recv(65536)
                if not data:
                    return
                (b if side is a else a).sendall(data)



@pytest.fixture
def through_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Starts a :class:`Proxy` and names it in the environment, as a site's ``https_proxy``."""
    for name in ("no_proxy", "NO_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    started: list[Proxy] = []

    def start(answer: str, to_port: int = 0) -> Proxy:
        started.append(Proxy(answer, to_port))
        monkeypatch.setenv("https_proxy", started[-1].url)
        return started[-1]

    yield start
    for proxy in started:
        proxy.close()


def test_a_proxy_dripping_its_answer_to_connect_is_given_up_at_the_timeout(through_proxy):
    """The proxy answers CONNECT a byte every 0.05 s (each read well inside the 1 s timeout):
    http.client read that answer on the bare socket, line by line, for as long as it dripped
    (its 4 kB: 200 s)."""
    proxy = through_proxy("drip")
    client = BmcClient("https://localhost:8443", USER, PASSWORD, timeout=1.0,
                       context=tls_context(str(CERTS / "bmc-cert.pem")))
    error, took = get_in_a_thread(client, "/redfish/v1/Chassis", give_it_s=5.0)
    assert proxy.connects == [b"CONNECT localhost:8443 HTTP/1.0"]
    assert isinstance(error, RedfishError) and error.reason == TOO_SLOW, error
    assert 0.95 < took < 2.5, took  # (the bound leaves a loaded machine room)
    assert "CONNECT" in error.detail and PASSWORD not in str(error)


def test_an_https_bmc_is_read_through_the_environments_proxy(through_proxy, bmcs):
    """The tunnel a proxy opens is the BMC's: TLS verified end to end, the answer read whole; a
    proxy refusing CONNECT makes the BMC unreachable, saying so."""
    bmc = bmcs(tls=True)
    proxy = through_proxy("tunnel", to_port=port_of(bmc))
    client = BmcClient(f"https://localhost:{port_of(bmc)}", USER, PASSWORD, timeout=2.0,
                       context=tls_context(str(CERTS / "bmc-cert.pem")))
    assert client.get("/redfish/v1/Chassis") == {"Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]}
    assert proxy.connects == [f"CONNECT localhost:{port_of(bmc)} HTTP/1.0".encode()]
    through_proxy("refuse")
    refused = BmcClient(f"https://localhost:{port_of(bmc)}", USER, PASSWORD, timeout=2.0,
                        context=tls_context(str(CERTS / "bmc-cert.pem")))
    with pytest.raises(RedfishError) as caught:
        refused.get("/redfish/v1/Chassis")
    assert caught.value.reason == "BMC unreachable" and "407" in caught.value.detail
