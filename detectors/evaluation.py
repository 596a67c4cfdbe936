"""The evaluation harness: run detectors over a recording and score them against its ground truth.

What "predict" means here (DESIGN.md): a prediction is a hit when the predicted event happens
within its horizon, and its lead time is how early it came. Concretely, per *event kind*
(:data:`EVENT_KINDS`, the extension point — later issues add ``link_down``, ``congestion``):

- **Episodes**: the kind's start events per entity; a start within ``merge_gap_s`` of the
  previous episode's end continues it (a throttle that releases for a moment is one episode).
  Each episode keeps its fault type (``none`` for consequences without a fault, such as the
  power cap under full load).
- **Alarms**: a detector's prediction for an entity is active from its first ``active=True``
  until its withdrawal (``active=False``) or the end of the recording; refreshes are part of it.
- **Warm-up**: episodes that start within ``warmup_s`` of the recording's first sample are not
  scored (under way before the detectors saw the entity, or too early to predict).
- **Recall**: an episode is predicted when an alarm was active at some time in
  ``[start - horizon, start)`` — strictly before the onset: firing once the throttle bit is set
  predicts nothing. Its lead is ``start - max(alarm start, start - horizon)``.
- **Precision**: an alarm that starts inside an episode (or within ``merge_gap_s`` after it) is
  not scored. Any other alarm states "the event comes within the horizon" once per horizon it
  stays active; each such statement is a true positive when an episode of that entity starts
  within the horizon after it, otherwise a false alarm.
- **False alarms per 1000 GPU-hours** (entity-hours for other kinds): false statements over
  the entities' observed time.

``by_fault`` repeats the figures per fault type: episodes by the fault they started under;
false alarms on an entity the fault affected while it was active are charged to that fault,
the rest to ``none``.

The harness runs the detectors in one bank over time-aligned windows of the recording (racks
and nodes before GPUs, so a GPU's inlet is the one measured at the same tick), behind the same
input guard as the embedded pipeline. Detector *sets* (:data:`DETECTOR_SETS`) name what is
compared side by side: ``foreshock`` (the default bank) and the baselines.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from foreshock.events import Event
from foreshock.findings import Finding, Prediction
from foreshock.frames import Frame
from foreshock.guard import InputGuard
from foreshock.health import PipelineHealth
from foreshock.recording import Recording
from foreshock.topology import Topology

from .alarm import prediction_spans
from .bank import DetectorBank
from .registry import DEFAULT_BANK, create


# ---- the extension point: what is scored ---------------------------------------------------
@dataclass(frozen=True)
class EventKind:
    """One kind of predicted event: which ground-truth events, which prediction, which entities."""

    name: str
    start_type: str  # events.jsonl type that starts an episode
    end_type: str | None  # ... and ends it (None: episodes are instants)
    prediction: str  # Prediction.event that predicts it
    entity_kind: str  # gpu, link, ...
    horizon_s: float  # a prediction claims the event within this
    merge_gap_s: float = 600.0
    warmup_s: float = 600.0  # episodes starting this soon after the recording starts are not scored
    censor_at_end: bool = False  # a claim whose horizon outlives the recording is not judged


EVENT_KINDS: dict[str, EventKind] = {
    "thermal_throttle": EventKind("thermal_throttle", "thermal_throttle_start", "thermal_throttle_end",
                                  "thermal_throttle", "gpu", horizon_s=1800.0),
    "hbm_overheat": EventKind("hbm_overheat", "hbm_overheat_start", "hbm_overheat_end",
                              "hbm_overheat", "gpu", horizon_s=1800.0),
    "power_cap": EventKind("power_cap", "power_cap_start", "power_cap_end", "power_cap", "gpu",
                           horizon_s=300.0, merge_gap_s=120.0),
}
"""Event kinds scored, by name. Add a kind with one entry (or :func:`register_event_kind`)."""


def register_event_kind(kind: EventKind) -> None:
    EVENT_KINDS[kind.name] = kind


DETECTOR_SETS: dict[str, tuple[str, ...] | None] = {
    "foreshock": None,  # None: the registry's DEFAULT_BANK, whatever it holds today
    "river": ("river_hst",),
    "sklearn": ("sklearn",),
    "threshold": ("threshold",),
}
"""Detector sets compared side by side: name -> registry names of the detectors in the set."""

SectionScorer = Callable[["RunResult"], dict[str, Any]]
SECTION_SCORERS: dict[str, SectionScorer] = {}
"""Extra report sections (e.g. incident scoring): name -> function of the run's result whose
output lands in ``report.json`` under that name."""

METRICS = ("episodes", "recall", "precision", "lead_median_s", "lead_p10_s",
           "false_alarms_per_1000_gpu_hours")
NO_FAULT = "none"


def set_members(name: str) -> tuple[str, ...]:
    if name not in DETECTOR_SETS:
        raise ValueError(f"unknown detector set {name!r}; known: {sorted(DETECTOR_SETS)}")
    members = DETECTOR_SETS[name]
    return tuple(DEFAULT_BANK) if members is None else members


# ---- running ------------------------------------------------------------------------------
KIND_ORDER = ("rack", "node", "job", "link", "optic", "gpu")
"""Within one window: the environment first, GPUs last (they read their inlet)."""


def aligned_frames(recording: Recording, kinds: Iterable[str], window_s: float | None = None,
                   batch_rows: int = 262_144) -> Iterator[Frame]:
    """Frames of ``kinds`` cut into time windows, ordered by :data:`KIND_ORDER` inside each
    (see :meth:`Recording.iter_frames`: a window never carries samples from after its end)."""
    return recording.iter_frames(window_s, batch_rows, kinds=kinds, order=KIND_ORDER)


@dataclass
class RunResult:
    recording: Recording
    findings: dict[str, list[Finding]]  # by detector set
    events: list[Event]
    start: float
    end: float
    wall_s: float
    samples: int
    traces: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # gpu slot -> series
    health: PipelineHealth = field(default_factory=PipelineHealth)

    @property
    def duration_s(self) -> float:
        return max(self.end - self.start, 0.0)


def run_recording(recording: Recording, sets: Sequence[str],
                  params: dict[str, dict[str, Any]] | None = None,
                  trace_gpus: Sequence[int] = (), window_s: float | None = None,
                  progress: Callable[[float, float], None] | None = None) -> RunResult:
    """Run every detector of ``sets`` in one bank over the recording; findings split by set."""
    params = params or {}
    topo = recording.topology
    health = PipelineHealth()
    names: list[str] = []
    for s in sets:
        names.extend(m for m in set_members(s) if m not in names)
    detectors = [create(n, topo, **params.get(n, {})) for n in names]
    # a finding names its detector; route it to every set that holds that detector
    sets_of = {det.name: [s for s in sets if n in set_members(s)] for n, det in zip(names, detectors)}
    bank = DetectorBank(topo, detectors)
    guard = InputGuard(topo, health)
    found: dict[str, list[Finding]] = {s: [] for s in sets}
    meta_start, meta_end = recording.meta.get("start"), recording.meta.get("end")
    start = float(meta_start) if meta_start is not None else math.nan
    end = float(meta_end) if meta_end is not None else math.nan
    traces: dict[int, dict[str, list[float]]] = {int(g): {"ts": [], "gpu_temp": [], "hbm_temp": []}
                                                 for g in trace_gpus}
    trace_idx = np.array(sorted(traces), dtype=np.int64)
    samples = 0
    wall0 = time.perf_counter()
    first = last = math.nan
    for frame in aligned_frames(recording, bank.kinds, window_s):
        clean = guard.check(frame)
        if not len(clean):
            continue
        samples += len(clean)
        for f in bank.update(clean):
            for s in sets_of.get(getattr(f, "detector", ""), ()):
                found[s].append(f)
        t_hi = float(clean.ts[-1])
        first = t_hi if math.isnan(first) else min(first, float(clean.ts[0]))
        last = t_hi if math.isnan(last) else max(last, t_hi)
        if clean.kind == "gpu" and len(trace_idx):
            hit = np.isin(clean.slot, trace_idx)
            for row in np.flatnonzero(hit):
                tr = traces[int(clean.slot[row])]
                tr["ts"].append(float(clean.ts[row]))
                tr["gpu_temp"].append(float(clean.columns["gpu_temp"][row]))
                tr["hbm_temp"].append(float(clean.columns["hbm_temp"][row]))
        if progress is not None and not math.isnan(end):
            progress(t_hi - (start if not math.isnan(start) else first), end - start)
    start = first if math.isnan(start) else start
    end = last if math.isnan(end) else end
    return RunResult(recording, found, recording.events(), start, end, time.perf_counter() - wall0,
                     samples, traces, health)


# ---- scoring ------------------------------------------------------------------------------
@dataclass
class Episode:
    entity: str
    start: float
    end: float
    fault_id: str
    fault_type: str
    lead_s: float = math.nan  # set when predicted


def episodes(events: Iterable[Event], kind: EventKind) -> list[Episode]:
    """Merge a kind's start/end events into episodes per entity."""
    per_entity: dict[str, list[Event]] = {}
    for ev in events:
        if ev.entity_kind == kind.entity_kind and ev.type in (kind.start_type, kind.end_type):
            per_entity.setdefault(ev.entity, []).append(ev)
    out: list[Episode] = []
    for entity, evs in per_entity.items():
        evs.sort(key=lambda e: (e.time, e.type != kind.end_type))
        current: Episode | None = None
        for ev in evs:
            if ev.type == kind.start_type:
                if current is not None and (math.isinf(current.end) or ev.time - current.end <= kind.merge_gap_s):
                    current.end = math.inf  # continues
                    continue
                if current is not None:
                    out.append(current)
                current = Episode(entity, ev.time, math.inf, ev.fault_id, ev.fault_type or NO_FAULT)
            elif current is not None and math.isinf(current.end):
                current.end = ev.time
        if current is not None:
            out.append(current)
    return out


