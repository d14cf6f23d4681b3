"""OTLP/gRPC ``TraceService/Export`` (vLLM's default protocol, TGI's only one)."""

from __future__ import annotations

from concurrent import futures
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from inferwatch.core.config import parse_listen

if TYPE_CHECKING:
    from inferwatch.collector.app import Collector


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, collector: Collector) -> None:
        self.collector = collector

    def _authorised(self, context: grpc.ServicerContext) -> bool:
        tokens = self.collector.settings.ingest_tokens
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
        result = self.collector.ingestor.ingest(request)
        if result.backpressure:
            code = (
                grpc.StatusCode.UNAVAILABLE if not self.collector.writer.db_ok else grpc.StatusCode.RESOURCE_EXHAUSTED
            )
            context.abort(code, result.message)
        resp = trace_service_pb2.ExportTraceServiceResponse()
        if result.rejected:
            resp.partial_success.rejected_spans = result.rejected
            resp.partial_success.error_message = result.message
        return resp


def start_grpc_server(collector: Collector) -> Any:
    """Start the gRPC server on ``settings.grpc_listen``; returns it (call ``stop(grace)`` to end it)."""
    host, port = parse_listen(collector.settings.grpc_listen or "127.0.0.1:4317")
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_receive_message_length", collector.settings.max_body_bytes)],
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(collector), server)  # type: ignore[no-untyped-call]
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port} for OTLP/gRPC")
    collector.grpc_port = bound  # type: ignore[attr-defined]
    server.start()
    return server
