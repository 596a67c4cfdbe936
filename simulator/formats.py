"""Simulated telemetry in real sources' formats, so the real importers can be fed by the simulator.

- :func:`dcgm_exposition` — one dcgm-exporter scrape (Prometheus text) of a gpu frame: the
  field table's DCGM names, the exporter's units (MHz, mJ, µs, percent) and its labels
  (``gpu, UUID, pci_bus_id, device, modelName, Hostname``). GPUs with a missing sample are left
  out, as the exporter leaves out a GPU it could not read.
- :func:`nvidia_smi_csv` — ``nvidia-smi --query-gpu=... --format=csv`` output for one node, its
  last column the ``uuid``.
- :func:`infiniband_sysfs` — the ``/sys/class/infiniband`` tree of one node's NICs (one
  ``mlx5_<rail>`` device per GPU link) from a link frame, for the sysfs importer.

A GPU's UUID is that of the board in its slot at the frame's time: the one whose number is the
row's ``board_id`` (:func:`gpu_uuid`; a board swapped in by a ``gpu_replacement`` has a new
one), so the real importers read back the same ``board_id``. A row that carries none (NaN: a
frame recorded before the simulator carried boards) is served with the slot's first board's
UUID by dcgm, and ``[N/A]`` by nvidia-smi (its row of NaN is a failed read).

All read the field table (``core/fields.csv``), never a list of their own.
"""

from __future__ import annotations

import functools
import math
import zlib
from pathlib import Path

import numpy as np

from foreshock import facts
from foreshock.boards import board_id
from foreshock.fields import fields_of
from foreshock.frames import Frame
from foreshock.topology import Topology

MODEL_NAME = "NVIDIA H200"
_INTEGER_FIELDS = {"gpu_temp", "hbm_temp", "slowdown_temp", "max_op_temp", "hbm_max_op_temp", "sm_clock", "sm_clock_max", "util", "throttle_reasons",
                   "xid_last", "ecc_dbe", "pcie_replays", "remapped_rows", "energy", "power_throttle_time",
                   "thermal_throttle_time"}


def _uuid(name: str) -> str:
    a = zlib.crc32(name.encode())
    b = zlib.crc32(name.encode()[::-1])
    return f"GPU-{a:08x}-{b >> 16:04x}-{b & 0xFFFF:04x}-{a >> 16:04x}-{a:08x}{b & 0xFFFF:04x}"


MAX_BOARDS_PER_SLOT = 1000
"""How many boards of a slot :func:`uuid_of_board` tries (a run swaps a GPU's board a few times)."""


def gpu_uuid(name: str, number: int = 0) -> str:
    """The UUID of board ``number`` in GPU ``name``'s slot (0: the board it started with; one more
    at each swap), in NVML's ``GPU-8-4-4-4-12`` hex form; the same in every run, whatever the seed."""
    return _uuid(name if number == 0 else f"{name}#board{number}")


def uuid_of_board(name: str, board: float) -> str:
    """The UUID of the board numbered ``board`` (the ``board_id`` field) in GPU ``name``'s slot;
    the first board's for NaN (a frame that carries no board). ``ValueError`` for a number that
    is none of the slot's boards."""
    if math.isnan(board):
        return gpu_uuid(name)
    return _uuid_of_board(name, float(board))


@functools.lru_cache(maxsize=1 << 16)
def _uuid_of_board(name: str, board: float) -> str:
    for number in range(MAX_BOARDS_PER_SLOT):
        uuid = gpu_uuid(name, number)
        if board_id(uuid) == board:
            return uuid
    raise ValueError(f"board_id {board:.0f} of GPU {name} is none of the simulator's boards in that slot")


def _format(value: float, integer: bool) -> str:
    if integer:
        return str(int(round(value)))
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text or "0"


def dcgm_exposition(frame: Frame, topology: Topology, model_name: str = MODEL_NAME) -> str:
    """The text dcgm-exporter would serve for these GPUs (one sample per GPU of ``frame``)."""
    if frame.kind != "gpu":
        raise ValueError(f"dcgm-exporter serves gpu frames, not {frame.kind}")
    lines: list[str] = []
    labels = []
    for slot, board in zip(frame.slot, frame.columns["board_id"]):
        name = topology.gpus[slot]
        node = topology.nodes[int(topology.gpu_node[slot])]
        index = int(topology.gpu_index[slot])
        uuid = uuid_of_board(name, float(board))
        labels.append(f'gpu="{index}",UUID="{uuid}",pci_bus_id="00000000:{0x18 + 0x10 * index:02X}:00.0",'
                      f'device="nvidia{index}",modelName="{model_name}",Hostname="{node}"')
    rows = ~np.isnan(frame.matrix()).all(axis=1)
    for field in fields_of("gpu"):
        names = field.sources.get("dcgm")
        if not names:
            continue
        source = names[0]
        values = frame.columns[field.name] / source.scale
        lines.append(f"# HELP {source.name} {field.help}.")
        lines.append(f"# TYPE {source.name} {'counter' if field.is_counter else 'gauge'}")
        integer = field.name in _INTEGER_FIELDS
        for i in np.flatnonzero(rows):
            value = float(values[i])
            if math.isnan(value):
                continue
            lines.append(f"{source.name}{{{labels[i]}}} {_format(value, integer)}")
    return "\n".join(lines) + "\n"


