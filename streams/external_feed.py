"""External fault/alert events on their way into a running pipeline.

Schedulers, BMCs and existing alerting systems write JSON lines
(``{"node", "time", "type", "severity"}``, read by :mod:`foreshock.detectors.incident_external`).
Two live paths carry them to the incident engine's ``add_external``:

- the embedded pipeline (``foreshock replay/demo --external FILE``) *follows* a file like
  ``tail -F``: :class:`ExternalFeed` reads the lines already in it and those appended while the
  pipeline runs, and :func:`feed_before_frames` hands them to the incident processors before
  each frame after the first (the engine judges an event's date against the telemetry it has
  seen: before any, an event stamped in milliseconds was queued for good, never counted); the
  end of the run reads the file a last time, its unterminated last line included, and counts
  the events no frame came after;
- the Kafka workers read the ``external.events`` topic (``faust_app``); a record holds one or
  more lines and is decoded by :func:`parse_lines`.

An event is queued by the engine and grouped once telemetry time reaches its ``time``. Lines
that cannot be read are counted in the pipeline health (stage ``external``) — never fatal.
"""

from __future__ import annotations

import logging
import math
import os
import stat
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, NamedTuple, Protocol, Sequence, TypeVar

from foreshock.detectors.incident_external import NOT_JSON, STAGE, ExternalEvent, parse_line
from foreshock.health import PipelineHealth

log = logging.getLogger("foreshock.external")

REREAD = "external event file shrank or was replaced: read again from the start"
MISSING = "external event file is missing: waiting for it to reappear"
UNREADABLE = "external event file cannot be read"
TOO_LONG = "external event line is too long: skipped"
UNTERMINATED = "external event file ends in an unterminated line that is not complete JSON"
NO_FRAME_AFTER = "external event read with no frame after it to group it by: not handed to the incident engine"
MAX_LINE_BYTES = 1 << 20  # an event is ~100 bytes: a longer "line" is not one, and must not fill memory
READ_CHUNK_BYTES = 1 << 20  # a large append is read in pieces of this size, so memory stays bounded
TAIL_BYTES = 64  # the last bytes read, checked at each poll: a file truncated and grown past them since is told

T = TypeVar("T")


class ExternalTarget(Protocol):
    """What takes external events: the incident engine (``detectors.incidents``)."""

    def add_external(self, events: Iterable[ExternalEvent]) -> None: ...


def external_targets(processors: Sequence[object], required: bool = True) -> list[ExternalTarget]:
    """The processors that take external events; when none does, ``ValueError`` (the events
    would go nowhere) — or, not ``required``, an empty list."""
    targets = [p for p in processors if callable(getattr(p, "add_external", None))]
    if not targets and required:
        raise ValueError("external events need the incident engine, and the detector bank has no processor "
                         "that takes them")
    return targets  # type: ignore[return-value]


class BadLine(NamedTuple):
    position: int  # among the lines given (0-based)
    raw: bytes
    reason: str
    detail: str


def parse_lines(lines: Iterable[bytes], latest: float = math.inf,
                now: float = 0.0) -> tuple[list[ExternalEvent], list[BadLine]]:
    """Events from JSON lines, and the lines that could not be read. Blank lines are skipped.
    The caller counts (and, on Kafka, dead-letters) the bad ones. ``latest``: an event dated
    later is refused (``future_timestamp``, said against ``now``): the incident engine holds an
    event until telemetry reaches its time, so one dated in milliseconds, or by a clock far
    ahead, would be held for good, and enough of them fill its queue."""
    events: list[ExternalEvent] = []
    bad: list[BadLine] = []
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        event, reason, detail = parse_line(raw)
        if event is None:
            bad.append(BadLine(index, raw, reason, detail))
        elif event.time > latest:
            bad.append(BadLine(index, raw, "future_timestamp",
                               f"time {event.time:.0f} is {event.time - now:.0f} s ahead of this host's clock "
                               "(seconds since the epoch expected)"))
        else:
            events.append(event)
    return events, bad


