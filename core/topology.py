"""Cluster topology: cluster -> row (cooling loop) -> rack (PDU) -> node -> GPU; fabric switches,
links, an optic at each link end; jobs as sets of GPUs.

Every entity gets a stable integer *slot* per kind (its position in the file), and detector
state is arrays indexed by slot. Parent relations are int32 arrays so kernels can group by
node, rack, loop, leaf or job without Python objects.

YAML shape (``topology.yaml`` in a recording)::

    cluster: demo
    rows:     [{name: row0, cooling_loop: cdu0}]
    racks:    [{name: rack0, row: row0}]
    nodes:    [{name: node0, rack: rack0, gpus: 8}]      # GPUs are named node0/gpu0..7
    switches: [{name: leaf0, tier: leaf, rail: 0}, {name: spine0, tier: spine}]
    links:    [{name: node0/gpu0~leaf0, a: node0/gpu0, b: leaf0}]   # a: GPU NIC or switch
              # optional per link: fec_limit_ber (the pre-FEC BER its FEC corrects up to, e.g.
              # 3.7e-2 for a soft-decision DWDM transponder; absent = the detector's default)
    jobs:     [{name: job0, nodes: [node0]}]

Each link has two optics, named ``<link>#a`` and ``<link>#b``.

Names and references (``name``, ``row``, ``rack``, ``a``, ``b``, ``cooling_loop``, ``tier``,
``cluster`` and a job's ``nodes``) are read as written: ``name: 010`` is the node ``010``, not
YAML 1.1's octal 8, and ``rack: no`` the rack ``no``, not false. A key repeated in one mapping is
an error (YAML would keep the last value and drop the others silently). A node has at most
``MAX_GPU_INDEX + 1`` GPUs (``gpus`` left out: 8); a switch's ``rail`` is an integer in 0..2**31-1.

Only the keys shown above are read; any other key is an error naming it, where it is and the
keys allowed there (a misspelt ``gpu: 4`` was ignored, and the node got the default 8 GPUs; a
``cooling-loop:`` put the row on a loop of its own; a top-level ``job:`` listed no jobs). Keys
starting with ``x-`` or ``x_`` (docker-compose's convention for extension fields) are a site's
own notes, at the top level or in any entry (``x-pdu: pdu-a`` on a rack): not read, but kept,
so a file rewritten from the loaded topology (``foreshock topology jobs``) still has them. They
are no part of the fingerprints: changing a note does not change the hardware.

A link between two switches is an uplink from a leaf to a spine: its leaf is the end of tier
``leaf`` and its spine the end of tier ``spine``, whichever the file writes as ``a`` (the file's
order is kept for the optics: ``<link>#a`` is the optic at the end written ``a``). A link
between two switches of one tier (a leaf pair's MLAG peer link), or where
either end has another tier (a host's ``hca``, a DWDM ``transport`` device) is read as written,
``a`` its lower end.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import yaml

from .fields import ENTITY_KINDS


class TopologyError(ValueError):
    """A topology file or description is malformed; the message names the problem."""


MAX_GPU_INDEX = 1023
"""The largest GPU index a parser accepts (dcgm's ``gpu`` label, nvidia-smi's ``index``); a larger
one is counted as ``bad GPU index`` and its row left out. A topology derived from what a source
reads lists every GPU of a host up to the largest index it read, so one garbled index (4294967295,
a common "no index" sentinel) made a topology of billions of GPUs. DCGM handles 32 GPUs a host at
most (``DCGM_MAX_NUM_DEVICES``, DCGM 2.0 on); this leaves room for any node to come. A topology
file's node has at most ``MAX_GPU_INDEX + 1`` GPUs. (Defined here, not in ``streams/samples.py``
which uses it, because streams import core and not the other way.)"""

_RAIL_MAX = 2**31 - 1  # rails are kept in an int32 array

_SHOWN_CHARS = 80
_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdict = 4
_REPR.maxstring = _REPR.maxlong = _REPR.maxother = _SHOWN_CHARS


def shown(value: Any) -> str:
    """``repr(value)`` for an error message, at most about 80 characters. A value read from YAML
    may be an alias "billion laughs" (a few hundred bytes that expand to millions of strings,
    shared so loading is cheap): its full repr was a message of hundreds of millions of
    characters, seconds and gigabytes to build. Containers show their first few items."""
    text: str = _REPR.repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 4] + " ..."


def _text(value: Any, what: str) -> str:
    """A name or a reference to one as text. The YAML loader keeps names as written; a Python
    caller may use an int (``{"name": 7}``), which is the name ``"7"`` wherever it is used.
    Anything else (a float, bool, list, null) is refused: its text would not be what was meant."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise TopologyError(f"{what} is {shown(value)}: expected a name (text)")