def nvidia_smi_csv(frame: Frame, topology: Topology, node: str, model_name: str = MODEL_NAME) -> str:
    """``nvidia-smi --query-gpu=index,name,<fields>,uuid --format=csv,nounits`` for the GPUs of one
    node: values without their units (``77.71``, not ``77.71 W``), a bitmask in hex as nvidia-smi
    prints it in either form (``0x0000000000000020``; a parser that reads it as hex read a decimal
    ``32`` as 0x32, app-clock and sync-boost bits that were never set)."""
    fields = [f for f in fields_of("gpu") if f.sources.get("nvidia_smi")]
    header = ["index", "name"] + [f.sources["nvidia_smi"][0].name for f in fields] + ["uuid"]
    out = [", ".join(header)]
    boards = frame.columns["board_id"]
    node_slot = topology.slot("node", node)
    for row, slot in enumerate(frame.slot):
        if topology.gpu_node[slot] != node_slot:
            continue
        cells = [str(int(topology.gpu_index[slot])), model_name]
        for f in fields:
            value = float(frame.columns[f.name][row])
            if math.isnan(value):
                cells.append("[N/A]")
                continue
            native = value / f.sources["nvidia_smi"][0].scale
            cells.append(f"0x{int(native):016X}" if f.unit == "bitmask" else _format(native, f.name in _INTEGER_FIELDS))
        board = float(boards[row])
        cells.append("[N/A]" if math.isnan(board) else uuid_of_board(topology.gpus[slot], board))
        out.append(", ".join(cells))
    return "\n".join(out) + "\n"


_PORT_STATES = {float(facts.IB_PORT_STATE_ACTIVE): "ACTIVE", float(facts.IB_PORT_STATE_DOWN): "DOWN"}


def infiniband_sysfs(frame: Frame, topology: Topology, node: str, root: str | Path) -> dict[str, str]:
    """Write ``root/mlx5_<rail>/ports/1/...`` for the NIC link of each GPU of ``node``, as the
    kernel shows a RoCE port (``link_layer`` Ethernet: the ``np_*``/``rp_*`` congestion counters
    live in ``hw_counters/``); counters in the sysfs units (data in 4-byte words). A link with a
    missing sample is left out, as a port that could not be read. Returns the ``link_names``
    mapping (``"mlx5_<rail>/1"`` -> link name) that ``read_infiniband`` takes."""
    if frame.kind != "link":
        raise ValueError(f"sysfs port counters come from link frames, not {frame.kind}")
    node_slot = topology.slot("node", node)
    fields = [f for f in fields_of("link") if f.sources.get("sysfs")]
    names: dict[str, str] = {}
    for row, slot in enumerate(frame.slot):
        gpu = int(topology.link_gpu[slot])
        if gpu < 0 or topology.gpu_node[gpu] != node_slot:
            continue
        if all(math.isnan(float(frame.columns[f.name][row])) for f in fields):
            continue
        dev = f"mlx5_{int(topology.gpu_index[gpu])}"
        port = Path(root) / dev / "ports" / "1"
        for sub in ("counters", "hw_counters"):
            (port / sub).mkdir(parents=True, exist_ok=True)
        (port / "link_layer").write_text("Ethernet\n")
        for f in fields:
            source = f.sources["sysfs"][0]
            value = float(frame.columns[f.name][row])
            if math.isnan(value):
                continue
            if source.name == "state":
                text = f"{int(value)}: {_PORT_STATES.get(value, 'INIT')}"
            elif source.name == "rate":
                text = f"{value / 1e9:g} Gb/sec" + (" (4X NDR)" if value == 400e9 else "")
            else:
                text = str(int(round(value / source.scale)))
            sub = "hw_counters" if source.name.startswith(("np_", "rp_")) else "counters"
            (port / (sub if source.name not in ("state", "rate") else "") / source.name).write_text(text + "\n")
        names[f"{dev}/1"] = topology.links[slot]
    return names
