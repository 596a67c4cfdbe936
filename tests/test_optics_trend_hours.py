"""The optics early warning says how far off its limit is in tenths of a day, and in hours under one:
a warning starts past the 6-h horizon, and one 8.7 h off read "there in ~0 days" — as if now — until
2026-12-05 (audit /tmp/s62/audit_optics/)."""

from __future__ import annotations

import re

import numpy as np

from foreshock.detectors.optics import OpticsDetector, ber_of_q_db, q_db_of_ber
from foreshock.frames import Frame
from foreshock.topology import Topology

TOPO = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                           "nodes": [{"name": "n0", "rack": "k", "gpus": 1}], "switches": [{"name": "leaf0"}],
                           "links": [{"name": "n0/gpu0~leaf0", "a": "n0/gpu0", "b": "leaf0"}]})
CROSSING_S = 12 * 3600.0  # Q falls 0.5 dB/h from 6 dB above the FEC limit


def test_an_early_warning_hours_off_says_so() -> None:
    rng = np.random.default_rng(4)
    limit = q_db_of_ber(2.4e-4)
    det = OpticsDetector(TOPO, bucket_s=600, window=64, min_points=8, trend_window=4, trend_bucket_s=600,
                         trend_min_points=2)
    warnings = []
    for t in np.arange(0.0, 8 * 3600.0, 10.0):
        q = limit + 6.0 - t / 3600.0 * 0.5 + rng.normal(0.0, 0.02)
        cols = {k: np.full(2, np.nan) for k in ("tx_power", "tx_bias", "rx_bits", "rx_corrected_bits", "los",
                                                "module_temp")}
        cols.update(rx_power=np.array([-2.0, -2.0]), prefec_ber=np.array([ber_of_q_db(q), 1e-9]))
        warnings += [f for f in det.update(Frame("optic", [t, t], [0, 1], cols))
                     if f.type == "anomaly" and "at this rate" in f.reason]
    assert warnings
    for w in warnings:
        said = re.search(r"there in ~([\d.]+) days(?: \(([\d.]+) h\))? at this rate", w.reason)
        assert said, w.reason
        days, hours = float(said.group(1)), said.group(2)
        left = CROSSING_S - w.ts
        assert days > 0.0 and abs(days * 86400.0 - left) <= 0.35 * left, (w.ts, w.reason)
        assert hours is not None and abs(float(hours) * 3600.0 - left) <= 0.35 * left, (w.ts, w.reason)
