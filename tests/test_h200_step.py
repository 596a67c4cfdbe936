"""A real H200's thermal step response, recorded with foreshock's own NVML source.

``tests/data/h200_step/`` holds two recordings made on a real H200 (driver 580.159.04) by
``deploy/device/step_response.sh``: ``python -m foreshock.streams.nvml`` polling at 0.5 s and at
0.1 s while ``deploy/device/gpu_load.py`` stepped the GPU idle -> bf16 matmul (full power) ->
memory-bound copy -> idle, plus nvidia-smi's CSV of the same minutes and the load's phase times.
These are the project's only real readings of a GPU changing load: the source's units, the
throttle bits and the detectors are checked against them here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock import facts
from foreshock.cli.main import cli
from foreshock.recording import Recording
from foreshock.streams.nvidia_smi import parse_query_gpu
from foreshock.streams.nvml import READERS

DATA = Path(__file__).parent / "data" / "h200_step"
RUNS = {"run1_500ms": 0.5, "run2_100ms": 0.1}


def phases(run: str) -> list[tuple[str, float, float]]:
    """(phase, start, end) in Unix seconds, from the load generator's own log."""
    marks = [json.loads(line) for line in (DATA / run / "phases.jsonl").read_text().splitlines()]
    return [(a["phase"], a["time"], b["time"]) for a, b in zip(marks, marks[1:])]


def gpu_columns(run: str) -> dict[str, np.ndarray]:
    frame = Recording.open(DATA / run).read_kind("gpu")
    return {"ts": frame.ts, **frame.columns}


READ_SINCE_RECORDED = {"max_op_temp", "hbm_max_op_temp"}
"""NVML readers added after the H200 was recorded (2026-12-01): not in the recording."""


def during(ts: np.ndarray, start: float, end: float, settle: float) -> np.ndarray:
    return (ts >= start + settle) & (ts < end)


@pytest.mark.parametrize("run", RUNS)
def test_the_nvml_recording_reads_back_with_every_field_nvml_reports(run: str) -> None:
    cols = gpu_columns(run)
    interval = np.diff(cols["ts"])
    assert np.median(interval) == pytest.approx(RUNS[run], rel=0.02)
    assert interval.min() > 0  # strictly increasing: no duplicate or reordered polls
    for field in set(READERS) - READ_SINCE_RECORDED:  # every reader worked on a real H200: no NaN column
        assert np.isfinite(cols[field]).all(), field
    # base units: watts, joules, hertz, ratio
    assert 60 < cols["power"].min() and cols["power"].max() < 720
    assert np.all(cols["power_limit"] == 700.0)
    assert np.all(np.diff(cols["energy"]) >= 0) and cols["energy"][-1] - cols["energy"][0] > 1e4
    assert np.all(cols["sm_clock_max"] == 1.98e9) and 3e8 <= cols["sm_clock"].min()
    assert 0.0 <= cols["util"].min() and cols["util"].max() <= 1.0
    assert np.all(cols["slowdown_temp"] == 89.0)  # FACTS: HW slowdown at 89 °C on H100/H200


@pytest.mark.parametrize("run", RUNS)
def test_full_load_rides_the_power_cap_and_idle_sets_the_idle_bit(run: str) -> None:
    """What the driver really does at full load: the SW power cap holds the board at its 700 W
    limit and clocks drop below max; no thermal bit at ~58 °C."""
    cols = gpu_columns(run)
    ts, reasons = cols["ts"], cols["throttle_reasons"].astype(np.int64)
    matmul = [(s, e) for name, s, e in phases(run) if name == "matmul"]
    assert matmul
    for start, end in matmul:
        m = during(ts, start, end, settle=3.0)
        capped = (reasons[m] & facts.THROTTLE_SW_POWER_CAP) != 0
        assert capped.mean() > 0.9
        assert np.median(cols["power"][m]) == pytest.approx(700.0, rel=0.03)
        assert np.median(cols["sm_clock"][m]) < 0.8 * 1.98e9
        assert not np.any(reasons[m] & (facts.THROTTLE_SW_THERMAL | facts.THROTTLE_HW_THERMAL
                                        | facts.THROTTLE_HW_SLOWDOWN))
        assert 50 < np.median(cols["gpu_temp"][m]) < 65
    # the last sample is after the load process exited: no context left, the GPU idles
    assert reasons[-1] & facts.THROTTLE_IDLE and cols["sm_clock"][-1] < 6e8


