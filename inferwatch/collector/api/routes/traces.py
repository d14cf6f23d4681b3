"""``POST /v1/traces``: OTLP/HTTP trace export (protobuf or JSON, optionally gzip), into the ingest path.

Every answer but 200 is a ``google.rpc.Status`` in the request's encoding (OTLP/HTTP spec), 401 and
unexpected failures included. The body is read with a deadline (``body_timeout_seconds``: 408) and a
size limit (``max_body_bytes``: 413); decoding, the identity step and the mapping run in the ingest worker
processes (or, without them, in the ingest threads, at most ``decode_concurrency`` at once), and the wait for
durability on the ingest's own threads (:mod:`inferwatch.collector.ingest.pipeline`), so the event loop and the
default thread pool (health checks, the read API) keep answering while large bodies decode or the disk is
slow. An answer given before the whole body was read closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Final

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from inferwatch.collector.api.deps import Bearer, CollectorDep, token_allowed
from inferwatch.collector.ingest.otlp import (
    GRPC_CODES,
    JSON,
    PROTOBUF,
    OtlpError,
    encode_response,
    encode_status,
    media_type,
)
from inferwatch.collector.ingest.pipeline import ADMISSION_WAIT_S, Ingestor
from inferwatch.collector.schemas import OtlpExportResponse, RpcStatus

__all__ = ["GRPC_CODES", "REQUEST", "RESPONSES", "RETRY_AFTER_SECONDS", "otlp_error", "router"]

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS: Final = "2"
_BINARY: Final[dict[str, Any]] = {"schema": {"type": "string", "format": "binary"}}
_CONTENT_LENGTH: Final = re.compile(r"[0-9]{1,20}")


def _rpc_error(description: str, retry: bool = False, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "model": RpcStatus,
        "description": description + " (a google.rpc.Status in the request's encoding)",
        "content": {PROTOBUF: _BINARY},
    }
    if retry:
        response["headers"] = {"Retry-After": {"description": "seconds", "schema": {"type": "string"}}}
    if headers:
        response["headers"] = {**response.get("headers", {}), **headers}
    return response


RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    200: {
        "model": OtlpExportResponse,
        "description": "ExportTraceServiceResponse in the request's encoding; partial_success counts the "
        "spans rejected and why",
        "content": {PROTOBUF: _BINARY},
    },
    400: _rpc_error("Malformed body: not protobuf/JSON, truncated or trailing compressed data"),
    401: _rpc_error(
        "No bearer token of the ingest scope",
        headers={"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    ),
    408: _rpc_error("Body not received within body_timeout_seconds (the connection is closed)"),
    413: _rpc_error("Body larger than max_body_bytes, also after decompression"),
    415: _rpc_error("Content-Type neither protobuf nor JSON, or Content-Encoding neither gzip nor deflate"),
    429: _rpc_error("Write queue full: retry later", retry=True),
    503: _rpc_error(
        "Database unreachable and the queue full: retry later (the server's request cap, max_requests, "
        "also answers 503, as plain text)",
        retry=True,
    ),
}

REQUEST: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "description": "An OTLP ExportTraceServiceRequest",
        "content": {
            PROTOBUF: _BINARY,
            JSON: {"schema": {"type": "object", "description": "OTLP JSON encoding (hex trace and span ids)"}},
        },
    },
    "parameters": [
        {
            "name": "Content-Encoding",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "enum": ["gzip", "deflate", "identity"]},
            "description": "none, gzip or deflate",
        }
    ],
}
"""The body the route reads itself (raw, streamed, size-checked) and its header, for the OpenAPI document."""

router = APIRouter(tags=["otlp"])


def error_kind(content_type: str | None) -> str:
    """The encoding of an error answer: JSON for a JSON request, else protobuf."""
    return JSON if "json" in (content_type or "").lower() else PROTOBUF


def otlp_error(
    content_type: str | None, status: int, message: str, headers: dict[str, str] | None = None, close: bool = False
) -> Response:
    """OTLP/HTTP error: a google.rpc.Status in the request's encoding; ``close`` ends the connection
    (for an answer given before the body was read)."""
    kind = error_kind(content_type)
    headers = dict(headers or {})
    if close:
        headers["Connection"] = "close"
    return Response(encode_status(kind, status, message), status_code=status, media_type=kind, headers=headers)


def _slots(request: Request, size: int) -> asyncio.Semaphore:
    """The app's slots of bodies being prepared (made on first use, inside the running loop: nothing at import
    time)."""
    state = request.app.state
    slots: asyncio.Semaphore | None = getattr(state, "otlp_decode_slots", None)
    if slots is None:
        slots = asyncio.Semaphore(size)
        state.otlp_decode_slots = slots
    return slots


ROOM_POLL_S: Final = 0.005
"""How often the export first in line reads whether the write queue has room again (the others wait behind it)."""


async def await_room(request: Request, ingestor: Ingestor) -> None:
    """Under overload (no room in the write queue), wait up to ``ADMISSION_WAIT_S`` for room before the body is
    read and decoded; one export at a time polls, the others queue behind it (no poll per waiting export).

    The gRPC receiver's threads block on the writer's condition instead (:meth:`Ingestor.wait_for_room`); the
    event loop cannot, short of a thread per waiting export, so it polls every ``ROOM_POLL_S``."""
    state = request.app.state
    line: asyncio.Lock | None = getattr(state, "otlp_room_line", None)
    if line is None:
        line = state.otlp_room_line = asyncio.Lock()
    try:
        async with asyncio.timeout(ADMISSION_WAIT_S), line:
            while not ingestor.has_room():
                await asyncio.sleep(ROOM_POLL_S)
    except TimeoutError:
        pass  # decoded now, and refused by its spans if there is still no room


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The request body; ``OtlpError`` 413 past ``limit`` bytes, 408 when not all there within ``timeout``."""
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise OtlpError(413, f"request body exceeds the {limit}-byte limit")
    except TimeoutError:
        raise OtlpError(408, f"request body not received within {timeout:g} s") from None
    return bytes(body)


