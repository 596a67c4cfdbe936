"""The polling loop shared by live sources: fixed grid, failures counted, stoppable."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from foreshock.frames import Frame
from foreshock.guard import POLL_GAP_S
from foreshock.health import PipelineHealth
from foreshock.streams.polling import PollingSource, alongside, run_command


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
    # The grid holds through the failure: every poll starts at its slot of the 0.05 s grid or
    # later (a poll woken late, or a slot skipped, is later; none comes early), never sooner than
    # POLL_GAP_S after the previous one. Not an exact interval: a poll woken late and the next one
    # on time lie 0.05 s less the delay apart (15 ms at the least, by design), and a loaded machine
    # can stall any wait. The calls are stamped inside poll(), a moment after the loop's own start
    # stamp, which the floor counts from: 1 ms allowed for that, still clear of the 10 ms at which
    # the guard refuses rows as repeats. The upper bound only catches a failed poll that held up the
    # loop (a retry, a back-off) or lost the grid.
    calls = np.array(source.calls)
    assert np.all(calls >= calls[0] + 0.05 * np.arange(len(calls)) - 1e-3), np.diff(calls)
    gaps = np.diff(calls)
    assert np.all(gaps >= POLL_GAP_S - 1e-3) and np.all(gaps < 2.0), gaps


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


T0 = 1_764_700_000.0  # a stamp of today: its rounding is the one live sources have


class Slow(PollingSource):
    """Polls on a fake poll-grid clock, which the wait between polls advances too (no real
    waiting): poll ``i`` takes ``took[i]`` intervals, the scheduler wakes it ``late[i]`` seconds
    after the wait it was given (none by default), and it stamps its row when it starts (dcgm,
    nvidia-smi, NVML, sysfs) or, with ``at``, ``at[i]`` of the way through (Redfish stamps each
    BMC's answer as it comes, a CDU poll its rows at its end)."""

    stage = "slow"

    def __init__(self, took: list[float], late: list[float] | None = None, at: list[float] | None = None,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.stamps_at_start = at is None
        self.took, self.late, self.at = took, late or [0.0] * len(took), at or [0.0] * len(took)
        self.now = 0.0
        self.monotonic = lambda: self.now
        self.began: list[float] = []
        self.ended: list[float] = []
        source = self

        class FakeWait(threading.Event):
            def wait(self, timeout: float | None = None) -> bool:
                source.now += (timeout or 0.0) + source.late[len(source.began)]
                return self.is_set()

        self._stop = FakeWait()

    def poll(self) -> list[Frame]:
        i = len(self.began)
        self.began.append(self.now)
        stamp = T0 + self.now + self.at[i] * self.took[i] * self.interval
        self.now += self.took[i] * self.interval
        self.ended.append(self.now)
        return [Frame("gpu", np.array([stamp]), np.array([0]), {"gpu_temp": np.array([50.0])})]


def test_a_poll_longer_than_the_interval_counts_the_polls_it_skipped() -> None:
    """A poll that takes 2.5 intervals overruns the next two slots of the grid: their samples
    were never read. They were skipped silently; they are counted (not as input problems: the
    input was fine), the reason logged once."""
    health = PipelineHealth()
    source = Slow([0.1, 2.5, 0.1, 3.2, 0.1], interval=10.0, health=health, max_polls=5)
    assert len(list(source)) == 5
    assert health.polls_skipped["slow"] == 2 + 3 and not health.problems
    # and the polls stay on the grid: 0, 1, then 4 (slots 2 and 3 skipped), 5, then 9
    assert [b / source.interval for b in source.began] == pytest.approx([0.0, 1.0, 4.0, 5.0, 9.0])


def test_polls_within_the_interval_count_nothing() -> None:
    health = PipelineHealth()
    assert len(list(Slow([0.9] * 4, interval=10.0, health=health, max_polls=4))) == 4
    assert not health.problems and not health.polls_skipped


def test_the_start_up_behind_the_first_poll_is_not_a_skipped_poll() -> None:
    """`watch` builds its bank and compiles its kernels when the first frame comes: every start
    counted the polls of that pause as skipped, so the counter was never 0. The grid starts once
    the first poll's frames are taken; a consumer that is late later is still counted."""
    health = PipelineHealth()
    source = Slow([0.1] * 4, interval=10.0, health=health, max_polls=4)
    frames = iter(source)
    next(frames)
    source.now += 35.0  # the consumer starting up: 3.5 intervals
    next(frames)
    assert not health.polls_skipped
    source.now += 25.0  # late later: the slots it overran are skipped polls
    list(frames)
    assert health.polls_skipped["slow"] == 2
    assert [b / source.interval for b in source.began] == pytest.approx([0.0, 3.5 + 1.0, 3.5 + 4.0, 3.5 + 5.0])


class Steady(PollingSource):
    stage = "steady"

    def poll(self) -> list[Frame]:
        return [Frame("gpu", np.array([float(self.polls)]), np.array([0]), {"power": np.array([1.0])})]


def test_a_pipeline_slower_than_its_sources_holds_a_bounded_backlog() -> None:
    """``watch --bmc``: the source and the BMCs are polled in threads of their own, their frames
    queued for the pipeline. With a pipeline slower than the polls the queue grew for as long as
    the run lasted (here some 600 frames for 30 taken; over weeks, memory and a lag without end).
    It holds ``backlog`` frames; past that the sources wait, and count the polls they skip."""
    health = PipelineHealth()
    primary, other = Steady(interval=0.02, health=health), Steady(interval=0.02, health=health)
    frames = alongside(primary, [other], backlog=4)
    for _ in range(30):
        next(frames)
        time.sleep(0.05)  # a pipeline slower than the polls (some 3 polls a source meanwhile)
    polled = primary.polls + other.polls
    frames.close()
    primary.stop()
    assert polled <= 30 + 4 + 2  # taken, waiting, and one in each pump's hand
    assert health.polls_skipped["steady"] > 0
