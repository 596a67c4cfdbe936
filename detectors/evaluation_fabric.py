"""Fabric event kinds for the evaluation harness: ``link_down`` (predicted) and ``congestion``
(detected, with its cause).

- ``link_down`` is an ordinary :class:`~foreshock.detectors.evaluation.EventKind`: episodes
  run from a link's ``link_down`` to its ``link_up``; a flapping link's downs within
  ``merge_gap_s`` (1 h) of each other are one episode, so the lead is measured to the first
  down. Predictions are the optics detector's ``link_down``; the horizon matches its
  ``horizon_s`` (6 h). Claims whose horizon runs past the end of the recording without the
  event are *censored* (neither true nor false): a degrading optic found an hour before the
  recording stops may fail after it.
- ``congestion`` cannot be predicted from telemetry before traffic is rerouted — it starts the
  moment the link drops — so it is scored as a detection in its own report section
  (:func:`score_congestion`): for every ``congestion_start`` whose fault also took a link
  down (rerouted traffic), was a congestion finding on that link active within
  ``max_delay_samples`` samples of the onset, and did its reason name the failed link?

The harness imports this module and calls :func:`register` (one line at the end of
``evaluation.py``); this module imports the harness only inside functions, so there is no
import cycle whichever is imported first.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from foreshock.findings import Finding, Prediction

from .alarm import prediction_spans

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .evaluation import EventKind, RunResult

LINK_DOWN_HORIZON_S = 6 * 3600.0
"""Matches the optics detector's default ``horizon_s``."""
LINK_DOWN_MERGE_GAP_S = 3600.0
MAX_DELAY_SAMPLES = 2
"""Congestion from rerouting must be found within this many samples of its onset."""
HOLD_S = 60.0
"""An alarm starting this close to a congestion episode of its link is not a false alarm."""


def link_down_kind() -> "EventKind":
    from .evaluation import EventKind

    return EventKind("link_down", "link_down", "link_up", "link_down", "link",
                     horizon_s=LINK_DOWN_HORIZON_S, merge_gap_s=LINK_DOWN_MERGE_GAP_S, censor_at_end=True)


def register(register_event_kind: Callable[["EventKind"], None],
             section_scorers: dict[str, Callable[["RunResult"], dict[str, Any]]]) -> None:
    """Add ``link_down`` to the scored kinds and the ``congestion`` report section."""
    register_event_kind(link_down_kind())
    section_scorers["congestion"] = score_congestion


