"""Prometheus exporter: a custom collector over an injected :class:`FindingStore`.

No import-time registration and no global registry: :func:`build_registry` makes a fresh
``CollectorRegistry`` holding one :class:`ForeshockCollector`; :func:`serve` exposes it.

Cardinality is bounded: per-entity series exist only for entities with an active finding, the
``top_k`` GPUs nearest their own limits by core and by HBM temperature (at most 2 × ``top_k``;
the hottest, in a fleet of one part) and the GPUs whose
HBM is within ``HBM_SERIES_BAND_C`` of their own limit (the HBM alert's, however many); a GPU's
limits are exported where its temperatures are. Aggregates by rack, cooling loop, leaf switch and
job are always exported.
The catalogue below is the one place metric names are defined (the rules and dashboards
generator reads it too).
"""

from __future__ import annotations

import errno
import math
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import numpy as np
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from foreshock import facts
from foreshock.facts import IB_PORT_STATE_ACTIVE, THROTTLE_BITS
from foreshock.fields import get_field
from foreshock.health import PipelineHealth

from .store import LATENCY_BUCKETS, FindingStore, StoreSnapshot, prediction_key, xid_severity

NS = "foreshock"
THERMAL_RESISTANCE_GAUGE = "thermal_resistance_celsius_per_watt"
"""The detector gauge (see ``Detector.gauges``) exported as the thermal-resistance families."""
GPU_LABELS = ("cluster", "rack", "node", "gpu")


@dataclass(frozen=True)
class MetricSpec:
    name: str
    type: str  # gauge | counter | histogram
    help: str
    labels: tuple[str, ...]
    # a counter served with each series' created timestamp: ``..._created`` (less ``_total``) beside it
    created: bool = False