def alarm_intervals(findings: Iterable[Finding], kind: EventKind, topology: Topology,
                    end: float) -> dict[str, list[tuple[float, float]]]:
    """Active intervals of the predictions for ``kind``, per entity name."""
    per_slot: dict[int, list[Prediction]] = {}
    for f in findings:
        if isinstance(f, Prediction) and f.event == kind.prediction and f.entity_kind == kind.entity_kind:
            per_slot.setdefault(f.slot, []).append(f)
    out: dict[str, list[tuple[float, float]]] = {}
    for slot, preds in per_slot.items():
        preds.sort(key=lambda p: p.ts)
        out[topology.name(kind.entity_kind, slot)] = prediction_spans(preds, end)
    return out


@dataclass
class FaultScope:
    """Which entities a fault affects, and when (for charging false alarms to faults)."""

    fault_type: str
    entities: frozenset[str]
    onset: float
    end: float


def fault_scopes(recording: Recording, events: Iterable[Event], entity_kind: str) -> list[FaultScope]:
    """Entities of ``entity_kind`` under each fault, from its onset event and the recording's
    fault list (durations). GPU faults reach the GPU, node faults its GPUs, loop faults the
    GPUs of every rack on the loop; link/optic faults their link."""
    topo = recording.topology
    durations = {f.get("id"): f.get("duration_s") for f in recording.meta.get("faults", []) or []
                 if isinstance(f, dict)}
    scopes = []
    for ev in events:
        if ev.type != "fault_onset":
            continue
        names: set[str] = set()
        try:
            if entity_kind == "gpu":
                if ev.entity_kind == "gpu":
                    names = {ev.entity}
                elif ev.entity_kind == "node":
                    names = {topo.gpus[g] for g in topo.gpus_of_node(topo.slot("node", ev.entity))}
                elif ev.entity_kind == "rack":
                    names = {topo.gpus[g] for g in topo.gpus_of_rack(topo.slot("rack", ev.entity))}
                elif ev.entity_kind in ("loop", "cooling_loop"):
                    loop = topo.loops.index(ev.entity)
                    racks = np.flatnonzero(topo.rack_loop == loop)
                    names = {topo.gpus[g] for g in np.flatnonzero(np.isin(topo.gpu_rack, racks))}
            elif entity_kind == "link":
                if ev.entity_kind == "link":
                    names = {ev.entity}
                elif ev.entity_kind == "optic":
                    names = {ev.entity.rsplit("#", 1)[0]}
        except (KeyError, ValueError):
            names = set()
        dur = durations.get(ev.fault_id)
        end = ev.time + float(dur) if isinstance(dur, (int, float)) else math.inf
        scopes.append(FaultScope(ev.fault_type or NO_FAULT, frozenset(names), ev.time, end))
    return scopes


