"""The canonical LLM-serving vocabulary: the one place where inferwatch spells its names.

Every canonical metric name, label name, label value set, unit and bucket layout is defined here or in
:mod:`inferwatch.core.vocabulary_names` (the plain names: labels and their values, bucket layouts, the
recording-rule and alert names), whose every name this module re-exports. Exporters, alert and
dashboard generators and the collector's schema import these objects as ``V.NAME``; a test
(``tests/test_drift.py``) fails when a canonical metric, rule or alert name is spelled anywhere else.

Bucket boundaries follow OpenTelemetry's GenAI semantic conventions where they advise some
(``gen_ai.server.time_to_first_token``, ``gen_ai.server.time_per_output_token``,
``gen_ai.server.request.duration``). SLO thresholds given in configuration are added to a layout
with :meth:`Vocabulary.with_boundaries`, so that rules can match an exact ``le`` string rendered
by :func:`format_le`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

# the metric shape, the GPU families and the plain names are part of this vocabulary:
# V.MetricSpec, V.GPU_POWER, V.LABEL_MODEL, V.BUCKETS_TTFT, V.ALERT_SLO_BURN, ...
from inferwatch.core.vocabulary_gpu import *  # noqa: F403
from inferwatch.core.vocabulary_gpu import GPU_METRICS
from inferwatch.core.vocabulary_names import *  # noqa: F403
from inferwatch.core.vocabulary_names import (
    BUCKETS_REQUEST_DURATION,
    BUCKETS_TOKENS,
    BUCKETS_TPOT,
    BUCKETS_TTFT,
    INFO_LABELS,
    LABEL_LORA_ADAPTER,
    LABEL_METRIC,
    LABEL_OUTCOME,
    LABEL_REASON,
    LABEL_TARGET,
    LABEL_TENANT,
    format_le,
)
from inferwatch.core.vocabulary_spec import *  # noqa: F403
from inferwatch.core.vocabulary_spec import Aggregation, Kind, MetricSpec, histogram_spec

# Canonical metric names, spelled once. (The drift test scans the rest of the tree for them.)
TIME_TO_FIRST_TOKEN: Final = histogram_spec(
    "time_to_first_token",
    "llm_time_to_first_token_seconds",
    "seconds",
    "Time from request arrival to the first output token, per request.",
    BUCKETS_TTFT,
    "gen_ai.server.time_to_first_token",
)
TIME_PER_OUTPUT_TOKEN: Final = histogram_spec(
    "time_per_output_token",
    "llm_time_per_output_token_seconds",
    "seconds",
    "Per request: (e2e - TTFT) / (output tokens - 1), the decode-phase time per output token.",
    BUCKETS_TPOT,
    "gen_ai.server.time_per_output_token",
)
INTER_TOKEN_LATENCY: Final = histogram_spec(
    "inter_token_latency",
    "llm_inter_token_latency_seconds",
    "seconds",
    "Time between consecutive outputs of a request, one observation per output.",
    BUCKETS_TPOT,
)
REQUEST_DURATION: Final = histogram_spec(
    "request_duration",
    "llm_request_duration_seconds",
    "seconds",
    "Server-side end-to-end time per finished request (arrival to last output).",
    BUCKETS_REQUEST_DURATION,
    "gen_ai.server.request.duration",
)
REQUEST_QUEUE: Final = histogram_spec(
    "request_queue",
    "llm_request_queue_seconds",
    "seconds",
    "Time a request waited in the engine's queue before it was first scheduled.",
    BUCKETS_TTFT,
)
REQUEST_PREFILL: Final = histogram_spec(
    "request_prefill",
    "llm_request_prefill_seconds",
    "seconds",
    "Time from first scheduling to the first output token (prefill phase).",
    BUCKETS_TTFT,
)
REQUEST_DECODE: Final = histogram_spec(
    "request_decode",
    "llm_request_decode_seconds",
    "seconds",
    "Time from the first to the last output token (decode phase).",
    BUCKETS_REQUEST_DURATION,
)
REQUEST_PROMPT_TOKENS: Final = histogram_spec(
    "request_prompt_tokens",
    "llm_request_prompt_tokens",
    "tokens",
    "Prompt (input) tokens per finished request.",
    BUCKETS_TOKENS,
    "gen_ai.usage.input_tokens",
)
REQUEST_GENERATION_TOKENS: Final = histogram_spec(
    "request_generation_tokens",
    "llm_request_generation_tokens",
    "tokens",
    "Generated (output) tokens per finished request.",
    BUCKETS_TOKENS,
    "gen_ai.usage.output_tokens",
)

REQUESTS: Final = MetricSpec(
    "requests",
    "llm_requests_total",
    Kind.COUNTER,
    "requests",
    "Finished requests by outcome (stop, length, abort, error).",
    labels=(LABEL_OUTCOME,),
)
PROMPT_TOKENS: Final = MetricSpec(
    "prompt_tokens",
    "llm_prompt_tokens_total",
    Kind.COUNTER,
    "tokens",
    "Prompt (input) tokens processed.",
)
GENERATION_TOKENS: Final = MetricSpec(
    "generation_tokens",
    "llm_generation_tokens_total",
    Kind.COUNTER,
    "tokens",
    "Generated (output) tokens.",
)
PREEMPTIONS: Final = MetricSpec(
    "preemptions",
    "llm_preemptions_total",
    Kind.COUNTER,
    "preemptions",
    "Running sequences evicted from the batch (KV cache exhausted) and recomputed later.",
)
PREFIX_CACHE_QUERIED_TOKENS: Final = MetricSpec(
    "prefix_cache_queried_tokens",
    "llm_prefix_cache_queried_tokens_total",
    Kind.COUNTER,
    "tokens",
    "Prompt tokens looked up in the prefix cache.",
)
PREFIX_CACHE_HIT_TOKENS: Final = MetricSpec(
    "prefix_cache_hit_tokens",
    "llm_prefix_cache_hit_tokens_total",
    Kind.COUNTER,
    "tokens",
    "Prompt tokens found in the prefix cache (their prefill was skipped).",
)
SPEC_DECODE_DRAFT_TOKENS: Final = MetricSpec(
    "spec_decode_draft_tokens",
    "llm_spec_decode_draft_tokens_total",
    Kind.COUNTER,
    "tokens",
    "Draft tokens proposed by speculative decoding.",
)
SPEC_DECODE_ACCEPTED_TOKENS: Final = MetricSpec(
    "spec_decode_accepted_tokens",
    "llm_spec_decode_accepted_tokens_total",
    Kind.COUNTER,
    "tokens",
    "Draft tokens accepted by the target model.",
)

REQUESTS_RUNNING: Final = MetricSpec(
    "requests_running",
    "llm_requests_running",
    Kind.GAUGE,
    "requests",
    "Requests in the engine's running batch.",
)
REQUESTS_WAITING: Final = MetricSpec(
    "requests_waiting",
    "llm_requests_waiting",
    Kind.GAUGE,
    "requests",
    "Requests waiting to be scheduled.",
)
KV_CACHE_USAGE: Final = MetricSpec(
    "kv_cache_usage",
    "llm_kv_cache_usage_ratio",
    Kind.GAUGE,
    "ratio",
    "Fraction (0-1) of the KV cache in use.",
    aggregation=Aggregation.MAX,
)
KV_CACHE_CAPACITY: Final = MetricSpec(
    "kv_cache_capacity",
    "llm_kv_cache_capacity_tokens",
    Kind.GAUGE,
    "tokens",
    "KV cache capacity in tokens (blocks x block size).",
    aggregation=Aggregation.MAX,
)
LORA_ADAPTER_ACTIVE: Final = MetricSpec(
    "lora_adapter_active",
    "llm_lora_adapter_active",
    Kind.GAUGE,
    "",
    "1 for each LoRA adapter with requests in the engine (running or waiting); absent when it has none. "
    "Engines report which adapters are busy, not how many requests each has.",
    labels=(LABEL_LORA_ADAPTER,),
    aggregation=Aggregation.MAX,
)
LORA_ADAPTERS_MAX: Final = MetricSpec(
    "lora_adapters_max",
    "llm_lora_adapters_max",
    Kind.GAUGE,
    "",
    "How many LoRA adapters the engine holds on the GPU at once (more adapters with requests than this queue).",
    aggregation=Aggregation.MAX,
)
ENGINE_INFO: Final = MetricSpec(
    "engine_info",
    "llm_engine_info",
    Kind.GAUGE,
    "",
    "Engine version and configuration facts as labels; value 1.",
    labels=INFO_LABELS,
    aggregation=Aggregation.MAX,
)

EXPORTER_UP: Final = MetricSpec(
    "exporter_up",
    "llm_exporter_up",
    Kind.GAUGE,
    "",
    "1 when the last scrape of the engine succeeded, else 0.",
    labels=(LABEL_TARGET,),
    health=True,
)
EXPORTER_SCRAPE_DURATION: Final = MetricSpec(
    "exporter_scrape_duration",
    "llm_exporter_scrape_duration_seconds",
    Kind.GAUGE,
    "seconds",
    "Duration of the last scrape and translation of the engine's metrics.",
    labels=(LABEL_TARGET,),
    health=True,
)
EXPORTER_UNMAPPED_FAMILIES: Final = MetricSpec(
    "exporter_unmapped_families",
    "llm_exporter_unmapped_families",
    Kind.GAUGE,
    "families",
    "Engine metric families in the last scrape that the exporter neither maps nor knowingly ignores "
    "(a new or renamed engine metric).",
    labels=(LABEL_TARGET,),
    health=True,
)
EXPORTER_INEXACT_BUCKETS: Final = MetricSpec(
    "exporter_inexact_buckets",
    "llm_exporter_inexact_buckets",
    Kind.GAUGE,
    "",
    "1 when a canonical histogram's buckets could not all be taken exactly from the engine's "
    "buckets (the count at the largest lower engine boundary was used), else 0.",
    labels=(LABEL_TARGET, LABEL_METRIC),
    health=True,
)
EXPORTER_LAST_SCRAPE_ERROR: Final = MetricSpec(
    "exporter_last_scrape_error",
    "llm_exporter_last_scrape_error",
    Kind.GAUGE,
    "",
    "1, with the reason, while the last scrape of the engine failed (absent while it succeeds): "
    "timeout (the whole scrape's deadline passed), unreachable (connection or protocol error), "
    "http_status (not HTTP 200), body_too_large (over the body limit after decompression), "
    "too_many_samples (over the sample-line limit), truncated (the page does not end with a newline), "
    "duplicate_series (a series twice in one page), non_finite (a counter or histogram sample is NaN "
    "or infinite), invalid (not Prometheus text, or a malformed line), redirect (a redirect the exporter "
    "does not follow: to another scheme, host or port by default, or more than 5), internal (an exporter bug).",
    labels=(LABEL_TARGET, LABEL_REASON),
    health=True,
)

# The collector's self-metrics (its own health, not an engine signal).
COLLECTOR_SPANS_RECEIVED: Final = MetricSpec(
    "collector_spans_received",
    "inferwatch_collector_spans_received_total",
    Kind.COUNTER,
    "spans",
    "Spans received over OTLP (HTTP and gRPC).",
    health=True,
)
COLLECTOR_REQUESTS_STORED: Final = MetricSpec(
    "collector_requests_stored",
    "inferwatch_collector_requests_stored_total",
    Kind.COUNTER,
    "requests",
    "LLM request rows written to the database.",
    health=True,
)
COLLECTOR_SPANS_REJECTED: Final = MetricSpec(
    "collector_spans_rejected",
    "inferwatch_collector_spans_rejected_total",
    Kind.COUNTER,
    "spans",
    "Spans refused, by reason.",
    labels=("reason",),
    health=True,
)
COLLECTOR_SPANS_SKIPPED: Final = MetricSpec(
    "collector_spans_skipped",
    "inferwatch_collector_spans_skipped_total",
    Kind.COUNTER,
    "spans",
    "Spans that are not LLM requests (start-up spans, middleware, child spans folded into a request).",
    health=True,
)
COLLECTOR_DUPLICATES: Final = MetricSpec(
    "collector_duplicates",
    "inferwatch_collector_duplicate_requests_total",
    Kind.COUNTER,
    "requests",
    "Request rows already stored (same trace and span id), ignored.",
    health=True,
)
COLLECTOR_QUEUE_DEPTH: Final = MetricSpec(
    "collector_queue_depth",
    "inferwatch_collector_queue_depth",
    Kind.GAUGE,
    "requests",
    "Request rows accepted and not yet written.",
    health=True,
)
COLLECTOR_SPOOLED: Final = MetricSpec(
    "collector_spooled",
    "inferwatch_collector_spooled_requests",
    Kind.GAUGE,
    "requests",
    "Request rows spooled to disk while the database was unreachable.",
    health=True,
)
COLLECTOR_BATCH_SECONDS: Final = MetricSpec(
    "collector_batch_write",
    "inferwatch_collector_batch_write_seconds",
    Kind.GAUGE,
    "seconds",
    "Duration of the last batch insert.",
    health=True,
)
COLLECTOR_DB_UP: Final = MetricSpec(
    "collector_db_up",
    "inferwatch_collector_database_up",
    Kind.GAUGE,
    "",
    "1 when the last database write or check succeeded.",
    health=True,
)
COLLECTOR_METRICS: Final[tuple[MetricSpec, ...]] = (
    COLLECTOR_SPANS_RECEIVED,
    COLLECTOR_REQUESTS_STORED,
    COLLECTOR_SPANS_REJECTED,
    COLLECTOR_SPANS_SKIPPED,
    COLLECTOR_DUPLICATES,
    COLLECTOR_QUEUE_DEPTH,
    COLLECTOR_SPOOLED,
    COLLECTOR_BATCH_SECONDS,
    COLLECTOR_DB_UP,
)

CANONICAL_METRICS: Final[tuple[MetricSpec, ...]] = (
    TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
    INTER_TOKEN_LATENCY,
    REQUEST_DURATION,
    REQUEST_QUEUE,
    REQUEST_PREFILL,
    REQUEST_DECODE,
    REQUEST_PROMPT_TOKENS,
    REQUEST_GENERATION_TOKENS,
    REQUESTS,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    PREEMPTIONS,
    PREFIX_CACHE_QUERIED_TOKENS,
    PREFIX_CACHE_HIT_TOKENS,
    SPEC_DECODE_DRAFT_TOKENS,
    SPEC_DECODE_ACCEPTED_TOKENS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    KV_CACHE_USAGE,
    KV_CACHE_CAPACITY,
    LORA_ADAPTER_ACTIVE,
    LORA_ADAPTERS_MAX,
    ENGINE_INFO,
)
"""Engine signals, in rendering order."""

HEALTH_METRICS: Final[tuple[MetricSpec, ...]] = (
    EXPORTER_UP,
    EXPORTER_SCRAPE_DURATION,
    EXPORTER_UNMAPPED_FAMILIES,
    EXPORTER_INEXACT_BUCKETS,
    EXPORTER_LAST_SCRAPE_ERROR,
)

# --- what the client sees: ``inferwatch proxy`` in front of an engine's HTTP API ---------------
# Own names (``llm_client_*``), never the engine's: a fleet with both never counts a request twice,
# and a dashboard or SLO picks one side or the other explicitly.
LABEL_ESTIMATED: Final = "estimated"
"""``true`` when the proxy counted the tokens itself (the response carried no usage)."""

CLIENT_TIME_TO_FIRST_TOKEN: Final = histogram_spec(
    "client_time_to_first_token",
    "llm_client_time_to_first_token_seconds",
    "seconds",
    "Per request, measured at inferwatch proxy: from the request's arrival to the first response chunk "
    "that carries generated content (what the client waits; the engine's own TTFT plus the API server, "
    "tokenizer, detokenizer and the network between them).",
    BUCKETS_TTFT,
)
CLIENT_CHUNK_GAP: Final = histogram_spec(
    "client_chunk_gap",
    "llm_client_chunk_gap_seconds",
    "seconds",
    "Every gap between consecutive content chunks of a streamed response, at the proxy (a chunk may carry "
    "several tokens: a stall the user sees, not a per-token latency).",
    BUCKETS_TPOT,
)
CLIENT_TIME_PER_OUTPUT_TOKEN: Final = histogram_spec(
    "client_time_per_output_token",
    "llm_client_time_per_output_token_seconds",
    "seconds",
    "Per streamed request at the proxy: (duration - TTFT) / (output tokens - 1).",
    BUCKETS_TPOT,
)
CLIENT_REQUEST_DURATION: Final = histogram_spec(
    "client_request_duration",
    "llm_client_request_duration_seconds",
    "seconds",
    "Per request at the proxy: from its arrival to the last byte of the response (or the client going away).",
    BUCKETS_REQUEST_DURATION,
)
CLIENT_REQUESTS: Final = MetricSpec(
    "client_requests",
    "llm_client_requests_total",
    Kind.COUNTER,
    "",
    "Generation requests finished at the proxy, by outcome: stop, length, abort (the client went away "
    "before the end; the upstream request was cancelled) or error (an error status, the upstream failed "
    "or timed out, or the stream was cut).",
    labels=(LABEL_OUTCOME, LABEL_TENANT),
)
CLIENT_PROMPT_TOKENS: Final = MetricSpec(
    "client_prompt_tokens",
    "llm_client_prompt_tokens_total",
    Kind.COUNTER,
    "tokens",
    "Prompt tokens of the requests through the proxy, from the response's usage (estimated=false) or "
    "counted by the proxy (estimated=true).",
    labels=(LABEL_ESTIMATED, LABEL_TENANT),
)
CLIENT_GENERATION_TOKENS: Final = MetricSpec(
    "client_generation_tokens",
    "llm_client_generation_tokens_total",
    Kind.COUNTER,
    "tokens",
    "Generated tokens of the requests through the proxy, from the response's usage (estimated=false) or "
    "counted by the proxy, one per content chunk (estimated=true).",
    labels=(LABEL_ESTIMATED, LABEL_TENANT),
)
CLIENT_METRICS: Final[tuple[MetricSpec, ...]] = (
    CLIENT_TIME_TO_FIRST_TOKEN,
    CLIENT_CHUNK_GAP,
    CLIENT_TIME_PER_OUTPUT_TOKEN,
    CLIENT_REQUEST_DURATION,
    CLIENT_REQUESTS,
    CLIENT_PROMPT_TOKENS,
    CLIENT_GENERATION_TOKENS,
)
"""What ``inferwatch proxy`` serves on its /metrics (with engine and model labels)."""
CLIENT_COUNTERPARTS: Final[dict[str, MetricSpec]] = {
    TIME_TO_FIRST_TOKEN.key: CLIENT_TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN.key: CLIENT_TIME_PER_OUTPUT_TOKEN,
    REQUEST_DURATION.key: CLIENT_REQUEST_DURATION,
    REQUESTS.key: CLIENT_REQUESTS,
}
"""Engine-side metric key -> the proxy's measurement of the same thing (SLOs ``measured_at: proxy``)."""

