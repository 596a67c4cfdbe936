"""A Kafka detection worker restarted on changed hardware, or under a job list written in another
order, keeps the straggler detector's busy means of every GPU still in the same job (2026-12-05).

The detector saves each GPU's job slot (``gpu_job_saved``) and the job list's keys, and starts a GPU
afresh whose job is not the one it was saved in. A detection checkpoint is a delta from a fresh
stage's state, and its hardware layout holds no jobs: the saved job slots, equal to the fresh ones,
were written as no change and read back against the loader's base — on changed hardware a
topology without jobs (no job for any GPU), under a reordered job list the slots of the new list.
Every GPU then read as moved to another job and lost its busy means (300 samples to 0): the
restarted worker needed a new warm-up and did not find what one that never stopped finds.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from foreshock.detectors import straggler as sg
from foreshock.detectors.bank import DetectorBank
from foreshock.fields import field_names
from foreshock.frames import Frame
from foreshock.remap import Remap
from foreshock.streams.kafka_codec import PartitionMap, encode_bundle
from foreshock.streams.kafka_worker import DetectionStage
from foreshock.topology import Topology

JOBS = [("A", ["n0", "n1"]), ("B", ["n2", "n3"])]
STEP_S = 10.0  # one telemetry row per GPU every 10 s
SAVED_AT_S = 720.0  # 72 busy samples per GPU before the save: means well under way


def topology(jobs: list[tuple[str, list[str]]], new_rack: bool = False) -> Topology:
    """Two racks of two 8-GPU nodes; ``new_rack``: a third rack whose node is listed first, so
    every GPU already there has another slot (the jobs are the same)."""
    nodes = [{"name": f"n{i}", "rack": f"k{i // 2}", "gpus": 8} for i in range(4)]
    racks = [{"name": "k0", "row": "r"}, {"name": "k1", "row": "r"}]
    if new_rack:
        nodes = [{"name": "nN", "rack": "kN", "gpus": 8}] + nodes
        racks.append({"name": "kN", "row": "r"})
    return Topology.from_dict({"rows": [{"name": "r"}], "racks": racks, "nodes": nodes,
                               "jobs": [{"name": j, "nodes": ns} for j, ns in jobs]})


def gpu_frame(topo: Topology, t: float) -> Frame:
    """Every GPU busy at near its maximum clock (a little noise: the peers' spread is not zero)."""
    n = topo.size("gpu")
    rng = np.random.default_rng(int(t))
    columns = {name: np.zeros(n) for name in field_names("gpu")}
    columns.update({"sm_clock": 1.98e9 * (1 - 0.005 * rng.random(n)), "sm_clock_max": np.full(n, 1.98e9),
                    "util": np.ones(n), "gpu_temp": np.full(n, 60.0), "hbm_temp": np.full(n, 60.0),
                    "power": np.full(n, 500.0), "power_limit": np.full(n, 700.0), "energy": t * 500.0 + np.zeros(n),
                    "board_id": np.arange(n, dtype=float) + 1.0})
    return Frame("gpu", np.full(n, t), np.arange(n, dtype=np.int32), columns)


def straggler_only(topo: Topology) -> DetectorBank:
    return DetectorBank.from_names(topo, ["straggler"], processors=())


def feed(stage: DetectionStage, until_s: float) -> None:
    """GPU frames from 0 s to ``until_s`` into a two-partition stage, as the agents send them."""
    pmap, offsets = PartitionMap(stage.topology, 2), Counter[int]()
    for seq, t in enumerate(np.arange(0.0, until_s, STEP_S), 1):
        messages = pmap.messages(gpu_frame(stage.topology, float(t)))
        for index, (part, piece) in enumerate(messages):
            if not stage.owns(part):
                stage.load(part, None)
            value, headers = encode_bundle("a", 0.0, [(seq, index, len(messages), piece)], topology=stage.topology)
            assert not stage.process(part, offsets[part], value, headers).dead_letters
            offsets[part] += 1


def straggler(stage: DetectionStage, part: int) -> Any:
    (det,) = [d for d in stage.parts[part].pipeline.bank.detectors if d.name == "straggler"]
    return det


def busy_samples(stage: DetectionStage, part: int) -> dict[str, float]:
    """Per GPU the partition owns, by name, its busy sample count (``S_N``)."""
    det, owned = straggler(stage, part), PartitionMap(stage.topology, 2).owned_by(part)["gpu"]
    return {stage.topology.gpus[g]: float(det.s_gpu[g, sg.S_N]) for g in np.flatnonzero(owned)}


def restarted_on(saver: DetectionStage, topo: Topology) -> DetectionStage:
    stage = DetectionStage(topo, straggler_only, 2)
    for p in range(2):
        stage.load(p, saver.checkpoint(p)[1])
    assert not stage.health.problems, stage.health.problems
    return stage


def saved_stage() -> DetectionStage:
    stage = DetectionStage(topology(JOBS), straggler_only, 2)
    feed(stage, SAVED_AT_S)
    return stage


def test_remap_state_keeps_the_means_of_gpus_still_in_their_job() -> None:
    """The detector on its own: a state moved onto the hardware with a rack added (every GPU slot
    moved, the jobs the same) keeps each GPU's busy samples at its new slot; the new node's GPUs
    start with none."""
    old, new = topology(JOBS), topology(JOBS, new_rack=True)
    det = sg.StragglerDetector(old)
    for t in np.arange(0.0, SAVED_AT_S, STEP_S):
        det.update(gpu_frame(old, float(t)))
    saved = {g: float(det.s_gpu[old.slot("gpu", g), sg.S_N]) for g in old.gpus}
    assert min(saved.values()) > 0  # means were under way: there is something to keep
    moved = sg.StragglerDetector(new)
    moved.load_state_dict(moved.remap_state(det.state_dict(), Remap(old, new)))
    assert {g: float(moved.s_gpu[new.slot("gpu", g), sg.S_N]) for g in old.gpus} == saved
    assert all(moved.s_gpu[new.slot("gpu", g), sg.S_N] == 0 for g in new.gpus if g.startswith("nN/"))


def test_a_worker_restarted_with_a_rack_added_keeps_every_owned_gpus_busy_means() -> None:
    """The Kafka path: each partition's checkpoint loaded by a stage of the grown hardware
    (``DetectionStage._load_moved``). Before, every GPU read as saved in no job, so as moved, and
    every busy sample count fell to 0."""
    saver = saved_stage()
    restarted = restarted_on(saver, topology(JOBS, new_rack=True))
    for p in range(2):
        before, after = busy_samples(saver, p), busy_samples(restarted, p)
        kept = {g: n for g, n in after.items() if g in before}
        assert kept and min(kept.values()) > 0
        assert kept == before
        assert all(n == 0 for g, n in after.items() if g not in before)  # the new node's GPUs: fresh


def test_a_worker_restarted_under_the_job_list_reordered_keeps_the_means() -> None:
    """The same hardware, the same jobs listed in another order: no GPU changed job. Before, the
    saved job slots were read as the new list's and mapped through the saved list's keys: A's
    GPUs read as saved in B and the reverse, and all were started afresh."""
    saver = saved_stage()
    restarted = restarted_on(saver, topology(list(reversed(JOBS))))
    for p in range(2):
        before = busy_samples(saver, p)
        assert min(before.values()) > 0
        assert busy_samples(restarted, p) == before


def test_a_worker_restarted_under_another_job_list_starts_afresh_only_the_gpus_that_changed_job() -> None:
    """B listed first and unchanged, A replaced by a new job C on its nodes: n0's and n1's GPUs
    changed job and start afresh (their means were of A), n2's and n3's keep theirs. Before, B's
    GPUs read as saved in slot 0 of the new list (B's slot now), which the saved keys (A, B) name
    as A, no longer listed: they were started afresh too."""
    saver = saved_stage()
    restarted = restarted_on(saver, topology([("B", ["n2", "n3"]), ("C", ["n0", "n1"])]))
    # the partitions own every GPU between them, of both racks: both cases below are looked at
    assert sorted(g for p in range(2) for g in busy_samples(restarted, p)) == sorted(restarted.topology.gpus)
    for p in range(2):
        before, after = busy_samples(saver, p), busy_samples(restarted, p)
        assert min(before.values()) > 0
        assert {g: n for g, n in after.items() if g[:2] in ("n0", "n1")} == \
            {g: 0.0 for g in after if g[:2] in ("n0", "n1")}
        assert {g: n for g, n in after.items() if g[:2] in ("n2", "n3")} == \
            {g: n for g, n in before.items() if g[:2] in ("n2", "n3")}
