"""The XID detector's uncorrectable-ECC findings and XID codes, as the third audit found them.

A DBE finding opens a GPU-error incident, so a false one matters. A decrease of the DBE count read as
a reset (5 -> 3) was reported at once as "3 new" errors, though the next reading (back to 5) showed
one bad reading: held until that reading decides, it is reported only if the reset stands.

An XID is a whole number in the guard's 0..1023 for ``xid_last``. An exporter's -1 (N/A) or DCGM's
not-supported sentinel fed past the guard (the Frame API) had been remembered as the last code, and
the next real reading of the latched code read as a new XID 79, "GPU fell off the bus"; the exporter's
XID counter (``exporters/store.py``) had the same rule.
"""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import generate_latest

from foreshock.detectors.xid import XidDetector
from foreshock.exporters.prometheus import build_registry
from foreshock.exporters.store import FindingStore
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

pytestmark = pytest.mark.kernel  # (is_xid_code, _nth_of_slot and the counter rules are Numba kernels)

DCGM_NOT_SUPPORTED = 9223372036854775794.0  # DCGM's int64 "field not supported" blank value
INTERVAL = 10.0


def poll(ts: list[float], column: str, values: list[float]) -> Frame:
    """GPU 0's readings of ``column`` at ``ts``, one row each."""
    return Frame("gpu", np.array(ts), np.zeros(len(ts), np.int32), {column: np.array(values)})


def scores(found: list[Finding], field: str) -> list[tuple[float, float]]:
    """(time, score) of each finding, all anomalies of ``field``."""
    assert all(isinstance(f, Anomaly) and f.field == field for f in found)
    return [(f.ts, f.score) for f in found if isinstance(f, Anomaly)]


def one_gpu() -> Topology:
    return Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
                               "nodes": [{"name": "n", "rack": "k", "gpus": 1}]})


def dbe_findings(readings: list[float], batch: bool = False, cut: int | None = None) -> list[tuple[float, float]]:
    """(time, new errors) of each DBE finding, one poll per frame (or all polls in one frame, or a
    checkpoint restored into a fresh detector before poll ``cut``)."""
    det = XidDetector(one_gpu())
    ts = [i * INTERVAL for i in range(len(readings))]
    found: list[Finding]
    if batch:
        found = det.update(poll(ts, "ecc_dbe", readings))
    else:
        found = []
        for i, (t, v) in enumerate(zip(ts, readings)):
            if i == cut:
                restored = XidDetector(one_gpu())
                restored.load_state_dict(det.state_dict())
                det = restored
            found += det.update(poll([t], "ecc_dbe", [v]))
    return scores(found, "ecc_dbe")


# (readings, the findings they mean): the times are the readings' own (INTERVAL apart)
CASES = [
    # one low (non-zero) reading, then back: a glitch, no new error (had been "3 new" / "4 new" at 20 s)
    ([5.0, 5.0, 3.0, 5.0, 5.0], []),
    ([5.0, 5.0, 4.0, 5.0, 5.0], []),
    # back and one more: the one real error, at the reading that shows it (had been "3 new" at 20 s)
    ([5.0, 5.0, 3.0, 6.0, 6.0], [(30.0, 1.0)]),
    # the count cleared (a driver reload) with 3 errors since, and it stays: the 3 are reported once the
    # next reading shows the reset stands, with that reading's own rise
    ([5.0, 5.0, 3.0, 3.0, 3.0], [(30.0, 3.0)]),
    ([5.0, 5.0, 3.0, 4.0, 4.0], [(30.0, 4.0)]),
    # two decreases in a row: the first stands (reported at the second), the second waits for the third
    ([5.0, 5.0, 3.0, 2.0, 2.0], [(30.0, 3.0), (40.0, 2.0)]),
]


@pytest.mark.parametrize("readings, expected", CASES)
def test_a_reset_is_reported_only_once_the_next_reading_shows_it_stands(readings, expected) -> None:
    assert dbe_findings(readings) == expected


@pytest.mark.parametrize("readings, expected", CASES)
def test_the_polls_of_one_frame_read_as_one_poll_per_frame(readings, expected) -> None:
    """A replay's batch holds a GPU's several polls in one frame: what each reading decided must
    still be seen (the rules show it only in the counter's state, after each reading)."""
    assert dbe_findings(readings, batch=True) == expected


@pytest.mark.parametrize("cut", [3, 4])
def test_a_held_reset_across_a_checkpoint_reads_as_without_one(cut: int) -> None:
    """Restored between the low reading and the one that decides it: the held increase is the
    counter's last value, in the checkpoint; nothing is lost or doubled."""
    assert dbe_findings([5.0, 5.0, 3.0, 6.0, 6.0], cut=cut) == [(30.0, 1.0)]
    assert dbe_findings([5.0, 5.0, 3.0, 3.0, 4.0], cut=cut) == [(30.0, 3.0), (40.0, 1.0)]


def xid_findings(codes: list[float]) -> list[tuple[float, float]]:
    det = XidDetector(one_gpu())
    found: list[Finding] = []
    for i, code in enumerate(codes):
        found += det.update(poll([i * INTERVAL], "xid_last", [code]))
    return scores(found, "xid_last")


@pytest.mark.parametrize("no_code", [-1.0, DCGM_NOT_SUPPORTED, 1024.0])  # (79.5: test_xid_counter_rules)
def test_a_reading_that_is_no_xid_code_is_neither_reported_nor_remembered(no_code: float) -> None:
    # the latched 79 read again after it is no new XID (it had been a new "GPU fell off the bus")
    assert xid_findings([79.0, no_code, 79.0, 79.0]) == []
    # a real change after it is one, measured against the last code (79), at the reading that shows it
    assert xid_findings([79.0, no_code, 48.0]) == [(20.0, 48.0)]
    # the first code a GPU shows may be latched from long ago, whatever came before it
    assert xid_findings([no_code, 79.0, 79.0]) == []


def store_xid_series(codes: list[float]) -> tuple[set[str], PipelineHealth]:
    """The ``xid`` labels of ``foreshock_xid_events_total``, unguarded frames fed to the store."""
    health = PipelineHealth()
    store = FindingStore(one_gpu(), health=health)
    for i, code in enumerate(codes):
        store.observe_frame(poll([100.0 + i * INTERVAL], "xid_last", [code]))
    lines = [line for line in generate_latest(build_registry(store)).decode().splitlines()
             if line.startswith("foreshock_xid_events_total")]
    return {line.split('xid="')[1].split('"')[0] for line in lines}, health


@pytest.mark.parametrize("no_code", [-1.0, DCGM_NOT_SUPPORTED])
def test_the_exporters_xid_counter_reads_codes_by_the_same_rule(no_code: float) -> None:
    """79 latched, then an N/A, then 79 again: no XID event (had been a critical xid="79"); the reading
    is counted as a problem of the input. A real change after one is counted."""
    series, health = store_xid_series([79.0, no_code, 79.0, 79.0])
    assert series == set()
    assert health.problems[("store", "XID code outside the guard's range: not counted")] == 1
    series, _ = store_xid_series([79.0, no_code, 48.0])
    assert series == {"48"}
