"""LLM Engine Detail: request phases, latency distributions, batching, caches, speculative decoding,
configuration and request lengths."""

from __future__ import annotations

from inferwatch.core import links
from inferwatch.core import vocabulary as V
from inferwatch.dashboards.boards.engine_caches import SPEC_DECODE_IDLE, cache_panels, ratio
from inferwatch.dashboards.panels import (
    HEATMAP,
    NOTE,
    TABLE,
    TIMESERIES,
    UNIT_COUNT,
    UNIT_NONE,
    UNIT_RATIO,
    UNIT_REQPS,
    UNIT_REQUESTS,
    UNIT_SECONDS,
    UNIT_TOKENS,
    UNIT_TOKENS_PER_S,
    DashboardSpec,
    Panel,
    Query,
    Row,
)
from inferwatch.dashboards.promql import (
    EM,
    EMI,
    EMIR,
    QUANTILES_TITLE,
    RATE_INTERVAL,
    bucket_rates,
    describe,
    distribution_queries,
    gauge,
    label_list,
    legend_format,
    mean,
    percentile_queries,
    positive,
    prom_variables,
    quantile,
    rate,
    selector,
    sum_rate,
)

UID = links.UID_ENGINE
"""stable: Grafana upserts provisioned dashboards by uid."""


def _heatmap(title: str, what: str, metric: V.MetricSpec, unit: str) -> Panel:
    """Requests (or outputs) per second in each canonical bucket of ``metric``, over the selection."""
    return Panel(
        title,
        describe(what, metric),
        unit,
        (Query(bucket_rates(metric), "{{le}}", (metric,), False, HEATMAP),),
        HEATMAP,
        12,
        8,
    )


INSTANCE_QUANTILE = 0.95

PROXY_IDLE = (
    "No inferwatch proxy in front of the selected engines, or no request through it in this time range: these "
    "panels show what inferwatch proxy measures (see docs/proxy.md)."
)
LORA_IDLE = (
    "No LoRA adapter has requests in this selection and time range; an engine that reports LoRA adapters does so "
    "only while serving with LoRA enabled."
)


