"""The exporter's lean HTTP/1.1 server and its kept engine connections (issue 35, item 1).

Prometheus keeps its connection to a target open, and so does the exporter to its engine now: a
scrape costs neither side a new connection or a new thread. What the server reads stays bounded
(head size and time, no bodies, a connection cap, idle and write timeouts), and a kept engine
connection is never used once the engine has closed it, nor after an abort.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from inferwatch.core import vocabulary as V
from inferwatch.exporters import fetching, httpd
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.mapping import ScrapeError
from inferwatch.exporters.runtime import Done, TargetScraper
from inferwatch.exporters.targets import TargetConfig
from tests.conftest import ENGINE_FIXTURES

PAGE = (ENGINE_FIXTURES / "vllm" / "0.32.0-cpu" / "metrics-final.txt").read_bytes()


# -- the server -----------------------------------------------------------------------------------
@contextmanager
def serving(handler: httpd.Handler) -> Iterator[tuple[httpd.HttpServer, int]]:
    server = httpd.HttpServer("127.0.0.1", 0, handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        assert not thread.is_alive()


def echo(path: str, conn: socket.socket) -> httpd.Response:
    if path == "/boom":
        raise RuntimeError("a bug in a handler")
    return 200, httpd.TEXT, f"path={path}\n".encode()


def read_answer(sock: socket.socket) -> tuple[bytes, dict[str, str], bytes]:
    """One answer: (status line, headers, body); the body by its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {k.strip().lower().decode(): v.strip().decode() for k, _, v in (ln.partition(b":") for ln in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        rest += sock.recv(4096)
    return lines[0], headers, rest[:length]


def closed(sock: socket.socket, within: float = 5.0) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return False


def test_one_connection_serves_many_requests_and_pipelined_ones() -> None:
    with serving(echo) as (_, port), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        for i in range(3):
            s.sendall(f"GET /metrics?n={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            status, headers, body = read_answer(s)
            assert status == b"HTTP/1.1 200 OK" and body == b"path=/metrics\n"
            assert "connection" not in headers
        s.sendall(b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n")
        data = b""
        while not data.endswith(b"path=/b\n"):
            data += s.recv(4096)
        assert data.count(b"HTTP/1.1 200 OK") == 2 and data.index(b"path=/a") < data.index(b"path=/b")


@pytest.mark.parametrize(
    "request_head",
    [b"GET / HTTP/1.0\r\n\r\n", b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"],
    ids=["http-1.0", "connection-close"],
)
def test_a_client_that_asks_to_close_gets_its_answer_then_the_close(request_head: bytes) -> None:
    with serving(echo) as (_, port), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request_head)
        status, headers, body = read_answer(s)
        assert status.startswith(b"HTTP/1.1 200") and headers["connection"] == "close" and body == b"path=/\n"
        assert closed(s)


def test_http_1_0_keep_alive_is_honoured() -> None:
    with serving(echo) as (_, port), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        for _ in range(2):
            s.sendall(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            assert read_answer(s)[0].startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 413),
        (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 413),
        (b"GET /metrics\r\n\r\n", 400),
        (b"GET http://elsewhere/ HTTP/1.1\r\n\r\n", 400),
        (b"\x16\x03\x01 binary junk HTTP/1.1\r\n\r\n", 400),
    ],
    ids=["post", "body", "chunked-body", "http-0.9", "absolute-target", "junk"],
)
def test_what_is_not_a_plain_get_is_refused_and_the_connection_closed(request_head: bytes, status: int) -> None:
    with serving(echo) as (_, port), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request_head)
        line, headers, _ = read_answer(s)
        assert line.split(b" ")[1] == str(status).encode()
        assert headers["connection"] == "close"
        if status == 405:
            assert headers["allow"] == "GET, HEAD"
        assert closed(s)


def test_head_gets_the_headers_without_the_body() -> None:
    with serving(echo) as (_, port), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"HEAD /x HTTP/1.1\r\n\r\nGET /y HTTP/1.1\r\n\r\n")
        data = b""
        while data.count(b"\r\n\r\n") < 2 or not data.endswith(b"path=/y\n"):
            data += s.recv(4096)
        assert data.count(b"HTTP/1.1 200") == 2 and b"path=/x" not in data


