"""``foreshock import`` of a file cut inside its last line (a ``nvidia-smi -l 1`` log or a dcgm scrape
copied while it was written: no final line feed). Its last number may be cut with it, ``100 %`` read
as ``10``, ``25`` °C as ``2``, a reading that looks real; the line is left out and counted as
``truncated row``. Complete captures, which end with a line feed, import every row as before."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

from foreshock.cli.import_cmd import command
from foreshock.recording import Recording
from foreshock.streams.dcgm import parse_dcgm_text
from foreshock.streams.nvidia_smi import capture_sections, parse_dmon, parse_query_gpu

from conftest import SHARED_DATA

H200 = SHARED_DATA / "nvidia-smi" / "linux-x86_64__nvidia-h200__590.48.01.txt"
T4_SCRAPE = SHARED_DATA / "dcgm" / "dcgm-exporter-tesla-t4.prom"
CAPTURES = [(fmt, path) for fmt in ("nvidia-smi", "dmon") for path in sorted((SHARED_DATA / "nvidia-smi").glob("*.txt"))]
CAPTURES.append(("dcgm", T4_SCRAPE))


def _query_gpu_log() -> str:
    """A ``nvidia-smi --query-gpu ... -l 1`` log from the real H200 capture: its header, then the
    idle and the load rows (the same query in both sections)."""
    sections = capture_sections(H200.read_text())
    idle, load = (sections[f"{phase} :: query-gpu"].splitlines() for phase in ("idle", "load"))
    assert idle[0] == load[0] and len(idle) == len(load) == 2
    return "\n".join([idle[0], idle[1], load[1]]) + "\n"


def _dmon_log() -> str:
    sections = capture_sections(H200.read_text())
    return sections["idle :: dmon"] + "".join(line + "\n" for line in sections["load :: dmon"].splitlines()[2:])


def _import(fmt: str, text: str, folder: Path, name: str) -> tuple[str, dict[str, np.ndarray]]:
    """The printed output and the gpu columns (ts and slot included) of ``text`` imported."""
    path = folder / f"{name}.txt"
    path.write_text(text)
    # --overwrite: a test imports several captures one after the other under the same name
    result = CliRunner().invoke(command, ["--format", fmt, str(path), "--out", str(folder / name),
                                          "--time", "2026-07-03T22:10:45Z", "--host", "h200", "--overwrite"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    frame = Recording.open(folder / name).read_kind("gpu")
    return result.output, {"ts": frame.ts, "slot": frame.slot, **frame.columns}


def _problem_rows(printed: str) -> list[str]:
    """The printed problems table's rows, each 'stage | reason | count'."""
    return sorted(" | ".join(cell.strip() for cell in line.split("│")[1:4])
                  for line in printed.splitlines() if line.count("│") == 4)


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def _check_cut(fmt: str, stage: str, text: str, cut: float) -> None:
    """``text`` cut inside its last line (``cut``: how far into it, 0 to 1) imports what ``text``
    without that line imports, with one ``truncated row`` more."""
    assert text.endswith("\n")
    line_start = text.rstrip("\n").rfind("\n") + 1
    line_end = len(text) - 1  # (without its line feed)
    first = line_start + len(text[line_start:]) - len(text[line_start:].lstrip())  # (dmon indents its rows)
    end = first + 1 + int(cut * (line_end - first - 1))  # at least one character that is not blank
    with tempfile.TemporaryDirectory() as folder:
        printed, imported = _import(fmt, text[:end], Path(folder), "cut")
        printed_before, before = _import(fmt, text[:line_start], Path(folder), "before")
    assert _same(imported, before), f"{text[line_start:end]!r} was read"
    assert _problem_rows(printed) == sorted(_problem_rows(printed_before) + [f"{stage} | truncated row | 1"])


@settings(max_examples=20, deadline=None)
@given(st.floats(0, 1))
@example(1.0)  # every character but the line feed: the row looks whole
@example(0.998)  # inside its last cell
def test_a_query_gpu_log_cut_in_its_last_row_leaves_that_row_out(cut: float) -> None:
    _check_cut("nvidia-smi", "nvidia-smi", _query_gpu_log(), cut)


