"""``inferwatch collector`` and ``inferwatch db``: the OTLP trace store and its migrations."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from inferwatch.cli.common import err, fail, loop_factory, needs_extra, setup_logging
from inferwatch.core.config import ConfigError

MIGRATION_TIMEOUT_S = 24 * 3600.0
"""The statement timeout of ``db upgrade``."""

collector_app = typer.Typer(
    help="The collector: per-request LLM traces over OTLP (HTTP and gRPC) into a SQL request store.",
    no_args_is_help=True,
)
db_app = typer.Typer(help="The collector's database (Alembic migrations).", no_args_is_help=True)


def _collector_settings(**overrides: Any) -> Any:
    with needs_extra("collector", "collector"):
        from inferwatch.collector.settings import CollectorSettings

    try:
        return CollectorSettings(**{k: v for k, v in overrides.items() if v is not None})
    except (ConfigError, ValueError) as exc:
        raise fail(f"invalid collector settings: {exc}") from None


@collector_app.command("serve")
def collector_serve(
    database_url: Annotated[str | None, typer.Option(help="SQLAlchemy URL (default: SQLite under --data-dir).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Directory for the SQLite file and the spool.")] = None,
    listen: Annotated[str | None, typer.Option(help="OTLP/HTTP and API address (default 127.0.0.1:4318).")] = None,
    grpc_listen: Annotated[str | None, typer.Option(help="OTLP/gRPC address (default 127.0.0.1:4317).")] = None,
    retention: Annotated[str | None, typer.Option(help="Delete requests older than this, e.g. 7d.")] = None,
    ingest_token: Annotated[list[str] | None, typer.Option(help="Bearer token for OTLP (repeatable).")] = None,
    read_token: Annotated[list[str] | None, typer.Option(help="Bearer token for the API (repeatable).")] = None,
    insecure: Annotated[bool, typer.Option(help="Allow a non-loopback address without tokens.")] = False,
    prometheus_url: Annotated[
        str | None, typer.Option(help="Prometheus with the generated rules: the diagnosis and SLO status read it.")
    ] = None,
    exporter: Annotated[
        list[str] | None,
        typer.Option(
            help="Exporter URL the diagnosis scrapes without (or when it cannot read) Prometheus. Repeatable."
        ),
    ] = None,
    slo: Annotated[Path | None, typer.Option(help="SLO file (default: the SLOs that ship with inferwatch).")] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU model of the fleet (e.g. H100), for the checklist.")] = None,
    notify_config: Annotated[
        Path | None, typer.Option(help="Notify file: the receivers incidents are forwarded to (json, slack).")
    ] = None,
    grafana_url: Annotated[str | None, typer.Option(help="Grafana's base URL, for dashboard links.")] = None,
    public_url: Annotated[
        str | None, typer.Option(help="This collector's URL as users reach it, for incident page links.")
    ] = None,
    max_connections: Annotated[
        int | None,
        typer.Option(
            help="Open HTTP connections, slow and idle ones included; at the cap the one waiting longest for its "
            "request is closed (default: the file descriptor limit less 256)."
        ),
    ] = None,
    max_requests: Annotated[
        int | None, typer.Option(help="Requests handled at once before new ones get 503 (default 100).")
    ] = None,
    max_uploads: Annotated[
        int | None,
        typer.Option(
            help="Requests receiving their body at once; at the cap the oldest is closed (503, Retry-After: 1) for "
            "the new one (default 256: 1 GiB of 4 MiB bodies). Requests without a body never count."
        ),
    ] = None,
    header_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds a client has to send a request's line and headers (default 10); then 408."),
    ] = None,
    body_timeout: Annotated[
        float | None, typer.Option(help="Seconds a client has to send a request's body (default 10); then 408.")
    ] = None,
    keep_alive_timeout: Annotated[
        float | None, typer.Option(help="Seconds an idle HTTP keep-alive connection stays open (default 15).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Receive OTLP traces (vLLM, TGI, trtllm-serve, any GenAI spans), store one row per LLM request.

    Migrations run at start when the database is empty. The read API is at /api/v1 (OpenAPI at /docs);
    with --prometheus-url or --exporter it also answers /api/v1/diagnose, /checklist, /capacity and /slos.
    Alertmanager's webhook is /api/v1/alerts/webhook: incidents are enriched with the diagnosis and
    forwarded to the --notify-config receivers; each has a page at /incidents/ID.
    """
    import asyncio
    import contextlib

    with needs_extra("collector", "collector serve"):
        import uvicorn

        from inferwatch.collector.api.app import create_app
        from inferwatch.collector.store.datadir import DataDirInUse, DataDirLock

    setup_logging(log_level)
    settings = _collector_settings(
        database_url=database_url,
        data_dir=data_dir,
        listen=listen,
        grpc_listen=grpc_listen,
        retention=retention,
        ingest_tokens=ingest_token,
        read_tokens=read_token,
        insecure=insecure or None,
        prometheus_url=prometheus_url,
        exporters=exporter,
        slo_file=slo,
        gpu=gpu,
        notify_config=notify_config,
        grafana_url=grafana_url,
        public_url=public_url,
        max_connections=max_connections,
        max_requests=max_requests,
        max_uploads=max_uploads,
        header_timeout_seconds=header_timeout,
        body_timeout_seconds=body_timeout,
        keep_alive_timeout_seconds=keep_alive_timeout,
    )
    lock = DataDirLock(settings.data_dir)
    try:
        settings.check_exposure()
        lock.acquire()  # one collector per data directory: refused here, before anything touches the spool
        application = create_app(settings)
    except DataDirInUse as exc:
        raise fail(str(exc), code=3) from None
    except (ConfigError, ValueError) as exc:
        lock.release()
        raise fail(str(exc)) from None
    application.state.collector.lock = lock  # held until the collector stops
    from inferwatch.core.config import parse_listen

    host, port = parse_listen(settings.listen)

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    server = _Server(uvicorn_config(application, settings, log_level))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        await server.serve()

    err.print(
        f"inferwatch collector: OTLP/HTTP + API on http://{host}:{port}, OTLP/gRPC on "
        f"{settings.grpc_listen or 'off'}, database {settings.url().split('@')[-1]}"
    )
    try:
        with asyncio.Runner(loop_factory=loop_factory("auto")) as runner:  # uvloop: less CPU per export
            runner.run(main())
    except SystemExit as exc:  # uvicorn's exit when the lifespan fails (e.g. the gRPC port is taken)
        if exc.code not in (0, None):
            raise fail("the collector did not start (the error is above)", code=3) from None
        raise
    if not server.started:
        raise fail("the collector did not start (the error is above)", code=3)


