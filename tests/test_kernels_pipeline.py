"""Kernels of the first detectors and the input guard, each against a naive reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.ewma_cusum import RobustZScoreDetector
from foreshock.detectors.throttle_bits import ThrottleBitsDetector
from foreshock.findings import Anomaly
from foreshock.frames import Frame
from foreshock.guard import MIN_SPACING_S, REASONS, SPACING_ROUNDING_S, InputGuard, _guard_kernel
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

pytestmark = pytest.mark.kernel

TOPO = Topology.from_gpu_hosts([(f"n{i}", g) for i in range(2) for g in range(4)])  # 8 GPUs


# ---- naive references -------------------------------------------------------------------------
def reference_ewma_cusum(slots, values, n_slots, alpha, clip, drift, threshold, warmup, min_scale):
    """Point-by-point Python version of the robust EWMA z-score + CUSUM. Its state is float32, as the
    detector's: each sample's update is computed in float64 and stored rounded (``f32``)."""
    def f32(v):
        return float(np.float32(v))

    level = {}
    scale = {}
    pos = {}
    neg = {}
    count = {}
    alarms = []
    for i, s in enumerate(slots):
        for j, x in enumerate(values[i]):
            key = (s, j)
            if not math.isfinite(x):  # NaN and ±inf alike
                continue
            if count.get(key, 0) == 0:
                level[key], scale[key], pos[key], neg[key], count[key] = f32(x), 0.0, 0.0, 0.0, 1
                continue
            dev = x - level[key]
            sigma = max(1.2533 * scale[key], min_scale)
            z = dev / sigma
            count[key] += 1
            if count[key] > warmup:
                pos[key] = max(0.0, pos[key] + z - drift)
                neg[key] = max(0.0, neg[key] - z - drift)
                if pos[key] > threshold or neg[key] > threshold:
                    alarms.append((i, j, max(pos[key], neg[key])))
                    pos[key] = neg[key] = 0.0
                    count[key] = 0  # the next sample starts the new regime (this one may be a glitch)
                    continue
            if count[key] <= warmup:  # a regime being learnt: running mean and mean |deviation|
                if count[key] > 3:  # past the seed and two more, winsorised at 24 sigmas
                    dev = min(max(dev, -24.0 * sigma), 24.0 * sigma)
                level[key] += dev / count[key]
                scale[key] += (abs(dev) - scale[key]) / (count[key] - 1)
            else:
                lim = clip * sigma
                level[key] += alpha * min(max(dev, -lim), lim)
                scale[key] += alpha * (min(abs(dev), lim) - scale[key])
            level[key], scale[key], pos[key], neg[key] = f32(level[key]), f32(scale[key]), f32(pos[key]), f32(neg[key])
    return alarms


def reference_guard(ts, slots, n_slots, last, latest=np.inf, earliest=-np.inf, min_spacing=0.0, near_gaps=None):
    """The guard's row rules, one row at a time; ``near_gaps`` (a list) gets each near duplicate's
    spacing after its entity's last kept row."""
    keep, reasons = [], []
    for t, s in zip(ts, slots):
        if s < 0 or s >= n_slots:
            reasons.append("unknown_entity"); keep.append(False)
        elif not np.isfinite(t) or t < earliest:
            reasons.append("bad_timestamp"); keep.append(False)
        elif t > latest:
            reasons.append("future_timestamp"); keep.append(False)
        elif t == last[s]:
            reasons.append("duplicate_timestamp"); keep.append(False)
        elif t < last[s]:
            reasons.append("out_of_order"); keep.append(False)
        elif t - last[s] < min_spacing:
            reasons.append("near_duplicate_timestamp"); keep.append(False)
            if near_gaps is not None:
                near_gaps.append(t - last[s])
        else:
            last[s] = t; keep.append(True)
    return np.array(keep, dtype=bool), reasons


values_strategy = st.one_of(st.floats(min_value=-1e6, max_value=1e6), st.sampled_from([math.nan, math.inf, -math.inf]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), values_strategy, values_strategy), min_size=0, max_size=120),
       st.integers(0, 5))
