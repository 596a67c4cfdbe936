"""Read what nvidia-smi's ``temperature.gpu.tlimit`` (T.Limit) is a margin to, on a real GPU.

Polls NVML every ``--interval`` seconds for the GPU and memory temperatures, the GPU and memory max
operating thresholds and NVML's thermal margin (``nvmlDeviceGetMarginTemperature``, "the distance to
the nearest slowdown threshold"), and nvidia-smi for ``temperature.gpu``, ``temperature.memory``
and ``temperature.gpu.tlimit`` in the same instant, while another process steps the load
(``deploy/device/gpu_load.py``). One JSON line per poll on stdout::

    python deploy/device/tlimit_check.py --seconds 110 --interval 0.5 > tlimit.jsonl

It changes no GPU setting. Written for the question: is T.Limit the GPU's own margin to its max
operating temperature, or the smaller of the GPU's and the memory's?
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time


def smi_row() -> list[str]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=temperature.gpu,temperature.memory,temperature.gpu.tlimit,"
                          "power.draw", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, timeout=10).stdout
    return [c.strip() for c in out.strip().split(",")]


def _margin(value):  # an int in nvidia-ml-py 12.5xx+, the struct in some releases
    return getattr(value, "marginTemperature", value)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=110.0)
    ap.add_argument("--interval", type=float, default=0.5)
    args = ap.parse_args()
    import pynvml as nv

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)

    def read(name: str, fn):  # one field; an error is written as its text
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a probe: record what the driver said
            return f"error: {exc}"

    static = {
        "driver": read("driver", nv.nvmlSystemGetDriverVersion),
        "gpu_max_op": read("gpu_max_op", lambda: nv.nvmlDeviceGetTemperatureThreshold(h, 3)),
        "mem_max_op": read("mem_max_op", lambda: nv.nvmlDeviceGetTemperatureThreshold(h, 2)),
        "slowdown": read("slowdown", lambda: nv.nvmlDeviceGetTemperatureThreshold(h, 1)),
        "shutdown": read("shutdown", lambda: nv.nvmlDeviceGetTemperatureThreshold(h, 0)),
    }
    print(json.dumps({"static": static}), flush=True)
    end = time.time() + args.seconds
    while time.time() < end:
        t0 = time.time()
        row = {"time": round(t0, 3),
               "margin": read("margin", lambda: _margin(nv.nvmlDeviceGetMarginTemperature(h))),
               "gpu": read("gpu", lambda: nv.nvmlDeviceGetTemperature(h, 0)),
               "smi": read("smi", smi_row)}
        print(json.dumps(row), flush=True)
        time.sleep(max(0.0, args.interval - (time.time() - t0)))


if __name__ == "__main__":
    main()