CATALOGUE: tuple[MetricSpec, ...] = (
    # per-GPU telemetry, bounded to flagged GPUs + top K hottest
    MetricSpec(f"{NS}_gpu_temperature_celsius", "gauge", "GPU core temperature (flagged GPUs and the top K hottest)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_memory_temperature_celsius", "gauge", "GPU HBM temperature (flagged GPUs and the top K hottest)", GPU_LABELS),
    # each GPU's own limits, beside the temperature they bound (the HBM alert and the GPU dashboard
    # compare with them): a GPU of another SKU, or whose driver reports a lower limit, is judged by its own
    MetricSpec(f"{NS}_gpu_max_operating_temperature_celsius", "gauge",
               "GPU core max operating temperature: its own as last reported, else its HW slowdown "
               f"temperature less {facts.HW_SLOWDOWN_TEMP_C - facts.MAX_OPERATING_TEMP_C:g} °C, else "
               f"{facts.MAX_OPERATING_TEMP_C:g} °C (GPUs whose core temperature is exported)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_memory_max_operating_temperature_celsius", "gauge",
               "GPU HBM max operating temperature: its own as last reported, else "
               f"{facts.HBM_MAX_OPERATING_TEMP_C:g} °C (GPUs whose HBM temperature is exported)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_power_watts", "gauge", "GPU power draw (flagged GPUs and the top K hottest)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_power_limit_watts", "gauge", "GPU enforced power limit (flagged GPUs and the top K hottest)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_sm_clock_hertz", "gauge", "GPU SM clock (flagged GPUs and the top K hottest)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_throttle_reasons", "gauge", "Clock event reason bitmask as NVML reports it (flagged GPUs and the top K hottest)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_throttle_reason_active", "gauge", "1 when the named clock event reason bit is set (GPUs with a prediction, or held by a thermal or power-brake bit)", GPU_LABELS + ("reason",)),
    MetricSpec(f"{NS}_gpu_thermal_resistance_celsius_per_watt", "gauge", "Fitted die-to-coolant thermal resistance (flagged GPUs and the top K hottest)", GPU_LABELS),
    # aggregates, always
    MetricSpec(f"{NS}_rack_gpu_temperature_max_celsius", "gauge", "Hottest GPU core temperature in the rack", ("cluster", "rack")),
    MetricSpec(f"{NS}_rack_gpu_temperature_mean_celsius", "gauge", "Mean GPU core temperature in the rack", ("cluster", "rack")),
    MetricSpec(f"{NS}_rack_gpu_memory_temperature_max_celsius", "gauge", "Hottest GPU HBM temperature in the rack", ("cluster", "rack")),
    MetricSpec(f"{NS}_rack_thermal_resistance_celsius_per_watt", "gauge", "Mean fitted GPU thermal resistance in the rack", ("cluster", "rack")),
    MetricSpec(f"{NS}_rack_gpu_power_watts", "gauge", "Sum of GPU power draw in the rack, over its GPUs that reported one (none: no series)", ("cluster", "rack")),
    MetricSpec(f"{NS}_rack_inlet_temperature_celsius", "gauge", "Rack inlet (coolant supply) temperature", ("cluster", "rack")),
    MetricSpec(f"{NS}_rack_coolant_flow_liters_per_second", "gauge", "Coolant flow through the rack", ("cluster", "rack")),
    MetricSpec(f"{NS}_node_fan_speed_ratio", "gauge", "The node's slowest chassis fan as a share of full speed (0 = stopped)", ("cluster", "rack", "node")),
    MetricSpec(f"{NS}_loop_gpu_temperature_max_celsius", "gauge", "Hottest GPU core temperature on the cooling loop", ("cluster", "cooling_loop")),
    MetricSpec(f"{NS}_loop_inlet_temperature_celsius", "gauge", "Mean inlet temperature of the racks on the cooling loop", ("cluster", "cooling_loop")),
    MetricSpec(f"{NS}_loop_thermal_resistance_celsius_per_watt", "gauge", "Mean fitted GPU thermal resistance on the cooling loop", ("cluster", "cooling_loop")),
    MetricSpec(f"{NS}_rack_gpus_throttled", "gauge", "GPUs of the rack with a thermal or power throttle bit set", ("cluster", "rack", "kind")),
    MetricSpec(f"{NS}_job_step_time_seconds", "gauge", "Last synchronous step time of the job", ("cluster", "training_job")),
    MetricSpec(f"{NS}_gpus_reporting", "gauge", "GPUs that reported telemetry within the staleness window", ("cluster",)),
    MetricSpec(f"{NS}_leaf_xmit_wait_ticks_total", "counter", "What port_xmit_wait rose by over the leaf's GPU links, across port counter resets", ("cluster", "leaf")),
    MetricSpec(f"{NS}_leaf_links_down", "gauge", "GPU links of the leaf whose port is not ACTIVE", ("cluster", "leaf")),
    MetricSpec(f"{NS}_leaf_optic_rx_power_min_dbm", "gauge", "Weakest optic RX power on the leaf's GPU links", ("cluster", "leaf")),
    MetricSpec(f"{NS}_leaf_optic_prefec_ber_max_ratio", "gauge", "Worst optic pre-FEC BER on the leaf's GPU links", ("cluster", "leaf")),
    MetricSpec(f"{NS}_optic_rx_power_dbm", "gauge", "Optic RX power (optics of flagged links)", ("cluster", "link", "end")),
    MetricSpec(f"{NS}_optic_prefec_ber_ratio", "gauge", "Optic pre-FEC bit error rate (optics of flagged links)", ("cluster", "link", "end")),
    # findings
    MetricSpec(f"{NS}_prediction_eta_seconds", "gauge", "Predicted time until the event, per entity with an active prediction (NaN: no finite forecast)", ("cluster", "event", "entity_kind", "entity", "rack", "detector")),
    MetricSpec(f"{NS}_prediction_confidence_ratio", "gauge", "Confidence of the active prediction (0-1)", ("cluster", "event", "entity_kind", "entity", "rack", "detector")),
    MetricSpec(f"{NS}_predictions_active", "gauge", "Active predictions by event and rack", ("cluster", "event", "rack")),
    MetricSpec(f"{NS}_predictions_raised_total", "counter", "Predictions raised (first prediction per entity, event and detector)", ("cluster", "event")),
    MetricSpec(f"{NS}_anomaly_score", "gauge", "Score of a current anomaly (higher = more anomalous)", ("cluster", "entity_kind", "entity", "field", "detector")),
    MetricSpec(f"{NS}_estimate", "gauge", "Per-entity estimates published by detectors (flagged entities)", ("cluster", "estimate", "entity_kind", "entity")),
    MetricSpec(f"{NS}_estimate_rack_max", "gauge", "Per-rack maximum of each detector estimate", ("cluster", "estimate", "rack")),
    MetricSpec(f"{NS}_incidents_open", "gauge", "Open incidents by root-cause kind", ("cluster", "root_kind")),
    MetricSpec(f"{NS}_incident_members", "gauge", "Members of an open incident", ("cluster", "incident", "root_kind", "root_entity", "state")),
    MetricSpec(f"{NS}_incident_predicted_members", "gauge", "Members an open incident is predicted to reach", ("cluster", "incident", "root_kind", "root_entity")),
    MetricSpec(f"{NS}_job_predicted_slowdown_ratio", "gauge", "Predicted extra time of a job's synchronous step as a fraction of its normal step (0.25 = 25% slower)", ("cluster", "training_job")),
    # GPU-hours per hour is a count of GPUs (a unit of hours promtool rejects: not the base unit)
    MetricSpec(f"{NS}_job_gpus_at_risk", "gauge", "GPUs' worth of a job's GPU-hours lost per hour to its worst incident (GPU-hours at risk per hour: its GPUs × the share lost waiting for the slowest)", ("cluster", "training_job")),
    MetricSpec(f"{NS}_xid_events_total", "counter", "New XID events seen (changes of the last-XID field)", ("cluster", "rack", "node", "gpu", "xid", "severity"),
               created=True),
    # the pipeline itself
    MetricSpec(f"{NS}_samples_processed_total", "counter", "Telemetry samples processed", ("cluster", "kind")),
    # an ingest agent's own (not summed with the workers': every sample would count twice)
    MetricSpec(f"{NS}_agent_samples_read_total", "counter", "Telemetry samples an ingest agent read from its source", ("cluster", "kind")),
    MetricSpec(f"{NS}_findings_total", "counter", "Findings emitted", ("cluster", "type")),
    MetricSpec(f"{NS}_input_problems_total", "counter", "Input problems counted (bad records, NaN, resets, ...)", ("cluster", "stage", "reason")),
    MetricSpec(f"{NS}_polls_skipped_total", "counter", "Polls a live source skipped: a poll, or the pipeline, took longer than its interval", ("cluster", "stage")),
    MetricSpec(f"{NS}_topology_changes_total", "counter", "Times a live source's derived topology changed: took in GPUs it did not list (a node replaced or added), or forgot a host gone for long (--forget-after)", ("cluster", "stage")),
    MetricSpec(f"{NS}_gpus_replaced_total", "counter", "GPUs found with another board in their slot (their UUID changed: an RMA), by stage: the live source that read the UUIDs, and the pipeline stage (guard) that started their detector state afresh", ("cluster", "stage")),
    MetricSpec(f"{NS}_gpus_moved_total", "counter", "GPU boards read at another index of their node than before (a node rebooted with a GPU missing lists the later GPUs one index lower): no RMA, their detector state follows them; by stage, as gpus_replaced", ("cluster", "stage")),
    MetricSpec(f"{NS}_records_not_assigned_total", "counter", "Kafka records of a frames partition no longer (or not yet) assigned to this worker, left to the partition's owner (a rebalance): not processed, and not an input problem", ("cluster", "stage")),
    MetricSpec(f"{NS}_dead_letters_total", "counter", "Records sent to the dead-letter topic", ("cluster",)),
    MetricSpec(f"{NS}_ingest_lag_seconds", "gauge", "Seconds from a batch's sending by its agent (Kafka workers; its arrival in the embedded pipeline) to the end of its detection", ("cluster",)),
    # clock-free, beside the ingest lag (read against the agents' send stamps: a host's clock off by
    # N s reads as N s of lag)
    MetricSpec(f"{NS}_consumer_lag_records", "gauge", "Records of a Kafka partition assigned to this worker that it has not processed yet: the partition's high watermark less the next offset to process (Kafka workers only)", ("cluster", "topic", "partition")),
    MetricSpec(f"{NS}_last_telemetry_timestamp_seconds", "gauge", "Telemetry timestamp of the newest sample processed", ("cluster",)),
    MetricSpec(f"{NS}_detector_latency_seconds", "histogram", "Detector bank latency per batch", ("cluster",)),
)
SPECS = {m.name: m for m in CATALOGUE}

