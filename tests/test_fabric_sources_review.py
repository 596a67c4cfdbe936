"""Review h45 of the fabric and BMC sources: a port gone from sysfs, ports found after the start,
a BMC answering JSON that is not an object, and a squeue job_state that is neither text nor a
list of text."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from foreshock import facts
from foreshock.detectors.congestion import L_DOWN_TS, L_STATE, CongestionDetector
from foreshock.health import PipelineHealth
from foreshock.streams.dcgm import UNLISTED_POLLS
from foreshock.streams.infiniband import DISAPPEARED, InfinibandSource, read_infiniband
from foreshock.streams.redfish import NOT_AN_OBJECT, CduSource, RedfishSource, discover, read_node
from foreshock.streams.slurm import jobs_from_squeue
from foreshock.topology import Topology


# ---- InfiniBand: ports that go, ports that come ------------------------------------------------
def make_port(root: Path, dev: str, port: str, downed: int = 3) -> None:
    """A port as the kernel lays it out (an IB-layer HCA port, ACTIVE)."""
    base = root / dev / "ports" / port
    (base / "counters").mkdir(parents=True, exist_ok=True)
    for name in ("port_xmit_data", "port_rcv_data", "port_xmit_wait", "symbol_error", "link_error_recovery",
                 "port_rcv_errors", "port_xmit_discards", "excessive_buffer_overrun_errors",
                 "local_link_integrity_errors"):
        (base / "counters" / name).write_text("0\n")
    (base / "counters" / "link_downed").write_text(f"{downed}\n")
    (base / "state").write_text("4: ACTIVE\n")
    (base / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (base / "link_layer").write_text("InfiniBand\n")


def ticking(source: InfinibandSource) -> None:
    clock = iter(np.arange(1000.0))
    source.clock = lambda: float(next(clock))


def row_of(frame: Any, topology: Topology, link: str) -> dict[str, float]:
    """The frame's values for ``link`` (one row expected)."""
    at = np.flatnonzero(frame.slot == topology.slot("link", link))
    assert len(at) == 1, f"{link}: {len(at)} rows"
    return {name: float(col[at[0]]) for name, col in frame.columns.items()}


def test_a_port_gone_from_sysfs_is_counted_once_and_its_link_reads_down_until_it_is_back(tmp_path: Path) -> None:
    root = tmp_path / "ib"
    make_port(root, "mlx5_0", "1")
    make_port(root, "mlx5_1", "1")
    health = PipelineHealth()
    source = InfinibandSource(root, host="n0", health=health)
    ticking(source)
    topology = source.topology
    assert topology is not None
    congestion = CongestionDetector(topology)
    gone = topology.slot("link", "n0/mlx5_1/1")
    states = []
    for poll in range(9):
        if poll in (2, 7):
            shutil.rmtree(root / "mlx5_1")  # the HCA falls off the bus
        if poll == 5:
            make_port(root, "mlx5_1", "1", downed=0)  # back after a driver reload: counters cleared
        (frame,) = source.poll()
        congestion.update(frame)
        row = row_of(frame, topology, "n0/mlx5_1/1")
        states.append(row["link_state"])
        if poll in (2, 3, 4, 7, 8):
            # only the state: no counter was read, none is made up
            assert {k for k, v in row.items() if v == v} == {"link_state"}
        if poll == 4:
            # the detectors saw the link leave ACTIVE (the counter, cleared on return, never will)
            assert congestion.s_link[gone, L_STATE] == facts.IB_PORT_STATE_DOWN
            assert congestion.s_link[gone, L_DOWN_TS] == 2.0
    down, up = float(facts.IB_PORT_STATE_DOWN), float(facts.IB_PORT_STATE_ACTIVE)
    assert states == [up, up, down, down, down, up, up, down, down]
    # once per disappearance, not once per poll while it is gone
    assert health.problems[("infiniband", DISAPPEARED)] == 2


