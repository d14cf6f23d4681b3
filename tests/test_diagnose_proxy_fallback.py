"""The diagnosis reads inferwatch proxy's measurements where the engine exports none.

An engine without a time to first token, a time per output token, an end-to-end latency or finished
requests by outcome (llama.cpp's server has none of them, SGLang no time per output token: their
profiles' ``unsupported``) is diagnosed from the proxy in front of it, by engine and model; an engine
that exports the signal keeps its own, proxy or not. Checked three ways: the PromQL on synthetic series
(``promtool test rules``), a real Prometheus scraping an exporter's exposition and a real proxy's
``llm_client_*`` families (``read_fleet`` then ``diagnose``), and the evaluation's words on a hand-built
fleet.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from inferwatch.collector.diagnosis.evaluate import AT_PROXY, diagnose
from inferwatch.collector.diagnosis.prometheus import MEASURED_AT, fleet_queries, read_fleet
from inferwatch.collector.diagnosis.signals import ENGINE, PROXY, Filters, Fleet, TargetKey
from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.symptoms import Signal, Status, Symptom
from inferwatch.proxy.client_metrics import ClientMetrics, registry_for, render
from tests.conftest import require_tool
from tests.support.prometheus_run import running, wait_scraped
from tests.support.promql_check import expr_test

LACKING = V.ENGINE_LLAMACPP
"""an engine whose exporter has no latency histogram and no finished-request counter."""
HAVING = V.ENGINE_VLLM


# -- the PromQL, on synthetic series -------------------------------------------------------------------
def _histogram(name: str, labels: str, per_minute: dict[str, int]) -> list[tuple[str, str]]:
    """Cumulative buckets growing by ``per_minute`` observations a minute in each bucket ``le``."""
    out, running = [], 0
    for le, count in per_minute.items():
        running += count
        out.append((f'{name}_bucket{{{labels},le="{le}"}}', f"0+{running}x10"))
    return out


def _row(engine: str, instance: str, value: float, proxy: bool) -> dict[str, object]:
    side = f',{MEASURED_AT}="{PROXY}"' if proxy else ""
    return {"labels": f'{{engine="{engine}",model="m",instance="{instance}"{side}}}', "value": value}


@pytest.mark.parametrize(
    ("signal", "engine_spec"),
    [
        (Signal.TTFT_P99, V.TIME_TO_FIRST_TOKEN),
        (Signal.TPOT_P99, V.TIME_PER_OUTPUT_TOKEN),
        (Signal.E2E_P99, V.REQUEST_DURATION),
    ],
)
def test_a_p99_the_engine_lacks_comes_from_the_proxy_on_each_of_its_targets(
    promtool: str, tmp_path: Path, signal: Signal, engine_spec: V.MetricSpec
) -> None:
    client_spec = V.CLIENT_COUNTERPARTS[engine_spec.key]
    running = V.REQUESTS_RUNNING.name
    series = [
        # two replicas of the engine that lacks the histogram, one proxy in front of both: every observation
        # of the proxy's in (0.5, 1], so its p99 is 0.5 + 0.5 * 0.99
        (f'{running}{{engine="{LACKING}",model="m",instance="a:9400"}}', "2x10"),
        (f'{running}{{engine="{LACKING}",model="m",instance="b:9400"}}', "1x10"),
        *_histogram(
            client_spec.name, f'engine="{LACKING}",model="m",instance="proxy:9500"', {"0.5": 0, "1": 60, "+Inf": 0}
        ),
        # an engine with its own histogram (all in (0, 0.1]: p99 0.099) keeps it, though a proxy measures too
        (f'{running}{{engine="{HAVING}",model="m",instance="c:9400"}}', "2x10"),
        *_histogram(engine_spec.name, f'engine="{HAVING}",model="m",instance="c:9400"', {"0.1": 60, "+Inf": 0}),
        *_histogram(
            client_spec.name, f'engine="{HAVING}",model="m",instance="proxy:9501"', {"0.5": 0, "1": 60, "+Inf": 0}
        ),
    ]
    expr = fleet_queries("5m", Filters())[signal]
    rows = [
        _row(LACKING, "a:9400", 0.995, proxy=True),
        _row(LACKING, "b:9400", 0.995, proxy=True),
        _row(HAVING, "c:9400", 0.099, proxy=False),
    ]
    expr_test(promtool, tmp_path, expr, series, rows)


def test_error_share_and_request_rate_the_engine_lacks_come_from_the_proxy(promtool: str, tmp_path: Path) -> None:
    client, engine, running = V.CLIENT_REQUESTS.name, V.REQUESTS.name, V.REQUESTS_RUNNING.name
    series = [
        (f'{running}{{engine="{LACKING}",model="m",instance="a:9400"}}', "2x10"),
        (f'{running}{{engine="{LACKING}",model="m",instance="b:9400"}}', "1x10"),
        # the proxy saw 540 stops and 60 errors a minute: 10 requests a second, 5 per replica, 10 % errors
        (f'{client}{{engine="{LACKING}",model="m",instance="proxy:9500",outcome="stop"}}', "0+540x10"),
        (f'{client}{{engine="{LACKING}",model="m",instance="proxy:9500",outcome="error"}}', "0+60x10"),
        # the engine that counts its requests: its own 1 request a second, 5 % errors
        (f'{running}{{engine="{HAVING}",model="m",instance="c:9400"}}', "2x10"),
        (f'{engine}{{engine="{HAVING}",model="m",instance="c:9400",outcome="stop"}}', "0+57x10"),
        (f'{engine}{{engine="{HAVING}",model="m",instance="c:9400",outcome="error"}}', "0+3x10"),
        (f'{client}{{engine="{HAVING}",model="m",instance="proxy:9501",outcome="error"}}', "0+60x10"),
    ]
    queries = fleet_queries("5m", Filters())
    error_rows = [
        _row(LACKING, "a:9400", 0.1, proxy=True),
        _row(LACKING, "b:9400", 0.1, proxy=True),
        _row(HAVING, "c:9400", 0.05, proxy=False),
    ]
    expr_test(promtool, tmp_path, queries[Signal.ERROR_RATIO], series, error_rows)
    rate_rows = [
        _row(LACKING, "a:9400", 5.0, proxy=True),
        _row(LACKING, "b:9400", 5.0, proxy=True),
        _row(HAVING, "c:9400", 1.0, proxy=False),
    ]
    expr_test(promtool, tmp_path, queries[Signal.REQUEST_RATE], series, rate_rows)


# -- a real Prometheus: an exporter's exposition and a real proxy's families ------------------------------
def _serve(render_page: Callable[[], bytes]) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = render_page()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"


class EngineExposition:
    """What an exporter shows for one engine replica: a running gauge, token counters that grow with every
    scrape, and (when ``ttft``) its own time-to-first-token histogram with every request at 50 ms."""

    def __init__(self, engine: str, ttft: bool) -> None:
        self.engine, self.ttft, self.scrapes = engine, ttft, 0

    def page(self) -> bytes:
        self.scrapes += 1
        n = self.scrapes
        labels = f'{V.LABEL_ENGINE}="{self.engine}",{V.LABEL_MODEL}="m"'
        lines = [
            f"# TYPE {V.REQUESTS_RUNNING.name} gauge",
            f"{V.REQUESTS_RUNNING.name}{{{labels}}} 3",
            f"# TYPE {V.PROMPT_TOKENS.name} counter",
            f"{V.PROMPT_TOKENS.name}{{{labels}}} {100 * n}",
            f"# TYPE {V.GENERATION_TOKENS.name} counter",
            f"{V.GENERATION_TOKENS.name}{{{labels}}} {200 * n}",
        ]
        if self.ttft:
            name = V.TIME_TO_FIRST_TOKEN.name
            lines += [
                f"# TYPE {name} histogram",
                f'{name}_bucket{{{labels},le="0.1"}} {5 * n}',
                f'{name}_bucket{{{labels},le="+Inf"}} {5 * n}',
                f"{name}_sum{{{labels}}} {0.25 * n}",
                f"{name}_count{{{labels}}} {5 * n}",
                f"# TYPE {V.REQUESTS.name} counter",
                f'{V.REQUESTS.name}{{{labels},{V.LABEL_OUTCOME}="{V.OUTCOME_STOP}"}} {5 * n}',
            ]
        return ("\n".join(lines) + "\n").encode()


class ProxyTraffic:
    """A real proxy's ``llm_client_*`` families: five requests more at every scrape, each with a 0.8 s first
    token and 0.3 s per output token, one of the five failed."""

    def __init__(self, engine: str) -> None:
        self.metrics = ClientMetrics(engine, V.Vocabulary())
        self.registry = registry_for(self.metrics, process=False)
        self.lock = threading.Lock()

    def page(self) -> bytes:
        with self.lock:
            for i in range(5):
                self.metrics.observe(V.CLIENT_TIME_TO_FIRST_TOKEN, "m", 0.8)
                self.metrics.observe(V.CLIENT_TIME_PER_OUTPUT_TOKEN, "m", 0.3)
                outcome = V.OUTCOME_ERROR if i == 0 else V.OUTCOME_STOP
                self.metrics.finished("m", outcome, 4.0, (100, False), (20, False))
            return render(self.registry)


def _p99_in_bucket(spec: V.MetricSpec, value: float) -> float:
    """``histogram_quantile(0.99)`` of observations all equal to ``value``: interpolated in its bucket."""
    bounds = V.Vocabulary().buckets(spec)
    upper = next(b for b in bounds if b >= value)
    lower = max((b for b in bounds if b < value), default=0.0)
    return lower + (upper - lower) * 0.99


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """Prometheus scraping two exporters (one engine with, one without the histograms) and a proxy in front
    of each; yields its URL and the exporters' instances."""
    require_tool("prometheus")
    servers, instances = [], {}
    jobs: dict[str, list[str]] = {"exporters": [], "proxies": []}
    for engine, ttft in ((LACKING, False), (HAVING, True)):
        server, where = _serve(EngineExposition(engine, ttft).page)
        servers.append(server)
        instances[engine] = where
        jobs["exporters"].append(where)
        server, where = _serve(ProxyTraffic(engine).page)
        servers.append(server)
        jobs["proxies"].append(where)
    try:
        with running(tmp_path, jobs) as base:
            wait_scraped(base, 2)
            yield base, instances
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_real_prometheus_diagnosis_reads_the_proxy_where_the_engine_has_nothing(
    scraped: tuple[str, dict[str, str]],
) -> None:
    base, instances = scraped

    async def read() -> Fleet:
        async with httpx.AsyncClient() as client:
            return await read_fleet(client, base, window="1m", filters=Filters())

    fleet = asyncio.run(read())
    lacking = fleet.targets[TargetKey(LACKING, "m", instances[LACKING])]
    having = fleet.targets[TargetKey(HAVING, "m", instances[HAVING])]

    ttft, tpot = lacking.get(Signal.TTFT_P99), lacking.get(Signal.TPOT_P99)
    assert ttft is not None and ttft.measured_at == PROXY
    assert ttft.value == pytest.approx(_p99_in_bucket(V.CLIENT_TIME_TO_FIRST_TOKEN, 0.8), rel=1e-6)
    assert tpot is not None and tpot.measured_at == PROXY
    assert tpot.value == pytest.approx(_p99_in_bucket(V.CLIENT_TIME_PER_OUTPUT_TOKEN, 0.3), rel=1e-6)
    errors = lacking.get(Signal.ERROR_RATIO)
    assert errors is not None and errors.measured_at == PROXY and errors.value == pytest.approx(0.2)
    rate = lacking.get(Signal.REQUEST_RATE)
    assert rate is not None and rate.measured_at == PROXY and rate.value > 0

    own = having.get(Signal.TTFT_P99)
    assert own is not None and own.measured_at == ENGINE and own.value == pytest.approx(0.099)
    own_rate = having.get(Signal.REQUEST_RATE)
    assert own_rate is not None and own_rate.measured_at == ENGINE
    assert having.get(Signal.TPOT_P99) is not None and having.values[Signal.TPOT_P99].measured_at == PROXY

    result = diagnose(fleet, builtin_profiles())
    mine = {f.symptom: f for f in result.findings if f.instance == instances[LACKING]}
    assert mine[Symptom.ERROR_RATE_HIGH].severity is Status.CRITICAL
    assert mine[Symptom.ERROR_RATE_HIGH].summary.endswith(AT_PROXY)
    assert Symptom.TPOT_SLOW in mine, [f.summary for f in result.findings]
    evidence = {e.signal: e for e in mine[Symptom.TPOT_SLOW].evidence}
    assert evidence[Signal.TPOT_P99.value].description.endswith(AT_PROXY)
    assert MEASURED_AT in evidence[Signal.TPOT_P99.value].query


