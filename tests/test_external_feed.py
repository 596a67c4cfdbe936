"""External events on the live path: the followed file (streams/external_feed.py) and
`foreshock replay/demo --external FILE` grouping them into incidents."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.detectors.incident_external import MALFORMED, NOT_JSON, ExternalEvent
from foreshock.health import PipelineHealth
from foreshock.streams import external_feed
from foreshock.streams.external_feed import (HELD_OVER, MAX_LINE_BYTES, MISSING, NO_FRAME_AFTER, REREAD, STAGE, STILL_QUEUED,
                                             TOO_LONG, UNFINISHED, UNREADABLE, ExternalFeed, external_targets,
                                             feed_before_frames, parse_lines)


def line(node: str, t: float, typ: str = "fan_failure", severity: str = "critical") -> str:
    return json.dumps({"node": node, "time": t, "type": typ, "severity": severity}) + "\n"


def append(path: Path, text: str | bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(text.encode() if isinstance(text, str) else text)


# ---- parsing --------------------------------------------------------------------------------
def follow(tmp_path: Path, text: str) -> tuple[Path, PipelineHealth, ExternalFeed]:
    """``ext.jsonl`` holding ``text``, and a follower of it counting problems in a health of its own."""
    path = tmp_path / "ext.jsonl"
    path.write_text(text)
    health = PipelineHealth()
    return path, health, ExternalFeed(path, health)


def test_parse_lines_keeps_good_events_and_names_each_bad_line():
    lines = [line("node1", 5.0).encode(), b"", b"  ", b"{not json", b'{"node": "n", "time": 1}', b'{"node": "\xff"}',
             b'{"node": "node2", "time": "1970-01-01T00:00:10Z", "type": "psu"}']
    events, bad = parse_lines(lines)
    assert events == [ExternalEvent("node1", 5.0, "fan_failure", "critical"), ExternalEvent("node2", 10.0, "psu")]
    assert [(b.position, b.raw, b.reason) for b in bad] == [(3, b"{not json", NOT_JSON),
                                                            (4, b'{"node": "n", "time": 1}', MALFORMED),
                                                            (5, b'{"node": "\xff"}', MALFORMED)]  # not UTF-8
    assert "missing" in bad[1].detail


# ---- following a file -----------------------------------------------------------------------
def test_an_event_dated_far_ahead_is_refused_where_a_limit_is_given():
    """The incident engine holds an event until telemetry reaches its time: one dated in
    milliseconds (year 55,000) was held for good, and 100,000 of them filled the queue so that
    valid events were dropped. The Kafka worker refuses events further ahead of its clock than
    --max-clock-ahead."""
    now = 1_800_000_000.0
    lines = [json.dumps({"node": "node1", "time": t, "type": "xid"}).encode()
             for t in (now - 60, now + 600, now * 1000)]
    events, bad = parse_lines(lines, now + 900, now)
    assert [e.time for e in events] == [now - 60, now + 600]
    assert [(b.position, b.reason) for b in bad] == [(2, "future_timestamp")]
    assert "seconds since the epoch expected" in bad[0].detail
    assert len(parse_lines(lines)[0]) == 3  # no limit: a replay's external file is in its own time


def test_follower_reads_existing_then_appended_lines_once(tmp_path: Path):
    path, health, feed = follow(tmp_path, line("node0", 1.0) + line("node1", 2.0))
    assert [e.node for e in feed.poll()] == ["node0", "node1"]
    assert feed.poll() == []  # nothing new: nothing read again
    append(path, line("node2", 3.0))
    assert [e.node for e in feed.poll()] == ["node2"]
    assert feed.events == 3 and feed.offset == path.stat().st_size
    assert health.total_problems() == 0


def test_a_partial_last_line_waits_for_its_newline(tmp_path: Path):
    path = tmp_path / "ext.jsonl"
    path.write_text("")
    feed = ExternalFeed(path)
    whole = line("node3", 7.0)
    append(path, whole[:10])
    assert feed.poll() == []
    append(path, whole[10:-2])  # all but the closing brace and the newline: still incomplete
    assert feed.poll() == []
    append(path, whole[-2:] + whole[:5])
    assert feed.poll() == [ExternalEvent("node3", 7.0, "fan_failure", "critical")]
    append(path, whole[5:])
    assert [e.time for e in feed.poll()] == [7.0]
    assert feed.health.total_problems() == 0  # no half line was ever parsed


def test_a_last_line_that_is_a_complete_event_is_read_before_its_newline_and_once(tmp_path: Path):
    """A replay's file ending without a newline had its last event read only after the last frame:
    never grouped, even dated inside the telemetry. No proper prefix of a one-line JSON object is
    one, so a complete event is a whole line; its newline, when it comes, reads nothing again."""
    path, health, feed = follow(tmp_path, line("node0", 1.0) + line("node1", 2.0)[:-1])
    assert [e.node for e in feed.poll()] == ["node0", "node1"]
    assert feed.poll() == []
    append(path, "  \r\n")  # (whitespace may end a JSON line)
    assert feed.poll() == []
    append(path, line("node2", 3.0))
    assert [e.node for e in feed.poll()] == ["node2"]
    assert feed.final_poll() == []
    assert feed.events == 3 and feed.lineno == 3 and health.total_problems() == 0


def test_a_line_that_goes_on_past_an_event_read_early_is_one_bad_line(tmp_path: Path):
    path, health, feed = follow(tmp_path, line("node0", 1.0)[:-1])
    assert [e.node for e in feed.poll()] == ["node0"]
    append(path, "garbage")
    assert feed.poll() == []  # (not read again, nor judged before its newline)
    append(path, "\n" + line("node1", 2.0))
    assert [e.node for e in feed.poll()] == ["node1"]
    assert health.problems == {(STAGE, NOT_JSON): 1} and feed.bad == 1 and feed.lineno == 2


def test_bad_lines_are_counted_with_their_line_number(tmp_path: Path):
    path, health, feed = follow(tmp_path, line("node0", 1.0) + "oops\n")
    assert len(feed.poll()) == 1
    append(path, '{"node": "node1"}\n' + line("node1", 2.0))
    assert len(feed.poll()) == 1
    assert health.problems[(STAGE, NOT_JSON)] == 1 and health.problems[(STAGE, MALFORMED)] == 1
    assert feed.bad == 2


def test_a_truncated_file_is_read_again_from_the_start_and_counted(tmp_path: Path):
    path, health, feed = follow(tmp_path, line("node0", 1.0) + line("node1", 2.0) + '{"partial": ')
    assert len(feed.poll()) == 2
    path.write_text(line("node5", 9.0))  # truncated and rewritten, shorter than before (same inode)
    assert [e.node for e in feed.poll()] == ["node5"]  # the old partial line is not glued to it
    assert health.problems[(STAGE, REREAD)] == 1
    assert feed.poll() == []


def test_a_replaced_file_is_read_from_its_start_even_when_longer(tmp_path: Path):
    path, health, feed = follow(tmp_path, line("node0", 1.0))
    assert len(feed.poll()) == 1
    os.rename(path, tmp_path / "ext.jsonl.1")  # rotated: a new file (inode) takes the name
    assert feed.poll() == [] and health.problems[(STAGE, MISSING)] == 1
    assert feed.poll() == [] and health.problems[(STAGE, MISSING)] == 1  # counted once per absence
    path.write_text(line("node1", 2.0) + line("node2", 3.0))
    assert [e.node for e in feed.poll()] == ["node1", "node2"]
    assert health.problems[(STAGE, REREAD)] == 1


def test_an_endless_line_is_dropped_not_kept_in_memory(tmp_path: Path):
    path, health, feed = follow(tmp_path, line("node0", 1.0))
    assert len(feed.poll()) == 1
    append(path, b"x" * (MAX_LINE_BYTES + 1))
    assert feed.poll() == [] and feed.partial == b""
    append(path, b"still the same line")
    assert feed.poll() == [] and feed.partial == b""  # the rest of a line already counted is not kept
    append(path, b"\n" + line("node1", 2.0).encode())  # the long line ends; the next one is read
    assert [e.node for e in feed.poll()] == ["node1"]
    assert health.problems[(STAGE, TOO_LONG)] == 1 and health.total_problems() == 1


def test_a_whole_overlong_line_in_one_read_is_skipped_unparsed(tmp_path: Path, monkeypatch):
    # the line and its newline arrive together: it never sits in the partial buffer
    path, health, feed = follow(tmp_path, line("node0", 1.0))
    append(path, b'{"node": "' + b"n" * MAX_LINE_BYTES + b'"}\n' + line("node1", 2.0).encode())
    parsed: list[bytes] = []
    real = external_feed.parse_line
    monkeypatch.setattr(external_feed, "parse_line", lambda raw: parsed.append(raw) or real(raw))
    assert [e.node for e in feed.poll()] == ["node0", "node1"]
    assert all(len(raw) < 1000 for raw in parsed)  # the long line was never handed to the JSON parser
    assert health.problems[(STAGE, TOO_LONG)] == 1 and health.total_problems() == 1
    assert feed.bad == 1 and feed.lineno == 3


def test_an_overlong_line_is_counted_once_however_it_arrives(tmp_path: Path, monkeypatch):
    """Skipping a long line kept buffering its rest, which was counted again each time it passed
    the limit: one 5 MiB line counted twice, one line growing by 300 KiB a poll ten times."""
    monkeypatch.setattr(external_feed, "MAX_LINE_BYTES", 100)
    monkeypatch.setattr(external_feed, "READ_CHUNK_BYTES", 64)
    path, health, feed = follow(tmp_path, '{"msg": "' + "x" * 500 + '"}\n' + line("node0", 1.0))
    assert [e.node for e in feed.poll()] == ["node0"]  # read in pieces: the line passes the limit in several
    assert health.problems[(STAGE, TOO_LONG)] == 1 and feed.bad == 1 and feed.lineno == 2
    for _ in range(20):  # a writer stuck without newlines, seen poll after poll
        append(path, b"y" * 30)
        assert feed.poll() == [] and len(feed.partial) <= 100
    append(path, "\n" + line("node1", 2.0))
    assert [e.node for e in feed.poll()] == ["node1"]
    assert health.problems[(STAGE, TOO_LONG)] == 2 and feed.bad == 2 and feed.lineno == 4


def test_a_file_truncated_in_place_and_regrown_past_the_offset_is_read_again(tmp_path: Path):
    """logrotate copytruncate: the file is emptied in place and its writer appends on; by the next
    poll it may be as long as what was read, or longer, and read on from the old offset the new
    lines were cut in the middle and the first ones lost, unsaid."""
    path, health, feed = follow(tmp_path, line("node0", 1.0) + line("node1", 2.0))
    assert len(feed.poll()) == 2
    with open(path, "r+b") as fh:
        fh.truncate(0)
    append(path, "".join(line(f"new{i}", 10.0 + i) for i in range(5)))
    assert [e.node for e in feed.poll()] == [f"new{i}" for i in range(5)]
    assert health.problems[(STAGE, REREAD)] == 1 and health.total_problems() == 1


def test_a_file_rewritten_to_the_same_size_is_read_again(tmp_path: Path):
    path, health, feed = follow(tmp_path, line("node0", 1.0))
    assert len(feed.poll()) == 1
    path.write_text(line("node9", 1.0))  # as long as before: only its contents and time tell
    later = path.stat().st_mtime_ns + 1_000_000_000  # (a clock coarser than the test must not hide it)
    os.utime(path, ns=(later, later))
    assert [e.node for e in feed.poll()] == ["node9"]
    assert health.problems[(STAGE, REREAD)] == 1
    assert feed.poll() == []


def test_a_rewrite_that_puts_the_modification_time_back_is_read_again(tmp_path: Path):
    """``cp -p`` or ``touch -r``: the same size and modification time, other lines. The
    status-change time moves all the same."""
    path, health, feed = follow(tmp_path, line("node1", 1.0) + line("node2", 2.0))
    assert len(feed.poll()) == 2
    before = path.stat()
    time.sleep(0.01)  # (a status-change time a coarse clock would not move)
    with open(path, "r+b") as fh:
        fh.truncate(0)
        fh.write((line("node7", 3.0) + line("node8", 4.0)).encode())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns and path.stat().st_size == before.st_size
    assert [e.node for e in feed.poll()] == ["node7", "node8"]
    assert health.problems == {(STAGE, REREAD): 1}


def test_a_copy_truncate_of_repeated_fixed_width_lines_is_told_by_the_first_bytes(tmp_path: Path):
    """The same alert each minute, its time first: after a copy-truncate the file regrown past the
    old offset held the old last 64 bytes at the same place, and the new lines before were lost."""
    def iso(node: str, t: float) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
        return json.dumps({"time": stamp, "node": node, "type": "xid", "severity": "critical"}) + "\n"

    old = "".join(iso("node3", 1_700_000_000 + 60 * i) for i in range(3))
    path, health, feed = follow(tmp_path, old)
    assert len(feed.poll()) == 3
    new = "".join(iso(node, 1_700_003_600 + 60 * i) for i, node in enumerate(["node5", "node6", "node3", "node3"]))
    assert new.encode()[len(old) - 64:len(old)] == old.encode()[-64:]  # the last bytes read are still there
    with open(path, "r+b") as fh:
        fh.truncate(0)
        fh.write(new.encode())
    assert [e.node for e in feed.poll()] == ["node5", "node6", "node3", "node3"]
    assert health.problems == {(STAGE, REREAD): 1}


def test_a_pipe_is_counted_once_as_unreadable_and_never_waited_on(tmp_path: Path):
    """A pipe has no size: it was never read and nothing said so. Opening it would wait for a writer."""
    path = tmp_path / "events.fifo"
    os.mkfifo(path)
    health = PipelineHealth()
    feed = ExternalFeed(path, health)
    for _ in range(5):
        assert feed.poll() == []  # (returns at once: open() on a pipe without a writer would block)
    assert feed.final_poll() == []
    assert health.problems == {(STAGE, UNREADABLE): 1}


def test_the_final_poll_reads_an_unterminated_last_line(tmp_path: Path):
    """``echo -n``, or JSON written without a final newline: the last event waited for a newline
    that never came, through the whole run, and was neither read nor counted."""
    path, health, feed = follow(tmp_path, "")
    path.write_bytes(b"\xef\xbb\xbf" + (line("node0", 1.0)[:-1] + "\r\n" + line("node1", 2.0)[:-1]).encode())
    assert [e.node for e in feed.poll()] == ["node0", "node1"]
    assert feed.poll() == []
    assert feed.final_poll() == []  # read once
    assert feed.events == 2 and feed.lineno == 2 and feed.partial == b"" and health.total_problems() == 0


def test_a_line_still_being_written_at_the_end_is_counted_but_is_no_bad_line(tmp_path: Path, caplog):
    """A run stopped (Ctrl-C) while a writer was mid-line counted a bad line: the file is fine."""
    path, health, feed = follow(tmp_path, line("node0", 1.0) + line("nodé1", 2.0)[:32])  # cut inside the é
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        assert len(feed.final_poll()) == 1
    assert health.problems == {(STAGE, UNFINISHED): 1} and feed.unfinished == 1
    assert feed.bad == 0 and feed.partial == b""
    assert [r.getMessage() for r in caplog.records if UNFINISHED in r.getMessage()][0].count(f"{path}:2:") == 1


def test_a_last_line_of_complete_json_that_is_no_event_is_a_bad_line_at_the_end(tmp_path: Path):
    path, health, feed = follow(tmp_path, line("node0", 1.0) + '{"node": "node1"}')
    assert len(feed.poll()) == 1  # (complete JSON, but no event: waits, as any line, for its newline)
    assert feed.final_poll() == []
    assert health.problems == {(STAGE, MALFORMED): 1} and feed.bad == 1 and feed.unfinished == 0


def test_the_final_poll_counts_an_unterminated_overlong_line_once(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(external_feed, "MAX_LINE_BYTES", 100)
    path, health, feed = follow(tmp_path, line("node0", 1.0) + "z" * 300)
    assert len(feed.final_poll()) == 1
    assert health.problems == {(STAGE, TOO_LONG): 1} and feed.bad == 1 and feed.lineno == 2


def test_a_large_append_is_read_in_bounded_pieces(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(external_feed, "READ_CHUNK_BYTES", 64)
    text = "".join(line(f"node{i}", float(i)) for i in range(50))  # ~3.5 KB: ~55 pieces, lines split across them
    path, health, feed = follow(tmp_path, text)
    sizes: list[int] = []
    real_take = feed._take
    monkeypatch.setattr(feed, "_take", lambda data: sizes.append(len(data)) or real_take(data))
    assert [e.node for e in feed.poll()] == [f"node{i}" for i in range(50)]
    assert max(sizes) == 64 and sum(sizes) == len(text) and feed.offset == path.stat().st_size
    assert health.total_problems() == 0 and feed.partial == b""


class Collector:
    def __init__(self, log: list[tuple[str, object]]) -> None:
        self.log = log

    def add_external(self, events):  # type: ignore[no-untyped-def]
        self.log.extend(("event", e.node) for e in events)


def test_events_reach_the_targets_before_the_next_frame(tmp_path: Path):
    """Each frame after the first is preceded by the events written since the last; the events
    already in the file come after the first frame, once the engine has telemetry to judge their
    dates by (review r58)."""
    path = tmp_path / "ext.jsonl"
    path.write_text(line("node0", 1.0))
    log: list[tuple[str, object]] = []
    targets = [Collector(log), Collector(log)]
    for frame in feed_before_frames(["f1", "f2", "f3", "f4"], ExternalFeed(path), targets):
        log.append(("frame", frame))
        if frame == "f1":
            append(path, line("node1", 2.0))  # written while the pipeline runs
        if frame == "f2":
            append(path, line("node2", 3.0))
    assert log == [("frame", "f1"),
                   ("event", "node0"), ("event", "node1"), ("event", "node0"), ("event", "node1"), ("frame", "f2"),
                   ("event", "node2"), ("event", "node2"), ("frame", "f3"), ("frame", "f4")]


def test_events_no_frame_came_after_are_counted_not_dropped(tmp_path: Path):
    """The end of the frames reads the file a last time: what was appended during the last frame,
    and the unterminated last line, were never read, and nothing said so. Events read then have
    no telemetry after them to be grouped by: they are counted, not handed over."""
    path = tmp_path / "ext.jsonl"
    path.write_text(line("node0", 1.0))
    log: list[tuple[str, object]] = []
    health = PipelineHealth()
    feed = ExternalFeed(path, health)
    for frame in feed_before_frames(["f1", "f2"], feed, [Collector(log)]):
        log.append(("frame", frame))
        if frame == "f2":
            append(path, line("node1", 2.0) + line("node2", 3.0)[:-1])  # the last one without its newline
    assert log == [("frame", "f1"), ("event", "node0"), ("frame", "f2")]
    assert feed.events == 3 and feed.not_handed == 2
    assert health.problems == {(STAGE, NO_FRAME_AFTER): 2}


def test_a_run_of_one_frame_reads_the_file_and_counts_its_events(tmp_path: Path):
    """A run of one frame (a dcgm or sysfs snapshot) never polled: "0 external events read", no
    problem counted. The file is read before the first frame; its events wait for it (the engine
    judges their dates by its telemetry), and no frame comes after: they are counted."""
    path = tmp_path / "ext.jsonl"
    path.write_text(line("node0", 1.0))
    log: list[tuple[str, object]] = []
    health = PipelineHealth()
    feed = ExternalFeed(path, health)
    read_before: list[int] = []
    for frame in feed_before_frames(["only"], feed, [Collector(log)]):
        read_before.append(feed.events)
        log.append(("frame", frame))
    assert read_before == [1] and log == [("frame", "only")]
    assert feed.not_handed == 1 and health.problems == {(STAGE, NO_FRAME_AFTER): 1}


def test_events_wait_until_the_engine_has_telemetry_time_not_one_frame(tmp_path: Path):
    """A first frame with no usable timestamp (a clock not set: the guard refuses it whole) gives
    the engine no telemetry time; handed over after it, an event stamped in milliseconds was
    queued for good, never counted."""
    from foreshock.detectors.incidents import IncidentEngine
    from foreshock.topology import Topology

    t0 = 1_700_000_000.0
    path = tmp_path / "ext.jsonl"
    path.write_text(line("node0", (t0 + 30) * 1000) + line("node0", t0 + 30))
    health = PipelineHealth()
    engine = IncidentEngine(Topology.from_gpu_hosts([("node0", 1)]), health)
    feed = ExternalFeed(path, health)
    for now in feed_before_frames([math.nan, math.nan, t0, t0 + 10, t0 + 40], feed, [engine]):
        if math.isfinite(now):  # (the bank runs its processors only for a frame with a usable time)
            engine.observe([], now)
    assert engine.queued_external() == 0 and engine.stats["external"] == 1  # the good event grouped
    assert health.problems == {("incidents", "external event dated too far ahead of telemetry: refused"): 1}


def test_events_held_for_an_engine_without_telemetry_time_are_bounded_and_counted(tmp_path: Path, monkeypatch):
    """While every frame's time is unusable, the events read were held in a list that grew with
    the file for as long as the run lasted. The earliest are held, the rest counted."""
    from foreshock.detectors.incidents import IncidentEngine
    from foreshock.topology import Topology

    monkeypatch.setattr(external_feed, "MAX_HELD_EVENTS", 3)
    path = tmp_path / "ext.jsonl"
    path.write_text("")
    health = PipelineHealth()
    engine = IncidentEngine(Topology.from_gpu_hosts([("node0", 1)]), health)
    feed = ExternalFeed(path, health)
    t0 = 1_700_000_000.0
    frames = [math.nan] * 4 + [t0 + 100.0, t0 + 200.0]
    for k, now in enumerate(feed_before_frames(frames, feed, [engine])):
        if math.isfinite(now):
            engine.observe([], now)
        elif k < 3:
            append(path, line("node0", t0 + k) + line("node0", t0 + 10 + k))  # two events a frame
    assert health.problems[(STAGE, HELD_OVER)] == 3  # 6 read, 3 held
    assert engine.stats["external"] == 3 and feed.not_handed == 3
    assert engine.queued_external() == 0  # (grouped: their times passed)


def test_a_replay_hands_each_event_over_as_telemetry_comes_near_it(tmp_path: Path):
    """A replay reads its whole file at the first frame, when the engine's telemetry is the
    recording's start: every event dated more than max_external_ahead_s (15 min) into the
    recording had been refused as too far ahead, though the replay reached it. Held until the
    telemetry comes near, each is taken; one dated after the run's end is counted, not refused."""
    from foreshock.detectors.incidents import IncidentEngine
    from foreshock.topology import Topology

    t0 = 1_700_000_000.0
    path = tmp_path / "ext.jsonl"
    path.write_text("".join(line("node0", t0 + dt) for dt in (300, 1200, 2000, 9000)))
    health = PipelineHealth()
    engine = IncidentEngine(Topology.from_gpu_hosts([("node0", 1)]), health)
    feed = ExternalFeed(path, health)
    for now in feed_before_frames([t0 + dt for dt in range(0, 2400, 10)], feed, [engine]):
        engine.observe([], now)
    assert engine.stats["external"] == 3 and not any("refused" in what for _, what in health.problems)
    assert feed.not_handed == 1 and health.problems[(STAGE, NO_FRAME_AFTER)] == 1  # the one at +9000 s


