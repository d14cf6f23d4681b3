"""inferwatch collector: per-request LLM traces over OTLP into a SQL request store, the read API and
the on-call surface. Six parts, layered (``make lint`` checks it; docs/architecture.md draws it):

- :mod:`~inferwatch.collector.api`: the FastAPI app (``create_app``), its dependencies, security
  headers, the slow-client bounds and the routes: ``traces`` (OTLP/HTTP), ``health``,
  ``request_log``, ``statistics``, ``answers`` (diagnose, checklist, capacity, SLOs) and
  ``webhooks`` (Alertmanager intake, incidents, incident pages).
- :mod:`~inferwatch.collector.service`: the :class:`~inferwatch.collector.service.Collector` built
  from the settings: database, writer, ingest, gRPC server, diagnosis and the alert worker.
- :mod:`~inferwatch.collector.incidents`: webhook payloads, incidents, enrichment, the outbox of
  deliveries, the forwarded messages and the incident pages.
- :mod:`~inferwatch.collector.diagnosis`: signals from Prometheus or the exporters, symptoms, the
  tuning checklist and SLO burn.
- :mod:`~inferwatch.collector.stats`: the read side: the statistics planner and its plans, rollups,
  value blocks and the quantile sketch, the request/side filters.
- :mod:`~inferwatch.collector.ingest`: OTLP decoding, span sources (one per engine), the preparing
  processes and the gRPC receiver.
- :mod:`~inferwatch.collector.store`: the tables, records and rows, the database (engine,
  migrations, writes), the spool and the writer thread, the data-directory lock.
- :mod:`~inferwatch.collector.schemas` (the API's bodies) and
  :mod:`~inferwatch.collector.settings` (``INFERWATCH_COLLECTOR_*``) sit below them all.
"""
