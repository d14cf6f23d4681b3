"""The proxy's own HTTP/1.1 connections to the engine (``inferwatch.proxy.upstream``): body framing split at
every byte, malformed answers, kept connections reused and sent again once when the engine had closed
them, interim answers, silence, and back-pressure from a slow client through the whole proxy.

The engines here are raw asyncio servers on 127.0.0.1 (free ports), so that every byte they send is the
test's choice; each test runs its own event loop and closes what it opened.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
from multidict import CIMultiDict

from inferwatch.cli.common import loop_factory
from inferwatch.proxy import upstream
from inferwatch.proxy.server import Proxy, ProxySettings
from inferwatch.proxy.upstream import Body, Head, Pool, UpstreamError, UpstreamTimeout, parse_head

CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"


def head(**headers: str) -> Head:
    return Head("HTTP/1.1", 200, "OK", CIMultiDict(headers))


# -- framing ------------------------------------------------------------------------------------------------
def test_chunked_body_split_at_every_byte() -> None:
    events = [b'data: {"n": %d}\n\n' % i for i in range(3)]
    wire = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\nX-Trailer: 1\r\n\r\n"
    for cut in range(len(wire) + 1):
        body = Body(head(**{"Transfer-Encoding": "chunked"}), False)
        got = body.feed(wire[:cut])
        assert not body.done or cut == len(wire)
        got += body.feed(wire[cut:])
        assert body.done and got == b"".join(events), cut
    body = Body(head(**{"Transfer-Encoding": "chunked"}), False)
    assert b"".join(body.feed(wire[k : k + 1]) for k in range(len(wire))) == b"".join(events) and body.done


def test_length_until_close_and_bodiless() -> None:
    body = Body(head(**{"Content-Length": "5"}), False)
    assert body.feed(b"ab") == b"ab" and not body.done
    assert body.feed(b"cde") == b"cde" and body.done
    with pytest.raises(UpstreamError):
        Body(head(**{"Content-Length": "2"}), False).feed(b"abc")
    body = Body(head(), False)
    assert body.until_close and body.feed(b"anything") == b"anything" and not body.done
    assert Body(head(**{"Content-Length": "9"}), True).done  # the answer to HEAD
    assert Body(Head("HTTP/1.1", 204, "", CIMultiDict()), False).done


@pytest.mark.parametrize(
    "wire",
    [b"zz\r\nab\r\n", b"2\r\nabXY", b"2\r\nab\r\n0\r\n\r\nextra", b"-1\r\n", b"1" * 5000],
    ids=["bad size", "no CRLF after data", "bytes after the end", "negative", "endless size line"],
)
def test_malformed_chunks_are_errors(wire: bytes) -> None:
    with pytest.raises(UpstreamError):
        Body(head(**{"Transfer-Encoding": "chunked"}), False).feed(wire)


def test_heads() -> None:
    h = parse_head(b"HTTP/1.1 404 Not Found\r\nX-A: 1\r\nx-a: 2\r\nContent-Type: application/json")
    assert (h.status, h.reason, h.headers.getall("X-A")) == (404, "Not Found", ["1", "2"])
    assert parse_head(b"HTTP/1.0 200").reason == ""
    for bad in (b"SSH-2.0-x", b"HTTP/1.1 2000 OK", b"HTTP/1.1 200 OK\r\nno colon", b"HTTP/1.1 200 OK\r\n X: 1"):
        with pytest.raises(UpstreamError):
            parse_head(bad)


# -- connections ----------------------------------------------------------------------------------------------
Engine = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    raw = await reader.readuntil(b"\r\n\r\n")
    length = next((int(x.split(b":")[1]) for x in raw.split(b"\r\n") if x.lower().startswith(b"content-length")), 0)
    return raw + await reader.readexactly(length)


async def with_engine(engine: Engine, test: Callable[[str, list[int]], Awaitable[None]]) -> None:
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await engine(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        await test(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections)
    finally:
        server.close()
        await server.wait_closed()


async def exchange(pool: Pool, path: str = "/x") -> tuple[Head, bytes]:
    conn, h = await pool.exchange(pool.request("POST", path, [("Authorization", "Bearer t")], b"{}"), False)
    got: list[bytes] = []
    conn.relay(got.append)
    try:
        await conn.read_body(lambda: asyncio.sleep(0))
    finally:
        pool.release(conn)
    return h, b"".join(got)


def test_kept_connections_are_reused_and_a_closed_one_is_sent_again() -> None:
    requests: list[bytes] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for n in range(3):
            request = await read_request(reader)
            requests.append(request)
            assert b"\r\nHost: 127.0.0.1:" in request and b"\r\nAuthorization: Bearer t\r\n" in request
            if n == 2:  # the third request on a connection: closed unanswered, as an idle close racing it
                return
            writer.write(CHUNKED + b"5\r\nhello\r\n0\r\n\r\n")
            await writer.drain()

    async def test(url: str, connections: list[int]) -> None:
        pool = Pool(url, timeout=5, connect_timeout=5)
        try:
            for _ in range(4):
                h, body = await exchange(pool)
                assert (h.status, body) == (200, b"hello")
        finally:
            pool.close()
        # 1 new, 2 kept, 3 kept then sent again on a new connection, 4 kept
        assert (len(connections), len(requests)) == (2, 5)

    asyncio.run(with_engine(engine, test))


def test_a_request_the_engine_held_before_closing_is_not_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine reads the second request, works on it past the resend window, then closes without a byte:
    it may have generated already, so the request is not sent a second time (it was, before)."""
    monkeypatch.setattr(upstream, "RESEND_WINDOW_S", 0.2)
    requests: list[bytes] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            requests.append(await read_request(reader))
            if len(requests) == 2:
                await asyncio.sleep(0.5)
                return
            writer.write(CHUNKED + b"5\r\nhello\r\n0\r\n\r\n")
            await writer.drain()

    async def test(url: str, connections: list[int]) -> None:
        pool = Pool(url, timeout=5, connect_timeout=5)
        try:
            await exchange(pool)
            with pytest.raises(UpstreamError, match="closed before"):
                await exchange(pool)
        finally:
            pool.close()
        assert (len(connections), len(requests)) == (1, 2)

    asyncio.run(with_engine(engine, test))


