"""``foreshock incidents RECORDING``: run the detectors and the incident engine over a recording
and print the incidents as a readable timeline (and, when the recording has ground truth, how
they compare with the faults that were injected)."""

from __future__ import annotations

import json
import math
import sys

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.evaluation import read_ground_truth
from foreshock.detectors.incident_eval import score_incidents
from foreshock.detectors.incident_external import STAGE as EXTERNAL_STAGE
from foreshock.detectors.incident_external import read_events
from foreshock.detectors.incidents import IncidentEngine
from foreshock.exporters.console import JOB_SLOWED, minutes_away
from foreshock.exporters.jsonl import JsonlSink
from foreshock.findings import Anomaly, Finding, Incident, Prediction
from foreshock.health import PipelineHealth
from foreshock.recording import Recording, RecordingError
from foreshock.streams.embedded import EmbeddedPipeline

from .common import detector_names, detector_option, recording_origin


@click.command("incidents")
@click.argument("recording", type=click.Path(exists=True, file_okay=False))
@click.option("--external", "external_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help='External events as JSON lines {"node", "time", "type", "severity"} (scheduler, BMC), '
                   "grouped with the findings.")
@detector_option
@click.option("--findings", "findings_path", type=click.Path(dir_okay=False), default=None,
              help="Also write every finding (incidents included) to this JSON-lines file.")