_GPU_FIELDS = {
    f"{NS}_gpu_temperature_celsius": "gpu_temp",
    f"{NS}_gpu_memory_temperature_celsius": "hbm_temp",
    f"{NS}_gpu_power_watts": "power",
    f"{NS}_gpu_power_limit_watts": "power_limit",
    f"{NS}_gpu_sm_clock_hertz": "sm_clock",
    f"{NS}_gpu_throttle_reasons": "throttle_reasons",
}
_THERMAL_BITS = THROTTLE_BITS["sw_thermal"] | THROTTLE_BITS["hw_thermal"] | THROTTLE_BITS["hw_slowdown"]
_POWER_BITS = THROTTLE_BITS["sw_power_cap"] | THROTTLE_BITS["hw_power_brake"]


def _family(name: str) -> Any:  # the concrete *MetricFamily, whose add_metric signatures differ
    spec = SPECS[name]
    short = name
    if spec.type == "counter":
        short = name[: -len("_total")] if name.endswith("_total") else name
        return CounterMetricFamily(short, spec.help, labels=spec.labels)
    if spec.type == "histogram":
        return HistogramMetricFamily(name, spec.help, labels=spec.labels)
    return GaugeMetricFamily(name, spec.help, labels=spec.labels)


HBM_SERIES_BAND_C = 10.0
"""A GPU whose HBM is within this of its own max operating temperature (:func:`own_limits`) always
has its series: wider than the HBM alert's margin (5 °C), so every GPU the alert is about is
exported at every scrape."""
_LIMIT_FAMILIES = (
    (f"{NS}_gpu_max_operating_temperature_celsius", "gpu_temp"),
    (f"{NS}_gpu_memory_max_operating_temperature_celsius", "hbm_temp"),
)
"""Each limit family and the temperature it bounds: a GPU has the one where it has the other."""


