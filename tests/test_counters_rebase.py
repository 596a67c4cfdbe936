"""A high reading that stands is the counter's new baseline (review r2 of ff1efe7).

ff1efe7 bounded the optics' and the Mahalanobis detector's counters (congestion's and link_errors'
were bounded before): a reading further above the last one than the counter can count is refused.
But a counter takes a reading as its baseline with no pace to judge it by (its first, its second,
the first after a reset or a restore), and from a low one there every true reading after it was "too
fast" until the bound times the time since passed the counter's whole total: an optic's ``rx_bits``
of weeks of uptime read 0 at the first poll was refused at all 1,439 polls of four hours, and the
corrected bits with it (no BER); read 0 at the second poll, for 6.5 h; a GPU's ``energy`` of a day
read 0 at the second poll, for 3.9 h. Now a refused reading is kept, and the next reading going on
from it re-bases the counter there (``rebased``).

Also: the bounds that sit on a true rate (bits at the line rate, time at the time elapsed) carry
``STAMP_SLACK``: a poll stamps its rows when it starts and reads the ports one after another, so a
1.6T port read 1.8 s late in a 10-s poll had been refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.congestion import CongestionDetector
from foreshock.detectors.counters import (DROP_SIZE, LINE_BITS_MAX_PER_S, LINK_DOWNS_MAX_PER_S, TIME_MAX_PER_S,
                                          CounterRates)
from foreshock.detectors.link_errors import LinkErrorsDetector
from foreshock.detectors.mahalanobis import MAX_RATE, MahalanobisDetector
from foreshock.detectors.optics import OpticsDetector
from foreshock.detectors.xid import XidDetector
from foreshock.topology import Topology

from test_detector_counter_bounds import (HIGHER, as_records, one_link, optic_frames, run_mahalanobis, run_optics,
                                          same_state)

REBASED = "then went on from there"
PAIR = ("rx_bits", "rx_corrected_bits")
LINE_400G = 4.25e11  # a 400G port's line, bits/s


def energy_rates() -> CounterRates:
    return CounterRates(1, ["energy"], max_rate=MAX_RATE["energy"])


def optic_pair() -> CounterRates:
    """The optics detector's own counters (its bounds and pairing)."""
    return OpticsDetector(one_link()).counters


def feed(rates: CounterRates, raw: np.ndarray, interval: float = 1.0):
    raw = np.asarray(raw, dtype=np.float64).reshape(len(raw), -1)
    return rates.update(np.arange(len(raw)) * interval, np.zeros(len(raw), np.int32), raw)


# ---- one counter ---------------------------------------------------------------------------------
@pytest.mark.parametrize("low_at", [0, 1], ids=["first reading", "second reading (no pace: a reset)"])
def test_a_low_reading_taken_as_the_baseline_costs_one_poll_not_the_counters_total(low_at):
    """r2's energy_stuck: a GPU up a day at 700 W, polled every second, reads 0 once. The reading
    after it is refused (6e7 J in a second), the next goes on from that one: re-based there, and every
    delta from then on is the counter's true one. Before: refused for 13,953 polls (3.9 h)."""
    true = 6.0e7 + 700.0 * np.arange(600)
    raw = true.copy()
    raw[low_at] = 0.0
    delta, rate, problems = feed(energy_rates(), raw)
    refused = low_at + 1
    assert np.isnan(delta[refused, 0])
    np.testing.assert_array_equal(delta[refused + 1:, 0], np.diff(true)[refused:])
    np.testing.assert_array_equal(rate[refused + 1:, 0], np.diff(true)[refused:])  # 1-s polls
    assert problems["implausible_rise"] == 1 and problems["rebased"] == 1
    assert problems["resets"] == problems["resets_confirmed"] == (low_at == 1)


def test_a_jump_that_stands_is_taken_from_where_it_stood_and_the_jump_is_not():
    """A counter cleared and counting for a while unseen (a restore from an old checkpoint): the
    first reading after is far above the last one taken, the next goes on from it. The increase from
    the high reading on is taken, over the time since it; the jump itself is not (not known)."""
    raw = [1e6, 1e6 + 700, 5e9, 5e9 + 1400, 5e9 + 2100]
    delta, rate, problems = feed(energy_rates(), raw, interval=2.0)
    assert delta[1, 0] == 700.0 and np.isnan(delta[2, 0])
    assert delta[3:, 0].tolist() == [1400.0, 700.0] and rate[3:, 0].tolist() == [700.0, 350.0]
    assert problems["rebased"] == 1 and problems["resets"] == 0


