"""Topology files as users write them: names kept as written, repeated keys refused, malformed
values refused with a TopologyError naming the file (never a traceback nor a quietly wrong result)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import foreshock.topology as topology_module
from foreshock.streams import samples
from foreshock.topology import MAX_GPU_INDEX, Topology, TopologyError

NUMERIC_LOOKING_NAMES = """\
cluster: 2024
rows: [{name: 1.10, cooling_loop: 007}]
racks: [{name: 12, row: 1.10}, {name: no, row: 1.10}]
nodes:
  - {name: 010, rack: 12, gpus: 2}
  - {name: 1_000, rack: no, gpus: 1}
switches: [{name: 0x1f, tier: 1, rail: 3}, {name: on, tier: spine}]
links:
  - {name: 010/gpu0~0x1f, a: 010/gpu0, b: 0x1f, fec_limit_ber: 3.7e-2}
  - {name: 5, a: on, b: 0x1f}
jobs: [{name: 42, nodes: [010, 1_000]}]
"""


def test_names_that_look_like_numbers_or_bools_are_kept_as_written(tmp_path) -> None:
    """YAML 1.1 read 010 as 8, 1.10 as 1.1, 1_000 as 1000, no as False: records for 010/gpu0
    were refused as unknown entities, and `rack: 12` was an unknown rack."""
    path = tmp_path / "topology.yaml"
    path.write_text(NUMERIC_LOOKING_NAMES)
    topo = Topology.load(path)
    assert topo.cluster == "2024"
    assert topo.rows == ["1.10"] and topo.row_loop == ["007"]
    assert topo.racks == ["12", "no"] and topo.node_rack.tolist() == [0, 1]
    assert topo.nodes == ["010", "1_000"]
    assert topo.gpus == ["010/gpu0", "010/gpu1", "1_000/gpu0"]
    assert topo.switches == ["0x1f", "on"] and topo.switch_tier == ["1", "spine"]
    assert topo.links == ["010/gpu0~0x1f", "5"]
    assert topo.link_gpu.tolist() == [0, -1] and topo.link_a_switch.tolist() == [-1, 1]
    assert topo.jobs == ["42"] and topo.gpu_job.tolist() == [0, 0, 0]
    # numbers stay numbers
    assert topo.switch_rail.tolist() == [3, -1]
    assert topo.link_fec_limit[0] == pytest.approx(3.7e-2) and np.isnan(topo.link_fec_limit[1])
    # and the names survive a dump and a load (the dumper quotes them)
    topo.dump(tmp_path / "again.yaml")
    again = Topology.load(tmp_path / "again.yaml")
    assert again.to_dict() == topo.to_dict()


def test_int_names_from_python_callers_are_looked_up_by_their_text() -> None:
    topo = Topology.from_dict({
        "rows": [{"name": 1}], "racks": [{"name": 7, "row": 1}],
        "nodes": [{"name": 10, "rack": 7, "gpus": 1}], "switches": [{"name": 5}],
        "links": [{"name": "l", "a": "10/gpu0", "b": 5}], "jobs": [{"name": "j", "nodes": [10]}]})
    assert topo.rows == ["1"] and topo.racks == ["7"] and topo.nodes == ["10"] and topo.switches == ["5"]
    assert topo.gpu_job.tolist() == [0] and topo.link_b_switch.tolist() == [0]


@pytest.mark.parametrize("doc, key, line, first", [
    ("rows: [{name: r}]\nracks: [{name: k, row: r}]\nnodes: [{name: a, rack: k, gpus: 1}]\n"
     "nodes: [{name: b, rack: k, gpus: 1}]\n", "nodes", 4, 3),
    ("rows: [{name: r}]\nracks: [{name: k, row: r}]\nnodes: [{name: a, rack: k, gpus: 8, gpus: 4}]\n",
     "gpus", 3, 3),
    ("rows: [{name: r}]\nracks: [{name: k, row: r}]\nnodes:\n  - name: a\n    rack: k\n    name: b\n",
     "name", 6, 4),
])
def test_a_repeated_key_is_refused_naming_it_and_its_lines(tmp_path, doc: str, key: str, line: int, first: int) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(doc)
    with pytest.raises(TopologyError) as err:
        Topology.load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: line {line}: key '{key}' given twice")
    assert f"first on line {first}" in message


def test_a_merge_key_may_still_override_what_it_merges(tmp_path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text("rows: [{name: r}]\nracks: [{name: k, row: r}]\n"
                    "x-base: &base {rack: k, gpus: 2}\nnodes: [{<<: *base, name: a, gpus: 1}]\n")
    assert Topology.load(path).gpus == ["a/gpu0"]


def test_a_merge_key_may_still_override_a_name_it_merges(tmp_path) -> None:
    """The merged pairs come first in the flattened mapping: the text of the merged default's
    `rack: 01` (kept as written) was written back over the node's own `rack: r2`."""
    path = tmp_path / "topology.yaml"
    path.write_text("rows: [{name: r}]\nracks: [{name: '01', row: r}, {name: r2, row: r}]\n"
                    "x-base: &base {rack: 01, gpus: 2}\n"
                    "nodes: [{<<: *base, name: a}, {<<: *base, name: b, rack: r2}]\n")
    topo = Topology.load(path)
    assert [topo.racks[r] for r in topo.node_rack] == ["01", "r2"]


