"""The shared thermal fit judges a frame holding several polls poll by poll, however the frame lists
its rows (``ThermalFit._in_time_order``).

A frame may hold two polls (a replay window of several ticks, a source batching by GPU). Listed by
GPU, the fit cut it into runs that mixed the polls (GPU0@a | GPU0@b GPU1@a | GPU1@b ...), and what a
consumer judges across the GPUs of one run — the power detector's "N of M GPUs of a node braking
together", the node's inlet proxy the thermal forecast reads where a rack reports no inlet — was
judged on rows of two polls (until 2026-12-05).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foreshock import facts
from foreshock.detectors.bank import DetectorBank
from foreshock.detectors.power import PowerDetector
from foreshock.detectors.thermal import ThermalDetector
from foreshock.findings import Anomaly, Prediction
from foreshock.frames import Frame
from thermal_synth import small_topology

BRAKE = float(facts.THROTTLE_HW_POWER_BRAKE)
N_GPUS = 8  # two nodes of 4 GPUs in one rack: node 0 holds GPUs 0-3
DT_S = 10.0
LATE = "gpu samples out of time order"

Poll = tuple[np.ndarray, ...]  # ts, slot, gpu_temp, power, throttle_reasons: one row per GPU


def polls(n_polls: int = 240) -> list[Poll]:
    """Eight GPUs at 640 W polled every 10 s, the die read in whole degrees, no rack inlet reading
    (the thermal forecast reads the node's proxy: across the GPUs of a poll). Node 0's coolant
    warms from 900 s and GPU 2's thermal interface degrades from 600 s (thermal predictions); in
    every twelfth pair of polls GPUs 0 and 1 brake together (a node event, over once none has braked
    for the power detector's off_hold_s, 60 s), six pairs later GPU 3 brakes in the pair's first poll
    only and GPU 0 in its second only (no poll shows two GPUs braking)."""
    rng = np.random.default_rng(5)
    temp = np.full(N_GPUS, 55.0)
    out: list[Poll] = []
    for k in range(n_polls):
        t = k * DT_S
        pair, second = divmod(k, 2)
        bits = np.zeros(N_GPUS)
        if pair % 12 == 0 and pair:
            bits[[0, 1]] = BRAKE
        if pair % 12 == 6:
            bits[0 if second else 3] = BRAKE
        power = np.where(bits > 0, 270.0, 640.0) + rng.uniform(-5.0, 5.0, N_GPUS)
        r_c_per_w = np.full(N_GPUS, 0.046)
        r_c_per_w[2] += 0.06 * max(0.0, t - 600.0) / 1800.0
        inlet = 25.0 + np.where(np.arange(N_GPUS) < 4, 0.03 * max(0.0, t - 900.0) / 60.0, 0.0)
        target = inlet + r_c_per_w * power
        temp = target + (temp - target) * math.exp(-DT_S / 10.0)
        out.append((np.full(N_GPUS, t), np.arange(N_GPUS), np.round(temp), power, bits))
    return out


def frame(rows: list[Poll], order: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Frame:
    """One GPU frame of ``rows`` (polls), listed as ``order(ts, slot)`` (indices) says."""
    ts, slot, temp, power, bits = (np.concatenate([p[c] for p in rows]) for c in range(5))
    at = order(ts, slot)
    return Frame("gpu", ts[at], slot[at], {"gpu_temp": temp[at], "power": power[at],
                                           "power_limit": np.full(len(at), 700.0), "throttle_reasons": bits[at]})


def by_time(ts: np.ndarray, slot: np.ndarray) -> np.ndarray:
    return np.lexsort((slot, ts))


def by_gpu(ts: np.ndarray, slot: np.ndarray) -> np.ndarray:
    return np.lexsort((ts, slot))


def findings(frames: list[Frame]) -> tuple[dict[str, list[str]], list[ThermalDetector | PowerDetector]]:
    """Each detector's findings (as text: NaN fields compare equal) of a bank of the thermal and
    power detectors (the default bank's order: thermal drives the shared fit, power reads it)."""
    topo = small_topology(nodes=2, gpus=4, racks=1)
    detectors: list[ThermalDetector | PowerDetector] = [ThermalDetector(topo), PowerDetector(topo)]
    bank = DetectorBank(topo, detectors)
    found: dict[str, list[str]] = {"thermal": [], "power": []}
    for f in frames:
        for finding in bank.update(f):
            assert isinstance(finding, (Anomaly, Prediction))  # (no processors: no incidents)
            found[finding.detector].append(repr(finding))
    return found, detectors


def pairs(rows: list[Poll]) -> list[list[Poll]]:
    return [rows[k:k + 2] for k in range(0, len(rows), 2)]


def test_findings_of_a_frame_of_two_polls_do_not_depend_on_how_it_lists_them() -> None:
    rows = polls()
    by_poll, _ = findings([frame([p], by_time) for p in rows])  # the reference: one frame per poll
    listed_by_time, _ = findings([frame(pair, by_time) for pair in pairs(rows)])
    listed_by_gpu, detectors = findings([frame(pair, by_gpu) for pair in pairs(rows)])
    # not vacuous: the scenario's thermal predictions and its node events are there, one for each of
    # the nine pairs (240 s apart, from 240 s) in which two GPUs brake together, none for those by turns
    assert any("thermal_throttle" in f for f in by_poll["thermal"])
    assert sum("entity_kind='node'" in f for f in by_poll["power"]) == 9
    for name in ("thermal", "power"):
        assert listed_by_time[name] == by_poll[name], name
        assert listed_by_gpu[name] == by_poll[name], name
    assert not any(LATE in reason for det in detectors for (_, reason) in det.health.problems)


def with_rows_moved(f: Frame, order: np.ndarray) -> Frame:
    return Frame("gpu", f.ts[order], f.slot[order], {k: v[order] for k, v in f.columns.items()})


@pytest.mark.parametrize("late", ["within the frame", "behind the previous frame"])
def test_a_late_row_is_counted_and_splits_no_poll(late: str) -> None:
    """A row no newer than its GPU's last sample — listed within its frame after a newer one of its
    GPU (a host clock stepping back), or older than its GPU's sample of the previous frame — is late
    data: skipped and counted (as the input guard, ``out_of_order``, and the fit in the order listed
    count it; not sorted into place), and it does not cut the poll it is listed in into two runs (the
    frames are listed by GPU). The findings are those of the polls without it, one frame each."""
    rows = polls()
    frames = [frame(pair, by_gpu) for pair in pairs(rows)]
    reference = [frame([p], by_time) for p in rows]
    if late == "within the frame":
        # pair 78 (1560 and 1570 s: GPU 2 heating, node 0 warming; GPU 3 braking at 1560 s only, GPU 0
        # at 1570 s only): GPU 2's rows reversed, its 1560-s row listed after its 1570-s one. Left
        # among the 1570-s rows, it would cut that poll into two runs between GPUs 0 and 3, and the
        # first would read GPU 0 braking with GPU 3 as it stood at 1560 s: "2 of 4 GPUs braking"
        k = 78
        gpu2 = np.flatnonzero(frames[k].slot == 2)
        order = np.arange(len(frames[k]))
        order[gpu2] = gpu2[::-1]
        frames[k] = with_rows_moved(frames[k], order)
        assert list(frames[k].ts[frames[k].slot == 2]) == [1570.0, 1560.0]
        keep = np.arange(N_GPUS) != 2
        reference[2 * k] = frame([tuple(c[keep] for c in rows[2 * k])], by_time)
    else:
        # pair 100 (2000 and 2010 s): a row of GPU 5 stamped 1985 s, 5 s before its row of the previous
        # frame, listed before its own rows
        k = 100
        f = frames[k]
        at = int(np.flatnonzero(f.slot == 5)[0])
        frames[k] = Frame("gpu", np.insert(f.ts, at, 1985.0), np.insert(f.slot, at, 5),
                          {name: np.insert(v, at, v[at]) for name, v in f.columns.items()})
    got, detectors = findings(frames)
    want, _ = findings(reference)
    # counted once, by the detector the frame was fitted for (the first to read the shared fit), not
    # again by each reader (until 2026-12-06)
    assert [det.health.problems[(det.name, LATE)] for det in detectors] == [1] + [0] * (len(detectors) - 1)
    for name in ("thermal", "power"):
        assert got[name] == want[name], name


def naive_poll_order_keys(ts: list[float], slots: list[int], fitted: list[float]) -> list[float]:
    """Each row's stamp, +inf where its GPU has a sample as new or newer: fitted before (NaN: none)
    or listed before it in this frame."""
    keys, newest = [], {}
    for t, i in zip(ts, slots):
        before = [v for v in (fitted[i], newest.get(i, -math.inf)) if v == v]
        keys.append(t if t > max(before) else math.inf)
        newest[i] = max(newest.get(i, -math.inf), t)
    return keys


@pytest.mark.kernel
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.0, 5.0, 10.0, 15.0, math.nan])), max_size=12),
       st.lists(st.sampled_from([math.nan, 0.0, 5.0, 10.0]), min_size=4, max_size=4))
def test_poll_order_keys_matches_a_naive_reference(rows: list[tuple[int, float]], fitted: list[float]) -> None:
    from foreshock.detectors.thermal_fit import poll_order_keys
    ts = np.array([t for _, t in rows], dtype=float)
    slots = np.array([i for i, _ in rows], dtype=np.int64)
    latest = np.full(4, -np.inf)
    keys = np.empty(len(rows))
    poll_order_keys(ts, slots, np.array(fitted), latest, keys)
    assert keys.tolist() == naive_poll_order_keys(ts.tolist(), slots.tolist(), fitted)
    assert (latest == -np.inf).all()  # the scratch left as found
