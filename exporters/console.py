"""Console sink: tallies findings over a run and renders a readable summary with rich.

The tally is bounded by the number of (finding key, entity) pairs, not by the number of
findings: for each it keeps the first and last telemetry time, a count, the first reason and
the times it was raised (at most :data:`MAX_RAISES`).
"""

from __future__ import annotations

import calendar
import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from foreshock.detectors.incidents import REFIRE_NOTE, REFIRE_TIME
from foreshock.detectors.thermal_fit import PARAMS as THERMAL_PARAMS
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
    # when it was raised: its first sighting, and each one after it was withdrawn (a prediction
    # withdrawn, an incident resolved) or went quiet for RAISE_GAP_S. A fault that recurs on the
    # same entities is told by a later raise: with the first sighting alone, the summary dropped
    # what was said of the second fault as "said before the fault began"
    raised: list[float] = field(default_factory=list)
    withdrawn: bool = False


@dataclass(frozen=True)
class TimeOrigin:
    """Where a summary's clocks (+h:mm:ss) count from, and what that moment is, said beside them.

    A run that knows its start passes it (a simulation's start, where ``simulate`` and ``demo``
    count a fault's onset from); a source that does not (a live ``watch``) counts from its
    first sample, one sampling interval later: counted from there, a fault ``simulate`` put at
    "+60 s" had read "+0:00:55" in the summary."""
    ts: float
    what: str  # "the simulation's start", "the first sample"


RAISE_GAP_S = 600.0
"""Silence after which a finding seen again counts as raised again: a prediction is refreshed every
minute or so while active, an anomaly comes and goes with its samples."""

MAX_RAISES = 32
"""Raise times a tally entry keeps: its first and the latest ones (``watch`` runs for weeks, and a
flapping entity is raised again and again)."""

MAX_INCIDENTS = 1000
"""Incidents a tally keeps (open ones always): ``foreshock watch`` runs for weeks, and each
incident had been kept for good (a few KB each, with its members' names)."""


