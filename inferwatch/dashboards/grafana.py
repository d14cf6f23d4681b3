"""DashboardSpec -> grafanalib objects -> Grafana dashboard JSON (the only module importing grafanalib).

grafanalib 0.7 emits a few legacy fields (``schemaVersion`` 12, ``style``, datasources as plain
strings); :func:`dashboard_json` post-processes its output: explicit ``schemaVersion``, datasource
reference objects ``{"type", "uid": "${datasource}"}`` on panels, targets and variables.
"""

from __future__ import annotations

import json
from typing import Any

from grafanalib import core as G
from grafanalib._gen import DashboardEncoder

from inferwatch.dashboards import panels as M
from inferwatch.dashboards import promql as P

SCHEMA_VERSION = 39
REFRESH_ON_TIME_RANGE_CHANGE = 2
STACKED_FILL_OPACITY = 25
THRESHOLDS_STYLE = "dashed+area"
"""how a time series with thresholds draws them: a dashed line at each step, its band shaded."""

PROMETHEUS_REF: dict[str, str] = {"type": M.PROMETHEUS_TYPE, "uid": f"${{{P.VAR_DATASOURCE}}}"}
POSTGRES_REF: dict[str, str] = {"type": M.POSTGRES_TYPE, "uid": f"${{{P.VAR_SQL_DATASOURCE}}}"}

_REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LEGACY_TARGET_FIELDS = ("query", "target", "metric", "step", "intervalFactor")
"""grafanalib's pre-Grafana-7 target fields (``intervalFactor: 2`` would halve the resolution)."""


def _template(var: M.Variable) -> Any:
    if var.kind == "datasource":
        return G.Template(
            name=var.name,
            label=var.label,
            query=var.query,
            type="datasource",
            default=var.default,
            includeAll=False,
            multi=False,
            refresh=1,
        )
    return G.Template(
        name=var.name,
        label=var.label,
        query=var.query,
        dataSource=PROMETHEUS_REF,
        default="All" if var.include_all else None,
        includeAll=var.include_all,
        multi=var.multi,
        allValue=P.ALL_VALUE if var.include_all else None,
        refresh=REFRESH_ON_TIME_RANGE_CHANGE,
    )


def _targets(panel: M.Panel) -> list[Any]:
    out: list[Any] = []
    for i, q in enumerate(panel.queries):
        fmt = {M.TABLE: "table", M.HEATMAP: "heatmap"}.get(q.kind, "time_series")
        out.append(
            G.Target(
                expr=q.expr,
                legendFormat=q.legend,
                refId=_REF_IDS[i],
                instant=q.kind in (M.STAT, M.TABLE),
                format=fmt,
                datasource=PROMETHEUS_REF,
            )
        )
    for i, s in enumerate(panel.sql, start=len(out)):
        out.append(G.SqlTarget(rawSql=s.sql, refId=_REF_IDS[i], format=s.format, datasource=POSTGRES_REF))
    return out


