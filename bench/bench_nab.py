"""NAB scores of foreshock's detectors on realKnownCause (the 7 real files with known causes),
thresholds optimised and scores normalised over that subset, exactly as NAB's own run does.

Prints every detector's three profile scores next to the published ones, and — last — the
JSON line of the shipped combination (``foreshock``). Also times the detector (rows/s over the
corpus, median of ``--runs``) since NAB is a replay of real telemetry.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import emit, repeat  # noqa: E402

from dataclasses import replace  # noqa: E402

import numpy as np  # noqa: E402

from foreshock.detectors.nab import NabScorer, NabSeries, ProfileResult, load_corpus  # noqa: E402
from foreshock.detectors.nab_detectors import NAB_DETECTORS, NabParams, run_nab_detector  # noqa: E402
from foreshock.health import PipelineHealth  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "nab"

# Published standard-profile scores on realKnownCause (issue 9 / NAB scoreboard per category).
PUBLISHED_REALKNOWNCAUSE_STANDARD = {"ARTime": 66.45, "Numenta HTM": 57.8}
# Published whole-corpus scores (standard profile; FACTS.md), for orientation only.
PUBLISHED_CORPUS_STANDARD = {"ARTime": 74.9, "Numenta HTM": 70.5, "CAD OSE": 69.9, "KNN CAD": 58.0,
                             "Relative Entropy": 54.6, "Random Cut Forest": 51.7, "Twitter ADVec": 47.1,
                             "Windowed Gaussian": 39.6, "Random": 11.0}


NEIGHBOURS: dict[str, list[float]] = {
    "hold_s": [86400.0, 3 * 86400.0, 4 * 86400.0],
    "seasonal_smooth": [6.0, 9.0, 18.0],
    "seasonal_scale": [10.0, 12.0, 17.0, 20.0],
    "z_scale": [6.0, 10.0],
    "z_alpha": [0.005, 0.02],
    "range_scale": [0.01, 0.03],
    "seasonal_alpha": [0.001, 0.005],
    "seasonal_min_gain": [0.0, 1.5],
}
"""One parameter changed at a time around the shipped set, to show how sharp the optimum is."""


def pct(result: ProfileResult) -> float:
    """A profile's normalised score: defined here, the corpus holds labelled windows."""
    value = result.normalized
    if value is None:
        raise SystemExit("NAB bench: the corpus has no labelled window, so no normalised score")
    return value


def score_with(corpus: list[NabSeries], scorer: NabScorer, params: NabParams) -> float:
    scores = {s.name: run_nab_detector("foreshock", s.seconds, s.values, params) for s in corpus}
    return pct(scorer.score(scores)["standard"])


def leave_one_file_out(corpus: list[NabSeries], scorer: NabScorer, runs: list[dict[str, np.ndarray]],
                       labels: list[str]) -> tuple[dict[str, float], dict[str, str]]:
    """Each file scored as if it were unseen: the candidate run (``runs[k]``, described by
    ``labels[k]``) best on the other files' standard score, *and* each profile's threshold
    optimised on the other files only, then applied to the held-out file. The held-out files'
    raw scores are summed and normalised as NAB normalises a corpus (null detector and perfect
    score of the whole ``scorer`` corpus).

    Scoring the mixed run with ``scorer.score`` instead would optimise the threshold over every
    file, the held-out one's labels included — not out of sample."""
    raw = {key: 0.0 for key in scorer.profiles}
    picks: dict[str, str] = {}
    for s in corpus:
        others = NabScorer([o for o in corpus if o.name != s.name], scorer.profiles)
        results = [others.score({k: v for k, v in r.items() if k != s.name}) for r in runs]
        best = int(np.argmax([pct(res["standard"]) for res in results]))
        thresholds = {key: r.threshold for key, r in results[best].items()}
        held_out = NabScorer([s], scorer.profiles).score({s.name: runs[best][s.name]}, thresholds)
        for key, r in held_out.items():
            raw[key] += r.raw
        picks[s.name] = labels[best] + ", thresholds " + "/".join(f"{t:.4f}" for t in thresholds.values())
    lofo = {key: round(100.0 * (raw[key] - scorer.null_score(key))
                       / (p.tp_weight * scorer.n_windows - scorer.null_score(key)), 2)
            for key, p in scorer.profiles.items()}
    return lofo, picks


