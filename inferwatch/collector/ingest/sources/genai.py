"""Any other span following the OpenTelemetry GenAI conventions (normalization.md §1.4) → one record.

Claimed when the span has ``gen_ai.operation.name``, token usage (current ``input_tokens``/
``output_tokens`` or the pre-v1.27 ``prompt_tokens``/``completion_tokens``) or ``gen_ai.request.model``.
Operations that are not a model call (tool execution, agent creation/invocation, which wrap model
calls that have spans of their own) are skipped. These are usually CLIENT spans, so e2e is the span's
duration as the caller saw it; TPOT is derived as (e2e − TTFT) / (output tokens − 1) when the span
reports ``gen_ai.response.time_to_first_chunk`` (streaming).
"""

from __future__ import annotations

from typing import Final

from inferwatch.collector.ingest.sources.shared import (
    MODEL_KEYS,
    Column,
    SpanView,
    base_record,
    first_of,
    integer,
    model_of,
    split,
    string_list,
    text,
)
from inferwatch.collector.store import record as R

NAME: Final = "genai"
OPERATION: Final = "gen_ai.operation.name"
PROVIDER: Final = "gen_ai.provider.name"
SYSTEM: Final = "gen_ai.system"
"""renamed to ``gen_ai.provider.name`` in v1.37.0."""
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
ERROR_TYPE: Final = "error.type"
INPUT_TOKENS: Final = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
OUTPUT_TOKENS: Final = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
"""current name first, then the pre-v1.27 one."""
REQUEST_IDS: Final = ("gen_ai.response.id", "gen_ai.request.id")
REQUEST_MODEL: Final = "gen_ai.request.model"
CLAIM_KEYS: Final = frozenset({OPERATION, *INPUT_TOKENS, *OUTPUT_TOKENS, REQUEST_MODEL})
NOT_MODEL_CALLS: Final = frozenset({"execute_tool", "create_agent", "invoke_agent", "invoke_workflow"})
LORA_ADAPTER: Final = "inferwatch.lora_adapter"
"""The request's LoRA adapter, which no GenAI convention names (``inferwatch proxy`` sets it)."""
TENANT: Final = "inferwatch.tenant"
"""Who sent the request, as ``inferwatch proxy`` names it (a keyed hash of the API key, or a header's value)."""

COLUMNS: Final[dict[str, Column]] = {
    "gen_ai.usage.cache_read.input_tokens": Column(R.CACHED_TOKENS, "int"),
    "gen_ai.response.time_to_first_chunk": Column(R.TTFT, "float"),
    "gen_ai.request.choice.count": Column("n", "int"),
    "gen_ai.request.max_tokens": Column("max_tokens", "int"),
    "gen_ai.request.temperature": Column("temperature", "float"),
    LORA_ADAPTER: Column("lora_adapter", "str"),
    TENANT: Column("tenant", "str"),
}


def claims(view: SpanView) -> bool:
    return not CLAIM_KEYS.isdisjoint(view.attrs)


def to_record(view: SpanView) -> R.RequestRecord | None:
    attrs = view.attrs
    if text(attrs, OPERATION) in NOT_MODEL_CALLS:
        return None
    inputs = first_of(attrs, *INPUT_TOKENS)
    outputs = first_of(attrs, *OUTPUT_TOKENS)
    request_id = first_of(attrs, *REQUEST_IDS)
    mapped = [*COLUMNS, *MODEL_KEYS, PROVIDER, SYSTEM, FINISH_REASONS, ERROR_TYPE]
    mapped += [k for k in (inputs, outputs, request_id) if k is not None]
    fields, rest = split(attrs, COLUMNS, frozenset(mapped))
    rec = base_record(view, text(attrs, PROVIDER) or text(attrs, SYSTEM) or NAME, rest, fields)
    rec.request_id = text(attrs, request_id) if request_id else None
    rec.prompt_tokens = integer(attrs, inputs) if inputs else None
    rec.generation_tokens = integer(attrs, outputs) if outputs else None
    rec.model = model_of(view)
    asked = text(attrs, REQUEST_MODEL)
    if asked is not None and asked != rec.model:
        rec.attributes[REQUEST_MODEL] = asked  # e.g. an alias the provider resolved
    reasons = string_list(attrs.get(FINISH_REASONS))
    rec.finish_reason = reasons[0] if reasons else None
    if len(reasons) > 1:
        rec.attributes[FINISH_REASONS] = reasons
    rec.error = text(attrs, ERROR_TYPE) or view.error_text()
    rec.request_duration = view.duration
    if rec.time_to_first_token is not None and (rec.n or 1) == 1:
        rec.time_per_output_token = R.tpot(
            max(0.0, rec.request_duration - rec.time_to_first_token), rec.generation_tokens
        )
    return rec
