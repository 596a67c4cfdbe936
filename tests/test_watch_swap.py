"""``foreshock watch`` over a dcgm-exporter where a GPU board is swapped in its slot (an RMA: the
name stays, dcgm-exporter's ``UUID`` label changes): that GPU's detector state starts afresh, so
the new board is not judged against the old one's history."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from foreshock.cli import watch
from foreshock.detectors.thermal_fit import CORE, G_SIZE, M_LOADED, M_RL, M_SIZE
from foreshock.frames import Frame
from foreshock.simulator.formats import dcgm_exposition
from foreshock.topology import Topology

from board_ids import uuid_number
from test_watch import stamped
from test_watch_churn import watch_pages
from thermal_synth import World, small_topology

pytestmark = pytest.mark.slow  # long end-to-end runs

SWAP = 150  # node0/gpu3's board is replaced from this scrape on (1500 s of telemetry in)
POLLS = 300
SWAPPED = "node0/gpu3"
SLOT = 3


def another_board(topology: Topology, slot: int, swap: int) -> tuple[list[Frame], int]:
    """A simulated run's gpu frames (``POLLS`` of them, 10 s apart) where ``slot``'s readings from
    frame ``swap`` on are those of another board: the world's GPU whose thermal resistance differs
    most from its own (returned beside them)."""
    frames = [f for f in World(topology, seed=1).run(POLLS * 10.0)[0] if f.kind == "gpu"]
    resistance = np.mean([(f.columns["gpu_temp"] - 24.0) / f.columns["power"] for f in frames], axis=0)
    board = int(np.argmax(np.abs(resistance - resistance[slot])))
    assert abs(resistance[board] - resistance[slot]) > 0.02 * resistance[slot]  # a board that differs

    def served(i: int, frame: Frame) -> Frame:
        if i < swap:
            return frame
        columns = {name: column.copy() for name, column in frame.columns.items()}
        for column in columns.values():
            column[slot] = column[board]
        return Frame("gpu", frame.ts, frame.slot, columns)

    return [served(i, f) for i, f in enumerate(frames)], board


def assert_restarted(before: np.ndarray, after: np.ndarray, slot: int, swap: int, board: int) -> None:
    """``slot``'s core model (fit states ``before``: a run without the swap, ``after``: with it)
    learnt from the new board's first poll (``swap``) on, towards the resistance of the ``board``
    its readings are copied from."""
    core = G_SIZE + CORE * M_SIZE
    # loaded seconds: every poll of the run without the swap; from the new board's first on
    assert before[slot, core + M_LOADED] == (POLLS - 1) * 10.0
    assert (POLLS - swap - 1) * 10.0 <= after[slot, core + M_LOADED] <= (POLLS - swap - 1) * 10.0 + 120.0
    # the new board's resistance, learnt as the board it was copied from learnt it
    r_new = after[board, core + M_RL]
    assert abs(after[slot, core + M_RL] - r_new) < 0.5 * abs(before[slot, core + M_RL] - r_new)


@pytest.fixture(scope="module")
def boards() -> tuple[list[str], list[str], int]:
    """The pages of two nodes' GPUs where node0/gpu3's readings from ``SWAP`` on are those of
    another board (the world's GPU whose thermal resistance differs most from its own): served
    with its UUID as before (``same``) and with a new one (``swapped``)."""
    topology = small_topology(nodes=2, gpus=8, racks=1)
    frames, board = another_board(topology, SLOT, SWAP)
    same = [stamped(dcgm_exposition(f, topology), float(f.ts[0])) for f in frames]
    old = same[0].split('gpu="3",UUID="', 1)[1].split('"', 1)[0]
    assert same[-1].count(f'UUID="{old}"') == same[-1].count('gpu="3",') // 2  # node0's gpu3 only, node1's not
    swapped = same[:SWAP] + [page.replace(f'UUID="{old}"', 'UUID="GPU-0f1e2d3c-new0-board-0000-000000000003"')
                             for page in same[SWAP:]]
    assert swapped[SWAP] != same[SWAP]
    return same, swapped, board


def _watch(pages: list[str], monkeypatch: Any, findings: Path) -> tuple[Any, str, list[str]]:
    """Watch ``pages`` (served once each); the pipeline run, at the end, /metrics read as the last
    page is requested, and the entities of the findings."""
    runs: list[Any] = []
    build = watch.build_pipeline

    def keep(*args: Any, **kwargs: Any) -> Any:
        runs.append(build(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(watch, "build_pipeline", keep)
    _, metrics = watch_pages(pages, findings)
    return runs[0], metrics, [json.loads(line)["entity"] for line in findings.read_text().splitlines()]


def test_a_gpu_whose_board_is_swapped_starts_its_detector_state_afresh(boards, monkeypatch, caplog, tmp_path: Path):
    """The thermal fit of node0/gpu3 restarts at the first scrape of the new board: its loaded time
    counts from there and its resistance is the new board's own (the board it was copied from);
    a run served the same readings under the old UUID carries the old board's fit on. Every other
    GPU's state is that of the run without the swap; the univariate detectors, which flag the
    step from one board to the other when the UUID is ignored, do not flag it; the swap is counted
    and logged once by the source, naming both UUIDs, and once by the pipeline that restarted the
    GPU, naming both boards' numbers."""
    same, swapped, board = boards
    kept, _, kept_found = _watch(same, monkeypatch, tmp_path / "same.jsonl")
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        fresh, metrics, fresh_found = _watch(swapped, monkeypatch, tmp_path / "swapped.jsonl")

    lines = [r.getMessage() for r in caplog.records if "replaced" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"GPU {SWAPPED} replaced: UUID GPU-")
    assert "-> GPU-0f1e2d3c-new0-board-0000-000000000003" in lines[0]
    assert 'foreshock_gpus_replaced_total{cluster="default",stage="dcgm"} 1.0' in metrics
    # the source only carried the new board (board_id): the pipeline's guard found it and restarted the GPU
    old = lines[0].split("UUID ", 1)[1].split(" ", 1)[0]
    restarted = [r.getMessage() for r in caplog.records if "another board in its slot" in r.getMessage()]
    assert restarted == [f"GPU {SWAPPED}: another board in its slot (board_id {uuid_number(old)} -> "
                         f"{uuid_number('GPU-0f1e2d3c-new0-board-0000-000000000003')}); its detector state starts "
                         "afresh (input guard and /metrics state kept, but for the old board's limits and flags)"]
    assert 'foreshock_gpus_replaced_total{cluster="default",stage="guard"} 1.0' in metrics
    assert "foreshock_topology_changes_total{" not in metrics  # the topology is the same one

    for name in ("thermal", "cooling"):
        before = next(d for d in kept.pipeline.bank.detectors if d.name == name).s_model
        after = next(d for d in fresh.pipeline.bank.detectors if d.name == name).s_model
        others = np.arange(len(before)) != SLOT
        np.testing.assert_array_equal(after[others], before[others])
        assert_restarted(before, after, SLOT, SWAP, board)
    assert SWAPPED in kept_found and SWAPPED not in fresh_found
