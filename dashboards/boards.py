"""foreshock's five Grafana dashboards, as code.

Each function returns a :class:`~foreshock.dashboards.grafana.Dashboard` with a stable UID.
Panels query foreshock's own series (per-entity series exist for flagged entities and the top
K; rack/leaf/job aggregates always) and the recording rules from
:mod:`foreshock.dashboards.rules`. Variables are regex-matched (``=~``) everywhere so "All"
(``.*``) and multi-selections work in every query.
"""

from __future__ import annotations

from typing import Any

from foreshock.facts import THROTTLE_BITS

from .config import DEFAULT_CONFIG, MixinConfig
from .grafana import (Dashboard, Panel, Target, Variable, dashed, heatmap, right_axis, stat, state_timeline, table,
                      timeseries)
from .rules import THERMAL_HEADROOM

UIDS = {
    "fleet": "foreshock-fleet",
    "gpu": "foreshock-gpu",
    "fabric": "foreshock-fabric",
    "incidents": "foreshock-incidents",
    "pipeline": "foreshock-pipeline",
}

C = 'cluster=~"$cluster"'
CR = 'cluster=~"$cluster", rack=~"$rack"'
GPU = 'cluster=~"$cluster", rack=~"$rack", node=~"$node", gpu=~"$gpu"'
# a GPU's findings name it by entity; the rack is matched too because the node and GPU variables
# match everything (``.*``) when All is chosen, which drops the rack they were chosen within
GPU_ENTITY = 'cluster=~"$cluster", rack=~"$rack", entity_kind="gpu", entity=~"($node)/gpu($gpu)"'

CLUSTER = Variable("cluster", "Cluster", "label_values(foreshock_gpus_reporting, cluster)")
RACK = Variable("rack", "Rack", f"label_values(foreshock_rack_gpu_temperature_max_celsius{{{C}}}, rack)")
NODE = Variable("node", "Node", f"label_values(foreshock_gpu_temperature_celsius{{{CR}}}, node)")
GPU_VAR = Variable("gpu", "GPU", f'label_values(foreshock_gpu_temperature_celsius{{{CR}, node=~"$node"}}, gpu)')
LEAF = Variable("leaf", "Leaf switch", f"label_values(foreshock_leaf_links_down{{{C}}}, leaf)")
TRAINING_JOB = Variable("training_job", "Training job",
                        f"label_values(foreshock_job_step_time_seconds{{{C}}}, training_job)")

def RED_ABOVE(limit: float) -> list[tuple[float | None, str]]:  # noqa: N802 (reads as a constant)
    return [(None, "green"), (limit, "red")]


def _headroom_colours(cfg: MixinConfig, above: str) -> list[tuple[float | None, str]]:
    """Red at or over a GPU's own limit (0 °C left or less), orange within ``headroom_warning_c`` of
    it, ``above`` beyond. Grafana colours a value by the highest step at or below it, so the steps
    sit a hundredth of a degree (finer than any sensor reads) above 0 and above the warning."""
    just_above = 0.01
    return [(None, "red"), (just_above, "orange"), (cfg.headroom_warning_c + just_above, above)]


def _link(uid: str, title: str, params: str) -> dict[str, str]:
    """A data link to dashboard ``uid`` that keeps the time range and the chosen datasource."""
    return {"title": title, "url": f"/d/{uid}?{params}&${{datasource:queryparam}}&${{__url_time_range}}"}


def _with_node_and_gpu(expr: str) -> str:
    """``expr`` with ``node`` and ``gpu`` labels taken from a GPU ``entity`` ("node0/gpu3"), for links
    to the GPU detail dashboard (its variables); series of other entities are left as they are."""
    expr = f'label_replace({expr}, "node", "$1", "entity", "(.+)/gpu[0-9]+")'
    return f'label_replace({expr}, "gpu", "$1", "entity", ".+/gpu([0-9]+)")'


