"""Topology loader audit 3: unknown (misspelt) keys, uplink orientation, ``topology jobs`` on a
symlinked file, and a folder given as the topology file.

Every expected value below is written by hand from the file under test (which node, switch or
key it names), never computed by the loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.detectors.incident_domains import LEAF, Domains, key
from foreshock.topology import Topology, TopologyError

HEAD = "cluster: hall1\nrows: [{name: row0}]\nracks: [{name: rack0, row: row0}]\n"


def _load(tmp_path: Path, text: str) -> Topology:
    path = tmp_path / "topology.yaml"
    path.write_text(text)
    return Topology.load(path)


# ---- 1: an unknown key is refused, x- keys are a site's own notes ------------------------------------
@pytest.mark.parametrize("text, bad, where, meant", [
    # each a typo the loader used to ignore, using the default in its place
    (HEAD + "nodes: [{name: gh0, rack: rack0, gpu: 4}]\n", "gpu", "nodes[0] ('gh0')", "gpus"),  # 8 GPUs
    ("cluster: c\nrows: [{name: row0, cooling-loop: cdu7}]\nracks: [{name: rack0, row: row0}]\n"
     "nodes: [{name: n, rack: rack0}]\n", "cooling-loop", "rows[0] ('row0')", "cooling_loop"),  # loop row0
    (HEAD + "nodes: [{name: n, rack: rack0, gpus: 1}]\nswitches: [{name: leaf0}]\n"
     "links: [{name: l0, a: n/gpu0, b: leaf0, fec_limit: 3.7e-2}]\n",
     "fec_limit", "links[0] ('l0')", "fec_limit_ber"),  # NaN: the detector's default limit
    (HEAD + "nodes: [{name: n, rack: rack0}]\njob: [{name: '4711:train', nodes: [n]}]\n",
     "job", "the top level", "jobs"),  # no jobs at all
    (HEAD + "nodes: [{name: n, rack: rack0}]\nswitches: [{name: s, teir: spine}]\n",
     "teir", "switches[0] ('s')", "tier"),  # a spine read as a leaf
])
def test_a_misspelt_key_is_an_error_naming_it_where_it_is_and_what_was_meant(
        tmp_path: Path, text: str, bad: str, where: str, meant: str) -> None:
    with pytest.raises(TopologyError) as err:
        _load(tmp_path, text)
    message = str(err.value)
    assert f"unknown key {bad!r}" in message and where in message, message
    assert f"did you mean {meant!r}" in message, message
    assert "x-" in message  # says where a site's own keys may go


def test_an_unknown_key_with_no_close_match_lists_the_keys_allowed_there(tmp_path: Path) -> None:
    with pytest.raises(TopologyError) as err:
        _load(tmp_path, "cluster: c\nrows: [{name: row0}]\nracks: [{name: rack0, row: row0, pdu: pdu-a}]\n"
                        "nodes: [{name: n, rack: rack0}]\n")
    message = str(err.value)
    assert "unknown key 'pdu'" in message and "racks[0] ('rack0')" in message, message
    assert "did you mean" not in message and "name, row" in message, message


def test_x_keys_are_allowed_kept_and_no_part_of_the_fingerprints(tmp_path: Path) -> None:
    plain = (HEAD + "nodes: [{name: gh0, rack: rack0, gpus: 4}]\n"
             "jobs: [{name: j, nodes: [gh0]}]\n")
    noted = ("x-owner: infra\nx_defaults: &d {rack: rack0}\ncluster: hall1\n"
             "rows: [{name: row0, x-cdu-vendor: acme}]\nracks: [{name: rack0, row: row0, x-pdu: pdu-a}]\n"
             "nodes: [{<<: *d, name: gh0, gpus: 4, x_serial: 'SN1'}]\n"
             "jobs: [{name: j, nodes: [gh0], x-team: llm}]\n")
    topo, bare = _load(tmp_path, noted), _load(tmp_path, plain)
    assert topo.gpus == ["gh0/gpu0", "gh0/gpu1", "gh0/gpu2", "gh0/gpu3"]  # the anchor's rack was merged
    # notes are not hardware: a changed PDU label must not make every agent's records mismatch
    assert topo.fingerprint() == bare.fingerprint() and topo.fingerprint(jobs=True) == bare.fingerprint(jobs=True)
    data = topo.to_dict()
    assert data["x-owner"] == "infra" and data["x_defaults"] == {"rack": "rack0"}
    assert data["rows"][0]["x-cdu-vendor"] == "acme" and data["racks"][0]["x-pdu"] == "pdu-a"
    assert data["nodes"][0]["x_serial"] == "SN1" and data["jobs"][0]["x-team"] == "llm"
    # and a dumped file keeps them
    again = tmp_path / "again.yaml"
    topo.dump(again)
    assert Topology.load(again).to_dict()["racks"][0]["x-pdu"] == "pdu-a"


# ---- 2: an uplink's leaf is its leaf-tier end, whichever the file writes first ------------------------
UPLINK = (HEAD + "nodes: [{name: n0, rack: rack0, gpus: 1}]\n"
          "switches: [{name: leaf0, tier: leaf, rail: 0}, {name: spine0, tier: spine}]\n"
          "links:\n  - {name: n0/gpu0~leaf0, a: n0/gpu0, b: leaf0}\n  - {name: up0, %s}\n")


def test_an_uplinks_leaf_is_its_leaf_tier_end_in_either_order(tmp_path: Path) -> None:
    """`{a: spine0, b: leaf0}` made spine0 the uplink's leaf: its failure blamed a leaf domain
    "spine0" and rerouting looked for siblings among spine0's links. Both orders must agree."""
    leaf0, spine0 = 0, 1  # their places in `switches`
    for a, b in (("leaf0", "spine0"), ("spine0", "leaf0")):
        topo = _load(tmp_path, UPLINK % f"a: {a}, b: {b}")
        assert topo.link_a_switch[1] == leaf0 and topo.link_b_switch[1] == spine0, (a, b)
        domains = Domains(topo)
        # the uplink belongs to leaf0's domain (spine0 is no leaf), and is leaf0's only uplink
        ancestors = domains.ancestors("link", 1)
        assert key(LEAF, leaf0) in ancestors and key(LEAF, spine0) not in ancestors, (a, b)
        assert list(domains.children(domains.leaf_uplinks, leaf0)) == [1], (a, b)
        assert list(domains.children(domains.leaf_uplinks, spine0)) == [], (a, b)
        # the file's order is kept: `up0#a` stays the optic at the end the file wrote as `a`
        link = topo.to_dict()["links"][1]
        assert (link["a"], link["b"]) == (a, b)


