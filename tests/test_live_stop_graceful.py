"""An ordinary stop (``--duration``, the first Ctrl-C or SIGTERM) of a healthy but slow source keeps
the poll in hand (review of f43e007): bounding a hung call had cut every poll at the stop, or 2 s
after it. A 3-s nvidia-smi lost its last poll at ``--duration`` (the recording marked incomplete),
an NVML poll lost the GPUs it had not read yet (uncounted), and a Redfish poll dropped the BMC
answers due a moment later, each healthy BMC counted as too slow. The poll in hand is now waited
for up to the source's own limit on a poll; a call that never returns is still cut at that limit
(tests/test_nvml_hang.py, tests/test_live_stop_bounded.py)."""

from __future__ import annotations

import json
import stat
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli import record, watch
from foreshock.cli.main import cli
from foreshock.health import PipelineHealth
from foreshock.streams import redfish
from foreshock.streams.nvml import NvmlSource
from foreshock.streams.redfish import TOO_SLOW, RedfishSource
from test_nvml_hang import HUNG, fake_nvml, within

SLOW_SMI = """#!/bin/sh
# a busy box's nvidia-smi: slower than record's wind-down, well within its own 10-s timeout
sleep 1.2
echo "timestamp, index, temperature.gpu, power.draw [W]"
for i in 0 1 2 3; do echo "2026/12/05 15:00:00.000, $i, 4$i, 30$i.00 W"; done
"""


def test_record_at_duration_keeps_a_slow_healthy_poll_in_hand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record, "WIND_DOWN_S", 0.3)  # shorter than the poll: a cut there would lose it
    smi = tmp_path / "nvidia-smi"
    smi.write_text(SLOW_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "rec"
    # the 2nd poll starts at 1.5 s, --duration stops it at 1.7 s, it ends at 2.7 s
    res = CliRunner().invoke(cli, ["record", "--source", "nvidia-smi", "--executable", str(smi), "--interval", "1.5",
                                   "--duration", "1.7", "--host", "box", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["polls"] == 2 and summary["rows"] == {"gpu": 8} and summary["interrupted"] is False
    listed = json.loads((out / "recording.json").read_text())
    assert listed["complete"] is True and listed["rows"] == {"gpu": 8}


def test_a_stop_during_a_slow_nvml_poll_leaves_no_gpu_unread() -> None:
    release = threading.Event()
    nv, _ = fake_nvml(4, hang_gpu=1, release=release)
    health = PipelineHealth()
    src = NvmlSource(interval=0.1, host="h", health=health, nvml=nv)
    src.deadline_s = 20.0
    nv.armed.set()  # GPU 1's power call takes 0.5 s (slow, not hung)
    try:
        threading.Timer(0.15, src.stop).start()  # the stop comes while GPU 1 is being read
        threading.Timer(0.5, release.set).start()
        polled = within(5, src.read)
        # every GPU's row, GPUs 2 and 3 read after the stop: a frame of 1 row had come, uncounted
        assert list(polled.entity) == [0, 1, 2, 3] and np.all(polled.columns["power"] == 300.0)
        assert ("nvml", HUNG) not in health.problems
    finally:
        release.set()


def test_a_redfish_stop_keeps_the_answers_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    def read_one(self: RedfishSource, node: str) -> Any:
        time.sleep(0.4)  # a healthy BMC (they take 0.3-3 s)
        return self.clock(), 0.5, 400.0, redfish.FanReadings(shares=[0.5])

    monkeypatch.setattr(RedfishSource, "read_one", read_one)
    health = PipelineHealth()
    src = RedfishSource({f"n{i}": f"http://127.0.0.1:{19851 + i}" for i in range(3)}, interval=1.0, health=health)
    frames: list[Any] = []
    polling = threading.Thread(target=lambda: frames.extend(src), daemon=True)
    polling.start()
    time.sleep(0.1)  # the first poll's reads are in flight
    src.stop()
    polling.join(5)
    assert not polling.is_alive()
    # the three answers that came 0.3 s after the stop: none had been kept, each BMC counted too slow
    assert [len(f) for f in frames] == [3] and ("redfish", TOO_SLOW) not in health.problems


def test_watch_waits_for_a_source_beside_up_to_its_own_poll_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``watch`` gives the BMCs' poll in hand its own limit, not a fixed 2 s (0.3 here): a poll that
    ends 0.6 s after the stop is waited for, its answers in the summary."""
    for cli_module in (record, watch):
        monkeypatch.setattr(cli_module, "WIND_DOWN_S", 0.3)
    ends = threading.Event()
    threading.Timer(0.6, ends.set).start()

    class Beside:
        poll_limit_s = 5.0
        ended_in_time = False

        def wind_down(self, timeout: float) -> bool:
            self.ended_in_time = ends.wait(timeout)
            return self.ended_in_time

    beside = Beside()
    began = time.monotonic()
    watch._wind_down([beside])  # type: ignore[list-item]
    assert beside.ended_in_time and time.monotonic() - began < 3.0
