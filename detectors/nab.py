"""The Numenta Anomaly Benchmark (NAB) scorer, mirroring numenta/NAB v1.1 exactly.

NAB scores a detector's per-row anomaly scores (in [0, 1]) against labelled anomaly *windows*:

- **probation**: the first ``min(floor(0.15 * rows), 0.15 * 5000)`` rows of each file are not
  scored (``Sweeper._getProbationaryLength``);
- **sweep score** of a row (``Sweeper.calcSweepScore``): inside a window of ``width`` rows whose
  last row is ``right``, row ``i`` is worth ``S(-(right - i + 1) / width) * A_TP / S(-1)`` with
  the scaled sigmoid ``S(x) = 2 / (1 + exp(5x)) - 1`` — the earliest row of a window is worth
  exactly ``A_TP``; outside a window a detection costs ``S(|i - prev_right| / (prev_width - 1))
  * A_FP`` (cheap just after a window, ``-A_FP`` far from it or before the first window);
- **score at a threshold** (``Sweeper.calcScoreByThreshold``): rows with ``score >= threshold``
  are detections; each window contributes the best sweep score of its detections, or ``-A_FN``
  when it has none; every detection outside windows adds its (negative) sweep score;
- **threshold optimisation** (``optimizer.optimizeThreshold``): one threshold per detector and
  profile, the one with the best total over the whole corpus (ties: the highest threshold);
- **normalisation** (``Runner.normalize``): ``100 * (raw - null) / (perfect - null)``, where
  *null* is the null detector (constant 0.5) run through the same optimisation and *perfect* is
  ``A_TP`` times the number of windows.

Profiles (``config/profiles.json``): standard (A_TP 1, A_FP 0.11, A_FN 1), reward_low_FP_rate
(A_FP 0.22), reward_low_FN_rate (A_FN 2).

Window limits are matched to rows the way NAB does: a window opens at the row whose timestamp
*equals* its start, and its right edge is the *first* row equal to its end — which matters for
the real files' quirks (a timestamp that jumps back, duplicate timestamps), counted by
:func:`load_series`.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.numba_config import jit

PROBATION_PERCENT = 0.15
"""Fraction of each file left unscored (NAB's ``probationaryPercent``)."""

PROBATION_CAP_ROWS = 5000
"""NAB caps probation at ``PROBATION_PERCENT * 5000`` = 750 rows."""

START_THRESHOLD = 1.1
"""NAB's first sweep threshold: above every score, so it means "no detections"."""


@dataclass(frozen=True)
class Profile:
    """One NAB application profile: the weights of a true positive, false positive, miss."""

    name: str
    tp_weight: float
    fp_weight: float
    fn_weight: float


PROFILES: dict[str, Profile] = {
    "standard": Profile("standard", 1.0, 0.11, 1.0),
    "reward_low_FP": Profile("reward_low_FP_rate", 1.0, 0.22, 1.0),
    "reward_low_FN": Profile("reward_low_FN_rate", 1.0, 0.11, 2.0),
}
"""NAB's ``config/profiles.json``, keyed by the short names foreshock prints."""


@dataclass
class NabSeries:
    """One NAB data file: timestamps (datetime64[ns]), values, and its labelled windows.

    ``name`` identifies the file in a corpus (scores and sweep rows are keyed by it, so it must be
    unique there). :func:`load_corpus` uses its path under the data folder, ``/``-separated, as
    NAB keys files by ``<category>/<file>``: the bare file name for a file directly in it."""

    name: str
    timestamps: np.ndarray
    values: np.ndarray
    windows: list[tuple[np.datetime64, np.datetime64]]
    category: str = ""  # the data folder it came from (NAB's results tree mirrors it)

    @property
    def seconds(self) -> np.ndarray:
        """Timestamps as float seconds since the epoch (what detectors consume)."""
        return self.timestamps.astype("datetime64[ns]").astype(np.int64) / 1e9

    def labels(self) -> np.ndarray:
        """1 where a row lies inside a window (``t1 <= t <= t2``), as NAB's CorpusLabel does."""
        label = np.zeros(len(self.timestamps), dtype=np.int8)
        for t1, t2 in self.windows:
            label[(self.timestamps >= t1) & (self.timestamps <= t2)] = 1
        return label


def scaled_sigmoid(position: float) -> float:
    """NAB's scaled sigmoid: 0.98661 at -1 (window start), 0 at 0 (window end), exactly -1 from 3 on."""
    # NAB's scaledSigmoid tests ``>= 3.0``: a false positive exactly 3 * (width - 1) rows after a
    # window costs the full -A_FP, not S(3) = -0.9999994.
    if position >= 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


def probation_length(rows: int, percent: float = PROBATION_PERCENT) -> float:
    """Rows left unscored at the start of a file (a float, compared with the row index)."""
    return min(math.floor(percent * rows), percent * PROBATION_CAP_ROWS)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

def _parse_time(text: str) -> np.datetime64:
    return np.datetime64(text.strip().replace(" ", "T"), "ns")


def load_labels(path: str | Path) -> dict[str, list[tuple[np.datetime64, np.datetime64]]]:
    """Read a NAB labels file: either ``{"windows": {file: [[t1, t2], ...]}, ...}`` or NAB's own
    ``combined_windows.json`` (``{file: [[t1, t2], ...]}``). Keys are kept as written (NAB's
    ``<category>/<file>``, or a bare file name), ``/``-separated; :func:`load_corpus` matches
    them to files."""
    with open(path) as f:
        raw = json.load(f)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: labels must be a JSON object")
    table = raw.get("windows", raw)
    if not isinstance(table, dict):
        raise ValueError(f"{path}: 'windows' must map file names to lists of [start, end]")
    windows: dict[str, list[tuple[np.datetime64, np.datetime64]]] = {}
    for key, limits in table.items():
        pairs = []
        for lim in limits:
            if len(lim) != 2:
                raise ValueError(f"{path}: window {lim!r} of {key} is not [start, end]")
            t1, t2 = _parse_time(lim[0]), _parse_time(lim[1])
            if t2 < t1:
                raise ValueError(f"{path}: window {lim!r} of {key} ends before it starts")
            pairs.append((t1, t2))
        # in time order, as NAB's labeller writes them and its sweep reads them: a hand-written file
        # listing them latest first had only its first window opened, and was refused for "window
        # starts match no row" though every start was a row (an audit, 2026-12-05)
        pairs.sort()
        windows[key.replace("\\", "/").removeprefix("./")] = pairs
    return windows


def load_series(path: str | Path, windows: Sequence[tuple[np.datetime64, np.datetime64]] = (),
                health: PipelineHealth | None = None, category: str = "", name: str | None = None) -> NabSeries:
    """Read a NAB CSV (``timestamp,value``) as a series called ``name`` (default: the file name).
    Rows are kept in file order, exactly as NAB scores them; quirks are counted in ``health``
    (stage ``nab``): timestamps that go back, duplicate timestamps, values that are not numbers
    (kept as NaN)."""
    health = health or PipelineHealth()
    name = name or Path(path).name
    stamps: list[np.datetime64] = []
    values: list[float] = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["timestamp", "value"]:
            raise ValueError(f"{path}: expected a 'timestamp,value' header, got {header!r}")
        for row in reader:
            if not row:
                continue
            try:
                stamps.append(_parse_time(row[0]))
            except ValueError:
                health.problem("nab", "bad_timestamp", detail=f"{name}: {row[0]!r}")
                continue
            try:
                values.append(float(row[1]))
            except (ValueError, IndexError):
                health.problem("nab", "bad_value", detail=f"{name}: {row!r}")
                values.append(float("nan"))
    ts = np.array(stamps, dtype="datetime64[ns]")
    step = np.diff(ts.astype(np.int64))
    health.problem("nab", "timestamp_backwards", int(np.sum(step < 0)), detail=name)
    health.problem("nab", "timestamp_duplicate", int(np.sum(step == 0)), detail=name)
    vals = np.array(values, dtype=np.float64)
    health.problem("nab", "value_not_finite", int(np.sum(~np.isfinite(vals))), detail=name)
    return NabSeries(name, ts, vals, list(windows), category)


def _label_key(rel: str, folder: str, keys: Sequence[str]) -> str | None:
    """The labels' key for the CSV at ``rel`` (its ``/``-separated path under the data folder,
    whose own name is ``folder``), or None when the labels do not name it. Tried in turn: the
    path itself (the folder is NAB's ``data/``); ``<folder>/<path>`` (the folder is one NAB
    category); a bare file name; the one key whose file name is this file's. Several such keys
    (``hostA/f.csv``, ``hostB/f.csv`` for a file ``f.csv``) are a ValueError: guessing would score
    the file against another file's windows."""
    exact = set(keys)
    for key in (rel, f"{folder}/{rel}", rel.rsplit("/", 1)[-1]):
        if key in exact:
            return key
    base = rel.rsplit("/", 1)[-1]
    same = sorted(k for k in keys if k.rsplit("/", 1)[-1] == base)
    if len(same) > 1:
        raise ValueError(f"{rel}: the labels name several files called {base} ({', '.join(same)}) "
                         "and none at this path; key the labels by <category>/<file> as NAB does")
    return same[0] if same else None


def load_corpus(data_dir: str | Path, labels_path: str | Path,
                health: PipelineHealth | None = None) -> list[NabSeries]:
    """Every CSV under ``data_dir`` that the labels file names, sorted by file name (then path).
    Each series is named by its path under ``data_dir`` (see :class:`NabSeries`), so two
    categories may hold files of the same name, as NAB's do. A CSV the labels do not know is
    counted (``nab``/``unlabelled_file``) and skipped, as NAB would fail on it; two CSVs that
    one label key would both match are a ValueError naming both."""
    health = health or PipelineHealth()
    windows = load_labels(labels_path)
    data_dir = Path(data_dir)
    folder = data_dir.resolve().name
    keys = list(windows)
    claimed: dict[str, str] = {}
    out = []
    for path in sorted(data_dir.rglob("*.csv"), key=lambda p: (p.name, p.relative_to(data_dir).as_posix())):
        rel = path.relative_to(data_dir).as_posix()
        key = _label_key(rel, folder, keys)
        if key is None:
            health.problem("nab", "unlabelled_file", detail=rel)
            continue
        if key in claimed:
            raise ValueError(f"{claimed[key]} and {rel} both match the label {key!r} in {labels_path}; "
                             "key the labels by <category>/<file> as NAB does")
        claimed[key] = rel
        # NAB's results tree mirrors data/<category>/; a category folder given directly is one.
        category = path.parent.relative_to(data_dir).as_posix() if path.parent != data_dir else folder
        out.append(load_series(path, windows[key], health, category, name=rel))
    if not out:
        raise ValueError(f"no CSV under {data_dir} is named in {labels_path}")
    return out


# ---------------------------------------------------------------------------------------------
# Sweep scores (Sweeper.calcSweepScore)
# ---------------------------------------------------------------------------------------------

PROBATION = -2
"""Window id of a probationary row (never scored)."""
OUTSIDE = -1
"""Window id of a row outside every window."""


def sweep_rows(series: NabSeries, profile: Profile,
               probation_percent: float = PROBATION_PERCENT) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the weighted NAB score a detection there would earn, and its window id
    (0.. for the file's windows, :data:`OUTSIDE`, :data:`PROBATION`).

    A straight transcription of ``Sweeper.calcSweepScore`` (its loop over rows, its exact
    timestamp matching), so that quirky files score as NAB scores them. A ValueError where NAB
    would fail or score nonsense: a window whose start or end matches no row, one whose end row
    comes before its start row, and a one-row window followed by a row outside windows (NAB
    divides by its width - 1 there; a one-row window on the last row, or followed directly by
    another window, scores fine)."""
    ts = series.timestamps.astype("datetime64[ns]").astype(np.int64)
    ends = np.array(series.windows, dtype="datetime64[ns]").reshape(-1, 2).astype(np.int64)
    limits = [(int(a), int(b)) for a, b in ends]
    first_index: dict[int, int] = {}
    for i, t in enumerate(ts.tolist()):
        first_index.setdefault(t, i)
    n = len(ts)
    probation = probation_length(n, probation_percent)
    max_tp = scaled_sigmoid(-1.0)
    sweep = np.empty(n, dtype=np.float64)
    window_id = np.empty(n, dtype=np.int64)
    pending = list(enumerate(limits))
    cur: tuple[int, int] | None = None
    cur_id = OUTSIDE
    cur_width = cur_right = 0.0
    prev_width: float | None = None
    prev_right: int | None = None
    prev_window = (0, 0)
    for i, t in enumerate(ts.tolist()):
        if pending and t == pending[0][1][0]:
            cur_id, cur = pending.pop(0)
            if cur[1] not in first_index:
                raise ValueError(f"{series.name}: window end {np.datetime64(cur[1], 'ns')} is not a row")
            cur_right = first_index[cur[1]]
            cur_width = float(cur_right - first_index[cur[0]] + 1)
            if cur_width < 1:
                raise ValueError(f"{series.name}: window {np.datetime64(cur[0], 'ns')} .. "
                                 f"{np.datetime64(cur[1], 'ns')} ends (row {cur_right}) before it starts "
                                 f"(row {first_index[cur[0]]}) in file order")
        if cur is not None:
            position = -(cur_right - i + 1) / cur_width
            sweep[i] = scaled_sigmoid(position) * profile.tp_weight / max_tp
        else:
            if prev_right is None or prev_width is None:
                unweighted = -1.0
            elif prev_width == 1.0:
                # NAB weighs a false positive after a window by its distance / (width - 1): a
                # one-row window followed by a row outside windows is its ZeroDivisionError.
                raise ValueError(f"{series.name}: window {np.datetime64(prev_window[0], 'ns')} .. "
                                 f"{np.datetime64(prev_window[1], 'ns')} spans 1 row(s) and row {i}, "
                                 "outside windows, follows it; NAB needs a window of at least two rows "
                                 "there (it divides by the width - 1)")
            else:
                unweighted = scaled_sigmoid(abs(prev_right - i) / (prev_width - 1.0))
            sweep[i] = unweighted * profile.fp_weight
        if i >= probation:
            window_id[i] = cur_id if cur is not None else OUTSIDE
        else:
            window_id[i] = PROBATION
        if cur is not None and t == cur[1]:
            prev_right, prev_width, prev_window = i, cur_width, cur
            cur, cur_id = None, OUTSIDE
    if pending:
        raise ValueError(f"{series.name}: window starts {[np.datetime64(p[1][0], 'ns') for p in pending]} "
                         "match no row (NAB opens a window only at a row whose timestamp equals its start)")
    return sweep, window_id


def write_results(path: str | Path, series: NabSeries, scores: np.ndarray) -> None:
    """One file in NAB's results format (``timestamp,value,anomaly_score,label``), readable by
    NAB's own scorer (``results/<detector>/<category>/<detector>_<file>.csv``)."""
    stamps = np.datetime_as_string(series.timestamps.astype("datetime64[s]"), unit="s")
    labels = series.labels()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "value", "anomaly_score", "label"])
        for t, v, s, lab in zip(stamps, series.values.tolist(), np.asarray(scores).tolist(), labels.tolist()):
            w.writerow([t.replace("T", " "), repr(v), repr(float(s)), int(lab)])


