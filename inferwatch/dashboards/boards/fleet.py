"""LLM Fleet Overview: traffic, latency, instances and saturation of every engine and model."""

from __future__ import annotations

from inferwatch.core import links
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import HeadroomRules
from inferwatch.dashboards import headroom_row
from inferwatch.dashboards.panels import (
    NOTE,
    STAT,
    TABLE,
    TIMESERIES,
    UNIT_COUNT,
    UNIT_PER_S,
    UNIT_RATIO,
    UNIT_REQPS,
    UNIT_REQUESTS,
    UNIT_SECONDS,
    UNIT_TOKENS,
    UNIT_TOKENS_PER_S,
    UNIT_UP,
    DashboardSpec,
    Panel,
    Query,
    Row,
)
from inferwatch.dashboards.promql import (
    EM,
    EMI,
    INSTANCE_LABEL,
    QUANTILES,
    QUANTILES_TITLE,
    RANGE,
    SIGNAL_LABEL,
    describe,
    distribution_queries,
    gauge,
    instance_count,
    label_list,
    legend_format,
    mean,
    positive,
    prom_variables,
    quantile,
    rate,
    selector,
    share,
    sum_increase,
    sum_rate,
    tagged,
)

UID = links.UID_FLEET
"""stable: Grafana upserts provisioned dashboards by uid."""

SUMMARY_QUANTILES = (0.5, 0.99)
INSTANCE_QUANTILE = 0.95
RANGE_LATENCY = (
    ("TTFT", V.TIME_TO_FIRST_TOKEN),
    ("ITL", V.INTER_TOKEN_LATENCY),
    ("TPOT", V.TIME_PER_OUTPUT_TOKEN),
    ("E2E", V.REQUEST_DURATION),
)
"""the histograms of the latency-over-the-time-range table, by their short name (its ``signal`` column)."""


def error_ratio(window_sum: str, errors: str) -> str:
    """Errors over all finished requests per group; 0 where a group had no error."""
    return f"({errors} or 0 * {window_sum}) / {positive(window_sum)}"


def _table(title: str, what: str, queries: list[Query], units: dict[str, str], height: int = 7) -> Panel:
    """A full-width table of instant queries, one column per query named by its legend."""
    metrics = tuple(dict.fromkeys(m for q in queries for m in q.metrics))
    return Panel(
        title,
        describe(what, *metrics),
        UNIT_COUNT,
        tuple(queries),
        TABLE,
        24,
        height,
        column_units=tuple((q.legend, units[q.legend]) for q in queries if q.legend in units),
    )


def model_summary() -> Panel:
    """One row per engine and model over the selected time range (instant queries over ``$__range``)."""
    requests = sum_increase(V.REQUESTS)
    queries = [
        Query(instance_count(V.REQUESTS_RUNNING, window=RANGE), "Instances", (V.REQUESTS_RUNNING,), True, TABLE),
        Query(f"round({requests})", "Requests", (V.REQUESTS,), True, TABLE),
        Query(
            error_ratio(requests, sum_increase(V.REQUESTS, outcome=V.OUTCOME_ERROR)),
            "Error ratio",
            (V.REQUESTS,),
            True,
            TABLE,
        ),
    ]
    for name, metric in (("TTFT", V.TIME_TO_FIRST_TOKEN), ("TPOT", V.TIME_PER_OUTPUT_TOKEN)):
        queries += [
            Query(quantile(metric, q, window=RANGE), f"{name} p{round(q * 100)}", (metric,), True, TABLE)
            for q in SUMMARY_QUANTILES
        ]
    queries += [
        Query(f"round({sum_increase(V.PROMPT_TOKENS)})", "Tokens in", (V.PROMPT_TOKENS,), True, TABLE),
        Query(f"round({sum_increase(V.GENERATION_TOKENS)})", "Tokens out", (V.GENERATION_TOKENS,), True, TABLE),
        Query(
            f"max by ({label_list(EM)}) (max_over_time({V.KV_CACHE_USAGE.name}{selector()}[{RANGE}]))",
            "Peak KV cache",
            (V.KV_CACHE_USAGE,),
            True,
            TABLE,
        ),
        Query(f"round({sum_increase(V.PREEMPTIONS)})", "Preemptions", (V.PREEMPTIONS,), True, TABLE),
    ]
    units = {"Error ratio": UNIT_RATIO, "Tokens in": UNIT_TOKENS, "Tokens out": UNIT_TOKENS}
    units |= {"Peak KV cache": UNIT_RATIO, **{q.legend: UNIT_SECONDS for q in queries[3:7]}}
    return _table(
        "Per-model summary (selected time range)",
        "Each engine and model over the whole time range: instances seen, finished requests and the share "
        "that failed, P50/P99 time to first token and time per output token (histogram estimates), prompt "
        "and generated tokens, the fullest KV cache and the preemptions",
        queries,
        units,
    )


