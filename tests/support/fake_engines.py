"""Engines that misbehave, for the exporter's hardening tests: each binds 127.0.0.1 on a free port.

A :class:`FakeEngine` answers each path with a *behaviour*: a function that writes the whole answer
(status, headers, body) on the handler and may take its time. Behaviours here: a page served plainly
or compressed, a page dribbled a few bytes at a time, a gzip bomb streamed from a few compressed
blocks (bounded memory on both sides), a body cut short of its Content-Length, a redirect. Pages
with bad data (duplicate series, NaN, cut mid-line) are made from a real capture by the helpers at
the bottom. Every behaviour stops when the client goes away or the engine is stopped.
"""

from __future__ import annotations

import gzip
import re
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TEXT = "text/plain; version=0.0.4; charset=utf-8"

Behaviour = Callable[[BaseHTTPRequestHandler, threading.Event], None]
"""Writes one whole answer; the event is set when the engine stops (long answers must give up then)."""


def _headers(h: BaseHTTPRequestHandler, status: int, headers: Mapping[str, str]) -> None:
    h.send_response(status)
    for name, value in headers.items():
        h.send_header(name, value)
    h.end_headers()


def page(body: bytes, *, ctype: str = TEXT, encoding: str | None = None, status: int = 200) -> Behaviour:
    """``body`` at once, compressed with ``encoding`` (``gzip`` or ``deflate``) when given."""
    if encoding == "gzip":
        payload = gzip.compress(body)
    elif encoding == "deflate":
        payload = zlib.compress(body)
    else:
        payload = body

    def serve(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        headers = {"Content-Type": ctype, "Content-Length": str(len(payload))}
        if encoding:
            headers["Content-Encoding"] = encoding
        _headers(h, status, headers)
        h.wfile.write(payload)

    return serve


def close_delimited(body: bytes) -> Behaviour:
    """``body`` with no Content-Length, the end of the body being the end of the connection (HTTP/1.0
    style): whatever the engine wrote looks complete to HTTP, so a page cut mid-line arrives as is."""

    def serve(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        h.close_connection = True
        _headers(h, 200, {"Content-Type": TEXT, "Connection": "close"})
        h.wfile.write(body)

    return serve


def short_body(body: bytes, sent: int) -> Behaviour:
    """Announces ``len(body)`` bytes, sends the first ``sent`` of them and hangs up."""

    def serve(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        h.close_connection = True
        _headers(h, 200, {"Content-Type": TEXT, "Content-Length": str(len(body))})
        h.wfile.write(body[:sent])

    return serve


def dribble(body: bytes, interval: float, chunk: int = 1) -> Behaviour:
    """Headers at once, then ``chunk`` bytes of ``body`` every ``interval`` seconds (each read returns
    well within any read timeout; only a deadline on the whole scrape bounds it)."""

    def serve(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        _headers(h, 200, {"Content-Type": TEXT, "Content-Length": str(len(body))})
        for i in range(0, len(body), chunk):
            if stop.wait(interval):
                return
            h.wfile.write(body[i : i + chunk])
            h.wfile.flush()

    return serve


def redirect(location: str) -> Behaviour:
    def serve(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        _headers(h, 307, {"Location": location, "Content-Length": "0"})

    return serve


GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"


class GzipBomb:
    """A behaviour: a valid gzip stream of ``inflated`` bytes of ``line`` repeated (comment lines, so
    a valid page), announced as ``Content-Encoding: gzip``.

    One ``block`` of text is deflated once and ended by a full flush (which resets the compressor's
    history), so the same compressed bytes stand for every block: about 1 KiB per MiB. The engine
    streams them, computing the CRC as it goes; neither side holds more than one block of text."""

    def __init__(self, inflated: int, line: bytes = b"# " + b"x" * 1021 + b"\n", block: int = 1 << 20) -> None:
        assert inflated % block == 0 and block % len(line) == 0
        self.inflated = inflated
        self.blocks = inflated // block
        self.text = line * (block // len(line))
        z = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
        self.compressed = z.compress(self.text) + z.flush(zlib.Z_FULL_FLUSH)
        self.final = z.flush(zlib.Z_FINISH)  # an empty last block
        self.compressed_size = len(GZIP_HEADER) + len(self.compressed) * self.blocks + len(self.final) + 8

    def __call__(self, h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        h.close_connection = True
        _headers(h, 200, {"Content-Type": TEXT, "Content-Encoding": "gzip", "Connection": "close"})
        h.wfile.write(GZIP_HEADER)
        crc = 0
        for _ in range(self.blocks):
            if stop.is_set():
                return
            h.wfile.write(self.compressed)
            crc = zlib.crc32(self.text, crc)
        size = self.inflated & 0xFFFFFFFF
        h.wfile.write(self.final + crc.to_bytes(4, "little") + size.to_bytes(4, "little"))


@dataclass
class FakeEngine:
    """``routes`` maps a path to a behaviour (replace one at any time to change the engine's mood);
    other paths are 404. :attr:`hits` counts requests per path, :attr:`peak` the most answered at once."""

    routes: dict[str, Behaviour]
    url: str = ""
    hits: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    _busy: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def start(self) -> str:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                behaviour = engine.routes.get(path)
                with engine._lock:
                    engine.hits[path] = engine.hits.get(path, 0) + 1
                    engine._busy[path] = engine._busy.get(path, 0) + 1
                    engine.peak[path] = max(engine.peak.get(path, 0), engine._busy[path])
                try:
                    if behaviour is None:
                        self.send_error(404)
                    else:
                        behaviour(self, engine._stop)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the exporter gave up on us: that is the point
                finally:
                    with engine._lock:
                        engine._busy[path] -= 1

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-engine", daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def busy(self, path: str) -> int:
        with self._lock:
            return self._busy.get(path, 0)

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


# -- bad pages made from a real capture ------------------------------------------------------------
_SAMPLE = re.compile(r"^(?P<series>[^#\s][^ ]*(?:\{[^}]*\})?) (?P<value>\S+)(?P<rest>.*)$")


def sample_lines(text: str, name: str) -> list[str]:
    """The sample lines of ``text`` whose metric name is ``name``."""
    return [ln for ln in text.split("\n") if ln.startswith((name + "{", name + " "))]


def with_duplicate(text: str, name: str, value: str) -> str:
    """``text`` with the first series of ``name`` given a second time, with ``value``."""
    line = sample_lines(text, name)[0]
    m = _SAMPLE.match(line)
    assert m is not None, line
    return text + f"{m.group('series')} {value}\n"


def with_values(text: str, names: set[str], value: str) -> str:
    """``text`` with every sample of the ``names`` set to ``value`` (``NaN``, ``+Inf``...)."""
    out = []
    for ln in text.split("\n"):
        m = _SAMPLE.match(ln)
        if m is not None and m.group("series").split("{", 1)[0] in names:
            ln = f"{m.group('series')} {value}{m.group('rest')}"
        out.append(ln)
    return "\n".join(out)


def cut_mid_line(text: str, fraction: float) -> str:
    """``text`` cut at about ``fraction`` of its length, inside a sample line."""
    at = int(len(text) * fraction)
    while text[at - 1] == "\n" or text[at] == "\n":
        at += 1
    return text[:at]
