"""OTLP/HTTP request decoding: protobuf or JSON, plain or gzip, with size limits (OTLP spec 1.x).

The JSON encoding differs from protobuf's canonical JSON mapping in two ways that matter here:
trace and span ids are hex strings (not base64) and enum values may be integers; int64 values come
as strings. :func:`decode_json` rewrites the ids before handing the document to protobuf's parser.

Every decoder here either returns a message or raises :class:`OtlpError` (with the HTTP status to
answer): no input, however malformed (wrong JSON types, nesting deeper than the parsers allow,
truncated or concatenated gzip, invalid UTF-8), raises anything else.
"""

from __future__ import annotations

import base64
import gzip
import json
import secrets
import zlib
from collections.abc import Iterable
from typing import Any, Final

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_MESSAGE_DEPTH: Final = 100
"""Deepest message nesting protobuf's parsers accept (kvlist and array attribute values nest)."""
GZIP_MAGIC: Final = b"\x1f\x8b"

# google.rpc.Code values (the gRPC status codes) used in error bodies and on OTLP/gRPC
INVALID_ARGUMENT: Final = 3
DEADLINE_EXCEEDED: Final = 4
RESOURCE_EXHAUSTED: Final = 8
INTERNAL: Final = 13
UNAVAILABLE: Final = 14
UNAUTHENTICATED: Final = 16
UNKNOWN: Final = 2
GRPC_CODES: Final = {
    400: INVALID_ARGUMENT,
    401: UNAUTHENTICATED,
    408: DEADLINE_EXCEEDED,
    413: RESOURCE_EXHAUSTED,
    415: INVALID_ARGUMENT,
    429: RESOURCE_EXHAUSTED,
    500: INTERNAL,
    503: UNAVAILABLE,
}
"""HTTP status -> google.rpc code of the error body (UNKNOWN otherwise)."""


class OtlpError(Exception):
    """A request the collector refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (gzip or deflate), refusing more than ``limit`` bytes after inflation.

    A gzip body may hold several members (RFC 1952 §2.2: they decompress to their concatenation); a
    truncated member, a member followed by anything but another member (or zero padding), or a
    deflate stream with trailing bytes is malformed (400).
    """
    enc = (encoding or "").strip().lower()
    if enc in ("", "identity"):
        if len(body) > limit:
            raise OtlpError(413, f"request body of {len(body)} bytes exceeds the {limit}-byte limit")
        return body
    if enc not in ("gzip", "deflate"):
        raise OtlpError(415, f"unsupported Content-Encoding {encoding!r} (gzip, deflate or none)")
    out = bytearray()
    rest = body
    while True:
        wbits = 16 + zlib.MAX_WBITS if enc == "gzip" else zlib.MAX_WBITS
        inflater = zlib.decompressobj(wbits)
        try:
            out += inflater.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            raise OtlpError(400, f"body is not valid {enc}: {exc}") from None
        if len(out) > limit or inflater.unconsumed_tail:
            raise OtlpError(413, f"decompressed body exceeds the {limit}-byte limit")
        if not inflater.eof:
            raise OtlpError(400, f"{enc} body is truncated")
        rest = inflater.unused_data
        if enc == "gzip" and rest.startswith(GZIP_MAGIC):
            continue  # the next member
        if rest.strip(b"\x00"):
            raise OtlpError(400, f"{len(rest)} bytes of trailing data after the {enc} stream")
        return bytes(out)


def _hex_to_b64(value: Any, size: int, what: str) -> Any:
    if not isinstance(value, str) or value == "":
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise OtlpError(400, f"{what} {value[:64]!r} is not hex") from None
    if len(raw) != size:
        raise OtlpError(400, f"{what} {value[:64]!r} must be {size} bytes")
    return base64.b64encode(raw).decode()


def _items(value: Any) -> list[dict[str, Any]]:
    """The objects of a JSON array (anything of another type is left for protobuf's parser to refuse)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _field(obj: dict[str, Any], camel: str) -> Any:
    return obj.get(camel, obj.get(_snake(camel)))


def _fix_ids(doc: dict[str, Any]) -> None:
    for rs in _items(_field(doc, "resourceSpans")):
        for ss in _items(_field(rs, "scopeSpans")):
            for span in _items(ss.get("spans")):
                for key, size in (("traceId", 16), ("spanId", 8), ("parentSpanId", 8)):
                    for k in (key, _snake(key)):
                        if k in span:
                            span[k] = _hex_to_b64(span[k], size, k)
                for link in _items(span.get("links")):
                    for key, size in (("traceId", 16), ("spanId", 8)):
                        for k in (key, _snake(key)):
                            if k in link:
                                link[k] = _hex_to_b64(link[k], size, k)


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def decode_json(body: bytes) -> ExportTraceServiceRequest:
    try:
        doc = json.loads(body)
    except RecursionError:
        raise OtlpError(400, "body is not valid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise OtlpError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise OtlpError(400, "OTLP JSON body must be an object")
    _fix_ids(doc)
    msg = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(doc, msg, ignore_unknown_fields=True, max_recursion_depth=MAX_MESSAGE_DEPTH)
    except json_format.ParseError as exc:
        raise OtlpError(400, f"not an OTLP ExportTraceServiceRequest: {str(exc)[:300]}") from None
    except Exception as exc:  # protobuf's parser on a value of a type it did not foresee
        raise OtlpError(400, f"not an OTLP ExportTraceServiceRequest: {type(exc).__name__}: {str(exc)[:300]}") from None
    return msg


def decode_protobuf(body: bytes) -> ExportTraceServiceRequest:
    try:
        msg: ExportTraceServiceRequest = ExportTraceServiceRequest.FromString(body)
        return msg
    except (DecodeError, ValueError, RecursionError) as exc:
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


def encode_status(kind: str, status: int, message: str) -> bytes:
    """A ``google.rpc.Status`` for an HTTP error ``status``, in the media type ``kind`` (JSON or protobuf)."""
    code = GRPC_CODES.get(status, UNKNOWN)
    if kind == JSON:
        return json.dumps({"code": code, "message": message}).encode()
    out: bytes = status_pb2.Status(code=code, message=message).SerializeToString()
    return out


# -- bearer tokens (OTLP/HTTP, OTLP/gRPC and the read API) ------------------------------------------
def header_bytes(value: str | bytes) -> bytes:
    """A header value as the bytes that were sent (HTTP servers decode headers as latin-1)."""
    return value if isinstance(value, bytes) else value.encode("latin-1", "replace")


def token_matches(given: bytes | None, tokens: Iterable[str]) -> bool:
    """Whether the raw token ``given`` is the UTF-8 encoding of one of ``tokens``, in time independent
    of where they differ: :func:`secrets.compare_digest` on bytes (on ``str`` it refuses non-ASCII),
    against every token (no early exit)."""
    if given is None:
        return False
    matched = False
    for token in tokens:
        matched |= secrets.compare_digest(given, token.encode("utf-8", "surrogateescape"))
    return matched


def bearer_token(authorization: str | bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` value (scheme case-insensitive); ``None`` otherwise
    (a bare token without the scheme included)."""
    if authorization is None:
        return None
    scheme, _, token = header_bytes(authorization).strip().partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        return None
    return token


def gzip_bytes(data: bytes) -> bytes:
    return gzip.compress(data)
