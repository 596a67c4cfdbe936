"""Observed throttling: transitions of the NVML clock-event bitmask into a throttled state.

This is what today's tools report (after the fact). foreshock keeps it as a finding so the
incident engine and dashboards see throttles as they happen, and so predictions can be
checked against them in a replay.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from foreshock.facts import THROTTLE_BITS, THROTTLE_HW_POWER_BRAKE, THROTTLE_SW_POWER_CAP, THERMAL_THROTTLE_MASK
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.numba_config import jit
from foreshock.topology import Topology

from .base import Detector

WATCHED = THERMAL_THROTTLE_MASK | THROTTLE_SW_POWER_CAP | THROTTLE_HW_POWER_BRAKE


@jit
def _bit_onsets(slot: np.ndarray, mask: np.ndarray, last: np.ndarray, watched: int,
                out_row: np.ndarray, out_bits: np.ndarray) -> int:
    """Rows where a watched bit turns on that was off in the entity's previous sample."""
    n = 0
    for i in range(len(slot)):
        m = mask[i]
        if m != m:
            continue
        bits = int(m) & watched
        new = bits & ~int(last[slot[i]])
        if new != 0:
            out_row[n] = i
            out_bits[n] = new
            n += 1
        last[slot[i]] = bits
    return n


def describe_bits(bits: int) -> str:
    return "+".join(name for name, bit in THROTTLE_BITS.items() if bits & bit) or "none"


class ThrottleBitsDetector(Detector):
    name: ClassVar[str] = "throttle_bits"
    kinds: ClassVar[tuple[str, ...]] = ("gpu",)

    def __init__(self, topology: Topology, watched: int = WATCHED) -> None:
        super().__init__(topology)
        self.watched = int(watched)
        self.s_last = np.zeros(topology.size("gpu"))

    def update(self, frame: Frame) -> list[Finding]:
        if len(frame) == 0:
            return []
        rows = np.empty(len(frame), np.int64)
        bits = np.empty(len(frame), np.int64)
        n = _bit_onsets(frame.slot, frame.columns["throttle_reasons"], self.s_last, self.watched, rows, bits)
        return [
            Anomaly(ts=float(frame.ts[r]), entity_kind="gpu", slot=int(frame.slot[r]), field="throttle_reasons",
                    score=float(b), detector=self.name, reason=f"throttling observed: {describe_bits(int(b))}")
            for r, b in zip(rows[:n], bits[:n])
        ]
