"""``foreshock evaluate``: score detectors against a recording's ground truth, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from foreshock.detectors import evaluation
from foreshock.detectors.baselines import ModelFileError, load_model, model_telemetry, telemetry_mismatch
from foreshock.detectors.registry import create
from foreshock.detectors.train import fed_kinds
from foreshock.recording import Recording, RecordingError
from foreshock.topology import Topology

from .common import create_folder, param_option, parse_params, parse_telemetry

DEFAULT_SETS = "foreshock,river,sklearn,threshold"


@click.command("evaluate")
@click.argument("recording", type=click.Path(exists=True, file_okay=False))
@click.option("--detectors", "sets", default=DEFAULT_SETS, show_default=True,
              help=f"Comma-separated detector sets: {', '.join(evaluation.DETECTOR_SETS)}.")
@click.option("--report", "report_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for report.json and the PNG plots.")
@click.option("--model", "model_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Model file for the sklearn set (written by `foreshock train`).")
@click.option("--events", default=None, help="Event kinds to score (default: all known).")
@click.option("--plots/--no-plots", default=True, show_default=True,
              help="Also write PNG plots (a few GPUs' temperature, predicted ETA and throttles; lead times).")
@click.option("--telemetry", default=None,
              help="Entity kinds fed to the detectors and the incident engine, comma-separated (default: all "
                   "the recording has). `--telemetry gpu,job` scores what a GPU exporter alone (dcgm-exporter) "
                   "gives: no rack inlet or coolant flow, no node fans or PSUs, no fabric.")
@click.option("--by-fault/--no-by-fault", "by_fault", default=True, show_default=True,
              help="Show the per-fault rows in the printed table (report.json always has them).")
@param_option
@click.pass_context
def command(ctx: click.Context, recording: str, sets: str, report_dir: str, model_path: str | None,
            events: str | None, plots: bool, telemetry: str | None, by_fault: bool, params: tuple[str, ...]) -> None:
    """Run detector sets over RECORDING and score their predictions against events.jsonl.

    Beside each baseline that alarms on a score threshold, the table shows its best recall at
    the foreshock set's precision (threshold swept offline over its logged scores); power-cap
    rows add recall by what precedes the onset — the target is judged on ``steady_load``."""
    console = Console(stderr=True)
    chosen = [s.strip() for s in sets.split(",") if s.strip()]
    if not chosen:  # (an empty bank read no sample, and the report folder had been emptied first)
        raise click.UsageError(f"--detectors names no set; known: {sorted(evaluation.DETECTOR_SETS)}")
    unknown = [s for s in chosen if s not in evaluation.DETECTOR_SETS]
    if unknown:
        raise click.UsageError(f"unknown detector sets {unknown}; known: {sorted(evaluation.DETECTOR_SETS)}")
    if model_path is not None and "sklearn" not in chosen:  # refused, like a --param for no set: it would do nothing
        raise click.UsageError("--model is only used by the sklearn set: add sklearn to --detectors, or drop --model")
    asked = [k.strip() for k in events.split(",") if k.strip()] if events else list(evaluation.EVENT_KINDS)
    # congestion and incidents are report sections, scored on every run: naming them is allowed
    bad = [k for k in asked if k not in evaluation.EVENT_KINDS and k not in evaluation.SECTION_SCORERS]
    if bad:
        raise click.UsageError(f"unknown event kinds {bad}; known: {sorted(evaluation.EVENT_KINDS)}, "
                               f"and the report sections {sorted(evaluation.SECTION_SCORERS)}")
    kinds = [k for k in asked if k in evaluation.EVENT_KINDS]
    fed = parse_telemetry(telemetry)
    detector_params = parse_params(params)  # e.g. thermal.flow_plan_floor=0.1, for every set's detector of that name
    in_sets = {name for s in chosen for name in evaluation.set_members(s)}
    unused = sorted(set(detector_params) - in_sets)
    if unused:
        raise click.UsageError(f"--param for detectors in none of the sets: {', '.join(unused)}")
    bank_params: dict[str, dict[str, Any]] = {name: dict(values) for name, values in detector_params.items()}
    model_events: list[str] = []  # the event kinds the sklearn set's model predicts
    model_inputs: tuple[str, ...] | None = None  # the entity kinds it was trained on (None: its file does not say)
    if "sklearn" in chosen:
        if model_path is None:
            if ctx.get_parameter_source("sets") == click.core.ParameterSource.DEFAULT:
                console.print("[yellow]sklearn set skipped: no --model (train one with `foreshock train`)[/]")
                chosen.remove("sklearn")
            else:
                raise click.UsageError("the sklearn set needs --model (train one with `foreshock train`)")
        else:
            # the loader's checks (a tampered or foreign file is refused) before anything is read or written;
            # the loader keeps what it read, so the detectors built later do not read the file again
            try:
                doc = load_model(model_path)
                model_events = list(doc["events"])
                model_inputs = model_telemetry(model_path, doc)
            except ModelFileError as exc:
                raise click.ClickException(f"--model {exc}") from None
            if model_inputs is None:
                console.print(f"[yellow]--model {escape(model_path)} does not say which telemetry it was trained on "
                              "(written before `foreshock train` recorded it, or its meta edited): its inputs are "
                              "not checked against this run's[/yellow]")
            bank_params.setdefault("sklearn", {})["model_path"] = model_path
    try:
        rec = Recording.open(recording)
    except RecordingError as exc:
        raise click.ClickException(str(exc)) from None
    run = {name for s in chosen for name in evaluation.set_members(s)}  # (sklearn dropped above: not run)
    if "sklearn" in run and model_path is not None:
        try:
            served = fed_kinds(rec, fed)  # (reads the rack frames: whether they give an inlet)
        except RecordingError as exc:  # a damaged file found while reading
            raise click.ClickException(str(exc)) from None
        # rack frames fed and yet no rack inlet: those racks give none (PDU power alone), said so
        unread = "rack" in rec.kinds() and (fed is None or "rack" in fed) and "rack" not in served
        mismatch = telemetry_mismatch(model_path, model_inputs, served, unread)
        if mismatch:
            raise click.ClickException(f"--model {mismatch}")
    check_params(rec.topology, {name: detector_params[name] for name in detector_params if name in run}, bank_params)
    create_folder(Path(report_dir), "the report folder")
    evaluation.clear_report(report_dir)  # (an earlier run's report and plots, of this recording or another)
    span = (rec.meta.get("end") or 0) - (rec.meta.get("start") or 0)
    with Progress(TextColumn("evaluate"), BarColumn(), TextColumn("{task.percentage:>3.0f}% of telemetry time"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("run", total=max(span, 1.0))
        try:
            result = evaluation.run_recording(
                rec, chosen, params=bank_params, trace_gpus=evaluation.pick_trace_gpus(rec) if plots else (),
                progress=lambda done, total: bar.update(task, completed=done), telemetry=fed)
        except RecordingError as exc:  # a damaged file found while reading
            raise click.ClickException(str(exc)) from None
    if not result.samples:
        # a report of nothing (every figure empty, exit 0) read as "evaluated, predicted nothing"
        raise click.ClickException(no_samples_message(recording, fed, result))
    report = evaluation.score(result, kinds)
    report["meta"]["params"] = detector_params
    if "sklearn" in chosen:
        unpredicted = leave_out_unpredicted(report, kinds, model_events)
        if unpredicted:
            console.print(f"[yellow]sklearn set: its model predicts no {', '.join(unpredicted)}: not scored "
                          "there (not a miss)[/]")
    try:  # (the folder took a file up front: the disk filled, or it was made read-only, since)
        path = evaluation.write_report(report, report_dir)
        written = evaluation.write_plots(result, report, report_dir) if plots else []
    except OSError as exc:
        raise click.ClickException(f"cannot write the report to {report_dir}: {exc.strerror or exc}") from None
    Console().print(evaluation.render_table(report, by_fault=by_fault))
    sections = section_summaries(report)
    if sections:
        Console().print(render_sections(sections, report))
    # the lead plot is left out where it would be empty: said, or it read as a plot not asked for
    drawn = [k for k in evaluation.LEAD_PLOT_KINDS if any(k in per for per in report["detectors"].values())]
    leads_skipped = plots and drawn and not any(p.name == "lead_times.png" for p in written)
    console.print(f"{samples_text(rec, result)} in {result.wall_s:.1f} s"
                  + (f" (telemetry fed: {', '.join(result.telemetry)})" if fed is not None else "")
                  + f"; report: {path}"
                  + (f"; plots: {', '.join(p.name for p in written)}" if written else "")
                  + (f"; no lead_times.png: no {' or '.join(drawn)} episode was predicted" if leads_skipped else ""))
    summary = {s: {k: {m: v[m] for m in ("episodes", "recall", "precision", "lead_median_s")}
                   | ({"matched_recall": v["matched"]["recall"]} if "matched" in v else {})
                   | ({f"recall_{evaluation.PREDICTABLE_ONSET}": v["by_onset"][evaluation.PREDICTABLE_ONSET]["recall"]}
                      if "by_onset" in v else {})
                   for k, v in per.items()} for s, per in report["detectors"].items()}
    click.echo(json.dumps({"report": str(Path(path)), "detectors": summary} | sections, separators=(",", ":")))


ENGINE_USES = {"job": " (step times: its jobs' slowdown)", "link": " (link load: where a link's traffic moved)"}
"""What the incident engine reads a kind's rows for (``IncidentEngine.frame_fields``), said where
only the engine is fed them (:func:`samples_text`)."""


def samples_text(rec: Recording, result: evaluation.RunResult) -> str:
    """What the run counts as samples, beside what the recording holds when they differ: replay and
    recording.json count every row (263,520), the run those the detectors were fed (260,640, no job
    rows), and the two figures for one recording had read as a contradiction."""
    text = f"{result.samples:,} samples fed to the detectors"
    rows = rec.meta.get("rows")
    if not isinstance(rows, dict) or not result.detector_kinds:
        return text  # (no count of the recording's rows, or a result built without a run)
    recorded = sum(int(n) for n in rows.values())
    unfed = {k: int(n) for k, n in rows.items() if k not in result.detector_kinds and n}
    set_aside = recorded - sum(unfed.values()) - result.samples
    if recorded == result.samples or set_aside < 0:  # (a list lagging its parts: no sum to explain)
        return text
    # rows no detector reads that the incident engine does (job step times) are said as such: called
    # "not fed" they contradicted the "(telemetry fed: gpu, job)" of the same line
    engine = {k: n for k, n in unfed.items() if k in result.incident_telemetry}
    unread = {k: n for k, n in unfed.items() if k not in engine}
    why = [f"{k} {n:,} to the incident engine only{ENGINE_USES.get(k, '')}" for k, n in engine.items()] \
        + ([f"not fed: {', '.join(f'{k} {n:,}' for k, n in unread.items())}"] if unread else []) \
        + ([f"set aside by the input guard: {set_aside:,}"] if set_aside else [])
    return f"{text} (of {recorded:,} recorded; {'; '.join(why)})"


def no_samples_message(recording: str, fed: list[str] | None, result: evaluation.RunResult) -> str:
    """Why a run saw no sample: the recording holds none (of the kinds fed), or the input guard set
    every row aside."""
    if result.health.problems:
        reasons = ", ".join(f"{reason} ({n:,})" for (_, reason), n in sorted(result.health.problems.items()))
        why = f"the input guard let no row through ({reasons})"
    else:
        why = ("the recording holds no samples" + (f" of the kinds fed ({', '.join(fed)})" if fed is not None else "")
               + " (a recorder stopped before it closed its first part leaves such a recording)")
    return f"{recording}: nothing to evaluate — {why}; no report written"


def leave_out_unpredicted(report: dict[str, Any], kinds: list[str], model_events: list[str]) -> list[str]:
    """Drop from the sklearn set's scores the kinds its model has no classifier for (scored, they
    would read as predicted and missed: recall 0), and name them in ``meta["not_predicted"]``."""
    unpredicted = [k for k in kinds if k not in model_events]
    for kind in unpredicted:
        report["detectors"].get("sklearn", {}).pop(kind, None)
    report["meta"]["not_predicted"] = {"sklearn": unpredicted}
    return unpredicted


def check_params(topology: Topology, given: dict[str, dict[str, Any]],
                 bank_params: dict[str, dict[str, Any]]) -> None:
    """Build each detector a ``--param`` names, as the run will, so that one it refuses (unknown
    name, bad value) is a usage error before the run, and any error of the run itself keeps its
    traceback. ``bank_params`` holds what the run passes (``given`` and the sklearn model)."""
    for name in given:
        try:
            create(name, topology, **bank_params[name])
        except (ValueError, TypeError) as exc:
            raise click.UsageError(str(exc)) from None


# the headline figures of each report section (report.json has them all)
SECTION_FIGURES = {
    "congestion": ("rerouted_episodes", "found", "recall", "cause_named", "delay_samples_max", "false_alarms"),
    "incidents": ("faults", "root_cause_accuracy", "member_recall", "member_precision",
                  "onset_to_incident_median_s", "compression", "merged_independent_faults"),
    "cooling": ("tim_flagged", "tim_lead_before_throttle_median_s", "tim_not_judged", "fan_flagged",
                "fan_lead_before_throttle_median_s", "fan_not_judged", "flagged_entities", "unexplained_flags"),
    "straggler": ("slowdowns", "slowdowns_not_judged", "pacer_flagged", "recall", "flagged_ahead", "flagged_gpus",
                  "unexplained_flags"),
}


def section_summaries(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{section: {detector set or "foreshock": {figure: value}}}`` for the sections present."""
    out: dict[str, dict[str, Any]] = {}
    for name, figures in SECTION_FIGURES.items():
        section = report.get(name)
        if not isinstance(section, dict) or "skipped" in section:
            continue
        per_set = section.get("detectors", {"foreshock": section})  # incidents: the foreshock set's
        out[name] = {det: {k: m.get(k) for k in figures} for det, m in per_set.items()}
    return out


