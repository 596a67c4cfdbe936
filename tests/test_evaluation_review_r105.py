"""Review r105: inputs ``evaluate`` and ``train`` met badly — a model file of another scikit-learn or
of a link's event, ground truth naming entities the topology lacks or missing, an empty recording,
and a fault's power cap merged into the fault-free one just before it."""

from __future__ import annotations

import json
import logging
import math
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors import baselines as bl
from foreshock.detectors import evaluation as ev
from foreshock.detectors import train as tr
from foreshock.events import Event
from foreshock.recording import Recording, RecordingWriter

from thermal_synth import Fault, World, small_topology, write_recording

UNKNOWN_GPU_EVENTS = [  # a GPU, a node and a rack of a bigger cluster than the recording's
    {"time_after_start": 900.0, "type": "power_cap_start", "entity_kind": "gpu", "entity": "node99/gpu0"},
    {"time_after_start": 950.0, "type": "power_cap_end", "entity_kind": "gpu", "entity": "node99/gpu0"},
    {"time_after_start": 2000.0, "type": "thermal_throttle_start", "entity_kind": "gpu", "entity": "node99/gpu1"},
    {"time_after_start": 2100.0, "type": "fault_onset", "entity_kind": "node", "entity": "node99",
     "fault_type": "fan_failure", "fault_id": "f9"},
    {"time_after_start": 2200.0, "type": "fault_onset", "entity_kind": "loop", "entity": "cdu99",
     "fault_type": "cooling_loss", "fault_id": "f8"},
]


# ---- model files (R1, R3) ------------------------------------------------------------------------
def _classifier() -> Any:
    from sklearn.ensemble import HistGradientBoostingClassifier

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, len(bl.FEATURES)))
    return HistGradientBoostingClassifier(max_iter=3).fit(x, (x[:, 0] > 0).astype(int))


def _save(path: Path, event: str = "thermal_throttle", meta: dict[str, Any] | None = None) -> Path:
    return bl.save_model(path, {event: {"model": _classifier(), "horizon_s": 1800.0, "threshold": 0.5}}, meta)


def _with_estimator_version(src: Path, out: Path, version: str) -> Path:
    """``src`` with every estimator's stored ``_sklearn_version`` set to ``version`` (what a file
    written by that scikit-learn holds), its meta left as it is."""
    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("_sklearn_version"), dict):
                node["_sklearn_version"]["content"] = json.dumps(version)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename == "schema.json":
                schema = json.loads(data)
                walk(schema)
                data = json.dumps(schema).encode()
            zout.writestr(info.filename, data)
    return out


def test_a_model_whose_meta_names_another_scikit_learn_is_refused(tmp_path: Path) -> None:
    import sklearn

    other = "1.2.0" if sklearn.__version__ != "1.2.0" else "1.3.0"
    path = _save(tmp_path / "old.skops", meta={"sklearn": other})
    with pytest.raises(bl.ModelFileError, match=f"trained with scikit-learn {other}, this is "
                                                f"{sklearn.__version__}; retrain with `foreshock train`"):
        bl.load_model(path)
    # the same file as this scikit-learn writes it loads
    assert list(bl.load_model(_save(tmp_path / "now.skops", meta={"sklearn": sklearn.__version__}))["events"]) \
        == ["thermal_throttle"]


@pytest.mark.parametrize("meta_says_this_version", [False, True], ids=["no-meta-version", "meta-says-this-one"])
def test_classifiers_of_another_scikit_learn_are_refused_whatever_the_meta_says(tmp_path: Path,
                                                                                 meta_says_this_version: bool) -> None:
    """The estimators' own stored version: scikit-learn only warned (InconsistentVersionWarning) and the
    model was used."""
    import sklearn

    meta = {"sklearn": sklearn.__version__} if meta_says_this_version else None
    path = _with_estimator_version(_save(tmp_path / "m.skops", meta=meta), tmp_path / "foreign.skops", "1.2.0")
    with pytest.raises(bl.ModelFileError, match=f"trained with scikit-learn 1.2.0, this is {sklearn.__version__}"):
        bl.load_model(path)


