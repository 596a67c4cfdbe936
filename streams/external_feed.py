"""External fault/alert events on their way into a running pipeline.

Schedulers, BMCs and existing alerting systems write JSON lines
(``{"node", "time", "type", "severity"}``, read by :mod:`foreshock.detectors.incident_external`).
Two live paths carry them to the incident engine's ``add_external``:

- the embedded pipeline (``foreshock replay/demo --external FILE``) *follows* a file like
  ``tail -F``: :class:`ExternalFeed` reads the lines already in it and those appended while the
  pipeline runs, and :func:`feed_before_frames` hands them to the incident processors before
  each frame once the engine has telemetry time (it judges an event's date against the
  telemetry it has seen: before any, an event stamped in milliseconds was queued for good,
  never counted); the end of the run reads the file a last time and counts the events no
  telemetry came after, and those the engine still holds queued, dated after its last telemetry;
- the Kafka workers read the ``external.events`` topic (``faust_app``); a record holds one or
  more lines and is decoded by :func:`parse_lines`.

An event is queued by the engine and grouped once telemetry time reaches its ``time``. Lines
that cannot be read are counted in the pipeline health (stage ``external``) — never fatal.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import stat
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, NamedTuple, Protocol, Sequence, TypeVar

from foreshock.detectors.incident_external import STAGE, ExternalEvent, parse_line
from foreshock.health import PipelineHealth

log = logging.getLogger("foreshock.external")

REREAD = "external event file shrank or was replaced: read again from the start"
MISSING = "external event file is missing: waiting for it to reappear"
UNREADABLE = "external event file cannot be read"
TOO_LONG = "external event line is too long: skipped"
# not a bad line: a writer mid-line when the run stopped (counted, not in the bad lines)
UNFINISHED = "external event line still being written when the run ended: not read"
NO_FRAME_AFTER = "external event read with no telemetry after it to group it by: not handed to the incident engine"
STILL_QUEUED = "external event dated after the run's last telemetry: still queued by the incident engine, never grouped"
HELD_OVER = ("external event held until telemetry time reaches it (or the incident engine has any), "
             "past the most held: not handed over")
MAX_HELD_EVENTS = 100_000  # the incident engine's own queue length (max_external_queue): memory stays bounded
HOLD_AHEAD_S = 7 * 86400.0
"""An event dated further past the telemetry than the engine takes (``max_external_ahead_s``) is held
until telemetry comes near it, up to this far: a replay reads its whole file at its first frame.
Further still (a clock in milliseconds is decades ahead), it is handed over for the engine to
refuse and count."""
MAX_LINE_BYTES = 1 << 20  # an event is ~100 bytes: a longer "line" is not one, and must not fill memory
READ_CHUNK_BYTES = 1 << 20  # a large append is read in pieces of this size, so memory stays bounded
TAIL_BYTES = 64  # the first and last bytes read, checked at each read: a file truncated and grown past them is told

T = TypeVar("T")


class ExternalTarget(Protocol):
    """What takes external events: the incident engine (``detectors.incidents``). Where it has
    them, :func:`feed_before_frames` reads its ``latest_now`` (the latest telemetry time it has
    seen, ``-inf`` before any) and ``queued_external()`` (the events it holds until telemetry
    reaches their time)."""

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
    """Follows a JSON-lines file: every :meth:`poll` returns the events of the lines written
    since the last one. A last line without its newline is read when it is a complete JSON event
    (no proper prefix of a one-line JSON object is one: a writer mid-line gives none), and not
    again when its newline comes; else it waits for its newline. :meth:`final_poll`, at the end of
    a run, judges what is left of it: complete JSON that is no event is a bad line, anything else
    a line still being written (``UNFINISHED``, not a bad line).

    Cheap enough to call before every frame: one ``stat``, and a read only when the file changed
    (size, modification or status-change time: a rewrite that put the modification time back, as
    ``cp -p`` or ``touch -r`` do, still changes the latter). A file that shrank (truncated), was
    replaced (rotated: another inode) or no longer holds the first or the last bytes read where
    they were (truncated in place and written past that point again since, as with ``logrotate
    copytruncate``) is read again from its start, and that is counted; lines
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
        self.partial_taken = 0  # bytes of :attr:`partial` already read as an event (0: none)
        self.lineno = 0  # complete lines read from the current file
        self.inode: tuple[int, int] | None = None
        # the first and the last bytes consumed (up to TAIL_BYTES each): still there if the file was only appended to
        self.head = b""
        self.tail = b""
        # the file's modification and status-change times when it was last read
        self.times_ns: tuple[int, int] | None = None
        self.events = 0  # events read, in all
        self.bad = 0  # lines that could not be read, in all
        self.unfinished = 0  # last lines still being written when the run ended (not bad lines)
        self.not_handed = 0  # events read that no telemetry came after (count_not_handed)
        self.still_queued = 0  # events the engine still held at the end of the run (count_still_queued)
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
        times = (st.st_mtime_ns, st.st_ctime_ns)
        if st.st_size == self.offset and times == self.times_ns:
            return []  # not written since it was last read
        events: list[ExternalEvent] = []
        try:
            with open(self.path, "rb") as fh:
                if not self._still_there(fh):
                    self._read_again()
                fh.seek(self.offset)
                while self.offset < st.st_size:  # not past the size seen: a writer may be mid-line
                    data = fh.read(min(READ_CHUNK_BYTES, st.st_size - self.offset))
                    if not data:
                        break
                    self.offset += len(data)
                    if len(self.head) < TAIL_BYTES:
                        self.head = (self.head + data)[:TAIL_BYTES]
                    self.tail = (self.tail + data)[-TAIL_BYTES:]
                    events.extend(self._take(data))
        except OSError as exc:
            self._cannot_read(inode, exc.errno, str(exc))
            return events
        events.extend(self._take_partial())
        self.times_ns = times
        self._unreadable = None
        return events

    def final_poll(self) -> list[ExternalEvent]:
        """:meth:`poll` at the end of a run, when no writer will finish the last line. A last line
        without its newline that is a complete event was read by the poll (``echo -n``, JSON
        written without one); one that is complete JSON but no event is a bad line now; one that
        is not complete JSON was still being written: counted (``UNFINISHED``), not as a bad line,
        the file being fine. Bytes appended to it later would be read by another poll as a line of
        their own."""
        events = self.poll()
        if self._skipping:  # an overlong last line: counted when it became one
            self._skipping = False
            self.lineno += 1
        elif self.partial:
            last, taken = self.partial, self.partial_taken
            self.partial, self.partial_taken = b"", 0
            self.lineno += 1
            if taken and not last[taken:].strip():
                pass  # its event read already, and nothing after it
            elif not taken and not _complete_json(last):
                self.unfinished += 1
                self.health.problem(STAGE, UNFINISHED, detail=f"{self.path}:{self.lineno}: {len(last)} bytes")
            else:  # complete JSON that is no event, or an event the line went on past: a bad line
                events += self._parse([last], self.lineno)
        return events

    def count_not_handed(self, events: Sequence[ExternalEvent], why: str = NO_FRAME_AFTER) -> None:
        """Count ``events``, read but never handed to the incident engine, under ``why``, rather
        than drop them unsaid: no telemetry came after them for it to group them by
        (``NO_FRAME_AFTER``), or they were held past :data:`MAX_HELD_EVENTS` (``HELD_OVER``: frames
        with no usable time as a file keeps growing, or a file of events dated ahead of the telemetry)."""
        if events:
            self.not_handed += len(events)
            first = events[0]
            self.health.problem(STAGE, why, count=len(events),
                                detail=f"{self.path}: {first.type} on {first.node} at {first.time:.0f}")

    def count_still_queued(self, targets: Sequence[object]) -> None:
        """Count the events the targets still hold queued at the end of the run: handed over, but
        dated after the last telemetry time, so never grouped. (Two targets hold the same events:
        the larger count, not the sum.)"""
        held = [(queued(), getattr(t, "latest_now", math.nan)) for t in targets
                if callable(queued := getattr(t, "queued_external", None))]
        count, latest = max(held, default=(0, math.nan))
        if count > 0:
            self.still_queued += count
            self.health.problem(STAGE, STILL_QUEUED, count=count,
                                detail=f"{self.path}: telemetry ended at {latest:.0f}")

    def _read_again(self) -> None:
        self.health.problem(STAGE, REREAD, detail=str(self.path))
        self.offset, self.partial, self.partial_taken, self.lineno = 0, b"", 0, 0
        self._skipping, self.head, self.tail = False, b"", b""

    def _still_there(self, fh: BinaryIO) -> bool:
        """Whether the first and the last bytes read are still where they were read: a file
        truncated in place and written past that point again before this poll is as long as the
        offset, or longer, and read on from there it would be read from the middle of a line, its
        start lost. The last bytes alone miss a file of repeated fixed-width lines (the same
        alert each minute, its time first): the new file's bytes at that place can be the old
        ones. The first bytes tell it, unless the new file starts as the old one did."""
        if not self.tail:
            return True
        fh.seek(0)
        if fh.read(len(self.head)) != self.head:
            return False
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
        taken = self.partial_taken
        *lines, self.partial = (self.partial + data).split(b"\n")
        if lines and taken:
            # the line whose event was read before its newline came: not read twice. Only
            # whitespace may follow the event; anything else makes the whole line bad (counted once).
            self.partial_taken = 0
            if not lines[0][taken:].strip():
                lines[0] = b""
        first = self.lineno + 1
        self.lineno += len(lines)
        for i, raw in enumerate(lines):  # a whole line that arrived in one piece, but too long
            if len(raw) > MAX_LINE_BYTES:
                self.health.problem(STAGE, TOO_LONG, detail=f"{self.path}:{first + i}")
                lines[i] = b""
                self.bad += 1
        if len(self.partial) > MAX_LINE_BYTES:
            self.health.problem(STAGE, TOO_LONG, detail=f"{self.path}:{self.lineno + 1}")
            self.partial, self.partial_taken, self._skipping = b"", 0, True
            self.bad += 1
        return self._parse(lines, first)

    def _take_partial(self) -> list[ExternalEvent]:
        """The event of the last line before its newline came, when it is a complete one: a
        replay's file that ends without a newline had its last event read only after the last
        frame, never grouped. Read once (:attr:`partial_taken`); a line that is not (yet) an event
        waits for its newline, or the end of the run."""
        if not self.partial or self.partial_taken or not self.partial.rstrip().endswith(b"}"):
            return []
        event, _, _ = parse_line(self.partial)
        if event is None:
            return []
        self.partial_taken = len(self.partial)
        self.events += 1
        return [event]

    def _parse(self, lines: list[bytes], first: int) -> list[ExternalEvent]:
        """The events of ``lines`` (the first is line ``first`` of the file); the bad ones counted."""
        events, bad = parse_lines(lines)
        for line in bad:
            self.health.problem(STAGE, line.reason, detail=f"{self.path}:{first + line.position}: {line.detail}")
        self.events += len(events)
        self.bad += len(bad)
        return events


