"""Findings of a second audit of the cooling detector (2026-12-05), each reproduced first:

- a loaded GPU's flag dropped at the first comparison that could not compare it (its temperature
  unread for ten minutes, or its node idle between two jobs), though nothing showed it healthy: the
  GPU went silent for 1,200 s, past the incident engine's quiet_s (900 s), and a still-degrading
  GPU's incident was told resolved and reopened;
- the idle comparison corrected every GPU with the nominal resistance: a healthy air-cooled H100
  (R 0.065) at light load (190 W) against idle node-mates at 78 W was flagged "thermal interface
  degrading", a whole such node "node fans or airflow";
- a node's stopped-fan flag was held for good once its BMC went dark, its one reading of 0 %
  said again every refresh_s for hours;
- on one-GPU nodes (GH200-style) a failing GPU interface was said "node fans or airflow" (with
  four racks of one such node, that alone).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from foreshock.detectors.cooling import CoolingDetector
from foreshock.detectors.incidents import IncidentEngine
from foreshock.findings import Anomaly
from foreshock.frames import Frame
from foreshock.topology import Topology

R0 = 0.046 * (1 + 0.03 * np.random.default_rng(0).standard_normal(1000))
QUIET_S = 900.0  # the incident engine's default quiet_s: a flag silent longer reads as resolved


def topo(racks: int = 2, nodes_per_rack: int = 4, gpus: int = 8) -> Topology:
    return Topology.from_dict({
        "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
        "racks": [{"name": f"rack{r}", "row": "row0"} for r in range(racks)],
        "nodes": [{"name": f"n{r}_{i}", "rack": f"rack{r}", "gpus": gpus}
                  for r in range(racks) for i in range(nodes_per_rack)]})


def frames(tp: Topology, r_of: Callable[[float], np.ndarray], power_of: Callable[[float], np.ndarray],
           hours: float, inlet: float = 24.0, dt: float = 30.0, tau: float | None = None,
           blank: Callable[[float], np.ndarray] | None = None) -> Iterator[Frame]:
    """Rack and GPU frames every ``dt``: each die at the inlet plus R x P (relaxing with ``tau``
    where given), whole °C readings; ``blank(t)``: the GPUs whose temperature reads NaN at ``t``."""
    rng = np.random.default_rng(0)
    n, racks = tp.size("gpu"), tp.size("rack")
    temp = None
    for t in np.arange(0.0, hours * 3600, dt):
        p = power_of(t) + 5 * rng.standard_normal(n)
        target = inlet + r_of(t) * p
        temp = target if temp is None or tau is None else target + (temp - target) * np.exp(-dt / tau)
        yield Frame("rack", np.full(racks, t), np.arange(racks), {"inlet_temp": np.full(racks, inlet)})
        reading = np.round(temp)
        if blank is not None:
            reading = np.where(blank(t), np.nan, reading)
        yield Frame("gpu", np.full(n, t), np.arange(n), {"gpu_temp": reading, "power": p,
                                                          "power_limit": np.full(n, 700.0)})


def degrading_gpu3(n: int) -> Callable[[float], np.ndarray]:
    """GPU 3's interface degrades, +40 % per hour from the second hour, and stays degraded."""
    def r_of(t: float) -> np.ndarray:
        r = R0[:n].copy()
        r[3] *= 1 + 0.4 * max(0.0, t - 7200) / 3600
        return r
    return r_of


def run(tp: Topology, fs: Iterator[Frame], engine: IncidentEngine | None = None
        ) -> tuple[list[Anomaly], list[Any]]:
    det, found, changes = CoolingDetector(tp), [], []
    for f in fs:
        out = det.update(f)
        found += out
        if engine is not None and f.kind == "gpu":
            changes += engine.observe(out, float(f.ts[0]))
    return found, changes


def said(found: list[Anomaly], kind: str, slot: int) -> list[float]:
    return [f.ts for f in found if f.entity_kind == kind and f.slot == slot]


# ---- 1. a loaded GPU's flag through a comparison it could not make ------------------------------

