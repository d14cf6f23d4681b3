"""SGLang (``--enable-metrics``): the ``sglang:`` families of three metrics layouts, with their renames.

Sources (sgl-project/sglang), each pinned to a release on PyPI:

* sglang 0.5.4 (and 0.5.4.post1): ``python/sglang/srt/metrics/collector.py`` at
  93d04878cfb9b08645fae7b11bd340ee33b34acf, the same file as in the 0.5.4 wheel;
* sglang 0.5.9: ``python/sglang/srt/observability/metrics_collector.py`` and
  ``observability/scheduler_metrics_mixin.py`` at 44cedc2b9c7dd31d9acae4498ea4fa0d3665feed, whose
  declarations are the 0.5.9 wheel's ``srt/metrics/collector.py`` and ``srt/managers/scheduler_metrics_mixin.py``;
* sglang 0.5.23 (the newest release read; its wheel, sha256
  00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937, records no commit):
  ``srt/observability/metrics_collector.py``, ``observability/http_request_metrics.py``,
  ``observability/cpu_monitor.py``, ``managers/scheduler_components/metrics_reporter.py`` and
  ``entrypoints/http_server.py``.

Fixtures: ``tests/fixtures/engines/sglang/`` (``SOURCE.md`` of each case).

Two kinds of series. The tokenizer manager's (requests, tokens, TTFT, inter-token latency, e2e and,
from 0.5.22, the per-request time per output token) carry ``model_name`` (``engine_type`` too in later
releases; ``is_streaming`` on the request and token counters, TTFT, TPOT and e2e by 0.5.19, summed
away here). The scheduler's (running, queue, KV use and capacity, queue time, retractions) carry
``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank`` (``moe_ep_rank`` by 0.5.9) and ``dp_rank``
when data parallelism is on. Only the first attention-TP rank of each data-parallel group records the
batch gauges, unless ``--enable-metrics-for-all-schedulers``: then every TP rank of the group reports
the same batch again (and in 0.5.23 every rank emits the start-up constants, ``max_total_num_tokens``
among them). Those copies are not additive, so for each series the adapter keeps the lowest
(pp, tp, moe-ep) rank of its group and drops the rest; ``dp_rank`` is kept as ``V.LABEL_DP_RANK`` and
``engine_type`` (unified | prefill | decode) as ``V.LABEL_ROLE``, also on the tokenizer series of
releases that did not label them (a server has one role). With ``--enable-priority-scheduling``
the scheduler's queue gauges hold the total under ``priority=""`` and a breakdown under
``priority="<n>"``: only the total is read.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import JsonValue

from inferwatch.core import vocabulary as V
from inferwatch.core.engines import sglang as sglang_facts
from inferwatch.exporters.mapping import (
    Accept,
    EngineAdapter,
    EngineFacts,
    Row,
    TranslateContext,
    first,
    translate_rows,
)
from inferwatch.exporters.samples import SeriesKey, Snapshot, series_key
from inferwatch.exporters.textparse import Labels, ParsedText

PREFIX = "sglang:"
MODEL_INFO_PATH = "/model_info"
"""the model's facts (sglang 0.5.9 and later; 0.5.4 serves them only as the older ``/get_model_info``, which
later releases keep but log as deprecated on every call)."""
MODEL_INFO_KEYS = ("model_path", "tokenizer_path", "is_generation")

MODEL_NAME = "model_name"
ENGINE_TYPE = "engine_type"
DP_RANK = "dp_rank"
PRIORITY = "priority"
"""the scheduler gauges' per-priority breakdown label (the total has it empty)."""
RANK_LABELS = ("pp_rank", "tp_rank", "moe_ep_rank")
"""labels of the copies of one data-parallel group's series (most significant first)."""

