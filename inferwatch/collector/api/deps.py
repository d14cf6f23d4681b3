"""Dependencies of the collector's routes: the collector of the app, its engine, and the bearer-token scopes.

They are coroutines though none of them waits: FastAPI runs a plain function dependency on its thread pool,
a thread hop per dependency and request (on an OTLP export, two of them before the body is read)."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

from inferwatch.collector.ingest.otlp import header_bytes, token_matches
from inferwatch.collector.schemas import ErrorBody
from inferwatch.collector.service import Collector

Scope = Literal["ingest", "read"]


async def get_collector(request: Request) -> Collector:
    collector: Collector = request.app.state.collector
    return collector


CollectorDep = Annotated[Collector, Depends(get_collector)]


async def get_engine(collector: CollectorDep) -> Engine:
    return collector.engine


EngineDep = Annotated[Engine, Depends(get_engine)]


async def get_stats_engine(collector: CollectorDep) -> Engine:
    return collector.stats_reader


StatsEngineDep = Annotated[Engine, Depends(get_stats_engine)]
"""The engine of the statistics reads (:attr:`Collector.stats_reader`)."""

Bearer = Annotated[
    HTTPAuthorizationCredentials | None,
    Depends(HTTPBearer(auto_error=False, description="A token of the scope (none needed when none configured).")),
]


def token_allowed(collector: Collector, creds: HTTPAuthorizationCredentials | None, scope: Scope) -> bool:
    """The bearer token is one of the scope's tokens (any request passes when the scope has none)."""
    settings = collector.settings
    tokens = settings.ingest_tokens if scope == "ingest" else settings.read_tokens
    if not tokens:
        return True
    return token_matches(header_bytes(creds.credentials) if creds is not None else None, tokens)


def check_token(collector: Collector, creds: HTTPAuthorizationCredentials | None, scope: Scope) -> None:
    """401 unless the bearer token is one of the scope's tokens (any request passes when it has none)."""
    if not token_allowed(collector, creds, scope):
        raise HTTPException(
            status_code=401,
            detail=f"a bearer token with the {scope} scope is required",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def require_ingest(collector: CollectorDep, creds: Bearer) -> None:
    check_token(collector, creds, "ingest")


async def require_read(collector: CollectorDep, creds: Bearer) -> None:
    check_token(collector, creds, "read")


READ_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    401: {"model": ErrorBody, "description": "No bearer token of the read scope"},
}
"""What :func:`require_read` may answer, for the routers that depend on it."""