class FindingTally:
    """A sink that remembers, per (what, entity), when it was first and last seen.

    Of the incidents, the open ones and the ``max_incidents`` the summary would show first
    (most members, then the earliest opened): past that, the resolved one that it would show
    last is forgotten (counted in :attr:`incidents_forgotten`)."""

    def __init__(self, topology: Topology, max_incidents: int = MAX_INCIDENTS) -> None:
        self.topology = topology
        self.entries: dict[tuple[str, str, str], TallyEntry] = {}
        self.incidents: dict[str, Incident] = {}  # latest state of each incident
        self.incident_opened: dict[str, float] = {}
        # per incident, the worst step slowdown each job was said to suffer, and the entities it
        # ever predicted: its last update (a resolved one) names neither, and a cooling loss that
        # slowed five jobs read "-" in the summary once it was over
        self.incident_jobs: dict[str, dict[str, float]] = {}
        self.incident_predicted: dict[str, set[str]] = {}
        self.max_incidents = max_incidents
        self.incidents_forgotten = 0
        # when each forgotten incident opened, the last max_incidents forgotten: the engine reopens
        # a resolved incident under its id (a flapping link), and one forgotten came back counted
        # twice in the summary's "N more" and "opened" at its reopening
        self._forgotten_opened: dict[str, float] = {}
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
                if not f.active:  # withdrawn: the next active one is raised again
                    name = self.topology.name(f.entity_kind, f.slot)
                    withdrawn = self.entries.get((f"predict {f.event}", f.entity_kind, name))
                    if withdrawn is not None:
                        withdrawn.withdrawn = True
                    continue
                what, kind, entity, eta = f"predict {f.event}", f.entity_kind, self.topology.name(f.entity_kind, f.slot), f.eta_s
                rack = self.topology.labels(kind, f.slot).get("rack", "")
            elif isinstance(f, Anomaly):
                what, kind, entity, eta = f"anomaly {f.field}", f.entity_kind, self.topology.name(f.entity_kind, f.slot), float("nan")
                rack = self.topology.labels(kind, f.slot).get("rack", "")
            elif isinstance(f, Incident):
                opened = self._forgotten_opened.pop(f.incident_id, None)
                if opened is not None and f.incident_id not in self.incidents:  # forgotten, reopened
                    self.incident_opened[f.incident_id] = opened
                    self.incidents_forgotten -= 1
                self.incidents[f.incident_id] = f
                self.incident_opened.setdefault(f.incident_id, f.ts)
                worst = self.incident_jobs.setdefault(f.incident_id, {})
                for job, ratio in f.jobs:
                    worst[job] = max(worst.get(job, ratio), ratio)
                self.incident_predicted.setdefault(f.incident_id, set()).update(m for m, _ in f.predicted_members)
                if len(self.incidents) > self.max_incidents:
                    self._forget_an_incident()
                what, kind, entity, eta = f"incident {f.root_kind}", f.root_kind, f.root_entity, float("nan")
                rack = ""
            else:  # pragma: no cover - Finding is a closed union
                continue
            key = (what, kind, entity)
            entry = self.entries.get(key)
            if entry is None:
                entry = self.entries[key] = TallyEntry(
                    what, kind, entity, rack, f.detector if not isinstance(f, Incident) else "incidents",
                    f.ts, f.ts, 1, f.reason, eta, [f.ts])
            else:
                # reason and ETA stay those of the first finding: the summary shows each group's
                # first example, and a later reason next to the first time and ETA would mislead
                if entry.withdrawn or f.ts - entry.last_ts > RAISE_GAP_S:
                    entry.raised.append(f.ts)
                    if len(entry.raised) > MAX_RAISES:  # the first stays: the summary's "first at"
                        del entry.raised[1]
                entry.last_ts = max(entry.last_ts, f.ts)
                entry.count += 1
            # an incident's resolution withdraws what its root was said to be
            entry.withdrawn = isinstance(f, Incident) and f.state == "resolved"

    def close(self) -> None:
        pass

    def summary_order(self, inc: Incident) -> tuple[int, float]:
        """Where the summary lists an incident: most members first, then the earliest opened."""
        return -len(inc.members), self.incident_opened[inc.incident_id]

    def _forget_an_incident(self) -> None:
        resolved = [inc for inc in self.incidents.values() if inc.state == "resolved"]
        if not resolved:
            return  # open incidents are few (the engine bounds them); they are kept
        last = max(resolved, key=self.summary_order)
        del self.incidents[last.incident_id]
        self.incident_jobs.pop(last.incident_id, None)
        self.incident_predicted.pop(last.incident_id, None)
        self._forgotten_opened[last.incident_id] = self.incident_opened.pop(last.incident_id)
        if len(self._forgotten_opened) > self.max_incidents:  # the longest forgotten: past reopening
            del self._forgotten_opened[next(iter(self._forgotten_opened))]
        self.incidents_forgotten += 1

    def by_rack(self) -> dict[str, dict[str, set[str]]]:
        """rack -> what -> entities; the shape of the demo's headline."""
        out: dict[str, dict[str, set[str]]] = {}
        for e in self.entries.values():
            out.setdefault(e.rack, {}).setdefault(e.what, set()).add(e.entity)
        return out


def minutes_away(eta_s: float) -> str:
    """How far off a predicted member is, in whole minutes rounded half up: "now" when due, "<1 min"
    under half a minute (rounded, "0 min" read as due; and format's half-to-even read 30 s as
    "0 min", 150 s as "2 min"); ``eta_s`` >= 0."""
    if eta_s == 0:
        return "now"
    return "<1 min" if eta_s < 30 else f"{math.floor(eta_s / 60 + 0.5):.0f} min"


