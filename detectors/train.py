"""Offline training of the scikit-learn baseline: "will this GPU see EVENT within H seconds?"

For every GPU sample of the training recordings the shared feature stream
(:class:`foreshock.detectors.baselines.FeatureStream`, the one the detector runs) gives the
features, fed exactly as the evaluation harness feeds the detector (:func:`guarded_features`:
behind the same input guard, the same board-swap handling); the label is 1 when an episode of
the event (scored exactly as the evaluation harness scores it:
:data:`foreshock.detectors.evaluation.EVENT_KINDS`) starts on that GPU within the horizon, 0
otherwise. Samples taken while the event is already under way are left out: they teach nothing
about predicting it. So are the samples whose horizon outlives the recording with no episode
before its end, for the kinds whose such claims the evaluation leaves unjudged (``censor_at_end``:
the thermal kinds) — whether the event came is not known; for the others (the power cap) the
evaluation judges such a claim false, and so they are labelled 0. Negatives are subsampled.

One ``HistGradientBoostingClassifier`` per event; its alarm threshold is the probability that
maximises F1 on the samples of a held-out fifth of the GPUs (neighbouring samples of one GPU are
near-copies: held out by sample, they grade the model on its own training data), each negative
weighted by the inverse of its share kept, so that F1 is the one on every sample the detector
will see. The result is written with :func:`~foreshock.detectors.baselines.save_model` (skops,
feature list, format version).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Sequence

import numpy as np

from foreshock.findings import Finding
from foreshock.health import PipelineHealth
from foreshock.recording import Recording
from foreshock.topology import Topology

from .bank import DetectorBank
from .baselines import FEATURES, MODEL_TELEMETRY_KEY, ScoredBaseline, ScoreLog, learnable_events, save_model
from .evaluation import (EVENT_KINDS, EventKind, LevelScorer, RunResult, episodes, guarded_updates, level_scorer,
                         read_ground_truth, refine_crossings, run_recording, threshold_sweep, usable_scores)


@dataclass
class Dataset:
    features: np.ndarray
    labels: dict[str, np.ndarray]  # event -> 0/1 (NaN: sample not usable for that event)
    recordings: list[str] = field(default_factory=list)
    # per sample: which GPU of which recording (recording index * GROUP_SCALE + slot), and the
    # inverse of the chance it was kept (1 / negative_fraction for a subsampled negative)
    groups: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    weights: np.ndarray = field(default_factory=lambda: np.empty(0))
    # ground-truth events set aside, in all the recordings: their entity is not in the topology
    events_unknown_entity: int = 0
    # the entity kinds that reached the feature stream (of its own: gpu, rack), in any recording:
    # a model trained without rack frames read its inlets from the GPUs' proxy, and is served so
    telemetry: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.features)


SLOT_SCALE = 1e9
"""Episodes of all GPUs live in one sorted key space: ``slot * SLOT_SCALE + (t - t0)``."""
GROUP_SCALE = 1 << 32
"""A sample's GPU across recordings: ``recording index * GROUP_SCALE + slot``."""
VALIDATION_SHARE = 0.2
"""The share of the GPUs whose samples choose the alarm threshold."""


@dataclass
class EpisodeIndex:
    starts: np.ndarray  # sorted keys of episode starts
    ends: np.ndarray  # keys of the matching ends
    t0: float

    @classmethod
    def build(cls, spans: Sequence[tuple[int, float, float]], t0: float) -> "EpisodeIndex":
        if not spans:
            return cls(np.empty(0), np.empty(0), t0)
        arr = np.asarray(spans, dtype=float)
        base = arr[:, 0] * SLOT_SCALE
        starts, ends = base + (arr[:, 1] - t0), base + (np.minimum(arr[:, 2], t0 + SLOT_SCALE / 2) - t0)
        order = np.argsort(starts)
        return cls(starts[order], ends[order], t0)


