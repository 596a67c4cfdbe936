"""Prometheus recording and alerting rules, generated from :class:`MixinConfig`.

Rules for a pitfall-free pack (see FACTS.md, "Alerts and dashboards that exist today"):

- no cumulative counter is compared with a constant: counters go through ``increase``/``rate``,
  and a counter series that is *born* inside the window (``increase`` cannot see its first
  sample) is told by its created timestamp (:func:`created_within`), never by its absence
  ``offset`` the window ago (which is also the absence of an old series Prometheus did not scrape
  then: after a restart or an outage);
- XIDs are foreshock's count of *new* XIDs, never the latching last-XID gauge;
- throttle-reason bits are decoded with ``floor(x / 2^k) % 2``, never ``x >= 128``;
- every alert has ``for``, ``labels.severity`` and ``summary``/``description``/``runbook_url``
  (an anchor in ``docs/runbooks.md``: the alert name in lower case);
- recording rules are named ``level:metric:operations``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from foreshock.facts import THROTTLE_BITS

from .config import DEFAULT_CONFIG, MixinConfig

ALERT_GROUP = "foreshock.alerts"
RECORDING_GROUP = "foreshock.rules"
XID_COUNTER = "foreshock_xid_events_total"
RACK_FLOW = "rack:foreshock_rack_coolant_flow_liters_per_second:max"
"""Each rack's coolant flow (L/s) without the exporting instance, as :data:`RACK_RESISTANCE`."""
RACK_RESISTANCE = "rack:foreshock_rack_thermal_resistance_celsius_per_watt:max"
"""Each rack's die-to-coolant thermal resistance (°C/W) without the exporting instance: in Kafka
mode a rebalance moves a rack to another worker, whose series is a new one; the rack's own is
this, continuous across the move."""
THERMAL_HEADROOM = "gpu:foreshock_gpu_thermal_headroom_celsius:own_limit"
"""Each exported GPU's own max operating temperature less its temperature (°C), one series per
``sensor`` ("core", "hbm"): 0 or below is at or over its limit."""


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    severity: str
    summary: str
    description: str

    def rule(self, cfg: MixinConfig, for_: str) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": f"{cfg.runbook_url}#{self.name.lower()}",
            },
        }


def _bit_index(mask: int) -> int:
    if mask <= 0 or mask & (mask - 1):
        raise ValueError(f"not a single bit: {mask:#x}")
    return mask.bit_length() - 1


def decode_bit(series: str, mask: int) -> str:
    """PromQL that is 1 where ``mask``'s bit is set in the bitmask gauge ``series``, else 0."""
    return f"floor({series} / {2 ** _bit_index(mask)}) % 2"


def _regex(values: tuple[str, ...]) -> str:
    return "|".join(values)


def created_within(counter: str, selector: str, window: str) -> str:
    """PromQL selecting the series of the counter ``counter`` (its ``..._total`` name) that were
    created within ``window`` before now, with their values: by the ``..._created`` series the
    exporter serves beside them (its created timestamp, seconds since the epoch).

    Whether a counter is new cannot be read from its samples: ``x unless x offset 10m`` is also
    true of a counter years old that Prometheus did not scrape 10 minutes ago (Prometheus just
    started, or the target was down longer than the alert's ``for``: every GPU that ever had an
    XID paged). The created timestamp says when the series came into being, whatever Prometheus
    saw (the exporter's: when it first served the series). Requiring instead the target up over
    the whole window would blind the alert for a window after every Prometheus restart: a first
    XID then never paged. (Prometheus ingests ``..._created`` as a series of its own from the text
    and the OpenMetrics formats; with the ``created-timestamp-zero-ingestion`` feature it does not,
    but puts a 0 at that time into the counter itself, so ``increase`` sees the first increment.)"""
    base = counter.removesuffix("_total")
    return (f"({counter}{selector} and {base}_created{selector} "
            f"> time() - {_duration_s(window):g})")


