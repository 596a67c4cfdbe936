"""The field table: every telemetry field foreshock knows, read from ``fields.csv``.

Parsers, the simulator, the exporter and the docs all read this table; nothing repeats it
by hand. Each source column holds that source's name for the field, ``|``-separated aliases,
and an optional ``*scale`` that converts the source's unit into foreshock's base unit
(``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION*0.001``: millijoules to joules).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import numpy as np

ENTITY_KINDS: tuple[str, ...] = ("gpu", "link", "optic", "node", "rack", "job")
"""Entity kinds, in the order topology slots are laid out."""

SOURCES: tuple[str, ...] = ("dcgm", "nvidia_smi", "dmon", "sysfs", "dom", "ethtool")
"""Real sources whose names the field table records."""


@dataclass(frozen=True)
class SourceName:
    """One name of a field in a real source, with the factor to base units."""

    name: str
    scale: float = 1.0


@dataclass(frozen=True)
class Field:
    """One telemetry field."""

    name: str
    kind: str
    unit: str
    type: str  # "gauge" or "counter"
    help: str
    sources: dict[str, tuple[SourceName, ...]] = field(default_factory=dict)

    @property
    def is_counter(self) -> bool:
        return self.type == "counter"

    @property
    def valid(self) -> tuple[float, float]:
        """The values a sensor of this field can read at all (see :data:`VALID_BY_UNIT`)."""
        if self.is_counter:
            return (-math.inf, math.inf)  # wraps, resets and going backwards are the detectors' to count
        return VALID_BY_FIELD.get(self.name) or VALID_BY_UNIT.get(self.unit, (-math.inf, math.inf))

    @property
    def whole(self) -> bool:
        """Whether only whole numbers are values of this field (see :data:`WHOLE_UNITS`)."""
        return self.unit in WHOLE_UNITS and not self.is_counter


# What a gauge can read at all, so wide that no working sensor leaves it: a value outside is a
# sentinel or a unit mix-up (65535, -1, a raw RPM given as a share, 6553.5 °C), and the guard
# sets it to NaN and counts it instead of letting a detector forecast from it.
VALID_BY_UNIT: dict[str, tuple[float, float]] = {
    "celsius": (-60.0, 200.0),
    "watts": (0.0, 1e7),
    "hertz": (0.0, 1e11),
    "ratio": (0.0, 1.2),  # a chassis fan may run a little over its rated full speed
    "dbm": (-100.0, 40.0),
    "volts": (0.0, 50.0),
    "amperes": (0.0, 10.0),
    "liters_per_second": (0.0, 1e5),
    "seconds": (0.0, 1e7),
    "bitmask": (0.0, math.inf),
    "code": (0.0, math.inf),
    "state": (0.0, math.inf),
    "flag": (0.0, 1.0),
    "bits_per_second": (0.0, math.inf),
}
VALID_BY_FIELD: dict[str, tuple[float, float]] = {
    "power": (0.0, 5000.0),  # one GPU board: 700 W on an H200, ~1.2 kW on a B200
    "power_limit": (0.0, 5000.0),
    "psu_power": (0.0, 1e5),  # one node
    # NVIDIA's XIDs are numbered in the low hundreds; a code past 1023 is a garbled reading, and each
    # distinct one had made a new foreshock_xid_events_total series per GPU, kept for good
    "xid_last": (0.0, 1023.0),
    # no driver defines 40 throttle reason bits (gpu_inputs.REASON_BITS_LIMIT): a larger value is a
    # sentinel every detector reads as no bitmask, and went uncounted
    "throttle_reasons": (0.0, 2.0 ** 40 - 1.0),
}
WHOLE_UNITS = frozenset({"code", "bitmask"})
"""Units whose readings are whole numbers: 79.5 is no XID and 64.5 no bitmask (two series averaged,
a garbled cell); the guard sets such a value to NaN and counts it (``not_whole``)."""


def _parse_source_cell(cell: str) -> tuple[SourceName, ...]:
    names = []
    for alias in filter(None, (part.strip() for part in cell.split("|"))):
        name, _, scale = alias.partition("*")
        names.append(SourceName(name.strip(), float(scale) if scale else 1.0))
    return tuple(names)


@lru_cache(maxsize=1)
def load_fields() -> tuple[Field, ...]:
    """Read and validate the packaged field table."""
    text = resources.files("foreshock").joinpath("fields.csv").read_text(encoding="utf-8")
    out: list[Field] = []
    seen: set[str] = set()
    for lineno, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        name = row["name"]
        if name in seen:
            raise ValueError(f"fields.csv:{lineno}: duplicate field {name!r}")
        if row["kind"] not in ENTITY_KINDS:
            raise ValueError(f"fields.csv:{lineno}: unknown entity kind {row['kind']!r}")
        if row["type"] not in ("gauge", "counter"):
            raise ValueError(f"fields.csv:{lineno}: type must be gauge or counter")
        seen.add(name)
        sources = {s: _parse_source_cell(row.get(s) or "") for s in SOURCES}
        out.append(
            Field(
                name=name,
                kind=row["kind"],
                unit=row["unit"],
                type=row["type"],
                help=row["help"],
                sources={s: v for s, v in sources.items() if v},
            )
        )
    return tuple(out)


@lru_cache(maxsize=None)
def fields_of(kind: str) -> tuple[Field, ...]:
    """Fields of one entity kind, in table order (this is the column order of frames)."""
    if kind not in ENTITY_KINDS:
        raise ValueError(f"unknown entity kind {kind!r}; expected one of {ENTITY_KINDS}")
    return tuple(f for f in load_fields() if f.kind == kind)


@lru_cache(maxsize=None)
def field_names(kind: str) -> tuple[str, ...]:
    return tuple(f.name for f in fields_of(kind))


@lru_cache(maxsize=None)
def get_field(name: str) -> Field:
    for f in load_fields():
        if f.name == name:
            return f
    raise KeyError(f"unknown field {name!r}")


@lru_cache(maxsize=None)
def valid_bounds(kind: str, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of ``names`` (fields of ``kind``) as arrays, in that order; an open
    end is the largest finite float, so a bound test also fails for ±inf (the guard's one test)."""
    by_name = {f.name: f.valid for f in fields_of(kind)}
    top = float(np.finfo(np.float64).max)
    lo = np.array([max(by_name[n][0], -top) for n in names], dtype=np.float64)
    hi = np.array([min(by_name[n][1], top) for n in names], dtype=np.float64)
    lo.flags.writeable = hi.flags.writeable = False  # cached: shared by every caller
    return lo, hi