def test_ewma_cusum_matches_reference(rows, warmup) -> None:
    det = RobustZScoreDetector(TOPO, fields=("gpu_temp", "power"), warmup=warmup, threshold=3.0, alpha=0.2)
    slots = np.array([r[0] for r in rows], dtype=np.int32)
    values = np.array([[r[1], r[2]] for r in rows], dtype=np.float64).reshape(-1, 2)
    frame = Frame("gpu", np.arange(len(rows), dtype=float), slots, {"gpu_temp": values[:, 0], "power": values[:, 1]})
    found = det.update(frame)
    expected = reference_ewma_cusum(slots, values, 8, 0.2, 4.0, 0.5, 3.0, warmup, 0.5)
    assert [(int(frame.ts.searchsorted(f.ts)), ("gpu_temp", "power").index(f.field)) for f in found] == \
        [(i, j) for i, j, _ in expected]
    np.testing.assert_allclose([f.score for f in found], [s for _, _, s in expected], rtol=1e-9)


def test_ewma_cusum_constant_and_empty_input_raise_nothing() -> None:
    det = RobustZScoreDetector(TOPO, fields=("gpu_temp",), warmup=5)
    assert det.update(Frame.empty("gpu")) == []
    flat = Frame("gpu", np.arange(500.0), np.zeros(500, np.int32), {"gpu_temp": np.full(500, 40.0)})
    assert det.update(flat) == []


def test_ewma_cusum_streaming_equals_batch_and_state_round_trips() -> None:
    rng = np.random.default_rng(7)
    n = 600
    temp = np.r_[50 + rng.normal(0, 0.3, 400), 50 + np.linspace(0, 20, 200)]
    frame = Frame("gpu", np.arange(n, dtype=float), np.zeros(n, np.int32), {"gpu_temp": temp})
    batch = RobustZScoreDetector(TOPO, fields=("gpu_temp",), warmup=30)
    expected = batch.update(frame)
    assert expected and expected[0].ts >= 400, "the ramp must be found, and not before it starts"
    stream = RobustZScoreDetector(TOPO, fields=("gpu_temp",), warmup=30)
    got = []
    for i in range(300):
        got += stream.update(frame.take(np.array([i])))
    # checkpoint half-way, restore into a fresh detector, continue there
    restored = RobustZScoreDetector(TOPO, fields=("gpu_temp",), warmup=30)
    restored.load_state_dict(stream.state_dict())
    for i in range(300, n):
        got += restored.update(frame.take(np.array([i])))
    assert got == expected


def test_ewma_cusum_reports_a_level_shift_once() -> None:
    """A GPU stepping from idle to full load is one change: one anomaly per field, not one per
    sample while the level catches up (the old clipped level re-alarmed for minutes)."""
    rng = np.random.default_rng(3)
    power = np.r_[80 + rng.normal(0, 0.5, 300), 690 + rng.normal(0, 1.5, 300), 80 + rng.normal(0, 0.5, 300)]
    frame = Frame("gpu", np.arange(power.size, dtype=float), np.zeros(power.size, np.int32), {"power": power})
    found = RobustZScoreDetector(TOPO, fields=("power",), warmup=60).update(frame)
    assert [int(f.ts) for f in found] == [300, 600]


def test_ewma_cusum_learns_a_noisy_series_scale_in_its_warm_up() -> None:
    """A loaded GPU's power swings by hundreds of watts with its job's step rhythm. The scale
    must be learnt from the warm-up itself: grown from zero by a clipped EWMA it stayed under a
    watt, and every loaded GPU alarmed as its warm-up ended. A sustained drop is still found."""
    rng = np.random.default_rng(11)
    rhythm = 640 + rng.normal(0, 8, 2160)
    rhythm[np.arange(2160) % 30 >= 27] = 380 + rng.normal(0, 20, 216)  # a dip every 30 samples
    frame = Frame("gpu", np.arange(rhythm.size, dtype=float), np.zeros(rhythm.size, np.int32), {"power": rhythm})
    assert RobustZScoreDetector(TOPO, fields=("power",), warmup=60).update(frame) == []
    throttled = rhythm.copy()
    throttled[1500:] -= 250  # the limiter cuts the clock: the whole rhythm sits 250 W lower
    frame = Frame("gpu", np.arange(rhythm.size, dtype=float), np.zeros(rhythm.size, np.int32), {"power": throttled})
    found = RobustZScoreDetector(TOPO, fields=("power",), warmup=60).update(frame)
    assert len(found) == 1 and 1500 <= found[0].ts < 1530


