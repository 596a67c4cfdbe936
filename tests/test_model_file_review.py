"""A model file is refused, with a clear :class:`ModelFileError`, unless every value the sklearn
detector reads from it is safe to use (review r55): scikit-learn's compiled tree walk does no
bounds checks, so a trusted-types-only file with an edited node crashed or hung ``predict_proba``;
wrong types in the header were tracebacks; bad thresholds crashed the run after the report folder
existed; a small file unpacked to hundreds of MiB."""

from __future__ import annotations

import copy
import json
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import skops.io as sio
from click.testing import CliRunner

from foreshock.cli import evaluate as evaluate_cli
from foreshock.cli import train as train_cli
from foreshock.detectors import baselines as bl


@pytest.fixture(scope="module")
def classifier() -> Any:
    """A small fitted classifier of the loader's features, as `foreshock train` fits them."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    x = np.random.default_rng(0).normal(size=(400, len(bl.FEATURES)))
    return HistGradientBoostingClassifier(max_iter=3, random_state=0, class_weight="balanced").fit(
        x, (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int))  # trees of several splits


def entry(model: Any, **over: Any) -> dict[str, Any]:
    return {"model": model, "horizon_s": 1800.0, "threshold": 0.5, **over}


def document(models: dict[str, Any], **over: Any) -> dict[str, Any]:
    """A model file's document as :func:`save_model` writes it, with ``over`` replacing its values."""
    return {"format": bl.MODEL_FORMAT, "version": bl.MODEL_VERSION, "features": list(bl.FEATURES),
            "events": models, "meta": json.dumps({}), **over}


def written(path: Path, doc: dict[str, Any]) -> Path:
    sio.dump(doc, path)
    return path


def test_a_model_as_train_writes_it_loads_and_predicts(classifier: Any, tmp_path: Path) -> None:
    path = bl.save_model(tmp_path / "m.skops", {"thermal_throttle": entry(classifier)})
    model = bl.load_model(path)["events"]["thermal_throttle"]["model"]
    x = np.random.default_rng(1).normal(size=(5, len(bl.FEATURES)))
    assert np.array_equal(model.predict_proba(x), classifier.predict_proba(x))


def _split(nodes: np.ndarray, after_root: bool = False) -> int:
    """A split node of the tree (past the root if asked)."""
    return int(np.flatnonzero(nodes["is_leaf"] == 0)[1 if after_root else 0])


def _leaf(nodes: np.ndarray) -> int:
    return int(np.flatnonzero(nodes["is_leaf"] != 0)[0])


TREE_EDITS: dict[str, tuple[Callable[[Any], None], str]] = {
    # each: an edit of the first tree (only trusted types are left in the file), and the refusal
    "root-loops-to-itself": (lambda t: t.nodes[["left", "right"]].__setitem__(0, (0, 0)), "not after it"),
    "child-back-to-the-root": (lambda t: t.nodes["left"].__setitem__(_split(t.nodes, True), 0), "not after it"),
    "child-past-the-end": (lambda t: t.nodes["right"].__setitem__(0, 2**31), "child outside the tree"),
    "feature-past-ours": (lambda t: t.nodes["feature_idx"].__setitem__(0, len(bl.FEATURES)), "feature outside"),
    "negative-feature": (lambda t: t.nodes["feature_idx"].__setitem__(0, -1), "feature outside"),
    "categorical-split": (lambda t: t.nodes["is_categorical"].__setitem__(0, 1), "split on categories"),
    "nan-leaf": (lambda t: t.nodes["value"].__setitem__(_leaf(t.nodes), np.nan), "leaf value"),
    "bitsets-of-the-wrong-shape": (lambda t: setattr(t, "raw_left_cat_bitsets", np.zeros((1, 7), np.uint32)),
                                   "raw_left_cat_bitsets"),
}


@pytest.mark.parametrize("edit", sorted(TREE_EDITS))
def test_an_edited_tree_node_is_refused_before_predict_runs(classifier: Any, tmp_path: Path, edit: str) -> None:
    """HEAD loaded these; its predict_proba then read out of bounds (a segfault) or looped for ever."""
    model = copy.deepcopy(classifier)
    change, why = TREE_EDITS[edit]
    change(model._predictors[0][0])
    path = written(tmp_path / "m.skops", document({"thermal_throttle": entry(model)}))
    with pytest.raises(bl.ModelFileError, match=f"'thermal_throttle' classifier .*{why}.*tampered"):
        bl.load_model(path)