# ---------------------------------------------------------------------------------------------
# Threshold sweep (Sweeper.calcScoreByThreshold) and optimisation
# ---------------------------------------------------------------------------------------------

@jit
def _sweep_totals(sweep: np.ndarray, window_id: np.ndarray, n_windows: int,
                  fn_weight: float, totals: np.ndarray) -> None:
    """Corpus score after each row is turned into a detection, rows in descending-score order.

    ``window_id`` < 0 marks a row outside windows (its sweep score adds up); a window's part is
    the best sweep score of its detections, ``-fn_weight`` until it has one."""
    best = np.full(n_windows, -fn_weight)
    total = -fn_weight * n_windows
    for k in range(sweep.shape[0]):
        w = window_id[k]
        if w < 0:
            total += sweep[k]
        elif sweep[k] > best[w]:
            total += sweep[k] - best[w]
            best[w] = sweep[k]
        totals[k] = total


@dataclass(frozen=True)
class ThresholdCurve:
    """Corpus score at every distinct threshold, highest threshold first (row 0: none detected)."""

    thresholds: np.ndarray
    scores: np.ndarray
    detections: np.ndarray  # scored rows at or above each threshold

    def best(self) -> tuple[float, float]:
        """(threshold, score) with the best score; ties go to the highest threshold, as NAB's
        stable sort of the sweep rows does."""
        k = int(np.argmax(self.scores))
        return float(self.thresholds[k]), float(self.scores[k])

    def at(self, threshold: float) -> float:
        """Score with detections at every row whose anomaly score is >= ``threshold``."""
        k = int(np.searchsorted(-self.thresholds, -threshold, side="right")) - 1
        return float(self.scores[max(k, 0)])