def test_a_port_the_topology_maps_that_is_not_there_reads_down(tmp_path: Path, caplog) -> None:
    root = tmp_path / "ib"
    make_port(root, "mlx5_0", "1")
    topology = Topology.from_dict({
        "rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
        "nodes": [{"name": "n0", "rack": "k", "gpus": 2}],
        "switches": [{"name": "leaf0"}, {"name": "leaf1"}],
        "links": [{"name": "n0/gpu0~leaf0", "a": "n0/gpu0", "b": "leaf0"},
                  {"name": "n0/gpu1~leaf1", "a": "n0/gpu1", "b": "leaf1"}]})
    names = {"mlx5_0/1": "n0/gpu0~leaf0", "mlx5_1/1": "n0/gpu1~leaf1"}
    health = PipelineHealth()
    source = InfinibandSource(root, host="n0", topology=topology, link_names=names, health=health)
    with caplog.at_level(logging.WARNING, logger="foreshock.infiniband"):
        frames = [f for _ in range(3) for f in source.poll()]
    for frame in frames:
        assert row_of(frame, topology, "n0/gpu1~leaf1")["link_state"] == facts.IB_PORT_STATE_DOWN
        assert row_of(frame, topology, "n0/gpu0~leaf0")["link_state"] == facts.IB_PORT_STATE_ACTIVE
    assert health.problems[("infiniband", DISAPPEARED)] == 1
    assert "unknown link entity" not in {reason for _, reason in health.problems}
    assert any("mlx5_1/1" in r.getMessage() and "n0/gpu1~leaf1" in r.getMessage() for r in caplog.records)


def test_a_single_reading_counts_each_expected_port_it_misses(tmp_path: Path) -> None:
    root = tmp_path / "ib"
    make_port(root, "mlx5_0", "1")
    expected = {"mlx5_0/1": "n0/mlx5_0/1", "mlx5_1/1": "n0/mlx5_1/1"}
    health = PipelineHealth()
    for _ in range(2):  # no source's memory: each reading says what it misses
        batch = read_infiniband(root, "n0", 0.0, health, expected=expected)
        assert sorted(batch.entities) == sorted(expected.values())
    assert health.problems[("infiniband", DISAPPEARED)] == 2


def test_ports_found_after_an_empty_start_are_read_from_their_first_poll(tmp_path: Path) -> None:
    root = tmp_path / "ib"
    root.mkdir()  # the driver not loaded yet
    health = PipelineHealth()
    source = InfinibandSource(root, host="n0", health=health)
    assert source.poll() == []
    make_port(root, "mlx5_0", "1")
    frames = [f for _ in range(3) for f in source.poll()]
    assert source.topology is not None and source.topology.names("link") == ["n0/mlx5_0/1"]
    assert [len(f) for f in frames] == [1, 1, 1]
    assert "unknown link entity" not in {reason for _, reason in health.problems}


def test_a_port_found_later_is_taken_in_after_steady_polls_keeping_the_listed_ports_slots(tmp_path: Path) -> None:
    root = tmp_path / "ib"
    make_port(root, "mlx5_1", "1")
    source = InfinibandSource(root, host="n0")
    source.takes_in_new_ports = True
    first = source.topology
    assert first is not None
    make_port(root, "mlx5_0", "1")  # hot-added; sorts before the port listed
    for _ in range(UNLISTED_POLLS - 1):
        source.poll()
        assert source.topology is first  # one odd listing rebuilds nothing
    (frame,) = source.poll()
    grown = source.topology
    assert grown is not None and grown is not first
    assert source.taken_topologies() == [grown] and source.taken_topologies() == []
    assert sorted(grown.names("link")) == ["n0/mlx5_0/1", "n0/mlx5_1/1"]
    assert grown.slot("link", "n0/mlx5_1/1") == first.slot("link", "n0/mlx5_1/1")
    assert sorted(grown.links[s] for s in frame.slot) == ["n0/mlx5_0/1", "n0/mlx5_1/1"]


