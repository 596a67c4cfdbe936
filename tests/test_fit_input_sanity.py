"""The thermal fit's inputs that are no readings: an energy counter read across a stepped clock, an
interval mean past the power limit, a die reading colder than its inlet under load (a stuck sensor).

Each was fitted as a reading until 2026-12-05 (audit tp3): a host clock stepping 30 s spread 10 s of
energy over 40 s (a 625-W GPU read as 156 W) and its failing loop's throttle was predicted after it
began; a ``gpu_temp`` frozen under its warming inlet was fitted a negative thermal resistance."""

from __future__ import annotations

import numpy as np

from foreshock.detectors import thermal_fit as tf
from foreshock.detectors.thermal import ThermalDetector
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.guard import InputGuard
from foreshock.health import PipelineHealth

from thermal_synth import Fault, World, small_topology

PF = tf.G_SIZE + tf.CORE * tf.M_SIZE + tf.M_PF  # the core model's filtered power
RL = tf.G_SIZE + tf.CORE * tf.M_SIZE + tf.M_RL  # ... and its R level
INLET = 24.0
MEAN_W = 550.0  # what each GPU draws over a training step (its energy counter's advance per second)


def counted(health: PipelineHealth, words: str) -> int:
    return sum(n for (_stage, reason), n in health.problems.items() if words in reason)


def rhythm_sample(k: int) -> float:
    """A 1-s power sample lands in a compute phase (620 W) or a communication phase (300 W): the
    interval mean (550 W) is neither."""
    return 300.0 if k % 3 == 0 else 620.0


def steady_feed(ticks, stamp, poll, power=rhythm_sample):
    """Rack and GPU frames of GPUs drawing MEAN_W at 10-s polls, each poll ``k`` of GPU ``g`` stamped
    ``stamp(g, k)`` (None: polled but not sent) with sample power ``power(k)``, its die at its steady
    state (R 0.046 °C/W). ``poll(g, k)`` (default true) whether GPU g is polled at all at tick k."""
    energy = np.array([1e8, 2e8])
    frames = []
    for k in range(ticks):
        t = 10.0 * k
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [INLET]}))
        energy = energy + MEAN_W * 10.0
        rows = [(g, stamp(g, k)) for g in (0, 1) if poll(g, k) and stamp(g, k) is not None]
        if not rows:
            continue
        slots = np.array([g for g, _ in rows])
        frames.append(Frame("gpu", np.array([s for _, s in rows]), slots, {
            "gpu_temp": np.full(len(rows), round(INLET + 0.046 * MEAN_W)), "power": np.full(len(rows), power(k)),
            "energy": energy[slots], "power_limit": np.full(len(rows), 700.0)}))
    return frames


def test_a_clock_step_is_no_interval_mean_and_missed_polls_still_are():
    # GPU 0's host clock steps 30 s forward at poll 120 (an NTP step): that poll's energy advance (10 s)
    # is spread over 40 s of stamps, 137 W against samples of 620 W and interval means of 550 W. GPU 1
    # misses polls 120-122 (a dropped scrape): its stamps are honest, and the counter's mean over 40 s
    # is its power, whatever one 1-s sample (300 W at poll 123) says.
    topo = small_topology(nodes=1, gpus=2, racks=1)
    health = PipelineHealth()
    fit = ThermalDetector(topo, health=health)
    at_step = {}
    for frame in steady_feed(200, lambda g, k: 10.0 * k + (30.0 if g == 0 and k >= 121 else 0.0),
                             lambda g, k: not (g == 1 and 120 <= k < 123)):
        fit.update(frame)
        if frame.kind == "gpu" and frame.ts[0] == 10.0 * 121 + 30.0:
            at_step["pf"] = fit.s_model[0, PF]
        if frame.kind == "gpu" and 1 in frame.slot and frame.ts[-1] == 1230.0:
            at_step["gap_pf"] = fit.s_model[1, PF]
    # taken, the 137 W mean pulled the filtered power to ~245 W; the sample's own 620 W is the reading
    assert at_step["pf"] > 500.0, at_step
    # ... and counted, once: the clock stays stepped, and the intervals after it are honest
    assert counted(health, "disagrees with the power readings") == 1, health.problems
    # the dropped scrape: the 40-s mean (550 W) is taken, not the 300-W sample (~365 W filtered)
    assert abs(at_step["gap_pf"] - MEAN_W) < 5.0, at_step
    # both GPUs' R stays what their dies show: 0.046 °C/W (the 137-W reading read ~0.1)
    assert np.allclose(fit.s_model[:, RL], 0.046, rtol=0.05), fit.s_model[:, RL]