def sensitivity(corpus: list[NabSeries], scorer: NabScorer) -> dict[str, object]:
    """Neighbour scores, and a leave-one-file-out estimate (:func:`leave_one_file_out`) over the
    (smooth, hold) grid: an out-of-sample check of that selection and of the thresholds. The other
    :class:`NabParams` stay as shipped, tuned on all seven files."""
    base = NabParams()
    table = {key: {str(v): round(score_with(corpus, scorer, replace(base, **{key: v})), 2) for v in values}  # type: ignore[arg-type]
             for key, values in NEIGHBOURS.items()}
    grid = [replace(base, seasonal_smooth=sm, hold_s=h * 86400.0) for sm in (6.0, 12.0, 18.0) for h in (1, 2, 3, 4)]
    runs = [{s.name: run_nab_detector("foreshock", s.seconds, s.values, p) for s in corpus} for p in grid]
    labels = [f"smooth {p.seasonal_smooth:g}, hold {p.hold_s / 86400:g} d" for p in grid]
    lofo, picks = leave_one_file_out(corpus, scorer, runs, labels)
    return {"neighbours_standard": table, "leave_one_file_out": lofo, "lofo_picks": picks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default=str(DATA / "realKnownCause"))
    ap.add_argument("--labels", default=str(DATA / "labels.json"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sensitivity", action="store_true",
                    help="Also score the parameter neighbours and a leave-one-file-out estimate "
                         "(smooth/hold and thresholds chosen on the other files).")
    args = ap.parse_args()

    corpus = load_corpus(args.data, args.labels, PipelineHealth())
    scorer = NabScorer(corpus)
    rows = sum(len(s.values) for s in corpus)
    results = {}
    for name in NAB_DETECTORS:
        scores = {s.name: run_nab_detector(name, s.seconds, s.values) for s in corpus}
        results[name] = scorer.score(scores)

    def detect_all() -> float:
        t0 = time.perf_counter()
        for s in corpus:
            run_nab_detector("foreshock", s.seconds, s.values)
        return rows / (time.perf_counter() - t0)

    speed = repeat(detect_all, runs=args.runs)

    print(f"NAB realKnownCause: {len(corpus)} files, {scorer.n_windows} windows, {rows:,} rows")
    print(f"{'detector':<16}{'standard':>10}{'low FP':>10}{'low FN':>10}   windows hit / FP rows (standard)")
    for name, res in sorted(results.items(), key=lambda kv: -pct(kv[1]["standard"])):
        std = res["standard"]
        print(f"{name:<16}{pct(std):>10.2f}{pct(res['reward_low_FP']):>10.2f}"
              f"{pct(res['reward_low_FN']):>10.2f}   {std.windows_hit}/{std.windows} / {std.false_positives}")
    print("published on realKnownCause (standard): "
          + ", ".join(f"{k} {v}" for k, v in PUBLISHED_REALKNOWNCAUSE_STANDARD.items()))
    print("published on the whole NAB corpus (standard): "
          + ", ".join(f"{k} {v}" for k, v in PUBLISHED_CORPUS_STANDARD.items()))
    print(f"foreshock detector speed: {speed['median']:,.0f} rows/s (min {speed['min']:,.0f}, max {speed['max']:,.0f}),"
          " one file (series) at a time")
    extra: dict[str, object] = {}
    if args.sensitivity:
        extra = sensitivity(corpus, scorer)
        print("standard score with one parameter changed (shipped: "
              f"{pct(results['foreshock']['standard']):.2f}):")
        for key, row in extra["neighbours_standard"].items():  # type: ignore[attr-defined]
            print(f"  {key:<18} " + ", ".join(f"{v} -> {sc}" for v, sc in row.items()))
        print("leave-one-file-out (each file scored with the smooth/hold best on the other six and each "
              "profile's threshold optimised on the other six; the other NabParams were tuned on all seven "
              f"files, so not fully out of sample): {extra['leave_one_file_out']}")
        for name, pick in extra["lofo_picks"].items():  # type: ignore[attr-defined]
            print(f"  {name:<42} {pick}")
    ours = results["foreshock"]
    emit("nab", **{k: round(pct(r), 2) for k, r in ours.items()},
         thresholds={k: round(r.threshold, 4) for k, r in ours.items()},
         windows_hit=ours["standard"].windows_hit, windows=ours["standard"].windows,
         others={name: round(pct(res["standard"]), 2) for name, res in results.items() if name != "foreshock"},
         published_standard=PUBLISHED_REALKNOWNCAUSE_STANDARD, rows_per_s=round(speed["median"]),
         subset="realKnownCause", **extra)


if __name__ == "__main__":
    main()