def threshold_curve(anomaly_scores: Sequence[np.ndarray], sweeps: Sequence[np.ndarray],
                    window_ids: Sequence[np.ndarray], fn_weight: float) -> ThresholdCurve:
    """Score every threshold over a corpus of files at once (NAB's optimiser pools all rows)."""
    scores, sweep, wid = [], [], []
    offset = 0
    for s, sw, w in zip(anomaly_scores, sweeps, window_ids):
        s = np.asarray(s, dtype=np.float64)
        if s.shape != sw.shape:
            raise ValueError(f"anomaly scores have {s.shape[0]} rows, the file has {sw.shape[0]}")
        keep = w != PROBATION
        scores.append(s[keep])
        sweep.append(sw[keep])
        local = w[keep]
        wid.append(np.where(local >= 0, local + offset, OUTSIDE))
        offset += int(w.max()) + 1 if (w >= 0).any() else 0
    all_scores = np.concatenate(scores) if scores else np.empty(0)
    if not np.all(np.isfinite(all_scores)) or np.any(all_scores < 0) or np.any(all_scores > 1):
        raise ValueError("NAB anomaly scores must be finite and within [0, 1]")
    all_sweep = np.concatenate(sweep) if sweep else np.empty(0)
    all_wid = np.concatenate(wid) if wid else np.empty(0, dtype=np.int64)
    # Windows NAB scores are those with at least one row past probation.
    present = np.unique(all_wid[all_wid >= 0])
    remap = np.full(max(offset, 1), -1, dtype=np.int64)
    remap[present] = np.arange(present.size)
    all_wid = np.where(all_wid >= 0, remap[np.maximum(all_wid, 0)], OUTSIDE)
    order = np.argsort(-all_scores, kind="stable")
    totals = np.empty(order.size, dtype=np.float64)
    _sweep_totals(np.ascontiguousarray(all_sweep[order]), np.ascontiguousarray(all_wid[order]),
                  int(present.size), float(fn_weight), totals)
    sorted_scores = all_scores[order]
    # The score at threshold T counts every row >= T: the total after a run of equal scores.
    last_of_run = np.flatnonzero(np.r_[sorted_scores[1:] != sorted_scores[:-1], True]) if order.size else np.empty(0, np.int64)
    thresholds = np.r_[START_THRESHOLD, sorted_scores[last_of_run]]
    curve = np.r_[0.0 - fn_weight * present.size, totals[last_of_run]]  # 0.0 - : no "-0.000" with no window
    detections = np.r_[0, last_of_run + 1]
    return ThresholdCurve(thresholds, curve, detections.astype(np.int64))