L = {MODEL_NAME: V.LABEL_MODEL, ENGINE_TYPE: V.LABEL_ROLE, DP_RANK: V.LABEL_DP_RANK}
# engine_type's values (unified | prefill | decode) are the canonical roles' (V.ROLES): kept as they are
# (0.5.23's --enable-pd-role-switch labels a switching server "dynamic", passed on as it is). The tokenizer's
# per-request priority label (--enable-priority-scheduling) partitions requests: summed away.

# Tokenizer-manager families (one series per model and engine_type: no ranks).
TTFT = "sglang:time_to_first_token_seconds"
INTER_TOKEN = "sglang:inter_token_latency_seconds"
E2E = "sglang:e2e_request_latency_seconds"
TPOT = "sglang:request_time_per_output_token_seconds"
PROMPT_HISTOGRAM = "sglang:prompt_tokens_histogram"
GENERATION_HISTOGRAM = "sglang:generation_tokens_histogram"
REQUESTS_TOTAL = "sglang:num_requests_total"
ABORTED_TOTAL = "sglang:num_aborted_requests_total"
PROMPT_TOTAL = "sglang:prompt_tokens_total"
GENERATION_TOTAL = "sglang:generation_tokens_total"
CACHED_TOTAL = "sglang:cached_tokens_total"

# Scheduler families (per rank; see the module docstring).
QUEUE_TIME = "sglang:queue_time_seconds"
RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
USED_TOKENS = "sglang:num_used_tokens"
MAX_TOTAL_TOKENS = "sglang:max_total_num_tokens"
RETRACTED_TOTAL = "sglang:num_retracted_requests_total"
LORA_SLOTS_TOTAL = "sglang:lora_pool_slots_total"


ROWS: tuple[Row, ...] = (
    Row(V.TIME_TO_FIRST_TOKEN, (TTFT,), L),
    Row(
        V.INTER_TOKEN_LATENCY,
        (INTER_TOKEN,),
        L,
        note="[sglang: each decode output adds its token count to one bucket and its whole interval to the "
        "sum, so the count is output tokens and sum/count the mean time per token]",
    ),
    Row(V.REQUEST_DURATION, (E2E,), L),
    # sglang 0.5.22 and later: (finished - first token) / (completion tokens - 1), observed for requests that
    # finished by stop or length with more than one token, never on a prefill instance; before, absent.
    Row(V.TIME_PER_OUTPUT_TOKEN, (TPOT,), L),
    Row(V.REQUEST_PROMPT_TOKENS, (PROMPT_HISTOGRAM,), L),
    Row(V.REQUEST_GENERATION_TOKENS, (GENERATION_HISTOGRAM,), L),
    Row(
        V.REQUESTS,
        (REQUESTS_TOTAL,),
        L,
        const={V.LABEL_OUTCOME: V.OUTCOME_STOP},
        note="[sglang: every finished request counts as outcome=stop (SGLang does not tell stop from length)]",
    ),
    Row(
        V.REQUESTS,
        (ABORTED_TOTAL,),
        L,
        const={V.LABEL_OUTCOME: V.OUTCOME_ABORT},
    ),
    Row(V.PROMPT_TOKENS, (PROMPT_TOTAL,), L),
    Row(V.GENERATION_TOKENS, (GENERATION_TOTAL,), L),
    # Every prompt is matched against the radix cache, so the prompt tokens are the tokens looked up.
    Row(
        V.PREFIX_CACHE_QUERIED_TOKENS,
        (PROMPT_TOTAL,),
        L,
        note="[sglang: the prompt tokens of finished requests (each prompt is matched against the radix cache)]",
    ),
    # cache_source (device | host | storage_<backend> | total) is summed away: every source is a hit.
    Row(V.PREFIX_CACHE_HIT_TOKENS, (CACHED_TOTAL,), L),
)

