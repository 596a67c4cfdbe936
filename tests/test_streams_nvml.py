"""NVML source: on a real GPU when there is one (skipped otherwise), and its unit conversions and
error handling against a stand-in for pynvml (NVML itself cannot run without a driver)."""

from __future__ import annotations

import logging
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from foreshock.health import PipelineHealth
from foreshock.recording import Recording
from foreshock.streams.nvml import READERS, NvmlSource, load_nvml, record_nvml

from board_ids import uuid_number


@pytest.fixture(scope="module")
def real_nvml() -> Any:
    pynvml = pytest.importorskip("pynvml")
    try:
        nv = load_nvml()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA driver/GPU here: {exc}")
    if nv.nvmlDeviceGetCount() == 0:
        pytest.skip("NVML sees no GPU")
    yield nv
    nv.nvmlShutdown()


def test_real_gpu_reading(real_nvml: Any, tmp_path: Path) -> None:
    source = NvmlSource(interval=0.1, nvml=real_nvml, max_polls=1)
    batch = source.read()
    temp = batch.column("gpu_temp")
    assert np.all((temp > 0) & (temp < 120))
    assert np.all(batch.column("power") > 0)
    assert np.all(batch.column("sm_clock_max") >= 1e8)
    summary = record_nvml(tmp_path / "rec", duration=0.3, interval=0.1, nvml=real_nvml)
    assert summary["rows"] == 3 * summary["gpus"]


# ---- a stand-in for pynvml --------------------------------------------------------------------
class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(gpus: int = 2, unsupported: frozenset[str] = frozenset(), failing: frozenset[str] = frozenset()):
    """A module with pynvml's names; ``unsupported``/``failing`` name functions that raise."""
    nv: Any = types.ModuleType("fake_pynvml")
    nv.calls = {}
    nv.NVMLError = FakeNvmlError
    consts = dict(NVML_SUCCESS=0, NVML_ERROR_NOT_SUPPORTED=3, NVML_ERROR_FUNCTION_NOT_FOUND=13,
                  NVML_ERROR_GPU_IS_LOST=15, NVML_TEMPERATURE_GPU=0, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1,
                  NVML_TEMPERATURE_THRESHOLD_MEM_MAX=2, NVML_TEMPERATURE_THRESHOLD_GPU_MAX=3,
                  NVML_CLOCK_SM=1, NVML_PERF_POLICY_POWER=0, NVML_PERF_POLICY_THERMAL=1,
                  NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0, NVML_FI_DEV_MEMORY_TEMP=82,
                  NVML_VALUE_TYPE_DOUBLE=0, NVML_VALUE_TYPE_UNSIGNED_INT=1, NVML_VALUE_TYPE_UNSIGNED_LONG=2,
                  NVML_VALUE_TYPE_UNSIGNED_LONG_LONG=3, NVML_VALUE_TYPE_SIGNED_LONG_LONG=4)
    for k, v in consts.items():
        setattr(nv, k, v)

    def fn(name: str, result: Any):
        def call(handle: int, *args: Any) -> Any:
            nv.calls[name] = nv.calls.get(name, 0) + 1
            if name in unsupported:
                raise FakeNvmlError(3)
            if name in failing:
                raise FakeNvmlError(15)
            return result(handle, *args) if callable(result) else result
        return call

    field = types.SimpleNamespace(nvmlReturn=0, valueType=1, value=types.SimpleNamespace(uiVal=41))
    nv.nvmlDeviceGetCount = lambda: gpus
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetTemperature = fn("temperature", lambda h, s: 53 + h)
    nv.nvmlDeviceGetFieldValues = fn("field_values", lambda h, ids: [field])
    # pynvml's threshold types: SLOWDOWN 1, MEM_MAX 2, GPU_MAX 3 (an H100's 89, 95 and 87 °C)
    nv.nvmlDeviceGetTemperatureThreshold = fn("threshold", lambda h, kind: {1: 89, 2: 95, 3: 87}[kind])
    nv.nvmlDeviceGetPowerUsage = fn("power", 630000)  # mW
    nv.nvmlDeviceGetEnforcedPowerLimit = fn("limit", 700000)
    nv.nvmlDeviceGetTotalEnergyConsumption = fn("energy", 123456789)  # mJ
    nv.nvmlDeviceGetClockInfo = fn("clock", 1980)
    nv.nvmlDeviceGetMaxClockInfo = fn("max_clock", 1980)
    nv.nvmlDeviceGetUtilizationRates = fn("util", types.SimpleNamespace(gpu=100, memory=8))
    nv.nvmlDeviceGetCurrentClocksEventReasons = fn("reasons", 0x4)
    nv.nvmlDeviceGetViolationStatus = fn("violation", lambda h, p: types.SimpleNamespace(
        referenceTime=0, violationTime=2_500_000_000 if p == 0 else 0))
    nv.nvmlDeviceGetTotalEccErrors = fn("ecc", 0)
    nv.nvmlDeviceGetPcieReplayCounter = fn("pcie", 7)
    nv.nvmlDeviceGetRemappedRows = fn("remap", (3, 1, 0, 0))
    nv.nvmlDeviceGetUUID = fn("uuid", lambda h: f"GPU-{h:08x}-0000-0000-0000-000000000000")
    return nv