def _alias_bomb(levels: int) -> str:
    """YAML of a few hundred bytes whose ``*l{levels-1}`` expands to 9**levels strings."""
    lines = ['x-l0: &l0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"x-l{k}: &l{k} [" + ",".join([f"*l{k - 1}"] * 9) + "]" for k in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", [
    "rows: [{name: row0, cooling_loop: *l5}]\nracks: [{name: rack0, row: row0}]\nnodes: [{name: n, rack: rack0}]",
    "rows: [{name: row0}]\nracks: [{name: rack0, row: *l5}]\nnodes: [{name: n, rack: rack0}]",
    "rows: [{name: row0}]\nracks: [{name: rack0, row: row0}]\nnodes: [{name: n, rack: rack0, gpus: *l5}]",
    "rows: [{name: row0}]\nracks: [{name: rack0, row: row0}]\nnodes: [{name: n, rack: rack0}]\n"
    "switches: [{name: s, rail: *l5}]",
    "rows: [{name: row0}]\nracks: [{name: rack0, row: row0}]\nnodes: [{name: n, rack: rack0}]\n"
    "switches: [{name: s}]\nlinks: [{name: l, a: s, b: s, fec_limit_ber: *l5}]",
    "rows: [{name: row0}]\nracks: [{name: rack0, row: row0}]\nnodes: [{name: n, rack: rack0}]\n"
    "jobs: [{name: j, nodes: *l5}]",
], ids=["cooling_loop", "row", "gpus", "rail", "fec_limit_ber", "job nodes"])
def test_an_alias_bomb_is_refused_in_a_short_message(tmp_path, where: str) -> None:
    """A value from YAML aliases (531,441 strings here, shared: cheap to load) was shown whole in
    the message: megabytes here, and 226 million characters for a 500-byte file of 9 levels."""
    path = tmp_path / "topology.yaml"
    path.write_text(_alias_bomb(6) + where + "\n")
    with pytest.raises(TopologyError) as err:
        Topology.load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and len(message) < len(str(path)) + 300, message[:500]