def _clock(ts: float, t0: float) -> str:
    if ts != ts or t0 != t0:
        return "-"
    s = int(round(ts - t0))
    sign = "-" if s < 0 else "+"  # (floor division had printed -5 s as "+-1:59:55")
    s = abs(s)
    return f"{sign}{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def render_summary(tally: FindingTally, health: PipelineHealth, events: Sequence[Event] = (),
                   console: Console | None = None, max_rows: int = 15, origin: TimeOrigin | None = None) -> None:
    """Incidents first (what an operator acts on), then predictions, then the ground truth
    comparison when the source knows it, and a one-line count of raw anomalies. Clocks count
    from ``origin`` (default: the first sample), which the summary names."""
    console = console or Console()
    origin = origin or TimeOrigin(tally.first_ts, "the first sample")
    t0 = origin.ts
    console.rule("[bold]foreshock summary")
    samples = sum(health.samples.values())
    # (the span from the first sample to the last, as the JSON line's telemetry_seconds)
    console.print(f"telemetry: {samples:,} samples over {_clock(tally.last_ts, tally.first_ts)} of telemetry time; "
                  f"findings: {escape(_findings_line(health.findings))}")
    console.print(f"[dim]times (+h:mm:ss) count from {escape(origin.what)}[/dim]")
    if health.problems:
        console.print(f"input problems counted: {health.total_problems():,} ("
                      + escape(_largest_problems(health.problems)) + ")")
    skipped = health.skipped()
    if skipped:  # a live source that could not keep its interval: its samples are fewer than it seems
        console.print("polls skipped (a poll ran past its slot): "
                      + escape(", ".join(f"{stage} {n:,}" for stage, n in sorted(skipped.items()))))
    _incidents_table(tally, console, t0, max_rows)
    _predictions_table(tally, console, t0, max_rows)
    if events:
        _truth_table(tally, events, console, t0, max_rows)
    anomalies: dict[str, int] = {}
    for e in tally.entries.values():
        if e.what.startswith("anomaly "):
            anomalies[e.what[len("anomaly "):]] = anomalies.get(e.what[len("anomaly "):], 0) + 1
    if anomalies:
        console.print("raw anomalies (entities per field): "
                      + ", ".join(f"{k} {v}" for k, v in sorted(anomalies.items(), key=lambda kv: -kv[1])))


def _findings_line(findings: Mapping[str, int]) -> str:
    """``total (type count, ...)``, the largest first, as the input problems' line; "none" for none:
    the summary had printed a Python dict ("findings: {'anomaly': 2}", "findings: {}")."""
    counted = sorted(((kind, n) for kind, n in findings.items() if n), key=lambda kv: (-kv[1], kv[0]))
    if not counted:
        return "none"
    return f"{sum(n for _, n in counted):,} (" + ", ".join(f"{kind} {n:,}" for kind, n in counted) + ")"


def _plural(n: int, noun: str) -> str:
    """``n`` and ``noun``, with an s unless one: "1 more group", not "1 more groups"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


PROBLEM_REASONS_SHOWN = 4
"""Problem reasons the summary's one line names, the largest first."""


def _largest_problems(problems: Mapping[tuple[str, str], int]) -> str:
    """``stage/reason count, ...`` for the largest reasons, and how many more there are with their
    count, so that the numbers listed add up to the total printed before them. A single one left
    over is named: it takes the room of the words that would count it."""
    ordered = sorted(problems.items(), key=lambda kv: -kv[1])
    shown = ordered if len(ordered) <= PROBLEM_REASONS_SHOWN + 1 else ordered[:PROBLEM_REASONS_SHOWN]
    listed = [f"{stage}/{reason} {n:,}" for (stage, reason), n in shown]
    rest = ordered[len(shown):]
    if rest:
        listed.append(f"and {len(rest)} other reasons {sum(n for _, n in rest):,}")
    return ", ".join(listed)


INCIDENTS_WIDE = 100
"""Consoles narrower than this (an 80-column terminal) print each incident's predicted members and jobs
on lines of their own under the table, beside its reason: in columns of their own they folded entity
names mid-word ("node1023/gpu6~" then "leaf127#b")."""


ETA_STALE_S = 60.0
"""How long before the run's end an incident's last update must be for the summary to say when its
predicted members' ETAs were said: they count from that update, and are printed in whole minutes."""