class ExternalFeed:
    """Follows a JSON-lines file: every :meth:`poll` returns the events of the complete lines
    written since the last one (a partial last line waits for its newline: a writer may be
    mid-line); :meth:`final_poll`, at the end of a run, reads that last line too.

    Cheap enough to call before every frame: one ``stat``, and a read only when the file changed.
    A file that shrank (truncated), was replaced (rotated: another inode) or no longer holds the
    bytes last read where they were (truncated in place and written past that point again since,
    as with ``logrotate copytruncate``) is read again from its start, and that is counted; lines
    appended to a rotated-away file after the last poll are not seen (as with ``tail -F``). A file
    that disappears is waited for. One that is there but cannot be read (its mode after a
    rotation, a directory, a pipe) is counted once, until it can be read or is another file, or
    fails another way: not at every frame.
    """

    def __init__(self, path: str | Path, health: PipelineHealth | None = None) -> None:
        self.path = Path(path)
        self.health = health or PipelineHealth()
        self.offset = 0  # bytes of the file consumed (complete lines and the partial tail)
        self.partial = b""  # the last line, still without its newline
        self.lineno = 0  # complete lines read from the current file
        self.inode: tuple[int, int] | None = None
        self.tail = b""  # the last bytes consumed (up to TAIL_BYTES): still there if the file was only appended to
        self.mtime_ns: int | None = None  # the file's modification time when it was last read
        self.events = 0  # events read, in all
        self.bad = 0  # lines that could not be read, in all
        self.not_handed = 0  # events read that no frame came after (count_not_handed)
        self._missing = False
        # (inode, errno or why) last counted as unreadable
        self._unreadable: tuple[tuple[int, int] | None, int | str | None] | None = None
        self._skipping = False  # inside an overlong line: drop up to its newline

    def poll(self) -> list[ExternalEvent]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if not self._missing:
                self._missing = True
                self.health.problem(STAGE, MISSING, detail=str(self.path))
            return []
        except OSError as exc:
            self._cannot_read(None, exc.errno, str(exc))
            return []
        self._missing = False
        inode = (st.st_dev, st.st_ino)
        if self.inode is not None and (inode != self.inode or st.st_size < self.offset):
            self._read_again()
        self.inode = inode
        if not stat.S_ISREG(st.st_mode):
            # a pipe has no size to follow, and opening one waits for a writer: the run would hang
            self._cannot_read(inode, "not a regular file", "not a regular file")
            return []
        if st.st_size == self.offset and st.st_mtime_ns == self.mtime_ns:
            return []  # not written since it was last read
        events: list[ExternalEvent] = []
        try:
            with open(self.path, "rb") as fh:
                if not self._tail_still_there(fh):
                    self._read_again()
                fh.seek(self.offset)
                while self.offset < st.st_size:  # not past the size seen: a writer may be mid-line
                    data = fh.read(min(READ_CHUNK_BYTES, st.st_size - self.offset))
                    if not data:
                        break
                    self.offset += len(data)
                    self.tail = (self.tail + data)[-TAIL_BYTES:]
                    events.extend(self._take(data))
        except OSError as exc:
            self._cannot_read(inode, exc.errno, str(exc))
            return events
        self.mtime_ns = st.st_mtime_ns
        self._unreadable = None
        return events

    def final_poll(self) -> list[ExternalEvent]:
        """:meth:`poll` at the end of a run, when no writer will finish the last line: a last line
        without its newline (``echo -n``, JSON written without one) is a line now, read if it is
        complete JSON, else counted (``UNTERMINATED``). Bytes appended to it later would be read
        by another poll as a line of their own."""
        events = self.poll()
        if self._skipping:  # an overlong last line: counted when it became one
            self._skipping = False
            self.lineno += 1
        elif self.partial:
            last, self.partial = self.partial, b""
            self.lineno += 1
            events += self._parse([last], self.lineno, unterminated=True)
        return events

    def count_not_handed(self, events: Sequence[ExternalEvent]) -> None:
        """Count ``events``, read but never handed to the incident engine (no frame came after
        them for it to group them by), rather than drop them unsaid."""
        if events:
            self.not_handed += len(events)
            first = events[0]
            self.health.problem(STAGE, NO_FRAME_AFTER, count=len(events),
                                detail=f"{self.path}: {first.type} on {first.node} at {first.time:.0f}")

    def _read_again(self) -> None:
        self.health.problem(STAGE, REREAD, detail=str(self.path))
        self.offset, self.partial, self.lineno, self._skipping, self.tail = 0, b"", 0, False, b""

    def _tail_still_there(self, fh: BinaryIO) -> bool:
        """Whether the bytes last read are still where they were read: a file truncated in place
        and written past that point again before this poll is as long as the offset, or longer,
        and read on from there it would be read from the middle of a line, its start lost."""
        if not self.tail:
            return True
        fh.seek(self.offset - len(self.tail))
        return fh.read(len(self.tail)) == self.tail

    def _cannot_read(self, inode: tuple[int, int] | None, cause: int | str | None, detail: str) -> None:
        """Count a failure to read the file once per file and cause: poll() runs before every
        frame, and a file this process may not open counted 1,000 problems in 1,000 frames."""
        key = (inode, cause)
        if key != self._unreadable:
            self._unreadable = key
            self.health.problem(STAGE, UNREADABLE, detail=f"{self.path}: {detail}")

    def _take(self, data: bytes) -> list[ExternalEvent]:
        """The events of the lines that ``data`` completes; the rest waits in :attr:`partial`."""
        if self._skipping:  # the rest of an overlong line, counted once: dropped, never buffered
            end = data.find(b"\n")
            if end < 0:
                return []
            self._skipping = False
            self.lineno += 1
            data = data[end + 1:]
        *lines, self.partial = (self.partial + data).split(b"\n")
        first = self.lineno + 1
        self.lineno += len(lines)
        for i, raw in enumerate(lines):  # a whole line that arrived in one piece, but too long
            if len(raw) > MAX_LINE_BYTES:
                self.health.problem(STAGE, TOO_LONG, detail=f"{self.path}:{first + i}")
                lines[i] = b""
                self.bad += 1
        if len(self.partial) > MAX_LINE_BYTES:
            self.health.problem(STAGE, TOO_LONG, detail=f"{self.path}:{self.lineno + 1}")
            self.partial, self._skipping = b"", True
            self.bad += 1
        return self._parse(lines, first)

    def _parse(self, lines: list[bytes], first: int, unterminated: bool = False) -> list[ExternalEvent]:
        """The events of ``lines`` (the first is line ``first`` of the file); the bad ones counted.
        ``unterminated``: the file's last line, without its newline, where invalid JSON most
        likely means a writer stopped mid-line."""
        events, bad = parse_lines(lines)
        for line in bad:
            reason = UNTERMINATED if unterminated and line.reason == NOT_JSON else line.reason
            self.health.problem(STAGE, reason, detail=f"{self.path}:{first + line.position}: {line.detail}")
        self.events += len(events)
        self.bad += len(bad)
        return events


def feed_before_frames(frames: Iterable[T], feed: ExternalFeed, targets: Sequence[ExternalTarget]) -> Iterator[T]:
    """``frames``, handing the feed's new events to ``targets`` before each frame after the first
    is processed. The first frame goes first: an incident engine refuses an event dated too far
    past the telemetry it has seen, and before any it has nothing to judge by, so the events
    already in the file at the start (one stamped in milliseconds among them) were taken
    unjudged and such an event held for good, never counted. The file is read before the first
    frame all the same, its events held until after it.

    When the frames end (a replay's last one, a live run stopped) the file is read a last time
    (:meth:`ExternalFeed.final_poll`, its unterminated last line included). The events read
    since the last frame, all of them in a run of one frame, have no telemetry after them to be
    grouped by: they are counted (``NO_FRAME_AFTER``), not handed over to wait for good."""
    waiting = feed.poll()
    first = True
    for frame in frames:
        if not first:
            waiting += feed.poll()
            if waiting:
                for target in targets:
                    target.add_external(waiting)
            waiting = []
        first = False
        yield frame
    feed.count_not_handed(waiting + feed.final_poll())
