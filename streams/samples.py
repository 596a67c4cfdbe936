"""Columnar sample batches from real sources, before entities have topology slots.

Every parser of a real capture (dcgm-exporter text, nvidia-smi CSV and dmon, IB sysfs,
``ethtool -m``/``-S``, the Alibaba optics CSV) produces a :class:`SampleBatch`: entity names
appear once in ``entities`` and rows refer to them by index, values are float64 columns in
base units (NaN = missing). Only at the edge, :meth:`SampleBatch.to_frame` resolves names to
slots of a :class:`~foreshock.topology.Topology`; rows of unknown entities are counted there,
never dropped silently.

The value helpers here turn the text tokens real tools print (``630.00 W``, ``[N/A]``,
``0x0000000000000001``, ``-inf dBm``) into floats and say which tokens were not numbers, so
each parser counts bad input the same way.
"""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from foreshock.fields import field_names
from foreshock.frames import Frame, in_time_order
from foreshock.health import PipelineHealth
from foreshock.topology import MAX_GPU_INDEX, UNKNOWN, Topology  # MAX_GPU_INDEX: re-exported here

# Tokens real tools print for "no value": the source is telling us the value is absent, which
# is not bad input (nvidia-smi prints several of these for every query on every GPU).
_MISSING_TOKENS = frozenset({
    "", "-", "n/a", "[n/a]", "[not supported]", "not supported",
    "[requested functionality has been deprecated]", "[insufficient permissions]", "none",
})

FAULT_TOKENS: Mapping[str, str] = {
    "[gpu is lost]": "GPU lost or requires reset",
    "[gpu requires reset]": "GPU lost or requires reset",
    "[unknown error]": "unknown error",
}
"""What nvidia-smi prints in a GPU's cells when the GPU, not the value, has failed (NVML's
``GPU_IS_LOST``, ``RESET_REQUIRED``, ``UNKNOWN``), lower-cased, to the problem reason it is counted
under; the most serious first. Not "no value": :func:`parse_token` reads them as bad input, and a
parser that knows its GPUs counts them once per GPU as it enters the state
(:func:`~foreshock.streams.nvidia_smi.parse_query_gpu`), not once per cell per poll."""


def token_fault(token: str) -> str | None:
    """The :data:`FAULT_TOKENS` reason ``token`` says, or None."""
    return FAULT_TOKENS.get(token.strip().lower())

_NUMBER_WITH_UNIT = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf|nan)\s*([A-Za-z%/]*)\s*$",
                               re.IGNORECASE)


U64_MAX = 2**64 - 1
"""The most a counter printed as an unsigned 64-bit integer (``%llu``: sysfs, ``ethtool -S``) can read."""
_DIGITS = re.compile(r"[0-9]+")


def parse_count(text: str) -> int:
    """A printed counter (``"123\\n"``) -> 123: ASCII digits only, at most :data:`U64_MAX`; anything
    else raises ValueError. ``int()`` took ``-7``, ``+7``, ``1_000``, other scripts' digits and values
    no u64 holds, each a value no kernel or driver prints, read as a count and counted nowhere."""
    stripped = text.strip(" \t\r\n")
    if _DIGITS.fullmatch(stripped) is None:
        raise ValueError(f"not a counter value: {stripped[:40]!r}")
    value = int(stripped)
    if value > U64_MAX:
        raise ValueError(f"over 64 bits: {value}")
    return value


def parse_token(token: str) -> tuple[float, bool]:
    """Parse one printed value into ``(value, ok)``.

    ``ok`` is False only for text that should have been a number and is not (a device fault,
    ``[GPU is lost]``, among them: :data:`FAULT_TOKENS`); tokens that mean "no value" (``[N/A]``,
    ``[Not Supported]``, ``-``) give ``(nan, True)``. A unit after the number (``630.00 W``,
    ``0 us``, ``1980 MHz``) is dropped here: a parser whose source prints a fixed unit per column
    checks it with :func:`parse_token_unit` (``630000 mW`` read as 630000 W was a bug).
    Hex (``0x...``) is read as an unsigned integer.
    """
    value, ok, _ = parse_token_unit(token)
    return value, ok


