"""Without a wall clock (replay, evaluate, simulate: ``InputGuard(max_ahead_s=None)``), the input
guard holds rows to the stream's own present (``InputGuard.stream_present``): one row stamped far
ahead among many is refused (``future_timestamp``) instead of becoming its entity's last
timestamp, after which every later row of it was refused as out of order for the rest of the run."""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors.bank import DetectorBank
from foreshock.frames import Frame
from foreshock.guard import MAX_AHEAD_S, InputGuard
from foreshock.health import PipelineHealth
from foreshock.remap import Remap
from foreshock.streams.embedded import EmbeddedPipeline
from foreshock.streams.kafka_worker import apply_delta, state_delta
from foreshock.topology import Topology

T0 = 1_700_000_000.0
YEAR_2100 = 4_102_444_800.0


def gpu_frame(topology: Topology, ts: np.ndarray | float, slots: np.ndarray | None = None) -> Frame:
    slots = np.arange(topology.size("gpu")) if slots is None else slots
    ts = np.broadcast_to(np.asarray(ts, dtype=np.float64), slots.shape).copy()
    return Frame("gpu", ts, slots, {"gpu_temp": np.full(len(slots), 50.0)})


def rows_of(frame: Frame, slot: int) -> int:
    return int((frame.slot == slot).sum())


@pytest.mark.parametrize("stray", [YEAR_2100, T0 + 1e9, T0 + 2 * MAX_AHEAD_S])
def test_a_stray_row_far_ahead_is_refused_and_its_gpu_reads_on(small_topology, stray, caplog):
    """On HEAD: the stray was kept, and GPU 3's 39 later rows were refused as out of order."""
    pipeline = EmbeddedPipeline(small_topology, DetectorBank.from_names(small_topology, ["thermal"], processors=()))
    kept = 0
    for k in range(60):
        frame = gpu_frame(small_topology, T0 + 10.0 * k)
        if k == 20:
            frame.ts[3] = stray
        clean, _ = pipeline.process_rows(frame)
        kept += rows_of(clean, 3)
    problems = pipeline.health.problems
    assert kept == 59
    assert problems[("guard", "future_timestamp")] == 1
    assert problems[("guard", "out_of_order")] == 0
    assert pipeline.guard.s_last_ts["gpu"][3] == T0 + 590.0
    assert "ahead of the stream's present" in caplog.text


def test_a_stray_row_in_a_frame_of_two_is_refused(small_topology):
    """The lower median of two rows is the older row's stamp: the stray does not set it."""
    health = PipelineHealth()
    guard = InputGuard(small_topology, health)
    clean = guard.check(gpu_frame(small_topology, np.array([T0, YEAR_2100]), np.array([0, 1])))
    assert clean.slot.tolist() == [0]
    assert health.problems[("guard", "future_timestamp")] == 1
    assert len(guard.check(gpu_frame(small_topology, T0 + 10.0, np.array([0, 1])))) == 2


def test_a_whole_frame_hours_ahead_is_taken(small_topology):
    """A recording's gap: every row of the frame jumps ahead, and so does the stream's present."""
    health = PipelineHealth()
    guard = InputGuard(small_topology, health)
    n = small_topology.size("gpu")
    for t in (T0, T0 + 10.0, T0 + 6 * 3600.0, T0 + 6 * 3600.0 + 10.0):
        assert len(guard.check(gpu_frame(small_topology, t))) == n
    assert not health.problems
    assert guard.s_stream_clock["gpu"] == T0 + 6 * 3600.0 + 10.0


def test_a_one_row_frame_of_another_kind_does_not_widen_the_gpus_limit(small_topology):
    """Each kind keeps its own present: a job frame of one row stamped in 2100 (its median is the
    stray itself: not caught) leaves the GPUs held to theirs."""
    health = PipelineHealth()
    guard = InputGuard(small_topology, health)
    guard.check(gpu_frame(small_topology, T0))
    assert len(guard.check(Frame("job", np.array([YEAR_2100]), np.array([0]), {}))) == 1
    frame = gpu_frame(small_topology, T0 + 10.0)
    frame.ts[5] = YEAR_2100
    assert 5 not in guard.check(frame).slot
    assert health.problems[("guard", "future_timestamp")] == 1


