"""Slow clients for tests: connections that dribble a request's head or body a byte at a time.

:func:`attack` opens them against a server on 127.0.0.1, keeps each one dribbling (a byte every ``interval``)
until the server closes it, and records how long each stayed open; :func:`raise_fd_limit` lets the test
process (and the servers it starts) open that many sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


def raise_fd_limit(want: int) -> int:
    """The soft RLIMIT_NOFILE raised towards ``want`` (up to the hard limit); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def need_fds(connections: int) -> None:
    """Skip the test unless this process (and the servers it starts, which inherit the limit) may open
    ``connections`` sockets on both ends, plus a reserve."""
    import pytest

    if raise_fd_limit(4096) < 2 * connections + 256:
        pytest.skip(f"the file descriptor limit is too low for {connections} connections on both ends")


@dataclass
class Dribbler:
    """One slow connection: ``head`` is sent at once (complete headers, for a body dribbler), then ``drip`` is
    repeated a byte at a time."""

    head: bytes
    drip: bytes
    opened: float = 0.0
    closed: float | None = None
    answer: bytes = b""
    error: str | None = None

    @property
    def held(self) -> float:
        """Seconds the server kept the connection open (so far)."""
        return (self.closed or time.monotonic()) - self.opened


@dataclass
class Attack:
    dribblers: list[Dribbler] = field(default_factory=list)

    def open(self) -> list[Dribbler]:
        return [d for d in self.dribblers if d.closed is None]

    def held(self) -> list[float]:
        return sorted(d.held for d in self.dribblers)


def head_dribbler(path: str = "/healthz") -> Dribbler:
    """Sends a request line and then header bytes, never the blank line that ends them."""
    return Dribbler(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ".encode(), b"a")


def silent() -> Dribbler:
    """Connects and sends nothing."""
    return Dribbler(b"", b"")


def kept_dribbler(path: str = "/healthz") -> Dribbler:
    """Sends a whole request (answered, the connection kept alive), then the next one's head a byte at a time."""
    return Dribbler(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET {path} HTTP/1.1\r\nX-Slow: ".encode(), b"a")


def body_dribbler(path: str, content_type: str = "application/json", length: int = 100_000) -> Dribbler:
    """Sends complete headers that announce a ``length``-byte body, then the body a byte at a time."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n"
    )
    return Dribbler(head.encode(), b" ")


async def _run(port: int, d: Dribbler, interval: float, stop: asyncio.Event) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        d.error, d.opened, d.closed = f"connect: {exc!r}", time.monotonic(), time.monotonic()
        return
    d.opened = time.monotonic()

    async def read() -> None:
        with contextlib.suppress(OSError):
            while chunk := await reader.read(65536):
                d.answer += chunk
        d.closed = time.monotonic()

    reading = asyncio.create_task(read())
    try:
        writer.write(d.head)
        while not reading.done() and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reading), interval)
            if reading.done():
                break
            writer.write(d.drip)
            with contextlib.suppress(OSError):
                await writer.drain()
    except OSError:
        pass
    finally:
        reading.cancel()
        with contextlib.suppress(BaseException):
            await reading
        if d.closed is None and not stop.is_set():
            d.closed = time.monotonic()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def attack(
    port: int,
    dribblers: list[Dribbler],
    meanwhile: Callable[[Attack], Awaitable[None]],
    interval: float = 0.5,
    until: float = 30.0,
) -> Attack:
    """Open every dribbler (all at once), run ``meanwhile`` while they dribble, then wait until the server has
    closed them all or ``until`` seconds passed since they opened; the survivors are closed by the test."""
    result = Attack(dribblers)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_run(port, d, interval, stop)) for d in dribblers]
    started = time.monotonic()
    try:
        await asyncio.sleep(0.2)
        await meanwhile(result)
        while result.open() and time.monotonic() - started < until:
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return result
