"""Incident scoring against the simulator's fault attribution (``events.jsonl``).

For every fault (its ``fault_onset`` event names the target and the hidden cause):

- **scope**: the entities it physically reaches — a GPU fault its GPU, a node fault the node and
  its GPUs, a loop fault every rack of the loop and their nodes and GPUs, an optic fault the
  optic and its link — plus every entity a consequence event attributes to it (congested links
  that took rerouted traffic, jobs that slowed down);
- **consequences**: the GPUs and links its consequence events name (throttles, power brakes,
  HBM overheating, XIDs, link downs, congestion). Optics compare as their link.

Incidents (the engine's :class:`~foreshock.findings.Incident` emissions, grouped by id) are
attributed member by member, by the time the member first appeared in the incident's emissions,
among the faults whose scope holds it and whose window (from 60 s before onset to the end of the
aftermath) holds that time — a member the incident already held for another cause does not
credit a fault that began later. Of those it credits (:func:`_credited`) a fault active then
over one in its aftermath, then one whose consequences name the member, then the narrowest
physical scope (a GPU fault over its node's, a node's over its loop's), then the latest onset:
a loop failing again in the aftermath of its first failure is the second one's doing, and a
fault's own consequences do not widen its scope against another's. An
incident *claims* a fault holding at least ``claim_share`` (10 %) of its members
(and at least one); its **primary** fault is the one it claims holding the most (an incident that
claims none has none: it is unattributed). Then, over the faults
with at least one consequence:

- ``root_cause_accuracy``: the fault's incident (the claiming incident holding most of its
  members; of two holding as many, one that still held them, open, when last told — where the
  engine left them: a GPU's failing thermal interface told inside its node's fan or PSU incident,
  then, that one split or resolved, in an incident of its own, is the latter's — then the earlier) names
  the expected root kind (``cooling_loop`` for a loop, ``gpu``, ``node``, ``optic``) and the
  target entity;
- ``member_recall`` (mean over faults) / ``member_precision`` (mean over incidents with a
  primary fault): consequences found among the members of the fault's incidents, and members
  inside the scope of their incident's primary fault;
- ``onset_to_incident_median_s``: from the fault's onset to the first emission in which one of its
  entities joins an incident claiming it (an incident that already held the entity for another
  cause does not count from its next routine emission);
- ``compression``: raw findings (anomalies and predictions) per incident (``compression_attached``
  counts only the findings the incidents hold);
- ``merged_independent_faults``: incidents that claim two or more faults on different targets.

A fault whose entities an incident already holds for an earlier cause (a cooling loop failing a
second time, a node's fans inside a loop incident) adds no member to it: the engine notes such a
re-fire in the incident's reason instead, with its time and the root the members that fired
again point at (``incidents.refire_note``). Each note credits, as a member does, a fault holding
that root, by the time of the emission that first told it;
the fault is then claimed by that incident, its root is the note's, and its onset counts to that
emission. Notes are the engine saying "a second cause", so they never count as a merge;
``refire_credited`` counts the faults only a note credited (a row's ``noted_only`` names the
incidents that list a fault through a note alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import numpy as np

from foreshock.events import Event
from foreshock.findings import Anomaly, Finding, Incident, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

if TYPE_CHECKING:  # the harness imports this module lazily; no import cycle at run time
    from .evaluation import RunResult

EXPECTED_ROOT_KIND = {"loop": "cooling_loop", "cooling_loop": "cooling_loop", "gpu": "gpu", "node": "node",
                      "optic": "optic", "link": "link", "rack": "rack"}
"""Fault target kind (``fault_onset.entity_kind``) -> the ``root_kind`` an incident should name."""

CONSEQUENCE_TYPES = frozenset({"thermal_throttle_start", "power_cap_start", "power_brake_start",
                               "hbm_overheat_start", "congestion_start", "link_down", "xid"})
INCIDENT_SET = "foreshock"
"""The detector set whose findings the incidents section runs through the incident engine."""
AFTERMATH_S = 900.0
"""A fault's consequences (a loop still cooling down) outlive its repair by this much (simulator)."""
ONSET_SLACK_S = 60.0
"""A member that joins this long before a fault's recorded onset may still be its doing (the
simulator's onset falls inside a detector window that already saw the first effects)."""