def _base() -> dict[str, Any]:
    return {"rows": [{"name": "row0"}], "racks": [{"name": "rack0", "row": "row0"}],
            "nodes": [{"name": "node0", "rack": "rack0", "gpus": 2}],
            "switches": [{"name": "leaf0", "tier": "leaf", "rail": 0}],
            "links": [{"name": "l0", "a": "node0/gpu0", "b": "leaf0"}]}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change to _base(): ``path`` like ``racks.0.row`` (``jobs`` replaces the job list)."""
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        where: Any = doc
        for part in parents:
            where = where[int(part)] if part.isdigit() else where[part]
        where[int(last) if last.isdigit() else last] = value
    return change


@pytest.mark.parametrize("change, message", [
    (_set("racks.0.row", ["row0"]), r"rack 'rack0': the row it refers to is \['row0'\]: expected a name"),
    (_set("links.0.a", ["node0/gpu0"]), r"links\[0\] \(l0\): the GPU or switch it refers to is \['node0/gpu0'\]"),
    (_set("links.0.b", 1.5), r"the switch it refers to is 1.5: expected a name"),
    (_set("racks.0.name", None), r"racks\[0\] has no 'name'"),
    (_set("cluster", ["c"]), r"'cluster' is \['c'\]: expected a name"),
    (_set("switches.0.rail", None), r"switch 'leaf0' has 'rail' None: expected an integer in 0..2147483647"),
    (_set("switches.0.rail", "x"), r"'rail' 'x': expected an integer"),
    (_set("switches.0.rail", 2**40), r"'rail' 1099511627776: expected an integer"),
    (_set("switches.0.rail", True), r"'rail' True: expected an integer"),
    (_set("switches.0.rail", -1), r"'rail' -1: expected an integer"),
    (_set("jobs", [{"name": "j", "nodes": None}]), r"job 'j' has 'nodes' None: expected a list of node names"),
    (_set("jobs", [{"name": "j", "nodes": "node0"}]), r"job 'j' has 'nodes' 'node0': expected a list"),
    (_set("jobs", [{"name": "j", "nodes": [["node0"]]}]), r"job 'j': the node it refers to is \['node0'\]"),
    (_set("nodes.0.gpus", True), r"node 'node0' has an invalid 'gpus' count True"),
    (_set("nodes.0.gpus", 10**7), rf"invalid 'gpus' count 10000000: expected a whole number in 0..{MAX_GPU_INDEX + 1}"),
    (_set("nodes.0.gpus", 2.0), r"invalid 'gpus' count 2.0"),
])
def test_malformed_values_are_a_topology_error_naming_the_file(change, message: str) -> None:
    doc = _base()
    change(doc)
    with pytest.raises(TopologyError, match=message) as err:
        Topology.from_dict(doc, source="x.yaml")
    assert str(err.value).startswith("x.yaml: ")


def test_gpu_count_is_bounded_by_the_largest_gpu_index_a_parser_accepts() -> None:
    assert samples.MAX_GPU_INDEX is MAX_GPU_INDEX  # one constant, shared by parsers and topologies
    doc = _base()
    doc["nodes"][0]["gpus"] = MAX_GPU_INDEX + 1
    assert len(Topology.from_dict(doc).gpus) == MAX_GPU_INDEX + 1
    doc["nodes"][0]["gpus"] = MAX_GPU_INDEX + 2
    with pytest.raises(TopologyError, match="invalid 'gpus' count"):
        Topology.from_dict(doc)


@pytest.mark.parametrize("text, message", [
    ("rows: [{name: row0}]\nracks: [{name: rack0, row: [row0]}]\nnodes: []\n", "the row it refers to is"),
    ("rows: [{name: row0}]\nracks: []\nnodes: []\nswitches: [{name: leaf0, rail: }]\n", "'rail' None"),
    ("rows: [{name: row0}]\nracks: []\nnodes: []\nswitches: [{name: leaf0, rail: 1099511627776}]\n", "'rail' 1099"),
    ("rows: [{name: r}]\nracks: [{name: k, row: r}]\nnodes: [{name: node0, rack: k}]\njobs: [{name: j, nodes: node0}]\n",
     "'nodes' 'node0': expected a list"),
])
def test_malformed_files_are_a_topology_error_naming_the_file(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(text)
    with pytest.raises(TopologyError, match=message) as err:
        Topology.load(path)
    assert str(err.value).startswith(f"{path}: ")


def test_an_unforeseen_failure_while_building_is_still_a_topology_error(monkeypatch) -> None:
    """The backstop: a TypeError/ValueError/OverflowError the checks miss names the file."""
    def overflow(values: Any) -> np.ndarray:
        raise OverflowError("Python integer out of bounds for int32")
    monkeypatch.setattr(topology_module, "_i32", overflow)
    with pytest.raises(TopologyError, match="^x.yaml: malformed topology: Python integer out of bounds"):
        Topology.from_dict(_base(), source="x.yaml")
