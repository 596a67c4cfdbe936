"""The evaluation harness: scoring by hand-checked examples, time alignment, the CLI end to end."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

from foreshock.detectors import evaluation as ev
from foreshock.events import Event
from foreshock.findings import Anomaly, Prediction
from foreshock.frames import Frame
from foreshock.recording import Recording, RecordingWriter

from thermal_synth import Fault, World, small_topology, write_recording

KIND = ev.EVENT_KINDS["thermal_throttle"]  # horizon 1800 s, merge 600 s, warm-up 600 s


def gpu_event(t, kind, gpu, fault=("", "")):
    return Event(float(t), kind, "gpu", f"node0/gpu{gpu}", *fault)


def pred(t, gpu, active=True, event="thermal_throttle"):
    return Prediction(float(t), "gpu", gpu, event, 60.0, 0.9, "thermal", "", active)


@pytest.fixture
def scored():
    topo = small_topology(nodes=1, gpus=4, racks=1)
    rec = Recording(Path("."), topo, {"faults": [{"id": "f1", "duration_s": None}]})
    tim, cool = ("f1", "tim_degradation"), ("f2", "cooling_loss")
    events = [
        Event(1000.0, "fault_onset", "gpu", "node0/gpu0", *tim),
        Event(7000.0, "fault_onset", "gpu", "node0/gpu1", *cool),
        gpu_event(5000, "thermal_throttle_start", 0, tim), gpu_event(5100, "thermal_throttle_end", 0, tim),
        gpu_event(5300, "thermal_throttle_start", 0, tim), gpu_event(5400, "thermal_throttle_end", 0, tim),
        gpu_event(8000, "thermal_throttle_start", 1, cool), gpu_event(8100, "thermal_throttle_end", 1, cool),
        gpu_event(300, "thermal_throttle_start", 2), gpu_event(400, "thermal_throttle_end", 2),  # warm-up
        gpu_event(6000, "power_cap_start", 3),  # another kind: ignored here
    ]
    findings = [
        pred(4000, 0), pred(4060, 0), pred(5600, 0, active=False),  # hit, lead 1000 s
        pred(5350, 0), pred(5360, 0, active=False),  # raised during the episode: not scored
        # hit, lead 10 s, open to the end: still up at its first statement after its episode and
        # the merge gap (9790 s), it claims anew from there: 9790 false, 11590 outlives the recording
        pred(7990, 1),
        # raised during a warm-up episode: not scored; still up at its first statement after the
        # gap (2150 s), it claims anew: 2150, 3950, ... 11150 false (six), 12950 outlives
        pred(350, 2),
        pred(2000, 3), pred(2100, 3, active=False),  # a false alarm
        pred(9000, 3),  # open from 9000 to 13000: three horizons, two judged false statements
        pred(9500, 3, event="power_cap"),
        Anomaly(9000.0, "gpu", 3, "gpu_temp", 3.0, "cooling"),
    ]
    return ev.score_kind(findings, events, KIND, rec, 0.0, 13000.0)


def test_episodes_merge_gaps_and_keep_their_fault():
    eps = ev.episodes([gpu_event(5000, "thermal_throttle_start", 0), gpu_event(5100, "thermal_throttle_end", 0),
                       gpu_event(5699, "thermal_throttle_start", 0), gpu_event(5800, "thermal_throttle_end", 0),
                       gpu_event(6500, "thermal_throttle_start", 0, ("f1", "tim_degradation"))], KIND)
    assert [(e.start, e.end, e.fault_type) for e in eps] == [(5000, 5800, "none"), (6500, np.inf, "tim_degradation")]


def test_scores_by_hand(scored):
    # 2 scored episodes, both predicted; leads 1000 and 10 s; 2 true and 10 false statements — the
    # open span from 9000 s states at 9000, 10800 and 12600 s, and the last one's 30 minutes
    # outlive the recording (13000 s): not judged; the two alarms kept up after their episodes
    # (gpu1, gpu2) claim anew from their first statement past the merge gap: 1 + 6 more (the
    # fixture). Until 2026-12-04 their later statements were never judged: 2 true, 3 false
    assert scored["episodes"] == 2
    assert scored["recall"] == 1.0
    assert scored["precision"] == pytest.approx(2 / 12, abs=1e-4)
    assert scored["lead_median_s"] == pytest.approx(505.0)
    assert scored["lead_p10_s"] == pytest.approx(10 + 0.1 * 990)
    assert scored["leads_s"] == [10.0, 1000.0]
    assert scored["recall_at_min_lead"] == 0.5  # 1000 s >= 300 s; 10 s is not
    gpu_hours = 4 * 13000 / 3600
    assert scored["false_alarms_per_1000_gpu_hours"] == pytest.approx(10 / gpu_hours * 1000, abs=1e-3)
    by = scored["by_fault"]
    assert by["tim_degradation"]["episodes"] == 1 and by["tim_degradation"]["lead_median_s"] == 1000.0
    assert by["tim_degradation"]["precision"] == 1.0
    assert by["cooling_loss"]["recall"] == 1.0 and by["cooling_loss"]["lead_median_s"] == 10.0
    assert by["cooling_loss"]["precision"] == pytest.approx(1 / 2, abs=1e-4)  # its claim anew after the episode
    assert by["none"]["episodes"] == 0 and by["none"]["recall"] is None and by["none"]["precision"] == 0.0


def test_alarm_after_onset_predicts_nothing():
    topo = small_topology(nodes=1, gpus=4, racks=1)
    rec = Recording(Path("."), topo, {})
    events = [gpu_event(5000, "thermal_throttle_start", 0)]
    m = ev.score_kind([pred(5000, 0)], events, KIND, rec, 0.0, 9000.0)  # fires with the bit
    assert m["recall"] == 0.0 and m["precision"] is None and m["lead_median_s"] is None


def test_claims_given_as_spans_are_scored_like_a_detector_s():
    # a rule that is not a detector (an analysis) is scored by the same rules, from its spans
    topo = small_topology(nodes=1, gpus=4, racks=1)
    rec = Recording(Path("."), topo, {})
    events = [gpu_event(5000, "thermal_throttle_start", 0), gpu_event(5100, "thermal_throttle_end", 0)]
    spans = {"node0/gpu0": [(4700.0, 5050.0)],  # 300 s ahead: a hit
             "node0/gpu1": [(2000.0, 2100.0)]}  # nothing follows: one false statement
    m = ev.score_intervals(spans, events, KIND, rec, 0.0, 9000.0)
    assert m["episodes"] == 1 and m["recall"] == 1.0 and m["lead_median_s"] == 300.0
    assert m["precision"] == 0.5
    findings = [pred(4700, 0), pred(5050, 0, active=False), pred(2000, 1), pred(2100, 1, active=False)]
    assert ev.score_kind(findings, events, KIND, rec, 0.0, 9000.0) == m


def test_aligned_frames_never_read_the_future(tmp_path):
    topo = small_topology(nodes=1, gpus=2, racks=1)
    with RecordingWriter(tmp_path, topo, {"interval": 10.0}, rows_per_group=3) as w:
        for t in (0, 10, 20, 50, 60):  # a gap from 20 to 50
            w.write(Frame("rack", [t], [0], {"inlet_temp": [24.0 + t]}))
            w.write(Frame("gpu", [t, t], [0, 1], {"gpu_temp": [50.0, 51.0]}))
    rec = Recording.open(tmp_path)
    seen = [(f.kind, tuple(f.ts)) for f in ev.aligned_frames(rec, ("gpu", "rack"))]
    assert seen == [("rack", (0,)), ("gpu", (0, 0)), ("rack", (10,)), ("gpu", (10, 10)), ("rack", (20,)),
                    ("gpu", (20, 20)), ("rack", (50,)), ("gpu", (50, 50)), ("rack", (60,)), ("gpu", (60, 60))]


def test_report_shape_and_extension_point(tmp_path):
    topo = small_topology()
    path = tmp_path / "rec"
    write_recording(path, World(topo, seed=5, faults=[Fault("tim_degradation", 6, 1200, 1.2, "f1")]), 3 * 3600)
    ev.register_event_kind(ev.EventKind("toy", "toy_start", None, "toy", "gpu", horizon_s=60.0))
    try:
        rec = Recording.open(path)
        result = ev.run_recording(rec, ["foreshock", "threshold"], trace_gpus=ev.pick_trace_gpus(rec))
        report = ev.score(result)
    finally:
        del ev.EVENT_KINDS["toy"]
    assert set(report["detectors"]) == {"foreshock", "threshold"}
    for per_kind in report["detectors"].values():
        assert "toy" in per_kind and "thermal_throttle" in per_kind
        for name, metrics in per_kind.items():
            # additive keys: by_onset on classified kinds, matched on baselines with scores
            assert set(metrics) - {"by_onset", "matched", "recall_at_min_lead"} == \
                set(ev.METRICS) | {"by_fault", "leads_s"}
            assert ("by_onset" in metrics) == (name == "power_cap")
            for sub in metrics["by_fault"].values():
                assert set(sub) == set(ev.METRICS)
            for sub in metrics.get("by_onset", {}).values():  # (this world reports no power-throttle counter)
                assert set(sub) == set(ev.METRICS) | {"recall_at_min_lead", "by_fault", "clock_change"}
    fs = report["detectors"]["foreshock"]["thermal_throttle"]
    th = report["detectors"]["threshold"]["thermal_throttle"]
    # the sweep replays the threshold rule's alarms from its logged scores: at its own level the
    # replay must score exactly what the live detector scored
    live = th["matched"]["live"]
    assert live["threshold"] == 85.0 and (live["recall"], live["precision"]) == (th["recall"], th["precision"])
    assert th["matched"]["target_precision"] == fs["precision"] and th["matched"]["levels_tried"] > 5
    assert fs["episodes"] == 1 and fs["recall"] == 1.0 and fs["lead_median_s"] > th["lead_median_s"]
    written = ev.write_plots(result, report, tmp_path / "plots")
    assert (tmp_path / "plots" / "lead_times.png").stat().st_size > 1000
    assert any(p.name.startswith("gpu_node0_gpu6") for p in written)


def fmt_or_dash(v):
    return "—" if v is None else ev.share_text(v)


def test_cli_evaluate_end_to_end(tmp_path):
    from foreshock.cli.main import cli

    topo = small_topology(nodes=2, gpus=4, racks=1)
    write_recording(tmp_path / "rec", World(topo, seed=8, faults=[Fault("tim_degradation", 2, 600, 1.5)]), 2 * 3600)
    result = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "rec"), "--detectors", "foreshock,threshold",
                                      "--report", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert summary["detectors"]["foreshock"]["thermal_throttle"]["recall"] == \
        report["detectors"]["foreshock"]["thermal_throttle"]["recall"] == 1.0
    assert (tmp_path / "out" / "lead_times.png").exists()
    # an 80-column terminal shows every figure whole (with a column each for set, kind and fault
    # every name was cut to "fore…", "ther…"): only long labels fold
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(ev.render_table(report))
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    thermal = report["detectors"]["foreshock"]["thermal_throttle"]
    lines = text.splitlines()
    at = next(k for k, line in enumerate(lines) if re.match(r"\s*foreshock( thermal_throttle)?\s+\d", line))
    assert "thermal_throttle" in lines[at] + lines[at + 1]  # the label may fold onto the next line
    assert lines[at].split()[-9:-4] == [str(thermal["episodes"]), ev.share_text(thermal["recall"]),
                                  ev.share_text(thermal["recall_at_min_lead"]), ev.share_text(thermal["precision"]),
                                  ev.lead_text(thermal["lead_median_s"]).split()[0]]
    # the power cap's onset classes: each on a row of its own with its figures, the target marked
    onsets = report["detectors"]["foreshock"]["power_cap"]["by_onset"]
    for c, m in onsets.items():
        row = next(line for line in lines if re.match(rf"\s+{c}\*?\s+\d", line))
        assert row.split()[1:3] == [str(m["episodes"]), fmt_or_dash(m["recall"])]
        assert row.split()[0].endswith("*") == (c == ev.PREDICTABLE_ONSET)
    # the report sections are printed and summarised too, with report.json's figures
    assert "report sections" in result.output
    assert summary["incidents"]["foreshock"]["faults"] == report["incidents"]["faults"] == 1
    assert summary["incidents"]["foreshock"]["root_cause_accuracy"] == report["incidents"]["root_cause_accuracy"]
    assert summary["congestion"]["foreshock"]["rerouted_episodes"] == \
        report["congestion"]["detectors"]["foreshock"]["rerouted_episodes"] == 0
    # the cooling detector flagged the failing interface, long before it throttled
    cooling = report["cooling"]["detectors"]["foreshock"]
    assert summary["cooling"]["foreshock"]["tim_flagged"] == cooling["tim_flagged"] == "1 of 1"
    assert cooling["tim_lead_before_throttle_median_s"] > 600 and "threshold" not in report["cooling"]["detectors"]
    # evaluated again into the same folder without plots: no earlier plot stays beside the new report
    (tmp_path / "out" / "notes.txt").write_text("the user's, left alone")
    again = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "rec"), "--detectors", "threshold", "--no-plots",
                                     "--report", str(tmp_path / "out")])
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["notes.txt", "report.json"]
    only = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "rec"), "--detectors", "threshold", "--no-plots",
                                    "--events", "thermal_throttle,congestion", "--report", str(tmp_path / "out3")])
    assert only.exit_code == 0, only.output
    assert list(json.loads(only.output.strip().splitlines()[-1])["detectors"]["threshold"]) == ["thermal_throttle"]
    unknown = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "rec"), "--events", "congestoin",
                                       "--report", str(tmp_path / "out4")])
    assert unknown.exit_code == 2 and "report sections" in unknown.output
    bad = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "rec"), "--detectors", "sklearn",
                                   "--report", str(tmp_path / "out2")])
    assert bad.exit_code != 0 and "needs --model" in bad.output
    # detector parameters reach the detectors of every set (a 5-minute horizon: leads under 5 min)
    short = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "rec"), "--detectors", "foreshock", "--no-plots",
                                     "--events", "thermal_throttle", "--param", "thermal.horizon_s=300",
                                     "--report", str(tmp_path / "out5")])
    assert short.exit_code == 0, short.output
    short_report = json.loads((tmp_path / "out5" / "report.json").read_text())
    assert short_report["meta"]["params"] == {"thermal": {"horizon_s": 300.0}}
    default_lead = report["detectors"]["foreshock"]["thermal_throttle"]["lead_median_s"]
    short_fs = short_report["detectors"]["foreshock"]["thermal_throttle"]
    assert default_lead > 300 and short_fs["recall"] == 1.0 and short_fs["lead_median_s"] <= 300
    for param, said in (("thermal.horizon=60", "horizon"), ("optic.horizon_s=60", "none of the sets")):
        refused = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "rec"), "--detectors", "foreshock",
                                           "--param", param, "--report", str(tmp_path / "out6")])
        assert refused.exit_code == 2 and said in refused.output, refused.output


def test_cli_evaluate_feeds_only_the_telemetry_asked_for(tmp_path):
    """``--telemetry gpu`` scores what a GPU exporter alone gives: the rack frames (inlet) are not
    fed, the thermal model runs on the node proxy, and a failing interface is still predicted."""
    from foreshock.cli.main import cli
    from foreshock.recording import Recording

    topo = small_topology(nodes=2, gpus=4, racks=1)
    write_recording(tmp_path / "rec", World(topo, seed=8, faults=[Fault("tim_degradation", 2, 600, 1.5)]), 2 * 3600)
    rows = Recording.open(tmp_path / "rec").meta["rows"]
    reports = {}
    for name, extra in (("all", []), ("gpu", ["--telemetry", "gpu"])):
        result = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "rec"), "--detectors", "foreshock", "--no-plots",
                                          "--events", "thermal_throttle", "--report", str(tmp_path / name)] + extra)
        assert result.exit_code == 0, result.output
        assert ("(telemetry fed: gpu)" in result.output) == bool(extra)
        reports[name] = json.loads((tmp_path / name / "report.json").read_text())
    assert set(reports["all"]["meta"]["telemetry"]) == {"gpu", "rack"}
    assert reports["all"]["meta"]["samples"] == rows["gpu"] + rows["rack"]
    assert reports["gpu"]["meta"]["telemetry"] == ["gpu"] and reports["gpu"]["meta"]["samples"] == rows["gpu"]
    assert reports["gpu"]["detectors"]["foreshock"]["thermal_throttle"]["recall"] == 1.0
    refused = CliRunner().invoke(cli, ["evaluate", str(tmp_path / "rec"), "--telemetry", "gpu,racks",
                                       "--report", str(tmp_path / "bad")])
    assert refused.exit_code == 2 and "entity kinds" in refused.output


# ---- columnar scoring against the rules written out one alarm at a time ----------------------
def naive_score(findings, events, kind, recording, start, end):
    """The scoring rules of the module docstring, one episode and one alarm statement at a time."""
    topo = recording.topology
    all_eps = ev.episodes(events, kind)
    eps = [ep for ep in all_eps if ep.start >= start + kind.warmup_s]
    alarms = ev.alarm_intervals(findings, kind, topo, end)
    scopes = ev.fault_scopes(recording, events, kind.entity_kind)
    h = kind.horizon_s
    mine_of = {}
    for ep in all_eps:
        mine_of.setdefault(ep.entity, []).append(ep)
    acc = {}

    def bucket(ft):
        return acc.setdefault(ft, {"episodes": 0, "hits": 0, "tp": 0, "fp": 0, "leads": []})

    # GPUs of an interrupted job (every GPU of the toy topology is in job0)
    stops = sorted(e.time for e in events if (e.type == "job_slowdown_start" and e.detail.get("reason") == "interrupted")
                   or e.type == "job_end")
    total = {"episodes": 0, "hits": 0, "tp": 0, "fp": 0, "leads": []}
    def first_after(mine, s):  # the onset of the entity's first episode after s: an alarm's claim
        return min((e.start for e in mine if e.start > s), default=math.inf)

    def raised_in(mine, s):
        """The episode an alarm raised at s was raised in, or within merge_gap_s after: it is not
        judged. The entity's latest episode begun by s is the one: an alarm raised after B let go
        is judged by B's gap, not by that of an A before it whose gap still holds s. Unless it was
        raised after the episode ended and the next one (another fault's, split off) starts within
        that gap: then its claim is about that one."""
        begun = [e for e in mine if e.start <= s]
        if not begun:
            return None
        e = max(begun, key=lambda x: x.start)
        if s > e.end + kind.merge_gap_s:
            return None
        if s > e.end and any(s < n.start <= e.end + kind.merge_gap_s for n in mine):
            return None
        return e

    def during(mine, s):
        return raised_in(mine, s) is not None

    def claims(mine, s, w):
        """An alarm active from s to w, as the spans it claims as: from its first statement (s, s + h,
        ...) after the merge gap that follows the episode its claim came true on (a statement of it
        covers the onset), or the one it was raised in, it claims anew, as if raised again then."""
        out = []
        while True:
            settled = raised_in(mine, s)
            if settled is None:
                onset = first_after(mine, s)
                if onset <= s + h * max(math.ceil((w - s) / h), 1):
                    settled = next(e for e in mine if e.start == onset)
            if settled is None or w <= settled.end + kind.merge_gap_s:  # (an open episode's end: inf)
                return out + [(s, w)]
            anew = s
            while anew <= settled.end + kind.merge_gap_s:
                anew += h
            if w <= anew:
                return out + [(s, w)]
            out.append((s, anew))
            s = anew

    spans_of = {entity: [c for s, w in spans for c in claims(mine_of.get(entity, []), s, w)]
                for entity, spans in alarms.items()}

    for ep in eps:
        mine = mine_of.get(ep.entity, [])
        leads = []
        for s, w in spans_of.get(ep.entity, ()):
            if during(mine, s) or first_after(mine, s) != ep.start:
                continue  # not judged, or its claim is about another episode
            t = s
            while True:  # its statements, at s, s + h, ... while active: one covering the onset predicts it
                if t < ep.start <= t + h:
                    leads.append(ep.start - max(s, ep.start - h))
                    break
                t += h
                if t >= w:
                    break
        for a in (total, bucket(ep.fault_type)):
            a["episodes"] += 1
            if leads:
                a["hits"] += 1
                a["leads"].append(max(leads))
    for entity, spans in spans_of.items():
        mine = mine_of.get(entity, [])
        for s, w in spans:
            if during(mine, s):
                continue
            reach = s + h * max(math.ceil((w - s) / h), 1)  # the last statement's horizon
            t = s
            while True:
                if kind.censor_at_end and t + h > end:
                    break  # outlives the recording: not judged, come true or not
                hit = next((ep for ep in mine if t < ep.start <= t + h), None)
                # the job stopped during this statement (any stop the span's statements reach)
                ti = min((x for x in stops if s <= x <= reach and (t < x <= t + h or x == t == s)), default=None)
                if ti is not None and (hit is None or not hit.start < ti):
                    if hit is not None:  # its episode came after the job stopped: not judged
                        break
                    t += h  # the job stopped during this statement: not judged
                    if t >= w:
                        break
                    continue
                if hit is not None:
                    if hit.start >= start + kind.warmup_s:  # a warm-up episode's hit is not judged, as it is not scored
                        total["tp"] += 1
                        bucket(hit.fault_type)["tp"] += 1
                    break
                total["fp"] += 1
                # the fault holding it then: an active one over one in its aftermath, the latest to begin
                holding = [sc for sc in sorted(scopes, key=lambda sc: sc.onset) if entity in sc.entities]
                active = [sc for sc in holding if sc.onset <= t < sc.repaired]
                after = [sc for sc in holding if sc.repaired <= t <= sc.end]
                charged = (active or after)[-1].fault_type if active or after else "none"
                bucket(charged)["fp"] += 1
                t += h
                if t >= w:
                    break
    hours = (end - start) / 3600.0 * topo.size(kind.entity_kind)
    out = ev._finish(total, hours)
    out["leads_s"] = sorted(round(x, 4) for x in total["leads"])
    out["by_fault"] = {ft: ev._finish(a, hours) for ft, a in sorted(acc.items())}
    return out


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("link_down_like", [False, True])
def test_columnar_scoring_matches_the_naive_rules(seed, link_down_like):
    """``link_down_like``: link_down's 6-h horizon and 1-h merge gap, where an alarm raised after
    one episode let go can lie in the gaps of two (the scorer and this reference had disagreed on
    which one judges it: the latest)."""
    rng = np.random.default_rng(seed)
    topo = small_topology(nodes=1, gpus=6, racks=1)
    rec = Recording(Path("."), topo, {"faults": [{"id": "f1", "duration_s": 3000.0}]})
    horizon, gap = (21600.0, 3600.0) if link_down_like else (float(rng.choice([300.0, 1800.0])),
                                                             float(rng.choice([0.0, 120.0])))
    kind = ev.EventKind("toy", "thermal_throttle_start", "thermal_throttle_end", "thermal_throttle", "gpu",
                        horizon_s=horizon, merge_gap_s=gap, warmup_s=600.0, censor_at_end=bool(seed % 2))
    end = 20000.0
    events = [Event(float(rng.uniform(0, 8000)), "fault_onset", "gpu", "node0/gpu1", "f1", "fan_failure"),
              Event(2000.0, "fault_onset", "node", "node0", "f2", "psu_failure")]
    # job0 (every GPU) stopped by a member falling off the bus, now and then
    events += [Event(float(round(rng.uniform(0, end))), "job_slowdown_start", "job", "job0", "f3", "xid79",
                     {"reason": "interrupted"}) for _ in range(int(rng.integers(0, 4)))]
    # ... or by the schedule (the job finished)
    events += [Event(float(round(rng.uniform(0, end))), "job_end", "job", "job0", "", "", {"reason": "completed"})
               for _ in range(int(rng.integers(0, 3)))]
    for g in range(6):
        t = float(rng.uniform(0, 1500))
        while t < end:
            dur = float(rng.choice([10.0, 60.0, 400.0]))
            fault = [("", ""), ("f1", "fan_failure"), ("f2", "psu_failure")][int(rng.integers(3))]
            events.append(gpu_event(round(t), "thermal_throttle_start", g, fault))
            if rng.random() < 0.9 or t + dur >= end - 2000:
                events.append(gpu_event(round(t + dur), "thermal_throttle_end", g, fault))
            t += dur + float(rng.exponential(3000))
    findings = []
    for g in range(6):
        t = float(rng.uniform(0, 500))
        while t < end:
            findings.append(pred(round(t), g))
            if rng.random() < 0.85:
                t += float(rng.choice([0.0, 10.0, 700.0, 4000.0]))
                findings.append(pred(round(t), g, active=False))
            else:
                break
            t += float(rng.exponential(2500))
    got = ev.score_kind(findings, events, kind, rec, 0.0, end)
    want = naive_score(findings, events, kind, rec, 0.0, end)
    # the case exercises the rules (in six hours nearly every claim comes true)
    assert want["episodes"] > 3 and ((want["precision"] or 0) < 1 or link_down_like)
    assert got == want


# ---- onset classes (power cap) ----------------------------------------------------------------
def onset_telemetry(samples):
    """samples: (slot, ts, util, bits, power W[, SM clock Hz]); energy integrates the power."""
    tel = ev.OnsetTelemetry()
    energy = {}
    for slot, ts, util, bits, power, *clock in samples:
        energy[slot] = energy.get(slot, 0.0) + power * 10.0
        cols = {"util": [util], "throttle_reasons": [bits], "energy": [energy[slot]]}
        tel.add(Frame("gpu", [ts], [slot], cols | ({"sm_clock": clock} if clock else {})))
    return tel.finish()


def test_onsets_are_classified_by_what_precedes_them():
    samples = []
    for t in range(0, 2100, 10):
        samples.append((0, t, 0.0 if t < 1000 else 1.0, 1 if t < 1000 else 0, 100.0 if t < 1000 else 650.0))  # job starts
        samples.append((1, t, 1.0, 0, 400.0 if t < 1940 else 650.0))  # loaded at 400 W, steps up 60 s before
        samples.append((2, t, 1.0, 0, 600.0 + 0.02 * t))  # loaded, creeping up
        samples.append((3, t, 1.0, 1 if t == 1930 else 0, 600.0))  # idle bit 70 s before its onset
    tel = onset_telemetry(samples)
    codes = ev.classify_onsets(tel, np.array([0, 1, 2, 3, 2]), np.array([1030.0, 2000.0, 2000.0, 2000.0, 5.0]))
    assert [ev.ONSET_CLASSES[c] for c in codes] == ["job_start", "load_step", "steady_load", "steady_load",
                                                   "steady_load"]  # the last: no samples before it

    topo = small_topology(nodes=1, gpus=4, racks=1)
    rec = Recording(Path("."), topo, {})
    kind = ev.EVENT_KINDS["power_cap"]  # horizon 300 s, warm-up 600 s
    events = [gpu_event(1030, "power_cap_start", 0), gpu_event(2000, "power_cap_start", 1),
              gpu_event(2000, "power_cap_start", 2), gpu_event(2000, "power_cap_start", 3)]
    findings = [pred(1000, 0, event="power_cap"),  # before a job start: lead 30 s
                pred(1900, 2, event="power_cap"),  # steady: lead 100 s
                pred(1990, 3, event="power_cap")]  # steady: lead 10 s
    m = ev.score_kind(findings, events, kind, rec, 0.0, 2100.0, tel)
    on = m["by_onset"]
    assert m["recall"] == 0.75 and list(on) == list(ev.ONSET_CLASSES)
    assert (on["job_start"]["episodes"], on["job_start"]["recall"], on["job_start"]["lead_median_s"]) == (1, 1.0, 30.0)
    assert (on["load_step"]["episodes"], on["load_step"]["recall"]) == (1, 0.0)
    assert (on["steady_load"]["episodes"], on["steady_load"]["recall"], on["steady_load"]["lead_median_s"]) == (2, 1.0, 55.0)
    assert on["steady_load"]["recall_at_min_lead"] == 0.5 and m["recall_at_min_lead"] == 0.5  # leads >= 30 s
    assert on["steady_load"]["precision"] is None  # false alarms belong to no onset class
    assert on["steady_load"]["by_fault"]["none"]["episodes"] == 2 and list(on["load_step"]["by_fault"]) == ["none"]
    assert "by_onset" not in ev.score_kind(findings, events, kind, rec, 0.0, 2100.0)  # no telemetry: no classes


def test_a_cap_taking_over_from_a_thermal_limiter_is_its_own_class():
    """A GPU the thermal limiter held just before its power-cap onset is not a steady-load onset:
    the clock rises as the power limiter takes over. Idle before it is still a job start."""
    mhz = 1e6
    samples = []
    for t in range(0, 2100, 10):
        before = t < 2000
        samples.append((0, t, 1.0, 0x20 if before else 0x24, 600.0, (1600 if before else 1700) * mhz))
        samples.append((1, t, 1.0, 0x20 if t < 1500 else 0, 600.0, (1980 if before else 1900) * mhz))  # long ago
        samples.append((2, t, 0.0 if t < 1970 else 1.0, 0x21 if t < 1970 else 0x20, 600.0, 1980 * mhz))
        samples.append((3, t, 1.0, np.nan, 600.0, 1980 * mhz))  # no throttle reasons reported
    tel = onset_telemetry(samples)
    slots, onsets = np.arange(4), np.full(4, 2000.0)
    codes = ev.classify_onsets(tel, slots, onsets)
    assert [ev.ONSET_CLASSES[c] for c in codes] == ["thermal_throttled", "steady_load", "job_start", "steady_load"]
    assert list(ev.clock_change(tel, slots, onsets) / mhz) == [100.0, -80.0, 0.0, 0.0]
    # no sample of the GPU before the onset (slot 1's first; slot 0's last is just before it) or after it
    assert np.isnan(ev.clock_change(tel, np.array([1, 3]), np.array([0.0, 5000.0]))).all()
    late = ev.classify_onsets(tel, np.array([0, 1]), np.array([5000.0, 0.0]))  # nothing after / before it
    assert [ev.ONSET_CLASSES[c] for c in late] == ["thermal_throttled", "steady_load"]

    topo = small_topology(nodes=1, gpus=4, racks=1)
    rec = Recording(Path("."), topo, {})
    events = [gpu_event(2000, "power_cap_start", g) for g in range(4)]
    m = ev.score_kind([pred(1900, 0, event="power_cap")], events, ev.EVENT_KINDS["power_cap"], rec, 0.0, 2100.0, tel)
    on = m["by_onset"]
    assert (on["thermal_throttled"]["episodes"], on["thermal_throttled"]["recall"]) == (1, 1.0)
    assert (on["steady_load"]["episodes"], on["steady_load"]["recall"]) == (2, 0.0)  # the target class
    assert on["thermal_throttled"]["clock_change"] == {"median_mhz": 100.0, "rose": 1.0, "fell": 0.0, "onsets": 1}
    assert on["steady_load"]["clock_change"] == {"median_mhz": -40.0, "rose": 0.0, "fell": 0.5, "onsets": 2}
    assert on["load_step"]["clock_change"] is None  # no episode of that class
    assert ev.PREDICTABLE_ONSET == "steady_load"


def test_steady_onsets_are_split_by_how_long_the_limiter_held_the_clock():
    # four loaded GPUs capped at 2000 s; the counter (seconds held) says for how long: GPU 0 a
    # 0.2-s touch, GPU 1 40 s, GPU 2 still capped at the end (open episode), GPU 3 has no counter
    held = {0: lambda t: 5.0 + (0.2 if t >= 2000 else 0.0), 1: lambda t: 7.0 + min(max(t - 2000, 0), 40),
            2: lambda t: max(t - 2000, 0) * 0.5, 3: lambda t: np.nan}
    tel = ev.OnsetTelemetry()
    for t in range(0, 2200, 10):
        for g in range(4):
            tel.add(Frame("gpu", [t], [g], {"util": [1.0], "throttle_reasons": [0.0], "energy": [600.0 * t],
                                           "power_throttle_time": [held[g](t)]}))
    tel.finish()
    got = ev.capped_seconds(tel, np.array([0, 1, 2, 3]), np.full(4, 1995.0), np.array([1996.0, 2040.0, np.inf, 2010.0]))
    assert got[0] == pytest.approx(0.2) and got[1] == pytest.approx(40.0)
    assert got[2] == pytest.approx(0.5 * 190) and np.isnan(got[3])
    # a counter that went backwards (driver reload) says nothing about the episode
    tel.held[(tel.slot == 1) & (tel.ts >= 2000)] = 0.0
    assert np.isnan(ev.capped_seconds(tel, np.array([1]), np.array([1995.0]), np.array([2040.0]))[0])

    topo = small_topology(nodes=1, gpus=4, racks=1)
    rec = Recording(Path("."), topo, {})
    kind = ev.EVENT_KINDS["power_cap"]
    events = [gpu_event(1995, "power_cap_start", 0), gpu_event(1996, "power_cap_end", 0),
              gpu_event(1995, "power_cap_start", 1), gpu_event(2040, "power_cap_end", 1),
              gpu_event(1995, "power_cap_start", 2), gpu_event(1995, "power_cap_start", 3),
              gpu_event(2010, "power_cap_end", 3)]
    findings = [pred(1900, 1, event="power_cap"), pred(1950, 2, event="power_cap")]
    tel.held[(tel.slot == 1) & (tel.ts >= 2000)] = 7.0 + np.minimum(tel.ts[(tel.slot == 1) & (tel.ts >= 2000)] - 2000, 40)
    split = ev.score_kind(findings, events, kind, rec, 0.0, 2200.0, tel)["by_onset"]["steady_load"]["by_capped_time"]
    assert list(split) == ["under_1s", "1s_or_more", "unknown"]
    assert (split["under_1s"]["episodes"], split["under_1s"]["recall"]) == (1, 0.0)
    assert (split["1s_or_more"]["episodes"], split["1s_or_more"]["recall"]) == (2, 1.0)
    assert split["1s_or_more"]["lead_median_s"] == 70.0 and split["1s_or_more"]["recall_at_min_lead"] == 1.0
    assert (split["unknown"]["episodes"], split["unknown"]["recall"]) == (1, 0.0)
    # frames without the counter (dcgm-exporter's defaults): no split at all
    bare = onset_telemetry([(g, t, 1.0, 0, 600.0) for t in range(0, 2200, 10) for g in range(4)])
    assert "by_capped_time" not in ev.score_kind(findings, events, kind, rec, 0.0, 2200.0, bare)["by_onset"]["steady_load"]


# ---- precision-matched baseline comparison ---------------------------------------------------
def toy_log(rows, slots=2):
    """A baseline whose one score column predicts power_cap; alarm at >= level, clear below it
    on the second clear sample (off_hold 0), refresh every 60 s."""
    from foreshock.detectors.baselines import ScoreLog

    log = ScoreLog("toy", slots, (("power_cap",),), np.array([0.9]), np.ones(1), np.zeros(1), np.array([1.0, 0.0, 60.0]))
    arr = np.array(rows, dtype=float)
    log.add(np.column_stack([arr[:, 0], arr[:, 1]]), arr[:, 2:3])
    return log


def test_matched_threshold_by_hand():
    rows = []
    for t in range(0, 3010, 10):
        rows.append((t, 0, 0.8 if 1700 <= t < 2000 else 0.5))  # rises 300 s before its episode
        rows.append((t, 1, 0.95 if t in (1000, 1010) else 0.5))  # a spike, no episode
    log = toy_log(rows)
    # the replay by hand: level 0.9 -> GPU1 alarms 1000..1030 (cleared at 1020, withdrawn at 1030)
    slot, s, w = log.spans(0, 0.9, 3000.0)
    assert (slot.tolist(), s.tolist(), w.tolist()) == ([1], [1000.0], [1030.0])
    slot, s, w = log.spans(0, 0.8, 3000.0)
    assert (slot.tolist(), s.tolist(), w.tolist()) == ([0, 1], [1700.0, 1000.0], [2010.0, 1030.0])
    log.valid_from = 1500.0  # river alarms only after its calibration: earlier rows are skipped
    slot, s, w = log.spans(0, 0.8, 3000.0)
    assert (slot.tolist(), s.tolist(), w.tolist()) == ([0], [1700.0], [2010.0])
    log.valid_from = -np.inf

    topo = small_topology(nodes=1, gpus=2, racks=1)
    rec = Recording(Path("."), topo, {})
    events = [gpu_event(2000, "power_cap_start", 0), gpu_event(2200, "power_cap_end", 0)]
    result = ev.RunResult(rec, {}, events, 0.0, 3000.0, 0.0, 0)
    kind = ev.EVENT_KINDS["power_cap"]
    # levels in (0.5, 0.8]: GPU0 predicted 300 s ahead (1 true), GPU1 one false -> P 0.5, R 1;
    # above 0.8: only the false alarm; at 0.5 every sample alarms: 1 true, 6 + 10 false
    m = ev.matched_threshold(result, [log], kind, target_precision=0.5)
    assert 0.5 < m["threshold"] <= 0.8
    assert (m["recall"], m["precision"], m["lead_median_s"], m["recall_at_min_lead"]) == (1.0, 0.5, 300.0, 1.0)
    assert m["live"] == {"threshold": 0.9, "recall": 0.0, "precision": 0.0}
    assert m["at_min_lead"]["recall_at_min_lead"] == 1.0 and m["at_min_lead"]["threshold"] == m["threshold"]
    none = ev.matched_threshold(result, [log], kind, target_precision=0.6)
    assert none["threshold"] is None and none["recall"] is None
    assert none["best_precision"]["precision"] == 0.5 and none["best_precision"]["recall"] == 1.0
    assert ev.matched_threshold(result, [log], ev.EVENT_KINDS["thermal_throttle"], 0.5) is None  # not predicted


def test_the_matched_threshold_is_searched_between_the_grid_levels():
    """The sweep tried 48 score quantiles only (each ~32 % fewer samples above the next): where the
    target precision is crossed between two of them, the best level was never tried and the
    baseline's "matched" recall understated. 100 GPUs rise to 0.503, 0.508 ... 0.998 before their
    episode; 100 others spike once to 0.500, 0.504 ... 0.896 with none: precision 1.0 holds from
    the first score above 0.896, 0.898, which takes the 21 GPUs at 0.898 ... 0.998 (the live
    level, 0.9, 20 of them)."""
    rows = []
    for t in range(0, 3010, 10):
        for i in range(100):
            rows.append((t, i, (503 + 5 * i) / 1000 if t == 1900 else 0.1))
            rows.append((t, 100 + i, (500 + 4 * i) / 1000 if t == 1000 else 0.1))
    log = toy_log(rows, slots=200)
    topo = small_topology(nodes=25, gpus=8, racks=1)
    events = [Event(float(t), kind, "gpu", topo.name("gpu", i))
              for i in range(100) for t, kind in ((2000, "power_cap_start"), (2200, "power_cap_end"))]
    result = ev.RunResult(Recording(Path("."), topo, {}), {}, events, 0.0, 3000.0, 0.0, 0)
    kind = ev.EVENT_KINDS["power_cap"]
    m = ev.matched_threshold(result, [log], kind, target_precision=1.0)
    assert (m["threshold"], m["recall"], m["precision"]) == (0.898, 0.21, 1.0)
    grid, _ = ev.threshold_sweep(result, [log], kind)
    assert max(f["recall"] for _, f in grid if f["precision"] == 1.0) == 0.2  # what the grid (and live level) found


def test_refine_crossings_finds_the_lowest_level_reaching_the_target_between_two_tried():
    candidates = np.round(np.arange(0.0, 1.0001, 0.001), 3)
    scored: list[float] = []

    def score(level: float) -> dict:
        scored.append(level)
        return {"precision": 1.0 if level >= 0.437 else 0.5}

    reaches = lambda f: f["precision"] >= 1.0  # noqa: E731
    got = ev.refine_crossings({0.1: score(0.1), 0.9: score(0.9)}, reaches, candidates, score)
    assert min(level for level, f in got.items() if reaches(f)) == 0.437
    assert len(scored) - 2 <= 10  # a bisection: ~log2(800) levels, not 800
    # nothing to search where the lower level reaches the target already, or the higher does not
    assert ev.refine_crossings({0.1: {"precision": 1.0}, 0.9: {"precision": 1.0}}, reaches, candidates, score).keys() \
        == {0.1, 0.9}
    assert ev.refine_crossings({0.1: {"precision": 0.5}, 0.9: {"precision": 0.5}}, reaches, candidates, score).keys() \
        == {0.1, 0.9}


def test_a_claim_raised_as_an_episode_lets_go_earns_neither_precision_nor_the_next_episode() -> None:
    """"It may happen again", said within the merge gap after an episode, is not judged for
    precision — so it must not be credited with the entity's next episode either."""
    topo = small_topology(nodes=1, gpus=2, racks=1)
    rec = Recording(Path("."), topo, {"faults": []})
    events = [gpu_event(1000, "thermal_throttle_start", 0), gpu_event(1100, "thermal_throttle_end", 0),
              gpu_event(2000, "thermal_throttle_start", 0), gpu_event(2050, "thermal_throttle_end", 0),
              gpu_event(1000, "thermal_throttle_start", 1), gpu_event(1100, "thermal_throttle_end", 1),
              gpu_event(2000, "thermal_throttle_start", 1), gpu_event(2050, "thermal_throttle_end", 1)]
    # merge gap 600 s: gpu0's claim at 1200 (100 s after its episode) is not judged; gpu1's at 1750
    # (650 s after) is, and predicts the episode at 2000 with a 250 s lead
    findings = [pred(1200, 0), pred(1900, 0, active=False), pred(1750, 1), pred(1900, 1, active=False)]
    kind = ev.EventKind("thermal_throttle", "thermal_throttle_start", "thermal_throttle_end", "thermal_throttle",
                        "gpu", horizon_s=1800.0, merge_gap_s=600.0, warmup_s=0.0)
    m = ev.score_kind(findings, events, kind, rec, 0.0, 4000.0)
    # 900 s between episodes is over the merge gap: two episodes per GPU; only gpu1's second is
    # predicted (under the old rule gpu0's second counted too: recall 2/4)
    assert m["episodes"] == 4
    assert m["recall"] == pytest.approx(1 / 4)
    assert m["precision"] == 1.0 and m["lead_median_s"] == 250.0


def test_an_alarm_kept_up_through_a_throttle_is_scored_as_one_raised_again_at_its_next_statement() -> None:
    """gpu0's alarm, raised 300 s before its first throttle and kept up through it and after,
    had earned the next throttle too, its lead counted from when it was first raised: on seed 33
    one such alarm made the TIM class's median lead 22 min where the GPU was warned 7 s ahead.
    Then (2026-12-02 to 2026-12-04) it earned nothing after its first hit and none of its later
    statements was judged: one never withdrawn had no false alarm after its first true one. Now,
    still up at its first statement after the merge gap that follows its episode (4500 s), it
    claims anew from there, exactly as gpu1's alarm, withdrawn at the throttle and raised again at
    4500 s: both are judged by the same statements and earn the second throttle 1500 s ahead.
    Withdrawn before that statement (gpu2, at 4400 s), an alarm claims nothing more."""
    topo = small_topology(nodes=1, gpus=3, racks=1)
    rec = Recording(Path("."), topo, {"faults": []})
    events = []
    for g in (0, 1, 2):  # two throttles more than a horizon apart
        events += [gpu_event(3000, "thermal_throttle_start", g), gpu_event(3100, "thermal_throttle_end", g),
                   gpu_event(6000, "thermal_throttle_start", g), gpu_event(6100, "thermal_throttle_end", g)]
    findings = [pred(2700, 0), pred(5950, 0, active=False),  # up through the first throttle
                pred(2700, 1), pred(3000, 1, active=False), pred(4500, 1), pred(5950, 1, active=False),
                pred(2700, 2), pred(4400, 2, active=False)]
    kind = ev.EventKind("thermal_throttle", "thermal_throttle_start", "thermal_throttle_end", "thermal_throttle",
                        "gpu", horizon_s=1800.0, merge_gap_s=120.0, warmup_s=0.0)
    m = ev.score_kind(findings, events, kind, rec, 0.0, 10000.0)
    assert (m["episodes"], m["recall"], m["leads_s"]) == (6, 0.8333, [300.0] * 3 + [1500.0] * 2)
    assert m["precision"] == 1.0
    kept, again = (ev.score_kind(findings[a:b], events[c:c + 4], kind, rec, 0.0, 10000.0)
                   for a, b, c in ((0, 2, 0), (2, 6, 4)))
    assert kept == again
    _as_naive(m, naive_score(findings, events, kind, rec, 0.0, 10000.0))


THROTTLE_0_WARMUP = ev.EventKind("thermal_throttle", "thermal_throttle_start", "thermal_throttle_end",
                                 "thermal_throttle", "gpu", horizon_s=1800.0, merge_gap_s=120.0, warmup_s=0.0)


def test_an_alarm_earns_only_the_first_episode_after_it_was_raised() -> None:
    """Each GPU throttles at 3000 and at 3900 s (900 s apart: two episodes), the second within a
    horizon of the first's onset. gpu0's alarm, raised at 2700 s and kept up to 3500 s, and gpu1's,
    raised at 2700 s and withdrawn at 2800 s, claim the throttle at 3000 s, not the one at 3900 s
    too. Until 2026-12-02 each earned both, the second with a lead of 1200 s from 2700 s."""
    rec = Recording(Path("."), small_topology(nodes=1, gpus=2, racks=1), {"faults": []})
    events = []
    for g in (0, 1):
        events += [gpu_event(3000, "thermal_throttle_start", g), gpu_event(3100, "thermal_throttle_end", g),
                   gpu_event(3900, "thermal_throttle_start", g), gpu_event(4000, "thermal_throttle_end", g)]
    findings = [pred(2700, 0), pred(3500, 0, active=False), pred(2700, 1), pred(2800, 1, active=False)]
    m = ev.score_kind(findings, events, THROTTLE_0_WARMUP, rec, 0.0, 10000.0)
    # 4 episodes, each GPU's first predicted 300 s ahead (the old rule: all 4, leads 300, 300, 1200,
    # 1200 s); each alarm makes one statement (under a horizon long), true
    assert (m["episodes"], m["recall"], m["lead_median_s"], m["precision"]) == (4, 0.5, 300.0, 1.0)
    assert m["leads_s"] == [300.0, 300.0]


def test_an_episode_is_predicted_only_within_the_reach_of_an_alarm_s_statements() -> None:
    """Recall and precision judge the same statements. Horizon 1800 s; every alarm raised at 1000 s:

    - gpu0, withdrawn at 1100 s, states once, covering (1000, 2800]; its throttle at 2850 s is
      50 s beyond it: missed, and the statement false. Until 2026-12-02 recall counted it (active
      within the horizon before the onset, lead 1800 s) while precision judged it false.
    - gpu1, withdrawn at 1100 s: its throttle at 2800 s is just covered: a hit, lead 1800 s, true.
    - gpu2, withdrawn at 1100 s: its throttle at 1600 s, a hit 600 s ahead, true.
    - gpu3, kept up to 2900 s, states at 1000 and at 2800 s; the second covers its throttle at
      4500 s: a hit, lead 1800 s (from the start of the horizon), the first statement false.

    4 episodes, 3 predicted; 5 statements, 3 true."""
    rec = Recording(Path("."), small_topology(nodes=1, gpus=4, racks=1), {"faults": []})
    events = []
    for g, t in enumerate((2850, 2800, 1600, 4500)):
        events += [gpu_event(t, "thermal_throttle_start", g), gpu_event(t + 50, "thermal_throttle_end", g)]
    findings = [pred(1000, g) for g in range(4)]
    findings += [pred(1100, g, active=False) for g in range(3)] + [pred(2900, 3, active=False)]
    m = ev.score_kind(findings, events, THROTTLE_0_WARMUP, rec, 0.0, 10000.0)
    assert (m["episodes"], m["recall"], m["precision"]) == (4, 0.75, 0.6)
    assert m["leads_s"] == [600.0, 1800.0, 1800.0]
    alone = ev.score_kind([f for f in findings if f.slot == 0], events, THROTTLE_0_WARMUP, rec, 0.0, 10000.0)
    assert (alone["recall"], alone["precision"]) == (0.0, 0.0)  # the old rule: recall 0.25 from this alarm


def test_instant_episodes_end_where_they_start() -> None:
    """A kind with no end event: instants at 1000, 1030, 5000 and 9000 s (merge gap 60 s) are
    three episodes, the first two one ending at 1030 s. Until 2026-12-02 an instant never ended,
    so every later one merged into the first: one episode, and the alarm at 4800 s was raised
    "during" it, not judged."""
    kind = ev.EventKind("blip", "blip", None, "blip", "gpu", horizon_s=300.0, merge_gap_s=60.0, warmup_s=0.0)
    events = [gpu_event(t, "blip", 0) for t in (1000, 1030, 5000, 9000)]
    assert [(e.start, e.end) for e in ev.episodes(events, kind)] == [(1000, 1030), (5000, 5000), (9000, 9000)]
    rec = Recording(Path("."), small_topology(nodes=1, gpus=2, racks=1), {"faults": []})
    # 200 s before the instant at 5000 s: predicted, one true statement; 30 s after it (within the
    # merge gap): not judged
    findings = [pred(4800, 0, event="blip"), pred(4850, 0, active=False, event="blip"),
                pred(5030, 0, event="blip"), pred(5040, 0, active=False, event="blip")]
    m = ev.score_kind(findings, events, kind, rec, 0.0, 10000.0)
    assert (m["episodes"], m["recall"], m["lead_median_s"], m["precision"]) == (3, round(1 / 3, 4), 200.0, 1.0)


def test_a_false_alarm_under_two_faults_is_charged_to_the_later_one() -> None:
    """gpu0's interface fails from 1000 s on (never repaired); its loop loses cooling from 5000 s
    for 2000 s (aftermath to 7900 s). The simulator puts gpu0's state from 5000 s down to the
    cooling loss, the later fault overwriting the earlier, and labels its episodes so: the false
    alarm at 5500 s is the cooling loss's, the one at 9000 s (the loop recovered) the
    interface's, in whatever order the events come. Until 2026-12-02 both were the interface's."""
    topo = small_topology(nodes=1, gpus=2, racks=1)
    rec = Recording(Path("."), topo, {"faults": [{"id": "f1", "duration_s": None}, {"id": "f2", "duration_s": 2000.0}]})
    events = [Event(1000.0, "fault_onset", "gpu", topo.gpus[0], "f1", "tim_degradation"),
              Event(5000.0, "fault_onset", "loop", topo.loops[0], "f2", "cooling_loss")]
    findings = [pred(5500, 0), pred(5600, 0, active=False), pred(9000, 0), pred(9100, 0, active=False)]
    one = 1 / (2 * 20000 / 3600) * 1000  # one false alarm per 1000 GPU-hours
    for order in (events, events[::-1]):
        by = ev.score_kind(findings, order, THROTTLE_0_WARMUP, rec, 0.0, 20000.0)["by_fault"]
        assert set(by) == {"cooling_loss", "tim_degradation"}
        assert by["cooling_loss"]["false_alarms_per_1000_gpu_hours"] == pytest.approx(one, abs=1e-3)
        assert by["tim_degradation"]["false_alarms_per_1000_gpu_hours"] == pytest.approx(one, abs=1e-3)


def test_the_lead_time_plot_draws_the_report_s_leads(tmp_path, monkeypatch) -> None:
    """One source of truth: the histogram is of the leads the report computed (``leads_s``), of
    the kinds it scored; until 2026-12-02 the plot found leads of its own, by an older rule."""
    import matplotlib.axes

    drawn: dict = {}
    monkeypatch.setattr(matplotlib.axes.Axes, "hist",
                        lambda self, x, **kw: drawn.setdefault(kw["label"], list(x)))
    rec = Recording(Path("."), small_topology(nodes=1, gpus=2, racks=1), {"faults": []})
    # the findings would give no lead (no episode): what is drawn can only come from the report
    result = ev.RunResult(rec, {"foreshock": [pred(100, 0)]}, [], 0.0, 3000.0, 0.0, 0)
    report = {"detectors": {"foreshock": {"thermal_throttle": {"leads_s": [60.0, 600.0]}}}}
    ev.write_plots(result, report, tmp_path)
    assert drawn == {"foreshock": [1.0, 10.0]}  # minutes; power_cap was not scored: not drawn
    assert (tmp_path / "lead_times.png").exists()


def test_a_gpu_plotted_for_its_hbm_overheating_shows_that_episode_and_its_eta(tmp_path, monkeypatch) -> None:
    """GPUs are picked for thermal throttles or HBM overheating, but the plot drew only thermal
    throttle episodes and ETAs (and the 87 °C line): a GPU picked for its HBM showed neither."""
    import matplotlib.axes

    spans: list = []
    points: list = []
    lines: list = []
    monkeypatch.setattr(matplotlib.axes.Axes, "axvspan", lambda self, a, b, **kw: spans.append((a, b, kw["label"])))
    monkeypatch.setattr(matplotlib.axes.Axes, "scatter", lambda self, x, y, **kw: points.append((kw["label"], len(x))))
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", lambda self, y, **kw: lines.append(y))
    rec = Recording(Path("."), small_topology(nodes=1, gpus=2, racks=1), {"faults": []})
    events = [gpu_event(1200, "hbm_overheat_start", 0, ("f1", "cooling_loss")), gpu_event(1800, "hbm_overheat_end", 0)]
    hbm = Prediction(600.0, "gpu", 0, "hbm_overheat", 600.0, 0.9, "thermal", "", True)
    result = ev.RunResult(rec, {"foreshock": [hbm, pred(700, 0)]}, events, 0.0, 3000.0, 0.0, 0,
                          traces={0: {"ts": [0.0, 1500.0], "gpu_temp": [60.0, 70.0], "hbm_temp": [80.0, 96.0]}})
    ev.write_plots(result, {"detectors": {}}, tmp_path)
    assert spans == [(20.0, 30.0, "HBM overheat (cooling_loss)")]
    assert sorted(points) == [("foreshock HBM ETA", 1), ("foreshock throttle ETA", 1)]
    assert 95 in lines and 87 in lines  # HBM and core max operating (FACTS.md)


def test_trace_gpus_are_distinct(monkeypatch) -> None:
    """A GPU throttled by one fault and later overheating its HBM by another took two of the four
    places: one plot fewer, though other GPUs had episodes."""
    topo = small_topology(nodes=1, gpus=8, racks=1)
    rec = Recording(Path("."), topo, {"faults": []})
    events = [gpu_event(100, "thermal_throttle_start", 2, ("f1", "cooling_loss")),
              gpu_event(200, "hbm_overheat_start", 2, ("f2", "tim_degradation")),
              gpu_event(300, "thermal_throttle_start", 5, ("f2", "tim_degradation")),
              gpu_event(400, "thermal_throttle_start", 6, ("f3", "fan_failure")),
              gpu_event(500, "thermal_throttle_start", 7, ("f1", "cooling_loss"))]
    monkeypatch.setattr(ev, "read_ground_truth", lambda *a, **kw: type("GT", (), {"events": events})())
    assert ev.pick_trace_gpus(rec, count=4) == [2, 5, 6, 7]


def test_the_table_never_rounds_a_lead_up_to_one_it_missed() -> None:
    """A 299-s median read "5.0 min" beside the 5-minute useful lead it missed; 60 s read "1.0 min"
    beside a 59.6-s p10 read "60 s"."""
    assert [ev.lead_text(v) for v in (299.0, 300.0, 59.6, 60.0, 359.9, 42.0)] == \
        ["4.9 min", "5.0 min", "59 s", "1.0 min", "5.9 min", "42 s"]


def test_claims_that_outlive_the_recording_are_not_judged_whether_or_not_they_came_true() -> None:
    """Four 30-minute claims in the recording's last 30 minutes; one comes true. They cannot all
    be checked, so none is judged: precision has nothing to say. Until 2026-12-01 the one that
    came true counted and the three that could not were left out: precision 1.0."""
    topo = small_topology(nodes=1, gpus=4, racks=1)
    rec = Recording(Path("."), topo, {"faults": []})
    events = [gpu_event(9500, "thermal_throttle_start", 0), gpu_event(9600, "thermal_throttle_end", 0)]
    findings = [pred(9000, g) for g in range(4)]
    kind = ev.EventKind("thermal_throttle", "thermal_throttle_start", "thermal_throttle_end", "thermal_throttle",
                        "gpu", horizon_s=1800.0, merge_gap_s=120.0, warmup_s=0.0, censor_at_end=True)
    m = ev.score_kind(findings, events, kind, rec, 0.0, 10000.0)
    assert m["precision"] is None and m["recall"] == 1.0  # the episode was still predicted


def test_a_false_alarm_in_a_faults_aftermath_is_charged_to_that_fault() -> None:
    """The simulator attributes a fault's consequences to it for 15 minutes after its repair (a
    loop still cooling down); a false alarm then was charged to ``none``."""
    topo = small_topology(nodes=1, gpus=2, racks=1)
    rec = Recording(Path("."), topo, {"faults": [{"id": "f1", "duration_s": 1000.0}]})
    events = [Event(2000.0, "fault_onset", "gpu", topo.gpus[0], "f1", "cooling_loss")]
    findings = [pred(3100, 0), pred(3200, 0, active=False)]  # 100 s after the repair at 3000 s
    kind = ev.EventKind("thermal_throttle", "thermal_throttle_start", "thermal_throttle_end", "thermal_throttle",
                        "gpu", horizon_s=1800.0, merge_gap_s=120.0, warmup_s=0.0)
    m = ev.score_kind(findings, events, kind, rec, 0.0, 10000.0)
    assert m["by_fault"]["cooling_loss"]["false_alarms_per_1000_gpu_hours"] > 0
    assert "none" not in m["by_fault"] or not m["by_fault"]["none"]["false_alarms_per_1000_gpu_hours"]


JOB_GPUS = small_topology(nodes=1, gpus=4, racks=1)


def score_job0_claims(findings: list, events: list) -> dict:
    """Thermal claims about the four GPUs of job0 (horizon 30 min, no warm-up) over 10,000 s."""
    rec = Recording(Path("."), JOB_GPUS, {"faults": []})
    kind = ev.EventKind("thermal_throttle", "thermal_throttle_start", "thermal_throttle_end", "thermal_throttle",
                        "gpu", horizon_s=1800.0, merge_gap_s=600.0, warmup_s=0.0)
    return ev.score_kind(findings, events, kind, rec, 0.0, 10000.0)


def test_a_claim_whose_job_another_fault_stopped_is_not_judged() -> None:
    """gpu0 and gpu1 are predicted to throttle at 1000 s; at 1300 s another member of job0 falls
    off the bus and the job stops. gpu0 throttled at 1200 s, before the stop: a hit. gpu1 never
    throttles: its claim is not judged (not a false alarm). gpu2's claim at 5000 s is false."""
    events = [gpu_event(1200, "thermal_throttle_start", 0), gpu_event(1250, "thermal_throttle_end", 0),
              Event(1300.0, "job_slowdown_start", "job", "job0", "f9", "xid79", {"reason": "interrupted"})]
    findings = [pred(1000, 0), pred(1250, 0, active=False), pred(1000, 1), pred(1500, 1, active=False),
                pred(5000, 2), pred(5100, 2, active=False)]
    m = score_job0_claims(findings, events)
    assert (m["episodes"], m["recall"], m["lead_median_s"]) == (1, 1.0, 200.0)
    assert m["precision"] == pytest.approx(1 / 2)  # gpu0's hit and gpu2's false claim; gpu1 not judged


def test_a_claim_whose_job_finished_is_not_judged() -> None:
    """The schedule ends job0 at 1300 s (``job_end``, no fault): gpu1's claim made at 1000 s
    can neither come true nor be refuted while its GPU idles; gpu2's claim at 5000 s is false.
    Seed 796: a GPU predicted 8.6 min before its job ended throttled 44 min after the claim,
    when the next job loaded it."""
    events = [Event(1300.0, "job_end", "job", "job0", "", "", {"reason": "completed"}),
              Event(2400.0, "job_start", "job", "job0", "", "", {}),
              gpu_event(2500, "thermal_throttle_start", 1), gpu_event(2600, "thermal_throttle_end", 1)]
    findings = [pred(1000, 1), pred(1600, 1, active=False), pred(5000, 2), pred(5100, 2, active=False)]
    m = score_job0_claims(findings, events)
    assert m["precision"] == 0.0  # gpu2's false claim only
    assert m["false_alarms_per_1000_gpu_hours"] == pytest.approx(1 / (4 * 10000 / 3600) * 1000)
    # ... and the claim still earns the episode it predicted (within its horizon, though after the stop)
    assert (m["episodes"], m["recall"]) == (1, 1.0)
    m = score_job0_claims(findings, [e for e in events if e.type != "job_end"])
    assert m["precision"] == pytest.approx(1 / 2)  # without the job end it is a hit, judged


def test_a_claim_withdrawn_before_its_job_stopped_is_still_not_judged() -> None:
    """A claim stands until its horizon, also after its alarm is withdrawn (a throttle then is its
    hit). So a job that stops within that horizon leaves it unjudged, as it does a claim still
    active; until 2026-12-01 a withdrawn one was judged false (seed 791: thermal precision 0.850,
    0.865 once these were left out)."""
    events = [Event(1300.0, "job_end", "job", "job0", "", "", {"reason": "completed"})]
    findings = [pred(1000, 1), pred(1100, 1, active=False)]
    m = score_job0_claims(findings, events)
    assert m["precision"] is None and m["false_alarms_per_1000_gpu_hours"] == 0.0


def test_a_member_shutting_down_inside_a_slowdown_interrupts_the_job_too() -> None:
    """job0 is already slowed (a member throttling since 900 s: one ``job_slowdown_start`` with a
    slowdown, no new one when that member then shuts down at 1300 s, XID 79, and the job
    stops). gpu1's claim made at 1000 s can no longer come true: not judged. Seed 781 had 63 such
    claims (precision 0.76 until the XID counted as the interruption it is)."""
    events = [Event(900.0, "job_slowdown_start", "job", "job0", "f9", "tim_degradation", {"slowdown": 1.1}),
              gpu_event(950, "thermal_throttle_start", 3), gpu_event(1300, "thermal_throttle_end", 3),
              Event(1300.0, "xid", "gpu", JOB_GPUS.gpus[3], "f9", "tim_degradation",
                    {"code": 79, "reason": "thermal shutdown"})]
    findings = [pred(1000, 1), pred(1600, 1, active=False), pred(5000, 2), pred(5100, 2, active=False)]
    m = score_job0_claims(findings, events)
    assert m["precision"] == 0.0  # gpu2's false claim only: gpu1's is not judged
    assert m["false_alarms_per_1000_gpu_hours"] == pytest.approx(1 / (4 * 10000 / 3600) * 1000)
    other = [e for e in events if e.type != "xid"]  # without the XID, gpu1's claim is false as well
    m = score_job0_claims(findings, other)
    assert m["false_alarms_per_1000_gpu_hours"] == pytest.approx(2 / (4 * 10000 / 3600) * 1000)


def _as_naive(m: dict, want: dict) -> None:
    """``m`` agrees with the naive scorer's ``want`` on every figure the naive one gives."""
    assert {k: m[k] for k in want if k != "by_fault"} == {k: v for k, v in want.items() if k != "by_fault"}
    for fault, figures in want["by_fault"].items():
        assert {k: m["by_fault"][fault][k] for k in figures} == figures


def _psu_cap_after_a_free_one() -> tuple[list[Event], Recording]:
    """A fault-free power cap on GPU 0 lets go at 2030 s; a PSU failure's cap starts there 80 s
    later, within the kind's merge gap (120 s): an episode of its own, split off."""
    rec = Recording(Path("."), small_topology(nodes=1, gpus=4, racks=1), {"faults": [{"id": "psu1", "duration_s": None}]})
    psu = ("psu1", "psu_failure")
    events = [gpu_event(2000, "power_cap_start", 0), gpu_event(2030, "power_cap_end", 0),
              Event(2040.0, "fault_onset", "node", "node0", *psu),
              gpu_event(2110, "power_cap_start", 0, psu), gpu_event(2500, "power_cap_end", 0, psu)]
    return events, rec


@pytest.mark.parametrize("raised", [2031.0, 2080.0])
def test_an_episode_split_off_within_the_gap_can_be_predicted(raised: float) -> None:
    """An alarm raised after the fault-free cap let go was taken as raised "during" it (within the
    merge gap), so not judged: the PSU cap could never be predicted, yet was scored as missed."""
    kind = ev.EVENT_KINDS["power_cap"]
    events, rec = _psu_cap_after_a_free_one()
    # withdrawn within the gap after the PSU cap (kept up past it, it would claim anew: see
    # test_an_alarm_kept_up_through_a_throttle_is_scored_as_one_raised_again_at_its_next_statement)
    findings = [pred(raised, 0, event="power_cap"), pred(2550.0, 0, active=False, event="power_cap")]
    m = ev.score_kind(findings, events, kind, rec, 0.0, 5000.0)
    assert m["by_fault"]["psu_failure"]["recall"] == 1.0
    assert m["leads_s"] == [2110.0 - raised]
    assert m["precision"] == 1.0
    _as_naive(m, naive_score(findings, events, kind, rec, 0.0, 5000.0))


def test_an_alarm_raised_while_an_episode_holds_still_claims_nothing_about_the_split_off_one() -> None:
    """Raised during the fault-free cap (not after it), an alarm is still "it may happen again":
    not judged, whatever comes within the gap."""
    kind = ev.EVENT_KINDS["power_cap"]
    events, rec = _psu_cap_after_a_free_one()
    findings = [pred(2020.0, 0, event="power_cap"), pred(2550.0, 0, active=False, event="power_cap")]
    m = ev.score_kind(findings, events, kind, rec, 0.0, 5000.0)
    assert m["recall"] == 0.0 and m["precision"] is None
    # kept up to the end instead, past the gap after the PSU cap (2620 s), it claims anew from its
    # next statement (2920 s): seven statements to 5000 s, none of them true
    kept = ev.score_kind(findings[:1], events, kind, rec, 0.0, 5000.0)
    assert kept["recall"] == 0.0 and kept["precision"] == 0.0
    assert kept["false_alarms_per_1000_gpu_hours"] == pytest.approx(7 / (4 * 5000 / 3600) * 1000, abs=1e-3)
    _as_naive(kept, naive_score(findings[:1], events, kind, rec, 0.0, 5000.0))
    _as_naive(m, naive_score(findings, events, kind, rec, 0.0, 5000.0))


def test_a_hit_on_a_warm_up_episode_is_not_judged_for_precision() -> None:
    """An episode in the warm-up is not scored for recall; an alarm that predicted it had counted
    as a true positive all the same (a fault with 0 episodes and precision 1.0)."""
    kind = ev.EVENT_KINDS["thermal_throttle"]
    rec = Recording(Path("."), small_topology(nodes=1, gpus=4, racks=1), {"faults": [{"id": "f1", "duration_s": None}]})
    tim = ("f1", "tim_degradation")
    events = [Event(10.0, "fault_onset", "gpu", "node0/gpu0", *tim),
              gpu_event(300, "thermal_throttle_start", 0, tim), gpu_event(400, "thermal_throttle_end", 0, tim)]
    findings = [pred(100, 0), pred(200, 0, active=False), pred(3000, 1)]  # a hit in the warm-up; a false alarm
    m = ev.score_kind(findings, events, kind, rec, 0.0, 9000.0)
    assert m["precision"] == 0.0
    assert "tim_degradation" not in m["by_fault"] or m["by_fault"]["tim_degradation"]["precision"] is None
    _as_naive(m, naive_score(findings, events, kind, rec, 0.0, 9000.0))


def test_one_detector_withdrawing_does_not_end_anothers_alarm() -> None:
    """All detectors' predictions of a GPU were one on/off stream: A's withdrawal closed the alarm
    B had raised and still held, and the throttle B predicted was scored as missed."""
    rec = Recording(Path("."), small_topology(nodes=1, gpus=4, racks=1), {})
    events = [gpu_event(5000, "thermal_throttle_start", 0), gpu_event(5100, "thermal_throttle_end", 0)]

    def by(detector: str, t: float, active: bool = True) -> Prediction:
        return Prediction(t, "gpu", 0, "thermal_throttle", 60.0, 0.9, detector, "", active)

    findings = [by("A", 1000.0), by("B", 1500.0), by("A", 1600.0, active=False)]
    assert ev.alarm_intervals(findings, KIND, rec.topology, 9000.0) == {"node0/gpu0": [(1000.0, 9000.0)]}
    assert ev.score_kind(findings, events, KIND, rec, 0.0, 9000.0)["recall"] == 1.0
    # one detector's spans come out as they went in
    alone = [by("A", 1000.0), by("A", 1600.0, active=False), by("A", 1600.0), by("A", 2000.0, active=False)]
    assert ev.alarm_intervals(alone, KIND, rec.topology, 9000.0) == {"node0/gpu0": [(1000.0, 1600.0), (1600.0, 2000.0)]}


def test_every_statement_during_which_the_job_stopped_is_left_unjudged() -> None:
    """One alarm, up from 1000 to 5200 s, while its GPU's job stops twice: the schedule ends it at
    1300 s, the next one is interrupted by a member falling off the bus at 5000 s. The statements
    at 1000 s (the first stop) and at 4600 s (the second) say nothing an idle GPU could confirm;
    only the one at 2800 s is judged (false). Until 2026-12-04 only the statement holding the
    span's first stop was left out: 2 false statements (the audit's repro)."""
    kind = ev.EventKind("thermal_throttle", "thermal_throttle_start", "thermal_throttle_end", "thermal_throttle",
                        "gpu", horizon_s=1800.0, merge_gap_s=600.0, warmup_s=0.0)
    rec = Recording(Path("."), small_topology(nodes=1, gpus=4, racks=1), {"faults": []})
    stops = [Event(1300.0, "job_end", "job", "job0", "", "", {"reason": "completed"}),
             Event(2000.0, "job_start", "job", "job0", "", "", {}),
             Event(5000.0, "job_slowdown_start", "job", "job0", "f9", "xid79", {"reason": "interrupted"})]
    findings = [pred(1000, 1), pred(5200, 1, active=False)]
    m = ev.score_kind(findings, stops, kind, rec, 0.0, 10000.0)
    gpu_hours = 4 * 10000 / 3600
    assert m["precision"] == 0.0 and m["false_alarms_per_1000_gpu_hours"] == pytest.approx(1 / gpu_hours * 1000)
    for alone in (stops[:1], stops[2:]):  # either stop alone leaves its own statement out: two false
        one = ev.score_kind(findings, alone, kind, rec, 0.0, 10000.0)
        assert one["false_alarms_per_1000_gpu_hours"] == pytest.approx(2 / gpu_hours * 1000)
    _as_naive(m, naive_score(findings, stops, kind, rec, 0.0, 10000.0))


def test_the_table_never_rounds_a_missed_target_into_a_met_one():
    """Recall and precision print rounded down, false alarms up: 26 of 29 (0.8966) printed "0.90"
    beside a recall target of 0.9 it missed, and 1.004 false alarms per 1000 GPU-h "1.00" beside a
    target of at most 1 (an audit, 2026-12-05); figures on the line print as they are."""
    assert (ev.share_text(26 / 29), ev.share_text(0.9), ev.share_text(1.0), ev.share_text(0.0)) == \
        ("0.89", "0.90", "1.00", "0.00")
    assert (ev.rate_text(1.004), ev.rate_text(1.0), ev.rate_text(0.0), ev.rate_text(0.48)) == \
        ("1.01", "1.00", "0.00", "0.48")
    m = {"episodes": 29, "recall": 26 / 29, "recall_at_min_lead": 26 / 29, "precision": 26 / 29,
         "lead_median_s": 360.0, "lead_p10_s": 300.0, "false_alarms_per_1000_gpu_hours": 1.004, "by_fault": {}}
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(ev.render_table({"detectors": {"foreshock": {"thermal_throttle": m}}}))
    row = next(line for line in console.export_text().splitlines() if " 29 " in line)
    assert "0.90" not in row and row.count("0.89") == 3 and "1.01" in row


def test_evaluate_refuses_an_empty_detector_list_and_keeps_the_report(tmp_path):
    """``--detectors ' '`` ran an empty bank: it read no sample, said the recording held none, and
    had emptied the report folder first."""
    from foreshock.cli.main import cli

    report = tmp_path / "out"
    report.mkdir()
    (report / "report.json").write_text("{}")
    result = CliRunner().invoke(cli, ["evaluate", str(tmp_path), "--detectors", " , ", "--report", str(report)])
    assert result.exit_code == 2 and "--detectors names no set" in result.output
    assert (report / "report.json").exists()
