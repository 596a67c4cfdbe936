"""Input guard checkpoints written before fields were appended to fields.csv (9845867, before
max_op_temp and hbm_max_op_temp) are read on by this version."""

from __future__ import annotations

import numpy as np

from foreshock.fields import field_names
from foreshock.frames import Frame
from foreshock.guard import InputGuard
from foreshock.health import PipelineHealth
from foreshock.remap import Remap
from foreshock.topology import Topology

# the GPU fields as fields.csv listed them before max_op_temp and hbm_max_op_temp were appended
GPU_FIELDS_BEFORE_MAX_OP = ("gpu_temp", "hbm_temp", "slowdown_temp", "power", "power_limit", "energy", "sm_clock",
                            "sm_clock_max", "util", "throttle_reasons", "power_throttle_time",
                            "thermal_throttle_time", "xid_last", "ecc_dbe", "pcie_replays", "remapped_rows")


def state_saved_before_max_op(topology: Topology) -> dict:
    """A guard's state as 9845867 saved it: every GPU has reported every field it then knew."""
    guard = InputGuard(topology, PipelineHealth())
    state = guard.state_dict()
    assert field_names("gpu")[:len(GPU_FIELDS_BEFORE_MAX_OP)] == GPU_FIELDS_BEFORE_MAX_OP
    state["gpu:reported"] = np.ones((len(GPU_FIELDS_BEFORE_MAX_OP), topology.size("gpu")), dtype=np.bool_)
    state["gpu"] = np.full(topology.size("gpu"), 100.0)
    return state


def test_a_guard_state_saved_before_gpu_fields_were_appended_loads_with_them_unreported(small_topology):
    """Until the fix, ``'gpu:reported' has shape (16, n), expected (18, n)``: every Kafka partition's
    checkpoint was refused at the upgrade (``checkpoint_unusable``) and started fresh."""
    guard = InputGuard(small_topology, PipelineHealth())
    guard.load_state_dict(state_saved_before_max_op(small_topology))
    reported = guard.state_dict()["gpu:reported"]
    n_before = len(GPU_FIELDS_BEFORE_MAX_OP)
    assert reported.shape == (len(field_names("gpu")), small_topology.size("gpu"))
    assert reported[:n_before].all() and not reported[n_before:].any()
    assert (guard.state_dict()["gpu"] == 100.0).all()
    # a row older than the saved last timestamp is still refused: the state was kept
    health = PipelineHealth()
    guard.health = health
    frame = Frame("gpu", np.array([50.0]), np.array([0], dtype=np.int32), {"gpu_temp": np.array([40.0])})
    assert len(guard.check(frame)) == 0 and health.problems[("guard", "out_of_order")] == 1


def test_a_guard_state_saved_before_gpu_fields_were_appended_moves_onto_other_hardware(small_topology):
    data = small_topology.to_dict()
    data["nodes"][-1]["gpus"] += 1
    grown = Topology.from_dict(data)
    guard = InputGuard(grown, PipelineHealth())
    guard.load_state_dict(state_saved_before_max_op(small_topology), Remap(small_topology, grown))
    reported = guard.state_dict()["gpu:reported"]
    kept = np.isin(grown.names("gpu"), small_topology.names("gpu"))
    n_before = len(GPU_FIELDS_BEFORE_MAX_OP)
    assert reported[:n_before, kept].all() and not reported[:n_before, ~kept].any()
    assert not reported[n_before:].any()
