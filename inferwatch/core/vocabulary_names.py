"""The vocabulary's plain names: label names and values, bucket layouts and how ``le`` values are
written, and the names of the SLO recording rules and alerts.

Part of the one vocabulary (:mod:`inferwatch.core.vocabulary`, which re-exports every name here: callers
write ``V.LABEL_MODEL``, ``V.ALERT_SLO_BURN``); the metric families built from these names live there.
"""

from __future__ import annotations

import math
import re
from typing import Final

__all__ = [
    "ALERTS",
    "ALERT_ENGINE_METRICS_ABSENT",
    "ALERT_EXPORTER_TARGET_DOWN",
    "ALERT_GPU_ERRORS",
    "ALERT_GPU_THROTTLED",
    "ALERT_HEADROOM_LOW",
    "ALERT_KV_EXHAUSTION_PREDICTED",
    "ALERT_KV_SATURATED",
    "ALERT_PREEMPTIONS_SUSTAINED",
    "ALERT_QUEUE_BACKLOG_GROWING",
    "ALERT_SLO_BURN",
    "BUCKETS_REQUEST_DURATION",
    "BUCKETS_TOKENS",
    "BUCKETS_TPOT",
    "BUCKETS_TTFT",
    "CAPACITY_CONCURRENCY_RECORD",
    "CAPACITY_REQUESTS_PER_SECOND_RECORD",
    "COST_GOODPUT_PER_MILLION_RECORD",
    "COST_GPU_HOURLY_RECORD",
    "COST_IDLE_HOURLY_RECORD",
    "COST_PER_MILLION_GENERATION_RECORD",
    "COST_PER_MILLION_PROMPT_RECORD",
    "ENGINES",
    "ENGINE_LLAMACPP",
    "ENGINE_SGLANG",
    "ENGINE_TGI",
    "ENGINE_TRITON",
    "ENGINE_TRTLLM",
    "ENGINE_VLLM",
    "FALSE",
    "GPU_CLOCK_HW_POWER_BRAKE",
    "GPU_CLOCK_HW_SLOWDOWN",
    "GPU_CLOCK_HW_THERMAL",
    "GPU_CLOCK_POWER_CAP",
    "GPU_CLOCK_SW_THERMAL",
    "GPU_COUNT_RECORD",
    "GPU_THROTTLE_CAUSES",
    "GPU_THROTTLE_POWER",
    "GPU_THROTTLE_THERMAL",
    "GPU_XID_CRITICAL",
    "HEADROOM_KV_LIMIT",
    "HEADROOM_LIMIT_CONCURRENCY_RECORD",
    "HEADROOM_LIMIT_RATE_RECORD",
    "HEADROOM_PARTS",
    "HEADROOM_RATIO_RECORD",
    "INFO_LABELS",
    "LABEL_BLOCK_SIZE",
    "LABEL_DP_RANK",
    "LABEL_ENGINE",
    "LABEL_ENGINE_VERSION",
    "LABEL_GPU",
    "LABEL_GPU_MEMORY_UTILIZATION",
    "LABEL_GPU_MODEL",
    "LABEL_GPU_UUID",
    "LABEL_HOST",
    "LABEL_KV_CACHE_DTYPE",
    "LABEL_LE",
    "LABEL_LIMITING_SLO",
    "LABEL_LORA_ADAPTER",
    "LABEL_MAX_CONCURRENCY",
    "LABEL_METRIC",
    "LABEL_MODEL",
    "LABEL_ORDER",
    "LABEL_OUTCOME",
    "LABEL_POOL",
    "LABEL_PREFIX_CACHING",
    "LABEL_REASON",
    "LABEL_ROLE",
    "LABEL_TARGET",
    "LABEL_TENANT",
    "LABEL_XID",
    "LOAD_REQUESTS_PER_SECOND_RECORD",
    "LONG_WINDOW_LABEL",
    "OUTCOMES",
    "OUTCOME_ABORT",
    "OUTCOME_ERROR",
    "OUTCOME_LENGTH",
    "OUTCOME_STOP",
    "PROXY_SERVICE",
    "REPLICAS_NEEDED_RECORD",
    "ROLES",
    "ROLE_DECODE",
    "ROLE_PREFILL",
    "ROLE_UNIFIED",
    "SATURATION_ALERTS",
    "SCRAPE_ERROR_BODY_TOO_LARGE",
    "SCRAPE_ERROR_DUPLICATE_SERIES",
    "SCRAPE_ERROR_HTTP_STATUS",
    "SCRAPE_ERROR_INTERNAL",
    "SCRAPE_ERROR_INVALID",
    "SCRAPE_ERROR_NON_FINITE",
    "SCRAPE_ERROR_REASONS",
    "SCRAPE_ERROR_REDIRECT",
    "SCRAPE_ERROR_TIMEOUT",
    "SCRAPE_ERROR_TOO_MANY_SAMPLES",
    "SCRAPE_ERROR_TRUNCATED",
    "SCRAPE_ERROR_UNREACHABLE",
    "SEVERITY_LABEL",
    "SEVERITY_PAGE",
    "SEVERITY_TICKET",
    "SHORT_WINDOW_LABEL",
    "SLO_BUDGET_REMAINING_RECORD",
    "SLO_CURRENT_BURN_RATE_RECORD",
    "SLO_ERRORS_RATE_RECORD",
    "SLO_ERROR_BUDGET_RECORD",
    "SLO_ERROR_RATIO_PREFIX",
    "SLO_EVENTS_RATE_RECORD",
    "SLO_INFO_RECORD",
    "SLO_LABEL",
    "SLO_OBJECTIVE_RECORD",
    "SLO_PERIOD_BURN_RATE_RECORD",
    "SLO_PERIOD_ERROR_RATIO_RECORD",
    "SLO_SERVICE_LABEL",
    "SLO_WINDOWS",
    "TENANT_ANONYMOUS",
    "TENANT_OTHER",
    "TRUE",
    "UNKNOWN",
    "format_le",
    "format_value",
    "headroom_record",
    "is_label_name",
    "slo_error_ratio",
]

