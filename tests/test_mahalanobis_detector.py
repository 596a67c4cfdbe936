"""The ``mahalanobis`` pipeline detector: a GPU whose fields decouple (each normal alone) is
flagged once, naming the field that broke away; state round trip; missing values counted; opt-in
registration; and ``foreshock replay --detectors mahalanobis`` on a simulated recording."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.detectors import mahalanobis
from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.mahalanobis import FIELDS, MahalanobisDetector
from foreshock.detectors.registry import DEFAULT_BANK
from foreshock.findings import Anomaly
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

GPUS = 8
STEPS = 1500
BROKEN_GPU = 3
BREAK_AT = 1200


def coupled_stream(seed: int = 0, broken: tuple[slice, ...] = (slice(BREAK_AT, STEPS),)) -> dict[str, np.ndarray]:
    """(STEPS, GPUS) per field: power follows a load that jumps to a new level every minute;
    temperatures, clock and utilisation follow power. During ``broken`` (from BREAK_AT on by
    default), GPU 3's die temperature stops following: it stays at a low-load reading while
    power runs high — each value inside its own usual range, the pair not."""
    rng = np.random.default_rng(seed)
    levels = rng.uniform(250, 700, (STEPS // 60 + 1, GPUS))
    load = np.repeat(levels, 60, axis=0)[:STEPS]
    for span in broken:
        load[span, BROKEN_GPU] = 600.0
    power = load + rng.normal(0, 5, (STEPS, GPUS))
    gpu_temp = 30 + 0.04 * power + rng.normal(0, 0.5, (STEPS, GPUS))
    for span in broken:
        gpu_temp[span, BROKEN_GPU] = 30 + 0.04 * 350 + rng.normal(0, 0.5, gpu_temp[span, BROKEN_GPU].shape)
    return {
        "power": power,
        "gpu_temp": gpu_temp,
        "hbm_temp": 25 + 0.03 * power + rng.normal(0, 0.5, (STEPS, GPUS)),
        "sm_clock": 1.98e9 - 2e5 * (power - 250) + rng.normal(0, 5e6, (STEPS, GPUS)),
        "util": np.clip(0.5 + power / 1400 + rng.normal(0, 0.01, (STEPS, GPUS)), 0, 1),
        # counters that do not move: rate 0 (the variance floor keeps them harmless)
        "power_throttle_time": np.zeros((STEPS, GPUS)),
        "thermal_throttle_time": np.zeros((STEPS, GPUS)),
        "pcie_replays": np.full((STEPS, GPUS), 12.0),
    }


def frame_at(stream: dict[str, np.ndarray], t: int) -> Frame:
    return Frame("gpu", np.full(GPUS, 1_700_000_000.0 + t), np.arange(GPUS),
                 {name: values[t] for name, values in stream.items()})


def run(det: MahalanobisDetector, stream: dict[str, np.ndarray], steps: range) -> list:
    found = []
    for t in steps:
        found += det.update(frame_at(stream, t))
    return found


@pytest.fixture
def topo() -> Topology:
    return Topology.from_gpu_hosts([("n0", g) for g in range(GPUS)])


def test_decoupled_fields_are_flagged_once_with_the_field_that_broke_away(topo: Topology) -> None:
    stream = coupled_stream()
    found = run(MahalanobisDetector(topo), stream, range(STEPS))
    assert found, "the decoupled GPU was not flagged"
    assert all(isinstance(f, Anomaly) and f.detector == "mahalanobis" for f in found)
    assert {f.slot for f in found} == {BROKEN_GPU}, "only the decoupled GPU is anomalous"
    assert len(found) == 1, "one episode, one anomaly (not one per sample)"
    first = found[0]
    assert BREAK_AT <= first.ts - 1_700_000_000.0 < BREAK_AT + 10
    assert first.field == "gpu_temp"
    assert "gpu_temp" in first.reason and "below mean" in first.reason
    assert first.reason.count("%") == 3  # the top three fields with their shares

    # The univariate view does not see it: at the flagged sample each field is within 2.5
    # standard deviations of its own history, for both fields of the broken pair.
    t = int(first.ts - 1_700_000_000.0)
    for name in ("power", "gpu_temp"):
        history = stream[name][:BREAK_AT, BROKEN_GPU]
        z = abs(stream[name][t, BROKEN_GPU] - history.mean()) / history.std()
        assert z < 2.5, (name, z)


def test_a_sustained_break_re_arms_only_after_it_clears(topo: Topology) -> None:
    # broken for 100 s, healed for 500 s, broken again: two episodes, one anomaly each
    stream = coupled_stream(seed=1, broken=(slice(BREAK_AT - 600, BREAK_AT - 500), slice(BREAK_AT, STEPS)))
    found = run(MahalanobisDetector(topo), stream, range(STEPS))
    times = [f.ts - 1_700_000_000.0 for f in found]
    assert {f.slot for f in found} == {BROKEN_GPU}
    assert len(times) == 2 and BREAK_AT - 600 <= times[0] < BREAK_AT - 590 and BREAK_AT <= times[1] < BREAK_AT + 10


def test_a_break_that_outlasts_the_freeze_becomes_the_new_normal(topo: Topology) -> None:
    stream = coupled_stream()
    held, learnt = MahalanobisDetector(topo), MahalanobisDetector(topo, freeze_s=100)
    assert len(run(held, stream, range(STEPS))) == len(run(learnt, stream, range(STEPS))) == 1
    # frozen for the whole 300 s break, the default still holds the alarm; with a 100 s freeze the
    # model learnt the new relation, the episode ended and the detector re-armed
    assert held.models["gpu"].alarm[BROKEN_GPU, 0] == 1.0
    assert learnt.models["gpu"].alarm[BROKEN_GPU, 0] == 0.0


@pytest.mark.parametrize("split", [1000, BREAK_AT + 20])  # before the break; inside its episode
def test_state_round_trip_gives_identical_future_output(topo: Topology, split: int) -> None:
    stream = coupled_stream()
    a = MahalanobisDetector(topo)
    before = run(a, stream, range(split))
    b = MahalanobisDetector(topo)
    b.load_state_dict(a.state_dict())
    # the restored arrays are the ones the model computes with (loaded in place)
    assert b.models["gpu"].model.s_cov is b.s_gpu_cov  # type: ignore[attr-defined]
    rest = range(split, STEPS)
    found_a, found_b = run(a, stream, rest), run(b, stream, rest)
    assert found_a == found_b
    # before the break the anomaly is still to come; inside the episode, the restored alarm
    # (and frozen model) keep the restored detector from reporting it a second time
    assert (len(before), len(found_b)) == ((0, 1) if split < BREAK_AT else (1, 0))
    for key, value in a.state_dict().items():
        np.testing.assert_array_equal(value, b.state_dict()[key])
    fresh = MahalanobisDetector(topo)
    assert fresh.state_nbytes() == GPUS * 920 + 1 * (2 + 4 + 1 + 2 + 4) * 8  # 920 B per GPU; node: 2 fields


@pytest.mark.parametrize("cut", [599, 600, 601])  # before the low reading, after it, after the return
def test_a_counter_glitch_across_a_checkpoint_reads_as_without_one(topo: Topology, cut: int) -> None:
    """A PCIe replay counter climbing steadily, read 0 once at t=600: a glitch. Restored between the
    low reading and the return, the detector still knows the value before it and the pace: before
    the pace and the pending drop were saved, the return read as 30k replays in one second."""
    stream = coupled_stream()
    stream["pcie_replays"] = 30_000.0 + np.cumsum(np.full((STEPS, GPUS), 2.0), axis=0)
    stream["pcie_replays"][600, BROKEN_GPU] = 0.0
    never_stopped = MahalanobisDetector(topo)
    found = run(never_stopped, stream, range(900))
    restored_from = MahalanobisDetector(topo)
    found_before = run(restored_from, stream, range(cut))
    restored = MahalanobisDetector(topo)
    restored.load_state_dict(restored_from.state_dict())
    assert found_before + run(restored, stream, range(cut, 900)) == found
    for key, value in never_stopped.state_dict().items():
        np.testing.assert_array_equal(value, restored.state_dict()[key], err_msg=key)


def test_a_checkpoint_without_the_counters_pace_loads(topo: Topology) -> None:
    det = MahalanobisDetector(topo)
    run(det, coupled_stream(), range(100))
    old = {k: v for k, v in det.state_dict().items() if not k.endswith(("_counter_rate", "_counter_drop"))}
    restored = MahalanobisDetector(topo)
    restored.load_state_dict(old)
    assert np.isnan(restored.s_gpu_counter_rate).all() and np.isnan(restored.s_gpu_counter_drop).all()  # type: ignore[attr-defined]
    np.testing.assert_array_equal(restored.s_gpu_counter_state, det.s_gpu_counter_state)  # type: ignore[attr-defined]


def test_a_checkpoint_without_the_field_counts_loads(topo: Topology) -> None:
    stream = coupled_stream()
    stream["hbm_temp"][:, 0] = np.nan                        # GPU 0 has not reported it yet
    never_stopped = MahalanobisDetector(topo)
    found = run(never_stopped, stream, range(800))
    old = {k: v for k, v in never_stopped.state_dict().items() if not k.endswith("_seen")}
    restored = MahalanobisDetector(topo)
    restored.load_state_dict(old)
    # every field warms up afresh: a field that appeared late under the old kernel had its mean
    # started at 0, and the state cannot tell which did
    assert (restored.s_gpu_seen == 0).all()  # type: ignore[attr-defined]
    # and, warm again (300 samples) before the break, it finds it as the detector that never stopped
    rest = range(800, STEPS)
    after, want = run(restored, stream, rest), run(never_stopped, stream, rest)
    assert found == [] and [(f.ts, f.slot, f.field) for f in after] == [(f.ts, f.slot, f.field) for f in want]
    assert len(want) == 1


def test_a_field_that_appears_late_is_not_judged_against_a_mean_it_never_had() -> None:
    """hbm_temp absent from a GPU's first 100 samples, then present and normal: no anomaly (its
    first reading had been scored against a mean of 0)."""
    topo = Topology.from_gpu_hosts([("n0", 0)])
    rng = np.random.default_rng(0)
    load = rng.uniform(300, 700, 1500)
    power = load + rng.normal(0, 5, 1500)
    temp = 30 + 0.05 * load + rng.normal(0, 0.3, 1500)
    hbm = 28 + 0.04 * load + rng.normal(0, 0.3, 1500)
    det = MahalanobisDetector(topo, gpu_fields="gpu_temp,hbm_temp,power", warmup=50)
    found = []
    for t in range(1500):
        columns = {"gpu_temp": temp[t:t + 1], "hbm_temp": np.array([np.nan if t < 100 else hbm[t]]),
                   "power": power[t:t + 1]}
        found += det.update(Frame("gpu", np.array([float(t)]), np.zeros(1, np.int64), columns))
    assert found == []
    np.testing.assert_allclose(det.models["gpu"].model.s_mean[0, 1], 28 + 0.04 * 500, atol=2)


def test_a_counter_rate_missing_on_the_first_row_is_not_learnt_as_zero() -> None:
    """A counter's rate is NaN on each GPU's first row: the model learnt it as a rate of 0, and a
    GPU power-capped from the start (throttle time +1 s/s) got a variance of its rate 0.05 instead
    of its 0.02 (blunting a real change for hundreds of samples)."""
    topo = Topology.from_gpu_hosts([("n0", 0)])
    rng = np.random.default_rng(0)
    det = MahalanobisDetector(topo, gpu_fields="gpu_temp,power,power_throttle_time", warmup=50)
    counter = 0.0
    for t in range(400):
        counter += 1.0 + 0.02 * rng.normal()
        columns = {"gpu_temp": 70 + 0.3 * rng.normal(size=1), "power": 690 + 5 * rng.normal(size=1),
                   "power_throttle_time": np.array([counter])}
        det.update(Frame("gpu", np.array([float(t)]), np.zeros(1, np.int64), columns))
    model = det.models["gpu"].model
    assert model.s_mean[0, 2] == pytest.approx(1.0, abs=0.01)
    assert 0.015 < np.sqrt(model.s_cov[0, 2, 2]) < 0.03


def test_missing_values_are_imputed_or_skipped_and_counted(topo: Topology) -> None:
    health = PipelineHealth()
    det = MahalanobisDetector(topo, health=health, warmup=5)
    stream = coupled_stream()
    run(det, stream, range(20))
    frame = frame_at(stream, 20)
    frame.columns["power"][0] = np.nan                       # one field missing: imputed
    for values in frame.columns.values():
        values[1] = np.nan                                     # nothing at all: not scored
    frame.columns["pcie_replays"][2] = -5.0                  # an impossible counter value
    frame.columns["hbm_temp"][4] = np.inf                    # an infinity: treated as missing
    assert det.update(frame) == []
    assert det.imputed_rows == 2 and det.skipped_rows == 1  # rows 0 and 4
    assert health.problems[("mahalanobis", "gpu rows with none of the scored fields (not scored)")] == 1
    assert health.problems[("mahalanobis", "negative or infinite counter value")] == 1
    # the row with nothing taught nothing; the others learned
    counts = det.models["gpu"].model.s_count
    assert counts[1] == 20 and counts[0] == counts[2] == 21
    # a frame from a source that reports none of the fields is not an input problem
    det.update(Frame("gpu", np.full(GPUS, 1_700_000_100.0), np.arange(GPUS), {"xid_last": np.zeros(GPUS)}))
    assert det.skipped_rows == 1 + GPUS and sum(health.problems.values()) == 2
    assert np.all(np.isfinite(det.models["gpu"].model.s_cov))
    # rows of entities outside the topology (the input guard drops them first in the pipeline)
    stray = Frame("gpu", np.full(2, 1_700_000_200.0), np.array([0, GPUS + 5]), {"power": np.ones(2)})
    det.update(stray)
    assert health.problems[("mahalanobis", "gpu rows with an unknown slot")] == 1


def test_parameters_fields_and_opt_in_registration(topo: Topology) -> None:
    assert "mahalanobis" not in DEFAULT_BANK
    bank = DetectorBank.from_names(topo, ["mahalanobis"], params={"mahalanobis": {"gpu_fields": "gpu_temp,power"}},
                                   processors=())
    det = bank.detectors[0]
    assert isinstance(det, MahalanobisDetector) and det.models["gpu"].fields == ("gpu_temp", "power")
    assert bank.kinds == {"gpu", "node"}
    assert set(FIELDS["gpu"]) <= set(MahalanobisDetector(topo).models["gpu"].fields)
    for kwargs, match in (({"gpu_fields": "gpu_temp,throttle_reasons"}, "throttle_reasons"),
                          ({"gpu_fields": "power,power"}, "distinct"), ({"quantile": 0.5}, "quantile"),
                          ({"on_count": 0}, "on_count"), ({"speed": 1}, "unknown parameters")):
        with pytest.raises(ValueError, match=match):
            MahalanobisDetector(topo, **kwargs)  # type: ignore[arg-type]
    no_node = MahalanobisDetector(topo, node_fields="")
    assert "node" not in no_node.models
    assert no_node.update(Frame("node", np.zeros(1), np.zeros(1, np.int32), {"psu_power": np.ones(1)})) == []


def test_replay_runs_it_on_a_simulated_recording(tmp_path: Path) -> None:
    runner = CliRunner()
    rec = tmp_path / "rec"
    sim = runner.invoke(cli, ["simulate", "--gpus", "16", "--duration", "600", "--scenario", "psu-failure",
                              "--out", str(rec), "--no-progress"])
    assert sim.exit_code == 0, sim.output
    out = tmp_path / "findings.jsonl"
    res = runner.invoke(cli, ["replay", str(rec), "--detectors", "mahalanobis", "--param", "mahalanobis.warmup=60",
                              "--port", "0", "--findings", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["name"] == "replay" and summary["samples"] > 0
    found = [json.loads(line) for line in out.read_text().splitlines()]
    anomalies = [f for f in found if f["type"] == "anomaly"]
    assert anomalies and all(f["detector"] == "mahalanobis" for f in anomalies)
    assert {f["field"] for f in anomalies} <= set(FIELDS["gpu"]) | set(FIELDS["node"])


def test_docstring_example_runs() -> None:
    assert doctest.testmod(mahalanobis).failed == 0
