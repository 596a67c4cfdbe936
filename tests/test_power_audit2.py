"""Findings of a second audit of the power detector (2026-12-05), each reproduced first:

- a GPU braking with its node (a failed supply) under ``load_min_w`` counts as idle since the brake
  (its loaded-sample count back to 0), and the cap prediction made for it ("when the brake lifts,
  the power cap holds this GPU") went out active with confidence 0.0, though it had drawn 640 W for
  five minutes before;
- whether "N of M GPUs braking together" was raised depends on the order of a frame's rows: a frame
  holding two polls listed by GPU, not by time, is cut into runs that mix the polls, and a node
  event no poll showed was raised (the runs are the shared fit's: it now takes a frame's rows in time order).
"""

from __future__ import annotations

import numpy as np

from foreshock import facts
from foreshock.detectors import power as pw
from foreshock.findings import Anomaly, Finding, Prediction
from foreshock.frames import Frame
from test_state_budget_thermal import L1_S_CONF_PRE, as_layout1
from thermal_synth import small_topology

BRAKE = float(facts.THROTTLE_HW_POWER_BRAKE)


def poll(det: pw.PowerDetector, ts: list[float], gpus: list[int], bits: list[float], power: float) -> list[Finding]:
    n = len(gpus)
    return det.update(Frame("gpu", np.asarray(ts, dtype=float), np.asarray(gpus), {
        "power": np.full(n, power), "power_limit": np.full(n, 700.0), "gpu_temp": np.full(n, 55.0),
        "throttle_reasons": np.asarray(bits, dtype=float)}))


def node_brake_predictions(braked_w: float) -> list[Prediction]:
    """Two GPUs of a 4-GPU node loaded at 640 W for 5 min, then braking together at ``braked_w``."""
    det = pw.PowerDetector(small_topology(nodes=2, gpus=4, racks=1))
    for t in range(0, 300, 5):
        poll(det, [float(t)] * 8, list(range(8)), [0.0] * 8, 640.0)
    found: list[Finding] = []
    for t in range(300, 420, 5):
        found += poll(det, [float(t)] * 8, list(range(8)), [BRAKE, BRAKE] + [0.0] * 6, braked_w)
    return [f for f in found if isinstance(f, Prediction) and f.active]


def test_a_node_brake_prediction_keeps_the_confidence_the_gpu_had_before_the_brake() -> None:
    # braked to 270 W it still counts as loaded (confidence 1 before too); braked to 150 W it counts
    # as idle since the brake, and went out with confidence 0
    for braked_w in (270.0, 150.0):
        preds = node_brake_predictions(braked_w)
        assert sorted(f.slot for f in preds[:2]) == [0, 1] and all(f.eta_s == 60.0 for f in preds)
        assert all(f.confidence == 1.0 for f in preds), (braked_w, [(f.ts, f.slot, f.confidence) for f in preds])


def test_a_state_saved_before_the_confidence_column_loads_and_round_trips() -> None:
    topo = small_topology(nodes=2, gpus=4, racks=1)
    det = pw.PowerDetector(topo)
    for t in range(0, 300, 5):
        poll(det, [float(t)] * 8, list(range(8)), [0.0] * 8, 640.0)
    poll(det, [300.0] * 8, list(range(8)), [BRAKE, BRAKE] + [0.0] * 6, 150.0)
    state = det.state_dict()
    assert np.asarray(state["s_gpu"]).shape[1] == pw.S_SIZE
    again = pw.PowerDetector(topo)
    again.load_state_dict(state)
    np.testing.assert_array_equal(again.s_gpu, det.s_gpu)
    old = pw.PowerDetector(topo)
    layout1 = as_layout1("power", state)  # (as the code before 2026-12-06 kept it)
    old.load_state_dict({**layout1, "s_gpu": np.asarray(layout1["s_gpu"])[:, :L1_S_CONF_PRE]})
    assert old.s_gpu.shape == det.s_gpu.shape and np.isnan(old.s_gpu[:, [pw.S_CONF_PRE, pw.S_T_EST]]).all()
    # a brake held in an old state: the confidence of the samples counted since stands
    found = poll(old, [305.0] * 8, list(range(8)), [BRAKE, BRAKE] + [0.0] * 6, 150.0)
    assert not [f for f in found if isinstance(f, Prediction) and f.confidence != 0.0]


