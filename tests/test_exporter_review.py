"""The exporter against review h32's findings: a leaf's congestion counter that fell when the
store dropped links, two detectors' predictions of one event that replaced each other, a fixed
120-s staleness window that hid every entity of a slow poll for most of each cycle, and an
unknown ETA exported (and printed) as "due now"."""

from __future__ import annotations

import io
import math

import numpy as np
from prometheus_client import CollectorRegistry
from rich.console import Console

from foreshock.exporters.console import FindingTally, render_summary
from foreshock.exporters.prometheus import build_registry
from foreshock.exporters.store import FindingStore
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.health import PipelineHealth
from foreshock.topology import Topology

RISE = 1e6  # every port's xmit_wait rises by this much per poll (steady congestion)
LEAF0 = {"cluster": "test", "leaf": "leaf0"}


def _links(topology: Topology, ts: float, waits: np.ndarray) -> Frame:
    n = topology.size("link")
    return Frame("link", np.full(n, ts), np.arange(n), {"xmit_wait": waits, "link_state": np.full(n, 4.0)})


def _leaf0(registry: CollectorRegistry) -> float:
    value = registry.get_sample_value("foreshock_leaf_xmit_wait_ticks_total", LEAF0)
    assert value is not None
    return float(value)


def _leaf0_links(topology: Topology, nodes: tuple[str, ...]) -> np.ndarray:
    return np.array([name.endswith("~leaf0") and name.split("/")[0] in nodes for name in topology.links])


def _without_node3(topology: Topology) -> Topology:
    """``topology`` (conftest's small one) with node3, its links and its job membership gone."""
    data = topology.to_dict()
    data["nodes"] = [n for n in data["nodes"] if n["name"] != "node3"]
    data["links"] = [link for link in data["links"] if not link["a"].startswith("node3/")]
    data["jobs"] = [{**job, "nodes": [n for n in job["nodes"] if n != "node3"]} for job in data["jobs"]]
    return Topology.from_dict(data)


# ---- 1. the leaf counter never falls --------------------------------------------------------
def test_the_leaf_counter_does_not_fall_when_a_worker_gives_links_up(small_topology: Topology) -> None:
    """A Kafka worker giving up the partition of node2 and node3 (``forget``): leaf0's counter
    keeps what their links rose by while they were its own (it adds nothing more to rate()), and
    goes on rising by exactly what the links it still owns rise by. It fell by their totals:
    Prometheus read a reset, and the whole remaining sum as new increase. A link back in its care
    counts from its first reading again, not its whole counter (its owner counted that)."""
    topo = small_topology
    store = FindingStore(topo)
    registry = build_registry(store)
    polls = 11
    for k in range(polls):
        store.observe_frame(_links(topo, 100.0 + 30 * k, np.full(topo.size("link"), RISE * k)))
    before = _leaf0(registry)
    assert before == 4 * RISE * (polls - 1)  # four nodes' links under leaf0, each risen every poll but the first
    given_up = np.zeros(topo.size("link"), dtype=bool)
    given_up[[i for i, name in enumerate(topo.links) if name.split("/")[0] in ("node2", "node3")]] = True
    store.forget({"link": given_up})
    assert _leaf0(registry) == before
    kept = np.where(given_up, np.nan, RISE * polls)
    store.observe_frame(_links(topo, 100.0 + 30 * polls, kept))
    still_own = int(_leaf0_links(topo, ("node0", "node1")).sum())
    assert _leaf0(registry) == before + still_own * RISE
    # node2's leaf0 link back in this store's care, its counter far above where it was given up
    back = _leaf0_links(topo, ("node2",))
    waits = np.where(given_up & ~back, np.nan, RISE * (polls + 1))
    waits[back] = RISE * 50
    store.observe_frame(_links(topo, 100.0 + 30 * (polls + 1), waits))
    assert _leaf0(registry) == before + 2 * still_own * RISE  # the returning link's first reading adds nothing
    waits[back] += RISE
    waits[~given_up] += RISE
    store.observe_frame(_links(topo, 100.0 + 30 * (polls + 2), waits))
    assert _leaf0(registry) == before + 3 * still_own * RISE + RISE


