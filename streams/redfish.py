"""Redfish: read each node's chassis fans and power from its BMC, and each cooling loop's coolant
from its CDU, on an interval (:class:`RedfishSource`: node frames; :class:`CduSource`: rack frames).

A node's BMC (baseboard management controller) serves the DMTF Redfish REST API, usually over
HTTPS with HTTP basic authentication. Per node, every chassis listed under
``/redfish/v1/Chassis`` is read:

* **fans**: the chassis's ``Thermal`` resource (``Fans[]``: ``Reading`` in ``ReadingUnits``
  ``RPM`` or ``Percent``), or, on BMCs with the newer thermal model, each member of
  ``ThermalSubsystem/Fans`` (``SpeedPercent.Reading``, in percent). The node's ``fan_speed`` is
  its **slowest** fan as a share of full speed: one stopped fan is the failure (the BMC's "fan
  speed critical"), and a mean over eight fans would hide it. An RPM reading is divided by the
  fan's ``MaxReadingRange`` (the sensor's highest possible reading, which is the fan's full speed
  on many BMCs), or by ``fan_max_rpm`` where the BMC gives no range or OpenBMC's default 25000
  RPM (:data:`OPENBMC_DEFAULT_MAX_RPM`: no reference); without either the reading cannot be put
  on that scale and is counted, not guessed (except 0 RPM: a stopped fan is 0 on any scale).
  A fan whose ``Status``
  says it is ``Absent`` or ``Disabled`` (an empty bay) is left out; one that gives no reading
  but reports ``Health: Critical`` counts as stopped.
* **power**: ``Power.PowerControl[].PowerConsumedWatts``, or the chassis's
  ``EnvironmentMetrics.PowerWatts.Reading``. The node's ``psu_power`` is the largest chassis
  draw, not their sum: a server chassis reports what its GPU baseboard chassis draws too. A
  reading that is not a number or negative is counted, as a fan's is; a null one at each poll
  where the node gave no draw at all, else once (a sensor with no reading beside the one read),
  as an entry without the reading's property at all is.

Where a node's chassis keep their fans and power is discovered at its first poll and
remembered. It is discovered again only where it may no longer hold: the BMC unreachable
(connection refused or reset: rebooted), the credentials refused (401), or a resource found at
discovery, or a listed chassis, answering 404 (once: a link that answers 404 again after that
is left out, counted once, :class:`Relisting`); a read cut short for time (the connect or TLS
handshake included), or one resource's other HTTP error, keeps it (a node whose discovery and
first read together did not fit in one poll was discovered again at every poll, and never had
a row). One resource that fails (an HTTP error, 403 included, counted once: the account may not
read it; a body that is not JSON or not an object) costs only its own readings, and one chassis
that cannot be discovered only its own, tried again at the next poll; the node fails as a whole
(no row) when its Chassis collection fails, its BMC is unreachable, refuses the credentials, or
is cut short for time. A node whose BMC answered but gave neither fan speed nor power has no
row either, counted at each such poll (:data:`NODE_NOTHING_READ`).

Nodes are polled in parallel (a BMC takes 0.1–2 s per request), and a poll waits for them at
most its interval (or a little more than one request's ``timeout``, if longer): a BMC still
answering then is cut short and counted
(``BMC answer too slow``), its connection closed, so that no thread is left reading it once
the poll has returned. One request may take ``timeout`` seconds in all, from resolving the
BMC's host name to the body's last byte, and bring at most :data:`MAX_ANSWER_BYTES` (urllib's
timeout bounds each socket operation only: a BMC sending its headers or body a byte at a time
held its thread for hours; and ``getaddrinfo`` has no timeout at all: a hung resolver held it
for as long as it hung, see :class:`HostLookups`). A proxy named by the environment
(``https_proxy``, ``http_proxy``, ``no_proxy``, as urllib reads them) is used, its answer to
CONNECT bound by the same deadline. Every failure is counted in
:class:`~foreshock.health.PipelineHealth` under stage ``redfish`` with the node named (an
unreachable BMC, refused credentials, an HTTP error, a body that is not JSON or not a JSON
object, a fan or power reading that is null, not a number or out of range, an answer the code
did not expect) and the poll goes on with the other nodes; a node that gave nothing has no row
in that poll's frame. Fans in RPM that no full speed can be put on (no usable
``MaxReadingRange``, no ``fan_max_rpm``), a resource the account may not read, a power entry
with no reading are the BMC's configuration, not bad input: counted once per node.

The credentials go to the BMC's own origin only: a link (``@odata.id``) that is not a path on
the BMC, or a redirect to another scheme, host or port, is refused and counted, never followed
(urllib's redirect handler carries the ``Authorization`` header to whatever host a 302 names).

Usage (one BMC per node; credentials from the environment, never the command line, both or
neither: a password without a user is refused, it sent no credentials at all)::

    FORESHOCK_BMC_USER=admin FORESHOCK_BMC_PASSWORD=... \\
        foreshock record --source redfish --url node7=https://10.0.0.7,node8=https://10.0.0.8 --out rec
"""

from __future__ import annotations

import base64
import http.client
import io
import ipaddress
import json
import math
import os
import queue
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar, cast
from urllib.parse import urlparse

import numpy as np

from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import UNKNOWN, Topology

from .polling import DERIVED_CLUSTER, PollingSource, count_once
from .samples import SampleBatch

STAGE = "redfish"
SERVICE_ROOT = "/redfish/v1/"
ABSENT_STATES = frozenset({"Absent", "Disabled"})
"""Fan ``Status.State`` values that mean no fan is there to read (an empty bay, a fan switched off)."""

Fetch = Callable[[str], Any]

MAX_ANSWER_BYTES = 16 << 20
"""The most one Redfish answer may bring (a node's Thermal resource is a few kB; a BMC's
collection of hundreds of sensors, a few hundred kB): a longer one is refused, not held in memory."""
READ_CHUNK_BYTES = 64 << 10

TOO_SLOW = "BMC answer too slow"
TOO_LARGE = "BMC answer too large"
UNREACHABLE = "BMC unreachable"
CREDENTIALS_REFUSED = "BMC refused the credentials"
OFF_ORIGIN = "BMC link off its own host refused"
REDIRECTED_AWAY = "BMC redirect to another host refused"
NO_FULL_SPEED = "fan RPM without a full-speed reference (set FORESHOCK_BMC_FAN_MAX_RPM)"
SENSOR_RANGE_ONLY = ("fan RPM over OpenBMC's default 25000 RPM sensor range, not a full speed "
                     "(set FORESHOCK_BMC_FAN_MAX_RPM)")
OUT_OF_RANGE = "fan reading out of range"
POWER_NOT_A_NUMBER = "power reading is not a number"
POWER_OUT_OF_RANGE = "power reading out of range"
NO_POWER_READING = "no power reading"
NODE_NOTHING_READ = "BMC gave neither fan speed nor power"
"""Counted for a node left out of its poll's frame though its BMC answered: none of its fans
could be put on a full speed, and no draw was read (or it lists no chassis)."""

OPENBMC_DEFAULT_MAX_RPM = 25000.0
"""The ``MaxReadingRange`` OpenBMC gives a fan when its platform configuration names no range:
bmcweb copies the D-Bus sensor's ``MaxValue``, which dbus-sensors (``src/FanMain.cpp``,
``defaultMaxReading``) sets to 25000 RPM. It is the tach sensor's range, no fan's full speed:
a healthy fan at 2400 RPM over it read 0.096 of full speed, "stopped" to the cooling detector."""


