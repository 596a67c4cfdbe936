"""The incident engine: findings grouped by cause, with a root cause, a blast radius and a cost.

One failing cooling loop throttles dozens of GPUs; one degrading optic takes its link down and
congests the links that take its traffic. The engine turns such bursts of findings into **one
incident per cause**, updated as it grows:

- **Grouping.** Every finding is reduced to a *signal* (:mod:`.incident_signals`) on a member
  entity (GPU, node, rack, link, optic, job). A finding joins, in order: the incident its
  entity already belongs to; the incident of an entity its reason names (congestion names the
  link whose traffic it carries, a link-down prediction the optic that fails); an incident
  whose root domain contains the entity; or, for a finding that can open one, an incident that
  shares a failure domain with it (node, rack, cooling loop, PDU, leaf) and is still growing —
  when together they are enough evidence for that domain (:data:`SUPPORT`) and, ranked
  together, root there or above (a node's fans and a hot GPU on the next node are enough GPUs
  for the rack, but the node explains nearly all of it). Otherwise it opens a new incident.
  Incidents that turn out to share a domain the same way are merged (the oldest id stays) — a
  rack's inlet or a node's fans or PSU that comes after finer incidents under it opened takes
  them in, as it would have coming first, so one frame's findings group alike in any order — and
  so are fabric incidents of links failing together on most of a node's or a leaf's links (a
  leaf switch dying: one incident, rooted at the leaf). Members left outside a root that
  narrowed as the evidence grew (three GPUs of two nodes ranked at their rack, then the rest
  of one node heating) go to an incident of their own.
  Independent causes stay apart: a finding of another kind on an entity already in an incident
  (a GPU of an overheating loop that falls off the bus) starts its own unless it is a known
  consequence (XID 48 after HBM heat); a loop or rack incident that stopped spreading more than
  ``coherence_s`` ago does not claim a GPU that only now starts heating (a fan, a thermal
  interface); symptoms that open nothing by themselves (power caps, peer outliers, optic
  trends, z-score blips) only ever join; a GPU back on the bus after its XID 79 incident resolved
  differs from its peers for a while, and what is said of it then without an observed effect is
  counted in that incident, opening nothing (``reopen_s``).
- **Root cause.** Candidate domains are ranked by how much of the incident's evidence they
  explain: the finest domain that holds ``cover`` (80 %) of the members' weight and has the
  support its level needs is the root — many GPUs of one loop with inlet rising on its racks ->
  the loop; one GPU heating while its peers stay calm -> that GPU's thermal interface; an optic
  trending to failure, its link down, congestion on the links that took its traffic -> the optic.
- **Lifecycle.** ``open`` (first reported, after ``hold_s`` so the first wave of findings is
  grouped before anyone is told) -> ``growing`` (members added) -> ``stable`` (no new member
  for ``stable_s``) -> ``resolved`` (no finding and no active prediction for ``quiet_s``). An
  :class:`~foreshock.findings.Incident` is emitted only when the members, the root or the
  state change, at most every ``update_interval_s`` for growth — never once per new member.
  ``growing`` says a member joined or fired again; an update whose members only left (split off
  to an incident of their own, left out by a move onto other hardware) keeps the state it had, as
  does one whose cost moved: a job slowed joined or left, or a job's slowdown moved by
  ``JOB_SLOWDOWN_STEP`` (an optic's incident, told x1.04 as it settled, had read x1.19 for three
  hours untold), and one whose spread turned: an entity it had not named heads its list of who is
  exposed next (``SPREAD_HEAD``).
- **Predicted spread.** Members with an active prediction that has not come true yet (ETA from
  the detector), then entities exposed to the same cause that show nothing yet — the rest of
  the loop, PDU or node, the links that take rerouted traffic — ranked by their headroom
  (thermal margin, link capacity) when telemetry is given to :meth:`IncidentEngine.observe_frame`.
- **Job impact.** In synchronous training the slowest member sets the pace: a job's predicted
  step slowdown is the worst of its members' (:attr:`Signal.slowdown`, or the measured step
  time), and GPU-hours at risk per hour is ``GPUs × (1 − 1/slowdown)`` summed over jobs.
- **External events.** JSON lines ``{"node", "time", "type", "severity"}`` from a scheduler or a
  BMC (:mod:`.incident_external`) are grouped the same way, as node findings.

State is bounded: per-entity arrays by slot, incidents in a dict holding only the live ones and
the resolved ones that may still reopen (within ``reopen_s``, at most ``keep_resolved``).

>>> from foreshock.topology import Topology
>>> from foreshock.findings import Prediction
>>> topo = Topology.from_dict({"rows": [{"name": "row0", "cooling_loop": "cdu0"}],
...     "racks": [{"name": "rack0", "row": "row0"}, {"name": "rack1", "row": "row0"}],
...     "nodes": [{"name": f"n{i}", "rack": f"rack{i // 2}", "gpus": 4} for i in range(4)]})
>>> engine, out = IncidentEngine(topo), []
>>> for t in range(0, 300, 10):             # GPUs of every rack on the loop heat up together
...     out += engine.observe([Prediction(float(t), "gpu", g, "thermal_throttle", 600.0, 0.9, "thermal")
...                            for g in range(0, 16, 3) if t >= 3 * g], float(t))
>>> inc = out[-1]
>>> (inc.root_kind, inc.root_entity, inc.state, len(inc.members), len({i.incident_id for i in out}))
('cooling_loop', 'cdu0', 'open', 6, 1)
"""

from __future__ import annotations

import heapq
import math
import re
import time
from collections import deque
from typing import Any, Hashable, Iterable, Sequence

import numpy as np

from foreshock.findings import Anomaly, Finding, Incident, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.remap import Remap
from foreshock.topology import Topology

from .incident_domains import (GPU, JOB, LEAF, LEVEL_NAMES, LINK, LOOP, MEMBER_LEVEL, NODE, OPTIC, PDU, RACK,
                               Domains, key, level_of, slot_of)
from .incident_external import ExternalEvent
from .incident_impact import TEL_OUTSIDE, TX_NOT_SANE, Telemetry, exposed_gpus, job_impact, reroute_targets_ranked
from .incident_signals import (EVENT_SIGNALS, FABRIC, GENERIC, JOBF, LOST, POWER, SIGNALS, THERMAL, Signal, classify,
                               clock_deficit_slowdown, external_signal, xid_code)

PENDING, OPEN, GROWING, STABLE, RESOLVED = "pending", "open", "growing", "stable", "resolved"

LEVELS: dict[str, tuple[int, ...]] = {
    THERMAL: (GPU, NODE, RACK, LOOP),
    POWER: (GPU, NODE, RACK),
    LOST: (GPU, NODE, RACK),
    GENERIC: (GPU, NODE, RACK, LOOP),
    JOBF: (JOB,),
    FABRIC: (OPTIC, LINK, NODE, LEAF),
}
"""Candidate root levels per family, finest first."""

LADDER: dict[str, tuple[int, ...]] = {
    THERMAL: (NODE, RACK, LOOP),
    POWER: (NODE, RACK),
    LOST: (NODE, RACK),
    GENERIC: (NODE, RACK, LOOP),
    FABRIC: (LINK, NODE, LEAF),
    JOBF: (),
}
"""Shared domains across which a finding may join (or merge) another incident of its family."""

SUPPORT: dict[int, tuple[int, int, int]] = {
    # level: (GPUs, distinct children, entity members of the level's own kind that suffice)
    NODE: (2, 1, 1),  # two GPUs of one node, or a node-level finding (fans, PSU)
    RACK: (3, 2, 1),  # three GPUs on two nodes, a rack-level finding (inlet, PDU), or node findings on two nodes
    LOOP: (3, 2, 1),  # three GPUs on two racks, or racks whose inlet rises
}
"""What a domain above the GPU needs before it may be a root: (GPUs under it, distinct children
holding them, or members of its own level). A lone GPU never makes its node the root, nor one
node's finding its rack."""

FAILING_LINK = frozenset({"link_down", "link_down_predicted", "link_errors", "optic_degrading", "external_fabric"})
MAX_EXTERNAL_TYPES = 16
OTHER_EXTERNAL = "other external events"
DUPLICATE_EXTERNAL = "external event taken before (the same node, time, type and severity): skipped"
FORGOTTEN_EXTERNAL = "external event dated before the events remembered (a repeat cannot be told): refused"
EXTERNAL_SEEN_PRUNE = 4096
"""External events remembered before the first pruning of those too old to matter."""
HINTS = {
    (THERMAL, GPU): "tim_degradation", (THERMAL, NODE): "fan_failure", (THERMAL, RACK): "rack_cooling",
    (THERMAL, LOOP): "cooling_loss", (POWER, GPU): "power_brake", (POWER, NODE): "psu_failure",
    (POWER, RACK): "pdu_failure", (LOST, GPU): "gpu_error", (LOST, NODE): "node_lost", (LOST, RACK): "rack_lost",
    (FABRIC, OPTIC): "optic_degradation", (FABRIC, LINK): "link_failure", (FABRIC, NODE): "nic_congestion",
    (FABRIC, LEAF): "leaf_congestion", (JOBF, JOB): "job_slowdown",
}

MAX_SPLIT_DEPTH = 8
"""Splits (:meth:`IncidentEngine._split_off_outsiders`) under way at once, at most: what one splits
off is ranked, and may be split again; past this depth it keeps its outsiders, as before splits."""

MAX_BURSTS = 4
"""Re-fires an incident keeps (and names in its reason): the latest ones."""
JOB_SLOWDOWN_STEP = 0.1
"""A job's step slowdown moving this much (x1.04 to x1.14) since its incident was last told is a
change worth telling (``IncidentEngine._told_moved``), at most every ``update_interval_s``. At
0.05 a flapping link's job, measured at x1.16 and x1.21 by turns, was told again eight times."""
SPREAD_HEAD = 3
"""The entities an incident names first as next to be hit (soonest, least headroom), what the console
shows: one of them that the incident had not named when last told, and not due now (ETA 0: overdue
predictions tie there and sort by name), is told at once (at most every ``update_interval_s``,
``IncidentEngine._told_moved``). Further down the list names come and go with
each wobble of an ETA (every 30 s on a loop's loss of 132 GPUs, when the whole list counted)."""
REFIRE_TIME = "%Y-%m-%d %H:%M:%S UTC"
"""How a re-fire note writes its time (:func:`refire_note`; the console reads it back)."""
REFIRE_NOTE = re.compile(r"; (fired again|new cause) at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC): (\S+) (\S+?)"
                         r"(?: \((\S+)\))?, (\d+) members?")
"""How a re-fire reads at the end of an incident's reason (:func:`refire_notes` reads it back)."""


def refire_note(ts: float, same_root: bool, root_kind: str, name: str, hint: str, n: int) -> str:
    """The note an incident's reason carries for members that went quiet and then fired again
    at ``ts``: the incident's own root failing again, or a new cause under entities it holds."""
    when = time.strftime(REFIRE_TIME, time.gmtime(ts))
    what = f"fired again at {when}: {root_kind} {name}" if same_root else \
        f"new cause at {when}: {root_kind} {name} ({hint})"
    return f"; {what}, {n} member{'' if n == 1 else 's'}"


def refire_notes(reason: str) -> list[tuple[str, str, str, str]]:
    """The re-fires an incident's reason notes, as (note, root kind, root entity, hint; "" when it
    is the incident's own root): the evaluation credits each to the fault it names."""
    return [(m.group(0), m.group(3), m.group(4), m.group(5) or "") for m in REFIRE_NOTE.finditer(reason)]


class _Member:
    """One entity of an incident: when it was seen, what it showed, its active predictions."""

    __slots__ = ("key", "kind", "slot", "anc", "first_ts", "last_ts", "strong_ts", "count", "signals", "preds", "xid",
                 "refired_ts", "clock_slow", "clock_ts", "shown_ts")

    def __init__(self, mkey: int, kind: str, slot: int, anc: tuple[int, ...], ts: float) -> None:
        self.key, self.kind, self.slot, self.anc = mkey, kind, slot, anc
        self.first_ts = self.last_ts = ts
        self.strong_ts = math.nan  # last finding that could open an incident by itself
        self.count = 0
        self.signals: dict[str, int] = {}
        # (event, detector) -> (ts, eta) while active: two detectors may predict one event on one
        # entity (thermal and a baseline), and each withdraws only its own
        self.preds: dict[tuple[str, str], tuple[float, float]] = {}
        self.xid = 0
        self.refired_ts = math.nan  # the re-fire (its start) it fired again in, after going quiet
        # the step slowdown its last straggler "slower" finding measured, and when (see _job_evidence)
        self.clock_slow, self.clock_ts = 1.0, -math.inf
        # its last finding of an observed effect: what it showed once and no longer does (one
        # throttle an hour ago) is not a current effect (:meth:`IncidentEngine._shows_elsewhere`)
        self.shown_ts = -math.inf

    @property
    def observed(self) -> bool:
        return any(SIGNALS[s].observed for s in self.signals)

    def weight(self, family: str) -> float:
        return max((SIGNALS[s].weight for s in self.signals if SIGNALS[s].family == family), default=0.0)

    def to_state(self) -> list[Any]:
        return [self.key, self.kind, self.slot, self.first_ts, self.last_ts, self.strong_ts, self.count,
                dict(self.signals), [[e, d, ts, eta] for (e, d), (ts, eta) in self.preds.items()], self.xid,
                self.refired_ts, self.clock_slow, self.clock_ts, self.shown_ts]

    def restore(self, last: Any, strong: Any, count: Any, signals: dict[str, Any], preds: Any, xid: Any,
                more: Sequence[Any]) -> None:
        """Take back what :meth:`to_state` saved after ``first_ts`` (``more``: the fields a
        checkpoint from before they existed lacks)."""
        self.last_ts, self.strong_ts, self.count, self.xid = float(last), float(strong), int(count), int(xid)
        self.signals = {str(s): int(c) for s, c in signals.items()}
        self.preds = _load_preds(preds)
        self.refired_ts = float(more[0]) if more else math.nan
        if len(more) >= 3:
            self.clock_slow, self.clock_ts = float(more[1]), float(more[2])
        # (a checkpoint from before it was saved: its last finding, if it ever showed an effect)
        self.shown_ts = float(more[3]) if len(more) >= 4 else self.last_ts if self.observed else -math.inf

    def take_clock(self, other: _Member) -> None:
        """The latest measured clock slowdown, and the latest observed effect, of this member and
        ``other`` (the same entity)."""
        if other.clock_ts > self.clock_ts:
            self.clock_slow, self.clock_ts = other.clock_slow, other.clock_ts
        self.shown_ts = max(self.shown_ts, other.shown_ts)


def _load_preds(saved: Any) -> dict[tuple[str, str], tuple[float, float]]:
    """A member's saved predictions: ``[[event, detector, ts, eta], ...]``, or — saved before they
    were kept per detector — ``{event: [ts, eta]}``, whose detector is unknown (``""``: any
    detector's withdrawal of that event withdraws it)."""
    if isinstance(saved, dict):
        return {(str(e), ""): (float(v[0]), float(v[1])) for e, v in saved.items()}
    return {(str(e), str(d)): (float(ts), float(eta)) for e, d, ts, eta in saved}


