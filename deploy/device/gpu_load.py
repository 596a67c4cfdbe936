"""Step one GPU through a load schedule, for recording its thermal step response.

Run on a machine with a GPU and PyTorch; it changes no GPU setting (clocks, power limit and
fans stay as the driver has them), it only runs work. Each phase is ``KIND:SECONDS``:

- ``idle``    nothing runs;
- ``matmul``  back-to-back bf16 8192^3 matrix products (tensor cores: the GPU's full power);
- ``copy``    device-to-device copies of 2 GiB (memory-bound: a lower, steady power).

Each phase start and the end are printed as JSON lines ``{"phase", "time"}`` (Unix seconds),
the ground truth that a recording of the same minutes is aligned with::

    python deploy/device/gpu_load.py idle:30 matmul:150 copy:60 idle:90 > phases.jsonl
"""

from __future__ import annotations

import json
import sys
import time


def main(schedule: list[str]) -> None:
    import torch

    device = torch.device("cuda")
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    src = torch.empty(2 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    torch.cuda.synchronize()

    def emit(phase: str) -> None:
        print(json.dumps({"phase": phase, "time": round(time.time(), 3),
                          "gpu": torch.cuda.get_device_name(0)}), flush=True)

    for step in schedule:
        kind, seconds = step.split(":")
        end = time.time() + float(seconds)
        emit(kind)
        while time.time() < end:
            if kind == "idle":
                time.sleep(min(0.1, max(0.0, end - time.time())))
                continue
            for _ in range(10):  # a short burst, so the phase ends on time
                if kind == "matmul":
                    torch.matmul(a, b)
                elif kind == "copy":
                    dst.copy_(src)
                else:
                    raise SystemExit(f"unknown phase kind {kind!r}")
            torch.cuda.synchronize()
    emit("end")


if __name__ == "__main__":
    main(sys.argv[1:] or ["idle:30", "matmul:150", "copy:60", "idle:90"])
