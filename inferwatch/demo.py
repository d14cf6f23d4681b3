"""``inferwatch demo``: the whole pipeline on this machine, and a live view that fits 80 columns.

Everything runs on 127.0.0.1 as child processes of the demo, each in a session of its own: a
simulated vLLM, TGI, trtllm-serve, Triton, SGLang and llama.cpp server under load, an exporter beside
each, inferwatch proxy in front of the simulated TGI and llama.cpp (clients through it: TGI measures no
TTFT of its own, llama.cpp neither TTFT nor TPOT and sends no traces, so the proxy's spans are its
requests in the collector), the collector (request spans, diagnosis, alert webhook), and - when
Debian's binaries are installed - Prometheus (the generated ``prometheus.yml`` and rules of
``inferwatch generate stack``, with short alert durations so that the chain shows within a couple of
minutes) and Alertmanager (the generated configuration, delivering to the collector). Without them
the demo says so in one line and runs the rest. Ctrl-C or ``--duration`` stops every process it started.

The view (:mod:`inferwatch.demo_view`) reads the exporters (request rate, TTFT/TPOT P99,
running/waiting, KV usage, preemptions), the collector (exact P99 TTFT from the request rows, the top
diagnosis per engine, the incidents that came through Alertmanager) and, through the collector,
Prometheus' SLO recording rules.
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
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

import httpx
import yaml
from rich.console import Console
from rich.live import Live

from inferwatch.core import resources
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile, load
from inferwatch.demo_view import (
    WINDOW_SECONDS,
    Insight,
    Member,
    model_of,
    print_endpoints,
    refresh_insight,
    scrape,
    view,
)
from inferwatch.simulator.dcgm import PATH as SIM_GPU_PATH
from inferwatch.simulator.gpus import sim_gpu_uuid
from inferwatch.stack import Exporter, Layout, generate

ENGINES = V.ENGINES
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
PROXIED: Final = (V.ENGINE_TGI, V.ENGINE_LLAMACPP)
"""The engines the demo puts inferwatch proxy in front of: those that measure no TTFT themselves."""
SIM_ENV: Final[dict[str, dict[str, str]]] = {V.ENGINE_LLAMACPP: {"LLAMA_ARG_N_PARALLEL": "8"}}
"""Simulators started as their engine would be for this load: llama-server with --parallel 8 (its own
environment variable), as 4 slots (its default) queue the demo's clients."""
CLIENT_RPS: Final = 2.0
"""Streaming requests per second the demo's clients send through each proxy."""
CLIENT_ABORT_SHARE: Final = 0.05
"""Share of those clients that hang up after a few chunks (the proxy counts them as aborts)."""
CLIENT_SLO: Final[dict[str, Any]] = {
    "name": "ttft-client-500ms",
    "description": "99% of requests show their first token to the client within 500 ms (at inferwatch proxy)",
    "objective": 99.0,
    "indicator": {"latency": {"metric": V.TIME_TO_FIRST_TOKEN.key, "threshold_seconds": 0.5, "measured_at": "proxy"}},
    "group_by": [V.LABEL_MODEL],
}


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


class Clients:
    """Streaming clients of a proxied engine: Poisson arrivals through inferwatch proxy, a few of
    them hanging up after some chunks (an abort, as users do), so the proxy has something to measure.
    TGI's clients use its native ``/generate_stream``, the others OpenAI streaming completions."""

    def __init__(self, url: str, engine: str, rps: float, abort_share: float, seed: int = 7) -> None:
        import random

        self.url, self.engine, self.rps, self.abort_share = url, engine, rps, abort_share
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
                prompt, max_tokens = "Tell me about KV caches. " * self.rng.randint(2, 40), self.rng.randint(16, 96)
                if self.engine == V.ENGINE_TGI:
                    path = "/generate_stream"
                    body: dict[str, Any] = {"inputs": prompt, "parameters": {"max_new_tokens": max_tokens}}
                else:
                    path = "/v1/completions"
                    body = {"model": model_of(self.engine), "prompt": prompt, "max_tokens": max_tokens, "stream": True}
                task = asyncio.create_task(self._one(client, path, body, abort_after))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, client: httpx.AsyncClient, path: str, body: dict[str, Any], abort_after: int | None) -> None:
        with contextlib.suppress(httpx.HTTPError):
            async with client.stream("POST", f"{self.url}{path}", json=body) as response:
                chunks = 0
                async for _ in response.aiter_lines():
                    chunks += 1
                    if abort_after is not None and chunks >= abort_after:
                        return  # the client goes away mid-stream


