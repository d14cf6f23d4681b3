"""``inferwatch demo``: a simulated fleet, an exporter beside each engine, and a live terminal view.

Everything runs on this machine, on 127.0.0.1, as child processes of the demo: a simulated vLLM,
TGI, trtllm-serve and Triton, each with built-in load, and one ``inferwatch exporter serve`` per
engine. The view scrapes the exporters (never the simulators' internals) and computes what a
dashboard would: request rate, TTFT and TPOT percentiles, running and waiting requests, KV usage and
preemptions. Ctrl-C or ``--duration`` stops every process it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from inferwatch.core import vocabulary as V
from inferwatch.core.quantile import Scrape

ENGINES = (V.ENGINE_VLLM, V.ENGINE_TGI, V.ENGINE_TRTLLM, V.ENGINE_TRITON)
WINDOW_SECONDS = 10.0
TGI_KV_TOKENS = 16384  # the simulated TGI's KV capacity, which TGI itself never exposes


@dataclass
class Member:
    """One simulated engine and the exporter beside it."""

    engine: str
    sim_port: int
    exporter_port: int
    history: deque[Scrape] = field(default_factory=lambda: deque(maxlen=64))

    @property
    def sim_url(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.exporter_port}/metrics"

    def window(self) -> tuple[Scrape | None, Scrape | None]:
        if not self.history:
            return None, None
        last = self.history[-1]
        earlier = next((s for s in self.history if last.at - s.at <= WINDOW_SECONDS and s is not last), None)
        return earlier, last


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
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:.{digits}g}{unit}"


def _latency(last: Scrape, earlier: Scrape | None, spec: V.MetricSpec, q: float) -> str:
    """A latency percentile; at the top of the canonical layout it is only known to be at least that."""
    value = last.quantile(earlier, spec, q)
    top = max(spec.buckets)
    return f">= {_fmt(value, 's')}" if value is not None and value >= top else _fmt(value, "s")


def view(members: list[Member], title: str, exact: dict[str, float] | None = None) -> Table:
    """The live table; ``exact`` is the collector's exact P99 TTFT per engine (from its stored requests)."""
    exact = exact or {}
    table = Table(title=title, title_justify="left")
    for col in (
        "engine",
        "up",
        "req/s",
        "TTFT p50",
        "TTFT p99",
        "exact p99",
        "TPOT p50",
        "TPOT p99",
        "running",
        "waiting",
        "KV usage",
        "preempt/s",
    ):
        table.add_column(col, justify="left" if col == "engine" else "right")
    for m in members:
        earlier, last = m.window()
        if last is None:
            table.add_row(m.engine, "…", *["-"] * 10)
            continue
        table.add_row(
            m.engine,
            "[green]1[/]" if last.up else "[red]0[/]",
            _fmt(last.rate(earlier, V.REQUESTS.name)),
            _latency(last, earlier, V.TIME_TO_FIRST_TOKEN, 0.5),
            _latency(last, earlier, V.TIME_TO_FIRST_TOKEN, 0.99),
            _fmt(exact.get(m.engine), "s"),
            _latency(last, earlier, V.TIME_PER_OUTPUT_TOKEN, 0.5),
            _latency(last, earlier, V.TIME_PER_OUTPUT_TOKEN, 0.99),
            _fmt(last.values.get(V.REQUESTS_RUNNING.name)),
            _fmt(last.values.get(V.REQUESTS_WAITING.name)),
            _fmt(last.gauges_max.get(V.KV_CACHE_USAGE.name), digits=2),
            _fmt(last.rate(earlier, V.PREEMPTIONS.name)),
        )
    return table


