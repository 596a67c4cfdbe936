"""``foreshock watch``: run the embedded pipeline live over one polled source — no broker.

The single-machine way to use foreshock on real hardware: ``foreshock watch --source nvml``
on a GPU node, or ``--source dcgm --url http://HOST:9400/metrics``. The detector bank, the
Prometheus endpoint and the summary are those of ``replay``. A source that derives its topology
from what it reads (dcgm, infiniband) is polled once before the bank is built. Ctrl-C,
``--duration`` or ``--polls`` end the watch after the poll in progress, and the summary is
printed as after a replay. ``--bmc`` polls the nodes' BMCs over Redfish beside the source (chassis fans and power)
and ``--cdu`` the cooling loops' CDUs (coolant supply and flow), each in a thread of its own and
named by the source's topology: the GPUs from NVML or dcgm-exporter, the fans from the BMC and the
coolant from the CDU, on one machine without a broker.

A topology derived from the source (no ``--topology``) follows the hardware: when dcgm-exporter
serves GPUs it lacks in 3 consecutive polls (a node replaced or added: new hostnames), or sysfs
lists InfiniBand ports it lacks in as many (an HCA whose driver loaded after the start, a port
added), the source takes them in and the watch carries on under the grown topology
(``_TopologyFollower``), each entity keeping its learnt state. A host none of whose GPUs has been
served for ``--forget-after`` seconds (24 h; 0: never) is dropped the same way, its state with it,
so a watch over a cluster whose nodes come and go under new hostnames does not grow without end; a
node down for a shorter repair keeps its place and state, and one served again after being
forgotten is taken in as a new one. With ``--topology FILE`` the file is the truth, and never
changes: a GPU it lacks is counted as an unknown entity and logged once, asking to add it to the
file; a ``--bmc`` node or ``--cdu`` loop it lacks is refused before the first poll.

A GPU board swapped in its slot (an RMA: the name stays, the UUID changes) starts its detector
state afresh from the new board's first row, with or without ``--topology``: the new board's
thermal resistance is not judged against the old one's history. Every GPU source reads the UUID
for this (dcgm-exporter's ``UUID`` label, NVML's ``nvmlDeviceGetUUID``, nvidia-smi's ``uuid``
query) and carries it in each row (``board_id``), where the pipeline's input guard finds the
change (``InputGuard.board_change``): the same as in ``replay`` and the Kafka workers.
"""

from __future__ import annotations

import dataclasses
import itertools
import signal
import socket
import threading
import time
from collections import deque
from typing import Callable, Iterable, Iterator, Sequence
from urllib.parse import urlparse

import click
import numpy as np
from rich.console import Console

from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.remap import HARDWARE_KINDS, Remap
from foreshock.streams.dcgm import FORGET_AFTER_S, MAX_AHEAD_S, UNLISTED_POLLS, DcgmScrapeSource
from foreshock.streams.infiniband import InfinibandSource
from foreshock.streams.nvidia_smi import NvidiaSmiSource
from foreshock.streams.polling import PollingSource, alongside
from foreshock.streams.redfish import CduSource, RedfishSource, parse_bmc_list
from foreshock.topology import Topology

from .agent import options_given, refuse_unread_options
from .common import (LIVE_INTERVAL, PipelineRun, build_pipeline, counted, detector_option, finish, finite_number,
                     move_run, param_option, run_with_progress, serve_options, stop_on_signals, stop_server)
from .record import STOP_CHECK_S, WIND_DOWN_S, hurry, live_source_options, open_live_source, stop_within


@click.command("watch")
@live_source_options()
@click.option("--bmc", default=None,
              help="Also poll these nodes' BMCs over Redfish beside SOURCE (chassis fans and power): "
                   "NODE=https://BMC[,...], or one URL alone: the BMC of the node --node names (default: this "
                   "machine's hostname). Credentials from FORESHOCK_BMC_USER / FORESHOCK_BMC_PASSWORD.")