def test_the_leaf_counter_does_not_fall_when_a_host_is_dropped_from_the_topology(small_topology: Topology) -> None:
    """``watch`` forgetting a host (``--forget-after``) moves the store onto a topology without
    it: leaf0's counter keeps what node3's link had risen by (it fell by it: a reset to rate()),
    and rises by what the links still listed rise by."""
    topo = small_topology
    store = FindingStore(topo)
    registry = build_registry(store)
    polls = 11
    for k in range(polls):
        store.observe_frame(_links(topo, 100.0 + 30 * k, np.full(topo.size("link"), RISE * k)))
    before = _leaf0(registry)
    smaller = _without_node3(topo)
    store.move_to(smaller)
    assert _leaf0(registry) == before
    store.observe_frame(_links(smaller, 100.0 + 30 * polls, np.full(smaller.size("link"), RISE * polls)))
    assert _leaf0(registry) == before + int(_leaf0_links(smaller, ("node0", "node1", "node2")).sum()) * RISE
    # back on a topology with node3 (served again): its new link counts from its first reading
    store.move_to(topo)
    store.observe_frame(_links(topo, 100.0 + 30 * (polls + 1), np.full(topo.size("link"), RISE * (polls + 1))))
    assert _leaf0(registry) == before + 2 * 3 * RISE


# ---- 1b. the leaf counter reads xmit_wait as the congestion detector does ---------------------
HEALTHY = 2.49e9  # a healthy NDR port's port_xmit_wait total (FACTS)


def _one_port_read(topology: Topology, store: FindingStore, readings: list[float], poll_s: float = 10.0,
                   move_before: int = -1) -> list[float]:
    """Feed ``store`` polls where leaf0's first link reads ``readings`` and every other link rises
    by RISE a poll (``move_before``: move the store onto ``topology`` again before that poll);
    returns leaf0's counter less the other links' share after each poll."""
    registry = build_registry(store)
    link = int(np.flatnonzero(_leaf0_links(topology, ("node0",)))[0])
    others = int(_leaf0_links(topology, ("node0", "node1", "node2", "node3")).sum()) - 1
    seen = []
    for k, value in enumerate(readings):
        if k == move_before:
            store.move_to(Topology.from_dict(topology.to_dict()))
        waits = np.full(topology.size("link"), RISE * k)
        waits[link] = value
        store.observe_frame(_links(topology, 100.0 + poll_s * k, waits))
        seen.append(_leaf0(registry) - others * RISE * k)
    return seen


def test_one_glitched_reading_adds_only_the_true_rise_to_the_leaf_counter(small_topology: Topology) -> None:
    """A port's xmit_wait read 0 once between readings of ~2.49e9 (a driver's momentary 0): the
    congestion detector reads a glitch, and so does the leaf counter — it added the port's whole
    total at the reading after it (+2.49e9 ticks: a giant false congestion spike on the fabric
    board). The rise the low reading hid counts once the counter is back. A pending low reading
    follows the link through a move of the store (``watch`` taking in a host)."""
    readings = [HEALTHY, HEALTHY + 10_000, 0.0, HEALTHY + 30_000, HEALTHY + 40_000]
    assert _one_port_read(small_topology, FindingStore(small_topology), readings) == \
        [0.0, 10_000.0, 10_000.0, 30_000.0, 40_000.0]
    moved = _one_port_read(small_topology, FindingStore(small_topology), readings, move_before=3)
    assert moved == [0.0, 10_000.0, 10_000.0, 30_000.0, 40_000.0]


def test_a_32_bit_wrap_adds_the_wrapped_rise_to_the_leaf_counter(small_topology: Topology) -> None:
    """A 32-bit port_xmit_wait passing 2**32 (``counter_bits=32``, as the congestion detector is
    told): the wrapped rise counts (it counted only the value after the wrap, as a reset)."""
    top = 2.0**32
    readings = [top - 25_000, top - 15_000, top - 5_000, 5_000.0, 15_000.0]
    store = FindingStore(small_topology, congestion_params={"counter_bits": 32})
    assert _one_port_read(small_topology, store, readings) == [0.0, 10_000.0, 20_000.0, 30_000.0, 40_000.0]