def test_a_row_stamped_ahead_then_an_honest_one_are_both_counted():
    # poll 120 stamped 30 s ahead; polls 121-123 are no newer than it (out of order, skipped); poll 124
    # is honest: its 10 s of stamps carry 40 s of energy (2,200 W over the 700 W limit). That mean was
    # dropped silently; the sample's own 620 W is the reading, and both spans are counted.
    topo = small_topology(nodes=1, gpus=2, racks=1)
    health = PipelineHealth()
    fit = ThermalDetector(topo, health=health)
    after = {}
    for frame in steady_feed(200, lambda g, k: 10.0 * k + (30.0 if g == 0 and k == 120 else 0.0),
                             lambda g, k: True, power=lambda k: 620.0):
        fit.update(frame)
        if frame.kind == "gpu" and frame.ts[1] == 1240.0:
            after["pf"] = fit.s_model[0, PF]
    assert counted(health, "disagrees with the power readings") == 2, health.problems
    assert after["pf"] > 550.0, after


def test_an_interval_mean_past_the_limit_is_counted():
    # a GPU at 320 W whose counter advances 800 W's worth over one poll, its power sample missing there:
    # within ENERGY_MEAN_OVER of its filtered power, but past its 700-W limit by more than 50 W. No
    # reading (as before), and now counted (it was dropped silently)
    topo = small_topology(nodes=1, gpus=1, racks=1)
    health = PipelineHealth()
    fit = ThermalDetector(topo, health=health)
    energy = 1e8
    for k in range(100):
        t = 10.0 * k
        energy += (800.0 if k == 60 else 320.0) * 10.0
        fit.update(Frame("rack", [t], [0], {"inlet_temp": [INLET]}))
        fit.update(Frame("gpu", [t], [0], {"gpu_temp": [round(INLET + 0.046 * 320.0)],
                                           "power": [np.nan if k == 60 else 320.0], "energy": [energy],
                                           "power_limit": [700.0]}))
        if k == 60:
            assert abs(fit.s_model[0, PF] - 320.0) < 1.0  # not taken
    assert counted(health, "interval mean over the enforced power limit") == 1, health.problems
    assert counted(health, "disagrees") == 0, health.problems


def stuck_sensor_feed(minutes=80, frozen=53.0, offset=0.0):
    """A rack whose inlet warms 25 -> 66 °C over ``minutes`` (a failing loop) with two GPUs at 600 W:
    GPU 1's die follows it (R 0.046 °C/W), GPU 0's ``gpu_temp`` reads ``frozen`` throughout (a stuck
    sensor; with ``offset`` set instead, its die reads that far off its inlet)."""
    frames = []
    energy = np.array([1e8, 2e8])
    for k in range(minutes * 6):
        t = 10.0 * k
        inlet = 25.0 + 41.0 * k / (minutes * 6)
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [round(inlet, 1)]}))
        energy = energy + 600.0 * 10.0
        die = frozen if not offset else round(inlet) + offset
        frames.append(Frame("gpu", [t, t], [0, 1], {
            "gpu_temp": [die, round(inlet + 0.046 * 600.0)], "power": [600.0, 600.0], "energy": energy.copy(),
            "power_limit": [700.0, 700.0]}))
    return frames


def test_a_die_frozen_under_its_warming_inlet_is_no_reading():
    topo = small_topology(nodes=1, gpus=2, racks=1)
    health = PipelineHealth()
    det = ThermalDetector(topo, health=health)
    lowest, found = np.inf, []
    for frame in stuck_sensor_feed():
        found += det.update(frame)
        lowest = min(lowest, det.s_model[0, RL])
    # the inlet passes 53 °C about 58 minutes in: the 22 minutes after read the die under it
    assert counted(health, "die colder than its inlet under load") > 100, health.problems
    # never fitted a negative resistance (the audit's GPU read -0.0243 °C/W), nor exported one
    assert lowest >= 0.0, lowest
    r_gauge = next(v for name, (_kind, v, _labels) in det.gauges().items() if "resistance" in name)
    assert r_gauge[0] >= 0.0, r_gauge
    # no throttle predicted from a model it cannot fit; its rack-mate, whose die follows, is predicted
    predicted = {f.slot for f in found if isinstance(f, Prediction) and f.active and f.event == "thermal_throttle"}
    assert predicted == {1}, predicted


