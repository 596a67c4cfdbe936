"""Failure domains of a cluster, as the incident engine sees them.

A *domain* is a set of entities that one cause can hit together: a GPU, a node (fans, PSU),
a rack (its PDU, its coolant manifold), a cooling loop (CDU), a leaf switch, a link, an optic,
a job. Every domain has a key, an ``int`` (``level << 32 | slot``), so incidents and indexes
can use plain dict/set lookups, and a name for humans.

For every entity that a finding can name (GPU, node, rack, link, optic, job) this module gives
its *ancestors*: the domains that contain it, finest first. The incident engine groups
findings by shared ancestors and ranks the ancestors as candidate root causes.
"""

from __future__ import annotations

import numpy as np

from foreshock.topology import Topology, take_or

# Domain levels. The order is the nesting order on the thermal/power side (gpu < node < rack < loop).
GPU, NODE, RACK, LOOP, JOB, LINK, OPTIC, LEAF, PDU = range(9)
LEVEL_NAMES = ("gpu", "node", "rack", "cooling_loop", "job", "link", "optic", "leaf", "pdu")
"""The ``root_kind`` an incident rooted at a domain of that level reports."""

MEMBER_KINDS = ("gpu", "node", "rack", "link", "optic", "job")
"""Entity kinds that findings name, in the order of :data:`MEMBER_LEVEL`."""
MEMBER_LEVEL = {"gpu": GPU, "node": NODE, "rack": RACK, "link": LINK, "optic": OPTIC, "job": JOB}

_SHIFT = 32
_MASK = (1 << _SHIFT) - 1


def key(level: int, slot: int) -> int:
    """The domain key of ``slot`` at ``level``."""
    return (level << _SHIFT) | int(slot)


def level_of(k: int) -> int:
    return k >> _SHIFT


def slot_of(k: int) -> int:
    return k & _MASK