def test_an_event_decades_ahead_is_handed_over_for_the_engine_to_refuse(tmp_path: Path):
    """Held for telemetry to reach it, an event stamped in milliseconds would wait out the run; it is
    handed over at once and refused there, as the engine counts it."""
    from foreshock.detectors.incidents import IncidentEngine
    from foreshock.topology import Topology

    t0 = 1_700_000_000.0
    path = tmp_path / "ext.jsonl"
    path.write_text(line("node0", (t0 + 30) * 1000))
    health = PipelineHealth()
    engine = IncidentEngine(Topology.from_gpu_hosts([("node0", 1)]), health)
    frames = feed_before_frames([t0, t0 + 10], ExternalFeed(path, health), [engine])
    engine.observe([], next(frames))
    next(frames)  # the second frame: handed over before it
    assert health.problems[("incidents", "external event dated too far ahead of telemetry: refused")] == 1


def test_events_still_queued_by_the_engine_at_the_end_are_counted(tmp_path: Path):
    """An event handed over but dated after the last telemetry stays in the engine's queue: the
    summary said "3 read, 1 with no frame after it", as if the 2 others were grouped."""
    from foreshock.detectors.incidents import IncidentEngine
    from foreshock.topology import Topology

    t0 = 1_700_000_000.0
    path = tmp_path / "ext.jsonl"
    path.write_text(line("node0", t0 + 10) + line("node0", t0 + 600))
    health = PipelineHealth()
    engine = IncidentEngine(Topology.from_gpu_hosts([("node0", 1)]), health)
    feed = ExternalFeed(path, health)
    for now in feed_before_frames([t0 + 10 * i for i in range(10)], feed, [engine]):
        engine.observe([], now)
        if now == t0 + 90:
            append(path, line("node0", t0 + 95))  # read after the last frame
    assert feed.still_queued == 1 and engine.queued_external() == 1  # counted, the engine left as it is
    assert feed.not_handed == 1
    assert health.problems == {(STAGE, STILL_QUEUED): 1, (STAGE, NO_FRAME_AFTER): 1}


