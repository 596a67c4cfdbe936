"""External fault and alert events for the incident engine, as JSON lines.

A scheduler, a BMC or an existing alerting system can feed its own events into foreshock's
incidents, one JSON object per line::

    {"node": "node12", "time": 1700001234.5, "type": "fan_failure", "severity": "critical"}

``time`` is seconds since the epoch (the telemetry clock) or an ISO 8601 string
(``2023-11-15T00:20:34Z``); ``severity`` is free text (``info`` and the like never open an
incident by themselves). Lines that cannot be read are counted in the pipeline health with the
reason and skipped — never fatal, never silently dropped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

from foreshock.health import PipelineHealth

STAGE = "external"  # the stage the live feed (streams/external_feed.py) counts under too
NOT_JSON = "external event line is not valid JSON"
MALFORMED = "external event line is malformed"


@dataclass(frozen=True)
class ExternalEvent:
    node: str
    time: float
    type: str
    severity: str = "warning"


def parse_time(value: Any) -> float:
    """Seconds since the epoch from a number or an ISO 8601 string (naive times are UTC)."""
    if isinstance(value, bool):
        raise ValueError("time must be a number or an ISO 8601 string")
    if isinstance(value, (int, float)):
        try:
            t = float(value)
        except OverflowError:  # an integer of hundreds of digits
            raise ValueError("time is not finite") from None
    elif isinstance(value, str):
        text = value.strip()
        try:
            t = float(text)
        except ValueError:
            try:
                dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"time {value!r} is neither seconds nor ISO 8601") from None
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            t = dt.timestamp()
    else:
        raise ValueError("time must be a number or an ISO 8601 string")
    if not math.isfinite(t):
        raise ValueError("time is not finite")
    return t


def parse_event(obj: Any) -> ExternalEvent:
    """One event from a decoded JSON object; raises ``ValueError`` naming what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    missing = [k for k in ("node", "time", "type") if k not in obj]
    if missing:
        raise ValueError(f"missing {missing}")
    node, typ = obj["node"], obj["type"]
    if not isinstance(node, str) or not node:
        raise ValueError("node must be a non-empty string")
    if not isinstance(typ, str) or not typ:
        raise ValueError("type must be a non-empty string")
    severity = obj.get("severity", "warning")
    if not isinstance(severity, str):
        raise ValueError("severity must be a string")
    return ExternalEvent(node, parse_time(obj["time"]), typ, severity)


def parse_line(line: str | bytes) -> tuple[ExternalEvent | None, str, str]:
    """One JSON line: ``(event, "", "")``, or ``(None, reason, detail)`` when it cannot be read
    (``NOT_JSON`` / ``MALFORMED``, bytes that are not UTF-8 included)."""
    try:
        return parse_event(json.loads(line)), "", ""
    except json.JSONDecodeError as exc:
        return None, NOT_JSON, exc.msg
    except RecursionError:  # arrays or objects nested a few thousand deep
        return None, NOT_JSON, "nested too deep"
    except ValueError as exc:  # a UnicodeDecodeError is one too
        return None, MALFORMED, str(exc)


def iter_events(lines: Iterable[str | bytes], health: PipelineHealth, source: str = "external") -> Iterator[ExternalEvent]:
    """Events from JSON lines; bad lines are counted (stage ``external``) and skipped."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        event, reason, detail = parse_line(line)
        if event is None:
            health.problem(STAGE, reason, detail=f"{source}:{lineno}: {detail}")
        else:
            yield event


def read_events(path: str | Path, health: PipelineHealth) -> list[ExternalEvent]:
    """All readable events of a JSON-lines file, in time order."""
    p = Path(path)
    # as bytes: a line that is not UTF-8 (a Latin-1 BMC message) is one malformed line that
    # parse_line counts, not a decode error that ends the run and loses the good lines with it
    with open(p, "rb") as fh:
        events = list(iter_events(fh, health, str(p)))
    return sorted(events, key=lambda e: e.time)
