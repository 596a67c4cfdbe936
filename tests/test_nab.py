"""The NAB scorer against hand-computed cases, a literal transcription of NAB's threshold sweep,
and the real realKnownCause files; and ``foreshock nab`` end to end."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foreshock.detectors.nab import (OUTSIDE, PROBATION, PROFILES, NabScorer, NabSeries, load_corpus,
                                     load_labels, load_series, probation_length, scaled_sigmoid, sweep_rows)
from foreshock.health import PipelineHealth


def S(position: float) -> float:
    """NAB's scaled sigmoid written out by hand: 2 * sigmoid(-5 x) - 1, -1 from 3 on."""
    return -1.0 if position >= 3.0 else 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


def toy(n: int = 60, windows: tuple[tuple[int, int], ...] = ((30, 33),)) -> NabSeries:
    """60 one-minute rows, probation rows 0-8, one window of 4 rows (30-33). Long enough before
    the window that detecting everything costs more than detecting nothing, so the null
    detector (constant 0.5, optimised) scores -A_FN, as on the real corpus."""
    ts = (np.datetime64("2020-01-01T00:00") + np.arange(n) * np.timedelta64(1, "m")).astype("datetime64[ns]")
    return NabSeries("toy.csv", ts, np.zeros(n), [(ts[a], ts[b]) for a, b in windows])


def detect(n: int, rows: dict[int, float]) -> np.ndarray:
    s = np.zeros(n)
    for i, v in rows.items():
        s[i] = v
    return s


# --- the pieces -------------------------------------------------------------------------------

def test_scaled_sigmoid_matches_the_published_anchor_values() -> None:
    # NAB's docstring: -1 -> 0.98661 (window start), -0.5 -> 0.84828, 0 -> 0 (window end),
    # 1 -> -0.98661, and -1 beyond 3.
    assert scaled_sigmoid(-1.0) == pytest.approx(0.98661, abs=1e-5)
    assert scaled_sigmoid(-0.5) == pytest.approx(0.84828, abs=1e-5)
    assert scaled_sigmoid(0.0) == 0.0
    assert scaled_sigmoid(1.0) == pytest.approx(-0.98661, abs=1e-5)
    assert scaled_sigmoid(3.5) == -1.0


def test_probation_is_15_percent_capped_at_750_rows() -> None:
    assert probation_length(20) == 3           # floor(0.15 * 20)
    assert probation_length(4032) == 604       # floor(604.8): the EC2 file
    assert probation_length(22695) == 750      # 0.15 * 5000


def test_profiles_are_nabs() -> None:
    got = {k: (p.tp_weight, p.fp_weight, p.fn_weight) for k, p in PROFILES.items()}
    assert got == {"standard": (1.0, 0.11, 1.0), "reward_low_FP": (1.0, 0.22, 1.0),
                   "reward_low_FN": (1.0, 0.11, 2.0)}


def test_sweep_rows_by_hand() -> None:
    sweep, wid = sweep_rows(toy(), PROFILES["standard"])
    assert list(wid[:9]) == [PROBATION] * 9              # floor(0.15 * 60)
    assert list(wid[9:30]) == [OUTSIDE] * 21 and list(wid[30:34]) == [0] * 4 and list(wid[34:]) == [OUTSIDE] * 26
    # inside: row i of window [30, 33] sits at -(33 - i + 1) / 4, divided by S(-1)
    for i, pos in ((30, -1.0), (31, -0.75), (32, -0.5), (33, -0.25)):
        assert sweep[i] == pytest.approx(S(pos) / S(-1.0))
    # before any window: -A_FP; after: S(|33 - i| / (4 - 1)) * A_FP
    assert sweep[25] == pytest.approx(-0.11)
    assert sweep[35] == pytest.approx(0.11 * S(2 / 3))
    assert sweep[39] == pytest.approx(0.11 * S(6 / 3))


# --- whole scores, by hand --------------------------------------------------------------------

