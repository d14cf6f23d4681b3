"""The proxy's client connections against slow clients and its own exhaustion.

aiohttp's low-level server keeps a connection that has not finished its request's head for its keep-alive
timeout (3630 s by default) and opens as many as the kernel lets it: 800 connections dribbling their headers
were held for as long as they liked, and once the file descriptors ran out the connection to the engine failed
and the client got ``502 upstream unreachable``, the engine blamed for the proxy's own exhaustion. Here:

- **the request's line and headers** within ``header_timeout`` (:class:`BoundedHandler`: from the connection's
  opening, or from the first byte of the next request on a kept connection); then 408 and closed (aiohttp
  bounds their size: 8190-byte lines, 128 headers);
- **the body** within ``body_timeout`` (the server's ``read_body``: 408 and closed);
- **idle keep-alive connections** after ``keep_alive_timeout`` (aiohttp's ``keepalive_timeout``), and they are
  the first closed at the connection cap;
- **connections**: at most ``max_connections``
  (:class:`~inferwatch.core.connections.ConnectionGate`, by default what the file descriptor limit allows at
  two per proxied request): at the cap the connection waiting longest for its request is closed for the
  newcomer, and when every connection has a request in progress the newcomer gets a quick 503 that names the
  proxy (:class:`Refusal`);
- **the proxy's own exhaustion**: a connection to the engine that fails with EMFILE, ENFILE, ENOBUFS or
  ENOMEM is the proxy's failure, not the engine's: 503 naming the proxy (:func:`exhausted`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from inferwatch.core.connections import ConnectionGate
from inferwatch.proxy.upstream import EXHAUSTION

REFUSED_HEAD_S: Final = 2.0
"""A refused connection has this long (at most) to send the head its 503 answers."""
MAX_REFUSED_HEAD: Final = 16 << 10


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float
    keep_alive_timeout: float
    max_connections: int


def exhausted(exc: BaseException) -> str | None:
    """What the proxy ran out of when ``exc`` (an OSError, or aiohttp's error wrapping one) says it did."""
    os_error = getattr(exc, "os_error", exc)
    code = os_error.errno if isinstance(os_error, OSError) else None
    return EXHAUSTION.get(code) if code is not None else None


def error_body(message: str, kind: str, side: str, **extra: str) -> dict[str, Any]:
    """The JSON body of an answer the proxy gives itself; ``side`` says who failed: ``proxy`` or ``upstream``."""
    return {"error": {"message": message, "type": kind, "side": side, **extra}}


def _raw_answer(status: bytes, body: dict[str, Any], retry_after: bool = False) -> bytes:
    payload = json.dumps(body).encode()
    head = b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
    if retry_after:
        head += b"Retry-After: 1\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(payload) + payload


class BoundedHandler(RequestHandler):
    """aiohttp's request handler with a deadline for each request's head and a place in the gate."""

    def __init__(self, manager: web.Server, *, gate: ConnectionGate, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._gate = gate
        self._header_timeout = header_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._busy = False
        self._evicted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._evicted:  # made room for another before it even started
            self.force_close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._busy and self._head_timer is None:  # the first byte of the next request
            self._arm()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel()
        self._gate.leave(self)
        super().connection_lost(exc)

    def head_received(self) -> None:
        """A request's head is complete (called by :func:`request_factory`)."""
        self._busy = True
        self._cancel()
        self._gate.busy(self)

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            answered = await super().finish_response(request, resp, start_time)
        finally:
            self._busy = False
            self._gate.wait(self)
        if resp.status == 408:  # a slow client: closed now, without aiohttp's lingering for the rest of its body
            self.force_close()
        return answered

    def evict(self) -> None:
        """Close this connection (idle, or still sending its head) to make room for a new one."""
        self._evicted = True
        if self.transport is not None:
            self.force_close()

    def _arm(self) -> None:
        self._head_timer = self._loop.call_later(self._header_timeout, self._head_timed_out)

    def _cancel(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._busy or self.transport is None:
            return
        message = f"request line and headers not received within {self._header_timeout:g} s"
        self.transport.write(_raw_answer(b"408 Request Timeout", error_body(message, "request_timeout", "client")))
        self.force_close()


def request_factory(
    message: Any, payload: Any, protocol: RequestHandler, writer: Any, task: asyncio.Task[None]
) -> web.BaseRequest:
    """aiohttp's request factory, telling a :class:`BoundedHandler` that its request's head arrived."""
    if isinstance(protocol, BoundedHandler):
        protocol.head_received()
    return web.BaseRequest(message, payload, protocol, writer, task, protocol._loop)


class Refusal(asyncio.Protocol):
    """A connection beyond the cap: its request's head is read (briefly), answered 503 naming the proxy, closed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, gate: ConnectionGate) -> None:
        self.loop = loop
        self.gate = gate
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport subclass
        self.timer = self.loop.call_later(REFUSED_HEAD_S, self.answer)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\r\n\r\n" in self.buffer or len(self.buffer) > MAX_REFUSED_HEAD:
            self.answer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def answer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is None or self.transport.is_closing():
            return
        message = f"the proxy has {self.gate.open} connections open, its max_connections: retry later"
        body = error_body(message, "proxy_overloaded", "proxy")
        self.transport.write(_raw_answer(b"503 Service Unavailable", body, retry_after=True))
        self.transport.close()


def protocol_factory(
    server: web.Server, loop: asyncio.AbstractEventLoop, limits: ConnectionLimits, **handler_args: Any
) -> Callable[[], asyncio.Protocol]:
    """The protocol factory for ``loop.create_server``: a :class:`BoundedHandler` of ``server`` for each connection
    the gate admits (the longest-waiting one closed at the cap), a :class:`Refusal` for the others."""
    gate = ConnectionGate(limits.max_connections)

    def make() -> asyncio.Protocol:
        handler = BoundedHandler(
            server,
            loop=loop,
            gate=gate,
            header_timeout=limits.header_timeout,
            keepalive_timeout=limits.keep_alive_timeout,
            **handler_args,
        )
        if gate.admit(handler):
            return handler
        return Refusal(loop, gate)

    return make
