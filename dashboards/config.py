"""The one config the alert rules, recording rules and dashboards are generated from.

Like a monitoring mixin's ``_config``: selectors, thresholds, ``for`` durations, scrape jobs,
datasource and folder live here as data; :mod:`foreshock.dashboards.rules` and
:mod:`foreshock.dashboards.boards` read them and nothing else. Override a field with
``dataclasses.replace(DEFAULT_CONFIG, ...)`` to generate a variant for another site.

Thresholds that come from hardware facts are read from :mod:`foreshock.facts`, never retyped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from foreshock.facts import HBM_MAX_OPERATING_TEMP_C, HW_SLOWDOWN_TEMP_C, MAX_OPERATING_TEMP_C


@dataclass(frozen=True)
class ScrapeJob:
    """A component Prometheus scrapes; each gets an ``absent(up{job=...} == 1)`` alert (``unless on ()``
    its :attr:`unless` holds)."""

    job: str
    alert: str
    component: str
    impact: str
    severity: str = "critical"
    # PromQL that silences the alert while it holds (the component is not needed then), and what
    # it means in words for the description ("" where there is none)
    unless: str = ""
    unless_says: str = ""


@dataclass(frozen=True)
class MixinConfig:
    # --- where things live ---------------------------------------------------------------
    datasource_uid: str = "foreshock-prometheus"
    datasource_name: str = "Prometheus (foreshock)"
    folder_uid: str = "foreshock"
    folder_title: str = "foreshock"
    runbook_url: str = "https://github.com/foreshock/foreshock/blob/main/docs/runbooks.md"
    dashboard_tag: str = "foreshock"
    refresh: str = "30s"
    time_from: str = "now-6h"

    # --- what Prometheus scrapes (deploy/prometheus/prometheus.yml uses the same job names) --
    # Each job name is written here once: the absent-target alerts (:attr:`scrape_jobs`), the
    # per-agent alert and the dashboards all read these fields, so a site that scrapes under other
    # names overrides them here (``dataclasses.replace(DEFAULT_CONFIG, pipeline_job=...)``).
    pipeline_job: str = "foreshock"
    alertmanager_job: str = "alertmanager"
    agent_job: str = "foreshock-agents"  # agents' --metrics-port; ForeshockAgentDown is per agent

    # --- predictions ---------------------------------------------------------------------
    throttle_events: tuple[str, ...] = ("thermal_throttle", "power_cap", "power_brake")
    throttle_horizon_s: float = 1800.0  # alert on throttle predictions due within 30 min
    link_horizon_s: float = 3600.0
    min_confidence: float = 0.5

    # --- thresholds ----------------------------------------------------------------------
    hbm_margin_c: float = 5.0  # alert this far below a GPU's own HBM max operating temperature
    headroom_warning_c: float = 10.0  # dashboards: orange within this of a GPU's own limit
    cooling_resistance_ratio: float = 1.25  # rack resistance vs its own median over a day
    coolant_flow_ratio: float = 0.5  # rack coolant flow vs its own median over a day
    fan_stopped_ratio: float = 0.1  # a node's slowest chassis fan under this share of full speed
    cascade_members: int = 3
    # foreshock_job_predicted_slowdown_ratio is the predicted *extra* step time as a fraction of
    # the normal step (0 = no slowdown, 0.05 = 5 % slower), not step time over normal step
    job_slowdown_ratio: float = 0.05
    ingest_lag_s: float = 30.0
    input_problem_ratio: float = 0.01
    gpu_missing_window: str = "6h"
    xid_critical_window: str = "10m"
    xid_warning_window: str = "1h"

    # --- how long a condition must hold before it fires ---------------------------------
    for_: dict[str, str] = field(default_factory=lambda: {
        "ForeshockThrottlePredicted": "30s",
        "ForeshockCoolingDegradation": "10m",
        "ForeshockCoolantFlowLow": "2m",
        "ForeshockThermalThrottling": "2m",
        "ForeshockFanStopped": "1m",
        "ForeshockPowerBrake": "1m",
        "ForeshockLinkFailurePredicted": "1m",
        "ForeshockFabricCongestion": "5m",
        "ForeshockCascadeIncident": "1m",
        "ForeshockJobSlowdownPredicted": "2m",
        "ForeshockXidCritical": "1m",
        "ForeshockXidWarning": "5m",
        "ForeshockGpuMissing": "10m",
        "ForeshockHbmTemperatureNearLimit": "5m",
        "ForeshockIngestLag": "5m",
        "ForeshockDeadLettersRising": "10m",
        "ForeshockInputProblems": "15m",
        "ForeshockPollsSkipped": "15m",
        "ForeshockAgentDown": "2m",
        "absent": "2m",
    })

    @property
    def scrape_jobs(self) -> tuple[ScrapeJob, ...]:
        """The scraped components with an absent-target alert each, named by the job fields above."""
        return (
            ScrapeJob(self.pipeline_job, "ForeshockPipelineDown", "foreshock pipeline",
                      "no telemetry is analysed, so no prediction and no foreshock alert can fire"),
            ScrapeJob(self.alertmanager_job, "ForeshockAlertmanagerDown", "Alertmanager",
                      "alerts that fire may not be delivered to anyone", "warning"),
            # Only while no pipeline reports a GPU either: a one-machine deployment (`foreshock
            # watch`, no broker) runs no agents at all, and its GPUs reporting say the telemetry
            # arrives; in Kafka mode the workers' GPUs reporting fall to 0 within 2 minutes of the
            # agents' last frame, so the alert still fires when the agents are gone. Nor while no
            # pipeline is up (ForeshockPipelineDown says that): a one-machine deployment's pipeline
            # stopping took its GPUs reporting with it, and paged "no agent is up" beside it (audit s65)
            ScrapeJob(self.agent_job, "ForeshockAgentsDown", "foreshock agent",
                      "no GPU, BMC or CDU telemetry reaches the workers, so nothing can be predicted "
                      "(ForeshockGpuMissing fires too, about 12 minutes after the agents stopped)",
                      unless=f'sum(foreshock_gpus_reporting) > 0 or absent(up{{job="{self.pipeline_job}"}} == 1)',
                      unless_says="no foreshock pipeline that is up reports a GPU"),
        )

    @property
    def hbm_max_operating_c(self) -> float:
        """The HBM limit of a GPU whose own is not exported (the exporter's default too)."""
        return HBM_MAX_OPERATING_TEMP_C

    @property
    def hbm_alert_c(self) -> float:
        """The HBM alert's level for a GPU whose own limit is not exported."""
        return self.hbm_max_operating_c - self.hbm_margin_c

    @property
    def max_operating_c(self) -> float:
        return MAX_OPERATING_TEMP_C

    @property
    def hw_slowdown_c(self) -> float:
        return HW_SLOWDOWN_TEMP_C

    def for_of(self, alert: str) -> str:
        return self.for_[alert]


DEFAULT_CONFIG = MixinConfig()
