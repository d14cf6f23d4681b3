"""One LLM request as the collector stores it, engine-neutral.

The field names of the timing and token columns are the canonical vocabulary's metric keys
(``time_to_first_token``, ``request_queue``…), so a stored request and a metric series speak the
same words. Times are seconds; ``start_time``/``end_time`` are UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Column names: the store's public SQL contract, spelled in the core (re-exported for the collector).
from inferwatch.core.schema import CACHED_TOKENS as CACHED_TOKENS
from inferwatch.core.schema import DECODE as DECODE
from inferwatch.core.schema import E2E as E2E
from inferwatch.core.schema import GENERATION_TOKENS as GENERATION_TOKENS
from inferwatch.core.schema import LATENCY_FIELDS as LATENCY_FIELDS
from inferwatch.core.schema import PREFILL as PREFILL
from inferwatch.core.schema import PROMPT_TOKENS as PROMPT_TOKENS
from inferwatch.core.schema import QUEUE as QUEUE
from inferwatch.core.schema import TPOT as TPOT
from inferwatch.core.schema import TTFT as TTFT


@dataclass
class RequestRecord:
    """One finished LLM request (one sequence: the two samples of an ``n=2`` request are two records)."""

    trace_id: str
    """32 lowercase hex digits."""
    span_id: str
    """16 lowercase hex digits."""
    engine: str
    """canonical engine name (``vllm``, ``tgi``, ``trtllm``) or ``genai`` for generic GenAI spans."""
    start_time: datetime
    end_time: datetime
    request_id: str | None = None
    model: str | None = None
    instance: str | None = None
    """the emitting process (``service.instance.id``, else host/pid)."""
    service: str | None = None
    time_to_first_token: float | None = None
    ttft_derived: bool = False
    """True when TTFT was reconstructed (TGI has no TTFT attribute)."""
    time_per_output_token: float | None = None
    request_duration: float | None = None
    request_queue: float | None = None
    request_prefill: float | None = None
    request_decode: float | None = None
    prompt_tokens: int | None = None
    generation_tokens: int | None = None
    prefix_cache_hit_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    n: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    lora_adapter: str | None = None
    tenant: str | None = None
    """who sent the request, as ``inferwatch proxy`` names it (the API key's keyed hash, or a header's value)."""
    attributes: dict[str, Any] = field(default_factory=dict)
    """every span attribute not mapped to a column (OTLP values as JSON)."""


def tpot(decode: float | None, completion_tokens: int | None) -> float | None:
    """Time per output token: decode / (tokens - 1); 0 for single-token outputs (OTel's definition)."""
    if decode is None or completion_tokens is None:
        return None
    if completion_tokens <= 1:
        return 0.0
    return decode / (completion_tokens - 1)
