"""A finding of an audit of the optics detector (2026-12-04), reproduced first: the ETA gauge
(``optic_link_down_eta_seconds``) is each signal's ETA solved at its fit, and a signal no longer
fitted — its field gone NaN while the rest of the optic's rows come — was exported frozen while
the link's prediction counted down (1.52 h at 2.5, 2.67 and 2.83 h). The gauge counts down as
the prediction does, and a fit more than a window old is unknown there too. (The audit's other
findings are in the README, left as found.)"""

from __future__ import annotations

import numpy as np

from foreshock.detectors.optics import F_PERSIST, SIG_RX, OpticsDetector
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology


def test_the_eta_gauge_counts_down_while_a_signal_goes_unread() -> None:
    topo = Topology.from_dict({
        "rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
        "nodes": [{"name": "n0", "rack": "k", "gpus": 1}], "switches": [{"name": "leaf0"}],
        "links": [{"name": "n0/gpu0~leaf0", "a": "n0/gpu0", "b": "leaf0"}]})
    det = OpticsDetector(topo, rx_power_low_alarm_dbm=-8.0)
    rng = np.random.default_rng(0)
    dark_from, gauge, predicted = None, {}, {}
    for t in np.arange(0.0, 4 * 3600, 30.0):
        rx_b = -2.0 - 2.0 * max(0.0, t - 3600) / 3600 + rng.normal(0, 0.03)  # 2 dB/h toward -8 dBm
        if dark_from is None and t >= 2.5 * 3600 and det.s_fit[1, SIG_RX, F_PERSIST] == 1.0 and t % 60 == 0:
            dark_from = t  # end b's RX reads NaN from here; its bias and temperature still come
        rx = [-2.0 + rng.normal(0, 0.03), rx_b if dark_from is None else np.nan]
        found = det.update(Frame("optic", np.full(2, t), np.array([0, 1]), {
            "rx_power": np.array(rx), "tx_bias": np.full(2, 0.008), "module_temp": np.full(2, 40.0)}))
        for p in found:
            if isinstance(p, Prediction) and p.active:
                predicted[t] = p.eta_s
        if dark_from is not None and t - dark_from in (0.0, 600.0, 1200.0):
            gauge[t - dark_from] = det.gauges()["optic_link_down_eta_seconds"][1][1]
    assert dark_from is not None and all(np.isfinite(list(gauge.values())))
    assert gauge[0.0] - gauge[600.0] >= 500.0 and gauge[600.0] - gauge[1200.0] >= 500.0  # ~600 s each
    last = max(t for t in predicted if t <= dark_from + 1200.0)
    assert abs(gauge[1200.0] - predicted[last]) <= 120.0  # as the prediction counts it
