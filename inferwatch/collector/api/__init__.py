"""The collector's HTTP surface: :func:`~inferwatch.collector.api.app.create_app` and what it mounts.

- :mod:`~inferwatch.collector.api.deps`: the collector, its engine and the bearer-token scopes, as
  FastAPI dependencies.
- :mod:`~inferwatch.collector.api.headers`: security headers (CSP, frame, referrer) on every answer.
- :mod:`~inferwatch.collector.api.slowclients`: header/body deadlines and connection limits under uvicorn.
- :mod:`~inferwatch.collector.api.routes`: one router module per concern.
"""
