"""Transceiver DOM: parse ``ethtool -m`` for SFF-8636 (QSFP+/QSFP28), CMIS (QSFP-DD/OSFP)
and SFF-8472 (SFP) modules into optic samples, keeping lanes and thresholds.

ethtool prints ``\\t%-41s : value`` lines. Module level: ``Module temperature : 45.22 degrees
C / 113.39 degrees F``, ``Module voltage : 3.3359 V``. Per lane, ``Laser tx bias current
(Channel 1) : 8.162 mA``, ``Transmit avg optical power (Channel 1) : 1.0391 mW / 0.17 dBm``
and ``Rcvr signal avg optical power(Channel 1) : ...`` (SFF-8636 prints no space before the
parenthesis, CMIS does; both are read). Thresholds: ``Laser bias current high alarm threshold
: 130.000 mA``, ``Laser rx power low warning threshold : 0.2042 mW / -6.90 dBm``, ...;
flags: ``Module temperature high warning : On``, ``Rx loss of signal : [ Yes, No, No, No ]``.

Which key feeds which optic field is the field table's ``dom`` column (the key without its
``(Channel N)`` suffix). Lanes fold into one optic row as the table's help says:

* a lane is *in use* when its bias, TX power or RX power is above zero — a 4-lane 400G module
  in an 8-lane QSFP-DD cage prints lanes 5-8 as ``0.000 mA``, ``0.0000 mW / -inf dBm``; if no
  lane is in use (a dark module) all lanes count;
* ``tx_bias``: mean over lanes in use (amperes); ``tx_power``: the mean lane power in mW,
  in dBm; ``rx_power``: the weakest lane in use, in dBm; ``los``: 1 when any lane in use has
  lost signal;
* 0 mW is -inf dBm in ethtool's output; foreshock floors power at -40 dBm (0.0001 mW, the
  smallest non-zero reading of the 0.1 µW register) so detectors never see infinities.

Each value is read in the unit printed after its number (mA/uA/A, V/mV, degrees C, dBm or
mW/uW, converted to dBm): a number in any other unit, or in none, is counted as ``unexpected
unit`` and not used. A lane field's line without ``(Channel N)`` may list every lane (mlxlink
style, ``-1.40, -1.80, -9.90, -1.50 dBm``): lanes 1, 2, ... in order. A lane lacking a value the
other lanes have (output cut short) is counted as ``lane values missing``.

:class:`ModuleDom` keeps the per-lane arrays, the thresholds (base units: A, dBm, °C, V)
and the alarm/warning flags for detectors and reports that want more than the row.

The flags (``Laser rx power low alarm : On``; SFF-8636 per lane ``... alarm (Chan 2)``, older
ethtool ``... alarm (Channel 2)``) are kept but feed no rule, as levels or as findings:

* ethtool prints an SFF-8472 or SFF-8636 module's flags only where it prints its thresholds
  (both under ``sd.supports_alarms``: SFF-8636 page 03h present), and the module raises them
  against those very thresholds. A module printing its thresholds as 0 compares against 0: its
  RX power low alarm can never raise and its bias high alarm is always on. Its flags hold no
  level its thresholds lack.
* SFF-8636 and CMIS flags are latched, cleared on read (by ethtool, or first by the NIC's
  firmware): ``On`` says the condition happened at some time since the last read (the RX power
  low alarm of every link that was dark), not that the reading beside it is at a level.
* ethtool prints CMIS per-lane flags from ``page_11h[offset] & chan`` (the lane's index, not its
  bit): lane 1 always ``Off``, lane 8's flag never shown, others on the wrong lane.

Where a module has real thresholds, the optics detector judges every reading (and its trend)
against them, which says all a flag would, and earlier.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from foreshock.detectors.optics import MODULE_ALARM_FIELDS, MODULE_THRESHOLD_KEYS, module_alarm_usable
from foreshock.fields import source_index
from foreshock.frames import Frame
from foreshock.health import PipelineHealth

from .polling import EthtoolSource, count_once
from .samples import BatchBuilder, SampleBatch

STAGE = "dom"
DBM_FLOOR = -40.0
"""Optical power floor in dBm (0.0001 mW); a 0 mW reading is reported as this."""
MAX_LANES = 32
"""The most lanes ethtool numbers (from 1) in a module: CMIS's 4 banks of 8 (ethtool ``cmis.c``
``CMIS_MAX_CHANNEL_NUM``); SFF-8636 has 4, SFF-8472 1. A ``(Channel N)`` past it is counted as
``bad lane number`` and its line dropped."""

_LINE = re.compile(r"^\s*(\S.*?)\s*:\s?(.*?)\s*$")
_LANE = re.compile(r"^(.*?)\s*\((?:Channel|Chan)\s+(\d+)\)$")
_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf|nan)"
_READING = re.compile(rf"^{_NUMBER}\s*(.*?)$")
"""One reading of a value line: a number and the unit printed after it (``0.8913 mW``)."""
_TO_BASE: dict[str, dict[str, float]] = {
    "amperes": {"A": 1.0, "mA": 1e-3, "uA": 1e-6, "µA": 1e-6},
    "volts": {"V": 1.0, "mV": 1e-3},
    "celsius": {"degrees C": 1.0},
    # optical power: dBm as printed; a power in W units is scaled to mW here, then converted to dBm
    "dbm": {"dBm": 1.0, "mW": 1.0, "uW": 1e-3, "µW": 1e-3},
}
"""Per base unit of an optic field (the field table's ``unit``), the units a value line may print
and each one's factor to the base unit (to mW for optical power). Units are case-sensitive: ``MW``
is not ``mW``. A number followed by any other unit (or none) is counted as ``unexpected unit``."""
UNEXPECTED_UNIT = "unexpected unit"
LANE_LIST_ON_ONE_LANE = "lane list where one value belongs"
LANE_VALUES_MISSING = "lane values missing"
_THRESHOLD = re.compile(r"^(.*?)\s+(high|low)\s+(alarm|warning)\s+threshold$")
_THRESHOLD_FIELD = {
    "Laser bias current": ("tx_bias", "amperes"),
    "Laser output power": ("tx_power", "dbm"),
    "Laser rx power": ("rx_power", "dbm"),
    "Module temperature": ("module_temp", "celsius"),
    "Module voltage": ("module_voltage", "volts"),
}
# A module whose RX monitor measures OMA (SFF-8472 / SFF-8636 / CMIS "RX power type" bit clear)
# has ethtool print "Receiver signal OMA" where others print average power. Not the same number
# (OMA = 2 x average x (ER - 1) / (ER + 1)), but its trend in dB is, and the module's own RX
# thresholds are in the same terms: read as ``rx_power``, marked in ``ModuleDom.rx_power_type``.
# Unread, such a module had no RX power at all, and nothing said so.
_RX_OMA = "Receiver signal OMA"
_RX_AVG = "Rcvr signal avg optical power"
_SPEC_BY_ID = {0x03: "sff8472", 0x0C: "sff8636", 0x0D: "sff8636", 0x11: "sff8636",
               0x18: "cmis", 0x19: "cmis", 0x1B: "cmis", 0x1E: "cmis"}


def mw_to_dbm(mw: np.ndarray | float) -> np.ndarray:
    """mW -> dBm, floored at :data:`DBM_FLOOR`."""
    with np.errstate(divide="ignore", invalid="ignore"):
        dbm = 10.0 * np.log10(np.asarray(mw, dtype=np.float64))
    return np.where(np.isnan(dbm), np.nan, np.maximum(dbm, DBM_FLOOR))


def dbm_to_mw(dbm: np.ndarray | float) -> np.ndarray:
    return np.power(10.0, np.asarray(dbm, dtype=np.float64) / 10.0)


@dataclass
class ModuleDom:
    """One ``ethtool -m`` reading: module values, lanes, thresholds and flags (base units)."""

    identifier: str = ""
    spec: str = "unknown"
    temperature: float = math.nan
    voltage: float = math.nan
    lanes: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    tx_bias: np.ndarray = field(default_factory=lambda: np.empty(0))  # amperes per lane
    tx_power_dbm: np.ndarray = field(default_factory=lambda: np.empty(0))  # floored at DBM_FLOOR
    rx_power_dbm: np.ndarray = field(default_factory=lambda: np.empty(0))
    rx_los: np.ndarray = field(default_factory=lambda: np.empty(0))  # 1 lost, 0 not, NaN unknown
    thresholds: dict[str, float] = field(default_factory=dict)  # "rx_power_low_alarm" -> -8.9 (dBm)
    flags: dict[str, bool] = field(default_factory=dict)  # "Module temperature high warning" -> True
    rx_power_type: str = "average"  # "oma" where the module measures RX power as OMA

    @property
    def tx_power_mw(self) -> np.ndarray:
        return dbm_to_mw(self.tx_power_dbm)

    @property
    def rx_power_mw(self) -> np.ndarray:
        return dbm_to_mw(self.rx_power_dbm)

    def lanes_in_use(self) -> np.ndarray:
        """Lanes with any bias or light; all lanes when none has (see the module docstring)."""
        used = (np.nan_to_num(self.tx_bias) > 0) | (np.nan_to_num(self.tx_power_dbm, nan=DBM_FLOOR) > DBM_FLOOR) \
            | (np.nan_to_num(self.rx_power_dbm, nan=DBM_FLOOR) > DBM_FLOOR)
        return used if used.any() else np.ones(len(self.lanes), dtype=bool)

    def has_diagnostics(self) -> bool:
        return bool(np.isfinite(self.temperature) or len(self.lanes))

    def optic_values(self) -> dict[str, float]:
        """The optic row: module values and lanes folded as the field table says."""
        out = {"module_temp": self.temperature, "module_voltage": self.voltage}
        used = self.lanes_in_use()
        if len(self.lanes):
            with np.errstate(all="ignore"):
                bias = self.tx_bias[used]
                tx = self.tx_power_mw[used]
                rx = self.rx_power_dbm[used]
                out["tx_bias"] = float(np.nanmean(bias)) if np.isfinite(bias).any() else math.nan
                # Mean lane power in linear units (mW), reported in dBm.
                out["tx_power"] = float(mw_to_dbm(np.nanmean(tx))) if np.isfinite(tx).any() else math.nan
                out["rx_power"] = float(np.nanmin(rx)) if np.isfinite(rx).any() else math.nan
            los = self.rx_los[used]
            if np.isfinite(los).any():
                out["los"] = float(np.nanmax(los))
        # the module's own alarm levels ride along with its readings, so every path (recording,
        # Kafka, replay) hands the optics detector the thresholds this module is judged against
        # (a module that does not implement its thresholds page prints them as 0 mW / 0 mA: no level;
        # sent on, a 0 mA bias alarm had every bias past it and a link_down predicted "now"). The
        # optics detector's test of a level, so the two can never disagree on what is one.
        for col, (name, key) in enumerate(zip(MODULE_ALARM_FIELDS, MODULE_THRESHOLD_KEYS)):
            level = self.thresholds.get(key, math.nan)
            if module_alarm_usable(col, level):
                out[name] = level
        return out


def _los(text: str, lanes: int) -> np.ndarray | None:
    """``None`` / ``Yes`` / ``No`` / ``[ Yes, No, ... ]`` -> per-lane 1/0 (None when unreadable)."""
    value = text.strip()
    if value.lower() in ("none", "no"):
        return np.zeros(max(lanes, 1))
    if value.lower() == "yes":
        return np.ones(max(lanes, 1))
    if value.startswith("[") and value.endswith("]"):
        items = [item.strip().lower() for item in value[1:-1].split(",")]
        if all(item in ("yes", "no") for item in items):
            return np.array([1.0 if item == "yes" else 0.0 for item in items])
    return None


def parse_ethtool_m(text: str, health: PipelineHealth | None = None) -> ModuleDom:
    """Parse one module's ``ethtool -m`` output. Bad values are counted (stage ``dom``), never raised."""
    health = health if health is not None else PipelineHealth()
    lookup = source_index("dom")
    problems: Counter[str] = Counter()
    dom = ModuleDom()
    lane_values: dict[str, dict[int, float]] = {"tx_bias": {}, "tx_power": {}, "rx_power": {}}
    los_text: str | None = None

    for raw in text.splitlines():
        m = _LINE.match(raw)
        if m is None:
            continue
        key, value = re.sub(r"\s+", " ", m.group(1)), m.group(2)
        if key == "Identifier":
            dom.identifier = value
            try:
                dom.spec = _SPEC_BY_ID.get(int(value.split()[0], 16), "unknown")
            except (ValueError, IndexError):
                problems["bad identifier"] += 1
            continue
        lane_match = _LANE.match(key)
        base, lane = (lane_match.group(1), _lane_number(lane_match.group(2))) if lane_match else (key, -1)
        if lane is None:
            problems["bad lane number"] += 1
            continue

        threshold = _THRESHOLD.match(key)
        if threshold and threshold.group(1) in _THRESHOLD_FIELD:
            name, unit = _THRESHOLD_FIELD[threshold.group(1)]
            numbers = _one_value(value, unit, problems)
            if numbers is not None:
                dom.thresholds[f"{name}_{threshold.group(2)}_{threshold.group(3)}"] = numbers
            continue
        if value in ("On", "Off") and ("alarm" in key or "warning" in key):
            dom.flags[key] = value == "On"
            continue

        if base == _RX_OMA:
            base, dom.rx_power_type = _RX_AVG, "oma"
        mapped = lookup.get(base)
        if mapped is None:
            continue
        # the unit printed with the value says its scale (the field table's factor assumes one unit)
        fld = mapped[0]
        if fld.name == "los":
            los_text = value
            continue
        if fld.name in lane_values and lane < 0:
            # no (Channel N): one lane (SFF-8472), or every lane in one line (mlx5's mlxlink prints
            # "-1.40, -1.80, -9.90, -1.50 dBm"), lanes 1.. in order: each is kept, so that the
            # weakest lane is seen
            readings = _values(value, fld.unit, problems)
            if readings is None:
                continue
            if len(readings) > MAX_LANES:
                problems["bad lane number"] += 1
                continue
            for index, reading in enumerate(readings):
                lane_values[fld.name][index + 1] = reading
            continue
        number = _one_value(value, fld.unit, problems)
        if number is None:
            continue
        if fld.name in lane_values:
            lane_values[fld.name][lane] = number
        elif fld.name == "module_temp":
            dom.temperature = number
        elif fld.name == "module_voltage":
            dom.voltage = number

    lanes = sorted({lane for values in lane_values.values() for lane in values})
    # a lane lacking a value other lanes have (ethtool -m output cut short: lane 3's bias and TX
    # read, its RX not) is NaN there, which the fold skips: its weakest RX would vanish unsaid
    printed = [values for values in lane_values.values() if values]
    problems[LANE_VALUES_MISSING] += sum(any(lane not in values for values in printed) for lane in lanes)
    dom.lanes = np.asarray(lanes, dtype=np.int32)
    dom.tx_bias = np.array([lane_values["tx_bias"].get(lane, math.nan) for lane in lanes])
    dom.tx_power_dbm = np.array([lane_values["tx_power"].get(lane, math.nan) for lane in lanes])
    dom.rx_power_dbm = np.array([lane_values["rx_power"].get(lane, math.nan) for lane in lanes])
    dom.rx_los = np.full(len(lanes), math.nan)
    if los_text is not None:
        los = _los(los_text, len(lanes))
        if los is None:
            problems["unreadable loss-of-signal flags"] += 1
        elif len(lanes) and len(los) not in (1, len(lanes)):
            problems["loss-of-signal lanes do not match"] += 1
        else:
            dom.rx_los = np.resize(los, len(lanes)) if len(lanes) else los[:0]
    for reason, count in problems.items():
        if count:
            health.problem(STAGE, reason, count)
    return dom


def _lane_number(digits: str) -> int | None:
    """A ``(Channel N)`` suffix's lane, or None outside 1..:data:`MAX_LANES` (a garbled line: its
    number would not fit the module's int32 lane array, nor name a lane the module has)."""
    if len(digits) > len(str(MAX_LANES)):  # also keeps int() off a number thousands of digits long
        return None
    lane = int(digits)
    return lane if 1 <= lane <= MAX_LANES else None


def _values(text: str, unit: str, problems: Counter[str]) -> list[float] | None:
    """A DOM value line's readings in the base ``unit`` of its field (``amperes``, ``volts``,
    ``celsius``, ``dbm``): one, or one per lane for a comma list (``-1.40, -1.80 dBm``: numbers
    without a unit take the last one's). None, counted in ``problems``, when a reading has no
    number (``non-numeric value``) or no unit the field can be read in (``unexpected unit``).

    A reading is a number and its unit, possibly with others after ``/`` (``0.8913 mW / -0.50 dBm``,
    ``41.25 degrees C / 106.25 degrees F``): the first in a unit of the field is taken, a power's
    printed dBm before its mW (ethtool computes the dBm from the raw register, more precise than
    the mW printed with four decimals). A power in mW is converted to dBm: 0 mW (no light, ethtool's
    ``-inf dBm``) and ``-inf dBm`` become :data:`DBM_FLOOR`, which the lane fold reads as dark.
    """
    items = [item.strip() for item in text.split(",")]
    last = _READING.match(items[-1])
    shared_unit = last.group(2) if last else ""
    readings = []
    for item in items:
        bare = _READING.fullmatch(item)
        if bare and not bare.group(2):
            item = f"{item} {shared_unit}"
        reading = _reading(item, unit)
        if isinstance(reading, str):
            problems[reading] += 1
            return None
        readings.append(reading)
    return readings


def _one_value(text: str, unit: str, problems: Counter[str]) -> float | None:
    """:func:`_values` of a line that holds one value (a lane's, a module's, a threshold): a lane
    list there is counted (``lane list where one value belongs``) and not used."""
    readings = _values(text, unit, problems)
    if readings is not None and len(readings) != 1:
        problems[LANE_LIST_ON_ONE_LANE] += 1
        return None
    return readings[0] if readings else None


def _reading(text: str, unit: str) -> float | str:
    """One reading (``0.8913 mW / -0.50 dBm``) in the base ``unit``, or the problem's reason."""
    known = _TO_BASE[unit]
    found: dict[str, float] = {}
    numeric = False
    for part in text.split("/"):
        m = _READING.fullmatch(part.strip())
        if m is None:
            continue
        numeric = True
        if m.group(2) in known and m.group(2) not in found:
            found[m.group(2)] = float(m.group(1))
    if not found:
        return UNEXPECTED_UNIT if numeric else "non-numeric value"
    if unit != "dbm":
        printed, number = next(iter(found.items()))
        return number * known[printed]
    if not math.isnan(found.get("dBm", math.nan)):
        return max(found["dBm"], DBM_FLOOR)
    printed = next((name for name in found if name != "dBm"), "dBm")
    return float(mw_to_dbm(found[printed] * known[printed])) if printed != "dBm" else math.nan


def dom_batch(readings: Mapping[str, str], ts: float | Mapping[str, float], health: PipelineHealth | None = None,
              once: set[str] | None = None) -> tuple[SampleBatch, dict[str, ModuleDom]]:
    """Several modules' ``ethtool -m`` outputs (optic entity name -> text) -> an optic batch.

    ``ts`` stamps every row, or is each optic's own time (entity name -> time): a poller's, the time
    each module was read (:meth:`~.polling.EthtoolSource.read_times`), what its trend is judged on.

    With ``once`` (a polling source's, :func:`count_once`), a module without diagnostics counts
    the first time only: a passive copper cable has none, and will have none at the next poll.

    Returns the batch and each module's full :class:`ModuleDom` (lanes, thresholds, flags).
    """
    health = health if health is not None else PipelineHealth()
    builder = BatchBuilder("optic")
    modules = {}
    for entity, text in readings.items():
        dom = parse_ethtool_m(text, health)
        modules[entity] = dom
        if not dom.has_diagnostics():
            if count_once(once, entity):
                health.problem(STAGE, "module without diagnostics", detail=entity)
            continue
        builder.add(ts[entity] if isinstance(ts, Mapping) else ts, entity, dom.optic_values())
    return builder.build(), modules


class DomSource(EthtoolSource):
    """Runs ``ethtool -m IFACE`` for each interface every ``interval`` seconds; yields optic frames.

    ``interfaces`` maps an interface to its optic's name in the topology; without a topology
    each interface is the link ``<host>/<iface>`` and its module the optic at end ``a``.
    The latest :class:`ModuleDom` per optic stays in :attr:`modules`.
    """

    stage = STAGE
    reads = ("optic",)
    flag = "-m"
    entity_suffix = "#a"
    default_interval = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.modules: dict[str, ModuleDom] = {}

    def link_of(self, entity: str) -> str:
        return entity.rsplit("#", 1)[0]

    def poll(self) -> list[Frame]:
        readings = self.read_all()  # each module's row stamped when it was read, not when the poll began
        batch, modules = dom_batch(readings, self.read_times(readings), self.health, self.counted_once)
        self.modules.update(modules)
        assert self._topology is not None
        return [batch.to_frame(self._topology, self.health, STAGE)]
