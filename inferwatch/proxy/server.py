"""The reverse proxy: aiohttp's low-level server in front; to the engine, generation requests on connections of
their own (:mod:`~inferwatch.proxy.upstream`, relayed from the transport's callbacks), the rest through an
aiohttp client session.

Every request goes to the upstream with its method, path, query, body and headers (``Authorization``
included) minus the hop-by-hop ones; the response comes back with its status and headers, and every
read of its body is written to the client as soon as it arrives (not decompressed, not re-encoded).
Generation requests (:mod:`~inferwatch.proxy.apis`) are measured on the way (:class:`Exchange`), by tenant
(:mod:`~inferwatch.proxy.tenants`: a keyed hash of the API key, which itself is read and forgotten).

Faults: upstream refusing or unreachable → 502, no answer within the timeout → 504 (both with a
JSON body naming the upstream, ``"side": "upstream"``); the proxy's own exhaustion (no file descriptor
left to reach the engine, its connection cap reached) → 503 with ``"side": "proxy"``; a stream cut by the
upstream is cut for the client too (no final chunk); the client going away cancels the handler (aiohttp's
handler cancellation), which closes the upstream connection, and the engine aborts the request. Request
bodies over the limit → 413; slow clients (a head or body not received in time) → 408 and closed
(:mod:`~inferwatch.proxy.limits`). Bodies are never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
from aiohttp import web
from aiohttp.http_writer import StreamWriter
from multidict import CIMultiDict, MultiMapping
from yarl import URL

from inferwatch.core import vocabulary as V
from inferwatch.core.connections import connection_cap
from inferwatch.proxy import apis as A
from inferwatch.proxy.client_metrics import CONTENT_TYPE, ClientMetrics, registry_for, render
from inferwatch.proxy.limits import ConnectionLimits, error_body, exhausted, protocol_factory, request_factory
from inferwatch.proxy.measure import Exchange, loads
from inferwatch.proxy.tenants import Tenants, TenantSettings, TopTenants
from inferwatch.proxy.tracing import (
    CONTENT_CHUNKS,
    LORA_ADAPTER,
    OUTCOME,
    TENANT,
    TOKENS_ESTIMATED,
    OtlpProtocol,
    SpanSink,
    finish_reasons,
)
from inferwatch.proxy.upstream import Head, Pool, ProxyExhausted, Upstream, UpstreamError, UpstreamTimeout

log = logging.getLogger(__name__)

HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""RFC 9110 §7.6.1; plus what the proxy sets itself on each side (``host``, ``content-length``, ``expect``)."""
REQUEST_DROPPED: Final = HOP_BY_HOP | {"host", "content-length", "expect"}
RESPONSE_DROPPED: Final = HOP_BY_HOP
SKIP_AUTO: Final = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
"""aiohttp's client adds these when missing; the proxy sends the client's headers only."""
LOCAL_PATHS: Final = ("/metrics", "/healthz", "/readyz")


MODELS_REFRESH_S: Final = 60.0
MODELS_RETRY_S: Final = 5.0
CONNECT_TIMEOUT_S: Final = 10.0


def end_to_end(headers: MultiMapping[str], dropped: frozenset[str]) -> list[tuple[str, str]]:
    """The headers to pass on: without the ``dropped`` ones and those the ``Connection`` header names."""
    drop = dropped
    if "Connection" in headers:
        drop = dropped.union(t.strip().lower() for v in headers.getall("Connection") for t in v.split(","))
    return [(k, v) for k, v in headers.items() if k.lower() not in drop]


