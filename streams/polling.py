"""Live sources that read a real system on an interval and yield frames.

A :class:`PollingSource` is an iterator of :class:`~foreshock.frames.Frame`: each poll reads
the system once (an HTTP scrape, a command, NVML, sysfs) and yields what it got. Polls are
scheduled on a fixed grid (``start + k * interval``), so a slow poll does not drift the
sampling; a poll that fails is counted and the source keeps going, and so are the slots of the
grid a poll longer than the interval skipped (``foreshock_polls_skipped_total``). The interval
is :data:`~foreshock.guard.MIN_INTERVAL_S` (20 ms) at the least, and a poll starts
:data:`~foreshock.guard.POLL_GAP_S` at least after the previous one stamped its rows (its start,
or its end: :attr:`PollingSource.stamps_at_start`), so no two polls' rows lie within the guard's
minimum spacing of each other (refused as one sample sent twice). ``stop()``
ends the iteration from another thread; ``max_polls`` bounds it (tests, ``--duration``).

A GPU source reads each GPU's UUID (dcgm-exporter's ``UUID`` label, NVML's
``nvmlDeviceGetUUID``, nvidia-smi's ``uuid``; off with ``reads_boards = False``) and carries it
as the ``board_id`` field (:func:`board_id`), so a board swapped in its slot (an RMA: the name
stays, the UUID changes) starts that GPU's detector state afresh wherever its frames are
processed; each source says "replaced" by the rule of :class:`GpuBoards`, which it keeps.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import queue
import selectors
import signal
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from foreshock.boards import board_id
from foreshock.frames import Frame
from foreshock.guard import LONGEST_WAIT_S, MIN_INTERVAL_S, PARK_FOR_S, POLL_GAP_S
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .samples import SampleBatch, host_link_topology

log = logging.getLogger("foreshock.sources")


def steady_unlisted(polls: dict[Any, int], unlisted: Iterable[Any], needed: int) -> tuple[dict[Any, int], list[Any]]:
    """A source following its hardware: ``polls`` (entity -> polls in a row it was served
    while the topology lacks it) counted on by this poll's ``unlisted``, and the entities served in
    ``needed`` polls in a row, to take in. Only this poll's names are kept, so a name served once
    (an odd scrape, a driver loading and failing) is forgotten at the next poll; the taken ones
    leave the count."""
    polls = {name: polls.get(name, 0) + 1 for name in unlisted}
    steady = [name for name, n in polls.items() if n >= needed]
    return {name: n for name, n in polls.items() if n < needed}, steady


def not_yet_told(told: set[str], names: Iterable[str], cap: int) -> list[str]:
    """``names`` not logged yet, sorted, now noted in ``told`` (emptied once it would pass ``cap``:
    a churning cluster's names must not grow it without end)."""
    new = sorted(set(names) - told)
    if new:
        if len(told) + len(new) > cap:
            told.clear()
        told.update(new)
    return new


def count_once(once: set[str] | None, key: str) -> bool:
    """Whether to count the problem ``key``: always without ``once``; with it, the first time.

    A polling source passes its own set for what a healthy system serves at every poll: a metric
    foreshock does not read, a field the device does not have, a copper cable with no
    diagnostics. Those are its configuration, not bad input; counted at every poll they would
    keep ForeshockInputProblems (problems over samples read) firing on healthy hardware."""
    if once is None:
        return True
    if key in once:
        return False
    once.add(key)
    return True


class GpuBoards:
    """Per GPU a topology lists, the UUID of the board last read in its slot, by the same rule for
    every source that reads UUIDs: a known UUID that changes to another is another board (an RMA),
    logged with both UUIDs and counted (``foreshock_gpus_replaced_total``, the source's stage),
    unless that UUID was last read at another GPU of the same host: then the board has moved (a
    node rebooted with a GPU missing lists every later GPU one index lower), logged once per host
    and counted apart (``foreshock_gpus_moved_total``). A first UUID, or none this time ("": not
    read, or several that disagree), is no change.

    :meth:`tag` also writes each row's board into the ``board_id`` column. That is what starts
    the GPU's detector state afresh, or moves it with its board: the input guard of the pipeline
    the frames reach — this process's, or through Kafka a worker's, whose checkpoint keeps the
    boards — finds the number changed (``InputGuard.board_change``, ``InputGuard.follow_boards``),
    however long the source or the agent was down."""

    def __init__(self, health: PipelineHealth, stage: str) -> None:
        self.health = health
        self.stage = stage
        self.uuids: dict[str, str] = {}  # per listed GPU, the UUID last read
        # UUIDs another one displaced and read at no GPU since -> (their node's slot, when): the
        # board of a GPU missing at a reboot, read again when it is back. Kept as the pipeline's
        # guard parks their state (``InputGuard.follow_boards``): per node at most its GPU count,
        # the oldest out, each for ``PARK_FOR_S``, so both count a board back alike (review h27)
        self._away: dict[str, tuple[int, float]] = {}
        self._now = -np.inf  # the newest sample time read (telemetry time, as the guard's)
        # each UUID's board_id: hashed once, not at every poll (9.9 ms a poll of 10,000 GPUs)
        self._ids: dict[str, float] = {}

    def tag(self, batch: SampleBatch, uuids: Mapping[str, str], topology: Topology) -> SampleBatch:
        """``batch`` with its ``board_id`` column from the UUIDs read in the same poll (GPU name ->
        UUID), having noted them. Only listed GPUs are noted: the others' rows are refused, and
        the map stays as big as the topology."""
        names = list(uuids)
        changed: list[tuple[str, int, str, str]] = []  # (name, slot, old UUID, new UUID)
        for name, slot in zip(names, topology.slots("gpu", names)):
            uuid = uuids[name]
            if slot < 0 or not uuid:
                continue
            old = self.uuids.get(name)
            if old is not None and old != uuid:
                changed.append((name, int(slot), old, uuid))
            self.uuids[name] = uuid
        if len(batch) and np.isfinite(batch.ts).any():
            self._now = max(self._now, float(np.nanmax(batch.ts)))
        if changed:
            self._tell(changed, topology)
        if len(batch):
            if len(self._ids) > 2 * len(batch.entities) + 1024:  # boards long gone: keep it as big as the page
                self._ids.clear()
            with_board_ids(batch, uuids, self._id)
        return batch

    def _tell(self, changed: list[tuple[str, int, str, str]], topology: Topology) -> None:
        """Log and count the GPUs that read another UUID this poll: a board last read at another GPU
        of the same host before this poll moved there, and so did one displaced on this host and
        read nowhere since (the missing GPU's, back); any other is a new board. Judged against
        the UUIDs as they were before the poll (a shift back up reads gpu3's old board at gpu4 after
        gpu3 noted its own), so it runs on the changes only, after they are noted."""
        before = dict(self.uuids)
        for name, _, old, _ in changed:
            before[name] = old
        where: dict[str, str] = {}  # UUID -> the GPU it was read at before the poll
        for name, uuid in before.items():
            where.setdefault(uuid, name)
        node = topology.gpu_node
        moves: dict[int, list[str]] = {}
        for name, slot, old, uuid in changed:
            was = where.get(uuid)
            was_slot = int(topology.slots("gpu", [was])[0]) if was is not None else -1
            if was is not None and was != name and was_slot >= 0 and node[was_slot] == node[slot]:
                moves.setdefault(int(node[slot]), []).append(f"{was} -> {name}")
                continue
            away = self._away.pop(uuid, None)
            if away is not None and away[0] == node[slot] and not self._now - away[1] > PARK_FOR_S:
                # back on its node: the pipeline's guard parked its state
                moves.setdefault(int(node[slot]), []).append(f"(away) -> {name}")
                continue
            self.health.gpu_replaced(self.stage)
            log.warning("GPU %s replaced: UUID %s -> %s; its detector state starts afresh where its rows are "
                        "processed", name, old, uuid)
        read = set(self.uuids.values())
        for name, slot, old, _ in changed:
            if old not in read:  # displaced, and read at no GPU now
                self._away[old] = (int(node[slot]), self._now)
        self._forget_away(topology)
        for node_slot, moved in moves.items():
            self.health.gpu_moved(self.stage, len(moved))
            log.warning("%s: GPU boards read at other indices (a GPU missing, or back, at a reboot?): %s; their "
                        "detector state follows them where their rows are processed",
                        topology.name("node", node_slot), ", ".join(moved))

    def _forget_away(self, topology: Topology) -> None:
        """Keep of the displaced UUIDs what the guard keeps of their state: per node its GPU count
        (the oldest out), none displaced more than ``PARK_FOR_S`` ago."""
        per_node: dict[int, int] = {}
        gpus = np.bincount(topology.gpu_node, minlength=topology.size("node"))
        for uuid, (node, when) in reversed(list(self._away.items())):  # newest first
            per_node[node] = per_node.get(node, 0) + 1
            if self._now - when > PARK_FOR_S or not 0 <= node < len(gpus) or per_node[node] > gpus[node]:
                del self._away[uuid]

    def _id(self, uuid: str) -> float:
        found = self._ids.get(uuid)
        if found is None:
            found = self._ids[uuid] = board_id(uuid)
        return found


def with_board_ids(batch: SampleBatch, uuids: Mapping[str, str],
                   number: Callable[[str], float] = board_id) -> SampleBatch:
    """``batch`` with a ``board_id`` column: each row its GPU's UUID (GPU name -> UUID, ``uuids``)
    as a number (``number``: :func:`~foreshock.boards.board_id`, or a cache of it); NaN where the
    GPU has none ("" or not listed)."""
    ids = np.array([number(uuids.get(name, "")) for name in batch.entities], dtype=np.float64)
    batch.columns["board_id"] = ids[batch.entity]
    return batch


CLOCK_STEPPED_BACK = "host clock stepped back"
"""The problem a live source counts when this host's wall clock went back between two of its polls
by more than :data:`CLOCK_STEP_S` against the monotonic clock. Its rows are stamped with the wall
clock, so every row after the step is older than the last one read: the input guard refuses them as
out of order (each counted there) until the clock has passed the last stamps again — for as long as
the step. Said once, with the size of the step, so that an hour of refused rows has its reason."""
CLOCK_STEP_S = 1.0
"""A step back of the wall clock worth telling (s): NTP slews a small offset at under 0.5 ms a
second; a step of a second or more is a clock set (at boot, by hand, ``chronyd makestep``)."""


DERIVED_CLUSTER = "default"
"""The ``cluster`` of a topology a live source derives from what it reads (no topology file), the same
for every source (``--cluster`` names another): dcgm and nvidia-smi had named it ``imported``,
InfiniBand, dom and ethtool after the host, Redfish ``redfish``, so one node's GPU, IB and BMC
watches landed in three clusters of the Prometheus rules that aggregate ``by (cluster)``. One name
for all, not the host's: the watches of a cluster's nodes, one per node, add up in one cluster."""


class PollingSource:
    """Base class: subclasses implement :meth:`poll` and set :attr:`topology` (maybe lazily).

    ``counted_once`` is the source's set for :func:`count_once`."""

    stage = "source"
    reads: tuple[str, ...] = ()  # the entity kinds it yields: their sample counts exist from the start, at 0
    stamps_at_start = True
    """Whether a poll stamps its rows when it starts (the clock read on its first line: dcgm, nvidia-smi,
    NVML, sysfs); False where they are stamped as answers come or when it ends (Redfish, CDU, dom,
    ethtool). The next poll starts :data:`~foreshock.guard.POLL_GAP_S` at least after this one's start,
    or after its end where its stamps may lie there: the grid is kept whatever a poll takes."""
    counts_samples = True  # False where a pipeline consuming the frames counts them in the same health

    def __init__(self, interval: float, health: PipelineHealth | None = None, max_polls: int | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if not interval >= MIN_INTERVAL_S:
            raise ValueError(f"interval must be at least {MIN_INTERVAL_S:g} s (MIN_INTERVAL_S), got {interval}")
        if not interval <= LONGEST_WAIT_S:
            # the wait after the first poll would raise OverflowError and end the source's thread
            raise ValueError(f"interval must be at most {LONGEST_WAIT_S:g} s (LONGEST_WAIT_S), got {interval}")
        self.interval = float(interval)
        self.health = health if health is not None else PipelineHealth()
        self.max_polls = max_polls
        self.clock = clock
        self.monotonic: Callable[[], float] = time.monotonic  # the poll grid's clock
        self.wall: Callable[[], float] = time.time  # this host's clock, watched for steps back
        self.polls = 0
        self._stop = threading.Event()
        self._topology: Topology | None = None
        self.cluster = DERIVED_CLUSTER  # the cluster a topology derived from what it reads is named
        self.counted_once: set[str] = set()
        # A source that never reads anything must still show it: problems over samples read is
        # how ForeshockInputProblems judges an agent, and a ratio needs both series.
        for kind in self.reads:
            self.health.processed(kind, 0)

    @property
    def topology(self) -> Topology | None:
        """The topology frames' slots refer to (None until the first successful poll derives it)."""
        return self._topology

    def name_cluster(self, name: str) -> None:
        """Name the cluster of the topology this source derives from what it reads (:attr:`cluster`,
        :data:`DERIVED_CLUSTER` by default): the one it holds already, if it derived one when created
        (NVML, dom, ethtool, Redfish), and those it derives later. Only for a source given no
        topology: a topology file's own cluster name stands."""
        self.cluster = name
        if self._topology is not None and self._topology.cluster != name:
            self._topology = dataclasses.replace(self._topology, cluster=name)

    def poll(self) -> list[Frame]:
        """Read the system once; return the frames (empty when nothing could be read)."""
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()

    def __iter__(self) -> Iterator[Frame]:
        start = self.monotonic()
        slot = 0  # the grid slot of the poll in hand
        gridded = False  # the grid has been started again after the first poll that yielded a frame
        held_by_gap = False  # this poll started later than its slot, held POLL_GAP_S after the last one
        last_clocks: tuple[float, float] | None = None  # (monotonic, wall) at the last poll's start
        while not self._stop.is_set() and (self.max_polls is None or self.polls < self.max_polls):
            began = self.monotonic()
            wall = self.wall()
            if last_clocks is not None:
                back = (began - last_clocks[0]) - (wall - last_clocks[1])
                if back > CLOCK_STEP_S:
                    self.health.problem(self.stage, CLOCK_STEPPED_BACK, detail=(
                        f"this host's clock went back {back:.3g} s between two polls (NTP, or set by hand): the "
                        f"rows stamped since are older than the last ones read, and are refused as out of order "
                        f"until the clock has passed those again, about {back:.3g} s from now"))
            last_clocks = (began, wall)
            try:
                frames = self.poll()
            except Exception as exc:  # a source must never take the pipeline down
                self.health.problem(self.stage, "poll failed", detail=f"{type(exc).__name__}: {exc}")
                frames = []
            ended = self.monotonic()
            took = ended - began
            self.polls += 1
            yielded = False
            for frame in frames:
                if len(frame):
                    yielded = True
                    if self.counts_samples:
                        self.health.processed(frame.kind, len(frame))
                    yield frame
            if self.max_polls is not None and self.polls >= self.max_polls:
                break
            # Next slot on the fixed grid; skip slots a slow poll overran instead of bunching up.
            # The grid is monotonic time: a wall clock stepped by NTP neither stalls nor bunches it.
            if yielded and not gridded:
                # the grid starts again when the first frames have been taken: what takes them
                # starts up meanwhile (`watch` builds its bank and compiles its kernels on the
                # first frame), which skips no sample worth counting at every start. The first
                # frames, not the first poll's: an exporter still down (or serving an empty page)
                # at the first polls had that start-up counted as skipped polls
                gridded = True
                start = self.monotonic() - took
                slot = 0  # this poll's slot of the new grid
            elapsed = self.monotonic() - start
            next_slot = max(int(elapsed / self.interval) + 1, slot + 1)  # never the same slot twice
            skipped = next_slot - slot - 1
            if skipped:
                # those samples were never read: counted (foreshock_polls_skipped_total), the reason
                # logged once, not at every poll of a device that is always this slow
                if took > self.interval:
                    why = f"a poll took {took:.3g} s, longer than the {self.interval:g} s interval"
                elif held_by_gap:
                    when = "started late" if self.stamps_at_start else "ended (this source stamps as a poll goes)"
                    why = (f"a poll {when} less than {POLL_GAP_S * 1e3:g} ms before the next one's slot of the "
                           f"{self.interval:g} s grid, and a poll starts that long after the previous one's stamps "
                           f"at the least (POLL_GAP_S), so the next one missed its slot")
                else:
                    why = (f"the frames of a poll were taken {elapsed - slot * self.interval:.3g} s after it began, "
                           f"longer than the {self.interval:g} s interval")
                self.health.skipped_polls(self.stage, skipped, detail=why)
            slot = next_slot
            # A poll started late by the scheduler and the next one on time had stamps closer
            # than the interval: at 10 ms, rows refused as repeats. The gap after the time this
            # poll stamped its rows holds the next one's clear of them, late or not.
            slot_left = next_slot * self.interval - elapsed
            gap_left = (began if self.stamps_at_start else ended) + POLL_GAP_S - (start + elapsed)
            held_by_gap = gap_left > max(0.0, slot_left)
            self._stop.wait(max(0.0, slot_left, gap_left))


_running_groups: set[int] = set()
"""Process groups of the commands :func:`run_process` is waiting for: killed if foreshock exits
first (a second Ctrl-C while a source polls in a thread of its own), as the terminal's Ctrl-C
no longer reaches them in their own session."""
_running_lock = threading.Lock()


def run_process(argv: Sequence[str], health: PipelineHealth, stage: str,
                timeout: float = 10.0) -> tuple[subprocess.CompletedProcess[str] | None, str]:
    """Run a command to its end, whatever its exit status: ``(the finished process, "")``, or
    ``(None, what went wrong)`` when it could not be started or did not end within ``timeout``
    (counted). For a caller that reads what a failing command still printed and judges its exit
    status itself (nvidia-smi prints every healthy GPU's row, then exits non-zero for a lost one);
    the others use :func:`run_command`.

    The command runs in a session of its own, and a timeout kills its whole process group: the
    command may be a wrapper (a container, ssh) whose own children kept running, one more per
    timed-out poll, when only the wrapper was killed. Ctrl-C at the terminal reaches the command no
    more: the first ends the run after the poll in progress (at most ``timeout``), a second one,
    or foreshock ending meanwhile, kills the group.

    The command has ended when it exits (within ``timeout``), not when its pipes close: what it
    wrote is read until then and for :data:`EXIT_GRACE_S` after, and what it left running in its
    group is killed (a background process holding its stdout, an ssh ControlPersist master, made
    every poll time out and its whole output lost; logged once per command).

    Its output is read as UTF-8, a byte that is not UTF-8 read as U+FFFD: a job name in Latin-1 in
    ``squeue``'s output was a UnicodeDecodeError traceback."""
    try:
        # bytes, decoded once the command has ended: read from the pipes as they fill (_gather)
        child = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        health.problem(stage, "command not found", detail=str(argv[0]))
        return None, f"{argv[0]}: not found"
    except PermissionError:
        health.problem(stage, "command not executable", detail=str(argv[0]))
        return None, f"{argv[0]}: not executable"
    except (OSError, ValueError) as exc:
        # a script without a #! line (ENOEXEC), a NUL byte in an argument: a traceback before
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        health.problem(stage, "command could not be started", detail=f"{argv[0]!r}: {why}")
        return None, f"{argv[0]!r}: could not be started ({why})"
    with _running_lock:
        _running_groups.add(child.pid)  # the child leads its group: its pid is the group's id
    try:
        with child:  # closes the pipes and reaps the child, whatever ends the wait
            try:
                out, err, held = _gather(child, timeout)
            except subprocess.TimeoutExpired:
                _kill_group(child.pid)
                health.problem(stage, "command timed out", detail=f"{argv[0]} after {timeout} s")
                return None, f"{argv[0]}: timed out after {timeout} s"
            except BaseException:  # KeyboardInterrupt: the command must not outlive the run
                _kill_group(child.pid)
                raise
            # what the command left running in its group (a helper it started in the background)
            # goes with it: one more was left at every poll
            _kill_group(child.pid)
    finally:
        with _running_lock:
            _running_groups.discard(child.pid)
    if held and argv[0] not in _told_held:
        _told_held.add(argv[0])
        log.warning("%s: %s exited, but a process it left behind still held its output; that process was "
                    "killed (at every poll: an ssh ControlPersist master, a helper daemon started by a wrapper?)",
                    stage, argv[0])
    return subprocess.CompletedProcess(child.args, child.returncode, _text(out), _text(err)), ""


EXIT_GRACE_S = 0.2
"""How long :func:`run_process` reads a command's pipes after it has exited, for what it wrote last:
a process it left behind in the background (an ssh ControlPersist master, a helper a wrapper starts)
may hold them open for good, and the command's output is whole once it has exited."""

_told_held: set[str] = set()  # the commands logged as leaving a process that held their output


def _gather(child: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bytes, bool]:
    """What ``child`` wrote to its stdout and stderr until it exited (within ``timeout``, else
    ``TimeoutExpired``) and its pipes reached their end, or :data:`EXIT_GRACE_S` after it exited;
    and whether a pipe was still held open then. ``communicate`` waited for the pipes' end, not
    the command's: a command that printed its rows and exited 0, leaving a background process
    holding its stdout, timed out at every poll and its output was thrown away."""
    assert child.stdout is not None and child.stderr is not None
    deadline = time.monotonic() + timeout
    out, err = bytearray(), bytearray()
    got = {child.stdout.fileno(): out, child.stderr.fileno(): err}
    exit_fd = _exit_fd(child.pid)  # readable once the command has exited, where the system has pidfds
    with selectors.DefaultSelector() as selector:
        for fd in got:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        if exit_fd is not None:
            selector.register(exit_fd, selectors.EVENT_READ)
        try:
            until = deadline  # then EXIT_GRACE_S past the command's exit
            exited = False
            while True:
                if not exited and child.poll() is not None:
                    exited = True
                    until = min(deadline, time.monotonic() + EXIT_GRACE_S)
                    if exit_fd is not None:
                        selector.unregister(exit_fd)  # readable for good now
                if exited and not any(fd in selector.get_map() for fd in got):
                    return bytes(out), bytes(err), False
                left = until - time.monotonic()
                if left <= 0:
                    if not exited:
                        raise subprocess.TimeoutExpired(child.args, timeout)
                    return bytes(out), bytes(err), True
                # without a pidfd, the command's exit is looked for every 50 ms
                for key, _ in selector.select(left if exited or exit_fd is not None else min(left, 0.05)):
                    if key.fd == exit_fd:
                        continue  # seen by child.poll() above
                    try:
                        chunk = os.read(key.fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if chunk:
                        got[key.fd] += chunk
                    else:
                        selector.unregister(key.fd)
        finally:
            if exit_fd is not None:
                os.close(exit_fd)


def _exit_fd(pid: int) -> int | None:
    """A pidfd of ``pid`` (Linux 5.3 and later), or None where there is none to be had."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _text(output: bytes) -> str:
    """A command's output as text mode read it: UTF-8, a byte that is not UTF-8 read as U+FFFD,
    and universal newlines."""
    return output.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # every process of the group has ended already
        pass


@atexit.register
def _kill_running_groups() -> None:
    with _running_lock:
        for pgid in _running_groups:
            _kill_group(pgid)


def run_command(argv: Sequence[str], health: PipelineHealth, stage: str,
                timeout: float = 10.0) -> tuple[str | None, str]:
    """Run a command; returns ``(stdout, "")`` or ``(None, what went wrong)``, the failure counted.

    A non-zero exit is a failure whatever it printed (see :func:`run_process` for a command whose
    output outlives its failures)."""
    done, why = run_process(argv, health, stage, timeout)
    if done is None:
        return None, why
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        message = f"{argv[0]} exit {done.returncode}: {lines[0] if lines else ''}"
        health.problem(stage, "command failed", detail=message)
        return None, (done.stderr or done.stdout)
    return done.stdout, ""


class Readings(dict[str, str]):
    """What :meth:`EthtoolSource.read_all` returns: each entity's command output by name, and in
    :attr:`at` the time it was read (the clock read when its command returned).

    The commands run one after another, each up to its timeout: stamped all with the clock read
    before the first, every row after a slow command carried a time from before it was read. A
    counter's rate is its increase over the stamps' difference, so one interface taking 1.8 s of
    a 2-s poll made every later one's rate ~1.9x too high, then ~0.5x too low at the next poll
    (``xmit_discards`` read over 100/s, a warning, for a true 60/s), and nothing was counted.

    The time after the command, not before it or its midpoint: ``ethtool`` takes a device's
    counters in one ioctl (``ETHTOOL_GSTATS``; ``-m`` reads the module's pages) and then only prints
    them, while what makes it slow mostly comes first (starting a process on a loaded host, the
    RTNL lock another tool holds, a driver's queued firmware command). A midpoint puts the row of a
    command that waited 1.8 s before reading 0.9 s early; the end is within its printing of the
    read, and never before it. The Redfish source stamps a node's row when its answer arrives alike."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[str, float] = {}


class EthtoolSource(PollingSource):
    """What the ``ethtool FLAG IFACE`` sources share: one entity per interface, polled in turn.

    ``interfaces`` maps an interface to its entity's name in the topology; a plain list names
    each interface's entity ``<host>/<iface>`` plus :attr:`entity_suffix` (``#a`` when the entity
    is the optic at the NIC end of that link) in a topology derived from those links.
    Subclasses set :attr:`flag`, :attr:`stage` and :attr:`default_interval`, and turn
    :meth:`read_all`'s outputs into frames in :meth:`poll`.
    """

    flag = ""
    entity_suffix = ""
    default_interval = 10.0
    stamps_at_start = False  # each interface's rows when its command returns (:class:`Readings`)

    def __init__(self, interfaces: Mapping[str, str] | list[str], interval: float | None = None,
                 executable: str = "ethtool", host: str | None = None, topology: Topology | None = None,
                 health: PipelineHealth | None = None, max_polls: int | None = None,
                 timeout: float = 10.0) -> None:
        super().__init__(self.default_interval if interval is None else interval, health, max_polls)
        self.host = host or socket.gethostname()
        if not isinstance(interfaces, Mapping):
            interfaces = {iface: f"{self.host}/{iface}{self.entity_suffix}" for iface in interfaces}
        self.interfaces = dict(interfaces)
        self.executable = executable
        self.timeout = timeout
        self._topology = topology if topology is not None else host_link_topology(
            self.host, [(iface, self.link_of(entity)) for iface, entity in self.interfaces.items()], self.cluster)

    def link_of(self, entity: str) -> str:
        """The link an interface's entity belongs to (the entity itself for link sources)."""
        return entity

    def read_all(self) -> Readings:
        """``ethtool FLAG IFACE`` output by entity name, each one's read time in ``.at``
        (:class:`Readings`); failed commands are counted and left out."""
        readings = Readings()
        for iface, entity in self.interfaces.items():
            out, _ = run_command([self.executable, self.flag, iface], self.health, self.stage, self.timeout)
            if out is not None:
                readings[entity] = out
                readings.at[entity] = self.clock()  # as of this read, not of the poll's start
        return readings

    def read_times(self, readings: Mapping[str, str]) -> dict[str, float]:
        """Each reading's time, to stamp its rows: its own (:class:`Readings`), or, where a
        ``read_all`` gives a plain mapping (a subclass's, a test's), the clock now, when every
        reading is in hand (no earlier than any of them was read)."""
        at = readings.at if isinstance(readings, Readings) else {}
        if all(entity in at for entity in readings):
            return {entity: at[entity] for entity in readings}
        now = self.clock()
        return {entity: at.get(entity, now) for entity in readings}


ALONGSIDE_BACKLOG = 64
"""Frames :func:`alongside` holds for a consumer busy with another: past that, the sources wait
(their skipped polls are counted) rather than the backlog growing for as long as the run lasts."""


def alongside(primary: Iterable[Frame], others: Sequence[PollingSource],
              backlog: int = ALONGSIDE_BACKLOG) -> Iterator[Frame]:
    """The frames of ``primary`` and of ``others``, each polled in a thread of its own, in the
    order they arrive; ends when the primary does, and stops the others then. An error that ends
    the primary is raised to the consumer (it had looked like the primary's end: ``watch`` printed
    its summary and exited 0); one that ends a side source is counted under its stage ("source
    stopped") and logged, and the primary goes on without it.

    At most ``backlog`` frames wait for the consumer. Unbounded, a pipeline slower than its
    sources let them queue frames without end (memory growing for weeks, each frame processed
    later than the last, and the ingest lag, measured from when a frame is taken, saying 0);
    bounded, a source waits in its poll loop, which counts the polls it skips
    (``foreshock_polls_skipped_total``)."""
    if not others:
        yield from primary
        return
    arrived: queue.Queue[Frame | _PrimaryEnded] = queue.Queue(maxsize=backlog)
    done = threading.Event()  # the consumer has gone: a pump waiting for room gives up

    def put(item: Frame | _PrimaryEnded) -> bool:
        while not done.is_set():
            try:
                arrived.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def pump(frames: Iterable[Frame], source: PollingSource | None) -> None:
        """Hand ``frames`` to the consumer; ``source`` None for the primary, whose end (or error)
        is handed over last."""
        failed: BaseException | None = None
        try:
            for frame in frames:
                if not put(frame):
                    return
        except BaseException as exc:  # an error in this thread is the consumer's to hear of
            failed = exc
            if source is not None:
                # a side source stopped: counted and logged, the primary goes on without it
                source.health.problem(source.stage, "source stopped", detail=f"{type(exc).__name__}: {exc}")
        finally:
            if source is None:
                put(_PrimaryEnded(failed))

    threads = [threading.Thread(target=pump, args=(s, s), name=f"poll-{s.stage}", daemon=True) for s in others]
    threads.append(threading.Thread(target=pump, args=(primary, None), name="poll-primary", daemon=True))
    for thread in threads:
        thread.start()
    try:
        while not isinstance(item := arrived.get(), _PrimaryEnded):
            yield item
        if item.error is not None:
            raise item.error
    finally:
        done.set()
        for source in others:
            source.stop()


class _PrimaryEnded:
    """What :func:`alongside`'s primary hands over last: its end, or the error that ended it."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error