def test_one_garbage_reading_then_the_old_baseline_stays_refused_and_is_forgotten():
    """Garbage once, the counter goes on from its last good value: refused as before, and the
    garbage is forgotten, so a later reading near it does not stand on it."""
    raw = [100.0, 110.0, 1e12, 120.0, 1e12 + 20.0, 130.0]
    delta, _, problems = feed(CounterRates(1, ["x"], max_rate=10.0), raw)
    assert np.isnan(delta[[2, 4], 0]).all() and delta[[1, 3, 5], 0].tolist() == [10.0, 10.0, 10.0]
    assert problems["implausible_rise"] == 2 and problems["rebased"] == 0


@pytest.mark.parametrize("garbage", [1e12, 2.0**64 - 1])
def test_the_same_garbage_twice_does_not_stand(garbage):
    """Review of c155409: a reading repeated is not one going on. A ``link_downed`` of 3 read as 1e12
    (or all ones of 64 bits, a port re-initialising) on two polls had stood, and the fall back to 3
    was a reset counting the 3 again: "fatal: link_downed +3" and a flapping link. Both readings are
    refused, and the counter goes on from its last good value with nothing counted."""
    raw = [3.0, 3.0, garbage, garbage, 3.0, 3.0]
    delta, _, problems = feed(CounterRates(1, ["link_downed"], max_rate=LINK_DOWNS_MAX_PER_S), raw, interval=10.0)
    assert np.isnan(delta[2:4, 0]).all() and delta[4:, 0].tolist() == [0.0, 0.0]
    assert problems["rebased"] == 0 and problems["resets"] == 0 and problems["implausible_rise"] == 2


def test_a_flat_counter_after_a_low_first_reading_stands_at_its_first_rise():
    """A counter that does not move (downs of a healthy link) read 0 first: each later reading of its
    true total is refused (it repeats, it does not go on), and its first rise stands: re-based on the
    reading before, the rise taken. A down is not missed."""
    raw = [0.0, 7.0, 7.0, 7.0, 8.0, 8.0]
    delta, _, problems = feed(CounterRates(1, ["link_downed"], max_rate=0.1), raw, interval=10.0)
    assert np.isnan(delta[1:4, 0]).all() and delta[4:, 0].tolist() == [1.0, 0.0]
    assert problems["rebased"] == 1 and problems["implausible_rise"] == 3


def test_all_ones_once_does_not_stand_but_twice_does():
    """All ones (2**32-1) going on from a refused reading is as often a failed read: it stands only
    on all ones before it (where a 32-bit counter stops, read twice)."""
    top = 2.0**32 - 1
    delta, _, problems = feed(CounterRates(1, ["x"], max_rate=100.0), [0.0, top - 50, top, top - 30, top - 20])
    assert np.isnan(delta[:4, 0]).all() and delta[4, 0] == 10.0
    assert problems["rebased"] == 1 and problems["implausible_rise"] == 3 and problems["resets"] == 0
    delta, _, problems = feed(CounterRates(1, ["x"], max_rate=10.0), [0.0, top, top, top])
    # (stuck at the top, its increase is unknown, not 0: "Held at 2**32-1")
    assert np.isnan(delta[2:, 0]).all() and problems["rebased"] == 1 and problems["saturated"] == 1


def test_a_rebase_decides_a_pending_reset():
    """A low reading with a pace known is a reset pending (a glitch if the next comes back); a
    refused reading then one going on from it: no way back came, the reset stands."""
    raw = [1e6, 1e6 + 10, 0.0, 5e9, 5e9 + 10, 5e9 + 20]
    delta, _, problems = feed(CounterRates(1, ["x"], max_rate=100.0), raw)
    assert delta[4:, 0].tolist() == [10.0, 10.0]
    assert problems["resets"] == 1 and problems["resets_confirmed"] == 1 and problems["glitches"] == 0
    assert problems["rebased"] == 1


@pytest.mark.parametrize("cut", range(1, 6))
def test_a_refused_reading_pending_survives_a_state_round_trip(cut):
    raw = np.array([[0.0], [6e7], [6e7 + 700], [6e7 + 1400], [6e7 + 2100], [6e7 + 2800]])
    ts, slot = np.arange(6.0), np.zeros(6, np.int32)
    expected, _, _ = energy_rates().update(ts, slot, raw)
    a = energy_rates()
    first, _, _ = a.update(ts[:cut], slot[:cut], raw[:cut])
    b = energy_rates()
    b.load_state_dict(a.state_dict())
    second, _, _ = b.update(ts[cut:], slot[cut:], raw[cut:])
    np.testing.assert_array_equal(np.vstack([first, second]), expected)
    assert np.isfinite(expected[2:]).all()


