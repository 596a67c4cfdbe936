"""nvidia-smi input an audit found misread: a ``--query-gpu`` CSV without an ``index`` column (GPUs
merged into gpu0), a header that changes part-way (two captures appended to one file), dmon rows
placed in the wrong cycle after a row was left out, and a ``collected_at`` without a zone."""

from __future__ import annotations

import time

import numpy as np
import pytest

from foreshock.health import PipelineHealth
from foreshock.streams.nvidia_smi import (STAGE, capture_collected_at, parse_dmon, parse_query_gpu,
                                          parse_query_gpu_chunks)
from foreshock.streams.samples import SampleBatch

NUMBERED = (STAGE, "no index column: GPU numbered by first appearance")
T0 = "2026/07/03 22:11:09.763"
T1 = "2026/07/03 22:11:10.763"


def _series(batch: SampleBatch, field: str) -> dict[str, list[float]]:
    """GPU name -> its values of ``field``, in row order."""
    out: dict[str, list[float]] = {}
    for name, value in zip(batch.entity_names(), batch.columns[field].tolist()):
        out.setdefault(name, []).append(value)
    return out


# ---- --query-gpu without an index column ------------------------------------------------------
def test_without_an_index_column_gpus_are_told_apart_by_uuid_in_order_of_first_appearance() -> None:
    text = ("timestamp, uuid, temperature.gpu\n"
            f"{T0}, GPU-bbbb, 80\n{T0}, GPU-aaaa, 50\n"
            f"{T1}, GPU-bbbb, 81\n{T1}, GPU-aaaa, 51\n")
    health = PipelineHealth()
    uuids: dict[str, str] = {}
    batch = parse_query_gpu(text, host="n1", health=health, uuids=uuids)
    assert _series(batch, "gpu_temp") == {"n1/gpu0": [80.0, 81.0], "n1/gpu1": [50.0, 51.0]}
    assert uuids == {"n1/gpu0": "GPU-bbbb", "n1/gpu1": "GPU-aaaa"}
    assert health.problems == {NUMBERED: 2}  # once per GPU numbered, not per row


def test_without_an_index_column_the_bus_id_names_the_slot_through_a_board_swap() -> None:
    text = ("timestamp, pci.bus_id, uuid, temperature.gpu\n"
            f"{T0}, 00000000:1B:00.0, GPU-aaaa, 50\n{T0}, 00000000:3B:00.0, GPU-bbbb, 60\n"
            f"{T1}, 00000000:1B:00.0, GPU-cccc, 51\n{T1}, 00000000:3B:00.0, GPU-bbbb, 61\n")
    uuids: dict[str, str] = {}
    batch = parse_query_gpu(text, host="n1", health=PipelineHealth(), uuids=uuids)
    assert _series(batch, "gpu_temp") == {"n1/gpu0": [50.0, 51.0], "n1/gpu1": [60.0, 61.0]}
    assert uuids["n1/gpu0"] == ""  # two boards in one slot, as with an index column


def test_without_an_index_column_a_row_without_a_gpu_id_is_left_out_and_counted() -> None:
    text = f"timestamp, uuid, temperature.gpu\n{T0}, GPU-aaaa, 50\n{T0}, [N/A], 60\n"
    health = PipelineHealth()
    batch = parse_query_gpu(text, host="n1", health=health)
    assert _series(batch, "gpu_temp") == {"n1/gpu0": [50.0]}
    assert health.problems[(STAGE, "no index column: row without a usable GPU id")] == 1


def test_without_index_or_id_columns_several_rows_at_one_time_are_refused_not_merged() -> None:
    text = (f"timestamp, temperature.gpu\n{T0}, 50\n{T0}, 80\n{T1}, 51\n{T1}, 81\n")
    health = PipelineHealth()
    batch = parse_query_gpu(text, host="n1", health=health)
    assert _series(batch, "gpu_temp") == {"n1/gpu0": [50.0, 51.0]}
    assert health.problems == {(STAGE, "no index column: several GPUs at one time"): 2}
    # a single-GPU host's CSV without an index is fine as it is
    single = PipelineHealth()
    assert len(parse_query_gpu(f"timestamp, temperature.gpu\n{T0}, 50\n{T1}, 51\n", "n1", single)) == 2
    assert single.total_problems() == 0


