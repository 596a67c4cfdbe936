"""The exporter against review r87's findings: an XID counter's created timestamp moved forward
by two concurrent scrapes (the XID alert fired again), an ingest agent's /metrics without the GPU
boards its polled source found replaced or moved, a rack whose GPUs report no power exported as
drawing 0 W, and a scrape that ``promtool check metrics`` rejected (a metric named in hours)."""

from __future__ import annotations

import subprocess
import urllib.request
from typing import Iterator

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from conftest_prom import PROMTOOL_BIN, require_binary, serving
from foreshock.exporters.prometheus import ForeshockCollector, HealthCollector, build_registry, serve_health, stop
from foreshock.exporters.store import FindingStore
from foreshock.findings import Incident, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

XID_FAMILY = "foreshock_xid_events"


def _gpu_frame(topology: Topology, ts: float, xid: float, **columns: np.ndarray) -> Frame:
    n = topology.size("gpu")
    return Frame("gpu", np.full(n, ts), np.arange(n),
                 {"gpu_temp": np.full(n, 50.0), "xid_last": np.full(n, xid), **columns})


def _created(families: list[Metric]) -> dict[tuple[str, str], float]:
    """The XID counters' created timestamps in one scrape's families, by (node, gpu)."""
    return {(s.labels["node"], s.labels["gpu"]): s.value for f in families if f.name == XID_FAMILY
            for s in f.samples if s.name.endswith("_created")}


def test_a_slower_concurrent_scrape_does_not_make_an_xid_counter_new_again(small_topology: Topology) -> None:
    store = FindingStore(small_topology)
    store.observe_frame(_gpu_frame(small_topology, 100.0, 0.0))
    wall = [1000.0]
    collector = ForeshockCollector(store, wall_clock=lambda: wall[0])
    slow: Iterator[Metric] = collector.collect()
    first = next(slow)  # scrape A has taken its snapshot: no XID yet
    store.observe_frame(_gpu_frame(small_topology, 110.0, 79.0))  # XID 79 on every GPU
    wall[0] = 1010.0
    served = _created(list(collector.collect()))  # scrape B, started later, finishes first
    assert len(served) == small_topology.size("gpu") and set(served.values()) == {1010.0}
    wall[0] = 1011.0
    late = _created([first, *slow])  # scrape A finishes, from its snapshot without the counters
    assert late == {}
    wall[0] = 1040.0
    # the counters still at 1 are as old as when B served them: not born again at 1040
    assert _created(list(collector.collect())) == served


def test_a_counter_the_newest_snapshot_lacks_is_still_forgotten(small_topology: Topology) -> None:
    """The order of snapshots, not of scrapes ending, says which counters are gone: a GPU dropped
    from the topology (``move_to``) takes its counter with it, and its XIDs after it comes back
    count in a new one, stamped when first served again."""
    data = small_topology.to_dict()
    data["nodes"] = [n for n in data["nodes"] if n["name"] != "node3"]
    data["links"] = [link for link in data["links"] if not link["a"].startswith("node3/")]
    data["jobs"] = [{**job, "nodes": [n for n in job["nodes"] if n != "node3"]} for job in data["jobs"]]
    without = Topology.from_dict(data)
    store = FindingStore(small_topology)
    store.observe_frame(_gpu_frame(small_topology, 100.0, 0.0))
    store.observe_frame(_gpu_frame(small_topology, 110.0, 79.0))
    wall = [1000.0]
    collector = ForeshockCollector(store, wall_clock=lambda: wall[0])
    assert _created(list(collector.collect()))[("node3", "0")] == 1000.0
    store.move_to(without)
    wall[0] = 1010.0
    assert ("node3", "0") not in _created(list(collector.collect()))
    store.move_to(small_topology)
    store.observe_frame(_gpu_frame(small_topology, 120.0, 0.0))
    store.observe_frame(_gpu_frame(small_topology, 130.0, 79.0))
    wall[0] = 1020.0
    created = _created(list(collector.collect()))
    assert created[("node3", "0")] == 1020.0
    assert created[("node0", "0")] == 1000.0


