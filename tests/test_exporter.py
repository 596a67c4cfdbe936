"""The Prometheus collector over a FindingStore: names, labels, bounded cardinality."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from foreshock.exporters.prometheus import CATALOGUE, build_registry
from foreshock.exporters.store import FindingStore
from foreshock.findings import Anomaly, Incident, Prediction
from foreshock.frames import Frame
from foreshock.topology import Topology


def _gpu_frame(topology: Topology, ts: float, temps: np.ndarray, masks: np.ndarray | None = None,
               xids: np.ndarray | None = None) -> Frame:
    n = topology.size("gpu")
    cols = {"gpu_temp": temps, "power": np.full(n, 600.0), "power_limit": np.full(n, 700.0)}
    if masks is not None:
        cols["throttle_reasons"] = masks
    if xids is not None:
        cols["xid_last"] = xids
    return Frame("gpu", np.full(n, ts), np.arange(n), cols)


def test_catalogue_follows_naming_rules() -> None:
    for spec in CATALOGUE:
        assert spec.name.startswith("foreshock_")
        assert (spec.type == "counter") == spec.name.endswith("_total"), spec.name
        assert "timestamp" not in spec.labels and "reason_text" not in spec.labels
        if spec.name.endswith("_ratio"):
            assert spec.type == "gauge"


def test_collector_exports_predictions_aggregates_and_pipeline_counters(small_topology: Topology) -> None:
    store = FindingStore(small_topology)
    temps = np.linspace(40, 71, 32)
    store.observe_frame(_gpu_frame(small_topology, 100.0, temps, masks=np.where(np.arange(32) == 31, 0x20, 0x0)))
    store.observe_findings([
        Prediction(100.0, "gpu", 3, "thermal_throttle", 600.0, 0.8, "thermal", "R rising"),
        Anomaly(100.0, "gpu", 5, "gpu_temp", 12.5, "robust_zscore"),
        Incident(100.0, "inc-1", "growing", "cooling_loop", "cdu1", "inlet rising", members=("rack1",),
                 jobs=(("job1", 1.25),), gpu_hours_at_risk_per_hour=4.0),
    ])
    store.observe_frame(_gpu_frame(small_topology, 160.0, temps))
    reg = build_registry(store, top_k=2)
    gpu3 = {"cluster": "test", "event": "thermal_throttle", "entity_kind": "gpu", "entity": "node0/gpu3",
            "rack": "rack0", "detector": "thermal"}
    # the ETA counts down in telemetry time: made at t=100 for 600 s, now t=160
    assert reg.get_sample_value("foreshock_prediction_eta_seconds", gpu3) == pytest.approx(540.0)
    assert reg.get_sample_value("foreshock_prediction_confidence_ratio", gpu3) == pytest.approx(0.8)
    assert reg.get_sample_value("foreshock_predictions_active",
                                {"cluster": "test", "event": "thermal_throttle", "rack": "rack0"}) == 1
    assert reg.get_sample_value("foreshock_anomaly_score", {"cluster": "test", "entity_kind": "gpu",
                                "entity": "node0/gpu5", "field": "gpu_temp", "detector": "robust_zscore"}) == 12.5
    assert reg.get_sample_value("foreshock_rack_gpu_temperature_max_celsius", {"cluster": "test", "rack": "rack1"}) == 71.0
    assert reg.get_sample_value("foreshock_rack_gpu_temperature_mean_celsius",
                                {"cluster": "test", "rack": "rack0"}) == pytest.approx(temps[:16].mean())
    assert reg.get_sample_value("foreshock_incidents_open", {"cluster": "test", "root_kind": "cooling_loop"}) == 1
    assert reg.get_sample_value("foreshock_job_predicted_slowdown_ratio",
                                {"cluster": "test", "training_job": "job1"}) == pytest.approx(0.25)
    assert reg.get_sample_value("foreshock_samples_processed_total", {"cluster": "test", "kind": "gpu"}) == 64
    assert reg.get_sample_value("foreshock_findings_total", {"cluster": "test", "type": "prediction"}) == 1
    assert reg.get_sample_value("foreshock_gpus_reporting", {"cluster": "test"}) == 32
    # per-GPU series: the flagged GPUs (3, 5) plus the 2 hottest (30, 31), nothing else
    text = generate_latest(reg).decode()
    temp_lines = [line for line in text.splitlines() if line.startswith("foreshock_gpu_temperature_celsius{")]
    assert sorted(line.split('node="')[1].split('"')[0] + "/" + line.split('gpu="')[1].split('"')[0]
                  for line in temp_lines) == ["node0/3", "node0/5", "node3/6", "node3/7"]


def test_job_gpu_hours_at_risk_are_the_jobs_own_gpus_at_its_worst_pace(small_topology: Topology) -> None:
    """job0 (16 GPUs) stalled by one incident and slowed by another: all 16 GPU-hours per hour are
    at risk (the incidents do not add up); job1 (16 GPUs) 1.25x slower loses 1 - 1/1.25 = 20 %
    of its GPUs' time: 3.2. Members and predicted members are exported per incident."""
    store = FindingStore(small_topology)
    store.observe_findings([
        Incident(10.0, "a", "growing", "gpu", "node0/gpu1", "off the bus", members=("node0/gpu1",),
                 jobs=(("job0", 100.0),), gpu_hours_at_risk_per_hour=16.0),
        Incident(10.0, "b", "growing", "cooling_loop", "cdu1", "inlet rising",
                 members=("rack1", "node2/gpu0", "node3/gpu0"), predicted_members=(("node2/gpu1", 300.0),),
                 jobs=(("job0", 1.5), ("job1", 1.25)), gpu_hours_at_risk_per_hour=8.0),
    ])
    reg = build_registry(store)
    risk = {job: reg.get_sample_value("foreshock_job_gpus_at_risk", {"cluster": "test", "training_job": job})
            for job in ("job0", "job1")}
    assert risk == {"job0": pytest.approx(16.0), "job1": pytest.approx(3.2)}
    assert reg.get_sample_value("foreshock_incident_members", {"cluster": "test", "incident": "b", "root_kind": "cooling_loop",
                                "root_entity": "cdu1", "state": "growing"}) == 3
    assert reg.get_sample_value("foreshock_incident_predicted_members", {"cluster": "test", "incident": "b",
                                "root_kind": "cooling_loop", "root_entity": "cdu1"}) == 1


