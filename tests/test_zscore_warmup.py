"""robust_zscore's warm-up (the first ``warmup`` samples of a series, and those after each alarm) learns
its level and scale while it cannot alarm: one glitch in it must not widen the scale enough to hide a
real step afterwards. The expected samples are the step's own (set by the data), not the detector's.
That the winsorising stays far enough out to learn a loaded GPU's power rhythm is
tests/test_kernels_pipeline.py::test_ewma_cusum_learns_a_noisy_series_scale_in_its_warm_up."""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors.ewma_cusum import RobustZScoreDetector
from foreshock.frames import Frame
from foreshock.topology import Topology

pytestmark = pytest.mark.kernel

TOPO = Topology.from_gpu_hosts([("n0", 0)])
# detection within this many samples of a step's start: at the series' true sigma the CUSUM (threshold
# 40) passes a 40 W drop on 1.5 W noise (~27 sigma) at its second sample and a +3 degC step on 0.5 degC
# noise (6 sigma) in ~8; 20 leaves room for the somewhat looser sigma a glitch still leaves, far below
# the 40 to hundreds of samples (or never) it had taken
PROMPT = 20


def _poll(field: str, t: float, value: float) -> Frame:
    """One GPU's reading at ``t``, as a frame of one row."""
    return Frame("gpu", np.array([float(t)]), np.zeros(1, np.int32), {field: np.array([value])})


def _found(field: str, base: float, noise: float, shift: float, step_at: int, glitches: dict[int, float],
           n: int = 1500) -> list[int]:
    """Sample indices of the anomalies, one poll per frame as a live pipeline feeds the detector."""
    rng = np.random.default_rng(1)
    x = base + rng.normal(0, noise, n)
    x[step_at:] += shift
    for at, value in glitches.items():
        x[at] = value
    det = RobustZScoreDetector(TOPO, fields=(field,))
    out: list[int] = []
    for t in range(n):
        out += [int(f.ts) for f in det.update(_poll(field, t, x[t]))]
    return out


@pytest.mark.parametrize("step_at", [100, 150, 200])
@pytest.mark.parametrize("field, base, noise, shift, glitch", [
    ("power", 690.0, 1.5, -40.0, 0.0),    # a 0 W read on a loaded GPU, then a sustained 40 W drop
    ("gpu_temp", 50.0, 0.5, 3.0, 0.0),    # a 0 degC read, then a +3 degC (6 sigma) step
])
def test_a_glitch_in_the_first_warm_up_does_not_hide_a_later_step(field, base, noise, shift, glitch,
                                                                  step_at) -> None:
    """Sample 30 is inside the first 60-sample warm-up, where the series cannot alarm. Learnt unclipped,
    the 0 read widened the scale several times: the 40 W drop at 100 was never reported, at 150
    37 samples late."""
    found = _found(field, base, noise, shift, step_at, {30: glitch})
    assert len(found) == 1 and step_at <= found[0] < step_at + PROMPT, found


@pytest.mark.parametrize("field, base, noise, shift", [
    ("power", 690.0, 1.5, -40.0),
    ("gpu_temp", 50.0, 0.5, 3.0),
])
def test_a_second_glitch_in_the_relearning_window_does_not_hide_a_later_step(field, base, noise, shift) -> None:
    """The first 0 read (600) alarms and the regime is re-learnt from 601; the second (630) falls in
    that re-learning window, which cannot alarm. Learnt unclipped, it hid the drop at 700 for good."""
    found = _found(field, base, noise, shift, 700, {600: 0.0, 630: 0.0})
    assert found[0] == 600, found  # the first glitch is itself an anomaly
    assert len(found) == 2 and 700 <= found[1] < 700 + PROMPT, found

