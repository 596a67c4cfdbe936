"""What NVML's calls cost on a real GPU, one by one and as one ``nvmlDeviceGetFieldValues`` batch.

bench/bench_poll.py found a poll of one H200 costs ~9 ms, most of it in four calls (the energy
counter ~3.1 ms, the max SM clock ~1.4 ms, the two violation counters ~0.6 ms each). This probe
times, on GPU 0 (median of ``--repeats`` calls, after two):

- each legacy call the NVML source makes, and the UUID;
- each field id alone through ``nvmlDeviceGetFieldValues`` (its return code and value printed:
  whether the driver serves it), and the ids batched into one call, with and without the energy;
- the ``*_TLIMIT`` fields beside the thresholds and the temperatures (on a real H200 they read
  0, 0, -2, -8 at any temperature: the SKU's thresholds on T.Limit's scale, not a live headroom).

Prints a JSON line per measurement; changes no GPU setting. ``python3 fieldvalues_probe.py``
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any, Callable

import pynvml as nv

FIELDS = {  # name -> field id (pynvml's constants where it has them)
    "memory_temp": 82, "total_energy_mj": 83, "energy_191": 191, "power_average": 185, "power_instant": 186,
    "power_current_limit": 190, "perf_policy_power_ns": 74, "perf_policy_thermal_ns": 75,
    "sw_therm_slowdown_ns": 269, "hw_therm_slowdown_ns": 270, "hw_power_brake_ns": 271,
    "pcie_replay": 94, "ecc_dbe_vol_total": getattr(nv, "NVML_FI_DEV_ECC_DBE_VOL_TOTAL", 3),
    "shutdown_tlimit": 193, "slowdown_tlimit": 194, "mem_max_tlimit": 195, "gpu_max_tlimit": 196,
}
MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any, str]:
    """(median µs per call, last result, error) of ``fn``."""
    try:
        result = fn()
        fn()
    except Exception as exc:  # an NVML error, or a call this pynvml lacks
        return float("nan"), None, f"{type(exc).__name__}: {exc}"
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6, result, ""


def value_of(v: Any) -> Any:
    if v.nvmlReturn != 0:
        return f"ret {v.nvmlReturn}"
    return getattr(v.value, MEMBERS.get(int(v.valueType), "ullVal"))


def main(repeats: int) -> None:
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    out = lambda **kw: print(json.dumps(kw), flush=True)  # noqa: E731
    legacy = {
        "temperature_gpu": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "power_usage": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "total_energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
        "max_clock_sm": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "clock_sm": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "violation_power": lambda: nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_POWER).violationTime,
        "violation_thermal": lambda: nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_THERMAL).violationTime,
        "threshold_gpu_max": lambda: nv.nvmlDeviceGetTemperatureThreshold(h, 3),
        "threshold_mem_max": lambda: nv.nvmlDeviceGetTemperatureThreshold(h, 2),
        "threshold_slowdown": lambda: nv.nvmlDeviceGetTemperatureThreshold(h, 1),
        "margin": lambda: nv.nvmlDeviceGetMarginTemperature(h),
        "pcie_replay": lambda: nv.nvmlDeviceGetPcieReplayCounter(h),
        "uuid": lambda: nv.nvmlDeviceGetUUID(h),
        "enforced_limit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "util": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
    }
    for name, fn in legacy.items():
        us, result, err = timed(fn, repeats)
        result = getattr(result, "marginTemperature", result)
        out(kind="legacy", name=name, us=round(us, 1), value=str(result), error=err)
    for name, fid in FIELDS.items():
        us, result, err = timed(lambda: nv.nvmlDeviceGetFieldValues(h, [fid]), repeats)
        v = result[0] if result is not None else None
        out(kind="field", name=name, id=fid, us=round(us, 1), value=str(value_of(v)) if v is not None else None,
            latency_us=int(v.latencyUsec) if v is not None else None, error=err)
    batches = {"all": list(FIELDS.values()),
               "all_but_energy": [f for n, f in FIELDS.items() if n not in ("total_energy_mj", "energy_191")],
               "counters": [83, 74, 75, 94, 82, 185]}
    for name, ids in batches.items():
        us, result, err = timed(lambda: nv.nvmlDeviceGetFieldValues(h, ids), repeats)
        out(kind="batch", name=name, ids=ids, us=round(us, 1), error=err,
            values={str(v.fieldId): str(value_of(v)) for v in result} if result is not None else None)
    # the per-limit headroom beside the temperatures and thresholds, a few times a second
    for _ in range(10):
        gpu = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        mem = value_of(nv.nvmlDeviceGetFieldValues(h, [82])[0])
        heads = {n: str(value_of(v)) for n, v in zip(("gpu_max", "mem_max", "slowdown", "shutdown"),
                                                   nv.nvmlDeviceGetFieldValues(h, [196, 195, 194, 193]))}
        margin = timed(lambda: nv.nvmlDeviceGetMarginTemperature(h), 1)[1]
        out(kind="tlimit", gpu=gpu, memory=str(mem), headroom=heads,
            margin=str(getattr(margin, "marginTemperature", margin)))
        time.sleep(0.2)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
