"""The simulated trtllm-serve: Gen C exposition and JSON stats faithful to the fixtures, the destructive
``/metrics`` read, the collector-loop quirk, the OpenAI API with the official client, the exporter's
mapping and the OTLP spans. Raw metric names come from the fixture or from the engine package. In-process tests
run in virtual time; the official client talks to a real socket in scaled wall time."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
from openai import OpenAI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.engines.trtllm import IterationStatsAccumulator
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.exporters.samples import Snapshot
from inferwatch.simulator.base import SimSettings, SimulatedEngine
from inferwatch.simulator.clock import VirtualClock, run_virtual
from inferwatch.simulator.engines.trtllm import api as trtllm
from inferwatch.simulator.engines.trtllm.catalog import NUM_REQUESTS_RUNNING, SCHEDULED_BATCH_SIZE
from inferwatch.simulator.engines.trtllm.spans import SCOPE, SPAN_NAME
from inferwatch.simulator.scheduler import EngineParams
from inferwatch.simulator.server import create_app
from tests.conftest import ENGINE_FIXTURES, in_process, served_in_thread
from tests.fidelity import diff, schema
from tests.helpers import le_sets

FIXTURES = ENGINE_FIXTURES / "trtllm"
MODEL = "Qwen3-8B"
SYSTEM = "You are a careful assistant who answers in short sentences. " * 12


def settings(**kw: Any) -> SimSettings:
    params = EngineParams(block_size=32, num_blocks=1024, max_model_len=4096)
    return SimSettings(engine="trtllm", model=MODEL, load=0, speed=50, seed=7, params=params, **kw)


def sim_client(
    clock: VirtualClock, s: SimSettings | None = None, exporter: InMemorySpanExporter | None = None
) -> AbstractAsyncContextManager[httpx.AsyncClient]:
    return in_process(create_app(s or settings(), span_exporter=exporter, clock=clock), timeout=30)


async def chat(client: httpx.AsyncClient, user: str, max_tokens: int = 24, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "ignore_eos": True, **extra}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


async def complete(client: httpx.AsyncClient, max_tokens: int = 8) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": max_tokens, "ignore_eos": True}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


@functools.cache
def workload() -> tuple[str, list[dict[str, Any]]]:
    """Every Gen C family touched: prefix reuse, speculation, a stream, a client error."""

    async def run(clock: VirtualClock) -> tuple[str, list[dict[str, Any]]]:
        async with sim_client(clock) as client:
            await chat(client, "first question", max_tokens=40)
            await chat(client, "second question", max_tokens=40)  # reuses the system prompt's blocks
            body = {
                "model": MODEL,
                "prompt": "Once upon a time",
                "max_tokens": 12,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            assert (await client.post("/v1/completions", json=body)).status_code == 200
            bad = await client.post("/v1/chat/completions", json={"messages": []})
            assert bad.status_code == 400 and "validation error" in bad.json()["error"]
            text = (await client.get(trtllm.PROMETHEUS_PATH)).text
            stats = (await client.get(trtllm.JSON_PATH)).json()
            return text, stats

    return run_virtual(run)


def helps(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.MULTILINE))


def test_prometheus_exposition_matches_the_gen_c_fixture() -> None:
    fixture = (FIXTURES / "gen-c" / "prometheus.txt").read_text()
    text, _ = workload()
    problems = diff(schema(fixture), schema(text))
    assert not problems, "\n".join(problems)
    assert len(schema(text)) == 52
    assert helps(text) == helps(fixture)
    assert le_sets(text) == le_sets(fixture)
    assert "_created" not in text
    # multiprocess-mode rendering: gauges carry pid (the worker's differs), histograms start with _sum
    pids: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.type == "gauge":
            pids[fam.name] = {s.labels["pid"] for s in fam.samples}
        if fam.type == "histogram":
            names = [s.name for s in fam.samples]
            assert names[0] == fam.name + "_sum" and names[-1] == fam.name + "_count"
    worker = pids.pop(SCHEDULED_BATCH_SIZE)
    assert set.union(*pids.values()) == {str(os.getpid())}
    assert worker != {str(os.getpid())}
    assert re.search(r'le="1\.0"', text) and re.search(r"\} \d+\.\d+(e\+\d+)?$", text, re.MULTILINE)


def test_json_iteration_stats_have_the_fixture_keys() -> None:
    fixture = json.loads((FIXTURES / "json-iteration-stats" / "metrics.json").read_text())[0]
    _, stats = workload()
    assert stats
    for item in stats:
        assert list(item) == list(fixture)
        for key, value in fixture.items():
            if isinstance(value, dict):
                assert list(item[key]) == list(value), key
        assert re.fullmatch(r"\d\d-\d\d-\d{4} \d\d:\d\d:\d\d\.\d{6}", item["timestamp"])
        kv = item["kvCacheStats"]
        assert kv["usedNumBlocks"] + kv["freeNumBlocks"] == kv["maxNumBlocks"]
        assert kv["allocTotalBlocks"] == kv["allocNewBlocks"] + kv["reusedBlocks"]
        ifb = item["inflightBatchingStats"]
        assert ifb["numScheduledRequests"] == ifb["numContextRequests"] + ifb["numGenRequests"]
    assert stats[-1]["kvCacheStats"]["reusedBlocks"] > 0
    assert [s["iter"] for s in stats] == sorted(s["iter"] for s in stats)


def test_without_speculation_spec_stats_are_null() -> None:
    async def run(clock: VirtualClock) -> tuple[str, list[dict[str, Any]]]:
        app, _ = trtllm.create(SimulatedEngine(settings(), clock=clock), speculation=None)
        async with in_process(app, timeout=30) as client:
            await complete(client)
            return (await client.get(trtllm.PROMETHEUS_PATH)).text, (await client.get(trtllm.JSON_PATH)).json()

    text, stats = run_virtual(run)
    assert stats and all(s["specDecodingStats"] is None for s in stats)
    assert not [name for name in schema(text) if "spec" in name]


def test_destructive_read_and_accumulator() -> None:
    async def run(clock: VirtualClock) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        async with sim_client(clock) as client:
            await complete(client)
            first = (await client.get(trtllm.JSON_PATH)).json()
            again = (await client.get(trtllm.JSON_PATH)).json()
            await complete(client)
            second = (await client.get(trtllm.JSON_PATH)).json()
            return first, again, second

    first, again, second = run_virtual(run)
    assert first and second and again == []
    iters_a, iters_b = [s["iter"] for s in first], [s["iter"] for s in second]
    assert not set(iters_a) & set(iters_b)
    assert max(iters_a) < min(iters_b)
    acc = IterationStatsAccumulator()
    assert acc.feed(first) == len(first)
    seen = acc.last_iter[0]
    assert acc.feed(second) == len(second)
    assert acc.last_iter[0] > seen
    assert acc.feed(first) == 0


def test_iteration_stats_move_only_when_a_request_finishes() -> None:
    async def run(clock: VirtualClock) -> tuple[list[dict[str, Any]], str, list[dict[str, Any]], str]:
        app = create_app(settings(), clock=clock)
        engine = app.state.engine
        async with in_process(app, timeout=30) as client:
            task = asyncio.create_task(complete(client, max_tokens=400))
            while engine.model.step_count < 30:
                await clock.sleep(0.005)
            during = (await client.get(trtllm.JSON_PATH)).json()
            text_during = (await client.get(trtllm.PROMETHEUS_PATH)).text
            await task
            after = (await client.get(trtllm.JSON_PATH)).json()
            return during, text_during, after, (await client.get(trtllm.PROMETHEUS_PATH)).text

    during, text_during, after, text_after = run_virtual(run)
    assert during == []
    assert NUM_REQUESTS_RUNNING not in schema(text_during)
    assert SCHEDULED_BATCH_SIZE in schema(text_during)  # the worker publishes every step
    assert len(after) >= 30
    assert NUM_REQUESTS_RUNNING in schema(text_after)


def test_official_openai_client() -> None:
    with served_in_thread(create_app(settings())) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
        assert [m.id for m in client.models.list()] == [MODEL]
        c = client.completions.create(model=MODEL, prompt="Say something", max_tokens=7)
        assert c.usage is not None and c.usage.completion_tokens == 7 and c.choices[0].finish_reason == "length"
        assert c.choices[0].text
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert r.usage is not None and r.usage.completion_tokens <= 5 and r.choices[0].message.content

        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        with_content = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == len(with_content) > 0
        assert chunks[0].choices[0].delta.role == "assistant"
        assert with_content[-1].choices[0].finish_reason in ("stop", "length")

        cstream = client.completions.create(
            model=MODEL, prompt="Count", max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
        cchunks = list(cstream)
        texts = [ch for ch in cchunks if ch.choices and ch.choices[0].text]
        cusage = cchunks[-1].usage
        assert cusage is not None and cusage.completion_tokens == len(texts) == 6


def translate(text: str) -> Snapshot:
    registry = builtin_registry()
    adapter = registry.detect(text)
    assert adapter is not None and adapter.name == V.ENGINE_TRTLLM
    return translate_text(adapter, text, TranslateContext(engine=V.ENGINE_TRTLLM))


def test_exporter_maps_the_simulator() -> None:
    async def run(clock: VirtualClock) -> tuple[str, str, list[dict[str, Any]]]:
        async with sim_client(clock) as client:
            before = (await client.get(trtllm.PROMETHEUS_PATH)).text
            results = [await complete(client, max_tokens=5), await chat(client, "hello", max_tokens=6)]
            after = (await client.get(trtllm.PROMETHEUS_PATH)).text
            return before, after, results

    before, after, results = run_virtual(run)
    snap0, snap1 = translate(before), translate(after)
    assert snap0.value(V.REQUESTS) == 0
    assert snap1.value(V.REQUESTS) == 2
    assert snap1.value(V.REQUESTS, **{V.LABEL_OUTCOME: V.OUTCOME_ERROR}) == 0
    usage = [r["usage"] for r in results]
    assert snap1.value(V.PROMPT_TOKENS) == sum(u["prompt_tokens"] for u in usage)
    assert snap1.value(V.GENERATION_TOKENS) == sum(u["completion_tokens"] for u in usage)
    ttft = snap1.histogram(V.TIME_TO_FIRST_TOKEN)
    assert ttft is not None and ttft.inf == 2
    # the last iteration's stats still count the request that finished in it (and nothing refreshes them)
    assert snap1.value(V.REQUESTS_RUNNING) == 1 and V.KV_CACHE_USAGE in snap1.metrics()
    assert snap1.unmapped == []


def test_engine_failures_are_http_500_and_counted() -> None:
    async def run(clock: VirtualClock) -> tuple[list[httpx.Response], str]:
        async with sim_client(clock, settings(profile="errors")) as client:
            failures: list[httpx.Response] = []
            for _ in range(60):
                r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
                if r.status_code != 200:
                    failures.append(r)
                if len(failures) == 2:
                    break
            return failures, (await client.get(trtllm.PROMETHEUS_PATH)).text

    failures, text = run_virtual(run)
    assert len(failures) == 2 and all(r.status_code == 500 for r in failures)
    assert failures[0].json()["object"] == "error" and failures[0].json()["code"] == 500
    assert translate(text).value(V.REQUESTS, **{V.LABEL_OUTCOME: V.OUTCOME_ERROR}) == 2


def test_spans_carry_usage_and_honour_traceparent() -> None:
    exporter = InMemorySpanExporter()
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

    async def run(clock: VirtualClock) -> dict[str, Any]:
        async with sim_client(clock, exporter=exporter) as client:
            headers = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
            messages = [{"role": "user", "content": "trace me"}]
            body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0.5, "top_p": 0.9}
            r = await client.post("/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 200
            result: dict[str, Any] = r.json()
            return result

    result = run_virtual(run)
    spans = exporter.get_finished_spans()
    assert len(spans) == 1
    span = spans[0]
    assert span.name == SPAN_NAME and span.kind is SpanKind.SERVER
    assert span.instrumentation_scope is not None and span.instrumentation_scope.name == SCOPE
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.parent is not None and format(span.parent.span_id, "016x") == parent_id
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.usage.completion_tokens"] == result["usage"]["completion_tokens"]
    assert attrs["gen_ai.usage.prompt_tokens"] == result["usage"]["prompt_tokens"]
    assert attrs["gen_ai.request.max_tokens"] == 6 and attrs["gen_ai.request.n"] == 1
    assert attrs["gen_ai.request.temperature"] == 0.5 and attrs["gen_ai.request.top_p"] == 0.9
    assert json.loads(str(attrs["gen_ai.response.finish_reasons"])) == [result["choices"][0]["finish_reason"]]
    ttft, e2e, queue = (attrs[f"gen_ai.latency.{k}"] for k in ("time_to_first_token", "e2e", "time_in_queue"))
    assert isinstance(ttft, float) and isinstance(e2e, float) and isinstance(queue, float)
    assert 0 < ttft <= e2e and queue >= 0
    assert isinstance(attrs["gen_ai.request.id"], int)