def _incidents_table(tally: FindingTally, console: Console, t0: float, max_rows: int) -> None:
    if not tally.incidents:
        console.print("incidents: none")
        return
    # short columns in the table, each incident's reason below it at the console's full width: in a
    # column of its own an 80-column terminal folded it to nine characters a line
    wide = console.width >= INCIDENTS_WIDE
    table = Table(title="Incidents (one per cause)")
    columns = ("opened", "state", "root cause", "members") + (
        ("predicted next", "jobs (step slowdown)") if wide else ())
    for col in columns:
        table.add_column(col, overflow="fold", no_wrap=col in ("opened", "state", "members"))
    ordered = sorted(tally.incidents.values(), key=tally.summary_order)
    # the run's end: its last sample, else (no frames seen) its last finding
    end = tally.last_ts if tally.last_ts == tally.last_ts else max(e.last_ts for e in tally.entries.values())
    shown = []
    for inc in ordered[:max_rows]:
        # names go in as Text, not markup: escape() doubles a trailing backslash (for a tag that
        # might follow), which a cell or plain text after it then shows
        nxt = ", ".join(f"{m} ({minutes_away(eta)})" if eta >= 0 else m for m, eta in inc.predicted_members[:3])
        if len(inc.predicted_members) > 3:
            nxt += f" +{len(inc.predicted_members) - 3}"
        if any(eta >= 0 for _, eta in inc.predicted_members[:3]) and end - inc.ts >= ETA_STALE_S:
            # the ETAs count from the incident's last update, which may be long before the run's end
            # (an optic's incident, settled at +0:38, read "235 min" where the live prediction said 142)
            nxt += f"; ETAs as of {_clock(inc.ts, t0)}"
        predicted = len(tally.incident_predicted.get(inc.incident_id, ()))
        if not nxt and predicted:  # none now (a resolved one's last update names none): it had some
            nxt = f"{predicted} earlier"
        jobs = _jobs_cell(inc, tally.incident_jobs.get(inc.incident_id, {}))
        shown.append((inc, nxt, jobs))
        cells: list[str | Text] = [_clock(tally.incident_opened[inc.incident_id], t0), inc.state,
                                   Text(f"{inc.root_kind} {inc.root_entity}"), str(len(inc.members))]
        table.add_row(*cells, *((Text(nxt or "-"), Text(jobs or "-")) if wide else ()))
    # the rows left out and the incidents forgotten, each counted on its own: fewer kept than
    # max_rows left out none, and must not take the forgotten ones off
    more = max(len(ordered) - max_rows, 0) + tally.incidents_forgotten
    if more > 0:
        table.add_row("...", "", f"{more} more", *[""] * (len(columns) - 3))
    console.print(table)
    for inc, nxt, jobs in shown:  # a reason names its root ("cooling loop cdu1: 128 GPUs ..."); else say it
        root = "" if inc.root_entity in inc.reason else f" ({inc.root_kind} {inc.root_entity})"
        console.print(Text.assemble("  ", ("why", "bold"), root, ": ", _on_clock(inc.reason, t0)))
        for label, text in (("predicted next", nxt), ("jobs (step slowdown)", jobs)) if not wide else ():
            if text:  # (the table's columns, in a wide console)
                console.print(Text.assemble("    ", (label, "bold"), ": ", text))


JOB_SLOWED = 1.01
"""A job's predicted step slowdown from which it counts as slowed (under 1 % is noise): the summary's
incidents table and ``foreshock incidents`` name only these."""


def _jobs_cell(inc: Incident, worst: Mapping[str, float], shown: int = 3) -> str:
    """The jobs an incident slows, the most slowed first: those of its last update with their slowdown
    now, then after "was" the others it slowed, with the worst slowdown said of each ("was job7 x1.21");
    "+N" for those slowed left out, then how many others it touches without slowing them. In name
    order, with x1.00 ones, a cooling loss's row read "job5 x1.00, job6 x1.00, job7 x1.00 +2" and hid
    the job it slowed by 15 %."""
    def most_slowed(jobs: Iterable[tuple[str, float]]) -> list[tuple[str, float]]:
        return sorted((jr for jr in jobs if jr[1] >= JOB_SLOWED), key=lambda jr: (-jr[1], jr[0]))
    now = most_slowed(inc.jobs)
    # a job slowed before and not now (or no longer named) is told by the worst said of it
    slowed_now = {j for j, _ in now}
    past = most_slowed((j, r) for j, r in worst.items() if j not in slowed_now)
    now_shown, past_shown = now[:shown], past[:max(shown - len(now), 0)]
    cell = ", ".join(f"{j} x{r:.2f}" for j, r in now_shown)
    if past_shown:
        cell += ("; " if cell else "") + "was " + ", ".join(f"{j} x{r:.2f}" for j, r in past_shown)
    more = len(now) + len(past) - len(now_shown) - len(past_shown)
    cell += f" +{more}" if more else ""
    # (a job it touched and only ever said to slow by under 1 %: counted, not named)
    calm = len({j for j, _ in inc.jobs} | worst.keys()) - len(now) - len(past)
    if calm:
        calm_jobs = f"{calm} {'other ' if cell else ''}job{'s' if calm > 1 else ''} not slowed"
        cell += ("; " if cell else "") + calm_jobs
    return cell


