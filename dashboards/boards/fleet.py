"""LLM Fleet Overview: traffic, latency, instances and saturation of every engine and model."""

from __future__ import annotations

from inferwatch.core import links
from inferwatch.core import vocabulary as V
from inferwatch.dashboards.model import (
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
    RANGE,
    describe,
    gauge,
    instance_count,
    legend_format,
    mean,
    percentile_queries,
    positive,
    prom_variables,
    quantile,
    rate,
    selector,
    share,
    sum_increase,
    sum_rate,
)

UID = links.UID_FLEET
"""stable: Grafana upserts provisioned dashboards by uid."""

E2E_QUANTILES = (0.5, 0.9, 0.95, 0.99)
SUMMARY_QUANTILES = (0.5, 0.99)


def error_ratio(window_sum: str, errors: str) -> str:
    """Errors over all finished requests per engine and model; 0 where a model had no error."""
    return f"({errors} or 0 * {window_sum}) / {positive(window_sum)}"


def model_summary() -> Panel:
    """One row per engine and model over the selected time range (instant queries over ``$__range``)."""
    requests = sum_increase(V.REQUESTS)
    queries = [
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
    ]
    latency = tuple(q.legend for q in queries if q.metrics[0].unit == "seconds")
    return Panel(
        "Per-model summary (selected time range)",
        describe(
            "Each engine and model over the whole time range: finished requests, the share that failed, "
            "P50/P99 time to first token and time per output token (histogram estimates), prompt and "
            "generated tokens",
            V.REQUESTS,
            V.TIME_TO_FIRST_TOKEN,
            V.TIME_PER_OUTPUT_TOKEN,
            V.PROMPT_TOKENS,
            V.GENERATION_TOKENS,
        ),
        UNIT_COUNT,
        tuple(queries),
        TABLE,
        24,
        7,
        column_units=(
            ("Requests", UNIT_COUNT),
            ("Error ratio", UNIT_RATIO),
            *((name, UNIT_SECONDS) for name in latency),
            ("Tokens in", UNIT_TOKENS),
            ("Tokens out", UNIT_TOKENS),
        ),
    )


def board() -> DashboardSpec:
    """The fleet overview: totals, the per-model summary, traffic, latency, instances and saturation."""
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
            "End-to-end latency p50/p90/p95/p99 and mean",
            describe(
                "Percentiles (histogram estimates) and the exact mean of the server-side request duration per "
                "engine and model",
                V.REQUEST_DURATION,
            ),
            UNIT_SECONDS,
            (
                *percentile_queries(V.REQUEST_DURATION, E2E_QUANTILES),
                Query(mean(V.REQUEST_DURATION), legend_format(EM, "mean"), (V.REQUEST_DURATION,), True),
            ),
            TIMESERIES,
            8,
            8,
        ),
        Row("Instances"),
        Panel(
            "Instance count",
            describe("Instances reporting per engine and model", V.REQUESTS_RUNNING),
            UNIT_COUNT,
            (
                Query(
                    instance_count(V.REQUESTS_RUNNING),
                    legend_format(EM),
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
    return DashboardSpec(
        UID,
        links.DASHBOARD_TITLES[UID],
        f"Traffic, latency and saturation of every engine and model. {NOTE}",
        prom_variables(),
        tuple(panels),
    )
