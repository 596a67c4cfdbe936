"""A scenario's fault times and parameters are finite and inside each one's range, or the scenario
is refused with an error naming the file, the fault and the value (r106 R7): a NaN or infinite
onset never came (the fault silently did not happen), a NaN duration wrote the fault's onset and
XID but ended it before it acted, a flow fraction of NaN or 3.0 never dropped the flow while the
ground truth recorded a cooling loss."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.simulator import ClusterSimulator
from foreshock.simulator.faults import DEFAULT_PARAMS
from foreshock.simulator.scenario import ScenarioError, list_scenarios, load_scenario, scenario_from_dict

INF = math.inf
# (low, high, low end allowed), from what each parameter means: fractions of flow or of fans,
# rates and lags that cannot run backwards, factors on a resistance that a fault only raises,
# a derated power limit and a DBE repeat period above 0
RANGES = {
    ("cooling_loss", "flow_fraction"): (0.0, 1.0, True),
    ("cooling_loss", "ramp_s"): (0.0, INF, True),
    ("tim_degradation", "r_per_hour"): (0.0, INF, True),
    ("tim_degradation", "max_factor"): (1.0, INF, True),
    ("fan_failure", "fans_failed"): (0.0, 1.0, True),
    ("fan_failure", "r_increase"): (0.0, INF, True),
    ("fan_failure", "ramp_s"): (0.0, INF, True),
    ("psu_failure", "brake_s"): (0.0, INF, True),
    ("psu_failure", "derated_limit_w"): (0.0, INF, False),
    ("optic_degradation", "initial_db"): (0.0, INF, True),
    ("optic_degradation", "db_per_hour"): (0.0, INF, True),
    ("hbm_overheat", "r_per_hour"): (0.0, INF, True),
    ("hbm_overheat", "max_factor"): (1.0, INF, True),
    ("hbm_overheat", "dbe_after_s"): (0.0, INF, True),
    ("hbm_overheat", "dbe_every_s"): (0.0, INF, False),
}


def fault(ftype: str, **values) -> dict:
    return {"name": "t", "faults": [{"type": "xid79"}, {"type": ftype, **values}]}


def test_every_fault_parameter_has_a_range_here() -> None:
    assert set(RANGES) == {(t, p) for t, params in DEFAULT_PARAMS.items() for p in params}


@pytest.mark.parametrize(("ftype", "param"), sorted(RANGES))
def test_a_parameter_outside_its_range_is_refused_naming_the_file_fault_and_parameter(ftype: str, param: str) -> None:
    low, high, low_allowed = RANGES[(ftype, param)]
    bad = [math.nan, INF, -INF, low - 0.5] + ([] if low_allowed else [low]) + ([high + 0.5] if high < INF else [])
    for value in bad:
        with pytest.raises(ScenarioError, match=rf"^my\.yaml: faults\[1\] \({ftype}\): parameter {param} ") as err:
            scenario_from_dict(fault(ftype, params={param: value}), "my.yaml")
        assert repr(value) in str(err.value) or str(value) in str(err.value)
    good = ([low] if low_allowed else []) + [low + 0.5 if high == INF else (low + high) / 2] + ([high] if high < INF else [])
    for value in good:
        spec = scenario_from_dict(fault(ftype, params={param: value}), "my.yaml").faults[1]
        assert spec.params == {param: value}


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(sorted(RANGES)), value=st.floats(allow_nan=True, allow_infinity=True))
def test_a_parameter_is_taken_exactly_when_finite_and_inside_its_range(key: tuple[str, str], value: float) -> None:
    low, high, low_allowed = RANGES[key]
    inside = math.isfinite(value) and (low <= value if low_allowed else low < value) and value <= high
    try:
        scenario_from_dict(fault(key[0], params={key[1]: value}))
    except ScenarioError as exc:
        assert not inside, exc
        assert key[1] in str(exc)
    else:
        assert inside, value


def test_a_parameter_given_as_yaml_true_is_no_number() -> None:
    with pytest.raises(ScenarioError, match="parameter flow_fraction must be a number"):
        scenario_from_dict(fault("cooling_loss", params={"flow_fraction": True}))
    with pytest.raises(ScenarioError, match="'params' must be a mapping"):
        scenario_from_dict(fault("cooling_loss", params=[0.5]))


@pytest.mark.parametrize(("values", "message"), [
    ({"onset": math.nan}, "onset must be a finite number of seconds"),
    ({"onset": INF}, "onset must be a finite number of seconds"),
    ({"onset": -1}, "onset must not be negative"),
    ({"onset": True}, "onset must be seconds or 'N%'"),
    ({"onset": "nan%"}, "out of range"),
    ({"duration": math.nan}, "duration must be a finite number of seconds"),
    ({"duration": INF}, r"duration: null"),
    ({"duration": 0}, "duration must be more than 0 seconds"),
    ({"duration": "0%"}, "out of range"),
    ({"duration": -INF}, "duration must be a finite number of seconds"),
])
def test_a_fault_time_not_finite_or_out_of_range_is_refused(values: dict, message: str) -> None:
    with pytest.raises(ScenarioError, match=rf"^my\.yaml: faults\[1\] \(xid79\): .*{message}"):
        scenario_from_dict(fault("xid79", **values), "my.yaml")


def test_fault_times_in_range_are_taken() -> None:
    specs = scenario_from_dict({"name": "t", "faults": [
        {"type": "xid79", "onset": 0, "duration": 0.5}, {"type": "xid79", "onset": "0%", "duration": "1%"},
        {"type": "tim_degradation", "onset": 12.5, "duration": None}]}).faults
    assert [(s.onset, s.duration) for s in specs] == [(0.0, 0.5), ("0.0%", "1.0%"), (12.5, None)]


def test_a_scenario_file_with_a_nan_names_its_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nfaults:\n  - {type: cooling_loss, target: cdu0, params: {flow_fraction: .nan}}\n")
    with pytest.raises(ScenarioError, match=r"bad\.yaml: faults\[0\] \(cooling_loss\): parameter flow_fraction"):
        load_scenario(path)
    path.write_text("name: bad\nfaults:\n  - {type: xid79, target: node0/gpu0, onset: .inf}\n")
    with pytest.raises(ScenarioError, match=r"bad\.yaml: faults\[0\] \(xid79\): onset must be a finite"):
        load_scenario(path)


@pytest.mark.parametrize("name", list_scenarios())
def test_every_packaged_scenario_still_loads(name: str) -> None:
    assert load_scenario(name).name


def test_an_accepted_cooling_loss_drops_the_flow() -> None:
    """What the checks keep out did nothing: a cooling loss the scenario takes does drop the flow."""
    scen = scenario_from_dict({"name": "t", "faults": [{"type": "cooling_loss", "target": "cdu0", "onset": 0,
                                                          "params": {"flow_fraction": 0.5, "ramp_s": 0}}]})
    sim = ClusterSimulator(gpus=8, scenario=scen, seed=1, duration=20, warmup_s=0)
    for _ in range(5):
        sim.step()
    assert sim.cooling.flow[0] == pytest.approx(0.5)
