"""The shipped alert expressions against what the exporter really publishes.

The promtool cases (deploy/prometheus/tests) feed hand-written series, so they cannot notice
when a rule and the exporter disagree about a family's meaning or labels (a fraction compared
with a threshold written as a factor, a per-GPU series the exporter does not publish for the GPU
in question). Here the real collector serves a store filled with findings and telemetry, the
real Prometheus scrapes it, and each alert's expression (its `for` aside: promtool covers that)
must select exactly the entities that should page, no others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from conftest_prom import serving, wait_until
from foreshock.exporters.store import FindingStore
from foreshock.findings import Incident, Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology

RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "rules" / "foreshock.rules.yml"
TOP_K = 1
FAILING_LINK = "node1/gpu3~leaf3"
CONGESTED_LINK = "node2/gpu5~leaf5"


def _alert_exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"] if "alert" in r}


def _fill(store: FindingStore, topology: Topology) -> None:
    n = topology.size("gpu")
    temps = np.linspace(40.0, 71.0, n)  # GPU 31 (node3) has the hottest core: the top K = 1
    hbm = np.full(n, 60.0)
    hbm[2] = 93.0  # a cool core beside HBM within 5 °C of its limit
    hbm[31] = 89.0  # the hottest core, HBM under the alert level
    # each GPU against its own HBM limit: an 85 °C part at 82 °C pages, a 105 °C part at 92 °C does not
    hbm_limit = np.full(n, np.nan)
    hbm[12], hbm_limit[12] = 82.0, 85.0
    hbm[13], hbm_limit[13] = 92.0, 105.0
    masks = np.zeros(n)
    masks[9] = 0x84  # SW power cap + HW power brake
    masks[10] = 0x17F  # every bit but the brake: `x >= 128` would page, the decode must not
    xid = np.zeros(n)
    xid[6] = 48  # latched before foreshock started: never counted
    base = {"gpu_temp": temps, "hbm_temp": hbm, "power": np.full(n, 600.0), "power_limit": np.full(n, 700.0),
            "throttle_reasons": masks, "hbm_max_op_temp": hbm_limit}
    store.observe_frame(Frame("gpu", np.full(n, 1000.0), np.arange(n), {**base, "xid_last": xid.copy()}))
    xid[5] = 79  # a new XID (critical tier)
    store.observe_frame(Frame("gpu", np.full(n, 1001.0), np.arange(n), {**base, "xid_last": xid.copy()}))
    # node1's slowest fan stopped; node2's runs slow but turns (under 10 % of full pages, not 12 %)
    store.observe_frame(Frame("node", np.full(4, 1001.0), np.arange(4), {"fan_speed": np.array([0.4, 0.0, 0.12, 0.4])}))
    link = topology.slot("link", FAILING_LINK)
    store.observe_findings([
        Prediction(1001.0, "gpu", 3, "thermal_throttle", 600.0, 0.8, "thermal"),
        Prediction(1001.0, "gpu", 4, "thermal_throttle", 600.0, 0.3, "thermal"),  # too unsure to page
        Prediction(1001.0, "gpu", 7, "power_cap", 7200.0, 0.9, "power"),  # beyond the horizon
        Prediction(1001.0, "link", link, "link_down", 1800.0, 0.9, "optics"),
        Prediction(1001.0, "link", topology.slot("link", CONGESTED_LINK), "congestion", 0.0, 1.0, "congestion"),
        Incident(1001.0, "inc-1", "growing", "cooling_loop", "cdu1", "flow lost",
                 members=("rack1", "node2/gpu0", "node2/gpu1"), jobs=(("job1", 1.25),)),  # 25 % slower
        Incident(1001.0, "inc-2", "open", "gpu", "node0/gpu1", "hot", members=("node0/gpu1",),
                 jobs=(("job0", 1.02),)),  # 2 % slower: under the 5 % threshold
    ])


# alert -> (labels to compare, the label values of every series its expression must select)
EXPECTED: dict[str, tuple[tuple[str, ...], list[tuple[str, ...]]]] = {
    "ForeshockThrottlePredicted": (("entity", "event", "rack"), [("node0/gpu3", "thermal_throttle", "rack0")]),
    "ForeshockLinkFailurePredicted": (("entity", "entity_kind"), [(FAILING_LINK, "link")]),
    "ForeshockFabricCongestion": (("cluster",), [("test",)]),
    "ForeshockCascadeIncident": (("incident", "root_kind", "root_entity"), [("inc-1", "cooling_loop", "cdu1")]),
    # the exporter publishes the extra step time as a fraction: job1 is 25 % slower, job0 2 %
    "ForeshockJobSlowdownPredicted": (("training_job",), [("job1",)]),
    # GPU 2 is outside the top K by core temperature: its HBM series must still be published
    # and GPU 12 (node1/gpu4) is within 5 °C of its own 85 °C; GPU 13's 92 °C is far from its 105 °C
    "ForeshockHbmTemperatureNearLimit": (("node", "gpu"), [("node0", "2"), ("node1", "4")]),
    "ForeshockPowerBrake": (("node", "gpu"), [("node1", "1")]),  # GPU slot 9
    "ForeshockFanStopped": (("node", "rack"), [("node1", "rack0")]),
    "ForeshockXidCritical": (("node", "gpu", "xid"), [("node0", "5", "79")]),  # GPU 6's latched 48: never
    "ForeshockXidWarning": (("xid",), []),
    # a healthy pipeline: silent
    "ForeshockPipelineDown": ((), []),
    "ForeshockIngestLag": ((), []),
    "ForeshockDeadLettersRising": ((), []),
    "ForeshockPollsSkipped": ((), []),
}


@pytest.mark.prometheus
def test_each_alert_selects_exactly_the_entities_that_should_page(small_topology: Topology,
                                                                   start_prometheus: Any) -> None:
    store = FindingStore(small_topology)
    _fill(store, small_topology)
    with serving(store, top_k=TOP_K) as port:
        prom = start_prometheus(scrape={"foreshock": [f"127.0.0.1:{port}"]}, rule_files=[RULES])
        wait_until(lambda: prom.query("foreshock_last_telemetry_timestamp_seconds"), timeout=30,
                   what="the first scrape")
        exprs = _alert_exprs()
        wrong = []
        for alert, (labels, expected) in EXPECTED.items():
            result = prom.query(exprs[alert])
            got = sorted(tuple(r["metric"].get(k, "") for k in labels) for r in result)
            if got != sorted(expected):
                wrong.append(f"{alert}: selects {got}, expected {sorted(expected)}")
            if alert == "ForeshockJobSlowdownPredicted" and result:
                assert float(result[0]["value"][1]) == pytest.approx(0.25)
        assert not wrong, "\n".join(wrong)
