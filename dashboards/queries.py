"""The inferwatch dashboards as plain data: panels, Prometheus queries and SQL queries (no grafanalib).

Every metric, recording-rule and alert name comes from :mod:`inferwatch.core.vocabulary`; every query reads
canonical series only, so one dashboard serves vLLM, TGI, TensorRT-LLM and Triton alike.
:mod:`inferwatch.dashboards.grafana` turns a :class:`DashboardSpec` into Grafana JSON;
:mod:`inferwatch.dashboards.sketch` draws its layout.

Conventions of the queries:

* template variables ``$engine``, ``$model``, ``$instance`` are regex matchers (``engine=~"$engine"``)
  whose "All" value is ``.*``;
* rates use ``[$__rate_interval]`` (``[$__range]`` only for a single value over the whole time range);
* percentiles are ``histogram_quantile`` over the canonical buckets, summed ``by (le, engine, model)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from inferwatch.core import knowledge
from inferwatch.core import vocabulary as V
from inferwatch.core.schema import DECODE, E2E, GENERATION_TOKENS, PREFILL, PROMPT_TOKENS, QUEUE, TPOT, TTFT
from inferwatch.core.schema import REQUEST_TABLE as TABLE_NAME
from inferwatch.core.slo import SLO, SLOFile, alert_windows, decimal_text

GRID_WIDTH = 24

# uids of the dashboards (stable: Grafana upserts provisioned dashboards by uid)
UID_FLEET = "inferwatch-fleet"
UID_SLOS = "inferwatch-slos"
UID_ENGINE = "inferwatch-engine"
UID_KV_CACHE = "inferwatch-kv-cache"
UID_REQUESTS = "inferwatch-requests"

# template variables
VAR_DATASOURCE = "datasource"
VAR_SQL_DATASOURCE = "sqldatasource"
VAR_ENGINE = "engine"
VAR_MODEL = "model"
VAR_INSTANCE = "instance"
INSTANCE_LABEL = "instance"
ALL_VALUE = ".*"

RATE_INTERVAL = "$__rate_interval"
RANGE = "$__range"
QUANTILES = (0.5, 0.9, 0.99)

# Grafana datasource plugin types and the provisioned datasources' stable uids
PROMETHEUS_TYPE = "prometheus"
POSTGRES_TYPE = "grafana-postgresql-datasource"
PROMETHEUS_UID = "inferwatch-prometheus"
POSTGRES_UID = "inferwatch-postgres"

# panel and query kinds
TIMESERIES = "timeseries"
STAT = "stat"
TABLE = "table"
HEATMAP = "heatmap"
TEXT = "text"

# Grafana units
UNIT_SECONDS = "s"
UNIT_RATIO = "percentunit"
UNIT_REQPS = "reqps"
UNIT_TOKENS_PER_S = "suffix: tok/s"
UNIT_TOKENS = "suffix: tokens"
UNIT_PER_S = "suffix: /s"
UNIT_REQUESTS = "suffix: requests"
UNIT_BURN = "suffix: ×"
UNIT_COUNT = "short"
UNIT_NONE = "none"
UNIT_UP = "bool_yes_no"


@dataclass(frozen=True)
class Query:
    """One Prometheus query of a panel."""

    expr: str
    legend: str
    metrics: tuple[V.MetricSpec, ...]
    """the canonical metrics the expression reads (empty for queries of SLO recording rules)."""
    per_engine: bool
    """the result keeps the ``engine`` label: every engine that maps all ``metrics`` appears in it."""
    kind: str = TIMESERIES
    """``timeseries`` (range query), ``stat`` or ``table`` (instant), ``heatmap`` (bucket series)."""


@dataclass(frozen=True)
class SqlQuery:
    """One SQL query on the collector's PostgreSQL database (Grafana macros such as ``$__timeFilter``)."""

    sql: str
    format: str = TABLE
    """``table`` or ``time_series``."""


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str
    width: int
    height: int
    sql: tuple[SqlQuery, ...] = ()
    """SQL queries (then the panel reads the SQL datasource and ``queries`` is empty)."""
    content: str = ""
    """markdown of a text panel."""
    column_units: tuple[tuple[str, str], ...] = ()
    """(column or series name, unit) overrides of a table."""
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class Row:
    """A row header: the panels after it, up to the next row, belong to it."""

    title: str
    kind: str = "row"
    width: int = GRID_WIDTH
    height: int = 1