def _duration_s(window: str) -> float:
    """Seconds in a Prometheus duration such as ``10m`` or ``1h30m``."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", window)
    if not parts or "".join(n + u for n, u in parts) != window:
        raise ValueError(f"not a Prometheus duration: {window!r}")
    return sum(int(n) * units[u] for n, u in parts)


def recording_rules(cfg: MixinConfig = DEFAULT_CONFIG) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = [
        {"record": "cluster:foreshock_predictions_active:sum",
         "expr": "sum by (cluster, event) (foreshock_predictions_active)"},
        {"record": "cluster:foreshock_gpus_reporting:sum",
         "expr": "sum by (cluster) (foreshock_gpus_reporting)"},
        {"record": "cluster:foreshock_gpu_temperature_celsius:max",
         "expr": "max by (cluster) (foreshock_rack_gpu_temperature_max_celsius)"},
        {"record": "cluster:foreshock_gpu_power_watts:sum",
         "expr": "sum by (cluster) (foreshock_rack_gpu_power_watts)"},
        # one series per rack, whichever worker serves it (a rebalance changes `instance`; for
        # the moment both workers export it, the higher reading)
        {"record": RACK_RESISTANCE,
         "expr": "max by (cluster, rack) (foreshock_rack_thermal_resistance_celsius_per_watt)"},
        {"record": RACK_FLOW,
         "expr": "max by (cluster, rack) (foreshock_rack_coolant_flow_liters_per_second)"},
        # increase() never sees a series' first sample: the first XID of each code on each GPU
        # (its counter's birth, at 1) is counted by the counter's value where it was created
        # within the hour (everything it holds came in that hour)
        {"record": "cluster:foreshock_xid_events:increase1h",
         "expr": f"sum by (cluster, severity) ({created_within(XID_COUNTER, '', '1h')} "
                 f"or increase({XID_COUNTER}[1h]))"},
        {"record": "cluster:foreshock_samples_processed:rate5m",
         "expr": "sum by (cluster, kind) (rate(foreshock_samples_processed_total[5m]))"},
        {"record": "cluster:foreshock_input_problems:rate5m",
         "expr": "sum by (cluster, stage, reason) (rate(foreshock_input_problems_total[5m]))"},
    ]
    for q in ("0.5", "0.99"):
        rules.append({
            "record": "instance:foreshock_detector_latency_seconds:histogram_quantile_rate5m",
            "expr": f"histogram_quantile({q}, sum by (cluster, instance, le) "
                    "(rate(foreshock_detector_latency_seconds_bucket[5m])))",
            "labels": {"quantile": q},
        })
    # How far each exported GPU is from its own limits, for the fleet board's stat and ranking: a
    # fleet mixing parts is judged part by part (an 85 °C part at 84 °C has 1 °C left, a 105 °C
    # part at 90 °C has 15), not by absolute temperature. A GPU without a limit series (an older
    # exporter, another job) is judged against Hopper's, as ForeshockHbmTemperatureNearLimit does.
    gpu = "cluster, rack, node, gpu"
    for sensor, temp, limit, default in (
            ("core", "foreshock_gpu_temperature_celsius", "foreshock_gpu_max_operating_temperature_celsius",
             cfg.max_operating_c),
            ("hbm", "foreshock_gpu_memory_temperature_celsius",
             "foreshock_gpu_memory_max_operating_temperature_celsius", cfg.hbm_max_operating_c)):
        rules.append({
            "record": THERMAL_HEADROOM,
            "expr": f"(max by ({gpu}) ({limit}) or max by ({gpu}) ({temp}) * 0 + {default:g}) "
                    f"- on ({gpu}) max by ({gpu}) ({temp})",
            "labels": {"sensor": sensor},
        })
    # One series per throttle reason, 0 or 1, with the reason as a label: the GPU detail
    # dashboard draws them as a state timeline. Decoded from the raw NVML bitmask.
    for reason, bit in THROTTLE_BITS.items():
        rules.append({
            "record": "gpu:foreshock_gpu_throttle_reason:bit",
            "expr": decode_bit("foreshock_gpu_throttle_reasons", bit),
            "labels": {"reason": reason},
        })
    return rules


def alerts(cfg: MixinConfig = DEFAULT_CONFIG) -> list[Alert]:
    throttle = _regex(cfg.throttle_events)
    by_pred = "cluster, event, entity_kind, entity, rack"
    gpu = "cluster, rack, node, gpu"
    hbm = "foreshock_gpu_memory_temperature_celsius"
    hbm_limit = "foreshock_gpu_memory_max_operating_temperature_celsius"
    brake = decode_bit("foreshock_gpu_throttle_reasons", THROTTLE_BITS["hw_power_brake"])
    problems = "sum by (cluster, instance) (rate(foreshock_input_problems_total[5m]))"
    samples = ("sum by (cluster, instance) (rate(foreshock_samples_processed_total[5m]) "
               "or rate(foreshock_agent_samples_read_total[5m]))")
    # Go templates have no +Inf literal; fmt spells the value +Inf
    no_samples = 'eq (printf "%g" $value) "+Inf"'
    out = [
        Alert(
            "ForeshockThrottlePredicted",
            # (an ETA of 0 is the event under way: "in 0s ... act before it throttles" paged on for
            # minutes into the throttle; ForeshockThermalThrottling says that one, audit s65)
            f'min by ({by_pred}) (foreshock_prediction_eta_seconds{{event=~"{throttle}"}}) < {cfg.throttle_horizon_s:g}'
            " > 0"
            f" and on ({by_pred}) max by ({by_pred}) "
            f'(foreshock_prediction_confidence_ratio{{event=~"{throttle}"}}) >= {cfg.min_confidence:g}',
            "warning",
            "{{ $labels.entity }} is predicted to hit {{ $labels.event }} in {{ $value | humanizeDuration }}",
            "foreshock predicts {{ $labels.event }} on {{ $labels.entity_kind }} {{ $labels.entity }} "
            "(rack {{ $labels.rack }}, cluster {{ $labels.cluster }}) in {{ $value | humanizeDuration }} "
            f"with confidence at least {cfg.min_confidence:g}. Act before it throttles: check the cooling "
            "loop and power of the rack, consider draining the node.",
        ),
        Alert(
            "ForeshockCoolingDegradation",
            # on the rack's own series, not the exporting worker's: after a rebalance the new
            # worker's series would be its own median and never fire (and a firing one resolved)
            f"avg_over_time({RACK_RESISTANCE}[10m]) > "
            f"{cfg.cooling_resistance_ratio:g} * quantile_over_time(0.5, {RACK_RESISTANCE}[1d])",
            "warning",
            "Cooling of rack {{ $labels.rack }} is degrading",
            "The mean die-to-coolant thermal resistance of the GPUs in rack {{ $labels.rack }} "
            "(cluster {{ $labels.cluster }}) is {{ $value | printf \"%.3f\" }} °C/W, more than "
            f"{cfg.cooling_resistance_ratio:g}× its median over the last day: less heat leaves each die per "
            "watt (cold plates, thermal interfaces, fans). A coolant flow loss heats the coolant instead, "
            "which this does not see: ForeshockCoolantFlowLow.",
        ),
        Alert(
            "ForeshockCoolantFlowLow",
            # the rack's own series, as above; a loop's loss (a CDU's pump) shows on each of its racks
            f"avg_over_time({RACK_FLOW}[2m]) < "
            f"{cfg.coolant_flow_ratio:g} * quantile_over_time(0.5, {RACK_FLOW}[1d])",
            "critical",
            "Coolant flow to rack {{ $labels.rack }} is low",
            "The coolant flow through rack {{ $labels.rack }} (cluster {{ $labels.cluster }}) is "
            "{{ $value | printf \"%.2f\" }} L/s, under "
            f"{cfg.coolant_flow_ratio:g}× its median over the last day: its coolant and inlet heat, and under "
            "load its GPUs reach their thermal limit within minutes (ForeshockThrottlePredicted says which "
            "and when). Check the CDU's pumps, valves and filters.",
        ),
        Alert(
            "ForeshockThermalThrottling",
            # observed, what today's tools report: the throttle predicted is under way, and the
            # predictions' alert has resolved (its ETA reached 0)
            'max by (cluster, rack) (foreshock_rack_gpus_throttled{kind="thermal"}) > 0',
            "warning",
            "{{ $value }} GPUs of rack {{ $labels.rack }} are held by the thermal limiter",
            "The SW or HW thermal slowdown holds {{ $value }} GPUs of rack {{ $labels.rack }} (cluster "
            "{{ $labels.cluster }}): they run at reduced clocks now, and the synchronous jobs on them "
            "slow with them. See the rack's cooling (ForeshockCoolantFlowLow, ForeshockCoolingDegradation, "
            "ForeshockFanStopped) and the incident foreshock opened for it.",
        ),
        Alert(
            "ForeshockFanStopped",
            f"min by (cluster, rack, node) (foreshock_node_fan_speed_ratio) < {cfg.fan_stopped_ratio:g}",
            "critical",
            "A chassis fan of {{ $labels.node }} has stopped",
            "The slowest chassis fan of {{ $labels.node }} (rack {{ $labels.rack }}, cluster "
            "{{ $labels.cluster }}) reads {{ $value | humanizePercentage }} of full speed: the node's "
            "GPUs lose airflow, and under load they reach their thermal limit within minutes.",
        ),
        Alert(
            "ForeshockPowerBrake",
            f"max by ({gpu}) ({brake}) == 1",
            "critical",
            "HW power brake on {{ $labels.node }} GPU {{ $labels.gpu }}",
            "The HW power brake throttle reason (bit 0x80) is set on {{ $labels.node }} GPU {{ $labels.gpu }} "
            "(rack {{ $labels.rack }}): an external signal (PSU, rack power) cut the clocks.",
        ),
        Alert(
            "ForeshockLinkFailurePredicted",
            f'min by ({by_pred}) (foreshock_prediction_eta_seconds{{event="link_down"}}) < {cfg.link_horizon_s:g}'
            f" and on ({by_pred}) max by ({by_pred}) "
            f'(foreshock_prediction_confidence_ratio{{event="link_down"}}) >= {cfg.min_confidence:g}',
            "warning",
            "{{ $labels.entity_kind }} {{ $labels.entity }} is predicted to go down in {{ $value | humanizeDuration }}",
            "foreshock predicts link_down on {{ $labels.entity_kind }} {{ $labels.entity }} (cluster "
            "{{ $labels.cluster }}) in {{ $value | humanizeDuration }}: optics or cable degrading "
            "(RX power, pre-FEC BER, symbol errors). Plan a swap before it flaps under a job.",
        ),
        Alert(
            # the congestion detector's predictions only: no detector emits an anomaly on a
            # congestion counter (it judges xmit_wait, PFC pause and ECN/CNP itself, as a prediction)
            "ForeshockFabricCongestion",
            'count by (cluster) (foreshock_prediction_eta_seconds{event="congestion"}) > 0',
            "warning",
            "Fabric congestion in cluster {{ $labels.cluster }}",
            "foreshock predicts congestion on {{ $value }} fabric entities in cluster {{ $labels.cluster }}, "
            "from their congestion counters (xmit_wait, PFC pause, ECN/CNP).",
        ),
        Alert(
            "ForeshockCascadeIncident",
            "max by (cluster, incident, root_kind, root_entity) (foreshock_incident_members) "
            f">= {cfg.cascade_members}",
            "critical",
            "Cascading incident {{ $labels.incident }} from {{ $labels.root_kind }} {{ $labels.root_entity }}",
            "Incident {{ $labels.incident }} groups {{ $value }} entities under one root cause, "
            "{{ $labels.root_kind }} {{ $labels.root_entity }} (cluster {{ $labels.cluster }}).",
        ),
        Alert(
            "ForeshockJobSlowdownPredicted",
            "max by (cluster, training_job) (foreshock_job_predicted_slowdown_ratio) "
            f"> {cfg.job_slowdown_ratio:g}",
            "warning",
            "Training job {{ $labels.training_job }} is predicted to slow down",
            "An open incident is predicted to stretch the synchronous step of job {{ $labels.training_job }} "
            "(cluster {{ $labels.cluster }}) by {{ $value | humanizePercentage }} (predicted extra step time).",
        ),
    ]
    for sev, window in (("critical", cfg.xid_critical_window), ("warning", cfg.xid_warning_window)):
        tier = f'{{severity="{sev}"}}'
        # one alert per GPU and XID, so the page names the node to drain (Alertmanager groups a
        # burst by alert name and cluster into one notification)
        out.append(Alert(
            f"ForeshockXid{sev.capitalize()}",
            # a counter that rose within the window, or was created within it: increase() misses
            # a series' first sample, the first XID of that code on that GPU
            f"sum by ({gpu}, xid) (increase({XID_COUNTER}{tier}[{window}])) > 0 or "
            f"sum by ({gpu}, xid) {created_within(XID_COUNTER, tier, window)}",
            sev,
            "New XID {{ $labels.xid }} (" + sev + ") on {{ $labels.node }} GPU {{ $labels.gpu }}",
            f"foreshock counted new XID {{{{ $labels.xid }}}} events ({sev} tier) in the last {window} "
            "on {{ $labels.node }} GPU {{ $labels.gpu }} (rack {{ $labels.rack }}, cluster {{ $labels.cluster }}). "
            "Counted from changes of the last-XID field, so a latched old XID does not fire.",
        ))
    out += [
        Alert(
            "ForeshockGpuMissing",
            "cluster:foreshock_gpus_reporting:sum < "
            f"max_over_time(cluster:foreshock_gpus_reporting:sum[{cfg.gpu_missing_window}])",
            "warning",
            "GPUs stopped reporting in cluster {{ $labels.cluster }}",
            "{{ $value }} GPUs report telemetry in cluster {{ $labels.cluster }}, fewer than at some "
            f"point in the last {cfg.gpu_missing_window}: a GPU fell off the bus, a node or an agent is down.",
        ),
        Alert(
            "ForeshockHbmTemperatureNearLimit",
            # against each GPU's own limit (another SKU, or a driver reporting a lower one, throttles
            # elsewhere than at 95 °C); where its limit series is absent (an older exporter,
            # another job), against Hopper's
            f"max by ({gpu}) ({hbm}) > on ({gpu}) (max by ({gpu}) ({hbm_limit}) - {cfg.hbm_margin_c:g} "
            f"or max by ({gpu}) ({hbm}) * 0 + {cfg.hbm_alert_c:g})",
            "warning",
            "HBM of {{ $labels.node }} GPU {{ $labels.gpu }} is near its limit",
            "HBM temperature of {{ $labels.node }} GPU {{ $labels.gpu }} (rack {{ $labels.rack }}) is "
            "{{ $value }} °C, within " f"{cfg.hbm_margin_c:g} °C of its HBM max operating temperature, "
            f"{{{{ with printf `max({hbm_limit}{{cluster=%q,rack=%q,node=%q,gpu=%q}})` "
            "$labels.cluster $labels.rack $labels.node $labels.gpu | query }}{{ . | first | value }} °C"
            f"{{{{ else }}}}{cfg.hbm_max_operating_c:g} °C (no limit exported for it){{{{ end }}}}.",
        ),
    ]
    out.append(Alert(
        "ForeshockAgentDown",
        f'up{{job="{cfg.agent_job}"}} == 0',
        "warning",
        "foreshock agent {{ $labels.instance }} is down",
        "Prometheus cannot scrape the agent at {{ $labels.instance }}: what it reads (a node's GPUs, a "
        "set of BMCs or CDUs, an exporter) reaches no worker, and nothing it would show can be predicted.",
    ))
    for job in cfg.scrape_jobs:
        out.append(Alert(
            job.alert,
            f'absent(up{{job="{job.job}"}} == 1)' + (f" unless on () ({job.unless})" if job.unless else ""),
            job.severity,
            f"No {job.component} target is up",
            f'Prometheus has had no healthy target in job "{job.job}" ({job.component})'
            + (f" and {job.unless_says}" if job.unless else "") + f" for a while: {job.impact}.",
        ))
    out += [
        Alert(
            "ForeshockIngestLag",
            # only while the instance processes input: the gauge is written when a batch finishes,
            # so after input stops it keeps the last batch's lag for ever (one slow batch, a Numba
            # warm-up or a GC pause, would page for as long as the pipeline stays idle)
            f"max by (cluster, instance) (foreshock_ingest_lag_seconds) > {cfg.ingest_lag_s:g} "
            "and on (cluster, instance) "
            "sum by (cluster, instance) (rate(foreshock_samples_processed_total[5m])) > 0",
            "warning",
            "foreshock on {{ $labels.instance }} lags {{ $value | humanizeDuration }} behind its input",
            "The pipeline on {{ $labels.instance }} finishes a batch's detection {{ $value | humanizeDuration }} "
            "after its agent sent it (a Kafka worker: the batch's time in the topic and in the worker's backlog "
            "with the detection's); predictions arrive that much later.",
        ),
        Alert(
            "ForeshockDeadLettersRising",
            "sum by (cluster, instance) (rate(foreshock_dead_letters_total[5m])) > 0",
            "warning",
            "foreshock on {{ $labels.instance }} keeps dead-lettering records",
            "{{ $value | printf \"%.3g\" }} records/s go to the dead-letter topic on {{ $labels.instance }}: "
            "a producer sends records foreshock cannot decode.",
        ),
        Alert(
            # a source slower than its poll interval (a dcgm-exporter taking 40 s to answer a 30-s
            # poll, a BMC timing out): every skipped poll is a sample never read, counted apart from
            # input problems because the input that came was fine
            "ForeshockPollsSkipped",
            "sum by (cluster, instance, stage) (rate(foreshock_polls_skipped_total[5m])) > 0",
            "warning",
            "foreshock on {{ $labels.instance }} keeps skipping {{ $labels.stage }} polls",
            "The {{ $labels.stage }} source on {{ $labels.instance }} skips {{ $value | printf \"%.3g\" }} polls/s: "
            "a poll, or the pipeline behind it, takes longer than the poll interval, so samples are never read.",
        ),
        Alert(
            "ForeshockInputProblems",
            # An agent whose source never answered (a BMC, a CDU) serves problems and no samples-read
            # series at all: without one the ratio would not exist. Its samples are then 0, so the
            # ratio is +Inf and fires; no problems over no samples is 0/0 (NaN), which does not.
            f"{problems} / ({samples} or on (cluster, instance) {problems} * 0) "
            f"> {cfg.input_problem_ratio:g}",
            "warning",
            f"{{{{ if {no_samples} }}}}foreshock on {{{{ $labels.instance }}}} counts input problems and reads "
            "no samples{{ else }}foreshock rejects or repairs {{ $value | humanizePercentage }} of its input "
            "on {{ $labels.instance }}{{ end }}",
            f"{{{{ if {no_samples} }}}}{{{{ $labels.instance }}}} counted input problems and not one sample in "
            "the last 5 minutes: its source does not answer, or none of its input could be used"
            "{{ else }}More than " f"{cfg.input_problem_ratio:.0%}" " of the samples on {{ $labels.instance }} "
            "have a problem{{ end }} (see foreshock_input_problems_total by stage and reason).",
        ),
    ]
    return out


def rule_file(cfg: MixinConfig = DEFAULT_CONFIG) -> dict[str, Any]:
    """The whole Prometheus rule file: recording rules first (alerts use them)."""
    alert_rules = []
    for a in alerts(cfg):
        key = "absent" if a.expr.startswith("absent(") else a.name
        alert_rules.append(a.rule(cfg, cfg.for_of(key)))
    return {"groups": [
        {"name": RECORDING_GROUP, "rules": recording_rules(cfg)},
        {"name": ALERT_GROUP, "rules": alert_rules},
    ]}
