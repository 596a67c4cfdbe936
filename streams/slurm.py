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
``warnings`` are not errors. Nothing else is read.

An entry without an integer ``job_id``, or whose ``job_state`` is neither a string nor a list of
strings, is left out as a malformed entry (counted). A job is left out, and counted by reason,
when it is not running, runs on no node of the topology, or shares a node with an older job
(several small jobs on one node are not the synchronous kind). Older means started earlier
(``start_time``: an integer before Slurm 23.11, ``{set, infinite, number}`` since), then the lower
job id: job ids alone would put a job started after the ids wrapped (past ``MaxJobId``, 67,043,328
by default) before the jobs of the day before. The components of a heterogeneous job
(``het_job_id``, the leader's job id, non-zero; ``het_job_offset`` 0, 1, ...) are one job, named
after the leader, on the nodes of its running components.
Nodes the topology does not know (CPU nodes, another cluster's) are dropped from a job and
counted.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

from foreshock.topology import Topology

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


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
    numbers: list[str] = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise HostlistError(f"bad range {part!r} in hostlist {expression!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostlistError(f"descending range {part!r} in hostlist {expression!r}")
        width = len(low)
        numbers.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    tails = _expand_item(rest, expression) if rest else [""]
    return [f"{prefix}{n}{tail}" for n in numbers for tail in tails]


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


def _whole_jobs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` with each heterogeneous job's components made one entry: the leader's id, name
    and start, running when a component runs, on its running components' nodes (the others',
    when none runs). Other entries are returned as they are."""
    components: dict[int, list[dict[str, Any]]] = {}
    whole: list[dict[str, Any]] = []
    for job in entries:
        het = _number(job.get("het_job_id"))
        if het:
            components.setdefault(het, []).append(job)
        else:
            whole.append(job)
    for het, parts in components.items():
        parts.sort(key=lambda j: (_number(j.get("het_job_offset")) or 0, int(j["job_id"])))
        running = [j for j in parts if "RUNNING" in (_states(j) or ())]
        leader = next((j for j in parts if int(j["job_id"]) == het), parts[0])
        starts = [t for t in (_number(j.get("start_time")) for j in parts) if t]
        whole.append({"job_id": het, "name": leader.get("name"),
                      "job_state": ["RUNNING"] if running else sorted(_states(leader) or ()),
                      "nodes": ",".join(str(j.get("nodes") or "") for j in (running or parts) if j.get("nodes")),
                      "start_time": min(starts) if starts else None})
    return whole


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
    out = SlurmJobs()
    taken: set[str] = set()
    entries = [j for j in data["jobs"]
               if isinstance(j, dict) and isinstance(j.get("job_id"), int) and _states(j) is not None]
    if len(entries) < len(data["jobs"]):
        out.left_out["malformed entry"] = len(data["jobs"]) - len(entries)
    for job in sorted(_whole_jobs(entries), key=_age):
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
        if not nodes:
            out.left_out["no node of the topology"] += 1
        elif len(nodes) < min_nodes:
            out.left_out[f"fewer than {min_nodes} nodes"] += 1
        elif taken.intersection(nodes):
            out.left_out["shares a node with an older job"] += 1
        else:
            taken.update(nodes)
            out.jobs.append({"name": job_name(job), "nodes": nodes})
    return out


def with_jobs(topology: Topology, jobs: list[dict[str, Any]]) -> Topology:
    """``topology`` with its job list replaced (the hardware, and so its fingerprint, unchanged)."""
    data = topology.to_dict()
    data["jobs"] = jobs
    return Topology.from_dict(data, source="topology with the scheduler's jobs")