@dataclass(frozen=True)
class Variable:
    """A template variable: a datasource picker or the label values of a canonical series."""

    name: str
    label: str
    kind: str
    """``datasource`` or ``query``."""
    query: str
    """datasource plugin type, or ``label_values(...)``."""
    default: str = ""
    include_all: bool = True
    multi: bool = True


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    variables: tuple[Variable, ...]
    panels: tuple[Panel | Row, ...]
    tags: tuple[str, ...] = ("inferwatch", "llm")

    def all_panels(self) -> list[Panel]:
        return [p for p in self.panels if isinstance(p, Panel)]


@dataclass(frozen=True)
class Placed:
    """A panel or row at its grid position."""

    item: Panel | Row
    x: int
    y: int
    w: int
    h: int


def layout(items: Sequence[Panel | Row]) -> list[Placed]:
    """Grid positions, left to right and wrapping at 24 columns; a row starts a new line (no overlaps)."""
    out: list[Placed] = []
    x = y = line_height = 0
    for item in items:
        w = min(max(item.width, 1), GRID_WIDTH)
        if isinstance(item, Row) or x + w > GRID_WIDTH:
            y += line_height
            x = line_height = 0
        out.append(Placed(item, x, y, w, item.height))
        if isinstance(item, Row):
            y += item.height
        else:
            x += w
            line_height = max(line_height, item.height)
    return out


# --- query building blocks --------------------------------------------------------------------
def selector(
    *, engine: bool = True, model: bool = True, instance: bool = True, matchers: Mapping[str, str] | None = None
) -> str:
    """``{engine=~"$engine", model=~"$model", instance=~"$instance"}`` plus exact matchers."""
    parts = []
    if engine:
        parts.append(f'{V.LABEL_ENGINE}=~"${VAR_ENGINE}"')
    if model:
        parts.append(f'{V.LABEL_MODEL}=~"${VAR_MODEL}"')
    if instance:
        parts.append(f'{INSTANCE_LABEL}=~"${VAR_INSTANCE}"')
    parts += [f'{k}="{v}"' for k, v in (matchers or {}).items()]
    return "{" + ", ".join(parts) + "}"


EM = (V.LABEL_ENGINE, V.LABEL_MODEL)
EMI = (V.LABEL_ENGINE, V.LABEL_MODEL, INSTANCE_LABEL)


def _by(labels: Iterable[str]) -> str:
    return ", ".join(labels)


def _legend(labels: Iterable[str], suffix: str = "") -> str:
    text = " ".join("{{" + label + "}}" for label in labels)
    return f"{text} {suffix}".strip()


def rate(metric: V.MetricSpec, suffix: str = "", window: str = RATE_INTERVAL, **extra: str) -> str:
    return f"rate({metric.name}{suffix}{selector(matchers=extra)}[{window}])"


def sum_rate(metric: V.MetricSpec, by: tuple[str, ...] = EM, **extra: str) -> str:
    return f"sum by ({_by(by)}) ({rate(metric, **extra)})"


def quantile(metric: V.MetricSpec, q: float, by: tuple[str, ...] = EM, window: str = RATE_INTERVAL) -> str:
    inner = f"increase({metric.name}_bucket{selector()}[{window}])" if window == RANGE else rate(metric, "_bucket")
    return f"histogram_quantile({q}, sum by ({_by(('le', *by))}) ({inner}))"


def percentile_queries(
    metric: V.MetricSpec, quantiles: Iterable[float] = QUANTILES, name: str = "", by: tuple[str, ...] = EM
) -> tuple[Query, ...]:
    return tuple(
        Query(quantile(metric, q, by), _legend(by, f"{name} p{round(q * 100)}".strip()), (metric,), True)
        for q in quantiles
    )


def gauge(metric: V.MetricSpec, agg: str = "sum", by: tuple[str, ...] = EM) -> str:
    return f"{agg} by ({_by(by)}) ({metric.name}{selector()})"


def describe(what: str, *metrics: V.MetricSpec) -> str:
    """A panel description: what it shows, then the help text of every canonical metric it reads."""
    parts = [what.rstrip(".") + "."]
    parts += [f"{m.name}: {m.help}" for m in metrics]
    return " ".join(parts)