def render_sections(sections: dict[str, dict[str, Any]], report: dict[str, Any] | None = None) -> Any:
    """The sections' figures, a row per section and detector set. ``report`` gives each section's
    ``window_s``, named where a figure's faults were not all judged."""
    from rich.table import Table

    table = Table(title="report sections (congestion caused by rerouting; incidents; cooling degradation "
                        "flagged before the throttle; slowed jobs' pacers named)")
    for col in ("section", "detector", "figures"):
        table.add_column(col)
    for name, per_set in sections.items():
        section = (report or {}).get(name)
        window = section.get("window_s") if isinstance(section, dict) else None
        for det, figures in per_set.items():
            table.add_row(name, det, ", ".join(figure_texts(figures, window)))
    return table


def figure_texts(figures: dict[str, Any], window_s: float | None = None) -> list[str]:
    """Each figure as "name value". A count of flagged faults ("tim_flagged 0 of 0") counts the
    judged ones, and says so with those not judged beside it (``X_not_judged``, folded in): a TIM
    fault injected in the recording's last hour read "0 of 0", as if there were none. A count judged
    by name (the straggler's ``slowdowns``) takes its ``slowdowns_not_judged`` the same way."""
    out = []
    for k, v in figures.items():
        if k.endswith("_not_judged") and (k.replace("_not_judged", "_flagged") in figures
                                          or k.removesuffix("_not_judged") in figures):
            continue  # said with its count of flagged (or judged) faults
        text = f"{k} {'—' if v is None else v}"
        left = figures.get(k.replace("_flagged", "_not_judged")) if k.endswith("_flagged") \
            else figures.get(f"{k}_not_judged")
        if left is not None:
            text += " judged" + (f" ({left} not judged: onset within {span_text(window_s)} of the recording's end)"
                                 if left else "")
        out.append(text)
    return out


def span_text(seconds: float | None) -> str:
    """A judging window as a user reads it: "1 h", "10 min", "90 s"."""
    if seconds is None:
        return "the judging window"
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"