def parse_token_unit(token: str) -> tuple[float, bool, str]:
    """:func:`parse_token`, and the unit printed after the number ("" for none)."""
    try:
        return float(token), True, ""
    except ValueError:
        pass
    text = token.strip()
    if text.lower() in _MISSING_TOKENS:
        return math.nan, True, ""
    if text[:2] in ("0x", "0X"):
        try:
            return float(int(text, 16)), True, ""
        except (ValueError, OverflowError):  # (past 256 hex digits no float holds it)
            return math.nan, False, ""
    match = _NUMBER_WITH_UNIT.match(text)
    if match:
        return float(match.group(1)), True, match.group(2)
    return math.nan, False, ""


def parse_tokens(tokens: Sequence[str]) -> tuple[np.ndarray, int, int]:
    """Parse a column of tokens; returns ``(values, bad, nans)``.

    ``bad`` counts non-numeric tokens (they become NaN); ``nans`` counts tokens that spelled
    NaN literally, with a unit after it or not (``nan``, ``nan W``: a value the source produced
    but that carries no information).
    """
    out, bad, nans, _ = parse_tokens_units(tokens)
    return out, bad, nans


def parse_tokens_units(tokens: Sequence[str]) -> tuple[np.ndarray, int, int, dict[str, list[int]]]:
    """:func:`parse_tokens`, and the rows of each unit printed after a number (``{"W": [0, 1]}``;
    rows without one are in none)."""
    out = np.empty(len(tokens), dtype=np.float64)
    bad = 0
    nans = 0
    units: dict[str, list[int]] = {}
    for i, token in enumerate(tokens):
        value, ok, unit = parse_token_unit(token)
        if not ok:
            bad += 1
        elif value != value and token.strip().lower() not in _MISSING_TOKENS:
            nans += 1  # "nan", and "nan W" with its unit: a NaN the source printed, not "no value"
        if unit:
            units.setdefault(unit, []).append(i)
        out[i] = value
    return out, bad, nans, units


