"""Findings of an audit of the cooling detector (2026-12-04), each reproduced first: in a cluster
too small to compare a node with other nodes (fewer than three in its rack and in its loop), a
node whose fans failed was never flagged — its eight GPUs were, one by one, each as "thermal
interface or cold plate degrading", each refreshed every ten minutes: the on-call engineer sent to
re-paste eight GPUs. And in any cluster, the GPUs of a node flagged together read so too.

A second audit, of the idle comparison: "idle" is any load under the fit's 200 W, and a GPU at
170 W (light inference) was compared by its temperature over the inlet with node-mates idling at
78 W — 4 °C warmer, "thermal interface or cold plate degrading", a whole node at 180 W "node fans or
airflow", refreshed for as long as the light load lasted. The idle excess is now compared with
what the nominal resistance gives at each GPU's own power.

Left as found (no fault of the simulator shows it, so nothing measures a rule for it): every GPU of
a rack or of a whole loop running hotter per watt together while the inlet reads steady (a
manifold clogging behind an inlet sensor at the supply) is flagged by nothing: the peer comparison
cancels, and a rack is flagged on its inlet only.
"""

from __future__ import annotations

import numpy as np

from foreshock.detectors.cooling import I_BASE, CoolingDetector
from thermal_synth import run, small_topology
from foreshock.findings import Anomaly
from foreshock.frames import Frame
from foreshock.topology import Topology


def _run(nodes: int, hot: slice, factor: float) -> list[Anomaly]:
    topo = Topology.from_dict({
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}], "racks": [{"name": "rack0", "row": "row0"}],
        "nodes": [{"name": f"node{k}", "rack": "rack0", "gpus": 8} for k in range(nodes)]})
    n = topo.size("gpu")
    r0 = 0.046 * (1 + 0.03 * np.random.default_rng(0).standard_normal(n))
    det, found = CoolingDetector(topo), []
    for t in np.arange(0.0, 6 * 3600, 30.0):
        r = r0.copy()
        r[hot] *= 1 + (factor - 1) * min(1.0, max(0.0, t - 3 * 3600) / 7200)  # from the third hour
        det.update(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
        found += det.update(Frame("gpu", np.full(n, t), np.arange(n),
                                  {"gpu_temp": np.round(24 + r * 650), "power": np.full(n, 650.0)}))
    return found


def test_a_node_whose_fans_fail_in_a_rack_of_two_is_flagged_as_the_node() -> None:
    found = _run(2, slice(8, 16), 1.8)  # node1's fans: each of its GPUs x1.8 per watt
    nodes = [f for f in found if f.entity_kind == "node"]
    assert nodes and {f.slot for f in nodes} == {1}
    assert "node fans or airflow" in nodes[0].reason and "own history" in nodes[0].reason
    gpus = [f for f in found if f.entity_kind == "gpu"]
    assert {f.slot for f in gpus} <= set(range(8, 16))
    # once half the node's GPUs are flagged, theirs name the node rather than their interfaces
    after = [f for f in gpus if f.ts >= nodes[0].ts]
    assert after and all("node fans or airflow" in f.reason for f in after)


def test_one_failing_interface_in_a_rack_of_two_is_the_gpu_not_its_node() -> None:
    found = _run(2, slice(9, 10), 1.6)
    assert found and all(f.entity_kind == "gpu" and f.slot == 9 for f in found)
    assert all("thermal interface or cold plate degrading" in f.reason for f in found)


def _idle_frames(topo: Topology, hours: float, power_of, extra_of=None,  # type: ignore[no-untyped-def]
                 dark: tuple[int, float, float] | None = None) -> list[Frame]:
    n = topo.size("gpu")
    rng = np.random.default_rng(4)
    r = 0.046 * (1 + 0.03 * np.random.default_rng(0).standard_normal(n))
    idle = 78.0 + rng.uniform(-4, 4, n)
    frames = []
    for t in np.arange(0.0, hours * 3600, 30.0):
        power = power_of(t, idle.copy())
        extra = np.zeros(n) if extra_of is None else extra_of(t)
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [24.2]}))
        temp = np.round(24.2 + r * power + extra)
        if dark is not None and dark[1] <= t <= dark[2]:
            temp[dark[0]] = np.nan  # polls without its temperature
        frames.append(Frame("gpu", np.full(n, t), np.arange(n), {"gpu_temp": temp,
                                                                 "power": power + rng.normal(0, 2, n)}))
    return frames


def test_gpus_and_a_node_at_light_load_are_not_read_as_failing_idle_hardware() -> None:
    topo = small_topology(nodes=4, gpus=8, racks=1)

    def power_of(t: float, p: np.ndarray) -> np.ndarray:
        if t >= 7200:  # GPU 9 alone at 170 W, every GPU of node2 at 180 W: under the fit's 200 W
            p[9] = 170.0
            p[16:24] = 180.0
        return p

    assert run(CoolingDetector(topo), _idle_frames(topo, 4.0, power_of)) == []


def _gpu5_warm(t: float) -> np.ndarray:
    """Per GPU of a 4-node, 8-GPU topology, the extra °C: GPU 5's interface 4 °C warmer from 1.5 h."""
    extra = np.zeros(32)
    extra[5] = 4.0 if t >= 5400 else 0.0
    return extra


def test_an_idle_gpu_running_warm_for_its_power_is_still_flagged() -> None:
    topo = small_topology(nodes=4, gpus=8, racks=1)

    found = run(CoolingDetector(topo), _idle_frames(topo, 4.0, lambda t, p: p, _gpu5_warm))
    assert found and {(f.entity_kind, f.slot) for f in found} == {("gpu", 5)}
    assert "idle" in found[0].reason and "at the same power" in found[0].reason


def test_a_flagged_idle_gpu_unread_at_one_comparison_keeps_its_flag_and_its_history() -> None:
    topo = small_topology(nodes=4, gpus=8, racks=1)

    clean = run(CoolingDetector(topo), _idle_frames(topo, 5.0, lambda t, p: p, _gpu5_warm))
    times = [f.ts for f in clean]
    dark_at = times[4]  # the poll its fifth finding is said at: a refresh due, its temperature missing
    det = CoolingDetector(topo)
    found = run(det, _idle_frames(topo, 5.0, lambda t, p: p, _gpu5_warm, dark=(5, dark_at, dark_at)))
    assert [f.ts for f in found] == times  # said at the same comparisons, none left out
    assert np.diff(times).max() <= 600.0
    assert any("not read at this comparison" in f.reason for f in found)
    assert np.isfinite(det.s_idle[5, I_BASE])  # its idle history kept


def test_an_idle_gpu_whose_temperature_stays_dark_is_no_longer_said_hot() -> None:
    topo = small_topology(nodes=4, gpus=8, racks=1)

    times = [f.ts for f in run(CoolingDetector(topo), _idle_frames(topo, 5.0, lambda t, p: p, _gpu5_warm))]
    found = run(CoolingDetector(topo), _idle_frames(topo, 5.0, lambda t, p: p, _gpu5_warm,
                                                    dark=(5, times[2] + 1.0, 5 * 3600.0)))
    assert [f.ts for f in found if "not read" not in f.reason] == times[:3]
    held = [f for f in found if "not read" in f.reason]  # said held once (a refresh due), then let go
    assert len(held) == 1 and held[0].ts <= times[2] + 600.0