# --- label names -----------------------------------------------------------------------------
LABEL_ENGINE: Final = "engine"
LABEL_MODEL: Final = "model"
LABEL_DP_RANK: Final = "dp_rank"
LABEL_ROLE: Final = "role"
"""The serving role of an instance in prefill/decode disaggregation (SGLang's ``engine_type``)."""
LABEL_OUTCOME: Final = "outcome"
LABEL_METRIC: Final = "metric"
LABEL_TARGET: Final = "target"
LABEL_REASON: Final = "reason"
LABEL_LORA_ADAPTER: Final = "lora_adapter"
LABEL_LE: Final = "le"
# the GPU beneath an engine (``llm_gpu_*``) and who asked (``tenant``)
LABEL_GPU: Final = "gpu"
"""The GPU's index on its host (NVML's order, which may differ from ``CUDA_VISIBLE_DEVICES``')."""
LABEL_GPU_UUID: Final = "gpu_uuid"
LABEL_GPU_MODEL: Final = "gpu_model"
"""The board's product name (``NVIDIA H100 80GB HBM3``): what a price per GPU-hour is set for."""
LABEL_HOST: Final = "host"
LABEL_POOL: Final = "pool"
"""The GPU pool a replica runs on (an exporter target's ``gpus.pool``): what a price may be set for."""
LABEL_XID: Final = "xid"
LABEL_TENANT: Final = "tenant"
"""Who sent a request through ``inferwatch proxy``: a keyed hash of its API key, or a header's value."""
# llm_engine_info labels (config facts an engine reveals)
LABEL_ENGINE_VERSION: Final = "engine_version"
LABEL_BLOCK_SIZE: Final = "block_size"
LABEL_GPU_MEMORY_UTILIZATION: Final = "gpu_memory_utilization"
LABEL_PREFIX_CACHING: Final = "prefix_caching"
LABEL_KV_CACHE_DTYPE: Final = "kv_cache_dtype"
LABEL_MAX_CONCURRENCY: Final = "max_concurrency"

INFO_LABELS: Final[tuple[str, ...]] = (
    LABEL_ENGINE_VERSION,
    LABEL_BLOCK_SIZE,
    LABEL_GPU_MEMORY_UTILIZATION,
    LABEL_PREFIX_CACHING,
    LABEL_KV_CACHE_DTYPE,
    LABEL_MAX_CONCURRENCY,
)

