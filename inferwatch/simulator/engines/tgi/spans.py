"""TGI's request trace (tgi.md §3.3), emitted when ``engine.spans`` is set.

The handler span (``generate``, ``generate_stream`` or ``chat_completions``; INTERNAL; child of an
incoming ``traceparent``, honoured even when its sampled flag is off) with the Debug-format timing
strings, ``parameters`` and ``seed``; below it Infer ``generate`` or ``async_stream``, Infer
``generate_stream``, ``validate`` → ``validate_input`` → ``tokenize``, and ``schedule`` → ``append``,
``queued`` and the ``infer`` spans, each with a ``send_generation`` child.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from inferwatch.simulator.base import SimulatedEngine, ns, parent_context
from inferwatch.simulator.engines.tgi.protocol import (
    COMPUTE_TYPE,
    GENERATION_ERROR,
    Call,
    finish_reason,
    generated_text,
    rust_debug,
    rust_debug_opt,
    rust_duration,
    timings,
    token,
)
from inferwatch.simulator.scheduler import Finish, Sequence

SCOPE = "opentelemetry-otlp"
SERVICE_NAME = "text-generation-inference.router"
MAX_INFER_SPANS = 64
SITES: dict[str, tuple[str, str, int]] = {
    "generate": ("router/src/server.rs", "text_generation_router::server", 261),
    "generate_stream": ("router/src/server.rs", "text_generation_router::server", 464),
    "chat_completions": ("router/src/server.rs", "text_generation_router::server", 1156),
    "compat_generate": ("router/src/server.rs", "text_generation_router::server", 125),
    "async_stream": ("router/src/server.rs", "text_generation_router::server", 555),
    "infer.generate": ("router/src/infer/mod.rs", "text_generation_router::infer", 244),
    "infer.generate_stream": ("router/src/infer/mod.rs", "text_generation_router::infer", 99),
    "apply_chat_template": ("router/src/infer/mod.rs", "text_generation_router::infer", 226),
    "validate": ("router/src/validation.rs", "text_generation_router::validation", 203),
    "validate_input": ("router/src/validation.rs", "text_generation_router::validation", 132),
    "tokenize": ("router/src/validation.rs", "text_generation_router::validation", 104),
    "schedule": ("backends/v3/src/backend.rs", "text_generation_router_v3::backend", 78),
    "append": ("backends/v3/src/queue.rs", "text_generation_router_v3::queue", 75),
    "queued": ("backends/v3/src/queue.rs", "text_generation_router_v3::queue", 228),
    "infer.admit": ("backends/v3/src/queue.rs", "text_generation_router_v3::queue", 427),
    "infer.step": ("backends/v3/src/backend.rs", "text_generation_router_v3::backend", 277),
    "send_generation": ("backends/v3/src/backend.rs", "text_generation_router_v3::backend", 433),
    "send_error": ("backends/v3/src/backend.rs", "text_generation_router_v3::backend", 543),
}
US = 1_000


def incoming_context(headers: Mapping[str, str]) -> Context | None:
    """TGI's ``trace_context_middleware``: only ``traceparent``; AlwaysOn, so the parent is used as sampled."""
    value = next((v for k, v in headers.items() if k.lower() == "traceparent"), None)
    if not value:
        return None
    ctx = parent_context({"traceparent": value})
    if ctx is None:
        return None
    sc = trace.get_current_span(ctx).get_span_context()
    if not sc.is_valid:
        return None
    remote = SpanContext(sc.trace_id, sc.span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(remote), Context())


