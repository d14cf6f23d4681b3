"""The on-call read API: requests (filter, sort, page), one request's phases, exact stats and goodput."""

from __future__ import annotations

import asyncio
import base64
import json
import math
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy import Column, Engine, Table, and_, case, func, select, true
from sqlalchemy.sql.elements import ColumnElement

from inferwatch.collector import record as R
from inferwatch.collector.config import parse_duration
from inferwatch.collector.models import Base

router = APIRouter(tags=["requests"])

SortField = Literal[
    "start_time",
    "time_to_first_token",
    "time_per_output_token",
    "request_duration",
    "request_queue",
    "request_prefill",
    "request_decode",
    "prompt_tokens",
    "generation_tokens",
]
GroupBy = Literal["none", "engine", "model", "instance"]
PERCENTILES = (0.5, 0.9, 0.95, 0.99)
STAT_FIELDS = (R.TTFT, R.TPOT, R.E2E, R.QUEUE)
FAILED = ("error", "abort")


def requests_table() -> Table:
    for table in Base.metadata.sorted_tables:
        if "trace_id" in table.c and "span_id" in table.c:
            return table
    raise RuntimeError("collector.models defines no request table")


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.collector.engine
    return engine


def _row(row: Any) -> dict[str, Any]:
    out = dict(row._mapping)
    for k, v in out.items():
        if isinstance(v, datetime):
            out[k] = (v if v.tzinfo else v.replace(tzinfo=UTC)).isoformat()
    return out


