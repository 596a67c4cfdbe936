"""Faults: what each one does to the hidden physics, and random fault generation.

A fault has an id (``f1``, ``f2``, ...: scenario faults in onset order, then random ones as
they arrive), a type, a target entity, an onset and an optional duration (time to repair), and
parameters. While active it modifies the model's hidden inputs; ground truth attributes every
consequence to the fault that caused it, for ``AFTERMATH_S`` (15 min) after a repair too (a loop's
still-hot coolant, a GPU's own fault; a node's PSU or fans leave nothing behind once repaired).
Whatever the fault, a die that reaches 92 °C shuts down (XID 79, "thermal shutdown") and
stops its job until it has cooled and its cause is repaired.

| type | target | what it does (parameters, defaults) |
| --- | --- | --- |
| ``cooling_loss`` | loop | CDU flow ramps down to ``flow_fraction`` (0.08) over ``ramp_s`` (900 s: a failing pump or clogging filter); the loop's coolant, every rack inlet of the row, then GPU temperatures rise over minutes; throttling starts ~15 min after onset |
| ``tim_degradation`` | gpu | the GPU's die-to-coolant resistance grows by ``r_per_hour`` (0.6, relative) up to ``max_factor`` (2.6) |
| ``fan_failure`` | node | ``fans_failed`` (0.5) of the node's fans stop; its GPUs' resistance rises by ``r_increase`` (1.2, relative) over 60 s |
| ``psu_failure`` | node | HW power brake on every GPU of the node for ``brake_s`` (90 s), then the node's power limit is derated to ``derated_limit_w`` (500 W) until repair |
| ``optic_degradation`` | optic | received power falls by ``initial_db`` (3.0) plus ``db_per_hour`` (2.0): pre-FEC BER rises, symbol errors, flaps, link down, the traffic moves to the next rail's NIC (PXN) and congests those links on the node and its ring neighbours |
| ``hbm_overheat`` | gpu | HBM resistance grows by ``r_per_hour`` (2.0) up to ``max_factor`` (6.0); at its 95 °C limit for ``dbe_after_s`` (600 s) → ECC DBE + XID 48 (repeats every ``dbe_every_s``, 1800 s, while the GPU is up and its HBM still at the limit) |
| ``xid79`` | gpu | the GPU falls off the bus (XID 79): it reports nothing, its job stops until repair (``duration``, 1800 s); with ``SimParams.xid79_new_board`` (off by default) the repair is a board swap, as ``gpu_replacement``'s |
| ``gpu_replacement`` | gpu | the board is swapped (an RMA): the GPU is out of service for ``duration`` (3600 s; it reports nothing, its job stops), then returns on a new board — a new UUID (``board_id``), thermal resistances (core and HBM), leakage and dynamic power redrawn from the fleet's spread, counters from the new driver load; a ``tim_degradation``, ``hbm_overheat`` or ``xid79`` of the old board is cured (repaired at the swap: one on at the swap's scheduled time, begun before it; one begun at that time or after is the new board's). Ground truth: ``gpu_replaced`` at the return, with both UUIDs |

Random faults (``--random-faults``) arrive as a Poisson process at FACTS' rate of 6.5
failures per 1000 node-days (Meta, HPCA'25), **accelerated ×25** by default (``RANDOM_FAULT_ACCELERATION``; ``fault_acceleration`` /
``--fault-acceleration``, 1 = the real rate) so that a 6-hour, 1,024-GPU run sees several
(expected 128 nodes × 0.25 d × 6.5e-3 × 25 ≈ 5).
The mix follows Llama 3's unexpected interruptions (faulty GPU 148 → TIM degradation and
XID 79 half each, HBM 72, network/cable 35) plus the PSU, fan and cooling faults of the
InfiniteHBD trace (``RANDOM_FAULT_MIX``). A ``gpu_replacement`` is no failure but a repair,
drawn only where a scenario names one: it is not in the mix, so adding it changed no seed's
random faults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FAULT_TYPES: dict[str, str] = {
    "cooling_loss": "loop",
    "tim_degradation": "gpu",
    "fan_failure": "node",
    "psu_failure": "node",
    "optic_degradation": "optic",
    "hbm_overheat": "gpu",
    "xid79": "gpu",
    "gpu_replacement": "gpu",
}
"""Fault type -> the kind of entity it targets."""

DEFAULT_PARAMS: dict[str, dict[str, float]] = {
    "cooling_loss": {"flow_fraction": 0.08, "ramp_s": 900.0},
    "tim_degradation": {"r_per_hour": 0.6, "max_factor": 2.6},
    "fan_failure": {"fans_failed": 0.5, "r_increase": 1.2, "ramp_s": 60.0},
    "psu_failure": {"brake_s": 90.0, "derated_limit_w": 500.0},
    "optic_degradation": {"initial_db": 3.0, "db_per_hour": 2.0},
    "hbm_overheat": {"r_per_hour": 2.0, "max_factor": 6.0, "dbe_after_s": 600.0, "dbe_every_s": 1800.0},
    "xid79": {},
    "gpu_replacement": {},
}

DEFAULT_DURATION_S: dict[str, float | None] = {"xid79": 1800.0, "gpu_replacement": 3600.0}
"""Repair time when a scenario names none (None: lasts to the end of the run)."""

CURED_BY_NEW_BOARD = ("tim_degradation", "hbm_overheat", "xid79")
"""GPU faults of the board itself (its thermal interface, its HBM, its bus interface): a board
swapped in the slot ends them."""

FAILURES_PER_1000_NODE_DAYS = 6.5  # FACTS: Meta research clusters (HPCA'25)
RANDOM_FAULT_ACCELERATION = 25.0
RANDOM_FAULT_MIX: dict[str, float] = {
    "tim_degradation": 74.0,  # Llama 3: faulty GPU 148, split with XID 79
    "xid79": 74.0,
    "hbm_overheat": 72.0,  # Llama 3: HBM3 72
    "optic_degradation": 35.0,  # Llama 3: network switch/cable 35
    "psu_failure": 20.0,  # InfiniteHBD: PSU failure
    "fan_failure": 20.0,  # InfiniteHBD: fan speed critical
    "cooling_loss": 10.0,  # facility cooling: rare, row-wide
}


@dataclass
class Fault:
    id: str
    type: str
    target: int  # slot of the target (loop index for cooling_loss)
    target_name: str
    onset: float  # seconds after the start of the run
    duration: float | None = None
    params: dict[str, float] = field(default_factory=dict)
    # runtime
    started: bool = False
    ended: bool = False
    hbm_hot_s: float = 0.0
    next_dbe_s: float = 0.0
    dbe_count: int = 0

    @property
    def kind(self) -> str:
        return FAULT_TYPES[self.type]

    def p(self, name: str) -> float:
        return float(self.params.get(name, DEFAULT_PARAMS[self.type][name]))

    def active_at(self, elapsed: float) -> bool:
        end = np.inf if self.duration is None else self.onset + self.duration
        return self.onset <= elapsed < end

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "target": self.target_name, "onset_s": self.onset,
                "duration_s": self.duration, "params": {**DEFAULT_PARAMS[self.type], **self.params}}


def check_fault_type(name: str) -> str:
    key = name.replace("-", "_")
    if key not in FAULT_TYPES:
        raise ValueError(f"unknown fault type {name!r}; expected one of {sorted(FAULT_TYPES)}")
    return key


FRACTION = (0.0, 1.0, True)
AT_LEAST_0 = (0.0, math.inf, True)
ABOVE_0 = (0.0, math.inf, False)
AT_LEAST_1 = (1.0, math.inf, True)
PARAM_RANGES: dict[str, dict[str, tuple[float, float, bool]]] = {
    "cooling_loss": {"flow_fraction": FRACTION, "ramp_s": AT_LEAST_0},
    "tim_degradation": {"r_per_hour": AT_LEAST_0, "max_factor": AT_LEAST_1},
    "fan_failure": {"fans_failed": FRACTION, "r_increase": AT_LEAST_0, "ramp_s": AT_LEAST_0},
    "psu_failure": {"brake_s": AT_LEAST_0, "derated_limit_w": ABOVE_0},
    "optic_degradation": {"initial_db": AT_LEAST_0, "db_per_hour": AT_LEAST_0},
    "hbm_overheat": {"r_per_hour": AT_LEAST_0, "max_factor": AT_LEAST_1, "dbe_after_s": AT_LEAST_0,
                     "dbe_every_s": ABOVE_0},
    "xid79": {},
    "gpu_replacement": {},
}
"""Per fault type, each parameter's (low, high, low end allowed): a finite value inside. A flow or
fan fraction outside [0, 1] (or NaN, which compares false with everything the model does with
it) left the physics untouched while the ground truth recorded the fault; a resistance factor
under 1 would cool the GPU it is meant to heat; a DBE every 0 s repeats at every physics step."""


def check_params(fault_type: str, params: dict[str, Any]) -> dict[str, float]:
    """The scenario's parameters of a ``fault_type`` fault as floats; ``ValueError`` naming the
    parameter for an unknown one, a non-number, a NaN or infinity, or a value out of its range."""
    unknown = sorted(set(params) - set(DEFAULT_PARAMS[fault_type]))
    if unknown:
        raise ValueError(f"unknown parameters {unknown}; known: {sorted(DEFAULT_PARAMS[fault_type])}")
    checked: dict[str, float] = {}
    for name, raw in params.items():
        if isinstance(raw, bool):  # (YAML's true is no 1.0)
            raise ValueError(f"parameter {name} must be a number, got {raw!r}")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"parameter {name} must be a number, got {raw!r}") from None
        low, high, low_allowed = PARAM_RANGES[fault_type][name]
        inside = (low <= value if low_allowed else low < value) and value <= high
        if not (math.isfinite(value) and inside):
            bound = (f"within [{low:g}, {high:g}]" if math.isfinite(high)
                     else f"{'at least' if low_allowed else 'more than'} {low:g}")
            raise ValueError(f"parameter {name} must be a finite number {bound}, got {raw!r}")
        checked[name] = value
    return checked


def random_fault_rate_per_s(n_nodes: int, acceleration: float = RANDOM_FAULT_ACCELERATION) -> float:
    """Cluster-wide random fault rate (faults per simulated second)."""
    return FAILURES_PER_1000_NODE_DAYS / 1000.0 / 86400.0 * n_nodes * acceleration


def draw_random_params(fault_type: str, rng: np.random.Generator) -> tuple[dict[str, float], float | None]:
    """Severity and repair time of a random fault (varied so detectors see a range)."""
    if fault_type == "cooling_loss":
        return {"flow_fraction": float(rng.uniform(0.05, 0.2))}, float(rng.uniform(1800, 5400))
    if fault_type == "tim_degradation":
        return {"r_per_hour": float(rng.uniform(0.3, 1.2))}, None
    if fault_type == "fan_failure":
        return {"r_increase": float(rng.uniform(0.8, 1.5))}, float(rng.uniform(1800, 7200))
    if fault_type == "psu_failure":
        return {"brake_s": float(rng.uniform(30, 180))}, float(rng.uniform(1800, 7200))
    if fault_type == "optic_degradation":
        return {"initial_db": float(rng.uniform(0.5, 3.0)), "db_per_hour": float(rng.uniform(0.5, 3.0))}, None
    if fault_type == "hbm_overheat":
        return {"r_per_hour": float(rng.uniform(1.0, 3.0))}, None
    return {}, float(rng.uniform(1200, 3600))