def lagging_frame(topology: Topology, t: float) -> Frame:
    """GPUs 0-9 at ``t + 10`` and 20 GPUs read for the first time 1000 s late: the frame's median
    lags, and only the kept present of GPU frames (``t``) lets GPUs 0-9 through."""
    slots = np.arange(30)
    ts = np.where(slots < 10, t + 10.0, t - 1000.0)
    return Frame("gpu", ts, slots, {"gpu_temp": np.full(30, 50.0)})


def seen_until(topology: Topology, t: float) -> InputGuard:
    guard = InputGuard(topology, PipelineHealth())
    for s in (t - 10.0, t):
        guard.check(gpu_frame(topology, s, np.arange(10)))
    return guard


def test_the_stream_present_survives_a_checkpoint(small_topology):
    """On HEAD: no stream present was kept (``s_stream_clock`` did not exist)."""
    state = seen_until(small_topology, T0).state_dict()
    # as a Kafka worker writes it: a delta from a fresh guard's state, which has no present
    fresh = InputGuard(small_topology, PipelineHealth()).state_dict()
    state = apply_delta(fresh, state_delta(fresh, state))
    health = PipelineHealth()
    restored = InputGuard(small_topology, health)
    restored.load_state_dict(state)
    assert restored.s_stream_clock["gpu"] == T0
    assert len(restored.check(lagging_frame(small_topology, T0))) == 30
    assert not health.problems
    # onto other hardware too (a worker restarted on a changed topology, ``foreshock watch``'s move)
    data = small_topology.to_dict()
    data["nodes"][-1]["gpus"] += 1
    grown = Topology.from_dict(data)
    moved = InputGuard(grown, PipelineHealth())
    moved.load_state_dict(state, Remap(small_topology, grown))
    assert moved.s_stream_clock["gpu"] == T0


def test_a_state_saved_without_the_stream_present_loads(small_topology):
    """A checkpoint from before the present was kept (or from a live guard): the entities' last
    stamps are read, and the present starts afresh from the next frame."""
    guard = seen_until(small_topology, T0)
    old = {k: v for k, v in guard.state_dict().items() if k != "stream:clock"}
    health = PipelineHealth()
    restored = InputGuard(small_topology, health)
    restored.load_state_dict(old)
    assert (restored.s_last_ts["gpu"][:10] == T0).all()
    assert all(t == -np.inf for t in restored.s_stream_clock.values())
    frame = gpu_frame(small_topology, T0 + 10.0)
    frame.ts[3] = YEAR_2100
    assert 3 not in restored.check(frame).slot
    assert health.problems[("guard", "future_timestamp")] == 1


def test_a_wall_clock_limit_alone_holds_live_rows(small_topology):
    """Where ``max_ahead_s`` is given (live), rows are held to the wall clock only, as before, and
    the state keeps no stream present (a worker rolled back still reads its checkpoint)."""
    health = PipelineHealth()
    guard = InputGuard(small_topology, health, max_ahead_s=MAX_AHEAD_S, clock=lambda: T0 + 3600.0)
    frame = gpu_frame(small_topology, T0)
    frame.ts[3] = T0 + 2 * MAX_AHEAD_S  # far ahead of its frame, but not of the wall clock
    frame.ts[4] = T0 + 3600.0 + 2 * MAX_AHEAD_S  # ahead of the wall clock
    clean = guard.check(frame)
    assert 3 in clean.slot and 4 not in clean.slot
    assert health.problems[("guard", "future_timestamp")] == 1
    assert "stream:clock" not in guard.state_dict()


def test_an_infinite_wall_clock_limit_holds_rows_to_the_stream(small_topology):
    """``--max-clock-ahead inf`` (a simulation published faster than real time): no wall clock."""
    health = PipelineHealth()
    guard = InputGuard(small_topology, health, max_ahead_s=float("inf"))
    frame = gpu_frame(small_topology, T0)
    frame.ts[3] = YEAR_2100
    assert 3 not in guard.check(frame).slot
    assert health.problems[("guard", "future_timestamp")] == 1
