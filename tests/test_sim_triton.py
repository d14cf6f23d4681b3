"""The simulated Triton + TensorRT-LLM backend: wire fidelity against the catalog fixture, the generate
extension's shapes, and inferwatch's Triton adapter reading it as load is applied.

Raw Triton names are read from the engine package's constants (never spelled here: see test_drift). The tests
run in virtual time: simulated time moves whenever every task waits, and samples are taken on that clock.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.exporters.samples import Snapshot
from inferwatch.simulator.base import SimSettings, count_tokens
from inferwatch.simulator.clock import VirtualClock, run_virtual
from inferwatch.simulator.engines.triton import metrics as T
from inferwatch.simulator.engines.triton import repository as R
from inferwatch.simulator.engines.triton.api import VERSION
from inferwatch.simulator.scheduler import EngineParams
from inferwatch.simulator.server import create_app
from tests.conftest import ENGINE_FIXTURES, in_process
from tests.fidelity import diff, schema
from tests.support.asgi_client import post_scope

FIXTURE = ENGINE_FIXTURES / "triton" / "25.03-trtllm" / "metrics.txt"
ENSEMBLE = f"/v2/models/{R.ENSEMBLE}"


def settings(**kw: Any) -> SimSettings:
    base: dict[str, Any] = {
        "engine": "triton",
        "model": "tiny-llama",
        "load": 0,
        "seed": 3,
        "params": EngineParams(max_model_len=1024, num_blocks=64, block_size=16),
    }
    base.update(kw)
    return SimSettings(**base)


Fn = Callable[[httpx.AsyncClient, Any], Awaitable[Any]]


def run_app(s: SimSettings, fn: Fn) -> Any:
    """``fn(client, app)`` against the app in-process, in virtual time (``app.state.engine.clock``)."""

    async def main(clock: VirtualClock) -> Any:
        app = create_app(s, clock=clock)
        async with in_process(app) as client:
            return await fn(client, app)

    return run_virtual(main)


def events(body: str) -> list[dict[str, Any]]:
    chunks = [c for c in body.split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks), chunks
    return [json.loads(c.removeprefix("data: ")) for c in chunks]


async def cancelled_stream(app: Any, body: dict[str, Any], keep: int) -> list[dict[str, Any]]:
    """POST generate_stream over raw ASGI and disconnect after ``keep`` events (httpx's ASGI transport
    buffers whole responses, so it cannot go away mid-stream)."""
    payload = json.dumps(body).encode()
    received: list[bytes] = []
    enough = asyncio.Event()
    state = {"sent": False}

    async def receive() -> dict[str, Any]:
        if not state["sent"]:
            state["sent"] = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await enough.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            received.append(message["body"])
            if len(received) >= keep:
                enough.set()

    path = f"{ENSEMBLE}/generate_stream"
    scope = post_scope(path, len(payload))
    await asyncio.wait_for(app(scope, receive, send), timeout=30)
    return events(b"".join(received).decode())


async def workload(client: httpx.AsyncClient, app: Any) -> None:
    """Every path: non-streaming, streaming, a stream the client abandons, a prompt that is too long."""
    r = await client.post(f"{ENSEMBLE}/generate", json={"text_input": "tell me " * 40, "max_tokens": 12})
    assert r.status_code == 200, r.text
    r = await client.post(
        f"{ENSEMBLE}/generate_stream", json={"text_input": "a b c " * 30, "max_tokens": 8, "stream": True}
    )
    assert r.status_code == 200, r.text
    got = await cancelled_stream(
        app, {"text_input": "long story " * 20, "max_tokens": 300, "min_tokens": 300, "stream": True}, keep=3
    )
    assert 3 <= len(got) < 300
    r = await client.post(f"{ENSEMBLE}/generate", json={"text_input": "x " * 9000, "max_tokens": 5})
    assert r.status_code == 400 and "exceeds maximum input length" in r.json()["error"]


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')


def value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples named exactly ``name`` (as printed: Triton counters have no ``_total``)."""
    total, found = 0.0, False
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) == name:
            have = dict(LABEL.findall(m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total, found = total + float(m.group(3)), True
    assert found, f"no sample {name}{labels}"
    return total


def family_order(text: str) -> list[str]:
    return [ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")]


def helps(text: str) -> dict[str, str]:
    return {ln.split()[2]: ln.split(" ", 3)[3] for ln in text.splitlines() if ln.startswith("# HELP ")}


def triton(text: str, model: str | None = None) -> Snapshot:
    return translate_text(
        builtin_registry().get(V.ENGINE_TRITON), text, TranslateContext(engine=V.ENGINE_TRITON, model_override=model)
    )


# -- wire fidelity -------------------------------------------------------------------------------------
def test_metrics_match_the_fixture() -> None:
    async def fn(client: httpx.AsyncClient, app: Any) -> tuple[str, str]:
        idle = (await client.get("/metrics")).text
        await workload(client, app)
        r = await client.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain")
        return idle, r.text

    idle, text = run_app(settings(), fn)
    real = FIXTURE.read_text()
    for payload in (idle, text):  # every series exists from model load, as in Triton
        problems = diff(schema(real), schema(payload))
        assert not problems, "\n".join(problems)
    assert family_order(text) == family_order(real), "prometheus-cpp order: counters, gauges, histograms"
    assert helps(text) == helps(real)
    for line in (ln for ln in text.splitlines() if not ln.startswith("#")):
        m = SAMPLE.match(line)
        assert m, line
        keys = [kv.split("=")[0] for kv in m.group(2).split(",")] if m.group(2) else []
        plain = [k for k in keys if k != "le"]
        assert plain == sorted(plain) and ("le" not in keys or keys[-1] == "le"), line
        assert not m.group(3).endswith(".0"), f"prometheus-cpp prints integers without decimals: {line}"
    fraction = value(text, T.KV_BLOCKS, kv_cache_block_type="fraction")
    assert fraction == round(fraction, 6)


def test_counters_follow_triton_semantics() -> None:
    async def fn(client: httpx.AsyncClient, app: Any) -> str:
        await workload(client, app)
        return str((await client.get("/metrics")).text)

    text = run_app(settings(), fn)

    def per_model(name: str, model: str, **labels: str) -> float:
        return value(text, name, model=model, **labels)

    assert per_model(T.REQUEST_SUCCESS, R.TENSORRT_LLM) == 2
    assert per_model(T.REQUEST_SUCCESS, R.ENSEMBLE) == 2
    assert per_model(T.REQUEST_SUCCESS, R.PREPROCESSING) == 4  # the rejected prompt was tokenized too
    # postprocessing: 1 response (non-streaming) + 8 streamed + the abandoned stream's responses
    assert per_model(T.REQUEST_SUCCESS, R.POSTPROCESSING) >= 1 + 8 + 3
    assert per_model(T.REQUEST_FAILURE, R.TENSORRT_LLM, reason="CANCELED") == 1
    assert per_model(T.REQUEST_FAILURE, R.TENSORRT_LLM, reason="BACKEND") == 1
    assert per_model(T.REQUEST_FAILURE, R.ENSEMBLE, reason="OTHER") == 2
    assert per_model(T.REQUEST_FAILURE, R.TENSORRT_LLM, reason="REJECTED") == 0
    for model in R.MODELS:
        success = per_model(T.REQUEST_SUCCESS, model)
        assert per_model(T.INFERENCE_COUNT, model) == per_model(T.EXEC_COUNT, model) == success
        parts = sum(per_model(n, model) for n in T.DURATION_HELP if n != T.REQUEST_DURATION)
        assert 0 < parts <= per_model(T.REQUEST_DURATION, model)
    # the ensemble's compute time covers its composing models'
    assert per_model(T.COMPUTE_INFER_DURATION, R.ENSEMBLE) > per_model(T.COMPUTE_INFER_DURATION, R.TENSORRT_LLM)
    # pre/post-processing take milliseconds, generation far longer
    assert per_model(T.COMPUTE_INFER_DURATION, R.PREPROCESSING) / 4 < 20_000
    assert per_model(T.COMPUTE_INFER_DURATION, R.POSTPROCESSING) / per_model(T.REQUEST_SUCCESS, R.POSTPROCESSING) < 1000
    # first responses: the two completed requests and the abandoned stream (it had streamed)
    for model in R.DECOUPLED:
        assert value(text, f"{T.FIRST_RESPONSE}_count", model=model) == 3
    assert value(text, f"{T.OUTPUT_TOKEN_LEN}_count") == 2
    assert value(text, f"{T.OUTPUT_TOKEN_LEN}_sum") <= 12 + 8


# -- the generate extension ------------------------------------------------------------------------------
def test_server_and_model_endpoints() -> None:
    async def fn(client: httpx.AsyncClient, app: Any) -> None:
        for path in ("/v2/health/live", "/v2/health/ready", f"{ENSEMBLE}/ready"):
            assert (await client.get(path)).status_code == 200
        server = (await client.get("/v2")).json()
        assert server["name"] == "triton" and server["version"] == VERSION and "statistics" in server["extensions"]
        meta = (await client.get(ENSEMBLE)).json()
        assert meta["name"] == R.ENSEMBLE and meta["versions"] == ["1"] and meta["platform"] == "ensemble"
        assert {"text_input", "max_tokens", "stream"} <= {t["name"] for t in meta["inputs"]}
        assert "text_output" in {t["name"] for t in meta["outputs"]}
        llm = (await client.get(f"/v2/models/{R.TENSORRT_LLM}")).json()
        assert llm["platform"] == "tensorrtllm"
        r = await client.get("/v2/models/nope")
        assert r.status_code == 400 and r.json() == {"error": "Request for unknown model: 'nope' is not found"}

    run_app(settings(), fn)


def test_generate_and_generate_stream_shapes() -> None:
    async def fn(client: httpx.AsyncClient, app: Any) -> str:
        body = {"text_input": "What is machine learning?", "max_tokens": 12, "min_tokens": 12}
        r = await client.post(f"{ENSEMBLE}/generate", json=body)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        out = r.json()
        assert out["model_name"] == R.ENSEMBLE and out["model_version"] == "1"
        assert isinstance(out["text_output"], str) and out["text_output"]
        assert len(out["output_log_probs"]) == 12
        assert list(out) == sorted(out)

        r = await client.post(
            f"{ENSEMBLE}/versions/1/generate_stream", json={**body, "max_tokens": 9, "min_tokens": 9, "stream": True}
        )
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        streamed = events(r.text)
        assert len(streamed) == 9, "one SSE event per generated token"
        assert all(e["model_name"] == R.ENSEMBLE and e["text_output"] for e in streamed)
        assert all(len(e["output_log_probs"]) == 1 for e in streamed)

        # without stream=true the ensemble answers once, even on generate_stream
        r = await client.post(f"{ENSEMBLE}/generate_stream", json={**body, "max_tokens": 5, "min_tokens": 5})
        single = events(r.text)
        assert len(single) == 1 and len(single[0]["output_log_probs"]) == 5

        for path, payload, needle in (
            ("/v2/models/nope/generate", body, "unknown model"),
            ("/v2/models/nope/generate_stream", body, "unknown model"),
            (f"{ENSEMBLE}/versions/7/generate", body, "version 7"),
            (f"{ENSEMBLE}/generate", {"text_input": "hi"}, "missing required input(s) ['max_tokens']"),
            (f"{ENSEMBLE}/generate", {"text_input": "x " * 9000, "max_tokens": 3}, "exceeds maximum input length"),
            (f"{ENSEMBLE}/generate_stream", {"text_input": "x " * 9000, "max_tokens": 3}, "maximum input length"),
            (f"/v2/models/{R.TENSORRT_LLM}/generate", body, "unexpected inference input 'text_input'"),
        ):
            r = await client.post(path, json=payload)
            assert r.status_code == 400 and needle in r.json()["error"], (path, r.text)
        return str((await client.get("/metrics")).text)

    text = run_app(settings(), fn)
    snap = triton(text)
    assert snap.value(V.GENERATION_TOKENS) == 12 + 9 + 5
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_STOP) == 3
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_ERROR) == 2  # the two rejected prompts


def test_orca_load_header() -> None:
    async def fn(client: httpx.AsyncClient, app: Any) -> tuple[str, str]:
        body = {"text_input": "hi there", "max_tokens": 2}
        text = await client.post(f"{ENSEMBLE}/generate", json=body, headers={"endpoint-load-metrics-format": "text"})
        js = await client.post(f"{ENSEMBLE}/generate", json=body, headers={"endpoint-load-metrics-format": "json"})
        return text.headers["endpoint-load-metrics"], js.headers["endpoint-load-metrics"]

    text, js = run_app(settings(), fn)
    assert re.fullmatch(
        r"TEXT named_metrics\.kv_cache_utilization=\d\.\d{6}, named_metrics\.max_token_capacity=1024", text
    )
    assert json.loads(js.removeprefix("JSON "))["named_metrics"]["max_token_capacity"] == 64 * 16


# -- inferwatch's exporter reads it -------------------------------------------------------------------------
def test_exporter_follows_concurrent_requests() -> None:
    """Many long requests on a small KV cache: running, waiting and KV usage move, then requests count."""
    n, prompt = 10, "word " * 240
    prompt_tokens = count_tokens(prompt)
    assert 200 <= prompt_tokens <= 500, "a few requests fill the 64 blocks of 16 tokens"

    async def fn(client: httpx.AsyncClient, app: Any) -> dict[str, Any]:
        clock: VirtualClock = app.state.engine.clock
        seen: dict[str, Any] = {"idle": (await client.get("/metrics")).text, "running": 0.0, "waiting": 0.0, "kv": 0.0}
        body = {"text_input": prompt, "max_tokens": 40, "min_tokens": 40}
        tasks = [asyncio.create_task(client.post(f"{ENSEMBLE}/generate", json=body)) for _ in range(n)]
        while not all(t.done() for t in tasks):
            snap = triton((await client.get("/metrics")).text)
            seen["running"] = max(seen["running"], snap.value(V.REQUESTS_RUNNING))
            seen["waiting"] = max(seen["waiting"], snap.value(V.REQUESTS_WAITING))
            seen["kv"] = max(seen["kv"], snap.value(V.KV_CACHE_USAGE))
            await clock.sleep(0.01)
        assert all(t.result().status_code == 200 for t in tasks)
        seen["final"] = (await client.get("/metrics")).text
        return seen

    seen = run_app(settings(), fn)
    adapter = builtin_registry().detect(seen["final"])
    assert adapter is not None and adapter.name == V.ENGINE_TRITON
    idle = triton(seen["idle"])
    assert idle.value(V.REQUESTS) == idle.value(V.REQUESTS_RUNNING) == idle.value(V.KV_CACHE_USAGE) == 0
    assert idle.value(V.KV_CACHE_CAPACITY) == 64 * 16
    assert seen["running"] >= 1 and seen["waiting"] >= 1, "KV-bound requests wait as active - scheduled"
    assert seen["kv"] > 0.5
    final = triton(seen["final"], model="tiny-llama")
    assert final.value(V.REQUESTS, outcome=V.OUTCOME_STOP) == n
    assert final.value(V.REQUESTS_RUNNING) == final.value(V.REQUESTS_WAITING) == final.value(V.KV_CACHE_USAGE) == 0
    assert final.value(V.PROMPT_TOKENS) == n * prompt_tokens
    assert final.value(V.GENERATION_TOKENS) == n * 40
    duration = final.histogram(V.REQUEST_DURATION)
    ttft = final.histogram(V.TIME_TO_FIRST_TOKEN)
    assert duration is not None and duration.inf == n and duration.total > 0
    assert ttft is not None and ttft.inf == n
    assert {dict(k)[V.LABEL_MODEL] for k in final.values[V.REQUESTS]} == {"tiny-llama"}


def test_builtin_load_moves_canonical_metrics() -> None:
    """POST /simulator/profile kv-pressure starts the built-in load: running, KV and requests climb."""
    params = EngineParams(max_model_len=1024, num_blocks=256, block_size=16, max_num_seqs=16)

    async def fn(client: httpx.AsyncClient, app: Any) -> tuple[Snapshot, dict[str, float]]:
        before = triton((await client.get("/metrics")).text)
        app.state.engine.settings.load = None  # let the profile's own arrival rate apply
        r = await client.post("/simulator/profile", json={"profile": "kv-pressure"})
        assert r.status_code == 200 and r.json()["rps"] > 0
        peak = {"running": 0.0, "kv": 0.0, "requests": 0.0}
        clock: VirtualClock = app.state.engine.clock
        deadline = clock.now() + 400
        while clock.now() < deadline:
            snap = triton((await client.get("/metrics")).text)
            peak["running"] = max(peak["running"], snap.value(V.REQUESTS_RUNNING))
            peak["kv"] = max(peak["kv"], snap.value(V.KV_CACHE_USAGE))
            peak["requests"] = snap.value(V.REQUESTS)
            if peak["requests"] >= 2 and peak["kv"] > 0.5:
                break
            await clock.sleep(0.5)
        return before, peak

    before, peak = run_app(settings(params=params), fn)
    assert before.value(V.REQUESTS) == before.value(V.REQUESTS_RUNNING) == 0
    assert peak["running"] >= 1
    assert peak["kv"] > 0.5, "kv-pressure fills the KV cache"
    assert peak["requests"] >= 2, "built-in load requests complete through the ensemble"