@click.option("--bmc-interval", type=LIVE_INTERVAL, default=30.0,
              show_default=True, callback=finite_number(), help="Seconds between BMC polls.")
@click.option("--cdu", default=None,
              help="Also poll these cooling loops' CDUs over Redfish beside SOURCE (coolant supply and flow, as the "
                   "loops' racks' inlet): LOOP=https://CDU[,...] (a URL alone names its loop after the URL's host "
                   "name); needs --topology for the racks each loop feeds.")
@click.option("--cdu-interval", type=LIVE_INTERVAL, default=10.0,
              show_default=True, callback=finite_number(), help="Seconds between CDU polls.")
@click.option("--forget-after", type=click.FloatRange(min=0), default=FORGET_AFTER_S, show_default=True,
              help="--source dcgm without --topology: drop a host from the derived topology, and its state, once "
                   "none of its GPUs has been served for this many seconds (nodes recycled under new hostnames); "
                   "0: never.")
@detector_option
@param_option
@serve_options
def command(source: str, duration: float | None, polls: int | None, interval: float | None, url: str | None,
            executable: str | None, root: str | None, interfaces: str | None, node: str | None,
            topology_path: str | None, cluster: str | None, bmc: str | None, bmc_interval: float, cdu: str | None,
            cdu_interval: float, forget_after: float, detectors: str | None,
            params: tuple[str, ...], host: str, port: int, findings_path: str | None, top_k: int) -> None:
    """Watch a live SOURCE: poll it, run the detectors on every poll, serve /metrics."""
    # open_source checks the options of one source; --node also names a --bmc URL alone's node
    set_by_user = options_given(click.get_current_context(), "forget_after", *(("node",) if bmc is None else ()))
    refuse_unread_options(source, **set_by_user)
    for beside, asked, itself, what in (("--bmc", bmc, "redfish", "BMCs"), ("--cdu", cdu, "cdu", "CDUs")):
        if source == itself and asked is not None:
            # two grids polling the same BMCs or CDUs: each other's rows would be refused as out of
            # order or as repeats wherever the grids lie within a poll of each other
            raise click.UsageError(f"{beside} polls {what} beside another source; --source {itself} polls them "
                                   "itself (name them all in --url)")
    if set_by_user["forget-after"] is not None and topology_path is not None:
        raise click.UsageError("--forget-after is for a topology derived from the source; a --topology file never "
                               "drops a host")
    polled, topology_of = open_live_source(source, url, executable, root, interfaces, interval, polls, node,
                                           topology_path, node_flag="--node", cluster=cluster)
    bmcs = _bmc_list(bmc, node)
    cdus = _cdu_list(cdu, topology_path)
    if source == "dcgm" and topology_path is None \
            and not (forget_after == 0 or forget_after >= UNLISTED_POLLS * polled.interval):  # (NaN: refused)
        # shorter, a host missing one scrape is forgotten, and taken in again as a new one
        least = UNLISTED_POLLS * polled.interval
        raise click.BadParameter(f"0 (never) or at least {UNLISTED_POLLS} polls ({least:g} s), not {forget_after:g}",
                                 param_hint="--forget-after")
    # --topology: the file is known before the first poll, so a --bmc or --cdu it refuses is told
    # at once, not after the source's first frame (never, with the exporter down)
    given = topology_of() if topology_path is not None else None
    others = ([] if given is None else
              _beside_sources(bmc, bmcs, bmc_interval, node, cdu, cdus, cdu_interval, given, polled.health, fixed=True))
    console = Console(stderr=True)
    timer = threading.Timer(duration, polled.stop) if duration else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    polled.counts_samples = False  # the pipeline counts what it processes, in the same health
    if isinstance(polled, DcgmScrapeSource):
        polled.takes_in_new_gpus = True  # a derived topology follows nodes replaced, added or gone for long
        polled.forget_after_s = forget_after
    if isinstance(polled, InfinibandSource):
        polled.takes_in_new_ports = True  # a derived topology follows ports found after the start
    if isinstance(polled, NvidiaSmiSource):
        polled.takes_in_new_gpus = True  # a GPU unreadable at the first poll is taken in once seen steadily
    stopped_by: list[str] = []
    hurried = threading.Event()  # a second signal: the sources' polls in hand are cut short
    restore_second: list[Callable[[], None]] = []

    def hurry_up(_sig: signal.Signals) -> None:
        hurried.set()
        for source in (polled, *others):
            hurry(source)

    def stop(sig: signal.Signals) -> None:
        polled.stop()
        stopped_by.append("Ctrl-C" if sig == signal.SIGINT else sig.name)
        # the poll in hand is waited for (up to its own limit: NVML's deadline); a second signal
        # cuts it short where the source can be (its wait ended), as before elsewhere (a command killed)
        if not restore_second and callable(getattr(polled, "hurry", None)):
            restore_second.append(stop_on_signals(hurry_up))

    restore = stop_on_signals(stop)
    try:
        frames = iter(polled)
        first = _first_frame(frames)
        topology = topology_of()
        if first is None or topology is None:
            raise click.ClickException(f"no telemetry came from {source} in {polled.polls} polls: nothing to watch "
                                       f"({_problems(polled)})")
        if given is None:  # before /metrics is served and the findings file opened: a refusal leaves neither
            others = _beside_sources(bmc, bmcs, bmc_interval, node, cdu, cdus, cdu_interval, topology, polled.health,
                                     fixed=False)
        run = build_pipeline(topology, detectors, host, port, findings_path, top_k, params, health=polled.health,
                             node_option="--node")
        # live rows are stamped by clocks near this host's, as the Kafka workers' are: one far ahead
        # (a federation's line in microseconds, a BMC's clock off by a year) is refused, counted
        # (future_timestamp), not taken as its entity's last time, which hid the entity until then
        run.pipeline.guard.max_ahead_s = MAX_AHEAD_S
        # live: /metrics ages by arrival on this host's clock, not by whichever source's clock
        # stamped the last frame (a BMC a minute behind its nodes made ETAs jump back and forth)
        run.store.use_wall_clock()
        for other in others:
            other.counts_samples = False
        extra = "".join(f" and {counted(len(found), what)}" for found, what in ((bmcs, "BMC"), (cdus, "CDU")) if found)
        links = f", {counted(topology.size('link'), 'link')}" if topology.size("link") else ""
        console.print(f"[dim]watching {source}{extra}: "
                      f"{counted(topology.size('gpu'), 'GPU')}, {counted(topology.size('node'), 'node')}{links}, "
                      "a poll every "
                      f"{polled.interval:g} s "
                      "(Ctrl-C stops)[/dim]")
        follower = _TopologyFollower(polled, topology, others)
        merged = alongside(itertools.chain([first], follower.mark(frames)), others)
        stats = run_with_progress(run, follower.follow(merged, run), None, f"watch {source}")
    finally:
        polled.stop()
        for other in others:
            other.stop()  # (alongside stops them too, where the run got that far)
        if timer is not None:
            timer.cancel()
        for undo in restore_second:
            undo()
        restore()
    # a signal while the sources beside wind down (the run already stopped) cuts it short
    restore = stop_on_signals(hurry_up)
    try:
        _wind_down(others, hurried)
    finally:
        restore()
    if stopped_by:
        console.print(f"[yellow]stopped by {stopped_by[0]}[/yellow]")
    finish(run, stats, json_name="watch", interrupted=bool(stopped_by))
    stop_server(run)