def test_detection_at_the_window_start_is_perfect_and_nothing_is_null() -> None:
    scorer = NabScorer([toy()])
    r = scorer.score({"toy.csv": detect(60, {30: 1.0})})["standard"]
    assert (r.raw, r.null, r.perfect) == (pytest.approx(1.0), -1.0, 1.0)
    assert r.normalized == pytest.approx(100.0)
    assert scorer.score({"toy.csv": np.zeros(60)})["standard"].normalized == pytest.approx(0.0)


def test_late_detection_plus_a_false_positive_by_hand() -> None:
    scorer = NabScorer([toy()])
    res = scorer.score({"toy.csv": detect(60, {32: 0.9, 25: 0.9})})
    tp = S(-0.5) / S(-1.0)                        # 0.848284 / 0.986614 = 0.859789
    assert res["standard"].raw == pytest.approx(tp - 0.11)
    assert res["standard"].normalized == pytest.approx(100 * (tp - 0.11 + 1) / 2)       # 87.49
    assert res["reward_low_FP"].raw == pytest.approx(tp - 0.22)
    # low FN: null = -2 (one window missed at A_FN = 2), perfect = 1
    assert res["reward_low_FN"].normalized == pytest.approx(100 * (tp - 0.11 + 2) / 3)
    assert res["standard"].normalized == pytest.approx(87.4894, abs=1e-3)


def test_probation_detections_are_ignored_and_fps_after_a_window_cost_less() -> None:
    scorer = NabScorer([toy()])
    # row 1 is in probation: not an FP. Row 35 follows the window: costs 0.11 * S(2/3).
    res = scorer.score({"toy.csv": detect(60, {1: 1.0, 30: 1.0, 35: 1.0})})["standard"]
    assert res.raw == pytest.approx(1.0 + 0.11 * S(2 / 3))          # 1 - 0.10242
    assert res.false_positives == 1 and res.windows_hit == 1


def test_threshold_optimisation_picks_the_best_cut_by_hand() -> None:
    scorer = NabScorer([toy()])
    scores = detect(60, {24: 0.95, 31: 0.9, 27: 0.6})
    curve = scorer.curve({"toy.csv": scores}, "standard")
    tp = S(-0.75) / S(-1.0)
    assert list(curve.thresholds) == [1.1, 0.95, 0.9, 0.6, 0.0]
    assert curve.scores[:4] == pytest.approx([-1.0, -1.11, tp - 0.11, tp - 0.22])
    res = scorer.score({"toy.csv": scores})["standard"]
    assert res.threshold == 0.9 and res.raw == pytest.approx(tp - 0.11)
    # a given threshold is honoured: 0.95 detects only the FP
    fixed = scorer.score({"toy.csv": scores}, thresholds={"standard": 0.95})["standard"]
    assert fixed.raw == pytest.approx(-1.11)


def test_only_the_earliest_detection_in_a_window_counts() -> None:
    scorer = NabScorer([toy()])
    one = scorer.score({"toy.csv": detect(60, {31: 1.0})})["standard"].raw
    many = scorer.score({"toy.csv": detect(60, {31: 1.0, 32: 1.0, 33: 1.0})})["standard"].raw
    assert one == pytest.approx(many) == pytest.approx(S(-0.75) / S(-1.0))


def test_two_files_share_one_threshold_and_sum() -> None:
    a, b = toy(), toy(80, ((50, 55),))
    b.name = "other.csv"
    scorer = NabScorer([a, b])
    res = scorer.score({"toy.csv": detect(60, {30: 0.7}), "other.csv": detect(80, {50: 0.8, 20: 0.75})})["standard"]
    # cut at 0.7: both windows at their first row (1 + 1), one FP before any window (-0.11)
    assert res.threshold == 0.7 and res.raw == pytest.approx(2.0 - 0.11)
    assert res.normalized == pytest.approx(100 * (2 - 0.11 + 2) / 4)


