"""The ingest path shared by OTLP/HTTP and OTLP/gRPC: decode and map spans (in worker processes), make them
durable (in this process), count.

Two stages per export:

1. **Prepare** (CPU): decode the body, map spans to records, reject what the database would refuse, make
   each record's driver row and spool line (:func:`inferwatch.collector.ingest.prepare.prepare_body`). This runs in
   a pool of ``processes`` worker processes, so ingest uses more than the one core the GIL allows a
   process; with ``processes=0`` (or should the pool break) in this process's ingest threads.
2. **Commit** (I/O): :meth:`Ingestor.commit` offers the prepared batch to the writer, which appends it to
   the spool and fsyncs before returning (:mod:`inferwatch.collector.store.writer`), and answers. It runs in the
   ingestor's own bounded thread pool (``threads``), never on asyncio's shared default pool: a slow disk or
   database holding every ingest thread cannot starve ``/readyz`` or the read API.

:meth:`Ingestor.commit` answers only once every mapped record is durable (committed to the database or
fsync'd to the spool) or counted as rejected: a success never stands for a record that is still only in
memory, and a worker process only ever computes (it writes nothing), so neither its crash nor the pool's
loses an acknowledged span. Each span is either accepted, skipped (not an LLM request), rejected with a
reason (``partial_success``, and ``inferwatch_collector_spans_rejected_total`` by reason), or the whole
export is refused with back-pressure (429/503 and RESOURCE_EXHAUSTED/UNAVAILABLE: the client sends it
again; records already written meanwhile are deduplicated, inserts being idempotent on (trace_id, span_id)).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as MetricCounter

from inferwatch.collector.ingest.prepare import PreparedExport, exit_with, prepare_body, prepare_export, warm_up
from inferwatch.collector.ingest.sources import Identity, MappedBatch, map_export
from inferwatch.collector.settings import DEFAULT_MAX_BODY
from inferwatch.collector.store.writer import Writer
from inferwatch.core import vocabulary as V

log = logging.getLogger("inferwatch.collector")

DEFAULT_TIMEOUT_S: Final = 8.0
"""How long an export waits for its records to be durable (below the OTLP exporters' 10 s default)."""
DEFAULT_THREADS: Final = 16
"""Exports being committed at once (each waits for the spool's fsync, or in the fallback for the database)."""
REFUSALS: Final = {
    "queue_full": "write queue full, retry later",
    "spool_full": "database unreachable and the spool full, retry later",
    "stopping": "collector shutting down, retry later",
}
ADMISSION_WAIT_S: Final = 2.0
"""The longest an export waits for room in the write queue before its body is decoded. Under overload (the queue
full) a body decoded and then refused cost a worker its whole decoding for nothing, and the client sends it again:
waiting first spends that CPU on the exports that are stored. After the wait the export goes on as any other (and
is refused, counted by its spans, when there is still no room)."""
START_METHOD: Final = "forkserver"
"""Worker processes are forked from a clean server process (never from this one, whose threads a fork would
copy mid-state), with the mapping code preloaded: a pool starts in milliseconds."""


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
    """Prepares exports (worker processes) and commits them (its own threads); see the module doc.

    ``timeout``: the longest an export waits for durability; ``mapper``: spans -> records (a seam for tests;
    a custom mapper runs in this process); ``processes``: worker processes preparing exports (0: none, the
    ingest threads do it); ``threads``: exports committed at once; ``identity``: how models and services are
    named; ``max_body_bytes``: the decompressed size limit of a body.
    """

    def __init__(
        self,
        writer: Writer,
        metrics: CollectorMetrics,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        mapper: Callable[[ExportTraceServiceRequest], MappedBatch] = map_export,
        processes: int = 0,
        threads: int = DEFAULT_THREADS,
        identity: Identity | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY,
    ) -> None:
        if processes < 0 or threads < 1:
            raise ValueError("processes must be >= 0 and threads >= 1")
        self.writer = writer
        self.metrics = metrics
        self.timeout = timeout
        self.processes = processes if mapper is map_export else 0
        self.identity = identity or Identity()
        self.max_body_bytes = max_body_bytes
        self._map = mapper
        self._counted_reasons: dict[str, int] = {}
        self._lock = threading.Lock()
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    # --- pools ---

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The ingest threads (made on first use): commits, and preparation without worker processes."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="inferwatch-ingest")
            return self._executor

    def _process_pool(self) -> ProcessPoolExecutor | None:
        with self._lock:
            if self._pool is None and self.processes and not self._closed:
                context = multiprocessing.get_context(START_METHOD)
                context.set_forkserver_preload(["inferwatch.collector.ingest.prepare"])
                self._pool = ProcessPoolExecutor(
                    self.processes, mp_context=context, initializer=exit_with, initargs=(os.getpid(),)
                )
                for _ in range(self.processes):
                    self._pool.submit(warm_up)
            return self._pool

    def start(self) -> None:
        """Start the worker processes now rather than with the first export (they start in the background)."""
        self._process_pool()

    def close(self) -> None:
        """Stop the worker processes and the ingest threads (exports in progress finish first)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            executor, self._executor = self._executor, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if executor is not None:
            executor.shutdown(wait=True)

    def _broken(self, pool: ProcessPoolExecutor) -> None:
        """A worker process died (killed, out of memory): the next export starts a new pool."""
        with self._lock:
            if self._pool is pool:
                self._pool = None
            closing = self._closed
        if not closing:  # a pool shut down by close() refuses new work: no worker died
            log.error("an ingest worker process died; starting new ones (this export is prepared in-process)")
        pool.shutdown(wait=False, cancel_futures=True)

    # --- admission ---

    def _batch(self) -> int:
        return min(self.writer.batch_size, self.writer.queue_limit)

    def has_room(self) -> bool:
        """The write queue has room for another batch now (a hint, read without a lock)."""
        return self.writer.has_room(self._batch())

    def wait_for_room(self, timeout: float = ADMISSION_WAIT_S) -> bool:
        """Block until the write queue has room for another batch, at most ``timeout`` seconds (a thread's wait)."""
        return self.writer.wait_for_room(self._batch(), timeout)

    # --- the two stages ---

    def prepare(self, body: bytes, content_type: str | None, encoding: str | None) -> Future[PreparedExport]:
        """Stage 1 of an OTLP body, in a worker process (or an ingest thread); never blocks."""
        args = (body, content_type, encoding, self.max_body_bytes, self.identity, self.writer.dialect)
        pool = self._process_pool()
        if pool is None:
            return self.executor.submit(prepare_body, *args)
        outer: Future[PreparedExport] = Future()

        def done(inner: Future[PreparedExport]) -> None:
            try:
                outer.set_result(inner.result())
            except BrokenProcessPool:
                self._broken(pool)
                retry = self.executor.submit(prepare_body, *args)
                retry.add_done_callback(lambda f: _chain(f, outer))
            except BaseException as exc:
                outer.set_exception(exc)

        try:
            pool.submit(prepare_body, *args).add_done_callback(done)
        except (BrokenProcessPool, RuntimeError):  # broken, or shut down meanwhile
            self._broken(pool)
            return self.executor.submit(prepare_body, *args)
        return outer

    def ingest(self, request: ExportTraceServiceRequest) -> IngestResult:
        """Both stages of a decoded export in the calling thread (blocking; the ``mapper`` seam applies)."""
        return self.commit(prepare_export(request, self.writer.dialect, mapper=self._map))

    def commit(self, prepared: PreparedExport) -> IngestResult:
        """Stage 2: write ahead, wait until durable, count (blocking: call it from an ingest thread)."""
        total = prepared.spans
        reasons = list(prepared.rejected)
        counted_here = list(reasons)  # the writer counts the database's own refusals (see refresh)
        accepted = 0
        if len(prepared.batch):
            ticket = self.writer.offer_prepared(prepared.batch)
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
        self.metrics.skipped.inc(prepared.skipped)
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


def _chain(source: Future[PreparedExport], target: Future[PreparedExport]) -> None:
    try:
        target.set_result(source.result())
    except BaseException as exc:
        target.set_exception(exc)
