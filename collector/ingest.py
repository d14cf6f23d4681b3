"""The ingest path shared by OTLP/HTTP and OTLP/gRPC: map spans to requests, queue them, count."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry, Counter, Gauge

from inferwatch.collector.sources import map_export
from inferwatch.collector.writer import Writer
from inferwatch.core import vocabulary as V


@dataclass
class IngestResult:
    accepted: int
    rejected: int
    message: str = ""
    backpressure: bool = False


class CollectorMetrics:
    """The collector's self-metrics, on a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry

        def counter(spec: V.MetricSpec, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(spec.name.removesuffix("_total"), spec.help, labelnames=labels, registry=r)

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
    def __init__(self, writer: Writer, metrics: CollectorMetrics) -> None:
        self.writer = writer
        self.metrics = metrics

    def ingest(self, request: ExportTraceServiceRequest) -> IngestResult:
        total = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        batch = map_export(request)
        if batch.records and not self.writer.submit(batch.records):
            self.metrics.rejected.labels(reason="queue_full").inc(total)
            return IngestResult(0, total, "write queue full, retry later", backpressure=True)
        self.metrics.received.inc(total)
        self.metrics.skipped.inc(batch.skipped)
        for reason in batch.rejected:
            self.metrics.rejected.labels(reason=reason[:80]).inc()
        message = "; ".join(sorted(set(batch.rejected)))[:500]
        return IngestResult(len(batch.records), len(batch.rejected), message)

    def refresh(self) -> None:
        """Copy the writer's counters into the self-metrics (called before rendering /metrics)."""
        w = self.writer
        stats = w.snapshot()
        m = self.metrics
        for counter, value in ((m.stored, stats.stored), (m.duplicates, stats.duplicates)):
            delta = value - counter._value.get()
            if delta > 0:
                counter.inc(delta)
        m.queue_depth.set(w.queue_depth)
        m.spooled.set(stats.spooled - stats.replayed if stats.spooled >= stats.replayed else 0)
        m.batch_seconds.set(stats.last_batch_seconds)
        m.db_up.set(1 if w.db_ok else 0)