def test_scores_outside_unit_interval_are_rejected() -> None:
    scorer = NabScorer([toy()])
    with pytest.raises(ValueError, match="within"):
        scorer.score({"toy.csv": np.full(60, 1.5)})
    with pytest.raises(ValueError, match="within"):
        scorer.score({"toy.csv": np.full(60, np.nan)})
    with pytest.raises(ValueError, match="no anomaly scores"):
        scorer.score({})


# --- quirks -----------------------------------------------------------------------------------

def test_quirky_timestamps_are_counted_and_windows_use_the_first_matching_row(tmp_path) -> None:
    rows = ["2020-01-01 00:00:00", "2020-01-01 00:05:00", "2020-01-01 00:05:00", "2020-01-01 00:10:00",
            "2020-01-01 00:04:00", "2020-01-01 00:15:00", "2020-01-01 00:20:00", "2020-01-01 00:25:00"]
    path = tmp_path / "q.csv"
    path.write_text("timestamp,value\n" + "".join(f"{t},{i}\n" for i, t in enumerate(rows)) + "2020-01-01 00:30:00,oops\n")
    health = PipelineHealth()
    s = load_series(path, [(np.datetime64("2020-01-01T00:05"), np.datetime64("2020-01-01T00:15"))], health)
    assert health.problems[("nab", "timestamp_duplicate")] == 1
    assert health.problems[("nab", "timestamp_backwards")] == 1
    assert health.problems[("nab", "bad_value")] == 1 and np.isnan(s.values[-1])
    _, wid = sweep_rows(s, PROFILES["standard"], probation_percent=0.0)
    # opens at the first 00:05 (row 1), right edge = first 00:15 (row 5)
    assert list(wid) == [OUTSIDE, 0, 0, 0, 0, 0, OUTSIDE, OUTSIDE, OUTSIDE]


def test_labels_accept_both_layouts(tmp_path) -> None:
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"windows": {"x/f.csv": [["2020-01-01 00:00:00.000000", "2020-01-02 00:00:00"]]}}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"x/f.csv": [["2020-01-01 00:00:00", "2020-01-02 00:00:00"]]}))
    assert load_labels(a) == load_labels(b) == {"x/f.csv": [(np.datetime64("2020-01-01T00:00", "ns"),
                                                          np.datetime64("2020-01-02T00:00", "ns"))]}
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"f.csv": [["2020-01-02 00:00:00", "2020-01-01 00:00:00"]]}))
    with pytest.raises(ValueError, match="ends before"):
        load_labels(bad)


# --- against a literal transcription of NAB's sweep --------------------------------------------

def nab_reference_best(anomaly_lists: list[list[tuple[float, float, str | None]]], fn_weight: float) -> tuple[float, float]:
    """NAB's Sweeper.calcScoreByThreshold + optimizer, line by line: rows are (anomaly score,
    sweep score, window name or None), probation rows already dropped."""
    rows = sorted([r for rows in anomaly_lists for r in rows], key=lambda r: r[0], reverse=True)
    parts: dict[str | None, float] = {"fp": 0.0}
    for _, _, name in rows:
        if name is not None:
            parts[name] = -fn_weight
    out = []
    threshold = 1.1
    for score, sweep, name in rows:
        if score != threshold:
            out.append((threshold, sum(parts.values())))
            threshold = score
        if name is None:
            parts["fp"] += sweep
        else:
            parts[name] = max(parts[name], sweep)
    out.append((threshold, sum(parts.values())))
    best = sorted(out, key=lambda r: r[1], reverse=True)[0]
    return best


@pytest.fixture(scope="module")
def corpus(shared_data):
    nab = shared_data / "nab"
    return load_corpus(nab / "realKnownCause", nab / "labels.json", PipelineHealth())