def _one_class() -> Any:
    from sklearn.dummy import DummyClassifier

    return DummyClassifier().fit(np.zeros((10, len(bl.FEATURES))), np.zeros(10, int))


def _unfitted() -> Any:
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier()


def _three_classes() -> Any:
    from sklearn.ensemble import HistGradientBoostingClassifier

    x = np.random.default_rng(0).normal(size=(300, len(bl.FEATURES)))
    return HistGradientBoostingClassifier(max_iter=2).fit(x, np.digitize(x[:, 0], [-0.5, 0.5]))


def _identity_link() -> Any:
    from sklearn._loss.link import IdentityLink

    return IdentityLink()


def _edited(change: Callable[[Any], None]) -> Callable[[Any], Any]:
    def make(classifier: Any) -> Any:
        model = copy.deepcopy(classifier)
        change(model)
        return model
    return make


CLASSIFIERS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "one-class-dummy": (lambda c: _one_class(), "DummyClassifier, not a HistGradientBoostingClassifier"),
    "unfitted": (lambda c: _unfitted(), "is not fitted"),
    "three-classes": (lambda c: _three_classes(), "trees per iteration, not 1"),
    # a trusted numpy ufunc stored over the method: predict_proba(x) would be -x
    "method-hidden-by-a-ufunc": (_edited(lambda m: setattr(m, "predict_proba", np.negative)), "predict_proba"),
    "link-swapped": (_edited(lambda m: setattr(m._loss, "link", _identity_link())), "IdentityLink as link"),
    "nan-baseline": (_edited(lambda m: setattr(m, "_baseline_prediction", np.array([[np.nan]]))), "baseline"),
    "categorical-feature": (_edited(lambda m: m._bin_mapper.is_categorical_.__setitem__(3, 1)), "categorical"),
    "iteration-of-two-trees": (_edited(lambda m: m._predictors[0].append(m._predictors[0][0])), "not a list of one"),
}


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_a_classifier_predict_could_not_safely_run_is_refused(classifier: Any, tmp_path: Path, name: str) -> None:
    """HEAD loaded these (any object with ``predict_proba``); the run crashed, or scored garbage."""
    make, why = CLASSIFIERS[name]
    path = written(tmp_path / "m.skops", document({"thermal_throttle": entry(make(classifier))}))
    with pytest.raises(bl.ModelFileError, match=f"'thermal_throttle' classifier .*{why}"):
        bl.load_model(path)


HEADERS: dict[str, tuple[dict[str, Any], str]] = {
    "features-an-int": ({"features": 5}, "trained on features 5"),
    "features-a-2d-array": ({"features": np.zeros((2, 2))}, "trained on features array"),
    "format-an-array": ({"format": np.array([bl.MODEL_FORMAT, "x"])}, "not a foreshock model file"),
    "version-an-array": ({"version": np.array([1, 1])}, "model format version array"),
    "version-a-bool": ({"version": True}, "model format version True"),
    "meta-an-array": ({"meta": np.zeros(3)}, "meta is a ndarray"),
    "an-extra-key": ({"pad": np.zeros(3)}, r"holds \[\"'pad'\"\] beside"),
}


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_a_header_value_of_the_wrong_type_is_refused_not_a_traceback(classifier: Any, tmp_path: Path,
                                                                       name: str) -> None:
    over, why = HEADERS[name]
    path = written(tmp_path / "m.skops", document({"thermal_throttle": entry(classifier)}, **over))
    with pytest.raises(bl.ModelFileError, match=why):
        bl.load_model(path)


ENTRIES: dict[str, tuple[dict[str, Any], str]] = {
    "threshold-a-string": ({"threshold": "abc"}, "alarms at P >= 'abc'"),
    "threshold-none": ({"threshold": None}, "alarms at P >= None"),
    "threshold-nan": ({"threshold": float("nan")}, "alarms at P >= nan"),
    "threshold-one": ({"threshold": 1.0}, "alarms at P >= 1.0"),
    "threshold-a-bool": ({"threshold": True}, "alarms at P >= True"),
    "horizon-negative": ({"horizon_s": -5.0}, "has horizon -5.0 s"),
    "horizon-infinite": ({"horizon_s": float("inf")}, "has horizon inf s"),
    "horizon-a-string": ({"horizon_s": "1800"}, "has horizon '1800' s"),
    "an-extra-key": ({"predict": 1}, r"holds \[\"'predict'\"\] beside"),
}


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_an_alarm_setting_the_detector_could_not_use_is_refused(classifier: Any, tmp_path: Path, name: str) -> None:
    over, why = ENTRIES[name]
    path = written(tmp_path / "m.skops", document({"thermal_throttle": entry(classifier, **over)}))
    with pytest.raises(bl.ModelFileError, match=f"entry 'thermal_throttle' {why}"):
        bl.load_model(path)


