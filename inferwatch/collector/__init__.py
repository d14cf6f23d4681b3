"""inferwatch collector: per-request LLM traces over OTLP into a SQL request store, and the read API.

``app`` (``create_app``) mounts the ``routes`` (one router each: otlp, health, requests, stats) on a
``service.Collector`` built from the settings; ``deps`` gives routes the collector, its engine and
the bearer-token scopes; ``schemas`` are the response bodies; ``store`` holds the read queries and
``db`` the engine, migrations and writes of the table in ``models``; ``writer`` queues, writes ahead
to the ``spool`` and replays it; ``ingest`` maps OTLP exports to records (``sources``) for both
``routes.otlp`` and ``grpc_server``.
"""