def _wind_down(others: Sequence[PollingSource], hurried: threading.Event | None = None) -> None:
    """Give the sources beside (BMCs, CDUs), stopped, their own limit on a poll
    (:func:`~.record.stop_within`) at most to end the poll in hand: its reads in flight answer or are
    counted then as too slow. The summary was printed while such a poll still waited (for a BMC that
    never answers), without them; past it a poll is left (its threads do not hold the exit). Once
    ``hurried`` (a signal) the polls' waits are cut short, and :data:`~.record.WIND_DOWN_S` is waited
    at most from then."""
    until = time.monotonic() + max((stop_within(other) for other in others), default=0.0)
    cut = False
    for other in others:
        wind_down = getattr(other, "wind_down", None)
        if not callable(wind_down):
            continue
        # looked at every STOP_CHECK_S: a signal's handler runs in this thread, between waits
        while not wind_down(max(0.0, min(until - time.monotonic(), STOP_CHECK_S))):
            now = time.monotonic()
            if hurried is not None and hurried.is_set() and not cut:
                cut = True
                until = min(until, now + WIND_DOWN_S)
            if now >= until:
                break


def _bmc_list(bmc: str | None, node: str | None) -> dict[str, str]:
    if not bmc:
        return {}
    try:
        return parse_bmc_list(bmc, node or socket.gethostname())
    except ValueError as exc:
        raise click.UsageError(f"--bmc: {exc}") from None