def test_a_connection_idle_past_its_keep_time_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upstream, "IDLE_KEEP_S", 0.2)

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async def test(url: str, connections: list[int]) -> None:
        pool = Pool(url, timeout=5, connect_timeout=5)
        try:
            await exchange(pool)
            await exchange(pool)  # at once: the kept connection
            await asyncio.sleep(0.4)
            await exchange(pool)  # idle too long: a new one
        finally:
            pool.close()
        assert len(connections) == 2

    asyncio.run(with_engine(engine, test))


def test_a_reset_cuts_a_body_delimited_by_the_close() -> None:
    """A body without Content-Length or chunking ends with an orderly close; a reset in the middle is a cut
    stream (it passed as a whole answer, recorded as ``stop``, before)."""

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: a\n\n")
        await writer.drain()
        if b" /reset " in request:
            await asyncio.sleep(0.1)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

    async def test(url: str, connections: list[int]) -> None:
        pool = Pool(url, timeout=5, connect_timeout=5)
        try:
            h, body = await exchange(pool, "/close")  # an orderly close ends the body
            assert (h.status, body) == (200, b"data: a\n\n")
            with pytest.raises(UpstreamError, match="closed before the response's end"):
                await exchange(pool, "/reset")
        finally:
            pool.close()

    asyncio.run(with_engine(engine, test))


@pytest.mark.parametrize("length", ["abc", "\u00b2", "-1"])
def test_a_malformed_content_length_is_an_upstream_error(length: str) -> None:
    """Refused at the head (the proxy answers 502): the head used to count as read first, so the bad value
    reached the client's response (a 500 from aiohttp), and "²" passed isdigit() and broke int()."""

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: " + length.encode() + b"\r\n\r\nok")
        await writer.drain()

    async def test(url: str, connections: list[int]) -> None:
        pool = Pool(url, timeout=5, connect_timeout=5)
        try:
            with pytest.raises(UpstreamError, match="malformed Content-Length"):
                await pool.exchange(pool.request("POST", "/x", [], b"{}"), False)
        finally:
            pool.close()

    asyncio.run(with_engine(engine, test))


