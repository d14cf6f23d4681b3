"""``inferwatch exporter``: translate captured payloads, serve the sidecar, show the coverage matrix."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from inferwatch.cli.common import err, fail, load_settings, needs_extra, parse_labels, setup_logging
from inferwatch.core.config import ConfigError

if TYPE_CHECKING:
    from pydantic import JsonValue

    from inferwatch.exporters.engines import EngineRegistry
    from inferwatch.exporters.targets import ExporterConfig, Problem

exporter_app = typer.Typer(
    help="Sidecar exporter: re-expose an inference engine's metrics in the canonical llm_* vocabulary.",
    no_args_is_help=True,
)

ENGINE_HELP = "auto detects it; `inferwatch exporter engines` lists the engines and their options."
ENGINE_OPTION_HELP = "An engine option NAME=VALUE (repeatable; `inferwatch exporter engines` lists them)."


def parse_engine_options(pairs: list[str] | None) -> dict[str, JsonValue]:
    """``--engine-option NAME=VALUE`` flags -> options by name (the engine's model converts the values)."""
    out: dict[str, JsonValue] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise fail(f"--engine-option expects NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


def _flag_problems(problems: list[Problem]) -> str:
    """Problems of an engine and options given as flags, named by flag."""
    flags = (("options.", "--engine-option "), ("engine", "--engine"))
    lines = []
    for loc, msg in problems:
        for prefix, flag in flags:
            if loc.startswith(prefix):
                loc = flag + loc.removeprefix(prefix)
                break
        lines.append(f"{loc}: {msg}")
    return "; ".join(lines)


@exporter_app.command("engines")
def engines_cmd() -> None:
    """The engines the exporter knows: where it reads each, and the options each takes.

    Give options as --engine-option NAME=VALUE, or in a target's options: mapping of the
    --config file.
    """
    with needs_extra("exporter", "exporter engines"):
        from inferwatch.exporters.engines import builtin_registry

    for adapter in builtin_registry():
        info = f", facts from {adapter.info_path}" if adapter.info_path else ""
        sys.stdout.write(f"{adapter.name}: metrics at {adapter.default_path}{info}\n")
        for name, spec in adapter.options.model_fields.items():
            sys.stdout.write(f"  option {name} (default {spec.default}): {spec.description}\n")


@exporter_app.command("coverage")
def coverage_cmd(
    markdown: Annotated[bool, typer.Option(help="Print the coverage matrix as Markdown.")] = False,
) -> None:
    """Which canonical signals each engine provides, and why the others are missing."""
    with needs_extra("exporter", "exporter coverage"):
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
        typer.Argument(help="A captured engine payload (Prometheus text, or an engine's JSON stats); - for stdin."),
    ],
    engine: Annotated[str, typer.Option(help="Engine that produced the payload; " + ENGINE_HELP)] = "auto",
    model: Annotated[str | None, typer.Option(help="Override the model label.")] = None,
    info: Annotated[
        Path | None,
        typer.Option(help="The JSON of the engine's info endpoint (`inferwatch exporter engines` shows where)."),
    ] = None,
    engine_option: Annotated[list[str] | None, typer.Option(help=ENGINE_OPTION_HELP)] = None,
    label: Annotated[
        list[str] | None, typer.Option(help="Extra label NAME=VALUE on every series (repeatable).")
    ] = None,
    explain: Annotated[bool, typer.Option(help="Also list unmapped families and inexact buckets on stderr.")] = False,
) -> None:
    """Print the canonical exposition for one captured payload (a debugging tool).

    The output holds canonical llm_* families plus the exporter-health series, exactly as
    `inferwatch exporter serve` would serve them for that payload.
    """
    with needs_extra("exporter", "exporter translate"):
        from inferwatch.exporters.engines import builtin_registry
        from inferwatch.exporters.mapping import TranslateContext
        from inferwatch.exporters.offline import UndetectableEngine, render_with_health, resolve_adapter
        from inferwatch.exporters.samples import check_finite_snapshot
        from inferwatch.exporters.targets import engine_problems, session_options
        from inferwatch.exporters.textparse import ParseError

    settings = load_settings()
    registry = builtin_registry()
    options = parse_engine_options(engine_option)
    problems = engine_problems(engine, options, registry)
    if problems:
        raise fail(_flag_problems(problems))
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as exc:
        raise fail(f"cannot read {file}: {exc.strerror}") from None
    start = time.perf_counter()
    try:
        adapter = resolve_adapter(registry, text, engine)
    except UndetectableEngine as exc:
        raise fail(f"{file}: {exc}") from None
    session = adapter.open(session_options(engine, adapter, options))
    ctx = TranslateContext(
        engine=adapter.name,
        vocabulary=settings.vocabulary(),
        model_override=model,
        extra_labels=parse_labels(label),
    )
    if info is not None and adapter.parse_info is not None:
        try:
            ctx.facts = adapter.parse_info(json.loads(info.read_text()))
        except (OSError, ValueError) as exc:
            raise fail(f"cannot read engine info {info}: {exc}") from None
    try:
        snap = session.translate(text, ctx)
        check_finite_snapshot(snap)
    except (ParseError, ValueError) as exc:
        raise fail(f"{file} is not a valid payload: {exc}") from None
    target = "stdin" if file == "-" else Path(file).name
    sys.stdout.write(render_with_health(snap, ctx, target, time.perf_counter() - start))
    if explain:
        err.print(f"engine: {adapter.name}")
        err.print(f"unmapped families: {', '.join(snap.unmapped) or 'none'}")
        err.print(f"inexact buckets: {', '.join(sorted(s.name for s in snap.inexact)) or 'none'}")
        for key, why in sorted(adapter.unsupported.items()):
            err.print(f"not provided by {adapter.name}: {key}: {why}")