def test_a_die_within_its_inlets_rounding_is_a_reading_but_no_negative_resistance():
    # a die half a degree under its inlet (both read in whole degrees, a low-power part): a reading,
    # not counted, but no negative R is learnt from it
    topo = small_topology(nodes=1, gpus=2, racks=1)
    health = PipelineHealth()
    det = ThermalDetector(topo, health=health)
    lowest = np.inf
    for frame in stuck_sensor_feed(minutes=20, offset=-0.5):
        det.update(frame)
        lowest = min(lowest, det.s_model[0, RL])
    assert counted(health, "die colder") == 0, health.problems
    assert lowest == 0.0, lowest


def test_a_failing_loops_throttle_is_still_predicted_across_an_ntp_step():
    # the audit's end-to-end case: 16 GPUs, a cooling loss, GPU 7's host clock stepping +30 s for good
    # at t = 4,360 s; as watch and replay run it (the input guard first). Its throttle was predicted
    # 330 s after it began; with honest stamps, 200 s before.
    topo = small_topology(nodes=4, gpus=4, racks=2)
    world = World(topo, interval=10.0, seed=5, faults=[Fault("cooling_loss", 0, 1200, 0.01)])
    frames, events = world.run(5400)
    throttle = min(e.time for e in events if e.type == "thermal_throttle_start" and e.entity == "node1/gpu3")
    health = PipelineHealth()
    guard, det, found = InputGuard(topo, health), ThermalDetector(topo, health=health), []
    for f in frames:
        ts = np.array(f.ts, dtype=float)
        if f.kind == "gpu" and ts[0] - world.t0 >= 4360.0:
            ts[7] += 30.0
        found += det.update(guard.check(Frame(f.kind, ts, np.array(f.slot), {
            k: np.array(v, dtype=float) for k, v in f.columns.items()})))
    first = min(f.ts for f in found if isinstance(f, Prediction) and f.slot == 7 and f.active)
    assert first < throttle - 60.0, (first - world.t0, throttle - world.t0)
    assert counted(health, "disagrees with the power readings") == 1, health.problems


def test_a_healthy_hbm_under_the_gpus_proxy_inlet_is_still_fitted() -> None:
    """GPU telemetry alone: the inlet is the rack's proxy (T - R_nominal * P), which reads high by
    (R - R_nominal) * P where boards run above nominal (0.06 °C/W at 640 W: ~8 °C). A healthy HBM at
    260 W, 7 °C over the true 25 °C inlet, then reads under the proxy: the die-below-inlet rule,
    meant for a rack's sensor, dropped every reading of those GPUs as a stuck sensor (718 in an hour)
    and their HBM model was never fitted (an audit of the rule, 2026-12-05)."""
    topo = small_topology(nodes=3, gpus=2, racks=1)
    n = topo.size("gpu")
    node = np.asarray(topo.gpu_node)
    r, p0 = np.where(node < 2, 0.06, 0.046), np.where(node < 2, 640.0, 260.0)
    fit = tf.ThermalFit(topo, tf.params_vector({}))
    rng = np.random.default_rng(0)
    problems: dict[str, int] = {}
    for tick in range(360):  # an hour at 10 s, no rack frames
        p = p0 + rng.normal(0, 3, n)
        fit.update(Frame("gpu", np.full(n, 1000.0 + 10 * tick), np.arange(n), {
            "gpu_temp": np.round(25.0 + r * p), "hbm_temp": np.round(25.0 + 0.027 * p), "power": p,
            "power_limit": np.full(n, 700.0), "slowdown_temp": np.full(n, 89.0)}), caller=None)
        for reason, count in fit.problems:
            problems[reason] = problems.get(reason, 0) + count
    assert not any("die colder" in reason for reason in problems), problems
    hbm_r = fit.s_model[:, tf.G_SIZE + tf.HBM * tf.M_SIZE + tf.M_RL]
    assert np.isfinite(hbm_r).all(), hbm_r  # every GPU's HBM fitted
