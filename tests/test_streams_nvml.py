"""NVML source: on a real GPU when there is one (skipped otherwise), and its unit conversions and
error handling against a stand-in for pynvml (NVML itself cannot run without a driver)."""

from __future__ import annotations

import json
import logging
import math
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from foreshock.health import PipelineHealth
from foreshock.recording import Recording
from foreshock.streams.nvidia_smi import TLIMIT_MEMORY_CLEAR_C
from foreshock.streams.nvml import (GPU_FAILED, READERS, SLOW_FIELDS, UNEXPECTED, NvmlSource, load_nvml,
                                     record_nvml)

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
    """A module with pynvml's names; ``unsupported``/``failing`` name functions that raise
    (``NOT_SUPPORTED``; ``UNKNOWN``, an error that says nothing of the GPU's state)."""
    nv: Any = types.ModuleType("fake_pynvml")
    nv.calls = {}
    nv.NVMLError = FakeNvmlError
    consts = dict(NVML_SUCCESS=0, NVML_ERROR_NOT_SUPPORTED=3, NVML_ERROR_FUNCTION_NOT_FOUND=13,
                  NVML_ERROR_GPU_IS_LOST=15, NVML_ERROR_RESET_REQUIRED=16, NVML_ERROR_UNKNOWN=999,
                  NVML_ERROR_TIMEOUT=10, NVML_TEMPERATURE_GPU=0, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1,
                  NVML_TEMPERATURE_THRESHOLD_MEM_MAX=2, NVML_TEMPERATURE_THRESHOLD_GPU_MAX=3,
                  NVML_CLOCK_SM=1, NVML_PERF_POLICY_POWER=0, NVML_PERF_POLICY_THERMAL=1,
                  NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0, NVML_FI_DEV_MEMORY_TEMP=82,
                  NVML_FI_DEV_PERF_POLICY_POWER=74,
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
                raise FakeNvmlError(999)
            return result(handle, *args) if callable(result) else result
        return call

    # field values by id: the HBM temperature (°C), the power violation counter (ns: as the
    # violation status below, the same counter on a real H200); an id not here is not supported
    fields = {82: types.SimpleNamespace(nvmlReturn=0, valueType=1, value=types.SimpleNamespace(uiVal=41)),
              74: types.SimpleNamespace(nvmlReturn=0, valueType=3, value=types.SimpleNamespace(ullVal=2_500_000_000))}
    not_served = types.SimpleNamespace(nvmlReturn=3, valueType=1, value=types.SimpleNamespace(uiVal=0))
    nv.nvmlDeviceGetCount = lambda: gpus
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetTemperature = fn("temperature", lambda h, s: 53 + h)
    nv.nvmlDeviceGetFieldValues = fn("field_values", lambda h, ids: [fields.get(i, not_served) for i in ids])
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


H200_TLIMIT = Path(__file__).parent / "data" / "h200_tlimit"


def test_where_the_threshold_call_is_retired_the_limit_is_the_gpus_temperature_plus_its_own_margin() -> None:
    """NVIDIA will remove the GPU_MAX threshold from ``nvmlDeviceGetTemperatureThreshold`` on Ada and
    later; a driver answering DEPRECATED left ``max_op_temp`` unsupported. Served NVML's readings
    from a real H200 stepping idle -> copy -> matmul -> copy -> idle (``tests/data/h200_tlimit``:
    its GPU temperature and margin temperature, the memory temperature nvidia-smi read beside them),
    the source reads the die's limit, 87 °C within the degree the readings round by, where the margin
    is the GPU's, and no value where the memory is about as near its own 95 °C; the retired call is made
    once, not at every poll."""
    polls = [json.loads(line) for line in (H200_TLIMIT / "nvml-margin.jsonl").read_text().splitlines()[1:]]
    nv = fake_nvml(gpus=1)
    nv.NVML_ERROR_DEPRECATED = 26
    at = [0]
    asked: list[int] = []

    def retired(handle: int, kind: int) -> int:
        asked.append(kind)
        raise FakeNvmlError(26)

    def memory(handle: int, ids: list[int]) -> list[Any]:
        celsius = int(polls[at[0]]["smi"][1])
        return [types.SimpleNamespace(nvmlReturn=0, valueType=1, value=types.SimpleNamespace(uiVal=celsius))]

    nv.nvmlDeviceGetTemperatureThreshold = retired
    nv.nvmlDeviceGetMarginTemperature = lambda handle: polls[at[0]]["margin"]
    nv.nvmlDeviceGetTemperature = lambda handle, sensor: polls[at[0]]["gpu"]
    nv.nvmlDeviceGetFieldValues = memory
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h200", health=health)
    read = []
    for k in range(len(polls)):  # the reader at each poll (the source serves a reading for a minute: SLOW_FIELDS)
        at[0] = k
        read.append(source._call(0, "max_op_temp", lambda: source.readers["max_op_temp"](nv, 0))[0])
    limits = np.array(read)
    memory_as_near = np.array([95 - int(p["smi"][1]) < p["margin"] + TLIMIT_MEMORY_CLEAR_C for p in polls])
    assert memory_as_near.sum() > 40 and (~memory_as_near).sum() > 40
    assert np.isnan(limits[memory_as_near]).all()
    assert np.all(np.abs(limits[~memory_as_near] - 87.0) <= 1.0)
    assert "max_op_temp" not in source.unsupported_fields()
    assert asked.count(nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX) == 1
    assert health.total_problems() == 0


def test_the_margin_is_not_read_where_the_threshold_is_served_and_neither_served_is_not_supported() -> None:
    """The threshold served: the margin is never asked for. Neither served (the threshold not
    supported, a pynvml without ``nvmlDeviceGetMarginTemperature``): the field is not supported,
    named once, not an error."""
    nv = fake_nvml(gpus=1)
    margins = [0]

    def margin(handle: int) -> int:
        margins[0] += 1
        return 30

    nv.nvmlDeviceGetMarginTemperature = margin
    source = NvmlSource(nvml=nv, host="h")
    assert [source.read().columns["max_op_temp"][0] for _ in range(2)] == [87.0, 87.0]
    assert margins[0] == 0
    nv = fake_nvml(gpus=2, unsupported=frozenset({"threshold"}))
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health)
    for _ in range(2):
        assert "max_op_temp" not in source.read().columns
    assert source.unsupported_fields()["max_op_temp"] == ["h/gpu0", "h/gpu1"]
    assert health.total_problems() == 0


