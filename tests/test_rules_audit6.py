"""Audit 6 of the generated rules: a rack's cooling alert across a Kafka rebalance, the agents'
absent-target alert in a one-machine deployment, and job names that are written once.

The promtool cases that run these rules on series are in deploy/prometheus/tests/foreshock_test.yml
("cooling degradation across a Kafka rebalance", "firing cooling alert survives a rebalance",
"one-machine watch deployment has no agents", "every agent goes down while the workers still
export gpus_reporting")."""

from __future__ import annotations

import dataclasses
import re

from foreshock.dashboards.boards import dashboards
from foreshock.dashboards.config import DEFAULT_CONFIG
from foreshock.dashboards.grafana import queries
from foreshock.dashboards.rules import alerts, recording_rules, rule_file

RAW_RESISTANCE = "foreshock_rack_thermal_resistance_celsius_per_watt"
JOB = re.compile(r'\bjob\s*=~?\s*"([^"]*)"')


def _alert(cfg, name):
    (a,) = [a for a in alerts(cfg) if a.name == name]
    return a


def _every_expr(cfg) -> list[tuple[str, str]]:
    out = [(a.name, a.expr) for a in alerts(cfg)]
    out += [(r["record"], r["expr"]) for r in recording_rules(cfg)]
    for uid, board in dashboards(cfg).items():
        out += [(f"{uid}: {title}", expr) for title, expr in queries(board)]
    return out


def test_cooling_alert_reads_the_rack_not_the_worker():
    """The rack's series must not carry `instance`: after a rebalance the new worker's series is
    its own median (never fires) and a firing alert resolves while the rack is still degraded."""
    (rec,) = [r for r in recording_rules() if r["record"] == "rack:" + RAW_RESISTANCE + ":max"]
    assert rec["expr"] == f"max by (cluster, rack) ({RAW_RESISTANCE})"
    expr = _alert(DEFAULT_CONFIG, "ForeshockCoolingDegradation").expr
    # the raw per-worker series is never read by the alert itself, only through the record
    assert re.search(rf"(?<![:\w]){RAW_RESISTANCE}(?!:)", expr) is None, expr
    assert f"avg_over_time({rec['record']}[10m])" in expr
    assert f"quantile_over_time(0.5, {rec['record']}[1d])" in expr


def test_recording_rules_precede_the_alerts_that_read_them():
    groups = rule_file()["groups"]
    records = {r["record"] for r in groups[0]["rules"]}
    (cooling,) = [r for r in groups[1]["rules"] if r["alert"] == "ForeshockCoolingDegradation"]
    assert "rack:" + RAW_RESISTANCE + ":max" in records
    assert cooling["for"] == DEFAULT_CONFIG.for_of("ForeshockCoolingDegradation")


def test_agents_down_is_silent_while_a_pipeline_reports_gpus():
    """One machine, no broker (`foreshock watch`): no agents job at all. GPUs reporting say the
    telemetry reaches the pipeline; in Kafka mode they fall to 0 when the agents are gone."""
    a = _alert(DEFAULT_CONFIG, "ForeshockAgentsDown")
    # nor while no pipeline is up (ForeshockPipelineDown says so; audit s65)
    assert a.expr == (f'absent(up{{job="{DEFAULT_CONFIG.agent_job}"}} == 1) '
                      "unless on () (sum(foreshock_gpus_reporting) > 0 "
                      f'or absent(up{{job="{DEFAULT_CONFIG.pipeline_job}"}} == 1))')
    assert a.severity == "critical"
    # the description says both conditions, so it stays true
    assert "no foreshock pipeline that is up reports a GPU" in a.description
    (rule,) = [r for r in rule_file()["groups"][1]["rules"] if r["alert"] == "ForeshockAgentsDown"]
    assert rule["for"] == DEFAULT_CONFIG.for_["absent"]


def test_other_absent_alerts_have_no_condition():
    for name in ("ForeshockPipelineDown", "ForeshockAlertmanagerDown"):
        assert "unless" not in _alert(DEFAULT_CONFIG, name).expr


def test_job_names_overridden_once_reach_every_rule_and_board():
    """`dataclasses.replace(DEFAULT_CONFIG, pipeline_job=..., agent_job=...)`, the documented way,
    must move every rule and panel that reads a job name: the absent-target alerts included."""
    cfg = dataclasses.replace(DEFAULT_CONFIG, pipeline_job="fs-workers", agent_job="fs-agents")
    read = {(where, job) for where, expr in _every_expr(cfg) for job in JOB.findall(expr)}
    stale = {(where, job) for where, job in read if job in ("foreshock", "foreshock-agents")}
    assert not stale, stale
    jobs = {job for _, job in read}
    assert {"fs-workers", "fs-agents"} <= jobs
    assert _alert(cfg, "ForeshockPipelineDown").expr == 'absent(up{job="fs-workers"} == 1)'
    assert _alert(cfg, "ForeshockAgentsDown").expr.startswith('absent(up{job="fs-agents"} == 1)')
    assert _alert(cfg, "ForeshockAgentDown").expr == 'up{job="fs-agents"} == 0'
    assert 'job "fs-agents"' in _alert(cfg, "ForeshockAgentsDown").description


def test_every_job_read_is_a_configured_job():
    for cfg in (DEFAULT_CONFIG,
                dataclasses.replace(DEFAULT_CONFIG, pipeline_job="w", agent_job="a", alertmanager_job="am")):
        configured = {cfg.pipeline_job, cfg.agent_job, cfg.alertmanager_job}
        assert {j.job for j in cfg.scrape_jobs} == configured
        read = {job for _, expr in _every_expr(cfg) for job in JOB.findall(expr)}
        assert read == configured, read
