"""Frame sources for the embedded pipeline: a recording replay and any live frame iterator.

A source has a ``topology`` and yields :class:`~foreshock.frames.Frame` objects in time order.
Real-format sources (dcgm-exporter scrapes, nvidia-smi, NVML, InfiniBand sysfs, ethtool) live
in their own modules and follow the same shape.
"""

from __future__ import annotations

import threading
import time
from typing import Iterable, Iterator, Protocol

import numpy as np

from foreshock.frames import Frame
from foreshock.recording import Recording
from foreshock.topology import Topology


class Source(Protocol):
    topology: Topology

    def __iter__(self) -> Iterator[Frame]: ...


def paced(frames: Iterable[Frame], speed: float | None, stop: threading.Event | None = None) -> Iterator[Frame]:
    """Yield frames no faster than ``speed`` x real time (``None`` = as fast as possible).

    Pacing follows the telemetry timestamps: a frame is released when wall time since the
    start reaches (its earliest timestamp - the first frame's) / speed. Only finite stamps count:
    one row stamped -inf made the start -inf and the next wait infinite (an OverflowError in the
    sleep); a frame with no finite stamp is released at once. The guard counts such rows.
    """
    start_wall = time.monotonic()
    start_ts: float | None = None
    for frame in frames:
        if stop is not None and stop.is_set():
            return
        if speed and len(frame):
            finite = frame.ts[np.isfinite(frame.ts)]
            if len(finite):
                ts0 = float(finite.min())
                if start_ts is None:
                    start_ts = ts0
                due = (ts0 - start_ts) / speed - (time.monotonic() - start_wall)
                if due > 0:
                    if stop is not None:
                        if stop.wait(due):
                            return
                    else:
                        time.sleep(due)
        yield frame


class ReplaySource:
    """Replays a recording folder, optionally shifting timestamps so the replay starts now.

    ``shift_to`` (seconds since the epoch) moves every timestamp by the same offset: useful when
    the consumer (Prometheus, Alertmanager) compares telemetry time with its own clock.
    """

    def __init__(self, path: str, speed: float | None = None, shift_to: float | None = None,
                 batch_rows: int = 65_536) -> None:
        self.recording = Recording.open(path)
        self.topology = self.recording.topology
        self.speed = speed
        self.batch_rows = batch_rows
        start = self.recording.meta.get("start")
        self.offset = (shift_to - float(start)) if (shift_to is not None and start is not None) else 0.0
        self.stop = threading.Event()

    def __iter__(self) -> Iterator[Frame]:
        frames = self.recording.iter_frames(batch_rows=self.batch_rows)
        if self.offset:
            frames = (_shift(f, self.offset) for f in frames)
        return paced(frames, self.speed, self.stop)


class IterableSource:
    """Wraps any frame iterator (the simulator's live engine, a scraper) with a topology."""

    def __init__(self, topology: Topology, frames: Iterable[Frame], speed: float | None = None) -> None:
        self.topology = topology
        self.frames = frames
        self.speed = speed
        self.stop = threading.Event()

    def __iter__(self) -> Iterator[Frame]:
        return paced(self.frames, self.speed, self.stop)


def _shift(frame: Frame, offset: float) -> Frame:
    return Frame(frame.kind, frame.ts + offset, frame.slot, frame.columns)