def _csr(parent: np.ndarray, n_parents: int) -> tuple[np.ndarray, np.ndarray]:
    """Children of each parent as (offsets, children); children with parent < 0 are left out."""
    parent = np.asarray(parent, dtype=np.int64)
    ok = parent >= 0
    children = np.flatnonzero(ok)
    order = np.argsort(parent[ok], kind="stable")
    children = children[order].astype(np.int64)
    counts = np.bincount(parent[ok], minlength=n_parents) if n_parents else np.zeros(0, np.int64)
    offsets = np.zeros(n_parents + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets, children


class Domains:
    """Parent relations of a topology as flat arrays, plus names and children of each domain."""

    def __init__(self, topology: Topology) -> None:
        t = topology
        self.topology = t
        self.loop_names = t.loops
        self.gpu_node = t.gpu_node.astype(np.int64)
        self.node_rack = t.node_rack.astype(np.int64)
        self.rack_loop = t.rack_loop.astype(np.int64)
        self.gpu_rack = self.node_rack[self.gpu_node] if len(self.gpu_node) else np.zeros(0, np.int64)
        self.gpu_loop = self.rack_loop[self.gpu_rack] if len(self.gpu_rack) else np.zeros(0, np.int64)
        self.gpu_job = t.gpu_job.astype(np.int64)
        n_gpus, n_nodes, n_racks = len(t.gpus), len(t.nodes), len(t.racks)
        # a node's job: the job of its GPUs (jobs hold whole nodes)
        self.node_job = np.full(n_nodes, -1, dtype=np.int64)
        if n_gpus:
            self.node_job[self.gpu_node] = self.gpu_job
        # fabric
        self.link_gpu = t.link_gpu.astype(np.int64)
        n_links = len(t.links)
        self.link_node = take_or(self.gpu_node, self.link_gpu)
        # the leaf of a link: the switch a GPU's NIC plugs into, or the lower end of an uplink
        self.link_leaf = np.where(self.link_gpu >= 0, t.link_b_switch, t.link_a_switch).astype(np.int64)
        self.link_job = take_or(self.gpu_job, self.link_gpu)
        self.gpu_link = np.full(n_gpus, -1, dtype=np.int64)
        nic = np.flatnonzero(self.link_gpu >= 0)
        self.gpu_link[self.link_gpu[nic]] = nic
        self.is_uplink = (self.link_gpu < 0) & (t.link_a_switch >= 0)
        # children of each domain
        self.node_gpus = _csr(self.gpu_node, n_nodes)
        self.rack_nodes = _csr(self.node_rack, n_racks)
        self.rack_gpus = _csr(self.gpu_rack, n_racks)
        self.loop_gpus = _csr(self.gpu_loop, len(self.loop_names))
        self.loop_racks = _csr(self.rack_loop, len(self.loop_names))
        self.job_gpus = _csr(self.gpu_job, len(t.jobs))
        self.node_links = _csr(self.link_node, n_nodes)  # NIC links of a node (rerouting siblings)
        self.leaf_uplinks = _csr(np.where(self.is_uplink, self.link_leaf, -1), len(t.switches))
        self.sizes = {"gpu": n_gpus, "node": n_nodes, "rack": n_racks, "link": n_links,
                      "optic": 2 * n_links, "job": len(t.jobs)}
        self._ancestors: dict[str, list[tuple[int, ...]]] = {}
        for kind in ("gpu", "node", "rack", "job"):
            self._ancestors[kind] = [self._compute_ancestors(kind, s) for s in range(self.sizes[kind])]

    # ---- ancestors -----------------------------------------------------------------------
    def ancestors(self, kind: str, slot: int) -> tuple[int, ...]:
        """Every domain that contains the entity, finest first (the entity's own domain first).

        Precomputed for GPUs, nodes, racks and jobs (a list by slot, made once: the engine asks
        for every finding, and numpy scalar lookups cost more than the grouping itself); links
        and optics, far more numerous and rarer in findings, are computed when asked."""
        table = self._ancestors.get(kind)
        if table is not None:
            if not 0 <= slot < len(table):  # a negative slot would index from the end: another entity
                raise ValueError(f"no {kind} with slot {slot}")
            return table[slot]
        return self._compute_ancestors(kind, int(slot))

    def _compute_ancestors(self, kind: str, s: int) -> tuple[int, ...]:
        if not 0 <= s < self.sizes.get(kind, 0):
            raise ValueError(f"no {kind} with slot {s}")
        if kind == "gpu":
            out = [key(GPU, s), key(NODE, int(self.gpu_node[s])), key(RACK, int(self.gpu_rack[s])),
                   key(LOOP, int(self.gpu_loop[s]))]
            if self.gpu_job[s] >= 0:
                out.append(key(JOB, self.gpu_job[s]))
            return tuple(out)
        if kind == "node":
            r = int(self.node_rack[s])
            out = [key(NODE, s), key(RACK, r), key(LOOP, self.rack_loop[r])]
            if self.node_job[s] >= 0:
                out.append(key(JOB, self.node_job[s]))
            return tuple(out)
        if kind == "rack":
            return (key(RACK, s), key(LOOP, self.rack_loop[s]))
        if kind == "link":
            return self._link_ancestors(s, ())
        if kind == "optic":
            return self._link_ancestors(s // 2, (key(OPTIC, s),))
        if kind == "job":
            return (key(JOB, s),)
        raise ValueError(f"unknown entity kind {kind!r}")

    def _link_ancestors(self, link: int, first: tuple[int, ...]) -> tuple[int, ...]:
        out = list(first) + [key(LINK, link)]
        if self.link_node[link] >= 0:
            out.append(key(NODE, self.link_node[link]))
        if self.link_leaf[link] >= 0:
            out.append(key(LEAF, self.link_leaf[link]))
        if self.link_job[link] >= 0:
            out.append(key(JOB, self.link_job[link]))
        return tuple(out)

    # ---- names -----------------------------------------------------------------------------
    def name(self, k: int) -> str:
        level, s = level_of(k), slot_of(k)
        t = self.topology
        if level == GPU:
            return t.gpus[s]
        if level == NODE:
            return t.nodes[s]
        if level in (RACK, PDU):
            return t.racks[s]
        if level == LOOP:
            return self.loop_names[s]
        if level == JOB:
            return t.jobs[s]
        if level == LINK:
            return t.links[s]
        if level == OPTIC:
            return t.name("optic", s)
        if level == LEAF:
            return t.switches[s]
        raise ValueError(f"unknown domain level {level}")

    def member_name(self, kind: str, slot: int) -> str:
        return self.topology.name(kind, int(slot))

    # ---- children ----------------------------------------------------------------------------
    @staticmethod
    def children(csr: tuple[np.ndarray, np.ndarray], parent: int) -> np.ndarray:
        offsets, items = csr
        if parent < 0 or parent + 1 >= len(offsets):
            return items[:0]
        return items[offsets[parent]:offsets[parent + 1]]

    def gpus_in(self, k: int) -> np.ndarray:
        """GPUs inside a domain (empty for fabric domains)."""
        level, s = level_of(k), slot_of(k)
        if level == GPU:
            return np.array([s], dtype=np.int64)
        if level == NODE:
            return self.children(self.node_gpus, s)
        if level in (RACK, PDU):
            return self.children(self.rack_gpus, s)
        if level == LOOP:
            return self.children(self.loop_gpus, s)
        if level == JOB:
            return self.children(self.job_gpus, s)
        return np.zeros(0, dtype=np.int64)

    def reroute_targets(self, link: int) -> np.ndarray:
        """Links that take a link's traffic when it goes down: the node's other NIC links (as
        NCCL's PXN moves traffic over NVLink to a sibling GPU), or the leaf's other uplinks."""
        if self.link_node[link] >= 0:
            sib = self.children(self.node_links, int(self.link_node[link]))
        elif self.is_uplink[link]:
            sib = self.children(self.leaf_uplinks, int(self.link_leaf[link]))
        else:
            return np.zeros(0, dtype=np.int64)
        return sib[sib != link]