@pytest.mark.parametrize("memory_return, expected", [
    (0, math.nan),  # read, 59 °C: the memory nearer (95 - 59 = 36), not the die's
    (3, 84.0),  # NOT_SUPPORTED: no memory sensor, the margin is the die's own
    (10, math.nan),  # TIMEOUT: whose margin it is cannot be told
    (999, math.nan),  # UNKNOWN: likewise
])
def test_a_failed_memory_reading_gives_the_margin_to_no_one(memory_return: int, expected: float) -> None:
    """The threshold call retired, the margin 36 °C at a die of 48 °C: any failure to read the
    memory temperature had been taken for "no memory sensor", and the memory's headroom added to
    the die's temperature (84 °C). Only a board that does not support the reading gives the die's."""
    nv = fake_nvml(gpus=1)
    nv.NVML_ERROR_DEPRECATED = 26

    def retired(handle: int, kind: int) -> int:
        raise FakeNvmlError(26)

    memory = types.SimpleNamespace(nvmlReturn=memory_return, valueType=1, value=types.SimpleNamespace(uiVal=59))
    nv.nvmlDeviceGetTemperatureThreshold = retired
    nv.nvmlDeviceGetMarginTemperature = lambda handle: 36
    nv.nvmlDeviceGetTemperature = lambda handle, sensor: 48
    nv.nvmlDeviceGetFieldValues = lambda handle, ids: [memory]
    read = NvmlSource(nvml=nv, host="h").read().columns.get("max_op_temp", np.array([math.nan]))
    np.testing.assert_array_equal(read, [expected])


