"""What one poll of the local GPUs costs a node: the NVML and nvidia-smi sources vs the bare calls.

``foreshock watch``, ``record`` and ``agent`` poll every GPU of their node each interval (1 s by
default for NVML); this is their whole cost on the node, so it is measured per poll and per GPU.

- **NVML**: ``NvmlSource.read()`` (every field of every GPU, the UUID, errors judged, one columnar
  batch) next to the same pynvml calls at the same cadence (the slow fields once a minute, the
  power violation counter as field 74; checked before timing) in a plain loop (no values judged,
  no batch): the ratio is foreshock's overhead. Then each field's call alone, slowest first: where a
  driver makes one call slow, it shows here. With no NVML GPU on the machine (CI, a laptop) a
  stand-in NVML that answers at once is polled instead, for ``--gpus`` GPUs: the figure is then
  foreshock's own cost, the driver's excluded.
- **nvidia-smi**: ``NvidiaSmiSource.poll()`` (run it, parse the CSV, a frame) next to running the
  same command line and reading its output (no parsing): the ratio is the parse's share. Without
  nvidia-smi on the PATH, a stand-in script printing ``--gpus`` rows of the real H200 capture
  (``tests/data/h200_tlimit/nvidia-smi.csv``) is run instead.

Figures are medians over ``--polls`` polls after two warm-up polls.

    .venv/bin/python bench/bench_poll.py [--polls 50] [--gpus 8]
"""

from __future__ import annotations

import argparse
import collections
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))
from _util import emit  # noqa: E402

from foreshock.health import PipelineHealth  # noqa: E402
from foreshock.streams.nvidia_smi import NvidiaSmiSource  # noqa: E402
from foreshock.streams.nvml import SLOW_EVERY_S, NvmlSource, load_nvml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
H200_CSV = ROOT / "tests" / "data" / "h200_tlimit" / "nvidia-smi.csv"


def per_call_s(fn: Callable[[], Any], polls: int) -> list[float]:
    """Seconds of each of ``polls`` calls of ``fn``, after two warm-up calls."""
    fn()
    fn()
    times = []
    for _ in range(polls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def p90(times: list[float]) -> float:
    return sorted(times)[int(0.9 * (len(times) - 1))]


# ---- NVML -------------------------------------------------------------------------------------
class _StandInError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def stand_in_nvml(gpus: int) -> types.ModuleType:
    """A pynvml that answers every call the source makes at once, with an H200's idle values."""
    nv = types.ModuleType("stand_in_pynvml")
    constants = {"NVML_TEMPERATURE_GPU": 0, "NVML_CLOCK_SM": 1, "NVML_PERF_POLICY_POWER": 0,
                 "NVML_PERF_POLICY_THERMAL": 1, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1, "NVML_VOLATILE_ECC": 0,
                 "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN": 1, "NVML_TEMPERATURE_THRESHOLD_GPU_MAX": 3,
                 "NVML_TEMPERATURE_THRESHOLD_MEM_MAX": 2, "NVML_FI_DEV_MEMORY_TEMP": 82, "NVML_SUCCESS": 0}
    nv.__dict__.update(constants)
    nv.NVMLError = _StandInError  # type: ignore[attr-defined]
    thresholds = {1: 90, 3: 87, 2: 95}
    calls: dict[str, Callable[..., Any]] = {
        "nvmlDeviceGetCount": lambda: gpus,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetUUID": lambda h: f"GPU-00000000-0000-0000-0000-{h:012d}",
        "nvmlDeviceGetTemperatureV": lambda h, sensor: 36,
        "nvmlDeviceGetTemperature": lambda h, sensor: 36,
        "nvmlDeviceGetTemperatureThreshold": lambda h, which: thresholds[which],
        "nvmlDeviceGetFieldValues": lambda h, ids: [types.SimpleNamespace(nvmlReturn=0, valueType=1,
                                                                          value=types.SimpleNamespace(uiVal=38))],
        "nvmlDeviceGetPowerUsage": lambda h: 80_000,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
        "nvmlDeviceGetTotalEnergyConsumption": lambda h: 10**9,
        "nvmlDeviceGetClockInfo": lambda h, clock: 345,
        "nvmlDeviceGetMaxClockInfo": lambda h, clock: 1980,
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=0, memory=0),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 1,
        "nvmlDeviceGetViolationStatus": lambda h, policy: types.SimpleNamespace(violationTime=0),
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: 0,
        "nvmlDeviceGetPcieReplayCounter": lambda h: 0,
        "nvmlDeviceGetRemappedRows": lambda h: (0, 0, 0, 0),
    }
    nv.__dict__.update(calls)
    return nv


