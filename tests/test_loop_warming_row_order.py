"""The loop-warming detector (and every detector on the shared feature stream: the threshold rule,
river's HalfSpaceTrees, the scikit-learn model) judges a frame holding several polls poll by poll,
however the frame lists its rows (``FeatureStream._in_time_order``).

The inlet it reads where a rack reports none is judged across GPUs as the feature stream meets the
rows: each node's proxy is the coolest of its GPUs over a tick, closed at the node's first row of a
newer one, and the rack's is the median of its nodes'. A frame of two polls listed by GPU closed each
node's tick on its first GPU's row alone and gathered the others' older rows into the newer tick, so
the same telemetry called a cooling loss at other times than fed poll by poll (until 2026-12-05).
"""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors import loop_warming as lw
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology
from test_loop_warming import simulated_cooling_loss

LATE = "gpu samples out of time order"
LATE_GPU = 5  # in every fifth pair of polls its host's clock steps back 1 s: its second row is late
LATE_EVERY = 5


@pytest.fixture(scope="module")
def cooling_loss() -> tuple[Topology, list[Frame], dict[int, float]]:
    """The simulator's cooling loss on 64 GPUs (8 nodes, 2 racks), GPU frames alone (no rack inlet:
    the detector reads the nodes' proxies)."""
    return simulated_cooling_loss(64)


def _with_late_rows(frames: list[Frame]) -> list[Frame]:
    """``frames`` (one poll each), LATE_GPU's row of every LATE_EVERY-th pair's second poll stamped
    1 s before its row of the first: a row the detector must skip and count, wherever it stands."""
    out = []
    for k, f in enumerate(frames):
        if k % 2 and (k // 2) % LATE_EVERY == 0:
            f = f.take(np.arange(len(f)))  # (a copy)
            f.ts[f.slot == LATE_GPU] = frames[k - 1].ts[frames[k - 1].slot == LATE_GPU] - 1.0
        out.append(f)
    return out


def _by_gpu(pair: list[Frame]) -> Frame:
    """The two polls as one frame, listed GPU by GPU, each GPU's rows as the polls came."""
    f = Frame.concat(pair)
    return f.take(np.argsort(f.slot, kind="stable"))


def _feed(topology: Topology, frames: list[Frame]) -> tuple[list[tuple], lw.LoopWarmingDetector]:
    det = lw.LoopWarmingDetector(topology)
    found = [(p.ts, p.slot, p.active, p.eta_s, p.reason) for f in frames for p in det.update(f)
             if isinstance(p, Prediction)]
    return found, det


@pytest.mark.parametrize("late", [False, True], ids=["polls", "with-late-rows"])
def test_two_polls_in_one_frame_listed_by_gpu_read_as_the_polls_one_by_one(
        cooling_loss: tuple[Topology, list[Frame], dict[int, float]], late: bool) -> None:
    """Paired into frames listed by GPU, the polls give the findings, baselines, node proxies and
    late-row count that they give fed one frame each. Before 2026-12-05 the paired feed called 51 of
    the 64 GPUs first at other times and made 11 more active predictions. A late row (its GPU's
    clock stepping back) stays late: it is not sorted in ahead of its GPU's newer row."""
    topology, frames, onsets = cooling_loss
    if late:
        frames = _with_late_rows(frames)
    one_by_one, alone = _feed(topology, frames)
    paired, together = _feed(topology, [_by_gpu(frames[k:k + 2]) for k in range(0, len(frames) - 1, 2)])
    # the scenario is one the detector calls: most GPUs that throttled are warned of a minute ahead
    first = {s: t for t, s, active, _, _ in reversed(one_by_one) if active}
    assert sum(1 for g, t in onsets.items() if first.get(g, np.inf) < t - 60.0) >= 0.8 * len(onsets)
    assert paired == one_by_one
    assert np.array_equal(together.s_base, alone.s_base, equal_nan=True)
    assert np.array_equal(together.s_node, alone.s_node, equal_nan=True)
    skipped = {det.health.problems.get((det.name, LATE), 0) for det in (alone, together)}
    assert skipped == {len(frames) // 2 // LATE_EVERY if late else 0}


def test_the_feature_stream_reads_two_polls_listed_by_gpu_as_the_polls(
        cooling_loss: tuple[Topology, list[Frame], dict[int, float]]) -> None:
    """The threshold rule, river's HalfSpaceTrees and the scikit-learn model read the same stream:
    each row's features (the inlet, its slope, the die over it) are those of the polls fed one by
    one, whatever order the frame lists them in."""
    from foreshock.detectors.baselines import FeatureStream
    from foreshock.health import PipelineHealth

    topology, frames, _ = cooling_loss

    def rows(feeds: list[Frame]) -> tuple[dict[tuple[float, int], list[float]], FeatureStream]:
        stream = FeatureStream(topology, PipelineHealth(), "test")
        out = {}
        for f in feeds:
            obs, feats = stream.features(f)
            out.update({(t, int(s)): v for t, s, v in zip(obs[:, 0].tolist(), obs[:, 1].tolist(), feats.tolist())})
        return out, stream

    frames = frames[:len(frames) // 2 * 2]  # whole pairs
    one_by_one, alone = rows(frames)
    paired, together = rows([_by_gpu(frames[k:k + 2]) for k in range(0, len(frames), 2)])
    assert sorted(paired) == sorted(one_by_one) and len(paired) == sum(len(f) for f in frames)
    assert np.array_equal(np.array([paired[k] for k in sorted(one_by_one)]),
                          np.array([one_by_one[k] for k in sorted(one_by_one)]), equal_nan=True)
    assert np.array_equal(together.s_node, alone.s_node, equal_nan=True)
