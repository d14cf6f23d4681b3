"""Triton Inference Server with the TensorRT-LLM C++ backend (``:8002/metrics``).

Source: the TensorRT-LLM catalog (``trtllm.md`` §3.1–3.2, §3.5): the backend's
``custom_metrics_reporter.cc`` (gauges pivoted by a category label) and Triton core's
``metrics.cc`` (``nv_inference_*`` counters in microseconds). Labels are ``model`` and ``version``.
In an ensemble deployment every composing model has its own ``nv_inference_*`` series: request
counters and durations are taken only for the TensorRT-LLM models (those with ``nv_trt_llm_*`` or
``nv_llm_*`` series); the opt-in first-response histogram is taken for whichever model has it
(usually ``ensemble``).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.core import vocabulary as V
from inferwatch.core.engines import triton as triton_facts
from inferwatch.exporters.mapping import EngineAdapter, Row, TranslateContext, info_key, translate_rows, version_info
from inferwatch.exporters.memo import derive
from inferwatch.exporters.samples import SeriesKey, Snapshot
from inferwatch.exporters.textparse import Labels, ParsedText

L = {"model": V.LABEL_MODEL}
REQUEST_METRICS = "nv_trt_llm_request_metrics"
KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
INPUT_TOKENS = "nv_llm_input_token_len"
OUTPUT_TOKENS = "nv_llm_output_token_len"
SUCCESS = "nv_inference_request_success"

ROWS: tuple[Row, ...] = (
    # running + waiting = active: "waiting" is active - scheduled, not the executor queue.
    Row(V.REQUESTS_RUNNING, (REQUEST_METRICS,), L, match={"request_type": "scheduled"}),
    Row(
        V.REQUESTS_WAITING,
        (REQUEST_METRICS,),
        L,
        match={"request_type": "waiting"},
        note="[triton: active - scheduled requests; the executor queue depth is not exported.]",
    ),
    Row(V.KV_CACHE_USAGE, (KV_BLOCKS,), L, match={"kv_cache_block_type": "fraction"}),
    Row(V.PROMPT_TOKENS, (f"{INPUT_TOKENS}_sum",), L),
    Row(V.GENERATION_TOKENS, (f"{OUTPUT_TOKENS}_sum",), L),
    Row(V.REQUEST_PROMPT_TOKENS, (INPUT_TOKENS,), L),
    Row(V.REQUEST_GENERATION_TOKENS, (OUTPUT_TOKENS,), L),
)

FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
# Triton creates it for every decoupled model: take the TensorRT-LLM model's when it has one,
# else the ensemble's (which also covers pre- and post-processing).
TTFT_ROWS: tuple[Row, ...] = (
    Row(
        V.TIME_TO_FIRST_TOKEN,
        (FIRST_RESPONSE,),
        L,
        divisor=1000.0,
        note="[triton: first response of the TensorRT-LLM model (else the ensemble), "
        "from Triton's opt-in histogram in ms.]",
    ),
)

# Applied by the hook to the TensorRT-LLM models only.
REQUEST_ROWS: tuple[Row, ...] = (
    Row(
        V.REQUESTS,
        (SUCCESS,),
        L,
        const={V.LABEL_OUTCOME: V.OUTCOME_STOP},
        note="[triton: successful requests count as outcome=stop.]",
    ),
    Row(
        V.REQUESTS,
        ("nv_inference_request_failure",),
        {**L, "reason": V.LABEL_OUTCOME},
        values={"reason": {"CANCELED": V.OUTCOME_ABORT, "*": V.OUTCOME_ERROR}},
    ),
    Row(
        V.REQUEST_DURATION,
        ("nv_inference_request_duration_us", SUCCESS),
        L,
        divisor=1e6,
        sum_only=True,
        note="[triton: sum and count only (no buckets): Triton reports cumulative microseconds.]",
    ),
    Row(
        V.REQUEST_QUEUE,
        ("nv_inference_queue_duration_us", SUCCESS),
        L,
        divisor=1e6,
        sum_only=True,
        note="[triton: Triton scheduler queue only, sum and count (no buckets).]",
    ),
)


IGNORED = frozenset(
    {
        "nv_trt_llm_runtime_memory_metrics",
        "nv_trt_llm_inflight_batcher_metrics",
        "nv_trt_llm_v1_metrics",
        "nv_trt_llm_general_metrics",
        "nv_trt_llm_disaggregated_serving_metrics",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
        "nv_inference_request_summary_us",
        "nv_inference_queue_summary_us",
        "nv_inference_compute_input_summary_us",
        "nv_inference_compute_infer_summary_us",
        "nv_inference_compute_output_summary_us",
    }
)


def _llm_models(parsed: ParsedText) -> set[str]:
    models = set()
    for name in (REQUEST_METRICS, KV_BLOCKS, f"{INPUT_TOKENS}_count", f"{OUTPUT_TOKENS}_count"):
        for labels, _ in parsed.get(name):
            models.add(dict(labels).get("model", ""))
    return models


@dataclass(frozen=True)
class HookLayout:
    """What the hook makes of a page's label sets alone, once per shape (:func:`derive`)."""

    llm_models: frozenset[str]
    """the models with TensorRT-LLM metrics (the request rows' filter, and its memo tag)."""
    filtered: bool
    """whether the first-response histogram is filtered to them (it has any of them)."""
    blocks: tuple[tuple[int, str, str], ...]
    """each KV block sample's position among :data:`KV_BLOCKS`'s, its model and block type."""
    concurrency: tuple[tuple[int, str], ...]
    """each ``request_type="max"`` sample's position among :data:`REQUEST_METRICS`'s, and its model."""
    keys: dict[str, SeriesKey]
    """each block model's series key."""