def test_an_agents_metrics_count_the_boards_its_source_found_replaced_or_moved() -> None:
    """A polled source (streams/polling.py ``GpuBoards``) counts them in its agent's health; in a
    Kafka deployment only the agent's /metrics can export them, under the pipeline's names."""
    health = PipelineHealth()
    health.gpu_replaced("dcgm")
    health.gpu_moved("dcgm", 2)
    health.topology_changed("dcgm")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HealthCollector(health, lambda: "c1"))
    by_stage = {"cluster": "c1", "stage": "dcgm"}
    assert registry.get_sample_value("foreshock_gpus_replaced_total", by_stage) == 1
    assert registry.get_sample_value("foreshock_gpus_moved_total", by_stage) == 2
    assert registry.get_sample_value("foreshock_topology_changes_total", by_stage) == 1


def test_a_rack_whose_gpus_report_no_power_has_no_power_sum(small_topology: Topology) -> None:
    rack0 = small_topology.gpu_rack == 0
    power = np.where(rack0, np.nan, 600.0)
    power[np.flatnonzero(~rack0)[0]] = np.nan  # one GPU of rack1 without a reading: the sum is the others'
    store = FindingStore(small_topology)
    store.observe_frame(_gpu_frame(small_topology, 100.0, 0.0, power=power))
    registry = build_registry(store)
    watts = "foreshock_rack_gpu_power_watts"
    assert registry.get_sample_value(watts, {"cluster": "test", "rack": "rack0"}) is None
    assert registry.get_sample_value(watts, {"cluster": "test", "rack": "rack1"}) == 600.0 * (int((~rack0).sum()) - 1)
    # the rack is still exported by its temperatures
    assert registry.get_sample_value("foreshock_rack_gpu_temperature_mean_celsius",
                                      {"cluster": "test", "rack": "rack0"}) == 50.0


def _promtool_check_metrics(text: bytes) -> None:
    promtool = require_binary(PROMTOOL_BIN)
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    complaints = (result.stdout + result.stderr).decode().strip()
    assert result.returncode == 0 and not complaints, complaints


@pytest.mark.prometheus
def test_promtool_accepts_a_real_scrape_of_the_exporter(small_topology: Topology) -> None:
    """Every family the pipeline's /metrics serves, filled (telemetry, an XID, findings, an
    incident touching a job), as Prometheus fetches it."""
    n = small_topology.size("gpu")
    store = FindingStore(small_topology)
    columns = {"power": np.full(n, 600.0), "power_limit": np.full(n, 700.0), "throttle_reasons": np.full(n, 4.0)}
    store.observe_frame(_gpu_frame(small_topology, 1000.0, 0.0, **columns))
    store.observe_frame(_gpu_frame(small_topology, 1010.0, 79.0, **columns))
    store.observe_findings([
        Prediction(1010.0, "gpu", 3, "thermal_throttle", 600.0, 0.8, "thermal"),
        Incident(1010.0, "inc-1", "growing", "cooling_loop", "cdu1", "flow lost",
                 members=("rack1", "node2/gpu0"), jobs=(("job1", 1.25),)),
    ])
    store.health.gpu_replaced("guard")
    with serving(store) as port:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    _promtool_check_metrics(text)
    assert b"foreshock_job_gpus_at_risk{" in text and b"foreshock_xid_events_total{" in text


@pytest.mark.prometheus
def test_promtool_accepts_a_real_scrape_of_an_agent() -> None:
    health = PipelineHealth()
    health.processed("gpu", 8)
    health.problem("dcgm", "NaN", 2)
    health.gpu_moved("dcgm")
    server = serve_health(health, lambda: "c1", port=0)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server[0].server_port}/metrics", timeout=10).read()
    finally:
        stop(server)
    _promtool_check_metrics(text)
