"""bench/power_cap_ceiling.py's plumbing on a small run: the probe's samples line up with the
recording's, claims become spans as the harness reads them, and the oracle claims exactly where
the harness judges a claim."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow.parquet as pq
import pytest

from foreshock.detectors import evaluation as ev
from foreshock.events import Event
from foreshock.recording import Recording

from bench_modules import load_bench


@pytest.fixture(scope="module")
def ceiling() -> ModuleType:
    return load_bench("power_cap_ceiling")


@pytest.fixture(scope="module")
def small_run(ceiling: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ceiling")
    ceiling.simulate(out, 7, argparse.Namespace(gpus=64, duration=120.0, interval=10.0, window=30.0))
    return out


def test_the_probe_samples_the_margin_at_the_recording_s_sampling_instants(ceiling: ModuleType, small_run: Path) -> None:
    probe = np.load(small_run / ceiling.MARGIN_FILE)
    table = pq.read_table(small_run / "gpu.parquet", columns=["ts", "slot", "util"])
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


def test_the_oracle_may_claim_from_the_first_instant_the_harness_judges_a_claim(ceiling: ModuleType,
                                                                                small_run: Path) -> None:
    rec = Recording.open(small_run)
    names = list(rec.topology.gpus)
    gpu = names[3]
    kind = ceiling.KIND
    gap = kind.merge_gap_s
    # two episodes more than the merge gap apart, and one still under way at the end
    events = [Event(1000.0, "power_cap_start", "gpu", gpu), Event(1100.0, "power_cap_end", "gpu", gpu),
              Event(1400.0, "power_cap_start", "gpu", gpu), Event(1500.0, "power_cap_end", "gpu", gpu),
              Event(1800.0, "power_cap_start", "gpu", names[5])]
    ts = np.arange(900.0, 2000.0, 10.0)
    ok = ceiling.claimable(ev.episodes(events, kind), ts, names, gap)
    first = ts[(ts > 1000.0) & ok[:, 3]][0]
    assert first == 1100.0 + gap + 10.0  # the first sample past the end and the merge gap
    assert not ok[(ts >= 1000.0) & (ts <= 1100.0 + gap), 3].any() and ok[ts < 1000.0, 3].all()
    assert not ok[ts >= 1800.0, 5].any() and ok[ts < 1800.0, 5].all()
    assert ok[:, [0, 1, 2, 4]].all()

    # the harness judges a claim raised at that instant (it earns the second episode) and not
    # one raised the sample before (it started within the merge gap after the first)
    assert ev.score_intervals({gpu: [(first, 1400.0)]}, events, kind, rec, 0.0, 2000.0)["recall"] > 0
    assert ev.score_intervals({gpu: [(first - 10.0, 1400.0)]}, events, kind, rec, 0.0, 2000.0)["recall"] == 0