def bare_nvml_poll(nv: types.ModuleType, handles: list[Any],
                   clock: Callable[[], float] = time.time) -> Callable[[], list[list[Any]]]:
    """The pynvml calls ``NvmlSource.read()`` makes per poll, in a plain loop: what a minimal poller
    of the same fields does (no values judged, no batch). The same calls as the source's at the same
    cadence, or the ratio prices calls the source does not make: the UUID and each field's reader
    in the source's field order; the temperature thresholds and the max SM clock (``SLOW_FIELDS``)
    once every ``SLOW_EVERY_S`` on ``clock`` (the source's clock); the power violation counter as
    NVML field ``NVML_FI_DEV_PERF_POLICY_POWER`` (74) where the driver serves it, else the older
    ``nvmlDeviceGetViolationStatus(POWER)``; a call a GPU does not support not asked again.
    :func:`calls_differ` checks that both make the same calls."""
    temp = getattr(nv, "nvmlDeviceGetTemperatureV", None) or nv.nvmlDeviceGetTemperature
    reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nv.nvmlDeviceGetCurrentClocksThrottleReasons
    unsupported = {getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3), getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
                   getattr(nv, "NVML_ERROR_DEPRECATED", 26)}
    not_served = unsupported | {getattr(nv, "NVML_ERROR_INVALID_ARGUMENT", 2)}  # (FieldValueFirst's)
    power_field = getattr(nv, "NVML_FI_DEV_PERF_POLICY_POWER", 74)
    power_by_field = getattr(nv, "nvmlDeviceGetFieldValues", None) is not None
    dropped: set[tuple[int, str]] = set()  # (GPU, call) found unsupported: the source asks no more either
    slow_at = [-math.inf] * len(handles)

    def guarded(g: int, what: str, call: Callable[[], Any]) -> Any:
        if (g, what) in dropped:
            return None
        try:
            return call()
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) in unsupported:
                dropped.add((g, what))
            return None

    def power_violation(h: Any) -> Any:
        nonlocal power_by_field
        if power_by_field:
            value = nv.nvmlDeviceGetFieldValues(h, [power_field])[0]
            if value.nvmlReturn not in not_served:
                return value
            power_by_field = False  # as the source's reader, the older call from then on
        return nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_POWER).violationTime

    def poll() -> list[list[Any]]:
        now = clock()
        rows = []
        for g, h in enumerate(handles):
            slow = not 0.0 <= now - slow_at[g] < SLOW_EVERY_S
            if slow:
                slow_at[g] = now
            rows.append([
                guarded(g, "uuid", lambda: nv.nvmlDeviceGetUUID(h)),
                guarded(g, "gpu_temp", lambda: temp(h, nv.NVML_TEMPERATURE_GPU)),
                guarded(g, "hbm_temp", lambda: nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_MEMORY_TEMP])),
                guarded(g, "slowdown_temp", lambda: nv.nvmlDeviceGetTemperatureThreshold(
                    h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)) if slow else None,
                guarded(g, "max_op_temp", lambda: nv.nvmlDeviceGetTemperatureThreshold(
                    h, nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)) if slow else None,
                guarded(g, "hbm_max_op_temp", lambda: nv.nvmlDeviceGetTemperatureThreshold(
                    h, nv.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)) if slow else None,
                guarded(g, "power", lambda: nv.nvmlDeviceGetPowerUsage(h)),
                guarded(g, "power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h)),
                guarded(g, "energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)),
                guarded(g, "sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                guarded(g, "sm_clock_max", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)) if slow else None,
                guarded(g, "util", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu),
                guarded(g, "throttle_reasons", lambda: reasons(h)),
                guarded(g, "power_throttle_time", lambda: power_violation(h)),
                guarded(g, "thermal_throttle_time",
                        lambda: nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_THERMAL).violationTime),
                guarded(g, "ecc_dbe", lambda: nv.nvmlDeviceGetTotalEccErrors(
                    h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)),
                guarded(g, "pcie_replays", lambda: nv.nvmlDeviceGetPcieReplayCounter(h)),
                guarded(g, "remapped_rows", lambda: nv.nvmlDeviceGetRemappedRows(h)),
            ])
        return rows

    return poll


