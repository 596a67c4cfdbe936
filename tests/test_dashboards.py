"""Dashboards as code: generation is reproducible and checked in, UIDs are stable, panels are
well-formed and cover what the issue asks for, and every query is valid PromQL that uses only
series foreshock exports or its recording rules define."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from foreshock.cli.main import cli
from foreshock.dashboards.boards import dashboards
from foreshock.dashboards.generate import load_dashboards, render, stale
from foreshock.dashboards.grafana import queries
from foreshock.dashboards.rules import rule_file

ROOT = Path(__file__).resolve().parents[1]
EXPECTED_UIDS = {"foreshock-fleet", "foreshock-gpu", "foreshock-fabric", "foreshock-incidents", "foreshock-pipeline"}
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range", "__data", "__url_time_range", "datasource"}


def substitute(expr: str) -> str:
    """A dashboard query as Grafana sends it with every variable on "All" (regex ``.*``)."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", ".*", expr)  # not label_replace's "$1"


def all_queries() -> list[tuple[str, str, str]]:
    return [(uid, title, expr) for uid, board in load_dashboards().items() for title, expr in queries(board)]


def test_regenerating_changes_nothing() -> None:
    assert stale(ROOT) == [], "run `foreshock dashboards generate` and commit the result"


def test_generate_check_cli_detects_a_stale_file(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["dashboards", "generate", "--root", str(tmp_path)]).exit_code == 0
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()) == sorted(render())
    assert runner.invoke(cli, ["dashboards", "generate", "--root", str(tmp_path), "--check"]).exit_code == 0
    (tmp_path / "dashboards/generated/foreshock-gpu.json").write_text("{}")
    result = runner.invoke(cli, ["dashboards", "generate", "--root", str(tmp_path), "--check"])
    assert result.exit_code == 1 and "foreshock-gpu.json" in result.output


def test_a_dashboard_no_longer_generated_is_reported_and_deleted(tmp_path: Path) -> None:
    """A board renamed or removed left its JSON in dashboards/generated/: `--check` called the
    files up to date, and Grafana's provisioning and `dashboards push` still loaded it."""
    runner = CliRunner(env={"COLUMNS": "300"})
    assert runner.invoke(cli, ["dashboards", "generate", "--root", str(tmp_path)]).exit_code == 0
    old = tmp_path / "dashboards/generated/foreshock-fleet-old.json"
    old.write_text((tmp_path / "dashboards/generated/foreshock-fleet.json").read_text()
                   .replace('"uid": "foreshock-fleet"', '"uid": "foreshock-fleet-old"'))
    (tmp_path / "dashboards/generated/notes.txt").write_text("not a dashboard: left alone")
    assert stale(tmp_path) == [Path("dashboards/generated/foreshock-fleet-old.json")]
    result = runner.invoke(cli, ["dashboards", "generate", "--root", str(tmp_path), "--check"])
    assert result.exit_code == 1 and "no longer generated: dashboards/generated/foreshock-fleet-old.json" in result.output
    assert old.exists()  # --check writes and deletes nothing
    result = runner.invoke(cli, ["dashboards", "generate", "--root", str(tmp_path)])
    assert result.exit_code == 0 and "deleted dashboards/generated/foreshock-fleet-old.json" in result.output
    assert not old.exists() and (tmp_path / "dashboards/generated/notes.txt").exists()
    assert runner.invoke(cli, ["dashboards", "generate", "--root", str(tmp_path), "--check"]).exit_code == 0


def test_fabric_congestion_counts_only_what_a_detector_emits() -> None:
    """Its second branch counted link anomalies on congestion counters (xmit_wait, PFC, ECN/CNP)
    that no registered detector emits: the congestion detector judges those counters itself and
    says so with a congestion prediction, which the first branch counts. The branch, and the
    `congestion_links` setting it read, could never match."""
    from dataclasses import fields

    from foreshock.dashboards.config import MixinConfig
    from foreshock.dashboards.rules import alerts

    (congestion,) = [a for a in alerts() if a.name == "ForeshockFabricCongestion"]
    assert congestion.expr == 'count by (cluster) (foreshock_prediction_eta_seconds{event="congestion"}) > 0'
    assert "congestion_links" not in {f.name for f in fields(MixinConfig)}


