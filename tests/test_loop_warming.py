"""The opt-in cooling-loss warning from GPU telemetry alone (``loop_warming``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import loop_warming as lw
from foreshock.detectors.baselines import FEATURES, ScoredBaseline
from foreshock.findings import Prediction

from thermal_synth import small_topology

F = {name: i for i, name in enumerate(FEATURES)}


def simulated_cooling_loss(gpus: int, seed: int = 1, interval: float = 10.0):
    """The simulator's cooling-loss scenario (one CDU loses flow over 15 min) on ``gpus`` GPUs, an
    hour sampled every ``interval`` s: its GPU frames alone, one poll each, and when each GPU first
    throttled."""
    from foreshock.simulator import ClusterSimulator

    sim = ClusterSimulator(gpus=gpus, scenario="cooling-loss", seed=seed, interval=interval, duration=3600)
    frames = [f for tick in sim.iter_ticks(3600) for f in tick if f.kind == "gpu"]
    onsets: dict[int, float] = {}
    for e in sim.events:
        if e.type == "thermal_throttle_start":
            onsets.setdefault(sim.topology.gpus.index(e.entity), e.time)
    return sim.topology, frames, onsets


@pytest.fixture(scope="module")
def cooling_loss():
    """The cooling loss on 256 GPUs (2 loops)."""
    return simulated_cooling_loss(256)


def _first_calls(det, frames) -> dict[int, float]:
    first: dict[int, float] = {}
    for frame in frames:
        for p in det.update(frame):
            if isinstance(p, Prediction) and p.event == "thermal_throttle" and p.active:
                first.setdefault(p.slot, p.ts)
    return first


def test_gpu_telemetry_alone_warns_of_a_cooling_loss_five_minutes_ahead(cooling_loss):
    """From the GPUs' frames alone the thermal detector warns ~2-3 minutes ahead; the inlet they
    imply, rising over its baseline while the dies climb, gives five or more, and no GPU that
    never throttled is called."""
    from foreshock.detectors.thermal import ThermalDetector

    topo, frames, onsets = cooling_loss
    assert len(onsets) >= 64
    warm = _first_calls(lw.LoopWarmingDetector(topo), frames)
    thermal = _first_calls(ThermalDetector(topo), frames)
    assert set(warm) <= set(onsets), "a GPU that never throttled was predicted to"
    leads = [onsets[g] - warm[g] for g in onsets if g in warm and warm[g] < onsets[g]]
    alone = [onsets[g] - thermal[g] for g in onsets if g in thermal and thermal[g] < onsets[g]]
    assert len(leads) >= 0.9 * len(onsets)
    assert np.median(leads) >= 300 and np.median(leads) >= np.median(alone) + 120


def _features(n: int, inlet, util, inlet_slope=0.0, die_slope=0.0, power_slope=0.0) -> np.ndarray:
    x = np.zeros((n, len(FEATURES)))
    x[:, F["inlet_c"]] = inlet
    x[:, F["util"]] = util
    x[:, F["inlet_slope_c_per_min"]] = inlet_slope
    x[:, F["temp_slope_c_per_min"]] = die_slope
    x[:, F["hbm_slope_c_per_min"]] = die_slope
    x[:, F["power_slope_w_per_min"]] = power_slope
    x[:, F["core_margin_c"]] = 30.0
    return x


def _obs(ts: float, n: int) -> np.ndarray:
    return np.column_stack([np.full(n, ts), np.arange(n, dtype=float)])


def test_the_baseline_is_learnt_at_steady_work_not_idle():
    """Idle, the inlet the GPUs imply reads ~4 °C low (17.6 against 21.3 °C on seed 34): learnt
    from idle readings, every job start read as a 4 °C rise with the dies climbing. And a die
    climbing far faster than the inlet is work starting, not coolant warming (seed 34's node96)."""
    det = lw.LoopWarmingDetector(small_topology(nodes=1, gpus=4, racks=1))
    t = 0.0
    for _ in range(60):  # an hour idle
        t += 60.0
        assert det._decide(_obs(t, 4), _features(4, 17.6, 0.0)) == []
    t += 60.0  # the job starts: the inlet read 3.7 °C higher, power, dies and inlet climbing
    start = _features(4, 21.3, 1.0, inlet_slope=1.0, die_slope=2.5, power_slope=55.0)
    assert det._decide(_obs(t, 4), start) == [] and det._decide(_obs(t + 10, 4), start) == []
    for _ in range(30):  # steady work: the baseline is learnt at 21.3 °C
        t += 60.0
        det._decide(_obs(t, 4), _features(4, 21.3, 1.0))
    assert np.allclose(det.s_base[:, lw.B_LEVEL], 21.3)
    for k in range(12):  # work starting on the node beside: the inlet 2.4 °C up, the die ten times faster
        t += 5.0
        assert det._decide(_obs(t, 4), _features(4, 23.7, 1.0, inlet_slope=1.4, die_slope=12.5)) == []
    for _ in range(10):  # ... and back at 21.3 °C
        t += 60.0
        assert det._decide(_obs(t, 4), _features(4, 21.3, 1.0)) == []
    found = []
    for k in range(30):  # the loop losing flow: the inlet rising 1 °C/min for 5 min (to 26.3 °C), the dies too
        t += 10.0
        found += det._decide(_obs(t, 4), _features(4, 21.3 + (k + 1) / 6.0, 1.0, inlet_slope=1.0, die_slope=1.5))
    assert {p.slot for p in found if p.active} == {0, 1, 2, 3}
    assert all(p.eta_s == pytest.approx(30.0 / 1.5 * 60.0) for p in found)  # the margin at the die's rate
    # called once its mean inlet (lagging the ramp by smooth_s) stands rise_on_c (2 °C) over 21.3 °C
    assert " °C over its usual 21.3 °C" in found[0].reason and found[0].reason.startswith("the inlet it reads is 2.")
    # the inlet stops rising: after the hold the predictions are withdrawn, saying why
    gone = []
    for k in range(40):
        gone += det._decide(_obs(t + 10 * (k + 1), 4), _features(4, 26.3, 1.0))
    assert {p.slot for p in gone if not p.active} == {0, 1, 2, 3}
    assert all("no longer rising" in p.reason for p in gone)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(15.0, 40.0), st.sampled_from([0.0, 1.0]), st.floats(-1.0, 3.0),
                          st.floats(-1.0, 3.0), st.floats(-60.0, 60.0)), min_size=3, max_size=30),
       st.integers(1, 5))
