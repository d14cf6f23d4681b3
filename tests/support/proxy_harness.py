"""The streaming proxy in a thread of the test process, a simulated engine as a process, and a fake upstream
(aiohttp) that records what it got: shared by ``tests/test_proxy.py``, ``tests/test_proxy_passthrough.py`` and
``tests/test_proxy_slow_clients.py``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from aiohttp import web
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferwatch.cli.common import loop_factory
from inferwatch.collector.ingest.sources import map_export
from inferwatch.collector.store.record import RequestRecord
from inferwatch.proxy.server import Proxy, ProxySettings
from inferwatch.proxy.tracing import SpanSink
from tests.conftest import free_port
from tests.support.stack import Processes, simulator_cmd

T = TypeVar("T")
MODEL = "sim-model"


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


def start_sim(procs: Processes, engine: str, otlp: str | None = None, **kw: Any) -> str:
    port = free_port()
    cmd = [*simulator_cmd(engine, port, model=MODEL, speed=1.0, **kw), "--load", "0"]
    if otlp:
        cmd += ["--otlp-endpoint", otlp]
    procs.spawn(f"sim-{engine}", cmd)
    url = f"http://127.0.0.1:{port}"
    procs.wait_http(f"sim-{engine}", url + "/metrics")
    return url


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
