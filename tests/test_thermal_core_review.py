"""The thermal fit's core as a review (2026-12-02) found it: a checkpoint moved onto renumbered
hardware, a bank restored between two rack polls, a rack inlet sensor stepping by 10-20 °C, and a
GPU whose temperature reads fail while its other fields arrive."""

from __future__ import annotations

import math

import numpy as np

from foreshock.detectors import gpu_inputs as gi
from foreshock.detectors import thermal_fit as tf
from foreshock.detectors.bank import DetectorBank
from foreshock.frames import Frame
from foreshock.remap import Remap
from foreshock.topology import Topology

FIT_USERS = ["thermal", "power", "cooling"]


def one_rack(nodes: list[str], gpus: int = 2) -> Topology:
    return Topology.from_dict({"rows": [{"name": "row0"}], "racks": [{"name": "rack0", "row": "row0"}],
                               "nodes": [{"name": n, "rack": "rack0", "gpus": gpus} for n in nodes]})


def loaded_gpus(t: float, n: int, temp: float = 53.0) -> Frame:
    return Frame("gpu", np.full(n, t), np.arange(n), {"gpu_temp": np.full(n, temp), "power": np.full(n, 640.0)})


def test_a_state_moved_onto_renumbered_nodes_links_each_rack_for_its_proxy_anew():
    """The rack proxy (no rack inlet: dcgm-exporter alone) walks a list of node *indices* (RACK_NODE0,
    NODE_NEXT). Moved row by row onto a topology that lists a host first, node 'b' pointed at itself
    and the next GPU frame never returned. Moved, the lists are the new topology's, and each node's
    proxy followed its node."""
    old, new = one_rack(["b", "c", "d"]), one_rack(["a", "b", "c", "d"])
    bank = DetectorBank.from_names(old, FIT_USERS, processors=())
    for t in np.arange(0.0, 300.0, 10.0):
        bank.update(loaded_gpus(t, old.size("gpu")))
    moved = DetectorBank.from_names(new, FIT_USERS, processors=())
    fresh = DetectorBank.from_names(new, FIT_USERS, processors=())
    moved.load_state_dict(moved.remap_state(bank.state_dict(), Remap(old, new)))
    for det, ref in zip(moved.detectors, fresh.detectors):
        np.testing.assert_array_equal(det.s_rack[:, gi.RACK_NODE0], ref.s_rack[:, gi.RACK_NODE0])
        np.testing.assert_array_equal(det.s_node[:, gi.NODE_NEXT], ref.s_node[:, gi.NODE_NEXT])
    before = bank.detectors[0].s_node[:, gi.NODE_PROXY]
    np.testing.assert_array_equal(moved.detectors[0].s_node[1:, gi.NODE_PROXY], before)  # b, c, d
    moved.update(loaded_gpus(300.0, new.size("gpu")))  # returns (the walk ends)
    assert np.isfinite(moved.detectors[0].s_rack[0, gi.RACK_PROXY])


def test_the_baselines_moved_onto_renumbered_nodes_link_each_rack_anew():
    """The baselines' feature stream keeps the same rack proxy lists (``FeatureDetector``): moved
    onto a topology that lists a host first, its walk never ended either."""
    old, new = one_rack(["b", "c", "d"]), one_rack(["a", "b", "c", "d"])
    bank = DetectorBank.from_names(old, ["threshold", "river_hst"], processors=())
    for t in np.arange(0.0, 300.0, 10.0):
        bank.update(loaded_gpus(t, old.size("gpu")))
    moved = DetectorBank.from_names(new, ["threshold", "river_hst"], processors=())
    fresh = DetectorBank.from_names(new, ["threshold", "river_hst"], processors=())
    moved.load_state_dict(moved.remap_state(bank.state_dict(), Remap(old, new)))
    for det, ref in zip(moved.detectors, fresh.detectors):
        np.testing.assert_array_equal(det.s_rack[:, gi.RACK_NODE0], ref.s_rack[:, gi.RACK_NODE0])
        np.testing.assert_array_equal(det.s_node[:, gi.NODE_NEXT], ref.s_node[:, gi.NODE_NEXT])
    moved.update(loaded_gpus(300.0, new.size("gpu")))  # returns (the walk ends)


