"""What ``inferwatch demo`` shows: the fleet members it watches, what it reads about them and how it
prints it.

The view reads the exporters (request rate, TTFT/TPOT P99, running/waiting, KV usage, preemptions),
the collector (exact P99 TTFT from the request rows, the top diagnosis per engine, the incidents
that came through Alertmanager) and, through the collector, Prometheus' SLO recording rules. It fits
80 columns. :mod:`inferwatch.demo` starts the processes and drives it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from inferwatch.core import vocabulary as V
from inferwatch.core.quantile import Scrape
from inferwatch.core.symptoms import Symptom

WINDOW_SECONDS = 10.0
SHORT_SYMPTOM: Final[dict[str, str]] = {
    Symptom.LATENCY_P99_HIGH: "queue backlog",
    Symptom.THROUGHPUT_LOW: "low tok/s",
    Symptom.PREEMPTIONS: "preemptions",
    Symptom.TTFT_SLOW: "slow TTFT",
    Symptom.TPOT_SLOW: "slow TPOT",
    Symptom.ERROR_RATE_HIGH: "errors",
    Symptom.STREAMS_ABORTED: "aborts",
    Symptom.GPU_THROTTLED: "GPU throttled",
    Symptom.GPU_ERRORS: "GPU XID",
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
    exact_at_proxy: set[str] = field(default_factory=set)
    """engines whose exact P99 comes from inferwatch proxy's rows (they send no spans of their own)."""
    diagnosis: dict[str, tuple[str, str]] = field(default_factory=dict)
    """engine -> (severity, symptom) of its most severe finding."""
    burn: dict[str, float] = field(default_factory=dict)
    """model -> the highest 5m burn rate among its SLOs."""
    incidents: list[dict[str, Any]] = field(default_factory=list)
    incident_count: int = 0
    alert_names: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


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


def _gpu_activity(last: Scrape) -> float | None:
    """The busiest GPU of the replica: engine activity (DCGM profiling), else utilisation; None without GPUs."""
    for spec in (V.GPU_ENGINE_ACTIVE, V.GPU_UTILIZATION):
        if spec.name in last.gauges_max:
            return last.gauges_max[spec.name]
    return None


def view(members: list[Member], title: str, insight: Insight | None = None, width: int = 80) -> Group:
    """The live view: one row per engine, then firing incidents. Fits ``width`` columns (80 by default)."""
    insight = insight or Insight()
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0), collapse_padding=True
    )
    columns = (
        ("engine", "left"),
        ("req/s", "right"),
        ("TTFT99", "right"),
        ("exact", "right"),
        ("TPOT99", "right"),
        ("run/q", "right"),
        ("KV", "right"),
        ("pre/s", "right"),
        ("GPU", "right"),
        ("burn", "right"),
        ("diagnosis", "left"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    with insight.lock:
        exact, diagnosis, burn = dict(insight.exact_p99), dict(insight.diagnosis), dict(insight.burn)
        exact_at_proxy = set(insight.exact_at_proxy)
        incidents, count = list(insight.incidents), insight.incident_count
    at_proxy = False
    for m in members:
        earlier, last = m.window()
        if last is None:
            table.add_row(m.engine, *["-"] * (len(columns) - 1))
            continue
        running, waiting = last.values.get(V.REQUESTS_RUNNING.name), last.values.get(V.REQUESTS_WAITING.name)
        found = diagnosis.get(m.engine)
        diag = Text("ok", style="green")
        if found is not None:
            severity, symptom = found
            diag = Text(SHORT_SYMPTOM.get(symptom, symptom), style="bold red" if severity == "critical" else "yellow")
        burn_rate = burn.get(model_of(m.engine))
        burn_text = Text(_count(burn_rate, "x"), style="bold red" if burn_rate and burn_rate >= 14.4 else "")
        p_earlier, p_last = m.window(m.proxy_history)
        ttft, tpot = (_latency(last, earlier, spec, 0.99) for spec in (V.TIME_TO_FIRST_TOKEN, V.TIME_PER_OUTPUT_TOKEN))
        rate = last.rate(earlier, V.REQUESTS.name)
        at_proxy = at_proxy or m.engine in exact_at_proxy
        if p_last is not None:
            # what the engine does not measure, the proxy in front of it does (marked *)
            if ttft == "-" and (client := _latency(p_last, p_earlier, V.CLIENT_TIME_TO_FIRST_TOKEN, 0.99)) != "-":
                ttft, at_proxy = f"{client}*", True
            if tpot == "-" and (client := _latency(p_last, p_earlier, V.CLIENT_TIME_PER_OUTPUT_TOKEN, 0.99)) != "-":
                tpot, at_proxy = f"{client}*", True
            if rate is None:
                rate = p_last.rate(p_earlier, V.CLIENT_REQUESTS.name)
        table.add_row(
            Text(m.engine, style="" if last.up else "red strike"),
            _count(rate),
            ttft,
            _fmt(exact.get(m.engine), "s") + ("*" if m.engine in exact_at_proxy else ""),
            tpot,
            f"{_count(running)}/{_count(waiting)}",
            _fmt(last.gauges_max.get(V.KV_CACHE_USAGE.name), "%"),
            _count(last.rate(earlier, V.PREEMPTIONS.name)),
            _fmt(_gpu_activity(last), "%"),
            burn_text,
            diag,
        )
    lines: list[Text] = []
    if at_proxy:
        lines.append(Text("* at the client, through inferwatch proxy (the engine does not measure it)", style="dim"))
    firing = [i for i in incidents if i.get("status") == "firing"]
    summary = f"incidents: {count} ({len(firing)} firing) via Prometheus -> Alertmanager -> collector"
    lines.append(Text(summary, style="bold" if firing else "dim"))
    for incident in firing[:3]:
        text = f"  FIRING #{incident['id']} {incident['title']}"
        lines.append(Text(text[: width - 1] + ("…" if len(text) > width - 1 else ""), style="bold red"))
    return Group(table, *lines)


def scrape(client: httpx.Client, m: Member) -> None:
    """One scrape of the member's exporter (and of its proxy's /metrics), into its history."""
    for url, history in ((m.metrics_url, m.history), (m.proxy_metrics_url, m.proxy_history)):
        if url is None:
            continue
        try:
            text = client.get(url, timeout=5).text
        except httpx.HTTPError:
            continue
        with contextlib.suppress(ValueError):
            history.append(Scrape.parse(text, time.monotonic()))


def _exact_p99(client: httpx.Client, collector: str, side: str) -> dict[str, float]:
    body = client.get(
        f"{collector}/api/v1/stats",
        params={"window": f"{WINDOW_SECONDS:g}s", "group_by": "engine", "side": side},
        timeout=5,
    ).json()
    return {
        str(e["engine"]): float(e["time_to_first_token"]["p99"])
        for e in body.get("data", [])
        if (e.get("time_to_first_token") or {}).get("p99") is not None
    }


def refresh_insight(client: httpx.Client, collector: str, insight: Insight, with_prometheus: bool) -> None:
    """One round of questions to the collector (each may take a few seconds; errors leave the old answer)."""
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        # the engines' own rows, then the proxy's for engines that send none (llama.cpp)
        engine_side, proxy_side = (_exact_p99(client, collector, side) for side in ("engine", "proxy"))
        with insight.lock:
            insight.exact_p99 = {**proxy_side, **engine_side}
            insight.exact_at_proxy = set(proxy_side) - set(engine_side)
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


def print_endpoints(
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
