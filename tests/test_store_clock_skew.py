"""The /metrics store's clock with sources whose clocks differ (``foreshock watch``, the Kafka worker).

On telemetry time (``last_ts``: the newest row of the last frame) the clock see-sawed with
whichever source spoke last: a BMC 60 s behind its nodes made ETAs jump back by a minute at each
of its polls; a frame from an agent 600 s fast made every other entity read stale (their values
left /metrics, ``gpus_reporting`` fell to that agent's GPUs) and lapsed everyone's anomalies at
once. A live store measures on the wall clock, by arrival. Replays keep telemetry time exactly.
The wall clock here is a fake one, moved by the test: no sleeps.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from foreshock.cli.common import PipelineRun, build_pipeline
from foreshock.cli.main import cli
from foreshock.detectors.bank import DetectorBank
from foreshock.exporters.prometheus import build_registry
from foreshock.exporters.store import FindingStore
from foreshock.findings import Anomaly, Prediction
from foreshock.frames import Frame
from foreshock.remap import Remap
from foreshock.streams.kafka_worker import DetectionStage
from foreshock.topology import Topology

from local_http import ScrapeServer

T0 = 1_800_000_000.0  # the wall clock's start (any time: nothing here reads the real clock)
STALE_AFTER_S = 120.0  # the collector's default window


class FakeWall:
    """A wall clock the test moves."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _gpus(slots: np.ndarray, ts: float | np.ndarray, temp: float = 60.0) -> Frame:
    n = len(slots)
    return Frame("gpu", np.broadcast_to(np.asarray(ts, dtype=np.float64), (n,)).copy(), np.asarray(slots),
                 {"gpu_temp": np.full(n, temp), "power": np.full(n, 500.0)})


def _fans(ts: float, n_nodes: int) -> Frame:
    return Frame("node", np.full(n_nodes, ts), np.arange(n_nodes), {"fan_speed": np.full(n_nodes, 0.5)})


def _reporting(registry) -> float | None:  # type: ignore[no-untyped-def]
    return registry.get_sample_value("foreshock_gpus_reporting", {"cluster": "test"})  # type: ignore[no-any-return]


def _fans_exported(registry, topology: Topology) -> int:  # type: ignore[no-untyped-def]
    return sum(registry.get_sample_value("foreshock_node_fan_speed_ratio",
                                         {"cluster": "test", "rack": topology.racks[topology.node_rack[nd]],
                                          "node": topology.nodes[nd]}) is not None
               for nd in range(topology.size("node")))


def _eta_labels(topology: Topology, slot: int) -> dict[str, str]:
    return {"cluster": "test", "event": "thermal_throttle", "entity_kind": "gpu", "entity": topology.name("gpu", slot),
            "rack": topology.labels("gpu", slot)["rack"], "detector": "thermal"}


def _skewed_cluster(topology: Topology, store: FindingStore, wall: FakeWall, seconds: int):  # type: ignore[no-untyped-def]
    """Feed ``store`` ``seconds`` of a live cluster, a frame at a time, moving ``wall``: node0's
    agent stamps its GPUs 600 s fast, the other nodes' agents are on time, the BMCs (every node's
    fans) stamp 60 s behind. Yields after every frame."""
    gpus = np.arange(topology.size("gpu"))
    fast = gpus[topology.gpu_node == 0]
    on_time = gpus[topology.gpu_node != 0]
    for t in range(0, seconds + 1, 10):
        wall.now = T0 + t
        store.observe_frame(_gpus(on_time, wall.now), wall.now)
        yield
        store.observe_frame(_gpus(fast, wall.now + 600.0), wall.now)
        yield
        if t % 30 == 0:
            store.observe_frame(_fans(wall.now - 60.0, topology.size("node")), wall.now)
            yield