@settings(max_examples=20, deadline=None)
@given(st.floats(0, 1))
@example(1.0)
@example(0.95)
def test_a_dmon_log_cut_in_its_last_row_leaves_that_row_out(cut: float) -> None:
    _check_cut("dmon", "dmon", _dmon_log(), cut)


@settings(max_examples=20, deadline=None)
@given(st.floats(0, 1))
@example(1.0)
@example(0.999)
def test_a_dcgm_scrape_cut_in_its_last_line_leaves_that_line_out(cut: float) -> None:
    text = T4_SCRAPE.read_text()
    temp = 'DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 25\n'
    assert temp in text  # the reviewer's case: the GPU temperature's line, 25 °C cut to 2
    _check_cut("dcgm", "dcgm", text[:text.index(temp) + len(temp)], cut)
    _check_cut("dcgm", "dcgm", text, cut)  # the last line of the scrape


def test_a_utilisation_cut_to_its_first_digits_is_not_read(tmp_path: Path) -> None:
    """The reviewer's case: ``100 %`` cut to ``10`` imported a utilisation of 0.1, no problem said."""
    log = ("timestamp, index, temperature.gpu, utilization.gpu [%]\n"
           "2026/07/03 22:10:46.109, 0, 28, 0 %\n"
           "2026/07/03 22:10:47.109, 0, 52, 100 %\n")
    printed, imported = _import("nvidia-smi", log + "2026/07/03 22:10:48.109, 0, 53, 10", tmp_path, "cut")
    assert imported["util"].tolist() == [0.0, 1.0] and imported["gpu_temp"].tolist() == [28.0, 52.0]
    assert _problem_rows(printed) == ["nvidia-smi | truncated row | 1"]


def test_the_gpu_temperature_cut_to_its_first_digit_is_not_read(tmp_path: Path) -> None:
    """The reviewer's case, the value named: ``25`` cut to ``2`` imported 2 °C."""
    text = T4_SCRAPE.read_text()
    temp = 'DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 25'
    printed, imported = _import("dcgm", text[:text.index(temp) + len(temp) - 1], tmp_path, "cut")
    assert np.isnan(imported["gpu_temp"]).all()
    assert "dcgm | truncated row | 1" in _problem_rows(printed)


def test_a_last_blank_line_without_a_line_feed_is_no_problem(tmp_path: Path) -> None:
    """A blank last line holds nothing to lose; any other (a comment too: the file was cut) is counted."""
    log = _query_gpu_log()
    _, whole = _import("nvidia-smi", log, tmp_path, "whole")
    printed, imported = _import("nvidia-smi", log + "   ", tmp_path, "blank")
    assert _same(imported, whole) and "no input problems" in printed
    scrape = T4_SCRAPE.read_text()
    _, whole = _import("dcgm", scrape, tmp_path, "whole")
    printed, imported = _import("dcgm", scrape + "# HELP DCGM_FI_DEV_SM_CL", tmp_path, "comment")
    assert _same(imported, whole) and "dcgm | truncated row | 1" in _problem_rows(printed)


def _rows_in(fmt: str, text: str) -> int:
    """The gpu rows the parser reads from the whole of a capture, each section in one piece."""
    if fmt == "dcgm":
        return len(parse_dcgm_text(text, 0.0))
    bodies = [body for title, body in capture_sections(text).items() if title.endswith(f":: {fmt.replace('nvidia-smi', 'query-gpu')}")]
    parse = parse_dmon if fmt == "dmon" else parse_query_gpu
    return sum(len(parse(body)) for body in bodies)


def test_complete_captures_import_every_row(tmp_path: Path) -> None:
    """Every real capture ends with a line feed: nothing is left out or counted as cut."""
    for fmt, path in CAPTURES:
        text = path.read_text()
        assert text.endswith("\n"), path
        printed, imported = _import(fmt, text, tmp_path, "capture")
        assert "truncated row" not in printed, (fmt, path)
        assert len(imported["ts"]) == _rows_in(fmt, text) > 0, (fmt, path)
