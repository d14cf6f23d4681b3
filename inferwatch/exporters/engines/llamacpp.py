"""llama.cpp's HTTP server (``llama-server --metrics``), three shapes of its ``/metrics``.

Sources (ggml-org/llama.cpp; the fixtures' ``SOURCE.md`` say what each settled):

* before the move to ``tools/``: ``examples/server/server.cpp`` at
  61e588abcc3e418681e9528b46d61f5b23225fe2, with ``kv_cache_usage_ratio`` and ``kv_cache_tokens``;
* ``tools/server/server.cpp`` at aa6192d38defc9a5d9fb2987413f71b18f214270: the KV gauges gone,
  ``n_tokens_max`` added;
* after the metrics rework: ``tools/server/server-context.cpp`` at
  001d906a6d86e2490e394361e7cc6f478b100088 and ``server_task_result_metrics::to_metrics`` in
  ``tools/server/server-task.cpp``: ``prompt_tokens_cached_total``, the speculative-decoding
  counters, ``n_busy_slots_per_decode`` a gauge.

Every family has the ``llamacpp:`` prefix and no label at all, not even the model: the model, the
build and the slot count come from ``GET /props`` (or ``/v1/models``). Families are translated by
meaning, not by their TYPE line: ``n_tokens_max`` (a maximum) and ``n_busy_slots_per_decode`` (a
ratio) are TYPE counter in the older shapes and are not canonical counters.
"""

from __future__ import annotations

from pydantic import JsonValue

from inferwatch.core import vocabulary as V
from inferwatch.core.engines import llamacpp as llamacpp_facts
from inferwatch.exporters.mapping import (
    EngineAdapter,
    EngineFacts,
    Row,
    TranslateContext,
    family_of,
    first,
    info_key,
)
from inferwatch.exporters.samples import Snapshot
from inferwatch.exporters.textparse import ParsedText

PREFIX = "llamacpp:"
PROMPT_TOKENS_TOTAL = "llamacpp:prompt_tokens_total"
PROMPT_TOKENS_CACHED_TOTAL = "llamacpp:prompt_tokens_cached_total"
PROMPT_SECONDS_TOTAL = "llamacpp:prompt_seconds_total"
TOKENS_PREDICTED_TOTAL = "llamacpp:tokens_predicted_total"
TOKENS_PREDICTED_SECONDS_TOTAL = "llamacpp:tokens_predicted_seconds_total"
N_DECODE_TOTAL = "llamacpp:n_decode_total"
N_TOKENS_MAX = "llamacpp:n_tokens_max"
N_BUSY_SLOTS_PER_DECODE = "llamacpp:n_busy_slots_per_decode"
PROMPT_TOKENS_SECONDS = "llamacpp:prompt_tokens_seconds"
PREDICTED_TOKENS_SECONDS = "llamacpp:predicted_tokens_seconds"
REQUESTS_PROCESSING = "llamacpp:requests_processing"
REQUESTS_DEFERRED = "llamacpp:requests_deferred"
KV_CACHE_USAGE_RATIO = "llamacpp:kv_cache_usage_ratio"
KV_CACHE_TOKENS = "llamacpp:kv_cache_tokens"
SPEC_DRAFT_TOKENS_TOTAL = "llamacpp:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED_TOKENS_TOTAL = "llamacpp:spec_decode_num_accepted_tokens_total"
SPEC_DRAFTS_TOTAL = "llamacpp:spec_decode_num_drafts_total"
SPEC_ACCEPTED_PER_POS_TOTAL = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"

PROPS_PATH = "/props"
MODELS_OWNER = "llamacpp"
"""``owned_by`` of every ``/v1/models`` entry llama-server lists."""

ROWS: tuple[Row, ...] = (
    Row(V.GENERATION_TOKENS, (TOKENS_PREDICTED_TOTAL,)),
    Row(
        V.INTER_TOKEN_LATENCY,
        (TOKENS_PREDICTED_SECONDS_TOTAL, TOKENS_PREDICTED_TOTAL),
        sum_only=True,
        note="[llamacpp: approximate, each slot's generation time summed over generated tokens; no buckets.]",
    ),
    Row(V.REQUESTS_RUNNING, (REQUESTS_PROCESSING,)),
    Row(
        V.REQUESTS_WAITING,
        (REQUESTS_DEFERRED,),
        note="[llamacpp: requests deferred because every slot was busy.]",
    ),
    Row(
        V.KV_CACHE_USAGE,
        (KV_CACHE_USAGE_RATIO,),
        note="[llamacpp: used KV cells / --ctx-size; builds before the KV gauges were removed.]",
    ),
    Row(
        V.PREFIX_CACHE_HIT_TOKENS,
        (PROMPT_TOKENS_CACHED_TOTAL,),
        note="[llamacpp: prompt tokens reused from the slot's cache (cache_prompt).]",
    ),
)