def test_a_model_of_a_link_event_is_refused(tmp_path: Path) -> None:
    """The classifiers read GPU features: a link_down entry (an event kind evaluate scores, of links)
    was loaded, and its "predictions" named GPU slots as links."""
    with pytest.raises(bl.ModelFileError, match="'link_down', an event of a link, not a GPU's"):
        bl.load_model(_save(tmp_path / "link.skops", event="link_down"))
    assert "link_down" in ev.EVENT_KINDS and "link_down" not in bl.learnable_events()
    assert set(bl.learnable_events()) == {k for k, kind in ev.EVENT_KINDS.items() if kind.entity_kind == "gpu"}


def test_train_refuses_a_link_event_before_reading_anything(tmp_path: Path) -> None:
    """``train --events link_down`` ended in a KeyError (labels looked the link up among the GPUs)."""
    from foreshock.cli.main import cli

    not_a_recording = tmp_path / "rec"
    not_a_recording.mkdir()  # (read, it would be refused: the usage error comes first)
    result = CliRunner().invoke(cli, ["train", str(not_a_recording), "--out", str(tmp_path / "m.skops"),
                                      "--events", "thermal_throttle,link_down"])
    assert result.exit_code == 2, result.output
    assert "cannot learn link_down" in result.output and "not a GPU's event" in result.output
    assert not (tmp_path / "m.skops").exists()
    with pytest.raises(ValueError, match="cannot learn events \\['link_down'\\]"):
        tr.train_and_save([not_a_recording], tmp_path / "m.skops", ["link_down"])
    helped = CliRunner().invoke(cli, ["train", "--help"], terminal_width=200)
    events_help = " ".join(helped.output.split("--events", 1)[1].split("--negatives", 1)[0].split())
    assert all(k in events_help for k in bl.learnable_events()) and "link_down" not in events_help


# ---- ground truth naming entities the topology lacks (R2), or none (R6) ---------------------------------
@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> tuple[Path, Path]:
    """A throttling recording, and a copy whose events.jsonl also names entities its topology lacks."""
    root = tmp_path_factory.mktemp("r105")
    world = World(small_topology(nodes=2, gpus=8, racks=1), seed=11, interval=20.0,
                  faults=[Fault("tim_degradation", 3, 1200, 1.5, "f1")])
    clean = root / "clean"
    write_recording(clean, world, 2 * 3600)
    polluted = root / "polluted"
    shutil.copytree(clean, polluted)
    start = float(Recording.open(clean).meta["start"])
    with open(polluted / "events.jsonl", "a", encoding="utf-8") as fh:
        for e in UNKNOWN_GPU_EVENTS:
            fields = {k: v for k, v in e.items() if k != "time_after_start"}
            fh.write(json.dumps({"time": start + e["time_after_start"], **fields}) + "\n")
    return clean, polluted


def _metrics(report: dict[str, Any]) -> dict[str, Any]:
    return {k: {m: v[m] for m in ev.METRICS} for k, v in report["detectors"]["threshold"].items()}


def test_events_of_unknown_entities_are_set_aside_counted_and_logged(recordings, caplog) -> None:
    """evaluate ended in ``KeyError: "unknown gpu 'node99/gpu0'"`` (the episode table's onset
    classes; the plots' GPU pick); scored, such an episode is one no detector could predict."""
    clean, polluted = recordings
    rec = Recording.open(polluted)
    with caplog.at_level(logging.WARNING, logger="foreshock.evaluation"):
        result = ev.run_recording(rec, ["threshold"], trace_gpus=ev.pick_trace_gpus(rec))
    report = ev.score(result)
    assert report["meta"]["events_unknown_entity"] == len(UNKNOWN_GPU_EVENTS)
    assert report["meta"]["ground_truth"] is True
    warned = [r.getMessage() for r in caplog.records if "topology lacks" in r.getMessage()]
    assert len(warned) == 1 and "'node99/gpu0'" in warned[0] and f"{len(UNKNOWN_GPU_EVENTS)} ground-truth" in warned[0]
    # scored as the recording without them
    baseline = ev.score(ev.run_recording(Recording.open(clean), ["threshold"]))
    assert baseline["meta"]["events_unknown_entity"] == 0
    assert _metrics(report) == _metrics(baseline)
    assert report["detectors"]["threshold"]["thermal_throttle"]["episodes"] > 0  # (a test of something)


