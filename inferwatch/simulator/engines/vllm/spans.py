"""vLLM's ``llm_request`` span (``vllm.tracing.otel``), one per finished sequence."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import SpanKind

from inferwatch.simulator.base import SimulatedEngine, ns, parent_context
from inferwatch.simulator.scheduler import Finish, Sequence

SCOPE = "vllm.tracing.otel"
SPAN_NAME = "llm_request"


def open_spans(engine: SimulatedEngine) -> None:
    """vLLM's tracer (when the engine exports spans)."""
    engine.open_spans(SCOPE, {"vllm.instrumenting_module_name": "vllm.llm_engine", "vllm.process_id": engine.pid})


def emit_span(
    engine: SimulatedEngine, seq: Sequence, request_id: str, headers: Any, params: dict[str, Any] | None
) -> None:
    """vLLM's ``llm_request`` span for one finished sequence (aborted ones get none)."""
    sink = engine.spans
    if sink is None or seq.finish in (Finish.ABORT, Finish.ERROR) or seq.first_token is None:
        return
    params = params or {}
    attrs: dict[str, Any] = {
        "gen_ai.request.id": request_id,
        "gen_ai.usage.prompt_tokens": seq.prompt_tokens,
        "gen_ai.usage.completion_tokens": seq.generated,
        "gen_ai.latency.time_to_first_token": seq.ttft or 0.0,
        "gen_ai.latency.e2e": seq.e2e,
        "gen_ai.latency.time_in_queue": seq.queue_time,
        "gen_ai.latency.time_in_model_prefill": seq.prefill_time,
        "gen_ai.latency.time_in_model_decode": seq.decode_time,
        "gen_ai.latency.time_in_model_inference": seq.prefill_time + seq.decode_time,
    }
    # vLLM sets the optional request attributes only when they are truthy.
    for key, value in (
        ("gen_ai.request.top_p", params.get("top_p", 1.0)),
        ("gen_ai.request.max_tokens", seq.max_tokens),
        ("gen_ai.request.temperature", params.get("temperature", 1.0)),
        ("gen_ai.request.n", 1),
    ):
        if value:
            attrs[key] = value
    ctx = parent_context(headers) if headers is not None else None
    span = sink.tracer.start_span(
        SPAN_NAME, context=ctx, kind=SpanKind.SERVER, start_time=ns(seq.arrival), attributes=attrs
    )
    span.end(end_time=ns(seq.finished_at or seq.arrival))
