"""A straggler's reason counts the job's busy GPUs as what they are: until 2026-12-05 it said "(2 busy
peers)" of a GPU in a job of two, where it has one peer (the count included the GPU itself)."""

from __future__ import annotations

import re

import numpy as np

from foreshock.detectors.straggler import StragglerDetector
from foreshock.frames import Frame
from foreshock.topology import Topology


def test_the_reason_counts_the_jobs_busy_gpus_with_the_slow_one_among_them() -> None:
    topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": "n0", "rack": "k", "gpus": 2}],
                               "jobs": [{"name": "j", "nodes": ["n0"]}]})
    det = StragglerDetector(topo)
    found = []
    for t in range(0, 1800, 10):  # GPU 1 runs at 0.7 of its max clock, GPU 0 at full
        found += det.update(Frame("gpu", [float(t)] * 2, [0, 1], {
            "sm_clock": [1.98e9, 0.7 * 1.98e9], "sm_clock_max": [1.98e9] * 2, "util": [1.0, 1.0],
            "power": [600.0, 600.0], "gpu_temp": [60.0, 60.0]}))
    slow = [f for f in found if f.slot == 1]
    assert slow, [f.reason for f in found]
    assert not [f for f in found if f.slot == 0]
    counts = {int(m) for f in slow for m in re.findall(r"\((\d+) busy GPUs in the job", f.reason)}
    assert counts == {2}, [f.reason for f in slow]  # the two GPUs of job j, the slow one among them
    assert "busy peers" not in " ".join(f.reason for f in found)
