"""``foreshock nab``: run a detector over the Numenta Anomaly Benchmark and score it exactly as
NAB does (windows, probation, scaled sigmoid, three profiles, one threshold per profile
optimised over the corpus, normalised so the null detector is 0 and a perfect one 100)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from foreshock.detectors.nab import NabScorer, load_corpus, write_results
from foreshock.detectors.nab_detectors import NAB_DETECTORS, run_nab_detector
from foreshock.health import PipelineHealth


@click.command("nab")
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("labels", type=click.Path(exists=True, dir_okay=False))
@click.option("--detector", default="foreshock", show_default=True, type=click.Choice(sorted(NAB_DETECTORS)),
              help="Which detector to run on every file.")
@click.option("--results", "results_dir", type=click.Path(file_okay=False), default=None,
              help="Also write NAB results CSVs (timestamp,value,anomaly_score,label) under DIR/<detector>/.")
def command(data_dir: str, labels: str, detector: str, results_dir: str | None) -> None:
    """Score DETECTOR on every CSV under DATA_DIR against the windows in LABELS (NAB JSON)."""
    console = Console(stderr=True)
    health = PipelineHealth()
    try:
        corpus = load_corpus(data_dir, labels, health)
        scorer = NabScorer(corpus)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    scores = {}
    with Progress(TextColumn("[bold]nab[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task(detector, total=len(corpus))
        for series in corpus:
            progress.update(task, description=f"{detector}: {series.name}")
            scores[series.name] = run_nab_detector(detector, series.seconds, series.values)
            if results_dir is not None:
                # The name is the file's path under DATA_DIR; NAB's results tree holds the file name.
                out = Path(results_dir) / detector / series.category / f"{detector}_{Path(series.name).name}"
                write_results(out, series, scores[series.name])
            progress.advance(task)
    results = scorer.score(scores)

    # Piped output (logs, CI) is 80 columns for rich: a borderless table with the score next to
    # the profile fits there whole, where a boxed one cut both to "reward_low_…" and "75.…".
    table = Table(title=f"NAB — {detector} on {len(corpus)} files, {scorer.n_windows} windows "
                        f"({sum(len(s.values) for s in corpus):,} rows)", box=box.SIMPLE_HEAD,
                  caption="hit: windows detected; FPs: rows detected outside windows")
    for col in ("profile", "score", "threshold", "raw", "null", "perfect", "hit", "FPs"):
        table.add_column(col, justify="left" if col == "profile" else "right", no_wrap=True)
    for key, r in results.items():
        # No labelled window anywhere (NAB's artificialNoAnomaly): only the raw score means anything.
        score = "n/a" if r.normalized is None else f"{r.normalized:.2f}"
        table.add_row(key, f"[bold]{score}[/]", f"{r.threshold:.4f}", f"{r.raw:.3f}", f"{r.null:.1f}",
                      f"{r.perfect:.1f}", f"{r.windows_hit}/{r.windows}", str(r.false_positives))
    out_console = Console()
    out_console.print(table)
    if health.problems:
        quirks = ", ".join(f"{reason} {n}" for (_, reason), n in sorted(health.problems.items()))
        out_console.print(f"data quirks counted (scored as NAB scores them): {quirks}")
    if results_dir is not None:
        out_console.print(f"results CSVs written under {Path(results_dir) / detector}")
    if any(r.normalized is None for r in results.values()):
        out_console.print("no labelled window scored: the normalised score is n/a (perfect and null are both 0); "
                          "compare raw scores")
    click.echo(json.dumps({k: None if r.normalized is None else round(r.normalized, 4) for k, r in results.items()}))
