"""nvidia-smi input foreshock cannot read is said, not read as nothing: a cell ``nan W`` (a NaN with
its unit) is counted as a NaN value, as a bare ``nan`` was; a CSV column the importer does not read
(a garbled header, ``power.dr@w [W]``) is counted once by name (dcgm's ``unmapped metric ignored``);
and ``nvidia-smi -q``'s report (or the default table) fed to ``import --format nvidia-smi``/``dmon`` is
refused in one line saying what to capture, where each of its lines had been counted as ``no timestamp
column``. The real captures, which hold ``-q`` sections beside their CSV and dmon ones, import as before."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.import_cmd import command
from foreshock.health import PipelineHealth
from foreshock.recording import Recording
from foreshock.streams.nvidia_smi import STAGE, UNMAPPED_COLUMN, parse_query_gpu, parse_query_gpu_chunks

H200 = Path("nvidia-smi") / "linux-x86_64__nvidia-h200__590.48.01.txt"
H100 = Path("nvidia-smi") / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
HEADER = "timestamp, index, temperature.gpu, power.draw [W]\n"


def _row(second: int, power: str) -> str:
    return f"2026/07/03 22:11:{second:02d}.000, 0, 40, {power}\n"


@pytest.mark.parametrize("cell", ["nan", "nan W", "NaN W", " nan  W"])
def test_a_nan_with_or_without_its_unit_is_counted_as_a_nan_value(cell: str) -> None:
    health = PipelineHealth()
    batch = parse_query_gpu(HEADER + _row(1, "300.00 W") + _row(2, cell), health=health)
    assert np.isnan(batch.column("power")[1])
    assert health.problems[(STAGE, "NaN value")] == 1


def test_no_value_tokens_are_still_not_counted() -> None:
    health = PipelineHealth()
    parse_query_gpu(HEADER + _row(1, "[N/A]") + _row(2, "[Not Supported]"), health=health)
    assert health.problems[(STAGE, "NaN value")] == 0 and not health.problems


def test_a_column_not_read_is_counted_once_by_name_over_a_files_chunks(caplog) -> None:
    health = PipelineHealth()
    text = "timestamp, index, temperature.gpu, power.dr@w [W]\n" + "".join(
        f"2026/07/03 22:11:{s:02d}.000, 0, 40, 300.00 W\n" for s in range(6))
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        batches = list(parse_query_gpu_chunks(text, health=health, chunk_rows=2))
    assert len(batches) == 3 and all("power" not in b.columns for b in batches)
    assert health.problems[(STAGE, UNMAPPED_COLUMN)] == 1
    told = [r.getMessage() for r in caplog.records if UNMAPPED_COLUMN in r.getMessage()]
    assert len(told) == 1 and "power.dr@w" in told[0]


def test_a_query_the_field_table_does_not_map_is_no_problem() -> None:
    """nvidia-smi refuses a name it does not know: a column named as a query is one asked for (the
    real captures ask for 200 foreshock does not read), not bad input."""
    health = PipelineHealth()
    header = ("timestamp, index, hostname, uuid, pci.bus_id, driver_version, temperature.gpu, temperature.memory, "
              "temperature.gpu.tlimit, clocks_event_reasons_counters.hw_thermal_slowdown [us], "
              "power.draw.average [W]\n")
    parse_query_gpu(header + "2026/07/03 22:11:01.000, 0, n1, GPU-1, 00000000:83:00.0, 590.48.01, 40, 45, 40, 0 us, "
                    "300 W\n", health=health)
    assert not health.problems


def test_the_real_captures_csv_is_read_without_a_problem(shared_data: Path) -> None:
    health = PipelineHealth()
    text = (shared_data / H200).read_text()
    list(parse_query_gpu_chunks(text[text.index("timestamp, driver_version"):], health=health))
    assert health.problems[(STAGE, UNMAPPED_COLUMN)] == 0


def _lines(shared_data: Path, first: int, last: int) -> str:
    return "\n".join((shared_data / H200).read_text().splitlines()[first - 1:last]) + "\n"


@pytest.mark.parametrize("fmt", ["nvidia-smi", "dmon"])
@pytest.mark.parametrize("what, lines, said", [("q", (1478, 1736), "nvidia-smi -q"),
                                               ("table", (1450, 1475), "default table")])
def test_a_report_foreshock_does_not_read_is_refused_saying_what_to_capture(
        shared_data: Path, tmp_path: Path, fmt: str, what: str, lines: tuple[int, int], said: str) -> None:
    path = tmp_path / f"{what}.txt"
    path.write_text(_lines(shared_data, *lines))
    assert "NVSMI LOG" in path.read_text() or "NVIDIA-SMI" in path.read_text()
    result = CliRunner().invoke(command, ["--format", fmt, str(path), "--out", str(tmp_path / "rec")])
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert said in out and "--query-gpu=" in out and "--format=csv" in out and "dmon" in out, out
    assert "no timestamp column" not in out and out.count("foreshock does not import") == 1


@pytest.mark.parametrize("capture, rows", [(H200, {"nvidia-smi": 2, "dmon": 10}), (H100, {"nvidia-smi": 2,
                                                                                          "dmon": 10})])
@pytest.mark.parametrize("fmt", ["nvidia-smi", "dmon"])
def test_the_real_captures_holding_q_sections_import_as_before(shared_data: Path, tmp_path: Path, capture: Path,
                                                               rows: dict[str, int], fmt: str) -> None:
    assert "NVSMI LOG" in (shared_data / capture).read_text()
    result = CliRunner().invoke(command, ["--format", fmt, str(shared_data / capture), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    frame = Recording.open(tmp_path / "r").read_kind("gpu")
    assert len(frame) == rows[fmt]
    assert np.isfinite(frame.columns["gpu_temp"]).all()
