"""Serve captured engine payloads over HTTP, as a stand-in engine for tests.

``ReplayServer`` binds 127.0.0.1 on an ephemeral port and answers fixed paths with fixed bodies
(for example a real vLLM ``/metrics`` capture). It is not a simulator: the bodies never change.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from inferwatch.exporters.engines import EngineRegistry
from tests.support.fixtures import load_fixture_meta

TEXT = "text/plain; version=0.0.4; charset=utf-8"
JSON = "application/json"


@dataclass
class ReplayServer:
    """``routes`` maps a path to ``(content_type, body)``; everything else is 404. :attr:`hits` counts
    the requests per path (exactly, under a lock). ``keep_alive``: HTTP/1.1 with connections kept and
    ``TCP_NODELAY``, as uvicorn and Go serve (else HTTP/1.0, a connection per request); ``backlog``: the
    listen queue (a real engine's is deep; socketserver's default is 5)."""

    routes: Mapping[str, tuple[str, bytes]]
    host: str = "127.0.0.1"
    port: int = 0
    url: str = ""
    keep_alive: bool = False
    backlog: int = 5
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    hits: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, path: str, hit: int) -> tuple[str, bytes] | None:
        """What the ``hit``-th request for ``path`` gets (``None``: 404); subclasses may vary it."""
        return self.routes.get(path)

    def count(self, paths: list[str]) -> list[int]:
        """The requests for each of ``paths`` so far, read at one moment."""
        with self._lock:
            return [self.hits.get(p, 0) for p in paths]

    def start(self) -> str:
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if replay.keep_alive else "HTTP/1.0"
            disable_nagle_algorithm = replay.keep_alive
            timeout = 30  # an idle kept connection is dropped after this many seconds

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                with replay._lock:
                    hit = replay.hits[path] = replay.hits.get(path, 0) + 1
                found = replay.answer(path, hit)
                ctype, body = found if found is not None else ("text/plain", b"not found\n")
                self.send_response(200 if found is not None else 404)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        class Server(ThreadingHTTPServer):
            request_queue_size = replay.backlog
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                if isinstance(sys.exc_info()[1], ConnectionError):
                    return  # a client that went away (a scraper stopped at the end of a run): not news
                super().handle_error(request, client_address)

        self._server = Server((self.host, self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="replay", daemon=True)
        self._thread.start()
        self.url = f"http://{self.host}:{self._server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)


def fixture_routes(directory: Path, registry: EngineRegistry) -> dict[str, tuple[str, bytes]]:
    """Routes that replay an engine fixture directory (``fixture.yaml`` + payload files) at the
    paths the real engine uses: a text payload at the engine's metrics path, a JSON one (stats an
    engine serves beside its text metrics) at ``/metrics``, the info body at its info path."""
    meta = load_fixture_meta(directory)
    adapter = registry.get(str(meta["engine"]))
    payload = str(meta["payload"])
    routes: dict[str, tuple[str, bytes]] = {}
    if payload.endswith(".json"):
        routes["/metrics"] = (JSON, (directory / payload).read_bytes())
    else:
        routes[adapter.default_path] = (TEXT, (directory / payload).read_bytes())
    if meta.get("info") and adapter.info_path is not None:
        routes[adapter.info_path] = (JSON, (directory / str(meta["info"])).read_bytes())
    return routes