class _Incident:
    __slots__ = ("serial", "family", "first_ts", "last_ts", "last_growth_ts", "state", "root", "root_kind",
                 "reason", "hint", "members", "jobs_hit", "findings", "emits", "last_emit_ts", "emitted_members",
                 "emitted_root", "dirty", "resolved_ts", "merged_into", "external_types", "quiet_s", "bursts",
                 "refired", "emitted_refired", "emitted_keys", "emitted_jobs", "jobs_checked_ts", "emitted_spread")

    def __init__(self, serial: int, family: str, ts: float) -> None:
        self.serial, self.family = serial, family
        self.first_ts = self.last_ts = self.last_growth_ts = ts
        self.state = PENDING
        self.root = -1
        self.root_kind = ""
        self.reason = ""
        self.hint = ""
        self.members: dict[int, _Member] = {}
        self.jobs_hit: dict[int, int] = {}  # job slot -> job-level findings (consequences)
        self.findings = 0
        self.emits = 0
        self.last_emit_ts = -math.inf
        self.emitted_members = 0
        self.emitted_root = -1
        self.dirty = True
        self.resolved_ts = math.nan
        self.merged_into = -1
        self.external_types: dict[str, int] = {}
        self.quiet_s = math.nan  # its own quiet time once it has reopened (NaN: the engine's)
        # when members that had gone quiet fired again (the latest MAX_BURSTS), and how many
        # members fired again in all (told at the next update, as new members are)
        self.bursts: list[float] = []
        self.refired = 0
        self.emitted_refired = 0
        # the member keys last told (emitted_members: how many): a member that joined is one not
        # among them, whatever the count. None: not known (a checkpoint from before they were
        # saved, or reopened), and the count alone tells until the next emit, as it did before
        self.emitted_keys: frozenset[int] | None = frozenset()
        # the jobs it slowed as last told, by name (None: not known, a checkpoint from before they
        # were saved: told again only with another change), and when the tick last compared them
        self.emitted_jobs: dict[str, float] | None = {}
        self.jobs_checked_ts = -math.inf
        # the entities it named as next to be hit, as last told (None: not known, a checkpoint from
        # before they were saved: told again only with another change); compared with the job cost
        self.emitted_spread: frozenset[str] | None = frozenset()

    @property
    def id(self) -> str:
        return f"inc-{self.serial}"

    @property
    def live(self) -> bool:
        return self.state != RESOLVED

    def count_external(self, label: str, n: int) -> None:
        """Count ``n`` external events of type ``label``. Past ``MAX_EXTERNAL_TYPES`` distinct types
        the rest are counted together: BMC SEL and scheduler reason strings carry ids and values,
        so an incident that lives for weeks would otherwise keep (and checkpoint, and print in its
        reason) every one."""
        if label not in self.external_types and len(self.external_types) >= MAX_EXTERNAL_TYPES:
            label = OTHER_EXTERNAL
        self.external_types[label] = self.external_types.get(label, 0) + n


class _Evidence:
    __slots__ = ("kind", "slot", "sig", "ts", "event", "eta", "active", "xid", "named", "label", "detector", "slowdown")

    def __init__(self, kind: str, slot: int, sig: Signal, ts: float, event: str = "", eta: float = math.nan,
                 active: bool = True, xid: int = 0, named: tuple[tuple[str, int], ...] = (), label: str = "",
                 detector: str = "") -> None:
        self.kind, self.slot, self.sig, self.ts = kind, slot, sig, ts
        self.event, self.eta, self.active, self.xid, self.named, self.label = event, eta, active, xid, named, label
        self.detector = detector
        self.slowdown = 1.0  # the step slowdown the finding measured (a straggler's clock deficit), else 1


_LEVEL_SLOTS = {GPU: "gpu", NODE: "node", RACK: "rack", PDU: "rack", LOOP: "loop", LINK: "link", OPTIC: "optic",
                LEAF: "switch"}
"""What a domain level's slot numbers (``Remap`` kinds): a PDU is its rack's, a leaf is a switch."""


def _members_by_age(inc: _Incident) -> list[_Member]:
    """``inc``'s members, the first to join first (as an update lists them and reads the jobs)."""
    return sorted(inc.members.values(), key=lambda m: (m.first_ts, m.key))