def _cdu_list(cdu: str | None, topology_path: str | None) -> dict[str, str]:
    if not cdu:
        return {}
    if topology_path is None:
        raise click.UsageError("--cdu needs --topology: the racks each cooling loop feeds")
    try:
        return parse_bmc_list(cdu, what="loop")
    except ValueError as exc:
        raise click.UsageError(f"--cdu: {exc}") from None


def _urls_alone(text: str | None) -> list[str]:
    """The items of a ``--bmc`` / ``--cdu`` list given as a URL without a name (``parse_bmc_list``
    names them)."""
    return [item.strip() for item in (text or "").split(",") if item.strip() and "=" not in item]


def _beside_sources(bmc: str | None, bmcs: dict[str, str], bmc_interval: float, node: str | None, cdu: str | None,
                    cdus: dict[str, str], cdu_interval: float, topology: Topology, health: PipelineHealth,
                    fixed: bool) -> list[PollingSource]:
    """The BMCs' and CDUs' sources, checked against ``topology``: the --topology file's (``fixed``:
    it never grows) or the one derived from the source's first poll."""
    return (_bmc_sources(bmc, bmcs, bmc_interval, node, topology, health, fixed)
            + _cdu_sources(cdu, cdus, cdu_interval, topology, health))


def _bmc_sources(bmc: str | None, bmcs: dict[str, str], interval: float, node: str | None, topology: Topology,
                 health: PipelineHealth, fixed: bool = False) -> list[PollingSource]:
    """The BMCs' source, polled beside SOURCE. A URL alone is the BMC of the node ``--node`` names
    (else this machine's hostname): a node the topology lacks, its rows would never be read, so it
    is refused, saying where the name came from (a dcgm-exporter's ``Hostname`` is often not this
    machine's hostname). A ``fixed`` topology (``--topology``: it never grows) refuses a named node
    it lacks too; a derived one may take that node in later."""
    if not bmcs:
        return []
    named = node or socket.gethostname()
    if _urls_alone(bmc) and named not in topology.nodes:
        source = "--node" if node else "no --node: this machine's hostname"
        raise click.UsageError(f"--bmc: a URL alone is the BMC of node {named!r} ({source}), which is not in the "
                               f"topology (its nodes: {_shown(topology.nodes)}); name its node, --bmc NODE=URL, or "
                               "give --node NODE")
    missing = [name for name in bmcs if name not in topology.nodes] if fixed else []
    if missing:
        nodes = f"nodes {', '.join(map(repr, missing))} are" if len(missing) > 1 else f"node {missing[0]!r} is"
        raise click.UsageError(f"--bmc: {nodes} not in the --topology file (its nodes: {_shown(topology.nodes)}): a "
                               "BMC's rows would never be read; name the node as the file does, or add it to the file")
    try:
        # a derived topology may grow: the BMCs' rows are numbered by their own nodes then, and
        # _TopologyFollower puts them on the pipeline's topology of the moment, by name (numbered
        # by the first, a node taken in later had its rows refused as unknown for good)
        polled = RedfishSource(bmcs, interval=interval, topology=topology if fixed else None, health=health)
    except ValueError as exc:  # its settings from the environment (FORESHOCK_BMC_*)
        raise click.UsageError(f"--bmc: {exc}") from None
    if not fixed:  # its own nodes' topology, in the source's cluster (--cluster)
        polled.name_cluster(topology.cluster)
    return [polled]


