"""Serve captured engine payloads over HTTP, as a stand-in engine for demos and tests.

``ReplayServer`` binds 127.0.0.1 on an ephemeral port and answers fixed paths with fixed bodies
(for example a real vLLM ``/metrics`` capture). It is not a simulator: the bodies never change.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

TEXT = "text/plain; version=0.0.4; charset=utf-8"
JSON = "application/json"


@dataclass
class ReplayServer:
    """``routes`` maps a path to ``(content_type, body)``; everything else is 404."""

    routes: Mapping[str, tuple[str, bytes]]
    host: str = "127.0.0.1"
    port: int = 0
    url: str = ""
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    hits: dict[str, int] = field(default_factory=dict)

    def start(self) -> str:
        routes = self.routes
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                hits[path] = hits.get(path, 0) + 1
                if path not in routes:
                    self.send_error(404)
                    return
                ctype, body = routes[path]
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
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


def fixture_routes(directory: Path) -> tuple[str, dict[str, tuple[str, bytes]]]:
    """Routes that replay an engine fixture directory (``fixture.yaml`` + payload files).

    Returns the engine name and the routes at the paths the real engine uses.
    """
    meta = yaml.safe_load((directory / "fixture.yaml").read_text())
    engine = str(meta["engine"])
    payload = (directory / str(meta["payload"])).read_bytes()
    routes: dict[str, tuple[str, bytes]] = {}
    if engine == "trtllm" and str(meta["payload"]).endswith(".json"):
        routes["/metrics"] = (JSON, payload)
    elif engine == "trtllm":
        routes["/prometheus/metrics"] = (TEXT, payload)
    else:
        routes["/metrics"] = (TEXT, payload)
    if meta.get("info"):
        info_path = {"tgi": "/info", "triton": "/v2"}.get(engine, "/version")
        routes[info_path] = (JSON, (directory / str(meta["info"])).read_bytes())
    return engine, routes
