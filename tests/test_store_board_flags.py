"""The flags /metrics exports about a GPU follow its board: a new board in a slot (an RMA) keeps
none of the old board's, and a board that moved to another index (a GPU missing at a reboot
renumbers the node's later ones) takes its own along. Both had stayed with the index: the store
kept a cooling flag for up to 900 s on the board that mended it, and on the healthy board now in
the flagged one's old index (a helper's audit, repros in /tmp/audit_remap/)."""

from __future__ import annotations

import numpy as np

from foreshock.detectors.bank import DetectorBank
from foreshock.findings import Anomaly
from foreshock.frames import Frame
from foreshock.streams.embedded import EmbeddedPipeline

from thermal_synth import World, small_topology

MISSING = 3  # node0/gpu3, the GPU swapped, or missing at the reboot


def _run(after: str) -> tuple[EmbeddedPipeline, list[tuple[str, str]]]:
    """200 polls of 16 GPUs with boards 1000 + slot; a cooling flag on board 1004 (node0/gpu4) at
    poll 100; then ``after``: ``swap`` (a new board in gpu4) or ``renumber`` (gpu3 missing, the
    node's later boards one index down). Returns the pipeline and the cooling flags exported
    then, by GPU name and reason."""
    topo = small_topology(nodes=2, gpus=8, racks=1)
    frames = [f for f in World(topo, seed=3).run(200 * 10.0)[0] if f.kind == "gpu"]
    pipeline = EmbeddedPipeline(topo, DetectorBank.from_names(topo, None, processors=()))

    def as_read(frame: Frame, later: bool) -> Frame:
        boards = 1000.0 + frame.slot
        if not later:
            return Frame("gpu", frame.ts, frame.slot, {**frame.columns, "board_id": boards})
        if after == "swap":
            return Frame("gpu", frame.ts, frame.slot,
                         {**frame.columns, "board_id": np.where(frame.slot == 4, 5555.0, boards)})
        keep = frame.slot != MISSING
        physical = frame.slot[keep]
        slot = np.where((physical > MISSING) & (physical < 8), physical - 1, physical)
        return Frame("gpu", frame.ts[keep], slot,
                     {**{k: v[keep] for k, v in frame.columns.items()}, "board_id": boards[keep]})

    for frame in frames[:100]:
        pipeline.process(as_read(frame, False))
    pipeline.store.observe_findings([Anomaly(float(frames[99].ts.max()), "gpu", 4, "gpu_temp", 5.0, "cooling",
                                             "board 1004: thermal interface degrading")])
    assert [a.slot for a in pipeline.store.snapshot().anomalies if a.detector == "cooling"] == [4]
    for frame in frames[100:130]:
        pipeline.process(as_read(frame, True))
    flags = [(topo.name("gpu", a.slot), a.reason) for a in pipeline.store.snapshot().anomalies
             if a.detector == "cooling"]
    return pipeline, flags


def test_a_new_board_in_a_slot_is_not_exported_with_the_old_boards_flags() -> None:
    pipeline, flags = _run("swap")
    assert pipeline.store.snapshot().last_ts > 0
    assert flags == []  # 290 s after the swap: the old board's flag had stood (900 s for a cooling flag)


def test_a_moved_boards_flags_move_with_it() -> None:
    _, flags = _run("renumber")
    # board 1004 is node0/gpu3 now; node0/gpu4 holds healthy board 1005
    assert flags == [("node0/gpu3", "board 1004: thermal interface degrading (its board moved from node0/gpu4)")]


def test_restarting_gpus_forgets_their_flags_only() -> None:
    topo = small_topology(nodes=1, gpus=8, racks=1)
    pipeline = EmbeddedPipeline(topo, DetectorBank.from_names(topo, None, processors=()))
    pipeline.store.observe_findings([Anomaly(10.0, "gpu", s, "gpu_temp", 5.0, "cooling", "hot") for s in (2, 5)])
    pipeline.restart_gpus(np.array([5]))
    assert [a.slot for a in pipeline.store.snapshot().anomalies] == [2]