def _prom_variables(*, instance: bool = True) -> tuple[Variable, ...]:
    base = V.REQUESTS_RUNNING.name
    out = [
        Variable(VAR_DATASOURCE, "Prometheus", "datasource", PROMETHEUS_TYPE, PROMETHEUS_UID, False, False),
        Variable(VAR_ENGINE, "Engine", "query", f"label_values({base}, {V.LABEL_ENGINE})"),
        Variable(
            VAR_MODEL, "Model", "query", f'label_values({base}{{{V.LABEL_ENGINE}=~"${VAR_ENGINE}"}}, {V.LABEL_MODEL})'
        ),
    ]
    if instance:
        out.append(
            Variable(
                VAR_INSTANCE,
                "Instance",
                "query",
                f'label_values({base}{{{V.LABEL_ENGINE}=~"${VAR_ENGINE}", {V.LABEL_MODEL}=~"${VAR_MODEL}"}}, '
                f"{INSTANCE_LABEL})",
            )
        )
    return tuple(out)


NOTE = "Generated by `inferwatch generate dashboards` from the canonical vocabulary; do not edit."


# --- LLM Fleet Overview ------------------------------------------------------------------------
def _fleet() -> DashboardSpec:
    up_sel = selector(model=False)
    tok = (V.PROMPT_TOKENS, V.GENERATION_TOKENS)
    panels: list[Panel | Row] = [
        Row("Fleet"),
        Panel(
            "Requests/s",
            describe("Finished requests per second over the whole selection", V.REQUESTS),
            UNIT_REQPS,
            (Query(f"sum({rate(V.REQUESTS)})", "requests/s", (V.REQUESTS,), False, STAT),),
            STAT,
            6,
            4,
        ),
        Panel(
            "Error ratio",
            describe("Share of finished requests whose outcome is error", V.REQUESTS),
            UNIT_RATIO,
            (
                Query(
                    f"(sum({rate(V.REQUESTS, outcome=V.OUTCOME_ERROR)}) or vector(0)) / sum({rate(V.REQUESTS)})",
                    "error ratio",
                    (V.REQUESTS,),
                    False,
                    STAT,
                ),
            ),
            STAT,
            6,
            4,
        ),
        Panel(
            "Output tokens/s",
            describe("Generated tokens per second over the whole selection", V.GENERATION_TOKENS),
            UNIT_TOKENS_PER_S,
            (Query(f"sum({rate(V.GENERATION_TOKENS)})", "tokens/s", (V.GENERATION_TOKENS,), False, STAT),),
            STAT,
            6,
            4,
        ),
        Panel(
            "Exporter targets up",
            describe("Engines the exporters scraped successfully, of all targets", V.EXPORTER_UP),
            UNIT_COUNT,
            (
                Query(
                    f"sum by ({V.LABEL_ENGINE}) ({V.EXPORTER_UP.name}{up_sel})",
                    "{{engine}} up",
                    (V.EXPORTER_UP,),
                    True,
                    STAT,
                ),
                Query(
                    f"count by ({V.LABEL_ENGINE}) ({V.EXPORTER_UP.name}{up_sel})",
                    "{{engine}} targets",
                    (V.EXPORTER_UP,),
                    True,
                    STAT,
                ),
            ),
            STAT,
            6,
            4,
        ),
        Row("Traffic"),
        Panel(
            "Requests/s by outcome",
            describe("Finished requests per second per engine, model and outcome", V.REQUESTS),
            UNIT_REQPS,
            (
                Query(
                    sum_rate(V.REQUESTS, (*EM, V.LABEL_OUTCOME)), _legend((*EM, V.LABEL_OUTCOME)), (V.REQUESTS,), True
                ),
            ),
            TIMESERIES,
            12,
            8,
        ),
        Panel(
            "Tokens/s in and out",
            describe("Prompt (in) and generated (out) tokens per second per engine and model", *tok),
            UNIT_TOKENS_PER_S,
            (
                Query(sum_rate(V.PROMPT_TOKENS), _legend(EM, "in"), (V.PROMPT_TOKENS,), True),
                Query(sum_rate(V.GENERATION_TOKENS), _legend(EM, "out"), (V.GENERATION_TOKENS,), True),
            ),
            TIMESERIES,
            12,
            8,
        ),
        Row("Latency"),
        Panel(
            "Time to first token p50/p90/p99",
            describe("TTFT percentiles per engine and model (histogram estimates)", V.TIME_TO_FIRST_TOKEN),
            UNIT_SECONDS,
            percentile_queries(V.TIME_TO_FIRST_TOKEN),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "Time per output token p50/p90/p99",
            describe("TPOT percentiles per engine and model (histogram estimates)", V.TIME_PER_OUTPUT_TOKEN),
            UNIT_SECONDS,
            percentile_queries(V.TIME_PER_OUTPUT_TOKEN),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "End-to-end latency p99",
            describe("P99 of the server-side request duration per engine and model", V.REQUEST_DURATION),
            UNIT_SECONDS,
            percentile_queries(V.REQUEST_DURATION, (0.99,)),
            TIMESERIES,
            8,
            8,
        ),
        Row("Saturation"),
        Panel(
            "Running and waiting requests",
            describe("Requests in the running batch and in the queue", V.REQUESTS_RUNNING, V.REQUESTS_WAITING),
            UNIT_REQUESTS,
            (
                Query(gauge(V.REQUESTS_RUNNING), _legend(EM, "running"), (V.REQUESTS_RUNNING,), True),
                Query(gauge(V.REQUESTS_WAITING), _legend(EM, "waiting"), (V.REQUESTS_WAITING,), True),
            ),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "KV cache usage",
            describe("Fullest KV cache per engine and model", V.KV_CACHE_USAGE),
            UNIT_RATIO,
            (Query(gauge(V.KV_CACHE_USAGE, "max"), _legend(EM), (V.KV_CACHE_USAGE,), True),),
            TIMESERIES,
            8,
            8,
            min=0,
            max=1,
        ),
        Panel(
            "Preemptions/s",
            describe("Sequences evicted from the running batch per second", V.PREEMPTIONS),
            UNIT_PER_S,
            (Query(sum_rate(V.PREEMPTIONS), _legend(EM), (V.PREEMPTIONS,), True),),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "Exporter targets up over time",
            describe("1 per target whose last scrape succeeded, 0 when it failed", V.EXPORTER_UP),
            UNIT_UP,
            (
                Query(
                    f"min by ({V.LABEL_ENGINE}, {V.LABEL_TARGET}) ({V.EXPORTER_UP.name}{up_sel})",
                    _legend((V.LABEL_ENGINE, V.LABEL_TARGET)),
                    (V.EXPORTER_UP,),
                    True,
                ),
            ),
            TIMESERIES,
            24,
            6,
            min=0,
            max=1,
        ),
    ]
    return DashboardSpec(
        UID_FLEET,
        "LLM Fleet Overview",
        f"Traffic, latency and saturation of every engine and model. {NOTE}",
        _prom_variables(),
        tuple(panels),
    )


