"""Physical bounds for the optics' and the Mahalanobis detector's counters (the others had theirs).

Before, both read their counters with no bound: one garbage reading was taken as an increase, and
its fall back as a reset that re-added the counter's whole total.

- optics: ``rx_corrected_bits`` read as 1e15 once on a healthy link (pre-FEC BER 1e-8) was a step
  "pre-FEC BER jumped from 9.9e-09 to 4.5e-01", a ``link_down`` predicted "now", a step back and a
  withdrawal; ``rx_bits`` read as 1e20 once was two steps (BER to 5e-13 and back). Health said
  "counter went backwards and stayed there", which it had not.
- mahalanobis: one garbage ``pcie_replays``, ``power_throttle_time`` or ``energy`` reading was an
  anomaly (``on_count=2``: the garbage and the re-added total are two samples in a row) and the
  model learnt from both.

Now the reading is refused and counted (``implausible_rise``), and each detector emits what it
emits and keeps what it keeps with that reading missing.
"""

from __future__ import annotations

import numpy as np
import pytest

from foreshock.detectors.counters import LINE_BITS_MAX_PER_S
from foreshock.detectors.mahalanobis import FIELDS, MAX_RATE, MahalanobisDetector
from foreshock.detectors.optics import OpticsDetector
from foreshock.fields import fields_of
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.simulator.engine import ClusterSimulator
from foreshock.topology import Topology

HIGHER = "higher than it can have counted"


def one_link() -> Topology:
    return Topology.from_dict({
        "rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
        "nodes": [{"name": "n0", "rack": "k", "gpus": 1}], "switches": [{"name": "leaf0"}],
        "links": [{"name": "n0/gpu0~leaf0", "a": "n0/gpu0", "b": "leaf0"}],
    })


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def as_records(findings: list) -> list[tuple]:
    return [(type(f).__name__, f.ts, f.slot, getattr(f, "event", getattr(f, "field", "")), f.reason) for f in findings]


# ---- optics ---------------------------------------------------------------------------------------
LINE_BPS = 425e9  # a 400G port's line: 400 Gb/s of data, KP4 FEC and coding


def optic_frames(bad_column: str | None = None, bad_value: float = np.nan, bad_at: float = 3050.0,
                 bad_rise: float = 0.0):
    """Both ends of a healthy link (BER 1e-8, steady RX power), a row every 10 s for four hours; the
    counters carry weeks of uptime. At ``bad_at`` (the last poll of a one-minute bucket, so the fall
    back lands in the next bucket) end b reads ``bad_value`` for ``bad_column``, or ``bad_rise`` more
    than it has."""
    rng = np.random.default_rng(3)
    bits, corrected = np.array([3e17, 5e17]), np.array([2e13, 3e13])
    for t in np.arange(0.0, 4 * 3600, 10.0):
        bits = bits + LINE_BPS * 10
        corrected = corrected + np.floor(LINE_BPS * 10 * 1e-8 * rng.uniform(0.9, 1.1, 2))
        cols = {"rx_power": -2.0 + rng.normal(0, 0.02, 2), "tx_power": np.ones(2), "tx_bias": np.full(2, 7e-3),
                "module_temp": np.full(2, 40.0), "rx_bits": bits.copy(), "rx_corrected_bits": corrected.copy()}
        if t == bad_at and bad_column:
            cols[bad_column][1] = cols[bad_column][1] + bad_rise if bad_rise else bad_value
        yield Frame("optic", [t, t], [0, 1], cols)


SNAPSHOT_AT = 3600.0  # ten buckets after the bad reading: its bucket is still in every trend window


def run_optics(frames, restore_after: float | None = None):
    """Findings, health, the detector's state ten buckets after the bad reading, and at the end."""
    health = PipelineHealth()
    det = OpticsDetector(one_link(), health=health)
    found, snapshot = [], {}
    for frame in frames:
        found += det.update(frame)
        if frame.ts[0] == restore_after:  # a worker restarted from its checkpoint
            det2 = OpticsDetector(one_link(), health=health)
            det2.load_state_dict(det.state_dict())
            det = det2
        if frame.ts[0] == SNAPSHOT_AT:
            snapshot = det.state_dict()
    return found, health, (snapshot, det.state_dict())


