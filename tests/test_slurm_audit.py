"""``foreshock topology jobs`` after the audit of 2026-12-05: jobs on part of a node, shared nodes
with ``--min-nodes``, and the jobs squeue hides without ``--all``.

No Slurm controller runs here: the entries follow ``squeue --json``'s documented shape, with the
GPUs a job holds in ``tres_alloc_str`` (``gres/gpu=N``, the job's total) and ``gres_detail`` (one
string per node of ``nodes``: ``gpu:TYPE:N(IDX:...)``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.streams.slurm import jobs_from_squeue, with_jobs
from foreshock.topology import Topology


def cluster(nodes: int = 4) -> Topology:
    """8-GPU nodes gpu001..."""
    return Topology.from_gpu_hosts([(f"gpu{n:03d}", g) for n in range(1, nodes + 1) for g in range(8)], cluster="c")


def entry(job_id: int, nodes: str, start: int, gpus: int | None = None, detail: list[str] | None = None,
          name: str = "train") -> dict[str, object]:
    """A running job; ``gpus`` is its TRES total (None: no gres/gpu, as where GPUs are not GRES)."""
    tres = "cpu=8,mem=64G,node=1,billing=8" + (f",gres/gpu={gpus}" if gpus is not None else "")
    return {"job_id": job_id, "name": name, "job_state": ["RUNNING"], "nodes": nodes, "tres_alloc_str": tres,
            "gres_detail": detail if detail is not None else [],
            "start_time": {"set": True, "infinite": False, "number": start}}


def squeue(*jobs: dict[str, object]) -> str:
    return json.dumps({"errors": [], "meta": {}, "jobs": list(jobs), "warnings": []})


# ---- 1: a job on part of a node does not own it ------------------------------------------------------
def test_jobs_holding_part_of_a_node_are_left_out_not_given_the_whole_node() -> None:
    """Eight 1-GPU jobs on gpu001 (the audit's r3): the oldest was given all 8 GPUs, so the
    straggler detector compared its co-tenants' GPUs as its peers and an incident counted 8 GPUs
    at risk for it. Now a job holding fewer GPUs than its nodes have is left out."""
    tenants = [entry(100 + k, "gpu001", 1000 + k, gpus=1, detail=[f"gpu:1(IDX:{k})"], name=f"infer{k}")
               for k in range(8)]
    whole = entry(200, "gpu[002-003]", 900, gpus=16, detail=["gpu:h100:8(IDX:0-7)"] * 2, name="pretrain")
    found = jobs_from_squeue(squeue(*tenants, whole), cluster())
    assert found.jobs == [{"name": "200:pretrain", "nodes": ["gpu002", "gpu003"]}]
    assert found.left_out == {"uses part of a node": 8}
    topology = with_jobs(cluster(), found.jobs)
    assert len(topology.gpus_of_job(0)) == 16  # its own two nodes' GPUs, none of gpu001's
    assert (topology.gpu_job[topology.gpus_of_node(topology.slot("node", "gpu001"))] == -1).all()


@pytest.mark.parametrize("gpus, detail, kept", [
    (4, None, False),  # TRES alone: 4 of 8
    (8, None, True),
    (None, None, True),  # no GPU count given (GPUs not GRES): as before, the node is the job's
    (8, ["gpu:a100:4(IDX:0-3)"], False),  # gres_detail, per node, decides over the total
    (None, ["gpu:a100:8(IDX:0-7)"], True),
    (None, ["gpu:3090:2(IDX:0-1)"], False),  # a type of digits: the IDX list counts the cards
    (None, ["gpu:8(CNT:8)"], True),  # no IDX: CNT
    (None, ["gpu:a100:8(IDX:N/A)"], True),  # an IDX that is not a list: the count after the colon
    (None, ["gpu:a100:2(IDX:0,3),tmpdisk:100"], False),  # commas inside IDX, other GRES beside
    (None, ["shard:a100:8(IDX:0-7)"], True),  # shards are no GPU count: not given
    (6, ["gpu:a100:x"], False),  # a gres_detail not read: the total
])
def test_the_gpus_a_job_holds_are_read_from_gres_detail_or_tres(gpus, detail, kept) -> None:
    found = jobs_from_squeue(squeue(entry(7, "gpu002", 1000, gpus=gpus, detail=detail)), cluster())
    assert (found.jobs == [{"name": "7:train", "nodes": ["gpu002"]}]) is kept, found
    assert found.left_out == ({} if kept else {"uses part of a node": 1})


def test_gres_detail_finds_part_of_a_node_that_a_total_over_unknown_nodes_hides() -> None:
    """A job on gpu002, gpu003 and a node outside the topology holds 4 + 8 + 8 GPUs: its total (20)
    covers the 16 of its known nodes; the per-node detail shows gpu002 is not all its."""
    detail = ["gpu:h100:4(IDX:0-3)", "gpu:h100:8(IDX:0-7)", "gpu:h100:8(IDX:0-7)"]
    found = jobs_from_squeue(squeue(entry(7, "gpu[002-003],other01", 1000, gpus=20, detail=detail)), cluster())
    assert found.jobs == [] and found.left_out == {"uses part of a node": 1}
    found = jobs_from_squeue(squeue(entry(7, "gpu[002-003],other01", 1000, gpus=20)), cluster())
    assert found.jobs == [{"name": "7:train", "nodes": ["gpu002", "gpu003"]}]  # the total alone cannot tell


def test_every_job_on_a_shared_node_is_left_out_not_only_the_younger() -> None:
    """Two jobs on gpu002, no GPU count given (a site not scheduling GPUs as GRES: no job names
    any): the older one kept the node (and was given the other's GPUs as its own). Neither holds
    all of it, and nothing says which holds what."""
    older = entry(10, "gpu[001-002]", 1000, name="a")
    younger = entry(11, "gpu[002-003]", 2000, name="b")
    alone = entry(12, "gpu004", 3000, name="c")
    found = jobs_from_squeue(squeue(younger, alone, older), cluster())
    assert found.jobs == [{"name": "12:c", "nodes": ["gpu004"]}]
    assert found.left_out == {"shares a node with another job": 2}
    # a 1-GPU job beside a whole-node job: the one uses part of the node, the other does not own it
    found = jobs_from_squeue(squeue(entry(20, "gpu[001-002]", 1000, gpus=16), entry(21, "gpu001", 2000, gpus=1)),
                             cluster())
    assert found.jobs == [] and found.left_out == {"shares a node with another job": 1, "uses part of a node": 1}


def test_the_components_of_a_heterogeneous_job_hold_a_node_together() -> None:
    """Two components of job 300 hold 4 GPUs each of gpu002: together the whole node."""
    def component(job_id: int, offset: int, detail: str) -> dict[str, object]:
        part = entry(job_id, "gpu002", 1000, gpus=4, detail=[detail], name="het")
        part["het_job_id"], part["het_job_offset"] = 300, offset
        return part

    found = jobs_from_squeue(squeue(component(300, 0, "gpu:4(IDX:0-3)"), component(301, 1, "gpu:4(IDX:4-7)")),
                             cluster())
    assert found.jobs == [{"name": "300:het", "nodes": ["gpu002"]}] and found.left_out == {}
    found = jobs_from_squeue(squeue(component(300, 0, "gpu:4(IDX:0-3)")), cluster())
    assert found.jobs == [] and found.left_out == {"uses part of a node": 1}


# ---- 2: --min-nodes: a job too small still holds its node ---------------------------------------------
@pytest.mark.parametrize("gpus", [(8, 16), (None, None)])
def test_a_job_left_out_for_its_size_still_holds_its_node(gpus) -> None:
    """With --min-nodes 2 the older 1-node job was left out for its size without holding gpu001, so
    the younger job sharing it was kept (the audit's r4). Every running job's nodes count before
    the size: with any --min-nodes both are left out as sharing a node."""
    small = entry(10, "gpu001", 1000, gpus=gpus[0], name="notebook")
    big = entry(20, "gpu[001-002]", 2000, gpus=gpus[1], name="train")
    alone = entry(30, "gpu003", 3000, gpus=gpus[0], name="solo")
    for min_nodes in (2, 1):  # 2 first: the audit's case
        found = jobs_from_squeue(squeue(small, big, alone), cluster(), min_nodes=min_nodes)
        assert found.jobs == ([{"name": "30:solo", "nodes": ["gpu003"]}] if min_nodes == 1 else []), min_nodes
        expected = {"shares a node with another job": 2}
        if min_nodes == 2:
            expected["fewer than 2 nodes"] = 1
        assert found.left_out == expected, min_nodes


# ---- 3: squeue --all -----------------------------------------------------------------------------------
def test_topology_jobs_asks_squeue_for_the_jobs_of_hidden_partitions(tmp_path: Path) -> None:
    """squeue leaves out jobs in hidden partitions, and in partitions the caller's group cannot
    use, unless given --all: their jobs read as ended (the audit's r6)."""
    data = cluster().to_dict()
    data["jobs"] = [{"name": "4712:prod-llm", "nodes": ["gpu003", "gpu004"]},
                    {"name": "4711:train", "nodes": ["gpu001", "gpu002"]}]
    path = tmp_path / "t.yaml"
    Topology.from_dict(data).dump(path)
    visible = entry(4711, "gpu[001-002]", 100, gpus=16)
    hidden = {**entry(4712, "gpu[003-004]", 90, gpus=16, name="prod-llm"), "partition": "reserved_hidden"}
    (tmp_path / "all.json").write_text(squeue(hidden, visible))
    (tmp_path / "default.json").write_text(squeue(visible))
    stub = tmp_path / "squeue"  # squeue's documented default, as man squeue says of -a/--all
    stub.write_text("#!/bin/sh\n" f'echo "$@" > {tmp_path}/argv\n'
                    f'for a in "$@"; do case "$a" in -a|--all) exec cat {tmp_path}/all.json;; esac; done\n'
                    f"cat {tmp_path}/default.json\n")
    stub.chmod(0o755)
    result = CliRunner().invoke(cli, ["topology", "jobs", str(path), "--squeue", str(stub), "--dry-run"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["jobs"] == 2 and summary["changed"] is False, result.output
    assert "--all" in (tmp_path / "argv").read_text().split()
    help_text = CliRunner().invoke(cli, ["topology", "jobs", "--help"]).output
    assert "--all" in help_text and "PrivateData" in help_text


@pytest.mark.parametrize("cpu_gpus", [0, None], ids=["gres/gpu=0", "no gres/gpu, as Slurm prints it"])
def test_a_cpu_job_beside_a_training_job_takes_none_of_its_gpus(cpu_gpus: int | None) -> None:
    """A job holding no GPU (a CPU job) on a GPU node shares none of its GPUs: the training job
    there keeps the node. Slurm leaves a zero count out of ``tres_alloc_str`` (``cpu=8,mem=64G,
    node=1,billing=8``): where other jobs name their GPUs, that is a job holding none (until
    2026-12-05 it was taken as holding its node whole, and both jobs were left out)."""
    train = entry(10, "gpu[001-002]", 900, gpus=16, detail=["gpu:h100:8(IDX:0-7)"] * 2, name="pretrain")
    cpu = entry(11, "gpu001", 1000, gpus=cpu_gpus, name="preprocess")
    found = jobs_from_squeue(squeue(train, cpu), cluster())
    assert found.jobs == [{"name": "10:pretrain", "nodes": ["gpu001", "gpu002"]}]
    assert found.left_out == {"holds no GPU": 1}


def test_a_cpu_job_alone_on_a_gpu_node_owns_none_of_its_gpus() -> None:
    train = entry(10, "gpu[001-002]", 900, gpus=16, detail=["gpu:h100:8(IDX:0-7)"] * 2, name="pretrain")
    found = jobs_from_squeue(squeue(train, entry(12, "gpu003", 1000, name="preprocess")), cluster())
    assert found.jobs == [{"name": "10:pretrain", "nodes": ["gpu001", "gpu002"]}]
    assert found.left_out == {"holds no GPU": 1}


def test_a_heterogeneous_jobs_cpu_component_adds_no_node() -> None:
    """A training component on gpu[001-002] (all 16 GPUs) and a CPU launcher component on gpu004:
    the job is its GPU nodes (it was left out as using part of a node: gpu004's 8 GPUs not its)."""
    gpus = dict(entry(50, "gpu[001-002]", 900, gpus=16, detail=["gpu:h100:8(IDX:0-7)"] * 2, name="het"),
                het_job_id=50, het_job_offset=0)
    launcher = dict(entry(51, "gpu004", 900, name="het"), het_job_id=50, het_job_offset=1)
    found = jobs_from_squeue(squeue(gpus, launcher), cluster())
    assert found.jobs == [{"name": "50:het", "nodes": ["gpu001", "gpu002"]}]
    assert found.left_out == {}


def test_where_no_job_names_its_gpus_each_holds_its_nodes_whole() -> None:
    """A site not scheduling GPUs as GRES: nothing to read, every job taken whole, as before."""
    found = jobs_from_squeue(squeue(entry(10, "gpu[001-002]", 900, name="a"), entry(11, "gpu003", 1000, name="b")),
                             cluster())
    assert found.jobs == [{"name": "10:a", "nodes": ["gpu001", "gpu002"]}, {"name": "11:b", "nodes": ["gpu003"]}]
    assert found.left_out == {}


@pytest.mark.parametrize("elsewhere", [
    entry(30, "cpu[001-002]", 500, gpus=8, detail=["gpu:8(IDX:0-7)"], name="other-partition"),
    {**entry(31, "", 0, gpus=16, name="pending"), "job_state": ["PENDING"]},
], ids=["a GPU job on nodes the topology does not know", "a pending GPU job"])
def test_a_gpu_job_outside_the_topologys_running_jobs_decides_nothing(elsewhere: dict[str, object]) -> None:
    """``squeue --all`` lists other partitions' and pending jobs: one naming its GPUs there made every
    job on the topology, naming none (a site not scheduling GPUs as GRES), "hold no GPU", and the
    rewrite ended every job."""
    jobs = [entry(10, "gpu[001-002]", 900, name="a"), entry(11, "gpu003", 1000, name="b")]
    found = jobs_from_squeue(squeue(*jobs, elsewhere), cluster())
    assert found.jobs == [{"name": "10:a", "nodes": ["gpu001", "gpu002"]}, {"name": "11:b", "nodes": ["gpu003"]}]
    assert "holds no GPU" not in found.left_out


def test_a_heterogeneous_jobs_cpu_component_adds_no_node_with_tres_totals_alone() -> None:
    """As with gres_detail (above), with only tres_alloc_str's totals: the launcher's node was joined to
    the job's nodes, the job "used part of a node" and pushed out the training job owning that node."""
    gpus = dict(entry(50, "gpu[001-002]", 900, gpus=16, name="het"), het_job_id=50, het_job_offset=0)
    launcher = dict(entry(51, "gpu004", 900, name="het"), het_job_id=50, het_job_offset=1)
    owner = entry(60, "gpu004", 950, gpus=8, name="train")
    found = jobs_from_squeue(squeue(gpus, launcher, owner), cluster())
    assert found.jobs == [{"name": "50:het", "nodes": ["gpu001", "gpu002"]}, {"name": "60:train", "nodes": ["gpu004"]}]
    assert found.left_out == {}


@pytest.mark.parametrize("detail, whole", [
    ("gpu:a100_1g.5gb:8(IDX:0-7)", False),  # eight slices: on two of the eight boards at most
    ("gpu:a100_3g.40gb:2(IDX:0-1)", False),
    ("gpu:nvidia_a100_7g.80gb:8(IDX:0-7)", True),  # a 7g slice is a whole board
    ("gpu:1g.10gb:56(IDX:0-55)", True),  # every slice of every board
])
def test_mig_slices_are_their_share_of_a_board(detail: str, whole: bool) -> None:
    """Slurm's IDX for a MIG type indexes the node's MIG devices, not its boards: eight 1g slices read
    as the node's eight GPUs, and the job was given the node whole (its straggler peers and the GPUs
    at risk in an incident: all eight boards)."""
    found = jobs_from_squeue(squeue(entry(70, "gpu001", 900, detail=[detail], name="mig")), cluster())
    assert found.jobs == ([{"name": "70:mig", "nodes": ["gpu001"]}] if whole else [])
    assert found.left_out == ({} if whole else {"uses part of a node": 1})
