"""``foreshock incidents`` tells the same incidents as ``foreshock replay`` of the same recording.

The incident engine ticks at the first frame of each sampling window. ``incidents`` fed the kinds
environment first (rack, node, job, link, optic, then gpu: evaluate's order), ``replay`` GPUs
first: a tick there took in the window's GPU findings, one in ``incidents`` did not (they waited a
tick), and the same incident opened or grew 10 s later in one than in the other (audit s63:
inc-1 +0:31:10 in replay, +0:31:20 in incidents; onset->incident differed with it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli


def invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 30-minute mixed-fault run, 10-s sampling: several incidents, one of which grows in a window
    whose GPU findings the two orders tick on differently."""
    out = tmp_path_factory.mktemp("parity") / "rec"
    invoke("simulate", "--scenario", "mixed", "--gpus", "32", "--duration", "1800", "--interval", "10",
           "--seed", "0", "--out", str(out), "--no-progress")
    return out


def lines(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_incidents_tells_the_incidents_replay_tells(mixed: Path, tmp_path: Path) -> None:
    replayed, grouped = tmp_path / "replay.jsonl", tmp_path / "incidents.jsonl"
    invoke("replay", str(mixed), "--port", "0", "--findings", str(replayed))
    invoke("incidents", str(mixed), "--no-progress", "--findings", str(grouped))
    told = [line for line in lines(replayed) if line["type"] == "incident"]
    assert len({line["incident_id"] for line in told}) >= 2, "too few incidents to compare"
    # every update, in order: the same ids, states, times, roots, members and counts
    assert [line for line in lines(grouped) if line["type"] == "incident"] == told
    # and every other finding: the detectors see the frames in the same order, so they find the same
    assert lines(grouped) == lines(replayed)