@lru_cache(maxsize=None)
def whole_only(kind: str, names: tuple[str, ...]) -> np.ndarray:
    """Whether each of ``names`` (fields of ``kind``) takes whole numbers only (:attr:`Field.whole`)."""
    by_name = {f.name: f.whole for f in fields_of(kind)}
    out = np.array([by_name[n] for n in names], dtype=np.bool_)
    out.flags.writeable = False  # cached: shared by every caller
    return out


@lru_cache(maxsize=None)
def source_preference(source: str) -> dict[str, int]:
    """Each name a source uses -> its place among its field's names (0: the first listed). Where
    a source serves a field under several names at once — dcgm-exporter's profiling set prints
    ``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, two measures of the same
    business — the first listed is read and the others left alone, not averaged with it."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; expected one of {SOURCES}")
    return {sn.name: rank for f in load_fields() for rank, sn in enumerate(f.sources.get(source, ()))}


@lru_cache(maxsize=None)
def source_index(source: str) -> dict[str, tuple[Field, float]]:
    """Map each name a source uses (aliases included) to (field, scale to base units)."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; expected one of {SOURCES}")
    index: dict[str, tuple[Field, float]] = {}
    for f in load_fields():
        for sn in f.sources.get(source, ()):
            index[sn.name] = (f, sn.scale)
    return index
