"""The ``inferwatch`` command line."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console

from inferwatch import __version__
from inferwatch.core.config import (
    ConfigError,
    EngineChoice,
    ExporterConfig,
    InferwatchSettings,
    SimEngine,
    TargetConfig,
    load_exporter_config,
)

app = typer.Typer(
    help="inferwatch: observability and SLO monitoring for self-hosted LLM inference fleets.",
    no_args_is_help=True,
    add_completion=False,
)
exporter_app = typer.Typer(
    help="Sidecar exporter: re-expose an engine's metrics (vLLM, TGI, TensorRT-LLM, Triton) in the "
    "canonical llm_* vocabulary.",
    no_args_is_help=True,
)
app.add_typer(exporter_app, name="exporter")

err = Console(stderr=True, soft_wrap=True)
OtlpChoice = Literal["http/protobuf", "grpc"]


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def _parse_labels(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep:
            raise _fail(f"--label expects NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


def _settings() -> InferwatchSettings:
    try:
        settings = InferwatchSettings()
        settings.vocabulary()
    except (ConfigError, ValueError) as exc:
        raise _fail(f"invalid INFERWATCH_* settings: {exc}") from None
    return settings


@app.command()
def version() -> None:
    """Print the inferwatch version."""
    typer.echo(__version__)


@app.command("vocabulary")
def vocabulary_cmd(
    markdown: Annotated[bool, typer.Option(help="Print the reference page as Markdown.")] = False,
) -> None:
    """List the canonical metrics: names, types, units, labels and bucket layouts."""
    from rich.table import Table

    from inferwatch.core import vocabulary as V
    from inferwatch.core.reference import markdown as render_markdown

    vocab = _settings().vocabulary()
    if markdown:
        sys.stdout.write(render_markdown(vocab))
        return
    table = Table(title="canonical vocabulary")
    for col in ("name", "type", "unit", "labels", "buckets"):
        table.add_column(col)
    for spec in V.ALL_METRICS:
        buckets = " ".join(vocab.le_strings(spec)) if spec.kind is V.Kind.HISTOGRAM else ""
        table.add_row(spec.name, spec.kind.value, spec.unit, " ".join(spec.labels), buckets)
    Console(width=200).print(table)


@exporter_app.command("coverage")
def coverage_cmd(
    markdown: Annotated[bool, typer.Option(help="Print the coverage matrix as Markdown.")] = False,
) -> None:
    """Which canonical signals each engine provides, and why the others are missing."""
    from inferwatch.exporters.coverage import markdown as render_markdown
    from inferwatch.exporters.coverage import matrix
    from inferwatch.exporters.engines import builtin_registry

    registry = builtin_registry()
    if markdown:
        sys.stdout.write(render_markdown(registry))
        return
    from rich.table import Table

    m = matrix(registry)
    table = Table(title="canonical signal coverage")
    table.add_column("metric")
    for engine in m:
        table.add_column(engine)
    from inferwatch.core import vocabulary as V

    for spec in V.CANONICAL_METRICS:
        table.add_row(spec.key, *("yes" if m[e].get(spec.key) == "mapped" else "-" for e in m))
    Console(width=160).print(table)


@exporter_app.command("translate")
def translate(
    file: Annotated[
        str,
        typer.Argument(help="A captured engine payload (/metrics text or trtllm-serve JSON); - for stdin."),
    ],
    engine: Annotated[EngineChoice, typer.Option(help="Engine that produced the payload; auto detects it.")] = "auto",
    model: Annotated[str | None, typer.Option(help="Override the model label.")] = None,
    info: Annotated[
        Path | None,
        typer.Option(help="The engine's /info (TGI), /version (vLLM, trtllm-serve) or /v2 (Triton) JSON."),
    ] = None,
    max_batch_total_tokens: Annotated[
        int | None, typer.Option(help="TGI: KV-cache capacity in tokens, to derive the KV usage ratio.")
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option(help="Extra label NAME=VALUE on every series (repeatable).")
    ] = None,
    explain: Annotated[bool, typer.Option(help="Also list unmapped families and inexact buckets on stderr.")] = False,
) -> None:
    """Print the canonical exposition for one captured payload (a debugging tool).

    The output holds canonical llm_* families plus the exporter-health series, exactly as
    `inferwatch exporter serve` would serve them for that payload.
    """
    from inferwatch.exporters.engines import builtin_registry
    from inferwatch.exporters.mapping import TranslateContext
    from inferwatch.exporters.offline import UndetectableEngine, render_with_health, resolve_adapter, translate_payload
    from inferwatch.exporters.textparse import ParseError

    settings = _settings()
    registry = builtin_registry()
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as exc:
        raise _fail(f"cannot read {file}: {exc.strerror}") from None
    start = time.perf_counter()
    try:
        adapter = resolve_adapter(registry, text, engine)
    except UndetectableEngine as exc:
        raise _fail(f"{file}: {exc}") from None
    ctx = TranslateContext(
        engine=adapter.name,
        vocabulary=settings.vocabulary(),
        model_override=model,
        extra_labels=_parse_labels(label),
    )
    if info is not None and adapter.parse_info is not None:
        try:
            ctx.facts = adapter.parse_info(json.loads(info.read_text()))
        except (OSError, ValueError) as exc:
            raise _fail(f"cannot read engine info {info}: {exc}") from None
    if max_batch_total_tokens:
        ctx.options = {"max_batch_total_tokens": max_batch_total_tokens}
    try:
        snap = translate_payload(adapter, text, ctx)
    except (ParseError, ValueError) as exc:
        raise _fail(f"{file} is not a valid payload: {exc}") from None
    target = "stdin" if file == "-" else Path(file).name
    sys.stdout.write(render_with_health(snap, ctx, target, time.perf_counter() - start))
    if explain:
        err.print(f"engine: {adapter.name}")
        err.print(f"unmapped families: {', '.join(snap.unmapped) or 'none'}")
        err.print(f"inexact buckets: {', '.join(sorted(s.name for s in snap.inexact)) or 'none'}")
        for key, why in sorted(adapter.unsupported.items()):
            err.print(f"not provided by {adapter.name}: {key}: {why}")


def _serve_config(
    config: Path | None,
    target: list[str] | None,
    engine: EngineChoice,
    listen: str | None,
    model: str | None,
    max_batch_total_tokens: int | None,
    timeout: float,
) -> ExporterConfig:
    try:
        if config is not None:
            cfg = load_exporter_config(config)
            return cfg.model_copy(update={"listen": listen}) if listen else cfg
        if not target:
            raise _fail("give --target URL (repeatable) or --config FILE")
        targets = [
            TargetConfig(
                url=url,
                engine=engine,
                model=model,
                timeout_seconds=timeout,
                max_batch_total_tokens=max_batch_total_tokens,
            )
            for url in target
        ]
        return ExporterConfig(listen=listen or "127.0.0.1:9400", targets=targets)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    except ValueError as exc:  # pydantic validation of command-line values
        raise _fail(f"invalid option: {exc}") from None


@exporter_app.command("serve")
def serve(
    target: Annotated[
        list[str] | None,
        typer.Option(help="Engine URL: base (http://host:8000) or full metrics URL. Repeatable."),
    ] = None,
    engine: Annotated[EngineChoice, typer.Option(help="Engine of the --target(s); auto detects it.")] = "auto",
    listen: Annotated[str | None, typer.Option(help="HOST:PORT to serve /metrics on (default 127.0.0.1:9400).")] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="YAML file listing several targets (url, engine, name, model, labels, ...)."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Override the model label (TGI, Triton).")] = None,
    max_batch_total_tokens: Annotated[int | None, typer.Option(help="TGI: KV-cache capacity in tokens.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the engine on each scrape.")] = 5.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the sidecar: each scrape of our /metrics scrapes the engine(s) and translates.

    When an engine is down, slow or returns garbage, the up gauge is 0, no stale canonical
    series are served, the error is logged once per change and the exporter keeps running.
    """
    from inferwatch.exporters.engines import builtin_registry
    from inferwatch.exporters.server import Exporter

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = _settings()
    cfg = _serve_config(config, target, engine, listen, model, max_batch_total_tokens, timeout)
    exporter = Exporter(config=cfg, registry=builtin_registry(), vocabulary=settings.vocabulary())
    try:
        host, port = exporter.start()
    except OSError as exc:
        raise _fail(f"cannot listen on {cfg.listen}: {exc.strerror}") from None
    err.print(f"inferwatch exporter serving http://{host}:{port}/metrics for {', '.join(t.label for t in cfg.targets)}")
    stop = threading.Event()

    def _handle(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)
    stop.wait()
    exporter.stop()
    err.print("inferwatch exporter stopped")


