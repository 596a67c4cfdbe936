"""Board swaps (RMA) in the simulator: every GPU frame carries the board in each slot as
``board_id`` (its UUID's number, computed here from its definition in ``board_ids``), a
``gpu_replacement`` (or an XID 79 repair, when asked) puts a new board in the slot — new UUID, its
own resistances, counters from a fresh driver load, the old board's faults gone — and runs that
swap nothing stay what they were: same seed, same faults, same samples, same physics."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.bank import DetectorBank
from foreshock.findings import Anomaly, Finding, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.simulator import ClusterSimulator, load_scenario
from foreshock.simulator.formats import dcgm_exposition, gpu_uuid, nvidia_smi_csv, uuid_of_board
from foreshock.simulator.scenario import FaultSpec, Scenario
from foreshock.streams.dcgm import parse_dcgm_text
from foreshock.streams.embedded import EmbeddedPipeline
from foreshock.streams.nvidia_smi import parse_query_gpu

from board_ids import uuid_number

pytestmark = pytest.mark.slow  # long end-to-end runs

GPUS, SEED, INTERVAL = 32, 1, 10.0
SWAPPED = "node0/gpu4"  # seed 1's second board in this slot runs 13.5 % hotter per watt than its first
ONSET, OUT, DURATION = 2400.0, 600.0, 5400.0  # out of service 40-50 min in, back on the new board
UUID_FORM = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class Run:
    sim: ClusterSimulator
    gpu: list[Frame]  # the gpu frame of every tick
    ticks: list[list[Frame]]
    constants: dict[str, np.ndarray]  # the GPUs' hidden constants before the run

    @property
    def returned(self) -> float:
        return self.sim.start_time + ONSET + OUT


def constants(sim: ClusterSimulator) -> dict[str, np.ndarray]:
    g = sim.gpu
    return {name: getattr(g, name).copy() for name in ("r_core", "r_hbm", "leak_scale", "dyn_scale")}


def run(faults: list[FaultSpec], seed: int = SEED, params: dict[str, Any] | None = None,
        duration: float = DURATION) -> Run:
    sim = ClusterSimulator(gpus=GPUS, scenario=Scenario("swap", faults=faults, params={"job_churn": False}),
                           seed=seed, interval=INTERVAL, duration=duration, params=params)
    before = constants(sim)
    ticks = list(sim.iter_ticks())
    return Run(sim, [t[0] for t in ticks], ticks, before)


@pytest.fixture(scope="module")
def swap() -> Run:
    return run([FaultSpec("gpu_replacement", SWAPPED, ONSET, OUT)])


def frames_identical(a: Frame, b: Frame) -> bool:
    return (a.kind == b.kind and np.array_equal(a.ts, b.ts) and np.array_equal(a.slot, b.slot)
            and all(np.array_equal(a.columns[k], b.columns[k], equal_nan=True) for k in a.columns))


def replaced(sim: ClusterSimulator) -> list[Any]:
    return [e for e in sim.events if e.type == "gpu_replaced"]


# ---- boards in the frames ----------------------------------------------------------------------------
def test_each_gpu_row_carries_its_boards_uuid_as_that_uuids_number() -> None:
    sim = ClusterSimulator(gpus=16, seed=0, params={"missing_prob": 0.05}, warmup_s=0)
    uuids = list(sim.gpu_uuids)
    assert len(set(uuids)) == 16 and all(UUID_FORM.fullmatch(u) for u in uuids)
    expected = np.array([float(uuid_number(u)) for u in uuids])
    missing = 0
    for _ in range(5):
        gpu = sim.step()[0]
        read = ~np.isnan(gpu.columns["gpu_temp"])
        np.testing.assert_array_equal(gpu.columns["board_id"][read], expected[gpu.slot[read]])
        assert np.isnan(gpu.columns["board_id"][~read]).all()  # a failed read is a whole row of NaN
        missing += int((~read).sum())
    assert missing > 0
    # a board's UUID is the GPU's name's, whatever the seed: the same slot, the same first board
    assert ClusterSimulator(gpus=16, seed=7, warmup_s=0).gpu_uuids == uuids


@settings(deadline=None)
@given(name=st.text(min_size=1, max_size=30), number=st.integers(0, 40))
def test_a_boards_number_names_its_uuid_back(name: str, number: int) -> None:
    """What the formats serve: the UUID of the board whose number a row carries, each board of a
    slot its own."""
    uuid = gpu_uuid(name, number)
    assert UUID_FORM.fullmatch(uuid)
    assert uuid_of_board(name, float(uuid_number(uuid))) == uuid
    assert uuid not in {gpu_uuid(name, n) for n in range(number)}


def test_a_gpu_out_of_service_reports_only_its_xid_and_its_board(swap: Run) -> None:
    g = swap.sim.topology.slot("gpu", SWAPPED)
    start = swap.sim.start_time
    out = [f for f in swap.gpu if start + ONSET < f.ts[0] < start + ONSET + OUT]
    assert len(out) == OUT / INTERVAL - 1
    old = float(uuid_number(replaced(swap.sim)[0].detail["old_uuid"]))
    for frame in out:
        row = {name: column[g] for name, column in frame.columns.items()}
        if math.isnan(row["xid_last"]):
            continue  # a failed read
        assert row["board_id"] == old  # DCGM serves a lost GPU's XID under the UUID it knew
        assert all(math.isnan(v) for k, v in row.items() if k not in ("xid_last", "board_id"))


def test_a_swap_changes_that_gpus_board_and_constants_at_its_return(swap: Run) -> None:
    sim, topo = swap.sim, swap.sim.topology
    g = topo.slot("gpu", SWAPPED)
    (event,) = replaced(sim)
    assert (event.time, event.entity, event.fault_type) == (swap.returned, SWAPPED, "gpu_replacement")
    old, new = event.detail["old_uuid"], event.detail["new_uuid"]
    assert sim.gpu_uuids[g] == new
    assert old != new and UUID_FORM.fullmatch(new) and new not in sim.gpu_uuids[:g] + sim.gpu_uuids[g + 1:]
    assert (event.detail["old_board_id"], event.detail["new_board_id"]) == (uuid_number(old), uuid_number(new))
    first = np.array([float(uuid_number(u)) for u in sim.gpu_uuids])
    first[g] = uuid_number(old)
    for frame in swap.gpu:
        boards = frame.columns["board_id"]
        expected = first.copy()
        if frame.ts[0] >= swap.returned:
            expected[g] = uuid_number(new)
        read = ~np.isnan(boards)
        assert read.sum() > GPUS // 2
        np.testing.assert_array_equal(boards[read], expected[frame.slot[read]], err_msg=str(frame.ts[0] - sim.start_time))
    # the new board's own constants: that GPU's only, its resistance > 5 % off the old board's
    after = constants(sim)
    for name, was in swap.constants.items():
        changed = np.flatnonzero(after[name] != was)
        assert changed.tolist() == [g], name
    ratio = after["r_core"][g] / swap.constants["r_core"][g]
    assert abs(ratio - 1.0) > 0.05
    assert event.detail["r_core_ratio"] == pytest.approx(ratio, abs=1e-6)
    # its energy counter starts again from the new board's driver load; so do its throttle times
    rows = [(f.ts[0], f.columns["energy"][g], f.columns["thermal_throttle_time"][g]) for f in swap.gpu]
    last_old = max((r for r in rows if r[0] <= sim.start_time + ONSET and not math.isnan(r[1])), key=lambda r: r[0])
    first_new = min((r for r in rows if r[0] >= swap.returned and not math.isnan(r[1])), key=lambda r: r[0])
    assert first_new[1] < last_old[1] and first_new[1] < 1e7 + 700.0 * INTERVAL
    assert first_new[2] == 0.0


def test_the_new_board_ends_the_old_boards_faults() -> None:
    """A degrading thermal interface and an overheating HBM belong to the old board: the swap
    repairs them (their duration ends there, so ground truth's aftermath follows), the new board
    runs at its own resistances, with no ECC error, and the ground truth names them."""
    r = run([FaultSpec("tim_degradation", SWAPPED, 300.0, None, {"r_per_hour": 2.0}),
             FaultSpec("hbm_overheat", SWAPPED, 300.0, None, {"r_per_hour": 12.0, "dbe_after_s": 60.0}),
             FaultSpec("gpu_replacement", SWAPPED, ONSET, OUT)])
    sim = r.sim
    g = sim.topology.slot("gpu", SWAPPED)
    tim, hbm, _ = sim.faults
    assert tim.ended and hbm.ended and tim.duration == hbm.duration == pytest.approx(ONSET + OUT - 300.0)
    assert replaced(sim)[0].detail["faults_cured"] == [tim.id, hbm.id]
    assert sim.r_factor[g] == sim.hbm_r_factor[g] == 1.0
    dbe = [e for e in sim.events if e.type == "xid" and e.detail.get("code") == 48]
    assert dbe and all(e.time < sim.start_time + ONSET for e in dbe)  # the old board's HBM failed
    before = [f for f in r.gpu if sim.start_time + ONSET - 600.0 <= f.ts[0] < sim.start_time + ONSET]
    after = [f for f in r.gpu if f.ts[0] >= r.returned + 600.0]
    assert np.nanmax([f.columns["hbm_temp"][g] for f in before]) >= 94.0  # at its limit, on the old board
    # the new board at work: a healthy HBM and die, far from any limit, and no ECC error
    assert np.nanmax([f.columns["hbm_temp"][g] for f in after]) < 50.0
    assert np.nanmax([f.columns["gpu_temp"][g] for f in after]) < 60.0
    assert np.nanmax([f.columns["power"][g] for f in after]) > 600.0
    assert all(f.columns["ecc_dbe"][g] == f.columns["remapped_rows"][g] == 0.0 for f in after)


def test_an_xid79_repair_swaps_the_board_only_when_asked() -> None:
    """Off by default: the GPU comes back on its board, as before boards were simulated. Asked
    (``xid79_new_board``), it comes back on a new one; up to then, and for every random draw
    after, the run is the same run."""
    faults = [FaultSpec("xid79", SWAPPED, ONSET, OUT)]
    plain, swapping = run(faults, duration=3600.0), run(faults, params={"xid79_new_board": True}, duration=3600.0)
    g = plain.sim.topology.slot("gpu", SWAPPED)
    assert not replaced(plain.sim)
    assert {f.columns["board_id"][g] for f in plain.gpu if not math.isnan(f.columns["board_id"][g])} == {
        float(uuid_number(plain.sim.gpu_uuids[g]))}
    (event,) = replaced(swapping.sim)
    assert event.time == swapping.returned and event.fault_type == "xid79"
    for a, b in zip(plain.ticks, swapping.ticks):
        if a[0].ts[0] < swapping.returned:
            assert all(frames_identical(x, y) for x, y in zip(a, b))
        # the same failed reads to the end: the new board drew from its own stream, not the run's
        for x, y in zip(a, b):
            assert np.array_equal(np.isnan(x.matrix()).all(axis=1), np.isnan(y.matrix()).all(axis=1))
    assert [f.describe() for f in plain.sim.faults] == [f.describe() for f in swapping.sim.faults]


def test_the_same_seed_swaps_the_same_boards(swap: Run) -> None:
    again = run([FaultSpec("gpu_replacement", SWAPPED, ONSET, OUT)])
    assert len(again.ticks) == len(swap.ticks)
    assert all(frames_identical(x, y) for a, b in zip(swap.ticks, again.ticks) for x, y in zip(a, b))
    assert [e.to_json() for e in swap.sim.events] == [e.to_json() for e in again.sim.events]
    other = run([FaultSpec("gpu_replacement", SWAPPED, ONSET, OUT)], seed=SEED + 1, duration=ONSET + OUT + INTERVAL)
    # another seed: the same UUIDs (names' boards), another new board's resistance
    assert replaced(other.sim)[0].detail["new_uuid"] == replaced(swap.sim)[0].detail["new_uuid"]
    assert replaced(other.sim)[0].detail["r_core_ratio"] != replaced(swap.sim)[0].detail["r_core_ratio"]


# Drawn by the simulator as it was before boards (git b6f5fc9, simulator/ of that commit): the
# hidden constants, random faults, failed reads and PCIe replays of a run come from the run's own
# random streams, as seeded draws a machine's float rounding does not move.
OLD_FAULTS = [
    ["f1", "tim_degradation", "node6/gpu6", 54.0, None],
    ["f2", "optic_degradation", "node2/gpu7~su0-leaf7#b", 90.0, None],
    ["f3", "cooling_loss", "cdu0", 216.0, 216.0],
    ["f4", "hbm_overheat", "node6/gpu0", 360.0, None],
    ["f5", "psu_failure", "node7", 630.0, 270.0],
    ["f6", "fan_failure", "node1", 900.0, 360.0],
    ["f7", "cooling_loss", "cdu0", 1170.0, 180.0],
    ["f8", "xid79", "node2/gpu4", 1440.0, 144.0],
    ["f9", "fan_failure", "node5", 23.413859, 2678.849703],
    ["f10", "hbm_overheat", "node0/gpu7", 416.892246, None],
    ["f11", "hbm_overheat", "node7/gpu6", 523.834995, None],
    ["f12", "optic_degradation", "node4/gpu4~su0-leaf4#b", 532.67719, None],
    ["f13", "tim_degradation", "node7/gpu4", 547.881795, None],
    ["f14", "xid79", "node2/gpu2", 569.901855, 1239.435479],
    ["f15", "tim_degradation", "node7/gpu3", 635.674546, None],
    ["f16", "xid79", "node7/gpu6", 638.984175, 2060.38381],
    ["f17", "hbm_overheat", "node5/gpu4", 649.493117, None],
    ["f18", "optic_degradation", "su0-leaf0~rail0-spine0#b", 728.192601, None],
    ["f19", "xid79", "node7/gpu3", 759.853359, 3477.562028],
    ["f20", "tim_degradation", "node1/gpu6", 779.642635, None],
    ["f21", "hbm_overheat", "node5/gpu2", 815.184242, None],
    ["f22", "hbm_overheat", "node3/gpu7", 847.356079, None],
    ["f23", "fan_failure", "node0", 1107.240317, 4801.120525],
    ["f24", "tim_degradation", "node2/gpu5", 1116.955558, None],
    ["f25", "optic_degradation", "node0/gpu6~su0-leaf6#b", 1139.984064, None],
    ["f26", "hbm_overheat", "node0/gpu6", 1164.564796, None],
    ["f27", "xid79", "node2/gpu5", 1186.67174, 2227.753507],
    ["f28", "xid79", "node4/gpu4", 1295.009365, 1923.867474],
    ["f29", "tim_degradation", "node2/gpu4", 1358.144998, None],
    ["f30", "optic_degradation", "node5/gpu4~su0-leaf4#b", 1397.124468, None],
    ["f31", "hbm_overheat", "node7/gpu3", 1424.074829, None],
    ["f32", "xid79", "node6/gpu6", 1434.673344, 3311.913692],
    ["f33", "optic_degradation", "node4/gpu0~su0-leaf0#b", 1564.241175, None],
]
OLD_FAILED_READS = {"gpu": (11, "9b3cb9b1eb2cc935"), "link": (11, "7cd4dcb8cafeb260")}
OLD_PCIE_REPLAYS = 1389
OLD_CONSTANTS = (458, "ba76caf048213a68")  # the GPUs', racks', jobs' and optics' drawn constants


def test_a_run_without_swaps_draws_what_it_drew_before_boards() -> None:
    """No new fault type in the random mix, no draw from the run's streams for the boards: the
    packaged mixed scenario with random faults gives the constants, faults, failed reads and PCIe
    replays it gave before (a full comparison of recordings, every column but board_id bit for bit, is in
    the report of the change that added boards)."""
    # mixed as it was then: its cooling losses' least duration (2026-12-06) lengthens them in this
    # 30-minute run, which is no draw of the run's streams
    scenario = load_scenario("mixed")
    for spec in scenario.faults:
        spec.min_duration = None
    sim = ClusterSimulator(gpus=64, scenario=scenario, seed=4, interval=10.0, duration=1800, random_faults=True,
                           fault_acceleration=30000.0)  # 25 random faults: a changed mix changes them
    drawn = np.concatenate([sim.gpu.r_core, sim.gpu.r_hbm, sim.gpu.leak_scale, sim.gpu.dyn_scale, sim.cooling.rack_offset,
                            sim.workload.intensity, sim.workload.compute_s, sim.optics.tx_power])
    rounded = [round(float(x), 12) for x in drawn]  # (12 decimals: far above a last-bit difference)
    assert (len(rounded), hashlib.sha256(json.dumps(rounded).encode()).hexdigest()[:16]) == OLD_CONSTANTS
    failed: dict[str, list[tuple[int, int]]] = {"gpu": [], "link": []}
    for i, tick in enumerate(sim.iter_ticks()):
        for f in tick:
            if f.kind in failed:
                column = f.columns["xid_last" if f.kind == "gpu" else next(iter(f.columns))]
                failed[f.kind] += [(i, int(s)) for s in f.slot[np.isnan(column)]]
    faults = [[f.id, f.type, f.target_name, round(f.onset, 6), None if f.duration is None else round(f.duration, 6)]
              for f in sim.faults]
    assert faults == OLD_FAULTS
    for kind, (count, digest) in OLD_FAILED_READS.items():
        assert (len(failed[kind]), hashlib.sha256(json.dumps(failed[kind]).encode()).hexdigest()[:16]) == (count, digest)
    assert int(sim.gpu.pcie_replays.sum()) == OLD_PCIE_REPLAYS
    assert not replaced(sim)


# ---- real formats ------------------------------------------------------------------------------------
def test_dcgm_and_nvidia_smi_serve_the_board_in_the_slot_and_are_read_back_as_it(swap: Run) -> None:
    sim, topo = swap.sim, swap.sim.topology
    g = topo.slot("gpu", SWAPPED)
    node = topo.nodes[int(topo.gpu_node[g])]
    new = replaced(sim)[0].detail["new_uuid"]
    for frame in (swap.gpu[10], next(f for f in swap.gpu if f.ts[0] >= swap.returned), swap.gpu[-1]):
        read = ~np.isnan(frame.columns["board_id"])
        health, uuids = PipelineHealth(), dict[str, str]()
        parse_dcgm_text(dcgm_exposition(frame, topo), float(frame.ts[0]), health, uuids=uuids)
        smi: dict[str, str] = {}
        parse_query_gpu(nvidia_smi_csv(frame, topo, node), host=node, ts=float(frame.ts[0]), health=health, uuids=smi)
        assert health.total_problems() == 0
        served = {name: float(uuid_number(u)) for name, u in uuids.items()}
        assert served == {topo.gpus[s]: b for s, b in zip(frame.slot[read], frame.columns["board_id"][read])}
        on_node = read & (topo.gpu_node[frame.slot] == topo.gpu_node[g])
        assert smi == {topo.gpus[s]: uuids[topo.gpus[s]] for s in frame.slot[on_node]}
        assert (uuids[SWAPPED] == new) == (frame.ts[0] >= swap.returned)
    # a frame that carries no board (recorded before boards were simulated): the slot's first
    # board by dcgm, as it always served; none by nvidia-smi
    frame = swap.gpu[-1]
    bare = Frame("gpu", frame.ts, frame.slot, {k: v for k, v in frame.columns.items() if k != "board_id"})
    uuids = {}
    parse_dcgm_text(dcgm_exposition(bare, topo), float(frame.ts[0]), uuids=uuids)
    assert uuids[SWAPPED] == replaced(sim)[0].detail["old_uuid"]
    assert "[N/A]" in nvidia_smi_csv(bare, topo, node).splitlines()[1]
    # a number that is none of the slot's boards names no UUID
    columns = {**frame.columns, "board_id": frame.columns["board_id"] + 1.0}
    with pytest.raises(ValueError, match="none of the simulator's boards"):
        dcgm_exposition(Frame("gpu", frame.ts, frame.slot, columns), topo)


# ---- the pipeline ------------------------------------------------------------------------------------
def findings_on(run_: Run, drop_boards: bool) -> tuple[EmbeddedPipeline, list[Finding]]:
    """The embedded pipeline (every default detector, as ``foreshock replay`` runs it) over the
    run's ticks; the GPU's findings from its return on that still stand (no withdrawal)."""
    sim = run_.sim
    p = EmbeddedPipeline(sim.topology, DetectorBank.from_names(sim.topology, None, processors=()))
    g = sim.topology.slot("gpu", SWAPPED)
    found: list[Finding] = []
    for tick in run_.ticks:
        for frame in tick:
            if drop_boards and frame.kind == "gpu":
                frame = Frame("gpu", frame.ts, frame.slot, {k: v for k, v in frame.columns.items() if k != "board_id"})
            found += p.process(frame)
    return p, [f for f in found if isinstance(f, (Anomaly, Prediction)) and f.entity_kind == "gpu" and f.slot == g
               and f.ts >= run_.returned and not (isinstance(f, Prediction) and not f.active)]


def test_the_pipeline_restarts_the_swapped_gpu_and_flags_its_return_without_the_board(swap: Run) -> None:
    """With the boards, the pipeline finds the swap at the GPU's return, restarts it, and the new
    board is not judged against the old one's history: nothing flagged, nothing predicted. With
    the board_id column dropped, the univariate detectors flag the GPU as it comes back.

    What that flag is about: the same GPU back on its own board after an XID 79 of the same
    length is flagged the same way — it is the return from an idle outage (cold, then loading
    again) that the old board's baseline judges, not the new board's 13.5 % higher resistance,
    which no detector flags within the 40 minutes after (the thermal fit follows the new board
    either way)."""
    tracked, found = findings_on(swap, drop_boards=False)
    assert tracked.health.gpus_replaced == {"guard": 1}
    assert found == []
    untracked, flagged = findings_on(swap, drop_boards=True)
    assert not untracked.health.gpus_replaced
    assert any(isinstance(f, Anomaly) for f in flagged)
    _, same_board = findings_on(run([FaultSpec("xid79", SWAPPED, ONSET, OUT)]), drop_boards=False)
    assert {(f.detector, f.field) for f in same_board if isinstance(f, Anomaly)} == \
        {(f.detector, f.field) for f in flagged if isinstance(f, Anomaly)}
