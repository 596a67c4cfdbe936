"""NVML (nvidia-ml-py): read the gpu fields straight from the driver on an interval.

NVML is what nvidia-smi and DCGM read underneath, without their formatting. Each gpu field
has one reader below, converting NVML's units to foreshock's base units (mW -> W, mJ -> J,
MHz -> Hz, percent -> ratio, ns -> s). A reader the GPU does not support (``Not Supported``,
``Function Not Found`` on older drivers) is remembered and not called again: its column stays
NaN, and the fields so found are logged once, with their GPUs (:meth:`NvmlSource.unsupported_fields`,
what :func:`record_nvml` lists too). A call NVIDIA has renamed is made under the name the
driver has (:class:`RenamedCall`): the throttle reasons under ``nvmlDeviceGetCurrentClocksEventReasons``
(R535 on), else the older ``nvmlDeviceGetCurrentClocksThrottleReasons``; the GPU temperature under
``nvmlDeviceGetTemperatureV``, else ``nvmlDeviceGetTemperature`` (deprecated, gone in CUDA 14). A
newer pynvml wraps both, an older driver exports only the old one. The max operating temperature
is NVML's GPU_MAX threshold, else (a driver that retired that call) the GPU temperature plus NVML's
margin temperature where the margin is the GPU's own (:class:`MaxOperatingTemp`). What a poll
costs the driver was measured on a real H200 (``bench/bench_poll.py``): the power violation counter
is read as a field value where served (:class:`FieldValueFirst`, 2.5 µs against 650), and the fields
a board keeps (its thresholds, its max SM clock) once a minute (:data:`SLOW_FIELDS`). A GPU that
NVML says is lost (``GPU_IS_LOST``, an XID 79) is asked nothing more that poll (the rest of its row
NaN); one that needs a reset (``RESET_REQUIRED``, perhaps of some calls only) is still read. Either
is counted once as it enters that state, under nvidia-smi's reason for ``[GPU is lost]``. Any other
NVML error, or any other exception from a reader (a pynvml whose API drifted), costs that field
on that GPU for that poll only and is counted. The last XID needs an NVML event set and is
not read here (dcgm-exporter reports it).

A poll's calls are made in a thread of its own and waited for :data:`DEADLINE_S` at most, as
nvidia-smi's command is: a call that never returns (a wedged GPU) costs its GPU that poll's row
(and the GPUs' after it), counted as ``NVML call hung``, and the GPU is asked nothing more, its row
left out (counted at each poll), until the call returns. A stop does not cut the poll in hand
short (its unread GPUs' rows were lost, uncounted): only :meth:`NvmlSource.hurry` (a second
signal) ends its wait at once (:meth:`NvmlSource.read`).

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

import logging
import math
import socket
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np

from foreshock.frames import Frame
from foreshock.guard import MIN_INTERVAL_S
from foreshock.health import PipelineHealth
from foreshock.recording import RecordingWriter
from foreshock.topology import Topology

from .nvidia_smi import max_op_from_tlimit
from .polling import GpuBoards, PollingSource
from .samples import FAULT_TOKENS, SampleBatch, gpu_entity

log = logging.getLogger("foreshock.sources")

STAGE = "nvml"
GPU_FAILED = FAULT_TOKENS["[gpu is lost]"]
"""The problem reason a lost GPU is counted under: nvidia-smi's for ``[GPU is lost]`` and
``[GPU requires reset]``, so the dashboards and health metrics read both sources alike."""
UNEXPECTED = "unexpected error from an NVML reader"
"""The problem reason for an exception from a reader that is not an ``NVMLError``."""
NVML_HUNG = "NVML call hung"
"""Counted once for a GPU whose NVML call did not return within :data:`DEADLINE_S` (:meth:`NvmlSource.read`)."""
NVML_STILL_HUNG = "GPU not read: its NVML call still hung"
"""Counted at each poll that leaves out a GPU whose hung call has not returned yet: no other call is
made to it meanwhile (the thread stuck in the driver is not reused, nor another started for it)."""

DEADLINE_S = 10.0
"""How long a poll waits for its NVML calls. They run in a thread of their own: a driver call that
never returned (a wedged GPU, the driver stuck in an ioctl) held the poll, and with it ``record`` and
``watch``, for good, their ``--duration``, Ctrl-C and SIGTERM included. As long as nvidia-smi's source
gives its command (``NvidiaSmiSource.timeout``): a poll costs a real H200 9 ms (``bench/bench_poll.py``)."""
STOP_CHECK_S = 0.1
"""How often a poll waiting for its calls looks whether it is hurried (:meth:`NvmlSource.hurry`): its
wait ends then rather than at the deadline (``watch`` polls in its main thread). A stop alone does not
end it: a poll of a slow, healthy GPU cut at a ``--duration`` lost the rows of the GPUs not read yet."""

Reader = Callable[[ModuleType, Any], float]

SLOW_FIELDS = ("slowdown_temp", "max_op_temp", "hbm_max_op_temp", "sm_clock_max")
"""Fields that stay as they are while a board is in its slot (its temperature thresholds, its
maximum SM clock): read once every :data:`SLOW_EVERY_S` and served from that reading between. On
a real H200 the max SM clock took 1.2-1.4 ms a call and each of the GPU_MAX and MEM_MAX thresholds
0.2 ms: a fifth of a poll's 9 ms (``bench/bench_poll.py``). A reading that gives no value (a failed
call; the max operating temperature from a margin that is the memory's) is asked for again at the
next poll, the last reading served meanwhile; another board in the slot (its UUID), or a GPU lost
or its handle regained, is read afresh."""
SLOW_EVERY_S = 60.0


_FIELD_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
"""``nvmlValueType_t`` -> the member of ``nvmlValue_t`` that holds such a value (DOUBLE, UNSIGNED_INT,
UNSIGNED_LONG, UNSIGNED_LONG_LONG, SIGNED_LONG_LONG, SIGNED_INT, UNSIGNED_SHORT): read through another
member, a signed value comes out as a huge unsigned one (-1 as 4294967295)."""


def _field_value(nv: ModuleType, h: Any, field_id: int) -> float:
    """Field ``field_id`` of GPU ``h`` through ``nvmlDeviceGetFieldValues``; its own return code
    raised as an ``NVMLError``."""
    value = nv.nvmlDeviceGetFieldValues(h, [field_id])[0]
    if value.nvmlReturn != nv.NVML_SUCCESS:
        raise nv.NVMLError(value.nvmlReturn)
    member = _FIELD_VALUE_MEMBERS.get(int(value.valueType))
    if member is None:  # a type this reader does not know: no value rather than a misread one
        raise ValueError(f"field value of unknown type {value.valueType}")
    return float(getattr(value.value, member))


def _memory_temp(nv: ModuleType, h: Any) -> float:
    return _field_value(nv, h, nv.NVML_FI_DEV_MEMORY_TEMP)


NOT_SERVED_MAX = 1024
"""At most this many GPU handles are remembered as not serving a field (:class:`FieldValueFirst`):
a GPU that falls off the bus and comes back has a new handle, and the old ones would be kept for
ever. More than a node's GPUs; past it the memory starts over."""


