"""Self-metrics and probes: ``/metrics`` (Prometheus text), ``/healthz`` (alive), ``/readyz`` (database ready)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import generate_latest

from inferwatch.collector.api.deps import CollectorDep
from inferwatch.collector.schemas import Health, Readiness
from inferwatch.collector.stats import listing

router = APIRouter(tags=["health"])


class PrometheusText(PlainTextResponse):
    media_type = "text/plain; version=0.0.4"


@router.get("/metrics", response_class=PrometheusText, response_description="Prometheus text exposition format")
async def metrics(collector: CollectorDep) -> PrometheusText:
    """The collector's self-metrics (``inferwatch_collector_*``)."""
    collector.ingestor.refresh()
    return PrometheusText(generate_latest(collector.metrics.registry))


@router.get("/healthz")
async def healthz() -> Health:
    """The process is up."""
    return Health()


@router.get("/readyz", responses={503: {"model": Readiness, "description": "Database not ready"}})
async def readyz(collector: CollectorDep, response: Response) -> Readiness:
    """The database answers and its schema is at the migrations' head."""
    problem = await asyncio.to_thread(listing.database_problem, engine=collector.engine)
    if problem is not None:
        response.status_code = 503
    return Readiness(database=problem or "ok", queue_depth=collector.writer.queue_depth)