@pytest.mark.parametrize("run", RUNS)
def test_memory_bound_load_heats_the_hbm_more_at_less_power(run: str) -> None:
    """The real data's lesson for the thermal model: HBM temperature follows memory traffic, not
    board power. The copy phase draws ~60 % of the matmul's power yet runs the HBM hotter."""
    cols = gpu_columns(run)
    ts = cols["ts"]
    spans = {name: (s, e) for name, s, e in phases(run) if name in ("matmul", "copy")}
    tail = {name: during(ts, e - 10, e, 0.0) for name, (s, e) in spans.items()}
    p_copy, p_mat = (np.median(cols["power"][tail[k]]) for k in ("copy", "matmul"))
    assert 0.5 < p_copy / p_mat < 0.7
    assert np.median(cols["hbm_temp"][tail["copy"]]) >= np.median(cols["hbm_temp"][tail["matmul"]])
    assert np.median(cols["gpu_temp"][tail["copy"]]) < np.median(cols["gpu_temp"][tail["matmul"]]) - 10


@pytest.mark.parametrize("run", RUNS)
def test_nvml_agrees_with_nvidia_smi_over_the_same_minutes(run: str) -> None:
    """Two readers of one driver: foreshock's NVML source and nvidia-smi's CSV (parsed by
    foreshock's nvidia-smi source) report the same temperatures and limits at the same times."""
    smi = parse_query_gpu((DATA / run / "nvidia-smi.csv").read_text(), host="vm")
    cols = gpu_columns(run)
    assert len(smi.ts) > 300
    inside = (smi.ts > cols["ts"][0]) & (smi.ts < cols["ts"][-1])
    nearest = np.searchsorted(cols["ts"], smi.ts[inside])
    # the clocks of the two hosts' processes are the same machine's: the nearest NVML poll is
    # within one NVML interval of each nvidia-smi row
    assert np.abs(cols["ts"][nearest] - smi.ts[inside]).max() <= RUNS[run] + 0.01
    same_temp = np.abs(cols["gpu_temp"][nearest] - smi.columns["gpu_temp"][inside]) <= 1.0
    assert same_temp.mean() > 0.95  # the rest are the instants of a load step
    same_hbm = np.abs(cols["hbm_temp"][nearest] - smi.columns["hbm_temp"][inside]) <= 1.0
    assert same_hbm.mean() > 0.95
    np.testing.assert_array_equal(smi.columns["power_limit"][inside], 700.0)
    np.testing.assert_array_equal(smi.columns["sm_clock_max"][inside], 1.98e9)


@pytest.mark.parametrize("run", RUNS)
def test_the_default_bank_predicts_nothing_and_reports_each_load_step_once(run: str, tmp_path: Path) -> None:
    """A GPU stepping between idle, full and memory-bound load at 34–60 °C is healthy: no
    prediction of any kind. The generic detectors report the steps as anomalies — each step a
    few times at most, not once per sample (before re-learning the level after an alarm they
    reported 72 and 55 power anomalies here)."""
    findings_file = tmp_path / "findings.jsonl"
    res = CliRunner().invoke(cli, ["replay", str(DATA / run), "--port", "0", "--findings", str(findings_file)])
    assert res.exit_code == 0, res.output
    findings = [json.loads(line) for line in findings_file.read_text().splitlines()]
    assert [f for f in findings if f["type"] != "anomaly"] == []
    steps = [s for _, s, _ in phases(run)[1:]]
    power = np.array([f["ts"] for f in findings if f.get("field") == "power"])
    for step in steps:  # every load step is seen on power within 2 s
        assert np.any(np.abs(power - step) <= 2.0), step
    assert len(power) <= 2 * (len(steps) + 1)  # + the CUDA context coming up before the first step
    for field in ("gpu_temp", "hbm_temp"):
        assert sum(f.get("field") == field for f in findings) <= 3 * len(steps), field
