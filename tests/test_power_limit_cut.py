"""A power limit cut under what a GPU draws (``nvidia-smi -pl 500`` on a GPU at 640 W), and an
envelope already at its limit (ETA 0).

Until 2026-12-05 (audit tp3) the compute-phase envelope, a running maximum forgetting 0.5 W/s, kept
what the GPU drew under its old limit: "compute-phase power 628 W already at the 500 W limit", then
598, 568 ... W for four minutes, every sample since at or under 499.9 W; and its ETA printed 7.15e-05
(the forecast search's first tolerance) instead of 0."""

from __future__ import annotations

import re

import numpy as np

from foreshock.detectors import power as pw
from foreshock.detectors import thermal_fit as tf
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth

from thermal_synth import small_topology

CUT_AT = 1200.0


def limit_cut_feed():
    """A GPU at 640 W (±5) under its 700 W limit, cut to 500 W at CUT_AT: it then draws 495 W (±5).
    dcgm-exporter's default counters and the power limit: no throttle reasons, no clocks."""
    rng = np.random.default_rng(0)
    frames = []
    for t in np.arange(0.0, 1800.0, 10.0):
        cut = t >= CUT_AT
        power = (495.0 if cut else 640.0) + rng.uniform(-5, 5)
        frames.append(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
        frames.append(Frame("gpu", [t], [0], {"gpu_temp": [47.0 if cut else 53.0], "power": [power],
                                              "power_limit": [500.0 if cut else 700.0]}))
    return frames


def quoted_watts(reason: str) -> float:
    return float(re.search(r"compute-phase power (\d+) W", reason).group(1))  # type: ignore[union-attr]


def test_a_limit_cut_starts_the_envelope_over_from_what_the_gpu_now_draws():
    det = pw.PowerDetector(small_topology(nodes=1, gpus=1, racks=1), health=PipelineHealth())
    found, highest, envelopes = [], 0.0, []
    for frame in limit_cut_feed():
        found += det.update(frame)
        if frame.kind == "gpu" and frame.ts[0] >= CUT_AT:
            highest = max(highest, float(frame.columns["power"][0]))
            envelopes.append((det.s_gpu[0, pw.S_ENV], min(det.s_gpu[0, pw.S_LEVEL], det.s_gpu[0, pw.S_ENV])))
    # what it drew before the cut is no longer drawable: neither the envelope nor the level it forecasts
    # from holds more than the samples since (the old envelope read 628 W at the first sample after)
    assert max(max(e) for e in envelopes) <= highest + 1e-9, (max(envelopes), highest)
    after = [f for f in found if isinstance(f, Prediction) and f.ts >= CUT_AT and f.event == "power_cap"]
    # no prediction quotes a compute-phase power over the new limit
    assert all(quoted_watts(f.reason) <= 500.0 for f in after), [f.reason for f in after]
    assert not any("already at the 500 W limit" in f.reason and quoted_watts(f.reason) > 505.0 for f in after)
    # a GPU that reports no limit keeps its envelope over Hopper's 700 W default: that is how a part that
    # is not a 700 W one is found (DEFAULT_LIMIT_SLACK_W), and it is not clipped to the default
    rng = np.random.default_rng(1)
    det = pw.PowerDetector(small_topology(nodes=1, gpus=1, racks=1), health=PipelineHealth())
    for t in np.arange(0.0, 600.0, 10.0):
        det.update(Frame("rack", [t], [0], {"inlet_temp": [24.0]}))
        det.update(Frame("gpu", [t], [0], {"gpu_temp": [60.0], "power": [850.0 + rng.uniform(-5, 5)]}))
    assert det.s_gpu[0, pw.S_ENV] > 840.0
    assert det.s_gpu[0, pw.S_OVER_DEFAULT] == 1.0


def test_an_envelope_at_its_limit_with_a_trusted_thermal_model_is_eta_zero():
    # the forecast's search starts one step out: an envelope there already answered that step's
    # tolerance (7.15e-05 s), printed as the ETA; it is 0
    tparams, params = tf.params_vector({}), pw.params_vector({})
    m = tf.new_model_state(1, tparams)
    m[0, [tf.G_UL, tf.G_PREF]] = 24.0, 640.0
    m[0, tf.G_SIZE + np.array([tf.M_RL, tf.M_RB, tf.M_TAU, tf.M_LOADED])] = 0.046, 0.0, 25.0, 3600.0
    for level in (700.0, 703.0):
        eta = pw.thermal_cap_eta(m, 0, 53.0, level, 0.0, 700.0, 240.0, 0.0, 0.046, tparams, params)
        assert eta == 0.0, (level, eta)


def test_an_envelope_over_a_cut_limit_is_predicted_at_eta_zero_end_to_end():
    # cut to 500 W with its thermal model trusted (20 minutes at load): the first prediction after the
    # cut, the GPU at its new limit, says so with ETA 0
    det = pw.PowerDetector(small_topology(nodes=1, gpus=1, racks=1), health=PipelineHealth())
    found = []
    for frame in limit_cut_feed():
        if frame.kind == "gpu" and frame.ts[0] >= CUT_AT:
            frame.columns["power"][0] = 502.0  # its samples at the limit, within the reading's noise
        found += det.update(frame)
    first = next(f for f in found if isinstance(f, Prediction) and f.active and f.ts >= CUT_AT)
    assert first.eta_s == 0.0, (first.eta_s, first.reason)
    assert "already at the 500 W limit" in first.reason and quoted_watts(first.reason) <= 502.0, first.reason