def test_a_pynvml_without_the_threshold_call_reads_the_limit_from_the_margin() -> None:
    """A pynvml that no longer wraps ``nvmlDeviceGetTemperatureThreshold``: each threshold had been
    an unexpected error at every poll (3 a GPU a poll). Now the slowdown and memory thresholds are
    not supported, named once, and the max operating temperature comes from the margin."""
    nv = fake_nvml(gpus=1)
    del nv.nvmlDeviceGetTemperatureThreshold
    nv.nvmlDeviceGetMarginTemperature = lambda handle: 34  # the die 53 °C (fake_nvml), its memory 41
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health)
    for _ in range(3):
        batch = source.read()
    assert batch.columns["max_op_temp"].tolist() == [87.0]
    assert source.unsupported_fields() == {"slowdown_temp": ["h/gpu0"], "hbm_max_op_temp": ["h/gpu0"]}
    assert health.total_problems() == 0


# ---- the GPUs' UUIDs: a board swapped in its slot ----------------------------------------------
def _uuids_in_turn(nv: Any, per_poll: list[dict[int, Any]]) -> list[int]:
    """``nvmlDeviceGetUUID`` serving ``per_poll[k][gpu]`` at the k-th poll (an exception there: raised);
    the poll it is at is moved on by GPU 0's UUID, read first. Returns the calls counter."""
    poll = [-1]
    calls = [0]

    def uuid(handle: int) -> Any:
        calls[0] += 1
        if handle == 0:
            poll[0] += 1
        served = per_poll[poll[0]][handle]
        if isinstance(served, Exception):
            raise served
        return served

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
        {0: FakeNvmlError(10), 1: "GPU-p"},  # GPU 0's read fails (a timeout): no UUID this poll
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


# ---- an older driver, a GPU lost mid-run, a reader that raises ---------------------------------
def test_throttle_reasons_are_read_under_the_older_name_on_a_driver_before_r535() -> None:
    """A newer pynvml wraps ``nvmlDeviceGetCurrentClocksEventReasons``, which a driver before R535
    lacks (the wrapper raises FUNCTION_NOT_FOUND) while its ``...ThrottleReasons`` works. Until
    2026-12-03 the field was taken as not supported there and never read; now the older name is
    read, and the missing one is asked for once per source, not per GPU and poll."""
    nv = fake_nvml(gpus=2)
    asked = {"event": 0, "throttle": 0}

    def event_reasons(handle: int) -> int:
        asked["event"] += 1
        raise FakeNvmlError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)

    def throttle_reasons(handle: int) -> int:
        asked["throttle"] += 1
        return 0x20  # SW thermal slowdown

    nv.nvmlDeviceGetCurrentClocksEventReasons = event_reasons
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = throttle_reasons
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health, interval=0.02, max_polls=3)
    frames = list(source)
    assert [f.columns["throttle_reasons"].tolist() for f in frames] == [[32.0, 32.0]] * 3
    assert asked == {"event": 1, "throttle": 6}
    assert source.supported.all() and health.total_problems() == 0


def test_fields_found_not_supported_are_logged_once_with_their_gpus(caplog) -> None:
    """watch and agent said nothing of a field NVML does not give (a column NaN for good); now the
    fields so found are logged once, with the GPUs, as record_nvml lists them. A driver with
    neither name of the throttle reasons is such a field."""
    nv = fake_nvml(gpus=2, unsupported=frozenset({"pcie"}))
    del nv.nvmlDeviceGetCurrentClocksEventReasons  # an older pynvml: only the old name...
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda handle: (_ for _ in ()).throw(
        FakeNvmlError(nv.NVML_ERROR_FUNCTION_NOT_FOUND))  # ...which the driver lacks too
    remapped = nv.nvmlDeviceGetRemappedRows

    def remap(handle: int) -> Any:
        if handle == 1:
            raise FakeNvmlError(nv.NVML_ERROR_NOT_SUPPORTED)
        return remapped(handle)

    nv.nvmlDeviceGetRemappedRows = remap
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health, interval=0.02, max_polls=3)
    with caplog.at_level(logging.WARNING, logger="foreshock.sources"):
        frames = list(source)
    assert len(frames) == 3 and health.total_problems() == 0
    told = [r.getMessage() for r in caplog.records if "not supported" in r.getMessage()]
    assert told == ["nvml: not supported by the GPU or driver, read as no value and not asked again: "
                    "throttle_reasons on every GPU (2); pcie_replays on every GPU (2); remapped_rows on h/gpu1"]
    assert source.unsupported_fields() == {"throttle_reasons": ["h/gpu0", "h/gpu1"],
                                           "pcie_replays": ["h/gpu0", "h/gpu1"], "remapped_rows": ["h/gpu1"]}


