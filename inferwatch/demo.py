"""``inferwatch demo``: the whole pipeline on this machine, and a live view that fits 80 columns.

Everything runs on 127.0.0.1 as child processes of the demo, each in a session of its own: a
simulated vLLM, TGI, trtllm-serve and Triton under load, an exporter beside each, inferwatch proxy in
front of the simulated TGI (clients through it; TGI measures no TTFT of its own), the collector
(request spans, diagnosis, alert webhook), and - when Debian's binaries are installed -
Prometheus (the generated ``prometheus.yml`` and rules of ``inferwatch generate stack``, with
short alert durations so that the chain shows within a couple of minutes) and Alertmanager (the
generated configuration, delivering to the collector). Without them the demo says so in one line
and runs the rest. Ctrl-C or ``--duration`` stops every process it started.

The view reads the exporters (request rate, TTFT/TPOT P99, running/waiting, KV usage, preemptions),
the collector (exact P99 TTFT from the request rows, the top diagnosis per engine, the incidents
that came through Alertmanager) and, through the collector, Prometheus' SLO recording rules.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

import httpx
import yaml
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from inferwatch.core import resources
from inferwatch.core import vocabulary as V
from inferwatch.core.quantile import Scrape
from inferwatch.core.slo import SLOFile, load
from inferwatch.stack import Exporter, Layout, generate

ENGINES = V.ENGINES
WINDOW_SECONDS = 10.0
TGI_KV_TOKENS = 16384  # the simulated TGI's KV capacity, which TGI itself never exposes
PROMETHEUS_BINARIES: Final = ("prometheus",)
ALERTMANAGER_BINARIES: Final = ("prometheus-alertmanager", "alertmanager")
SCRAPE_INTERVAL: Final = "2s"
DEMO_ALERTS: Final[dict[str, str]] = {
    # the demo's alert durations: the chain fires within a couple of minutes (production: docs/alerts.md)
    "kv_cache_saturated_for": "10s",
    "kv_cache_prediction_for": "10s",
    "preemptions_for": "20s",
    "queue_growth_for": "10s",
    "target_down_for": "10s",
    "metrics_absent_for": "30s",
    "group_wait": "2s",
    "period_rules_interval": "15s",
    "group_interval": "10s",
    "repeat_interval": "5m",
    "page_repeat_interval": "5m",
    "ticket_repeat_interval": "5m",
}
PROXIED: Final = V.ENGINE_TGI
"""The engine the demo puts inferwatch proxy in front of: the one that measures no TTFT itself."""
CLIENT_RPS: Final = 2.0
"""Streaming requests per second the demo's clients send through the proxy."""
CLIENT_ABORT_SHARE: Final = 0.05
"""Share of those clients that hang up after a few chunks (the proxy counts them as aborts)."""
CLIENT_SLO: Final[dict[str, Any]] = {
    "name": "ttft-client-500ms",
    "description": "99% of requests show their first token to the client within 500 ms (at inferwatch proxy)",
    "objective": 99.0,
    "indicator": {"latency": {"metric": V.TIME_TO_FIRST_TOKEN.key, "threshold_seconds": 0.5, "measured_at": "proxy"}},
    "group_by": [V.LABEL_MODEL],
}
SHORT_SYMPTOM: Final[dict[str, str]] = {
    "latency_p99_high": "queue backlog",
    "throughput_low": "KV full",
    "preemptions": "preemptions",
    "ttft_slow": "slow TTFT",
    "tpot_slow": "slow TPOT",
    "error_rate_high": "errors",
    "streams_aborted": "aborts",
}


def model_of(engine: str) -> str:
    return f"{engine}-demo"


@dataclass
class Member:
    """One simulated engine and the exporter beside it."""

    engine: str
    sim_port: int
    exporter_port: int
    history: deque[Scrape] = field(default_factory=lambda: deque(maxlen=64))
    proxy_port: int | None = None
    proxy_metrics_port: int | None = None
    proxy_history: deque[Scrape] = field(default_factory=lambda: deque(maxlen=64))

    @property
    def proxy_url(self) -> str | None:
        return None if self.proxy_port is None else f"http://127.0.0.1:{self.proxy_port}"

    @property
    def proxy_metrics_url(self) -> str | None:
        return None if self.proxy_metrics_port is None else f"http://127.0.0.1:{self.proxy_metrics_port}/metrics"

    @property
    def sim_url(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.exporter_port}/metrics"

    def window(self, history: deque[Scrape] | None = None) -> tuple[Scrape | None, Scrape | None]:
        history = self.history if history is None else history
        if not history:
            return None, None
        last = history[-1]
        earlier = next((s for s in history if last.at - s.at <= WINDOW_SECONDS and s is not last), None)
        return earlier, last


