"""GPU telemetry alone (no rack inlet): the inlet a GPU reads is its rack's proxy, the median of its
nodes' coolest ``T - R_nominal * P``. A node sits ``(R - R_nominal) * P`` over the inlet, so on boards
over nominal R that median moved when the rack's *other* nodes started or stopped work with the coolant
unchanged, and both the thermal forecast and loop_warming read the step as the loop warming (or
cooling) (gpu_inputs.PROXY_STEP_C). Scenarios from the audit of 2026-12-05 (/tmp/audit_loopw)."""

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
DECAY = 1.0 - np.exp(-1.0)  # the dies' first-order step over a 10-s poll (a 10-s time constant)


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


def _neighbours_start(r_scale: float, inlet_at, until: float = 7200.0, nodes: int = 4, gpus: int = 8,
                      starts: float = 3600.0, probe: tuple[float, ...] = ()) -> tuple[dict[int, float], dict]:
    """Node 0 works at 700 W throughout; the rack's other nodes idle, then start a 700 W job at
    ``starts``; boards at ``r_scale`` x R_nominal, the coolant at ``inlet_at(t)``. The thermal
    detector's calls, and its rack proxy at the ``probe`` times."""
    topo = small_topology(nodes=nodes, gpus=gpus, racks=1)
    n, node = topo.size("gpu"), np.asarray(topo.gpu_node)
    r = r_scale * facts.THERMAL_RESISTANCE_C_PER_W
    det = ThermalDetector(topo)
    temp, hbm = np.full(n, inlet_at(0.0) + r * 78), np.full(n, inlet_at(0.0) + R_HBM * 78)
    called: dict[int, float] = {}
    seen = {}
    for k in range(1, int(until / 10.0)):
        t = k * 10.0
        busy = (node == node[0]) | (t >= starts)
        power = np.where(busy, 700.0, 78.0)
        temp += DECAY * (inlet_at(t) + r * power - temp)
        hbm += DECAY * (inlet_at(t) + R_HBM * power - hbm)
        assert temp.max() < 87.0  # none at its limit
        _throttle_calls(det, _frame(t, temp, hbm, power, busy), t, called)
        if t in probe:
            seen[t] = det.s_rack[0, gi.RACK_PROXY]
    return called, seen


def test_thermal_a_steady_node_is_not_called_when_its_rack_neighbours_start_work() -> None:
    """Boards at 1.45 x R_nominal (node 0's dies at 70.7 °C, 16 °C under their limit), coolant 24 °C
    throughout: no GPU is heading for its limit. The proxy stepped 13 °C on the neighbours' start
    and all 8 of node 0's GPUs were predicted to throttle."""
    called, seen = _neighbours_start(1.45, lambda t: 24.0, probe=(3500.0, 4000.0, 7000.0))
    assert called == {}, f"predicted to throttle: {called}"
    # the proxy went on where it stood: the coolant did not move
    assert abs(seen[4000.0] - seen[3500.0]) < 1.5 and abs(seen[7000.0] - seen[3500.0]) < 1.5


def test_the_proxy_follows_the_coolant_after_it_re_based() -> None:
    """After the re-base the proxy still moves with the loop: the coolant 3 °C warmer from 4,200 s
    reads as such (and the neighbours' start before it as nothing)."""
    _, seen = _neighbours_start(1.45, lambda t: 24.0 + min(3.0, max(0.0, t - 4200.0) / 60.0), until=5400.0,
                                nodes=4, gpus=2, probe=(3500.0, 4100.0, 5300.0))
    assert abs(seen[4100.0] - seen[3500.0]) < 1.5
    assert abs(seen[5300.0] - seen[4100.0] - 3.0) < 1.0


