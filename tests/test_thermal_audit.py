"""Findings of an audit of the thermal detector (2026-12-04), each reproduced first: a prediction
(thermal_throttle or hbm_overheat) made before the GPU's temperature reading went dark — a sensor
failing, an exporter dropping the field — was held for good while the rest of its rows (power)
kept coming: rows without a usable reading were skipped, and the GPU was not silent. It now
stands down once no reading has come for ``off_hold_s``, saying so.
"""

from __future__ import annotations

import math

import numpy as np

from foreshock.detectors import thermal as th
from foreshock.detectors.alarm import K_SIZE, K_STATE
from foreshock.detectors import thermal_fit as tf
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology

TOPO = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                           "nodes": [{"name": "n", "rack": "k", "gpus": 2}]})


def _heat_until_predicted(det: th.ThermalDetector, r_hbm: float = 0.028,
                          hbm_drift: bool = False) -> tuple[float, list]:
    """GPU 0's core (or HBM) resistance grows 50 % an hour from the first hour, until predicted."""
    temp, hbm, t = np.full(2, 54.0), np.full(2, 42.0), 0.0
    r, rh = np.array([0.046, 0.046]), np.array([r_hbm, r_hbm])
    while t < 6 * 3600:
        t += 10.0
        grow = 1 + 0.5 * max(t - 3600, 0.0) / 3600
        if hbm_drift:
            rh[0] = r_hbm * grow * 1.5
        else:
            r[0] = 0.046 * grow
        temp += (24 + r * 650 - temp) * (1 - math.exp(-10 / 30))
        hbm += (24 + rh * 650 - hbm) * (1 - math.exp(-10 / 60))
        det.update(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
        found = det.update(Frame("gpu", [t, t], [0, 1], {
            "gpu_temp": np.round(temp), "hbm_temp": np.round(hbm), "power": np.full(2, 650.0),
            "power_limit": np.full(2, 700.0), "throttle_reasons": np.zeros(2)}))
        if any(isinstance(f, Prediction) and f.active for f in found):
            return t, found
    raise AssertionError("never predicted")


def _dark(det: th.ThermalDetector, t: float, polls: int, core: bool, hbm: bool) -> list:
    found = []
    for _ in range(polls):
        t += 10.0
        det.update(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
        found += det.update(Frame("gpu", [t, t], [0, 1], {
            "gpu_temp": [np.nan if core else 60.0, 54.0], "hbm_temp": [np.nan if hbm else 45.0, 42.0],
            "power": np.full(2, 650.0), "power_limit": np.full(2, 700.0), "throttle_reasons": np.zeros(2)}))
    return found


def test_a_throttle_prediction_stands_down_once_the_core_temperature_goes_unread() -> None:
    det = th.ThermalDetector(TOPO)
    t, found = _heat_until_predicted(det)
    assert [f.event for f in found if f.active] == ["thermal_throttle"]
    later = _dark(det, t, 360, core=True, hbm=False)  # an hour of rows without a core reading
    (withdrawn,) = [f for f in later if isinstance(f, Prediction)]
    assert withdrawn.event == "thermal_throttle" and not withdrawn.active and withdrawn.slot == 0
    assert withdrawn.ts - t <= det.params[tf.P_OFF_HOLD] + 20.0
    assert "temperature no longer read" in withdrawn.reason


def test_an_hbm_prediction_stands_down_once_the_hbm_temperature_goes_unread() -> None:
    det = th.ThermalDetector(TOPO)
    t, found = _heat_until_predicted(det, r_hbm=0.09, hbm_drift=True)
    assert "hbm_overheat" in [f.event for f in found if f.active]
    later = _dark(det, t, 360, core=False, hbm=True)
    hbm = [f for f in later if isinstance(f, Prediction) and f.event == "hbm_overheat"]
    assert len(hbm) == 1 and not hbm[0].active and "HBM temperature no longer read" in hbm[0].reason
    assert not det.s_alarm[0, tf.HBM * K_SIZE + K_STATE] < 0.0  # (the compact block: not active)


def test_a_reading_missing_now_and_then_withdraws_nothing() -> None:
    det = th.ThermalDetector(TOPO)
    t, _ = _heat_until_predicted(det)
    found = []
    for k in range(60):  # every third poll without a core reading, the die still hot
        t += 10.0
        det.update(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
        found += det.update(Frame("gpu", [t, t], [0, 1], {
            "gpu_temp": [np.nan if k % 3 == 0 else 84.0, 54.0], "hbm_temp": [45.0, 42.0],
            "power": np.full(2, 650.0), "power_limit": np.full(2, 700.0), "throttle_reasons": np.zeros(2)}))
    assert not any(isinstance(f, Prediction) and not f.active for f in found)