def test_the_summary_says_which_events_were_never_grouped(tmp_path: Path):
    from foreshock.cli.common import external_summary

    feed = ExternalFeed(tmp_path / "e.jsonl")
    feed.events, feed.not_handed, feed.still_queued, feed.bad, feed.unfinished = 3, 1, 1, 2, 1
    assert external_summary(feed) == (f"3 external events read from {feed.path}, 1 with no telemetry after it and "
                                      "1 dated after the last telemetry (still queued): not grouped, 2 bad lines, "
                                      "the last line still being written at the end: not read")
    feed.not_handed = feed.still_queued = feed.bad = feed.unfinished = 0
    assert external_summary(feed) == f"3 external events read from {feed.path}"


def test_external_targets_needs_a_processor_that_takes_events():
    take = Collector([])
    assert external_targets([object(), take]) == [take]
    with pytest.raises(ValueError, match="incident engine"):
        external_targets([object()])
    assert external_targets([object()], required=False) == []  # a Kafka worker without the stage


# ---- the commands ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """16 GPUs (two nodes), 15 healthy minutes: no incident of its own. Returns (folder, start)."""
    from foreshock.recording import Recording
    from foreshock.simulator import ClusterSimulator

    out = tmp_path_factory.mktemp("ext") / "rec"
    ClusterSimulator(gpus=16, scenario="healthy", seed=1, duration=900).record(out)
    start = min(float(frame.ts.min()) for frame in Recording.open(out).iter_frames() if len(frame))
    return out, start


