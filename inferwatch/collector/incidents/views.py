"""The incidents as the read API returns them (pydantic: ``/openapi.json`` documents every field), and
the queries that build them."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import Engine, and_, case, func, select

from inferwatch.collector.incidents.messages import AlertSummary, Enrichment
from inferwatch.collector.store.tables import (
    ALERTS_TABLE,
    DELIVERIES_TABLE,
    DELIVERY_ATTEMPTS_TABLE,
    INCIDENT_EVENTS_TABLE,
    INCIDENTS_TABLE,
)

Status = Literal["firing", "resolved"]


class WebhookAccepted(BaseModel):
    notification_id: int
    new_alerts: int
    resolved_alerts: int
    repeats: int = Field(description="alerts already stored in this state (a re-send)")
    incidents: list[int]


class IncidentSummary(BaseModel):
    id: int
    status: Status
    title: str
    severity: str | None
    labels: dict[str, str]
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    alerts: int
    firing_alerts: int
    top_finding: str | None = Field(description="the summary of the enrichment's most severe finding")


class IncidentPage(BaseModel):
    data: list[IncidentSummary]
    count: int
    next_cursor: str | None


class TimelineEntry(BaseModel):
    at: datetime
    kind: str
    detail: str
    forwarded: bool


class Attempt(BaseModel):
    at: datetime
    status_code: int | None
    error: str | None
    duration_seconds: float


class Delivery(BaseModel):
    id: int
    receiver: str
    format: str
    event: str
    state: Literal["pending", "delivered", "dead"]
    attempts: int
    max_attempts: int
    created_at: datetime
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    last_status: int | None
    last_error: str | None
    attempt_log: list[Attempt]


class IncidentDetail(IncidentSummary):
    enrichment_state: str
    enrichment: Enrichment | None
    alert_list: list[AlertSummary]
    timeline: list[TimelineEntry]
    deliveries: list[Delivery]


class InvalidCursor(ValueError):
    pass


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        offset = int(json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))["o"])
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidCursor("invalid cursor") from exc
    if not 0 <= offset < 2**62:
        raise InvalidCursor("invalid cursor")
    return offset


def _summary(row: Any, counts: dict[int, tuple[int, int]]) -> dict[str, Any]:
    total, firing = counts.get(row.id, (0, 0))
    enrichment = row.enrichment or {}
    findings = enrichment.get("findings") or []
    return {
        "id": row.id,
        "status": row.status,
        "title": row.title,
        "severity": row.severity,
        "labels": row.labels,
        "opened_at": row.opened_at,
        "updated_at": row.updated_at,
        "resolved_at": row.resolved_at,
        "alerts": total,
        "firing_alerts": firing,
        "top_finding": findings[0]["summary"] if findings else None,
    }


def _alert_counts(engine: Engine, ids: list[int]) -> dict[int, tuple[int, int]]:
    if not ids:
        return {}
    a = ALERTS_TABLE
    firing = func.sum(case((a.c.status == "firing", 1), else_=0))
    q = select(a.c.incident_id, func.count(), firing).where(a.c.incident_id.in_(ids)).group_by(a.c.incident_id)
    with engine.connect() as conn:
        return {int(r[0]): (int(r[1]), int(r[2] or 0)) for r in conn.execute(q)}


def list_incidents(
    *, engine: Engine, status: Status | None, since: datetime | None, limit: int, offset: int
) -> IncidentPage:
    i = INCIDENTS_TABLE
    conds = []
    if status is not None:
        conds.append(i.c.status == status)
    if since is not None:
        conds.append(i.c.updated_at >= since)
    where = and_(*conds) if conds else None
    q = select(i).order_by(i.c.opened_at.desc(), i.c.id.desc()).limit(limit + 1).offset(offset)
    c = select(func.count()).select_from(i)
    if where is not None:
        q, c = q.where(where), c.where(where)
    with engine.connect() as conn:
        rows = list(conn.execute(q))
        count = int(conn.execute(c).scalar_one())
    more = len(rows) > limit
    rows = rows[:limit]
    counts = _alert_counts(engine, [r.id for r in rows])
    return IncidentPage(
        data=[IncidentSummary.model_validate(_summary(r, counts)) for r in rows],
        count=count,
        next_cursor=encode_cursor(offset + limit) if more else None,
    )


def incident_detail(*, engine: Engine, incident_id: int) -> IncidentDetail | None:
    i, a, e, d, t = INCIDENTS_TABLE, ALERTS_TABLE, INCIDENT_EVENTS_TABLE, DELIVERIES_TABLE, DELIVERY_ATTEMPTS_TABLE
    with engine.connect() as conn:
        row = conn.execute(select(i).where(i.c.id == incident_id)).first()
        if row is None:
            return None
        alerts = list(conn.execute(select(a).where(a.c.incident_id == incident_id).order_by(a.c.id)))
        events = list(conn.execute(select(e).where(e.c.incident_id == incident_id).order_by(e.c.at, e.c.id)))
        kinds = {ev.id: ev.kind for ev in events}
        deliveries = list(conn.execute(select(d).where(d.c.incident_id == incident_id).order_by(d.c.id)))
        attempts: dict[int, list[Attempt]] = {}
        if deliveries:
            q = select(t).where(t.c.delivery_id.in_([x.id for x in deliveries])).order_by(t.c.at, t.c.id)
            for att in conn.execute(q):
                attempts.setdefault(att.delivery_id, []).append(
                    Attempt(
                        at=att.at, status_code=att.status_code, error=att.error, duration_seconds=att.duration_seconds
                    )
                )
    firing = sum(1 for x in alerts if x.status == "firing")
    base = _summary(row, {incident_id: (len(alerts), firing)})
    return IncidentDetail.model_validate(
        {
            **base,
            "enrichment_state": row.enrichment_state,
            "enrichment": Enrichment.model_validate(row.enrichment) if row.enrichment else None,
            "alert_list": [
                AlertSummary(
                    alertname=x.alertname,
                    status=x.status,
                    severity=x.severity,
                    labels=x.labels,
                    annotations=x.annotations,
                    starts_at=x.starts_at,
                    ends_at=x.ends_at,
                    generator_url=x.generator_url,
                )
                for x in alerts
            ],
            "timeline": [
                TimelineEntry(at=ev.at, kind=ev.kind, detail=ev.detail, forwarded=ev.forward) for ev in events
            ],
            "deliveries": [
                Delivery(
                    id=x.id,
                    receiver=x.receiver,
                    format=x.format,
                    event=kinds.get(x.event_id, ""),
                    state=x.state,
                    attempts=x.attempts,
                    max_attempts=x.max_attempts,
                    created_at=x.created_at,
                    next_attempt_at=x.next_attempt_at if x.state == "pending" else None,
                    delivered_at=x.delivered_at,
                    last_status=x.last_status,
                    last_error=x.last_error,
                    attempt_log=attempts.get(x.id, []),
                )
                for x in deliveries
            ],
        }
    )
