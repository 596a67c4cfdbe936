"""What ``foreshock train`` takes as input and what the sklearn baseline is served: labels that do not
depend on the recording's meta, training recordings fed alike and given once, the telemetry told by
where the inlet came from (not by which entity kinds were recorded), and an alarm threshold that is a
probability."""

from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.detectors import baselines as bl
from foreshock.detectors import train as tr
from foreshock.recording import Recording

# (recording: test_train's training recording, two failing TIMs over 3 h from t0 = 1.7e9, as a fixture)
from test_train import recording  # noqa: F401
from test_train_telemetry import _drop_racks


def _said(result) -> str:  # type: ignore[no-untyped-def]
    """A CLI's output on one line (rich wraps long messages)."""
    return " ".join(result.output.split())


def _copy(src, dst):  # type: ignore[no-untyped-def]
    shutil.copytree(src, dst)
    return dst


def _rack_fields(folder, keep):  # type: ignore[no-untyped-def]
    """Rewrite the recording's rack frames with ``keep``: a dict of field -> value for every row (the
    simulator's racks report their inlet alone)."""
    table = pq.read_table(folder / "rack.parquet")
    n = table.num_rows
    columns = {"ts": table.column("ts"), "slot": table.column("slot")}
    columns.update({name: pa.array(np.full(n, value)) for name, value in keep.items()})
    pq.write_table(pa.table(columns), folder / "rack.parquet")


def _train(paths, out, *extra):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["train", *map(str, paths), "--out", str(out), "--events", "thermal_throttle",
                                    "--negatives", "0.2", *extra])


@pytest.fixture(scope="module")
def models(recording, tmp_path_factory):  # noqa: F811
    """A model trained on the racks' inlets, and one on GPU telemetry alone (the GPUs' proxy)."""
    folder = tmp_path_factory.mktemp("models")
    out = {}
    for name, extra in (("full", ()), ("gpu", ("--telemetry", "gpu,job"))):
        result = _train([recording], folder / f"{name}.skops", *extra)
        assert result.exit_code == 0, result.output
        out[name] = folder / f"{name}.skops"
    return out


@pytest.fixture(scope="module")
def pdu_only(recording, tmp_path_factory):  # noqa: F811
    """The recording with racks that report their PDU power and no inlet or coolant temperature."""
    folder = _copy(recording, tmp_path_factory.mktemp("pdu") / "rec")
    _rack_fields(folder, {"pdu_power": 30_000.0})
    return folder


# ---- 1: labels without the recording's meta ------------------------------------------------------
def test_labels_are_those_of_the_times_themselves_at_epoch_times():
    """Episodes of several slots at epoch times (1.7e9 s), indexed with no start to count from (t0 = 0,
    what a recording without recording.json gave): each sample is labelled by its own slot's episodes.
    (The shared key slot * 1e9 + t had moved them into another slot's range: no positive at all.)"""
    t = 1.7e9
    index = tr.EpisodeIndex.build([(0, t + 1000.0, t + 1100.0), (2, t + 500.0, t + 600.0),
                                   (3, t + 2000.0, t + 2100.0)], 0.0)
    ts = np.array([t + 800.0, t + 1050.0, t + 1200.0, t + 300.0, t + 550.0, t + 400.0, t + 1900.0])
    slot = np.array([0, 0, 0, 2, 2, 1, 3])
    got = tr.label_rows(ts, slot, index, 300.0)
    # slot 0: its episode starts 200 s ahead (1), is under way (NaN), is over (0); slot 2: 200 s
    # ahead (1), under way (NaN); slot 1 has none (0); slot 3: 100 s ahead (1)
    np.testing.assert_array_equal(got, [1.0, np.nan, 0.0, 1.0, np.nan, 0.0, 1.0])