@dataclass
class Insight:
    """What the collector knows, refreshed in the background (its calls may take seconds)."""

    exact_p99: dict[str, float] = field(default_factory=dict)
    diagnosis: dict[str, tuple[str, str]] = field(default_factory=dict)
    """engine -> (severity, symptom) of its most severe finding."""
    burn: dict[str, float] = field(default_factory=dict)
    """model -> the highest 5m burn rate among its SLOs."""
    incidents: list[dict[str, Any]] = field(default_factory=list)
    incident_count: int = 0
    alert_names: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def free_ports(n: int, base: int) -> list[int]:
    if base:
        return list(range(base, base + n))
    ports, socks = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s" if value < 100 else f"{value:.0f}s"
    if unit == "%":
        return f"{value:.0%}"
    return f"{value:.{digits}g}"


def _count(value: float | None, suffix: str = "") -> str:
    """A count in at most four characters: 7, 12, 3.5, 250, 2.6k, 41k."""
    if value is None:
        return "-"
    if value >= 10_000:
        return f"{value / 1000:.0f}k{suffix}"
    if value >= 1000:
        return f"{value / 1000:.1f}k{suffix}"
    if value >= 10 or value == int(value):
        return f"{value:.0f}{suffix}"
    return f"{value:.1f}{suffix}"


def _latency(last: Scrape, earlier: Scrape | None, spec: V.MetricSpec, q: float) -> str:
    """A latency percentile; at the top of the canonical layout it is only known to be at least that."""
    value = last.quantile(earlier, spec, q)
    top = max(spec.buckets)
    return f">{_fmt(value, 's')}" if value is not None and value >= top else _fmt(value, "s")


