"""Prometheus exporter: a custom collector over an injected :class:`FindingStore`.

No import-time registration and no global registry: :func:`build_registry` makes a fresh
``CollectorRegistry`` holding one :class:`ForeshockCollector`; :func:`serve` exposes it.

Cardinality is bounded: per-entity series exist only for entities with an active finding plus
the ``top_k`` hottest GPUs; aggregates by rack, cooling loop and job are always exported.
The catalogue below is the one place metric names are defined (the rules and dashboards
generator reads it too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from foreshock.facts import THROTTLE_BITS

from .store import LATENCY_BUCKETS, FindingStore, StoreSnapshot, xid_severity

NS = "foreshock"
GPU_LABELS = ("cluster", "rack", "node", "gpu")


@dataclass(frozen=True)
class MetricSpec:
    name: str
    type: str  # gauge | counter | histogram
    help: str
    labels: tuple[str, ...]


CATALOGUE: tuple[MetricSpec, ...] = (
    # per-GPU telemetry, bounded to flagged GPUs + top K hottest
    MetricSpec(f"{NS}_gpu_temperature_celsius", "gauge", "GPU core temperature (flagged GPUs and the top K hottest)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_memory_temperature_celsius", "gauge", "GPU HBM temperature (flagged GPUs and the top K hottest)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_power_watts", "gauge", "GPU power draw (flagged GPUs and the top K hottest)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_power_limit_watts", "gauge", "GPU enforced power limit (flagged GPUs and the top K hottest)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_sm_clock_hertz", "gauge", "GPU SM clock (flagged GPUs and the top K hottest)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_throttle_reasons", "gauge", "Clock event reason bitmask as NVML reports it (flagged GPUs and the top K hottest)", GPU_LABELS),
    MetricSpec(f"{NS}_gpu_throttle_reason_active", "gauge", "1 when the named clock event reason bit is set (flagged GPUs)", GPU_LABELS + ("reason",)),
    # aggregates, always
    MetricSpec(f"{NS}_rack_gpu_temperature_max_celsius", "gauge", "Hottest GPU core temperature in the rack", ("cluster", "rack")),
    MetricSpec(f"{NS}_rack_gpu_temperature_mean_celsius", "gauge", "Mean GPU core temperature in the rack", ("cluster", "rack")),
    MetricSpec(f"{NS}_rack_gpu_power_watts", "gauge", "Sum of GPU power draw in the rack", ("cluster", "rack")),
    MetricSpec(f"{NS}_rack_inlet_temperature_celsius", "gauge", "Rack inlet (coolant supply) temperature", ("cluster", "rack")),
    MetricSpec(f"{NS}_rack_gpus_throttled", "gauge", "GPUs of the rack with a thermal or power throttle bit set", ("cluster", "rack", "kind")),
    MetricSpec(f"{NS}_job_step_time_seconds", "gauge", "Last synchronous step time of the job", ("cluster", "job")),
    MetricSpec(f"{NS}_gpus_reporting", "gauge", "GPUs that have reported telemetry", ("cluster",)),
    # findings
    MetricSpec(f"{NS}_prediction_eta_seconds", "gauge", "Predicted time until the event, per entity with an active prediction", ("cluster", "event", "entity_kind", "entity", "rack", "detector")),
    MetricSpec(f"{NS}_prediction_confidence_ratio", "gauge", "Confidence of the active prediction (0-1)", ("cluster", "event", "entity_kind", "entity", "rack", "detector")),
    MetricSpec(f"{NS}_predictions_active", "gauge", "Active predictions by event and rack", ("cluster", "event", "rack")),
    MetricSpec(f"{NS}_predictions_raised_total", "counter", "Predictions raised (first prediction per entity and event)", ("cluster", "event")),
    MetricSpec(f"{NS}_anomaly_score", "gauge", "Score of a current anomaly (higher = more anomalous)", ("cluster", "entity_kind", "entity", "field", "detector")),
    MetricSpec(f"{NS}_estimate", "gauge", "Per-entity estimates published by detectors (flagged entities)", ("cluster", "estimate", "entity_kind", "entity")),
    MetricSpec(f"{NS}_estimate_rack_max", "gauge", "Per-rack maximum of each detector estimate", ("cluster", "estimate", "rack")),
    MetricSpec(f"{NS}_incidents_open", "gauge", "Open incidents by root-cause kind", ("cluster", "root_kind")),
    MetricSpec(f"{NS}_incident_members", "gauge", "Members of an open incident", ("cluster", "incident", "root_kind", "root_entity", "state")),
    MetricSpec(f"{NS}_incident_predicted_members", "gauge", "Members an open incident is predicted to reach", ("cluster", "incident", "root_kind", "root_entity")),
    MetricSpec(f"{NS}_job_predicted_slowdown_ratio", "gauge", "Predicted slowdown of a job's synchronous step (1.0 = none)", ("cluster", "job")),
    MetricSpec(f"{NS}_job_gpu_hours_at_risk_per_hour", "gauge", "GPU-hours at risk per hour for a job touched by an incident", ("cluster", "job")),
    MetricSpec(f"{NS}_xid_events_total", "counter", "New XID events seen (changes of the last-XID field)", ("cluster", "xid", "severity")),
    # the pipeline itself
    MetricSpec(f"{NS}_samples_processed_total", "counter", "Telemetry samples processed", ("cluster", "kind")),
    MetricSpec(f"{NS}_findings_total", "counter", "Findings emitted", ("cluster", "type")),
    MetricSpec(f"{NS}_input_problems_total", "counter", "Input problems counted (bad records, NaN, resets, ...)", ("cluster", "stage", "reason")),
    MetricSpec(f"{NS}_dead_letters_total", "counter", "Records sent to the dead-letter topic", ("cluster",)),
    MetricSpec(f"{NS}_ingest_lag_seconds", "gauge", "Seconds from receiving a batch to finishing its detection", ("cluster",)),
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


class ForeshockCollector(Collector):
    def __init__(self, store: FindingStore, top_k: int = 16) -> None:
        self.store = store
        self.top_k = top_k

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families vary with the snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.store.snapshot()
        yield from self._gpu_series(snap)
        yield from self._aggregates(snap)
        yield from self._findings(snap)
        yield from self._pipeline(snap)

    # ---- per-entity ----------------------------------------------------------------------
    def _flagged_gpus(self, snap: StoreSnapshot) -> np.ndarray:
        flagged = {f.slot for f in snap.predictions if f.entity_kind == "gpu"}
        flagged |= {a.slot for a in snap.anomalies if a.entity_kind == "gpu"}
        temp = snap.latest["gpu"]["gpu_temp"]
        if self.top_k > 0 and temp.size:
            valid = np.flatnonzero(~np.isnan(temp))
            hottest = valid[np.argsort(-temp[valid], kind="stable")[: self.top_k]]
            flagged |= set(int(s) for s in hottest)
        return np.array(sorted(flagged), dtype=np.int64)

    def _gpu_series(self, snap: StoreSnapshot) -> Iterator[Metric]:
        topo = snap.topology
        gpus = self._flagged_gpus(snap)
        labels = {int(s): _values(topo.labels("gpu", int(s)), GPU_LABELS) for s in gpus}
        latest = snap.latest["gpu"]
        for name, field in _GPU_FIELDS.items():
            fam = _family(name)
            for s in gpus:
                v = latest[field][s]
                if not math.isnan(v):
                    fam.add_metric(labels[int(s)], float(v))
            yield fam
        fam = _family(f"{NS}_gpu_throttle_reason_active")
        flagged = {f.slot for f in snap.predictions if f.entity_kind == "gpu"}
        for s in gpus:
            mask = latest["throttle_reasons"][s]
            if int(s) not in flagged or math.isnan(mask):
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
        psum = np.bincount(rack_of, weights=np.nan_to_num(power), minlength=n_racks)
        m = np.nan_to_num(mask).astype(np.int64)
        thermal = np.bincount(rack_of, weights=(m & _THERMAL_BITS) != 0, minlength=n_racks)
        power_thr = np.bincount(rack_of, weights=(m & _POWER_BITS) != 0, minlength=n_racks)
        f_max = _family(f"{NS}_rack_gpu_temperature_max_celsius")
        f_mean = _family(f"{NS}_rack_gpu_temperature_mean_celsius")
        f_pow = _family(f"{NS}_rack_gpu_power_watts")
        f_thr = _family(f"{NS}_rack_gpus_throttled")
        for r, rack in enumerate(topo.racks):
            if tcnt[r] == 0:
                continue
            f_max.add_metric([cluster, rack], float(tmax[r]))
            f_mean.add_metric([cluster, rack], float(tsum[r] / tcnt[r]))
            f_pow.add_metric([cluster, rack], float(psum[r]))
            f_thr.add_metric([cluster, rack, "thermal"], float(thermal[r]))
            f_thr.add_metric([cluster, rack, "power"], float(power_thr[r]))
        yield from (f_max, f_mean, f_pow, f_thr)
        f_inlet = _family(f"{NS}_rack_inlet_temperature_celsius")
        for r, v in enumerate(snap.latest["rack"]["inlet_temp"]):
            if not math.isnan(v):
                f_inlet.add_metric([cluster, topo.racks[r]], float(v))
        yield f_inlet
        f_step = _family(f"{NS}_job_step_time_seconds")
        for j, v in enumerate(snap.latest["job"]["step_time"]):
            if not math.isnan(v):
                f_step.add_metric([cluster, topo.jobs[j]], float(v))
        yield f_step
        f_rep = _family(f"{NS}_gpus_reporting")
        f_rep.add_metric([cluster], float(snap.seen["gpu"].sum()))
        yield f_rep

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
            # the ETA counts down in telemetry time from when it was made
            eta = max(0.0, p.eta_s - max(0.0, snap.last_ts - p.ts)) if math.isfinite(snap.last_ts) else p.eta_s
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
        f_xid = _family(f"{NS}_xid_events_total")
        for code, n in sorted(snap.xids.items()):
            f_xid.add_metric([cluster, str(code), xid_severity(code)], float(n))
        yield f_xid

    def _estimates(self, snap: StoreSnapshot) -> Iterator[Metric]:
        topo = snap.topology
        f_est = _family(f"{NS}_estimate")
        f_rack = _family(f"{NS}_estimate_rack_max")
        flagged: dict[str, set[int]] = {}
        for f in list(snap.predictions) + list(snap.anomalies):
            flagged.setdefault(f.entity_kind, set()).add(f.slot)
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
        f_risk = _family(f"{NS}_job_gpu_hours_at_risk_per_hour")
        by_kind: dict[str, int] = {}
        slowdown: dict[str, float] = {}
        risk: dict[str, float] = {}
        for inc in snap.incidents:
            by_kind[inc.root_kind] = by_kind.get(inc.root_kind, 0) + 1
            f_mem.add_metric([cluster, inc.incident_id, inc.root_kind, inc.root_entity, inc.state], float(len(inc.members)))
            f_pred.add_metric([cluster, inc.incident_id, inc.root_kind, inc.root_entity], float(len(inc.predicted_members)))
            for job, ratio in inc.jobs:
                slowdown[job] = max(slowdown.get(job, 1.0), float(ratio))
                share = inc.gpu_hours_at_risk_per_hour / max(len(inc.jobs), 1)
                risk[job] = risk.get(job, 0.0) + share
        for kind, n in sorted(by_kind.items()):
            f_open.add_metric([cluster, kind], float(n))
        for job, ratio in sorted(slowdown.items()):
            f_slow.add_metric([cluster, job], ratio)
        for job, r in sorted(risk.items()):
            f_risk.add_metric([cluster, job], r)
        yield from (f_open, f_mem, f_pred, f_slow, f_risk)

    # ---- the pipeline itself ---------------------------------------------------------------
    def _pipeline(self, snap: StoreSnapshot) -> Iterator[Metric]:
        cluster = snap.topology.cluster
        f = _family(f"{NS}_samples_processed_total")
        for kind, n in sorted(snap.samples.items()):
            f.add_metric([cluster, kind], float(n))
        yield f
        f = _family(f"{NS}_findings_total")
        for kind, n in sorted(snap.findings.items()):
            f.add_metric([cluster, kind], float(n))
        yield f
        f = _family(f"{NS}_input_problems_total")
        for (stage, reason), n in sorted(snap.problems.items()):
            f.add_metric([cluster, stage, reason], float(n))
        yield f
        f = _family(f"{NS}_dead_letters_total")
        f.add_metric([cluster], float(snap.dead_letters))
        yield f
        g = _family(f"{NS}_ingest_lag_seconds")
        g.add_metric([cluster], snap.ingest_lag_s)
        yield g
        g = _family(f"{NS}_last_telemetry_timestamp_seconds")
        if math.isfinite(snap.last_ts):
            g.add_metric([cluster], snap.last_ts)
        yield g
        h = _family(f"{NS}_detector_latency_seconds")
        cumulative = np.cumsum(snap.latency_counts)
        buckets = [(_bound(b), float(c)) for b, c in zip(LATENCY_BUCKETS, cumulative)]
        buckets.append(("+Inf", float(cumulative[-1])))
        h.add_metric([cluster], buckets, snap.latency_sum)  # type: ignore[attr-defined]
        yield h


def _bound(b: float) -> str:
    return repr(float(b))


def _values(labels: dict[str, str], keys: tuple[str, ...]) -> list[str]:
    return [labels.get(k, "") for k in keys]


def _group_reduce(values: np.ndarray, groups: np.ndarray, n: int, op: np.ufunc, init: float) -> np.ndarray:
    out = np.full(n, init)
    op.at(out, groups, np.where(np.isnan(values), init, values))
    out[~np.isfinite(out)] = np.nan
    return out


def build_registry(store: FindingStore, top_k: int = 16) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ForeshockCollector(store, top_k=top_k))
    return registry


def serve(store: FindingStore, host: str = "127.0.0.1", port: int = 9108, top_k: int = 16):  # type: ignore[no-untyped-def]
    """Serve ``/metrics`` on host:port (loopback by default). Returns (server, thread)."""
    return start_http_server(port, addr=host, registry=build_registry(store, top_k))
