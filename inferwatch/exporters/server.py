"""The exporter's HTTP server: ``/metrics`` scrapes every target on each request.

Every target is scraped at once; a request for ``/metrics`` waits for each target at most until that
target's deadline (concurrent requests share each target's scrape in flight). :meth:`Exporter.stop`
stops listening, lets the requests being served finish for at most a grace period, then aborts
what is still asking an engine.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from inferwatch.core import vocabulary as V
from inferwatch.core.config import ConfigError, parse_listen
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.fetching import ACCEPT_ENCODING, Watchdog
from inferwatch.exporters.render import CONTENT_TYPE, render
from inferwatch.exporters.runtime import TargetScraper
from inferwatch.exporters.samples import merge_snapshots
from inferwatch.exporters.targets import ExporterConfig, target_errors

log = logging.getLogger("inferwatch.exporter")

LISTEN_BACKLOG = 128
"""connections the kernel queues until the exporter accepts them. socketserver's default (5) dropped
the connections of concurrent scrapes past the 5th while the exporter was busy (``ListenOverflows``):
their clients tried again a second later, and each late one started a second scrape of every target
(measured: 1.5-2.6 engine requests per engine for 32 concurrent scrapes of 100 engines)."""


class _Server(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True


_TCPI_LAST_DATA_RECV = 52
"""offset of ``tcpi_last_data_recv`` (u32, ms since data last arrived) in Linux's ``struct tcp_info``."""


def arrived_at(conn: socket.socket) -> float:
    """When a request's last bytes reached this machine, on the monotonic clock: now, less the kernel's
    ``TCP_INFO.tcpi_last_data_recv`` (Linux; elsewhere, and on any error, now). A busy exporter may read
    a request long after it came (32 scrapes sent within 0.1 s were read over 3 s); scrapes coalesce by
    when they came (:meth:`inferwatch.exporters.runtime.TargetScraper.begin`), not by when they are read."""
    try:
        info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        now = time.monotonic()
        ms: int = struct.unpack_from("=I", info, _TCPI_LAST_DATA_RECV)[0]
    except (AttributeError, OSError, struct.error):
        return time.monotonic()
    return now - ms / 1000.0


@dataclass
class Exporter:
    """All targets of one exporter process and the threads that serve them."""

    config: ExporterConfig
    registry: EngineRegistry
    vocabulary: V.Vocabulary
    transport: httpx.BaseTransport | None = None
    scrapers: list[TargetScraper] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _active: int = 0
    _idle: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        errors = target_errors(self.config, self.registry)
        if errors:
            raise ConfigError("invalid exporter configuration: " + "; ".join(f"{loc}: {msg}" for loc, msg in errors))
        # redirects are followed by the requests themselves, so that no redirect body is ever read
        self.client = httpx.Client(
            transport=self.transport, follow_redirects=False, headers={"Accept-Encoding": ACCEPT_ENCODING}
        )
        self.watchdog = Watchdog()
        self.scrapers = [
            TargetScraper(
                target=t, registry=self.registry, vocabulary=self.vocabulary, client=self.client, watchdog=self.watchdog
            )
            for t in self.config.targets
        ]

    def metrics(self, arrived: float | None = None) -> str:
        """Scrape every target (concurrently) and render the canonical exposition; ``arrived``: when the
        request came (default now), which decides whether it shares each target's last scrape."""
        arrived = time.monotonic() if arrived is None else arrived
        with self._serving():
            flights = [s.begin(arrived) for s in self.scrapers]
            snaps = [s.collect(f) for s, f in zip(self.scrapers, flights, strict=True)]
            return render(merge_snapshots(snaps), self.vocabulary)

    def readiness(self, arrived: float | None = None) -> tuple[bool, str]:
        """Scrape every target now (sharing any scrape in flight) and say whether all answered: the
        exporter is ready when its engines are reachable and serve metrics it can read."""
        arrived = time.monotonic() if arrived is None else arrived
        with self._serving():
            flights = [s.begin(arrived) for s in self.scrapers]
            for scraper, flight in zip(self.scrapers, flights, strict=True):
                scraper.collect(flight)
        lines = []
        for scraper in self.scrapers:
            why = scraper.state()
            lines.append(f"{scraper.target.label} ({scraper.engine_label}): {'ok' if why is None else why}")
        ready = all(s.state() is None for s in self.scrapers)
        return ready, "\n".join(lines) + "\n"

    @contextmanager
    def _serving(self) -> Iterator[None]:
        with self._idle:
            self._active += 1
        try:
            yield
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def _poll_loop(self, scraper: TargetScraper) -> None:
        while (interval := scraper.poll_interval()) is not None and not self._stop.wait(interval):
            scraper.poll()

    def start(self) -> tuple[str, int]:
        """Bind the listen address and serve in background threads; returns the bound address."""
        host, port = parse_listen(self.config.listen)
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "inferwatch-exporter"

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    try:
                        body = exporter.metrics(arrived_at(self.connection)).encode()
                    except Exception:  # keep serving whatever one scrape did
                        log.exception("rendering /metrics failed")
                        self.send_error(500, "internal error rendering metrics")
                        return
                    self._send(200, CONTENT_TYPE, body)
                elif path in ("/healthz", "/-/healthy"):
                    # alive: this process answers (whatever its engines do)
                    self._send(200, "text/plain; charset=utf-8", b"OK\n")
                elif path in ("/readyz", "/-/ready"):
                    # ready: every target answered a scrape just now
                    ready, report = exporter.readiness(arrived_at(self.connection))
                    self._send(200 if ready else 503, "text/plain; charset=utf-8", report.encode())
                elif path == "/":
                    targets = "".join(f"<li>{s.target.label} ({s.engine_label})</li>" for s in exporter.scrapers)
                    page = (
                        "<html><head><title>inferwatch exporter</title></head>"
                        "<body><h1>inferwatch exporter</h1>"
                        f'<p><a href="/metrics">/metrics</a></p><ul>{targets}</ul></body></html>'
                    )
                    self._send(200, "text/html; charset=utf-8", page.encode())
                else:
                    self.send_error(404, "not found; try /metrics")

            def _send(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s " + format, self.address_string(), *args)

        self._server = _Server((host, port), Handler)
        bound = self._server.server_address
        t = threading.Thread(target=self._server.serve_forever, name="exporter-http", daemon=True)
        t.start()
        self._threads.append(t)
        for scraper in self.scrapers:
            if scraper.poll_interval() is not None:
                p = threading.Thread(target=self._poll_loop, args=(scraper,), name="target-poll", daemon=True)
                p.start()
                self._threads.append(p)
        return str(bound[0]), int(bound[1])

    def stop(self, grace: float = 5.0) -> bool:
        """Stop listening, wait at most ``grace`` seconds for the scrapes being served, then abort
        every engine request still in flight and release the sockets. Returns whether the scrapes
        being served all finished within the grace period. Never blocks much longer than ``grace``."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        until = time.monotonic() + grace
        with self._idle:
            while self._active and (left := until - time.monotonic()) > 0:
                self._idle.wait(left)
            drained = self._active == 0
        self.watchdog.abort_all()
        for t in self._threads:
            t.join(timeout=max(0.1, until - time.monotonic()))
        self.watchdog.stop()
        self.client.close()
        return drained
