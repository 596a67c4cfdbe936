"""Which detectors a bank runs, by name. Each entry is ``"module:Class"`` under
``foreshock.detectors``; the class takes ``(topology, **params)``.

Add a detector here with one line; the CLI's ``--detectors`` and the config refer to these
names. ``DEFAULT_BANK`` is what ``demo``, ``replay`` and the workers run.
"""

from __future__ import annotations

import importlib
import inspect
import numbers
import sys
from typing import Any

from foreshock.topology import Topology

from .base import Detector

DETECTORS: dict[str, str] = {
    "robust_zscore": "ewma_cusum:RobustZScoreDetector",
    "throttle_bits": "throttle_bits:ThrottleBitsDetector",
    "thermal": "thermal:ThermalDetector",
    "power": "power:PowerDetector",
    "cooling": "cooling:CoolingDetector",
    "straggler": "straggler:StragglerDetector",
    "threshold": "baselines:ThresholdDetector",
    "river_hst": "baselines:HalfSpaceTreesDetector",
    "sklearn": "baselines:SklearnDetector",
    "congestion": "congestion:CongestionDetector",
    "link_errors": "link_errors:LinkErrorsDetector",
    "optics": "optics:OpticsDetector",
    "xid": "xid:XidDetector",
    "mahalanobis": "mahalanobis:MahalanobisDetector",  # opt-in: not in DEFAULT_BANK
    "loop_warming": "loop_warming:LoopWarmingDetector",  # opt-in: GPU telemetry alone's cooling-loss warning
}

DEFAULT_BANK: list[str] = ["robust_zscore", "throttle_bits", "congestion", "link_errors", "optics",
                           "thermal", "power", "cooling", "straggler", "xid"]

PROCESSORS: dict[str, str] = {
    "incidents": "incidents:IncidentEngine",
}
"""Finding processors (they consume findings, not frames), by name."""

DEFAULT_PROCESSORS: list[str] = ["incidents"]


def _load(table: dict[str, str], name: str, what: str) -> Any:
    try:
        target = table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; known: {sorted(table)}") from None
    module_name, _, cls_name = target.partition(":")
    return getattr(importlib.import_module(f"foreshock.detectors.{module_name}"), cls_name)


def _number_params(cls: Any) -> set[str]:
    """The parameters ``cls`` takes as numbers: each whose default is a number (or that is typed
    ``float | None``), and, where it takes ``**params``, the names in its module's ``PARAMS`` table
    (the table ``--param`` help points to)."""
    out: set[str] = set()
    for key, param in inspect.signature(cls.__init__).parameters.items():
        if param.kind is param.VAR_KEYWORD:
            out.update(getattr(sys.modules[cls.__module__], "PARAMS", {}))
        elif isinstance(param.default, numbers.Real) and not isinstance(param.default, bool):
            out.add(key)
        elif param.default is None and isinstance(param.annotation, str):  # annotations are strings here
            kinds = {t.strip() for t in param.annotation.split("|")} - {"None"}
            if kinds and kinds <= {"float", "int"}:
                out.add(key)
    return out


def _check_numbers(cls: Any, params: dict[str, Any]) -> None:
    """ValueError naming the first number parameter given something else: a string reached the
    Numba kernels of some detectors (``threshold.off_hold_s=abc`` failed as a typing error once data
    came) and tripped others on a comparison that named neither parameter nor value."""
    numeric = _number_params(cls)
    for key, value in params.items():
        if key in numeric and not (isinstance(value, numbers.Real) and not isinstance(value, bool)):
            raise ValueError(f"{key} must be a number, not {value!r}")


def _construct(cls: Any, name: str, topology: Topology, params: dict[str, Any]) -> Any:
    """``cls(topology, **params)``; a parameter it cannot take is named in the error (a value that
    is not a number read "could not convert string to float: 'abc'", naming nothing)."""
    try:
        _check_numbers(cls, params)
        return cls(topology, **params)
    except (ValueError, TypeError) as exc:
        if not params or str(exc).startswith(f"{name}:"):
            raise
        given = ", ".join(f"{name}.{key}={value}" for key, value in params.items())
        raise ValueError(f"{name}: {exc} (parameters given: {given})") from None


def create(name: str, topology: Topology, **params: Any) -> Detector:
    return _construct(_load(DETECTORS, name, "detector"), name, topology, params)  # type: ignore[no-any-return]


def create_processor(name: str, topology: Topology, **params: Any) -> Any:
    """A finding processor such as the incident engine (see ``bank.FindingProcessor``)."""
    return _construct(_load(PROCESSORS, name, "processor"), name, topology, params)