collector_app = typer.Typer(
    help="The collector: per-request LLM traces over OTLP (HTTP and gRPC) into a SQL request store.",
    no_args_is_help=True,
)
app.add_typer(collector_app, name="collector")
db_app = typer.Typer(help="The collector's database (Alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")


def _collector_settings(**overrides: Any) -> Any:
    from inferwatch.collector.config import CollectorSettings

    try:
        return CollectorSettings(**{k: v for k, v in overrides.items() if v is not None})
    except (ConfigError, ValueError) as exc:
        raise _fail(f"invalid collector settings: {exc}") from None


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
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Receive OTLP traces (vLLM, TGI, trtllm-serve, any GenAI spans), store one row per LLM request.

    Migrations run at start when the database is empty. The read API is at /api/v1 (OpenAPI at /docs).
    """
    import asyncio
    import contextlib

    import uvicorn

    from inferwatch.collector.app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = _collector_settings(
        database_url=database_url,
        data_dir=data_dir,
        listen=listen,
        grpc_listen=grpc_listen,
        retention=retention,
        ingest_tokens=ingest_token,
        read_tokens=read_token,
        insecure=insecure or None,
    )
    try:
        settings.check_exposure()
        application = create_app(settings)
    except (ConfigError, ValueError) as exc:
        raise _fail(str(exc)) from None
    from inferwatch.core.config import parse_listen

    host, port = parse_listen(settings.listen)

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    server = _Server(uvicorn.Config(application, host=host, port=port, log_level=log_level.lower(), lifespan="on"))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        await server.serve()

    err.print(
        f"inferwatch collector: OTLP/HTTP + API on http://{host}:{port}, OTLP/gRPC on "
        f"{settings.grpc_listen or 'off'}, database {settings.url().split('@')[-1]}"
    )
    asyncio.run(main())


@db_app.command("upgrade")
def db_upgrade(
    database_url: Annotated[str | None, typer.Option(help="SQLAlchemy URL (default: SQLite under --data-dir).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Directory of the default SQLite file.")] = None,
    revision: Annotated[str, typer.Option(help="Target revision.")] = "head",
) -> None:
    """Apply the collector's migrations."""
    from inferwatch.collector import db

    settings = _collector_settings(database_url=database_url, data_dir=data_dir)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = db.make_engine(settings.url())
    db.upgrade(engine, revision)
    err.print(f"database at revision {db.current_revision(engine)}")


