"""What one poll of the local GPUs costs a node: the NVML and nvidia-smi sources vs the bare calls.

``foreshock watch``, ``record`` and ``agent`` poll every GPU of their node each interval (1 s by
default for NVML); this is their whole cost on the node, so it is measured per poll and per GPU.

- **NVML**: ``NvmlSource.read()`` (every field of every GPU, the UUID, errors judged, one columnar
  batch) next to the bare pynvml calls of the same fields in a plain loop (no error handling, no
  batch): the ratio is foreshock's overhead. Then each field's call alone, slowest first: where a
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
from foreshock.streams.nvml import NvmlSource, load_nvml  # noqa: E402

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


def bare_nvml_poll(nv: types.ModuleType, handles: list[Any]) -> Callable[[], list[list[Any]]]:
    """Every field's pynvml call for every GPU in a plain loop: what a minimal poller does."""
    temp = getattr(nv, "nvmlDeviceGetTemperatureV", None) or nv.nvmlDeviceGetTemperature
    reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nv.nvmlDeviceGetCurrentClocksThrottleReasons

    def guarded(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except nv.NVMLError:
            return None

    def poll() -> list[list[Any]]:
        rows = []
        for h in handles:
            rows.append([
                temp(h, nv.NVML_TEMPERATURE_GPU),
                guarded(lambda: nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_MEMORY_TEMP])),
                guarded(lambda: nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
                guarded(lambda: nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)),
                guarded(lambda: nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)),
                nv.nvmlDeviceGetPowerUsage(h), nv.nvmlDeviceGetEnforcedPowerLimit(h),
                nv.nvmlDeviceGetTotalEnergyConsumption(h), nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM), nv.nvmlDeviceGetUtilizationRates(h).gpu,
                reasons(h),
                nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_POWER).violationTime,
                nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_THERMAL).violationTime,
                guarded(lambda: nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                               nv.NVML_VOLATILE_ECC)),
                guarded(lambda: nv.nvmlDeviceGetPcieReplayCounter(h)),
                guarded(lambda: nv.nvmlDeviceGetRemappedRows(h)),
                nv.nvmlDeviceGetUUID(h),
            ])
        return rows

    return poll


def bench_nvml(polls: int, gpus: int) -> dict[str, Any]:
    try:
        nv, real = load_nvml(), True
    except Exception as exc:  # no pynvml, no driver, no GPU
        print(f"NVML: none here ({type(exc).__name__}: {exc}); a stand-in NVML answering at once, {gpus} GPUs")
        nv, real = stand_in_nvml(gpus), False
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
    print(f"  bare pynvml loop    {bare_ms:9.3f} ms per poll (p90 {p90(bare) * 1e3:.3f})")
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
