"""dcgm-exporter text -> gpu samples, on the real T4 scrape and on bad input; live scraping."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.health import PipelineHealth
from foreshock.streams.dcgm import DcgmScrapeSource, is_not_supported, parse_dcgm_text
from foreshock.streams.samples import gpu_topology

from board_ids import uuid_number
from local_http import ScrapeServer

T0 = 1_780_000_000.0
LABELS = 'gpu="{gpu}",UUID="GPU-x",device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{host}"'


def line(metric: str, value: str, gpu: int = 0, host: str = "node1", extra: str = "") -> str:
    return f"{metric}{{{LABELS.format(gpu=gpu, host=host)}{extra}}} {value}"


def values(batch, entity: str) -> dict[str, float]:
    row = batch.entities.index(entity)
    at = int(np.flatnonzero(batch.entity == row)[0])
    return {name: float(col[at]) for name, col in batch.columns.items() if not np.isnan(col[at])}


@pytest.fixture(scope="module")
def t4_text(shared_data: Path) -> str:
    return (shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom").read_text()


def test_real_t4_scrape_exact_values_in_base_units(t4_text: str) -> None:
    health = PipelineHealth()
    batch = parse_dcgm_text(t4_text, T0, health)
    # The fixture joins two scrapes: two hosts, GPU 0 on each.
    assert sorted(batch.entities) == ["424773df46e0/gpu0", "551bdf382151/gpu0"]
    first = values(batch, "424773df46e0/gpu0")
    assert first == {
        "sm_clock": 300e6,  # 300 MHz in hertz
        "gpu_temp": 25.0,
        "power": 8.969,
        "energy": 128996.013,  # 128996013 mJ -> J
        "pcie_replays": 0.0,
        "util": 0.0,
        "xid_last": 0.0,
    }
    second = values(batch, "551bdf382151/gpu0")
    assert second == {"slowdown_temp": 93.0, "power_limit": 70.0, "throttle_reasons": 1.0}
    assert batch.ts.tolist() == [T0, T0]
    # MEM_CLOCK, MEM_COPY_UTIL, FB_FREE, FB_USED, NVLINK_BANDWIDTH_TOTAL, PSTATE: not in the table.
    assert health.problems[("dcgm", "unmapped metric ignored")] == 6
    assert health.total_problems() == 6


def test_topology_and_frame_from_labels(t4_text: str) -> None:
    batch = parse_dcgm_text(t4_text, T0)
    topology = gpu_topology([batch])
    assert topology.nodes == ["424773df46e0", "551bdf382151"]
    assert topology.gpus == ["424773df46e0/gpu0", "551bdf382151/gpu0"]
    frame = batch.to_frame(topology)
    row = int(np.flatnonzero(frame.slot == topology.slot("gpu", "424773df46e0/gpu0"))[0])
    assert frame.columns["power"][row] == 8.969
    assert frame.columns["sm_clock"][row] == 3.0e8


def test_not_supported_sentinels_are_dropped_and_counted() -> None:
    text = "\n".join([
        line("DCGM_FI_DEV_GPU_TEMP", "61"),
        line("DCGM_FI_DEV_MEMORY_TEMP", "9223372036854775794"),  # int64 not supported
        line("DCGM_FI_DEV_POWER_USAGE", "140737488355330.000000"),  # fp64 not supported
        line("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "2147483634"),  # int32 not supported
    ])
    health = PipelineHealth()
    batch = parse_dcgm_text(text, T0, health)
    assert values(batch, "node1/gpu0") == {"gpu_temp": 61.0}
    assert health.problems[("dcgm", "not-supported sentinel dropped")] == 3
    assert is_not_supported(float(0x7FFFFFFFFFFFFFF0)) and not is_not_supported(9.0e15)


def test_lowercase_hostname_label_and_missing_host() -> None:
    text = "\n".join([
        'DCGM_FI_DEV_GPU_TEMP{gpu="3",gpu_uuid="GPU-y",hostname="node2"} 44',
        'DCGM_FI_DEV_GPU_TEMP{gpu="1"} 40',
    ])
    batch = parse_dcgm_text(text, T0, default_host="scraped-host")
    assert values(batch, "node2/gpu3") == {"gpu_temp": 44.0}
    assert values(batch, "scraped-host/gpu1") == {"gpu_temp": 40.0}
    assert gpu_topology([batch]).gpus == ["node2/gpu0", "node2/gpu1", "node2/gpu2", "node2/gpu3",
                                          "scraped-host/gpu0", "scraped-host/gpu1"]


def test_a_federated_series_without_hostname_is_named_by_its_scrape_target() -> None:
    """dcgm-exporter run with --no-hostname has no Hostname label; read through Prometheus's
    /federate each series still names its scrape target (``instance``). Until 2026-12-01 both
    nodes' gpu0 became one GPU named after the Prometheus server: 45 and 89 °C read as one GPU
    at 67 °C, counted as a conflict."""
    block = 'gpu="0",UUID="GPU-{u}",device="nvidia0",instance="{inst}",job="dcgm"'
    text = "\n".join([
        f'DCGM_FI_DEV_GPU_TEMP{{{block.format(u="a", inst="node1:9400")}}} 45 1700000000000',
        f'DCGM_FI_DEV_GPU_TEMP{{{block.format(u="b", inst="node2:9400")}}} 89 1700000001000',
        f'DCGM_FI_DEV_GPU_TEMP{{{block.format(u="c", inst="[fd00::3]:9400")}}} 50 1700000001000',
    ])
    health = PipelineHealth()
    batch = parse_dcgm_text(text, T0, health, default_host="prometheus")
    assert values(batch, "node1/gpu0") == {"gpu_temp": 45.0}
    assert values(batch, "node2/gpu0") == {"gpu_temp": 89.0}
    assert values(batch, "fd00::3/gpu0") == {"gpu_temp": 50.0}
    assert not health.problems


def test_a_field_served_under_two_names_is_read_from_the_first_the_table_lists() -> None:
    """The exporter's profiling counter set serves GPU utilisation twice: DCGM_FI_DEV_GPU_UTIL (%)
    and DCGM_FI_PROF_GR_ENGINE_ACTIVE (a ratio measured otherwise). Until 2026-12-01 the two were
    averaged into a value that is neither (100 % and 0.41 read as 0.71) and counted as conflicting
    duplicates at every scrape, which would have kept ForeshockInputProblems firing. Under MIG,
    where the device-level one is not supported, the instances' engine activity is read."""
    text = "\n".join([line("DCGM_FI_DEV_GPU_UTIL", "100"), line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.412"),
                      line("DCGM_FI_DEV_GPU_UTIL", str(0x7FFFFFF2), gpu=1),  # not supported (MIG)
                      line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.3", gpu=1, extra=',GPU_I_ID="1",GPU_I_PROFILE="3g.40gb"'),
                      line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.5", gpu=1, extra=',GPU_I_ID="2",GPU_I_PROFILE="1g.10gb"')])
    health, once = PipelineHealth(), set[str]()
    for _ in range(3):
        batch = parse_dcgm_text(text, T0, health, once=once)
    assert values(batch, "node1/gpu0") == {"util": 1.0}
    assert values(batch, "node1/gpu1") == {"util": pytest.approx((0.3 * 3 + 0.5) / 4)}
    assert dict(health.problems) == {("dcgm", "not-supported sentinel dropped"): 1}


def test_dcgm_4_field_names_are_read() -> None:
    """DCGM 4's field naming standard renamed fields (its python bindings' deprecated-alias table);
    an exporter whose counter list uses the new names must read the same fields."""
    renamed = {"DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": ("hbm_temp", "61", 61.0),
               "DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS": ("slowdown_temp", "89", 89.0),
               "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS": ("power_limit", "700", 700.0),
               "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO": ("util", "0.93", 0.93),
               "DCGM_FI_DEV_XID_ERROR": ("xid_last", "79", 79.0),
               "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": ("pcie_replays", "3", 3.0),
               "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": ("remapped_rows", "1", 1.0)}
    health = PipelineHealth()
    batch = parse_dcgm_text("\n".join(line(m, v) for m, (_, v, _) in renamed.items()), T0, health)
    assert values(batch, "node1/gpu0") == {name: value for name, _, value in renamed.values()}
    assert not health.problems


def test_violation_counters_are_read_as_nanoseconds() -> None:
    """DCGM's violation counters are NVML's violation times, in nanoseconds (dcgm_fields.h: "Power
    Violation time in ns"; dcgm-exporter's counter list said "in us" until NVIDIA/dcgm-exporter#589,
    whose author measured the values). Read as microseconds, a GPU held at its cap for 2.5 s read as
    held for 42 minutes. nvidia-smi's `clocks_event_reasons_counters.*` are microseconds ("[us]")."""
    text = "\n".join([line("DCGM_FI_DEV_POWER_VIOLATION", "2500000000"),
                      line("DCGM_FI_DEV_THERMAL_VIOLATION", "40000000")])
    got = values(parse_dcgm_text(text, T0, PipelineHealth()), "node1/gpu0")
    assert got == {"power_throttle_time": pytest.approx(2.5), "thermal_throttle_time": pytest.approx(0.04)}


def test_mig_instances_fold_into_the_physical_gpu_without_double_counting() -> None:
    mig = ',GPU_I_ID="{id}",GPU_I_PROFILE="{profile}"'
    instances = [("7", "1g.10gb", "0.9"), ("3", "2g.20gb", "0.6"), ("9", "1g.10gb", "0.8")]
    lines = []
    for gi, profile, busy in instances:
        extra = mig.format(id=gi, profile=profile)
        lines += [
            line("DCGM_FI_DEV_POWER_USAGE", "250.5", extra=extra),
            line("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "5000000", extra=extra),
            line("DCGM_FI_DEV_GPU_TEMP", "58", extra=extra),
            line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", busy, extra=extra),
        ]
    lines.append(line("DCGM_FI_DEV_POWER_USAGE", "100", gpu=1))
    health = PipelineHealth()
    batch = parse_dcgm_text("\n".join(lines), T0, health)
    gpu0 = values(batch, "node1/gpu0")
    assert gpu0["power"] == 250.5  # once, not 3 x 250.5
    assert gpu0["energy"] == 5000.0  # once, not summed over instances
    assert gpu0["gpu_temp"] == 58.0
    # slice-weighted: (0.9*1 + 0.6*2 + 0.8*1) / 4
    assert gpu0["util"] == pytest.approx(0.725, abs=1e-12)
    assert values(batch, "node1/gpu1") == {"power": 100.0}
    assert health.total_problems() == 0


def test_conflicting_duplicate_series_are_counted() -> None:
    text = "\n".join([line("DCGM_FI_DEV_GPU_TEMP", "50", extra=',pod="a"'),
                      line("DCGM_FI_DEV_GPU_TEMP", "52", extra=',pod="b"'),
                      line("DCGM_FI_DEV_POWER_USAGE", "300", extra=',pod="a"'),
                      line("DCGM_FI_DEV_POWER_USAGE", "300", extra=',pod="b"')])
    health = PipelineHealth()
    batch = parse_dcgm_text(text, T0, health)
    assert values(batch, "node1/gpu0") == {"gpu_temp": 51.0, "power": 300.0}
    assert health.problems[("dcgm", "conflicting duplicate series")] == 1


@pytest.mark.parametrize("extra", [',pod="{}"', ',GPU_I_ID="{}",GPU_I_PROFILE="3g.40gb"'])
def test_differing_codes_and_bitmasks_are_never_averaged(extra: str) -> None:
    """Two series of one GPU (two exporters, or two MIG instances) with XIDs 79 and 47 and throttle
    masks 0x80 (power brake) and 0x4 (power cap): averaged, they were XID 63 (row remap pending, never
    logged) and 0x42 (hw_thermal, never set). A bitmask gives the bits either sets, a code the
    largest reported; the temperature beside them is still averaged."""
    series = [("79", "128", "60"), ("47", "4", "62"), ("79", "0", "61")]
    text = "\n".join(line(metric, value, extra=extra.format(i))
                     for i, row in enumerate(series)
                     for metric, value in zip(("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                                               "DCGM_FI_DEV_GPU_TEMP"), row))
    health = PipelineHealth()
    got = values(parse_dcgm_text(text, T0, health), "node1/gpu0")
    assert got["xid_last"] == 79.0
    assert got["throttle_reasons"] == float(0x80 | 0x4)
    assert got["gpu_temp"] == pytest.approx(61.0)


def test_bad_input_is_counted_never_raised() -> None:
    text = "\n".join([
        line("DCGM_FI_DEV_GPU_TEMP", "61"),
        line("DCGM_FI_DEV_POWER_USAGE", "lots"),  # non-numeric value
        line("DCGM_FI_DEV_SM_CLOCK", "NaN"),  # NaN
        line("DCGM_FI_DEV_MEMORY_TEMP", "+Inf"),  # infinite
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="node1" 61',  # truncated label block
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="node1} 61',  # unterminated label value
        "DCGM_FI_DEV_GPU_TEMP 61",  # no gpu label
        "DCGM_FI_DEV_GPU_TEMP{gpu=",  # truncated line
        'DCGM_FI_DEV_FOO_BAR{gpu="0"} 1',  # unknown metric
        "# HELP only a comment",
        "",
    ])
    health = PipelineHealth()
    batch = parse_dcgm_text(text, T0, health)
    assert values(batch, "node1/gpu0") == {"gpu_temp": 61.0}
    p = health.problems
    assert p[("dcgm", "non-numeric value")] == 1
    assert p[("dcgm", "NaN value")] == 1
    assert p[("dcgm", "infinite value")] == 1
    assert p[("dcgm", "malformed line")] + p[("dcgm", "malformed labels")] == 3
    assert p[("dcgm", "series without a gpu label")] == 1
    assert p[("dcgm", "unmapped metric ignored")] == 1


def test_line_timestamps_are_used() -> None:
    batch = parse_dcgm_text(line("DCGM_FI_DEV_GPU_TEMP", "61") + " 1780000123456", T0)
    assert batch.ts.tolist() == [1780000123.456]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('DCGM_FI_DEV_GPU_TEMP{}="0,1 \n#.eE+-naNHostname')), max_size=300))
def test_arbitrary_text_never_raises(text: str) -> None:
    health = PipelineHealth()
    batch = parse_dcgm_text(text, T0, health)
    assert len(batch.entities) == len(batch)


# ---- live scraping ------------------------------------------------------------------------
def test_scrape_source_polls_on_an_interval(dcgm_exporter: str) -> None:
    health = PipelineHealth()
    source = DcgmScrapeSource(f"{dcgm_exporter}/metrics", interval=0.05, health=health, max_polls=3)
    frames = list(source)
    assert len(frames) == 3
    assert source.topology is not None and source.topology.nodes == ["424773df46e0", "551bdf382151"]
    slot = source.topology.slot("gpu", "424773df46e0/gpu0")
    for frame in frames:
        row = int(np.flatnonzero(frame.slot == slot)[0])
        assert frame.columns["energy"][row] == 128996.013
    assert frames[0].ts[0] < frames[-1].ts[0]
    assert health.samples["gpu"] == 6


def test_what_a_healthy_exporter_serves_every_time_is_counted_once_and_a_broken_line_every_time(
        t4_text: str) -> None:
    """The real T4 page serves six metrics foreshock does not read at every scrape; an H100 beside
    it has no HBM temperature (the not-supported sentinel). Those are the exporter's configuration
    and the GPU's, not bad input: each counts at its first scrape, so a healthy exporter's rate of
    input problems falls to zero. A metric that appears later counts once then; a broken line is
    bad input at every scrape."""
    sentinel = line("DCGM_FI_DEV_MEMORY_TEMP", "9223372036854775794")
    h100 = "\n".join([line("DCGM_FI_DEV_GPU_TEMP", "61"), sentinel])
    broken = 'DCGM_FI_DEV_GPU_TEMP{gpu="0" 41'
    page = f"{t4_text}\n{h100}\n{broken}\n"
    # later a pod runs on the H100: Kubernetes' exporter adds its labels to every series of the GPU
    later = page.replace(sentinel, line("DCGM_FI_DEV_MEMORY_TEMP", "9223372036854775794", extra=',pod="train-7"'))
    later += line("DCGM_FI_DEV_ENC_UTIL", "0") + "\n"
    server = ScrapeServer([page, page, later, later])
    health = PipelineHealth()
    try:
        frames = list(DcgmScrapeSource(server.url, interval=0.02, health=health, max_polls=4))
    finally:
        server.close()
    assert len(frames) == 4
    not_read = {"DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
                "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_PSTATE"}  # read off the page by hand
    assert health.problems[("dcgm", "unmapped metric ignored")] == len(not_read) + 1  # + ENC_UTIL, once
    assert health.problems[("dcgm", "not-supported sentinel dropped")] == 1  # the GPU's, whatever its pod
    assert health.problems[("dcgm", "malformed line")] == 4
    # a one-off parse (an imported page) counts what it sees
    once = PipelineHealth()
    parse_dcgm_text(page + page, T0, once)
    assert once.problems[("dcgm", "unmapped metric ignored")] == 2 * len(not_read)


def test_scrape_failures_are_counted_and_the_source_keeps_going(dcgm_exporter: str) -> None:
    health = PipelineHealth()
    source = DcgmScrapeSource(f"{dcgm_exporter}/missing", interval=0.02, health=health, max_polls=2)
    assert list(source) == []
    assert source.polls == 2
    assert health.problems[("dcgm", "scrape failed")] == 2


def test_gpu_with_only_rejected_values_gets_no_row() -> None:
    text = "\n".join([line("DCGM_FI_DEV_GPU_TEMP", "61", gpu=0),
                      line("DCGM_FI_DEV_GPU_TEMP", "9223372036854775794", gpu=1),
                      line("DCGM_FI_DEV_POWER_USAGE", "NaN", gpu=1)])
    batch = parse_dcgm_text(text, T0)
    assert batch.entities == ["node1/gpu0"] and batch.ts.tolist() == [T0]


def test_unicode_digits_are_not_numbers() -> None:
    health = PipelineHealth()
    text = 'DCGM_FI_DEV_GPU_TEMP{gpu="²"} 5\nDCGM_FI_DEV_GPU_TEMP{gpu="1"} 5 ²'
    assert len(parse_dcgm_text(text, T0, health)) == 0
    assert health.problems[("dcgm", "bad GPU index")] == 1  # a label, no index
    assert health.problems[("dcgm", "malformed line")] == 1


def test_a_gpu_label_that_is_no_index_is_a_bad_gpu_index_not_a_missing_label() -> None:
    """gpu="-1" or gpu="zero" has a gpu label: it read "series without a gpu label" (an audit,
    2026-12-06). A series with none, or an empty one, still reads so."""
    health = PipelineHealth()
    text = "\n".join(['DCGM_FI_DEV_GPU_TEMP{gpu="-1",Hostname="n1"} 5', 'DCGM_FI_DEV_GPU_TEMP{gpu="zero",Hostname="n1"} 5',
                      'DCGM_FI_DEV_GPU_TEMP{gpu="",Hostname="n1"} 5', 'DCGM_FI_DEV_GPU_TEMP{Hostname="n1"} 5'])
    assert len(parse_dcgm_text(text, T0, health)) == 0
    assert dict(health.problems) == {("dcgm", "bad GPU index"): 2, ("dcgm", "series without a gpu label"): 2}


def test_the_gpus_own_max_operating_temperatures_are_read_under_both_namings() -> None:
    """dcgm_fields.h: DCGM_FI_DEV_GPU_MAX_OP_TEMP (152) and DCGM_FI_DEV_MEM_MAX_OP_TEMP (151), the
    maximum operating temperatures of the GPU and of its memory; DCGM 4.6 names them
    ``..._GPU_MAX_OP_TEMP_CELSIUS`` and ``..._MEMORY_MAX_OP_TEMP_CELSIUS``. A GPU that does not
    support one serves the not-supported sentinel: no value, counted as such."""
    text = "\n".join([
        line("DCGM_FI_DEV_GPU_TEMP", "61"),
        line("DCGM_FI_DEV_GPU_MAX_OP_TEMP", "83"),
        line("DCGM_FI_DEV_MEM_MAX_OP_TEMP", "95"),
        line("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "60", gpu=1),
        line("DCGM_FI_DEV_GPU_MAX_OP_TEMP_CELSIUS", "87", gpu=1),
        line("DCGM_FI_DEV_MEMORY_MAX_OP_TEMP_CELSIUS", "105", gpu=1),
        line("DCGM_FI_DEV_GPU_TEMP", "59", gpu=2),
        line("DCGM_FI_DEV_GPU_MAX_OP_TEMP", "9223372036854775794", gpu=2),  # int64 not supported
        line("DCGM_FI_DEV_MEM_MAX_OP_TEMP", "9223372036854775794", gpu=2),
    ])
    health = PipelineHealth()
    batch = parse_dcgm_text(text, T0, health)
    assert values(batch, "node1/gpu0") == {"gpu_temp": 61.0, "max_op_temp": 83.0, "hbm_max_op_temp": 95.0}
    assert values(batch, "node1/gpu1") == {"gpu_temp": 60.0, "max_op_temp": 87.0, "hbm_max_op_temp": 105.0}
    assert values(batch, "node1/gpu2") == {"gpu_temp": 59.0}
    assert health.problems == {("dcgm", "not-supported sentinel dropped"): 2}


def _page(uuids: dict[str, str | None], metric: str = "DCGM_FI_DEV_GPU_TEMP", value: str = "40") -> str:
    """One line per GPU (``host/gpuN``), labelled with its UUID (None: no UUID label)."""
    lines = []
    for name, uuid in uuids.items():
        host, _, gpu = name.partition("/gpu")
        labels = f'gpu="{gpu}",' + (f'UUID="{uuid}",' if uuid is not None else "") + f'Hostname="{host}"'
        lines.append(f"{metric}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def test_each_gpus_uuid_is_read_once_per_gpu_and_series_that_disagree_name_none() -> None:
    text = "\n".join([
        line("DCGM_FI_DEV_GPU_TEMP", "40", gpu=0), line("DCGM_FI_DEV_POWER_USAGE", "300", gpu=0),
        # MIG instances of one GPU carry its UUID
        line("DCGM_FI_DEV_GPU_TEMP", "41", gpu=1, extra=',GPU_I_ID="1",GPU_I_PROFILE="3g.40gb"'),
        line("DCGM_FI_DEV_GPU_TEMP", "41", gpu=1, extra=',GPU_I_ID="2",GPU_I_PROFILE="4g.40gb"'),
    ]).replace('gpu="1",UUID="GPU-x"', 'gpu="1",UUID="GPU-y"') + "\n" + _page({"node2/gpu0": "GPU-a"}) + \
        _page({"node2/gpu0": "GPU-b"}, "DCGM_FI_DEV_POWER_USAGE") + _page({"node3/gpu0": None})
    uuids: dict[str, str] = {}
    batch = parse_dcgm_text(text, T0, uuids=uuids)
    assert uuids == {"node1/gpu0": "GPU-x", "node1/gpu1": "GPU-y", "node2/gpu0": ""}
    plain = parse_dcgm_text(text, T0)  # reading UUIDs changes no sample
    assert batch.entities == plain.entities
    assert all(values(batch, name) == values(plain, name) for name in plain.entities)


class _Pages(DcgmScrapeSource):
    """A source serving the pages given, in order (no HTTP)."""

    def __init__(self, pages: list[str]) -> None:
        super().__init__("http://node1:9400/metrics", interval=0.02, max_polls=len(pages))
        self.pages = iter(pages)

    def scrape(self) -> str | None:
        return next(self.pages, None)


def test_the_source_carries_each_board_and_counts_a_gpu_whose_uuid_changes_once() -> None:
    """Each row carries its GPU's board (board_id: none where the label is missing or its series
    disagree). A UUID changing from one known to another is a replacement, counted once; the
    first UUID, a missing label (a page without it, or a GPU seen for the first time) and the
    same UUID again are not; neither is a GPU whose series disagree."""
    pages = [
        _page({"n/gpu0": "GPU-a", "n/gpu1": "GPU-p"}),
        _page({"n/gpu0": "GPU-a", "n/gpu1": None}),  # the label missing: no change
        _page({"n/gpu0": "GPU-b", "n/gpu1": "GPU-p"}),  # gpu0 replaced; gpu1's UUID as before the gap
        _page({"n/gpu0": "GPU-b", "n/gpu1": "GPU-p"}),
        _page({"n/gpu0": None, "n/gpu1": "GPU-p"}),
        _page({"n/gpu0": "GPU-b", "n/gpu1": "GPU-p"}) + _page({"n/gpu1": "GPU-q"}, "DCGM_FI_DEV_POWER_USAGE"),
        _page({"n/gpu0": "GPU-c", "n/gpu1": "GPU-p"}),  # gpu0 replaced again
    ]
    source = _Pages(pages)
    boards, replaced = [], []
    for _ in pages:
        frames = source.poll()
        assert len(frames) == 1
        assert source.topology is not None
        by_name = dict(zip(source.topology.names("gpu"), np.full(2, np.nan)))
        by_name.update(zip((source.topology.name("gpu", int(s)) for s in frames[0].slot),
                           frames[0].columns["board_id"]))
        boards.append([by_name["n/gpu0"], by_name["n/gpu1"]])
        replaced.append(source.health.gpus_replaced["dcgm"])
    a, b, c, p = (float(uuid_number(u)) for u in ("GPU-a", "GPU-b", "GPU-c", "GPU-p"))
    np.testing.assert_array_equal(boards, [[a, p], [a, np.nan], [b, p], [b, p], [np.nan, p], [b, np.nan], [c, p]])
    assert replaced == [0, 0, 1, 1, 1, 1, 2]


def test_a_source_told_not_to_read_boards_reads_no_uuid() -> None:
    source = _Pages([_page({"n/gpu0": "GPU-a"}), _page({"n/gpu0": "GPU-b"})])
    source.reads_boards = False
    for _ in range(2):
        assert np.isnan(source.poll()[0].columns["board_id"]).all()
    assert not source.health.gpus_replaced


def test_the_unmapped_metric_log_line_says_how_many_names_it_leaves_out(t4_text: str, caplog) -> None:
    """The T4 page serves six metrics the table does not map; the line named five of them and
    nothing said there was a sixth (h22)."""
    with caplog.at_level("WARNING", logger="foreshock"):
        parse_dcgm_text(t4_text, T0, PipelineHealth())
    [line] = [r.getMessage() for r in caplog.records if "unmapped metric ignored" in r.getMessage()]
    assert "DCGM_FI_DEV_FB_FREE, DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_MEM_CLOCK, DCGM_FI_DEV_MEM_COPY_UTIL, " \
           "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL +1 more (counted" in line


def _raw_server(reply: bytes) -> tuple[str, Any]:
    """A one-shot server on 127.0.0.1 that answers any request with ``reply`` as raw bytes (an
    exporter cut off mid-body, a proxy speaking garbage), then closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(reply)
        srv.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}/metrics", thread


@pytest.mark.parametrize("reply", [
    # the body cut short of its Content-Length: http.client.IncompleteRead
    b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5000\r\n\r\n"
    b'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n1"} 25\n',
    b"SPDY/9 banana\r\n\r\n",  # a status line that is no HTTP: http.client.BadStatusLine
    # a charset Python does not know: LookupError
    b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; charset=x-no-such\r\nContent-Length: 3\r\n\r\nabc",
], ids=["cut-short", "bad-status-line", "unknown-charset"])
def test_a_page_that_cannot_be_had_is_a_failed_scrape_and_an_outage(reply: bytes) -> None:
    """These raised out of ``scrape`` (none is an ``OSError``): the poll failed without the outage
    being noted, and after a long one the hosts missing from the first page back were forgotten at once."""
    url, thread = _raw_server(reply)
    health = PipelineHealth()
    source = DcgmScrapeSource(url, interval=1.0, health=health)
    assert source.poll() == []
    thread.join(5)
    assert health.problems[("dcgm", "scrape failed")] == 1
    assert source._out
