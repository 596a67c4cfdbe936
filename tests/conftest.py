"""Shared test fixtures. Real recorded data is read by path from ../shared/data, never copied."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
