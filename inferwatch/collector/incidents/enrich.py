"""What the collector adds to an incident: the diagnosis for its labels, the slowest requests, links.

The alert's labels narrow the diagnosis (``engine``, ``model``, ``instance``; an SLO burn carries
``slo`` and ``model``, so its diagnosis lists every target of that model that contributes errors).
Findings about the symptoms the alert points at (the catalogue's ``alerts``) come first. The
slowest matching requests are those stored since the incident opened. Links: the runbook (the
alert's own ``runbook_url`` annotation, the symptom's section when there is a finding) and the
generated Grafana dashboards with the alert's labels as template variables.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, cast

from sqlalchemy import Connection, Engine, select

from inferwatch.collector.diagnosis.diagnoser import EXAMPLE_SORT, NotConfigured, OnCall
from inferwatch.collector.diagnosis.signals import Filters, UpstreamError
from inferwatch.collector.incidents.messages import (
    AlertSummary,
    DashboardLink,
    Enrichment,
    Event,
    IncidentMessage,
)
from inferwatch.collector.stats import listing, sides
from inferwatch.collector.store.tables import ALERTS_TABLE, INCIDENTS_TABLE
from inferwatch.core import links
from inferwatch.core import vocabulary as V
from inferwatch.core.schema import E2E
from inferwatch.core.symptoms import CATALOGUE

DIAGNOSIS_WINDOW: Final = "10m"
EXAMPLES: Final = 5
RUNBOOK_ANNOTATION: Final = "runbook_url"
DASHBOARDS_BY_ALERT: Final[dict[str, tuple[str, ...]]] = {
    V.ALERT_SLO_BURN: (links.UID_SLOS, links.UID_REQUESTS),
    V.ALERT_KV_SATURATED: (links.UID_KV_CACHE, links.UID_ENGINE),
    V.ALERT_KV_EXHAUSTION_PREDICTED: (links.UID_KV_CACHE,),
    V.ALERT_PREEMPTIONS_SUSTAINED: (links.UID_KV_CACHE, links.UID_ENGINE),
    V.ALERT_QUEUE_BACKLOG_GROWING: (links.UID_KV_CACHE, links.UID_FLEET),
    V.ALERT_EXPORTER_TARGET_DOWN: (links.UID_FLEET,),
    V.ALERT_ENGINE_METRICS_ABSENT: (links.UID_FLEET,),
}
INSTANCE_LABEL: Final = "instance"


@dataclass(frozen=True)
class LinkSettings:
    grafana_url: str | None = None
    public_url: str | None = None
    """the collector's address as users reach it (for incident page links)."""
    secret: bytes = b""
    """signs incident page links, so a link in a chat opens that one incident without a token."""


def incident_key(secret: bytes, incident_id: int) -> str:
    return hmac.new(secret, f"incident:{incident_id}".encode(), hashlib.sha256).hexdigest()[:32]


def incident_url(settings: LinkSettings, incident_id: int) -> str | None:
    if not settings.public_url:
        return None
    return f"{settings.public_url.rstrip('/')}/incidents/{incident_id}?key={incident_key(settings.secret, incident_id)}"


def _filters(labels: Mapping[str, str]) -> Filters:
    return Filters(labels.get(V.LABEL_ENGINE), labels.get(V.LABEL_MODEL), labels.get(INSTANCE_LABEL))


def _window(alerts: Sequence[Mapping[str, Any]]) -> str:
    for alert in alerts:
        long_window = alert["labels"].get("long_window")
        if long_window:
            return str(long_window)
    return DIAGNOSIS_WINDOW