@pytest.mark.parametrize("tier", ["leaf", "spine"])
def test_a_link_between_two_switches_of_one_tier_is_read_as_written(tmp_path: Path, tier: str) -> None:
    """A leaf-to-leaf peer link (MLAG) or a spine-to-spine one has no leaf end to find by tier: it is
    read as written (``a`` its lower end), as before tiers oriented uplinks; a site's file with such
    links must still load."""
    text = (HEAD + "nodes: [{name: n0, rack: rack0, gpus: 0}]\n"
            f"switches: [{{name: s0, tier: {tier}}}, {{name: s1, tier: {tier}}}]\n"
            "links: [{name: s1~s0, a: s1, b: s0}]\n")
    topo = _load(tmp_path, text)
    s0, s1 = topo.switches.index("s0"), topo.switches.index("s1")
    assert topo.link_a_switch[0] == s1 and topo.link_b_switch[0] == s0


# ---- 3: topology jobs through a symlink -------------------------------------------------------------
def test_topology_jobs_writes_a_symlinks_target_and_keeps_x_keys(tmp_path: Path) -> None:
    (tmp_path / "git").mkdir()
    real = tmp_path / "git" / "cluster.yaml"
    real.write_text("# owned by infra\ncluster: hall1\nrows: [{name: row0, cooling_loop: cdu0}]\n"
                    "racks: [{name: rack0, row: row0, x-pdu: pdu-a}]\n"
                    "nodes: [{name: gpu001, rack: rack0, gpus: 8}, {name: gpu002, rack: rack0, gpus: 8}]\n"
                    "jobs: []\n")
    link = tmp_path / "cluster.yaml"
    link.symlink_to(Path("git") / "cluster.yaml")
    listing = tmp_path / "squeue.json"
    listing.write_text(json.dumps({"jobs": [{"job_id": 4711, "name": "train", "job_state": ["RUNNING"],
                                             "nodes": "gpu[001-002]", "start_time": 1}], "errors": []}))
    result = CliRunner().invoke(cli, ["topology", "jobs", str(link), "--squeue-json", str(listing)])
    assert result.exit_code == 0, result.output
    # the link is still a link, and its target (the file in the config repository) got the job
    assert link.is_symlink() and link.resolve() == real.resolve()
    written = Topology.load(real)
    assert written.jobs == ["4711:train"]
    assert written.to_dict()["racks"][0]["x-pdu"] == "pdu-a"  # the site's note survived the rewrite
    assert not list((tmp_path).glob(".cluster.yaml.*")) and not list((tmp_path / "git").glob(".cluster.yaml.*"))


# ---- 4: a folder as the topology file ---------------------------------------------------------------
def test_a_folder_as_the_topology_file_is_a_topology_error_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "topo"
    folder.mkdir()
    with pytest.raises(TopologyError) as err:  # was IsADirectoryError, a traceback in every command
        Topology.load(folder)
    assert str(err.value).startswith(f"{folder}: ") and "directory" in str(err.value).lower(), str(err.value)


def test_import_refuses_a_folder_as_topology_without_a_traceback(tmp_path: Path) -> None:
    folder = tmp_path / "topo"
    folder.mkdir()
    samples = tmp_path / "s.jsonl"
    samples.write_text('{"kind": "gpu", "entity": "h/gpu0", "ts": 1700000000, "temp_c": 30}\n')
    result = CliRunner().invoke(cli, ["import", "--format", "jsonl", str(samples), "--out", str(tmp_path / "out"),
                                      "--topology", str(folder)])
    assert result.exit_code == 2 and not isinstance(result.exception, OSError), result.output
    assert "--topology" in result.output and "directory" in result.output, result.output