def test_an_oversized_head_is_dropped_unanswered() -> None:
    with serving(echo) as (_, port), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nX-Junk: " + b"a" * (httpd.MAX_HEAD_BYTES + 10))
        assert closed(s)


def test_a_head_dribbled_past_its_deadline_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpd, "HEAD_TIMEOUT_SECONDS", 0.5)
    with serving(echo) as (_, port), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        started = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\n")
        for _ in range(10):  # a byte every 0.2 s: each read is quick, the head never ends
            time.sleep(0.2)
            try:
                s.sendall(b"X")
            except OSError:
                break
        assert closed(s)
        assert time.monotonic() - started < 3.0


def test_an_idle_connection_is_closed_after_the_idle_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpd, "IDLE_TIMEOUT_SECONDS", 0.3)
    with serving(echo) as (_, port), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        read_answer(s)
        assert closed(s, within=3.0)


def test_connections_past_the_cap_are_answered_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpd, "MAX_CONNECTIONS", 2)
    with serving(echo) as (_, port):
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
        try:
            for s in held:  # both served and kept open
                s.sendall(b"GET / HTTP/1.1\r\n\r\n")
                read_answer(s)
            with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
                line, _, body = read_answer(extra)
                assert line.startswith(b"HTTP/1.1 503") and b"too many connections" in body
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 5  # a slot is free again once a held connection is gone
        while True:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as again:
                again.sendall(b"GET / HTTP/1.1\r\n\r\n")
                if read_answer(again)[0].startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
                    break
            time.sleep(0.05)
        assert time.monotonic() <= deadline


def test_a_failing_handler_answers_500_and_the_server_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with serving(echo) as (_, port), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /boom HTTP/1.1\r\n\r\n")
        assert read_answer(s)[0].startswith(b"HTTP/1.1 500")
        s.sendall(b"GET /fine HTTP/1.1\r\n\r\n")
        assert read_answer(s)[2] == b"path=/fine\n"
    assert "a bug in a handler" in caplog.text


def test_shutdown_closes_idle_connections_and_lets_a_request_being_served_finish() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(path: str, conn: socket.socket) -> httpd.Response:
        if path == "/slow":
            entered.set()
            release.wait(5)
        return 200, httpd.TEXT, b"done\n"

    server = httpd.HttpServer("127.0.0.1", 0, slow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as idle,
        socket.create_connection(("127.0.0.1", port), timeout=5) as busy,
    ):
        idle.sendall(b"GET / HTTP/1.1\r\n\r\n")
        read_answer(idle)
        busy.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
        assert entered.wait(5)
        server.shutdown()
        thread.join(5)
        assert not thread.is_alive()
        assert closed(idle)
        release.set()
        line, headers, body = read_answer(busy)
        assert line.startswith(b"HTTP/1.1 200") and body == b"done\n" and headers["connection"] == "close"
    server.server_close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


# -- kept engine connections ----------------------------------------------------------------------
class KeepAliveEngine:
    """An engine speaking HTTP/1.1 with keep-alive, as uvicorn does: counts its connections and
    requests; :meth:`close_idle` closes the connections waiting for a request (uvicorn's 5 s timeout)."""

    def __init__(self, body: bytes, close_after_answer: bool = False, stall_first: bool = False) -> None:
        self.body = body
        self.close_after_answer = close_after_answer
        self.stall_first = stall_first
        self.connections = 0
        self.requests = 0
        self._idle: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                with self._lock:
                    self._idle.add(conn)
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(4096)
                        if not chunk:
                            return
                        data += chunk
                except OSError:
                    return
                finally:
                    with self._lock:
                        self._idle.discard(conn)
                _, _, data = data.partition(b"\r\n\r\n")
                with self._lock:
                    self.requests += 1
                    stall = self.stall_first and self.requests == 1
                if stall:  # the head and a part of the body, then silence until the client gives up
                    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(self.body)
                    conn.sendall(head + self.body[:100])
                    with contextlib.suppress(OSError):
                        while conn.recv(4096):
                            pass
                    return
                close = b"Connection: close\r\n" if self.close_after_answer else b""
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n%sContent-Length: %d\r\n\r\n"
                conn.sendall(head % (close, len(self.body)) + self.body)
                if self.close_after_answer:
                    return

    def close_idle(self, expect: int = 1) -> None:
        """Close the connections waiting for a request, once ``expect`` of them wait."""
        deadline = time.monotonic() + 5
        while len(self._idle) < expect and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            idle = list(self._idle)
        for conn in idle:
            conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 5
        while self._idle and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        self.listener.close()


