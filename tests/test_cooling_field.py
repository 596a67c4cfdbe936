"""The cooling, straggler and XID detectors on what real deployments send: readings derived from the
real nvidia-smi captures (an H100 and an H200 at steady load, shared/data/nvidia-smi), mixed in one
rack and one job, and the XIDs dcgm's latched last-XID field reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from foreshock.detectors import xid as xid_module
from foreshock.detectors.cooling import CoolingDetector
from foreshock.detectors.incident_signals import classify
from foreshock.detectors.straggler import StragglerDetector
from foreshock.detectors.xid import XidDetector
from foreshock.frames import Frame
from foreshock.streams.nvidia_smi import capture_sections, parse_query_gpu
from foreshock.topology import Topology

from thermal_synth import run

CAPTURES = {"h100": "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt",
            "h200": "nvidia-smi/linux-x86_64__nvidia-h200__590.48.01.txt"}
FIELDS = ("gpu_temp", "power", "sm_clock", "sm_clock_max", "util", "throttle_reasons", "power_limit")


def load_row(shared_data: Path, sku: str) -> dict[str, float]:
    """The capture's steady-load query-gpu row (gpu-burn): 59 °C at 632 W on the H100, 52 °C at
    627 W on the H200, both at 1980 MHz of 1980, utilisation 1, no throttle bit."""
    batch = parse_query_gpu(capture_sections((shared_data / CAPTURES[sku]).read_text())["load :: query-gpu"])
    return {k: float(np.asarray(batch.columns[k])[0]) for k in FIELDS}


def mixed_rack() -> Topology:
    """One rack of four 8-GPU nodes, node0 an H100 node, node1-3 H200 nodes, one job on all four."""
    names = [f"node{i}" for i in range(4)]
    return Topology.from_dict({
        "cluster": "field", "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
        "racks": [{"name": "rack0", "row": "row0"}],
        "nodes": [{"name": n, "rack": "rack0", "gpus": 8} for n in names], "jobs": [{"name": "job0", "nodes": names}]})


def steady_frames(shared_data: Path, hours: float, inlet: float = 25.0) -> list[Frame]:
    """The two captures' load rows replayed every 30 s on the mixed rack at one shared inlet: each GPU
    keeps its capture's resistance over that inlet (H100 +25 % per watt over the H200), power within
    the ±5 W nvidia-smi is accurate to, temperatures in whole °C."""
    rows = [load_row(shared_data, "h100")] * 8 + [load_row(shared_data, "h200")] * 24
    r = np.array([(row["gpu_temp"] - inlet) / row["power"] for row in rows])
    rng = np.random.default_rng(3)
    frames = []
    for t in np.arange(0.0, hours * 3600, 30.0):
        power = np.array([row["power"] for row in rows]) + rng.uniform(-5, 5, 32)
        cols = {k: np.array([row[k] for row in rows]) for k in FIELDS}
        cols.update(power=power, gpu_temp=np.round(inlet + r * power))
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [inlet]}))
        frames.append(Frame("gpu", np.full(32, t), np.arange(32), cols))
    return frames


def test_a_mixed_h100_h200_rack_at_steady_load_flags_nothing(shared_data: Path) -> None:
    """The H100 node among H200 nodes runs +25 % per watt over the rack at the captures' steady
    load, from the first hour on and for good: its node was flagged "node fans or airflow" and
    refreshed every 10 minutes for the whole run. Steady load is not degradation."""
    frames = steady_frames(shared_data, hours=3.0)
    assert run(CoolingDetector(mixed_rack()), frames) == []
    assert run(StragglerDetector(mixed_rack()), [f for f in frames if f.kind == "gpu"]) == []


def test_application_xids_root_no_gpu_error() -> None:
    """dcgm's last-XID field: 13, 31, 43 and 45 are what a user's program causes (an illegal
    address, a killed process); each rooted a "gpu_error" incident (family lost, opens one) on a
    healthy GPU, reason "driver error". They are not findings; a hardware XID after one still is,
    and so is a code FACTS does not list (severity info, "driver error")."""
    topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": "n", "rack": "k", "gpus": 4}]})
    det, found = XidDetector(topo), []
    for t, codes in enumerate([[0, 0, 0, 0], [13, 31, 43, 45], [13, 31, 43, 45], [13, 31, 61, 63], [0, 45, 61, 63]]):
        found += det.update(Frame("gpu", np.full(4, float(t)), np.arange(4),
                                  {"xid_last": np.array(codes, dtype=float), "ecc_dbe": np.zeros(4)}))
    assert [(f.slot, f.score) for f in found] == [(2, 61.0), (3, 63.0)]
    assert "row remap pending (warning)" in found[1].reason and classify(found[1]) == "gpu_error"
    assert "driver error (info)" in found[0].reason


@pytest.mark.parametrize("codes, want", [([0, 79], [79.0]), ([48, 48], []), ([0, 79, 0, 79], [79.0, 79.0])])
def test_a_latched_xid_is_reported_once_per_change(codes: list[int], want: list[float]) -> None:
    """dcgm's field holds the last XID: a new event is a change (the first value may be from long
    ago), a repeat of the same code is invisible (a design limit of the field), and a driver reload
    (back to 0) lets the same code be seen again."""
    topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": "n", "rack": "k", "gpus": 1}]})
    det, found = XidDetector(topo), []
    for t, c in enumerate([codes[0]] + codes):
        found += det.update(Frame("gpu", [float(t)], [0], {"xid_last": [float(c)]}))
    assert [f.score for f in found] == want
    import doctest
    assert doctest.testmod(xid_module).failed == 0
