"""The simulated llama.cpp server held to a real llama-server b11312 capture (``b11312-cpu``): /metrics byte
for byte before the first request and in shape under load, /props, /v1/models, /slots, /health, the SSE
events and bodies of the three completion routes, the error bodies; then its behaviour (slots, deferral,
counters that move when a request ends, throughput windows reset by each scrape), its own counts against
its /metrics and the exporter, and the official ``openai`` client.

In-process tests run in virtual time; the official client talks to a real socket in scaled wall time.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.exporters.samples import Snapshot
from inferwatch.simulator.base import SimSettings, SimulatedEngine
from inferwatch.simulator.clock import VirtualClock, run_virtual
from inferwatch.simulator.engines.llamacpp import LlamacppOptions, LlamacppSim, options_from_env
from inferwatch.simulator.engines.llamacpp import api as llamacpp_api
from inferwatch.simulator.engines.llamacpp import metrics as m
from inferwatch.simulator.server import create_app, default_params
from tests.conftest import ENGINE_FIXTURES, in_process, served_in_thread
from tests.fidelity import diff, schema
from tests.support.asgi_client import leaving_client

CAPTURE = ENGINE_FIXTURES / V.ENGINE_LLAMACPP / "b11312-cpu"
RAW = CAPTURE / "raw"
SPEED = 5.0


def settings(seed: int = 7, speed: float = SPEED) -> SimSettings:
    return SimSettings(engine="llamacpp", load=0, seed=seed, speed=speed, params=default_params("llamacpp"))


def build(clock: VirtualClock, options: LlamacppOptions) -> tuple[FastAPI, LlamacppSim]:
    """The simulated server with explicit options (``create_app`` reads them from the environment)."""
    return llamacpp_api.create(SimulatedEngine(settings(), clock=clock), options)


async def until(clock: VirtualClock, cond: Callable[[], Any], timeout: float = 60.0) -> None:
    deadline = clock.now() + timeout
    while not cond():
        if clock.now() > deadline:
            raise AssertionError("condition not met in time")
        await clock.sleep(0.001)


def sse_events(body: str) -> list[Any]:
    out: list[Any] = []
    for block in body.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def metric(text: str, name: str) -> float:
    """A family's value on a llama.cpp page (one unlabelled sample per family)."""
    (line,) = [ln for ln in text.splitlines() if ln.split(" ")[0] == name]
    return float(line.split(" ")[1])


def shape(obj: Any) -> Any:
    """Keys in order at every level, a list by its first item, and scalars by their JSON type."""
    if isinstance(obj, dict):
        return [(k, shape(v)) for k, v in obj.items()]
    if isinstance(obj, list):
        return [shape(obj[0])] if obj else []
    return None if obj is None else type(obj).__name__


def collapsed(events: list[Any]) -> list[Any]:
    """The shapes of a stream's events, runs of the same shape counted once (one event per token)."""
    out: list[Any] = []
    for s in map(shape, events):
        if not out or out[-1] != s:
            out.append(s)
    return out


def captured(name: str) -> Any:
    return json.loads((CAPTURE / name).read_text())


def translate(page: str, props: dict[str, Any]) -> Snapshot:
    adapter = builtin_registry().detect(page)
    assert adapter is not None and adapter.name == V.ENGINE_LLAMACPP and adapter.parse_info is not None
    ctx = TranslateContext(engine=V.ENGINE_LLAMACPP)
    ctx.facts = adapter.parse_info(props)
    return translate_text(adapter, page, ctx)