OPTIC_GARBAGE = {  # (column, value read, or how much more than it has)
    "corrected 1e15": ("rx_corrected_bits", 1e15, 0.0),  # ~1e14 bits/s: 50x the line-rate bound
    "bits 1e20": ("rx_bits", 1e20, 0.0),
    # +1e13 corrected bits in 10 s: under the line-rate bound (8e12 bits/s), over the 4.25e12 received
    "corrected over received": ("rx_corrected_bits", np.nan, 1e13),
}


@pytest.mark.parametrize("case", list(OPTIC_GARBAGE))
def test_one_garbage_optic_counter_reading_is_refused_and_the_detector_reads_as_without_it(case):
    column, value, rise = OPTIC_GARBAGE[case]
    found, health, states = run_optics(optic_frames(column, value, bad_rise=rise))
    without, health_without, states_without = run_optics(optic_frames(column, np.nan))
    assert without == []  # the healthy link: nothing to say
    assert as_records(found) == as_records(without)
    assert all(same_state(a, b) for a, b in zip(states, states_without))
    assert {reason: n for (_, reason), n in health.problems.items()} == {
        next(r for (_, r) in health.problems if HIGHER in r): 1}
    assert health_without.problems == {}


def test_a_negative_corrected_reading_leaves_the_bits_where_they_were_too():
    """One invalid reading of the pair: counted, and the row is taken for neither, so the next BER is
    over one interval for both. Taken alone, the bits' next increase spanned one interval and the
    corrected bits' two: the bucket's BER 1/6 too high (its accumulated sums differ)."""
    found, health, states = run_optics(optic_frames("rx_corrected_bits", -1.0))
    without, _, states_without = run_optics(optic_frames("rx_corrected_bits", np.nan))
    assert as_records(found) == as_records(without)
    assert all(same_state(a, b) for a, b in zip(states, states_without))
    assert [n for (_, reason), n in health.problems.items() if "negative" in reason] == [1]


@pytest.mark.parametrize("restore_after", [3050.0, 3060.0])
def test_a_restore_after_the_garbage_reading_reads_the_same(restore_after):
    """The counters' state is in the checkpoint: a restart right after the refused reading, or after
    the reading that follows it, changes nothing."""
    column, value, _ = OPTIC_GARBAGE["corrected 1e15"]
    found, _, states = run_optics(optic_frames(column, value), restore_after=restore_after)
    straight, _, states_straight = run_optics(optic_frames(column, value))
    assert as_records(found) == as_records(straight)
    assert all(same_state(a, b) for a, b in zip(states, states_straight))


# ---- mahalanobis ------------------------------------------------------------------------------------
def gpu_columns(n: int = 600) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    load = rng.uniform(300, 600, n)
    return {"gpu_temp": 30 + 0.05 * load + rng.normal(0, 0.3, n), "hbm_temp": 28 + 0.03 * load + rng.normal(0, 0.3, n),
            "power": load + rng.normal(0, 5, n), "sm_clock": np.full(n, 1.98e9), "util": np.clip(load / 600, 0, 1),
            "power_throttle_time": np.cumsum(rng.uniform(0, 0.1, n)),
            "thermal_throttle_time": np.cumsum(rng.uniform(0, 0.05, n)),
            "pcie_replays": np.cumsum(rng.poisson(0.2, n)).astype(float), "energy": 1e9 + np.cumsum(load)}


def run_mahalanobis(field: str, value: float, gpu_fields: str | None, at: int = 400):
    columns = gpu_columns()
    columns[field][at] = value
    health = PipelineHealth()
    # on_count 2: the garbage sample and the fall back re-adding the whole total were two in a row
    det = MahalanobisDetector(Topology.from_gpu_hosts([("n0", 0)]), health=health, gpu_fields=gpu_fields,
                              warmup=100, on_count=2)
    found = []
    for t in range(len(columns["power"])):
        found += det.update(Frame("gpu", [float(t)], [0], {k: [v[t]] for k, v in columns.items()}))
    return found, health, det


