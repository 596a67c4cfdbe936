"""Telemetry as real sources report it: frames built from the hidden model state.

Realism applied here, not in the physics: temperatures are integer °C, power carries ±5 W of
noise (NVML's stated accuracy), clocks sit on 15 MHz bins, counters are integers (optionally
32-bit wrapping, see fabric.py), and a small share of samples is missing (a failed scrape:
the whole row is NaN). A GPU that fell off the bus reports NaN in every field except the XID
and its board (``board_id``: DCGM serves the XID of a GPU it lost under the UUID it knew it by).
Every column is a fresh array: consumers may keep frames while the simulation moves on.
"""

from __future__ import annotations

import numpy as np

from foreshock.frames import Frame

from .gpu_model import GpuModel
from .noise import NoisePool
from .params import SimParams


class Telemetry:
    def __init__(self, params: SimParams, rng: np.random.Generator, sizes: dict[str, int]) -> None:
        self.params = params
        self.rng = rng
        self.noise = NoisePool(rng)
        self.slots = {kind: np.arange(n, dtype=np.int32) for kind, n in sizes.items()}

    def frame(self, kind: str, ts: float, columns: dict[str, np.ndarray], missing: bool = True) -> Frame:
        slot = self.slots[kind]
        n = len(slot)
        if missing and self.params.missing_prob > 0 and n:
            k = int(self.rng.binomial(n, self.params.missing_prob))
            if k:
                rows = self.rng.integers(0, n, k)
                for col in columns.values():
                    col[rows] = np.nan
        return Frame(kind, np.full(n, ts), slot, columns)

    # ---- per kind ----------------------------------------------------------------------------
    def gpu_columns(self, gpu: GpuModel) -> dict[str, np.ndarray]:
        p, n = self.params, len(gpu.temp)
        noise = np.clip(self.noise.normal(n) * (p.power_noise_w / 2.0), -p.power_noise_w, p.power_noise_w)
        cols = {
            "gpu_temp": np.round(gpu.temp),
            "hbm_temp": np.round(gpu.hbm_temp),
            "slowdown_temp": np.full(n, p.hw_slowdown_c),
            "max_op_temp": np.full(n, p.max_operating_c),
            "hbm_max_op_temp": np.full(n, p.hbm_max_operating_c),
            "power": np.round(np.maximum(gpu.power + noise, 0.0), 2),
            "power_limit": gpu.power_limit.copy(),
            "energy": np.floor(gpu.energy * 1000.0) / 1000.0,
            "sm_clock": gpu.clock.copy(),
            "sm_clock_max": np.full(n, p.clock_max_hz),
            "util": np.round(gpu.util, 2),
            "throttle_reasons": gpu.reasons.astype(np.float64),
            "power_throttle_time": np.round(gpu.power_throttle_time, 6),
            "thermal_throttle_time": np.round(gpu.thermal_throttle_time, 6),
            "xid_last": gpu.xid_last.astype(np.float64),
            "ecc_dbe": gpu.ecc_dbe.astype(np.float64),
            "pcie_replays": gpu.pcie_replays.astype(np.float64),
            "remapped_rows": gpu.remapped_rows.astype(np.float64),
            "board_id": gpu.board_id.copy(),  # the board's UUID as a number, as a source reads it
        }
        dead = ~gpu.alive
        if dead.any():
            for name, col in cols.items():
                if name not in ("xid_last", "board_id"):
                    col[dead] = np.nan
        return cols