# ---- live: staleness ------------------------------------------------------------------------
def test_a_source_60s_behind_and_an_agent_600s_fast_leave_no_entity_stale(small_topology: Topology) -> None:
    """Every GPU and every node's fans report steadily, each source by its own clock: at every
    scrape all 32 GPUs report and all 4 nodes' fans are exported. (On telemetry time, each scrape
    after the fast agent's frame counted only its 8 GPUs and left out every node's fans.)"""
    wall = FakeWall()
    store = FindingStore(small_topology, wall_clock=wall)
    registry = build_registry(store)
    counts, fans = [], []
    for _ in _skewed_cluster(small_topology, store, wall, 300):
        counts.append(_reporting(registry))
        fans.append(_fans_exported(registry, small_topology))
    assert counts[0] == 24.0 and set(counts[1:]) == {32.0}  # node0's GPUs from its agent's first frame on
    assert fans.index(4) == 2 and set(fans[2:]) == {4}  # every node's, from the BMCs' first frame on


def test_an_entity_that_stopped_reporting_goes_stale_after_stale_after_s_of_wall_time(small_topology: Topology) -> None:
    """node1's agent stops; the others go on, skewed. Its GPUs stay exported for 120 s of wall
    time from their last row's arrival, then leave /metrics (and gpus_reporting) — however the
    other sources' clocks read, and with no frame at all coming as well."""
    topo = small_topology
    wall = FakeWall()
    store = FindingStore(topo, wall_clock=wall)
    registry = build_registry(store)
    gpus = np.arange(topo.size("gpu"))
    silent = gpus[topo.gpu_node == 1]
    others = gpus[topo.gpu_node != 1]
    store.observe_frame(_gpus(gpus, wall.now, temp=70.0), wall.now)  # node1's last rows, at T0
    silent_gpu = {"cluster": "test", **topo.labels("gpu", int(silent[0]))}
    for t in range(10, 200, 10):
        wall.now = T0 + t
        skew = (-60.0, 600.0, 0.0)[(t // 10) % 3]  # the others' frames, stamped by clocks all over the place
        store.observe_frame(_gpus(others, wall.now + skew, temp=50.0), wall.now)
        heard_within_window = t <= STALE_AFTER_S
        assert _reporting(registry) == (32.0 if heard_within_window else 24.0), t
        assert (registry.get_sample_value("foreshock_gpu_temperature_celsius", _gpu_labels(silent_gpu)) == 70.0) \
            == heard_within_window, t

    # a quiet store: nothing at all comes after the last frame; the wall clock alone makes them stale
    last_frame = wall.now
    wall.now = last_frame + STALE_AFTER_S - 1
    assert _reporting(registry) == 24.0
    wall.now = last_frame + STALE_AFTER_S + 1
    assert _reporting(registry) == 0.0


def _gpu_labels(labels: dict[str, str]) -> dict[str, str]:
    return {k: labels[k] for k in ("cluster", "rack", "node", "gpu")}


def test_rows_without_a_timestamp_do_not_count_as_heard(small_topology: Topology) -> None:
    """A frame whose stamps are NaN (an input guard refuses them; a store fed directly may get
    them) neither moves the clock nor refreshes its entities, as it refreshes no ``last_seen``:
    they go stale 120 s after their last stamped row; the other entities are untouched."""
    topo = small_topology
    wall = FakeWall()
    store = FindingStore(topo, wall_clock=wall)
    registry = build_registry(store)
    gpus = np.arange(topo.size("gpu"))
    nan_node = gpus[topo.gpu_node == 2]
    store.observe_frame(_gpus(gpus, wall.now), wall.now)
    for t in range(10, 200, 10):
        wall.now = T0 + t
        store.observe_frame(_gpus(gpus[topo.gpu_node != 2], wall.now), wall.now)
        store.observe_frame(_gpus(nan_node, np.nan), wall.now)
        assert _reporting(registry) == (32.0 if t <= STALE_AFTER_S else 24.0), t
    snap = store.snapshot()
    assert (snap.heard["gpu"][nan_node] == T0).all()
    assert (snap.heard["gpu"][topo.gpu_node != 2] == wall.now).all()
    assert snap.last_ts == wall.now  # the on-time agent's newest row (the NaN frames left it alone)


# ---- live: ETAs and the lapse of findings -----------------------------------------------------
def test_eta_counts_down_with_wall_time_across_frames_of_skewed_sources(small_topology: Topology) -> None:
    """A prediction made at T0 + 5 with 1200 s to go reads 1200 - (wall time since it came) at
    every scrape, whichever source spoke last. (On telemetry time it jumped back up by 60 s at
    each BMC frame and down by 600 s at each of the fast agent's.)"""
    wall = FakeWall()
    store = FindingStore(small_topology, wall_clock=wall)
    registry = build_registry(store)
    labels = _eta_labels(small_topology, 12)
    made = None
    etas = []
    for _ in _skewed_cluster(small_topology, store, wall, 600):
        if made is None:
            wall.now += 5.0  # it arrives 5 s after the first frame
            made = wall.now
            store.observe_findings([Prediction(made - 600.0, "gpu", 12, "thermal_throttle", 1200.0, 0.9, "thermal")])
        eta = registry.get_sample_value("foreshock_prediction_eta_seconds", labels)
        assert eta == 1200.0 - (wall.now - made), wall.now - T0
        etas.append(eta)
    assert etas == sorted(etas, reverse=True) and etas[-1] < etas[0]


def test_a_refreshed_prediction_counts_down_from_its_own_arrival(small_topology: Topology) -> None:
    wall = FakeWall()
    store = FindingStore(small_topology, wall_clock=wall)
    registry = build_registry(store)
    labels = _eta_labels(small_topology, 3)
    store.observe_frame(_gpus(np.arange(32), wall.now), wall.now)
    store.observe_findings([Prediction(T0 + 900.0, "gpu", 3, "thermal_throttle", 600.0, 0.9, "thermal")])
    wall.now += 100.0
    assert registry.get_sample_value("foreshock_prediction_eta_seconds", labels) == 500.0
    store.observe_findings([Prediction(T0 - 50.0, "gpu", 3, "thermal_throttle", 450.0, 0.9, "thermal")])
    wall.now += 30.0
    assert registry.get_sample_value("foreshock_prediction_eta_seconds", labels) == 420.0
    wall.now += 500.0
    assert registry.get_sample_value("foreshock_prediction_eta_seconds", labels) == 0.0  # due, not yet lapsed
    wall.now += 300.0
    assert registry.get_sample_value("foreshock_prediction_eta_seconds", labels) is None  # 450 + 300 s after it came


def test_findings_lapse_by_wall_time_since_they_came_not_by_a_fast_agents_clock(small_topology: Topology) -> None:
    """An anomaly lasts ``anomaly_ttl_s`` of wall time from its arrival and a prediction its ETA
    more: a frame 600 s fast right after them lapses neither (on telemetry time it lapsed the
    anomaly, and every prediction due within 300 s, at once and for good); a scrape of a quiet
    store lapses them when their time is up."""
    topo = small_topology
    wall = FakeWall()
    store = FindingStore(topo, anomaly_ttl_s=300.0, wall_clock=wall)
    gpus = np.arange(topo.size("gpu"))
    store.observe_frame(_gpus(gpus, wall.now), wall.now)
    store.observe_findings([Anomaly(T0, "gpu", 9, "gpu_temp", 6.0, "robust_zscore"),
                            Prediction(T0, "gpu", 9, "thermal_throttle", 100.0, 0.8, "thermal")])
    wall.now += 1.0
    store.observe_frame(_gpus(gpus[topo.gpu_node == 0], wall.now + 600.0), wall.now)
    snap = store.snapshot()
    assert (len(snap.anomalies), len(snap.predictions)) == (1, 1)
    for at, expected in ((T0 + 300.0, (1, 1)), (T0 + 300.5, (0, 1)), (T0 + 400.0, (0, 1)), (T0 + 400.5, (0, 0))):
        wall.now = at  # no frame: the scrape alone sees the lapse
        snap = store.snapshot()
        assert (len(snap.anomalies), len(snap.predictions)) == expected, at - T0


# ---- live: what the store keeps per entity follows it ----------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 50), st.lists(st.tuples(st.integers(-2, 33), st.sampled_from([0.0, 5.0, -700.0, float("nan")])),
                                                       max_size=12)), max_size=12))