def test_a_missing_threshold_is_refused(classifier: Any, tmp_path: Path) -> None:
    """`foreshock train` always writes one; HEAD quietly alarmed at 0.5."""
    bare = entry(classifier)
    del bare["threshold"]
    path = written(tmp_path / "m.skops", document({"thermal_throttle": bare}))
    with pytest.raises(bl.ModelFileError, match="alarms at P >= None"):
        bl.load_model(path)


def test_a_classifier_for_an_unknown_event_is_refused(classifier: Any, tmp_path: Path) -> None:
    """HEAD loaded it and the run never scored it."""
    path = written(tmp_path / "m.skops", document({"thermal_throttle": entry(classifier),
                                                   "thermal_throtle": entry(classifier)}))
    with pytest.raises(bl.ModelFileError, match="classifier for 'thermal_throtle', not an event kind"):
        bl.load_model(path)


def test_an_archive_that_unpacks_past_the_limit_is_refused_before_unpacking(classifier: Any, tmp_path: Path) -> None:
    """A 0.2 MB file whose extra entry inflates to 201 MiB: refused from the archive's directory."""
    path = bl.save_model(tmp_path / "m.skops", {"thermal_throttle": entry(classifier)})
    pad = zipfile.ZipInfo("pad.npy")
    pad.compress_type = zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "a") as archive, archive.open(pad, "w", force_zip64=True) as out:
        chunk = bytes(2**20)
        for _ in range(201):  # MiB, past the limit of 200
            out.write(chunk)
    assert path.stat().st_size < 2**20
    with pytest.raises(bl.ModelFileError, match="refused — the archive unpacks to 20[0-9].[0-9] MiB"):
        bl.load_model(path)


def test_an_archive_of_too_many_entries_is_refused(classifier: Any, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bl, "MODEL_ENTRIES_MOST", 5, raising=False)
    path = bl.save_model(tmp_path / "m.skops", {"thermal_throttle": entry(classifier)})
    with pytest.raises(bl.ModelFileError, match="refused — the archive unpacks to .* in [0-9]+ entries"):
        bl.load_model(path)


def test_evaluate_does_not_score_the_sklearn_set_on_kinds_its_model_lacks(classifier: Any, empty_recording,
                                                                          tmp_path: Path) -> None:
    """HEAD showed the sklearn set's power_cap with recall as if the model had predicted and missed."""
    rec = empty_recording("gpu", 30.0)
    model = bl.save_model(tmp_path / "m.skops", {"thermal_throttle": entry(classifier)})
    result = CliRunner().invoke(evaluate_cli.command, [str(rec.path), "--detectors", "sklearn,threshold",
                                                       "--model", str(model), "--events", "thermal_throttle,power_cap",
                                                       "--report", str(tmp_path / "report"), "--no-plots"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert list(report["detectors"]["sklearn"]) == ["thermal_throttle"]
    assert list(report["detectors"]["threshold"]) == ["thermal_throttle", "power_cap"]
    assert report["meta"]["not_predicted"] == {"sklearn": ["power_cap"]}
    assert "its model predicts no power_cap" in result.output


def test_evaluate_refuses_a_bad_threshold_before_the_report_folder(classifier: Any, empty_recording,
                                                                   tmp_path: Path) -> None:
    """HEAD passed its up-front check, made the report folder, then crashed on float('abc')."""
    rec = empty_recording("gpu", 30.0)
    model = written(tmp_path / "m.skops", document({"thermal_throttle": entry(classifier, threshold="abc")}))
    report = tmp_path / "report"
    result = CliRunner().invoke(evaluate_cli.command, [str(rec.path), "--detectors", "sklearn", "--model", str(model),
                                                       "--report", str(report), "--no-plots"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"Error: --model {model}: entry 'thermal_throttle' alarms at P >= 'abc'" in result.output
    assert not report.exists()


def test_train_with_no_events_left_is_a_usage_error(empty_recording, tmp_path: Path) -> None:
    """HEAD exited 0 and wrote a model of no classifiers, which evaluate then refused."""
    rec = empty_recording("gpu", 30.0)
    out = tmp_path / "m.skops"
    result = CliRunner().invoke(train_cli.command, [str(rec.path), "--out", str(out), "--events", " , "])
    assert result.exit_code == 2 and "Usage:" in result.output, result.output
    assert "--events names no event to learn" in result.output
    assert not out.exists()