def node_events_of_two_polls(order: list[int]) -> list[tuple[float, int]]:
    """GPU1 brakes at 100 s only, GPU0 at 105 s only: one frame holding both polls, its rows in
    ``order`` (indices into the four time-ordered rows; each GPU's own rows in time order, as the
    input guard keeps them). No poll shows two GPUs braking."""
    det = pw.PowerDetector(small_topology(nodes=2, gpus=4, racks=1))
    for t in range(0, 100, 5):
        poll(det, [float(t)] * 8, list(range(8)), [0.0] * 8, 640.0)
    ts, gpus, bits = [100.0, 100.0, 105.0, 105.0], [0, 1, 0, 1], [0.0, BRAKE, BRAKE, 0.0]
    found = poll(det, [ts[k] for k in order], [gpus[k] for k in order], [bits[k] for k in order], 640.0)
    assert sorted((f.ts, f.slot) for f in found if isinstance(f, Anomaly) and f.entity_kind == "gpu") \
        == [(100.0, 1), (105.0, 0)]
    return [(f.ts, f.slot) for f in found if isinstance(f, Anomaly) and f.entity_kind == "node"]


def test_gpus_braking_in_different_polls_of_one_frame_listed_by_gpu_are_no_node_event() -> None:
    """Listed by GPU (GPU0 at 100 and 105 s, then GPU1 at 100 and 105 s), the fit cut runs GPU0@100 |
    GPU0@105 GPU1@100 | GPU1@105: the middle "poll" holds GPU0 braking at 105 s and GPU1 at 100 s."""
    assert node_events_of_two_polls([0, 2, 1, 3]) == []


def warming_gpu(rise_c_per_min: float = 0.5, onset: float = 1800.0, dur: float = 2600.0, dt: float = 10.0):
    """A GPU heated by its rack's inlet ramping from ``onset``; its power static + leakage (doubling
    every 25 °C) + dynamic, the die read in whole degrees as NVML and DCGM report it. Yields
    (t, inlet, reading, power, capped)."""
    temp, r_c_per_w, tau = 50.0, 0.046, 10.0
    for t in np.arange(0.0, dur, dt):
        inlet = 24.0 + rise_c_per_min / 60.0 * max(0.0, t - onset)
        demand = 37.0 + 80.0 * 2.0 ** ((temp - 52.0) / 25.0) + 560.0
        power = min(demand, 700.0)
        target = inlet + r_c_per_w * power
        temp = target + (temp - target) * np.exp(-dt / tau)
        yield float(t), inlet, float(round(temp)), power, demand >= 700.0


def test_the_cap_eta_does_not_jump_up_when_the_whole_degree_reading_ticks() -> None:
    """Warming 0.5 °C/min, the die's reading ticks a degree every ~2 min. The leakage forecast started
    from the reading: its rise restarted at each tick while the envelope already held the leakage of
    the fraction, and the ETA rose 168 s in one 10-s step, 70 s before the cap."""
    det = pw.PowerDetector(small_topology(nodes=1, gpus=1, racks=1))
    etas = []
    for t, inlet, reading, power, capped in warming_gpu():
        one = np.array([t]), np.array([0])
        det.update(Frame("rack", *one, {"inlet_temp": np.array([round(inlet, 1)])}))
        cols = {"gpu_temp": reading, "power": power, "power_limit": 700.0, "throttle_reasons": 4.0 if capped else 0.0}
        det.update(Frame("gpu", *one, {k: np.array([v]) for k, v in cols.items()}))
        if capped:
            break
        etas.append(float(det.s_gpu[0, pw.S_ETA]))
    tail = np.array(etas[-15:])  # the last 150 s before the cap
    tail = tail[np.isfinite(tail)]
    assert len(tail) >= 10 and tail[-1] < 90.0, tail
    assert np.diff(tail).max() < 30.0, tail