def _gpus_failing(nv: Any, failing: dict[int, int]) -> dict[int, int]:
    """Every per-GPU call of ``nv`` raises the NVML error ``failing[gpu]`` for the GPUs it lists
    (the test changes it between polls); returns the calls made, per GPU."""
    calls: dict[int, int] = {}
    for name in dir(nv):
        if name.startswith("nvmlDevice") and name not in ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"):
            def call(handle: int, *args: Any, real: Any = getattr(nv, name)) -> Any:
                calls[handle] = calls.get(handle, 0) + 1
                if handle in failing:
                    raise FakeNvmlError(failing[handle])
                return real(handle, *args)
            setattr(nv, name, call)
    return calls


def test_a_gpu_lost_mid_run_is_asked_nothing_more_that_poll_and_counted_once_as_it_enters(caplog) -> None:
    """An XID 79 mid-run: NVML answers GPU_IS_LOST (or RESET_REQUIRED) to every call on the GPU,
    each of which may take long. Until 2026-12-03 all 17 readers and the UUID were still called at
    every poll, each failure counted as "NVML call failed" (so never logged after any earlier NVML
    failure). Now GPU_IS_LOST ends the GPU's poll at its first call (its row stays, NaN), and the
    GPU is counted and logged once as it enters the state, under nvidia-smi's reason for ``[GPU is
    lost]``; back (a reset), then needing a reset, it is counted again (that GPU still read: see
    the next test)."""
    nv = fake_nvml(gpus=4)
    failing: dict[int, int] = {}
    calls = _gpus_failing(nv, failing)
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health)
    source.slow_every_s = 0.0  # every field asked at every poll (SLOW_FIELDS): the calls are counted
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        failing[0] = nv.NVML_ERROR_TIMEOUT
        source.read()  # a transient failure first: "NVML call failed" logged, as before
        del failing[0]
        per_poll, rows, problems = [], [], []
        for state in (nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_GPU_IS_LOST, None,
                      nv.NVML_ERROR_RESET_REQUIRED, nv.NVML_ERROR_RESET_REQUIRED):
            if state is None:
                failing.pop(2, None)
            else:
                failing[2] = state
            before = calls.get(2, 0)
            batch = source.read()
            per_poll.append(calls[2] - before)
            rows.append(batch.column("gpu_temp").tolist())
            problems.append(health.problems[("nvml", GPU_FAILED)])
    assert per_poll == [1, 1, 1] + [len(READERS) + 1] * 3  # the lost GPU: one call a poll
    assert rows[0][:2] == [53.0, 54.0] and np.isnan(rows[0][2]) and rows[0][3] == 56.0  # the row stays
    assert rows[3] == [53.0, 54.0, 55.0, 56.0]
    assert problems == [1, 1, 1, 1, 2, 2]
    assert health.problems[("nvml", "NVML call failed")] == len(READERS) + 1  # the timeouts: each call
    told = [r.getMessage() for r in caplog.records if GPU_FAILED in r.getMessage()]
    assert len(told) == 1 and "h/gpu2" in told[0]



