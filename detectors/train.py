"""Offline training of the scikit-learn baseline: "will this GPU see EVENT within H seconds?"

For every GPU sample of the training recordings the shared feature stream
(:class:`foreshock.detectors.baselines.FeatureStream`, the one the detector runs) gives the
features; the label is 1 when an episode of the event (scored exactly as the evaluation
harness scores it: :data:`foreshock.detectors.evaluation.EVENT_KINDS`) starts on that GPU
within the horizon, 0 otherwise. Samples taken while the event is already under way are left
out: they teach nothing about predicting it. Negatives are subsampled.

One ``HistGradientBoostingClassifier`` per event; its alarm threshold is the probability that
maximises F1 on a held-out fifth of the samples. The result is written with
:func:`~foreshock.detectors.baselines.save_model` (skops, feature list, format version).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.recording import Recording

from .baselines import FEATURES, FeatureStream, save_model
from .evaluation import EVENT_KINDS, aligned_frames, episodes


@dataclass
class Dataset:
    features: np.ndarray
    labels: dict[str, np.ndarray]  # event -> 0/1 (NaN: sample not usable for that event)
    recordings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.features)


SLOT_SCALE = 1e9
"""Episodes of all GPUs live in one sorted key space: ``slot * SLOT_SCALE + (t - t0)``."""


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


def label_rows(ts: np.ndarray, slot: np.ndarray, index: EpisodeIndex, horizon: float) -> np.ndarray:
    """1 if an episode starts on the slot within (t, t + horizon], NaN while one is under way, else 0."""
    key = slot.astype(float) * SLOT_SCALE + (ts - index.t0)
    y = np.zeros(len(ts))
    if not len(index.starts):
        return y
    k = np.searchsorted(index.starts, key, side="right")
    nxt = index.starts[np.minimum(k, len(index.starts) - 1)]
    same = (k < len(index.starts)) & (np.floor(nxt / SLOT_SCALE) == slot)
    y[same & (nxt - key <= horizon)] = 1.0
    prev = k - 1
    ok = prev >= 0
    p = np.maximum(prev, 0)
    during = ok & (np.floor(index.starts[p] / SLOT_SCALE) == slot) & (key <= index.ends[p])
    y[during] = np.nan
    return y


def build_dataset(paths: Sequence[str | Path], events: Sequence[str], negative_fraction: float = 0.05,
                  seed: int = 0, progress: Callable[[str, float], None] | None = None) -> Dataset:
    rng = np.random.default_rng(seed)
    feats: list[np.ndarray] = []
    labels: dict[str, list[np.ndarray]] = {e: [] for e in events}
    for path in paths:
        rec = Recording.open(path)
        topo = rec.topology
        evs = rec.events()
        start = rec.meta.get("start")
        end = rec.meta.get("end")
        t0 = float(start) if start is not None else 0.0
        marks = {e: EpisodeIndex.build([(topo.slot("gpu", ep.entity), ep.start, ep.end)
                                        for ep in episodes(evs, EVENT_KINDS[e])], t0) for e in events}
        stream = FeatureStream(topo, PipelineHealth(), "train")
        for frame in aligned_frames(rec, ("gpu", "rack")):
            if frame.kind == "rack":
                stream.observe_rack(frame)
                continue
            obs, x = stream.features(frame)
            if not len(obs):
                continue
            ys = {e: label_rows(obs[:, 0], obs[:, 1].astype(np.int64), marks[e], EVENT_KINDS[e].horizon_s)
                  for e in events}
            any_pos = np.zeros(len(obs), bool)
            for y in ys.values():
                any_pos |= y == 1
            keep = np.isfinite(x[:, 0]) & (any_pos | (rng.random(len(obs)) < negative_fraction))
            feats.append(x[keep])
            for e in events:
                labels[e].append(ys[e][keep])
            if progress is not None and start is not None and end is not None and end > start:
                progress(str(path), (float(obs[-1, 0]) - start) / (end - start))
    return Dataset(np.concatenate(feats) if feats else np.empty((0, len(FEATURES))),
                   {e: np.concatenate(v) if v else np.empty(0) for e, v in labels.items()},
                   [str(p) for p in paths])


def best_f1_threshold(p: np.ndarray, y: np.ndarray) -> float:
    """The probability cut that maximises F1 on (p, y); 0.5 when there are no positives."""
    if not len(y) or y.sum() == 0:
        return 0.5
    order = np.argsort(-p)
    ys = y[order]
    tp = np.cumsum(ys)
    fp = np.cumsum(1 - ys)
    f1 = 2 * tp / (tp + fp + ys.sum())
    k = int(np.argmax(f1))
    return float(min(max(p[order][k], 0.05), 0.95))


def train(dataset: Dataset, events: Sequence[str], seed: int = 0, max_iter: int = 200) -> dict[str, dict[str, Any]]:
    from sklearn.ensemble import HistGradientBoostingClassifier

    rng = np.random.default_rng(seed)
    models: dict[str, dict[str, Any]] = {}
    for e in events:
        y = dataset.labels[e]
        ok = np.isfinite(y)
        x, y = dataset.features[ok], y[ok].astype(int)
        if len(np.unique(y)) < 2:
            raise ValueError(f"no positive and negative samples for {e!r} in the training recordings "
                             f"({int(y.sum())} positives of {len(y)}); record faults that cause it")
        valid = rng.random(len(y)) < 0.2
        clf = HistGradientBoostingClassifier(max_iter=max_iter, learning_rate=0.1, random_state=seed,
                                             class_weight="balanced")
        clf.fit(x[~valid], y[~valid])
        threshold = best_f1_threshold(clf.predict_proba(x[valid])[:, 1], y[valid]) if valid.any() else 0.5
        clf.fit(x, y)  # final model on everything
        models[e] = {"model": clf, "horizon_s": float(EVENT_KINDS[e].horizon_s), "threshold": threshold,
                     "samples": int(len(y)), "positives": int(y.sum())}
    return models


def train_and_save(paths: Sequence[str | Path], out: str | Path, events: Sequence[str] = ("thermal_throttle", "power_cap"),
                   negative_fraction: float = 0.05, seed: int = 0,
                   progress: Callable[[str, float], None] | None = None) -> tuple[Path, dict[str, Any]]:
    unknown = [e for e in events if e not in EVENT_KINDS]
    if unknown:
        raise ValueError(f"unknown events {unknown}; known: {sorted(EVENT_KINDS)}")
    data = build_dataset(paths, events, negative_fraction, seed, progress)
    models = train(data, events, seed)
    import sklearn

    summary = {e: {k: v for k, v in m.items() if k != "model"} for e, m in models.items()}
    meta = {"recordings": data.recordings, "sklearn": sklearn.__version__, "seed": seed, "summary": summary}
    return save_model(out, models, meta), summary