# --- LLM SLOs --------------------------------------------------------------------------------
def _slo_panels(slo: SLO) -> list[Panel | Row]:
    sel = f'{{{V.SLO_LABEL}="{slo.name}"}}'
    by = tuple(slo.group_by)
    legend = _legend(by) or slo.name
    about = slo.description or slo.name
    lat = slo.indicator.latency
    if lat is not None:
        metric = V.metric_by_key(lat.metric)
        sli = f"share of requests with {metric.name} at most {V.format_le(lat.threshold_seconds)} s"
    else:
        sli = f"share of finished requests ({V.REQUESTS.name}) whose outcome is not {V.OUTCOME_ERROR}"
    objective = decimal_text(slo.objective_ratio)
    budget = decimal_text(slo.error_budget)
    on = f"on ({V.SLO_LABEL}) group_left ()"
    burn = tuple(
        Query(
            f"{V.slo_error_ratio(w)}{sel} / {on} {V.SLO_ERROR_BUDGET_RECORD}{sel}",
            f"{legend} {w}".strip(),
            (),
            False,
        )
        for w in alert_windows()
    )
    return [
        Row(f"SLO {slo.name}: {about}"),
        Panel(
            f"{slo.name}: current SLI",
            f"1 - {V.slo_error_ratio('5m')}: the {sli}, over the last 5 minutes. Objective {objective}.",
            UNIT_RATIO,
            (Query(f"1 - {V.slo_error_ratio('5m')}{sel}", legend, (), False, STAT),),
            STAT,
            5,
            5,
        ),
        Panel(
            f"{slo.name}: objective",
            f"The objective: {objective} of events good over {slo.period} (error budget {budget}).",
            UNIT_RATIO,
            (Query(f"{V.SLO_OBJECTIVE_RECORD}{sel}", slo.name, (), False, STAT),),
            STAT,
            4,
            5,
        ),
        Panel(
            f"{slo.name}: error budget remaining",
            f"Share of the {slo.period} error budget not yet consumed: 1 - error ratio over the period / budget "
            f"({V.SLO_BUDGET_REMAINING_RECORD}). Below 0 the SLO is breached.",
            UNIT_RATIO,
            (Query(f"{V.SLO_BUDGET_REMAINING_RECORD}{sel}", legend, (), False, STAT),),
            STAT,
            5,
            5,
        ),
        Panel(
            f"{slo.name}: firing burn alerts",
            f"{V.ALERT_SLO_BURN} alerts of this SLO now firing (page: 1h/5m, 6h/30m; ticket: 1d/2h, 3d/6h).",
            UNIT_COUNT,
            (
                Query(
                    f'count(ALERTS{{alertname="{V.ALERT_SLO_BURN}", alertstate="firing", {V.SLO_LABEL}="{slo.name}"}})'
                    " or vector(0)",
                    "firing",
                    (),
                    False,
                    STAT,
                ),
            ),
            STAT,
            4,
            5,
        ),
        Panel(
            f"{slo.name}: error budget remaining over time",
            f"{V.SLO_BUDGET_REMAINING_RECORD} of this SLO over the {slo.period} period.",
            UNIT_RATIO,
            (Query(f"{V.SLO_BUDGET_REMAINING_RECORD}{sel}", legend, (), False),),
            TIMESERIES,
            6,
            5,
        ),
        Panel(
            f"{slo.name}: burn rate per alert window",
            "Error ratio over each alert window divided by the error budget "
            f"({budget}): 1 consumes the budget exactly in {slo.period}; the alerts fire at 14.4 (1h/5m), "
            "6 (6h/30m), 3 (1d/2h) and 1 (3d/6h) for a 30-day period.",
            UNIT_BURN,
            burn,
            TIMESERIES,
            24,
            8,
        ),
    ]


