"""``foreshock evaluate``: a ``--param`` or ``--model`` the command cannot use is a clear error before
anything is written; an error inside the run is not disguised as one (h22's README walk-through)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from foreshock.cli import evaluate
from foreshock.detectors.bank import DetectorBank


def invoke(*args: str) -> Result:
    return CliRunner().invoke(evaluate.command, list(args))


def test_an_unknown_param_name_is_a_usage_error_before_the_report_folder(empty_recording, tmp_path: Path) -> None:
    rec = empty_recording("gpu", 30.0)
    report = tmp_path / "report"
    result = invoke(str(rec.path), "--detectors", "foreshock", "--report", str(report), "--no-plots",
                    "--param", "thermal.no_such_knob=1")
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "Usage:" in result.output and "no_such_knob" in result.output
    assert not report.exists()


def test_a_value_error_inside_the_run_keeps_its_traceback(empty_recording, tmp_path: Path, monkeypatch) -> None:
    """The run's ``except (ValueError, TypeError)`` turned any internal error into "Usage: ... Error:
    <message>", with no traceback even under -vv."""
    rec = empty_recording("gpu", 30.0)

    def broken(self, frame):  # type: ignore[no-untyped-def]
        raise ValueError("an internal error, not the user's")

    monkeypatch.setattr(DetectorBank, "update", broken)
    result = invoke(str(rec.path), "--detectors", "foreshock", "--report", str(tmp_path / "report"), "--no-plots",
                    "--param", "thermal.inlet_stale_s=120")
    assert isinstance(result.exception, ValueError) and str(result.exception) == "an internal error, not the user's"
    assert "Usage:" not in result.output


def test_a_missing_model_file_names_the_model_option_before_the_report_folder(empty_recording,
                                                                               tmp_path: Path) -> None:
    rec = empty_recording("gpu", 30.0)
    report = tmp_path / "report"
    result = invoke(str(rec.path), "--detectors", "foreshock,sklearn", "--report", str(report), "--no-plots",
                    "--model", str(tmp_path / "nonexist.skops"))
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "'--model'" in result.output and "nonexist.skops" in result.output and "does not exist" in result.output
    assert "model_path" not in result.output  # a parameter the user never typed
    assert not report.exists()


@pytest.mark.parametrize("content", [b"not a zip archive", b"PK\x05\x06" + bytes(18)], ids=["pickle-ish", "empty-zip"])
def test_a_model_file_the_loader_refuses_names_the_model_option_before_the_report_folder(
        empty_recording, tmp_path: Path, content: bytes) -> None:
    rec = empty_recording("gpu", 30.0)
    report = tmp_path / "report"
    model = tmp_path / "tampered.skops"
    model.write_bytes(content)
    result = invoke(str(rec.path), "--detectors", "foreshock,sklearn", "--report", str(report), "--no-plots",
                    "--model", str(model))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"Error: --model {model}: " in result.output and "model file" in result.output
    assert "model_path" not in result.output
    assert not report.exists()


@pytest.mark.parametrize("param", ["river_hst.n_trees=5.5", "river_hst.height=0", "river_hst.quantile=1.5",
                                   "river_hst.calibration_skip_s=abc"])
def test_a_river_parameter_river_would_refuse_only_mid_run_is_a_usage_error(empty_recording, tmp_path: Path,
                                                                           param: str) -> None:
    """river's HalfSpaceTrees checks none of its arguments: a bad one failed once data came (a
    quantile only at the end of the calibration window), a traceback after the report folder was
    made (review h28)."""
    rec = empty_recording("gpu", 30.0)
    report = tmp_path / "report"
    result = invoke(str(rec.path), "--detectors", "river", "--report", str(report), "--no-plots", "--param", param)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "Usage:" in result.output and param.split(".")[1].split("=")[0] in result.output
    assert not report.exists()


def test_whole_river_parameters_given_as_floats_are_taken() -> None:
    """Every --param is parsed as a float: ``river_hst.n_trees=5`` ended in "'float' object cannot be
    interpreted as an integer" once data came."""
    from foreshock.detectors.baselines import HalfSpaceTreesDetector
    from thermal_synth import small_topology
    hst = HalfSpaceTreesDetector(small_topology(), n_trees=5.0, height=6.0, window_size=100.0)
    assert (hst.model.n_trees, hst.model.height, hst.model.window_size) == (5, 6, 100)
    assert all(isinstance(v, int) for v in (hst.model.n_trees, hst.model.height, hst.model.window_size))


@pytest.fixture
def small_model(tmp_path: Path) -> Path:
    """A model file as `foreshock train` writes it: a small classifier of the loader's features."""
    import numpy as np
    from sklearn.ensemble import HistGradientBoostingClassifier

    from foreshock.detectors.baselines import FEATURES, save_model
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, len(FEATURES)))
    model = HistGradientBoostingClassifier(max_iter=3).fit(x, (x[:, 0] > 0).astype(int))
    return save_model(tmp_path / "model.skops",
                      {"thermal_throttle": {"model": model, "horizon_s": 1800.0, "threshold": 0.5}})


