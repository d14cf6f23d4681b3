"""LLM Engine Detail: request phases, caches, speculative decoding, configuration and request lengths."""

from __future__ import annotations

from inferwatch.core import links
from inferwatch.core import vocabulary as V
from inferwatch.dashboards.model import (
    HEATMAP,
    NOTE,
    TABLE,
    TIMESERIES,
    UNIT_NONE,
    UNIT_RATIO,
    UNIT_REQUESTS,
    UNIT_SECONDS,
    UNIT_TOKENS,
    DashboardSpec,
    Panel,
    Query,
    Row,
)
from inferwatch.dashboards.promql import (
    EM,
    EMI,
    describe,
    gauge,
    legend_format,
    percentile_queries,
    prom_variables,
    rate,
    sum_rate,
)

UID = links.UID_ENGINE
"""stable: Grafana upserts provisioned dashboards by uid."""


def _ratio_panel(title: str, what: str, num: V.MetricSpec, den: V.MetricSpec) -> Panel:
    """A half-width 0–1 time series of ``rate(num) / rate(den)`` per engine and model."""
    return Panel(
        title,
        describe(what, num, den),
        UNIT_RATIO,
        (Query(f"{sum_rate(num)} / {sum_rate(den)}", legend_format(EM), (num, den), True),),
        TIMESERIES,
        12,
        8,
        min=0,
        max=1,
    )


def board() -> DashboardSpec:
    """One engine in detail: request phases, caches, engine info and request lengths."""
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
            (Query(gauge(V.REQUESTS_RUNNING, by=EMI), legend_format(EMI), (V.REQUESTS_RUNNING,), True),),
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
            (Query(gauge(V.ENGINE_INFO, "max", info_by), legend_format(EMI), (V.ENGINE_INFO,), True, TABLE),),
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
        UID,
        links.DASHBOARD_TITLES[UID],
        f"Phases, caches, configuration and request lengths of one engine. {NOTE}",
        prom_variables(),
        tuple(panels),
    )
