"""Shared test fixtures. Real recorded data is read by path from ../shared/data, never copied."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from local_http import LocalHttpServer

pytest_plugins = ["conftest_prom"]  # real Prometheus/Alertmanager fixtures (tests/conftest_prom.py)

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("FORESHOCK_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data folder not found at {SHARED_DATA} (set FORESHOCK_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture
def small_topology():
    """Two rows (loops), two racks, four nodes of 8 GPUs, a rail-optimised leaf per rail."""
    return make_small_topology()


def make_small_topology():
    """:func:`small_topology`'s cluster, for tests that cannot take a fixture (a hypothesis test's
    every example, a module-level constant)."""
    from foreshock.topology import Topology

    nodes = [f"node{i}" for i in range(4)]
    data = {
        "cluster": "test",
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}, {"name": "row1", "cooling_loop": "cdu1"}],
        "racks": [{"name": "rack0", "row": "row0"}, {"name": "rack1", "row": "row1"}],
        "nodes": [{"name": n, "rack": f"rack{i // 2}", "gpus": 8} for i, n in enumerate(nodes)],
        "switches": [{"name": f"leaf{r}", "tier": "leaf", "rail": r} for r in range(8)]
        + [{"name": "spine0", "tier": "spine"}],
        "links": [{"name": f"{n}/gpu{r}~leaf{r}", "a": f"{n}/gpu{r}", "b": f"leaf{r}"} for n in nodes for r in range(8)]
        + [{"name": f"leaf{r}~spine0", "a": f"leaf{r}", "b": "spine0"} for r in range(8)],
        "jobs": [{"name": "job0", "nodes": nodes[:2]}, {"name": "job1", "nodes": nodes[2:]}],
    }
    return Topology.from_dict(data)


@pytest.fixture
def empty_recording(tmp_path, small_topology):
    """A factory: an empty 12-hour recording of the small topology (one frame of ``kind`` at each
    end, sampled every ``interval`` s), for scoring hand-made findings and events against it."""
    import numpy as np

    from foreshock.frames import Frame
    from foreshock.recording import Recording, RecordingWriter

    def make(kind: str, interval: float, t0: float = 1_700_000_000.0):  # type: ignore[no-untyped-def]
        with RecordingWriter(tmp_path / "rec", small_topology, {"interval": interval}) as w:
            n = small_topology.size(kind)
            for t in (t0, t0 + 12 * 3600.0):
                w.write(Frame(kind, np.full(n, t), np.arange(n), {}))
        return Recording.open(tmp_path / "rec")

    return make


@pytest.fixture
def dcgm_exporter(shared_data: Path) -> Iterator[str]:
    """A local HTTP server on 127.0.0.1 (a free port) serving the real dcgm-exporter page at
    ``/metrics`` (404 elsewhere); yields its base URL."""
    body = (shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom").read_bytes()

    def respond(request: Any) -> tuple[int, bytes, str]:
        if request.path != "/metrics":
            return 404, b"not found", "text/plain"
        return 200, body, "text/plain; version=0.0.4; charset=utf-8"

    server = LocalHttpServer(respond)
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def a_taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another socket is listening on for the test's length."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]
