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


def _row(device: str, value: str = "0.001", och: int = 1, side: str = "A", hour: int = 0, stat: str = "avg",
         pn: str = "ot1") -> str:
    return f"{device},/1/1/L1,preFecBer,{stat},{value},{och},191400000,1,2000/1/1 {hour:02d}:00,{side},{pn}\n"


def test_a_row_with_bytes_that_are_not_utf8_is_counted_and_the_rest_read(tmp_path: Path) -> None:
    """One Latin-1 byte (a cell saved by a legacy editor) had stopped the whole import."""
    path = tmp_path / "ber.csv"
    path.write_bytes((HEADER + _row("T1") + _row("T2", side="Z")).encode()
                     + _row("T3", och=2).encode().replace(b"T3", b"T\xe93") + _row("T4", och=2, side="Z").encode())
    health = PipelineHealth()
    result = read_alibaba(path, health=health)
    assert health.problems == {("alibaba", "undecodable bytes"): 1}
    assert result.batch.entity_names() == ["ot1/och1#a", "ot1/och1#b", "ot1/och2#b"]


def test_an_end_under_two_channel_sides_is_counted_not_merged(tmp_path: Path) -> None:
    """T1's row as channel 2's A end had moved its optic there: channel 1's A optic had no data
    and channel 2's had two values an hour."""
    path = tmp_path / "ber.csv"
    path.write_text(HEADER + _row("T1", "0.001") + _row("T2", "0.002", side="Z")
                    + _row("T1", "0.009", och=2) + _row("T3", "0.003", och=2, side="Z"))
    health = PipelineHealth()
    result = read_alibaba(path, health=health)
    assert health.problems == {("alibaba", "end listed under two channel sides"): 1}
    assert result.optic_of_end == {"T1/1/1/L1": "ot1/och1#a", "T2/1/1/L1": "ot1/och1#b", "T3/1/1/L1": "ot1/och2#b"}
    frame = result.batch.to_frame(result.topology)
    assert dict(zip((result.topology.names("optic")[s] for s in frame.slot), frame.columns["prefec_ber"])) == {
        "ot1/och1#a": 0.001, "ot1/och1#b": 0.002, "ot1/och2#b": 0.003}


def test_a_channel_side_goes_to_the_first_valid_row_that_names_it(tmp_path: Path) -> None:
    """One stray row with a value that is no number, of a statistic not imported at that, had
    claimed the side, and the 24 genuine rows of its end were refused as a second claim."""
    path = tmp_path / "ber.csv"
    path.write_text(HEADER + _row("T9", "garbage", stat="max", hour=0)
                    + "".join(_row("T1", hour=h) + _row("T2", side="Z", hour=h) for h in range(24)))
    health = PipelineHealth()
    result = read_alibaba(path, health=health)
    assert health.problems == {("alibaba", "non-numeric value"): 1} and not result.skipped
    assert len(result.batch) == 48 and result.optic_of_end == {"T1/1/1/L1": "ot1/och1#a", "T2/1/1/L1": "ot1/och1#b"}
    topo = result.topology
    assert topo.switches[topo.link_a_switch[topo.slot("link", "ot1/och1")]] == "T1"


def test_a_ber_over_one_half_is_counted(tmp_path: Path) -> None:
    """A bit error ratio over 0.5 (``7``: another unit, a shifted column) is no reading."""
    path = tmp_path / "ber.csv"
    path.write_text(HEADER + _row("T1", "0.5") + _row("T2", "7", side="Z") + _row("T2", "0.5000001", side="Z", hour=1))
    health = PipelineHealth()
    result = read_alibaba(path, health=health)
    assert health.problems == {("alibaba", "BER over 0.5"): 2}
    assert result.batch.columns["prefec_ber"].tolist() == [0.5]


def test_the_links_of_a_plane_without_a_known_fec_limit_are_kept_and_counted(tmp_path: Path) -> None:
    """They had imported silently with the optics detector's 400G KP4 limit, far below these
    transponders'."""
    path = tmp_path / "ber.csv"
    path.write_text(HEADER + _row("T1") + _row("T2", side="Z") + _row("T3", och=1, pn="ot3")
                    + _row("T4", och=1, pn="ot3", side="Z") + _row("T5", och=2, pn="ot3"))
    health = PipelineHealth()
    result = read_alibaba(path, health=health)
    assert health.problems == {("alibaba", "link of a plane without a known FEC limit"): 2}
    topo = result.topology
    assert topo.links == ["ot1/och1", "ot3/och1", "ot3/och2"] and len(result.batch) == 5
    assert topo.link_fec_limit[0] == 3.7e-2 and np.isnan(topo.link_fec_limit[1:]).all()
