"""The simulated vLLM: wire fidelity against the real 0.32.0 capture, API shapes, spans, exporter.

In-process tests run in virtual time; the official client talks to a real socket in scaled wall time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.simulator.base import SimSettings
from inferwatch.simulator.clock import VirtualClock, run_virtual
from inferwatch.simulator.scheduler import EngineParams
from inferwatch.simulator.server import create_app
from tests.conftest import ENGINE_FIXTURES, in_process, served_in_thread
from tests.fidelity import diff, schema

REAL = ENGINE_FIXTURES / "vllm" / "0.32.0-cpu" / "metrics-final.txt"


def settings(**kw: Any) -> SimSettings:
    base: dict[str, Any] = {
        "engine": "vllm",
        "model": "tiny-llama",
        "load": 0,
        "speed": 50.0,
        "seed": 1,
        "params": EngineParams(max_model_len=512, num_blocks=12, block_size=128),
    }
    base.update(kw)
    return SimSettings(**base)


async def _workload(client: httpx.AsyncClient) -> None:
    await client.post("/v1/completions", json={"prompt": "def f(x): return x " * 30, "max_tokens": 20})
    await client.post("/v1/completions", json={"prompt": "import os " * 10, "max_tokens": 10, "n": 2})
    await client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi " * 40}],
            "max_tokens": 12,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    r = await client.post("/v1/completions", json={"prompt": "x " * 4000, "max_tokens": 5})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]


def run_app(s: SimSettings, fn: Any, exporter: InMemorySpanExporter | None = None) -> Any:
    """``fn(client, app)`` against the app in-process, in virtual time (it moves whenever every task waits)."""

    async def main(clock: VirtualClock) -> Any:
        app = create_app(s, span_exporter=exporter, clock=clock)
        async with in_process(app) as client:
            return await fn(client, app)

    return run_virtual(main)


def test_metrics_match_the_real_capture() -> None:
    async def fn(client: httpx.AsyncClient, app: Any) -> tuple[str, str]:
        idle = (await client.get("/metrics")).text
        await _workload(client)
        return idle, (await client.get("/metrics")).text

    idle, text = run_app(settings(), fn)
    problems = diff(schema(REAL.read_text()), schema(text))
    assert not problems, "\n".join(problems)
    # like the real server, the HTTP instrumentator's families appear only after the first request
    idle_real = (ENGINE_FIXTURES / "vllm" / "0.32.0-cpu" / "metrics-idle.txt").read_text()
    assert not diff(schema(idle_real), schema(idle))


def test_le_strings_and_created_series_match() -> None:
    async def fn(client: httpx.AsyncClient, app: Any) -> str:
        await _workload(client)
        return str((await client.get("/metrics")).text)

    text = run_app(settings(), fn)
    real = REAL.read_text()

    def les(t: str) -> set[str]:
        return {ln.split('le="')[1].split('"')[0] for ln in t.splitlines() if 'le="' in ln}

    assert les(text) == les(real)
    assert sum(1 for ln in text.splitlines() if "_created" in ln) > 50


def test_counts_follow_vllm_semantics() -> None:
    """n=2 counts two finished sequences; the 400 leaves no engine series; TTFT per sequence."""

    async def fn(client: httpx.AsyncClient, app: Any) -> str:
        await _workload(client)
        return str((await client.get("/metrics")).text)

    text = run_app(settings(), fn)
    snap = translate_text(builtin_registry().get("vllm"), text, TranslateContext(engine="vllm"))
    assert snap.value(V.REQUESTS) == 4  # 1 + 2 (n=2) + 1 chat
    ttft = snap.histogram(V.TIME_TO_FIRST_TOKEN)
    assert ttft is not None and ttft.inf == 4
    assert snap.value(V.GENERATION_TOKENS) == 20 + 2 * 10 + 12
    assert snap.unmapped == []


def test_streaming_shapes_and_chunk_counts() -> None:
    async def fn(client: httpx.AsyncClient, app: Any) -> list[dict[str, Any]]:
        r = await client.post(
            "/v1/completions",
            json={
                "prompt": "hello " * 10,
                "max_tokens": 25,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.text.split("\n\n") if ln]
        assert lines[-1] == "data: [DONE]"
        return [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]

    events = run_app(settings(), fn)
    usage = events[-1]["usage"]
    token_events = [e for e in events if e["choices"]]
    assert len(token_events) == usage["completion_tokens"] == 25
    assert token_events[-1]["choices"][0]["finish_reason"] == "length"
    assert all(e["choices"][0]["finish_reason"] is None for e in token_events[:-1])


def test_spans_like_vllm() -> None:
    exporter = InMemorySpanExporter()
    trace_id = "d0904930f2249171694f2c1df1472cee"

    async def fn(client: httpx.AsyncClient, app: Any) -> dict[str, Any]:
        r = await client.post(
            "/v1/completions",
            json={"prompt": "a b c " * 20, "max_tokens": 8, "temperature": 0.0},
            headers={"traceparent": f"00-{trace_id}-327b592a5a2bb305-01"},
        )
        out: dict[str, Any] = r.json()
        return out

    body = run_app(settings(), fn, exporter)
    app_spans = [s for s in exporter.get_finished_spans() if s.name == "llm_request"]
    assert len(app_spans) == 1
    span = app_spans[0]
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.request.id"] == body["id"] + "-0"
    assert attrs["gen_ai.usage.completion_tokens"] == body["usage"]["completion_tokens"]
    assert attrs["gen_ai.usage.prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert "gen_ai.request.temperature" not in attrs  # omitted when 0, as vLLM does
    lat, queue, inference = (
        attrs["gen_ai.latency.e2e"],
        attrs["gen_ai.latency.time_in_queue"],
        attrs["gen_ai.latency.time_in_model_inference"],
    )
    assert isinstance(lat, float) and isinstance(queue, float) and isinstance(inference, float)
    assert lat > 0 and queue + inference <= lat + 1e-9
    assert f"{span.context.trace_id:032x}" == trace_id
    assert span.parent is not None and f"{span.parent.span_id:016x}" == "327b592a5a2bb305"
    assert span.instrumentation_scope is not None and span.instrumentation_scope.name == "vllm.tracing.otel"


@pytest.fixture
def live_vllm() -> Iterator[str]:
    """The simulated vLLM on a real socket (127.0.0.1, free port), stopped afterwards."""
    with served_in_thread(create_app(settings(speed=20.0))) as url:
        yield url


def test_official_openai_client(live_vllm: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=live_vllm + "/v1", api_key="unused", max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]
    c = client.completions.create(model="tiny-llama", prompt="hello " * 10, max_tokens=7)
    assert c.usage is not None and c.usage.completion_tokens == 7 and c.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=6
    )
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 6
    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens == len(pieces) == 9
    text_stream = client.completions.create(model="tiny-llama", prompt="x y z", max_tokens=5, stream=True)
    assert sum(1 for ch in text_stream if ch.choices and ch.choices[0].text) == 5
