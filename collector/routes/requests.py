"""``/api/v1/requests``: the stored requests (filter, sort, page) and one request's phase breakdown."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from inferwatch.collector import store
from inferwatch.collector.deps import READ_RESPONSES, EngineDep, require_read
from inferwatch.collector.schemas import ErrorBody, RequestDetail, RequestDetails, RequestPage

router = APIRouter(tags=["requests"], dependencies=[Depends(require_read)], responses=READ_RESPONSES)


def parse_time(value: str | None, name: str) -> datetime | None:
    """An ISO 8601 query parameter (naive: UTC); 400 when it is not one."""
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise HTTPException(status_code=400, detail=f"{name} must be an ISO 8601 time") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@router.get("/requests", responses={400: {"model": ErrorBody, "description": "Invalid cursor or time"}})
async def list_requests(
    engine: EngineDep,
    llm_engine: Annotated[str | None, Query(alias="engine")] = None,
    model: str | None = None,
    instance: str | None = None,
    finish_reason: str | None = None,
    since: Annotated[str | None, Query(description="ISO 8601 start of the time range")] = None,
    until: Annotated[str | None, Query(description="ISO 8601 end of the time range")] = None,
    min_ttft: Annotated[float | None, Query(ge=0, description="seconds")] = None,
    min_e2e: Annotated[float | None, Query(ge=0, description="seconds")] = None,
    sort: store.SortField = "start_time",
    order: store.Order = "desc",
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: str | None = None,
) -> RequestPage:
    """Stored requests, newest (or slowest, with ``sort``) first; ``count`` is the total matching."""
    filters = store.RequestFilter(
        engine=llm_engine,
        model=model,
        instance=instance,
        finish_reason=finish_reason,
        since=parse_time(since, "since"),
        until=parse_time(until, "until"),
        min_ttft=min_ttft,
        min_e2e=min_e2e,
    )
    try:
        offset = store.decode_cursor(cursor)
    except store.InvalidCursor as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    return await asyncio.to_thread(
        store.list_requests, engine=engine, filters=filters, sort=sort, order=order, limit=limit, offset=offset
    )


@router.get("/requests/{request_id}", responses={404: {"model": ErrorBody, "description": "No such request"}})
async def get_request(engine: EngineDep, request_id: str) -> RequestDetail | RequestDetails:
    """One request (by row id, request id or span id) with its phase breakdown; several rows (the
    samples of an ``n>1`` request) as a list."""
    rows = await asyncio.to_thread(store.find_requests, engine=engine, request_id=request_id)
    if not rows:
        raise HTTPException(status_code=404, detail=f"no request {request_id!r}")
    return rows[0] if len(rows) == 1 else RequestDetails(data=rows, count=len(rows))
