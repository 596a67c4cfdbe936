"""Jobs from Slurm (hostlists, ``squeue --json``, ``foreshock topology jobs``) and ``topology show``.

No Slurm controller runs here: the squeue outputs below follow the shape Slurm documents for
``squeue --json`` (``jobs[]`` with ``job_id``, ``name``, ``nodes`` as a hostlist and
``job_state``, a list of strings since 23.02 and a string before), with the fields foreshock does
not read trimmed to a few.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.cli.main import cli
from foreshock.frames import Frame
from foreshock.streams.kafka_codec import PartitionMap, decode_bundle, encode_bundle, headers_dict
from foreshock.streams.slurm import HostlistError, expand_hostlist, jobs_from_squeue
from foreshock.topology import Topology

NODES = [f"gpu{n:03d}" for n in range(1, 9)] + ["gpu010", "gpu011"]


def cluster() -> Topology:
    """Ten 8-GPU nodes named as a Slurm site names them (gpu001...), one old job."""
    data = Topology.from_gpu_hosts([(n, g) for n in NODES for g in range(8)], cluster="slurmed").to_dict()
    data["jobs"] = [{"name": "1:old", "nodes": ["gpu001"]}]
    return Topology.from_dict(data)


def job(job_id: int, nodes: str, state: object = ("RUNNING",), name: str = "train") -> dict[str, object]:
    """A job holding its nodes whole: all 8 GPUs of each gpu node (the TRES squeue gives is read)."""
    try:
        hosts = expand_hostlist(nodes)
    except HostlistError:
        hosts = []
    gpus = 8 * sum(h.startswith("gpu") for h in hosts)
    return {"account": "ml", "job_id": job_id, "name": name, "user_name": "alice", "partition": "gpu",
            "job_state": list(state) if isinstance(state, tuple) else state, "nodes": nodes,
            "tres_alloc_str": f"cpu=64,mem=512G,node={len(hosts)},billing=64,gres/gpu={gpus}",
            "start_time": {"set": True, "infinite": False, "number": 1764590000}}


def squeue(*jobs: dict[str, object]) -> str:
    return json.dumps({"errors": [], "meta": {}, "jobs": list(jobs), "warnings": []})


# ---- hostlists ----------------------------------------------------------------------------------
@pytest.mark.parametrize("expression, hosts", [
    ("gpu001", ["gpu001"]),
    ("gpu[001-003,010],login1", ["gpu001", "gpu002", "gpu003", "gpu010", "login1"]),
    ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),  # no padding without a leading zero
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),  # a product, as scontrol show hostnames
    ("node[09-10]-ib", ["node09-ib", "node10-ib"]),
    ("", []),
])
def test_hostlists_expand_as_slurm_writes_them(expression: str, hosts: list[str]) -> None:
    assert expand_hostlist(expression) == hosts


@pytest.mark.parametrize("expression", ["gpu[1-", "gpu1]", "gpu[3-1]", "gpu[a-b]", "gpu[[1]]"])
def test_a_hostlist_that_is_not_slurms_syntax_is_refused(expression: str) -> None:
    with pytest.raises(HostlistError):
        expand_hostlist(expression)


def _compress(prefix: str, width: int, numbers: list[int]) -> str:
    """A hostlist for ``prefix`` + the zero-padded numbers, as runs of consecutive numbers
    (written here, independently of the expander)."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    body = ",".join(f"{r[0]:0{width}d}" + (f"-{r[-1]:0{width}d}" if len(r) > 1 else "") for r in runs)
    return f"{prefix}[{body}]"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["gpu", "node-", "a"]), st.integers(1, 4),
                          st.lists(st.integers(0, 999), min_size=1, max_size=20)), min_size=1, max_size=4))
def test_a_compressed_hostlist_expands_to_its_hosts(groups) -> None:
    groups = [(p, w, [n for n in ns if n < 10 ** w]) for p, w, ns in groups]
    groups = [(p, w, ns) for p, w, ns in groups if ns]
    expression = ",".join(_compress(p, w, ns) for p, w, ns in groups)
    expected = [f"{p}{n:0{w}d}" for p, w, ns in groups for n in sorted(set(ns))]
    assert expand_hostlist(expression) == expected


# ---- squeue --json -> jobs --------------------------------------------------------------------------
def test_running_jobs_on_the_topologys_nodes_become_its_jobs() -> None:
    text = squeue(
        job(4711, "gpu[002-005]", name="llama-pretrain"),
        job(4712, "gpu[006-007]", state=("PENDING",)),  # waiting: no nodes yet that count
        job(4713, "gpu[005-006]"),  # gpu005 is 4711's too: neither owns it, both are left out
        job(4714, "gpu[010-011],cpu[01-02]", name=""),  # CPU nodes are not in the topology
        job(4715, "cpu01"),
        job(4716, "gpu008", state="RUNNING"),  # the string form of Slurm before 23.02
    )
    found = jobs_from_squeue(text, cluster())
    assert found.jobs == [
        {"name": "4714", "nodes": ["gpu010", "gpu011"]},
        {"name": "4716:train", "nodes": ["gpu008"]},
    ]
    assert found.left_out == {"not running": 1, "shares a node with another job": 2, "no node of the topology": 1}
    assert found.unknown_nodes == {"cpu01": 2, "cpu02": 1}
    assert jobs_from_squeue(text, cluster(), min_nodes=2).left_out["fewer than 2 nodes"] == 1


