"""SGLang's request trace (``--enable-trace --otlp-traces-endpoint``), emitted when ``engine.spans`` is set.

Shape, as ``python/sglang/srt/observability/trace.py`` builds it (``TraceReqContext``; tracer
``"sglang server"``, resource ``service.name="sglang"``) for the stages of ``req_time_stats.py``:

* the root span ``"{role} Req {rid[:8]}"`` (role empty for a unified server, so the name starts
  with a space), child of an incoming ``traceparent``; attributes ``rid`` and ``module`` at start and,
  at the end, the GenAI attributes of ``make_span_attrs`` (``request_tracing.py``): usage (prompt,
  completion, cached tokens), ``gen_ai.request.*`` (id, max_tokens, top_p, temperature, top_k, n, only
  when set), ``gen_ai.response.model``, ``gen_ai.response.finish_reasons`` (a JSON list) and the
  ``gen_ai.latency.*`` the API server measures (TTFT, e2e, prefill, decode, inference; no queue time:
  the queue is the scheduler's ``prefill_waiting`` slice);
* one span per thread the request crosses, child of the root: ``"Tokenizer (host:… | pid:…)"`` with
  the ``tokenize`` and ``api_server_dispatch`` slices, ``"Scheduler [TP 0] (host:… | pid:…)"`` with
  ``request_process``, ``prefill_waiting``, ``prefill_forward``, ``decode_waiting`` and
  ``decode_forward`` (one ``decode_loop`` slice per decode step inside, attribute ``decode_ct``; the
  simulator keeps the first :data:`MAX_DECODE_LOOP_SPANS`); each
  first-level slice links to the one before it; a retraction is a ``retract`` event;
* trace and span ids of 64 random bits (``TraceCustomIdGenerator``), unless an incoming
  ``traceparent`` gives the trace id.
"""

from __future__ import annotations

import itertools
import json
import random
import zlib
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link, Span, Status, StatusCode

from inferwatch.simulator.base import SimulatedEngine, ns, parent_context
from inferwatch.simulator.scheduler import Finish, Sequence

MAX_DECODE_LOOP_SPANS = 64
"""``decode_loop`` slices kept per request (the first ones): SGLang writes one per decode step, which at the
built-in load's rates fills the span processor's queue and drops root spans (as TGI's ``infer`` spans are
capped in its simulator)."""
SCOPE = "sglang server"
SERVICE_NAME = "sglang"
MODULE = "sglang::request"
TOKENIZER_LABEL = "Tokenizer"
SCHEDULER_LABEL = "Scheduler"


class SglangIdGenerator(RandomIdGenerator):
    """``TraceCustomIdGenerator``: 64-bit random trace and span ids (the trace id's upper half is zero)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def _bits(self) -> int:
        value = 0
        while value == 0:
            value = self.rng.getrandbits(64)
        return value

    def generate_span_id(self) -> int:
        return self._bits()

    def generate_trace_id(self) -> int:
        return self._bits()


def open_spans(engine: SimulatedEngine) -> None:
    """SGLang's tracer provider (``process_tracing_init(endpoint, "sglang")``) and its id generator."""
    engine.open_spans(SCOPE, {"service.name": SERVICE_NAME})
    if engine.spans is not None:
        ids = SglangIdGenerator(engine.settings.seed)
        engine.spans.provider.id_generator = ids
        if isinstance(engine.spans.tracer, SdkTracer):  # the SDK's tracers keep the generator they were made with
            engine.spans.tracer.id_generator = ids


def finish_reason(seq: Sequence) -> dict[str, Any] | None:
    """SGLang's ``finish_reason`` object (``FINISH_LENGTH``, ``FINISH_MATCHED_TOKEN``, ``FINISH_ABORT``)."""
    if seq.finish is Finish.LENGTH:
        return {"type": "length", "length": seq.generated}
    if seq.finish is Finish.STOP:
        return {"type": "stop", "matched": 2}
    if seq.finish in (Finish.ABORT, Finish.ERROR):
        return {
            "type": "abort",
            "message": "Abort before prefill" if seq.first_token is None else "Abort in waiting queue",
        }
    return None


def host_id(engine: SimulatedEngine) -> str:
    """``/etc/machine-id`` of the simulated host: 32 hex digits."""
    return f"{zlib.crc32(engine.settings.model.encode()) ^ engine.settings.seed:08x}" * 4