def uvicorn_config(application: Any, settings: Any, log_level: str = "info") -> Any:
    """uvicorn's configuration for the collector app: its address, and the limits of the settings on uvicorn's
    httptools protocol (:mod:`inferwatch.collector.api.slowclients`: header and body deadlines, the connection,
    request and upload caps; ``keep_alive_timeout_seconds`` → ``timeout_keep_alive``). uvicorn's own
    ``limit_concurrency`` is not used: it counts connections, so slow ones held it."""
    import uvicorn

    from inferwatch.collector.api.slowclients import HttpLimits, bounded_protocol
    from inferwatch.core.config import parse_listen
    from inferwatch.core.connections import connection_cap

    host, port = parse_listen(settings.listen)
    limits = HttpLimits(
        header_timeout=settings.header_timeout_seconds,
        body_timeout=settings.body_timeout_seconds,
        max_requests=settings.max_requests,
        max_connections=settings.max_connections or connection_cap(),
        max_uploads=settings.max_uploads,
    )
    return uvicorn.Config(
        application,
        host=host,
        port=port,
        log_level=log_level.lower(),
        lifespan="on",
        http=bounded_protocol(limits),
        timeout_keep_alive=settings.keep_alive_timeout_seconds,
    )


@db_app.command("upgrade")
def db_upgrade(
    database_url: Annotated[str | None, typer.Option(help="SQLAlchemy URL (default: SQLite under --data-dir).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Directory of the default SQLite file.")] = None,
    revision: Annotated[str, typer.Option(help="Target revision.")] = "head",
) -> None:
    """Apply the collector's migrations (on PostgreSQL under the lock collectors take to migrate at start: it waits
    for one that is migrating now)."""
    with needs_extra("collector", "db upgrade"):
        from inferwatch.collector.store import db

    settings = _collector_settings(database_url=database_url, data_dir=data_dir)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # a migration may wait for the lock, and rebuild the indexes of a large table, for a long time
    engine = db.make_engine(settings.url(), db.DbTimeouts(statement=MIGRATION_TIMEOUT_S))
    db.upgrade(engine, revision)
    err.print(f"database at revision {db.current_revision(engine)}")
