"""``inferwatch proxy`` in front of SGLang and llama.cpp's server: their API shapes as the proxy reads them.

The unit tests feed the proxy's real measurement (:class:`~inferwatch.proxy.measure.Exchange` with its
:class:`~inferwatch.proxy.client_metrics.ClientMetrics`) byte streams and bodies shaped as the engines'
sources write them (SGLang's ``http_server.py`` and ``tokenizer_manager.py``, llama.cpp's ``server.cpp`` and
``server-task.cpp``; files and commits in :mod:`inferwatch.proxy.apis`), on a virtual clock. The end-to-end
tests run the official ``openai`` client and native requests through the proxy in front of the simulated
engines and compare the proxy's counts with the engines' own usage.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.exporters.samples import Snapshot
from inferwatch.proxy import apis as A
from inferwatch.proxy.client_metrics import ClientMetrics, registry_for, render
from inferwatch.proxy.measure import Exchange
from tests.helpers import has, value
from tests.support.proxy_harness import MODEL, running_proxy, start_sim
from tests.support.stack import Processes


def sse(*events: Any, done: bool = True) -> list[bytes]:
    """Each event as the engines write it (``data: <json>`` and a blank line), ``data: [DONE]`` last if ``done``."""
    out = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]
    return [*out, b"data: [DONE]\n\n"] if done else out


def exchange(engine: str, method: str, path: str, body: dict[str, Any]) -> Exchange:
    found = A.match(A.engine_apis(engine), method, path)
    assert found is not None, path
    api, m = found
    metrics = ClientMetrics(engine, V.Vocabulary())
    return Exchange(api, api.ask(body, m), MODEL, None, 0.0, metrics)


def streamed(ex: Exchange, chunks: list[bytes], step: float = 0.1, first: float = 0.5) -> str:
    """``chunks`` forwarded at ``first``, ``first + step``, ...; the request over one step after the last."""
    ex.begin(200, "text/event-stream")
    now = first
    for chunk in chunks:
        ex.feed(chunk, now)
        now += step
    return ex.finish(now - step)


def exposition(ex: Exchange) -> str:
    return render(registry_for(ex.metrics, process=False)).decode()


# -- SGLang: /generate ---------------------------------------------------------------------------------------
def sglang_out(text: str, completion: int, finish: dict[str, Any] | None = None, rid: str = "r1") -> dict[str, Any]:
    """One output of ``/generate``: ``text`` the whole text so far, ``meta_info`` running totals."""
    return {
        "text": text,
        "output_ids": list(range(completion)),
        "meta_info": {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": 7,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": completion,
            "cached_tokens": 3,
        },
    }


def test_sglang_generate_stream_counts_events_not_text_and_takes_the_usage() -> None:
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4}, "stream": True}
    ex = exchange(V.ENGINE_SGLANG, "POST", "/generate", body)
    assert ex.api is A.SGLANG_GENERATE
    assert (ex.ask.stream, ex.ask.max_tokens, ex.ask.model) == (True, 4, None)
    # the text is cumulative: four events, four tokens, the last with its finish reason
    events = [sglang_out(" Paris" + "." * i, i + 1) for i in range(3)]
    events.append(sglang_out(" Paris...", 4, {"type": "length", "length": 4}))
    outcome = streamed(ex, sse(*events))
    assert outcome == V.OUTCOME_LENGTH
    assert ex.ttft == pytest.approx(0.5)
    assert (ex.contents, ex.prompt_tokens, ex.completion_tokens, ex.response_id) == (4, 7, 4, "r1")
    text = exposition(ex)
    labels = {"engine": V.ENGINE_SGLANG, "model": MODEL}
    assert value(text, V.CLIENT_TIME_TO_FIRST_TOKEN.name + "_sum", **labels) == pytest.approx(0.5)
    assert value(text, V.CLIENT_CHUNK_GAP.name + "_count", **labels) == 3
    # TPOT = (end, at [DONE] - first content) / (tokens - 1) = (0.9 - 0.5) / 3
    assert value(text, V.CLIENT_TIME_PER_OUTPUT_TOKEN.name + "_sum", **labels) == pytest.approx(0.4 / 3)
    assert value(text, V.CLIENT_GENERATION_TOKENS.name, **labels, estimated=V.FALSE) == 4
    assert value(text, V.CLIENT_PROMPT_TOKENS.name, **labels, estimated=V.FALSE) == 7
    assert value(text, V.CLIENT_REQUESTS.name, **labels, outcome=V.OUTCOME_LENGTH) == 1


def test_sglang_coalesced_events_keep_the_exact_token_count() -> None:
    """Outputs queued while the client reads are sent as one event (the latest text and totals): the proxy's
    event count undercounts, the engine's ``completion_tokens`` does not."""
    ex = exchange(V.ENGINE_SGLANG, "POST", "/generate", {"input_ids": [1, 2, 3], "stream": True})
    events = [sglang_out("a", 1), sglang_out("abcd", 4), sglang_out("abcdef", 6, {"type": "stop", "matched": 2})]
    assert streamed(ex, sse(*events)) == V.OUTCOME_STOP
    assert ex.tokens == 3 and ex.generated == (6, False)


