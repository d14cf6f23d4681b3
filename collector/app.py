"""The collector's FastAPI app: OTLP/HTTP ingest, self-metrics, health, and the on-call read API.

``create_app(settings)`` builds everything from the settings it is given (database engine, writer,
gRPC server): nothing is created at import time.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import generate_latest
from sqlalchemy import Engine, text

from inferwatch.collector import db
from inferwatch.collector.api import router as api_router
from inferwatch.collector.config import CollectorSettings
from inferwatch.collector.ingest import CollectorMetrics, Ingestor
from inferwatch.collector.otlp import JSON, OtlpError, decode, encode_response
from inferwatch.collector.writer import Writer

RETRY_AFTER_SECONDS = "2"


@dataclass
class Collector:
    """What one collector process holds; reachable from requests as ``request.app.state.collector``."""

    settings: CollectorSettings
    engine: Engine
    writer: Writer
    metrics: CollectorMetrics
    ingestor: Ingestor
    grpc_server: Any = None


def build(settings: CollectorSettings, engine: Engine | None = None) -> Collector:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = engine or db.make_engine(settings.url())
    db.ensure_schema(engine)
    writer = Writer(
        engine,
        spool_path=settings.spool_path(),
        queue_limit=settings.queue_limit,
        batch_size=settings.batch_size,
        retention=settings.retention_delta(),
    )
    metrics = CollectorMetrics()
    return Collector(settings, engine, writer, metrics, Ingestor(writer, metrics))


_bearer = HTTPBearer(auto_error=False)


def _check(request: Request, creds: HTTPAuthorizationCredentials | None, scope: str) -> None:
    collector: Collector = request.app.state.collector
    tokens = collector.settings.ingest_tokens if scope == "ingest" else collector.settings.read_tokens
    if not tokens:
        return
    given = creds.credentials if creds is not None else ""
    if not any(secrets.compare_digest(given, t) for t in tokens):
        raise HTTPException(
            status_code=401,
            detail=f"a bearer token with the {scope} scope is required",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require_ingest(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    _check(request, creds, "ingest")


def require_read(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    _check(request, creds, "read")


def create_app(settings: CollectorSettings, engine: Engine | None = None, start_grpc: bool = True) -> FastAPI:
    """The collector app. ``engine`` may be passed in (tests); otherwise it comes from the settings."""
    collector = build(settings, engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        collector.writer.start()
        if start_grpc and settings.grpc_listen:
            from inferwatch.collector.grpc_server import start_grpc_server

            collector.grpc_server = start_grpc_server(settings, collector.ingestor)
        try:
            yield
        finally:
            if collector.grpc_server is not None:
                collector.grpc_server.stop(grace=2).wait()
            await asyncio.to_thread(collector.writer.stop, 10.0)
            if engine is None:  # ours: release its connections (a caller's engine stays the caller's)
                collector.engine.dispose()

    app = FastAPI(
        title="inferwatch collector",
        description="Per-request LLM traces over OTLP into a SQL request store, and the on-call read API.",
        lifespan=lifespan,
    )
    app.state.collector = collector

    @app.post("/v1/traces", dependencies=[Depends(require_ingest)], tags=["otlp"])
    async def traces(request: Request) -> Response:
        """OTLP/HTTP trace export (protobuf or JSON, optionally gzip)."""
        limit = settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            return _otlp_error(request, 413, f"request body exceeds the {limit}-byte limit")
        body = bytearray()
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                return _otlp_error(request, 413, f"request body exceeds the {limit}-byte limit")
        try:
            msg, kind = decode(
                bytes(body), request.headers.get("content-type"), request.headers.get("content-encoding"), limit
            )
        except OtlpError as exc:
            collector.metrics.rejected.labels(reason=f"http_{exc.status}").inc()
            return _otlp_error(request, exc.status, exc.message)
        result = await asyncio.to_thread(collector.ingestor.ingest, msg)
        if result.backpressure:
            return _otlp_error(
                request,
                503 if not collector.writer.db_ok else 429,
                result.message,
                {"Retry-After": RETRY_AFTER_SECONDS},
            )
        media = "application/json" if kind == JSON else "application/x-protobuf"
        return Response(encode_response(kind, result.rejected, result.message), media_type=media)

    @app.get("/metrics", tags=["health"])
    async def metrics() -> Response:
        collector.ingestor.refresh()
        return Response(generate_latest(collector.metrics.registry), media_type="text/plain; version=0.0.4")

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        def check() -> tuple[bool, str]:
            try:
                with collector.engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
                return (db.at_head(collector.engine), "")
            except Exception as exc:
                return (False, f"{exc.__class__.__name__}: {exc}")

        ok_db, problem = await asyncio.to_thread(check)
        body = {
            "database": "ok" if ok_db else (problem or "migrations not at head"),
            "queue_depth": collector.writer.queue_depth,
        }
        return JSONResponse(body, status_code=200 if ok_db else 503)

    app.include_router(api_router, prefix="/api/v1", dependencies=[Depends(require_read)])
    return app


def _otlp_error(request: Request, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """OTLP/HTTP error: a google.rpc.Status in the request's encoding."""
    from google.rpc import status_pb2

    code = {400: 3, 401: 16, 413: 8, 415: 3, 429: 8, 503: 14}.get(status, 2)
    st = status_pb2.Status(code=code, message=message)
    if "json" in (request.headers.get("content-type") or ""):
        return JSONResponse({"code": code, "message": message}, status_code=status, headers=headers)
    return Response(st.SerializeToString(), status_code=status, media_type="application/x-protobuf", headers=headers)