def test_a_cleared_counter_still_counts_from_zero(small_topology: Topology) -> None:
    """A real clear (``perfquery -R``, a driver reload): the counter stays low, and its new value
    counts as its rise (Prometheus's rule), as it did. The store counts no problem of its own: the
    congestion detector, reading the same rows, counts the reset once."""
    health = PipelineHealth()
    store = FindingStore(small_topology, health)
    readings = [HEALTHY, HEALTHY + 10_000, 4_000.0, 14_000.0, 24_000.0]
    assert _one_port_read(small_topology, store, readings) == [0.0, 10_000.0, 14_000.0, 24_000.0, 34_000.0]
    assert not health.problems


def test_the_store_reads_xmit_wait_with_the_congestion_detectors_bounds(small_topology: Topology) -> None:
    """The leaf counter's wrap modulus and physical bound are the congestion detector's for
    xmit_wait, with its defaults and with its parameters overridden alike."""
    from foreshock.detectors.congestion import C_WAIT, CongestionDetector
    from foreshock.exporters.store import xmit_wait_counter

    for params in ({}, {"counter_bits": 32.0}, {"counter_bits": 32.0, "tick_bytes": 16.0, "default_rate_bps": 4e12}):
        detector = CongestionDetector(small_topology, None, **params)
        store_counter = xmit_wait_counter(small_topology.size("link"), params)
        np.testing.assert_array_equal(store_counter.spec[0], detector.counters.spec[C_WAIT])


def test_a_run_given_the_congestion_detectors_counter_width_reads_the_leaf_counters_by_it(
        small_topology: Topology) -> None:
    """``--param congestion.counter_bits=32`` reaches the store as well as the detector: a wrap
    the detector reads as a wrap is one for the leaf counters too."""
    from foreshock.cli.common import build_pipeline
    from foreshock.detectors.congestion import C_WAIT, CongestionDetector

    run = build_pipeline(small_topology, "congestion", "127.0.0.1", 0, None, 16,
                         params=["congestion.counter_bits=32"])
    detector = next(d for d in run.pipeline.bank.detectors if isinstance(d, CongestionDetector))
    assert detector.counters.spec[C_WAIT][0] == 2.0**32  # (the modulus: the setting was taken)
    top = 2.0**32
    readings = [top - 25_000, top - 15_000, top - 5_000, 5_000.0, 15_000.0]
    assert _one_port_read(small_topology, run.store, readings) == [0.0, 10_000.0, 20_000.0, 30_000.0, 40_000.0]


# ---- 2. predictions are keyed by their detector too ----------------------------------------
def test_two_detectors_predicting_one_event_of_one_gpu_are_two_predictions(small_topology: Topology) -> None:
    """``--detectors thermal,threshold`` both predicting node0/gpu3's throttle: two series (the
    ``detector`` label), two raised, and one detector's withdrawal leaves the other's prediction
    (it deleted it). A board swap's caller (``active_predictions``) is handed both."""
    store = FindingStore(small_topology)
    registry = build_registry(store)
    thermal = Prediction(100.0, "gpu", 3, "thermal_throttle", 600.0, 0.9, "thermal", "R rising")
    threshold = Prediction(100.0, "gpu", 3, "thermal_throttle", 1800.0, 0.6, "threshold", "score high")
    store.observe_findings([thermal, threshold])

    def eta(detector: str) -> float | None:
        labels = {"cluster": "test", "event": "thermal_throttle", "entity_kind": "gpu", "entity": "node0/gpu3",
                  "rack": "rack0", "detector": detector}
        return registry.get_sample_value("foreshock_prediction_eta_seconds", labels)  # type: ignore[no-any-return]

    assert eta("thermal") == thermal.eta_s and eta("threshold") == threshold.eta_s
    assert registry.get_sample_value("foreshock_predictions_raised_total",
                                     {"cluster": "test", "event": "thermal_throttle"}) == 2
    assert sorted(p.detector for p in store.active_predictions("gpu", [3])) == ["thermal", "threshold"]
    store.observe_findings([Prediction(110.0, "gpu", 3, "thermal_throttle", -1.0, 0.6, "threshold", "below",
                                       active=False)])
    assert eta("threshold") is None and eta("thermal") == thermal.eta_s
    assert [p.detector for p in store.active_predictions("gpu", [3])] == ["thermal"]
    assert registry.get_sample_value("foreshock_predictions_active",
                                     {"cluster": "test", "event": "thermal_throttle", "rack": "rack0"}) == 1


