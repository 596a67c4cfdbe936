"""``foreshock import`` of the real captures (``/work/shared/data``, the ``shared_data`` fixture) keeps
what the live sources read: each row's GPU UUID as ``board_id`` (README, "GPU board swaps": a replay
of the recording restarts a GPU whose board changed), and nvidia-smi's HW thermal slowdown time in
``thermal_throttle_time`` (the field table: SW *or* HW thermal slowdown), found by an audit against
the real data. Variants of the real rows are written to ``tmp_path``; the real files are read in place."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.boards import board_id
from foreshock.cli.import_cmd import command
from foreshock.guard import InputGuard
from foreshock.health import PipelineHealth
from foreshock.recording import Recording
from foreshock.streams.nvidia_smi import NvidiaSmiSource, capture_sections, parse_query_gpu, parse_query_gpu_chunks

DCGM_FILE = Path("dcgm") / "dcgm-exporter-tesla-t4.prom"
SMI_FILES = ["linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt", "linux-x86_64__nvidia-h200__590.48.01.txt"]
DCGM_UUIDS = {"424773df46e0/gpu0": "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e",
              "551bdf382151/gpu0": "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5"}
NEW_BOARD = "GPU-11111111-2222-3333-4444-555555555555"
SW = "clocks_event_reasons_counters.sw_thermal_slowdown"
HW_THERMAL_QUERY = "clocks_event_reasons_counters.hw_thermal_slowdown"  # (streams.nvidia_smi's name for it)


def run(*args: str) -> str:
    result = CliRunner().invoke(command, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def smi_rows(shared_data: Path, name: str = SMI_FILES[0]) -> tuple[str, list[str]]:
    """The real capture's query-gpu header and its rows (idle, then load), as printed."""
    sections = capture_sections((shared_data / "nvidia-smi" / name).read_text())
    idle = [line for line in sections["idle :: query-gpu"].splitlines() if line.strip()]
    load = [line for line in sections["load :: query-gpu"].splitlines() if line.strip()]
    assert idle[0] == load[0]
    return idle[0], idle[1:] + load[1:]


def cells(header: str, row: str) -> dict[str, str]:
    """A row's cells by query name (the header's ``[unit]`` left off)."""
    names = [h.split("[")[0].strip() for h in header.split(",")]
    return dict(zip(names, (c.strip() for c in row.split(","))))


def with_cells(header: str, row: str, **changed: str) -> str:
    """``row`` with the named cells (query names, dots as ``__``) set to new text."""
    names = [h.split("[")[0].strip() for h in header.split(",")]
    out = [c.strip() for c in row.split(",")]
    for key, text in changed.items():
        out[names.index(key.replace("__", "."))] = text
    return ", ".join(out)


def drop_column(header: str, rows: list[str], name: str) -> tuple[str, list[str]]:
    names = [h.split("[")[0].strip() for h in header.split(",")]
    at = names.index(name)

    def cut(line: str) -> str:
        parts = line.split(",")
        return ",".join(parts[:at] + parts[at + 1:])
    return cut(header), [cut(row) for row in rows]


# ---- board_id: dcgm-exporter -----------------------------------------------------------------

def test_dcgm_import_of_the_real_scrape_records_each_gpus_uuid(shared_data: Path, tmp_path: Path) -> None:
    run("--format", "dcgm", str(shared_data / DCGM_FILE), "--out", str(tmp_path / "rec"),
        "--time", "2026-07-01T00:00:00Z")
    rec = Recording.open(tmp_path / "rec")
    frame = rec.read_kind("gpu")
    got = {rec.topology.gpus[slot]: float(v) for slot, v in zip(frame.slot, frame.columns["board_id"])}
    assert got == {name: board_id(uuid) for name, uuid in DCGM_UUIDS.items()}


def test_dcgm_import_of_a_scrape_without_uuid_labels_has_no_board(shared_data: Path, tmp_path: Path) -> None:
    # as before the fix: nothing read, nothing recorded (a replay sees no board, not a change)
    text = (shared_data / DCGM_FILE).read_text()
    for uuid in DCGM_UUIDS.values():
        text = text.replace(f'UUID="{uuid}",', "")
    path = tmp_path / "no-uuid.prom"
    path.write_text(text)
    run("--format", "dcgm", str(path), "--out", str(tmp_path / "rec"), "--time", "2026-07-01T00:00:00Z")
    columns = Recording.open(tmp_path / "rec").read_kind("gpu").columns
    assert "board_id" not in columns or np.isnan(columns["board_id"]).all()