def test_threshold_sweep_matches_nabs_loop_on_the_real_corpus(corpus) -> None:
    rng = np.random.default_rng(11)
    # coarse scores -> many ties, exactly where a sweep can go wrong
    scores = {s.name: np.round(rng.random(len(s.values)) ** 8, 3) for s in corpus}
    scorer = NabScorer(corpus)
    for key, profile in PROFILES.items():
        lists = []
        for s in corpus:
            sweep, wid = scorer.rows[key][s.name]
            lists.append([(float(a), float(b), None if w == OUTSIDE else f"{s.name}|{w}")
                          for a, b, w in zip(scores[s.name], sweep, wid) if w != PROBATION])
        ref_threshold, ref_score = nab_reference_best(lists, profile.fn_weight)
        got = scorer.score(scores)[key]
        assert got.threshold == ref_threshold
        assert got.raw == pytest.approx(ref_score, abs=1e-9)


def test_real_corpus_windows_null_and_perfect(corpus) -> None:
    assert [len(s.windows) for s in corpus] == [2, 1, 3, 4, 5, 2, 2]
    scorer = NabScorer(corpus)
    perfect = {}
    for s in corpus:
        _, wid = scorer.rows["standard"][s.name]
        first = np.r_[True, wid[1:] != wid[:-1]] & (wid >= 0)
        perfect[s.name] = first.astype(float)
    res = scorer.score(perfect)
    assert {k: round(r.normalized or 0.0, 6) for k, r in res.items()} == {k: 100.0 for k in PROFILES}
    null = scorer.score({s.name: np.full(len(s.values), 0.5) for s in corpus})
    assert {k: r.normalized for k, r in null.items()} == {k: 0.0 for k in PROFILES}
    assert res["standard"].null == -19.0 and res["reward_low_FN"].null == -38.0


# --- the command --------------------------------------------------------------------------------

def test_nab_command_scores_realknowncause_and_writes_nab_results(shared_data, tmp_path) -> None:
    from foreshock.cli.main import cli

    nab = shared_data / "nab"
    result = CliRunner().invoke(cli, ["nab", str(nab / "realKnownCause"), str(nab / "labels.json"),
                                      "--results", str(tmp_path)])
    assert result.exit_code == 0, result.output
    last = json.loads(result.output.strip().splitlines()[-1])
    assert set(last) == {"standard", "reward_low_FP", "reward_low_FN"}
    # The target of issue 9: above ARTime's 66.45 on this subset (standard profile).
    assert last["standard"] > 66.5
    assert "timestamp_backwards 1" in result.output and "timestamp_duplicate 11" in result.output
    files = sorted((tmp_path / "foreshock" / "realKnownCause").glob("foreshock_*.csv"))
    assert len(files) == 7
    with open(tmp_path / "foreshock" / "realKnownCause" / "foreshock_nyc_taxi.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["timestamp", "value", "anomaly_score", "label"]
    assert len(rows) == 10321 and rows[1][:2] == ["2014-07-01 00:00:00", "10844.0"]
    assert sum(int(r[3]) for r in rows[1:]) == 1035          # 5 windows of 207 rows
    assert all(0.0 <= float(r[2]) <= 1.0 for r in rows[1:])


def test_nab_command_rejects_a_folder_without_labelled_files(tmp_path) -> None:
    from foreshock.cli.main import cli

    (tmp_path / "x.csv").write_text("timestamp,value\n2020-01-01 00:00:00,1\n")
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"windows": {"y.csv": []}}))
    result = CliRunner().invoke(cli, ["nab", str(tmp_path), str(labels)])
    assert result.exit_code != 0 and "no CSV" in result.output


def test_a_one_row_window_is_rejected_by_name() -> None:
    """NAB weighs a false positive after a window by its width - 1: a window of one row
    (start == end) would divide by zero on the next row outside it."""
    one_row = toy(windows=((30, 30),))
    with pytest.raises(ValueError, match=r"toy.csv: window 2020-01-01T00:30.* spans 1 row\(s\)"):
        sweep_rows(one_row, PROFILES["standard"])


