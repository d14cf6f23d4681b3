"""The simulated SGLang (44cedc2): wire fidelity against the fixture written from SGLang's source, the native
``/generate`` and OpenAI-compatible shapes (the official ``openai`` client on a real socket), its counts against
its own ``/metrics`` and the exporter's translation, under load with retractions.

In-process tests run in virtual time; the socket tests in scaled wall time.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
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
from inferwatch.simulator.engines.sglang import SglangSim
from inferwatch.simulator.engines.sglang import metrics as sglang_metrics
from inferwatch.simulator.engines.sglang import spans as sim_spans
from inferwatch.simulator.scheduler import EngineParams
from inferwatch.simulator.server import create_app
from tests.conftest import ENGINE_FIXTURES, in_process, served_in_thread
from tests.fidelity import diff, schema

FIXTURE = ENGINE_FIXTURES / "sglang" / "44cedc2"
FRESH = ENGINE_FIXTURES / "sglang" / "44cedc2-fresh"
MODEL = "tiny-llama"


def settings(**kw: Any) -> SimSettings:
    base: dict[str, Any] = {
        "engine": V.ENGINE_SGLANG,
        "model": MODEL,
        "load": 0,
        "speed": 20.0,
        "seed": 1,
        "params": EngineParams(block_size=1, num_blocks=900, max_model_len=512, max_num_seqs=16),
    }
    base.update(kw)
    return SimSettings(**base)


def run_app(s: SimSettings, fn: Any) -> Any:
    """``fn(client, sim)`` against the app in-process, in virtual time."""

    async def main(clock: VirtualClock) -> Any:
        app = create_app(s, clock=clock)
        async with in_process(app) as client:
            return await fn(client, app.state.sim)

    return run_virtual(main)


@pytest.fixture
def live() -> Iterator[tuple[str, SglangSim]]:
    """The simulated SGLang on a real socket (127.0.0.1, a free port), stopped afterwards."""
    app = create_app(settings())
    with served_in_thread(app) as url:
        yield url, app.state.sim


def _events(text: str) -> list[str]:
    return [ln.removeprefix("data: ") for ln in text.split("\n\n") if ln.startswith("data: ")]


# -- /metrics fidelity ---------------------------------------------------------------------------------
def _fidelity_workload(url: str) -> None:
    """Cached prompts, a burst that retracts, an aborted stream: every family of the fixture's scenario."""
    with httpx.Client(base_url=url, timeout=60) as c:
        for _ in range(2):  # the same prompt twice: the second hits the radix cache
            c.post("/generate", json={"text": "shared system prompt " * 12, "sampling_params": {"max_new_tokens": 4}})
        burst = {"text": "burst " * 40, "sampling_params": {"max_new_tokens": 150, "ignore_eos": True}}
        threads = [threading.Thread(target=c.post, args=("/generate",), kwargs={"json": burst}) for _ in range(8)]
        for t in threads:
            t.start()
        long = {"text": "to be aborted", "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}, "stream": True}
        with c.stream("POST", "/generate", json=long) as r:
            next(r.iter_lines())  # the first chunk, then the client goes away
        for t in threads:
            t.join()


def test_metrics_match_the_fixture(live: tuple[str, SglangSim]) -> None:
    url, sim = live
    idle = httpx.get(url + "/metrics").text
    assert not diff(schema((FRESH / "metrics.txt").read_text()), schema(idle))  # nothing before a request
    _fidelity_workload(url)
    deadline = time.monotonic() + 20
    while sim.metrics.aborted.total() < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    text = httpx.get(url + "/metrics").text
    problems = diff(schema((FIXTURE / "metrics.txt").read_text()), schema(text))
    assert not problems, "\n".join(problems)
    assert sim.metrics.fam("num_retracted_requests_total").total() > 0


def test_exposition_details_match_the_fixture() -> None:
    """HELP texts, ``le`` strings, the ``pid`` of ``all``-mode gauges, no ``_created``."""

    async def fn(client: httpx.AsyncClient, sim: SglangSim) -> str:
        for _ in range(2):
            await client.post("/generate", json={"text": "abc " * 50, "sampling_params": {"max_new_tokens": 45}})
        return str((await client.get("/metrics")).text)

    text = run_app(settings(), fn)
    real = (FIXTURE / "metrics.txt").read_text()

    def helps(t: str) -> dict[str, str]:
        return {ln.split(" ")[2]: ln for ln in t.splitlines() if ln.startswith("# HELP ")}

    def les(t: str) -> set[str]:
        return {ln.split('le="')[1].split('"')[0] for ln in t.splitlines() if 'le="' in ln}

    mine, theirs = helps(text), helps(real)
    assert {k: mine[k] for k in mine.keys() & theirs.keys()} == {k: theirs[k] for k in mine.keys() & theirs.keys()}
    assert les(text) == les(real)
    pid_lines = [ln for ln in text.splitlines() if 'pid="' in ln]
    assert pid_lines and all(
        ln.startswith(tuple(sglang_metrics.P + n for n, _ in sglang_metrics.SCHEDULER_ALL_GAUGES)) for ln in pid_lines
    )
    assert "_created" not in text


# -- API shapes ----------------------------------------------------------------------------------------
def test_native_generate_shapes() -> None:
    async def fn(client: httpx.AsyncClient, sim: SglangSim) -> tuple[Any, ...]:
        whole = (
            await client.post("/generate", json={"text": "hello " * 20, "sampling_params": {"max_new_tokens": 6}})
        ).json()
        stream = await client.post(
            "/generate", json={"text": "hello " * 20, "sampling_params": {"max_new_tokens": 5}, "stream": True}
        )
        too_long = await client.post("/generate", json={"text": "x " * 2000})
        ids = (
            await client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
        ).json()
        infos = [
            await client.get(p)
            for p in ("/health", "/health_generate", "/get_model_info", "/server_info", "/v1/models")
        ]
        return whole, stream, too_long, ids, infos

    whole, stream, too_long, ids, infos = run_app(settings(), fn)
    meta = whole["meta_info"]
    assert set(whole) == {"text", "output_ids", "meta_info"} and len(whole["output_ids"]) == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6} and meta["completion_tokens"] == 6
    assert meta["prompt_tokens"] == 40 and meta["total_retractions"] == 0 and meta["e2e_latency"] > 0
    assert stream.headers["content-type"].startswith("text/event-stream")
    events = _events(stream.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))  # the whole text so far
    assert sum(len(c["output_ids"]) for c in chunks) == 5 == chunks[-1]["meta_info"]["completion_tokens"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    # one event per token, the last one carrying the finish (SGLang 0.5.9-0.5.23 _wait_one_response): no
    # extra empty final event
    assert [len(c["output_ids"]) for c in chunks] == [1] * 5
    assert too_long.status_code == 400 and "context length" in too_long.json()["error"]["message"]
    assert ids["meta_info"]["prompt_tokens"] == 3
    assert [r.status_code for r in infos] == [200] * 5
    assert infos[2].json()["is_generation"] is True and infos[3].json()["page_size"] == 1
    assert infos[4].json()["data"][0]["owned_by"] == "sglang"


def test_official_openai_client(live: tuple[str, SglangSim]) -> None:
    from openai import OpenAI

    url, _ = live
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    c = client.completions.create(model=MODEL, prompt="hello " * 10, max_tokens=7)
    assert c.usage is not None and c.usage.completion_tokens == 7 and c.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6)
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 6
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens == len(pieces) == 9 and finish == "length"
    text_stream = client.completions.create(model=MODEL, prompt="x y z", max_tokens=5, stream=True)
    assert sum(1 for ch in text_stream if ch.choices and ch.choices[0].text) == 5


