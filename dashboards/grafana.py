"""A small builder for Grafana dashboard JSON (schema 39): panels, targets, variables, layout.

Only what foreshock's dashboards use. Every panel queries the datasource variable, so one
dashboard works against any Prometheus holding foreshock's series; panel ids and grid
positions are assigned in order, so the output is deterministic (stable JSON, stable UIDs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GRID_WIDTH = 24
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
ALERT_TAG_KEYS = "severity,cluster,rack,node,gpu,entity,training_job,incident,instance"
"""Labels of a firing foreshock alert shown as tags of its annotation (those it has)."""


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False

    def json(self, ref: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "datasource": DATASOURCE,
            "expr": self.expr,
            "refId": ref,
            "legendFormat": self.legend or "__auto",
            "range": not self.instant,
            "instant": self.instant,
        }
        if self.table:
            out["format"] = "table"
        return out


@dataclass
class Panel:
    title: str
    type: str
    targets: list[Target]
    description: str = ""
    unit: str = ""
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    thresholds: list[tuple[float | None, str]] = field(default_factory=list)
    threshold_lines: bool = False
    mappings: list[dict[str, Any]] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)
    links: list[dict[str, Any]] = field(default_factory=list)
    no_value: str | None = None
    transformations: list[dict[str, Any]] = field(default_factory=list)
    overrides: list[dict[str, Any]] = field(default_factory=list)

    def json(self, panel_id: int, x: int, y: int) -> dict[str, Any]:
        defaults: dict[str, Any] = {"custom": dict(self.custom), "mappings": list(self.mappings)}
        if self.unit:
            defaults["unit"] = self.unit
        if self.min is not None:
            defaults["min"] = self.min
        if self.max is not None:
            defaults["max"] = self.max
        if self.no_value is not None:
            defaults["noValue"] = self.no_value
        if self.links:
            defaults["links"] = list(self.links)
        steps = self.thresholds or [(None, "green")]
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": color, "value": value} for value, color in steps],
        }
        if self.threshold_lines:
            defaults["custom"]["thresholdsStyle"] = {"mode": "line+area"}
        out: dict[str, Any] = {
            "id": panel_id,
            "type": self.type,
            "title": self.title,
            "description": self.description,
            "datasource": DATASOURCE,
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "fieldConfig": {"defaults": defaults, "overrides": list(self.overrides)},
            "options": dict(self.options),
            "targets": [t.json(chr(ord("A") + i)) for i, t in enumerate(self.targets)],
        }
        if self.transformations:
            out["transformations"] = list(self.transformations)
        return out


def right_axis(ref: str, unit: str, **props: Any) -> dict[str, Any]:
    """A field override that draws query ``ref`` on its own right-hand axis in ``unit``, without
    the panel's threshold lines (they belong to the left axis)."""
    properties = [{"id": "unit", "value": unit}, {"id": "custom.axisPlacement", "value": "right"},
                  {"id": "custom.thresholdsStyle", "value": {"mode": "off"}}]
    properties += [{"id": key, "value": value} for key, value in props.items()]
    return {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": properties}


def dashed(ref: str) -> dict[str, Any]:
    """A field override that draws query ``ref`` as a dashed line without fill: a limit drawn
    beside the values it bounds."""
    return {"matcher": {"id": "byFrameRefID", "options": ref},
            "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                           {"id": "custom.fillOpacity", "value": 0}]}


def timeseries(title: str, *targets: Target, **kw: Any) -> Panel:
    kw.setdefault("options", {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                              "tooltip": {"mode": "multi", "sort": "desc"}})
    return Panel(title, "timeseries", list(targets), **kw)


def stat(title: str, target: Target, **kw: Any) -> Panel:
    kw.setdefault("width", 6)
    kw.setdefault("height", 4)
    kw.setdefault("options", {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                              "colorMode": "background", "graphMode": "area", "textMode": "auto"})
    return Panel(title, "stat", [target], **kw)


def heatmap(title: str, target: Target, **kw: Any) -> Panel:
    """Rows = series (one per rack), columns = time, colour = value: pre-bucketed, not calculated."""
    kw.setdefault("options", {
        "calculate": False,
        "cellGap": 1,
        "color": {"mode": "scheme", "scheme": "Turbo", "steps": 64, "exponent": 0.5, "fill": "dark-orange",
                  "reverse": False},
        "rowsFrame": {"layout": "auto"},
        "yAxis": {"axisPlacement": "left"},
        "legend": {"show": True},
        "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": True},
        "cellValues": {"unit": kw.get("unit", "")},
    })
    return Panel(title, "heatmap", [target], **kw)


def state_timeline(title: str, target: Target, **kw: Any) -> Panel:
    kw.setdefault("options", {"showValue": "never", "mergeValues": True, "rowHeight": 0.8,
                              "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                              "alignValue": "left"})
    return Panel(title, "state-timeline", [target], **kw)


def table(title: str, target: Target, **kw: Any) -> Panel:
    kw.setdefault("width", 24)
    kw.setdefault("options", {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}})
    kw.setdefault("transformations", [{"id": "organize", "options": {
        "excludeByName": {"Time": True, "__name__": True, "job": True, "instance": True}}}])
    return Panel(title, "table", [target], **kw)


@dataclass(frozen=True)
class Variable:
    """A query variable over a label; multi-valued ones match everything with ``.*``."""

    name: str
    label: str
    query: str  # label_values(...) query
    multi: bool = True

    def json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "type": "query",
            "datasource": DATASOURCE,
            "query": {"query": self.query, "refId": f"{self.name}-query", "qryType": 1},
            "definition": self.query,
            "refresh": 2,  # on time range change
            "sort": 7,  # natural ascending
            "multi": self.multi,
            "includeAll": self.multi,
            "allValue": ".*" if self.multi else None,
            "current": {},
            "options": [],
            "hide": 0,
            "regex": "",
        }


def datasource_variable(default_uid: str) -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {"selected": False, "text": default_uid, "value": default_uid},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    panels: list[Panel | str]  # a str starts a collapsed-free row with that title
    variables: list[Variable] = field(default_factory=list)
    tags: tuple[str, ...] = ()

    def json(self, datasource_uid: str, refresh: str, time_from: str, tag: str) -> dict[str, Any]:
        panels: list[dict[str, Any]] = []
        x = y = 0
        row_h = 0
        pid = 1
        for item in self.panels:
            if isinstance(item, str):
                if x:
                    y, x, row_h = y + row_h, 0, 0
                panels.append({"id": pid, "type": "row", "title": item, "collapsed": False,
                               "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}, "panels": []})
                pid += 1
                y += 1
                continue
            if x + item.width > GRID_WIDTH:
                y, x, row_h = y + row_h, 0, 0
            panels.append(item.json(pid, x, y))
            pid += 1
            x += item.width
            row_h = max(row_h, item.height)
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": sorted({tag, *self.tags}),
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,  # shared crosshair
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "refresh": refresh,
            "time": {"from": time_from, "to": "now"},
            "fiscalYearStartMonth": 0,
            "liveNow": False,
            "weekStart": "",
            "links": [{"title": "foreshock", "type": "dashboards", "tags": [tag], "asDropdown": True,
                       "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False}],
            "annotations": {"list": [
                {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
                 "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
                 "type": "dashboard"},
                {"name": "foreshock alerts", "enable": True, "hide": False, "iconColor": "red",
                 "datasource": DATASOURCE,
                 "expr": 'ALERTS{alertstate="firing", alertname=~"Foreshock.*"}',
                 # ALERTS carries the alert's labels, never its annotations (no summary), and
                 # Grafana writes a missing label's name in its place: only labels every foreshock
                 # alert has go in the text; the others become tags where a series has them
                 "step": "60s", "titleFormat": "{{alertname}}", "textFormat": "{{alertname}} ({{severity}})",
                 "tagKeys": ALERT_TAG_KEYS, "useValueForTime": False},
            ]},
            "templating": {"list": [datasource_variable(datasource_uid)] + [v.json() for v in self.variables]},
            "panels": panels,
        }


def queries(dashboard_json: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (panel title, PromQL) pair in a generated dashboard, for tests and tooling."""
    out = []
    for panel in dashboard_json["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out