def test_arrival_times_match_a_plain_reference(frames: list[tuple[float, list[tuple[int, float]]]]) -> None:
    """``heard`` (by arrival, vectorised) against a dict of the last wall time a stamped row of
    each slot in range came; slots out of range (the guard lets none through) are skipped."""
    topo = Topology.from_gpu_hosts([(f"n{i // 8}", i % 8) for i in range(32)])
    wall = FakeWall()
    store = FindingStore(topo, wall_clock=wall)
    reference: dict[int, float] = {}
    for advance, rows in frames:
        wall.now += advance
        slot = np.array([s for s, _ in rows], dtype=np.int32)
        ts = np.array([wall.now + skew for _, skew in rows])
        store.observe_frame(Frame("gpu", ts, slot, {"gpu_temp": np.full(len(rows), 50.0)}), wall.now)
        for s, skew in rows:
            if 0 <= s < 32 and not math.isnan(skew):
                reference[s] = wall.now
    expected = np.array([reference.get(s, -np.inf) for s in range(32)])
    np.testing.assert_array_equal(store.snapshot().heard["gpu"], expected)


def test_arrival_times_follow_their_entities_through_forget_and_move_to() -> None:
    old = Topology.from_gpu_hosts([("b", 0), ("b", 1), ("c", 0), ("c", 1)])
    new = Topology.from_gpu_hosts([("a", 0), ("a", 1), ("c", 0), ("c", 1)])  # b replaced by a, sorted first
    wall = FakeWall()
    store = FindingStore(old, wall_clock=wall)
    for slot in range(4):
        wall.now = T0 + 10 * slot
        store.observe_frame(_gpus(np.array([slot]), wall.now + 600.0 * slot), wall.now)
    wall.now = T0 + 50
    store.observe_findings([Prediction(T0, "gpu", 3, "thermal_throttle", 600.0, 0.8, "thermal"),
                            Anomaly(T0, "gpu", 2, "gpu_temp", 7.0, "robust_zscore")])
    store.move_to(new, Remap(old, new))
    wall.now = T0 + 100
    snap = store.snapshot()
    np.testing.assert_array_equal(snap.heard["gpu"], [-np.inf, -np.inf, T0 + 20, T0 + 30])
    assert snap.predictions_heard == {("thermal_throttle", "gpu", 3, "thermal"): T0 + 50}
    assert registry_eta(store, new, 3) == 550.0
    store.forget({"gpu": np.array([False, False, False, True])})
    snap = store.snapshot()
    np.testing.assert_array_equal(snap.heard["gpu"], [-np.inf, -np.inf, T0 + 20, -np.inf])
    assert snap.predictions == [] and snap.predictions_heard == {} and len(snap.anomalies) == 1
    wall.now = T0 + 50 + 300.5  # the anomaly lapses 300 s after it came, its clock moved with it
    assert store.snapshot().anomalies == []