def exact_p99(client: httpx.Client, collector: str) -> dict[str, float]:
    """P99 TTFT per engine over the view's window, computed by the collector from request rows."""
    params = {"window": f"{WINDOW_SECONDS:g}s", "group_by": "engine"}
    try:
        body = client.get(f"{collector}/api/v1/stats", params=params, timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return {}
    out = {}
    for entry in body.get("data", []):
        p99 = (entry.get("time_to_first_token") or {}).get("p99")
        if p99 is not None:
            out[str(entry["engine"])] = float(p99)
    return out


def _scrape(client: httpx.Client, m: Member) -> None:
    try:
        text = client.get(m.metrics_url, timeout=5).text
    except httpx.HTTPError:
        return
    m.history.append(Scrape.parse(text, time.monotonic()))


def run_demo(duration: float | None, vllm_profile: str, speed: float, base_port: int) -> int:
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    ports = free_ports(2 * len(ENGINES) + 2, base_port)
    members = [Member(e, ports[2 * i], ports[2 * i + 1]) for i, e in enumerate(ENGINES)]
    collector_http, collector_grpc = ports[-2], ports[-1]
    collector = f"http://127.0.0.1:{collector_http}"
    logdir = Path(tempfile.mkdtemp(prefix="inferwatch-demo-"))
    procs: list[subprocess.Popen[bytes]] = []
    py = [sys.executable, "-m", "inferwatch"]
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    old_int = signal.signal(signal.SIGINT, stop)
    old_term = signal.signal(signal.SIGTERM, stop)
    try:
        col_cmd = [
            *py,
            "collector",
            "serve",
            "--data-dir",
            str(logdir / "collector"),
            "--listen",
            f"127.0.0.1:{collector_http}",
            "--grpc-listen",
            f"127.0.0.1:{collector_grpc}",
            "--log-level",
            "warning",
        ]
        log = (logdir / "collector.log").open("wb")
        procs.append(subprocess.Popen(col_cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        for i, m in enumerate(members):
            profile = vllm_profile if m.engine == V.ENGINE_VLLM else "steady"
            sim = [
                *py,
                "simulate",
                "--engine",
                m.engine,
                "--port",
                str(m.sim_port),
                "--model",
                f"{m.engine}-demo",
                "--profile",
                profile,
                "--seed",
                str(i),
                "--speed",
                str(speed),
            ]
            # spans go to the collector the way each engine sends them: vLLM and TGI over gRPC, trtllm over HTTP
            if m.engine in (V.ENGINE_VLLM, V.ENGINE_TGI):
                sim += ["--otlp-endpoint", f"http://127.0.0.1:{collector_grpc}", "--otlp-protocol", "grpc"]
            elif m.engine == V.ENGINE_TRTLLM:
                sim += ["--otlp-endpoint", f"{collector}/v1/traces"]
            exp = [
                *py,
                "exporter",
                "serve",
                "--target",
                m.sim_url,
                "--engine",
                m.engine,
                "--listen",
                f"127.0.0.1:{m.exporter_port}",
                "--log-level",
                "warning",
            ]
            if m.engine == V.ENGINE_TGI:
                exp += ["--engine-option", f"max_batch_total_tokens={TGI_KV_TOKENS}"]
            for name, cmd in ((f"{m.engine}-simulator", sim), (f"{m.engine}-exporter", exp)):
                log = (logdir / f"{name}.log").open("wb")
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        table = Table(title="demo endpoints (curl them, or point Prometheus at the exporters)", title_justify="left")
        for col in ("engine", "simulated engine", "exporter /metrics"):
            table.add_column(col)
        for m in members:
            table.add_row(m.engine, m.sim_url, m.metrics_url)
        table.add_row("collector", f"{collector}/api/v1/requests", f"{collector}/metrics")
        console.print(table)
        console.print(f"logs: {logdir}   profile of the simulated vLLM: {vllm_profile}   speed: {speed:g}x")
        console.print(
            "switch a profile live: curl -XPOST "
            f"{members[0].sim_url}/simulator/profile -H 'content-type: application/json' "
            '-d \'{"profile": "kv-pressure"}\'\n'
        )
        deadline = None if duration is None else time.monotonic() + duration
        with httpx.Client() as client:
            ready_by = time.monotonic() + 60
            while not stopping and time.monotonic() < ready_by:
                for m in members:
                    _scrape(client, m)
                if all(m.history and m.history[-1].up for m in members):
                    break
                if any(p.poll() is not None for p in procs):
                    console.print(f"[red]a demo process exited early; see the logs in {logdir}[/]")
                    return 1
                time.sleep(0.5)
            live = console.is_terminal
            last_print = 0.0
            with (
                Live(view(members, "inferwatch demo"), console=console, refresh_per_second=2)
                if live
                else (contextlib.nullcontext()) as display
            ):
                while not stopping and (deadline is None or time.monotonic() < deadline):
                    for m in members:
                        _scrape(client, m)
                    title = (
                        f"inferwatch demo — last {WINDOW_SECONDS:g} s, read from the exporters "
                        "(exact p99: from the collector's request rows)"
                    )
                    exact = exact_p99(client, collector)
                    if display is not None:
                        display.update(view(members, title, exact))
                    elif time.monotonic() - last_print >= 5:
                        console.print(view(members, title, exact))
                        last_print = time.monotonic()
                    time.sleep(1.0)
            console.print(view(members, "final state (read from the exporters)", exact_p99(client, collector)))
        return 0
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        end = time.monotonic() + 10
        for p in procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        console.print(f"stopped {len(procs)} processes")
