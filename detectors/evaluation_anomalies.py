"""Report sections for the GPU detectors that raise anomalies rather than timed predictions,
scored against the recording's ground truth: ``cooling`` (how early the cooling-degradation
detector flags a failing thermal path) and ``straggler`` (whether the peer-outlier detector names
the GPU that sets a slowed job's pace).

**cooling**, per fault type:

- ``tim_degradation`` (a GPU's thermal interface): flagged when a ``cooling`` anomaly on that GPU
  starts within ``window_s`` of the fault's onset;
- ``fan_failure`` (a node's fans): flagged by one on that node, or on one of its GPUs.

A flag *starts* where the detector said nothing on that entity and field for :data:`FLAG_GAP_S`: a
held flag is said again every ``refresh_s``, and such a refresh of a flag raised before the onset is
not a detection of the fault.

A fault is judged only where the recording runs ``window_s`` past its onset (a fault injected in
the last minutes has had no time to show); those left out are counted (``not_judged``, and
``tim_not_judged``, ``fan_not_judged``) and the printed section says so. For the flagged ones the
section gives the delay after the onset and, where the fault went on to throttle a GPU (its first
``thermal_throttle_start`` with the fault's id), how long before that throttle the flag came: the
early warning the issue asks for ("hours before any throttle").

**straggler**: a job's first ``job_slowdown_start`` (step time over 1.1x nominal) under each fault
on the job's own GPUs, a node or a cooling loop (not the fabric's: that slows communication, and no
GPU sets the pace; not an interrupted job) is judged: found when a ``straggler`` anomaly on one of
the job's GPUs that the fault touches started (as above) between the fault's onset and
``window_s`` after the slowdown (one that began less than ``window_s`` before the recording's end is
not judged, and counted: ``slowdowns_not_judged``). It is *ahead* when that came before the slowdown (a GPU running
hotter or throttling more than its peers, before the job's step time shows it), with its lead.

Both sections also check every entity their detector flagged: a flag is *explained* when a fault
began before it on the same GPU, its node, or the cooling loop of its rack; else it is counted,
and named, as unexplained. A recording whose ground truth holds no fault (a real one) is skipped:
every flag would read as unexplained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from foreshock.events import Event
from foreshock.findings import Anomaly, Finding

from .cooling import PARAMS as COOLING_PARAMS
from .straggler import PARAMS as STRAGGLER_PARAMS

if TYPE_CHECKING:
    from .evaluation import RunResult

WINDOW_S = 3600.0
"""A fault counts as flagged when the first flag comes within this of its onset."""
SCORED_FAULTS = {"tim_degradation": "gpu", "fan_failure": "node"}
"""Fault types scored, and the kind of entity each one targets."""
COOLING_DETECTOR = "cooling"
STRAGGLER_DETECTOR = "straggler"
NO_FAULTS = "no fault in the recording's ground truth (a real recording has none): nothing to score against"
SLOWDOWN_WINDOW_S = 600.0
"""A slowdown counts as found when its pacer is flagged up to this long after the slowdown began."""
FLAG_GAP_S = {COOLING_DETECTOR: 1.5 * COOLING_PARAMS["refresh_s"],
              STRAGGLER_DETECTOR: 1.5 * STRAGGLER_PARAMS["refresh_s"]}
"""A flag on an entity (and field) starts where the detector said nothing there for this long: it
repeats a held flag every ``refresh_s`` at its next tick, which can come late by a frame or two."""


def score_cooling(result: "RunResult", window_s: float = WINDOW_S) -> dict[str, Any]:
    """Per detector set that ran the cooling detector: per scored fault type, the faults judged,
    flagged, the flag's delay after onset and its lead before the fault's first throttle; and the
    flags no fault explains."""
    topo = result.recording.topology
    onsets = [e for e in result.events if e.type == "fault_onset"]
    if not onsets:
        return {"skipped": NO_FAULTS}
    first_throttle: dict[str, float] = {}
    for e in result.events:
        if e.type == "thermal_throttle_start" and e.fault_id:
            first_throttle[e.fault_id] = min(first_throttle.get(e.fault_id, np.inf), e.time)
    out: dict[str, Any] = {"window_s": window_s, "detectors": {}}
    for set_name, findings in result.findings.items():
        starts = _flag_starts(findings, topo, COOLING_DETECTOR)  # its first flag, and any after a lapse
        if not starts and not _ran(set_name, COOLING_DETECTOR):
            continue  # a set without the detector (the baselines): nothing to score
        by_fault: dict[str, Any] = {}
        for fault_type, kind in SCORED_FAULTS.items():
            of_type = [e for e in onsets if e.fault_type == fault_type]
            judged = [e for e in of_type if e.time + window_s <= result.end]
            delays, leads = [], []
            missed = []
            for e in judged:
                flag = _first_flag_on(starts, _fault_entities(kind, e.entity, topo), e.time, e.time + window_s)
                if flag is None:
                    missed.append(e.entity)
                    continue
                delays.append(flag - e.time)
                throttle = first_throttle.get(e.fault_id)
                if throttle is not None and throttle >= flag:
                    leads.append(throttle - flag)
            by_fault[fault_type] = {
                "faults": len(judged),
                # (its onset within window_s of the recording's end: told, or "0 of 0" read as no such fault)
                "not_judged": len(of_type) - len(judged),
                "flagged": len(delays),
                "recall": round(len(delays) / len(judged), 4) if judged else None,
                "delay_median_s": _median(delays),
                "throttled_after_flag": len(leads),
                "lead_before_throttle_median_s": _median(leads),
                "lead_before_throttle_min_s": round(min(leads), 1) if leads else None,
                "missed": missed[:10],
            }
        unexplained = sorted(name for (kind, name), times in starts.items()
                             if not _explained(kind, name, times[0], onsets, topo))
        tim, fan = by_fault["tim_degradation"], by_fault["fan_failure"]
        out["detectors"][set_name] = {
            "tim_flagged": f"{tim['flagged']} of {tim['faults']}",
            "tim_lead_before_throttle_median_s": tim["lead_before_throttle_median_s"],
            "tim_not_judged": tim["not_judged"],
            "fan_flagged": f"{fan['flagged']} of {fan['faults']}",
            "fan_lead_before_throttle_median_s": fan["lead_before_throttle_median_s"],
            "fan_not_judged": fan["not_judged"],
            "flagged_entities": len(starts),
            "unexplained_flags": len(unexplained),
            "unexplained": unexplained[:10],
            "by_fault": by_fault,
        }
    return out


def score_straggler(result: "RunResult", window_s: float = SLOWDOWN_WINDOW_S) -> dict[str, Any]:
    """Per detector set that ran the straggler detector: per fault type, the job slowdowns judged,
    those whose pacer was flagged, how many ahead of the slowdown and by how much; and the flags
    no fault explains."""
    topo = result.recording.topology
    onsets = [e for e in result.events if e.type == "fault_onset"]
    if not onsets:
        return {"skipped": NO_FAULTS}
    by_id = {e.fault_id: e for e in onsets}
    # a job's first slowdown under a fault: its later ones (the step time dipping back under 1.1x
    # nominal and over again) continue it, and a flag raised at the first would read as their lead
    slowdowns, seen = [], set()
    for e in sorted(result.events, key=lambda e: e.time):
        if e.type == "job_slowdown_start" and e.fault_id in by_id and (e.detail or {}).get("reason") != "interrupted" \
                and (e.entity, e.fault_id) not in seen:
            seen.add((e.entity, e.fault_id))
            slowdowns.append(e)
    out: dict[str, Any] = {"window_s": window_s, "detectors": {}}
    for set_name, findings in result.findings.items():
        starts = _flag_starts(findings, topo, STRAGGLER_DETECTOR)  # its first flag, and any after a lapse
        if not starts and not _ran(set_name, STRAGGLER_DETECTOR):
            continue
        per_type: dict[str, dict[str, list[Any]]] = {}
        for e in slowdowns:
            fault = by_id[e.fault_id]
            pacers = _job_gpus_touched(topo, e.entity, fault)
            if not pacers:
                continue  # the fabric's, or a fault off the job's GPUs
            m = per_type.setdefault(fault.fault_type, {"judged": [], "leads": [], "delays": [], "missed": [],
                                                       "not_judged": []})
            if e.time + window_s > result.end:
                # its pacer may be flagged up to window_s after the slowdown, past the recording's end:
                # counted apart, as the cooling section's faults of the last hour are
                m["not_judged"].append(e.entity)
                continue
            m["judged"].append(e.entity)
            first = _first_flag_on(starts, [("gpu", g) for g in pacers], fault.time, e.time + window_s)
            if first is None:
                m["missed"].append(f"{e.entity} at {e.time - result.start:.0f} s")
                continue
            (m["leads"] if first < e.time else m["delays"]).append(abs(e.time - first))
        by_fault: dict[str, Any] = {}
        judged = found = ahead = left = 0
        for t, m in sorted(per_type.items()):
            n_found = len(m["leads"]) + len(m["delays"])
            by_fault[t] = {"slowdowns": len(m["judged"]), "not_judged": len(m["not_judged"]), "found": n_found,
                           "found_ahead": len(m["leads"]), "lead_median_s": _median(m["leads"]),
                           "delay_median_s": _median(m["delays"]), "missed": m["missed"][:10]}
            judged, found, ahead = judged + len(m["judged"]), found + n_found, ahead + len(m["leads"])
            left += len(m["not_judged"])
        unexplained = sorted(name for (kind, name), times in starts.items()
                             if not _explained(kind, name, times[0], onsets, topo))
        out["detectors"][set_name] = {
            "slowdowns": judged,
            "slowdowns_not_judged": left,
            "pacer_flagged": found,
            "recall": round(found / judged, 4) if judged else None,
            "flagged_ahead": ahead,
            "flagged_gpus": len(starts),
            "unexplained_flags": len(unexplained),
            "unexplained": unexplained[:10],
            "by_fault": by_fault,
        }
    return out


def _job_gpus_touched(topo: Any, job: str, fault: Event) -> list[str]:
    """The job's GPUs that ``fault`` acts on: its GPU, its node's GPUs, or those on its loop."""
    if job not in topo.jobs:
        return []
    members = topo.gpus_of_job(topo.slot("job", job))
    racks = set((fault.detail or {}).get("racks") or ())
    touched = []
    for g in members:
        name = topo.gpus[int(g)]
        node = topo.nodes[int(topo.gpu_node[g])]
        if fault.entity in (name, node) or topo.racks[int(topo.gpu_rack[g])] in racks:
            touched.append(name)
    return touched


def _ran(set_name: str, detector: str) -> bool:
    from .evaluation import set_members

    try:
        return detector in set_members(set_name)
    except ValueError:
        return False


def _flag_starts(findings: list[Finding], topo: Any, detector: str) -> dict[tuple[str, str], list[float]]:
    """(entity kind, name) -> the times a flag of ``detector`` started on it, in order: per field
    (the straggler's checks are flagged and refreshed apart), its first, and any after more than
    :data:`FLAG_GAP_S` of silence. The others are refreshes of a flag already held."""
    streams: dict[tuple[str, str, str], list[float]] = {}
    for f in findings:
        if isinstance(f, Anomaly) and f.detector == detector:
            streams.setdefault((f.entity_kind, topo.name(f.entity_kind, f.slot), f.field), []).append(f.ts)
    out: dict[tuple[str, str], list[float]] = {}
    for (kind, name, _), times in streams.items():
        ts = np.sort(np.asarray(times))
        out.setdefault((kind, name), []).extend(ts[np.r_[True, np.diff(ts) > FLAG_GAP_S[detector]]].tolist())
    return {key: sorted(ts) for key, ts in out.items()}


def _fault_entities(kind: str, entity: str, topo: Any) -> list[tuple[str, str]]:
    """The entity a fault targets, and, for a node, its GPUs: where its flag may land."""
    names = [(kind, entity)]
    if kind == "node" and entity in topo.nodes:
        names += [("gpu", topo.name("gpu", int(g))) for g in topo.gpus_of_node(topo.slot("node", entity))]
    return names


def _first_flag_on(starts: dict[tuple[str, str], list[float]], entities: list[tuple[str, str]], lo: float,
                   hi: float) -> float | None:
    """The first flag start (:func:`_flag_starts`) in ``[lo, hi]`` on any of ``entities``: an
    entity flagged before ``lo`` counts only if its flag lapsed and started again in the window."""
    times = [ts for key in entities for ts in starts.get(key, ()) if lo <= ts <= hi]
    return min(times) if times else None


def _explained(kind: str, name: str, ts: float, onsets: list[Event], topo: Any) -> bool:
    """A fault began before the flag on this entity, its node (or, for a node, one of its GPUs),
    or the cooling loop of its rack."""
    if kind == "gpu":
        node = topo.nodes[int(topo.gpu_node[topo.slot("gpu", name)])]
        rack = topo.racks[int(topo.gpu_rack[topo.slot("gpu", name)])]
        near = {name, node}
    elif kind == "node":
        node, rack = name, topo.racks[int(topo.node_rack[topo.slot("node", name)])]
        near = {name}
    elif kind == "rack":
        node, rack, near = "", name, set()
    else:
        return False
    for e in onsets:
        if e.time > ts:
            continue
        if e.entity in near or (kind == "node" and e.entity.startswith(node + "/")):
            return True
        if rack in ((e.detail or {}).get("racks") or ()):
            return True
    return False


def _median(values: list[float]) -> float | None:
    return round(float(np.median(values)), 1) if values else None