def registry_eta(store: FindingStore, topology: Topology, slot: int) -> float | None:
    labels = {"cluster": topology.cluster, "event": "thermal_throttle", "entity_kind": "gpu",
              "entity": topology.name("gpu", slot), "rack": topology.labels("gpu", slot).get("rack", ""),
              "detector": "thermal"}
    return build_registry(store).get_sample_value("foreshock_prediction_eta_seconds", labels)  # type: ignore[no-any-return]


def test_a_store_switched_to_the_wall_clock_keeps_what_it_heard(small_topology: Topology) -> None:
    """``use_wall_clock`` (for a store made elsewhere): what was heard before counts as heard at
    the switch, and ages on the wall clock from there."""
    store = FindingStore(small_topology)
    store.observe_frame(_gpus(np.arange(16), 5000.0))
    store.observe_findings([Prediction(5000.0, "gpu", 1, "thermal_throttle", 600.0, 0.8, "thermal")])
    wall = FakeWall()
    store.use_wall_clock(wall)
    assert store.live
    wall.now = T0 + 100
    registry = build_registry(store)
    assert _reporting(registry) == 16.0
    assert registry.get_sample_value("foreshock_prediction_eta_seconds", _eta_labels(small_topology, 1)) == 500.0
    wall.now = T0 + STALE_AFTER_S + 1
    assert _reporting(registry) == 0.0


