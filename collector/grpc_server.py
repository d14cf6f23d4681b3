"""OTLP/gRPC ``TraceService/Export`` (vLLM's default protocol, TGI's only one)."""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from inferwatch.collector.config import CollectorSettings
from inferwatch.collector.ingest import Ingestor
from inferwatch.core.config import parse_listen


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, settings: CollectorSettings, ingestor: Ingestor) -> None:
        self.settings = settings
        self.ingestor = ingestor

    def _authorised(self, context: grpc.ServicerContext) -> bool:
        tokens = self.settings.ingest_tokens
        if not tokens:
            return True
        meta = dict(context.invocation_metadata())
        given = str(meta.get("authorization", "")).removeprefix("Bearer ").strip()
        return given in tokens

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        if not self._authorised(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "a bearer token with the ingest scope is required")
        result = self.ingestor.ingest(request)
        if result.backpressure:
            code = grpc.StatusCode.UNAVAILABLE if not self.ingestor.writer.db_ok else grpc.StatusCode.RESOURCE_EXHAUSTED
            context.abort(code, result.message)
        resp = trace_service_pb2.ExportTraceServiceResponse()
        if result.rejected:
            resp.partial_success.rejected_spans = result.rejected
            resp.partial_success.error_message = result.message
        return resp


def start_grpc_server(settings: CollectorSettings, ingestor: Ingestor) -> Any:
    """Start the gRPC server on ``settings.grpc_listen``; returns it (call ``stop(grace)`` to end it)."""
    host, port = parse_listen(settings.grpc_listen or "127.0.0.1:4317")
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_receive_message_length", settings.max_body_bytes)],
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(settings, ingestor), server)  # type: ignore[no-untyped-call]
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port} for OTLP/gRPC")
    server.start()
    return server
