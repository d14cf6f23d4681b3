"""Generation requests' own HTTP/1.1 connections to the engine, relayed from the transport's callbacks.

Through aiohttp's client every read of a stream reached the handler by a StreamReader: a future, a task
switch and a dozen calls per chunk, most of the proxy's CPU per chunk (bench/proxy.py). Here the
response's head is parsed once and its body (chunked, ``Content-Length`` or up to the close) is parsed
in :meth:`Upstream.data_received`, where each read is handed to a :data:`Sink` on the spot: the
server writes it to the client's transport and measures it there, without waking the handler. The
handler wakes for the head, for back-pressure (the client reads slower than the engine writes:
reading from the engine pauses until the client's buffer drains) and for the end.

Connections are kept for the next request (HTTP/1.1 keep-alive, at most :data:`MAX_IDLE`) when a
response was read whole; a request sent on a kept connection that the engine closed meanwhile (no
byte of an answer) is sent again once on a new one, as HTTP clients do. The engine is silent for
longer than the timeout → :class:`UpstreamTimeout`, before the head or between two reads.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, cast

from multidict import CIMultiDict
from yarl import URL

EXHAUSTION: Final = {
    errno.EMFILE: "out of file descriptors (EMFILE: too many open files in the proxy)",
    errno.ENFILE: "out of file descriptors (ENFILE: too many open files in the system)",
    errno.ENOBUFS: "out of socket buffers (ENOBUFS)",
    errno.ENOMEM: "out of memory (ENOMEM)",
}
"""The errors of a connection attempt that say the proxy ran out of something, with what ran out."""
MAX_HEAD_BYTES: Final = 64 << 10
MAX_IDLE: Final = 256
IDLE_KEEP_S: Final = 4.0
"""A kept connection idle longer is closed, not reused: under the engines' own keep-alive timeouts (uvicorn's,
behind vLLM and trtllm-serve, is 5 s), so that a request rarely meets a connection the engine is closing."""
RESEND_WINDOW_S: Final = 1.0
"""A request on a kept connection is sent again on a new one only when that connection closed unanswered within
this long of the send: the engine closing an idle connection as the request went out. Later, the engine may
have read it and worked on it (a non-streamed answer starts only when its generation ends): sent again, the
generation would run twice, so the client gets the 502 instead."""
"""kept connections at most; more idle ones are closed."""

Sink = Callable[[bytes], None]
"""Called with each read of the response's body (its payload: chunk framing removed), as it arrives."""


class UpstreamError(Exception):
    """The engine refused, closed or garbled the exchange (the message names the cause)."""


class UpstreamTimeout(UpstreamError):
    """The engine stayed silent for longer than the timeout."""


class ProxyExhausted(Exception):
    """Connecting to the engine failed for want of the proxy's own resources (file descriptors, buffers):
    the proxy's failure, not the engine's (the message says what ran out)."""


class Head:
    """A response's status line and headers."""

    __slots__ = ("headers", "reason", "status", "version")

    def __init__(self, version: str, status: int, reason: str, headers: CIMultiDict[str]) -> None:
        self.version, self.status, self.reason, self.headers = version, status, reason, headers


def parse_head(raw: bytes) -> Head:
    """``HTTP/1.x status reason`` and the header lines (without the blank line)."""
    lines = raw.split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise UpstreamError("malformed status line")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise UpstreamError("malformed header line")
        headers.add(name.decode("latin-1"), value.strip().decode("utf-8", "surrogateescape"))
    return Head(parts[0], int(parts[1]), parts[2] if len(parts) > 2 else "", headers)


