"""nvidia-smi ``--query-gpu`` CSV: a unit the CSV states (a header's ``[mW]``, a cell's ``122 F``) that is not the
one nvidia-smi prints for the query (W, MHz, %, us, none for temperatures) had been thrown away, the number read
in the printed unit (630000 W, a 122 °C thermal emergency). A unit an SI prefix apart is converted, any other
sets the cell to NaN and is counted (``unit mismatch``), naming the column and unit."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from foreshock.cli.import_cmd import command
from foreshock.health import PipelineHealth
from foreshock.streams.nvidia_smi import parse_query_gpu

T0 = "2026/12/01 00:00:00.000"


def _parse(header: str, *cells: str) -> tuple[dict[str, list[float]], PipelineHealth]:
    health = PipelineHealth()
    text = f"timestamp, index, {header}\n" + "".join(f"{T0}, {n}, {cell}\n" for n, cell in enumerate(cells))
    batch = parse_query_gpu(text, "h", health)
    return {name: col.tolist() for name, col in batch.columns.items()}, health


def _mismatches(health: PipelineHealth) -> int:
    return health.problems.get(("nvidia-smi", "unit mismatch"), 0)


@pytest.mark.parametrize(("header", "cell", "field", "value"), [
    ("power.draw [mW]", "630000", "power", 630.0),          # the header's unit, cells without one (nounits)
    ("power.draw [W]", "630000 mW", "power", 630.0),        # the cell's own unit wins over the header's
    ("power.draw [kW]", "0.63 kW", "power", 630.0),
    ("enforced.power.limit [W]", "700000 mW", "power_limit", 700.0),
    ("clocks.current.sm [GHz]", "1.98", "sm_clock", 1.98e9),
    ("clocks.current.sm [MHz]", "1980000 kHz", "sm_clock", 1.98e9),
    ("clocks.max.sm [MHz]", "1.98 GHz", "sm_clock_max", 1.98e9),
    ("clocks_event_reasons_counters.sw_power_cap [us]", "2 ms", "power_throttle_time", 2e-3),
])
def test_a_unit_an_si_prefix_from_the_printed_one_is_converted(header: str, cell: str, field: str,
                                                               value: float) -> None:
    columns, health = _parse(header, cell)
    assert columns[field] == [pytest.approx(value)]
    assert _mismatches(health) == 0


@pytest.mark.parametrize(("header", "cells", "field"), [
    ("temperature.gpu", ("122 F", "50 F"), "gpu_temp"),     # nvidia-smi prints no unit for temperatures
    ("temperature.gpu [F]", ("122", "50"), "gpu_temp"),
    ("temperature.memory", ("300 K", "310 K"), "hbm_temp"),
    ("power.draw [W]", ("630 A", "1 A"), "power"),
    ("utilization.gpu [%]", ("0.5 ratio", "0.2 ratio"), "util"),
])
def test_a_unit_that_cannot_be_converted_is_counted_and_its_cells_are_nan(
        header: str, cells: tuple[str, ...], field: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        columns, health = _parse(header, *cells, "[N/A]")
    assert all(math.isnan(v) for v in columns.get(field, [math.nan]))
    assert _mismatches(health) == len(cells)  # the cells that held a number: [N/A] held none
    column = header.split(" [")[0]
    unit = (cells[0].split() + [header.split("[")[-1].rstrip("]")])[1]
    logged = [r.getMessage() for r in caplog.records if "unit mismatch" in r.getMessage()]
    assert len(logged) == 1 and column in logged[0] and repr(unit) in logged[0]


def test_the_printed_units_and_celsius_spelled_c_are_read_as_they_are_beside_a_converted_one() -> None:
    columns, health = _parse("temperature.gpu, power.draw [W], utilization.gpu [%], clocks.current.sm [MHz], "
                             "enforced.power.limit [kW]", "59 C, 627.40 W, 100 %, 1980 MHz, 0.7 kW")
    assert columns["gpu_temp"] == [59.0] and columns["power"] == [627.4]
    assert columns["util"] == [1.0] and columns["sm_clock"] == [1.98e9]
    assert columns["power_limit"] == [pytest.approx(700.0)]
    assert not health.problems


def test_a_tlimit_in_another_unit_gives_no_limit() -> None:
    columns, health = _parse("temperature.gpu, temperature.memory, temperature.gpu.tlimit", "40, 40, 50 F")
    assert math.isnan(columns["max_op_temp"][0])
    assert _mismatches(health) == 1


def test_an_import_of_a_csv_stating_other_units_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "smi.csv"
    path.write_text("timestamp, index, temperature.gpu, power.draw [W], memory.used [MiB]\n"
                    + "".join(f"2026/12/01 00:00:0{t}.000, 0, 122 F, 630000 mW, 1 GiB\n" for t in range(5)))
    result = CliRunner().invoke(command, ["--format", "nvidia-smi", str(path), "--out", str(tmp_path / "rec")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "unit mismatch" in result.output
    table = pq.read_table(tmp_path / "rec" / "gpu.parquet").to_pydict()
    assert table["power"] == [630.0] * 5
    assert np.isnan(np.array(table["gpu_temp"], dtype=float)).all()