@dataclass
class SampleBatch:
    """Samples of one entity kind, entities by name (see the module docstring)."""

    kind: str
    entities: list[str]
    ts: np.ndarray
    entity: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ts = np.ascontiguousarray(self.ts, dtype=np.float64).reshape(-1)
        self.entity = np.ascontiguousarray(self.entity, dtype=np.int32).reshape(-1)
        known = set(field_names(self.kind))
        unknown = sorted(set(self.columns) - known)
        if unknown:
            raise ValueError(f"{self.kind} batch: unknown fields {unknown}")
        for name, col in list(self.columns.items()):
            col = np.ascontiguousarray(col, dtype=np.float64).reshape(-1)
            if len(col) != len(self.ts):
                raise ValueError(f"{self.kind} batch: column {name} has {len(col)} rows, expected {len(self.ts)}")
            self.columns[name] = col
        if len(self.entity) != len(self.ts):
            raise ValueError(f"{self.kind} batch: {len(self.entity)} entity rows for {len(self.ts)} timestamps")

    def __len__(self) -> int:
        return len(self.ts)

    @classmethod
    def empty(cls, kind: str) -> "SampleBatch":
        return cls(kind, [], np.empty(0), np.empty(0, np.int32), {})

    def column(self, name: str) -> np.ndarray:
        """A field's column, all-NaN when the source did not provide it."""
        col = self.columns.get(name)
        return col if col is not None else np.full(len(self), np.nan)

    def entity_names(self) -> list[str]:
        """Entity name of each row (for tests and summaries, not for hot paths)."""
        return [self.entities[i] for i in self.entity]

    def to_frame(self, topology: Topology, health: PipelineHealth | None = None, stage: str = "import") -> Frame:
        """Resolve entity names to slots; rows of entities the topology lacks are counted and left out."""
        slots_of_entities = topology.slots(self.kind, self.entities) if self.entities else np.empty(0, np.int32)
        slot = slots_of_entities[self.entity] if len(self) else np.empty(0, np.int32)
        known = slot >= 0
        if not known.all():
            missing = sorted({self.entities[i] for i in np.unique(self.entity[~known])})
            if health is not None:
                health.problem(stage, f"unknown {self.kind} entity", int((~known).sum()),
                               detail=", ".join(missing[:3]))
        if known.all():  # the common case: no copy of every column (an import can be gigabytes)
            return Frame(self.kind, self.ts, slot, dict(self.columns))
        return Frame(self.kind, self.ts[known], slot[known],
                     {name: col[known] for name, col in self.columns.items()})

    @staticmethod
    def concat(batches: Iterable["SampleBatch"]) -> "SampleBatch":
        """Join batches of one kind, merging their entity lists."""
        parts = list(batches)
        if not parts:
            raise ValueError("concat needs at least one batch")
        kind = parts[0].kind
        if any(b.kind != kind for b in parts):
            raise ValueError("concat: batches of different kinds")
        index: dict[str, int] = {}
        entity_parts = []
        for b in parts:
            remap = np.fromiter((index.setdefault(e, len(index)) for e in b.entities), dtype=np.int32,
                                count=len(b.entities))
            entity_parts.append(remap[b.entity] if len(b) else np.empty(0, np.int32))
        names = sorted({n for b in parts for n in b.columns}, key=field_names(kind).index)
        return SampleBatch(
            kind,
            list(index),
            np.concatenate([b.ts for b in parts]),
            np.concatenate(entity_parts),
            {n: np.concatenate([b.column(n) for b in parts]) for n in names},
        )

    def sorted_by_time(self) -> "SampleBatch":
        """Rows by time, then entity; a batch already in that order is returned as it is."""
        if in_time_order(self.ts, self.entity):
            return self
        order = np.lexsort((self.entity, self.ts))
        return SampleBatch(self.kind, self.entities, self.ts[order], self.entity[order],
                           {n: c[order] for n, c in self.columns.items()})


class BatchBuilder:
    """Accumulates rows of one kind into typed arrays (no per-sample Python objects kept)."""

    def __init__(self, kind: str, fields: Sequence[str] | None = None) -> None:
        self.kind = kind
        self.fields = list(fields if fields is not None else field_names(kind))
        self._entities: dict[str, int] = {}
        self._ts = array("d")
        self._entity = array("i")
        self._cols = {name: array("d") for name in self.fields}

    def entity_index(self, name: str) -> int:
        return self._entities.setdefault(name, len(self._entities))

    def add(self, ts: float, entity: str, values: Mapping[str, float]) -> None:
        self._ts.append(ts)
        self._entity.append(self.entity_index(entity))
        for name, col in self._cols.items():
            col.append(values.get(name, math.nan))

    def __len__(self) -> int:
        return len(self._ts)

    def build(self) -> SampleBatch:
        columns = {}
        for name, col in self._cols.items():
            values = np.frombuffer(col, dtype=np.float64).copy() if len(col) else np.empty(0)
            if not np.isnan(values).all():
                columns[name] = values
        return SampleBatch(
            self.kind,
            list(self._entities),
            np.frombuffer(self._ts, dtype=np.float64).copy() if len(self._ts) else np.empty(0),
            np.frombuffer(self._entity, dtype=np.int32).copy() if len(self._entity) else np.empty(0, np.int32),
            columns,
        )


def gpu_entity(host: str, index: int) -> str:
    """The GPU name Topology.from_gpu_hosts gives GPU ``index`` of node ``host``."""
    return f"{host}/gpu{index}"


class GpuIndexError(ValueError):
    """A ``HOST/gpuN`` name whose index is past :data:`MAX_GPU_INDEX` (counted as ``bad GPU index``)."""


# ASCII digits without leading zeros: the names gpu_entity gives. ``gpu01`` had been read as GPU 1,
# which a derived topology names ``gpu1``; ``gpu²`` passed str.isdigit() and int() refused it.
_GPU_INDEX = re.compile(r"0|[1-9][0-9]*")


