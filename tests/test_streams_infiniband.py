"""IB/RoCE sysfs port counters -> link samples, on a fixture tree with the kernel's layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from foreshock.health import PipelineHealth
from foreshock.streams.infiniband import (
    InfinibandSource,
    list_ports,
    parse_rate,
    parse_state,
    port_topology,
    read_infiniband,
)

PORT_COUNTERS = {
    "port_xmit_data": 123456789, "port_rcv_data": 987654321, "port_xmit_wait": 2490000000,
    "symbol_error": 3, "link_downed": 1, "link_error_recovery": 2, "port_rcv_errors": 0,
    "port_xmit_discards": 5, "excessive_buffer_overrun_errors": 0, "local_link_integrity_errors": 0,
    "port_rcv_packets": 555, "port_xmit_packets": 444, "VL15_dropped": 0,
    "port_rcv_constraint_errors": 0, "port_xmit_constraint_errors": 0, "port_rcv_remote_physical_errors": 0,
}
ROCE_HW_COUNTERS = {"np_ecn_marked_roce_packets": 9100, "np_cnp_sent": 9000, "rp_cnp_handled": 7000,
                    "out_of_buffer": 0, "out_of_sequence": 12, "packet_seq_err": 0}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_port(root: Path, dev: str, port: str, layer: str, rate: str, counters: dict[str, int],
              hw: dict[str, int]) -> Path:
    """One port as the kernel lays it out: numbers end with a newline."""
    base = root / dev / "ports" / port
    for name, value in counters.items():
        write(base / "counters" / name, f"{value}\n")
    for name, value in hw.items():
        write(base / "hw_counters" / name, f"{value}\n")
    write(base / "state", "4: ACTIVE\n")
    write(base / "phys_state", "5: LinkUp\n")
    write(base / "rate", rate + "\n")
    write(base / "link_layer", layer + "\n")
    write(base / "lid", "0x12\n")
    (base / "gids").mkdir(exist_ok=True)
    return base


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "infiniband"
    make_port(root, "mlx5_0", "1", "InfiniBand", "400 Gb/sec (4X NDR)", PORT_COUNTERS, {"out_of_buffer": 0})
    roce = make_port(root, "mlx5_1", "1", "Ethernet", "200 Gb/sec (4X HDR)",
                     {**PORT_COUNTERS, "port_xmit_wait": 17}, ROCE_HW_COUNTERS)
    # A missing counter file and one that cannot be read (a folder where the file should be:
    # tests run as root, so permissions cannot make a file unreadable).
    (roce / "counters" / "symbol_error").unlink()
    link_downed = roce / "counters" / "link_downed"
    link_downed.unlink()
    link_downed.mkdir()
    write(roce / "counters" / "port_rcv_errors", "garbage\n")
    return root


def by_link(batch) -> dict[str, dict[str, float]]:
    out = {}
    for i, name in enumerate(batch.entity_names()):
        out[name] = {k: float(v[i]) for k, v in batch.columns.items() if not np.isnan(v[i])}
    return out


def test_parse_state_and_rate() -> None:
    assert parse_state("4: ACTIVE\n") == 4.0
    assert parse_state("1: DOWN") == 1.0
    assert parse_rate("400 Gb/sec (4X NDR)\n") == 4.0e11
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5e9
    with pytest.raises(ValueError):
        parse_rate("unknown")


def test_walks_ports_with_exact_values_and_counts_problems(sysfs: Path) -> None:
    health = PipelineHealth()
    batch = read_infiniband(sysfs, host="node1", ts=50.0, health=health)
    assert list_ports(sysfs) == [("mlx5_0", "1"), ("mlx5_1", "1")]
    rows = by_link(batch)
    assert set(rows) == {"node1/mlx5_0/1", "node1/mlx5_1/1"}
    ib = rows["node1/mlx5_0/1"]
    assert ib == {
        "tx_data": 123456789 * 4.0, "rx_data": 987654321 * 4.0, "xmit_wait": 2490000000.0,
        "symbol_error": 3.0, "link_downed": 1.0, "link_error_recovery": 2.0, "rcv_errors": 0.0,
        "xmit_discards": 5.0, "buffer_overrun_errors": 0.0, "link_integrity_errors": 0.0,
        "link_state": 4.0, "link_rate": 4.0e11,
    }  # no ECN/CNP columns: RoCE-only counters are absent on an InfiniBand port, and that is fine
    roce = rows["node1/mlx5_1/1"]
    assert (roce["ecn_marked"], roce["cnp_sent"], roce["cnp_handled"]) == (9100.0, 9000.0, 7000.0)
    assert roce["xmit_wait"] == 17.0 and roce["link_rate"] == 2.0e11
    assert "symbol_error" not in roce and "link_downed" not in roce and "rcv_errors" not in roce
    assert batch.ts.tolist() == [50.0, 50.0]
    assert health.problems == {
        ("infiniband", "counter file missing"): 1,
        ("infiniband", "unreadable counter file"): 1,
        ("infiniband", "non-numeric counter value"): 1,
    }


def test_io_error_on_read_is_counted(sysfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.read_text

    def flaky(self: Path, *args: object, **kwargs: object) -> str:
        if self.name == "port_xmit_wait" and "mlx5_0" in str(self):
            raise OSError(5, "Input/output error")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", flaky)
    health = PipelineHealth()
    rows = by_link(read_infiniband(sysfs, host="n", health=health))
    assert "xmit_wait" not in rows["n/mlx5_0/1"]
    assert health.problems[("infiniband", "unreadable counter file")] == 2  # this one + the folder


def test_missing_root_gives_nothing_and_says_so(tmp_path: Path) -> None:
    """A wrong --root made `record` say "the counted problems above say why" with none counted."""
    health = PipelineHealth()
    assert len(read_infiniband(tmp_path / "absent", host="n", health=health)) == 0
    assert list_ports(tmp_path / "absent") == []
    assert health.problems == {("infiniband", "no InfiniBand ports found"): 1}
    (tmp_path / "empty").mkdir()
    read_infiniband(tmp_path / "empty", host="n", health=health)
    assert health.problems == {("infiniband", "no InfiniBand ports found"): 2}


def test_source_polls_into_a_derived_topology(sysfs: Path) -> None:
    health = PipelineHealth()
    source = InfinibandSource(sysfs, interval=0.02, host="node1", health=health, max_polls=2)
    frames = list(source)
    topo = source.topology
    assert topo is not None and topo.links == ["node1/mlx5_0/1", "node1/mlx5_1/1"]
    assert len(frames) == 2 and frames[0].ts[0] <= frames[1].ts[0]
    ib = topo.slot("link", "node1/mlx5_0/1")
    assert frames[1].columns["xmit_wait"][frames[1].slot.tolist().index(ib)] == 2490000000.0
    assert port_topology("node1", [("mlx5_0", "1")]).switches == ["node1/mlx5_0", "unknown-peer"]
    # the counter file the fixture's port lacks counts at the first poll, not at every poll (the
    # driver will not grow it); a file it cannot read, or a value it cannot parse, at every poll
    assert health.problems[("infiniband", "counter file missing")] == 1
    assert health.problems[("infiniband", "unreadable counter file")] == 2
    assert health.problems[("infiniband", "non-numeric counter value")] == 2


def test_ports_map_onto_a_cluster_topology(sysfs: Path, small_topology) -> None:
    names = {"mlx5_0/1": "node0/gpu0~leaf0", "mlx5_1/1": "node0/gpu1~leaf1"}
    batch = read_infiniband(sysfs, host="node0", link_names=names)
    frame = batch.to_frame(small_topology)
    assert sorted(frame.slot.tolist()) == [small_topology.slot("link", n) for n in sorted(names.values())]


def test_counters_stuck_at_their_native_maximum_are_counted_once_each(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """PortCounters saturate at their native width (the kernel's sysfs.c: link_downed 8 bits,
    symbol_error 16, local_link_integrity_errors 4, port_xmit_wait 32). A link_downed stuck at 255
    read as "no downs" from then on, with nothing counted or logged. Counted once per counter while
    it stays there, named in a log line saying how to clear it; one below its maximum, or a
    cleared one, is not; a cleared one that gets there again counts again."""
    root = tmp_path / "infiniband"
    counters = {**PORT_COUNTERS, "link_downed": 255, "symbol_error": 65535, "local_link_integrity_errors": 15,
                "port_xmit_discards": 65534, "link_error_recovery": 254, "port_xmit_wait": 2**32 - 1}
    base = make_port(root, "mlx5_0", "1", "InfiniBand", "400 Gb/sec (4X NDR)", counters, {})
    health = PipelineHealth()
    saturated: set[str] = set()
    with caplog.at_level("WARNING", logger="foreshock.infiniband"):
        rows = by_link(read_infiniband(root, host="n", health=health, saturated=saturated))
        read_infiniband(root, host="n", health=health, saturated=saturated)  # still there: not again
    # the values go on as read: the increase up to the maximum was real
    assert (rows["n/mlx5_0/1"]["link_downed"], rows["n/mlx5_0/1"]["symbol_error"]) == (255.0, 65535.0)
    reason = ("infiniband", next(r for (_, r) in health.problems if "saturated" in r))
    assert "perfquery -R" in reason[1]
    assert health.problems[reason] == 4
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "foreshock.infiniband"]
    assert sorted(line.split(" ", 1)[0] for line in lines) == [
        "mlx5_0/1/link_downed", "mlx5_0/1/local_link_integrity_errors", "mlx5_0/1/port_xmit_wait",
        "mlx5_0/1/symbol_error"]
    assert all("perfquery -R" in line for line in lines)
    # cleared (perfquery -R), then back at the top: counted again; the others stay counted once
    write(base / "counters" / "link_downed", "0\n")
    read_infiniband(root, host="n", health=health, saturated=saturated)
    write(base / "counters" / "link_downed", "255\n")
    read_infiniband(root, host="n", health=health, saturated=saturated)
    assert health.problems[reason] == 5
    # without a source's memory, every reading counts (as every other problem of a lone reading)
    lone = PipelineHealth()
    read_infiniband(root, host="n", health=lone)
    assert lone.problems[reason] == 4


def test_a_legacy_data_counter_stuck_at_2_32_minus_1_is_counted_at_its_second_reading(tmp_path: Path) -> None:
    """port_xmit_data / port_rcv_data from 32-bit PortCounters stop at 2**32-1, and the link then reads
    as idle, uncounted. A 64-bit one passes 2**32-1 once: only two consecutive readings there count."""
    root = tmp_path / "infiniband"
    base = make_port(root, "mlx5_0", "1", "InfiniBand", "400 Gb/sec (4X NDR)",
                     {**PORT_COUNTERS, "port_xmit_data": 4294967295}, {})
    health, saturated = PipelineHealth(), set[str]()

    def saturated_count() -> int:
        return sum(n for (_, reason), n in health.problems.items() if "saturated" in reason)

    read_infiniband(root, host="n", health=health, saturated=saturated)
    assert saturated_count() == 0  # once there: a 64-bit counter on its way up
    rows = by_link(read_infiniband(root, host="n", health=health, saturated=saturated))
    assert saturated_count() == 1
    assert rows["n/mlx5_0/1"]["tx_data"] == 4294967295 * 4  # the value goes on as read (4-byte words)
    read_infiniband(root, host="n", health=health, saturated=saturated)
    assert saturated_count() == 1  # still there: counted once
    # cleared, then passing 2**32-1 once on the way up: not counted; stopping there again: counted again
    for value in (10, 4294967295, 4294967296, 4294967295, 4294967295):
        write(base / "counters" / "port_xmit_data", f"{value}\n")
        read_infiniband(root, host="n", health=health, saturated=saturated)
    assert saturated_count() == 2


def test_a_port_gone_before_its_files_are_read_is_read_as_gone(sysfs: Path) -> None:
    """A port listed, then gone before its files were read (an HCA reset between the listing and the
    reads), had an all-NaN row and 15 "counter file missing", and its names stayed in the source's
    count-once set, so a counter really missing after it came back was never counted."""
    import shutil

    ports = list_ports(sysfs)
    shutil.rmtree(sysfs / "mlx5_1")
    health, once, missing = PipelineHealth(), set[str](), set[str]()
    expected = {"mlx5_0/1": "n/mlx5_0/1", "mlx5_1/1": "n/mlx5_1/1"}
    rows = by_link(read_infiniband(sysfs, host="n", health=health, once=once, expected=expected, missing=missing,
                                   ports=ports))
    assert rows["n/mlx5_1/1"] == {"link_state": 1.0}  # DOWN, as a port not listed
    assert health.problems[("infiniband", "port disappeared")] == 1
    assert health.problems[("infiniband", "counter file missing")] == 0
    assert not [key for key in once if key.startswith("mlx5_1/")]
    # back, without its symbol_error file: that is counted
    make_port(sysfs, "mlx5_1", "1", "Ethernet", "200 Gb/sec (4X HDR)",
              {k: v for k, v in PORT_COUNTERS.items() if k != "symbol_error"}, ROCE_HW_COUNTERS)
    read_infiniband(sysfs, host="n", health=health, once=once, expected=expected, missing=missing)
    assert health.problems[("infiniband", "counter file missing")] == 1


def test_a_device_gone_during_the_listing_reads_as_gone_not_a_failed_poll(
        sysfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An HCA reset between list_ports' is_dir() of ``<dev>/ports`` and its iterdir() raised
    FileNotFoundError out of the poll: every port's reading lost, counted only as "poll failed"."""
    import shutil

    health = PipelineHealth()
    source = InfinibandSource(sysfs, interval=0.02, host="n", health=health, max_polls=1)
    real = Path.iterdir

    def racing(self: Path):  # type: ignore[no-untyped-def]
        if self == sysfs / "mlx5_1" / "ports" and self.exists():
            shutil.rmtree(sysfs / "mlx5_1")
        return real(self)

    monkeypatch.setattr(Path, "iterdir", racing)
    frames = list(source)
    assert len(frames) == 1
    rows = {source.topology.links[s]: float(v)  # type: ignore[union-attr]
            for s, v in zip(frames[0].slot.tolist(), frames[0].columns["link_state"])}
    assert rows == {"n/mlx5_0/1": 4.0, "n/mlx5_1/1": 1.0}  # the other port read, the gone one DOWN
    assert health.problems[("infiniband", "port disappeared")] == 1
    assert health.problems[("infiniband", "poll failed")] == 0


