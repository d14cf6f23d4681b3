"""Slow clients against the collector and the proxy: 500 connections dribbling their request's head and 100
dribbling their body, while ``/healthz`` and real requests are answered; the dribblers are closed within the
configured deadlines (short here: 2 s; the defaults are checked on the settings); the connection caps close
the longest-waiting connection for a newcomer; the proxy's own exhaustion is a 503 that names the proxy.

The collector is the real ``inferwatch collector serve`` process (the uvicorn configuration it serves with);
the proxy runs in a thread of this process, as in ``tests/test_proxy.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from inferwatch.cli.collector import uvicorn_config
from inferwatch.collector.api.slowclients import BODY_GRACE_S, BoundedHttpToolsProtocol, UploadGate
from inferwatch.collector.settings import DEFAULT_MAX_BODY, CollectorSettings
from inferwatch.core.connections import FD_RESERVE, ConnectionGate, connection_cap
from tests.conftest import free_port
from tests.support.slowloris import (
    Attack,
    Dribbler,
    attack,
    body_dribbler,
    head_dribbler,
    kept_dribbler,
    need_fds,
    silent,
)
from tests.support.stack import INFERWATCH, Processes

HEADER_S = 2.0
BODY_S = 2.0
SLACK_S = 4.0
"""a shared CI machine with 600 sockets to serve: deadlines are checked with this much slack."""
HEADS = 500
BODIES = 100
OTLP_JSON = b'{"resourceSpans":[]}'


@contextlib.contextmanager
def collector(tmp_path: Path, *args: str) -> Iterator[str]:
    """``inferwatch collector serve`` in a process of its own; its base URL."""
    port = free_port()
    cmd = [
        *INFERWATCH,
        "collector",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--grpc-listen",
        f"127.0.0.1:{free_port()}",
    ]
    cmd += ["--data-dir", str(tmp_path / "data"), "--log-level", "warning", *args]
    procs = Processes(tmp_path / "logs")
    try:
        procs.spawn("collector", cmd)
        url = f"http://127.0.0.1:{port}"
        procs.wait_http("collector", f"{url}/healthz")
        yield url
    finally:
        procs.close()


class Probe:
    """Health checks and real requests made while the dribblers dribble: their statuses and latencies."""

    def __init__(self) -> None:
        self.health: list[tuple[int, float]] = []
        self.requests: list[tuple[str, int, float]] = []

    async def timed(self, client: httpx.AsyncClient, method: str, url: str, **kw: Any) -> tuple[int, float]:
        started = time.perf_counter()
        try:
            status = (await client.request(method, url, **kw)).status_code
        except httpx.HTTPError as exc:
            status = -1
            print(f"{method} {url}: {exc!r}", file=sys.stderr)
        return status, time.perf_counter() - started

    async def run(
        self, base: str, seconds: float, requests: list[tuple[str, str, dict[str, Any]]], workers: int = 1
    ) -> None:
        """``/healthz`` every 50 ms and the ``requests`` one after the other on ``workers`` clients, for ``seconds``."""
        deadline = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:

            async def health() -> None:
                while time.monotonic() < deadline:
                    self.health.append(await self.timed(client, "GET", "/healthz"))
                    await asyncio.sleep(0.05)

            async def work() -> None:
                while time.monotonic() < deadline:
                    for method, path, kw in requests:
                        status, took = await self.timed(client, method, path, **kw)
                        self.requests.append((path, status, took))

            await asyncio.gather(health(), *(work() for _ in range(workers)))

    def check(self) -> str:
        assert self.health and all(s == 200 for s, _ in self.health), self.health
        assert self.requests and all(s == 200 for _, s, _ in self.requests), self.requests
        latencies = sorted(t for _, t in self.health)
        return (
            f"/healthz x{len(latencies)}: median {statistics.median(latencies) * 1e3:.0f} ms, "
            f"max {latencies[-1] * 1e3:.0f} ms; requests x{len(self.requests)}"
        )


def check_closed(result: Attack, dribblers: list[Dribbler], limit: float, what: str) -> str:
    assert not [d for d in dribblers if d.closed is None], f"{what}: still open after the attack"
    assert not [d for d in dribblers if d.error], [d.error for d in dribblers if d.error][:3]
    held = sorted(d.held for d in dribblers)
    assert held[-1] < limit + SLACK_S, f"{what}: held up to {held[-1]:.1f} s (limit {limit:g} s)"
    return f"{what} x{len(held)}: closed after {held[0]:.1f}-{held[-1]:.1f} s"


# -- the collector ----------------------------------------------------------------------------------------------
def test_collector_closes_slow_clients_and_keeps_answering(tmp_path: Path) -> None:
    """Before: 105 header dribblers held uvicorn's 100-connection cap for good and /healthz answered 503."""
    need_fds(HEADS + BODIES + 20)
    with collector(tmp_path, "--header-timeout", str(HEADER_S), "--body-timeout", str(BODY_S)) as url:
        port = int(url.rsplit(":", 1)[1])
        heads = [head_dribbler() for _ in range(HEADS)]
        heads += [silent() for _ in range(10)] + [kept_dribbler() for _ in range(10)]
        bodies = [body_dribbler("/v1/traces") for _ in range(BODIES // 2)]
        bodies += [body_dribbler("/api/v1/alerts/webhook") for _ in range(BODIES - BODIES // 2)]
        probe = Probe()
        work = [
            ("POST", "/v1/traces", {"content": OTLP_JSON, "headers": {"content-type": "application/json"}}),
            ("GET", "/api/v1/requests", {}),
        ]

        async def meanwhile(_: Attack) -> None:
            await probe.run(url, HEADER_S * 0.8, work)

        result = asyncio.run(attack(port, heads + bodies, meanwhile, until=HEADER_S + BODY_S + 2 * SLACK_S))
        figures = [probe.check(), check_closed(result, heads, HEADER_S, "header dribblers")]
        figures.append(check_closed(result, bodies, BODY_S + BODY_GRACE_S, "body dribblers"))
        assert all(b"HTTP/1.1 408" in d.answer for d in heads), {d.answer[:40] for d in heads}
        assert httpx.get(f"{url}/healthz").status_code == 200
        print("; ".join(figures))


def test_collector_at_its_connection_cap_closes_the_longest_waiting(tmp_path: Path) -> None:
    """Dribblers beyond ``--max-connections`` close each other, not the health check's place."""
    with collector(tmp_path, "--max-connections", "40", "--header-timeout", "30") as url:
        port = int(url.rsplit(":", 1)[1])
        heads = [head_dribbler() for _ in range(80)]
        probe = Probe()

        async def meanwhile(_: Attack) -> None:
            await probe.run(url, 1.0, [("GET", "/api/v1/requests", {})])

        result = asyncio.run(attack(port, heads, meanwhile, until=1.0))
        probe.check()
        evicted = [d for d in heads if d.closed is not None]
        assert len(evicted) >= 40, f"only {len(evicted)} of 80 closed at a cap of 40"
        assert len(result.open()) <= 40


def test_collector_upload_cap_closes_the_oldest_upload_and_spares_reads(tmp_path: Path) -> None:
    """At ``--max-uploads 20`` with 20 bodies dribbling, a new upload closes the oldest (503, Retry-After: 1) and
    is answered; /healthz and a read, which have no body, close none; past the body deadline uploads go through
    with nothing to close. Before: nothing but ``max_connections`` bounded the bodies in flight (each up to
    ``max_body_bytes`` buffered), so the new upload closed none and the dribblers all stayed."""
    uploads, body_s = 20, 4.0  # a deadline well after the checks below, which a loaded machine may slow down
    with collector(tmp_path, "--max-uploads", str(uploads), "--body-timeout", str(body_s)) as url:
        port = int(url.rsplit(":", 1)[1])
        bodies = [body_dribbler("/v1/traces") for _ in range(uploads)]
        export: dict[str, Any] = {"content": OTLP_JSON, "headers": {"content-type": "application/json"}}
        seen: dict[str, Any] = {}

        def closed() -> list[Dribbler]:
            return [d for d in bodies if d.closed is not None]

        async def settle(count: int, seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while len(closed()) < count and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

        async def meanwhile(_: Attack) -> None:
            await asyncio.sleep(0.5)  # every dribbler's headers are in: the cap is reached
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                reads = [(await client.get(path)).status_code for path in ("/healthz", "/api/v1/requests") * 3]
                await settle(1, 0.3)
                seen["reads at the cap"], seen["closed by reads"] = reads, len(closed())
                seen["upload"] = (await client.post("/v1/traces", **export)).status_code
                await settle(1, 1.0)
                seen["closed by the upload"] = len(closed())
                seen["reads after"] = [(await client.get(p)).status_code for p in ("/healthz", "/api/v1/requests")]

        asyncio.run(attack(port, bodies, meanwhile, until=body_s + BODY_GRACE_S + SLACK_S))
        assert seen["reads at the cap"] == [200] * 6 and seen["closed by reads"] == 0, seen
        assert seen["upload"] == 200 and seen["closed by the upload"] == 1, seen
        assert seen["reads after"] == [200, 200], seen
        dropped = [d for d in bodies if d.answer.startswith(b"HTTP/1.1 503")]
        assert len(dropped) == 1 and b"\r\nretry-after: 1\r\n" in dropped[0].answer.lower(), dropped
        others = [d for d in bodies if d not in dropped]
        assert min(d.held for d in others) > body_s - 0.5, sorted(d.held for d in others)  # by the deadline
        print(check_closed(Attack(bodies), others, body_s, "the other dribblers"), dropped[0].answer[:60])
        after = [httpx.post(f"{url}/v1/traces", timeout=10, **export).status_code for _ in range(uploads + 5)]
        assert after == [200] * (uploads + 5)


def test_upload_gate_closes_the_oldest_upload_at_the_cap() -> None:
    class Up:
        def __init__(self) -> None:
            self.dropped = False

        def drop_upload(self) -> None:
            self.dropped = True

    gate = UploadGate(2)
    a, b, c, d = Up(), Up(), Up(), Up()
    gate.start(a)
    gate.start(b)
    gate.start(c)
    assert a.dropped and not b.dropped and len(gate) == 2 and gate.dropped == 1
    gate.end(b)
    gate.end(b)  # harmless twice
    gate.start(d)
    assert not c.dropped and not d.dropped and len(gate) == 2
    gate.start(Up())
    assert c.dropped and gate.dropped == 2


def test_collector_limit_defaults() -> None:
    settings = CollectorSettings()
    assert settings.header_timeout_seconds == 10.0
    assert settings.body_timeout_seconds == 10.0
    assert settings.keep_alive_timeout_seconds == 15.0
    assert settings.max_requests == 100
    assert settings.max_connections is None
    assert settings.max_uploads == 256
    assert settings.max_uploads * settings.max_body_bytes == 1 << 30 == 256 * DEFAULT_MAX_BODY  # 1 GiB buffered
    config = uvicorn_config(object(), settings)
    assert config.limit_concurrency is None  # it counted connections: slow ones held it
    assert issubclass(config.http, BoundedHttpToolsProtocol)
    limits = config.http.shared.limits
    assert (limits.header_timeout, limits.body_timeout, limits.max_requests) == (10.0, 10.0, 100)
    assert limits.max_connections == connection_cap()
    assert limits.max_uploads == 256


def test_connection_cap_follows_the_fd_limit() -> None:
    assert connection_cap(limit=1024) == 1024 - FD_RESERVE
    assert connection_cap(2, limit=1024) == (1024 - FD_RESERVE) // 2
    assert connection_cap(limit=100) == 32
    assert connection_cap(limit=1 << 20) == 16_384


class _Conn:
    def __init__(self) -> None:
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True


def test_gate_closes_the_longest_waiting_and_refuses_when_all_are_busy() -> None:
    gate = ConnectionGate(2)
    a, b, c, d = _Conn(), _Conn(), _Conn(), _Conn()
    assert gate.admit(a) and gate.admit(b)
    gate.busy(a)
    assert gate.admit(c) and b.evicted and not a.evicted  # b waited longest; a has a request
    gate.busy(c)
    assert not gate.admit(d) and gate.refused == 1
    gate.wait(a)
    assert gate.admit(d) and a.evicted and gate.open == 2 and gate.evicted == 2


# -- the request cap, on the collector's uvicorn configuration with a test application ----------------------
def test_request_cap_counts_requests_not_connections_and_spares_healthz() -> None:
    """Requests being handled beyond ``max_requests`` get 503; slow connections and /healthz do not count; a head
    larger than MAX_HEAD_BYTES gets 431 (uvicorn's httptools protocol had no limit)."""
    release = threading.Event()
    holding: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/hold":
            holding.append(1)
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    settings = CollectorSettings(listen=f"127.0.0.1:{port}", max_requests=3)
    server = uvicorn.Server(uvicorn_config(app, settings, "critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)

        async def until_holding(count: int) -> None:
            deadline = time.monotonic() + 20
            while len(holding) < count:
                assert time.monotonic() < deadline, f"{len(holding)} requests held, not {count}"
                await asyncio.sleep(0.02)

        async def scenario() -> tuple[list[int], int, int, int, bytes]:
            slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
            for _, writer in slow:
                writer.write(b"GET /other HTTP/1.1\r\nHost: x\r\n")  # a head never finished
            async with httpx.AsyncClient(base_url=url, timeout=20) as client:
                held = [asyncio.create_task(client.get("/hold")) for _ in range(2)]
                await until_holding(2)
                under = (await client.get("/other")).status_code  # 2 handled + 20 slow connections: under the cap
                held.append(asyncio.create_task(client.get("/hold")))
                await until_holding(3)
                over = (await client.get("/other")).status_code
                health = (await client.get("/healthz")).status_code
                release.set()
                statuses = [r.status_code for r in await asyncio.gather(*held)]
            for _, writer in slow:
                writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)  # headers beyond MAX_HEAD_BYTES
            writer.write(b"GET /other HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
            big = await reader.read(100)
            writer.close()
            return statuses, under, over, health, big

        statuses, under, over, health, big = asyncio.run(scenario())
        assert statuses == [200, 200, 200]
        assert (under, over, health) == (200, 503, 200)
        assert big.startswith(b"HTTP/1.1 431"), big
    finally:
        release.set()
        server.should_exit = True
        thread.join(20)
