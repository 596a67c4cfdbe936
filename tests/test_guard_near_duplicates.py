"""Near-duplicate rows (review, task h2): a row 1 ms after its entity's previous one (a source
emitting the same sample twice with a fresh stamp, an agent retrying a send and stamping it anew,
two overlapping captures replayed) passed the input guard, which refused only the same stamp
again or an older one, and the detectors counted its anomaly twice. No source samples an entity
faster than 100 ms: a row less than ``MIN_SPACING_S`` (10 ms) after its entity's previous kept
row is refused, counted as ``near_duplicate_timestamp`` and logged once with its spacing."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from foreshock.detectors.bank import DetectorBank
from foreshock.frames import Frame
from foreshock.guard import MIN_SPACING_S, REASONS, InputGuard
from foreshock.health import PipelineHealth
from foreshock.recording import Recording
from foreshock.streams.embedded import EmbeddedPipeline
from foreshock.topology import Topology

from thermal_synth import Fault, World, small_topology

TOPO = Topology.from_gpu_hosts([("n0", 0), ("n0", 1), ("n1", 0)])
T0 = 1_700_000_000.0
H200_STEP = Path(__file__).parent / "data" / "h200_step"


def gpu(ts: list[float], slots: list[int]) -> Frame:
    return Frame("gpu", np.array(ts), np.array(slots), {"gpu_temp": np.full(len(ts), 50.0)})


def test_a_sample_again_under_a_fresh_stamp_is_refused_counted_and_logged_once(caplog) -> None:
    """Per entity: GPU 0's rows 1 ms and 9.9 ms after its last kept one are refused, GPU 1's first
    row at that time is taken, and a row 500 ms on is taken again; the other reasons stay theirs."""
    health = PipelineHealth()
    guard = InputGuard(TOPO, health)
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        out = guard.check(gpu([T0, T0 + 0.001, T0 + 0.001, T0 + 0.0099, T0 + 0.5, T0 + 0.5, T0 + 0.2],
                              [0, 0, 1, 0, 0, 0, 0]))
        again = guard.check(gpu([T0 + 0.503, T0 + 1.5], [0, 0]))
    assert out.ts.tolist() == [T0, T0 + 0.001, T0 + 0.5] and out.slot.tolist() == [0, 1, 0]
    assert again.ts.tolist() == [T0 + 1.5]
    assert dict(health.problems) == {("guard", "near_duplicate_timestamp"): 3, ("guard", "duplicate_timestamp"): 1,
                                     ("guard", "out_of_order"): 1}
    logged = [r.getMessage() for r in caplog.records if "near_duplicate_timestamp" in r.getMessage()]
    assert len(logged) == 1
    assert "rows as little as 1 ms after their entity's previous one (minimum spacing 10 ms;" in logged[0]


def test_a_stream_sent_twice_a_millisecond_apart_finds_what_it_finds_sent_once() -> None:
    """The reviewer's doubled anomalies: every frame of a run with a degrading GPU sent again 1 ms
    later. On HEAD the robust z-score found 7 anomalies instead of 3; now the copies are refused
    and the findings are the single stream's, one for one."""
    topology = small_topology(nodes=2, gpus=8, racks=1)
    frames, _ = World(topology, faults=[Fault("tim_degradation", 3, 600, 1.2)], seed=1).run(3600.0)

    def findings(stream: list[Frame]) -> tuple[list, PipelineHealth]:
        pipeline = EmbeddedPipeline(topology, DetectorBank.from_names(topology, ["robust_zscore"], processors=()))
        return [f for frame in stream for f in pipeline.process(frame)], pipeline.health

    once, health = findings(frames)
    assert once and not health.problems
    copies = [Frame(f.kind, f.ts + 0.001, f.slot, {k: v.copy() for k, v in f.columns.items()}) for f in frames]
    twice, health = findings([f for pair in zip(frames, copies) for f in pair])
    assert twice == once
    assert dict(health.problems) == {("guard", "near_duplicate_timestamp"): sum(len(f) for f in frames)}


