"""`foreshock evaluate` on a recording in which GPU boards are swapped (the simulator's
``gpu_replacement`` fault and an XID 79 repaired by a new board).

The evaluation runs the bank itself, not the embedded pipeline: until 2026-12-02 it never looked for
a board change, so a swapped GPU went on with its old board's state, and what had been predicted of
the old board (an HBM overheating, here) stayed a claim to the end of the recording. It now runs a
swap as the pipeline does (``EmbeddedPipeline.process_rows``): the rows before it, the GPU restarted
as a new one, the old board's predictions withdrawn, the rest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from foreshock.detectors import evaluation
from foreshock.detectors.incident_eval import fault_truths
from foreshock.findings import Prediction
from foreshock.recording import Recording
from foreshock.simulator import ClusterSimulator

pytestmark = pytest.mark.slow  # long end-to-end runs


@pytest.fixture(scope="module")
def swapped(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    path = Path(tmp_path_factory.mktemp("swap")) / "rec"
    ClusterSimulator(gpus=16, scenario="gpu-replacement", seed=1, interval=10.0).record(path)
    return Recording.open(path)


def test_evaluate_withdraws_what_was_predicted_of_a_board_at_its_swap(swapped: Recording) -> None:
    """node1/gpu2's HBM overheats (predicted), the GPU is taken out and comes back on a new board
    whose HBM is cool: every prediction on it is withdrawn by the return's first row — once its
    temperatures have gone unread for off_hold_s while it is out (since 2026-12-04: the rows of a GPU
    taken out still come, without readings), else at the return, as made of another board — none is
    raised on the new board after, and both swaps are counted."""
    result = evaluation.run_recording(swapped, ["foreshock"], log_scores=False)
    topo = swapped.topology
    gpu = topo.gpus.index("node1/gpu2")
    back = [ev.time for ev in swapped.events() if ev.type == "gpu_replaced" and ev.entity == "node1/gpu2"]
    assert len(back) == 1
    mine = [f for f in result.findings["foreshock"] if isinstance(f, Prediction) and f.entity_kind == "gpu"
            and f.slot == gpu]
    raised_before = {f.event for f in mine if f.active and f.ts < back[0]}
    assert "hbm_overheat" in raised_before
    for event in raised_before:
        last_raised = max(f.ts for f in mine if f.event == event and f.active)
        (withdrawn,) = [f for f in mine if f.event == event and not f.active and f.ts > last_raised]
        assert withdrawn.ts <= back[0] + swapped.interval
        assert "another board" in withdrawn.reason or "temperature no longer read" in withdrawn.reason
    assert not [f for f in mine if f.active and f.ts > back[0]]
    assert sum(result.health.gpus_replaced.values()) == 2  # node1/gpu2 and the XID 79 repaired by a swap
    assert evaluation.score(result)["meta"]["gpus_replaced"] == 2


def test_a_board_swap_is_no_fault_the_incidents_must_find(swapped: Recording) -> None:
    """A swap is the operator's own work: scored as a fault, it took node1/gpu2's incident from the
    HBM overheating that incident was about."""
    kinds = {f.fault_type for f in fault_truths(swapped.events(), swapped.topology)}
    assert "gpu_replacement" not in kinds and {"hbm_overheat", "xid79"} <= kinds


def test_a_fault_a_board_swap_cured_ends_at_the_swap(swapped: Recording) -> None:
    """The overheating HBM's fault ends with its board: the recording's fault list says so (the
    simulator shortens a cured fault's duration), while its onset event only says what was planned
    (none: to the end). The incidents section read the event and kept the fault on for good, so an
    incident on the new board could still be credited to it (review h17)."""
    durations = {str(f["id"]): float(f["duration_s"]) for f in swapped.meta["faults"]
                 if isinstance(f.get("duration_s"), (int, float))}
    hbm = next(f for f in fault_truths(swapped.events(), swapped.topology, durations) if f.fault_type == "hbm_overheat")
    back = next(ev.time for ev in swapped.events() if ev.type == "gpu_replaced" and ev.entity == "node1/gpu2")
    assert hbm.end == pytest.approx(back, abs=swapped.interval)
