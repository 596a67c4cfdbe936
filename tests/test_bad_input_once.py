"""One bad reading, one input problem (an audit, 2026-12-06): ``ForeshockInputProblems`` divides the
problems by the samples processed, so a sample's problem is counted once, not once per value, per
interval it touches or per detector that reads it.

- A GPU's energy counter as the thermal fit reads it: thermal, power and cooling share one fit per
  frame and each counted its problems (3x), and a glitch (0, then back) or a -1 counted twice more
  (the fall, then the rise from the bad reading): a -1 in 50 rows was 300 problems.
- An infinity was counted as ``inf_values`` and again as ``missing_values`` (set to NaN, then scanned
  as a gap).
- A GPU without a power reading (a dcgm-exporter serving energy but not power) had its energy
  counter's mean judged against the filtered power alone: every load change "disagreed" (904 of a
  healthy 10-minute 256-GPU recording's samples, per detector), and the mean was not taken."""

from __future__ import annotations

import numpy as np

from foreshock.detectors import thermal_fit as tf
from foreshock.detectors.cooling import CoolingDetector
from foreshock.detectors.power import PowerDetector
from foreshock.detectors.thermal import ThermalDetector
from foreshock.detectors.thermal_fit import share_thermal_fits
from foreshock.frames import Frame
from foreshock.guard import InputGuard
from foreshock.health import PipelineHealth

from thermal_synth import small_topology

PF = tf.G_SIZE + tf.CORE * tf.M_SIZE + tf.M_PF  # the core model's filtered power
INLET = 24.0


def energy_problems(health: PipelineHealth) -> dict[tuple[str, str], int]:
    return {k: n for k, n in health.problems.items() if "energy counter" in k[1] and n}


def feed(polls: int, energy_at, power_at=None):
    """Rack and GPU frames of two GPUs polled every 10 s; GPU 0's counter reads ``energy_at(k, true)``
    at poll k (its true value ``true``), its power ``power_at(k)`` (None: no power column at all)."""
    true = np.array([1e8, 2e8])
    frames = []
    for k in range(polls):
        t = 10.0 * k
        w = power_at(k) if power_at else 550.0
        true = true + np.array([w, 550.0]) * 10.0
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [INLET]}))
        cols = {"gpu_temp": np.array([round(INLET + 0.046 * w), round(INLET + 0.046 * 550.0)]),
                "energy": np.array([energy_at(k, true[0]), true[1]]), "power_limit": np.full(2, 700.0)}
        if power_at is None:
            cols["power"] = np.full(2, 550.0)
        frames.append(Frame("gpu", [t, t], [0, 1], cols))
    return frames


def fit_readers(topo, health):
    dets = [ThermalDetector(topo, health=health), PowerDetector(topo, health=health),
            CoolingDetector(topo, health=health)]
    share_thermal_fits(dets)
    assert dets[0].fit is dets[1].fit is dets[2].fit
    return dets


def test_a_bad_energy_reading_is_counted_once_whatever_reads_the_fit():
    # a -1 at poll 20, a glitch to 0 at poll 30 (back at 31), a reset at poll 40 (a driver reload: from 0
    # on), a garbage +1e12 J at poll 50 (back at 51): four bad readings, four problems (21 until now:
    # 7 in each of thermal, power and cooling)
    def energy(k: int, true: float) -> float:
        counter = true if k < 40 else 100.0 + 5500.0 * (k - 40)
        return {20: -1.0, 30: 0.0, 50: counter + 1e12}.get(k, counter)

    topo = small_topology(nodes=1, gpus=2, racks=1)
    health = PipelineHealth()
    dets = fit_readers(topo, health)
    for frame in feed(70, energy):
        for det in dets:
            det.update(frame)
    problems = energy_problems(health)
    assert sum(problems.values()) == 4, problems
    assert {stage for stage, _ in problems} == {"thermal"}, problems  # the first detector the frame is fitted for
    # the GPU's power is still read after each (the sample's, then the counter's interval means)
    assert abs(dets[0].s_model[0, PF] - 550.0) < 5.0


def test_a_reader_of_its_own_fit_counts_its_problems():
    # a power detector alone (its own fit): its energy problems are counted, once
    topo = small_topology(nodes=1, gpus=2, racks=1)
    health = PipelineHealth()
    det = PowerDetector(topo, health=health)
    for frame in feed(40, lambda k, true: 0.0 if k == 20 else true):
        det.update(frame)
    assert energy_problems(health) == {("power", tf.ENERGY_NOT_SANE): 1}


def test_an_infinity_is_counted_once_as_such_not_again_as_a_gap():
    topo = small_topology(nodes=1, gpus=2, racks=1)
    health = PipelineHealth()
    guard = InputGuard(topo, health)
    guard.check(Frame("gpu", [0.0, 0.0], [0, 1], {"gpu_temp": [45.0, 46.0], "power": [480.0, 490.0]}))
    out = guard.check(Frame("gpu", [1.0, 1.0], [0, 1], {"gpu_temp": [np.inf, 50.0], "power": [480.0, -np.inf]}))
    assert np.isnan(out.columns["gpu_temp"][0]) and np.isnan(out.columns["power"][1])
    assert health.problems[("guard", "inf_values")] == 2
    assert ("guard", "missing_values") not in health.problems, health.problems
    # a real gap in a row with an infinity is a gap still
    guard.check(Frame("gpu", [2.0, 2.0], [0, 1], {"gpu_temp": [np.inf, 50.0], "power": [np.nan, 490.0]}))
    assert health.problems[("guard", "inf_values")] == 3
    assert health.problems[("guard", "missing_values")] == 1


def test_an_energy_counter_without_power_readings_has_nothing_to_disagree_with():
    # energy but no power column (a dcgm-exporter configured so): idle at 100 W, then a job at 650 W.
    # The means were judged against the filtered power alone: the step "disagreed" at every poll after
    # it (the filtered power never followed), and was counted in each of thermal, power and cooling
    topo = small_topology(nodes=1, gpus=2, racks=1)
    health = PipelineHealth()
    dets = fit_readers(topo, health)
    for frame in feed(80, lambda k, true: true, power_at=lambda k: 100.0 if k < 30 else 650.0):
        for det in dets:
            det.update(frame)
    assert energy_problems(health) == {}, health.problems
    assert abs(dets[0].s_model[0, PF] - 650.0) < 10.0  # the counter's means are the power read