def _cursor_encode(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode().rstrip("=")


def _cursor_decode(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        pad = "=" * (-len(cursor) % 4)
        offset = int(json.loads(base64.urlsafe_b64decode(cursor + pad))["o"])
    except (ValueError, KeyError, TypeError):
        raise HTTPException(status_code=400, detail="invalid cursor") from None
    if offset < 0:
        raise HTTPException(status_code=400, detail="invalid cursor")
    return offset


def _parse_time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise HTTPException(status_code=400, detail=f"{name} must be an ISO 8601 time") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@router.get("/requests")
async def list_requests(
    request: Request,
    engine: str | None = None,
    model: str | None = None,
    instance: str | None = None,
    finish_reason: str | None = None,
    since: Annotated[str | None, Query(description="ISO 8601 start of the time range")] = None,
    until: Annotated[str | None, Query(description="ISO 8601 end of the time range")] = None,
    min_ttft: Annotated[float | None, Query(ge=0, description="seconds")] = None,
    min_e2e: Annotated[float | None, Query(ge=0, description="seconds")] = None,
    sort: SortField = "start_time",
    order: Literal["asc", "desc"] = "desc",
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: str | None = None,
) -> dict[str, Any]:
    """Stored requests, newest (or slowest, with ``sort``) first; ``count`` is the total matching."""
    t = requests_table()
    conds: list[ColumnElement[bool]] = []
    for col, val in (("engine", engine), ("model", model), ("instance", instance), ("finish_reason", finish_reason)):
        if val is not None:
            conds.append(t.c[col] == val)
    start, end = _parse_time(since, "since"), _parse_time(until, "until")
    if start:
        conds.append(t.c.start_time >= start)
    if end:
        conds.append(t.c.start_time < end)
    if min_ttft is not None:
        conds.append(t.c[R.TTFT] >= min_ttft)
    if min_e2e is not None:
        conds.append(t.c[R.E2E] >= min_e2e)
    where = and_(*conds) if conds else None
    offset = _cursor_decode(cursor)
    key = t.c[sort]
    ordering = [key.desc().nulls_last() if order == "desc" else key.asc().nulls_last(), t.c.id.desc()]

    def query() -> tuple[list[dict[str, Any]], int]:
        with _engine(request).connect() as conn:
            q = select(t).order_by(*ordering).limit(limit + 1).offset(offset)
            c = select(func.count()).select_from(t)
            if where is not None:
                q, c = q.where(where), c.where(where)
            rows = [_row(r) for r in conn.execute(q)]
            return rows, int(conn.execute(c).scalar_one())

    rows, count = await asyncio.to_thread(query)
    more = len(rows) > limit
    body: dict[str, Any] = {"data": rows[:limit], "count": count}
    body["next_cursor"] = _cursor_encode(offset + limit) if more else None
    return body


@router.get("/requests/{request_id}")
async def get_request(request: Request, request_id: str) -> dict[str, Any]:
    """One request (by row id, request id or span id) with its phase breakdown."""
    t = requests_table()

    def query() -> list[dict[str, Any]]:
        with _engine(request).connect() as conn:
            cond = t.c.request_id == request_id
            if request_id.isdigit():
                cond = cond | (t.c.id == int(request_id))
            if len(request_id) == 16:
                cond = cond | (t.c.span_id == request_id.lower())
            return [_row(r) for r in conn.execute(select(t).where(cond).order_by(t.c.id))]

    rows = await asyncio.to_thread(query)
    if not rows:
        raise HTTPException(status_code=404, detail=f"no request {request_id!r}")
    for row in rows:
        e2e = row.get(R.E2E) or 0.0
        phases = {
            name: row.get(col) for name, col in (("queue", R.QUEUE), ("prefill", R.PREFILL), ("decode", R.DECODE))
        }
        known = sum(v for v in phases.values() if v is not None)
        row["phases"] = {
            name: {"seconds": v, "share": (v / e2e if e2e and v is not None else None)} for name, v in phases.items()
        }
        row["phases"]["other"] = {
            "seconds": max(e2e - known, 0.0),
            "share": (max(e2e - known, 0.0) / e2e) if e2e else None,
        }
    return rows[0] if len(rows) == 1 else {"data": rows, "count": len(rows)}


def _nearest_rank(n: int, q: float) -> int:
    """0-based index of the q-quantile by the nearest-rank definition (exact, an observed value)."""
    return max(0, min(n - 1, math.ceil(q * n) - 1))


def _percentiles(engine: Engine, t: Table, field: str, cond: ColumnElement[bool], n: int) -> dict[str, float | None]:
    """Exact nearest-rank percentiles of one column, walking its (latency, time, engine, model) index
    from the nearer end (the high percentiles are a short walk down from the maximum)."""
    col = t.c[field]
    fcond = and_(cond, col.is_not(None))
    out: dict[str, float | None] = {}
    with engine.connect() as conn:
        for q_ in PERCENTILES:
            name = f"p{round(q_ * 100)}"
            if n == 0:
                out[name] = None
                continue
            idx = _nearest_rank(n, q_)
            if idx < n // 2:
                q_sel = select(col).where(fcond).order_by(col.asc()).limit(1).offset(idx)
            else:
                q_sel = select(col).where(fcond).order_by(col.desc()).limit(1).offset(n - 1 - idx)
            out[name] = float(conn.execute(q_sel).scalar_one())
    return out


def compute_stats(
    engine: Engine, window: timedelta, group_by: str, slos: dict[str, float], now: datetime | None = None
) -> dict[str, Any]:
    """Exact percentiles (nearest rank over the stored rows), counts and goodput per group."""
    t = requests_table()
    now = now or datetime.now(UTC)
    since = now - window
    group_col: Column[Any] | None = None if group_by == "none" else t.c[group_by]
    base_cond: ColumnElement[bool] = t.c.start_time >= since
    failed = func.coalesce(t.c.finish_reason, "").in_(FAILED) | t.c.error.is_not(None)
    good_conds: list[ColumnElement[bool]] = [~failed]
    for field, limit in slos.items():
        col = t.c[field]
        if field == R.TPOT:
            good_conds.append((col <= limit) | (func.coalesce(t.c[R.GENERATION_TOKENS], 0) <= 1))
        else:
            good_conds.append(col <= limit)
    good = case((and_(*good_conds), 1), else_=0)
    cols: list[Any] = [
        func.count().label("requests"),
        func.sum(case((failed, 1), else_=0)).label("failed"),
        func.coalesce(func.sum(t.c[R.PROMPT_TOKENS]), 0).label("prompt_tokens"),
        func.coalesce(func.sum(t.c[R.GENERATION_TOKENS]), 0).label("generation_tokens"),
        func.sum(good).label("good"),
        *(func.count(t.c[f]).label(f"n_{f}") for f in STAT_FIELDS),
    ]
    groups: list[dict[str, Any]] = []
    with engine.connect() as conn:
        oldest = conn.execute(select(func.min(t.c.start_time))).scalar_one_or_none()
        if oldest is not None and (oldest if oldest.tzinfo else oldest.replace(tzinfo=UTC)) >= since:
            base_cond = true()  # the window holds every row: index walks need no time filter
        q = select(*([group_col] if group_col is not None else []), *cols).where(base_cond)
        if group_col is not None:
            q = q.group_by(group_col).order_by(group_col)
        for row in conn.execute(q):
            m = row._mapping
            key = m[group_col.name] if group_col is not None else None
            cond = base_cond if group_col is None else and_(base_cond, group_col == key)
            entry: dict[str, Any] = {
                "requests": int(m["requests"]),
                "failed": int(m["failed"] or 0),
                "prompt_tokens": int(m["prompt_tokens"]),
                "generation_tokens": int(m["generation_tokens"]),
            }
            if group_col is not None:
                entry[group_by] = key
            # one field per thread: the database walks its indexes outside the GIL
            with ThreadPoolExecutor(max_workers=len(STAT_FIELDS)) as pool:
                futures = [pool.submit(_percentiles, engine, t, f, cond, int(m[f"n_{f}"])) for f in STAT_FIELDS]
                for field, future in zip(STAT_FIELDS, futures, strict=True):
                    entry[field] = {"count": int(m[f"n_{field}"]), **future.result()}
            if slos:
                good_n = int(m["good"] or 0)
                entry["goodput"] = {
                    "slos": slos,
                    "good_requests": good_n,
                    "share": good_n / entry["requests"] if entry["requests"] else None,
                    "rate_per_second": good_n / window.total_seconds(),
                }
            groups.append(entry)
    return {"window_seconds": window.total_seconds(), "since": since.isoformat(), "group_by": group_by, "data": groups}


@router.get("/stats")
async def stats(
    request: Request,
    window: Annotated[str, Query(description="e.g. 1h, 30m, 7d")] = "1h",
    group_by: GroupBy = "none",
    slo_ttft: Annotated[float | None, Query(gt=0, description="seconds")] = None,
    slo_tpot: Annotated[float | None, Query(gt=0, description="seconds")] = None,
    slo_e2e: Annotated[float | None, Query(gt=0, description="seconds")] = None,
    slo_queue: Annotated[float | None, Query(gt=0, description="seconds")] = None,
) -> dict[str, Any]:
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
        for field, value in ((R.TTFT, slo_ttft), (R.TPOT, slo_tpot), (R.E2E, slo_e2e), (R.QUEUE, slo_queue))
        if value is not None
    }
    return await asyncio.to_thread(compute_stats, _engine(request), delta, group_by, slos)