class FieldValueFirst:
    """A reader taking its value from NVML's field-value call, where the driver serves the field,
    else from an older call (``fallback``, a reader).

    Some calls cost a real driver far more than the same counter read as a field: on a real H200
    (driver 580.159.04; ``bench/bench_poll.py``, ``deploy/device/fieldvalues_probe.py``)
    ``nvmlDeviceGetViolationStatus(POWER)`` took 650 µs a call, field ``NVML_FI_DEV_PERF_POLICY_POWER``
    2.5 µs, with the same nanoseconds. Where the library serves no field values (pynvml without the
    call, ``FUNCTION_NOT_FOUND``, ``DEPRECATED``) that is remembered for every GPU (the library is
    the process's); where a GPU does not serve the field (``NOT_SUPPORTED``: "not available on
    target device"; ``INVALID_ARGUMENT`` for an id its driver does not know), for that GPU only
    (by its handle): one such GPU had sent every other GPU to the older call, 650 µs a poll each,
    and, where the older call is gone (pynvml: removed in CUDA 14), cost them the field for good.
    The older call is made from then on; any other error is the caller's, as any reader's."""

    def __init__(self, constant: str, field_id: int, scale: float, fallback: Reader) -> None:
        self.constant = constant  # pynvml's name of the field id (``field_id`` where it lacks it)
        self.field_id = field_id
        self.scale = scale
        self.fallback = fallback
        self.field_served = True  # False: the library serves no field values, for any GPU
        self.not_served: set[Any] = set()  # the handles of the GPUs that do not serve this field

    def __call__(self, nv: ModuleType, h: Any) -> float:
        if self.field_served and h not in self.not_served:
            if getattr(nv, "nvmlDeviceGetFieldValues", None) is None:
                self.field_served = False
                return self.fallback(nv, h)
            try:
                return _field_value(nv, h, getattr(nv, self.constant, self.field_id)) * self.scale
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                library = {getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13), getattr(nv, "NVML_ERROR_DEPRECATED", 26)}
                device = {getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3), getattr(nv, "NVML_ERROR_INVALID_ARGUMENT", 2)}
                if code in library:
                    self.field_served = False
                elif code in device:
                    if len(self.not_served) >= NOT_SERVED_MAX:  # handles of GPUs lost and back, over weeks
                        self.not_served.clear()  # (each left asks once more)
                    self.not_served.add(h)
                else:
                    raise
        return self.fallback(nv, h)


