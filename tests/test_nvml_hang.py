"""An NVML call that never returns (a wedged GPU, the driver stuck in an ioctl) held the NVML
source's poll, and with it ``record`` and ``watch``, for good (audit 2026-12-05, finding 2). A poll
now waits for its calls a deadline at most: the GPU in the hung call is counted, and
it is asked nothing more (its stuck thread not reused), and has no row, until the call returns."""

from __future__ import annotations

import threading
import time
import types
from typing import Any, Callable

import numpy as np

from foreshock.health import PipelineHealth
from foreshock.streams.nvml import NvmlSource

HUNG = "NVML call hung"  # the reasons the dashboards and the summary show, as the health counts them
STILL_HUNG = "GPU not read: its NVML call still hung"


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def fake_nvml(gpus: int, hang_gpu: int, release: threading.Event) -> tuple[types.ModuleType, dict[int, int]]:
    """``gpus`` GPUs serving power (the calls made counted per GPU, returned beside the module);
    GPU ``hang_gpu``'s power call blocks (until ``release``) while ``nv.armed`` is set. Every other
    call is not supported."""
    nv = types.ModuleType("pynvml")
    calls = {g: 0 for g in range(gpus)}  # power calls made, per GPU
    armed = threading.Event()

    def power(h: int) -> int:
        calls[h] += 1
        if h == hang_gpu and armed.is_set():
            release.wait(30)  # a driver call that does not return (until the test lets it)
        return 300_000  # mW

    def unsupported(*_: Any) -> Any:
        raise FakeNvmlError(3)

    nv.NVMLError = FakeNvmlError  # type: ignore[attr-defined]
    nv.NVML_ERROR_NOT_SUPPORTED = 3  # type: ignore[attr-defined]
    nv.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    nv.nvmlDeviceGetCount = lambda: gpus  # type: ignore[attr-defined]
    nv.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"  # type: ignore[attr-defined]
    nv.nvmlDeviceGetTemperature = lambda h, s: 40  # type: ignore[attr-defined]
    nv.nvmlDeviceGetPowerUsage = power  # type: ignore[attr-defined]
    nv.__getattr__ = lambda name: unsupported  # type: ignore[attr-defined]
    nv.armed = armed  # type: ignore[attr-defined]
    return nv, calls


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``, failing (not hanging the suite) when it has not returned in ``seconds``."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"the poll did not return within {seconds} s"
    return out[0]


def test_a_hung_call_costs_its_gpu_that_poll_and_its_thread_is_not_reused_until_it_returns() -> None:
    release = threading.Event()
    nv, calls = fake_nvml(2, hang_gpu=0, release=release)
    health = PipelineHealth()
    src = NvmlSource(interval=0.1, host="h", health=health, nvml=nv)
    src.deadline_s = 0.3  # (10 s in service, as nvidia-smi's command)
    try:
        first = within(5, src.read)
        assert np.all(first.columns["power"] == 300.0)
        nv.armed.set()
        began = time.monotonic()
        hung = within(5, src.read)
        assert time.monotonic() - began < 2.0  # the deadline, not the call, ended the poll
        assert health.problems.get(("nvml", HUNG)) == 1
        assert len(hung) == 0  # GPU 0 hung and GPU 1, after it, not read this poll: silent, no NaN rows
        made = dict(calls)
        again = within(5, src.read)
        # GPU 0 is asked nothing while its call is stuck (no second thread in the driver), counted
        # as left out; GPU 1 is read
        assert calls[0] == made[0] and calls[1] == made[1] + 1
        assert health.problems.get(("nvml", STILL_HUNG)) == 1 and health.problems.get(("nvml", HUNG)) == 1
        assert list(again.entity) == [1] and list(again.columns["power"]) == [300.0]
        nv.armed.clear()
        release.set()  # the call returns: GPU 0 is read again from the next poll
        deadline = time.monotonic() + 5
        while 0 in src._stuck and time.monotonic() < deadline:
            time.sleep(0.02)
        back = within(5, src.read)
        assert list(back.entity) == [0, 1] and np.all(back.columns["power"] == 300.0)
        assert health.problems.get(("nvml", STILL_HUNG)) == 1
    finally:
        release.set()


def test_a_hurry_ends_a_poll_waiting_for_a_hung_call_at_once_without_counting_it() -> None:
    """A second signal (``hurry``) ends the wait at once; a stop alone does not (it would cut a slow,
    healthy poll short: tests/test_live_stop_graceful.py)."""
    release = threading.Event()
    nv, _ = fake_nvml(2, hang_gpu=1, release=release)
    health = PipelineHealth()
    src = NvmlSource(interval=0.1, host="h", health=health, nvml=nv)
    src.deadline_s = 20.0  # longer than the test would wait: only the hurry can end the poll
    nv.armed.set()
    try:
        threading.Timer(0.3, src.hurry).start()
        began = time.monotonic()
        cut = within(5, src.read)
        assert time.monotonic() - began < 2.0
        assert ("nvml", HUNG) not in health.problems  # the hurry, not a hang, ended it
        assert list(cut.entity) == [0]  # GPU 0's row read before it; GPU 1, in hand, has none
    finally:
        release.set()
