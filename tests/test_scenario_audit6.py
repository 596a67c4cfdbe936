"""Scenario files and ``foreshock simulate`` options the sixth audit found taken for something
else: a key written twice (YAML keeps the last), ``random_faults: "false"`` (a string, true),
``faults: ""`` (no faults), two faults of one type on one target at once (a second XID 79 onset
the telemetry cannot show), ``--seed -1`` (an error without the option's name), and an interval
or fault acceleration no run can use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from foreshock.cli import simulate
from foreshock.simulator import ClusterSimulator, ScenarioError, list_scenarios, load_scenario
from foreshock.simulator.scenario import FaultSpec, Scenario, scenario_from_dict


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scen.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _simulate(tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(simulate.command, ["--gpus", "16", "--duration", "60", "--interval", "10",
                                                 "--no-progress", "--out", str(tmp_path / "rec"), *args])


# ---- 1. a key written twice -----------------------------------------------------------------------

def test_a_key_written_twice_is_an_error_naming_it(tmp_path: Path) -> None:
    twice_faults = ("name: d\nfaults:\n  - {type: cooling_loss, target: cdu0, onset: 60}\n"
                    "params: {job_churn: false}\nfaults:\n  - {type: xid79, target: node1/gpu2, onset: 120}\n")
    with pytest.raises(ScenarioError, match=r"key 'faults' given twice.*first on line 2"):
        load_scenario(_write(tmp_path, twice_faults))
    twice_onset = "faults:\n  - type: psu_failure\n    target: node3\n    onset: 60\n    onset: 900\n"
    with pytest.raises(ScenarioError, match=r"line 5: key 'onset' given twice"):
        load_scenario(_write(tmp_path, twice_onset))
    # the topology's loader, under its public names, the old ones still working
    from foreshock import topology
    assert topology._Loader is topology.UniqueKeyLoader
    assert topology._DuplicateKeyError is topology.DuplicateKeyError
    # merge keys still override, and every packaged scenario still loads
    merged = load_scenario(_write(tmp_path, "defaults: {gpus: 64}\n"
                                            "params: {<<: {job_churn: true}, job_churn: false}\n"))
    assert merged.params == {"job_churn": False} and merged.defaults == {"gpus": 64}
    assert all(load_scenario(name).name == name for name in list_scenarios())


def test_the_command_line_reports_a_repeated_key_as_a_scenario_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: d\nrandom_faults: false\nrandom_faults: true\n")
    result = _simulate(tmp_path, "--scenario", str(path))
    assert result.exit_code == 2 and "--scenario" in result.output
    assert "'random_faults' given twice" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "rec").exists()


# ---- 2. values of the wrong type --------------------------------------------------------------------

@pytest.mark.parametrize("value", ['"false"', '"no"', "0", "1", "[]"])
def test_random_faults_must_be_true_or_false(value: str, tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="'random_faults' must be true or false"):
        load_scenario(_write(tmp_path, f"name: rf\nrandom_faults: {value}\n"))
    assert load_scenario(_write(tmp_path, "random_faults: true\n")).random_faults is True
    assert load_scenario(_write(tmp_path, "random_faults: false\n")).random_faults is False
    assert load_scenario(_write(tmp_path, "name: x\n")).random_faults is False
    assert load_scenario(_write(tmp_path, "random_faults:\n")).random_faults is False  # null: absent


@pytest.mark.parametrize("key,value", [("faults", '""'), ("faults", "0"), ("faults", "false"), ("faults", "{}"),
                                       ("params", '""'), ("params", "0"), ("params", "false"), ("params", "[]"),
                                       ("defaults", '""'), ("defaults", "0"), ("defaults", "false")])
def test_faults_is_a_list_and_params_and_defaults_are_mappings(key: str, value: str, tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=f"'{key}' must be a"):
        load_scenario(_write(tmp_path, f"name: x\n{key}: {value}\n"))
    # absent or left empty (null) is none
    for text in (f"name: x\n{key}:\n", "name: x\n", f"name: x\n{key}: {'[]' if key == 'faults' else '{}'}\n"):
        scen = load_scenario(_write(tmp_path, text))
        assert scen.faults == [] and scen.params == {} and scen.defaults == {}


def test_the_name_is_text(tmp_path: Path) -> None:
    for name in ([1, 2], {"a": 1}, 5, True):
        with pytest.raises(ScenarioError, match="'name' must be text"):
            scenario_from_dict({"name": name}, "s.yaml")
    with pytest.raises(ScenarioError, match="'name' must be text"):
        load_scenario(_write(tmp_path, "name: [a, b]\n"))
    assert load_scenario(_write(tmp_path, "name: 010\n")).name == "010"  # as written, not 8
    assert load_scenario(_write(tmp_path, "name:\n")).name == "scen"  # null: the file's
    assert scenario_from_dict({}, "dir/my-run.yaml").name == "my-run"


# ---- 3. two faults of one type on one target at once -----------------------------------------------

def _sim(*faults: FaultSpec, gpus: int = 64) -> ClusterSimulator:
    return ClusterSimulator(gpus=gpus, scenario=Scenario("s", faults=list(faults)), seed=1, duration=3600,
                            interval=10, warmup_s=0, refuse_overlapping_faults=True)


def test_overlapping_faults_of_one_type_on_one_target_are_refused() -> None:
    with pytest.raises(ValueError, match=r"faults\[1\] \(xid79 on node1/gpu2, onset 100 s\) overlaps faults\[0\] "
                                         r"\(xid79 on node1/gpu2, onset 60 s, until 180 s\)"):
        _sim(FaultSpec("xid79", "node1/gpu2", 60.0, 120.0), FaultSpec("xid79", "node1/gpu2", 100.0, 300.0))
    # listed in the other order: named by their places in the list all the same
    with pytest.raises(ValueError, match=r"faults\[0\] \(xid79 on node1/gpu2, onset 100 s\) overlaps faults\[1\]"):
        _sim(FaultSpec("xid79", "node1/gpu2", 100.0, 300.0), FaultSpec("xid79", "node1/gpu2", 60.0, 120.0))
    # one with no duration overlaps everything after it; the same onset overlaps
    with pytest.raises(ValueError, match=r"never repaired"):
        _sim(FaultSpec("tim_degradation", "node0/gpu0", 60.0), FaultSpec("tim_degradation", "node0/gpu0", 3000.0))
    with pytest.raises(ValueError, match=r"faults\[1\] \(psu_failure on node3"):
        _sim(FaultSpec("psu_failure", "node3", "10%", 600.0), FaultSpec("psu_failure", 3, 360.0, 60.0))
    # the telemetry can show these: back to back, other types, other targets, a new board
    sim = _sim(FaultSpec("xid79", "node1/gpu2", 60.0, 120.0), FaultSpec("xid79", "node1/gpu2", 180.0, 300.0),
               FaultSpec("tim_degradation", "node1/gpu2", 100.0), FaultSpec("xid79", "node1/gpu3", 100.0, 300.0),
               FaultSpec("hbm_overheat", "node2/gpu0", 60.0), FaultSpec("gpu_replacement", "node2/gpu0", 600.0, 600.0),
               FaultSpec("hbm_overheat", "node2/gpu0", 1500.0))
    assert len(sim.faults) == 7
    # the engine asked for nothing runs them by its board-swap rule (nested XID 79s: tests stress it)
    nested = ClusterSimulator(gpus=64, scenario=Scenario("s", faults=[
        FaultSpec("xid79", "node1/gpu2", 60.0, 120.0), FaultSpec("xid79", "node1/gpu2", 100.0, 300.0)]), warmup_s=0)
    assert len(nested.faults) == 2


def test_the_command_line_refuses_overlapping_faults_as_a_usage_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: dup\nfaults:\n  - {type: xid79, target: node1/gpu2, onset: 60, duration: 120}\n"
                            "  - {type: xid79, target: node1/gpu2, onset: 100, duration: 300}\n")
    result = _simulate(tmp_path, "--scenario", str(path))
    assert result.exit_code == 2 and "faults[1]" in result.output and "faults[0]" in result.output
    assert not (tmp_path / "rec").exists()


# ---- 4. and 5. options ------------------------------------------------------------------------------

@pytest.mark.parametrize("args,option", [(["--seed", "-1"], "--seed"),
                                         (["--duration", "7200", "--interval", "3601"], "--interval"),
                                         (["--random-faults", "--fault-acceleration", "1e12"], "--fault-acceleration")])
def test_out_of_range_options_are_refused_by_name(args: list[str], option: str, tmp_path: Path) -> None:
    result = _simulate(tmp_path, *args)
    assert result.exit_code == 2 and option in result.output, result.output
    assert not (tmp_path / "rec").exists()
