"""bench/bench_nab.py's leave-one-file-out estimate holds out the threshold too: a held-out file is
scored at the threshold optimised on the other files, never at one its own labels helped choose."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

from foreshock.detectors.nab import NabScorer, NabSeries

from bench_modules import load_bench


@pytest.fixture(scope="module")
def bench_nab() -> ModuleType:
    return load_bench("bench_nab")


def series(name: str, scores: dict[int, float], n: int = 100, window: tuple[int, int] = (60, 69)) -> NabSeries:
    """100 one-minute rows (probation 0-14), one window; the *values* are the anomaly scores the
    stand-in detector returns, so each file's best threshold is known by hand."""
    ts = (np.datetime64("2020-01-01T00:00") + np.arange(n) * np.timedelta64(1, "m")).astype("datetime64[ns]")
    values = np.zeros(n)
    for i, v in scores.items():
        values[i] = v
    return NabSeries(name, ts, values, [(ts[window[0]], ts[window[1]])])


def test_leave_one_file_out_scores_each_file_at_the_threshold_chosen_on_the_others(
        bench_nab: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # a.csv: 0.9 at its window's first row (alone, threshold 0.9 scores A_TP = 1).
    # b.csv: 0.6 at its window's first row and 0.9 at row 30, before the window (alone, threshold
    # 0.6 scores 1 - 0.11; threshold 0.9 only hits the false positive: -1 - 0.11).
    corpus = [series("a.csv", {60: 0.9}), series("b.csv", {60: 0.6, 30: 0.9})]
    scorer = NabScorer(corpus)

    def stand_in(name: str, seconds: np.ndarray, values: np.ndarray, params: Any = None) -> np.ndarray:
        return values  # the same scores for every parameter set: only the threshold matters here

    monkeypatch.setattr(bench_nab, "run_nab_detector", stand_in)
    lofo = bench_nab.sensitivity(corpus, scorer)["leave_one_file_out"]
    # Held out: a.csv at b's threshold 0.6 still detects its 0.9 -> 1; b.csv at a's threshold 0.9
    # detects only the false positive -> -1.11. Optimising over both files (0.6) would give 1.89.
    null = scorer.null_score("standard")
    assert lofo["standard"] == pytest.approx(round(100 * (1.0 - 1.11 - null) / (2.0 - null), 2))
    in_sample = scorer.score({s.name: s.values for s in corpus})["standard"].normalized
    # 2 raw points lost: half the way from null (-2) to perfect (2)
    assert lofo["standard"] == pytest.approx(in_sample - 50.0, abs=0.01)
