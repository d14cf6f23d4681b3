"""Ingest: OTLP exports in, prepared request rows out to the store's writer.

- :mod:`~inferwatch.collector.ingest.otlp`: decoding and bounds of OTLP/HTTP bodies (protobuf, JSON,
  gzip), bearer tokens.
- :mod:`~inferwatch.collector.ingest.sources`: span → request record, one module per span source.
- :mod:`~inferwatch.collector.ingest.prepare`: decode, identify, map and prepare rows (pure; runs in
  the preparing processes).
- :mod:`~inferwatch.collector.ingest.pipeline`: the :class:`~inferwatch.collector.ingest.pipeline.Ingestor`
  both receivers call, its process pool and its metrics.
- :mod:`~inferwatch.collector.ingest.grpc_server`: the OTLP/gRPC receiver (the service starts it, so
  it lives below the service, beside the pipeline it feeds).
"""
