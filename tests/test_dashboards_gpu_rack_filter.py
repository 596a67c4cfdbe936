"""The GPU board shows the same GPUs in every panel for one choice of its variables.

Its node and GPU variables match everything (``.*``) when All is chosen, which drops the rack they
were chosen within: panels that selected GPUs by ``node``/``gpu`` labels alone or by the finding's
``entity`` alone ("Predicted time to event", "Prediction confidence", the ETA in "Temperature vs
predicted time to throttle", "Anomaly scores") listed other racks' GPUs beside a rack's
temperatures. Here the real collector serves two racks' GPUs with predictions and anomaly scores,
the real Prometheus scrapes it, and every panel's own query (from the checked-in JSON, its
variables filled in as Grafana fills them) must return the chosen rack's GPUs only.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from conftest_prom import serving, wait_until
from foreshock.dashboards.generate import load_dashboards
from foreshock.exporters.store import FindingStore
from foreshock.findings import Anomaly, Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology

# the panels that show findings: each must have something to show in either rack, so that a query
# filtering everything out could not pass
FINDING_PANELS = ("Predicted time to event", "Prediction confidence", "Anomaly scores")


def _as_grafana_sends(expr: str, rack: str) -> str:
    """``expr`` with ``$rack`` chosen and every other variable on All (the board's ``.*``)."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: rack if m.group(1) == "rack" else ".*", expr)


def _node_of(labels: dict[str, str]) -> str:
    """The node a series is about, from its ``node`` label or its GPU ``entity`` ("node2/gpu4")."""
    return labels["node"] if "node" in labels else labels["entity"].split("/")[0]


@pytest.mark.prometheus
def test_every_gpu_panel_keeps_to_the_chosen_rack(small_topology: Topology, start_prometheus: Any) -> None:
    store = FindingStore(small_topology)
    n = small_topology.size("gpu")
    store.observe_frame(Frame("gpu", np.full(n, 1000.0), np.arange(n), {
        "gpu_temp": np.full(n, 60.0), "hbm_temp": np.full(n, 55.0), "power": np.full(n, 500.0),
        "power_limit": np.full(n, 700.0), "sm_clock": np.full(n, 1.98e9), "throttle_reasons": np.full(n, 4.0)}))
    in_rack0, in_rack1 = 3, 20  # node0/gpu3 and node2/gpu4
    for slot in (in_rack0, in_rack1):
        store.observe_findings([
            Prediction(1000.0, "gpu", slot, "thermal_throttle", 600.0, 0.8, "thermal"),
            Anomaly(1000.0, "gpu", slot, "gpu_temp", 7.5, "robust_zscore"),
        ])
    node_labels = [small_topology.labels("node", i) for i in range(small_topology.size("node"))]
    rack_nodes = {rack: {labels["node"] for labels in node_labels if labels["rack"] == rack}
                  for rack in ("rack0", "rack1")}
    board = load_dashboards()["foreshock-gpu"]
    targets = [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel.get("targets", [])]
    with serving(store) as port:
        prom = start_prometheus(scrape={"foreshock": [f"127.0.0.1:{port}"]})
        wait_until(lambda: len(prom.query("foreshock_anomaly_score")) == 2
                   and len(prom.query("foreshock_prediction_eta_seconds")) == 2, timeout=30,
                   what="the predictions and anomaly scores scraped")
        for rack, nodes in rack_nodes.items():
            for title, expr in targets:
                rows = prom.query(_as_grafana_sends(expr, rack))
                strays = [row["metric"] for row in rows if _node_of(row["metric"]) not in nodes]
                assert not strays, (rack, title, strays)
                if title in FINDING_PANELS:
                    assert rows, (rack, title)  # the rack's own GPU is shown
