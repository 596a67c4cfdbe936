"""The detector contract.

A detector consumes whole frames of the entity kinds it names and returns findings::

    det = SomeDetector(topology, **params)
    findings = det.update(frame)        # frame.kind in det.kinds
    state = det.state_dict()            # numpy arrays and scalars only
    det2 = SomeDetector(topology, **params); det2.load_state_dict(state)   # identical future output

State lives in numpy arrays indexed by slot; the work happens in private ``@njit`` kernels
that take arrays and scalars only (see ``foreshock.numba_config``). Higher score = more
anomalous; deciding (thresholds) is separate from scoring.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from foreshock.findings import Finding
from foreshock.frames import Frame
from foreshock.remap import Remap
from foreshock.topology import Topology


def add_columns(state: dict[str, Any], key: str, width: int,
                copy_from: Mapping[int, int] | None = None) -> dict[str, Any]:
    """``state`` with its per-slot array ``key``, saved with fewer columns than ``width`` (before a
    column was added at the end), widened: each new column NaN, or a copy of the saved column
    ``copy_from`` names for it (``Detector.upgrade_state``). A state without ``key``, or whose
    array is anything else, is returned as it came (``load_state_dict`` judges its shape)."""
    arr = np.asarray(state.get(key))
    if arr.ndim != 2 or arr.shape[1] >= width:
        return state
    out = np.full((arr.shape[0], width), np.nan)
    out[:, :arr.shape[1]] = arr
    for new, old in (copy_from or {}).items():
        if new >= arr.shape[1]:
            out[:, new] = arr[:, old]
    return {**state, key: out}


def resolve_params(detector: str, defaults: dict[str, float], overrides: Mapping[str, Any]) -> dict[str, float]:
    """``defaults`` with ``overrides`` applied, as floats, in the defaults' order; a name that is
    not a parameter raises ``ValueError`` listing the known ones (a typo must not be ignored)."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(f"{detector}: unknown parameters {unknown}; known: {sorted(defaults)}")
    return {k: float(overrides.get(k, v)) for k, v in defaults.items()}


class Detector:
    """Base class: subclasses set ``name`` and ``kinds`` and implement ``update``.

    ``state_dict``/``load_state_dict`` default to every ``numpy.ndarray`` attribute whose name
    starts with ``s_`` plus the scalars listed in ``state_scalars``; override for anything else.
    Loading writes into the arrays the detector holds, so an array several detectors share (the
    thermal fit, see ``thermal_fit``) stays shared.
    """

    name: ClassVar[str] = "detector"
    kinds: ClassVar[tuple[str, ...]] = ()
    state_scalars: ClassVar[tuple[str, ...]] = ()
    # keys of the state a subclass's own state_dict adds and its own load_state_dict reads:
    # :meth:`load_state_dict` neither asks for them nor sets them
    state_extras: ClassVar[tuple[str, ...]] = ()
    # The entity kind whose slots index the first axis of each state array that has one: what
    # lets the state follow its entities to another topology (:meth:`remap_state`). An array not
    # listed must keep its shape whatever the hardware (a test builds every detector on grown
    # topologies and holds each one to this).
    slot_kinds: ClassVar[Mapping[str, str]] = {}

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def update(self, frame: Frame) -> list[Finding]:
        raise NotImplementedError

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The state arrays themselves (not copies): every ``s_*`` array attribute."""
        return {k: v for k, v in vars(self).items() if k.startswith("s_") and isinstance(v, np.ndarray)}

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {k: v.copy() for k, v in self.state_arrays().items()}
        for k in self.state_scalars:
            state[k] = getattr(self, k)
        return state

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` as this version keeps it, where it was saved by an earlier one (a state array
        that has since grown a column): a checkpoint written before an upgrade then goes on rather
        than being refused. Default: unchanged."""
        return state

    def previous_layout_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (this version's ``state_dict()``) as the version before this detector's last
        layout change kept it, where that change removed or rearranged columns (a width no longer
        its version's sign): what :meth:`upgrade_state` reads back. A worker's checkpoint is a delta
        from a fresh bank's state, and one written by that version is a delta from the fresh state
        as it kept it (``streams/kafka_worker.py``: ``apply_delta``). Default: unchanged."""
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = self.upgrade_state(state)
        own = self.state_dict()
        missing = sorted(set(own) - set(state) - set(self.state_extras))
        if missing:
            raise ValueError(f"{self.name}: state is missing {missing}")
        for k, v in state.items():
            if k in self.state_extras:
                continue
            if k not in own:
                raise ValueError(f"{self.name}: unexpected state key {k!r}")
            if isinstance(own[k], np.ndarray):
                arr = np.asarray(v, dtype=own[k].dtype)
                if arr.shape != own[k].shape:
                    raise ValueError(f"{self.name}: state {k!r} has shape {arr.shape}, expected {own[k].shape}")
                held = getattr(self, k, None)
                if isinstance(held, np.ndarray) and held.shape == arr.shape and held.dtype == arr.dtype \
                        and held.flags.writeable:
                    held[...] = arr
                else:
                    setattr(self, k, arr.copy())
            else:
                setattr(self, k, v)

    def remap_state(self, state: dict[str, Any], remap: Remap) -> dict[str, Any]:
        """``state``, saved under another topology, moved entity by entity onto this detector's
        (fresh rows for entities it did not have): load the result with :meth:`load_state_dict`.
        Override where an array holds slot *values* or counts derived from other arrays."""
        fresh = self.state_dict()
        return {k: remap.rows(self.slot_kinds[k], v, fresh[k]) if k in self.slot_kinds and k in fresh else v
                for k, v in self.upgrade_state(state).items()}

    def gauges(self) -> dict[str, tuple[str, np.ndarray, str]]:
        """Per-entity estimates worth exporting: ``name -> (entity kind, values by slot, help)``.

        The exporter publishes them for flagged entities and as per-rack maxima, e.g. a fitted
        thermal resistance. Default: none.
        """
        return {}

    def state_nbytes(self) -> int:
        return sum(v.nbytes for v in self.state_dict().values() if isinstance(v, np.ndarray))