def test_jobs_are_listed_by_start_time_after_the_job_ids_wrap_and_a_shared_node_drops_all_its_jobs() -> None:
    """Job ids wrap past MaxJobId (67,043,328 by default) back to 1. Until 2026-12-03 jobs were
    taken in id order, so a job started after the wrap took a shared node from one started the day
    before; then the earlier start kept it. Since 2026-12-05 no job keeps a shared node (none of
    them holds all its GPUs), and start time orders the jobs listed (the id between equal starts),
    in both forms squeue writes a start time (an integer before 23.11)."""
    before_wrap = job(67_043_300, "gpu[002-003]", name="long-run")
    before_wrap["start_time"] = {"set": True, "infinite": False, "number": 1764500000}
    after_wrap = job(12, "gpu[003-004]", name="new")
    after_wrap["start_time"] = 1764590000
    no_start = job(5, "gpu[004-005]", name="unstarted")
    no_start["start_time"] = {"set": False, "infinite": False, "number": 0}
    found = jobs_from_squeue(squeue(after_wrap, no_start, before_wrap), cluster())
    assert found.jobs == [] and found.left_out == {"shares a node with another job": 3}

    after_wrap["nodes"], no_start["nodes"] = "gpu004", "gpu005"
    found = jobs_from_squeue(squeue(after_wrap, no_start, before_wrap), cluster())
    assert found.jobs == [{"name": "67043300:long-run", "nodes": ["gpu002", "gpu003"]},
                          {"name": "12:new", "nodes": ["gpu004"]},
                          {"name": "5:unstarted", "nodes": ["gpu005"]}]
    assert found.left_out == {}


def test_the_components_of_a_heterogeneous_job_are_one_job_named_after_its_leader() -> None:
    """A heterogeneous job is listed as one entry per component (job ids 300, 301, ...; each with
    het_job_id 300 and its het_job_offset). It was split into separate jobs, so the straggler
    detector compared each component's GPUs apart; now they are one job on all its nodes."""
    def component(job_id: int, offset: int, nodes: str, name: str, state: tuple[str, ...] = ("RUNNING",)):
        entry = job(job_id, nodes, state=state, name=name)
        entry["het_job_id"] = {"set": True, "infinite": False, "number": 300}
        entry["het_job_offset"] = {"set": True, "infinite": False, "number": offset}
        return entry

    lone = job(299, "gpu008")
    lone["het_job_id"] = {"set": True, "infinite": False, "number": 0}  # not heterogeneous
    found = jobs_from_squeue(squeue(component(301, 1, "gpu[004-005]", "moe-experts"), lone,
                                    component(300, 0, "gpu[002-003]", "moe-train"),
                                    component(302, 2, "cpu01", "moe-loader")), cluster())
    assert found.jobs == [{"name": "299:train", "nodes": ["gpu008"]},
                          {"name": "300:moe-train", "nodes": ["gpu002", "gpu003", "gpu004", "gpu005"]}]
    # the loader on cpu01 holds no GPU (gres/gpu=0): its node is not the job's, so not one dropped from it
    assert found.left_out == {} and found.unknown_nodes == {}

    older = component(300, 0, "gpu[002-003]", "moe-train")  # before 23.11: plain integers
    older["het_job_id"], older["het_job_offset"] = 300, 0
    waiting = component(301, 1, "", "moe-experts", state=("PENDING",))
    waiting["het_job_id"], waiting["het_job_offset"] = 300, 1
    assert jobs_from_squeue(squeue(waiting, older), cluster()).jobs == [
        {"name": "300:moe-train", "nodes": ["gpu002", "gpu003"]}]


def test_squeue_output_that_is_not_squeues_is_refused_and_bad_entries_counted() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        jobs_from_squeue("squeue: error: Invalid user", cluster())
    with pytest.raises(ValueError, match="no 'jobs' list"):
        jobs_from_squeue(json.dumps({"meta": {}}), cluster())
    found = jobs_from_squeue(json.dumps({"jobs": ["x", {"job_id": "7", "nodes": "gpu002"},
                                                   job(8, "gpu[002"), job(9, "gpu003")]}), cluster())
    assert found.jobs == [{"name": "9:train", "nodes": ["gpu003"]}]
    assert found.left_out == {"malformed entry": 2, "unreadable node list": 1}


