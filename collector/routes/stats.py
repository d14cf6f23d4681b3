"""``/api/v1/stats``: exact percentiles, counts and goodput over a time window."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from inferwatch.collector import store
from inferwatch.collector.config import parse_duration
from inferwatch.collector.deps import READ_RESPONSES, CollectorDep, EngineDep, require_read
from inferwatch.collector.routes.requests import DB_RESPONSES, query
from inferwatch.collector.schemas import ErrorBody, GroupBy, Stats
from inferwatch.core.schema import E2E, QUEUE, TPOT, TTFT

router = APIRouter(
    tags=["requests"], dependencies=[Depends(require_read)], responses={**READ_RESPONSES, **DB_RESPONSES}
)

Slo = Annotated[float | None, Query(gt=0, allow_inf_nan=False, description="seconds")]


@router.get(
    "/stats",
    response_model_exclude_unset=True,
    responses={400: {"model": ErrorBody, "description": "Invalid window"}},
)
async def stats(
    collector: CollectorDep,
    engine: EngineDep,
    window: Annotated[str, Query(description="e.g. 1h, 30m, 7d (the requests that finished in it)")] = "1h",
    group_by: GroupBy = "none",
    slo_ttft: Slo = None,
    slo_tpot: Slo = None,
    slo_e2e: Slo = None,
    slo_queue: Slo = None,
) -> Stats:
    """Exact p50/p90/p95/p99 of TTFT, TPOT, e2e and queue time over the requests that finished in the
    window, counts, token sums (null when no request reports them), and goodput.

    A request is good when it did not fail and each given SLO holds (TPOT of single-token outputs
    counts as 0): vLLM's benchmark definition of goodput.
    """
    try:
        delta = parse_duration(window)
    except (ValueError, OverflowError):
        raise HTTPException(status_code=400, detail=f"invalid window {window[:40]!r}: e.g. 1h, 30m, 7d") from None
    if not delta.total_seconds() > 0 or delta > store.MAX_WINDOW:
        raise HTTPException(
            status_code=400, detail=f"window must be longer than 0 s and at most {store.MAX_WINDOW.days} days"
        )
    slos = {
        field: value
        for field, value in ((TTFT, slo_ttft), (TPOT, slo_tpot), (E2E, slo_e2e), (QUEUE, slo_queue))
        if value is not None
    }
    return await query(
        store.compute_stats, collector=collector, engine=engine, window=delta, group_by=group_by, slos=slos
    )