class RenamedCall:
    """A reader whose NVML call has a newer name (or version) and an older one, tried in that order.

    NVIDIA renames and versions calls: R535 renamed ``nvmlDeviceGetCurrentClocksThrottleReasons`` to
    ``nvmlDeviceGetCurrentClocksEventReasons``; ``nvmlDeviceGetTemperature`` is deprecated for
    ``nvmlDeviceGetTemperatureV`` and goes in CUDA 14. A newer pynvml wraps both names, but over an
    older driver the newer fails with ``FUNCTION_NOT_FOUND`` (the library lacks the symbol) or
    ``ARGUMENT_VERSION_MISMATCH`` while the older works; over a newer driver the older may fail with
    ``FUNCTION_NOT_FOUND`` or ``DEPRECATED``; an older pynvml lacks the newer wrapper. A name so
    failing is remembered (the library is the process's: for every GPU) and not asked for again.
    When none is left it raises ``FUNCTION_NOT_FOUND``: not supported, as the caller remembers.

    ``args(nv)`` gives the call's arguments after the handle."""

    def __init__(self, names: tuple[str, ...], args: Callable[[ModuleType], tuple[Any, ...]] = lambda nv: ()) -> None:
        self.names = names
        self.args = args
        self.missing: set[str] = set()  # names the driver library does not serve

    def __call__(self, nv: ModuleType, h: Any) -> float:
        not_found = getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
        not_served = {not_found, getattr(nv, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25),
                      getattr(nv, "NVML_ERROR_DEPRECATED", 26)}
        for name in self.names:
            getter = getattr(nv, name, None)
            if getter is None or name in self.missing:
                continue
            try:
                return float(getter(h, *self.args(nv)))
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) not in not_served:
                    raise
                self.missing.add(name)
        raise nv.NVMLError(not_found)


