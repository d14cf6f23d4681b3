"""One export's CPU work, from the body's bytes to rows and spool lines: what the ingest worker processes run.

:func:`prepare_body` decodes an OTLP body (protobuf or JSON, plain or compressed), names models and
services (:func:`~inferwatch.collector.ingest.sources.apply_identity`), maps the spans to records, rejects
what the database would refuse (:func:`~inferwatch.collector.store.rows.refusal`) and makes each accepted
record's driver row and spool line (:func:`~inferwatch.collector.store.rows.prepare`). It is a pure function
of its arguments and its result crosses a process boundary (pickled): a body that cannot be decoded is
an ``error`` in the result, not an exception. Making the records durable (the spool's fsync, the
database) stays in the collector's own process (:mod:`inferwatch.collector.ingest.pipeline`).

Nothing here imports SQLAlchemy, a web framework or gRPC: a worker process starts with what the mapping
needs and nothing else.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inferwatch.collector.ingest.otlp import PROTOBUF, OtlpError, decode
from inferwatch.collector.ingest.sources import Identity, MappedBatch, apply_identity, map_export
from inferwatch.collector.store.rows import Prepared, refusal

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


def _gone(pid: int) -> bool:
    """The process ``pid`` has ended (or is a zombie waiting for its parent to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # Linux: a zombie still answers kill(0); its state says Z
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].startswith("Z")


def exit_with(collector_pid: int, interval: float = 0.5) -> None:
    """Worker initializer: end this worker when the collector process is gone. A collector killed without
    shutting its pool down (kill -9, an out-of-memory kill) would otherwise leave its workers waiting on
    their queue for ever, and the fork server that started them with them (it lives while they do).

    A worker ignores SIGTERM and SIGINT: they reach the whole process group (Ctrl-C in a terminal, a
    supervisor stopping the collector's group), and a worker dying under the collector mid-export broke the
    pool and started a new one during the collector's own shutdown. The collector stops its workers itself."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while not _gone(collector_pid):
            time.sleep(interval)
        os._exit(0)

    threading.Thread(target=watch, name="inferwatch-collector-watch", daemon=True).start()


def warm_up() -> int:
    """Nothing: submitted once to each new worker process, so the first export does not pay its start."""
    return 0