def test_a_loaded_gpus_flag_holds_through_ten_minutes_of_unread_temperature() -> None:
    tp = topo()
    n = tp.size("gpu")
    # GPU 3's temperature reads NaN from 4 h for 600 s (a few scrapes lost), its power still read
    blank = lambda t: (np.arange(n) == 3) & (14400 <= t < 15000)  # noqa: E731
    found, changes = run(tp, frames(tp, degrading_gpu3(n), lambda t: np.full(n, 640.0), 6.0, blank=blank),
                         IncidentEngine(tp))
    ts = said(found, "gpu", 3)
    assert ts and ts[0] < 14400 and ts[-1] > 20000
    # said on through the gap: never silent as long as the incident engine's quiet_s (it was 1,200 s)
    assert max(np.diff(ts)) < QUIET_S
    assert any(14400 < t < 15300 for t in ts)  # said during the gap itself, its last score again
    held = [f for f in found if f.entity_kind == "gpu" and f.slot == 3 and 14400 < f.ts < 15300]
    assert held and all("not compared" in f.reason and f.score > 0.1 for f in held)
    # ... so its incident is never told resolved (it was, and reopened "growing" 300 s later)
    assert changes and not [c for c in changes if getattr(c, "state", "") == "resolved"]
    assert {f.slot for f in found if f.entity_kind == "gpu"} == {3}  # nothing else flagged


def test_a_loaded_gpus_flag_holds_while_its_node_idles_between_two_jobs() -> None:
    tp = topo()
    n = tp.size("gpu")

    def power_of(t: float) -> np.ndarray:  # node 0's job restarts at 4 h: 600 s at idle power
        p = np.full(n, 640.0)
        if 14400 <= t < 15000:
            p[tp.gpu_node == 0] = 78.0
        return p
    found, changes = run(tp, frames(tp, degrading_gpu3(n), power_of, 6.0, tau=25.0), IncidentEngine(tp))
    ts = said(found, "gpu", 3)
    assert ts and ts[0] < 14400 and ts[-1] > 20000
    assert max(np.diff(ts)) < QUIET_S
    assert changes and not [c for c in changes if getattr(c, "state", "") == "resolved"]


def test_a_loaded_gpus_flag_held_without_a_reading_ends_after_two_comparisons() -> None:
    tp = topo()
    n = tp.size("gpu")
    # GPU 3's temperature dark for an hour from 4 h: no longer known hot after UNREAD_HOLD (two)
    # comparisons; said again once it is read again
    blank = lambda t: (np.arange(n) == 3) & (14400 <= t < 18000)  # noqa: E731
    found, _ = run(tp, frames(tp, degrading_gpu3(n), lambda t: np.full(n, 640.0), 6.0, blank=blank))
    ts = np.array(said(found, "gpu", 3))
    assert not ((ts > 15000 + 1) & (ts < 18000)).any()  # held through 14700 and 15000 at most
    assert (ts >= 18000).any()


# ---- 2. the idle comparison at light load -------------------------------------------------------

def _light_load(gpus_at_190: np.ndarray, r: float) -> list[Anomaly]:
    """A cluster idling at 78 W whose boards run at ``r`` °C/W (air-cooled H100s run hotter: a
    higher resistance, FACTS.md), healthy; from 3 h the GPUs ``gpus_at_190`` serve light inference
    at 190 W (under the fit's 200 W load_min: still "idle")."""
    tp = topo()
    n = tp.size("gpu")
    rr = r * R0[:n] / 0.046

    def power_of(t: float) -> np.ndarray:
        p = np.full(n, 78.0)
        if t >= 3 * 3600:
            p[gpus_at_190] = 190.0
        return p
    found, _ = run(tp, frames(tp, lambda t: rr, power_of, 5.0, inlet=25.0, tau=25.0))
    return found


def test_a_healthy_gpu_at_light_load_is_not_compared_with_idle_mates_at_78_w() -> None:
    for r in (0.055, 0.065):  # flagged twice and twelve times, "thermal interface degrading"
        assert _light_load(np.array([0]), r) == []


def test_a_healthy_node_at_light_load_is_not_compared_with_idle_nodes_at_78_w() -> None:
    # a whole node at 190 W, R 0.07: "node fans or airflow" ten times
    assert _light_load(np.arange(8), 0.07) == []


def test_an_idle_gpu_running_hot_against_mates_at_its_power_is_still_flagged() -> None:
    # the recall kept: a failing interface at idle, R x2 on GPU 5, every GPU at 78 W
    tp = topo()
    n = tp.size("gpu")
    rr = R0[:n].copy()
    rr[5] *= 2.0
    found, _ = run(tp, frames(tp, lambda t: rr, lambda t: np.full(n, 78.0), 3.0, tau=25.0))
    assert {(f.entity_kind, f.slot) for f in found} == {("gpu", 5)}
    assert "idle" in found[0].reason and "same power" in found[0].reason


# ---- 3. a stopped fan on a node no longer read --------------------------------------------------

def _fan_run(frames_of: Callable[[float], Frame]) -> list[Anomaly]:
    det, out = CoolingDetector(topo(racks=1)), []
    for t in np.arange(0, 6 * 3600, 60.0):
        out += det.update(frames_of(t))
    return out