class MaxOperatingTemp:
    """The GPU's max operating temperature: NVML's GPU_MAX threshold, else its temperature plus
    NVML's margin temperature where that margin is the GPU's own.

    NVIDIA says ``nvmlDeviceGetTemperatureThreshold`` is no longer the preferred call for the
    GPU_MAX, MEM_MAX, SLOWDOWN and SHUTDOWN thresholds on Ada and later, and that its support for
    them will be removed. Where the driver no longer serves it (``DEPRECATED``,
    ``FUNCTION_NOT_FOUND``: remembered, the library is the process's) or the GPU does not
    (``NOT_SUPPORTED``), the limit is read from ``nvmlDeviceGetMarginTemperature``: the headroom to
    the *nearest* slowdown threshold, the memory's included (nvidia-smi's T.Limit, the same number
    on a real H200: ``tests/data/h200_tlimit``), so the GPU's limit is its temperature plus the
    margin only where the memory is clearly further from its own, or the board has no memory
    sensor (its memory temperature not supported), else no value that poll — a memory reading that
    failed included (:func:`~.nvidia_smi.max_op_from_tlimit`; the detectors keep the limit from an
    earlier poll). A GPU serving neither call raises as not supported: not asked for again."""

    def __init__(self, gpu_temp: RenamedCall) -> None:
        self.gpu_temp = gpu_temp  # the source's own GPU temperature reader (it remembers names)
        self.threshold_retired = False

    def __call__(self, nv: ModuleType, h: Any) -> float:
        not_found = getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
        not_supported = {not_found, getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3)}
        retired = {not_found, getattr(nv, "NVML_ERROR_DEPRECATED", 26)}
        if not self.threshold_retired:
            try:
                return _threshold(nv, h, "NVML_TEMPERATURE_THRESHOLD_GPU_MAX", 3)
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code in retired:
                    self.threshold_retired = True
                elif code not in not_supported:
                    raise
        margin_call = getattr(nv, "nvmlDeviceGetMarginTemperature", None)
        if margin_call is None:  # a pynvml older than the call
            raise nv.NVMLError(not_found)
        margin = margin_call(h)
        margin = float(getattr(margin, "marginTemperature", margin))  # an int, or the struct in some pynvml
        gpu = self.gpu_temp(nv, h)
        no_sensor = False
        try:
            memory = _memory_temp(nv, h)
        except nv.NVMLError as exc:  # a board without a memory sensor: the margin is the GPU's own;
            memory = math.nan  # any other failure: whose margin it is cannot be told (no value)
            no_sensor = getattr(exc, "value", None) in not_supported
        except ValueError:  # a value of a type NVML does not define: not read
            memory = math.nan
        return float(max_op_from_tlimit(np.array([gpu]), np.array([memory]), np.array([margin]), no_sensor)[0])


def _threshold(nv: ModuleType, h: Any, name: str, value: int) -> float:
    """The temperature threshold ``name`` (pynvml's constant; ``value`` where it lacks the name) of
    GPU ``h``. A pynvml without ``nvmlDeviceGetTemperatureThreshold`` (the call is retired for these
    thresholds on Ada and later) raises FUNCTION_NOT_FOUND: not supported, not an error at every poll."""
    call = getattr(nv, "nvmlDeviceGetTemperatureThreshold", None)
    if call is None:
        raise nv.NVMLError(getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13))
    return float(call(h, getattr(nv, name, value)))


def _power_violation(nv: ModuleType, h: Any) -> float:
    return float(nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_POWER).violationTime * 1e-9)


def _renamed_calls() -> dict[str, RenamedCall | MaxOperatingTemp | FieldValueFirst]:
    """The readers that remember what the driver serves (:class:`RenamedCall`,
    :class:`MaxOperatingTemp`, :class:`FieldValueFirst`), new ones (remembering nothing yet)."""
    gpu_temp = RenamedCall(("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"),
                           lambda nv: (nv.NVML_TEMPERATURE_GPU,))
    return {
        "gpu_temp": gpu_temp,
        "throttle_reasons": RenamedCall(("nvmlDeviceGetCurrentClocksEventReasons",
                                         "nvmlDeviceGetCurrentClocksThrottleReasons")),
        "max_op_temp": MaxOperatingTemp(gpu_temp),
        "power_throttle_time": FieldValueFirst("NVML_FI_DEV_PERF_POLICY_POWER", 74, 1e-9, _power_violation),
    }


def _renamed(field: str) -> Reader:
    """The reader of ``field`` from :func:`_renamed_calls`, remembering nothing (the calls tried
    anew at each read): a source keeps its own, which remember."""
    return lambda nv, h: _renamed_calls()[field](nv, h)