def test_a_frame_of_several_ticks_reads_as_its_ticks_one_by_one(rows, batch):
    """A frame may hold several ticks of one GPU (a replay's batch): each GPU's baseline steps
    through its own rows in order, so the findings are those of the ticks fed one at a time."""
    topo = small_topology(nodes=1, gpus=3, racks=1)
    ticks = [(60.0 * (k + 1), _features(3, inlet + np.arange(3), util, inlet_slope=u, die_slope=d, power_slope=p))
             for k, (inlet, util, u, d, p) in enumerate(rows)]
    one = lw.LoopWarmingDetector(topo)
    expected = [f for ts, x in ticks for f in one._decide(_obs(ts, 3), x)]
    many = lw.LoopWarmingDetector(topo)
    got = []
    for i in range(0, len(ticks), batch):
        part = ticks[i:i + batch]
        got += many._decide(np.concatenate([_obs(ts, 3) for ts, _ in part]), np.concatenate([x for _, x in part]))
    assert got == expected
    np.testing.assert_array_equal(many.s_base, one.s_base)


def test_state_round_trip_gives_identical_future_output(cooling_loss):
    topo, frames, _ = cooling_loss
    a = lw.LoopWarmingDetector(topo)
    half = len(frames) // 2
    for frame in frames[:half]:
        a.update(frame)
    b = lw.LoopWarmingDetector(topo)
    b.load_state_dict(a.state_dict())
    assert [a.update(f) for f in frames[half:]] == [b.update(f) for f in frames[half:]]


def test_it_is_not_a_scored_baseline_and_refuses_unknown_parameters():
    """The evaluation sweeps a baseline's threshold ("matched"); this is foreshock's own detector."""
    topo = small_topology(nodes=1, gpus=2, racks=1)
    assert not isinstance(lw.LoopWarmingDetector(topo), ScoredBaseline)
    with pytest.raises(ValueError, match="unknown parameters"):
        lw.LoopWarmingDetector(topo, rise_c=3.0)


def test_detectors_default_names_the_standard_bank_so_an_opt_in_one_is_added_to_it():
    from foreshock.cli.common import detector_names
    from foreshock.detectors.bank import DetectorBank
    from foreshock.detectors.registry import DEFAULT_BANK

    assert detector_names(None) is None and detector_names("") is None
    assert detector_names("default,loop_warming") == [*DEFAULT_BANK, "loop_warming"]
    assert detector_names("thermal,default") == ["thermal", *[d for d in DEFAULT_BANK if d != "thermal"]]
    bank = DetectorBank.from_names(small_topology(nodes=1, gpus=2, racks=1), detector_names("default,loop_warming"))
    assert [d.name for d in bank.detectors][-1] == "loop_warming" and len(bank.detectors) == len(DEFAULT_BANK) + 1