def _on_clock(reason: str, t0: float) -> str:
    """``reason`` with the UTC times of its re-fire notes ("fired again at 2026-12-05 05:10:02 UTC")
    on the summary's clock (+h:mm:ss), as every other time it prints."""
    if t0 != t0:
        return reason

    def relative(m: re.Match[str]) -> str:
        ts = calendar.timegm(time.strptime(m.group(2), REFIRE_TIME))
        start, end = m.start(2) - m.start(), m.end(2) - m.start()
        return m.group(0)[:start] + _clock(ts, t0) + m.group(0)[end:]
    return REFIRE_NOTE.sub(relative, reason)


def _predictions_table(tally: FindingTally, console: Console, t0: float, max_rows: int) -> None:
    grouped: dict[tuple[str, str], list[TallyEntry]] = {}
    for e in tally.entries.values():
        if e.what.startswith("predict "):
            grouped.setdefault((e.what[len("predict "):], e.rack or "-"), []).append(e)
    if not grouped:
        span = tally.last_ts - tally.first_ts
        warmup = THERMAL_PARAMS["warmup_s"]
        # (a short live run said "none" and nothing else: the forecasts had not started)
        console.print("predictions: none" + (
            f" (the thermal forecasts speak once a GPU has worked {warmup / 60:g} minutes, by default: "
            f"this run's telemetry covers {span / 60:.1f} min)" if math.isfinite(span) and span < warmup else ""))
        return
    # a group per row, with its first prediction; the reasons (a few hundred characters each) are
    # printed below at the console's full width, the first of each event kind: in a column they
    # folded into twenty lines a row on an 80-column terminal, and a kind's groups read alike
    columns = ("event", "rack", "entities", "first at", "first (ETA)")
    table = Table(title="Predictions by event and rack")
    for col in columns:
        table.add_column(col, overflow="fold", no_wrap=col in ("rack", "entities", "first at"))
    ordered = sorted(grouped.items(), key=lambda kv: min(e.first_ts for e in kv[1]))
    rows: list[tuple[str, str, str, str, str, str]] = []
    why: dict[str, TallyEntry] = {}  # each event kind's first shown prediction
    for (event, rack), entries in ordered[:max_rows]:
        first = min(entries, key=lambda e: e.first_ts)
        # a negative ETA is "no finite forecast" (``power_cap``'s -1), not a past one: "-0.0 min" read as due
        # and 0 is under way when first said (a congestion standing now), not "ETA 0.0 min"
        eta = ("" if first.eta_s != first.eta_s else "ETA unknown" if first.eta_s < 0
               else "under way" if first.eta_s == 0 else f"ETA {first.eta_s / 60:.1f} min")
        rows.append((event, rack, str(len(entries)), _clock(first.first_ts, t0), first.entity, eta))
        why.setdefault(event, first)
    # in the last column, the widest: in the rack column it widened that one by half the table's spare
    # room, and squeezed the entity names beside it
    more = [("...", "", "", "", _plural(len(ordered) - max_rows, 'more group'), "")] \
        if len(ordered) > max_rows else []
    # each row's first entity with its ETA on one line where the table fits the console so, else the
    # ETA on a line of its own under the name, each whole: in a column too narrow for both, an 80-column
    # terminal folded them where the edge fell ("node13/gpu1~su0-lea" then "f1 (ETA 166.1 min)")
    one_line = [(*r[:4], r[4] + (f" ({r[5]})" if r[5] else "")) for r in rows + more]
    widths = [max(cell_len(c) for c in cells) for cells in zip(columns, *one_line)]
    fits = sum(widths) + 3 * len(columns) + 1 <= console.width  # (a space each side and a border each)
    for (event, rack, n, at, entity, eta), line in zip(rows + more, one_line):
        table.add_row(event, Text(rack), n, at, Text(line[4] if fits or not eta else f"{entity}\n{eta}"))
    console.print(table)
    for event, first in why.items():
        console.print(Text.assemble("  ", (event, "bold"), f", first said of {first.entity} at "
                                    f"{_clock(first.first_ts, t0)}: ", first.reason))


# Consequences worth predicting, most telling first: the first of these names the fault's impact.
_IMPACT_ORDER = ("thermal_throttle_start", "link_down", "power_brake_start", "hbm_overheat_start", "xid",
                 "congestion_start", "job_slowdown_start", "power_cap_start")


_PREDICTED_BY = {"thermal_throttle_start": "thermal_throttle", "link_down": "link_down",
                 "power_brake_start": "power_brake", "hbm_overheat_start": "hbm_overheat",
                 "congestion_start": "congestion", "power_cap_start": "power_cap"}