def test_a_gpu_that_needs_a_reset_for_one_call_is_counted_once_and_its_other_fields_read() -> None:
    """RESET_REQUIRED may come from some calls only (a GPU's ECC counters after a double-bit error).
    Ending the GPU's poll there lost every field read after it, the UUID and the remapped rows among
    them, the very fields worth reading then (review r4, 2026-12-03)."""
    nv = fake_nvml(gpus=2)
    ecc = nv.nvmlDeviceGetTotalEccErrors

    def needs_reset(handle: int, *args: Any) -> Any:
        if handle == 0:
            raise FakeNvmlError(nv.NVML_ERROR_RESET_REQUIRED)
        return ecc(handle, *args)

    nv.nvmlDeviceGetTotalEccErrors = needs_reset
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health)
    for _ in range(3):
        batch = source.read()
    assert np.isnan(batch.column("ecc_dbe")[0]) and batch.column("ecc_dbe")[1] == 0.0
    assert not np.isnan(batch.column("remapped_rows")).any() and not np.isnan(batch.column("pcie_replays")).any()
    assert health.problems[("nvml", GPU_FAILED)] == 1
    assert ("nvml", "NVML call failed") not in health.problems


def test_a_call_the_driver_has_deprecated_is_read_as_not_supported() -> None:
    """NVIDIA retires calls (CUDA 14: NVML_ERROR_DEPRECATED); such a field is not asked again and
    is named once as not supported, not counted as a failed call at every poll."""
    nv = fake_nvml(gpus=2)
    nv.NVML_ERROR_DEPRECATED = 26

    def retired(handle: int, *args: Any) -> Any:
        raise FakeNvmlError(26)

    nv.nvmlDeviceGetPcieReplayCounter = retired
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health)
    for _ in range(3):
        source.read()
    assert source.unsupported_fields() == {"pcie_replays": ["h/gpu0", "h/gpu1"]}
    assert health.total_problems() == 0

def test_a_reader_raising_something_other_than_an_nvml_error_costs_its_own_value_only(caplog) -> None:
    """A reader that no longer fits its pynvml (a TypeError, an AttributeError) on one GPU took the
    whole poll down with it ("poll failed": no GPU read at all, every poll). Now it costs that field
    on that GPU for the poll, counted under its own reason and logged once."""
    nv = fake_nvml(gpus=3)
    util = nv.nvmlDeviceGetUtilizationRates

    def drifted(handle: int) -> Any:
        if handle == 1:
            raise TypeError("unexpected")
        return util(handle)

    nv.nvmlDeviceGetUtilizationRates = drifted
    health = PipelineHealth()
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        frames = list(NvmlSource(nvml=nv, host="h", health=health, interval=0.02, max_polls=2))
    assert [len(f) for f in frames] == [3, 3]
    for frame in frames:
        assert frame.columns["util"][[0, 2]].tolist() == [1.0, 1.0] and np.isnan(frame.columns["util"][1])
        assert frame.columns["gpu_temp"].tolist() == [53.0, 54.0, 55.0]  # the GPU's other fields
    assert health.problems == {("nvml", UNEXPECTED): 2}
    told = [r.getMessage() for r in caplog.records if UNEXPECTED in r.getMessage()]
    assert len(told) == 1 and "util on GPU 1: TypeError: unexpected" in told[0]


def test_the_gpu_temperature_is_read_under_the_versioned_call_and_under_the_older_one_where_only_it_is_served() -> None:
    """``nvmlDeviceGetTemperature`` is deprecated and goes in CUDA 14 (NVML then answers
    FUNCTION_NOT_FOUND or DEPRECATED); until 2026-12-03 that made the GPU temperature, the field
    every thermal prediction starts from, "not supported" for good. Now ``nvmlDeviceGetTemperatureV``
    is read where the driver has it, and the older call where it does not (a driver before it
    answers FUNCTION_NOT_FOUND, asked once per source)."""
    newer = fake_nvml(gpus=2)
    newer.NVML_ERROR_DEPRECATED = 26
    sensors: list[int] = []

    def versioned(handle: int, sensor: int) -> int:
        sensors.append(sensor)
        return 60 + handle

    def retired(handle: int, sensor: int) -> int:
        raise FakeNvmlError(26)

    newer.nvmlDeviceGetTemperatureV = versioned
    newer.nvmlDeviceGetTemperature = retired
    health = PipelineHealth()
    batch = NvmlSource(nvml=newer, host="h", health=health).read()
    assert batch.column("gpu_temp").tolist() == [60.0, 61.0]
    assert sensors == [newer.NVML_TEMPERATURE_GPU] * 2 and health.total_problems() == 0

    older = fake_nvml(gpus=2)  # its nvmlDeviceGetTemperature answers 53 + GPU index
    asked = [0]

    def not_in_this_driver(handle: int, sensor: int) -> int:
        asked[0] += 1
        raise FakeNvmlError(older.NVML_ERROR_FUNCTION_NOT_FOUND)

    older.nvmlDeviceGetTemperatureV = not_in_this_driver
    health = PipelineHealth()
    source = NvmlSource(nvml=older, host="h", health=health, interval=0.02, max_polls=3)
    frames = list(source)
    assert [f.columns["gpu_temp"].tolist() for f in frames] == [[53.0, 54.0]] * 3
    assert asked == [1] and source.supported.all() and health.total_problems() == 0


