"""The collector's HTTP connections against slow clients: uvicorn's httptools protocol with deadlines and caps.

uvicorn by itself arms no timer until a connection's first answer (a connection that sends nothing, or its
request's head a byte a second, stays forever; every byte cancels the keep-alive timer), and its
``limit_concurrency`` counts *connections*: 105 connections dribbling their headers held the 100-connection
cap and every ``/healthz`` got 503. :func:`bounded_protocol` makes the protocol class the collector serves
with (``uvicorn.Config(http=...)``; httptools, a dependency, is the parser it hooks):

- **the request's line and headers** within ``header_timeout`` (from the connection's opening, or from the
  first byte of the next request on a kept connection), at most :data:`MAX_HEAD_BYTES`; otherwise 408 (431)
  and the connection is closed;
- **the body** within ``body_timeout`` + :data:`BODY_GRACE_S` of the headers, on every route: the OTLP route
  reads its body under ``body_timeout`` itself and answers 408 in its own encoding, the grace lets it; the
  server is the backstop for the routes that read without a deadline or not at all (then 408, closed);
- **idle keep-alive connections**: ``timeout_keep_alive`` (uvicorn's) in time; in number, they are the first
  closed when a new connection arrives at the connection cap;
- **connections**: at most ``max_connections`` (:class:`~inferwatch.core.connections.ConnectionGate`: at the
  cap the connection that has waited longest for its request, idle or dribbling its head, is closed; when
  every connection has a request in progress the new one gets 503);
- **requests**: at most ``max_requests`` being handled, counted from their headers and without the ones still
  receiving their body (those are bounded by the body deadline); beyond, 503. ``GET /healthz`` is always
  answered: a liveness probe failing under load would restart a collector that is only busy (``/readyz``
  does count: an overloaded collector is rightly not ready);
- **uploads**: at most ``max_uploads`` requests receiving their body (``Content-Length`` > 0 or a
  ``Transfer-Encoding``), each of which a route may buffer up to ``max_body_bytes`` (:class:`UploadGate`). At
  the cap the oldest upload is closed (503, ``Retry-After: 1``) to make room for the new one; requests
  without a body never count, so reads and ``/healthz`` are not affected.

Closing the oldest upload rather than refusing the newcomer: refused newcomers would let a slow attacker
holding ``max_uploads`` dribbling bodies (renewed as the body deadline closes them) keep every real export
out, whereas an upload that arrives always gets in, and a real one, which takes milliseconds, finishes long
before ``max_uploads`` newer ones push it out. The oldest rather than the slowest: it needs no rate measured
on a request that has just begun, and a slot then lasts until ``max_uploads`` newer uploads or the deadline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol, cast

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from inferwatch.core.connections import ConnectionGate

MAX_HEAD_BYTES: Final = 64 << 10
"""A request line and headers larger than this get 431 (uvicorn's httptools protocol has no limit)."""
BODY_GRACE_S: Final = 1.0
REFUSED_HEAD_S: Final = 2.0
"""A connection refused at the cap has this long (at most) to send the head its 503 answers."""
EXEMPT_PATHS: Final = frozenset({b"/healthz"})
RETRY_AFTER: Final = b"retry-after: 1\r\n"
"""The header of the 503 that closes an upload for a newer one."""


@dataclass(frozen=True)
class HttpLimits:
    """The limits of one collector's HTTP server (from :class:`~inferwatch.collector.settings.CollectorSettings`)."""

    header_timeout: float
    body_timeout: float
    max_requests: int
    max_connections: int
    max_uploads: int


class Upload(Protocol):
    """A request receiving its body, which the gate may close to make room for a newer one."""

    def drop_upload(self) -> None: ...


class UploadGate:
    """The requests receiving their body, at most :attr:`limit`, oldest first; at the cap the oldest is closed."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"the upload limit must be positive, got {limit}")
        self.limit = limit
        self._uploads: dict[Upload, None] = {}
        self.dropped = 0
        """uploads closed to make room, since the start."""

    def __len__(self) -> int:
        return len(self._uploads)

    def start(self, upload: Upload) -> None:
        """``upload``'s headers announced a body: it joins, after the oldest are closed at the cap."""
        while len(self._uploads) >= self.limit:
            oldest = next(iter(self._uploads))
            del self._uploads[oldest]
            self.dropped += 1
            oldest.drop_upload()
        self._uploads[upload] = None

    def end(self, upload: Upload) -> None:
        """``upload``'s body was received, or its connection closed; calling it twice is harmless."""
        self._uploads.pop(upload, None)


class _Shared:
    """What the connections of one server share: the gates and the requests still receiving their body."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.gate = ConnectionGate(limits.max_connections)
        self.uploads = UploadGate(limits.max_uploads)
        self.receiving = 0


def _answer(status: bytes, message: bytes, headers: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        + headers
        + b"content-length: "
        + str(len(message)).encode()
        + b"\r\n\r\n"
        + message
    )


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines and caps of :attr:`shared` (see the module)."""

    shared: ClassVar[_Shared]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        """bytes received since the last request's head ended (a head still incomplete)."""
        self._head_size = 0
        """the current request's line and headers, as parsed."""
        self._too_large = False
        self._idle = True
        """no request in progress: the next bytes are a request's head."""
        self._in_body = False
        self._evicted = False
        self._admitted = self.shared.gate.admit(self)

    # -- the transport's callbacks ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._evicted:  # made room for another before it even started
            transport.close()
            return
        self._arm_head()

    def data_received(self, data: bytes) -> None:
        if self._idle:
            self._head_bytes += len(data)
            if self._head_timer is None:  # the first byte of the next request on a kept connection
                self._arm_head()
        super().data_received(data)
        if self._idle and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._too_large = True
            self.send_400_response("")
        elif self._in_body and self._body_timer is None:
            timeout = self.shared.limits.body_timeout + BODY_GRACE_S
            self._body_timer = self.loop.call_later(timeout, self._body_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self._end_body()
        self.shared.gate.leave(self)
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        if self._too_large:
            self._close_with(b"431 Request Header Fields Too Large", b"request line and headers too large")
        else:
            super().send_400_response(msg)

    # -- the parser's callbacks ---------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._head_size = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._idle = False
        self._head_bytes = 0
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        shared = self.shared
        shared.gate.busy(self)
        handling = len(self.tasks) - shared.receiving
        refuse = not self._admitted or (handling >= shared.limits.max_requests and not self._exempt())
        # uvicorn answers 503 itself when its limit_concurrency is reached: 0 is always reached, None never
        self.limit_concurrency = 0 if refuse else None
        try:
            super().on_headers_complete()
        finally:
            self.limit_concurrency = None
        if not (self.parser.should_upgrade() and self._should_upgrade()):
            self._in_body = True
            shared.receiving += 1
            if not refuse and self._announces_body():
                shared.uploads.start(self)  # at the cap, the oldest upload is closed (503) for this one

    def on_message_complete(self) -> None:
        self._end_body()
        super().on_message_complete()
        self._maybe_idle()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._maybe_idle()

    # -- the gate's ---------------------------------------------------------------------------------------------
    def evict(self) -> None:
        """Close this connection (idle, or still sending its head) to make room for a new one."""
        self._evicted = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def drop_upload(self) -> None:
        """Close this request, still receiving its body, to make room for a newer upload."""
        self._abort_body(b"503 Service Unavailable", b"too many uploads in progress; retry", RETRY_AFTER)

    # -- helpers --------------------------------------------------------------------------------------------------
    def _count_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > MAX_HEAD_BYTES:
            self._too_large = True
            raise ValueError("request head too large")  # the parser's error: uvicorn calls send_400_response

    def _announces_body(self) -> bool:
        for name, value in self.headers:
            if name == b"transfer-encoding" or (name == b"content-length" and value.strip(b"0 \t") != b""):
                return True
        return False

    def _exempt(self) -> bool:
        try:
            return bool(httptools.parse_url(self.url).path in EXEMPT_PATHS)
        except httptools.HttpParserInvalidURLError:
            return False

    def _maybe_idle(self) -> None:
        if self._in_body or self._idle or (self.cycle is not None and not self.cycle.response_complete):
            return
        if self.transport is None or self.transport.is_closing():
            return
        self._idle = True
        self.shared.gate.wait(self)

    def _arm_head(self) -> None:
        timeout = self.shared.limits.header_timeout
        if not self._admitted:
            timeout = min(timeout, REFUSED_HEAD_S)
        self._head_timer = self.loop.call_later(timeout, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._idle and not self.transport.is_closing():
            self._close_with(b"408 Request Timeout", b"request line and headers not received in time")

    def _body_timed_out(self) -> None:
        self._body_timer = None
        self._abort_body(b"408 Request Timeout", b"request body not received in time")

    def _abort_body(self, status: bytes, message: bytes, headers: bytes = b"") -> None:
        if not self._in_body or self.transport is None or self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            cycle.disconnected = True  # the application's answer, if it comes, is dropped
            cycle.message_event.set()
            self._close_with(status, message, headers)
        else:
            self.transport.close()

    def _close_with(self, status: bytes, message: bytes, headers: bytes = b"") -> None:
        self.transport.write(_answer(status, message, headers))
        self.transport.close()

    def _end_body(self) -> None:
        if self._in_body:
            self._in_body = False
            self.shared.receiving -= 1
            self.shared.uploads.end(self)
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None


def bounded_protocol(limits: HttpLimits) -> type[BoundedHttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)``: one server's connections share its gate and counters."""
    return cast(
        type[BoundedHttpToolsProtocol],
        type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), {"shared": _Shared(limits)}),
    )
