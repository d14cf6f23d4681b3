"""An HTTP/1.1 GET on a connection kept open, read with bounds: the exporter's plain-HTTP engine client.

:mod:`http.client` parses each answer's headers with the e-mail package and runs a long code path:
at one scrape a second, its caches gone cold between scrapes, a request cost 0.34 ms of CPU on a
one-sample page (0.13 ms scraped back to back), a third of the exporter's whole cost of such a
scrape. This module sends the request in one write and reads the status line and headers itself
(at most :data:`MAX_HEAD_BYTES`), then the body by its ``Content-Length``, by chunks, or to the end
of the connection. It decodes no content coding and enforces no deadline: the caller
(:mod:`inferwatch.exporters.fetching`) does both, chunk by chunk, and sets the socket's timeout.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Iterator

MAX_HEAD_BYTES = 64 * 1024
"""an answer's status line and headers."""
MAX_CHUNK_LINE = 1024
"""a chunk-size line (the size and any extensions)."""
READ_SIZE = 1 << 16
_NO_BODY = frozenset({204, 304})


class WireError(Exception):
    """The engine's answer is not HTTP this client reads (or ended before its head did)."""


class Stale(WireError):
    """The connection was closed before the answer's first byte: a kept connection that the engine
    had closed as the request went out (the request may be sent again on a new one)."""


class Cut(WireError):
    """The body ended before its length or last chunk."""


class Connection:
    """One TCP connection to ``host:port``; not thread-safe (one request at a time)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.sock: socket.socket | None = None
        self._buf = b""

    def open(self, timeout: float) -> socket.socket:
        sock = self.sock = socket.create_connection((self.host, self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self._buf = b""

    # -- one exchange -----------------------------------------------------------------------------
    def request(self, target: str, headers: dict[str, str]) -> Answer:
        """Send ``GET target`` with ``headers`` and read the answer's head (the body is read from the
        :class:`Answer`). Raises :class:`Stale`, :class:`WireError` or ``OSError``."""
        sock = self.sock
        assert sock is not None, "open() first"
        self._buf = b""
        try:
            sock.sendall(_request_head(self.host, self.port, target, tuple(headers.items())))
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise Stale(str(exc)) from None
        head = self._read_head(sock)
        return Answer.parse(self, head)

    def _read_head(self, sock: socket.socket) -> bytes:
        data = b""
        while (end := data.find(b"\r\n\r\n")) < 0:
            if len(data) > MAX_HEAD_BYTES:
                raise WireError(f"the answer's head is over {MAX_HEAD_BYTES} bytes")
            try:
                chunk = sock.recv(READ_SIZE)
            except ConnectionResetError as exc:
                if not data:
                    raise Stale(str(exc)) from None
                raise
            if not chunk:
                if not data:
                    raise Stale("the connection was closed before the answer")
                raise WireError("the connection was closed in the answer's head")
            data += chunk
        if end > MAX_HEAD_BYTES:
            raise WireError(f"the answer's head is over {MAX_HEAD_BYTES} bytes")
        self._buf = data[end + 4 :]
        return data[:end]

    def _recv(self, size: int) -> bytes:
        """At most ``size`` bytes: what is buffered, else one read (``b""`` at the end)."""
        if self._buf:
            out, self._buf = self._buf[:size], self._buf[size:]
            return out
        assert self.sock is not None
        return self.sock.recv(min(size, READ_SIZE))

    def _line(self) -> bytes:
        """One CRLF-ended line of a chunked body, without its CRLF."""
        while (end := self._buf.find(b"\r\n")) < 0:
            if len(self._buf) > MAX_CHUNK_LINE:
                raise WireError("a chunk-size line is too long")
            assert self.sock is not None
            chunk = self.sock.recv(READ_SIZE)
            if not chunk:
                raise Cut("the body ended in a chunk-size line")
            self._buf += chunk
        data, self._buf = self._buf[:end], self._buf[end + 2 :]
        return data


@functools.lru_cache(maxsize=256)
def _request_head(host: str, port: int, target: str, headers: tuple[tuple[str, str], ...]) -> bytes:
    """A GET request's head (a target asks the same few, scrape after scrape: each is made once)."""
    authority = host if port == 80 else f"{host}:{port}"
    lines = [f"GET {target} HTTP/1.1", f"Host: {authority}", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Answer:
    """An answer's status and headers (names in lower case; a repeated header's values joined by
    ``", "``), and its body as raw chunks."""

    def __init__(self, conn: Connection, status: int, headers: dict[str, str], http11: bool) -> None:
        self.conn = conn
        self.status = status
        self.headers = headers
        tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length", "").strip()
        if not self.chunked and length and not length.isdigit():
            raise WireError(f"invalid Content-Length {length[:40]!r}")
        self.length: int | None = None if self.chunked or not length else int(length)
        if status in _NO_BODY or 100 <= status < 200:
            self.length = 0
        framed = self.chunked or self.length is not None
        self.keep = framed and "close" not in tokens and (http11 or "keep-alive" in tokens)
        """whether the connection may carry another request once the body is read whole."""
        self.complete = self.length == 0
        """whether the body was read to its end."""

    @classmethod
    def parse(cls, conn: Connection, head: bytes) -> Answer:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not (parts[1].isdigit() and len(parts[1]) == 3):
            raise WireError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise WireError(f"not a header line: {line[:80]!r}")
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        return cls(conn, int(parts[1]), headers, parts[0] != "HTTP/1.0")

    def header(self, name: str) -> str:
        return self.headers.get(name, "")

    def chunks(self) -> Iterator[bytes]:
        """The body's bytes as they arrive (raw, before any content coding is undone)."""
        conn = self.conn
        if self.chunked:
            while True:
                size_text = conn._line().split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise WireError(f"invalid chunk size {size_text[:20]!r}") from None
                if size == 0:
                    while conn._line():  # trailers, up to the empty line
                        pass
                    self.complete = True
                    return
                while size:
                    data = conn._recv(size)
                    if not data:
                        raise Cut("the body ended in a chunk")
                    size -= len(data)
                    yield data
                if conn._line():
                    raise WireError("a chunk is longer than its size")
        elif self.length is not None:
            left = self.length
            while left:
                data = conn._recv(left)
                if not data:
                    raise Cut(f"the body ended {left} bytes before its Content-Length")
                left -= len(data)
                yield data
            self.complete = True
        else:  # to the end of the connection
            while data := conn._recv(READ_SIZE):
                yield data
            self.complete = True