def test_a_checkpoint_keeps_the_stamp_spacing_is_measured_from() -> None:
    """The last kept stamps are the state, as before: a copy of the last row before a restart is
    refused after it. The spacing is a setting, not state: a checkpoint gains no key (code from
    before reads a key it does not know as an entity kind and refuses the whole checkpoint), and
    one saved before loads as it is."""
    health = PipelineHealth()
    guard, other = InputGuard(TOPO, health), InputGuard(TOPO, PipelineHealth(), min_spacing_s=0.5)
    for each in (guard, other):
        each.check(gpu([T0, T0], [0, 1]))
    state = guard.state_dict()
    assert set(state) == set(other.state_dict())  # (the spacing is nowhere in it)
    restored = InputGuard(TOPO, health)
    restored.load_state_dict(state)
    assert restored.check(gpu([T0 + 0.002, T0 + 0.1], [0, 1])).slot.tolist() == [1]
    assert health.problems[("guard", "near_duplicate_timestamp")] == 1


def test_the_spacing_is_a_parameter_and_zero_refuses_only_equal_stamps() -> None:
    health = PipelineHealth()
    loose = InputGuard(TOPO, health, min_spacing_s=0.0)
    assert len(loose.check(gpu([T0, T0 + 1e-6, T0 + 1e-6], [0, 0, 0]))) == 2
    assert dict(health.problems) == {("guard", "duplicate_timestamp"): 1}
    strict = InputGuard(TOPO, PipelineHealth(), min_spacing_s=1.0)
    assert strict.check(gpu([T0, T0 + 0.5, T0 + 1.0], [0, 0, 0])).ts.tolist() == [T0, T0 + 1.0]
    assert InputGuard(TOPO, PipelineHealth()).min_spacing_s == MIN_SPACING_S == 0.01
    for bad in (-0.001, np.nan, np.inf):
        with pytest.raises(ValueError, match="min_spacing_s"):
            InputGuard(TOPO, PipelineHealth(), min_spacing_s=bad)


def test_the_pipeline_keeps_its_guards_spacing_when_the_topology_changes() -> None:
    """``foreshock watch`` builds a new guard when its source takes in GPUs: with the same spacing."""
    small = Topology.from_gpu_hosts([("n0", 0), ("n0", 1)])
    pipeline = EmbeddedPipeline(small, DetectorBank.from_names(small, [], processors=()))
    pipeline.guard.min_spacing_s = 0.5
    pipeline.move_to(TOPO, DetectorBank.from_names(TOPO, [], processors=()))
    assert pipeline.guard.topology is TOPO and pipeline.guard.min_spacing_s == 0.5


def test_near_duplicate_timestamp_is_one_of_the_guards_reasons() -> None:
    """Every reason the kernel counts has its place in ``REASONS`` (zipped with its counts)."""
    assert REASONS[-1] == "near_duplicate_timestamp" and len(set(REASONS)) == 6


@pytest.mark.parametrize("run", ["run1_500ms", "run2_100ms"])
def test_the_real_captures_pass_the_guard_whole(run: str) -> None:
    """The fastest real source here, nvidia-smi on an H200 at 100 ms (closest two rows of the GPU
    98.9 ms apart): not a row refused. (A check of the default, which could be raised too far.)"""
    recording = Recording.open(H200_STEP / run)
    health = PipelineHealth()
    guard = InputGuard(recording.topology, health)
    guard.stream_anchor = recording.stream_anchor
    kept = sum(len(guard.check(frame)) for frame in recording.iter_frames())
    assert kept == sum(recording.meta["rows"].values()) and not health.problems


@pytest.mark.parametrize("interval, kept_every", [(0.01, 1), (0.005, 2), (0.004, 3), (0.1, 1)])
def test_rows_a_poll_interval_apart_are_judged_by_the_interval_not_by_the_stamps_rounding(interval, kept_every) -> None:
    """Stamps of 1.7e9 s are kept to 2.4e-7 s: a poll every 10 ms reads 9.99999 ms apart at times,
    and 48 % of such rows had been refused. At the spacing they are all taken; under it, the rows
    at least 10 ms after the last kept one (every other at 5 ms, every third at 4 ms)."""
    health = PipelineHealth()
    guard = InputGuard(TOPO, health)
    start = 1_764_700_000.123  # a stamp of today, whose rounding is the one live sources have
    stamps = np.array([start + k * interval for k in range(600)])  # as a poll grid's times come
    assert (np.diff(stamps) < interval).any()  # (the rounding the test is about is there)
    kept = np.concatenate([guard.check(Frame("gpu", stamps[k:k + 1], np.array([0]),
                                             {"gpu_temp": np.array([50.0])})).ts for k in range(len(stamps))])
    assert kept.tolist() == stamps[::kept_every].tolist()
    assert health.problems.get(("guard", "near_duplicate_timestamp"), 0) == len(stamps) - len(kept)