def _serve_config(
    registry: EngineRegistry,
    config: Path | None,
    target: list[str] | None,
    engine: str,
    listen: str | None,
    model: str | None,
    options: dict[str, JsonValue],
    limits: Mapping[str, object],
) -> ExporterConfig:
    from inferwatch.exporters.targets import ExporterConfig, TargetConfig, engine_problems, load_exporter_config

    given = {name: value for name, value in limits.items() if value is not None}

    try:
        if config is not None:
            cfg = load_exporter_config(config, registry)
            if given:  # flags override every target's own value
                targets = [TargetConfig.model_validate({**t.model_dump(), **given}) for t in cfg.targets]
                cfg = cfg.model_copy(update={"targets": targets})
            return cfg.model_copy(update={"listen": listen}) if listen else cfg
        if not target:
            raise fail("give --target URL (repeatable) or --config FILE")
        problems = engine_problems(engine, options, registry)
        if problems:
            raise fail(_flag_problems(problems))
        targets = [
            TargetConfig.model_validate({"url": url, "engine": engine, "model": model, "options": options, **given})
            for url in target
        ]
        return ExporterConfig(listen=listen or "127.0.0.1:9400", targets=targets)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:  # pydantic validation of command-line values
        raise fail(f"invalid option: {exc}") from None


def _with_gpus(
    cfg: ExporterConfig, config: Path | None, source: str | None, uuids: list[str], pool: str | None, from_env: bool
) -> ExporterConfig:
    """``cfg`` with the GPU flags as its one target's ``gpus`` section."""
    from inferwatch.exporters.targets import GpuSourceConfig

    if config is not None or len(cfg.targets) != 1:
        raise fail("--gpu-source goes with one --target; with --config or several targets, give each a gpus: section")
    if source is None or not (uuids or from_env):
        raise fail("give --gpu-source URL and the target's GPUs (--gpu-uuid, repeatable, or --gpu-pod-from-env)")
    try:
        gpus = GpuSourceConfig(url=source, uuids=uuids, pool=pool, pod_from_env=from_env)
    except ValueError as exc:
        raise fail(f"invalid GPU option: {exc}") from None
    return cfg.model_copy(update={"targets": [cfg.targets[0].model_copy(update={"gpus": gpus})]})


