"""What nvidia-smi's T.Limit is a headroom to, read on a real H200 (2026-12-04).

``tests/data/h200_tlimit/`` holds what a lent H200 (driver 580.159.04) printed while
``deploy/device/gpu_load.py`` stepped it idle -> memory-bound copy -> bf16 matmul -> copy -> idle:
``nvidia-smi.csv`` is the live source's own query (``NvidiaSmiSource.argv``, without the UUID)
with ``-lms 500``; ``nvml-margin.jsonl`` is ``deploy/device/tlimit_check.py`` reading NVML's
margin temperature and the thresholds once a second beside it; ``phases.jsonl`` is the load's log.
``warmer-die-*.jsonl``: the same probe at 0.5 s on another H200 (idle -> matmul -> copy -> idle),
whose die ran 7 °C warmer in the copy and stayed the nearer to its limit throughout.

The finding: T.Limit (``temperature.gpu.tlimit``) is the headroom to the *nearest* limit, the
memory's included. Under the copy the memory (59 °C, 36 under its 95) is nearer its limit than the
die (48 °C, 39 under 87), and ``temperature.gpu`` plus T.Limit put the die's max operating
temperature at 82-86 °C; a live ``foreshock watch --source nvidia-smi`` on another H200 exported 83
during a copy where NVML's watch beside it exported 87. The source now derives the die's limit only
where the memory is clearly further from its own (``max_op_from_tlimit``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock import facts
from foreshock.cli.main import cli
from foreshock.detectors import thermal as th
from foreshock.detectors import thermal_fit as tf
from foreshock.exporters.prometheus import build_registry
from foreshock.exporters.store import FindingStore
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.recording import Recording
from foreshock.streams.nvidia_smi import TLIMIT_WITHOUT_MEMORY, max_op_from_tlimit, parse_query_gpu

DATA = Path(__file__).parent / "data" / "h200_tlimit"
DIE_LIMIT_C = 87.0  # what NVML's GPU_MAX threshold read on this GPU (nvml-margin.jsonl's first line)


def raw_rows() -> list[dict[str, int]]:
    """The CSV's temperatures and T.Limit as printed, read without foreshock."""
    with open(DATA / "nvidia-smi.csv", newline="") as fh:
        rows = list(csv.reader(fh, skipinitialspace=True))
    header = rows[0]
    at = {name: header.index(name) for name in ("temperature.gpu", "temperature.memory", "temperature.gpu.tlimit")}
    return [{"gpu": int(r[at["temperature.gpu"]]), "memory": int(r[at["temperature.memory"]]),
             "tlimit": int(r[at["temperature.gpu.tlimit"]])} for r in rows[1:]]


def test_the_recording_shows_tlimit_is_the_nearer_of_the_die_and_memory_headrooms() -> None:
    """The data, read without foreshock: every row's T.Limit is the smaller of 87 less the die's and
    95 less the memory's temperature (within the degree the three whole-degree readings round by;
    once two, as the copy ended and the memory fell 5 °C between rows), the memory's is the smaller
    in over a hundred rows, and there the die's limit read as
    ``temperature.gpu`` plus T.Limit is wrong by up to 5 °C. NVML agrees: its thresholds are 87
    and 95, and its margin temperature is T.Limit (within a degree, read up to half a second apart)."""
    static = json.loads((DATA / "nvml-margin.jsonl").read_text().splitlines()[0])["static"]
    assert (static["gpu_max_op"], static["mem_max_op"]) == (DIE_LIMIT_C, facts.HBM_MAX_OPERATING_TEMP_C)
    rows = raw_rows()
    assert len(rows) > 250
    nearer = [min(DIE_LIMIT_C - r["gpu"], facts.HBM_MAX_OPERATING_TEMP_C - r["memory"]) for r in rows]
    off = np.array([abs(r["tlimit"] - n) for r, n in zip(rows, nearer)])
    assert off.max() <= 2 and (off <= 1).sum() >= len(rows) - 1  # 2 once: the memory falling 5 °C a row
    memory_nearer = [r for r in rows if facts.HBM_MAX_OPERATING_TEMP_C - r["memory"] < DIE_LIMIT_C - r["gpu"]
                     and r["tlimit"] == facts.HBM_MAX_OPERATING_TEMP_C - r["memory"]]
    assert len(memory_nearer) > 100
    assert min(r["gpu"] + r["tlimit"] for r in memory_nearer) <= DIE_LIMIT_C - 4
    polls = [json.loads(line) for line in (DATA / "nvml-margin.jsonl").read_text().splitlines()[1:]]
    assert len(polls) > 100
    assert all(abs(p["margin"] - int(p["smi"][2])) <= 1 for p in polls)


