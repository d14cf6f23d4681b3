"""trtllm-serve's request span (trtllm.md §4.1) → one record per span.

trtllm-serve's tracing was adapted from vLLM's: one SERVER span per request from the tracer ``trt.llm``
with vLLM's ``gen_ai.*`` names (old ``prompt_tokens``/``completion_tokens``), only TTFT, e2e and queue
latencies (plus ``kv_cache_transfer_time`` when disaggregated), ``top_k``, and
``gen_ai.response.finish_reasons``, one per candidate, as a list or a JSON-encoded string
(``'["stop"]'``). The span name is unverified upstream (``llm_request`` like vLLM's, as the simulator
uses), so the scope or the trtllm-only attributes identify it.

Unlike vLLM's, one span covers all ``n`` candidates: ``completion_tokens`` is their sum and the record
keeps the first candidate's finish reason (the full list stays in ``attributes`` when ``n`` > 1). There
is no prefill/decode split; TPOT is derived as (e2e − TTFT) / (tokens − 1) for single-candidate spans.
"""

from __future__ import annotations

from typing import Final

from inferwatch.collector.ingest.sources.shared import Column, SpanView, base_record, model_of, split, string_list
from inferwatch.collector.store import record as R
from inferwatch.core import vocabulary as V

NAME: Final = V.ENGINE_TRTLLM
SCOPE: Final = "trt.llm"
SPAN_NAME: Final = "llm_request"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
KV_CACHE_TRANSFER: Final = "gen_ai.latency.kv_cache_transfer_time"
RECORD_PREFIXES: Final = ("gen_ai.latency.", "gen_ai.usage.", "gen_ai.request.id")

COLUMNS: Final[dict[str, Column]] = {
    "gen_ai.request.id": Column("request_id", "str"),  # an int (the executor's request id)
    "gen_ai.response.model": Column("model", "str"),
    "gen_ai.latency.time_to_first_token": Column(R.TTFT, "float"),
    "gen_ai.latency.e2e": Column(R.E2E, "float"),
    "gen_ai.latency.time_in_queue": Column(R.QUEUE, "float"),
    "gen_ai.usage.prompt_tokens": Column(R.PROMPT_TOKENS, "int"),
    "gen_ai.usage.completion_tokens": Column(R.GENERATION_TOKENS, "int"),
    "gen_ai.request.n": Column("n", "int"),
    "gen_ai.request.max_tokens": Column("max_tokens", "int"),
    "gen_ai.request.temperature": Column("temperature", "float"),
}
"""trtllm-serve's ``SpanAttributes`` → record fields; ``top_k``, ``top_p`` and the KV transfer time stay attributes."""


def claims(view: SpanView) -> bool:
    if view.scope == SCOPE:
        return True
    return view.name == SPAN_NAME and (KV_CACHE_TRANSFER in view.attrs or FINISH_REASONS in view.attrs)


def to_record(view: SpanView) -> R.RequestRecord | None:
    attrs = view.attrs
    if not any(k.startswith(RECORD_PREFIXES) for k in attrs):
        return None  # another span of the tracer (e.g. the disaggregated orchestrator's handler spans)
    fields, rest = split(attrs, COLUMNS, frozenset({FINISH_REASONS}))
    rec = base_record(view, NAME, rest, fields)
    reasons = string_list(attrs.get(FINISH_REASONS))
    rec.finish_reason = reasons[0] if reasons else None
    if len(reasons) > 1:
        rec.attributes[FINISH_REASONS] = reasons
    rec.model = rec.model or model_of(view)
    if (rec.n or 1) == 1 and rec.request_duration is not None and rec.time_to_first_token is not None:
        rec.time_per_output_token = R.tpot(
            max(0.0, rec.request_duration - rec.time_to_first_token), rec.generation_tokens
        )
    return rec
