"""Scenario files: which faults happen, where and when.

A scenario is YAML, packaged (``foreshock/simulator/scenarios/<name>.yaml``, used by name) or
any file path::

    name: cooling-loss
    description: The CDU of one row loses flow; the whole row heats up and throttles.
    defaults: {gpus: 256, duration: 3600}   # used when the command line gives none (same rules:
                                            # a multiple of 8 GPUs, at least 8; seconds > 0)
    params: {job_churn: false}              # SimParams overrides (see params.py; type- and range-checked)
    random_faults: false
    faults:
      - type: cooling_loss                  # see faults.py for types and parameters
        target: auto                        # or an entity name: cdu0, node3, node3/gpu5, <link>#a
        onset: 300                          # seconds after the start, or "25%" of the run
        duration: null                      # time to repair (seconds or "%"); null = never
        min_duration: 1800                  # optional, with a "%" duration: at least this many seconds
        params: {flow_fraction: 0.08}

A duration given as a share of the run shrinks with it: ``min_duration`` keeps a fault long enough
to act in a short run (``mixed``'s cooling losses last 12 % and 10 % of the run, 43 and 36 minutes in
6 hours; in 2 hours 14 and 12, less than the 15 minutes their flow takes to fall, and every throttle
predicted of them was averted by the repair and scored a false alarm).

``target: auto`` picks, with the run's seed, an entity that carries a running job, avoiding
the cooling loops earlier faults already hit (independent faults land in different domains).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from foreshock.topology import DuplicateKeyError, UniqueKeyLoader

from .faults import DEFAULT_DURATION_S, check_fault_type, check_params
from .params import SimParams
from .topology_gen import cluster_size_problem


class ScenarioError(ValueError):
    """A scenario file is missing or malformed; the message names the file and the problem."""


@dataclass
class FaultSpec:
    type: str
    target: str | int | None = None  # None = auto
    onset: float | str = 0.0  # seconds or "N%"
    duration: float | str | None = None
    params: dict[str, float] = field(default_factory=dict)
    min_duration: float | None = None  # seconds: the least a "%" duration resolves to

    def duration_s(self, run_duration: float) -> float | None:
        """Seconds to the repair in a run of ``run_duration`` seconds (None: never)."""
        if self.duration is None:
            return None
        return max(resolve_time(self.duration, run_duration), self.min_duration or 0.0)


@dataclass
class Scenario:
    name: str
    description: str = ""
    faults: list[FaultSpec] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    random_faults: bool = False


def list_scenarios() -> list[str]:
    """Names of the packaged scenarios."""
    folder = resources.files("foreshock.simulator").joinpath("scenarios")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load a packaged scenario by name, or a YAML file by path."""
    text: str
    source = str(name_or_path)
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScenarioError(f"{path}: cannot read scenario ({exc.strerror})") from None
    else:
        packaged = resources.files("foreshock.simulator").joinpath("scenarios", f"{source}.yaml")
        if not packaged.is_file():
            raise ScenarioError(f"unknown scenario {source!r}; packaged: {', '.join(list_scenarios())} (or give a .yaml path)")
        text = packaged.read_text(encoding="utf-8")
    try:  # a key written twice is an error (YAML keeps the last: a second `faults:` dropped the first)
        data = yaml.load(text, Loader=UniqueKeyLoader)
    except DuplicateKeyError as exc:
        raise ScenarioError(f"{source}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: not valid YAML: {exc}") from None
    return scenario_from_dict(data, source)