class RedfishError(Exception):
    """A request the BMC did not answer with JSON; ``reason`` is the counted problem, ``status``
    the HTTP status where the BMC answered with an error one."""

    def __init__(self, reason: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.status = status

    @property
    def ends_the_read(self) -> bool:
        """Whether the device's whole read stops here: its BMC unreachable, the credentials
        refused (401), or the poll's time up, every request after this one would fail the same way.
        Any other failure (an HTTP error, 403 included: the account may not read that resource, a
        body that is not JSON or not an object, a link refused) is the problem of the resource
        asked only."""
        return self.reason in (UNREACHABLE, CREDENTIALS_REFUSED, TOO_SLOW)

    @property
    def outdates_discovery(self) -> bool:
        """Whether what was discovered of the device may no longer hold, so that it is discovered
        again at the next poll: the BMC unreachable (rebooted, reset: connection refused or
        reset) or the credentials refused (reset to its defaults). A resource found at discovery
        answering 404 may mean that too, once (:class:`Relisting`). A timeout or any other HTTP
        error says nothing of the structure: discovering again then only made a node that needs
        more than one poll's time for discovery and reading together never get a row."""
        return self.reason in (UNREACHABLE, CREDENTIALS_REFUSED)


LISTED_BUT_GONE = "BMC lists a resource that answers 404"
"""Counted once per device and path: a link that answered 404 again after the device was
discovered afresh for its first 404 (:class:`Relisting`)."""


class Relisting:
    """Which links' 404 had each device (a node's BMC, a loop's CDU) discovered afresh.

    A resource found at discovery that answers 404 may be gone for good (a chassis that came back
    under a new id): the device is discovered again at the next poll, once. If that fresh
    discovery lists the same link and it answers 404 again, the BMC lists what it does not serve
    (stale firmware, a link to a sensor that is not there): the link is left out of the plan,
    counted once (:data:`LISTED_BUT_GONE`), and not discovered again for it (a chassis is still
    looked for at each poll, one request: it may only not be up yet). Discovering again at
    every poll cost a slow BMC's node its row at two polls of three, and every BMC its whole tree
    again at every poll."""

    def __init__(self) -> None:
        self._gone_before: dict[str, frozenset[str]] = {}

    def gone_before(self, device: str) -> frozenset[str]:
        """The links whose 404 had ``device``'s current discovery made (and that still answer 404)."""
        return self._gone_before.get(device, frozenset())

    def after_read(self, device: str, gone: Sequence[str], gone_again: Sequence[str]) -> bool:
        """Note a whole read of ``device``: the links that answered 404 for the first time
        (``gone``) and again (``gone_again``). Returns whether to discover it again."""
        still = frozenset(gone) | frozenset(gone_again)
        if still:
            self._gone_before[device] = still
        else:
            self._gone_before.pop(device, None)
        return bool(gone)

    def forget(self, device: str) -> None:
        """The device is discovered again for another reason (rebooted): its links start afresh."""
        self._gone_before.pop(device, None)


@dataclass
class FanReadings:
    """What one node's fans said in one poll: shares of full speed, and the problems met reading
    the node (its fans' and its power resources'), with the first detail of each."""

    shares: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict)
    facts: list[tuple[str, str, str]] = field(default_factory=list)  # (reason, what, detail): counted once per node
    gone: list[str] = field(default_factory=list)  # links found at discovery answering 404 (:class:`Relisting`)
    gone_again: list[str] = field(default_factory=list)  # ... again, after the discovery their first 404 made

    def problem(self, reason: str, detail: str = "") -> None:
        self.problems.append(reason)
        if detail:
            self.details.setdefault(reason, detail)

    def fact(self, reason: str, what: str, detail: str = "") -> None:
        """The BMC's configuration, the same at every poll (fans with no full speed, a sensor with
        no reading beside one that has it, a resource the account may not read): counted once
        for the node and ``what``, not at every poll."""
        self.facts.append((reason, what, detail))

    def slowest(self) -> float:
        return min(self.shares) if self.shares else math.nan


