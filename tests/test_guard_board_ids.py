"""A ``board_id`` that no UUID is carried as (review r110): every GPU source writes the low 52 bits
of the UUID's BLAKE2b digest (``foreshock.boards.board_id``), a whole number below 2**52, or NaN
where the UUID was not read. A negative, fractional, zero or infinite value is a corrupt cell; until
the guard refused them, each was read as another board in the GPU's slot: an RMA (the GPU's state
parked, its incidents told again), and again at the next row, when the real board came back. In a
replay with 0.5 % such cells, 368 incident updates instead of 22."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.bank import DetectorBank
from foreshock.frames import Frame
from foreshock.guard import InputGuard
from foreshock.health import PipelineHealth
from foreshock.streams.embedded import EmbeddedPipeline

from board_ids import uuid_number
from thermal_synth import small_topology

T0 = 1_700_000_000.0
GPUS = 4


def is_board_number(value: float) -> bool:
    """The naive reference: NaN (not read), or what ``board_id`` can give for a UUID bar zero."""
    return math.isnan(value) or (value.is_integer() and 1 <= value < 2**52)


def boards() -> np.ndarray:
    return np.array([float(uuid_number(f"GPU-{i}")) for i in range(GPUS)])


def frame(ts: float, board: np.ndarray) -> Frame:
    return Frame("gpu", np.full(GPUS, ts), np.arange(GPUS),
                 {"board_id": board.copy(), "gpu_temp": np.full(GPUS, 50.0)})


GARBAGE = [-1.0, -float(uuid_number("GPU-2")), 0.0, 0.5, float(uuid_number("GPU-2")) + 0.25, 2.0**52, 2.0**60,
           math.inf, -math.inf]


def test_an_impossible_board_id_is_no_rma_and_is_counted() -> None:
    """On HEAD each garbage cell was a board change (counted as a replaced GPU, and again when the
    real board was read back); now it is set to NaN (not read) and counted as out of range."""
    topology = small_topology(nodes=1, gpus=GPUS, racks=1)
    pipeline = EmbeddedPipeline(topology, DetectorBank.from_names(topology, ["thermal"], processors=()))
    real = boards()
    kept_temps = 0
    read_there = []
    for k, bad in enumerate([None, *GARBAGE, None]):
        ids = real.copy()
        if bad is not None:
            ids[2] = bad
        clean, _ = pipeline.process_rows(frame(T0 + 10.0 * k, ids))
        kept_temps += int(np.isfinite(clean.columns["gpu_temp"]).sum())
        read_there.append(float(clean.columns["board_id"][2]))
    health = pipeline.health
    assert sum(health.gpus_replaced.values()) == 0 and sum(health.gpus_moved.values()) == 0
    assert read_there[0] == read_there[-1] == real[2] and np.isnan(read_there[1:-1]).all()
    assert health.problems[("guard", "out_of_range: board_id")] == len(GARBAGE)
    np.testing.assert_array_equal(pipeline.guard.s_board, real)
    assert pipeline.guard.parked == {}
    assert kept_temps == GPUS * (len(GARBAGE) + 2)  # the rows themselves are kept, their other fields too


def test_a_real_swap_is_still_found() -> None:
    topology = small_topology(nodes=1, gpus=GPUS, racks=1)
    guard = InputGuard(topology, PipelineHealth())
    real = boards()
    guard.board_change(guard.check(frame(T0, real)))
    swapped = real.copy()
    swapped[1] = float(uuid_number("GPU-new"))
    change = guard.board_change(guard.check(frame(T0 + 10.0, swapped)))
    assert change is not None and change[1].tolist() == [1] and change[3].tolist() == [swapped[1]]
    assert not guard.health.problems


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                          st.integers(min_value=-2**53, max_value=2**53).map(float),
                          st.text(min_size=1, max_size=20).map(lambda u: float(uuid_number(u)))),
                min_size=1, max_size=GPUS))
def test_the_guard_keeps_board_numbers_and_refuses_the_rest(values: list[float]) -> None:
    from foreshock.guard import valid_board_ids  # (here: the module's other tests run on code without it)

    want = np.array([is_board_number(v) for v in values])
    np.testing.assert_array_equal(valid_board_ids(np.array(values)), want)
    topology = small_topology(nodes=1, gpus=GPUS, racks=1)
    guard = InputGuard(topology, PipelineHealth())
    n = len(values)
    clean = guard.check(Frame("gpu", np.full(n, T0), np.arange(n), {"board_id": np.array(values)}))
    ids = clean.columns["board_id"]
    assert len(clean) == n
    np.testing.assert_array_equal(ids[want], np.array(values)[want])  # (NaN == NaN for assert_array_equal)
    assert np.isnan(ids[~want]).all()
    assert guard.health.problems.get(("guard", "out_of_range: board_id"), 0) == int((~want).sum())
