"""InfiniBand / RoCE port counters from sysfs, as link samples.

The kernel exposes each HCA port under ``/sys/class/infiniband/<dev>/ports/<n>/``::

    counters/port_xmit_data       "123456\\n"   (4-byte words; the table scales by 4)
    counters/port_xmit_wait, symbol_error, link_downed, ...
    hw_counters/np_ecn_marked_roce_packets, np_cnp_sent, rp_cnp_handled   (mlx5, RoCE)
    state                         "4: ACTIVE\\n"
    rate                          "400 Gb/sec (4X NDR)\\n"
    link_layer                    "InfiniBand\\n" or "Ethernet\\n"

Which files feed which link field is the field table's ``sysfs`` column; a name is looked up
in ``counters/``, then ``hw_counters/``, then the port folder itself. Counters stay raw (the
detectors compute rates and handle wraps). Every problem is counted under stage
``infiniband``: a missing counter file, an unreadable one (an I/O error, or a folder where a
file should be), a non-numeric content. A counter file reading ``N/A (no PMA)`` (the kernel's
text for a device without a PMA) is a counter the port does not serve, like a missing file:
no value, counted as ``counter not available``. The RoCE congestion counters (mlx5 ``np_*``
notification-point and ``rp_*`` reaction-point names) do not exist on InfiniBand-layer ports;
their absence there is expected and not counted.

Legacy PortCounters saturate: each error counter stops at its native width's maximum (IBA
PortCounters; the widths are the kernel's, ``drivers/infiniband/core/sysfs.c`` ``PORT_PMA_ATTR``,
in :data:`NATIVE_BITS`) and stays there until software clears it. A ``link_downed`` at 255 or a
``symbol_error`` at 65535 moves no more: every increase after it reads as "no errors". Such a
counter is counted once as ``saturated`` when a reading finds it there (again after a clear and a
new climb), with a log line that names it and says how to clear it (``perfquery -R``). The value
goes on unchanged (the increase up to the maximum was real; the detectors see no increase after
it, and the problem counter says why). The data counters ``port_xmit_data`` and ``port_rcv_data``
stop at 2**32-1 where the HCA serves them from 32-bit PortCounters, but a 64-bit one passes there:
one is counted as ``saturated`` when it reads exactly 2**32-1 at two consecutive readings
(:data:`LEGACY_DATA_COUNTERS`).

A port its topology lists that is not under sysfs (an HCA reset, a driver reload, a NIC fallen
off the bus: FACTS.md "NIC lost") is counted as ``port disappeared``, once each time it goes (a
polling source's), with a log line naming it, and gets a row with ``link_state`` DOWN at every
reading while it is gone: its link is down, and that row is how the detectors read it leave
ACTIVE; its counters cannot say it (the port comes back with them cleared: ``link_downed``
reads as a reset, not an increase). A port found under sysfs whose folder is gone by the time
its files are read (it went between the listing and the reading) is such a port too: its missing
files are not counted, nor remembered as ones it does not serve.

The root is configurable (tests build a fixture tree; a container may mount the host's sysfs
elsewhere). Each port is the link ``<host>/<dev>/<port>`` unless ``link_names`` maps
``"<dev>/<port>"`` to a link of the cluster's topology. A topology :class:`InfinibandSource`
derives (no topology given) lists the ports found when it starts, or at the first poll that
finds any; one found later is taken in with :attr:`InfinibandSource.takes_in_new_ports` (see there).
"""

from __future__ import annotations

import logging
import math
import re
import socket
from collections import Counter, deque
from pathlib import Path
from typing import Mapping

from foreshock import facts
from foreshock.fields import source_index
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .dcgm import TAKEN_MAX, TOLD_MAX, UNLISTED_POLLS
from .polling import PollingSource, not_yet_told, steady_unlisted
from .samples import BatchBuilder, SampleBatch, host_link_topology, parse_count

