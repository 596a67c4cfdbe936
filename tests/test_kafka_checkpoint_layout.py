"""A worker's checkpoints written before a detector's layout removed columns (2026-12-06) are read on.

A worker keeps each partition as a delta from a fresh bank's state (``streams/kafka_worker.py``). The
thermal fit, the thermal, power, cooling, straggler and xid detectors dropped columns from their arrays
(``fit_layout`` / ``state_layout`` say the new layout; cooling's ``s_idle_count``, xid's missing
``s_dbe_resets``): a checkpoint of the version before is a delta from that version's fresh state,
wider, which the new fresh state could not rebuild ("a checkpoint array of shape (4, 8) cannot be
rebuilt at (4, 6)": ``checkpoint_unusable``, every partition started fresh). Each detector gives its
state as the previous layout kept it (``Detector.previous_layout_state``), and the stage reads such a
delta against the fresh state in that layout (``DetectionStage._previous``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from foreshock.detectors.bank import DetectorBank
from foreshock.findings import finding_to_dict
from foreshock.frames import Frame
from foreshock.streams.kafka_worker import (DetectionStage, apply_delta, decode_checkpoint, encode_checkpoint,
                                            state_delta, uniform_fills, whole_where_jobs_differ)
from foreshock.streams.sources import ReplaySource
from foreshock.topology import Topology

from test_hardware_change import (BATCH_ROWS, Feeder, bank, findings_of_a_stage_that_never_stopped, on,
                                  with_new_rows_of_racks)
from test_hardware_change import recording  # noqa: F401  (the fixture: 64 GPUs, ten minutes, mixed)

CHANGED = ("thermal", "power", "cooling", "straggler", "xid")
# each changed detector's previous layout, as the code before 2026-12-06 kept a fresh state: the widths
# of the arrays that changed, and the keys it had that this one has not (and this one's it had not)
PREVIOUS = {"thermal": ({"s_model": 32, "s_alarm": 8, "s_forecast": 28}, set(), {"fit_layout", "state_layout"}),
            "power": ({"s_model": 32, "s_alarm": 4, "s_gpu": 17}, set(), {"fit_layout", "state_layout"}),
            "cooling": ({"s_model": 32, "s_idle": 9}, set(), {"fit_layout", "s_idle_count"}),
            "straggler": ({"s_gpu": 15}, set(), {"state_layout"}),
            "xid": ({"s_dbe_resets": 1}, {"s_dbe_resets"}, set())}


def assert_same_state(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    """Arrays equal (NaN equal NaN) with the same dtype, the rest equal."""
    assert set(got) == set(want), where
    for k, v in want.items():
        if isinstance(v, np.ndarray):
            g = np.asarray(got[k])
            assert g.dtype == v.dtype and g.shape == v.shape, f"{where}.{k}: {g.dtype}{g.shape} vs {v.dtype}{v.shape}"
            assert np.array_equal(g, v, equal_nan=v.dtype.kind in "fc"), f"{where}.{k}"
        elif isinstance(v, (list, tuple)):
            assert list(got[k]) == list(v), f"{where}.{k}"
        else:
            assert got[k] == v or (v != v and got[k] != got[k]), f"{where}.{k}"


def one(b: DetectorBank, name: str) -> Any:
    return next(d for d in b.detectors if d.name == name)


@pytest.mark.parametrize("name", CHANGED)
def test_the_previous_layout_of_a_fresh_state_reads_back_as_it(name: str, small_topology: Topology):
    """The fresh state as the previous layout kept it (its widths, its keys), read back by the detector's
    upgrade, is the fresh state exactly: the base a checkpoint of that version is a delta from."""
    det = one(DetectorBank.from_names(small_topology, [name], processors=()), name)
    fresh = det.state_dict()
    before = det.previous_layout_state(fresh)
    widths, only_before, only_now = PREVIOUS[name]
    assert set(before) - set(fresh) == only_before and set(fresh) - set(before) == only_now
    assert {k: np.shape(before[k])[1] for k in widths} == widths
    assert_same_state(det.state_dict(), fresh, name)  # (not changed in place)
    other = one(DetectorBank.from_names(small_topology, [name], processors=()), name)
    other.load_state_dict(before)
    assert_same_state(other.state_dict(), fresh, name)
    upgraded = det.upgrade_state(before)  # (before the detector casts them to its dtypes)
    for k, v in fresh.items():
        if isinstance(v, np.ndarray):
            assert np.array_equal(np.asarray(upgraded[k], dtype=v.dtype), v, equal_nan=v.dtype.kind in "fc"), k


@pytest.fixture(scope="module")
def halves(recording: Path) -> tuple[Topology, list[Frame], int]:
    source = ReplaySource(str(recording), batch_rows=BATCH_ROWS)
    frames = list(source)
    return source.topology, frames, len(frames) // 2


def findings(b: DetectorBank, frames: list[Frame]) -> list[str]:
    return [json.dumps(finding_to_dict(f), sort_keys=True, default=float) for frame in frames for f in b.update(frame)]


@pytest.mark.slow
@pytest.mark.parametrize("name", CHANGED)
def test_the_previous_layout_of_a_running_state_goes_on_as_it(name: str, halves: tuple[Topology, list[Frame], int]):
    """After real frames (64 GPUs, the mixed scenario, five minutes): the state in the previous layout,
    loaded, is the state, and the findings that follow are the same."""
    topo, frames, half = halves
    whole = DetectorBank.from_names(topo, [name], processors=())
    findings(whole, frames[:half])
    state = one(whole, name).state_dict()
    fresh = one(DetectorBank.from_names(topo, [name], processors=()), name).state_dict()
    assert any(not np.array_equal(v, fresh[k], equal_nan=v.dtype.kind in "fc")
               for k, v in state.items() if isinstance(v, np.ndarray) and v.dtype.kind in "fc"), "nothing learnt"
    restored = DetectorBank.from_names(topo, [name], processors=())
    one(restored, name).load_state_dict(one(whole, name).previous_layout_state(state))
    assert_same_state(one(restored, name).state_dict(), state, name)
    after = findings(whole, frames[half:])
    assert findings(restored, frames[half:]) == after


def as_the_old_code_wrote(stage: DetectionStage, partition: int) -> bytes:
    """``stage``'s checkpoint of ``partition`` as the code before 2026-12-06 wrote it: its state in the
    previous layouts, as a delta from the fresh state in them (with its uniform arrays' fills, and the
    arrays the job list sets written whole: ``DetectionStage.__init__``)."""
    saved = decode_checkpoint(stage.checkpoint(partition)[1], "detect", stage.signature)
    state = apply_delta(stage._initial, saved.state)
    pipeline = stage.parts[partition].pipeline
    old_state = {**state, "bank": pipeline.bank.previous_layout_state(state["bank"])}
    old_initial = stage._previous
    assert old_initial["bank"]["detectors"]["thermal"]["s_alarm"].shape[1] == 8
    jobless = stage._new_pipeline(Topology.from_dict(stage.topology.hardware_dict()))
    fills = whole_where_jobs_differ(uniform_fills(old_initial), old_initial,
                                    stage._previous_layout(jobless, stage._state(jobless)))
    return encode_checkpoint(saved.offset, state_delta(old_initial, old_state, fills), "detect", stage.signature,
                             stage.topology, layout=True)


@pytest.fixture(scope="module")
def old_checkpoints(halves: tuple[Topology, list[Frame], int]) -> tuple[dict[int, bytes], Counter[int]]:
    topo, frames, half = halves
    first = Feeder(DetectionStage(topo, bank, 2))
    first.feed(frames[:half], 1)
    return {p: as_the_old_code_wrote(first.stage, p) for p in range(2)}, Counter(first.offsets)


@pytest.mark.slow
def test_a_checkpoint_of_the_previous_layouts_goes_on_as_a_stage_that_never_stopped(
        halves: tuple[Topology, list[Frame], int], old_checkpoints: tuple[dict[int, bytes], Counter[int]]):
    """Read against the new fresh state (narrower), such a checkpoint was refused; read against the fresh
    state in the previous layouts, it loads and the findings go on as those of a stage that never stopped."""
    topo, frames, half = halves
    blobs, offsets = old_checkpoints
    restarted = DetectionStage(topo, bank, 2)
    for p in range(2):
        assert restarted.load(p, blobs[p]) == offsets[p] - 1
    assert not restarted.health.problems
    got = Feeder(restarted, Counter(offsets)).feed(frames[half:], half + 1)
    assert Counter(got) == Counter(findings_of_a_stage_that_never_stopped(topo, frames))

    # ... and without the previous layouts it is refused (what the worker did before)
    blind = DetectionStage(topo, bank, 2)
    blind._previous = blind._initial
    assert blind.load(0, blobs[0]) == -1
    assert blind.health.problems[("worker", "checkpoint_unusable")] == 1


@pytest.mark.slow
def test_a_checkpoint_of_the_previous_layouts_moves_to_changed_hardware(
        halves: tuple[Topology, list[Frame], int], old_checkpoints: tuple[dict[int, bytes], Counter[int]]):
    """On a topology with a new row of racks listed first (every slot moved), the delta is read against
    a fresh pipeline of the old hardware in the previous layouts (``_load_moved``), then moved."""
    topo, frames, half = halves
    blobs, offsets = old_checkpoints
    new = with_new_rows_of_racks(topo)
    restarted = DetectionStage(new, bank, 2)
    for p in range(2):
        assert restarted.load(p, blobs[p]) == offsets[p] - 1
    assert not restarted.health.problems
    got = Feeder(restarted, Counter(offsets)).feed([on(new, f, topo) for f in frames[half:]], half + 1)
    assert Counter(got) == Counter(findings_of_a_stage_that_never_stopped(topo, frames))


def test_an_array_of_neither_layout_is_still_refused(small_topology: Topology):
    """A thermal state without its layout markers (the previous layout) whose alarms are as wide as
    neither layout's (10 columns: 6 now, 8 before): not rebuilt, ``checkpoint_unusable``, fresh."""
    stage = DetectionStage(small_topology, bank, 2)
    old, base = dict(stage._previous), dict(stage._previous)
    for tree in (old, base):
        thermal = tree["bank"]["detectors"]["thermal"]
        alarms = np.zeros((len(thermal["s_alarm"]), 10))
        alarms[:, 2::4] = np.nan
        tree["bank"] = {**tree["bank"], "detectors": {**tree["bank"]["detectors"],
                                                      "thermal": {**thermal, "s_alarm": alarms}}}
    old["bank"]["detectors"]["thermal"]["s_alarm"][0, 0] = 1.0
    delta = state_delta(base, old, uniform_fills(base))
    assert "__delta__" in delta["__dict__"]["bank"]["__dict__"]["detectors"]["__dict__"]["thermal"]["__dict__"][
        "s_alarm"]
    blob = encode_checkpoint(5, delta, "detect", stage.signature, small_topology, layout=True)
    with pytest.raises(ValueError, match=r"cannot be rebuilt at \(\d+, 8\)"):
        apply_delta(stage._initial, decode_checkpoint(blob, "detect", stage.signature).state, stage._previous)
    assert stage.load(0, blob) == -1
    assert stage.health.problems[("worker", "checkpoint_unusable")] == 1