def test_squeue_output_that_reports_an_error_is_refused_not_read_as_no_jobs(tmp_path: Path) -> None:
    """squeue 21.08 can exit 0 with its controller unreachable, printing an ``errors`` entry and an
    empty ``jobs`` list. Until 2026-12-03 that read as "no job runs" and ended every job of the
    file; now it is refused as a failed squeue is, naming squeue's error. Warnings are not errors."""
    unreachable = json.dumps({"errors": [{"error": "Unable to contact slurm controller (connect failure)",
                                          "error_number": 1007}], "warnings": [], "jobs": []})
    with pytest.raises(ValueError, match=r"squeue failed: Unable to contact slurm controller .*\(error 1007\)"):
        jobs_from_squeue(unreachable, cluster())
    warned = json.dumps({"errors": [], "warnings": [{"description": "deprecated field", "source": "x"}],
                         "jobs": [job(9, "gpu003")]})
    assert jobs_from_squeue(warned, cluster()).jobs == [{"name": "9:train", "nodes": ["gpu003"]}]

    path = tmp_path / "cluster.yaml"
    cluster().dump(path)
    listing = tmp_path / "squeue.json"
    listing.write_text(unreachable)
    result = CliRunner().invoke(cli, ["topology", "jobs", str(path), "--squeue-json", str(listing)])
    assert result.exit_code == 1 and "Unable to contact slurm controller" in result.output, result.output
    assert Topology.load(path).jobs == ["1:old"]  # its job not ended


# ---- foreshock topology jobs --------------------------------------------------------------------------
def test_topology_jobs_rewrites_only_the_jobs_and_leaves_an_unchanged_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    old = cluster()
    old.dump(path)
    path.chmod(0o644)
    listing = tmp_path / "squeue.json"
    listing.write_text(squeue(job(4711, "gpu[002-005]", name="llama-pretrain"), job(4712, "gpu[006-007]")))

    result = CliRunner().invoke(cli, ["topology", "jobs", str(path), "--squeue-json", str(listing)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["changed"] and summary["written"] and summary["jobs"] == 2
    assert "1 ended" in result.output and "2 new" in result.output
    new = Topology.load(path)
    assert new.jobs == ["4711:llama-pretrain", "4712:train"]
    assert new.fingerprint() == old.fingerprint() and new.fingerprint(jobs=True) != old.fingerprint(jobs=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable by the workers' user as before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

    os.utime(path, (1_000_000_000, 1_000_000_000))
    again = CliRunner().invoke(cli, ["topology", "jobs", str(path), "--squeue-json", str(listing)])
    assert again.exit_code == 0, again.output
    assert json.loads(again.output.strip().splitlines()[-1])["changed"] is False
    assert "unchanged" in again.output and path.stat().st_mtime == 1_000_000_000

    # an agent that publishes GPU rows under the old file is still read by a worker holding the new one
    gpu = Frame("gpu", [1.0], [0], {"gpu_temp": [40.0]})
    value, headers = encode_bundle("a", 0.0, [(1, 0, 1, gpu)], topology=old)
    (taken,) = decode_bundle(value, headers_dict(headers), new, PartitionMap(new, 1), 0)
    assert taken.error is None


def test_topology_jobs_runs_squeue_and_says_why_it_failed(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    cluster().dump(path)
    listing = tmp_path / "out.json"
    listing.write_text(squeue(job(4711, "gpu[002-003]")))
    stub = tmp_path / "squeue"
    stub.write_text(f'#!/bin/sh\n[ "$1" = --json ] || exit 2\ncat {listing}\n')
    stub.chmod(0o755)
    result = CliRunner().invoke(cli, ["topology", "jobs", str(path), "--squeue", str(stub), "--dry-run"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["changed"] and not summary["written"] and Topology.load(path).jobs == ["1:old"]

    failing = tmp_path / "squeue-down"
    failing.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n")
    failing.chmod(0o755)
    result = CliRunner().invoke(cli, ["topology", "jobs", str(path), "--squeue", str(failing)])
    assert result.exit_code == 1 and "Unable to contact slurm controller" in result.output
    assert Topology.load(path).jobs == ["1:old"]


def test_topology_show_names_the_fingerprints_a_mismatch_reports(tmp_path: Path) -> None:
    """The fingerprints it prints are the ones a worker's topology_mismatch message names."""
    from foreshock.streams.kafka_codec import RecordError

    path, other = tmp_path / "cluster.yaml", tmp_path / "node-only.yaml"
    cluster().dump(path)
    own = Topology.from_gpu_hosts([("gpu001", g) for g in range(8)])
    own.dump(other)
    shown = {}
    for p in (path, other):
        result = CliRunner().invoke(cli, ["topology", "show", str(p)])
        assert result.exit_code == 0, result.output
        shown[p] = json.loads(result.output.strip().splitlines()[-1])
    assert (shown[path]["gpu"], shown[path]["node"], shown[path]["job"]) == (80, 10, 1)
    value, headers = encode_bundle("a", 0.0, [(1, 0, 1, Frame("gpu", [1.0], [0], {"gpu_temp": [40.0]}))], topology=own)
    (refused,) = decode_bundle(value, headers_dict(headers), cluster(), PartitionMap(cluster(), 1), 0)
    assert isinstance(refused.error, RecordError)
    assert shown[other]["hardware"] in str(refused.error) and shown[path]["hardware"] in str(refused.error)
    broken = tmp_path / "broken.yaml"
    broken.write_text("rows: []\nracks: [{name: r0, row: nowhere}]\n")
    result = CliRunner().invoke(cli, ["topology", "show", str(broken)])
    assert result.exit_code == 1 and "broken.yaml" in result.output
