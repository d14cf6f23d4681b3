"""vLLM (V1 engine, 0.33 names, with the aliases of earlier releases).

Source: the vLLM catalog (``vllm.md`` §1.2–1.10): ``vllm/v1/metrics/loggers.py`` of the 0.33.0
wheel, the deprecation table and the alias map; verified against a real 0.32.0 capture
(``tests/fixtures/engines/vllm/0.32.0-cpu``). Every core family carries ``model_name`` and
``engine`` (the data-parallel rank, which becomes ``dp_rank``). Names may arrive as ``vllm_…``
(Ray backend, OpenMetrics underscore escaping).
"""

from __future__ import annotations

from collections.abc import Iterable

from inferwatch.core import vocabulary as V
from inferwatch.core.engines import vllm as vllm_facts
from inferwatch.exporters.mapping import EngineAdapter, Row, TranslateContext, first, info_key, version_info
from inferwatch.exporters.samples import Snapshot
from inferwatch.exporters.textparse import ParsedText

PREFIX = "vllm:"
L = {"model_name": V.LABEL_MODEL, "engine": V.LABEL_DP_RANK}

FINISHED_REASON = {
    "stop": V.OUTCOME_STOP,
    "length": V.OUTCOME_LENGTH,
    "abort": V.OUTCOME_ABORT,
    "error": V.OUTCOME_ERROR,
    "repetition": V.OUTCOME_STOP,  # stopped by the repetition detector: a normal stop
}

ROWS: tuple[Row, ...] = (
    Row(V.TIME_TO_FIRST_TOKEN, ("vllm:time_to_first_token_seconds",), L),
    Row(V.TIME_PER_OUTPUT_TOKEN, ("vllm:request_time_per_output_token_seconds",), L),
    # The old vllm:time_per_... name was the per-output ITL histogram until 0.12 (same buckets).
    Row(V.INTER_TOKEN_LATENCY, ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), L),
    Row(V.REQUEST_DURATION, ("vllm:e2e_request_latency_seconds",), L),
    Row(V.REQUEST_QUEUE, ("vllm:request_queue_time_seconds", "vllm:time_in_queue_requests"), L),
    Row(V.REQUEST_PREFILL, ("vllm:request_prefill_time_seconds",), L),
    Row(V.REQUEST_DECODE, ("vllm:request_decode_time_seconds",), L),
    Row(V.REQUEST_PROMPT_TOKENS, ("vllm:request_prompt_tokens",), L),
    Row(V.REQUEST_GENERATION_TOKENS, ("vllm:request_generation_tokens",), L),
    Row(
        V.REQUESTS,
        ("vllm:request_success_total",),
        {**L, "finished_reason": V.LABEL_OUTCOME},
        values={"finished_reason": FINISHED_REASON},
    ),
    Row(V.PROMPT_TOKENS, ("vllm:prompt_tokens_total",), L),
    Row(V.GENERATION_TOKENS, ("vllm:generation_tokens_total",), L),
    Row(V.PREEMPTIONS, ("vllm:num_preemptions_total",), L),
    # gpu_prefix_cache_* until 0.11 (early V1 counted blocks, later tokens).
    Row(
        V.PREFIX_CACHE_QUERIED_TOKENS,
        ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        L,
    ),
    Row(V.PREFIX_CACHE_HIT_TOKENS, ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"), L),
    Row(V.SPEC_DECODE_DRAFT_TOKENS, ("vllm:spec_decode_num_draft_tokens_total",), L),
    Row(V.SPEC_DECODE_ACCEPTED_TOKENS, ("vllm:spec_decode_num_accepted_tokens_total",), L),
    Row(V.REQUESTS_RUNNING, ("vllm:num_requests_running",), L),
    Row(V.REQUESTS_WAITING, ("vllm:num_requests_waiting",), L),
    Row(V.KV_CACHE_USAGE, ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), L),
)

