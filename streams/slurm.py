"""The jobs of a topology from Slurm: ``squeue --json`` -> ``jobs: [{name, nodes}]``.

foreshock's jobs are sets of whole nodes (a synchronous training job runs on its nodes alone),
and the straggler detector, the thermal reasons and the incident engine's job impact read them.
This module turns the scheduler's running jobs into that list so ``foreshock topology jobs`` can
rewrite a topology file's jobs when they change (the workers are then restarted with it, and
their checkpoints find each job again by name and nodes).

``squeue --json`` has kept the fields read here across its data-parser versions: ``jobs[]`` with
``job_id``, ``name``, ``nodes`` (a Slurm hostlist such as ``gpu[001-004,010]``) and ``job_state``
(a string before Slurm 23.02, a list of strings after), and the top-level ``errors`` list: squeue
can exit 0 with an error there and no jobs (21.08, its controller unreachable), which is no
"nothing running" (that would end every job): such output is refused, naming its first error.
``warnings`` are not errors. The GPUs a job holds are read from ``gres_detail`` and
``tres_alloc_str`` (below); nothing else is read.

An entry without an integer ``job_id``, or whose ``job_state`` is neither a string nor a list of
strings, is left out as a malformed entry (counted). A job is left out, and counted by reason,
when it is not running, runs on no node of the topology, uses part of a node, or shares a node
with another running job. A job owns its nodes only when it holds all their GPUs: its GPUs are read
per node from ``gres_detail`` (one string per node of ``nodes``, ``gpu:a100:2(IDX:0-1)``) or, without
it, in all from ``tres_alloc_str`` (``...,gres/gpu=16``); fewer than the topology's GPUs of its nodes
is "uses part of a node" (a 1-GPU job given its whole node made its co-tenants' GPUs its peers for
the straggler detector, and counted 8 GPUs at risk for it in an incident). Where squeue gives
neither for any job (a site that does not schedule GPUs as GRES), each job is taken to hold its nodes
whole, as before; where a running job on the topology's nodes names its GPUs (a MIG slice counting
as its share of a board: ``_gres_gpus``), a job naming none holds none — Slurm leaves a zero
count out of ``tres_alloc_str`` (``cpu=8,mem=64G,node=1,billing=8``): a CPU job is left out ("holds no
GPU"), shares no node, and a heterogeneous job's CPU component adds none of its nodes (until
2026-12-05 such a job was taken to hold its nodes whole: it pushed a training job beside it out as
"shares a node", or was listed as owning a GPU node's GPUs). Every job on a node two or more
running jobs share is left out, the older as well as the younger (until 2026-12-05 the oldest kept
the node): at most one of them can hold all its GPUs, nothing says which, and a synchronous training
job runs on whole nodes (a job holding no GPU there, a CPU job, shares none). Every running job's
nodes count, whatever else leaves it out (too small for ``min_nodes``, part of a node): until 2026-12-05 a
job left out for its size freed its node for a younger job sharing it. Jobs are listed oldest first:
started earlier (``start_time``: an integer before Slurm 23.11, ``{set, infinite, number}`` since),
then the lower job id (job ids wrap past ``MaxJobId``, 67,043,328 by default, so a job started after
the wrap still comes after the jobs of the day before). The components of a heterogeneous job
(``het_job_id``, the leader's job id, non-zero; ``het_job_offset`` 0, 1, ...) are one job, named
after the leader, on the nodes of its running components, holding their GPUs together.
Nodes the topology does not know (CPU nodes, another cluster's) are dropped from a job and
counted.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from foreshock.topology import Topology

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TRES_GPU = re.compile(r"(?:^|,)gres/gpu=(\d+)(?=,|$)")  # the untyped total, not gres/gpu:a100=N
_GRES_ITEM = re.compile(r"([^,()]+)((?:\([^)]*\))*)")  # name and its (KEY:VALUE) groups; IDX has commas
_MIG_PROFILE = re.compile(r"(\d+)g\.\d+gb")  # a MIG slice's type: a100_1g.5gb, 3g.40gb (compute sevenths)
MIG_SEVENTHS = 7
"""An A100's or H100's compute is cut in sevenths for MIG: a ``Ng.*`` slice holds N of them."""

# The GPUs a job holds: per node (from gres_detail), in all (from tres_alloc_str), or not given. In
# boards: a MIG slice counts as its share of one, so a job of slices never holds a node whole.
Gpus = dict[str, float] | float | None


class HostlistError(ValueError):
    """A hostlist expression that is not Slurm's syntax."""