@pytest.mark.parametrize(("value_type", "member", "raw", "expected"), [
    (0, "dVal", 41.5, 41.5), (1, "uiVal", 41, 41.0), (2, "ulVal", 41, 41.0), (3, "ullVal", 41, 41.0),
    (4, "sllVal", -3, -3.0), (5, "siVal", -3, -3.0), (6, "usVal", 41, 41.0)])
def test_the_hbm_temperature_is_read_through_the_member_its_value_type_names(
        value_type: int, member: str, raw: float, expected: float) -> None:
    """NVML's field values are a union read by ``valueType``. A SIGNED_INT (5) or UNSIGNED_SHORT (6)
    was read through ``uiVal``: a ctypes union gives the signed int's bytes as unsigned, -3 °C as
    4294967293 °C. The stand-in holds only the named member, so a read through another one fails."""
    nv = fake_nvml(gpus=1)
    field = types.SimpleNamespace(nvmlReturn=0, valueType=value_type, value=types.SimpleNamespace(**{member: raw}))
    nv.nvmlDeviceGetFieldValues = lambda h, ids: [field]
    health = PipelineHealth()
    assert NvmlSource(nvml=nv, host="h", health=health).read().column("hbm_temp").tolist() == [expected]
    assert health.total_problems() == 0


def test_an_hbm_temperature_of_a_value_type_nvml_does_not_define_is_no_value_and_counted() -> None:
    nv = fake_nvml(gpus=1)
    field = types.SimpleNamespace(nvmlReturn=0, valueType=7, value=types.SimpleNamespace(uiVal=41))
    served = nv.nvmlDeviceGetFieldValues
    nv.nvmlDeviceGetFieldValues = lambda h, ids: [field] if ids == [nv.NVML_FI_DEV_MEMORY_TEMP] else served(h, ids)
    health = PipelineHealth()
    batch = NvmlSource(nvml=nv, host="h", health=health).read()
    assert "hbm_temp" not in batch.columns and batch.column("gpu_temp").tolist() == [53.0]
    assert health.problems == {("nvml", UNEXPECTED): 1}


# ---- what a poll costs the driver: fields that do not change, the power violation counter ------
def _clocked(source: NvmlSource) -> list[float]:
    """The source's clock, set by the returned list's one item (seconds)."""
    now = [0.0]
    source.clock = lambda: now[0]  # type: ignore[method-assign]
    return now


