"""The exporter's HTTP/1.1 server: keep-alive, bounded, one thread per connection.

Prometheus keeps its connection to a target open from scrape to scrape. Python's ``http.server``
(HTTP/1.0 by default) made every scrape a new connection and a new thread, and parsed each request's
headers with the e-mail parser: measured on a 10 KB page at 10 scrapes a second, 0.73 ms of CPU per
request with a new connection each time, 0.33 ms with keep-alive, under the resolution of /proc
(0.07 ms) here. That fixed cost was most of the exporter's cost on a small engine page (issue 35).

What this server reads is bounded: a request head of at most :data:`MAX_HEAD_BYTES`, which must
arrive within :data:`HEAD_TIMEOUT_SECONDS` of its first byte; no request body (one is refused); at
most :data:`MAX_CONNECTIONS` connections at once (the next is answered 503 and closed); an idle
connection is closed after :data:`IDLE_TIMEOUT_SECONDS`; a client that does not read its answer
gives up its connection after :data:`WRITE_TIMEOUT_SECONDS`. Only ``GET`` and ``HEAD`` are served.
A slow client holds its own thread, never another's. The handler gets the path (query removed) and
the connection's socket, and returns (status, content type, body).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from http import HTTPStatus

log = logging.getLogger("inferwatch.exporter")

LISTEN_BACKLOG = 128
"""connections the kernel queues until the exporter accepts them. socketserver's default (5) dropped
the connections of concurrent scrapes past the 5th while the exporter was busy (``ListenOverflows``):
their clients tried again a second later, and each late one started a second scrape of every target
(measured: 1.5-2.6 engine requests per engine for 32 concurrent scrapes of 100 engines)."""
MAX_HEAD_BYTES = 16 * 1024
"""request line and headers (Prometheus sends about 300 bytes)."""
HEAD_TIMEOUT_SECONDS = 10.0
"""from a request's first byte to the end of its head: a client dribbling its headers is dropped."""
IDLE_TIMEOUT_SECONDS = 330.0
"""an idle keep-alive connection is closed after this (longer than a 5-minute scrape interval)."""
WRITE_TIMEOUT_SECONDS = 30.0
MAX_CONNECTIONS = 256
"""connections served at once; each holds a thread."""

Response = tuple[int, str, bytes]
"""(status, content type, body)."""
Handler = Callable[[str, socket.socket], Response]
"""(path without its query, the connection) -> the response."""
TEXT = "text/plain; charset=utf-8"


