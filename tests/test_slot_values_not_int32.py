"""Slot values that are no int32 (3.5, 2**40, 2**64-1) in another writer's recording or Arrow batch.

They name no entity, as a null slot does: their rows get slot -1, the input guard counts them as
``unknown_entity``, and the other rows go on. Refusing the whole batch had stopped ``foreshock
replay`` there ("slot values that are not 32-bit integers", 0 samples), while a null, -1 or a slot
past the topology was counted and the run went on.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from foreshock.detectors.bank import DetectorBank
from foreshock.frames import Frame
from foreshock.recording import Recording, RecordingWriter
from foreshock.streams.embedded import EmbeddedPipeline
from foreshock.topology import Topology

UINT64_MAX = 2**64 - 1
BAD_SLOTS = {  # a bad value, the Arrow type of the slot column holding it
    "float": (3.5, pa.float64()),
    "fraction below zero": (-0.5, pa.float64()),
    "infinity": (float("inf"), pa.float64()),
    "int64": (2**40, pa.int64()),
    "int64 wrapping to 1": (2**32 + 1, pa.int64()),
    "uint64 max": (UINT64_MAX, pa.uint64()),
}


@pytest.mark.parametrize("case", sorted(BAD_SLOTS))
def test_a_batch_s_slots_that_are_no_int32_become_unknown_entities(case: str) -> None:
    bad, typ = BAD_SLOTS[case]
    slots = pa.array([0, bad, 7, None, bad], typ)
    table = pa.table({"ts": [1.0, 1.0, 1.0, 1.0, 2.0], "slot": slots, "gpu_temp": [50.0, 51.0, 52.0, 53.0, 54.0]})
    frame = Frame.from_arrow(table, kind="gpu")
    # never cast onto a real entity (2**32+1 to 1, 3.5 to 3, -0.5 to 0): an unknown one, as a null
    assert frame.slot.dtype == np.int32 and frame.slot.tolist() == [0, -1, 7, -1, -1]
    assert frame.columns["gpu_temp"].tolist() == [50.0, 51.0, 52.0, 53.0, 54.0]


def test_whole_number_slots_of_any_numeric_type_are_read_as_they_are() -> None:
    for typ in (pa.float64(), pa.int64(), pa.uint64(), pa.int16()):
        table = pa.table({"ts": [1.0, 2.0], "slot": pa.array([7, 31], typ), "gpu_temp": [50.0, 60.0]})
        assert Frame.from_arrow(table, kind="gpu").slot.tolist() == [7, 31]


@pytest.mark.parametrize("case", ["float", "int64", "uint64 max"])
def test_a_recording_with_such_slots_replays_to_its_end_counting_just_those_rows(
        tmp_path, small_topology: Topology, case: str) -> None:
    """The audit's cases gpu_slot_float / gpu_slot_int64 / gpu_slot_uint64: every row read, the bad
    ones counted once each as unknown_entity, samples = accepted + refused."""
    bad, typ = BAD_SLOTS[case]
    path = tmp_path / "rec"
    with RecordingWriter(path, small_topology, {"interval": 1.0, "source": "test"}, rows_per_group=64) as w:
        for t in range(10):  # slots 0..30: GPU 31 sends nothing
            w.write(Frame("gpu", np.full(31, 100.0 + t), np.arange(31), {"gpu_temp": np.full(31, 40.0 + t)}))
    file = path / "gpu.parquet"
    table = pq.read_table(file)
    slot = table.column("slot").to_pylist()
    rows = [5, 100, 250]  # rows of the second, fourth and ninth tick
    bad_value = bad if case != "float" else 31.5  # (31.5 is no GPU 31, which sent nothing)
    for i in rows:
        slot[i] = bad_value
    table = table.set_column(table.schema.get_field_index("slot"), "slot", pa.array(slot, typ))
    pq.write_table(table, file)

    rec = Recording.open(path)
    pipeline = EmbeddedPipeline(small_topology, DetectorBank.from_names(small_topology, processors=()))
    samples = accepted = 0
    for frame in rec.iter_frames(batch_rows=64):
        samples += len(frame)
        accepted += len(pipeline.process_rows(frame)[0])
    assert samples == 310
    refused = sum(pipeline.health.problems.values())
    assert pipeline.health.problems[("guard", "unknown_entity")] == len(rows) == refused
    assert accepted + refused == samples
    seen = rec.reported_slots("gpu")
    assert seen[:31].all() and not seen[31]  # 31.5 is not read as GPU 31 having reported
