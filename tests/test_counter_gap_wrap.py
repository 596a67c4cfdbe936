"""A 32-bit counter that falls after its port sent rows without counters is cleared, not wrapped.

The InfiniBand source sends a port gone from sysfs as DOWN rows with no counters, and an HCA reset
brings it back with its counters cleared. The wrap rule allowed a wrap of up to 16x the counter's
pace over the whole gap, so after 10 min away a ``port_xmit_wait`` cleared from 3.0e9 (above 2**31:
the module docstring's own example of a clear that must not read as a wrap) to 1000 read as a wrap of
2**32 - 3.0e9 + 1000 ~ 1.29e9 ticks, a false congestion alarm. Expected values here are arithmetic on
the inputs, not the code's output.
"""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors.congestion import CongestionDetector
from foreshock.detectors.counters import CounterRates, modulus_for_bits
from foreshock.exporters.store import FindingStore, xmit_wait_counter
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.streams.samples import host_link_topology

M32 = 2.0**32
START = 3.0e9  # above 2**31: the wrapped increase of a clear from here fits the half-range rule
PACE = 2e5  # ticks/s: 0.026 % of the time at 400 Gb/s, far under the 0.2 % congestion threshold
BACK = 1000.0  # the cleared counter's first reading


def gone_and_back() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """10-s polls: healthy 0..50 s, away 60..650 s (DOWN rows with no counter), back cleared at
    660 s and counting at the same pace. Returns (ts, link_state, xmit_wait)."""
    rows = [(float(t), 4.0, START + PACE * t) for t in range(0, 60, 10)]
    rows += [(float(t), 1.0, np.nan) for t in range(60, 660, 10)]
    rows += [(float(t), 4.0, BACK + PACE * (t - 660)) for t in range(660, 760, 10)]
    ts, state, wait = (np.array(c) for c in zip(*rows))
    return ts, state, wait


@pytest.mark.kernel
def test_a_fall_after_rows_without_the_counter_is_a_reset_not_a_wrap() -> None:
    ts, _, wait = gone_and_back()
    rates = CounterRates(1, ["xmit_wait"], modulus=modulus_for_bits(32))
    delta, _, problems = rates.update(ts, np.zeros(len(ts), np.int32), wait[:, None])
    back = int(np.flatnonzero(ts == 660.0)[0])
    # a reset counts from zero: the increase is the first reading itself, not 2**32 - 3.0e9 + 1000
    assert delta[back, 0] == BACK
    assert problems["wraps"] == 0 and problems["resets"] == 1
    assert int(rates.s_resets[0, 0]) == 1
    # after it, the pace it counts at: 10 s at 2e5 ticks/s per poll
    np.testing.assert_array_equal(delta[back + 1:, 0], np.full(len(ts) - back - 1, 10 * PACE))


@pytest.mark.kernel
def test_a_true_wrap_without_a_gap_is_still_a_wrap_and_one_after_the_gap_closed_too() -> None:
    """The gap changes the reading right after it only: a counter that wraps between two polls with
    no row missing (slot 0), or at a later reading than the first after a gap (slot 1), is read as
    the wrap it is."""
    step = 2e8  # per 10-s poll: 2e7 ticks/s, a port stalled ~2.6 % of the time at 400 Gb/s
    rates = CounterRates(2, ["w"], modulus=modulus_for_bits(32))
    ts = np.repeat(np.arange(6) * 10.0, 2)
    slot = np.tile(np.array([0, 1], np.int32), 6)
    no_gap = [M32 - 3 * step, M32 - 2 * step, M32 - step, step / 2, 1.5 * step, 2.5 * step]
    gap = [M32 - 4 * step, M32 - 3 * step, np.nan, M32 - step, step / 2, 1.5 * step]
    values = np.array([v for pair in zip(no_gap, gap) for v in pair])
    delta, _, problems = rates.update(ts, slot, values[:, None])
    # the way round the top (1.5 * step), not a reset counting only the value after it
    assert delta[6, 0] == pytest.approx(1.5 * step)  # slot 0 at 30 s
    assert delta[9, 0] == pytest.approx(1.5 * step)  # slot 1 at 40 s, one reading after the gap
    assert problems["wraps"] == 2 and problems["resets"] == 0


@pytest.mark.kernel
def test_a_glitch_right_after_the_gap_is_still_seen_as_one() -> None:
    """Read as a reset, the fall after a gap stays pending like any reset: a 0 read once as the port
    comes back, then the counter where it was, is a glitch, not a reset and then the whole total."""
    rates = CounterRates(1, ["w"], modulus=modulus_for_bits(32), max_rate=1e10)
    ts = np.array([0.0, 10.0, 20.0, 30.0, 40.0])
    values = np.array([START, START + 10 * PACE, np.nan, 0.0, START + 30 * PACE])
    delta, _, problems = rates.update(ts, np.zeros(len(ts), np.int32), values[:, None])
    assert problems["glitches"] == 1 and problems["resets_confirmed"] == 0
    # the two intervals after the 0 counted what the counter rose by, 20 s at the pace, not 3.0e9
    assert np.nansum(delta[3:, 0]) == pytest.approx(20 * PACE)


def _frames(ts: np.ndarray, state: np.ndarray, wait: np.ndarray) -> list[Frame]:
    return [Frame("link", np.array([t]), np.array([0]), {
        "xmit_wait": np.array([w]), "link_state": np.array([s]),
        "link_rate": np.array([400e9 if s == 4.0 else np.nan])})
        for t, s, w in zip(ts.tolist(), state.tolist(), wait.tolist())]


@pytest.mark.parametrize("checkpoint_at", [None, 300.0])
def test_congestion_raises_nothing_for_a_port_back_with_its_counters_cleared(checkpoint_at: float | None) -> None:
    """The audit's repro through the detector (32-bit PortCounters), also with a checkpoint taken
    while the port is away: restored, it still knows the port sent rows without its counter."""
    topo = host_link_topology("h", [("mlx5_0", "h/mlx5_0/1")])
    det = CongestionDetector(topo, counter_bits=32, health=PipelineHealth())
    found = []
    for frame in _frames(*gone_and_back()):
        if checkpoint_at is not None and frame.ts[0] == checkpoint_at:
            restored = CongestionDetector(topo, counter_bits=32, health=PipelineHealth())
            restored.load_state_dict(det.state_dict())
            det = restored
        found += det.update(frame)
    assert found == []  # the port idled at 0.026 % of the time: no congestion, none withdrawn
    assert int(det.counters.s_resets[0, 0]) == 1


def test_the_stores_leaf_counter_reads_the_gap_as_the_detector_does() -> None:
    """The store's per-leaf xmit_wait total reads each link by the congestion detector's rules: the
    port back cleared adds its first reading (a reset), not 1.29e9 phantom ticks."""
    ts, state, wait = gone_and_back()
    topo = host_link_topology("h", [("mlx5_0", "h/mlx5_0/1")])
    store = FindingStore(topo, congestion_params={"counter_bits": 32})
    for frame in _frames(ts, state, wait):
        store.observe_frame(frame)
    # 5 polls before (10 s at the pace each), the cleared counter's 1000, 9 polls after
    expected = 5 * 10 * PACE + BACK + 9 * 10 * PACE
    assert store.snapshot().xmit_wait_increase[0] == pytest.approx(expected)
    reader = xmit_wait_counter(1, {"counter_bits": 32})
    delta, _, problems = reader.update(ts, np.zeros(len(ts), np.int32), wait[:, None])
    assert problems["wraps"] == 0 and np.nansum(delta[:, 0]) == pytest.approx(expected)
