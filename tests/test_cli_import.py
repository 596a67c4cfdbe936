"""``foreshock import``: real captures -> recordings that read back with the exact values."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.import_cmd import command
from foreshock.recording import Recording


def run(*args: str) -> str:
    result = CliRunner().invoke(command, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_import_dcgm(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    text = run("--format", "dcgm", str(shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom"), "--out", str(out),
               "--time", "2026-07-01T00:00:00Z")
    assert "unmapped metric ignored" in text and "gpu" in text
    rec = Recording.open(out)
    assert rec.meta["source"] == "import:dcgm"
    frame = rec.read_kind("gpu")
    slot = rec.topology.slot("gpu", "424773df46e0/gpu0")
    row = int(np.flatnonzero(frame.slot == slot)[0])
    assert frame.ts[row] == datetime(2026, 7, 1, tzinfo=timezone.utc).timestamp()
    assert (frame.columns["sm_clock"][row], frame.columns["gpu_temp"][row], frame.columns["power"][row]) == (
        3.0e8, 25.0, 8.969)
    assert frame.columns["energy"][row] == 128996.013


def test_import_nvidia_smi_capture_takes_every_query_gpu_section(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    run("--format", "nvidia-smi", str(shared_data / "nvidia-smi" / "linux-x86_64__nvidia-h200__590.48.01.txt"),
        "--out", str(out), "--host", "h200")
    frame = Recording.open(out).read_kind("gpu")
    assert len(frame) == 2  # idle, then load
    assert frame.columns["throttle_reasons"].tolist() == [1.0, 0.0]
    assert frame.columns["power"].tolist() == [77.71, 627.40]
    assert frame.columns["sm_clock"].tolist() == [345e6, 1.98e9]


def test_import_dmon_capture(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    text = run("--format", "dmon", str(shared_data / "nvidia-smi" / "linux-x86_64__nvidia-h200__590.48.01.txt"),
               "--out", str(out))
    assert "no input problems" in text
    rec = Recording.open(out)
    frame = rec.read_kind("gpu")
    # each dmon section no earlier than the newest CSV stamp before it in the capture (the idle
    # retired-pages query at 22:10:46.307, the load one at 22:11:09.950): dmon prints no times, and
    # placed back to back from collected_at (22:10:45) the load samples read ~20 s before they ran
    idle = datetime(2026, 7, 3, 22, 10, 46, 307000, tzinfo=timezone.utc).timestamp()
    load = datetime(2026, 7, 3, 22, 11, 9, 950000, tzinfo=timezone.utc).timestamp()
    assert frame.ts.tolist() == pytest.approx([idle + k for k in range(5)] + [load + k for k in range(5)])
    assert frame.columns["power"][5:].tolist() == [630.0, 628.0, 629.0, 632.0, 630.0]
    assert (frame.columns["gpu_temp"][5], frame.columns["hbm_temp"][5], frame.columns["sm_clock"][5]) == (
        53.0, 41.0, 1.98e9)
    assert rec.meta["interval"] == 1.0


def test_import_alibaba(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    text = run("--format", "alibaba", str(shared_data / "optics" / "alibaba_prefec_ber.csv"), "--out", str(out))
    assert "blank row" in text and "stats_type max" in text
    rec = Recording.open(out)
    frame = rec.read_kind("optic")
    assert len(frame) == 10322 and len(np.unique(frame.slot)) == 50
    assert rec.meta["interval"] == 3600.0
    assert len(rec.topology.links) == 25


def test_import_sysfs_tree(tmp_path: Path) -> None:
    port = tmp_path / "ib" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    for name in ("port_xmit_data", "port_rcv_data", "port_xmit_wait", "symbol_error", "link_downed",
                 "link_error_recovery", "port_rcv_errors", "port_xmit_discards",
                 "excessive_buffer_overrun_errors", "local_link_integrity_errors"):
        (port / "counters" / name).write_text("10\n")
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    out = tmp_path / "rec"
    run("--format", "sysfs", str(tmp_path / "ib"), "--out", str(out), "--host", "gpu-node-1", "--time",
        "2026-01-01T00:00:00")
    rec = Recording.open(out)
    frame = rec.read_kind("link")
    assert rec.topology.links == ["gpu-node-1/mlx5_0/1"]
    assert frame.columns["tx_data"].tolist() == [40.0] and frame.columns["link_rate"].tolist() == [4e11]


def test_import_jsonl_counts_rejected_records(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    records = [{"kind": "gpu", "entity": "n1/gpu0", "ts": 10.0, "gpu_temp": 50},
               {"kind": "gpu", "entity": "n1/gpu1", "ts": 10.0, "power": 300.5},
               {"kind": "gpu", "entity": "n1/gpu0", "ts": 11.0, "gpu_temp": "hot"},
               {"kind": "gpu", "entity": "n1/gpu0", "ts": 12.0, "wattage": 1}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n{not json\n")
    out = tmp_path / "rec"
    text = run("--format", "jsonl", str(path), "--out", str(out))
    assert "non-numeric field value" in text and "invalid JSON line" in text and "unknown fields" in text
    frame = Recording.open(out).read_kind("gpu")
    assert len(frame) == 2
    assert frame.columns["power"][1] == 300.5


def test_a_jsonl_line_json_cannot_hold_is_counted_and_a_line_separator_in_a_string_is_no_line_end(
        tmp_path: Path) -> None:
    """A 5000-digit number (int() refuses it: ValueError, not JSONDecodeError) and 100k-deep
    nesting (RecursionError) ended the import with a traceback; U+2028 inside a string is legal
    JSON, and str.splitlines cut that record in two (two invalid lines, the record lost)."""
    path = tmp_path / "in.jsonl"
    good = {"kind": "gpu", "entity": "n1/gpu0", "ts": 10.0, "gpu_temp": 50}
    lines = [json.dumps(good), '{"kind": "gpu", "ts": ' + "9" * 5000 + "}", "[" * 100_000 + "]" * 100_000,
             json.dumps({**good, "kind": "g\u2028pu"}, ensure_ascii=False), json.dumps({**good, "ts": 11.0})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    text = run("--format", "jsonl", str(path), "--out", str(tmp_path / "rec"))
    counts = {row.split("│")[2].strip(): row.split("│")[3].strip() for row in text.splitlines() if row.count("│") == 4}
    assert counts["invalid JSON line"] == "2"  # the two lines JSON cannot hold, not the separator's halves
    assert [n for reason, n in counts.items() if reason.startswith("unknown entity kind")] == ["1"]  # read whole
    frame = Recording.open(tmp_path / "rec").read_kind("gpu")
    assert list(frame.ts) == [10.0, 11.0]


def test_a_jsonl_file_imported_in_pieces_gives_what_one_piece_gives(tmp_path: Path, monkeypatch, caplog) -> None:
    """A days-long JSON-lines file is parsed a piece of lines at a time (every record as a Python
    dict at once took many times the file's size): the same rows, the same counted problems,
    and a bad line still named by its number in the file."""
    from foreshock.cli import import_cmd

    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"kind": "gpu", "entity": f"n{i % 3}/gpu{i % 2}", "ts": 100.0 + i // 6, "gpu_temp": 40 + i % 9})
             for i in range(60)]
    lines[37] = "{not json"
    lines[41] = json.dumps({"kind": "gpu", "entity": "n0/gpu0", "ts": "soon", "gpu_temp": 1})
    path.write_text("\n".join(lines) + "\n")
    whole = run("--format", "jsonl", str(path), "--out", str(tmp_path / "whole"))
    monkeypatch.setattr(import_cmd, "JSONL_CHUNK_LINES", 7)
    with caplog.at_level("WARNING"):
        pieces = run("--format", "jsonl", str(path), "--out", str(tmp_path / "pieces"))
    a, b = Recording.open(tmp_path / "whole"), Recording.open(tmp_path / "pieces")
    assert a.topology.gpus == b.topology.gpus and len(a.topology.gpus) == 6
    fa, fb = a.read_kind("gpu"), b.read_kind("gpu")
    assert len(fa) == len(fb) == 58
    assert np.array_equal(fa.ts, fb.ts) and np.array_equal(fa.slot, fb.slot)
    assert np.array_equal(fa.columns["gpu_temp"], fb.columns["gpu_temp"])
    problems = [line for line in pieces.splitlines() if "│" in line and "jsonl" in line]
    assert problems == [line for line in whole.splitlines() if "│" in line and "jsonl" in line] and len(problems) == 2
    assert f"{path}:38:" in caplog.text  # the line's number in the file, not in its piece


def test_bad_arguments_give_clear_errors(tmp_path: Path) -> None:
    result = CliRunner().invoke(command, ["--format", "dcgm", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "does not exist" in result.output
    empty = tmp_path / "empty.prom"
    empty.write_text("# nothing here\n")
    result = CliRunner().invoke(command, ["--format", "dcgm", str(empty), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "no samples imported" in result.output


def fails(*args: str) -> str:
    """Exit 1 with an ``Error:`` line, not a traceback."""
    result = CliRunner().invoke(command, list(args))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    return result.output


def test_an_import_with_no_samples_keeps_the_recording_it_would_replace(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec"
    run("--format", "dcgm", str(shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom"), "--out", str(out),
        "--time", "2026-07-01T00:00:00Z")
    before = len(Recording.open(out).read_kind("gpu"))
    rejected = tmp_path / "bad.jsonl"
    rejected.write_text('{"kind": "gpu", "entity": "n0/gpu0", "ts": "yesterday", "gpu_temp": 50}\n')
    header_only = tmp_path / "hdr.csv"
    header_only.write_text("device_name,logical_name,item,stats_type,value,och,center_frequency,och_group,time,side,pn\n")
    # --overwrite: a replacement allowed, an import with no samples still must not clear the recording
    text = fails("--format", "jsonl", str(rejected), "--out", str(out), "--overwrite")
    assert "no samples imported" in text and "missing or non-numeric 'ts'" in text  # the table says why
    text = fails("--format", "alibaba", str(header_only), "--out", str(out), "--overwrite")
    assert "no samples imported" in text and "no data" in text
    assert len(Recording.open(out).read_kind("gpu")) == before


def test_a_file_with_nothing_in_it_says_so_instead_of_pointing_at_problems(tmp_path: Path) -> None:
    empty = tmp_path / "q.csv"
    empty.write_text("")
    text = fails("--format", "nvidia-smi", str(empty), "--out", str(tmp_path / "o"))
    assert "holds no data" in text and "see the problems above" not in text


@pytest.mark.parametrize("fmt", ["dcgm", "nvidia-smi", "jsonl", "alibaba"])
def test_a_utf8_bom_is_ignored(fmt: str, shared_data: Path, tmp_path: Path) -> None:
    """Windows tools (Excel, Notepad) save a BOM: the import must equal the one without it."""
    source = {
        "dcgm": shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom",
        "nvidia-smi": shared_data / "nvidia-smi" / "linux-x86_64__nvidia-h200__590.48.01.txt",
        "alibaba": shared_data / "optics" / "alibaba_prefec_ber.csv",
    }.get(fmt)
    if source is None:
        plain = "\n".join(json.dumps({"kind": "gpu", "entity": f"n0/gpu{k}", "ts": 10.0 + k, "gpu_temp": 50 + k})
                          for k in range(3)) + "\n"
    else:
        plain = source.read_text(encoding="utf-8")
    if fmt == "dcgm":  # no "# HELP" first: the BOM then sits on the first metric's name
        plain = "".join(line for line in plain.splitlines(keepends=True) if not line.startswith("#"))
    frames = []
    for name, text in (("plain", plain), ("bom", "\ufeff" + plain)):
        path = tmp_path / f"{name}.in"
        path.write_text(text, encoding="utf-8")
        out = tmp_path / name
        printed = run("--format", fmt, str(path), "--out", str(out), "--time", "2026-07-01T00:00:00Z")
        frames.append((Recording.open(out).read_kind("optic" if fmt == "alibaba" else "gpu"), printed))
    (plain_frame, plain_text), (bom_frame, bom_text) = frames
    assert plain_text.count("unmapped metric") == bom_text.count("unmapped metric")
    assert len(bom_frame) == len(plain_frame)
    for column, values in plain_frame.columns.items():
        np.testing.assert_array_equal(bom_frame.columns[column], values)


@pytest.mark.parametrize("fmt", ["jsonl", "nvidia-smi", "dcgm", "dmon", "alibaba"])
def test_a_folder_is_refused_for_file_formats(fmt: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(command, ["--format", fmt, str(tmp_path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "is a folder" in result.output, result.output


def test_an_out_folder_that_cannot_be_made_gives_an_error_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"kind": "gpu", "entity": "n0/gpu0", "ts": 10.0, "gpu_temp": 50}) + "\n")
    (tmp_path / "afile").write_text("")
    text = fails("--format", "jsonl", str(path), "--out", str(tmp_path / "afile" / "sub"))
    assert "cannot write the recording" in text


def test_a_csv_that_is_not_the_alibaba_one_gives_an_error_not_a_traceback(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert "empty file" in fails("--format", "alibaba", str(empty), "--out", str(tmp_path / "o"))
    other = tmp_path / "q.csv"
    other.write_text("timestamp, index, power.draw [W]\n2026/07/03 22:10:46.000, 0, 77.71 W\n")
    assert "not the Alibaba" in fails("--format", "alibaba", str(other), "--out", str(tmp_path / "o"))


def test_nanosecond_timestamps_are_written_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "ns.jsonl"
    path.write_text("\n".join(json.dumps({"kind": "gpu", "entity": "n0/gpu0", "ts": 1.7e18 + k * 1e9,
                                          "gpu_temp": 50}) for k in range(3)) + "\n")
    text = run("--format", "jsonl", str(path), "--out", str(tmp_path / "rec"))
    assert "1700000000000000000" in text and "ns since the epoch" in text
    assert len(Recording.open(tmp_path / "rec").read_kind("gpu")) == 3


@pytest.mark.parametrize("interval", ["nan", "inf", "0"])
def test_dmon_interval_must_be_finite_and_positive(interval: str, tmp_path: Path) -> None:
    path = tmp_path / "dmon.txt"
    path.write_text("# gpu pwr\n# Idx W\n0 70\n")
    result = CliRunner().invoke(command, ["--format", "dmon", str(path), "--out", str(tmp_path / "o"),
                                          "--interval", interval])
    assert result.exit_code == 2 and "--interval" in result.output, result.output


def _problem_rows(printed: str) -> list[str]:
    """The rows of the printed problems table (stage jsonl), each 'reason | count'."""
    return sorted(" | ".join(cell.strip() for cell in line.split("│")[2:4])
                  for line in printed.splitlines() if "│" in line and "│ jsonl" in line)


def test_a_jsonl_file_without_topology_is_parsed_once(tmp_path: Path, monkeypatch) -> None:
    """Without --topology the GPUs' names make the topology; that was a first parse of every line,
    then a second to convert (twice the time of the JSON parsing, and a second copy of the text)."""
    import types

    from foreshock.cli import import_cmd

    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"kind": "gpu", "entity": f"n{i % 3}/gpu{i % 2}", "ts": 100.0 + i // 6, "gpu_temp": 40})
             for i in range(24)]
    path.write_text("\n".join(lines) + "\n\n")
    parsed: list[str] = []

    def counting_loads(line: str) -> object:
        parsed.append(line)
        return json.loads(line)

    monkeypatch.setattr(import_cmd, "json", types.SimpleNamespace(loads=counting_loads,
                                                                  JSONDecodeError=json.JSONDecodeError))
    monkeypatch.setattr(import_cmd, "JSONL_CHUNK_LINES", 5)
    run("--format", "jsonl", str(path), "--out", str(tmp_path / "rec"))
    assert sorted(parsed) == sorted(lines)  # each line once, the blank one not at all
    assert len(Recording.open(tmp_path / "rec").read_kind("gpu")) == 24


def test_entities_are_judged_against_the_topology_of_the_whole_file(tmp_path: Path, monkeypatch) -> None:
    """In one pass the topology (from every GPU name of the file) is known only at the end: a node
    record before its host's first GPU record is kept, a record whose entity the file's GPUs never
    name is counted as an unknown entity even when something else is wrong with it too, and the
    rows and problems are those of an import given that topology up front."""
    from foreshock.cli import import_cmd

    records: list[object] = [
        {"kind": "node", "entity": "late", "ts": 5.0, "fan_speed": 9000},  # host of a later GPU record
        {"kind": "node", "entity": "ghost", "ts": 5.0, "fan_speed": 1, "rpm": 2},  # unknown entity first
        {"kind": "node", "entity": "late", "ts": 6.0, "rpm": 2},  # known entity: its fields are wrong
        {"kind": "node", "entity": 7, "ts": 6.0, "fan_speed": 1},  # quoted as JSON gave it
        {"kind": "node", "entity": "late", "ts": 7.0, "psu_power": "high"},
        {"kind": "gpu", "entity": "n0/gpu1", "ts": 5.0, "gpu_temp": 50},
        {"kind": "gpu", "entity": "n0/gpu007", "ts": 5.0, "gpu_temp": 50},  # no name: gives n0 no GPUs
        {"kind": "link", "entity": "sw0/p1", "ts": 5.0, "tx_data": 1, "speed": 3},
        {"kind": "gpu", "entity": "n0/gpu0", "ts": 6.0, "gpu_temp": 51},  # gpu0 named by gpu1's count
        {"kind": "gpu", "entity": "late/gpu3", "ts": 7.0, "gpu_temp": 52},
        {"kind": "node", "entity": "late", "ts": 8.0, "fan_speed": 9100},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    monkeypatch.setattr(import_cmd, "JSONL_CHUNK_LINES", 2)  # the node rows come pieces before 'late/gpu3'
    derived = run("--format", "jsonl", str(path), "--out", str(tmp_path / "derived"))
    rec = Recording.open(tmp_path / "derived")
    assert rec.topology.nodes == ["late", "n0"] and len(rec.topology.gpus) == 4 + 2
    nodes, gpus = rec.read_kind("node"), rec.read_kind("gpu")
    assert nodes.ts.tolist() == [5.0, 8.0] and nodes.columns["fan_speed"].tolist() == [9000.0, 9100.0]
    assert nodes.slot.tolist() == [rec.topology.slot("node", "late")] * 2
    assert gpus.ts.tolist() == [5.0, 6.0, 7.0] and gpus.columns["gpu_temp"].tolist() == [50.0, 51.0, 52.0]
    assert [rec.topology.gpus[s] for s in gpus.slot] == ["n0/gpu1", "n0/gpu0", "late/gpu3"]
    assert _problem_rows(derived) == sorted([
        "non-numeric field value | 1", "unknown fields ['rpm'] | 1", "unknown gpu entity | 1",
        "unknown link entity | 1", "unknown node entity | 2"])
    given = run("--format", "jsonl", str(path), "--out", str(tmp_path / "given"),
                "--topology", str(tmp_path / "derived" / "topology.yaml"))
    assert _problem_rows(given) == _problem_rows(derived)
    other = Recording.open(tmp_path / "given")
    for kind, frame in (("node", nodes), ("gpu", gpus)):
        again = other.read_kind(kind)
        assert np.array_equal(again.ts, frame.ts) and np.array_equal(again.slot, frame.slot)


def test_a_jsonl_gpu_index_past_the_largest_is_counted_not_made_a_topology_of(tmp_path: Path) -> None:
    """Without --topology a GPU's index sized its host: one record of GPU 4294967295 (a common "no
    index" sentinel) took minutes and all memory, 2000000 made a topology of 2000001 GPUs reported
    as "no input problems". Such records are counted as the dcgm and nvidia-smi parsers count
    theirs, ``bad GPU index``, their other problems too (the entity's is the first reason)."""
    from foreshock.streams.samples import MAX_GPU_INDEX

    records = [{"kind": "gpu", "entity": "n0/gpu0", "ts": 10.0, "gpu_temp": 50},
               {"kind": "gpu", "entity": "n0/gpu2000000", "ts": 10.0, "gpu_temp": 51},
               {"kind": "gpu", "entity": f"n0/gpu{MAX_GPU_INDEX + 1}", "ts": 11.0, "gpu_temp": 52},
               {"kind": "gpu", "entity": "n0/gpu2000000", "ts": 11.0, "wattage": 1},
               {"kind": "gpu", "entity": "n1/gpu" + "9" * 5000, "ts": 11.0, "gpu_temp": 53},
               {"kind": "gpu", "entity": "n0/gpu2000000", "ts": "soon", "gpu_temp": 54},
               {"kind": "gpu", "entity": f"n1/gpu{MAX_GPU_INDEX}", "ts": 12.0, "gpu_temp": 55}]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    text = run("--format", "jsonl", str(path), "--out", str(tmp_path / "rec"))
    assert _problem_rows(text) == ["bad GPU index | 4", "missing or non-numeric 'ts' | 1"]
    rec = Recording.open(tmp_path / "rec")
    assert rec.topology.nodes == ["n0", "n1"] and len(rec.topology.gpus) == 1 + MAX_GPU_INDEX + 1
    frame = rec.read_kind("gpu")
    assert [rec.topology.gpus[s] for s in frame.slot] == ["n0/gpu0", f"n1/gpu{MAX_GPU_INDEX}"]
    assert frame.columns["gpu_temp"].tolist() == [50.0, 55.0]


def test_jsonl_gpu_names_other_than_host_gpu_n_are_counted_and_the_rest_imported(tmp_path: Path, caplog) -> None:
    """A derived topology names its GPUs HOST/gpuN: ``n0/gpu01`` had given n0 a GPU 1 that the
    topology names ``n0/gpu1`` (the records then all unknown), ``gpu²`` (a digit to str.isdigit(),
    not to int()) and a name of another form had stopped the import. They are unknown entities."""
    records = [{"kind": "gpu", "entity": "n0/gpu0", "ts": 10.0, "gpu_temp": 50},
               {"kind": "gpu", "entity": "n0/gpu03", "ts": 10.0, "gpu_temp": 51},
               {"kind": "gpu", "entity": "n0/gpu\u00b2", "ts": 10.0, "gpu_temp": 52},
               {"kind": "gpu", "entity": "GPU-5fd3c6b1", "ts": 10.0, "gpu_temp": 53},
               {"kind": "gpu", "entity": 7, "ts": 10.0, "gpu_temp": 54},
               {"kind": "gpu", "entity": "n0/gpu1", "ts": 11.0, "gpu_temp": 55}]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    with caplog.at_level("WARNING"):
        text = run("--format", "jsonl", str(path), "--out", str(tmp_path / "rec"))
    assert _problem_rows(text) == ["unknown gpu entity | 4"]
    assert "'n0/gpu03', 'n0/gpu²', 'GPU-5fd3c6b1', 7" in caplog.text and "pass --topology" in caplog.text
    rec = Recording.open(tmp_path / "rec")
    assert rec.topology.gpus == ["n0/gpu0", "n0/gpu1"]  # not sized by gpu03
    assert rec.read_kind("gpu").columns["gpu_temp"].tolist() == [50.0, 55.0]


def test_an_alibaba_csv_with_a_byte_that_is_not_utf8_imports_the_other_rows(tmp_path: Path) -> None:
    """The import had stopped at the byte, calling the file not the Alibaba CSV at all."""
    header = "device_name,logical_name,item,stats_type,value,och,center_frequency,och_group,time,side,pn\n"
    rows = [f"T{n},/1/1/L1,preFecBer,avg,0.001,1,191400000,1,2000/1/1 00:00,{side},ot1\n"
            for n, side in ((1, "A"), (2, "Z"))]
    path = tmp_path / "ber.csv"
    path.write_bytes(header.encode() + rows[0].encode().replace(b"T1", b"T\xe91") + rows[1].encode())
    text = run("--format", "alibaba", str(path), "--out", str(tmp_path / "rec"))
    assert "undecodable bytes" in text
    assert len(Recording.open(tmp_path / "rec").read_kind("optic")) == 1