@pytest.mark.parametrize("text", ["-7", "+7", "1_000", "\u0667", str(2**64 + 5), "0x1", ""])
def test_counter_text_no_kernel_prints_is_counted_not_read(tmp_path: Path, text: str) -> None:
    """``float(int(text))`` took a sign, underscores, other scripts' digits and values no u64 holds."""
    base = make_port(tmp_path, "mlx5_0", "1", "InfiniBand", "400 Gb/sec (4X NDR)", PORT_COUNTERS, {})
    write(base / "counters" / "link_downed", text + "\n")
    health = PipelineHealth()
    rows = by_link(read_infiniband(tmp_path, host="n", health=health))
    assert "link_downed" not in rows["n/mlx5_0/1"] and rows["n/mlx5_0/1"]["symbol_error"] == 3.0
    assert dict(health.problems) == {("infiniband", "non-numeric counter value"): 1}


def test_counter_values_at_their_limits_are_read(tmp_path: Path) -> None:
    base = make_port(tmp_path, "mlx5_0", "1", "InfiniBand", "400 Gb/sec (4X NDR)", PORT_COUNTERS, {})
    write(base / "counters" / "port_xmit_data", f"{2**64 - 2}\n")
    write(base / "counters" / "symbol_error", "7\r\n")
    health = PipelineHealth()
    row = by_link(read_infiniband(tmp_path, host="n", health=health))["n/mlx5_0/1"]
    assert row["tx_data"] == float(2**64 - 2) * 4 and row["symbol_error"] == 7.0
    assert not health.problems


@pytest.mark.parametrize("text", ["nan: ACTIVE", "inf: ACTIVE", "-4: ACTIVE", "9: UNKNOWN", "ACTIVE", ""])
def test_a_state_that_is_no_known_port_state_is_counted_and_nan(tmp_path: Path, text: str) -> None:
    """``nan: ACTIVE`` read as NaN and ``-4: ACTIVE`` as -4, neither counted."""
    base = make_port(tmp_path, "mlx5_0", "1", "InfiniBand", "400 Gb/sec (4X NDR)", PORT_COUNTERS, {})
    write(base / "state", text + "\n")
    health = PipelineHealth()
    row = by_link(read_infiniband(tmp_path, host="n", health=health))["n/mlx5_0/1"]
    assert "link_state" not in row and row["symbol_error"] == 3.0  # no state: NaN in its frame
    assert dict(health.problems) == {("infiniband", "non-numeric counter value"): 1}
    with pytest.raises(ValueError):
        parse_state(text)