UNKNOWN = "unknown"
"""The rack (and row, loop) that holds every node when a source does not say where nodes are:
a grouping, not a physical rack (no shared inlet)."""


def _i32(values: Sequence[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int32).reshape(-1)


@dataclass
class Topology:
    """Entities and their relations. Build with :meth:`from_dict`, :meth:`load` or the builders."""

    cluster: str
    rows: list[str]
    row_loop: list[str]  # cooling loop (CDU) name per row
    racks: list[str]
    rack_row: np.ndarray
    nodes: list[str]
    node_rack: np.ndarray
    gpus: list[str]
    gpu_node: np.ndarray
    gpu_index: np.ndarray  # index of the GPU inside its node
    switches: list[str] = field(default_factory=list)
    switch_tier: list[str] = field(default_factory=list)
    switch_rail: np.ndarray = field(default_factory=lambda: _i32([]))
    links: list[str] = field(default_factory=list)
    link_gpu: np.ndarray = field(default_factory=lambda: _i32([]))  # -1 for switch-switch
    # a switch-to-switch link between a leaf and a spine has its leaf as a and its spine as b,
    # whichever end the file wrote first (detectors group an uplink by its a end)
    link_a_switch: np.ndarray = field(default_factory=lambda: _i32([]))  # -1 when a is a GPU
    link_b_switch: np.ndarray = field(default_factory=lambda: _i32([]))
    link_fec_limit: np.ndarray = field(default_factory=lambda: np.zeros(0))  # NaN: not given
    jobs: list[str] = field(default_factory=list)
    job_nodes: list[np.ndarray] = field(default_factory=list)
    # per link, whether the file wrote its ends the other way round (spine as a): to_dict writes
    # them as written, so the optic names (``<link>#a``) keep meaning the same optics
    link_ends_swapped: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # a site's own ``x-``/``x_`` keys: at the top level, and per section ("racks", ...) per entity
    # name; kept for to_dict, no part of the fingerprints
    x_keys: dict[str, Any] = field(default_factory=dict)
    x_entry_keys: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._index: dict[str, dict[str, int]] = {}
        for kind in ENTITY_KINDS:
            names = self.names(kind)
            index = {name: i for i, name in enumerate(names)}
            if len(index) != len(names):
                dupes = sorted({n for n in names if names.count(n) > 1})[:3]
                raise TopologyError(f"duplicate {kind} names: {dupes}")
            self._index[kind] = index
        self._switch_index = {name: i for i, name in enumerate(self.switches)}
        fec = np.asarray(self.link_fec_limit, dtype=np.float64).reshape(-1)
        if not len(fec):
            fec = np.full(len(self.links), np.nan)
        if len(fec) != len(self.links):
            raise TopologyError(f"link_fec_limit has {len(fec)} entries for {len(self.links)} links")
        self.link_fec_limit = fec
        swapped = np.asarray(self.link_ends_swapped, dtype=bool).reshape(-1)
        self.link_ends_swapped = swapped if len(swapped) else np.zeros(len(self.links), dtype=bool)
        if len(self.link_ends_swapped) != len(self.links):
            raise TopologyError(f"link_ends_swapped has {len(swapped)} entries for {len(self.links)} links")
        self.gpu_job = np.full(len(self.gpus), -1, dtype=np.int32)
        for j, nodes in enumerate(self.job_nodes):
            mask = np.isin(self.gpu_node, nodes)
            if np.any(self.gpu_job[mask] >= 0):
                raise TopologyError(f"job {self.jobs[j]!r} shares nodes with another job")
            self.gpu_job[mask] = j

    # ---- names and slots ---------------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        if kind == "gpu":
            return self.gpus
        if kind == "node":
            return self.nodes
        if kind == "rack":
            return self.racks
        if kind == "link":
            return self.links
        if kind == "optic":
            return [f"{link}#{end}" for link in self.links for end in ("a", "b")]
        if kind == "job":
            return self.jobs
        raise TopologyError(f"unknown entity kind {kind!r}")

    def size(self, kind: str) -> int:
        if kind == "optic":
            return 2 * len(self.links)
        return len(self.names(kind))

    def slot(self, kind: str, name: str) -> int:
        """Slot of an entity; raises ``KeyError`` for an unknown one."""
        try:
            return self._index[kind][name]
        except KeyError:
            raise KeyError(f"unknown {kind} {name!r}") from None

    def slots(self, kind: str, names: Iterable[str]) -> np.ndarray:
        """Slots for many names; unknown names get -1 (callers count and report them)."""
        index = self._index[kind]
        return np.fromiter((index.get(n, -1) for n in names), dtype=np.int32)

    def slots_resolver(self) -> Callable[[str, str], int]:
        """``(kind, name) -> slot``, -1 when unknown: what record decoders need."""

        def resolve(kind: str, name: str) -> int:
            index = self._index.get(kind)
            return -1 if index is None else index.get(name, -1)

        return resolve

    def name(self, kind: str, slot: int) -> str:
        if kind == "optic":
            return f"{self.links[slot // 2]}#{'ab'[slot % 2]}"
        return self.names(kind)[slot]

    # ---- derived relations -------------------------------------------------------------
    @property
    def gpu_rack(self) -> np.ndarray:
        return self.node_rack[self.gpu_node]

    @property
    def physical_racks(self) -> np.ndarray:
        """Per rack, whether it is a real one (not the :data:`UNKNOWN` grouping of an import)."""
        return np.array([name != UNKNOWN for name in self.racks], dtype=bool)

    @property
    def loops(self) -> list[str]:
        return sorted(set(self.row_loop))

    @property
    def rack_loop(self) -> np.ndarray:
        loop_index = {name: i for i, name in enumerate(self.loops)}
        return _i32([loop_index[self.row_loop[r]] for r in self.rack_row])

    @property
    def optic_link(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.links), dtype=np.int32), 2)

    @property
    def link_leaf(self) -> np.ndarray:
        """The leaf switch of each GPU link (-1 for switch-to-switch links)."""
        return np.where(self.link_gpu >= 0, self.link_b_switch, -1).astype(np.int32)

    def switch(self, name: str) -> int:
        return self._switch_index[name]

    def gpus_of_node(self, node: int) -> np.ndarray:
        return np.flatnonzero(self.gpu_node == node).astype(np.int32)

    def gpus_of_rack(self, rack: int) -> np.ndarray:
        return np.flatnonzero(self.gpu_rack == rack).astype(np.int32)

    def gpus_of_job(self, job: int) -> np.ndarray:
        return np.flatnonzero(self.gpu_job == job).astype(np.int32)

    def labels(self, kind: str, slot: int) -> dict[str, str]:
        """Bounded Prometheus-style labels for an entity (cluster, rack, node, gpu, ...)."""
        out = {"cluster": self.cluster}
        if kind == "gpu":
            node = int(self.gpu_node[slot])
            out.update(
                rack=self.racks[self.node_rack[node]], node=self.nodes[node],
                gpu=str(int(self.gpu_index[slot])),
            )
        elif kind == "node":
            out.update(rack=self.racks[self.node_rack[slot]], node=self.nodes[slot])
        elif kind == "rack":
            out.update(rack=self.racks[slot])
        elif kind in ("link", "optic"):
            link = slot if kind == "link" else slot // 2
            out.update(link=self.links[link])
            if kind == "optic":
                out.update(end="ab"[slot % 2])
        elif kind == "job":
            out.update(job=self.jobs[slot])
        return out

    # ---- YAML --------------------------------------------------------------------------
    def to_dict(self, x_keys: bool = True) -> dict[str, Any]:
        """The YAML shape, each link's ends in the order its file wrote them, with the site's own
        ``x-`` keys unless ``x_keys`` is false (the fingerprints leave them out: notes are not
        hardware)."""
        gpus_per_node = np.bincount(self.gpu_node, minlength=len(self.nodes))
        link_end = lambda sw, gpu: self.switches[sw] if sw >= 0 else self.gpus[gpu]  # noqa: E731
        notes = self.x_entry_keys if x_keys else {}

        def x(section: str, name: str) -> dict[str, Any]:
            return notes.get(section, {}).get(name, {})

        def ends(i: int) -> tuple[str, str]:
            a, b = link_end(int(self.link_a_switch[i]), int(self.link_gpu[i])), self.switches[self.link_b_switch[i]]
            return (b, a) if self.link_ends_swapped[i] else (a, b)

        out = {
            "cluster": self.cluster,
            "rows": [{"name": r, "cooling_loop": loop, **x("rows", r)} for r, loop in zip(self.rows, self.row_loop)],
            "racks": [{"name": r, "row": self.rows[i], **x("racks", r)} for r, i in zip(self.racks, self.rack_row)],
            "nodes": [
                {"name": n, "rack": self.racks[self.node_rack[i]], "gpus": int(gpus_per_node[i]), **x("nodes", n)}
                for i, n in enumerate(self.nodes)
            ],
            "switches": [
                {"name": s, "tier": t, **({"rail": int(r)} if r >= 0 else {}), **x("switches", s)}
                for s, t, r in zip(self.switches, self.switch_tier, self.switch_rail)
            ],
            "links": [
                {
                    "name": name,
                    **dict(zip("ab", ends(i))),
                    **({"fec_limit_ber": float(self.link_fec_limit[i])} if np.isfinite(self.link_fec_limit[i]) else {}),
                    **x("links", name),
                }
                for i, name in enumerate(self.links)
            ],
            "jobs": [
                {"name": j, "nodes": [self.nodes[n] for n in nodes], **x("jobs", j)}
                for j, nodes in zip(self.jobs, self.job_nodes)
            ],
        }
        return {**out, **self.x_keys} if x_keys else out

    def hardware_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` without the jobs (nor the site's ``x-`` notes): the part a hardware
        fingerprint covers, and what a checkpoint keeps to move its state onto a changed topology
        (``core/remap.py``)."""
        return {k: v for k, v in self.to_dict(x_keys=False).items() if k != "jobs"}

    def fingerprint(self, jobs: bool = False) -> str:
        """A short digest of the entities and their slots: two topologies with equal fingerprints
        number their entities alike, so frames of one can be read against the other. Jobs have a
        fingerprint of their own (``jobs=True``): they change with the scheduler's work, the
        hardware does not, and only job frames depend on their numbering."""
        cache: dict[bool, str] = self.__dict__.setdefault("_fingerprints", {})
        if jobs not in cache:
            part = {"jobs": self.to_dict(x_keys=False)["jobs"]} if jobs else self.hardware_dict()
            canonical = json.dumps(part, sort_keys=True, separators=(",", ":"), default=str)
            cache[jobs] = hashlib.sha256(canonical.encode()).hexdigest()[:16]
        return cache[jobs]

    def job_keys(self) -> list[str]:
        """Per job slot, a short digest of the job's name and nodes: what a checkpoint keeps to
        find each job again under a new job list (``job_slot_map``). A job is the same only with
        the same name on the same nodes."""
        keys: list[str] | None = self.__dict__.get("_job_keys")
        if keys is None:
            keys = self.__dict__["_job_keys"] = [
                hashlib.sha256(json.dumps([name, sorted(self.nodes[n] for n in nodes)]).encode()).hexdigest()[:16]
                for name, nodes in zip(self.jobs, self.job_nodes)]
        return keys

    def job_slot_map(self, saved_keys: list[str]) -> np.ndarray:
        """For each job slot of a saved job list (its ``job_keys``), that job's slot in this
        topology, or -1 where it is no longer listed."""
        here = {k: j for j, k in enumerate(self.job_keys())}
        return np.array([here.get(k, -1) for k in saved_keys], dtype=np.int64)

    @classmethod
    def from_dict(cls, data: Any, source: str = "topology") -> "Topology":
        """Build from the YAML shape above; every problem raises :class:`TopologyError`."""
        try:
            return cls._from_dict(data, source)
        except TopologyError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            # a backstop for shapes the checks below do not foresee: the user gets the file and
            # the problem, not a traceback
            raise TopologyError(f"{source}: malformed topology: {exc}") from exc

    @classmethod
    def _from_dict(cls, data: Any, source: str) -> "Topology":
        if not isinstance(data, dict):
            raise TopologyError(f"{source}: expected a mapping at the top level")
        x_keys = _known_keys(data, _TOP_KEYS, "the top level", source)
        x_entry_keys: dict[str, dict[str, dict[str, Any]]] = {}

        def entries(key: str, required: bool = True) -> list[dict[str, Any]]:
            value = data.get(key, [] if not required else None)
            if value is None:
                # `jobs:` with nothing after it is YAML null: not missing, but empty, said so
                raise TopologyError(f"{source}: '{key}' is empty (null): expected a list of mappings"
                                    + ("" if required else f", or no '{key}' at all") if key in data
                                    else f"{source}: missing '{key}'")
            if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
                raise TopologyError(f"{source}: '{key}' must be a list of mappings")
            seen: set[str] = set()
            for n, e in enumerate(value):
                named = e.get("name")
                where = f"{key}[{n}]" + (f" ({shown(named)})" if isinstance(named, (str, int)) else "")
                notes = _known_keys(e, _ENTRY_KEYS[key], where, source)
                if e.get("name") is None:
                    raise TopologyError(f"{source}: {key}[{n}] has no 'name'")
                name = _text(e["name"], f"{source}: the name of {key}[{n}]")
                if not name.strip():  # an empty label in every series, and GPUs named "/gpu0"
                    raise TopologyError(f"{source}: {key}[{n}] has an empty name {name!r}")
                if name in seen:
                    raise TopologyError(f"{source}: duplicate name {name!r} in '{key}'")
                seen.add(name)
                if notes:
                    x_entry_keys.setdefault(key, {})[name] = notes
            return value

        def index_of(entities: list[dict[str, Any]]) -> dict[str, int]:
            return {_text(e["name"], "name"): i for i, e in enumerate(entities)}  # (entries checked them)

        def lookup(index: dict[str, int], name: Any, what: str, where: str) -> int:
            # by the same text as the definitions: `rack: 12` finds the rack named 12
            key = None if name is None else _text(name, f"{source}: {where}: the {what} it refers to")
            if key is None or key not in index:
                raise TopologyError(f"{source}: {where} refers to unknown {what} {shown(name)}")
            return index[key]

        rows = entries("rows")
        row_index = index_of(rows)
        racks = entries("racks")
        rack_index = index_of(racks)
        nodes = entries("nodes")
        node_index = index_of(nodes)
        gpus: list[str] = []
        gpu_node: list[int] = []
        gpu_idx: list[int] = []
        for i, n in enumerate(nodes):
            count = n.get("gpus", 8)
            # bool is an int to Python: `gpus: true` must not be one GPU
            if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_GPU_INDEX + 1:
                raise TopologyError(f"{source}: node {n['name']!r} has an invalid 'gpus' count {shown(count)}: "
                                    f"expected a whole number in 0..{MAX_GPU_INDEX + 1}")
            for g in range(count):
                gpus.append(f"{n['name']}/gpu{g}")
                gpu_node.append(i)
                gpu_idx.append(g)
        gpu_index = {name: i for i, name in enumerate(gpus)}
        switches = entries("switches", required=False)
        switch_index = index_of(switches)
        switch_rail = []
        for s in switches:
            rail = s.get("rail", -1)  # -1: no rail (a spine)
            if "rail" in s and (isinstance(rail, bool) or not isinstance(rail, int) or not 0 <= rail <= _RAIL_MAX):
                raise TopologyError(f"{source}: switch {s['name']!r} has 'rail' {shown(rail)}: "
                                    f"expected an integer in 0..{_RAIL_MAX} (or no 'rail')")
            switch_rail.append(rail)
        switch_tier = [_text(s.get("tier", "leaf"), f"{source}: switch {s['name']!r} tier") for s in switches]
        links = entries("links", required=False)
        link_gpu, link_a, link_b, link_fec, link_swapped = [], [], [], [], []
        for k, link in enumerate(links):
            a, b = link.get("a"), link.get("b")
            where = f"links[{k}] ({link['name']})"
            fec = link.get("fec_limit_ber")
            if fec is not None and (isinstance(fec, bool) or not isinstance(fec, (int, float)) or not 0.0 < fec < 0.5):
                raise TopologyError(f"{source}: {where} has fec_limit_ber {shown(fec)}: expected a BER in (0, 0.5)")
            link_fec.append(float(fec) if fec is not None else np.nan)
            b_switch = lookup(switch_index, b, "switch", where)
            if isinstance(a, str) and a in gpu_index:
                link_gpu.append(gpu_index[a])
                link_a.append(-1)
                link_b.append(b_switch)
                link_swapped.append(False)
                continue
            a_switch = lookup(switch_index, a, "GPU or switch", where)
            # an uplink's leaf is the a end for every reader (incident domains, congestion, the
            # fabric model): by the tiers, not by the order the file happens to write the ends in
            ranks = _TIER_RANK.get(switch_tier[a_switch]), _TIER_RANK.get(switch_tier[b_switch])
            swap = ranks[0] is not None and ranks[1] is not None and ranks[0] > ranks[1]
            link_gpu.append(-1)
            link_a.append(b_switch if swap else a_switch)
            link_b.append(a_switch if swap else b_switch)
            link_swapped.append(swap)
        jobs = entries("jobs", required=False)
        job_nodes = []
        for j in jobs:
            members = j.get("nodes", [])
            if not isinstance(members, list):  # a string would be walked letter by letter
                raise TopologyError(f"{source}: job {j['name']!r} has 'nodes' {shown(members)}: "
                                    "expected a list of node names")
            job_nodes.append(_i32([lookup(node_index, nn, "node", f"job {j['name']!r}") for nn in members]))
        kwargs: dict[str, Any] = dict(
            cluster=_text(data.get("cluster", "cluster"), f"{source}: 'cluster'"),
            rows=list(row_index),
            row_loop=[_text(r.get("cooling_loop", r["name"]), f"{source}: row {r['name']!r} cooling_loop")
                      for r in rows],
            racks=list(rack_index),
            rack_row=_i32([lookup(row_index, r.get("row"), "row", f"rack {r['name']!r}") for r in racks]),
            nodes=list(node_index),
            node_rack=_i32([lookup(rack_index, n.get("rack"), "rack", f"node {n['name']!r}") for n in nodes]),
            gpus=gpus,
            gpu_node=_i32(gpu_node),
            gpu_index=_i32(gpu_idx),
            switches=list(switch_index),
            switch_tier=switch_tier,
            switch_rail=_i32(switch_rail),
            links=list(index_of(links)),
            link_gpu=_i32(link_gpu),
            link_a_switch=_i32(link_a),
            link_b_switch=_i32(link_b),
            link_fec_limit=np.asarray(link_fec, dtype=np.float64),
            jobs=list(index_of(jobs)),
            job_nodes=job_nodes,
            link_ends_swapped=np.asarray(link_swapped, dtype=bool),
            x_keys=x_keys,
            x_entry_keys=x_entry_keys,
        )
        try:
            return cls(**kwargs)
        except TopologyError as exc:  # relations that only the built object can check
            raise TopologyError(f"{source}: {exc}") from None

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(
            yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False, default_flow_style=None),
            encoding="utf-8",
        )

    @classmethod
    def load(cls, path: str | Path) -> "Topology":
        path = Path(path)
        try:
            data = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
        except FileNotFoundError:
            raise TopologyError(f"{path}: no such topology file") from None
        except OSError as exc:  # a folder, a file it may not read: the user gets why, not a traceback
            raise TopologyError(f"{path}: cannot read the topology file: {exc.strerror or exc}") from None
        except DuplicateKeyError as exc:
            raise TopologyError(f"{path}: {exc.problem}") from None
        except yaml.YAMLError as exc:
            raise TopologyError(f"{path}: not valid YAML: {exc}") from None
        except UnicodeDecodeError:
            raise TopologyError(f"{path}: not UTF-8 text") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_gpu_hosts(cls, hosts_and_gpus: Iterable[tuple[str, int]], cluster: str = "imported") -> "Topology":
        """Derive a topology from source labels (hostname + GPU index), as an importer sees them.

        Racks are unknown to such sources: every node goes into one rack, :data:`UNKNOWN`.
        """
        per_host: dict[str, int] = {}
        for host, gpu in hosts_and_gpus:
            per_host[host] = max(per_host.get(host, 0), int(gpu) + 1)
        return cls.from_dict(
            {
                "cluster": cluster,
                "rows": [{"name": UNKNOWN, "cooling_loop": UNKNOWN}],
                "racks": [{"name": UNKNOWN, "row": UNKNOWN}],
                "nodes": [{"name": h, "rack": UNKNOWN, "gpus": n} for h, n in sorted(per_host.items())],
            }
        )


_TOP_KEYS = frozenset({"cluster", "rows", "racks", "nodes", "switches", "links", "jobs"})
_ENTRY_KEYS = {
    "rows": frozenset({"name", "cooling_loop"}),
    "racks": frozenset({"name", "row"}),
    "nodes": frozenset({"name", "rack", "gpus"}),
    "switches": frozenset({"name", "tier", "rail"}),
    "links": frozenset({"name", "a", "b", "fec_limit_ber"}),
    "jobs": frozenset({"name", "nodes"}),
}
_X_PREFIXES = ("x-", "x_")  # a site's own keys (docker-compose's extension fields)
_TIER_RANK = {"leaf": 0, "spine": 1}  # the tiers whose order says which end of an uplink is its leaf


def _known_keys(mapping: dict[Any, Any], allowed: frozenset[str], where: str, source: str) -> dict[str, Any]:
    """The mapping's ``x-`` keys (a site's notes, kept), after checking every other key is one the
    loader reads: an unknown one, most often a misspelt one (``gpu: 4``), would otherwise be
    ignored and its default used in silence."""
    notes: dict[str, Any] = {}
    for key in mapping:
        if isinstance(key, str) and key.startswith(_X_PREFIXES):
            notes[key] = mapping[key]
        elif key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TopologyError(f"{source}: {where} has an unknown key {shown(key)}{hint} (allowed there: "
                                f"{', '.join(sorted(allowed))}; a site's own notes go under keys starting "
                                "with 'x-' or 'x_')")
    return notes


def take_or(values: np.ndarray, index: np.ndarray, fill: int = -1) -> np.ndarray:
    """``values[index]`` where ``index >= 0``, ``fill`` where it is -1 (no such parent).

    Safe when ``values`` is empty (a topology without GPUs, jobs or switches), where the
    ``np.where(index >= 0, values[np.maximum(index, 0)], fill)`` idiom raises.
    """
    index = np.asarray(index)
    out = np.full(index.shape, fill, dtype=np.int64)
    has = index >= 0
    out[has] = np.asarray(values)[index[has]]
    return out


_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Keys whose values are names or references to names, kept as the text written
_NAME_KEYS = frozenset({"name", "row", "rack", "a", "b", "cooling_loop", "tier", "cluster"})
_NULL_TAG = "tag:yaml.org,2002:null"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A key given twice in one mapping (``problem`` names it and both lines)."""


_DuplicateKeyError = DuplicateKeyError  # (the old, private name)


def _written(node: yaml.Node) -> bool:
    """Whether a node is a scalar YAML 1.1 would read as other than text or null (010 -> 8,
    1.10 -> 1.1, no -> False, 2024-01-01 -> a date), whose source text is the name meant."""
    return isinstance(node, yaml.ScalarNode) and node.tag not in (_NULL_TAG, "tag:yaml.org,2002:str")


class UniqueKeyLoader(_SafeLoader):  # type: ignore[misc]  # (CSafeLoader has no stubs)
    """The safe loader, but names stay as written (YAML 1.1 turns unquoted ``010`` into 8 and
    ``1.10`` into 1.1, and every record for ``010/gpu0`` would then be an unknown entity) and a
    repeated key is an error (YAML keeps the last value: a second ``nodes:`` block would drop the
    first). Only name-like keys are kept as text: ``gpus``, ``rail`` and thresholds stay numbers."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # `<<: *base`: overridden keys are the point of it
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in first_line:
                    raise DuplicateKeyError(
                        None, None, f"line {line}: key {key!r} given twice in one mapping "
                        f"(first on line {first_line[key]}); YAML would keep only the last",
                        key_node.start_mark)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            first_line[key] = line
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        # the base class flattened `<<: *base` into node.value, the merged pairs first: the last
        # pair of a key is the one the mapping holds, and only its text may replace the value
        # (the merged default's `rack: 01` written back over the node's own `rack: r2` put the
        # node in the default's rack)
        last: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            last[key_node.value if isinstance(key_node, yaml.ScalarNode) else None] = value_node
        for key, value_node in last.items():
            if key in _NAME_KEYS and _written(value_node):
                mapping[key] = value_node.value
            elif key == "nodes" and isinstance(value_node, yaml.SequenceNode) and any(
                    _written(item) for item in value_node.value):  # a job's node list
                mapping[key] = [item.value if _written(item) else self.construct_object(item, deep=True)
                                for item in value_node.value]
        return mapping


_Loader = UniqueKeyLoader  # (the old, private name)
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
