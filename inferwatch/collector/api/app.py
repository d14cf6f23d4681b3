"""The collector's FastAPI app: OTLP/HTTP ingest, self-metrics, health, and the on-call read API.

``create_app(settings)`` builds everything from the settings it is given (database engine, writer,
gRPC server): nothing is created at import time. The routes live in :mod:`inferwatch.collector.api.routes`,
their dependencies in :mod:`inferwatch.collector.api.deps`, the queries in :mod:`inferwatch.collector.stats.listing`
and :mod:`inferwatch.collector.stats.planner`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from fastapi import FastAPI
from sqlalchemy import Engine

from inferwatch.collector.api.headers import SecurityHeaders
from inferwatch.collector.api.routes import answers, chargeback, health, request_log, statistics, traces, webhooks
from inferwatch.collector.ingest.prepare import exit_with
from inferwatch.collector.service import build, db_timeouts
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.stats.rollup import RollupJob
from inferwatch.collector.stats.rollup_process import RollupProcess
from inferwatch.collector.store import db

API_PREFIX: Final = "/api/v1"


def create_app(settings: CollectorSettings, engine: Engine | None = None, start_grpc: bool = True) -> FastAPI:
    """The collector app. ``engine`` may be passed in (tests); otherwise it comes from the settings."""
    collector = build(settings, engine)
    rollups: RollupJob | RollupProcess
    if collector.owns_engine and not db.in_memory(settings.url()):  # its passes hold no GIL against ingest
        rollups = RollupProcess(settings.url(), db_timeouts(settings), watch=exit_with)
    else:  # a caller's engine, or a store no other process can open: a thread on that engine
        rollups = RollupJob(collector.engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        collector.start(grpc=start_grpc)
        collector.alerts.start()
        rollups.start()
        try:
            yield
        finally:
            # every step runs even when an earlier one fails: the writer must flush its queue
            try:
                await asyncio.to_thread(rollups.stop)
                await collector.alerts.stop()
            finally:
                try:
                    await collector.oncall.close()
                finally:
                    await asyncio.to_thread(collector.stop)

    app = FastAPI(
        title="inferwatch collector",
        description="Per-request LLM traces over OTLP into a SQL request store, and the on-call read API.",
        lifespan=lifespan,
    )
    app.state.collector = collector
    app.state.rollups = rollups
    app.include_router(traces.router)
    app.include_router(health.router)
    app.include_router(request_log.router, prefix=API_PREFIX)
    app.include_router(statistics.router, prefix=API_PREFIX)
    app.include_router(chargeback.router, prefix=API_PREFIX)
    app.include_router(answers.router, prefix=API_PREFIX)
    app.include_router(webhooks.webhook_router, prefix=API_PREFIX)
    app.include_router(webhooks.api_router, prefix=API_PREFIX)
    app.include_router(webhooks.page_router)
    # nosniff and no-referrer on every answer; a policy that allows no framing on every HTML answer
    docs = (app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
    app.add_middleware(SecurityHeaders, docs_paths=[p for p in docs if p])
    return app