def test_readers_convert_to_base_units() -> None:
    source = NvmlSource(nvml=fake_nvml(), host="h")
    batch = source.read()
    assert batch.entity_names() == ["h/gpu0", "h/gpu1"]
    row = {k: v[1] for k, v in batch.columns.items()}
    assert row == {
        "gpu_temp": 54.0, "hbm_temp": 41.0, "slowdown_temp": 89.0, "max_op_temp": 87.0, "hbm_max_op_temp": 95.0,
        "power": 630.0, "power_limit": 700.0,
        "energy": pytest.approx(123456.789, rel=1e-12), "sm_clock": 1.98e9, "sm_clock_max": 1.98e9, "util": 1.0,
        "throttle_reasons": 4.0, "power_throttle_time": 2.5, "thermal_throttle_time": 0.0, "ecc_dbe": 0.0,
        "pcie_replays": 7.0, "remapped_rows": 1.0,
        "board_id": float(uuid_number("GPU-00000001-0000-0000-0000-000000000000")),  # the UUID, carried as a number
    }
    assert set(READERS) | {"board_id"} == set(row)


def test_unsupported_calls_are_not_repeated_and_errors_are_counted() -> None:
    nv = fake_nvml(gpus=1, unsupported=frozenset({"pcie"}), failing=frozenset({"ecc"}))
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health, interval=0.02, max_polls=3)
    frames = list(source)
    assert len(frames) == 3
    assert nv.calls["pcie"] == 1  # remembered as not supported after the first try
    assert nv.calls["ecc"] == 3  # a failing call is retried next poll
    assert np.isnan(frames[-1].columns["pcie_replays"]).all() and np.isnan(frames[-1].columns["ecc_dbe"]).all()
    assert health.problems == {("nvml", "NVML call failed"): 3}


def test_a_gpu_without_a_handle_leaves_the_others_read_and_is_asked_for_again() -> None:
    """After an XID 79 NVML still counts the GPU, but ``nvmlDeviceGetHandleByIndex`` fails for it
    (nvidia-smi's "Unable to determine the device handle for GPU ..."). Until 2026-12-01 that
    stopped the source from starting, so the node's healthy GPUs went unread too. Now the others
    are read, the lost one is counted at every poll and read again once it has a handle."""
    nv = fake_nvml(gpus=4)
    lost = [2]  # polls for which GPU 2 has no handle (the first at start-up)

    def handle(i: int) -> int:
        if i == 2 and lost[0] > 0:
            lost[0] -= 1
            raise FakeNvmlError(15)  # NVML_ERROR_GPU_IS_LOST
        return i

    nv.nvmlDeviceGetHandleByIndex = handle
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health)
    first = source.read()
    assert first.entity_names() == ["h/gpu0", "h/gpu1", "h/gpu3"]
    assert first.column("gpu_temp").tolist() == [53.0, 54.0, 56.0]
    assert health.problems == {("nvml", "GPU handle unavailable"): 2}
    back = source.read()
    assert back.entity_names() == ["h/gpu0", "h/gpu1", "h/gpu2", "h/gpu3"] and back.column("gpu_temp")[2] == 55.0
    assert source.topology is not None and source.topology.gpus == ["h/gpu0", "h/gpu1", "h/gpu2", "h/gpu3"]


def test_record_nvml_writes_a_recording(tmp_path: Path) -> None:
    summary = record_nvml(tmp_path / "rec", duration=0.1, interval=0.02,
                          nvml=fake_nvml(unsupported=frozenset({"field_values"})))
    assert summary["rows"] == 10 and summary["gpus"] == 2 and summary["unsupported_fields"] == ["hbm_temp"]
    rec = Recording.open(tmp_path / "rec")
    assert rec.meta["source"] == "nvml"
    frame = rec.read_kind("gpu")
    assert len(frame) == 10
    assert np.all(frame.columns["power"] == 630.0)
    assert rec.topology.gpus[0].endswith("/gpu0")