@dataclass
class FaultTruth:
    fault_id: str
    fault_type: str
    kind: str
    target: str
    onset: float
    end: float
    scope: set[str] = field(default_factory=set)
    """what it physically reaches, plus every entity its consequence events name"""
    consequences: set[str] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)
    physical: set[str] = field(default_factory=set)
    """what it physically reaches (its target and what the target holds): the scope it is ranked
    by, the same however many consequences it had"""


@dataclass
class IncidentTrack:
    incident_id: str
    first_ts: float
    last_ts: float
    root_kind: str = ""
    root_entity: str = ""
    fault_hint: str = ""
    members: list[str] = field(default_factory=list)
    jobs: set[str] = field(default_factory=set)
    findings: int = 0
    emissions: list[tuple[float, frozenset[str]]] = field(default_factory=list)
    state: str = ""
    """its state when last told"""
    joined: dict[str, float] = field(default_factory=dict)
    """member -> time of the first emission that held it"""
    refires: dict[tuple[str, str, str], tuple[float, str]] = field(default_factory=dict)
    """re-fire noted in its reason (when, root kind, root entity) -> (time of the first emission
    that told it, the cause's hint: "" when the incident's own root fired again)"""


def _norm(topology: Topology, name: str) -> str:
    """Compare optics as their link (an optic fault's consequences are on the link)."""
    return name.rsplit("#", 1)[0] if "#" in name else name


MAINTENANCE = frozenset({"gpu_replacement"})
"""Fault types that are work done on the cluster, not faults to find: a board swapped in (an RMA)
is the operator's own doing. Scored as a fault, the replacement of a GPU whose HBM had overheated
took that GPU's incident from the overheating it was about (the scenario gpu-replacement)."""


def fault_truths(events: Sequence[Event], topology: Topology, duration_of: dict[str, float] | None = None) -> list[FaultTruth]:
    t = topology
    duration_of = duration_of or {}
    faults: dict[str, FaultTruth] = {}
    for ev in events:
        if ev.type != "fault_onset" or ev.fault_type in MAINTENANCE:
            continue
        # the recording's fault list first: it holds how long each fault lasted in the end (a board
        # swap cures the old board's faults early); the onset event only what was planned
        dur = duration_of.get(ev.fault_id, ev.detail.get("duration_s"))
        end = ev.time + float(dur) if isinstance(dur, (int, float)) else math.inf
        ft = FaultTruth(ev.fault_id, ev.fault_type, ev.entity_kind, ev.entity, ev.time, end)
        ft.physical = _scope(t, ev.entity_kind, ev.entity)
        ft.scope = set(ft.physical)
        faults[ev.fault_id] = ft
    for ev in events:
        f = faults.get(ev.fault_id)
        if f is None or ev.type == "fault_onset":
            continue
        if ev.entity_kind == "job":
            if ev.type == "job_slowdown_start":
                f.jobs.add(ev.entity)
                f.scope.add(ev.entity)
            continue
        name = _norm(t, ev.entity)
        if ev.type in CONSEQUENCE_TYPES:
            f.consequences.add(name)
            f.scope.add(name)
    return sorted(faults.values(), key=lambda f: f.onset)


def _scope(t: Topology, kind: str, entity: str) -> set[str]:
    try:
        if kind == "gpu":
            return {entity}
        if kind == "node":
            n = t.slot("node", entity)
            return {entity} | {t.gpus[g] for g in t.gpus_of_node(n)}
        if kind == "rack":
            r = t.slot("rack", entity)
            return {entity} | {t.nodes[n] for n in np.flatnonzero(t.node_rack == r)} | {t.gpus[g] for g in t.gpus_of_rack(r)}
        if kind in ("loop", "cooling_loop"):
            loop = t.loops.index(entity)
            racks = np.flatnonzero(t.rack_loop == loop)
            nodes = np.flatnonzero(np.isin(t.node_rack, racks))
            gpus = np.flatnonzero(np.isin(t.gpu_node, nodes))
            return {entity} | {t.racks[r] for r in racks} | {t.nodes[n] for n in nodes} | {t.gpus[g] for g in gpus}
        if kind in ("optic", "link"):
            return {_norm(t, entity)}
    except (KeyError, ValueError):
        pass
    return {entity}