CACHE_CONFIG_INFO = "vllm:cache_config_info"
LORA_INFO = "vllm:lora_requests_info"
LORA_LISTS = ("running_lora_adapters", "waiting_lora_adapters")
RUNNING_GAUGE = "vllm:num_requests_running"

# Known vLLM families that carry no canonical signal (or one we derive elsewhere).
IGNORED = frozenset(
    {
        "vllm:estimated_flops_per_gpu",
        "vllm:estimated_read_bytes_per_gpu",
        "vllm:estimated_write_bytes_per_gpu",
        "vllm:num_requests_waiting_by_reason",
        "vllm:num_requests_kv_fetch_by_stage",
        "vllm:engine_sleep_state",
        "vllm:external_prefix_cache_queries",
        "vllm:external_prefix_cache_hits",
        "vllm:mm_cache_queries",
        "vllm:mm_cache_hits",
        "vllm:prompt_tokens_by_source",
        "vllm:prompt_tokens_cached",
        "vllm:prompt_tokens_cached_by_source",
        "vllm:admission_rejections",
        "vllm:corrupted_requests",
        "vllm:watermark_requests",
        "vllm:iteration_tokens",
        "vllm:iteration_tokens_total",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_params_n",
        "vllm:request_params_max_tokens",
        "vllm:request_inference_time_seconds",
        "vllm:request_num_preemptions",
        "vllm:request_prefill_kv_computed_tokens",
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "vllm:kv_block_lifetime_seconds",
        "vllm:kv_block_idle_before_evict_seconds",
        "vllm:kv_block_reuse_gap_seconds",
        "vllm:tool_call_parser_invocations",
        "vllm:sleep_mode_operation_duration_seconds",
        "vllm:sleep_mode_operations_in_flight",
        "vllm:rl_weight_update_operation_duration_seconds",
        "vllm:rl_weight_update_operations_in_flight",
        "vllm:websocket_connections_active",
        "vllm:websocket_connections",
        "vllm:websocket_connection_duration_seconds",
        "vllm:diffusion_num_denoising_steps",
        "vllm:diffusion_num_canvas_positions",
        "vllm:diffusion_num_committed_tokens",
        # V0 only
        "vllm:num_requests_swapped",
        "vllm:cpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_hit_rate",
        "vllm:cpu_prefix_cache_hit_rate",
        "vllm:model_forward_time_milliseconds",
        "vllm:model_execute_time_milliseconds",
        "vllm:avg_prompt_throughput_toks_per_s",
        "vllm:avg_generation_throughput_toks_per_s",
        "vllm:request_params_best_of",
        "vllm:spec_decode_draft_acceptance_rate",
        "vllm:spec_decode_efficiency",
        "vllm:spec_decode_num_emitted_tokens",
        "vllm:tokens",
    }
)


def aliases(name: str) -> Iterable[str]:
    """``vllm:x`` is also accepted as ``vllm_x``."""
    if name.startswith(PREFIX):
        yield "vllm_" + name[len(PREFIX) :]


def _bool(value: str | None) -> str | None:
    if value is None or value == "None":
        return None
    return V.TRUE if value.lower() == "true" else V.FALSE


def _num(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "None") else None
    except ValueError:
        return None