# -- fidelity: the capture's endpoints, byte for byte where the server's own bytes are fixed --------------
def test_fresh_server_prints_the_capture_byte_for_byte() -> None:
    async def run(clock: VirtualClock) -> list[httpx.Response]:
        async with in_process(create_app(settings(), clock=clock)) as c:
            return [await c.get(p) for p in ("/metrics", "/health", "/slots", "/props", "/v1/models", "/models")]

    page, health, slots, props, models, ollama = run_virtual(run)
    assert page.content == (CAPTURE / "metrics-fresh.txt").read_bytes()
    assert page.headers["content-type"] == "text/plain; version=0.0.4"
    assert int(page.headers["process-start-time-unix"]) > 0 and page.headers["server"] == "llama.cpp"
    assert health.content == (RAW / "health-fresh.json").read_bytes()
    assert health.headers["content-type"] == "application/json; charset=utf-8"
    fresh_slots = captured("raw/slots-fresh.json")
    assert slots.json() == [{**s, "n_ctx": 16384 // 4} for s in fresh_slots]  # on by default, as the build
    body, real = props.json(), captured("props.json")
    assert shape(body) == shape(real)  # every key in its order: ui, chat_template_caps, is_sleeping, ...
    assert body["default_generation_settings"]["params"] == real["default_generation_settings"]["params"]
    assert body["chat_template_caps"] == real["chat_template_caps"] and body["modalities"] == real["modalities"]
    assert body["build_info"] == real["build_info"] == "b11312-0c1e570"
    assert re.fullmatch(r"<__media_[A-Za-z0-9]{32}__>", body["media_marker"])
    assert body["model_alias"] == settings().model and body["endpoint_slots"] and body["endpoint_metrics"]

    def undated(body: dict[str, Any]) -> dict[str, Any]:  # "created" is the time of the answer, as the server's
        return {**body, "data": [{k: v for k, v in e.items() if k != "created"} for e in body["data"]]}

    assert shape(models.json()) == shape(captured("models.json"))
    assert undated(ollama.json()) == undated(models.json())
    (entry,) = models.json()["data"]
    assert entry["id"] == settings().model and entry["aliases"] == [settings().model] and entry["tags"] == []
    assert entry["meta"]["n_ctx"] == body["default_generation_settings"]["n_ctx"] == 16384 // 4
    assert entry["meta"]["ftype"] == body["model_ftype"]


SAMPLED = {"ignore_eos": True, "seed": 1}
OPENAI_STREAM = {"model": "tiny", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
CAPTURED_STREAMS = {  # the captured requests (raw/capture-log.json)
    "sse-completion.txt": ("/completion", {"prompt": "Hello world, tell me a story", "n_predict": 8, "stream": True}),
    "sse-v1-completions.txt": ("/v1/completions", {**OPENAI_STREAM, "prompt": "What was the word when they said it"}),
    "sse-v1-chat-completions.txt": (
        "/v1/chat/completions",
        {**OPENAI_STREAM, "messages": [{"role": "user", "content": "the and of to in is you that it he was for"}]},
    ),
}
CAPTURED_BODIES = {
    "completion-nonstream.json": ("/completion", {"prompt": "Tell me about the llama server", "n_predict": 8}),
    "v1-completions-nonstream.json": ("/v1/completions", {"model": "tiny", "prompt": "Tell me", "max_tokens": 8}),
    "v1-chat-completions-nonstream.json": (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 8},
    ),
}


@pytest.fixture(scope="module")
def completions() -> dict[str, httpx.Response]:
    async def run(clock: VirtualClock) -> dict[str, httpx.Response]:
        async with in_process(create_app(settings(), clock=clock)) as c:
            requests = {**CAPTURED_STREAMS, **CAPTURED_BODIES}
            return {name: await c.post(path, json={**body, **SAMPLED}) for name, (path, body) in requests.items()}

    return run_virtual(run)


@pytest.mark.parametrize("name", sorted(CAPTURED_STREAMS))
def test_sse_events_have_the_captured_keys_in_order(name: str, completions: dict[str, httpx.Response]) -> None:
    r = completions[name]
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    real, events = sse_events((RAW / name).read_text()), sse_events(r.text)
    assert collapsed(events) == collapsed(real)  # partials, the final event(s), [DONE] only on the OpenAI routes
    final = [e for e in events if isinstance(e, dict)][-1]
    if name == "sse-completion.txt":
        assert [e["id_slot"] for e in events[:-1]] == [-1] * 8 and final["id_slot"] >= 0
        assert final["generation_settings"] == {**real[-1]["generation_settings"]}
    else:
        assert {e["model"] for e in events if isinstance(e, dict)} == {settings().model}  # not the request's
        assert {e["system_fingerprint"] for e in events if isinstance(e, dict)} == {"b11312-0c1e570"}
        assert final["usage"]["completion_tokens"] == 8 == final["timings"]["predicted_n"]
        assert final["usage"]["prompt_tokens_details"]["cached_tokens"] == final["timings"]["cache_n"]


@pytest.mark.parametrize("name", sorted(CAPTURED_BODIES))
def test_bodies_have_the_captured_keys_in_order(name: str, completions: dict[str, httpx.Response]) -> None:
    r = completions[name]
    real, body = captured(f"raw/{name}"), r.json()
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    assert shape(body) == shape(real)
    assert body["model"] == settings().model
    if name == "completion-nonstream.json":
        assert body["generation_settings"] == real["generation_settings"]  # every default, as C++ floats
        assert body["tokens_cached"] == body["tokens_evaluated"] + body["tokens_predicted"] - 1
    else:
        usage, timings = body["usage"], body["timings"]
        assert usage["prompt_tokens"] == timings["prompt_n"] + timings["cache_n"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": timings["cache_n"]}
        # generation time per decode step: the last token is sampled, never decoded
        assert timings["predicted_per_token_ms"] == pytest.approx(timings["predicted_ms"] / 7)


def test_error_bodies_as_captured() -> None:
    async def run(clock: VirtualClock) -> list[httpx.Response]:
        app, _ = build(clock, LlamacppOptions(endpoint_metrics=False, endpoint_slots=False, load_seconds=5.0))
        async with in_process(app) as c:
            loading = [await c.get("/health"), await c.get("/props"), await c.get("/v1/models")]
            await clock.sleep(5.0)
            return [
                *loading,
                await c.get("/metrics"),
                await c.get("/slots"),
                await c.post("/v1/chat/completions", json={"model": "tiny", "messages": "hello", "max_tokens": 8}),
                await c.post("/completion", json={"prompt": "word " * 9000}),
                await c.get("/props"),
                await c.post("/props", json={}),
                await c.get("/x"),
            ]

    loading, props_loading, models, no_metrics, no_slots, bad_messages, too_long, props, post, missing = run_virtual(
        run
    )
    assert loading.status_code == 503 and loading.content == (RAW / "health-loading.json").read_bytes()
    assert props_loading.content == loading.content  # only the model list answers while loading
    assert models.status_code == 200 and models.json()["data"][0]["meta"] is None
    assert no_metrics.status_code == 501 and no_metrics.content == (RAW / "metrics-disabled.json").read_bytes()
    assert no_slots.status_code == 501 and no_slots.content == (RAW / "slots-disabled.json").read_bytes()
    assert bad_messages.status_code == 400 and bad_messages.content == (RAW / "error-bad-messages.json").read_bytes()
    real = captured("raw/error-exceed-context.json")["error"]
    error = too_long.json()["error"]
    assert too_long.status_code == 400 and list(error) == list(real) and error["n_ctx"] == 16384 // 4
    assert re.sub(r"\d+", "N", error["message"]) == re.sub(r"\d+", "N", real["message"])
    assert error["message"].startswith(f"request ({error['n_prompt_tokens']} tokens)")
    assert (props.json()["endpoint_slots"], props.json()["endpoint_metrics"]) == (False, False)
    assert shape(props.json()) == shape(captured("raw/props-no-metrics-no-slots.json"))
    assert post.status_code == 501 and post.json()["error"]["type"] == "not_supported_error"  # no --props
    assert missing.status_code == 404
    assert missing.json() == {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}


# -- under load: 12 requests on 4 slots, as the capture's poll 013 (4 processing, 8 deferred) ----------------
@dataclass
class Load:
    before: str
    busy: str
    running: str
    slots_busy: list[Any]
    after: str
    again: str
    slots_after: list[Any]
    results: list[dict[str, Any]]
    props: dict[str, Any]
    steps: int


async def run_load(clock: VirtualClock) -> Load:
    app = create_app(settings(), clock=clock)
    engine = app.state.engine
    model = engine.model
    async with in_process(app) as c:
        before = (await c.get("/metrics")).text
        shared = "You are a helpful assistant who answers briefly. " * 20
        tasks = [
            asyncio.create_task(
                c.post("/completion", json={"prompt": (shared if i % 2 else "") + f"Question {i}?", "n_predict": 40})
            )
            for i in range(12)
        ]
        await until(clock, lambda: len(model.running) == 4 and len(model.waiting) == 8)
        await until(clock, lambda: all(s.generated >= 2 for s in model.running))
        running = (await c.get("/metrics")).text  # the first four are generating, none has finished
        slots_busy = (await c.get("/slots")).json()
        await until(clock, lambda: sum(1 for t in tasks if t.done()) >= 4)
        busy = (await c.get("/metrics")).text
        results = [(await t).json() for t in tasks]
        after = (await c.get("/metrics")).text
        again = (await c.get("/metrics")).text
        slots_after = (await c.get("/slots")).json()
        props = (await c.get("/props")).json()
    return Load(before, busy, running, slots_busy, after, again, slots_after, results, props, model.step_count)


@pytest.fixture(scope="module")
def load() -> Load:
    return run_virtual(run_load)


def test_loaded_page_has_the_captured_shape(load: Load) -> None:
    real = (CAPTURE / "metrics.txt").read_text()
    assert schema(load.busy) == schema(real), "\n".join(diff(schema(real), schema(load.busy)))

    def comments(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if ln.startswith("#")]

    assert comments(load.busy) == comments(real)  # HELP and TYPE, in the handler's order
    names = [ln.split()[0] for ln in load.busy.splitlines() if not ln.startswith("#")]
    assert names == [name for name, _, _ in m.FAMILIES]
    assert "{" not in load.busy and "\n\n" not in load.busy  # no labels, no blank lines
    assert metric(load.running, m.REQUESTS_PROCESSING) == metric(real, m.REQUESTS_PROCESSING) == 4
    assert metric(load.running, m.REQUESTS_DEFERRED) == metric(real, m.REQUESTS_DEFERRED) == 8
    for name in (m.SPEC_DRAFT_TOKENS_TOTAL, m.SPEC_ACCEPTED_TOKENS_TOTAL, m.SPEC_DRAFTS_TOTAL):
        assert metric(load.after, name) == metric(real, name) == 0  # no draft model


def test_tokens_are_credited_when_a_request_ends(load: Load) -> None:
    page = load.running
    assert metric(page, m.N_DECODE_TOTAL) > 0 and metric(page, m.PROMPT_TOKENS_TOTAL) > 0
    assert metric(page, m.TOKENS_PREDICTED_TOTAL) == 0 == metric(page, m.TOKENS_PREDICTED_SECONDS_TOTAL)
    assert metric(load.busy, m.TOKENS_PREDICTED_TOTAL) % 40 == 0  # in steps of whole requests, as the polls
    assert metric(load.busy, m.TOKENS_PREDICTED_TOTAL) >= 4 * 40
    assert [s["is_processing"] for s in load.slots_busy] == [True] * 4
    for s in load.slots_busy:
        assert s["n_prompt_tokens"] == s["n_prompt_tokens_processed"] + s["n_prompt_tokens_cache"]
        assert (
            s["next_token"][0]["has_next_token"]
            and s["next_token"][0]["n_remain"] == 40 - s["next_token"][0]["n_decoded"]
        )
    real_after = captured("raw/slots-after-load.json")
    assert [shape(s) for s in load.slots_after] == [shape(s) for s in real_after]
    for s in load.slots_after:  # idle: the last task's prompt length, its counters reset (as captured)
        assert (s["n_prompt_tokens_processed"], s["n_prompt_tokens_cache"]) == (0, 0)
        assert s["next_token"] == real_after[0]["next_token"]


def test_own_counts_agree_with_the_metrics(load: Load) -> None:
    text, results = load.after, load.results
    timings = [r["timings"] for r in results]
    evaluated, cached = sum(t["prompt_n"] for t in timings), sum(t["cache_n"] for t in timings)
    assert cached > 0, "the shared prefix is reused from the slot cache"
    assert metric(text, m.TOKENS_PREDICTED_TOTAL) == sum(r["tokens_predicted"] for r in results) == 12 * 40
    assert metric(text, m.PROMPT_TOKENS_TOTAL) == evaluated  # the cached prefix is not counted
    assert metric(text, m.PROMPT_TOKENS_CACHED_TOTAL) == cached
    assert evaluated + cached == sum(r["tokens_evaluated"] for r in results)
    predicted_ms = sum(t["predicted_ms"] for t in timings)
    assert metric(text, m.TOKENS_PREDICTED_SECONDS_TOTAL) == pytest.approx(predicted_ms / 1e3, rel=1e-5)
    # concurrent prompts are timed once: less than the requests' own prompt times summed
    assert 0 < metric(text, m.PROMPT_SECONDS_TOTAL) * 1e3 < sum(t["prompt_ms"] for t in timings)
    assert metric(text, m.N_DECODE_TOTAL) == load.steps
    assert metric(text, m.N_TOKENS_MAX) == max(r["tokens_evaluated"] + r["tokens_predicted"] - 1 for r in results)
    # a request is busy in its prompt decode and in predicted - 1 generation decodes, as in the capture
    busy = metric(text, m.N_BUSY_SLOTS_PER_DECODE) * metric(text, m.N_DECODE_TOTAL)
    assert busy == pytest.approx(metric(text, m.TOKENS_PREDICTED_TOTAL), rel=1e-5)
    assert metric(text, m.REQUESTS_PROCESSING) == metric(text, m.REQUESTS_DEFERRED) == 0
    assert {r["stop_type"] for r in results} == {"limit"} and {r["id_slot"] for r in results} == {0, 1, 2, 3}


def test_throughput_gauges_cover_the_window_since_the_previous_scrape(load: Load) -> None:
    def delta(name: str, a: str, b: str) -> float:
        return metric(b, name) - metric(a, name)

    # from the mid-load scrape to the end: prompt tokens over prompt seconds, decode steps over generation time
    prompt = delta(m.PROMPT_TOKENS_TOTAL, load.busy, load.after) / delta(m.PROMPT_SECONDS_TOTAL, load.busy, load.after)
    assert metric(load.after, m.PROMPT_TOKENS_SECONDS) == pytest.approx(prompt, rel=1e-4)
    finished = delta(m.TOKENS_PREDICTED_TOTAL, load.busy, load.after) / 40
    steps = delta(m.TOKENS_PREDICTED_TOTAL, load.busy, load.after) - finished
    rate = steps / delta(m.TOKENS_PREDICTED_SECONDS_TOTAL, load.busy, load.after)
    assert metric(load.after, m.PREDICTED_TOKENS_SECONDS) == pytest.approx(rate, rel=1e-4)
    # the scrape reset the window: nothing happened since, both read 0 and the counters stay put
    assert metric(load.again, m.PROMPT_TOKENS_SECONDS) == metric(load.again, m.PREDICTED_TOKENS_SECONDS) == 0
    assert metric(load.again, m.TOKENS_PREDICTED_TOTAL) == metric(load.after, m.TOKENS_PREDICTED_TOTAL)


def test_exporter_reading_the_simulator_under_load_agrees_with_its_counts(load: Load) -> None:
    results = load.results
    start, during, end = (translate(p, load.props) for p in (load.before, load.running, load.after))
    assert during.value(V.REQUESTS_RUNNING) == 4 and during.value(V.REQUESTS_WAITING) == 8
    assert end.value(V.GENERATION_TOKENS) - start.value(V.GENERATION_TOKENS) == sum(
        r["tokens_predicted"] for r in results
    )
    assert end.value(V.PROMPT_TOKENS) == sum(r["tokens_evaluated"] for r in results)
    assert end.value(V.PREFIX_CACHE_HIT_TOKENS) == sum(r["timings"]["cache_n"] for r in results)
    itl = end.histogram(V.INTER_TOKEN_LATENCY)
    assert itl is not None and itl.inf == 12 * 40
    assert itl.total == pytest.approx(sum(r["timings"]["predicted_ms"] for r in results) / 1e3, rel=1e-5)
    assert {dict(k)[V.LABEL_MODEL] for k in end.values[V.GENERATION_TOKENS]} == {settings().model}
    assert V.KV_CACHE_USAGE not in end.metrics()  # llama.cpp exports none: absent, not zero


# -- behaviour ------------------------------------------------------------------------------------------------
def test_two_slots_serve_five_requests_in_turn() -> None:
    async def run(clock: VirtualClock) -> tuple[str, httpx.Response, dict[str, Any], list[Any]]:
        app, sim = build(clock, LlamacppOptions(parallel=2))
        async with in_process(app) as c:
            body = {"prompt": "Write a long story about a lighthouse.", "n_predict": 300}
            tasks = [asyncio.create_task(c.post("/completion", json=body)) for _ in range(5)]
            await until(clock, lambda: len(sim.engine.model.running) == 2 and len(sim.engine.model.waiting) == 3)
            await clock.sleep(0.05)
            page = (await c.get("/metrics")).text
            busy = await c.get("/slots", params={"fail_on_no_slot": "1"})
            props = (await c.get("/props")).json()
            return page, busy, props, [(await t).json() for t in tasks]

    page, busy, props, done = run_virtual(run)
    assert (metric(page, m.REQUESTS_PROCESSING), metric(page, m.REQUESTS_DEFERRED)) == (2, 3)
    assert metric(page, m.N_BUSY_SLOTS_PER_DECODE) == 2
    assert busy.status_code == 503
    assert busy.json() == {"error": {"code": 503, "message": "no slot available", "type": "unavailable_error"}}
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 16384 // 2
    assert {r["id_slot"] for r in done} == {0, 1} and all(r["tokens_predicted"] <= 300 for r in done)


def test_options_from_llama_server_environment() -> None:
    env = {"LLAMA_ARG_N_PARALLEL": "2", "LLAMA_ARG_ENDPOINT_SLOTS": "0", "LLAMA_ARG_ENDPOINT_METRICS": "0"}
    assert options_from_env(env) == LlamacppOptions(parallel=2, endpoint_slots=False, endpoint_metrics=False)
    assert options_from_env({}) == LlamacppOptions() == LlamacppOptions(endpoint_slots=True, endpoint_metrics=True)


def test_native_stream_and_other_errors() -> None:
    async def run(clock: VirtualClock) -> list[httpx.Response]:
        async with in_process(create_app(settings(), clock=clock)) as c:
            body = {"prompt": "The quick brown fox", "n_predict": 7, "ignore_eos": True, "stream": True}
            chat = {"messages": [{"role": "user", "content": "x"}]}
            return [
                await c.post("/completions", json=body),
                await c.post("/completion", json={"prompt": "word " * 20000, "stream": True}),
                await c.post("/completion", json={"n_predict": 3}),
                await c.post("/v1/chat/completions", json={**chat, "n": 2}),
                await c.post("/v1/chat/completions", json={"messages": [{"role": "user"}]}),
            ]

    stream, too_long_stream, no_prompt, two_choices, no_content = run_virtual(run)
    events = sse_events(stream.text)
    partials, final = events[:-1], events[-1]
    assert "[DONE]" not in events  # the native route ends without it
    assert [e["tokens_predicted"] for e in partials] == list(range(1, 8)) and all(e["content"] for e in partials)
    assert final["stop"] is True and final["content"] == "" and final["tokens"] == [] and final["stop_type"] == "limit"
    assert final["truncated"] is False and final["timings"]["predicted_n"] == 7
    assert too_long_stream.status_code == 400  # a stream's first result decides the status
    assert too_long_stream.json()["error"]["type"] == "exceed_context_size_error"
    assert no_prompt.status_code == 400 and no_prompt.json()["error"]["type"] == "invalid_request_error"
    assert two_choices.status_code == 500
    error = two_choices.json()["error"]
    assert (error["code"], error["type"], error["message"]) == (
        500,
        "server_error",
        "Only one completion choice is allowed",
    )
    assert no_content.status_code == 400
    assert no_content.json()["error"]["message"] == "All non-assistant messages must contain 'content'"


def test_engine_failure_and_several_prompts() -> None:
    async def run(clock: VirtualClock) -> tuple[httpx.Response, httpx.Response, httpx.Response, str]:
        app = create_app(settings(), clock=clock)
        async with in_process(app) as c:
            app.state.engine.params.error_rate = 1.0
            failed = await c.post("/completion", json={"prompt": "Hello", "n_predict": 4})
            failed_stream = await c.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4, "stream": True})
            app.state.engine.params.error_rate = 0.0
            several = await c.post("/completion", json={"prompt": ["First prompt", "Second prompt"], "n_predict": 3})
            return failed, failed_stream, several, (await c.get("/metrics")).text

    failed, failed_stream, several, page = run_virtual(run)
    compute_error = {"error": {"code": 500, "message": "Compute error.", "type": "server_error"}}
    assert failed.status_code == failed_stream.status_code == 500
    assert failed.json() == failed_stream.json() == compute_error
    results = several.json()
    assert isinstance(results, list) and [r["index"] for r in results] == [0, 1]
    assert metric(page, m.TOKENS_PREDICTED_TOTAL) == sum(r["tokens_predicted"] for r in results)


# -- the official openai client on a real socket -------------------------------------------------------------
def test_official_openai_client() -> None:
    from openai import OpenAI

    with served_in_thread(create_app(settings(seed=3, speed=20.0))) as base:
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        messages: Any = [{"role": "user", "content": "Why is the sky blue?"}]
        models = [mo.id for mo in client.models.list()]
        completion = client.completions.create(model="m1", prompt="Once upon a time", max_tokens=8)
        chat = client.chat.completions.create(model="m2", messages=messages, max_tokens=6)
        chunks = list(client.completions.create(model="m1", prompt="Once upon a time", max_tokens=5, stream=True))
        chat_chunks = list(
            client.chat.completions.create(
                model="m2", messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True}
            )
        )
        client.close()

    served = settings().model
    assert models == [served] and completion.model == chat.model == served  # the server's model, not the request's
    assert completion.object == "text_completion" and completion.usage is not None
    assert completion.usage.completion_tokens <= 8 and completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens is not None
    assert chat.choices[0].message.role == "assistant" and chat.id.startswith("chatcmpl-")
    assert chat.usage is not None and chat.usage.completion_tokens <= 6 and chat.model_extra is not None
    assert chat.model_extra["timings"]["predicted_n"] == chat.usage.completion_tokens
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert chat_chunks[0].choices[0].delta.role == "assistant" and chat_chunks[0].choices[0].delta.content is None
    usage = chat_chunks[-1].usage
    assert chat_chunks[-1].choices == [] and usage is not None
    assert chat_chunks[-2].choices[0].finish_reason in ("stop", "length")
    content_chunks = [c for c in chat_chunks[1:-2] if c.choices]
    assert len(content_chunks) == usage.completion_tokens  # one delta per token
    assert "".join(c.choices[0].delta.content or "" for c in content_chunks)


def test_a_client_that_leaves_frees_its_slot() -> None:
    async def run(clock: VirtualClock) -> tuple[int, list[Any], str]:
        app, sim = build(clock, LlamacppOptions())
        async with in_process(app) as c:
            body = {"prompt": "Tell me everything", "n_predict": 500, "stream": True}
            _, events = await leaving_client(app, "/completion", body, asyncio.Event(), after_events=3)
            await until(clock, lambda: not sim.engine.model.running)
            return events, (await c.get("/slots")).json(), (await c.get("/metrics")).text

    events, slots, page = run_virtual(run)
    assert 3 <= events < 500
    assert not any(s["is_processing"] for s in slots)
    assert metric(page, m.REQUESTS_PROCESSING) == 0
    assert metric(page, m.TOKENS_PREDICTED_TOTAL) == 0  # a cancelled task is never credited
    assert metric(page, m.PROMPT_TOKENS_TOTAL) > 0  # its prompt batch was
