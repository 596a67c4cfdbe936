"""Frame sources for the embedded pipeline: a recording replay and any live frame iterator.

A source has a ``topology`` and yields :class:`~foreshock.frames.Frame` objects in time order.
Real-format sources (dcgm-exporter scrapes, nvidia-smi, NVML, InfiniBand sysfs, ethtool) live
in their own modules and follow the same shape.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterable, Iterator, Protocol

import numpy as np

from foreshock.frames import Frame, median_stamp
from foreshock.guard import MAX_BEHIND_S
from foreshock.recording import Recording, RecordingError
from foreshock.topology import Topology

log = logging.getLogger("foreshock.sources")


class Source(Protocol):
    topology: Topology

    def __iter__(self) -> Iterator[Frame]: ...


PACE_GAP_WINDOWS = 10
"""A paced replay waits out a gap in telemetry time as it was recorded (a detector aging a silent
source, a worker's staleness by arrival, must see it as the live source gave it), but one longer
than this many windows is logged, so an idle replay says why it waits."""
PACE_GAP_S = 60.0
"""The same where the window is not known (a live iterator's frames)."""
PACE_JUMP_S = 86400.0
"""A jump in telemetry time of more than a day, ahead of the latest frame or behind it, is not
waited out: no recording pauses that long, but a clock read as epoch zero, or stamps in
milliseconds, jump by years. It is logged and the pacing starts again from that frame."""
TOLD_GAPS = 5  # gaps and jumps logged one by one; past that, they are only waited or skipped


def paced(frames: Iterable[Frame], speed: float | None, stop: threading.Event | None = None,
          window: float | None = None) -> Iterator[Frame]:
    """Yield frames no faster than ``speed`` x real time (``None`` = as fast as possible).

    Pacing follows the telemetry timestamps: a frame is released when wall time since the
    pacing's start reaches (its time - the start frame's) / speed, a frame's time being its
    lower-median stamp (:func:`~foreshock.frames.median_stamp`: finite stamps only, one row
    stamped -inf made the start -inf and the next wait infinite, and one stamped 0 every wait
    1.7e9 / speed s; a frame with no finite stamp is released at once; the guard counts such rows).
    A gap longer than :data:`PACE_GAP_WINDOWS` ``window`` s (:data:`PACE_GAP_S` without one) is
    waited out as recorded, and logged; a frame more than :data:`PACE_JUMP_S` ahead of or behind
    the latest so far (a frame of strays only, a clock read as epoch zero) is released at once and
    the pacing starts again from it, logged: never a silent wait of years.
    """
    gap = PACE_GAP_WINDOWS * window if window else PACE_GAP_S
    start_wall = time.monotonic()
    start_ts: float | None = None
    latest = -np.inf
    told = 0
    for frame in frames:
        if stop is not None and stop.is_set():
            return
        ts0 = median_stamp(frame.ts) if speed and len(frame) else None
        if speed and ts0 is not None:
            ahead = ts0 - latest
            if start_ts is not None and (ahead > gap or -ahead > PACE_JUMP_S):  # (a frame a little late: the guard's)
                told += 1
                jump = abs(ahead) > PACE_JUMP_S
                if told <= TOLD_GAPS:
                    log.warning("paced replay: telemetry time jumps %+.0f s (from %.0f to %.0f)%s%s", ahead,
                                latest, ts0, ": not waited out, pacing goes on from this frame" if jump
                                else f": waiting it out at {speed:g}x", " (further jumps are not logged)"
                                if told == TOLD_GAPS else "")
                if jump:
                    start_ts = None
            if start_ts is None:
                start_ts, start_wall, latest = ts0, time.monotonic(), ts0
            latest = max(latest, ts0)
            due = (ts0 - start_ts) / speed - (time.monotonic() - start_wall)
            if due > 0:
                if stop is not None:
                    if stop.wait(due):
                        return
                else:
                    time.sleep(due)
        yield frame


class UnknownStartError(RecordingError):
    """A replay was asked to shift its timestamps to a time, but the recording's start is not known."""


def recorded_start(recording: Recording) -> float | None:
    """The time of a recording's first sample: ``recording.json``'s ``start``, else what the
    recording's files hold (no ``recording.json``: its recorder killed before writing it, or a
    copy without it). None where no stamp is finite.

    The stamps taken are those the replay's guard does not refuse as a clock not set (a first tick
    stamped 1970): no more than :data:`~foreshock.guard.MAX_BEHIND_S` before
    :attr:`~foreshock.recording.Recording.stream_anchor`. Shifted to now from such a stamp, the
    stream itself had been stamped decades in the future. A kind's earliest stamp comes from the
    Parquet statistics (no page read); where that is such a stray, from its first rows."""
    start = recording.meta.get("start")
    if isinstance(start, (int, float)) and not isinstance(start, bool) and np.isfinite(start):
        return float(start)
    anchor = recording.stream_anchor
    if not np.isfinite(anchor):
        return None
    earliest = []
    for kind in recording.kinds():
        lo = recording.stamps[kind][0] if kind in recording.stamps else None
        if lo is not None and anchor - lo <= MAX_BEHIND_S:
            earliest.append(lo)
            continue
        for frame in recording.iter_kind(kind):  # (file order is time order: the first such rows hold it)
            ts = frame.ts[np.isfinite(frame.ts) & (anchor - frame.ts <= MAX_BEHIND_S)]
            if len(ts):
                earliest.append(float(ts.min()))
                break
    return min(earliest, default=anchor)


class ReplaySource:
    """Replays a recording folder, optionally shifting timestamps so the replay starts now.

    ``shift_to`` (seconds since the epoch) moves every timestamp by the same offset, the
    recording's first sample (:func:`recorded_start`) to ``shift_to``: useful when the consumer
    (Prometheus, Alertmanager) compares telemetry time with its own clock. A recording whose start
    is not known is refused (:class:`UnknownStartError`) rather than replayed unshifted, its
    stamps years old to that consumer.
    """

    def __init__(self, path: str, speed: float | None = None, shift_to: float | None = None,
                 batch_rows: int = 65_536) -> None:
        self.recording = Recording.open(path)
        self.topology = self.recording.topology
        self.speed = speed
        self.batch_rows = batch_rows
        self.offset = 0.0
        if shift_to is not None:
            start = recorded_start(self.recording)
            if start is None:
                raise UnknownStartError(f"{self.recording.path}: no sample with a usable timestamp, so there is no "
                                        "start to shift to the current time")
            self.offset = shift_to - start
        self.stop = threading.Event()

    def __iter__(self) -> Iterator[Frame]:
        frames = self.recording.iter_frames(batch_rows=self.batch_rows)
        if self.offset:
            frames = (_shift(f, self.offset) for f in frames)
        return paced(frames, self.speed, self.stop, self.recording.interval)


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
