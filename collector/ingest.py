"""The ingest path shared by OTLP/HTTP and OTLP/gRPC: map spans to requests, make them durable, count.

:meth:`Ingestor.ingest` answers only once every mapped record is durable (committed to the database or
fsync'd to the spool, see :mod:`inferwatch.collector.writer`) or counted as rejected: a success never
stands for a record that is still only in memory. Each span is either accepted, skipped (not an LLM
request), rejected with a reason (``partial_success``, and ``inferwatch_collector_spans_rejected_total``
by reason), or the whole export is refused with back-pressure (429/503 and RESOURCE_EXHAUSTED/UNAVAILABLE:
the client sends it again; records already written meanwhile are deduplicated).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as MetricCounter

from inferwatch.collector.db import refusal
from inferwatch.collector.sources import MappedBatch, map_export
from inferwatch.collector.writer import Writer
from inferwatch.core import vocabulary as V

DEFAULT_TIMEOUT_S: Final = 8.0
"""How long an export waits for its records to be durable (below the OTLP exporters' 10 s default)."""
REFUSALS: Final = {
    "queue_full": "write queue full, retry later",
    "spool_full": "database unreachable and the spool full, retry later",
    "stopping": "collector shutting down, retry later",
}


@dataclass
class IngestResult:
    accepted: int
    rejected: int
    message: str = ""
    backpressure: bool = False
    """nothing was accepted: answer 429/503 (the client retries)."""
    unavailable: bool = False
    """the back-pressure comes from the database (unreachable, too slow, spool full): 503, not 429."""


class CollectorMetrics:
    """The collector's self-metrics, on a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry

        def counter(spec: V.MetricSpec, labels: tuple[str, ...] = ()) -> MetricCounter:
            return MetricCounter(spec.name.removesuffix("_total"), spec.help, labelnames=labels, registry=r)

        self.received = counter(V.COLLECTOR_SPANS_RECEIVED)
        self.stored = counter(V.COLLECTOR_REQUESTS_STORED)
        self.rejected = counter(V.COLLECTOR_SPANS_REJECTED, ("reason",))
        self.skipped = counter(V.COLLECTOR_SPANS_SKIPPED)
        self.duplicates = counter(V.COLLECTOR_DUPLICATES)
        self.queue_depth = Gauge(V.COLLECTOR_QUEUE_DEPTH.name, V.COLLECTOR_QUEUE_DEPTH.help, registry=r)
        self.spooled = Gauge(V.COLLECTOR_SPOOLED.name, V.COLLECTOR_SPOOLED.help, registry=r)
        self.batch_seconds = Gauge(V.COLLECTOR_BATCH_SECONDS.name, V.COLLECTOR_BATCH_SECONDS.help, registry=r)
        self.db_up = Gauge(V.COLLECTOR_DB_UP.name, V.COLLECTOR_DB_UP.help, registry=r)


class Ingestor:
    """``timeout``: the longest an export waits for durability; ``mapper``: spans -> records (a seam for tests)."""

    def __init__(
        self,
        writer: Writer,
        metrics: CollectorMetrics,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        mapper: Callable[[ExportTraceServiceRequest], MappedBatch] = map_export,
    ) -> None:
        self.writer = writer
        self.metrics = metrics
        self.timeout = timeout
        self._map = mapper
        self._counted_reasons: dict[str, int] = {}

    def ingest(self, request: ExportTraceServiceRequest) -> IngestResult:
        """Map, write, wait until durable (blocking: call it from a worker thread)."""
        total = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        batch = self._map(request)
        reasons = list(batch.rejected)
        records = batch.records
        dialect = self.writer.engine.dialect.name
        refused = [(r, refusal(r, dialect)) for r in records]
        if any(reason for _, reason in refused):  # told now, rather than refused after the answer
            records = [r for r, reason in refused if reason is None]
            reasons += [reason for _, reason in refused if reason is not None]
        counted_here = list(reasons)  # the writer counts the database's own refusals (see refresh)
        accepted = 0
        if records:
            ticket = self.writer.offer(records)
            if ticket.refused is not None:
                self.metrics.rejected.labels(reason=ticket.refused).inc(total)
                message = REFUSALS.get(ticket.refused, ticket.refused)
                unavailable = ticket.refused != "queue_full" or not self.writer.db_ok
                return IngestResult(0, total, message, backpressure=True, unavailable=unavailable)
            if not ticket.wait(self.timeout):  # only without a spool copy: waiting for the database commit
                # still queued: it will be written, and the client's retry deduplicated
                self.metrics.rejected.labels(reason="write_timeout").inc(total)
                message = f"not stored within {self.timeout:g} s (database slow or unreachable), retry later"
                return IngestResult(0, total, message, backpressure=True, unavailable=True)
            if ticket.failed:
                self.metrics.rejected.labels(reason="not_durable").inc(total)
                message = f"{ticket.error or 'not stored'}, retry later"
                return IngestResult(0, total, message, backpressure=True, unavailable=True)
            accepted = ticket.durable
            for reason, n in ticket.rejected.items():
                reasons += [reason] * n
        self.metrics.received.inc(total)
        self.metrics.skipped.inc(batch.skipped)
        for reason in counted_here:
            self.metrics.rejected.labels(reason=reason[:80]).inc()
        message = "; ".join(sorted(set(reasons)))[:500]
        return IngestResult(accepted, len(reasons), message)

    def refresh(self) -> None:
        """Copy the writer's counters into the self-metrics (called before rendering /metrics)."""
        w = self.writer
        stats = w.snapshot()
        m = self.metrics
        for counter, value in ((m.stored, stats.stored), (m.duplicates, stats.duplicates)):
            delta = value - counter._value.get()
            if delta > 0:
                counter.inc(delta)
        for reason, value in stats.rejected_reasons.items():
            delta = value - self._counted_reasons.get(reason, 0)
            if delta > 0:
                m.rejected.labels(reason=reason[:80]).inc(delta)
                self._counted_reasons[reason] = value
        m.queue_depth.set(w.queue_depth)
        m.spooled.set(stats.spooled - stats.replayed if stats.spooled >= stats.replayed else 0)
        m.batch_seconds.set(stats.last_batch_seconds)
        m.db_up.set(1 if w.db_ok else 0)