def incident_tracks(findings: Iterable[Finding], topology: Topology) -> list[IncidentTrack]:
    from .incidents import refire_notes  # (lazily, as replay_findings imports the engine)

    tracks: dict[str, IncidentTrack] = {}
    for f in findings:
        if not isinstance(f, Incident):
            continue
        tr = tracks.get(f.incident_id)
        if tr is None:
            tr = tracks[f.incident_id] = IncidentTrack(f.incident_id, f.ts, f.ts)
        if f.ts >= tr.last_ts:
            tr.state = f.state
        tr.last_ts = max(tr.last_ts, f.ts)
        if f.root_entity:
            tr.root_kind, tr.root_entity, tr.fault_hint = f.root_kind, f.root_entity, f.fault_hint
        names = [_norm(topology, m) for m in f.members]
        for n in names:
            if n not in tr.joined:
                tr.members.append(n)
                tr.joined[n] = f.ts
        tr.jobs.update(j for j, _ in f.jobs)
        for when, kind, entity, hint in refire_notes(f.reason):
            tr.refires.setdefault((when, kind, entity), (f.ts, hint))
        tr.findings = max(tr.findings, f.findings)
        if names:
            tr.emissions.append((f.ts, frozenset(names)))
    return sorted(tracks.values(), key=lambda tr: tr.first_ts)


def _in_window(fault: FaultTruth, ts: float) -> bool:
    """Whether a member that joined an incident at ``ts`` can be ``fault``'s doing."""
    return fault.onset - ONSET_SLACK_S <= ts <= fault.end + AFTERMATH_S


def _active(fault: FaultTruth, ts: float) -> bool:
    """Whether ``fault`` was acting at ``ts`` (not yet repaired; its onset slack included)."""
    return fault.onset - ONSET_SLACK_S <= ts <= fault.end


def _credited(faults: Sequence[FaultTruth], name: str, ts: float) -> FaultTruth | None:
    """The fault an entity ``name`` that joined an incident (or a re-fire note that named it) at
    ``ts`` is credited to, among those whose scope holds it and whose window holds ``ts``: one
    active then over one in its aftermath (the loop failing again, not its first failure still
    cooling down); then one whose consequences name it (what the simulator blamed); then the
    narrowest physical scope (a GPU's fault over its node's, over its loop's; consequences
    widen a scope, so the whole scope would favour the fault that did less); then the latest
    onset (the newer of two faults on the same target)."""
    holders = [f for f in faults if name in f.scope and _in_window(f, ts)]
    if not holders:
        return None
    return min(holders, key=lambda f: (not _active(f, ts), name not in f.consequences, len(f.physical), -f.onset))


def _held_at_end(track: IncidentTrack, fault: FaultTruth) -> bool:
    """Whether ``track`` still held an entity of ``fault``'s scope when last told, open: a resolved
    incident's last emission lists the members it let go."""
    return track.state != "resolved" and bool(track.emissions) and bool(track.emissions[-1][1] & fault.scope)


