"""Findings: what detectors say. The contract between detectors, the incident engine and sinks.

- :class:`Anomaly` — an entity's field looks wrong now (higher score = more anomalous).
- :class:`Prediction` — an event (``thermal_throttle``, ``power_cap``, ``power_brake``,
  ``link_down``, ``congestion``, ...) is expected on an entity within ``eta_s`` seconds.
  ``active=False`` withdraws an earlier prediction for the same (entity, event).
- :class:`Incident` — findings grouped under one root cause (see the incident engine).

Each carries ``ts``, the telemetry timestamp that produced it (not wall-clock time).
Entities are referenced by (kind, slot); sinks resolve names through the topology.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from dataclasses import field as dc_field
from typing import Any, Union


@dataclass(frozen=True)
class Anomaly:
    ts: float
    entity_kind: str
    slot: int
    field: str
    score: float
    detector: str
    reason: str = ""
    type: str = dc_field(default="anomaly", init=False)


@dataclass(frozen=True)
class Prediction:
    ts: float
    entity_kind: str
    slot: int
    event: str
    eta_s: float
    confidence: float
    detector: str
    reason: str = ""
    active: bool = True
    type: str = dc_field(default="prediction", init=False)


BOARD_FOLLOWED = re.compile(r" \(its board (?:moved from|back at) [^()]*\)$")
"""The suffix of the reason of a prediction a GPU board carried to its new slot
(``DetectorBank.follow_predictions``: a board moved, or a parked board read again). Such a
prediction is the one raised before, under a new key: only its reason says so, through Kafka too.
The bank strips it before adding the new one; the store does not count the prediction as raised."""


@dataclass(frozen=True)
class Incident:
    ts: float
    incident_id: str
    state: str  # open | growing | stable | resolved
    root_kind: str  # cooling_loop | rack | node | gpu | pdu | leaf | optic | link | job | external
    root_entity: str
    reason: str
    members: tuple[str, ...] = ()
    predicted_members: tuple[tuple[str, float], ...] = ()  # (entity, eta seconds)
    jobs: tuple[tuple[str, float], ...] = ()  # (job, predicted step slowdown ratio)
    gpu_hours_at_risk_per_hour: float = 0.0
    findings: int = 0
    fault_hint: str = ""
    type: str = dc_field(default="incident", init=False)


Finding = Union[Anomaly, Prediction, Incident]


def finding_to_dict(finding: Finding) -> dict[str, Any]:
    return asdict(finding)


def finding_to_json(finding: Finding) -> str:
    return json.dumps(finding_to_dict(finding), separators=(",", ":"), sort_keys=True, default=float)


def finding_from_dict(data: dict[str, Any]) -> Finding:
    """A finding from :func:`finding_to_dict`'s shape; an ``entity`` name beside the slot (the
    findings file's, ``exporters/jsonl.py``) is left out: the slot is the entity."""
    data = dict(data)
    data.pop("entity", None)
    kind = data.pop("type", None)
    if kind == "anomaly":
        return Anomaly(**data)
    if kind == "prediction":
        return Prediction(**data)
    if kind == "incident":
        data["members"] = tuple(data.get("members", ()))
        data["predicted_members"] = tuple(tuple(x) for x in data.get("predicted_members", ()))
        data["jobs"] = tuple(tuple(x) for x in data.get("jobs", ()))
        return Incident(**data)
    raise ValueError(f"unknown finding type {kind!r}")