def label_rows(ts: np.ndarray, slot: np.ndarray, index: EpisodeIndex, horizon: float,
               known_until: float = math.inf) -> np.ndarray:
    """1 if an episode starts on the slot within (t, t + horizon], NaN while one is under way, else
    0 — or NaN where ``t + horizon`` is past ``known_until`` (the end of a recording that censors
    such claims): none came before the end, and whether one came after is not known."""
    key = slot.astype(float) * SLOT_SCALE + (ts - index.t0)
    y = np.zeros(len(ts))
    if len(index.starts):
        k = np.searchsorted(index.starts, key, side="right")
        nxt = index.starts[np.minimum(k, len(index.starts) - 1)]
        same = (k < len(index.starts)) & (np.floor(nxt / SLOT_SCALE) == slot)
        y[same & (nxt - key <= horizon)] = 1.0
        prev = k - 1
        ok = prev >= 0
        p = np.maximum(prev, 0)
        during = ok & (np.floor(index.starts[p] / SLOT_SCALE) == slot) & (key <= index.ends[p])
        y[during] = np.nan
    y[(y == 0.0) & (ts + horizon > known_until)] = np.nan
    return y


class _FeatureTap(ScoredBaseline):
    """A detector that keeps what its feature stream gives (``(obs, features)`` per GPU frame) and
    decides nothing: put in a bank, it sees the features exactly as a baseline there does."""

    name: ClassVar[str] = "train_features"

    def __init__(self, topology: Topology, health: PipelineHealth | None = None) -> None:
        super().__init__(topology, health)
        self.taken: list[tuple[np.ndarray, np.ndarray]] = []

    def _decide(self, obs: np.ndarray, feats: np.ndarray) -> list[Finding]:
        self.taken.append((obs, feats))
        return []


def fed_kinds(rec: Recording, telemetry: Sequence[str] | None = None) -> tuple[str, ...]:
    """The entity kinds a baseline's feature stream reads from ``rec`` when ``evaluate`` (or
    ``train``) is given ``--telemetry`` (None: every kind): those it reads, the recording has, and
    the run feeds. ``("gpu",)`` where no rack frame is fed: the inlet comes from the GPUs' proxy."""
    return tuple(k for k in _FeatureTap.kinds if k in rec.kinds() and (telemetry is None or k in telemetry))


def guarded_features(rec: Recording, telemetry: Sequence[str] | None = None
                     ) -> Iterator[tuple[np.ndarray, np.ndarray, float]]:
    """``(obs, features, t)`` per GPU frame of ``rec`` as ``evaluate`` gives them to a baseline
    (:func:`foreshock.detectors.evaluation.run_recording`): the frames through the input guard
    (out-of-range and infinite readings NaN, rows out of order dropped) and the bank's board-swap
    handling (a replaced board's features start afresh, a moved one's follow it), only the entity
    kinds of ``telemetry`` fed (as ``evaluate --telemetry``); ``t`` is the latest timestamp the
    guard has passed so far (of any kind fed)."""
    tap = _FeatureTap(rec.topology)
    bank = DetectorBank(rec.topology, [tap])
    last = -math.inf
    kinds = tuple(k for k in bank.kinds if telemetry is None or k in telemetry)
    for clean, _ in guarded_updates(rec, bank, kinds, PipelineHealth()):
        last = max(last, float(clean.ts[-1]))
        for obs, x in tap.taken:
            yield obs, x, last
        tap.taken.clear()