GPU_GARBAGE = {
    "pcie_replays": (1e12, None),  # 1e12 replays in a second
    "power_throttle_time": (1e6, None),  # 11 days held in a second
    "energy": (1e13, "gpu_temp,power,energy,util"),  # 1e13 J in a second
}


@pytest.mark.parametrize("field", list(GPU_GARBAGE))
def test_one_garbage_gpu_counter_reading_is_refused_and_the_model_reads_as_without_it(field):
    value, gpu_fields = GPU_GARBAGE[field]
    found, health, det = run_mahalanobis(field, value, gpu_fields)
    without, health_without, det_without = run_mahalanobis(field, np.nan, gpu_fields)
    assert without == []
    assert as_records(found) == as_records(without)
    state, state_without = det.state_dict(), det_without.state_dict()
    # one difference: a refused reading is not a gap in the input (the guard counts those)
    assert state.pop("imputed_rows") == state_without.pop("imputed_rows") - 1
    assert same_state(state, state_without)
    assert [n for (_, reason), n in health.problems.items() if HIGHER in reason] == [1]
    assert sum(health.problems.values()) == 1 and health_without.problems == {}


def test_every_gpu_and_node_counter_has_a_physical_bound():
    """A counter field added to the table must be given its bound here (or a reason it has none)."""
    counters = {f.name for kind in FIELDS for f in fields_of(kind) if f.is_counter}
    assert counters == set(MAX_RATE)
    det = MahalanobisDetector(Topology.from_gpu_hosts([("n0", 0)]), gpu_fields=",".join(sorted(
        f.name for f in fields_of("gpu") if f.unit not in ("bitmask", "code"))))
    rates = det.models["gpu"].rates
    assert dict(zip(rates.names, rates.spec[:, 1])) == {c: MAX_RATE[c] for c in rates.names}


# ---- the simulator's own counters ----------------------------------------------------------------------
def test_the_simulators_counters_stay_well_under_their_bounds_and_none_is_refused():
    """64 GPUs, 10 minutes, 1-s polls, an optic degrading: every optic's bits at most half the bound
    (an 800G uplink's line, 8.5e11 bits/s, is 0.43 of it), every GPU counter at most half its own;
    the detectors refuse nothing."""
    health = PipelineHealth()
    sim = ClusterSimulator(gpus=64, scenario="optic-degradation", seed=1, interval=1.0)
    optics = OpticsDetector(sim.topology, health=health)
    gpus = MahalanobisDetector(sim.topology, health=health, gpu_fields=",".join(MAX_RATE))
    last: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    fastest: dict[str, float] = {}
    for frame in sim.iter_frames(600.0):
        if frame.kind == "optic":
            optics.update(frame)
        elif frame.kind == "gpu":
            gpus.update(frame)
        else:
            continue
        names = ("rx_bits", "rx_corrected_bits") if frame.kind == "optic" else tuple(MAX_RATE)
        for name in names:
            values = frame.columns[name][np.argsort(frame.slot)]
            if name in last:
                before, t0 = last[name]
                rate = np.nanmax((values - before) / (frame.ts[0] - t0), initial=0.0)
                fastest[name] = max(fastest.get(name, 0.0), rate)
            last[name] = (values, frame.ts[0])
    assert len(fastest) == 2 + len(MAX_RATE)
    assert fastest["rx_bits"] <= 0.5 * LINE_BITS_MAX_PER_S and fastest["rx_corrected_bits"] < fastest["rx_bits"]
    assert all(fastest[name] <= 0.5 * bound for name, bound in MAX_RATE.items())
    assert fastest["energy"] > 0 and fastest["power_throttle_time"] >= 0
    assert not [reason for (_, reason), _ in health.problems.items() if HIGHER in reason]
