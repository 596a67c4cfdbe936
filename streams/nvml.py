"""NVML (nvidia-ml-py): read the gpu fields straight from the driver on an interval.

NVML is what nvidia-smi and DCGM read underneath, without their formatting. Each gpu field
has one reader below, converting NVML's units to foreshock's base units (mW -> W, mJ -> J,
MHz -> Hz, percent -> ratio, ns -> s). A reader the GPU does not support (``Not Supported``,
``Function Not Found`` on older drivers) is remembered and not called again: its column stays
NaN without noise; any other NVML error is counted and gives NaN for that poll. The last XID
needs an NVML event set and is not read here (dcgm-exporter reports it).

Each GPU's UUID is read too (:attr:`NvmlSource.reads_boards`), one ``nvmlDeviceGetUUID`` per GPU
and poll (bytes from older pynvml, str from newer ones), and carried as the ``board_id`` field: a
GPU whose UUID changes from one known to another is another board in its slot (an RMA), logged
and counted here and started afresh by the pipeline (:class:`~foreshock.streams.polling.GpuBoards`,
the rule every UUID-reading source follows). A UUID that cannot be read is no UUID that poll (no
change), counted like any other failed call, never a crash.

``record_nvml(out_dir, duration, interval)`` writes a recording from the local GPUs, for
example on a real H200::

    python -m foreshock.streams.nvml h200-rec 60 1      # 60 s at 1 s
"""

from __future__ import annotations

import math
import socket
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np

from foreshock.frames import Frame
from foreshock.guard import MIN_INTERVAL_S
from foreshock.health import PipelineHealth
from foreshock.recording import RecordingWriter
from foreshock.topology import Topology

from .polling import GpuBoards, PollingSource
from .samples import SampleBatch, gpu_entity

STAGE = "nvml"

Reader = Callable[[ModuleType, Any], float]


def _memory_temp(nv: ModuleType, h: Any) -> float:
    value = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_MEMORY_TEMP])[0]
    if value.nvmlReturn != nv.NVML_SUCCESS:
        raise nv.NVMLError(value.nvmlReturn)
    kind = value.valueType
    if kind == nv.NVML_VALUE_TYPE_DOUBLE:
        return float(value.value.dVal)
    if kind in (nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, nv.NVML_VALUE_TYPE_UNSIGNED_LONG):
        return float(value.value.ullVal)
    if kind == nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(value.value.sllVal)
    return float(value.value.uiVal)


def _clock_event_reasons(nv: ModuleType, h: Any) -> float:
    getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    return float(getter(h))


READERS: dict[str, Reader] = {
    "gpu_temp": lambda nv, h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
    "hbm_temp": _memory_temp,
    "slowdown_temp": lambda nv, h: float(nv.nvmlDeviceGetTemperatureThreshold(
        h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
    # the max operating temperatures (GPU_MAX = 3, MEM_MAX = 2): a GPU that has none raises
    # NOT_SUPPORTED, read as no value (and not asked again); an older pynvml lacks the names
    "max_op_temp": lambda nv, h: float(nv.nvmlDeviceGetTemperatureThreshold(
        h, getattr(nv, "NVML_TEMPERATURE_THRESHOLD_GPU_MAX", 3))),
    "hbm_max_op_temp": lambda nv, h: float(nv.nvmlDeviceGetTemperatureThreshold(
        h, getattr(nv, "NVML_TEMPERATURE_THRESHOLD_MEM_MAX", 2))),
    "power": lambda nv, h: nv.nvmlDeviceGetPowerUsage(h) * 1e-3,
    "power_limit": lambda nv, h: nv.nvmlDeviceGetEnforcedPowerLimit(h) * 1e-3,
    "energy": lambda nv, h: nv.nvmlDeviceGetTotalEnergyConsumption(h) * 1e-3,
    "sm_clock": lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) * 1e6,
    "sm_clock_max": lambda nv, h: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM) * 1e6,
    "util": lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).gpu * 1e-2,
    "throttle_reasons": _clock_event_reasons,
    "power_throttle_time": lambda nv, h: nv.nvmlDeviceGetViolationStatus(
        h, nv.NVML_PERF_POLICY_POWER).violationTime * 1e-9,
    "thermal_throttle_time": lambda nv, h: nv.nvmlDeviceGetViolationStatus(
        h, nv.NVML_PERF_POLICY_THERMAL).violationTime * 1e-9,
    "ecc_dbe": lambda nv, h: float(nv.nvmlDeviceGetTotalEccErrors(
        h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)),
    "pcie_replays": lambda nv, h: float(nv.nvmlDeviceGetPcieReplayCounter(h)),
    "remapped_rows": lambda nv, h: float(nv.nvmlDeviceGetRemappedRows(h)[1]),
}
"""gpu field -> reader returning the value in base units."""


