"""End to end with a real Prometheus (Debian's binary) scraping the stack on loopback.

Simulated vLLM, TGI, trtllm-serve and Triton under load, an inferwatch exporter beside each, and
Prometheus scraping the exporters every second with the generated rules loaded. Checks that every
dashboard query returns series for each engine that maps its signals; that with ``$engine`` set to
one engine every panel query returns numbers exactly when the coverage matrix maps its signals for
that engine, and nothing otherwise, the panel's "no value" text then giving the reason; that the
default SLOs' rules produce values; and that switching the simulated vLLM to ``kv-pressure`` makes a
KV-cache or preemption alert pending or firing. Every process is stopped at the end.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from inferwatch.alerts.generate import generate as generate_alerts
from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.slo import parse as parse_slos
from inferwatch.dashboards import gaps as coverage
from inferwatch.dashboards.panels import Query
from inferwatch.exporters.coverage import matrix
from inferwatch.exporters.engines import builtin_registry
from inferwatch.simulator.dcgm import PATH as SIM_GPU_PATH
from inferwatch.simulator.gpus import sim_gpu_uuid
from tests.conftest import ROOT, free_port, require_tool
from tests.support.stack import Processes, exporter_cmd, prometheus_cmd, simulator_cmd, write_prometheus_config

ENGINES = (V.ENGINE_VLLM, V.ENGINE_TGI, V.ENGINE_TRTLLM, V.ENGINE_TRITON)
WARM_UP_SECONDS = 25
RATE_WINDOW = "15s"
FAST_ALERTS = {
    "kv_cache_saturated_for": "5s",
    "kv_cache_prediction_for": "5s",
    "preemptions_for": "10s",
    "queue_growth_for": "5s",
    "target_down_for": "5s",
    "metrics_absent_for": "10s",
    "period_rules_interval": "5s",
}

FAST_HEADROOM = {"step": "5s", "window": "30s"}
FAST_COST = {"step": "2s"}
FITTED_RECORDS = (
    V.HEADROOM_RATIO_RECORD,
    V.CAPACITY_REQUESTS_PER_SECOND_RECORD,
    V.CAPACITY_CONCURRENCY_RECORD,
    V.REPLICAS_NEEDED_RECORD,
)
"""Headroom records that exist only once a replica's batch has varied enough for the TPOT fit: a
steady simulator may never give them in a test's minute. tests/alerts/headroom.yaml proves them."""


