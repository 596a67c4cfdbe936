"""mlx5 ethtool -S -> link and optic samples; pre-/post-FEC BER from two readings."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from foreshock.health import PipelineHealth
from foreshock.streams.ethtool_stats import (
    EthtoolStatsSource,
    FecTracker,
    fec_ber,
    fec_ber_arrays,
    parse_ethtool_stats,
    stats_batches,
)

DATA = Path(__file__).parent / "data"
T0 = (DATA / "ethtool_S_mlx5_t0.txt").read_text()
T1 = (DATA / "ethtool_S_mlx5_t1.txt").read_text()


def test_parse_counters() -> None:
    stats = parse_ethtool_stats(T0)
    assert stats["rx_bits_phy"] == 9215872153600000.0
    assert stats["rx_corrected_bits_phy"] == 27647616.0
    assert stats["rx_prio3_pause_duration"] == 98000.0
    assert len(stats) == 46


def test_link_and_optic_fields_in_base_units() -> None:
    links, optics = stats_batches({"n/eth0": T0}, ts=10.0)
    link = {k: float(v[0]) for k, v in links.columns.items()}
    assert link == {"tx_data": 33154436000000.0, "rx_data": 33554436000000.0,
                    "pfc_pause_duration": pytest.approx(0.098, rel=1e-12),  # 98000 us
                    "link_downed": 1.0, "xmit_discards": 0.0}
    assert optics.entity_names() == ["n/eth0#a"]
    optic = {k: float(v[0]) for k, v in optics.columns.items()}
    assert optic == {"rx_bits": 9215872153600000.0, "rx_corrected_bits": 27647616.0, "rx_symbol_errors": 0.0}


def test_pfc_pause_is_summed_over_every_priority() -> None:
    """The lossless class on priority 4, not 3: before, ``pfc_pause_duration`` was priority 3's
    alone, so this port's PFC storm never reached the congestion detector (NaN at every poll)."""
    on4 = T0.replace("rx_prio3_", "rx_prio4_")
    links, _ = stats_batches({"n/eth0": on4}, ts=10.0)
    assert links.columns["pfc_pause_duration"][0] == pytest.approx(0.098, rel=1e-12)
    both = T0 + "     rx_prio5_pause_duration: 2000\n"  # two lossless classes: their times add
    links, _ = stats_batches({"n/eth0": both}, ts=10.0)
    assert links.columns["pfc_pause_duration"][0] == pytest.approx(0.100, rel=1e-12)


def test_fec_ber_from_two_readings() -> None:
    pre, post = fec_ber(parse_ethtool_stats(T0), parse_ethtool_stats(T1))
    # 12000 corrected bits and 2 uncorrected symbols over 4e12 bits (10 s at 400 Gb/s)
    assert pre == pytest.approx(3e-9, rel=1e-12)
    assert post == pytest.approx(5e-13, rel=1e-12)


def test_reset_or_no_traffic_gives_nan_never_negative() -> None:
    a, b = parse_ethtool_stats(T0), parse_ethtool_stats(T1)
    assert all(math.isnan(x) for x in fec_ber(b, a))  # counters went back: a reset
    assert all(math.isnan(x) for x in fec_ber(a, a))  # no new bits
    pre, post = fec_ber_arrays(*(np.array([v]) for v in (0.0, 0.0, 0.0, 100.0, 5.0, 7.0)))
    assert (pre[0], post[0]) == (0.05, 0.07)


def test_tracker_fills_prefec_ber_and_counts_resets() -> None:
    health = PipelineHealth()
    tracker = FecTracker(health)
    _, first = stats_batches({"l": T0}, 0.0, health, tracker)
    _, second = stats_batches({"l": T1}, 10.0, health, tracker)
    _, third = stats_batches({"l": T0}, 20.0, health, tracker)
    assert np.isnan(first.column("prefec_ber")[0])
    assert second.column("prefec_ber")[0] == pytest.approx(3e-9, rel=1e-12)
    assert np.isnan(third.column("prefec_ber")[0])
    assert health.problems[("ethtool", "counter reset")] == 1


def test_per_queue_counters_are_read_not_counted_as_malformed() -> None:
    """Broadcom's bnxt_en prints per-queue counters as ``[N]: name: value`` (hundreds on a real
    NIC). Until 2026-12-01 each was counted as a malformed line at every poll."""
    text = ("NIC statistics:\n     [0]: rx_ucast_packets: 1418\n     [12]: rx_discards: 0\n"
            "     rx_total_discard_pkts: 0\n     link_down_events: 2\n")
    health = PipelineHealth()
    assert parse_ethtool_stats(text, health) == {"[0]rx_ucast_packets": 1418.0, "[12]rx_discards": 0.0,
                                                 "rx_total_discard_pkts": 0.0, "link_down_events": 2.0}
    assert not health.problems


def _with(text: str, **values: int) -> str:
    """``text`` with the counters named set to ``values``."""
    for name, value in values.items():
        text, n = re.subn(rf"(?m)^(\s*{name}): \d+$", rf"\g<1>: {value}", text)
        assert n == 1, name
    return text


