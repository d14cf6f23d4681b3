"""``inferwatch exporter``: translate captured payloads, serve the sidecar, show the coverage matrix."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from inferwatch.cli.common import err, fail, load_settings, parse_labels
from inferwatch.core.config import ConfigError, EngineChoice, ExporterConfig, TargetConfig, load_exporter_config

exporter_app = typer.Typer(
    help="Sidecar exporter: re-expose an engine's metrics (vLLM, TGI, TensorRT-LLM, Triton) in the "
    "canonical llm_* vocabulary.",
    no_args_is_help=True,
)


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

    settings = load_settings()
    registry = builtin_registry()
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as exc:
        raise fail(f"cannot read {file}: {exc.strerror}") from None
    start = time.perf_counter()
    try:
        adapter = resolve_adapter(registry, text, engine)
    except UndetectableEngine as exc:
        raise fail(f"{file}: {exc}") from None
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
    if max_batch_total_tokens:
        ctx.options = {"max_batch_total_tokens": max_batch_total_tokens}
    try:
        snap = translate_payload(adapter, text, ctx)
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
            raise fail("give --target URL (repeatable) or --config FILE")
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
        raise fail(str(exc)) from None
    except ValueError as exc:  # pydantic validation of command-line values
        raise fail(f"invalid option: {exc}") from None


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
    settings = load_settings()
    cfg = _serve_config(config, target, engine, listen, model, max_batch_total_tokens, timeout)
    exporter = Exporter(config=cfg, registry=builtin_registry(), vocabulary=settings.vocabulary())
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
    exporter.stop()
    err.print("inferwatch exporter stopped")
