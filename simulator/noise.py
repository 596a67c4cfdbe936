"""Cheap, seeded measurement noise for large arrays.

Drawing fresh normals for every optic and GPU every second costs more than the physics at
16k GPUs. A pool of standard normals is drawn once from the run's seed; each request returns
a window of it at a random offset (read-only view, no allocation). Values within a window are
independent, and two requests use unrelated windows, which is all measurement noise needs.
"""

from __future__ import annotations

import numpy as np

POOL_SIZE = 1 << 20


class NoisePool:
    def __init__(self, rng: np.random.Generator, size: int = POOL_SIZE) -> None:
        self.rng = rng
        self.pool = rng.standard_normal(size)
        self.pool.flags.writeable = False

    def normal(self, n: int) -> np.ndarray:
        """``n`` standard normals (a read-only view; do not write to it)."""
        if n > len(self.pool) // 2:
            return self.rng.standard_normal(n)
        start = int(self.rng.integers(0, len(self.pool) - n))
        return self.pool[start:start + n]