# ---- counters read together ------------------------------------------------------------------------
@pytest.mark.parametrize("which", [0, 1], ids=PAIR)
def test_a_low_first_reading_of_the_optics_pair_re_bases_both_together(which):
    """r2's case H and optics_first_zero_parent: a 400G optic up weeks (3e17 bits), polled every 10 s
    for four hours, one of the pair read 0 at the first poll. The next row is refused (the bits too
    fast, or the corrected bits rising more than the bits), the one after goes on from it: both are
    re-based there, so each row after has both increases over the same interval and the true BER.
    Before: with the bits read 0, every one of the 1,439 rows refused, no BER for four hours."""
    t = np.arange(1440) * 10.0
    true = np.stack([3e17 + LINE_400G * t, 2e13 + LINE_400G * 1e-8 * t], axis=1)
    raw = true.copy()
    raw[0, which] = 0.0
    delta, rate, problems = feed(optic_pair(), raw, interval=10.0)
    assert np.isnan(delta[1]).all()
    np.testing.assert_array_equal(delta[2:], np.diff(true, axis=0)[1:])
    np.testing.assert_array_equal(rate[2:], np.diff(true, axis=0)[1:] / 10.0)
    assert problems["implausible_rise"] == 1 and problems["rebased"] == 2


def test_a_pair_is_re_based_only_where_both_go_on_from_the_refused_row():
    """The bits jump and stand; the corrected bits' reading in the refused row was garbage, the next
    one back near the last good value: not both went on from the refused row, so it is refused again
    (and kept); the next row goes on from that one for both, re-based there together."""
    rows = [(0.0, 0.0), (1e6, 100.0), (5e12, 1e15), (5e12 + 1e6, 200.0), (5e12 + 2e6, 300.0)]
    delta, _, problems = feed(CounterRates(1, PAIR, max_rate=1e7, together=True,
                                           bounded_by={"rx_corrected_bits": "rx_bits"}), rows)
    assert np.isnan(delta[2:4]).all() and delta[4].tolist() == [1e6, 100.0]
    assert problems["implausible_rise"] == 3 and problems["rebased"] == 2


def test_a_pair_row_where_the_corrected_bits_outrun_the_bits_from_the_refused_row_does_not_stand():
    rows = [(0.0, 0.0), (5e12, 100.0), (5e12 + 1e6, 100.0 + 2e6)]
    delta, _, problems = feed(CounterRates(1, PAIR, max_rate=1e7, together=True,
                                           bounded_by={"rx_corrected_bits": "rx_bits"}), rows)
    assert np.isnan(delta[1:]).all() and problems["rebased"] == 0 and problems["implausible_rise"] == 2


# ---- the detectors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("column", PAIR)
def test_an_optic_counter_read_0_at_the_first_poll_reads_as_without_it(column):
    """r2's optics_first_garbage: the detector's findings and state (ten buckets in and at the end) are
    those of the run without the reading; health says one reading refused and the pair re-based."""
    found, health, states = run_optics(optic_frames(column, 0.0, bad_at=0.0))
    without, _, states_without = run_optics(optic_frames(column, np.nan, bad_at=0.0))
    assert as_records(found) == as_records(without)
    assert all(same_state(a, b) for a, b in zip(states, states_without))
    by_reason = {reason: n for (_, reason), n in health.problems.items()}
    assert sorted(by_reason.values()) == [1, 2]
    assert by_reason[next(r for r in by_reason if HIGHER in r and REBASED not in r)] == 1
    assert by_reason[next(r for r in by_reason if REBASED in r)] == 2


def test_a_gpus_energy_read_0_at_the_second_poll_costs_two_polls():
    found, health, det = run_mahalanobis("energy", 0.0, "gpu_temp,power,energy,util", at=1)
    without, _, _ = run_mahalanobis("energy", np.nan, "gpu_temp,power,energy,util", at=1)
    assert as_records(found) == as_records(without) == []
    assert [n for (_, reason), n in health.problems.items() if HIGHER in reason and REBASED not in reason] == [1]
    assert [n for (_, reason), n in health.problems.items() if REBASED in reason] == [1]
    assert det.state_dict()["imputed_rows"] == 0  # a refused reading is not a gap in the input


def gpus(n: int) -> Topology:
    return Topology.from_gpu_hosts([("n0", n - 1)])


DETECTORS = {  # each detector with counters, and the key of its counters' drops in its state
    "optics": (lambda: OpticsDetector(one_link()), "s_counter_drop"),
    "congestion": (lambda: CongestionDetector(one_link()), "s_counter_drop"),
    "link_errors": (lambda: LinkErrorsDetector(one_link()), "s_counter_drop"),
    "xid": (lambda: XidDetector(gpus(2)), "s_dbe_drop"),
    "mahalanobis": (lambda: MahalanobisDetector(gpus(2), gpu_fields="power,energy"), "s_gpu_counter_drop"),
}


