"""Clocks and slow polls over a long run: a clock stepped back, polls longer than their interval,
the estimates of entities that left."""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.exporters.prometheus import build_registry
from foreshock.exporters.store import FindingStore
from foreshock.frames import Frame
from foreshock.topology import Topology


def test_skipped_polls_are_exported_by_stage(small_topology: Topology) -> None:
    """The pipeline's /metrics and an agent's own both carry the polls its sources skipped."""
    from foreshock.exporters.prometheus import HealthCollector
    from prometheus_client import CollectorRegistry

    store = FindingStore(small_topology)
    store.health.skipped_polls("dcgm", 3, detail="a poll took 40 s")
    assert build_registry(store).get_sample_value("foreshock_polls_skipped_total",
                                                  {"cluster": "test", "stage": "dcgm"}) == 3.0
    agent = CollectorRegistry()
    agent.register(HealthCollector(store.health, lambda: "test"))
    assert agent.get_sample_value("foreshock_polls_skipped_total", {"cluster": "test", "stage": "dcgm"}) == 3.0


def test_the_estimates_of_gpus_that_left_drop_out_of_their_racks_aggregates(small_topology: Topology) -> None:
    """A node pulled for repair with a degraded GPU (thermal resistance 0.5 °C/W, twice its
    rack's) stops reporting; the detectors keep its last fit. Its latest values went stale after
    two minutes, but its estimate stayed in the rack's and the loop's mean thermal resistance,
    and in the rack maximum, for good: ForeshockCoolingDegradation (the rack's resistance over
    its daily median) could never resolve. Estimates go stale with their entity's values."""
    t = small_topology
    n = t.size("gpu")
    store = FindingStore(t)
    reg = build_registry(store)
    r = np.full(n, 0.1)
    pulled = int(np.flatnonzero(t.gpu_node == t.slot("node", "node0"))[0])
    r[pulled] = 0.5
    rack = {"cluster": "test", "rack": t.labels("gpu", pulled)["rack"]}
    loop = {"cluster": "test", "cooling_loop": t.loops[t.rack_loop[t.gpu_rack[pulled]]]}
    store.set_gauges({"thermal_resistance_celsius_per_watt": ("gpu", r, "fitted R")})
    store.observe_frame(Frame("gpu", np.zeros(n), np.arange(n), {"gpu_temp": np.full(n, 50.0)}))
    before = reg.get_sample_value("foreshock_rack_thermal_resistance_celsius_per_watt", rack)
    assert before is not None and before > 0.1
    stays = np.flatnonzero(t.gpu_node != t.gpu_node[pulled])
    for ts in (60.0, 120.0, 180.0):  # node0 is gone; the rest report
        store.observe_frame(Frame("gpu", np.full(len(stays), ts), stays, {"gpu_temp": np.full(len(stays), 50.0)}))
    assert reg.get_sample_value("foreshock_rack_thermal_resistance_celsius_per_watt", rack) == pytest.approx(0.1)
    assert reg.get_sample_value("foreshock_loop_thermal_resistance_celsius_per_watt", loop) == pytest.approx(0.1)
    assert reg.get_sample_value("foreshock_estimate_rack_max", {**rack, "estimate": "thermal_resistance_celsius_per_watt"}) \
        == pytest.approx(0.1)
    assert reg.get_sample_value("foreshock_gpus_reporting", {"cluster": "test"}) == len(stays)
    # and the store's own estimates are left as they were (a snapshot's copies were changed)
    assert store.snapshot().gauges["thermal_resistance_celsius_per_watt"][1][pulled] == 0.5


def test_a_clock_stepped_back_is_counted_logged_once_with_how_far_and_recovers(
        small_topology: Topology, caplog: pytest.LogCaptureFixture) -> None:
    """An NTP step of the host's clock one hour back, polled every 30 s: the guard refuses the
    hour of rows stamped before what it already has (each entity's rows must go forward), counts
    every one, and takes rows again once they are newer. Its one log line said only "gpu frame";
    it says how far back the rows were, and why that happens."""
    from foreshock.guard import InputGuard
    from foreshock.health import PipelineHealth

    n = small_topology.size("gpu")
    health = PipelineHealth()
    guard = InputGuard(small_topology, health)
    kept = []
    with caplog.at_level("WARNING", logger="foreshock"):
        for k in range(240):  # two hours of polls; the clock is stepped back an hour after the first
            ts = 30.0 * k - (3600.0 if k >= 120 else 0.0)
            kept.append(len(guard.check(Frame("gpu", np.full(n, ts), np.arange(n), {"gpu_temp": np.full(n, 50.0)}))))
    assert kept[:120] == [n] * 120
    assert kept[120:] == [0] * 120  # stamped 0 .. 3570 s after it: all at or before the newest kept (3570 s)
    assert health.problems[("guard", "out_of_order")] == 119 * n and health.problems[("guard", "duplicate_timestamp")] == n
    logged = [r.getMessage() for r in caplog.records if "out_of_order" in r.getMessage()]
    assert len(logged) == 1 and "rows up to 3570 s older than their entity's newest" in logged[0]
    # the next poll is newer than anything kept: taken again
    assert len(guard.check(Frame("gpu", np.full(n, 3600.0), np.arange(n), {"gpu_temp": np.full(n, 50.0)}))) == n