READERS: dict[str, Reader] = {
    "gpu_temp": _renamed("gpu_temp"),
    "hbm_temp": _memory_temp,
    "slowdown_temp": lambda nv, h: _threshold(nv, h, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1),
    # the max operating temperatures (GPU_MAX = 3, MEM_MAX = 2): a GPU that has none raises
    # NOT_SUPPORTED, read as no value (and not asked again); an older pynvml lacks the names.
    # The GPU's, where the threshold call is retired, from its margin (MaxOperatingTemp)
    "max_op_temp": _renamed("max_op_temp"),
    "hbm_max_op_temp": lambda nv, h: _threshold(nv, h, "NVML_TEMPERATURE_THRESHOLD_MEM_MAX", 2),
    "power": lambda nv, h: nv.nvmlDeviceGetPowerUsage(h) * 1e-3,
    "power_limit": lambda nv, h: nv.nvmlDeviceGetEnforcedPowerLimit(h) * 1e-3,
    "energy": lambda nv, h: nv.nvmlDeviceGetTotalEnergyConsumption(h) * 1e-3,
    "sm_clock": lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) * 1e6,
    "sm_clock_max": lambda nv, h: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM) * 1e6,
    "util": lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).gpu * 1e-2,
    "throttle_reasons": _renamed("throttle_reasons"),
    "power_throttle_time": _renamed("power_throttle_time"),
    "thermal_throttle_time": lambda nv, h: nv.nvmlDeviceGetViolationStatus(
        h, nv.NVML_PERF_POLICY_THERMAL).violationTime * 1e-9,
    "ecc_dbe": lambda nv, h: float(nv.nvmlDeviceGetTotalEccErrors(
        h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)),
    "pcie_replays": lambda nv, h: float(nv.nvmlDeviceGetPcieReplayCounter(h)),
    "remapped_rows": lambda nv, h: float(nv.nvmlDeviceGetRemappedRows(h)[1]),
}
"""gpu field -> reader returning the value in base units (a source reads through its own copy,
:attr:`NvmlSource.readers`, whose :class:`RenamedCall` readers remember the names the driver has)."""


class _GpuFailed(Exception):
    """Raised out of a GPU's reading when NVML says the GPU is lost or needs a reset."""


