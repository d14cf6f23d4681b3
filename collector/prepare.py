"""One export's CPU work, from the body's bytes to rows and spool lines: what the ingest worker processes run.

:func:`prepare_body` decodes an OTLP body (protobuf or JSON, plain or compressed), names models and
services (:func:`~inferwatch.collector.sources.apply_identity`), maps the spans to records, rejects
what the database would refuse (:func:`~inferwatch.collector.rows.refusal`) and makes each accepted
record's driver row and spool line (:func:`~inferwatch.collector.rows.prepare`). It is a pure function
of its arguments and its result crosses a process boundary (pickled): a body that cannot be decoded is
an ``error`` in the result, not an exception. Making the records durable (the spool's fsync, the
database) stays in the collector's own process (:mod:`inferwatch.collector.ingest`).

Nothing here imports SQLAlchemy, a web framework or gRPC: a worker process starts with what the mapping
needs and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inferwatch.collector.otlp import PROTOBUF, OtlpError, decode
from inferwatch.collector.rows import Prepared, refusal
from inferwatch.collector.sources import Identity, MappedBatch, apply_identity, map_export

Mapper = Callable[[ExportTraceServiceRequest], MappedBatch]


@dataclass
class PreparedExport:
    """What one export turned into: the records to write (rows and spool lines), the spans skipped and the
    reasons of those rejected; or ``error`` (HTTP status, message) when the body is refused whole."""

    kind: str
    """the media type to answer in (protobuf or JSON)."""
    spans: int = 0
    batch: Prepared = field(default_factory=lambda: Prepared([], []))
    skipped: int = 0
    rejected: list[str] = field(default_factory=list)
    """one reason per span rejected by its source or by the database's column limits."""
    error: tuple[int, str] | None = None


def prepare_export(
    request: ExportTraceServiceRequest, dialect: str, kind: str = PROTOBUF, mapper: Mapper = map_export
) -> PreparedExport:
    """Map a decoded export and prepare its accepted records for ``dialect`` (``sqlite`` or ``postgresql``)."""
    total = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    mapped = mapper(request)
    reasons = list(mapped.rejected)
    records = mapped.records
    refused = [refusal(r, dialect) for r in records]
    if any(refused):  # told now, rather than refused by the database after the answer
        reasons += [reason for reason in refused if reason is not None]
        records = [r for r, reason in zip(records, refused, strict=True) if reason is None]
    return PreparedExport(kind, total, Prepared.of(records, dialect), mapped.skipped, reasons)


def prepare_body(
    body: bytes, content_type: str | None, encoding: str | None, limit: int, identity: Identity, dialect: str
) -> PreparedExport:
    """Decode an OTLP body (at most ``limit`` bytes after decompression) and :func:`prepare_export` it."""
    try:
        request, kind = decode(body, content_type, encoding, limit)
    except OtlpError as exc:
        return PreparedExport(PROTOBUF, error=(exc.status, exc.message))
    apply_identity(request, identity)
    return prepare_export(request, dialect, kind)


def warm_up() -> int:
    """Nothing: submitted once to each new worker process, so the first export does not pay its start."""
    return 0
