"""vLLM's ``llm_request`` span (vllm.md §3.2) → one record per finished sequence.

vLLM emits one SERVER span per finished sequence from the scope ``vllm.tracing.otel``: with ``n=2`` two
spans share one ``gen_ai.request.id``. It uses the pre-v1.27 GenAI names (``gen_ai.usage.prompt_tokens``/
``completion_tokens``), its own ``gen_ai.latency.*`` breakdown in seconds, no model, no finish reason and
no status. Optional request parameters are set only when truthy, so a greedy request (temperature 0)
has no ``gen_ai.request.temperature`` and its record keeps ``temperature=None``.

Start-up spans (``Overall Loading``, ``Load weights``…, scopes ``vllm.*`` with ``code.*`` attributes,
vllm.md §3.3) are claimed and skipped.
"""

from __future__ import annotations

from typing import Final

from inferwatch.collector.ingest.sources import trtllm
from inferwatch.collector.ingest.sources.shared import Column, Rejected, SpanView, base_record, model_of, split
from inferwatch.collector.store import record as R
from inferwatch.core import vocabulary as V

NAME: Final = V.ENGINE_VLLM
SPAN_NAME: Final = "llm_request"
SCOPE: Final = "vllm.tracing.otel"
SCOPE_PREFIX: Final = "vllm."
LATENCY_PREFIX: Final = "gen_ai.latency."
GENAI_PREFIX: Final = "gen_ai."
REQUEST_ID: Final = "gen_ai.request.id"

COLUMNS: Final[dict[str, Column]] = {
    REQUEST_ID: Column("request_id", "str"),
    "gen_ai.response.model": Column("model", "str"),  # defined by vLLM, set only by the legacy V0 engine
    "gen_ai.latency.time_to_first_token": Column(R.TTFT, "float"),
    "gen_ai.latency.e2e": Column(R.E2E, "float"),
    "gen_ai.latency.time_in_queue": Column(R.QUEUE, "float"),
    "gen_ai.latency.time_in_model_prefill": Column(R.PREFILL, "float"),
    "gen_ai.latency.time_in_model_decode": Column(R.DECODE, "float"),
    "gen_ai.usage.prompt_tokens": Column(R.PROMPT_TOKENS, "int"),
    "gen_ai.usage.completion_tokens": Column(R.GENERATION_TOKENS, "int"),
    "gen_ai.request.n": Column("n", "int"),
    "gen_ai.request.max_tokens": Column("max_tokens", "int"),
    "gen_ai.request.temperature": Column("temperature", "float"),
}
"""vLLM's ``SpanAttributes`` → record fields; the rest (``time_in_model_inference``, ``top_p``…) stay attributes."""


def is_vllm_scope(view: SpanView) -> bool:
    return view.scope == SCOPE or view.scope.startswith(SCOPE_PREFIX)


def claims(view: SpanView) -> bool:
    """vLLM's scopes; elsewhere an ``llm_request`` with ``gen_ai.latency.*`` (or no ``gen_ai.*`` at all)
    that is not trtllm-serve's look-alike."""
    if is_vllm_scope(view):
        return True
    if view.name != SPAN_NAME or trtllm.claims(view):
        return False
    keys = view.attrs.keys()
    return any(k.startswith(LATENCY_PREFIX) for k in keys) or not any(k.startswith(GENAI_PREFIX) for k in keys)


def to_record(view: SpanView) -> R.RequestRecord | None:
    if view.name != SPAN_NAME:
        return None  # a start-up span
    fields, rest = split(view.attrs, COLUMNS)  # one walk: the columns, and the attributes kept as they are
    if fields.get("request_id") is None:
        raise Rejected("llm_request span without gen_ai.request.id")
    rec = base_record(view, NAME, rest, fields)
    rec.model = rec.model or model_of(view)
    rec.time_per_output_token = R.tpot(rec.request_decode, rec.generation_tokens)
    return rec