def test_the_die_limit_parsed_from_the_real_csv_is_87_where_it_is_read_at_all() -> None:
    """``parse_query_gpu`` over the real CSV: every max operating temperature it derives is the die's
    87 within the rounding degree (the old ``gpu + T.Limit`` read 82-86 in the copy's rows), the
    memory-limited rows read none, and the die-limited idle and matmul rows read one."""
    batch = parse_query_gpu((DATA / "nvidia-smi.csv").read_text(), host="h200")
    max_op = batch.columns["max_op_temp"]
    assert len(max_op) == len(raw_rows())
    read = max_op[~np.isnan(max_op)]
    assert len(read) > 100 and np.all(np.abs(read - DIE_LIMIT_C) <= 1.0)
    rows = raw_rows()
    memory_nearer = np.array([facts.HBM_MAX_OPERATING_TEMP_C - r["memory"] <= r["tlimit"] for r in rows])
    assert memory_nearer.sum() > 100 and np.isnan(max_op[memory_nearer]).all()


@pytest.mark.parametrize("gpu, memory, tlimit, no_sensor, expected", [
    (56.0, 48.0, 31.0, False, 87.0),  # the die nearer (matmul): its own headroom
    (44.0, 56.0, 39.0, False, np.nan),  # the memory nearer (copy, 95 - 56 = 39): not the die's
    (48.0, 58.0, 36.0, False, np.nan),  # the memory's headroom one degree over T.Limit: too close to tell
    (49.0, 55.0, 38.0, False, np.nan),  # two degrees over (95 - 55 = 40): still too close
    (49.0, 54.0, 38.0, False, 87.0),  # three degrees further (95 - 54 = 41): the die's
    (50.0, np.nan, 37.0, True, 87.0),  # a board without a memory sensor: the die's
    (48.0, np.nan, 36.0, False, np.nan),  # a memory reading that failed: whose headroom, unknown
])
def test_max_op_from_tlimit_reads_the_die_only_where_the_memory_is_clearly_further(gpu, memory, tlimit, no_sensor,
                                                                                   expected) -> None:
    out = max_op_from_tlimit(np.array([gpu]), np.array([memory]), np.array([tlimit]), np.array([no_sensor]))
    np.testing.assert_array_equal(out, [expected])


HEADER = "timestamp, index, temperature.gpu, temperature.memory, temperature.gpu.tlimit\n"


@pytest.mark.parametrize("memory_cell, expected, problem", [
    ("59", np.nan, None),  # the memory nearer (95 - 59 = 36): not the die's
    ("[N/A]", 84.0, None),  # no memory sensor on the board: T.Limit is the die's own
    ("[Unknown Error]", np.nan, "unknown error"),  # a fault: whose headroom it is cannot be told
    ("garbage", np.nan, "non-numeric value"),
])
def test_a_memory_cell_that_holds_no_reading_gives_the_die_a_limit_only_where_the_board_has_none(
        memory_cell, expected, problem) -> None:
    """A fault in the memory cell (``[Unknown Error]``) had been read as "no memory sensor", and
    T.Limit (the memory's 36 °C headroom here) added to the die's 48 °C as its limit: 84."""
    health = PipelineHealth()
    batch = parse_query_gpu(HEADER + f"2026/12/04 15:52:13.890, 0, 48, {memory_cell}, 36\n", host="h", health=health)
    np.testing.assert_array_equal(batch.columns["max_op_temp"], [expected])
    assert set(reason for _, reason in health.problems) == ({problem} if problem else set())


def test_tlimit_without_a_memory_column_gives_no_limit_and_is_counted_per_row_or_once_by_a_live_source() -> None:
    """The real CSV with its memory column removed: ``gpu + T.Limit`` read 82-86 °C in the copies'
    rows, and nothing told them apart. Now no row gives a limit; a file counts each row, a live
    source (its own ``once`` set) the first poll only."""
    with open(DATA / "nvidia-smi.csv", newline="") as fh:
        rows = list(csv.reader(fh, skipinitialspace=True))
    cut = rows[0].index("temperature.memory")
    text = "".join(", ".join(r[:cut] + r[cut + 1:]) + "\n" for r in rows)
    health = PipelineHealth()
    batch = parse_query_gpu(text, host="h200", health=health)
    assert np.isnan(batch.columns["max_op_temp"]).all()
    assert health.problems == {("nvidia-smi", TLIMIT_WITHOUT_MEMORY): len(rows) - 1}
    live = PipelineHealth()
    once: set[str] = set()
    for _ in range(3):
        parse_query_gpu(text, host="h200", health=live, once=once)
    assert live.problems == {("nvidia-smi", TLIMIT_WITHOUT_MEMORY): len(rows) - 1}


