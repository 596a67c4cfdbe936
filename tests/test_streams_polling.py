"""The polling loop shared by live sources: fixed grid, failures counted, stoppable."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.streams.polling import PollingSource, run_command


class Flaky(PollingSource):
    stage = "flaky"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.calls: list[float] = []

    def poll(self) -> list[Frame]:
        self.calls.append(time.monotonic())
        if len(self.calls) == 2:
            raise RuntimeError("device vanished")
        return [Frame("gpu", np.array([float(len(self.calls))]), np.array([0]), {"power": np.array([1.0])})]


def test_failed_poll_is_counted_and_the_grid_holds() -> None:
    health = PipelineHealth()
    source = Flaky(interval=0.05, health=health, max_polls=4)
    frames = list(source)
    assert [f.ts[0] for f in frames] == [1.0, 3.0, 4.0]
    assert health.problems[("flaky", "poll failed")] == 1
    assert health.samples["gpu"] == 3
    gaps = np.diff(source.calls)
    assert np.all(gaps > 0.03) and np.all(gaps < 0.2)


def test_stop_from_another_thread() -> None:
    source = Flaky(interval=10.0)
    timer = threading.Timer(0.1, source.stop)
    timer.start()
    started = time.monotonic()
    frames = list(source)
    assert time.monotonic() - started < 5 and len(frames) == 1


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval"):
        Flaky(interval=0)


def test_run_command_reports_failures() -> None:
    health = PipelineHealth()
    assert run_command(["/bin/echo", "hi"], health, "t") == ("hi\n", "")
    out, error = run_command(["/bin/sh", "-c", "echo nope >&2; exit 3"], health, "t")
    assert out is None and "nope" in error
    out, _ = run_command(["/bin/sleep", "5"], health, "t", timeout=0.1)
    assert out is None
    assert health.problems == {("t", "command failed"): 1, ("t", "command timed out"): 1}