def test_a_stopped_fan_is_not_said_for_hours_after_its_node_goes_dark() -> None:
    def dark(t: float) -> Frame:  # node 0 reads 0 % at t=60, then its BMC answers nothing
        if t <= 60:
            return Frame("node", np.full(4, t), np.arange(4), {"fan_speed": np.array([0.6 if t == 0 else 0.0,
                                                                                     .6, .6, .6])})
        return Frame("node", np.full(3, t), np.arange(1, 4), {"fan_speed": np.full(3, 0.6)})

    def nan_rows(t: float) -> Frame:  # ... or answers with no fan reading
        sp = np.full(4, 0.6)
        sp[0] = 0.6 if t == 0 else 0.0 if t == 60 else np.nan
        return Frame("node", np.full(4, t), np.arange(4), {"fan_speed": sp})
    for fs in (dark, nan_rows):
        out = _fan_run(fs)
        assert out and out[0].ts == 60 and {f.slot for f in out} == {0}
        # said while its last reading is at most two peer intervals (600 s) old; it was 36 times
        # over 6 h, up to t=21060
        assert max(f.ts for f in out) <= 60 + 600 and len(out) <= 2


def test_a_stopped_fan_is_held_through_one_missing_reading() -> None:
    def one_gap(t: float) -> Frame:  # 0 % from t=60; one NaN reading at t=120, then 0 % again
        sp = np.full(4, 0.6)
        sp[0] = 0.6 if t == 0 else np.nan if t == 120 else 0.0
        return Frame("node", np.full(4, t), np.arange(4), {"fan_speed": sp})
    out = _fan_run(one_gap)
    ts = [f.ts for f in out]
    # raised once at 60 and refreshed every refresh_s (600 s): no drop and rise again at 180
    assert ts[:3] == [60.0, 660.0, 1260.0]


# ---- 4. one-GPU nodes ---------------------------------------------------------------------------

def test_a_failing_interface_on_a_one_gpu_node_is_said_of_the_gpu_naming_both_causes() -> None:
    for tp in (topo(racks=1, nodes_per_rack=8, gpus=1), topo(racks=4, nodes_per_rack=1, gpus=1)):
        n = tp.size("gpu")

        def r_of(t: float) -> np.ndarray:  # GPU 0's interface: +40 % per hour from 2 h
            r = R0[:n].copy()
            r[0] *= 1 + 0.4 * max(0.0, t - 7200) / 3600
            return r
        found, _ = run(tp, frames(tp, r_of, lambda t: np.full(n, 640.0), 5.0))
        # no node finding ("node fans or airflow" against its GPU's own "thermal interface")
        assert found and {(f.entity_kind, f.slot) for f in found} == {("gpu", 0)}
        # ... and the GPU's reason names both: one GPU cannot tell its interface from its node's fans
        assert all("interface" in f.reason and "fans" in f.reason for f in found)
        assert found[0].ts < 9000  # as early as the node rule had it (t=8400)


def test_the_node_rule_still_speaks_for_a_node_of_eight_gpus() -> None:
    # a node's fans on 8-GPU nodes, one loop of 2 racks x 4 nodes: node 1's GPUs all x1.8
    tp = topo()
    n = tp.size("gpu")

    def r_of(t: float) -> np.ndarray:
        r = R0[:n].copy()
        r[tp.gpu_node == 1] *= 1 + 0.8 * min(1.0, max(0.0, t - 7200) / 3600)
        return r
    found, _ = run(tp, frames(tp, r_of, lambda t: np.full(n, 640.0), 5.0))
    assert [f for f in found if f.entity_kind == "node" and f.slot == 1 and "node fans" in f.reason]


# ---- state saved before these columns ----------------------------------------------------------

def test_a_state_saved_before_the_held_flags_loads() -> None:
    tp = topo()
    old = CoolingDetector(tp).state_dict()
    old["s_idle"] = np.zeros((tp.size("gpu"), 7))  # the old float64 layout: base, seen, run, hot, inlet, score, unread
    old["s_idle"][:, [0, 4, 5]] = np.nan
    del old["s_idle_count"]
    old["s_fan_flag"] = np.full(tp.size("node"), np.nan)
    old["s_fan_flag"][2] = 60.0
    del old["s_fan_ts"]
    det = CoolingDetector(tp)
    det.load_state_dict(old)
    assert det.s_idle.shape == (tp.size("gpu"), 5) and det.s_idle_count.shape == (tp.size("gpu"), 4)
    assert det.s_fan_ts[2] == 60.0 and np.isnan(det.s_fan_ts[[0, 1, 3]]).all()
