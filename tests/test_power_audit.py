"""Findings of an audit of the power detector (2026-12-04), each reproduced first:

- one power reading far over the GPU's enforced limit (an exporter's glitch: 3,000 W on a 700-W
  part) set the compute-phase envelope, a running maximum that forgets 0.5 W/s, and the thermal
  fit's reference power: "2,175 W already at the 700 W limit", predicted every minute for 78 minutes;
- a prediction never stood down while the GPU's power read NaN or 0 W and its other fields kept
  coming (the row was skipped before the alarm was stepped, and the GPU was not silent);
- two GPUs of a node whose brakes flicker together (a supply dropping in and out) raised a node
  event at every other poll, and a GPU brake anomaly at each.
"""

from __future__ import annotations

import numpy as np
import pytest

from foreshock import facts
from foreshock.detectors import power as pw
from foreshock.detectors import thermal_fit as tf
from foreshock.findings import Anomaly, Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from test_state_budget_thermal import L1_S_BRAKE_OFF_TS, as_layout1
from thermal_synth import small_topology

OVER_LIMIT = "power reading over its enforced limit by more than 50 W: not taken for the cap forecast"


def gpu_frame(t: float, n: int, **cols: object) -> Frame:
    return Frame("gpu", np.full(n, float(t)), np.arange(n),
                 {k: np.broadcast_to(np.asarray(v, dtype=float), (n,)).copy() for k, v in cols.items()})


@pytest.mark.parametrize("glitch", [760.0, 3000.0])
def test_one_power_reading_far_over_the_limit_predicts_no_cap(glitch: float) -> None:
    health = PipelineHealth()
    det = pw.PowerDetector(small_topology(nodes=1, gpus=1, racks=1), health=health)
    found = []
    for t in np.arange(0.0, 9000.0, 10.0):
        found += det.update(gpu_frame(t, 1, power=glitch if t == 600 else 600.0, power_limit=700.0,
                                      throttle_reasons=0.0, gpu_temp=52.0))
    assert [f for f in found if isinstance(f, Prediction)] == []
    assert health.problems[("power", OVER_LIMIT)] == 1
    # the fit took it for no reading either: its reference power stayed at the GPU's 600 W
    assert det.fit.s_model[0, tf.G_PREF] == pytest.approx(600.0)


def test_a_reading_over_a_limit_just_lowered_is_not_taken_and_the_lower_limit_is() -> None:
    """An operator lowers the limit 700 -> 500 W while the GPU draws 690 W: the readings before the
    limiter follows are no compute-phase power under the new limit; once it binds (the cap bit)
    the GPU is at its cap, not heading for it."""
    health = PipelineHealth()
    det = pw.PowerDetector(small_topology(nodes=1, gpus=1, racks=1), health=health)
    found = []
    for t in np.arange(0.0, 1200.0, 10.0):
        lowered = t >= 600
        power = 690.0 if t < 620 else 497.0
        bits = float(facts.THROTTLE_SW_POWER_CAP) if t >= 620 else 0.0
        found += det.update(gpu_frame(t, 1, power=power, power_limit=500.0 if lowered else 700.0,
                                      throttle_reasons=bits, gpu_temp=60.0))
    assert health.problems[("power", OVER_LIMIT)] == 2  # 600 and 610 s
    starts = [f for f in found if isinstance(f, Prediction) and f.active]
    assert all(f.ts < 600 for f in starts)


@pytest.mark.parametrize("missing", [np.nan, 0.0])
def test_a_prediction_stands_down_once_the_power_is_no_longer_read(missing: float) -> None:
    det = pw.PowerDetector(small_topology(nodes=1, gpus=1, racks=1))
    found = []
    for t in np.arange(0.0, 300.0, 10.0):
        found += det.update(gpu_frame(t, 1, power=702.0, power_limit=700.0, throttle_reasons=0.0, gpu_temp=60.0))
    assert any(isinstance(f, Prediction) and f.active for f in found)
    for t in np.arange(300.0, 4000.0, 10.0):
        found += det.update(gpu_frame(t, 1, power=missing, power_limit=700.0, throttle_reasons=0.0,
                                      gpu_temp=40.0))
    last = [f for f in found if isinstance(f, Prediction)][-1]
    assert not last.active and last.ts <= 300.0 + det.params[pw.P_OFF_HOLD] + 10.0
    assert "no longer read" in last.reason