@pytest.mark.parametrize("glitch, field, base, noise, shift", [
    (0.0, "power", 690.0, 1.5, -40.0),    # a 0 W read on a loaded GPU, then a sustained 40 W drop
    (0.0, "gpu_temp", 50.0, 0.5, 3.0),    # a 0 degC read, then a +3 degC (6 sigma) step
    (80.0, "gpu_temp", 50.0, 0.5, 3.0),
])
def test_ewma_cusum_an_alarm_on_a_glitch_does_not_blind_the_series(glitch, field, base, noise, shift) -> None:
    """A one-off glitch alarms (it is an anomaly), but the regime re-learnt after the alarm
    starts at the next sample: seeded at the glitch, the level sat on it and the scale learnt
    its distance unclipped (a sigma ~7x too wide), and the real shift 100 samples later was
    never reported."""
    rng = np.random.default_rng(1)
    x = base + rng.normal(0, noise, 1500)
    x[700:] += shift
    x[600] = glitch
    frame = Frame("gpu", np.arange(x.size, dtype=float), np.zeros(x.size, np.int32), {field: x})
    found = [int(f.ts) for f in RobustZScoreDetector(TOPO, fields=(field,)).update(frame)]
    assert found[0] == 600 and len(found) == 2 and 700 <= found[1] < 715


@pytest.mark.parametrize("bad", [math.inf, -math.inf])
def test_ewma_cusum_skips_an_infinite_reading_like_a_missing_one(bad: float) -> None:
    """One inf read (a sensor overflow, a frame fed without the guard) set the level inf: the
    series' state went NaN for good and its real rise later was never reported."""
    rng = np.random.default_rng(0)
    temps = np.r_[50 + rng.normal(0, 0.5, 300), 50 + np.linspace(0, 15, 50)]
    found = {}
    for glitch in (math.nan, bad):
        t = temps.copy()
        t[100] = glitch
        det = RobustZScoreDetector(TOPO, fields=("gpu_temp",), warmup=20)
        frame = Frame("gpu", np.arange(t.size, dtype=float), np.zeros(t.size, np.int32), {"gpu_temp": t})
        found[glitch] = [(f.ts, f.score) for f in det.update(frame) if isinstance(f, Anomaly)]
        assert np.all(np.isfinite(det.s_state))
    assert found[bad] == found[math.nan] and found[bad] and found[bad][0][0] >= 300


def test_ewma_cusum_validates_parameters() -> None:
    with pytest.raises(ValueError, match="unknown gpu fields"):
        RobustZScoreDetector(TOPO, fields=("colour",))
    with pytest.raises(ValueError, match="alpha"):
        RobustZScoreDetector(TOPO, alpha=0.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0, 1.004, 2.0, 2.0, 2.0099, 2.01, 3.0, 9.0, float("nan"),
                                           float("inf")]),
                          st.integers(-1, 9)), max_size=60),
       st.one_of(st.none(), st.sampled_from([0.0, 1.5, 5.0])))
def test_guard_matches_reference_and_counts_every_dropped_row(rows, max_ahead_s) -> None:
    ts = np.array([r[0] for r in rows], dtype=float)
    slots = np.array([r[1] for r in rows], dtype=np.int32)
    health = PipelineHealth()
    guard = InputGuard(TOPO, health, max_ahead_s=max_ahead_s, clock=lambda: 2.0)
    out = guard.check(Frame("gpu", ts, slots, {"gpu_temp": np.arange(len(rows), dtype=float)}))
    latest = np.inf if max_ahead_s is None else 2.0 + max_ahead_s
    # (the guard allows its stamps' rounding: 2.01 - 2.0 is 0.00999999999999979, not a near duplicate)
    keep, reasons = reference_guard(ts, slots, 8, np.full(8, -np.inf), latest,
                                    min_spacing=MIN_SPACING_S - SPACING_ROUNDING_S)
    np.testing.assert_array_equal(out.columns["gpu_temp"], np.arange(len(rows), dtype=float)[keep])
    for reason in set(reasons):
        assert health.problems[("guard", reason)] == reasons.count(reason)
    assert len(out) + sum(health.problems[("guard", r)] for r in set(reasons)) == len(rows)