def test_chunks_keep_the_numbering_of_gpus_without_an_index() -> None:
    text = ("timestamp, uuid, temperature.gpu\n"
            f"{T0}, GPU-aaaa, 50\n{T0}, GPU-bbbb, 80\n{T1}, GPU-bbbb, 81\n{T1}, GPU-aaaa, 51\n")
    health = PipelineHealth()
    joined = SampleBatch.concat(list(parse_query_gpu_chunks(text, "n1", health, chunk_rows=1)))
    assert _series(joined, "gpu_temp") == {"n1/gpu0": [50.0, 51.0], "n1/gpu1": [80.0, 81.0]}
    assert health.problems == {NUMBERED: 2}


# ---- a header line again, part-way --------------------------------------------------------------
REORDERED = ("timestamp, index, temperature.gpu, power.draw [W]\n"
             f"{T0}, 0, 52, 627.40 W\n"
             "timestamp, index, power.draw [W], temperature.gpu\n"
             f"{T1}, 0, 628.00 W, 53\n")


def test_query_gpu_rows_after_another_header_are_read_by_it() -> None:
    health = PipelineHealth()
    batch = parse_query_gpu(REORDERED, host="n1", health=health)
    assert batch.columns["gpu_temp"].tolist() == [52.0, 53.0]
    assert batch.columns["power"].tolist() == [627.4, 628.0]
    assert health.total_problems() == 0


def test_query_gpu_chunks_carry_a_header_read_part_way() -> None:
    health = PipelineHealth()
    joined = SampleBatch.concat(list(parse_query_gpu_chunks(REORDERED, "n1", health, chunk_rows=1)))
    assert joined.columns["gpu_temp"].tolist() == [52.0, 53.0]
    assert joined.columns["power"].tolist() == [627.4, 628.0]
    assert health.total_problems() == 0


def test_a_header_repeated_unchanged_costs_nothing() -> None:
    header = "timestamp, index, temperature.gpu, power.draw [W]\n"
    once = header + f"{T0}, 0, 52, 627.40 W\n{T1}, 0, 53, 628.00 W\n"
    twice = header + f"{T0}, 0, 52, 627.40 W\n" + header + f"{T1}, 0, 53, 628.00 W\n"
    health = PipelineHealth()
    batch = parse_query_gpu(twice, "n1", health)
    expected = parse_query_gpu(once, "n1")
    assert health.total_problems() == 0
    assert batch.ts.tolist() == expected.ts.tolist() and batch.entities == expected.entities
    for name, column in expected.columns.items():
        assert np.array_equal(batch.columns[name], column, equal_nan=True), name


# ---- dmon: a header that changes part-way -----------------------------------------------------------
def test_dmon_rows_under_a_wider_header_are_read_by_it() -> None:
    text = ("# gpu    pwr  gtemp\n# Idx      W      C\n    0    100     30\n    0    101     31\n"
            "# gpu    pwr  gtemp   mclk   pclk\n# Idx      W      C    MHz    MHz\n    0    300     60   3201   1980\n")
    health = PipelineHealth()
    batch = parse_dmon(text, "n1", health=health)
    assert batch.columns["power"].tolist() == [100.0, 101.0, 300.0]
    assert batch.columns["gpu_temp"].tolist() == [30.0, 31.0, 60.0]
    assert np.isnan(batch.columns["sm_clock"][:2]).all() and batch.columns["sm_clock"][2] == 1.98e9
    assert health.total_problems() == 0


