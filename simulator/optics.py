"""Optical transceivers (one at each link end) and the link state they cause.

The optic at end ``e`` of link ``l`` (slot ``2·l + e``) receives the light launched by its
partner (slot ``2·l + (1 - e)``):

    rx_power = partner tx_power − fibre/connector loss − degradation + slow drift + noise

The pre-FEC BER follows from the margin above the receiver's sensitivity (the RX power at
which BER reaches the FEC limit) through a Q-factor model,
``BER = Q(Q_s · 10^(margin/20))``: ≈ 1e-12 with 6 dB of margin, ≈ 1e-6 ("unclean") at ~2.7 dB,
rising steeply as the margin closes. Post-FEC symbol errors appear near the FEC limit and
grow as (BER / limit)^10. Past the limit the link flaps (down for 5–20 s, then retrains) at a
rate that grows tenfold per dB past it; after ``max_flaps`` flaps, or on loss of signal, it
stays down.

A degrading optic (fault) loses ``db_per_hour`` of received power and its laser bias creeps
up — the signs FACTS lists for real modules.
"""

from __future__ import annotations

import math

import numpy as np

from foreshock import facts
from foreshock.topology import Topology

from .noise import NoisePool
from .params import SimParams

_SQRT1_2 = 1.0 / math.sqrt(2.0)


