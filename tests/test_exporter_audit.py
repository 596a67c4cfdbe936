"""Findings of an audit of the exporter (2026-12-04).

- A flag a detector holds and says again every ``refresh_s`` (cooling, straggler: 600 s) stays in
  /metrics between two refreshes. Kept the store's 300-s anomaly lifetime, a held cooling flag was
  gone from ``foreshock_anomaly_score`` for 300 of every 600 s.
- ``foreshock_last_telemetry_timestamp_seconds`` ("the newest sample processed") never goes back:
  it followed the last frame, and a source stamping a minute behind the others moved it back at
  each of its frames (the dashboard's "telemetry time behind wall clock" jumped by the skew).
"""

from __future__ import annotations

import numpy as np

from foreshock.exporters.prometheus import build_registry
from foreshock.exporters.store import HELD_FLAG_REFRESH_S, FindingStore
from foreshock.findings import Anomaly
from foreshock.frames import Frame

from thermal_synth import small_topology


def _scrapes(detector: str, refresh_s: float, flag_refresh_s: dict[str, float] | None = None) -> list[bool]:
    """Whether the flag's series is served at each 30-s scrape over an hour, the detector saying it
    again every ``refresh_s`` from t = 0 (a live store on a stand-in clock)."""
    topo = small_topology(nodes=1, gpus=2, racks=1)
    now = [0.0]
    store = FindingStore(topo, wall_clock=lambda: now[0], flag_refresh_s=flag_refresh_s)
    registry = build_registry(store)
    labels = {"cluster": topo.cluster, "entity_kind": "gpu", "entity": "node0/gpu0", "field": "gpu_temp",
              "detector": detector}
    served = []
    for t in range(0, 3600, 30):
        now[0] = float(t)
        if t % refresh_s == 0:
            store.observe_findings([Anomaly(float(t), "gpu", 0, "gpu_temp", 4.0, detector, "held")])
        served.append(registry.get_sample_value("foreshock_anomaly_score", labels) is not None)
    return served


def test_a_flag_held_and_said_again_every_refresh_is_served_between_refreshes() -> None:
    assert HELD_FLAG_REFRESH_S == {"cooling": 600.0, "straggler": 600.0}
    for detector in ("cooling", "straggler"):
        assert all(_scrapes(detector, 600)), detector


def test_other_anomalies_still_lapse_after_the_store_s_lifetime() -> None:
    served = _scrapes("robust_zscore", 600)  # said every 600 s, kept 300 s: gone half the time
    assert served[:11] == [True] * 11 and served[11:20] == [False] * 9


def test_a_refresh_set_by_param_reaches_the_store() -> None:
    """``--param cooling.refresh_s=1200``: its flags are kept 1.5 x 1200 s (cli.common passes the
    detectors' refresh_s overrides to the store)."""
    assert all(_scrapes("cooling", 1200, {"cooling": 1200.0}))
    assert not all(_scrapes("cooling", 1200))  # with the default's 900 s, gone 900-1200 s after each


def test_the_newest_telemetry_timestamp_never_goes_back() -> None:
    topo = small_topology(nodes=1, gpus=2, racks=1)
    for live in (True, False):
        store = FindingStore(topo, wall_clock=(lambda: 1_000_100.0) if live else None)
        registry = build_registry(store)
        newest = []
        for gpu_ts, rack_ts in ((1_000_000.0, 999_940.0), (1_000_010.0, 999_950.0)):
            store.observe_frame(Frame("gpu", np.full(2, gpu_ts), np.arange(2), {"gpu_temp": np.full(2, 50.0)}))
            newest.append(registry.get_sample_value("foreshock_last_telemetry_timestamp_seconds",
                                                    {"cluster": topo.cluster}))
            store.observe_frame(Frame("rack", np.array([rack_ts]), np.array([0]), {"inlet_temp": np.array([24.0])}))
            newest.append(registry.get_sample_value("foreshock_last_telemetry_timestamp_seconds",
                                                    {"cluster": topo.cluster}))
        assert newest == [1_000_000.0, 1_000_000.0, 1_000_010.0, 1_000_010.0], live
        # the store's own telemetry clock is still the last frame's (the module docstring)
        assert store.snapshot().last_ts == 999_950.0


