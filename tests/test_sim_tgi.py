"""The simulated TGI: wire fidelity of /metrics, the HTTP API, timing headers and the request trace.

In-process tests run in virtual time (clients that go away speak raw ASGI); the official client talks to
a real socket in scaled wall time.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.simulator.base import SimSettings
from inferwatch.simulator.clock import VirtualClock, run_virtual
from inferwatch.simulator.engines.tgi import metrics as tgi
from inferwatch.simulator.engines.tgi.protocol import GENERATION_ERROR, parse_rust_duration, rust_duration, rust_f64
from inferwatch.simulator.server import create_app
from tests.conftest import ENGINE_FIXTURES, in_process
from tests.fidelity import diff, schema
from tests.helpers import le_sets, value
from tests.support.asgi_client import leaving_client

FIXTURE = ENGINE_FIXTURES / "tgi" / "3.3.7"
FIXTURE_TEXT = (FIXTURE / "metrics.txt").read_text()
SPEED = 5.0


def settings(seed: int = 7) -> SimSettings:
    return SimSettings(engine="tgi", load=0, speed=SPEED, seed=seed)


def counter(text: str, name: str, **labels: str) -> float:
    """A TGI counter read back with prometheus_client's parser (which names counter samples ``_total``)."""
    return value(text, name + "_total", **labels)


@asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[str]:
    """The app on a real socket (127.0.0.1, a free port); stopped on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", ws="none", http="h11")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def until(clock: VirtualClock, cond: Callable[[], Any], timeout: float = 5.0) -> None:
    """Wait until ``cond()`` holds, sampling it every simulated millisecond (at most ``timeout`` s)."""
    deadline = clock.now() + timeout
    while not cond():
        if clock.now() > deadline:
            raise AssertionError("condition not met in time")
        await clock.sleep(0.001)


def sse_events(body: str) -> list[Any]:
    out = []
    for block in body.split("\n\n"):
        if block.startswith("data:"):
            data = block[len("data:") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def gen(inputs: str = "The quick brown fox jumps over the lazy dog", **params: Any) -> dict[str, Any]:
    return {"inputs": inputs, "parameters": params}


# -- one workload that touches every family ------------------------------------------------------------
@dataclass
class Workload:
    empty: httpx.Response
    text: str
    scrapes: list[str]
    info: dict[str, Any]
    validation: httpx.Response
    generation: httpx.Response
    stream_error: list[Any]
    chat_stream: list[Any]


async def run_workload(clock: VirtualClock) -> Workload:
    app = create_app(settings(), clock=clock)
    engine = app.state.engine
    async with in_process(app) as c:
        empty = await c.get("/metrics")
        assert (await c.post("/generate", json=gen(max_new_tokens=6, details=True))).status_code == 200
        stream = await c.post("/generate_stream", json=gen(max_new_tokens=5, details=True))
        assert sse_events(stream.text)[-1]["generated_text"] is not None
        assert (await c.post("/", json={**gen(max_new_tokens=4), "stream": False})).status_code == 200
        chat = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 5}
        assert (await c.post("/v1/chat/completions", json=chat)).status_code == 200
        chat_stream = await c.post(
            "/v1/chat/completions", json={**chat, "stream": True, "stream_options": {"include_usage": True}}
        )
        # a request joining a running batch (a chunking concat)
        long = asyncio.create_task(c.post("/generate", json=gen(max_new_tokens=300)))
        await until(clock, lambda: engine.model.running)
        assert (await c.post("/generate", json=gen(max_new_tokens=3))).status_code == 200
        assert (await long).status_code == 200
        validation = await c.post("/generate", json=gen("word " * 5000, max_new_tokens=5))
        engine.params.error_rate = 1.0
        generation = await c.post("/generate", json=gen(max_new_tokens=5))
        stream_error = await c.post("/generate_stream", json=gen(max_new_tokens=5))
        engine.params.error_rate = 0.0
        # clients that leave: one waiting for a plain response, one mid-stream
        leave = asyncio.Event()
        impatient = asyncio.create_task(leaving_client(app, "/generate", gen(max_new_tokens=400), leave))
        await until(clock, lambda: engine.model.running)
        leave.set()
        assert (await impatient)[0] == 499
        assert (await leaving_client(app, "/generate_stream", gen(max_new_tokens=400), asyncio.Event(), 2))[0] == 200
        scrapes: list[str] = []

        async def dropped() -> bool:
            scrapes.append((await c.get("/metrics")).text)
            return 'err="dropped"} 2' in scrapes[-1]

        for _ in range(400):
            if await dropped():
                break
            await clock.sleep(0.005)
        for _ in range(4):
            scrapes.append((await c.get("/metrics")).text)
        info = (await c.get("/info")).json()
    return Workload(
        empty,
        scrapes[-1],
        scrapes[-5:],
        info,
        validation,
        generation,
        sse_events(stream_error.text),
        sse_events(chat_stream.text),
    )


@pytest.fixture(scope="module")
def workload() -> Workload:
    return run_virtual(run_workload)


def test_empty_body_before_the_first_request(workload: Workload) -> None:
    assert workload.empty.status_code == 200
    assert workload.empty.text == ""
    assert workload.empty.headers["content-type"] == "text/plain; charset=utf-8"


def test_schema_matches_the_catalog_fixture(workload: Workload) -> None:
    expected, actual = schema(FIXTURE_TEXT), schema(workload.text)
    assert actual == expected, "\n".join(diff(expected, actual))
    help_lines = {ln for ln in FIXTURE_TEXT.splitlines() if ln.startswith("# HELP")}
    assert {ln for ln in workload.text.splitlines() if ln.startswith("# HELP")} == help_lines


def test_outcomes_counted_the_tgi_way(workload: Workload) -> None:
    text = workload.text
    # 12 requests, two of them chat completions, which count twice
    assert counter(text, tgi.REQUEST_COUNT) == 14
    assert counter(text, tgi.REQUEST_SUCCESS) == 7
    assert counter(text, tgi.REQUEST_FAILURE, err="validation") == 1
    assert counter(text, tgi.REQUEST_FAILURE, err="generation") == 2  # one plain, one streamed
    assert counter(text, tgi.REQUEST_FAILURE, err="dropped") == 2
    assert counter(text, tgi.BATCH_INFERENCE_FAILURE, method="prefill") == 2
    assert counter(text, tgi.BATCH_CONCAT, reason="chunking") >= 1
    # request-level histograms only on success
    assert value(text, tgi.REQUEST_DURATION + "_count") == 7
    assert value(text, tgi.REQUEST_GENERATED_TOKENS + "_count") == 7
    # validated requests: everything but the validation failure
    assert value(text, tgi.REQUEST_INPUT_LENGTH + "_count") == 11
    assert workload.validation.status_code == 422
    body = workload.validation.json()
    assert body["error_type"] == "validation" and body["error"].startswith("Input validation error: ")
    assert workload.generation.status_code == 424
    assert workload.generation.json()["error_type"] == "generation"
    assert workload.stream_error == [{"error": GENERATION_ERROR, "error_type": "generation"}]


def test_chat_stream_shape(workload: Workload) -> None:
    events = workload.chat_stream
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and next(iter(c)) == "object" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(chunks) - 1
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def test_rendering_rules(workload: Workload) -> None:
    text = workload.text
    assert text.endswith("\n\n") and "\n\n\n" not in text
    order = [GROUP[ln.split()[3]] for ln in text.splitlines() if ln.startswith("# TYPE")]
    assert order == sorted(order), "counters, then gauges, then histograms and summaries"
    values = [ln.rsplit(" ", 1)[1] for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert not [v for v in values if v.endswith(".0") or re.search(r"\de", v)]
    assert "_total" not in text and "_created" not in text
    assert re.search(r'\{method="(decode|prefill)",le="', text), "le comes after the metric's labels"
    # family order within a group and label-set order are not fixed (a HashMap in the real exporter)
    families = {tuple(ln for ln in s.splitlines() if ln.startswith("# TYPE")) for s in workload.scrapes}
    assert len(families) > 1


GROUP = {"counter": 0, "gauge": 1, "histogram": 2, "summary": 2}


def test_bucket_bounds_match_the_router(workload: Workload) -> None:
    fixture, sim = le_sets(FIXTURE_TEXT), le_sets(workload.text)
    geometric = [name for name, les in fixture.items() if len(les) == 36]
    assert len(geometric) >= 5
    for name in geometric:  # the float noise of repeated multiplication, string for string
        assert sim[name] == fixture[name], name
    batch = [name for name, les in fixture.items() if len(les) == 1025]
    assert batch and all(sim[name] == fixture[name] for name in batch)
    token_families = [name for name, les in sim.items() if len(les) == 101]
    assert len(token_families) == 3
    tops = sorted(max(float(le) for le in sim[name] if le != "+Inf") for name in token_families)
    info = workload.info  # linear bounds up to /info's limits (with the router's float noise)
    assert tops == pytest.approx([info["max_input_tokens"], info["max_total_tokens"], info["max_total_tokens"]])


def test_info() -> None:
    async def run(clock: VirtualClock) -> httpx.Response:
        async with in_process(create_app(settings(), clock=clock)) as c:
            return await c.get("/info")

    r = run_virtual(run)
    info = r.json()
    assert list(info) == [
        "model_id",
        "model_sha",
        "model_pipeline_tag",
        "max_concurrent_requests",
        "max_best_of",
        "max_stop_sequences",
        "max_input_tokens",
        "max_total_tokens",
        "validation_workers",
        "max_client_batch_size",
        "router",
        "version",
        "sha",
        "docker_label",
    ]
    assert info["model_id"] == settings().model and info["version"] == "3.3.6-dev0"
    assert info["max_concurrent_requests"] == 128 and info["router"] == "text-generation-router"
    assert info["max_input_tokens"] == info["max_total_tokens"] - 1 == settings().params.max_model_len - 1
    assert json.loads((FIXTURE / "info.json").read_text()).keys() == info.keys()


# -- the official client against a real server ---------------------------------------------------------
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # text_generation calls pydantic's .dict()
def test_official_text_generation_client() -> None:
    from text_generation import AsyncClient

    async def run() -> tuple[Any, list[Any]]:
        async with serve(create_app(settings(seed=3))) as base:
            client = AsyncClient(base, timeout=10)
            response = await client.generate("Why is the sky blue?", max_new_tokens=12)
            stream = [r async for r in client.generate_stream("Why is the sky blue?", max_new_tokens=9)]
            return response, stream

    response, stream = asyncio.run(run())
    assert 1 <= response.details.generated_tokens <= 12
    assert response.details.generated_tokens == len(response.details.tokens)
    assert response.generated_text == "".join(t.text for t in response.details.tokens if not t.special)
    final = stream[-1]
    assert final.details is not None and final.details.generated_tokens == len(stream)
    assert all(r.details is None and r.generated_text is None for r in stream[:-1])
    assert final.generated_text == "".join(r.token.text for r in stream if not r.token.special)


# -- timing headers ------------------------------------------------------------------------------------
def test_timing_headers() -> None:
    async def run(clock: VirtualClock) -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with in_process(create_app(settings(), clock=clock)) as c:
            plain = await c.post("/generate", json=gen(max_new_tokens=7, details=True))
            stream = await c.post("/generate_stream", json=gen(max_new_tokens=3))
            chat = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
            return plain, stream, chat

    plain, stream, chat = run_virtual(run)
    h = plain.headers
    details = plain.json()["details"]
    assert int(h["x-generated-tokens"]) == details["generated_tokens"] == len(details["tokens"])
    assert h["x-compute-type"] == "gpu+optimized"
    assert int(h["x-compute-characters"]) == len(gen()["inputs"])
    assert int(h["x-prompt-tokens"]) > 0
    parts = sum(int(h[k]) for k in ("x-validation-time", "x-queue-time", "x-inference-time"))
    assert 0 <= int(h["x-total-time"]) - parts <= 2
    assert abs(float(h["x-compute-time"]) * 1000 - int(h["x-total-time"])) < 1
    per_token = int(h["x-inference-time"]) / details["generated_tokens"]
    assert abs(int(h["x-time-per-token"]) - per_token) <= 1
    sh = stream.headers
    assert sh["content-type"] == "text/event-stream" and sh["x-accel-buffering"] == "no"
    assert "x-compute-characters" in sh and "x-compute-type" in sh
    assert not any(k in sh for k in ("x-total-time", "x-generated-tokens", "x-compute-time"))
    assert int(chat.headers["x-generated-tokens"]) == chat.json()["usage"]["completion_tokens"]


# -- inferwatch's exporter on the simulated payload ----------------------------------------------------
def test_exporter_maps_the_simulated_metrics() -> None:
    registry = builtin_registry()

    async def run(clock: VirtualClock) -> tuple[list[str], list[httpx.Response], dict[str, Any]]:
        texts, responses = [], []
        async with in_process(create_app(settings(), clock=clock)) as c:
            await c.post("/generate", json=gen(max_new_tokens=4))
            texts.append((await c.get("/metrics")).text)
            for n in (3, 5, 8):
                responses.append(await c.post("/generate", json=gen(max_new_tokens=n)))
            texts.append((await c.get("/metrics")).text)
            info = (await c.get("/info")).json()
        return texts, responses, info

    (before, after), responses, info = run_virtual(run)
    adapter = registry.detect(before)
    assert adapter is not None and adapter.name == V.ENGINE_TGI
    parse_info = adapter.parse_info
    assert parse_info is not None

    def translate(text: str) -> Any:
        assert adapter is not None
        ctx = TranslateContext(engine=V.ENGINE_TGI)
        ctx.facts = parse_info(info)
        return translate_text(adapter, text, ctx)

    snap0, snap1 = translate(before), translate(after)
    assert snap1.value(V.REQUESTS) - snap0.value(V.REQUESTS) == 3
    generated = sum(int(r.headers["x-generated-tokens"]) for r in responses)
    prompt = sum(int(r.headers["x-prompt-tokens"]) for r in responses)
    assert snap1.value(V.GENERATION_TOKENS) - snap0.value(V.GENERATION_TOKENS) == generated
    assert snap1.value(V.PROMPT_TOKENS) - snap0.value(V.PROMPT_TOKENS) == prompt
    models = {dict(k)[V.LABEL_MODEL] for k in snap1.values[V.REQUESTS]}
    assert models == {settings().model}


# -- spans ---------------------------------------------------------------------------------------------
TRACE_ID, PARENT_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
DEBUG_DURATION = re.compile(r"^[0-9]+(\.[0-9]+)?(ns|µs|ms|s)$")


def test_request_trace() -> None:
    exporter = InMemorySpanExporter()

    async def run(clock: VirtualClock) -> tuple[httpx.Response, httpx.Response]:
        async with in_process(create_app(settings(), span_exporter=exporter, clock=clock)) as c:
            plain = await c.post(
                "/generate",
                json=gen(max_new_tokens=6),
                headers={"traceparent": f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"},
            )
            unsampled = f"00-{TRACE_ID + 1:032x}-{PARENT_ID:016x}-00"
            stream = await c.post("/generate_stream", json=gen(max_new_tokens=3), headers={"traceparent": unsampled})
            await c.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            )
            return plain, stream

    plain, stream = run_virtual(run)
    spans = exporter.get_finished_spans()
    assert all(s.kind is SpanKind.INTERNAL for s in spans)
    assert {s.resource.attributes["service.name"] for s in spans} == {"text-generation-inference.router"}
    handler = one(s for s in spans if s.name == "generate" and s.parent is not None and s.parent.is_remote)
    assert handler.context.trace_id == TRACE_ID and handler.parent is not None
    assert handler.parent.span_id == PARENT_ID
    attrs = handler.attributes or {}
    for key in ("total_time", "validation_time", "queue_time", "inference_time", "time_per_token"):
        assert DEBUG_DURATION.match(str(attrs[key])), attrs[key]
    assert attrs["seed"] == "None" and str(attrs["parameters"]).startswith("GenerateParameters { best_of: None")
    total = parse_rust_duration(str(attrs["total_time"]))
    assert handler.start_time is not None and handler.end_time is not None
    e2e = (handler.end_time - handler.start_time) / 1e9
    assert abs(total - e2e) < 1e-3  # the handler span covers the request
    assert abs(total * 1000 - int(plain.headers["x-total-time"])) <= 1
    in_trace = [s for s in spans if s.context.trace_id == TRACE_ID]
    queued = one(s for s in in_trace if s.name == "queued")
    assert queued.start_time is not None and queued.end_time is not None
    assert abs((queued.end_time - queued.start_time) / 1e9 - parse_rust_duration(str(attrs["queue_time"]))) < 1e-6
    generated = int(plain.headers["x-generated-tokens"])
    assert len([s for s in in_trace if s.name == "infer"]) == generated
    sends = [s for s in in_trace if s.name == "send_generation"]
    assert len(sends) == generated and "generated_text: Some(" in str((sends[-1].attributes or {})["generation"])
    names = {s.name for s in in_trace}
    assert {"validate", "validate_input", "tokenize", "schedule", "append"} <= names
    # TGI samples AlwaysOn: an unsampled parent is still followed and exported
    streamed = one(
        s
        for s in spans
        if s.name == "generate_stream" and s.context.trace_id == TRACE_ID + 1 and s.parent and s.parent.is_remote
    )
    assert streamed.parent is not None and streamed.parent.span_id == PARENT_ID
    assert stream.status_code == 200
    chat = one(s for s in spans if s.name == "chat_completions")
    assert chat.parent is None and "total_time" in (chat.attributes or {})


def one(spans: Any) -> ReadableSpan:
    found = list(spans)
    assert len(found) == 1, [s.name for s in found]
    span: ReadableSpan = found[0]
    return span


def test_rust_formats() -> None:
    assert rust_f64(1e-7) == "0.0000001" and rust_f64(2048.0) == "2048" and rust_f64(0.5) == "0.5"
    assert rust_f64(1e21) == "1000000000000000000000"
    assert rust_duration(1_234_567) == "1.234567ms" and rust_duration(2_031_500_000) == "2.0315s"
    assert rust_duration(812_300) == "812.3µs" and rust_duration(950) == "950ns"
    assert parse_rust_duration("812.3µs") == pytest.approx(812.3e-6)
