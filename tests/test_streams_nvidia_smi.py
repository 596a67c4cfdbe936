"""nvidia-smi --query-gpu CSV and dmon -> gpu samples, on the real H200/H100 captures; the runner."""

from __future__ import annotations

import os
import stat
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.health import PipelineHealth
from foreshock.streams.samples import SampleBatch
from foreshock.streams.nvidia_smi import (
    parse_query_gpu_chunks,
    NvidiaSmiSource,
    capture_collected_at,
    capture_sections,
    parse_dmon,
    parse_query_gpu,
)

from board_ids import uuid_number

H200 = "nvidia-smi/linux-x86_64__nvidia-h200__590.48.01.txt"
H100 = "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"


def utc(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


def row(batch, i: int = 0) -> dict[str, float]:
    return {name: float(col[i]) for name, col in batch.columns.items() if not np.isnan(col[i])}


@pytest.fixture(scope="module")
def h200(shared_data: Path) -> dict[str, str]:
    return capture_sections((shared_data / H200).read_text())


@pytest.fixture(scope="module")
def h100(shared_data: Path) -> dict[str, str]:
    return capture_sections((shared_data / H100).read_text())


def test_capture_sections_split_the_banners(h200: dict[str, str]) -> None:
    for phase in ("idle", "load"):
        for kind in ("query-gpu", "dmon", "pmon", "query"):
            assert f"{phase} :: {kind}" in h200
    assert h200["load :: dmon"].startswith("# gpu    pwr  gtemp  mtemp")
    assert h200["idle :: query-gpu"].startswith("timestamp, driver_version,")
    assert "################" not in h200["load :: query-gpu"]


def test_collected_at(shared_data: Path) -> None:
    assert capture_collected_at((shared_data / H200).read_text()) == utc("2026-07-03 22:10:45.000")


def test_h200_under_load_query_gpu(h200: dict[str, str]) -> None:
    health = PipelineHealth()
    batch = parse_query_gpu(h200["load :: query-gpu"], health=health)
    assert batch.entity_names() == ["localhost/gpu0"]  # hostname column is [N/A]
    assert batch.ts.tolist() == [utc("2026-07-03 22:11:09.763")]
    assert row(batch) == {
        "power": 627.40, "power_limit": 700.0, "gpu_temp": 52.0, "hbm_temp": 40.0,
        "sm_clock": 1.98e9, "sm_clock_max": 1.98e9, "util": 1.0, "throttle_reasons": 0.0,
        "power_throttle_time": 0.0, "thermal_throttle_time": 0.0, "ecc_dbe": 0.0, "remapped_rows": 0.0,
        "max_op_temp": 87.0,  # 52 °C + temperature.gpu.tlimit 35
    }
    assert health.total_problems() == 0  # [N/A], deprecated, Active/Not Active: none is a problem


def test_h200_idle_query_gpu_throttle_mask_is_idle(h200: dict[str, str]) -> None:
    values = row(parse_query_gpu(h200["idle :: query-gpu"], host="h200"))
    assert values["throttle_reasons"] == 1.0  # 0x0000000000000001: GPU idle
    assert values["power"] == 77.71
    assert (values["gpu_temp"], values["hbm_temp"]) == (28.0, 32.0)
    assert values["sm_clock"] == 345e6


def test_h200_under_load_dmon(h200: dict[str, str]) -> None:
    batch = parse_dmon(h200["load :: dmon"], host="h200", start=1000.0, interval=1.0)
    assert batch.entity_names() == ["h200/gpu0"] * 5
    assert batch.ts.tolist() == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
    assert row(batch, 0) == {"power": 630.0, "gpu_temp": 53.0, "hbm_temp": 41.0, "util": 1.0, "sm_clock": 1.98e9}
    assert batch.columns["power"].tolist() == [630.0, 628.0, 629.0, 632.0, 630.0]
    assert batch.columns["hbm_temp"].tolist() == [41.0, 42.0, 42.0, 42.0, 42.0]


def test_h100_captures(h100: dict[str, str]) -> None:
    load = row(parse_query_gpu(h100["load :: query-gpu"]))
    assert (load["power"], load["gpu_temp"], load["hbm_temp"], load["sm_clock"]) == (631.95, 59.0, 54.0, 1.98e9)
    dmon = parse_dmon(h100["load :: dmon"])
    assert dmon.columns["gpu_temp"].tolist() == [63.0, 63.0, 64.0, 64.0, 65.0]
    assert row(parse_query_gpu(h100["idle :: query-gpu"]))["throttle_reasons"] == 1.0


def test_dmon_cycles_per_gpu_and_date_time_columns() -> None:
    text = """#Date       Time        gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk
#YYYYMMDD   HH:MM:SS    Idx     W     C     C     %     %     %     %   MHz   MHz
 20260703   22:11:10      0   630    53    41   100     8     0     0  3201  1980
 20260703   22:11:10      1   410    47     -    73     5     0     0  3201  1755
 20260703   22:11:11      0   628    53    42   100     8     0     0  3201  1980
"""
    health = PipelineHealth()
    batch = parse_dmon(text, host="n", health=health)
    assert batch.entity_names() == ["n/gpu0", "n/gpu1", "n/gpu0"]
    t = datetime(2026, 7, 3, 22, 11, 10, tzinfo=timezone.utc).timestamp()
    assert batch.ts.tolist() == [t, t, t + 1]
    assert np.isnan(batch.columns["hbm_temp"][1])  # "-" is no value, not a problem
    assert batch.columns["sm_clock"][1] == 1.755e9
    assert health.total_problems() == 0

    no_time = "# gpu pwr\n# Idx W\n 0 10\n 1 11\n 0 12\n 1 13\n"
    assert parse_dmon(no_time, start=50.0, interval=2.0).ts.tolist() == [50.0, 50.0, 52.0, 52.0]


def test_bad_csv_input_is_counted(h200: dict[str, str]) -> None:
    lines = h200["load :: query-gpu"].splitlines()
    header, data = lines[0], lines[1]
    cells = data.split(", ")
    names = [h.split(" [")[0] for h in header.split(", ")]
    power = names.index("power.draw")
    garbage, nan = list(cells), list(cells)
    garbage[power] = "lots W"
    nan[power] = "NaN"
    nan[names.index("timestamp")] = "2026/07/03 22:11:10.763"
    truncated = data[: len(data) // 2]  # a cut-off last line
    bad_time = list(cells)
    bad_time[0] = "yesterday"
    text = "\n".join([header, ", ".join(garbage), ", ".join(nan), ", ".join(bad_time), truncated])
    health = PipelineHealth()
    batch = parse_query_gpu(text, health=health)
    assert len(batch) == 2  # garbage and NaN rows kept (other fields are fine), bad time and truncated not
    assert np.isnan(batch.columns["power"]).all()
    assert batch.columns["gpu_temp"].tolist() == [52.0, 52.0]
    p = health.problems
    assert p[("nvidia-smi", "non-numeric value")] == 1
    assert p[("nvidia-smi", "NaN value")] == 1
    assert p[("nvidia-smi", "truncated row")] == 1
    assert p[("nvidia-smi", "bad timestamp")] == 1


def test_bad_dmon_input_is_counted(h200: dict[str, str]) -> None:
    body = h200["load :: dmon"].splitlines()
    text = "\n".join(["    0    630     53", *body, "    0    6x0     53     41    100      8      0      0      0      0   3201   1980",
                      "    0    630     53     41    100"])
    health = PipelineHealth()
    batch = parse_dmon(text, health=health)
    assert len(batch) == 6
    p = health.problems
    assert p[("dmon", "data before header")] == 1
    assert p[("dmon", "non-numeric value")] == 1
    assert p[("dmon", "truncated row")] == 1


def test_empty_and_header_only_inputs() -> None:
    assert len(parse_query_gpu("")) == 0
    assert len(parse_query_gpu("timestamp, index, power.draw [W]\n")) == 0
    assert len(parse_dmon("")) == 0


# ---- the runner with a stub nvidia-smi ---------------------------------------------------------
def make_stub(tmp_path: Path, capture: Path, reject: str | None = None) -> tuple[Path, Path]:
    """An executable printing the real load CSV; it logs its arguments and can reject one query name."""
    output = tmp_path / "load-query-gpu.csv"
    output.write_text(capture_sections(capture.read_text())["load :: query-gpu"])
    calls = tmp_path / "calls.txt"
    refuse = (f'case ",${{1#--query-gpu=}}," in *,{reject},*) '
              f'echo \'Field "{reject}" is not a valid field to query.\' >&2; exit 2;; esac\n') if reject else ""
    stub = tmp_path / "nvidia-smi"
    stub.write_text(f'#!/bin/sh\necho "$1 $2" >> {calls}\n{refuse}cat {output}\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return stub, calls


def test_runner_polls_the_stub(tmp_path: Path, shared_data: Path) -> None:
    stub, calls = make_stub(tmp_path, shared_data / H200)
    health = PipelineHealth()
    clock = iter([100.0, 130.0])
    source = NvidiaSmiSource(executable=str(stub), interval=0.05, host="h200-test", health=health, max_polls=2)
    source.clock = lambda: next(clock)
    frames = list(source)
    assert len(frames) == 2
    assert source.topology is not None and source.topology.gpus == ["h200-test/gpu0"]
    assert [f.ts.tolist() for f in frames] == [[100.0], [130.0]]  # poll time, not nvidia-smi's local time
    assert frames[0].columns["power"].tolist() == [627.40]
    assert frames[1].columns["sm_clock"].tolist() == [1.98e9]
    argv = calls.read_text().splitlines()[0].split(" ")
    assert argv[1] == "--format=csv"
    query = argv[0].removeprefix("--query-gpu=").split(",")
    assert query[:2] == ["timestamp", "index"] and "power.draw" in query and "clocks_event_reasons.active" in query
    assert "temperature.gpu.tlimit" in query  # for max_op_temp (the table has no name for it)
    assert frames[0].columns["max_op_temp"].tolist() == [87.0]
    assert health.total_problems() == 0


def test_runner_falls_back_to_an_alias_the_driver_accepts(tmp_path: Path, shared_data: Path) -> None:
    stub, calls = make_stub(tmp_path, shared_data / H200, reject="clocks_event_reasons.active")
    health = PipelineHealth()
    source = NvidiaSmiSource(executable=str(stub), interval=0.02, host="old-driver", health=health, max_polls=2)
    frames = list(source)
    assert len(frames) == 1  # the first poll was rejected, the second used the alias
    second = calls.read_text().splitlines()[1].split(" ")[0]
    assert "clocks_throttle_reasons.active" in second and "clocks_event_reasons.active" not in second
    assert health.problems[("nvidia-smi", "command failed")] == 1
    assert health.problems[("nvidia-smi", "query field rejected by the driver")] == 1


def test_runner_without_the_executable_counts_and_continues(tmp_path: Path) -> None:
    health = PipelineHealth()
    source = NvidiaSmiSource(executable=str(tmp_path / "no-such-nvidia-smi"), interval=0.02, health=health,
                             max_polls=2)
    assert list(source) == []
    assert health.problems[("nvidia-smi", "command not found")] == 2
    assert os.path.exists(tmp_path)


_LONG_HEADER = "timestamp, index, temperature.gpu, power.draw [W], clocks.current.sm [MHz]"


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.sampled_from([
    "2026/07/03 22:00:{s:02d}.000, {g}, {t}, 600.5 W, 1980 MHz",
    "2026/07/03 22:00:{s:02d}.000, {g}, [N/A], 601 W, 1980 MHz",
    "2026/07/03 22:00:{s:02d}.000, {g}, {t}",  # cut short
    "not a time, {g}, {t}, 600 W, 1980 MHz",
    "",
    _LONG_HEADER,  # nvidia-smi restarted into the same file (>>) repeats its header
]), max_size=40), chunk_rows=st.integers(1, 7), blank_lead=st.booleans())
def test_a_long_csv_parsed_in_chunks_gives_what_parsing_it_whole_gives(rows, chunk_rows, blank_lead) -> None:
    """`import` parses a days-long query-gpu CSV a chunk at a time (parsed whole, the cells as
    Python strings took ten times the file's size in memory); rows, entities, values and every
    counted problem must be the same."""
    lines = [r.format(s=i % 60, g=i % 3, t=40 + i % 7) for i, r in enumerate(rows)]
    text = ("\n \n" if blank_lead else "") + "\n".join([_LONG_HEADER, *lines]) + "\n"
    whole_health, chunk_health = PipelineHealth(), PipelineHealth()
    whole = parse_query_gpu(text, "n0", whole_health)
    parts = list(parse_query_gpu_chunks(text, "n0", chunk_health, chunk_rows=chunk_rows))
    assert sum(len(p) for p in parts) == len(whole)
    assert whole_health.problems == chunk_health.problems
    if len(whole):
        joined = SampleBatch.concat(parts)
        assert joined.entities == whole.entities and np.array_equal(joined.ts, whole.ts)
        assert np.array_equal(np.asarray(joined.entities)[joined.entity], np.asarray(whole.entities)[whole.entity])
        for name, column in whole.columns.items():
            assert np.array_equal(joined.column(name), column, equal_nan=True), name


# ---- the GPU's own max operating temperature (T.Limit) --------------------------------------------
def _q_temperature(q_text: str) -> dict[str, float]:
    """The ``Temperature`` block of ``nvidia-smi -q``: ``{"GPU Current Temp": 52.0, ...}`` (N/A left out)."""
    block = q_text.split("\n    Temperature\n", 1)[1].split("\n    GPU Power Readings", 1)[0]
    out = {}
    for line in block.splitlines():
        name, _, value = line.partition(":")
        if value.strip().endswith(" C"):
            out[name.strip()] = float(value.strip()[:-2])
    return out


@pytest.mark.parametrize("state", ["idle", "load"])
def test_max_operating_temperature_is_the_temperature_plus_its_t_limit_headroom(h200, state) -> None:
    """Drivers 590 print every threshold as an offset from T.Limit (``-q``: ``GPU Max Operating T.Limit
    Temp : 0 C``) and ``GPU T.Limit Temp`` as the headroom: on the real H200 capture 28 °C + 59 and
    52 °C + 35 = 87 °C, the max operating temperature. The query-gpu CSV's ``temperature.gpu.tlimit``
    is that headroom: a row built from the capture's own header gives 87 °C, as ``-q`` does."""
    q = _q_temperature(h200[f"{state} :: query"])  # the -q section
    assert q["GPU Max Operating T.Limit Temp"] == 0.0 and q["Memory Max Operating T.Limit Temp"] == 0.0  # offsets
    from_q = q["GPU Current Temp"] + q["GPU T.Limit Temp"]
    assert from_q == 87.0
    header = next(line for line in h200[f"{state} :: query-gpu"].splitlines() if line.startswith("timestamp,"))
    names = [h.strip() for h in header.split(",")]
    cells = ["[N/A]"] * len(names)
    for name, value in (("timestamp", "2026/07/03 22:11:09.763"), ("index", "0"),
                        ("temperature.gpu", str(int(q["GPU Current Temp"]))),
                        ("temperature.gpu.tlimit", str(int(q["GPU T.Limit Temp"]))),
                        ("temperature.memory", str(int(q["Memory Current Temp"])))):
        cells[names.index(name)] = value
    health = PipelineHealth()
    values = row(parse_query_gpu(header + "\n" + ", ".join(cells) + "\n", health=health))
    assert values["max_op_temp"] == from_q
    assert "hbm_max_op_temp" not in values  # no query name: -q prints only its offset, 0
    assert health.total_problems() == 0


def test_without_a_t_limit_column_or_value_there_is_no_max_operating_temperature() -> None:
    text = ("timestamp, index, temperature.gpu, temperature.gpu.tlimit\n"
            "2026/07/03 22:11:09.763, 0, 52, [N/A]\n")
    assert "max_op_temp" not in row(parse_query_gpu(text))
    text = "timestamp, index, temperature.gpu\n2026/07/03 22:11:09.763, 0, 52\n"
    assert "max_op_temp" not in parse_query_gpu(text).columns


# ---- the GPUs' UUIDs: a board swapped in its slot ----------------------------------------------
def test_the_uuid_is_read_apart_from_the_fields(h200: dict[str, str]) -> None:
    """The real capture's ``uuid`` column (a string, not a field) gives the GPU's UUID and
    changes no sample; ``[N/A]`` names none, a dropped row none, rows of one GPU that disagree ""."""
    health = PipelineHealth()
    uuids: dict[str, str] = {}
    batch = parse_query_gpu(h200["load :: query-gpu"], host="h", health=health, uuids=uuids)
    assert uuids == {"h/gpu0": "GPU-00000000-0000-0000-0000-000000000000"}
    plain = parse_query_gpu(h200["load :: query-gpu"], host="h")
    assert row(batch) == row(plain) and batch.entity_names() == plain.entity_names()
    assert health.total_problems() == 0
    text = ("index, temperature.gpu, uuid\n0, 50, GPU-a\n1, 51, [N/A]\n2, 52, GPU-c\nx, 53, GPU-x\n"
            "3, 54, GPU-d\n3, 54, GPU-e\n4, 55, GPU-f\n4, 55, GPU-f\n")
    uuids = {}
    batch = parse_query_gpu(text, host="h", ts=1.0, uuids=uuids)
    assert uuids == {"h/gpu0": "GPU-a", "h/gpu2": "GPU-c", "h/gpu3": "", "h/gpu4": "GPU-f"}
    assert batch.column("gpu_temp").tolist() == [50.0, 51.0, 52.0, 54.0, 54.0, 55.0, 55.0]


def pages_stub(tmp_path: Path, pages: list[str], reject: str | None = None) -> tuple[Path, Path]:
    """An executable printing ``pages`` in turn (then the last again); it logs its arguments and
    can reject one query name, as make_stub's."""
    for i, page in enumerate(pages):
        (tmp_path / f"page{i}.csv").write_text(page)
    calls, counter = tmp_path / "calls.txt", tmp_path / "served"
    counter.write_text("0\n")
    refuse = (f'case ",${{1#--query-gpu=}}," in *,{reject},*) '
              f'echo \'Field "{reject}" is not a valid field to query.\' >&2; exit 2;; esac\n') if reject else ""
    stub = tmp_path / "nvidia-smi"
    stub.write_text(f'#!/bin/sh\necho "$1 $2" >> {calls}\n{refuse}n=$(cat {counter})\n'
                    f'[ "$n" -lt {len(pages) - 1} ] && echo $((n + 1)) > {counter}\ncat {tmp_path}/page$n.csv\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return stub, calls


def _page(uuids: list[str]) -> str:
    return "index, temperature.gpu, uuid\n" + "".join(f"{i}, 50, {u}\n" for i, u in enumerate(uuids))


def test_the_source_asks_for_the_uuid_and_reports_a_gpu_whose_uuid_changes_once(tmp_path: Path) -> None:
    """Each row carries its GPU's board (board_id; none where the UUID reads [N/A]); a UUID
    changing from one known to another is counted once, at the poll that read it."""
    pages = [_page(["GPU-a", "GPU-p"]), _page(["GPU-a", "[N/A]"]), _page(["GPU-b", "GPU-p"]), _page(["GPU-b", "GPU-p"]),
             _page(["GPU-b", "GPU-q"])]
    stub, calls = pages_stub(tmp_path, pages)
    health = PipelineHealth()
    source = NvidiaSmiSource(executable=str(stub), interval=0.02, host="h", health=health, max_polls=len(pages))
    boards, replaced = [], []
    for _ in pages:
        frame = source.poll()[0]
        assert len(frame) == 2 and frame.slot.tolist() == [0, 1]
        boards.append(frame.columns["board_id"].tolist())
        replaced.append(health.gpus_replaced["nvidia-smi"])
    a, b, p, q = (float(uuid_number(u)) for u in ("GPU-a", "GPU-b", "GPU-p", "GPU-q"))
    np.testing.assert_array_equal(boards, [[a, p], [a, np.nan], [b, p], [b, p], [b, q]])
    assert replaced == [0, 0, 1, 1, 2]
    query = calls.read_text().splitlines()[0].split(" ")[0].removeprefix("--query-gpu=").split(",")
    assert query.count("uuid") == 1 and "temperature.gpu.tlimit" in query
    assert health.total_problems() == 0


def test_a_source_told_not_to_read_boards_does_not_query_uuids(tmp_path: Path) -> None:
    stub, calls = pages_stub(tmp_path, [_page(["GPU-a"]), _page(["GPU-b"])])
    health = PipelineHealth()
    source = NvidiaSmiSource(executable=str(stub), interval=0.02, host="h", health=health, max_polls=2)
    source.reads_boards = False
    frames = list(source)
    assert len(frames) == 2 and all(np.isnan(f.columns["board_id"]).all() for f in frames)
    assert not health.gpus_replaced
    assert all("uuid" not in line.split(" ")[0].split(",") for line in calls.read_text().splitlines())


def test_a_driver_that_rejects_the_uuid_query_is_asked_without_it(tmp_path: Path) -> None:
    stub, calls = pages_stub(tmp_path, ["index, temperature.gpu\n0, 50\n"], reject="uuid")
    health = PipelineHealth()
    source = NvidiaSmiSource(executable=str(stub), interval=0.02, host="h", health=health, max_polls=3)
    frames = list(source)
    assert len(frames) == 2  # the first poll was rejected, the next ones asked without it
    asked = [line.split(" ")[0].split(",") for line in calls.read_text().splitlines()]
    assert [("uuid" in query) for query in asked] == [True, False, False]
    assert all(np.isnan(f.columns["board_id"]).all() for f in frames)
    assert health.problems[("nvidia-smi", "query field rejected by the driver")] == 1