def _binary(names: tuple[str, ...]) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def demo_spec() -> SLOFile:
    """The shipped SLOs with short alert durations, and a TTFT SLO measured at the proxy (the only
    TTFT the proxied engines have)."""
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
        """SIGTERM to each child's process group; SIGKILL after 10 s to what is left of it. Returns once every
        group is empty: a child's own children (the collector's worker processes) end after it."""
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
        for p in self.procs:
            while _group_alive(p.pid) and time.monotonic() < end:
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        return len(self.procs)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _inferwatch(*args: str) -> list[str]:
    """The command line of an inferwatch child process (this interpreter, this inferwatch)."""
    return [sys.executable, "-m", "inferwatch", *args]


@dataclass
class Fleet:
    """Where the demo's processes listen, where they keep their files, and the optional binaries it found."""

    members: list[Member]
    proxied: list[Member]
    collector_http: int
    collector_grpc: int
    prom_port: int
    am_port: int
    logdir: Path
    prometheus_bin: str | None
    alertmanager_bin: str | None

    @classmethod
    def plan(cls, base_port: int) -> Fleet:
        ports = free_ports(2 * len(ENGINES) + 4 + 2 * len(PROXIED), base_port)
        members = [Member(e, ports[2 * i], ports[2 * i + 1]) for i, e in enumerate(ENGINES)]
        collector_http, collector_grpc, prom_port, am_port = ports[2 * len(ENGINES) : 2 * len(ENGINES) + 4]
        proxied = [m for m in members if m.engine in PROXIED]
        for i, m in enumerate(proxied):
            m.proxy_port, m.proxy_metrics_port = ports[2 * len(ENGINES) + 4 + 2 * i : 2 * len(ENGINES) + 6 + 2 * i]
        logdir = Path(tempfile.mkdtemp(prefix="inferwatch-demo-"))
        prometheus_bin, alertmanager_bin = _binary(PROMETHEUS_BINARIES), _binary(ALERTMANAGER_BINARIES)
        return cls(
            members,
            proxied,
            collector_http,
            collector_grpc,
            prom_port,
            am_port,
            logdir,
            prometheus_bin,
            alertmanager_bin,
        )

    @property
    def collector(self) -> str:
        return f"http://127.0.0.1:{self.collector_http}"

    @property
    def config(self) -> Path:
        return self.logdir / "config"

    def write_config(self) -> Path:
        """Write what ``inferwatch generate stack`` generates for this fleet; the SLO file the collector reads."""
        layout = Layout(
            # the proxy's /metrics is scraped like an exporter's (its series are llm_client_*)
            exporters=(
                *(Exporter(f"127.0.0.1:{m.exporter_port}") for m in self.members),
                *(Exporter(f"127.0.0.1:{m.proxy_metrics_port}") for m in self.proxied),
            ),
            prometheus=f"127.0.0.1:{self.prom_port}",
            alertmanager=f"127.0.0.1:{self.am_port}",
            collector=f"127.0.0.1:{self.collector_http}",
            scrape_interval=SCRAPE_INTERVAL,
            evaluation_interval=SCRAPE_INTERVAL,
        )
        spec = demo_spec()
        for name, content in generate(spec, V.Vocabulary(), layout).items():
            (self.config / name).parent.mkdir(parents=True, exist_ok=True)
            (self.config / name).write_bytes(content)
        # the collector reads the same SLOs (its SLO status and burn rates)
        slo_file = self.config / "slos.yaml"
        slo_file.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
        return slo_file

    def collector_cmd(self, slo_file: Path) -> list[str]:
        cmd = _inferwatch(
            "collector",
            "serve",
            f"--data-dir={self.logdir / 'collector'}",
            f"--listen=127.0.0.1:{self.collector_http}",
            f"--grpc-listen=127.0.0.1:{self.collector_grpc}",
            f"--notify-config={self.config / 'collector' / 'notify.yaml'}",
            f"--slo={slo_file}",
            "--log-level=warning",
            *(f"--exporter=http://127.0.0.1:{m.exporter_port}" for m in self.members),
        )
        if self.prometheus_bin:
            cmd.append(f"--prometheus-url=http://127.0.0.1:{self.prom_port}")
        return cmd

    def simulator_cmd(self, m: Member, seed: int, vllm_profile: str, speed: float) -> list[str]:
        profile = vllm_profile if m.engine == V.ENGINE_VLLM else "steady"
        sim = _inferwatch(
            "simulate",
            f"--engine={m.engine}",
            f"--port={m.sim_port}",
            f"--model={model_of(m.engine)}",
            f"--profile={profile}",
            f"--seed={seed}",
            f"--speed={speed}",
        )
        # spans go to the collector the way each engine sends them: vLLM, TGI and SGLang over gRPC, trtllm
        # over HTTP; Triton and llama.cpp send none (the proxy's spans stand in for llama.cpp's requests)
        if m.engine in (V.ENGINE_VLLM, V.ENGINE_TGI, V.ENGINE_SGLANG):
            sim += [f"--otlp-endpoint=http://127.0.0.1:{self.collector_grpc}", "--otlp-protocol=grpc"]
        elif m.engine == V.ENGINE_TRTLLM:
            sim += [f"--otlp-endpoint={self.collector}/v1/traces"]
        return sim

    def prometheus_cmd(self, binary: str) -> list[str]:
        return [
            binary,
            f"--config.file={self.config / 'prometheus' / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.logdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.prom_port}",
            "--log.level=warn",
        ]

    def alertmanager_cmd(self, binary: str) -> list[str]:
        return [
            binary,
            f"--config.file={self.config / 'alertmanager' / 'alertmanager.yml'}",
            f"--storage.path={self.logdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{self.am_port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]


def _exporter_cmd(m: Member) -> list[str]:
    exp = _inferwatch("exporter", "serve", f"--target={m.sim_url}", f"--engine={m.engine}")
    exp += [f"--listen=127.0.0.1:{m.exporter_port}", "--log-level=warning"]
    # the simulator's GPU: a dcgm-exporter-shaped page beside its engine API (a real one is its own process)
    exp += [f"--gpu-source={m.sim_url}{SIM_GPU_PATH}", f"--gpu-uuid={sim_gpu_uuid(m.engine, m.sim_port, 0)}"]
    if m.engine == V.ENGINE_TGI:
        exp += ["--engine-option", f"max_batch_total_tokens={TGI_KV_TOKENS}"]
    return exp


def _proxy_cmd(m: Member, collector: str) -> list[str]:
    """The proxy in front of a member, its spans to the collector (llama.cpp's only requests there)."""
    proxy = _inferwatch("proxy", f"--upstream={m.sim_url}", f"--engine={m.engine}")
    proxy += [f"--listen=127.0.0.1:{m.proxy_port}", f"--metrics-listen=127.0.0.1:{m.proxy_metrics_port}"]
    proxy += [f"--otlp-endpoint={collector}/v1/traces"]
    return [*proxy, "--log-level=warning"]


def _start(children: Children, fleet: Fleet, vllm_profile: str, speed: float) -> None:
    """Write the configuration, then start the collector, every member's processes and Prometheus and
    Alertmanager when installed."""
    slo_file = fleet.write_config()
    children.start("collector", fleet.collector_cmd(slo_file), {"INFERWATCH_COLLECTOR_EXPORTER_INTERVAL_SECONDS": "2"})
    for i, m in enumerate(fleet.members):
        children.start(f"{m.engine}-simulator", fleet.simulator_cmd(m, i, vllm_profile, speed), SIM_ENV.get(m.engine))
        children.start(f"{m.engine}-exporter", _exporter_cmd(m))
        if m.proxy_port is not None:
            children.start(f"{m.engine}-proxy", _proxy_cmd(m, fleet.collector))
    if fleet.prometheus_bin:
        children.start("prometheus", fleet.prometheus_cmd(fleet.prometheus_bin))
    if fleet.alertmanager_bin:
        children.start("alertmanager", fleet.alertmanager_cmd(fleet.alertmanager_bin))


def _announce(console: Console, fleet: Fleet, vllm_profile: str, speed: float) -> None:
    prom_port = fleet.prom_port if fleet.prometheus_bin else None
    am_port = fleet.am_port if fleet.alertmanager_bin else None
    print_endpoints(console, fleet.members, fleet.collector, prom_port, am_port)
    if not fleet.prometheus_bin:
        console.print("Prometheus is not installed (Debian: prometheus): no SLO burn and no alerts in this run.")
    elif not fleet.alertmanager_bin:
        console.print("Alertmanager is not installed (Debian: prometheus-alertmanager): alerts fire, none is routed.")
    console.print(
        f"logs and generated configuration: {fleet.logdir}   vLLM profile: {vllm_profile}   speed: {speed:g}x\n"
    )


def _wait_ready(client: httpx.Client, members: list[Member], children: Children, stopping: threading.Event) -> bool:
    """Scrape until every exporter is up (a minute at most); False when a child process exited meanwhile."""
    ready_by = time.monotonic() + 60
    while not stopping.is_set() and time.monotonic() < ready_by:
        for m in members:
            scrape(client, m)
        if all(m.history and m.history[-1].up for m in members):
            break
        if any(p.poll() is not None for p in children.procs):
            return False
        time.sleep(0.5)
    return True


@dataclass
class Watch:
    """The live part of a demo run: scrape every second, show the view, until the deadline or a signal."""

    console: Console
    fleet: Fleet
    insight: Insight
    stopping: threading.Event
    deadline: float | None
    width: int

    def run(self, client: httpx.Client, speed: float) -> None:
        """The view until the end, with the collector asked in the background and clients through the proxy."""
        done = threading.Event()

        def background() -> None:
            with httpx.Client() as own:
                while not done.is_set():
                    refresh_insight(own, self.fleet.collector, self.insight, self.fleet.prometheus_bin is not None)
                    done.wait(3.0)

        worker = threading.Thread(target=background, name="demo-insight", daemon=True)
        worker.start()
        clients = [
            Clients(str(m.proxy_url), m.engine, CLIENT_RPS * speed, CLIENT_ABORT_SHARE, seed=7 + i)
            for i, m in enumerate(self.fleet.proxied)
        ]
        for c in clients:
            c.start()
        try:
            self._show(client)
        finally:
            done.set()
            for c in clients:
                c.close()
            worker.join(timeout=20)

    def _show(self, client: httpx.Client) -> None:
        """Live on a terminal; otherwise a printed view every 10 seconds."""
        members, insight, width = self.fleet.members, self.insight, self.width
        title = f"inferwatch demo - last {WINDOW_SECONDS:g} s"
        last_print = 0.0
        with (
            Live(view(members, title, insight, width), console=self.console, refresh_per_second=2)
            if self.console.is_terminal
            else contextlib.nullcontext()
        ) as display:
            while not self.stopping.is_set() and (self.deadline is None or time.monotonic() < self.deadline):
                for m in members:
                    scrape(client, m)
                if display is not None:
                    display.update(view(members, title, insight, width))
                elif time.monotonic() - last_print >= 10:
                    self.console.print(view(members, title, insight, width))
                    last_print = time.monotonic()
                time.sleep(1.0)

    def finish(self, client: httpx.Client) -> None:
        """The final state, and the alerts that came through Alertmanager."""
        refresh_insight(client, self.fleet.collector, self.insight, self.fleet.prometheus_bin is not None)
        self.console.print(view(self.fleet.members, "final state", self.insight, self.width))
        with self.insight.lock:
            names = ", ".join(sorted(self.insight.alert_names)) or "none"
        self.console.print(f"alerts that reached the collector: {names}")


def run_demo(duration: float | None, vllm_profile: str, speed: float, base_port: int) -> int:
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(width=80, highlight=False)
    fleet = Fleet.plan(base_port)
    children = Children(fleet.logdir)
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    old_int = signal.signal(signal.SIGINT, stop)
    old_term = signal.signal(signal.SIGTERM, stop)
    try:
        _start(children, fleet, vllm_profile, speed)
        _announce(console, fleet, vllm_profile, speed)
        deadline = None if duration is None else time.monotonic() + duration
        watch = Watch(console, fleet, Insight(), stopping, deadline, min(console.width, 100))
        with httpx.Client() as client:
            if not _wait_ready(client, fleet.members, children, stopping):
                console.print(f"[red]a demo process exited early; see the logs in {fleet.logdir}[/]")
                return 1
            watch.run(client, speed)
            watch.finish(client)
        return 0
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        console.print(f"stopped {children.stop()} processes")
