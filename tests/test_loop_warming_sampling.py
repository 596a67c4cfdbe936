"""The loop-warming detector reads 1-s sampling as it reads 10-s, and a GPU without an HBM sensor.

At 1 s the feature stream's per-sample power and the inlet its proxy implies (``T - R_nominal * P``)
carry a job's 3-9 s power steps: the power's slope ran at 75 W/min (median) and the inlet swung by
several °C, so no row of a simulated cooling loss passed the steady test that gates the baseline, and
11 of its 54 throttles were called against 56 of 56 at 5, 10 and 30 s (an audit, 2026-12-05). A GPU
that reports no HBM temperature (``DCGM_FI_DEV_MEMORY_TEMP`` not supported, dropped) read as "HBM not
rising": none of the 56 was called.
"""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors import loop_warming as lw
from foreshock.detectors.baselines import FEATURES
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology

from test_loop_warming import simulated_cooling_loss
from thermal_synth import small_topology

F = {name: i for i, name in enumerate(FEATURES)}
LEAD_S = 60.0  # a warning counts when it comes at least this long before the GPU's throttle


def _cooling_loss(interval: float) -> tuple[Topology, list[Frame], dict[int, float]]:
    """The simulator's cooling loss on 64 GPUs, an hour sampled every ``interval`` s (seed 7)."""
    return simulated_cooling_loss(64, seed=7, interval=interval)


@pytest.fixture(scope="module", params=[1.0, 10.0], ids=["1s", "10s"])
def cooling_loss(request: pytest.FixtureRequest) -> tuple[Topology, list[Frame], dict[int, float]]:
    return _cooling_loss(request.param)


def _first_calls(det: lw.LoopWarmingDetector, frames: list[Frame]) -> dict[int, Prediction]:
    first: dict[int, Prediction] = {}
    for frame in frames:
        for p in det.update(frame):
            if isinstance(p, Prediction) and p.active:
                first.setdefault(p.slot, p)
    return first


def _assert_warned(first: dict[int, Prediction], onsets: dict[int, float]) -> None:
    """19 in 20 throttles warned a minute or more ahead, five minutes ahead at the median (the
    detector's figures here: 56 of 56, 8 min, at 1 s and 10 s; before the means 48 of 56 at 1 s), and
    no GPU that never throttled called."""
    assert len(onsets) >= 40  # the scenario throttles the GPUs of the loop that loses flow
    assert set(first) <= set(onsets), "a GPU that never throttled was predicted to"
    leads = [onsets[g] - first[g].ts for g in onsets if g in first]
    assert sum(lead >= LEAD_S for lead in leads) >= 0.95 * len(onsets)
    assert np.median(leads) >= 300.0


def test_a_cooling_loss_is_warned_of_alike_at_1_s_and_10_s_sampling(cooling_loss) -> None:
    topology, frames, onsets = cooling_loss
    first = _first_calls(lw.LoopWarmingDetector(topology), frames)
    _assert_warned(first, onsets)
    assert all("HBM" not in p.reason for p in first.values())  # every GPU here reads its HBM


def test_a_checkpoint_saved_before_the_means_loads_and_still_warns(cooling_loss) -> None:
    """A state saved with the three baseline columns alone (before the power's and inlet's means):
    its means start over from the next readings, and the loss is still warned of."""
    topology, frames, onsets = cooling_loss
    t0 = float(frames[0].ts.min())
    early = [f for f in frames if float(f.ts.max()) < t0 + 300.0]  # the loss starts at 350 s
    saved = lw.LoopWarmingDetector(topology)
    for frame in early:
        saved.update(frame)
    state = saved.state_dict()
    state["s_base"] = np.asarray(state["s_base"])[:, :3].copy()
    det = lw.LoopWarmingDetector(topology)
    det.load_state_dict(state)
    assert det.s_base.shape == (topology.size("gpu"), lw.B_SIZE)
    _assert_warned(_first_calls(det, frames[len(early):]), onsets)


def test_gpus_without_an_hbm_temperature_are_warned_of() -> None:
    """The hour at 10 s with every GPU's HBM temperature missing: judged on the die and the inlet,
    and the reason says so."""
    topology, frames, onsets = _cooling_loss(10.0)
    no_hbm = [Frame("gpu", f.ts, f.slot, {**f.columns, "hbm_temp": np.full(len(f), np.nan)}) for f in frames]
    first = _first_calls(lw.LoopWarmingDetector(topology), no_hbm)
    _assert_warned(first, onsets)
    assert all("no HBM temperature read" in p.reason for p in first.values())


def _features(n: int, inlet: float, hbm_temp: float, hbm_slope: float) -> np.ndarray:
    """A GPU at work at 600 W: the inlet it reads, its die rising 1.5 °C/min 30 °C under its limit."""
    x = np.zeros((n, len(FEATURES)))
    x[:, F["inlet_c"]] = inlet
    x[:, F["util"]] = 1.0
    x[:, F["power_w"]] = 600.0
    x[:, F["temp_slope_c_per_min"]] = 1.5
    x[:, F["hbm_temp"]] = hbm_temp
    x[:, F["hbm_slope_c_per_min"]] = hbm_slope
    x[:, F["core_margin_c"]] = 30.0
    return x


@pytest.mark.parametrize("dark_from_s, called", [(0.0, True), (np.inf, False), (1800.0, False)],
                         ids=["never-read", "read-not-rising", "dark-from-the-loss"])
def test_the_hbm_condition_is_left_out_only_where_no_hbm_is_read(dark_from_s: float, called: bool) -> None:
    """Half an hour of steady work at a 21.3 °C inlet, then the inlet rising 1 °C/min for 5 min with
    the die, the HBM's slope 0 (NaN where it was never read). A GPU that never read its HBM is judged
    without it and called; one whose HBM reads and does not rise is not (the HBM's condition kept),
    nor one whose HBM went dark as the inlet started rising (read within the last ten minutes: the
    stream holds its last slope)."""
    det = lw.LoopWarmingDetector(small_topology(nodes=1, gpus=2, racks=1))
    found: list[Prediction] = []
    t = 0.0
    for k in range(210):
        t += 10.0
        ramp = max(k - 179, 0) / 6.0  # from 1800 s
        hbm = 60.0 if t < dark_from_s else np.nan
        feats = _features(2, 21.3 + ramp, hbm, np.nan if dark_from_s == 0.0 else 0.0)
        found += [p for p in det._decide(np.column_stack([np.full(2, t), np.arange(2.0)]), feats)
                  if isinstance(p, Prediction) and p.active]
    assert ({p.slot for p in found} == {0, 1}) is called
    assert all("no HBM temperature read" in p.reason for p in found)