class GpuHostError(ValueError):
    """A ``HOST/gpuN`` name whose HOST is empty or blank (``/gpu0``, a dcgm series with ``Hostname=" "``):
    no topology can name its node, so its rows are counted as an unknown gpu entity."""


def split_gpu_entity(name: str) -> tuple[str, int]:
    """``HOST/gpuN`` -> ``(HOST, N)``, the inverse of :func:`gpu_entity`. Raises
    :class:`GpuIndexError` where N is past :data:`MAX_GPU_INDEX`, :class:`GpuHostError` where HOST is
    empty or blank, ValueError for any other name."""
    host, sep, index = name.rpartition("/gpu")
    if not sep or not _GPU_INDEX.fullmatch(index):
        raise ValueError(f"not a GPU entity name: {name!r} (expected HOST/gpuN)")
    if len(index) > len(str(MAX_GPU_INDEX)) or int(index) > MAX_GPU_INDEX:  # (int() refuses 4300+ digits)
        raise GpuIndexError(f"GPU index over {MAX_GPU_INDEX}: {name!r}")
    if not host.strip():  # a node without a name: the topology refuses it, and aborted the whole import
        raise GpuHostError(f"GPU without a host: {name!r}")
    return host, int(index)


def gpu_topology(batches: Iterable[SampleBatch], cluster: str = "imported") -> Topology:
    """The topology the GPUs of some gpu batches imply (hostname + GPU index, one 'unknown' rack).
    GPUs whose host is empty or blank are left out (:class:`GpuHostError`): one such series had
    aborted the import of every other; :meth:`SampleBatch.to_frame` counts their rows as an unknown
    gpu entity. ValueError when no GPU is left."""
    pairs = []
    for b in batches:
        for e in b.entities:
            try:
                pairs.append(split_gpu_entity(e))
            except GpuHostError:
                continue
    if not pairs:
        raise ValueError("no GPUs found to build a topology from")
    return Topology.from_gpu_hosts(pairs, cluster=cluster)


def host_link_topology(host: str, links: Sequence[tuple[str, str]], cluster: str | None = None) -> Topology:
    """A topology for one host's network ports when the cluster's is not known.

    ``links`` holds ``(device, link_name)`` pairs (an HCA or NIC and one of its ports). The
    host is a node without GPUs (sysfs and ethtool do not say which GPU a NIC serves), each
    device a switch of tier ``hca``, each port a link from its device to ``unknown-peer``
    with its local optic at end ``a``. Links from a switch have no leaf, so leaf-level
    grouping does not apply to them. The cluster is named ``cluster``, else after the host (an import
    of a sysfs tree; live sources name it :data:`~foreshock.streams.polling.DERIVED_CLUSTER`).
    """
    devices = sorted({device for device, _ in links})
    return Topology.from_dict({
        "cluster": host if cluster is None else cluster,
        "rows": [{"name": UNKNOWN, "cooling_loop": UNKNOWN}],
        "racks": [{"name": UNKNOWN, "row": UNKNOWN}],
        "nodes": [{"name": host, "rack": UNKNOWN, "gpus": 0}],
        "switches": [{"name": f"{host}/{d}", "tier": "hca"} for d in devices]
        + [{"name": "unknown-peer", "tier": "leaf"}],
        "links": [{"name": name, "a": f"{host}/{device}", "b": "unknown-peer"} for device, name in links],
    })


def line_chunks(text: str, lines: int, start: int = 0) -> Iterator[str]:
    """``text`` from offset ``start`` in pieces of up to ``lines`` whole lines (``\\n`` ends a line,
    as ``read_text`` leaves them): an importer parses a file of millions of lines a piece at a
    time, so the Python objects of only one piece are alive at once. Slices of the text, not
    ``io.StringIO``, which holds four bytes a character."""
    pos = start
    while pos < len(text):
        end = pos
        for _ in range(lines):
            end = text.find("\n", end) + 1
            if end == 0:
                end = len(text)
                break
        yield text[pos:end]
        pos = end