def own_limits(gpu: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each GPU's core and HBM max operating temperatures, by slot, from the store's latest values
    (which hold only readings in range, kept through the polls that miss them): its own as last
    reported; for the core else its HW slowdown temperature less the 2 °C between them; else
    Hopper's (``facts``). The detectors' rule (``thermal_fit.core_limit`` and ``hbm_limit``)."""
    below_slowdown = facts.HW_SLOWDOWN_TEMP_C - facts.MAX_OPERATING_TEMP_C
    core = np.where(np.isnan(gpu["max_op_temp"]), gpu["slowdown_temp"] - below_slowdown, gpu["max_op_temp"])
    core = np.where(np.isnan(core), facts.MAX_OPERATING_TEMP_C, core)
    hbm = np.where(np.isnan(gpu["hbm_max_op_temp"]), facts.HBM_MAX_OPERATING_TEMP_C, gpu["hbm_max_op_temp"])
    return core, hbm


STALE_AFTER_INTERVALS = 3.0
"""A live entity is stale once unheard for this many of its kind's report intervals
(``StoreSnapshot.report_interval_s``), where that is longer than ``stale_after_s``: two missed
polls are not yet a node gone."""


class ForeshockCollector(Collector):
    def __init__(self, store: FindingStore, top_k: int = 16, stale_after_s: float = 120.0,
                 wall_clock: Callable[[], float] = time.time) -> None:
        """``stale_after_s``: the staleness window, or in a live store its floor (:meth:`stale_after`).
        ``wall_clock``: the clock of the XID counters' created timestamps (:meth:`_xids`)."""
        self.store = store
        self.top_k = top_k
        self.stale_after_s = stale_after_s
        self.wall_clock = wall_clock
        # by the labels of each XID counter served, when this collector first served it
        self._xid_first_served: dict[tuple[str, ...], float] = {}
        self._xid_lock = threading.Lock()  # scrapes are served from concurrent threads
        # scrapes number their snapshots in the order taken; the XID counters known are those of
        # the newest snapshot served yet (``_xids``): a slower scrape finishing later, with an
        # older snapshot, must not forget a counter born after it
        self._snapshots_taken = 0
        self._xid_newest_snapshot = 0

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families vary with the snapshot

    def collect(self) -> Iterator[Metric]:
        with self._xid_lock:  # the snapshot and its number together: numbers follow the order taken
            snap = self.store.snapshot()
            self._snapshots_taken += 1
            number = self._snapshots_taken
        self._drop_stale(snap)
        yield from self._gpu_series(snap)
        yield from self._aggregates(snap)
        yield from self._findings(snap)
        yield self._xids(snap, number)
        yield from self._pipeline(snap)

    def _drop_stale(self, snap: StoreSnapshot) -> None:
        """Leave out the latest values and estimates of entities not heard from within their
        kind's window (:meth:`stale_after`) of the store's clock (the one ``gpus_reporting`` counts in): a node
        that went down with its brake bit set, its HBM at 93 °C or its fans read as stopped otherwise
        exported those values, in its series and in its rack's aggregates, for good — and kept
        their alerts firing."""
        if not math.isfinite(snap.clock):
            return
        stale = {kind: ~self._fresh(snap, kind) for kind in snap.last_seen}
        for kind, fields in snap.latest.items():
            if stale[kind].any():
                for values in fields.values():
                    values[stale[kind]] = np.nan  # the snapshot's own copies
        # and the detectors' estimates of those entities: a detector keeps its last fit of a GPU
        # that left, and that fit stayed in its rack's and loop's means and maxima for good (a
        # pulled GPU with a degraded thermal resistance kept ForeshockCoolingDegradation firing)
        for name, (kind, values, help_text) in list(snap.gauges.items()):
            gone = stale.get(kind)
            if gone is not None and len(values) == len(gone) and gone.any():
                snap.gauges[name] = (kind, np.where(gone, np.nan, values), help_text)  # the store's stay

    def _fresh(self, snap: StoreSnapshot, kind: str) -> np.ndarray:
        """The entities of ``kind`` heard from within :meth:`stale_after` of the store's clock:
        telemetry time in a replay; in a live store, wall time since a row of theirs arrived,
        whatever their source's clock (``exporters/store.py``): with telemetry time, a frame of
        an agent 600 s fast made every other entity read stale until the next frame."""
        return snap.heard[kind] >= snap.clock - self.stale_after(snap, kind)  # type: ignore[no-any-return]

    def stale_after(self, snap: StoreSnapshot, kind: str) -> float:
        """How long an entity of ``kind`` stays exported unheard: ``stale_after_s``, or in a live
        store ``STALE_AFTER_INTERVALS`` of the kind's report interval where that is longer. A
        fixed 120 s left every entity of ``watch --interval 300`` out of /metrics (and
        ``gpus_reporting`` at 0) for 180 s of each poll, so no alert's ``for`` ever held. The
        interval is the store's robust reading of what the sources do (``_lower_median``): a
        pipeline pause does not widen the window for good. On the telemetry clock (replay,
        evaluate, demo) the window stays ``stale_after_s``: its clock see-saws with the stamps of
        skewed sources, so the gaps between an entity's stamps are no poll interval."""
        interval = snap.report_interval_s.get(kind, math.nan)
        if not math.isfinite(interval):
            return self.stale_after_s
        return max(self.stale_after_s, STALE_AFTER_INTERVALS * interval)

    # ---- per-entity ----------------------------------------------------------------------
    def _flagged_gpus(self, snap: StoreSnapshot, limits: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """The GPUs exported one by one; ``limits``: each GPU's own core and HBM limits (:func:`own_limits`)."""
        flagged = {f.slot for f in snap.predictions if f.entity_kind == "gpu"}
        flagged |= {a.slot for a in snap.anomalies if a.entity_kind == "gpu"}
        # a GPU held by a thermal or power-brake bit right now keeps its series (and decoded bits)
        mask = np.nan_to_num(snap.latest["gpu"]["throttle_reasons"]).astype(np.int64)
        flagged |= set(np.flatnonzero(mask & (_THERMAL_BITS | THROTTLE_BITS["hw_power_brake"])).tolist())
        # the K nearest their own limits by core and the K by HBM (the hottest, in a fleet of one
        # part): HBM runs its own race to its own limit (a cool core can sit beside hot memory),
        # and the HBM alert reads the per-GPU series. By headroom, not by temperature: in a fleet
        # mixing parts, 32 parts rated 105 °C at 90 °C had hidden an 85 °C part at 80 °C
        for field, limit in zip(("gpu_temp", "hbm_temp"), limits):
            flagged |= set(_hottest(snap.latest["gpu"][field] - limit, self.top_k).tolist())
        # and every GPU whose HBM is near its own limit: with more of them than K (a failing loop
        # heats a rack of 64), the hottest K changed from scrape to scrape and no GPU kept a
        # series long enough for the HBM alert's ``for`` (and against a fixed 95 °C, an 85 °C
        # part at 80 °C had no series at all)
        hbm = snap.latest["gpu"]["hbm_temp"]
        flagged |= set(np.flatnonzero(hbm >= limits[1] - HBM_SERIES_BAND_C).tolist())
        return np.array(sorted(flagged), dtype=np.int64)

    def _gpu_series(self, snap: StoreSnapshot) -> Iterator[Metric]:
        topo = snap.topology
        latest = snap.latest["gpu"]
        limits = own_limits(latest)  # (core, HBM): once per scrape, for the selection and the series
        gpus = self._flagged_gpus(snap, limits)
        labels = {int(s): _values(topo.labels("gpu", int(s)), GPU_LABELS) for s in gpus}
        for name, field in _GPU_FIELDS.items():
            fam = _family(name)
            for s in gpus:
                v = latest[field][s]
                if not math.isnan(v):
                    fam.add_metric(labels[int(s)], float(v))
            yield fam
        for (name, temp_field), limit in zip(_LIMIT_FAMILIES, limits):
            fam = _family(name)
            for s in gpus:
                if not math.isnan(latest[temp_field][s]):
                    fam.add_metric(labels[int(s)], float(limit[s]))
            yield fam
        fam = _family(f"{NS}_gpu_thermal_resistance_celsius_per_watt")
        r_est = snap.gauges.get(THERMAL_RESISTANCE_GAUGE)
        if r_est is not None and r_est[0] == "gpu":
            for s in gpus:
                if s < len(r_est[1]) and math.isfinite(r_est[1][s]):
                    fam.add_metric(labels[int(s)], float(r_est[1][s]))
        yield fam
        fam = _family(f"{NS}_gpu_throttle_reason_active")
        # decoded for the predicted GPUs and those a thermal or power-brake bit holds now (as
        # _flagged_gpus says: until 2026-12-04 a braking GPU had its mask but no decoded bits)
        decoded = {f.slot for f in snap.predictions if f.entity_kind == "gpu"}
        holding = _THERMAL_BITS | THROTTLE_BITS["hw_power_brake"]
        decoded |= set(np.flatnonzero(np.nan_to_num(latest["throttle_reasons"]).astype(np.int64) & holding).tolist())
        for s in gpus:
            mask = latest["throttle_reasons"][s]
            if int(s) not in decoded or math.isnan(mask):
                continue
            for reason, bit in THROTTLE_BITS.items():
                fam.add_metric(labels[int(s)] + [reason], float(int(mask) & bit != 0))
        yield fam

    # ---- aggregates ----------------------------------------------------------------------
    def _aggregates(self, snap: StoreSnapshot) -> Iterator[Metric]:
        topo = snap.topology
        cluster = topo.cluster
        gpu = snap.latest["gpu"]
        rack_of = topo.gpu_rack
        n_racks = len(topo.racks)
        temp, power, mask = gpu["gpu_temp"], gpu["power"], gpu["throttle_reasons"]
        tmax = _group_reduce(temp, rack_of, n_racks, np.fmax, -np.inf)
        tsum = np.bincount(rack_of, weights=np.nan_to_num(temp), minlength=n_racks)
        tcnt = np.bincount(rack_of, weights=~np.isnan(temp), minlength=n_racks)
        # summed over the GPUs that report power: a rack none of whose GPUs do (nvidia-smi's
        # [N/A], a DCGM field not watched) has no sum, not 0 W in the fleet's power
        has_power = np.isfinite(power)
        psum = np.bincount(rack_of, weights=np.where(has_power, power, 0.0), minlength=n_racks)
        pcnt = np.bincount(rack_of, weights=has_power, minlength=n_racks)
        m = np.nan_to_num(mask).astype(np.int64)
        thermal = np.bincount(rack_of, weights=(m & _THERMAL_BITS) != 0, minlength=n_racks)
        power_thr = np.bincount(rack_of, weights=(m & _POWER_BITS) != 0, minlength=n_racks)
        mcnt = np.bincount(rack_of, weights=~np.isnan(mask), minlength=n_racks)
        f_max = _family(f"{NS}_rack_gpu_temperature_max_celsius")
        f_mean = _family(f"{NS}_rack_gpu_temperature_mean_celsius")
        f_pow = _family(f"{NS}_rack_gpu_power_watts")
        f_thr = _family(f"{NS}_rack_gpus_throttled")
        for r, rack in enumerate(topo.racks):
            if pcnt[r]:
                f_pow.add_metric([cluster, rack], float(psum[r]))
            # counted where its GPUs report throttle reasons, with or without a core temperature (a rack
            # whose GPUs sent reasons and power only had no series: until 2026-12-05 the temperature's
            # count gated it)
            if tcnt[r] or mcnt[r]:
                f_thr.add_metric([cluster, rack, "thermal"], float(thermal[r]))
                f_thr.add_metric([cluster, rack, "power"], float(power_thr[r]))
            if tcnt[r] == 0:
                continue
            f_max.add_metric([cluster, rack], float(tmax[r]))
            f_mean.add_metric([cluster, rack], float(tsum[r] / tcnt[r]))
        yield from (f_max, f_mean, f_pow, f_thr)
        f_hbm = _family(f"{NS}_rack_gpu_memory_temperature_max_celsius")
        hmax = _group_reduce(gpu["hbm_temp"], rack_of, n_racks, np.fmax, -np.inf)
        for r, rack in enumerate(topo.racks):
            if np.isfinite(hmax[r]):
                f_hbm.add_metric([cluster, rack], float(hmax[r]))
        yield f_hbm
        f_rr = _family(f"{NS}_rack_thermal_resistance_celsius_per_watt")
        r_est = snap.gauges.get(THERMAL_RESISTANCE_GAUGE)
        if r_est is not None and r_est[0] == "gpu" and len(r_est[1]) == topo.size("gpu"):
            rack_r = _group_mean(r_est[1], rack_of, n_racks)
            for r, rack in enumerate(topo.racks):
                if np.isfinite(rack_r[r]):
                    f_rr.add_metric([cluster, rack], float(rack_r[r]))
        yield f_rr
        for name, field in ((f"{NS}_rack_inlet_temperature_celsius", "inlet_temp"),
                            (f"{NS}_rack_coolant_flow_liters_per_second", "coolant_flow")):
            fam = _family(name)
            for r, v in enumerate(snap.latest["rack"][field]):
                if not math.isnan(v):
                    fam.add_metric([cluster, topo.racks[r]], float(v))
            yield fam
        f_fan = _family(f"{NS}_node_fan_speed_ratio")
        lo, hi = get_field("fan_speed").valid
        for nd, v in enumerate(snap.latest["node"]["fan_speed"]):
            if lo <= v <= hi:  # a share of full speed; a -1 sentinel must not page as stopped
                f_fan.add_metric([cluster, topo.racks[topo.node_rack[nd]], topo.nodes[nd]], float(v))
        yield f_fan
        yield from self._loops(snap)
        f_step = _family(f"{NS}_job_step_time_seconds")
        for j, v in enumerate(snap.latest["job"]["step_time"]):
            if not math.isnan(v):
                f_step.add_metric([cluster, topo.jobs[j]], float(v))
        yield f_step
        f_rep = _family(f"{NS}_gpus_reporting")
        if math.isfinite(snap.last_ts):
            f_rep.add_metric([cluster], float(self._fresh(snap, "gpu").sum()))
        yield f_rep
        yield from self._leaves(snap)

    def _loops(self, snap: StoreSnapshot) -> Iterator[Metric]:
        """Cooling-loop aggregates: one loop (CDU) feeds several racks, and fails for all of them."""
        topo = snap.topology
        cluster = topo.cluster
        loops = topo.loops
        gpu_loop = topo.rack_loop[topo.gpu_rack]
        by_loop = {
            f"{NS}_loop_gpu_temperature_max_celsius":
                _group_reduce(snap.latest["gpu"]["gpu_temp"], gpu_loop, len(loops), np.fmax, -np.inf),
            f"{NS}_loop_inlet_temperature_celsius":
                _group_mean(snap.latest["rack"]["inlet_temp"], topo.rack_loop, len(loops)),
        }
        r_est = snap.gauges.get(THERMAL_RESISTANCE_GAUGE)
        if r_est is not None and r_est[0] == "gpu" and len(r_est[1]) == topo.size("gpu"):
            by_loop[f"{NS}_loop_thermal_resistance_celsius_per_watt"] = _group_mean(r_est[1], gpu_loop, len(loops))
        for name in (f"{NS}_loop_gpu_temperature_max_celsius", f"{NS}_loop_inlet_temperature_celsius",
                     f"{NS}_loop_thermal_resistance_celsius_per_watt"):
            fam = _family(name)
            values = by_loop.get(name)
            if values is not None:
                for i, loop in enumerate(loops):
                    if np.isfinite(values[i]):
                        fam.add_metric([cluster, loop], float(values[i]))
            yield fam

    def _leaves(self, snap: StoreSnapshot) -> Iterator[Metric]:
        """Fabric aggregates by leaf switch, over the GPU links (and their optics) it serves."""
        topo = snap.topology
        cluster = topo.cluster
        leaf = topo.link_leaf
        gpu_links = np.flatnonzero(leaf >= 0)
        n_sw = len(topo.switches)
        link = snap.latest["link"]
        optic = snap.latest["optic"]
        f_wait = _family(f"{NS}_leaf_xmit_wait_ticks_total")
        f_down = _family(f"{NS}_leaf_links_down")
        f_rx = _family(f"{NS}_leaf_optic_rx_power_min_dbm")
        f_ber = _family(f"{NS}_leaf_optic_prefec_ber_max_ratio")
        if len(gpu_links):
            lf = leaf[gpu_links]
            wait = link["xmit_wait"][gpu_links]
            # what the ports' counters rose by, across their resets: a sum of the raw counters
            # fell whenever one port's counter reset, which rate() read as a spike of the whole sum
            risen = snap.xmit_wait_increase[gpu_links] if len(snap.xmit_wait_increase) == len(leaf) else \
                np.zeros(len(gpu_links))
            wait_sum = np.bincount(lf, weights=risen, minlength=n_sw)
            # and what the links the store no longer lists under a leaf had risen by: without it
            # the counter fell when a host was forgotten (a reset to rate(): a spike)
            for s, name in enumerate(topo.switches if snap.xmit_wait_dropped else ()):
                wait_sum[s] += snap.xmit_wait_dropped.get(name, 0.0)
            state = link["link_state"][gpu_links]
            reported = np.bincount(lf, weights=~np.isnan(state), minlength=n_sw)
            down = np.bincount(lf, weights=(~np.isnan(state)) & (state != IB_PORT_STATE_ACTIVE), minlength=n_sw)
            optic_leaf = np.repeat(leaf, 2)
            o_ok = optic_leaf >= 0
            rx_min = _group_reduce(optic["rx_power"][o_ok], optic_leaf[o_ok], n_sw, np.fmin, np.inf)
            ber_max = _group_reduce(optic["prefec_ber"][o_ok], optic_leaf[o_ok], n_sw, np.fmax, -np.inf)
            has_wait = np.bincount(lf, weights=~np.isnan(wait), minlength=n_sw)
            for s in np.unique(lf):
                name = topo.switches[s]
                if has_wait[s]:
                    f_wait.add_metric([cluster, name], float(wait_sum[s]))
                if reported[s]:
                    f_down.add_metric([cluster, name], float(down[s]))
                if np.isfinite(rx_min[s]):
                    f_rx.add_metric([cluster, name], float(rx_min[s]))
                if np.isfinite(ber_max[s]):
                    f_ber.add_metric([cluster, name], float(ber_max[s]))
        yield from (f_wait, f_down, f_rx, f_ber)
        flagged_links = {f.slot for f in list(snap.predictions) + list(snap.anomalies) if f.entity_kind == "link"}
        flagged_links |= {f.slot // 2 for f in list(snap.predictions) + list(snap.anomalies) if f.entity_kind == "optic"}
        f_orx = _family(f"{NS}_optic_rx_power_dbm")
        f_ober = _family(f"{NS}_optic_prefec_ber_ratio")
        for ln in sorted(flagged_links):
            for end in (0, 1):
                o = 2 * ln + end
                if o >= len(optic["rx_power"]):
                    continue
                labels = [cluster, topo.links[ln], "ab"[end]]
                if not math.isnan(optic["rx_power"][o]):
                    f_orx.add_metric(labels, float(optic["rx_power"][o]))
                if not math.isnan(optic["prefec_ber"][o]):
                    f_ober.add_metric(labels, float(optic["prefec_ber"][o]))
        yield from (f_orx, f_ober)

    # ---- findings ------------------------------------------------------------------------
    def _findings(self, snap: StoreSnapshot) -> Iterator[Metric]:
        topo = snap.topology
        cluster = topo.cluster
        f_eta = _family(f"{NS}_prediction_eta_seconds")
        f_conf = _family(f"{NS}_prediction_confidence_ratio")
        active: dict[tuple[str, str], int] = {}
        for p in snap.predictions:
            entity = topo.name(p.entity_kind, p.slot)
            rack = topo.labels(p.entity_kind, p.slot).get("rack", "")
            labels = [cluster, p.event, p.entity_kind, entity, rack, p.detector]
            # the ETA counts down on the store's clock from when it was made (telemetry time; in a
            # live store, wall time since it arrived: by telemetry time it jumped by the skew of
            # whichever source spoke last)
            made = snap.predictions_heard.get(prediction_key(p), p.ts)
            if p.eta_s < 0:
                # no finite forecast (``power_cap``, ``optics``, ``thermal``: -1): NaN, not "due
                # now" (0 read so to ``ForeshockThrottlePredicted``'s ``< 1800``: "in 0s"); any
                # comparison with NaN is false, and the series still counts as an active prediction
                eta = math.nan
            elif math.isfinite(snap.clock):
                eta = max(0.0, p.eta_s - max(0.0, snap.clock - made))
            else:
                eta = p.eta_s
            f_eta.add_metric(labels, eta)
            f_conf.add_metric(labels, p.confidence)
            active[(p.event, rack)] = active.get((p.event, rack), 0) + 1
        yield f_eta
        yield f_conf
        f_active = _family(f"{NS}_predictions_active")
        for (event, rack), n in sorted(active.items()):
            f_active.add_metric([cluster, event, rack], float(n))
        yield f_active
        f_raised = _family(f"{NS}_predictions_raised_total")
        for event, n in sorted(snap.predictions_raised.items()):
            f_raised.add_metric([cluster, event], float(n))
        yield f_raised
        f_anom = _family(f"{NS}_anomaly_score")
        for a in snap.anomalies:
            f_anom.add_metric([cluster, a.entity_kind, topo.name(a.entity_kind, a.slot), a.field, a.detector], a.score)
        yield f_anom
        yield from self._estimates(snap)
        yield from self._incidents(snap)

    def _xids(self, snap: StoreSnapshot, number: int) -> Metric:
        """The XID counters, each with its created timestamp, served as
        ``foreshock_xid_events_created``: when this collector first served that counter, on the
        wall clock (Prometheus compares it with ``time()``), whatever the store's clock.

        The XID alerts tell a counter born in their window, whose first XID ``increase`` cannot
        see, by this timestamp: from Prometheus's samples alone, an old counter it did not scrape
        a window ago (Prometheus restarted, the target was down) looked as new. A counter this
        process no longer serves is forgotten: if it comes back (from 0), it is a new one. Stamped
        at the first scrape that finds it, not when its XID came: a counter born while nobody
        scraped is new to its first scrape (no alert has seen it).

        ``number``: the snapshot's, in the order scrapes took them (:meth:`collect`). Only the
        newest snapshot served yet says which counters are gone (the store drops a counter only
        with its GPU, ``FindingStore.move_to``): concurrent scrapes finish in any order, and one
        whose older snapshot predates a new counter had forgotten the counter a faster scrape
        just served, so the next scrape stamped it new again (the XID alert fired again). An
        older snapshot's scrape reads the stamps and changes none; a counter the newer one
        dropped is not served again."""
        topo = snap.topology
        counts: dict[tuple[str, ...], float] = {}
        for (slot, code), events in sorted(snap.xids.items()):
            gpu = topo.labels("gpu", slot)
            counts[(topo.cluster, gpu["rack"], gpu["node"], gpu["gpu"], str(code), xid_severity(code))] = float(events)
        now = self.wall_clock()
        with self._xid_lock:
            known = self._xid_first_served
            if number > self._xid_newest_snapshot:
                self._xid_newest_snapshot = number
                self._xid_first_served = known = {labels: known.get(labels, now) for labels in counts}
            created = {labels: known[labels] for labels in counts if labels in known}
        family = _family(f"{NS}_xid_events_total")
        for labels, value in counts.items():
            if labels in created:
                family.add_metric(list(labels), value, created=created[labels])
        return family  # type: ignore[no-any-return]

    def _estimates(self, snap: StoreSnapshot) -> Iterator[Metric]:
        topo = snap.topology
        f_est = _family(f"{NS}_estimate")
        f_rack = _family(f"{NS}_estimate_rack_max")
        flagged: dict[str, set[int]] = {}
        for f in list(snap.predictions) + list(snap.anomalies):
            flagged.setdefault(f.entity_kind, set()).add(f.slot)
        # a link's optics with it (optic 2·link + end), as the optic series are: the optics detector's
        # estimates are per optic, its link_down prediction per link (until 2026-12-05 a link flagged
        # by that prediction alone showed its optics' power and BER but not their ETA and trend)
        flagged.setdefault("optic", set()).update(2 * s + end for s in flagged.get("link", ()) for end in (0, 1))
        for name, (kind, values, _help) in sorted(snap.gauges.items()):
            for s in sorted(flagged.get(kind, ())):
                if s < len(values) and not math.isnan(values[s]):
                    f_est.add_metric([topo.cluster, name, kind, topo.name(kind, s)], float(values[s]))
            if kind == "gpu" and len(values) == topo.size("gpu"):
                rmax = _group_reduce(values, topo.gpu_rack, len(topo.racks), np.fmax, -np.inf)
                for r, rack in enumerate(topo.racks):
                    if np.isfinite(rmax[r]):
                        f_rack.add_metric([topo.cluster, name, rack], float(rmax[r]))
        yield f_est
        yield f_rack

    def _incidents(self, snap: StoreSnapshot) -> Iterator[Metric]:
        cluster = snap.topology.cluster
        f_open = _family(f"{NS}_incidents_open")
        f_mem = _family(f"{NS}_incident_members")
        f_pred = _family(f"{NS}_incident_predicted_members")
        f_slow = _family(f"{NS}_job_predicted_slowdown_ratio")
        f_risk = _family(f"{NS}_job_gpus_at_risk")
        by_kind: dict[str, int] = {}
        slowdown: dict[str, float] = {}
        for inc in snap.incidents:
            by_kind[inc.root_kind] = by_kind.get(inc.root_kind, 0) + 1
            f_mem.add_metric([cluster, inc.incident_id, inc.root_kind, inc.root_entity, inc.state], float(len(inc.members)))
            f_pred.add_metric([cluster, inc.incident_id, inc.root_kind, inc.root_entity], float(len(inc.predicted_members)))
            for job, ratio in inc.jobs:
                slowdown[job] = max(slowdown.get(job, 1.0), float(ratio))
        for kind, n in sorted(by_kind.items()):
            f_open.add_metric([cluster, kind], float(n))
        topo = snap.topology
        job_gpus = np.bincount(topo.gpu_job[topo.gpu_job >= 0], minlength=len(topo.jobs))
        job_slot = {name: j for j, name in enumerate(topo.jobs)}
        for job, factor in sorted(slowdown.items()):
            # incidents carry a step-time factor (1.25 = 25% slower); the metric is the extra fraction
            f_slow.add_metric([cluster, job], max(factor - 1.0, 0.0))
            # a synchronous job's GPUs all wait for its slowest member: the share of its GPU-hours
            # lost is 1 - 1/factor (all of them when it cannot step), from its worst incident — two
            # incidents on one job do not add, the slower one sets the pace
            gpus = float(job_gpus[job_slot[job]]) if job in job_slot else 0.0
            f_risk.add_metric([cluster, job], gpus * facts.lost_share(factor))
        yield from (f_open, f_mem, f_pred, f_slow, f_risk)

    # ---- the pipeline itself ---------------------------------------------------------------
    def _pipeline(self, snap: StoreSnapshot) -> Iterator[Metric]:
        cluster = snap.topology.cluster
        yield _counts(f"{NS}_samples_processed_total", cluster, snap.samples)
        yield _counts(f"{NS}_findings_total", cluster, snap.findings)
        yield _counts(f"{NS}_input_problems_total", cluster, snap.problems)
        f = _family(f"{NS}_dead_letters_total")
        f.add_metric([cluster], float(snap.dead_letters))
        yield f
        yield from _source_counts(self.store.health, cluster)
        g = _family(f"{NS}_ingest_lag_seconds")
        g.add_metric([cluster], snap.ingest_lag_s)
        yield g
        g = _family(f"{NS}_consumer_lag_records")
        for (topic, partition), records in sorted(snap.consumer_lag.items()):
            g.add_metric([cluster, topic, str(partition)], float(records))
        yield g
        g = _family(f"{NS}_last_telemetry_timestamp_seconds")
        if math.isfinite(snap.newest_ts):
            g.add_metric([cluster], snap.newest_ts)
        yield g
        h = _family(f"{NS}_detector_latency_seconds")
        cumulative = np.cumsum(snap.latency_counts)
        buckets = [(_bound(b), float(c)) for b, c in zip(LATENCY_BUCKETS, cumulative)]
        buckets.append(("+Inf", float(cumulative[-1])))
        h.add_metric([cluster], buckets, snap.latency_sum)  # type: ignore[attr-defined]
        yield h


def _counts(name: str, cluster: str, counts: Mapping[Any, int]) -> Metric:
    """A counter family with one series per key of ``counts`` (a label value, or a tuple of
    them after ``cluster``), in key order."""
    family = _family(name)
    for key, n in sorted(counts.items()):
        family.add_metric([cluster, *(key if isinstance(key, tuple) else (key,))], float(n))
    return family  # type: ignore[no-any-return]


def _source_counts(health: PipelineHealth, cluster: str) -> Iterator[Metric]:
    """What a process's live sources count beside their samples, by stage: the polls they
    skipped, the changes of the topology they derive, and the GPU boards they found replaced or
    moved. A pipeline's collector and an ingest agent's alike: in a Kafka deployment the polled
    source runs in the agent, and only the agent's /metrics has its counts. And a Kafka worker's
    records left to their partition's owner after a rebalance."""
    yield _counts(f"{NS}_polls_skipped_total", cluster, health.skipped())
    yield _counts(f"{NS}_topology_changes_total", cluster, health.changes())
    yield _counts(f"{NS}_gpus_replaced_total", cluster, health.replacements())
    yield _counts(f"{NS}_gpus_moved_total", cluster, health.moves())
    yield _counts(f"{NS}_records_not_assigned_total", cluster, health.unassigned())


def _hottest(values: np.ndarray, k: int) -> np.ndarray:
    """Slots of the ``k`` largest non-NaN values (ties by slot)."""
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    valid = np.flatnonzero(~np.isnan(values))
    return valid[np.argsort(-values[valid], kind="stable")[:k]]


def _bound(b: float) -> str:
    return repr(float(b))


def _values(labels: dict[str, str], keys: tuple[str, ...]) -> list[str]:
    return [labels.get(k, "") for k in keys]


def _group_mean(values: np.ndarray, groups: np.ndarray, n: int) -> np.ndarray:
    """Mean of the finite values per group; NaN for a group without one."""
    ok = np.isfinite(values)
    total = np.bincount(groups[ok], weights=values[ok], minlength=n)
    count = np.bincount(groups[ok], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _group_reduce(values: np.ndarray, groups: np.ndarray, n: int, op: np.ufunc, init: float) -> np.ndarray:
    out = np.full(n, init)
    op.at(out, groups, np.where(np.isnan(values), init, values))
    out[~np.isfinite(out)] = np.nan
    return out


class HealthCollector(Collector):
    """The counters of a process that reads sources but detects nothing (an ingest agent): the
    samples it read, by kind (``foreshock_agent_samples_read_total``: the workers count the same
    samples again as processed, so the two are kept apart), and its input problems, named as the
    workers name theirs (distinct problems: they add up), so ``ForeshockInputProblems`` covers a
    BMC that stopped answering an agent; and its sources' own counts (:func:`_source_counts`:
    the GPU boards its polled source found replaced or moved, by stage)."""

    def __init__(self, health: PipelineHealth, cluster: Callable[[], str]) -> None:
        self.health = health
        self.cluster = cluster  # a callable: a source may learn its topology (and cluster) at its first poll

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        samples, problems = self.health.counts()
        cluster = self.cluster()
        yield _counts(f"{NS}_agent_samples_read_total", cluster, samples)
        yield _counts(f"{NS}_input_problems_total", cluster, problems)
        yield from _source_counts(self.health, cluster)


class MetricsPortError(OSError):
    """``/metrics`` could not be served: the port is taken (or not this user's to bind), or the
    address does not resolve or is not this host's (``bad_address``). The message names which;
    commands turn it into a usage error naming the option at fault rather than a traceback."""

    bad_address = False

    def usage(self, port_option: str, host_option: str | None = None, node_option: str | None = None) -> str:
        """What a command says: a port at fault names ``port_option``; an address at fault names
        ``host_option`` (by default the port option's name with "host" for "port": ``--port`` ->
        ``--host``, ``--metrics-port`` -> ``--metrics-host``) and, where the command takes one,
        the ``node_option`` a user giving a node's name there meant (``watch --host node7``)."""
        if not self.bad_address:
            return f"{self.strerror}; choose another {port_option} (0 serves none)"
        host_option = host_option or port_option.replace("port", "host")
        node = f"; a node's name goes to {node_option}" if node_option else ""
        return (f"{self.strerror}; check {host_option}, the address of this machine that /metrics binds to "
                f"(127.0.0.1 by default, 0.0.0.0 for all its addresses){node}")


# the address, not the port, is at fault: a name that does not resolve (socket.gaierror), an
# address of another machine, or one of a family this host does not have
_ADDRESS_ERRNOS = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)


def _start(registry: CollectorRegistry, host: str, port: int):  # type: ignore[no-untyped-def]
    try:
        return start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        error = MetricsPortError(exc.errno, f"cannot serve /metrics on {host}:{port}: {exc.strerror or exc}")
        error.bad_address = isinstance(exc, socket.gaierror) or exc.errno in _ADDRESS_ERRNOS
        raise error from None


def serve_health(health: PipelineHealth, cluster: Callable[[], str], host: str = "127.0.0.1",
                 port: int = 9109):  # type: ignore[no-untyped-def]
    """Serve an agent's own counters on ``/metrics`` (loopback by default). Returns (server, thread)."""
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    registry.register(HealthCollector(health, cluster))
    return _start(registry, host, port)


def stop(server: Any) -> None:
    """Stop what :func:`serve` or :func:`serve_health` started (their ``(server, thread)``)."""
    httpd = server[0]
    httpd.shutdown()
    httpd.server_close()


def build_registry(store: FindingStore, top_k: int = 16) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    registry.register(ForeshockCollector(store, top_k=top_k))
    return registry


def serve(store: FindingStore, host: str = "127.0.0.1", port: int = 9108, top_k: int = 16):  # type: ignore[no-untyped-def]
    """Serve ``/metrics`` on host:port (loopback by default). Returns (server, thread)."""
    return _start(build_registry(store, top_k), host, port)