def test_without_taking_in_a_port_found_later_stays_unknown_and_is_logged_once(tmp_path: Path, caplog) -> None:
    root = tmp_path / "ib"
    make_port(root, "mlx5_0", "1")
    health = PipelineHealth()
    source = InfinibandSource(root, host="n0", health=health)  # foreshock agent: its topology is fixed
    first = source.topology
    make_port(root, "mlx5_1", "1")
    with caplog.at_level(logging.WARNING, logger="foreshock.infiniband"):
        for _ in range(UNLISTED_POLLS + 2):
            source.poll()
    assert source.topology is first and source.taken_topologies() == []
    assert health.problems[("infiniband", "unknown link entity")] == UNLISTED_POLLS + 2
    assert sum("mlx5_1/1" in r.getMessage() and "restart" in r.getMessage() for r in caplog.records) == 1


# ---- Redfish: bodies that are not objects -----------------------------------------------------
GOOD = {
    "/redfish/v1/Chassis": {"Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]},
    "/redfish/v1/Chassis/1": {"Thermal": {"@odata.id": "/redfish/v1/Chassis/1/Thermal"},
                              "Power": {"@odata.id": "/redfish/v1/Chassis/1/Power"}},
    "/redfish/v1/Chassis/1/Thermal": {"Fans": [{"Reading": 50, "ReadingUnits": "Percent"}]},
    "/redfish/v1/Chassis/1/Power": {"PowerControl": [{"PowerConsumedWatts": 3000}]},
}


def subsystem_tree(body: Any) -> dict[str, Any]:
    """A chassis with the newer thermal model whose ThermalSubsystem answers ``body``."""
    return {
        "/redfish/v1/Chassis": {"Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]},
        "/redfish/v1/Chassis/1": {"ThermalSubsystem": {"@odata.id": "/redfish/v1/Chassis/1/ThermalSubsystem"},
                                  "Power": {"@odata.id": "/redfish/v1/Chassis/1/Power"}},
        "/redfish/v1/Chassis/1/ThermalSubsystem": body,
        "/redfish/v1/Chassis/1/Power": {"PowerControl": [{"PowerConsumedWatts": 3000}]},
    }


class FakeBmc:
    """A BMC client serving ``tree`` (a path it lacks raises KeyError: an answer the source did not expect)."""

    def __init__(self, tree: dict[str, Any], path: str = "") -> None:
        self.tree = tree
        self.path = path  # where the URL points inside the service (a CDU's resource)

    def get(self, path: str) -> Any:
        return self.tree[path]


def redfish_source(trees: dict[str, dict[str, Any]], health: PipelineHealth) -> RedfishSource:
    source = RedfishSource({node: f"https://bmc-{node}" for node in trees}, health=health, fan_max_rpm=10000)
    fakes: Any = {node: FakeBmc(tree) for node, tree in trees.items()}
    source.clients = fakes
    return source


@pytest.mark.parametrize("body", [None, [], "booting", 3])
def test_a_bmc_answering_a_non_object_costs_only_its_own_node(body: Any, caplog) -> None:
    health = PipelineHealth()
    source = redfish_source({"node1": GOOD, "node2": subsystem_tree(body), "node3": GOOD}, health)
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        frames = [f for _ in range(3) for f in source.poll()]
    assert source.topology is not None
    nodes = [sorted(source.topology.nodes[s] for s in frame.slot) for frame in frames]
    assert nodes == [["node1", "node3"]] * 3
    assert health.problems[("redfish", NOT_AN_OBJECT)] == 3
    assert any(NOT_AN_OBJECT in r.getMessage() and "node2" in r.getMessage() for r in caplog.records)


def test_an_unexpected_failure_of_one_node_is_counted_naming_it_and_the_others_are_read(caplog) -> None:
    broken = dict(GOOD)
    del broken["/redfish/v1/Chassis/1/Thermal"]  # the fake raises KeyError: no RedfishError
    health = PipelineHealth()
    source = redfish_source({"node1": broken, "node2": GOOD}, health)
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        frames = [f for _ in range(2) for f in source.poll()]
    assert source.topology is not None
    assert [[source.topology.nodes[s] for s in frame.slot] for frame in frames] == [["node2"]] * 2
    counted = {reason: n for (stage, reason), n in health.problems.items() if stage == "redfish"}
    assert sum(counted.values()) == 2
    assert any("node1" in r.getMessage() and "KeyError" in r.getMessage() for r in caplog.records)


def test_a_power_resource_that_is_not_an_object_leaves_the_fans_read() -> None:
    tree = dict(GOOD, **{"/redfish/v1/Chassis/1/Power": ["not", "an", "object"]})
    fetch = FakeBmc(tree).get
    fans, power = read_node(fetch, discover(fetch))
    assert fans.slowest() == 0.5 and power != power
    assert fans.problems == [NOT_AN_OBJECT] and "/redfish/v1/Chassis/1/Power" in fans.details[NOT_AN_OBJECT]


def test_one_cdus_unexpected_answer_costs_only_its_loop() -> None:
    topology = Topology.from_dict({
        "rows": [{"name": "r0", "cooling_loop": "loopA"}, {"name": "r1", "cooling_loop": "loopB"}],
        "racks": [{"name": "k0", "row": "r0"}, {"name": "k1", "row": "r1"}],
        "nodes": [{"name": "n0", "rack": "k0", "gpus": 1}, {"name": "n1", "rack": "k1", "gpus": 1}]})
    cdu = "/redfish/v1/ThermalEquipment/CDUs/1"
    good = {cdu: {"SecondaryCoolantConnectors": {"@odata.id": cdu + "/SecondaryCoolantConnectors"}},
            cdu + "/SecondaryCoolantConnectors": {"Members": [{"@odata.id": cdu + "/SecondaryCoolantConnectors/1"}]},
            cdu + "/SecondaryCoolantConnectors/1": {"SupplyTemperatureCelsius": {"Reading": 30.0},
                                                   "FlowLitersPerMinute": {"Reading": 600.0}}}
    bad = {cdu: None}
    health = PipelineHealth()
    source = CduSource({"loopA": "https://a" + cdu, "loopB": "https://b" + cdu}, topology, health=health)
    fakes: Any = {"loopA": FakeBmc(bad, cdu), "loopB": FakeBmc(good, cdu)}
    source.clients = fakes
    (frame,) = source.poll()
    assert [topology.racks[s] for s in frame.slot] == ["k1"]
    assert health.problems[("redfish", NOT_AN_OBJECT)] == 1
    fakes["loopA"] = FakeBmc({}, cdu)  # an answer that raises KeyError, not a RedfishError
    (frame,) = source.poll()  # (loopA's CDU, not found, is tried again the poll after: review r58)
    assert health.problems[("redfish", "CDU answer not understood")] == 0
    (frame,) = source.poll()
    assert [topology.racks[s] for s in frame.slot] == ["k1"]
    assert health.problems[("redfish", "CDU answer not understood")] == 1


# ---- Slurm: job_state ----------------------------------------------------------------------------
def test_a_job_state_neither_text_nor_a_list_of_text_is_a_malformed_entry() -> None:
    topology = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                                   "nodes": [{"name": f"gpu00{i}", "rack": "k", "gpus": 1} for i in range(1, 5)]})
    jobs = [{"job_id": 1, "name": "a", "nodes": "gpu001", "job_state": None},
            {"job_id": 2, "name": "b", "nodes": "gpu002", "job_state": 1},
            {"job_id": 3, "name": "c", "nodes": "gpu003", "job_state": ["RUNNING", None]},
            {"job_id": 4, "name": "d", "nodes": "gpu004", "job_state": ["RUNNING"]}]
    found = jobs_from_squeue(json.dumps({"jobs": jobs}), topology)
    assert found.jobs == [{"name": "4:d", "nodes": ["gpu004"]}]
    assert found.left_out == {"malformed entry": 3}
