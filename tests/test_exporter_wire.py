"""The exporter's plain-HTTP engine client reads answers as the RFC frames them, within bounds.

Each case is an engine answering with canned bytes; the body must come out whole (by length, by
chunks with extensions and trailers, or to the end of the connection), or the answer be refused
with the reason a scrape reports, and a connection be kept only when its answer was framed and
read whole.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from inferwatch.core import vocabulary as V
from inferwatch.exporters import fetching, wire
from inferwatch.exporters.mapping import ScrapeError

BODY = b"a_gauge 1\n"


@contextmanager
def canned(answer: bytes, close: bool = False) -> Iterator[tuple[str, list[bytes]]]:
    """An engine that reads each request head and writes ``answer`` (closing after it if ``close``);
    yields its URL and the request heads it read."""
    listener = socket.create_server(("127.0.0.1", 0))
    heads: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while True:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    if b"\r\n\r\n" not in data:
                        break
                    head, _, data = data.partition(b"\r\n\r\n")
                    heads.append(head)
                    conn.sendall(answer)
                    if close:
                        break

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", heads
    finally:
        listener.close()


def fetch(url: str, connections: fetching.Connections | None = None, limit: int = 1_000_000) -> str:
    with httpx.Client() as client:
        request = fetching.EngineRequest(client, url, fetching.Limits(5.0, limit), connections)
        try:
            return request.fetch("/metrics")
        finally:
            request.finish()


def kept(connections: fetching.Connections) -> int:
    return sum(len(idle) for idle in connections._idle.values())


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
    b"5;ext=1\r\na_gau\r\n" + b"%x\r\n%s\r\n" % (len(BODY) - 5, BODY[5:]) + b"0\r\nX-Trailer: t\r\n\r\n"
)


@pytest.mark.parametrize(
    ("answer", "close", "keep"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY), False, True),
        (CHUNKED, False, True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(BODY), BODY), True, False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY), True, False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY), False, True),
        (b"HTTP/1.1 200 OK\r\n\r\n" + BODY, True, False),  # to the end of the connection
    ],
    ids=["length", "chunked", "close", "http-1.0", "http-1.0-keep-alive", "until-close"],
)
def test_the_body_is_read_whole_and_the_connection_kept_when_it_may_be(answer: bytes, close: bool, keep: bool) -> None:
    with canned(answer, close=close) as (url, heads):
        connections = fetching.Connections()
        assert fetch(url, connections) == BODY.decode()
        assert kept(connections) == (1 if keep else 0)
        assert fetch(url, connections) == BODY.decode()  # and again, on it or on a new one
        connections.close()
    assert heads[0].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:") and b"Accept-Encoding: gzip" in heads[0]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + BODY, V.SCRAPE_ERROR_TRUNCATED),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc", V.SCRAPE_ERROR_TRUNCATED),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", V.SCRAPE_ERROR_UNREACHABLE),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n", V.SCRAPE_ERROR_UNREACHABLE),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", V.SCRAPE_ERROR_UNREACHABLE),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", V.SCRAPE_ERROR_UNREACHABLE),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", V.SCRAPE_ERROR_UNREACHABLE),
        (b"HTTP/1.1 200 OK\r\nX-Junk: " + b"a" * (wire.MAX_HEAD_BYTES + 1) + b"\r\n\r\n", V.SCRAPE_ERROR_UNREACHABLE),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n", V.SCRAPE_ERROR_BODY_TOO_LARGE),
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", V.SCRAPE_ERROR_HTTP_STATUS),
        (b"", V.SCRAPE_ERROR_UNREACHABLE),  # closed unanswered, on a new connection
    ],
    ids=[
        "cut-by-length",
        "cut-in-chunk",
        "bad-chunk-size",
        "chunk-over-size",
        "bad-length",
        "not-http",
        "bad-header",
        "head-too-large",
        "declared-too-large",
        "status",
        "closed-unanswered",
    ],
)
def test_what_is_not_a_whole_answer_fails_the_scrape_with_its_reason(answer: bytes, reason: str) -> None:
    with canned(answer, close=True) as (url, _):
        connections = fetching.Connections()
        with pytest.raises(ScrapeError) as exc:
            fetch(url, connections)
        assert exc.value.reason == reason
        assert kept(connections) == 0
        connections.close()


def test_a_long_body_of_known_length_is_read_whole_across_reads() -> None:
    body = b"a_gauge 1\n" * 30_000  # 300 KB: several reads after the head's
    with canned(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)) as (url, _):
        connections = fetching.Connections()
        assert fetch(url, connections) == body.decode()
        assert kept(connections) == 1
        connections.close()


def test_without_a_pool_the_request_asks_to_close() -> None:
    with canned(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)) as (url, heads):
        assert fetch(url) == BODY.decode()
    assert b"Connection: close" in heads[0]


def test_the_watchdog_aborts_at_the_deadline_and_sleeps_through_short_requests() -> None:
    """A request past its deadline is aborted by then; requests that end in time, one after another,
    do not wake the watchdog each (it sleeps a timeout at a time while none runs)."""
    timeout = 0.3
    watchdog = fetching.Watchdog()
    try:
        with httpx.Client() as client:

            def request() -> fetching.EngineRequest:
                return watchdog.watch(fetching.EngineRequest(client, "http://127.0.0.1:1", fetching.Limits(timeout, 1)))

            slow = request()
            deadline = slow.deadline.at
            while not slow.aborted and time.monotonic() < deadline + 2.0:
                time.sleep(0.005)
            assert slow.aborted and time.monotonic() >= deadline
            woken = watchdog.wakes
            # 20 short requests over about two timeouts: a few timed wakes, not one per request
            for _ in range(20):
                quick = request()
                quick.finish()
                time.sleep(timeout / 10)
            assert watchdog.wakes - woken <= 4, watchdog.wakes - woken
            assert not quick.aborted
    finally:
        watchdog.stop()