generate_app = typer.Typer(
    help="Generate monitoring artifacts from the vocabulary and SLO files.", no_args_is_help=True
)
app.add_typer(generate_app, name="generate")


@generate_app.command("alerts")
def generate_alerts(
    slo: Annotated[Path, typer.Option(help="SLO file (YAML).")] = Path("alerts/slos.yaml"),
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("alerts/generated"),
    check: Annotated[bool, typer.Option(help="Do not write: exit 1 when the files on disk differ.")] = False,
) -> None:
    """Prometheus recording rules, burn-rate and saturation alerts, Alertmanager routing and runbooks.

    Writes rules.yml, alertmanager.yml and runbooks.md (deterministic, "generated, do not edit").
    Latency thresholds must be canonical bucket boundaries (INFERWATCH_SLO_THRESHOLDS adds some).
    """
    from inferwatch.alerts.generate import generate
    from inferwatch.core.slo import SLOFileError, load

    vocab = _settings().vocabulary()
    try:
        spec = load(slo, vocab)
    except SLOFileError as exc:
        raise _fail(str(exc)) from None
    files = generate(spec, vocab, source=slo.name)
    stale = []
    for name, content in files.items():
        path = out / name
        if check:
            if not path.exists() or path.read_text() != content:
                stale.append(str(path))
            continue
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        err.print(f"wrote {path}")
    if stale:
        raise _fail("stale generated files (run `inferwatch generate alerts`): " + ", ".join(stale), code=1)


@generate_app.command("dashboards")
def generate_dashboards(
    slo: Annotated[Path | None, typer.Option(help="SLO file: adds the LLM SLOs dashboard.")] = Path("alerts/slos.yaml"),
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("dashboards/generated"),
    check: Annotated[bool, typer.Option(help="Do not write: exit 1 when the files on disk differ.")] = False,
    sketches: Annotated[Path | None, typer.Option(help="Also write a PNG layout sketch per dashboard here.")] = Path(
        "docs/dashboards"
    ),
) -> None:
    """Grafana dashboards (JSON, via grafanalib) and provisioning files, from the vocabulary and SLOs.

    Import the JSON into any Grafana, or mount the provisioning folder; datasources are template
    variables, so nothing refers to a particular Grafana's uids.
    """
    from inferwatch.core.slo import SLOFileError, load
    from inferwatch.dashboards.generate import generate

    vocab = _settings().vocabulary()
    spec = None
    if slo is not None:
        try:
            spec = load(slo, vocab)
        except SLOFileError as exc:
            raise _fail(str(exc)) from None
    from inferwatch.dashboards.sketch import sketches as draw

    files: dict[Path, bytes] = {out / name: content.encode() for name, content in generate(spec, vocab).items()}
    if sketches is not None:
        files.update({sketches / name: png for name, png in draw(spec, vocab).items()})
    stale = []
    for path, content in sorted(files.items()):
        if check:
            if not path.exists() or path.read_bytes() != content:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        err.print(f"wrote {path}")
    if stale:
        raise _fail("stale generated files (run `inferwatch generate dashboards`): " + ", ".join(stale), code=1)