def _overrides(panel: M.Panel) -> list[dict[str, Any]]:
    return [
        {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
        for name, unit in panel.column_units
    ]


def _field_defaults(panel: M.Panel) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.no_value:
        defaults["noValue"] = panel.no_value
    if panel.thresholds:
        steps = [{"color": t.color, "value": t.value} for t in panel.thresholds]
        defaults["thresholds"] = {"mode": "absolute", "steps": steps}
    return defaults


def _table_transformations(panel: M.Panel) -> list[Any]:
    """Join the instant queries of a Prometheus table on their labels; each value column takes its
    query's legend as its name (Grafana calls them ``Value #A``, ``Value #B``… when there are several)."""
    rename = {f"Value #{_REF_IDS[i]}": q.legend for i, q in enumerate(panel.queries)} if len(panel.queries) > 1 else {}
    organize: dict[str, Any] = {"excludeByName": {"Time": True}}
    if rename:
        organize["renameByName"] = rename
    return [{"id": "merge", "options": {}}, {"id": "organize", "options": organize}]


def _panel(panel: M.Panel, pos: M.Placed, panel_id: int) -> Any:
    common: dict[str, Any] = {
        "title": panel.title,
        "description": panel.description,
        "dataSource": POSTGRES_REF if panel.sql else PROMETHEUS_REF,
        "targets": _targets(panel),
        "gridPos": G.GridPos(h=pos.h, w=pos.w, x=pos.x, y=pos.y),
        "id": panel_id,
    }
    extra: dict[str, Any] = {"fieldConfig": {"defaults": _field_defaults(panel)}}
    if panel.kind == M.TIMESERIES:
        stacking = {"mode": "normal", "group": "A"} if panel.stacked else {}
        return G.TimeSeries(
            unit=panel.unit,
            legendDisplayMode="list",
            legendPlacement="bottom",
            tooltipMode="multi",
            stacking=stacking,
            fillOpacity=STACKED_FILL_OPACITY if panel.stacked else 0,
            thresholdsStyleMode=THRESHOLDS_STYLE if panel.thresholds else "off",
            extraJson=extra,
            **common,
        )
    if panel.kind == M.STAT:
        return G.Stat(format=panel.unit, reduceCalc="lastNotNull", graphMode="none", extraJson=extra, **common)
    if panel.kind == M.TABLE:
        transformations: list[Any] = [] if panel.sql else _table_transformations(panel)
        return G.Table(
            unit=panel.unit,
            overrides=_overrides(panel),
            transformations=transformations,
            filterable=True,
            extraJson=extra,
            **common,
        )
    if panel.kind == M.HEATMAP:
        extra["options"] = {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
            "yAxis": {"axisPlacement": "left", "unit": panel.unit},
            "rowsFrame": {"layout": "le"},
            "tooltip": {"show": True, "yHistogram": True},
        }
        return G.Heatmap(dataFormat="tsbuckets", extraJson=extra, **common)
    if panel.kind == M.TEXT:
        common.pop("targets")
        common.pop("dataSource")
        return G.Text(content=panel.content, mode="markdown", extraJson=extra, **common)
    raise ValueError(f"unknown panel kind {panel.kind!r} of {panel.title!r}")


def build(spec: M.DashboardSpec) -> Any:
    """The grafanalib ``Dashboard`` of a spec (panel ids in layout order, from 1)."""
    panels: list[Any] = []
    for panel_id, placed in enumerate(M.layout(spec.panels), start=1):
        item = placed.item
        if isinstance(item, M.Row):
            panels.append(
                G.RowPanel(
                    title=item.title,
                    gridPos=G.GridPos(h=placed.h, w=placed.w, x=placed.x, y=placed.y),
                    id=panel_id,
                )
            )
        else:
            panels.append(_panel(item, placed, panel_id))
    return G.Dashboard(
        title=spec.title,
        uid=spec.uid,
        description=spec.description,
        tags=list(spec.tags),
        panels=panels,
        templating=G.Templating(list=[_template(v) for v in spec.variables]),
        time=G.Time("now-6h", "now"),
        refresh="30s",
        editable=False,
        graphTooltip=1,
        timezone="utc",
    )


def _fix_datasources(node: Any) -> None:
    """Make every datasource a reference object (grafanalib leaves None on rows and text panels)."""
    if isinstance(node, dict):
        for key, value in list(node.items()):
            if key == "datasource" and value is None:
                del node[key]
            else:
                _fix_datasources(value)
    elif isinstance(node, list):
        for item in node:
            _fix_datasources(item)


def dashboard_dict(spec: M.DashboardSpec) -> dict[str, Any]:
    """The dashboard as JSON-ready data (post-processed grafanalib output)."""
    data: dict[str, Any] = json.loads(json.dumps(build(spec).to_json_data(), cls=DashboardEncoder))
    data["schemaVersion"] = SCHEMA_VERSION
    data.pop("style", None)
    data.pop("rows", None)
    _fix_datasources(data)
    for panel in data["panels"]:
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        if "thresholds" in defaults and not defaults["thresholds"].get("steps"):
            defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}]}
        if defaults.get("color", "") is None:
            defaults["color"] = {"mode": "thresholds"}
        if panel.get("type") in ("row", "text"):
            panel.pop("targets", None)
        for target in panel.get("targets", []):
            for legacy in _LEGACY_TARGET_FIELDS:
                target.pop(legacy, None)
    for var in data["templating"]["list"]:
        if var["includeAll"]:
            var["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return data


def dashboard_json(spec: M.DashboardSpec) -> str:
    """Deterministic JSON text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(dashboard_dict(spec), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
