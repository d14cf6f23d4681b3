"""``inferwatch proxy``: the streaming sidecar proxy that measures what the client sees."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Literal

import typer

from inferwatch.cli.common import err, fail, loop_factory, needs_extra, setup_logging
from inferwatch.core import vocabulary as V
from inferwatch.core.config import ConfigError, SimEngine, parse_listen

GC_THRESHOLD = 20_000
"""The proxy's young-generation GC threshold (Python's default: 700); see :func:`proxy`."""
OtlpChoice = Literal["http/protobuf", "grpc"]
LoopChoice = Literal["auto", "uvloop", "asyncio"]


def proxy(
    upstream: Annotated[str, typer.Option(help="The engine's HTTP API, e.g. http://127.0.0.1:8000.")],
    listen: Annotated[str, typer.Option(help="HOST:PORT the clients connect to.")] = "127.0.0.1:8080",
    engine: Annotated[
        SimEngine | None,
        typer.Option(help="The engine behind (its APIs, health and models). Default: any API, engine unknown."),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model label for requests that name none (default: asked of the engine).")
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds the engine may stay silent (before its answer, between chunks).")
    ] = 300.0,
    max_body_bytes: Annotated[int, typer.Option(help="Larger request bodies are refused with 413.")] = 16 << 20,
    header_timeout: Annotated[
        float, typer.Option(help="Seconds a client has to send a request's line and headers; then 408.")
    ] = 10.0,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds a client has to send a request's body; then 408.")
    ] = 30.0,
    keep_alive_timeout: Annotated[float, typer.Option(help="Seconds an idle client connection is kept.")] = 15.0,
    max_connections: Annotated[
        int | None,
        typer.Option(
            help="Client connections at most; at the cap the one waiting longest for its request is closed, and "
            "when all have one in progress newcomers get 503 (default: the file descriptor limit less 256, halved)."
        ),
    ] = None,
    otlp_endpoint: Annotated[
        str | None, typer.Option(help="Send one span per request here (e.g. http://127.0.0.1:4318/v1/traces).")
    ] = None,
    otlp_protocol: Annotated[OtlpChoice, typer.Option(help="OTLP transport.")] = "http/protobuf",
    service_name: Annotated[str, typer.Option(help="service.name of the spans.")] = V.PROXY_SERVICE,
    metrics_listen: Annotated[
        str | None,
        typer.Option(help="Serve /metrics, /healthz, /readyz on this HOST:PORT, not on --listen."),
    ] = None,
    tenant_key_file: Annotated[
        Path | None,
        typer.Option(
            help="A file holding the secret (16 bytes at least) of the keyed hash that names each tenant: "
            "HMAC-SHA256 of the request's API key (Authorization: Bearer KEY), 16 hex digits; the key itself "
            "is never kept. Else the environment variable INFERWATCH_TENANT_KEY; else a random secret per "
            "process (tenant ids then change at every restart)."
        ),
    ] = None,
    tenant_header: Annotated[
        str | None,
        typer.Option(
            help="Name tenants by this request header's value instead (1-64 letters, digits, '._:@-'; "
            "other values count as 'other')."
        ),
    ] = None,
    tenant_top: Annotated[
        int,
        typer.Option(
            help="Tenant label values the metrics keep: the busiest tenants by requests (ranked every "
            "--tenant-period); every other request counts as tenant 'other' (0..1000). Spans carry every tenant."
        ),
    ] = 10,
    tenant_period: Annotated[float, typer.Option(help="Seconds between two rankings of the busiest tenants.")] = 600.0,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "info",
    loop: Annotated[
        LoopChoice,
        typer.Option(help="Event loop: uvloop (less latency per chunk), asyncio's own; auto: uvloop if installed."),
    ] = "auto",
) -> None:
    """Proxy an engine's HTTP API and measure what its clients see.

    Put it beside the engine (same pod or host) and point the clients at --listen. Every request
    passes unchanged (headers minus hop-by-hop ones, bodies never logged); streamed bytes go on as
    they arrive. Generation requests (OpenAI completions and chat, TGI generate and
    generate_stream, Triton generate and generate_stream) are measured: time to the first content,
    every gap between chunks, duration, outcome (stop, length, abort, error) and tokens, as the
    llm_client_* metrics on /metrics, and one OTLP span each with --otlp-endpoint.

    Tenants: each request's tenant is a keyed hash of its API key (never the key), or the value of
    --tenant-header; the metrics keep the --tenant-top busiest (the rest: 'other'), the spans carry
    every tenant (the collector's /api/v1/usage sums them).

    Faults: engine unreachable: 502; silent for --timeout: 504; the proxy out of file descriptors or at
    --max-connections: 503 (the JSON body says "side": "proxy"); a client slower than --header-timeout or
    --body-timeout: 408; a client that goes away has its engine request cancelled.
    """
    import gc
    import importlib.util

    with needs_extra("proxy", "proxy"):
        from inferwatch.proxy.server import ProxySettings, run
        from inferwatch.proxy.tenants import MAX_TOP, TenantKeyError, TenantSettings, check_header_name, load_key

    try:
        host, port = parse_listen(listen)
        mhost, mport = parse_listen(metrics_listen) if metrics_listen else (None, None)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    if not upstream.startswith(("http://", "https://")):
        raise fail(f"--upstream must be an http:// or https:// URL, got {upstream!r}")
    if min(timeout, max_body_bytes, header_timeout, body_timeout, keep_alive_timeout, max_connections or 1) <= 0:
        raise fail(
            "--timeout, --max-body-bytes, --header-timeout, --body-timeout, --keep-alive-timeout and "
            "--max-connections must be positive"
        )
    if otlp_endpoint and otlp_protocol == "grpc" and importlib.util.find_spec("grpc") is None:
        raise fail(
            "--otlp-protocol grpc needs gRPC, which the 'proxy' extra leaves out: "
            "pip install opentelemetry-exporter-otlp-proto-grpc (or --otlp-protocol http/protobuf)"
        )
    if not 0 <= tenant_top <= MAX_TOP:
        raise fail(f"--tenant-top must be within 0..{MAX_TOP}, got {tenant_top}")
    if not tenant_period > 0:
        raise fail("--tenant-period must be positive")
    if tenant_header is not None and tenant_key_file is not None:
        raise fail("--tenant-key-file keys the hash of API keys; with --tenant-header the header names the tenant")
    try:
        if tenant_header is not None:
            check_header_name(tenant_header)
        key, key_source = (None, "") if tenant_header is not None else load_key(tenant_key_file, os.environ)
    except (TenantKeyError, ValueError) as exc:
        raise fail(str(exc)) from None
    setup_logging(log_level)
    settings = ProxySettings(
        upstream=upstream,
        host=host,
        port=port,
        engine=engine,
        model=model,
        timeout=timeout,
        max_body_bytes=max_body_bytes,
        header_timeout=header_timeout,
        body_timeout=body_timeout,
        keep_alive_timeout=keep_alive_timeout,
        max_connections=max_connections,
        otlp_endpoint=otlp_endpoint,
        otlp_protocol=otlp_protocol,
        service_name=service_name,
        metrics_host=mhost,
        metrics_port=mport,
        tenants=TenantSettings(key=key, header=tenant_header, top=tenant_top, period=tenant_period),
    )
    err.print(f"inferwatch proxy on http://{host}:{port} -> {settings.upstream_name} (engine {settings.engine_label})")
    secret = key_source if key is not None else "a random one: ids change at restart"
    tenants_by = f"header {tenant_header}" if tenant_header else f"hashed API key (secret: {secret})"
    err.print(f"tenants: {tenants_by}; the {tenant_top} busiest in the metrics")
    # The per-chunk path allocates little that lives; the start-up objects need no more collecting.
    gc.collect()
    gc.freeze()
    # Each open stream holds some 80 tracked objects (coroutines, futures, headers...) until it ends: at the
    # default threshold (700) the young collections keep finding them alive, and the middle one rescans them
    # all about once a second (3-6 ms at 256 streams; 2-3 % of the CPU at 50 chunks a stream, a fifth of it at
    # one). At 20,000: a fifth of that GC time, in one young collection (4-7 ms) every 8 s or so.
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])

    async def main() -> None:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run(settings, stop=stop)

    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        runner.run(main())