class SglangSpans:
    """Writes one request's trace after it finished (timestamps from the serving model)."""

    def __init__(self, engine: SimulatedEngine) -> None:
        self.engine = engine
        self.host = host_id(engine)

    def thread(self, label: str, parent: Context, start: int, tp_rank: int | None) -> Span:
        assert self.engine.spans is not None
        name = label + (f" [TP {tp_rank}] " if tp_rank is not None else "")
        name += f"(host:{self.host[:8]} | pid:{self.engine.pid})"
        span = self.engine.spans.tracer.start_span(name, context=parent, start_time=start)
        if tp_rank is not None:
            span.set_attributes({"tp_rank": tp_rank})
        span.set_attributes({"host_id": self.host, "pid": self.engine.pid, "thread_label": label})
        return span

    def slices(self, thread: Span, stages: list[tuple[str, int, int, dict[str, Any]]]) -> list[Span]:
        """First-level slices under ``thread``, each linked to the one before it."""
        assert self.engine.spans is not None
        ctx = trace.set_span_in_context(thread)
        out: list[Span] = []
        for name, start, end, attrs in stages:
            links = [Link(out[-1].get_span_context())] if out else None
            span = self.engine.spans.tracer.start_span(name, context=ctx, start_time=start, links=links)
            if attrs:
                span.set_attributes(attrs)
            span.end(end_time=max(end, start))
            out.append(span)
        return out

    def emit(
        self,
        seq: Sequence,
        rid: str,
        headers: Mapping[str, str] | None,
        sampling: Mapping[str, Any],
        prompt_tokens: int,
    ) -> None:
        """The request's trace: root, tokenizer thread and scheduler thread spans with their slices."""
        sink = self.engine.spans
        if sink is None:
            return
        # the serving model has no tokenizer: tokenize and dispatch take no time, so the API server's
        # created time is the sequence's arrival and the span's TTFT is the metrics' TTFT
        arrival = dispatched = ns(seq.arrival)
        end = ns(seq.finished_at if seq.finished_at is not None else seq.arrival)
        ctx = (parent_context(headers) if headers else None) or Context()
        root = sink.tracer.start_span(
            f" Req {rid[:8]}", context=ctx, start_time=arrival, attributes={"rid": rid, "module": MODULE}
        )
        root_ctx = trace.set_span_in_context(root)
        tok = self.thread(TOKENIZER_LABEL, root_ctx, arrival, None)
        self.slices(tok, [("tokenize", arrival, dispatched, {}), ("api_server_dispatch", dispatched, dispatched, {})])
        tok.end(end_time=dispatched)
        self.scheduler(seq, root_ctx, dispatched, end)
        root.set_attributes(self.root_attrs(seq, rid, sampling, prompt_tokens, arrival, dispatched, end))
        root.end(end_time=end)

    def scheduler(self, seq: Sequence, root_ctx: Context, recv: int, end: int) -> None:
        assert self.engine.spans is not None
        sched = self.thread(SCHEDULER_LABEL, root_ctx, recv, 0)
        forward = ns(seq.first_scheduled) if seq.first_scheduled is not None else end
        first = ns(seq.first_token) if seq.first_token is not None else end
        stages: list[tuple[str, int, int, dict[str, Any]]] = [("request_process", recv, recv, {})]
        if seq.first_scheduled is not None:  # a request aborted in the queue never left it
            stages += [("prefill_waiting", recv, forward, {}), ("prefill_forward", forward, first, {})]
        decoding = len(seq.token_times) > 1
        if decoding:
            stages.append(("decode_waiting", first, first, {}))
        spans = self.slices(sched, stages)
        if decoding:
            links = [Link(spans[-1].get_span_context())]
            dec = self.engine.spans.tracer.start_span(
                "decode_forward", context=trace.set_span_in_context(sched), start_time=first, links=links
            )
            ctx = trace.set_span_in_context(dec)
            steps = itertools.islice(itertools.pairwise(seq.token_times), MAX_DECODE_LOOP_SPANS)
            for i, (a, b) in enumerate(steps):
                loop = self.engine.spans.tracer.start_span("decode_loop", context=ctx, start_time=ns(a))
                loop.set_attributes({"decode_ct": i})
                loop.end(end_time=ns(b))
            dec.end(end_time=end)
        for _ in range(seq.preemptions):
            sched.add_event("retract", timestamp=forward)
        if seq.finish is Finish.ABORT:  # TraceReqContext.abort(abort_info): ERROR and the finish reason's fields
            sched.set_status(Status(StatusCode.ERROR))
            sched.set_attributes(finish_reason(seq) or {})
        sched.end(end_time=end)

    def root_attrs(
        self,
        seq: Sequence,
        rid: str,
        sampling: Mapping[str, Any],
        prompt_tokens: int,
        arrival: int,
        dispatched: int,
        end: int,
    ) -> dict[str, Any]:
        """``make_span_attrs`` and ``convert_to_gen_ai_span_attrs`` (seconds, from the API server's clock)."""
        attrs: dict[str, Any] = {
            "gen_ai.usage.completion_tokens": seq.generated,
            "gen_ai.usage.prompt_tokens": prompt_tokens,
            "gen_ai.usage.cached_tokens": seq.cached_tokens,
            "gen_ai.request.id": rid,
        }
        for key, attr in (
            ("max_new_tokens", "gen_ai.request.max_tokens"),
            ("top_p", "gen_ai.request.top_p"),
            ("temperature", "gen_ai.request.temperature"),
            ("top_k", "gen_ai.request.top_k"),
            ("n", "gen_ai.request.n"),
        ):
            if sampling.get(key):
                attrs[attr] = sampling[key]
        attrs["gen_ai.response.model"] = self.engine.settings.model
        reason = finish_reason(seq)
        if reason is not None:
            attrs["gen_ai.response.finish_reasons"] = json.dumps([reason["type"]])
        if seq.first_token is not None:
            first = ns(seq.first_token)
            attrs["gen_ai.latency.time_to_first_token"] = (first - arrival) / 1e9
        attrs["gen_ai.latency.e2e"] = (end - arrival) / 1e9
        if seq.first_token is not None:
            attrs["gen_ai.latency.time_in_model_decode"] = (end - first) / 1e9
        attrs["gen_ai.latency.time_in_model_inference"] = (end - dispatched) / 1e9
        if seq.first_token is not None:
            attrs["gen_ai.latency.time_in_model_prefill"] = (first - dispatched) / 1e9
        return attrs
