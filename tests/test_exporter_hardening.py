"""A bounded exporter: engines that dribble, bomb, repeat series, send NaN or cut their page.

Each test stands for a defect measured on the exporter before it was bounded: a dribbling engine
held a scrape for as long as it liked (> 90 s with a 5 s timeout), scrapes of one target queued
behind a stuck one, a gzip bomb took the RSS to gigabytes, duplicate series were summed, NaN
counters and truncated pages were served with up 1, and SIGTERM did not end the process. Fake
engines bind 127.0.0.1 (tests/support/fake_engines.py); every process and server is stopped here.
Time bounds are generous (the machine is shared): a deadline of 1.5 s must not become 4 s.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.server import Exporter
from inferwatch.exporters.targets import ExporterConfig, TargetConfig
from tests.conftest import ENGINE_FIXTURES, ROOT, free_port
from tests.helpers import samples, value
from tests.support import fake_engines as fake

CAPTURE = ENGINE_FIXTURES / "vllm" / "0.32.0-cpu" / "metrics-final.txt"
TRTLLM = ENGINE_FIXTURES / "trtllm"
TIMEOUT = 1.5
"""the scrape deadline of most tests here."""
SLACK = 1.5
"""what a scrape may take beyond its deadline on a busy 2-core machine (it takes ~0.1 s when idle)."""


@pytest.fixture(scope="module")
def real_page() -> str:
    return CAPTURE.read_text()


def source_of(registry: EngineRegistry, spec: V.MetricSpec) -> str:
    """The vLLM sample name that feeds ``spec`` (spelled by the engine module, not here)."""
    adapter = registry.get(V.ENGINE_VLLM)
    return next(r.sources[0] for r in adapter.rows if r.metric is spec)


def make_exporter(registry: EngineRegistry, url: str, **target: object) -> Exporter:
    """An exporter of one target named ``e`` (a vLLM one unless ``engine`` says otherwise)."""
    fields = {"url": url, "engine": V.ENGINE_VLLM, "name": "e", "timeout_seconds": TIMEOUT, **target}
    cfg = TargetConfig.model_validate(fields)
    return Exporter(
        config=ExporterConfig(listen="127.0.0.1:0", targets=[cfg]), registry=registry, vocabulary=V.Vocabulary()
    )


@contextmanager
def serving(exporter: Exporter) -> Iterator[str]:
    host, port = exporter.start()
    try:
        yield f"http://{host}:{port}/metrics"
    finally:
        exporter.stop(grace=1)


def timed_get(url: str, timeout: float = 30) -> tuple[str, float]:
    start = time.monotonic()
    r = httpx.get(url, timeout=timeout)
    assert r.status_code == 200
    return r.text, time.monotonic() - start


def reasons(text: str) -> list[str]:
    return [lb[V.LABEL_REASON] for n, lb, _ in samples(text) if n == V.EXPORTER_LAST_SCRAPE_ERROR.name]


def assert_down(text: str, reason: str) -> None:
    assert value(text, V.EXPORTER_UP.name, target="e") == 0.0
    assert reasons(text) == [reason], text
    health = {s.name for s in V.HEALTH_METRICS}
    engine_series = [n for n, _, _ in samples(text) if n not in health]
    assert not engine_series, f"canonical series served from a refused page: {sorted(set(engine_series))[:5]}"


def assert_up(text: str) -> None:
    assert value(text, V.EXPORTER_UP.name, target="e") == 1.0
    assert reasons(text) == []


# -- the deadline of a whole scrape -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("chunk", "interval"),
    [(1, 0.25), (64, 0.05)],
    ids=["one-byte-at-a-time", "page-dribbled-over-40s"],
)
def test_a_dribbling_engine_costs_a_scrape_its_deadline_not_more(
    registry: EngineRegistry, real_page: str, chunk: int, interval: float
) -> None:
    """Each read returns well within the timeout; before, the timeout bounded each read, so a
    dribbled page held the scrape until its last byte (and came back up 1)."""
    with fake.FakeEngine({"/metrics": fake.dribble(real_page.encode(), interval, chunk)}) as engine:
        exporter = make_exporter(registry, engine.url + "/metrics")
        with serving(exporter) as url:
            text, took = timed_get(url)
    print(f"dribbled page ({chunk} B every {interval}s), {TIMEOUT}s deadline: scrape answered in {took:.2f}s")
    assert_down(text, V.SCRAPE_ERROR_TIMEOUT)
    assert TIMEOUT * 0.9 <= took <= TIMEOUT + SLACK, f"scrape took {took:.2f}s with a {TIMEOUT}s deadline"
    assert value(text, V.EXPORTER_SCRAPE_DURATION.name, target="e") <= TIMEOUT + SLACK


def test_concurrent_scrapes_of_a_stuck_target_share_its_request_and_do_not_queue(
    registry: EngineRegistry, real_page: str
) -> None:
    stuck = fake.dribble(real_page.encode(), 0.25)
    with fake.FakeEngine({"/metrics": stuck}) as engine:
        exporter = make_exporter(registry, engine.url + "/metrics")
        with serving(exporter) as url:
            results: list[tuple[str, float]] = []
            threads = [threading.Thread(target=lambda: results.append(timed_get(url))) for _ in range(4)]
            start = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            wall = time.monotonic() - start
            slowest = max(took for _, took in results)
            print(f"4 concurrent scrapes of a stuck engine: {wall:.2f}s in all, slowest {slowest:.2f}s")
            assert len(results) == 4
            for text, took in results:
                assert_down(text, V.SCRAPE_ERROR_TIMEOUT)
                assert took <= TIMEOUT + SLACK, f"a scrape queued: {took:.2f}s"
            assert wall <= TIMEOUT + SLACK, f"4 concurrent scrapes took {wall:.2f}s: they queued"
            assert engine.hits["/metrics"] == 1, "concurrent scrapes must share one engine request"
            assert engine.peak["/metrics"] == 1

            # The engine recovers while a scrape is stuck on it: a scrape that arrives meanwhile
            # waits for the stuck one at most until its deadline; the next one is up at once.
            box: list[tuple[str, float]] = []
            first = threading.Thread(target=lambda: box.append(timed_get(url)))
            first.start()
            assert fake.wait_until(lambda: engine.hits["/metrics"] == 2)  # the new request is being dribbled
            engine.routes["/metrics"] = fake.page(real_page.encode())
            text, during = timed_get(url)
            assert during <= TIMEOUT + SLACK
            assert engine.hits["/metrics"] == 2, "a scrape during a stuck one shares it"
            first.join(timeout=60)
            assert box and box[0][1] <= TIMEOUT + SLACK
            text, took = timed_get(url)
            print(f"engine recovered: the scrape sharing the stuck one {during:.2f}s, the next one {took:.2f}s (up)")
            assert_up(text)
            assert took < TIMEOUT, f"the scrape after recovery took {took:.2f}s"


def test_the_info_request_shares_the_deadline(registry: EngineRegistry, real_page: str) -> None:
    """The facts (the info endpoint) are extra: a stuck info endpoint costs at most half of what is
    left of the deadline, and the scrape stays up."""
    info_path = registry.get(V.ENGINE_VLLM).info_path
    assert info_path is not None
    routes = {"/metrics": fake.page(real_page.encode()), info_path: fake.dribble(b'{"version": "0.32.0"}' * 50, 0.2)}
    with fake.FakeEngine(routes) as engine:
        exporter = make_exporter(registry, engine.url + "/metrics", timeout_seconds=2.0)
        with serving(exporter) as url:
            text, took = timed_get(url)
            assert engine.hits.get(info_path) == 1
    assert_up(text)
    assert took <= 2.0 + SLACK


def test_json_stats_polled_by_a_session_share_the_deadline(registry: EngineRegistry) -> None:
    """A session that polls JSON during a scrape (and in the background) is bounded by the same
    deadline; stopping the exporter does not wait for a stuck background poll."""
    from inferwatch.exporters.engines import trtllm as trtllm_engine

    text_page = (TRTLLM / "gen-a" / "prometheus.txt").read_bytes()
    routes = {
        trtllm_engine.PROMETHEUS_PATH: fake.page(text_page),
        trtllm_engine.JSON_PATH: fake.dribble(b'[{"iter": 1}]' * 100, 0.2),
    }
    with fake.FakeEngine(routes) as engine:
        exporter = make_exporter(
            registry, engine.url, engine=V.ENGINE_TRTLLM, options={"json_poll_interval_seconds": 0.05}
        )
        exporter.start()
        try:
            start = time.monotonic()
            exporter.metrics()
            took = time.monotonic() - start
            assert took <= TIMEOUT + SLACK
            assert fake.wait_until(lambda: engine.busy(trtllm_engine.JSON_PATH) >= 1)
        finally:
            start = time.monotonic()
            exporter.stop(grace=0.5)
            stopped = time.monotonic() - start
    assert stopped <= 0.5 + SLACK, f"stop took {stopped:.2f}s with a background poll stuck"


# -- the body and sample limits ---------------------------------------------------------------------
@pytest.mark.parametrize("encoding", [None, "gzip", "deflate"])
def test_compressed_and_redirected_pages_are_read(
    registry: EngineRegistry, real_page: str, encoding: str | None
) -> None:
    routes = {"/metrics": fake.redirect("/metrics/"), "/metrics/": fake.page(real_page.encode(), encoding=encoding)}
    with fake.FakeEngine(routes) as engine:
        exporter = make_exporter(registry, engine.url + "/metrics")
        try:
            text = exporter.metrics()
        finally:
            exporter.stop(grace=1)
    assert_up(text)
    assert value(text, V.PROMPT_TOKENS.name) == 5610


def test_gzip_bomb_is_stopped_at_the_body_limit_in_process(registry: EngineRegistry) -> None:
    bomb = fake.GzipBomb(256 << 20)
    with fake.FakeEngine({"/metrics": bomb}) as engine:
        exporter = make_exporter(registry, engine.url + "/metrics", max_body_bytes=4 << 20, timeout_seconds=10)
        try:
            start = time.monotonic()
            text = exporter.metrics()
            took = time.monotonic() - start
        finally:
            exporter.stop(grace=1)
    assert_down(text, V.SCRAPE_ERROR_BODY_TOO_LARGE)
    assert took < 5, "the exporter inflated far past the limit"


# -- bad engine data --------------------------------------------------------------------------------
def _bad_pages(registry: EngineRegistry, page: str) -> dict[str, tuple[fake.Behaviour, str, dict[str, object]]]:
    prompt = source_of(registry, V.PROMPT_TOKENS)
    waiting = source_of(registry, V.REQUESTS_WAITING)
    ttft = source_of(registry, V.TIME_TO_FIRST_TOKEN)
    return {
        "duplicate-counter": (
            fake.page(fake.with_duplicate(page, prompt, "1145.0").encode()),
            V.SCRAPE_ERROR_DUPLICATE_SERIES,
            {},
        ),
        "duplicate-gauge": (
            fake.page(fake.with_duplicate(page, waiting, "5.0").encode()),
            V.SCRAPE_ERROR_DUPLICATE_SERIES,
            {},
        ),
        "nan-counter": (fake.page(fake.with_values(page, {prompt}, "NaN").encode()), V.SCRAPE_ERROR_NON_FINITE, {}),
        "inf-counter": (fake.page(fake.with_values(page, {prompt}, "+Inf").encode()), V.SCRAPE_ERROR_NON_FINITE, {}),
        "nan-histogram": (
            fake.page(fake.with_values(page, {ttft + "_sum"}, "NaN").encode()),
            V.SCRAPE_ERROR_NON_FINITE,
            {},
        ),
        "cut-mid-line": (fake.close_delimited(fake.cut_mid_line(page, 0.6).encode()), V.SCRAPE_ERROR_TRUNCATED, {}),
        "no-final-newline": (fake.page(page.rstrip("\n").encode()), V.SCRAPE_ERROR_TRUNCATED, {}),
        "short-of-content-length": (fake.short_body(page.encode(), len(page) // 2), V.SCRAPE_ERROR_TRUNCATED, {}),
        "too-many-samples": (fake.page(page.encode()), V.SCRAPE_ERROR_TOO_MANY_SAMPLES, {"max_samples": 100}),
        "body-too-large": (fake.page(page.encode()), V.SCRAPE_ERROR_BODY_TOO_LARGE, {"max_body_bytes": 10_000}),
        "gzip-too-large": (
            fake.page(page.encode(), encoding="gzip"),
            V.SCRAPE_ERROR_BODY_TOO_LARGE,
            {"max_body_bytes": 10_000},
        ),
        "html": (fake.page(b"<html><body>Bad Gateway</body></html>\n"), V.SCRAPE_ERROR_INVALID, {}),
        "http-503": (fake.page(b"overloaded\n", status=503), V.SCRAPE_ERROR_HTTP_STATUS, {}),
    }


BAD = [
    "duplicate-counter",
    "duplicate-gauge",
    "nan-counter",
    "inf-counter",
    "nan-histogram",
    "cut-mid-line",
    "no-final-newline",
    "short-of-content-length",
    "too-many-samples",
    "body-too-large",
    "gzip-too-large",
    "html",
    "http-503",
]


@pytest.mark.parametrize("case", BAD)
def test_a_bad_page_is_refused_whole_with_its_reason(registry: EngineRegistry, real_page: str, case: str) -> None:
    behaviour, reason, limits = _bad_pages(registry, real_page)[case]
    with fake.FakeEngine({"/metrics": behaviour}) as engine:
        exporter = make_exporter(registry, engine.url + "/metrics", **limits)
        try:
            assert_down(exporter.metrics(), reason)
            if "max_" not in "".join(limits):
                engine.routes["/metrics"] = fake.page(real_page.encode())
                text = exporter.metrics()
                assert_up(text)
                assert value(text, V.PROMPT_TOKENS.name) == 5610
        finally:
            exporter.stop(grace=1)


def test_nan_gauges_are_served_as_nan(registry: EngineRegistry, real_page: str) -> None:
    """NaN is a legal gauge value (the format allows it): it is passed through, not refused."""
    waiting = source_of(registry, V.REQUESTS_WAITING)
    page = fake.with_values(real_page, {waiting}, "NaN")
    with fake.FakeEngine({"/metrics": fake.page(page.encode())}) as engine:
        exporter = make_exporter(registry, engine.url + "/metrics")
        try:
            text = exporter.metrics()
        finally:
            exporter.stop(grace=1)
    assert_up(text)
    assert math.isnan(value(text, V.REQUESTS_WAITING.name))
    assert value(text, V.PROMPT_TOKENS.name) == 5610


def test_limit_flags_override_the_config_file(tmp_path: Path, registry: EngineRegistry) -> None:
    from inferwatch.cli.exporter import _serve_config

    path = tmp_path / "exporter.yaml"
    path.write_text("targets:\n  - {url: 'http://127.0.0.1:1', timeout_seconds: 9, max_samples: 7}\n")
    limits: dict[str, float | int | None] = {"timeout_seconds": 2.5, "max_body_bytes": None, "max_samples": None}
    (target,) = _serve_config(registry, path, None, "auto", None, None, {}, limits).targets
    assert (target.timeout_seconds, target.max_samples, target.max_body_bytes) == (2.5, 7, 32 * 1024 * 1024)
    (target,) = _serve_config(registry, None, ["http://127.0.0.1:1"], "auto", None, None, {}, limits).targets
    assert (target.timeout_seconds, target.max_samples) == (2.5, 200_000)


def test_every_reason_is_documented_in_the_help() -> None:
    for reason in V.SCRAPE_ERROR_REASONS:
        assert reason in V.EXPORTER_LAST_SCRAPE_ERROR.help


# -- the process: memory under a gzip bomb, SIGTERM --------------------------------------------------
def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0]) * 1024
    return out


@contextmanager
def exporter_process(target: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    cmd = [sys.executable, "-m", "inferwatch", "exporter", "serve", "--target", target, "--engine", V.ENGINE_VLLM]
    proc = subprocess.Popen(
        [*cmd, "--listen", f"127.0.0.1:{port}", "--log-level", "warning", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        up = fake.wait_until(lambda: _healthy(base) or proc.poll() is not None, timeout=30)
        assert up and proc.poll() is None, f"exporter did not come up: {proc.stderr.read() if proc.stderr else ''}"
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/-/healthy", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_gzip_bomb_keeps_the_process_rss_bounded() -> None:
    """1 GiB inflated from ~2 MB: the exporter reads 32 MiB (its default limit) and refuses the page.
    Before, RSS went to 2.3 GB (peak 3.4 GB), never came back, and the scrape said up 1."""
    bomb = fake.GzipBomb(1 << 30)
    with (
        fake.FakeEngine({"/metrics": bomb}) as engine,
        exporter_process(engine.url + "/metrics", "--timeout", "20") as (
            proc,
            base,
        ),
    ):
        before = _status(proc.pid)
        for _ in range(2):
            text, took = timed_get(base + "/metrics", timeout=60)
            assert value(text, V.EXPORTER_UP.name) == 0.0
            assert reasons(text) == [V.SCRAPE_ERROR_BODY_TOO_LARGE]
        after = _status(proc.pid)
    growth = after["VmHWM"] - before["VmRSS"]
    print(
        f"gzip bomb {bomb.compressed_size / 1e6:.1f} MB -> 1 GiB: RSS {before['VmRSS'] / 2**20:.0f} MiB before, "
        f"{after['VmRSS'] / 2**20:.0f} MiB after, peak {after['VmHWM'] / 2**20:.0f} MiB; last scrape {took:.2f}s"
    )
    assert growth < 256 << 20, f"peak RSS grew by {growth / 2**20:.0f} MiB under a gzip bomb"
    assert took < 10


def test_sigterm_exits_within_the_grace_period_despite_a_stuck_scrape(real_page: str) -> None:
    """Before, the process stopped listening on SIGTERM but had not exited 60 s later."""
    stuck = fake.dribble(real_page.encode(), 0.25)
    with fake.FakeEngine({"/metrics": stuck}) as engine:  # noqa: SIM117 (the engine is needed for the URL)
        with exporter_process(engine.url + "/metrics", "--timeout", "60", "--grace", "1") as (proc, base):
            scraper = threading.Thread(target=lambda: _get_quietly(base + "/metrics"), daemon=True)
            scraper.start()
            assert fake.wait_until(lambda: engine.busy("/metrics") == 1)
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pytest.fail("the exporter had not exited 30 s after SIGTERM")
            took = time.monotonic() - start
            _, err = proc.communicate(timeout=10)
            scraper.join(timeout=10)
    print(f"SIGTERM with a scrape stuck: exited in {took:.2f}s (grace 1s)")
    assert code == 0, err
    assert took <= 1 + 3, f"exited {took:.2f}s after SIGTERM with a 1 s grace period"
    assert "aborted" in err


def _get_quietly(url: str) -> None:
    with suppress(httpx.HTTPError):
        httpx.get(url, timeout=60)