class IncidentEngine:
    """Groups findings into incidents (a :class:`~foreshock.detectors.bank.FindingProcessor`)."""

    name = "incidents"
    frame_fields = {"gpu": ("gpu_temp", "slowdown_temp", "max_op_temp", "power", "power_limit"),
                    "link": ("tx_data", "link_rate"), "job": ("step_time",)}
    """The telemetry :meth:`observe_frame` reads (incident_impact.py): Kafka workers forward only
    these columns to the incident stage. A field read but not listed here would make the
    distributed incidents differ from the embedded ones, which the two-worker test catches."""

    def __init__(self, topology: Topology, health: PipelineHealth | None = None, *, hold_s: float = 60.0,
                 update_interval_s: float = 30.0, stable_s: float = 600.0, quiet_s: float = 900.0,
                 coherence_s: float = 600.0, reopen_s: float = 3600.0, cover: float = 0.8,
                 keep_resolved: int = 256, max_live: int = 4096, max_predicted: int = 32,
                 tick_s: float = 10.0, max_external_queue: int = 100_000,
                 max_external_ahead_s: float = 900.0) -> None:
        for label, v in (("hold_s", hold_s), ("update_interval_s", update_interval_s), ("stable_s", stable_s),
                         ("quiet_s", quiet_s), ("coherence_s", coherence_s), ("reopen_s", reopen_s),
                         ("tick_s", tick_s)):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{label} must be a finite number >= 0, got {v!r}")
        if not 0.5 <= cover <= 1.0:
            raise ValueError(f"cover must be in [0.5, 1], got {cover!r}")
        if not max_external_ahead_s >= 0:
            raise ValueError(f"max_external_ahead_s must be >= 0, got {max_external_ahead_s!r}")
        if keep_resolved < 0 or max_live < 1 or max_predicted < 0 or max_external_queue < 0:
            raise ValueError("keep_resolved, max_predicted and max_external_queue must be >= 0, max_live >= 1")
        self.topology = topology
        self.health = health or PipelineHealth()
        self.hold_s, self.update_interval_s, self.stable_s = hold_s, update_interval_s, stable_s
        self.quiet_s, self.coherence_s, self.reopen_s, self.cover = quiet_s, coherence_s, reopen_s, cover
        self.keep_resolved, self.max_live, self.max_predicted = keep_resolved, max_live, max_predicted
        self.tick_s, self.max_external_queue = tick_s, max_external_queue
        # how far past telemetry an outside event (add_external) or a detector's finding (_take)
        # may be dated; either dated further is refused and counted
        self.max_external_ahead_s = max_external_ahead_s
        self.latest_now = -math.inf  # the latest telemetry time observed (how far ahead an external event may be)
        self.dom = Domains(topology)
        # links per node (its NICs) and per leaf (its ports): a node or leaf is the root of links
        # down only when most of its own are (_rank_fabric)
        self._node_links = np.bincount(self.dom.link_node[self.dom.link_node >= 0], minlength=len(topology.nodes))
        self._leaf_links = np.bincount(self.dom.link_leaf[self.dom.link_leaf >= 0], minlength=len(topology.switches))
        # entity -> incident serial (-1 none), by member level; the only per-entity state
        self.s_member_of = {MEMBER_LEVEL[k]: np.full(n, -1, dtype=np.int64) for k, n in self.dom.sizes.items()}
        # optional telemetry (observe_frame): headroom for the predicted spread, measured step times
        self.tel = Telemetry(self.dom.sizes["gpu"], self.dom.sizes["link"], self.dom.sizes["job"])
        self._incidents: dict[int, _Incident] = {}
        self._resolved: deque[int] = deque()
        self._index: dict[int, dict[int, int]] = {}  # domain -> {serial: members under it}
        self._rooted: dict[int, set[int]] = {}  # root domain -> serials
        self._external: list[tuple[float, int, ExternalEvent]] = []
        # the external events taken (queued), by what they say (node, time, type, severity), in the
        # order taken: the same event sent again (a file rewritten whole and renamed into place, a
        # record redelivered) is one event, not a second finding counted again in its incident
        self._external_seen: dict[tuple[str, float, str, str], None] = {}
        self._external_prune_at = EXTERNAL_SEEN_PRUNE
        # events dated at or before this may have been taken and forgotten (_remember_external):
        # one could be a repeat, which would be counted again in a live incident it joins
        self._external_forgotten_to = -math.inf
        self._names: dict[str, tuple[str, int]] | None = None
        self._evicted: list[Finding] = []  # resolved early to make room; reported by the same observe()
        self._left_out: list[int] = []  # incidents a move left members out of (report_left_out)
        # boards displaced at a renumbering, read nowhere since: by the guard's key, the incidents
        # each was a member of (serial, saved member, whether it held it) (follow_moves)
        self._parked: dict[Hashable, list[tuple[int, list[Any], bool]]] = {}
        self.next_serial = 1
        self.last_tick = -math.inf
        # job evidence of every live incident, per job (_job_claims), while nothing it reads changes
        self._generation = 0
        self._splitting = 0  # splits under way (one ranks what it split off, which may split it)
        self._claims: dict[int, list[tuple[tuple[float, int], int]]] | None = None
        self._claims_at = (math.nan, -1)
        self.stats = {"findings": 0, "attached": 0, "consequences": 0, "unattached": 0, "incidents": 0,
                      "unconfirmed": 0, "merged": 0, "external": 0, "evicted": 0}

    # ---- input ---------------------------------------------------------------------------------
    def observe(self, findings: Sequence[Finding], now: float) -> list[Finding]:
        """Take the findings of one frame; return the incidents opened, updated or resolved."""
        out: list[Finding] = []
        took = False
        self.latest_now = max(self.latest_now, now)
        self._changed()
        if self._external and self._external[0][0] <= now:
            took = self._drain_external(now) or took
        for f in findings:
            if isinstance(f, Incident):
                continue
            took = True
            self._take(f, now)
        if self._evicted:
            out += self._evicted
            self._evicted = []
        if now - self.last_tick >= self.tick_s:
            self.last_tick = now
            self._tick(now, out)
        elif took and not math.isfinite(self.last_tick):
            self.last_tick = now
        return out

    def add_external(self, events: Iterable[ExternalEvent]) -> None:
        """Queue external events; each is grouped once telemetry time reaches its ``time``.

        An event dated more than ``max_external_ahead_s`` past the latest telemetry time is refused:
        held until telemetry reached it, one dated in milliseconds (or by a clock hours ahead) would
        wait for good, in every checkpoint, and enough of them fill the queue for the good ones."""
        for ev in events:
            if self.latest_now > -math.inf and ev.time > self.latest_now + self.max_external_ahead_s:
                self.health.problem(self.name, "external event dated too far ahead of telemetry: refused",
                                    detail=f"{ev.type} on {ev.node} at {ev.time:.0f}, telemetry at {self.latest_now:.0f}")
                continue
            said = (ev.node, ev.time, ev.type, ev.severity)
            if said in self._external_seen:
                self.health.problem(self.name, DUPLICATE_EXTERNAL, detail=f"{ev.type} on {ev.node} at {ev.time:.0f}")
                continue
            if ev.time <= self._external_forgotten_to:
                self.health.problem(self.name, FORGOTTEN_EXTERNAL,
                                    detail=f"{ev.type} on {ev.node} at {ev.time:.0f}, events remembered from "
                                           f"{self._external_forgotten_to:.0f}")
                continue
            if len(self._external) >= self.max_external_queue:
                self.health.problem(self.name, "external event queue full: event dropped")
                continue
            self._remember_external(said)
            self.stats["external"] += 1
            heapq.heappush(self._external, (ev.time, self.stats["external"], ev))

    def _remember_external(self, said: tuple[str, float, str, str]) -> None:
        """Keep an event taken, to know it again; forget those dated more than ``reopen_s`` and
        ``quiet_s`` before the latest telemetry, and past ``max_external_queue`` kept, the earliest
        dated. Pruned when the count doubles: amortised O(1) per event. An event dated at or before
        the last one forgotten is refused from then on (:meth:`add_external`): a repeat of it could
        no longer open an incident, but it could join a live one and be counted there again (a
        feed re-read whole after an hour, its fan failure told twice: until 2026-12-04)."""
        seen = self._external_seen
        seen[said] = None
        if len(seen) <= self._external_prune_at:
            return
        horizon = self.latest_now - max(self.reopen_s, self.quiet_s)
        old = [k for k in seen if k[1] <= horizon]
        for k in old:
            del seen[k]
        if old:
            self._external_forgotten_to = max(self._external_forgotten_to, horizon)
        cap = max(self.max_external_queue, 1)
        if len(seen) > cap:
            by_time = sorted(seen, key=lambda k: k[1])
            last = by_time[len(seen) - cap - 1][1]  # forgotten up to this time, ties included
            for k in by_time:
                if k[1] > last:
                    break
                del seen[k]
            self._external_forgotten_to = max(self._external_forgotten_to, last)
        self._external_prune_at = max(EXTERNAL_SEEN_PRUNE, 2 * len(seen))

    def queued_external(self) -> int:
        """How many external events are queued, waiting for telemetry time to reach theirs (read
        at the end of a run, before :meth:`flush` counts those left as never grouped)."""
        return len(self._external)

    def observe_external(self, events: Iterable[ExternalEvent], now: float) -> list[Finding]:
        """Group external events now (a live alert stream); returns incident findings."""
        self.add_external(events)
        return self.observe((), now)

    def observe_frame(self, frame: Frame) -> None:
        """Optional telemetry: GPU thermal margin and heating rate, link utilisation, job step
        times. Used only for ranking the predicted spread, measuring job slowdown and knowing
        that a GPU off the bus is still silent."""
        outside = self.tel.rows_outside(frame)
        if outside:  # (left out by Telemetry.observe, counted like a finding for an unknown entity)
            self.health.problem(self.name, TEL_OUTSIDE, outside, detail=f"{frame.kind} frame")
        not_sane = self.tel.observe(frame)
        if not_sane:
            self.health.problem(self.name, TX_NOT_SANE, not_sane)
        self._changed()

    def _drain_external(self, now: float) -> bool:
        took = False
        while self._external and self._external[0][0] <= now:
            _, _, ev = heapq.heappop(self._external)
            node = self.topology.slots_resolver()("node", ev.node)
            if node < 0:
                self.health.problem(self.name, "external event for an unknown node", detail=ev.node)
                continue
            sig = SIGNALS[external_signal(ev.type, ev.severity)]
            self.stats["findings"] += 1
            self._place(_Evidence("node", node, sig, ev.time, label=f"{ev.type} ({ev.severity})"), now)
            took = True
        return took

    def _take(self, f: Anomaly | Prediction, now: float) -> None:
        kind, slot = f.entity_kind, int(f.slot)
        level = MEMBER_LEVEL.get(kind)
        if level is None or not 0 <= slot < self.dom.sizes[kind]:
            self.health.problem(self.name, "finding for an unknown entity", detail=f"{kind} {slot}")
            return
        ts = float(f.ts)
        if not math.isfinite(ts):
            self.health.problem(self.name, "finding with a non-finite timestamp")
            return
        if ts > now + self.max_external_ahead_s:
            # dated past telemetry (a clock hours ahead, a stamp in milliseconds): it opened a pending
            # incident that could neither be confirmed nor dropped before telemetry time reached its
            # stamp, and every later finding of its entity joined it, hidden (until 2026-12-04)
            self.health.problem(self.name, "finding dated too far ahead of telemetry: refused",
                                detail=f"{kind} {slot} at {ts:.0f}, telemetry at {now:.0f}")
            return
        self.stats["findings"] += 1
        sig = SIGNALS[classify(f)]
        if isinstance(f, Prediction):
            ev = _Evidence(kind, slot, sig, ts, f.event, float(f.eta_s), f.active, named=self._named(f.reason),
                           detector=f.detector)
            if not f.active:
                self._withdraw(ev)
                return
        else:
            xid = xid_code(f) if sig.family == LOST else 0
            ev = _Evidence(kind, slot, sig, ts, xid=xid, named=self._named(f.reason) if kind == "link" else ())
            ev.slowdown = clock_deficit_slowdown(f)
        self._place(ev, now)

    def _named(self, reason: str) -> tuple[tuple[str, int], ...]:
        """Links and optics a reason names (congestion names the link whose traffic it carries;
        a link-down prediction names the optic that fails)."""
        if "~" not in reason:
            return ()
        if self._names is None:
            t = self.topology
            self._names = {n: ("link", i) for i, n in enumerate(t.links)}
            self._names.update({t.name("optic", i): ("optic", i) for i in range(t.size("optic"))})
        out = []
        for tok in reason.split():
            if "~" in tok:
                hit = self._names.get(tok.strip(",;:()[]'\"."))
                if hit is not None and hit not in out:
                    out.append(hit)
        return tuple(out)

    # ---- grouping ------------------------------------------------------------------------------
    def _place(self, ev: _Evidence, now: float) -> None:
        # congestion naming the link whose traffic it carries belongs to that link's incident, even
        # where the congested link has since failed itself (its own incident, _own_incident)
        inc = self._named_incident(ev, now) if ev.named and ev.sig.name == "congestion" else None
        if inc is None:
            inc = self._own_incident(ev, now)
        if inc is None and ev.named:
            inc = self._named_incident(ev, now)
        if inc is None:
            inc = self._inside_root(ev)
        if inc is None and ev.sig.opens:
            inc = self._widen(ev)
        if inc is None:
            if ev.sig.opens and self._back_on_the_bus(ev):
                return
            if ev.sig.opens and self._too_old(ev, now):
                self.health.problem(self.name, "evidence too old to open an incident (older than quiet_s)",
                                    detail=f"{ev.kind} {ev.slot}")
                self.stats["unattached"] += 1
                return
            if ev.sig.opens:
                inc = self._new_incident(ev.sig.family, ev.ts)
            elif self._consequence(ev):
                return
            else:
                self.stats["unattached"] += 1
                return
        self.stats["attached"] += 1
        self._attach(inc, ev)

    def _too_old(self, ev: _Evidence, now: float) -> bool:
        """Evidence older than quiet_s could only open (or reopen) an incident that resolves at the
        next tick: a fault that ended long ago (a redelivered or re-read feed, a finding hours late)
        announced as opened and then resolved. It may still join a live incident."""
        return now - ev.ts > self.quiet_s

    def _own_incident(self, ev: _Evidence, now: float) -> _Incident | None:
        serial = int(self.s_member_of[MEMBER_LEVEL[ev.kind]][ev.slot])
        inc = self._incidents.get(serial) if serial >= 0 else None
        if inc is None:
            return None
        m = inc.members.get(key(MEMBER_LEVEL[ev.kind], ev.slot))
        if (m is not None and set(m.signals) <= {"congestion"} and ev.sig.family == FABRIC
                and ev.sig.name != "congestion" and inc.root != m.key):
            # a link congested by another's failure, now failing itself (its optic, its errors): a
            # cause of its own. Taken in, it moved the incident's root onto itself (until 2026-12-04)
            return None
        lost = m is not None and "gpu_lost" in m.signals and inc.live
        if not lost and not _follows(inc.family, ev.sig):
            return None  # e.g. a GPU of an overheating loop that now falls off the bus: a new cause
        if lost:
            return inc  # a GPU off the bus starts nothing new: what is said about it is stale or aftermath
        wide = level_of(inc.root) in (RACK, LOOP)
        if ev.sig.opens and inc.live and wide and ev.ts - inc.last_growth_ts > self.coherence_s:
            if m is not None and not ev.ts - m.strong_ts <= self.coherence_s:
                # quiet (or only symptoms) for a while inside a loop that stopped spreading, and now
                # heating again on its own: more likely a cause of its own (a fan, a TIM) than the loop
                return None
        if inc.live and ev.sig.opens and m is not None:
            outlived = self._split_off_outliving(inc, m, ev)
            if outlived is not None:
                return outlived
        if inc.state == RESOLVED:
            # a flapping link or a recurring GPU reopens its incident; one GPU of a resolved loop
            # incident does not reopen the loop
            if not wide and self._may_reopen(inc, ev, now):
                self._reopen(inc, ev.ts)
                return inc
            return None
        return inc

    def _split_off_outliving(self, inc: _Incident, m: _Member, ev: _Evidence) -> _Incident | None:
        """The incident strong evidence ``ev`` on member ``m`` of ``inc`` belongs to when the cause
        ``inc`` is rooted at has ended and ``m`` has not: ``inc`` stopped spreading more than
        ``coherence_s`` ago, the rest of its members have shown nothing (no strong finding, no
        prediction that still counts) for ``quiet_s`` — alone they would have resolved — and the
        members still showing rank finer than its root. Those go to an incident of their own,
        ranked (:meth:`_move_to_new_incident`), and ``inc`` keeps the quiet ones, to resolve on
        their evidence. A node's fans repaired while one of its GPUs' thermal interface goes on
        failing: until 2026-12-05 the GPU's findings, the only strong ones left, held the fan
        incident open for an hour ("8 of 8 GPUs of node5 heating together", its job's cost told
        there) and the thermal interface was never named. None: ``ev`` goes on as before.

        Node roots only. A rack or loop recovers unevenly — the GPUs with the least headroom are
        still predicted to throttle after the rest cooled, its inlet is flagged once — and a GPU
        that heats again on its own inside one has its own rule (``coherence_s``, above); what a
        loop incident still held by one GPU fails again is noted there as a re-fire."""
        fam = inc.family
        if (fam in (FABRIC, JOBF) or level_of(inc.root) != NODE or inc.merged_into >= 0 or inc.root == m.key
                or inc.root not in m.anc or not ev.ts - inc.last_growth_ts > self.coherence_s
                or self._splitting > MAX_SPLIT_DEPTH):
            return None
        horizon = ev.ts - self._quiet_s(inc)  # (its own: a cause that speaks seldom reopened it with a longer one)
        held = [x for x in inc.members.values() if self._holds(inc, x)]
        showing = [x for x in held if x is m or x.strong_ts >= horizon or self._holds_open(inc, x, ev.ts)]
        if len(showing) == len(held):
            return None
        theirs = self._rank_members(fam, showing)
        if theirs == inc.root or inc.root not in self._holding(theirs):
            return None  # what still shows is the root's doing (its fans still failing), or not finer
        self._changed()
        self._splitting += 1
        try:
            self._move_out(inc, showing, theirs)
        finally:
            self._splitting -= 1
        # the rest resolves on its own evidence: the strong findings of those that left kept it open
        strong = [x.strong_ts for x in inc.members.values() if x.strong_ts == x.strong_ts]
        if strong:
            inc.last_ts = min(inc.last_ts, max(strong))
        inc.dirty = True
        self._find_root(inc)
        serial = int(self.s_member_of[MEMBER_LEVEL[ev.kind]][ev.slot])
        now_in = self._incidents.get(serial) if serial >= 0 else None
        return now_in if now_in is not None and now_in.live else None

    def _may_reopen(self, inc: _Incident, ev: _Evidence, now: float) -> bool:
        """Whether ``ev`` reopens the resolved incident ``inc``: evidence that opens, within
        ``reopen_s`` of the resolution and newer than the incident's last (not only than the tick
        that resolved it: a finding delivered a little late, stamped before that tick, opened a
        second incident for the same cause until 2026-12-04)."""
        return (inc.state == RESOLVED and inc.merged_into < 0 and ev.sig.opens and ev.ts > inc.last_ts
                and ev.ts - inc.resolved_ts <= self.reopen_s and not self._too_old(ev, now))

    def _back_on_the_bus(self, ev: _Evidence) -> bool:
        """A GPU that fell off the bus, then repaired: it rejoins differing from its peers for a while
        (its job restarts, clocks and caches are fresh), and what the detectors then say about it
        without an observed effect (a hot outlier, a prediction) and that no live incident claims
        (a failing loop still does) is that fault's aftermath — counted there, opening nothing — for
        as long as the incident could reopen (``reopen_s``; the repair may end well after the
        incident resolved when no telemetry says the GPU is still silent). A cause that persists
        opens its own incident after that; an observed effect at once."""
        if ev.kind != "gpu" or ev.sig.observed or ev.sig.family == LOST:
            return False
        serial = int(self.s_member_of[GPU][ev.slot])
        inc = self._incidents.get(serial) if serial >= 0 else None
        if inc is None or inc.state != RESOLVED or inc.merged_into >= 0 or not ev.ts - inc.resolved_ts <= self.reopen_s:
            return False
        m = inc.members.get(key(GPU, ev.slot))
        if m is None or "gpu_lost" not in m.signals:
            return False
        inc.findings += 1
        self.stats["consequences"] += 1
        return True

    def _named_incident(self, ev: _Evidence, now: float) -> _Incident | None:
        # a reason names its own link or optic too: that one is _own_incident's to place
        own = {(ev.kind, ev.slot)} | ({("optic", 2 * ev.slot), ("optic", 2 * ev.slot + 1)} if ev.kind == "link"
                                      else {("link", ev.slot // 2)} if ev.kind == "optic" else set())
        for kind, slot in ev.named:
            keys = [(kind, slot)]
            if kind == "link":
                keys += [("optic", 2 * slot), ("optic", 2 * slot + 1)]
            for k, s in keys:
                if (k, s) in own:
                    continue
                serial = int(self.s_member_of[MEMBER_LEVEL[k]][s])
                inc = self._incidents.get(serial) if serial >= 0 else None
                if inc is not None and inc.family == FABRIC:
                    if inc.live:
                        return inc
                    # the named link's incident resolved (a link still down reports link_downed
                    # once): its traffic rerouted reopens it — until 2026-12-04 a second incident
                    # opened, rooted at the congested link and hinted a link failure
                    if self._may_reopen(inc, ev, now):
                        self._reopen(inc, ev.ts)
                        return inc
        if ev.sig.family == FABRIC and not self._too_old(ev, now):
            return self._new_incident(FABRIC, ev.ts)  # the cause shows nothing yet: it opens the incident
        return None

    def _inside_root(self, ev: _Evidence) -> _Incident | None:
        """A live incident whose root domain holds the entity: of the same family, or — for a
        symptom that opens nothing by itself, such as a power cap on a GPU of an overheating loop
        (leakage grows with temperature) — of any family rooted above the GPU. Not a fabric
        symptom: an optic's trend on a NIC of a node whose fans failed is not the fans' doing, and
        taken by their incident it would be missing from the optic's when its link goes down."""
        fam = ev.sig.family
        symptom = not ev.sig.opens and fam != JOBF
        fallback: _Incident | None = None
        for a in self.dom.ancestors(ev.kind, ev.slot):
            best: _Incident | None = None
            other: _Incident | None = None  # the finest domain's, for the fallback
            wide = level_of(a) in (RACK, LOOP)
            for serial in self._rooted.get(a, ()):
                inc = self._incidents[serial]
                if not inc.live:
                    continue
                if inc.family == fam:
                    # a rack or loop incident that stopped spreading long ago does not claim a
                    # GPU that starts heating now (more likely a cause of its own), unless that GPU
                    # was heating with the rest of it until recently
                    if wide and ev.sig.opens and ev.ts - inc.last_growth_ts > self.coherence_s:
                        m = inc.members.get(key(MEMBER_LEVEL[ev.kind], ev.slot))
                        if m is None or not ev.ts - m.strong_ts <= self.coherence_s:
                            continue
                    if best is None or _recency(inc) > _recency(best):
                        best = inc
                elif (symptom and fam != FABRIC and fallback is None and level_of(a) in (NODE, RACK, LOOP)
                      and (other is None or _recency(inc) > _recency(other))):
                    other = inc
            if best is not None:
                return best
            fallback = fallback or other
        return fallback

    def _widen(self, ev: _Evidence) -> _Incident | None:
        fam = ev.sig.family
        ladder = LADDER.get(fam, ())
        mkey = key(MEMBER_LEVEL[ev.kind], ev.slot)
        for a in self.dom.ancestors(ev.kind, ev.slot):
            level = level_of(a)
            if level not in ladder or a == mkey:
                continue
            best: _Incident | None = None
            best_n = -1
            for serial, n in self._index.get(a, {}).items():
                inc = self._incidents[serial]
                if not inc.live or inc.family != fam or not self._joinable(inc, a, ev):
                    continue
                if n > best_n or (n == best_n and best is not None and _recency(inc) > _recency(best)):
                    best, best_n = inc, n
            if best is not None:
                return best
        return None

    def _joinable(self, inc: _Incident, a: int, ev: _Evidence) -> bool:
        level = level_of(a)
        if inc.family == FABRIC:
            if level == LINK:
                return True  # an optic and its link are one chain
            # congestion next to a link that fails: its traffic went somewhere (node NICs, leaf);
            # another optic or link failing nearby is a cause of its own
            return (ev.sig.name == "congestion" and ev.ts - inc.last_ts <= self.coherence_s and _failing(inc)
                    and any(a in m.anc for m in inc.members.values()))
        if ev.ts - inc.last_growth_ts > self.coherence_s:
            return False
        under = [m for m in inc.members.values() if a in m.anc]
        if not _supported(self.dom, level, under, [(ev.kind, ev.slot)]):
            return False
        # enough evidence for the domain is not enough: the incident with the finding must then
        # be the domain's (or a coarser one's). A node's fans and a hot GPU on the next node are
        # enough GPUs for the rack, yet the node explains nearly all of it and stays the root:
        # joined, the GPU was a member of the node's incident ("9 of 8 GPUs of node6")
        probe = _Member(key(MEMBER_LEVEL[ev.kind], ev.slot), ev.kind, ev.slot,
                        self.dom.ancestors(ev.kind, ev.slot), ev.ts)
        probe.signals = {ev.sig.name: 1}
        return self._roots_at_or_above(inc.family, a, [*inc.members.values(), probe])

    def _consequence(self, ev: _Evidence) -> bool:
        """A job's step time, or a GPU lagging its job peers, where nothing else explains it: count
        it in the live incident touching the same job (its slowest member sets everyone's pace).
        Other symptoms (a routine power cap elsewhere in the job) are not that incident's doing."""
        self._changed()
        job = -1
        if ev.kind == "job":
            job = ev.slot
        elif ev.kind == "gpu" and ev.sig.name == "straggler":
            job = int(self.dom.gpu_job[ev.slot])
        if job < 0:
            return False
        best: _Incident | None = None
        for serial in self._index.get(key(JOB, job), {}):
            inc = self._incidents[serial]
            if inc.live and (best is None or _recency(inc) > _recency(best)):
                best = inc
        if best is None:
            return False
        best.findings += 1
        best.jobs_hit[job] = best.jobs_hit.get(job, 0) + 1  # counted, but keeps nothing open
        self.stats["consequences"] += 1
        return True

    def _new_incident(self, family: str, ts: float) -> _Incident:
        # the count of live ones only where it could reach the limit: the resolved are pruned to
        # keep_resolved, so a burst of new incidents scanned every incident once each (quadratic:
        # 1,000 at once took 0.4 s) to find a limit of 4,096 far off
        if (len(self._incidents) >= self.max_live
                and sum(1 for i in self._incidents.values() if i.live) >= self.max_live):
            self._evict_stalest()
        inc = _Incident(self.next_serial, family, ts)
        self.next_serial += 1
        self._incidents[inc.serial] = inc
        return inc

    def _evict_stalest(self) -> None:
        stalest = min((i for i in self._incidents.values() if i.live), key=lambda i: i.last_ts)
        self.health.problem(self.name, "too many live incidents: the stalest was resolved early")
        self.stats["evicted"] += 1
        done: list[Finding] = []
        self._resolve(stalest, stalest.last_ts, done)
        if stalest.emits:  # sinks that were told it opened must be told it ended
            self._evicted += done

    def _attach(self, inc: _Incident, ev: _Evidence) -> None:
        self._changed()
        mkey = key(MEMBER_LEVEL[ev.kind], ev.slot)
        m = inc.members.get(mkey)
        new = m is None
        if m is None:
            m = self._add_member(inc, ev.kind, ev.slot, ev.ts)
        m.count += 1
        m.last_ts = max(m.last_ts, ev.ts)
        if ev.sig.opens:
            self._note_refire(inc, m, ev.ts, new)
            m.strong_ts = ev.ts if not m.strong_ts >= ev.ts else m.strong_ts
        m.signals[ev.sig.name] = m.signals.get(ev.sig.name, 0) + 1
        if ev.sig.observed:
            m.shown_ts = max(m.shown_ts, ev.ts)
        if ev.slowdown != 1.0 and ev.ts >= m.clock_ts:
            m.clock_slow, m.clock_ts = ev.slowdown, ev.ts
        if ev.event:
            m.preds[(ev.event, ev.detector)] = (ev.ts, ev.eta)
        if ev.xid:
            m.xid = ev.xid
        if ev.label:
            inc.count_external(ev.label, 1)
        inc.findings += 1
        if ev.sig.opens:
            # symptoms (routine power caps, z-score blips) join an incident but do not keep it
            # open once the evidence of its cause has gone quiet: under full load they never stop
            inc.last_ts = max(inc.last_ts, ev.ts)
        for kind, slot in ev.named:  # the entity the reason blames is part of the story
            nkey = key(MEMBER_LEVEL[kind], slot)
            if nkey not in inc.members and int(self.s_member_of[MEMBER_LEVEL[kind]][slot]) < 0:
                nm = self._add_member(inc, kind, slot, ev.ts)
                nm.signals["optic_degrading" if kind == "optic" else "link_down"] = 1
                if nm.observed:  # (a link the reason says went down: seen so now)
                    nm.shown_ts = ev.ts
                new = True
        if new:
            inc.last_growth_ts = max(inc.last_growth_ts, ev.ts)
            inc.dirty = True
            if inc.state == STABLE:
                inc.state = GROWING
            self._rank(inc)  # may merge it into a twin: consolidate what it became
            self._consolidate(self._surviving(inc), ev)

    def _note_refire(self, inc: _Incident, m: _Member, ts: float, new: bool) -> None:
        """Strong evidence on member ``m`` of ``inc`` at ``ts``: when the member had gone quiet
        (nothing strong for ``coherence_s``) it fires again — the same cause failing again (a
        cooling loop losing flow a second time) or a new one under entities the incident holds
        (a node's fans inside a loop incident). Either way its members are already held, so the
        incident would show nothing new: the re-fire is noted (its time; its root ranked from the
        members that fired again, :meth:`_refire_text`) and told at the next update, as growth.
        A member new to the incident while a re-fire is under way belongs to it too."""
        latest = inc.bursts[-1] if inc.bursts else math.nan
        under_way = ts - latest <= self.coherence_s
        if m.refired_ts == latest and under_way:
            # already counted in this re-fire (one long over is no reason: until 2026-12-04 a
            # flapping link's incident told its first re-fire and none after)
            return
        if not ts - m.strong_ts > self.coherence_s and not (new and under_way):
            return  # (NaN strong_ts: never strong here before, which is growth, not a re-fire)
        if not under_way:
            inc.bursts = [*inc.bursts[-(MAX_BURSTS - 1):], ts] if MAX_BURSTS > 1 else [ts]
        m.refired_ts = inc.bursts[-1]
        inc.refired += 1
        inc.last_growth_ts = max(inc.last_growth_ts, ts)
        if inc.state == STABLE:
            inc.state = GROWING

    def _surviving(self, inc: _Incident) -> _Incident:
        """The incident ``inc`` was merged into (following a chain of merges), or ``inc``."""
        while inc.merged_into >= 0 and inc.merged_into in self._incidents:
            inc = self._incidents[inc.merged_into]
        return inc

    def _add_member(self, inc: _Incident, kind: str, slot: int, ts: float) -> _Member:
        self._changed()
        level = MEMBER_LEVEL[kind]
        anc = self.dom.ancestors(kind, slot)
        m = _Member(key(level, slot), kind, slot, anc, ts)
        inc.members[m.key] = m
        old = int(self.s_member_of[level][slot])
        if old >= 0 and old != inc.serial and old in self._incidents:
            # the entity moves on to a new cause; the old incident keeps it in its history, not its
            # predictions: their withdrawal now reaches the new one only, and held there they kept
            # the old one open (and named the entity as its next) until they expired
            left = self._incidents[old]
            self._forget_member(left, m.key)
            if m.key in left.members:
                left.members[m.key].preds = {}
        self.s_member_of[level][slot] = inc.serial
        self._index_add(inc, anc)
        return m

    def _index_add(self, inc: _Incident, anc: tuple[int, ...]) -> None:
        for a in anc:
            d = self._index.setdefault(a, {})
            d[inc.serial] = d.get(inc.serial, 0) + 1

    def _forget_member(self, inc: _Incident, mkey: int) -> None:
        """Take an entity out of the domain index for ``inc`` (once: only while it belongs to it)."""
        m = inc.members.get(mkey)
        if m is None or self.s_member_of[level_of(mkey)][slot_of(mkey)] != inc.serial:
            return
        for a in m.anc:
            d = self._index.get(a)
            if d is not None and inc.serial in d:
                d[inc.serial] -= 1
                if d[inc.serial] <= 0:
                    del d[inc.serial]
                if not d:
                    del self._index[a]

    def _withdraw(self, ev: _Evidence) -> None:
        """A prediction withdrawn: the member stays, its prediction is no longer active. Counted in
        the incident that held the prediction, and like the finding it withdraws: a symptom's (a
        routine power cap predicted and withdrawn all day) does not keep the incident open."""
        self._changed()
        serial = int(self.s_member_of[MEMBER_LEVEL[ev.kind]][ev.slot])
        inc = self._incidents.get(serial) if serial >= 0 else None
        m = inc.members.get(key(MEMBER_LEVEL[ev.kind], ev.slot)) if inc is not None and inc.live else None
        # ("": saved before predictions were kept per detector)
        held = [m.preds.pop(k, None) for k in ((ev.event, ev.detector), (ev.event, ""))] if m is not None else []
        if inc is None or m is None or not any(p is not None for p in held):
            self.stats["unattached"] += 1  # never held here: said while another incident held the entity
            return
        m.last_ts = max(m.last_ts, ev.ts)
        inc.findings += 1
        if ev.sig.opens:
            inc.last_ts = max(inc.last_ts, ev.ts)
        self.stats["attached"] += 1

    def _reopen(self, inc: _Incident, ts: float) -> None:
        self._changed()
        # a cause that is still there but speaks less often than quiet_s (a double-bit ECC error
        # every half hour on a GPU left in service) had its incident announced resolved and open
        # again all day: once it reopens, it stays open through one and a half of the longest
        # silence it has shown (at most reopen_s)
        gap = ts - inc.last_ts
        if math.isfinite(gap) and gap > 0:
            inc.quiet_s = min(max(self.quiet_s, 1.5 * gap, 0.0 if math.isnan(inc.quiet_s) else inc.quiet_s),
                              max(self.reopen_s, self.quiet_s))
        if inc.serial in self._resolved:
            self._resolved.remove(inc.serial)
        inc.state = GROWING if inc.emits else PENDING
        inc.resolved_ts = math.nan
        inc.last_growth_ts = max(inc.last_growth_ts, ts)
        inc.emitted_members, inc.emitted_keys = -1, None  # reported as growing again at the next tick
        inc.dirty = True
        self._set_root(inc, inc.root)

    # ---- merging -------------------------------------------------------------------------------
    def _consolidate(self, inc: _Incident, ev: _Evidence) -> None:
        """Merge incidents that, together with this one, are enough evidence for a shared domain.

        The finding's own domain counts too: a node's fans, a node's PSU or a rack's inlet that
        comes after finer incidents under it opened (a GPU braking, a GPU heating, a node's fans)
        takes them in when, merged, they rank at it — as it would have taken in their findings
        had it come first (:meth:`_inside_root`). Until 2026-12-05 it opened an incident of its
        own beside them: one cause as two or three incidents, by the order of one frame's findings
        (live, a rack's inlet rises after its dies). Incidents that last grew more than
        ``coherence_s`` apart stay apart (a GPU's thermal interface failing for hours before the
        rack's inlet rose is a cause of its own), as do other families (an XID, an ECC error).
        The fabric keeps its own rules (:meth:`_fabric_related`, :meth:`_merge_failing_domain`)."""
        fam = inc.family
        if fam == JOBF or not inc.live or inc.merged_into >= 0:
            return
        mkey = key(MEMBER_LEVEL[ev.kind], ev.slot)
        for a in self.dom.ancestors(ev.kind, ev.slot):
            level = level_of(a)
            if level not in LADDER[fam] or (a == mkey and fam == FABRIC):
                continue
            if fam == FABRIC and level in (NODE, LEAF) and self._merge_failing_domain(inc, a):
                return
            others = []
            for serial in self._index.get(a, {}):
                other = self._incidents[serial]
                if other is inc or not other.live or other.family != fam:
                    continue
                if fam == FABRIC:
                    ok = self._fabric_related(inc, other, a)
                else:
                    ok = (abs(other.last_growth_ts - inc.last_growth_ts) <= self.coherence_s
                          and level_of(other.root) in LEVELS[fam] and LEVELS[fam].index(level_of(other.root))
                          < LEVELS[fam].index(level))
                if ok:
                    others.append(other)
            if not others:
                continue
            group = sorted([inc, *others], key=lambda i: (not i.emits, i.serial))
            if fam != FABRIC:
                under = [m for i in group for m in i.members.values() if a in m.anc]
                if not _supported(self.dom, level, under, []):
                    continue
                # and merged they must rank at the shared domain or above it: otherwise one of
                # them explains nearly all of it, and the others are causes of their own
                if not self._roots_at_or_above(fam, a, _merged_members(self, group)):
                    continue
            self._absorb(group[0], group[1:])
            return

    def _merge_failing_domain(self, inc: _Incident, a: int) -> bool:
        """A leaf switch that dies takes all its ports down at once, a node that loses its NICs all
        of its links: each link opened an incident of its own, and the leaf or node was never
        named. Fabric incidents with links down or erroring under node or leaf ``a``, their links
        failing within ``coherence_s`` of ``inc``'s, are merged when together they rank at ``a``:
        most of its links (:meth:`_rank_fabric`). Two unrelated links failing on one leaf are two
        causes."""
        if not any(a in m.anc and _down(m) for m in inc.members.values()):
            return False
        group = [inc]
        for serial in self._index.get(a, {}):
            other = self._incidents[serial]
            if (other is inc or not other.live or other.family != FABRIC
                    or abs(other.last_growth_ts - inc.last_growth_ts) > self.coherence_s):
                continue
            if any(a in m.anc and _down(m) for m in other.members.values()):
                group.append(other)
        if len(group) < 2:
            return False
        down = len({m.key for i in group for m in i.members.values() if a in m.anc and _down(m)})
        if 2 * down <= self._links_of(a):
            return False  # (the ranking's test, before ranking: most of the links are not down)
        group.sort(key=lambda i: (not i.emits, i.serial))
        if self._rank_fabric(_merged_members(self, group)) != a:
            return False
        self._absorb(group[0], group[1:])
        return True

    def _links_of(self, a: int) -> int:
        """How many links node or leaf ``a`` has (a node its NIC links; a leaf its ports: the NIC
        links plugged into it and its uplinks)."""
        counts = self._node_links if level_of(a) == NODE else self._leaf_links
        return int(counts[slot_of(a)])

    def _roots_at_or_above(self, fam: str, a: int, members: Sequence[_Member]) -> bool:
        """Whether ``members`` (evidence of family ``fam``) rank at domain ``a`` or one holding it."""
        return self._rank_members(fam, members) in self._holding(a)

    def _fabric_related(self, a_inc: _Incident, b_inc: _Incident, a: int) -> bool:
        """Two fabric incidents belong together when one holds a failing link in the shared domain
        and the other only the congestion such a failure causes, close in time."""
        if level_of(a) == LINK:
            return True
        near = abs(a_inc.last_ts - b_inc.last_ts) <= self.coherence_s
        return near and (_failing(a_inc) != _failing(b_inc))

    def _absorb(self, survivor: _Incident, victims: Sequence[_Incident]) -> None:
        """Merge ``victims`` into ``survivor`` and rank it again. A stable incident whose root the
        merge changed is growing again (as one that gained members, :meth:`_merge`)."""
        root = survivor.root
        for victim in victims:
            self._merge(survivor, victim)
        self._rank(survivor)
        if survivor.state == STABLE and survivor.merged_into < 0 and survivor.root != root:
            survivor.state = GROWING

    def _merge(self, survivor: _Incident, victim: _Incident) -> None:
        self._changed()
        added = False
        for mkey, m in list(victim.members.items()):
            level, s = level_of(mkey), slot_of(mkey)
            if self.s_member_of[level][s] != victim.serial:
                continue  # it moved on to another cause before the merge
            mine = survivor.members.get(mkey)
            if mine is None:  # (adding it takes it out of the victim's index, and its predictions)
                preds = m.preds
                nm = self._add_member(survivor, m.kind, s, m.first_ts)
                if m.strong_ts == m.strong_ts:  # (before its strong_ts is set: new to the survivor)
                    self._note_refire(survivor, nm, m.first_ts, True)
                nm.last_ts, nm.strong_ts, nm.count = m.last_ts, m.strong_ts, m.count
                nm.signals, nm.preds, nm.xid = m.signals, preds, m.xid
                nm.take_clock(m)
                if m.refired_ts == m.refired_ts:
                    nm.refired_ts = m.refired_ts
                added = True
            else:
                if m.strong_ts == m.strong_ts:
                    # a member the survivor had gone quiet on, strong again in the victim: the
                    # cause failing again opened a twin that lands on the same root (a loop
                    # incident that stopped spreading claims no GPU that starts heating again)
                    self._note_refire(survivor, mine, m.first_ts, False)
                mine.first_ts = min(mine.first_ts, m.first_ts)
                mine.last_ts = max(mine.last_ts, m.last_ts)
                mine.strong_ts = max(mine.strong_ts, m.strong_ts) if mine.strong_ts == mine.strong_ts else m.strong_ts
                mine.count += m.count
                for sname, c in m.signals.items():
                    mine.signals[sname] = mine.signals.get(sname, 0) + c
                mine.preds.update(m.preds)
                mine.take_clock(m)
                if not mine.refired_ts >= m.refired_ts:  # (NaN: never fired again)
                    mine.refired_ts = m.refired_ts if m.refired_ts == m.refired_ts else mine.refired_ts
                self._forget_member(victim, mkey)
                self.s_member_of[level][s] = survivor.serial
                self._index_add(survivor, mine.anc)  # it had left the survivor's index when it moved
        for j, c in victim.jobs_hit.items():
            survivor.jobs_hit[j] = survivor.jobs_hit.get(j, 0) + c
        for t, c in victim.external_types.items():
            survivor.count_external(t, c)
        survivor.findings += victim.findings
        survivor.bursts = sorted(set(survivor.bursts) | set(victim.bursts))[-MAX_BURSTS:]
        survivor.refired += victim.refired
        survivor.first_ts = min(survivor.first_ts, victim.first_ts)
        survivor.last_ts = max(survivor.last_ts, victim.last_ts)
        survivor.last_growth_ts = max(survivor.last_growth_ts, victim.last_growth_ts)
        if not victim.quiet_s <= survivor.quiet_s:  # (NaN: the engine's)
            survivor.quiet_s = victim.quiet_s if math.isfinite(victim.quiet_s) else survivor.quiet_s
        survivor.dirty = True
        if survivor.state == STABLE and added:
            # absorbing members it already listed (an entity that had left it for a twin) is no
            # growth: flipped, it was announced stable again stable_s later, saying nothing new
            survivor.state = GROWING
        victim.members = {}
        victim.merged_into = survivor.serial
        self._set_root(victim, -1)
        self.stats["merged"] += 1
        if victim.emits:
            victim.state = RESOLVED  # emitted at the next tick as resolved, pointing at the survivor
            victim.resolved_ts = victim.last_ts
            victim.reason = f"merged into {survivor.id}"
            victim.dirty = True
        else:
            self._incidents.pop(victim.serial, None)

    # ---- root cause ----------------------------------------------------------------------------
    def _unroot(self, inc: _Incident) -> None:
        serials = self._rooted.get(inc.root) if inc.root >= 0 else None
        if serials is not None:
            serials.discard(inc.serial)
            if not serials:
                del self._rooted[inc.root]

    def _set_root(self, inc: _Incident, root: int) -> None:
        self._unroot(inc)
        inc.root = root
        if root >= 0 and inc.live:
            self._rooted.setdefault(root, set()).add(inc.serial)

    def _rank(self, inc: _Incident) -> None:
        """Root cause: the finest candidate domain that explains ``cover`` of the evidence; then
        one cause, one incident: a second incident that lands on the same root joins the first,
        and a rack-wide one inside a live loop incident is that loop's doing."""
        if not self._find_root(inc):
            return
        self._split_off_outsiders(inc)
        root, fam = inc.root, inc.family
        roots = [root] + ([key(LOOP, self.dom.rack_loop[slot_of(root)])] if level_of(root) == RACK else [])
        twins = [self._incidents[s] for r in roots for s in self._rooted.get(r, ()) if s != inc.serial
                 and self._incidents[s].live and self._incidents[s].family == fam]
        if twins:
            group = sorted([inc, *twins], key=lambda i: (not i.emits, i.serial))
            self._absorb(group[0], group[1:])

    def _split_off_outsiders(self, inc: _Incident) -> None:
        """Members ``inc`` holds outside a root that explains ``cover`` of its evidence go to an
        incident of their own. Two GPUs of one node and one of the next, heating together, rank at
        their rack and are merged; when the node's other six follow, the node explains nearly all of
        it and is the root: the GPU of the other node is a cause of its own (its thermal interface),
        not a member of the node's fan incident. Ranked again, the incident may narrow further.

        The members split off stay together where they explain a domain of their own that does not
        hold ``inc``'s root; otherwise each goes alone: a domain that holds the root would be a twin
        of ``inc`` (a loop around its rack, :meth:`_rank`) and take them straight back, and members
        that explain nothing together (two GPUs on two racks) are no one cause."""
        fam = inc.family
        if fam in (FABRIC, JOBF) or not inc.live or inc.merged_into >= 0 or self._splitting > MAX_SPLIT_DEPTH:
            return
        self._changed()
        self._splitting += 1
        try:
            self._split_passes(inc)
        finally:
            self._splitting -= 1

    def _split_passes(self, inc: _Incident) -> None:
        fam = inc.family
        for _ in LEVELS[fam]:  # each pass leaves a finer root, or stops
            root = inc.root
            outside = [m for m in inc.members.values() if root not in m.anc and self._holds(inc, m)]
            if not outside or len(outside) == len(inc.members):
                return
            if not self._explains(fam, root, list(inc.members.values())):
                return  # no domain explains enough (the fallback root): nothing to tell apart
            self._move_out(inc, outside, self._rank_members(fam, outside))
            inc.dirty = True
            self._find_root(inc)

    def _holds(self, inc: _Incident, m: _Member) -> bool:
        """Whether ``inc`` holds its member ``m`` now: an entity that moved on to another cause
        stays in the history of the incident it left."""
        return bool(self.s_member_of[level_of(m.key)][m.slot] == inc.serial)

    def _holding(self, d: int) -> tuple[int, ...]:
        """Domain ``d`` and the domains holding it (its node, rack, loop; not its job)."""
        level = level_of(d)
        if level in (GPU, NODE, RACK):
            return tuple(a for a in self.dom.ancestors(LEVEL_NAMES[level], slot_of(d)) if level_of(a) != JOB)
        return (d,)

    def _move_out(self, inc: _Incident, members: list[_Member], theirs: int) -> None:
        """Members of ``inc`` that rank at ``theirs`` to incidents of their own: together where they
        explain that domain and it does not hold ``inc``'s root (it would be a twin of ``inc`` and
        take them straight back), else each alone (:meth:`_split_off_outsiders`)."""
        together = self._explains(inc.family, theirs, members) and theirs not in self._holding(inc.root)
        for group in ([members] if together else [[m] for m in members]):
            self._move_to_new_incident(inc, group)

    def _move_to_new_incident(self, inc: _Incident, members: list[_Member]) -> None:
        """Members of ``inc`` (held by it) to a new incident of their own, ranked."""
        split = self._new_incident(inc.family, min(m.first_ts for m in members))
        for m in members:
            self._forget_member(inc, m.key)
            del inc.members[m.key]
            self.s_member_of[level_of(m.key)][m.slot] = -1
            nm = self._add_member(split, m.kind, m.slot, m.first_ts)
            nm.last_ts, nm.strong_ts, nm.count = m.last_ts, m.strong_ts, m.count
            nm.signals, nm.preds, nm.xid = m.signals, m.preds, m.xid
            nm.take_clock(m)
            inc.findings -= m.count
            split.findings += m.count
        split.last_ts = max(m.strong_ts if m.strong_ts == m.strong_ts else m.first_ts for m in members)
        split.last_growth_ts = max(m.first_ts for m in members)
        self._rank(split)

    def _explains(self, fam: str, root: int, members: Sequence[_Member]) -> bool:
        """Whether domain ``root`` holds ``cover`` of the weight of ``members`` (as ranked)."""
        weights = [m.weight(fam) for m in members]
        if sum(weights) <= 0:
            weights = [1.0] * len(members)
        held = sum(w for m, w in zip(members, weights) if root in m.anc)
        return held >= self.cover * sum(weights) - 1e-9

    def _find_root(self, inc: _Incident) -> bool:
        """Set ``inc``'s root, root kind, hint and reason from its members; False without members."""
        members = list(inc.members.values())
        if not members:
            return False
        fam = inc.family
        root = self._rank_members(fam, members)
        self._set_root(inc, root)
        inc.root_kind = self._root_kind(fam, root)
        inc.hint, inc.reason = self._explain(inc, root, members)
        return True

    @staticmethod
    def _root_kind(fam: str, root: int) -> str:
        return "pdu" if fam == POWER and level_of(root) == RACK else LEVEL_NAMES[level_of(root)]

    def _rank_members(self, fam: str, members: Sequence[_Member]) -> int:
        """The root domain of ``members`` (evidence of family ``fam``; at least one member)."""
        if fam == FABRIC:
            root = self._rank_fabric(list(members))
        else:
            levels = LEVELS[fam]
            weights = [m.weight(fam) for m in members]
            if sum(weights) <= 0:
                weights = [1.0] * len(members)
            total = sum(weights)
            acc: dict[int, float] = {}
            for m, w in zip(members, weights):
                for a in m.anc:
                    if level_of(a) in levels:
                        acc[a] = acc.get(a, 0.0) + w
            root = -1
            for level in levels:
                cands = sorted(((w, -k) for k, w in acc.items() if level_of(k) == level), reverse=True)
                for w, nk in cands:
                    k = -nk
                    if w < self.cover * total - 1e-9:
                        break
                    if level == GPU or _supported(self.dom, level, [m for m in members if k in m.anc], []):
                        root = k
                        break
                if root >= 0:
                    break
            if root < 0:  # nothing explains enough: the coarsest domain holding the most evidence
                root = max(acc, key=lambda k: (acc[k], -levels.index(level_of(k)))) if acc else members[0].key
        return root

    def _rank_fabric(self, members: list[_Member]) -> int:
        def first(ms: list[_Member]) -> _Member:
            return min(ms, key=lambda m: (-m.weight(FABRIC), m.first_ts, m.key))

        down = [m for m in members if _down(m)]
        if len(down) >= 2:
            # most of a node's or a leaf's links down together: the node (its NICs) or the leaf
            for level in (NODE, LEAF):
                per: dict[int, int] = {}
                for m in down:
                    for a in m.anc:
                        if level_of(a) == level:
                            per[a] = per.get(a, 0) + 1
                if per:
                    k, n = max(per.items(), key=lambda kv: (kv[1], -kv[0]))
                    if n >= 2 and n >= self.cover * len(down) and 2 * n > self._links_of(k):
                        return k
        optics = [m for m in members if m.kind == "optic" and "optic_degrading" in m.signals]
        if optics:
            return first(optics).key
        failing = [m for m in members if m.kind == "link" and FAILING_LINK.intersection(m.signals)]
        if failing:
            return first(failing).key
        links = [m for m in members if m.kind in ("link", "optic")]
        if len(links) >= 2:
            for level in (NODE, LEAF):
                acc: dict[int, int] = {}
                for m in links:
                    for a in m.anc:
                        if level_of(a) == level:
                            acc[a] = acc.get(a, 0) + 1
                if acc:
                    k, n = max(acc.items(), key=lambda kv: (kv[1], -kv[0]))
                    if n >= 2 and n >= self.cover * len(links):
                        return k
        return first(links or members).key

    def _hint(self, fam: str, root: int, members: list[_Member]) -> str:
        """The fault a cause of family ``fam`` rooted at ``root`` with ``members`` names: an incident's
        ``fault_hint`` and a re-fire note's alike. Until 2026-12-06 the note read :data:`HINTS` alone,
        and a GPU whose HBM overheated again under a loop's incident read "(tim_degradation)"."""
        level = level_of(root)
        if fam == THERMAL and level == GPU:
            # (counted under the root only, as :meth:`_explain` counts its GPUs)
            hbm = sum(c for m in members if m.kind == "gpu" and root in m.anc
                      for s, c in m.signals.items() if s.startswith("hbm"))
            if hbm or any(m.xid == 48 for m in members):
                return "hbm_overheat"
        if fam == LOST and level == GPU and any(m.xid == 79 for m in members):
            return "xid79"
        if fam == FABRIC:
            domain = _fabric_domain_hint(root, members)
            if domain:
                return domain
        return HINTS.get((fam, level), fam)

    def _explain(self, inc: _Incident, root: int, members: list[_Member]) -> tuple[str, str]:
        fam, level = inc.family, level_of(root)
        name = self.dom.name(root)
        # counted under the root only: a member outside it (history a merge brought, a checkpoint
        # from before joins were ranked) is no GPU of the root's ("9 of 8 GPUs of node6")
        gpus = [m for m in members if m.kind == "gpu" and root in m.anc]
        hint = self._hint(fam, root, members)
        if inc.external_types and sum(inc.external_types.values()) >= sum(m.count for m in members):
            # made of external events only: they say what it is, in their own words
            label = max(inc.external_types, key=lambda t: inc.external_types[t])
            where = f"{len(members)} nodes under {name}" if len(members) > 1 else name
            return label.split(" (")[0], f"external: {', '.join(sorted(inc.external_types))} on {where}"
        if fam == THERMAL:
            racks = {m.anc[2] for m in gpus} | {m.key for m in members if m.kind == "rack"}
            inlet = sum(1 for m in members if "inlet_rising" in m.signals)
            if level == GPU:
                peers = len(self.dom.gpus_in(key(NODE, self.dom.gpu_node[slot_of(root)]))) - 1
                if hint == "hbm_overheat":
                    return hint, f"HBM of {name} heating toward its limit; {peers} peers of its node calm"
                return hint, f"thermal interface of {name}: thermal resistance rising while {peers} peers of its node stay calm"
            if level == NODE:
                n = len(self.dom.gpus_in(root))
                if not gpus:
                    # the node's own finding, which is either of the two (both read as the signal
                    # fan_degraded): it said "runs hot per watt" of a BMC's fan reading alone, with no GPU
                    # telemetry read at all (an audit, 2026-12-06)
                    return hint, (f"{name}'s airflow: a chassis fan slowed or stopped, or its GPUs hotter per watt "
                                  "than their own history or their rack; its GPUs not throttling yet")
                return hint, f"{len(gpus)} of {n} GPUs of {name} heating together: node fans or airflow"
            if level == RACK:
                return hint, (f"{len(gpus)} GPUs on {len({m.anc[1] for m in gpus})} nodes of {name} heating"
                              + (", rack inlet rising" if inlet else "") + ": rack coolant flow or manifold")
            if level == LOOP:
                return hint, (f"cooling loop {name}: {len(gpus)} GPUs across {len(racks)} racks heating"
                              + (f", inlet rising on {inlet} racks" if inlet else "") + ": the CDU is losing capacity")
        if fam == POWER:
            braking = sum(1 for m in gpus if "power_brake" in m.signals)
            if level == NODE:
                return hint, f"power brake on {braking} of {len(self.dom.gpus_in(root))} GPUs of {name} together: power supply"
            if level == RACK:
                # a GPU's node is its anc[1], a node member is its own (a node's anc[1] is its rack:
                # "power events on 4 nodes of rack0" read two nodes, their rack and its loop)
                nodes = {m.anc[1] for m in gpus} | {m.key for m in members if m.kind == "node" and root in m.anc}
                return hint, f"power events on {len(nodes)} nodes of {name}: the rack PDU"
            return hint, f"power {'brake' if braking else 'limit'} on {name}"
        if fam == LOST:
            xids = sorted({m.xid for m in members if m.xid})
            if hint == "xid79":
                return hint, f"{name} fell off the bus (XID 79): its job stops"
            code = f" (XID {', '.join(map(str, xids))})" if xids else ""
            return hint, f"GPU errors{code} on {len(gpus) or len(members)} GPU(s) under {name}"
        if fam == FABRIC:
            link_name = self.dom.name(key(LINK, slot_of(root) // 2)) if level == OPTIC else name
            down = [m for m in members if _down(m)]
            if _fabric_domain_hint(root, members):  # (then ``hint`` is the domain's)
                ports = self._links_of(root)
                mine = sum(1 for m in down if root in m.anc)
                if level == LEAF:
                    return hint, f"{mine} of {ports} links of leaf {name} down or erroring together: the switch"
                return hint, (f"{mine} of {ports} NIC links of {name} down or erroring together: "
                                     "its NICs, their PCIe or the host")
            predicted = [m for m in members if "link_down_predicted" in m.signals]
            congested = [m for m in members if "congestion" in m.signals]
            parts = [f"optic {name} degrading"] if level == OPTIC else []
            if down:
                parts.append(f"link {link_name} down or erroring" if len(down) == 1 else f"{len(down)} links down")
            elif predicted:
                parts.append(f"link {link_name} predicted to go down")
            if congested:
                parts.append(f"congestion on {len(congested)} link(s) that took its traffic" if parts
                             else f"congestion on {len(congested)} link(s) of {name}")
            return hint, ", then ".join(parts or [f"fabric errors on {name}"])
        if fam == JOBF:
            return hint, f"job {name} slowing down"
        label = ", ".join(sorted(inc.external_types)) or "anomalies"
        return hint, f"{label} on {len(members)} entities under {name}"

    # ---- lifecycle -----------------------------------------------------------------------------
    def _tick(self, now: float, out: list[Finding]) -> None:
        if self._left_out:
            # a move onto other hardware left members out and no one told it yet (the Kafka incident
            # stage loads the moved state and ticks on): told now, re-ranked, or resolved when none
            # is left — not at the next update with the old reason, nor as an empty open incident
            out += self.report_left_out(now)
        # resolved incidents are kept only while they can still reopen
        while self._resolved:
            inc = self._incidents.get(self._resolved[0])
            if inc is not None and now - inc.resolved_ts <= self.reopen_s:
                break
            self._resolved.popleft()  # expired, or already dropped by another path
            if inc is not None:
                self._drop(inc)
        for serial in list(self._incidents):
            inc = self._incidents.get(serial)
            if inc is None:
                continue
            if inc.state == RESOLVED:
                if inc.dirty and inc.emits and inc.merged_into >= 0:  # merged away since the last tick
                    inc.dirty = False
                    out.append(self._snapshot(inc, now))
                    self._retire(inc)
                continue
            if inc.state == PENDING:
                # quiet first: held through a gap in the stream longer than quiet_s, its evidence is
                # stale — confirmed now, it was announced open and resolved at the next tick
                if now - inc.last_ts >= self.quiet_s:
                    self.stats["unconfirmed"] += 1
                    self._drop(inc)
                elif self._confirmed(inc, now):
                    inc.state = OPEN
                    self.stats["incidents"] += 1
                    self._emit(inc, now, out)
                continue
            if not self._active(inc, now) and now - inc.last_ts >= self._quiet_s(inc):
                self._resolve(inc, now, out)
                continue
            grew, left = self._changes_since_emit(inc)
            # members that only left (split off, left out by a move) are told like a new root: an
            # update in the state it had, which neither says nor restarts growth (last_growth_ts)
            if (grew or left or inc.root != inc.emitted_root) and now - inc.last_emit_ts >= self.update_interval_s:
                if grew:
                    inc.state = GROWING
                self._emit(inc, now, out)
            elif inc.state in (OPEN, GROWING) and now - inc.last_growth_ts >= self.stable_s and not grew:
                inc.state = STABLE
                self._emit(inc, now, out)
            elif not grew and self._told_moved(inc, now):
                self._emit(inc, now, out)  # its cost or where it spreads next, in the state it had

    def _told_moved(self, inc: _Incident, now: float) -> bool:
        """Whether what ``inc`` was last told with moved — a job it slows joined or left, a slowdown
        moved by ``JOB_SLOWDOWN_STEP`` or more, or an entity it had not named is now expected to be
        hit next — asked at most every ``update_interval_s`` (after the last update, or the last time
        it was asked). Until 2026-12-05 the spread was not asked: a loop's loss named first the GPUs
        it showed then, and a GPU its later prediction put next went untold until members changed.
        Only a name joining counts: one leaving (hit, and a member; or no longer exposed) says
        nothing new, and one that wobbles out and back is not told twice."""
        if inc.emitted_jobs is None or now - max(inc.last_emit_ts, inc.jobs_checked_ts) < self.update_interval_s:
            return False
        inc.jobs_checked_ts = now
        members = _members_by_age(inc)
        jobs = dict(self._job_impact(inc, members, now)[0])
        told = inc.emitted_jobs
        # (a step read to the float's precision: x1.15 told after x1.05 moved by 0.0999999...)
        if jobs.keys() != told.keys() or any(abs(x - told[j]) >= JOB_SLOWDOWN_STEP - 1e-9 for j, x in jobs.items()):
            return True
        if inc.emitted_spread is None or not inc.live:
            return False
        # (a name due now, ETA 0, is left out: overdue predictions tie at 0 and sort by name, so which
        # of them headed the list was the alphabet's choice, told every 30 s on a loop's loss)
        return any(name not in inc.emitted_spread and eta != 0.0
                   for name, eta in self._spread(inc, members, now)[:SPREAD_HEAD])

    @staticmethod
    def _changes_since_emit(inc: _Incident) -> tuple[bool, bool]:
        """Since ``inc`` was last told: whether it grew (a member joined, or one fired again), and
        whether members only left it (none joined). One that left for another cause stays in its
        history (:meth:`_add_member`): a split (:meth:`_move_to_new_incident`) or a move onto other
        hardware takes one out (a key :meth:`remap_state` left out leaves ``emitted_keys``, not the
        count ``emitted_members``)."""
        refired = inc.refired != inc.emitted_refired
        if inc.emitted_keys is None:  # not known: the count alone, which reads a shrink as growth
            return len(inc.members) != inc.emitted_members or refired, False
        joined = not inc.members.keys() <= inc.emitted_keys
        # (none joined: the members are among those told, fewer when the count says more were)
        return joined or refired, not joined and len(inc.members) != inc.emitted_members

    def _quiet_s(self, inc: _Incident) -> float:
        return self.quiet_s if math.isnan(inc.quiet_s) else inc.quiet_s

    def _confirmed(self, inc: _Incident, now: float) -> bool:
        if now - inc.first_ts < self.hold_s:
            return False
        # what was said (members' findings, job consequences), not withdrawals: a lone prediction
        # withdrawn as a false alarm before the hold time is not two findings
        said = sum(m.count for m in inc.members.values()) + sum(inc.jobs_hit.values())
        return said >= 2 or len(inc.members) >= 2 or any(
            SIGNALS[s].observed and SIGNALS[s].opens for m in inc.members.values() for s in m.signals)

    def _pending(self, inc: _Incident, m: _Member, now: float) -> Iterable[tuple[str, float, float]]:
        """A member's predictions that still count, as (event, ts, eta): unexpired (ETA plus
        ``quiet_s``) and held by the incident that holds the entity (one that moved on to another
        cause is that one's; a checkpoint from before kept them in both)."""
        if m.preds and self._holds(inc, m):
            for (event, _), (ts, eta) in m.preds.items():
                if now - ts <= max(eta, 0.0) + self.quiet_s:
                    yield event, ts, eta

    def _active(self, inc: _Incident, now: float) -> bool:
        """An unexpired prediction keeps an incident open even when nothing new arrives, and so
        does a GPU that fell off the bus until its telemetry (when given) shows it back."""
        return any(self._holds_open(inc, m, now) for m in inc.members.values())

    def _holds_open(self, inc: _Incident, m: _Member, now: float) -> bool:
        """Whether member ``m`` keeps ``inc`` open at ``now`` with no finding (:meth:`_active`)."""
        for event, _, _ in self._pending(inc, m, now):
            # a symptom's prediction (a routine power cap) does not hold an incident open
            if SIGNALS[EVENT_SIGNALS.get(event, "generic")].opens:
                return True
        return m.kind == "gpu" and "gpu_lost" in m.signals and self.tel.silent_since(m.slot, m.last_ts)

    def _emit(self, inc: _Incident, now: float, out: list[Finding]) -> None:
        if inc.dirty:
            self._rank(inc)
            inc.dirty = False
        inc.emits += 1
        inc.last_emit_ts = now
        inc.emitted_members = len(inc.members)
        inc.emitted_keys = frozenset(inc.members)
        inc.emitted_refired = inc.refired
        inc.emitted_root = inc.root
        told = self._snapshot(inc, now)
        inc.emitted_jobs = dict(told.jobs)
        inc.emitted_spread = frozenset(name for name, _ in told.predicted_members)
        out.append(told)

    def _resolve(self, inc: _Incident, now: float, out: list[Finding]) -> None:
        inc.state = RESOLVED
        inc.resolved_ts = now
        self._unroot(inc)  # resolved incidents are not roots others can join
        out.append(self._snapshot(inc, now))
        self._retire(inc)

    def _retire(self, inc: _Incident) -> None:
        if inc.serial not in self._resolved:
            self._resolved.append(inc.serial)
        while len(self._resolved) > self.keep_resolved:
            old = self._incidents.get(self._resolved.popleft())
            if old is not None:
                self._drop(old)

    def _drop(self, inc: _Incident) -> None:
        for mkey in list(inc.members):
            self._forget_member(inc, mkey)
            level, s = level_of(mkey), slot_of(mkey)
            if self.s_member_of[level][s] == inc.serial:
                self.s_member_of[level][s] = -1
        self._unroot(inc)
        self._incidents.pop(inc.serial, None)

    # ---- output --------------------------------------------------------------------------------
    def _snapshot(self, inc: _Incident, now: float) -> Incident:
        members = _members_by_age(inc)
        jobs, risk = self._job_impact(inc, members, now) if inc.live else ((), 0.0)
        return Incident(
            ts=now, incident_id=inc.id, state=inc.state if inc.state != PENDING else OPEN,
            root_kind=inc.root_kind, root_entity=self.dom.name(inc.root) if inc.root >= 0 else "",
            reason=inc.reason + self._refire_text(inc, members), members=tuple(self.dom.name(m.key) for m in members),
            predicted_members=self._spread(inc, members, now) if inc.live else (),
            jobs=jobs, gpu_hours_at_risk_per_hour=round(risk, 3), findings=inc.findings, fault_hint=inc.hint,
        )

    def _refire_text(self, inc: _Incident, members: list[_Member]) -> str:
        """The notes of ``inc``'s re-fires (:func:`refire_note`), oldest first: each ranked from the
        members that fired again then, so that one naming another root than the incident's is a
        new cause an on-call person sees, with its time."""
        if not inc.bursts:
            return ""
        by_burst: dict[float, list[_Member]] = {t: [] for t in inc.bursts}
        for m in members:
            if m.refired_ts in by_burst:
                by_burst[m.refired_ts].append(m)
        notes = []
        for t, ms in by_burst.items():
            if ms:
                root = self._rank_members(inc.family, ms)
                notes.append(refire_note(t, root == inc.root, self._root_kind(inc.family, root),
                                         self.dom.name(root), self._hint(inc.family, root, ms), len(ms)))
        return "".join(notes)

    def _spread(self, inc: _Incident, members: list[_Member], now: float) -> tuple[tuple[str, float], ...]:
        """Entities expected to be hit next, soonest / least headroom first, with ETAs (-1: unknown)."""
        cap = self.max_predicted
        if cap == 0:
            return ()
        at_risk: list[tuple[float, str]] = []
        for m in members:
            if m.observed:
                continue
            etas = [max(0.0, e - (now - ts)) if e >= 0 else math.inf for _, ts, e in self._pending(inc, m, now)]
            if etas:  # (an expired prediction is not 'due now' for as long as the incident lives)
                at_risk.append((min(etas), self.dom.name(m.key)))
        at_risk.sort()
        out = [(n, round(e, 1) if math.isfinite(e) else -1.0) for e, n in at_risk[:cap]]
        if len(out) < cap:
            out += self._exposed(inc, members, cap - len(out), now)
        return tuple(out)

    def _exposed(self, inc: _Incident, members: list[_Member], room: int, now: float) -> list[tuple[str, float]]:
        """The entities exposed to ``inc``'s cause that show nothing yet: neither its own members nor
        any another live incident holds with a current observed effect (:meth:`_shows_elsewhere`). Until
        2026-12-05 only its own were left out: a loss of loop capacity listed first the GPUs of a
        node already throttling on its failed fans, and a link down named its sibling, down on its
        own, as the link to take its traffic (10 of 37 updates of a simulated day)."""
        level = level_of(inc.root) if inc.root >= 0 else -1
        if inc.family in (THERMAL, POWER, GENERIC) and level in (NODE, RACK, LOOP):
            gpus = self.dom.gpus_in(inc.root)
            # its members are not what it spreads to next (one that moved on to another cause, and
            # whose prediction it listed first, was named twice)
            gpus = gpus[~np.isin(gpus, [m.slot for m in members if m.kind == "gpu"])]
            owner = self.s_member_of[GPU][gpus]
            held = [i for i in np.flatnonzero((owner >= 0) & (owner != inc.serial))
                    if self._shows_elsewhere(inc, GPU, int(gpus[i]), now)]
            if held:
                gpus = np.delete(gpus, held)
            return exposed_gpus(self.dom, self.tel, gpus, inc.family == POWER, room)
        if inc.family == FABRIC:
            failing: dict[int, float] = {}  # link -> ETA of its failure (0: down, -1: unknown)
            nic_next: dict[int, float] = {}  # a NIC-alarmed node's own links -> the alarm's ETA
            for m in members:
                if m.kind in ("link", "optic"):
                    # failing now: seen down or erroring, or predicted down by a prediction that still
                    # counts; a prediction withdrawn (its signal stays in the member's history) named
                    # the link's siblings until the incident resolved
                    pending = [max(0.0, e - (now - ts)) for event, ts, e in self._pending(inc, m, now)
                               if event == "link_down"]
                    if not pending and "link_down" not in m.signals and "link_errors" not in m.signals:
                        continue
                    links = [m.slot if m.kind == "link" else m.slot // 2]
                    # the detectors' ETA, counted down to now: the soonest (unknown: -1)
                    eta = 0.0 if "link_down" in m.signals else min((e for e in pending if e >= 0), default=-1.0)
                elif m.kind == "node" and FAILING_LINK.intersection(m.signals):
                    # an external NIC alarm on a node: its own NIC links are what fails next (named
                    # themselves, below), not where the traffic goes: with them among the failing,
                    # each was named as the reroute target of the others
                    eta = 0.0 if "link_down" in m.signals else min(
                        (max(0.0, e - (now - ts)) for event, ts, e in self._pending(inc, m, now)
                         if event == "link_down" and e >= 0), default=-1.0)
                    for link in (int(x) for x in self.dom.children(self.dom.node_links, m.slot)):
                        known = [e for e in (nic_next.get(link, -1.0), eta) if e >= 0]
                        nic_next[link] = min(known) if known else -1.0
                    continue
                else:
                    continue
                for link in links:
                    # an optic and its link are both members: the soonest known ETA wins, unknown (-1)
                    # only when neither knows (min() alone would let the optic's unknown hide the link's)
                    known = [e for e in (failing.get(link, -1.0), eta) if e >= 0]
                    failing[link] = min(known) if known else -1.0
            # not taking the traffic: links it holds, links failing themselves, a NIC alarm's own links
            # (named as failing next, below), and links another live incident holds with an observed
            # effect (a sibling down on its own)
            skip = {m.slot for m in members if m.kind == "link"} | failing.keys()

            def held_elsewhere(t: int) -> bool:
                return any(self._shows_elsewhere(inc, lvl, s, now)
                           for lvl, s in ((LINK, t), (OPTIC, 2 * t), (OPTIC, 2 * t + 1)))

            for link in failing:
                for t in self.dom.reroute_targets(link):
                    t = int(t)
                    if t not in skip and held_elsewhere(t):
                        skip.add(t)
            # a NIC alarm's own links first (docs/external-events.md: "names the node's own NIC links
            # as next to fail"), those not already hit
            own = [(link, eta) for link, eta in sorted(nic_next.items())
                   if link not in skip and not held_elsewhere(link)]
            named = [(self.dom.topology.links[link], round(eta, 1)) for link, eta in own[:room]]
            rerouted = reroute_targets_ranked(self.dom, self.tel, failing, skip | nic_next.keys(), room - len(named))
            return named + rerouted
        return []

    def _shows_elsewhere(self, inc: _Incident, level: int, slot: int, now: float) -> bool:
        """Whether another live incident than ``inc`` holds the entity with a current observed
        effect (a GPU throttling, a link down): it is already hit, not exposed to ``inc``'s cause
        next. Current: its last observed finding within the holder's quiet time (a held throttle
        or brake is said again every few minutes, :mod:`.throttle_bits`), or its telemetry still
        showing it: a GPU at its limit or still off the bus, a link seen down that has carried no
        traffic since. Until 2026-12-05 one effect ever shown counted for as long as its incident
        lived: a GPU that throttled once, calm for 20 minutes on a node whose fans failed, was left
        out of its loop's spread."""
        serial = int(self.s_member_of[level][slot])
        if serial < 0 or serial == inc.serial:
            return False
        other = self._incidents.get(serial)
        if other is None or not other.live or other.merged_into >= 0:
            return False
        m = other.members.get(key(level, slot))
        if m is None or not m.observed:
            return False
        if now - m.shown_ts <= self._quiet_s(other):
            return True
        if level == GPU:
            return (self.tel.at_limit(slot, now - self._quiet_s(other))
                    or ("gpu_lost" in m.signals and self.tel.silent_since(slot, m.last_ts)))
        if level == LINK:  # (a down is said once: the link stays down until it carries traffic again)
            return "link_down" in m.signals and not self.tel.carried_since(slot, m.shown_ts)
        return False

    def _job_impact(self, inc: _Incident, members: list[_Member],
                    now: float) -> tuple[tuple[tuple[str, float], ...], float]:
        """Per job touched: the step slowdown its current evidence gives (its slowest member sets
        the pace). A job's measured slowdown is this incident's only when no other incident's
        evidence explains more of it: a PSU brake's 3x is not also a TIM's predicted 1.15x."""
        evidence = self._job_evidence(inc, members, now)
        measured = {j for j, (_, _, seen) in evidence.items()
                    if not math.isnan(self.tel.measured_slowdown(j, now, since=seen))}
        if measured:
            # the incidents with evidence on each job, strongest first (one map per tick, not every
            # other incident's evidence per snapshot: 1,000 links down with step times measured
            # took 10 s a tick); whether one may claim the job is asked now, as states change
            # within a tick (an incident confirmed, resolved or merged by an earlier snapshot)
            ranked = self._job_claims(now)
            for j in list(measured):
                mine = (max(evidence[j][:2]), -inc.serial)
                for score, serial in ranked.get(j, ()):
                    if score <= mine:
                        break
                    other = self._incidents.get(serial)
                    if (other is not None and other is not inc and other.live and other.state != PENDING
                            and other.merged_into < 0):
                        measured.discard(j)
                        break
        return job_impact(self.dom, self.tel, evidence, measured, now)

    def _job_claims(self, now: float) -> dict[int, list[tuple[tuple[float, int], int]]]:
        """Per job, each live incident with evidence on it as ((its slowdown, -serial), serial),
        strongest first: kept while nothing that evidence reads has changed (:meth:`_changed`)."""
        if self._claims is not None and self._claims_at == (now, self._generation):
            return self._claims
        claims: dict[int, list[tuple[tuple[float, int], int]]] = {}
        for other in self._incidents.values():
            if not other.live:  # (a resolved one reopens only on input, which is a change)
                continue
            for j, ev in self._job_evidence(other, list(other.members.values()), now).items():
                claims.setdefault(j, []).append(((max(ev[:2]), -other.serial), other.serial))
        for ranked in claims.values():
            ranked.sort(reverse=True)
        self._claims, self._claims_at = claims, (now, self._generation)
        return claims

    def _changed(self) -> None:
        """Something job evidence reads has changed: members, their signals and predictions, who
        holds an entity, job consequences, telemetry (:meth:`_job_claims` computes it again). An
        incident dropped needs none: what it held was its own evidence, and it is looked up again."""
        self._generation += 1

    def _job_evidence(self, inc: _Incident, members: list[_Member],
                      now: float) -> dict[int, tuple[float, float, float]]:
        """Per job its members are in: (the slowdown of what they showed within ``quiet_s``, that
        of their active predictions, when they last showed an effect). What a member showed once
        and no longer does, or predicted and withdrew, says nothing of the job's pace now. A member's
        straggler "slower" finding counts at the slowdown its clock deficit measured
        (:func:`~.incident_signals.clock_deficit_slowdown`) while it is within ``quiet_s`` (the
        detector repeats it every ``refresh_s`` while it lasts)."""
        slow: dict[int, tuple[float, float, float]] = {j: (1.0, 1.0, -math.inf) for j in inc.jobs_hit}
        dom = self.dom
        for m in members:
            recent = now - m.last_ts <= self.quiet_s or (
                m.kind == "gpu" and "gpu_lost" in m.signals and self.tel.silent_since(m.slot, m.last_ts))
            # observed effects only: a prediction withdrawn (its member's last_ts moved to the
            # withdrawal) charged its job for quiet_s after it (until 2026-12-05); an active one
            # is foretold, below
            shown = max((SIGNALS[s].slowdown for s in m.signals if SIGNALS[s].observed), default=1.0) \
                if recent else 1.0
            if now - m.clock_ts <= self.quiet_s:
                shown = max(shown, m.clock_slow)
            foretold = max((SIGNALS[EVENT_SIGNALS.get(e, "generic")].slowdown
                            for e, _, _ in self._pending(inc, m, now)), default=1.0)
            if m.kind == "gpu":
                j = int(dom.gpu_job[m.slot])
            elif m.kind == "node":
                j = int(dom.node_job[m.slot])
            elif m.kind in ("link", "optic"):
                j = int(dom.link_job[m.slot if m.kind == "link" else m.slot // 2])
            elif m.kind == "job":
                j = m.slot
            else:  # a rack: the jobs of its GPUs feel it through their own findings
                continue
            if j >= 0:
                was_shown, was_foretold, seen = slow.get(j, (1.0, 1.0, -math.inf))
                slow[j] = (max(was_shown, shown), max(was_foretold, foretold),
                           max(seen, m.shown_ts) if recent and m.observed else seen)
        return slow

    # ---- queries -------------------------------------------------------------------------------
    def incidents(self, now: float | None = None, include_resolved: bool = False) -> list[Incident]:
        """Current incidents (confirmed ones; resolved ones too when asked)."""
        t = self.last_tick if now is None else now
        return [self._snapshot(i, t) for i in self._incidents.values()
                if i.state != PENDING and (include_resolved or i.live)]

    def flush(self, now: float) -> list[Finding]:
        """Report what is due at the end of a stream (pending incidents past their hold, growth).
        External events still queued are dated after the stream's last time: they will never be
        grouped, and are counted as a problem rather than dropped silently (a file in epoch
        milliseconds, read before any telemetry, was lost whole)."""
        out: list[Finding] = []
        self.last_tick = now
        self._drain_external(now)  # those dated by the end (queued since the last observe) are grouped
        self._tick(now, out)
        if self._external:
            first = self._external[0][2]
            self.health.problem(self.name, "external event dated after the end of the telemetry: never grouped",
                                count=len(self._external), detail=f"{first.type} on {first.node} at {first.time:.0f}, "
                                f"telemetry ended at {now:.0f}")
            self._external.clear()
        return out

    def incident_ids(self) -> set[str]:
        """The ids of the incidents this engine holds (open or resolved and kept for a reopening)."""
        return {inc.id for inc in self._incidents.values()}

    def report_left_out(self, now: float) -> list[Finding]:
        """Each open incident a move onto other hardware (:meth:`remap_state`) left members out of,
        told again at once without them: re-ranked from the members left (a rack-wide incident may
        be one node's now), in the state it was (growing only where a member joined since it was
        last told), or resolved when none is left. An engine that is not asked ticks it so.
        Without this the findings file and ``/metrics`` kept listing the GPUs of a host ``foreshock
        watch`` forgot until the incident's next update, which then said it was growing (h20). One
        not told yet (pending) is ranked when it is; a resolved one keeps its history."""
        out: list[Finding] = []
        for serial in self._left_out:
            inc = self._incidents.get(serial)
            if inc is None or not inc.live or not inc.emits:
                continue
            if inc.members:
                if self._changes_since_emit(inc)[0]:
                    inc.state = GROWING  # (one joined since it was last told, as the other left)
                inc.dirty = True
                self._emit(inc, now, out)
            else:
                self._resolve(inc, now, out)
        self._left_out = []
        return out

    def follow_moves(self, moved_from: np.ndarray, now: float, parked: Iterable[tuple[int, Hashable]] = (),
                     unparked: Iterable[tuple[int, Hashable]] = (), dropped: Iterable[Hashable] = ()) -> list[Finding]:
        """GPU boards renumbered within their node (a GPU missing at a reboot moves the later ones
        one index down, ``InputGuard.follow_boards``): ``moved_from[slot]`` is the slot the board
        read in ``slot`` now was read in before (-1: none moved there). Each incident member and
        root that is a moved board follows it to its new slot, as the detector state does
        (``DetectorBank.move_gpus``): an incident is about a board, not an index. Without this, one
        degrading board's incident, still held by its old slot, took the board again at its new
        one — ``growing root=node0 members=(node0/gpu5, node0/gpu4)``, a node-wide cause out of one
        board (h24). A slot a board left keeps nothing of it; a board whose slot another board
        took and that is read nowhere now (the one missing) is left out of its incidents, as a move
        onto other hardware leaves out what is gone (:meth:`remap_state`). A slot that took no
        board that moved keeps its history (a board swapped in it, an RMA: the incident is the slot's).

        The guard may set a displaced board's state aside for when it is read again
        (``BoardSwap.parked``, by a key such as (node, board)): ``parked`` names, per slot whose
        board was so displaced, that key, and what the board was a member of is kept under it;
        ``unparked`` names the slots whose board takes a parked state back, and there it becomes
        a member again of those of its incidents the engine still holds (told again where open; in
        a resolved one's history, for a reopening). ``dropped``: keys given up. Kept in the state, as
        the guard and the bank keep their parking (until 2026-12-04 in memory only: a parked board
        read again after a worker's restart rejoined no incident, its cause opened a second one).

        Returns each open incident that changed, told again at once under its new member names:
        re-ranked (its root and reason follow the board), in the state it was (it did not grow);
        resolved where none of its members is left. One not told yet is ranked when it is; a
        resolved one is renamed for a reopening and keeps its history. Call it right after the
        detector state moved and before the withdrawn and re-made predictions of the move
        (``follow_predictions``) are handed over: those of a moved board are then its own again."""
        n = self.dom.sizes["gpu"]
        moved_from = np.asarray(moved_from, dtype=np.int64)
        if moved_from.shape != (n,):
            raise ValueError(f"moved_from has shape {moved_from.shape}, expected ({n},)")
        for gone in dropped:
            self._parked.pop(gone, None)
        parked, unparked = list(parked), list(unparked)
        moved = np.flatnonzero(moved_from >= 0)
        take_from = np.arange(n, dtype=np.int64)
        take_from[moved_from[moved]] = -1  # a board that moved left its slot ...
        take_from[moved] = moved_from[moved]  # ... for the one it is read in now (read at once: cycles too)
        for slot, _ in unparked:
            take_from[slot] = -1  # its board's incidents come from the parking, not the slot's
        # a displaced board whose slot another board took: its memberships set aside
        park = {int(slot): k for slot, k in parked if take_from[slot] != slot}
        if (take_from == np.arange(n)).all():
            return []
        remap = Remap.rearranged(self.topology, take_from)
        new_gpu = remap.new_of_old["gpu"]

        def renamed(k: int) -> bool:
            return k >= 0 and level_of(k) == GPU and int(new_gpu[slot_of(k)]) != slot_of(k)

        state = self.state_dict()
        changed: list[int] = []
        gone_roots: dict[int, int] = {}  # serial -> its root, a board read nowhere now
        for d in state["incidents"]:
            serial, root = int(d["serial"]), int(d["root"])
            if renamed(root) or any(renamed(int(m[0])) for m in d["members"]):
                changed.append(serial)
            owned = {int(k) for k in d.get("owned", ())}
            for m in d["members"]:
                k = int(m[0])
                if level_of(k) == GPU and slot_of(k) in park:
                    self._parked.setdefault(park[slot_of(k)], []).append((serial, list(m), k in owned))
            if renamed(root) and new_gpu[slot_of(root)] < 0:
                # kept for a new root among the members left, or the board's return (a move onto
                # other hardware drops an incident whose root is gone: its sinks are told by the
                # pipeline, not here)
                gone_roots[serial] = root
                d["root"] = -1
        held_aside, left_out = self._parked, self._left_out  # (load_state_dict starts both afresh)
        self.load_state_dict(self.remap_state(state, remap))
        self._parked, self._left_out = held_aside, left_out
        for slot, parked_as in unparked:
            changed += self._take_back(int(slot), self._parked.pop(parked_as, []))
        while sum(len(v) for v in self._parked.values()) > n:  # bounded as the guard's: the oldest goes
            del self._parked[next(iter(self._parked))]
        waiting = {serial for memberships in self._parked.values() for serial, _, _ in memberships}
        for serial in gone_roots:
            inc = self._incidents.get(serial)
            if inc is None or inc.live:
                continue
            if inc.members:
                self._find_root(inc)  # described from the members left, for a reopening
            elif serial not in waiting:
                self._drop(inc)  # nothing left that could reopen it
        out: list[Finding] = []
        for serial in dict.fromkeys(changed):
            inc = self._incidents.get(serial)
            if inc is None or not inc.live:
                continue
            inc.dirty = True  # its reason names its members: described again
            if not inc.members:
                root = gone_roots.get(serial, inc.root)
                self._set_root(inc, root)
                if inc.emits:
                    what = f"{self.dom.name(root)}'s board" if root >= 0 and level_of(root) == GPU \
                        else "the boards of its GPUs"
                    inc.reason = f"resolved: {what} no longer read (the node's GPUs renumbered at a reboot)"
                    self._resolve(inc, now, out)
                else:
                    self._drop(inc)
            elif inc.emits:
                self._emit(inc, now, out)
            elif inc.root < 0:
                self._find_root(inc)  # a root among the members left, until it is told
        return out

    def _take_back(self, slot: int, memberships: list[tuple[int, list[Any], bool]]) -> list[int]:
        """A board read again at GPU ``slot`` whose memberships were set aside (:meth:`follow_moves`):
        a member again, there, of each of those incidents still held (merged since: of the one it
        was merged into). Returns the incidents it is back in."""
        self._changed()
        back = []
        mkey = key(GPU, slot)
        for serial, (_, kind, _, first, last, strong, count, signals, preds, xid, *more), owned in memberships:
            inc = self._incidents.get(serial)
            inc = self._surviving(inc) if inc is not None else None
            if inc is None or inc.merged_into >= 0 or mkey in inc.members:
                continue
            serial = inc.serial
            m = _Member(mkey, kind, slot, self.dom.ancestors(kind, slot), float(first))
            m.restore(last, strong, count, signals, preds, xid, more)
            inc.members[mkey] = m
            if owned and self.s_member_of[GPU][slot] < 0:
                self.s_member_of[GPU][slot] = serial
                self._index_add(inc, m.anc)
            back.append(serial)
        return back

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        incs = []
        for inc in self._incidents.values():
            incs.append({
                "serial": inc.serial, "family": inc.family, "first_ts": inc.first_ts, "last_ts": inc.last_ts,
                "last_growth_ts": inc.last_growth_ts, "state": inc.state, "root": inc.root,
                "findings": inc.findings, "emits": inc.emits, "last_emit_ts": inc.last_emit_ts,
                "emitted_members": inc.emitted_members, "emitted_root": inc.emitted_root, "dirty": inc.dirty,
                "emitted_keys": None if inc.emitted_keys is None else sorted(inc.emitted_keys),
                "resolved_ts": inc.resolved_ts, "merged_into": inc.merged_into, "reason": inc.reason,
                "jobs_hit": dict(inc.jobs_hit), "external_types": dict(inc.external_types),
                "members": [m.to_state() for m in inc.members.values()],
                # which members it holds now (an entity that moved on to another cause stays in the
                # history of the incident it left), and how it was described
                "owned": [m.key for m in inc.members.values() if self._holds(inc, m)],
                "root_kind": inc.root_kind, "hint": inc.hint, "quiet_s": inc.quiet_s,
                "bursts": list(inc.bursts), "refired": inc.refired, "emitted_refired": inc.emitted_refired,
                "emitted_jobs": None if inc.emitted_jobs is None else sorted(inc.emitted_jobs.items()),
                # when its job cost was last checked (_told_moved): restored as -inf, the next tick
                # re-checked it at once and every later update moved (until 2026-12-05)
                "jobs_checked_ts": inc.jobs_checked_ts,
                "emitted_spread": None if inc.emitted_spread is None else sorted(inc.emitted_spread),
            })
        return {
            "incidents": incs, "resolved": list(self._resolved), "next_serial": self.next_serial,
            "last_tick": self.last_tick, "latest_now": self.latest_now, "stats": dict(self.stats),
            "telemetry": self.tel.state_dict(),
            "external": [[t, n, e.node, e.time, e.type, e.severity] for t, n, e in self._external],
            "external_seen": [list(said) for said in self._external_seen],
            "external_forgotten_to": self._external_forgotten_to, "external_prune_at": self._external_prune_at,
            # boards displaced at a renumbering, read nowhere since, and their memberships
            # (follow_moves): a restored engine gives a board read again its incidents back too
            "parked": [[list(k) if isinstance(k, tuple) else k, [[serial, member, owned] for serial, member, owned in v]]
                       for k, v in self._parked.items()],
            "jobs": self.topology.job_keys(),
        }

    def remap_state(self, state: dict[str, Any], remap: Remap) -> dict[str, Any]:
        """A state saved under other hardware (``core/remap.py``), renumbered for this topology:
        each incident member, root and GPU or link telemetry row follows its entity by name. A
        member no longer listed is left out, and an incident whose root is no longer listed is
        dropped (the hardware it was about is gone); jobs are found again by :meth:`load_state_dict`."""
        def moved(k: int) -> int:
            level = level_of(k) if k >= 0 else -1
            if level < 0 or level == JOB:
                return k
            slot = int(remap.slots(_LEVEL_SLOTS[level], np.array([slot_of(k)]))[0])
            return key(level, slot) if slot >= 0 else -1

        incidents = []
        for d in state["incidents"]:
            root = moved(int(d["root"]))
            if int(d["root"]) >= 0 and root < 0:
                continue
            members, renamed = [], {}
            for mkey, kind, slot, *rest in d["members"]:
                new = int(slot) if kind == "job" else int(remap.slots(kind, np.array([slot]))[0])
                if new >= 0:
                    renamed[int(mkey)] = key(MEMBER_LEVEL[kind], new) if kind != "job" else mkey
                    members.append([renamed[int(mkey)], kind, new, *rest])
            moved_d = {**d, "root": root, "emitted_root": moved(int(d["emitted_root"])), "members": members}
            if d.get("emitted_keys") is not None:
                # renamed as the members are; one left out leaves the keys but not the count, so that
                # the update report_left_out makes (asked, or at the next tick) tells the members left
                told = (moved(int(k)) for k in d["emitted_keys"])
                moved_d["emitted_keys"] = sorted(k for k in told if k >= 0)
            if len(members) < len(d["members"]):
                moved_d["members_left_out"] = len(d["members"]) - len(members)  # for report_left_out
            if "owned" in d:
                moved_d["owned"] = [renamed[int(k)] for k in d["owned"] if int(k) in renamed]
            incidents.append(moved_d)
        tel = dict(state["telemetry"])
        fresh = self.tel.state_dict()
        tel["s_gpu_tel"] = remap.rows("gpu", tel["s_gpu_tel"], fresh["s_gpu_tel"])
        tel["s_link_tel"] = remap.rows("link", tel["s_link_tel"], fresh["s_link_tel"])
        # the guard gives up its parking on other hardware (a board's key names its node's slot)
        return {**state, "incidents": incidents, "telemetry": tel, "parked": []}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved state. Jobs are found again by name and nodes: a worker restarted with
        a new job list keeps the step times and job consequences of the jobs still listed; an
        incident member or root that was a job no longer listed is left out."""
        self._changed()
        job_slots = self.topology.job_slot_map(state["jobs"]) if "jobs" in state else None
        if job_slots is not None and np.array_equal(job_slots, np.arange(len(self.topology.jobs))):
            job_slots = None  # the same jobs in the same slots

        def job_slot(slot: int) -> int:
            return slot if job_slots is None else int(job_slots[slot])

        def member_key(k: int) -> int:  # a job member's with its job found again (-1: no longer listed)
            if level_of(k) != JOB:
                return k
            slot = job_slot(slot_of(k))
            return key(JOB, slot) if slot >= 0 else -1

        self.tel.load_state_dict(state["telemetry"], job_slots)
        for owner_of in self.s_member_of.values():
            owner_of[:] = -1
        self._incidents, self._index, self._rooted = {}, {}, {}
        self._left_out = [int(d["serial"]) for d in state["incidents"] if d.get("members_left_out")]
        # (a checkpoint from before the parking was saved has none: a board read again rejoins nothing)
        self._parked = {tuple(k) if isinstance(k, list) else k: [(int(serial), list(member), bool(owned))
                                                                 for serial, member, owned in v]
                        for k, v in state.get("parked", ())}
        owners: dict[int, int] = {}  # member key -> the incident holding it
        for d in state["incidents"]:
            inc = _Incident(int(d["serial"]), d["family"], float(d["first_ts"]))
            for k in ("last_ts", "last_growth_ts", "last_emit_ts", "resolved_ts"):
                setattr(inc, k, float(d[k]))
            for k in ("findings", "emits", "emitted_members", "merged_into"):
                setattr(inc, k, int(d[k]))
            told_root = int(d["emitted_root"])  # a job's found again as the root is (-1: not listed)
            inc.emitted_root = member_key(told_root) if told_root >= 0 else told_root
            inc.state, inc.dirty, inc.reason = d["state"], bool(d["dirty"]), d["reason"]
            inc.quiet_s = float(d.get("quiet_s", math.nan))
            inc.bursts = [float(t) for t in d.get("bursts", ())]
            inc.refired, inc.emitted_refired = int(d.get("refired", 0)), int(d.get("emitted_refired", 0))
            jobs_told = d.get("emitted_jobs")  # (absent from a checkpoint from before they were saved)
            inc.emitted_jobs = None if jobs_told is None else {str(j): float(x) for j, x in jobs_told}
            inc.jobs_checked_ts = float(d.get("jobs_checked_ts", -math.inf))  # (absent: from before it was saved)
            spread_told = d.get("emitted_spread")  # (absent from a checkpoint from before it was saved)
            inc.emitted_spread = None if spread_told is None else frozenset(str(n) for n in spread_told)
            told = d.get("emitted_keys")  # (absent from a checkpoint from before they were saved)
            inc.emitted_keys = None if told is None else frozenset(
                k for k in (member_key(int(k)) for k in told) if k >= 0)
            inc.jobs_hit = {job_slot(int(j)): int(c) for j, c in d["jobs_hit"].items() if job_slot(int(j)) >= 0}
            inc.external_types = dict(d["external_types"])
            self._incidents[inc.serial] = inc
            saved_owned = d.get("owned")  # (a checkpoint from before it was saved: the last one listing it)
            owned = None if saved_owned is None else {int(k) for k in saved_owned}
            for mkey, kind, slot, first, last, strong, count, signals, preds, xid, *more in d["members"]:
                slot = job_slot(int(slot)) if kind == "job" else int(slot)
                if slot < 0:
                    continue
                level = MEMBER_LEVEL[kind]
                m = _Member(key(level, slot), kind, slot, self.dom.ancestors(kind, slot), float(first))
                m.restore(last, strong, count, signals, preds, xid, more)
                inc.members[m.key] = m
                if owned is None or int(mkey) in owned:
                    owners[m.key] = inc.serial
            if "root_kind" in d:
                inc.root_kind, inc.hint = str(d["root_kind"]), str(d["hint"])
            else:
                self._find_root(inc)  # describes it; never merges, which only live input may cause
            inc.reason = d["reason"]
            saved_root = int(d["root"])
            root = member_key(saved_root) if saved_root >= 0 else saved_root
            if root < 0 <= saved_root:  # its job is no longer listed: ranked again from the members left
                self._find_root(inc)
                root = inc.root
            self._set_root(inc, root)
            if not inc.live and inc.root >= 0:
                self._rooted.get(inc.root, set()).discard(inc.serial)
                if not self._rooted.get(inc.root, True):
                    del self._rooted[inc.root]
        for mkey, serial in owners.items():
            holder = self._incidents[serial]
            self.s_member_of[level_of(mkey)][slot_of(mkey)] = serial
            self._index_add(holder, holder.members[mkey].anc)
        self._resolved = deque(int(s) for s in state["resolved"])
        self.next_serial = int(state["next_serial"])
        self.last_tick = float(state["last_tick"])
        # an engine restored without it accepted, until its next frame, an external event dated a
        # day ahead that the one saved refused; a checkpoint from before it was saved: the latest
        # time it shows (its last tick, its newest GPU telemetry)
        self.latest_now = float(state.get("latest_now", max(self.last_tick, self.tel.gpu_frames_ts)))
        self.stats = {k: int(v) for k, v in state["stats"].items()}
        self._external = [(float(t), int(n), ExternalEvent(str(node), float(time), str(typ), str(sev)))
                          for t, n, node, time, typ, sev in state["external"]]
        heapq.heapify(self._external)
        # a checkpoint from before they were kept: none known (a repeat of an event taken before it counts again)
        self._external_seen = {(str(node), float(time), str(typ), str(sev)): None
                               for node, time, typ, sev in state.get("external_seen", ())}
        self._external_prune_at = int(state.get("external_prune_at",
                                                max(EXTERNAL_SEEN_PRUNE, 2 * len(self._external_seen))))
        self._external_forgotten_to = float(state.get("external_forgotten_to", -math.inf))

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` when the indexes disagree with the incidents (tests use it)."""
        index: dict[int, dict[int, int]] = {}
        rooted: dict[int, set[int]] = {}
        for inc in self._incidents.values():
            for m in inc.members.values():
                if self.s_member_of[level_of(m.key)][slot_of(m.key)] == inc.serial:
                    for a in m.anc:
                        d = index.setdefault(a, {})
                        d[inc.serial] = d.get(inc.serial, 0) + 1
            if inc.live and inc.root >= 0:
                rooted.setdefault(inc.root, set()).add(inc.serial)
            # (more told than the keys known: members a move left out, to be told at the next tick)
            assert inc.emitted_keys is None or len(inc.emitted_keys) <= inc.emitted_members, "emitted keys"
        assert index == self._index, "domain index out of step with the incidents"
        assert rooted == self._rooted, "root registry out of step with the incidents"
        for level, arr in self.s_member_of.items():
            for slot in np.flatnonzero(arr >= 0):
                owner = self._incidents.get(int(arr[slot]))
                assert owner is not None and key(level, int(slot)) in owner.members, "entity points at a missing incident"
        assert len(self._resolved) <= self.keep_resolved

    def state_nbytes(self) -> int:
        return self.tel.nbytes + int(sum(a.nbytes for a in self.s_member_of.values()))


# ---- helpers -------------------------------------------------------------------------------------
def _recency(inc: _Incident) -> tuple[float, int]:
    """Which of two incidents a finding goes to when both could take it: the one heard from last,
    then the older. Explicit, not the order of the domain index, which a restored engine rebuilds
    in another order (creation, not first member under the domain) and so went on differently."""
    return inc.last_ts, -inc.serial


def _follows(family: str, sig: Signal) -> bool:
    """Whether a finding on an entity already in an incident of ``family`` belongs to it: the
    same family, a symptom that opens nothing by itself, or a known consequence (an overheating
    HBM ends in uncorrectable ECC errors, XID 48)."""
    return sig.family == family or not sig.opens or (family == THERMAL and sig.name == "gpu_error")


def _down(m: _Member) -> bool:
    """Whether a member is a link seen down or erroring (not only predicted to fail)."""
    return m.kind == "link" and ("link_down" in m.signals or "link_errors" in m.signals)


def _fabric_domain_hint(root: int, members: Sequence[_Member]) -> str:
    """The hint of a fabric root at a node or leaf that links down or erroring rank at (its NICs,
    the switch), "" for any other root: congestion alone ranks there too (its own hints)."""
    level = level_of(root)
    if level not in (NODE, LEAF) or sum(1 for m in members if _down(m)) < 2:
        return ""
    return "leaf_failure" if level == LEAF else "nic_failure"


def _failing(inc: _Incident) -> bool:
    """Whether a fabric incident holds a link that fails (down, erroring, predicted down)."""
    return any(FAILING_LINK.intersection(m.signals) for m in inc.members.values())


def _merged_members(engine: IncidentEngine, group: Sequence[_Incident]) -> list[_Member]:
    """The members ``group[0]`` would hold after absorbing the rest (:meth:`IncidentEngine._merge`):
    all of its own, and those each other one still holds; an entity in two counts once, with the
    stronger evidence (its weight is the strongest of its signals either way)."""
    out = dict(group[0].members)
    for victim in group[1:]:
        for mkey, m in victim.members.items():
            if engine.s_member_of[level_of(mkey)][slot_of(mkey)] != victim.serial:
                continue
            mine = out.get(mkey)
            if mine is None or m.weight(victim.family) > mine.weight(victim.family):
                out[mkey] = m
    return list(out.values())


def _supported(dom: Domains, level: int, members: Sequence[_Member], extra: Sequence[tuple[str, int]]) -> bool:
    """Whether members under a domain of ``level`` are enough to blame that domain (:data:`SUPPORT`)."""
    need = SUPPORT.get(level)
    if need is None:
        return True
    n_gpus, n_children, n_own = need
    gpus: set[int] = set()
    children: set[int] = set()
    nodes: set[int] = set()  # node-level members under a rack
    own = 0
    child_pos = {NODE: 0, RACK: 1, LOOP: 2}[level]  # GPU ancestors: gpu, node, rack, loop
    entries = [(m.kind, m.slot) for m in members] + list(extra)
    for kind, slot in entries:
        if kind == "gpu":
            gpus.add(slot)
            children.add(dom.ancestors("gpu", slot)[child_pos])
        elif level == RACK and kind == "node":
            nodes.add(slot)
        elif MEMBER_LEVEL.get(kind) == level or (level == LOOP and kind == "rack"):
            own += 1
            if level == LOOP and kind == "rack":
                children.add(key(RACK, slot))
    if level == LOOP:  # a loop needs its spread over racks whatever the evidence
        return len(children) >= n_children and (len(gpus) >= n_gpus or own >= 1)
    if len(nodes) >= n_children:
        # node-level findings (fans, PSUs) on as many nodes as the GPUs need: one node's finding
        # and a GPU heating on another node are two causes, not the rack's
        own += 1
    return own >= n_own or (len(gpus) >= n_gpus and len(children) >= n_children)