def _slos(spec: SLOFile) -> DashboardSpec:
    firing = f'ALERTS{{alertname="{V.ALERT_SLO_BURN}", alertstate="firing"}}'
    labels = (V.SLO_LABEL, V.SEVERITY_LABEL, V.LONG_WINDOW_LABEL, V.SHORT_WINDOW_LABEL)
    panels: list[Panel | Row] = [
        Panel(
            "Firing burn-rate alerts",
            f"Every {V.ALERT_SLO_BURN} alert now firing, by SLO, severity and alert windows.",
            UNIT_COUNT,
            (Query(f"sum by ({_by(labels)}) ({firing})", _legend(labels), (), False, TABLE),),
            TABLE,
            24,
            6,
        )
    ]
    for slo in spec.slos:
        panels += _slo_panels(slo)
    return DashboardSpec(
        UID_SLOS,
        "LLM SLOs",
        f"Service level objectives of {spec.service}: SLI, error budget and burn rates. {NOTE}",
        (Variable(VAR_DATASOURCE, "Prometheus", "datasource", PROMETHEUS_TYPE, PROMETHEUS_UID, False, False),),
        tuple(panels),
        ("inferwatch", "llm", "slo"),
    )


# --- LLM Engine Detail -----------------------------------------------------------------------
def _ratio_panel(title: str, what: str, num: V.MetricSpec, den: V.MetricSpec) -> Panel:
    """A half-width 0–1 time series of ``rate(num) / rate(den)`` per engine and model."""
    return Panel(
        title,
        describe(what, num, den),
        UNIT_RATIO,
        (Query(f"{sum_rate(num)} / {sum_rate(den)}", _legend(EM), (num, den), True),),
        TIMESERIES,
        12,
        8,
        min=0,
        max=1,
    )