class _Refused(Exception):
    """A request this server does not serve: answered with ``status`` and the connection closed."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


class HttpServer:
    """Serves ``handler`` on ``host:port`` (port 0: any free port) until :meth:`shutdown`."""

    def __init__(self, host: str, port: int, handler: Handler, server_name: str = "inferwatch") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self.handler = handler
        self.server_name = server_name
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        """the connections open (registered once each, not per request)."""
        self._heads: dict[tuple[int, str, bool], tuple[bytes, bytes]] = {}
        self._open = 0
        self._stopping = False

    # -- the accept loop ----------------------------------------------------------------------------
    def accept(self) -> tuple[socket.socket, object]:
        """The next connection (a method of its own, so that tests can delay it)."""
        return self.socket.accept()

    def serve_forever(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self.accept()
            except OSError:
                if self._stopping:
                    return
                time.sleep(0.01)  # EMFILE and the like: do not spin
                continue
            with self._lock:
                if self._stopping:
                    conn.close()
                    return
                full = self._open >= MAX_CONNECTIONS
                if not full:
                    self._open += 1
                    self._conns.add(conn)
            if full:
                self._refuse(conn)
                continue
            with contextlib.suppress(OSError):  # answers go out whole, without waiting for an ACK
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._connection, args=(conn,), name="exporter-conn", daemon=True).start()

    def shutdown(self) -> None:
        """Stop accepting, and close the idle connections; requests being served finish.

        Every open connection is shut for reading: an idle one's read returns at once (its thread
        closes it), one being served writes its answer (with ``Connection: close``) and ends. No
        connection registers itself per request for this."""
        with self._lock:
            self._stopping = True
            conns = list(self._conns)
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RD)

    def server_close(self) -> None:
        self.socket.close()

    def _refuse(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(1.0)
            conn.sendall(self._head(503, TEXT, 22, close=True) + b"too many connections\r\n")

    # -- one connection -----------------------------------------------------------------------------
    def _connection(self, conn: socket.socket) -> None:
        try:
            # blocking, the idle timeout kept by the kernel: a read is one system call (a Python
            # timeout polls before each read, and switching timeouts costs one each time)
            conn.settimeout(None)
            try:
                _receive_timeout(conn, IDLE_TIMEOUT_SECONDS)
            except OSError:  # a platform without it: Python's own timeout (a poll before each read)
                conn.settimeout(IDLE_TIMEOUT_SECONDS)
            buffered = b""
            while not self._stopping:
                head, buffered = self._read_head(conn, buffered)
                if head is None:
                    return
                try:
                    method, path, keep = _parse(head)
                except _Refused as refused:
                    conn.settimeout(WRITE_TIMEOUT_SECONDS)
                    body = f"{refused.status} {refused}\n".encode()
                    conn.sendall(self._head(refused.status, TEXT, len(body), close=True) + body)
                    return
                status, ctype, body = self._answer(path, conn)
                keep = keep and not self._stopping
                out = self._head(status, ctype, len(body), close=not keep)
                _send(conn, out, b"" if method == "HEAD" else body)
                if not keep:
                    return
        except OSError:
            return  # the client went away, timed out, or the server shut the connection down
        finally:
            with self._lock:
                self._open -= 1
                self._conns.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()

    def _answer(self, path: str, conn: socket.socket) -> Response:
        try:
            return self.handler(path, conn)
        except Exception:  # keep serving whatever one request did
            log.exception("serving %s failed", path[:200])
            return 500, TEXT, b"500 internal error\n"

    @staticmethod
    def _read_head(conn: socket.socket, buffered: bytes) -> tuple[bytes | None, bytes]:
        """The next request's head (``None`` when the client closed or stayed idle too long), and
        the bytes after it. ``conn`` is blocking with the idle timeout as its receive timeout; a head
        that does not come in one read gets the head timeout instead, until it is whole."""
        data = buffered
        deadline = time.monotonic() + HEAD_TIMEOUT_SECONDS if data else None
        shortened = False
        while (end := data.find(b"\r\n\r\n")) < 0:
            if len(data) > MAX_HEAD_BYTES:
                return None, b""
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, b""
                _receive_timeout(conn, left)
                shortened = True
            try:
                chunk = conn.recv(65536)
            except (TimeoutError, BlockingIOError):  # the kernel's receive timeout passed
                return None, b""
            if not chunk:
                return None, b""
            if deadline is None:
                deadline = time.monotonic() + HEAD_TIMEOUT_SECONDS
            data += chunk
        if end > MAX_HEAD_BYTES:
            return None, b""
        if shortened:
            _receive_timeout(conn, IDLE_TIMEOUT_SECONDS)
        return data[:end], data[end + 4 :]

    def _head(self, status: int, ctype: str, length: int, close: bool) -> bytes:
        """An answer's status line and headers (made once per status, type and close, then only the
        length is written in)."""
        parts = self._heads.get((status, ctype, close))
        if parts is None:
            parts = self._heads[(status, ctype, close)] = self._head_parts(status, ctype, close)
        return parts[0] + str(length).encode() + parts[1]

    def _head_parts(self, status: int, ctype: str, close: bool) -> tuple[bytes, bytes]:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        lines = [f"HTTP/1.1 {status} {phrase}", f"Server: {self.server_name}", f"Content-Type: {ctype}"]
        after = [""]
        if status == 405:
            after.append("Allow: GET, HEAD")
        if close:
            after.append("Connection: close")
        before = "\r\n".join(lines) + "\r\nContent-Length: "
        return before.encode("latin-1"), ("\r\n".join(after) + "\r\n\r\n").encode("latin-1")


_DONTWAIT: int = getattr(socket, "MSG_DONTWAIT", 0)
_GATHER = bool(_DONTWAIT) and hasattr(socket.socket, "sendmsg")
"""whether an answer's head and body go out in one non-blocking call (POSIX)."""


def _receive_timeout(conn: socket.socket, seconds: float) -> None:
    """Set ``conn``'s receive timeout in the kernel (a blocking read then fails with EAGAIN)."""
    whole = int(seconds)
    micros = max(1, int((seconds - whole) * 1e6)) if whole == 0 else int((seconds - whole) * 1e6)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("@ll", whole, micros))


def _send(conn: socket.socket, head: bytes, body: bytes) -> None:
    """Send ``head`` and ``body`` whole: in one call, neither copied, when the kernel takes them at once
    (an answer mostly fits its buffer), else the rest within :data:`WRITE_TIMEOUT_SECONDS`."""
    sent = 0
    if _GATHER:
        with contextlib.suppress(BlockingIOError):
            sent = conn.sendmsg((head, body), (), _DONTWAIT)
        if sent == len(head) + len(body):
            return
    conn.settimeout(WRITE_TIMEOUT_SECONDS)
    try:
        conn.sendall(memoryview(head + body)[sent:])
    finally:
        conn.settimeout(None)


def _parse(head: bytes) -> tuple[str, str, bool]:
    """(method, path without its query, whether the connection stays open) of a request head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _Refused(400, "bad request line")
    method = parts[0].decode("latin-1")
    target = parts[1].decode("latin-1")
    keep = parts[2] == b"HTTP/1.1"
    lower = head.lower()
    # a scraper's head names none of the headers read below: they are looked for only when present
    headers = lines[1:] if b"connection" in lower or b"content-length" in lower or b"transfer-encoding" in lower else ()
    for line in headers:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == b"connection":
            tokens = {t.strip() for t in value.lower().split(b",")}
            keep = (keep or b"keep-alive" in tokens) and b"close" not in tokens
        elif key == b"transfer-encoding" or (key == b"content-length" and value.strip() not in (b"", b"0")):
            raise _Refused(413, "a request body is not accepted")
    if method not in ("GET", "HEAD"):
        raise _Refused(405, "only GET and HEAD are served")
    if not target.startswith("/"):
        raise _Refused(400, "bad request target")
    return method, target.split("?", 1)[0], keep
