"""``foreshock watch --source nvml`` and ``--source nvidia-smi`` on a node where a GPU board is
swapped in its slot (an RMA: the name stays, the UUID NVML and nvidia-smi report changes): that
GPU's detector state starts afresh, as under ``--source dcgm`` (``test_watch_swap.py``), so the
new board is not judged against the old one's history. A stand-in for pynvml and a stub
nvidia-smi serve one node's readings, a poll per 10 s of telemetry (the sources' clock is the
readings', so the test need not wait 10 s a poll)."""

from __future__ import annotations

import json
import logging
import re
import stat
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli import watch
from foreshock.cli.main import cli
from foreshock.detectors.thermal_fit import CORE, G_SIZE, G_TS, HBM, M_LOADED, M_SIZE
from foreshock.frames import Frame
from foreshock.simulator.formats import nvidia_smi_csv
from foreshock.streams import nvml as nvml_module

from board_ids import uuid_number
from test_streams_nvml import FakeNvmlError, fake_nvml
from test_watch_churn import _free_port
from test_watch_swap import another_board, assert_restarted
from thermal_synth import small_topology

pytestmark = pytest.mark.slow  # long end-to-end runs

SWAP = 150  # node0/gpu1's board is replaced from this poll on (1500 s of telemetry in)
HOST = "node0"
SLOT = 1
SWAPPED = f"{HOST}/gpu{SLOT}"
GPUS = 8
NEW_UUID = "GPU-0f1e2d3c-5b4a-4978-8695-a4b3c2d1e0f1"


def old_uuid(gpu: int) -> str:
    return f"GPU-5e1a{gpu:04x}-7c3d-4e2f-9a1b-00000000{gpu:04x}"


@pytest.fixture(scope="module")
def readings() -> tuple[list[Frame], int]:
    """One node's gpu frames where gpu1's readings from ``SWAP`` on are those of another board
    (the world's GPU whose thermal resistance differs most from its own)."""
    return another_board(small_topology(nodes=1, gpus=GPUS, racks=1), SLOT, SWAP)


class Feed:
    """The node's state poll by poll: the sources' clock moves it on (one call a poll, before the
    GPUs are read); at the last poll it reads the watch's /metrics first (the watch is waiting for
    that poll, so everything before it has been processed)."""

    def __init__(self, frames: list[Frame], swapped: bool, metrics_url: str) -> None:
        self.frames = frames
        self.swapped = swapped
        self.metrics_url = metrics_url
        self.poll = -1
        self.metrics = ""

    def clock(self) -> float:
        self.poll += 1
        if self.poll == len(self.frames) - 1:
            with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
                self.metrics = response.read().decode()
        return float(self.frames[self.poll].ts[0])

    def frame(self) -> Frame:
        return self.frames[self.poll]

    def uuid(self, gpu: int, poll: int | None = None) -> str:
        """The UUID of the board in slot ``gpu`` at ``poll`` (the current one by default)."""
        poll = self.poll if poll is None else poll
        return NEW_UUID if self.swapped and gpu == SLOT and poll >= SWAP else old_uuid(gpu)


def nvml_of(feed: Feed) -> Any:
    """pynvml as an older version is: UUIDs as bytes. Readings in NVML's units (mW, mJ, MHz,
    percent); what the world does not have (thresholds, ECC, ...) is not supported."""
    nv = fake_nvml(gpus=GPUS)

    def reading(field: str, scale: float = 1.0) -> Callable[..., Any]:
        def read(handle: int, *_: Any) -> float:
            column = feed.frame().columns.get(field)
            if column is None:
                raise FakeNvmlError(nv.NVML_ERROR_NOT_SUPPORTED)
            return float(column[handle]) * scale
        return read

    def not_supported(*_: Any) -> Any:
        raise FakeNvmlError(nv.NVML_ERROR_NOT_SUPPORTED)

    def hbm(handle: int, _ids: Any) -> list[Any]:
        value = SimpleNamespace(dVal=reading("hbm_temp")(handle))
        return [SimpleNamespace(nvmlReturn=nv.NVML_SUCCESS, valueType=nv.NVML_VALUE_TYPE_DOUBLE, value=value)]

    nv.nvmlDeviceGetTemperature = reading("gpu_temp")
    nv.nvmlDeviceGetFieldValues = hbm
    nv.nvmlDeviceGetTemperatureThreshold = not_supported
    nv.nvmlDeviceGetPowerUsage = reading("power", 1e3)
    nv.nvmlDeviceGetEnforcedPowerLimit = reading("power_limit", 1e3)
    nv.nvmlDeviceGetTotalEnergyConsumption = reading("energy", 1e3)
    nv.nvmlDeviceGetClockInfo = reading("sm_clock", 1e-6)
    nv.nvmlDeviceGetMaxClockInfo = reading("sm_clock_max", 1e-6)
    nv.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=reading("util", 100.0)(h), memory=0)
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: int(reading("throttle_reasons")(h))
    for name in ("nvmlDeviceGetViolationStatus", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPcieReplayCounter",
                 "nvmlDeviceGetRemappedRows"):
        setattr(nv, name, not_supported)
    nv.nvmlDeviceGetUUID = lambda h: feed.uuid(h).encode()
    return nv