def load_nvml() -> ModuleType:
    """Import nvidia-ml-py and initialise NVML; raises ``pynvml.NVMLError`` without a driver."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


class NvmlSource(PollingSource):
    """Reads every local GPU through NVML every ``interval`` seconds; yields gpu frames.

    ``nvml`` is an initialised pynvml module (default: :func:`load_nvml`); the topology is this
    host with its GPUs unless one is given (then ``host`` must name a node in it).

    With :attr:`reads_boards` (on unless turned off) each GPU's UUID is read at every poll and
    carried as ``board_id`` (the module docstring); off, no UUID is read.
    """

    stage = STAGE
    reads = ("gpu",)

    def __init__(self, interval: float = 1.0, host: str | None = None, topology: Topology | None = None,
                 health: PipelineHealth | None = None, max_polls: int | None = None,
                 nvml: ModuleType | None = None) -> None:
        super().__init__(interval, health, max_polls)
        self.nv = nvml if nvml is not None else load_nvml()
        self.host = host or socket.gethostname()
        count = int(self.nv.nvmlDeviceGetCount())
        # a GPU that fell off the bus is still counted but has no handle: the others are read,
        # and its handle is asked for again at every poll (a reset can bring it back)
        self.handles: list[Any | None] = [self._handle(i) for i in range(count)]
        self.fields = list(READERS)
        self.supported = np.ones((count, len(self.fields)), dtype=bool)
        self._entities = [gpu_entity(self.host, i) for i in range(count)]
        self._topology = topology if topology is not None else Topology.from_gpu_hosts(
            [(self.host, i) for i in range(count)])
        self.reads_boards = True  # each GPU's UUID, carried as board_id (the module docstring)
        self._boards = GpuBoards(self.health, STAGE)
        self._uuid_unsupported: set[int] = set()  # GPUs whose UUID NVML does not give

    def _handle(self, index: int) -> Any | None:
        try:
            return self.nv.nvmlDeviceGetHandleByIndex(index)
        except self.nv.NVMLError as exc:
            self.health.problem(STAGE, "GPU handle unavailable",
                                detail=f"GPU {index}: {exc} (fallen off the bus? it is asked for again at every poll)")
            return None

    def read(self) -> SampleBatch:
        """One reading of every GPU (a row per GPU that has a handle)."""
        now = self.clock()
        nv = self.nv
        values = np.full((len(self.handles), len(self.fields)), np.nan)
        unsupported = {getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3), getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)}
        uuids: dict[str, str] = {}
        for g, handle in enumerate(self.handles):
            if handle is None:
                handle = self.handles[g] = self._handle(g)
                if handle is None:
                    continue
            for f, name in enumerate(self.fields):
                if not self.supported[g, f]:
                    continue
                value, self.supported[g, f] = self._call(g, name, lambda: READERS[name](nv, handle), unsupported)
                if value is not None:
                    values[g, f] = value if math.isfinite(value) else np.nan
            if self.reads_boards:
                uuids[self._entities[g]] = self._uuid(g, handle, unsupported)
        present = np.array([h is not None for h in self.handles], dtype=bool)
        values = values[present]
        columns = {name: values[:, f] for f, name in enumerate(self.fields) if not np.isnan(values[:, f]).all()}
        batch = SampleBatch("gpu", self._entities, np.full(len(values), now), np.flatnonzero(present).astype(np.int32),
                            columns)
        if uuids:
            assert self._topology is not None
            batch = self._boards.tag(batch, uuids, self._topology)
        return batch

    def _call(self, index: int, what: str, read: Callable[[], Any], unsupported: set[int]) -> tuple[Any, bool]:
        """``(read(), True)`` for GPU ``index``, or ``(None, supported)`` where NVML fails: an error
        saying the GPU does not support it gives ``False`` (the caller asks no more), any other is
        counted (``what`` names the call) and asked again at the next poll."""
        try:
            return read(), True
        except self.nv.NVMLError as exc:
            if getattr(exc, "value", None) in unsupported:
                return None, False
            self.health.problem(STAGE, "NVML call failed", detail=f"{what} on GPU {index}: {exc}")
            return None, True

    def _uuid(self, index: int, handle: Any, unsupported: set[int]) -> str:
        """GPU ``index``'s UUID; "" (no change) when it cannot be read: a failed call is counted,
        one the GPU does not support is remembered and not made again, as a reader's."""
        if index in self._uuid_unsupported:
            return ""
        uuid, supported = self._call(index, "uuid", lambda: self.nv.nvmlDeviceGetUUID(handle), unsupported)
        if not supported:
            self._uuid_unsupported.add(index)
        if uuid is None:
            return ""
        # older pynvml returns the C string as bytes; newer ones decode it (nvidia-ml-py 13.615: a str)
        text = uuid.decode("ascii", errors="replace") if isinstance(uuid, bytes) else str(uuid)
        return text.strip()

    def poll(self) -> list[Frame]:
        assert self._topology is not None
        return [self.read().to_frame(self._topology, self.health, STAGE)]


