"""``inferwatch proxy``: a streaming sidecar reverse proxy in front of an engine's HTTP API that
measures what the client sees (TTFT, gaps between chunks, duration, aborts, tokens) for every engine.

Modules: ``apis`` (the engines' generation APIs, as data), ``measure`` (one request's measurement),
``metrics`` (``/metrics`` in the ``llm_client_*`` vocabulary), ``tracing`` (one OTLP span per
request) and ``server`` (the proxy itself).
"""