@click.option("--all-updates", is_flag=True, help="Show every incident update, not only opens, root changes and ends.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def command(recording: str, external_path: str | None, detectors: str | None, findings_path: str | None,
            all_updates: bool, no_progress: bool) -> None:
    """Group a recording's findings into incidents and print their timeline.

    Prints a JSON line last: {"name": "incidents", "incidents", "raw_findings", "compression", ...}
    plus the incident scores against the recording's ground truth when it has faults.
    """
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        rec = Recording.open(recording)
        # the ground truth is read before the run, as `replay` reads it: a broken events file fails
        # now, not after a long run; events naming entities the topology lacks are set aside (and
        # named in a warning) as `evaluate` sets them aside; without an events file it has nothing
        # to say (no alarm is scored here, so none is a false one)
        truth = read_ground_truth(rec, warn_missing=False).events
    except RecordingError as exc:
        raise click.ClickException(str(exc)) from None
    topo = rec.topology
    health = PipelineHealth()
    engine = IncidentEngine(topo, health)
    names = detector_names(detectors)
    try:
        bank = DetectorBank.from_names(topo, names, processors=[engine])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if external_path:
        bad_before = sum(n for (stage, _), n in health.problems.items() if stage == EXTERNAL_STAGE)
        events = read_events(external_path, health)
        engine.add_external(events)
        bad = sum(n for (stage, _), n in health.problems.items() if stage == EXTERNAL_STAGE) - bad_before
        console.print(f"[dim]{len(events)} external event{'' if len(events) == 1 else 's'} read from "
                      f"{escape(str(external_path))}" + (f", {bad} bad line{'' if bad == 1 else 's'}" if bad else "")
                      + "[/dim]")
    findings: list[Finding] = []
    try:  # (the findings file as replay and watch write it: each line names its entity)
        sink = JsonlSink(findings_path, topo) if findings_path else None
    except OSError as exc:
        raise click.ClickException(f"--findings {findings_path}: {exc.strerror or exc}") from None
    start, end = (math.nan if rec.meta.get(k) is None else float(rec.meta[k])  # an empty recording stores null
                  for k in ("start", "end"))
    last = math.nan
    try:
        with Progress(TextColumn("[bold]incidents"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TextColumn("{task.fields[found]} incidents"), TimeElapsedColumn(),
                      console=Console(stderr=True), disable=no_progress, transient=True) as progress:
            task = progress.add_task("run", total=max(end - start, 1.0) if math.isfinite(end - start) else None, found=0)
            opened = 0
            # the recording runs through `replay`'s own pipeline (the engine as the bank's processor):
            # every kind, in the replay's order, through its input guard, board-swap handling and
            # end of stream. The engine ticks at the first frame of each window, so the order of the
            # kinds decides which findings a tick takes in: fed environment first (evaluate's order),
            # a GPU's findings missed their window's tick, and each incident opened 10 s (one tick)
            # later than in `replay` of the same recording
            pipeline = EmbeddedPipeline(topo, bank, health=health)
            pipeline.guard.stream_anchor = rec.stream_anchor  # (as `replay` sets it: a 1970 first tick is counted)
            for frame in rec.iter_frames():
                clean, out = pipeline.process_rows(frame)
                stamps = clean.ts[np.isfinite(clean.ts)]
                if len(stamps):
                    last = float(stamps.max()) if math.isnan(last) else max(last, float(stamps.max()))
                if out:
                    findings.extend(out)
                    opened += sum(1 for f in out if isinstance(f, Incident) and f.state == "open")
                    if sink is not None:
                        sink.observe_findings(out)
                if math.isfinite(start) and math.isfinite(last):
                    progress.update(task, completed=last - start, found=opened)
            # what the engine holds due at the end (counting external events dated after the
            # telemetry as problems), told at the engine's latest time, as `replay` tells it
            tail = pipeline.end_stream()
            findings.extend(tail)
            if sink is not None:
                sink.observe_findings(tail)
    except RecordingError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if sink is not None:
            sink.close()
    if external_path:
        late = sum(1 for e in events if not e.time <= last)
        if late:
            console.print(f"[yellow]{late} external events dated after the recording's last telemetry: "
                          "not grouped[/yellow]")
    # the clocks count from the simulation's start, where `simulate` counts each fault's onset from
    origin = recording_origin(rec.meta)
    t0 = origin.ts if origin is not None else min((f.ts for f in findings), default=0.0)
    render_timeline(console, findings, t0, all_updates, origin.what if origin is not None else "the first finding")
    summary = render_summary(console, findings, t0)
    if any(e.type == "fault_onset" for e in truth):
        # the recording's fault list holds how long each fault lasted in the end (a board swap
        # cures the old board's faults early), as `foreshock evaluate` scores (incident_eval.score_run)
        durations = {str(f.get("id")): float(f["duration_s"]) for f in rec.meta.get("faults", []) or []
                     if isinstance(f, dict) and isinstance(f.get("duration_s"), (int, float))}
        report = score_incidents(findings, truth, topo, duration_of=durations)
        render_truth(console, report, t0)
        summary.update({k: v for k, v in report.items() if k != "by_fault"})
    if health.total_problems():
        summary["input_problems"] = health.total_problems()
    click.echo(json.dumps({"name": "incidents", **summary}))


def _clock(ts: float, t0: float) -> str:
    s = int(round(ts - t0))
    sign = "-" if s < 0 else "+"
    s = abs(s)
    return f"{sign}{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _jobs(inc: Incident) -> str:
    slowed = [j for j in inc.jobs if j[1] >= JOB_SLOWED]  # (the summary's threshold: under 1 % is noise)
    if not slowed:
        return ""
    worst = max(slowed, key=lambda j: j[1])
    more = f" (+{len(slowed) - 1} jobs)" if len(slowed) > 1 else ""
    return f"{worst[0]} ×{worst[1]:.2f}{more}, {inc.gpu_hours_at_risk_per_hour:.1f} GPU-h/h at risk"


def _next(inc: Incident, n: int = 3) -> str:
    if not inc.predicted_members:
        return ""
    shown = ", ".join(f"{e}" + (" now" if eta == 0 else f" in {minutes_away(eta)}" if eta > 0 else "")
                      for e, eta in inc.predicted_members[:n])
    more = len(inc.predicted_members) - n
    return shown + (f" … +{more}" if more > 0 else "")


def render_timeline(console: Console, findings: list[Finding], t0: float, all_updates: bool = False,
                    t0_is: str | None = None) -> None:
    """One line per incident event: opened, grew, re-rooted, settled, resolved; ``t0_is`` says what
    ``t0``, which the clocks here and in the tables below count from, is ("the simulation's start")."""
    console.rule("[bold]incident timeline")
    if t0_is:
        console.print(f"[dim]times (+h:mm:ss) count from {escape(t0_is)}[/dim]")
    seen: dict[str, Incident] = {}
    opened: dict[str, float] = {}
    for f in findings:
        if not isinstance(f, Incident):
            continue
        prev = seen.get(f.incident_id)
        seen[f.incident_id] = f
        opened.setdefault(f.incident_id, f.ts)
        # names and reasons come from the user's topology: printed literally, never read as markup
        root = escape(f"{f.root_kind} {f.root_entity}") if f.root_entity else "-"
        reason = escape(f.reason)
        if prev is None:
            console.print(f"[bold]{_clock(f.ts, t0)}[/bold] [red]{f.incident_id} OPEN[/red] root {root} "
                          f"[dim]({escape(f.fault_hint)})[/dim] — {reason}")
            console.print(f"            {len(f.members)} member(s): {escape(', '.join(f.members[:4]))}"
                          + (" …" if len(f.members) > 4 else ""))
        elif f.state == "resolved":
            console.print(f"[bold]{_clock(f.ts, t0)}[/bold] [green]{f.incident_id} resolved[/green] "
                          f"{_clock(f.ts, opened[f.incident_id])[1:]} after it opened; {f.findings} findings — {reason}")
            continue
        elif prev.state == "resolved":
            console.print(f"[bold]{_clock(f.ts, t0)}[/bold] [red]{f.incident_id} reopened[/red]: {len(f.members)} members")
        elif prev.root_entity != f.root_entity:
            console.print(f"[bold]{_clock(f.ts, t0)}[/bold] [yellow]{f.incident_id} re-rooted[/yellow] "
                          f"{escape(f'{prev.root_kind} {prev.root_entity}')} -> {root} — {reason}")
        elif len(f.members) != len(prev.members) or all_updates:
            console.print(f"[bold]{_clock(f.ts, t0)}[/bold] {f.incident_id} {f.state}: {len(f.members)} members "
                          f"(+{len(f.members) - len(prev.members)}), {f.findings} findings")
        elif f.state != prev.state:
            console.print(f"[bold]{_clock(f.ts, t0)}[/bold] {f.incident_id} {f.state}")
        extra = [x for x in (_next(f), _jobs(f)) if x]
        if extra and (prev is None or all_updates or len(f.members) != len(prev.members)):
            console.print("            " + escape(" · ".join(
                (["next: " + extra[0]] if _next(f) else []) + ([_jobs(f)] if _jobs(f) else []))))


def render_summary(console: Console, findings: list[Finding], t0: float) -> dict:  # type: ignore[type-arg]
    last: dict[str, Incident] = {}
    first: dict[str, float] = {}
    for f in findings:
        if isinstance(f, Incident):
            last[f.incident_id] = f
            first.setdefault(f.incident_id, f.ts)
    raw = sum(1 for f in findings if isinstance(f, (Anomaly, Prediction)))
    table = Table(title="Incidents")
    for col in ("incident", "opened", "state", "root", "cause", "members", "findings", "jobs"):
        table.add_column(col, overflow="fold")
    for iid, inc in last.items():
        table.add_row(escape(iid), _clock(first[iid], t0), inc.state, escape(f"{inc.root_kind} {inc.root_entity}"),
                      escape(inc.fault_hint), str(len(inc.members)), str(inc.findings), escape(_jobs(inc)) or "-")
    console.print(table)
    compression = round(raw / len(last), 1) if last else None
    console.print(f"{raw:,} raw findings -> {len(last)} incidents"
                  + (f" ({compression}× compression)" if compression else ""))
    return {"incidents_total": len(last), "raw_findings": raw, "compression": compression}


def render_truth(console: Console, report: dict, t0: float) -> None:  # type: ignore[type-arg]
    table = Table(title="Ground truth: injected faults vs incidents")
    for col in ("fault", "type", "target", "onset", "incident", "root found", "right", "member recall", "onset→incident"):
        table.add_column(col, overflow="fold")
    for row in report["by_fault"]:
        delay = row["onset_to_incident_s"]
        table.add_row(escape(row["fault"]), escape(row["type"]), escape(row["target"]), _clock(row["onset"], t0),
                      _fault_incidents(row), escape(row["root"] or "-"),
                      "yes" if row["root_correct"] else "[red]no[/red]",
                      "-" if row["member_recall"] is None else f"{row['member_recall']:.2f}",
                      "-" if delay is None else f"{delay / 60:.1f} min")
    console.print(table)
    console.print(truth_line(report))


def _fault_incidents(row: dict) -> str:  # type: ignore[type-arg]
    """A fault's incidents, one that names it only in a re-fire note (holding too few of its members
    to claim it) marked: unmarked, inc-8 listed under two faults beside "0 incidents merging"."""
    noted = set(row.get("noted_only", ()))
    return ", ".join(f"{i} (re-fire note)" if i in noted else i for i in row["incidents"]) or "-"


def truth_line(report: dict) -> str:  # type: ignore[type-arg]
    """The scores of ``report`` (``score_incidents``) in one sentence: counts, not ratios ("1.0 of 12"
    read as one fault), and a dash for a score with nothing to score (no fault had consequences:
    printed raw, it read "member recall None" and "right for - faults")."""
    n, accuracy = report["faults"], report["root_cause_accuracy"]
    total = report.get("faults_total", n)
    if n and accuracy is not None:
        root = f"root cause right for {round(accuracy * n)} of {n} faults with consequences"
    else:  # (a fault with no consequence, such as a TIM wearing without throttling yet, is not scored)
        root = "root cause not scored: 0 faults with consequences"
    merged = report["merged_independent_faults"]
    share = report.get("claim_share")
    # (what the count counts: a fault listed under an incident through a re-fire note, or holding
    # few of its members, is no merge, and the table lists such)
    rule = (f" (a fault counts when it holds at least {share:.0%} of an incident's members, not through a "
            "re-fire note)") if isinstance(share, (int, float)) else ""
    return (f"{root} ({total} injected); member recall {_score(report['member_recall'])}, precision "
            f"{_score(report['member_precision'])}; {merged} incident{'' if merged == 1 else 's'} merging "
            f"independent faults{rule}")


def _score(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"
