"""Review r92: an nvidia-smi that fails for one GPU still yields the others' rows (R1), and the
cells of a failed GPU (``[GPU is lost]``, ``[Unknown Error]``) are counted once per GPU as it
enters that state, not read as "no value" (R2)."""

from __future__ import annotations

import logging
import math
import stat
from pathlib import Path

import numpy as np
import pytest

from foreshock.health import PipelineHealth
from foreshock.streams.nvidia_smi import NvidiaSmiSource, parse_query_gpu, parse_query_gpu_chunks
from foreshock.streams.polling import run_command
from foreshock.streams.samples import parse_token

HEADER = "timestamp, index, temperature.gpu, power.draw [W], uuid"
LOST_MESSAGE = "Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error"


def _row(index: int, temp: str = "52", power: str = "627.40 W", uuid: str | None = None) -> str:
    return f"2026/07/03 22:11:09.763, {index}, {temp}, {power}, {uuid or f'GPU-000{index}'}\n"


def pages_stub(tmp_path: Path, pages: list[tuple[str, int]]) -> Path:
    """An nvidia-smi printing ``pages`` in turn (stdout, exit status), then the last again."""
    for i, (page, status) in enumerate(pages):
        (tmp_path / f"page{i}.csv").write_text(page)
        (tmp_path / f"status{i}").write_text(f"{status}\n")
    counter = tmp_path / "served"
    counter.write_text("0\n")
    stub = tmp_path / "nvidia-smi"
    stub.write_text(f'#!/bin/sh\nn=$(cat {counter})\n'
                    f'[ "$n" -lt {len(pages) - 1} ] && echo $((n + 1)) > {counter}\n'
                    f'cat {tmp_path}/page$n.csv\nexit $(cat {tmp_path}/status$n)\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return stub


def _polls(stub: Path, health: PipelineHealth, polls: int) -> list:
    source = NvidiaSmiSource(executable=str(stub), interval=0.02, host="n1", health=health, max_polls=polls)
    return [source.poll() for _ in range(polls)]


# ---- R1: a non-zero exit with the healthy GPUs' rows on stdout ------------------------------------
def test_a_gpu_nvidia_smi_cannot_read_does_not_blind_the_source_to_the_others(tmp_path: Path) -> None:
    """The stub of /tmp/r92/smi_stub.sh: 7 rows, GPU 3's error line among them, exit 15."""
    healthy = [0, 1, 2, 4, 5, 6, 7]
    page = HEADER + "\n" + "".join(_row(i) for i in healthy[:3]) + LOST_MESSAGE + "\n" \
        + "".join(_row(i) for i in healthy[3:])
    health = PipelineHealth()
    source = NvidiaSmiSource(executable=str(pages_stub(tmp_path, [(page, 15)])), interval=0.02, host="n1",
                             health=health, max_polls=3)
    for _ in range(3):
        [frame] = source.poll()
        assert source.topology is not None
        assert [source.topology.gpus[s] for s in frame.slot] == [f"n1/gpu{i}" for i in healthy]
        assert frame.columns["power"].tolist() == [627.40] * 7
    assert health.problems[("nvidia-smi", "command failed")] == 3  # the exit, at every poll
    assert health.problems[("nvidia-smi", "error message in output")] == 3  # the line that is no row
    assert ("nvidia-smi", "truncated row") not in health.problems  # (not counted as a bad row too)


def test_an_error_line_before_the_header_leaves_the_rows_readable(tmp_path: Path) -> None:
    page = LOST_MESSAGE + "\n" + HEADER + "\n" + _row(0) + _row(1)
    health = PipelineHealth()
    [frames] = _polls(pages_stub(tmp_path, [(page, 15)]), health, 1)
    assert len(frames) == 1 and len(frames[0]) == 2
    assert health.problems[("nvidia-smi", "error message in output")] == 1


def test_a_failed_run_without_a_csv_header_yields_nothing_and_is_counted(tmp_path: Path) -> None:
    page = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    health = PipelineHealth()
    assert _polls(pages_stub(tmp_path, [(page, 9)]), health, 2) == [[], []]
    assert health.problems[("nvidia-smi", "command failed")] == 2
    assert ("nvidia-smi", "error message in output") not in health.problems


def test_each_new_exit_status_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    page = HEADER + "\n" + _row(0) + LOST_MESSAGE + "\n"
    stub = pages_stub(tmp_path, [(page, 15), (page, 15), (page, 16), (page, 16)])
    with caplog.at_level(logging.WARNING):
        _polls(stub, PipelineHealth(), 4)
    told = [r.getMessage() for r in caplog.records if "exit 1" in r.getMessage()]
    assert len(told) == 2 and "exit 15 (a GPU has fallen off the bus" in told[0] and "exit 16" in told[1]
    assert LOST_MESSAGE in told[0]


def test_run_command_still_fails_on_a_non_zero_exit_whatever_it_printed() -> None:
    """squeue and ethtool keep their behaviour: their output is not read after a failure."""
    health = PipelineHealth()
    out, why = run_command(["/bin/sh", "-c", "echo 'a, b'; echo '1, 2'; exit 3"], health, "t")
    assert out is None and "a, b" in why
    assert health.problems[("t", "command failed")] == 1


# ---- R2: the cells of a failed GPU ----------------------------------------------------------------
def test_fault_tokens_are_not_read_as_no_value() -> None:
    for token in ("[GPU is lost]", "[GPU requires reset]", "[Unknown Error]"):
        value, ok = parse_token(token)
        assert math.isnan(value) and not ok
    for token in ("[N/A]", "[Not Supported]", "[Insufficient Permissions]",
                  "[Requested functionality has been deprecated]"):
        value, ok = parse_token(token)
        assert math.isnan(value) and ok


def test_each_failed_gpu_is_counted_once_under_its_reason_not_per_cell() -> None:
    text = ("timestamp, index, uuid, temperature.gpu, power.draw [W], clocks.current.sm [MHz]\n"
            "2026/07/03 22:11:09.763, 0, GPU-a, 52, 627.40 W, 1980 MHz\n"
            "2026/07/03 22:11:09.763, 1, GPU-b, [GPU is lost], [GPU is lost], [GPU is lost]\n"
            "2026/07/03 22:11:09.763, 2, GPU-c, [GPU requires reset], [GPU requires reset], [GPU requires reset]\n"
            "2026/07/03 22:11:09.763, 3, GPU-d, [Unknown Error], [Unknown Error], [Unknown Error]\n"
            "2026/07/03 22:11:09.763, 4, GPU-e, [N/A], [N/A], [N/A]\n"
            "2026/07/03 22:11:09.763, 5, GPU-f, [Unknown Error], garbled, [GPU is lost]\n")
    health = PipelineHealth()
    batch = parse_query_gpu(text, host="n1", health=health)
    assert len(batch) == 6 and np.isnan(batch.column("power")[1:5]).all()
    assert health.problems[("nvidia-smi", "GPU lost or requires reset")] == 3  # gpu1, gpu2, gpu5 (its worst)
    assert health.problems[("nvidia-smi", "unknown error")] == 1  # gpu3
    assert health.problems[("nvidia-smi", "non-numeric value")] == 1  # gpu5's "garbled" only
    assert health.total_problems() == 5  # [N/A] is no problem


def test_a_gpu_is_counted_at_each_change_of_its_state_across_polls(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    healthy = HEADER + "\n" + _row(0) + _row(1)
    lost = HEADER + "\n" + _row(0) + _row(1, "[GPU is lost]", "[GPU is lost]", "[GPU is lost]")
    odd = HEADER + "\n" + _row(0, power="[Unknown Error]") + _row(1)  # one field failing on GPU 0
    pages = [(healthy, 0), (lost, 15), (lost, 15), (lost, 15), (healthy, 0), (lost, 15), (odd, 0), (odd, 0)]
    health = PipelineHealth()
    with caplog.at_level(logging.WARNING):
        polls = _polls(pages_stub(tmp_path, pages), health, len(pages))
    assert [len(frames[0]) for frames in polls] == [2] * len(pages)  # the lost GPU's row is kept, NaN
    assert health.problems[("nvidia-smi", "GPU lost or requires reset")] == 2  # lost twice, not 4 polls
    assert health.problems[("nvidia-smi", "unknown error")] == 1  # two polls, one state
    assert ("nvidia-smi", "non-numeric value") not in health.problems
    told = [r.getMessage() for r in caplog.records if "GPU lost or requires reset" in r.getMessage()]
    assert len(told) == 1 and "n1/gpu1" in told[0]


def test_a_long_file_counts_a_gpu_lost_across_its_chunks_once() -> None:
    rows = [f"2026/07/03 22:11:{s:02d}.000, 0, [GPU is lost], [GPU is lost], GPU-a\n" for s in range(5)]
    rows.append("2026/07/03 22:11:06.000, 0, 50, 600 W, GPU-a\n")
    rows.append("2026/07/03 22:11:07.000, 0, [GPU is lost], [GPU is lost], GPU-a\n")
    health = PipelineHealth()
    batches = list(parse_query_gpu_chunks(HEADER + "\n" + "".join(rows), host="n1", health=health, chunk_rows=2))
    assert sum(len(b) for b in batches) == 7
    assert health.problems[("nvidia-smi", "GPU lost or requires reset")] == 2  # lost, back, lost again
