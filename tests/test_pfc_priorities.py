"""PFC pause time over several priorities, from ``ethtool -S`` to the congestion detector.

Two audit findings: (1) ``pfc_pause_duration`` adds up every priority's pause time, up to 8 s per
second, but the congestion detector bounded it at 4 s/s: a storm on 5 or more priorities was refused
at every poll (never raised; one that spread to them withdrawn as "exporter hung"); (2) mlx5 prints
a priority's PFC counters only while PFC is enabled on it (en_stats.c ``for_each_set_bit(prio,
&pfc_combined, NUM_PPORT_PRIO)``), so turning PFC off and on again on a priority took its lifetime
total out of the sum and put it back: pause time from nothing paused. The expected figures are
arithmetic on the inputs written here.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pytest

from foreshock.detectors.congestion import CongestionDetector
from foreshock.health import PipelineHealth
from foreshock.streams.ethtool_stats import EthtoolStatsSource, PfcPauseTotals, stats_batches
from foreshock.streams.samples import host_link_topology

LINK = "h/eth0"
POLL_S = 10.0


def ethtool_text(pause_us: Mapping[int, float]) -> str:
    """``ethtool -S`` output with ``rx_prioN_pause_duration`` (µs) for the priorities given: mlx5
    prints only the PFC-enabled ones. NaN prints as all ones (not available)."""
    return "NIC statistics:\n" + "".join(
        f"     rx_prio{p}_pause_duration: {2**64 - 1 if math.isnan(v) else int(v)}\n" for p, v in pause_us.items())


class Port:
    """One RoCE port polled every 10 s through stats_batches, with the totals a source keeps."""

    def __init__(self) -> None:
        self.topo = host_link_topology("h", [("eth0", LINK)])
        self.health = PipelineHealth()
        self.det = CongestionDetector(self.topo, health=self.health)
        self.pfc = PfcPauseTotals(self.health)
        self.found: list = []
        self.field: list[float] = []

    def poll(self, t: float, pause_us: Mapping[int, float]) -> None:
        links, _ = stats_batches({LINK: ethtool_text(pause_us)}, t, self.health, pfc=self.pfc)
        frame = links.to_frame(self.topo, self.health, "ethtool")
        self.field.append(float(frame.columns["pfc_pause_duration"][0]))
        self.found += self.det.update(frame)


@pytest.mark.parametrize("paused", [5, 8])
def test_a_pfc_storm_on_many_priorities_is_raised_and_says_its_figure_is_summed(paused: int) -> None:
    port = Port()
    for k in range(12):
        # the first `paused` priorities paused throughout: each adds 10 s of pause per 10-s poll
        port.poll(k * POLL_S, {p: (k * POLL_S * 1e6 if p < paused else 0.0) for p in range(8)})
    starts = [f for f in port.found if f.active]
    assert starts, "a storm pausing every priority it touches throughout is congestion"
    assert starts[0].ts == POLL_S  # at the first rate, not refused as faster than time
    # paused priorities x 100 % of the time, said to be a sum (over 100 % only a sum can be)
    assert f"PFC pause {paused * 100:.2f}% (summed over priorities)" in starts[0].reason
    assert not any("implausible" in reason for _, reason in port.health.problems)
    assert not any(not f.active for f in port.found)


def test_a_storm_spreading_from_3_to_5_priorities_is_not_withdrawn_as_silent() -> None:
    port = Port()
    pause = np.zeros(8)
    for k in range(40):
        t = k * POLL_S
        n = 3 if t <= 60 else 5
        if k:
            pause[:n] += POLL_S * 1e6  # the paused priorities paused for the whole poll
        port.poll(t, dict(enumerate(pause.tolist())))
    assert [f.active for f in port.found][:1] == [True]
    # held while it lasts (refreshed), never withdrawn: 5 priorities paused is still scored
    assert all(f.active for f in port.found)
    assert port.found[-1].ts >= 40 * POLL_S - 60.0 - POLL_S  # refreshed until the end (refresh_s 60)
    assert "500.00%" in port.found[-1].reason


def test_pfc_turned_off_and_on_again_on_a_priority_is_no_pause_time() -> None:
    """Priority 3 at 1000 s and priority 4 at 3 s of lifetime pause, both flat (nothing paused); PFC
    off on priority 4 for three polls (not printed), then on again."""
    port = Port()
    for k in range(12):
        prios = {3: 1000e6, 4: 3e6} if not 4 <= k < 7 else {3: 1000e6}
        port.poll(k * POLL_S, prios)
    assert port.found == []  # nothing paused: no congestion
    # one counter that never moved: the sum of the first poll's values, all along
    assert port.field == [pytest.approx(1003.0)] * 12
    assert not port.health.problems


def test_a_priority_enabled_later_adds_only_what_it_pauses_from_then() -> None:
    port = Port()
    port.poll(0.0, {3: 50e6})
    port.poll(10.0, {3: 50e6, 5: 700e6})  # PFC enabled on 5, 700 s of old pause: its baseline
    port.poll(20.0, {3: 50e6, 5: 702e6})  # then 2 s paused on 5 in the poll
    assert port.field == [pytest.approx(50.0), pytest.approx(50.0), pytest.approx(52.0)]
    # 2 s in 10 s is 20 % of the time: congestion then, and only then (not 7000 % at 10 s)
    assert [(f.ts, f.active) for f in port.found] == [(20.0, True)]
    assert "PFC pause 20.00%" in port.found[0].reason


def test_one_priority_cleared_is_a_reset_of_its_own_not_of_the_sum() -> None:
    """Priority 3 (1000 s) is cleared (a driver reload); priority 4 (3 s) is not. Read on the sum,
    the fall to 3 s was a reset whose increase is the new value: 3 s in one poll, 30 %."""
    port = Port()
    port.poll(0.0, {3: 1000e6, 4: 3e6})
    port.poll(10.0, {3: 1000e6, 4: 3e6})
    port.poll(20.0, {3: 0.0, 4: 3e6})  # cleared: held for a poll (it could be one bad reading)
    port.poll(30.0, {3: 0.01e6, 4: 3e6})  # still down there: a reset; 10 ms paused since the low one
    port.poll(40.0, {3: 0.01e6, 4: 3e6})
    assert port.field == pytest.approx([1003.0, 1003.0, 1003.0, 1003.01, 1003.01])
    assert port.found == []  # 10 ms in 10 s is 0.1 %, under the 0.2 % threshold
    assert port.health.problems[("ethtool", "PFC pause counter reset")] == 1


def test_one_low_reading_of_a_priority_is_a_bad_one_not_a_reset() -> None:
    port = Port()
    port.poll(0.0, {3: 1000e6})
    port.poll(10.0, {3: 12.0})  # a truncated read of 1000000000
    port.poll(20.0, {3: 1000e6 + 5e3})  # back: 5 ms paused over the two polls
    assert port.field == pytest.approx([1000.0, 1000.0, 1000.005])
    assert port.found == []
    assert port.health.problems[("ethtool", "PFC pause counter read low once, then back")] == 1
    assert ("ethtool", "PFC pause counter reset") not in port.health.problems


def test_a_priority_not_available_costs_its_poll_and_its_pause_is_counted_at_the_next() -> None:
    port = Port()
    port.poll(0.0, {3: 100e6, 4: 0.0})
    port.poll(10.0, {3: math.nan, 4: 0.0})  # all ones: no reading
    port.poll(20.0, {3: 100e6 + 4e3, 4: 0.0})  # 4 ms paused over both polls
    assert port.field[0] == pytest.approx(100.0) and math.isnan(port.field[1])
    assert port.field[2] == pytest.approx(100.004)


def test_the_source_keeps_the_totals_from_poll_to_poll_and_a_fresh_one_starts_at_the_sum() -> None:
    """The ethtool source is what runs in ``watch``/``agent``: its polls share one PfcPauseTotals.
    A fresh source (a restart: sources keep no checkpoint) starts at the sum of the printed values,
    what the running one holds while no priority was turned off, on or cleared."""
    texts = iter([ethtool_text(p) for p in ({3: 1000e6, 4: 3e6}, {3: 1000e6}, {3: 1000e6, 4: 3e6})])
    source = EthtoolStatsSource({"eth0": LINK}, host="h")
    source.read_all = lambda: {LINK: next(texts)}  # type: ignore[method-assign]
    field = [float(source.poll()[0].columns["pfc_pause_duration"][0]) for _ in range(3)]
    assert field == pytest.approx([1003.0, 1003.0, 1003.0])
    restarted, _ = stats_batches({LINK: ethtool_text({3: 1000e6, 4: 3e6})}, 0.0, pfc=PfcPauseTotals())
    assert restarted.columns["pfc_pause_duration"][0] == pytest.approx(1003.0)