NAN, INF = float("nan"), float("inf")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.0, 0.001, 0.004, 0.0099, 0.01, 0.0101, 0.1, 1.0, -0.003, -0.5,
                                           NAN, INF, -INF]),
                          st.integers(-1, 9)), max_size=80),
       st.sampled_from([0.0, 0.005, MIN_SPACING_S, 0.25]), st.integers(0, 80),
       st.sampled_from([-INF, 1.2]), st.sampled_from([INF, 3.0]))
def test_guard_kernel_matches_reference_with_random_spacings(steps, min_spacing, split, earliest, latest) -> None:
    """Rows whose stamps walk by random steps (repeats, steps under and over the spacing, steps
    back, NaN and infinities), each in a random slot (some outside the topology), in two frames
    (the last kept stamps carried from one to the next): the kernel's keep mask, counts, last
    stamps and least near-duplicate spacing are the reference's."""
    ts, t = [], 1.0
    for step, _ in steps:
        if np.isfinite(step):
            t += step
        ts.append(t if np.isfinite(step) else step)
    stamps = np.array(ts, dtype=np.float64)
    slots = np.array([slot for _, slot in steps], dtype=np.int32)
    last, counts, closest = np.full(8, -np.inf), np.zeros(len(REASONS), dtype=np.int64), np.full(1, np.inf)
    keep = np.concatenate([_guard_kernel(stamps[part], slots[part], last, counts, latest, earliest, min_spacing,
                                         closest) for part in (slice(0, split), slice(split, None))])
    ref_last, gaps = np.full(8, -np.inf), []
    ref_keep, reasons = reference_guard(stamps, slots, 8, ref_last, latest, earliest, min_spacing, gaps)
    np.testing.assert_array_equal(keep, ref_keep)
    assert counts.tolist() == [reasons.count(reason) for reason in REASONS]
    np.testing.assert_array_equal(last, ref_last)
    assert closest[0] == min(gaps, default=np.inf)
    assert counts.sum() + keep.sum() == len(steps)


def test_a_row_stamped_hours_ahead_is_refused_so_its_gpu_reads_again_once_the_clock_is_right(caplog) -> None:
    """A host whose clock ran 8 hours ahead sends one row, then its clock is put right. Accepted,
    that row had set the GPU's last timestamp 8 hours ahead, and every later row was refused as out
    of order for 8 hours (in a worker, kept so by its checkpoints across restarts). The workers'
    guard refuses rows further ahead of its own clock than ``max_ahead_s``, and says why."""
    rows = [100.0, 100.0 + 8 * 3600, *np.arange(101.0, 111.0)]

    def run(max_ahead_s: float | None) -> tuple[int, PipelineHealth]:
        health = PipelineHealth()
        guard = InputGuard(TOPO, health, max_ahead_s=max_ahead_s, clock=lambda: 105.0)
        kept = sum(len(guard.check(Frame("gpu", [t], [0], {"gpu_temp": [50.0]}))) for t in rows)
        return kept, health

    kept, health = run(None)
    assert kept == 2 and health.problems[("guard", "out_of_order")] == 10  # blind from then on
    kept, health = run(900.0)
    assert kept == 11 and dict(health.problems) == {("guard", "future_timestamp"): 1}
    assert "up to 28795 s ahead of this host's clock (limit 900 s)" in caplog.text


def test_guard_turns_inf_into_counted_nan_and_counts_gaps() -> None:
    health = PipelineHealth()
    guard = InputGuard(TOPO, health)
    guard.check(Frame("gpu", [0.0, 0.0], [0, 1], {"gpu_temp": [45.0, 46.0], "power": [480.0, 490.0]}))
    out = guard.check(Frame("gpu", [1.0, 1.0], [0, 1], {"gpu_temp": [np.inf, 50.0], "power": [np.nan, 500.0]}))
    assert np.isnan(out.columns["gpu_temp"][0])
    assert health.problems[("guard", "inf_values")] == 1
    # gpu_temp had one inf (now NaN) and power one NaN, in columns the frame does report: both in
    # GPU 0's row, one sample with missing values (until 2026-12-06 counted per value, 2)
    assert health.problems[("guard", "missing_values")] == 1
    guard.check(Frame("gpu", [2.0, 2.0], [0, 1], {"gpu_temp": [np.nan, 50.0], "power": [480.0, np.nan]}))
    assert health.problems[("guard", "missing_values")] == 3  # one field in each row: two samples