_IGNORED_NAMES = frozenset(
    {
        PROMPT_SECONDS_TOTAL,  # summed over prompt tokens, no request count (see the profile)
        N_DECODE_TOTAL,  # llama_decode() calls, no canonical place
        N_TOKENS_MAX,  # TYPE counter in every shape, but a maximum
        N_BUSY_SLOTS_PER_DECODE,  # TYPE counter before the rework, but a ratio
        PROMPT_TOKENS_SECONDS,  # throughput since the previous scrape
        PREDICTED_TOKENS_SECONDS,
        KV_CACHE_TOKENS,  # token count over sequences, not a capacity
        SPEC_DRAFTS_TOTAL,  # verification steps, no canonical place
        SPEC_ACCEPTED_PER_POS_TOTAL,
    }
)
IGNORED = _IGNORED_NAMES | {family_of(n) for n in _IGNORED_NAMES}

NOTE_PROMPT_UNCACHED = (
    "[llamacpp: before the metrics rework, prompt tokens evaluated only: those reused from the slot's cache "
    "are not counted.]"
)
NOTE_PROMPT_ALL = "[llamacpp: prompt tokens evaluated + prompt tokens reused from the cache.]"
NOTE_QUERIED = "[llamacpp: every prompt token is looked up in the slot's cache (cache_prompt, on by default).]"


def _total(parsed: ParsedText, name: str) -> float | None:
    got = first(parsed, ADAPTER, name)
    return sum(v for _, v in got) if got else None


def hook(parsed: ParsedText, ctx: TranslateContext, snap: Snapshot) -> None:
    """Prompt tokens (evaluated + cached where the cache is counted) and the info series from ``/props``."""
    evaluated = _total(parsed, PROMPT_TOKENS_TOTAL)
    if evaluated is not None:
        cached = _total(parsed, PROMPT_TOKENS_CACHED_TOTAL)
        if cached is None:
            snap.add_value(V.PROMPT_TOKENS, ctx.key({}), evaluated)
            snap.notes[V.PROMPT_TOKENS] = NOTE_PROMPT_UNCACHED
        else:
            snap.add_value(V.PROMPT_TOKENS, ctx.key({}), evaluated + cached)
            snap.notes[V.PROMPT_TOKENS] = NOTE_PROMPT_ALL
            snap.add_value(V.PREFIX_CACHE_QUERIED_TOKENS, ctx.key({}), evaluated + cached)
            snap.notes[V.PREFIX_CACHE_QUERIED_TOKENS] = NOTE_QUERIED
    # speculative decoding: since the metrics rework the server prints its counters as 0 without a draft
    # model (the b11312 capture); they come through once it has drafted, absent rather than a made-up zero
    drafted = _total(parsed, SPEC_DRAFT_TOKENS_TOTAL)
    if drafted:
        snap.add_value(V.SPEC_DECODE_DRAFT_TOKENS, ctx.key({}), drafted)
        accepted = _total(parsed, SPEC_ACCEPTED_TOKENS_TOTAL)
        if accepted is not None:
            snap.add_value(V.SPEC_DECODE_ACCEPTED_TOKENS, ctx.key({}), accepted)
    if ctx.facts.version or ctx.facts.model:
        # prompt caching: each slot reuses its previous prompt's prefix (cache_prompt defaults to true)
        info = {V.LABEL_MAX_CONCURRENCY: ctx.facts.max_concurrency or "", V.LABEL_PREFIX_CACHING: V.TRUE}
        snap.set_value(V.ENGINE_INFO, info_key(ctx, info), 1.0)


def _text(value: JsonValue) -> str | None:
    return str(value) if isinstance(value, str | int) and str(value) else None


def parse_info(body: JsonValue) -> EngineFacts:
    """``GET /props`` (or ``/v1/models``) -> model, build and slot count.

    The model is ``model_alias``, else ``model_path``: the id ``/v1/models`` gives, so the exporter,
    the proxy and the collector name it alike."""
    if not isinstance(body, dict):
        return EngineFacts()
    data = body.get("data")
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return EngineFacts(model=_text(data[0].get("id")))
    return EngineFacts(
        version=_text(body.get("build_info")),
        model=_text(body.get("model_alias")) or _text(body.get("model_path")),
        max_concurrency=_text(body.get("total_slots")),
    )


def claims_info(body: JsonValue) -> bool:
    """``/props`` is llama-server's when it has its slot count and generation settings."""
    if not isinstance(body, dict):
        return False
    if "total_slots" in body and "default_generation_settings" in body:
        return True
    data = body.get("data")
    return isinstance(data, list) and any(isinstance(m, dict) and m.get("owned_by") == MODELS_OWNER for m in data)


ADAPTER = EngineAdapter(
    name=V.ENGINE_LLAMACPP,
    rows=ROWS,
    prefixes=(PREFIX,),
    unsupported=llamacpp_facts.PROFILE.unsupported,
    ignored=IGNORED,
    extra_samples=(
        PROMPT_TOKENS_TOTAL,
        PROMPT_TOKENS_CACHED_TOTAL,
        SPEC_DRAFT_TOKENS_TOTAL,
        SPEC_ACCEPTED_TOKENS_TOTAL,
    ),
    hook=hook,
    hook_metrics=(
        V.PROMPT_TOKENS,
        V.PREFIX_CACHE_QUERIED_TOKENS,
        V.SPEC_DECODE_DRAFT_TOKENS,
        V.SPEC_DECODE_ACCEPTED_TOKENS,
        V.ENGINE_INFO,
    ),
    info_path=PROPS_PATH,
    parse_info=parse_info,
    detect_markers=(PREFIX,),
    claims_info=claims_info,
)
