"""Fixtures that run Debian's real Prometheus and Alertmanager on loopback (pytest plugin).

- ``webhook_receiver``: an http.server on 127.0.0.1 that records every Alertmanager webhook
  payload with its wall-clock arrival time;
- ``alertmanager``: ``prometheus-alertmanager`` on a free port, gossip disabled, routing every
  alert to the webhook receiver at once (group_wait 0s);
- ``start_prometheus``: a factory that starts ``prometheus`` on a free port with a generated
  config scraping the given targets every second, with the given rule files, sending alerts to
  the Alertmanager; each server has its own temporary storage and is stopped by the test.

The fixtures are function-scoped; the ``run_*`` context managers behind them serve wider
scopes (the end-to-end test shares one stack across its module).

Binaries come from ``make services-up`` (deploy/prometheus/prometheus.mk); without them the
tests that need them are skipped with that hint.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pytest
import yaml

PROMETHEUS_BIN = os.environ.get("FORESHOCK_PROMETHEUS_BIN", "prometheus")
ALERTMANAGER_BIN = os.environ.get("FORESHOCK_ALERTMANAGER_BIN", "prometheus-alertmanager")
PROMTOOL_BIN = os.environ.get("FORESHOCK_PROMTOOL_BIN", "promtool")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(store: Any, top_k: int = 16) -> Iterator[int]:
    """The exporter serving ``store`` (a ``FindingStore``) on 127.0.0.1 at a free port, which is
    yielded; stopped on the way out."""
    from foreshock.exporters.prometheus import serve, stop

    port = free_port()
    server = serve(store, host="127.0.0.1", port=port, top_k=top_k)
    try:
        yield port
    finally:
        stop(server)


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (run `make services-up`, which installs Debian's prometheus packages)")
    return path


def http_get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.2, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except (OSError, urllib.error.URLError, ValueError) as exc:  # server not up yet
            last_error = exc
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))


def _wait_ready(proc: "_Process", url: str, what: str) -> None:
    def ready() -> bool:
        proc.check_alive()
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)

    wait_until(ready, timeout=30, what=f"{what} /-/ready")


class _Process:
    """A server subprocess whose output goes to a log file, stopped with SIGTERM then SIGKILL."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            pytest.fail(f"{self.proc.args[0]} exited with {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()


# ---- webhook receiver ----------------------------------------------------------------------


@dataclass
class ReceivedAlert:
    received_at: float  # wall clock (time.time()) when the webhook call arrived
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]


@dataclass
class WebhookReceiver:
    url: str
    payloads: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[ReceivedAlert] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def firing(self, alertname: str) -> list[ReceivedAlert]:
        with self.lock:
            return [a for a in self.alerts if a.status == "firing" and a.labels.get("alertname") == alertname]


@contextmanager
def run_webhook_receiver() -> Iterator[WebhookReceiver]:
    port = free_port()
    receiver = WebhookReceiver(url=f"http://127.0.0.1:{port}/alerts")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            now = time.time()
            try:
                payload = json.loads(body)
            except ValueError:
                self.send_response(400)
                self.end_headers()
                return
            with receiver.lock:
                receiver.payloads.append(payload)
                for a in payload.get("alerts", []):
                    receiver.alerts.append(ReceivedAlert(now, a.get("status", ""), a.get("labels", {}),
                                                         a.get("annotations", {})))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="webhook-receiver",
                              daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    with run_webhook_receiver() as receiver:
        yield receiver


# ---- Alertmanager ----------------------------------------------------------------------------


@dataclass
class Alertmanager:
    url: str
    address: str  # host:port, for Prometheus' alerting config

    def alerts(self) -> list[dict[str, Any]]:
        return http_get_json(f"{self.url}/api/v2/alerts")  # type: ignore[no-any-return]