class Body:
    """The framing of one response body: ``chunked``, a length, or up to the connection's end."""

    __slots__ = ("chunked", "crlf", "done", "need", "rest", "trailers", "until_close")

    def __init__(self, head: Head, bodiless: bool) -> None:
        encoding = head.headers.get("Transfer-Encoding", "").lower()
        length = head.headers.get("Content-Length")
        self.chunked = "chunked" in encoding
        self.until_close = False
        self.need = 0
        self.crlf = 0
        self.trailers = False
        self.rest = b""
        self.done = bodiless or head.status in (204, 304)
        if self.done or self.chunked:
            return
        if length is not None:
            digits = length.strip()
            if not (digits.isascii() and digits.isdigit()):  # "²" is a digit to str.isdigit, not to int()
                raise UpstreamError("malformed Content-Length")
            self.need = int(digits)
            self.done = self.need == 0
        else:
            self.until_close = True

    def feed(self, data: bytes) -> bytes:
        """The payload in ``data`` (:attr:`done` once the body is complete; bytes after it are an error)."""
        if not self.chunked:
            if self.until_close:
                return data
            if len(data) > self.need:
                raise UpstreamError("more bytes than Content-Length")
            self.need -= len(data)
            self.done = self.need == 0
            return data
        if not (self.rest or self.need or self.crlf or self.trailers or self.done):
            # the usual read: one whole chunk, "<hex size>\r\n<data>\r\n" (as the loop below reads it)
            end = data.find(b"\r\n", 0, 18)
            if end > 0 and data[:end].isalnum():
                try:
                    size = int(data[:end], 16)
                except ValueError:  # not hex: the loop below says so
                    size = 0
                if size and len(data) == end + size + 4 and data[-2:] == b"\r\n":
                    return data[end + 2 : -2]
                if size and len(data) > end + size + 4:  # the engine got ahead: a few chunks in one read
                    whole = _whole_chunks(data)
                    if whole is not None:
                        return whole
        return self._chunks(data)

    def _chunks(self, data: bytes) -> bytes:
        """:meth:`feed` of a chunked body, any read: chunks split anywhere, extensions, the last chunk, trailers."""
        buf = self.rest + data if self.rest else data
        pos, n = 0, len(buf)
        out: list[bytes] = []
        while pos < n and not self.done:
            if self.need:  # inside a chunk's data
                take = min(self.need, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self.need -= take
                if not self.need:
                    self.crlf = 2
                continue
            if self.crlf:  # the CRLF after a chunk's data
                take = min(self.crlf, n - pos)
                if buf[pos : pos + take] != b"\r\n"[2 - self.crlf : 2 - self.crlf + take]:
                    raise UpstreamError("malformed chunk")
                pos += take
                self.crlf -= take
                continue
            end = buf.find(b"\r\n", pos)
            if end < 0:
                if n - pos > 4096:
                    raise UpstreamError("malformed chunk size line")
                break
            line = buf[pos:end]
            pos = end + 2
            if self.trailers:  # after the last chunk: trailer lines up to an empty one
                self.done = not line
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise UpstreamError("malformed chunk size") from None
            if size < 0:
                raise UpstreamError("malformed chunk size")
            self.need = size
            self.trailers = size == 0
        if self.done and pos < n:
            raise UpstreamError("bytes after the end of the response")
        self.rest = buf[pos:]
        if len(out) == 1:
            return out[0]
        return b"".join(out)


def _whole_chunks(data: bytes) -> bytes | None:
    """The payload of a read that is whole chunks, ``<hex size>\\r\\n<data>\\r\\n`` each and none the last one, as
    :meth:`Body.feed`'s loop reads them; ``None`` for any other read (that loop's)."""
    out: list[bytes] = []
    pos, n = 0, len(data)
    while pos < n:
        end = data.find(b"\r\n", pos, pos + 18)
        if end <= pos or not data[pos:end].isalnum():
            return None
        try:
            size = int(data[pos:end], 16)
        except ValueError:  # not hex: the loop says so
            return None
        stop = end + 2 + size
        if not size or data[stop : stop + 2] != b"\r\n":
            return None
        out.append(data[end + 2 : stop])
        pos = stop + 2
    return b"".join(out)


class Upstream(asyncio.Protocol):
    """One connection to the engine, one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self.loop = loop
        self.timeout = timeout
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.head: Head | None = None
        self.body: Body | None = None
        self.bodiless = False
        self.buffer = b""
        self.pending: list[bytes] = []
        """payload read before a sink was set."""
        self.sink: Sink | None = None
        self.received = False
        self.error: UpstreamError | None = None
        self.last_read = 0.0
        self.waiter: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.paused = False
        self.keep_alive = True
        self.busy = False
        """a request was sent and its response is not over: bytes at any other time are an error."""
        self.sent_at = 0.0
        self.idle_since = 0.0

    # -- the transport's callbacks ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass: no isinstance

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        self.received = True
        if self.error is not None:
            return
        if not self.busy:  # unsolicited (an idle kept connection): never reuse it
            self.error = UpstreamError("bytes outside of an exchange")
            self.close()
            return
        try:
            if self.head is None:
                data = self._head(data)
                if self.head is None:
                    return
                self._wake()
            body = self.body
            if data and body is not None:
                payload = body.feed(data)
                if payload:  # (inlined: once per read)
                    if self.sink is None:
                        self.pending.append(payload)
                    else:
                        self.sink(payload)
            elif data:
                raise UpstreamError("bytes after the end of the response")
            if body is not None and body.done:
                self._wake()
        except UpstreamError as exc:
            self.error = exc
            self.keep_alive = False
            self._wake()

    def eof_received(self) -> bool | None:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        # a body delimited by the close ends with an orderly close; a reset cuts it
        if exc is None and self.body is not None and self.body.until_close and not self.body.done:
            self.body.done = True
        self._wake()

    # -- parsing ------------------------------------------------------------------------------------------------
    def _head(self, data: bytes) -> bytes:
        buf = self.buffer + data if self.buffer else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise UpstreamError("response head too long")
                self.buffer = buf
                return b""
            head = parse_head(buf[:end])
            buf = buf[end + 4 :]
            if 100 <= head.status < 200 and head.status != 101:
                continue  # interim answers (100 Continue, 103 Early Hints) are not the response
            if head.status == 101:
                raise UpstreamError("protocol upgrades are not supported")
            body = Body(head, self.bodiless)  # a malformed framing fails before the head counts as read
            self.buffer = b""
            self.head, self.body = head, body
            connection = head.headers.get("Connection", "").lower()
            self.keep_alive = head.version == "HTTP/1.1" and "close" not in connection and not self.body.until_close
            return buf

    # -- the handler's side -------------------------------------------------------------------------------------
    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _check_silence(self) -> None:
        self.timer = None
        if self.waiter is None or self.waiter.done():
            return
        due = self.last_read + self.timeout
        if self.loop.time() >= due:
            self.waiter.set_exception(UpstreamTimeout(f"no answer within {self.timeout:g} s"))
        else:
            self.timer = self.loop.call_at(due, self._check_silence)

    async def _wait(self) -> None:
        """Until the head, the end, an error or back-pressure; the engine silent for the timeout → timeout."""
        self.waiter = self.loop.create_future()
        self.timer = self.loop.call_at(self.last_read + self.timeout, self._check_silence)
        try:
            await self.waiter
        finally:
            self.waiter = None
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None

    def _failed(self) -> UpstreamError | None:
        if self.error is not None:
            return self.error
        if self.closed and (self.body is None or not self.body.done):
            what = "the response's head" if self.head is None else "the response's end"
            return UpstreamError(f"connection closed before {what}")
        return None

    def send(self, request: bytes, bodiless: bool) -> None:
        assert self.transport is not None
        self.busy = True
        self.bodiless = bodiless
        self.last_read = self.sent_at = self.loop.time()
        self.transport.write(request)

    async def read_head(self) -> Head:
        while self.head is None:
            failed = self._failed()
            if failed is not None:
                raise failed
            await self._wait()
        return self.head

    def relay(self, sink: Sink) -> None:
        """From now on every read of the body goes to ``sink`` as it arrives (what came already, first)."""
        self.sink = sink
        for payload in self.pending:
            sink(payload)
        self.pending.clear()

    async def read_body(self, drain: Callable[[], Awaitable[object]]) -> None:
        """Until the body's end. ``drain`` is awaited when the client fell behind (reading is paused)."""
        while True:
            failed = self._failed()
            if failed is not None:
                raise failed
            if self.body is not None and self.body.done:
                self.resume()  # the read that ended the body may have filled the client's buffer
                return
            if self.paused:
                await drain()
                self.resume()
                continue
            await self._wait()

    def pause(self) -> None:
        """The client's buffer is full: stop reading from the engine and wake the handler to drain it."""
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
            self._wake()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.last_read = self.loop.time()
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    @property
    def reusable(self) -> bool:
        return (
            self.keep_alive
            and not self.closed
            and self.error is None
            and self.body is not None
            and self.body.done
            and not self.paused
            and not self.buffer
            and not self.body.rest
        )

    def reset(self) -> None:
        """Ready for the next exchange on the same connection."""
        self.head = self.body = self.sink = None
        self.pending.clear()
        self.received = False
        self.bodiless = False
        self.busy = False

    def close(self) -> None:
        """Close the connection (the engine sees it go: a request in progress there is aborted)."""
        self.keep_alive = False
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Connections to one upstream: new ones, and the ones whose last response was read whole."""

    def __init__(self, url: str, timeout: float, connect_timeout: float) -> None:
        u = URL(url)
        if u.host is None:
            raise ValueError(f"no host in {url!r}")
        self.host = u.host
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if u.scheme == "https" else None
        self.authority = u.raw_authority.rpartition("@")[2]
        """the ``Host`` header: the upstream's host and (non-default) port, without credentials."""
        self.prefix = u.raw_path.rstrip("/")
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.idle: deque[Upstream] = deque()

    async def connect(self) -> Upstream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, proto = await loop.create_connection(
                    lambda: Upstream(loop, self.timeout),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                )
        except TimeoutError:
            raise UpstreamTimeout(f"no connection within {self.connect_timeout:g} s") from None
        except OSError as exc:
            if exc.errno in EXHAUSTION:
                raise ProxyExhausted(EXHAUSTION[exc.errno]) from None
            raise UpstreamError(f"upstream unreachable ({type(exc).__name__})") from None
        return proto

    def request(self, method: str, raw_path: str, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
        lines = [f"{method} {self.prefix}{raw_path} HTTP/1.1", f"Host: {self.authority}"]
        lines += [f"{k}: {v}" for k, v in headers]
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            lines.append(f"Content-Length: {len(body)}")
        return "\r\n".join(lines).encode("utf-8", "surrogateescape") + b"\r\n\r\n" + body

    async def exchange(self, request: bytes, bodiless: bool) -> tuple[Upstream, Head]:
        """Send ``request`` and read the response's head (on a kept connection first, then once anew)."""
        loop = asyncio.get_running_loop()
        while self.idle:
            conn = self.idle.pop()
            if conn.closed or conn.error is not None:
                continue
            if loop.time() - conn.idle_since > IDLE_KEEP_S:
                conn.close()
                continue
            try:
                return await self._ask(conn, request, bodiless)
            except UpstreamTimeout:
                raise
            except UpstreamError:
                if conn.received or not conn.closed or loop.time() - conn.sent_at > RESEND_WINDOW_S:
                    raise  # the engine answered, or may have worked on the request: no second try
                break  # the engine had closed the kept connection as the request went out: once more anew
        return await self._ask(await self.connect(), request, bodiless)

    @staticmethod
    async def _ask(conn: Upstream, request: bytes, bodiless: bool) -> tuple[Upstream, Head]:
        """The head of the answer to ``request`` on ``conn`` (closed when there is none)."""
        conn.send(request, bodiless)
        try:
            return conn, await conn.read_head()
        except BaseException:
            conn.close()
            raise

    def release(self, conn: Upstream) -> None:
        """After the exchange: kept when its response was read whole, closed otherwise."""
        if conn.reusable and len(self.idle) < MAX_IDLE:
            conn.reset()
            conn.idle_since = conn.loop.time()
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()
