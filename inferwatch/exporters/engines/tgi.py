"""Hugging Face Text Generation Inference (v3 router, metrics-exporter-prometheus 0.15.3).

Source: the TGI catalog (``tgi.md`` §1.2–1.8, §4). TGI's ``/metrics`` has no ``_total`` suffixes,
no model label, geometric ``le`` strings with float noise, families in arbitrary order and an empty
body until the first request. The model comes from ``GET /info``; the KV-cache capacity is not
exposed anywhere, so the ``max_batch_total_tokens`` option (:class:`TgiOptions`) must give it to
turn ``tgi_batch_current_max_tokens`` into a usage ratio.
"""

from __future__ import annotations

from pydantic import Field, JsonValue

from inferwatch.core import vocabulary as V
from inferwatch.core.engines import tgi as tgi_facts
from inferwatch.exporters.mapping import (
    EngineAdapter,
    EngineFacts,
    EngineOptions,
    EngineSession,
    Row,
    TranslateContext,
    info_key,
)
from inferwatch.exporters.samples import Snapshot
from inferwatch.exporters.textparse import ParsedText

# err label -> outcome. validation/template failures are client errors (HTTP 422) that never
# reached the engine, like vLLM's HTTP 400 rejections, which leave no vllm: series: not counted.
FAILURE_REASON: dict[str, str | None] = {
    "overloaded": V.OUTCOME_ERROR,  # 429, the concurrency semaphore was full
    "incomplete": V.OUTCOME_ERROR,  # 500, stream ended without a final token
    "generation": V.OUTCOME_ERROR,  # 424, a shard RPC failed
    "dropped": V.OUTCOME_ABORT,  # the client went away
    "validation": None,
    "template": None,
    "*": V.OUTCOME_ERROR,
}

ROWS: tuple[Row, ...] = (
    Row(V.REQUEST_DURATION, ("tgi_request_duration",)),
    Row(V.REQUEST_QUEUE, ("tgi_request_queue_duration",)),
    Row(
        V.TIME_PER_OUTPUT_TOKEN,
        ("tgi_request_mean_time_per_token_duration",),
        note="[tgi: approximate, TGI's mean time per token = inference time / generated tokens, "
        "so it includes the prefill.]",
    ),
    Row(
        V.INTER_TOKEN_LATENCY,
        ("tgi_batch_inference_duration",),
        match={"method": "decode"},
        note="[tgi: approximate, one observation per decode step of the whole batch.]",
    ),
    Row(
        V.REQUEST_PROMPT_TOKENS,
        ("tgi_request_input_length",),
        note="[tgi: recorded at validation, once per 1024-token continuation chunk.]",
    ),
    Row(V.REQUEST_GENERATION_TOKENS, ("tgi_request_generated_tokens",)),
    Row(
        V.REQUESTS,
        ("tgi_request_success",),
        const={V.LABEL_OUTCOME: V.OUTCOME_STOP},
        note="[tgi: every successful request counts as outcome=stop (TGI does not tell stop from "
        "length); validation and template failures (HTTP 422) are not counted.]",
    ),
    Row(
        V.REQUESTS,
        ("tgi_request_failure",),
        {"err": V.LABEL_OUTCOME},
        values={"err": FAILURE_REASON},
    ),
    Row(V.PROMPT_TOKENS, ("tgi_request_input_length_sum",)),
    Row(V.GENERATION_TOKENS, ("tgi_request_generated_tokens_sum",)),
    Row(
        V.SPEC_DECODE_ACCEPTED_TOKENS,
        ("tgi_request_skipped_tokens_sum",),
        note="[tgi: extra tokens accepted per step by Medusa/n-gram speculation.]",
    ),
    Row(V.REQUESTS_RUNNING, ("tgi_batch_current_size",)),
    Row(V.REQUESTS_WAITING, ("tgi_queue_size",)),
)

CURRENT_MAX_TOKENS = "tgi_batch_current_max_tokens"


IGNORED = frozenset(
    {
        "tgi_request_count",  # over-counts (chat +2, completions +1 per prompt)
        "tgi_request_validation_duration",
        "tgi_request_inference_duration",
        "tgi_request_max_new_tokens",
        "tgi_batch_next_size",
        "tgi_batch_concat",
        "tgi_batch_inference_count",
        "tgi_batch_inference_success",
        "tgi_batch_inference_failure",
        "tgi_batch_forward_duration",
        "tgi_batch_decode_duration",
        "tgi_batch_filter_duration",
        "tgi_batch_concat_duration",
        "tgi_batch_max_total_tokens",
    }
)


class TgiOptions(EngineOptions):
    """A TGI target's options."""

    max_batch_total_tokens: int | None = Field(
        None,
        gt=0,
        description="KV-cache capacity in tokens (TGI exports it nowhere; its router logs "
        '"Setting max batch total tokens to N"), to derive the KV-cache usage ratio.',
    )


class TgiSession(EngineSession):
    """A TGI target: the configured KV capacity turns the running batch's token slots into a usage ratio."""

    Options = TgiOptions

    def __init__(self, adapter: EngineAdapter, options: TgiOptions) -> None:
        super().__init__(adapter, options)
        self.options = options

    def extend(self, parsed: ParsedText, ctx: TranslateContext, snap: Snapshot) -> None:
        """KV-usage proxy from the configured capacity."""
        capacity = self.options.max_batch_total_tokens
        if not capacity:
            return
        snap.add_value(V.KV_CACHE_CAPACITY, ctx.key({}), float(capacity))
        for _, value in parsed.get(CURRENT_MAX_TOKENS):
            snap.add_value(V.KV_CACHE_USAGE, ctx.key({}), value / float(capacity))
        snap.notes[V.KV_CACHE_USAGE] = (
            "[tgi: approximate, KV slots reserved by the running batch / configured max_batch_total_tokens.]"
        )


def hook(parsed: ParsedText, ctx: TranslateContext, snap: Snapshot) -> None:
    """The info series from ``/info``."""
    if ctx.facts.version or ctx.facts.model:
        info = {V.LABEL_MAX_CONCURRENCY: ctx.facts.max_concurrency or ""}
        snap.set_value(V.ENGINE_INFO, info_key(ctx, info), 1.0)


def claims_info(body: JsonValue) -> bool:
    """``GET /info`` is TGI's when it names a model or the text-generation router."""
    return isinstance(body, dict) and ("model_id" in body or body.get("router") == "text-generation-router")


def parse_info(body: JsonValue) -> EngineFacts:
    """``GET /info`` -> model id, version and the concurrency limit."""
    if not isinstance(body, dict):
        return EngineFacts()
    limit = body.get("max_concurrent_requests")
    return EngineFacts(
        version=str(body["version"]) if body.get("version") else None,
        model=str(body["model_id"]) if body.get("model_id") else None,
        max_concurrency=str(limit) if limit is not None else None,
    )


ADAPTER = EngineAdapter(
    name=V.ENGINE_TGI,
    rows=ROWS,
    prefixes=("tgi_",),
    unsupported=tgi_facts.PROFILE.unsupported,
    ignored=IGNORED,
    extra_samples=(CURRENT_MAX_TOKENS,),
    hook=hook,
    hook_metrics=(V.KV_CACHE_USAGE, V.KV_CACHE_CAPACITY, V.ENGINE_INFO),
    info_path="/info",
    parse_info=parse_info,
    detect_markers=("tgi_",),
    claims_info=claims_info,
    session=TgiSession,
)