def test_a_previous_layout_array_as_wide_as_this_layouts_is_read_against_the_previous_one(small_topology: Topology):
    """Power's ``s_gpu`` saved in layout 1 before S_CONF_PRE was 15 columns wide, as this layout's is,
    with other columns (3-5: loaded samples, braking, thermally held, where S_FLAGS, S_ENV_PRE and S_TB
    are now): the state's missing layout markers, not its width, say which fresh state the delta is from
    — the previous layout's first columns. Read against this layout's, S_ENV_PRE's fresh NaN was read
    as a braking flag's 0."""
    stage = DetectionStage(small_topology, bank, 2)
    initial, previous = stage._initial, stage._previous

    def narrow(tree: dict[str, Any], gpu: np.ndarray | None = None) -> dict[str, Any]:
        power = dict(tree["bank"]["detectors"]["power"])
        power["s_gpu"] = np.ascontiguousarray(power["s_gpu"][:, :15]) if gpu is None else gpu
        return {**tree, "bank": {**tree["bank"], "detectors": {**tree["bank"]["detectors"], "power": power}}}

    old_initial = narrow(previous)
    gpu = old_initial["bank"]["detectors"]["power"]["s_gpu"].copy()
    gpu[3, :] = np.arange(15.0)  # one GPU's row learnt
    saved = narrow(previous, gpu)
    assert saved["bank"]["detectors"]["power"]["s_gpu"].shape == initial["bank"]["detectors"]["power"]["s_gpu"].shape
    back = apply_delta(initial, state_delta(old_initial, saved, uniform_fills(old_initial)), previous)
    np.testing.assert_array_equal(back["bank"]["detectors"]["power"]["s_gpu"], gpu)
    assert "state_layout" not in back["bank"]["detectors"]["power"]