STAGE = "infiniband"
DEFAULT_ROOT = "/sys/class/infiniband"
_SUBDIRS = ("counters", "hw_counters", "")
_RATE = re.compile(r"^\s*([0-9.]+)\s*([KMGT]?)b/sec", re.IGNORECASE)
_RATE_UNIT = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_ROCE_ONLY = ("np_", "rp_")
_NOT_AVAILABLE = "N/A"
"""How a counter file starts on a device without a PMA (``drivers/infiniband/core/sysfs.c``
``show_pma_counter`` writes ``N/A (no PMA)``: iWARP and some RoCE devices)."""
log = logging.getLogger("foreshock.infiniband")

NATIVE_BITS: dict[str, int] = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8, "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16, "port_xmit_wait": 32,
}
"""Native widths of the PortCounters files under ``counters/`` (IBA PortCounters, as the kernel's
``sysfs.c`` reads them). Each saturates at ``2**bits - 1``. The data and packet counters are not
listed: the kernel serves them from PortCountersExtended (64 bits) where the HCA has it, the file
does not say which it is, and a 64-bit one passes 2**32-1 on its way up."""
SATURATED = "saturated counter: stuck at its native maximum, its increases are no longer seen (clear it: perfquery -R)"
DISAPPEARED = "port disappeared"
NOT_AVAILABLE = "counter not available (N/A: the device has no PMA)"


LEGACY_DATA_COUNTERS = ("port_xmit_data", "port_rcv_data")
"""The data counters kept out of :data:`NATIVE_BITS`: from PortCounters (32 bits, where an HCA has
no PortCountersExtended) they stop at 2**32-1, and an idle-looking link is then a saturated one. A
64-bit one passes 2**32-1 once on its way up, so one is counted as ``saturated`` when it reads
exactly 2**32-1 at two consecutive readings (as :data:`foreshock.detectors.counters.SATURATED_AT`
is judged: held for the next reading)."""
LEGACY_DATA_TOP = float(2**32 - 1)
_ONCE_AT_TOP = " (at 2**32-1 once)"


def saturated_at(name: str) -> float:
    """Where the PortCounters file ``name`` stops (``inf`` for one not in :data:`NATIVE_BITS`
    nor :data:`LEGACY_DATA_COUNTERS`)."""
    if name in LEGACY_DATA_COUNTERS:
        return LEGACY_DATA_TOP
    bits = NATIVE_BITS.get(name)
    return math.inf if bits is None else float(2**bits - 1)


PORT_STATES = range(6)
"""``enum ib_port_state``: NOP, DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER (the kernel prints any
other number as ``N: UNKNOWN``)."""


def parse_state(text: str) -> float:
    """``4: ACTIVE`` -> 4; ValueError for anything but a known port state (:data:`PORT_STATES`):
    ``float()`` read ``nan: ACTIVE`` as NaN and ``-4: ACTIVE`` as -4, uncounted."""
    value = parse_count(text.split(":", 1)[0])
    if value not in PORT_STATES:
        raise ValueError(f"not a known port state: {value}")
    return float(value)


def parse_rate(text: str) -> float:
    """``400 Gb/sec (4X NDR)`` -> 4.0e11 bits per second."""
    m = _RATE.match(text)
    if m is None:
        raise ValueError(f"not a port rate: {text.strip()!r}")
    return float(m.group(1)) * _RATE_UNIT[m.group(2).lower()]


def _read(path: Path) -> str | None:
    """File text, or None when it does not exist; other I/O problems raise OSError."""
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return None