# ---- 3. the staleness window follows the poll interval ---------------------------------------
class _Wall:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _gpus(topology: Topology, ts: float, slots: np.ndarray | None = None) -> Frame:
    slots = np.arange(topology.size("gpu")) if slots is None else slots
    n = len(slots)
    return Frame("gpu", np.full(n, ts), slots, {"gpu_temp": np.full(n, 70.0), "hbm_temp": np.full(n, 93.0),
                                               "throttle_reasons": np.full(n, 128.0)})


def _reporting(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("foreshock_gpus_reporting", {"cluster": "test"})  # type: ignore[no-any-return]


def test_a_slow_poll_keeps_its_entities_exported_between_polls(small_topology: Topology) -> None:
    """``watch --interval 300``: from its second poll on, every GPU is reported and its series
    exported at every scrape of the cycle (a fixed 120 s left them all out, and gpus_reporting at
    0, for 180 s of each poll). A node that stops is still left out, a few intervals later."""
    topo = small_topology
    wall = _Wall()
    store = FindingStore(topo, wall_clock=wall)
    registry = build_registry(store)
    braking = {"cluster": "test", "rack": "rack1", "node": "node3", "gpu": "7"}
    start = wall.now
    for poll in range(4):
        wall.now = start + 300.0 * poll
        store.observe_frame(_gpus(topo, wall.now), wall.now)
        for after in (15.0, 135.0, 285.0):
            wall.now = start + 300.0 * poll + after
            if poll == 0:
                continue  # the interval is known from the second poll on
            assert _reporting(registry) == 32.0, (poll, after)
            assert registry.get_sample_value("foreshock_gpu_throttle_reasons", braking) == 128.0, (poll, after)
    # node3 stops; the others go on every 300 s
    others = np.flatnonzero(topo.gpu_node != 3)
    last_heard = start + 300.0 * 3
    for poll in range(4, 8):
        wall.now = start + 300.0 * poll
        store.observe_frame(_gpus(topo, wall.now, others), wall.now)
        assert _reporting(registry) == (32.0 if wall.now - last_heard <= 3 * 300.0 else 24.0), poll
    assert registry.get_sample_value("foreshock_gpu_throttle_reasons", braking) is None


def test_a_pipeline_pause_does_not_widen_the_staleness_window_for_good(small_topology: Topology) -> None:
    """A 30-s poll, one pause of an hour, then 30-s polls again: a node that stops two polls
    after the pause is left out 120 s after its last report, as before the pause (the window's
    floor), not three hours later: the pause is one long gap among the recent short ones."""
    topo = small_topology
    wall = _Wall()
    store = FindingStore(topo, wall_clock=wall)
    registry = build_registry(store)
    for gap in [30.0] * 10 + [3600.0] + [30.0] * 2:
        wall.now += gap
        store.observe_frame(_gpus(topo, wall.now), wall.now)
    last_heard = wall.now
    others = np.flatnonzero(topo.gpu_node != 3)
    for _ in range(8):
        wall.now += 30.0
        store.observe_frame(_gpus(topo, wall.now, others), wall.now)
        assert _reporting(registry) == (32.0 if wall.now - last_heard <= 120.0 else 24.0), wall.now - last_heard


# ---- 4. an unknown ETA is no ETA of 0 --------------------------------------------------------
def test_an_unknown_eta_is_exported_as_nan_and_printed_as_unknown(small_topology: Topology) -> None:
    """``power_cap``'s "no finite forecast" (eta_s -1) was exported as 0 once the store had a
    clock (``ForeshockThrottlePredicted``'s ``< 1800`` held: "in 0s") and printed "ETA -0.0 min".
    Its series is NaN (no comparison holds), before a frame and after; it still counts as active;
    a known ETA beside it counts down as before."""
    store = FindingStore(small_topology)
    registry = build_registry(store)
    unknown = Prediction(100.0, "gpu", 4, "power_cap", -1.0, 0.7, "power", "heading for the limit")
    known = Prediction(100.0, "gpu", 5, "power_cap", 300.0, 0.7, "power", "heading for the limit")
    store.observe_findings([unknown, known])

    def eta(p: Prediction) -> float | None:
        labels = {"cluster": "test", "event": "power_cap", "entity_kind": "gpu",
                  "entity": small_topology.name("gpu", p.slot), "rack": "rack0", "detector": "power"}
        return registry.get_sample_value("foreshock_prediction_eta_seconds", labels)  # type: ignore[no-any-return]

    value = eta(unknown)
    assert value is not None and math.isnan(value)
    n = small_topology.size("gpu")
    store.observe_frame(Frame("gpu", np.full(n, 110.0), np.arange(n), {"gpu_temp": np.full(n, 50.0)}))
    value = eta(unknown)
    assert value is not None and math.isnan(value)
    assert eta(known) == known.eta_s - 10.0
    assert registry.get_sample_value("foreshock_predictions_active",
                                     {"cluster": "test", "event": "power_cap", "rack": "rack0"}) == 2
    tally = FindingTally(small_topology)
    tally.observe_findings([unknown])
    out = io.StringIO()
    render_summary(tally, PipelineHealth(), console=Console(file=out, width=200))
    row = next(line for line in out.getvalue().splitlines() if "power_cap" in line and "node0/gpu4" in line)
    assert "ETA unknown" in row and "min" not in row


def test_a_scrape_asking_for_some_metrics_by_name_gets_them(small_topology: Topology) -> None:
    """Prometheus's ``params: {name[]: [...]}`` filters a scrape by metric name. The collectors name
    no metric up front, so without ``support_collectors_without_names`` the registry answered 200
    with an empty page: the target stayed up while every foreshock series vanished."""
    from prometheus_client import generate_latest

    store = FindingStore(small_topology)
    n = small_topology.size("gpu")
    store.observe_frame(Frame("gpu", np.full(n, 100.0), np.arange(n), {"gpu_temp": np.full(n, 80.0)}))
    page = generate_latest(build_registry(store).restricted_registry(["foreshock_gpus_reporting"])).decode()
    assert [line.split("{")[0] for line in page.splitlines() if not line.startswith("#")] == ["foreshock_gpus_reporting"]


def test_xid_codes_that_are_no_xid_make_no_series(small_topology: Topology) -> None:
    """An XID code past 1023 is refused by the guard's range (each distinct garbled code had made a new
    series per GPU, for good), and a fractional one is counted, not truncated (79.5 had been served as
    a critical xid="79"): by the guard, and by the store where a frame reaches it unguarded."""
    from foreshock.guard import InputGuard
    from prometheus_client import generate_latest

    health = PipelineHealth()
    store = FindingStore(small_topology, health=health)
    guard = InputGuard(small_topology, health)
    n = small_topology.size("gpu")
    for t, code in enumerate((0.0, 79.5, 1e12, 2e12, 13.0)):
        store.observe_frame(guard.check(Frame("gpu", np.full(n, 100.0 + t), np.arange(n),
                                              {"xid_last": np.full(n, code)})))
    xids = [line for line in generate_latest(build_registry(store)).decode().splitlines()
            if line.startswith("foreshock_xid_events_total")]
    assert {line.split('xid="')[1].split('"')[0] for line in xids} == {"13"}, xids
    assert health.problems[("guard", "not_whole: xid_last")] == n
    assert health.problems[("guard", "out_of_range: xid_last")] == 2 * n
    store.observe_frame(Frame("gpu", np.full(n, 200.0), np.arange(n), {"xid_last": np.full(n, 79.5)}))
    assert health.problems[("store", "XID code not a whole number: not counted")] == n