ALL_METRICS: Final[tuple[MetricSpec, ...]] = CANONICAL_METRICS + HEALTH_METRICS + CLIENT_METRICS + GPU_METRICS
HISTOGRAMS: Final[tuple[MetricSpec, ...]] = tuple(m for m in CANONICAL_METRICS if m.kind is Kind.HISTOGRAM)
LATENCY_HISTOGRAMS: Final[tuple[MetricSpec, ...]] = tuple(m for m in HISTOGRAMS if m.unit == "seconds")


def metric_by_key(key: str) -> MetricSpec:
    """Look a canonical metric up by its configuration key (``time_to_first_token``)."""
    for spec in ALL_METRICS:
        if spec.key == key:
            return spec
    known = ", ".join(s.key for s in ALL_METRICS)
    raise KeyError(f"unknown canonical metric {key!r}; known: {known}")


@dataclass(frozen=True)
class Vocabulary:
    """The canonical vocabulary as configured: extra bucket boundaries for SLO thresholds.

    Pass an instance explicitly to whatever renders or checks canonical histograms; the default has
    no extra boundaries.
    """

    extra_boundaries: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def with_boundaries(self, metric: MetricSpec, bounds: Iterable[float]) -> Vocabulary:
        """Return a vocabulary where ``metric``'s layout also contains ``bounds``."""
        if metric.kind is not Kind.HISTOGRAM:
            raise ValueError(f"{metric.key} is not a histogram; it has no buckets")
        merged = dict(self.extra_boundaries)
        clean = []
        for b in bounds:
            fb = float(b)
            if not math.isfinite(fb) or fb <= 0:
                raise ValueError(f"bucket boundary for {metric.key} must be a positive number, got {b!r}")
            clean.append(fb)
        merged[metric.key] = tuple(sorted(set(merged.get(metric.key, ())) | set(clean)))
        return Vocabulary(merged)

    def buckets(self, metric: MetricSpec) -> tuple[float, ...]:
        """The canonical finite boundaries of ``metric`` (``+Inf`` is implied)."""
        extra = self.extra_boundaries.get(metric.key, ())
        # the proxy's measurement of a latency takes the extra boundaries of the engine-side one, so
        # that one threshold setting serves an SLO measured at either side
        for engine_key, client in CLIENT_COUNTERPARTS.items():
            if client is metric:
                extra = (*extra, *self.extra_boundaries.get(engine_key, ()))
        if not extra:
            return metric.buckets
        return tuple(sorted(set(metric.buckets) | set(extra)))

    def le_strings(self, metric: MetricSpec) -> tuple[str, ...]:
        """The ``le`` label values of ``metric`` in order, ``+Inf`` last."""
        return (*(format_le(b) for b in self.buckets(metric)), "+Inf")
