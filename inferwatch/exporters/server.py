"""The exporter's HTTP server: ``/metrics`` scrapes every target on each request.

Every target is scraped at once; a request for ``/metrics`` waits for each target at most until that
target's deadline (concurrent requests share each target's scrape in flight). :meth:`Exporter.stop`
stops listening, lets the requests being served finish for at most a grace period, then aborts
what is still asking an engine.
"""

from __future__ import annotations

import html
import logging
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx

from inferwatch.core import vocabulary as V
from inferwatch.core.config import ConfigError, parse_listen
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.fetching import ACCEPT_ENCODING, Watchdog
from inferwatch.exporters.httpd import TEXT, HttpServer, Response
from inferwatch.exporters.render import CONTENT_TYPE, RenderCache, render
from inferwatch.exporters.runtime import Done, TargetScraper
from inferwatch.exporters.samples import Snapshot, merge_snapshots
from inferwatch.exporters.targets import ExporterConfig, target_errors

log = logging.getLogger("inferwatch.exporter")

STOP_POLL_SECONDS = 0.01
"""how often :meth:`Exporter.stop` looks whether the scrapes being served have finished."""
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
        ms = int.from_bytes(info[_TCPI_LAST_DATA_RECV : _TCPI_LAST_DATA_RECV + 4], sys.byteorder)
    except (AttributeError, OSError):
        return time.monotonic()
    if len(info) < _TCPI_LAST_DATA_RECV + 4:  # a kernel whose tcp_info ends before the field
        return now
    return now - ms / 1000.0


@dataclass
class Exporter:
    """All targets of one exporter process and the threads that serve them."""

    config: ExporterConfig
    registry: EngineRegistry
    vocabulary: V.Vocabulary
    transport: httpx.BaseTransport | None = None
    scrapers: list[TargetScraper] = field(default_factory=list)
    _stopped: Done = field(default_factory=Done)
    """set by :meth:`stop`; the background polls wait on it (a :class:`Done`: a wait costs one lock
    acquisition, where an Event's builds a Condition waiter, once a scrape for an engine polled)."""
    _threads: list[threading.Thread] = field(default_factory=list)
    _server: HttpServer | None = None
    _active: int = 0
    _active_lock: threading.Lock = field(default_factory=threading.Lock)
    """guards :attr:`_active`, the scrapes being served (a plain lock: a Condition's methods are Python
    code every scrape ran twice; :meth:`stop` polls the count instead of waiting to be notified)."""

    def __post_init__(self) -> None:
        errors = target_errors(self.config, self.registry)
        if errors:
            raise ConfigError("invalid exporter configuration: " + "; ".join(f"{loc}: {msg}" for loc, msg in errors))
        # redirects are followed by the requests themselves, so that no redirect body is ever read
        self.client = httpx.Client(
            transport=self.transport, follow_redirects=False, headers={"Accept-Encoding": ACCEPT_ENCODING}
        )
        self.watchdog = Watchdog()
        self.render_cache = RenderCache()
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
        with self._active_lock:
            self._active += 1
        try:
            snaps = self._collect(arrived)
            # one target's snapshot is rendered as it is (rendering changes no snapshot)
            snap = snaps[0] if len(snaps) == 1 else merge_snapshots(snaps)
            return render(snap, self.vocabulary, cache=self.render_cache)
        finally:
            with self._active_lock:
                self._active -= 1

    def _collect(self, arrived: float) -> list[Snapshot]:
        """Every target's snapshot: the last target's new flight runs in this thread, first, the others
        in threads of their own meanwhile."""
        last = len(self.scrapers) - 1
        if last < 0:
            return []
        flights = [s.begin(arrived, here=i == last) for i, s in enumerate(self.scrapers)]
        snaps: list[Snapshot] = [Snapshot()] * len(flights)
        for i in (last, *range(last)):
            snaps[i] = self.scrapers[i].collect(flights[i])
        return snaps

    def readiness(self, arrived: float | None = None) -> tuple[bool, str]:
        """Scrape every target now (sharing any scrape in flight) and say whether all answered: the
        exporter is ready when its engines are reachable and serve metrics it can read."""
        arrived = time.monotonic() if arrived is None else arrived
        with self._serving():
            self._collect(arrived)
        lines = []
        for scraper in self.scrapers:
            why = scraper.state()
            lines.append(f"{scraper.target.label} ({scraper.engine_label}): {'ok' if why is None else why}")
        ready = all(s.state() is None for s in self.scrapers)
        return ready, "\n".join(lines) + "\n"

    @contextmanager
    def _serving(self) -> Iterator[None]:
        with self._active_lock:
            self._active += 1
        try:
            yield
        finally:
            with self._active_lock:
                self._active -= 1

    def _poll_loop(self, scraper: TargetScraper) -> None:
        """Poll ``scraper`` whenever its poll is due. A wake that finds the poll pushed back (a scrape did
        its work meanwhile: once a scrape when scrapes are about as frequent as polls) only sleeps again."""
        while (delay := scraper.poll_delay()) is not None:
            if delay > 0.0:
                if self._stopped.wait(delay):
                    return
            else:
                scraper.poll()

    def _handle(self, path: str, conn: socket.socket) -> Response:
        if path == "/metrics":
            return 200, CONTENT_TYPE, self.metrics(arrived_at(conn)).encode()
        if path in ("/healthz", "/-/healthy"):
            return 200, TEXT, b"OK\n"  # alive: this process answers (whatever its engines do)
        if path in ("/readyz", "/-/ready"):
            ready, report = self.readiness(arrived_at(conn))  # ready: every target answered just now
            return 200 if ready else 503, TEXT, report.encode()
        if path == "/":
            targets = "".join(f"<li>{html.escape(s.target.label)} ({s.engine_label})</li>" for s in self.scrapers)
            page = (
                "<html><head><title>inferwatch exporter</title></head>"
                "<body><h1>inferwatch exporter</h1>"
                f'<p><a href="/metrics">/metrics</a></p><ul>{targets}</ul></body></html>'
            )
            return 200, "text/html; charset=utf-8", page.encode()
        return 404, TEXT, b"404 not found; try /metrics\n"

    def start(self) -> tuple[str, int]:
        """Bind the listen address and serve in background threads; returns the bound address."""
        host, port = parse_listen(self.config.listen)
        self._server = HttpServer(host, port, self._handle, server_name="inferwatch-exporter")
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
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        until = time.monotonic() + grace
        while self._active and (left := until - time.monotonic()) > 0:
            time.sleep(min(left, STOP_POLL_SECONDS))
        drained = self._active == 0
        self.watchdog.abort_all()
        for scraper in self.scrapers:
            scraper.connections.close()
        for t in self._threads:
            t.join(timeout=max(0.1, until - time.monotonic()))
        self.watchdog.stop()
        self.client.close()
        return drained
