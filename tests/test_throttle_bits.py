"""Observed throttling (detectors/throttle_bits.py): onsets, and reminders while a thermal
throttle or a power brake lasts — which keep a cooling incident open for as long as its GPUs
are still held down."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.incidents import IncidentEngine
from foreshock.detectors.throttle_bits import HELD, WATCHED, ThrottleBitsDetector
from foreshock.findings import Incident, Prediction
from foreshock.frames import Frame
from test_incidents import TOPO, run


def reference(ts: list[float], slot: list[int], masks: list[float], n: int, refresh_s: float) -> list[tuple[float, int, int, bool]]:
    """Naive: per GPU, report bits that turned on; while held bits stay set, again every refresh_s
    after a held bit last turned on or was reported (another bit turning on does not count)."""
    last = [0] * n
    reported = [-np.inf] * n
    out = []
    for t, s, m in zip(ts, slot, masks):
        if not 0.0 <= m < 2.0 ** 40:
            continue  # missing, or not a bitmask
        bits = int(m) & WATCHED
        new = bits & ~last[s]
        if new:
            out.append((t, s, new, False))
        if new & HELD:
            reported[s] = t
        elif bits & HELD and t - reported[s] >= refresh_s:
            out.append((t, s, bits & HELD, True))
            reported[s] = t
        last[s] = bits
    return out


MASKS = st.sampled_from([0.0, 1.0, 4.0, 0x20, 0x24, 0x48, 0x80, 0x88, float("nan"), -1.0, float("inf"), 2.0 ** 64])


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), MASKS, st.floats(0.0, 400.0)), max_size=80),
       st.floats(1.0, 600.0))
def test_kernel_matches_the_reference(rows: list[tuple[int, float, float]], refresh_s: float) -> None:
    topo_gpus = TOPO.size("gpu")
    ts = list(np.cumsum([dt for _, _, dt in rows]))
    slot = [s for s, _, _ in rows]
    masks = [m for _, m, _ in rows]
    det = ThrottleBitsDetector(TOPO, refresh_s=refresh_s)
    half = len(rows) // 2  # two frames: state carries over
    found = []
    for lo, hi in ((0, half), (half, len(rows))):
        found += det.update(Frame("gpu", np.array(ts[lo:hi], dtype=float), np.array(slot[lo:hi], np.int32),
                                  {"throttle_reasons": np.array(masks[lo:hi], dtype=float)}))
    got = [(f.ts, f.slot, int(f.score), "continues" in f.reason) for f in found]
    assert got == reference(ts, slot, masks, topo_gpus, refresh_s)


def test_a_lasting_thermal_throttle_is_reported_again_but_a_power_cap_is_not() -> None:
    det = ThrottleBitsDetector(TOPO, refresh_s=300.0)
    t = np.arange(0.0, 1000.0, 10.0)
    found = det.update(Frame("gpu", np.concatenate([t, t]), np.repeat(np.array([0, 1], np.int32), len(t)),
                             {"throttle_reasons": np.concatenate([np.full(len(t), 0x20), np.full(len(t), 0x4)])}))
    assert [(f.slot, f.ts) for f in found if f.slot == 0] == [(0, 0.0), (0, 300.0), (0, 600.0), (0, 900.0)]
    assert [f.reason for f in found if f.slot == 0][1] == "throttling continues: sw_thermal"
    assert [(f.slot, f.ts) for f in found if f.slot == 1] == [(1, 0.0)]


@pytest.mark.parametrize("cap_flickers", [False, True])
def test_a_cooling_incident_stays_open_while_its_gpus_stay_throttled(cap_flickers: bool) -> None:
    """The GPUs of loop cdu0 (nodes 0-3) are predicted to throttle, then throttle for two hours:
    the thermal predictions stop (the event is there), but the incident is not resolved until the
    throttling ends — one incident, not a resolved one and a new one. Also while the SW power cap
    bit comes and goes with every other sample beside the thermal one (its onsets reset the
    reminder's timer: the incident resolved at 1,510 s, an hour and a half into the throttling)."""
    gpus = np.arange(16)
    predictions = [Prediction(float(t), "gpu", int(g), "thermal_throttle", 600.0 - t, 0.9, "thermal", "core heading for 88 °C")
                   for t in range(0, 600, 60) for g in gpus]
    throttled_until = 600.0 + 7200.0
    det, findings = ThrottleBitsDetector(TOPO), list(predictions)
    for t in np.arange(600.0, throttled_until + 1800.0, 10.0):
        bits = (0x24 if cap_flickers and round(t / 10) % 2 else 0x20) if t < throttled_until else 0x0
        findings += det.update(Frame("gpu", np.full(len(gpus), t), gpus.astype(np.int32),
                                     {"throttle_reasons": np.full(len(gpus), float(bits))}))
    engine = IncidentEngine(TOPO)
    out = run(engine, findings, until=throttled_until + 1800.0)
    assert len({i.incident_id for i in out}) == 1
    resolved = [i for i in out if i.state == "resolved"]
    assert resolved, "the incident never resolved after the throttling ended"
    assert min(i.ts for i in resolved) > throttled_until
    assert all(isinstance(i, Incident) for i in out)


def test_a_value_that_is_not_a_bitmask_is_no_throttle() -> None:
    """-1 (an exporter's "N/A"), infinity, 2**64: read as missing, as the GPU detectors read them
    (``gpu_inputs.reason_bits``). -1 was every watched bit at once ("throttling observed:
    sw_power_cap+hw_slowdown+sw_thermal+hw_thermal+hw_power_brake"), and infinity raised
    OverflowError without the JIT."""
    for bad in (-1.0, float("inf"), 2.0 ** 64, 2.0 ** 40):
        det = ThrottleBitsDetector(TOPO)
        found = det.update(Frame("gpu", np.array([0.0, 10.0, 20.0]), np.zeros(3, np.int32),
                                 {"throttle_reasons": np.array([0.0, bad, 0x20])}))
        assert [(f.ts, f.reason) for f in found] == [(20.0, "throttling observed: sw_thermal")], bad
