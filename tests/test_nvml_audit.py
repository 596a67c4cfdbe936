"""The NVML source against a helper's audit (2026-12-05, repros in /tmp/audit_nvml/), with the
project's pynvml stand-in: one GPU that does not serve a field costs no other GPU that field's
fast read; a GPU waiting for a reset keeps its once-a-minute fields once a minute; and ``agent``
on a host without a driver says so in one line, as ``record`` and ``watch`` do."""

from __future__ import annotations

import types
from typing import Any

import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.health import PipelineHealth
from foreshock.streams.nvml import SLOW_EVERY_S, NvmlSource

from test_streams_nvml import FakeNvmlError, fake_nvml

POWER_FIELD = 74  # NVML_FI_DEV_PERF_POLICY_POWER


def _power_field_not_on_gpu0(nv: Any, violation_call_gone: bool) -> dict[int, int]:
    """GPU 0 answers NOT_SUPPORTED for the power-violation field (the others serve it); with
    ``violation_call_gone`` the older call is gone from the library (FUNCTION_NOT_FOUND, as in CUDA
    14). Returns the older call's count per GPU handle."""
    field_values, violation = nv.nvmlDeviceGetFieldValues, nv.nvmlDeviceGetViolationStatus
    older_calls: dict[int, int] = {}

    def fields(handle: int, ids: list[int]) -> Any:
        if handle == 0 and ids == [POWER_FIELD]:
            return [types.SimpleNamespace(nvmlReturn=nv.NVML_ERROR_NOT_SUPPORTED, valueType=3,
                                          value=types.SimpleNamespace(ullVal=0))]
        return field_values(handle, ids)

    def older(handle: int, policy: int) -> Any:
        if violation_call_gone:
            raise FakeNvmlError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
        if policy == nv.NVML_PERF_POLICY_POWER:
            older_calls[handle] = older_calls.get(handle, 0) + 1
        return violation(handle, policy)

    nv.nvmlDeviceGetFieldValues, nv.nvmlDeviceGetViolationStatus = fields, older
    return older_calls


@pytest.mark.parametrize("violation_call_gone", [False, True])
def test_one_gpu_without_a_field_costs_the_others_nothing(violation_call_gone: bool) -> None:
    nv = fake_nvml(gpus=3)
    older_calls = _power_field_not_on_gpu0(nv, violation_call_gone)
    source = NvmlSource(nvml=nv, host="h", health=PipelineHealth())
    for _ in range(3):
        batch = source.read()
    power_time = batch.column("power_throttle_time").tolist()
    assert power_time[1:] == [power_time[1]] * 2 and power_time[1] > 0  # GPUs 1 and 2: read from the field
    if violation_call_gone:  # GPU 0 has neither; the others keep the field (they had lost it for good)
        assert power_time[0] != power_time[0]
        assert source.unsupported_fields().get("power_throttle_time") == ["h/gpu0"]
    else:  # GPU 0 alone takes the older call (650 µs on a real H200), the others the field's 2.5 µs
        assert power_time[0] == power_time[1]
        assert older_calls == {0: 3}


def test_a_gpu_waiting_for_a_reset_reads_its_slow_fields_once_a_minute() -> None:
    nv = fake_nvml(gpus=2)
    ecc, max_clock = nv.nvmlDeviceGetTotalEccErrors, nv.nvmlDeviceGetMaxClockInfo
    asked: dict[int, int] = {0: 0, 1: 0}
    reset_pending = [True]

    def ecc_needing_reset(handle: int, *args: Any) -> Any:
        if handle == 0 and reset_pending[0]:
            raise FakeNvmlError(nv.NVML_ERROR_RESET_REQUIRED)
        return ecc(handle, *args)

    def counted_max_clock(handle: int, *args: Any) -> Any:
        asked[handle] += 1
        return max_clock(handle, *args)

    nv.nvmlDeviceGetTotalEccErrors, nv.nvmlDeviceGetMaxClockInfo = ecc_needing_reset, counted_max_clock
    now = [1.7e9]
    source = NvmlSource(nvml=nv, host="h", health=PipelineHealth())
    source.clock = lambda: now[0]
    for _ in range(10):  # ten polls a second apart: within one SLOW_EVERY_S
        batch = source.read()
        now[0] += 1.0
    assert SLOW_EVERY_S > 10 and asked == {0: 1, 1: 1}  # it had been asked at every poll: {0: 10, 1: 1}
    assert batch.column("sm_clock_max")[0] == batch.column("sm_clock_max")[1]  # the reading served meanwhile
    reset_pending[0] = False  # reset: back, its slow fields read afresh from the next poll
    source.read()
    source.read()
    assert asked == {0: 2, 1: 1}


def test_agent_without_a_driver_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import foreshock.cli.agent as agent
    import foreshock.streams.kafka_config as kafka_config

    class NVMLError_LibraryNotFound(Exception):  # noqa: N801 - pynvml's name
        pass

    def no_driver(*args: Any, **kwargs: Any) -> Any:
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    monkeypatch.setattr(kafka_config, "check_broker", lambda settings: None)  # no broker needed to fail here
    monkeypatch.setattr(agent, "open_source", no_driver)
    result = CliRunner().invoke(cli, ["agent", "--source", "nvml", "--kafka", "127.0.0.1:9", "--polls", "1"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert result.output.strip() == ("Error: cannot open source nvml: NVMLError_LibraryNotFound: "
                                     "NVML Shared Library Not Found")


def test_the_handles_remembered_as_not_serving_a_field_are_bounded() -> None:
    """A GPU lost and back has a new handle each time: over weeks the old ones would pile up."""
    from foreshock.streams.nvml import NOT_SERVED_MAX, FieldValueFirst

    nv = fake_nvml(gpus=1)
    nv.nvmlDeviceGetFieldValues = lambda handle, ids: [types.SimpleNamespace(
        nvmlReturn=nv.NVML_ERROR_NOT_SUPPORTED, valueType=3, value=types.SimpleNamespace(ullVal=0))]
    reader = FieldValueFirst("NVML_FI_DEV_PERF_POLICY_POWER", POWER_FIELD, 1e-9, lambda nv, handle: 2.5)
    for handle in range(3 * NOT_SERVED_MAX):  # a new handle at every return
        assert reader(nv, handle) == 2.5
    assert 0 < len(reader.not_served) <= NOT_SERVED_MAX and reader.field_served