def _blank() -> dict[str, Any]:
    return {"episodes": 0, "hits": 0, "tp": 0, "fp": 0, "leads": []}


def _finish(acc: dict[str, Any], entity_hours: float) -> dict[str, Any]:
    leads = np.asarray(acc["leads"], dtype=float)
    n_alarm = acc["tp"] + acc["fp"]

    def num(x: float) -> float | None:
        return None if x is None or not np.isfinite(x) else round(float(x), 4)

    return {
        "episodes": int(acc["episodes"]),
        "recall": num(acc["hits"] / acc["episodes"]) if acc["episodes"] else None,
        "precision": num(acc["tp"] / n_alarm) if n_alarm else None,
        "lead_median_s": num(float(np.median(leads))) if len(leads) else None,
        "lead_p10_s": num(float(np.percentile(leads, 10))) if len(leads) else None,
        "false_alarms_per_1000_gpu_hours": num(acc["fp"] / entity_hours * 1000.0) if entity_hours > 0 else None,
    }


def score_kind(findings: Iterable[Finding], events: Sequence[Event], kind: EventKind,
               recording: Recording, start: float, end: float) -> dict[str, Any]:
    """Metrics of one detector set for one event kind, with ``by_fault``."""
    topo = recording.topology
    all_eps = episodes(events, kind)
    eps = [ep for ep in all_eps if ep.start >= start + kind.warmup_s]  # scored for recall
    alarms = alarm_intervals(findings, kind, topo, end)
    scopes = fault_scopes(recording, events, kind.entity_kind)
    horizon = kind.horizon_s
    by_entity: dict[str, list[Episode]] = {}
    for ep in all_eps:  # an alarm during or before a warm-up episode is judged as usual
        by_entity.setdefault(ep.entity, []).append(ep)
    total = _blank()
    by_fault: dict[str, dict[str, Any]] = {}

    def bucket(fault_type: str) -> dict[str, Any]:
        return by_fault.setdefault(fault_type, _blank())

    # recall and lead
    for ep in eps:
        best = math.nan
        for s, w in alarms.get(ep.entity, ()):
            if s < ep.start and w > ep.start - horizon:
                lead = ep.start - max(s, ep.start - horizon)
                best = lead if math.isnan(best) else max(best, lead)
        ep.lead_s = best
        for acc in (total, bucket(ep.fault_type)):
            acc["episodes"] += 1
            if not math.isnan(best):
                acc["hits"] += 1
                acc["leads"].append(best)
    # precision: each alarm restates its claim once per horizon while it stays active
    for entity, spans in alarms.items():
        mine = by_entity.get(entity, [])
        for s, w in spans:
            if any(ep.start <= s <= ep.end + kind.merge_gap_s for ep in mine):
                continue  # raised during the event: not a prediction
            t = s
            while True:
                hit = next((ep for ep in mine if t < ep.start <= t + horizon), None)
                if hit is not None:
                    total["tp"] += 1
                    bucket(hit.fault_type)["tp"] += 1
                    break  # the episode consumes the rest of the alarm
                if kind.censor_at_end and t + horizon > end:
                    break  # censored: the recording ended before the claim could come true
                total["fp"] += 1
                charged = next((sc.fault_type for sc in scopes
                                if entity in sc.entities and sc.onset <= t <= sc.end), NO_FAULT)
                bucket(charged)["fp"] += 1
                t += horizon
                if t >= w:
                    break
    hours = max(end - start, 0.0) / 3600.0 * topo.size(kind.entity_kind)
    result = _finish(total, hours)
    result["by_fault"] = {ft: _finish(acc, hours) for ft, acc in sorted(by_fault.items())}
    return result


