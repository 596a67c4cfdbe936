"""Findings of an audit of the thermal detector's reason texts (2026-12-05), each reproduced first.

A prediction's reason was worded after the whole frame was fitted, from the state as the frame's
END left it, not as the row it reports stood: a frame of several polls (replay and evaluate feed
windows; batching sources) got reasons that contradicted their own row's time — "held by the
thermal limiter for -10 min", a hold that ended later in the frame dropped from earlier rows,
"(no rack reading ...)" on rows before the rack went dark. Fed tick by tick and as one frame, the
same rows must give the same findings, reason text included. And a thermal_throttle raised on the
HBM's forecast was withdrawn worded as the core's ("core no longer heading for 87 °C").
"""

from __future__ import annotations

import math
import re

import numpy as np

from foreshock.detectors import thermal as th
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology

NEGATIVE_MINUTES = re.compile(r"for -\d+ min")


def _topology(jobs: bool) -> Topology:
    spec = {"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
            "nodes": [{"name": "n", "rack": "k", "gpus": 2}]}
    if jobs:
        spec["jobs"] = [{"name": "job0", "nodes": ["n"]}]
    return Topology.from_dict(spec)


def _feed(det: th.ThermalDetector, batch_from: float, end: float, gpu_cols, rack_until: float = math.inf):
    """Rack frames tick by tick (while ``t < rack_until``); GPU frames tick by tick before
    ``batch_from``, and from there on, where ``batch_from`` is finite, as one frame of all their
    polls (a replay window). Returns the thermal findings at or after ``batch_from`` (or all)."""
    found, pending = [], []
    for t in np.arange(0.0, end, 10.0):
        if t < rack_until:
            det.update(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
        cols = gpu_cols(t)
        if t >= batch_from:
            pending.append((t, cols))
            continue
        found += det.update(Frame("gpu", [t, t], [0, 1], cols))
    if pending:
        ts = np.repeat([p[0] for p in pending], 2)
        slots = np.tile([0, 1], len(pending))
        cols = {k: np.concatenate([np.asarray(p[1][k], float) for p in pending]) for k in pending[0][1]}
        found += det.update(Frame("gpu", ts, slots, cols))
    return [f for f in found if isinstance(f, Prediction) and f.detector == "thermal"]


def _key(f: Prediction) -> tuple:
    return (f.ts, f.slot, f.event, f.active, f.eta_s, f.confidence, f.reason)


def _after(found, t0: float) -> list:
    return [_key(f) for f in found if f.ts >= t0]


def _held(t: float) -> bool:
    """GPU 1 held by the SW thermal limiter from 300 s to 900 s, and again from 1100 s."""
    return 300.0 <= t < 900.0 or t >= 1100.0


def _pacer_cols(t: float) -> dict:
    """GPU 0 over its 87 °C limit (predicted, refreshed each minute); GPU 1 healthy, its job peer,
    held by the thermal limiter (throttle reasons 0x20) while ``_held``."""
    return dict(gpu_temp=[88.0, 54.0], hbm_temp=[42.0, 42.0], power=[640.0, 640.0], power_limit=[700.0] * 2,
                throttle_reasons=[0.0, 32.0 if _held(t) else 0.0], util=[1.0, 1.0])


def test_a_job_pacer_is_worded_as_of_its_rows_poll_in_a_frame_of_several_polls() -> None:
    single = _feed(th.ThermalDetector(_topology(jobs=True)), math.inf, 1300.0, _pacer_cols)
    batch = _feed(th.ThermalDetector(_topology(jobs=True)), 600.0, 1300.0, _pacer_cols)
    assert _after(batch, 600.0) == _after(single, 600.0)
    throttles = [f for f in batch if f.ts >= 600.0 and f.event == "thermal_throttle" and f.active]
    assert len(throttles) >= 8
    for f in throttles:
        assert not NEGATIVE_MINUTES.search(f.reason), f.reason
        paced = "is paced by n/gpu1" in f.reason
        assert paced == _held(f.ts), (f.ts, f.reason)  # the hold ending at 900 s: earlier rows still name it
        if paced:
            since = 300.0 if f.ts < 900.0 else 1100.0
            assert f"held by the thermal limiter for {(f.ts - since) / 60:.0f} min" in f.reason, f.reason


def test_a_job_pacer_held_by_a_peer_listed_after_it_in_the_poll_counts_as_fed_tick_by_tick() -> None:
    """Taken after the poll, not at the row: the peer's hold starting in the same poll counts."""
    def cols(t: float) -> dict:
        return {**_pacer_cols(t), "throttle_reasons": [0.0, 32.0 if t >= 960.0 else 0.0]}
    single = _feed(th.ThermalDetector(_topology(jobs=True)), math.inf, 1200.0, cols)
    batch = _feed(th.ThermalDetector(_topology(jobs=True)), 600.0, 1200.0, cols)
    assert _after(batch, 600.0) == _after(single, 600.0)
    assert any("held by the thermal limiter for 0 min" in f.reason for f in batch if f.ts == 960.0)


def test_the_inlet_source_is_worded_as_of_the_row_when_the_rack_goes_dark_mid_frame() -> None:
    def cols(t: float) -> dict:
        return dict(gpu_temp=[88.0, 54.0], hbm_temp=[42.0, 42.0], power=[640.0, 640.0], power_limit=[700.0] * 2,
                    util=[1.0, 1.0])
    single = _feed(th.ThermalDetector(_topology(jobs=False)), math.inf, 1200.0, cols, rack_until=600.0)
    batch = _feed(th.ThermalDetector(_topology(jobs=False)), 600.0, 1200.0, cols, rack_until=600.0)
    assert _after(batch, 600.0) == _after(single, 600.0)
    worded = [f for f in batch if f.ts >= 600.0 and f.active and f.slot == 0]
    estimated = ["no rack reading" in f.reason for f in worded]
    # the rack's inlet measured on the first rows of the window, estimated once it had gone stale
    assert estimated[0] is False and estimated[-1] is True and estimated == sorted(estimated)


def _hbm_run(det: th.ThermalDetector, start: float = 0.0, end: float = 4000.0) -> list:
    """The HBM's resistance jumps to 0.1 °C/W at 1200 s (its target 84 °C, over its own 82 °C
    max operating temperature, which is reported as 95 °C from 2400 s); the core sits at 54 °C."""
    inlet, power, tau_h = 24.0, 600.0, 80.0
    hbm, found = inlet + 0.028 * power, []
    for t in np.arange(0.0, end, 10.0):
        r_hbm = 0.028 if t < 1200 else 0.1
        hbm = inlet + r_hbm * power + (hbm - inlet - r_hbm * power) * math.exp(-10 / tau_h)
        if t < start:
            continue
        det.update(Frame("rack", [t], [0], {"inlet_temp": [inlet]}))
        found += det.update(Frame("gpu", [t], [0], {
            "gpu_temp": [54.0], "hbm_temp": [float(round(hbm))], "power": [power], "power_limit": [700.0],
            "hbm_max_op_temp": [82.0 if t < 2400 else 95.0], "util": [1.0]}))
    return [f for f in found if isinstance(f, Prediction)]


TOPO1 = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                            "nodes": [{"name": "n", "rack": "k", "gpus": 1}]})


def test_a_throttle_raised_on_the_hbm_forecast_is_withdrawn_worded_as_the_hbms() -> None:
    found = _hbm_run(th.ThermalDetector(TOPO1))
    throttle = [f for f in found if f.event == "thermal_throttle"]
    assert throttle and throttle[0].active and throttle[0].reason.startswith("HBM heading for its limit 82 °C")
    withdrawn = [f for f in throttle if not f.active]
    assert withdrawn, [f.reason for f in throttle]
    for f in withdrawn:
        assert f.reason.startswith("HBM no longer heading for 95 °C"), f.reason
        assert "core" not in f.reason


def test_the_model_that_raised_a_throttle_survives_a_checkpoint() -> None:
    det = th.ThermalDetector(TOPO1)
    before = _hbm_run(det, end=2000.0)
    assert any(f.event == "thermal_throttle" and f.active for f in before)
    restored = th.ThermalDetector(TOPO1)
    restored.load_state_dict(det.state_dict())
    after = [f for f in _hbm_run(restored, start=2000.0) if f.event == "thermal_throttle" and not f.active]
    assert after and all(f.reason.startswith("HBM no longer heading") for f in after), [f.reason for f in after]
