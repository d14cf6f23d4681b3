"""The peers of ``bench/proxy.py``, each run as a process of its own (``python -m bench.proxy
--serve-upstream`` / ``--serve-relay``): the simulated engine, an OpenAI ``/v1/completions`` SSE server as
lean as it can be, and the floor, a bare TCP relay that copies bytes and nothing else."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import cast

PAIR_WAIT_S = 120.0


# -- the simulated engine -----------------------------------------------------------------------------
def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class Pairing:
    """Streams opened twice under one ``pair`` id: the engine writes each chunk to both at once."""

    def __init__(self) -> None:
        self.waiting: dict[str, tuple[asyncio.StreamWriter, asyncio.Future[asyncio.StreamWriter]]] = {}

    async def join(self, pair: str, writer: asyncio.StreamWriter) -> asyncio.StreamWriter | None:
        """The first of a pair waits for the second and returns it; the second returns ``None``."""
        if pair in self.waiting:
            _, first = self.waiting.pop(pair)
            first.set_result(writer)
            return None
        fut: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()
        self.waiting[pair] = (writer, fut)
        return await asyncio.wait_for(fut, PAIR_WAIT_S)


async def upstream_main(port: int, interval: float) -> None:
    pairing = Pairing()
    paired_done: dict[str, asyncio.Event] = {}

    async def stream(writers: list[asyncio.StreamWriter], tokens: int, phase: float) -> None:
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for w in writers:
            w.write(head)
        await asyncio.sleep(phase)
        next_at = time.monotonic()
        for i in range(tokens):
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            finish = b'"length"' if i == tokens - 1 else b"null"
            stamp = time.perf_counter_ns()
            data = (
                b'data: {"id":"cmpl-bench","object":"text_completion","model":"bench","choices":[{"index":0,'
                b'"text":" tok","logprobs":null,"finish_reason":%s}],"t":%d}\n\n' % (finish, stamp)
            )
            frame = _chunk(data)
            order = writers if i % 2 == 0 else writers[::-1]
            for w in order:
                w.write(frame)
            for w in order:
                await w.drain()
        for w in writers:
            w.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await w.drain()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = json.loads(await reader.readexactly(length)) if length else {}
                tokens = int(body.get("max_tokens", 16))
                pair = body.get("pair")
                phase = float(body.get("phase", 0.0))
                if pair is None:
                    await stream([writer], tokens, phase)
                    continue
                other = await pairing.join(pair, writer)
                if other is None:  # the second of the pair: the first one streams to both
                    done = paired_done.setdefault(pair, asyncio.Event())
                    await done.wait()
                    paired_done.pop(pair, None)
                    continue
                try:
                    await stream([writer, other], tokens, phase)
                finally:
                    paired_done.setdefault(pair, asyncio.Event()).set()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()

    await serve_until_signalled(await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096))


# -- the floor: a bare TCP relay ------------------------------------------------------------------------
class _RelaySide(asyncio.Protocol):
    """One side of a relayed connection: what it reads is written to its peer as it comes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _RelaySide | None = None
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def relay_main(port: int, upstream: int) -> None:
    """Every connection to ``port`` relayed byte for byte to ``upstream``: no HTTP, no parsing, no
    measurement; what any hop through a process costs on this machine (the floor of the added latency)."""
    loop = asyncio.get_running_loop()

    links: set[asyncio.Task[None]] = set()

    def accepted() -> _RelaySide:
        client = _RelaySide()

        async def link() -> None:
            try:
                _, engine = await loop.create_connection(_RelaySide, "127.0.0.1", upstream)
            except OSError:
                if client.transport is not None:
                    client.transport.close()
                return
            engine.peer, client.peer = client, engine
            assert engine.transport is not None
            for data in client.early:
                engine.transport.write(data)
            client.early.clear()

        task = loop.create_task(link())
        links.add(task)
        task.add_done_callback(links.discard)
        return client

    await serve_until_signalled(await loop.create_server(accepted, "127.0.0.1", port, backlog=4096))


async def serve_until_signalled(server: asyncio.Server) -> None:
    """Serve until SIGTERM or SIGINT (the benchmark's own servers: the engine, the relay)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