def score_incidents(findings: Sequence[Finding], events: Sequence[Event], topology: Topology,
                    claim_share: float = 0.1, duration_of: dict[str, float] | None = None) -> dict[str, Any]:
    """The ``incidents`` section of ``report.json`` (plus a per-fault table under ``by_fault``)."""
    faults = fault_truths(events, topology, duration_of)
    tracks = incident_tracks(findings, topology)
    raw = sum(1 for f in findings if isinstance(f, (Anomaly, Prediction)))
    # attribute each incident's members to faults
    claims: dict[str, dict[str, int]] = {}
    primary: dict[str, str] = {}
    for tr in tracks:
        counts: dict[str, int] = {}
        for m in tr.members:
            best = _credited(faults, m, tr.joined[m])
            if best is not None:
                counts[best.fault_id] = counts.get(best.fault_id, 0) + 1
        need = max(1, claim_share * len(tr.members))
        claims[tr.incident_id] = {fid: n for fid, n in counts.items() if n >= need}
        if claims[tr.incident_id]:
            # of the faults it claims: one member of twenty credited to a fault had made that fault
            # the incident's primary, scored in member_precision at 1/20, while the same incident
            # with no member credited was unattributed, left out of it
            primary[tr.incident_id] = max(claims[tr.incident_id], key=lambda fid: (counts[fid], fid))
    noted = _noted_faults(tracks, faults, topology)
    by_id = {f.fault_id: f for f in faults}
    merged = sum(1 for c in claims.values() if len({by_id[fid].target for fid in c}) >= 2)
    scored = [f for f in faults if f.consequences]
    rows: list[dict[str, Any]] = []
    recalls: list[float] = []
    delays: list[float] = []
    right = kind_right = entity_right = hint_right = refire_credited = 0
    for f in faults:
        claimed = [tr for tr in tracks if f.fault_id in claims[tr.incident_id]]
        told = sorted((noted[tr.incident_id][f.fault_id] + (tr,) for tr in tracks
                       if f.fault_id in noted.get(tr.incident_id, {}) and tr not in claimed), key=lambda x: x[0])
        mine = claimed + [tr for *_, tr in told]
        main = max(claimed, key=lambda tr: (claims[tr.incident_id][f.fault_id], _held_at_end(tr, f), -tr.first_ts),
                   default=None)
        root_kind, root_entity, hint = (main.root_kind, main.root_entity, main.fault_hint) if main else ("", "", "")
        if main is None and told:  # only a re-fire noted it: the note's root is what the engine blamed
            _, root_kind, root_entity, hint, main = told[0]
            hint = hint or main.fault_hint
            refire_credited += 1
        members = set().union(*(set(tr.members) for tr in mine)) if mine else set()
        jobs = set().union(*(tr.jobs for tr in mine)) if mine else set()
        recall = len(f.consequences & members) / len(f.consequences) if f.consequences else None
        # when one of its entities joined a claiming incident: an entity held since before the
        # fault (for another cause) tells nothing of how fast the engine saw this one
        first = min([ts for tr in claimed for m, ts in tr.joined.items() if m in f.scope and ts >= f.onset - ONSET_SLACK_S]
                    + [t[0] for t in told], default=math.nan)
        exp_kind = EXPECTED_ROOT_KIND.get(f.kind, f.kind)
        ok_kind = main is not None and root_kind == exp_kind
        ok_entity = main is not None and root_entity == f.target
        row = {
            "fault": f.fault_id, "type": f.fault_type, "target": f.target, "onset": f.onset,
            "consequences": len(f.consequences), "incidents": [tr.incident_id for tr in mine],
            # those of them tied to it by a re-fire note alone, holding under claim_share of their
            # members: listed beside "0 incidents merging" they read as a merge the count forgot
            "noted_only": [tr.incident_id for *_, tr in told],
            "root": f"{root_kind}:{root_entity}" if main else None,
            "hint": hint if main else None, "refire": bool(told) and not claimed,
            "root_correct": bool(ok_kind and ok_entity), "member_recall": None if recall is None else round(recall, 4),
            "job_recall": round(len(f.jobs & jobs) / len(f.jobs), 4) if f.jobs else None,
            "onset_to_incident_s": None if math.isnan(first) else round(first - f.onset, 1),
        }
        rows.append(row)
        if not f.consequences:
            continue
        right += ok_kind and ok_entity
        kind_right += ok_kind
        entity_right += ok_entity
        hint_right += main is not None and hint == f.fault_type
        recalls.append(recall or 0.0)
        if not math.isnan(first):
            delays.append(first - f.onset)
    precisions = []
    for tr in tracks:
        fid = primary.get(tr.incident_id)
        if fid is not None and tr.members:
            scope = by_id[fid].scope
            precisions.append(sum(1 for m in tr.members if m in scope) / len(tr.members))
    n = len(scored)

    def ratio(x: float) -> float | None:
        return round(x / n, 4) if n else None

    return {
        "faults": n,
        "root_cause_accuracy": ratio(right),
        "member_recall": round(float(np.mean(recalls)), 4) if recalls else None,
        "member_precision": round(float(np.mean(precisions)), 4) if precisions else None,
        "onset_to_incident_median_s": round(float(np.median(delays)), 1) if delays else None,
        "compression": round(raw / len(tracks), 2) if tracks else None,
        "merged_independent_faults": merged,
        "claim_share": claim_share,  # (what a merge counts: the faults holding this share of members)
        "refire_credited": refire_credited,
        # findings the incidents actually hold, per incident (the rest were symptoms no incident
        # explained, such as routine power caps under full load)
        "compression_attached": round(sum(tr.findings for tr in tracks) / len(tracks), 2) if tracks else None,
        "root_kind_accuracy": ratio(kind_right),
        "root_entity_accuracy": ratio(entity_right),
        "cause_accuracy": ratio(hint_right),
        "faults_total": len(faults),
        "incidents": len(tracks),
        "unattributed_incidents": sum(1 for tr in tracks if tr.incident_id not in primary),
        "raw_findings": raw,
        "by_fault": rows,
    }


