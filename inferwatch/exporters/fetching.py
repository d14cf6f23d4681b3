"""Requests to an engine under one deadline and a body limit, abortable from another thread.

An :class:`EngineRequest` is everything one scrape (or one background poll) of a target asks the
engine: the metrics page, the info endpoint, JSON stats. They share one :class:`Deadline`: connect,
headers and body of every request must fit in it, not each read. The :class:`Watchdog` (one thread per
exporter) aborts a request whose deadline passed by shutting its socket down, which wakes a read
blocked on an engine that dribbles. Bodies are read as a stream and decompressed here, at most
``max_body_bytes`` after decompression: a gzip bomb costs the limit, not its inflated size.

Plain ``http://`` requests go through :mod:`inferwatch.exporters.wire`: the same bounds at a fraction
of httpx's CPU per request (and of :mod:`http.client`'s), which matters since a scrape's fixed cost is
mostly its requests. A target keeps its
connections open between scrapes (a :class:`Connections` of its own), as Prometheus does: a connection
is reused only after a whole answer was read without ``Connection: close``, never after an abort or
an error. A request that finds a reused connection closed (an engine closes idle ones: uvicorn after
5 s) is sent once more on a new one. That costs such a scrape one write more; looking whether each
kept connection was still open before using it cost every scrape a system call (``select``: 2-4 %
of the exporter's CPU on a small page, measured side by side at 20 scrapes a second).
``https://``, a proxy from the environment or a transport given to the client (tests) take httpx.

Redirects are followed here, one request at a time (no redirect body is read), at most
:data:`MAX_REDIRECTS` in a row and only as far as the target's :data:`RedirectPolicy` allows: by
default to the target's own origin (scheme, host and port). A redirect elsewhere would make the
exporter fetch, and serve as the engine's, whatever the engine points at, such as a service the
exporter reaches and Prometheus does not; it fails the scrape with reason ``redirect``.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import math
import socket
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urljoin, urlsplit

import httpx

from inferwatch.core import vocabulary as V
from inferwatch.exporters import wire
from inferwatch.exporters.mapping import ScrapeError

MAX_REDIRECTS = 5
RedirectPolicy = Literal["same-origin", "none", "any"]
"""which redirects of an engine are followed: ``same-origin`` those to the target's scheme, host and
port; ``none`` none; ``any`` all (at most :data:`MAX_REDIRECTS` in a row, whatever the policy)."""
REDIRECT_POLICIES: Final[tuple[RedirectPolicy, ...]] = ("same-origin", "none", "any")
DEFAULT_REDIRECT_POLICY: Final[RedirectPolicy] = "same-origin"
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
ACCEPT_ENCODING = "gzip"
"""what the exporter asks for; an engine that answers ``deflate`` or ``identity`` is read too."""
_KEEP_HEADERS: Final = {"Accept-Encoding": ACCEPT_ENCODING}
_CLOSE_HEADERS: Final = {"Accept-Encoding": ACCEPT_ENCODING, "Connection": "close"}
REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
"""statuses whose ``Location`` httpx follows (and so does the plain path)."""


class Deadline:
    """A point in time (``time.monotonic``) that a scrape must end by."""

    __slots__ = ("at",)

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def expired(self) -> bool:
        return time.monotonic() >= self.at


@dataclass(frozen=True)
class Limits:
    """What one target's scrape may cost."""

    timeout_seconds: float
    """the whole scrape: every request it makes, connect to last byte."""
    max_body_bytes: int
    """per response body, counted after decompression."""
    follow_redirects: RedirectPolicy = DEFAULT_REDIRECT_POLICY
    """which redirects are followed (see :data:`RedirectPolicy`)."""


def origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the port explicit even when it is the scheme's default."""
    return url.scheme, url.host.lower(), url.port or _DEFAULT_PORTS.get(url.scheme)


