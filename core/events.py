"""Ground-truth events (``events.jsonl`` in a recording).

One JSON object per line::

    {"time": 1700000123.0, "type": "thermal_throttle_start", "entity_kind": "gpu",
     "entity": "node3/gpu5", "fault_id": "f2", "fault_type": "cooling_loss", "detail": {...}}

``type`` is a fault (``fault_onset``, with ``fault_type`` naming the hidden cause) or an
observable consequence (``thermal_throttle_start``/``_end``, ``power_cap_start``/``_end``,
``power_brake_start``/``_end``, ``link_down``/``link_up``, ``xid``, ``job_slowdown_start``/``_end``,
``congestion_start``/``_end``), or the schedule (``job_end``/``job_start``: a job finished, the
next one started; no fault). ``fault_id`` ties consequences to the fault that caused them
(empty for consequences with no fault, such as the power cap under full load). A
``job_slowdown_start`` can come twice in one episode: the second (``detail.continues``) says a
fault stopped the already slowed job (``detail.reason == "interrupted"``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator


class EventError(ValueError):
    """An events file is malformed; the message names the file and line."""


@dataclass(frozen=True)
class Event:
    time: float
    type: str
    entity_kind: str
    entity: str
    fault_id: str = ""
    fault_type: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)


REQUIRED = ("time", "type", "entity_kind", "entity")


def write_events(path: str | Path, events: Iterable[Event]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for ev in sorted(events, key=lambda e: e.time):
            fh.write(ev.to_json() + "\n")
            n += 1
    return n


def read_events(path: str | Path) -> list[Event]:
    path = Path(path)
    out = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EventError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EventError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        missing = [k for k in REQUIRED if k not in obj] if isinstance(obj, dict) else list(REQUIRED)
        if missing:
            raise EventError(f"{path}:{lineno}: missing {missing}")
        try:
            when = float(obj["time"])
            if not math.isfinite(when):
                raise ValueError(f"time {when} is not a finite number of seconds")
            out.append(
                Event(
                    time=when, type=str(obj["type"]),
                    entity_kind=str(obj["entity_kind"]), entity=str(obj["entity"]),
                    fault_id=str(obj.get("fault_id", "")), fault_type=str(obj.get("fault_type", "")),
                    detail=dict(obj.get("detail") or {}),
                )
            )
        except (TypeError, ValueError) as exc:
            raise EventError(f"{path}:{lineno}: bad value ({exc})") from None
    return out


def iter_type(events: Iterable[Event], *types: str) -> Iterator[Event]:
    return (e for e in events if e.type in types)