# -- the evaluation's words -------------------------------------------------------------------------------
def test_the_finding_says_which_side_measured_it_and_unknown_says_no_proxy_did() -> None:
    key = TargetKey(V.ENGINE_TGI, "m", "a:9400")
    fleet = Fleet("prometheus", "10m", 600)
    target = fleet.target(key)
    target.put(Signal.TPOT_P99, 0.5, "proxied tpot", PROXY)
    target.put(Signal.PREFILL_DECODE_RATIO, 1.0, "ratio")
    target.put(Signal.TTFT_P99, 0.05, "engine ttft")
    result = diagnose(fleet, builtin_profiles())
    (finding,) = [f for f in result.findings if f.symptom is Symptom.TPOT_SLOW]
    assert finding.summary.endswith(AT_PROXY)
    by_signal = {e.signal: e for e in finding.evidence}
    assert by_signal[Signal.TPOT_P99.value].description.endswith(AT_PROXY)

    # a signal neither the engine nor a proxy gave: the coverage reason, and that no proxy measured it
    profile = builtin_profiles()[V.ENGINE_TGI]
    assert V.TIME_TO_FIRST_TOKEN.key in profile.unsupported
    bare = Fleet("prometheus", "10m", 600)
    bare.target(key).put(Signal.TTFT_QUEUE_SHARE, 0.1, "share")
    (status,) = diagnose(bare, builtin_profiles()).targets
    assert status.status[Symptom.TTFT_SLOW] is Status.UNKNOWN
    reason = status.reasons[Symptom.TTFT_SLOW]
    assert (
        reason
        == profile.unsupported[V.TIME_TO_FIRST_TOKEN.key] + "; no inferwatch proxy in front of it measured it either"
    )