class TgiSpans:
    """Writes TGI's request traces to the engine's span sink (nothing when spans are off)."""

    def __init__(self, engine: SimulatedEngine, rng: random.Random) -> None:
        self.engine = engine
        self.rng = rng
        """the router's generator: thread ids and seeds come from one stream, as before the split."""
        self._entries = 0
        engine.open_spans(SCOPE, {"service.name": SERVICE_NAME})

    def _span(
        self,
        name: str,
        site: str,
        parent: Context,
        start: int,
        end: int,
        attrs: Mapping[str, Any] | None = None,
        events: tuple[tuple[str, str, str, int], ...] = (),
        error: bool = False,
        thread: int = 1,
    ) -> Context:
        sink = self.engine.spans
        assert sink is not None
        filepath, namespace, lineno = SITES[site]
        end = max(end, start)
        busy = min(end - start, 8 * US + (end - start) // 50)
        attributes: dict[str, Any] = {
            "code.filepath": filepath,
            "code.namespace": namespace,
            "code.lineno": lineno,
            "thread.id": thread,
            "thread.name": "tokio-runtime-worker",
            "busy_ns": busy,
            "idle_ns": end - start - busy,
        }
        attributes.update(attrs or {})
        span = sink.tracer.start_span(
            name, context=parent, kind=SpanKind.INTERNAL, start_time=start, attributes=attributes
        )
        for message, level, target, at in events:
            span.add_event(message, {"level": level, "target": target}, timestamp=at)
        if error:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=end)
        return trace.set_span_in_context(span, Context())

    def _generation(self, seq: Sequence, call: Call, i: int, last: bool) -> str:
        tok = token(self.engine, seq, i, call)
        tokens = (
            f"Tokens {{ ids: [{tok['id']}], logprobs: [{tok['logprob']!r}], texts: [{rust_debug(tok['text'])}], "
            f"is_special: [{rust_debug(tok['special'])}] }}"
        )
        generated = "None"
        if last:
            reason = {"length": "Length", "eos_token": "EosToken", "stop_sequence": "StopSequence"}[
                finish_reason(seq, call)
            ]
            text = rust_debug(generated_text(self.engine, seq, call))
            generated = (
                f"Some(GeneratedText {{ text: {text}, generated_tokens: {seq.generated}, "
                f"finish_reason: {reason}, seed: {rust_debug_opt(call.seed)} }})"
            )
        return (
            f"Generation {{ request_id: {call.entry_id}, prefill_tokens: None, tokens: Some({tokens}), "
            f"generated_text: {generated}, top_tokens: [] }}"
        )

    def _handler_spans(
        self,
        call: Call,
        t0: int,
        end: int,
        attrs: dict[str, Any],
        events: tuple[tuple[str, str, str, int], ...],
        error: bool,
        thread: int,
    ) -> Context:
        """compat_generate (``/``), the handler span and the spans down to Infer ``generate_stream``."""
        if call.compat:
            compat_end = t0 + 60 * US if call.stream else end + 5 * US
            self._span(
                "compat_generate",
                "compat_generate",
                Context(),
                t0 - 20 * US,
                compat_end,
                {"default_return_full_text": True, "compute_type": f'ComputeType("{COMPUTE_TYPE}")'},
                thread=thread,
            )
        start = t0 - (60 * US if call.chat else 0)
        attrs = {"parameters": call.params.debug(), **attrs}
        h = self._span(call.handler, call.handler, call.parent or Context(), start, end, attrs, events, error, thread)
        if call.chat:
            self._span("apply_chat_template", "apply_chat_template", h, start + 5 * US, t0 - 5 * US, thread=thread)
        if call.stream:
            mid = self._span("async_stream", "async_stream", h, t0 + 5 * US, end - 10 * US, thread=thread)
        else:
            mid = self._span("generate", "infer.generate", h, t0 + 5 * US, end - 10 * US, thread=thread)
        return self._span("generate_stream", "infer.generate_stream", mid, t0 + 10 * US, end - 15 * US, thread=thread)

    def _validate_spans(self, parent: Context, t0: int, queued: int, error: str | None, thread: int) -> None:
        ev = ((error, "ERROR", "text_generation_router::infer", queued),) if error else ()
        val = self._span(
            "validate", "validate", parent, t0 + 15 * US, queued, events=ev, error=bool(error), thread=thread
        )
        vi = self._span("validate_input", "validate_input", val, t0 + 20 * US, queued - 5 * US, thread=thread)
        self._span("tokenize", "tokenize", vi, t0 + 25 * US, queued - 10 * US, thread=thread)

    def emit_rejected(self, call: Call, message: str) -> None:
        """The trace of a request that failed validation (handler and validate carry the error)."""
        if self.engine.spans is None:
            return
        now = ns(self.engine.clock.now())
        t0 = now - 150 * US
        thread = self.rng.randrange(2, 18)
        ev = ((message, "ERROR", "text_generation_router::infer", now),)
        gs = self._handler_spans(call, t0, now + 30 * US, {}, ev, True, thread)
        self._validate_spans(gs, t0, now, message, thread)

    def emit(self, seq: Sequence, call: Call) -> None:
        """TGI's request trace for a finished sequence (success or generation error)."""
        if self.engine.spans is None or seq.finish not in (Finish.STOP, Finish.LENGTH, Finish.ERROR):
            return
        self._entries += 1
        call.entry_id = self._entries
        t = timings(seq)
        queued = ns(seq.arrival)
        t0 = queued - t.validation
        start = queued + t.queue
        end = start + t.inference
        h_end = end + 45 * US
        thread = self.rng.randrange(2, 18)
        server = "text_generation_router::server"
        failed = seq.finish is Finish.ERROR
        if failed:
            attrs: dict[str, Any] = {}
            events: tuple[tuple[str, str, str, int], ...] = ((GENERATION_ERROR, "ERROR", server, end + 35 * US),)
        else:
            attrs = {
                "total_time": rust_duration(t.total),
                "validation_time": rust_duration(t.validation),
                "queue_time": rust_duration(t.queue),
                "inference_time": rust_duration(t.inference),
                "time_per_token": rust_duration(t.per_token),
                "seed": rust_debug_opt(call.seed),
            }
            events = (("Success", "INFO", server, end + 40 * US),)
        gs = self._handler_spans(call, t0, h_end, attrs, events, failed, thread)
        self._validate_spans(gs, t0, queued - 2 * US, None, thread)
        sch = self._span("schedule", "schedule", gs, queued, end + 25 * US, thread=thread)
        self._span("append", "append", sch, queued, queued + 4 * US, thread=thread)
        self._span("queued", "queued", sch, queued, start, thread=thread)
        if failed:
            inf = self._span("infer", "infer.admit", sch, start, start + 20 * US, thread=thread)
            ev = ((GENERATION_ERROR, "ERROR", "text_generation_router_v3::backend", start + 10 * US),)
            self._span(
                "send_error", "send_error", inf, start + 5 * US, start + 15 * US, events=ev, error=True, thread=thread
            )
            return
        times = [ns(x) for x in seq.token_times]
        n = len(times)
        keep = range(n) if n <= MAX_INFER_SPANS else [*range(MAX_INFER_SPANS // 2), *range(n - MAX_INFER_SPANS // 2, n)]
        for k in keep:
            begin = start if k == 0 else times[k - 1] + 35 * US
            inf = self._span(
                "infer", "infer.admit" if k == 0 else "infer.step", sch, begin, times[k] + 30 * US, thread=thread
            )
            self._span(
                "send_generation",
                "send_generation",
                inf,
                times[k] + 2 * US,
                times[k] + 12 * US,
                {"generation": self._generation(seq, call, k, k == n - 1)},
                thread=thread,
            )