def record_nvml(out_dir: str | Path, duration: float, interval: float = 1.0, health: PipelineHealth | None = None,
                nvml: ModuleType | None = None) -> dict[str, Any]:
    """Record the local GPUs for ``duration`` seconds into a recording folder; returns a summary."""
    health = health if health is not None else PipelineHealth()
    polls = max(1, int(math.ceil(duration / interval)))
    source = NvmlSource(interval=interval, health=health, max_polls=polls, nvml=nvml)
    assert source.topology is not None
    meta = {"source": "nvml", "interval": interval, "host": source.host}
    rows = 0
    with RecordingWriter(out_dir, source.topology, meta=meta) as writer:
        for frame in source:
            writer.write(frame)
            rows += len(frame)
    unsupported = {source.fields[f] for g, f in zip(*np.nonzero(~source.supported))}
    return {"path": str(out_dir), "gpus": len(source.handles), "polls": source.polls, "rows": rows,
            "unsupported_fields": sorted(unsupported), "problems": health.total_problems()}


if __name__ == "__main__":  # python -m foreshock.streams.nvml OUT_DIR [DURATION_S [INTERVAL_S]]
    import json
    import sys

    usage = "usage: python -m foreshock.streams.nvml OUT_DIR [DURATION_S [INTERVAL_S]]"
    if not 2 <= len(sys.argv) <= 4:
        sys.exit(usage)
    args = sys.argv[1:]
    try:
        duration, interval = float(args[1]) if len(args) > 1 else 60.0, float(args[2]) if len(args) > 2 else 1.0
    except ValueError as exc:
        sys.exit(f"{usage}: {exc}")
    if not (0 < duration < math.inf and MIN_INTERVAL_S <= interval < math.inf):
        sys.exit(f"{usage}: DURATION_S must be > 0 and INTERVAL_S at least {MIN_INTERVAL_S:g}")
    try:
        nvml = load_nvml()
    except Exception as exc:  # no driver, no library: say so plainly
        sys.exit(f"NVML is not available here: {exc}")
    print(json.dumps(record_nvml(args[0], duration, interval, nvml=nvml), indent=2))