def board() -> DashboardSpec:
    """One engine in detail: request phases, latency distributions, batching, caches, engine info and
    request lengths."""
    phases = (
        ("Queue time", "queue", V.REQUEST_QUEUE),
        ("Prefill time", "prefill", V.REQUEST_PREFILL),
        ("Decode time", "decode", V.REQUEST_DECODE),
    )
    info_by = (*EMI, *V.INFO_LABELS)
    by_instance_latency = (
        ("TTFT", V.TIME_TO_FIRST_TOKEN),
        ("ITL", V.INTER_TOKEN_LATENCY),
        ("E2E", V.REQUEST_DURATION),
    )
    running = f"sum by ({label_list(EM)}) (avg_over_time({V.REQUESTS_RUNNING.name}{selector()}[{RATE_INTERVAL}]))"
    panels: list[Panel | Row] = [Row("Request phases")]
    for title, _, metric in phases:
        panels.append(
            Panel(
                f"{title} {QUANTILES_TITLE}",
                describe(f"{title} per engine and model: percentiles (histogram estimates) and the exact mean", metric),
                UNIT_SECONDS,
                distribution_queries(metric),
                TIMESERIES,
                8,
                8,
            )
        )
    panels += [
        Panel(
            "Mean time per phase (stacked)",
            describe(
                "Where the average request spends its time: queue, prefill and decode means stacked per engine "
                "and model (together about the end-to-end latency); select one engine and model for one stack",
                *(metric for _, _, metric in phases),
            ),
            UNIT_SECONDS,
            tuple(Query(mean(metric), legend_format(EM, name), (metric,), True) for _, name, metric in phases),
            TIMESERIES,
            12,
            8,
            stacked=True,
        ),
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
        Row("Latency distributions"),
        _heatmap(
            "Time to first token distribution",
            "Requests per second in each TTFT bucket: bands show multi-modal latency that percentiles hide",
            V.TIME_TO_FIRST_TOKEN,
            UNIT_SECONDS,
        ),
        _heatmap(
            "End-to-end latency distribution",
            "Requests per second in each request-duration bucket",
            V.REQUEST_DURATION,
            UNIT_SECONDS,
        ),
        _heatmap(
            "Inter-token latency distribution",
            "Outputs per second in each inter-token-latency bucket (one observation per output)",
            V.INTER_TOKEN_LATENCY,
            UNIT_SECONDS,
        ),
        _heatmap(
            "Time per output token distribution",
            "Requests per second in each time-per-output-token bucket (one observation per request)",
            V.TIME_PER_OUTPUT_TOKEN,
            UNIT_SECONDS,
        ),
        Row("What the client sees (inferwatch proxy)"),
        Panel(
            "TTFT: engine vs client",
            describe(
                "Time to first token as the engine measures it and as the client sees it through inferwatch "
                "proxy (p50, p99), and the mean time spent outside the engine (API server, tokenizer, "
                "detokenizer, network): the client's mean minus the engine's",
                V.TIME_TO_FIRST_TOKEN,
                V.CLIENT_TIME_TO_FIRST_TOKEN,
            ),
            UNIT_SECONDS,
            (
                *percentile_queries(V.TIME_TO_FIRST_TOKEN, (0.5, 0.99), "engine"),
                *percentile_queries(V.CLIENT_TIME_TO_FIRST_TOKEN, (0.5, 0.99), "client"),
                Query(
                    f"{mean(V.CLIENT_TIME_TO_FIRST_TOKEN)} - {mean(V.TIME_TO_FIRST_TOKEN)}",
                    legend_format(EM, "outside the engine (mean)"),
                    (V.CLIENT_TIME_TO_FIRST_TOKEN, V.TIME_TO_FIRST_TOKEN),
                    True,
                ),
            ),
            TIMESERIES,
            12,
            8,
            idle=PROXY_IDLE,
        ),
        Panel(
            f"Stalls between chunks and time per output token at the client {QUANTILES_TITLE}",
            describe(
                "Gaps between consecutive content chunks of streamed responses (what a reader sees stall) and "
                "the time per output token, both measured at inferwatch proxy",
                V.CLIENT_CHUNK_GAP,
                V.CLIENT_TIME_PER_OUTPUT_TOKEN,
            ),
            UNIT_SECONDS,
            (
                *percentile_queries(V.CLIENT_CHUNK_GAP, (0.5, 0.99), "gap"),
                *percentile_queries(V.CLIENT_TIME_PER_OUTPUT_TOKEN, (0.5, 0.99), "TPOT"),
            ),
            TIMESERIES,
            12,
            8,
            idle=PROXY_IDLE,
        ),
        Panel(
            "Outcomes at the client",
            describe(
                "Share of the requests through inferwatch proxy by outcome: abort is the client going away "
                "before the end (the upstream request is cancelled), error an error status, a failed or timed-out "
                "upstream or a cut stream",
                V.CLIENT_REQUESTS,
            ),
            UNIT_RATIO,
            (
                Query(
                    f"sum by ({label_list((*EM, V.LABEL_OUTCOME))}) ({rate(V.CLIENT_REQUESTS)})"
                    f" / ignoring ({V.LABEL_OUTCOME}) group_left () "
                    f"{positive(f'sum by ({label_list(EM)}) ({rate(V.CLIENT_REQUESTS)})')}",
                    legend_format((*EM, V.LABEL_OUTCOME)),
                    (V.CLIENT_REQUESTS,),
                    True,
                ),
            ),
            TIMESERIES,
            24,
            6,
            min=0,
            max=1,
            idle=PROXY_IDLE,
        ),
        Row("Batching"),
        Panel(
            "Batch size (running requests)",
            describe("Requests in the running batch per instance (and data-parallel rank)", V.REQUESTS_RUNNING),
            UNIT_REQUESTS,
            (Query(gauge(V.REQUESTS_RUNNING, by=EMIR), legend_format(EMIR), (V.REQUESTS_RUNNING,), True),),
            TIMESERIES,
            12,
            8,
        ),
        Panel(
            "Output tokens/s per running request",
            describe(
                "Generated tokens per second divided by the average running batch: the decode speed one "
                "request sees; it falls as the batch grows",
                V.GENERATION_TOKENS,
                V.REQUESTS_RUNNING,
            ),
            UNIT_TOKENS_PER_S,
            (
                Query(
                    f"{sum_rate(V.GENERATION_TOKENS)} / {positive(running)}",
                    legend_format(EM),
                    (V.GENERATION_TOKENS, V.REQUESTS_RUNNING),
                    True,
                ),
            ),
            TIMESERIES,
            12,
            8,
        ),
        *cache_panels(),
        Row("By instance and data-parallel rank"),
        Panel(
            "Requests/s by instance",
            describe("Finished requests per second per instance (and data-parallel rank)", V.REQUESTS),
            UNIT_REQPS,
            (Query(sum_rate(V.REQUESTS, EMIR), legend_format(EMIR), (V.REQUESTS,), True),),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "Tokens/s by instance in and out",
            describe(
                "Prompt (in) and generated (out) tokens per second per instance (and data-parallel rank)",
                V.PROMPT_TOKENS,
                V.GENERATION_TOKENS,
            ),
            UNIT_TOKENS_PER_S,
            (
                Query(sum_rate(V.PROMPT_TOKENS, EMIR), legend_format(EMIR, "in"), (V.PROMPT_TOKENS,), True),
                Query(sum_rate(V.GENERATION_TOKENS, EMIR), legend_format(EMIR, "out"), (V.GENERATION_TOKENS,), True),
            ),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            f"Latency by instance: p{round(INSTANCE_QUANTILE * 100)} and mean queue time",
            describe(
                f"Per instance (and data-parallel rank): P{round(INSTANCE_QUANTILE * 100)} time to first token, "
                "inter-token latency and end-to-end latency (histogram estimates), and the mean queue time: "
                "an outlier instance stands out",
                *(metric for _, metric in by_instance_latency),
                V.REQUEST_QUEUE,
            ),
            UNIT_SECONDS,
            (
                *(
                    Query(
                        quantile(metric, INSTANCE_QUANTILE, EMIR),
                        legend_format(EMIR, f"{name} p{round(INSTANCE_QUANTILE * 100)}"),
                        (metric,),
                        True,
                    )
                    for name, metric in by_instance_latency
                ),
                Query(mean(V.REQUEST_QUEUE, EMIR), legend_format(EMIR, "queue mean"), (V.REQUEST_QUEUE,), True),
            ),
            TIMESERIES,
            8,
            8,
        ),
        Panel(
            "Prefix-cache hit rate by instance",
            describe(
                "Prompt tokens found in the prefix cache over prompt tokens looked up, per instance (and "
                "data-parallel rank)",
                V.PREFIX_CACHE_HIT_TOKENS,
                V.PREFIX_CACHE_QUERIED_TOKENS,
            ),
            UNIT_RATIO,
            (
                Query(
                    ratio(V.PREFIX_CACHE_HIT_TOKENS, V.PREFIX_CACHE_QUERIED_TOKENS, EMIR),
                    legend_format(EMIR),
                    (V.PREFIX_CACHE_HIT_TOKENS, V.PREFIX_CACHE_QUERIED_TOKENS),
                    True,
                ),
            ),
            TIMESERIES,
            12,
            8,
            min=0,
            max=1,
        ),
        Panel(
            "Speculative-decoding acceptance rate by instance",
            describe(
                "Draft tokens accepted over draft tokens proposed, per instance (and data-parallel rank)",
                V.SPEC_DECODE_ACCEPTED_TOKENS,
                V.SPEC_DECODE_DRAFT_TOKENS,
            ),
            UNIT_RATIO,
            (
                Query(
                    ratio(V.SPEC_DECODE_ACCEPTED_TOKENS, V.SPEC_DECODE_DRAFT_TOKENS, EMIR),
                    legend_format(EMIR),
                    (V.SPEC_DECODE_ACCEPTED_TOKENS, V.SPEC_DECODE_DRAFT_TOKENS),
                    True,
                ),
            ),
            TIMESERIES,
            12,
            8,
            min=0,
            max=1,
            idle=SPEC_DECODE_IDLE,
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
        Panel(
            "LoRA adapters with requests",
            describe(
                "Every LoRA adapter with requests running or waiting now, per instance (requests of an adapter "
                "wait when more adapters are busy than fit at once)",
                V.LORA_ADAPTER_ACTIVE,
            ),
            UNIT_NONE,
            (
                Query(
                    gauge(V.LORA_ADAPTER_ACTIVE, "max", (*EMI, V.LABEL_LORA_ADAPTER)),
                    legend_format((*EMI, V.LABEL_LORA_ADAPTER)),
                    (V.LORA_ADAPTER_ACTIVE,),
                    True,
                    TABLE,
                ),
            ),
            TABLE,
            12,
            8,
            idle=LORA_IDLE,
        ),
        Panel(
            "LoRA adapters busy vs slots",
            describe(
                "Adapters with requests, against how many the engine holds at once: more busy adapters than slots "
                "mean requests wait for an adapter swap, not for KV cache",
                V.LORA_ADAPTER_ACTIVE,
                V.LORA_ADAPTERS_MAX,
            ),
            UNIT_COUNT,
            (
                Query(
                    f"count by ({label_list(EMI)}) ({V.LORA_ADAPTER_ACTIVE.name}{selector()})",
                    legend_format(EMI, "busy"),
                    (V.LORA_ADAPTER_ACTIVE,),
                    True,
                ),
                Query(
                    gauge(V.LORA_ADAPTERS_MAX, "max", EMI),
                    legend_format(EMI, "slots"),
                    (V.LORA_ADAPTERS_MAX,),
                    True,
                ),
            ),
            TIMESERIES,
            12,
            8,
            idle=LORA_IDLE,
        ),
        Row("Request lengths"),
    ]
    lengths = (("Prompt", V.REQUEST_PROMPT_TOKENS), ("Generation", V.REQUEST_GENERATION_TOKENS))
    for what, metric in lengths:
        panels.append(
            Panel(
                f"{what} length {QUANTILES_TITLE}",
                describe(
                    f"{what} tokens per finished request per engine and model: percentiles (histogram estimates) "
                    "and the exact mean",
                    metric,
                ),
                UNIT_TOKENS,
                distribution_queries(metric),
                TIMESERIES,
                12,
                8,
            )
        )
    for what, metric in lengths:
        panels.append(
            _heatmap(
                f"{what} length distribution",
                f"{what} tokens per finished request: requests per second in each bucket",
                metric,
                UNIT_TOKENS,
            )
        )
    return DashboardSpec(
        UID,
        links.DASHBOARD_TITLES[UID],
        f"Phases, latency distributions, batching, caches, configuration and request lengths of one engine. {NOTE}",
        prom_variables(),
        tuple(panels),
    )