@contextmanager
def run_alertmanager(workdir: Path, receiver: WebhookReceiver) -> Iterator[Alertmanager]:
    """Alertmanager on a free loopback port, gossip off, every alert to ``receiver`` at once."""
    binary = require_binary(ALERTMANAGER_BIN)
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "route": {"receiver": "test", "group_by": ["alertname"], "group_wait": "0s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "test", "webhook_configs": [{"url": receiver.url, "send_resolved": True}]}],
    }
    (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config))
    proc = _Process([
        binary,
        f"--config.file={workdir / 'alertmanager.yml'}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",  # no gossip: a single instance on loopback
        "--log.level=warn",
    ], workdir / "alertmanager.log")
    am = Alertmanager(url=f"http://127.0.0.1:{port}", address=f"127.0.0.1:{port}")
    try:
        _wait_ready(proc, am.url, "alertmanager")
        yield am
    finally:
        proc.stop()


@pytest.fixture
def alertmanager(tmp_path: Path, webhook_receiver: WebhookReceiver) -> Iterator[Alertmanager]:
    with run_alertmanager(tmp_path / "alertmanager", webhook_receiver) as am:
        yield am


# ---- Prometheus -----------------------------------------------------------------------------


@dataclass
class Prometheus:
    url: str
    config_path: Path
    _proc: _Process

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = repr(at)
        data = http_get_json(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}")
        if data.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {data}")
        return data["data"]["result"]  # type: ignore[no-any-return]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": repr(start), "end": repr(end), "step": repr(step)}
        data = http_get_json(f"{self.url}/api/v1/query_range?{urllib.parse.urlencode(params)}")
        if data.get("status") != "success":
            raise AssertionError(f"query_range {expr!r} failed: {data}")
        return data["data"]["result"]  # type: ignore[no-any-return]

    def alerts(self) -> list[dict[str, Any]]:
        return http_get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"]  # type: ignore[no-any-return]

    def rule_groups(self) -> list[dict[str, Any]]:
        return http_get_json(f"{self.url}/api/v1/rules")["data"]["groups"]  # type: ignore[no-any-return]

    def targets_up(self) -> list[dict[str, Any]]:
        targets = http_get_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"]
        return [t for t in targets if t["health"] == "up"]

    def check_alive(self) -> None:
        self._proc.check_alive()


@contextmanager
def run_prometheus(workdir: Path, scrape: dict[str, Sequence[str]], rule_files: Sequence[Path] = (),
                   alertmanager: Alertmanager | None = None, interval: str = "1s") -> Iterator[Prometheus]:
    """Prometheus on a free loopback port scraping ``scrape`` ({job: [host:port]}) every
    ``interval``, evaluating ``rule_files`` as often, alerting ``alertmanager``."""
    binary = require_binary(PROMETHEUS_BIN)
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}
                           for job, targets in scrape.items()],
    }
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.address]}]}]}
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = _Process([
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        # a fresh alert goes out at once; the resend delay only spaces out repeats
        "--rules.alert.resend-delay=1s",
        "--log.level=warn",
    ], workdir / "prometheus.log")
    prom = Prometheus(url=f"http://127.0.0.1:{port}", config_path=config_path, _proc=proc)
    try:
        _wait_ready(proc, prom.url, "prometheus")
        yield prom
    finally:
        proc.stop()


StartPrometheus = Callable[..., Prometheus]


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[StartPrometheus]:
    """Factory: ``start_prometheus(scrape={"foreshock": ["127.0.0.1:PORT"]}, rule_files=[...],
    alertmanager=am)`` -> a running :class:`Prometheus`, stopped after the test."""
    with ExitStack() as stack:
        count = iter(range(1000))

        def start(scrape: dict[str, Sequence[str]], rule_files: Sequence[Path] = (),
                  alertmanager: Alertmanager | None = None, interval: str = "1s") -> Prometheus:
            workdir = tmp_path / f"prometheus-{next(count)}"
            return stack.enter_context(run_prometheus(workdir, scrape, rule_files, alertmanager, interval))

        yield start