async def enrich(
    oncall: OnCall,
    requests: Engine,
    incident: Mapping[str, Any],
    alerts: Sequence[Mapping[str, Any]],
    settings: LinkSettings,
    *,
    executor: Executor | None = None,
) -> Enrichment:
    """The enrichment of one incident (never raises for an upstream problem: it is kept in ``error``). The example
    requests are read on ``executor``'s threads (default: the loop's default pool), never on the event loop."""
    labels: dict[str, str] = dict(incident["labels"])
    for alert in alerts:
        for k, v in alert["labels"].items():
            labels.setdefault(k, v)
    names = {str(a["alertname"]) for a in alerts}
    enrichment = Enrichment()
    pointed = [spec.id for spec in CATALOGUE if names & set(spec.alerts)]
    try:
        diagnosis = await oncall.diagnose(_window(alerts), _filters(labels), requests=None, examples=0)
        enrichment.source = diagnosis.source
        findings = sorted(diagnosis.findings, key=lambda f: f.symptom not in pointed)
        enrichment.findings = findings
    except (UpstreamError, NotConfigured, ValueError) as exc:
        enrichment.error = str(exc)
    column = EXAMPLE_SORT[enrichment.findings[0].symptom][0] if enrichment.findings else E2E
    opened: datetime = incident["opened_at"]
    since = min((a["starts_at"] for a in alerts), default=opened) - timedelta(minutes=5)
    examples = functools.partial(_examples, requests, labels, column, since)
    enrichment.example_requests = await asyncio.get_running_loop().run_in_executor(executor, examples)
    runbook = next(
        (str(a["annotations"][RUNBOOK_ANNOTATION]) for a in alerts if RUNBOOK_ANNOTATION in a["annotations"]), None
    )
    if runbook and enrichment.findings:
        runbook = runbook.split("#", 1)[0] + "#" + enrichment.findings[0].runbook
    enrichment.runbook_url = runbook
    if settings.grafana_url:
        uids: list[str] = []
        for name in sorted(names):
            for uid in DASHBOARDS_BY_ALERT.get(name, (links.UID_FLEET,)):
                if uid not in uids:
                    uids.append(uid)
        variables = {k: labels[k] for k in links.DASHBOARD_VARIABLES if k in labels}
        enrichment.dashboards = [
            DashboardLink(
                title=links.DASHBOARD_TITLES[uid], url=links.dashboard_url(settings.grafana_url, uid, variables)
            )
            for uid in uids
        ]
    return enrichment


def _examples(engine: Engine, labels: Mapping[str, str], column: str, since: datetime) -> list[Any]:
    """The slowest requests of the alert's engine and model from one side: the engine's rows, or inferwatch
    proxy's where the engine sent none (a request both sent spans for is stored twice)."""
    sort = cast("listing.SortField", column)
    model = labels.get(V.LABEL_MODEL)
    for side in sides.EXAMPLE_SIDES:
        for by_model in (model, None) if model is not None else (None,):  # vLLM's spans carry no model name
            base = listing.RequestFilter(engine=labels.get(V.LABEL_ENGINE), model=by_model, since=since, side=side)
            found = listing.slowest_requests(engine=engine, filters=base, sort=sort, limit=EXAMPLES)
            if found:
                return found
    return []


def load_incident(conn: Connection, incident_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    incident = dict(conn.execute(select(INCIDENTS_TABLE).where(INCIDENTS_TABLE.c.id == incident_id)).mappings().one())
    alerts = [
        dict(r)
        for r in conn.execute(
            select(ALERTS_TABLE).where(ALERTS_TABLE.c.incident_id == incident_id).order_by(ALERTS_TABLE.c.id)
        ).mappings()
    ]
    return incident, alerts


def message(conn: Connection, incident_id: int, event_id: int, kind: str, settings: LinkSettings) -> IncidentMessage:
    """The message for one event of an incident (built when the event is fanned out to receivers)."""
    del event_id
    incident, alerts = load_incident(conn, incident_id)
    enrichment = Enrichment.model_validate(incident["enrichment"] or {})
    top = enrichment.findings[0] if enrichment.findings else None
    summaries = [
        AlertSummary(
            alertname=a["alertname"],
            status=a["status"],
            severity=a["severity"],
            labels=a["labels"],
            annotations=a["annotations"],
            starts_at=a["starts_at"],
            ends_at=a["ends_at"],
            generator_url=a["generator_url"],
        )
        for a in alerts
    ]
    summary = top.summary if top is not None else _annotation_summary(alerts) or incident["title"]
    event: Event = kind if kind in ("firing", "updated", "resolved") else "updated"  # type: ignore[assignment]
    return IncidentMessage(
        event=event,
        incident_id=incident_id,
        status=incident["status"],
        title=incident["title"],
        severity=incident["severity"],
        labels=incident["labels"],
        opened_at=incident["opened_at"],
        resolved_at=incident["resolved_at"],
        summary=summary,
        alerts=summaries,
        enrichment=enrichment,
        top_finding=top,
        remedy=top.remedies[0] if top is not None and top.remedies else None,
        incident_url=incident_url(settings, incident_id),
    )


def _annotation_summary(alerts: Sequence[Mapping[str, Any]]) -> str | None:
    for alert in alerts:
        for key in ("summary", "description"):
            if alert["annotations"].get(key):
                return str(alert["annotations"][key])
    return None
