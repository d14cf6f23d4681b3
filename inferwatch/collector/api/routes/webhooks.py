"""Alertmanager's webhook (``POST /api/v1/alerts/webhook``), the incidents API and the incident page.

A database that cannot be reached or does not answer within its timeouts is a 503 naming the problem on every
route, as on the read API (Alertmanager retries a webhook answered 5xx): never a 500, never a hang.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse

from inferwatch.collector.api.deps import READ_RESPONSES, Bearer, CollectorDep, EngineDep, check_token, require_ingest
from inferwatch.collector.api.routes.request_log import DB_RESPONSES, parse_time, query
from inferwatch.collector.incidents import views
from inferwatch.collector.incidents.enrich import incident_key
from inferwatch.collector.incidents.page import CONTENT_SECURITY_POLICY, render
from inferwatch.collector.incidents.payload import AmNotification, PayloadError, parse
from inferwatch.collector.schemas import ErrorBody
from inferwatch.collector.service import Collector
from inferwatch.collector.stats import listing

T = TypeVar("T")

INGEST_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    400: {
        "model": ErrorBody,
        "description": "Not an Alertmanager version-4 webhook payload, or beyond a limit (nothing stored; the"
        " message names the field and the limit: nesting, sizes, truncatedAlerts, the time window, alertname)",
    },
    401: {"model": ErrorBody, "description": "No bearer token of the ingest scope"},
    413: {"model": ErrorBody, "description": "Body larger than the limit"},
    **DB_RESPONSES,
}
MAX_ID: Final = 2**62

webhook_router = APIRouter(tags=["alerts"])
api_router = APIRouter(tags=["alerts"], responses=DB_RESPONSES)
page_router = APIRouter(tags=["alerts"])


async def _db(fn: Callable[..., T], collector: Collector, **kwargs: Any) -> T:
    """Run a blocking database function in a worker thread: 503 naming the problem when the database cannot be
    reached or does not answer in time (a short deadline while the writer knows it to be down)."""
    return await query(listing.guarded(fn), collector=collector, **kwargs)


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """The model's JSON schema with its ``$defs`` inlined (the OpenAPI document has no place for them)."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(dict(defs[ref.rsplit("/", 1)[1]]))
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    inlined: dict[str, Any] = walk(schema)
    return inlined


WEBHOOK_BODY: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": _inline(AmNotification.model_json_schema())}},
    }
}


@webhook_router.post(
    "/alerts/webhook",
    dependencies=[Depends(require_ingest)],
    responses=INGEST_RESPONSES,
    status_code=200,
    openapi_extra=WEBHOOK_BODY,
)
async def webhook(
    request: Request,
    collector: CollectorDep,
    severity: Annotated[
        str | None, Query(description="the route's severity (the generated configuration adds it)")
    ] = None,
) -> views.WebhookAccepted:
    """Receive one Alertmanager notification (webhook payload version 4).

    Each alert is stored once (fingerprint and startsAt); re-sends change nothing but when it was
    last seen; every change of state is forwarded once to the notify file's receivers, enriched.
    """
    del severity
    limit = collector.settings.max_webhook_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(status_code=413, detail=f"body exceeds the {limit}-byte limit")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise HTTPException(status_code=413, detail=f"body exceeds the {limit}-byte limit")
    now = datetime.now(UTC)
    try:  # in a thread: linear in the body, but a megabyte of JSON takes tens of milliseconds
        note = await asyncio.to_thread(parse, bytes(body), now)
    except PayloadError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    intake = await _db(collector.intaker.record, collector, note=note, now=now)
    collector.alerts.wake()
    return views.WebhookAccepted(
        notification_id=intake.notification_id,
        new_alerts=intake.new_alerts,
        resolved_alerts=intake.resolved_alerts,
        repeats=intake.repeats,
        incidents=intake.incident_ids,
    )


def _read(collector: CollectorDep, creds: Bearer) -> None:
    check_token(collector, creds, "read")


IncidentId = Annotated[int, Path(ge=1, lt=MAX_ID, description="the incident's id")]


@api_router.get(
    "/incidents",
    dependencies=[Depends(_read)],
    responses={**READ_RESPONSES, 400: {"model": ErrorBody, "description": "Invalid cursor or time"}},
)
async def list_incidents(
    collector: CollectorDep,
    engine: EngineDep,
    status: Literal["firing", "resolved"] | None = None,
    since: Annotated[str | None, Query(description="ISO 8601: incidents updated since")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: str | None = None,
) -> views.IncidentPage:
    """Incidents, newest first; ``count`` is the total matching."""
    try:
        offset = views.decode_cursor(cursor)
    except views.InvalidCursor as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    start = parse_time(since, "since")
    return await _db(
        views.list_incidents, collector, engine=engine, status=status, since=start, limit=limit, offset=offset
    )


@api_router.get(
    "/incidents/{incident_id}",
    dependencies=[Depends(_read)],
    responses={**READ_RESPONSES, 404: {"model": ErrorBody, "description": "No such incident"}},
)
async def get_incident(collector: CollectorDep, engine: EngineDep, incident_id: IncidentId) -> views.IncidentDetail:
    """One incident: its alerts, timeline, enrichment, and each delivery with its attempts and last error."""
    detail = await _db(views.incident_detail, collector, engine=engine, incident_id=incident_id)
    if detail is None:
        raise HTTPException(status_code=404, detail=f"no incident {incident_id}")
    return detail


ERROR_JSON: Final = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}


@page_router.get(
    "/incidents/{incident_id}",
    response_class=HTMLResponse,
    responses={
        200: {"content": {"text/html": {"schema": {"type": "string"}}}, "description": "The incident page"},
        401: {"content": ERROR_JSON, "description": "Neither a read token nor the link's key"},
        404: {"content": ERROR_JSON, "description": "No such incident"},
        503: {"content": ERROR_JSON, "description": "The database cannot be reached or did not answer in time"},
    },
)
async def incident_page(
    collector: CollectorDep,
    engine: EngineDep,
    creds: Bearer,
    incident_id: IncidentId,
    key: Annotated[str | None, Query(description="the signed key of a forwarded link")] = None,
) -> HTMLResponse:
    """The incident page: what fired, the diagnosis and its evidence, the slowest requests, the remedy, links."""
    # bytes, not str: compare_digest refuses non-ASCII str (a 500 on a hand-edited link)
    expected = incident_key(collector.alerts.links.secret, incident_id).encode()
    signed = key is not None and hmac.compare_digest(key.encode("utf-8", "surrogatepass"), expected)
    if not signed:
        check_token(collector, creds, "read")
    detail = await _db(views.incident_detail, collector, engine=engine, incident_id=incident_id)
    if detail is None:
        raise HTTPException(status_code=404, detail=f"no incident {incident_id}")
    return HTMLResponse(render(detail), headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY})
