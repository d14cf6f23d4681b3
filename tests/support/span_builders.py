"""OTLP spans and export requests built by hand, as the span → request mapping receives them: shared by
``tests/test_collector_sources.py`` and ``tests/test_collector_sources_validation.py``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, str):
        return AnyValue(string_value=v)
    if isinstance(v, bytes):
        return AnyValue(bytes_value=v)
    if isinstance(v, list):
        return AnyValue(array_value=ArrayValue(values=[value(x) for x in v]))
    if isinstance(v, dict):
        return AnyValue(kvlist_value=KeyValueList(values=kvs(v)))
    return AnyValue()


def kvs(attrs: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=value(v)) for k, v in attrs.items()]


T0 = 1_795_976_244_955_801_088  # a start time of the real capture (ns)


def make_span(
    name: str,
    attrs: dict[str, Any] | None = None,
    *,
    trace: bytes = bytes(range(1, 17)),
    span: bytes = bytes(range(1, 9)),
    parent: bytes = b"",
    start: int = T0,
    end: int = T0 + 2_031_500_000,
    error: str | None = None,
    events: Sequence[tuple[str, dict[str, Any]]] = (),
) -> Span:
    s = Span(
        name=name,
        trace_id=trace,
        span_id=span,
        parent_span_id=parent,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=kvs(attrs or {}),
        kind=Span.SPAN_KIND_INTERNAL,
    )
    for event_name, event_attrs in events:
        s.events.add(name=event_name, time_unix_nano=end, attributes=kvs(event_attrs))
    if error is not None:
        s.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR, message=error))
    return s


def export(*groups: tuple[str, dict[str, Any], Sequence[Span]]) -> ExportTraceServiceRequest:
    """An export request from ``(scope, resource attributes, spans)`` groups."""
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=kvs(res)),
                scope_spans=[ScopeSpans(scope=InstrumentationScope(name=scope), spans=list(spans))],
            )
            for scope, res, spans in groups
        ]
    )


def sid(n: int) -> bytes:
    return n.to_bytes(8, "big")


def vllm_attrs() -> dict[str, Any]:
    return {"gen_ai.request.id": "chatcmpl-1", "gen_ai.latency.e2e": 0.5, "gen_ai.usage.completion_tokens": 3}