def score(result: RunResult, kinds: Sequence[str] | None = None) -> dict[str, Any]:
    """The report: ``{"detectors": {set: {kind: metrics + by_fault}}, "meta": ..., **sections}``."""
    kinds = list(EVENT_KINDS) if kinds is None else list(kinds)
    report: dict[str, Any] = {"detectors": {}}
    for set_name, findings in result.findings.items():
        report["detectors"][set_name] = {
            k: score_kind(findings, result.events, EVENT_KINDS[k], result.recording, result.start, result.end)
            for k in kinds
        }
    report["meta"] = {
        "recording": str(result.recording.path),
        "gpus": result.recording.topology.size("gpu"),
        "simulated_hours": round(result.duration_s / 3600.0, 3),
        "interval_s": result.recording.interval,
        "seed": result.recording.meta.get("seed"),
        "scenario": result.recording.meta.get("scenario"),
        "horizons_s": {k: EVENT_KINDS[k].horizon_s for k in kinds},
        "wall_s": round(result.wall_s, 2),
        "samples": result.samples,
        "input_problems": {f"{s}:{r}": n for (s, r), n in result.health.problems.items()},
    }
    for name, scorer in SECTION_SCORERS.items():
        report[name] = scorer(result)
    return report


def pick_trace_gpus(recording: Recording, count: int = 4) -> list[int]:
    """A few GPUs worth plotting: thermal episodes of different fault types first."""
    topo = recording.topology
    picked: list[int] = []
    seen_types: set[str] = set()
    evs = [e for e in recording.events() if e.entity_kind == "gpu" and e.type.endswith("_start")
           and e.type.split("_start")[0] in ("thermal_throttle", "hbm_overheat")]
    for ev in sorted(evs, key=lambda e: e.time):
        key = ev.fault_type or NO_FAULT
        if key in seen_types:
            continue
        seen_types.add(key)
        picked.append(topo.slot("gpu", ev.entity))
        if len(picked) >= count:
            break
    for ev in evs:
        if len(picked) >= count:
            break
        g = topo.slot("gpu", ev.entity)
        if g not in picked:
            picked.append(g)
    return picked