# ---- which callers are live ---------------------------------------------------------------------
def test_watch_is_live_and_replay_is_not(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``foreshock watch`` polls live sources: its store is live. The pipeline replay, evaluate and
    demo build (``build_pipeline``) keeps telemetry time."""
    import foreshock.cli.watch as watch

    made: list[PipelineRun] = []

    def build_and_keep(*args, **kwargs) -> PipelineRun:  # type: ignore[no-untyped-def]
        made.append(build_pipeline(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(watch, "build_pipeline", build_and_keep)
    server = ScrapeServer([(shared_data / "dcgm" / "dcgm-exporter-tesla-t4.prom").read_text()])
    try:
        result = CliRunner().invoke(cli, ["watch", "--source", "dcgm", "--url", server.url, "--interval", "0.02",
                                          "--polls", "2", "--port", "0"])
    finally:
        server.close()
    assert result.exit_code == 0, result.output
    assert len(made) == 1 and made[0].store.live
    assert not build_pipeline(made[0].pipeline.topology, None, "127.0.0.1", 0, None, 16).store.live


def test_a_kafka_worker_held_to_its_clock_is_live_and_one_without_a_limit_is_not(small_topology: Topology) -> None:
    """The worker's ``--max-clock-ahead`` (900 s by default) holds rows to its host's clock: a
    live stream. ``inf`` is for a simulation published faster than real time: telemetry time."""
    def stage(max_ahead_s: float | None) -> DetectionStage:
        return DetectionStage(small_topology, lambda hardware: DetectorBank.from_names(hardware, ["robust_zscore"]), 2,
                              max_ahead_s=max_ahead_s)

    assert stage(900.0).store.live
    assert not stage(float("inf")).store.live
    assert not stage(None).store.live
    assert not FindingStore(small_topology).live  # the default: replay, evaluate, demo


# ---- replay: telemetry time, exactly as before ------------------------------------------------
class TelemetryClockReference:
    """The telemetry clock as the store kept it before live stores (a plain model): the clock is
    the newest stamp of the last frame with one; an entity is fresh while its newest stamp is
    within ``stale_after_s`` of it; an ETA counts down by the clock since the prediction's stamp;
    findings lapse by the clock."""

    def __init__(self, n_gpus: int, ttl: float) -> None:
        self.clock = math.nan
        self.last_seen = np.full(n_gpus, -np.inf)
        self.ttl = ttl
        self.predictions: dict[tuple[str, str, int], Prediction] = {}
        self.anomalies: dict[tuple[str, int, str, str], Anomaly] = {}

    def frame(self, ts: np.ndarray, slot: np.ndarray) -> None:
        for t, s in zip(ts, slot):
            if not math.isnan(t):
                self.last_seen[s] = max(self.last_seen[s], t)
        if np.isfinite(ts).any():
            self.clock = float(np.nanmax(ts))
        self.lapse()

    def findings(self, found: list[Anomaly | Prediction]) -> None:
        for f in found:
            if isinstance(f, Anomaly):
                self.anomalies[(f.entity_kind, f.slot, f.field, f.detector)] = f
            elif f.active:
                self.predictions[(f.event, f.entity_kind, f.slot)] = f
            else:
                self.predictions.pop((f.event, f.entity_kind, f.slot), None)
        self.lapse()

    def lapse(self) -> None:
        if math.isnan(self.clock):
            return
        self.anomalies = {k: a for k, a in self.anomalies.items() if not self.clock - a.ts > self.ttl}
        self.predictions = {k: p for k, p in self.predictions.items()
                            if not self.clock - p.ts > max(p.eta_s, 0.0) + self.ttl}

    def reporting(self) -> float | None:
        return None if math.isnan(self.clock) else float((self.last_seen >= self.clock - STALE_AFTER_S).sum())

    def eta(self, key: tuple[str, str, int]) -> float | None:
        p = self.predictions.get(key)
        return None if p is None else max(0.0, p.eta_s - max(0.0, self.clock - p.ts))


def test_replay_keeps_the_telemetry_clock_see_saw_and_all(small_topology: Topology) -> None:
    """A store made as replay, evaluate and demo make it (no wall clock) measures on telemetry
    time exactly as before, with skewed sources too (in a recording the stamps are the truth):
    gpus_reporting, ETAs and the findings kept match the plain model at every scrape."""
    topo = small_topology
    rng = np.random.default_rng(11)
    ttl = 60.0
    store = FindingStore(topo, anomaly_ttl_s=ttl)
    registry = build_registry(store)
    reference = TelemetryClockReference(topo.size("gpu"), ttl)
    gpus = np.arange(topo.size("gpu"))
    seen_eta = set()
    for step in range(150):
        t = 1000.0 + 10.0 * step
        node = int(rng.integers(0, topo.size("node")))
        slots = gpus[topo.gpu_node == node] if rng.random() < 0.7 else gpus[rng.random(len(gpus)) < 0.5]
        skew = float(rng.choice([0.0, -60.0, 600.0, 150.0]))
        ts = np.full(len(slots), t + skew)
        ts[rng.random(len(slots)) < 0.1] = np.nan
        if step % 37 == 5:
            ts[:] = np.nan  # a frame without a stamp: the clock stays
        frame = _gpus(slots, ts)
        store.observe_frame(frame, received_wall=0.0)
        reference.frame(frame.ts, frame.slot)
        found: list[Anomaly | Prediction] = []
        for _ in range(int(rng.integers(0, 3))):
            slot = int(rng.integers(0, 6))
            made = t + float(rng.choice([0.0, -60.0, 600.0]))
            if rng.random() < 0.5:
                found.append(Anomaly(made, "gpu", slot, "gpu_temp", 3.0, "z"))
            else:
                found.append(Prediction(made, "gpu", slot, "thermal_throttle", float(rng.choice([30.0, 300.0, 900.0])),
                                        0.7, "thermal", active=bool(rng.random() < 0.85)))
        store.observe_findings(found)
        reference.findings(found)
        assert _reporting(registry) == reference.reporting(), step
        snap = store.snapshot()
        assert snap.last_ts == reference.clock or (math.isnan(snap.last_ts) and math.isnan(reference.clock))
        assert sorted(snap.anomalies, key=repr) == sorted(reference.anomalies.values(), key=repr), step
        assert sorted(snap.predictions, key=repr) == sorted(reference.predictions.values(), key=repr), step
        for key, p in reference.predictions.items():
            eta = registry.get_sample_value("foreshock_prediction_eta_seconds", _eta_labels(topo, p.slot))
            assert eta == reference.eta(key), (step, key)
            seen_eta.add(eta)
    assert len(seen_eta) > 10  # ETAs of many ages were compared, not only fresh ones


def test_replay_never_reads_the_wall_clock(small_topology: Topology, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay runs hundreds of times faster than real time: its /metrics must not move with
    the wall clock. With the wall clock jumping by hours between scrapes, nothing changes."""
    import time as time_module

    store = FindingStore(small_topology)
    store.observe_frame(_gpus(np.arange(32), 500.0), received_wall=0.0)
    store.observe_findings([Prediction(450.0, "gpu", 4, "thermal_throttle", 300.0, 0.9, "thermal"),
                            Anomaly(480.0, "gpu", 4, "gpu_temp", 4.0, "z")])
    registry = build_registry(store)
    before = _exposition(registry)
    for jump in (0.0, 3600.0, 86400.0):
        monkeypatch.setattr(time_module, "time", lambda jump=jump: T0 + jump)
        assert _exposition(registry) == before
    assert registry.get_sample_value("foreshock_prediction_eta_seconds", _eta_labels(small_topology, 4)) == 250.0
    assert _reporting(registry) == 32.0


def _exposition(registry) -> list[str]:  # type: ignore[no-untyped-def]
    return [line for line in generate_latest(registry).decode().splitlines()
            if not line.startswith(("foreshock_ingest_lag", "foreshock_detector_latency"))]