def _complete_json(raw: bytes) -> bool:
    """Whether ``raw`` is one complete JSON value (bytes that are not UTF-8 replaced: a line cut in
    the middle of a character is judged by the JSON before it)."""
    try:
        json.loads(raw.decode("utf-8-sig", "replace"))
    except (ValueError, RecursionError):
        return False
    return True


def _has_telemetry(target: object, frame_seen: bool) -> bool:
    """Whether ``target`` can judge an event's date: the incident engine once it has seen a
    telemetry time (``latest_now``; a frame whose stamps were all refused gave it none, and an
    event in milliseconds handed then was queued for good), another target once a frame went by."""
    latest = getattr(target, "latest_now", None)
    if isinstance(latest, (int, float)):
        return latest > -math.inf
    return frame_seen


def feed_before_frames(frames: Iterable[T], feed: ExternalFeed, targets: Sequence[ExternalTarget]) -> Iterator[T]:
    """``frames``, handing the feed's new events to ``targets`` before each frame, once every
    target has telemetry time to judge their dates by (:func:`_has_telemetry`). An incident
    engine refuses an event dated too far past the telemetry it has seen, and before any it has
    nothing to judge by: the events already in the file at the start (one stamped in
    milliseconds among them) were taken unjudged and such an event held for good, never counted.
    Waiting one frame was not enough: a first frame with no usable timestamp (a clock not set)
    gives the engine no time. The file is read all the same, its events held until then. An event
    dated past what the engine takes ahead of its telemetry (``max_external_ahead_s``) is held too,
    until the telemetry comes that near (:data:`HOLD_AHEAD_S`): a replay reads the whole file at its
    first frame, and the engine had refused every event dated more than 15 minutes into the
    recording. At most :data:`MAX_HELD_EVENTS` are held, the earliest dated; the others are counted
    (``HELD_OVER``).

    When the frames end (a replay's last one, a live run stopped) the file is read a last time
    (:meth:`ExternalFeed.final_poll`). The events read since the last frame, and those still held
    (all of them in a run of one frame, or of frames with no usable time), have no telemetry after
    them to be grouped by: they are counted (``NO_FRAME_AFTER``), not handed over to wait for good.
    The events handed over that the engine still holds, dated after its last telemetry, are
    counted too (``STILL_QUEUED``). The engine is not flushed here: its findings at the end of a
    run are the pipeline's business, and a live run's queue is as it was when it stopped."""
    held: list[ExternalEvent] = []  # by date
    frame_seen = False
    for frame in frames:
        read = feed.poll()  # (before the first frame too: the file's lines so far)
        if read:
            held += read
            held.sort(key=_event_time)  # (a run of already sorted lines: linear)
        if held and all(_has_telemetry(target, frame_seen) for target in targets):
            reach = _reach(targets)
            due = bisect.bisect_right(held, reach, key=_event_time)
            far = bisect.bisect_right(held, reach + HOLD_AHEAD_S, key=_event_time)
            handed = held[:due] + held[far:]  # (beyond HOLD_AHEAD_S: the engine refuses and counts them)
            if handed:
                for target in targets:
                    target.add_external(handed)
                held = held[due:far]
        if len(held) > MAX_HELD_EVENTS:  # the earliest dated are kept, as the engine's full queue keeps its
            feed.count_not_handed(held[MAX_HELD_EVENTS:], HELD_OVER)
            del held[MAX_HELD_EVENTS:]
        frame_seen = True
        yield frame
    feed.count_not_handed(held + feed.final_poll())
    feed.count_still_queued(targets)


def _event_time(event: ExternalEvent) -> float:
    return event.time


def _reach(targets: Sequence[ExternalTarget]) -> float:
    """The latest date every target takes an event of now: its telemetry time plus how far ahead of
    it an event may be (``latest_now``, ``max_external_ahead_s``); unbounded for a target without."""
    reach = math.inf
    for target in targets:
        latest, ahead = getattr(target, "latest_now", None), getattr(target, "max_external_ahead_s", None)
        if isinstance(latest, (int, float)) and isinstance(ahead, (int, float)):
            reach = min(reach, latest + ahead)
    return reach