# The order in which canonical labels are rendered (``le`` always last).
LABEL_ORDER: Final[tuple[str, ...]] = (
    LABEL_ENGINE,
    LABEL_MODEL,
    LABEL_DP_RANK,
    LABEL_ROLE,
    LABEL_OUTCOME,
    LABEL_METRIC,
    LABEL_TARGET,
    LABEL_REASON,
    LABEL_LORA_ADAPTER,
    *INFO_LABELS,
    LABEL_POOL,
    LABEL_HOST,
    LABEL_GPU,
    LABEL_GPU_UUID,
    LABEL_GPU_MODEL,
    LABEL_XID,
    LABEL_TENANT,
)

# --- label values ----------------------------------------------------------------------------
# why a GPU's clocks are held down (``llm_gpu_clock_event_active{reason}``; NVML's clock-event bits)
GPU_CLOCK_POWER_CAP: Final = "power_cap"
GPU_CLOCK_HW_SLOWDOWN: Final = "hw_slowdown"
GPU_CLOCK_SW_THERMAL: Final = "sw_thermal"
GPU_CLOCK_HW_THERMAL: Final = "hw_thermal"
GPU_CLOCK_HW_POWER_BRAKE: Final = "hw_power_brake"
GPU_THROTTLE_POWER: Final = "power"
GPU_THROTTLE_THERMAL: Final = "thermal"
GPU_THROTTLE_CAUSES: Final[dict[str, str]] = {
    GPU_CLOCK_POWER_CAP: GPU_THROTTLE_POWER,
    GPU_CLOCK_HW_SLOWDOWN: GPU_THROTTLE_POWER,
    GPU_CLOCK_HW_POWER_BRAKE: GPU_THROTTLE_POWER,
    GPU_CLOCK_SW_THERMAL: GPU_THROTTLE_THERMAL,
    GPU_CLOCK_HW_THERMAL: GPU_THROTTLE_THERMAL,
}
"""The clock-event reasons that mean throttling, and their cause (``power`` or ``thermal``): the
``reason`` of ``llm_gpu_throttle_seconds_total`` and of the ``gpu_throttled`` finding. Other clock
events (idle, application clocks, sync boost, display) are not throttling."""
TENANT_OTHER: Final = "other"
"""The tenant of every request whose tenant is not among the busiest (the cardinality bound)."""
TENANT_ANONYMOUS: Final = "anonymous"
"""The tenant of a request with no API key (or no tenant header)."""
ENGINE_VLLM: Final = "vllm"
ENGINE_TGI: Final = "tgi"
ENGINE_TRTLLM: Final = "trtllm"
ENGINE_TRITON: Final = "triton"
ENGINE_SGLANG: Final = "sglang"
ENGINE_LLAMACPP: Final = "llamacpp"
ENGINES: Final[tuple[str, ...]] = (
    ENGINE_VLLM,
    ENGINE_TGI,
    ENGINE_TRTLLM,
    ENGINE_TRITON,
    ENGINE_SGLANG,
    ENGINE_LLAMACPP,
)

OUTCOME_STOP: Final = "stop"
OUTCOME_LENGTH: Final = "length"
OUTCOME_ABORT: Final = "abort"
OUTCOME_ERROR: Final = "error"
OUTCOMES: Final[tuple[str, ...]] = (OUTCOME_STOP, OUTCOME_LENGTH, OUTCOME_ABORT, OUTCOME_ERROR)
ROLE_UNIFIED: Final = "unified"
ROLE_PREFILL: Final = "prefill"
ROLE_DECODE: Final = "decode"
ROLES: Final[tuple[str, ...]] = (ROLE_UNIFIED, ROLE_PREFILL, ROLE_DECODE)
"""``role`` values: an instance serving whole requests, or one side of prefill/decode disaggregation."""

