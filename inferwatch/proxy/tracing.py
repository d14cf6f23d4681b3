"""One OTLP span per generation request, in the OpenTelemetry GenAI conventions.

A tracer provider of the proxy's own (never the global one) with a batching OTLP exporter; the
service is named so that the collector stores these requests apart from the engine's own spans
(:data:`~inferwatch.core.vocabulary.PROXY_SERVICE` by default). The span is written when the request
is over, with the times of its arrival and end; it joins the client's trace when the request carries
a ``traceparent``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferwatch.core import vocabulary as V

OtlpProtocol = Literal["http/protobuf", "grpc"]
SERVICE: Final = V.PROXY_SERVICE
SCOPE: Final = "inferwatch.proxy"
LORA_ADAPTER: Final = "inferwatch.lora_adapter"
"""The request's LoRA adapter (no GenAI convention has one); the collector's GenAI source reads it."""
OUTCOME: Final = "inferwatch.proxy.outcome"
TOKENS_ESTIMATED: Final = "inferwatch.proxy.output_tokens_estimated"
CONTENT_CHUNKS: Final = "inferwatch.proxy.content_chunks"
TENANT: Final = "inferwatch.tenant"
"""Who sent the request (:mod:`~inferwatch.proxy.tenants`: the API key's keyed hash, or the tenant header's
value; never the key); the collector's GenAI source stores it in the ``tenant`` column."""


class SpanSink:
    """Spans of finished requests to an OTLP endpoint (or to ``exporter``, in tests)."""

    def __init__(
        self,
        endpoint: str | None,
        protocol: OtlpProtocol = "http/protobuf",
        service: str = SERVICE,
        exporter: SpanExporter | None = None,
    ) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        if exporter is None:
            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

                exporter = Grpc(endpoint=endpoint, insecure=True)
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

                exporter = Http(endpoint=endpoint)
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
        self.tracer = self.provider.get_tracer(SCOPE)
        self.propagator = TraceContextTextMapPropagator()

    def emit(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        headers: Mapping[str, str],
        attributes: Mapping[str, Any],
        error: str | None,
    ) -> None:
        carrier = {k: v for k, v in headers.items() if k.lower() in ("traceparent", "tracestate")}
        context = self.propagator.extract(carrier=carrier) if carrier else None
        span = self.tracer.start_span(
            name,
            context=context,
            kind=SpanKind.CLIENT,
            start_time=start_ns,
            attributes={k: v for k, v in attributes.items() if v is not None},
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end_ns)

    def shutdown(self) -> None:
        self.provider.shutdown()


def finish_reasons(reasons: list[str], outcome: str) -> list[str]:
    """The engine's finish reasons; an aborted request that has none says ``abort``."""
    if reasons:
        return reasons
    return [V.OUTCOME_ABORT] if outcome == V.OUTCOME_ABORT else []