def count_model_reads(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The model file's reads from now on: the loader's own reader and skops' loads (a skops load
    from a path reads the file)."""
    import skops.io

    from foreshock.detectors import baselines
    reads: list[str] = []
    monkeypatch.setattr(baselines, "_LOADED", {}, raising=False)  # nothing read before this test
    for name in ("load", "loads"):
        loader = getattr(skops.io, name)
        monkeypatch.setattr(skops.io, name, lambda *a, _loader=loader, _name=name, **k: (
            reads.append(f"skops.io.{_name}"), _loader(*a, **k))[1])
    reader = getattr(baselines, "_read_model_file", None)
    if reader is not None:
        monkeypatch.setattr(baselines, "_read_model_file", lambda path: (reads.append("read"), reader(path))[1])
    return reads


def test_evaluate_reads_the_model_file_once(empty_recording, tmp_path: Path, small_model: Path, monkeypatch) -> None:
    """It was loaded at parse time, again to check a --param sklearn.*, and again for the run: three
    skops loads (~0.3 s each for a 3.4 MB model; review h28)."""
    rec = empty_recording("gpu", 30.0)
    reads = count_model_reads(monkeypatch)
    result = invoke(str(rec.path), "--detectors", "sklearn", "--report", str(tmp_path / "report"), "--no-plots",
                    "--model", str(small_model), "--param", "sklearn.threshold=0.6")
    assert result.exit_code == 0, result.output
    assert sorted(reads) == ["read", "skops.io.loads"]


def test_a_model_file_rewritten_after_a_load_is_read_and_checked_again(tmp_path: Path, small_model: Path,
                                                                        monkeypatch) -> None:
    """The loaded model is kept by the file's modification time and size: a file tampered with
    after a first load is refused, not served from memory."""
    import os

    from foreshock.detectors.baselines import ModelFileError, load_model
    reads = count_model_reads(monkeypatch)
    first = load_model(small_model)
    first["events"].clear()  # a caller's own copy: the next load is whole
    assert list(load_model(str(small_model))["events"]) == ["thermal_throttle"] and reads.count("read") == 1
    stat = small_model.stat()
    small_model.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip archive
    os.utime(small_model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    with pytest.raises(ModelFileError, match="unreadable model file"):
        load_model(small_model)


@pytest.mark.parametrize(("sets", "param"), [("threshold", "threshold.off_hold_s=abc"),
                                             ("foreshock", "thermal.tau_core_s=abc")])
def test_a_param_that_is_not_a_number_is_a_usage_error_naming_it(empty_recording, tmp_path: Path, sets: str,
                                                                 param: str) -> None:
    """``threshold.off_hold_s=abc`` reached the alarm kernel and ended in a Numba typing error once
    data came, after the report folder was made."""
    rec = empty_recording("gpu", 30.0)
    report = tmp_path / "report"
    result = invoke(str(rec.path), "--detectors", sets, "--report", str(report), "--no-plots", "--param", param)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    detector, name = param.split("=")[0].split(".")
    assert "Usage:" in result.output and f"{detector}: {name} must be a number, not 'abc'" in result.output
    assert param in result.output  # as typed, like any parameter the detector refuses
    assert not report.exists()


def number_parameters() -> list[tuple[str, str]]:
    """``(detector or processor, parameter)`` for each parameter with a number default, each
    ``float | None`` one, and each name in the ``PARAMS`` table of one that takes ``**params``."""
    import importlib
    import inspect

    from foreshock.detectors.registry import DETECTORS, PROCESSORS
    out = []
    for name, target in (DETECTORS | PROCESSORS).items():
        module_name, _, cls_name = target.partition(":")
        module = importlib.import_module(f"foreshock.detectors.{module_name}")
        for key, param in inspect.signature(getattr(module, cls_name).__init__).parameters.items():
            if param.kind is param.VAR_KEYWORD:
                out += [(name, k) for k in module.PARAMS]
            elif type(param.default) in (int, float) or param.annotation == "float | None":
                out.append((name, key))
    return out


@pytest.mark.parametrize(("name", "key"), number_parameters(), ids=lambda v: str(v))
def test_every_number_parameter_refuses_a_string_naming_itself(small_topology, name: str, key: str) -> None:
    """The check is the registry's, so every command's ``--param`` has it; before, only river's were
    named, the rest read "'<' not supported between instances of 'str' and 'int'" or worse."""
    from foreshock.detectors.registry import PROCESSORS, create, create_processor
    make = create_processor if name in PROCESSORS else create
    with pytest.raises(ValueError) as refused:
        make(name, small_topology, **{key: "abc"})
    assert str(refused.value) == f"{name}: {key} must be a number, not 'abc' (parameters given: {name}.{key}=abc)"


def test_number_parameters_cover_every_detector_that_takes_one() -> None:
    """The list above is read from the signatures and ``PARAMS`` tables: an empty one would pass
    the test vacuously."""
    from foreshock.detectors.registry import DETECTORS
    named = {name for name, _ in number_parameters()}
    assert set(DETECTORS) - named == {"xid"}  # the only detector without parameters
    assert ("threshold", "off_hold_s") in number_parameters() and ("sklearn", "threshold") in number_parameters()


def test_a_model_without_the_sklearn_set_is_a_usage_error_before_it_is_read(empty_recording, tmp_path: Path,
                                                                             small_model: Path, monkeypatch) -> None:
    """``--model`` was loaded (and had to be a valid model file) even where no set used it."""
    rec = empty_recording("gpu", 30.0)
    reads = count_model_reads(monkeypatch)
    report = tmp_path / "report"
    result = invoke(str(rec.path), "--detectors", "foreshock,threshold", "--report", str(report), "--no-plots",
                    "--model", str(small_model))
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "Usage:" in result.output and "--model is only used by the sklearn set" in result.output
    assert reads == [] and not report.exists()