def test_uids_are_stable_and_shipped_as_package_data() -> None:
    shipped = load_dashboards()
    assert set(shipped) == EXPECTED_UIDS
    assert {b["uid"] for b in dashboards().values()} == EXPECTED_UIDS
    files = {p.stem for p in (ROOT / "dashboards" / "generated").glob("*.json")}
    assert files == EXPECTED_UIDS


@pytest.mark.parametrize("uid", sorted(EXPECTED_UIDS))
def test_panels_are_well_formed(uid: str) -> None:
    board = load_dashboards()[uid]
    assert board["schemaVersion"] >= 36 and board["title"].startswith("foreshock / ")
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    defined = {v["name"] for v in board["templating"]["list"]}
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", target["expr"]))  # not label_replace's $1
            assert used <= defined | BUILTIN_VARIABLES, f"{panel['title']}: undefined {used - defined}"


def _panel(uid: str, title: str) -> dict[str, Any]:
    return next(p for p in load_dashboards()[uid]["panels"] if p["title"] == title)


def test_gpu_temperatures_are_drawn_against_each_gpus_own_limits() -> None:
    """GPU detail drew fixed lines (87 and 89 °C) under every GPU's temperatures, and no HBM
    limit: a part whose HBM limit is 85 °C was drawn 10 °C short of a 95 °C it never reaches.
    The panel draws each selected GPU's own limit series (dashed) and no fixed line."""
    versus = _panel("foreshock-gpu", "Temperature vs predicted time to throttle")
    exprs = {t["refId"]: t["expr"] for t in versus["targets"]}
    limits = {"foreshock_gpu_max_operating_temperature_celsius": "core limit",
              "foreshock_gpu_memory_max_operating_temperature_celsius": "HBM limit"}
    for family, legend in limits.items():
        (ref,) = [r for r, e in exprs.items() if e.startswith(family + "{")]
        target = next(t for t in versus["targets"] if t["refId"] == ref)
        assert 'node=~"$node", gpu=~"$gpu"' in target["expr"] and target["legendFormat"].endswith(legend)
        (style,) = [o for o in versus["fieldConfig"]["overrides"] if o["matcher"]["options"] == ref]
        assert {p["id"]: p["value"] for p in style["properties"]}["custom.lineStyle"]["fill"] == "dash"
    defaults = versus["fieldConfig"]["defaults"]
    assert [s["value"] for s in defaults["thresholds"]["steps"]] == [None]  # no fixed limit
    assert defaults["custom"].get("thresholdsStyle", {"mode": "off"})["mode"] == "off"


def test_dashboards_cover_what_users_asked_for() -> None:
    # fleet: predicted throttles, open incidents, temperature and thermal-resistance heatmaps by rack
    assert "foreshock_prediction_eta_seconds" in _panel("foreshock-fleet", "Predicted throttles")["targets"][0]["expr"]
    assert "foreshock_incidents_open" in _panel("foreshock-fleet", "Open incidents")["targets"][0]["expr"]
    for title, metric in (("Hottest GPU temperature by rack", "foreshock_rack_gpu_temperature_max_celsius"),
                          ("Thermal resistance by rack", "foreshock_rack_thermal_resistance_celsius_per_watt")):
        panel = _panel("foreshock-fleet", title)
        assert panel["type"] == "heatmap" and "by (rack)" in panel["targets"][0]["expr"] and metric in panel["targets"][0]["expr"]
    # GPU detail: temperature vs predicted ETA (one panel, the ETA on its own axis in seconds),
    # power vs limit, decoded throttle reasons
    versus = _panel("foreshock-gpu", "Temperature vs predicted time to throttle")
    exprs = {t["refId"]: t["expr"] for t in versus["targets"]}
    assert "foreshock_gpu_temperature_celsius" in exprs["A"] and "foreshock_gpu_memory_temperature_celsius" in exprs["B"]
    assert "foreshock_prediction_eta_seconds" in exprs["C"] and "thermal_throttle" in exprs["C"]
    assert versus["fieldConfig"]["defaults"]["unit"] == "celsius"
    (eta_axis,) = [o for o in versus["fieldConfig"]["overrides"] if o["matcher"]["options"] == "C"]
    assert eta_axis["matcher"] == {"id": "byFrameRefID", "options": "C"}
    props = {p["id"]: p["value"] for p in eta_axis["properties"]}
    assert props["unit"] == "s" and props["custom.axisPlacement"] == "right"
    assert "foreshock_prediction_eta_seconds" in _panel("foreshock-gpu", "Predicted time to event")["targets"][0]["expr"]
    power = [t["expr"] for t in _panel("foreshock-gpu", "Power vs limit")["targets"]]
    assert any("foreshock_gpu_power_watts" in e for e in power) and any("power_limit_watts" in e for e in power)
    reasons = _panel("foreshock-gpu", "Throttle reasons (decoded)")
    assert reasons["type"] == "state-timeline" and "gpu:foreshock_gpu_throttle_reason:bit" in reasons["targets"][0]["expr"]
    # fabric and optics: congestion, BER and RX-power trends, predicted link failures
    fabric = " ".join(e for _, e in queries(load_dashboards()["foreshock-fabric"]))
    for needle in ("xmit_wait", "prefec_ber", "rx_power", 'event="link_down"'):
        assert needle in fabric
    # cooling state beyond the heatmaps: flow by rack, and the loop (CDU) that feeds the racks
    fleet = " ".join(e for _, e in queries(load_dashboards()["foreshock-fleet"]))
    for needle in ("foreshock_rack_coolant_flow_liters_per_second", "foreshock_loop_gpu_temperature_max_celsius",
                   "foreshock_loop_inlet_temperature_celsius"):
        assert needle in fleet
    incidents = " ".join(e for _, e in queries(load_dashboards()["foreshock-incidents"]))
    for needle in ("foreshock_incident_members", "foreshock_job_predicted_slowdown_ratio"):
        assert needle in incidents
    pipeline = " ".join(e for _, e in queries(load_dashboards()["foreshock-pipeline"]))
    for needle in ("foreshock_samples_processed_total", "foreshock_input_problems_total", "foreshock_dead_letters_total",
                   "foreshock_ingest_lag_seconds", "foreshock_detector_latency_seconds"):
        assert needle in pipeline


