"""``foreshock watch`` over a local source past the happy path (a helper's audit, 2026-12-04, after
the watch ran on a real H200): an nvidia-smi that prints no GPU row, polls skipped by a slow
source, an interval longer than dcgm's forgetting rule, and intervals or durations past what a
timer can wait."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.guard import LONGEST_WAIT_S
from foreshock.health import PipelineHealth
from foreshock.streams.nvidia_smi import NO_ROWS, STAGE, NvidiaSmiSource
from foreshock.streams.polling import CLOCK_STEPPED_BACK, PollingSource

HEADER = "timestamp, index, temperature.gpu, temperature.memory, power.draw [W], enforced.power.limit [W], uuid"


def sequenced_stub(tmp_path: Path, modes: list[str], sleep_s: float = 0.0) -> Path:
    """An nvidia-smi printing, call by call, ``ok`` (a header and two GPU rows), ``header`` (the
    header alone) or ``empty`` (nothing), all with exit 0; ``slow`` is ``ok`` after ``sleep_s``."""
    count = tmp_path / "calls"
    stub = tmp_path / "nvidia-smi"
    rows = (f'echo "{HEADER}"; now=$(date -u +"%Y/%m/%d %H:%M:%S.000"); '
            'echo "$now, 0, 39, 41, 119.12 W, 700.00 W, GPU-aaaa"; echo "$now, 1, 40, 42, 120.12 W, 700.00 W, GPU-bbbb"')
    stub.write_text("#!/bin/sh\n"
                    f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}\n"
                    f"set -- {' '.join(modes)}\nshift $n 2>/dev/null || set -- ok\nmode=${{1:-ok}}\n"
                    "case $mode in\n"
                    f"ok) {rows};;\n"
                    f"slow) sleep {sleep_s}; {rows};;\n"
                    f'header) echo "{HEADER}";;\n'
                    "empty) ;;\n"
                    "esac\n")
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return stub


def test_an_nvidia_smi_that_exits_0_printing_no_gpu_row_is_counted(tmp_path: Path) -> None:
    """Exit 0 with nothing, or with its header alone: the poll read no GPU. Neither was counted
    (a watch whose every poll read nothing said "nothing was counted either")."""
    health = PipelineHealth()
    source = NvidiaSmiSource(executable=str(sequenced_stub(tmp_path, ["ok", "empty", "header", "ok"])),
                             interval=0.05, host="h", health=health, max_polls=4)
    frames = list(source)
    assert [len(f) for f in frames] == [2, 2]
    assert health.problems == {(STAGE, NO_ROWS): 2}


def test_the_watch_summary_says_how_many_polls_were_skipped(tmp_path: Path) -> None:
    """A poll that runs past the next one's slot skips it: counted in foreshock_polls_skipped_total
    and logged, but the summary and its JSON line had said nothing of it, so a watch that mostly
    could not poll read as a healthy one."""
    stub = sequenced_stub(tmp_path, ["ok", "slow", "ok"], sleep_s=1.0)
    result = CliRunner().invoke(cli, ["watch", "--source", "nvidia-smi", "--executable", str(stub), "--node", "h",
                                      "--interval", "0.2", "--polls", "3", "--port", "0"])
    assert result.exit_code == 0, result.output
    assert "polls skipped (a poll ran past its slot): nvidia-smi " in result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["polls_skipped"] >= 3


def test_a_long_interval_is_not_held_to_dcgms_forgetting_rule(tmp_path: Path) -> None:
    """``--forget-after`` (24 h) must be at least three polls — for dcgm's derived topology, the only
    one that forgets hosts. nvidia-smi at 30,000 s had been refused over it, and ``--forget-after 0``
    refused as dcgm's option."""
    stub = sequenced_stub(tmp_path, ["ok"])
    result = CliRunner().invoke(cli, ["watch", "--source", "nvidia-smi", "--executable", str(stub), "--node", "h",
                                      "--interval", "30000", "--polls", "1", "--port", "0"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["samples"] == 2


@pytest.mark.parametrize("option", ["--interval", "--duration", "--bmc-interval", "--cdu-interval"])
def test_an_interval_or_duration_no_timer_can_wait_is_a_usage_error(option: str) -> None:
    """1e10 s passes ``threading.TIMEOUT_MAX``: the wait raised OverflowError in its thread (a
    traceback, the watch ended or left without its timer). Now refused before anything starts."""
    result = CliRunner().invoke(cli, ["watch", "--source", "nvidia-smi", option, "1e10", "--port", "0"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and option in result.output
    with pytest.raises(ValueError, match="LONGEST_WAIT_S"):
        PollingSource(interval=LONGEST_WAIT_S * 10)


class Quiet(PollingSource):
    """A source whose polls read nothing: the clocks are all there is to watch."""

    stage = "quiet"

    def poll(self) -> list:  # type: ignore[type-arg]
        return []


@pytest.mark.parametrize("step_s, told", [(3600.0, 1), (0.5, 0), (0.0, 0)])
def test_a_host_clock_stepping_back_between_polls_is_told(step_s: float, told: int) -> None:
    """A live source stamps its rows with this host's clock: after a step back (NTP at boot, a clock
    set by hand) every row is older than the last one read, and the guard refuses them all as out of
    order for as long as the step — an hour's watch refused with no word of why. The step is now
    counted and said once, with its size; a step under a second is not."""
    import time

    health = PipelineHealth()
    source = Quiet(interval=0.02, health=health, max_polls=6)
    source.wall = lambda: time.time() - (step_s if source.polls >= 2 else 0.0)
    assert list(source) == []
    assert health.problems.get(("quiet", CLOCK_STEPPED_BACK), 0) == told