def test_fields_that_do_not_change_are_read_once_a_minute_and_served_between() -> None:
    """The max SM clock took 1.2-1.4 ms a call on a real H200, the GPU_MAX and MEM_MAX thresholds
    0.2 ms each: a fifth of a 9 ms poll for values a board keeps while it is in its slot. They are
    read once every SLOW_EVERY_S (60 s), every row still carries them."""
    nv = fake_nvml(gpus=2)
    source = NvmlSource(nvml=nv, host="h")
    now = _clocked(source)
    rows = []
    for t in range(0, 61):  # a poll a second for a minute and one
        now[0] = float(t)
        batch = source.read()
        rows.append([batch.column(name).tolist() for name in ("sm_clock_max", "max_op_temp", "hbm_max_op_temp",
                                                               "slowdown_temp")])
        if t == 59:
            assert nv.calls["max_clock"] == 2 and nv.calls["threshold"] == 6  # 2 GPUs x (1, 3 thresholds)
    assert nv.calls["max_clock"] == 4 and nv.calls["threshold"] == 12  # read again at 60 s
    assert rows == [[[1.98e9] * 2, [87.0] * 2, [95.0] * 2, [89.0] * 2]] * 61
    assert nv.calls["clock"] == 2 * 61 and nv.calls["temperature"] == 2 * 61  # the others at every poll


def test_a_slow_field_read_without_a_value_is_asked_again_at_the_next_poll() -> None:
    nv = fake_nvml(gpus=1)
    failures = [1]
    served = nv.nvmlDeviceGetMaxClockInfo

    def max_clock(handle: int, clock: int) -> int:
        if failures[0] > 0:
            failures[0] -= 1
            raise FakeNvmlError(999)  # an error that says nothing of the GPU: retried
        return served(handle, clock)  # type: ignore[no-any-return]

    nv.nvmlDeviceGetMaxClockInfo = max_clock
    health = PipelineHealth()
    source = NvmlSource(nvml=nv, host="h", health=health)
    now = _clocked(source)
    got = []
    for t in range(4):
        now[0] = float(t)
        got.append(source.read().columns.get("sm_clock_max", np.array([np.nan]))[0])
    assert np.isnan(got[0]) and got[1:] == [1.98e9] * 3
    assert nv.calls["max_clock"] == 1 and health.problems == {("nvml", "NVML call failed"): 1}


def test_another_board_in_the_slot_or_a_gpu_back_from_lost_has_its_slow_fields_read_afresh() -> None:
    nv = fake_nvml(gpus=2)
    _uuids_in_turn(nv, [{0: "GPU-a", 1: "GPU-p"}, {0: "GPU-a", 1: "GPU-p"},
                                {0: "GPU-a", 1: "GPU-q"},  # GPU 1 replaced: read afresh
                                {0: "GPU-a", 1: "GPU-q"}, {0: "GPU-a", 1: "GPU-q"}, {0: "GPU-a", 1: "GPU-q"}])
    limits = {0: 87, 1: 87}
    nv.nvmlDeviceGetTemperatureThreshold = lambda h, kind: {1: 89, 2: 95, 3: limits[h]}[kind]
    lost: dict[int, int] = {}
    per_gpu = _gpus_failing(nv, lost)
    source = NvmlSource(nvml=nv, host="h")
    now = _clocked(source)
    read = []
    for t, (limit_1, gpu_0_lost) in enumerate([(87, False), (87, False), (85, False), (85, False), (85, True),
                                               (85, False)]):
        now[0] = float(t)
        limits[1] = limit_1
        if gpu_0_lost:
            lost[0] = nv.NVML_ERROR_GPU_IS_LOST
        else:
            lost.pop(0, None)
        before = per_gpu.get(0, 0)
        read.append((source.read().column("max_op_temp").tolist(), per_gpu.get(0, 0) - before))
    # GPU 1's new board (another limit) is read at once; GPU 0, back from lost, reads all its fields
    np.testing.assert_array_equal([r[0] for r in read], [[87.0, 87.0], [87.0, 87.0], [87.0, 85.0], [87.0, 85.0],
                                                         [np.nan, 85.0], [87.0, 85.0]])
    assert [r[1] for r in read] == [len(READERS) + 1, len(READERS) + 1 - len(SLOW_FIELDS), len(READERS) + 1
                                    - len(SLOW_FIELDS), len(READERS) + 1 - len(SLOW_FIELDS), 1, len(READERS) + 1]