def test_sglang_abort_and_stream_error_are_errors() -> None:
    ex = exchange(V.ENGINE_SGLANG, "POST", "/generate", {"text": "x", "stream": True})
    abort = {"type": "abort", "message": "The request is aborted by the scheduler", "status_code": 500}
    assert streamed(ex, sse(sglang_out("a", 1), sglang_out("a", 1, abort))) == V.OUTCOME_ERROR
    assert ex.error == abort["message"]
    ex = exchange(V.ENGINE_SGLANG, "POST", "/generate", {"text": "x", "stream": True})
    assert streamed(ex, sse({"error": {"message": "prompt too long"}})) == V.OUTCOME_ERROR
    assert ex.error == "prompt too long" and ex.first_content is None


def test_sglang_generate_bodies_single_and_batch() -> None:
    ex = exchange(V.ENGINE_SGLANG, "POST", "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 3}})
    ex.begin(200, "application/json")
    ex.feed(json.dumps(sglang_out("abc", 3, {"type": "length", "length": 3})).encode(), 1.0)
    assert ex.finish(1.0) == V.OUTCOME_LENGTH and ex.generated == (3, False) and ex.prompt_tokens == 7
    ex = exchange(V.ENGINE_SGLANG, "POST", "/generate", {"text": ["x", "y"], "lora_path": ["a", "b"]})
    assert ex.ask.adapter is None  # a batch names one adapter per prompt: none for the request
    ex.begin(200, "application/json")
    batch = [sglang_out("ab", 2, {"type": "stop", "matched": 2}, "r1"), sglang_out("abc", 3, {"type": "stop"}, "r2")]
    ex.feed(json.dumps(batch).encode(), 1.0)
    assert ex.finish(1.0) == V.OUTCOME_STOP
    assert (ex.generated, ex.prompt_tokens, ex.response_id) == ((5, False), 14, "r1")
    assert exchange(V.ENGINE_SGLANG, "POST", "/generate", {"text": "x", "lora_path": "sql"}).ask.adapter == "sql"


# -- llama.cpp's server: /completion, /completions --------------------------------------------------------------
def partial(content: str, predicted: int, tokens: list[int] | None = None) -> dict[str, Any]:
    return {
        "index": 0,
        "content": content,
        "tokens": [predicted] if tokens is None else tokens,
        "stop": False,
        "id_slot": 0,
        "tokens_predicted": predicted,
        "tokens_evaluated": 9,
    }


def final(stop_type: str, predicted: int, streamed: bool = True) -> dict[str, Any]:
    return {
        "index": 0,
        "content": "" if streamed else "abc",
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": "gpt-3.5-turbo",
        "tokens_predicted": predicted,
        "tokens_evaluated": 9,
        "stop_type": stop_type,
        "stopping_word": "",
        "tokens_cached": 4,
        "timings": {"prompt_n": 9, "prompt_ms": 12.5, "predicted_n": predicted, "predicted_ms": 30.0},
    }


@pytest.mark.parametrize("path", ["/completion", "/completions"])
def test_llamacpp_completion_stream_ends_at_its_final_event(path: str) -> None:
    ex = exchange(V.ENGINE_LLAMACPP, "POST", path, {"prompt": "Hi", "n_predict": 3, "stream": True})
    assert ex.api is A.LLAMACPP_COMPLETION and (ex.ask.stream, ex.ask.max_tokens) == (True, 3)
    progress = {**partial("", 0, []), "prompt_progress": {"total": 9, "cache": 4, "processed": 9, "time_ms": 3.0}}
    chunks = sse(progress, partial("a", 1), partial("b", 2), partial("c", 3), final("limit", 3), done=False)
    ex.begin(200, "text/event-stream")
    for i, chunk in enumerate(chunks):
        ex.feed(chunk, 0.4 + 0.1 * i)
    # no [DONE] in the native stream: the final event says the client has it all
    assert ex.complete
    assert ex.gone(1.0) == V.OUTCOME_LENGTH
    assert ex.ttft == pytest.approx(0.5)  # the prompt-progress event carries no content
    assert (ex.contents, ex.tokens, ex.completion_tokens, ex.prompt_tokens) == (3, 3, 3, 9)
    assert ex.finish_reasons == ["limit"]


def test_llamacpp_completion_eos_word_and_errors() -> None:
    for stop_type in ("eos", "word"):
        ex = exchange(V.ENGINE_LLAMACPP, "POST", "/completion", {"prompt": "Hi", "stream": True})
        assert streamed(ex, sse(partial("a", 1), final(stop_type, 1), done=False)) == V.OUTCOME_STOP
    ex = exchange(V.ENGINE_LLAMACPP, "POST", "/completion", {"prompt": "Hi", "stream": True})
    error = {"error": {"code": 500, "message": "context shift is disabled", "type": "server_error"}}
    assert streamed(ex, sse(partial("a", 1), error, done=False)) == V.OUTCOME_ERROR
    assert ex.error == "context shift is disabled" and not ex.complete
    # the first error of a stream is answered as a plain error response
    ex = exchange(V.ENGINE_LLAMACPP, "POST", "/completion", {"prompt": "Hi", "stream": True})
    ex.begin(400, "application/json; charset=utf-8")
    assert ex.finish(0.1) == V.OUTCOME_ERROR


def test_llamacpp_completion_bodies_and_budgets() -> None:
    ex = exchange(V.ENGINE_LLAMACPP, "POST", "/completion", {"prompt": "Hi", "n_predict": -1})
    assert ex.ask.max_tokens is None  # -1: no limit
    ex.begin(200, "application/json; charset=utf-8")
    ex.feed(json.dumps(final("eos", 5, streamed=False)).encode(), 1.0)
    assert ex.finish(1.0) == V.OUTCOME_STOP and ex.generated == (5, False) and ex.contents == 1
    # several prompts: an array of finals, usage summed
    ex = exchange(V.ENGINE_LLAMACPP, "POST", "/completion", {"prompt": ["a", "b"], "max_tokens": 2})
    assert ex.ask.max_tokens == 2
    ex.begin(200, "application/json; charset=utf-8")
    ex.feed(json.dumps([final("limit", 2, streamed=False), final("limit", 2, streamed=False)]).encode(), 1.0)
    assert ex.finish(1.0) == V.OUTCOME_LENGTH and ex.generated == (4, False) and ex.prompt_tokens == 18


def test_llamacpp_openai_requests_are_labelled_with_the_served_model() -> None:
    """llama.cpp echoes whatever ``model`` a client sends; the proxy labels with what ``/v1/models`` names."""
    apis = A.engine_apis(V.ENGINE_LLAMACPP)
    for path in ("/v1/chat/completions", "/chat/completions", "/v1/completions"):
        found = A.match(apis, "POST", path)
        assert found is not None
        api, m = found
        ask = api.ask({"model": "gpt-4o", "max_tokens": 5, "stream": True}, m)
        assert (ask.model, ask.max_tokens, ask.stream) == (None, 5, True)
    assert A.match(apis, "POST", "/generate") is None
    found = A.match(A.engine_apis(V.ENGINE_SGLANG), "POST", "/v1/chat/completions")
    assert found is not None and found[0].ask({"model": "m"}, found[1]).model == "m"


# -- tables, models and the shapes without --engine --------------------------------------------------------------
def test_engine_tables_and_models() -> None:
    for engine in (V.ENGINE_SGLANG, V.ENGINE_LLAMACPP):
        assert A.ENGINE_UPSTREAM[engine] == A.Upstream(health="/health", models="/v1/models")
        assert not A.ENGINE_APIS[engine].model_is_adapter
    # SGLang's /v1/models: the served model, and LoRA adapters with their parent
    sglang_models = {
        "object": "list",
        "data": [
            {"id": "qwen", "object": "model", "root": "qwen", "parent": None, "max_model_len": 32768},
            {"id": "sql", "object": "model", "root": "/lora/sql", "parent": "qwen", "max_model_len": None},
        ],
    }
    assert A.read_models(sglang_models) == ("qwen", {"sql": "qwen"})
    # llama.cpp's: one entry, its alias (or the model's path)
    llamacpp_models = {
        "models": [{"name": "llama-3.2-1b", "model": "llama-3.2-1b", "type": "model"}],
        "object": "list",
        "data": [{"id": "llama-3.2-1b", "object": "model", "created": 1, "owned_by": "llamacpp", "meta": None}],
    }
    assert A.read_models(llamacpp_models) == ("llama-3.2-1b", {})


def test_without_engine_generate_is_read_by_its_body() -> None:
    """TGI's ``/generate`` and SGLang's share a path: without ``--engine`` the answer says which spoke."""
    apis = A.engine_apis(None)
    found = A.match(apis, "POST", "/generate")
    assert found is not None and found[0] is A.ANY_GENERATE
    api, m = found
    assert api.ask({"text": "x", "sampling_params": {"max_new_tokens": 9}, "stream": True}, m).max_tokens == 9
    assert api.ask({"text": "x", "stream": True}, m).stream is True
    tgi_ask = api.ask({"inputs": "x", "parameters": {"max_new_tokens": 8}, "stream": True}, m)
    assert (tgi_ask.max_tokens, tgi_ask.stream) == (8, False)  # TGI's /generate never streams
    sglang = api.event(sglang_out("ab", 2, {"type": "length", "length": 2}))
    assert (sglang.content, sglang.completion_tokens, sglang.finish_reasons) == (1, 2, ["length"])
    tgi = api.body({"generated_text": "ab", "details": {"finish_reason": "length"}}, {"x-generated-tokens": "2"})
    assert (tgi.content, tgi.completion_tokens, tgi.finish_reasons) == (1, 2, ["length"])
    assert A.match(apis, "POST", "/completion") is not None


# -- end to end: the official clients and native requests through the proxy, the simulators' own counts ----------
def engine_snapshot(sim: str, engine: str) -> Snapshot:
    """The simulator's ``/metrics`` as inferwatch's exporter translates it."""
    text = httpx.get(sim + "/metrics", timeout=10).text
    adapter = builtin_registry().detect(text)
    assert adapter is not None and adapter.name == engine
    return translate_text(adapter, text, TranslateContext(engine=engine))


def native_stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A native SSE stream's events (``[DONE]`` left out)."""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def openai_requests(client: openai.OpenAI, model: str) -> tuple[int, int]:
    """Chat (whole and streamed, with usage) and a streamed completion: (completion tokens, streamed requests)."""
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=6)
    assert whole.usage is not None and whole.choices[0].message.content
    tokens, pieces, usage = whole.usage.completion_tokens, 0, None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, stream=True, stream_options={"include_usage": True}
    ):
        pieces += bool(chunk.choices and chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert pieces > 0 and usage is not None
    tokens += usage.completion_tokens
    for c in client.completions.create(
        model=model, prompt="hello", max_tokens=5, stream=True, stream_options={"include_usage": True}
    ):
        usage = c.usage or usage
    tokens += usage.completion_tokens
    return tokens, 2


def test_sglang_clients_through_the_proxy_agree_with_the_engine(procs: Processes) -> None:
    sim = start_sim(procs, V.ENGINE_SGLANG)
    with running_proxy(sim, engine=V.ENGINE_SGLANG) as run:
        client = openai.OpenAI(base_url=run.url + "/v1", api_key="-", max_retries=0)
        tokens, streamed_requests = openai_requests(client, MODEL)
        events = native_stream(run.url + "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 7}})
        assert events[-1]["meta_info"]["finish_reason"]["type"] in ("length", "stop")
        tokens += events[-1]["meta_info"]["completion_tokens"]
        whole = httpx.post(run.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}})
        tokens += whole.json()["meta_info"]["completion_tokens"]
        text = run.metrics()
    engine = engine_snapshot(sim, V.ENGINE_SGLANG)
    labels = {"engine": V.ENGINE_SGLANG, "model": MODEL}
    assert value(text, V.CLIENT_REQUESTS.name, **labels) == engine.value(V.REQUESTS) == 5
    assert not has(text, V.CLIENT_REQUESTS.name, outcome=V.OUTCOME_ERROR)
    # every request's usage came back: the proxy's tokens are the engine's, none estimated
    assert value(text, V.CLIENT_GENERATION_TOKENS.name, **labels, estimated=V.FALSE) == tokens
    assert engine.value(V.GENERATION_TOKENS) == tokens
    assert not has(text, V.CLIENT_GENERATION_TOKENS.name, estimated=V.TRUE)
    # a first token the client sees on each streamed request (the engine times every request's)
    assert value(text, V.CLIENT_TIME_TO_FIRST_TOKEN.name + "_count", **labels) == streamed_requests + 1
    ttft = engine.histogram(V.TIME_TO_FIRST_TOKEN)
    assert ttft is not None and ttft.inf == 5
    # SGLang has no time per output token: the proxy's is the only one
    assert engine.histogram(V.TIME_PER_OUTPUT_TOKEN) is None
    assert value(text, V.CLIENT_TIME_PER_OUTPUT_TOKEN.name + "_count", **labels) == streamed_requests + 1


