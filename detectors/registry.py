"""Which detectors a bank runs, by name. Each entry is ``"module:Class"`` under
``foreshock.detectors``; the class takes ``(topology, **params)``.

Add a detector here with one line; the CLI's ``--detectors`` and the config refer to these
names. ``DEFAULT_BANK`` is what ``demo``, ``replay`` and the workers run.
"""

from __future__ import annotations

import importlib
from typing import Any

from foreshock.topology import Topology

from .base import Detector

DETECTORS: dict[str, str] = {
    "robust_zscore": "ewma_cusum:RobustZScoreDetector",
    "throttle_bits": "throttle_bits:ThrottleBitsDetector",
}

DEFAULT_BANK: list[str] = ["robust_zscore", "throttle_bits"]


def create(name: str, topology: Topology, **params: Any) -> Detector:
    try:
        target = DETECTORS[name]
    except KeyError:
        raise ValueError(f"unknown detector {name!r}; known: {sorted(DETECTORS)}") from None
    module_name, _, cls_name = target.partition(":")
    module = importlib.import_module(f"foreshock.detectors.{module_name}")
    cls = getattr(module, cls_name)
    return cls(topology, **params)  # type: ignore[no-any-return]