def test_dcgm_import_swapped_board_reads_the_new_uuid(shared_data: Path, tmp_path: Path) -> None:
    # the real scrape taken after gpu1's board was swapped: its row names the new board
    path = tmp_path / "swapped.prom"
    path.write_text((shared_data / DCGM_FILE).read_text().replace(DCGM_UUIDS["551bdf382151/gpu0"], NEW_BOARD))
    run("--format", "dcgm", str(path), "--out", str(tmp_path / "rec"), "--time", "2026-07-01T00:00:00Z")
    rec = Recording.open(tmp_path / "rec")
    frame = rec.read_kind("gpu")
    got = {rec.topology.gpus[slot]: float(v) for slot, v in zip(frame.slot, frame.columns["board_id"])}
    assert got == {"424773df46e0/gpu0": board_id(DCGM_UUIDS["424773df46e0/gpu0"]),
                   "551bdf382151/gpu0": board_id(NEW_BOARD)}


def test_dcgm_import_of_two_scrapes_across_a_swap_names_each_pages_board(shared_data: Path, tmp_path: Path) -> None:
    """Two scrapes appended, the second after gpu1's swap: each page is its own samples (until
    2026-12-05 the parser folded the file into one row per GPU, a row of two boards' values naming
    none), so the replay sees gpu1's board change between them; the other GPU keeps its own."""
    text = (shared_data / DCGM_FILE).read_text()
    path = tmp_path / "two.prom"
    path.write_text(text + text.replace(DCGM_UUIDS["551bdf382151/gpu0"], NEW_BOARD))
    run("--format", "dcgm", str(path), "--out", str(tmp_path / "rec"), "--time", "2026-07-01T00:00:00Z")
    rec = Recording.open(tmp_path / "rec")
    frame = rec.read_kind("gpu")
    boards: dict[str, list[float]] = {}
    for slot, ts, v in sorted(zip(frame.slot.tolist(), frame.ts.tolist(), frame.columns["board_id"].tolist()),
                              key=lambda row: row[1]):
        boards.setdefault(rec.topology.gpus[slot], []).append(v)
    assert boards == {"424773df46e0/gpu0": [board_id(DCGM_UUIDS["424773df46e0/gpu0"])] * 2,
                      "551bdf382151/gpu0": [board_id(DCGM_UUIDS["551bdf382151/gpu0"]), board_id(NEW_BOARD)]}


# ---- board_id: nvidia-smi query-gpu ----------------------------------------------------------

@pytest.mark.parametrize("name", SMI_FILES)
def test_nvidia_smi_import_of_the_real_capture_records_each_rows_uuid(shared_data: Path, tmp_path: Path,
                                                                       name: str) -> None:
    header, rows = smi_rows(shared_data, name)
    run("--format", "nvidia-smi", str(shared_data / "nvidia-smi" / name), "--out", str(tmp_path / "rec"))
    frame = Recording.open(tmp_path / "rec").read_kind("gpu")
    assert len(frame) == len(rows) == 2
    expected = [board_id(cells(header, row)["uuid"]) for row in rows]
    assert frame.columns["board_id"].tolist() == expected and not math.isnan(expected[0])


def test_nvidia_smi_import_of_a_log_across_a_board_swap_restarts_the_gpu(shared_data: Path, tmp_path: Path) -> None:
    """The real rows as one ``nvidia-smi -l`` log in which GPU 0's board is swapped (an RMA) before the
    load row: each row keeps its own board (a UUID per GPU read "" for the file, hiding the swap),
    and the input guard of a replay of the recording finds the change at that row."""
    header, (idle, load) = smi_rows(shared_data)
    old = cells(header, idle)["uuid"]
    path = tmp_path / "swap.csv"
    path.write_text("\n".join([header, idle, load.replace(old, NEW_BOARD)]) + "\n")
    run("--format", "nvidia-smi", str(path), "--out", str(tmp_path / "rec"))
    rec = Recording.open(tmp_path / "rec")
    frame = rec.read_kind("gpu")
    assert frame.columns["board_id"].tolist() == [board_id(old), board_id(NEW_BOARD)]
    change = InputGuard(rec.topology, PipelineHealth()).board_change(frame)
    assert change is not None
    when, slots, before, after = change
    assert when == float(frame.ts[1])
    assert slots.tolist() == [rec.topology.slot("gpu", "localhost/gpu0")]
    assert before.tolist() == [board_id(old)] and after.tolist() == [board_id(NEW_BOARD)]