@contextmanager
def keepalive_engine(**kw: bool) -> Iterator[KeepAliveEngine]:
    engine = KeepAliveEngine(PAGE, **kw)
    try:
        yield engine
    finally:
        engine.stop()


@contextmanager
def scraper(registry: EngineRegistry, url: str) -> Iterator[TargetScraper]:
    target = TargetConfig.model_validate({"url": url, "engine": V.ENGINE_VLLM, "name": "e", "timeout_seconds": 5})
    with httpx.Client() as client:
        s = TargetScraper(target=target, registry=registry, vocabulary=V.Vocabulary(), client=client)
        try:
            yield s
        finally:
            s.connections.close()


def test_scrapes_reuse_one_engine_connection(registry: EngineRegistry) -> None:
    with keepalive_engine() as engine, scraper(registry, engine.url + "/metrics") as s:
        for _ in range(5):
            snap = s.scrape()
            assert s.state() is None and snap.metrics()
        assert engine.requests >= 5 and engine.connections == 1


def test_an_engine_that_closes_idle_connections_costs_a_new_one_not_a_failed_scrape(
    registry: EngineRegistry,
) -> None:
    with keepalive_engine() as engine, scraper(registry, engine.url + "/metrics") as s:
        s.scrape()
        for _ in range(3):
            engine.close_idle()
            s.scrape()
            assert s.state() is None
        assert engine.connections == 4


def test_an_engine_that_says_close_is_not_kept(registry: EngineRegistry) -> None:
    with keepalive_engine(close_after_answer=True) as engine, scraper(registry, engine.url + "/metrics") as s:
        for _ in range(3):
            s.scrape()
            assert s.state() is None
        assert engine.connections == engine.requests >= 3  # the info request too: a connection each


def test_a_closed_kept_connection_is_met_mid_request_and_the_request_sent_again_once() -> None:
    """A kept connection is not looked at before use: one the engine closed meanwhile fails the
    request's first read, and the request goes out once more on a new connection."""
    with keepalive_engine() as engine:
        connections = fetching.Connections()
        limits = fetching.Limits(5.0, 10_000_000)
        with httpx.Client() as client:
            first = fetching.EngineRequest(client, engine.url, limits, connections)
            assert first.fetch("/metrics") == PAGE.decode()
            first.finish()
            engine.close_idle()
            second = fetching.EngineRequest(client, engine.url, limits, connections)
            assert second.fetch("/metrics") == PAGE.decode()
            second.finish()
        connections.close()
        assert engine.connections == 2 and engine.requests == 2


def test_a_request_cut_at_its_deadline_does_not_leave_its_connection_to_the_next() -> None:
    with keepalive_engine(stall_first=True) as engine:
        connections = fetching.Connections()
        with httpx.Client() as client:
            cut = fetching.EngineRequest(client, engine.url, fetching.Limits(0.5, 10_000_000), connections)
            with pytest.raises(ScrapeError) as exc:
                cut.fetch("/metrics")  # half a body, then nothing
            assert exc.value.reason == V.SCRAPE_ERROR_TIMEOUT
            cut.finish()
            fresh = fetching.EngineRequest(client, engine.url, fetching.Limits(5.0, 10_000_000), connections)
            assert fresh.fetch("/metrics") == PAGE.decode()
            fresh.finish()
        connections.close()
        assert engine.connections == 2


def test_a_flight_done_flag_releases_every_waiter_and_times_out_unset() -> None:
    done = Done()
    assert not done.is_set() and not done.wait(0.05)
    woken: list[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(done.wait(5))) for _ in range(4)]
    for t in waiters:
        t.start()
    time.sleep(0.05)
    done.set()
    for t in waiters:
        t.join(5)
    assert woken == [True] * 4 and done.is_set() and done.wait(0)
