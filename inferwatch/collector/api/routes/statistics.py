"""``/api/v1/stats``: percentiles (exact, or sketched beyond 5M requests), counts and goodput over a time window."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from inferwatch.collector.api.deps import READ_RESPONSES, CollectorDep, StatsEngineDep, require_read
from inferwatch.collector.api.routes.request_log import DB_RESPONSES, parse_time, query
from inferwatch.collector.schemas import ErrorBody, GroupBy, Side, Stats
from inferwatch.collector.settings import parse_duration
from inferwatch.collector.stats import listing, planner, sides, windowing
from inferwatch.collector.stats.planner import StatsMode
from inferwatch.core.schema import E2E, QUEUE, TPOT, TTFT

router = APIRouter(
    tags=["requests"], dependencies=[Depends(require_read)], responses={**READ_RESPONSES, **DB_RESPONSES}
)

Slo = Annotated[float | None, Query(gt=0, allow_inf_nan=False, description="seconds")]


@router.get(
    "/stats",
    response_model_exclude_unset=True,
    responses={400: {"model": ErrorBody, "description": "Invalid window, time range or filter"}},
)
async def stats(
    collector: CollectorDep,
    engine: StatsEngineDep,
    window: Annotated[
        str, Query(description="e.g. 1h, 30m, 7d: the requests that finished in it, counted back from `until` or now")
    ] = "1h",
    group_by: GroupBy = "none",
    llm_engine: Annotated[str | None, Query(alias="engine", description="only this engine's requests")] = None,
    model: Annotated[str | None, Query(description="only this model's requests")] = None,
    instance: Annotated[str | None, Query(description="only this instance's requests")] = None,
    service: Annotated[
        str | None, Query(description="only the rows of this OTLP service.name (e.g. inferwatch-proxy)")
    ] = None,
    side: Annotated[
        Side | None,
        Query(
            description="engine: the engines' rows (every service but inferwatch-proxy); proxy: inferwatch "
            "proxy's; all: both (a request both sent spans for counts twice). Default: engine, or all with `service`"
        ),
    ] = None,
    since: Annotated[
        str | None, Query(description="ISO 8601: the requests that finished at or after this (instead of `window`)")
    ] = None,
    until: Annotated[str | None, Query(description="ISO 8601: only the requests that finished before this")] = None,
    percentiles: Annotated[
        StatsMode,
        Query(
            description="auto: exact up to 5M requests in the window, sketched (within 1%) beyond; "
            "exact or sketch: always that"
        ),
    ] = "auto",
    slo_ttft: Slo = None,
    slo_tpot: Slo = None,
    slo_e2e: Slo = None,
    slo_queue: Slo = None,
) -> Stats:
    """p50/p90/p95/p99 of TTFT, TPOT, e2e and queue time over the requests that finished in the window
    (nearest rank; each field says whether exact or sketched, and the relative error bound), counts and
    token sums (exact; null when no request reports them), and goodput.

    A request is good when it did not fail and each given SLO holds (TPOT of single-token outputs
    counts as 0): vLLM's benchmark definition of goodput.

    One side at a time: where both an engine and inferwatch proxy send spans, each proxied request is stored
    twice (the proxy's row has service ``inferwatch-proxy``). By default only the engines' rows count (each
    request once); ``side=proxy`` counts the proxy's (the client's view), ``service`` one service's, ``side=all``
    both. ``side`` and ``service`` in the answer say which rows were counted.
    """
    try:
        delta = parse_duration(window)
    except (ValueError, OverflowError):
        raise HTTPException(status_code=400, detail=f"invalid window {window[:40]!r}: e.g. 1h, 30m, 7d") from None
    if not delta.total_seconds() > 0 or delta > planner.MAX_WINDOW:
        raise HTTPException(
            status_code=400, detail=f"window must be longer than 0 s and at most {planner.MAX_WINDOW.days} days"
        )
    slos = {
        field: value
        for field, value in ((TTFT, slo_ttft), (TPOT, slo_tpot), (E2E, slo_e2e), (QUEUE, slo_queue))
        if value is not None
    }
    start, end = parse_time(since, "since"), parse_time(until, "until")
    if start is not None and end is not None and end <= start:
        raise HTTPException(status_code=400, detail="until must be after since")
    try:
        filters = windowing.StatsFilter(
            engine=llm_engine, model=model, instance=instance, service=service, side=sides.effective(side, service)
        )
    except listing.InvalidFilter as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    return await query(
        planner.compute_stats,
        collector=collector,
        engine=engine,
        window=delta,
        group_by=group_by,
        slos=slos,
        filters=filters,
        since=start,
        until=end,
        mode=percentiles,
    )