def incidents(path: Path) -> list[dict]:  # type: ignore[type-arg]
    rows = [json.loads(text) for text in path.read_text().splitlines()]
    return [r for r in rows if r.get("type") == "incident"]


def test_replay_groups_an_external_event_into_an_incident(healthy, tmp_path: Path):
    rec, start = healthy
    ext = tmp_path / "bmc.jsonl"
    ext.write_text(line("node1", start + 120.0, "fan_failure", "critical") + "garbage\n")
    runner = CliRunner()
    base = runner.invoke(cli, ["replay", str(rec), "--port", "0", "--findings", str(tmp_path / "plain.jsonl")])
    assert base.exit_code == 0, base.output
    assert incidents(tmp_path / "plain.jsonl") == []  # any incident below comes from the event
    result = runner.invoke(cli, ["replay", str(rec), "--port", "0", "--external", str(ext),
                                 "--findings", str(tmp_path / "found.jsonl")])
    assert result.exit_code == 0, result.output
    found = incidents(tmp_path / "found.jsonl")
    assert found, result.output
    assert {(i["root_kind"], i["root_entity"]) for i in found} == {("node", "node1")}
    assert "fan_failure" in found[0]["reason"] and found[0]["members"] == ["node1"]
    assert found[0]["ts"] >= start + 120.0  # grouped once telemetry time reached the event
    said = " ".join(result.output.split())  # rich wraps long lines
    assert "1 external event read" in said and "1 bad line" in said  # the garbage line was counted


