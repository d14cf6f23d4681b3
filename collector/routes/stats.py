"""``/api/v1/stats``: exact percentiles, counts and goodput over a time window."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from inferwatch.collector import store
from inferwatch.collector.config import parse_duration
from inferwatch.collector.deps import READ_RESPONSES, EngineDep, require_read
from inferwatch.collector.schemas import ErrorBody, GroupBy, Stats
from inferwatch.core.schema import E2E, QUEUE, TPOT, TTFT

router = APIRouter(tags=["requests"], dependencies=[Depends(require_read)], responses=READ_RESPONSES)


@router.get(
    "/stats",
    response_model_exclude_unset=True,
    responses={400: {"model": ErrorBody, "description": "Invalid window"}},
)
async def stats(
    engine: EngineDep,
    window: Annotated[str, Query(description="e.g. 1h, 30m, 7d")] = "1h",
    group_by: GroupBy = "none",
    slo_ttft: Annotated[float | None, Query(gt=0, description="seconds")] = None,
    slo_tpot: Annotated[float | None, Query(gt=0, description="seconds")] = None,
    slo_e2e: Annotated[float | None, Query(gt=0, description="seconds")] = None,
    slo_queue: Annotated[float | None, Query(gt=0, description="seconds")] = None,
) -> Stats:
    """Exact p50/p90/p95/p99 of TTFT, TPOT, e2e and queue time from the rows, counts, and goodput.

    A request is good when it did not fail and each given SLO holds (TPOT of single-token outputs
    counts as 0): vLLM's benchmark definition of goodput.
    """
    try:
        delta = parse_duration(window)
    except ValueError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    slos = {
        field: value
        for field, value in ((TTFT, slo_ttft), (TPOT, slo_tpot), (E2E, slo_e2e), (QUEUE, slo_queue))
        if value is not None
    }
    return await asyncio.to_thread(store.compute_stats, engine=engine, window=delta, group_by=group_by, slos=slos)
