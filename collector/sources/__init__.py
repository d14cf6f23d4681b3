"""Span -> request mapping, one module per source (like the exporters' engine modules).

:func:`map_export` walks an OTLP ``ExportTraceServiceRequest`` and hands each span to the first source
in :data:`SOURCES` that claims it. A source module is mostly data (attribute key → record field
tables) plus two functions:

* ``claims(view) -> bool``: the span belongs to this source (its request spans and the spans around
  them that it knows to skip);
* ``to_record(view) -> RequestRecord | None``: the request record, ``None`` for a claimed span that is
  not an LLM request (counted as skipped), or ``Rejected(reason)`` for a request span that cannot
  become a record.

Spans no source claims (HTTP middleware, other services) are skipped. Nothing here raises on bad
input: a malformed request span, or a source failing on it, becomes one rejection reason
(``"<source>: <reason>"``, short and fixed so it can be a metric label).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inferwatch.collector.record import RequestRecord
from inferwatch.collector.sources import genai, tgi, trtllm, vllm
from inferwatch.collector.sources.common import (
    Column,
    ExportIndex,
    Rejected,
    ResourceInfo,
    SpanView,
    any_value,
    attributes,
    base_record,
    hex_id,
    resource_info,
    span_id,
    timestamp,
    trace_id,
)

__all__ = [
    "SOURCES",
    "Column",
    "ExportIndex",
    "MappedBatch",
    "Rejected",
    "ResourceInfo",
    "Source",
    "SpanView",
    "any_value",
    "attributes",
    "base_record",
    "hex_id",
    "map_export",
    "resource_info",
    "span_id",
    "timestamp",
    "trace_id",
]


class Source(Protocol):
    """What a source module provides."""

    @property
    def NAME(self) -> str: ...  # a module constant

    def claims(self, view: SpanView) -> bool: ...

    def to_record(self, view: SpanView) -> RequestRecord | None: ...


SOURCES: Final[tuple[Source, ...]] = (vllm, tgi, trtllm, genai)
"""In dispatch order: vLLM before trtllm-serve (whose span imitates vLLM's; vLLM defers to it), the
generic GenAI conventions last."""


@dataclass
class MappedBatch:
    """What one export request turned into."""

    records: list[RequestRecord] = field(default_factory=list)
    skipped: int = 0
    """spans that are not LLM requests (start-up, middleware, child spans folded into a record, health…)."""
    rejected: list[str] = field(default_factory=list)
    """one reason per LLM-request span that could not become a record."""


def views(request: ExportTraceServiceRequest) -> list[SpanView]:
    """Every span of the export with its scope and resource; all share one :class:`ExportIndex`."""
    index = ExportIndex()
    out: list[SpanView] = []
    for resource_spans in request.resource_spans:
        resource = resource_info(resource_spans.resource)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for span in scope_spans.spans:
                view = SpanView(span, scope, resource, index)
                index.add(view)
                out.append(view)
    return out


def map_export(request: ExportTraceServiceRequest) -> MappedBatch:
    """Map every span of an export: records, the number skipped and the rejection reasons."""
    batch = MappedBatch()
    for view in views(request):
        name = "unknown"
        try:
            source = next((s for s in SOURCES if s.claims(view)), None)
            if source is None:
                batch.skipped += 1
                continue
            name = source.NAME
            record = source.to_record(view)
        except Rejected as exc:
            batch.rejected.append(f"{name}: {exc.reason}")
            continue
        except Exception as exc:  # a source bug or input it did not foresee must not lose the batch
            batch.rejected.append(f"{name}: unexpected {type(exc).__name__}")
            continue
        if record is None:
            batch.skipped += 1
        else:
            batch.records.append(record)
    return batch