def test_dmon_rows_under_a_reordered_header_of_the_same_width_are_read_by_it() -> None:
    text = ("# gpu   pclk    pwr  gtemp\n# Idx    MHz      W      C\n    0   1980    600     60\n"
            "# gpu    pwr  gtemp   pclk\n# Idx      W      C    MHz\n    0    100     30    345\n")
    batch = parse_dmon(text, "n1", health=PipelineHealth())
    assert batch.columns["power"].tolist() == [600.0, 100.0]
    assert batch.columns["gpu_temp"].tolist() == [60.0, 30.0]
    assert batch.columns["sm_clock"].tolist() == [1.98e9, 3.45e8]


# ---- dmon without times: cycles ------------------------------------------------------------------
@pytest.mark.parametrize("lost_row", ["    0    101", "    x    101     31", "    1.5  101     31"],
                         ids=["truncated", "unreadable index", "bad index"])
def test_a_dmon_row_left_out_does_not_move_the_later_rows_to_another_cycle(lost_row: str) -> None:
    text = ("# gpu    pwr  gtemp\n# Idx      W      C\n"
            "    0    100     30\n    1    200     40\n"
            f"{lost_row}\n    1    201     41\n"
            "    0    102     32\n    1    202     42\n")
    health = PipelineHealth()
    batch = parse_dmon(text, "n1", start=0.0, interval=1.0, health=health)
    powers = batch.columns["power"].tolist()
    placed = {(name, p): t for name, t, p in zip(batch.entity_names(), batch.ts.tolist(), powers)}
    assert placed == {("n1/gpu0", 100.0): 0.0, ("n1/gpu1", 200.0): 0.0, ("n1/gpu1", 201.0): 1.0,
                      ("n1/gpu0", 102.0): 2.0, ("n1/gpu1", 202.0): 2.0}
    assert health.total_problems() == 1


def test_a_dmon_header_repeated_unchanged_keeps_the_cycles() -> None:
    header = "# gpu    pwr\n# Idx      W\n"
    text = header + "    0    100\n    1    200\n" + header + "    0    101\n    1    201\n"
    health = PipelineHealth()
    batch = parse_dmon(text, "n1", start=10.0, interval=2.0, health=health)
    assert batch.ts.tolist() == [10.0, 10.0, 12.0, 12.0]
    assert batch.entity_names() == ["n1/gpu0", "n1/gpu1", "n1/gpu0", "n1/gpu1"]
    assert health.total_problems() == 0


# ---- collected_at -------------------------------------------------------------------------------
def test_a_collected_at_without_a_zone_is_utc_as_the_csv_rows_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert capture_collected_at("collected_at:   2026-07-03T22:10:45\n") == \
            capture_collected_at("collected_at:   2026-07-03T22:10:45Z\n")
    finally:
        monkeypatch.undo()
        time.tzset()


def test_dmon_cycles_follow_the_order_dmon_printed_the_gpus_in() -> None:
    """``-i 3,1`` may print GPU 3 before GPU 1 in every cycle: an index below the previous row's
    is then no new cycle, and a row lost still does not move the rows after it."""
    text = ("# gpu    pwr\n# Idx      W\n"
            "    3    100\n    1    200\n"
            "    3    101\n    1    201\n"
            "    x    102\n    1    202\n"
            "    3    103\n    1    203\n")
    batch = parse_dmon(text, "n1", start=0.0, interval=1.0, health=PipelineHealth())
    placed = {(name, p): t for name, t, p in zip(batch.entity_names(), batch.ts.tolist(),
                                                  batch.columns["power"].tolist())}
    assert placed == {("n1/gpu3", 100.0): 0.0, ("n1/gpu1", 200.0): 0.0, ("n1/gpu3", 101.0): 1.0,
                      ("n1/gpu1", 201.0): 1.0, ("n1/gpu1", 202.0): 2.0, ("n1/gpu3", 103.0): 3.0,
                      ("n1/gpu1", 203.0): 3.0}
