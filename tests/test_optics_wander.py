"""A healthy optic whose RX power wanders (autocorrelated, as real modules drift with temperature) is not
a link about to go down; a real decline with the same wander on top still is, with its lead.

An audit (2026-12-05) found every one of 64 flat links predicted within a day when their RX power
wandered 0.3-0.5 dB with a 30-120 min time constant: over a 32-minute window such a wander is a
straight line, and the slope's standard error, which takes the residuals as independent, was many
times too small. The detector now also holds a fall to the optic's own recent rises (learn_wander).
"""

from __future__ import annotations

import math

import numpy as np

from foreshock.detectors import optics
from foreshock.detectors.optics import SIG_RX, OpticsDetector
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology

STEP_S = 30.0  # the DOM poll of the audit
LEVEL_DBM = -3.0
ALARM_DBM = -8.0  # the module's low RX power alarm: 5 dB under the level
WANDER_DB, WANDER_TAU_S, WHITE_DB = 0.3, 3600.0, 0.1  # AR(1) sd and time constant, white noise per poll


def links(n: int) -> Topology:
    return Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": f"n{i}", "rack": "k", "gpus": 1} for i in range(n)],
                               "switches": [{"name": "leaf0"}],
                               "links": [{"name": f"n{i}/gpu0~leaf0", "a": f"n{i}/gpu0", "b": "leaf0"}
                                         for i in range(n)]})


def wander(rng: np.random.Generator, n_steps: int, n_opt: int) -> np.ndarray:
    """AR(1) with WANDER_DB standard deviation and WANDER_TAU_S memory, plus white noise, per optic."""
    phi = math.exp(-STEP_S / WANDER_TAU_S)
    e = rng.normal(0.0, WANDER_DB, n_opt)
    out = np.empty((n_steps, n_opt))
    for k in range(n_steps):
        e = phi * e + rng.normal(0.0, WANDER_DB * math.sqrt(1 - phi * phi), n_opt)
        out[k] = e
    return out + rng.normal(0.0, WHITE_DB, out.shape)


def run(det: OpticsDetector, ts: np.ndarray, rx: np.ndarray) -> list[Prediction]:
    n_opt = rx.shape[1]
    slots = np.arange(n_opt)
    found = []
    for k, t in enumerate(ts):
        cols = {"rx_power": rx[k], "tx_power": np.full(n_opt, 0.5), "tx_bias": np.full(n_opt, 7e-3),
                "los": np.zeros(n_opt), "rx_bits": np.full(n_opt, np.nan),
                "rx_corrected_bits": np.full(n_opt, np.nan), "prefec_ber": np.full(n_opt, np.nan),
                "module_temp": np.full(n_opt, 40.0)}
        found += [f for f in det.update(Frame("optic", np.full(n_opt, t), slots, cols))
                  if isinstance(f, Prediction) and f.active]
    return found


def test_a_wandering_healthy_optic_is_not_predicted():
    """16 links, nothing degrading, 12 h. Before: every link had a link_down predicted (its ETA the
    wander's fall extrapolated to the alarm). Its wander is the optic's own to learn: a detector
    that has seen the optics for 2 h predicts none of them for the rest of the 12 h (the first falls
    of an optic not yet seen to rise are the case it cannot judge, see learn_wander)."""
    n_links = 16
    ts = np.arange(0.0, 12 * 3600, STEP_S)
    rx = LEVEL_DBM + wander(np.random.default_rng(7), len(ts), 2 * n_links)
    det = OpticsDetector(links(n_links), rx_power_low_alarm_dbm=ALARM_DBM)
    found = run(det, ts, rx)
    late = sorted({p.slot for p in found if p.ts >= 2 * 3600})
    assert late == [], f"healthy wandering links predicted after the warm-up: {late}"
    # the optics' wander was learnt, so the test was not passed by learning nothing
    assert (det.s_fit[:, SIG_RX, optics.F_WANDER] > 0).all()


def decline_run(seed: int, rate_db_h: float = 4.0) -> tuple[list[Prediction], float]:
    """One link; end b wanders as above for 6 h, then loses ``rate_db_h`` on top of the same wander.
    Returns the active link_downs and when the decline alone reaches the alarm."""
    onset = 6 * 3600.0
    cross = onset + (LEVEL_DBM - ALARM_DBM) / rate_db_h * 3600
    ts = np.arange(0.0, cross + 1800, STEP_S)
    rx = LEVEL_DBM + wander(np.random.default_rng(seed), len(ts), 2)
    rx[:, 1] -= np.where(ts >= onset, rate_db_h * (ts - onset) / 3600, 0.0)
    det = OpticsDetector(links(1), rx_power_low_alarm_dbm=ALARM_DBM)
    return run(det, ts, rx), cross


def test_a_real_decline_with_the_same_wander_is_still_predicted_with_its_lead():
    """4 dB/h on top of the same wander (about 6 x the 0.63 dB/h spread of its 32-min slopes,
    simulated), 8 seeds: each predicted after its onset and at least 10 minutes before the decline
    alone reaches the alarm (75 minutes after the onset; 21-59 min measured), half of them at least
    30 minutes before;
    the wander alone, from 3 h (the optic's wander learnt) to the onset, is not predicted. (Before, the wander was:
    the ETA of whichever of its falls came first.) A decline not much steeper than the wander's own
    slopes cannot be told from it in a 32-minute window; see learn_wander."""
    leads = []
    for seed in range(8):
        found, cross = decline_run(seed)
        onset = 6 * 3600
        assert not [p for p in found if 3 * 3600 <= p.ts < onset], f"seed {seed}: the wander predicted"
        after = [p for p in found if p.ts >= onset]
        assert after and after[0].slot == 0 and "#b" in after[0].reason
        leads.append(cross - after[0].ts)
        # its ETA is the decline's, not the wander's: the alarm is reached within 20 minutes of it
        before = [p for p in after if p.ts < cross]
        assert abs(before[-1].ts + before[-1].eta_s - cross) < 1200
    assert min(leads) >= 600 and float(np.median(leads)) >= 1800, [round(x / 60) for x in leads]