def test_guard_counts_a_sensor_going_dark_but_not_a_field_the_gpu_never_had() -> None:
    """A mixed fleet's exporter page: GPU 1 has no HBM sensor and never reports one, so its blank
    ``hbm_temp`` is not a gap, poll after poll; GPU 0's HBM sensor stops answering at the third
    poll, which is. A value outside the field's range is no reading: it does not make a later
    NaN a gap."""
    health = PipelineHealth()
    guard = InputGuard(TOPO, health)
    for t, hbm0 in ((1.0, 60.0), (2.0, 61.0), (3.0, np.nan), (4.0, np.nan)):
        guard.check(Frame("gpu", [t, t, t], [0, 1, 2], {"gpu_temp": [50.0, 40.0, 41.0],
                                                       "hbm_temp": [hbm0, np.nan, 65535.0 if t == 1.0 else np.nan]}))
    assert health.problems[("guard", "missing_values")] == 2  # GPU 0 at t=3 and t=4
    assert health.problems[("guard", "out_of_range: hbm_temp")] == 1
    # once every GPU of the topology has reported a field the guard stops learning it: a sensor
    # going dark is still a gap
    two = Topology.from_gpu_hosts([("n0", 0), ("n0", 1)])
    health = PipelineHealth()
    guard = InputGuard(two, health)
    for t, hbm in ((1.0, [60.0, 61.0]), (2.0, [60.0, np.nan]), (3.0, [np.inf, np.nan]), (4.0, [np.nan, np.nan])):
        guard.check(Frame("gpu", [t, t], [0, 1], {"hbm_temp": hbm}))
    # (GPU 0's infinity at t=3 is one, counted as that alone: until 2026-12-06 it was a gap too, 5)
    assert health.problems[("guard", "missing_values")] == 4
    assert health.problems[("guard", "inf_values")] == 1


def test_the_fields_an_entity_reported_survive_a_checkpoint() -> None:
    health = PipelineHealth()
    guard = InputGuard(TOPO, health)
    guard.check(Frame("gpu", [1.0, 1.0], [0, 1], {"gpu_temp": [50.0, 40.0], "hbm_temp": [60.0, np.nan]}))
    restored = InputGuard(TOPO, health)
    restored.load_state_dict(guard.state_dict())
    restored.check(Frame("gpu", [2.0, 2.0], [0, 1], {"gpu_temp": [50.0, 40.0], "hbm_temp": [np.nan, 61.0]}))
    assert health.problems[("guard", "missing_values")] == 1  # GPU 0's, which had reported before
    # a checkpoint written before the guard kept them: every field starts unreported
    old = InputGuard(TOPO, health)
    old.load_state_dict({k: v for k, v in guard.state_dict().items() if ":" not in k})
    old.check(Frame("gpu", [3.0, 3.0], [0, 1], {"gpu_temp": [50.0, 40.0], "hbm_temp": [np.nan, 61.0]}))
    assert health.problems[("guard", "missing_values")] == 1


def test_throttle_bits_reports_onsets_only() -> None:
    det = ThrottleBitsDetector(TOPO)
    masks = [0x1, 0x0, 0x4, 0x4, 0x24, 0x0, 0x20, float("nan"), 0x20]
    frame = Frame("gpu", np.arange(len(masks), dtype=float), np.zeros(len(masks), np.int32),
                  {"throttle_reasons": masks})
    found = det.update(frame)
    assert [(f.ts, int(f.score)) for f in found] == [(2.0, 0x4), (4.0, 0x20), (6.0, 0x20)]
    assert "sw_thermal" in found[1].reason


