"""``/api/v1/usage``: requests, tokens, SLO attainment and cost per tenant or model (chargeback).

JSON by default, CSV with ``format=csv`` or ``Accept: text/csv``. Bounded: a range of at most
:data:`MAX_RANGE`, at most ``limit`` groups (the rest summed). Errors as the other store routes: a malformed
parameter is a 400 (FastAPI's own 422 for a wrong type or choice), an unavailable database a 503 with
``Retry-After``. The figures: :mod:`inferwatch.collector.stats.usage`.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response

from inferwatch.collector.api.deps import READ_RESPONSES, CollectorDep, StatsEngineDep, require_read
from inferwatch.collector.api.routes.request_log import DB_RESPONSES, parse_time, query
from inferwatch.collector.api.routes.statistics import Slo
from inferwatch.collector.diagnosis.diagnoser import NotConfigured
from inferwatch.collector.diagnosis.signals import UpstreamError
from inferwatch.collector.schemas import ErrorBody, Side, SloSource, Usage, UsageGroup, UsageGroupBy
from inferwatch.collector.stats import listing, usage
from inferwatch.core import vocabulary as V
from inferwatch.core.schema import E2E, QUEUE, TPOT, TTFT

MAX_RANGE: Final = timedelta(days=366)
"""A year and a day: a billing period of any length up to a year."""
DEFAULT_RANGE: Final = timedelta(days=1)
MAX_GROUPS: Final = 10_000
MAX_FILTER_CHARS: Final = 256
CSV_TYPE: Final = "text/csv"
CSV_RISKY: Final = ("=", "+", "-", "@", "\t", "\r")
"""A spreadsheet reads a cell that starts with one of these as a formula (CSV injection): such text is quoted
with a leading apostrophe. Tenants and models are chosen by clients."""

router = APIRouter(
    tags=["requests"], dependencies=[Depends(require_read)], responses={**READ_RESPONSES, **DB_RESPONSES}
)


async def prices(collector: Any, until: datetime, seconds: int) -> tuple[dict[str, float] | None, str | None]:
    """Per model, USD per million generated tokens over the range (Prometheus' cost records), or None and why."""
    record = V.COST_PER_MILLION_GENERATION_RECORD
    try:
        found = await collector.oncall.cost_per_million(until.timestamp(), seconds)
    except NotConfigured:
        return None, (
            "no cost: the collector has no Prometheus (--prometheus-url) to read the cost records from, and stored "
            f"requests carry no GPU time ({record} per model, docs/cost.md)"
        )
    except UpstreamError as exc:
        return None, f"no cost: {exc}"
    if not found:
        return None, (
            f"no cost: Prometheus has no {record} over the range (the SLO file needs a cost: section, and the "
            "exporters the GPUs of each replica: docs/cost.md)"
        )
    return found, (
        f"cost_usd: a group's generated tokens per model times the model's mean {record} over the range (its "
        "share of the model's GPUs by generated tokens, an estimate: docs/cost.md)"
    )


def _filter(value: str | None, name: str) -> str | None:
    if value is not None and (len(value) > MAX_FILTER_CHARS or listing.NUL in value):
        raise HTTPException(status_code=400, detail=f"{name} must be at most {MAX_FILTER_CHARS} characters, no NUL")
    return value


def wants_csv(fmt: str | None, accept: str | None) -> bool:
    """``format`` decides; without it, an ``Accept`` that names ``text/csv`` (with a q above 0)."""
    if fmt is not None:
        return fmt == "csv"
    for part in (accept or "")[:1024].split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if media.lower() == CSV_TYPE and not any(p.replace(" ", "") in ("q=0", "q=0.0", "q=0.00") for p in params):
            return True
    return False


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(CSV_RISKY):
        return "'" + value
    return value


def to_csv(answer: Usage) -> str:
    """One line per group (``row`` = ``group``), then ``rest`` (when truncated) and ``total``; per latency SLO
    its attainment (``slo:NAME``)."""
    names = [s.name for s in answer.slos]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(
        [
            "row",
            answer.group_by,
            "requests",
            "failed",
            "prompt_tokens",
            "generation_tokens",
            "slo_requests",
            "slo_met",
            "slo_attainment",
            *(f"slo:{n}" for n in names),
            "cost_usd",
        ]
    )

    def line(kind: str, g: UsageGroup) -> None:
        per_slo = [g.slos[n].attainment for n in names]
        values = [kind, g.key, g.requests, g.failed, g.prompt_tokens, g.generation_tokens, g.slo_requests, g.slo_met]
        writer.writerow([_cell(v) for v in (*values, g.slo_attainment, *per_slo, g.cost_usd)])

    for group in answer.groups:
        line("group", group)
    if answer.rest is not None:
        line("rest", answer.rest)
    line("total", answer.total)
    return out.getvalue()


@router.get(
    "/usage",
    response_model=Usage,
    responses={
        200: {
            "description": "JSON, or CSV (format=csv or Accept: text/csv)",
            "content": {CSV_TYPE: {"schema": {"type": "string"}}},
        },
        400: {"model": ErrorBody, "description": "Invalid time range or filter"},
    },
)
async def get_usage(
    request: Request,
    collector: CollectorDep,
    engine: StatsEngineDep,
    group_by: Annotated[UsageGroupBy, Query(description="tenant (inferwatch proxy's rows) or model")] = "tenant",
    since: Annotated[
        str | None, Query(description="ISO 8601: the requests that finished at or after this (default: until - 1d)")
    ] = None,
    until: Annotated[str | None, Query(description="ISO 8601: ... and before this (default: now)")] = None,
    side: Annotated[
        Side | None,
        Query(
            description="the rows counted: proxy (inferwatch proxy's: the only ones with a tenant), engine or all. "
            "Default: proxy for group_by=tenant, engine for model (as /stats)"
        ),
    ] = None,
    llm_engine: Annotated[str | None, Query(alias="engine", description="only this engine's requests")] = None,
    model: Annotated[str | None, Query(description="only this model's requests")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_GROUPS, description="groups at most (the rest are summed)")] = 1000,
    fmt: Annotated[Literal["json", "csv"] | None, Query(alias="format", description="default: by Accept")] = None,
    slo_ttft: Slo = None,
    slo_tpot: Slo = None,
    slo_e2e: Slo = None,
    slo_queue: Slo = None,
) -> Usage | Response:
    """Per tenant or model over a time range: requests, failed requests, prompt and generated tokens, the
    share of requests that met the latency SLOs (the collector's SLO file, or the ``slo_*`` given here), and
    the cost from Prometheus' per-model cost records (null without them; ``cost_note`` says how or why not).

    The busiest groups first, at most ``limit``; ``rest`` sums the others and ``total`` every request, so the
    figures add up whatever the limit. CSV: one line per group, then ``rest`` and ``total`` (column ``row``).
    """
    end = parse_time(until, "until") or datetime.now(UTC)
    try:
        start = parse_time(since, "since") or end - DEFAULT_RANGE
    except OverflowError:  # until in the year 1
        raise HTTPException(status_code=400, detail="since must be given for an until in year 1") from None
    if end <= start:
        raise HTTPException(status_code=400, detail="until must be after since")
    if end - start > MAX_RANGE:
        raise HTTPException(status_code=400, detail=f"the range from since to until is at most {MAX_RANGE.days} days")
    given = {f: v for f, v in ((TTFT, slo_ttft), (TPOT, slo_tpot), (E2E, slo_e2e), (QUEUE, slo_queue)) if v}
    file = collector.oncall.slos
    notes: list[str] = []
    source: SloSource = "none"
    if given:
        slos, source = [usage.LatencySlo(f, f, v) for f, v in given.items()], "query"
    else:
        slos, notes = usage.file_slos(file)
        source = "file" if slos else "none"
    filters = usage.Filters(
        since=start,
        until=end,
        side=side or ("proxy" if group_by == "tenant" else "engine"),
        engine=_filter(llm_engine, "engine"),
        model=_filter(model, "model"),
    )
    per_model, why = await prices(collector, end, int((end - start).total_seconds()))
    answer = await query(
        usage.compute_usage,
        collector=collector,
        engine=engine,
        group_by=group_by,
        filters=filters,
        slos=slos,
        slo_source=source,
        limit=limit,
        cost_note=why,
        prices=per_model,
        notes=notes,
    )
    if wants_csv(fmt, request.headers.get("accept")):
        name = f"usage-{group_by}-{start:%Y%m%dT%H%M%SZ}-{end:%Y%m%dT%H%M%SZ}.csv"
        return Response(
            to_csv(answer),
            media_type=f"{CSV_TYPE}; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    return answer