class _NvmlPoll:
    """One poll's reading of ``gpus`` (:meth:`NvmlSource.read`), made in a thread of its own: what
    it has read, and where it is (``gpu``, the call ``what``), shared under ``lock`` with the poll."""

    def __init__(self, gpus: list[int], shape: tuple[int, int]) -> None:
        self.gpus = gpus
        self.values = np.full(shape, np.nan)
        self.uuids: dict[int, str] = {}  # GPU -> its UUID read this poll
        self.entered: list[int] = []  # GPUs found lost this poll that were not at the last
        self.finished: set[int] = set()  # GPUs read to their row's end
        self.gpu: int | None = None  # the GPU in hand
        self.what = ""  # its call in hand
        self.error: Exception | None = None  # what ended the reading early (a bug, not an NVML error)
        self.abandoned = False  # the poll has left without it (its deadline, or the source hurried)
        self.lock = threading.Lock()
        self.done = threading.Event()


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
        self.readers: dict[str, Reader] = {**READERS, **_renamed_calls()}
        self.fields = list(READERS)
        self.supported = np.ones((count, len(self.fields)), dtype=bool)
        self._told_unsupported = np.zeros_like(self.supported)  # (GPU, field) already logged as such
        self._failed: set[int] = set()  # GPUs NVML said were lost (or need a reset) at their last poll
        self._failing: set[int] = set()  # GPUs that said so this poll
        nv = self.nv
        # the NVML error codes that say something of the field or the GPU, not of one call;
        # DEPRECATED: a call the driver no longer serves (NVIDIA retires some in CUDA 14), as unsupported
        self._unsupported_codes = {getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3),
                                   getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
                                   getattr(nv, "NVML_ERROR_DEPRECATED", 26)}
        self._lost_code = getattr(nv, "NVML_ERROR_GPU_IS_LOST", 15)
        self._reset_code = getattr(nv, "NVML_ERROR_RESET_REQUIRED", 16)
        self._entities = [gpu_entity(self.host, i) for i in range(count)]
        self._topology = topology if topology is not None else Topology.from_gpu_hosts(
            [(self.host, i) for i in range(count)])
        self.reads_boards = True  # each GPU's UUID, carried as board_id (the module docstring)
        self._boards = GpuBoards(self.health, STAGE)
        self._uuid_unsupported: set[int] = set()  # GPUs whose UUID NVML does not give
        self._last_uuid: dict[int, str] = {}
        self.slow_every_s = SLOW_EVERY_S  # (SLOW_FIELDS)
        self._slow = [name in SLOW_FIELDS for name in self.fields]
        self._slow_values = np.full((count, len(self.fields)), np.nan)
        self._slow_at = np.full((count, len(self.fields)), -np.inf)  # when each was last read with a value
        self.deadline_s = DEADLINE_S  # how long a poll waits for its NVML calls (DEADLINE_S)
        self._stuck: dict[int, _NvmlPoll] = {}  # GPU -> the poll whose call to it has not returned
        self._hurry = threading.Event()  # the poll in hand stops waiting for its calls (hurry)

    @property
    def poll_limit_s(self) -> float:
        """The longest a poll takes (its calls' deadline): what ``record`` and ``watch`` wait for the
        poll in hand once stopped, before leaving it."""
        return self.deadline_s

    def hurry(self) -> None:
        """Stop, and end the wait of the poll in hand at once (a second Ctrl-C or SIGTERM): the
        GPUs it has not read yet have no row, and nothing is counted as hung."""
        self._hurry.set()
        self.stop()

    def _handle(self, index: int) -> Any | None:
        try:
            return self.nv.nvmlDeviceGetHandleByIndex(index)
        except self.nv.NVMLError as exc:
            self.health.problem(STAGE, "GPU handle unavailable",
                                detail=f"GPU {index}: {exc} (fallen off the bus? it is asked for again at every poll)")
            return None

    def read(self) -> SampleBatch:
        """One reading of every GPU (a row per GPU that has a handle).

        The NVML calls are made in a thread of the poll's own, waited for :attr:`deadline_s` at
        most (a stop does not shorten it; :meth:`hurry` does). A GPU whose call has not returned by then
        is counted (:data:`NVML_HUNG`); it and the GPUs after it have no row this poll. The thread
        is left in its call, and the GPU is not read (counted, :data:`NVML_STILL_HUNG`) until the
        call has returned: at most one thread is stuck per GPU."""
        now = self.clock()
        self._failing.clear()
        count = len(self.handles)
        still = [g for g in range(count) if g in self._stuck]
        if still:
            names = [self._entities[g] for g in still]
            self.health.problem(STAGE, NVML_STILL_HUNG, len(still),
                                detail=", ".join(names[:3]) + (" ..." if len(names) > 3 else ""))
        job = _NvmlPoll([g for g in range(count) if g not in self._stuck], (count, len(self.fields)))
        if job.gpus:
            threading.Thread(target=self._read_gpus, args=(job, now), name="nvml-poll", daemon=True).start()
        else:
            job.done.set()
        deadline = time.monotonic() + self.deadline_s
        while not job.done.wait(max(0.0, min(STOP_CHECK_S, deadline - time.monotonic()))):
            # not at a stop: the GPUs not read yet (a slow poll, not a hung one) would have no row, uncounted
            if self._hurry.is_set() or time.monotonic() >= deadline:
                break
        with job.lock:  # (the thread takes it to go on with each GPU and call, and to end)
            ended = job.done.is_set()
            job.abandoned = not ended
            if job.error is not None:
                raise job.error
            finished = set(job.finished)
            values = job.values.copy()
            values[[g for g in range(count) if g not in finished]] = np.nan
            uuids = {self._entities[g]: uuid for g, uuid in job.uuids.items() if g in finished}
            entered = list(job.entered)
            hung, what = job.gpu, job.what
        if not ended and hung is not None:
            self._stuck[hung] = job
            if not self._hurry.is_set():  # (hurried, the wait was cut short: nothing is known to hang)
                self.health.problem(STAGE, NVML_HUNG, detail=(
                    f"{self._entities[hung]}: {what} did not return within {self.deadline_s:g} s (no row for it, nor "
                    "for the GPUs after it, this poll); the GPU is asked nothing more until the call returns"))
        if entered:
            names = [self._entities[g] for g in entered]
            self.health.problem(STAGE, GPU_FAILED, len(entered),
                                detail=", ".join(names[:3]) + (" ..." if len(names) > 3 else ""))
        self._tell_unsupported()
        # a GPU not read to the end (its call hung, still hung, or after it; the poll cut short by a
        # hurry) has no row: silent, as a GPU whose exporter hangs, not a row of NaN the input guard
        # would count again as missing values at every poll
        present = np.isin(np.arange(count), list(finished)) & np.array([h is not None for h in self.handles])
        values = values[present]
        columns = {name: values[:, f] for f, name in enumerate(self.fields) if not np.isnan(values[:, f]).all()}
        batch = SampleBatch("gpu", self._entities, np.full(len(values), now), np.flatnonzero(present).astype(np.int32),
                            columns)
        if uuids:
            assert self._topology is not None
            batch = self._boards.tag(batch, uuids, self._topology)
        return batch

    def _read_gpus(self, job: _NvmlPoll, now: float) -> None:
        """Read ``job``'s GPUs (in the poll's thread of its own: :meth:`read`), each GPU's row into
        ``job.values``; gives up before the next GPU or call once the poll has left it (``abandoned``)."""
        nv = self.nv

        def going_on(g: int, what: str) -> bool:
            with job.lock:
                job.gpu, job.what = g, what
                return not job.abandoned

        try:
            for g in job.gpus:
                handle = self.handles[g]
                if handle is None:
                    if not going_on(g, "nvmlDeviceGetHandleByIndex"):
                        return
                    handle = self.handles[g] = self._handle(g)
                    if handle is None:
                        continue
                    self._forget_slow(g)
                try:
                    if self.reads_boards:
                        if not going_on(g, "uuid"):
                            return
                        job.uuids[g] = uuid = self._uuid(g, handle)
                        if uuid and self._last_uuid.setdefault(g, uuid) != uuid:
                            self._last_uuid[g] = uuid
                            self._forget_slow(g)  # another board: its own thresholds and clocks
                    for f, name in enumerate(self.fields):
                        if not self.supported[g, f]:
                            continue
                        slow = self._slow[f]
                        if slow and 0.0 <= now - self._slow_at[g, f] < self.slow_every_s:
                            job.values[g, f] = self._slow_values[g, f]
                            continue
                        if not going_on(g, name):
                            return
                        read = self.readers[name]
                        value, self.supported[g, f] = self._call(g, name, lambda: read(nv, handle))
                        if value is not None:
                            job.values[g, f] = value if math.isfinite(value) else np.nan
                        if not slow:
                            continue
                        if not np.isnan(job.values[g, f]):
                            self._slow_values[g, f] = job.values[g, f]
                            self._slow_at[g, f] = now
                        elif self.supported[g, f]:
                            job.values[g, f] = self._slow_values[g, f]  # the last reading (if any) while none comes
                except _GpuFailed:
                    # every other call would fail the same way (a lost GPU's may each take long): ask
                    # nothing more of it this poll; it is counted as it enters the state, not per poll
                    self._failing.add(g)
                    self._forget_slow(g)  # nothing read: read afresh once back (perhaps another board)
                with job.lock:
                    if job.abandoned:  # its call returned past the deadline: the poll has left without it
                        return
                    if g in self._failing:
                        if g not in self._failed:
                            self._failed.add(g)
                            job.entered.append(g)
                    elif g in self._failed:
                        # back from a reset, its slow fields read afresh from the next poll; not at every poll
                        # while it waited (it is read then, perhaps for days, and a slow call costs a real
                        # H200 over 1 ms: they had been read at every poll)
                        self._forget_slow(g)
                        self._failed.discard(g)  # read without either: back, counted again if lost again
                    job.finished.add(g)
        except Exception as exc:  # the poll's error, raised by it (as when the calls were made in its thread)
            job.error = exc
        finally:
            with job.lock:
                job.done.set()
                if job.abandoned and job.gpu is not None and self._stuck.get(job.gpu) is job:
                    del self._stuck[job.gpu]  # its call has returned: the GPU is read again from the next poll

    def _forget_slow(self, index: int) -> None:
        """GPU ``index``'s :data:`SLOW_FIELDS` are read at its next poll."""
        self._slow_at[index] = -np.inf
        self._slow_values[index] = np.nan

    def _call(self, index: int, what: str, read: Callable[[], Any]) -> tuple[Any, bool]:
        """``(read(), True)`` for GPU ``index``, or ``(None, supported)`` where it fails: an NVML
        error saying the GPU does not support it gives ``False`` (the caller asks no more);
        ``GPU_IS_LOST`` raises :class:`_GpuFailed`; ``RESET_REQUIRED`` marks the GPU
        (counted as a lost one is) but its other calls are still made, since a GPU may say so of
        some calls only (its ECC counters after a double-bit error, the very fields worth
        reading then); any other error, NVML's or not (a
        reader that no longer fits its pynvml), is counted (``what`` names the call) and asked
        again at the next poll: it costs this value only, not the poll's other GPUs and fields."""
        try:
            return read(), True
        except self.nv.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in self._unsupported_codes:
                return None, False
            if code == self._lost_code:
                raise _GpuFailed() from None
            if code == self._reset_code:
                self._failing.add(index)
                return None, True
            self.health.problem(STAGE, "NVML call failed", detail=f"{what} on GPU {index}: {exc}")
            return None, True
        except Exception as exc:
            self.health.problem(STAGE, UNEXPECTED, detail=f"{what} on GPU {index}: {type(exc).__name__}: {exc}")
            return None, True

    def unsupported_fields(self) -> dict[str, list[str]]:
        """The fields some GPU does not support (found so, not asked again), each with those GPUs,
        in field order: what the log says once and :func:`record_nvml` lists."""
        return self._by_field(~self.supported)

    def _by_field(self, mask: np.ndarray) -> dict[str, list[str]]:
        return {name: [self._entities[g] for g in np.flatnonzero(mask[:, f])]
                for f, name in enumerate(self.fields) if mask[:, f].any()}

    def _tell_unsupported(self) -> None:
        """Log the (field, GPU)s found unsupported since the last log, once: their column is NaN
        for good, which a reader of ``watch`` or ``agent`` would otherwise have to guess at."""
        new = ~self.supported & ~self._told_unsupported
        if not new.any():
            return
        self._told_unsupported |= new
        count = len(self._entities)
        said = [f"{name} on " + (f"every GPU ({count})" if len(gpus) == count and count > 1 else ", ".join(gpus))
                for name, gpus in self._by_field(new).items()]
        log.warning("%s: not supported by the GPU or driver, read as no value and not asked again: %s",
                    STAGE, "; ".join(said))

    def _uuid(self, index: int, handle: Any) -> str:
        """GPU ``index``'s UUID; "" (no change) when it cannot be read: a failed call is counted,
        one the GPU does not support is remembered and not made again, as a reader's."""
        if index in self._uuid_unsupported:
            return ""
        uuid, supported = self._call(index, "uuid", lambda: self.nv.nvmlDeviceGetUUID(handle))
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
    return {"path": str(out_dir), "gpus": len(source.handles), "polls": source.polls, "rows": rows,
            "unsupported_fields": sorted(source.unsupported_fields()), "problems": health.total_problems()}


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