def test_detectors_count_their_input_problems_in_the_pipelines_health(small_topology: Topology) -> None:
    """A link counter going negative is the link-error detector's to notice; the pipeline's health
    (what /metrics publishes as foreshock_input_problems_total) must count it, for detectors the
    bank built with their own default health."""
    from foreshock.detectors.bank import DetectorBank
    from foreshock.fields import field_names
    from foreshock.streams.embedded import EmbeddedPipeline

    topo = small_topology
    bank = DetectorBank.from_names(topo, ["link_errors"])
    pipeline = EmbeddedPipeline(topo, bank)
    n = topo.size("link")
    for t, value in ((10.0, 5.0), (20.0, -1.0)):
        cols = {name: np.zeros(n) for name in field_names("link")}
        cols["symbol_error"] = np.full(n, value)
        pipeline.process(Frame("link", np.full(n, t), np.arange(n), cols))
    problems = {reason: count for (stage, reason), count in pipeline.health.problems.items() if stage == "link_errors"}
    assert problems == {"negative or infinite counter value": n}


def test_guard_sets_values_no_sensor_can_read_to_nan_and_names_the_field() -> None:
    """A raw RPM where a share of full speed is due, a 65535 sentinel, a negative power: NaN,
    counted per field; readings inside the ranges (a fan a little over full speed) untouched."""
    health = PipelineHealth()
    guard = InputGuard(TOPO, health)
    out = guard.check(Frame("gpu", [1.0, 1.0, 1.0], [0, 1, 2],
                            {"gpu_temp": [65535.0, 54.0, -1.0], "power": [-5.0, 690.0, 0.0]}))
    np.testing.assert_array_equal(out.columns["gpu_temp"], [np.nan, 54.0, -1.0])
    np.testing.assert_array_equal(out.columns["power"], [np.nan, 690.0, 0.0])
    assert health.problems[("guard", "out_of_range: gpu_temp")] == 1
    assert health.problems[("guard", "out_of_range: power")] == 1
    assert ("guard", "missing_values") not in health.problems  # a rejected value is not a gap too
    nodes = guard.check(Frame("node", [1.0, 1.0], [0, 1], {"fan_speed": [9000.0, 1.05]}))
    np.testing.assert_array_equal(nodes.columns["fan_speed"], [np.nan, 1.05])


def test_a_cdu_sentinel_inlet_does_not_become_a_forecast() -> None:
    """A CDU that reports 6553.5 °C (0xFFFF tenths) for one poll: the guard drops the reading, so
    nothing is forecast from it. Without the range, the power detector's leakage forecast read
    that inlet as a die about to heat and forecast every GPU's power cap (187 predictions); since
    2026-12-01 the detectors hold a jump no loop makes for a reading (``inlet_jump_held``), so even
    unguarded the one poll forecasts nothing: two layers, each tested here."""
    import foreshock.fields as fields_module
    from foreshock.findings import Prediction
    from foreshock.streams.embedded import EmbeddedPipeline
    from thermal_synth import World, small_topology

    topo = small_topology()
    frames, _ = World(topo, seed=2).run(2 * 3600)
    racks = [i for i, f in enumerate(frames) if f.kind == "rack"]
    hit = racks[len(racks) // 2]
    bad = frames[hit]
    frames[hit] = Frame("rack", bad.ts, bad.slot, {**bad.columns, "inlet_temp": np.full(len(bad), 6553.5)})

    def predictions() -> tuple[int, PipelineHealth]:
        health = PipelineHealth()
        pipeline = EmbeddedPipeline(topo, DetectorBank.from_names(topo, ["thermal", "power"]), health=health)
        found = [f for frame in frames
                 for f in pipeline.process(Frame(frame.kind, frame.ts.copy(), frame.slot.copy(),
                                                 {k: v.copy() for k, v in frame.columns.items()}))
                 if isinstance(f, Prediction)]
        return len(found), health

    n, health = predictions()
    assert n == 0 and health.problems[("guard", "out_of_range: inlet_temp")] == len(bad)
    saved = dict(fields_module.VALID_BY_UNIT)
    fields_module.VALID_BY_UNIT["celsius"] = (-math.inf, math.inf)
    fields_module.valid_bounds.cache_clear()
    try:
        unguarded, _ = predictions()
    finally:
        fields_module.VALID_BY_UNIT.update(saved)
        fields_module.valid_bounds.cache_clear()
    assert unguarded == 0