def test_a_prediction_held_at_the_cap_is_not_stood_down_by_a_missing_reading() -> None:
    """Capped (the bit set), a prediction has come true: a row without power does not withdraw it."""
    det = pw.PowerDetector(small_topology(nodes=1, gpus=1, racks=1))
    found = []
    for t in np.arange(0.0, 300.0, 10.0):
        found += det.update(gpu_frame(t, 1, power=702.0, power_limit=700.0, throttle_reasons=0.0, gpu_temp=60.0))
    for t in np.arange(300.0, 900.0, 10.0):
        found += det.update(gpu_frame(t, 1, power=np.nan, power_limit=700.0,
                                      throttle_reasons=float(facts.THROTTLE_SW_POWER_CAP), gpu_temp=60.0))
    preds = [f for f in found if isinstance(f, Prediction)]
    assert preds and all(f.active for f in preds)


def test_brakes_flickering_together_raise_one_node_event_and_one_anomaly_per_gpu() -> None:
    det = pw.PowerDetector(small_topology(nodes=1, gpus=4, racks=1))
    found = []
    for k, t in enumerate(np.arange(0.0, 900.0, 10.0)):
        bits = np.zeros(4)
        if 100 <= t < 700 and k % 2 == 0:
            bits[[0, 1]] = float(facts.THROTTLE_HW_POWER_BRAKE)
        found += det.update(gpu_frame(t, 4, power=600.0, power_limit=700.0, throttle_reasons=bits, gpu_temp=55.0))
    node = [f for f in found if isinstance(f, Anomaly) and f.entity_kind == "node"]
    gpu = [f for f in found if isinstance(f, Anomaly) and f.entity_kind == "gpu"]
    assert [f.ts for f in node] == [100.0]
    assert sorted((f.slot, f.ts) for f in gpu) == [(0, 100.0), (1, 100.0)]
    assert det.s_node_brake[0, pw.N_ACTIVE] == 0.0  # over a minute after the last brake: ended


def test_a_node_brake_a_minute_after_the_last_is_a_new_event() -> None:
    det = pw.PowerDetector(small_topology(nodes=1, gpus=4, racks=1))
    found = []
    for t in np.arange(0.0, 900.0, 10.0):
        bits = np.zeros(4)
        if 100 <= t < 200 or 300 <= t < 400:  # braking, 100 s with none, braking again
            bits[[0, 1]] = float(facts.THROTTLE_HW_POWER_BRAKE)
        found += det.update(gpu_frame(t, 4, power=600.0, power_limit=700.0, throttle_reasons=bits, gpu_temp=55.0))
    assert [f.ts for f in found if isinstance(f, Anomaly) and f.entity_kind == "node"] == [100.0, 300.0]
    assert len([f for f in found if isinstance(f, Anomaly) and f.entity_kind == "gpu"]) == 4


def test_a_state_saved_before_the_hold_columns_loads() -> None:
    topo = small_topology(nodes=1, gpus=4, racks=1)
    det = pw.PowerDetector(topo)
    state = as_layout1("power", det.state_dict())  # (as the code before 2026-12-06 kept it)
    old = {**state, "s_gpu": np.asarray(state["s_gpu"])[:, :L1_S_BRAKE_OFF_TS],
           "s_node_brake": np.asarray(state["s_node_brake"])[:, :pw.N_ZERO_TS]}
    fresh = pw.PowerDetector(topo)
    fresh.load_state_dict(old)
    assert np.isnan(fresh.s_gpu[:, pw.S_BRAKE_OFF_TS]).all() and np.isnan(fresh.s_node_brake[:, pw.N_ZERO_TS]).all()
