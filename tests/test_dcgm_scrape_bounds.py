"""A dcgm scrape is bounded in wall time and in size, and a page that gives no GPU is counted:
against raw exporters on 127.0.0.1 that drip their answer a byte at a time (each byte well inside
urllib's per-read timeout), stream a body without end, or answer 200 with nothing to read."""

from __future__ import annotations

import socket
import threading
from typing import Callable

import pytest

from foreshock.health import PipelineHealth
from foreshock.streams.dcgm import DcgmScrapeSource

from local_http import RawListener, ScrapeServer

PAGE = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n1"} 25\nDCGM_FI_DEV_POWER_USAGE{gpu="0",Hostname="n1"} 70\n'
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"


class RawExporter(RawListener):
    """Answers every connection on 127.0.0.1 with ``answer(conn, stop)``; ``close()`` stops it and
    the answers in progress (each checks ``stop`` between its sends)."""

    def __init__(self, answer: Callable[[socket.socket, threading.Event], None]) -> None:
        self.answer = answer
        self.sent = 0  # bytes sent by the answers, all told
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}/metrics"

    def serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                self.answer(conn, self.stop)
            except OSError:  # the client gave up and closed: what a bounded scrape does
                pass

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)


def _drip(what: str) -> Callable[[RawExporter], Callable[[socket.socket, threading.Event], None]]:
    """An answer whose status line and headers (``head``) or body (``body``) come a byte every 50 ms."""
    whole = HEAD + b"Content-Length: %d\r\n\r\n" % len(PAGE * 100) + PAGE * 100

    def answer_of(exporter: RawExporter) -> Callable[[socket.socket, threading.Event], None]:
        def answer(conn: socket.socket, stop: threading.Event) -> None:
            at = 0 if what == "head" else whole.index(b"\r\n\r\n") + 4
            exporter.send(conn, whole[:at])
            while at < len(whole) and not stop.wait(0.05):
                exporter.send(conn, whole[at:at + 1])
                at += 1
        return answer
    return answer_of


@pytest.mark.parametrize("what", ["head", "body"])
def test_a_page_dripped_a_byte_at_a_time_is_given_up_at_the_timeout(what: str) -> None:
    """urllib's timeout bounds each socket read: a page dripped a byte every 50 ms (10 minutes for
    this one) held the poll, and ``watch`` with it, until its last byte."""
    exporter = RawExporter(lambda conn, stop: None)
    exporter.answer = _drip(what)(exporter)
    health = PipelineHealth()
    source = DcgmScrapeSource(exporter.url, interval=1.0, health=health, timeout=1.0)
    polled: list[object] = []
    poll = threading.Thread(target=lambda: polled.append(source.poll()), daemon=True)
    try:
        poll.start()
        poll.join(60)  # ~1 s; the page takes 10 minutes to drip
        assert not poll.is_alive(), "the scrape was not given up at its timeout"
    finally:
        exporter.close()
        poll.join(10)
    assert polled == [[]]
    assert exporter.sent < len(HEAD) + len(PAGE) * 100  # given up with the page half sent
    assert health.problems == {("dcgm", "scrape too slow"): 1}
    assert source._out  # no page: an outage, as a failed scrape


@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "content-length"])
def test_a_page_past_the_cap_is_dropped_and_counted(declared: bool) -> None:
    """A body without end (a wrong URL serving a stream) was held in memory as it grew (400 MiB
    read took 1.5 GB), and counted nowhere; one whose length is declared too big is not read."""
    body = b"# a line of a page that goes on and on\n" * 200_000  # 7.8 MB

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        exporter.send(conn, HEAD + (b"Content-Length: %d\r\n" % len(body) if declared else b"") + b"\r\n")
        for at in range(0, len(body), 1 << 16):
            if stop.is_set():
                return
            exporter.send(conn, body[at:at + (1 << 16)])

    exporter = RawExporter(answer)
    health = PipelineHealth()
    source = DcgmScrapeSource(exporter.url, interval=1.0, health=health, timeout=60.0)
    source.max_page_bytes = 1 << 20
    try:
        assert source.poll() == []
    finally:
        exporter.close()
    assert health.problems == {("dcgm", "page too large"): 1}
    assert source._out


def test_a_page_that_gives_no_gpu_row_is_counted_at_every_poll() -> None:
    """An exporter answering 200 with an empty page, or comments only (DCGM gone under it, a
    federation that lost its targets), read nothing and counted nothing: as quiet as a healthy one."""
    server = ScrapeServer([PAGE.decode(), "", "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n"
                                             "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"])
    health = PipelineHealth()
    source = DcgmScrapeSource(server.url, interval=1.0, health=health)
    try:
        read = [sum(len(frame) for frame in source.poll()) for _ in range(3)]
    finally:
        server.close()
    assert read == [1, 0, 0]
    assert health.problems == {("dcgm", "no GPU rows in page"): 2}
    assert source._out
