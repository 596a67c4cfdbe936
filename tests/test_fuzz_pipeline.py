"""A property test of the embedded pipeline under fuzzed telemetry.

The project's input rule: malformed records, NaN, counter resets and wraps, out-of-order and
duplicate timestamps, unknown entities, ...: the pipeline keeps running, counts each problem in a
metric, logs the reason once; nothing is silently dropped.

A plausible base stream (the simulator's cluster on a small topology: 2 racks, 4 nodes of 8 GPUs, 40
links and their 80 optics, 2 jobs; every entity kind, 40 ticks of 10 s; a cooling loss, a PSU failure
and a degrading optic, so that it has anomalies, predictions and incidents) is fed to an
:class:`EmbeddedPipeline` running the default detector bank and the incident engine, with faults that
hypothesis injects: NaN, ±inf and sentinel values, counters reset / going backwards / wrapping /
jumping, timestamps NaN / duplicated / out of order / far ahead / epoch zero / in ms, slots out of
range, empty frames, missing and extra columns, other dtypes, rows repeated, frames sent twice or
swapped. After the run (and the end of the stream) it checks that:

1. nothing raises (an extra column is refused where the frame is built: ``FrameError``, the contract);
2. every finding is well-formed (finite stamp, a slot of its kind, finite ETA or the -1 "no finite
   forecast", a confidence in 0..1, finite scores, an incident's documented states and root kinds);
3. ``/metrics`` renders and parses, with no NaN sample but the documented ones
   (``foreshock_prediction_eta_seconds``: "NaN: no finite forecast");
4. the input guard accounts for every row (``core/guard.py``: "counts every row it sets aside"):
   per frame, rows in = rows let through + rows counted under one of ``guard.REASONS``; the rows no
   state can save (unknown slot, NaN/inf stamp, a (slot, ts) repeated in the frame, a frame sent
   again) are among them; what it lets through holds only finite stamps, known slots, no infinity,
   no value outside its field's valid range; where it refuses no row, its ``inf_values``,
   ``out_of_range`` and ``not_whole`` counts are exactly the frame's; every problem counted is
   on ``/metrics`` as counted; ``end_stream`` twice tells the same.

Beside it: a counter fault (reset, fall, negative reading, jump past its bound) on a counter the
default bank reads is counted by a detector; ``EmbeddedPipeline.run``'s stats account for every
row and finding. What it found on 2026-12-05, mended then: counters read outside ``CounterRates``
(GPU ``energy`` by the thermal fit, link ``tx_data`` by the incident engine) counted none of their
faults; ``Frame.from_arrow`` took a column named twice silently (the second's values replaced the
first's).
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from foreshock.detectors.bank import DetectorBank
from foreshock.exporters.prometheus import build_registry
from foreshock.fields import field_names, get_field, valid_bounds, whole_only
from foreshock.findings import Anomaly, Finding, Incident, Prediction
from foreshock.frames import Frame, FrameError
from foreshock.guard import REASONS, valid_board_ids
from foreshock.simulator import ClusterSimulator
from foreshock.simulator.scenario import FaultSpec, Scenario
from foreshock.streams.embedded import EmbeddedPipeline

from conftest import make_small_topology

KINDS = ("gpu", "link", "optic", "node", "rack", "job")
TICKS = 40
INTERVAL_S = 10.0
NAN_OK = {"foreshock_prediction_eta_seconds"}  # "(NaN: no finite forecast)", exporters/prometheus.py
INCIDENT_STATES = {"open", "growing", "stable", "resolved"}
ROOT_KINDS = {"cooling_loop", "rack", "node", "gpu", "pdu", "leaf", "optic", "link", "job", "external"}


TOPOLOGY = make_small_topology()
SIZES = {kind: TOPOLOGY.size(kind) for kind in KINDS}
COUNTERS = {kind: [n for n in field_names(kind) if get_field(n).is_counter] for kind in KINDS}


# faults of the cluster itself from the first minutes, so that the run has findings of every type
# to check (anomalies, congestion and power-cap predictions, incidents opening and growing)
BASE_SCENARIO = Scenario("fuzz-base", params={"job_churn": False}, faults=[
    FaultSpec("cooling_loss", None, 0.0, None, {"flow_fraction": 0.02, "ramp_s": 30.0}),
    FaultSpec("psu_failure", None, 100.0, 200.0, {"brake_s": 60.0, "derated_limit_w": 400.0}),
    FaultSpec("optic_degradation", None, 0.0, None, {"initial_db": 6.0, "db_per_hour": 60.0}),
])


@lru_cache(maxsize=1)
def base_stream() -> tuple[tuple[tuple[str, np.ndarray, np.ndarray, dict[str, np.ndarray]], ...], ...]:
    """The clean stream: per tick, per kind, (kind, ts, slot, columns), read-only (copied per example)."""
    sim = ClusterSimulator(TOPOLOGY, scenario=BASE_SCENARIO, seed=2, interval=INTERVAL_S, warmup_s=0.0)
    ticks = []
    for frames in sim.iter_ticks(TICKS * INTERVAL_S):
        tick = []
        for f in frames:
            cols = {k: v.copy() for k, v in f.columns.items()}
            for arr in (f.ts, f.slot, *cols.values()):
                arr.flags.writeable = False
            tick.append((f.kind, f.ts.copy(), f.slot.copy(), cols))
        ticks.append(tuple(tick))
    assert len(ticks) == TICKS and [k for k, *_ in ticks[0]] == list(KINDS)
    return tuple(ticks)


# ---- faults -------------------------------------------------------------------------------------

VALUES = (math.nan, math.inf, -math.inf, 65535.0, -1.0, 1e300, -1e300, 0.0, 4294967295.0, 0.5, 1e-300)
TS_MODES = ("nan", "inf", "-inf", "dup", "back", "near", "future", "zero", "ms")
SLOTS = (-5, -1, 10**6, 2**31 - 1, "size")
COUNTER_MODES = ("reset", "backwards", "wrap", "jump", "negative")
FRAME_MODES = ("empty", "drop_col", "extra_col", "int", "float32", "slot_int64", "slot_float", "repeat",
               "resend", "swap_next", "shuffle", "all_future", "all_ms", "all_back", "all_nan_ts",
               "boards_new", "boards_rotate", "board_twice", "boards_dropped")


@st.composite
def a_fault(draw: Any) -> tuple[Any, ...]:
    tick = draw(st.integers(0, TICKS - 1))
    what = draw(st.sampled_from(("value", "value", "ts", "ts", "slot", "counter", "counter", "frame", "frame", "end")))
    if what == "end":  # the stream ended (a replay's end, watch stopped) before the tick, and goes on
        return ("end", tick)
    kind = draw(st.sampled_from(KINDS))
    if what == "counter":
        kind = draw(st.sampled_from(("gpu", "link", "optic")))
        return ("counter", tick, kind, draw(st.integers(0, SIZES[kind] - 1)),
                draw(st.sampled_from(COUNTERS[kind])), draw(st.sampled_from(COUNTER_MODES)))
    row = draw(st.integers(0, SIZES[kind] - 1))
    if what == "value":
        value = draw(st.one_of(st.sampled_from(VALUES), st.floats(), st.integers(-(2**53), 2**53).map(float)))
        return ("value", tick, kind, row, draw(st.sampled_from(field_names(kind))), value)
    if what == "ts":
        mode = draw(st.sampled_from((*TS_MODES, "offset")))
        if mode == "offset":  # anywhere: within the 10-ms spacing of the row before, or years off
            return ("ts", tick, kind, row, mode, draw(st.floats(-1e12, 1e12) | st.floats(-0.02, 0.02)))
        return ("ts", tick, kind, row, mode)
    if what == "slot":
        return ("slot", tick, kind, row, draw(st.sampled_from(SLOTS)))
    return ("frame", tick, kind, draw(st.sampled_from(FRAME_MODES)), draw(st.sampled_from(field_names(kind))),
            row, draw(st.integers(1, 3)))


FAULTS = st.lists(a_fault(), max_size=14)


def build_stream(faults: list[tuple[Any, ...]]) -> list[tuple[dict[str, Any], frozenset[str]]]:
    """The base stream with ``faults``: per frame to send, its constructor arguments and what it
    was made of (``"extra_col"``: the frame must be refused where it is built; ``"resend"``: a
    frame sent again, every row of which the guard must refuse)."""
    ticks: list[list[dict[str, Any]]] = [
        [{"kind": k, "ts": ts.copy(), "slot": slot.copy(), "columns": {n: c.copy() for n, c in cols.items()}}
         for k, ts, slot, cols in tick] for tick in base_stream()]
    at = {kind: i for i, kind in enumerate(KINDS)}
    # counters first: a counter's fault holds from its tick on (a reset, a wrap, a jump stays)
    for f in faults:
        if f[0] != "counter":
            continue
        _, tick, kind, slot, name, mode = f
        v_at = ticks[tick][at[kind]]["columns"][name][slot]
        for t in range(tick, TICKS if mode != "negative" else tick + 1):
            col = ticks[t][at[kind]]["columns"][name]
            v = col[slot]
            if mode == "reset":
                col[slot] = v - v_at
            elif mode == "backwards":
                col[slot] = v * 0.5
            elif mode == "wrap":
                col[slot] = (v - v_at + 2.0**32 - 5.0) % 2.0**32  # 2**32 - 5 at the tick, then wraps
            elif mode == "jump":
                col[slot] = v + 1e15
            else:
                col[slot] = -v - 1.0
    for f in faults:
        if f[0] == "value":
            _, tick, kind, row, name, value = f
            ticks[tick][at[kind]]["columns"][name][row] = value
        elif f[0] == "ts":
            _, tick, kind, row, mode, *offset = f
            ts = ticks[tick][at[kind]]["ts"]
            ts[row] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "dup": ts[row] - INTERVAL_S,
                       "back": ts[row] - 2.5 * INTERVAL_S, "near": ts[row] - INTERVAL_S + 1e-3,
                       "future": ts[row] + 1e9, "zero": 0.0, "ms": ts[row] * 1e3,
                       "offset": ts[row] + (offset[0] if offset else 0.0)}[mode]
        elif f[0] == "slot":
            _, tick, kind, row, value = f
            ticks[tick][at[kind]]["slot"][row] = SIZES[kind] if value == "size" else value
    out: list[tuple[dict[str, Any], frozenset[str]]] = []
    frame_faults = [f for f in faults if f[0] == "frame"]
    ends = {f[1] for f in faults if f[0] == "end"}
    for t, tick in enumerate(ticks):
        for i, args in enumerate(tick):
            sends: list[tuple[dict[str, Any], frozenset[str]]] = [
                (args, frozenset({"end_before"} if i == 0 and t in ends else ()))]
            for _, ft, kind, mode, name, row, n in frame_faults:
                if ft != t or kind != args["kind"]:
                    continue
                sends = [(_frame_fault(a, mode, name, row, n), tags | {mode} - {"resend"}) for a, tags in sends] + (
                    [(sends[-1][0], sends[-1][1] | {"resend"})] if mode == "resend" else [])
            out += sends
    # whole frames out of order: a kind's frame of tick t sent after its frame of tick t + 1
    for _, ft, kind, mode, *_ in frame_faults:
        if mode == "swap_next" and ft + 1 < TICKS:
            idx = [i for i, (a, _) in enumerate(out) if a["kind"] == kind]
            first = [i for i in idx if _tick_of(out[i][0]) == ft]
            second = [i for i in idx if _tick_of(out[i][0]) == ft + 1]
            if first and second:
                i, j = first[0], second[0]
                out[i], out[j] = out[j], out[i]
    return out


def _tick_of(args: dict[str, Any]) -> float:
    stamps = np.asarray(args["ts"], dtype=np.float64)
    stamps = stamps[np.isfinite(stamps)]
    return round(float(np.median(stamps) - base_stream()[0][0][1][0]) / INTERVAL_S) if len(stamps) else -1


def _frame_fault(args: dict[str, Any], mode: str, name: str, row: int, n: int) -> dict[str, Any]:
    args = {**args, "columns": dict(args["columns"])}
    rows = len(args["ts"])
    if mode == "empty":
        return {"kind": args["kind"], "ts": np.empty(0), "slot": np.empty(0, np.int32), "columns": {}}
    if mode == "drop_col":
        args["columns"].pop(name, None)
    elif mode == "extra_col":
        args["columns"]["no_such_field"] = np.zeros(rows)
    elif mode == "int":  # a source sending whole numbers as integers (its finite columns)
        args["columns"] = {k: (np.asarray(v).astype(np.int64) if np.isfinite(np.asarray(v, np.float64)).all()
                               and np.abs(np.asarray(v, np.float64)).max(initial=0) < 2**62 else v)
                           for k, v in args["columns"].items()}
    elif mode == "float32":  # single precision: 1e300 becomes inf, stamps are kept to 128 s
        with np.errstate(over="ignore"):
            args["columns"] = {k: np.asarray(v).astype(np.float32) for k, v in args["columns"].items()}
            args["ts"] = np.asarray(args["ts"]).astype(np.float32)
    elif mode == "slot_int64":
        args["slot"] = np.asarray(args["slot"]).astype(np.int64)
    elif mode == "slot_float":
        args["slot"] = np.asarray(args["slot"]).astype(np.float64)
    elif mode == "repeat" and rows:
        r = row % rows
        pick = np.r_[np.arange(rows), np.full(n, r)]
        args = {**args, "ts": np.asarray(args["ts"])[pick], "slot": np.asarray(args["slot"])[pick],
                "columns": {k: np.asarray(v)[pick] for k, v in args["columns"].items()}}
    elif mode in ("all_future", "all_ms", "all_back", "all_nan_ts"):  # a whole frame by a wrong clock
        ts = np.asarray(args["ts"], dtype=np.float64)
        args["ts"] = {"all_future": ts + 1e9, "all_ms": ts * 1e3, "all_back": ts - 3600.0,
                      "all_nan_ts": np.full_like(ts, np.nan)}[mode]
    elif mode.startswith("board") and "board_id" in args["columns"] and rows:
        ids = np.asarray(args["columns"]["board_id"], dtype=np.float64).copy()
        if mode == "boards_new":  # an RMA of every board from ``row`` on
            ids[row % rows:] = 7_000_000 + np.arange(rows - row % rows) + 1000 * n
        elif mode == "boards_rotate":  # boards read at other indices (renumbered, across nodes too)
            ids = np.roll(ids, n)
        elif mode == "board_twice":  # one board read in two slots at once
            ids[row % rows] = ids[(row + n) % rows]
        else:  # not read
            ids[: row % rows + 1] = np.nan
        args["columns"]["board_id"] = ids
    elif mode == "shuffle" and rows:
        pick = np.random.default_rng(row).permutation(rows)
        args = {**args, "ts": np.asarray(args["ts"])[pick], "slot": np.asarray(args["slot"])[pick],
                "columns": {k: np.asarray(v)[pick] for k, v in args["columns"].items()}}
    return args


# ---- properties ---------------------------------------------------------------------------------

def guard_refused(pipeline: EmbeddedPipeline) -> int:
    return sum(pipeline.health.problems.get((pipeline.guard.stage, r), 0) for r in REASONS)


def problems(pipeline: EmbeddedPipeline, reason: str) -> int:
    return pipeline.health.problems.get((pipeline.guard.stage, reason), 0)


def must_refuse(frame: Frame) -> int:
    """Rows of ``frame`` the guard refuses whatever its state: an unknown slot, a NaN or infinite
    stamp, a (slot, ts) of a row before it in the frame (refused as that row was, or a duplicate)."""
    known = (frame.slot >= 0) & (frame.slot < SIZES[frame.kind])
    stamped = known & np.isfinite(frame.ts)
    pairs = Counter(zip(frame.slot[stamped].tolist(), frame.ts[stamped].tolist()))
    return int((~known).sum() + (known & ~np.isfinite(frame.ts)).sum() + sum(c - 1 for c in pairs.values()))


def check_frame_accounting(pipeline: EmbeddedPipeline, frame: Frame, tags: frozenset[str]) -> list[Finding]:
    kind = frame.kind
    before = guard_refused(pipeline)
    names = tuple(n for n in field_names(kind) if n != "board_id")
    values = {n: frame.columns[n].copy() for n in names}  # (the guard scrubs them in place)
    counts_before = {r: problems(pipeline, r) for r in ("inf_values", *(f"out_of_range: {n}" for n in names),
                                                          *(f"not_whole: {n}" for n in names))}
    rows_in = len(frame)
    expected_refused = must_refuse(frame)

    clean, found = pipeline.process_rows(frame)

    refused = guard_refused(pipeline) - before
    assert rows_in == len(clean) + refused, f"{kind} frame: {rows_in} rows, {len(clean)} through, {refused} counted"
    assert refused >= expected_refused, f"{kind} frame: {expected_refused} rows that no state lets through"
    if "resend" in tags:
        assert len(clean) == 0, f"{kind} frame sent again: {len(clean)} of its rows let through again"
    # what the guard lets through
    assert np.isfinite(clean.ts).all()
    assert ((clean.slot >= 0) & (clean.slot < SIZES[kind])).all()
    lo, hi = valid_bounds(kind, names)
    whole = whole_only(kind, names)
    for c, n in enumerate(names):
        col = clean.columns[n]
        ok = np.isnan(col) | ((col >= lo[c]) & (col <= hi[c]))
        assert ok.all(), f"{kind}.{n}: {col[~ok][:5]} let through (valid {lo[c]}..{hi[c]})"
        if whole[c]:
            assert (np.isnan(col) | (col == np.floor(col))).all(), f"{kind}.{n}: fractional values let through"
    if "board_id" in clean.columns:
        assert valid_board_ids(clean.columns["board_id"]).all()
    if refused == 0:  # every row through: the guard's value counts are exactly the frame's
        infs = sum(int(np.isinf(v).sum()) for v in values.values())
        assert problems(pipeline, "inf_values") - counts_before["inf_values"] == infs
        for c, n in enumerate(names):
            v = values[n]
            finite = np.isfinite(v)
            outside = int((finite & ((v < lo[c]) | (v > hi[c]))).sum())
            assert problems(pipeline, f"out_of_range: {n}") - counts_before[f"out_of_range: {n}"] == outside, n
            if whole[c]:
                fractional = int((finite & (v >= lo[c]) & (v <= hi[c]) & (v != np.floor(v))).sum())
                assert problems(pipeline, f"not_whole: {n}") - counts_before[f"not_whole: {n}"] == fractional, n
    return found


def check_finding(f: Finding) -> None:
    assert math.isfinite(f.ts), f
    if isinstance(f, (Anomaly, Prediction)):
        assert f.entity_kind in SIZES, f
        assert 0 <= f.slot < SIZES[f.entity_kind], f
    if isinstance(f, Anomaly):
        assert math.isfinite(f.score), f
    elif isinstance(f, Prediction):
        # a finite ETA, or -1 for "no finite forecast" (exporters/prometheus.py: ``eta_s < 0``)
        assert math.isfinite(f.eta_s) and (f.eta_s >= 0 or f.eta_s == -1.0), f
        assert math.isfinite(f.confidence) and 0.0 <= f.confidence <= 1.0, f  # "Confidence ... (0-1)"
    elif isinstance(f, Incident):
        assert f.state in INCIDENT_STATES and f.root_kind in ROOT_KINDS, f
        assert all(math.isfinite(eta) for _, eta in f.predicted_members), f
        assert all(math.isfinite(r) for _, r in f.jobs), f
        assert math.isfinite(f.gpu_hours_at_risk_per_hour) and f.gpu_hours_at_risk_per_hour >= 0, f
        assert f.findings >= 0, f
    else:
        raise AssertionError(f"not a finding: {f!r}")


def check_exposition(pipeline: EmbeddedPipeline) -> None:
    text = generate_latest(build_registry(pipeline.store)).decode()
    bad = []
    exported: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "foreshock_input_problems_total":
                exported[(s.labels["stage"], s.labels["reason"])] = s.value
            if math.isnan(s.value) and family.name not in NAN_OK:
                bad.append(f"{s.name}{s.labels} NaN")
            elif math.isinf(s.value):
                bad.append(f"{s.name}{s.labels} {s.value}")
    assert not bad, "\n".join(bad[:10])
    # every problem counted is on /metrics, as counted
    assert exported == {k: float(v) for k, v in pipeline.health.problems.items()}


def run_pipeline(faults: list[tuple[Any, ...]]) -> EmbeddedPipeline:
    pipeline = EmbeddedPipeline(TOPOLOGY, DetectorBank.from_names(TOPOLOGY, None), gauge_interval_s=0.0)
    findings: list[Finding] = []
    sends = build_stream(faults)
    for n, (args, tags) in enumerate(sends):
        if "end_before" in tags:
            told = pipeline.end_stream()
            assert pipeline.end_stream() == told  # "Once per end: called again ... returns what it told"
            findings += told
        if "extra_col" in tags:
            with pytest.raises(FrameError):  # refused where it is built (the contract); the source counts it
                Frame(**args)
            args = {**args, "columns": {k: v for k, v in args["columns"].items() if k != "no_such_field"}}
        frame = Frame(**args)
        findings += check_frame_accounting(pipeline, frame, tags)
        if n == len(sends) // 2:
            check_exposition(pipeline)
    findings += pipeline.end_stream()
    for f in findings:
        check_finding(f)
    snap = pipeline.store.snapshot()
    kept: list[Finding] = [*snap.predictions, *snap.anomalies]
    for f in kept:
        check_finding(f)
    check_exposition(pipeline)
    return pipeline


def test_the_base_stream_is_clean() -> None:
    """The base stream passes the guard without a refused row (its faults are the injected ones)."""
    pipeline = run_pipeline([])
    assert guard_refused(pipeline) == 0, pipeline.health.problems


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(FAULTS)
@example([("ts", 5, "gpu", 3, "nan"), ("slot", 6, "link", 0, 10**6), ("frame", 7, "optic", "resend", "los", 0, 1)])
@example([("counter", 3, "gpu", 2, "energy", "wrap"), ("counter", 10, "link", 1, "tx_data", "reset"),
          ("counter", 12, "optic", 4, "rx_bits", "backwards"), ("counter", 4, "link", 3, "symbol_error", "jump")])
@example([("value", 8, "gpu", 0, "gpu_temp", 65535.0), ("value", 9, "gpu", 1, "throttle_reasons", 0.5),
          ("value", 9, "node", 1, "fan_speed", math.inf), ("frame", 11, "rack", "float32", "inlet_temp", 0, 1),
          ("value", 11, "rack", 0, "inlet_temp", 1e300)])
@example([("frame", 2, "gpu", "repeat", "gpu_temp", 5, 3), ("frame", 3, "job", "swap_next", "step_time", 0, 1),
          ("frame", 4, "link", "empty", "tx_data", 0, 1), ("frame", 5, "node", "extra_col", "psu_power", 0, 1),
          ("ts", 20, "gpu", 7, "future"), ("ts", 21, "rack", 1, "zero"), ("ts", 22, "optic", 9, "ms")])
def test_the_pipeline_counts_every_fault_and_keeps_its_outputs_well_formed(faults: list[tuple[Any, ...]]) -> None:
    run_pipeline(faults)


# ---- counters: a counter fault on a counter the default bank reads is counted ------------------

def _counted_counters() -> list[tuple[str, str]]:
    """The counters the default bank reads through ``detectors/counters.py``'s ``CounterRates``,
    whose problems (``report_problems``) are counted: "counters going backwards or negative"
    (docs/bad-input.md), a rise faster than the counter can count (``implausible_rise``)."""
    from foreshock.detectors import congestion, link_errors
    return sorted({*(("link", n) for n in (*congestion.COUNTERS, *link_errors.COUNTERS)),
                   ("optic", "rx_bits"), ("optic", "rx_corrected_bits"), ("gpu", "ecc_dbe")})


COUNTED = _counted_counters()
# a fault each mode makes of a counter that moved (a reset, a fall that stays, a negative reading,
# a jump past any physical bound): none is what the counter can do, each must be counted
SURE_MODES = ("reset", "backwards", "negative", "jump")


@lru_cache(maxsize=1)
def _clean_detector_problems() -> int:
    return _detector_problems(run_pipeline([]))


def _detector_problems(pipeline: EmbeddedPipeline) -> int:
    return sum(n for (stage, _), n in pipeline.health.problems.items() if stage != pipeline.guard.stage)


def counter_fault_is_counted(kind: str, name: str, slot: int, tick: int, mode: str) -> None:
    """One counter fault alone in the stream, on a counter that moved before it (a reset or a fall
    of a counter standing at 0 is no fault): counted by some detector (a stage other than the guard's,
    which leaves counters to the detectors: ``Field.valid``)."""
    col = [c for k, _, _, c in base_stream()[tick] if k == kind][0][name]
    before = [c for k, _, _, c in base_stream()[tick - 1] if k == kind][0][name]
    if not (np.isfinite(col[slot]) and np.isfinite(before[slot])):
        return  # not read: no fault made
    if mode in ("reset", "backwards") and not col[slot] > 0:
        return  # nothing to reset
    if mode == "backwards" and not col[slot] * 0.5 < before[slot]:
        return  # half of it is still above the reading before: no fall
    pipeline = run_pipeline([("counter", tick, kind, slot, name, mode)])
    assert _detector_problems(pipeline) > _clean_detector_problems(), (
        f"{kind}.{name} of slot {slot}: '{mode}' at tick {tick} not counted; problems {dict(pipeline.health.problems)}")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(COUNTED), st.integers(0, 7), st.integers(2, TICKS - 3), st.sampled_from(SURE_MODES))
@example(("link", "xmit_wait"), 1, 10, "reset")
@example(("optic", "rx_bits"), 1, 10, "backwards")
@example(("gpu", "ecc_dbe"), 1, 10, "jump")
@example(("link", "symbol_error"), 1, 10, "negative")
def test_a_counter_fault_is_counted(counter: tuple[str, str], slot: int, tick: int, mode: str) -> None:
    counter_fault_is_counted(*counter, slot, tick, mode)


@settings(deadline=None, phases=[Phase.explicit])
@given(st.sampled_from([("gpu", "energy"), ("link", "tx_data")]), st.just(1), st.just(10), st.sampled_from(SURE_MODES))
@example(("gpu", "energy"), 1, 10, "negative")
@example(("gpu", "energy"), 1, 10, "reset")
@example(("link", "tx_data"), 1, 10, "reset")
@example(("link", "tx_data"), 1, 10, "jump")
def test_a_fault_of_a_counter_read_outside_counter_rates_is_counted(counter: tuple[str, str], slot: int, tick: int,
                                                                     mode: str) -> None:
    counter_fault_is_counted(*counter, slot, tick, mode)


# ---- the run's own accounting (``EmbeddedPipeline.run``, what ``replay`` and ``demo`` print) ------

@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(FAULTS)
@example([("ts", 5, "gpu", 3, "nan"), ("frame", 6, "rack", "all_future", "inlet_temp", 0, 1),
          ("frame", 7, "link", "repeat", "tx_data", 2, 2), ("end", 20)])
def test_a_run_accounts_for_every_row_and_finding(faults: list[tuple[Any, ...]]) -> None:
    frames = [Frame(**{**args, "columns": {k: v for k, v in args["columns"].items() if k != "no_such_field"}})
              for args, _ in build_stream(faults)]
    rows = sum(len(f) for f in frames)
    pipeline = EmbeddedPipeline(TOPOLOGY, DetectorBank.from_names(TOPOLOGY, None))
    stats = pipeline.run(frames)
    assert stats.frames == len(frames) and stats.samples == rows
    # every row read was let through or counted (RunStats.accepted: "rows the input guard let through")
    assert stats.accepted + guard_refused(pipeline) == rows
    assert sum(pipeline.health.samples.values()) == stats.accepted  # foreshock_samples_processed_total
    # every finding the run counted reached the sinks (foreshock_findings_total), and none other
    assert stats.by_type == dict(pipeline.health.findings) and stats.findings == sum(stats.by_type.values())
    if stats.accepted:
        assert math.isfinite(stats.start_ts) and math.isfinite(stats.telemetry_s) and stats.telemetry_s >= 0
    check_exposition(pipeline)


# ---- a malformed Arrow batch (how frames come from a recording or Kafka) -----------------------

@pytest.mark.parametrize("twice", ["inlet_temp", "ts", "slot"])
def test_an_arrow_batch_naming_a_column_twice_is_refused(twice: str) -> None:
    import pyarrow as pa

    extra = {"inlet_temp": pa.array([99.0, 99.0]), "ts": pa.array([5.0, 6.0]), "slot": pa.array([1, 0], pa.int32())}
    batch = pa.RecordBatch.from_arrays(
        [pa.array([1.0, 2.0]), pa.array([0, 1], pa.int32()), pa.array([20.0, 21.0]), extra[twice]],
        ["ts", "slot", "inlet_temp", twice])
    with pytest.raises(FrameError):
        Frame.from_arrow(batch, "rack")