def test_all_ones_counters_are_missing_and_counted_not_a_huge_increase_then_a_reset() -> None:
    """A poll reading ``link_down_events_phy`` as 2**64-1 (the kernel's "not set") and
    ``tx_bytes_phy`` as 2**32-1 between two real ones. Taken as values, the link errors detector
    read ``link_downed`` +1.8e19 (fatal), a flapping link, and +1 more at the next poll (the
    counter back at 1 read as a reset); the FEC tracker counted a counter reset."""
    from foreshock.detectors.link_errors import LinkErrorsDetector
    from foreshock.streams.samples import host_link_topology

    health = PipelineHealth()
    tracker = FecTracker(health)
    bad = _with(T1, link_down_events_phy=2**64 - 1, tx_bytes_phy=2**32 - 1, rx_bits_phy=2**64 - 1)
    topology = host_link_topology("n", [("eth0", "n/eth0")])
    detector = LinkErrorsDetector(topology, health=health)
    frames = []
    for ts, text in [(0.0, T0), (60.0, bad), (120.0, T1), (180.0, T1)]:
        links, optics = stats_batches({"n/eth0": text}, ts, health, tracker)
        frames.append((links, optics))
        assert not detector.update(links.to_frame(topology, health, "ethtool"))
    links, optics = frames[1]
    assert math.isnan(links.column("link_downed")[0]) and math.isnan(links.column("tx_data")[0])
    assert links.column("rx_data")[0] == 34054436000000.0  # the others read as ever
    assert math.isnan(optics.column("rx_bits")[0]) and math.isnan(optics.column("prefec_ber")[0])
    assert dict(health.problems) == {("ethtool", "counter not available (all ones)"): 3}


def test_all_ones_in_a_counter_not_read_is_not_counted_and_a_pause_priority_missing_is_no_sum() -> None:
    """An unavailable counter foreshock does not read is nobody's problem (counted at every poll it
    would be noise, as per-queue lines were); one priority's pause time unavailable leaves the
    sum unknown (without it the sum fell: a reset, and a jump back at the next poll)."""
    health = PipelineHealth()
    text = _with(T0, rx_packets=2**64 - 1) + "     rx_prio4_pause_duration: 4294967295\n"
    assert math.isnan(parse_ethtool_stats(text, health)["rx_packets"])
    assert not health.problems
    links, _ = stats_batches({"n/eth0": text}, 0.0, health)
    assert math.isnan(links.column("pfc_pause_duration")[0])
    assert links.column("link_downed")[0] == 1.0
    assert dict(health.problems) == {("ethtool", "counter not available (all ones)"): 1}


def test_values_no_u64_holds_are_malformed_and_one_below_a_sentinel_is_a_value() -> None:
    health = PipelineHealth()
    text = ("NIC statistics:\n     a: 18446744073709551616\n     b: -3\n     c: 18446744073709551614\n"
            "     d: 4294967294\n     e: 4294967296\n")
    assert parse_ethtool_stats(text, health) == {"c": float(2**64 - 2), "d": 4294967294.0, "e": 4294967296.0}
    assert health.problems[("ethtool", "malformed counter line")] == 2


def test_malformed_lines_and_unknown_output_are_counted() -> None:
    health = PipelineHealth()
    text = T0 + "     rx_bits_phy: lots\n     this line has no colon\n"
    stats = parse_ethtool_stats(text, health)
    assert stats["rx_bits_phy"] == 9215872153600000.0  # the earlier good line stands
    assert health.problems[("ethtool", "malformed counter line")] == 2
    links, optics = stats_batches({"x": "NIC statistics:\n     rx_packets: 1\n"}, 0.0, health)
    assert len(links) == 0 and len(optics) == 0
    assert health.problems[("ethtool", "no known counters")] == 1


def test_source_runs_ethtool_and_reports_prefec_ber(tmp_path: Path) -> None:
    counter = tmp_path / "n"
    stub = tmp_path / "ethtool"
    stub.write_text(f"""#!/bin/sh
[ "$1" = -S ] || exit 3
if [ -e {counter} ]; then cat {DATA}/ethtool_S_mlx5_t1.txt; else touch {counter}; cat {DATA}/ethtool_S_mlx5_t0.txt; fi
""")
    stub.chmod(0o755)
    health = PipelineHealth()
    source = EthtoolStatsSource(["ens1f0"], interval=0.02, executable=str(stub), host="h", health=health,
                                max_polls=2)
    frames = list(source)
    optic = [f for f in frames if f.kind == "optic"]
    assert [f.kind for f in frames] == ["link", "optic", "link", "optic"]
    assert np.isnan(optic[0].columns["prefec_ber"][0])  # frames carry every field, NaN when absent
    assert optic[1].columns["prefec_ber"][0] == pytest.approx(3e-9, rel=1e-12)
    assert optic[1].slot.tolist() == [source.topology.slot("optic", "h/ens1f0#a")]  # type: ignore[union-attr]
    assert health.total_problems() == 0


