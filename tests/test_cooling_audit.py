"""Findings of an audit of the cooling detector (2026-12-04), each reproduced first: in a cluster
too small to compare a node with other nodes (fewer than three in its rack and in its loop), a
node whose fans failed was never flagged — its eight GPUs were, one by one, each as "thermal
interface or cold plate degrading", each refreshed every ten minutes: the on-call engineer sent to
re-paste eight GPUs. And in any cluster, the GPUs of a node flagged together read so too.

Left as found (no fault of the simulator shows it, so nothing measures a rule for it): every GPU of
a rack or of a whole loop running hotter per watt together while the inlet reads steady (a
manifold clogging behind an inlet sensor at the supply) is flagged by nothing: the peer comparison
cancels, and a rack is flagged on its inlet only.
"""

from __future__ import annotations

import numpy as np

from foreshock.detectors.cooling import CoolingDetector
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
