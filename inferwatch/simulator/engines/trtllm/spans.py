"""OpenTelemetry: one SERVER span per finished request from the tracer ``trt.llm`` with the ``gen_ai.*``
attributes of trtllm.md §4.1, parented on the incoming ``traceparent``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import SpanKind

from inferwatch.simulator.base import SimulatedEngine, ns, parent_context
from inferwatch.simulator.engines.trtllm.catalog import FINISHED_REASON
from inferwatch.simulator.scheduler import Finish, Sequence

SCOPE = "trt.llm"
SPAN_NAME = "llm_request"
"""Unverified: the catalog only says the implementation was adapted from vLLM, whose span is ``llm_request``."""


@dataclass
class TrtllmRequest:
    """One user request (``n`` candidates) as the executor and the tracer see it."""

    executor_id: int
    seqs: list[Sequence]
    headers: Mapping[str, str] | None
    params: dict[str, Any]
    traced: bool = False


def open_spans(engine: SimulatedEngine) -> None:
    """The tracer ``trt.llm`` (when the engine exports spans)."""
    engine.open_spans(SCOPE, {})


def emit_span(engine: SimulatedEngine, req: TrtllmRequest) -> None:
    """``RequestOutput.do_tracing``: one span per finished request with enough perf metrics."""
    sink = engine.spans
    if sink is None or req.traced:
        return
    if any(s.finish is None for s in req.seqs):
        return
    req.traced = True
    seq = req.seqs[0]
    if seq.finish is Finish.ERROR or seq.first_token is None:
        return  # "Insufficient request metrics available; trace generation aborted."
    end = seq.last_token or seq.finished_at or seq.arrival
    params = req.params
    attrs: dict[str, Any] = {
        "gen_ai.request.temperature": 1.0 if params.get("temperature") is None else float(params["temperature"]),
        "gen_ai.request.top_p": 1.0 if params.get("top_p") is None else float(params["top_p"]),
        "gen_ai.request.top_k": int(params.get("top_k") or 0),
        "gen_ai.request.max_tokens": seq.max_tokens,
        "gen_ai.request.n": len(req.seqs),
        "gen_ai.request.id": req.executor_id,
        "gen_ai.usage.prompt_tokens": seq.prompt_tokens,
        "gen_ai.usage.completion_tokens": sum(s.generated for s in req.seqs),
        "gen_ai.latency.time_to_first_token": seq.ttft or 0.0,
        "gen_ai.latency.e2e": end - seq.arrival,
        "gen_ai.latency.time_in_queue": seq.queue_time,
        "gen_ai.response.finish_reasons": json.dumps([FINISHED_REASON.get(s.finish, "unknown") for s in req.seqs]),
    }
    ctx = parent_context(req.headers) if req.headers is not None else None
    span = sink.tracer.start_span(
        SPAN_NAME, context=ctx, kind=SpanKind.SERVER, start_time=ns(seq.arrival), attributes=attrs
    )
    span.end(end_time=ns(end))
