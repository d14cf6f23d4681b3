"""Concurrent scrapes cost an engine one request, however late a busy exporter reads them.

The defect: ``bench/exporter_fleet.py`` measured 1.68-1.88 engine requests per engine for 8 scrapes
sent at once (1.5-2.6 for 32). A busy exporter read them late: its listen backlog (5) dropped the
connections past the 5th, whose clients tried again a second later, and a scrape that reached a target
after that target's flight had ended started a second one. The rule now: a scrape shares the last
flight that had not ended when the scrape *arrived* (when its request reached the machine).
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from inferwatch.core import vocabulary as V
from inferwatch.exporters import httpd
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.runtime import TargetScraper
from inferwatch.exporters.server import Exporter, arrived_at
from inferwatch.exporters.targets import ExporterConfig, TargetConfig
from tests.conftest import ENGINE_FIXTURES
from tests.helpers import value
from tests.support import fake_engines as fake

PAGE = (ENGINE_FIXTURES / "vllm" / "0.32.0-cpu" / "metrics-final.txt").read_bytes()


def slow_page(body: bytes, delay: float) -> fake.Behaviour:
    """``body`` after ``delay`` seconds: a flight that lasts that long."""

    def serve(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        stop.wait(delay)
        fake.page(body)(h, stop)

    return serve


def target(url: str) -> TargetConfig:
    return TargetConfig.model_validate({"url": url, "engine": V.ENGINE_VLLM, "name": "e", "timeout_seconds": 5})


@contextmanager
def scraper(registry: EngineRegistry, url: str) -> Iterator[TargetScraper]:
    with httpx.Client() as client:
        yield TargetScraper(target=target(url), registry=registry, vocabulary=V.Vocabulary(), client=client)


def test_a_scrape_shares_the_last_flight_when_it_arrived_before_that_flight_ended(registry: EngineRegistry) -> None:
    """The threshold exactly: arrived at the flight's end shares it; a moment later starts another."""
    with fake.FakeEngine({"/metrics": fake.page(PAGE)}) as engine, scraper(registry, engine.url + "/metrics") as s:
        first = s.begin()
        assert s.collect(first).value(V.EXPORTER_UP) == 1.0 and engine.hits["/metrics"] == 1
        assert s.begin(arrived=first.ended) is first  # at the end: shares (read late, arrived in time)
        assert s.begin(arrived=first.started) is first  # arrived long before, read only now
        assert engine.hits["/metrics"] == 1
        second = s.begin(arrived=math.nextafter(first.ended, math.inf))  # just after the end: asks again
        assert second is not first
        s.collect(second)
        assert engine.hits["/metrics"] == 2
        assert s.begin(arrived=first.ended) is second  # it arrived before the last flight ended
        third = s.begin()  # now: after every flight's end
        assert third is not second
        s.collect(third)
        assert engine.hits["/metrics"] == 3


def test_a_scrape_arriving_during_a_flight_shares_it(registry: EngineRegistry) -> None:
    with (
        fake.FakeEngine({"/metrics": slow_page(PAGE, 0.3)}) as engine,
        scraper(registry, engine.url + "/metrics") as s,
    ):
        first = s.begin()
        assert s.begin() is first  # in flight
        s.collect(first)
        assert engine.hits["/metrics"] == 1


def test_arrived_at_is_when_the_request_reached_the_machine() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        with client:
            sent = time.monotonic()
            client.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            after = time.monotonic()
            time.sleep(0.3)  # a busy exporter accepts it late
            conn, _ = listener.accept()
            with conn:
                came = arrived_at(conn)
    print(f"sent {time.monotonic() - sent:.3f} s ago; arrived_at says {time.monotonic() - came:.3f} s ago")
    jiffy = 0.011  # the kernel counts in jiffies (at worst 10 ms), and reports whole milliseconds
    assert sent - jiffy <= came <= after + jiffy


def test_arrived_at_is_now_where_the_kernel_does_not_tell() -> None:
    a, b = socket.socketpair()
    with a, b:
        before = time.monotonic()
        came = arrived_at(a)
        assert before <= came <= time.monotonic()


@contextmanager
def late_reader(monkeypatch: pytest.MonkeyPatch, pause: float) -> Iterator[None]:
    """The exporter accepts each connection ``pause`` seconds late, as when its threads are busy."""
    accept = httpd.HttpServer.accept

    def slow(self: httpd.HttpServer) -> tuple[socket.socket, object]:
        time.sleep(pause)
        return accept(self)

    monkeypatch.setattr(httpd.HttpServer, "accept", slow)
    yield


def test_a_burst_of_scrapes_waits_in_the_kernel_queue_while_the_exporter_is_busy(
    registry: EngineRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 connections at once to an exporter that accepts none for now: all are queued by the kernel (with
    socketserver's backlog of 5, those past the 6th were dropped, and their clients tried again 1 s later)."""
    busy = threading.Event()
    accept = httpd.HttpServer.accept

    def held(self: httpd.HttpServer) -> tuple[socket.socket, object]:
        busy.wait(10)
        return accept(self)

    monkeypatch.setattr(httpd.HttpServer, "accept", held)
    exporter = Exporter(
        config=ExporterConfig(listen="127.0.0.1:0", targets=[target("http://127.0.0.1:9/metrics")]),
        registry=registry,
        vocabulary=V.Vocabulary(),
    )
    _, port = exporter.start()
    socks: list[socket.socket] = []
    try:
        started = time.monotonic()
        for _ in range(32):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))  # a dropped SYN: 1 s
        took = time.monotonic() - started
    finally:
        busy.set()
        for s in socks:
            s.close()
        exporter.stop(grace=1)
    assert len(socks) == 32 and took < 0.5


def scrape_together(port: int, n: int) -> list[bytes]:
    """``n`` scrapes sent at the same moment (connections opened, then one request written on each)."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(n)]
    for s in socks:
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    answers = []
    for s in socks:
        with s:
            chunks = []
            while chunk := s.recv(1 << 16):
                chunks.append(chunk)
            answers.append(b"".join(chunks))
    return answers


def test_scrapes_read_late_by_a_busy_exporter_share_the_flight_they_arrived_during(
    registry: EngineRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 scrapes sent at once to an exporter that reads each 0.1 s after the last (1.6 s for all) of an
    engine that answers in 0.3 s: one engine request. Before, connections past the 5th were dropped and
    retried a second later, and those read after the flight ended each started another (5-9 requests)."""
    with fake.FakeEngine({"/metrics": slow_page(PAGE, 0.3)}) as engine, late_reader(monkeypatch, 0.1):
        exporter = Exporter(
            config=ExporterConfig(listen="127.0.0.1:0", targets=[target(engine.url + "/metrics")]),
            registry=registry,
            vocabulary=V.Vocabulary(),
        )
        _, port = exporter.start()
        try:
            started = time.monotonic()
            answers = scrape_together(port, 16)
            took = time.monotonic() - started
        finally:
            exporter.stop(grace=1)
    print(f"16 scrapes read over {took:.2f} s: {engine.hits['/metrics']} engine request(s)")
    assert took >= 1.5  # they were read late indeed
    assert len(answers) == 16
    for raw in answers:
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head[:80]
        assert value(body.decode(), V.EXPORTER_UP.name, target="e") == 1.0
    assert engine.hits["/metrics"] == 1
