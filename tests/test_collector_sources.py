"""Span → request mapping, source by source: the real vLLM 0.32.0 trace exports, the simulators' spans and
hand-built spans of each engine and of generic OpenTelemetry GenAI. Bad input, validation, the helpers and the
identity of spans: ``tests/test_collector_sources_validation.py``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, timedelta
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferwatch.collector.ingest.sources import MappedBatch, map_export, tgi
from inferwatch.collector.store import record as R
from inferwatch.simulator.base import SimSettings
from inferwatch.simulator.server import create_app
from tests.conftest import ROOT, in_process
from tests.support.span_builders import EPOCH, T0, export, make_span, sid

CAPTURE = ROOT / "tests" / "fixtures" / "otlp" / "vllm-0.32.0-cpu"
N2_REQUEST_ID = "cmpl-9f91a06b682bf405-0"
TRACEPARENT_TRACE_ID = "d0904930f2249171694f2c1df1472cee"


# -- helpers -------------------------------------------------------------------------------------------
def seconds(ns: int) -> float:
    return ns / 1e9


def run_sim(engine: str, fn: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> tuple[Any, tuple[ReadableSpan, ...]]:
    """Run a simulated engine in-process, call ``fn`` with a client; return its result and the spans."""
    exporter = InMemorySpanExporter()

    async def main() -> Any:
        app = create_app(SimSettings(engine=engine, load=0, speed=20), span_exporter=exporter)
        async with in_process(app) as c:
            return await fn(c)

    result = asyncio.run(main())
    return result, exporter.get_finished_spans()


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


# -- the real vLLM 0.32.0 capture ----------------------------------------------------------------------
def capture_batches() -> list[MappedBatch]:
    return [map_export(ExportTraceServiceRequest.FromString(p.read_bytes())) for p in sorted(CAPTURE.glob("*.pb"))]


def capture_spans() -> dict[tuple[str, str], dict[str, Any]]:
    spans: list[dict[str, Any]] = json.loads((CAPTURE / "spans.json").read_text())
    return {(s["trace_id"], s["span_id"]): s for s in spans if s["name"] == "llm_request"}


def test_real_vllm_exports_counts() -> None:
    batches = capture_batches()
    assert len(batches) == 7
    records = [r for b in batches for r in b.records]
    assert len(records) == 39
    assert sum(b.skipped for b in batches) == 13  # the start-up spans
    assert [r for b in batches for r in b.rejected] == []
    assert {r.engine for r in records} == {"vllm"}
    assert len({r.request_id for r in records}) == 38
    n2 = [r for r in records if r.request_id == N2_REQUEST_ID]
    assert len(n2) == 2 and n2[0].span_id != n2[1].span_id
    assert n2[0].trace_id != n2[1].trace_id  # no traceparent: each sample is its own root trace
    (traced,) = [r for r in records if r.trace_id == TRACEPARENT_TRACE_ID]
    assert traced.request_id is not None and traced.request_id.startswith("chatcmpl-")


def test_real_vllm_records_equal_the_span_attributes() -> None:
    expected = capture_spans()
    records = [r for b in capture_batches() for r in b.records]
    assert {(r.trace_id, r.span_id) for r in records} == set(expected)
    omitted = 0
    for rec in records:
        span = expected[(rec.trace_id, rec.span_id)]
        a = span["attributes"]
        assert rec.request_id == a["gen_ai.request.id"]
        assert rec.time_to_first_token == a["gen_ai.latency.time_to_first_token"]
        assert rec.request_duration == a["gen_ai.latency.e2e"]
        assert rec.request_queue == a["gen_ai.latency.time_in_queue"]
        assert rec.request_prefill == a["gen_ai.latency.time_in_model_prefill"]
        assert rec.request_decode == a["gen_ai.latency.time_in_model_decode"]
        assert rec.prompt_tokens == a["gen_ai.usage.prompt_tokens"]
        assert rec.generation_tokens == a["gen_ai.usage.completion_tokens"]
        assert rec.n == a["gen_ai.request.n"] and rec.max_tokens == a["gen_ai.request.max_tokens"]
        if "gen_ai.request.temperature" in a:
            assert rec.temperature == a["gen_ai.request.temperature"]
        else:
            omitted += 1
            assert rec.temperature is None
        tokens = a["gen_ai.usage.completion_tokens"]
        assert rec.time_per_output_token == a["gen_ai.latency.time_in_model_decode"] / (tokens - 1)
        assert rec.time_per_output_token == R.tpot(rec.request_decode, rec.generation_tokens)
        assert rec.ttft_derived is False and rec.finish_reason is None and rec.model is None and rec.error is None
        assert rec.attributes == {
            "gen_ai.latency.time_in_model_inference": a["gen_ai.latency.time_in_model_inference"],
            "gen_ai.request.top_p": a["gen_ai.request.top_p"],
        }
        assert rec.start_time == EPOCH + timedelta(microseconds=span["start"] // 1000)
        assert rec.end_time == EPOCH + timedelta(microseconds=span["end"] // 1000)
        assert rec.start_time.tzinfo is UTC
        assert rec.service == span["resource"]["service.name"] == "unknown_service:python3"
        assert rec.instance == span["resource"]["service.instance.id"]
    assert omitted == 6  # temperature 0 is not recorded by vLLM


def test_real_vllm_exports_merged_into_one_request() -> None:
    merged = ExportTraceServiceRequest()
    for p in sorted(CAPTURE.glob("*.pb")):
        merged.MergeFromString(p.read_bytes())
    batch = map_export(merged)
    assert (len(batch.records), batch.skipped, batch.rejected) == (39, 13, [])


# -- vLLM simulator ------------------------------------------------------------------------------------
def test_simulated_vllm() -> None:
    async def fn(c: httpx.AsyncClient) -> None:
        await c.post("/v1/completions", json={"prompt": "import os " * 10, "max_tokens": 6, "n": 2})

    _, spans = run_sim("vllm", fn)
    batch = map_export(encode_spans(spans))
    assert batch.rejected == [] and len(batch.records) == 2
    a, b = batch.records
    assert a.engine == "vllm" and a.request_id == b.request_id and a.span_id != b.span_id
    assert a.generation_tokens == 6 and a.time_to_first_token is not None


# -- TGI -----------------------------------------------------------------------------------------------
def test_duration_strings() -> None:
    cases = {
        "950ns": 950,
        "812.3µs": 812_300,
        "812.3μs": 812_300,
        "812.3us": 812_300,
        "1.2ms": 1_200_000,
        "1.234567ms": 1_234_567,
        "2.0315s": 2_031_500_000,
        "1.5s": 1_500_000_000,
        "0ns": 0,
        "12s": 12_000_000_000,
        "1m 2.5s": 62_500_000_000,
    }
    for text, ns in cases.items():
        assert tgi.parse_duration_ns(text) == ns, text
    assert tgi.parse_duration("2.0315s") == 2.0315
    for bad in ("", "12", "ms", "1.2 parsecs", "-1ms", "1.2.3s", "None"):
        with pytest.raises(ValueError, match="Rust Duration"):
            tgi.parse_duration_ns(bad)


HANDLER_TIMES = {
    "total_time": "2.0315s",
    "validation_time": "812.3µs",
    "queue_time": "1.2ms",
    "inference_time": "2.0295s",
    "time_per_token": "101.475ms",
}
PARAMETERS = (
    "GenerateParameters { best_of: None, temperature: Some(0.7), repetition_penalty: None, top_k: None, "
    'do_sample: true, max_new_tokens: Some(20), stop: ["max_new_tokens: Some(3)"], seed: None, '
    'adapter_id: Some("my-lora") }'
)


def test_hand_built_tgi_handler_alone() -> None:
    handler = make_span(
        "generate",
        {**HANDLER_TIMES, "parameters": PARAMETERS, "seed": "None"},
        events=[("Success", {"level": "INFO", "target": "text_generation_router::server"})],
    )
    queue_only = make_span("generate_stream", {"total_time": "3ms", "queue_time": "950ns"}, span=sid(9))
    batch = map_export(export(("opentelemetry-otlp", {"service.name": "my-tgi"}, [handler, queue_only])))
    assert batch.rejected == [] and batch.skipped == 0
    rec, short = batch.records
    assert rec.engine == "tgi" and rec.service == "my-tgi" and rec.instance is None
    assert rec.request_duration == 2.0315 and rec.request_queue == 0.0012
    # no infer child in the export: the per-token time stands in for the prefill step
    assert rec.ttft_derived and rec.time_to_first_token == pytest.approx(0.0008123 + 0.0012 + 0.101475, abs=1e-12)
    assert rec.request_prefill == pytest.approx(0.101475, abs=1e-12)
    assert rec.request_decode == pytest.approx(2.0295 - 0.101475, abs=1e-12)
    assert rec.generation_tokens == 20 and rec.finish_reason is None and rec.error is None
    assert rec.time_per_output_token == pytest.approx((2.0295 - 0.101475) / 19)
    assert (rec.max_tokens, rec.temperature, rec.lora_adapter) == (20, 0.7, "my-lora")
    assert rec.attributes["validation_time"] == "812.3µs" and "total_time" not in rec.attributes
    assert short.request_duration == 0.003 and short.request_queue == 950e-9
    assert short.time_to_first_token is None and short.generation_tokens is None


def test_hand_built_tgi_trace_folds_its_children() -> None:
    ms = 1_000_000
    router = "text_generation_router_v3::backend"
    handler = make_span(
        "generate",
        {**HANDLER_TIMES, "code.namespace": "text_generation_router::server"},
        span=sid(1),
        end=T0 + 2031 * ms,
    )
    infer_gen = make_span("generate", {"code.namespace": "text_generation_router::infer"}, span=sid(2), parent=sid(1))
    schedule = make_span("schedule", {"code.namespace": router}, span=sid(3), parent=sid(2))
    infer0 = make_span(
        "infer", {"code.namespace": router}, span=sid(4), parent=sid(3), start=T0 + 2 * ms, end=T0 + 32 * ms
    )
    infer1 = make_span(
        "infer", {"code.namespace": router}, span=sid(5), parent=sid(3), start=T0 + 33 * ms, end=T0 + 60 * ms
    )
    final = (
        "Generation { request_id: 7, prefill_tokens: None, tokens: Some(Tokens { ids: [2] }), generated_text: "
        'Some(GeneratedText { text: "generated_tokens: 99, finish_reason: Length", generated_tokens: 17, '
        "finish_reason: EosToken, seed: None }), top_tokens: [] }"
    )
    send0 = make_span(
        "send_generation", {"generation": "Generation { generated_text: None }"}, span=sid(6), parent=sid(4)
    )
    send1 = make_span("send_generation", {"generation": final}, span=sid(7), parent=sid(5), start=T0 + 59 * ms)
    health = make_span("health", {"code.namespace": "text_generation_router::server"}, span=sid(8), trace=b"\x09" * 16)
    spans = [send0, send1, infer0, infer1, schedule, infer_gen, handler, health]
    batch = map_export(export(("opentelemetry-otlp", {"service.name": "text-generation-inference.router"}, spans)))
    assert batch.rejected == [] and batch.skipped == 7 and len(batch.records) == 1
    (rec,) = batch.records
    assert rec.ttft_derived and rec.time_to_first_token == pytest.approx(0.0008123 + 0.0012 + 0.030, abs=1e-12)
    assert rec.request_prefill == pytest.approx(0.030, abs=1e-12)
    assert rec.request_decode == pytest.approx(2.0295 - 0.030, abs=1e-12)
    assert rec.generation_tokens == 17 and rec.finish_reason == "stop"


def test_tgi_failures_and_bad_durations() -> None:
    failed = make_span(
        "generate",
        {"code.namespace": "text_generation_router::server"},
        error="",
        events=[("Input validation error: too long", {"level": "ERROR", "target": "text_generation_router::infer"})],
    )
    bad = make_span("chat_completions", {"total_time": "12 parsecs"}, span=sid(3))
    batch = map_export(export(("x", {}, [failed, bad])))
    (rec,) = batch.records
    assert rec.error == "Input validation error: too long" and rec.request_duration == 2.0315
    assert rec.generation_tokens is None and rec.time_to_first_token is None and not rec.ttft_derived
    assert batch.rejected == ["tgi: total_time is not a Rust Duration"]


def test_simulated_tgi() -> None:
    async def fn(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [
            await c.post("/generate", json={"inputs": "hello world " * 5, "parameters": {"max_new_tokens": 6}}),
            await c.post("/generate_stream", json={"inputs": "hi", "parameters": {"max_new_tokens": 3}}),
            await c.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 70}
            ),
            await c.post("/", json={"inputs": "compat", "parameters": {"max_new_tokens": 4}}),
            await c.post("/generate", json={"inputs": "long " * 20000, "parameters": {"max_new_tokens": 4}}),
        ]

    responses, spans = run_sim("tgi", fn)
    assert [r.status_code for r in responses] == [200, 200, 200, 200, 422]
    by_id = {hex_ids(s): s for s in spans}
    batch = map_export(encode_spans(spans))
    assert batch.rejected == []
    assert len(batch.records) == 5 and batch.skipped == len(spans) - 5
    ok = [r for r in batch.records if r.error is None]
    assert len(ok) == 4 and {r.engine for r in batch.records} == {"tgi"}
    for rec in ok:
        span = by_id[(rec.trace_id, rec.span_id)]
        assert span.name in tgi.HANDLERS and span.start_time is not None and span.end_time is not None
        attrs = span.attributes or {}
        assert rec.request_duration is not None
        assert abs(rec.request_duration - tgi.parse_duration(str(attrs["total_time"]))) < 1e-3
        assert rec.request_duration == pytest.approx(seconds(span.end_time - span.start_time), abs=1e-3)
        assert rec.ttft_derived and rec.time_to_first_token is not None
        # tgi.md §3.5: server TTFT = first send_generation start − handler start
        sends = [
            s.start_time
            for s in spans
            if s.name == "send_generation" and hex_ids(s)[0] == rec.trace_id and s.start_time is not None
        ]
        assert abs(rec.time_to_first_token - seconds(min(sends) - span.start_time)) < 1e-3
        assert rec.finish_reason in ("length", "stop") and rec.prompt_tokens is None
    generate, stream, chat, compat = ok
    assert generate.generation_tokens == int(responses[0].headers["x-generated-tokens"])
    assert compat.generation_tokens == int(responses[3].headers["x-generated-tokens"])
    assert 1 <= (stream.generation_tokens or 0) <= 3
    assert chat.generation_tokens == responses[2].json()["usage"]["completion_tokens"]
    assert generate.max_tokens == 6
    (failed,) = [r for r in batch.records if r.error is not None]
    assert failed.error is not None and "Input validation error" in failed.error
    assert failed.generation_tokens is None


def test_simulated_tgi_handler_spans_alone() -> None:
    """Children in another export: TTFT falls back to the per-token time, tokens to inference/time_per_token."""

    async def fn(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/generate", json={"inputs": "hello " * 9, "parameters": {"max_new_tokens": 90}})

    response, spans = run_sim("tgi", fn)
    handlers = [s for s in spans if s.name == "generate" and "total_time" in (s.attributes or {})]
    batch = map_export(encode_spans(handlers))
    (rec,) = batch.records
    attrs = handlers[0].attributes or {}
    per_token = tgi.parse_duration(str(attrs["time_per_token"]))
    expected = sum(tgi.parse_duration(str(attrs[k])) for k in ("validation_time", "queue_time")) + per_token
    assert rec.ttft_derived and rec.time_to_first_token == pytest.approx(expected, abs=1e-9)
    assert rec.generation_tokens == int(response.headers["x-generated-tokens"])
    assert rec.finish_reason is None


# -- trtllm-serve --------------------------------------------------------------------------------------
def test_simulated_trtllm() -> None:
    async def fn(c: httpx.AsyncClient) -> list[dict[str, Any]]:
        one = await c.post("/v1/completions", json={"model": "sim-model", "prompt": "hello " * 20, "max_tokens": 7})
        two = await c.post(
            "/v1/chat/completions",
            json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "n": 2},
        )
        return [one.json(), two.json()]

    (one, two), spans = run_sim("trtllm", fn)
    batch = map_export(encode_spans(spans))
    assert batch.rejected == [] and batch.skipped == 0 and len(batch.records) == 2
    a, b = sorted(batch.records, key=lambda r: r.start_time)
    assert {a.engine, b.engine} == {"trtllm"}
    assert a.finish_reason == one["choices"][0]["finish_reason"] in ("length", "stop")
    assert a.generation_tokens == one["usage"]["completion_tokens"] > 1
    assert a.prompt_tokens == one["usage"]["prompt_tokens"] and a.n == 1 and a.max_tokens == 7
    assert a.request_id is not None and a.request_id.isdigit()
    attrs = {hex_ids(s): s.attributes or {} for s in spans}[(a.trace_id, a.span_id)]
    assert a.time_to_first_token == attrs["gen_ai.latency.time_to_first_token"]
    assert a.request_duration == attrs["gen_ai.latency.e2e"]
    assert a.request_queue == attrs["gen_ai.latency.time_in_queue"]
    assert a.request_duration is not None and a.time_to_first_token is not None
    assert a.generation_tokens is not None
    tpot = (a.request_duration - a.time_to_first_token) / (a.generation_tokens - 1)
    assert a.time_per_output_token == pytest.approx(tpot)
    assert a.attributes["gen_ai.request.top_k"] == 0 and "gen_ai.response.finish_reasons" not in a.attributes
    reasons = [c["finish_reason"] for c in two["choices"]]
    assert b.n == 2 and b.finish_reason == reasons[0]
    assert b.attributes["gen_ai.response.finish_reasons"] == reasons
    assert b.time_per_output_token is None  # tokens are summed over the candidates


def test_trtllm_lookalike_outside_its_scope() -> None:
    """An ``llm_request`` in an unknown scope: finish reasons or KV transfer time make it trtllm's."""
    common = {"gen_ai.request.id": "r1", "gen_ai.latency.e2e": 0.5, "gen_ai.latency.time_to_first_token": 0.1}
    spans = [
        make_span("llm_request", {**common, "gen_ai.response.finish_reasons": ["stop"]}, span=sid(1)),
        make_span("llm_request", {**common, "gen_ai.latency.kv_cache_transfer_time": 0.01}, span=sid(2)),
        make_span("llm_request", {**common, "gen_ai.usage.completion_tokens": 5}, span=sid(3)),
        make_span("llm_request", {**common, "gen_ai.response.finish_reasons": '["length"]'}, span=sid(4)),
    ]
    batch = map_export(export(("some.scope", {}, spans)))
    assert [(r.engine, r.finish_reason) for r in batch.records] == [
        ("trtllm", "stop"),
        ("trtllm", None),
        ("vllm", None),
        ("trtllm", "length"),
    ]


