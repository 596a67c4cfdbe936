"""``foreshock record --commit-every``: a source gone quiet (a poll that hangs, an exporter that stops
answering) still has its rows committed on time. The writer committed only when handed a frame, so
the rows read before the source went quiet sat unwritten, lost to a recorder killed then."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from click.testing import CliRunner

import foreshock.cli.record as record
from foreshock.cli.main import cli
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

TOPOLOGY = Topology.from_gpu_hosts([("node0", 2)])
COMMIT_EVERY_S = 0.1
QUIET_S = 1.0  # ten commit intervals without a frame


class GoesQuiet:
    """A polled source that reads two polls at once, then hangs for ``QUIET_S`` (or until stopped),
    noting what ``recording.json`` lists at the end of the hang: what a recorder killed then keeps."""

    interval = 0.05

    def __init__(self, out: Path) -> None:
        self.out, self.health, self.polls = out, PipelineHealth(), 0
        self.stopped = threading.Event()
        self.listed_while_quiet: dict = {}

    def __iter__(self) -> Iterator[Frame]:
        n = TOPOLOGY.size("gpu")
        for t in (0.0, 1.0):
            self.polls += 1
            yield Frame("gpu", np.full(n, 1_700_000_000.0 + t), np.arange(n), {"gpu_temp": np.full(n, 50.0)})
        self.stopped.wait(QUIET_S)
        self.listed_while_quiet = json.loads((self.out / "recording.json").read_text())

    def stop(self) -> None:
        self.stopped.set()


def test_rows_read_before_a_source_goes_quiet_are_committed_within_commit_every(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "rec"
    source = GoesQuiet(out)
    monkeypatch.setattr(record, "open_live_source", lambda *args, **kwargs: (source, lambda: TOPOLOGY))
    res = CliRunner().invoke(cli, ["record", "--source", "nvml", "--commit-every", str(COMMIT_EVERY_S),
                                   "--out", str(out)])
    assert res.exit_code == 0, (res.output, res.exception)
    gpus = TOPOLOGY.size("gpu")
    # before: {"parts": {}, "rows": {}} a whole second (ten intervals) after the rows were read
    assert source.listed_while_quiet["parts"] == {"gpu": 1}, source.listed_while_quiet
    assert source.listed_while_quiet["rows"] == {"gpu": 2 * gpus}
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["rows"] == {"gpu": 2 * gpus} and summary["parts"] == {"gpu": 1}  # no empty part for the ticks


def test_an_error_that_ends_the_source_in_its_thread_is_the_recorders_to_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The source is polled in a thread now: an error there still ends the command, not a quiet hang."""
    class Fails(GoesQuiet):
        def __iter__(self) -> Iterator[Frame]:
            raise RuntimeError("exporter gave garbage")
            yield  # (a generator)

    source = Fails(tmp_path / "rec")
    monkeypatch.setattr(record, "open_live_source", lambda *args, **kwargs: (source, lambda: TOPOLOGY))
    res = CliRunner().invoke(cli, ["record", "--source", "nvml", "--out", str(tmp_path / "rec")])
    assert isinstance(res.exception, RuntimeError) and "exporter gave garbage" in str(res.exception)