def test_a_bank_restored_between_rack_polls_forecasts_with_the_loops_it_learnt():
    """The site's learnt coolant rise and loop time constant (params, not state) were taken from
    the racks only when a rack frame came: restored between two polls, the thermal and power
    detectors forecast with the 4 °C prior (a power cap's ETA 205 s instead of 95 s)."""
    topo = one_rack(["n0", "n1"])
    saved = DetectorBank.from_names(topo, ["thermal", "power"], processors=()).state_dict()
    for state in saved["detectors"].values():
        state["s_rack"][0, [gi.RACK_DAMP, gi.RACK_DAMP_N, gi.RACK_RISE, gi.RACK_RISE_N]] = [214.0, 9.0, 8.0, 5.0]
    bank = DetectorBank.from_names(topo, ["thermal", "power"], processors=())
    bank.load_state_dict(saved)
    thermal, power = bank.detectors
    for params in (thermal.params, power.thermal_params):
        assert params[tf.P_SITE_DAMP] == 214.0 and params[tf.P_SITE_RISE] == 8.0


def test_a_reading_that_confirms_a_held_inlet_step_is_a_level_shift_not_the_loop_warming():
    """A 12 °C step at a 10-s poll is held (over max(5 °C, 10 s x 1 °C/s)); the reading after it was
    judged against the last one read over 20 s (20 °C: the held poll counted) and read as the loop
    warming 12 °C. It confirms the held one. A reading back at the last one after a held glitch is
    still read as such, even where a long poll lets it near both."""
    s = gi.new_rack_state(1)
    assert gi.reading_jump(s, 0, 10.0, 36.0, 24.0, 0.0, gi.RACK_HELD, gi.RACK_HELD_TS) == gi.HELD
    assert gi.reading_jump(s, 0, 20.0, 36.0, 24.0, 0.0, gi.RACK_HELD, gi.RACK_HELD_TS) == gi.SHIFTED
    assert math.isnan(s[0, gi.RACK_HELD])
    assert gi.reading_jump(s, 0, 60.0, 85.0, 24.0, 0.0, gi.RACK_HELD, gi.RACK_HELD_TS) == gi.HELD
    assert gi.reading_jump(s, 0, 120.0, 25.0, 24.0, 0.0, gi.RACK_HELD, gi.RACK_HELD_TS) == gi.READ


def test_a_rack_inlet_sensor_stepping_12_degrees_predicts_no_throttle():
    """The step above, end to end: the loop and the dies unchanged, every GPU of the rack was predicted
    to throttle ("moving +6.67 °C/min", ETA ~106 s)."""
    topo = one_rack(["n0", "n1"], gpus=8)
    n = topo.size("gpu")
    bank = DetectorBank.from_names(topo, ["thermal", "power"], processors=())
    rng = np.random.default_rng(0)
    r = 0.046 * (1 + 0.03 * rng.standard_normal(n))
    found = []
    for t in np.arange(0.0, 2700.0, 10.0):
        found += bank.update(Frame("rack", [t], [0], {"inlet_temp": [24.0 + (12.0 if t >= 1800.0 else 0.0)]}))
        found += bank.update(Frame("gpu", np.full(n, t), np.arange(n), {
            "gpu_temp": np.round(24.0 + r * 640.0 + rng.normal(0, 0.3, n)), "power": 640.0 + rng.normal(0, 3, n),
            "power_limit": np.full(n, 700.0), "util": np.ones(n), "throttle_reasons": np.zeros(n)}))
    assert bank.detectors[0].s_rack[0, gi.RACK_SHIFTS] == 1.0
    assert [f for f in found if f.ts >= 1800.0 and f.active] == []


def test_a_row_without_a_temperature_leaves_no_stale_previous_temperature():
    """Six polls whose temperature read failed (power still read) across a job's power step: the
    next reading was judged as one 10-s step from a temperature a minute old — tau learnt 24.7 s
    (true 30), the residual 3.2 °C² (confidence 1.0 -> 0.53), the power detector's temperature slope
    9 °C/min. Now it starts over as after a gap (the power detector reads the fit's previous
    temperature, NaN: the step is not taken for a slope)."""
    topo = one_rack(["n"], gpus=1)
    bank = DetectorBank.from_names(topo, ["thermal", "power"], processors=())
    thermal = bank.detectors[0]
    core = tf.G_SIZE + tf.CORE * tf.M_SIZE
    temp = 24 + 0.046 * 300
    for t in np.arange(0.0, 2100.0, 10.0):
        p = 300.0 if t < 2000 else 650.0
        temp += (24 + 0.046 * p - temp) * (1 - np.exp(-10 / 30.0))
        missing = 2000 <= t < 2060
        bank.update(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
        bank.update(Frame("gpu", [t], [0], {"gpu_temp": [np.nan if missing else round(temp, 1)], "power": [p],
                                            "power_limit": [700.0]}))
        if missing:
            assert math.isnan(thermal.s_model[0, core + tf.M_TPREV])
    assert abs(thermal.s_model[0, core + tf.M_TAU] - 30.0) < 1.0
    assert thermal.s_model[0, core + tf.M_RES] < 0.1