def test_span_tree_like_sglang() -> None:
    exporter = InMemorySpanExporter()

    async def main(clock: VirtualClock) -> dict[str, Any]:
        app = create_app(settings(), span_exporter=exporter, clock=clock)
        async with in_process(app) as client:
            body = {"text": "trace me " * 10, "sampling_params": {"max_new_tokens": 4, "temperature": 0.5}}
            out: dict[str, Any] = (await client.post("/generate", json=body)).json()
            return out

    body = run_virtual(main)
    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    (root,) = [s for s in spans if s.parent is None]
    rid = body["meta_info"]["id"]
    assert root.name == f" Req {rid[:8]}" and root.instrumentation_scope is not None
    assert root.instrumentation_scope.name == sim_spans.SCOPE
    assert root.resource.attributes["service.name"] == sim_spans.SERVICE_NAME
    attrs = dict(root.attributes or {})
    assert attrs["rid"] == rid and attrs["module"] == "sglang::request"
    assert attrs["gen_ai.usage.completion_tokens"] == 4 and attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["gen_ai.response.finish_reasons"] == '["length"]' and "gen_ai.latency.time_in_queue" not in attrs
    assert attrs["gen_ai.latency.e2e"] == pytest.approx(body["meta_info"]["e2e_latency"], abs=1e-6)

    def parent(s: Any) -> Any:
        return by_id[s.parent.span_id] if s.parent is not None else None

    threads = sorted(s.name.split("(")[0] for s in spans if parent(s) is root)
    assert threads == ["Scheduler [TP 0] ", "Tokenizer"]
    stages = [s.name for s in spans if parent(s) is not None and parent(parent(s)) is root]
    assert stages == [
        "tokenize",
        "api_server_dispatch",
        "request_process",
        "prefill_waiting",
        "prefill_forward",
        "decode_waiting",
        "decode_forward",
    ]
    loops = [s for s in spans if s.name == "decode_loop"]
    assert [dict(s.attributes or {})["decode_ct"] for s in loops] == [0, 1, 2]
    assert all(parent(s).name == "decode_forward" for s in loops)
    linked = next(s for s in spans if s.name == "prefill_waiting")
    assert [lk.context.span_id for lk in linked.links] == [
        next(s for s in spans if s.name == "request_process").context.span_id
    ]


