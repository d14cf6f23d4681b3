"""``POST /v1/traces``: OTLP/HTTP trace export (protobuf or JSON, optionally gzip), into the ingest path."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from google.rpc import status_pb2

from inferwatch.collector.deps import CollectorDep, require_ingest
from inferwatch.collector.otlp import JSON, PROTOBUF, OtlpError, decode, encode_response
from inferwatch.collector.schemas import ErrorBody, OtlpExportResponse, RpcStatus

RETRY_AFTER_SECONDS: Final = "2"
GRPC_CODES: Final = {400: 3, 401: 16, 413: 8, 415: 3, 429: 8, 503: 14}
"""HTTP status -> google.rpc code of the error body (UNKNOWN otherwise)."""

_BINARY: Final[dict[str, Any]] = {"schema": {"type": "string", "format": "binary"}}


def _rpc_error(description: str, retry: bool = False) -> dict[str, Any]:
    response: dict[str, Any] = {
        "model": RpcStatus,
        "description": description + " (a google.rpc.Status in the request's encoding)",
        "content": {PROTOBUF: _BINARY},
    }
    if retry:
        response["headers"] = {"Retry-After": {"description": "seconds", "schema": {"type": "string"}}}
    return response


RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    200: {
        "model": OtlpExportResponse,
        "description": "ExportTraceServiceResponse in the request's encoding; partial_success counts the "
        "spans rejected and why",
        "content": {PROTOBUF: _BINARY},
    },
    400: _rpc_error("Malformed body"),
    401: {"model": ErrorBody, "description": "No bearer token of the ingest scope"},
    413: _rpc_error("Body larger than max_body_bytes, also after decompression"),
    415: _rpc_error("Content-Type neither protobuf nor JSON, or Content-Encoding neither gzip nor deflate"),
    429: _rpc_error("Write queue full: retry later", retry=True),
    503: _rpc_error("Database unreachable and the queue full: retry later", retry=True),
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

router = APIRouter(tags=["otlp"], dependencies=[Depends(require_ingest)])


def otlp_error(content_type: str | None, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """OTLP/HTTP error: a google.rpc.Status in the request's encoding."""
    code = GRPC_CODES.get(status, 2)
    if "json" in (content_type or ""):
        return JSONResponse({"code": code, "message": message}, status_code=status, headers=headers)
    body = status_pb2.Status(code=code, message=message).SerializeToString()
    return Response(body, status_code=status, media_type=PROTOBUF, headers=headers)


@router.post("/v1/traces", response_model=None, responses=RESPONSES, openapi_extra=REQUEST)
async def export_traces(request: Request, collector: CollectorDep) -> Response:
    """OTLP/HTTP trace export (protobuf or JSON, optionally gzip)."""
    content_type = request.headers.get("content-type")
    content_encoding = request.headers.get("content-encoding")
    limit = collector.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        return otlp_error(content_type, 413, f"request body exceeds the {limit}-byte limit")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            return otlp_error(content_type, 413, f"request body exceeds the {limit}-byte limit")
    try:
        msg, kind = decode(bytes(body), content_type, content_encoding, limit)
    except OtlpError as exc:
        collector.metrics.rejected.labels(reason=f"http_{exc.status}").inc()
        return otlp_error(content_type, exc.status, exc.message)
    result = await asyncio.to_thread(collector.ingestor.ingest, msg)
    if result.backpressure:
        status = 503 if not collector.writer.db_ok else 429
        return otlp_error(content_type, status, result.message, {"Retry-After": RETRY_AFTER_SECONDS})
    return Response(encode_response(kind, result.rejected, result.message), media_type=kind)
