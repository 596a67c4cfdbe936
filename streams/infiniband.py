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
file should be), a non-numeric content. The RoCE congestion counters (mlx5 ``np_*``
notification-point and ``rp_*`` reaction-point names) do not exist on InfiniBand-layer ports;
their absence there is expected and not counted.

Legacy PortCounters saturate: each error counter stops at its native width's maximum (IBA
PortCounters; the widths are the kernel's, ``drivers/infiniband/core/sysfs.c`` ``PORT_PMA_ATTR``,
in :data:`NATIVE_BITS`) and stays there until software clears it. A ``link_downed`` at 255 or a
``symbol_error`` at 65535 moves no more: every increase after it reads as "no errors". Such a
counter is counted once as ``saturated`` when a reading finds it there (again after a clear and a
new climb), with a log line that names it and says how to clear it (``perfquery -R``). The value
goes on unchanged (the increase up to the maximum was real; the detectors see no increase after
it, and the problem counter says why).

The root is configurable (tests build a fixture tree; a container may mount the host's sysfs
elsewhere). Each port is the link ``<host>/<dev>/<port>`` unless ``link_names`` maps
``"<dev>/<port>"`` to a link of the cluster's topology.
"""

from __future__ import annotations

import logging
import math
import re
import socket
from collections import Counter
from pathlib import Path
from typing import Mapping

from foreshock.fields import source_index
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from .polling import PollingSource, count_once
from .samples import BatchBuilder, SampleBatch, host_link_topology

STAGE = "infiniband"
DEFAULT_ROOT = "/sys/class/infiniband"
_SUBDIRS = ("counters", "hw_counters", "")
_RATE = re.compile(r"^\s*([0-9.]+)\s*([KMGT]?)b/sec", re.IGNORECASE)
_RATE_UNIT = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_ROCE_ONLY = ("np_", "rp_")
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


def saturated_at(name: str) -> float:
    """Where the PortCounters file ``name`` stops (``inf`` for one not in :data:`NATIVE_BITS`)."""
    bits = NATIVE_BITS.get(name)
    return math.inf if bits is None else float(2**bits - 1)


def parse_state(text: str) -> float:
    """``4: ACTIVE`` -> 4."""
    return float(text.split(":", 1)[0])


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
    found = []
    for dev in sorted(p for p in base.iterdir() if (p / "ports").is_dir()) if base.is_dir() else []:
        for port in sorted((dev / "ports").iterdir(), key=lambda p: (len(p.name), p.name)):
            if port.is_dir():
                found.append((dev.name, port.name))
    return found


def read_infiniband(root: str | Path = DEFAULT_ROOT, host: str | None = None, ts: float = 0.0,
                    health: PipelineHealth | None = None,
                    link_names: Mapping[str, str] | None = None, once: set[str] | None = None,
                    saturated: set[str] | None = None) -> SampleBatch:
    """Read every port under ``root`` once: a link batch with one row per port. With ``once`` (a
    polling source's, :func:`count_once`), a counter file the port does not have counts the first
    time only: the driver will not grow it. With ``saturated`` (a polling source's: the
    ``dev/port/name`` of the counters at their maximum at the last reading), a counter found at
    its maximum counts once until a reading finds it cleared; without it, at every reading."""
    health = health if health is not None else PipelineHealth()
    host = host or socket.gethostname()
    lookup = source_index("sysfs")
    link_fields = {name: (f, scale) for name, (f, scale) in lookup.items() if f.kind == "link"}
    builder = BatchBuilder("link")
    problems: Counter[str] = Counter()
    details: dict[str, str] = {}
    ports = list_ports(root)
    if not ports:  # a wrong --root, or a node without the driver: said, not an empty success
        problems["no InfiniBand ports found"] += 1
        details["no InfiniBand ports found"] = f"{root}: " + ("no <device>/ports/<n> folders" if Path(root).is_dir()
                                                              else "no such folder")
    for dev, port in ports:
        port_dir = Path(root) / dev / "ports" / port
        try:
            layer = (_read(port_dir / "link_layer") or "").strip()
        except OSError:
            layer = ""
        values: dict[str, float] = {}
        for name, (field, scale) in link_fields.items():
            text = None
            try:
                for sub in _SUBDIRS:
                    text = _read(port_dir / sub / name)
                    if text is not None:
                        break
            except OSError as exc:
                problems["unreadable counter file"] += 1
                details.setdefault("unreadable counter file", f"{dev}/{port}/{name}: {exc.strerror or exc}")
                continue
            if text is None:
                if not (layer == "InfiniBand" and name.startswith(_ROCE_ONLY)) and \
                        count_once(once, f"{dev}/{port}/{name}"):
                    problems["counter file missing"] += 1
                    details.setdefault("counter file missing", f"{dev}/ports/{port}: {name}")
                continue
            try:
                if name == "state":
                    value = parse_state(text)
                elif name == "rate":
                    value = parse_rate(text)
                else:
                    value = float(int(text.strip()))
            except ValueError:
                problems["non-numeric counter value"] += 1
                details.setdefault("non-numeric counter value", f"{dev}/{port}/{name}: {text.strip()[:40]!r}")
                continue
            if sub == "counters" and name in NATIVE_BITS:
                _judge_saturation(f"{dev}/{port}/{name}", name, value, saturated, problems, details)
            values[field.name] = value * scale if math.isfinite(value) else math.nan
        key = f"{dev}/{port}"
        builder.add(ts, (link_names or {}).get(key, f"{host}/{key}"), values)
    for reason, count in problems.items():
        health.problem(STAGE, reason, count, detail=details.get(reason, ""))
    return builder.build()


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
                key, int(top), NATIVE_BITS[name])


def port_topology(host: str, ports: list[tuple[str, str]]) -> Topology:
    """One host's ports as links ``<host>/<dev>/<port>`` (see :func:`host_link_topology`)."""
    return host_link_topology(host, [(dev, f"{host}/{dev}/{port}") for dev, port in ports])


class InfinibandSource(PollingSource):
    """Reads the sysfs port counters every ``interval`` seconds; yields link frames."""

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
        self._topology = topology if topology is not None else port_topology(self.host, list_ports(self.root))

    def poll(self) -> list[Frame]:
        batch = read_infiniband(self.root, self.host, self.clock(), self.health, self.link_names, self.counted_once,
                                self.saturated)
        assert self._topology is not None
        return [batch.to_frame(self._topology, self.health, STAGE)]