def test_through_a_copy_the_exporter_and_the_thermal_fit_keep_the_die_limit(tmp_path: Path) -> None:
    """The real CSV imported and fed a row at a time: the exported max operating temperature and
    the thermal fit's kept core limit stay 86-88 °C through the copies (they read 82-86 before),
    and the default bank predicts nothing over it."""
    res = CliRunner().invoke(cli, ["import", str(DATA / "nvidia-smi.csv"), "--format", "nvidia-smi",
                                   "--host", "h200", "--out", str(tmp_path / "rec")])
    assert res.exit_code == 0, res.output
    recording = Recording.open(tmp_path / "rec")
    topology = recording.topology
    gpu = recording.read_kind("gpu")
    store, detector = FindingStore(topology), th.ThermalDetector(topology)
    exported, kept = [], []
    labels = {"cluster": topology.cluster, "rack": "unknown", "node": "h200", "gpu": "0"}
    for row in range(len(gpu.ts)):
        frame = Frame("gpu", gpu.ts[row:row + 1], gpu.slot[row:row + 1],
                      {name: col[row:row + 1] for name, col in gpu.columns.items()})
        store.observe_frame(frame)
        assert not detector.update(frame)
        kept.append(detector.s_model[0, tf.G_MAX_OP])
        exported.append(build_registry(store, top_k=1).get_sample_value(
            "foreshock_gpu_max_operating_temperature_celsius", labels))
    assert len(exported) > 250
    assert all(e is not None and abs(e - DIE_LIMIT_C) <= 1.0 for e in exported)
    assert np.all(np.abs(np.array(kept) - DIE_LIMIT_C) <= 1.0)
    findings = tmp_path / "findings.jsonl"
    res = CliRunner().invoke(cli, ["replay", str(tmp_path / "rec"), "--port", "0", "--findings", str(findings)])
    assert res.exit_code == 0, res.output
    assert not [f for f in map(json.loads, findings.read_text().splitlines()) if f["type"] == "prediction"]


def test_where_the_die_stays_the_nearer_nearly_every_row_gives_its_limit() -> None:
    """The other machine (its die the nearer to its limit in every row, its copy at 55 °C core and
    60 °C memory): the rule leaves all but a handful of its rows read, nvidia-smi's T.Limit and
    NVML's margin alike, and every one reads 87 within the rounding degree."""
    polls = [json.loads(line) for line in (DATA / "warmer-die-nvml-margin.jsonl").read_text().splitlines()[1:]]
    assert len(polls) > 200
    memory = np.array([float(p["smi"][1]) for p in polls])
    smi = (np.array([float(p["smi"][0]) for p in polls]), np.array([float(p["smi"][2]) for p in polls]))
    nvml = (np.array([float(p["gpu"]) for p in polls]), np.array([float(p["margin"]) for p in polls]))
    for gpu, headroom in (smi, nvml):
        read = max_op_from_tlimit(gpu, memory, headroom)
        assert np.count_nonzero(~np.isnan(read)) >= len(polls) - 3
        assert np.all(np.abs(read[~np.isnan(read)] - DIE_LIMIT_C) <= 1.0)


def test_the_live_sources_real_csv_reads_without_a_problem_and_its_power_cap_counter_counts_the_matmul():
    """The same CSV as the live nvidia-smi source reads it: no input problem, and the SW power cap
    counter (``clocks_event_reasons_counters.sw_power_cap``, printed in µs) rises by the matmul's
    30 s — its only capped phase, the cap bit (0x4) set throughout it — and by nothing in the
    copies and idle phases around it."""
    health = PipelineHealth()
    batch = parse_query_gpu((DATA / "nvidia-smi.csv").read_text(), host="h200", health=health)
    assert health.total_problems() == 0
    marks = [json.loads(line) for line in (DATA / "phases.jsonl").read_text().splitlines()]
    assert [m["phase"] for m in marks] == ["idle", "copy", "matmul", "copy", "idle", "end"]
    start, end = marks[2]["time"], marks[3]["time"]
    ts, counter = batch.ts, batch.columns["power_throttle_time"]
    before, after = counter[ts < start], counter[ts >= end + 1.0]
    assert np.all(before == before[0]) and np.all(after == after[0])  # flat outside the matmul
    assert after[0] - before[-1] == pytest.approx(end - start, abs=1.0)
    during = (ts > start + 1.0) & (ts < end)
    capped = (batch.columns["throttle_reasons"][during].astype(np.int64) & 0x4) != 0
    assert capped.mean() > 0.9
