"""The fleet board's "Predicted throttles" stat counts GPUs, as its description says.

It summed ``foreshock_predictions_active``, one count per prediction: a GPU predicted both to
throttle thermally and to meet its power cap as it cools (the power detector says so on purpose)
counted twice, and so did every GPU where two detectors run side by side. Here the real collector
serves such predictions, the real Prometheus scrapes it, and the panel's own query (from the
checked-in JSON) must give the number of distinct GPUs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest_prom import serving, wait_until
from foreshock.dashboards.generate import load_dashboards
from foreshock.exporters.store import FindingStore
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology

TITLE = "Predicted throttles"
RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "rules" / "foreshock.rules.yml"


def _expr(cluster: str) -> str:
    (panel,) = [p for p in load_dashboards()["foreshock-fleet"]["panels"] if p["title"] == TITLE]
    (target,) = panel["targets"]
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: cluster if m.group(1) == "cluster" else ".*", target["expr"])


@pytest.mark.prometheus
def test_predicted_throttles_counts_each_gpu_once(small_topology: Topology, start_prometheus: Any) -> None:
    store = FindingStore(small_topology)
    n = small_topology.size("gpu")
    store.observe_frame(Frame("gpu", np.full(n, 1000.0), np.arange(n), {"gpu_temp": np.full(n, 60.0)}))
    store.observe_findings([
        Prediction(1000.0, "gpu", 3, "thermal_throttle", 600.0, 0.8, "thermal"),
        Prediction(1000.0, "gpu", 3, "power_cap", 900.0, 0.8, "power"),  # the same GPU, as it cools
        Prediction(1000.0, "gpu", 3, "thermal_throttle", 650.0, 0.6, "threshold"),  # a second detector
        Prediction(1000.0, "gpu", 9, "power_cap", 120.0, 0.9, "power"),
        Prediction(1000.0, "gpu", 12, "hbm_overheat", 300.0, 0.9, "thermal"),  # not a throttle event
    ])
    with serving(store) as port:
        prom = start_prometheus(scrape={"foreshock": [f"127.0.0.1:{port}"]}, rule_files=[RULES])
        wait_until(lambda: prom.query("count(foreshock_prediction_eta_seconds)")
                   and prom.query("cluster:foreshock_predictions_active:sum"), timeout=30,
                   what="the predictions scraped and the shipped rules evaluated")
        for cluster, gpus in ((".*", 2.0), ("test", 2.0)):
            (row,) = prom.query(_expr(cluster))
            assert float(row["value"][1]) == gpus, cluster
        assert prom.query(_expr("another")) == []  # no GPU of that cluster: the panel's "0"
