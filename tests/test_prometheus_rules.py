"""The shipped Prometheus/Alertmanager configs and rules: promtool and amtool accept them, every
alert has a promtool test that shows it silent before `for` and firing after, and the rules
avoid the pitfalls of existing GPU rule packs (FACTS.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest_prom import PROMTOOL_BIN, require_binary

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "prometheus"
RULES = DEPLOY / "rules" / "foreshock.rules.yml"
PROMTOOL_TESTS = sorted((DEPLOY / "tests").glob("*.yml"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def alert_rules() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def _duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h|d)", text):
        total += int(number) * units[unit]
    assert total or text in ("0", "0s"), f"bad duration {text!r}"
    return total


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.prometheus
def test_promtool_check_config_and_rules() -> None:
    promtool = require_binary(PROMTOOL_BIN)
    result = _run([promtool, "check", "config", "prometheus.yml"], DEPLOY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout  # the glob picked up the generated rules
    result = _run([promtool, "check", "rules", str(RULES)], DEPLOY)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_amtool_check_config() -> None:
    amtool = require_binary("amtool")
    result = _run([amtool, "check-config", "alertmanager.yml"], DEPLOY)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_promtool_rule_unit_tests_pass() -> None:
    promtool = require_binary(PROMTOOL_BIN)
    result = _run([promtool, "test", "rules", *[p.name for p in PROMTOOL_TESTS]], DEPLOY / "tests")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(PROMTOOL_TESTS)


@pytest.mark.prometheus
def test_promtool_fails_when_an_expectation_is_wrong(tmp_path: Path) -> None:
    """Guards the guard: a test file with one wrong annotation must fail."""
    promtool = require_binary(PROMTOOL_BIN)
    source = DEPLOY / "tests" / "foreshock_fast_test.yml"
    broken = source.read_text().replace("in 9m 15s with", "in 9m 14s with")
    broken = broken.replace("../rules/foreshock.rules.yml", str(RULES))
    assert broken != source.read_text()
    (tmp_path / "broken.yml").write_text(broken)
    result = _run([promtool, "test", "rules", "broken.yml"], tmp_path)
    assert result.returncode != 0 and "9m 15s" in result.stdout + result.stderr


def test_every_alert_has_a_silent_then_firing_promtool_case() -> None:
    """For each alert: a case where it is silent while its condition has not held for `for`, and a
    later one in the same test group where it fires with the rule's severity."""
    cases: dict[str, list[tuple[str, float, list[dict[str, Any]]]]] = {}
    for path in PROMTOOL_TESTS:
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], []).append(
                    (group["name"], _duration_s(case["eval_time"]), case.get("exp_alerts") or []))
    for rule in alert_rules():
        name = rule["alert"]
        assert name in cases, f"{name} has no promtool test case"
        firing = [(g, t) for g, t, exp in cases[name] if exp]
        assert firing, f"{name} is never shown firing"
        for g, t in firing:
            silent_before = [s for sg, s, exp in cases[name] if sg == g and not exp and s < t]
            assert silent_before, f"{name}: no silent case before it fires in {g!r}"
        for _, _, exp in cases[name]:
            for alert in exp:
                assert alert["exp_labels"]["severity"] == rule["labels"]["severity"]
                assert alert["exp_annotations"]["runbook_url"] == rule["annotations"]["runbook_url"]


def test_alerts_are_complete_and_link_to_a_runbook_section() -> None:
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", RUNBOOKS.read_text(), flags=re.M)}
    names = [r["alert"] for r in alert_rules()]
    assert len(names) == len(set(names))
    for rule in alert_rules():
        assert rule["alert"].startswith("Foreshock")
        assert _duration_s(rule["for"]) > 0, f"{rule['alert']} needs a `for`"
        assert rule["labels"]["severity"] in ("critical", "warning")
        ann = rule["annotations"]
        assert ann["summary"] and ann["description"]
        page, _, anchor = ann["runbook_url"].partition("#")
        assert page.endswith("docs/runbooks.md") and anchor in anchors, f"no runbook section for {rule['alert']}"


def test_the_issue_alerts_exist() -> None:
    names = {r["alert"] for r in alert_rules()}
    assert {
        "ForeshockThrottlePredicted", "ForeshockCoolingDegradation", "ForeshockPowerBrake",
        "ForeshockLinkFailurePredicted", "ForeshockFabricCongestion", "ForeshockCascadeIncident",
        "ForeshockJobSlowdownPredicted", "ForeshockXidCritical", "ForeshockXidWarning", "ForeshockGpuMissing",
        "ForeshockHbmTemperatureNearLimit", "ForeshockPipelineDown", "ForeshockIngestLag",
        "ForeshockDeadLettersRising",
    } <= names


def test_every_scrape_job_has_an_absent_up_alert() -> None:
    prometheus_yml = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    exprs = [r["expr"] for r in alert_rules()]
    for job in prometheus_yml["scrape_configs"]:
        if job["job_name"] == "prometheus":
            continue  # Prometheus watching itself cannot alert on its own absence
        # ForeshockAgentsDown adds `unless on () (...)`: silent where no agent is needed
        absent = f'absent(up{{job="{job["job_name"]}"}} == 1)'
        assert any(e == absent or e.startswith(absent + " unless on () ") for e in exprs), job["job_name"]


def test_recording_rules_are_named_level_metric_operations() -> None:
    for rule in rules():
        if "record" in rule:
            assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]


# ---- pitfalls ------------------------------------------------------------------------------

COUNTER = re.compile(r"\b(foreshock_[a-z0-9_]+_total)\b")


def test_no_cumulative_counter_is_compared_with_a_constant() -> None:
    """Every use of a counter is inside rate()/increase() or is the `S and S_created > time() - W`
    test for a series created inside the window. Never `S unless S offset W`: that is also true of
    an old series Prometheus did not scrape W ago (it had just started, or the target was down),
    so every GPU that ever had an XID paged "New XID" after each restart."""
    for rule in rules():
        expr = rule["expr"]
        for m in COUNTER.finditer(expr):
            before = expr[: m.start()]
            inside_rate = re.search(r"\b(rate|increase)\(\s*$", before) is not None
            selector_end = expr.index("}", m.end()) + 1 if expr[m.end():m.end() + 1] == "{" else m.end()
            selector = expr[m.start():selector_end]
            created = selector.replace("_total", "_created", 1)
            born_test = expr[m.start():].startswith(f"{selector} and {created} > time() - ")
            assert inside_rate or born_test, f"{rule.get('alert') or rule.get('record')}: bare counter {selector}"


def test_throttle_bits_are_decoded_never_compared() -> None:
    for rule in rules():
        expr = rule["expr"]
        uses = re.findall(r"foreshock_gpu_throttle_reasons", expr)
        decoded = re.findall(r"floor\(foreshock_gpu_throttle_reasons / (\d+)\) % 2", expr)
        assert len(decoded) == len(uses), f"bitmask used without the floor(x / 2^k) % 2 decode: {expr}"
        for divisor in decoded:
            assert int(divisor) & (int(divisor) - 1) == 0, f"{divisor} is not a power of two"


def test_no_rule_uses_the_latching_last_xid_field() -> None:
    text = RULES.read_text()
    assert "XID_ERRORS" not in text and "xid_last" not in text
    assert "foreshock_xid_events_total" in text