class _Inflate:
    """A bounded decoder of one ``Content-Encoding``: never returns more than it is allowed."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._z: zlib._Decompress | None = None
        if coding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif coding == "deflate":
            self._z = zlib.decompressobj(zlib.MAX_WBITS)
            self._first = True
        elif coding not in ("", "identity"):
            raise ScrapeError(f"unsupported Content-Encoding {coding!r}", V.SCRAPE_ERROR_INVALID)

    def decode(self, data: bytes, room: int) -> bytes:
        """At most ``room`` bytes of output for ``data``; exactly ``room`` means more would follow."""
        z = self._z
        if z is None:
            return data
        try:
            out = z.decompress(data, room)
        except zlib.error:
            if self.coding == "deflate" and self._first:
                # some servers send raw deflate without the zlib wrapper
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                self._first = False
                return self.decode(data, room)
            raise ScrapeError(f"the {self.coding} body is corrupt", V.SCRAPE_ERROR_INVALID) from None
        if self.coding == "deflate":
            self._first = False
        return out

    @property
    def identity(self) -> bool:
        return self._z is None

    def flush(self) -> bytes:
        return self._z.flush() if self._z is not None else b""


_IDENTITY = _Inflate("")
"""the decoder of a body without content coding (it keeps no state: one serves every body)."""


def _socket_of(response: httpx.Response) -> socket.socket | None:
    stream = response.extensions.get("network_stream")
    get_extra = getattr(stream, "get_extra_info", None)
    sock = get_extra("socket") if get_extra is not None else None
    return sock if isinstance(sock, socket.socket) else None


MAX_IDLE_CONNECTIONS = 4
"""kept open per target and engine address (a scrape, a background poll and the info request)."""


class Connections:
    """A target's idle plain-HTTP connections, by (host, port); thread-safe."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[wire.Connection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def take(self, host: str, port: int) -> wire.Connection | None:
        """The idle connection to ``host:port`` given back last, or None. The engine may have closed it
        since: a request on it then fails with :class:`wire.Stale`, and goes on a new one."""
        with self._lock:
            idle = self._idle.get((host, port))
            return idle.pop() if idle else None

    def give(self, host: str, port: int, conn: wire.Connection) -> None:
        with self._lock:
            idle = self._idle.setdefault((host, port), [])
            if not self._closed and len(idle) < MAX_IDLE_CONNECTIONS:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for conn in conns:
            conn.close()