# Families and labels the rules and dashboards use that the exporter does not publish yet
# (requested from the exporter's catalogue). Each must still be missing: the test says when an
# entry can go. `job` is Prometheus' target label (a series' own `job` becomes `exported_job`),
# hence `training_job`.
REQUESTED_FAMILIES: set[str] = set()  # families rules/dashboards use before the exporter has them
REQUESTED_LABELS: set[tuple[str, str]] = set()
TARGET_LABELS = {"job", "instance", "le"}  # added by Prometheus / histograms
FAMILY = re.compile(r"(?<![:\w])(foreshock_[a-z0-9_]+)\b(?!:)")


def _used_labels() -> tuple[set[str], set[tuple[str, str]]]:
    texts = [e for *_, e in all_queries()] + [r["expr"] for g in rule_file()["groups"] for r in g["rules"]]
    names: set[str] = set()
    labels: set[tuple[str, str]] = set()
    for expr in texts:
        names |= set(FAMILY.findall(expr))
        for name, matchers in re.findall(r"(?<![:\w])(foreshock_[a-z0-9_]+)\{([^}]*)\}", expr):
            labels |= {(name, label) for label in re.findall(r"(\w+)\s*[=!]~?", matchers)}
        # `agg by (labels) (family...)`: the grouping labels must exist on the family
        for grouping, name in re.findall(r"by \(([^)]*)\) \((?:\w+\()?(foreshock_[a-z0-9_]+)\b(?!:)", expr):
            labels |= {(name, label.strip()) for label in grouping.split(",")}
    return names, labels


def test_queries_use_only_exported_series_and_labels() -> None:
    """Cross-check against the exporter's catalogue: a renamed metric or label breaks this test,
    not a dashboard in production."""
    from foreshock.exporters.prometheus import CATALOGUE

    exported: dict[str, tuple[str, ...]] = {}
    for spec in CATALOGUE:
        exported[spec.name] = spec.labels
        if spec.type == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                exported[spec.name + suffix] = spec.labels
        if spec.created:
            exported[spec.name.removesuffix("_total") + "_created"] = spec.labels
    names, labels = _used_labels()
    missing = names - set(exported) - REQUESTED_FAMILIES
    assert not missing, f"families used by rules/dashboards but not exported: {sorted(missing)}"
    bad = {(n, lab) for n, lab in labels
           if n in exported and lab not in exported[n] and lab not in TARGET_LABELS} - REQUESTED_LABELS
    assert not bad, f"labels the exporter does not put on these families: {sorted(bad)}"
    arrived = sorted(REQUESTED_FAMILIES & set(exported))
    arrived += [f"{n}{{{lab}}}" for n, lab in sorted(REQUESTED_LABELS) if lab in exported.get(n, ())]
    assert not arrived, f"now exported, drop from REQUESTED_* here and AWAITING_EXPORTER in the e2e test: {arrived}"
    assert REQUESTED_FAMILIES <= names  # entries nobody uses any more go too


