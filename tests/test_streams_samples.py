"""Value tokens real tools print, and the name-to-slot edge of sample batches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foreshock.health import PipelineHealth
from foreshock.streams.samples import (
    MAX_GPU_INDEX,
    GpuIndexError,
    SampleBatch,
    gpu_topology,
    host_link_topology,
    parse_token,
    parse_tokens,
    split_gpu_entity,
)
from foreshock.topology import Topology


@pytest.mark.parametrize(("token", "value"), [
    ("630.00 W", 630.0), ("1980 MHz", 1980.0), ("0 us", 0.0), ("100 %", 100.0), ("  41  ", 41.0),
    ("0x0000000000000001", 1.0), ("0x00000000000001FF", 511.0), ("-1.30 dBm", -1.3), ("3.2e-05", 3.2e-5),
])
def test_numbers_with_units_and_hex(token: str, value: float) -> None:
    assert parse_token(token) == (value, True)


@pytest.mark.parametrize("token", ["[N/A]", "N/A", "[Not Supported]", "-", "",
                                   "[Requested functionality has been deprecated]"])
def test_no_value_tokens_are_nan_but_not_problems(token: str) -> None:
    value, ok = parse_token(token)
    assert math.isnan(value) and ok


@pytest.mark.parametrize("token", ["Active", "12abc W", "0xZZ", "Enabled"])
def test_non_numeric_tokens_are_flagged(token: str) -> None:
    value, ok = parse_token(token)
    assert math.isnan(value) and not ok


def test_parse_tokens_counts_bad_and_literal_nan() -> None:
    values, bad, nans = parse_tokens(["1 W", "oops", "NaN", "[N/A]"])
    assert values[0] == 1.0 and np.isnan(values[1:]).all()
    assert (bad, nans) == (1, 1)


def test_to_frame_counts_rows_of_unknown_entities() -> None:
    topology = Topology.from_gpu_hosts([("n1", 1)])
    batch = SampleBatch("gpu", ["n1/gpu0", "n9/gpu0", "n1/gpu1"], np.array([1.0, 1.0, 2.0, 2.0]),
                        np.array([0, 1, 2, 1]), {"power": np.array([10.0, 20.0, 30.0, 40.0])})
    health = PipelineHealth()
    frame = batch.to_frame(topology, health, "t")
    assert frame.slot.tolist() == [0, 1]
    assert frame.columns["power"].tolist() == [10.0, 30.0]
    assert health.problems[("t", "unknown gpu entity")] == 2


def test_concat_merges_entity_lists() -> None:
    a = SampleBatch("gpu", ["h/gpu0"], np.array([1.0]), np.array([0]), {"power": np.array([1.0])})
    b = SampleBatch("gpu", ["h/gpu1", "h/gpu0"], np.array([2.0, 2.0]), np.array([0, 1]), {"gpu_temp": np.array([5.0, 6.0])})
    c = SampleBatch.concat([a, b])
    assert c.entity_names() == ["h/gpu0", "h/gpu1", "h/gpu0"]
    assert np.isnan(c.columns["gpu_temp"][0]) and c.columns["gpu_temp"][2] == 6.0
    assert gpu_topology([c]).gpus == ["h/gpu0", "h/gpu1"]


def test_gpu_entity_names_round_trip() -> None:
    assert split_gpu_entity("node-7.example/gpu12") == ("node-7.example", 12)
    with pytest.raises(ValueError):
        split_gpu_entity("node7/nic0")


@pytest.mark.parametrize("name", ["n0/gpu01", "n0/gpu00", "n0/gpu\u00b2", "n0/gpu\u0663", "n0/gpu", "n0/gpu-1",
                                  "n0/gpu+1", "n0/gpu 1", "n0/gpu1\n"])
def test_a_gpu_name_is_the_one_gpu_entity_gives(name: str) -> None:
    """Only the names :func:`gpu_entity` gives (ASCII digits, no leading zeros): ``gpu01`` had been
    read as GPU 1, which a derived topology names ``gpu1``, and ``gpu²`` passed str.isdigit() for
    int() to refuse it with another error."""
    with pytest.raises(ValueError, match="not a GPU entity name"):
        split_gpu_entity(name)


def test_a_gpu_index_past_the_largest_is_its_own_error() -> None:
    """A derived topology lists every GPU up to the largest index: 4294967295 made billions."""
    assert split_gpu_entity("n0/gpu0") == ("n0", 0)
    assert split_gpu_entity(f"n0/gpu{MAX_GPU_INDEX}") == ("n0", MAX_GPU_INDEX)
    for index in (str(MAX_GPU_INDEX + 1), "4294967295", "9" * 5000):  # (int() refuses 4300+ digits)
        with pytest.raises(GpuIndexError):
            split_gpu_entity(f"n0/gpu{index}")


def test_host_link_topology_puts_local_optic_at_end_a() -> None:
    topo = host_link_topology("h", [("mlx5_0", "h/mlx5_0/1"), ("mlx5_1", "h/mlx5_1/1")])
    assert topo.links == ["h/mlx5_0/1", "h/mlx5_1/1"]
    assert topo.slot("optic", "h/mlx5_1/1#a") == 2
    assert (topo.link_leaf == -1).all()