# -- generic OpenTelemetry GenAI -----------------------------------------------------------------------
def test_genai_current_semconv() -> None:
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.response.id": "chatcmpl-123",
        "gen_ai.request.max_tokens": 200,
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.choice.count": 1,
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 51,
        "gen_ai.usage.cache_read.input_tokens": 64,
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.response.time_to_first_chunk": 0.25,
        "server.address": "api.example.com",
    }
    span = make_span("chat gpt-4o", attrs, end=T0 + 1_250_000_000)
    batch = map_export(export(("openai.instrumentation", {"service.name": "app", "host.name": "h1"}, [span])))
    (rec,) = batch.records
    assert rec.engine == "openai" and rec.model == "gpt-4o-2024-08-06" and rec.request_id == "chatcmpl-123"
    assert (rec.prompt_tokens, rec.generation_tokens, rec.prefix_cache_hit_tokens) == (100, 51, 64)
    assert rec.finish_reason == "stop" and rec.error is None
    assert rec.time_to_first_token == 0.25 and rec.request_duration == 1.25
    assert rec.time_per_output_token == pytest.approx(1.0 / 50)
    assert (rec.max_tokens, rec.temperature, rec.n) == (200, 0.2, 1)
    assert rec.attributes == {
        "gen_ai.operation.name": "chat",
        "server.address": "api.example.com",
        "gen_ai.request.model": "gpt-4o",
    }
    assert rec.service == "app" and rec.instance == "h1"


def test_genai_old_names_errors_and_non_model_spans() -> None:
    old = make_span(
        "text_completion m",
        {"gen_ai.system": "vllm-proxy", "gen_ai.usage.prompt_tokens": 7, "gen_ai.usage.completion_tokens": 3},
        span=sid(1),
    )
    failed = make_span(
        "chat m", {"gen_ai.operation.name": "chat", "error.type": "timeout"}, span=sid(2), error="deadline exceeded"
    )
    status_only = make_span("chat m", {"gen_ai.request.model": "m"}, span=sid(3), error="boom")
    tool = make_span("execute_tool f", {"gen_ai.operation.name": "execute_tool"}, span=sid(4))
    batch = map_export(export(("lib", {"service.name": "app"}, [old, failed, status_only, tool])))
    assert batch.skipped == 1 and batch.rejected == []
    a, b, c = batch.records
    assert (a.engine, a.prompt_tokens, a.generation_tokens) == ("vllm-proxy", 7, 3)
    assert (b.engine, b.error) == ("genai", "timeout")
    assert (c.model, c.error) == ("m", "boom")
