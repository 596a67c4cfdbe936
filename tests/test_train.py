"""Training the scikit-learn baseline; the model file is safe to load and checked."""

from __future__ import annotations

import json
import pickle
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import baselines as bl
from foreshock.detectors import train as tr
from foreshock.findings import Prediction

from thermal_synth import Fault, World, small_topology, write_recording


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 500_000).map(lambda x: x / 100)), max_size=8),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 600_000).map(lambda x: x / 100)), min_size=1, max_size=30))
def test_label_rows_matches_reference(episodes, rows):
    """Telemetry timestamps (10 ms resolution here) against a per-row reference."""
    # non-overlapping episodes per slot, 100 s long
    spans, seen = [], {}
    for slot, start in sorted(episodes):
        if start >= seen.get(slot, -1e9):
            spans.append((slot, start, start + 100.0))
            seen[slot] = start + 101.0
    index = tr.EpisodeIndex.build(spans, 0.0)
    slot = np.array([r[0] for r in rows])
    ts = np.array([r[1] for r in rows])
    got = tr.label_rows(ts, slot, index, 300.0)
    for k, (g, t) in enumerate(rows):
        mine = [(s, e) for sl, s, e in spans if sl == g]
        if any(s <= t <= e for s, e in mine):
            assert np.isnan(got[k])
        else:
            assert got[k] == (1.0 if any(t < s <= t + 300.0 for s, _ in mine) else 0.0)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    path = tmp_path_factory.mktemp("rec") / "train"
    topo = small_topology(nodes=2, gpus=8, racks=1)
    world = World(topo, seed=11, interval=20.0, faults=[Fault("tim_degradation", 3, 1200, 1.5, "f1"),
                                                        Fault("tim_degradation", 12, 2400, 1.2, "f2")])
    write_recording(path, world, 3 * 3600)
    return path


@pytest.fixture(scope="module")
def model_file(recording, tmp_path_factory):
    path, summary = tr.train_and_save([recording], tmp_path_factory.mktemp("m") / "model.skops",
                                      ("thermal_throttle",), negative_fraction=0.2)
    assert summary["thermal_throttle"]["positives"] > 0
    return path


def test_trained_model_loads_and_predicts(model_file, recording):
    doc = bl.load_model(model_file)
    assert doc["features"] == list(bl.FEATURES) and doc["version"] == bl.MODEL_VERSION
    from foreshock.detectors.evaluation import aligned_frames
    from foreshock.recording import Recording

    rec = Recording.open(recording)
    det = bl.SklearnDetector(rec.topology, model_path=str(model_file))
    found = []
    for frame in aligned_frames(rec, ("gpu", "rack")):
        found += det.update(frame)
    slots = {p.slot for p in found if isinstance(p, Prediction) and p.active}
    assert slots & {3, 12}  # it learnt the failing GPUs of its own training data
    assert found[0].eta_s == 1800.0 and "P(thermal_throttle within 1800 s)" in found[0].reason


def rewrite_zip(src, dst, edit):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "schema.json":
                data = edit(data.decode()).encode()
            zout.writestr(item, data)


def test_tampered_model_file_is_rejected(model_file, tmp_path):
    bad = tmp_path / "tampered.skops"
    rewrite_zip(model_file, bad, lambda text: text.replace(
        '"sklearn.ensemble._hist_gradient_boosting.predictor"', '"os"').replace('"TreePredictor"', '"system"', 1))
    with pytest.raises(bl.ModelFileError, match="untrusted types.*os.system"):
        bl.load_model(bad)
    with pytest.raises(bl.ModelFileError, match="untrusted"):
        bl.SklearnDetector(small_topology(), model_path=str(bad))


def test_pickle_and_garbage_are_refused(tmp_path):
    pkl = tmp_path / "model.pkl"
    pkl.write_bytes(pickle.dumps({"format": bl.MODEL_FORMAT}))
    with pytest.raises(bl.ModelFileError, match="pickles are never loaded"):
        bl.load_model(pkl)
    broken = tmp_path / "broken.skops"
    with zipfile.ZipFile(broken, "w") as z:
        z.writestr("schema.json", "{not json")
    with pytest.raises(bl.ModelFileError, match="unreadable"):
        bl.load_model(broken)
    with pytest.raises(bl.ModelFileError, match="no such model file"):
        bl.load_model(tmp_path / "missing.skops")


def test_version_and_feature_mismatch_are_refused(model_file, tmp_path, monkeypatch):
    old = tmp_path / "old.skops"
    rewrite_zip(model_file, old, lambda text: text.replace('"version", "content": 1', '"version", "content": 0')
                if '"version", "content": 1' in text else _set_version(text))
    with pytest.raises(bl.ModelFileError, match="version"):
        bl.load_model(old)
    monkeypatch.setattr(bl, "FEATURES", bl.FEATURES + ("fan_speed",))
    with pytest.raises(bl.ModelFileError, match="trained on features"):
        bl.load_model(model_file)


def _set_version(text: str) -> str:
    """Set the stored format version to 0 in a skops schema, wherever skops keeps the int."""
    schema = json.loads(text)

    def walk(node):
        if isinstance(node, dict):
            content = node.get("content")
            if isinstance(content, dict) and "version" in content and isinstance(content["version"], dict):
                content["version"]["content"] = "0"
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(schema)
    return json.dumps(schema)


def test_cli_train_writes_a_loadable_model(recording, tmp_path):
    from click.testing import CliRunner

    from foreshock.cli.main import cli

    out = tmp_path / "m.skops"
    result = CliRunner().invoke(cli, ["train", str(recording), "--out", str(out), "--events", "thermal_throttle",
                                      "--negatives", "0.2"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["model"] == str(out) and summary["events"]["thermal_throttle"]["positives"] > 0
    assert list(bl.load_model(out)["events"]) == ["thermal_throttle"]
    bad = CliRunner().invoke(cli, ["train", str(recording), "--out", str(out), "--events", "nope"])
    assert bad.exit_code != 0 and "unknown events" in bad.output
