"""LLM SLOs: SLI, objective, error budget and burn rate of every SLO of the SLO file."""

from __future__ import annotations

from inferwatch.core import links
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLO, SLOFile, alert_windows, decimal_text
from inferwatch.dashboards.model import (
    NOTE,
    STAT,
    TABLE,
    TIMESERIES,
    UNIT_BURN,
    UNIT_COUNT,
    UNIT_RATIO,
    DashboardSpec,
    Panel,
    Query,
    Row,
)
from inferwatch.dashboards.promql import (
    datasource_variable,
    label_list,
    legend_format,
)

UID = links.UID_SLOS
"""stable: Grafana upserts provisioned dashboards by uid."""


def _slo_panels(slo: SLO) -> list[Panel | Row]:
    sel = f'{{{V.SLO_LABEL}="{slo.name}"}}'
    by = tuple(slo.group_by)
    legend = legend_format(by) or slo.name
    about = slo.description or slo.name
    lat = slo.indicator.latency
    if lat is not None:
        metric = V.metric_by_key(lat.metric)
        sli = f"share of requests with {metric.name} at most {V.format_le(lat.threshold_seconds)} s"
    else:
        sli = f"share of finished requests ({V.REQUESTS.name}) whose outcome is not {V.OUTCOME_ERROR}"
    objective = decimal_text(slo.objective_ratio)
    budget = decimal_text(slo.error_budget)
    on = f"on ({V.SLO_LABEL}) group_left ()"
    burn = tuple(
        Query(
            f"{V.slo_error_ratio(w)}{sel} / {on} {V.SLO_ERROR_BUDGET_RECORD}{sel}",
            f"{legend} {w}".strip(),
            (),
            False,
        )
        for w in alert_windows()
    )
    return [
        Row(f"SLO {slo.name}: {about}"),
        Panel(
            f"{slo.name}: current SLI",
            f"1 - {V.slo_error_ratio('5m')}: the {sli}, over the last 5 minutes. Objective {objective}.",
            UNIT_RATIO,
            (Query(f"1 - {V.slo_error_ratio('5m')}{sel}", legend, (), False, STAT),),
            STAT,
            5,
            5,
        ),
        Panel(
            f"{slo.name}: objective",
            f"The objective: {objective} of events good over {slo.period} (error budget {budget}).",
            UNIT_RATIO,
            (Query(f"{V.SLO_OBJECTIVE_RECORD}{sel}", slo.name, (), False, STAT),),
            STAT,
            4,
            5,
        ),
        Panel(
            f"{slo.name}: error budget remaining",
            f"Share of the {slo.period} error budget not yet consumed: 1 - error ratio over the period / budget "
            f"({V.SLO_BUDGET_REMAINING_RECORD}). Below 0 the SLO is breached.",
            UNIT_RATIO,
            (Query(f"{V.SLO_BUDGET_REMAINING_RECORD}{sel}", legend, (), False, STAT),),
            STAT,
            5,
            5,
        ),
        Panel(
            f"{slo.name}: firing burn alerts",
            f"{V.ALERT_SLO_BURN} alerts of this SLO now firing (page: 1h/5m, 6h/30m; ticket: 1d/2h, 3d/6h).",
            UNIT_COUNT,
            (
                Query(
                    f'count(ALERTS{{alertname="{V.ALERT_SLO_BURN}", alertstate="firing", {V.SLO_LABEL}="{slo.name}"}})'
                    " or vector(0)",
                    "firing",
                    (),
                    False,
                    STAT,
                ),
            ),
            STAT,
            4,
            5,
        ),
        Panel(
            f"{slo.name}: error budget remaining over time",
            f"{V.SLO_BUDGET_REMAINING_RECORD} of this SLO over the {slo.period} period.",
            UNIT_RATIO,
            (Query(f"{V.SLO_BUDGET_REMAINING_RECORD}{sel}", legend, (), False),),
            TIMESERIES,
            6,
            5,
        ),
        Panel(
            f"{slo.name}: burn rate per alert window",
            "Error ratio over each alert window divided by the error budget "
            f"({budget}): 1 consumes the budget exactly in {slo.period}; the alerts fire at 14.4 (1h/5m), "
            "6 (6h/30m), 3 (1d/2h) and 1 (3d/6h) for a 30-day period.",
            UNIT_BURN,
            burn,
            TIMESERIES,
            24,
            8,
        ),
    ]


def board(spec: SLOFile) -> DashboardSpec:
    """The firing burn-rate alerts, then one row of panels per SLO of ``spec``."""
    firing = f'ALERTS{{alertname="{V.ALERT_SLO_BURN}", alertstate="firing"}}'
    labels = (V.SLO_LABEL, V.SEVERITY_LABEL, V.LONG_WINDOW_LABEL, V.SHORT_WINDOW_LABEL)
    panels: list[Panel | Row] = [
        Panel(
            "Firing burn-rate alerts",
            f"Every {V.ALERT_SLO_BURN} alert now firing, by SLO, severity and alert windows.",
            UNIT_COUNT,
            (Query(f"sum by ({label_list(labels)}) ({firing})", legend_format(labels), (), False, TABLE),),
            TABLE,
            24,
            6,
        )
    ]
    for slo in spec.slos:
        panels += _slo_panels(slo)
    return DashboardSpec(
        UID,
        links.DASHBOARD_TITLES[UID],
        f"Service level objectives of {spec.service}: SLI, error budget and burn rates. {NOTE}",
        (datasource_variable(),),
        tuple(panels),
        ("inferwatch", "llm", "slo"),
    )