def test_nab_command_reports_a_one_row_window_without_a_traceback(tmp_path) -> None:
    from foreshock.cli.main import cli

    data = tmp_path / "data"
    data.mkdir()
    (data / "toy.csv").write_text("timestamp,value\n" + "".join(f"2020-01-01 {h:02d}:00:00,{h}\n" for h in range(24)))
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"toy.csv": [["2020-01-01 10:00:00", "2020-01-01 10:00:00"]]}))
    result = CliRunner().invoke(cli, ["nab", str(data), str(labels)])
    assert result.exit_code == 1 and result.exception is not None and isinstance(result.exception, SystemExit)
    assert "window 2020-01-01T10:00" in result.output and "at least two rows" in result.output


def test_nab_command_table_shows_every_profile_and_score_in_full_when_piped(tmp_path) -> None:
    """Piped output (a log, CI, ``| tee``) is 80 columns wide for rich: the table must still show
    the profile names and the three scores whole, not cut to ``reward_low_…`` / ``75.…``."""
    from foreshock.cli.main import cli

    data = tmp_path / "data"
    data.mkdir()
    start = np.datetime64("2020-01-01T00:00")
    stamps = [str(start + np.timedelta64(5 * i, "m")).replace("T", " ") + ":00" for i in range(400)]
    values = [10.0 + math.sin(i / 5) + (50.0 if 300 <= i < 305 else 0.0) for i in range(400)]
    (data / "toy.csv").write_text("timestamp,value\n" + "".join(f"{t},{v}\n" for t, v in zip(stamps, values)))
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"windows": {"toy.csv": [[stamps[290], stamps[310]]]}}))
    result = CliRunner().invoke(cli, ["nab", str(data), str(labels)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    last = json.loads(lines[-1])
    table = "\n".join(lines[:-1])
    assert "…" not in table
    for key, value in last.items():
        row = next(line for line in lines[:-1] if f" {key} " in line)
        assert f"{value:.2f}" in row
    # the detection at row 300 of the window [290, 310] (21 rows): S(-11/21) / S(-1), normalised
    tp = S(-11 / 21) / S(-1.0)
    assert last["standard"] == pytest.approx(100 * (tp + 1) / 2, abs=1e-3)


def nab_reference_sweep(stamps: list[int], windows: list[tuple[int, int]], name: str, profile,
                        probation_percent: float = 0.15) -> list[tuple[float, str | None]]:
    """NAB's Sweeper.calcSweepScore line by line (timestamps as ints): per row, the weighted sweep
    score and the window name (None outside, "probationary" in probation)."""
    windows = list(windows)
    max_tp = S(-1.0)
    probation = min(math.floor(probation_percent * len(stamps)), probation_percent * 5000)
    out = []
    cur_limits: tuple[int, int] | None = None
    cur_name: str | None = None
    cur_width, cur_right = 0.0, 0            # read only while a window is open
    prev_width: float | None = None
    prev_right: int | None = None
    for i, t in enumerate(stamps):
        if windows and t == windows[0][0]:
            cur_limits = windows.pop(0)
            cur_name = f"{name}|{cur_limits[0]}"
            cur_right = stamps.index(cur_limits[1])
            cur_width = float(cur_right - stamps.index(cur_limits[0]) + 1)
        if cur_limits is not None:
            weighted = S(-(cur_right - i + 1) / cur_width) * profile.tp_weight / max_tp
        else:
            if prev_right is None or prev_width is None:
                unweighted = -1.0
            else:
                unweighted = S(abs(prev_right - i) / float(prev_width - 1))
            weighted = unweighted * profile.fp_weight
        out.append((weighted, cur_name if i >= probation else "probationary"))
        if cur_limits is not None and t == cur_limits[1]:
            cur_limits = cur_name = None
            prev_width, prev_right = cur_width, cur_right
    return out


@st.composite
def small_corpora(draw):
    """1-3 files of 0-80 rows with 0-3 windows (some of one row), and coarse anomaly scores
    (ties, constants, all-zero files): the cases where a sweep or a window edge goes wrong."""
    files = []
    for k in range(draw(st.integers(1, 3))):
        n = draw(st.integers(0, 80))
        cuts = sorted(draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=6, unique=True))) if n else []
        windows = [(a, b) for a, b in zip(cuts[::2], cuts[1::2]) if b - a >= 1]
        # A one-row window [b, b]: NAB scores it unless a row outside windows follows it.
        windows = [(b, b) if draw(st.integers(0, 4)) == 0 else (a, b) for a, b in windows]
        scores = draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.5, 0.75, 1.0]), min_size=n, max_size=n))
        files.append((f"f{k}.csv", n, windows, np.array(scores, dtype=np.float64)))
    return files