def _engine() -> DashboardSpec:
    phases = (
        ("Queue time", V.REQUEST_QUEUE),
        ("Prefill time", V.REQUEST_PREFILL),
        ("Decode time", V.REQUEST_DECODE),
    )
    info_by = (*EMI, *V.INFO_LABELS)
    panels: list[Panel | Row] = [Row("Request phases")]
    for title, metric in phases:
        panels.append(
            Panel(
                f"{title} p50/p90/p99",
                describe(f"{title} percentiles per engine and model", metric),
                UNIT_SECONDS,
                percentile_queries(metric),
                TIMESERIES,
                8,
                8,
            )
        )
    panels += [
        Panel(
            "TTFT vs inter-token latency",
            describe(
                "P50 and P99 of the time to first token beside those of the time between consecutive outputs",
                V.TIME_TO_FIRST_TOKEN,
                V.INTER_TOKEN_LATENCY,
            ),
            UNIT_SECONDS,
            (
                *percentile_queries(V.TIME_TO_FIRST_TOKEN, (0.5, 0.99), "TTFT"),
                *percentile_queries(V.INTER_TOKEN_LATENCY, (0.5, 0.99), "ITL"),
            ),
            TIMESERIES,
            12,
            8,
        ),
        Panel(
            "Batch size (running requests)",
            describe("Requests in the running batch per instance", V.REQUESTS_RUNNING),
            UNIT_REQUESTS,
            (Query(gauge(V.REQUESTS_RUNNING, by=EMI), _legend(EMI), (V.REQUESTS_RUNNING,), True),),
            TIMESERIES,
            12,
            8,
        ),
        Row("Caches and speculative decoding"),
        _ratio_panel(
            "Prefix-cache hit rate",
            "Prompt tokens found in the prefix cache over prompt tokens looked up",
            V.PREFIX_CACHE_HIT_TOKENS,
            V.PREFIX_CACHE_QUERIED_TOKENS,
        ),
        _ratio_panel(
            "Speculative-decoding acceptance rate",
            "Draft tokens accepted by the target model over draft tokens proposed",
            V.SPEC_DECODE_ACCEPTED_TOKENS,
            V.SPEC_DECODE_DRAFT_TOKENS,
        ),
        Row("Engine"),
        Panel(
            "Engine info",
            describe("Version and configuration facts of every selected engine instance", V.ENGINE_INFO),
            UNIT_NONE,
            (Query(gauge(V.ENGINE_INFO, "max", info_by), _legend(EMI), (V.ENGINE_INFO,), True, TABLE),),
            TABLE,
            24,
            6,
        ),
        Row("Request lengths"),
    ]
    for title, metric in (
        ("Prompt length distribution", V.REQUEST_PROMPT_TOKENS),
        ("Generation length distribution", V.REQUEST_GENERATION_TOKENS),
    ):
        panels.append(
            Panel(
                title,
                describe(f"{title.split()[0]} tokens per finished request: requests per second in each bucket", metric),
                UNIT_TOKENS,
                (Query(f"sum by (le) ({rate(metric, '_bucket')})", "{{le}}", (metric,), False, HEATMAP),),
                HEATMAP,
                12,
                8,
            )
        )
    return DashboardSpec(
        UID_ENGINE,
        "LLM Engine Detail",
        f"Phases, caches, configuration and request lengths of one engine. {NOTE}",
        _prom_variables(),
        tuple(panels),
    )


# --- LLM KV Cache & Scheduling --------------------------------------------------------------------
TIME_TO_EXHAUSTION_CAP_SECONDS = 86400
DERIV_WINDOW = "10m"


def operating_notes() -> str:
    """Markdown of the operating-notes text panel."""
    lines = [
        "### Operating notes",
        "",
        "| symptom | likely cause | remedy |",
        "|---|---|---|",
        *(f"| {s} | {c} | {r} |" for s, c, r in knowledge.SYMPTOM_TABLE),
        "",
        f"**KV-cache size** (bytes) = {knowledge.KV_CACHE_FORMULA}.",
        "",
        "Example: 32 layers, 8 KV heads, head dim 128, 8192 tokens, batch 16, fp16 (2 bytes): "
        "2 × 32 × 8 × 128 × 8192 × 16 × 2 = 16 GiB.",
    ]
    return "\n".join(lines)


