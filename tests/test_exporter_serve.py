"""The exporter against live HTTP engines: a replayed real vLLM capture, then the engine going away,
turning slow or returning garbage. Everything binds 127.0.0.1 and is stopped by the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from inferwatch.core import vocabulary as V
from inferwatch.core.config import ConfigError
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.engines import trtllm as trtllm_engine
from inferwatch.exporters.mapping import EngineSession
from inferwatch.exporters.server import Exporter
from inferwatch.exporters.targets import ExporterConfig, TargetConfig
from tests.conftest import ENGINE_FIXTURES, ROOT, free_port
from tests.helpers import has, value
from tests.support.replay import TEXT, ReplayServer, fixture_routes

REAL = ENGINE_FIXTURES / "vllm" / "0.32.0-cpu"


@pytest.fixture
def vllm_engine(registry: EngineRegistry) -> Iterator[ReplayServer]:
    server = ReplayServer(fixture_routes(REAL, registry))
    server.start()
    yield server
    server.stop()


def make_exporter(registry: EngineRegistry, *targets: TargetConfig) -> Exporter:
    return Exporter(
        config=ExporterConfig(listen="127.0.0.1:0", targets=list(targets)),
        registry=registry,
        vocabulary=V.Vocabulary(),
    )


def scrape(addr: tuple[str, int]) -> str:
    r = httpx.get(f"http://{addr[0]}:{addr[1]}/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return r.text


def test_serves_canonical_then_flips_up_when_engine_stops(registry: EngineRegistry, vllm_engine: ReplayServer) -> None:
    exporter = make_exporter(registry, TargetConfig(url=vllm_engine.url, name="vllm-0"))
    addr = exporter.start()
    try:
        text = scrape(addr)
        assert value(text, V.EXPORTER_UP.name, target="vllm-0", engine=V.ENGINE_VLLM) == 1.0
        assert not has(text, V.EXPORTER_LAST_SCRAPE_ERROR.name), "an error reason is served only while down"
        assert value(text, V.REQUESTS_WAITING.name, model="tiny-llama") == 11.0
        assert has(text, V.TIME_TO_FIRST_TOKEN.name + "_bucket")
        vllm_engine.stop()
        text = scrape(addr)
        assert value(text, V.EXPORTER_UP.name, target="vllm-0") == 0.0
        assert value(text, V.EXPORTER_LAST_SCRAPE_ERROR.name, reason=V.SCRAPE_ERROR_UNREACHABLE) == 1.0
        assert not has(text, V.REQUESTS_WAITING.name), "stale canonical series served after the engine stopped"
        assert not has(text, V.TIME_TO_FIRST_TOKEN.name + "_count")
        # the exporter itself keeps serving
        assert httpx.get(f"http://{addr[0]}:{addr[1]}/-/healthy", timeout=5).status_code == 200
    finally:
        exporter.stop()


def test_healthz_is_the_process_readyz_the_engines(registry: EngineRegistry, vllm_engine: ReplayServer) -> None:
    """/healthz: the exporter answers (a liveness probe must not restart it for an engine's outage);
    /readyz: every target answers a scrape now, with each target's state in the body."""
    down = f"http://127.0.0.1:{free_port()}"
    exporter = make_exporter(
        registry,
        TargetConfig(url=vllm_engine.url, name="vllm-0", labels={"replica": "a"}),
        TargetConfig(url=down, name="vllm-1", labels={"replica": "b"}),
    )
    addr = exporter.start()
    base = f"http://{addr[0]}:{addr[1]}"
    try:
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        r = httpx.get(f"{base}/readyz", timeout=10)
        assert r.status_code == 503
        assert "vllm-0 (vllm): ok" in r.text and f"vllm-1 ({V.UNKNOWN}): {V.SCRAPE_ERROR_UNREACHABLE}" in r.text, r.text
        ready = make_exporter(registry, TargetConfig(url=vllm_engine.url, name="vllm-0"))
        one = ready.start()
        try:
            r = httpx.get(f"http://{one[0]}:{one[1]}/readyz", timeout=10)
            assert r.status_code == 200 and r.text == "vllm-0 (vllm): ok\n"
            vllm_engine.stop()
            assert httpx.get(f"http://{one[0]}:{one[1]}/readyz", timeout=10).status_code == 503
            assert httpx.get(f"http://{one[0]}:{one[1]}/healthz", timeout=5).status_code == 200
        finally:
            ready.stop()
    finally:
        exporter.stop()


class _Handler(BaseHTTPRequestHandler):
    mode = "garbage"

    def do_GET(self) -> None:
        if self.mode == "slow":
            time.sleep(1.5)
        body = b"<html><body>Bad Gateway</body></html>" if self.mode == "garbage" else b"# never sent\n"
        try:
            self.send_response(200)
            self.send_header("Content-Type", TEXT)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.mark.parametrize("mode", ["garbage", "slow"])
def test_garbage_and_timeouts_are_down_not_fatal(
    mode: str, registry: EngineRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    handler = type("H", (_Handler,), {"mode": mode})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    exporter = make_exporter(registry, TargetConfig(url=url, engine=V.ENGINE_VLLM, name="bad", timeout_seconds=0.3))
    addr = exporter.start()
    try:
        with caplog.at_level("WARNING", logger="inferwatch.exporter"):
            for _ in range(3):
                text = scrape(addr)
                assert value(text, V.EXPORTER_UP.name, target="bad") == 0.0
                assert not has(text, V.PROMPT_TOKENS.name)
                reason = V.SCRAPE_ERROR_TIMEOUT if mode == "slow" else V.SCRAPE_ERROR_INVALID
                assert value(text, V.EXPORTER_LAST_SCRAPE_ERROR.name, target="bad", reason=reason) == 1.0
        failures = [r for r in caplog.records if "scrape failed" in r.getMessage()]
        assert len(failures) == 1, "an error must be logged once per state change, not per scrape"
        assert ("timed out" if mode == "slow" else "did not return Prometheus text") in failures[0].getMessage()
    finally:
        exporter.stop()
        server.shutdown()
        server.server_close()


def test_recovers_and_logs_once(registry: EngineRegistry, caplog: pytest.LogCaptureFixture) -> None:
    routes = fixture_routes(REAL, registry)
    engine = ReplayServer(routes)
    url = engine.start()
    port = int(url.rsplit(":", 1)[1])
    exporter = make_exporter(registry, TargetConfig(url=url, name="v"))
    addr = exporter.start()
    again = ReplayServer(routes, port=port)
    try:
        assert value(scrape(addr), V.EXPORTER_UP.name) == 1.0
        engine.stop()
        assert value(scrape(addr), V.EXPORTER_UP.name) == 0.0
        again.start()  # the engine comes back on the same port
        with caplog.at_level("WARNING", logger="inferwatch.exporter"):
            assert value(scrape(addr), V.EXPORTER_UP.name) == 1.0
        assert any("recovered" in r.getMessage() for r in caplog.records)
    finally:
        again.stop()
        exporter.stop()


def test_cli_serve_process(tmp_path: Path, registry: EngineRegistry) -> None:
    """`inferwatch exporter serve` as users run it: a real process, SIGTERM to stop."""
    engine = ReplayServer(fixture_routes(REAL, registry))
    url = engine.start()
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferwatch",
            "exporter",
            "serve",
            "--target",
            url,
            "--listen",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                text = scrape(("127.0.0.1", port))
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(
                        f"exporter did not come up: {proc.stderr.read() if proc.stderr else ''}"
                    ) from None
                time.sleep(0.2)
        assert value(text, V.EXPORTER_UP.name) == 1.0
        assert value(text, V.KV_CACHE_CAPACITY.name) == 1536.0
        engine.stop()
        assert value(scrape(("127.0.0.1", port)), V.EXPORTER_UP.name) == 0.0
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
        engine.stop()
    assert proc.returncode == 0, err
    assert "scrape failed" in err


def test_tgi_empty_body_detected_through_info(registry: EngineRegistry) -> None:
    """A fresh TGI serves an empty /metrics: the exporter asks /info, then serves the model's info."""
    engine = ReplayServer(fixture_routes(ENGINE_FIXTURES / "tgi" / "3.3.7-fresh", registry))
    url = engine.start()
    # an auto target may carry options of any engine: the detected engine takes its own
    options = {"max_batch_total_tokens": 16384, "json_poll_interval_seconds": 2}
    exporter = make_exporter(registry, TargetConfig(url=url, name="tgi-0", options=options))
    addr = exporter.start()
    try:
        text = scrape(addr)
        assert value(text, V.EXPORTER_UP.name, engine=V.ENGINE_TGI) == 1.0
        assert value(text, V.ENGINE_INFO.name, model="meta-llama/Llama-3.1-8B-Instruct") == 1.0
        assert value(text, V.KV_CACHE_CAPACITY.name) == 16384
        assert not has(text, V.REQUESTS.name)
        assert exporter.scrapers[0].poll_interval() is None, "TGI needs no background polls"
    finally:
        exporter.stop()
        engine.stop()


def test_a_translation_bug_is_contained(
    registry: EngineRegistry, vllm_engine: ReplayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception in one target's translation marks it down; the exporter keeps serving."""

    def boom(*args: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(EngineSession, "translate", boom)
    exporter = make_exporter(registry, TargetConfig(url=vllm_engine.url, name="v"))
    try:
        text = exporter.metrics()
    finally:
        exporter.stop()
    assert value(text, V.EXPORTER_UP.name, target="v") == 0.0


def test_trtllm_json_is_drained_between_scrapes(registry: EngineRegistry) -> None:
    """The JSON stats are a destructive read with a bounded buffer: the exporter polls it on its own."""
    stats = ENGINE_FIXTURES / "trtllm" / "json-iteration-stats" / "metrics.json"
    json_path = trtllm_engine.JSON_PATH
    engine = ReplayServer({json_path: ("application/json", stats.read_bytes())})
    url = engine.start()
    target = TargetConfig(url=url, engine=V.ENGINE_TRTLLM, options={"json_poll_interval_seconds": 0.05})
    exporter = make_exporter(registry, target)
    exporter.start()
    try:
        deadline = time.monotonic() + 10
        while engine.hits.get(json_path, 0) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.hits.get(json_path, 0) >= 3, "no background polls of the JSON stats"
        session = exporter.scrapers[0].session
        assert isinstance(session, trtllm_engine.TrtllmSession)
        assert session.stats.iterations == 6
    finally:
        exporter.stop()
        engine.stop()


def test_polls_follow_the_detected_engine(registry: EngineRegistry, vllm_engine: ReplayServer) -> None:
    """An auto target is polled only until its engine turns out to need no background polls."""
    exporter = make_exporter(registry, TargetConfig(url=vllm_engine.url, name="v"))
    try:
        (scraper,) = exporter.scrapers
        assert scraper.session is None and scraper.poll_interval() is not None
        exporter.metrics()
        assert scraper.adapter is registry.get(V.ENGINE_VLLM) and scraper.poll_interval() is None
    finally:
        exporter.stop()


def test_bad_engine_options_are_refused_up_front(registry: EngineRegistry) -> None:
    target = TargetConfig(url="http://127.0.0.1:1", engine=V.ENGINE_TGI, options={"max_batch_total_tokens": 0})
    with pytest.raises(ConfigError, match=r"targets\.0\.options\.max_batch_total_tokens"):
        make_exporter(registry, target)


def test_a_replayed_engine_takes_a_client_reset_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    """A scraper stopped mid keep-alive resets its connection: the replay server says nothing of it (the
    benchmarks stop many scrapers at the end of a run); other errors are still printed."""
    import socket
    import struct

    server = ReplayServer({"/metrics": (TEXT, b"a_gauge 1\n")}, keep_alive=True)
    server.start()
    try:
        conn = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=5)
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conn.recv(4096).startswith(b"HTTP/1.1 200")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # with linger 0: a reset
        time.sleep(0.3)
    finally:
        server.stop()
    assert "Traceback" not in capsys.readouterr().err
