"""The XID counters carry their created timestamps, which the XID alerts and the fleet board's
"New XIDs by severity (1h)" read to tell a counter born in their window (whose first XID
``increase`` cannot see) from an old one Prometheus did not scrape a window ago (it had just
started, or the target was down: every GPU that ever had an XID paged "New XID" again). The
rules themselves are checked by the promtool cases in deploy/prometheus/tests."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from foreshock.exporters.prometheus import ForeshockCollector
from foreshock.exporters.store import FindingStore
from foreshock.frames import Frame
from foreshock.topology import Topology

GPU4 = {"cluster": "test", "rack": "rack0", "node": "node0", "gpu": "4"}


def _xids(store: FindingStore, topology: Topology, ts: float, xid: np.ndarray) -> None:
    n = topology.size("gpu")
    store.observe_frame(Frame("gpu", np.full(n, ts), np.arange(n), {"gpu_temp": np.full(n, 50.0),
                                                                    "xid_last": xid.copy()}))


def test_each_xid_counter_is_served_with_when_it_was_first_served(small_topology: Topology) -> None:
    store = FindingStore(small_topology)  # on telemetry time: the created timestamps are wall time all the same
    wall = [1_800_000_000.0]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ForeshockCollector(store, wall_clock=lambda: wall[0]))
    xid = np.zeros(small_topology.size("gpu"))
    xid[2] = 79  # latched from before foreshock started: never counted, no counter
    _xids(store, small_topology, 1.0, xid)
    xid[4] = 48
    _xids(store, small_topology, 2.0, xid)
    created = "foreshock_xid_events_created"
    assert registry.get_sample_value(created, {**GPU4, "xid": "48", "severity": "critical"}) == wall[0]
    assert registry.get_sample_value(created, {**GPU4, "gpu": "2", "xid": "79", "severity": "critical"}) is None
    first = wall[0]
    # an hour later (Prometheus may have restarted meanwhile: the exporter still knows the counter's
    # age), a second XID 48 and a first XID 79 on the same GPU
    wall[0] += 3600.0
    xid[4] = 79
    _xids(store, small_topology, 3.0, xid)
    xid[4] = 48
    _xids(store, small_topology, 4.0, xid)
    assert registry.get_sample_value("foreshock_xid_events_total", {**GPU4, "xid": "48", "severity": "critical"}) == 2
    assert registry.get_sample_value(created, {**GPU4, "xid": "48", "severity": "critical"}) == first
    assert registry.get_sample_value(created, {**GPU4, "xid": "79", "severity": "critical"}) == wall[0]
    # in both formats Prometheus scrapes (it ingests ``_created`` as a series of its own from each)
    for text in (generate_latest(registry).decode(), generate_openmetrics(registry).decode()):
        assert f'{created}{{cluster="test",gpu="4",node="node0",rack="rack0",severity="critical",xid="48"}}' in text