def _kv() -> DashboardSpec:
    usage = gauge(V.KV_CACHE_USAGE, "max", EMI)
    deriv = f"max by ({_by(EMI)}) (deriv({V.KV_CACHE_USAGE.name}{selector()}[{DERIV_WINDOW}]))"
    exhaustion = f"clamp((1 - {usage}) / clamp_min({deriv}, 1e-9), 0, {TIME_TO_EXHAUSTION_CAP_SECONDS})"
    panels: list[Panel | Row] = [
        Row("KV cache"),
        Panel(
            "KV cache usage",
            describe("Fullest KV cache per instance", V.KV_CACHE_USAGE),
            UNIT_RATIO,
            (Query(usage, _legend(EMI), (V.KV_CACHE_USAGE,), True),),
            TIMESERIES,
            8,
            8,
            min=0,
            max=1,
        ),
        Panel(
            "KV cache used vs capacity (tokens)",
            describe(
                "KV cache capacity and the tokens in use (usage × capacity)", V.KV_CACHE_CAPACITY, V.KV_CACHE_USAGE
            ),
            UNIT_TOKENS,
            (
                Query(gauge(V.KV_CACHE_CAPACITY, "max", EMI), _legend(EMI, "capacity"), (V.KV_CACHE_CAPACITY,), True),
                Query(
                    f"{usage} * {gauge(V.KV_CACHE_CAPACITY, 'max', EMI)}",
                    _legend(EMI, "used"),
                    (V.KV_CACHE_USAGE, V.KV_CACHE_CAPACITY),
                    True,
                ),
            ),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "Predicted time to KV exhaustion",
            describe(
                f"(1 - usage) / growth of the usage over {DERIV_WINDOW} (deriv), capped at one day: "
                "a steady or shrinking usage shows as one day",
                V.KV_CACHE_USAGE,
            ),
            UNIT_SECONDS,
            (Query(exhaustion, _legend(EMI), (V.KV_CACHE_USAGE,), True),),
            TIMESERIES,
            8,
            8,
        ),
        Row("Scheduling"),
        Panel(
            "Preemptions/s",
            describe("Sequences evicted from the batch per second: the KV cache is too small", V.PREEMPTIONS),
            UNIT_PER_S,
            (Query(sum_rate(V.PREEMPTIONS, EMI), _legend(EMI), (V.PREEMPTIONS,), True),),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "Waiting vs running",
            describe(
                "A growing queue beside a flat running batch means arrivals exceed capacity",
                V.REQUESTS_WAITING,
                V.REQUESTS_RUNNING,
            ),
            UNIT_REQUESTS,
            (
                Query(gauge(V.REQUESTS_WAITING, by=EMI), _legend(EMI, "waiting"), (V.REQUESTS_WAITING,), True),
                Query(gauge(V.REQUESTS_RUNNING, by=EMI), _legend(EMI, "running"), (V.REQUESTS_RUNNING,), True),
            ),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "Queue time p99",
            describe("P99 of the time requests wait before their first scheduling", V.REQUEST_QUEUE),
            UNIT_SECONDS,
            percentile_queries(V.REQUEST_QUEUE, (0.99,)),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "Operating notes",
            "Symptom, likely cause and remedy, and the KV-cache sizing formula.",
            UNIT_NONE,
            (),
            TEXT,
            24,
            9,
            content=operating_notes(),
        ),
    ]
    return DashboardSpec(
        UID_KV_CACHE,
        "LLM KV Cache & Scheduling",
        f"KV-cache pressure, preemptions and the queue. {NOTE}",
        _prom_variables(),
        tuple(panels),
    )


# --- LLM Requests (SQL) -------------------------------------------------------------------------
SLOWEST_LIMIT = 50


def sql_filter() -> str:
    """Time range and the engine/model variables (anchored regexes like Prometheus')."""
    return (
        "$__timeFilter(start_time)"
        f" AND engine ~ '^(${{{VAR_ENGINE}:regex}})$'"
        f" AND coalesce(model, '') ~ '^(${{{VAR_MODEL}:regex}})$'"
    )


def slowest_sql() -> str:
    cols = (
        'start_time AS "time"',
        "engine",
        "model",
        "instance",
        "request_id",
        E2E,
        TTFT,
        QUEUE,
        PREFILL,
        DECODE,
        TPOT,
        PROMPT_TOKENS,
        GENERATION_TOKENS,
        "finish_reason",
        "trace_id",
    )
    return (
        "SELECT " + ", ".join(cols) + f"\nFROM {TABLE_NAME}\nWHERE {sql_filter()}\n"
        f"ORDER BY {E2E} DESC NULLS LAST\nLIMIT {SLOWEST_LIMIT}"
    )


def exact_p99_sql() -> str:
    return (
        f"SELECT engine, model, percentile_disc(0.99) WITHIN GROUP (ORDER BY {TTFT}) AS p99_{TTFT}, "
        f"count(*) AS requests\nFROM {TABLE_NAME}\nWHERE {sql_filter()} AND {TTFT} IS NOT NULL\n"
        "GROUP BY engine, model\nORDER BY engine, model"
    )


