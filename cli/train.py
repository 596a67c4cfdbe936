"""``foreshock train``: fit the scikit-learn baseline on simulator recordings."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from foreshock.detectors.baselines import ModelWriteError, learnable_events, load_model, model_telemetry
from foreshock.detectors.evaluation import EVENT_KINDS
from foreshock.detectors.train import CALIBRATION_PRECISION, train_and_save
from foreshock.recording import RecordingError

from .common import create_folder, parse_telemetry


def _shown(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


@click.command("train")
@click.argument("recordings", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="Model file to write (a skops archive with the feature list and version).")
@click.option("--events", default="thermal_throttle,power_cap", show_default=True,
              help=f"Events to learn, one classifier each ({', '.join(learnable_events())}: a GPU's events; "
                   "the classifiers read GPU telemetry).")
@click.option("--negatives", default=0.05, show_default=True, type=click.FloatRange(0.0, 1.0, min_open=True),
              help="Share of negative samples kept.")
@click.option("--telemetry", default=None,
              help="Entity kinds fed to the feature stream, comma-separated (default: all the recordings have), "
                   "as `evaluate --telemetry`: a model to be served GPU telemetry alone (dcgm-exporter) is "
                   "trained with `--telemetry gpu,job`. Recorded in the model; `evaluate` refuses it where "
                   "it would be fed otherwise.")
@click.option("--calibrate", "calibration", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="A recording the model is not trained on, to choose each alarm threshold on (repeatable: "
                   "the level must hold on each): the level of best recall at precision >= --precision, "
                   "scored as `evaluate` scores (default: the threshold of best per-sample F1 on held-out GPUs "
                   "of the training recordings).")
@click.option("--precision", "target_precision", default=CALIBRATION_PRECISION, show_default=True,
              type=click.FloatRange(0.0, 1.0, min_open=True), help="The precision --calibrate holds the alarms to.")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seed for the negative-sample draw and the classifiers: same seed, same model.")
def command(recordings: tuple[str, ...], out_path: str, events: str, negatives: float, telemetry: str | None,
            calibration: tuple[str, ...], target_precision: float, seed: int) -> None:
    """Train "EVENT within its horizon" classifiers on RECORDINGS (use seeds you do not evaluate on)."""
    chosen = [e.strip() for e in events.split(",") if e.strip()]
    learnable = learnable_events()
    if not chosen:  # a model of no classifiers, which evaluate would refuse
        raise click.UsageError(f"--events names no event to learn ({events!r}); known: {', '.join(learnable)}")
    unknown = [e for e in chosen if e not in EVENT_KINDS]
    if unknown:
        raise click.UsageError(f"--events: unknown events {unknown}; known: {', '.join(learnable)}")
    # a link's event (link_down) has no GPU feature row to be labelled on: refused here, not mid-run
    not_gpu = [e for e in chosen if e not in learnable]
    if not_gpu:
        raise click.UsageError(f"--events: cannot learn {', '.join(not_gpu)} (not a GPU's event); the classifiers "
                               f"read GPU telemetry and learn a GPU's events: {', '.join(learnable)}")
    fed = parse_telemetry(telemetry)
    if fed is not None and "gpu" not in fed:  # no feature row to learn from: refused before any is read
        raise click.UsageError(f"--telemetry {telemetry}: the classifiers read GPU telemetry (their features are "
                               "a GPU's); name gpu in --telemetry (e.g. gpu,job)")
    create_folder(Path(out_path).parent, "the folder")  # for the model
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("features", total=float(len(recordings) + len(calibration)))
        done: dict[str, float] = {}

        def progress(path: str, frac: float) -> None:
            done[path] = frac
            stage = "calibrate" if path in calibration else "features"
            bar.update(task, completed=sum(done.values()), description=f"{stage} {path}")

        try:
            path, summary = train_and_save(recordings, out_path, chosen, negatives, seed, progress, fed, calibration,
                                           target_precision)
        except (RecordingError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        except ModelWriteError as exc:  # the folder was writable up front: the disk filled, say
            raise click.ClickException(str(exc)) from None
    inputs = model_telemetry(path, load_model(path))  # as recorded: what evaluate will hold it to
    for event, s in summary.items():
        c = s.get("calibrated")
        said = ("" if c is None else f" (on {', '.join(calibration)}: episode precision {_shown(c['precision'])}"
                f"{' at worst' if len(calibration) > 1 else ''}, recall "
                f"{_shown(c['recall'])}" + ("" if c["reached"] else f"; never precision >= {target_precision:g}, "
                                            "the most precise level") + ")")
        console.print(f"{event}: {s['samples']:,} samples, {s['positives']:,} positive, "
                      f"horizon {s['horizon_s']:.0f} s, alarm at P >= {s['threshold']:.4g}{said}")
    if not calibration:  # the F1 cut counts samples: on seed 21 it alarmed at episode precision 0.37
        console.print("[yellow]alarm thresholds: best per-sample F1 on held-out GPUs, which counts samples, not "
                      "warned episodes; --calibrate REC (a recording it was not trained on) holds them to an "
                      "episode precision[/]")
    console.print(f"features from {', '.join(inputs or ())} telemetry"
                  + ("" if inputs and "rack" in inputs else " (inlets from the GPUs' proxy: serve it `--telemetry gpu,job`)"))
    click.echo(json.dumps({"model": str(path), "events": summary, "telemetry": list(inputs or ())},
                          separators=(",", ":")))