def test_max_operating_temperatures_not_supported_are_no_value_not_an_error() -> None:
    """NVML's GPU_MAX and MEM_MAX thresholds: a GPU that has no memory max operating temperature
    raises NOT_SUPPORTED for it — no value, not a problem, not asked again; the others are read."""
    nv = fake_nvml(gpus=1)
    asked: list[int] = []

    def threshold(handle: int, kind: int) -> int:
        asked.append(kind)
        if kind == nv.NVML_TEMPERATURE_THRESHOLD_MEM_MAX:
            raise FakeNvmlError(nv.NVML_ERROR_NOT_SUPPORTED)
        return {1: 89, 3: 83}[kind]

    nv.nvmlDeviceGetTemperatureThreshold = threshold
    health = PipelineHealth()
    frames = list(NvmlSource(nvml=nv, host="h", health=health, interval=0.02, max_polls=2))
    assert frames[-1].columns["max_op_temp"].tolist() == [83.0]
    assert frames[-1].columns["slowdown_temp"].tolist() == [89.0]
    assert np.isnan(frames[-1].columns["hbm_max_op_temp"]).all()
    assert asked.count(nv.NVML_TEMPERATURE_THRESHOLD_MEM_MAX) == 1  # remembered as not supported
    assert health.total_problems() == 0


# ---- the GPUs' UUIDs: a board swapped in its slot ----------------------------------------------
def _uuids_in_turn(nv: Any, per_poll: list[dict[int, Any]]) -> list[int]:
    """``nvmlDeviceGetUUID`` serving ``per_poll[k][gpu]`` at the k-th poll (an exception there: raised);
    the poll it is at is moved on by the GPU temperature read first. Returns the calls counter."""
    poll = [-1]
    calls = [0]
    temperature = nv.nvmlDeviceGetTemperature

    def temp(handle: int, sensor: int) -> Any:
        if handle == 0:
            poll[0] += 1
        return temperature(handle, sensor)

    def uuid(handle: int) -> Any:
        calls[0] += 1
        served = per_poll[poll[0]][handle]
        if isinstance(served, Exception):
            raise served
        return served

    nv.nvmlDeviceGetTemperature = temp
    nv.nvmlDeviceGetUUID = uuid
    return calls


def test_a_gpu_whose_uuid_changes_is_reported_once_and_a_failed_read_is_no_change(caplog) -> None:
    """Older pynvml gives the UUID as bytes, newer as str: the same UUID either way, carried as the
    same board_id. A UUID changing from one known to another is a replacement, logged and counted
    once, at the poll that read it; the first UUID, a failed read (counted, not raised; no
    board_id that poll) and the same UUID again are not."""
    nv = fake_nvml(gpus=2)
    calls = _uuids_in_turn(nv, [
        {0: "GPU-a", 1: b"GPU-p"},
        {0: FakeNvmlError(15), 1: "GPU-p"},  # GPU 0's read fails (GPU_IS_LOST): no UUID this poll
        {0: "GPU-a", 1: b"GPU-q"},  # GPU 1 replaced; GPU 0's UUID as before the gap
        {0: b"GPU-b", 1: b"GPU-q"},  # GPU 0 replaced
        {0: "GPU-b", 1: "GPU-q"},
    ])
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health, interval=0.02, max_polls=5)
    boards, replaced = [], []
    with caplog.at_level(logging.WARNING, logger="foreshock.sources"):
        for _ in range(5):
            frame = source.poll()[0]
            assert len(frame) == 2  # the readings are not held up by a UUID
            boards.append(frame.columns["board_id"].tolist())
            replaced.append(health.gpus_replaced["nvml"])
    a, b, p, q = (float(uuid_number(u)) for u in ("GPU-a", "GPU-b", "GPU-p", "GPU-q"))
    np.testing.assert_array_equal(boards, [[a, p], [np.nan, p], [a, q], [b, q], [b, q]])
    assert replaced == [0, 0, 1, 2, 2]
    assert [r.getMessage().split(";")[0] for r in caplog.records if r.name == "foreshock.sources"] == [
        "GPU h/gpu1 replaced: UUID GPU-p -> GPU-q", "GPU h/gpu0 replaced: UUID GPU-a -> GPU-b"]
    assert calls[0] == 10  # once per GPU and poll
    assert health.problems == {("nvml", "NVML call failed"): 1}


def test_a_uuid_nvml_does_not_give_is_not_asked_for_again_and_none_is_read_when_turned_off() -> None:
    nv = fake_nvml(gpus=1)
    calls = _uuids_in_turn(nv, [{0: FakeNvmlError(nv.NVML_ERROR_NOT_SUPPORTED)}] * 3)
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health, interval=0.02, max_polls=3)
    frames = list(source)
    assert len(frames) == 3 and all(np.isnan(f.columns["board_id"]).all() for f in frames)
    assert calls[0] == 1 and health.total_problems() == 0

    nv = fake_nvml(gpus=1)
    calls = _uuids_in_turn(nv, [{0: "GPU-a"}, {0: "GPU-b"}])
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health, interval=0.02, max_polls=2)
    source.reads_boards = False
    frames = list(source)
    assert len(frames) == 2 and all(np.isnan(f.columns["board_id"]).all() for f in frames)
    assert calls[0] == 0 and not health.gpus_replaced
