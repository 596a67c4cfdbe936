"""Review r92: InfiniBand counters reading the kernel's ``N/A (no PMA)``, ethtool -m lane numbers
out of range, and recording parts on disk that recording.json does not list."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.recording import Recording, RecordingWriter
from foreshock.streams.dom import MAX_LANES, dom_batch, parse_ethtool_m
from foreshock.streams.infiniband import NOT_AVAILABLE, read_infiniband
from foreshock.topology import Topology

# ---- InfiniBand: "N/A (no PMA)" (drivers/infiniband/core/sysfs.c show_pma_counter) -------------


def _no_pma_port(root: Path) -> None:
    """An iWARP/RoCE device without a PMA: every PortCounters file reads ``N/A (no PMA)``, except
    one garbled counter (still bad input) and the port's state and rate."""
    base = root / "irdma0" / "ports" / "1"
    (base / "counters").mkdir(parents=True)
    for name in ("port_xmit_data", "port_rcv_data", "port_xmit_wait", "symbol_error", "link_downed"):
        (base / "counters" / name).write_text("N/A (no PMA)\n")
    (base / "counters" / "port_rcv_errors").write_text("garbage\n")
    (base / "link_layer").write_text("Ethernet\n")
    (base / "state").write_text("4: ACTIVE\n")
    (base / "rate").write_text("100 Gb/sec (4X EDR)\n")


def test_a_counter_reading_no_pma_is_not_available_counted_once_per_counter(tmp_path: Path) -> None:
    """It was "non-numeric counter value" for every counter at every poll: the problem counter
    climbed forever on a healthy host. Now it is a counter the port does not serve (no value),
    counted the first time like a missing file; a garbled counter still counts at every poll."""
    _no_pma_port(tmp_path)
    health = PipelineHealth()
    once: set[str] = set()
    for poll in range(3):
        batch = read_infiniband(tmp_path, "n1", float(poll), health, once=once)
        values = {name: float(column[0]) for name, column in batch.columns.items() if not np.isnan(column[0])}
        assert values == {"link_state": 4.0, "link_rate": 1e11}  # no value for a counter not served
    assert health.problems[("infiniband", NOT_AVAILABLE)] == 5
    assert health.problems[("infiniband", "non-numeric counter value")] == 3


# ---- ethtool -m: lane numbers outside 1..MAX_LANES --------------------------------------------

GOOD = """\tIdentifier : 0x11 (QSFP28)
\tModule temperature : 45.22 degrees C / 113.39 degrees F
\tLaser tx bias current (Channel 1) : 8.162 mA
\tRcvr signal avg optical power(Channel 1) : 0.5000 mW / -3.01 dBm
"""


@pytest.mark.parametrize("lane", ["4294967297", "0", str(MAX_LANES + 1), "9" * 5000])
def test_a_lane_number_out_of_range_is_counted_and_the_other_modules_kept(lane: str) -> None:
    """4294967297 raised OverflowError (the int32 lane array) and 5000 digits ValueError (int()'s
    digit limit) out of the parser: the poll failed whole, every module of the node lost."""
    bad = GOOD.replace("(Channel 1) : 8.162", f"(Channel {lane}) : 8.162")
    health = PipelineHealth()
    batch, modules = dom_batch({"n1/eth0#a": GOOD, "n1/eth1#a": bad}, 1.0, health)
    assert sorted(batch.entity_names()) == ["n1/eth0#a", "n1/eth1#a"]
    assert modules["n1/eth1#a"].lanes.tolist() == [1] and np.isnan(modules["n1/eth1#a"].tx_bias[0])
    assert health.problems == {("dom", "bad lane number"): 1}


def test_the_highest_lane_ethtool_numbers_is_read() -> None:
    dom = parse_ethtool_m(GOOD.replace("(Channel 1) : 8.162", f"(Channel {MAX_LANES}) : 8.162"))
    assert dom.lanes.tolist() == [1, MAX_LANES] and dom.tx_bias[1] == pytest.approx(8.162e-3)