@pytest.mark.kernel
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=small_corpora())
def test_scorer_matches_a_transcription_of_nabs_sweep_and_optimiser(files) -> None:
    start = np.datetime64("2020-01-01T00:00", "ns")
    corpus, scores = [], {}
    lists: dict[str, list[list[tuple[float, float, str | None]]]] = {key: [] for key in PROFILES}
    nab_fails = False
    for name, n, windows, s in files:
        ts = start + np.arange(n) * np.timedelta64(60, "s")
        corpus.append(NabSeries(name, ts, np.zeros(n), [(ts[a], ts[b]) for a, b in windows]))
        scores[name] = s
        stamps = ts.astype(np.int64).tolist()
        for key, profile in PROFILES.items():
            try:
                rows = nab_reference_sweep(stamps, [(stamps[a], stamps[b]) for a, b in windows], name, profile)
            except ZeroDivisionError:        # a one-row window followed by a row outside windows
                nab_fails = True
                break
            lists[key].append([(float(a), sw, w) for a, (sw, w) in zip(s, rows) if w != "probationary"])
    if nab_fails:
        with pytest.raises(ValueError, match="at least two rows"):
            NabScorer(corpus)
        return
    scorer = NabScorer(corpus)
    got = scorer.score(scores)
    for key, profile in PROFILES.items():
        ref_threshold, ref_score = nab_reference_best(lists[key], profile.fn_weight)
        assert got[key].threshold == ref_threshold
        assert got[key].raw == pytest.approx(ref_score, abs=1e-9)


# --- audit fixes --------------------------------------------------------------------------------

def test_scaled_sigmoid_is_exactly_minus_one_at_three() -> None:
    """NAB's scaledSigmoid returns -1.0 for position >= 3.0: an FP 3 * (width - 1) rows after a
    window costs the full A_FP, not S(3) * A_FP = -0.9999994 * A_FP."""
    assert scaled_sigmoid(3.0) == -1.0
    sweep, _ = sweep_rows(toy(), PROFILES["standard"])
    assert sweep[33 + 9] == -0.11                       # 9 = 3 * (4 - 1) rows after the window
    res = NabScorer([toy()]).score({"toy.csv": detect(60, {30: 1.0, 42: 1.0})})["standard"]
    assert res.raw == 1.0 - 0.11