HOOK_ROWS: tuple[Row, ...] = (
    Row(V.REQUEST_QUEUE, (QUEUE_TIME,), L),
    Row(V.REQUESTS_RUNNING, (RUNNING,), L),
    Row(V.REQUESTS_WAITING, (QUEUED,), L),
    # token_usage: the larger of the full and SWA pools' use (a Mamba pool is left out at 0.5.9; 0.5.23 takes
    # the largest of full, SWA and Mamba and rounds it to 2 decimals).
    Row(V.KV_CACHE_USAGE, (TOKEN_USAGE,), L),
    Row(
        V.PREEMPTIONS,
        (RETRACTED_TOTAL,),
        L,
        note="[sglang: retractions, SGLang's preemptions: when the KV pool runs out during decode, a running "
        "request's KV cache is freed and it goes back to the queue to be recomputed, as vLLM's recompute "
        "preemption does]",
    ),
    Row(V.LORA_ADAPTERS_MAX, (LORA_SLOTS_TOTAL,), L),
)

# Known SGLang families that carry no canonical signal (or one read elsewhere).
IGNORED = frozenset(
    {
        "sglang:num_so_requests",
        "sglang:num_retractions",
        "sglang:num_retracted_reqs",
        "sglang:num_retracted_input_tokens",
        "sglang:num_retracted_output_tokens",
        "sglang:num_paused_reqs",
        "sglang:pending_prealloc_token_usage",
        "sglang:swa_token_usage",
        "sglang:mamba_usage",
        "sglang:decode_sum_seq_lens",
        "sglang:gen_throughput",
        "sglang:num_grammar_queue_reqs",
        "sglang:num_running_reqs_offline_batch",
        "sglang:cache_hit_rate",
        "sglang:spec_accept_length",
        "sglang:spec_accept_rate",
        "sglang:num_prefill_prealloc_queue_reqs",
        "sglang:num_prefill_inflight_queue_reqs",
        "sglang:num_decode_prealloc_queue_reqs",
        "sglang:num_decode_transfer_queue_reqs",
        "sglang:num_bootstrap_failed_reqs",
        "sglang:num_transfer_failed_reqs",
        "sglang:num_prefill_retries",
        "sglang:kv_transfer_speed_gb_s",
        "sglang:kv_transfer_latency_ms",
        "sglang:kv_transfer_bootstrap_ms",
        "sglang:kv_transfer_alloc_ms",
        "sglang:kv_transfer_total_mb",
        "sglang:utilization",
        "sglang:max_running_requests_under_SLO",
        "sglang:engine_startup_time",
        "sglang:engine_load_weights_time",
        "sglang:new_token_ratio",
        "sglang:is_cuda_graph",
        "sglang:cuda_graph_passes",
        "sglang:num_unique_running_routing_keys",
        "sglang:routing_key_running_req_count",
        "sglang:routing_key_all_req_count",
        "sglang:lora_pool_slots_used",
        "sglang:lora_pool_utilization",
        "sglang:realtime_tokens",
        "sglang:gpu_execution_seconds",
        "sglang:forward_execution_seconds",
        "sglang:dp_cooperation_realtime_tokens",
        "sglang:dp_cooperation_gpu_execution_seconds",
        "sglang:prefill_delayer_wait_forward_passes",
        "sglang:prefill_delayer_wait_seconds",
        "sglang:prefill_delayer_outcomes",
        "sglang:cache_config_info",
        "sglang:per_stage_req_latency_seconds",
        "sglang:grammar_compilation_time_seconds",
        "sglang:num_grammar_cache_hit",
        "sglang:num_grammar_aborted",
        "sglang:num_grammar_timeout",
        "sglang:num_grammar",
        "sglang:grammar_schema_count",
        "sglang:grammar_ebnf_size",
        "sglang:grammar_tree_traversal_time_avg",
        "sglang:grammar_tree_traversal_time_max",
        "sglang:eplb_balancedness",
        "sglang:eplb_gpu_physical_count",
        "sglang:prefetched_tokens",
        "sglang:backuped_tokens",
        "sglang:prefetch_pgs",
        "sglang:backup_pgs",
        "sglang:prefetch_bandwidth",
        "sglang:backup_bandwidth",
        "sglang:eviction_duration_seconds",
        "sglang:evicted_tokens",
        "sglang:load_back_duration_seconds",
        "sglang:load_back_tokens",
        # later releases (0.5.10 to 0.5.23): memory and start-up constants, per-pool token counts, speculative
        # and P/D detail, scheduler time accounting, HiCache, the encoder, the HTTP middleware
        "sglang:context_len",
        "sglang:decode_deferred_kv_release",
        "sglang:decode_deferred_kv_release_seconds",
        "sglang:dp_attention_pairs",
        "sglang:dp_attention_steps",
        "sglang:dp_attention_sync_wait_seconds",
        "sglang:dp_attention_token_imbalance_ratio",
        "sglang:dp_attention_tokens",
        "sglang:dp_cooperation_forward_execution_seconds",
        "sglang:encoder_cache_entries",
        "sglang:encoder_cache_evictions",
        "sglang:encoder_cache_hit_files",
        "sglang:encoder_cache_hit_tokens",
        "sglang:encoder_cache_size_mb",
        "sglang:encoder_cache_total_files",
        "sglang:encoder_cache_total_tokens",
        "sglang:encoder_dp_pending_requests",
        "sglang:encoder_mm_items_per_batch",
        "sglang:encoder_mm_items_per_request",
        "sglang:encoder_model_forward_seconds",
        "sglang:encoder_preprocess_seconds",
        "sglang:encoder_queue_wait_seconds",
        "sglang:encoder_requests",
        "sglang:encoder_requests_received",
        "sglang:encoder_transfer_seconds",
        "sglang:estimated_flops_per_gpu",
        "sglang:estimated_read_bytes_per_gpu",
        "sglang:estimated_write_bytes_per_gpu",
        "sglang:failed_session_recoveries",
        "sglang:full_token_usage",
        "sglang:func_latency_seconds",
        "sglang:fwd_occupancy",
        "sglang:get_loads_duration_seconds",
        "sglang:gpu_overlap_wait_seconds",
        "sglang:graph_memory_usage_gb",
        "sglang:hicache_backup_bytes",
        "sglang:hicache_backup_dropped_tokens",
        "sglang:hicache_backup_duration_seconds",
        "sglang:hicache_backup_tokens",
        "sglang:hicache_dropped_tokens",
        "sglang:hicache_host_mamba_total_states",
        "sglang:hicache_host_mamba_used_states",
        "sglang:hicache_host_total_tokens",
        "sglang:hicache_host_used_tokens",
        "sglang:hicache_prefetch_aux_alloc_failed_tokens",
        "sglang:http_requests",
        "sglang:http_requests_active",
        "sglang:http_responses",
        "sglang:kv_available_tokens",
        "sglang:kv_cache_memory_usage_gb",
        "sglang:kv_evictable_tokens",
        "sglang:kv_used_tokens",
        "sglang:load_back_bytes",
        "sglang:mamba_available_tokens",
        "sglang:mamba_evictable_tokens",
        "sglang:mamba_used_tokens",
        "sglang:max_total_num_tokens_swa",
        "sglang:num_decode_deferred_kv_release_reqs",
        "sglang:num_decode_host_receive_queue_reqs",
        "sglang:num_decode_host_receive_reqs",
        "sglang:num_pages",
        "sglang:num_prefill_bootstrap_queue_reqs",
        "sglang:num_streaming_sessions",
        "sglang:page_size",
        "sglang:prealloc_full_token_usage",
        "sglang:prealloc_swa_token_usage",
        "sglang:prefill_effective_tokens",
        "sglang:process_cpu_seconds",
        "sglang:routing_keys_active",
        "sglang:scheduler_idle_seconds",
        "sglang:scheduler_process_cpu_seconds",
        "sglang:scheduler_stage_seconds",
        "sglang:spec_block_accept_length",
        "sglang:spec_cap_length",
        "sglang:spec_num_draft_tokens",
        "sglang:spec_num_steps",
        "sglang:spec_verify_calls",
        "sglang:startup_available_gpu_memory_gb",
        "sglang:startup_cuda_graph_time_seconds",
        "sglang:startup_latency_breakdown_seconds_max",
        "sglang:startup_time_seconds",
        "sglang:storage_prefetch_deferred_tokens",
        "sglang:storage_prefetch_hit_tokens",
        "sglang:storage_prefetch_unfulfilled_tokens",
        "sglang:streaming_session_held_tokens",
        "sglang:swa_available_tokens",
        "sglang:swa_evictable_tokens",
        "sglang:swa_used_tokens",
        "sglang:uncached_prompt_tokens_histogram",
        "sglang:weight_load_duration_seconds",
        "sglang:weight_memory_usage_gb",
    }
)