@dataclass(frozen=True)
class ProxySettings:
    """How one proxy runs (``inferwatch proxy`` options)."""

    upstream: str
    host: str = "127.0.0.1"
    port: int = 8080
    """0: any free port (tests)."""
    engine: str | None = None
    model: str | None = None
    """the model label when neither the request nor the upstream names one."""
    timeout: float = 300.0
    """seconds the upstream may stay silent: until its response starts, and between two reads."""
    max_body_bytes: int = 16 << 20
    header_timeout: float = 10.0
    """seconds a client has to send a request's line and headers; then 408 and closed."""
    body_timeout: float = 30.0
    """seconds a client has to send a request's body, from its headers; then 408 and closed."""
    keep_alive_timeout: float = 15.0
    """seconds an idle client connection is kept."""
    max_connections: int | None = None
    """client connections at most (default: what the file descriptor limit allows, two per proxied request)."""
    otlp_endpoint: str | None = None
    otlp_protocol: OtlpProtocol = "http/protobuf"
    service_name: str = V.PROXY_SERVICE
    metrics_host: str | None = None
    metrics_port: int | None = None
    """serve /metrics, /healthz and /readyz there instead of on the proxied port."""
    max_models: int = 100
    """distinct model label values at most (the rest are ``unknown``): clients choose these strings."""
    discover_models: bool = True
    tenants: TenantSettings = field(default_factory=TenantSettings)
    """who sent each request, and how many tenant label values the metrics keep (:mod:`~inferwatch.proxy.tenants`)."""
    vocabulary: V.Vocabulary = field(default_factory=V.Vocabulary)

    @property
    def engine_label(self) -> str:
        return self.engine or V.UNKNOWN

    @property
    def upstream_name(self) -> str:
        """The upstream as it may be shown: without credentials."""
        url = URL(self.upstream)
        return str(url.with_user(None)) if url.user else str(url)


