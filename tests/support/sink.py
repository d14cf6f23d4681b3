"""A receiver for tests: an HTTP server on 127.0.0.1 that records what it is sent and answers as told."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.httpserver import serving


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    at: float


@dataclass
class Sink:
    """``fail_next`` answers that many requests with ``fail_status`` (and ``Retry-After``) first."""

    url: str = ""
    received: list[Received] = field(default_factory=list)
    fail_next: int = 0
    fail_status: int = 503
    retry_after: str | None = "1"
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self, path: str | None = None) -> list[Any]:
        with self.lock:
            return [r.body for r in self.received if path is None or r.path == path]

    def wait_for(self, count: int, path: str | None = None, timeout: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.bodies(path)
            if len(got) >= count:
                return got
            time.sleep(0.05)
        raise AssertionError(f"the sink got {len(self.bodies(path))} requests on {path or 'any path'}, not {count}")


@contextmanager
def running_sink() -> Iterator[Sink]:
    sink = Sink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            with sink.lock:
                if sink.fail_next > 0:
                    sink.fail_next -= 1
                    sink.failed += 1
                    self.send_response(sink.fail_status)
                    if sink.retry_after is not None:
                        self.send_header("Retry-After", sink.retry_after)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                sink.received.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time())
                )
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Handler) as address:
        sink.url = f"http://{address}"
        yield sink