# Why a scrape of an engine failed: the ``reason`` of EXPORTER_LAST_SCRAPE_ERROR.
SCRAPE_ERROR_TIMEOUT: Final = "timeout"
SCRAPE_ERROR_UNREACHABLE: Final = "unreachable"
SCRAPE_ERROR_HTTP_STATUS: Final = "http_status"
SCRAPE_ERROR_BODY_TOO_LARGE: Final = "body_too_large"
SCRAPE_ERROR_TOO_MANY_SAMPLES: Final = "too_many_samples"
SCRAPE_ERROR_TRUNCATED: Final = "truncated"
SCRAPE_ERROR_DUPLICATE_SERIES: Final = "duplicate_series"
SCRAPE_ERROR_NON_FINITE: Final = "non_finite"
SCRAPE_ERROR_INVALID: Final = "invalid"
SCRAPE_ERROR_REDIRECT: Final = "redirect"
"""a redirect the exporter does not follow: to another origin (by default), or one too many."""
SCRAPE_ERROR_INTERNAL: Final = "internal"
SCRAPE_ERROR_REASONS: Final[tuple[str, ...]] = (
    SCRAPE_ERROR_TIMEOUT,
    SCRAPE_ERROR_UNREACHABLE,
    SCRAPE_ERROR_HTTP_STATUS,
    SCRAPE_ERROR_BODY_TOO_LARGE,
    SCRAPE_ERROR_TOO_MANY_SAMPLES,
    SCRAPE_ERROR_TRUNCATED,
    SCRAPE_ERROR_DUPLICATE_SERIES,
    SCRAPE_ERROR_NON_FINITE,
    SCRAPE_ERROR_INVALID,
    SCRAPE_ERROR_REDIRECT,
    SCRAPE_ERROR_INTERNAL,
)

PROXY_SERVICE: Final = "inferwatch-proxy"
"""The OTLP ``service.name`` of ``inferwatch proxy``'s spans (its default): the collector tells the proxy's rows
(the client's side of a request) from the engine's own by it, and counts one side at a time."""

UNKNOWN: Final = "unknown"
TRUE: Final = "true"
FALSE: Final = "false"

# --- bucket layouts --------------------------------------------------------------------------
# OpenTelemetry GenAI advice for gen_ai.server.time_to_first_token.
BUCKETS_TTFT: Final[tuple[float, ...]] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
# OpenTelemetry GenAI advice for gen_ai.server.time_per_output_token.
BUCKETS_TPOT: Final[tuple[float, ...]] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
# OpenTelemetry GenAI advice for gen_ai.server.request.duration: 0.01 doubling to 81.92.
BUCKETS_REQUEST_DURATION: Final[tuple[float, ...]] = tuple(0.01 * 2**i for i in range(14))
# Token counts: the 1-2-5 series (vLLM's own token layout is a prefix of it, so it maps exactly).
BUCKETS_TOKENS: Final[tuple[float, ...]] = (
    *(float(m * 10**e) for e in range(6) for m in (1, 2, 5)),
    1_000_000.0,
)


def format_le(bound: float) -> str:
    """Render a bucket boundary the one way inferwatch writes ``le`` values.

    Python's shortest round-trip ``repr`` of the float (``0.5``, ``1.0``, ``81.92``), which is also
    how prometheus_client renders them, and ``+Inf`` for infinity. Alert rules and dashboards
    compare ``le`` strings produced by this function.
    """
    if math.isinf(bound):
        return "+Inf" if bound > 0 else "-Inf"
    return repr(float(bound))


def format_value(value: float) -> str:
    """Render a sample value in the text exposition format."""
    if value != value:  # NaN
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


# --- SLO recording rules and alert names (generated by alerts/, read by dashboards/) ----------
SLO_LABEL: Final = "slo"
SEVERITY_LABEL: Final = "severity"
LONG_WINDOW_LABEL: Final = "long_window"
SHORT_WINDOW_LABEL: Final = "short_window"
SEVERITY_PAGE: Final = "page"
SEVERITY_TICKET: Final = "ticket"
SLO_ERROR_RATIO_PREFIX: Final = "slo:sli_error:ratio_rate"
"""``slo:sli_error:ratio_rate<window>``: errors / total over the window, summed before dividing."""
SLO_WINDOWS: Final[tuple[str, ...]] = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
SLO_OBJECTIVE_RECORD: Final = "slo:objective:ratio"
SLO_ERROR_BUDGET_RECORD: Final = "slo:error_budget:ratio"
SLO_PERIOD_ERROR_RATIO_RECORD: Final = "slo:sli_error:ratio_period"
SLO_BUDGET_REMAINING_RECORD: Final = "slo:error_budget_remaining:ratio"
SLO_INFO_RECORD: Final = "slo:info"
SLO_ERRORS_RATE_RECORD: Final = "slo:sli_errors:rate5m"
"""Bad events per second over 5m (summed by the SLO's group_by): the numerator the period SLI sums."""
SLO_EVENTS_RATE_RECORD: Final = "slo:sli_events:rate5m"
"""All events per second over 5m: the denominator the period SLI sums, and the minimum-traffic guard's count."""
SLO_CURRENT_BURN_RATE_RECORD: Final = "slo:current_burn_rate:ratio"
"""The 5m error ratio over the error budget: 1 spends the budget exactly over the period."""
SLO_PERIOD_BURN_RATE_RECORD: Final = "slo:period_burn_rate:ratio"
"""The period's error ratio over the error budget."""
SLO_SERVICE_LABEL: Final = "service"
"""The SLO file's ``service`` on every SLO series and alert: two files may reuse an SLO name."""