def _noted_faults(tracks: Sequence[IncidentTrack], faults: Sequence[FaultTruth],
                  topology: Topology) -> dict[str, dict[str, tuple[float, str, str, str]]]:
    """Per incident, the faults its re-fire notes credit: fault id -> (when the note was first
    told, its root kind, root entity, hint) — the earliest note for that fault. A note goes, as a
    member does, to the fault :func:`_credited` names for its root at that time."""
    noted: dict[str, dict[str, tuple[float, str, str, str]]] = {}
    for tr in tracks:
        for (_, kind, entity), (ts, hint) in tr.refires.items():
            best = _credited(faults, _norm(topology, entity), ts)
            if best is None:
                continue
            mine = noted.setdefault(tr.incident_id, {})
            if best.fault_id not in mine or ts < mine[best.fault_id][0]:
                mine[best.fault_id] = (ts, kind, entity, hint)
    return noted


def replay_findings(findings: Sequence[Finding], topology: Topology, step_s: float = 1.0,
                    end: float | None = None, telemetry: Iterable[Frame] = (), **params: Any) -> list[Finding]:
    """Run the incident engine over recorded detector findings (time order), as the pipeline
    would have after each frame; returns the findings followed by the incidents, interleaved.

    ``telemetry``: time-ordered frames for :meth:`IncidentEngine.observe_frame`, each given to the
    engine before the findings of its time, as the pipeline's bank does (job step times for the
    measured slowdown, headroom for the predicted spread, a GPU still off the bus)."""
    from .incidents import IncidentEngine

    engine = IncidentEngine(topology, **params)
    raw = sorted((f for f in findings if not isinstance(f, Incident)), key=lambda f: f.ts)
    out: list[Finding] = []
    if not raw:
        return out
    frames = iter(telemetry)
    pending = next(frames, None)
    i = 0
    now = raw[0].ts
    limit = max(raw[-1].ts, end if end is not None else raw[-1].ts) + engine.quiet_s + 2 * engine.tick_s
    while now <= limit:
        while pending is not None and not float(np.nanmax(pending.ts, initial=-math.inf)) > now:
            engine.observe_frame(pending)
            pending = next(frames, None)
        j = i
        while j < len(raw) and raw[j].ts <= now:
            j += 1
        batch = raw[i:j]
        i = j
        out.extend(batch)
        out.extend(engine.observe(batch, now))
        nxt = raw[i].ts if i < len(raw) else math.inf
        now = max(min(nxt, now + engine.tick_s), now + step_s)
    return out


def score_run(result: "RunResult", detector_set: str = INCIDENT_SET) -> dict[str, Any]:
    """The evaluation harness's ``incidents`` section: the set's findings through the engine."""
    if detector_set not in result.findings:
        return {"skipped": f"no {detector_set!r} detector set in this run"}
    findings = result.findings[detector_set]
    topo = result.recording.topology
    if not any(isinstance(f, Incident) for f in findings):
        findings = replay_findings(findings, topo, step_s=float(result.recording.interval or 1.0), end=result.end,
                                   telemetry=incident_telemetry(result))
    durations = {str(f.get("id")): float(f["duration_s"]) for f in result.recording.meta.get("faults", []) or []
                 if isinstance(f, dict) and isinstance(f.get("duration_s"), (int, float))}
    return score_incidents(findings, result.events, topo, duration_of=durations)


def incident_telemetry(result: "RunResult") -> Iterator[Frame]:
    """The recording's frames of ``result.incident_telemetry`` (the kinds the run was given that
    the engine reads), read again in the detectors' windows and through an input guard of their
    own, as the embedded pipeline gives them to the engine. Read again rather than kept from the
    detectors' pass: the replay's clock follows the findings, all known only after that pass, and
    keeping every GPU, link and job frame until then would hold the recording in memory."""
    from foreshock.guard import InputGuard

    from .evaluation import aligned_frames

    guard = InputGuard(result.recording.topology, _CountedBefore())
    for frame in aligned_frames(result.recording, result.incident_telemetry, result.window_s):
        clean = guard.check(frame)
        if len(clean):
            yield clean


class _CountedBefore(PipelineHealth):
    """The health of a second read of the run's telemetry: the run's own guard counted and
    logged the problems of the kinds the detectors read, so this one does not log them again
    (nor report those of job frames, which only the engine reads: ``input_problems`` in the
    report stays that of the detectors' input)."""

    def problem(self, stage: str, reason: str, count: int = 1, detail: str = "") -> None:
        self.problems[(stage, reason)] += max(count, 0)