Call = tuple[str, tuple[Any, ...]]


def counting_nvml(nv: types.ModuleType) -> tuple[types.ModuleType, list[Call]]:
    """``nv`` with each ``nvmlDevice*`` call logged (its name and arguments, a list as a tuple) to the
    list returned beside it; the module itself is left as it is."""
    log: list[Call] = []
    proxy = types.ModuleType(f"counting_{nv.__name__}")
    proxy.__dict__.update({k: v for k, v in vars(nv).items() if not k.startswith("__")})

    def logged(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            log.append((name, tuple(tuple(a) if isinstance(a, list) else a for a in args)))
            return fn(*args)
        return call

    for name, fn in vars(nv).items():
        if name.startswith("nvmlDevice") and callable(fn):
            setattr(proxy, name, logged(name, fn))
    return proxy, log


def calls_differ(nv: types.ModuleType, polls: int = 130, step_s: float = 1.0) -> list[str]:
    """Where a fresh ``NvmlSource.read()`` and :func:`bare_nvml_poll` make different NVML calls over
    ``polls`` polls ``step_s`` apart on one clock (130 at 1 s: three readings of the slow fields):
    one line per poll that differs (empty: the same calls). Both read through one logging copy of
    ``nv``, each poll's calls compared as a multiset."""
    proxy, log = counting_nvml(nv)
    now = [1.7e9]
    source = NvmlSource(interval=1.0, health=PipelineHealth(), nvml=proxy)
    source.clock = lambda: now[0]
    bare = bare_nvml_poll(proxy, [h for h in source.handles if h is not None], clock=lambda: now[0])
    out = []
    for i in range(polls):
        del log[:]
        source.read()
        ours = collections.Counter(log)
        del log[:]
        bare()
        theirs = collections.Counter(log)
        if ours != theirs:
            only_ours = sorted(f"{n}{a[1:]}" for n, a in (ours - theirs).elements())
            only_bare = sorted(f"{n}{a[1:]}" for n, a in (theirs - ours).elements())
            out.append(f"poll {i}: only NvmlSource {only_ours}; only the bare loop {only_bare}")
        now[0] += step_s
    return out


def bench_nvml(polls: int, gpus: int) -> dict[str, Any]:
    try:
        nv, real = load_nvml(), True
    except Exception as exc:  # no pynvml, no driver, no GPU
        print(f"NVML: none here ({type(exc).__name__}: {exc}); a stand-in NVML answering at once, {gpus} GPUs")
        nv, real = stand_in_nvml(gpus), False
    # the ratio means something only if the bare loop makes the source's calls: checked on the
    # stand-in (its calls are the code's alone: a difference is drift, and stops the bench) and on
    # the real NVML (a driver may send the source down a path the loop lacks: said, and recorded)
    drift = calls_differ(stand_in_nvml(2))
    if drift:
        raise SystemExit("bench_poll: the bare pynvml loop no longer makes NvmlSource.read()'s calls "
                         "(stand-in NVML):\n  " + "\n  ".join(drift[:5]))
    differ = calls_differ(nv, polls=3, step_s=SLOW_EVERY_S / 2) if real else []
    if differ:
        print("  WARNING: on this NVML the bare loop's calls differ from NvmlSource.read()'s:\n    "
              + "\n    ".join(differ[:3]))
    health = PipelineHealth()
    source = NvmlSource(interval=1.0, health=health, nvml=nv)
    n = len(source.handles)
    ours = per_call_s(source.read, polls)
    handles = [h for h in source.handles if h is not None]
    bare = per_call_s(bare_nvml_poll(nv, handles), polls)
    ms, bare_ms = statistics.median(ours) * 1e3, statistics.median(bare) * 1e3
    what = "real NVML" if real else "stand-in NVML"
    print(f"NVML source ({what}, {n} GPU{'s' if n != 1 else ''}, {len(source.fields)} fields + UUID):")
    print(f"  NvmlSource.read()   {ms:9.3f} ms per poll (p90 {p90(ours) * 1e3:.3f}), "
          f"{ms / max(n, 1):.3f} ms per GPU")
    print(f"  bare pynvml loop    {bare_ms:9.3f} ms per poll (p90 {p90(bare) * 1e3:.3f}; the source's calls, "
          f"{'checked the same' if not differ else 'NOT the same here'})")
    print(f"  ratio               {ms / bare_ms:9.2f} x  (foreshock's overhead on the same calls)")
    calls = {}
    if handles:
        h = handles[0]
        for name in source.fields:
            if source.supported[0, source.fields.index(name)]:
                read = source.readers[name]
                calls[name] = statistics.median(per_call_s(lambda: source._call(0, name, lambda: read(nv, h)),
                                                           polls)) * 1e6
        slowest = sorted(calls.items(), key=lambda kv: -kv[1])
        print("  per field, GPU 0 (us per call, slowest first): "
              + ", ".join(f"{name} {us:.1f}" for name, us in slowest))
        unsupported = [name for name, gpus_ in source.unsupported_fields().items()]
        if unsupported:
            print("  not supported here (not asked again): " + ", ".join(unsupported))
    problems = {f"{stage}/{reason}": count for (stage, reason), count in health.problems.items()}
    if problems:
        print(f"  input problems: {problems}")
    name = ""
    if real and handles:
        name = nv.nvmlDeviceGetName(handles[0])
        name = name.decode() if isinstance(name, bytes) else str(name)
    return {"nvml_gpu_name": name, "nvml_real": real, "nvml_gpus": n, "nvml_ms_per_poll": round(ms, 4),
            "nvml_bare_ms_per_poll": round(bare_ms, 4), "nvml_ratio": round(ms / bare_ms, 2),
            "nvml_bare_same_calls": not differ,
            "nvml_us_per_call": {k: round(v, 2) for k, v in calls.items()}}


# ---- nvidia-smi -------------------------------------------------------------------------------
def stand_in_smi(folder: Path, gpus: int) -> str:
    """A script printing ``gpus`` rows of the real H200 capture (any query: the columns it has)."""
    header, row = H200_CSV.read_text().splitlines()[:2]
    cells = row.split(", ")
    rows = [", ".join([cells[0], str(g)] + cells[2:]) for g in range(gpus)]
    out = folder / "capture.csv"
    out.write_text("\n".join([header] + rows) + "\n")
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat {out}\n")
    script.chmod(0o755)
    return str(script)


def bench_smi(polls: int, gpus: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        executable = shutil.which("nvidia-smi")
        real = executable is not None
        if executable is None:
            print(f"nvidia-smi: none here; a stand-in script printing {gpus} rows of the real H200 capture")
            executable = stand_in_smi(Path(tmp), gpus)
        health = PipelineHealth()
        source = NvidiaSmiSource(executable=executable, interval=1.0, health=health)
        source.poll()  # the driver may reject a name: the source settles its query first
        argv = source.argv()
        ours = per_call_s(source.poll, polls)
        bare = per_call_s(lambda: subprocess.run(argv, capture_output=True, text=True, check=False), polls)
        frames = source.poll()
        n = len(frames[0]) if frames else 0
    ms, bare_ms = statistics.median(ours) * 1e3, statistics.median(bare) * 1e3
    what = "real nvidia-smi" if real else "stand-in nvidia-smi"
    print(f"nvidia-smi source ({what}, {n} GPU{'s' if n != 1 else ''}, {len(argv[1].split(','))} columns):")
    print(f"  NvidiaSmiSource.poll() {ms:9.3f} ms per poll (p90 {p90(ours) * 1e3:.3f})")
    print(f"  run and read it        {bare_ms:9.3f} ms per poll (p90 {p90(bare) * 1e3:.3f})")
    print(f"  ratio                  {ms / bare_ms:9.2f} x  (the parse's share on top of the process)")
    problems = {f"{stage}/{reason}": count for (stage, reason), count in health.problems.items()}
    if problems:
        print(f"  input problems: {problems}")
    return {"smi_real": real, "smi_gpus": n, "smi_ms_per_poll": round(ms, 4), "smi_bare_ms_per_poll": round(bare_ms, 4),
            "smi_ratio": round(ms / bare_ms, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--polls", type=int, default=50, help="timed polls per figure (default 50)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs of a stand-in source (default 8)")
    args = parser.parse_args()
    figures = {**bench_nvml(args.polls, args.gpus), **bench_smi(args.polls, args.gpus)}
    name = figures.pop("nvml_gpu_name")
    on = name if figures["nvml_real"] else "stand-ins (no GPU here)"
    emit("poll_cost", on=on, polls=args.polls, **figures)


if __name__ == "__main__":
    main()
