"""A recording made by ``foreshock record --source nvml`` on a real H200 and ended by SIGTERM.

``tests/data/h200_record/`` is what ``deploy/device/poll_check.sh`` left on a lent H200 (driver
580.159.04, 2026-12-04): the CLI recorder at 1 s while ``deploy/device/gpu_load.py`` ran idle 10 s
-> bf16 matmul 30 s -> idle 20 s (``phases.jsonl``), stopped by SIGTERM (as a service manager stops
it) before its ``--duration``. Recorded with the NVML source as it reads since fb7f9d2: the power
violation counter as field value 74, the max SM clock and the thresholds once a minute. The
recorder's own close on real hardware, its file format read back by today's reader, and the
counters' units against the load's own clock.
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
from foreshock.streams.nvml import READERS

DATA = Path(__file__).parent / "data" / "h200_record"


def phases() -> dict[str, tuple[float, float]]:
    marks = [json.loads(line) for line in (DATA / "phases.jsonl").read_text().splitlines()]
    return {f"{a['phase']}{k}": (a["time"], b["time"]) for k, (a, b) in enumerate(zip(marks, marks[1:]))}


def columns() -> dict[str, np.ndarray]:
    frame = Recording.open(DATA).read_kind("gpu")
    return {"ts": frame.ts, **frame.columns}


def test_the_recorder_stopped_by_sigterm_left_a_whole_recording_with_every_field() -> None:
    meta = json.loads((DATA / "recording.json").read_text())
    assert meta["complete"] and meta["source"] == "nvml" and meta["rows"] == {"gpu": 64}
    cols = columns()
    assert len(cols["ts"]) == 64 and np.median(np.diff(cols["ts"])) == pytest.approx(1.0, abs=0.01)
    for field in READERS:  # every reader worked on the real H200, at every poll
        assert np.isfinite(cols[field]).all(), field
    assert set(np.unique(cols["max_op_temp"])) == {87.0} and set(np.unique(cols["hbm_max_op_temp"])) == {95.0}
    assert len(np.unique(cols["board_id"])) == 1  # one board, its UUID carried at every poll


def test_the_power_cap_counter_counts_the_seconds_the_cap_held() -> None:
    """``power_throttle_time`` (NVML's power violation counter, ns -> s, read as field value 74)
    rises by the time the SW power cap held the clocks: by the matmul's 30 s (29.7 here; the cap
    held from its first second, as on the step recordings) and not at all while idle."""
    cols = columns()
    ts, counter = cols["ts"], cols["power_throttle_time"]
    capped = (cols["throttle_reasons"].astype(np.int64) & facts.THROTTLE_SW_POWER_CAP) != 0
    start, end = phases()["matmul1"]
    rise = np.interp(end, ts, counter) - np.interp(start, ts, counter)
    assert rise == pytest.approx(end - start, abs=2.0)
    assert capped[(ts > start + 2) & (ts < end)].all() and not capped[(ts < start) | (ts > end + 2)].any()
    idle = (ts > end + 2) | (ts < start)
    assert np.ptp(counter[idle & (ts > end)]) == 0.0 and np.ptp(counter[ts < start]) == 0.0
    # 55 °C at most: no thermal slowdown
    assert np.all(cols["thermal_throttle_time"] == cols["thermal_throttle_time"][0])


def test_the_replay_predicts_nothing_on_a_healthy_gpu_stepping_to_full_load(tmp_path: Path) -> None:
    findings_file = tmp_path / "findings.jsonl"
    res = CliRunner().invoke(cli, ["replay", str(DATA), "--max", "--port", "0", "--findings", str(findings_file)])
    assert res.exit_code == 0, res.output
    findings = [json.loads(line) for line in findings_file.read_text().splitlines()]
    assert [f for f in findings if f["type"] != "anomaly"] == []
    assert len(findings) <= 6  # a few anomalies of the two load steps at most
