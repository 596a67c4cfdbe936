"""The poll grid starts again once the first frames have been taken, whichever poll brought them:
a source whose first polls read nothing (an exporter not up yet) had the start-up of what takes
its frames (``watch`` builds its bank and compiles its kernels at the first frame) counted as
skipped polls, 22 of them with a cold compilation cache."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.streams.polling import PollingSource

T0 = 1_700_000_000.0


class LateFirst(PollingSource):
    """Reads nothing in its first ``empty`` polls, then a frame a poll; each poll takes a tenth of
    the interval, on a clock of its own that the test moves (no sleeping, no real time)."""

    stage = "late"

    def __init__(self, empty: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.empty = empty
        self.now = 0.0
        self.monotonic = lambda: self.now
        self.wall = lambda: T0 + self.now
        self.began: list[float] = []
        source = self

        class FakeWait(threading.Event):
            def wait(self, timeout: float | None = None) -> bool:
                source.now += timeout or 0.0
                return self.is_set()

        self._stop = FakeWait()

    def poll(self) -> list[Frame]:
        self.began.append(self.now)
        self.now += 0.1 * self.interval
        if len(self.began) <= self.empty:
            return []
        return [Frame("gpu", np.array([T0 + self.now]), np.array([0]), {"gpu_temp": np.array([50.0])})]


def test_the_start_up_behind_the_first_frame_is_not_a_skipped_poll_whichever_poll_brought_it() -> None:
    health = PipelineHealth()
    source = LateFirst(2, interval=10.0, health=health, max_polls=6)
    frames = iter(source)
    next(frames)  # polls 1 and 2 read nothing; the third brings the first frame
    source.now += 35.0  # the consumer starting up on it: 3.5 intervals
    next(frames)
    assert not health.polls_skipped
    source.now += 25.0  # late later: the slots it overran are skipped polls
    list(frames)
    assert health.polls_skipped["late"] == 2
    # the grid, started again at the third poll's start shifted by the start-up
    assert [b / source.interval for b in source.began] == pytest.approx(
        [0.0, 1.0, 2.0, 2.0 + 3.5 + 1.0, 2.0 + 3.5 + 4.0, 2.0 + 3.5 + 5.0])