def view(members: list[Member], title: str, insight: Insight | None = None, width: int = 80) -> Group:
    """The live view: one row per engine, then firing incidents. Fits ``width`` columns (80 by default)."""
    insight = insight or Insight()
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True
    )
    columns = (
        ("engine", "left"),
        ("req/s", "right"),
        ("TTFT99", "right"),
        ("exact", "right"),
        ("TPOT99", "right"),
        ("run/wait", "right"),
        ("KV", "right"),
        ("pre/s", "right"),
        ("burn", "right"),
        ("diagnosis", "left"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    with insight.lock:
        exact, diagnosis, burn = dict(insight.exact_p99), dict(insight.diagnosis), dict(insight.burn)
        incidents, count = list(insight.incidents), insight.incident_count
    at_proxy = False
    for m in members:
        earlier, last = m.window()
        if last is None:
            table.add_row(m.engine, *["-"] * 9)
            continue
        running, waiting = last.values.get(V.REQUESTS_RUNNING.name), last.values.get(V.REQUESTS_WAITING.name)
        found = diagnosis.get(m.engine)
        diag = Text("ok", style="green")
        if found is not None:
            severity, symptom = found
            diag = Text(SHORT_SYMPTOM.get(symptom, symptom), style="bold red" if severity == "critical" else "yellow")
        rate = burn.get(model_of(m.engine))
        burn_text = Text(_count(rate, "x"), style="bold red" if rate and rate >= 14.4 else "")
        ttft = _latency(last, earlier, V.TIME_TO_FIRST_TOKEN, 0.99)
        p_earlier, p_last = m.window(m.proxy_history)
        if ttft == "-" and p_last is not None:
            client = _latency(p_last, p_earlier, V.CLIENT_TIME_TO_FIRST_TOKEN, 0.99)
            if client != "-":
                ttft, at_proxy = f"{client}*", True
        table.add_row(
            Text(m.engine, style="" if last.up else "red strike"),
            _count(last.rate(earlier, V.REQUESTS.name)),
            ttft,
            _fmt(exact.get(m.engine), "s"),
            _latency(last, earlier, V.TIME_PER_OUTPUT_TOKEN, 0.99),
            f"{_count(running)}/{_count(waiting)}",
            _fmt(last.gauges_max.get(V.KV_CACHE_USAGE.name), "%"),
            _count(last.rate(earlier, V.PREEMPTIONS.name)),
            burn_text,
            diag,
        )
    lines: list[Text] = []
    if at_proxy:
        lines.append(Text("* at the client, through inferwatch proxy (the engine measures no TTFT)", style="dim"))
    firing = [i for i in incidents if i.get("status") == "firing"]
    summary = f"incidents: {count} ({len(firing)} firing) via Prometheus -> Alertmanager -> collector"
    lines.append(Text(summary, style="bold" if firing else "dim"))
    for incident in firing[:3]:
        text = f"  FIRING #{incident['id']} {incident['title']}"
        lines.append(Text(text[: width - 1] + ("…" if len(text) > width - 1 else ""), style="bold red"))
    return Group(table, *lines)


def _scrape(client: httpx.Client, m: Member) -> None:
    for url, history in ((m.metrics_url, m.history), (m.proxy_metrics_url, m.proxy_history)):
        if url is None:
            continue
        try:
            text = client.get(url, timeout=5).text
        except httpx.HTTPError:
            continue
        with contextlib.suppress(ValueError):
            history.append(Scrape.parse(text, time.monotonic()))


class Clients:
    """Streaming clients of the proxied engine: Poisson arrivals through inferwatch proxy, a few of
    them hanging up after some chunks (an abort, as users do), so the proxy has something to measure."""

    def __init__(self, url: str, rps: float, abort_share: float, seed: int = 7) -> None:
        import random

        self.url, self.rps, self.abort_share = url, rps, abort_share
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="demo-clients", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        import asyncio

        asyncio.run(self._main())

    async def _main(self) -> None:
        import asyncio

        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(timeout=60) as client:
            while not self.stop.is_set():
                await asyncio.sleep(self.rng.expovariate(self.rps))
                abort_after = self.rng.randint(1, 4) if self.rng.random() < self.abort_share else None
                body = {
                    "inputs": "Tell me about KV caches. " * self.rng.randint(2, 40),
                    "parameters": {"max_new_tokens": self.rng.randint(16, 96)},
                }
                task = asyncio.create_task(self._one(client, body, abort_after))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, client: httpx.AsyncClient, body: dict[str, Any], abort_after: int | None) -> None:
        with contextlib.suppress(httpx.HTTPError):
            async with client.stream("POST", f"{self.url}/generate_stream", json=body) as response:
                chunks = 0
                async for _ in response.aiter_lines():
                    chunks += 1
                    if abort_after is not None and chunks >= abort_after:
                        return  # the client goes away mid-stream


def refresh_insight(client: httpx.Client, collector: str, insight: Insight, with_prometheus: bool) -> None:
    """One round of questions to the collector (each may take a few seconds; errors leave the old answer)."""
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        body = client.get(
            f"{collector}/api/v1/stats", params={"window": f"{WINDOW_SECONDS:g}s", "group_by": "engine"}, timeout=5
        ).json()
        exact = {
            str(e["engine"]): float(e["time_to_first_token"]["p99"])
            for e in body.get("data", [])
            if (e.get("time_to_first_token") or {}).get("p99") is not None
        }
        with insight.lock:
            insight.exact_p99 = exact
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        body = client.get(f"{collector}/api/v1/diagnose", params={"window": "1m", "examples": 0}, timeout=15).json()
        found: dict[str, tuple[str, str]] = {}
        for finding in body.get("findings", []):  # most severe first
            found.setdefault(str(finding["engine"]), (str(finding["severity"]), str(finding["symptom"])))
        with insight.lock:
            insight.diagnosis = found
    if with_prometheus:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
            body = client.get(f"{collector}/api/v1/slos", timeout=10).json()
            burn: dict[str, float] = {}
            for slo in body.get("slos", []):
                for group in slo.get("groups", []):
                    model = group.get("labels", {}).get(V.LABEL_MODEL)
                    rate = (group.get("burn_rates") or {}).get("5m")
                    if model and rate is not None:
                        burn[model] = max(burn.get(model, 0.0), float(rate))
            with insight.lock:
                insight.burn = burn
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        page = client.get(f"{collector}/api/v1/incidents", params={"limit": 10}, timeout=5).json()
        names: set[str] = set()
        for incident in page.get("data", []):
            names.update(part.split(" (")[0] for part in str(incident["title"]).split(" + "))
        with insight.lock:
            insight.incidents, insight.incident_count = list(page.get("data", [])), int(page.get("count", 0))
            insight.alert_names |= names


def _binary(names: tuple[str, ...]) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def demo_spec() -> SLOFile:
    """The shipped SLOs with short alert durations, and a TTFT SLO measured at the proxy (the only
    TTFT the proxied engine has)."""
    spec = load(resources.default_slo_path(), V.Vocabulary())
    data = spec.model_dump()
    data["slos"].append(CLIENT_SLO)
    data["alerts"].update(DEMO_ALERTS)
    return SLOFile.model_validate(data)


@dataclass
class Children:
    logdir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.logdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )
        log.close()
        self.procs.append(proc)
        return proc

    def stop(self) -> int:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        end = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        return len(self.procs)


