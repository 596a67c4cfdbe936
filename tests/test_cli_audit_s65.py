"""Audit s65 (alerts end to end): a SIGTERM that stopped `demo --hold` mid-run was followed by the
hold, /metrics served for the rest of it: the command a signal stopped kept running."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_signal_that_stops_the_run_skips_the_hold() -> None:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", "from foreshock.cli.main import cli; cli()", "demo",
                             "--gpus", "8", "--duration", "600", "--speed", "1", "--hold", "600",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240  # (a cold Numba cache compiles first)
        while True:  # the run is under way once /metrics answers
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()  # type: ignore[union-attr]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=300)  # not the 600-s hold (a first frame may compile first)
    finally:
        proc.kill()
    text = err.decode()
    assert proc.returncode == 0, text
    assert "stopped by SIGTERM" in text
    assert "serving /metrics" not in text