# --- headroom: the capacity each replica has before an SLO breaks (inferwatch.core.headroom) ------
HEADROOM_RATIO_RECORD: Final = "llm:headroom_ratio"
"""Per replica: the request rate at which its first SLO breaks over its current rate (< 1: over the edge)."""
CAPACITY_REQUESTS_PER_SECOND_RECORD: Final = "llm:capacity_requests_per_second"
"""Per replica: the request rate at which its first SLO (or its KV cache) breaks."""
CAPACITY_CONCURRENCY_RECORD: Final = "llm:capacity_concurrency"
"""Per replica: the running batch at which its first SLO (or its KV cache) breaks."""
REPLICAS_NEEDED_RECORD: Final = "llm:replicas_needed"
"""Per model (and role): replicas that hold its SLOs at the current load."""
LOAD_REQUESTS_PER_SECOND_RECORD: Final = "llm:load_requests_per_second"
"""Per replica: its current load, served requests per second plus the queue's growth."""
HEADROOM_LIMIT_RATE_RECORD: Final = "llm:headroom_limit_requests_per_second"
"""Per replica and limit (``slo`` = an SLO name or ``HEADROOM_KV_LIMIT``): the rate at which it breaks."""
HEADROOM_LIMIT_CONCURRENCY_RECORD: Final = "llm:headroom_limit_concurrency"
"""Per replica and limit: the running batch at which it breaks."""
HEADROOM_KV_LIMIT: Final = "kv_cache"
"""The limit (``limiting_slo``) reached when the KV cache runs out (the first preemption) before any SLO."""
LABEL_LIMITING_SLO: Final = "limiting_slo"
"""On the capacity and headroom records: the SLO name (or ``HEADROOM_KV_LIMIT``) that breaks first."""
HEADROOM_PARTS: Final[tuple[str, ...]] = (
    "batch",
    "tpot_mean",
    "batch_tpot",
    "batch_squared",
    "tpot_squared",
    "tpot_intercept",
    "tpot_slope",
    "ttft_intercept",
    "ttft_slope",
    "e2e_intercept",
    "e2e_slope",
    "residence_intercept",
    "residence_slope",
    "current_batch",
    "served_requests_per_second",
    "quantile_ratio",
    "kv_tokens_per_request",
    "kv_capacity_tokens",
    "queue_seconds",
    "prompt_tokens",
    "output_tokens",
    "prefill_seconds_per_token",
    "residence_seconds",
)
"""The headroom rules' intermediate records, each ``llm:headroom_<part>`` (:func:`headroom_record`)."""

