"""A GPU nvidia-smi could not read at the poll the topology was derived from (exit non-zero, an
error line in place of its row) and read again later: with ``takes_in_new_gpus`` the source takes
it in after UNLISTED_POLLS steady polls, as the dcgm source does, so its rows reach the frames (it
was counted ``unknown gpu entity`` at every poll for good); a garbled index never grows the
topology."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from foreshock.health import PipelineHealth
from foreshock.streams.dcgm import UNLISTED_POLLS
from foreshock.streams.nvidia_smi import NvidiaSmiSource
from foreshock.topology import Topology

from test_smi_review_r92 import HEADER, LOST_MESSAGE, pages_stub

ALL = list(range(8))


def _page(indices: list[int], temp: float = 52.0, lost: bool = False) -> str:
    """nvidia-smi's output: a row per GPU in ``indices`` (GPU i at ``temp + i`` °C), and with
    ``lost`` the line it prints for the GPU it could not read."""
    rows = "".join(f"2026/07/03 22:11:09.763, {i}, {temp + i}, 627.40 W, GPU-000{i}\n" for i in indices)
    return HEADER + "\n" + rows + (LOST_MESSAGE + "\n" if lost else "")


def _gpu7_missing_at_first(later: int) -> list[tuple[str, int]]:
    """The first poll: GPU 7 unreadable (exit 15, the error line); then ``later`` polls of all 8."""
    return [(_page(ALL[:7], lost=True), 15)] + [(_page(ALL, temp=60.0 + k), 0) for k in range(later)]


def _source(stub: Path, polls: int, topology: Topology | None = None) -> NvidiaSmiSource:
    source = NvidiaSmiSource(executable=str(stub), interval=0.02, host="n1", health=PipelineHealth(),
                             max_polls=polls, topology=topology)
    source.takes_in_new_gpus = True
    return source


def _listed(source: NvidiaSmiSource) -> Topology:
    """The source's topology, derived by now."""
    assert source.topology is not None
    return source.topology


def test_a_gpu_lost_at_the_first_poll_is_taken_in_after_steady_polls(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    polls = 1 + UNLISTED_POLLS + 2
    source = _source(pages_stub(tmp_path, _gpu7_missing_at_first(polls - 1)), polls)
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        frames = [source.poll() for _ in range(polls)]
    assert all(len(f) == 1 for f in frames)
    # GPU 7 read at polls 1..UNLISTED_POLLS, taken in at the last of them: its rows flow from there on,
    # at slot 7 (the GPUs listed from the start keep theirs)
    assert [f[0].slot.tolist() for f in frames] == [ALL[:7]] * UNLISTED_POLLS + [ALL] * (polls - UNLISTED_POLLS)
    last = frames[-1][0]
    assert last.columns["gpu_temp"][last.slot == 7].tolist() == [60.0 + polls - 2 + 7]
    assert _listed(source).gpus == [f"n1/gpu{i}" for i in ALL]
    first = source.taken_topologies()
    assert len(first) == 1 and first[0] is source.topology and source.taken_topologies() == []
    unknown = source.health.problems[("nvidia-smi", "unknown gpu entity")]
    assert unknown == UNLISTED_POLLS - 1  # the polls before it was taken in, not every poll for good
    took = [r.getMessage() for r in caplog.records if "took in" in r.getMessage()]
    assert took == ["nvidia-smi: took in 1 GPU read after the topology was derived: n1/gpu7; it now lists 8 GPUs"]


def test_watch_moves_onto_the_grown_topology_once_and_gpu7_reaches_the_pipeline(tmp_path: Path) -> None:
    """Through ``foreshock watch``'s follower: one topology change counted (``move_run``:
    ``health.topology_changed``), and GPU 7's rows processed by the pipeline from then on."""
    from foreshock.cli import watch

    polls = 1 + UNLISTED_POLLS + 3
    source = _source(pages_stub(tmp_path, _gpu7_missing_at_first(polls - 1)), polls)
    frames = iter(source)
    first = next(frames)
    run = _real_run(_listed(source))
    run.pipeline.process(first)
    follower = watch._TopologyFollower(source, _listed(source))
    rows7 = 0
    for frame in follower.follow(follower.mark(frames), run):
        run.pipeline.process(frame)
        rows7 += int((frame.slot == 7).sum())
    assert run.pipeline.topology.size("gpu") == 8 and run.health.changes() == {"nvidia-smi": 1}
    assert rows7 == polls - UNLISTED_POLLS


def test_a_gpu_read_in_too_few_polls_in_a_row_is_not_taken_in(tmp_path: Path) -> None:
    pages = [(_page(ALL[:7], lost=True), 15)]
    pages += ([(_page(ALL), 0)] * (UNLISTED_POLLS - 1) + [(_page(ALL[:7], lost=True), 15)]) * 2
    source = _source(pages_stub(tmp_path, pages), len(pages))
    for _ in pages:
        source.poll()
    assert _listed(source).size("gpu") == 7


@pytest.mark.parametrize("garbled", ["4294967295", "-1", "1024"])
def test_a_garbled_index_read_steadily_never_grows_the_topology(tmp_path: Path, garbled: str) -> None:
    bad_row = f"2026/07/03 22:11:09.763, {garbled}, 52, 627.40 W, GPU-0bad\n"
    pages = [(_page(ALL), 0)] + [(_page(ALL) + bad_row, 0)] * (UNLISTED_POLLS + 2)
    source = _source(pages_stub(tmp_path, pages), len(pages))
    for _ in pages:
        source.poll()
    assert _listed(source).size("gpu") == 8
    assert source.health.problems[("nvidia-smi", "bad GPU index")] == UNLISTED_POLLS + 2


def test_without_takes_in_new_gpus_the_topology_stays_and_the_gpu_is_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``record`` and ``agent`` keep the first topology for good (their output is numbered by it)."""
    polls = 1 + UNLISTED_POLLS + 2
    source = _source(pages_stub(tmp_path, _gpu7_missing_at_first(polls - 1)), polls)
    source.takes_in_new_gpus = False
    derived = None
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        for _ in range(polls):
            source.poll()
            derived = derived or source.topology
    assert source.topology is derived and _listed(source).size("gpu") == 7
    assert source.health.problems[("nvidia-smi", "unknown gpu entity")] == polls - 1
    told = [r.getMessage() for r in caplog.records if "not in the topology" in r.getMessage()]
    assert told == ["nvidia-smi: 1 GPU not in the topology, their samples counted as unknown gpu entities: n1/gpu7; "
                    "restart to watch them (the topology was derived from the first poll)"]


def test_a_given_topology_never_grows(tmp_path: Path) -> None:
    given = Topology.from_gpu_hosts([("n1", i) for i in ALL[:7]])
    polls = 1 + UNLISTED_POLLS + 2
    source = _source(pages_stub(tmp_path, _gpu7_missing_at_first(polls - 1)), polls, topology=given)
    for _ in range(polls):
        source.poll()
    assert source.topology is given


def _real_run(topology: Topology) -> Any:
    """What ``watch.move_run`` reads of a run: a pipeline and the bank's factory; no server, no file."""
    from foreshock.detectors.bank import DetectorBank
    from foreshock.streams.embedded import EmbeddedPipeline

    pipeline = EmbeddedPipeline(topology, DetectorBank.from_names(topology), health=PipelineHealth())
    return SimpleNamespace(pipeline=pipeline, make_bank=DetectorBank.from_names, tally=SimpleNamespace(topology=None),
                           jsonl=None, health=pipeline.health)
