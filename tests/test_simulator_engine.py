"""Engine API, telemetry realism, recordings, scenario files, random faults, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock import facts
from foreshock.events import read_events
from foreshock.fields import ENTITY_KINDS, field_names
from foreshock.recording import Recording
from foreshock.simulator import ClusterSimulator, ScenarioError, build_topology, load_scenario
from foreshock.simulator.faults import RANDOM_FAULT_MIX, random_fault_rate_per_s
from foreshock.simulator.scenario import scenario_from_dict


def frames_equal(a, b) -> bool:
    return (a.kind == b.kind and np.array_equal(a.ts, b.ts) and np.array_equal(a.slot, b.slot)
            and all(np.array_equal(a.columns[k], b.columns[k], equal_nan=True) for k in field_names(a.kind)))


def collect(sim: ClusterSimulator, seconds: float) -> list:
    return list(sim.iter_frames(seconds))


# ---- topology -------------------------------------------------------------------------------------
def test_topology_is_rail_optimised_with_racks_rows_and_jobs() -> None:
    topo = build_topology(16384, seed=1)
    assert len(topo.gpus) == 16384 and len(topo.nodes) == 2048
    assert len(topo.racks) == 512 and len(topo.rows) == 128  # 4 nodes/rack, 4 racks/row
    leaves = [i for i, t in enumerate(topo.switch_tier) if t == "leaf"]
    assert len(leaves) == 64 * 8  # one leaf per rail per 32-node scalable unit
    gpu_links = np.flatnonzero(topo.link_gpu >= 0)
    assert len(gpu_links) == 16384  # one NIC link per GPU
    # GPU r of every node links to a rail-r leaf of its SU
    rails = topo.gpu_index[topo.link_gpu[gpu_links]]
    assert np.array_equal(topo.switch_rail[topo.link_b_switch[gpu_links]], rails)
    uplinks = np.flatnonzero(topo.link_a_switch >= 0)
    assert len(uplinks) == 512 * 16
    assert np.array_equal(topo.switch_rail[topo.link_a_switch[uplinks]], topo.switch_rail[topo.link_b_switch[uplinks]])
    assert topo.size("optic") == 2 * len(topo.links)
    assert topo.name("optic", 2 * 5 + 1) == f"{topo.links[5]}#b"
    # jobs are whole nodes; about 8 % of nodes idle
    in_job = topo.gpu_job >= 0
    assert 0.85 < in_job.mean() < 0.97
    for j, nodes in enumerate(topo.job_nodes):
        assert (topo.gpu_job[np.isin(topo.gpu_node, nodes)] == j).all()


def test_topology_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        build_topology(12)
    with pytest.raises(ValueError):
        build_topology(64, nodes_per_rack=0)


# ---- API ------------------------------------------------------------------------------------------
def test_step_returns_one_frame_per_kind_covering_every_entity() -> None:
    sim = ClusterSimulator(gpus=32, seed=1, interval=2.0, warmup_s=0)
    frames = sim.step()
    assert [f.kind for f in frames] == list(ENTITY_KINDS)
    for f in frames:
        assert np.array_equal(f.slot, np.arange(sim.topology.size(f.kind)))
        assert (f.ts == sim.now).all()
    assert sim.now == sim.start_time + 2.0


def test_same_seed_same_run_other_seed_other_run() -> None:
    scen = "psu-failure"
    a = collect(ClusterSimulator(gpus=16, scenario=scen, seed=5, duration=120, random_faults=True,
                                 fault_acceleration=5e4), 60)
    sim_b = ClusterSimulator(gpus=16, scenario=scen, seed=5, duration=120, random_faults=True, fault_acceleration=5e4)
    b = collect(sim_b, 60)
    assert len(a) == len(b) == 60 * 6
    assert all(frames_equal(x, y) for x, y in zip(a, b))
    sim_c = ClusterSimulator(gpus=16, scenario=scen, seed=6, duration=120, random_faults=True, fault_acceleration=5e4)
    c = collect(sim_c, 60)
    assert not all(frames_equal(x, y) for x, y in zip(a, c))
    sim_a = ClusterSimulator(gpus=16, scenario=scen, seed=5, duration=120, random_faults=True, fault_acceleration=5e4)
    collect(sim_a, 60)
    assert [e.to_json() for e in sim_a.events] == [e.to_json() for e in sim_b.events]
    assert len(sim_b.events) > 0


def test_probes_read_every_physics_step_past_the_warm_up_and_change_nothing() -> None:
    def sim() -> ClusterSimulator:
        return ClusterSimulator(gpus=16, scenario="psu-failure", seed=5, duration=60, interval=5.0,
                                random_faults=True, fault_acceleration=5e4)
    plain, probed = sim(), sim()
    seen: list[tuple[float, float]] = []
    probed.probes.append(lambda s: seen.append((s.now, float(s.gpu.power_cap_margin(s.workload.gpu_compute_activity)[0]))))
    assert seen == []  # the warm-up is not probed
    a, b = collect(plain, 60), collect(probed, 60)
    assert [t for t, _ in seen] == [probed.start_time + k for k in range(1, 61)]  # 1-s physics steps
    assert all(np.isfinite(m) for _, m in seen)
    assert all(frames_equal(x, y) for x, y in zip(a, b))  # reading hidden state draws nothing
    assert [e.to_json() for e in plain.events] == [e.to_json() for e in probed.events]


def test_iter_frames_runs_live_until_the_consumer_stops() -> None:
    sim = ClusterSimulator(gpus=16, seed=0, warmup_s=0)
    it = sim.iter_frames(math.inf)
    got = [next(it) for _ in range(6 * 5)]
    assert sim.now == sim.start_time + 5.0
    assert [f.kind for f in got[:6]] == list(ENTITY_KINDS)


def test_telemetry_realism_integer_temps_noisy_power_30s_interval() -> None:
    sim = ClusterSimulator(gpus=64, seed=2, interval=30.0, params={"missing_prob": 0.0})
    for _ in range(3):
        frames = {f.kind: f for f in sim.step()}
        gpu = frames["gpu"]
        assert np.array_equal(gpu.columns["gpu_temp"], np.round(gpu.columns["gpu_temp"]))
        assert np.array_equal(gpu.columns["hbm_temp"], np.round(gpu.columns["hbm_temp"]))
        noise = gpu.columns["power"] - sim.gpu.power
        assert np.abs(noise).max() <= facts.POWER_NOISE_W + 0.01
        assert noise.std() > 0.5
        assert np.all(np.mod(gpu.columns["sm_clock"], 15e6) == 0)
        assert (gpu.columns["power_limit"] == 700.0).all()
    assert frames["gpu"].ts[0] == sim.start_time + 90.0
    assert sim.substeps == 30  # physics stays at 1 s underneath


def test_missing_samples_are_whole_nan_rows() -> None:
    sim = ClusterSimulator(gpus=64, seed=2, params={"missing_prob": 0.05}, warmup_s=0)
    gpu = sim.step()[0]
    m = gpu.matrix()  # every field, board_id too: a failed read reads no UUID either
    nan_rows = np.isnan(m).all(axis=1)
    assert 0 < nan_rows.sum() < 15
    assert not np.isnan(m[~nan_rows]).any()


def test_the_schedule_ending_and_starting_a_job_is_ground_truth() -> None:
    # jobs of ~5 min with ~2-min gaps: within an hour every job ends and restarts
    sim = ClusterSimulator(build_topology(32, job_nodes=2, idle_fraction=0.0), seed=3,
                           params={"missing_prob": 0.0, "job_run_mean_s": 300.0, "job_gap_mean_s": 120.0},
                           warmup_s=0, interval=10.0)
    util = {}
    for frames in iter(sim.step, None):
        gpu = next(f for f in frames if f.kind == "gpu")
        util[float(gpu.ts[0])] = gpu.columns["util"].copy()
        if sim.elapsed >= 3600:
            break
    churn = [e for e in sim.events if e.type in ("job_end", "job_start")]
    assert {e.entity for e in churn} == set(sim.topology.jobs) and all(e.fault_id == "" for e in churn)
    for job in sim.topology.jobs:  # a job ends, then starts, alternately
        types = [e.type for e in churn if e.entity == job]
        assert types[0] == "job_end" and all(a != b for a, b in zip(types, types[1:]))
    times = sorted(util)
    checked = 0
    for e in churn:  # the job's GPUs go idle at its end and load at its start, by the next sample
        members = sim.topology.gpus_of_job(sim.topology.slot("job", e.entity))
        following = [x.time for x in churn if x.entity == e.entity and x.time > e.time]
        after = next((t for t in times if t >= e.time), None)
        if after is None or (following and following[0] <= after):
            continue  # flipped back before a sample could show it
        loaded = util[after][members]
        assert (loaded == 0).all() if e.type == "job_end" else (loaded == 1).all(), e
        checked += 1
    assert checked >= len(churn) // 2
    assert [e.detail for e in churn if e.type == "job_end"][0] == {"reason": "completed"}


def test_xid79_gpu_reports_nothing_but_the_xid_and_its_job_stops() -> None:
    scen = scenario_from_dict({"faults": [{"type": "xid79", "target": "node0/gpu2", "onset": 10, "duration": 100}]})
    sim = ClusterSimulator(build_topology(32, job_nodes=2, idle_fraction=0.0), scenario=scen, seed=1,
                           params={"missing_prob": 0.0, "job_churn": False}, warmup_s=60)
    for _ in range(20):
        frames = {f.kind: f for f in sim.step()}
    gpu = frames["gpu"]
    g = sim.topology.slot("gpu", "node0/gpu2")
    assert gpu.columns["xid_last"][g] == 79
    assert np.isnan(gpu.columns["gpu_temp"][g])
    job = int(sim.topology.gpu_job[g])
    assert np.isnan(frames["job"].columns["step_time"][job])
    members = sim.topology.gpus_of_job(job)
    assert (gpu.columns["throttle_reasons"][members[members != g]] == facts.THROTTLE_IDLE).all()
    kinds = [(e.type, e.fault_id) for e in sim.events]
    assert ("xid", "f1") in kinds and ("job_slowdown_start", "f1") in kinds


# ---- recordings and scenario files -------------------------------------------------------------------
def test_record_writes_a_recording_that_reads_back(tmp_path: Path) -> None:
    sim = ClusterSimulator(gpus=16, scenario="psu-failure", seed=3, interval=5.0, duration=300)
    summary = sim.record(tmp_path / "rec", progress=lambda done, total: None)
    rec = Recording.open(tmp_path / "rec")
    assert rec.kinds() == list(ENTITY_KINDS)
    assert rec.interval == 5.0 and rec.meta["scenario"] == "psu-failure" and rec.meta["seed"] == 3
    gpu = rec.read_kind("gpu")
    assert len(gpu) == 60 * 16
    assert np.all(np.diff(np.unique(gpu.ts)) == 5.0)
    events = read_events(tmp_path / "rec" / "events.jsonl")
    assert len(events) == summary.events == len(sim.events)
    assert any(e.type == "power_brake_start" for e in events)
    # ground truth in the file: the fault's onset with its hidden cause, consequences tied to it
    (onset,) = [e for e in events if e.type == "fault_onset"]
    assert onset.entity_kind == "node" and onset.fault_type == "psu_failure"
    assert "PSU" in onset.detail["cause"] and onset.detail["params"]["derated_limit_w"] == 500.0
    brakes = [e for e in events if e.type == "power_brake_start"]
    assert {(e.fault_id, e.fault_type) for e in brakes} == {(onset.fault_id, "psu_failure")}
    assert all(e.detail["reasons"] & facts.THROTTLE_HW_POWER_BRAKE for e in brakes)
    assert [e.time for e in events] == sorted(e.time for e in events)
    assert summary.simulated_seconds == 300 and summary.faults == 1
    assert rec.meta["faults"][0]["type"] == "psu_failure"


def test_scenario_files_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="unknown scenario 'nope'.*cooling-loss"):
        load_scenario("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("faults:\n  - type: meteor_strike\n")
    with pytest.raises(ScenarioError, match="bad.yaml: faults\\[0\\].*unknown fault type"):
        load_scenario(bad)
    bad.write_text("faults:\n  - type: cooling-loss\n    params: {flow: 2}\n")
    with pytest.raises(ScenarioError, match="unknown parameters \\['flow'\\]"):
        load_scenario(bad)
    bad.write_text("faults: [\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad)
    with pytest.raises(ValueError, match="unknown simulator parameters"):
        ClusterSimulator(gpus=16, params={"no_such_knob": 1})
    good = tmp_path / "good.yaml"
    good.write_text("name: mine\nfaults:\n  - {type: tim-degradation, target: node1/gpu3, onset: '50%'}\n")
    sim = ClusterSimulator(gpus=16, scenario=str(good), duration=1000, warmup_s=0)
    (fault,) = sim.faults
    assert (fault.type, fault.target_name, fault.onset) == ("tim_degradation", "node1/gpu3", 500.0)
    with pytest.raises(ValueError, match="no gpu 'node9/gpu0' in this cluster of 16 GPUs"):  # a usage error
        ClusterSimulator(gpus=16, scenario=scenario_from_dict({"faults": [{"type": "xid79", "target": "node9/gpu0"}]}))


def test_random_fault_rate_is_facts_rate_accelerated() -> None:
    # 1,024 GPUs (128 nodes) for 6 h: 6.5 per 1000 node-days x 25 -> about 5 faults
    expected = random_fault_rate_per_s(128) * 6 * 3600
    assert expected == pytest.approx(6.5 / 1000 * 128 * 0.25 * 25)
    assert 3 <= expected <= 8


def test_random_faults_arrive_and_are_attributed() -> None:
    sim = ClusterSimulator(gpus=64, seed=4, interval=10, duration=3600, random_faults=True, fault_acceleration=5000,
                           physics_dt=5, params={"missing_prob": 0.0})
    for _ in sim.iter_ticks():
        pass
    onsets = [e for e in sim.events if e.type == "fault_onset"]
    assert len(onsets) >= 5
    assert {e.fault_type for e in onsets} <= set(RANDOM_FAULT_MIX)
    ids = {e.fault_id for e in onsets}
    assert all(e.fault_id in ids for e in sim.events if e.fault_id)


# ---- CLI ------------------------------------------------------------------------------------------------
def test_cli_simulate_writes_a_recording_and_prints_json_last(tmp_path: Path) -> None:
    from foreshock.cli.main import cli

    out = tmp_path / "rec"
    result = CliRunner().invoke(cli, ["simulate", "--gpus", "16", "--duration", "120", "--scenario", "psu-failure",
                                      "--seed", "1", "--out", str(out), "--interval", "10", "--no-progress"])
    assert result.exit_code == 0, result.output
    last = json.loads(result.output.strip().splitlines()[-1])
    assert set(last) == {"gpus", "simulated_seconds", "wall_seconds", "faults", "events"}
    assert last["gpus"] == 16 and last["simulated_seconds"] == 120 and last["faults"] == 1
    assert Recording.open(out).interval == 10.0
    bad = CliRunner().invoke(cli, ["simulate", "--scenario", "nope", "--out", str(tmp_path / "x")])
    assert bad.exit_code != 0 and "unknown scenario" in bad.output


# ---- real formats -----------------------------------------------------------------------------------
def test_dcgm_exposition_round_trips_through_the_real_importer() -> None:
    from foreshock.health import PipelineHealth
    from foreshock.simulator.formats import dcgm_exposition
    from foreshock.streams.dcgm import parse_dcgm_text

    sim = ClusterSimulator(gpus=16, seed=1, params={"missing_prob": 0.0}, warmup_s=60)
    gpu = sim.step()[0]
    text = dcgm_exposition(gpu, sim.topology)
    assert 'DCGM_FI_DEV_GPU_TEMP{gpu="3",' in text and 'Hostname="node1"' in text
    health = PipelineHealth()
    back = parse_dcgm_text(text, ts=gpu.ts[0], health=health).to_frame(sim.topology, health)
    assert health.total_problems() == 0
    order = np.argsort(back.slot)
    assert np.array_equal(back.slot[order], gpu.slot)
    for name in ("gpu_temp", "hbm_temp", "power", "sm_clock", "throttle_reasons", "energy", "xid_last"):
        np.testing.assert_allclose(back.columns[name][order], gpu.columns[name], rtol=1e-6, atol=1e-3, err_msg=name)


def test_nvidia_smi_csv_round_trips_through_the_real_importer() -> None:
    from foreshock.simulator.formats import nvidia_smi_csv
    from foreshock.streams.nvidia_smi import parse_query_gpu

    sim = ClusterSimulator(gpus=16, seed=1, params={"missing_prob": 0.0}, warmup_s=60)
    gpu = sim.step()[0]
    mine = sim.topology.gpus_of_node(1)
    rows = np.flatnonzero(np.isin(gpu.slot, mine))
    gpu.columns["throttle_reasons"][rows[0]] = 0x20  # SW thermal: printed in hex, as nvidia-smi does
    text = nvidia_smi_csv(gpu, sim.topology, "node1")
    assert "0x0000000000000020" in text.splitlines()[1]  # (the node's first row, the header before it)
    back = parse_query_gpu(text, host="node1", ts=gpu.ts[0]).to_frame(sim.topology)
    order = np.argsort(back.slot)
    assert np.array_equal(back.slot[order], mine)
    for name in ("gpu_temp", "power", "sm_clock", "power_limit", "throttle_reasons"):
        np.testing.assert_allclose(back.columns[name][order], gpu.columns[name][mine], rtol=1e-6, err_msg=name)


def test_the_same_seed_writes_the_same_recording(tmp_path: Path) -> None:
    """Deterministic for a seed end to end: the files, not only the frames in memory."""
    for name in ("a", "b", "c"):
        ClusterSimulator(gpus=16, scenario="optic-degradation", seed=2 if name != "c" else 3, interval=10.0,
                         duration=300, random_faults=True, fault_acceleration=2e4).record(tmp_path / name)
    a, b, c = (Recording.open(tmp_path / n) for n in "abc")
    assert (tmp_path / "a" / "events.jsonl").read_bytes() == (tmp_path / "b" / "events.jsonl").read_bytes()
    assert (tmp_path / "a" / "topology.yaml").read_bytes() == (tmp_path / "b" / "topology.yaml").read_bytes()
    assert len(read_events(tmp_path / "a" / "events.jsonl")) > 0
    for kind in ENTITY_KINDS:
        assert frames_equal(a.read_kind(kind), b.read_kind(kind)), kind
    assert not all(frames_equal(a.read_kind(k), c.read_kind(k)) for k in ENTITY_KINDS)


def test_infiniband_sysfs_round_trips_through_the_real_importer(tmp_path: Path) -> None:
    from foreshock.health import PipelineHealth
    from foreshock.simulator.formats import infiniband_sysfs
    from foreshock.streams.infiniband import read_infiniband

    sim = ClusterSimulator(gpus=16, seed=1, params={"missing_prob": 0.0, "counter_bits": 32}, warmup_s=60)
    sim.optics.degradation_db[2 * sim.topology.slot("link", "node1/gpu2~su0-leaf2")] = 30.0  # a pulled fibre
    for _ in range(3):
        link = sim.step()[1]
    names = infiniband_sysfs(link, sim.topology, "node1", tmp_path)
    assert sorted(names) == [f"mlx5_{r}/1" for r in range(8)]
    assert (tmp_path / "mlx5_2" / "ports" / "1" / "state").read_text() == "1: DOWN\n"
    health = PipelineHealth()
    back = read_infiniband(tmp_path, host="node1", ts=link.ts[0], health=health, link_names=names)
    frame = back.to_frame(sim.topology, health)
    assert health.total_problems() == 0
    mine = np.array([sim.topology.slot("link", n) for n in sorted(names.values())])
    order = np.argsort(frame.slot)
    assert np.array_equal(frame.slot[order], np.sort(mine))
    compared = 0
    for name in field_names("link"):
        got = frame.columns[name][order]
        if np.isnan(got).all():
            continue  # not a sysfs field (PFC pause time comes from ethtool)
        np.testing.assert_array_equal(got, link.columns[name][np.sort(mine)], err_msg=name)
        compared += 1
    assert compared >= 14