# ---- recordings: closed parts recording.json does not list -------------------------------------


def _tick(t: int) -> Frame:
    return Frame("gpu", np.full(2, 100.0 + t), np.arange(2), {"gpu_temp": np.full(2, 40.0 + t)})


@pytest.fixture
def topology() -> Topology:
    return Topology.from_gpu_hosts([("n1", 0), ("n1", 1)])


def _killed_after_rename(path: Path, topology: Topology) -> None:
    """A live recorder killed after commit() renamed its second part into place, before it
    rewrote recording.json: the list on disk is the one the first commit wrote."""
    clock = [0.0]
    w = RecordingWriter(path, topology, {"interval": 1.0}, segment_s=10.0, clock=lambda: clock[0])
    for t in range(15):  # the first part closes at tick 10
        clock[0] = float(t)
        w.write(_tick(t))
    listed = (path / "recording.json").read_text()
    w.commit()  # ticks 11-14 into gpu.00001.parquet, listed ...
    (path / "recording.json").write_text(listed)  # ... by a rewrite the kill never let happen


def test_a_part_closed_after_the_list_was_last_written_is_read(tmp_path: Path, topology: Topology,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """It was dropped: 11 ticks of 15 read, and the warning named no lost file."""
    _killed_after_rename(tmp_path / "rec", topology)
    assert json.loads((tmp_path / "rec" / "recording.json").read_text())["parts"] == {"gpu": 1}
    with caplog.at_level(logging.WARNING, logger="foreshock.recording"):
        rec = Recording.open(tmp_path / "rec")
    gpu = rec.read_kind("gpu")
    assert len(gpu) == 15 * 2 and np.array_equal(np.unique(gpu.ts), 100.0 + np.arange(15))
    assert rec.meta["parts"] == {"gpu": 2} and rec.meta["rows"] == {"gpu": 30} and rec.meta["end"] == 114.0
    assert "gpu.00001.parquet closed after recording.json was last written" in caplog.text
    assert "ends at 1970-01-01 00:01:54 UTC" in caplog.text  # the end the parts read hold


def test_a_folder_without_recording_json_reads_every_closed_part_and_says_so(
        tmp_path: Path, topology: Topology, caplog: pytest.LogCaptureFixture) -> None:
    """Only gpu.parquet was read, with no warning: 11 ticks of 25."""
    clock = [0.0]
    with RecordingWriter(tmp_path / "rec", topology, {"interval": 1.0}, segment_s=10.0,
                         clock=lambda: clock[0]) as w:
        for t in range(25):
            clock[0] = float(t)
            w.write(_tick(t))
    (tmp_path / "rec" / "recording.json").unlink()
    with caplog.at_level(logging.WARNING, logger="foreshock.recording"):
        rec = Recording.open(tmp_path / "rec")
    assert rec.kinds() == ["gpu"] and len(rec.part_files("gpu")) == 3
    assert len(rec.read_kind("gpu")) == 25 * 2
    assert "no recording.json" in caplog.text and "gpu.00002.parquet" in caplog.text


def test_a_part_a_closed_recording_does_not_list_is_named_not_read(tmp_path: Path, topology: Topology,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A recording closed properly lists all its parts: one more on disk belongs to something
    else (a copy merged into the folder). It was ignored in silence."""
    clock = [0.0]
    with RecordingWriter(tmp_path / "rec", topology, {"interval": 1.0}, segment_s=10.0,
                         clock=lambda: clock[0]) as w:
        for t in range(15):
            clock[0] = float(t)
            w.write(_tick(t))
    stray = tmp_path / "rec" / "gpu.00002.parquet"
    stray.write_bytes((tmp_path / "rec" / "gpu.00001.parquet").read_bytes())
    with caplog.at_level(logging.WARNING, logger="foreshock.recording"):
        rec = Recording.open(tmp_path / "rec")
    assert len(rec.read_kind("gpu")) == 15 * 2
    assert "gpu.00002.parquet on disk but not listed in recording.json: not read" in caplog.text
