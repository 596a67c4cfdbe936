"""The ``cooling`` report section: how early the cooling-degradation detector flags a failing
thermal path, scored against the recording's ground truth.

Cooling degradation is reported as :class:`~foreshock.findings.Anomaly` (detector ``cooling``),
not as a timed prediction of an event, so it is scored as a section of its own, per fault type:

- ``tim_degradation`` (a GPU's thermal interface): flagged when a ``cooling`` anomaly on that GPU
  starts within ``window_s`` of the fault's onset;
- ``fan_failure`` (a node's fans): flagged by one on that node, or on one of its GPUs.

A fault is judged only where the recording runs ``window_s`` past its onset (a fault injected in
the last minutes has had no time to show). For the flagged ones the section gives the delay after
the onset and, where the fault went on to throttle a GPU (its first ``thermal_throttle_start``
with the fault's id), how long before that throttle the flag came: the early warning the issue
asks for ("hours before any throttle").

Every entity the detector flagged is also checked against the faults: a flag is *explained* when
a fault began before it on the same GPU, its node, or the cooling loop of its rack (a loss of
flow warms every GPU of the loop); else it is counted, and named, as unexplained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from foreshock.events import Event
from foreshock.findings import Anomaly, Finding

if TYPE_CHECKING:
    from .evaluation import RunResult

WINDOW_S = 3600.0
"""A fault counts as flagged when the first flag comes within this of its onset."""
SCORED_FAULTS = {"tim_degradation": "gpu", "fan_failure": "node"}
"""Fault types scored, and the kind of entity each one targets."""
COOLING_DETECTOR = "cooling"


def score_cooling(result: "RunResult", window_s: float = WINDOW_S) -> dict[str, Any]:
    """Per detector set that ran the cooling detector: per scored fault type, the faults judged,
    flagged, the flag's delay after onset and its lead before the fault's first throttle; and the
    flags no fault explains."""
    topo = result.recording.topology
    onsets = [e for e in result.events if e.type == "fault_onset"]
    first_throttle: dict[str, float] = {}
    for e in result.events:
        if e.type == "thermal_throttle_start" and e.fault_id:
            first_throttle[e.fault_id] = min(first_throttle.get(e.fault_id, np.inf), e.time)
    out: dict[str, Any] = {"window_s": window_s, "detectors": {}}
    for set_name, findings in result.findings.items():
        flags = _first_flags(findings, topo)
        if not flags and not _ran_cooling(set_name):
            continue  # a set without the detector (the baselines): nothing to score
        by_fault: dict[str, Any] = {}
        for fault_type, kind in SCORED_FAULTS.items():
            judged = [e for e in onsets if e.fault_type == fault_type and e.time + window_s <= result.end]
            delays, leads = [], []
            missed = []
            for e in judged:
                flag = _first_flag_on(flags, kind, e.entity, e.time, e.time + window_s, topo)
                if flag is None:
                    missed.append(e.entity)
                    continue
                delays.append(flag - e.time)
                throttle = first_throttle.get(e.fault_id)
                if throttle is not None and throttle >= flag:
                    leads.append(throttle - flag)
            by_fault[fault_type] = {
                "faults": len(judged),
                "flagged": len(delays),
                "recall": round(len(delays) / len(judged), 4) if judged else None,
                "delay_median_s": _median(delays),
                "throttled_after_flag": len(leads),
                "lead_before_throttle_median_s": _median(leads),
                "lead_before_throttle_min_s": round(min(leads), 1) if leads else None,
                "missed": missed[:10],
            }
        unexplained = sorted(name for (kind, name), ts in flags.items()
                             if not _explained(kind, name, ts, onsets, topo))
        tim, fan = by_fault["tim_degradation"], by_fault["fan_failure"]
        out["detectors"][set_name] = {
            "tim_flagged": f"{tim['flagged']} of {tim['faults']}",
            "tim_lead_before_throttle_median_s": tim["lead_before_throttle_median_s"],
            "fan_flagged": f"{fan['flagged']} of {fan['faults']}",
            "flagged_entities": len(flags),
            "unexplained_flags": len(unexplained),
            "unexplained": unexplained[:10],
            "by_fault": by_fault,
        }
    return out


def _ran_cooling(set_name: str) -> bool:
    from .evaluation import set_members

    try:
        return COOLING_DETECTOR in set_members(set_name)
    except ValueError:
        return False


def _first_flags(findings: list[Finding], topo: Any) -> dict[tuple[str, str], float]:
    """(entity kind, name) -> when the cooling detector first flagged it."""
    first: dict[tuple[str, str], float] = {}
    for f in findings:
        if isinstance(f, Anomaly) and f.detector == COOLING_DETECTOR:
            key = (f.entity_kind, topo.name(f.entity_kind, f.slot))
            if key not in first or f.ts < first[key]:
                first[key] = f.ts
    return first


def _first_flag_on(flags: dict[tuple[str, str], float], kind: str, entity: str, lo: float, hi: float,
                   topo: Any) -> float | None:
    """The first flag in ``[lo, hi]`` on the entity, or, for a node, on the node or its GPUs."""
    names = {(kind, entity)}
    if kind == "node" and entity in topo.nodes:
        names |= {("gpu", topo.name("gpu", int(g))) for g in topo.gpus_of_node(topo.slot("node", entity))}
    times = [ts for key, ts in flags.items() if key in names and lo <= ts <= hi]
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
