"""The thermal forecast's arithmetic against models solved by hand (an audit's findings, 2026-12-05).

Synthetic frames from a die that follows a first-order lag exactly (known R, tau and inlet), so
the ETA each case should give is known:

- the alarms' hysteresis: a prediction stands down only once the ETA is past
  ``horizon_s * clear_factor`` for ``off_hold_s``; until 2026-12-05 an ETA past the horizon read
  inf and counted as clear, and a GPU still heading for its limit ~2000-2700 s out was withdrawn
  ("no longer heading for 87 °C"), then raised again.
"""

from __future__ import annotations

import math

import numpy as np

from foreshock.detectors.thermal import ThermalDetector
from foreshock.frames import Frame
from foreshock.topology import Topology

T0 = 1.7e9


def topo(gpus: int) -> Topology:
    return Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": "n", "rack": "k", "gpus": gpus}]})


def test_a_prediction_whose_eta_moves_past_the_horizon_but_not_past_the_clear_eta_stands():
    """A failing interface (R rising 50 %/h from t = 1800 s) at 650 W is predicted; at t = 5300 s
    the job draws less. GPU 0 at 590 W: the die still reaches 87 °C at t ~ 7070 s, the ETA moves
    to 1850-2730 s (past the 1800-s horizon, about the 2700-s clear ETA only for a moment) and comes
    back: the prediction must stand, as one, until the die crosses. GPU 1 at 450 W: the ETA goes
    to ~5500 s, past the clear ETA for good: the prediction is withdrawn off_hold_s after."""
    tau, r0, inlet, onset, rate, dt = 30.0, 0.046, 40.0, 1800.0, 0.5, 10.0
    after = np.array([590.0, 450.0])

    def resistance(t: float) -> float:
        return r0 * (1.0 + rate * max(t - onset, 0.0) / 3600.0)

    def power(t: float) -> np.ndarray:
        return np.full(2, 650.0) if t < 5300.0 else after

    det = ThermalDetector(topo(2), tau_core_s=tau, leak_w_per_c=0.0)
    temp = inlet + resistance(0.0) * power(0.0)
    found: list[tuple[float, int, bool]] = []
    crossed = math.inf
    for t in np.arange(0.0, 8000.0, dt):
        ts = T0 + t
        det.update(Frame("rack", [ts], [0], {"inlet_temp": [inlet]}))
        out = det.update(Frame("gpu", [ts, ts], [0, 1], {
            "gpu_temp": list(temp), "power": list(power(t)), "power_limit": [700.0, 700.0],
            "util": [1.0, 1.0], "throttle_reasons": [0.0, 0.0]}))
        found += [(t, p.slot, p.active)
                  for p in out if p.event == "thermal_throttle"]
        if temp[0] >= 87.0 and crossed == math.inf:
            crossed = t
        target = inlet + resistance(t + dt) * power(t + dt)
        temp = target + (temp - target) * math.exp(-dt / tau)
    assert 6900.0 < crossed < 7300.0  # the scenario as stated
    gpu0 = [(t, active) for t, slot, active in found if slot == 0]
    gpu1 = [(t, active) for t, slot, active in found if slot == 1]
    raised0 = [t for t, active in gpu0 if active]
    assert raised0 and raised0[0] < 5300.0  # predicted before the job drew less
    withdrawn0 = [t for t, active in gpu0 if not active and t < crossed]
    assert not withdrawn0, f"GPU 0 withdrawn at {withdrawn0} while heading for 87 °C at t = {crossed:.0f} s"
    # hysteresis still lets go: GPU 1's ETA is far past horizon * clear_factor
    withdrawn1 = [t for t, active in gpu1 if not active]
    assert withdrawn1 and 5300.0 < withdrawn1[0] < 5300.0 + 300.0 + 200.0