ALERT_SLO_BURN: Final = "SLOErrorBudgetBurn"
ALERT_KV_SATURATED: Final = "LLMKVCacheSaturated"
ALERT_KV_EXHAUSTION_PREDICTED: Final = "LLMKVCacheExhaustionPredicted"
ALERT_PREEMPTIONS_SUSTAINED: Final = "LLMPreemptionsSustained"
ALERT_QUEUE_BACKLOG_GROWING: Final = "LLMQueueBacklogGrowing"
ALERT_EXPORTER_TARGET_DOWN: Final = "LLMExporterTargetDown"
ALERT_ENGINE_METRICS_ABSENT: Final = "LLMEngineMetricsAbsent"
ALERT_HEADROOM_LOW: Final = "LLMHeadroomLow"
"""A replica's headroom is low: warns before the burn-rate alerts fire."""
ALERT_GPU_THROTTLED: Final = "LLMGPUThrottled"
"""A GPU of a replica has its clocks held down by power or temperature (issue 34)."""
ALERT_GPU_ERRORS: Final = "LLMGPUErrors"
"""A GPU of a replica reported an XID error of :data:`GPU_XID_CRITICAL` (issue 34)."""
SATURATION_ALERTS: Final[tuple[str, ...]] = (
    ALERT_KV_SATURATED,
    ALERT_KV_EXHAUSTION_PREDICTED,
    ALERT_PREEMPTIONS_SUSTAINED,
    ALERT_QUEUE_BACKLOG_GROWING,
    ALERT_EXPORTER_TARGET_DOWN,
    ALERT_ENGINE_METRICS_ABSENT,
    ALERT_HEADROOM_LOW,
    ALERT_GPU_THROTTLED,
    ALERT_GPU_ERRORS,
)
"""The saturation and health alerts (everything but the SLO burn-rate alert)."""
ALERTS: Final[tuple[str, ...]] = (ALERT_SLO_BURN, *SATURATION_ALERTS)


def headroom_record(part: str) -> str:
    """``llm:headroom_<part>``, one of :data:`HEADROOM_PARTS`."""
    if part not in HEADROOM_PARTS:
        raise ValueError(f"no headroom record part {part!r}")
    return f"llm:headroom_{part}"


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def is_label_name(name: str) -> bool:
    """Whether ``name`` is a valid Prometheus label name."""
    return _LABEL_NAME.match(name) is not None


def slo_error_ratio(window: str) -> str:
    """The recording rule of the SLI error ratio over ``window`` (``5m`` … ``3d``)."""
    return f"{SLO_ERROR_RATIO_PREFIX}{window}"


# --- issue 34: cost (recording rules of inferwatch/alerts; names fixed before the rules were written) --
COST_GPU_HOURLY_RECORD: Final = "llm:gpu_cost_usd_per_hour"
"""Per replica (engine, model, instance; pool when known): what its GPUs cost per hour at the SLO file's prices."""
COST_PER_MILLION_GENERATION_RECORD: Final = "llm:cost_usd_per_million_generation_tokens"
"""Per model: its GPUs' cost over the window divided by the generated tokens, per million."""
COST_PER_MILLION_PROMPT_RECORD: Final = "llm:cost_usd_per_million_prompt_tokens"
"""Per model: its GPUs' cost over the window divided by the prompt tokens, per million."""
COST_GOODPUT_PER_MILLION_RECORD: Final = "llm:goodput_cost_usd_per_million_generation_tokens"
"""Per model: the same cost divided by the generated tokens of requests that met every latency SLO."""
COST_IDLE_HOURLY_RECORD: Final = "llm:idle_gpu_cost_usd_per_hour"
"""Per model: the hourly cost of its replicas' GPUs while they ran no request."""


# --- task H2 (issue 34): GPU aggregation records and the critical XID codes --------------------------
GPU_COUNT_RECORD: Final = "llm:gpu_count"
"""Per replica (engine, model, instance; pool and gpu_model when known): how many GPUs it runs on, the
number the hourly cost multiplies."""
GPU_XID_CRITICAL: Final[dict[str, str]] = {
    "48": "double-bit ECC error: the memory is corrupt; the GPU needs a reset",
    "63": "ECC page retirement or row remapping recorded: reset the GPU when it is drained to apply it",
    "64": "ECC page retirement or row remapping failed: the GPU needs a reset, then replacement if it recurs",
    "74": "NVLink error: the link between GPUs failed; multi-GPU replicas stall",
    "79": "the GPU has fallen off the bus: the replica on it is gone; the node needs attention",
    "92": "high single-bit ECC error rate: the memory is degrading; plan a replacement",
    "94": "contained ECC error: the application using the memory was stopped; the GPU can go on",
    "95": "uncontained ECC error: every application on the GPU is affected; the GPU needs a reset",
}
"""The XID codes (``llm_gpu_xid_last{xid}``) that mean the GPU needs attention, with what each means (NVIDIA's
XID catalogue): ``LLMGPUErrors`` fires for these only. Others (a program's own fault, such as 13 or 43,
or 31 for a memory page fault) point at the software, not the board."""