def test_a_retired_threshold_call_costs_one_margin_reading_a_minute_on_the_real_h200_margins() -> None:
    """With the GPU_MAX threshold retired the limit is the temperature plus the margin (0.77 ms a
    call on the real H200) where the margin is the die's: read so once, it is served for the minute,
    through the rows where the memory was as near (which alone give no value)."""
    polls = [json.loads(line) for line in (H200_TLIMIT / "nvml-margin.jsonl").read_text().splitlines()[1:]]
    nv = fake_nvml(gpus=1)
    at = [0]
    margins = [0]

    def margin(handle: int) -> int:
        margins[0] += 1
        return polls[at[0]]["margin"]  # type: ignore[no-any-return]

    nv.nvmlDeviceGetTemperatureThreshold = lambda h, kind: (_ for _ in ()).throw(FakeNvmlError(26))
    nv.nvmlDeviceGetMarginTemperature = margin
    nv.nvmlDeviceGetTemperature = lambda handle, sensor: polls[at[0]]["gpu"]
    nv.nvmlDeviceGetFieldValues = lambda h, ids: [types.SimpleNamespace(
        nvmlReturn=0, valueType=1, value=types.SimpleNamespace(uiVal=int(polls[at[0]]["smi"][1])))]
    source = NvmlSource(nvml=nv, host="h200")
    now = _clocked(source)
    limits = []
    for k, poll in enumerate(polls):
        at[0] = k
        now[0] = poll["time"]
        limits.append(source.read().columns.get("max_op_temp", np.array([np.nan]))[0])
    span_min = (polls[-1]["time"] - polls[0]["time"]) / 60.0
    assert np.all(np.abs(np.array(limits) - 87.0) <= 1.0)  # (the first row's memory was clear)
    memory_as_near = sum(95 - int(p["smi"][1]) < p["margin"] + TLIMIT_MEMORY_CLEAR_C for p in polls)
    assert memory_as_near > 40
    # once a minute, and again at each poll after where the memory was as near (the limit served)
    assert margins[0] <= span_min + 1 + memory_as_near / 10


def test_the_power_violation_counter_is_read_as_a_field_where_served_else_through_the_violation_call() -> None:
    """On a real H200 ``nvmlDeviceGetViolationStatus(POWER)`` took 650 µs a call, the same counter as
    field 74 (NVML_FI_DEV_PERF_POLICY_POWER) 2.5 µs. A driver not serving the field: the older call,
    remembered (the field not asked for again: of any GPU where the library lacks field values, of
    that GPU where the GPU does not serve it)."""
    nv = fake_nvml(gpus=2)
    asked: list[list[int]] = []
    served = nv.nvmlDeviceGetFieldValues

    def field_values(h: int, ids: list[int]) -> Any:
        asked.append(list(ids))
        return served(h, ids)

    nv.nvmlDeviceGetFieldValues = field_values
    source = NvmlSource(nvml=nv, host="h")
    for _ in range(3):
        batch = source.read()
    assert batch.column("power_throttle_time").tolist() == [2.5, 2.5]
    assert asked.count([74]) == 6 and nv.calls["violation"] == 6  # the thermal counter's calls only

    for not_served in (3, 13, 2):  # NOT_SUPPORTED, FUNCTION_NOT_FOUND, INVALID_ARGUMENT (an id unknown)
        nv = fake_nvml(gpus=2)
        asked = []
        field = types.SimpleNamespace(nvmlReturn=not_served, valueType=3, value=types.SimpleNamespace(ullVal=0))
        memory = nv.nvmlDeviceGetFieldValues

        def not_serving_74(h: int, ids: list[int], field: Any = field, memory: Any = memory) -> Any:
            asked.append(list(ids))
            return [field] if ids == [74] else memory(h, ids)

        nv.nvmlDeviceGetFieldValues = not_serving_74
        health = PipelineHealth()
        source = NvmlSource(nvml=nv, host="h", health=health)
        for _ in range(3):
            batch = source.read()
        assert batch.column("power_throttle_time").tolist() == [2.5, 2.5]
        assert asked.count([74]) == (1 if not_served == 13 else 2) and nv.calls["violation"] == 6 + 6
        assert health.total_problems() == 0 and "power_throttle_time" not in source.unsupported_fields()