class EngineRequest:
    """The requests of one scrape or poll of a target (see the module docstring); thread-safe abort."""

    def __init__(self, client: httpx.Client, base: str, limits: Limits, connections: Connections | None = None) -> None:
        self.client = client
        self.connections = connections
        self.base = base
        self.limits = limits
        self.deadline = Deadline(limits.timeout_seconds)
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self.aborted = False
        self.finished = False

    # -- thread-safe control ------------------------------------------------------------------
    def abort(self) -> None:
        """Stop whatever the request is doing: a blocked read returns at once."""
        with self._lock:
            if self.finished:
                return
            self.aborted = True
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        with self._lock:
            self.finished = True
            self._sockets.clear()

    def _track(self, sock: socket.socket | None, on: bool) -> None:
        if sock is None:
            return
        with self._lock:
            if on:
                self._sockets.add(sock)
            else:
                self._sockets.discard(sock)
            aborted = self.aborted
        if on and aborted:
            self.abort()

    def _timeout_error(self, what: str) -> ScrapeError:
        return ScrapeError(
            f"timed out: the {self.limits.timeout_seconds:g}s deadline of the scrape passed {what}",
            V.SCRAPE_ERROR_TIMEOUT,
        )

    def _check(self, url: str) -> float:
        """The seconds left before fetching ``url``; a timeout error when none are."""
        remaining = self.deadline.remaining()
        if self.aborted or remaining <= 0:
            raise self._timeout_error(f"before fetching {url}")
        return remaining

    # -- the Fetch interface sessions use -----------------------------------------------------
    def fetch(self, path: str, *, allow_404: bool = False) -> str:
        """GET ``path`` of the target's base URL (:class:`~inferwatch.exporters.mapping.Fetch`)."""
        return self.get(self.base + path, allow_404=allow_404)

    def get(self, url: str, *, allow_404: bool = False, budget: float | None = None) -> str:
        """The body of ``url`` as text; ``""`` for an HTTP 404 when ``allow_404``. ``budget`` caps the
        seconds this one call may take (within the deadline). Failures raise ScrapeError."""
        try:
            return self._get(url, allow_404, budget)
        except ScrapeError:
            raise
        except Exception:
            # a read cut by abort() may surface as anything (a shut TLS socket raises ValueError)
            if self.aborted or self.deadline.expired():
                raise self._timeout_error(f"fetching {url}") from None
            raise

    def _get(self, url: str, allow_404: bool, budget: float | None) -> str:
        plain = _plain_http_ok(self.client)
        for _ in range(MAX_REDIRECTS + 1):
            remaining = self._check(url)
            if budget is not None:
                remaining = min(remaining, budget)
            if plain and url.startswith("http://") and "@" not in urlsplit(url).netloc:
                body, location = self._get_plain(url, allow_404, remaining)
                if location is None:
                    return body
                try:
                    to = httpx.URL(location)
                except httpx.InvalidURL:
                    raise ScrapeError(f"{url} redirects to an invalid URL", V.SCRAPE_ERROR_UNREACHABLE) from None
                url = self._redirect(url, to)
                continue
            try:
                request = self.client.build_request(
                    "GET", url, headers={"Accept-Encoding": ACCEPT_ENCODING}, timeout=httpx.Timeout(remaining)
                )
                response = self.client.send(request, stream=True, follow_redirects=False)
            except httpx.TimeoutException:
                raise self._timeout_error(f"waiting for {url}") from None
            except (httpx.HTTPError, OSError) as exc:
                if self.aborted:
                    raise self._timeout_error(f"waiting for {url}") from None
                raise ScrapeError(
                    f"cannot fetch {url}: {exc.__class__.__name__}: {exc}", V.SCRAPE_ERROR_UNREACHABLE
                ) from None
            sock = _socket_of(response)
            self._track(sock, True)
            try:
                if response.next_request is not None:  # a redirect: its body is never read
                    url = self._redirect(url, response.next_request.url)
                    continue
                if allow_404 and response.status_code == 404:
                    return ""
                if response.status_code != 200:
                    raise ScrapeError(f"{url} answered HTTP {response.status_code}", V.SCRAPE_ERROR_HTTP_STATUS)
                return self._read(response, url, time.monotonic() + remaining)
            finally:
                self._track(sock, False)
                with contextlib.suppress(Exception):  # closing a connection cut by abort() may complain
                    response.close()
        raise ScrapeError(f"more than {MAX_REDIRECTS} redirects in a row, the last to {url}", V.SCRAPE_ERROR_REDIRECT)

    def _get_plain(self, url: str, allow_404: bool, remaining: float) -> tuple[str, str | None]:
        """One plain-HTTP request (:mod:`inferwatch.exporters.wire`): the body, or the ``Location`` of a
        redirect."""
        try:
            host, port, target = _plain_parts(url)
        except ValueError as exc:  # a bad port
            raise ScrapeError(f"cannot fetch {url}: {exc}", V.SCRAPE_ERROR_UNREACHABLE) from None
        kept = self.connections.take(host, port) if self.connections is not None else None
        if kept is not None:
            try:
                return self._exchange(kept, url, target, allow_404, remaining)
            except wire.Stale:  # a kept connection the engine has closed (or closed as the request went out)
                pass
        with contextlib.suppress(wire.Stale):
            return self._exchange(wire.Connection(host, port), url, target, allow_404, remaining)
        raise ScrapeError(f"cannot fetch {url}: the connection closed unanswered", V.SCRAPE_ERROR_UNREACHABLE)

    def _exchange(
        self, conn: wire.Connection, url: str, target: str, allow_404: bool, remaining: float
    ) -> tuple[str, str | None]:
        """The request on ``conn``; the connection is kept for the next one when its answer was read
        whole and the engine keeps it open, else closed. Raises :class:`wire.Stale` as it comes."""
        keep = False
        sock = conn.sock
        try:
            try:
                if sock is None:
                    sock = conn.open(remaining)
                else:
                    sock.settimeout(remaining)
                self._track(sock, True)
                answer = conn.request(target, _KEEP_HEADERS if self.connections is not None else _CLOSE_HEADERS)
            except TimeoutError:
                raise self._timeout_error(f"waiting for {url}") from None
            except wire.Stale:
                if self.aborted or self.deadline.expired():
                    raise self._timeout_error(f"waiting for {url}") from None
                raise
            except (wire.WireError, OSError) as exc:
                if self.aborted or self.deadline.expired():
                    raise self._timeout_error(f"waiting for {url}") from None
                raise ScrapeError(
                    f"cannot fetch {url}: {exc.__class__.__name__}: {exc}", V.SCRAPE_ERROR_UNREACHABLE
                ) from None
            status = answer.status
            if status in REDIRECT_STATUSES and answer.header("location"):
                return "", urljoin(url, answer.header("location"))
            if allow_404 and status == 404:
                return "", None
            if status != 200:
                raise ScrapeError(f"{url} answered HTTP {status}", V.SCRAPE_ERROR_HTTP_STATUS)
            body = self._read_plain(answer, url, time.monotonic() + remaining)
            keep = self.connections is not None and answer.keep and answer.complete and not self.aborted
            return body, None
        finally:
            self._track(sock, False)
            if keep and self.connections is not None:
                self.connections.give(conn.host, conn.port, conn)
            else:
                with contextlib.suppress(Exception):  # closing a connection cut by abort() may complain
                    conn.close()

    def _read_plain(self, answer: wire.Answer, url: str, until: float) -> str:
        return self._body(
            answer.chunks(),
            answer.header("content-encoding"),
            answer.length,
            _charset(answer.header("content-type")) if "content-type" in answer.headers else None,
            url,
            until,
            failures=(wire.WireError, OSError),
            cut=(wire.Cut,),
        )

    def _redirect(self, url: str, to: httpx.URL) -> str:
        """``to`` when the policy follows a redirect there from ``url``; else ScrapeError (``redirect``)."""
        policy = self.limits.follow_redirects
        if policy == "any" or (policy == "same-origin" and origin(to) == origin(httpx.URL(self.base))):
            return str(to)
        allowed = "no redirect" if policy == "none" else f"redirects within {self.base} only"
        raise ScrapeError(
            f"{url} redirects to {to}; not followed ({allowed}: see the target's follow_redirects)",
            V.SCRAPE_ERROR_REDIRECT,
        )

    def _read(self, response: httpx.Response, url: str, until: float) -> str:
        declared = response.headers.get("content-length", "")
        return self._body(
            response.iter_raw(),
            response.headers.get("content-encoding", ""),
            int(declared) if declared.isdigit() else None,
            response.charset_encoding,
            url,
            until,
            failures=(httpx.HTTPError, OSError),
            cut=(httpx.RemoteProtocolError,),
            timeouts=(httpx.TimeoutException,),
        )

    def _body(
        self,
        chunks: Iterable[bytes],
        coding: str,
        length: int | None,
        charset: str | None,
        url: str,
        until: float,
        *,
        failures: tuple[type[Exception], ...],
        cut: tuple[type[Exception], ...],
        timeouts: tuple[type[Exception], ...] = (),
    ) -> str:
        """The decoded text of a body read from either HTTP client's raw ``chunks``, within the deadline
        and the body limit; ``failures`` are that client's read errors, ``cut`` those that mean the
        body ended early, ``timeouts`` those that mean its own timeout."""
        limit = self.limits.max_body_bytes
        coding = coding.strip().lower() if coding else ""
        decoder = _IDENTITY if coding in ("", "identity") else _Inflate(coding)
        if decoder.identity and length is not None and length > limit:
            raise self._too_large(url)
        try:
            parts = self._gather(chunks, decoder, url, until)
            tail = decoder.flush()
        except timeouts:
            raise self._timeout_error(f"reading the body of {url}") from None
        except failures as exc:
            if self.aborted or time.monotonic() >= until:
                raise self._timeout_error(f"reading the body of {url}") from None
            if isinstance(exc, cut):
                raise ScrapeError(f"the body of {url} was cut: {exc}", V.SCRAPE_ERROR_TRUNCATED) from None
            raise ScrapeError(
                f"reading {url} failed: {exc.__class__.__name__}: {exc}", V.SCRAPE_ERROR_UNREACHABLE
            ) from None
        if sum(map(len, parts)) + len(tail) > limit:
            raise self._too_large(url)
        parts.append(tail)
        try:
            return b"".join(parts).decode(charset or "utf-8", errors="replace")
        except LookupError:  # an unknown charset: httpx falls back to utf-8 too
            return b"".join(parts).decode("utf-8", errors="replace")

    def _gather(self, chunks: Iterable[bytes], decoder: _Inflate, url: str, until: float) -> list[bytes]:
        """The decompressed body from the raw ``chunks`` of either HTTP client, within the deadline and the
        body limit (its errors are the caller's to name)."""
        limit = self.limits.max_body_bytes
        parts: list[bytes] = []
        size = 0
        for chunk in chunks:
            if self.aborted or time.monotonic() >= until:
                raise self._timeout_error(f"reading the body of {url}")
            data = decoder.decode(chunk, limit - size + 1)
            size += len(data)
            if size > limit:
                raise self._too_large(url)
            parts.append(data)
        return parts

    def _too_large(self, url: str) -> ScrapeError:
        return ScrapeError(
            f"the body of {url} exceeds {self.limits.max_body_bytes} bytes (after decompression)",
            V.SCRAPE_ERROR_BODY_TOO_LARGE,
        )


