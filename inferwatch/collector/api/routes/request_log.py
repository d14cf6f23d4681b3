"""``/api/v1/requests``: the stored requests (filter, sort, page) and one request's phase breakdown.

Errors: a malformed parameter is a 400 (or FastAPI's 422) naming it, never a 500; a database that
cannot be reached or does not answer within its timeouts is a 503 naming the problem, with ``Retry-After``
(:func:`unavailable`, shared by every route that reads the store).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Final, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Query

from inferwatch.collector.api.deps import READ_RESPONSES, CollectorDep, EngineDep, require_read
from inferwatch.collector.api.routes.traces import RETRY_AFTER_SECONDS
from inferwatch.collector.schemas import ErrorBody, RequestDetail, RequestDetails, RequestPage, Side
from inferwatch.collector.service import Collector
from inferwatch.collector.stats import listing, sides
from inferwatch.collector.store import db

T = TypeVar("T")

DB_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    503: {
        "model": ErrorBody,
        "description": "The database cannot be reached or did not answer in time",
        "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "string"}}},
    },
}
"""What a route reading the store may answer when the database is unavailable."""
MAX_TIME_CHARS: Final = 64

router = APIRouter(
    tags=["requests"], dependencies=[Depends(require_read)], responses={**READ_RESPONSES, **DB_RESPONSES}
)


async def query(fn: Callable[..., T], *, collector: Collector, **kwargs: Any) -> T:
    """Run a blocking store query in a worker thread; 503 when the database is unavailable. While the writer
    knows the database to be down, the query gets the readiness probe's short deadline: the answer is a
    quick 503, or the data should the database answer reads after all."""

    def run() -> T:
        if collector.writer.db_ok:
            return fn(**kwargs)
        with db.deadline(listing.READINESS_TIMEOUT_S):
            return fn(**kwargs)

    try:
        return await asyncio.to_thread(run)
    except listing.DatabaseUnavailable as exc:
        raise unavailable(exc) from None


def unavailable(exc: listing.DatabaseUnavailable) -> HTTPException:
    """The 503 of a database that cannot be reached or did not answer in time: the problem, and ``Retry-After``
    (the seconds OTLP's backpressure answers give too)."""
    return HTTPException(status_code=503, detail=str(exc), headers={"Retry-After": RETRY_AFTER_SECONDS})


def parse_time(value: str | None, name: str) -> datetime | None:
    """An ISO 8601 query parameter (naive: UTC), as UTC; 400 when it is not one or is not a UTC time
    between the years 1 and 9999."""
    if value is None:
        return None
    try:
        if len(value) > MAX_TIME_CHARS or listing.NUL in value:
            raise ValueError(value)
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return t.astimezone(UTC) if t.tzinfo else t.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        raise HTTPException(
            status_code=400, detail=f"{name} must be an ISO 8601 time (in UTC between the years 1 and 9999)"
        ) from None


@router.get("/requests", responses={400: {"model": ErrorBody, "description": "Invalid cursor, time or filter"}})
async def list_requests(
    collector: CollectorDep,
    engine: EngineDep,
    llm_engine: Annotated[str | None, Query(alias="engine")] = None,
    model: str | None = None,
    instance: str | None = None,
    finish_reason: str | None = None,
    lora_adapter: Annotated[str | None, Query(description="only requests served by this LoRA adapter")] = None,
    service: Annotated[
        str | None, Query(description="only requests whose spans came from this service (e.g. inferwatch-proxy)")
    ] = None,
    side: Annotated[
        Side | None,
        Query(
            description="engine: the engines' rows (every service but inferwatch-proxy); proxy: inferwatch "
            "proxy's; all: both (a request both sent spans for is listed twice). Default: engine, or all with "
            "`service`"
        ),
    ] = None,
    since: Annotated[str | None, Query(description="ISO 8601 start of the time range")] = None,
    until: Annotated[str | None, Query(description="ISO 8601 end of the time range")] = None,
    min_ttft: Annotated[float | None, Query(ge=0, allow_inf_nan=False, description="seconds")] = None,
    min_e2e: Annotated[float | None, Query(ge=0, allow_inf_nan=False, description="seconds")] = None,
    sort: listing.SortField = "start_time",
    order: listing.Order = "desc",
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: str | None = None,
) -> RequestPage:
    """Stored requests, newest (or slowest, with ``sort``) first; ``count`` is the total matching. By default
    the engines' rows only (a request proxied by inferwatch proxy to an engine that sends spans too is stored
    twice): ``side`` and ``service`` pick others, and the answer says which were listed."""
    try:
        filters = listing.RequestFilter(
            engine=llm_engine,
            model=model,
            instance=instance,
            finish_reason=finish_reason,
            lora_adapter=lora_adapter,
            service=service,
            side=sides.effective(side, service),
            since=parse_time(since, "since"),
            until=parse_time(until, "until"),
            min_ttft=min_ttft,
            min_e2e=min_e2e,
        )
        offset = listing.decode_cursor(cursor)
    except listing.InvalidFilter as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    except listing.InvalidCursor as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    return await query(
        listing.list_requests,
        collector=collector,
        engine=engine,
        filters=filters,
        sort=sort,
        order=order,
        limit=limit,
        offset=offset,
    )


@router.get("/requests/{request_id}", responses={404: {"model": ErrorBody, "description": "No such request"}})
async def get_request(
    collector: CollectorDep,
    engine: EngineDep,
    request_id: str,
    instance: Annotated[
        str | None, Query(description="Only this instance's rows (request ids repeat across replicas)")
    ] = None,
) -> RequestDetail | RequestDetails:
    """One request (by row id, request id or span id) with its phase breakdown; several rows as a list:
    the samples of an ``n>1`` request, or the same request id on several replicas (``instances`` lists
    them; ``?instance=`` picks one)."""
    rows = await query(
        listing.find_requests, collector=collector, engine=engine, request_id=request_id, instance=instance
    )
    if not rows:
        where = f" on instance {instance!r}" if instance is not None else ""
        raise HTTPException(status_code=404, detail=f"no request {request_id!r}{where}")
    if len(rows) == 1:
        return rows[0]
    instances = list(dict.fromkeys(row.instance for row in rows))
    return RequestDetails(data=rows, count=len(rows), instances=instances)