# -- counts: the simulator, its /metrics, the exporter -------------------------------------------------
def _loaded(seconds: float) -> tuple[str, SglangSim]:
    """The built-in load against a small KV pool (retractions), for ``seconds`` of virtual time."""
    s = settings(
        load=6.0,
        profile="steady",
        params=EngineParams(block_size=1, num_blocks=1500, max_model_len=1024, max_num_seqs=32),
    )

    async def fn(client: httpx.AsyncClient, sim: SglangSim) -> tuple[str, SglangSim]:
        await client.post("/generate", json={"text": "warm " * 30, "sampling_params": {"max_new_tokens": 8}})
        clock = sim.engine.clock
        await clock.sleep_until(clock.now() + seconds)
        return str((await client.get("/metrics")).text), sim

    out: tuple[str, SglangSim] = run_app(s, fn)
    return out


def test_counts_agree_with_metrics_under_load() -> None:
    text, sim = _loaded(60)
    m = sim.metrics
    counts = m.counts()
    assert counts["requests"] > 50 and counts["retractions"] > 0
    finished = counts["requests"]
    assert counts["e2e_count"] == finished and counts["ttft_count"] >= finished  # TTFT also of running ones
    assert m.itl.total() >= counts["generation_tokens"] - finished  # one per token after the first
    assert m.retractions.sum_of() <= counts["retractions"]  # retractions of requests still running are not in it
    assert m.queue_time.total() >= finished
    for family, value in (
        (m.requests, finished),
        (m.prompt_tokens, counts["prompt_tokens"]),
        (m.generation_tokens, counts["generation_tokens"]),
    ):
        line = next(ln for ln in text.splitlines() if ln.startswith(family.name + "{"))
        assert float(line.rsplit(" ", 1)[1]) == value


def test_exporter_translates_the_simulator() -> None:
    text, sim = _loaded(30)
    registry = builtin_registry()
    adapter = registry.get(V.ENGINE_SGLANG)
    snap = translate_text(adapter, text, TranslateContext(engine=V.ENGINE_SGLANG))
    counts = sim.metrics.counts()
    assert snap.value(V.REQUESTS) == counts["requests"]
    assert snap.value(V.PROMPT_TOKENS) == counts["prompt_tokens"]
    assert snap.value(V.GENERATION_TOKENS) == counts["generation_tokens"]
    assert snap.value(V.PREEMPTIONS) == counts["retractions"]
    ttft = snap.histogram(V.TIME_TO_FIRST_TOKEN)
    assert ttft is not None and ttft.inf == counts["ttft_count"]
    p = sim.engine.params
    assert snap.value(V.KV_CACHE_CAPACITY) == p.num_blocks * p.block_size
    assert snap.histogram(V.TIME_PER_OUTPUT_TOKEN) is None  # SGLang has none: absent, never zero