class Proxy:
    """One running proxy; :meth:`start` and :meth:`stop` from the event loop that serves it."""

    def __init__(self, settings: ProxySettings, spans: SpanSink | None = None) -> None:
        self.settings = settings
        self.base = settings.upstream.rstrip("/")
        self.upstream_url = URL(settings.upstream)
        self.apis = A.engine_apis(settings.engine)
        self.upstream_info = A.ENGINE_UPSTREAM.get(settings.engine or "", A.Upstream())
        self.tenants = Tenants(settings.tenants)
        self.top_tenants = TopTenants(settings.tenants.top, settings.tenants.period)
        self.metrics = ClientMetrics(settings.engine_label, settings.vocabulary, self.top_tenants.kept)
        self.top_tenants.on_evict = self.metrics.forget
        self.registry = registry_for(self.metrics)
        self.spans = spans
        if spans is None and settings.otlp_endpoint:
            self.spans = SpanSink(settings.otlp_endpoint, settings.otlp_protocol, settings.service_name)
        self.served_model: str | None = None
        self.adapters: dict[str, str] = {}
        self.models_seen: set[str] = set()
        self._models_at = 0.0
        self._models_task: asyncio.Task[None] | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self.upstream_ok = True
        self.session: aiohttp.ClientSession | None = None
        self.pool = Pool(settings.upstream, settings.timeout, min(settings.timeout, CONNECT_TIMEOUT_S))
        self._servers: list[asyncio.Server] = []
        self.port = settings.port
        self.metrics_port = settings.metrics_port

    # -- life ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, enable_cleanup_closed=True),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=min(s.timeout, CONNECT_TIMEOUT_S), sock_read=s.timeout),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        loop = asyncio.get_running_loop()
        separate = s.metrics_port is not None
        limits = ConnectionLimits(s.header_timeout, s.keep_alive_timeout, s.max_connections or connection_cap(2))
        main = web.Server(self.handle, handler_cancellation=True, request_factory=request_factory)
        server = await loop.create_server(
            protocol_factory(main, loop, limits, access_log=None), s.host, s.port, backlog=4096
        )
        self._servers.append(server)
        self.port = server.sockets[0].getsockname()[1]
        if separate:
            local = web.Server(self.handle_local, request_factory=request_factory)
            factory = protocol_factory(local, loop, limits, access_log=None)
            msrv = await loop.create_server(factory, s.metrics_host or s.host, s.metrics_port)
            self._servers.append(msrv)
            self.metrics_port = msrv.sockets[0].getsockname()[1]
        if s.discover_models and self.upstream_info.models:
            await self._load_models()  # before the first request, when the engine is up already
            self._refresh_task = loop.create_task(self._refresh_models(), name="proxy-models")

    async def stop(self) -> None:
        for task in (self._refresh_task, self._models_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for server in self._servers:
            server.close()
            await server.wait_closed()
        if self.session is not None:
            await self.session.close()
        self.pool.close()
        if self.spans is not None:
            self.spans.shutdown()

    # -- local routes ---------------------------------------------------------------------------------------
    async def handle_local(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path in LOCAL_PATHS:
            return await self.local(request.path)
        return web.json_response({"error": "not found"}, status=404)

    async def local(self, path: str) -> web.StreamResponse:
        if path == "/metrics":
            return web.Response(body=render(self.registry), headers={"Content-Type": CONTENT_TYPE})
        if path == "/healthz":
            return web.json_response({"status": "ok"})
        ready, reason = await self.probe()
        body = {"status": "ready" if ready else "unready", "upstream": self.settings.upstream_name}
        if not ready:
            body["reason"] = reason
        return web.json_response(body, status=200 if ready else 503)

    async def probe(self) -> tuple[bool, str]:
        """Whether the upstream answers now: its health path (the engine's) with 200, else any answer."""
        assert self.session is not None
        path = self.upstream_info.health
        try:
            async with self.session.get(self.base + (path or "/"), timeout=aiohttp.ClientTimeout(total=2)) as r:
                await r.read()
                ok = r.status == 200 if path else r.status < 500
                return ok, "" if ok else f"upstream answered {r.status}"
        except TimeoutError:
            return False, "upstream did not answer within 2 s"
        except aiohttp.ClientError as exc:
            if (what := exhausted(exc)) is not None:
                return False, f"the proxy is {what}"
            return False, f"upstream unreachable: {type(exc).__name__}"

    # -- models -----------------------------------------------------------------------------------------------
    async def _refresh_models(self) -> None:
        while True:
            await asyncio.sleep(MODELS_REFRESH_S if self.served_model or self.adapters else MODELS_RETRY_S)
            await self._load_models()

    async def _load_models(self) -> None:
        assert self.session is not None and self.upstream_info.models is not None
        self._models_at = time.monotonic()
        try:
            async with self.session.get(
                self.base + self.upstream_info.models, timeout=aiohttp.ClientTimeout(total=5)
            ) as r:
                if r.status != 200:
                    return
                served, adapters = A.read_models(await r.json(content_type=None))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return
        self.served_model = served or self.served_model
        self.adapters = adapters

    def resolve(self, ask: A.Ask) -> tuple[str, str | None]:
        """(model label, LoRA adapter) of a request."""
        name, adapter = ask.model, ask.adapter
        if name in self.apis.placeholder_models:
            name = None
        if name is not None and self.apis.model_is_adapter:
            name, adapter = None, adapter or name
        if name is not None and name in self.adapters:
            name, adapter = self.adapters[name], name
        elif (
            name is not None
            and self.upstream_info.models
            and self.settings.discover_models
            and name != self.served_model
            and time.monotonic() - self._models_at > MODELS_RETRY_S
            and (self._models_task is None or self._models_task.done())
        ):  # perhaps an adapter loaded since: look again (this request keeps its name)
            self._models_task = asyncio.get_running_loop().create_task(self._load_models())
        model = name or self.served_model or self.settings.model or V.UNKNOWN
        if model not in self.models_seen:
            if len(self.models_seen) >= self.settings.max_models:
                return V.UNKNOWN, adapter
            self.models_seen.add(model)
        return model, adapter

    # -- proxying -------------------------------------------------------------------------------------------
    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        start, start_ns = time.perf_counter(), time.time_ns()
        if self.metrics_port is None and request.path in LOCAL_PATHS and request.method in ("GET", "HEAD"):
            return await self.local(request.path)
        body = await self.read_body(request)
        if isinstance(body, web.StreamResponse):
            return body
        exchange = self.exchange(request, body, start)
        if exchange is None:
            return await self.forward(request, body)
        try:
            return await self.forward_measured(request, body, exchange)
        finally:
            if exchange.outcome is None:  # cancelled: the client went away
                exchange.gone(time.perf_counter())
            self.trace(exchange, request, start_ns)

    async def read_body(self, request: web.BaseRequest) -> bytes | web.StreamResponse:
        limit = self.settings.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            return self.too_large(limit)
        if request.headers.get("Expect", "").lower() == "100-continue" and request.transport is not None:
            request.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not request.body_exists:
            return b""
        content = request.content
        if content.is_eof():  # the whole body came with the head (the usual small JSON): no wait, no timer
            whole = content.read_nowait()
            return self.too_large(limit) if len(whole) > limit else whole
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.body_timeout):
                while part := await request.content.readany():
                    size += len(part)
                    if size > limit:
                        return self.too_large(limit)
                    parts.append(part)
        except TimeoutError:
            message = f"request body not received within {self.settings.body_timeout:g} s"
            resp = web.json_response(error_body(message, "request_timeout", "client"), status=408)
            resp.force_close()
            return resp
        return b"".join(parts)

    @staticmethod
    def too_large(limit: int) -> web.StreamResponse:
        resp = web.json_response(
            {"error": {"message": f"request body over {limit} bytes", "type": "request_too_large"}}, status=413
        )
        resp.force_close()
        return resp

    def exchange(self, request: web.BaseRequest, body: bytes, start: float) -> Exchange | None:
        found = A.match(self.apis, request.method, request.path)
        if found is None:
            return None
        api, match = found
        try:
            parsed: Any = loads(body) if body else None
        except ValueError:
            parsed = None  # the engine answers it
        ask = api.ask(parsed, match)
        model, adapter = self.resolve(ask)
        tenant = self.tenants.of(request.headers)
        return Exchange(api, ask, model, adapter, start, self.metrics, tenant, self.top_tenants.label(tenant))

    def failure(self, status: int, kind: str, message: str) -> web.StreamResponse:
        if self.upstream_ok:
            log.warning("upstream %s: %s", self.settings.upstream_name, message)
            self.upstream_ok = False
        return web.json_response(
            error_body(message, kind, "upstream", upstream=self.settings.upstream_name), status=status
        )

    @staticmethod
    def exhausted(what: str) -> web.StreamResponse:
        """503: the proxy itself ran out of ``what`` (not the engine's fault)."""
        log.warning("the proxy is %s: answering 503", what)
        body = error_body(f"the proxy is {what}: retry later", "proxy_overloaded", "proxy")
        return web.json_response(body, status=503, headers={"Retry-After": "1"})

    async def forward(self, request: web.BaseRequest, body: bytes) -> web.StreamResponse:
        """Any request but a generation request, through aiohttp's client session."""
        assert self.session is not None
        headers = CIMultiDict(end_to_end(request.headers, REQUEST_DROPPED))
        url = URL(self.base + request.raw_path, encoded=True)
        try:
            up = await self.session.request(
                request.method,
                url,
                headers=headers,
                data=body if body or request.body_exists else None,
                skip_auto_headers=SKIP_AUTO,
                allow_redirects=False,
            )
        except TimeoutError:
            return self.failure(504, "upstream_timeout", f"no answer within {self.settings.timeout:g} s")
        except aiohttp.ClientError as exc:
            if (what := exhausted(exc)) is not None:
                return self.exhausted(what)
            return self.failure(502, "upstream_unavailable", f"upstream unreachable ({type(exc).__name__})")
        self.upstream_answers()
        try:
            return await self.relay(request, up)
        finally:
            up.close()  # a no-op once the body was read; otherwise the engine sees the connection go

    def upstream_answers(self) -> None:
        if not self.upstream_ok:
            log.warning("upstream %s answers again", self.settings.upstream_name)
            self.upstream_ok = True

    async def forward_measured(self, request: web.BaseRequest, body: bytes, ex: Exchange) -> web.StreamResponse:
        """A generation request, on a connection of its own to the engine (:mod:`~inferwatch.proxy.upstream`)."""
        headers = end_to_end(request.headers, REQUEST_DROPPED)
        raw = self.pool.request(request.method, request.raw_path, headers, body)
        try:
            conn, head = await self.pool.exchange(raw, request.method == "HEAD")
        except UpstreamTimeout as exc:
            ex.finish(time.perf_counter(), V.OUTCOME_ERROR, "upstream_timeout")
            return self.failure(504, "upstream_timeout", str(exc))
        except UpstreamError as exc:
            ex.finish(time.perf_counter(), V.OUTCOME_ERROR, "upstream_unavailable")
            return self.failure(502, "upstream_unavailable", str(exc))
        except ProxyExhausted as exc:
            ex.finish(time.perf_counter(), V.OUTCOME_ERROR, "proxy_overloaded")
            return self.exhausted(str(exc))
        self.upstream_answers()
        try:
            return await self.relay_measured(request, conn, head, ex)
        finally:
            self.pool.release(conn)  # kept when the response was read whole; otherwise the engine sees it go

    async def relay_measured(
        self, request: web.BaseRequest, conn: Upstream, head: Head, ex: Exchange
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=head.status, reason=head.reason or None)
        resp.headers.extend(end_to_end(head.headers, RESPONSE_DROPPED))
        ex.begin(head.status, head.headers.get("Content-Type", ""))
        writer = await resp.prepare(request)
        transport = request.transport
        if transport is None or writer is None:  # the client is gone already
            return resp
        chunked = isinstance(writer, StreamWriter) and writer.chunked
        high = transport.get_write_buffer_limits()[1]
        # once per read of a stream: bound here, not looked up each time
        closing, write, buffered = transport.is_closing, transport.write, transport.get_write_buffer_size
        feed, clock, body = ex.feed, time.perf_counter, conn.body
        assert body is not None  # (set with the head)
        live = ended = False

        def sink(payload: bytes) -> None:
            """Each read of the engine's body, from the connection's callback: on to the client, then measured."""
            nonlocal ended
            if closing():  # the client went away: aiohttp cancels the handler
                return
            if not chunked:
                write(payload)
            elif body.done and live:  # the read that ended the body: its last chunk and the end in one write
                write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(payload), payload))
                ended = True
            else:
                write(b"%x\r\n%b\r\n" % (len(payload), payload))
            feed(payload, clock())
            if buffered() > high:
                conn.pause()  # the client reads slower than the engine writes: read no more until it drains

        conn.relay(sink)  # (what came before, replayed: the end goes out by itself, after it)
        live = True
        try:
            await conn.read_body(writer.drain)
        except UpstreamError as exc:  # the upstream cut the stream or fell silent
            kind = "upstream_timeout" if isinstance(exc, UpstreamTimeout) else "stream_cut"
            ex.finish(time.perf_counter(), V.OUTCOME_ERROR, kind)
            self.cut(request)
            return resp
        ex.finish(time.perf_counter(), headers=head.headers)
        if ended and isinstance(writer, StreamWriter):  # the end went out with the last chunk: none to write again
            writer.chunked = False
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp

    async def relay(self, request: web.BaseRequest, up: aiohttp.ClientResponse) -> web.StreamResponse:
        """Any other request: every read of the upstream's body written on as it comes."""
        resp = web.StreamResponse(status=up.status, reason=up.reason)
        resp.headers.extend(end_to_end(up.headers, RESPONSE_DROPPED))
        await resp.prepare(request)
        reader = up.content
        while True:
            try:
                data = await reader.readany()
            except (aiohttp.ClientError, TimeoutError):  # the upstream cut the stream or fell silent
                self.cut(request)
                return resp
            if not data:
                break
            try:
                await resp.write(data)
            except ConnectionError:  # the client went away
                return resp
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp

    @staticmethod
    def cut(request: web.BaseRequest) -> None:
        """End the client's connection without the response's end, so that it knows it was cut."""
        if request.transport is not None:
            request.transport.abort()

    # -- spans ------------------------------------------------------------------------------------------------
    def trace(self, ex: Exchange, request: web.BaseRequest, start_ns: int) -> None:
        if self.spans is None or ex.end is None or ex.outcome is None:
            return
        end_ns = start_ns + int((ex.end - ex.start) * 1e9)
        generated = ex.generated
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": ex.api.operation,
            "gen_ai.provider.name": self.settings.engine_label,
            "gen_ai.request.model": ex.model,
            "gen_ai.request.stream": ex.ask.stream,
            "gen_ai.request.max_tokens": ex.ask.max_tokens,
            "gen_ai.response.id": ex.response_id,
            "gen_ai.response.finish_reasons": finish_reasons(ex.finish_reasons, ex.outcome) or None,
            "gen_ai.usage.input_tokens": ex.prompt_tokens,
            "gen_ai.usage.output_tokens": generated[0] if generated else None,
            "gen_ai.response.time_to_first_chunk": ex.ttft,
            "gen_ai.server.time_to_first_token": ex.ttft,
            "http.response.status_code": ex.status or None,
            "server.address": self.upstream_url.host,
            "server.port": self.upstream_url.port,
            LORA_ADAPTER: ex.adapter,
            TENANT: ex.tenant,
            OUTCOME: ex.outcome,
            TOKENS_ESTIMATED: generated[1] if generated else None,
            CONTENT_CHUNKS: ex.contents if ex.streamed else None,
        }
        error = None
        if ex.outcome == V.OUTCOME_ERROR:
            error = ex.error or (f"http {ex.status}" if ex.status >= 400 else "error")
            attrs["error.type"] = error if ex.status < 400 else str(ex.status)
        name = f"{ex.api.operation} {ex.model}"
        self.spans.emit(name, start_ns, end_ns, _headers(request.headers), attrs, error)


def _headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in ("traceparent", "tracestate")}


async def run(settings: ProxySettings, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (or forever)."""
    proxy = Proxy(settings)
    await proxy.start()
    try:
        if ready is not None:
            ready.set()
        await (stop or asyncio.Event()).wait()
    finally:
        await proxy.stop()
