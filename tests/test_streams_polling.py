"""The polling loop shared by live sources: fixed grid, failures counted, stoppable."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from foreshock.frames import Frame
from foreshock.guard import POLL_GAP_S
from foreshock.health import PipelineHealth
from foreshock.streams import polling
from foreshock.streams.polling import PollingSource, alongside, run_command, run_process


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


@pytest.mark.parametrize("interval", [float("inf"), float("nan")])
def test_an_interval_that_is_no_finite_number_is_refused(interval: float) -> None:
    """Infinity passed the floor check; the wait after the first poll then raised OverflowError and
    ended the source's thread (``watch --bmc-interval inf``)."""
    with pytest.raises(ValueError, match="interval"):
        Flaky(interval=interval)


def test_run_command_reports_failures() -> None:
    health = PipelineHealth()
    assert run_command(["/bin/echo", "hi"], health, "t") == ("hi\n", "")
    out, error = run_command(["/bin/sh", "-c", "echo nope >&2; exit 3"], health, "t")
    assert out is None and "nope" in error
    out, _ = run_command(["/bin/sleep", "5"], health, "t", timeout=0.1)
    assert out is None
    assert health.problems == {("t", "command failed"): 1, ("t", "command timed out"): 1}


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its new parent to reap it has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _ended_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # the test's own leftover
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def wrapper(tmp_path: Path) -> tuple[list[str], Path]:
    """A command as ``--executable`` may name (a container, ssh): a shell whose tool hangs."""
    pid_file = tmp_path / "tool.pid"
    script = tmp_path / "wrapper.sh"
    script.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}.part && mv {pid_file}.part {pid_file}\nwait\n")
    script.chmod(0o755)
    return [str(script)], pid_file


def _tool_pid(pid_file: Path) -> int:
    deadline = time.monotonic() + 5
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the wrapper never started its tool"
        time.sleep(0.01)
    return int(pid_file.read_text())


def test_a_timed_out_command_takes_its_children_with_it(wrapper: tuple[list[str], Path]) -> None:
    """Only the wrapper was killed: the hung tool under it kept running, one more per timed-out poll."""
    argv, pid_file = wrapper
    health = PipelineHealth()
    assert run_process(argv, health, "t", timeout=0.5) == (None, f"{argv[0]}: timed out after 0.5 s")
    assert _ended_within(_tool_pid(pid_file), 2.0)
    assert health.problems == {("t", "command timed out"): 1}


def test_an_interrupted_command_takes_its_children_with_it(wrapper: tuple[list[str], Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """In a session of its own the command no longer gets the terminal's Ctrl-C: a KeyboardInterrupt
    (a second Ctrl-C at ``watch``) while it runs kills it and its children."""
    argv, pid_file = wrapper

    def interrupted(*args: object, **kwargs: object) -> object:
        _tool_pid(pid_file)
        raise KeyboardInterrupt

    monkeypatch.setattr(polling, "_gather", interrupted)  # what waits for the command
    with pytest.raises(KeyboardInterrupt):
        run_process(argv, PipelineHealth(), "t", timeout=60)
    monkeypatch.undo()
    assert _ended_within(_tool_pid(pid_file), 2.0)


def test_a_command_still_running_when_foreshock_exits_is_killed(wrapper: tuple[list[str], Path]) -> None:
    """A source polling in a thread of its own (``watch --bmc``) is abandoned when a second Ctrl-C
    ends the process: its command, which no Ctrl-C reaches now, is killed at exit."""
    argv, pid_file = wrapper
    answers: list[tuple[object, str]] = []
    poll = threading.Thread(target=lambda: answers.append(run_process(argv, PipelineHealth(), "t", timeout=60)))
    poll.start()
    tool = _tool_pid(pid_file)
    polling._kill_running_groups()  # what the interpreter's exit runs
    poll.join(5)
    assert _ended_within(tool, 2.0)
    assert answers and answers[0][0] is not None  # the wrapper ended (killed), not timed out


@pytest.mark.parametrize("argv,why", [(["NOSHEBANG"], "Exec format error"), (["/bin/echo", "a\0b"], "null byte")])
def test_a_command_that_cannot_be_started_is_counted_not_raised(argv: list[str], why: str, tmp_path: Path) -> None:
    """A script without a #! line (ENOEXEC) and an argument with a NUL byte raised out of
    run_process: a traceback from ``foreshock topology jobs --squeue SCRIPT``."""
    if argv[0] == "NOSHEBANG":
        script = tmp_path / "squeue"
        script.write_text("echo '{}'\n")
        script.chmod(0o755)
        argv = [str(script)]
    health = PipelineHealth()
    out, error = run_command(argv, health, "slurm")
    assert out is None and why in error
    assert health.problems == {("slurm", "command could not be started"): 1}


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
        self.wall = lambda: T0 + self.now  # the host's clock keeps step with the fake grid's
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


def _crashing(after: int) -> Iterator[Frame]:
    for i in range(after):
        yield Frame("gpu", np.array([float(i)]), np.array([1]), {"power": np.array([1.0])})
    raise RuntimeError("exporter client crashed")


def test_an_error_that_ends_the_primary_reaches_the_consumer() -> None:
    """It ended the merged stream as the primary's end would: ``watch --bmc`` printed its summary and
    exited 0, the traceback only in the thread's hook."""
    other = Steady(interval=1.0)
    frames = []
    with pytest.raises(RuntimeError, match="exporter client crashed"):
        for frame in alongside(_crashing(after=2), [other]):
            frames.append(frame)
    assert sum(1 for f in frames if f.slot[0] == 1) == 2  # what came before the error was delivered


class Crashing(Steady):
    stage = "redfish"

    def __iter__(self) -> Iterator[Frame]:
        yield from _crashing(after=1)


def test_an_error_that_ends_a_side_source_is_counted_and_the_primary_goes_on() -> None:
    health = PipelineHealth()
    side = Crashing(interval=1.0, health=health)
    primary = Steady(interval=0.05, health=PipelineHealth(), max_polls=6)
    frames = list(alongside(primary, [side]))
    assert len(frames) == 6 + 1
    assert health.problems == {("redfish", "source stopped"): 1}
