"""Fleet overview judges each GPU against its own limits, not a fixed 87 °C.

Its stat showed the hottest core temperature coloured against 77 / 87 °C: in a fleet mixing parts
a 105 °C part at 90 °C read red while an 85 °C part at 84 °C, 1 °C from throttling, was hidden
behind it. The stat now shows the least thermal headroom (own limit less temperature, core or
HBM) and a panel ranks GPUs by it. Here the real collector serves a fleet of mixed parts and a
static page stands in for an older exporter without limit series; the real Prometheus scrapes
both and evaluates the shipped rules, and the panels' own queries (from the checked-in JSON) must
give the headroom, ordered by headroom.
"""

from __future__ import annotations

import re
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest_prom import serving, wait_until
from foreshock.dashboards.generate import load_dashboards
from foreshock.dashboards.rules import THERMAL_HEADROOM
from foreshock.exporters.store import FindingStore
from foreshock.frames import Frame
from foreshock.topology import Topology
from local_http import ScrapeServer

RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "rules" / "foreshock.rules.yml"
STAT = "Least thermal headroom"
RANKING = "Least thermal headroom by GPU"
TOP_K = 3

# An older exporter (or another job): temperatures, no limit series; judged against 87 / 95 °C.
LEGACY = ('foreshock_gpu_temperature_celsius{cluster="legacy",rack="rackL",node="nodeL",gpu="0"} 81\n'
          'foreshock_gpu_memory_temperature_celsius{cluster="legacy",rack="rackL",node="nodeL",gpu="0"} 93\n')

# (node, gpu, sensor) -> headroom in °C, worked out by hand from _fill and LEGACY, least first:
# the ten of twelve series with the least headroom. By absolute temperature the ten would differ
# (node0/gpu5's HBM at 70 °C in, node2/gpu4's core at 60 °C out) and start with the hottest, 93 °C.
EXPECTED_RANKING = [
    (("node1", "4", "core"), 1.0),  # an 85 °C part at 84 °C
    (("nodeL", "0", "hbm"), 2.0),  # no limit series: 95 - 93
    (("node2", "4", "hbm"), 3.0),  # HBM of an 85 °C part at 82 °C, beside a cool core
    (("nodeL", "0", "core"), 6.0),  # no limit series: 87 - 81
    (("node3", "3", "core"), 7.0),  # no limit reported: 87 - 80
    (("node3", "6", "hbm"), 13.0),  # HBM of a 105 °C part at 92 °C
    (("node0", "5", "core"), 15.0),  # a 105 °C part at 90 °C: the hottest core, far from its limit
    (("node2", "4", "core"), 27.0),  # 87 - 60
    (("node3", "6", "core"), 31.0),  # 105 - 74
    (("node1", "4", "hbm"), 33.0),  # 95 - 62
]
# left out: node0/gpu5's HBM (105 - 70 = 35) and node3/gpu3's (95 - 55 = 40)


def _fill(store: FindingStore, topology: Topology) -> None:
    """Five GPUs exported one by one (the top 3 by core: slots 5, 12, 27; by HBM: 30, 20, 5), the
    others cooler, with distinct temperatures so that the top K is not decided by a tie."""
    n = topology.size("gpu")
    core, hbm = np.linspace(40.0, 55.0, n), np.linspace(45.0, 52.0, n)
    core_limit, hbm_limit = np.full(n, np.nan), np.full(n, np.nan)
    core[5], core_limit[5], hbm[5], hbm_limit[5] = 90.0, 105.0, 70.0, 105.0  # node0/gpu5
    core[12], core_limit[12], hbm[12] = 84.0, 85.0, 62.0  # node1/gpu4
    core[20], hbm[20], hbm_limit[20] = 60.0, 82.0, 85.0  # node2/gpu4
    core[27], hbm[27] = 80.0, 55.0  # node3/gpu3
    core[30], core_limit[30], hbm[30], hbm_limit[30] = 74.0, 105.0, 92.0, 105.0  # node3/gpu6
    store.observe_frame(Frame("gpu", np.full(n, 1000.0), np.arange(n), {
        "gpu_temp": core, "hbm_temp": hbm, "max_op_temp": core_limit, "hbm_max_op_temp": hbm_limit}))