def _rank_of(labels: Labels) -> tuple[tuple[tuple[str, str], ...], tuple[int, ...]]:
    """(the series' group: its labels but the rank labels and ``le``, its rank tuple)."""
    group = []
    rank = dict.fromkeys(RANK_LABELS, 0)
    for name, value in labels:
        if name in rank:
            rank[name] = int(value) if value.isdigit() else 0
        elif name != "le":
            group.append((name, value))
    return tuple(sorted(group)), tuple(rank[n] for n in RANK_LABELS)


def _lowest_rank(samples: Iterable[tuple[Labels, float]]) -> Accept:
    """Accept only each group's lowest-rank copy (the other TP/PP ranks repeat the same batch)."""
    best: dict[tuple[tuple[str, str], ...], tuple[int, ...]] = {}
    for labels, _ in samples:
        group, rank = _rank_of(labels)
        if group not in best or rank < best[group]:
            best[group] = rank

    def accept(labels: Labels) -> bool:
        if dict(labels).get(PRIORITY):
            return False  # a per-priority share of the total under priority=""
        group, rank = _rank_of(labels)
        return best.get(group) == rank

    return accept


def _scheduler_rows(parsed: ParsedText, ctx: TranslateContext, snap: Snapshot) -> None:
    for row in HOOK_ROWS:
        name = row.sources[0]
        samples = parsed.samples.get(f"{name}_count" if row.metric.kind is V.Kind.HISTOGRAM else name)
        if samples:
            translate_rows(ADAPTER, (row,), parsed, ctx, snap, _lowest_rank(samples))