def latency_over_range() -> Panel:
    """One row per engine, model and latency histogram: percentiles and mean over the selected time range."""
    metrics = tuple(metric for _, metric in RANGE_LATENCY)
    queries = [
        Query(
            " or ".join(tagged(quantile(metric, q, window=RANGE), name) for name, metric in RANGE_LATENCY),
            f"p{round(q * 100)}",
            metrics,
            True,
            TABLE,
            any_of=True,
        )
        for q in QUANTILES
    ]
    queries.append(
        Query(
            " or ".join(tagged(mean(metric, window=RANGE), name) for name, metric in RANGE_LATENCY),
            "mean",
            metrics,
            True,
            TABLE,
            any_of=True,
        )
    )
    return _table(
        "Latency over the time range",
        f"Per engine and model, one row per latency ({SIGNAL_LABEL}: "
        f"{', '.join(name for name, _ in RANGE_LATENCY)}): percentiles (histogram estimates) and the exact "
        "mean over the whole time range",
        queries,
        {q.legend: UNIT_SECONDS for q in queries},
    )


def instance_summary() -> Panel:
    """One row per instance: its load now and its traffic and latency over the time range."""
    queries = [
        Query(gauge(V.REQUESTS_RUNNING, by=EMI), "Running", (V.REQUESTS_RUNNING,), True, TABLE),
        Query(gauge(V.REQUESTS_WAITING, by=EMI), "Waiting", (V.REQUESTS_WAITING,), True, TABLE),
        Query(gauge(V.KV_CACHE_USAGE, "max", EMI), "KV cache", (V.KV_CACHE_USAGE,), True, TABLE),
        Query(f"round({sum_increase(V.REQUESTS, EMI)})", "Requests", (V.REQUESTS,), True, TABLE),
        Query(f"round({sum_increase(V.GENERATION_TOKENS, EMI)})", "Tokens out", (V.GENERATION_TOKENS,), True, TABLE),
        *(
            Query(
                quantile(metric, INSTANCE_QUANTILE, EMI, RANGE),
                f"{name} p{round(INSTANCE_QUANTILE * 100)}",
                (metric,),
                True,
                TABLE,
            )
            for name, metric in (("TTFT", V.TIME_TO_FIRST_TOKEN), ("ITL", V.INTER_TOKEN_LATENCY))
        ),
        Query(f"round({sum_increase(V.PREEMPTIONS, EMI)})", "Preemptions", (V.PREEMPTIONS,), True, TABLE),
    ]
    units = {"KV cache": UNIT_RATIO, "Tokens out": UNIT_TOKENS, "TTFT p95": UNIT_SECONDS, "ITL p95": UNIT_SECONDS}
    return _table(
        "Per-instance summary (selected time range)",
        "Each instance: running and waiting requests and the fullest KV cache now; finished requests, "
        "generated tokens, P95 time to first token and inter-token latency, and preemptions over the time range",
        queries,
        units,
    )