def run_demo(duration: float | None, vllm_profile: str, speed: float, base_port: int) -> int:
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(width=80, highlight=False)
    width = min(console.width, 100)
    ports = free_ports(2 * len(ENGINES) + 6, base_port)
    members = [Member(e, ports[2 * i], ports[2 * i + 1]) for i, e in enumerate(ENGINES)]
    collector_http, collector_grpc, prom_port, am_port, proxy_port, proxy_metrics_port = ports[-6:]
    proxied = next(m for m in members if m.engine == PROXIED)
    proxied.proxy_port, proxied.proxy_metrics_port = proxy_port, proxy_metrics_port
    collector = f"http://127.0.0.1:{collector_http}"
    logdir = Path(tempfile.mkdtemp(prefix="inferwatch-demo-"))
    children = Children(logdir)
    py = [sys.executable, "-m", "inferwatch"]
    prometheus_bin, alertmanager_bin = _binary(PROMETHEUS_BINARIES), _binary(ALERTMANAGER_BINARIES)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    old_int = signal.signal(signal.SIGINT, stop)
    old_term = signal.signal(signal.SIGTERM, stop)
    try:
        layout = Layout(
            # the proxy's /metrics is scraped like an exporter's (its series are llm_client_*)
            exporters=(
                *(Exporter(f"127.0.0.1:{m.exporter_port}") for m in members),
                Exporter(f"127.0.0.1:{proxy_metrics_port}"),
            ),
            prometheus=f"127.0.0.1:{prom_port}",
            alertmanager=f"127.0.0.1:{am_port}",
            collector=f"127.0.0.1:{collector_http}",
            scrape_interval=SCRAPE_INTERVAL,
            evaluation_interval=SCRAPE_INTERVAL,
        )
        config = logdir / "config"
        spec = demo_spec()
        for name, content in generate(spec, V.Vocabulary(), layout).items():
            (config / name).parent.mkdir(parents=True, exist_ok=True)
            (config / name).write_bytes(content)
        # the collector reads the same SLOs (its SLO status and burn rates)
        slo_file = config / "slos.yaml"
        slo_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
        col_cmd = [
            *py,
            "collector",
            "serve",
            f"--data-dir={logdir / 'collector'}",
            f"--listen=127.0.0.1:{collector_http}",
            f"--grpc-listen=127.0.0.1:{collector_grpc}",
            f"--notify-config={config / 'collector' / 'notify.yaml'}",
            f"--slo={slo_file}",
            "--log-level=warning",
            *(f"--exporter=http://127.0.0.1:{m.exporter_port}" for m in members),
        ]
        if prometheus_bin:
            col_cmd.append(f"--prometheus-url=http://127.0.0.1:{prom_port}")
        children.start("collector", col_cmd, {"INFERWATCH_COLLECTOR_EXPORTER_INTERVAL_SECONDS": "2"})
        for i, m in enumerate(members):
            profile = vllm_profile if m.engine == V.ENGINE_VLLM else "steady"
            sim = [
                *py,
                "simulate",
                f"--engine={m.engine}",
                f"--port={m.sim_port}",
                f"--model={model_of(m.engine)}",
                f"--profile={profile}",
                f"--seed={i}",
                f"--speed={speed}",
            ]
            # spans go to the collector the way each engine sends them: vLLM and TGI over gRPC, trtllm over HTTP
            if m.engine in (V.ENGINE_VLLM, V.ENGINE_TGI):
                sim += [f"--otlp-endpoint=http://127.0.0.1:{collector_grpc}", "--otlp-protocol=grpc"]
            elif m.engine == V.ENGINE_TRTLLM:
                sim += [f"--otlp-endpoint={collector}/v1/traces"]
            exp = [*py, "exporter", "serve", f"--target={m.sim_url}", f"--engine={m.engine}"]
            exp += [f"--listen=127.0.0.1:{m.exporter_port}", "--log-level=warning"]
            if m.engine == V.ENGINE_TGI:
                exp += ["--engine-option", f"max_batch_total_tokens={TGI_KV_TOKENS}"]
            children.start(f"{m.engine}-simulator", sim)
            children.start(f"{m.engine}-exporter", exp)
            if m.proxy_port is not None:
                proxy = [*py, "proxy", f"--upstream={m.sim_url}", f"--engine={m.engine}"]
                proxy += [f"--listen=127.0.0.1:{m.proxy_port}", f"--metrics-listen=127.0.0.1:{m.proxy_metrics_port}"]
                children.start(f"{m.engine}-proxy", [*proxy, "--log-level=warning"])
        if prometheus_bin:
            children.start(
                "prometheus",
                [
                    prometheus_bin,
                    f"--config.file={config / 'prometheus' / 'prometheus.yml'}",
                    f"--storage.tsdb.path={logdir / 'prometheus-data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--log.level=warn",
                ],
            )
        if alertmanager_bin:
            children.start(
                "alertmanager",
                [
                    alertmanager_bin,
                    f"--config.file={config / 'alertmanager' / 'alertmanager.yml'}",
                    f"--storage.path={logdir / 'alertmanager-data'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",
                    "--log.level=warn",
                ],
            )
        _print_endpoints(
            console, members, collector, prom_port if prometheus_bin else None, am_port if alertmanager_bin else None
        )
        if not prometheus_bin:
            console.print("Prometheus is not installed (Debian: prometheus): no SLO burn and no alerts in this run.")
        elif not alertmanager_bin:
            console.print(
                "Alertmanager is not installed (Debian: prometheus-alertmanager): alerts fire, none is routed."
            )
        console.print(
            f"logs and generated configuration: {logdir}   vLLM profile: {vllm_profile}   speed: {speed:g}x\n"
        )
        insight = Insight()
        deadline = None if duration is None else time.monotonic() + duration
        with httpx.Client() as client:
            ready_by = time.monotonic() + 60
            while not stopping and time.monotonic() < ready_by:
                for m in members:
                    _scrape(client, m)
                if all(m.history and m.history[-1].up for m in members):
                    break
                if any(p.poll() is not None for p in children.procs):
                    console.print(f"[red]a demo process exited early; see the logs in {logdir}[/]")
                    return 1
                time.sleep(0.5)
            done = threading.Event()

            def background() -> None:
                with httpx.Client() as own:
                    while not done.is_set():
                        refresh_insight(own, collector, insight, prometheus_bin is not None)
                        done.wait(3.0)

            worker = threading.Thread(target=background, name="demo-insight", daemon=True)
            worker.start()
            clients = Clients(str(proxied.proxy_url), CLIENT_RPS * speed, CLIENT_ABORT_SHARE)
            clients.start()
            title = f"inferwatch demo - last {WINDOW_SECONDS:g} s"
            live = console.is_terminal
            last_print = 0.0
            try:
                with (
                    Live(view(members, title, insight, width), console=console, refresh_per_second=2)
                    if live
                    else contextlib.nullcontext()
                ) as display:
                    while not stopping and (deadline is None or time.monotonic() < deadline):
                        for m in members:
                            _scrape(client, m)
                        if display is not None:
                            display.update(view(members, title, insight, width))
                        elif time.monotonic() - last_print >= 10:
                            console.print(view(members, title, insight, width))
                            last_print = time.monotonic()
                        time.sleep(1.0)
            finally:
                done.set()
                clients.close()
                worker.join(timeout=20)
            refresh_insight(client, collector, insight, prometheus_bin is not None)
            console.print(view(members, "final state", insight, width))
            with insight.lock:
                names = ", ".join(sorted(insight.alert_names)) or "none"
            console.print(f"alerts that reached the collector: {names}")
        return 0
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        console.print(f"stopped {children.stop()} processes")


def _print_endpoints(
    console: Console, members: list[Member], collector: str, prom_port: int | None, am_port: int | None
) -> None:
    table = Table(title="endpoints (curl them, open them in a browser)", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("what")
    table.add_column("URL")
    for m in members:
        table.add_row(f"{m.engine} (simulated)", m.sim_url)
        table.add_row(f"{m.engine} exporter", m.metrics_url)
        if m.proxy_url is not None:
            table.add_row(f"{m.engine} via inferwatch proxy", str(m.proxy_url))
            table.add_row(f"{m.engine} proxy metrics", str(m.proxy_metrics_url))
    table.add_row("collector API", f"{collector}/docs")
    table.add_row("diagnosis", f"{collector}/api/v1/diagnose")
    table.add_row("incidents", f"{collector}/api/v1/incidents")
    if prom_port:
        table.add_row("Prometheus", f"http://127.0.0.1:{prom_port}")
    if am_port:
        table.add_row("Alertmanager", f"http://127.0.0.1:{am_port}")
    console.print(table)
    console.print(
        "switch the vLLM profile live: curl -XPOST "
        f"{members[0].sim_url}/simulator/profile -H 'content-type: application/json'"
        ' -d \'{"profile": "kv-pressure"}\''
    )