def _lora(parsed: ParsedText, ctx: TranslateContext, snap: Snapshot, models: set[str]) -> None:
    """``lora_requests_info`` -> ``LORA_ADAPTER_ACTIVE`` per adapter, and ``LORA_ADAPTERS_MAX``.

    vLLM keeps one series per (max_lora, running, waiting) tuple it ever reported, each valued with
    the time of its last update: the newest is the current one. The adapter lists are comma-joined
    names. In 0.32.0 (the captured release) both lists hold the same names, every adapter with requests
    either running or waiting (``LoRARequestStates.update_scheduler_stats`` fills both dicts in one
    loop, with counts that the join drops): the union is what is known, not whether an adapter's
    requests run or wait.
    The gauge has no ``model_name`` and no ``engine``, so it applies to every model served."""
    newest: tuple[dict[str, str], float] | None = None
    for labels, value in first(parsed, ADAPTER, LORA_INFO):
        if newest is None or value > newest[1]:
            newest = (dict(labels), value)
    if newest is None:
        return
    current = newest[0]
    max_lora = _num(current.get("max_lora"))
    names = dict.fromkeys(n.strip() for label in LORA_LISTS for n in current.get(label, "").split(","))
    for model in sorted(models):
        base = {V.LABEL_MODEL: model} if model else {}
        if max_lora is not None:
            snap.set_value(V.LORA_ADAPTERS_MAX, ctx.key(dict(base)), max_lora)
        for name in names:
            if name:
                snap.set_value(V.LORA_ADAPTER_ACTIVE, ctx.key({**base, V.LABEL_LORA_ADAPTER: name}), 1.0)


def hook(parsed: ParsedText, ctx: TranslateContext, snap: Snapshot) -> None:
    """``cache_config_info`` -> ``KV_CACHE_CAPACITY`` and ``ENGINE_INFO``; ``lora_requests_info`` ->
    the LoRA gauges (:func:`_lora`).

    The info gauge has config fields as labels and ``engine`` but no ``model_name``; it applies to
    every model that the same engine rank serves.
    """
    models_by_rank: dict[str | None, set[str]] = {}
    for labels, _ in first(parsed, ADAPTER, RUNNING_GAUGE):
        d = dict(labels)
        models_by_rank.setdefault(d.get("engine"), set()).add(d.get("model_name", ""))
    all_models = set().union(*models_by_rank.values()) if models_by_rank else {""}
    _lora(parsed, ctx, snap, all_models)
    for labels, _ in first(parsed, ADAPTER, CACHE_CONFIG_INFO):
        cfg = dict(labels)
        rank = cfg.get("engine")
        models = models_by_rank.get(rank, all_models) if rank is not None else all_models
        blocks, block_size = _num(cfg.get("num_gpu_blocks")), _num(cfg.get("block_size"))
        capacity = blocks * block_size if blocks is not None and block_size is not None else None
        if capacity is None:
            capacity = _num(cfg.get("kv_cache_size_tokens"))
        concurrency = cfg.get("kv_cache_max_concurrency")
        info = {
            V.LABEL_BLOCK_SIZE: cfg.get("block_size", ""),
            V.LABEL_GPU_MEMORY_UTILIZATION: cfg.get("gpu_memory_utilization", ""),
            V.LABEL_PREFIX_CACHING: _bool(cfg.get("enable_prefix_caching")) or "",
            V.LABEL_KV_CACHE_DTYPE: cfg.get("cache_dtype", ""),
            V.LABEL_MAX_CONCURRENCY: "" if concurrency in (None, "None") else str(concurrency),
        }
        for model in sorted(models):
            base = {V.LABEL_MODEL: model} if model else {}
            if rank is not None:
                base[V.LABEL_DP_RANK] = rank
            if capacity is not None:
                snap.add_value(V.KV_CACHE_CAPACITY, ctx.key(dict(base)), capacity)
            snap.set_value(V.ENGINE_INFO, info_key(ctx, {**base, **info}), 1.0)


ADAPTER = EngineAdapter(
    name=V.ENGINE_VLLM,
    rows=ROWS,
    prefixes=(PREFIX, "vllm_"),
    unsupported=vllm_facts.PROFILE.unsupported,
    ignored=IGNORED,
    extra_samples=(CACHE_CONFIG_INFO, LORA_INFO),
    hook=hook,
    hook_metrics=(V.KV_CACHE_CAPACITY, V.LORA_ADAPTER_ACTIVE, V.LORA_ADAPTERS_MAX, V.ENGINE_INFO),
    aliases=aliases,
    info_path="/version",
    parse_info=version_info,
    detect_markers=("vllm:", "\nvllm_"),
)