def score_congestion(result: "RunResult", max_delay_samples: int = MAX_DELAY_SAMPLES) -> dict[str, Any]:
    """Per detector set: congestion caused by rerouting, found in time, cause named.

    Episodes are ``congestion_start`` events; an episode is *rerouted* when its fault also has
    a ``link_down`` event (the failed link(s) are those events' links). ``found`` = a
    ``congestion`` prediction on that link, raised no earlier than ``HOLD_S`` before the onset,
    is active at some time in ``[onset, onset + max_delay_samples × interval]``; ``cause_named`` =
    the latest finding of that alarm up to that time names a failed link of the same fault. An
    alarm raised earlier is about something else: held on (a port that went down while
    congested once did), it would otherwise be credited with every later episode of its link,
    cause and all. ``false_alarms`` counts alarm starts on links with no congestion episode
    within ``HOLD_S`` around them.
    """
    interval = float(result.recording.interval)
    window = max_delay_samples * interval
    events = result.events
    failed_links: dict[str, set[str]] = {}
    for ev in events:
        if ev.type == "link_down" and ev.fault_id:
            failed_links.setdefault(ev.fault_id, set()).add(ev.entity)
    starts = [ev for ev in events if ev.type == "congestion_start" and ev.entity_kind == "link"]
    ends: dict[str, list[float]] = {}
    for ev in events:
        if ev.type == "congestion_end" and ev.entity_kind == "link":
            ends.setdefault(ev.entity, []).append(ev.time)
    topo = result.recording.topology
    out: dict[str, Any] = {"max_delay_samples": max_delay_samples, "interval_s": interval, "detectors": {}}
    for set_name, findings in result.findings.items():
        per_link = _congestion_findings(findings, topo.links)
        spans = {link: prediction_spans(fs, result.end) for link, fs in per_link.items()}
        rerouted = found = named = 0
        delays: list[float] = []
        other = other_found = 0
        misses: list[str] = []
        for ev in starts:
            causes = failed_links.get(ev.fault_id, set()) - {ev.entity}
            raised = [sp for sp in spans.get(ev.entity, []) if sp[0] >= ev.time - HOLD_S]
            hit_at = _first_active(raised, ev.time, ev.time + window)
            if not causes:
                other += 1
                other_found += hit_at is not None
                continue
            rerouted += 1
            if hit_at is None:
                misses.append(f"{ev.entity} at {ev.time:.0f}")
                continue
            found += 1
            delays.append(max(hit_at - ev.time, 0.0) / interval)
            since = min(s for s, w in raised if s <= ev.time + window and w >= ev.time)
            latest = [f for f in per_link.get(ev.entity, []) if f.active and since <= f.ts <= ev.time + window]
            if latest and any(names_link(latest[-1].reason, c) for c in causes):
                named += 1
        episodes = _episodes(starts, ends, result.end)
        alarms = sum(len(sp) for sp in spans.values())
        false_alarms = sum(
            1 for link, link_spans in spans.items() for s, _ in link_spans
            if not any(a - HOLD_S <= s <= b + HOLD_S for a, b in episodes.get(link, ())))
        out["detectors"][set_name] = {
            "rerouted_episodes": rerouted,
            "found": found,
            "recall": round(found / rerouted, 4) if rerouted else None,
            "cause_named": named,
            "cause_named_ratio": round(named / found, 4) if found else None,
            "delay_samples_median": round(float(np.median(delays)), 2) if delays else None,
            "delay_samples_max": round(float(np.max(delays)), 2) if delays else None,
            "other_episodes": other,
            "other_found": other_found,
            "alarms": alarms,
            "false_alarms": false_alarms,
            "missed": misses[:10],
        }
    return out


def names_link(reason: str, link: str) -> bool:
    """Whether ``reason`` names ``link`` as a whole name, not as the start of another: a congested
    uplink ``...~rail1-spine10`` names itself in every reason ("congestion on ..."), and had been
    counted as naming a failed ``...~rail1-spine1`` whatever cause it gave, or none."""
    return re.search(rf"(?<![\w~#/.-]){re.escape(link)}(?![\w~#/-])", reason) is not None


def _congestion_findings(findings: list[Finding], links: list[str]) -> dict[str, list[Prediction]]:
    out: dict[str, list[Prediction]] = {}
    for f in findings:
        if isinstance(f, Prediction) and f.event == "congestion" and f.entity_kind == "link":
            out.setdefault(links[f.slot], []).append(f)
    for fs in out.values():
        fs.sort(key=lambda p: p.ts)
    return out




def _first_active(spans: list[tuple[float, float]], lo: float, hi: float) -> float | None:
    """Earliest time in [lo, hi] at which one of the spans is active, or None."""
    best: float | None = None
    for s, w in spans:
        if s <= hi and w >= lo:
            t = max(s, lo)
            best = t if best is None else min(best, t)
    return best


def _episodes(starts: list[Any], ends: dict[str, list[float]], end: float) -> dict[str, list[tuple[float, float]]]:
    """(start, end) of each congestion episode per link; an open episode lasts to ``end``."""
    out: dict[str, list[tuple[float, float]]] = {}
    for ev in starts:
        later = [e for e in ends.get(ev.entity, []) if e >= ev.time]
        out.setdefault(ev.entity, []).append((ev.time, min(later) if later else max(end, ev.time)))
    return out