def exact_p99_series_sql() -> str:
    return (
        "SELECT $__timeGroupAlias(start_time, $__interval), engine || ' ' || coalesce(model, '') AS metric, "
        f"percentile_disc(0.99) WITHIN GROUP (ORDER BY {TTFT}) AS p99\nFROM {TABLE_NAME}\n"
        f"WHERE {sql_filter()} AND {TTFT} IS NOT NULL\nGROUP BY 1, 2\nORDER BY 1"
    )


def _requests() -> DashboardSpec:
    latency_units = tuple((c, UNIT_SECONDS) for c in (E2E, TTFT, QUEUE, PREFILL, DECODE, TPOT, f"p99_{TTFT}"))
    panels: list[Panel | Row] = [
        Row("Slowest requests"),
        Panel(
            "Slowest requests",
            f"The {SLOWEST_LIMIT} slowest requests in the time range (by end-to-end duration) from the collector's "
            f"{TABLE_NAME} table, with their queue, prefill and decode breakdown.",
            UNIT_NONE,
            (),
            TABLE,
            24,
            10,
            sql=(SqlQuery(slowest_sql()),),
            column_units=latency_units,
        ),
        Row("Exact vs estimated P99 TTFT"),
        Panel(
            "P99 TTFT exact (from rows)",
            "P99 time to first token over the time range computed from the stored requests with percentile_disc: "
            "exact, unlike the histogram estimate beside it.",
            UNIT_SECONDS,
            (),
            TABLE,
            12,
            6,
            sql=(SqlQuery(exact_p99_sql()),),
            column_units=latency_units,
        ),
        Panel(
            "P99 TTFT estimated (histogram)",
            describe(
                "P99 time to first token over the time range estimated by histogram_quantile: linear interpolation "
                "inside a bucket, so it may differ from the exact value by up to the bucket's width",
                V.TIME_TO_FIRST_TOKEN,
            ),
            UNIT_SECONDS,
            (
                Query(
                    quantile(V.TIME_TO_FIRST_TOKEN, 0.99, window=RANGE),
                    _legend(EM),
                    (V.TIME_TO_FIRST_TOKEN,),
                    True,
                    TABLE,
                ),
            ),
            TABLE,
            12,
            6,
        ),
        Panel(
            "P99 TTFT exact over time",
            "P99 time to first token per time interval from the stored requests (percentile_disc).",
            UNIT_SECONDS,
            (),
            TIMESERIES,
            12,
            8,
            sql=(SqlQuery(exact_p99_series_sql(), "time_series"),),
        ),
        Panel(
            "P99 TTFT estimated over time",
            describe("histogram_quantile(0.99) of the time to first token per engine and model", V.TIME_TO_FIRST_TOKEN),
            UNIT_SECONDS,
            percentile_queries(V.TIME_TO_FIRST_TOKEN, (0.99,)),
            TIMESERIES,
            12,
            8,
        ),
    ]
    variables = (
        *_prom_variables(),
        Variable(VAR_SQL_DATASOURCE, "PostgreSQL", "datasource", POSTGRES_TYPE, POSTGRES_UID, False, False),
    )
    return DashboardSpec(
        UID_REQUESTS,
        "LLM Requests",
        f"Individual requests stored by the collector (PostgreSQL) beside the metrics. {NOTE}",
        variables,
        tuple(panels),
    )


def dashboards(spec: SLOFile | None, vocabulary: V.Vocabulary) -> list[DashboardSpec]:
    """The inferwatch dashboards; the SLO dashboard only with an SLO file."""
    del vocabulary  # percentiles read whatever buckets the layout has; kept for a uniform signature
    out = [_fleet()]
    if spec is not None:
        out.append(_slos(spec))
    out += [_engine(), _kv(), _requests()]
    return out


def all_queries(spec: SLOFile | None, vocabulary: V.Vocabulary) -> list[tuple[str, str, Query]]:
    """(dashboard uid, panel title, query) of every Prometheus query of every dashboard."""
    return [(d.uid, p.title, q) for d in dashboards(spec, vocabulary) for p in d.all_panels() for q in p.queries]


__all__ = [
    "DashboardSpec",
    "Panel",
    "Placed",
    "Query",
    "Row",
    "SqlQuery",
    "Variable",
    "all_queries",
    "dashboards",
    "layout",
]