def test_a_pause_on_the_last_read_leaves_the_connection_reusable() -> None:
    """The read that ends the body fills the client's buffer (the sink pauses): reading resumes as the body
    ends, so the connection is kept (it was closed, costing a new connection per slow client's answer)."""

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            await writer.drain()

    def overfull(conn: upstream.Upstream, _payload: bytes) -> None:
        conn.pause()  # the client's buffer over its high-water mark at every read

    async def test(url: str, connections: list[int]) -> None:
        pool = Pool(url, timeout=5, connect_timeout=5)
        try:
            for _ in range(3):
                conn, _ = await pool.exchange(pool.request("POST", "/x", [], b"{}"), False)
                conn.relay(functools.partial(overfull, conn))
                await conn.read_body(lambda: asyncio.sleep(0))
                assert conn.reusable and not conn.paused
                pool.release(conn)
        finally:
            pool.close()
        assert len(connections) == 1

    asyncio.run(with_engine(engine, test))


def test_interim_answers_silence_and_cuts() -> None:
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        path = request.split(b" ")[1]
        if path == b"/continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        elif path == b"/silent":
            await asyncio.sleep(3)
        elif path == b"/stall":
            writer.write(CHUNKED + b"2\r\nab\r\n")
            await writer.drain()
            await asyncio.sleep(3)
        elif path == b"/cut":
            writer.write(CHUNKED + b"2\r\nab\r\n")
            await writer.drain()
            writer.transport.abort()
        elif path == b"/garbage":
            writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()

    async def test(url: str, connections: list[int]) -> None:
        pool = Pool(url, timeout=0.5, connect_timeout=5)
        try:
            h, body = await exchange(pool, "/continue")
            assert (h.status, body) == (200, b"ok")
            for path, error in (("/silent", UpstreamTimeout), ("/stall", UpstreamTimeout), ("/cut", UpstreamError)):
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                with pytest.raises(error):
                    await exchange(pool, path)
                assert loop.time() - t0 < 2, path
            with pytest.raises(UpstreamError, match="malformed"):
                await exchange(pool, "/garbage")
        finally:
            pool.close()

    asyncio.run(with_engine(engine, test))


def test_refused_connection() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused

        async def test() -> None:
            pool = Pool(f"http://127.0.0.1:{port}", timeout=5, connect_timeout=5)
            with pytest.raises(UpstreamError, match="unreachable"):
                await exchange(pool)

        asyncio.run(test())


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_a_slow_client_pauses_the_engine_and_gets_every_byte(event_loop: str) -> None:
    """The engine streams 64 MiB as fast as it can while the client reads nothing for a second: the proxy
    stops reading from the engine (without it, it would take all 64 MiB into memory), then relays every
    byte once the client reads."""
    event = b"data: " + b"x" * 4090 + b"\n\n"
    count = 16384
    written: list[int] = [0]

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(CHUNKED)
        for _ in range(count):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            written[0] += len(event)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def test(url: str, connections: list[int]) -> None:
        proxy = Proxy(ProxySettings(upstream=url, port=0, discover_models=False))
        await proxy.start()
        try:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", proxy.port))
            reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            await asyncio.sleep(1.0)  # not reading
            held = written[0]
            assert held < count * len(event) * 0.6, held  # kernel buffers only, not the whole stream
            raw = await reader.readuntil(b"\r\n\r\n")
            assert raw.startswith(b"HTTP/1.1 200 ")
            got = 0
            while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
                got += len(await reader.readexactly(size + 2)) - 2
            assert got == count * len(event) == written[0]
            writer.close()
        finally:
            await proxy.stop()

    with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
        runner.run(with_engine(engine, test))