def list_ports(root: str | Path = DEFAULT_ROOT) -> list[tuple[str, str]]:
    """``[(dev, port), ...]`` present under ``root``, sorted."""
    base = Path(root)
    found: list[tuple[str, str]] = []
    try:
        devices = sorted(p for p in base.iterdir() if (p / "ports").is_dir()) if base.is_dir() else []
    except (FileNotFoundError, NotADirectoryError):  # the root went between is_dir() and iterdir()
        return found
    for dev in devices:
        try:
            ports = [(dev.name, port.name) for port in sorted((dev / "ports").iterdir(),
                                                              key=lambda p: (len(p.name), p.name)) if port.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            # the device went between its is_dir() and its listing (an HCA reset): left out, as a
            # device already gone is, so its ports read as gone (read_infiniband's ``expected``), and
            # the other devices' ports are read; raised, the whole poll was lost
            continue
        found += ports
    return found


def expected_ports(topology: Topology, host: str, link_names: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ports of ``host`` that ``topology`` lists, ``"<dev>/<port>"`` -> link name: those
    ``link_names`` maps onto one of its links, and its links named ``<host>/<dev>/<port>`` (unless
    ``link_names`` maps that port elsewhere)."""
    names = dict(link_names or {})
    listed = set(topology.names("link"))
    expected = {key: name for key, name in names.items() if name in listed}
    prefix = f"{host}/"
    for name in listed:
        key = name[len(prefix):] if name.startswith(prefix) else ""
        dev, sep, port = key.partition("/")
        if dev and sep and port and "/" not in port and key not in names:
            expected[key] = name
    return expected


def read_infiniband(root: str | Path = DEFAULT_ROOT, host: str | None = None, ts: float = 0.0,
                    health: PipelineHealth | None = None,
                    link_names: Mapping[str, str] | None = None, once: set[str] | None = None,
                    saturated: set[str] | None = None, expected: Mapping[str, str] | None = None,
                    missing: set[str] | None = None, ports: list[tuple[str, str]] | None = None) -> SampleBatch:
    """Read every port under ``root`` once: a link batch with one row per port. With ``once`` (a
    polling source's, :func:`count_once`), a counter file the port does not have, or one reading
    ``N/A``, counts the first time only: the driver will not grow it. With ``saturated`` (a polling
    source's: the ``dev/port/name`` of the counters at their maximum at the last reading), a counter
    found at its maximum counts once until a reading finds it cleared; without it, at every reading.

    ``expected`` (``"<dev>/<port>"`` -> link name: :func:`expected_ports`) are the ports the caller's
    topology lists: each one not under ``root`` gets a row of its link with ``link_state`` DOWN
    and nothing else, and is counted as ``port disappeared`` — with ``missing`` (a polling
    source's: the ports missing at the last reading, updated here), once until a reading finds
    it again, with a log line naming it each time it goes; without it, at every reading.
    ``ports``: what :func:`list_ports` found under ``root``, where the caller has listed them."""
    health = health if health is not None else PipelineHealth()
    host = host or socket.gethostname()
    lookup = source_index("sysfs")
    link_fields = {name: (f, scale) for name, (f, scale) in lookup.items() if f.kind == "link"}
    builder = BatchBuilder("link")
    problems: Counter[str] = Counter()
    details: dict[str, str] = {}
    ports = list_ports(root) if ports is None else ports
    if not ports:  # a wrong --root, or a node without the driver: said, not an empty success
        problems["no InfiniBand ports found"] += 1
        details["no InfiniBand ports found"] = f"{root}: " + ("no <device>/ports/<n> folders" if Path(root).is_dir()
                                                              else "no such folder")
    vanished: set[str] = set()
    for dev, port in ports:
        port_dir = Path(root) / dev / "ports" / port
        try:
            layer = (_read(port_dir / "link_layer") or "").strip()
        except OSError:
            layer = ""
        values: dict[str, float] = {}
        # this port's problems, its count-once keys and its counters' readings are kept aside until
        # its folder is known to be still there (below)
        port_problems: Counter[str] = Counter()
        port_details: dict[str, str] = {}
        port_once: list[str] = []
        at_counters: dict[str, float] = {}
        for name, (field, scale) in link_fields.items():
            text = None
            try:
                for sub in _SUBDIRS:
                    text = _read(port_dir / sub / name)
                    if text is not None:
                        break
            except OSError as exc:
                port_problems["unreadable counter file"] += 1
                port_details.setdefault("unreadable counter file", f"{dev}/{port}/{name}: {exc.strerror or exc}")
                continue
            if text is None:
                if not (layer == "InfiniBand" and name.startswith(_ROCE_ONLY)) and \
                        _first_time(once, f"{dev}/{port}/{name}", port_once):
                    port_problems["counter file missing"] += 1
                    port_details.setdefault("counter file missing", f"{dev}/ports/{port}: {name}")
                continue
            if text.strip().startswith(_NOT_AVAILABLE):
                # the device has no PMA to ask: it will never serve this counter, as if the file were
                # not there; counted at every poll it would keep a healthy host's problems climbing
                if _first_time(once, f"{dev}/{port}/{name}", port_once):
                    port_problems[NOT_AVAILABLE] += 1
                    port_details.setdefault(NOT_AVAILABLE, f"{dev}/{port}/{name}: {text.strip()[:40]!r}")
                continue
            try:
                if name == "state":
                    value = parse_state(text)
                elif name == "rate":
                    value = parse_rate(text)
                else:
                    # (not held to the counter's native width: the simulator's sysfs writer, and so
                    # a replay through it, gives its 32-bit xmit_wait 64 bits)
                    value = float(parse_count(text))
            except ValueError:
                port_problems["non-numeric counter value"] += 1
                port_details.setdefault("non-numeric counter value", f"{dev}/{port}/{name}: {text.strip()[:40]!r}")
                continue
            if sub == "counters":
                at_counters[name] = value
            values[field.name] = value * scale if math.isfinite(value) else math.nan
        key = f"{dev}/{port}"
        if not port_dir.is_dir():
            # listed, then gone before its files were read (an HCA reset, a driver reload): gone, as a
            # port not listed is. Its missing files say nothing of what it serves, and kept in ``once``
            # they would hide a counter truly missing once it is back
            vanished.add(key)
            continue
        problems.update(port_problems)
        for reason, detail in port_details.items():
            details.setdefault(reason, detail)
        if once is not None:
            once.update(port_once)
        for name, value in at_counters.items():
            if name in NATIVE_BITS:
                _judge_saturation(f"{key}/{name}", name, value, saturated, problems, details)
            elif name in LEGACY_DATA_COUNTERS:
                _judge_held_top(f"{key}/{name}", name, value, saturated, problems, details)
        builder.add(ts, (link_names or {}).get(key, f"{host}/{key}"), values)
    if expected:
        _gone(expected, {f"{dev}/{port}" for dev, port in ports} - vanished, ts, builder, missing, problems, details)
    for reason, count in problems.items():
        health.problem(STAGE, reason, count, detail=details.get(reason, ""))
    return builder.build()


def _gone(expected: Mapping[str, str], found: set[str], ts: float, builder: BatchBuilder, missing: set[str] | None,
          problems: Counter[str], details: dict[str, str]) -> None:
    """A DOWN row for each port of ``expected`` not ``found``, counted (with ``missing``: when it
    was found at the last reading, or never read yet), and ``missing`` updated."""
    down = {"link_state": float(facts.IB_PORT_STATE_DOWN)}
    for key, link in expected.items():
        if key in found:
            if missing is not None and key in missing:
                missing.discard(key)
                log.warning("%s (link %s) is back under sysfs; counters it restarted from 0 read as a reset, "
                            "not as errors", key, link)
            continue
        # the link is down while its port is gone: a row saying so is how the detectors see it
        # leave ACTIVE (it comes back with link_downed cleared to 0, a reset, not a down)
        builder.add(ts, link, down)
        if missing is not None:
            if key in missing:
                continue
            missing.add(key)
        problems[DISAPPEARED] += 1
        details.setdefault(DISAPPEARED, f"{key} (link {link})")
        # named every time one goes: the health log names only the first (stage, reason)
        log.warning("%s (link %s) is listed in the topology but not under sysfs: the HCA reset, its driver "
                    "reloaded, or it fell off the bus; its link reads as DOWN until it is back", key, link)


def _first_time(once: set[str] | None, key: str, taken: list[str]) -> bool:
    """:func:`count_once` that leaves ``once`` as it is: ``key`` is put in ``taken`` for the
    caller to add once the reading is known to stand."""
    if once is not None and key in once:
        return False
    taken.append(key)
    return True


def _judge_held_top(key: str, name: str, value: float, saturated: set[str] | None,
                    problems: Counter[str], details: dict[str, str]) -> None:
    """Judge a legacy 32-bit data counter (:data:`LEGACY_DATA_COUNTERS`) as
    :func:`_judge_saturation` does, from the second consecutive reading of exactly 2**32-1: a
    64-bit one passes there once, a 32-bit one stops there. Without ``saturated`` (no last reading
    known) it is never counted. ``saturated`` keeps ``key`` plus :data:`_ONCE_AT_TOP` for a
    counter read there once."""
    once_there = key + _ONCE_AT_TOP
    if saturated is None or value != LEGACY_DATA_TOP:
        if saturated is not None:
            saturated.discard(once_there)
            saturated.discard(key)
        return
    if once_there not in saturated:
        saturated.add(once_there)
        return
    _judge_saturation(key, name, value, saturated, problems, details)


def _judge_saturation(key: str, name: str, value: float, saturated: set[str] | None,
                      problems: Counter[str], details: dict[str, str]) -> None:
    """Count ``key`` (``dev/port/name``) when it reads at its native maximum and was not there at
    the last reading (``saturated`` is updated: a cleared counter is judged again)."""
    top = saturated_at(name)
    if value != top:
        if saturated is not None:
            saturated.discard(key)
        return
    if saturated is not None:
        if key in saturated:
            return
        saturated.add(key)
    problems[SATURATED] += 1
    details.setdefault(SATURATED, key)
    # named every time one gets there: the health log names only the first (stage, reason)
    log.warning("%s is at %d, the maximum of its %d-bit PortCounters register: it no longer counts, so its "
                "link reads as free of what it counts from here on; clear the port's counters (perfquery -R)",
                key, int(top), NATIVE_BITS.get(name, 32))


def port_topology(host: str, ports: list[tuple[str, str]], link_names: Mapping[str, str] | None = None,
                  cluster: str | None = None) -> Topology:
    """One host's ports as links ``<host>/<dev>/<port>``, or as ``link_names`` names them
    (``"<dev>/<port>"`` -> link; see :func:`host_link_topology`)."""
    names = link_names or {}
    return host_link_topology(host, [(dev, names.get(f"{dev}/{port}", f"{host}/{dev}/{port}")) for dev, port in ports],
                              cluster)


class InfinibandSource(PollingSource):
    """Reads the sysfs port counters every ``interval`` seconds; yields link frames.

    The topology is the one given, or derived from the ports found (:func:`port_topology`): at
    construction, or at the first poll that finds any (no frame before). A port it lists that is
    gone from sysfs reads as DOWN and is counted (the module docstring). A port it does not list
    is counted as an unknown entity at every poll and logged once, saying to add it to the
    topology file (a given one) or to restart (a derived one); with :attr:`takes_in_new_ports`
    and a derived topology, one found in :data:`~foreshock.streams.dcgm.UNLISTED_POLLS`
    consecutive polls is taken in instead, as the dcgm source takes in GPUs: :attr:`topology`
    becomes a new one (the ports listed keep their slots, the new ones follow) from that poll's
    frame on, and :meth:`taken_topologies` tells each one taken. Ports are never dropped: a port
    gone stays listed, read as DOWN."""

    stage = STAGE
    reads = ("link",)

    def __init__(self, root: str | Path = DEFAULT_ROOT, interval: float = 1.0, host: str | None = None,
                 topology: Topology | None = None, link_names: Mapping[str, str] | None = None,
                 health: PipelineHealth | None = None, max_polls: int | None = None) -> None:
        super().__init__(interval, health, max_polls)
        self.root = Path(root)
        self.host = host or socket.gethostname()
        self.link_names = dict(link_names or {})
        self.saturated: set[str] = set()  # counters at their maximum at the last poll (read_infiniband)
        self.missing: set[str] = set()  # "dev/port" listed and not under sysfs at the last poll (read_infiniband)
        self.takes_in_new_ports = False
        self._derived = topology is None
        self._ports: list[tuple[str, str]] = []  # the ports a derived topology lists, in its link order
        self._unlisted_polls: dict[tuple[str, str], int] = {}  # ports it lacks: polls in a row finding them
        self._told: set[str] = set()  # ports logged as missing from the topology
        self._taken: deque[Topology] = deque(maxlen=TAKEN_MAX)  # the topologies taken since taken_topologies()
        self._expected: dict[str, str] = {}
        self._expected_of: Topology | None = None  # the topology _expected was worked out for
        self._topology = topology
        if self._derived:
            self._derive(list_ports(self.root))

    def poll(self) -> list[Frame]:
        now = self.clock()
        ports = list_ports(self.root)
        if self._derived:
            if self._topology is None:
                self._derive(ports)
            else:
                self._follow(ports)
        topology = self._topology
        if topology is not self._expected_of:
            self._expected = expected_ports(topology, self.host, self.link_names) if topology is not None else {}
            self._expected_of = topology
        batch = read_infiniband(self.root, self.host, now, self.health, self.link_names, self.counted_once,
                                self.saturated, self._expected, self.missing, ports)
        if topology is None:  # no port found yet (counted by read_infiniband): nothing to number rows by
            return []
        return [batch.to_frame(topology, self.health, STAGE)]

    def taken_topologies(self) -> list[Topology]:
        """The topologies this source has taken in (:attr:`takes_in_new_ports`) since the last call,
        oldest first (as ``DcgmScrapeSource.taken_topologies``)."""
        taken = list(self._taken)
        self._taken.clear()
        return taken

    def _derive(self, ports: list[tuple[str, str]]) -> None:
        if ports:
            self._ports = list(ports)
            self._topology = port_topology(self.host, self._ports, self.link_names, self.cluster)

    def _follow(self, ports: list[tuple[str, str]]) -> None:
        """Take in the ports a derived topology lacks once found in :data:`UNLISTED_POLLS`
        consecutive polls (:attr:`takes_in_new_ports`); otherwise log each one once, saying what to do."""
        listed = set(self._ports)
        unlisted = [p for p in ports if p not in listed]
        if self.takes_in_new_ports:
            self._unlisted_polls, steady = steady_unlisted(self._unlisted_polls, unlisted, UNLISTED_POLLS)
            if not steady:
                return
            self._ports += sorted(steady, key=lambda p: (p[0], len(p[1]), p[1]))
            self._topology = port_topology(self.host, self._ports, self.link_names, self.cluster)
            self._taken.append(self._topology)
            log.warning("%s: took in %d port%s found after the start: %s; the topology now lists %d links",
                        STAGE, len(steady), "" if len(steady) == 1 else "s",
                        ", ".join(f"{dev}/{port}" for dev, port in steady), len(self._ports))
            return
        new = not_yet_told(self._told, (f"{dev}/{port}" for dev, port in unlisted), TOLD_MAX)
        if not new:
            return
        log.warning("%s: %d port%s not in the topology (found after it was derived), their samples counted as unknown "
                    "link entities: %s; restart to watch them", STAGE, len(new), "" if len(new) == 1 else "s",
                    ", ".join(new))
