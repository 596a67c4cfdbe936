"""GPU telemetry alone (no rack inlet): the inlet a GPU reads is its rack's proxy, the median of its
nodes' coolest ``T - R_nominal * P``. A node sits ``(R - R_nominal) * P`` over the inlet, so that
median moved when the rack's *other* nodes started or stopped work with the coolant unchanged, and
both the thermal forecast and loop_warming read the step as the loop warming (or cooling)
(gpu_inputs.PROXY_REBASE_W). Scenarios from the audit of 2026-12-05 (/tmp/audit_loopw)."""

from __future__ import annotations

import numpy as np

from foreshock import facts
from foreshock.detectors import gpu_inputs as gi
from foreshock.detectors.loop_warming import LoopWarmingDetector
from foreshock.detectors.thermal import ThermalDetector
from foreshock.findings import Prediction
from foreshock.frames import Frame
from thermal_synth import small_topology

R_HBM = 0.027


def _frame(t: float, temp: np.ndarray, hbm: np.ndarray, power: np.ndarray, busy: np.ndarray) -> Frame:
    n = len(temp)
    return Frame("gpu", np.full(n, t), np.arange(n, dtype=np.int32),
                 {"gpu_temp": temp.round(0), "hbm_temp": hbm.round(0), "power": power, "util": busy * 1.0,
                  "max_op_temp": np.full(n, 87.0)})


def _throttle_calls(det: ThermalDetector | LoopWarmingDetector, frame: Frame, t: float,
                    called: dict[int, float]) -> None:
    for p in det.update(frame):
        if isinstance(p, Prediction) and p.active and p.event == "thermal_throttle":
            called.setdefault(p.slot, t)


def test_thermal_a_steady_node_is_not_called_when_its_rack_neighbours_start_work() -> None:
    """Node 0 works at 700 W throughout; the rack's 3 other nodes idle for an hour, then start a
    700 W job. Boards at 1.45 x R_nominal (the die 70.7 °C, 16 °C under its limit), coolant 24 °C
    throughout: no GPU is heading for its limit. The proxy stepped 13 °C on the neighbours' start
    and all 8 of node 0's GPUs were predicted to throttle."""
    topo = small_topology(nodes=4, gpus=8, racks=1)
    n, node = topo.size("gpu"), np.asarray(topo.gpu_node)
    r = 1.45 * facts.THERMAL_RESISTANCE_C_PER_W
    det = ThermalDetector(topo)
    temp, hbm = np.full(n, 24.0 + r * 78), np.full(n, 24.0 + R_HBM * 78)
    called: dict[int, float] = {}
    hottest = 0.0
    for k in range(1, 720):
        t = k * 10.0
        busy = (node == node[0]) | (t >= 3600.0)
        power = np.where(busy, 700.0, 78.0)
        a = 1.0 - np.exp(-1.0)
        temp += a * (24.0 + r * power - temp)
        hbm += a * (24.0 + R_HBM * power - hbm)
        hottest = max(hottest, float(temp.max()))
        _throttle_calls(det, _frame(t, temp, hbm, power, busy), t, called)
        if t == 3500.0:
            before = det.s_rack[0, gi.RACK_PROXY]
    assert hottest < 72.0
    assert called == {}, f"predicted to throttle: {called}"
    # the proxy went on where it stood: the coolant did not move
    assert abs(det.s_rack[0, gi.RACK_PROXY] - before) < 1.5