@router.post("/v1/traces", response_model=None, responses=RESPONSES, openapi_extra=REQUEST)
async def export_traces(request: Request, collector: CollectorDep, creds: Bearer) -> Response:
    """OTLP/HTTP trace export (protobuf or JSON, optionally gzip)."""
    content_type = request.headers.get("content-type")
    try:
        return await _export(request, collector, creds, content_type)
    except ClientDisconnect:
        return otlp_error(content_type, 400, "client disconnected before the body was received", close=True)
    except Exception:  # whatever fails, the client gets a Status, the log the traceback
        log.exception("OTLP/HTTP export failed")
        collector.metrics.rejected.labels(reason="http_500").inc()
        return otlp_error(content_type, 500, "internal error while ingesting the export")


async def _export(request: Request, collector: CollectorDep, creds: Bearer, content_type: str | None) -> Response:
    settings = collector.settings
    if not token_allowed(collector, creds, "ingest"):
        collector.metrics.rejected.labels(reason="http_401").inc()
        message = "a bearer token with the ingest scope is required"
        return otlp_error(content_type, 401, message, {"WWW-Authenticate": "Bearer"}, close=True)
    limit = settings.max_body_bytes
    try:
        if media_type(content_type) not in (PROTOBUF, JSON):
            raise OtlpError(415, f"unsupported Content-Type {content_type!r}: use {PROTOBUF} or {JSON}")
        declared = (request.headers.get("content-length") or "").strip()
        if _CONTENT_LENGTH.fullmatch(declared) and int(declared) > limit:
            raise OtlpError(413, f"request body of {declared} bytes exceeds the {limit}-byte limit")
        if not collector.ingestor.has_room():
            await await_room(request, collector.ingestor)
        body = await read_body(request, limit, settings.body_timeout_seconds)
    except OtlpError as exc:
        collector.metrics.rejected.labels(reason=f"http_{exc.status}").inc()
        return otlp_error(content_type, exc.status, exc.message, close=True)
    encoding = request.headers.get("content-encoding")
    ingestor = collector.ingestor
    # with worker processes, twice as many bodies as processes in flight: a worker never waits for the next
    async with _slots(request, max(settings.decode_concurrency, 2 * ingestor.processes)):
        prepared = await asyncio.wrap_future(ingestor.prepare(body, content_type, encoding))
    del body
    if prepared.error is not None:
        status, message = prepared.error
        collector.metrics.rejected.labels(reason=f"http_{status}").inc()
        return otlp_error(content_type, status, message)
    # the ingest's own threads: a slow disk or database cannot starve the default pool (/readyz, the read API)
    result = await asyncio.get_running_loop().run_in_executor(ingestor.executor, ingestor.commit, prepared)
    if result.backpressure:
        status = 503 if result.unavailable else 429  # the database is the cause, or the queue
        return otlp_error(content_type, status, result.message, {"Retry-After": RETRY_AFTER_SECONDS})
    kind = prepared.kind
    return Response(encode_response(kind, result.rejected, result.message), media_type=kind)