@dataclass(frozen=True)
class ProfileResult:
    profile: str
    threshold: float
    raw: float
    null: float
    perfect: float
    windows_hit: int = 0
    windows: int = 0
    false_positives: int = 0  # scored rows outside windows at or above the threshold

    @property
    def normalized(self) -> float | None:
        """``100 * (raw - null) / (perfect - null)``; None where that is undefined: a corpus with
        no labelled window scored (NAB's artificialNoAnomaly), where perfect and null are both 0
        and only the raw score says anything."""
        if self.perfect == self.null:
            return None
        return 100.0 * (self.raw - self.null) / (self.perfect - self.null)


class NabScorer:
    """Scores detectors on a fixed corpus; the per-row sweep scores are computed once.

    >>> import numpy as np
    >>> ts = np.arange(np.datetime64("2020-01-01T00:00"), np.datetime64("2020-01-01T01:00"),
    ...                np.timedelta64(1, "m")).astype("datetime64[ns]")
    >>> s = NabSeries("toy.csv", ts, np.zeros(60), [(ts[30], ts[33])])
    >>> scorer = NabScorer([s])
    >>> hit = np.zeros(60); hit[30] = 1.0            # detect at the window's first row
    >>> round(scorer.score({"toy.csv": hit})["standard"].normalized, 3)
    100.0
    >>> hit[32], hit[30] = 1.0, 0.0                  # halfway in: S(-0.5) / S(-1) = 0.86
    >>> round(scorer.score({"toy.csv": hit})["standard"].normalized, 2)
    92.99
    >>> round(scorer.score({"toy.csv": np.zeros(60)})["standard"].normalized, 3)
    0.0
    """

    def __init__(self, corpus: Sequence[NabSeries], profiles: Mapping[str, Profile] = PROFILES,
                 probation_percent: float = PROBATION_PERCENT) -> None:
        if not corpus:
            raise ValueError("NAB corpus is empty")
        names = [s.name for s in corpus]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            # Sweep rows and scores are keyed by name: a second file would silently replace the first.
            raise ValueError(f"NAB corpus names {twice} more than once; name each file by its path "
                             "(<category>/<file>), as load_corpus does")
        self.corpus = list(corpus)
        self.profiles = dict(profiles)
        self.rows: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {
            key: {s.name: sweep_rows(s, p, probation_percent) for s in self.corpus}
            for key, p in self.profiles.items()}
        self.n_windows = sum(len(s.windows) for s in self.corpus)
        self._null: dict[str, float] = {}

    def curve(self, scores: Mapping[str, np.ndarray], profile: str) -> ThresholdCurve:
        p = self.profiles[profile]
        missing = [s.name for s in self.corpus if s.name not in scores]
        if missing:
            raise ValueError(f"no anomaly scores for {missing}")
        rows = self.rows[profile]
        names = [s.name for s in self.corpus]
        return threshold_curve([scores[n] for n in names], [rows[n][0] for n in names],
                               [rows[n][1] for n in names], p.fn_weight)

    def null_score(self, profile: str) -> float:
        """The null detector (constant 0.5 everywhere), optimised like any detector."""
        if profile not in self._null:
            null = {s.name: np.full(len(s.timestamps), 0.5) for s in self.corpus}
            self._null[profile] = self.curve(null, profile).best()[1]
        return self._null[profile]

    def score(self, scores: Mapping[str, np.ndarray],
              thresholds: Mapping[str, float] | None = None) -> dict[str, ProfileResult]:
        """Per profile: the optimised (or given) threshold, raw and normalised score."""
        out = {}
        for key, p in self.profiles.items():
            curve = self.curve(scores, key)
            if thresholds is not None and key in thresholds:
                threshold = float(thresholds[key])
                raw = curve.at(threshold)
            else:
                threshold, raw = curve.best()
            hit, total, fp = self.detections(scores, key, threshold)
            out[key] = ProfileResult(p.name, threshold, raw, self.null_score(key),
                                     p.tp_weight * self.n_windows, hit, total, fp)
        return out

    def detections(self, scores: Mapping[str, np.ndarray], profile: str,
                   threshold: float) -> tuple[int, int, int]:
        """(windows with a detection, windows scored, detections outside windows) at ``threshold``."""
        hit = total = fp = 0
        for s in self.corpus:
            _, wid = self.rows[profile][s.name]
            det = np.asarray(scores[s.name], dtype=np.float64) >= threshold
            ids = np.unique(wid[wid >= 0])
            total += ids.size
            hit += np.unique(wid[det & (wid >= 0)]).size
            fp += int(np.count_nonzero(det & (wid == OUTSIDE)))
        return hit, total, fp
