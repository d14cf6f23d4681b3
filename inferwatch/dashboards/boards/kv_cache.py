"""LLM KV Cache & Scheduling: KV-cache pressure, preemptions, the queue and the operating notes."""

from __future__ import annotations

from inferwatch.core import knowledge, links
from inferwatch.core import vocabulary as V
from inferwatch.dashboards.panels import (
    NOTE,
    TEXT,
    TIMESERIES,
    UNIT_NONE,
    UNIT_PER_S,
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
    EMIR,
    describe,
    gauge,
    label_list,
    legend_format,
    percentile_queries,
    prom_variables,
    selector,
    sum_rate,
)

UID = links.UID_KV_CACHE
"""stable: Grafana upserts provisioned dashboards by uid."""


TIME_TO_EXHAUSTION_CAP_SECONDS = 86400
DERIV_WINDOW = "10m"


def operating_notes() -> str:
    """Markdown of the operating-notes text panel."""
    lines = [
        "### Operating notes",
        "",
        "| symptom | likely cause | remedy |",
        "|---|---|---|",
        *(f"| {s} | {c} | {r} |" for s, c, r in knowledge.symptom_table()),
        "",
        f"**KV-cache size** (bytes) = {knowledge.KV_CACHE_FORMULA}.",
        "",
        "Example: 32 layers, 8 KV heads, head dim 128, 8192 tokens, batch 16, fp16 (2 bytes): "
        "2 × 32 × 8 × 128 × 8192 × 16 × 2 = 16 GiB.",
    ]
    return "\n".join(lines)


def board() -> DashboardSpec:
    """KV-cache usage and exhaustion, scheduling pressure and the operating notes."""
    usage = gauge(V.KV_CACHE_USAGE, "max", EMIR)
    capacity = gauge(V.KV_CACHE_CAPACITY, "max", EMIR)
    deriv = f"max by ({label_list(EMIR)}) (deriv({V.KV_CACHE_USAGE.name}{selector()}[{DERIV_WINDOW}]))"
    exhaustion = f"clamp((1 - {usage}) / clamp_min({deriv}, 1e-9), 0, {TIME_TO_EXHAUSTION_CAP_SECONDS})"
    panels: list[Panel | Row] = [
        Row("KV cache"),
        Panel(
            "KV cache usage",
            describe("Fullest KV cache per instance (and data-parallel rank)", V.KV_CACHE_USAGE),
            UNIT_RATIO,
            (Query(usage, legend_format(EMIR), (V.KV_CACHE_USAGE,), True),),
            TIMESERIES,
            12,
            8,
            min=0,
            max=1,
        ),
        Panel(
            "KV cache usage across instances (min/mean/max)",
            describe(
                "Per engine and model, the emptiest, average and fullest KV cache of its instances (and "
                "data-parallel ranks): a max far above the mean means uneven load, not too little memory",
                V.KV_CACHE_USAGE,
            ),
            UNIT_RATIO,
            tuple(
                Query(gauge(V.KV_CACHE_USAGE, agg), legend_format(EM, name), (V.KV_CACHE_USAGE,), True)
                for agg, name in (("min", "min"), ("avg", "mean"), ("max", "max"))
            ),
            TIMESERIES,
            12,
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
                Query(capacity, legend_format(EMIR, "capacity"), (V.KV_CACHE_CAPACITY,), True),
                Query(
                    f"{usage} * {capacity}",
                    legend_format(EMIR, "used"),
                    (V.KV_CACHE_USAGE, V.KV_CACHE_CAPACITY),
                    True,
                ),
            ),
            TIMESERIES,
            12,
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
            (Query(exhaustion, legend_format(EMIR), (V.KV_CACHE_USAGE,), True),),
            TIMESERIES,
            12,
            8,
        ),
        Row("Scheduling"),
        Panel(
            "Preemptions/s",
            describe("Sequences evicted from the batch per second: the KV cache is too small", V.PREEMPTIONS),
            UNIT_PER_S,
            (Query(sum_rate(V.PREEMPTIONS, EMIR), legend_format(EMIR), (V.PREEMPTIONS,), True),),
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
                Query(gauge(V.REQUESTS_WAITING, by=EMIR), legend_format(EMIR, "waiting"), (V.REQUESTS_WAITING,), True),
                Query(gauge(V.REQUESTS_RUNNING, by=EMIR), legend_format(EMIR, "running"), (V.REQUESTS_RUNNING,), True),
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
        UID,
        links.DASHBOARD_TITLES[UID],
        f"KV-cache pressure, preemptions and the queue. {NOTE}",
        prom_variables(),
        tuple(panels),
    )