def test_training_sets_events_of_unknown_entities_aside(recordings) -> None:
    """train ended in the same KeyError (labels looked each episode's GPU up)."""
    clean, polluted = recordings
    got = tr.build_dataset([polluted], ["thermal_throttle", "power_cap"], negative_fraction=0.5, seed=3)
    want = tr.build_dataset([clean], ["thermal_throttle", "power_cap"], negative_fraction=0.5, seed=3)
    assert got.events_unknown_entity == len(UNKNOWN_GPU_EVENTS) and want.events_unknown_entity == 0
    np.testing.assert_array_equal(got.features, want.features)
    for event in ("thermal_throttle", "power_cap"):
        np.testing.assert_array_equal(got.labels[event], want.labels[event])
    assert np.nansum(got.labels["thermal_throttle"]) > 0


def test_evaluate_runs_on_events_of_unknown_entities(recordings, tmp_path: Path) -> None:
    from foreshock.cli import evaluate

    _, polluted = recordings
    for plots in ("--plots", "--no-plots"):  # (the plots picked their GPUs from the events)
        result = CliRunner().invoke(evaluate.command, [str(polluted), "--detectors", "threshold", plots,
                                                       "--report", str(tmp_path / plots)])
        assert result.exit_code == 0, result.output
        meta = json.loads((tmp_path / plots / "report.json").read_text())["meta"]
        assert meta["events_unknown_entity"] == len(UNKNOWN_GPU_EVENTS)


def test_a_recording_without_ground_truth_is_scored_and_said_so(recordings, tmp_path: Path, caplog) -> None:
    """Real captures have no events.jsonl: evaluated, every alarm a false one — said nowhere."""
    clean, _ = recordings
    bare = tmp_path / "bare"
    shutil.copytree(clean, bare)
    (bare / "events.jsonl").unlink()
    with caplog.at_level(logging.WARNING, logger="foreshock.evaluation"):
        report = ev.score(ev.run_recording(Recording.open(bare), ["threshold"]))
    assert report["meta"]["ground_truth"] is False
    assert any("no ground truth" in r.getMessage() and str(bare) in r.getMessage() for r in caplog.records)
    assert all(m["episodes"] == 0 for m in report["detectors"]["threshold"].values())
    # an events file with nothing in it is ground truth: nothing happened
    (bare / "events.jsonl").write_text("")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="foreshock.evaluation"):
        report = ev.score(ev.run_recording(Recording.open(bare), ["threshold"]))
    assert report["meta"]["ground_truth"] is True and not caplog.records
    from foreshock.cli import evaluate  # and evaluate still scores it (exit 0)

    (bare / "events.jsonl").unlink()
    result = CliRunner().invoke(evaluate.command, [str(bare), "--detectors", "threshold", "--no-plots",
                                                   "--report", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "report" / "report.json").read_text())["meta"]["ground_truth"] is False


# ---- an empty recording (R4) ----------------------------------------------------------------------
def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@settings(max_examples=30, deadline=None)
@given(st.recursive(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.none(),
                              st.text(max_size=3)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                    max_leaves=12))
def test_the_report_is_strict_json_with_non_finite_numbers_as_null(tmp_path_factory, value: Any) -> None:
    out = tmp_path_factory.mktemp("rep")
    path = ev.write_report({"value": value}, out)
    got = _strict_json(path.read_text())["value"]

    def same(a: Any, b: Any) -> bool:  # b read back: non-finite floats became None, tuples lists
        if isinstance(a, float) and not math.isfinite(a):
            return b is None
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return bool(a == b)

    assert same(value, got)