def write_csv(path, n: int) -> list[str]:
    """A NAB CSV of ``n`` five-minute rows; returns its timestamps as NAB labels write them."""
    start = np.datetime64("2020-01-01T00:00")
    stamps = [str(start + np.timedelta64(5 * i, "m")).replace("T", " ") + ":00" for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("timestamp,value\n" + "".join(f"{t},{50 + math.sin(i / 20):.3f}\n" for i, t in enumerate(stamps)))
    return stamps


def test_files_of_the_same_name_in_two_categories_are_two_files(tmp_path) -> None:
    """NAB keys files by <category>/<file>: hostA/gpu_temp.csv and hostB/gpu_temp.csv each keep
    their own windows and scores (they used to collide on the bare name, one scored twice)."""
    for cat in ("hostA", "hostB"):
        stamps = write_csv(tmp_path / "data" / cat / "gpu_temp.csv", 1000)
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"hostA/gpu_temp.csv": [[stamps[300], stamps[349]]],
                                  "hostB/gpu_temp.csv": [[stamps[700], stamps[749]]]}))
    corpus = load_corpus(tmp_path / "data", labels, PipelineHealth())
    assert [(s.name, s.category) for s in corpus] == [("hostA/gpu_temp.csv", "hostA"), ("hostB/gpu_temp.csv", "hostB")]
    assert [s.windows[0][0] for s in corpus] == [np.datetime64(stamps[300].replace(" ", "T"), "ns"),
                                                 np.datetime64(stamps[700].replace(" ", "T"), "ns")]
    # One window hit at its first row, the other missed: raw 0, null -2, perfect 2 -> 50.
    res = NabScorer(corpus).score({"hostA/gpu_temp.csv": detect(1000, {300: 1.0}),
                                   "hostB/gpu_temp.csv": np.zeros(1000)})["standard"]
    assert (res.raw, res.windows_hit, res.windows) == (pytest.approx(0.0), 1, 2)
    assert res.normalized == pytest.approx(50.0)
    # A category folder given directly still matches NAB's <category>/<file> keys.
    alone = load_corpus(tmp_path / "data" / "hostB", labels, PipelineHealth())
    assert [(s.name, s.category, len(s.windows)) for s in alone] == [("gpu_temp.csv", "hostB", 1)]


def test_a_label_two_files_would_share_is_refused_by_name(tmp_path) -> None:
    for cat in ("hostA", "hostB"):
        stamps = write_csv(tmp_path / "data" / cat / "gpu_temp.csv", 100)
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"gpu_temp.csv": [[stamps[30], stamps[39]]]}))
    with pytest.raises(ValueError, match=r"hostA/gpu_temp.csv and hostB/gpu_temp.csv both match"):
        load_corpus(tmp_path / "data", labels, PipelineHealth())
    # A file the labels do not name by path, whose name two label keys carry: no guess.
    stamps = write_csv(tmp_path / "other" / "gpu_temp.csv", 100)
    labels.write_text(json.dumps({"hostA/gpu_temp.csv": [], "hostB/gpu_temp.csv": [[stamps[30], stamps[39]]]}))
    with pytest.raises(ValueError, match=r"several files called gpu_temp.csv \(hostA/gpu_temp.csv, hostB/"):
        load_corpus(tmp_path / "other", labels, PipelineHealth())
    twice = toy()
    with pytest.raises(ValueError, match=r"names \['toy.csv'\] more than once"):
        NabScorer([toy(), twice])


def test_nab_command_scores_and_writes_same_named_files_of_two_categories(tmp_path) -> None:
    from foreshock.cli.main import cli

    for cat in ("hostA", "hostB"):
        stamps = write_csv(tmp_path / "data" / cat / "gpu_temp.csv", 400)
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"hostA/gpu_temp.csv": [[stamps[300], stamps[320]]],
                                  "hostB/gpu_temp.csv": [[stamps[200], stamps[220]]]}))
    result = CliRunner().invoke(cli, ["nab", str(tmp_path / "data"), str(labels), "--results", str(tmp_path / "out"),
                                      "--detector", "null"])
    assert result.exit_code == 0, result.output
    assert "on 2 files, 2 windows" in result.output
    for cat, first in (("hostA", 300), ("hostB", 200)):
        with open(tmp_path / "out" / "null" / cat / "null_gpu_temp.csv") as f:
            rows = list(csv.reader(f))[1:]
        assert [i for i, r in enumerate(rows) if r[3] == "1"] == list(range(first, first + 21))