def _with(expr: str, **variables: str) -> str:
    """A panel query as Grafana sends it: the given variables, every other one on "All"."""
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: variables.get(m.group(1), ".*"), expr)


def _panel(title: str) -> dict[str, Any]:
    return next(p for p in load_dashboards()["foreshock-fleet"]["panels"] if p["title"] == title)


def _expr(title: str) -> str:
    (target,) = _panel(title)["targets"]
    return str(target["expr"])


def _grafana_colour(panel: dict[str, Any], value: float) -> str:
    """The colour Grafana gives ``value``: that of the last threshold step at or below it (the
    first step, value null, is the base)."""
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    colour = steps[0]["color"]
    for step in steps[1:]:
        if value < step["value"]:
            break
        colour = step["color"]
    return str(colour)


def test_headroom_is_red_at_the_limit_orange_within_10_c_green_beyond() -> None:
    stat = _panel(STAT)
    assert stat["fieldConfig"]["defaults"]["unit"] == "celsius"
    colours = {h: _grafana_colour(stat, h) for h in (-3.0, -0.2, 0.0, 0.3, 1.0, 9.5, 10.0, 10.5, 15.0)}
    assert colours == {-3.0: "red", -0.2: "red", 0.0: "red", 0.3: "orange", 1.0: "orange", 9.5: "orange",
                       10.0: "orange", 10.5: "green", 15.0: "green"}
    ranking = _panel(RANKING)
    assert [_grafana_colour(ranking, h) for h in (0.0, 1.0, 15.0)] == ["red", "orange", "transparent"]
    assert ranking["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] == {"mode": "line+area"}


@pytest.mark.prometheus
def test_fleet_panels_rank_gpus_by_headroom_against_their_own_limits(small_topology: Topology,
                                                                      start_prometheus: Any) -> None:
    store = FindingStore(small_topology)
    _fill(store, small_topology)
    legacy = ScrapeServer([LEGACY])
    with closing(legacy), serving(store, top_k=TOP_K) as port:
        prom = start_prometheus(scrape={"foreshock": [f"127.0.0.1:{port}"],
                                        "legacy": [legacy.url.removeprefix("http://").removesuffix("/metrics")]},
                                rule_files=[RULES])
        ranking = _with(_expr(RANKING))
        every_series = 12  # 5 exported GPUs and the legacy one, core and HBM each
        wait_until(lambda: [float(r["value"][1]) for r in prom.query(f"count({THERMAL_HEADROOM})")] == [every_series],
                   timeout=30, what="the headroom of all 12 series (a GPU without limit series falls back to 87 / 95 °C)")
        got = [((r["metric"]["node"], r["metric"]["gpu"], r["metric"]["sensor"]), float(r["value"][1]))
               for r in prom.query(ranking)]
        assert sorted(got, key=lambda item: item[1]) == EXPECTED_RANKING
        # the stat: the least headroom of the fleet, of each cluster (the one without limit series too)
        for cluster, least in ((".*", 1.0), ("test", 1.0), ("legacy", 2.0)):
            (row,) = prom.query(_with(_expr(STAT), cluster=cluster))
            assert float(row["value"][1]) == least, cluster
        # the ranking follows the rack variable
        rack1 = prom.query(_with(_expr(RANKING), rack="rack1"))
        assert sorted((r["metric"]["node"], r["metric"]["gpu"], r["metric"]["sensor"]) for r in rack1) == [
            ("node2", "4", "core"), ("node2", "4", "hbm"), ("node3", "3", "core"), ("node3", "3", "hbm"),
            ("node3", "6", "core"), ("node3", "6", "hbm")]
