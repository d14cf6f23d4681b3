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
(``"<source>: <reason>"``, short and fixed so it can be a metric label). Every record is then
validated (:func:`~inferwatch.collector.ingest.sources.shared.validate`: times between 2000 and a day from
now, latencies finite and not negative, counts within their columns); one that fails is a rejection too.

:func:`apply_identity` runs before the mapping, on the receivers' side: it names the model and the
service of resources whose spans do not (vLLM's: no model, the SDK's ``unknown_service`` placeholder),
from an :class:`Identity` the settings configure.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from inferwatch.collector.ingest.sources import genai, sglang, tgi, trtllm, vllm
from inferwatch.collector.ingest.sources.shared import (
    MODEL_KEYS,
    SERVICE_NAME,
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
    validate,
)
from inferwatch.collector.store.record import RequestRecord

__all__ = [
    "SOURCES",
    "Column",
    "ExportIndex",
    "Identity",
    "MappedBatch",
    "Rejected",
    "ResourceInfo",
    "Source",
    "SpanView",
    "any_value",
    "apply_identity",
    "attributes",
    "base_record",
    "hex_id",
    "map_export",
    "resource_info",
    "span_id",
    "timestamp",
    "trace_id",
    "validate",
]


class Source(Protocol):
    """What a source module provides."""

    @property
    def NAME(self) -> str: ...  # a module constant

    def claims(self, view: SpanView) -> bool: ...

    def to_record(self, view: SpanView) -> RequestRecord | None: ...


SOURCES: Final[tuple[Source, ...]] = (vllm, tgi, trtllm, sglang, genai)
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


def views(request: ExportTraceServiceRequest) -> Iterator[SpanView]:
    """Every span of the export with its scope and resource; all share one :class:`ExportIndex`.

    The index (spans that have a parent, for the sources that fold children in) is built first; the
    views are then made one at a time, so a large export of unrelated spans does not hold one live
    object per span (which made the garbage collector's full passes, and their pauses, grow with it).
    """
    index = ExportIndex()
    groups: list[tuple[ResourceInfo, str, Any]] = []
    for resource_spans in request.resource_spans:
        resource = resource_info(resource_spans.resource)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            groups.append((resource, scope, scope_spans.spans))
            for span in scope_spans.spans:
                if span.parent_span_id:
                    index.add(SpanView(span, scope, resource, index))
    for resource, scope, spans in groups:
        for span in spans:
            yield SpanView(span, scope, resource, index)


def map_export(request: ExportTraceServiceRequest, now: datetime | None = None) -> MappedBatch:
    """Map every span of an export: records, the number skipped and the rejection reasons.

    ``now`` (default: the clock) bounds the span times (see :func:`validate`).
    """
    batch = MappedBatch()
    now = now or datetime.now(UTC)
    for view in views(request):
        name = "unknown"
        try:
            source = next((s for s in SOURCES if s.claims(view)), None)
            if source is None:
                batch.skipped += 1
                continue
            name = source.NAME
            record = source.to_record(view)
            if record is not None:
                validate(record, now)
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


PLACEHOLDER_SERVICE: Final = "unknown_service"
"""What the OpenTelemetry SDKs call a service when ``OTEL_SERVICE_NAME`` is unset (``unknown_service:python3``)."""
MODEL_ATTRIBUTE: Final = MODEL_KEYS[-1]
"""The resource attribute :func:`apply_identity` sets (``gen_ai.request.model``), read by every source."""


@dataclass(frozen=True)
class Identity:
    """How to name the model and the service of resources whose spans do not (docs/collector.md, "Identity").

    * ``service_models``: ``service.name`` → model;
    * ``model_from``: a resource attribute whose value is the model (e.g. ``service.name``);
    * ``service_from``: a resource attribute whose value is the service when ``service.name`` is
      missing or the SDK's placeholder ``unknown_service…``.
    """

    service_models: Mapping[str, str] = field(default_factory=dict)
    model_from: str | None = None
    service_from: str | None = None

    @property
    def configured(self) -> bool:
        return bool(self.service_models or self.model_from or self.service_from)


def _is_placeholder(service: str | None) -> bool:
    return service is None or service.startswith(PLACEHOLDER_SERVICE)


def _set(resource: Resource, key: str, value: str) -> None:
    """Set ``key`` to the string ``value`` among a resource's attributes (every occurrence: the last one counts)."""
    found = False
    for kv in resource.attributes:
        if kv.key == key:
            kv.value.CopyFrom(AnyValue(string_value=value))
            found = True
    if not found:
        resource.attributes.add(key=key, value=AnyValue(string_value=value))


def apply_identity(request: ExportTraceServiceRequest, identity: Identity) -> None:
    """Name the model and service of each resource of ``request`` that does not, in place.

    Spans that name their model keep it (a span attribute wins over the resource); a resource that
    already has a model attribute keeps it. The service: ``service.name`` unless missing or the SDK
    placeholder, else the ``service_from`` attribute. The model: the resource's own, else
    ``service_models`` of the service (as sent, or as resolved), else the ``model_from`` attribute.
    """
    if not identity.configured:
        return
    for resource_spans in request.resource_spans:
        resource = resource_spans.resource
        attrs = attributes(resource.attributes)
        sent = attrs.get(SERVICE_NAME)
        sent_service = str(sent) if sent not in (None, "") else None
        service = sent_service
        if _is_placeholder(service) and identity.service_from:
            derived = attrs.get(identity.service_from)
            if derived not in (None, "") and not isinstance(derived, list | dict):
                service = str(derived)
                _set(resource, SERVICE_NAME, service)
        if any(attrs.get(k) not in (None, "") for k in MODEL_KEYS):
            continue
        model = None
        for name in (sent_service, service):
            if name is not None and name in identity.service_models:
                model = identity.service_models[name]
                break
        if model is None and identity.model_from:
            value = attrs.get(identity.model_from)
            if value not in (None, "") and not isinstance(value, list | dict):
                model = str(value)
        if model is not None:
            _set(resource, MODEL_ATTRIBUTE, model)