def test_a_stage_taken_up_from_a_checkpoint_exports_the_incidents_it_holds_open() -> None:
    """Engine A opens an incident; the incident stage is checkpointed; B takes it up (a worker
    restarted, or a rebalance's new owner). The engine reports an incident only as it changes: a
    steady one was missing from B's /metrics (and ForeshockCascadeIncident with it) until it next
    changed or resolved. The worker now hands the stage's open incidents to its store at load
    (``faust_app`` ``on_findings``: ``store.hold_incidents(stage.open_incidents())``)."""
    from foreshock.detectors.incidents import IncidentEngine
    from foreshock.findings import Prediction
    from foreshock.streams.kafka_worker import IncidentStage
    from foreshock.topology import Topology

    topo = Topology.from_dict({"cluster": "c", "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
                               "racks": [{"name": "rack0", "row": "row0"}, {"name": "rack1", "row": "row0"}],
                               "nodes": [{"name": f"n{i}", "rack": f"rack{i // 2}", "gpus": 4} for i in range(4)]})

    def preds(t: int) -> list[Prediction]:
        return [Prediction(float(t), "gpu", g, "thermal_throttle", 600.0, 0.9, "thermal")
                for g in range(0, 16, 3) if t >= 3 * g]

    engine_a, store_a = IncidentEngine(topo), FindingStore(topo)
    for t in range(0, 900, 10):
        store_a.observe_findings(preds(t) + engine_a.observe(preds(t), float(t)))
    open_loop = {"cluster": "c", "root_kind": "cooling_loop"}
    assert build_registry(store_a).get_sample_value("foreshock_incidents_open", open_loop) == 1.0
    stage_a = IncidentStage([engine_a], topology=topo)
    stage_a.offset = 41
    _, blob = stage_a.checkpoint()
    stage_b = IncidentStage([IncidentEngine(topo)], topology=topo)
    assert stage_b.load(blob) == 41
    store_b = FindingStore(topo)
    store_b.hold_incidents(stage_b.open_incidents())
    emitted_before = dict(store_b.health.findings)
    for t in range(900, 1800, 10):  # the same findings go on: nothing changes, nothing is reported
        store_b.observe_findings(preds(t) + stage_b.processors[0].observe(preds(t), float(t)))
    registry = build_registry(store_b)
    assert registry.get_sample_value("foreshock_incidents_open", open_loop) == 1.0
    assert emitted_before == {}  # held, not counted as emitted again


def test_a_gpu_held_by_a_power_brake_bit_has_its_reason_bits_decoded() -> None:
    """A GPU held by a thermal or power-brake bit keeps its series; its decoded bits
    (``foreshock_gpu_throttle_reason_active``) had been served for predicted GPUs only."""
    topo = small_topology()
    store = FindingStore(topo)
    n = topo.size("gpu")
    mask = np.zeros(n)
    mask[5] = 0x80  # HW power brake
    store.observe_frame(Frame("gpu", np.full(n, 100.0), np.arange(n), {"gpu_temp": np.full(n, 50.0),
                                                                      "throttle_reasons": mask}))
    registry = build_registry(store, top_k=0)
    gpu5 = topo.labels("gpu", 5)
    assert registry.get_sample_value("foreshock_gpu_throttle_reasons", gpu5) == 128.0
    decoded = "foreshock_gpu_throttle_reason_active"
    assert registry.get_sample_value(decoded, {**gpu5, "reason": "hw_power_brake"}) == 1.0
    assert registry.get_sample_value(decoded, {**gpu5, "reason": "sw_power_cap"}) == 0.0


def test_a_live_store_reads_a_step_of_the_host_clock_as_no_time_passing() -> None:
    """A live store (``watch``, a Kafka worker: ``use_wall_clock()``) measures durations only — how
    long since an entity was heard, since a prediction arrived. Read on ``time.time``, a step back
    of an hour kept a node that had died "reporting" for that hour; a step forward read every ETA
    short. Its clock is now the wall clock at start moved on by the monotonic clock."""
    from foreshock.exporters.store import SteadyClock
    from foreshock.findings import Prediction

    topo = small_topology()  # 32 GPUs, 4 nodes
    n = topo.size("gpu")
    for step in (-3600.0, 600.0):
        wall, mono = [1_000_000.0], [50.0]
        store = FindingStore(topo)
        store.use_wall_clock(SteadyClock(lambda: wall[0], lambda: mono[0]))
        registry = build_registry(store)

        def frame(slots: np.ndarray) -> Frame:
            return Frame("gpu", np.full(len(slots), wall[0]), slots, {"gpu_temp": np.full(len(slots), 70.0)})

        store.observe_frame(frame(np.arange(n)))
        store.observe_findings([Prediction(wall[0], "gpu", 3, "thermal_throttle", 1500.0, 0.9, "thermal")])
        wall[0] += 30 + step  # 30 s pass, and the host's clock is stepped
        mono[0] += 30
        store.observe_frame(frame(np.arange(24)))  # node3 (8 GPUs) has died
        wall[0] += 600
        mono[0] += 600
        store.observe_frame(frame(np.arange(24)))
        assert registry.get_sample_value("foreshock_gpus_reporting", {"cluster": topo.cluster}) == 24, step
        eta = registry.get_sample_value("foreshock_prediction_eta_seconds", {
            "cluster": topo.cluster, "event": "thermal_throttle", "entity_kind": "gpu", "entity": "node0/gpu3",
            "rack": "rack0", "detector": "thermal"})
        assert eta == 1500.0 - 630.0, step