def fleet(cfg: MixinConfig) -> Dashboard:
    throttle = "|".join(cfg.throttle_events)
    to_gpu = _link(UIDS["gpu"], "GPU detail",
                   "var-cluster=${__data.fields.cluster}&var-rack=${__data.fields.rack}"
                   "&var-node=${__data.fields.node}&var-gpu=${__data.fields.gpu}")
    return Dashboard(
        UIDS["fleet"], "foreshock / Fleet overview",
        "What will throttle or fail next, where the heat is, and what is already open.",
        [
            # GPUs, not predictions: one GPU can be predicted both to throttle thermally and to
            # meet its power cap as it cools (detectors/power.py), and each detector run beside
            # another adds its own; the ETA series are one per prediction and GPU, never capped
            stat("Predicted throttles", Target(
                f'count(count by (cluster, entity) (foreshock_prediction_eta_seconds{{{C}, entity_kind="gpu", '
                f'event=~"{throttle}"}}))'),
                no_value="0", thresholds=RED_ABOVE(1),
                description="GPUs foreshock predicts will throttle (thermal, power cap, power brake)."),
            stat("Open incidents", Target(f"sum(foreshock_incidents_open{{{C}}})"), no_value="0",
                 thresholds=RED_ABOVE(1)),
            stat("GPUs reporting", Target(f"sum(cluster:foreshock_gpus_reporting:sum{{{C}}})"),
                 thresholds=[(None, "blue")]),
            stat("Least thermal headroom", Target(f"min({THERMAL_HEADROOM}{{{C}}})"),
                 unit="celsius", thresholds=_headroom_colours(cfg, "green"),
                 description="The smallest distance from a GPU's core or HBM temperature to its own max "
                             "operating temperature (as the GPU reports it, else "
                             f"{cfg.max_operating_c:g} °C core and {cfg.hbm_max_operating_c:g} °C HBM): "
                             "red at or over a limit, orange within "
                             f"{cfg.headroom_warning_c:g} °C. Over the GPUs exported one by one (flagged, "
                             "the hottest by core and by HBM, HBM near its limit); the ranking by GPU below "
                             "names them."),
            "Predictions",
            timeseries("Active predictions by event", Target(
                f"sum by (event) (cluster:foreshock_predictions_active:sum{{{C}}})", "{{event}}"),
                description="Entities with an active foreshock prediction, by predicted event."),
            timeseries("Active predictions by rack", Target(
                f"sum by (rack, event) (foreshock_predictions_active{{{CR}}})", "{{rack}} {{event}}")),
            table("Active predictions (soonest first)", Target(
                f"sort({_with_node_and_gpu(f'foreshock_prediction_eta_seconds{{{C}}}')})", instant=True, table=True),
                unit="s", links=[to_gpu],
                description="Each active prediction with its ETA; click a row for the GPU detail dashboard."),
            "Heat by rack",
            heatmap("Hottest GPU temperature by rack", Target(
                f"max by (rack) (foreshock_rack_gpu_temperature_max_celsius{{{CR}}})", "{{rack}}"),
                unit="celsius", width=12, height=9),
            heatmap("Thermal resistance by rack", Target(
                f"max by (rack) (foreshock_rack_thermal_resistance_celsius_per_watt{{{CR}}})", "{{rack}}"),
                unit="none", width=12, height=9,
                description="Mean die-to-coolant thermal resistance (°C/W) of the rack's GPUs: it rises when "
                            "cooling degrades, before temperatures do."),
            timeseries("Least thermal headroom by GPU", Target(
                f"bottomk(10, {THERMAL_HEADROOM}{{{CR}}})", "{{node}}/gpu{{gpu}} {{sensor}}"),
                unit="celsius", thresholds=_headroom_colours(cfg, "transparent"), threshold_lines=True,
                options={"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                         "tooltip": {"mode": "multi", "sort": "asc"}},
                description="The ten GPU core or HBM temperatures nearest their own max operating "
                            "temperature, ranked by what is left (°C), not by how hot they are: an 85 °C "
                            "part at 84 °C (1 °C left) comes before a 105 °C part at 90 °C (15 °C left)."),
            timeseries("Rack inlet temperature", Target(
                f"foreshock_rack_inlet_temperature_celsius{{{CR}}}", "{{rack}}"), unit="celsius"),
            timeseries("Coolant flow by rack", Target(
                f"foreshock_rack_coolant_flow_liters_per_second{{{CR}}}", "{{rack}}"), min=0,
                description="Litres per second through each rack: a loop losing flow shows here first."),
            timeseries("Slowest chassis fan by node", Target(
                f"bottomk(10, min by (node) (foreshock_node_fan_speed_ratio{{{CR}}}))", "{{node}}"),
                unit="percentunit", min=0,
                description="Each node's slowest chassis fan, the ten slowest nodes: 0 is a stopped fan "
                            "(ForeshockFanStopped), whose node's GPUs lose airflow."),
            timeseries("Cooling loops: hottest GPU and mean inlet", Target(
                f"foreshock_loop_gpu_temperature_max_celsius{{{C}}}", "{{cooling_loop}} hottest GPU"),
                Target(f"foreshock_loop_inlet_temperature_celsius{{{C}}}", "{{cooling_loop}} inlet"),
                unit="celsius"),
            timeseries("GPU power by rack", Target(
                f"sum by (rack) (foreshock_rack_gpu_power_watts{{{CR}}})", "{{rack}}"), unit="watt"),
            timeseries("Throttled GPUs by rack", Target(
                f"sum by (rack, kind) (foreshock_rack_gpus_throttled{{{CR}}})", "{{rack}} {{kind}}"),
                description="GPUs with a thermal or power throttle bit set now (after the fact)."),
            timeseries("New XIDs by severity (1h)", Target(
                f"sum by (severity) (cluster:foreshock_xid_events:increase1h{{{C}}})", "{{severity}}")),
        ],
        [CLUSTER, RACK],
    )


def gpu_detail(cfg: MixinConfig) -> Dashboard:
    thermal = "thermal_throttle|hbm_overheat"  # the events a temperature runs into
    reasons = [{"type": "value", "options": {"0": {"text": "off", "color": "transparent"},
                                             "1": {"text": "on", "color": "red"}}}]
    return Dashboard(
        UIDS["gpu"], "foreshock / GPU detail",
        "One GPU (or a few): temperature against the predicted time to throttle, power against its "
        "limit, and the decoded throttle reasons.",
        [
            # each GPU's own limits as series (D, E), not fixed lines: a part whose HBM limit is
            # 85 °C, or whose core limit is not 87 °C, is drawn against the limit it throttles at
            timeseries("Temperature vs predicted time to throttle",
                       Target(f"foreshock_gpu_temperature_celsius{{{GPU}}}", "{{node}}/gpu{{gpu}} core"),
                       Target(f"foreshock_gpu_memory_temperature_celsius{{{GPU}}}", "{{node}}/gpu{{gpu}} HBM"),
                       Target(f'foreshock_prediction_eta_seconds{{{GPU_ENTITY}, event=~"{thermal}"}}',
                              "{{entity}} {{event}} ETA"),
                       Target(f"foreshock_gpu_max_operating_temperature_celsius{{{GPU}}}",
                              "{{node}}/gpu{{gpu}} core limit"),
                       Target(f"foreshock_gpu_memory_max_operating_temperature_celsius{{{GPU}}}",
                              "{{node}}/gpu{{gpu}} HBM limit"),
                       unit="celsius",
                       overrides=[right_axis("C", "s", min=0), dashed("D"), dashed("E")],
                       description="Core and HBM temperature (left) with each GPU's own max operating "
                                   "temperatures (dashed: as the GPU reports them, else "
                                   f"{cfg.max_operating_c:g} °C core and {cfg.hbm_max_operating_c:g} °C HBM), "
                                   "against the predicted time to a thermal event (right, counting down)."),
            timeseries("Predicted time to event", Target(
                f"foreshock_prediction_eta_seconds{{{GPU_ENTITY}}}", "{{entity}} {{event}}"),
                unit="s", min=0,
                description="Counts down in telemetry time while a prediction holds; gone when withdrawn."),
            timeseries("Power vs limit", Target(f"foreshock_gpu_power_watts{{{GPU}}}", "{{node}}/gpu{{gpu}} draw"),
                       Target(f"foreshock_gpu_power_limit_watts{{{GPU}}}", "{{node}}/gpu{{gpu}} limit"),
                       unit="watt"),
            timeseries("Prediction confidence", Target(
                f"foreshock_prediction_confidence_ratio{{{GPU_ENTITY}}}", "{{entity}} {{event}}"),
                unit="percentunit", min=0, max=1),
            state_timeline("Throttle reasons (decoded)", Target(
                f'max by (node, gpu, reason) (gpu:foreshock_gpu_throttle_reason:bit{{{GPU}, '
                f'reason=~"{"|".join(r for r in THROTTLE_BITS if r not in ("idle", "display_clocks"))}"}})',
                "{{node}}/gpu{{gpu}} {{reason}}"),
                mappings=reasons, width=24, height=9,
                description="Each NVML clock-event reason bit, decoded from the bitmask with floor(x/2^k)%2."),
            timeseries("SM clock", Target(f"foreshock_gpu_sm_clock_hertz{{{GPU}}}", "{{node}}/gpu{{gpu}}"),
                       unit="hertz"),
            # anomaly scores carry no rack label: the GPUs chosen are those whose temperature series
            # the board's own selector picks, their "node/gpuN" entity joined from node and gpu
            timeseries("Anomaly scores", Target(
                f'foreshock_anomaly_score{{cluster=~"$cluster", entity_kind="gpu", entity=~"($node)/gpu($gpu)"}} '
                f'and on (cluster, entity) label_join(foreshock_gpu_temperature_celsius{{{GPU}}}, '
                f'"entity", "/gpu", "node", "gpu")',
                "{{entity}} {{field}} ({{detector}})")),
            timeseries("Thermal resistance", Target(
                f"foreshock_gpu_thermal_resistance_celsius_per_watt{{{GPU}}}", "{{node}}/gpu{{gpu}}"),
                description="Die-to-coolant thermal resistance (°C/W) estimated online."),
        ],
        [CLUSTER, RACK, NODE, GPU_VAR],
    )


def fabric(cfg: MixinConfig) -> Dashboard:
    CL = 'cluster=~"$cluster", leaf=~"$leaf"'
    return Dashboard(
        UIDS["fabric"], "foreshock / Fabric & optics",
        "Congestion, optics health trends and predicted link failures, by leaf switch.",
        [
            table("Predicted link failures", Target(
                f'sort(foreshock_prediction_eta_seconds{{{C}, event="link_down"}})', instant=True, table=True),
                unit="s"),
            timeseries("Congestion: xmit_wait by leaf", Target(
                f"sum by (leaf) (rate(foreshock_leaf_xmit_wait_ticks_total{{{CL}}}[$__rate_interval]))", "{{leaf}}"),
                description="Ticks per second with data queued and none sent, summed over the leaf's links."),
            timeseries("Links down by leaf", Target(f"sum by (leaf) (foreshock_leaf_links_down{{{CL}}})", "{{leaf}}"),
                       min=0),
            timeseries("Weakest RX power by leaf", Target(
                f"min by (leaf) (foreshock_leaf_optic_rx_power_min_dbm{{{CL}}})", "{{leaf}}"), unit="dBm"),
            timeseries("Worst pre-FEC BER by leaf", Target(
                f"max by (leaf) (foreshock_leaf_optic_prefec_ber_max_ratio{{{CL}}})", "{{leaf}}"),
                custom={"scaleDistribution": {"type": "log", "log": 10}}, unit="sci"),
            timeseries("Flagged optics: RX power", Target(
                f"foreshock_optic_rx_power_dbm{{{C}}}", "{{link}}#{{end}}"), unit="dBm"),
            timeseries("Flagged optics: pre-FEC BER", Target(
                f"foreshock_optic_prefec_ber_ratio{{{C}}}", "{{link}}#{{end}}"),
                custom={"scaleDistribution": {"type": "log", "log": 10}}, unit="sci"),
            timeseries("Link and optic anomaly scores", Target(
                f'foreshock_anomaly_score{{{C}, entity_kind=~"link|optic"}}', "{{entity}} {{field}}"), width=24),
        ],
        [CLUSTER, LEAF],
    )


def incidents(cfg: MixinConfig) -> Dashboard:
    CJ = 'cluster=~"$cluster", training_job=~"$training_job"'
    return Dashboard(
        UIDS["incidents"], "foreshock / Incidents & jobs",
        "Findings grouped under root causes, where they will spread, and what they cost training jobs.",
        [
            timeseries("Open incidents by root-cause kind", Target(
                f"sum by (root_kind) (foreshock_incidents_open{{{C}}})", "{{root_kind}}"), min=0),
            timeseries("Incident size: members and predicted members", Target(
                f"foreshock_incident_members{{{C}}}", "{{incident}} members"),
                Target(f"foreshock_incident_predicted_members{{{C}}}", "{{incident}} predicted")),
            table("Open incidents", Target(f"foreshock_incident_members{{{C}}}", instant=True, table=True)),
            timeseries("Predicted step slowdown by job", Target(
                f"foreshock_job_predicted_slowdown_ratio{{{CJ}}}", "{{training_job}}"),
                unit="percentunit", min=0,
                thresholds=[(None, "transparent"), (cfg.job_slowdown_ratio, "red")], threshold_lines=True,
                description="Predicted extra synchronous step time as a fraction of the normal step "
                            "(0 = no slowdown); the line is the alert threshold."),
            timeseries("Step time by job", Target(f"foreshock_job_step_time_seconds{{{CJ}}}", "{{training_job}}"),
                       unit="s"),
            timeseries("GPU-hours at risk per hour", Target(
                f"foreshock_job_gpus_at_risk{{{CJ}}}", "{{training_job}}"),
                description="GPUs' worth of the job's time lost to its worst incident: its GPUs × the "
                            "share of their GPU-hours spent waiting for the slowest."),
        ],
        [CLUSTER, TRAINING_JOB],
    )


def pipeline(cfg: MixinConfig) -> Dashboard:
    J = f'job="{cfg.pipeline_job}"'
    return Dashboard(
        UIDS["pipeline"], "foreshock / Pipeline health",
        "Is foreshock itself healthy: targets up, throughput, bad input, lag and detector latency.",
        [
            stat("Targets up", Target(f"sum(up{{{J}}})"), thresholds=[(None, "red"), (1, "green")]),
            stat("Samples/s", Target(f"sum(cluster:foreshock_samples_processed:rate5m{{{C}}})"), unit="short"),
            stat("Input problems/s", Target(f"sum(cluster:foreshock_input_problems:rate5m{{{C}}})"),
                 no_value="0", thresholds=RED_ABOVE(0.001)),
            stat("Ingest lag", Target(f"max(foreshock_ingest_lag_seconds{{{C}}})"), unit="s",
                 thresholds=RED_ABOVE(cfg.ingest_lag_s)),
            timeseries("Samples processed by kind", Target(
                f"sum by (kind) (rate(foreshock_samples_processed_total{{{C}}}[$__rate_interval]))", "{{kind}}"),
                unit="short"),
            timeseries("Findings by type", Target(
                f"sum by (type) (rate(foreshock_findings_total{{{C}}}[$__rate_interval]))", "{{type}}")),
            timeseries("Input problems by stage and reason", Target(
                f"sum by (stage, reason) (rate(foreshock_input_problems_total{{{C}}}[$__rate_interval]))",
                "{{stage}} {{reason}}")),
            timeseries("Polls skipped by stage", Target(
                # "or vector(0)": a pipeline that polls nothing (a replay, a Kafka worker) skips nothing
                f"sum by (stage) (rate(foreshock_polls_skipped_total{{{C}}}[$__rate_interval])) or on() vector(0)",
                "{{stage}}"),
                description="Polls a live source skipped: a poll, or the pipeline behind it, took longer than the "
                            "poll interval. Each is a sample never read."),
            timeseries("Dead letters", Target(
                f"sum by (instance) (rate(foreshock_dead_letters_total{{{C}}}[$__rate_interval]))", "{{instance}}")),
            timeseries("Detector latency per batch", Target(
                f"instance:foreshock_detector_latency_seconds:histogram_quantile_rate5m{{{C}}}",
                "{{instance}} p{{quantile}}"), unit="s"),
            timeseries("Ingest lag", Target(f"foreshock_ingest_lag_seconds{{{C}}}", "{{instance}}"), unit="s",
                       thresholds=[(None, "transparent"), (cfg.ingest_lag_s, "red")], threshold_lines=True),
            timeseries("Kafka consumer lag", Target(
                # "or vector(0)": a pipeline without Kafka (demo, watch, replay) has nothing waiting
                f"max by (topic, partition) (foreshock_consumer_lag_records{{{C}}}) or on() vector(0)",
                "{{topic}} {{partition}}"),
                unit="short",
                description="Records of each partition a worker has not processed yet (the partition's high "
                            "watermark less the worker's next offset): clock-free, where the ingest lag reads the "
                            "agents' send stamps. Rising: the workers fall behind; after a restart it falls by "
                            "itself as a worker works through the records after its last checkpoint. 0 without "
                            "Kafka workers."),
            timeseries("Telemetry time behind wall clock", Target(
                f"time() - foreshock_last_telemetry_timestamp_seconds{{{C}}}", "{{instance}}"), unit="s",
                description="Large during replays of old recordings; in live mode it is the end-to-end delay."),
            timeseries("Scrape duration", Target(f"scrape_duration_seconds{{{J}}}", "{{instance}}"), unit="s"),
        ],
        [CLUSTER],
    )


BOARDS = {"fleet": fleet, "gpu": gpu_detail, "fabric": fabric, "incidents": incidents, "pipeline": pipeline}


def dashboards(cfg: MixinConfig = DEFAULT_CONFIG) -> dict[str, dict[str, Any]]:
    """Every dashboard's JSON, keyed by its short name."""
    return {name: build(cfg).json(cfg.datasource_uid, cfg.refresh, cfg.time_from, cfg.dashboard_tag)
            for name, build in BOARDS.items()}


__all__ = ["BOARDS", "UIDS", "dashboards", "Panel"]
