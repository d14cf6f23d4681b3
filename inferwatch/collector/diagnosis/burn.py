"""SLO status from the generated recording rules in Prometheus (fixed queries, whatever the SLO count)."""

from __future__ import annotations

import asyncio
import math

import httpx
from pydantic import BaseModel, Field

from inferwatch.collector.diagnosis.prometheus import _labels, _query, _value
from inferwatch.collector.diagnosis.signals import UpstreamError
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLO, SLOFile, alert_windows

ALERTS_METRIC = "ALERTS"


class BurnAlert(BaseModel):
    severity: str
    long_window: str
    short_window: str
    labels: dict[str, str]


class SloGroup(BaseModel):
    labels: dict[str, str] = Field(description="the SLO's group_by labels (e.g. model)")
    sli: float | None = Field(description="share of good events over the period (1 - error ratio)")
    error_ratio: float | None
    budget_remaining: float | None = Field(description="1 = untouched, 0 = spent, below 0 = breached")
    burn_rates: dict[str, float | None] = Field(description="error ratio / budget, per alert window")


class SloStatus(BaseModel):
    name: str
    description: str
    objective: float
    period: str
    error_budget: float
    groups: list[SloGroup]
    firing: list[BurnAlert]


class SloReport(BaseModel):
    source: str
    slos: list[SloStatus]
    upstream_queries: int


def slo_queries() -> dict[str, str]:
    """Name -> PromQL: the period error ratio, the budget left, each alert window's error ratio, alerts."""
    queries = {
        V.SLO_PERIOD_ERROR_RATIO_RECORD: V.SLO_PERIOD_ERROR_RATIO_RECORD,
        V.SLO_BUDGET_REMAINING_RECORD: V.SLO_BUDGET_REMAINING_RECORD,
        ALERTS_METRIC: f'{ALERTS_METRIC}{{alertname="{V.ALERT_SLO_BURN}", alertstate="firing"}}',
    }
    for window in alert_windows():
        queries[V.slo_error_ratio(window)] = V.slo_error_ratio(window)
    return queries


def _group_key(labels: dict[str, str], group_by: list[str]) -> tuple[str, ...]:
    return tuple(labels.get(label, "") for label in group_by)


def _mine(rows: list[dict[str, object]], slo_name: str, service: str) -> list[tuple[dict[str, str], float]]:
    """The series of this SLO of this service (series from rules generated before the service label
    existed have none: they are taken as this service's)."""
    out = []
    for item in rows:
        labels = _labels(item)
        value = _value(item)
        if (
            labels.get(V.SLO_LABEL) == slo_name
            and labels.get(V.SLO_SERVICE_LABEL, service) == service
            and math.isfinite(value)
        ):
            out.append((labels, value))
    return out


def _status(slo: SLO, service: str, by_name: dict[str, list[dict[str, object]]]) -> SloStatus:
    budget = float(slo.error_budget)
    group_by = list(slo.group_by)
    groups: dict[tuple[str, ...], SloGroup] = {}

    def group(labels: dict[str, str]) -> SloGroup:
        key = _group_key(labels, group_by)
        if key not in groups:
            groups[key] = SloGroup(
                labels=dict(zip(group_by, key, strict=True)),
                sli=None,
                error_ratio=None,
                budget_remaining=None,
                burn_rates={w: None for w in alert_windows()},
            )
        return groups[key]

    for labels, value in _mine(by_name[V.SLO_PERIOD_ERROR_RATIO_RECORD], slo.name, service):
        g = group(labels)
        g.error_ratio, g.sli = value, 1 - value
    for labels, value in _mine(by_name[V.SLO_BUDGET_REMAINING_RECORD], slo.name, service):
        group(labels).budget_remaining = value
    for window in alert_windows():
        for labels, value in _mine(by_name[V.slo_error_ratio(window)], slo.name, service):
            group(labels).burn_rates[window] = value / budget if budget else None
    firing = [
        BurnAlert(
            severity=labels.get(V.SEVERITY_LABEL, ""),
            long_window=labels.get(V.LONG_WINDOW_LABEL, ""),
            short_window=labels.get(V.SHORT_WINDOW_LABEL, ""),
            labels={k: v for k, v in labels.items() if k not in ("__name__", "alertname", "alertstate")},
        )
        for labels, _ in _mine(by_name[ALERTS_METRIC], slo.name, service)
    ]
    return SloStatus(
        name=slo.name,
        description=slo.description or slo.name,
        objective=float(slo.objective_ratio),
        period=slo.period,
        error_budget=budget,
        groups=[groups[k] for k in sorted(groups)],
        firing=firing,
    )


async def read_slos(client: httpx.AsyncClient, base_url: str, spec: SLOFile, *, timeout: float) -> SloReport:
    queries = slo_queries()
    names = list(queries)
    try:
        async with asyncio.timeout(timeout + 1):
            results = await asyncio.gather(*(_query(client, base_url, queries[n], timeout) for n in names))
    except TimeoutError:
        raise UpstreamError(base_url, f"Prometheus did not answer within {timeout:g} s") from None
    by_name = dict(zip(names, results, strict=True))
    out = [_status(slo, spec.service, by_name) for slo in spec.slos]
    return SloReport(source=base_url, slos=out, upstream_queries=len(names))