def test_a_report_of_no_samples_is_strict_json(small_topology, tmp_path: Path) -> None:
    """A recorder killed before its first part leaves start and end null: ``simulated_hours: NaN``."""
    RecordingWriter(tmp_path / "rec", small_topology, {"interval": 5.0}, segment_s=600)  # never closed
    rec = Recording.open(tmp_path / "rec")
    result = ev.run_recording(rec, ["threshold"])
    assert result.samples == 0 and result.duration_s == 0.0
    report = _strict_json(ev.write_report(ev.score(result), tmp_path / "report").read_text())
    assert report["meta"]["simulated_hours"] == 0.0


def test_evaluate_refuses_a_recording_with_no_samples(small_topology, tmp_path: Path) -> None:
    """It exited 0 with a report of nothing (and a NaN in it): read as "evaluated, predicted nothing"."""
    from foreshock.cli import evaluate

    RecordingWriter(tmp_path / "rec", small_topology, {"interval": 5.0}, segment_s=600)  # never closed
    result = CliRunner().invoke(evaluate.command, [str(tmp_path / "rec"), "--detectors", "foreshock,threshold",
                                                   "--no-plots", "--report", str(tmp_path / "report")])
    assert result.exit_code == 1, result.output
    assert "nothing to evaluate" in result.output and "holds no samples" in result.output
    assert not (tmp_path / "report" / "report.json").exists()


# ---- a fault's episode within the merge gap of a fault-free one (R5) -----------------------------------
def _cap(t: float, start: bool, fault_id: str = "", entity: str = "node0/gpu0") -> Event:
    return Event(t, "power_cap_start" if start else "power_cap_end", "gpu", entity, fault_id,
                 "psu_failure" if fault_id else "")


def test_a_faults_power_cap_right_after_a_fault_free_one_is_an_episode_of_its_own() -> None:
    """/tmp/r105/merge_fault.py: capped under load from the start, released at +1260 s, capped again
    by a failed PSU at +1350 s (90 s later, within the 120 s merge gap): one episode from +5 s,
    fault-free and inside the warm-up — the PSU's cap was scored nowhere."""
    kind = ev.EVENT_KINDS["power_cap"]
    eps = ev.episodes([_cap(5, True), _cap(1260, False), _cap(1350, True, "f3"), _cap(3595, False, "f3")], kind)
    assert [(e.start, e.end, e.fault_type) for e in eps] == [(5, 1260, "none"), (1350, 3595, "psu_failure")]
    # a fault-free start within the gap still continues the fault's episode, and one of the same fault too
    eps = ev.episodes([_cap(0, True, "f3"), _cap(100, False, "f3"), _cap(150, True), _cap(200, False),
                       _cap(250, True, "f3"), _cap(300, False, "f3")], kind)
    assert [(e.start, e.end, e.fault_type) for e in eps] == [(0, 300, "psu_failure")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 400), st.integers(1, 300), st.sampled_from(["", "", "f1", "f2"])),
                min_size=1, max_size=12))
def test_every_faults_first_start_begins_an_episode(steps) -> None:
    """Each fault's first start (that of a fault other than the episode before it) begins an episode
    of that fault; starts within the merge gap naming no other fault still merge."""
    kind = ev.EVENT_KINDS["power_cap"]
    events, t = [], 0.0
    for gap, length, fault in steps:
        t += gap
        events += [_cap(t, True, fault), _cap(t + length, False, fault)]
        t += length
    eps = ev.episodes(events, kind)
    starts = [e for e in events if e.type == "power_cap_start"]
    for prev, nxt in zip(starts, starts[1:]):
        # the start the episode before it began with
        opened = max((e for e in eps if e.start <= prev.time), key=lambda e: e.start)
        begins = any(e.start == nxt.time for e in eps)
        gap = nxt.time - next(e.time for e in events if e.type == "power_cap_end" and e.time > prev.time)
        if nxt.fault_id and nxt.fault_id != opened.fault_id:
            assert begins and next(e for e in eps if e.start == nxt.time).fault_id == nxt.fault_id
        else:
            assert begins == (gap > kind.merge_gap_s)
    # episodes of one entity never overlap, and cover every start
    assert all(a.end <= b.start for a, b in zip(eps, eps[1:]))
    assert all(any(e.start <= s.time <= e.end for e in eps) for s in starts)