def build_dataset(paths: Sequence[str | Path], events: Sequence[str], negative_fraction: float = 0.05,
                  seed: int = 0, progress: Callable[[str, float], None] | None = None,
                  telemetry: Sequence[str] | None = None) -> Dataset:
    if not 0.0 < negative_fraction <= 1.0:
        raise ValueError(f"negative_fraction must be in (0, 1], not {negative_fraction!r}")
    rng = np.random.default_rng(seed)
    feats: list[np.ndarray] = []
    labels: dict[str, list[np.ndarray]] = {e: [] for e in events}
    groups: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    unknown_entity = 0
    inputs: set[str] = set()
    for n, path in enumerate(paths):
        rec = Recording.open(path)
        inputs.update(fed_kinds(rec, telemetry))
        topo = rec.topology
        truth = read_ground_truth(rec)  # (events of entities the topology lacks set aside, and logged)
        evs = truth.events
        unknown_entity += len(truth.unknown_entity)
        start = rec.meta.get("start")
        end = rec.meta.get("end")
        t0 = float(start) if start is not None else 0.0
        marks = {e: EpisodeIndex.build([(topo.slot("gpu", ep.entity), ep.start, ep.end)
                                        for ep in episodes(evs, EVENT_KINDS[e])], t0) for e in events}
        ts: list[np.ndarray] = []
        slots: list[np.ndarray] = []
        last = math.nan
        for obs, x, last in guarded_features(rec, telemetry):
            slot = obs[:, 1].astype(np.int64)
            any_pos = np.zeros(len(obs), bool)
            for e in events:
                any_pos |= label_rows(obs[:, 0], slot, marks[e], EVENT_KINDS[e].horizon_s) == 1
            keep = np.isfinite(x[:, 0]) & (any_pos | (rng.random(len(obs)) < negative_fraction))
            feats.append(x[keep])
            ts.append(obs[keep, 0])
            slots.append(slot[keep])
            weights.append(np.where(any_pos[keep], 1.0, 1.0 / negative_fraction))
            if progress is not None and start is not None and end is not None and end > start and len(obs):
                progress(str(path), (float(obs[-1, 0]) - start) / (end - start))
        # labelled once the recording's end is known: the evaluation's (its meta's, else its last sample)
        t_end = float(end) if end is not None else last
        t_all = np.concatenate(ts) if ts else np.empty(0)
        s_all = np.concatenate(slots) if slots else np.empty(0, np.int64)
        for e in events:
            kind = EVENT_KINDS[e]
            labels[e].append(label_rows(t_all, s_all, marks[e], kind.horizon_s,
                                        t_end if kind.censor_at_end else math.inf))
        groups.append(n * GROUP_SCALE + s_all)
    return Dataset(np.concatenate(feats) if feats else np.empty((0, len(FEATURES))),
                   {e: np.concatenate(v) if v else np.empty(0) for e, v in labels.items()},
                   [str(p) for p in paths],
                   np.concatenate(groups) if groups else np.empty(0, np.int64),
                   np.concatenate(weights) if weights else np.empty(0), unknown_entity,
                   [k for k in _FeatureTap.kinds if k in inputs])


def best_f1_threshold(p: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> float:
    """The probability cut that maximises F1 on (p, y), each sample counted ``weights`` times (the
    inverse of its chance to be kept); 0.5 when there are no positives. A cut takes every sample
    scored at or above it, ties included."""
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=float)
    positives = float((w * y).sum()) if len(y) else 0.0
    if positives <= 0.0:
        return 0.5
    order = np.argsort(-p, kind="stable")
    ps, ys, ws = p[order], y[order], w[order]
    tp = np.cumsum(ws * ys)
    fp = np.cumsum(ws * (1 - ys))
    f1 = 2 * tp / (tp + fp + positives)
    f1[:-1][ps[1:] == ps[:-1]] = -1.0  # within a tie, only the cut below its last sample exists
    k = int(np.argmax(f1))
    # the cut itself (it was clipped to [0.05, 0.95]: a balanced-weight model's best cut often lies
    # above 0.95); a model file's threshold lies strictly between 0 and 1
    return float(min(max(ps[k], 1e-6), np.nextafter(1.0, 0.0)))