def _capacity(parsed: ParsedText, ctx: TranslateContext, snap: Snapshot) -> None:
    """``max_total_num_tokens`` -> ``KV_CACHE_CAPACITY``; before that gauge existed (the older layout),
    ``num_used_tokens / token_usage`` while the pool is in use (token_usage is that ratio).

    A capacity of 0 is the stats' default before the scheduler has sized its pool: left absent."""
    total = first(parsed, ADAPTER, MAX_TOTAL_TOKENS)
    if total:
        accept = _lowest_rank(total)
        for labels, value in total:
            if value > 0 and accept(labels):
                _add_capacity(ctx, snap, labels, float(value))
        return
    usage = {_rank_key(lbl): v for lbl, v in first(parsed, ADAPTER, TOKEN_USAGE)}
    used = first(parsed, ADAPTER, USED_TOKENS)
    accept = _lowest_rank(used)
    derived = False
    for labels, n in used:
        ratio = usage.get(_rank_key(labels), 0.0)
        if ratio > 0 and n > 0 and accept(labels):
            _add_capacity(ctx, snap, labels, float(round(n / ratio)))
            derived = True
    if derived:
        snap.notes[V.KV_CACHE_CAPACITY] = (
            "[sglang: before max_total_num_tokens, derived as num_used_tokens / token_usage while the pool is in use]"
        )