def _loop_warming_run(neighbours_start: bool, swing_c: float = 1.5) -> dict[int, float]:
    """Node 0's 2 GPUs work at 700 W; the rack's 2 other nodes work throughout, or idle for an hour
    and then start. Boards at 1.2 x R_nominal; at 4,200 s a benign coolant swing of ``swing_c``
    (1 °C/min), with nothing near its limit. The slots predicted to throttle and when."""
    topo = small_topology(nodes=3, gpus=2, racks=1)
    n, node = topo.size("gpu"), np.asarray(topo.gpu_node)
    r = 1.2 * facts.THERMAL_RESISTANCE_C_PER_W
    det = LoopWarmingDetector(topo)
    temp, hbm = np.full(n, 24.0 + r * 78), np.full(n, 24.0 + R_HBM * 78)
    called: dict[int, float] = {}
    for k in range(1, 600):
        t = k * 10.0
        inlet = 24.0 + min(swing_c, max(0.0, t - 4200.0) / 60.0)
        busy = (node == node[0]) | ((t >= 3600.0) if neighbours_start else True)
        power = np.where(busy, 700.0, 78.0)
        a = 1.0 - np.exp(-1.0)
        temp += a * (inlet + r * power - temp)
        hbm += a * (inlet + R_HBM * power - hbm)
        assert temp.max() < 87.0 - 20.0
        _throttle_calls(det, _frame(t, temp, hbm, power, busy), t, called)
    return called


def test_loop_warming_no_false_alarm_when_its_rack_neighbours_start_work() -> None:
    """The neighbours starting moved the proxy up ~6 °C; the benign swing 10 min later was then
    called a loop losing flow on node 0's GPUs."""
    assert _loop_warming_run(neighbours_start=False) == {}  # the control: neighbours busy all along
    assert _loop_warming_run(neighbours_start=True) == {}


def test_loop_warming_lead_kept_when_its_rack_neighbours_go_idle() -> None:
    """A real loss (+0.8 °C/min) 10 min after the rack's other nodes go idle is called as early as
    with them working (4 min in): the proxy stepped down on their idling, and the loss was called
    only once it had made that up (6 min of lead lost)."""
    topo = small_topology(nodes=3, gpus=2, racks=1)
    n, node = topo.size("gpu"), np.asarray(topo.gpu_node)
    r = 1.2 * facts.THERMAL_RESISTANCE_C_PER_W
    loss_at, rate = 5400.0, 0.8 / 60.0

    def first_call(idle_at: float | None) -> float:
        det = LoopWarmingDetector(topo)
        temp, hbm = np.full(n, 24.0 + r * 700), np.full(n, 24.0 + R_HBM * 700)
        for k in range(1, 720):
            t = k * 10.0
            inlet = 24.0 + max(0.0, t - loss_at) * rate
            busy = np.ones(n, bool)
            if idle_at is not None and t >= idle_at:
                busy[node != node[0]] = False
            power = np.where(busy, 700.0, 78.0)
            a = 1.0 - np.exp(-1.0)
            temp += a * (inlet + r * power - temp)
            hbm += a * (inlet + R_HBM * power - hbm)
            called: dict[int, float] = {}
            _throttle_calls(det, _frame(t, temp, hbm, power, busy), t, called)
            if 0 in called:
                return t - loss_at
        return np.inf

    working = first_call(None)
    assert 0.0 < working <= 5 * 60.0
    assert first_call(loss_at - 600.0) <= working + 30.0


def test_the_proxy_follows_the_coolant_after_it_re_based() -> None:
    """After the re-base the proxy still moves with the loop: the coolant 3 °C warmer reads as
    such on every node (thermal detector's inlet state)."""
    topo = small_topology(nodes=4, gpus=2, racks=1)
    n, node = topo.size("gpu"), np.asarray(topo.gpu_node)
    r = 1.45 * facts.THERMAL_RESISTANCE_C_PER_W
    det = ThermalDetector(topo)
    temp, hbm = np.full(n, 24.0 + r * 78), np.full(n, 24.0 + R_HBM * 78)
    seen = {}
    for k in range(1, 540):
        t = k * 10.0
        inlet = 24.0 + min(3.0, max(0.0, t - 4200.0) / 60.0)
        busy = (node == node[0]) | (t >= 3600.0)
        power = np.where(busy, 700.0, 78.0)
        a = 1.0 - np.exp(-1.0)
        temp += a * (inlet + r * power - temp)
        hbm += a * (inlet + R_HBM * power - hbm)
        det.update(_frame(t, temp, hbm, power, busy))
        if t in (4100.0, 5300.0):
            seen[t] = det.s_rack[0, gi.RACK_PROXY]
    assert abs(seen[5300.0] - seen[4100.0] - 3.0) < 1.0
