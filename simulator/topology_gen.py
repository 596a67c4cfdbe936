"""Generate the topology of a simulated cluster (an H100/H200 SXM training cluster by default).

- nodes of 8 GPUs; ``nodes_per_rack`` nodes per rack (one PDU each); ``racks_per_row`` racks
  per row, and each row is one cooling loop (CDU);
- a rail-optimised fabric: each GPU has one NIC; a scalable unit (SU) of ``nodes_per_su``
  nodes has one leaf per rail, and GPU ``r`` of every node in the SU links to the SU's rail-``r``
  leaf; each leaf has ``uplinks`` links, one to each spine of its rail's spine group;
- an optic at each link end (the topology names them ``<link>#a`` / ``<link>#b``);
- jobs occupying sets of whole nodes, with some nodes left idle.

Names: ``node12/gpu3``, ``rack3``, ``row0`` (loop ``cdu0``), ``su0-leaf3``, ``rail3-spine5``,
links ``node12/gpu3~su0-leaf3`` and ``su0-leaf3~rail3-spine5``, jobs ``job7``.
"""

from __future__ import annotations

import numpy as np

from foreshock.topology import Topology, shown

GPUS_PER_NODE = 8
MAX_GPUS = 131_072
"""The largest simulated cluster: 8x the 16,384-GPU clusters the simulator is benchmarked at
(README). A size past it is most likely a typo (``--gpus 1000000000`` for 1000) and would build
its topology until memory ran out, a MemoryError minutes later instead of a usage error now."""
JOB_SIZES_NODES = (2, 4, 8, 16, 32, 64)


def cluster_size_problem(gpus: object) -> str | None:
    """What is wrong with ``gpus`` as a simulated cluster's size, None if nothing: the rule of
    ``simulate --gpus``, ``demo --gpus``, ``agent --gpus`` and a scenario's ``defaults`` (whole
    nodes of 8 GPUs, at least one, at most :data:`MAX_GPUS`). The callers name the value (``--gpus``,
    ``defaults: gpus``)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < GPUS_PER_NODE or gpus % GPUS_PER_NODE:
        return (f"must be a whole number of GPUs, at least {GPUS_PER_NODE} and a multiple of {GPUS_PER_NODE}, "
                f"not {shown(gpus)}")
    if gpus > MAX_GPUS:
        return (f"must be at most {MAX_GPUS:,} GPUs (8x the 16,384-GPU clusters the simulator is built for: "
                f"a larger number is likely a typo, and would take all memory), not {gpus:,}")
    return None


def build_topology(
    gpus: int,
    *,
    nodes_per_rack: int = 4,
    racks_per_row: int = 4,
    nodes_per_su: int = 32,
    uplinks: int | None = None,
    job_nodes: int | None = None,
    idle_fraction: float = 0.08,
    seed: int = 0,
    cluster: str = "sim",
) -> Topology:
    """Build a cluster of ``gpus`` GPUs (a multiple of 8).

    ``uplinks`` per leaf default to half the leaf's downlinks (800G up, 400G down: non-blocking),
    at most 16. ``job_nodes`` fixes every job's size in nodes (else sizes are drawn from powers of
    two, seeded); ``idle_fraction`` of the nodes are left out of every job.
    """
    size_problem = cluster_size_problem(gpus)
    if size_problem:
        raise ValueError(f"gpus {size_problem}")
    if nodes_per_rack <= 0 or racks_per_row <= 0 or nodes_per_su <= 0:
        raise ValueError("nodes_per_rack, racks_per_row and nodes_per_su must be positive")
    if not 0.0 <= idle_fraction < 1.0:
        raise ValueError("idle_fraction must be in [0, 1)")
    n_nodes = gpus // GPUS_PER_NODE
    n_racks = -(-n_nodes // nodes_per_rack)
    n_rows = -(-n_racks // racks_per_row)
    n_su = -(-n_nodes // nodes_per_su)
    su_size = min(nodes_per_su, n_nodes)
    n_up = uplinks if uplinks is not None else min(16, max(1, su_size // 2))
    if n_up <= 0:
        raise ValueError("uplinks must be positive")

    rows = [{"name": f"row{r}", "cooling_loop": f"cdu{r}"} for r in range(n_rows)]
    racks = [{"name": f"rack{k}", "row": f"row{k // racks_per_row}"} for k in range(n_racks)]
    nodes = [{"name": f"node{n}", "rack": f"rack{n // nodes_per_rack}", "gpus": GPUS_PER_NODE}
             for n in range(n_nodes)]
    switches: list[dict[str, object]] = []
    for su in range(n_su):
        for rail in range(GPUS_PER_NODE):
            switches.append({"name": f"su{su}-leaf{rail}", "tier": "leaf", "rail": rail})
    for rail in range(GPUS_PER_NODE):
        for s in range(n_up):
            switches.append({"name": f"rail{rail}-spine{s}", "tier": "spine", "rail": rail})
    links = []
    for n in range(n_nodes):
        su = n // nodes_per_su
        for rail in range(GPUS_PER_NODE):
            gpu, leaf = f"node{n}/gpu{rail}", f"su{su}-leaf{rail}"
            links.append({"name": f"{gpu}~{leaf}", "a": gpu, "b": leaf})
    for su in range(n_su):
        for rail in range(GPUS_PER_NODE):
            leaf = f"su{su}-leaf{rail}"
            for s in range(n_up):
                spine = f"rail{rail}-spine{s}"
                links.append({"name": f"{leaf}~{spine}", "a": leaf, "b": spine})
    jobs = _place_jobs(n_nodes, job_nodes, idle_fraction, np.random.default_rng(seed))
    return Topology.from_dict(
        {"cluster": cluster, "rows": rows, "racks": racks, "nodes": nodes, "switches": switches,
         "links": links, "jobs": jobs}
    )


def _place_jobs(n_nodes: int, job_nodes: int | None, idle_fraction: float,
                rng: np.random.Generator) -> list[dict[str, object]]:
    """Pack jobs onto consecutive nodes, leaving about ``idle_fraction`` of them idle."""
    jobs: list[dict[str, object]] = []
    n_idle = int(round(idle_fraction * n_nodes))
    idle = set(rng.choice(n_nodes, size=n_idle, replace=False).tolist()) if n_idle else set()
    free = [n for n in range(n_nodes) if n not in idle]
    i = 0
    while i < len(free):
        if job_nodes is not None:
            size = job_nodes
        else:
            fits = [s for s in JOB_SIZES_NODES if s <= max(2, len(free) // 4)] or [1]
            size = int(rng.choice(fits))
        members = free[i:i + size]
        jobs.append({"name": f"job{len(jobs)}", "nodes": [f"node{n}" for n in members]})
        i += size
    return jobs