def _shown(names: Sequence[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "") or "none"


def _cdu_sources(cdu: str | None, cdus: dict[str, str], interval: float, topology: Topology,
                 health: PipelineHealth) -> list[PollingSource]:
    """The CDUs' source, polled beside SOURCE; a loop the topology lacks is refused, and where a
    URL alone named it (after the URL's host name), the message says how to name it."""
    if not cdus:
        return []
    try:
        return [CduSource(cdus, topology, interval=interval, health=health)]
    except ValueError as exc:
        alone = [urlparse(url).hostname for url in _urls_alone(cdu)]
        hint = ("; a URL alone names its loop after the URL's host name: name the loop, --cdu LOOP=URL"
                if any(loop not in topology.loops for loop in alone) else "")
        raise click.UsageError(f"--cdu: {exc}{hint}") from None


class _TopologyFollower:
    """Moves the pipeline onto the source's new topology between the last frame mapped on the
    old one and the first mapped on the new one. The source may be polled in a thread of its own
    (``alongside``) ahead of the pipeline, so its current topology says nothing of the frames
    still queued: :meth:`mark`, on the source's side, puts a marker (an empty frame) before the
    first frame of a new topology, and :meth:`follow`, on the pipeline's, makes the move when the
    marker comes out.

    A source that tells each topology it took (``DcgmScrapeSource.taken_topologies``) has the
    pipeline moved through each in turn: a host forgotten and served again between two frames is
    dropped with its state, then taken in as a new host, as the source logged it (moved straight to
    the last topology, it kept its state by name, and the move's line said nothing was added or
    dropped; h20).

    The sources polled beside (a BMC's node frames) number their entities by a topology of their
    own (a BMC source with a derived topology: its nodes), or else by the first: their frames are
    renumbered here, by name, onto the pipeline's topology of the moment (a grown topology keeps
    the old nodes' slots, but one that forgot a host moves those after it down, and a node taken in
    after the start has no slot in the first). The rows of an entity the pipeline's topology does
    not list are left out, counted under their source's stage: one it listed before as no longer
    in the topology (a host forgotten), one it never listed as an unknown entity (a node not served
    yet), as the source would have counted it."""

    def __init__(self, polled: PollingSource, topology: Topology, beside: Sequence[PollingSource] = ()) -> None:
        self.polled = polled
        self.first = topology  # what the frames of a kind no source beside names are numbered by
        self.current = topology  # the source side's
        self.pipeline = topology  # the pipeline's
        self.moves: deque[tuple[Frame, Topology]] = deque()  # (marker, topology), in order
        self._stage_of = {kind: source.stage for source in beside for kind in source.reads}
        # per kind the sources beside read, what their frames are numbered by
        self._numbered_by = {kind: source.topology if source.topology is not None else topology
                             for source in beside for kind in source.reads}
        self._remaps: dict[str, tuple[Topology, Remap]] = {}  # per kind: (numbered by, onto the pipeline's)
        self._listed: dict[str, set[str]] = {}  # per kind, the entities beside the pipeline has listed
        self._note_listed()

    def mark(self, frames: Iterable[Frame]) -> Iterator[Frame]:
        for frame in frames:
            for topology in self._taken():
                self.current = topology
                marker = Frame.empty(frame.kind)
                self.moves.append((marker, topology))
                yield marker
            yield frame

    def _taken(self) -> list[Topology]:
        """The topologies the source took since the last frame, in order."""
        told = getattr(self.polled, "taken_topologies", None)
        taken: list[Topology] = told() if callable(told) else []
        for i, earlier in enumerate(taken):
            if earlier is self.current:  # taken before the follower began: the pipeline has it
                taken = taken[i + 1:]
                break
        topology = self.polled.topology
        if topology is not None and topology is not self.current and (not taken or taken[-1] is not topology):
            taken.append(topology)  # a source that does not tell: its current one
        return taken

    def follow(self, frames: Iterable[Frame], run: PipelineRun) -> Iterator[Frame]:
        for frame in frames:
            if self.moves and frame is self.moves[0][0]:
                _, topology = self.moves.popleft()
                move_run(run, topology, self.polled.stage)
                self.pipeline = topology
                self._remaps.clear()
                self._note_listed()
                continue
            if frame.kind not in self.polled.reads:
                frame = self._onto_pipeline(frame)
            yield frame

    def _onto_pipeline(self, frame: Frame) -> Frame:
        """A frame of a source beside, numbered on the pipeline's topology."""
        numbered_by = self._numbered_by.get(frame.kind, self.first)
        if numbered_by is self.pipeline:
            return frame
        cached = self._remaps.get(frame.kind)
        if cached is None or cached[0] is not numbered_by:
            cached = self._remaps[frame.kind] = (numbered_by, Remap(numbered_by, self.pipeline))
        return _renumbered(frame, numbered_by, cached[1], self.polled.health,
                           self._stage_of.get(frame.kind, self.polled.stage), self._listed.get(frame.kind))

    def _note_listed(self) -> None:
        """Note the entities beside that the pipeline's topology lists: a row of one it lists no
        longer is of a host forgotten, not of one still to come. Only the entities the frames
        beside are numbered by are kept (a BMC source's own: its list of BMCs)."""
        for kind, numbered_by in self._numbered_by.items():
            if kind in HARDWARE_KINDS:
                names = numbered_by.names(kind)
                listed = self.pipeline.slots(kind, names) >= 0
                self._listed.setdefault(kind, set()).update(name for name, ok in zip(names, listed) if ok)


def _renumbered(frame: Frame, old: Topology, remap: Remap, health: PipelineHealth, stage: str,
                listed: set[str] | None = None) -> Frame:
    """``frame`` (numbered by ``old``, the remap's old topology) with each row's slot in the new
    one; the rows of an entity the new one does not list are left out, counted under ``stage``
    and logged once with their names, never silently: one in ``listed`` (default: all) as no
    longer in the topology (a host the source forgot whose BMC still answers), any other as an
    unknown entity (a node the source does not serve yet). A kind that is not hardware (a job's)
    is left as it is."""
    if frame.kind not in remap.new_of_old:
        return frame
    slot = remap.slots(frame.kind, frame.slot)
    if np.array_equal(slot, frame.slot):
        return frame  # the common case: a grown topology keeps the old slots
    keep = slot >= 0
    if not keep.all():
        gone: dict[bool, list[str]] = {True: [], False: []}  # listed before -> names
        rows: dict[bool, int] = {True: 0, False: 0}
        for s in np.unique(frame.slot[~keep]):
            name = old.name(frame.kind, int(s)) if 0 <= s < old.size(frame.kind) else f"slot {s}"
            was_listed = listed is None or name in listed
            gone[was_listed].append(name)
            rows[was_listed] += int((frame.slot[~keep] == s).sum())
        if rows[True]:
            health.problem(stage, f"{frame.kind} no longer in the topology", rows[True],
                           detail=f"{', '.join(gone[True][:3])}: rows left out (a host the watch forgot: none of its "
                                  "GPUs served for --forget-after)")
        if rows[False]:
            health.problem(stage, f"unknown {frame.kind} entity", rows[False],
                           detail=f"{', '.join(gone[False][:3])}: not in the topology yet: rows left out until the "
                                  "source serves it")
    return dataclasses.replace(frame.take(keep), slot=slot[keep])


def _first_frame(frames: Iterator[Frame]) -> Frame | None:
    for frame in frames:
        if len(frame):
            return frame
    return None


def _problems(polled: PollingSource) -> str:
    counted = polled.health.problems
    if not counted:
        return "nothing was counted either"
    return "; ".join(f"{reason} ×{n}" for (_, reason), n in sorted(counted.items()))