def erfc(x: np.ndarray) -> np.ndarray:
    """Complementary error function with fractional error < 1.2e-7 everywhere (Numerical
    Recipes ``erfcc``): accurate in the far tail, where BERs of 1e-15 live."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886187 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    r = t * np.exp(poly)
    return np.where(x >= 0, r, 2.0 - r)


def q_function(q: np.ndarray) -> np.ndarray:
    """Tail probability of a standard normal: the BER of a receiver with Q factor ``q``."""
    return 0.5 * erfc(q * _SQRT1_2)


class OpticsModel:
    def __init__(self, topo: Topology, params: SimParams, rng: np.random.Generator) -> None:
        self.params = p = params
        self.rng = rng
        n_links = len(topo.links)
        self.noise = NoisePool(rng)
        n = 2 * n_links
        self.n = n
        self.partner = np.arange(n) ^ 1
        self.tx_power = p.tx_power_dbm + p.tx_power_spread_db * rng.standard_normal(n)
        self.tx_bias_a = rng.uniform(6.5, 8.5, n) * 1e-3
        self.module_temp_offset = rng.uniform(-3.0, 3.0, n)
        self.voltage = rng.normal(3.30, 0.015, n)
        link_loss = np.repeat(p.link_loss_db + p.link_loss_spread_db * rng.standard_normal(n_links), 2)
        self.loss = np.clip(link_loss + rng.uniform(0.0, 0.3, n), 0.3, None)
        self.drift = np.zeros(n)
        self.degradation_db = np.zeros(n)  # faults add to it
        self.rx_power = self.tx_power[self.partner] - self.loss
        self.ber = np.full(n, p.ber_floor)
        self.q_s = p.q_at_sensitivity
        rate = np.where(topo.link_gpu >= 0, facts.LINK_RATE_GPU_BPS, facts.LINK_RATE_UPLINK_BPS)
        self.line_bps = np.repeat(rate, 2) * p.line_bits_per_s_factor
        # cumulative counters (weeks of uptime already on them)
        self.rx_bits = self.line_bps * rng.uniform(1e5, 3e6, n)
        self.rx_corrected = np.floor(self.rx_bits * 1e-12)
        self.rx_symbol_errors = np.zeros(n)
        # link state, per link
        self.link_up = np.ones(n_links, dtype=bool)
        self.down_until = np.zeros(n_links)
        self.flaps = np.zeros(n_links, dtype=np.int64)
        self.disabled = np.zeros(n_links, dtype=bool)  # left down after too many flaps or LOS
        self.los = np.zeros(n, dtype=bool)
        # per-step increments the fabric adds to the link counters
        self.new_downs = np.zeros(n_links)
        self.new_recoveries = np.zeros(n_links)
        self.new_symbol_errors = np.zeros(n_links)

    @property
    def margin_db(self) -> np.ndarray:
        return self.rx_power - self.params.rx_sensitivity_dbm

    def step(self, dt: float, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Advance optics and link states; returns (links that went down, links that came up)."""
        p, rng = self.params, self.rng
        self.drift += p.rx_drift_db_per_sqrt_h * math.sqrt(dt / 3600.0) * self.noise.normal(self.n)
        noise = p.rx_noise_db * self.noise.normal(self.n)
        self.rx_power = self.tx_power[self.partner] - self.loss - self.degradation_db + self.drift + noise
        self.los = self.rx_power < p.los_dbm
        margin = self.rx_power - p.rx_sensitivity_dbm
        q = self.q_s * np.power(10.0, np.clip(margin, -30.0, 30.0) / 20.0)
        self.ber = np.clip(q_function(q), p.ber_floor, 0.5)
        # link level: the worse end decides
        ber_link = np.maximum(self.ber[0::2], self.ber[1::2])
        margin_link = np.minimum(margin[0::2], margin[1::2])
        los_link = self.los[0::2] | self.los[1::2]
        up_before = self.link_up.copy()
        # flaps past the FEC limit
        past = self.link_up & (ber_link > p.fec_limit_ber)
        went_down = los_link & self.link_up
        if past.any():
            idx = np.flatnonzero(past)
            rate = p.flap_rate_at_limit * np.power(p.flap_rate_per_db, np.clip(-margin_link[idx], 0.0, 6.0))
            hit = rng.random(len(idx)) < 1.0 - np.exp(-rate * dt)
            went_down[idx[hit]] = True
        self.new_downs = went_down.astype(np.float64)
        if went_down.any():
            idx = np.flatnonzero(went_down)
            self.link_up[idx] = False
            self.flaps[idx] += 1
            self.down_until[idx] = t + rng.uniform(*p.flap_down_s, len(idx))
            self.disabled[idx] |= (self.flaps[idx] >= p.max_flaps) | los_link[idx]
        # retrain after a flap, unless the port was left down
        retrain = ~self.link_up & ~self.disabled & (t >= self.down_until) & ~los_link & (margin_link > -1.0)
        self.link_up[retrain] = True
        # error recoveries and post-FEC symbol errors on live links
        near = self.link_up & (ber_link > 1e-5)
        self.new_recoveries = np.zeros_like(self.new_recoveries)
        if near.any():
            idx = np.flatnonzero(near)
            self.new_recoveries[idx] = rng.poisson(0.01 * (ber_link[idx] / p.fec_limit_ber) * dt)
        live_optic = np.repeat(self.link_up, 2)
        bits = np.where(live_optic, self.line_bps * dt, 0.0)
        self.rx_bits += bits
        self.rx_corrected += bits * self.ber  # expected value; reported floored
        post = 1e-15 * np.power(self.ber / p.fec_limit_ber, 10.0)
        expected = np.minimum(post, 1e-2) * bits / 10.0
        errors = np.zeros(self.n)
        busy = expected > 1e-9
        if busy.any():
            errors[busy] = rng.poisson(expected[busy])
        self.rx_symbol_errors += errors
        self.new_symbol_errors = errors[0::2] + errors[1::2]
        return np.flatnonzero(up_before & ~self.link_up), np.flatnonzero(~up_before & self.link_up)

    def module_readings(self, link_util: np.ndarray) -> dict[str, np.ndarray]:
        """DOM fields for every optic."""
        util = np.repeat(link_util, 2)
        n, z = self.n, self.noise.normal
        bias = self.tx_bias_a * (1.0 + 0.06 * self.degradation_db)  # ageing laser draws more bias
        # quantised like DOM registers: 1/256 °C, 0.1 mV, 2 µA, 0.01 dB; BER as a float32 ratio
        return {
            "module_temp": np.round((40.0 + self.module_temp_offset + 8.0 * util + 0.2 * z(n)) * 256) / 256,
            "module_voltage": np.round(self.voltage + 0.002 * z(n), 4),
            "tx_bias": np.round(bias * (1.0 + 0.005 * z(n)) * 5e5) / 5e5,
            "tx_power": np.round(self.tx_power + 0.03 * z(n), 2),
            "rx_power": np.round(self.rx_power, 2),
            "rx_bits": np.floor(self.rx_bits),
            "rx_corrected_bits": np.floor(self.rx_corrected),
            "rx_symbol_errors": self.rx_symbol_errors.copy(),
            "prefec_ber": np.where(self.los, np.nan, self.ber.astype(np.float32).astype(np.float64)),
            "los": self.los.astype(np.float64),
        }
