"""OTLP/HTTP request decoding: protobuf or JSON, plain or gzip, with size limits (OTLP spec 1.x).

The JSON encoding differs from protobuf's canonical JSON mapping in two ways that matter here:
trace and span ids are hex strings (not base64) and enum values may be integers; int64 values come
as strings. :func:`decode_json` rewrites the ids before handing the document to protobuf's parser.
"""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
DEFAULT_MAX_BODY = 4 * 1024 * 1024


class OtlpError(Exception):
    """A request the collector refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (gzip or deflate), refusing more than ``limit`` bytes after inflation."""
    enc = (encoding or "").strip().lower()
    if enc in ("", "identity"):
        if len(body) > limit:
            raise OtlpError(413, f"request body of {len(body)} bytes exceeds the {limit}-byte limit")
        return body
    if enc not in ("gzip", "deflate"):
        raise OtlpError(415, f"unsupported Content-Encoding {encoding!r} (gzip or none)")
    wbits = 16 + zlib.MAX_WBITS if enc == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise OtlpError(400, f"body is not valid {enc}: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise OtlpError(413, f"decompressed body exceeds the {limit}-byte limit")
    return out


def _hex_to_b64(value: Any, size: int, what: str) -> Any:
    if not isinstance(value, str) or value == "":
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise OtlpError(400, f"{what} {value!r} is not hex") from None
    if len(raw) != size:
        raise OtlpError(400, f"{what} {value!r} must be {size} bytes")
    return base64.b64encode(raw).decode()


def _fix_ids(doc: Any) -> None:
    for rs in doc.get("resourceSpans") or doc.get("resource_spans") or []:
        for ss in rs.get("scopeSpans") or rs.get("scope_spans") or []:
            for span in ss.get("spans") or []:
                for key, size in (("traceId", 16), ("spanId", 8), ("parentSpanId", 8)):
                    for k in (key, _snake(key)):
                        if k in span:
                            span[k] = _hex_to_b64(span[k], size, k)
                for link in span.get("links") or []:
                    for key, size in (("traceId", 16), ("spanId", 8)):
                        for k in (key, _snake(key)):
                            if k in link:
                                link[k] = _hex_to_b64(link[k], size, k)


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def decode_json(body: bytes) -> ExportTraceServiceRequest:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OtlpError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise OtlpError(400, "OTLP JSON body must be an object")
    _fix_ids(doc)
    msg = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(doc, msg, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise OtlpError(400, f"not an OTLP ExportTraceServiceRequest: {exc}") from None
    return msg


def decode_protobuf(body: bytes) -> ExportTraceServiceRequest:
    try:
        msg: ExportTraceServiceRequest = ExportTraceServiceRequest.FromString(body)
        return msg
    except (DecodeError, ValueError) as exc:
        raise OtlpError(400, f"body is not a protobuf ExportTraceServiceRequest: {exc}") from None


def decode(
    body: bytes, content_type: str | None, encoding: str | None, limit: int
) -> tuple[ExportTraceServiceRequest, str]:
    """Decode an OTLP/HTTP body; returns the request and the media type to answer in."""
    kind = media_type(content_type)
    if kind not in (PROTOBUF, JSON):
        raise OtlpError(415, f"unsupported Content-Type {content_type!r}: use {PROTOBUF} or {JSON}")
    raw = decompress(body, encoding, limit)
    return (decode_protobuf(raw) if kind == PROTOBUF else decode_json(raw)), kind


def encode_response(kind: str, rejected: int = 0, message: str = "") -> bytes:
    """An ``ExportTraceServiceResponse`` (``partial_success`` when spans were rejected)."""
    resp = ExportTraceServiceResponse()
    if rejected:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = message
    if kind == JSON:
        return json.dumps(json_format.MessageToDict(resp)).encode()
    out: bytes = resp.SerializeToString()
    return out


def gzip_bytes(data: bytes) -> bytes:
    return gzip.compress(data)
