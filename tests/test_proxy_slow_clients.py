"""Slow clients against ``inferwatch proxy``: 500 connections dribbling their request's head and 100 dribbling
their body while ``/healthz`` and generation requests to a fake engine are answered; the dribblers closed within
the configured deadlines; the connection cap; and the proxy's own exhaustion answered 503 naming the proxy, not
502 blaming the engine.

The proxy runs in a thread of this process (as in ``tests/test_proxy.py``), except in the file descriptor test:
there ``inferwatch proxy`` runs with a low RLIMIT_NOFILE of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch.cli.proxy import proxy as proxy_command
from inferwatch.core.connections import connection_cap
from inferwatch.proxy.server import ProxySettings
from tests.conftest import free_port
from tests.support.proxy_harness import LOOPS, echo_upstream, running_proxy
from tests.support.slowloris import Attack, attack, body_dribbler, head_dribbler, kept_dribbler, need_fds, silent
from tests.support.stack import Processes
from tests.test_slow_clients import BODIES, BODY_S, HEADER_S, HEADS, Probe, check_closed

GENERATE = ("POST", "/v1/completions", {"json": {"model": "m", "prompt": "x", "stream": True}})


@pytest.mark.parametrize("event_loop", LOOPS)
def test_proxy_closes_slow_clients_and_keeps_answering(event_loop: str) -> None:
    """Before: no deadline on a request's head or body; 800 dribblers were held for as long as they liked."""
    need_fds(HEADS + BODIES + 20)
    with (
        echo_upstream() as echo,
        running_proxy(echo.url, event_loop, engine="vllm", header_timeout=HEADER_S, body_timeout=BODY_S) as run,
    ):
        heads = [head_dribbler() for _ in range(HEADS)]
        heads += [silent() for _ in range(10)] + [kept_dribbler() for _ in range(10)]
        bodies = [body_dribbler("/v1/completions") for _ in range(BODIES)]
        probe = Probe()

        async def meanwhile(_: Attack) -> None:
            await probe.run(run.url, HEADER_S * 0.8, [GENERATE], workers=4)  # a generation takes ~1 s

        result = asyncio.run(attack(run.proxy.port, heads + bodies, meanwhile, until=HEADER_S + BODY_S + 10))
        figures = [probe.check(), check_closed(result, heads, HEADER_S, "header dribblers")]
        figures.append(check_closed(result, bodies, BODY_S, "body dribblers"))
        assert all(b"HTTP/1.1 408" in d.answer for d in heads + bodies), {d.answer[:40] for d in heads}
        assert httpx.get(run.url + "/healthz").status_code == 200
        print("; ".join(figures))


def test_proxy_at_its_connection_cap_closes_the_longest_waiting_then_refuses_with_503() -> None:
    with echo_upstream() as echo, running_proxy(echo.url, engine="vllm", max_connections=20) as run:
        heads = [head_dribbler() for _ in range(40)]
        probe = Probe()

        async def meanwhile(_: Attack) -> None:
            await probe.run(run.url, 1.0, [GENERATE])

        result = asyncio.run(attack(run.proxy.port, heads, meanwhile, until=1.0))
        probe.check()
        assert len([d for d in heads if d.closed is not None]) >= 20 and len(result.open()) <= 20

        # every place taken by a request in progress (bodies being received): the newcomer gets 503 at once
        async def full() -> httpx.Response:
            bodies = [body_dribbler("/v1/completions") for _ in range(20)]

            async def refused(_: Attack) -> None:
                async with httpx.AsyncClient(timeout=10) as client:
                    answers.append(await client.get(run.url + "/healthz"))

            answers: list[httpx.Response] = []
            await attack(run.proxy.port, bodies, refused, until=0)
            return answers[0]

        r = asyncio.run(full())
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert r.json()["error"]["side"] == "proxy" and r.json()["error"]["type"] == "proxy_overloaded"


@pytest.mark.parametrize("path", ["/v1/completions", "/other"])
def test_proxy_out_of_file_descriptors_is_503_naming_the_proxy(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Connecting to the engine fails with EMFILE (injected at the loop's create_connection, which both the
    generation path and aiohttp's client call): the proxy's failure, 503, not the engine's 502."""
    with echo_upstream() as echo, running_proxy(echo.url, engine="vllm", discover_models=False) as run:

        async def no_fds(*args: Any, sock: socket.socket | None = None, **kwargs: Any) -> Any:
            if sock is not None:  # aiohttp's, connected already: closed, as create_connection does when it fails
                sock.close()
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

        monkeypatch.setattr(run.loop, "create_connection", no_fds)
        r = httpx.post(run.url + path, json={"model": "m", "prompt": "x"})
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["side"] == "proxy" and "file descriptors" in error["message"] and "upstream" not in error


def _fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.contextmanager
def limited_proxy(tmp_path: Path, upstream: str, nofile: int, *args: str) -> Iterator[tuple[str, int]]:
    """``inferwatch proxy`` with RLIMIT_NOFILE ``nofile``: its URL and process id."""
    port = free_port()
    argv = ["-m", "inferwatch", "proxy", "--listen", f"127.0.0.1:{port}", "--upstream", upstream, *args]
    boot = (
        "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])));"
        " os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
    )
    procs = Processes(tmp_path / "logs")
    try:
        proc = procs.spawn("proxy", [sys.executable, "-c", boot, str(nofile), *argv])
        url = f"http://127.0.0.1:{port}"
        procs.wait_http("proxy", url + "/healthz")
        yield url, proc.pid
    finally:
        procs.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts the proxy's descriptors in /proc")
def test_proxy_that_ran_out_of_descriptors_says_so(tmp_path: Path) -> None:
    """The real thing: a proxy with 96 descriptors and its cap lifted takes idle connections until one is left;
    the next request's connection takes it, and the engine cannot be reached. Before: ``502 upstream unreachable
    (OSError)``."""
    with echo_upstream() as echo, limited_proxy(tmp_path, echo.url, 96, "--max-connections", "10000") as (url, pid):
        port = int(url.rsplit(":", 1)[1])
        idle: list[socket.socket] = []
        try:
            deadline = time.monotonic() + 20
            while _fds_of(pid) < 95:
                assert time.monotonic() < deadline, f"the proxy holds {_fds_of(pid)} descriptors"
                before = _fds_of(pid)
                idle.append(socket.create_connection(("127.0.0.1", port)))
                while _fds_of(pid) == before and time.monotonic() < deadline:
                    time.sleep(0.01)
            r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x"}, timeout=10)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["side"] == "proxy" and "EMFILE" in r.json()["error"]["message"]
        finally:
            for sock in idle:
                sock.close()
        deadline = time.monotonic() + 10
        while httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x"}).status_code != 200:
            assert time.monotonic() < deadline, "the proxy did not recover once the connections left"
            time.sleep(0.1)


def test_proxy_limit_defaults() -> None:
    settings = ProxySettings(upstream="http://127.0.0.1:1")
    assert (settings.header_timeout, settings.body_timeout, settings.keep_alive_timeout) == (10.0, 30.0, 15.0)
    assert settings.max_connections is None and connection_cap(2) > 0
    flags = {p.name: p.default for p in inspect.signature(proxy_command).parameters.values()}
    assert (flags["header_timeout"], flags["body_timeout"], flags["keep_alive_timeout"]) == (10.0, 30.0, 15.0)
    assert flags["max_connections"] is None
