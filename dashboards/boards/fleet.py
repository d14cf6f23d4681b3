"""LLM Fleet Overview: traffic, latency and saturation of every engine and model."""

from __future__ import annotations

from inferwatch.core import links
from inferwatch.core import vocabulary as V
from inferwatch.dashboards.model import (
    NOTE,
    STAT,
    TIMESERIES,
    UNIT_COUNT,
    UNIT_PER_S,
    UNIT_RATIO,
    UNIT_REQPS,
    UNIT_REQUESTS,
    UNIT_SECONDS,
    UNIT_TOKENS_PER_S,
    UNIT_UP,
    DashboardSpec,
    Panel,
    Query,
    Row,
)
from inferwatch.dashboards.promql import (
    EM,
    describe,
    gauge,
    legend_format,
    percentile_queries,
    prom_variables,
    rate,
    selector,
    sum_rate,
)

UID = links.UID_FLEET
"""stable: Grafana upserts provisioned dashboards by uid."""


def board() -> DashboardSpec:
    """The fleet overview: one row each of totals, traffic, latency and saturation."""
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
                    sum_rate(V.REQUESTS, (*EM, V.LABEL_OUTCOME)),
                    legend_format((*EM, V.LABEL_OUTCOME)),
                    (V.REQUESTS,),
                    True,
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
                Query(sum_rate(V.PROMPT_TOKENS), legend_format(EM, "in"), (V.PROMPT_TOKENS,), True),
                Query(sum_rate(V.GENERATION_TOKENS), legend_format(EM, "out"), (V.GENERATION_TOKENS,), True),
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