def _truth_table(tally: FindingTally, events: Sequence[Event], console: Console, t0: float, max_rows: int) -> None:
    # clocks and the lead in the table, the entities on a numbered line per fault below it: with
    # the names in its cells an 80-column terminal folded "thermal_throttle node25/gpu7" into four
    # lines, and a link's name ("node26/gpu2~su0-leaf2#a") into three
    faults = [e for e in events if e.type == "fault_onset"]
    if not faults:  # a healthy run's events are its jobs: no table of nothing
        console.print("ground truth: no fault was injected")
        return
    table = Table(title="Ground truth (simulator) vs. what foreshock said")
    # the number and the clocks are held whole (a clock cut to "+0:01:4" read as 1 min 4 s), the
    # fault and the lead wrap: with every column held, an 80-column terminal (or a pipe) cut them all
    # evenly, the number's column to nothing and "impact at" to "impact a"
    for col in ("#", "fault", "onset", "impact at", "said at", "lead"):
        table.add_column(col, overflow="fold", no_wrap=col not in ("fault", "lead"))
    lines = []
    for n, fault in enumerate(faults[:max_rows], 1):
        consequences = [e for e in events if e.fault_id == fault.fault_id and e.type != "fault_onset"]
        impact = next((min(c, key=lambda e: e.time) for kind in _IMPACT_ORDER
                       if (c := [e for e in consequences if e.type == kind])), None)
        related = _related_entries(tally, fault, consequences)
        predictions = [e for e in related if e.what.startswith("predict ")]
        # the lead is measured by the prediction of the impact itself when there is one (any prediction
        # for an impact no detector predicts as such: a job's slowdown, an XID), else by what detected
        # it; a prediction of another event comes last, and leads nothing (_lead)
        wanted = {f"predict {_PREDICTED_BY[impact.type]}"} if impact and impact.type in _PREDICTED_BY \
            else {e.what for e in predictions}
        detections = [e for e in related if not e.what.startswith("predict ")]
        first = min([e for e in predictions if e.what in wanted] or detections or predictions,
                    key=lambda e: e.first_ts, default=None)  # (first_ts: its first raise since the onset)
        lead = _lead(impact, first, wanted)
        found = _fault_incident(tally, fault)
        incident = f"{found.root_kind} {found.root_entity}" if found else None
        table.add_row(str(n), Text(fault.fault_type), _clock(fault.time, t0),
                      _clock(impact.time, t0) if impact else "-", _clock(first.first_ts, t0) if first else "-",
                      lead)
        said = f"{first.what.removeprefix('predict ')} of {first.entity}" if first else "nothing"
        lines.append(Text.assemble(f"  {n} ", (f"{fault.fault_type} on {fault.entity}", "bold"), ": "
                                   + (f"first impact {impact.type.removesuffix('_start')} of {impact.entity}"
                                      if impact else "no impact yet")
                                   + f"; foreshock first said {said}"
                                   + (f"; incident {incident}" if incident else "; no incident")))
    if len(faults) > max_rows:
        table.add_row("...", _plural(len(faults) - max_rows, "more fault"), "", "", "", "")
    console.print(table)
    for line in lines:
        console.print(line)


def _lead(impact: Event | None, first: TallyEntry | None, wanted: set[str]) -> str:
    """How far ahead of the impact foreshock said so. Only a prediction of the impact's own event
    (``wanted``: its kind, or any for an impact no detector predicts as such) has a lead: an anomaly
    seen in the impact's own sample had read "0.0 min ahead"; it is a detection, said as one. A
    prediction of another event leads nothing ("not predicted"; the line under the table says what
    was said): a power-cap prediction beside a PSU's power-brake impact read "0.2 min late" (audit s65)."""
    if impact is None or first is None:
        return "-"
    lead_s = impact.time - first.first_ts
    if first.what.startswith("predict ") and first.what not in wanted:
        return "not predicted"
    if first.what.startswith("predict "):
        return f"{lead_s / 60:.1f} min ahead" if lead_s >= 0 else f"{-lead_s / 60:.1f} min late"
    if round(lead_s / 60, 1) == 0:  # as it would print: "0.0 min"
        return "detected at impact"
    return f"detected {abs(lead_s) / 60:.1f} min {'before' if lead_s > 0 else 'after'}"


