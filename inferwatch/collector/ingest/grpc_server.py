"""OTLP/gRPC ``TraceService/Export`` (vLLM's default protocol, TGI's only one).

Status codes as the OTLP specification has them: a message that does not decode is
``INVALID_ARGUMENT`` (the handler decodes the raw bytes itself, so protobuf's error is not gRPC's
generic ``INTERNAL``); no ``Authorization: Bearer <token>`` of the ingest scope is
``UNAUTHENTICATED`` (a bare token without the scheme too; compared in constant time); a full queue
is ``RESOURCE_EXHAUSTED`` and a database down ``UNAVAILABLE``, both with a ``google.rpc.RetryInfo``
(in ``grpc-status-details-bin``, and in ``google.rpc.retryinfo-bin`` where OpenTelemetry's Python
exporter looks), without which OTLP clients do not retry ``RESOURCE_EXHAUSTED``.

The port is bound without ``SO_REUSEPORT`` (gRPC's default would let a second collector bind the
same port and take half the exports): a port in use fails the start.
"""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Any, Final

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from inferwatch.collector.ingest.otlp import PROTOBUF, bearer_token, token_matches
from inferwatch.collector.ingest.pipeline import Ingestor
from inferwatch.collector.settings import CollectorSettings
from inferwatch.core.config import parse_listen

log = logging.getLogger(__name__)

SERVICE: Final = "opentelemetry.proto.collector.trace.v1.TraceService"
RETRY_DELAY_SECONDS: Final = 2
"""The ``RetryInfo.retry_delay`` of RESOURCE_EXHAUSTED and UNAVAILABLE (as OTLP/HTTP's ``Retry-After``)."""
STATUS_DETAILS_KEY: Final = "grpc-status-details-bin"
RETRY_INFO_KEY: Final = "google.rpc.retryinfo-bin"
WORKERS: Final = 8


def retry_metadata(code: grpc.StatusCode, message: str, delay: int = RETRY_DELAY_SECONDS) -> list[tuple[str, bytes]]:
    """Trailing metadata that tells an OTLP client when to retry: a ``google.rpc.Status`` carrying a
    ``RetryInfo`` (the standard place), and the ``RetryInfo`` alone (OpenTelemetry Python's place)."""
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=delay))
    detail = any_pb2.Any()
    detail.Pack(retry)
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    return [(STATUS_DETAILS_KEY, status.SerializeToString()), (RETRY_INFO_KEY, retry.SerializeToString())]


class TraceService:
    """The ``Export`` handler; it receives the raw request bytes (see :func:`start_grpc_server`)."""

    def __init__(self, settings: CollectorSettings, ingestor: Ingestor) -> None:
        self.settings = settings
        self.ingestor = ingestor

    def _authorised(self, context: grpc.ServicerContext) -> bool:
        tokens = self.settings.ingest_tokens
        if not tokens:
            return True
        given: str | bytes | None = None
        for key, value in context.invocation_metadata():
            if key == "authorization":
                given = value
        return token_matches(bearer_token(given), tokens)

    def Export(self, raw: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        if not self._authorised(context):
            self.ingestor.metrics.rejected.labels(reason="grpc_unauthenticated").inc()
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "a bearer token with the ingest scope is required")
        # under overload, room in the write queue first: a body decoded only to be refused wastes a worker
        if not self.ingestor.has_room():
            self.ingestor.wait_for_room()
        # decoded and mapped in an ingest worker process; this thread waits for it, then for durability
        prepared = self.ingestor.prepare(raw, PROTOBUF, None).result()
        if prepared.error is not None:
            self.ingestor.metrics.rejected.labels(reason="grpc_invalid_argument").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, prepared.error[1])
        result = self.ingestor.commit(prepared)
        if result.backpressure:
            # the database is the cause (UNAVAILABLE), or the queue (RESOURCE_EXHAUSTED)
            code = grpc.StatusCode.UNAVAILABLE if result.unavailable else grpc.StatusCode.RESOURCE_EXHAUSTED
            context.set_trailing_metadata(retry_metadata(code, result.message))
            context.abort(code, result.message)
        resp = ExportTraceServiceResponse()
        if result.rejected:
            resp.partial_success.rejected_spans = result.rejected
            resp.partial_success.error_message = result.message
        return resp


def start_grpc_server(settings: CollectorSettings, ingestor: Ingestor) -> Any:
    """Start the gRPC server on ``settings.grpc_listen``; returns it (call ``stop(grace)`` to end it).

    ``OSError`` when the address cannot be bound, another process's listener on it included.
    """
    host, port = parse_listen(settings.grpc_listen or "127.0.0.1:4317")
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="otlp-grpc"),
        options=[
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )
    service = TraceService(settings, ingestor)
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Export": grpc.unary_unary_rpc_method_handler(
                service.Export,
                request_deserializer=None,  # the raw bytes: decode errors are the handler's, INVALID_ARGUMENT
                response_serializer=ExportTraceServiceResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    address = f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio >= 1.5x raises instead of returning 0
        server.stop(None)
        raise OSError(f"cannot listen on {address} for OTLP/gRPC (in use by another process?): {exc}") from None
    if bound == 0:
        server.stop(None)
        raise OSError(f"cannot listen on {address} for OTLP/gRPC (in use by another process?)")
    server.start()
    return server