def test_replay_groups_an_event_on_a_last_line_without_its_newline(healthy, tmp_path: Path):
    """The unterminated last line was read only after the last frame: never grouped, though dated
    inside the telemetry."""
    rec, start = healthy
    ext = tmp_path / "bmc.jsonl"
    ext.write_text(line("node1", start + 120.0, "fan_failure", "critical")[:-1])
    result = CliRunner().invoke(cli, ["replay", str(rec), "--port", "0", "--external", str(ext),
                                      "--findings", str(tmp_path / "found.jsonl")])
    assert result.exit_code == 0, result.output
    assert {i["root_entity"] for i in incidents(tmp_path / "found.jsonl")} == {"node1"}
    said = " ".join(result.output.split())  # rich wraps long lines, a long path anywhere in it
    assert "1 external event read from" in said and "not grouped" not in said
    assert str(ext) in "".join(result.output.split())


def test_demo_follows_an_external_file(tmp_path: Path):
    ext = tmp_path / "sched.jsonl"
    ext.write_text(line("node0", time.time() + 60.0, "xid 79 gpu fell off the bus", "critical"))
    result = CliRunner().invoke(cli, ["demo", "--gpus", "8", "--duration", "600", "--scenario", "healthy",
                                      "--port", "0", "--external", str(ext), "--findings", str(tmp_path / "f.jsonl")])
    assert result.exit_code == 0, result.output
    assert {i["root_entity"] for i in incidents(tmp_path / "f.jsonl")} == {"node0"}