@pytest.mark.parametrize("name", list(DETECTORS))
def test_a_checkpoint_saved_with_four_drop_columns_loads_with_no_refused_reading_pending(name):
    """Checkpoints from before a refused reading was kept (``s_drop`` of 4 columns) load: what they
    held pending (a drop, a held reading) is kept, and no refused reading is pending."""
    make, key = DETECTORS[name]
    det = make()
    state = det.state_dict()
    old = np.full((*state[key].shape[:2], 4), np.nan)
    old[0, 0] = [100.0, 5.0, 2.0, 0.0]  # a reset's drop pending
    det = make()
    det.load_state_dict({**state, key: old})
    loaded = det.state_dict()[key]
    assert loaded.shape == (*old.shape[:2], DROP_SIZE)
    np.testing.assert_array_equal(loaded[:, :, :4], old)
    assert np.isnan(loaded[:, :, 4:]).all()


def test_a_counter_state_saved_with_four_drop_columns_loads():
    a = CounterRates(1, ["x"], max_rate=10.0)
    a.update(np.arange(3.0), np.zeros(3, np.int32), np.array([[100.0], [105.0], [0.0]]))  # a reset pending
    saved = a.state_dict()
    saved["s_drop"] = saved["s_drop"][:, :, :4]
    b = CounterRates(1, ["x"], max_rate=10.0)
    b.load_state_dict(saved)
    delta, _, problems = b.update(np.array([3.0]), np.zeros(1, np.int32), np.array([[115.0]]))
    assert problems["glitches"] == 1 and delta[0, 0] == 10.0  # the drop judged as it was saved


# ---- bounds with room for the time a read is late ---------------------------------------------------------
def test_a_16t_port_read_late_in_its_poll_is_not_refused():
    """r2: a 1.6T port's line (1.7e12 bits/s) stamped every 10 s, one read 1.8 s late: 2.0e13 bits in
    a stamped 10 s. At the line rate alone (2e12 bits/s) that row was refused."""
    line = 1.6e12 * 1.0625
    read_at = np.arange(6) * 10.0
    read_at[3] += 1.8
    bits = 3e17 + line * read_at
    raw = np.stack([bits, bits * 1e-8], axis=1)
    delta, _, problems = feed(optic_pair(), raw, interval=10.0)
    np.testing.assert_array_equal(delta[1:], np.diff(raw, axis=0))
    assert sum(problems.values()) == 0


@settings(max_examples=60, deadline=None)
@given(port_bps=st.sampled_from([100e9, 400e9, 800e9, 1.6e12]), interval=st.sampled_from([1.0, 10.0, 30.0]),
       late=st.lists(st.floats(0.0, 2.0), min_size=3, max_size=30))
def test_true_bits_and_throttle_time_read_up_to_two_polls_late_are_never_refused(port_bps, interval, late):
    """Each poll's read up to two polls after its stamp (the reads in order): an optic's bits at full
    line rate (KP4 FEC overhead) and a GPU's clocks held throughout are taken, every one, their deltas
    the true ones."""
    read_at = np.maximum.accumulate((np.arange(len(late)) + np.array(late)) * interval)
    bits = 1e15 + port_bps * 1.0625 * read_at
    delta, _, problems = feed(optic_pair(), np.stack([bits, bits * 1e-6], axis=1), interval)
    np.testing.assert_array_equal(delta[1:], np.diff(np.stack([bits, bits * 1e-6], axis=1), axis=0))
    assert sum(problems.values()) == 0
    held = 1e5 + read_at
    delta, _, problems = feed(CounterRates(1, ["power_throttle_time"], max_rate=MAX_RATE["power_throttle_time"]),
                              held, interval)
    np.testing.assert_array_equal(delta[1:, 0], np.diff(held))
    assert sum(problems.values()) == 0


def test_garbage_is_still_refused_under_the_wider_bounds():
    assert MAX_RATE["power_throttle_time"] == TIME_MAX_PER_S
    _, _, problems = feed(CounterRates(1, ["t"], max_rate=TIME_MAX_PER_S), [10.0, 11.0, 1e6, 13.0])
    assert problems["implausible_rise"] == 1
    _, _, problems = feed(optic_pair(), [(3e17, 2e13), (3e17 + 4.25e12, 1e15), (3e17 + 8.5e12, 2e13 + 8.5e4)], 10.0)
    assert problems["implausible_rise"] == 1 and LINE_BITS_MAX_PER_S * 10.0 < 1e15 - 2e13
