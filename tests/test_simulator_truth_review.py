"""Ground truth and run set-up the r57 review found wrong: attribution during a repaired fault's
aftermath, XID 48 on a GPU off the bus, a job stopped inside its slowdown episode, a shutdown's
last throttle bits, episodes left open at the end, interrupted recordings, scenario targets and
values, and the physics sub-step."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.detectors.evaluation import EVENT_KINDS, job_interruptions
from foreshock.recording import Recording
from foreshock.simulator import ClusterSimulator, Scenario, ScenarioError, SimParams, build_topology
from foreshock.simulator.engine import HOLD_S
from foreshock.simulator.scenario import FaultSpec, scenario_from_dict
from foreshock.simulator.truth import EpisodeTracker

GPU = "node1/gpu1"  # slot 9: in job0, with job_nodes=2 on 16 GPUs


def small_sim(faults: list[dict], gpus: int = 16, **kw) -> ClusterSimulator:
    topo = build_topology(gpus, job_nodes=2, idle_fraction=0.0)
    return ClusterSimulator(topo, scenario=scenario_from_dict({"name": "t", "faults": faults}), seed=7,
                            params={"missing_prob": 0.0, "job_churn": False}, warmup_s=60, **kw)


def gpu_events(sim: ClusterSimulator, entity: str, *types: str) -> list:
    return [e for e in sim.events if e.entity == entity and e.type in types]


# ---- R1: a repaired fault's aftermath does not override an active fault ----------------------------
def runaway_tim_under_a_repaired_cooling_loss() -> ClusterSimulator:
    """A thermal interface gone (f1, never repaired) on a GPU whose loop had a mild, short CDU dip
    (f2, repaired at +26 s): f2 comes later in the fault list and is in its aftermath when the die
    runs away."""
    return small_sim([
        {"type": "tim_degradation", "target": GPU, "onset": 20, "params": {"r_per_hour": 300.0, "max_factor": 8.0}},
        {"type": "cooling_loss", "target": "cdu0", "onset": 21, "duration": 5,
         "params": {"flow_fraction": 0.9, "ramp_s": 1}}], duration=900)


def test_an_active_fault_names_its_gpu_during_another_faults_aftermath() -> None:
    sim = runaway_tim_under_a_repaired_cooling_loss()
    list(sim.iter_ticks(900))
    g = sim.topology.gpus.index(GPU)
    others = (sim.gpu_loop == sim.gpu_loop[g]) & (np.arange(len(sim.gpu_cause)) != g)
    assert sim.gpu_cause[g] == 0 and (sim.gpu_cause[others] == 1).all()  # f1 on it, f2's aftermath elsewhere
    starts = [e for e in sim.events if e.entity == GPU and (e.type.endswith("_start") or e.type == "xid")
              and e.time >= sim.start_time + 26]  # (before, both acted on it: the later in the list named it)
    assert starts and {e.fault_id for e in starts} == {"f1"}
    # the shutdown is the unrepaired TIM's: the GPU stays down (blamed on the repaired CDU dip it
    # was "repaired", rebooted after 600 s and shut down again)
    xids = gpu_events(sim, GPU, "xid")
    assert [(e.detail["code"], e.fault_type) for e in xids] == [(79, "tim_degradation")]
    assert sim.shutdown[g]


# ---- R5: a shutdown clears the throttle bits -----------------------------------------------------
def test_a_shutdown_ends_the_throttle_episode_as_the_gpu_goes_dark() -> None:
    sim = runaway_tim_under_a_repaired_cooling_loss()
    seen: list[int] = []
    g = sim.topology.gpus.index(GPU)
    sim.probes.append(lambda s: seen.append(int(s.gpu.reasons[g])) if s.shutdown[g] and len(seen) < 1 else None)
    list(sim.iter_ticks(200))
    assert seen == [0]  # off: no limiter holds it
    (xid,) = gpu_events(sim, GPU, "xid")
    throttle = gpu_events(sim, GPU, "thermal_throttle_start", "thermal_throttle_end")
    assert [e.type for e in throttle] == ["thermal_throttle_start", "thermal_throttle_end"]
    assert throttle[0].time < xid.time and throttle[1].time == xid.time  # not one tick after it went dark


# ---- R2: no DBE from a GPU off the bus -----------------------------------------------------------
def test_hbm_dbes_repeat_only_while_the_gpu_is_up_with_its_hbm_at_the_limit() -> None:
    sim = small_sim([
        {"type": "hbm_overheat", "target": GPU, "onset": 10,
         "params": {"r_per_hour": 1800.0, "dbe_after_s": 30.0, "dbe_every_s": 60.0}},
        {"type": "xid79", "target": GPU, "onset": 200, "duration": 10_000}], duration=500)
    g = sim.topology.gpus.index(GPU)
    state: dict[float, tuple[bool, float]] = {}
    sim.probes.append(lambda s: state.__setitem__(round(s.now, 6), (bool(s.gpu.alive[g]), float(s.gpu.hbm_temp[g]))))
    list(sim.iter_ticks(500))
    dbes = [e for e in gpu_events(sim, GPU, "xid") if e.detail["code"] == 48]
    assert dbes and all(e.time < sim.start_time + 200 for e in dbes)  # none from the GPU off the bus
    for e in dbes:
        alive, hbm = state[round(e.time, 6)]
        assert alive and hbm >= sim.params.hbm_max_operating_c - 0.5


# ---- R3: a job stopped inside its slowdown episode is marked as interrupted ------------------------
def test_a_board_pulled_inside_a_slowdown_episode_marks_the_jobs_stop() -> None:
    sim = small_sim([
        {"type": "tim_degradation", "target": GPU, "onset": 20, "params": {"r_per_hour": 3600.0, "max_factor": 2.3}},
        {"type": "gpu_replacement", "target": GPU, "onset": 200, "duration": 300}], duration=300)
    list(sim.iter_ticks(260))
    slow = [e for e in sim.events if e.type == "job_slowdown_start" and e.entity == "job0"]
    assert [e.fault_type for e in slow] == ["tim_degradation", "gpu_replacement"]  # the throttle, then the swap
    assert slow[1].detail == {"reason": "interrupted", "continues": True}
    assert slow[1].time == sim.start_time + 200
    assert not [e for e in sim.events if e.type == "job_slowdown_end"]  # one episode still
    # the evaluator sees the job's GPUs go idle at the swap
    names = {name: i for i, name in enumerate(sim.topology.gpus)}
    ent, when = job_interruptions(sim.events, Recording(Path("."), sim.topology), EVENT_KINDS["thermal_throttle"],
                                  names)
    members = set(np.flatnonzero(sim.topology.gpu_job == 0).tolist())
    assert set(ent[when == sim.start_time + 200].tolist()) == members


# ---- R9: an episode that cleared just before the end is closed ------------------------------------
def test_tracker_closes_the_episodes_in_a_gap_at_the_end_and_keeps_the_ones_on() -> None:
    tracker = EpisodeTracker("x", "gpu", ["a", "b", "c"], 30.0, lambda c: ("", ""))
    for t in range(10):
        tracker.update(float(t), np.array([True, t < 6, False]))
    (end,) = tracker.close_gaps()
    assert (end.type, end.entity, end.time, end.detail) == ("x_end", "b", 6.0, {"duration_s": 6.0})
    assert tracker.active.tolist() == [True, False, False] and tracker.close_gaps() == []


def test_a_recording_ends_the_episodes_whose_condition_cleared_within_the_hold(tmp_path: Path) -> None:
    # a PSU's power brake: on from +1 s for 10 s, then off; the run ends 19 s later, within the hold
    sim = small_sim([{"type": "psu_failure", "target": "node0", "onset": 1, "duration": 1000,
                      "params": {"brake_s": 10.0}}], duration=30)
    assert HOLD_S["power_brake"] > 19
    sim.record(tmp_path / "rec")
    events = Recording.open(tmp_path / "rec").events()
    starts = {e.entity: e.time for e in events if e.type == "power_brake_start"}
    ends = {e.entity: e for e in events if e.type == "power_brake_end"}
    assert len(starts) == 8 and set(ends) == set(starts)
    for name, e in ends.items():
        assert e.time == starts[name] + 10 and e.fault_type == "psu_failure"


# ---- R8: an interrupted run is a recording marked as cut short ------------------------------------
def test_an_interrupted_run_leaves_a_recording_marked_incomplete(tmp_path: Path, caplog) -> None:
    sim = small_sim([], duration=600)

    def stop(done: float, total: float) -> None:
        if done >= 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sim.record(tmp_path / "rec", progress=stop)
    with caplog.at_level(logging.WARNING, logger="foreshock.recording"):
        rec = Recording.open(tmp_path / "rec")
    assert rec.interrupted and rec.meta["duration"] == 600
    assert rec.meta["end"] - rec.meta["start"] == 19
    assert "stopped before its end" in caplog.text and "20 s of the 600 s asked" in caplog.text
    done = tmp_path / "done"
    small_sim([], duration=5).record(done)
    assert not Recording.open(done).interrupted and Recording.open(done).meta["duration"] == 5


# ---- R6: a target the cluster lacks is a usage error ----------------------------------------------
def test_a_target_the_cluster_lacks_is_an_error_naming_it_and_the_cluster() -> None:
    with pytest.raises(ValueError, match=r"no gpu 'node1/gpu2' in this cluster of 8 GPUs"):
        ClusterSimulator(gpus=8, scenario=Scenario("t", faults=[FaultSpec("xid79", "node1/gpu2")]), warmup_s=0)
    with pytest.raises(ValueError, match=r"no optic 'nolink#a' in this cluster of 8 GPUs"):
        ClusterSimulator(gpus=8, scenario=Scenario("t", faults=[FaultSpec("optic_degradation", "nolink")]), warmup_s=0)
    with pytest.raises(ValueError, match="slot number"):  # True is no slot 1
        ClusterSimulator(gpus=8, scenario=Scenario("t", faults=[FaultSpec("xid79", True)]), warmup_s=0)
    with pytest.raises(ScenarioError, match="slot number, not True"):
        scenario_from_dict({"faults": [{"type": "xid79", "target": True}]})


def test_cli_rejects_a_packaged_scenario_too_big_for_the_cluster(tmp_path: Path) -> None:
    from foreshock.cli.main import cli

    result = CliRunner().invoke(cli, ["simulate", "--gpus", "8", "--scenario", "gpu-replacement", "--duration", "60",
                                      "--out", str(tmp_path / "x"), "--no-progress"])
    assert result.exit_code == 2 and "this cluster of 8 GPUs" in result.output
    assert not (tmp_path / "x").exists()


# ---- R7: scenario defaults and params are checked before anything is written ------------------------
@pytest.mark.parametrize(("data", "message"), [
    ({"defaults": {"duration": -5}}, "duration must be a number of seconds above 0"),
    ({"defaults": {"duration": math.nan}}, "duration must be a number of seconds above 0"),
    ({"defaults": {"gpus": "x"}}, "gpus must be a whole number"),
    ({"defaults": {"gpus": 12}}, "multiple of 8"),
    ({"defaults": {"interval": 30}}, "unknown keys"),
    ({"params": {"missing_prob": 1.5}}, r"missing_prob must be within \[0, 1\]"),
    ({"params": {"tau_core_s": "ten"}}, "tau_core_s must be a number"),
    ({"params": {"tau_core_s": 0}}, "tau_core_s must be more than 0"),
    ({"params": {"job_churn": "no"}}, "job_churn must be true or false"),
    ({"params": {"counter_bits": 16}}, "counter_bits must be 32 or 64"),
    ({"params": {"compute_s_range": [6, 2]}}, "compute_s_range: its low end"),
])
def test_scenario_values_out_of_range_are_refused_naming_them(data: dict, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenario_from_dict({"name": "t", **data})


def test_param_overrides_are_type_and_range_checked() -> None:
    p = SimParams()
    with pytest.raises(ValueError, match="rack_flow_lps must be more than 0"):
        p.with_overrides({"rack_flow_lps": -1})
    with pytest.raises(ValueError, match="max_flaps must be a whole number"):
        p.with_overrides({"max_flaps": 2.5})
    with pytest.raises(ValueError, match="tx_power_dbm must be finite"):
        p.with_overrides({"tx_power_dbm": math.inf})
    ok = p.with_overrides({"missing_prob": 0, "compute_s_range": [1, 2], "los_dbm": -12.0, "counter_bits": 32,
                           "xid79_new_board": True, "max_flaps": np.int64(3)})
    assert ok.compute_s_range == (1, 2) and ok.los_dbm == -12.0 and ok.counter_bits == 32


def test_cli_refuses_a_bad_scenario_value_before_writing_anything(tmp_path: Path) -> None:
    from foreshock.cli.main import cli

    scenario = tmp_path / "bad.yaml"
    scenario.write_text("name: bad\nparams: {missing_prob: 1.5}\n")
    result = CliRunner().invoke(cli, ["simulate", "--gpus", "8", "--scenario", str(scenario), "--duration", "30",
                                      "--out", str(tmp_path / "x"), "--no-progress"])
    assert result.exit_code == 2 and "missing_prob" in result.output
    assert not (tmp_path / "x").exists()


# ---- R10: physics_dt is the longest sub-step; a run shorter than an interval is refused ---------------
@pytest.mark.parametrize(("interval", "physics_dt", "substeps"), [
    (2.5, 1.0, 3), (1.0, None, 1), (10.0, None, 10), (0.3, 0.1, 3), (30.0, 4.0, 8), (1.0, 5.0, 1)])
def test_physics_sub_steps_are_never_longer_than_physics_dt(interval: float, physics_dt: float | None,
                                                            substeps: int) -> None:
    sim = ClusterSimulator(gpus=8, interval=interval, physics_dt=physics_dt, warmup_s=0)
    assert sim.substeps == substeps and sim.dt * sim.substeps == pytest.approx(interval)
    assert sim.dt <= min(interval, physics_dt or 1.0) + 1e-12


def test_cli_refuses_a_run_shorter_than_one_interval(tmp_path: Path) -> None:
    from foreshock.cli.main import cli

    result = CliRunner().invoke(cli, ["simulate", "--gpus", "8", "--duration", "60", "--interval", "100",
                                      "--out", str(tmp_path / "x"), "--no-progress"])
    assert result.exit_code == 2 and "shorter than one sampling interval" in result.output
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="duration must be a positive"):
        ClusterSimulator(gpus=8, duration=-5, warmup_s=0)
