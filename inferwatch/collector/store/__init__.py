"""The request store: what is written, and how it survives.

- :mod:`~inferwatch.collector.store.tables`: the SQLAlchemy tables (requests, rollups, value blocks,
  incidents, deliveries); migrations compare against them.
- :mod:`~inferwatch.collector.store.record` and :mod:`~inferwatch.collector.store.rows`: a request as
  a record, a driver row and a spool line.
- :mod:`~inferwatch.collector.store.db`: engines, timeouts and migrations.
- :mod:`~inferwatch.collector.store.inserts`: the inserts (COPY on PostgreSQL);
  :mod:`~inferwatch.collector.store.retention`: the oldest-first deletes of retention and their schedule.
- :mod:`~inferwatch.collector.store.spool` and :mod:`~inferwatch.collector.store.writer`: the
  write-ahead log and the thread that applies it to the database (:mod:`~inferwatch.collector.store.tickets`:
  what became of the records offered to it).
- :mod:`~inferwatch.collector.store.datadir`: one collector per data directory.
"""
