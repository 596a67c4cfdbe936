"""Observed throttling: transitions of the NVML clock-event bitmask into a throttled state.

This is what today's tools report (after the fact). foreshock keeps it as a finding so the
incident engine and dashboards see throttles as they happen, and so predictions can be
checked against them in a replay.
"""

from __future__ import annotations

from typing import ClassVar, Mapping

import numpy as np

from foreshock.facts import THROTTLE_BITS, THROTTLE_HW_POWER_BRAKE, THROTTLE_SW_POWER_CAP, THERMAL_THROTTLE_MASK
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.numba_config import jit
from foreshock.topology import Topology

from .base import Detector
from .gpu_inputs import reason_bits

WATCHED = THERMAL_THROTTLE_MASK | THROTTLE_SW_POWER_CAP | THROTTLE_HW_POWER_BRAKE
HELD = THERMAL_THROTTLE_MASK | THROTTLE_HW_POWER_BRAKE
"""Bits re-reported while they stay set: a thermal throttle or a power brake that lasts is still
news to the incident engine (it keeps the incident open); the SW power cap bit comes and goes
with every training step and is not."""
REFRESH_S = 300.0
WATCHED_LIMIT = 2 ** 24
"""Watched bits stay below it: ``s_last`` keeps each GPU's last watched bits in a float32, which holds
every whole number below 2**24 exactly (the bits NVML defines today end at 0x100)."""


@jit
def _bit_onsets(ts: np.ndarray, slot: np.ndarray, mask: np.ndarray, last: np.ndarray, reported: np.ndarray,
                watched: int, held: int, refresh_s: float, out_row: np.ndarray, out_bits: np.ndarray,
                out_continuing: np.ndarray) -> int:
    """Rows where a watched bit turns on that was off in the entity's previous sample, and rows
    where held bits stay set ``refresh_s`` after they were last reported (an onset of a held bit
    reports it; the onset of another, the power cap's, does not). One row can give both."""
    n = 0
    for i in range(len(slot)):
        m = reason_bits(mask[i])
        if m < 0:
            continue  # missing, or not a bitmask (as the GPU detectors read it: gpu_inputs.reason_bits)
        s = slot[i]
        bits = m & watched
        new = bits & ~int(last[s])
        if new != 0:
            out_row[n] = i
            out_bits[n] = new
            out_continuing[n] = False
            n += 1
        if new & held != 0:
            reported[s] = ts[i]
        elif bits & held != 0 and ts[i] - reported[s] >= refresh_s:
            # due whatever else turned on in this row: a SW power cap bit coming back with every
            # training step is no report of the held bits (it reset this timer, and a GPU held at
            # sw_thermal was never reminded of while its cap bit flickered)
            out_row[n] = i
            out_bits[n] = bits & held
            out_continuing[n] = True
            n += 1
            reported[s] = ts[i]
        last[s] = bits
    return n


def describe_bits(bits: int) -> str:
    return "+".join(name for name, bit in THROTTLE_BITS.items() if bits & bit) or "none"


class ThrottleBitsDetector(Detector):
    """Throttle onsets (the bits that turned on) and, every ``refresh_s`` while a thermal or
    power-brake bit stays set, a reminder that it still holds (score: the held bits)."""

    slot_kinds: ClassVar[Mapping[str, str]] = {"s_last": "gpu", "s_reported": "gpu"}
    name: ClassVar[str] = "throttle_bits"
    kinds: ClassVar[tuple[str, ...]] = ("gpu",)

    def __init__(self, topology: Topology, watched: int = WATCHED, refresh_s: float = REFRESH_S) -> None:
        super().__init__(topology)
        if not refresh_s > 0:
            raise ValueError("throttle_bits: refresh_s must be > 0")
        if not 0 <= int(watched) < WATCHED_LIMIT:
            raise ValueError(f"throttle_bits: watched must be a bitmask below 2**24 (s_last is float32), got {watched}")
        self.watched = int(watched)
        self.refresh_s = float(refresh_s)
        self.s_last = np.zeros(topology.size("gpu"), dtype=np.float32)  # last watched bits (< 2**24: exact)
        self.s_reported = np.full(topology.size("gpu"), -np.inf)  # last report per GPU

    def update(self, frame: Frame) -> list[Finding]:
        if len(frame) == 0:
            return []
        most = 2 * len(frame)  # an onset and a reminder can share a row
        rows = np.empty(most, np.int64)
        bits = np.empty(most, np.int64)
        continuing = np.empty(most, np.bool_)
        n = _bit_onsets(frame.ts, frame.slot, frame.columns["throttle_reasons"], self.s_last, self.s_reported,
                        self.watched, HELD & self.watched, self.refresh_s, rows, bits, continuing)
        return [
            Anomaly(ts=float(frame.ts[r]), entity_kind="gpu", slot=int(frame.slot[r]), field="throttle_reasons",
                    score=float(b), detector=self.name,
                    reason=f"throttling {'continues' if c else 'observed'}: {describe_bits(int(b))}")
            for r, b, c in zip(rows[:n].tolist(), bits[:n].tolist(), continuing[:n].tolist())
        ]