INCIDENT_LEAD_S = 1800.0
"""How long before a fault's onset an incident rooted at its target may have opened and still be
the fault's own: the lead of a prediction (the thermal ones' horizon)."""


def _fault_incident(tally: FindingTally, fault: Event) -> Incident | None:
    """The incident that tells of ``fault``: among those still alive at its onset, first one rooted
    at its target (or an entity under it: a node's GPUs) and opened since its onset (less
    :data:`INCIDENT_LEAD_S`), then one rooted at or holding its target, else one rooted at or
    holding a place the fault names (the racks a cooling loop feeds, a GPU's node): a loop's fault
    had read "no incident" beside the incident rooted at the rack that loop feeds. The first opened.

    Holding the target is not enough to come first: a node's power failure an hour into a cooling
    loss on its loop was named after the loop's incident, opened half an hour before it."""
    detail = fault.detail if isinstance(fault.detail, dict) else {}
    places = (set(detail.get("racks") or ()) | {detail[k] for k in ("rack", "node") if isinstance(detail.get(k), str)}
              | _links_named(fault, ()))

    def opened(inc: Incident) -> float:
        return tally.incident_opened[inc.incident_id]

    def touches(inc: Incident, names: set[str]) -> bool:
        # a link fault's optics are under it; a degrading optic's link is a place it names, and the
        # optic at that link's other end is left out as :func:`_related_entries` leaves it
        return any(e in names or e.partition("/")[0] in names or _link_of(e) == fault.entity
                   for e in (inc.root_entity, *inc.members))

    alive = [i for i in tally.incidents.values() if i.ts >= fault.time]
    own = [i for i in alive if (i.root_entity == fault.entity
                                or i.root_entity.startswith((fault.entity + "/", fault.entity + "#")))
           and opened(i) >= fault.time - INCIDENT_LEAD_S]
    if own:
        return min(own, key=opened)
    for names in ({fault.entity}, places - {fault.entity}):
        found = [i for i in alive if names and touches(i, names)]
        if found:
            return min(found, key=opened)
    return None


def _related_entries(tally: FindingTally, fault: Event, consequences: Sequence[Event]) -> list[TallyEntry]:
    """Tally entries raised at or after the fault's onset, on its target, its racks, its link (an
    optic's), or any entity one of its consequences touched (a link's optics with it); each as a copy
    whose ``first_ts`` is its first raise since the onset (a fault that recurs on the same GPUs is
    told by their later raises).

    The optics detector names a degrading optic's link in its ``link_down`` prediction, a link with
    no rack: before the link was among the places, a degrading optic read "foreshock first said
    nothing" beside the very prediction about it, until the link went down."""
    names = {fault.entity} | {e.entity for e in consequences}
    detail = fault.detail if isinstance(fault.detail, dict) else {}
    racks = set(detail.get("racks") or ()) | ({detail["rack"]} if "rack" in detail else set())
    links = _links_named(fault, consequences)
    out = []
    for e in tally.entries.values():
        since = min((t for t in e.raised or (e.first_ts,) if t >= fault.time), default=None)
        if since is None:
            continue  # said before the fault began (and not raised again since): about something else
        # an optic's findings count where its link is named itself (a fault's or a consequence's
        # target): its link named only as the place of a degrading optic leaves the optic at the other
        # end out, a finding about a healthy optic that shares the link
        if (e.entity in names or e.entity in links or e.rack in racks or _link_of(e.entity) in names
                or any(e.entity.startswith(n + "/") for n in names)):
            out.append(e if since == e.first_ts else replace(e, first_ts=since))
    return out


def _link_of(entity: str) -> str | None:
    """The link an optic (``<link>#a``, ``<link>#b``) is an end of, as ``fault_scopes`` in
    detectors/evaluation.py maps it; None for anything else."""
    return entity.rsplit("#", 1)[0] if "#" in entity else None


def _links_named(fault: Event, consequences: Sequence[Event]) -> set[str]:
    """The links of the optics ``fault`` and its consequences name, and the link its onset's detail
    names (the simulator's ``optic_degradation`` says ``detail["link"]``): where the optics detector
    says its ``link_down``, and where the incident it opens may be rooted."""
    detail = fault.detail if isinstance(fault.detail, dict) else {}
    links = {link for e in (fault, *consequences) if (link := _link_of(e.entity)) is not None}
    return links | ({detail["link"]} if isinstance(detail.get("link"), str) else set())
