"""Findings of an audit of the model file's loading (2026-12-04), each reproduced first. No crafted
file ran code (the type allow-list held), but:

- skops builds a reference to an object described before as that object, and walks the graph so
  built, shared parts again at every reference, when it audits the types: a 1-MB schema of lists
  each holding the one before twice took 28 s to refuse 22 deep, and would take months 40 deep;
- the 200-MiB unpacked bound summed each archive entry once, while skops unpacks an array once per
  node naming its file: one 20-MiB entry named 60 times took 2.6 GiB;
- a meta that is not a JSON object (edited, damaged) was read as saying nothing, which turned off
  the telemetry check without a word: a rack-trained model was scored on GPU telemetry alone.
"""

from __future__ import annotations

import io
import json
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import skops.io as sio

from foreshock.detectors import baselines as bl


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small model file as `foreshock train` writes it (its telemetry recorded)."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    x = np.random.default_rng(0).normal(size=(300, len(bl.FEATURES)))
    model = HistGradientBoostingClassifier(max_iter=2, random_state=0).fit(x, (x[:, 0] > 0).astype(int))
    path = Path(tmp_path_factory.mktemp("model")) / "m.skops"
    return bl.save_model(path, {"thermal_throttle": {"model": model, "horizon_s": 1800.0, "threshold": 0.5}},
                         meta={"telemetry": ["gpu", "rack"], "sklearn": __import__("sklearn").__version__})


def _rewritten(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None],
               extra: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(src) as z:
        schema = json.loads(z.read("schema.json"))
        edit(schema)
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as out:
            for info in z.infolist():
                out.writestr(info.filename, json.dumps(schema) if info.filename == "schema.json" else z.read(info))
            for name, data in (extra or {}).items():
                out.writestr(name, data)
    return dst


def _beside(schema: dict[str, Any], node: dict[str, Any]) -> None:
    """``node`` under an extra key of the document (refused by the document's checks, once loaded)."""
    schema["content"]["x"] = node
    schema["key_types"]["content"].append(dict(schema["key_types"]["content"][0]))


def test_a_schema_whose_references_expand_exponentially_is_refused_at_once(saved: Path, tmp_path: Path) -> None:
    def chain(schema: dict[str, Any]) -> None:
        node = {"__class__": "int", "__module__": "builtins", "__loader__": "JsonNode", "content": "0",
                "is_json": True, "__id__": 7_000_000}
        for k in range(40):  # list k holds list k-1 twice (the second by reference): 2**40 objects
            node = {"__class__": "list", "__module__": "builtins", "__loader__": "ListNode",
                    "content": [node, {"__id__": node["__id__"]}], "__id__": 7_000_001 + k}
        _beside(schema, node)

    path = _rewritten(saved, tmp_path / "dag.skops", chain)
    started = time.monotonic()
    with pytest.raises(bl.ModelFileError, match="builds over 1,000,000 objects"):
        bl.load_model(path)
    assert time.monotonic() - started < 20.0  # (the audit alone would run for months)


def test_an_array_entry_named_by_many_nodes_counts_at_each(saved: Path, tmp_path: Path) -> None:
    buf = io.BytesIO()
    np.save(buf, np.zeros(20 * 2**20 // 8))  # 20 MiB of zeros: ~20 KB packed

    def refs(schema: dict[str, Any]) -> None:
        _beside(schema, {"__class__": "list", "__module__": "builtins", "__loader__": "ListNode", "__id__": 10**9,
                         "content": [{"__class__": "ndarray", "__module__": "numpy", "__loader__": "NdArrayNode",
                                      "type": "numpy", "file": "big.npy", "__id__": 10**9 + 1 + i}
                                     for i in range(12)]})  # 240 MiB unpacked, the archive declaring 20

    path = _rewritten(saved, tmp_path / "amplified.skops", refs, {"big.npy": buf.getvalue()})
    with pytest.raises(bl.ModelFileError, match="reads over 200 MiB of arrays"):
        bl.load_model(path)


def test_a_model_file_as_written_passes_the_schema_check(saved: Path) -> None:
    doc = bl.load_model(saved)
    assert bl.model_telemetry(saved, doc) == ("gpu", "rack")


@pytest.mark.parametrize("meta", ['"telemetry": ["gpu", "rack"]}', "[1, 2]", "null"])
def test_a_meta_that_is_not_a_json_object_is_refused(saved: Path, tmp_path: Path, meta: str) -> None:
    doc = sio.loads(saved.read_bytes(), trusted=list(bl.TRUSTED_TYPES))
    path = tmp_path / "edited.skops"
    sio.dump({**doc, "meta": meta}, path)
    with pytest.raises(bl.ModelFileError, match="is not the JSON object `foreshock train` writes"):
        bl.load_model(path)


def test_evaluate_says_when_a_model_does_not_say_its_telemetry(saved: Path, empty_recording, tmp_path: Path) -> None:
    """A model file without its training telemetry (written before it was recorded) is served, its
    inputs unchecked, and the run says so; one that records it is served without a word."""
    from click.testing import CliRunner

    from foreshock.cli import evaluate as evaluate_cli

    rec = empty_recording("gpu", 30.0)
    doc = sio.loads(saved.read_bytes(), trusted=list(bl.TRUSTED_TYPES))
    version = __import__("sklearn").__version__
    said = {}
    for name, meta in (("legacy", {"sklearn": version}), ("recorded", {"sklearn": version, "telemetry": ["gpu"]})):
        model = tmp_path / f"{name}.skops"
        sio.dump({**doc, "meta": json.dumps(meta)}, model)
        result = CliRunner().invoke(evaluate_cli.command, [
            str(rec.path), "--detectors", "sklearn", "--model", str(model), "--events", "thermal_throttle",
            "--report", str(tmp_path / f"report-{name}"), "--no-plots"])
        assert result.exit_code == 0, result.output
        said[name] = "does not say which telemetry it was trained on" in " ".join(result.output.split())
    assert said == {"legacy": True, "recorded": False}