# ---- output -------------------------------------------------------------------------------
def write_report(report: dict[str, Any], out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=False), encoding="utf-8")
    return path


def write_plots(result: RunResult, report: dict[str, Any], out_dir: str | Path,
                kinds: Sequence[str] = ("thermal_throttle", "power_cap")) -> list[Path]:
    """PNG plots: a few GPUs (temperature, predicted ETA, actual throttles) and lead times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    topo = result.recording.topology
    written: list[Path] = []
    t0 = result.start
    for slot, tr in result.traces.items():
        if not tr["ts"]:
            continue
        name = topo.gpus[slot]
        fig, ax = plt.subplots(figsize=(10, 4))
        ts = (np.asarray(tr["ts"]) - t0) / 60.0
        ax.plot(ts, tr["gpu_temp"], lw=1, label="core °C")
        ax.plot(ts, tr["hbm_temp"], lw=1, label="HBM °C")
        ax.axhline(87, color="tab:red", ls=":", lw=1)
        for ep in episodes(result.events, EVENT_KINDS["thermal_throttle"]):
            if ep.entity == name:
                end = ep.end if np.isfinite(ep.end) else result.end
                ax.axvspan((ep.start - t0) / 60, (end - t0) / 60, color="tab:red", alpha=0.15,
                           label=f"thermal throttle ({ep.fault_type})")
        ax.set_xlabel("minutes")
        ax.set_ylabel("°C")
        ax2 = ax.twinx()
        for set_name, findings in result.findings.items():
            pts = [(p.ts, p.eta_s) for p in findings if isinstance(p, Prediction) and p.slot == slot
                   and p.entity_kind == "gpu" and p.event == "thermal_throttle" and p.active and p.eta_s >= 0]
            if pts:
                arr = np.asarray(pts)
                ax2.scatter((arr[:, 0] - t0) / 60, arr[:, 1] / 60, s=8, label=f"{set_name} ETA")
        ax2.set_ylabel("predicted ETA (min)")
        handles = ax.get_legend_handles_labels()
        handles2 = ax2.get_legend_handles_labels()
        uniq = dict(zip(handles[1] + handles2[1], handles[0] + handles2[0]))
        ax.legend(uniq.values(), uniq.keys(), loc="upper left", fontsize=8)
        ax.set_title(f"{name}: temperature, predicted throttle ETA, actual throttle")
        fig.tight_layout()
        path = out / f"gpu_{name.replace('/', '_')}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    # lead-time histograms per detector set
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.5), squeeze=False)
    for ax, kind_name in zip(axes[0], kinds):
        kind = EVENT_KINDS[kind_name]
        eps = episodes(result.events, kind)
        for set_name, findings in result.findings.items():
            alarms = alarm_intervals(findings, kind, topo, result.end)
            leads = []
            for ep in eps:
                cand = [ep.start - max(s, ep.start - kind.horizon_s) for s, w in alarms.get(ep.entity, ())
                        if s < ep.start and w > ep.start - kind.horizon_s]
                if cand:
                    leads.append(max(cand) / 60.0)
            if leads:
                ax.hist(leads, bins=20, range=(0, kind.horizon_s / 60), alpha=0.5, label=set_name)
        ax.set_title(f"{kind_name}: lead time")
        ax.set_xlabel("minutes before onset")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "lead_times.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written


def render_table(report: dict[str, Any], kinds: Sequence[str] | None = None, by_fault: bool = True) -> Any:
    """A rich table of the report (returned, so the caller decides where to print it)."""
    from rich.table import Table

    table = Table(title="foreshock evaluation", show_lines=False)
    for col in ("detector", "event", "fault", "episodes", "recall", "precision", "lead median",
                "lead p10", "false alarms /1000 GPU-h"):
        table.add_column(col, justify="right" if col not in ("detector", "event", "fault") else "left")

    def fmt(v: Any, kind: str = "") -> str:
        if v is None:
            return "—"
        if kind == "s":
            return f"{v / 60:.1f} min" if v >= 60 else f"{v:.0f} s"
        if isinstance(v, float):
            return f"{v:.2f}"
        return str(v)

    for det, per_kind in report["detectors"].items():
        for kind, m in per_kind.items():
            if kinds is not None and kind not in kinds:
                continue
            rows = [("all", m)] + (sorted(m.get("by_fault", {}).items()) if by_fault else [])
            for fault, mm in rows:
                table.add_row(det if fault == "all" else "", kind if fault == "all" else "", fault,
                              fmt(mm["episodes"]), fmt(mm["recall"]), fmt(mm["precision"]),
                              fmt(mm["lead_median_s"], "s"), fmt(mm["lead_p10_s"], "s"),
                              fmt(mm["false_alarms_per_1000_gpu_hours"]))
        table.add_section()
    return table


# Fabric kinds (issue 5): link_down, and congestion as a report section.
from .evaluation_fabric import register as _register_fabric  # noqa: E402

_register_fabric(register_event_kind, SECTION_SCORERS)

# Incidents (issue 6): the "foreshock" set's findings through the incident engine.
from .incident_eval import score_run as _score_incidents  # noqa: E402

SECTION_SCORERS["incidents"] = _score_incidents
