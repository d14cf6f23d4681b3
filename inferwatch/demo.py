"""``inferwatch demo``: the exporter end to end on this machine, with no engine installed.

Each engine fixture (a real vLLM capture; TGI, trtllm-serve and Triton payloads written from the
engines' sources) is served by a local stand-in HTTP server on 127.0.0.1. One exporter process
scrapes all of them, as Prometheus would make it do, and the demo prints a summary of what the
exporter serves. Then the vLLM stand-in stops, and the next scrape shows the exporter reporting the
target down while it keeps serving the others.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from . import vocabulary as V
from .config import ExporterConfig, InferwatchSettings, TargetConfig

DEMO_FIXTURES: tuple[tuple[str, str, dict[str, int]], ...] = (
    ("vllm", "vllm/0.32.0-cpu", {}),
    ("tgi", "tgi/3.3.7", {"max_batch_total_tokens": 16384}),
    ("trtllm", "trtllm/gen-c", {}),
    ("triton", "triton/25.03-trtllm", {}),
)

COLUMNS = (
    ("requests", V.REQUESTS),
    ("running", V.REQUESTS_RUNNING),
    ("waiting", V.REQUESTS_WAITING),
    ("KV usage", V.KV_CACHE_USAGE),
    ("prompt tok", V.PROMPT_TOKENS),
    ("gen tok", V.GENERATION_TOKENS),
)


def _summarise(text: str) -> dict[str, dict[str, float]]:
    """target/engine -> column -> value, read back with prometheus_client's parser."""
    per_engine: dict[str, dict[str, float]] = {}
    up: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            engine = s.labels.get(V.LABEL_ENGINE, "?")
            if s.name == V.EXPORTER_UP.name:
                up[s.labels.get(V.LABEL_TARGET, engine)] = s.value
                continue
            for title, spec in COLUMNS:
                if s.name == spec.name:
                    row = per_engine.setdefault(engine, {})
                    row[title] = row.get(title, 0.0) + s.value
            if s.name == V.TIME_TO_FIRST_TOKEN.name + "_count":
                row = per_engine.setdefault(engine, {})
                row["TTFT obs"] = row.get("TTFT obs", 0.0) + s.value
    return {"__up__": up, **per_engine}


def _table(summary: dict[str, dict[str, float]], title: str) -> Table:
    table = Table(title=title)
    table.add_column("target")
    table.add_column("up")
    for name in ("engine", *(t for t, _ in COLUMNS), "TTFT obs"):
        table.add_column(name, justify="right")
    for target, up in sorted(summary["__up__"].items()):
        engine = target.split("-", 1)[0]
        row = summary.get(engine, {}) if up else {}
        cells = [f"{row[c]:g}" if c in row else "-" for c in (*(t for t, _ in COLUMNS), "TTFT obs")]
        table.add_row(target, "[green]1[/]" if up else "[red]0[/]", engine, *cells)
    return table


def run_demo(fixtures: Path, settings: InferwatchSettings) -> int:
    from exporters.engines import builtin_registry
    from exporters.replay import ReplayServer, fixture_routes
    from exporters.server import Exporter

    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    servers: dict[str, ReplayServer] = {}
    targets = []
    try:
        for engine, rel, extra in DEMO_FIXTURES:
            directory = fixtures / rel
            if not (directory / "fixture.yaml").exists():
                console.print(f"[yellow]skipping {engine}: no fixture at {directory}[/]")
                continue
            _, routes = fixture_routes(directory)
            server = ReplayServer(routes)
            url = server.start()
            servers[engine] = server
            targets.append(
                TargetConfig(
                    url=url,
                    name=f"{engine}-demo",
                    engine=engine,
                    max_batch_total_tokens=extra.get("max_batch_total_tokens"),
                )
            )
            console.print(f"stand-in {engine:7} engine serving {rel} at {url}")
        if not targets:
            console.print("[red]no fixtures found; run from the repository root[/]")
            return 1
        exporter = Exporter(
            config=ExporterConfig(listen="127.0.0.1:0", targets=targets),
            registry=builtin_registry(),
            vocabulary=settings.vocabulary(),
        )
        host, port = exporter.start()
        url = f"http://{host}:{port}/metrics"
        console.print(f"\nexporter serving {url}\n")
        try:
            text = httpx.get(url, timeout=30).text
            lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
            console.print(_table(_summarise(text), f"canonical series served: {len(lines)} samples"))
            console.print("\nfirst lines of the canonical exposition:")
            for ln in text.splitlines()[:5]:
                console.print(f"  {ln}", highlight=False, markup=False, soft_wrap=True)
            if "vllm" in servers:
                servers.pop("vllm").stop()
                console.print("\n[bold]vLLM stand-in stopped[/]; scraping the exporter again:\n")
                text = httpx.get(url, timeout=30).text
                console.print(_table(_summarise(text), "after the vLLM engine went away"))
                console.print(
                    f"\n{V.EXPORTER_UP.name} is 0 for the stopped target and its canonical series are gone; "
                    "the other targets are unaffected."
                )
        finally:
            exporter.stop()
    finally:
        for server in servers.values():
            server.stop()
    console.print(
        "\nnext: point the exporter at a real engine with `inferwatch exporter serve --target http://HOST:PORT`"
    )
    return 0