def test_no_labelled_window_gives_no_normalised_score() -> None:
    """NAB's artificialNoAnomaly: perfect == null == 0, so the normalised score is undefined
    (it used to divide by zero); the raw score is still there."""
    calm = toy(windows=())
    res = NabScorer([calm]).score({"toy.csv": detect(60, {20: 1.0})})
    for r in res.values():
        assert (r.perfect, r.null, r.normalized) == (0.0, 0.0, None)
    assert res["standard"].raw == 0.0 and res["standard"].threshold == 1.1


def test_nab_command_prints_na_for_a_corpus_without_windows(tmp_path) -> None:
    from foreshock.cli.main import cli

    write_csv(tmp_path / "artificialNoAnomaly" / "art_flat.csv", 400)
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"artificialNoAnomaly/art_flat.csv": []}))
    result = CliRunner().invoke(cli, ["nab", str(tmp_path / "artificialNoAnomaly"), str(labels)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0 and result.exception is None, result.output
    lines = result.output.strip().splitlines()
    assert json.loads(lines[-1]) == {"standard": None, "reward_low_FP": None, "reward_low_FN": None}
    row = next(line for line in lines if " standard " in line)
    assert "n/a" in row and "-0.000" not in row
    assert "normalised score is n/a" in result.output


@pytest.mark.parametrize("windows", [((30, 33), (59, 59)), ((30, 30), (31, 35)), ((20, 20), (21, 21), (22, 25))],
                         ids=["on-the-last-row", "followed-by-a-window", "two-followed-by-a-window"])
def test_a_one_row_window_scores_where_nab_does(windows) -> None:
    """NAB divides by width - 1 only for a row outside windows after the window: a one-row window
    on the last row, or followed directly by another window, scores (it used to be refused)."""
    series = toy(windows=windows)
    scores = detect(60, {31: 0.9, 59: 0.9, 20: 0.8, 45: 0.7})
    stamps = series.timestamps.astype(np.int64).tolist()
    got = NabScorer([series]).score({"toy.csv": scores})
    for key, profile in PROFILES.items():
        rows = nab_reference_sweep(stamps, [(stamps[a], stamps[b]) for a, b in windows], "toy.csv", profile)
        sweep, _ = sweep_rows(series, profile)
        assert sweep.tolist() == [sw for sw, _ in rows]
        ref = nab_reference_best([[(float(a), sw, w) for a, (sw, w) in zip(scores, rows) if w != "probationary"]],
                                 profile.fn_weight)
        assert (got[key].threshold, got[key].raw) == (ref[0], pytest.approx(ref[1], abs=1e-12))


def test_windows_listed_latest_first_score_as_listed_in_time_order(tmp_path) -> None:
    """NAB's labeller writes a file's windows in time order and its sweep opens them in that order;
    a hand-written labels file listing them latest first had only its first window opened and was
    refused for "window starts match no row", though every start is a row (an audit, 2026-12-05)."""
    base = np.datetime64("2020-01-01T00:00")
    stamps = [base + np.timedelta64(i, "m") for i in range(60)]
    data = tmp_path / "data" / "x"
    data.mkdir(parents=True)
    with open(data / "f.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "value"])
        for i, t in enumerate(stamps):
            w.writerow([str(t).replace("T", " ") + ":00", float(i % 7)])
    spans = [(20, 24), (40, 44)]
    as_text = [[str(stamps[a]).replace("T", " ") + ":00", str(stamps[b]).replace("T", " ") + ":00"] for a, b in spans]
    ordered, reversed_ = tmp_path / "ordered.json", tmp_path / "reversed.json"
    ordered.write_text(json.dumps({"x/f.csv": as_text}))
    reversed_.write_text(json.dumps({"x/f.csv": as_text[::-1]}))
    assert load_labels(reversed_) == load_labels(ordered)
    from foreshock.cli.main import cli

    results = [CliRunner().invoke(cli, ["nab", str(tmp_path / "data"), str(p)]) for p in (ordered, reversed_)]
    assert all(r.exit_code == 0 for r in results), [r.output for r in results]
    assert results[0].output.strip().splitlines()[-1] == results[1].output.strip().splitlines()[-1]