def scenario_from_dict(data: Any, source: str = "scenario") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping at the top level")
    known = {"name", "description", "faults", "params", "defaults", "random_faults"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ScenarioError(f"{source}: unknown keys {unknown}")
    faults_raw = data.get("faults")
    faults_raw = [] if faults_raw is None else faults_raw  # (`faults:` with nothing: none)
    if not isinstance(faults_raw, list):  # ("", 0 and false were taken for no faults)
        raise ScenarioError(f"{source}: 'faults' must be a list of faults, not {faults_raw!r}")
    faults = []
    for i, f in enumerate(faults_raw):
        where = f"{source}: faults[{i}]"
        if not isinstance(f, dict) or "type" not in f:
            raise ScenarioError(f"{where}: each fault needs a 'type'")
        extra = sorted(set(f) - {"type", "target", "onset", "duration", "min_duration", "params"})
        if extra:
            raise ScenarioError(f"{where}: unknown keys {extra}")
        try:
            ftype = check_fault_type(str(f["type"]))
            where = f"{where} ({ftype})"
            if not isinstance(f.get("params") or {}, dict):
                raise ValueError(f"'params' must be a mapping, not {f.get('params')!r}")
            params = check_params(ftype, dict(f.get("params") or {}))
            onset = _time_value(f.get("onset", 0.0), "onset")
            duration = f.get("duration", DEFAULT_DURATION_S.get(ftype))
            duration = None if duration is None else _time_value(duration, "duration")
            min_duration = f.get("min_duration")
            if min_duration is not None:
                if not isinstance(duration, str):
                    raise ValueError("min_duration is for a duration given as a share of the run ('N%'), "
                                     f"not {duration!r}")
                min_duration = _time_value(min_duration, "min_duration")
                if isinstance(min_duration, str):
                    raise ValueError(f"min_duration must be seconds, not {f['min_duration']!r}")
        except ValueError as exc:
            raise ScenarioError(f"{where}: {exc}") from None
        target = f.get("target")
        target = None if target in (None, "auto") else target
        if target is not None and (isinstance(target, bool) or not isinstance(target, (str, int))):
            raise ScenarioError(f"{where}: target must be 'auto', an entity name or a slot number, not {target!r}")
        faults.append(FaultSpec(ftype, target, onset, duration, params, min_duration))
    for key in ("params", "defaults"):  # a mapping, or nothing ("", 0 and false were taken for none)
        if not isinstance({} if data.get(key) is None else data[key], dict):
            raise ScenarioError(f"{source}: '{key}' must be a mapping, not {data[key]!r}")
    random_faults = data.get("random_faults")
    random_faults = False if random_faults is None else random_faults  # (`random_faults:` with nothing)
    if not isinstance(random_faults, bool):  # ("false", a string, turned them on)
        raise ScenarioError(f"{source}: 'random_faults' must be true or false, not {random_faults!r}")
    name = data.get("name")
    name = Path(source).stem if name is None else name
    if not isinstance(name, str):  # (the loader keeps a name such as 010 or yes as written)
        raise ScenarioError(f"{source}: 'name' must be text, not {name!r}")
    try:
        SimParams().with_overrides(data.get("params") or {})
        _check_defaults(data.get("defaults") or {})
    except ValueError as exc:  # here, before a run writes anything
        raise ScenarioError(f"{source}: {exc}") from None
    return Scenario(
        name=name,
        description=str(data.get("description", "")),
        faults=faults,
        params=dict(data.get("params") or {}),
        defaults=dict(data.get("defaults") or {}),
        random_faults=random_faults,
    )


def _check_defaults(defaults: dict[str, Any]) -> None:
    """A scenario's ``defaults`` stand in for ``foreshock simulate --gpus`` and ``--duration``:
    the same rules (``cluster_size_problem``'s for the GPUs; a finite number of seconds above 0)."""
    unknown = sorted(set(defaults) - {"gpus", "duration"})
    if unknown:
        raise ValueError(f"unknown keys {unknown} in 'defaults' (known: duration, gpus)")
    problem = cluster_size_problem(defaults["gpus"]) if "gpus" in defaults else None
    if problem:
        raise ValueError(f"defaults: gpus {problem}")
    duration = defaults.get("duration", 1.0)
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not (
            duration > 0 and math.isfinite(duration)):
        raise ValueError(f"defaults: duration must be a number of seconds above 0, not {duration!r}")


def _time_value(value: Any, what: str) -> float | str:
    """A fault's ``onset`` (finite, 0 or more) or ``duration`` (finite, more than 0: a repair that
    takes no time is no fault, and "never" is null), in seconds or "N%" of the run. A NaN or
    infinite onset never came (the fault silently did not happen); a NaN duration wrote the
    fault's onset and its XID but ended it before it acted."""
    positive = what in ("duration", "min_duration")
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            pct = float(value.strip()[:-1])
        except ValueError:
            raise ValueError(f"{what} {value!r} is not a percentage") from None
        if not ((0.0 < pct if positive else 0.0 <= pct) and pct <= 1000.0):
            raise ValueError(f"{what} {value!r} out of range ({'above 0' if positive else '0'}% to 1000%)")
        return f"{pct}%"
    if isinstance(value, bool):  # (YAML's true is no 1 s)
        raise ValueError(f"{what} must be seconds or 'N%', got {value!r}")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be seconds or 'N%', got {value!r}") from None
    if not math.isfinite(seconds):
        never = " (a fault that is never repaired has duration: null)" if positive else ""
        raise ValueError(f"{what} must be a finite number of seconds, got {value!r}{never}")
    if positive and seconds <= 0:
        raise ValueError(f"{what} must be more than 0 seconds, got {value!r}")
    if seconds < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return seconds


def resolve_time(value: float | str, run_duration: float) -> float:
    """Seconds from a scenario time ("25%" of the run, or seconds)."""
    if isinstance(value, str):
        return float(value[:-1]) / 100.0 * run_duration
    return float(value)
