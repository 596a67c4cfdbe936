"""bench/power_cap_ceiling.py's plumbing on a small run: the probe's samples line up with the
recording's, and claims become spans as the harness reads them."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ceiling() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("power_cap_ceiling", ROOT / "bench" / "power_cap_ceiling.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_samples_the_margin_at_the_recording_s_sampling_instants(ceiling: ModuleType, tmp_path: Path) -> None:
    args = argparse.Namespace(gpus=64, duration=120.0, interval=10.0, window=30.0)
    ceiling.simulate(tmp_path, 7, args)
    probe = np.load(tmp_path / ceiling.MARGIN_FILE)
    table = pq.read_table(tmp_path / "gpu.parquet", columns=["ts", "slot", "util"])
    ts, slot, util = (table[c].to_numpy() for c in ("ts", "slot", "util"))
    assert np.array_equal(probe["ts"], np.unique(ts))
    assert probe["margin"].shape == probe["running"].shape == (12, 64)
    # a GPU the recording shows loaded is running for the probe; its margin is a finite wattage
    loaded = util > 0.5
    assert loaded.any()
    assert probe["running"][np.searchsorted(probe["ts"], ts[loaded]), slot[loaded]].all()
    assert np.isfinite(probe["margin"][probe["running"]]).all() and np.isinf(probe["margin"][~probe["running"]]).all()


def test_claims_become_spans_held_to_the_next_sample_and_union_merges_them(ceiling: ModuleType) -> None:
    ts = np.array([0.0, 10.0, 20.0, 30.0, 40.0])
    on = np.array([[1, 0], [1, 0], [0, 0], [1, 0], [0, 1]], dtype=bool)
    spans = ceiling.spans_of(on, ts, ["a", "b"], 10.0)
    assert spans == {"a": [(0.0, 20.0), (30.0, 40.0)], "b": [(40.0, 50.0)]}
    merged = ceiling.union(spans, {"a": [(15.0, 25.0)], "c": [(1.0, 2.0)]})
    assert merged == {"a": [(0.0, 25.0), (30.0, 40.0)], "b": [(40.0, 50.0)], "c": [(1.0, 2.0)]}