@functools.lru_cache(maxsize=1024)
def _plain_parts(url: str) -> tuple[str, int, str]:
    """(host, port, request target) of a plain-HTTP URL, worked out once per URL (a target asks the same
    few, scrape after scrape); ValueError for a bad port."""
    parts = urlsplit(url)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return parts.hostname or "", parts.port or 80, target


@functools.lru_cache(maxsize=64)
def _charset(content_type: str) -> str | None:
    """The ``charset`` parameter of a Content-Type (what email's header parser would find, at a
    fraction of its cost), or None."""
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').strip() or None
    return None


def _plain_http_ok(client: httpx.Client) -> bool:
    """Whether ``client`` would reach an ``http://`` URL directly with its default transport: no
    transport given to it (tests mount fakes) and no proxy from the environment (httpx honours
    ``HTTP_PROXY``; a ``NO_PROXY`` entry mounts no transport), so that the plain path reaches exactly
    what httpx would."""
    return type(client._transport) is httpx.HTTPTransport and all(t is None for t in client._mounts.values())


class Watchdog:
    """Aborts every watched :class:`EngineRequest` whose deadline passed (one thread, started lazily).

    It sleeps until the first deadline of a request still running, or with none running for the
    shortest timeout of the requests it has watched (:attr:`wakes_at`): a new request is then due after
    that wake, and needs no wake-up of its own. A request that finished in time costs no wake-up either.
    Measured at one scrape a second with a 5 s timeout: woken at every scrape when it slept without a
    time limit while idle (about 0.08 ms of CPU per scrape, a GIL hand-over included), once in 5 now."""

    def __init__(self) -> None:
        self._clock = time.monotonic
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        """on :attr:`_lock`: :meth:`watch` takes the plain lock (a Condition's ``with`` is Python code)."""
        self._heap: list[tuple[float, int, EngineRequest]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._idle = math.inf
        """the shortest timeout of the requests watched: how long the thread sleeps with none running."""
        self.wakes_at = math.inf
        """when the thread wakes next (``time.monotonic``): a request due earlier wakes it at once."""
        self.wakes = 0
        """how many times the thread woke (the tests count them)."""

    def watch(self, request: EngineRequest) -> EngineRequest:
        with self._lock:
            heapq.heappush(self._heap, (request.deadline.at, next(self._seq), request))
            self._idle = min(self._idle, request.limits.timeout_seconds)
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="scrape-watchdog", daemon=True)
                self._thread.start()
            if request.deadline.at < self.wakes_at:  # the thread would wake too late for this one
                self._cond.notify()
        return request

    def live(self) -> list[EngineRequest]:
        """Watched requests that have not finished."""
        with self._cond:
            return [r for _, _, r in self._heap if not r.finished]

    def abort_all(self) -> None:
        for request in self.live():
            request.abort()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        heap = self._heap
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    # requests that finished in time need no abort: forget them without waking for each
                    while heap and heap[0][2].finished:
                        heapq.heappop(heap)
                    now = self._clock()
                    if heap and heap[0][0] <= now:
                        break
                    self.wakes_at = heap[0][0] if heap else now + self._idle
                    self._cond.wait(self.wakes_at - now if self.wakes_at < math.inf else None)
                    self.wakes += 1
                _, _, request = heapq.heappop(heap)
            request.abort()
