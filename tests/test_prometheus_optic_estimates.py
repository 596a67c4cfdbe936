"""``foreshock_estimate`` for a link flagged by the optics detector's ``link_down`` prediction: the
detector's estimates are per optic (its ETA, its RX power trend), the prediction per link, and the
exporter publishes estimates of flagged entities only. Until 2026-12-05 such a link showed its optics'
RX power and BER series (the exporter maps a link to its two optics there) but not their estimates."""

from __future__ import annotations

import numpy as np
from prometheus_client import generate_latest

from conftest import make_small_topology
from foreshock.exporters.prometheus import build_registry
from foreshock.exporters.store import FindingStore
from foreshock.findings import Prediction
from foreshock.frames import Frame

ETA = "optic_link_down_eta_seconds"


def exposition_of_a_link_predicted_down(eta_s: float) -> list[str]:
    topo = make_small_topology()
    store = FindingStore(topo)
    n = topo.size("optic")
    store.observe_frame(Frame("optic", np.full(n, 100.0), np.arange(n),
                              {"rx_power": np.full(n, -3.0), "prefec_ber": np.full(n, 1e-9)}))
    link = topo.slot("link", "node1/gpu3~leaf3")
    eta = np.full(n, np.nan)
    eta[[2 * link, 2 * link + 1, 0]] = eta_s  # both ends of the link, and an optic of another, unflagged link
    store.set_gauges({ETA: ("optic", eta, "Time until this optic's link is expected to fail")})
    store.observe_findings([Prediction(100.0, "link", link, "link_down", eta_s, 0.9, "optics")])
    return [line for line in generate_latest(build_registry(store)).decode().splitlines()
            if line.startswith("foreshock_estimate{")]


def test_a_link_predicted_down_exports_its_two_optics_estimates() -> None:
    lines = exposition_of_a_link_predicted_down(1800.0)
    assert sorted(line.split('entity="')[1].split('"')[0] for line in lines if ETA in line) == [
        "node1/gpu3~leaf3#a", "node1/gpu3~leaf3#b"]  # not the unflagged link's optic
    assert all(line.endswith(" 1800.0") for line in lines)