def test_replay_runs_the_standard_bank_with_the_opt_in_detector(tmp_path):
    """``--detectors default,loop_warming`` on a command: the bank's findings carry both."""
    from click.testing import CliRunner

    from foreshock.cli.main import cli

    rec = tmp_path / "rec"
    sim = CliRunner().invoke(cli, ["simulate", "--scenario", "cooling-loss", "--gpus", "16", "--duration", "3600",
                                   "--interval", "10", "--seed", "1", "--out", str(rec)])
    assert sim.exit_code == 0, sim.output
    out = tmp_path / "f.jsonl"
    run = CliRunner().invoke(cli, ["replay", str(rec), "--max", "--port", "0", "--findings", str(out),
                                   "--detectors", "default,loop_warming"])
    assert run.exit_code == 0, run.output
    import json

    detectors = {json.loads(line).get("detector") for line in out.read_text().splitlines()}
    assert "loop_warming" in detectors and "thermal" in detectors


def _rack_at_power(r_scale: float, step_at: float, inlet_rise_c_per_s: float = 0.0) -> list:
    """One rack of 32 GPUs, GPU telemetry alone, one job at 450 W that steps to 700 W at
    ``step_at`` (its next phase, or the next job); the boards' R ``r_scale`` times the nominal, the
    coolant rising ``inlet_rise_c_per_s`` from the second hour."""
    from foreshock.frames import Frame

    topo = small_topology(nodes=4, gpus=8, racks=1)
    n, rng = topo.size("gpu"), np.random.default_rng(0)
    r = 0.046 * r_scale * (1 + 0.03 * rng.standard_normal(n))
    r_hbm = 0.028 * r_scale * np.ones(n)
    temp, hbm, det, found = 25.0 + r * 450.0, 25.0 + r_hbm * 450.0, lw.LoopWarmingDetector(topo), []
    for t in np.arange(0.0, 3 * 3600.0, 10.0):
        inlet = 25.0 + inlet_rise_c_per_s * max(t - 3600.0, 0.0)
        power = np.full(n, 450.0 if t < step_at else 700.0) + rng.normal(0, 3, n)
        temp += (inlet + r * power - temp) * (1 - np.exp(-10.0 / 25.0))
        hbm += (inlet + r_hbm * power - hbm) * (1 - np.exp(-10.0 / 80.0))
        found += det.update(Frame("gpu", np.full(n, t), np.arange(n), {
            "gpu_temp": np.round(temp), "hbm_temp": np.round(hbm), "power": power, "util": np.ones(n)}))
    return [f for f in found if isinstance(f, Prediction) and f.active]


@pytest.mark.parametrize("r_scale", [1.2, 1.4])
def test_a_rack_stepping_up_in_power_on_boards_over_nominal_r_is_no_warming_loop(r_scale: float) -> None:
    """The inlet the GPUs' proxy implies (T - R_nominal·P) moves with the power where the boards'
    R is not the nominal (air-cooled, older boards): a whole rack's job stepping 450 -> 700 W read
    as its loop losing flow, every GPU predicted (an audit, 2026-12-04). A baseline is for one power."""
    assert _rack_at_power(r_scale, step_at=5400.0) == []


def test_a_loop_warming_at_steady_power_on_such_boards_is_still_predicted() -> None:
    assert len({f.slot for f in _rack_at_power(1.2, step_at=1e9, inlet_rise_c_per_s=0.01)}) >= 16


def test_a_poll_without_the_die_temperature_gives_a_finite_eta(cooling_loss):
    """The slopes are held over a poll that misses the die's reading, so the row still scores; its
    ETA was NaN (margin unknown), exported as "no finite forecast" and kept by the store as a
    finding that never lapses. It is the horizon now, and the reason says the die was not read."""
    from foreshock.frames import Frame

    topo, frames, _ = cooling_loss
    det = lw.LoopWarmingDetector(topo)
    unread = []
    for k, frame in enumerate(frames):
        if k % 3 == 2:  # every third poll, the exporter misses the die temperature
            frame = Frame("gpu", frame.ts, frame.slot, {**frame.columns, "gpu_temp": np.full(len(frame), np.nan)})
        for p in det.update(frame):
            if isinstance(p, Prediction) and p.active and k % 3 == 2:
                unread.append(p)
    assert unread, "no prediction on a poll without the die's reading: the test shows nothing"
    assert all(np.isfinite(p.eta_s) and p.eta_s == det.params["horizon_s"] for p in unread)
    assert all("not read this poll" in p.reason for p in unread)