def test_llamacpp_clients_through_the_proxy_agree_with_the_engine(procs: Processes) -> None:
    sim = start_sim(procs, V.ENGINE_LLAMACPP)
    with running_proxy(sim, engine=V.ENGINE_LLAMACPP) as run:
        client = openai.OpenAI(base_url=run.url + "/v1", api_key="-", max_retries=0)
        tokens, streamed_requests = openai_requests(client, "gpt-4o")  # a name llama.cpp only echoes back
        events = native_stream(run.url + "/completion", {"prompt": "hello", "n_predict": 7})
        assert events[-1]["stop"] is True and events[-1]["stop_type"] in ("limit", "eos")
        tokens += events[-1]["tokens_predicted"]
        whole = httpx.post(run.url + "/completions", json={"prompt": "hi", "n_predict": 4})
        tokens += whole.json()["tokens_predicted"]
        text = run.metrics()
    engine = engine_snapshot(sim, V.ENGINE_LLAMACPP)
    labels = {"engine": V.ENGINE_LLAMACPP, "model": MODEL}  # the model /v1/models names, not the request's
    assert value(text, V.CLIENT_REQUESTS.name, **labels) == 5
    assert not has(text, V.CLIENT_REQUESTS.name, model="gpt-4o")
    assert not has(text, V.CLIENT_REQUESTS.name, outcome=V.OUTCOME_ERROR)
    assert value(text, V.CLIENT_GENERATION_TOKENS.name, **labels, estimated=V.FALSE) == tokens
    assert engine.value(V.GENERATION_TOKENS) == tokens
    # llama.cpp times nothing per request: first tokens and tokens' pace are the proxy's alone
    assert engine.histogram(V.TIME_TO_FIRST_TOKEN) is None and engine.histogram(V.TIME_PER_OUTPUT_TOKEN) is None
    assert value(text, V.CLIENT_TIME_TO_FIRST_TOKEN.name + "_count", **labels) == streamed_requests + 1
    assert value(text, V.CLIENT_TIME_PER_OUTPUT_TOKEN.name + "_count", **labels) == streamed_requests + 1


