"""OTLP/HTTP protobuf export bodies of vLLM ``llm_request`` spans (tests and benchmarks).

Every span carries the attributes of an ``llm_request`` span of the genuine capture
(tests/fixtures/otlp/vllm-0.32.0-cpu/spans.json, taken in turn) under fresh ids; only
``gen_ai.request.id`` and the times are rewritten, nothing is invented. Two id schemes:

* :class:`SpanBodies`: span ids are a counter (unique per factory, so the ids a test or the soak counts as
  acknowledged can be checked against the store), one random trace id per body, the spans ending now;
* :func:`build_bodies`: each span its own random trace and span id, as the spans of many independent
  requests reach a store (bench/collector.py's ingest load).
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

CAPTURE: Final = Path(__file__).resolve().parents[1] / "fixtures" / "otlp" / "vllm-0.32.0-cpu" / "spans.json"
"""The real vLLM capture the spans are modelled on."""
SCOPE: Final = "vllm.tracing.otel"
"""vLLM's instrumentation scope."""
REMOTE_FLAGS: Final = 256
"""``SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK``, the flags the capture's spans carry."""


def kv(key: str, value: Any) -> KeyValue:
    """An OTLP attribute: bool, int and float values typed as such, anything else as its string."""
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


@functools.cache
def templates() -> tuple[Mapping[str, Any], ...]:
    """The attributes of the capture's ``llm_request`` spans, in capture order (read once; copy before changing)."""
    return tuple(s["attributes"] for s in json.loads(CAPTURE.read_text()) if s["name"] == "llm_request")


def e2e_ns(attrs: Mapping[str, Any]) -> int:
    """The span's duration: its ``gen_ai.latency.e2e`` (seconds) in nanoseconds."""
    return int(float(attrs["gen_ai.latency.e2e"]) * 1e9)


def llm_request(
    attrs: Mapping[str, Any], *, trace_id: bytes, span_id: bytes, start_ns: int, end_ns: int, flags: int = 0
) -> Span:
    """A vLLM ``llm_request`` server span with these attributes, ids and times."""
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        name="llm_request",
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=start_ns,
        end_time_unix_nano=end_ns,
        attributes=[kv(k, v) for k, v in attrs.items()],
        flags=flags,
    )


def export_body(spans: Iterable[Span], *, service: str, instance: str) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` of ``spans``: one resource (``service.name``,
    ``service.instance.id``), vLLM's scope."""
    resource = Resource(attributes=[kv("service.name", service), kv("service.instance.id", instance)])
    req = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=resource, scope_spans=[ScopeSpans(scope=InstrumentationScope(name=SCOPE), spans=spans)]
            )
        ]
    )
    body: bytes = req.SerializeToString()  # the protobuf modules are untyped
    return body


class SpanBodies:
    """Export bodies of fresh ``llm_request`` spans, thread-safe.

    Span number ``i`` (counting from 1 over the factory's life, across threads) has span id ``i`` (8 bytes,
    big-endian), request id ``cmpl-<i>`` and the attributes of template ``i`` (modulo their number); the
    spans of one body share a trace id drawn from ``seed`` and end at the time the body is made.
    """

    def __init__(self, seed: int = 0, *, service: str, instance: str = "0") -> None:
        self.service = service
        self.instance = instance
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.next = 1

    def body(
        self, n: int, *, instance: str | None = None, overrides: Mapping[str, Any] | None = None
    ) -> tuple[bytes, list[str]]:
        """A body of ``n`` spans and their span ids in hex. ``instance``: this body's ``service.instance.id``
        (default: the factory's); ``overrides``: attributes set on every span (after the request id)."""
        with self.lock:
            first, self.next = self.next, self.next + n
            trace = self.rng.randbytes(16)
        now = time.time_ns()
        spans, ids = [], []
        for i in range(first, first + n):
            attrs = dict(templates()[i % len(templates())])
            attrs["gen_ai.request.id"] = f"cmpl-{i}"
            attrs.update(overrides or {})
            sid = i.to_bytes(8, "big")
            ids.append(sid.hex())
            spans.append(llm_request(attrs, trace_id=trace, span_id=sid, start_ns=now - e2e_ns(attrs), end_ns=now))
        return export_body(spans, service=self.service, instance=self.instance if instance is None else instance), ids


def build_bodies(n: int, batch: int, seed: int = 0, *, service: str = "bench", instance: str = "b-0") -> list[bytes]:
    """``n`` spans, ``batch`` per body: span ``i`` (from 0) has the attributes of template ``i`` (modulo their
    number), a random trace id and span id (drawn from ``seed``), vLLM's request id form ``cmpl-<i, hex>-0``,
    the capture's flags, and starts ``i`` ms after a start ``n`` ms before now."""
    rng = random.Random(seed)
    t0 = int(time.time() * 1e9) - n * 1_000_000
    bodies = []
    for start in range(0, n, batch):
        spans = []
        for i in range(start, min(n, start + batch)):
            attrs = dict(templates()[i % len(templates())])
            attrs["gen_ai.request.id"] = f"cmpl-{i:012x}-0"
            begin = t0 + i * 1_000_000
            trace_id = rng.randbytes(16)
            span_id = rng.randbytes(8)
            spans.append(
                llm_request(
                    attrs,
                    trace_id=trace_id,
                    span_id=span_id,
                    start_ns=begin,
                    end_ns=begin + e2e_ns(attrs),
                    flags=REMOTE_FLAGS,
                )
            )
        bodies.append(export_body(spans, service=service, instance=instance))
    return bodies
