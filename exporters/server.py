"""The exporter's HTTP server: ``/metrics`` scrapes every target on each request."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from inferwatch.core import vocabulary as V
from inferwatch.core.config import ConfigError, parse_listen
from inferwatch.exporters.config import ExporterConfig, target_errors
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.model import merge_snapshots
from inferwatch.exporters.render import CONTENT_TYPE, render
from inferwatch.exporters.runtime import TargetScraper

log = logging.getLogger("inferwatch.exporter")


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

    def __post_init__(self) -> None:
        errors = target_errors(self.config, self.registry)
        if errors:
            raise ConfigError("invalid exporter configuration: " + "; ".join(f"{loc}: {msg}" for loc, msg in errors))
        self.client = httpx.Client(transport=self.transport, follow_redirects=True)
        self.scrapers = [
            TargetScraper(target=t, registry=self.registry, vocabulary=self.vocabulary, client=self.client)
            for t in self.config.targets
        ]
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(16, len(self.scrapers))))

    def metrics(self) -> str:
        """Scrape every target (concurrently) and render the canonical exposition."""
        snaps = list(self._pool.map(lambda s: s.scrape(), self.scrapers))
        return render(merge_snapshots(snaps), self.vocabulary)

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
                        body = exporter.metrics().encode()
                    except Exception:  # keep serving whatever one scrape did
                        log.exception("rendering /metrics failed")
                        self.send_error(500, "internal error rendering metrics")
                        return
                    self._send(200, CONTENT_TYPE, body)
                elif path in ("/-/healthy", "/-/ready"):
                    self._send(200, "text/plain; charset=utf-8", b"OK\n")
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

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
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

    def stop(self) -> None:
        """Stop serving and release sockets and threads."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._pool.shutdown(wait=True)
        self.client.close()
