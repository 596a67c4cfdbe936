"""Console sink: tallies findings over a run and renders a readable summary with rich.

The tally is bounded by the number of (finding key, entity) pairs, not by the number of
findings: for each it keeps the first and last telemetry time, a count and the last reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from rich.console import Console
from rich.table import Table

from foreshock.events import Event
from foreshock.findings import Anomaly, Finding, Incident, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology


@dataclass
class TallyEntry:
    what: str  # "predict thermal_throttle", "anomaly gpu_temp", "incident cooling_loop"
    entity_kind: str
    entity: str
    rack: str
    detector: str
    first_ts: float
    last_ts: float
    count: int
    reason: str
    eta_s: float = float("nan")


class FindingTally:
    """A sink that remembers, per (what, entity), when it was first and last seen."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.entries: dict[tuple[str, str, str], TallyEntry] = {}
        self.first_ts = float("nan")
        self.last_ts = float("nan")

    def observe_frame(self, frame: Frame, received_wall: float | None = None) -> None:
        if len(frame):
            lo, hi = float(frame.ts.min()), float(frame.ts.max())
            self.first_ts = lo if self.first_ts != self.first_ts else min(self.first_ts, lo)
            self.last_ts = hi if self.last_ts != self.last_ts else max(self.last_ts, hi)

    def observe_findings(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            if isinstance(f, Prediction):
                if not f.active:
                    continue
                what, kind, entity, eta = f"predict {f.event}", f.entity_kind, self.topology.name(f.entity_kind, f.slot), f.eta_s
                rack = self.topology.labels(kind, f.slot).get("rack", "")
            elif isinstance(f, Anomaly):
                what, kind, entity, eta = f"anomaly {f.field}", f.entity_kind, self.topology.name(f.entity_kind, f.slot), float("nan")
                rack = self.topology.labels(kind, f.slot).get("rack", "")
            elif isinstance(f, Incident):
                what, kind, entity, eta = f"incident {f.root_kind}", f.root_kind, f.root_entity, float("nan")
                rack = ""
            else:  # pragma: no cover - Finding is a closed union
                continue
            key = (what, kind, entity)
            entry = self.entries.get(key)
            if entry is None:
                self.entries[key] = TallyEntry(what, kind, entity, rack, f.detector if not isinstance(f, Incident) else "incidents",
                                               f.ts, f.ts, 1, f.reason, eta)
            else:
                entry.last_ts = max(entry.last_ts, f.ts)
                entry.count += 1
                entry.reason = f.reason

    def close(self) -> None:
        pass

    def by_rack(self) -> dict[str, dict[str, set[str]]]:
        """rack -> what -> entities; the shape of the demo's headline."""
        out: dict[str, dict[str, set[str]]] = {}
        for e in self.entries.values():
            out.setdefault(e.rack, {}).setdefault(e.what, set()).add(e.entity)
        return out


def _clock(ts: float, t0: float) -> str:
    if ts != ts or t0 != t0:
        return "-"
    s = int(round(ts - t0))
    return f"+{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def render_summary(tally: FindingTally, health: PipelineHealth, events: Sequence[Event] = (),
                   console: Console | None = None, max_rows: int = 25) -> None:
    console = console or Console()
    t0 = tally.first_ts
    console.rule("[bold]foreshock summary")
    samples = sum(health.samples.values())
    console.print(f"telemetry: {samples:,} samples over {_clock(tally.last_ts, t0)} of telemetry time; "
                  f"findings: {dict(health.findings)}; input problems: {health.total_problems():,}")

    racks = Table(title="Findings by rack", show_lines=False)
    for col in ("rack", "finding", "entities", "first at", "example"):
        racks.add_column(col, overflow="fold")
    grouped: dict[tuple[str, str], list[TallyEntry]] = {}
    for e in tally.entries.values():
        grouped.setdefault((e.rack or "-", e.what), []).append(e)
    ordered = sorted(grouped.items(), key=lambda kv: min(e.first_ts for e in kv[1]))
    for (rack, what), entries in ordered[:max_rows]:
        first = min(entries, key=lambda e: e.first_ts)
        example = first.entity + (f" (ETA {first.eta_s / 60:.1f} min)" if first.eta_s == first.eta_s else "")
        racks.add_row(rack, what, str(len(entries)), _clock(first.first_ts, t0), example)
    if len(ordered) > max_rows:
        racks.add_row("...", f"{len(ordered) - max_rows} more groups", "", "", "")
    console.print(racks)

    if events:
        truth = Table(title="Ground truth (simulator) vs. what foreshock said first")
        for col in ("fault", "target", "onset", "first consequence", "first foreshock finding", "lead"):
            truth.add_column(col, overflow="fold")
        faults = [e for e in events if e.type == "fault_onset"]
        for fault in faults[:max_rows]:
            consequences = [e for e in events if e.fault_id == fault.fault_id and e.type != "fault_onset"]
            first_cons = min(consequences, key=lambda e: e.time, default=None)
            related = _related_entries(tally, fault, consequences)
            first_find = min(related, key=lambda e: e.first_ts, default=None)
            lead = "-"
            if first_cons is not None and first_find is not None:
                lead_s = first_cons.time - first_find.first_ts
                lead = f"{lead_s / 60:+.1f} min" if lead_s >= 0 else f"late by {-lead_s / 60:.1f} min"
            truth.add_row(
                fault.fault_type, fault.entity, _clock(fault.time, t0),
                f"{first_cons.type} {first_cons.entity} at {_clock(first_cons.time, t0)}" if first_cons else "none yet",
                f"{first_find.what} {first_find.entity} at {_clock(first_find.first_ts, t0)}" if first_find else "none",
                lead,
            )
        console.print(truth)


def _related_entries(tally: FindingTally, fault: Event, consequences: Sequence[Event]) -> list[TallyEntry]:
    """Tally entries first seen after the fault's onset, on its target, its racks, or any entity one
    of its consequences touched."""
    names = {fault.entity} | {e.entity for e in consequences}
    detail = fault.detail if isinstance(fault.detail, dict) else {}
    racks = set(detail.get("racks") or ()) | ({detail["rack"]} if "rack" in detail else set())
    out = []
    for e in tally.entries.values():
        if e.first_ts < fault.time:
            continue  # said before the fault began: about something else
        if e.entity in names or e.rack in racks or any(e.entity.startswith(n + "/") for n in names):
            out.append(e)
    return out