def test_nvidia_smi_rows_keep_their_own_board_across_chunks(shared_data: Path) -> None:
    header, (idle, load) = smi_rows(shared_data)
    old = cells(header, idle)["uuid"]
    rows = [idle, load.replace(old, NEW_BOARD), with_cells(header, idle, uuid="[N/A]", timestamp="2026/07/14 08:13:00")]
    text = "\n".join([header, *rows]) + "\n"
    for chunk_rows in (1, 2, 50_000):
        batches = list(parse_query_gpu_chunks(text, board_ids=True, chunk_rows=chunk_rows))
        ids = np.concatenate([b.columns["board_id"] for b in batches])
        assert ids[:2].tolist() == [board_id(old), board_id(NEW_BOARD)] and math.isnan(ids[2])
    # a live poll keeps its map of one UUID per GPU (GpuBoards.tag writes the column)
    assert "board_id" not in parse_query_gpu(text).columns


# ---- thermal_throttle_time: SW + HW thermal slowdown ------------------------------------------

@pytest.mark.parametrize("name", SMI_FILES)
def test_real_capture_thermal_time_is_sw_plus_hw(shared_data: Path, name: str) -> None:
    header, rows = smi_rows(shared_data, name)
    batch = parse_query_gpu("\n".join([header, *rows]) + "\n")
    expected = [(float(cells(header, r)[SW].split()[0]) + float(cells(header, r)[HW_THERMAL_QUERY].split()[0])) * 1e-6
                for r in rows]
    assert batch.columns["thermal_throttle_time"].tolist() == pytest.approx(expected)


def hw_rows(shared_data: Path, sw_hw: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """The real load row, once per (sw, hw) counter cells, a second apart."""
    header, (_, load) = smi_rows(shared_data)
    return header, [with_cells(header, load, timestamp=f"2026/07/14 08:13:{10 + k:02d}.000",
                               clocks_event_reasons_counters__sw_thermal_slowdown=sw,
                               clocks_event_reasons_counters__hw_thermal_slowdown=hw)
                    for k, (sw, hw) in enumerate(sw_hw)]


def test_hw_thermal_slowdown_time_reaches_thermal_throttle_time(shared_data: Path) -> None:
    header, rows = hw_rows(shared_data, [("0 us", "0 us"), ("0 us", "4000000 us"), ("1500000 us", "4000000 us"),
                                         ("2 s", "4500 ms")])
    health = PipelineHealth()
    batch = parse_query_gpu("\n".join([header, *rows]) + "\n", health=health)
    assert batch.columns["thermal_throttle_time"].tolist() == pytest.approx([0.0, 4.0, 5.5, 6.5])
    assert not health.problems


def test_thermal_time_where_a_counter_is_missing(shared_data: Path) -> None:
    header, rows = hw_rows(shared_data, [("1000000 us", "[N/A]"), ("[N/A]", "3000000 us"), ("[N/A]", "[N/A]"),
                                         ("1000000 us", "[Unknown Error]")])
    values = parse_query_gpu("\n".join([header, *rows]) + "\n").columns["thermal_throttle_time"]
    # a counter the board lacks adds nothing; neither read, or one failed: no reading
    assert values[:2].tolist() == [1.0, 3.0] and np.isnan(values[2:]).all()


def test_thermal_time_from_one_counter_column_alone(shared_data: Path) -> None:
    header, rows = hw_rows(shared_data, [("1000000 us", "3000000 us")])
    for column, expected in ((HW_THERMAL_QUERY, 1.0), (SW, 3.0)):  # the other one's column left out
        h, r = drop_column(header, rows, column)
        assert parse_query_gpu("\n".join([h, *r]) + "\n").columns["thermal_throttle_time"].tolist() == [expected]


def test_nvidia_smi_import_records_hw_thermal_time(shared_data: Path, tmp_path: Path) -> None:
    header, rows = hw_rows(shared_data, [("0 us", "0 us"), ("0 us", "4000000 us")])
    path = tmp_path / "hw.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    run("--format", "nvidia-smi", str(path), "--out", str(tmp_path / "rec"))
    frame = Recording.open(tmp_path / "rec").read_kind("gpu")
    assert frame.columns["thermal_throttle_time"].tolist() == [0.0, 4.0]


def test_live_source_asks_for_the_hw_thermal_counter() -> None:
    query = NvidiaSmiSource(executable="nvidia-smi", host="n0").argv()[1].removeprefix("--query-gpu=").split(",")
    assert SW in query and HW_THERMAL_QUERY in query