@exporter_app.command("serve")
def serve(
    target: Annotated[
        list[str] | None,
        typer.Option(help="Engine URL: base (http://host:8000) or full metrics URL. Repeatable."),
    ] = None,
    engine: Annotated[str, typer.Option(help="Engine of the --target(s); " + ENGINE_HELP)] = "auto",
    listen: Annotated[str | None, typer.Option(help="HOST:PORT to serve /metrics on (default 127.0.0.1:9400).")] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="YAML file listing several targets (url, engine, name, model, labels, options, ...)."),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Override the model label (for engines whose metrics carry none).")
    ] = None,
    engine_option: Annotated[list[str] | None, typer.Option(help=ENGINE_OPTION_HELP)] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="Deadline in seconds of one whole scrape of an engine: connect, headers and body of every "
            "request it makes (default 5; overrides the --config file's timeout_seconds)."
        ),
    ] = None,
    max_body_bytes: Annotated[
        int | None,
        typer.Option(help="Largest engine response body, counted after decompression (default 32 MiB)."),
    ] = None,
    max_samples: Annotated[
        int | None, typer.Option(help="Most sample lines accepted in one engine page (default 200000).")
    ] = None,
    follow_redirects: Annotated[
        str | None,
        typer.Option(
            help="Which redirects of an engine to follow: same-origin (to the target's own scheme, host and port; "
            "the default), none, or any (at most 5 in a row). A refused redirect fails the scrape with "
            "reason redirect (overrides the --config file's follow_redirects)."
        ),
    ] = None,
    gpu_source: Annotated[
        str | None,
        typer.Option(
            help="The --target's GPU source: dcgm-exporter's metrics URL (http://HOST:9400/metrics); its GPUs "
            "named by --gpu-uuid are served as llm_gpu_* with the engine's labels (docs/gpu.md). With --config, "
            "give each target a gpus: section instead."
        ),
    ] = None,
    gpu_uuid: Annotated[
        list[str] | None, typer.Option(help="A GPU of the --target, by UUID (GPU-...; repeatable).")
    ] = None,
    gpu_pod_from_env: Annotated[
        bool,
        typer.Option(
            help="Kubernetes: the --target's GPUs are those dcgm-exporter labels with this pod ($POD_NAME and "
            "$POD_NAMESPACE from the downward API), instead of --gpu-uuid."
        ),
    ] = False,
    gpu_pool: Annotated[
        str | None, typer.Option(help="The GPU pool of the --target, as the pool label (prices may be per pool).")
    ] = None,
    grace: Annotated[
        float, typer.Option(help="On SIGTERM or SIGINT, seconds to let the scrapes being served finish.")
    ] = 5.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the sidecar: each scrape of our /metrics scrapes the engine(s) and translates.

    When an engine is down, slow or returns garbage, the up gauge is 0 and the last-scrape-error
    gauge says why; no stale canonical series are served, the error is
    logged once per change and the exporter keeps running. A scrape of an engine ends by its
    --timeout deadline (a tenth of a second later at most), and concurrent scrapes of one engine
    share its request. On SIGTERM it stops
    listening, waits at most --grace seconds for the scrapes being served, and exits.

    Probes: /healthz answers 200 while the process serves (liveness); /readyz scrapes every target
    and answers 200 when all answered, 503 otherwise, one line per target with its state (readiness).
    """
    with needs_extra("exporter", "exporter serve"):
        from inferwatch.exporters.engines import builtin_registry
        from inferwatch.exporters.server import Exporter

    setup_logging(log_level)
    settings = load_settings()
    registry = builtin_registry()
    options = parse_engine_options(engine_option)
    limits: dict[str, object] = {
        "timeout_seconds": timeout,
        "max_body_bytes": max_body_bytes,
        "max_samples": max_samples,
        "follow_redirects": follow_redirects,
    }
    cfg = _serve_config(registry, config, target, engine, listen, model, options, limits)
    if gpu_source is not None or gpu_uuid or gpu_pool is not None or gpu_pod_from_env:
        cfg = _with_gpus(cfg, config, gpu_source, gpu_uuid or [], gpu_pool, gpu_pod_from_env)
    try:
        exporter = Exporter(config=cfg, registry=registry, vocabulary=settings.vocabulary())
    except ConfigError as exc:
        raise fail(str(exc)) from None
    try:
        host, port = exporter.start()
    except OSError as exc:
        raise fail(f"cannot listen on {cfg.listen}: {exc.strerror}") from None
    err.print(f"inferwatch exporter serving http://{host}:{port}/metrics for {', '.join(t.label for t in cfg.targets)}")
    stop = threading.Event()

    def _handle(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)
    stop.wait()
    err.print(f"inferwatch exporter stopping (at most {grace:g}s for the scrapes being served)")
    drained = exporter.stop(grace)
    err.print("inferwatch exporter stopped" + ("" if drained else "; scrapes still in flight were aborted"))