def _layout(parsed: ParsedText, ctx: TranslateContext) -> HookLayout:
    llm_models = _llm_models(parsed)
    ttft_models = {dict(lbl).get("model", "") for lbl, _ in parsed.get(f"{FIRST_RESPONSE}_count")}
    blocks = []
    for i, (labels, _) in enumerate(parsed.get(KV_BLOCKS)):
        d = dict(labels)
        blocks.append((i, d.get("model", ""), d.get("kv_cache_block_type", "")))
    concurrency = []
    for i, (labels, _) in enumerate(parsed.get(REQUEST_METRICS)):
        d = dict(labels)
        if d.get("request_type") == "max":
            concurrency.append((i, d.get("model", "")))
    keys = {model: ctx.key({V.LABEL_MODEL: model}) for _, model, _ in blocks}
    return HookLayout(frozenset(llm_models), bool(ttft_models & llm_models), tuple(blocks), tuple(concurrency), keys)


def hook(parsed: ParsedText, ctx: TranslateContext, snap: Snapshot) -> None:
    """Request counters for the TensorRT-LLM models, capacity and prefix hits from block gauges."""
    layout = derive(ctx.memo, hook, parsed, lambda: _layout(parsed, ctx))
    llm_models = layout.llm_models

    def accept(labels: Labels) -> bool:
        return dict(labels).get("model", "") in llm_models

    # the filter is the set of models: the memo keeps what it keeps per set (one set, page after page)
    translate_rows(ADAPTER, REQUEST_ROWS, parsed, ctx, snap, accept, ctx.memo, llm_models)
    translate_rows(ADAPTER, TTFT_ROWS, parsed, ctx, snap, accept if layout.filtered else None, ctx.memo, llm_models)

    block_samples = parsed.get(KV_BLOCKS)
    blocks: dict[str, dict[str, float]] = {}
    for i, model, kind in layout.blocks:
        blocks.setdefault(model, {})[kind] = block_samples[i][1]
    request_samples = parsed.get(REQUEST_METRICS)
    concurrency = {model: request_samples[i][1] for i, model in layout.concurrency}
    for model, kinds in sorted(blocks.items()):
        per = kinds.get("tokens_per")
        if per is None:
            continue
        if "max" in kinds:
            snap.add_value(V.KV_CACHE_CAPACITY, layout.keys[model], kinds["max"] * per)
        if "reused" in kinds:
            snap.add_value(V.PREFIX_CACHE_HIT_TOKENS, layout.keys[model], kinds["reused"] * per)
            snap.notes[V.PREFIX_CACHE_HIT_TOKENS] = "[triton: reused KV blocks x tokens per block.]"
    for model in sorted(llm_models):
        info = {V.LABEL_MODEL: model}
        if model in blocks and "tokens_per" in blocks[model]:
            info[V.LABEL_BLOCK_SIZE] = V.format_value(blocks[model]["tokens_per"]).removesuffix(".0")
        if model in concurrency:
            info[V.LABEL_MAX_CONCURRENCY] = V.format_value(concurrency[model]).removesuffix(".0")
        snap.set_value(V.ENGINE_INFO, info_key(ctx, info), 1.0)


ADAPTER = EngineAdapter(
    name=V.ENGINE_TRITON,
    rows=ROWS,
    prefixes=("nv_trt_llm_", "nv_llm_", "nv_inference_"),
    unsupported=triton_facts.PROFILE.unsupported,
    ignored=IGNORED,
    extra_samples=(KV_BLOCKS, REQUEST_METRICS, f"{INPUT_TOKENS}_count", f"{OUTPUT_TOKENS}_count"),
    hook=hook,
    hook_rows=REQUEST_ROWS + TTFT_ROWS,
    hook_metrics=(V.KV_CACHE_CAPACITY, V.PREFIX_CACHE_HIT_TOKENS, V.ENGINE_INFO),
    info_path="/v2",
    parse_info=version_info,
    detect_markers=("nv_trt_llm_", "nv_inference_"),
)