def test_withdrawn_prediction_and_resolved_incident_disappear(small_topology: Topology) -> None:
    store = FindingStore(small_topology)
    p = Prediction(10.0, "gpu", 1, "power_cap", 60.0, 0.9, "power")
    store.observe_findings([p, Incident(10.0, "i", "open", "node", "node0", "x")])
    store.observe_findings([Prediction(20.0, "gpu", 1, "power_cap", 0.0, 0.0, "power", active=False),
                            Incident(20.0, "i", "resolved", "node", "node0", "x")])
    reg = build_registry(store)
    assert reg.get_sample_value("foreshock_prediction_eta_seconds", {"cluster": "test", "event": "power_cap",
                                "entity_kind": "gpu", "entity": "node0/gpu1", "rack": "rack0", "detector": "power"}) is None
    assert reg.get_sample_value("foreshock_incidents_open", {"cluster": "test", "root_kind": "node"}) is None
    assert reg.get_sample_value("foreshock_predictions_raised_total", {"cluster": "test", "event": "power_cap"}) == 1


def test_a_prediction_following_its_board_is_not_raised_again() -> None:
    """node0 reboots without gpu3 (boards 4-7 read one index lower), then with it (each board back
    in place); later gpu4's board is displaced by another and read again. At each step the
    prediction about board 4 is made again where the board is (``follow_predictions``): the same
    prediction, raised once (each carry was counted as a new raise: 4 for one prediction). Nor does
    the store's move to another numbering of the same GPUs raise it again."""
    from foreshock.detectors.bank import DetectorBank
    from foreshock.streams.embedded import EmbeddedPipeline

    node0 = {"name": "node0", "rack": "k", "gpus": 8}
    one_node = {"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}], "nodes": [node0]}
    topology = Topology.from_dict(one_node)
    pipeline = EmbeddedPipeline(topology, DetectorBank.from_names(topology, ["thermal"]))
    own = [1000.0 + i for i in range(8)]

    def read(ts: float, boards: list[float]) -> list[Prediction]:
        n = len(boards)
        frame = Frame("gpu", np.full(n, ts), np.arange(n), {"board_id": np.array(boards), "gpu_temp": np.full(n, 50.0)})
        return [f for f in pipeline.process(frame) if isinstance(f, Prediction) and f.active]

    read(10.0, own)
    pipeline.store.observe_findings([Prediction(10.0, "gpu", 4, "thermal_throttle", 3600.0, 0.9, "thermal", "hot")])
    carried = []
    for ts, boards in [(20.0, own[:3] + own[4:]), (30.0, own), (40.0, own[:4] + [2000.0] + own[5:]), (50.0, own)]:
        carried += [(f.slot, f.reason) for f in read(ts, boards)]
    assert carried == [(3, "hot (its board moved from node0/gpu4)"), (4, "hot (its board moved from node0/gpu3)"),
                       (4, "hot (its board back at node0/gpu4)")]
    assert pipeline.store.snapshot().predictions_raised == {"thermal_throttle": 1}
    # re-keyed: the same GPUs numbered after another node's; refreshed by its detector there
    store = pipeline.store
    store.move_to(Topology.from_dict({**one_node, "nodes": [{"name": "node1", "rack": "k", "gpus": 8}, node0]}))
    store.observe_findings([Prediction(60.0, "gpu", 12, "thermal_throttle", 3540.0, 0.9, "thermal", "hot")])
    assert [p.slot for p in store.snapshot().predictions] == [12]
    assert store.snapshot().predictions_raised == {"thermal_throttle": 1}


def test_xid_counts_new_events_not_the_latched_value(small_topology: Topology) -> None:
    store = FindingStore(small_topology)
    n = small_topology.size("gpu")
    temps = np.full(n, 50.0)
    xid = np.zeros(n)
    xid[2] = 79  # latched from before we started: not counted
    store.observe_frame(_gpu_frame(small_topology, 1.0, temps, xids=xid.copy()))
    xid[4] = 48
    store.observe_frame(_gpu_frame(small_topology, 2.0, temps, xids=xid.copy()))
    store.observe_frame(_gpu_frame(small_topology, 3.0, temps, xids=xid.copy()))  # still 48: same event
    xid[4] = 79
    store.observe_frame(_gpu_frame(small_topology, 4.0, temps, xids=xid.copy()))
    reg = build_registry(store)
    gpu4 = {"cluster": "test", "rack": "rack0", "node": "node0", "gpu": "4"}
    assert reg.get_sample_value("foreshock_xid_events_total", {**gpu4, "xid": "48", "severity": "critical"}) == 1
    assert reg.get_sample_value("foreshock_xid_events_total", {**gpu4, "xid": "79", "severity": "critical"}) == 1
    assert reg.get_sample_value("foreshock_xid_events_total", {**gpu4, "gpu": "2", "xid": "79", "severity": "critical"}) is None


def test_a_swapped_boards_latched_xid_is_not_a_new_event(small_topology: Topology) -> None:
    """A board swapped into slot 3 (``forget_limits``, what the pipeline tells the store of a swap)
    whose first reading is an XID latched before it got here: a first value, not counted — it was
    compared with the old board's last XID and counted as a new event. The new board's own change
    after it counts."""
    store = FindingStore(small_topology)
    n = small_topology.size("gpu")
    temps = np.full(n, 50.0)
    xid = np.zeros(n)
    store.observe_frame(_gpu_frame(small_topology, 0.0, temps, xids=xid.copy()))
    store.forget_limits([3])
    xid[3] = 48
    store.observe_frame(_gpu_frame(small_topology, 10.0, temps, xids=xid.copy()))
    assert store.snapshot().xids == {}
    xid[3] = 79
    store.observe_frame(_gpu_frame(small_topology, 20.0, temps, xids=xid.copy()))
    assert store.snapshot().xids == {(3, 79): 1}


def test_latency_histogram_and_gauges(small_topology: Topology) -> None:
    store = FindingStore(small_topology)
    for s in (0.0002, 0.003, 2.0):
        store.observe_latency(s)
    r = np.full(32, 0.046)
    r[7] = 0.09
    store.set_gauges({"thermal_resistance_celsius_per_watt": ("gpu", r, "fitted R")})
    store.observe_frame(_gpu_frame(small_topology, 1.0, np.full(32, 50.0)))
    store.observe_findings([Anomaly(1.0, "gpu", 7, "thermal_resistance", 5.0, "cooling")])
    reg = build_registry(store)
    assert reg.get_sample_value("foreshock_detector_latency_seconds_bucket", {"cluster": "test", "le": "0.001"}) == 1
    assert reg.get_sample_value("foreshock_detector_latency_seconds_count", {"cluster": "test"}) == 3
    assert reg.get_sample_value("foreshock_estimate", {"cluster": "test", "estimate": "thermal_resistance_celsius_per_watt",
                                "entity_kind": "gpu", "entity": "node0/gpu7"}) == 0.09
    assert reg.get_sample_value("foreshock_estimate_rack_max", {"cluster": "test",
                                "estimate": "thermal_resistance_celsius_per_watt", "rack": "rack1"}) == 0.046
    gpu7 = {"cluster": "test", "rack": "rack0", "node": "node0", "gpu": "7"}
    assert reg.get_sample_value("foreshock_gpu_thermal_resistance_celsius_per_watt", gpu7) == 0.09
    assert reg.get_sample_value("foreshock_rack_thermal_resistance_celsius_per_watt",
                                {"cluster": "test", "rack": "rack0"}) == pytest.approx((15 * 0.046 + 0.09) / 16)


def test_golden_exposition_of_pipeline_families(small_topology: Topology, tmp_path) -> None:
    store = FindingStore(small_topology)
    store.health.problem("guard", "out_of_order", 3)
    store.health.dead_letters = 2
    text = generate_latest(build_registry(store)).decode()
    golden = """\
# HELP foreshock_input_problems_total Input problems counted (bad records, NaN, resets, ...)
# TYPE foreshock_input_problems_total counter
foreshock_input_problems_total{cluster="test",reason="out_of_order",stage="guard"} 3.0
# HELP foreshock_dead_letters_total Records sent to the dead-letter topic
# TYPE foreshock_dead_letters_total counter
foreshock_dead_letters_total{cluster="test"} 2.0
"""
    assert golden in text


def test_gauges_from_two_partitions_merge_by_owned_slots(small_topology: Topology) -> None:
    store = FindingStore(small_topology)
    n = small_topology.size("gpu")
    first_half = np.arange(n) < n // 2
    store.set_gauges({"r": ("gpu", np.full(n, 1.0), "h")}, owned={"gpu": first_half})
    store.set_gauges({"r": ("gpu", np.full(n, 2.0), "h")}, owned={"gpu": ~first_half})
    values = store.snapshot().gauges["r"][1]
    np.testing.assert_array_equal(values, np.where(first_half, 1.0, 2.0))


def test_gpus_reporting_counts_only_recent_gpus(small_topology: Topology) -> None:
    store = FindingStore(small_topology)
    store.observe_frame(_gpu_frame(small_topology, 0.0, np.full(32, 50.0)))
    half = Frame("gpu", np.full(16, 200.0), np.arange(16), {"gpu_temp": np.full(16, 50.0)})
    store.observe_frame(half)
    assert build_registry(store).get_sample_value("foreshock_gpus_reporting", {"cluster": "test"}) == 16


def test_leaf_and_flagged_optic_families(small_topology: Topology) -> None:
    store = FindingStore(small_topology)
    t = small_topology
    n_links = t.size("link")
    state = np.full(n_links, 4.0)
    down = t.slot("link", "node1/gpu3~leaf3")
    state[down] = 1.0
    wait = np.arange(n_links, dtype=float)
    store.observe_frame(Frame("link", np.full(n_links, 5.0), np.arange(n_links), {"link_state": state, "xmit_wait": wait}))
    rx = np.full(2 * n_links, -2.0)
    rx[2 * down] = -9.5
    ber = np.full(2 * n_links, 1e-9)
    ber[2 * down + 1] = 3e-5
    store.observe_frame(Frame("optic", np.full(2 * n_links, 5.0), np.arange(2 * n_links), {"rx_power": rx, "prefec_ber": ber}))
    store.observe_findings([Prediction(5.0, "link", down, "link_down", 3600.0, 0.9, "optics")])
    reg = build_registry(store)
    leaf3 = {"cluster": "test", "leaf": "leaf3"}
    assert reg.get_sample_value("foreshock_leaf_xmit_wait_ticks_total", leaf3) == 0.0  # nothing risen yet
    # every port's counter rises by 100, but node0's resets (a reboot) and reads 1: the leaf's
    # counter rises by 3 x 100 + 1. Until 2026-12-01 the series was the sum of the raw counters,
    # which falls whenever one port's counter resets; rate() reads any fall as a reset of the
    # whole sum, and the leaf's congestion panel spiked by the sum itself.
    reset = t.slot("link", "node0/gpu3~leaf3")
    later = wait + 100.0
    later[reset] = 1.0
    store.observe_frame(Frame("link", np.full(n_links, 10.0), np.arange(n_links), {"link_state": state, "xmit_wait": later}))
    assert reg.get_sample_value("foreshock_leaf_xmit_wait_ticks_total", leaf3) == 3 * 100.0 + 1.0
    assert reg.get_sample_value("foreshock_leaf_links_down", leaf3) == 1
    assert reg.get_sample_value("foreshock_leaf_links_down", {"cluster": "test", "leaf": "leaf2"}) == 0
    assert reg.get_sample_value("foreshock_leaf_optic_rx_power_min_dbm", leaf3) == -9.5
    assert reg.get_sample_value("foreshock_leaf_optic_prefec_ber_max_ratio", leaf3) == 3e-5
    assert reg.get_sample_value("foreshock_optic_rx_power_dbm",
                                {"cluster": "test", "link": "node1/gpu3~leaf3", "end": "a"}) == -9.5
    assert reg.get_sample_value("foreshock_optic_prefec_ber_ratio",
                                {"cluster": "test", "link": "node1/gpu3~leaf3", "end": "b"}) == 3e-5
    # spine uplinks are not GPU links: no leaf series for the spine
    assert reg.get_sample_value("foreshock_leaf_links_down", {"cluster": "test", "leaf": "spine0"}) is None


def test_a_throttling_gpu_keeps_its_series_outside_the_top_k(small_topology: Topology) -> None:
    store = FindingStore(small_topology)
    temps = np.linspace(40, 71, 32)
    masks = np.zeros(32)
    masks[2] = 0x20  # a cool GPU held by SW thermal slowdown (its own limit is low)
    store.observe_frame(_gpu_frame(small_topology, 1.0, temps, masks=masks))
    reg = build_registry(store, top_k=1)
    gpu2 = {"cluster": "test", "rack": "rack0", "node": "node0", "gpu": "2"}
    assert reg.get_sample_value("foreshock_gpu_throttle_reasons", gpu2) == 0x20
    assert reg.get_sample_value("foreshock_gpu_temperature_celsius", {**gpu2, "gpu": "3"}) is None


# ---- the store's kernels against the numpy reference they replaced --------------------------
@pytest.mark.kernel
@pytest.mark.parametrize("seed", range(6))
def test_observe_frame_matches_the_numpy_reference(small_topology: Topology, seed: int) -> None:
    from foreshock.exporters.store import LATEST_FIELDS

    rng = np.random.default_rng(seed)
    store = FindingStore(small_topology)
    n_gpu = small_topology.size("gpu")
    latest = {f: np.full(n_gpu, np.nan) for f in LATEST_FIELDS["gpu"]}
    seen = np.zeros(n_gpu, bool)
    last_seen = np.full(n_gpu, -np.inf)
    last_ts = float("nan")
    for step in range(8):
        rows = int(rng.integers(0, 3 * n_gpu))  # repeated slots, and empty frames
        slot = np.sort(rng.integers(0, n_gpu - 1, rows)).astype(np.int32)
        ts = step * 10.0 + rng.random(rows)
        ts[rng.random(rows) < 0.1] = np.nan
        if step == 0 and rows:
            slot[-1], ts[-1] = n_gpu - 1, -np.inf  # the last GPU is only ever seen at -inf
        if step == 5 and rows:
            ts[0], ts[-1] = np.inf, -np.inf
        if step == 6:
            ts[:] = np.nan  # no finite time: the clock stays
        cols = {f: np.where(rng.random(rows) < 0.3, np.nan, rng.normal(50, 10, rows)) for f in latest}
        if rows:
            cols["util"][:] = 0.5  # a constant column
        store.observe_frame(Frame("gpu", ts, slot, {k: v.copy() for k, v in cols.items()}))
        if rows == 0:
            continue
        for f, col in cols.items():  # the reference: the code the kernel replaced
            ok = ~np.isnan(col)
            if f in ("slowdown_temp", "max_op_temp", "hbm_max_op_temp"):  # a GPU's own limits:
                ok &= (col > 40.0) & (col < 130.0)  # out of range (an offset, a 0) is no report
            latest[f][slot[ok]] = col[ok]
        seen[slot] = True
        np.maximum.at(last_seen, slot, np.nan_to_num(ts, nan=-np.inf))
        last_ts = float(np.nanmax(ts)) if np.isfinite(ts).any() else last_ts
    snap = store.snapshot()
    for f in latest:
        np.testing.assert_array_equal(snap.latest["gpu"][f], latest[f])
    np.testing.assert_array_equal(snap.seen["gpu"], seen)
    np.testing.assert_array_equal(snap.last_seen["gpu"], last_seen)
    assert snap.last_ts == last_ts or (np.isnan(snap.last_ts) and np.isnan(last_ts))


@pytest.mark.kernel
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # read only
@given(bits=st.sampled_from([32, 64]),
       rows=st.lists(st.tuples(st.integers(0, 3), st.floats(0.5, 30.0),
                               st.one_of(st.just(float("nan")), st.just(0.0), st.just(2.0**32 - 1),
                                         st.floats(0, 2.0**33), st.floats(2.49e9, 2.49e9 + 1e7))),
                     max_size=40))
def test_counter_increase_is_what_the_congestion_detector_reads(
        small_topology: Topology, bits: int, rows: list[tuple[int, float, float]]) -> None:
    """Whatever the readings (glitches, wraps, resets, garbage, all ones), each link's increase in
    the store is the sum of the increases the congestion detector's own counters read from them."""
    from foreshock.detectors.congestion import C_WAIT, COUNTERS, CongestionDetector

    slot = np.array([r[0] for r in rows], dtype=np.int32)
    ts = np.zeros(len(rows))
    last = dict.fromkeys(range(4), 0.0)
    for i, (s, gap, _) in enumerate(rows):  # time-ordered per link
        last[s] = ts[i] = last[s] + gap
    values = np.array([r[2] for r in rows], dtype=np.float64)
    store = FindingStore(small_topology, congestion_params={"counter_bits": bits})
    n_links = small_topology.size("link")
    store.observe_frame(Frame("link", ts, slot, {"xmit_wait": values.copy(), "link_state": np.full(len(rows), 4.0)}))
    detector = CongestionDetector(small_topology, counter_bits=bits)
    raw = np.full((len(rows), len(COUNTERS)), np.nan)
    raw[:, C_WAIT] = values
    delta, _, _ = detector.counters.update(ts, slot, raw)
    ref = np.zeros(n_links)
    for s, d in zip(slot.tolist(), delta[:, C_WAIT].tolist()):
        if d > 0:
            ref[s] += d
    np.testing.assert_array_equal(store.snapshot().xmit_wait_increase, ref)


TOP_32 = 2**32


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # read only
@given(bits=st.sampled_from([32, 64]),
       start=st.one_of(st.integers(10**8, TOP_32 - 5000), st.integers(TOP_32 - 60_000, TOP_32 - 5000)),
       steps=st.lists(st.tuples(st.sampled_from(["rise", "rise", "glitch", "reset"]), st.integers(1000, 2000)),
                      max_size=30))
def test_a_links_increase_is_the_true_one_through_glitches_wraps_and_resets(
        small_topology: Topology, bits: int, start: int, steps: list[tuple[str, int]]) -> None:
    """A naive reference: a port's true xmit_wait, rising 1000..2000 ticks per 10-s poll from
    ``start``, read every 10 s: wrapping at 2**32 (``counter_bits=32``), read as 0 once now and
    then (a glitch), or cleared (a reset: its next reading is what it counted since). The store's
    increase is the true one: a glitch adds nothing but the rise it hid, a wrap the wrapped rise,
    a reset the new value. (Cases the rules cannot tell apart are not drawn: a glitch or a reset
    within reach of the top, a glitch before the counter's pace is known.)"""
    modulus = TOP_32 if bits == 32 else 0
    true = start
    expected = 0
    hidden = 0  # the rise of the poll read as 0: the next reading shows it
    paced = 0  # readings since the counter's pace was last unknown (its first reading, a reset)
    readings = [float(start)]
    for op, rise in steps:
        counter = true % modulus if modulus else true  # what the port reads
        near_top = modulus and modulus - counter <= 10**5
        glitched = readings[-1] == 0.0
        if op == "glitch" and (paced < 2 or near_top or glitched):
            op = "rise"
        if op == "reset" and (counter < 10**8 or near_top or glitched):
            op = "rise"
        if op == "reset":
            true = rise
            expected += rise
            paced = 0
            readings.append(float(rise))
        elif op == "glitch":
            true += rise
            hidden = rise
            readings.append(0.0)
        else:
            true += rise
            expected += rise + hidden
            hidden = 0
            paced += 1
            readings.append(float(true % modulus if modulus else true))
    assume(2.0**32 - 1 not in readings)  # where a 32-bit counter stops: held for a poll, a case of its own
    store = FindingStore(small_topology, congestion_params={"counter_bits": bits})
    link = 0
    for k, value in enumerate(readings):
        store.observe_frame(Frame("link", np.array([10.0 * k]), np.array([link], dtype=np.int32),
                                  {"xmit_wait": np.array([value]), "link_state": np.array([4.0])}))
    assert store.snapshot().xmit_wait_increase[link] == expected


def test_findings_lapse_with_telemetry_time_when_no_more_findings_come(small_topology: Topology) -> None:
    """Findings lapsed only when more findings came: after one burst, a quiet cluster kept
    exporting its anomalies and a never-withdrawn prediction (and their alerts) for good."""
    store = FindingStore(small_topology, anomaly_ttl_s=300.0)
    n = small_topology.size("gpu")
    store.observe_frame(_gpu_frame(small_topology, 0.0, np.full(n, 50.0)))
    store.observe_findings([Anomaly(0.0, "link", 0, "xmit_wait", 9.0, "congestion"),
                            Prediction(0.0, "gpu", 3, "thermal_throttle", 600.0, 0.9, "thermal")])
    for t in range(60, 3601, 60):  # an hour of telemetry, not one finding
        store.observe_frame(_gpu_frame(small_topology, float(t), np.full(n, 50.0)))
        snap = store.snapshot()
        assert (len(snap.anomalies), len(snap.predictions)) == ((1 if t <= 300 else 0), (1 if t <= 900 else 0)), t


def test_entities_that_stop_reporting_are_not_exported_with_their_last_values(small_topology: Topology) -> None:
    """A node that went down with its GPUs' brake bit set, HBM at 93 °C and its fans read as
    stopped kept exporting those values — in its GPUs' series and its rack's aggregates — for
    good, and ForeshockPowerBrake, ForeshockHbmTemperatureNearLimit and ForeshockFanStopped kept
    firing. Values older than the collector's staleness window (the one gpus_reporting counts in)
    are left out."""
    t = small_topology
    n = t.size("gpu")
    store = FindingStore(t)
    down = np.flatnonzero(t.gpu_node == t.slot("node", "node0"))
    hbm = np.full(n, 60.0)
    hbm[down] = 93.0
    reasons = np.zeros(n)
    reasons[down] = 0x80  # HW power brake
    store.observe_frame(Frame("gpu", np.zeros(n), np.arange(n), {"gpu_temp": np.full(n, 50.0), "hbm_temp": hbm,
                                                                    "throttle_reasons": reasons}))
    store.observe_frame(Frame("node", [0.0, 0.0], [0, 1], {"fan_speed": [0.0, 0.6]}))
    reg = build_registry(store)
    gpu0 = {"cluster": "test", "rack": "rack0", "node": "node0", "gpu": "0"}
    assert reg.get_sample_value("foreshock_gpu_memory_temperature_celsius", gpu0) == 93.0
    up = np.setdiff1d(np.arange(n), down)
    for ts in (60.0, 120.0, 180.0):  # node0 is silent from here on; node1 reports its fans
        store.observe_frame(Frame("gpu", np.full(len(up), ts), up, {"gpu_temp": np.full(len(up), 50.0),
                                                                      "hbm_temp": np.full(len(up), 60.0),
                                                                      "throttle_reasons": np.zeros(len(up))}))
        store.observe_frame(Frame("node", [ts], [1], {"fan_speed": [0.6]}))
    assert reg.get_sample_value("foreshock_gpu_memory_temperature_celsius", gpu0) is None
    assert reg.get_sample_value("foreshock_gpu_throttle_reasons", gpu0) is None
    assert reg.get_sample_value("foreshock_rack_gpu_memory_temperature_max_celsius",
                                {"cluster": "test", "rack": "rack0"}) == 60.0
    assert reg.get_sample_value("foreshock_node_fan_speed_ratio",
                                {"cluster": "test", "rack": "rack0", "node": "node0"}) is None
    assert reg.get_sample_value("foreshock_node_fan_speed_ratio",
                                {"cluster": "test", "rack": "rack0", "node": "node1"}) == 0.6


def test_every_gpu_with_hbm_near_its_limit_is_exported_however_many(small_topology: Topology) -> None:
    """With more hot GPUs than the top K (a failing loop heats whole racks), the hottest K changed
    from scrape to scrape and no GPU kept its series long enough for the HBM alert's ``for``."""
    t = small_topology
    n = t.size("gpu")
    store = FindingStore(t)
    hbm = np.linspace(90.0, 93.0, n)  # every GPU within 5 °C of the 95 °C limit
    store.observe_frame(Frame("gpu", np.zeros(n), np.arange(n), {"gpu_temp": np.full(n, 50.0), "hbm_temp": hbm}))
    text = generate_latest(build_registry(store, top_k=4)).decode()
    assert text.count("foreshock_gpu_memory_temperature_celsius{") == n


def test_the_top_k_are_the_gpus_nearest_their_own_limits_not_the_hottest(small_topology: Topology) -> None:
    """In a fleet mixing parts, 31 parts rated 105 °C at ~90 °C (15 °C left) took the top K by
    temperature, and the 85 °C part at 80 °C (5 °C left) had no series: the Fleet board's
    headroom stat, over the exported GPUs, showed 15 °C in green. The same for HBM."""
    t = small_topology
    n = t.size("gpu")
    core = 90.0 - np.arange(n) * 0.01
    hbm = 90.0 - np.arange(n) * 0.01
    limit = np.full(n, 105.0)
    core[n - 1], hbm[n - 2], limit[n - 1] = 80.0, 80.0, 85.0
    hbm_limit = np.full(n, 110.0)
    hbm_limit[n - 2] = 96.0  # 16 °C left: outside the band every GPU near its HBM limit is exported in
    store = FindingStore(t)
    store.observe_frame(Frame("gpu", np.full(n, 1000.0), np.arange(n), {
        "gpu_temp": core, "hbm_temp": hbm, "max_op_temp": limit, "hbm_max_op_temp": hbm_limit}))
    reg = build_registry(store, top_k=4)
    exported = {int(s.labels["gpu"]) + 8 * int(s.labels["node"].removeprefix("node"))
                for fam in reg.collect() if fam.name == "foreshock_gpu_temperature_celsius" for s in fam.samples}
    # the nearest by core (the 85 °C part, then three with 15 °C left) and by HBM (16 °C left, then 20)
    assert exported == {n - 1, 0, 1, 2} | {n - 2, 0, 1, 2}


LIMITS = ("foreshock_gpu_max_operating_temperature_celsius", "foreshock_gpu_memory_max_operating_temperature_celsius")


def test_each_exported_gpu_has_its_own_limits_beside_its_temperatures(small_topology: Topology) -> None:
    """The HBM alert and the GPU dashboard compared every GPU with a fixed 95 °C (87 °C core): the
    collector now exports each exported GPU's own limits, as last reported (an out-of-range value,
    such as nvidia-smi's T.Limit offset 0 or -2, is no report: the earlier one stays), else the
    core's HW slowdown less 2 °C, else 87 / 95 °C — one limit series per temperature series."""
    store = FindingStore(small_topology)
    n = small_topology.size("gpu")
    nan = np.full(n, np.nan)
    max_op, hbm_max_op, slowdown = nan.copy(), nan.copy(), nan.copy()
    max_op[0], hbm_max_op[0] = 83.0, 85.0  # GPU 0: another part, both limits reported
    slowdown[1] = 91.0  # GPU 1: only its HW slowdown (core limit 89); HBM not reported
    max_op[3], hbm_max_op[3] = 80.0, 105.0  # GPU 3: reported now, offsets at the next poll
    hbm = np.full(n, 60.0)
    hbm[5] = np.nan  # GPU 5: no HBM reading, so no HBM series and no HBM limit series
    frame = _gpu_frame(small_topology, 1.0, np.full(n, 50.0))
    frame.columns.update(hbm_temp=hbm, max_op_temp=max_op, hbm_max_op_temp=hbm_max_op, slowdown_temp=slowdown)
    store.observe_frame(frame)
    offsets = np.where(np.arange(n) == 3, 0.0, np.nan)
    later = _gpu_frame(small_topology, 11.0, np.full(n, 50.0))  # a poll without limits, GPU 3's as offsets
    later.columns.update(max_op_temp=offsets, hbm_max_op_temp=offsets - 2.0, slowdown_temp=offsets)
    store.observe_frame(later)
    store.observe_findings([Anomaly(11.0, "gpu", s, "gpu_temp", 9.0, "z") for s in (0, 1, 2, 3, 5)])
    reg = build_registry(store, top_k=0)

    def limits(slot: int) -> tuple[float | None, float | None]:
        gpu = {"cluster": "test", "rack": "rack0", "node": "node0", "gpu": str(slot)}
        return (reg.get_sample_value(LIMITS[0], gpu), reg.get_sample_value(LIMITS[1], gpu))
    assert limits(0) == (83.0, 85.0)
    assert limits(1) == (89.0, 95.0)
    assert limits(2) == (87.0, 95.0)  # reports none: Hopper's
    assert limits(3) == (80.0, 105.0)  # kept through the poll that printed offsets
    assert limits(5) == (87.0, None)
    text = generate_latest(reg).decode()
    temperatures = ("foreshock_gpu_temperature_celsius", "foreshock_gpu_memory_temperature_celsius")
    for limit, temperature in zip(LIMITS, temperatures):
        assert text.count(f"{limit}{{") == text.count(f"{temperature}{{") > 0  # bounded as the temperatures are



def test_a_replaced_board_is_exported_against_its_own_limits_not_the_old_boards(small_topology: Topology) -> None:
    """A GPU board swapped in its slot (``forget_limits``, as the pipeline does when a slot's
    ``board_id`` changes): the limits the old board reported are forgotten — the new board, reporting none, is
    exported and alerted on against the defaults, not the old part's 85 °C HBM — while its latest
    temperature and every other GPU's limits stay."""
    store = FindingStore(small_topology)
    n = small_topology.size("gpu")
    own = np.full(n, 85.0)
    frame = _gpu_frame(small_topology, 1.0, np.full(n, 50.0))
    frame.columns.update(hbm_temp=np.full(n, 70.0), hbm_max_op_temp=own, max_op_temp=own - 2.0)
    store.observe_frame(frame)
    store.forget_limits([1])
    store.observe_findings([Anomaly(1.0, "gpu", s, "gpu_temp", 9.0, "z") for s in (0, 1)])
    reg = build_registry(store, top_k=0)

    def sample(name: str, slot: int) -> float | None:
        return reg.get_sample_value(name, {"cluster": "test", "rack": "rack0", "node": "node0", "gpu": str(slot)})
    assert (sample(LIMITS[0], 1), sample(LIMITS[1], 1)) == (87.0, 95.0)
    assert (sample(LIMITS[0], 0), sample(LIMITS[1], 0)) == (83.0, 85.0)
    assert sample("foreshock_gpu_memory_temperature_celsius", 1) == 70.0

def test_the_hbm_series_band_is_relative_to_each_gpus_own_limit(small_topology: Topology) -> None:
    """Every GPU whose HBM is within HBM_SERIES_BAND_C of its limit keeps its series, however many
    (the alert's ``for`` needs it at every scrape): against the fixed 95 °C, an 85 °C part at
    78 °C (2 °C from the alert) had no series, and a 105 °C part at 90 °C (15 °C from it) had one."""
    store = FindingStore(small_topology)
    n = small_topology.size("gpu")
    hbm = np.full(n, 60.0)
    own = np.full(n, np.nan)
    hbm[4], own[4] = 78.0, 85.0
    hbm[6], own[6] = 90.0, 105.0
    hbm[7] = 86.0  # no limit reported: 95 °C
    frame = _gpu_frame(small_topology, 1.0, np.full(n, 50.0))
    frame.columns.update(hbm_temp=hbm, hbm_max_op_temp=own)
    store.observe_frame(frame)
    text = generate_latest(build_registry(store, top_k=0)).decode()
    exported = {int(line.split('gpu="')[1].split('"')[0]) for line in text.splitlines()
                if line.startswith("foreshock_gpu_memory_temperature_celsius{")}
    assert exported == {4, 7}


def test_findings_expire_exactly_as_a_scan_after_every_batch(small_topology: Topology) -> None:
    """The store scans for lapsed findings only once the clock passes the earliest possible
    lapse: what stays must be what a scan after every batch keeps."""
    rng = np.random.default_rng(3)
    ttl = 30.0
    store = FindingStore(small_topology, anomaly_ttl_s=ttl)
    anomalies: dict = {}
    predictions: dict = {}
    n = small_topology.size("gpu")
    for step in range(120):
        now = step * 2.0
        store.observe_frame(_gpu_frame(small_topology, now, np.full(n, 50.0)))
        batch = []
        for _ in range(int(rng.integers(0, 4))):
            slot = int(rng.integers(0, 4))
            ts = now - float(rng.integers(0, 20))  # findings may carry older timestamps
            if rng.random() < 0.5:
                batch.append(Anomaly(ts, "gpu", slot, "gpu_temp", 3.0, "z"))
            else:
                eta = float(rng.choice([0.0, 10.0, 45.0, -5.0, np.nan]))
                batch.append(Prediction(ts, "gpu", slot, "thermal_throttle", eta, 0.7, "thermal",
                                        active=bool(rng.random() < 0.8)))
        store.observe_findings(batch)
        for f in batch:  # the reference: apply, then scan everything
            if isinstance(f, Anomaly):
                anomalies[(f.entity_kind, f.slot, f.field, f.detector)] = f
            elif f.active:
                predictions[(f.event, f.entity_kind, f.slot)] = f
            else:
                predictions.pop((f.event, f.entity_kind, f.slot), None)
        anomalies = {k: a for k, a in anomalies.items() if not now - a.ts > ttl}
        predictions = {k: p for k, p in predictions.items() if not now - p.ts > max(p.eta_s, 0.0) + ttl}
        snap = store.snapshot()
        assert sorted(snap.anomalies, key=repr) == sorted(anomalies.values(), key=repr), step
        assert sorted(snap.predictions, key=repr) == sorted(predictions.values(), key=repr), step


def test_a_hot_hbm_keeps_its_series_beside_a_cool_core(small_topology: Topology) -> None:
    """The top K is taken by core and by HBM temperature: memory near its own limit under a cool
    core still gets its per-GPU series (the HBM alert reads them), and the bound is 2 × K."""
    store = FindingStore(small_topology)
    n = small_topology.size("gpu")
    temps = np.linspace(40, 71, n)  # GPU 31 has the hottest core
    hbm = np.full(n, 60.0)
    hbm[2] = 93.0  # GPU 2: the coolest cores but HBM 2 °C under its 95 °C limit
    frame = _gpu_frame(small_topology, 1.0, temps)
    frame.columns["hbm_temp"] = hbm
    store.observe_frame(frame)
    reg = build_registry(store, top_k=1)
    gpu = {"cluster": "test", "rack": "rack0", "node": "node0"}
    assert reg.get_sample_value("foreshock_gpu_memory_temperature_celsius", {**gpu, "gpu": "2"}) == 93.0
    assert reg.get_sample_value("foreshock_gpu_temperature_celsius", {**gpu, "gpu": "2"}) == pytest.approx(temps[2])
    text = generate_latest(reg).decode()
    exported = {line.split("{")[1].split("}")[0] for line in text.splitlines()
                if line.startswith("foreshock_gpu_temperature_celsius{")}
    assert len(exported) == 2  # GPU 2 (HBM) and GPU 31 (core): nothing else


def test_each_nodes_slowest_fan_is_exported_with_its_rack(small_topology: Topology) -> None:
    """node1's fan stopped; node2 reads -1, a sentinel, not a speed (no series rather than a value
    that would page: the cooling detector counts it as an input problem)."""
    store = FindingStore(small_topology)
    store.observe_frame(Frame("node", np.full(4, 1.0), np.arange(4),
                              {"fan_speed": np.array([0.35, 0.0, -1.0, 0.4]), "psu_power": np.full(4, 5000.0)}))
    reg = build_registry(store, top_k=0)

    def fan(node: str, rack: str) -> float | None:
        return reg.get_sample_value("foreshock_node_fan_speed_ratio", {"cluster": "test", "rack": rack, "node": node})
    assert (fan("node0", "rack0"), fan("node1", "rack0"), fan("node3", "rack1")) == (0.35, 0.0, 0.4)
    assert fan("node2", "rack1") is None


def test_rack_coolant_flow_and_cooling_loop_aggregates(small_topology: Topology) -> None:
    """rack0 is on loop cdu0 and rack1 on cdu1 (small_topology); values checked by hand."""
    store = FindingStore(small_topology)
    n = small_topology.size("gpu")
    temps = np.linspace(40, 71, n)
    temps[20] = np.nan  # a GPU without a reading is skipped, not counted as 0
    store.observe_frame(_gpu_frame(small_topology, 1.0, temps))
    store.observe_frame(Frame("rack", np.full(2, 1.0), np.arange(2),
                              {"inlet_temp": np.array([30.0, 41.0]), "coolant_flow": np.array([1.5, 0.125])}))
    r = np.full(n, 0.05)
    r[16:] = 0.08
    r[17] = np.nan
    store.set_gauges({"thermal_resistance_celsius_per_watt": ("gpu", r, "fitted R")})
    reg = build_registry(store, top_k=0)
    flow = {"cluster": "test", "rack": "rack1"}
    assert reg.get_sample_value("foreshock_rack_coolant_flow_liters_per_second", flow) == 0.125
    cdu0, cdu1 = {"cluster": "test", "cooling_loop": "cdu0"}, {"cluster": "test", "cooling_loop": "cdu1"}
    assert reg.get_sample_value("foreshock_loop_gpu_temperature_max_celsius", cdu0) == 55.0
    assert reg.get_sample_value("foreshock_loop_gpu_temperature_max_celsius", cdu1) == 71.0
    assert reg.get_sample_value("foreshock_loop_inlet_temperature_celsius", cdu1) == 41.0
    assert reg.get_sample_value("foreshock_loop_thermal_resistance_celsius_per_watt", cdu0) == pytest.approx(0.05)
    assert reg.get_sample_value("foreshock_loop_thermal_resistance_celsius_per_watt", cdu1) == pytest.approx(0.08)


def test_an_agents_health_is_served_under_the_workers_metric_names():
    import urllib.request

    from foreshock.exporters.prometheus import serve_health
    from foreshock.health import PipelineHealth

    health = PipelineHealth()
    health.processed("node", 12)
    health.problem("redfish", "BMC unreachable", 3)
    server, _ = serve_health(health, lambda: "c1", port=0)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'foreshock_agent_samples_read_total{cluster="c1",kind="node"} 12.0' in text
    assert 'foreshock_input_problems_total{cluster="c1",reason="BMC unreachable",stage="redfish"} 3.0' in text


def test_a_source_that_never_read_anything_still_shows_its_kind_at_zero():
    """ForeshockInputProblems divides problems by samples read: an agent whose BMCs never answer
    must export its kind's sample count at 0, or the ratio (and the alert) does not exist."""
    from foreshock.exporters.prometheus import HealthCollector
    from foreshock.streams.redfish import RedfishSource

    source = RedfishSource({"node7": "http://127.0.0.1:9"}, interval=1.0, user="u", password="p")
    families = {f.name: f for f in HealthCollector(source.health, lambda: "c1").collect()}
    (sample,) = families["foreshock_agent_samples_read"].samples
    assert sample.labels == {"cluster": "c1", "kind": "node"} and sample.value == 0.0