def test_the_proxy_follows_a_loop_warming_while_a_neighbour_starts_work() -> None:
    """A loop losing flow (+1 °C/min from 3,000 s) while the neighbours start work (3,300 s): the proxy
    rises by what the coolant does. The reverted re-base (2026-12-05) held a starting node's proxy
    where it last stood for 150 s, which hid as much of the warming (real losses missed on seeds 811
    and 831); unmended, the neighbours' start read as 13 °C more."""
    _, seen = _neighbours_start(1.45, lambda t: 24.0 + max(0.0, t - 3000.0) / 60.0, until=3800.0,
                                starts=3300.0, probe=(2900.0, 3700.0))
    assert abs(seen[3700.0] - seen[2900.0] - 700.0 / 60.0) < 1.5


def test_nominal_boards_keep_their_proxy_as_it_is() -> None:
    """On boards at nominal R a node's step on its own work is the spread of its coolest GPU, a degree
    or two: no excess is learnt and the rack's median is its nodes' proxies as they read (the same
    scenario as above at 1.0 x R_nominal)."""
    topo = small_topology(nodes=4, gpus=8, racks=1)
    n, node = topo.size("gpu"), np.asarray(topo.gpu_node)
    r = facts.THERMAL_RESISTANCE_C_PER_W * np.random.default_rng(5).normal(1.0, 0.03, n)
    det = ThermalDetector(topo)
    temp = np.full(n, 24.0) + r * 78
    hbm = np.full(n, 24.0 + R_HBM * 78)
    for k in range(1, 720):
        t = k * 10.0
        busy = (node == node[0]) | ((t >= 3600.0) & (t < 5400.0))
        power = np.where(busy, 700.0, 78.0)
        temp += DECAY * (24.0 + r * power - temp)
        hbm += DECAY * (24.0 + R_HBM * power - hbm)
        det.update(_frame(t, temp, hbm, power, busy))
    assert (np.nan_to_num(det.s_node[:, gi.NODE_EXCESS]) == 0.0).all()
    assert np.isfinite(det.s_node[:, gi.NODE_ANCHOR_AT]).all()  # every node's steps were read


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
        temp += DECAY * (inlet + r * power - temp)
        hbm += DECAY * (inlet + R_HBM * power - hbm)
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
            temp += DECAY * (inlet + r * power - temp)
            hbm += DECAY * (inlet + R_HBM * power - hbm)
            called: dict[int, float] = {}
            _throttle_calls(det, _frame(t, temp, hbm, power, busy), t, called)
            if 0 in called:
                return t - loss_at
        return np.inf

    working = first_call(None)
    assert 0.0 < working <= 5 * 60.0
    assert first_call(loss_at - 600.0) <= working + 30.0


def test_a_state_saved_before_the_re_base_loads_and_round_trips() -> None:
    """Racks and nodes saved before the re-base's columns (``RACK_MOVE``, ``NODE_PROXY_P`` on) load
    with them NaN (nothing learnt or seen yet) and go on; the state round-trips."""
    topo = small_topology(nodes=4, gpus=2, racks=1)
    n = topo.size("gpu")
    frames = [_frame(t, np.full(n, 40.0), np.full(n, 30.0), np.full(n, 300.0), np.ones(n, bool))
              for t in (10.0, 20.0, 30.0)]
    for cls in (ThermalDetector, LoopWarmingDetector):
        a = cls(topo)
        a.update(frames[0])
        old = a.state_dict()
        old["s_rack"] = old["s_rack"][:, :gi.RACK_MOVE]
        old["s_node"] = old["s_node"][:, :gi.NODE_PROXY_P]
        b = cls(topo)
        b.load_state_dict(old)
        assert b.s_node.shape == (4, gi.NODE_SIZE) and b.s_rack.shape == (1, gi.RACK_SIZE)
        assert np.isnan(b.s_node[:, gi.NODE_PROXY_P:]).all() and np.isnan(b.s_rack[:, gi.RACK_MOVE:]).all()
        for f in frames[1:]:
            a.update(f)
            b.update(f)
        c = cls(topo)
        c.load_state_dict(b.state_dict())
        for key, value in b.state_dict().items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(c.state_dict()[key], value)
        assert np.isfinite(b.s_node[:, gi.NODE_LAST_AT]).all()  # read on from the loaded state
