"""Frames through a real source's format: render each frame as the real tool would print it,
parse it back with the real importer, and pass on what the importer delivers.

``foreshock simulate --via`` and ``foreshock demo --via`` use this so that recordings and
detectors see exactly what the real path would give them, not the simulator's float64 truth:

=============  ===========  =====================================================================
``--via``      frames       what changes
=============  ===========  =====================================================================
``dcgm``       gpu          one dcgm-exporter scrape per frame through ``parse_dcgm_text``:
                            integer °C, MHz clocks, percent utilisation, mJ energy, µs
                            violation counters; power to 6 decimals; GPUs with a missing sample
                            are left out (no row), as the exporter leaves them out.
``nvidia-smi`` gpu          ``nvidia-smi --query-gpu`` CSV per node through ``parse_query_gpu``;
                            ``slowdown_temp``, ``energy``, ``xid_last``, ``pcie_replays`` and
                            ``hbm_max_op_temp`` have no query name and come back NaN, and so does
                            ``max_op_temp`` (a real CSV derives it from ``temperature.gpu.tlimit``,
                            which the renderer does not print); a missing sample is a row of
                            ``[N/A]`` (NaN values).
                            Both GPU formats carry each GPU's UUID (the ``UUID`` label, the
                            ``uuid`` column), read back as ``board_id`` as the live sources read
                            it: a simulated board swap comes through.
``sysfs``      link         each node's ``/sys/class/infiniband`` tree (a scratch folder)
                            through ``read_infiniband``: integer counters, data in 4-byte words;
                            ``pfc_pause_duration`` (an ethtool counter) comes back NaN; a link
                            with a missing sample is left out. Switch-to-switch links have no
                            host NIC, hence no sysfs: they pass through unchanged, as a switch-side
                            collector would deliver them.
=============  ===========  =====================================================================

Frames of the other kinds pass through unchanged. Which fields a format cannot carry is read
from the field table (:func:`fields_not_carried`). Parse problems are counted in
:class:`~foreshock.health.PipelineHealth` under the importer's own stage (``dcgm``,
``nvidia-smi``, ``infiniband``), exactly as for a live source.

The renderers are injected (:class:`FormatRenderers`; ``foreshock.simulator.formats``
satisfies it), so this module does not import the simulator: the command line wires the two.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Protocol

import numpy as np

from foreshock.fields import fields_of
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

from . import dcgm, infiniband, nvidia_smi
from .polling import GpuBoards

VIA_KIND: dict[str, str] = {"dcgm": "gpu", "nvidia-smi": "gpu", "sysfs": "link"}
"""Each ``--via`` format and the entity kind whose frames it carries."""
_TABLE_SOURCE = {"dcgm": "dcgm", "nvidia-smi": "nvidia_smi", "sysfs": "sysfs"}


class FormatRenderers(Protocol):
    """Writers of the real formats (``foreshock.simulator.formats`` is one)."""

    def dcgm_exposition(self, frame: Frame, topology: Topology) -> str: ...

    def nvidia_smi_csv(self, frame: Frame, topology: Topology, node: str) -> str: ...

    def infiniband_sysfs(self, frame: Frame, topology: Topology, node: str, root: str | Path) -> dict[str, str]: ...


CARRIED_AS_UUID = frozenset({"dcgm", "nvidia-smi"})
"""Formats that carry each GPU's UUID (dcgm-exporter's ``UUID`` label, nvidia-smi's ``uuid`` column),
read back as the ``board_id`` field (a string, so no name of the field table's)."""


def fields_not_carried(fmt: str) -> tuple[str, ...]:
    """Fields of the format's kind that it has no name for: NaN after the round trip."""
    kind = VIA_KIND[fmt]
    return tuple(f.name for f in fields_of(kind) if not f.sources.get(_TABLE_SOURCE[fmt])
                 and not (f.name == "board_id" and fmt in CARRIED_AS_UUID))


class ViaFormat:
    """Converts frames of one kind through a real format; see the module docstring.

    ``scratch`` is the folder under which the ``sysfs`` format writes its per-node trees (a
    fresh temporary folder inside it is removed by :meth:`close`); by default ``/dev/shm`` where
    it exists, since a tree per node per tick on a disk-backed folder costs milliseconds per
    directory, else the system's temporary folder.
    """

    def __init__(self, topology: Topology, fmt: str, renderers: FormatRenderers,
                 health: PipelineHealth | None = None, scratch: str | Path | None = None) -> None:
        if fmt not in VIA_KIND:
            raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(VIA_KIND)}")
        self.topology = topology
        self.format = fmt
        self.kind = VIA_KIND[fmt]
        self.renderers = renderers
        self.health = health if health is not None else PipelineHealth()
        self._scratch_parent = scratch if scratch is not None else _default_scratch()
        self._scratch: Path | None = None
        # each GPU's board, read from the UUIDs as the live source reads them (a swap is logged and
        # counted under the source's stage; the pipeline's guard restarts the GPU)
        self._boards = GpuBoards(self.health, dcgm.STAGE if fmt == "dcgm" else nvidia_smi.STAGE)
        if fmt == "sysfs":
            # Only links served by a host NIC have a sysfs view; the rest pass through.
            self._host_link = topology.link_gpu >= 0
            self._link_node = np.where(self._host_link, topology.gpu_node[np.maximum(topology.link_gpu, 0)], -1)

    # ---- iterator wrappers ---------------------------------------------------------------------------
    def frames(self, frames: Iterable[Frame]) -> Iterator[Frame]:
        """Every frame, those of this format's kind converted; the scratch tree is removed at the end."""
        try:
            for frame in frames:
                yield self.convert(frame)
        finally:
            self.close()

    def tick(self, frames: list[Frame]) -> list[Frame]:
        """One tick's frames (one per kind), converted where the kind matches."""
        return [self.convert(frame) for frame in frames]

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __enter__(self) -> "ViaFormat":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- conversion ------------------------------------------------------------------------------------
    def convert(self, frame: Frame) -> Frame:
        """The frame the real source path would deliver for ``frame`` (unchanged if another kind)."""
        if frame.kind != self.kind or not len(frame):
            return frame
        parts = [self._convert_at(frame.take(rows), float(frame.ts[rows[0]])) for rows in _rows_by_time(frame.ts)]
        out = parts[0] if len(parts) == 1 else Frame.concat(parts)
        return out.take(np.lexsort((out.slot, out.ts)))

    def _convert_at(self, frame: Frame, ts: float) -> Frame:
        if self.format == "dcgm":
            text = self.renderers.dcgm_exposition(frame, self.topology)
            uuids: dict[str, str] = {}
            batch = self._boards.tag(dcgm.parse_dcgm_text(text, ts, self.health, uuids=uuids), uuids, self.topology)
            return batch.to_frame(self.topology, self.health, dcgm.STAGE)
        if self.format == "nvidia-smi":
            node_of_row = self.topology.gpu_node[frame.slot]
            # nvidia-smi runs on each node and prints no hostname: one CSV per node.
            return Frame.concat([self._nvidia_smi_node(frame.take(rows), int(node_of_row[rows[0]]), ts)
                                 for rows in _groups(node_of_row)])
        return self._sysfs(frame, ts)

    def _nvidia_smi_node(self, frame: Frame, node: int, ts: float) -> Frame:
        host = self.topology.nodes[node]
        text = self.renderers.nvidia_smi_csv(frame, self.topology, host)
        uuids: dict[str, str] = {}
        batch = nvidia_smi.parse_query_gpu(text, host=host, health=self.health, ts=ts, uuids=uuids)
        return self._boards.tag(batch, uuids, self.topology).to_frame(self.topology, self.health, nvidia_smi.STAGE)

    def _sysfs(self, frame: Frame, ts: float) -> Frame:
        node_of_row = self._link_node[frame.slot]
        hosted = node_of_row >= 0
        parts = [frame.take(~hosted)] if not hosted.all() else []
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="foreshock-via-sysfs-", dir=self._scratch_parent))
        tick = Path(tempfile.mkdtemp(dir=self._scratch))
        try:
            hosted_rows = np.flatnonzero(hosted)
            for group in _groups(node_of_row[hosted_rows]):
                rows = hosted_rows[group]
                host = self.topology.nodes[int(node_of_row[rows[0]])]
                root = tick / host.replace("/", "_")
                names = self.renderers.infiniband_sysfs(frame.take(rows), self.topology, host, root)
                batch = infiniband.read_infiniband(root, host=host, ts=ts, health=self.health, link_names=names)
                parts.append(batch.to_frame(self.topology, self.health, infiniband.STAGE))
        finally:
            # A fresh tree per tick: a port left out this time must not be read from the last one.
            shutil.rmtree(tick, ignore_errors=True)
        return Frame.concat(parts) if parts else Frame.empty(self.kind)


def _default_scratch() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _rows_by_time(ts: np.ndarray) -> list[np.ndarray]:
    """Row indices per distinct timestamp (one group for a simulator tick)."""
    if ts[0] == ts[-1] and (ts == ts[0]).all():
        return [np.arange(len(ts))]
    return _groups(ts)


def _groups(keys: np.ndarray) -> list[np.ndarray]:
    """Row indices per distinct key, keys ascending, rows in their original order."""
    order = np.argsort(keys, kind="stable")
    starts = np.flatnonzero(np.diff(keys[order])) + 1
    return np.split(order, starts)