def held_out_gpus(groups: np.ndarray, y: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    """Mask of the samples of ``share`` of the GPUs (``groups``), drawn apart among the GPUs with a
    positive sample and the rest, so that both sides keep positives where two GPUs or more have
    them (none is held out of a side of fewer than two)."""
    ids, inverse = np.unique(groups, return_inverse=True)
    has_pos = np.bincount(inverse, weights=y.astype(float), minlength=len(ids)) > 0
    chosen = np.zeros(len(ids), bool)
    for side in (np.flatnonzero(has_pos), np.flatnonzero(~has_pos)):
        if len(side) < 2:
            continue
        k = min(max(int(round(share * len(side))), 1), len(side) - 1)
        chosen[rng.choice(side, k, replace=False)] = True
    return chosen[inverse]


def train(dataset: Dataset, events: Sequence[str], seed: int = 0, max_iter: int = 200) -> dict[str, dict[str, Any]]:
    from sklearn.ensemble import HistGradientBoostingClassifier

    rng = np.random.default_rng(seed)
    models: dict[str, dict[str, Any]] = {}
    groups = dataset.groups if len(dataset.groups) == len(dataset) else np.zeros(len(dataset), np.int64)
    weights = dataset.weights if len(dataset.weights) == len(dataset) else np.ones(len(dataset))
    for e in events:
        y = dataset.labels[e]
        ok = np.isfinite(y)
        x, y, g, w = dataset.features[ok], y[ok].astype(int), groups[ok], weights[ok]
        if len(np.unique(y)) < 2:
            raise ValueError(f"no positive and negative samples for {e!r} in the training recordings "
                             f"({int(y.sum())} positives of {len(y)}); record faults that cause it")
        valid = held_out_gpus(g, y, VALIDATION_SHARE, rng)
        clf = HistGradientBoostingClassifier(max_iter=max_iter, learning_rate=0.1, random_state=seed,
                                             class_weight="balanced")
        threshold = 0.5
        if valid.any() and len(np.unique(y[~valid])) == 2:
            clf.fit(x[~valid], y[~valid])
            threshold = best_f1_threshold(clf.predict_proba(x[valid])[:, 1], y[valid], w[valid])
        clf.fit(x, y)  # final model on everything
        models[e] = {"model": clf, "horizon_s": float(EVENT_KINDS[e].horizon_s), "threshold": threshold,
                     "samples": int(len(y)), "positives": int(y.sum())}
    return models


CALIBRATION_PRECISION = 0.9
"""The precision ``train --calibrate`` holds each alarm threshold to on the calibration recording by
default: the issue's target for the thermal predictions (0.95 asks more than a recording may allow:
on seed 4, with every detector's cooling-loss precision at 0.92 or under, it left the model 2 % of
its recall)."""


def calibrate(models: dict[str, dict[str, Any]], paths: Sequence[str | Path], telemetry: Sequence[str] | None,
              trained_on: Sequence[str], target_precision: float = CALIBRATION_PRECISION,
              progress: Callable[[str, float], None] | None = None) -> dict[str, dict[str, Any]]:
    """Set each event's alarm threshold (in ``models``) to the level of best recall at precision
    >= ``target_precision`` on every recording of ``paths``, scored by the evaluation's own rules
    (episodes, horizons, what is not judged): what a user does with a model before trusting its
    alarms — the per-sample F1 cut chosen in training counts samples, not warned episodes (seed
    21, 1,024 GPUs: it alarmed at precision 0.37 over episodes, 73 false alarms per 1000 GPU-h).
    Over several recordings a level must hold the precision on each (one with no judged alarm
    at that level does not object), and the recall is that of all their episodes together; where
    no level holds it, the level whose worst precision is the highest. The recordings must be
    ones the model was not trained on (a user's held-out recordings; the evaluation's test
    recording would be the oracle threshold ``evaluate`` already reports as "matched"). Returns
    per event the level chosen, whether it reached the target, its recall and its worst precision."""
    import tempfile

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        probe = save_model(Path(tmp) / "probe.skops", models)
        for path in paths:
            rec = Recording.open(path)
            fed = fed_kinds(rec, telemetry)
            if set(fed) != set(trained_on):  # its features would not mean what they meant in training
                raise ValueError(f"calibration recording {path} feeds {', '.join(fed) or 'no'} telemetry to the "
                                 f"features, the training recordings fed {', '.join(trained_on)}: calibrate on "
                                 "recordings fed alike")
            known = rec.meta.get("start") is not None and rec.meta.get("end") is not None

            def step(done: float, total: float, key: str = str(path)) -> None:
                if progress is not None and total > 0:
                    progress(key, done / total)

            result = run_recording(rec, ["sklearn"], params={"sklearn": {"model_path": str(probe)}},
                                   progress=step if known else None, telemetry=telemetry)
            runs.append((result, result.score_logs.get("sklearn", [])))
    chosen: dict[str, dict[str, Any]] = {}
    for event, entry in models.items():
        kind = EVENT_KINDS[event]
        # each recording's episode table and scopes, built once for every level scored on it
        scorers = [level_scorer(result, kind) for result, _ in runs]
        own = [threshold_sweep(result, logs, kind, score_at=score_at)[0]
               for (result, logs), score_at in zip(runs, scorers)]
        levels = sorted({level for tried in own for level, _ in tried})
        if not levels:
            continue
        # every recording scored at every level any of them proposed
        scored = [dict(tried) if len(runs) == 1 else dict(threshold_sweep(result, logs, kind, levels, score_at)[0])
                  for tried, (result, logs), score_at in zip(own, runs, scorers)]
        pooled = {level: _pooled([by_level[level] for by_level in scored]) for level in levels}
        pooled = _refined(pooled, runs, scorers, kind, target_precision)
        levels, figures = list(pooled), list(pooled.values())
        held = [(lv, f) for lv, f in zip(levels, figures) if f["precision"] is not None and f["precision"] >= target_precision]
        reached = bool(held)
        candidates = held or [(lv, f) for lv, f in zip(levels, figures) if f["precision"] is not None]
        if not candidates:  # no level predicted anything there: the training's cut stands
            chosen[event] = {"threshold": entry["threshold"], "reached": False, "recall": None, "precision": None}
            continue
        rank = (lambda c: (c[1]["recall"] or 0.0, c[1]["precision"])) if reached else \
            (lambda c: (c[1]["precision"], c[1]["recall"] or 0.0))
        level, best = max(candidates, key=rank)
        # a model file's threshold lies strictly between 0 and 1
        entry["threshold"] = float(min(max(level, 1e-6), np.nextafter(1.0, 0.0)))
        chosen[event] = {"threshold": entry["threshold"], "reached": reached, "recall": best["recall"],
                         "precision": best["precision"]}
    return chosen


def _refined(pooled: dict[float, dict[str, Any]], runs: Sequence[tuple[RunResult, Sequence[ScoreLog]]],
             scorers: Sequence[LevelScorer], kind: EventKind, target_precision: float) -> dict[float, dict[str, Any]]:
    """``pooled`` with the levels between the quantile grid's that reach ``target_precision``
    (:func:`refine_crossings`, over the scores of every recording), each scored on every one
    (``scorers``: each run's :func:`level_scorer`)."""
    columns = []
    for _, logs in runs:
        found = [(log, col) for log in logs for col, events in enumerate(log.columns) if kind.prediction in events]
        if len(found) != 1:  # no column, or several not on one scale: the grid stands
            return pooled
        columns.append(found[0])

    def score(level: float) -> dict[str, Any]:
        return _pooled([score_at(log, col, level) for score_at, (log, col) in zip(scorers, columns)])

    candidates = np.unique(np.concatenate([usable_scores(logs, kind) for _, logs in runs]))
    return refine_crossings(pooled, lambda f: f["precision"] is not None and f["precision"] >= target_precision,
                            candidates, score)


def _pooled(per_recording: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One level's figures over several recordings: the recall of all their episodes and the worst
    precision among those with a judged alarm (None where none has one)."""
    episodes = sum(m["episodes"] for m in per_recording if m["recall"] is not None)
    hits = sum(m["recall"] * m["episodes"] for m in per_recording if m["recall"] is not None)
    judged = [m["precision"] for m in per_recording if m["precision"] is not None]
    worst = min(judged) if judged else None
    return {"recall": round(hits / episodes, 4) if episodes else None, "precision": worst}


def train_and_save(paths: Sequence[str | Path], out: str | Path, events: Sequence[str] = ("thermal_throttle", "power_cap"),
                   negative_fraction: float = 0.05, seed: int = 0,
                   progress: Callable[[str, float], None] | None = None,
                   telemetry: Sequence[str] | None = None, calibration: Sequence[str | Path] = (),
                   target_precision: float = CALIBRATION_PRECISION) -> tuple[Path, dict[str, Any]]:
    unknown = [e for e in events if e not in learnable_events()]
    if unknown:  # (a link's event, link_down, has no GPU feature row to be labelled on)
        raise ValueError(f"cannot learn events {unknown}; a model learns a GPU's events: {list(learnable_events())}")
    trained = {Path(p).resolve() for p in paths}
    for held_out in calibration:
        if Path(held_out).resolve() in trained:
            raise ValueError(f"calibration recording {held_out} is one of the training recordings: calibrate on "
                             "recordings the model has not seen")
    data = build_dataset(paths, events, negative_fraction, seed, progress, telemetry)
    models = train(data, events, seed)
    calibrated = (calibrate(models, calibration, telemetry, data.telemetry, target_precision, progress)
                  if calibration else {})
    import sklearn

    summary = {e: {k: v for k, v in m.items() if k != "model"} for e, m in models.items()}
    for e, c in calibrated.items():
        summary[e]["calibrated"] = {k: c[k] for k in ("reached", "recall", "precision")}
    meta = {"recordings": data.recordings, "sklearn": sklearn.__version__, "seed": seed, "summary": summary,
            "events_unknown_entity": data.events_unknown_entity, MODEL_TELEMETRY_KEY: data.telemetry}
    if calibration:
        meta["calibration"] = {"recordings": [str(p) for p in calibration], "target_precision": target_precision}
    return save_model(out, models, meta), summary
