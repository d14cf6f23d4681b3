"""What one collector process holds, built from its settings: engine, writer, self-metrics, ingestor,
and the OTLP/gRPC server once started.

The HTTP app (:mod:`inferwatch.collector.api.app`) and the gRPC server
(:mod:`inferwatch.collector.ingest.grpc_server`) both hang off a :class:`Collector`; neither imports the other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from inferwatch.collector.diagnosis.diagnoser import OnCall
from inferwatch.collector.incidents.enrich import LinkSettings
from inferwatch.collector.incidents.intake import Intaker
from inferwatch.collector.incidents.notify import NotifyConfig, load_notify_config
from inferwatch.collector.incidents.worker import AlertWorker
from inferwatch.collector.ingest.grpc_server import start_grpc_server
from inferwatch.collector.ingest.pipeline import CollectorMetrics, Ingestor
from inferwatch.collector.ingest.sources import Identity
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.store import db
from inferwatch.collector.store.datadir import DataDirLock
from inferwatch.collector.store.writer import Writer

WRITER_STOP_TIMEOUT_S = 10.0
"""At least this long for the writer to write out what is queued at shutdown (then the rest is spooled)."""
GRPC_GRACE_S = 2.0


@dataclass
class Collector:
    """One collector; reachable from a request as ``request.app.state.collector`` (see :mod:`.deps`)."""

    settings: CollectorSettings
    engine: Engine
    writer: Writer
    metrics: CollectorMetrics
    ingestor: Ingestor
    oncall: OnCall
    intaker: Intaker
    alerts: AlertWorker
    owns_engine: bool = False
    """True when :func:`build` made the engine (then :meth:`stop` disposes it)."""
    stats_engine: Engine | None = None
    """PostgreSQL: the statistics reads' own engine (:func:`~inferwatch.collector.store.db.make_stats_engine`), made
    and disposed with an engine of our own; None: :attr:`engine` serves them."""
    grpc_server: Any = None
    lock: DataDirLock | None = None
    """The data directory's lock, held from :meth:`start` to :meth:`stop`."""

    def start(self, *, grpc: bool = True) -> None:
        """Lock the data directory (:class:`~inferwatch.collector.store.datadir.DataDirInUse` when another collector has
        it), start the writer thread (which replays the spool), the ingest worker processes and, with ``grpc`` and
        ``settings.grpc_listen``, the OTLP/gRPC server."""
        if self.lock is None:
            self.lock = DataDirLock(self.settings.data_dir)
        self.lock.acquire()  # before anything reads or writes the spool
        self.writer.start()
        self.ingestor.start()
        if grpc and self.settings.grpc_listen:
            try:
                self.grpc_server = start_grpc_server(self.settings, self.ingestor)
            except BaseException:
                self.stop()
                raise

    def stop(self) -> None:
        """Stop receiving (gRPC), finish the exports in progress, write out what is queued, release the engine if it
        is ours. Blocking."""
        if self.grpc_server is not None:
            self.grpc_server.stop(grace=GRPC_GRACE_S).wait()
            self.grpc_server = None
        self.ingestor.close()
        if self.lock is not None and self.lock.held:  # not ours otherwise: another collector's spool
            try:
                self.writer.stop(max(WRITER_STOP_TIMEOUT_S, self.settings.db_write_timeout_seconds + 2))
            finally:
                self.lock.release()
        if self.owns_engine:  # a caller's engine stays the caller's
            self.engine.dispose()
            if self.stats_engine is not None:
                self.stats_engine.dispose()

    @property
    def stats_reader(self) -> Engine:
        """The engine the statistics reads use."""
        return self.stats_engine or self.engine


def build(settings: CollectorSettings, engine: Engine | None = None) -> Collector:
    """A collector for ``settings``, its schema migrated to head; ``engine`` may be passed in (tests)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    owns_engine = engine is None
    engine = engine or db.make_engine(settings.url(), db_timeouts(settings))
    db.ensure_schema(engine)
    writer = Writer(
        engine,
        spool_path=settings.spool_path(),
        queue_limit=settings.queue_limit,
        batch_size=settings.batch_size,
        retention=settings.retention_delta(),
        write_timeout=settings.db_write_timeout_seconds,
        spool_max_bytes=settings.spool_max_bytes,
        segment_bytes=settings.spool_segment_bytes,
    )
    metrics = CollectorMetrics()
    on = oncall(settings)
    # made now, not on the event loop at the first diagnosis: a new client reads the CA bundle, which blocks
    # (docs/collector.md, 'measurements')
    on._client()
    notify = load_notify_config(settings.notify_config) if settings.notify_config else NotifyConfig()
    links = LinkSettings(grafana_url=settings.grafana_url, public_url=settings.link_base(), secret=settings.link_key())
    return Collector(
        settings,
        engine,
        writer,
        metrics,
        Ingestor(
            writer,
            metrics,
            timeout=settings.ingest_timeout_seconds,
            processes=ingest_processes(settings),
            threads=settings.ingest_threads,
            identity=Identity(settings.service_models, settings.model_from, settings.service_from),
            max_body_bytes=settings.max_body_bytes,
        ),
        on,
        Intaker(engine),
        AlertWorker(engine, on, notify, links),
        owns_engine=owns_engine,
        stats_engine=db.make_stats_engine(settings.url(), db_timeouts(settings)) if owns_engine else None,
    )


def ingest_processes(settings: CollectorSettings) -> int:
    """The ingest worker processes the settings ask for (by default one per CPU, none on a single CPU)."""
    if settings.ingest_processes is not None:
        return settings.ingest_processes
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cpus if cpus > 1 else 0


def db_timeouts(settings: CollectorSettings) -> db.DbTimeouts:
    """The database timeouts the settings ask for."""
    return db.DbTimeouts(
        connect=settings.db_connect_timeout_seconds,
        statement=settings.db_statement_timeout_seconds,
        pool=settings.db_pool_timeout_seconds,
        busy=settings.sqlite_busy_timeout_seconds,
    )


def oncall(settings: CollectorSettings) -> OnCall:
    """The on-call surface configured from the settings (its SLO file read now: a bad one fails the start)."""
    from inferwatch.core import resources
    from inferwatch.core.config import InferwatchSettings
    from inferwatch.core.engines import builtin_profiles
    from inferwatch.core.slo import load
    from inferwatch.core.symptoms import Symptom

    path = settings.slo_file or resources.default_slo_path()
    slos = load(path, InferwatchSettings().vocabulary())
    return OnCall(
        profiles=builtin_profiles(),
        slos=slos,
        prometheus_url=settings.prometheus_url,
        exporter_urls=list(settings.exporters),
        timeout=settings.upstream_timeout_seconds,
        interval=settings.exporter_interval_seconds,
        overrides={Symptom(k): v for k, v in settings.diagnose_thresholds.items()},
        gpu=settings.gpu,
    )
