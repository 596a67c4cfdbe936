"""The first benchmark (`make bench`): replay throughput, printed as a JSON line last.

`bench/run_all.py` collects each benchmark's last JSON line by its "name"; a benchmark that
prints anything after it, or forgets the figure, silently drops out of the README's table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_replay_prints_samples_per_second_as_its_last_line() -> None:
    nodes, ticks = 1, 20  # 8 GPUs: seconds, not the benchmark's 4,096-GPU run
    proc = subprocess.run([sys.executable, "bench/bench_replay.py", "--nodes", str(nodes), "--ticks", str(ticks),
                           "--runs", "1"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    last = json.loads(lines[-1])
    assert last["name"] == "replay_end_to_end"
    assert last["gpus"] == 8 * nodes and last["samples"] == 8 * nodes * ticks
    assert last["samples_per_s"] > 0 and last["samples_per_s_min"] <= last["samples_per_s"] <= last["samples_per_s_max"]
    assert "GPU samples/s" in lines[-2], "the human-readable figure comes before the JSON line"