def board(rules: HeadroomRules) -> DashboardSpec:
    """The fleet overview: totals, the per-model summary, traffic, latency, instances, saturation and the
    headroom (its thresholds from ``rules``, the SLO file's or the defaults)."""
    up_sel = selector(model=False)
    tok = (V.PROMPT_TOKENS, V.GENERATION_TOKENS)
    rank = (V.LABEL_DP_RANK,)
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
        Row("Models"),
        model_summary(),
        latency_over_range(),
        Row("Traffic"),
        Panel(
            "Requests/s by outcome",
            describe("Finished requests per second per engine, model and outcome", V.REQUESTS),
            UNIT_REQPS,
            (
                Query(
                    sum_rate(V.REQUESTS, (*EM, V.LABEL_OUTCOME)),
                    legend_format((*EM, V.LABEL_OUTCOME)),
                    (V.REQUESTS,),
                    True,
                ),
            ),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "Finish-reason share",
            describe(
                f"Share of finished requests per outcome, per engine and model: a rising "
                f"{V.OUTCOME_LENGTH} share means outputs are cut off by max_tokens or the context window",
                V.REQUESTS,
            ),
            UNIT_RATIO,
            (
                Query(
                    share(
                        sum_rate(V.REQUESTS, (*EM, V.LABEL_OUTCOME)),
                        sum_rate(V.REQUESTS),
                        (V.LABEL_OUTCOME,),
                    ),
                    legend_format((*EM, V.LABEL_OUTCOME)),
                    (V.REQUESTS,),
                    True,
                ),
            ),
            TIMESERIES,
            8,
            8,
            min=0,
            max=1,
        ),
        Panel(
            "Tokens/s in and out",
            describe("Prompt (in) and generated (out) tokens per second per engine and model", *tok),
            UNIT_TOKENS_PER_S,
            (
                Query(sum_rate(V.PROMPT_TOKENS), legend_format(EM, "in"), (V.PROMPT_TOKENS,), True),
                Query(sum_rate(V.GENERATION_TOKENS), legend_format(EM, "out"), (V.GENERATION_TOKENS,), True),
            ),
            TIMESERIES,
            8,
            8,
        ),
        Row("Latency"),
        *(
            Panel(
                f"{title} {QUANTILES_TITLE}",
                describe(f"{what} per engine and model: percentiles (histogram estimates) and the exact mean", metric),
                UNIT_SECONDS,
                distribution_queries(metric),
                TIMESERIES,
                12,
                8,
            )
            for title, what, metric in (
                ("Time to first token", "Time to first token", V.TIME_TO_FIRST_TOKEN),
                ("Inter-token latency", "Time between consecutive outputs", V.INTER_TOKEN_LATENCY),
                ("Time per output token", "Decode time per output token", V.TIME_PER_OUTPUT_TOKEN),
                ("End-to-end latency", "Server-side request duration", V.REQUEST_DURATION),
            )
        ),
        Row("Instances"),
        Panel(
            "Instance count",
            describe(
                "Instances reporting per engine and model, and their engine cores (one per instance, or one per "
                "data-parallel rank)",
                V.REQUESTS_RUNNING,
            ),
            UNIT_COUNT,
            (
                Query(
                    instance_count(V.REQUESTS_RUNNING),
                    legend_format(EM, "instances"),
                    (V.REQUESTS_RUNNING,),
                    True,
                    STAT,
                ),
                Query(
                    gauge(V.REQUESTS_RUNNING, "count"),
                    legend_format(EM, "engine cores"),
                    (V.REQUESTS_RUNNING,),
                    True,
                    STAT,
                ),
            ),
            STAT,
            6,
            8,
        ),
        Panel(
            "Request share by instance",
            describe(
                "Each instance's share of its engine and model's finished requests: uneven shares point at "
                "the load balancer",
                V.REQUESTS,
            ),
            UNIT_RATIO,
            (
                Query(
                    share(sum_rate(V.REQUESTS, EMI), sum_rate(V.REQUESTS), (INSTANCE_LABEL,)),
                    legend_format(EMI),
                    (V.REQUESTS,),
                    True,
                ),
            ),
            TIMESERIES,
            9,
            8,
            min=0,
            max=1,
        ),
        Panel(
            "Data-parallel rank imbalance",
            describe(
                f"Per instance, the busiest data-parallel rank ({V.LABEL_DP_RANK}) minus the idlest: running "
                "requests and queued requests. 0 is balanced; a lasting gap means one rank gets the long "
                "requests",
                V.REQUESTS_RUNNING,
                V.REQUESTS_WAITING,
            ),
            UNIT_REQUESTS,
            tuple(
                Query(
                    f"{gauge(metric, 'max', EMI, rank)} - {gauge(metric, 'min', EMI, rank)}",
                    legend_format(EMI, what),
                    (metric,),
                    True,
                    labels=rank,
                )
                for what, metric in (("running", V.REQUESTS_RUNNING), ("waiting", V.REQUESTS_WAITING))
            ),
            TIMESERIES,
            9,
            8,
        ),
        instance_summary(),
        Row("Saturation"),
        Panel(
            "Running and waiting requests",
            describe("Requests in the running batch and in the queue", V.REQUESTS_RUNNING, V.REQUESTS_WAITING),
            UNIT_REQUESTS,
            (
                Query(gauge(V.REQUESTS_RUNNING), legend_format(EM, "running"), (V.REQUESTS_RUNNING,), True),
                Query(gauge(V.REQUESTS_WAITING), legend_format(EM, "waiting"), (V.REQUESTS_WAITING,), True),
            ),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "KV cache usage",
            describe("Fullest KV cache per engine and model", V.KV_CACHE_USAGE),
            UNIT_RATIO,
            (Query(gauge(V.KV_CACHE_USAGE, "max"), legend_format(EM), (V.KV_CACHE_USAGE,), True),),
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
            (Query(sum_rate(V.PREEMPTIONS), legend_format(EM), (V.PREEMPTIONS,), True),),
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
                    legend_format((V.LABEL_ENGINE, V.LABEL_TARGET)),
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
    per_model = selector(engine=False, instance=False)
    panels += headroom_row.row(rules, headroom_row.Selectors(selector(), selector(), per_model, per_model))
    return DashboardSpec(
        UID,
        links.DASHBOARD_TITLES[UID],
        f"Traffic, latency, instances, saturation and headroom of every engine and model. {NOTE}",
        prom_variables(),
        tuple(panels),
    )