@pytest.mark.prometheus
def test_every_query_is_valid_promql_for_the_real_prometheus(start_prometheus: Any) -> None:
    rules = ROOT / "deploy" / "prometheus" / "rules" / "foreshock.rules.yml"
    prom = start_prometheus(scrape={}, rule_files=[rules])
    groups = prom.rule_groups()
    assert sum(len(g["rules"]) for g in groups) == sum(len(g["rules"]) for g in rule_file()["groups"])
    for uid, title, expr in all_queries():
        prom.query(substitute(expr))  # raises on a parse or evaluation error
    for board in load_dashboards().values():
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
                assert match, variable["query"]
                prom.query(substitute(match.group(1)))


def test_alert_annotations_name_only_labels_every_alert_series_has() -> None:
    """The ALERTS series Prometheus keeps for a firing alert has its labels, never its annotations
    ("summary" is not on it), and Grafana writes a missing label's name in its place: a text of
    "{{summary}}" showed the word "summary" on every alert marker."""
    alerts = [r for g in rule_file()["groups"] for r in g["rules"] if "alert" in r]
    on_every_series = {"alertname", "alertstate"} | set.intersection(*(set(r["labels"]) for r in alerts))
    for uid, board in load_dashboards().items():
        for annotation in board["annotations"]["list"]:
            if "ALERTS" not in annotation.get("expr", ""):
                continue
            for key in ("titleFormat", "textFormat"):
                used = {label.strip() for label in re.findall(r"\{\{([^}]+)\}\}", annotation[key])}
                assert used <= on_every_series, f"{uid} {key}: {sorted(used - on_every_series)} not on ALERTS"


def _data_links() -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """(dashboard uid, panel, link) for every panel data link to another foreshock dashboard."""
    return [(uid, panel, link) for uid, board in load_dashboards().items() for panel in board["panels"]
            for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", [])
            if link["url"].startswith("/d/")]


def test_data_links_select_every_variable_of_the_dashboard_they_open() -> None:
    """The predictions table's link opened GPU detail with only cluster and rack set: every GPU of
    the rack, not the one predicted to throttle (what the ThrottlePredicted runbook says it opens)."""
    boards = load_dashboards()
    links = _data_links()
    assert links
    for uid, panel, link in links:
        path, _, query = link["url"][len("/d/"):].partition("?")
        target_uid = path.split("/")[0]  # /d/<uid> or /d/<uid>/<slug>
        assert target_uid in boards, f"{uid} {panel['title']}: no dashboard {target_uid}"
        params = {p.partition("=")[0] for p in query.split("&")}
        wanted = {f"var-{v['name']}" for v in boards[target_uid]["templating"]["list"] if v["type"] == "query"}
        assert wanted <= params, f"{uid} {panel['title']}: {target_uid} opens without {sorted(wanted - params)}"
        assert "${datasource:queryparam}" in params and "${__url_time_range}" in params


@pytest.mark.prometheus
def test_data_link_fields_are_labels_of_the_table_query(start_prometheus: Any) -> None:
    """Each ``${__data.fields.X}`` of a link is a column of its table: a label of the query result
    (here for a prediction on GPU node0/gpu3, from a synthetic series in a real Prometheus)."""
    prom = start_prometheus(scrape={})
    eta = 'foreshock_prediction_eta_seconds{cluster=~".*"}'
    series = ('label_replace(label_replace(label_replace(vector(600), "cluster", "c0", "", ""), '
              '"rack", "rack0", "", ""), "entity", "node0/gpu3", "", "")')
    for uid, panel, link in _data_links():
        (target,) = panel["targets"]
        expr = substitute(target["expr"])
        assert eta in expr, f"{uid} {panel['title']}: update this test's synthetic series"
        (row,) = prom.query(expr.replace(eta, series))
        fields = set(re.findall(r"\$\{__data\.fields\.(\w+)\}", link["url"]))
        assert fields <= set(row["metric"]), f"{uid} {panel['title']}: no column {sorted(fields - set(row['metric']))}"
        assert (row["metric"]["node"], row["metric"]["gpu"]) == ("node0", "3")
