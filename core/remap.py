"""Moving slot-indexed state to another topology, entity by entity, by name.

Detector and guard state is kept in arrays indexed by slot (``detectors/base.py``), and a slot
is only a position in one topology file. When the hardware changes — a rack added, a node
retired, the file reordered — a worker restarted with the new file would otherwise have to
throw away every partition's learnt state (a GPU's thermal resistance baseline takes 30 loaded
minutes; its own history, hours). :class:`Remap` says, per entity kind, where each entity of the
saved topology sits now, so that state can follow its entity: an entity still listed under the
same name keeps its rows, a new one starts from the fresh rows, one no longer listed is left out.

Jobs are not handled here: they change with the scheduler's work and are found again by name
and nodes (``Topology.job_slot_map``) by the guard and the incident engine, the only parts that
keep state by job.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .topology import Topology

HARDWARE_KINDS = ("gpu", "link", "optic", "node", "rack")


def saved_slots(new_of_old: np.ndarray, n_new: int) -> np.ndarray:
    """The inverse of a map from saved slots to new ones (-1: gone): per new slot, the saved slot
    it takes its state from (-1: none, it starts fresh)."""
    old_of_new = np.full(n_new, -1, dtype=np.int64)
    found = np.flatnonzero(new_of_old >= 0)
    old_of_new[new_of_old[found]] = found
    return old_of_new


def take_rows(saved: np.ndarray, fresh: np.ndarray, old_of_new: np.ndarray, axis: int = 0) -> np.ndarray:
    """``fresh`` with, along ``axis``, each slot's row taken from ``saved`` where ``old_of_new``
    names one (-1: the fresh row stays)."""
    out = fresh.copy()
    rows_out = np.moveaxis(out, axis, 0)  # a view: writing it writes ``out``
    rows_saved = np.moveaxis(np.asarray(saved, dtype=fresh.dtype), axis, 0)
    take = np.flatnonzero(old_of_new >= 0)
    rows_out[take] = rows_saved[old_of_new[take]]
    return out


class Remap:
    """Per hardware kind, the saved slot of each entity of ``new`` (``old_of_new``, -1: start
    fresh) and the new slot of each entity of ``old`` (``new_of_old``, -1: gone; also for
    ``loop`` and ``switch``, by their names).

    ``keep``: per kind, a boolean mask over ``new``'s slots of the entities whose state is to be
    carried over; the others start fresh (a Kafka partition keeps only the entities it owns under
    the new topology: a rack that moved to another partition is that partition's now)."""

    def __init__(self, old: Topology, new: Topology, keep: Mapping[str, np.ndarray] | None = None) -> None:
        self.old_of_new: dict[str, np.ndarray] = {}
        self.new_of_old: dict[str, np.ndarray] = {}
        for kind in HARDWARE_KINDS:
            new_of_old = new.slots(kind, old.names(kind)).astype(np.int64)
            old_of_new = saved_slots(new_of_old, new.size(kind))
            if keep is not None and kind in keep:
                old_of_new[~np.asarray(keep[kind], dtype=bool)] = -1
            self.new_of_old[kind] = new_of_old
            self.old_of_new[kind] = old_of_new
        # not entity kinds, but an incident can be rooted at a cooling loop or a leaf switch
        for kind, old_names, new_names in (("loop", old.loops, new.loops), ("switch", old.switches, new.switches)):
            where = {name: i for i, name in enumerate(new_names)}
            self.new_of_old[kind] = np.array([where.get(name, -1) for name in old_names], dtype=np.int64)

    @classmethod
    def rearranged(cls, topology: Topology, gpu_from: np.ndarray) -> "Remap":
        """Within one topology, each GPU slot's state taken from the slot ``gpu_from`` names (its
        own: kept; another: a board that moved there; -1: start fresh); every other entity keeps
        its own. For boards renumbered within a node (``InputGuard.follow_boards``): the state
        follows the board, not the index."""
        remap = cls(topology, topology)
        old_of_new = np.asarray(gpu_from, dtype=np.int64).copy()
        if old_of_new.shape != (topology.size("gpu"),):
            raise ValueError(f"gpu_from has shape {old_of_new.shape}, expected ({topology.size('gpu')},)")
        new_of_old = np.full(len(old_of_new), -1, dtype=np.int64)
        taken = np.flatnonzero(old_of_new >= 0)
        new_of_old[old_of_new[taken]] = taken
        remap.old_of_new["gpu"], remap.new_of_old["gpu"] = old_of_new, new_of_old
        return remap

    def kept(self, kind: str) -> int:
        """How many entities of ``kind`` keep their saved state."""
        return int((self.old_of_new[kind] >= 0).sum())

    def rows(self, kind: str, saved: np.ndarray, fresh: np.ndarray, axis: int = 0) -> np.ndarray:
        """``fresh`` with, along ``axis`` (the slot axis, of ``kind``), each kept entity's rows
        taken from ``saved``. Every other axis must match: a ValueError says which does not."""
        old_of_new = self.old_of_new[kind]
        saved_shape, fresh_shape = list(np.shape(saved)), list(fresh.shape)
        if len(saved_shape) != len(fresh_shape) or saved_shape.pop(axis) != len(self.new_of_old[kind]) or \
                fresh_shape.pop(axis) != len(old_of_new) or saved_shape != fresh_shape:
            raise ValueError(f"a saved {kind} array of shape {np.shape(saved)} does not fit {fresh.shape} "
                             f"along axis {axis}")
        return take_rows(saved, fresh, old_of_new, axis)

    def slots(self, kind: str, saved_slots: np.ndarray) -> np.ndarray:
        """Saved slot *values* (an array that names entities, e.g. the link blamed for a port's
        congestion) in the new numbering; -1 where the entity is gone or the value was -1."""
        values = np.asarray(saved_slots, dtype=np.int64)
        table = self.new_of_old[kind]
        out = np.full(values.shape, -1, dtype=np.int64)
        ok = (values >= 0) & (values < len(table))
        out[ok] = table[values[ok]]
        return out
