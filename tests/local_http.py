"""A local HTTP(S) server for tests that stand in for a real one (a dcgm-exporter, a BMC): it
binds 127.0.0.1 on a free port, serves from a thread, and answers every GET with ``respond``."""

from __future__ import annotations

import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Response = tuple[int, bytes, str]  # status, body, Content-Type


class LocalHttpServer:
    """``respond(request)`` gets the request handler (``.path``, ``.headers``) and returns the
    response; ``tls`` wraps the socket for HTTPS. ``url`` is the base URL; ``close()`` stops it."""

    def __init__(self, respond: Callable[[BaseHTTPRequestHandler], Response],
                 tls: ssl.SSLContext | None = None) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                status, body, content_type = respond(self)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


class ScrapeServer(LocalHttpServer):
    """Serves ``pages`` one per request, in order, then the last one again (a dcgm-exporter)."""

    def __init__(self, pages: list[str]) -> None:
        self.pages = pages
        self.served = 0
        lock = threading.Lock()

        def respond(request: Any) -> tuple[int, bytes, str]:
            with lock:
                body = self.pages[min(self.served, len(self.pages) - 1)].encode()
                self.served += 1
            return 200, body, "text/plain; version=0.0.4"

        super().__init__(respond)
        self.url += "/metrics"


class RawListener:
    """Accepts connections on 127.0.0.1 (a free port, ``port``) from a thread of its own and hands
    each to ``serve(conn)`` on another, for stand-ins that must write their answer byte by byte
    (drip it, cut it short, relay it), which http.server cannot. A subclass sets what ``serve``
    reads before calling ``__init__`` (it starts accepting at once). ``stop`` is set by ``close()``,
    which then waits for the threads (a ``serve`` checks ``stop`` between its sends)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            thread = threading.Thread(target=self.serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def close(self) -> None:
        self.stop.set()
        self._threads[0].join(5)  # accepts no more: the list below is whole
        for thread in self._threads[1:]:
            thread.join(10)
        self._listener.close()