@app.command()
def simulate(
    engine: Annotated[SimEngine, typer.Option(help="Which engine's wire formats to simulate.")],
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1.")] = 8000,
    model: Annotated[str, typer.Option(help="Served model name.")] = "sim-model",
    profile: Annotated[str, typer.Option(help="Load profile (see --list-profiles).")] = "steady",
    load: Annotated[
        float | None, typer.Option(help="Built-in load in requests/s (default: the profile's; 0: none).")
    ] = None,
    otlp_endpoint: Annotated[
        str | None, typer.Option(help="Send per-request spans here (e.g. http://127.0.0.1:4318/v1/traces).")
    ] = None,
    otlp_protocol: Annotated[OtlpChoice, typer.Option(help="OTLP transport.")] = "http/protobuf",
    seed: Annotated[int, typer.Option(help="Random seed (lengths, arrivals, failures).")] = 0,
    speed: Annotated[float, typer.Option(help="Simulated seconds per wall second (time compression).")] = 1.0,
    blocks: Annotated[int | None, typer.Option(help="KV-cache blocks (default: about 16k tokens).")] = None,
    block_size: Annotated[int | None, typer.Option(help="Tokens per KV block.")] = None,
    max_num_seqs: Annotated[int, typer.Option(help="Sequences in the running batch at most.")] = 64,
    max_model_len: Annotated[int, typer.Option(help="Context length (prompt + output).")] = 4096,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    list_profiles: Annotated[bool, typer.Option(help="List the load profiles and exit.")] = False,
) -> None:
    """Serve a simulated LLM engine: its API, /metrics in its exact dialect, and its spans.

    For demos and tests without a GPU; point inferwatch at real engines in production. Switch the
    profile at runtime with: curl -XPOST localhost:PORT/simulator/profile -d '{"profile":"kv-pressure"}'
    """
    from inferwatch.simulator.base import SimSettings
    from inferwatch.simulator.profiles import PROFILES
    from inferwatch.simulator.server import default_params, serve

    if list_profiles:
        for p in PROFILES.values():
            typer.echo(f"{p.name:14} {p.rps:5g} rps  {p.description}")
        return
    if profile not in PROFILES:
        raise _fail(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    params = default_params(engine)
    if block_size:
        params.num_blocks = params.num_blocks * params.block_size // block_size
        params.block_size = block_size
    if blocks:
        params.num_blocks = blocks
    params.max_num_seqs = max_num_seqs
    params.max_model_len = max_model_len
    settings = SimSettings(
        engine=engine,
        model=model,
        host=host,
        port=port,
        profile=profile,
        load=load,
        otlp_endpoint=otlp_endpoint,
        otlp_protocol=otlp_protocol,
        seed=seed,
        speed=speed,
        params=params,
    )
    err.print(f"simulated {engine} serving http://{host}:{port} (model {model}, profile {profile}, speed {speed:g}x)")
    serve(settings)


@app.command()
def demo(
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (default: until Ctrl-C).")
    ] = None,
    vllm_profile: Annotated[str, typer.Option("--profile", help="Load profile of the simulated vLLM.")] = "steady",
    speed: Annotated[float, typer.Option(help="Simulated seconds per wall second.")] = 1.0,
    base_port: Annotated[int, typer.Option(help="First port to use (0: any free ports).")] = 0,
) -> None:
    """A simulated vLLM, TGI, trtllm-serve and Triton under load, an exporter beside each, and a live view.

    Nothing to install and no Docker: every process runs here, on 127.0.0.1. The view reads the
    exporters' canonical output (not the simulators' internals), as Prometheus would. Ctrl-C (or
    --duration) stops every process it started.
    """
    from inferwatch.demo import run_demo

    raise typer.Exit(run_demo(duration=duration, vllm_profile=vllm_profile, speed=speed, base_port=base_port))


def main() -> None:
    app()
