"""The real Alibaba pre-FEC BER series -> optic samples with a channel topology."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from foreshock.health import PipelineHealth
from foreshock.streams.alibaba import read_alibaba

CSV = "optics/alibaba_prefec_ber.csv"
JAN1 = datetime(2000, 1, 1, tzinfo=timezone.utc).timestamp()


@pytest.fixture(scope="module")
def imported(shared_data: Path):
    health = PipelineHealth()
    return read_alibaba(shared_data / CSV, health=health), health


def test_ends_channels_and_topology(imported) -> None:
    result, _ = imported
    topo = result.topology
    assert len(result.optic_of_end) == 50  # distinct (device, logical port) ends with data
    assert len(topo.links) == 25  # each channel has an A end and a Z end
    assert topo.size("optic") == 50
    # ot1 channel 1 runs from T1 /1/6/L1 (side A) to T3 /1/1/L1 (side Z).
    assert result.optic_of_end["T1/1/6/L1"] == "ot1/och1#a"
    assert result.optic_of_end["T3/1/1/L1"] == "ot1/och1#b"
    link = topo.slot("link", "ot1/och1")
    assert topo.switches[topo.link_a_switch[link]] == "T1"
    assert topo.switches[topo.link_b_switch[link]] == "T3"


def test_first_values_exactly(imported) -> None:
    result, _ = imported
    frame = result.batch.to_frame(result.topology)
    slot = result.topology.slot("optic", result.optic_of_end["T3/1/1/L1"])
    rows = np.flatnonzero(frame.slot == slot)
    # CSV: T3,/1/1/L1,preFecBer,avg,0.00185,1,191400000,1,2000/1/1 00:00,Z,ot1
    assert frame.ts[rows[0]] == JAN1
    assert frame.columns["prefec_ber"][rows[0]] == 0.00185
    assert np.all(np.diff(frame.ts) >= 0)  # time-ordered for replay


def test_counts_and_skips(imported) -> None:
    result, health = imported
    assert len(result.batch) == 10322  # the avg rows
    assert health.problems == {("alibaba", "blank row"): 376}
    assert result.skipped == {"stats_type max (imported: avg)": 10322, "stats_type min (imported: avg)": 4128,
                              "stats_type instant (imported: avg)": 4128}
    assert result.batch.ts.max() == datetime(2000, 1, 15, 7, tzinfo=timezone.utc).timestamp()


def test_other_statistic_and_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "ber.csv"
    path.write_text(
        "device_name,logical_name,item,stats_type,value,och,center_frequency,och_group,time,side,pn\n"
        "T1,/1/1/L1,preFecBer,max,0.002,1,191400000,1,2000/1/1 00:00,A,ot1\n"
        "T2,/1/1/L1,preFecBer,max,abc,1,191400000,1,2000/1/1 00:00,Z,ot1\n"
        "T2,/1/1/L1,preFecBer,max,NaN,1,191400000,1,2000/1/1 01:00,Z,ot1\n"
        "T2,/1/1/L1,preFecBer,max,0.001,1,191400000,1,someday,Z,ot1\n"
        "T2,/1/1/L1,preFecBer,max,0.001,1,191400000,1,2000/1/1 02:00,Q,ot1\n"
        "T2,/1/1/L1,preFecBer,max,0.001\n"
    )
    health = PipelineHealth()
    result = read_alibaba(path, stat="max", health=health)
    assert result.batch.entity_names() == ["ot1/och1#a"]
    assert result.batch.columns["prefec_ber"].tolist() == [0.002]
    assert health.problems == {("alibaba", "non-numeric value"): 1, ("alibaba", "NaN or negative BER"): 1,
                               ("alibaba", "bad timestamp"): 1, ("alibaba", "unknown channel side"): 1,
                               ("alibaba", "row with wrong column count"): 1}
    with pytest.raises(ValueError, match="stat must be"):
        read_alibaba(path, stat="median")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="missing columns"):
        read_alibaba(tmp_path / "other.csv")


HEADER = "device_name,logical_name,item,stats_type,value,och,center_frequency,och_group,time,side,pn\n"
FIRST = "T1,/1/1/L1,preFecBer,avg,0.002,1,191400000,1,2000/1/1 00:00,A,ot1\r\n"
LAST = "T2,/1/1/L1,preFecBer,avg,0.00185,1,191400000,1,2000/1/1 00:00,Z,ot1"


@pytest.mark.parametrize("cut", [len(LAST), len(LAST) - 1, LAST.index("0.00185") + 6])
def test_a_last_line_without_its_line_feed_is_left_out_and_counted(tmp_path: Path, cut: int) -> None:
    """A copy cut inside its last line: ``ot1`` read as ``ot`` (a plane with no FEC limit) or a BER
    of ``0.0018`` for ``0.00185`` would import as readings that look real. Whole or cut, a last line
    without its line feed cannot be told apart, so it is left out, counted, and the rest read."""
    path = tmp_path / "ber.csv"
    path.write_text(HEADER + FIRST + LAST[:cut], newline="")
    health = PipelineHealth()
    result = read_alibaba(path, health=health)
    assert result.batch.entity_names() == ["ot1/och1#a"] and result.batch.columns["prefec_ber"].tolist() == [0.002]
    assert health.problems == {("alibaba", "truncated row"): 1}
    path.write_text(HEADER + FIRST + LAST + "\n", newline="")  # the same line, ended: read
    whole = read_alibaba(path, health=PipelineHealth())
    assert sorted(whole.batch.columns["prefec_ber"].tolist()) == [0.00185, 0.002]


def test_an_unended_row_of_empty_cells_is_a_blank_row(tmp_path: Path) -> None:
    """The published file ends on ``,,,,,,,,,,`` without a line feed: nothing cut there."""
    path = tmp_path / "ber.csv"
    path.write_text(HEADER + FIRST + ",,,,,,,,,,", newline="")
    health = PipelineHealth()
    assert read_alibaba(path, health=health).batch.columns["prefec_ber"].tolist() == [0.002]
    assert health.problems == {("alibaba", "blank row"): 1}