def expand_hostlist(expression: str) -> list[str]:
    """Every host name of a Slurm hostlist, in order: ``gpu[001-003,010],login1`` ->
    ``gpu001 gpu002 gpu003 gpu010 login1``. Several bracket groups in one name are a product
    (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2, as ``scontrol show hostnames`` gives them); a range
    keeps the zero padding of its first bound."""
    hosts: list[str] = []
    for item in _split_top_level(expression.strip()):
        hosts.extend(_expand_item(item, expression))
    return hosts


def _split_top_level(expression: str) -> Iterator[str]:
    """The comma-separated items outside brackets."""
    depth, start = 0, 0
    for i, ch in enumerate(expression):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets in hostlist {expression!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {expression!r}")
        elif ch == "," and depth == 0:
            if i > start:
                yield expression[start:i]
            start = i + 1
    if depth:
        raise HostlistError(f"unclosed '[' in hostlist {expression!r}")
    if start < len(expression):
        yield expression[start:]


def _expand_item(item: str, expression: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, body, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    numbers = [str(n).zfill(width) for low, high, width in _ranges(body, expression) for n in range(low, high + 1)]
    tails = _expand_item(rest, expression) if rest else [""]
    return [f"{prefix}{n}{tail}" for n in numbers for tail in tails]


def _ranges(body: str, expression: str) -> list[tuple[int, int, int]]:
    """The ranges of a bracket's ``001-003,010``, each (low, high, the first bound's width: its zero
    padding); ``expression``: what to name in the error."""
    ranges = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise HostlistError(f"bad range {part!r} in hostlist {expression!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostlistError(f"descending range {part!r} in hostlist {expression!r}")
        ranges.append((int(low), int(high), len(low)))
    return ranges


@dataclass
class SlurmJobs:
    """The jobs read from one ``squeue --json`` output, and what was left out and why."""

    jobs: list[dict[str, Any]] = field(default_factory=list)  # the topology's shape: {name, nodes}
    left_out: Counter[str] = field(default_factory=Counter)  # reason -> jobs
    unknown_nodes: Counter[str] = field(default_factory=Counter)  # node name -> jobs naming it


def job_name(job: dict[str, Any]) -> str:
    """``JOBID:NAME`` (the id alone for a job without a name): unique while the job runs, and
    readable in an alert."""
    name = str(job.get("name") or "").strip()
    return f"{job['job_id']}:{name}" if name else str(job["job_id"])


def _states(job: dict[str, Any]) -> set[str] | None:
    """The job's states (none for a job without ``job_state``); None when it is neither a string
    nor a list of strings (null, a number: a malformed entry, not a state to guess at)."""
    state = job.get("job_state", ())
    if isinstance(state, str):
        return {state}
    if isinstance(state, (list, tuple)) and all(isinstance(s, str) for s in state):
        return set(state)
    return None


def _error_text(error: Any) -> str:
    """One entry of squeue's ``errors`` as a line: its description and error (the one when the
    other is empty or the same), and its number. Slurm's versions name these differently
    (``error``, ``description``, ``error_number`` or ``error_code``); anything else is shown as is."""
    if not isinstance(error, dict):
        return str(error)
    said = list(dict.fromkeys(str(error[k]).strip() for k in ("description", "error")
                              if str(error.get(k) or "").strip()))
    number = next((error[k] for k in ("error_number", "error_code") if error.get(k) not in (None, "", 0)), None)
    text = "; ".join(said) or json.dumps(error)
    return f"{text} (error {number})" if number is not None else text


def _number(value: Any) -> int | None:
    """An integer field of squeue's JSON: a plain integer (before Slurm 23.11), or
    ``{"set": true, "infinite": false, "number": N}`` (since); None when unset, infinite or neither."""
    if isinstance(value, dict):
        if value.get("set") is False or value.get("infinite") is True:
            return None
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _age(job: dict[str, Any]) -> tuple[float, int]:
    """The order of age: started earlier, then the lower job id (a job without a start time last
    among equals, by its id)."""
    start = _number(job.get("start_time"))
    return (start if start is not None and start > 0 else float("inf"), int(job["job_id"]))


def _gres_gpus(detail: str) -> tuple[float, bool] | None:
    """The GPUs of one node's ``gres_detail`` string (``gpu:a100:2(IDX:0-1),tmpdisk:100``), and
    whether it names any; None when a GPU entry's count cannot be read. The IDX list is the cards
    held, so it decides; else ``CNT:N``, else the count after the last colon (a type may be digits).
    A MIG slice (``gpu:a100_1g.5gb:8(IDX:0-7)``: the IDX are the node's MIG devices, not its boards)
    counts as its sevenths of a board (until 2026-12-05 eight 1g slices, on two boards, read as all
    eight of the node's, and the job was given the node whole)."""
    sevenths, named = 0, False
    for name, groups in _GRES_ITEM.findall(detail):
        parts = name.strip().split(":")
        if parts[0] != "gpu":  # shard, mps, tmpdisk...: not whole GPUs
            continue
        named = True
        keys = dict(g.split(":", 1) for g in re.findall(r"\(([^)]*)\)", groups) if ":" in g)
        mig = _MIG_PROFILE.search(":".join(parts[1:]))
        share = min(int(mig.group(1)), MIG_SEVENTHS) if mig else MIG_SEVENTHS  # sevenths of a board each
        cards = _count_indexes(keys.get("IDX", ""))
        if cards is not None:
            sevenths += cards * share
        elif keys.get("CNT", "").isdigit():
            sevenths += int(keys["CNT"]) * share
        elif len(parts) > 1 and parts[-1].isdigit():
            sevenths += int(parts[-1]) * share
        else:
            return None
    return sevenths / MIG_SEVENTHS, named  # (whole sevenths: exact for whole boards)


def _count_indexes(indexes: str) -> int | None:
    """The number of device indexes in ``0-1,4`` (a hostlist bracket's syntax); None for anything
    else (none, ``N/A``)."""
    try:
        return sum(high - low + 1 for low, high, _ in _ranges(indexes, indexes))
    except HostlistError:
        return None


def _allocated_gpus(job: dict[str, Any]) -> Gpus:
    """The GPUs one squeue entry holds: per node from ``gres_detail`` (one string per host of
    ``nodes``, in its order) where it names a GPU, else in all from ``tres_alloc_str``'s
    ``gres/gpu=N``, else None (not given: a site without GPUs as GRES, or not tracking them)."""
    detail = job.get("gres_detail")
    if isinstance(detail, list) and detail and all(isinstance(d, str) for d in detail):
        try:
            hosts = expand_hostlist(str(job.get("nodes") or ""))
        except HostlistError:
            hosts = []
        read = [_gres_gpus(d) for d in detail]
        if len(hosts) == len(detail) and all(r is not None for r in read) and any(r[1] for r in read if r):
            per_host: dict[str, float] = {}
            for host, r in zip(hosts, read):
                per_host[host] = per_host.get(host, 0.0) + (r[0] if r else 0.0)
            return per_host
    tres = job.get("tres_alloc_str")
    match = _TRES_GPU.search(tres) if isinstance(tres, str) else None
    return float(match.group(1)) if match else None


def _together(held: list[Gpus]) -> Gpus:
    """The GPUs of a heterogeneous job's components together: per node when each gives them per
    node (a component holding none, 0, holds none on any node), else in all (a component that
    gives none adding none), None when none gives any."""
    held = [{} if h == 0 else h for h in held]
    if held and all(isinstance(h, dict) for h in held):
        per_node: dict[str, float] = {}
        for h in held:
            assert isinstance(h, dict)
            for host, n in h.items():
                per_node[host] = per_node.get(host, 0) + n
        return per_node
    given = [sum(h.values()) if isinstance(h, dict) else h for h in held if h is not None]
    return sum(given) if given else None


def _on_nodes(job: dict[str, Any], known: set[str]) -> bool:
    """Whether a running entry runs on any of the ``known`` nodes."""
    if "RUNNING" not in (_states(job) or ()):
        return False
    try:
        return any(host in known for host in expand_hostlist(str(job.get("nodes") or "")))
    except HostlistError:
        return False


def _whole_jobs(entries: list[dict[str, Any]], known: set[str]) -> list[tuple[dict[str, Any], Gpus]]:
    """``entries`` with each heterogeneous job's components made one entry: the leader's id, name
    and start, running when a component runs, on its running components' nodes (the others',
    when none runs; of these, those holding GPUs where some do), holding their GPUs. Other entries
    are returned as they are; each with the GPUs it holds (read before the components are joined:
    gres_detail follows each one's nodes). Where a running entry on the ``known`` nodes (the
    topology's) names its GPUs, one naming none holds 0 (the module docstring); a job elsewhere
    (another partition's, ``squeue --all``) or not running decides nothing for them."""
    allocated = [_allocated_gpus(job) for job in entries]
    gres_site = any(held is not None and _on_nodes(job, known) for job, held in zip(entries, allocated))
    held_by = {id(job): 0 if held is None and gres_site else held for job, held in zip(entries, allocated)}
    components: dict[int, list[dict[str, Any]]] = {}
    whole: list[tuple[dict[str, Any], Gpus]] = []
    for job in entries:
        het = _number(job.get("het_job_id"))
        if het:
            components.setdefault(het, []).append(job)
        else:
            whole.append((job, held_by[id(job)]))
    for het, parts in components.items():
        parts.sort(key=lambda j: (_number(j.get("het_job_offset")) or 0, int(j["job_id"])))
        running = [j for j in parts if "RUNNING" in (_states(j) or ())]
        leader = next((j for j in parts if int(j["job_id"]) == het), parts[0])
        starts = [t for t in (_number(j.get("start_time")) for j in parts) if t]
        chosen = running or parts
        on_gpus = [j for j in chosen if held_by[id(j)] != 0] or chosen  # a CPU launcher's nodes are not the job's
        whole.append(({"job_id": het, "name": leader.get("name"),
                       "job_state": ["RUNNING"] if running else sorted(_states(leader) or ()),
                       "nodes": ",".join(str(j.get("nodes") or "") for j in on_gpus if j.get("nodes")),
                       "start_time": min(starts) if starts else None},
                      _together([held_by[id(j)] for j in chosen])))
    return whole


def _uses_part(held: Gpus, nodes: list[str], node_gpus: dict[str, int]) -> bool:
    """Whether a job holding ``held`` GPUs leaves some GPUs of its ``nodes`` (the topology's) to
    others. A total (tres_alloc_str) counts the GPUs on nodes the topology does not know too, so a
    job also on such nodes may hide part of a known node: it is never left out wrongly, only missed.
    Not given at all: taken as whole nodes, as before GRES was read (no reason to drop every job)."""
    if held is None:
        return False
    if isinstance(held, dict):
        return any(held.get(node, 0) < node_gpus[node] for node in nodes)
    return held < sum(node_gpus[node] for node in nodes)


def _gpu_nodes(held: Gpus, nodes: list[str]) -> list[str]:
    """The nodes of ``nodes`` whose GPUs a job holding ``held`` takes some of: a CPU-only job (its GPUs
    given as 0) shares no GPU with a training job beside it on a GPU node; a total over several nodes
    cannot say which, so each counts."""
    if held is None:
        return nodes
    if isinstance(held, dict):
        return [node for node in nodes if held.get(node, 0) > 0]
    return nodes if held > 0 else []


def jobs_from_squeue(text: str, topology: Topology, min_nodes: int = 1) -> SlurmJobs:
    """The running jobs of ``squeue --json`` output on ``topology``'s nodes (see the module
    docstring for what is left out). Raises ``ValueError`` for output that is not squeue's JSON,
    and for output whose ``errors`` list is not empty (squeue failed, whatever its exit status)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise ValueError("no 'jobs' list: not the output of squeue --json")
    errors = data.get("errors")
    if errors:  # its jobs list is what squeue could read, most likely none: not "no job runs"
        errors = errors if isinstance(errors, list) else [errors]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValueError(f"squeue failed: {_error_text(errors[0])}{more}")
    known = set(topology.nodes)
    gpu_counts = np.bincount(np.asarray(topology.gpu_node, dtype=np.int64), minlength=len(topology.nodes))
    node_gpus = {node: int(gpu_counts[i]) for i, node in enumerate(topology.nodes)}
    out = SlurmJobs()
    entries = [j for j in data["jobs"]
               if isinstance(j, dict) and isinstance(j.get("job_id"), int) and _states(j) is not None]
    if len(entries) < len(data["jobs"]):
        out.left_out["malformed entry"] = len(data["jobs"]) - len(entries)
    # first every running job's nodes, whatever later leaves it out: a job too small for min_nodes,
    # or on part of a node, still holds its node, and the jobs beside it do not own that node
    running: list[tuple[dict[str, Any], Gpus, list[str]]] = []
    tenants: Counter[str] = Counter()  # node -> running jobs on it
    for job, held in sorted(_whole_jobs(entries, known), key=lambda pair: _age(pair[0])):
        if "RUNNING" not in (_states(job) or ()):
            out.left_out["not running"] += 1
            continue
        try:
            hosts = expand_hostlist(str(job.get("nodes") or ""))
        except HostlistError:
            out.left_out["unreadable node list"] += 1
            continue
        nodes = list(dict.fromkeys(h for h in hosts if h in known))
        for host in hosts:
            if host not in known:
                out.unknown_nodes[host] += 1
        on_gpus = _gpu_nodes(held, nodes)  # a CPU component's nodes are not the job's GPUs
        tenants.update(on_gpus)
        running.append((job, held, on_gpus if nodes and on_gpus else nodes))
    for job, held, nodes in running:  # oldest first, the order of the file's jobs
        if not nodes:
            out.left_out["no node of the topology"] += 1
        elif not _gpu_nodes(held, nodes):
            out.left_out["holds no GPU"] += 1
        elif _uses_part(held, nodes, node_gpus):
            out.left_out["uses part of a node"] += 1
        elif any(tenants[node] > 1 for node in nodes):
            out.left_out["shares a node with another job"] += 1
        elif len(nodes) < min_nodes:
            out.left_out[f"fewer than {min_nodes} nodes"] += 1
        else:
            out.jobs.append({"name": job_name(job), "nodes": nodes})
    return out


def with_jobs(topology: Topology, jobs: list[dict[str, Any]]) -> Topology:
    """``topology`` with its job list replaced (the hardware, and so its fingerprint, unchanged)."""
    data = topology.to_dict()
    data["jobs"] = jobs
    return Topology.from_dict(data, source="topology with the scheduler's jobs")