def test_llamacpp_requests_reach_the_collector_through_the_proxy(procs: Processes) -> None:
    """llama.cpp sends no traces: its request rows in the collector are the proxy's spans, mapped by the
    collector's own sources, and their tokens are the engine's."""
    sim = start_sim(procs, V.ENGINE_LLAMACPP)
    with running_proxy(sim, engine=V.ENGINE_LLAMACPP) as run:
        client = openai.OpenAI(base_url=run.url + "/v1", api_key="-", max_retries=0)
        tokens, streamed_requests = openai_requests(client, MODEL)  # 3 requests, 2 of them streamed
        events = native_stream(run.url + "/completion", {"prompt": "hello", "n_predict": 7})
        tokens += events[-1]["tokens_predicted"]
        records = run.records(count=4)
    engine = engine_snapshot(sim, V.ENGINE_LLAMACPP)
    assert len(records) == 4
    assert {(r.engine, r.model, r.service) for r in records} == {(V.ENGINE_LLAMACPP, MODEL, V.PROXY_SERVICE)}
    assert sum(r.generation_tokens or 0 for r in records) == tokens == engine.value(V.GENERATION_TOKENS)
    assert sum(r.prompt_tokens or 0 for r in records) == engine.value(V.PROMPT_TOKENS)
    # the engine measures no first token: the rows' TTFT and TPOT are the client's, one per streamed request
    timed = [r for r in records if r.time_to_first_token is not None and r.time_per_output_token is not None]
    assert len(timed) == streamed_requests + 1