@dataclass
class Stack:
    prometheus: str
    sims: dict[str, str]
    client: httpx.Client
    """one keep-alive connection for the hundreds of panel queries."""

    def rule_errors(self) -> list[str]:
        """Rules Prometheus could not evaluate (for failure messages)."""
        groups = httpx.get(f"{self.prometheus}/api/v1/rules", timeout=30).json()["data"]["groups"]
        return [f"{r['name']}: {r.get('lastError')}" for g in groups for r in g["rules"] if r.get("health") != "ok"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = self.client.get(f"{self.prometheus}/api/v1/query", params={"query": expr})
        body = r.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus_bin = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("e2e")
    # rules: the default SLOs, with alert durations short enough for a test
    slo_text = (ROOT / "inferwatch" / "alerts" / "slos.yaml").read_text()
    spec = parse_slos(slo_text, "slos.yaml", V.Vocabulary())
    spec = spec.model_copy(update={"alerts": spec.alerts.model_copy(update=FAST_ALERTS)})
    spec = spec.model_copy(update={"headroom": spec.headroom.model_copy(update=FAST_HEADROOM)})
    assert spec.cost is not None, "the default SLO file prices GPU-hours (the cost panels read its rules)"
    spec = spec.model_copy(update={"cost": spec.cost.model_copy(update=FAST_COST)})
    files = generate_alerts(spec, V.Vocabulary())
    (tmp / "rules.yml").write_text(files["rules.yml"])
    procs = Processes(tmp / "logs", cwd=ROOT)
    sims: dict[str, str] = {}
    exporters: dict[str, str] = {}
    try:
        for i, engine in enumerate(ENGINES):
            sp, ep = free_port(), free_port()
            sims[engine] = f"http://127.0.0.1:{sp}"
            exporters[engine] = f"127.0.0.1:{ep}"
            procs.spawn(f"{engine}-sim", simulator_cmd(engine, sp, model=f"{engine}-model", seed=i, speed=2))
            options = {"max_batch_total_tokens": 16384} if engine == V.ENGINE_TGI else None
            # each simulator's GPU, a dcgm-exporter-shaped page beside it: the GPU and cost panels read it
            gpu = (f"{sims[engine]}{SIM_GPU_PATH}", sim_gpu_uuid(engine, sp, 0))
            procs.spawn(f"{engine}-exporter", exporter_cmd(engine, sims[engine], exporters[engine], options, gpu))
        prom_port = free_port()
        jobs = {f"inferwatch-{engine}": [exporters[engine]] for engine in ENGINES}
        write_prometheus_config(tmp / "prometheus.yml", jobs, [tmp / "rules.yml"])
        procs.spawn("prometheus", prometheus_cmd(prometheus_bin, tmp / "prometheus.yml", tmp / "data", prom_port))
        base = f"http://127.0.0.1:{prom_port}"
        procs.wait_http("prometheus", f"{base}/-/ready")
        for engine in ENGINES:
            procs.wait_http(f"{engine}-exporter", f"http://{exporters[engine]}/metrics")
        time.sleep(WARM_UP_SECONDS)
        with httpx.Client(timeout=30) as client:
            yield Stack(base, sims, client)
    finally:
        procs.close()


# Signals an engine exposes only with a feature the simulators run without: vLLM registers its
# speculative-decoding counters only with --speculative-config (the simulated trtllm-serve speculates),
# its LoRA gauge only with --enable-lora; no engine has llm_client_* without inferwatch proxy in front.
FEATURE_GATED: dict[str, tuple[V.MetricSpec, ...]] = {
    V.ENGINE_VLLM: (
        V.SPEC_DECODE_DRAFT_TOKENS,
        V.SPEC_DECODE_ACCEPTED_TOKENS,
        # only with --enable-lora (the simulated vLLM serves no adapters)
        V.LORA_ADAPTER_ACTIVE,
        V.LORA_ADAPTERS_MAX,
        *V.CLIENT_METRICS,
    ),
    # what the client sees comes from inferwatch proxy, which this fleet runs without
    **{engine: V.CLIENT_METRICS for engine in (V.ENGINE_TGI, V.ENGINE_TRTLLM, V.ENGINE_TRITON)},
}
# every exporter here reads its simulator's GPU (so the GPU families are mapped for all), whose XID
# series exists only once the GPU had an error (the simulators' xid profile, not run here)
FEATURE_GATED = {e: (*FEATURE_GATED.get(e, ()), V.GPU_XID) for e in ENGINES}


@functools.cache
def coverage_matrix() -> dict[str, dict[str, str]]:
    return matrix(builtin_registry())


def mapped_engines(metrics: tuple[V.MetricSpec, ...]) -> set[str]:
    """Engines whose exporter maps every one of ``metrics`` (the coverage matrix), less gated features."""
    m = coverage_matrix()
    return {
        e
        for e in ENGINES
        if all(m[e].get(spec.key) == "mapped" or spec.health or spec in V.GPU_METRICS for spec in metrics)
        and not set(metrics) & set(FEATURE_GATED.get(e, ()))
    }


def wait_for_slo_series(stack: Stack, timeout: float = 75) -> set[str]:
    """SLO recording groups evaluate every 30 s: wait until every default SLO has its series."""
    wanted = {"ttft-500ms", "tpot-100ms", "e2e-20s", "availability"}
    deadline = time.monotonic() + timeout
    while True:
        slos = {s["metric"][V.SLO_LABEL] for s in stack.query(V.slo_error_ratio("5m"))}
        budget = {s["metric"][V.SLO_LABEL] for s in stack.query(V.SLO_BUDGET_REMAINING_RECORD)}
        if (wanted <= slos and wanted <= budget) or time.monotonic() > deadline:
            return slos & budget
        time.sleep(2)


def test_every_engine_is_scraped_and_up(stack: Stack) -> None:
    up = stack.query(f"{V.EXPORTER_UP.name} == 1")
    assert {s["metric"][V.LABEL_ENGINE] for s in up} == set(ENGINES)
    for spec in (V.REQUESTS, V.REQUESTS_RUNNING, V.KV_CACHE_USAGE, V.GENERATION_TOKENS):
        got = {s["metric"][V.LABEL_ENGINE] for s in stack.query(spec.name)}
        assert mapped_engines((spec,)) <= got, spec.name


def test_default_slo_rules_produce_values(stack: Stack) -> None:
    wanted = {"ttft-500ms", "tpot-100ms", "e2e-20s", "availability"}
    slos = wait_for_slo_series(stack)
    assert wanted <= slos, (slos, stack.rule_errors())
    ratios = stack.query(V.slo_error_ratio("5m"))
    for s in ratios:
        value = float(s["value"][1])
        assert value != value or 0.0 <= value <= 1.0  # NaN only without traffic
    assert stack.query(V.SLO_OBJECTIVE_RECORD)
    assert stack.query(V.SLO_BUDGET_REMAINING_RECORD)


def test_every_dashboard_query_returns_series(stack: Stack) -> None:
    from inferwatch.dashboards.registry import all_queries

    spec = parse_slos((ROOT / "inferwatch" / "alerts" / "slos.yaml").read_text(), "slos.yaml", V.Vocabulary())
    wait_for_slo_series(stack)
    problems = []
    for uid, panel, query in all_queries(spec, V.Vocabulary()):
        expr = query.expr.replace("$__rate_interval", RATE_WINDOW).replace("$__range", "1m")
        for var in ("$engine", "$model", "$instance", "$job"):
            expr = expr.replace(f"{var}", ".*")
        expected = {e for e in ENGINES if answers(query, e)} if query.metrics else set()
        if query.metrics and not expected:
            continue  # no engine provides these signals: nothing to prove
        result = stack.query(expr)
        if not result:
            if "ALERTS" in expr:
                continue  # no alert firing is a valid, empty answer
            if any(record in expr for record in FITTED_RECORDS):
                continue  # no fit yet is a valid, empty answer (the load and its inputs are checked)
            problems.append(f"{uid} / {panel}: no series for {expr}")
            continue
        if query.per_engine:
            got = {s["metric"].get(V.LABEL_ENGINE) for s in result}
            missing = expected - got
            if missing:
                problems.append(f"{uid} / {panel}: no series for {sorted(missing)}: {expr}")
    assert not problems, "\n".join(problems)


def _instant(expr: str, engine: str) -> str:
    """A panel query as Grafana would send it with ``$engine`` set to one engine and the rest "All"."""
    expr = expr.replace("$__rate_interval", RATE_WINDOW).replace("$__range", "1m")
    expr = expr.replace("$engine", engine)
    for var in ("$model", "$instance"):
        expr = expr.replace(var, ".*")
    return expr


@functools.cache
def bucketless(engine: str) -> frozenset[str]:
    """Canonical histograms the engine's exporter fills from a sum and a count only (no buckets)."""
    adapter = builtin_registry().get(engine)
    rows = (*adapter.rows, *adapter.hook_rows)
    return frozenset({r.metric.key for r in rows if r.sum_only} - {r.metric.key for r in rows if not r.sum_only})


def answers(query: Query, engine: str) -> bool:
    """Whether ``engine`` fills ``query`` here: the coverage matrix maps every metric (any, for a query of one
    ``or`` part per metric), buckets exist for every histogram it reads them of, the engine's series carry
    every label it selects on, and no metric is gated behind a feature the simulated engine runs without."""
    if set(query.labels) & set(builtin_profiles()[engine].unlabelled):
        return False
    buckets = {m.key for m in query.bucket_metrics()}
    parts = [(m,) for m in query.metrics] if query.any_of else [query.metrics]
    return any(
        engine in mapped_engines(part) and not {m.key for m in part} & buckets & bucketless(engine) for part in parts
    )


def test_every_panel_answers_for_exactly_the_engines_that_map_it(stack: Stack) -> None:
    """With ``$engine`` set to one engine, every Prometheus panel query returns numbers when the coverage
    matrix maps its signals for that engine, and nothing when it does not; a panel left empty for an
    engine says why in its Grafana "no value" text (the profile's reasons, or the feature it waits for)."""
    import json

    from inferwatch.dashboards.generate import generate as generate_dashboards
    from inferwatch.dashboards.registry import dashboards

    spec = parse_slos((ROOT / "inferwatch" / "alerts" / "slos.yaml").read_text(), "slos.yaml", V.Vocabulary())
    profiles = builtin_profiles()
    files = generate_dashboards(spec, V.Vocabulary())
    problems: list[str] = []
    checked = 0
    for board in dashboards(spec, V.Vocabulary()):
        rendered = {p["title"]: p for p in json.loads(files[f"{board.uid}.json"])["panels"]}
        for panel in board.all_panels():
            queries = [q for q in panel.queries if q.metrics]
            if not queries:
                continue  # SLO rules, SQL and text panels: covered by the tests above and test_dashboards
            no_value = rendered[panel.title]["fieldConfig"]["defaults"]["noValue"]
            for engine in ENGINES:
                empty = True
                for query in queries:
                    result = stack.query(_instant(query.expr, engine))
                    checked += 1
                    expected = answers(query, engine)
                    values = [float(s["value"][1]) for s in result]
                    if expected and not any(v == v for v in values):  # NaN != NaN
                        problems.append(f"{board.uid} / {panel.title} / {engine}: no number for {query.expr}")
                    if not expected and result:
                        problems.append(f"{board.uid} / {panel.title} / {engine}: unexpected series {result[:2]}")
                    empty = empty and not result
                if not empty:
                    continue
                gated = any(set(q.metrics) & set(FEATURE_GATED.get(engine, ())) for q in queries)
                why = (
                    [panel.idle.lower()]
                    if gated
                    else [f"Not exposed by {profiles[engine].title}:"]
                    + [r for q in queries for r in coverage.query_missing(profiles[engine], q)]
                )
                missing = [w for w in why if w not in no_value and w not in no_value.lower()]
                if not why or missing:
                    problems.append(f"{board.uid} / {panel.title} / {engine}: empty, but noValue lacks {missing}")
    assert checked > 300, checked
    assert not problems, "\n".join(problems)


def test_kv_pressure_raises_an_alert(stack: Stack) -> None:
    r = httpx.post(f"{stack.sims[V.ENGINE_VLLM]}/simulator/profile", json={"profile": "kv-pressure"}, timeout=10)
    assert r.status_code == 200
    names = f"{V.ALERT_KV_SATURATED}|{V.ALERT_PREEMPTIONS_SUSTAINED}"
    deadline = time.monotonic() + 120
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = stack.query(f'ALERTS{{alertname=~"{names}",{V.LABEL_ENGINE}="{V.ENGINE_VLLM}"}}')
        if any(s["metric"].get("alertstate") in ("pending", "firing") for s in seen):
            break
        time.sleep(2)
    assert seen, "neither the KV-cache nor the preemption alert became pending or firing under kv-pressure"