def test_a_recording_without_its_meta_is_labelled_as_with_it(recording, tmp_path):  # noqa: F811
    """A folder without recording.json is read from its parts (no ``start`` in its meta): its samples
    get the same labels, with the positives of the two failing TIMs."""
    bare = _copy(recording, tmp_path / "nometa")
    (bare / "recording.json").unlink()
    assert Recording.open(bare).meta.get("start") is None
    events = ["thermal_throttle", "power_cap"]
    with_meta = tr.build_dataset([recording], events, negative_fraction=1.0)
    without = tr.build_dataset([bare], events, negative_fraction=1.0)
    positives = np.nansum(with_meta.labels["thermal_throttle"])
    assert positives > 0  # (GPUs 3 and 12 throttle: their samples before it are positive)
    for e in events:
        np.testing.assert_array_equal(without.labels[e], with_meta.labels[e])


# ---- 2: training recordings fed different telemetry -----------------------------------------------
def test_training_recordings_fed_different_telemetry_are_refused(recording, tmp_path):  # noqa: F811
    """One recording with rack inlets, one without: half the model's inlet features would be the
    racks', half the GPUs' proxy, and the model said ["gpu", "rack"]. Refused as calibrate refuses."""
    bare = _copy(recording, tmp_path / "bare")
    _drop_racks(bare)
    result = _train([recording, bare], tmp_path / "m.skops")
    assert result.exit_code == 1 and re.search(r"^Error: training recording .*bare feeds gpu telemetry .* fed gpu, "
                                               r"rack: train on recordings fed alike$", _said(result)), result.output
    assert not (tmp_path / "m.skops").exists()
    with pytest.raises(ValueError, match="fed alike"):
        tr.build_dataset([bare, recording], ["thermal_throttle"])
    # both fed GPU telemetry alone: alike
    data = tr.build_dataset([recording, bare], ["thermal_throttle"], negative_fraction=0.2, telemetry=["gpu", "job"])
    assert data.telemetry == ["gpu"]


# ---- 3: the telemetry told by where the inlet came from --------------------------------------------
def test_racks_without_an_inlet_feed_what_gpu_telemetry_alone_feeds(recording, pdu_only, tmp_path):  # noqa: F811
    """Rack frames of PDU power alone give no inlet: the GPUs' inlets come from their proxy, as with no
    rack frames; a rack's coolant temperature is an inlet (the stream takes it where inlet_temp lacks)."""
    assert tr.fed_kinds(Recording.open(recording)) == ("gpu", "rack")
    assert tr.fed_kinds(Recording.open(pdu_only)) == ("gpu",)
    coolant = _copy(recording, tmp_path / "coolant")
    _rack_fields(coolant, {"coolant_temp": 24.0, "pdu_power": 30_000.0})
    assert tr.fed_kinds(Recording.open(coolant)) == ("gpu", "rack")
    dark = _copy(recording, tmp_path / "dark")  # inlet sensors that never read (NaN, or the BMC's 0)
    _rack_fields(dark, {"inlet_temp": np.nan, "coolant_temp": 0.0})
    assert tr.fed_kinds(Recording.open(dark)) == ("gpu",)


def test_a_model_of_rack_inlets_is_refused_racks_without_one(models, recording, pdu_only, tmp_path):  # noqa: F811
    run = ["evaluate", str(pdu_only), "--detectors", "sklearn", "--no-plots"]
    refused = CliRunner().invoke(cli, run + ["--model", str(models["full"]), "--report", str(tmp_path / "a")])
    assert refused.exit_code == 1, refused.output
    assert re.search(r"trained on GPU and rack telemetry .* this run feeds GPU telemetry alone \(inlets from the "
                     r"GPUs' proxy; its rack frames give no inlet or coolant temperature\)", _said(refused))
    assert not (tmp_path / "a").exists()
    # the model of the GPUs' proxy is what those racks serve (it was refused there as "rack")
    served = CliRunner().invoke(cli, run + ["--model", str(models["gpu"]), "--report", str(tmp_path / "b")])
    assert served.exit_code == 0, served.output


