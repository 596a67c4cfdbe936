"""Cooling loops (one CDU per row), rack inlets, node fans and power supplies.

A loop's coolant temperature relaxes (time constant ``tau_loop_s``) toward
``facility + diurnal + loop_rise · load / design_load / flow``: at design load and full flow
the coolant runs ``loop_rise_c`` above the facility water (24 °C with the defaults), and when
the CDU's flow drops (a cooling-loss fault) the rise grows as 1/flow, so every rack of that
row warms together over minutes. A rack's inlet is its loop's coolant plus a small fixed
offset for its position in the row.

Node fans follow the hottest GPU of the node; a failed fan reads 0 and the others run flat
out. A node reports its slowest fan.
"""

from __future__ import annotations

import math

import numpy as np

from foreshock.topology import Topology

from .params import SimParams

DAY_S = 86400.0


class CoolingModel:
    def __init__(self, topo: Topology, params: SimParams, rng: np.random.Generator, start_time: float,
                 day_offset_s: float = 0.0) -> None:
        self.params = params
        self.day_offset_s = day_offset_s  # added to the time before the hour of the diurnal swing is taken
        self.rack_loop = topo.rack_loop
        self.n_loops = len(topo.loops)
        self.node_rack = topo.node_rack
        self.gpu_node = topo.gpu_node
        n_racks, n_nodes = len(topo.racks), len(topo.nodes)
        gpus_per_loop = np.bincount(self.rack_loop[topo.gpu_rack], minlength=self.n_loops)
        nodes_per_loop = np.bincount(self.rack_loop[topo.node_rack], minlength=self.n_loops)
        self.design_w = gpus_per_loop * params.design_gpu_w + nodes_per_loop * params.design_node_w
        self.rack_offset = rng.uniform(0.0, 0.8, n_racks)
        self.flow = np.ones(self.n_loops)  # fraction of nominal CDU flow (faults lower it)
        self.load_w = self.design_w * 0.9
        self.coolant = self.target(start_time)
        self.fan_duty = np.full(n_nodes, 0.45)
        self.fan_health = np.ones(n_nodes)  # fraction of fans alive
        self.psu_power = np.zeros(n_nodes)
        self.rack_power = np.zeros(n_racks)

    def facility(self, t: float) -> float:
        """Facility water temperature: diurnal swing peaking at 15:00 UTC (of ``t`` shifted by
        ``day_offset_s``)."""
        p = self.params
        hour = ((t + self.day_offset_s) % DAY_S) / 3600.0
        return p.facility_temp_c + p.diurnal_amplitude_c * math.sin(2 * math.pi * (hour - 9.0) / 24.0)

    def target(self, t: float) -> np.ndarray:
        p = self.params
        rise = p.loop_rise_c * (self.load_w / np.maximum(self.design_w, 1.0)) / np.maximum(self.flow, 0.02)
        return self.facility(t) + np.minimum(rise, 70.0)

    def step(self, dt: float, t: float, gpu_power: np.ndarray, gpu_temp: np.ndarray) -> None:
        p = self.params
        n_nodes = len(self.fan_health)
        node_gpu_w = np.bincount(self.gpu_node, weights=gpu_power, minlength=n_nodes)
        hottest = np.full(n_nodes, -np.inf)
        np.maximum.at(hottest, self.gpu_node, gpu_temp)
        # fan controller: faster with the hottest GPU; failed fans push the rest to full speed
        duty = np.clip(0.30 + 0.02 * (hottest - 40.0), 0.30, 1.0)
        self.fan_duty = np.where(self.fan_health < 1.0, 1.0, duty)
        self.psu_power = node_gpu_w + p.node_base_w + p.fan_power_w * self.fan_duty ** 3
        self.rack_power = np.bincount(self.node_rack, weights=self.psu_power, minlength=len(self.rack_offset)).astype(np.float64)
        self.load_w = np.bincount(self.rack_loop, weights=self.rack_power, minlength=self.n_loops).astype(np.float64)
        a = 1.0 - math.exp(-dt / p.tau_loop_s)
        self.coolant += (self.target(t) - self.coolant) * a

    @property
    def rack_inlet(self) -> np.ndarray:
        return self.coolant[self.rack_loop] + self.rack_offset

    @property
    def rack_flow_lps(self) -> np.ndarray:
        return self.params.rack_flow_lps * self.flow[self.rack_loop]

    @property
    def fan_speed(self) -> np.ndarray:
        """The node's slowest fan, as a fraction of full speed: a dead fan reads 0 (the BMC's
        "fan speed critical"); the mean would hide it, since the live fans run flat out."""
        return np.where(self.fan_health < 1.0, 0.0, self.fan_duty)