def nvidia_smi_of(feed: Feed, folder: Path) -> Path:
    """A stub nvidia-smi printing poll by poll the node's ``--query-gpu`` CSV (the simulator's
    format, a ``uuid`` column added)."""
    topology = small_topology(nodes=1, gpus=GPUS, racks=1)
    pages = folder / "pages"
    pages.mkdir()
    for poll, frame in enumerate(feed.frames):
        lines = nvidia_smi_csv(frame, topology, HOST).splitlines()
        rows = [f"{row}, {feed.uuid(int(row.split(',')[0]), poll)}" for row in lines[1:]]
        (pages / f"{poll}.csv").write_text("\n".join([lines[0] + ", uuid", *rows]) + "\n")
    counter = folder / "polls"
    counter.write_text("0\n")
    stub = folder / "nvidia-smi"
    stub.write_text(f'#!/bin/sh\nn=$(cat {counter})\necho $((n + 1)) > {counter}\ncat {pages}/$n.csv\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return stub


def _watch(source: str, frames: list[Frame], swapped: bool, monkeypatch: Any,
           folder: Path) -> tuple[Any, str, list[str]]:
    """Watch ``source`` over ``frames`` (with gpu1's UUID changed at ``SWAP`` when ``swapped``):
    the pipeline run, at the end, /metrics read at the last poll, and the findings' entities."""
    folder.mkdir()
    port = _free_port()
    feed = Feed(frames, swapped, f"http://127.0.0.1:{port}/metrics")
    runs: list[Any] = []
    build, opened = watch.build_pipeline, watch.open_live_source

    def keep(*args: Any, **kwargs: Any) -> Any:
        runs.append(build(*args, **kwargs))
        return runs[-1]

    def on_the_feeds_clock(*args: Any, **kwargs: Any) -> Any:
        polled, topology_of = opened(*args, **kwargs)
        polled.clock = feed.clock
        return polled, topology_of

    monkeypatch.setattr(watch, "build_pipeline", keep)
    monkeypatch.setattr(watch, "open_live_source", on_the_feeds_clock)
    extra: list[str] = []
    if source == "nvml":
        monkeypatch.setattr(nvml_module, "load_nvml", lambda: nvml_of(feed))
    else:
        extra = ["--executable", str(nvidia_smi_of(feed, folder))]
    findings = folder / "findings.jsonl"
    result = CliRunner().invoke(cli, ["watch", "--source", source, *extra, "--node", HOST, "--interval", "0.02",
                                      "--polls", str(len(frames)), "--port", str(port), "--top-k", "32",
                                      "--findings", str(findings)])
    assert result.exit_code == 0, result.output
    assert feed.poll == len(frames) - 1 and feed.metrics
    return runs[0], feed.metrics, [json.loads(line)["entity"] for line in findings.read_text().splitlines()]


@pytest.mark.parametrize("source", ["nvml", "nvidia-smi"])
def test_a_gpu_whose_board_is_swapped_starts_its_detector_state_afresh(source, readings, monkeypatch, caplog,
                                                                       tmp_path: Path):
    """The thermal fit of node0/gpu1 restarts at the new board's first poll: its loaded time
    counts from there and its resistance is the new board's own (the board it was copied from); a
    run served the same readings under the old UUID carries the old board's fit on. No other GPU's
    state restarts (it is the run's without the swap, to rounding); the swap is counted and
    logged once by the source, naming both UUIDs, and once by the pipeline that restarted it."""
    frames, board = readings
    kept, kept_metrics, kept_found = _watch(source, frames, False, monkeypatch, tmp_path / "same")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        fresh, metrics, fresh_found = _watch(source, frames, True, monkeypatch, tmp_path / "swapped")

    lines = [r.getMessage() for r in caplog.records if "replaced" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"GPU {SWAPPED} replaced: UUID {old_uuid(SLOT)} -> {NEW_UUID};")
    counted = re.findall(r'^foreshock_gpus_replaced_total\{[^}]*stage="([^"]+)"\} (\S+)$', metrics, re.MULTILINE)
    assert sorted(counted) == sorted([(source, "1.0"), ("guard", "1.0")])  # the source read it, the pipeline restarted it
    restarted = [r.getMessage() for r in caplog.records if "another board in its slot" in r.getMessage()]
    assert len(restarted) == 1 and restarted[0].startswith(
        f"GPU {SWAPPED}: another board in its slot (board_id {uuid_number(old_uuid(SLOT))} -> {uuid_number(NEW_UUID)});")
    assert not re.search(r"^foreshock_gpus_replaced_total\{", kept_metrics, re.MULTILINE)
    assert "foreshock_topology_changes_total{" not in metrics  # the topology is the same one

    core = G_SIZE + CORE * M_SIZE
    for name in ("thermal", "cooling"):
        before = next(d for d in kept.pipeline.bank.detectors if d.name == name).s_model
        after = next(d for d in fresh.pipeline.bank.detectors if d.name == name).s_model
        others = np.arange(len(before)) != SLOT
        # nothing of theirs restarts: their timestamps and loaded time are the run's without the
        # swap; their fit is too, to rounding (nvidia-smi: R within 1e-5 relative): the node's
        # inlet proxy is the least T - R·P over its GPUs (gpu_inputs.node_feed), and the new
        # board's restarted power filter takes part in it
        for column in (G_TS, core + M_LOADED, G_SIZE + HBM * M_SIZE + M_LOADED):
            np.testing.assert_array_equal(after[others, column], before[others, column])
        np.testing.assert_allclose(after[others], before[others], rtol=1e-4, atol=1e-5)
        assert_restarted(before, after, SLOT, SWAP, board)
    # the univariate detectors flag the step from one board to the other when the UUID is not
    # read, not when it is; every other GPU's findings are the same
    assert SWAPPED in kept_found and SWAPPED not in fresh_found
    assert set(fresh_found) == set(kept_found) - {SWAPPED}