def test_a_model_trained_on_racks_without_inlets_says_gpu_telemetry(pdu_only):
    """Trained where the racks gave no inlet, the model records GPU telemetry alone: what it learnt
    were the proxy's inlets (it had said ["gpu", "rack"], and was served the racks' inlets)."""
    data = tr.build_dataset([pdu_only], ["thermal_throttle"], negative_fraction=0.2)
    assert data.telemetry == ["gpu"]


def test_a_run_fed_no_gpu_telemetry_is_told_so(models, recording, tmp_path):  # noqa: F811
    """``--telemetry rack,job``: the features read no GPU; the refusal said "this run feeds GPU and
    rack telemetry", the very telemetry the model was trained on."""
    result = CliRunner().invoke(cli, ["evaluate", str(recording), "--detectors", "sklearn", "--no-plots", "--model",
                                      str(models["full"]), "--report", str(tmp_path / "ev"), "--telemetry", "rack,job"])
    assert result.exit_code == 1
    said = _said(result)
    assert "trained on GPU and rack telemetry" in said and "this run feeds no GPU telemetry" in said, said
    assert "this run feeds GPU and rack" not in said


def test_the_mismatch_says_each_side():
    full, gpu = ("gpu", "rack"), ("gpu",)
    assert bl.telemetry_mismatch("m", full, ["rack", "gpu"]) is None
    assert "feeds GPU telemetry alone (inlets from the GPUs' proxy)" in bl.telemetry_mismatch("m", full, gpu)
    assert "feeds GPU and rack telemetry" in bl.telemetry_mismatch("m", gpu, full)
    assert "feeds no GPU telemetry" in bl.telemetry_mismatch("m", gpu, ())


# ---- 4: an alarm threshold given by --param --------------------------------------------------------
@pytest.mark.parametrize("threshold", [math.nan, 1.5, 1.0, 0.0, -0.2, math.inf, "high"])
def test_a_threshold_that_is_not_a_probability_is_refused(models, recording, threshold):  # noqa: F811
    """The loader refuses a file's threshold outside (0, 1); one given as a parameter had been taken:
    NaN or 1.5 never alarm, silently (0 alarms on every sample)."""
    topo = Recording.open(recording).topology
    with pytest.raises(ValueError, match="not a probability strictly between 0 and 1"):
        bl.SklearnDetector(topo, model_path=str(models["full"]), threshold=threshold)


def test_a_threshold_given_to_evaluate_is_checked_before_the_run(models, recording, tmp_path):  # noqa: F811
    run = ["evaluate", str(recording), "--detectors", "sklearn", "--no-plots", "--model", str(models["full"])]
    bad = CliRunner().invoke(cli, run + ["--report", str(tmp_path / "a"), "--param", "sklearn.threshold=nan"])
    assert bad.exit_code == 2 and "threshold nan is not a probability strictly between 0 and 1" in _said(bad)
    assert not (tmp_path / "a").exists()
    good = CliRunner().invoke(cli, run + ["--report", str(tmp_path / "b"), "--param", "sklearn.threshold=0.5"])
    assert good.exit_code == 0, good.output
    topo = Recording.open(recording).topology
    assert bl.SklearnDetector(topo, model_path=str(models["full"]), threshold=0.5).levels.tolist() == [0.5]


# ---- 5: one recording given twice --------------------------------------------------------------------
def test_a_training_recording_given_twice_is_refused(recording, tmp_path):  # noqa: F811
    """Given twice, its GPUs were two groups each: the same GPU on both sides of the held-out split
    that chooses the threshold (which then graded the model on its own training data)."""
    link = tmp_path / "link"
    link.symlink_to(recording, target_is_directory=True)
    for again in (recording, f"{recording}/", link):
        result = _train([recording, again], tmp_path / "m.skops")
        assert result.exit_code == 1 and re.search(r"^Error: training recording .* is given twice", _said(result)), \
            result.output
        assert not (tmp_path / "m.skops").exists()
    with pytest.raises(ValueError, match="given twice"):
        tr.build_dataset([recording, recording], ["thermal_throttle"])