def test_external_without_an_incident_processor_is_a_usage_error(healthy, tmp_path: Path, monkeypatch):
    import foreshock.detectors.bank as bank

    monkeypatch.setattr(bank, "DEFAULT_PROCESSORS", ())
    ext = tmp_path / "e.jsonl"
    ext.write_text(line("node1", 1.0))
    result = CliRunner().invoke(cli, ["replay", str(healthy[0]), "--port", "0", "--external", str(ext)])
    assert result.exit_code == 2
    assert "--external" in result.output and "incident engine" in result.output


def test_external_refuses_a_pipe(tmp_path: Path):
    """bash's <(cmd) is a pipe: the feed follows a file as it grows, and a pipe was never read."""
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    result = CliRunner().invoke(cli, ["replay", str(tmp_path), "--port", "0", "--external", str(fifo)])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "--external" in said and "not a regular file" in said


def test_replay_of_one_frame_reads_its_external_file_and_says_so(tmp_path: Path):
    """An imported snapshot replays as one frame: its external file was never read ("0 external
    events read") and nothing counted."""
    import numpy as np

    from foreshock.frames import Frame
    from foreshock.recording import RecordingWriter
    from foreshock.topology import Topology

    t0 = 1_704_067_200.0
    topology = Topology.from_gpu_hosts([("node0", 1)])
    with RecordingWriter(tmp_path / "rec", topology) as writer:
        writer.write(Frame("gpu", np.full(2, t0), np.arange(2), {"gpu_temp": np.array([50.0, 51.0])}))
    ext = tmp_path / "ext.jsonl"
    ext.write_text(line("node0", t0))
    result = CliRunner().invoke(cli, ["replay", str(tmp_path / "rec"), "--port", "0", "--external", str(ext)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "1 external event read" in said and "1 with no telemetry after it: not grouped" in said
    assert json.loads(result.output.strip().splitlines()[-1])["input_problems"] == 1