def _number(value: Any) -> float | None:
    """A JSON number as a float (None for null, text, booleans, NaN and infinities)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _status(entry: Mapping[str, Any]) -> tuple[str, str]:
    status = entry.get("Status")
    if not isinstance(status, Mapping):
        return "", ""
    return str(status.get("State") or ""), str(status.get("Health") or "")


def fan_share(entry: Mapping[str, Any], fan_max_rpm: float | None = None) -> tuple[float | None, str]:
    """One fan entry (a ``Thermal.Fans[]`` item or a ``ThermalSubsystem`` Fan) as a share of full speed.

    Returns ``(share, "")``, ``(None, "")`` for a bay with no fan, or ``(None, problem)``; a
    reading no fan gives (below 0, or a percentage over 100) is a problem (:data:`OUT_OF_RANGE`).
    An RPM reading is put over the fan's ``MaxReadingRange``: DMTF defines that as the sensor's
    highest possible reading, which many BMCs set to the fan's full speed, but not OpenBMC's
    default (:data:`OPENBMC_DEFAULT_MAX_RPM`), which is no reference at all. Where the range is
    that default or missing, the reading is put over ``fan_max_rpm`` (the site's figure), and
    without one it is a problem (:data:`SENSOR_RANGE_ONLY`, :data:`NO_FULL_SPEED`). The site's
    figure is one for the whole fleet: taken over every BMC's own range it put a vendor BMC's
    6000-RPM fan idling at 25 % under the 10 % "stopped" line, once it was set for the OpenBMC
    nodes' 16000-RPM fans.
    """
    state, health = _status(entry)
    if state in ABSENT_STATES:
        return None, ""
    speed_percent = entry.get("SpeedPercent")
    if isinstance(speed_percent, Mapping):  # ThermalSubsystem Fan (Redfish 2020.4+)
        raw = speed_percent.get("Reading")
        reading, units = _number(raw), "Percent"
    else:
        raw = entry.get("Reading")
        reading, units = _number(raw), str(entry.get("ReadingUnits") or "RPM")
    if reading is None:
        if raw is not None:
            return None, "fan reading is not a number"
        if health == "Critical":
            return 0.0, ""  # the BMC says it failed and has no speed to show: a stopped fan
        return None, "fan without a reading"
    if units.lower() in ("percent", "percentage"):
        if not 0 <= reading <= 100:  # a -1 % made the node's fan_speed -0.01
            return None, OUT_OF_RANGE
        return reading / 100.0, ""
    if reading < 0:
        return None, OUT_OF_RANGE
    if reading == 0:
        return 0.0, ""  # a stopped fan reads 0 on any scale: no full-speed reference needed
    full = _number(entry.get("MaxReadingRange"))
    if full is not None and full > 0 and full != OPENBMC_DEFAULT_MAX_RPM:
        return reading / full, ""
    if fan_max_rpm:
        return reading / fan_max_rpm, ""
    return None, SENSOR_RANGE_ONLY if full == OPENBMC_DEFAULT_MAX_RPM else NO_FULL_SPEED


@dataclass
class ChassisDraw:
    """A chassis's draw (NaN if none was read) and what stood in the way of its readings, each
    with where: ``problems``, readings there but unusable (not a number, negative); ``null``,
    readings given as null; ``missing``, entries without the reading's property at all (a
    limit-only ``PowerControl`` entry: the BMC's configuration)."""

    watts: float = math.nan
    problems: list[tuple[str, str]] = field(default_factory=list)
    null: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def reading(self, entry: Mapping[str, Any], name: str, where: str) -> float | None:
        """``entry[name]`` as a draw in watts, or None, noted: missing, null, not a number, or
        negative (no supply feeds power back)."""
        if name not in entry:
            self.missing.append(where)
            return None
        value = entry[name]
        if value is None:
            self.null.append(where)
            return None
        watts = _number(value)
        if watts is None:
            self.problems.append((POWER_NOT_A_NUMBER, f"{where} {value!r}"))
        elif watts < 0:
            self.problems.append((POWER_OUT_OF_RANGE, f"{where} {watts:g}"))
            return None
        return watts


def chassis_power(power: Mapping[str, Any] | None, environment: Mapping[str, Any] | None) -> ChassisDraw:
    """A chassis's draw in watts from its ``Power`` resource (the largest
    ``PowerControl[].PowerConsumedWatts``), else its ``EnvironmentMetrics.PowerWatts.Reading``
    (NaN if neither says), with the readings that could not be used (:class:`ChassisDraw`:
    they were dropped uncounted, the node's ``psu_power`` gone with no reason given). A resource
    with no ``PowerControl`` entry or no ``PowerWatts`` claims no reading: nothing to note."""
    draw = ChassisDraw()
    found: list[float] = []
    if isinstance(power, Mapping):
        controls = power.get("PowerControl")
        for i, control in enumerate(controls if isinstance(controls, list) else []):
            if isinstance(control, Mapping):
                watts = draw.reading(control, "PowerConsumedWatts", f"PowerControl[{i}].PowerConsumedWatts")
                if watts is not None:
                    found.append(watts)
    if isinstance(environment, Mapping):
        metrics = environment.get("PowerWatts")
        if isinstance(metrics, Mapping):
            watts = draw.reading(metrics, "Reading", "PowerWatts.Reading")
            if watts is not None and not found:
                found = [watts]
    if found:
        draw.watts = max(found)
    return draw


NOT_AN_OBJECT = "not a Redfish object"
"""The problem counted for a resource whose JSON body is not an object (null, a list, a string:
a BMC booting, or a broken one)."""


def _kind(body: Any) -> str:
    return "null" if body is None else type(body).__name__


def _object(body: Any, path: str) -> Mapping[str, Any]:
    """``body`` (the JSON fetched from ``path``) when it is an object; a :class:`RedfishError` otherwise."""
    if not isinstance(body, Mapping):
        raise RedfishError(NOT_AN_OBJECT, f"{path}: JSON {_kind(body)}")
    return body


def _link(resource: Mapping[str, Any], name: str) -> str | None:
    ref = resource.get(name)
    if isinstance(ref, Mapping) and isinstance(ref.get("@odata.id"), str):
        return str(ref["@odata.id"])
    return None


def _members(collection: Any) -> list[str]:
    members = collection.get("Members") if isinstance(collection, Mapping) else None
    if not isinstance(members, list):
        raise RedfishError("not a Redfish collection", "no Members list")
    return [str(m["@odata.id"]) for m in members if isinstance(m, Mapping) and isinstance(m.get("@odata.id"), str)]


@dataclass
class ChassisPlan:
    """Where one chassis keeps its fans and power: looked for at the chassis's first read
    (``found`` once all of it was), then remembered."""

    path: str
    found: bool = False
    thermal: str | None = None
    fans: list[str] = field(default_factory=list)  # ThermalSubsystem Fan members
    power: str | None = None
    environment: str | None = None


def discover(fetch: Fetch) -> list[ChassisPlan]:
    """The chassis of one BMC (``fetch`` GETs a path as JSON), each found at its first read
    (:func:`read_node`). Raises when the Chassis collection fails: without it the node has nothing
    to read."""
    return [ChassisPlan(path) for path in _members(fetch(SERVICE_ROOT + "Chassis"))]


def discover_chassis(fetch: Fetch, plan: ChassisPlan) -> None:
    """Find where the chassis at ``plan.path`` keeps its fans and power. A :class:`RedfishError`
    (a chassis or thermal subsystem whose body is not an object included: a BMC answering
    ``null`` while it boots) leaves the plan not found, to be looked for again at the next read:
    a chassis is never remembered without its fans."""
    chassis = _object(fetch(plan.path), plan.path)
    thermal = _link(chassis, "Thermal")
    subsystem = _link(chassis, "ThermalSubsystem")
    fans: list[str] = []
    if thermal is None and subsystem is not None:
        listed = _link(_object(fetch(subsystem), subsystem), "Fans")
        fans = _members(fetch(listed)) if listed else []
    plan.thermal, plan.fans = thermal, fans
    plan.power, plan.environment = _link(chassis, "Power"), _link(chassis, "EnvironmentMetrics")
    plan.found = True


FAN_NOT_AN_OBJECT = "fan entry is not an object"


def read_node(fetch: Fetch, plans: list[ChassisPlan], fan_max_rpm: float | None = None,
              gone_before: frozenset[str] = frozenset()) -> tuple[FanReadings, float]:
    """One poll of a node: its fans' shares of full speed and its largest chassis draw; a chassis
    not found yet is looked for first (:func:`discover_chassis`).

    A request that fails, or a body that is not an object, is a problem of that resource only
    (of that chassis, while it is looked for): counted, and the node's other resources still
    read; a 403 (the account may not read that resource) is the BMC's configuration, counted
    once. A 404 for a resource found at discovery, or for a listed chassis while it is looked
    for, goes in ``gone``; one for a link in ``gone_before`` (the links whose 404 had this
    discovery made) in ``gone_again``, that resource's link then dropped from its plan
    (:class:`Relisting`). A failure that ends the node's read
    (:attr:`RedfishError.ends_the_read`) is raised, what was found of the chassis kept.

    A null power reading is counted at a poll where the node gave no draw at all; beside a
    draw (a baseboard's unpopulated sensor, the server chassis's reading there) it is noted once,
    as an entry without the property at all is."""
    readings = FanReadings()
    draws = []
    null_power: list[str] = []

    def failed(exc: RedfishError, path: str) -> None:
        if exc.status == 404 and path in gone_before:
            readings.gone_again.append(path)
            readings.fact(LISTED_BUT_GONE, path, exc.detail)
        elif exc.status == 403:
            readings.fact(exc.reason, path, exc.detail)
        else:
            readings.problem(exc.reason, exc.detail)
            if exc.status == 404:
                readings.gone.append(path)

    def resource(path: str, not_an_object: str = NOT_AN_OBJECT) -> Mapping[str, Any] | None:
        try:
            body = fetch(path)
        except RedfishError as exc:
            if exc.ends_the_read:
                raise
            failed(exc, path)
            return None
        if isinstance(body, Mapping):
            return body
        readings.problem(not_an_object, f"{path}: JSON {_kind(body)}")
        return None

    for plan in plans:
        if not plan.found:
            try:
                discover_chassis(fetch, plan)
            except RedfishError as exc:
                if exc.ends_the_read:
                    raise
                # a chassis that cannot be looked for (the chassis, its subsystem or its fans
                # answering 404: listed by a collection that is out of date) is the chassis's
                # link failing: the collection is read again once (its new id, HGX_Baseboard_1,
                # was never read), and the chassis looked for again at each poll
                failed(exc, plan.path)
                continue
        entries: list[Mapping[str, Any]] = []
        thermal = resource(plan.thermal) if plan.thermal else None
        if thermal is not None:
            listed = thermal.get("Fans")
            for entry in listed if isinstance(listed, list) else []:
                if isinstance(entry, Mapping):
                    entries.append(entry)
                else:
                    readings.problem(FAN_NOT_AN_OBJECT, f"{plan.thermal}: JSON {_kind(entry)}")
        for path in plan.fans:
            member = resource(path, FAN_NOT_AN_OBJECT)
            if member is not None:
                entries.append(member)
        for entry in entries:
            share, problem = fan_share(entry, fan_max_rpm)
            if share is not None:
                readings.shares.append(share)
            elif problem in (NO_FULL_SPEED, SENSOR_RANGE_ONLY):
                readings.fact(problem, "fan-scale")  # the BMC's configuration: once per node, not per fan per poll
            elif problem:
                readings.problem(problem)
        if plan.power or plan.environment:
            draw = chassis_power(resource(plan.power) if plan.power else None,
                                 resource(plan.environment) if plan.environment else None)
            for reason, where in draw.problems:
                readings.problem(reason, f"{plan.path}: {where}")
            null_power += (f"{plan.path}: {where}" for where in draw.null)
            for where in draw.missing:
                readings.fact(NO_POWER_READING, f"power:{plan.path}:{where}", f"{plan.path}: {where} missing")
            draws.append(draw.watts)
        _drop_links(plan, readings.gone_again)
    found = [d for d in draws if not math.isnan(d)]
    if found:
        for where in null_power:
            readings.fact(NO_POWER_READING, f"power:{where}", f"{where} null (the node's draw read elsewhere)")
    elif null_power:
        readings.problem(NO_POWER_READING, null_power[0])
    return readings, max(found) if found else math.nan


def _drop_links(plan: ChassisPlan, gone: Sequence[str]) -> None:
    """Leave the links in ``gone`` out of ``plan``: the BMC lists them, afresh, but serves nothing there."""
    if not gone:
        return
    plan.thermal = None if plan.thermal in gone else plan.thermal
    plan.fans = [path for path in plan.fans if path not in gone]
    plan.power = None if plan.power in gone else plan.power
    plan.environment = None if plan.environment in gone else plan.environment


def _origin(url: str) -> tuple[str, str, int] | None:
    """A URL's scheme, host and port (the default one where none is written); None if unreadable."""
    parsed = urlparse(url)
    try:
        port = parsed.port
    except ValueError:
        return None
    scheme = parsed.scheme.lower()
    return scheme, (parsed.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme, 0)


class _AnswerLate(Exception):
    """A BMC's answer (status line, headers or body) not whole by its request's deadline;
    ``received`` is how many bytes had come, ``what`` names the answer (the BMC's, or a proxy's
    to CONNECT). Not an OSError: http.client and urllib pass it on as it is, where they would
    have made a socket error "unreachable"."""

    def __init__(self, received: int, what: str = "the answer") -> None:
        super().__init__(f"{received} bytes received by the deadline")
        self.received = received
        self.what = what


class _LookupLate(_AnswerLate):
    """A host name (the BMC's, or its proxy's) not resolved by the request's deadline."""

    def __init__(self, host: str) -> None:
        super().__init__(0, f"the address of {host!r}")
        self.host = host


def _time_left(deadline: float) -> float:
    """Seconds to ``deadline`` (time.monotonic()); :class:`_AnswerLate` (nothing read) when none is left."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise _AnswerLate(0)
    return left


ADDRESSES_KEPT_S = 30.0
"""How long a host name's addresses, once resolved, are used without asking the resolver again.
A node's poll makes 2 to 10 requests, and each resolved the BMC's name again: a resolver taking
0.2 s an answer cost a node its row at every poll (4 requests, 0.8 s of lookups past a 0.625 s
deadline); kept, a poll's requests share one lookup. 30 s is one BMC poll at the default
interval: a name moved to another address (a BMC's new lease, the old address given to another
board) is followed within one poll, where nscd, if a site runs it, keeps a name an hour by
default; and an address that no longer connects is looked up again at once
(:meth:`_DeadlineConnection._connect_by_deadline`)."""

AddrInfo = tuple[int, int, int, str, tuple[Any, ...]]


class _Lookup:
    """One ``getaddrinfo`` of a host name in flight in a thread of its own, and the requests waiting for it."""

    def __init__(self) -> None:
        self.finished = threading.Event()
        self.addresses: list[AddrInfo] = []
        self.error: Exception | None = None
        self.waiting = 0  # requests waiting for it now (changed under HostLookups' lock)


class HostLookups:
    """Host names resolved by a deadline: ``socket.getaddrinfo`` has no timeout, and a resolver
    that never answers held the request (and its thread) long past its poll.

    A name is looked up in a thread of its own, which the request waits for at most until its
    deadline (then :class:`_LookupLate`, counted as the BMC too slow). A lookup still running
    then is not started again: at most one is in flight per (host, port) however many polls
    come while the resolver hangs, and the next request for that host waits for that same one.
    Its answer, whenever it comes, is kept: addresses for :data:`ADDRESSES_KEPT_S`; a failure
    no request was waiting for is told to the next request (once), which then counts the real
    reason (the name unknown) rather than another late answer. A numeric address is not looked
    up at all."""

    def __init__(self, kept_s: float = ADDRESSES_KEPT_S) -> None:
        self.kept_s = kept_s
        self._lock = threading.Lock()
        self._in_flight: dict[tuple[str, int], _Lookup] = {}
        self._known: dict[tuple[str, int], tuple[list[AddrInfo], float]] = {}  # addresses, until when
        self._failed: dict[tuple[str, int], Exception] = {}  # failures that came with no request waiting

    def addresses(self, host: str, port: int, deadline: float) -> tuple[list[AddrInfo], bool]:
        """The addresses to connect to for ``host`` and ``port``, by ``deadline``; and whether they
        were kept from an earlier lookup (then possibly out of date)."""
        if _is_numeric(host):
            return _addr_info(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)), False
        key = (host.lower(), port)
        with self._lock:
            known = self._known.get(key)
            if known is not None and known[1] > time.monotonic():
                return known[0], True
            failure = self._failed.pop(key, None)
            if failure is not None:
                raise failure
            lookup = self._in_flight.get(key)
            if lookup is None:
                lookup = _Lookup()
                # (a thread that cannot start raises here, leaving no lookup "in flight" forever)
                threading.Thread(target=self._look_up, args=(key, lookup), daemon=True,
                                 name=f"redfish-lookup-{host}:{port}").start()
                self._in_flight[key] = lookup
            lookup.waiting += 1
        lookup.finished.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            lookup.waiting -= 1
            if not lookup.finished.is_set():
                raise _LookupLate(host)
        if lookup.error is not None:
            raise lookup.error
        return lookup.addresses, False

    def forget(self, host: str, port: int) -> None:
        """Drop the addresses kept for ``host`` (they no longer connect: look it up again)."""
        with self._lock:
            self._known.pop((host.lower(), port), None)

    def in_flight(self) -> int:
        """How many lookups are running now."""
        with self._lock:
            return len(self._in_flight)

    def _look_up(self, key: tuple[str, int], lookup: _Lookup) -> None:
        try:
            addresses = _addr_info(socket.getaddrinfo(key[0], key[1], 0, socket.SOCK_STREAM))
        except Exception as exc:  # (socket.gaierror; a UnicodeError for a name IDNA cannot encode)
            lookup.error = exc
        else:
            lookup.addresses = addresses
        with self._lock:
            del self._in_flight[key]
            if lookup.error is None:
                self._known[key] = (lookup.addresses, time.monotonic() + self.kept_s)
            elif lookup.waiting == 0:
                self._failed[key] = lookup.error
            lookup.finished.set()


HOST_LOOKUPS = HostLookups()
"""The lookups of every BMC and CDU client of the process (one in flight per host at most)."""


def _addr_info(found: Sequence[tuple[Any, Any, int, str, Any]]) -> list[AddrInfo]:
    return [(int(family), int(kind), proto, name, tuple(address)) for family, kind, proto, name, address in found]


def _is_numeric(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _connect_to_any(addresses: list[AddrInfo], deadline: float,
                    source_address: tuple[str, int] | None) -> socket.socket:
    """A socket connected to the first of ``addresses`` that answers, each tried with the time
    left to ``deadline`` (as socket.create_connection tries them, with its timeout)."""
    last: OSError = OSError("the host name has no address")
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_time_left(deadline))
            if source_address:
                sock.bind(source_address)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
        except BaseException:
            sock.close()
            raise
    raise last


class _DeadlineReader(io.RawIOBase):
    """The reading end of a connected socket whose every read ends by ``deadline``: it waits at
    most the time left, and none starts after it. http.client reads the status line and headers
    with readline, one read per byte of a BMC dripping them, so a timeout per read never ended
    it: only a deadline over all of them does."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)  # holds the socket open until the answer is read
        self._deadline = deadline
        self.received = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise _AnswerLate(self.received)
        self._sock.settimeout(left)
        try:
            got = self._raw.readinto(buffer)
        except TimeoutError:  # the only timeout set is the time left
            raise _AnswerLate(self.received) from None
        self.received += got or 0
        return got

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _DeadlineSocket:
    """A connected socket as http.client uses it (send the request, make the file the answer is
    read from, close), its reads ending by ``deadline`` (:class:`_DeadlineReader`) and its
    sending by it too."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(_time_left(self._deadline))
        self._sock.sendall(data)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"a BMC's answer is read as bytes, not opened {mode!r}")
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def __getattr__(self, name: str) -> Any:  # close, fileno, setsockopt...: the socket's own
        return getattr(self._sock, name)


class _DeadlineConnection(http.client.HTTPConnection):
    """An HTTP connection made, and read, by ``deadline``: resolving the host name
    (:class:`HostLookups`), connecting, a proxy's CONNECT and a TLS handshake may take the time
    left, and every read of the answer ends by it (:class:`_DeadlineSocket`)."""

    def __init__(self, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline
        self._create_connection = self._connect_by_deadline

    def _connect_by_deadline(self, address: tuple[str, int], timeout: Any = None,
                             source_address: tuple[str, int] | None = None) -> socket.socket:
        """Resolve (:data:`HOST_LOOKUPS`) and connect by the deadline: socket.create_connection
        resolved the name with no timeout at all. Addresses kept from an earlier lookup that no
        longer connect are looked up again, while time is left: the host may have moved."""
        host, port = address
        addresses, kept = HOST_LOOKUPS.addresses(host, port, self.deadline)
        try:
            sock = _connect_to_any(addresses, self.deadline, source_address)
        except OSError:
            if not kept:
                raise
            HOST_LOOKUPS.forget(host, port)
            if self.deadline <= time.monotonic():
                raise
            sock = _connect_to_any(HOST_LOOKUPS.addresses(host, port, self.deadline)[0], self.deadline,
                                   source_address)
        sock.settimeout(_time_left(self.deadline))  # what is left, for a TLS handshake
        return sock

    def _tunnel(self) -> None:
        """A proxy's CONNECT (an ``https://`` BMC reached through the environment's
        ``https_proxy``), its answer read by the deadline: http.client reads it line by line on
        the bare socket, so a proxy dripping it held the request as long as it dripped."""
        bare = self.sock
        self.sock = cast(socket.socket, _DeadlineSocket(bare, self.deadline))
        try:
            super()._tunnel()  # type: ignore[misc]
        except _AnswerLate as late:
            raise _AnswerLate(late.received, "the proxy's answer to CONNECT") from None
        finally:
            if self.sock is not None:  # (None: http.client closed it, the proxy refusing)
                self.sock = bare

    def connect(self) -> None:
        super().connect()
        # duck-typed: http.client only sends through it, makes its file from it and closes it
        self.sock = cast(socket.socket, _DeadlineSocket(self.sock, self.deadline))


class _DeadlineHTTPSConnection(_DeadlineConnection, http.client.HTTPSConnection):
    """:class:`_DeadlineConnection` over TLS (the socket is wrapped before it is made a deadline's)."""


class _DeadlineRequest(urllib.request.Request):
    """A request whose whole answer must be in by ``deadline`` (time.monotonic())."""

    def __init__(self, url: str, headers: Mapping[str, str], deadline: float, **kwargs: Any) -> None:
        super().__init__(url, headers=dict(headers), **kwargs)
        self.deadline = deadline


def _deadline_of(req: urllib.request.Request) -> float:
    if isinstance(req, _DeadlineRequest):
        return req.deadline
    return time.monotonic() + (req.timeout or 10.0)  # not one of ours: its timeout, over the whole answer


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    """Opens ``http://`` requests on deadline-bound connections (:class:`_DeadlineConnection`)."""

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(partial(_DeadlineConnection, deadline=_deadline_of(req)), req)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    """Opens ``https://`` requests on deadline-bound connections (:class:`_DeadlineHTTPSConnection`), verified by ``context``."""

    def __init__(self, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self.tls = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(partial(_DeadlineHTTPSConnection, deadline=_deadline_of(req)), req, context=self.tls)


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a BMC's redirects within its own origin only: urllib's own handler copies the
    ``Authorization`` header onto a redirect to any host, over plain HTTP too, so one bad BMC
    would collect the fleet's shared credentials. The redirected request keeps the deadline of
    the one it follows: a chain of redirects is one request's time."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        if _origin(newurl) != _origin(req.full_url):
            fp.close()
            raise RedfishError(REDIRECTED_AWAY, f"{req.full_url} -> HTTP {code} to {newurl}")
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        return _DeadlineRequest(new.full_url, new.headers, _deadline_of(req), origin_req_host=new.origin_req_host,
                                unverifiable=new.unverifiable, method=new.get_method())


class BmcClient:
    """GETs Redfish paths from one BMC as JSON, with basic auth; every failure is a :class:`RedfishError`.

    Only paths on the BMC itself are fetched, and redirects followed within its origin only (the
    credentials go with every request). A request takes at most ``timeout`` seconds in all, its
    host name's lookup, connecting, status line, headers and body together, and no longer than
    the poll it is made for waits (:func:`poll_deadline`); it brings at most
    :data:`MAX_ANSWER_BYTES`. urllib's timeout bounds each socket operation only: a BMC sending
    its answer, or its headers, a byte at a time was never timed out."""

    def __init__(self, base_url: str, user: str | None = None, password: str | None = None, timeout: float = 10.0,
                 context: ssl.SSLContext | None = None) -> None:
        parsed = urlparse(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"not a BMC URL: {base_url!r} (expected https://HOST[:PORT])")
        self.base_url = f"{parsed.scheme}://{parsed.netloc}"
        self.path = parsed.path  # where the URL points inside the service (a CDU's resource), if anywhere
        self.timeout = timeout
        self.context = context
        self.opener = urllib.request.build_opener(_DeadlineHTTPHandler(), _DeadlineHTTPSHandler(context),
                                                  _SameOriginRedirects)
        self.headers = {"Accept": "application/json", "OData-Version": "4.0"}
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"

    def url(self, path: str) -> str:
        """The URL of ``path`` on this BMC. A link the BMC gave that is not a path of its own (an
        absolute URL, ``//host/...``: urljoin followed those to any host) is refused."""
        path = path.split("#", 1)[0]
        if not path.startswith("/") or path.startswith("//"):
            raise RedfishError(OFF_ORIGIN, f"{path[:200]!r} is not a path on {self.base_url}: not followed")
        return self.base_url + path

    def get(self, path: str) -> Any:
        url = self.url(path)
        began = time.monotonic()
        request = _DeadlineRequest(url, self.headers, min(began + self.timeout, poll_deadline()))
        try:
            with self.opener.open(request, timeout=self.timeout) as response:
                body = self._body(response, url)
        except _LookupLate as late:
            raise RedfishError(TOO_SLOW, f"{url}: {late.what} not resolved in {time.monotonic() - began:.3g} s "
                                         "(the lookup goes on; its answer is used when it comes)") from None
        except _AnswerLate as late:
            raise RedfishError(TOO_SLOW, f"{url}: {late.received} bytes in {time.monotonic() - began:.3g} s, "
                                         f"{late.what} not whole") from None
        except urllib.error.HTTPError as exc:
            # 401 is the credentials refused, for every request after this one too; 403 is this
            # account not allowed this resource (a ReadOnly account, a baseboard's sensor): that
            # resource's problem, or the node's where it is the Chassis collection
            if exc.code == 401:
                raise RedfishError(CREDENTIALS_REFUSED, f"{url}: HTTP {exc.code}", exc.code) from None
            raise RedfishError(f"BMC answered HTTP {exc.code}", url, exc.code) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
                # the connect or the TLS handshake given up at the deadline (the socket's timeout
                # is the time left): a BMC too busy to answer in time, not one gone, whose
                # discovery holds (it was dropped as "unreachable")
                raise RedfishError(TOO_SLOW, f"{url}: {reason} after {time.monotonic() - began:.3g} s") from None
            raise RedfishError(UNREACHABLE, f"{url}: {reason}") from None
        try:
            return json.loads(body)
        except ValueError:
            raise RedfishError("BMC answer is not JSON", url) from None

    def _body(self, response: Any, url: str) -> bytes:
        """The answer's body, read in pieces (each ending by the request's deadline) while it
        stays under :data:`MAX_ANSWER_BYTES`."""
        length = response.headers.get("Content-Length", "")
        if length.strip().isdigit() and int(length) > MAX_ANSWER_BYTES:
            raise RedfishError(TOO_LARGE, f"{url}: {int(length)} bytes (at most {MAX_ANSWER_BYTES})")
        pieces: list[bytes] = []
        size = 0
        while True:
            piece = response.read1(READ_CHUNK_BYTES)
            if not piece:
                return b"".join(pieces)
            size += len(piece)
            if size > MAX_ANSWER_BYTES:
                raise RedfishError(TOO_LARGE, f"{url}: more than {MAX_ANSWER_BYTES} bytes")
            pieces.append(piece)


R = TypeVar("R")


def answer_within(interval: float, timeout: float) -> float:
    """How long a poll waits for its devices: its interval, or a little more than one request's
    timeout where that is longer (a request given up at its timeout is then counted once, by
    the request, not also by the poll)."""
    return max(interval, 1.25 * timeout)


WIND_DOWN_S = 0.25
"""How long past its deadline a poll waits for the reads it cut short: each ends its request
when the deadline comes (every socket read waits at most the time left), then counts why."""

STOP_CHECK_S = 0.1
"""How often a poll waiting for its reads looks whether it is hurried (:meth:`ParallelReads.hurry`, a
second signal): the wait ends then, the reads in flight counted as too slow, rather than at the
deadline. A stop alone (:meth:`ParallelReads.close`) does not end it: a ``--duration`` stop dropped the
last poll's answers that came a moment later, every healthy BMC counted as too slow."""

_reading_for = threading.local()


def poll_deadline() -> float:
    """When the poll the calling thread reads for stops waiting (time.monotonic()); infinity in a
    thread that reads for no poll. :class:`BmcClient` ends its requests by it."""
    return float(getattr(_reading_for, "deadline", math.inf))


class _DaemonPool:
    """A pool of at most ``workers`` threads running the calls handed to it (as a ``ThreadPoolExecutor``),
    daemon threads: one stuck in a read that cannot be cut short does not hold the process's exit.
    ``ThreadPoolExecutor`` joins its threads at exit: a ``watch`` whose BMC never answered exited
    seconds after its summary, when the request gave up."""

    def __init__(self, workers: int, thread_name_prefix: str) -> None:
        self.workers = workers
        self.thread_name_prefix = thread_name_prefix
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._threads = 0
        self._idle = threading.Semaphore(0)  # a release per thread waiting for work

    def submit(self, call: Callable[..., R], *args: Any) -> Future[R]:
        future: Future[R] = Future()
        self._work.put((future, partial(call, *args)))
        if not self._idle.acquire(blocking=False) and self._threads < self.workers:
            threading.Thread(target=self._serve, name=f"{self.thread_name_prefix}_{self._threads}",
                             daemon=True).start()
            self._threads += 1
        return future

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            future, call = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # the caller's, through the future
                    future.set_exception(exc)
            self._idle.release()

    def shutdown(self) -> None:
        """Cancel the calls not started; each thread ends after its call in hand."""
        while True:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in range(self._threads):
            self._work.put(None)


class ParallelReads(Generic[R]):
    """Reads each device (a node's BMC, a loop's CDU) in a thread of a pool kept across polls, and
    takes what answered by a deadline: one device answering slowly no longer holds every other's
    row for as long as it takes (``pool.map`` waited for the slowest).

    A read ends with the poll that asked for it: its requests end by the poll's deadline
    (:func:`poll_deadline`), so no thread is left reading a BMC, and none holds a connection
    to one, after the poll has returned. A read that cannot be cut short (a ``read_one`` that
    does not make its requests through :class:`BmcClient`) is not asked again until it has
    answered, even across :meth:`close`: at most one read per device is in flight, and its
    answer, when it comes, is taken at the next poll."""

    def __init__(self, workers: int, thread_name_prefix: str) -> None:
        self.workers = workers
        self.thread_name_prefix = thread_name_prefix
        self.pending: dict[str, Future[R]] = {}
        self._pool: _DaemonPool | None = None
        self._lock = threading.Lock()  # stop() may come from another thread than the polls
        self._closed = threading.Event()  # closed (the source stopped): a poll asks nothing more
        self.hurried = threading.Event()  # a poll waits no longer (hurry)

    def collect(self, read_one: Callable[[str], R], names: Sequence[str],
                within: float) -> tuple[dict[str, R], list[str]]:
        """``read_one(name)`` for each of ``names`` not still answering an earlier poll, each
        made to end by ``within`` seconds from now; waits that long (and :data:`WIND_DOWN_S`
        for the reads cut short to end), or until :meth:`hurry`; once closed (:meth:`close`) nothing
        more is asked, and the reads in flight are still waited for to their deadline. Returns the
        answers in hand, by name (in ``names``' order), and the names still answering."""
        deadline = time.monotonic() + within
        with self._lock:
            if not self._closed.is_set():
                if self._pool is None:
                    self._pool = _DaemonPool(self.workers, self.thread_name_prefix)
                for name in names:
                    if name not in self.pending:
                        self.pending[name] = self._pool.submit(self._read_by, deadline, read_one, name)
            waiting = [self.pending[name] for name in names if name in self.pending]
        until = deadline + WIND_DOWN_S
        # not until a close alone: the reads in flight (a healthy BMC's answer due a moment later) are the poll's
        while not self.hurried.is_set() and (left := until - time.monotonic()) > 0:
            if not wait(waiting, timeout=min(left, STOP_CHECK_S)).not_done:
                break
        answers: dict[str, R] = {}
        with self._lock:
            for name in names:
                future = self.pending.get(name)
                if future is not None and future.done():
                    del self.pending[name]
                    if not future.cancelled():
                        answers[name] = future.result()
        return answers, [name for name in names if name in self.pending]

    @staticmethod
    def _read_by(deadline: float, read_one: Callable[[str], R], name: str) -> R:
        """``read_one(name)``, its requests ending by ``deadline`` (:func:`poll_deadline`)."""
        _reading_for.deadline = deadline
        try:
            return read_one(name)
        finally:
            del _reading_for.deadline

    def close(self) -> None:
        """Let the threads go (a read in flight ends by its poll's deadline, and the poll waiting for
        it waits as before). The reads still answering stay pending: a poll after this one does not
        ask their devices a second time."""
        with self._lock:
            self._closed.set()
            if self._pool is not None:
                self._pool.shutdown()
            self._pool = None

    def hurry(self) -> None:
        """:meth:`close`, and end a poll's wait at once: the reads in flight are its too slow ones."""
        self.hurried.set()
        self.close()


def tls_context(ca_file: str | None = None, insecure: bool = False) -> ssl.SSLContext:
    """Verify the BMC's certificate against ``ca_file`` (or the system store); ``insecure`` skips it.

    BMCs ship self-signed certificates; a site either installs its own CA on them or accepts that
    the management network is trusted. Skipping is the caller's explicit choice, never a fallback.
    """
    context = ssl.create_default_context(cafile=ca_file)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def clients(urls: Mapping[str, str], user: str | None, password: str | None, timeout: float, ca_file: str | None,
            insecure: bool | None) -> dict[str, BmcClient]:
    """One client per named URL; unset credentials and TLS settings come from the environment
    (``FORESHOCK_BMC_USER``, ``_PASSWORD``, ``_CA_FILE``, ``_INSECURE=1``). A user without a
    password, or a password without a user, is a ValueError: with no user no credentials were
    sent at all, and the BMC's 401 then read as the password refused."""
    user = user if user is not None else os.environ.get("FORESHOCK_BMC_USER")
    password = password if password is not None else os.environ.get("FORESHOCK_BMC_PASSWORD")
    if bool(user) != (password is not None):  # an empty password is one given: a BMC account may have none
        given, missing = ("FORESHOCK_BMC_USER", "FORESHOCK_BMC_PASSWORD") if user else \
            ("FORESHOCK_BMC_PASSWORD", "FORESHOCK_BMC_USER")
        raise ValueError(f"{given} is set but {missing} is not: the BMCs' basic authentication needs both")
    insecure = insecure if insecure is not None else os.environ.get("FORESHOCK_BMC_INSECURE") == "1"
    ca = ca_file or os.environ.get("FORESHOCK_BMC_CA_FILE")
    try:
        context = tls_context(ca, insecure)
    except OSError as exc:  # (ssl.SSLError is one) a CA file missing, unreadable or no certificate:
        # a ValueError naming where it came from, which the commands make a usage error (it was a
        # FileNotFoundError traceback; review h28)
        origin = "the CA file" if ca_file else "FORESHOCK_BMC_CA_FILE"
        raise ValueError(f"{origin} {ca!r} cannot be used to verify the BMCs' certificates: "
                         f"{exc.strerror or exc}") from None
    return {name: BmcClient(url, user, password, timeout, context) for name, url in urls.items()}


def _env_rpm(name: str) -> float | None:
    text = os.environ.get(name)
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a fan's full speed in RPM, got {text!r}")
    return value


def node_topology(nodes: list[str], cluster: str = DERIVED_CLUSTER) -> Topology:
    """Nodes whose racks and GPUs the BMCs do not tell: every node in the one ``unknown`` rack."""
    return Topology.from_dict({
        "cluster": cluster,
        "rows": [{"name": UNKNOWN, "cooling_loop": UNKNOWN}],
        "racks": [{"name": UNKNOWN, "row": UNKNOWN}],
        "nodes": [{"name": node, "rack": UNKNOWN, "gpus": 0} for node in nodes],
    })


def parse_bmc_list(text: str, host: str | None = None, what: str = "node") -> dict[str, str]:
    """``NAME=URL[,NAME=URL...]``, or one bare URL (named ``host``, else by the URL's host name);
    ``what`` names the entities in messages (nodes for BMCs, loops for CDUs)."""
    urls: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, url = item.partition("=")
        if not sep:
            name, url = host or urlparse(item).hostname or "", item
        name, url = name.strip(), url.strip()
        if not name or urlparse(url).scheme not in ("http", "https"):
            raise ValueError(f"not {what.upper()}=URL or a URL: {item!r}")
        if name in urls:
            raise ValueError(f"{what} {name} is given two URLs")
        urls[name] = url
    if not urls:
        raise ValueError("no URL given")
    return urls


def _no_answer(source: _ParallelPolled) -> str:
    """Why a device's read was counted too slow: its poll's time passed, or the source was hurried first."""
    if source._reads.hurried.is_set():
        return "no answer before the source was told to stop at once"
    return f"no answer within {source.answer_within:g} s"


class _Polling:
    """Clears ``idle`` while a poll is in hand (``with``): what ``wind_down`` waits for."""

    def __init__(self, idle: threading.Event) -> None:
        self.idle = idle

    def __enter__(self) -> None:
        self.idle.clear()

    def __exit__(self, *exc: object) -> None:
        self.idle.set()


class _ParallelPolled(PollingSource):
    """What the sources asking devices in parallel (:class:`ParallelReads`: BMCs, CDUs) share: a stop
    closes their reads, a hurry cuts the poll in hand short, and ``record``/``watch`` wait for that
    poll by :attr:`poll_limit_s` and :meth:`wind_down`. Each sets ``_reads``, ``_idle`` (set while no
    poll is in hand: :class:`_Polling`) and ``answer_within``."""

    _reads: ParallelReads[Any]
    _idle: threading.Event
    answer_within: float

    def stop(self) -> None:
        super().stop()
        self._reads.close()

    def hurry(self) -> None:
        """Stop, and end the wait of the poll in hand at once (a second Ctrl-C or SIGTERM): its reads
        in flight are counted as too slow."""
        super().stop()
        self._reads.hurry()

    @property
    def poll_limit_s(self) -> float:
        """The longest a poll takes (its answer window and the wind-down of the reads it cut short):
        what ``record`` and ``watch`` wait for the poll in hand once stopped."""
        return self.answer_within + WIND_DOWN_S

    def wind_down(self, timeout: float) -> bool:
        """Wait ``timeout`` seconds at most for the poll in hand (after :meth:`stop`: its reads in
        flight waited for to its deadline; after :meth:`hurry`: counted as too slow) to end; False if
        it has not."""
        return self._idle.wait(timeout)


class RedfishSource(_ParallelPolled):
    """Polls each node's BMC every ``interval`` seconds; yields node frames (``fan_speed``, ``psu_power``).

    ``bmcs`` maps a node name to its BMC's base URL. The topology is the one given (its node
    names must match) or one holding just these nodes. ``user``/``password`` default to the
    ``FORESHOCK_BMC_USER``/``FORESHOCK_BMC_PASSWORD`` environment variables, the TLS settings to
    ``FORESHOCK_BMC_CA_FILE`` and ``FORESHOCK_BMC_INSECURE=1``, ``fan_max_rpm`` (the fans' full
    speed, for fans whose BMC gives no ``MaxReadingRange`` or OpenBMC's default one:
    :func:`fan_share`) to ``FORESHOCK_BMC_FAN_MAX_RPM``.
    """

    stage = STAGE
    reads = ("node",)
    stamps_at_start = False  # each node's row when its BMC answers, maybe late in the poll

    def __init__(self, bmcs: Mapping[str, str], interval: float = 30.0, topology: Topology | None = None,
                 health: PipelineHealth | None = None, max_polls: int | None = None, timeout: float = 10.0,
                 user: str | None = None, password: str | None = None, fan_max_rpm: float | None = None,
                 ca_file: str | None = None, insecure: bool | None = None, workers: int = 32) -> None:
        super().__init__(interval, health, max_polls)
        if not bmcs:
            raise ValueError("RedfishSource needs at least one node's BMC")
        self.nodes = list(bmcs)
        self.clients = clients(bmcs, user, password, timeout, ca_file, insecure)
        self.fan_max_rpm = fan_max_rpm if fan_max_rpm is not None else _env_rpm("FORESHOCK_BMC_FAN_MAX_RPM")
        self.plans: dict[str, list[ChassisPlan]] = {}
        self.relisting = Relisting()
        self.workers = max(1, min(workers, len(self.nodes)))
        self.answer_within = answer_within(self.interval, timeout)
        self._reads: ParallelReads[tuple[float, float, float, FanReadings] | None] = \
            ParallelReads(self.workers, "redfish")
        self._idle = threading.Event()  # no poll in hand (wind_down)
        self._idle.set()
        self._topology = topology if topology is not None else node_topology(self.nodes, self.cluster)

    def read_one(self, node: str) -> tuple[float, float, float, FanReadings] | None:
        """``(ts, fan_speed, psu_power, what was read)`` of one node, or None when its BMC failed
        (counted, the node named). Whatever goes wrong with one node stays with it: an exception
        out of here would end the poll, and with it every node's row.

        What was discovered of the node is kept through a read cut short for time and through
        the failures of single resources, and discovered again only where it may no longer hold
        (:attr:`RedfishError.outdates_discovery`, an answer this code did not expect, or a
        link found at discovery answering 404 for the first time: :class:`Relisting`)."""
        client = self.clients[node]
        try:
            plans = self.plans.get(node)
            if plans is None:
                plans = self.plans[node] = discover(client.get)
            fans, power = read_node(client.get, plans, self.fan_max_rpm, self.relisting.gone_before(node))
        except RedfishError as exc:
            if exc.outdates_discovery:
                self._forget(node)
            self.health.problem(STAGE, exc.reason, detail=f"{node}: {exc.detail}")
            return None
        except Exception as exc:  # an answer this code did not expect: this node's problem, not the poll's
            self._forget(node)
            self.health.problem(STAGE, "BMC answer not understood", detail=f"{node}: {type(exc).__name__}: {exc}")
            return None
        if self.relisting.after_read(node, fans.gone, fans.gone_again):
            self.plans.pop(node, None)
        return self.clock(), fans.slowest(), power, fans

    def _forget(self, node: str) -> None:
        self.plans.pop(node, None)
        self.relisting.forget(node)

    def read(self) -> SampleBatch:
        """One poll of every node (a row per node that gave a reading, in time or since the last poll)."""
        answers, slow = self._reads.collect(self.read_one, self.nodes, self.answer_within)
        for node in slow:
            # a read that could not be cut short (one not made through BmcClient, whose requests
            # end by the deadline, host name lookups included): not asked again until it has
            # answered, its row then taken at the next poll. Or one in flight when the source was
            # hurried (a second signal): the poll's wait ends then (STOP_CHECK_S), the read counted
            self.health.problem(STAGE, TOO_SLOW, detail=f"{node}: {_no_answer(self)} (its row comes with the poll "
                                                        "after it answers)")
        rows = []
        for i, node in enumerate(self.nodes):
            row = answers.get(node)
            if row is None:
                continue
            _, fan_speed, psu_power, fans = row
            for problem in fans.problems:
                detail = fans.details.get(problem)
                self.health.problem(STAGE, problem, detail=f"{node}: {detail}" if detail else node)
            for reason, what, detail in fans.facts:
                # the BMC's configuration, the same at every poll (fans in RPM with no full speed:
                # 17,000 a day a node, counted per fan per poll): once per node
                if count_once(self.counted_once, f"{node}:{reason}:{what}"):
                    self.health.problem(STAGE, reason, detail=f"{node}: {detail}" if detail else node)
            if math.isnan(fan_speed) and math.isnan(psu_power):
                # a poll without a row for the node: counted at each one (what stood in the way,
                # fans with no full speed, a chassis collection listing none, may be counted once)
                self.health.problem(STAGE, NODE_NOTHING_READ, detail=node)
            else:
                rows.append((i, row))
        ts = np.array([r[0] for _, r in rows], dtype=np.float64)
        columns = {"fan_speed": np.array([r[1] for _, r in rows], dtype=np.float64),
                   "psu_power": np.array([r[2] for _, r in rows], dtype=np.float64)}
        columns = {name: col for name, col in columns.items() if len(col) and not np.isnan(col).all()}
        return SampleBatch("node", self.nodes, ts, np.array([i for i, _ in rows], dtype=np.int32), columns)

    def poll(self) -> list[Frame]:
        assert self._topology is not None
        with _Polling(self._idle):
            batch = self.read()
            return [batch.to_frame(self._topology, self.health, STAGE)] if len(batch) else []




# ---- CDUs: the cooling loops' coolant (rack frames) ------------------------------------------
CDU_COLLECTION = SERVICE_ROOT + "ThermalEquipment/CDUs"
CDU_RETRY_AT_MOST_S = 120.0
"""The longest wait between two tries to find a CDU that could not be found (unreachable, down)."""


CDU_NOTHING_READ = "CDU gave neither supply temperature nor flow"
"""Counted for a CDU row left out of its poll's frame: no connector gave a reading of either."""


CDU_METER_LOST = "CDU flow meter no longer read: the loop's flow is not published"
"""Counted once per connector: one that gave a flow and is read no more (dropped after answering 404
twice); the other meters' sum, published, read as a loss of flow."""
CDU_UNMETERED = "CDU connector without a flow reading (left out of the loop's flow)"
"""Counted once per connector: one that has never given a flow (an unmetered connector, the
return side of a pair metered on its supply) is the CDU's configuration."""
CDU_NO_FLOW = "CDU FlowLitersPerMinute: no reading"


@dataclass
class CduReading:
    """One poll of a CDU's secondary (IT-side) loop: supply temperature (°C) and flow (L/s)."""

    supply_c: float = math.nan
    flow_lps: float = math.nan
    problems: list[str] = field(default_factory=list)
    unmetered: list[str] = field(default_factory=list)  # connectors with no flow ever: left out, counted once
    gone: list[str] = field(default_factory=list)  # connectors found at discovery answering 404 (:class:`Relisting`)
    gone_again: list[str] = field(default_factory=list)  # ... again, after the discovery their first 404 made
    lost_meters: list[str] = field(default_factory=list)  # connectors that gave a flow, read no more: no flow


def _excerpt(connector: Mapping[str, Any], name: str, problems: list[str]) -> float | None:
    """A sensor excerpt's ``Reading`` (``{"Reading": 32.1}``), None where there is none; a reading
    that is not a number (BMCs print ``"Out of range"``) is counted."""
    excerpt = connector.get(name)
    if not isinstance(excerpt, Mapping) or excerpt.get("Reading") is None:
        return None
    value = _number(excerpt.get("Reading"))
    if value is None:
        problems.append(f"CDU {name} is not a number")
    return value


def find_cdu(fetch: Fetch, path: str) -> list[str]:
    """The secondary coolant connectors of the CDU at ``path`` (a CoolingUnit resource), or of the
    service's only CDU when ``path`` is not one."""
    if "/ThermalEquipment/CDUs/" not in path.rstrip("/"):  # the collection, maybe with a trailing '/'
        members = _members(fetch(CDU_COLLECTION))
        if len(members) != 1:
            raise RedfishError("CDU not identified", f"{len(members)} CDUs at {CDU_COLLECTION}: give the CDU's own URL")
        path = members[0]
    connectors = _link(_object(fetch(path), path), "SecondaryCoolantConnectors")
    if connectors is None:
        raise RedfishError("CDU without a secondary coolant loop", path)
    return _members(fetch(connectors))


def read_cdu(fetch: Fetch, connectors: list[str], metered: dict[str, bool] | None = None,
             gone_before: frozenset[str] = frozenset()) -> CduReading:
    """Supply temperature and total flow of the CDU's secondary loop.

    The flow is the sum over the connectors that have a meter, so it is given only when each of
    those gave one: a connector that has given a flow before (``metered``, per connector path,
    kept across polls by the caller) and whose flow is missing now (null, not a number,
    negative, its resource failing) makes the loop's flow NaN for the poll, counted. The sum
    over the others read as a loss of flow (one of two meters null: half the loop's flow, a 50 %
    cooling loss to the thermal detector). A connector that has never given a flow (no
    ``FlowLitersPerMinute`` at all, or only null: an unmetered connector) is left out of the
    sum, noted in ``unmetered``; the thermal detector reads flow against its own learnt
    baseline, so a constant set of meters is all it needs. One not read yet whose resource fails
    could be either: the flow is NaN then too.

    The supply temperature is the flow-weighted mean over the connectors that gave one where
    each of them gave a flow too, else their plain mean: weighting by the flows some gave moved
    the loop's supply temperature by as much as their spread when one meter went null.

    A connector's request that fails is its own problem; one that ends the CDU's read
    (:attr:`RedfishError.ends_the_read`) is raised. A 404 goes in ``gone``, or in ``gone_again``
    for a connector in ``gone_before`` (:class:`Relisting`): that one is left out of the loop."""
    metered = {} if metered is None else metered
    reading = CduReading()
    supplies: list[tuple[float, float | None]] = []
    flows: list[float] = []
    flow_missing = False
    for path in connectors:
        try:
            connector = fetch(path)
        except RedfishError as exc:
            if exc.ends_the_read:
                raise
            if exc.status == 404 and path in gone_before:
                reading.gone_again.append(path)
                flow_missing = flow_missing or metered.get(path) is True  # a meter lost (lost_meters)
                continue
            reading.problems.append(exc.reason)
            if exc.status == 404:
                reading.gone.append(path)
            flow_missing = flow_missing or metered.get(path) is not False
            continue
        if not isinstance(connector, Mapping):
            reading.problems.append(NOT_AN_OBJECT)
            flow_missing = flow_missing or metered.get(path) is not False
            continue
        supply = _excerpt(connector, "SupplyTemperatureCelsius", reading.problems)
        flow_excerpt = connector.get("FlowLitersPerMinute")
        has_reading = isinstance(flow_excerpt, Mapping) and flow_excerpt.get("Reading") is not None
        flow = _excerpt(connector, "FlowLitersPerMinute", reading.problems)
        if flow is not None and flow < 0:  # no pump runs backwards: a broken meter (it was dropped uncounted)
            reading.problems.append("CDU FlowLitersPerMinute out of range")
            flow = None
        if flow is not None:
            metered[path] = True
            flows.append(flow / 60.0)
        elif has_reading:  # a meter there, its reading unusable (counted above)
            flow_missing = True
        elif metered.get(path):
            reading.problems.append(CDU_NO_FLOW)
            flow_missing = True
        else:
            metered[path] = False
            reading.unmetered.append(path)
        if supply is not None:
            supplies.append((supply, flow))
    # a meter that gave a flow and is no longer among the connectors read (dropped after answering
    # 404 twice, or no longer listed): the others' sum would read as a loss of flow, the false
    # cooling loss a missing meter made before; no flow is published for the loop from then on
    reading.lost_meters = [path for path, had_flow in metered.items() if had_flow and path not in connectors]
    if flows and not flow_missing and not reading.lost_meters:
        reading.flow_lps = sum(flows)
    weights = [f for _, f in supplies if f is not None]
    if supplies and len(weights) == len(supplies) and sum(weights) > 0:
        reading.supply_c = sum(s * f for s, f in supplies if f is not None) / sum(weights)
    elif supplies:
        reading.supply_c = sum(s for s, _ in supplies) / len(supplies)
    return reading


class CduSource(_ParallelPolled):
    """Polls each cooling loop's CDU over Redfish every ``interval`` seconds; yields rack frames.

    ``cdus`` maps a cooling loop of ``topology`` to its CDU: the URL of its CoolingUnit resource
    (``https://HOST/redfish/v1/ThermalEquipment/CDUs/1``) or of a service with only one CDU. The
    CDU's secondary loop feeds every rack of the loop, so each of those racks gets its supply
    temperature as ``inlet_temp`` and ``coolant_temp``, and an equal share of its flow as
    ``coolant_flow`` (the thermal detector reads flow against its own learnt baseline, so the
    share's scale cancels; what matters is the CDU's flow falling). This is what gives a cooling
    loss its minutes of warning: the flow falls before any die warms. The flow is the sum over
    the connectors that have a meter, so a poll in which one of them gives no valid flow has NaN
    for it, counted (:func:`read_cdu`), never the others' sum (a connector that never gave a
    flow is left out, counted once: :data:`CDU_UNMETERED`); a CDU that gives neither supply
    temperature nor flow has no rows, counted (:data:`CDU_NOTHING_READ`). Credentials and TLS as
    for :class:`RedfishSource`.

    The CDUs are read in parallel, a poll waiting for them as for BMCs (:class:`ParallelReads`):
    one CDU that never answers no longer costs every loop its timeout at every poll. A CDU that
    cannot be found (unreachable, or no secondary loop) is tried again after 1, 2, 4, ... polls,
    at most :data:`CDU_RETRY_AT_MOST_S` apart.
    """

    stage = STAGE
    reads = ("rack",)
    stamps_at_start = False  # its rows when the poll ends

    def __init__(self, cdus: Mapping[str, str], topology: Topology, interval: float = 10.0,
                 health: PipelineHealth | None = None, max_polls: int | None = None, timeout: float = 10.0,
                 user: str | None = None, password: str | None = None, ca_file: str | None = None,
                 insecure: bool | None = None) -> None:
        super().__init__(interval, health, max_polls)
        if not cdus:
            raise ValueError("CduSource needs at least one loop's CDU")
        self._topology = topology
        self.racks: dict[str, np.ndarray] = {}
        for loop in cdus:
            if loop not in topology.loops:
                raise ValueError(f"cooling loop {loop!r} is not in the topology (its loops: "
                                 f"{', '.join(topology.loops[:8]) or 'none'})")
            racks = np.flatnonzero(topology.rack_loop == topology.loops.index(loop)).astype(np.int32)
            if not len(racks):
                raise ValueError(f"cooling loop {loop!r} feeds no rack in the topology")
            self.racks[loop] = racks
        self.loops = list(cdus)
        self.clients = clients(cdus, user, password, timeout, ca_file, insecure)
        self.connectors: dict[str, list[str]] = {}
        self.metered: dict[str, dict[str, bool]] = {}  # per loop, per connector: whether it has given a flow
        self.relisting = Relisting()
        self.answer_within = answer_within(self.interval, timeout)
        self._reads: ParallelReads[CduReading | None] = ParallelReads(min(32, len(self.loops)), "cdu")
        self._idle = threading.Event()  # no poll in hand (wind_down)
        self._idle.set()
        self._not_found: dict[str, int] = {}  # per loop, the failed discoveries in a row
        self._retry_in: dict[str, int] = {}  # per loop, the polls to let pass before discovering again
        self._most_polls_between = max(1, math.ceil(CDU_RETRY_AT_MOST_S / self.interval))

    def read_one(self, loop: str) -> CduReading | None:
        """One poll of the loop's CDU, or None when it failed (counted, the loop named). Its
        connectors, once found, are kept as a node's discovery is (:meth:`RedfishSource.read_one`)."""
        client = self.clients[loop]
        connectors = self.connectors.get(loop)
        try:
            if connectors is None:
                connectors = self.connectors[loop] = find_cdu(client.get, client.path)
                self._not_found.pop(loop, None)
            reading = read_cdu(client.get, connectors, self.metered.setdefault(loop, {}),
                               self.relisting.gone_before(loop))
        except RedfishError as exc:
            self._failed(loop, forget=exc.outdates_discovery)
            self.health.problem(STAGE, exc.reason, detail=f"{loop}: {exc.detail}")
            return None
        except Exception as exc:  # one CDU's unexpected answer must not cost the other loops their rows
            self._failed(loop, forget=True)
            self.health.problem(STAGE, "CDU answer not understood", detail=f"{loop}: {type(exc).__name__}: {exc}")
            return None
        if reading.gone_again:
            self.connectors[loop] = [path for path in connectors if path not in reading.gone_again]
        if self.relisting.after_read(loop, reading.gone, reading.gone_again):
            self.connectors.pop(loop, None)
        return reading

    def _failed(self, loop: str, forget: bool) -> None:
        """A read of the loop's CDU failed: one that could not be found at all waits twice as many
        polls as the last time before the next try; one found is found again at the next poll
        where ``forget`` (its connectors may have changed), else read with the same connectors."""
        if loop not in self.connectors:
            failed = self._not_found[loop] = self._not_found.get(loop, 0) + 1
            self._retry_in[loop] = min(2 ** (failed - 1), self._most_polls_between)
        elif forget:
            del self.connectors[loop]
            self.relisting.forget(loop)

    def _asked(self) -> list[str]:
        """The loops to read this poll: those not waiting to try their discovery again."""
        asked = []
        for loop in self.loops:
            wait_polls = self._retry_in.get(loop, 0)
            if wait_polls > 0 and loop not in self._reads.pending:
                self._retry_in[loop] = wait_polls - 1
                continue
            asked.append(loop)
        return asked

    def poll(self) -> list[Frame]:
        with _Polling(self._idle):
            return self._poll()

    def _poll(self) -> list[Frame]:
        answers, slow = self._reads.collect(self.read_one, self._asked(), self.answer_within)
        for loop in slow:
            self.health.problem(STAGE, "CDU answer too slow", detail=f"{loop}: {_no_answer(self)}")
        slots, ts, supply, flow = [], [], [], []
        for loop in self.loops:
            reading = answers.get(loop)
            if reading is None:
                continue
            for problem in reading.problems:
                self.health.problem(STAGE, problem, detail=loop)
            for reason, paths in ((CDU_UNMETERED, reading.unmetered), (LISTED_BUT_GONE, reading.gone_again),
                                  (CDU_METER_LOST, reading.lost_meters)):
                for path in paths:  # the CDU's configuration, the same at every poll: counted once
                    if count_once(self.counted_once, f"{loop}:{reason}:{path}"):
                        self.health.problem(STAGE, reason, detail=f"{loop}: {path}")
            if math.isnan(reading.supply_c) and math.isnan(reading.flow_lps):
                self.health.problem(STAGE, CDU_NOTHING_READ, detail=loop)
                continue
            racks = self.racks[loop]
            slots.append(racks)
            ts.append(np.full(len(racks), self.clock()))
            supply.append(np.full(len(racks), reading.supply_c))
            flow.append(np.full(len(racks), reading.flow_lps / len(racks)))
        if not slots:
            return []
        temps = np.concatenate(supply)
        return [Frame("rack", np.concatenate(ts), np.concatenate(slots),
                      {"inlet_temp": temps, "coolant_temp": temps, "coolant_flow": np.concatenate(flow)})]