def _rank_key(labels: Labels) -> Labels:
    return tuple(sorted(labels))


def _add_capacity(ctx: TranslateContext, snap: Snapshot, labels: Labels, value: float) -> None:
    src = dict(labels)
    out = {V.LABEL_MODEL: src.get(MODEL_NAME, "")}
    if ENGINE_TYPE in src:
        out[V.LABEL_ROLE] = src[ENGINE_TYPE]
    if DP_RANK in src:
        out[V.LABEL_DP_RANK] = src[DP_RANK]
    snap.add_value(V.KV_CACHE_CAPACITY, ctx.key(out), value)


def _page_role(parsed: ParsedText) -> str | None:
    """The ``engine_type`` of the page's scheduler series: one server has one role."""
    roles = {dict(labels).get(ENGINE_TYPE) for labels, _ in first(parsed, ADAPTER, RUNNING)}
    role = roles.pop() if len(roles) == 1 else None
    return role or None


def _with_role(key: SeriesKey, role: str) -> SeriesKey:
    labels = dict(key)
    canonical = {name: value for name, value in labels.items() if name in V.LABEL_ORDER}
    extra = {name: value for name, value in labels.items() if name not in V.LABEL_ORDER}
    return series_key({**canonical, V.LABEL_ROLE: role}, extra)


def _fill_role(parsed: ParsedText, snap: Snapshot) -> None:
    """Before the tokenizer series had ``engine_type`` (0.5.4 to 0.5.10), give them the scheduler's: the
    same server's TTFT, e2e and token counts then split by role like its queue and KV series."""
    role = _page_role(parsed)
    if role is None:
        return
    for spec, values in list(snap.values.items()):
        for key in [k for k in values if V.LABEL_ROLE not in dict(k)]:
            snap.add_value(spec, _with_role(key, role), values.pop(key))
    for spec, histograms in list(snap.histograms.items()):
        for key in [k for k in histograms if V.LABEL_ROLE not in dict(k)]:
            snap.add_histogram(spec, _with_role(key, role), histograms.pop(key))


def hook(parsed: ParsedText, ctx: TranslateContext, snap: Snapshot) -> None:
    """The scheduler's rows with their rank copies dropped (:func:`_lowest_rank`), the KV capacity, and the
    server's role on the tokenizer series of releases that did not label them with it."""
    _scheduler_rows(parsed, ctx, snap)
    _capacity(parsed, ctx, snap)
    _fill_role(parsed, snap)


def claims_info(body: JsonValue) -> bool:
    """``/model_info`` is SGLang's when it names the model and tokenizer paths and says ``is_generation``."""
    return isinstance(body, dict) and all(key in body for key in MODEL_INFO_KEYS)


def parse_info(body: JsonValue) -> EngineFacts:
    """``GET /model_info`` -> the model as the series' ``model_name`` spells it.

    That label is ``--served-model-name``, which defaults to ``--model-path``; ``/model_info`` gives
    ``served_model_name`` from 0.5.23 on, only ``model_path`` before. It carries no engine version."""
    if not isinstance(body, dict):
        return EngineFacts()
    for key in ("served_model_name", "model_path"):
        value = body.get(key)
        if isinstance(value, str) and value:
            return EngineFacts(model=value)
    return EngineFacts()


ADAPTER = EngineAdapter(
    name=V.ENGINE_SGLANG,
    rows=ROWS,
    prefixes=(PREFIX,),
    unsupported=sglang_facts.PROFILE.unsupported,
    ignored=IGNORED,
    extra_samples=(MAX_TOTAL_TOKENS, USED_TOKENS),
    hook=hook,
    hook_rows=HOOK_ROWS,
    hook_metrics=(V.KV_CACHE_CAPACITY,),
    detect_markers=(PREFIX,),
    info_path=MODEL_INFO_PATH,
    parse_info=parse_info,
    claims_info=claims_info,
)