def test_an_interface_without_known_counters_counts_once_not_at_every_poll(tmp_path: Path) -> None:
    """A NIC whose driver names no counter foreshock knows will name none at the next poll either."""
    stub = tmp_path / "ethtool"
    stub.write_text('#!/bin/sh\n[ "$1" = -S ] || exit 3\nprintf "NIC statistics:\\n     rx_packets: 1\\n"\n')
    stub.chmod(0o755)
    health = PipelineHealth()
    list(EthtoolStatsSource(["eno1"], interval=0.02, executable=str(stub), host="h", health=health, max_polls=3))
    assert health.problems[("ethtool", "no known counters")] == 1


def test_one_all_ones_fec_reading_costs_one_poll_of_pre_fec_ber_not_two() -> None:
    """The all-ones reading was kept as the previous one, so the poll after it had no BER either.
    Now the FEC counters keep their last finite values: the next delta spans both polls."""
    def reading(bits: int, corrected: int) -> str:
        return (f"NIC statistics:\n     rx_bits_phy: {bits}\n     rx_corrected_bits_phy: {corrected}\n"
                f"     rx_pcs_symbol_err_phy: 0\n")

    health = PipelineHealth()
    tracker = FecTracker(health)
    polls = [reading(10**12, 100), reading(2 * 10**12, 300), reading(2**64 - 1, 500), reading(4 * 10**12, 700)]
    ber = [stats_batches({"h/eth0": text}, float(ts), health, tracker)[1].column("prefec_ber")[0]
           for ts, text in enumerate(polls)]
    assert math.isnan(ber[0]) and math.isnan(ber[2])
    assert ber[1] == pytest.approx(200 / 10**12)
    assert ber[3] == pytest.approx((700 - 300) / (2 * 10**12))  # from poll 1, both counters alike
    assert health.problems[("ethtool", "counter not available (all ones)")] == 1
    assert health.problems[("ethtool", "counter reset")] == 0


def _fec(bits: int, corrected: int, symbols: int) -> str:
    return (f"NIC statistics:\n     rx_bits_phy: {bits}\n     rx_corrected_bits_phy: {corrected}\n"
            f"     rx_pcs_symbol_err_phy: {symbols}\n     tx_bytes_phy: 1\n")


def test_an_unavailable_symbol_counter_does_not_hold_back_the_pre_fec_ber() -> None:
    """``rx_pcs_symbol_err_phy`` all ones at every poll held back all three FEC counters: the
    pre-FEC BER became the average since the last reading of all three (a link at 1e-3 read
    1.1e-4, under the KP4 limit 2.4e-4), and after a driver reload it stayed NaN with a reset
    counted at every poll."""
    health = PipelineHealth()
    tracker = FecTracker(health)
    bits = corrected = 0
    ber = []
    for i in range(10):
        bits += 10**12
        corrected += 10**3 if i < 9 else 10**9  # 1e-9, then 1e-3 in the last interval
        symbols = 0 if i == 0 else 2**64 - 1
        ber.append(stats_batches({"h/eth0": _fec(bits, corrected, symbols)}, float(i), health, tracker)[1]
                   .column("prefec_ber")[0])
    assert math.isnan(ber[0]) and ber[1:9] == pytest.approx([1e-9] * 8)
    assert ber[9] == pytest.approx(1e-3)
    # a driver reload while the symbol counter is unavailable: one poll without a BER, one reset
    health = PipelineHealth()
    tracker = FecTracker(health)
    bits = corrected = 0
    ber = []
    for i in range(10):
        if i == 6:
            bits = corrected = 0
        bits += 10**12
        corrected += 10**3
        symbols = 0 if i < 4 else 2**64 - 1
        ber.append(stats_batches({"h/eth0": _fec(bits, corrected, symbols)}, float(i), health, tracker)[1]
                   .column("prefec_ber")[0])
    assert [i for i, b in enumerate(ber) if math.isnan(b)] == [0, 6]
    assert health.problems[("ethtool", "counter reset")] == 1


def test_post_fec_ber_keeps_its_own_baseline_across_an_unavailable_symbol_counter() -> None:
    """The symbol counter unavailable for a poll: the post-FEC BER after it spans both polls, the
    pre-FEC BER of each poll its own interval."""
    tracker = FecTracker(PipelineHealth())
    readings = [(10**12, 100, 10), (2 * 10**12, 300, 2**64 - 1), (3 * 10**12, 600, 30)]
    out = [tracker.update("p", parse_ethtool_stats(_fec(*r))) for r in readings]
    assert all(math.isnan(x) for x in out[0])
    assert out[1][0] == pytest.approx(200 / 10**12) and math.isnan(out[1][1])
    assert out[2][0] == pytest.approx(300 / 10**12)
    assert out[2][1] == pytest.approx(20 / (2 * 10**12))  # from poll 0, bits and symbols alike


@pytest.mark.parametrize("text", ["+7", "1_000", "\u0667", "-0"])
def test_values_no_kernel_prints_are_malformed(text: str) -> None:
    """``%llu`` prints ASCII digits; ``int()`` also took a sign, underscores and other scripts' digits."""
    health = PipelineHealth()
    assert parse_ethtool_stats(f"NIC statistics:\n     link_down_events_phy: {text}\n", health) == {}
    assert health.problems[("ethtool", "malformed counter line")] == 1
