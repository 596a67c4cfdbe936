"""`foreshock incidents` reads a recording as `evaluate` and `replay` do: its ground truth read
before the run (a broken events file is a clear error at once, not a traceback after the run),
events naming entities the topology lacks set aside, and rows stamped by a clock not set (a
first tick in 1970) counted by the guard rather than taken as the GPUs' first samples. The last
holds for `evaluate` too (``guarded_updates``). It logs what `evaluate` logs of events set aside,
but not `evaluate`'s "every alarm a false one" for a recording without ground truth: it scores no
alarm (``read_ground_truth``'s ``warn_missing`` and ``warn_unknown``, one flag for each)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.evaluation import guarded_updates, read_ground_truth
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.recording import EVENTS_FILE, Recording, RecordingWriter
from test_incidents_eval import psu_recording  # noqa: F401  (a fixture: the psu-failure recording)

T0 = 1_700_000_000.0


def incidents(path: Path) -> tuple[dict, str]:
    res = CliRunner().invoke(cli, ["incidents", str(path), "--detectors", "power,throttle_bits,xid", "--no-progress"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1]), res.output


def test_a_broken_events_file_is_an_error_before_the_run(psu_recording, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(psu_recording, broken)
    with open(broken / EVENTS_FILE, "a", encoding="utf-8") as f:
        f.write('{"time": 1, "type": "fault_onset", "entity"\n')
    res = CliRunner().invoke(cli, ["incidents", str(broken), "--no-progress"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exception
    assert res.output.startswith("Error: ") and EVENTS_FILE in res.output
    assert "OPEN" not in res.output  # nothing was run


def ghostly_copy(recording: Path, to: Path) -> Path:
    """``recording`` with two events naming a GPU its topology lacks."""
    shutil.copytree(recording, to)
    onset = next(e for e in Recording.open(recording).events() if e.type == "fault_onset")
    with open(to / EVENTS_FILE, "a", encoding="utf-8") as f:
        for kind in ("fault_onset", "thermal_throttle_start"):
            f.write(json.dumps({"time": onset.time + 30, "type": kind, "entity": "ghost/gpu0", "entity_kind": "gpu",
                                "fault_id": "ghost-fault", "fault_type": "psu_failure", "detail": {}}) + "\n")
    return to


def test_events_of_entities_the_topology_lacks_are_set_aside(psu_recording, tmp_path, caplog):
    before, _ = incidents(psu_recording)
    after, _ = incidents(ghostly_copy(psu_recording, tmp_path / "ghostly"))
    assert before["root_cause_accuracy"] == 1.0
    assert after == before
    assert "ground-truth events name entities its topology lacks" in caplog.text and "'ghost/gpu0'" in caplog.text


def write_first_tick_unset(path: Path, topology) -> int:
    """Ten minutes of GPU rows every 5 s, the first tick stamped 0 (a clock not set); returns the GPUs."""
    n = topology.size("gpu")
    with RecordingWriter(path, topology, {"interval": 5.0}) as w:
        for k in range(120):
            ts = np.full(n, 0.0 if k == 0 else T0 + 5 * k)
            w.write(Frame("gpu", ts, np.arange(n), {"gpu_temp": np.full(n, 50.0), "power": np.full(n, 300.0)}))
    return n


def test_incidents_counts_a_first_tick_stamped_by_a_clock_not_set(tmp_path, small_topology):
    n = write_first_tick_unset(tmp_path / "rec", small_topology)
    summary, _ = incidents(tmp_path / "rec")
    assert summary["input_problems"] == n


def test_evaluations_guard_counts_a_first_tick_stamped_by_a_clock_not_set(tmp_path, small_topology):
    n = write_first_tick_unset(tmp_path / "rec", small_topology)
    rec = Recording.open(tmp_path / "rec")
    health = PipelineHealth()
    bank = DetectorBank.from_names(rec.topology, ["thermal"])
    fed = [clean for clean, _ in guarded_updates(rec, bank, ["gpu"], health)]
    assert health.problems == {("guard", "bad_timestamp"): n}
    assert min(float(f.ts.min()) for f in fed) == T0 + 5
    assert sum(len(f) for f in fed) == n * 119


def truth_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "foreshock.evaluation" and r.levelname == "WARNING"]


NO_TRUTH = "every alarm a false one"
UNKNOWN = "ground-truth events name entities its topology lacks"


@pytest.mark.parametrize("warn_missing", [True, False])
@pytest.mark.parametrize("warn_unknown", [True, False])
def test_each_ground_truth_warning_has_its_own_flag(psu_recording, tmp_path, caplog, warn_missing, warn_unknown):
    ghostly = ghostly_copy(psu_recording, tmp_path / "ghostly")
    bare = tmp_path / "bare"
    write_first_tick_unset(bare, Recording.open(psu_recording).topology)
    assert not (bare / EVENTS_FILE).exists()  # a capture (no events given): no ground truth
    with caplog.at_level("WARNING", logger="foreshock.evaluation"):
        read_ground_truth(Recording.open(ghostly), warn_missing=warn_missing, warn_unknown=warn_unknown)
        on_ghostly = truth_warnings(caplog)
        caplog.clear()
        read_ground_truth(Recording.open(bare), warn_missing=warn_missing, warn_unknown=warn_unknown)
        on_bare = truth_warnings(caplog)
    assert [UNKNOWN in m for m in on_ghostly] == ([True] if warn_unknown else [])
    assert [NO_TRUTH in m for m in on_bare] == ([True] if warn_missing else [])


def test_incidents_without_events_file_does_not_say_every_alarm_is_false(tmp_path, small_topology, caplog):
    write_first_tick_unset(tmp_path / "rec", small_topology)
    assert not (tmp_path / "rec" / EVENTS_FILE).exists()  # a capture: no ground truth
    with caplog.at_level("WARNING", logger="foreshock.evaluation"):
        read_ground_truth(Recording.open(tmp_path / "rec"))  # as evaluate and train read it: they score alarms
        assert any(NO_TRUTH in m for m in truth_warnings(caplog))
        caplog.clear()
        incidents(tmp_path / "rec")
    assert truth_warnings(caplog) == []  # incidents scores no alarm: none is a false one


def test_incidents_logs_what_evaluate_logs_of_events_the_topology_lacks(psu_recording, tmp_path, caplog):
    ghostly = ghostly_copy(psu_recording, tmp_path / "ghostly")
    with caplog.at_level("WARNING", logger="foreshock.evaluation"):
        read_ground_truth(Recording.open(ghostly))  # what evaluate's run reads (run_recording) and logs
        evaluate_says = truth_warnings(caplog)
        caplog.clear()
        incidents(ghostly)
    assert len(evaluate_says) == 1 and UNKNOWN in evaluate_says[0] and "'ghost/gpu0'" in evaluate_says[0]
    assert truth_warnings(caplog) == evaluate_says
